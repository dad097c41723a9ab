/* Unit tests: the router's pure choice functions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "rtr_kvindex.h"
#include "rtr_policy.h"

static void test_prefill_least_tokens(void **state)
{
    rtr_backend_load_t b[3] = {
        { true, 500, 0, 0 }, { true, 100, 0, 0 }, { true, 300, 0, 0 },
    };
    uint32_t rr = 0;
    assert_int_equal(rtr_pick_prefill(b, 3, &rr), 1);
    b[1].eligible = false;
    assert_int_equal(rtr_pick_prefill(b, 3, &rr), 2);
    b[0].eligible = b[2].eligible = false;
    assert_int_equal(rtr_pick_prefill(b, 3, &rr), -1);
    assert_int_equal(rtr_pick_prefill(b, 0, &rr), -1);
}

static void test_prefill_round_robin_ties(void **state)
{
    rtr_backend_load_t b[3] = { { true, 0, 0, 0 }, { true, 0, 0, 0 }, { true, 0, 0, 0 } };
    uint32_t rr = 2;
    int seen[3] = { 0 };
    for (int i = 0; i < 9; i++)
        seen[rtr_pick_prefill(b, 3, &rr)]++;
    assert_int_equal(seen[0], 3);
    assert_int_equal(seen[1], 3);
    assert_int_equal(seen[2], 3);
}

static void test_decode_choice(void **state)
{
    rtr_backend_load_t b[3] = {
        { true, 0, 10, 1 }, { true, 0, 50, 9 }, { true, 0, 50, 2 },
    };
    uint32_t rr = 0;
    /* most free blocks, then fewest running sequences */
    assert_int_equal(rtr_pick_decode(b, 3, 4, &rr), 2);
    /* a daemon that cannot fit the request loses to one that can */
    b[0].free_blocks = 60;
    assert_int_equal(rtr_pick_decode(b, 3, 4, &rr), 0);
    assert_int_equal(rtr_pick_decode(b, 3, 55, &rr), 0);
    /* none fits: still the one with the most room (it queues) */
    assert_int_equal(rtr_pick_decode(b, 3, 100, &rr), 0);
    b[0].eligible = false;
    assert_int_equal(rtr_pick_decode(b, 3, 100, &rr), 2);
    b[1].eligible = b[2].eligible = false;
    assert_int_equal(rtr_pick_decode(b, 3, 1, &rr), -1);
}

static void test_decode_spreads_equal_load(void **state)
{
    rtr_backend_load_t b[3] = { { true, 0, 8, 0 }, { true, 0, 8, 0 }, { true, 0, 8, 0 } };
    uint32_t rr = 0;
    int seen[3] = { 0 };
    for (int i = 0; i < 30; i++)
        seen[rtr_pick_decode(b, 3, 1, &rr)]++;
    assert_int_equal(seen[0], 10);
    assert_int_equal(seen[1], 10);
    assert_int_equal(seen[2], 10);
}

static bool dis(rtr_disagg_mode_t mode, uint32_t prompt, uint32_t dec_cached, uint32_t thr,
                bool prefill)
{
    rtr_disagg_in_t in = { .prompt_tokens = prompt, .decode_cached = dec_cached };
    return rtr_should_disaggregate(mode, &in, thr, prefill, NULL);
}

