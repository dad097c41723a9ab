/* bench-smoke: pd-bench against a real deployment (pd-router + pd-prefill +
 * pd-decode, built-in model, tests/harness/pd_e2e.h), as processes on
 * loopback. Checks that every request of a short run succeeds with exact
 * output lengths (ignore_eos + usage), in both modes and both endpoints,
 * and that the deployment is quiescent afterwards (no leaked requests or
 * KV blocks). Prints the figures; asserts no speed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "pd_e2e.h"

#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "pb_test_json.h"

extern char **environ;

static const char *g_bench, *g_router, *g_prefill, *g_decode, *g_model;
static e2e_deploy_t g_d;
static bool g_up;

static int run_bench(const char *const *args, double timeout_s)
{
    char *argv[64];
    int n = 0, status = 0;
    pid_t pid;
    double t0 = e2e_now();

    argv[n++] = (char *)g_bench;
    while (*args != NULL && n < 63)
        argv[n++] = (char *)*args++;
    argv[n] = NULL;
    assert_int_equal(posix_spawn(&pid, g_bench, NULL, NULL, argv, environ), 0);
    while (waitpid(pid, &status, WNOHANG) != pid) {
        if (e2e_now() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fail_msg("pd-bench did not stop within %.0f s", timeout_s);
        }
        e2e_nap_ms(5);
    }
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}


static int setup(void **state)
{
    e2e_opts_t o = {
        .router_bin = g_router, .prefill_bin = g_prefill, .decode_bin = g_decode,
        .model = g_model, .n_prefill = 1, .n_decode = 1, .ready_timeout_s = 30,
    };
    g_up = true;
    if (e2e_deploy_start(&g_d, &o) != 0) {
        e2e_deploy_stop(&g_d, true);
        g_up = false;
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    int bad = g_up ? e2e_deploy_stop(&g_d, false) : 0;
    g_up = false;
    return bad == 0 ? 0 : -1;
}

static void check_run(const char *out, int n, int out_len)
{
    cJSON *j = load_json(out), *res = cJSON_GetObjectItem(j, "results"), *r;

    print_message("%s: %d req, %.1f req/s, %.0f out tok/s, TTFT mean %.2f p99 %.2f ms, "
                  "TPOT mean %.3f ms, ITL p99 %.2f ms, E2EL mean %.2f ms\n",
                  cJSON_GetObjectItem(j, "mode")->valuestring, n,
                  num(res, "request_throughput"), num(res, "output_throughput"),
                  num(res, "mean_ttft_ms"), num(res, "p99_ttft_ms"),
                  num(res, "mean_tpot_ms"), num(res, "p99_itl_ms"),
                  num(res, "mean_e2el_ms"));
    assert_int_equal(num(res, "completed"), n);
    assert_int_equal(num(res, "failed"), 0);
    assert_int_equal(num(res, "total_output_tokens"), n * out_len);
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(j, "requests")) {
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "success")));
        assert_int_equal(num(r, "output_tokens"), out_len);
        assert_string_equal(cJSON_GetObjectItem(r, "output_tokens_source")->valuestring,
                            "usage");
        assert_true(num(r, "input_tokens") > 0);
        assert_true(num(r, "ttft_ms") > 0);
        assert_true(num(r, "e2el_ms") >= num(r, "ttft_ms"));
    }
    cJSON_Delete(j);
}

static void test_concurrency_completions(void **state)
{
    char url[64], out[256], why[512] = "";

    snprintf(url, sizeof(url), "http://127.0.0.1:%u", g_d.http_port);
    snprintf(out, sizeof(out), "%s/pb-conc.json", g_d.dir);
    /* No --model: pd-bench asks GET /v1/models. */
    const char *args[] = { "--url", url, "--concurrency", "4", "--num-requests", "16",
                           "--warmup", "2", "--input-len", "uniform:8:24",
                           "--output-len", "8", "--ignore-eos", "--seed", "5",
                           "--slo", "ttft=10s", "--quiet", "--out", out, NULL };
    assert_int_equal(run_bench(args, 60), 0);
    check_run(out, 16, 8);
    if (!e2e_quiescent(&g_d, 10.0, why, sizeof(why)))
        fail_msg("not quiescent after pd-bench: %s", why);
}

