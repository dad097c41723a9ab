/* Unit tests for pd-bench's pure parts: percentiles, summaries, TPOT,
 * SLO parsing and goodput, length distributions, and the seeded RNG (the
 * HTTP/1.1 response and SSE parsers are tested in tests/common/test_httpc.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "pb_stats.h"
#include "pb_work.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MS 1000000ULL

static void test_percentile_numpy(void **state)
{
    double v[] = { 1, 2, 3, 4 };
    double one[] = { 7 };

    /* Reference values from numpy.percentile (linear interpolation). */
    assert_float_equal(pb_percentile(v, 4, 50), 2.5, 1e-12);
    assert_float_equal(pb_percentile(v, 4, 90), 3.7, 1e-12);
    assert_float_equal(pb_percentile(v, 4, 99), 3.97, 1e-12);
    assert_float_equal(pb_percentile(v, 4, 0), 1, 1e-12);
    assert_float_equal(pb_percentile(v, 4, 100), 4, 1e-12);
    assert_float_equal(pb_percentile(one, 1, 99), 7, 1e-12);
    assert_float_equal(pb_percentile(NULL, 0, 50), 0, 1e-12);
}

static void test_summary(void **state)
{
    double v[] = { 50, 10, 40, 20, 30 };
    pb_summary_t s;

    pb_summary(v, 5, &s);
    assert_int_equal(s.n, 5);
    assert_float_equal(s.mean, 30, 1e-12);
    assert_float_equal(s.std, sqrt(200.0), 1e-9);   /* population std */
    assert_float_equal(s.median, 30, 1e-12);
    assert_float_equal(s.p50, 30, 1e-12);
    assert_float_equal(s.p90, 46, 1e-12);
    assert_float_equal(s.p99, 49.6, 1e-12);
    assert_float_equal(s.min, 10, 1e-12);
    assert_float_equal(s.max, 50, 1e-12);
    pb_summary(v, 0, &s);
    assert_int_equal(s.n, 0);
    assert_float_equal(s.mean, 0, 0);
}

static void test_dist_parse(void **state)
{
    pb_dist_t d;
    pb_rng_t rng;
    bool lo = false, hi = false;
    int i;

    assert_int_equal(pb_dist_parse("fixed:5", &d), PD_OK);
    assert_int_equal(d.kind, PB_DIST_FIXED);
    assert_int_equal(d.a, 5);
    assert_int_equal(pb_dist_parse("7", &d), PD_OK);
    assert_int_equal(d.a, 7);
    assert_int_equal(pb_dist_parse("uniform:3:9", &d), PD_OK);
    assert_int_equal(d.kind, PB_DIST_UNIFORM);
    pb_rng_seed(&rng, 1);
    for (i = 0; i < 1000; i++) {
        uint32_t x = pb_dist_sample(&d, &rng);
        assert_true(x >= 3 && x <= 9);
        lo |= x == 3;
        hi |= x == 9;
    }
    assert_true(lo && hi);
    const char *bad[] = { "uniform:9:3", "0", "fixed:", "abc", "uniform:1",
                          "5x", "2000000", "fixed:-3", "", "uniform:1:2:3" };
    for (i = 0; i < (int)(sizeof(bad) / sizeof(bad[0])); i++) {
        d.a = 1234;
        assert_int_equal(pb_dist_parse(bad[i], &d), PD_ERR_BAD_INPUT);
        assert_int_equal(d.a, 1234);   /* untouched on failure */
    }
}