static void test_disaggregation(void **state)
{
    assert_true(dis(RTR_DISAGG_THRESHOLD, 64, 0, 64, true));
    assert_false(dis(RTR_DISAGG_THRESHOLD, 63, 0, 64, true));
    assert_false(dis(RTR_DISAGG_THRESHOLD, 1000, 0, 64, false));
    assert_true(dis(RTR_DISAGG_ALWAYS, 1, 0, 64, true));
    assert_false(dis(RTR_DISAGG_ALWAYS, 1, 0, 64, false));
    assert_false(dis(RTR_DISAGG_NEVER, 1000, 0, 64, true));
    /* what the chosen decode lacks counts, not the prompt: turn k+1 of a
     * chat on the decode holding turn k (960 of 1000 tokens) stays local */
    assert_false(dis(RTR_DISAGG_THRESHOLD, 1000, 960, 64, true));
    assert_true(dis(RTR_DISAGG_THRESHOLD, 1000, 928, 64, true));  /* 72 lacking */
    /* the last token is always computed: a fully cached prompt lacks 1 */
    rtr_disagg_in_t in = { .prompt_tokens = 100, .decode_cached = 100 };
    rtr_disagg_why_t w;
    assert_false(rtr_should_disaggregate(RTR_DISAGG_THRESHOLD, &in, 2, true, &w));
    assert_int_equal(w.uncached, 1);
    assert_true(rtr_should_disaggregate(RTR_DISAGG_THRESHOLD, &in, 1, true, &w));
    /* cost mode before every rate is measured: the threshold rule */
    assert_true(dis(RTR_DISAGG_COST, 64, 0, 64, true));
    assert_false(dis(RTR_DISAGG_COST, 63, 0, 64, true));
    (void)state;
}

/* A draining decode's stream stays when its tokens left at its step end
 * no later than a move would stall it: measured moves when there are (per
 * KV token), else its KV pulled + two hops; nothing measured: it moves. */
static void test_finish_in_place(void **state)
{
    (void)state;
    /* KV of 2000 tokens at 100 us/token + 2 x 1 ms = 202 ms; step 50 ms */
    assert_true(rtr_finish_in_place(4, 50e6, 2000, 0, 100e3, 1e6));   /* 200 ms */
    assert_false(rtr_finish_in_place(5, 50e6, 2000, 0, 100e3, 1e6));  /* 250 ms */
    assert_true(rtr_finish_in_place(0, 50e6, 2000, 0, 100e3, 1e6));
    /* a short prompt: the hops dominate, one token left stays */
    assert_true(rtr_finish_in_place(1, 2e6, 10, 0, 100e3, 1e6));
    assert_false(rtr_finish_in_place(2, 2e6, 10, 0, 100e3, 1e6));
    /* moves measured at 500 us a KV token (1 s here) decide instead */
    assert_true(rtr_finish_in_place(20, 50e6, 2000, 500e3, 100e3, 1e6));
    assert_false(rtr_finish_in_place(21, 50e6, 2000, 500e3, 100e3, 1e6));
    assert_true(rtr_finish_in_place(2, 50e6, 2000, 500e3, 0, 0));
    /* no step, or neither rate measured yet: move, as before */
    assert_false(rtr_finish_in_place(1, 0, 2000, 500e3, 100e3, 1e6));
    assert_false(rtr_finish_in_place(1, 50e6, 2000, 0, 0, 1e6));
}