static void test_rate_chat(void **state)
{
    char url[64], out[256], why[512] = "";

    snprintf(url, sizeof(url), "http://127.0.0.1:%u/v1", g_d.http_port);
    snprintf(out, sizeof(out), "%s/pb-rate.json", g_d.dir);
    const char *args[] = { "--url", url, "--endpoint", "chat", "--rate", "20",
                           "--num-requests", "12", "--input-len", "12",
                           "--output-len", "6", "--ignore-eos", "--seed", "6",
                           "--quiet", "--out", out, NULL };
    assert_int_equal(run_bench(args, 60), 0);
    check_run(out, 12, 6);
    if (!e2e_quiescent(&g_d, 10.0, why, sizeof(why)))
        fail_msg("not quiescent after pd-bench: %s", why);
}

static void test_prompt_ids_exact_input(void **state)
{
    char url[64], out[256];
    cJSON *j, *r;

    snprintf(url, sizeof(url), "http://127.0.0.1:%u", g_d.http_port);
    snprintf(out, sizeof(out), "%s/pb-ids.json", g_d.dir);
    const char *args[] = { "--url", url, "--prompt-ids", "10:60", "--input-len", "20",
                           "--output-len", "4", "--ignore-eos", "--concurrency", "2",
                           "--num-requests", "4", "--quiet", "--out", out, NULL };
    assert_int_equal(run_bench(args, 60), 0);
    check_run(out, 4, 4);
    j = load_json(out);
    /* The router's usage.prompt_tokens agrees with the ids sent. */
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(j, "requests"))
        assert_int_equal(num(r, "input_tokens"), 20);
    cJSON_Delete(j);
}

/* Multi-turn chat against the router: every turn's prompt carries the
 * router's own earlier answers, so prompts grow turn by turn. */
static void test_multi_turn_chat(void **state)
{
    char url[64], out[256], why[512] = "";
    cJSON *j, *res, *t;
    double prev_in = 0;

    snprintf(url, sizeof(url), "http://127.0.0.1:%u", g_d.http_port);
    snprintf(out, sizeof(out), "%s/pb-mt.json", g_d.dir);
    const char *args[] = { "--url", url, "--workload", "multi-turn", "--conversations", "3",
                           "--turns", "3", "--concurrency", "2", "--input-len", "10",
                           "--output-len", "6", "--ignore-eos", "--seed", "8",
                           "--quiet", "--out", out, NULL };
    assert_int_equal(run_bench(args, 90), 0);
    check_run(out, 9, 6);
    j = load_json(out);
    res = cJSON_GetObjectItem(j, "results");
    assert_int_equal(num(res, "skipped_turns"), 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(res, "per_turn")), 3);
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(res, "per_turn")) {
        print_message("turn %.0f: %.0f prompt tokens, TTFT %.2f ms, TPOT %.3f ms\n",
                      num(t, "turn"), num(t, "mean_input_tokens"), num(t, "mean_ttft_ms"),
                      num(t, "mean_tpot_ms"));
        assert_int_equal(num(t, "completed"), 3);
        /* The router's usage.prompt_tokens: history + answers + new message. */
        assert_true(num(t, "mean_input_tokens") > prev_in + 6);
        prev_in = num(t, "mean_input_tokens");
    }
    cJSON_Delete(j);
    if (!e2e_quiescent(&g_d, 10.0, why, sizeof(why)))
        fail_msg("not quiescent after pd-bench: %s", why);
}

/* Shared prefixes and a replayed trace (token ids: exact lengths, checked
 * against the router's usage.prompt_tokens). */
