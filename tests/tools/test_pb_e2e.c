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

static cJSON *load_json(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf;
    long n;
    cJSON *j;

    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    rewind(f);
    buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    j = cJSON_Parse(buf);
    free(buf);
    assert_non_null(j);
    return j;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v))
        fail_msg("JSON key %s is not a number", key);
    return v->valuedouble;
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

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrency_completions),
        cmocka_unit_test(test_rate_chat),
        cmocka_unit_test(test_prompt_ids_exact_input),
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