/* disagg-mode=cost against hand-computed estimates. */
static void test_disaggregation_cost(void **state)
{
    (void)state;
    rtr_disagg_why_t w;
    /* rates: prefill 100 us/token, decode 150 us/token (it shares its
     * steps with the batch), pull 20 us/token, hop 2 ms */
    rtr_disagg_in_t in = { .prompt_tokens = 1000, .pf_tok_ns = 100e3, .dec_tok_ns = 150e3,
                           .pull_tok_ns = 20e3, .hop_ns = 2e6 };
    /* idle decode, nothing cached: local 150 ms, disaggregated 100 + 20 + 2 */
    assert_true(rtr_should_disaggregate(RTR_DISAGG_COST, &in, 64, true, &w));
    assert_true(w.measured);
    assert_true(w.local_ns == 1000 * 150e3);
    assert_true(w.disagg_ns == 1000 * 100e3 + 1000 * 20e3 + 2e6);
    /* the prefill is 200 tokens behind: 120 + 20 + 2 ms, still cheaper */
    in.prefill_outstanding = 200;
    assert_true(rtr_should_disaggregate(RTR_DISAGG_COST, &in, 64, true, &w));
    /* 600 behind: 160 + 20 + 2 > 150: prefill it on the decode */
    in.prefill_outstanding = 600;
    assert_false(rtr_should_disaggregate(RTR_DISAGG_COST, &in, 64, true, &w));
    /* ... unless the decode runs 3 streams: each waits for that prefill */
    in.decode_running = 3;
    assert_true(rtr_should_disaggregate(RTR_DISAGG_COST, &in, 64, true, &w));
    assert_true(w.local_ns == 1000 * 150e3 * 4);
    /* the decode holds 992 tokens (turn k): 8 to compute locally, 1.2 ms x 4,
     * against the prefill's whole prompt: local, whatever the threshold */
    in.prefill_outstanding = 0;
    in.decode_cached = 992;
    assert_false(rtr_should_disaggregate(RTR_DISAGG_COST, &in, 1, true, &w));
    assert_int_equal(w.uncached, 8);
    /* the prefill holds it too: 8 x 100 us + 8 x 20 us + 2 ms = 2.96 ms
     * < 8 x 150 us x 4 = 4.8 ms: disaggregate */
    in.prefill_cached = 992;
    assert_true(rtr_should_disaggregate(RTR_DISAGG_COST, &in, 100000, true, &w));
    assert_true(w.disagg_ns == 8 * 100e3 + 8 * 20e3 + 2e6);
    /* no prefill: never */
    assert_false(rtr_should_disaggregate(RTR_DISAGG_COST, &in, 1, false, &w));
    /* no decode-local prefill measured yet: the prefills' rate stands in
     * (8 x 100 us x 4 = 3.2 ms > 2.96 ms) */
    in.dec_tok_ns = 0;
    assert_true(rtr_should_disaggregate(RTR_DISAGG_COST, &in, 100000, true, &w));
    assert_true(w.measured && w.local_ns == 8 * 100e3 * 4);
    in.decode_running = 2; /* 2.4 ms */
    assert_false(rtr_should_disaggregate(RTR_DISAGG_COST, &in, 1, true, &w));
    /* the pull not measured: the threshold rule */
    in.pull_tok_ns = 0;
    assert_false(rtr_should_disaggregate(RTR_DISAGG_COST, &in, 64, true, &w));
    assert_false(w.measured);
}

/* KV-aware prefill: overlap against load, in tokens of work. */
static void test_prefill_kv(void **state)
{
    (void)state;
    rtr_backend_load_t b[3] = {
        { true, 0, 0, 0 }, { true, 0, 0, 0 }, { true, 0, 0, 0 },
    };
    uint32_t none[3] = { 0, 0, 0 }, rr = 2;
    /* no cache anywhere: least outstanding, round robin among equals */
    int seen[3] = { 0 };
    for (int i = 0; i < 6; i++)
        seen[rtr_pick_prefill_kv(b, none, 3, 1000, &rr)]++;
    assert_int_equal(seen[0], 2);
    assert_int_equal(seen[1], 2);
    assert_int_equal(seen[2], 2);
    /* the daemon holding 2400 of 2500 tokens wins while idle-ish ... */
    uint32_t c[3] = { 0, 2400, 320 };
    b[1].outstanding_prefill_tokens = 1500;
    assert_int_equal(rtr_pick_prefill_kv(b, c, 3, 2500, &rr), 1); /* 1600 < 2180 < 2500 */
    /* ... but not when its queue costs more than recomputing elsewhere */
    b[1].outstanding_prefill_tokens = 2300;
    assert_int_equal(rtr_pick_prefill_kv(b, c, 3, 2500, &rr), 2); /* 2180 < 2400 */
    /* ties on cost: the larger overlap */
    uint32_t t[3] = { 100, 300, 0 };
    b[0].outstanding_prefill_tokens = 200;
    b[1].outstanding_prefill_tokens = 400;
    b[2].outstanding_prefill_tokens = 1000;
    assert_int_equal(rtr_pick_prefill_kv(b, t, 3, 1000, &rr), 1); /* 1100 = 1100 */
    /* a whole-prompt hit still costs the last token; overlap beyond the
     * prompt (index over-report) is capped */
    rtr_backend_load_t one[2] = { { true, 0, 0, 0 }, { true, 0, 0, 0 } };
    uint32_t full[2] = { 64, 5000 };
    assert_int_equal(rtr_pick_prefill_kv(one, full, 2, 64, &rr), 1); /* 1 vs 1: overlap */
    one[1].outstanding_prefill_tokens = 1;
    assert_int_equal(rtr_pick_prefill_kv(one, full, 2, 64, &rr), 0); /* 1 < 2 */
    /* ineligible daemons are never picked, whatever they hold */
    one[0].eligible = false;
    assert_int_equal(rtr_pick_prefill_kv(one, full, 2, 64, &rr), 1);
    one[1].eligible = false;
    assert_int_equal(rtr_pick_prefill_kv(one, full, 2, 64, &rr), -1);
    assert_int_equal(rtr_pick_prefill_kv(one, full, 0, 64, &rr), -1);
    /* prompt 0 (never sent, but no underflow) */
    one[0].eligible = true;
    assert_int_equal(rtr_pick_prefill_kv(one, full, 2, 0, &rr), 0);
}