static void test_shared_prefix_and_trace(void **state)
{
    char url[64], out[256], trace[256], why[512] = "";
    cJSON *j, *r;
    FILE *f;
    int i = 0;
    static const int in_len[3] = { 40, 48, 20 };

    snprintf(url, sizeof(url), "http://127.0.0.1:%u", g_d.http_port);
    snprintf(out, sizeof(out), "%s/pb-sp.json", g_d.dir);
    const char *sp[] = { "--url", url, "--workload", "shared-prefix", "--prefix-groups", "2",
                         "--prefix-prompts", "3", "--prefix-len", "32", "--input-len", "8",
                         "--prompt-ids", "10:60", "--output-len", "4", "--ignore-eos",
                         "--concurrency", "2", "--quiet", "--out", out, NULL };
    assert_int_equal(run_bench(sp, 60), 0);
    check_run(out, 6, 4);
    j = load_json(out);
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(j, "requests"))
        assert_int_equal(num(r, "input_tokens"), 40);
    cJSON_Delete(j);

    snprintf(trace, sizeof(trace), "%s/trace.jsonl", g_d.dir);
    f = fopen(trace, "w");
    assert_non_null(f);
    fprintf(f, "{\"timestamp\": 0, \"input_length\": 40, \"output_length\": 5, \"hash_ids\": [1, 2, 3]}\n"
               "{\"timestamp\": 30, \"input_length\": 48, \"output_length\": 5, \"hash_ids\": [1, 2, 4]}\n"
               "{\"timestamp\": 60, \"input_length\": 20, \"output_length\": 5, \"hash_ids\": [1, 5]}\n");
    fclose(f);
    snprintf(out, sizeof(out), "%s/pb-trace.json", g_d.dir);
    const char *tr[] = { "--url", url, "--trace", trace, "--block-size", "16",
                         "--prompt-ids", "10:60", "--ignore-eos", "--quiet", "--out", out,
                         NULL };
    assert_int_equal(run_bench(tr, 60), 0);
    check_run(out, 3, 5);
    j = load_json(out);
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(j, "requests"))
        assert_int_equal(num(r, "input_tokens"), in_len[i++]);
    cJSON_Delete(j);
    if (!e2e_quiescent(&g_d, 10.0, why, sizeof(why)))
        fail_msg("not quiescent after pd-bench: %s", why);
}

/* --compare with the router on both sides (by two spellings of its URL):
 * both passes complete, every figure has a ratio. */
static void test_compare_router(void **state)
{
    char url[64], url2[80], out[256], why[512] = "";
    cJSON *j, *sbs, *row;

    snprintf(url, sizeof(url), "http://127.0.0.1:%u", g_d.http_port);
    snprintf(url2, sizeof(url2), "http://127.0.0.1:%u/v1", g_d.http_port);
    snprintf(out, sizeof(out), "%s/pb-cmp.json", g_d.dir);
    const char *args[] = { "--url", url, "--compare", url2, "--rate", "20",
                           "--num-requests", "8", "--input-len", "uniform:8:24",
                           "--output-len", "5", "--ignore-eos", "--seed", "4",
                           "--quiet", "--out", out, NULL };
    assert_int_equal(run_bench(args, 90), 0);
    check_run(out, 8, 5);
    j = load_json(out);
    assert_int_equal(num(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "compare"), "results"),
                         "completed"), 8);
    sbs = cJSON_GetObjectItem(j, "side_by_side");
    row = cJSON_GetObjectItem(sbs, "total_output_tokens");
    assert_float_equal(num(row, "ratio"), 1.0, 1e-12);
    row = cJSON_GetObjectItem(sbs, "mean_ttft_ms");
    print_message("TTFT %.2f vs %.2f ms (ratio %.3f)\n", num(row, "url"), num(row, "compare"),
                  num(row, "ratio"));
    assert_true(num(row, "ratio") > 0);
    cJSON_Delete(j);
    if (!e2e_quiescent(&g_d, 10.0, why, sizeof(why)))
        fail_msg("not quiescent after pd-bench: %s", why);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrency_completions),
        cmocka_unit_test(test_rate_chat),
        cmocka_unit_test(test_prompt_ids_exact_input),
        cmocka_unit_test(test_multi_turn_chat),
        cmocka_unit_test(test_shared_prefix_and_trace),
        cmocka_unit_test(test_compare_router),
    };

    if (argc < 6) {
        fprintf(stderr, "usage: %s PD-BENCH PD-ROUTER PD-PREFILL PD-DECODE MODEL\n",
                argv[0]);
        return 2;
    }
    g_bench = argv[1];
    g_router = argv[2];
    g_prefill = argv[3];
    g_decode = argv[4];
    g_model = argv[5];
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup, teardown);
}