static void test_slo_parse(void **state)
{
    pb_slo_t s;

    assert_int_equal(pb_slo_parse("ttft=200ms,tpot=50ms", &s), PD_OK);
    assert_true(s.has_ttft && s.has_tpot && !s.has_e2el);
    assert_int_equal(s.ttft_ns, 200 * MS);
    assert_int_equal(s.tpot_ns, 50 * MS);
    assert_int_equal(pb_slo_parse("e2el=2s", &s), PD_OK);
    assert_true(!s.has_ttft && s.has_e2el);
    assert_int_equal(s.e2el_ns, 2000 * MS);
    assert_int_equal(pb_slo_parse("ttft=200", &s), PD_OK);   /* bare = ms */
    assert_int_equal(s.ttft_ns, 200 * MS);
    assert_int_equal(pb_slo_parse("tpot=0.5", &s), PD_OK);
    assert_int_equal(s.tpot_ns, 500000);
    assert_int_equal(pb_slo_parse(NULL, &s), PD_OK);
    assert_false(pb_slo_any(&s));
    assert_int_equal(pb_slo_parse("foo=1", &s), PD_ERR_BAD_INPUT);
    assert_int_equal(pb_slo_parse("ttft", &s), PD_ERR_BAD_INPUT);
    assert_int_equal(pb_slo_parse("ttft=1ms,ttft=2ms", &s), PD_ERR_BAD_INPUT);
    assert_int_equal(pb_slo_parse("ttft=abc", &s), PD_ERR_BAD_INPUT);
    assert_int_equal(pb_slo_parse("ttft=-5", &s), PD_ERR_BAD_INPUT);
}

static pb_record_t rec_ok(uint64_t ttft_ms, uint64_t e2el_ms, uint32_t tokens)
{
    pb_record_t r;

    memset(&r, 0, sizeof(r));
    r.success = true;
    r.http_status = 200;
    r.ttft_ns = ttft_ms * MS;
    r.e2el_ns = e2el_ms * MS;
    r.output_tokens = tokens;
    r.content_chunks = tokens;
    r.input_tokens = 100;
    return r;
}

static void test_tpot_and_slo_met(void **state)
{
    pb_record_t r = rec_ok(50, 230, 10);
    pb_slo_t slo;

    assert_float_equal(pb_record_tpot_ns(&r), 20.0 * MS, 1e-6);
    r.output_tokens = 1;
    assert_float_equal(pb_record_tpot_ns(&r), 0, 0);   /* undefined */
    r.output_tokens = 10;

    assert_int_equal(pb_slo_parse("ttft=50ms,tpot=20ms", &slo), PD_OK);
    assert_true(pb_slo_met(&slo, &r));                 /* bounds inclusive */
    assert_int_equal(pb_slo_parse("tpot=19ms", &slo), PD_OK);
    assert_false(pb_slo_met(&slo, &r));
    assert_int_equal(pb_slo_parse("e2el=229ms", &slo), PD_OK);
    assert_false(pb_slo_met(&slo, &r));
    r.success = false;
    assert_int_equal(pb_slo_parse(NULL, &slo), PD_OK);
    assert_false(pb_slo_met(&slo, &r));                /* failures never good */
}