/* KV-aware decode: turn k+1 goes where turn k's KV is, unless that decode
 * is full or much busier. */
static void test_decode_kv(void **state)
{
    (void)state;
    rtr_backend_load_t b[3] = {
        { true, 0, 100, 2 }, { true, 0, 50, 3 }, { true, 0, 100, 2 },
    };
    uint32_t none[3] = { 0, 0, 0 }, rr = 0, rr2 = 0;
    /* nothing cached: rtr_pick_decode (most free) */
    assert_int_equal(rtr_pick_decode_kv(b, none, 3, 10, &rr), rtr_pick_decode(b, 3, 10, &rr2));
    assert_int_equal(rr, rr2);
    /* the holder wins over freer decodes */
    uint32_t c[3] = { 0, 640, 0 };
    assert_int_equal(rtr_pick_decode_kv(b, c, 3, 10, &rr), 1);
    /* the longest hold wins among holders; ties by decode order */
    uint32_t c2[3] = { 320, 640, 640 };
    assert_int_equal(rtr_pick_decode_kv(b, c2, 3, 10, &rr), 2); /* more free than 1 */
    /* a holder without room for the request is not preferred */
    rr2 = rr;
    assert_int_equal(rtr_pick_decode_kv(b, c, 3, 60, &rr), rtr_pick_decode(b, 3, 60, &rr2));
    /* nor one much busier than the least busy decode with room */
    b[1].running_seqs = 2 + RTR_DECODE_AFFINITY_SLACK;
    assert_int_equal(rtr_pick_decode_kv(b, c, 3, 10, &rr), 1); /* at the slack: still */
    b[1].running_seqs++;
    int d = rtr_pick_decode_kv(b, c, 3, 10, &rr);
    assert_true(d == 0 || d == 2);
    /* ineligible holders never; none eligible: -1 */
    b[1].running_seqs = 0;
    b[1].eligible = false;
    d = rtr_pick_decode_kv(b, c, 3, 10, &rr);
    assert_true(d == 0 || d == 2);
    b[0].eligible = b[2].eligible = false;
    assert_int_equal(rtr_pick_decode_kv(b, c, 3, 10, &rr), -1);
}

/* The prefill pulls a decode's cached prefix only when that decode holds
 * at least min_gain more tokens of the prompt than the prefill. */
static void test_prefix_source(void **state)
{
    (void)state;
    rtr_backend_load_t b[4] = {
        { .eligible = true, .running_seqs = 3 },
        { .eligible = true, .running_seqs = 1 },
        { .eligible = false },
        { .eligible = true, .running_seqs = 1 },
    };
    uint32_t c[4] = { 0, 640, 2000, 0 };
    /* off, or nothing to gain */
    assert_int_equal(rtr_pick_prefix_source(b, c, 4, 1000, 0, 0, 1), -1);
    assert_int_equal(rtr_pick_prefix_source(b, NULL, 4, 1000, 0, 32, 1), -1);
    assert_int_equal(rtr_pick_prefix_source(b, c, 4, 1000, 640, 32, 1), -1);
    /* exactly the threshold qualifies, one token less does not */
    assert_int_equal(rtr_pick_prefix_source(b, c, 4, 1000, 608, 32, 1), 1);
    assert_int_equal(rtr_pick_prefix_source(b, c, 4, 1000, 609, 32, 1), -1);
    /* the ineligible one (2000 cached) is never chosen */
    assert_int_equal(rtr_pick_prefix_source(b, c, 4, 1000, 0, 32, -1), 1);
    /* held is capped at prompt - 1: the whole prompt cached still leaves
     * the last token, and a short prompt gains less */
    uint32_t c2[4] = { 64, 0, 0, 48 };
    assert_int_equal(rtr_pick_prefix_source(b, c2, 4, 50, 16, 32, -1), 0); /* 49 > 3's 48 */
    assert_int_equal(rtr_pick_prefix_source(b, c2, 4, 49, 16, 32, -1), 3); /* 48 each: less busy */
    assert_int_equal(rtr_pick_prefix_source(b, c2, 4, 48, 16, 32, -1), -1); /* 47 < 48 */
    /* the longest hold wins; ties: the preferred, then the least busy */
    uint32_t c3[4] = { 640, 320, 0, 640 };
    assert_int_equal(rtr_pick_prefix_source(b, c3, 4, 1000, 0, 32, -1), 3);
    assert_int_equal(rtr_pick_prefix_source(b, c3, 4, 1000, 0, 32, 0), 0);
    assert_int_equal(rtr_pick_prefix_source(b, c3, 4, 1000, 0, 32, 1), 3); /* 1 holds less */
    /* a prompt of one token has nothing to pull */
    assert_int_equal(rtr_pick_prefix_source(b, c3, 4, 1, 0, 1, -1), -1);
}

/* The router's index of the daemons' caches. */
static void test_kvindex(void **state)
{
    (void)state;
    rtr_kvindex_t *x;
    assert_int_equal(rtr_kvindex_create(0, 1, &x), PD_ERR_BAD_INPUT);
    assert_int_equal(rtr_kvindex_create(8, 9, &x), PD_ERR_BAD_INPUT);
    assert_int_equal(rtr_kvindex_create(8, 5, &x), PD_OK);
    uint64_t n[6] = { 11, 22, 33, 44, 55, 66 };
    uint32_t out[RTR_KVINDEX_MAX_BACKENDS];
    /* backend 3 holds a chain of 4, backend 7 the first 2 and the 4th
     * (a gap: its prefix is 2) */
    for (int i = 0; i < 4; i++)
        assert_true(rtr_kvindex_add(x, 3, n[i]));
    assert_true(rtr_kvindex_add(x, 7, n[0]));
    assert_true(rtr_kvindex_add(x, 7, n[1]));
    assert_true(rtr_kvindex_add(x, 7, n[3]));
    assert_true(rtr_kvindex_add(x, 7, n[3])); /* idempotent */
    assert_int_equal(rtr_kvindex_count(x, 7), 3);
    rtr_kvindex_match(x, n, 6, out);
    assert_int_equal(out[3], 4);
    assert_int_equal(out[7], 2);
    assert_int_equal(out[0], 0);
    rtr_kvindex_match(x, n, 3, out); /* a shorter prompt: all of it */
    assert_int_equal(out[3], 3);
    assert_int_equal(out[7], 2);
    uint64_t other[3] = { 99, 22, 33 }; /* a first block nobody holds */
    rtr_kvindex_match(x, other, 3, out);
    assert_int_equal(out[3], 0);
    assert_int_equal(out[7], 0);
    /* caps: 5 names per backend, 8 in all; over a cap nothing is indexed */
    assert_true(rtr_kvindex_add(x, 3, n[4]));      /* backend 3 at its cap */
    assert_false(rtr_kvindex_add(x, 3, n[5]));
    assert_false(rtr_kvindex_add(x, 64, n[5]));    /* no such slot */
    for (uint64_t k = 100; k < 103; k++)
        assert_true(rtr_kvindex_add(x, 9, k));     /* 8 distinct names */
    assert_false(rtr_kvindex_add(x, 9, 103));      /* the global cap */
    assert_true(rtr_kvindex_add(x, 9, n[0]));      /* indexed already: no new entry */
    rtr_kvindex_stats_t st;
    rtr_kvindex_stats(x, &st);
    assert_int_equal(st.names, 8);
    assert_int_equal(st.dropped, 2);
    assert_int_equal(st.held, 5 + 3 + 4);
    /* remove and clear give the entries back */
    rtr_kvindex_remove(x, 3, n[2]);
    rtr_kvindex_match(x, n, 6, out);
    assert_int_equal(out[3], 2);
    rtr_kvindex_remove(x, 3, 999); /* not held: no-op */
    rtr_kvindex_clear_backend(x, 9);
    rtr_kvindex_clear_backend(x, 3);
    assert_int_equal(rtr_kvindex_count(x, 3), 0);
    assert_int_equal(rtr_kvindex_count(x, 9), 0);
    rtr_kvindex_match(x, n, 6, out);
    assert_int_equal(out[3], 0);
    assert_int_equal(out[7], 2); /* the other backend's stay */
    rtr_kvindex_clear_backend(x, 7);
    rtr_kvindex_stats(x, &st);
    assert_int_equal(st.names, 0);
    assert_int_equal(st.held, 0);
    /* everything freed is reusable: fill to the global cap again */
    for (uint32_t b = 0; b < 2; b++)
        for (uint64_t k = 0; k < 4; k++)
            assert_true(rtr_kvindex_add(x, b, 1000 + b * 10 + k));
    assert_false(rtr_kvindex_add(x, 2, 5000));
    rtr_kvindex_destroy(x);
    rtr_kvindex_destroy(NULL);
}