static void test_aggregate_goodput(void **state)
{
    pb_record_t r[6];
    uint64_t itl0[] = { 20 * MS, 22 * MS }, itl1[] = { 18 * MS };
    pb_slo_t slo;
    pb_aggregate_t a;

    r[0] = rec_ok(100, 140, 3);
    r[0].itl_ns = itl0;
    r[0].n_itl = 2;
    r[1] = rec_ok(300, 320, 2);
    r[1].itl_ns = itl1;
    r[1].n_itl = 1;
    r[2] = rec_ok(150, 150, 1);                       /* single token */
    memset(&r[3], 0, sizeof(r[3]));
    r[3].err = PB_ERR_HTTP_5XX;
    r[3].http_status = 503;
    memset(&r[4], 0, sizeof(r[4]));
    r[4].err = PB_ERR_TIMEOUT;
    r[5] = rec_ok(10, 100, 5);
    r[5].success = false;                             /* error frame */
    r[5].err = PB_ERR_STREAM_ERROR;

    assert_int_equal(pb_slo_parse("ttft=200ms", &slo), PD_OK);
    assert_int_equal(pb_aggregate(r, 6, &slo, 2 * 1000 * MS, &a), PD_OK);
    assert_int_equal(a.num_requests, 6);
    assert_int_equal(a.completed, 3);
    assert_int_equal(a.failed, 3);
    assert_int_equal(a.good, 2);
    assert_int_equal(a.errors[PB_ERR_NONE], 3);
    assert_int_equal(a.errors[PB_ERR_HTTP_5XX], 1);
    assert_int_equal(a.errors[PB_ERR_TIMEOUT], 1);
    assert_int_equal(a.errors[PB_ERR_STREAM_ERROR], 1);
    assert_int_equal(a.total_output_tokens, 6);       /* successes only */
    assert_int_equal(a.total_input_tokens, 300);
    assert_float_equal(a.duration_s, 2.0, 1e-12);
    assert_float_equal(a.request_throughput, 1.5, 1e-12);
    assert_float_equal(a.request_goodput, 1.0, 1e-12);
    assert_float_equal(a.output_throughput, 3.0, 1e-12);
    assert_float_equal(a.total_token_throughput, 153.0, 1e-12);
    assert_int_equal(a.ttft_ms.n, 3);
    assert_float_equal(a.ttft_ms.mean, (100 + 300 + 150) / 3.0, 1e-9);
    assert_float_equal(a.ttft_ms.median, 150, 1e-9);
    assert_int_equal(a.tpot_ms.n, 2);                 /* 1-token excluded */
    assert_float_equal(a.tpot_ms.mean, (20 + 20) / 2.0, 1e-9);
    assert_int_equal(a.itl_ms.n, 3);
    assert_float_equal(a.itl_ms.mean, 20, 1e-9);
    assert_float_equal(a.e2el_ms.max, 320, 1e-9);

    /* A successful stream without content has E2EL but no TTFT. */
    r[4] = rec_ok(0, 30, 0);
    r[4].content_chunks = 0;
    assert_int_equal(pb_aggregate(r, 6, &slo, 2 * 1000 * MS, &a), PD_OK);
    assert_int_equal(a.completed, 4);
    assert_int_equal(a.ttft_ms.n, 3);
    assert_int_equal(a.e2el_ms.n, 4);
    r[4].success = false;
    r[4].err = PB_ERR_TIMEOUT;

    /* No SLO: goodput equals throughput. */
    assert_int_equal(pb_slo_parse("", &slo), PD_OK);
    assert_int_equal(pb_aggregate(r, 6, &slo, 2 * 1000 * MS, &a), PD_OK);
    assert_int_equal(a.good, 3);
    assert_int_equal(pb_aggregate(NULL, 0, &slo, MS, &a), PD_OK);
    assert_int_equal(a.completed, 0);
}

static void test_rng(void **state)
{
    pb_rng_t a, b;
    double sum = 0;
    int i, n = 200000;

    pb_rng_seed(&a, 42);
    pb_rng_seed(&b, 42);
    for (i = 0; i < 100; i++)
        assert_int_equal(pb_rng_next(&a), pb_rng_next(&b));
    for (i = 0; i < n; i++) {
        double u = pb_rng_uniform(&a);
        assert_true(u >= 0 && u < 1);
    }
    for (i = 0; i < n; i++)
        sum += pb_rng_exp(&a, 40.0);
    /* Mean gap 1/40 s; the standard error is 0.025/sqrt(n) ~ 5.6e-5. */
    assert_float_equal(sum / n, 0.025, 0.0005);
}

/* ---- workloads (pb_work) ---------------------------------------------- */

static pd_status_t parse(const char *line, uint32_t bs, pb_trace_entry_t *e)
{
    char err[256];
    return pb_trace_parse_line(line, strlen(line), bs, e, err, sizeof(err));
}