/* Many backends sharing names, random churn: the index agrees with a
 * brute-force model (mask per name), and clear_backend leaves no trace. */
static void test_kvindex_model(void **state)
{
    (void)state;
    enum { NAMES = 300, BES = 64 };
    static uint64_t model[NAMES];
    rtr_kvindex_t *x;
    assert_int_equal(rtr_kvindex_create(NAMES, NAMES, &x), PD_OK);
    uint32_t seed = 12345;
    for (int step = 0; step < 200000; step++) {
        seed = seed * 1103515245u + 12345u;
        uint32_t name = (seed >> 8) % NAMES, be = (seed >> 20) % BES, op = (seed >> 27) % 8;
        if (op < 4) {
            assert_true(rtr_kvindex_add(x, be, (uint64_t)name * 0x100000001ull));
            model[name] |= 1ull << be;
        } else if (op < 7) {
            rtr_kvindex_remove(x, be, (uint64_t)name * 0x100000001ull);
            model[name] &= ~(1ull << be);
        } else if ((seed & 0xff) == 0) {
            rtr_kvindex_clear_backend(x, be);
            for (int i = 0; i < NAMES; i++)
                model[i] &= ~(1ull << be);
        }
    }
    uint64_t held = 0;
    for (int i = 0; i < NAMES; i++) {
        uint64_t nm = (uint64_t)i * 0x100000001ull;
        uint32_t out[RTR_KVINDEX_MAX_BACKENDS];
        rtr_kvindex_match(x, &nm, 1, out);
        for (int b = 0; b < BES; b++)
            assert_int_equal(out[b], (model[i] >> b) & 1);
        held += (uint64_t)__builtin_popcountll(model[i]);
    }
    rtr_kvindex_stats_t st;
    rtr_kvindex_stats(x, &st);
    assert_int_equal(st.held, held);
    rtr_kvindex_destroy(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_kv),
        cmocka_unit_test(test_prefix_source),
        cmocka_unit_test(test_kvindex),
        cmocka_unit_test(test_kvindex_model),
        cmocka_unit_test(test_prefill_kv),
        cmocka_unit_test(test_prefill_least_tokens),
        cmocka_unit_test(test_prefill_round_robin_ties),
        cmocka_unit_test(test_decode_choice),
        cmocka_unit_test(test_decode_spreads_equal_load),
        cmocka_unit_test(test_disaggregation),
        cmocka_unit_test(test_disaggregation_cost),
        cmocka_unit_test(test_finish_in_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