static void test_trace_line(void **state)
{
    pb_trace_entry_t e;

    assert_int_equal(parse("{\"timestamp\": 27482, \"input_length\": 6955, "
                           "\"output_length\": 52, \"hash_ids\": [46, 47, 48, 49, 50, "
                           "51, 52, 53, 54, 55, 56, 57, 58, 59]}", 512, &e), PD_OK);
    assert_int_equal(e.at_ns, 27482ULL * 1000000);
    assert_int_equal(e.input_len, 6955);
    assert_int_equal(e.output_len, 52);
    assert_int_equal(e.n_hash, 14);
    assert_int_equal(e.hash_ids[13], 59);
    free(e.hash_ids);
    /* 15 ids for 6955 tokens of 512: more blocks than the prompt has. */
    assert_int_equal(parse("{\"timestamp\": 0, \"input_length\": 6955, \"output_length\": 1, "
                           "\"hash_ids\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}", 512, &e),
                     PD_ERR_BAD_INPUT);
    /* hash_ids optional; caps and types. */
    assert_int_equal(parse("{\"timestamp\": 1.5, \"input_length\": 1, \"output_length\": 1}",
                           16, &e), PD_OK);
    assert_null(e.hash_ids);
    assert_int_equal(parse("{\"timestamp\": 0, \"input_length\": 131073, \"output_length\": 1}",
                           16, &e), PD_ERR_BAD_INPUT);
    assert_int_equal(parse("{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 1}",
                           16, &e), PD_ERR_BAD_INPUT);
    assert_int_equal(parse("{\"timestamp\": -1, \"input_length\": 5, \"output_length\": 1}",
                           16, &e), PD_ERR_BAD_INPUT);
    assert_int_equal(parse("{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 65537}",
                           16, &e), PD_ERR_BAD_INPUT);
    assert_int_equal(parse("{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, "
                           "\"hash_ids\": [\"a\"]}", 16, &e), PD_ERR_BAD_INPUT);
    assert_int_equal(parse("{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, "
                           "\"hash_ids\": 3}", 16, &e), PD_ERR_BAD_INPUT);
    assert_int_equal(parse("[1]", 16, &e), PD_ERR_BAD_INPUT);
    assert_int_equal(parse("{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1}",
                           0, &e), PD_ERR_BAD_INPUT);
}

static void test_trace_prompts(void **state)
{
    uint64_t h1[] = { 7, 8 }, h2[] = { 7, 9 };
    pb_trace_entry_t a = { 0, 10, 1, 2, h1 }, b = { 0, 7, 1, 2, h2 };
    pb_trace_entry_t c = { 0, 3, 1, 0, NULL };
    pb_prompt_buf_t pa, pb, pc, pw;
    pb_rng_t rng;

    pb_prompt_buf_init(&pa, true, 0, 1u << 30);
    pb_prompt_buf_init(&pb, true, 0, 1u << 30);
    pb_prompt_buf_init(&pc, true, 0, 1u << 30);
    assert_int_equal(pb_prompt_from_trace(&pa, &a, 4, 1, 0), PD_OK);
    assert_int_equal(pb_prompt_from_trace(&pb, &b, 4, 1, 1), PD_OK);
    assert_int_equal(pb_prompt_from_trace(&pc, &c, 4, 1, 0), PD_OK);
    assert_int_equal(pa.n_tokens, 10);
    assert_int_equal(pb.n_tokens, 7);
    assert_memory_equal(pa.id, pb.id, 4 * sizeof(uint32_t));        /* block 7 */
    assert_memory_not_equal(pa.id + 4, pb.id + 4, 3 * sizeof(uint32_t));
    assert_memory_not_equal(pa.id, pc.id, 3 * sizeof(uint32_t));
    pb_prompt_buf_fini(&pa);
    pb_prompt_buf_fini(&pb);
    pb_prompt_buf_fini(&pc);
    /* Words: n tokens, space separated; the cap holds. */
    pb_prompt_buf_init(&pw, false, 0, 0);
    pb_rng_seed(&rng, 3);
    assert_int_equal(pb_prompt_add(&pw, &rng, 5), PD_OK);
    assert_int_equal(pw.n_tokens, 5);
    assert_int_equal(pw.text[pw.len], '\0');
    assert_int_equal(pb_prompt_add(&pw, &rng, PB_PROMPT_TOKENS_MAX), PD_ERR_TOO_BIG);
    pb_prompt_buf_fini(&pw);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_percentile_numpy),
        cmocka_unit_test(test_summary),
        cmocka_unit_test(test_dist_parse),
        cmocka_unit_test(test_slo_parse),
        cmocka_unit_test(test_tpot_and_slo_met),
        cmocka_unit_test(test_aggregate_goodput),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_trace_line),
        cmocka_unit_test(test_trace_prompts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
