/* test_ops_metrics.c - GET /metrics on every daemon of a real deployment
 * (tests/harness): pd-router (its HTTP port), pd-prefill and pd-decode
 * (metrics.listen=127.0.0.1:0, port from the ready file). After a few
 * disaggregated requests each scrape must pass `promtool check metrics`
 * and carry the values that matter: KV bytes pulled (decode), leases
 * exported (prefill), request counters, pool gauges; /health answers 200,
 * anything else 404; the ledgers balance afterwards.
 *
 *   test-ops-metrics ROUTER PREFILL DECODE MODEL */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pd_e2e.h"

static const char *g_router, *g_prefill, *g_decode, *g_model;
static e2e_deploy_t g_d;
static bool g_up;

/* Port number `key` of a daemon's ready file, or 0. */
static uint16_t ready_port(const e2e_proc_t *p, const char *key)
{
    FILE *f = fopen(p->ready, "r");
    if (f == NULL)
        return 0;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    double v = e2e_jnum(j, key);
    cJSON_Delete(j);
    return v > 0 && v < 65536 ? (uint16_t)v : 0;
}

/* Sum of the samples of metric `name` (exact name, any labels); -1 if absent. */
static double metric(const char *text, const char *name)
{
    double sum = -1;
    size_t nl = strlen(name);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, name, nl) != 0 || (l[nl] != '{' && l[nl] != ' '))
            continue;
        const char *sp = l[nl] == '{' ? strchr(l + nl, '}') : l + nl;
        if (sp == NULL)
            continue;
        sum = (sum < 0 ? 0 : sum) + strtod(sp + 1, NULL);
    }
    return sum;
}

/* promtool check metrics < text: its exit status (127: not runnable). */
static int promtool_check(const char *what, const char *text, size_t len)
{
    char path[] = "/tmp/pd-metrics-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
    char cmd[512], out[] = "/tmp/pd-promtool-XXXXXX";
    int ofd = mkstemp(out);
    close(ofd);
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s > %s 2>&1", path, out);
    int rc = system(cmd);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
    if (rc != 0) {
        fprintf(stderr, "promtool check metrics (%s) exited %d:\n", what, rc);
        char tail[4096];
        FILE *f = fopen(out, "r");
        size_t n = f ? fread(tail, 1, sizeof(tail) - 1, f) : 0;
        tail[n] = '\0';
        if (f)
            fclose(f);
        fprintf(stderr, "%s\n", tail);
    }
    unlink(path);
    unlink(out);
    return rc;
}

static void scrape(uint16_t port, const char *what, e2e_resp_t *r)
{
    assert_true(port != 0);
    assert_int_equal(e2e_http(port, "GET", "/metrics", NULL, NULL, 10, r), 0);
    if (r->status != 200)
        fail_msg("%s /metrics: status %d", what, r->status);
    char ct[128];
    assert_non_null(e2e_header(r, "Content-Type", ct, sizeof(ct)));
    if (strstr(ct, "text/plain") == NULL || strstr(ct, "version=0.0.4") == NULL)
        fail_msg("%s /metrics: Content-Type '%s'", what, ct);
    int rc = promtool_check(what, r->body, r->body_len);
    if (rc != 0)
        fail_msg("%s: promtool check metrics exited %d", what, rc);
}

static void need(const char *text, const char *what, const char *name, double min)
{
    double v = metric(text, name);
    if (v < min)
        fail_msg("%s: %s = %g, want >= %g", what, name, v, min);
}

static int setup(void **st)
{
    (void)st;
    static const char *const rargs[] = { "--disagg-mode=always", NULL };
    static const char *const margs[] = { "--metrics.listen=127.0.0.1:0", "--kv-blocks=256",
                                         NULL };
    e2e_opts_t o = {
        .router_bin = g_router, .prefill_bin = g_prefill, .decode_bin = g_decode,
        .model = g_model, .router_args = rargs, .prefill_args = margs, .decode_args = margs,
        .n_prefill = 1, .n_decode = 1, .ready_timeout_s = 30,
    };
    g_up = true;
    if (e2e_deploy_start(&g_d, &o) != 0) {
        e2e_deploy_stop(&g_d, true);
        g_up = false;
        return -1;
    }
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    if (!g_up)
        return 0;
    g_up = false;
    return e2e_deploy_stop(&g_d, false) == 0 ? 0 : -1;
}

static void test_metrics_everywhere(void **st)
{
    (void)st;
    /* a few disaggregated requests, > 1 block included (block-tokens 16);
     * min_tokens 2: token 0 is never EOS, so every one reaches the decode */
    for (int i = 0; i < 4; i++) {
        char body[1024];
        int o = snprintf(body, sizeof(body), "{\"prompt\":[");
        int n = 10 + i * 15;
        for (int k = 0; k < n; k++)
            o += snprintf(body + o, sizeof(body) - (size_t)o, "%s%d", k ? "," : "",
                          (k * 31 + i) % 250 + 4);
        snprintf(body + o, sizeof(body) - (size_t)o,
                 "],\"max_tokens\":8,\"min_tokens\":2,\"temperature\":0%s}",
                 i % 2 ? ",\"stream\":true" : "");
        e2e_resp_t r;
        assert_int_equal(e2e_http(g_d.http_port, "POST", "/v1/completions",
                                  "Content-Type: application/json\r\n", body, 60, &r), 0);
        if (r.status != 200)
            fail_msg("request %d: status %d %s", i, r.status, r.body ? r.body : "");
        e2e_resp_free(&r);
    }
    char why[256];
    if (!e2e_quiescent(&g_d, 15, why, sizeof(why)))
        fail_msg("not quiescent: %s", why);

    uint16_t pport = ready_port(&g_d.prefill[0], "metrics");
    uint16_t dport = ready_port(&g_d.decode[0], "metrics");
    e2e_resp_t rr, pr, dr;
    scrape(g_d.http_port, "router", &rr);
    scrape(pport, "prefill", &pr);
    scrape(dport, "decode", &dr);

    /* decode: KV pulled from the prefill, requests by outcome, pool */
    need(dr.body, "decode", "pd_kvx_bytes_pulled_total", 1);
    need(dr.body, "decode", "pd_kvx_pulls_ok_total", 4);
    need(dr.body, "decode", "pd_decode_accepted_total", 4);
    need(dr.body, "decode", "pd_decode_completed_total", 4);
    need(dr.body, "decode", "pd_decode_tokens_out_total", 1);
    need(dr.body, "decode", "pd_kvx_pull_latency_seconds_count", 4);
    need(dr.body, "decode", "pd_kv_pool_blocks", 256);
    need(dr.body, "decode", "pd_kv_pool_blocks_free", 256);
    need(dr.body, "decode", "pd_kv_pool_blocks_used", 0);
    /* prefill: leases exported and released, requests, pool */
    need(pr.body, "prefill", "pd_kvx_leases_exported_total", 4);
    need(pr.body, "prefill", "pd_kvx_leases_released_total", 4);
    need(pr.body, "prefill", "pd_kvx_leases_expired_total", 0);
    need(pr.body, "prefill", "pd_prefill_accepted_total", 4);
    need(pr.body, "prefill", "pd_prefill_prompt_tokens_total", 10);
    need(pr.body, "prefill", "pd_kv_pool_blocks", 256);
    need(pr.body, "prefill", "pd_kv_pool_blocks_free", 256);
    /* router: something request-shaped is there and non-zero */
    if (strstr(rr.body, "# TYPE ") == NULL)
        fail_msg("router /metrics has no TYPE lines");
    e2e_resp_free(&rr);
    e2e_resp_free(&pr);
    e2e_resp_free(&dr);

    /* /health 200, HEAD of /metrics has no body, others 404/405 */
    uint16_t ports[2] = { pport, dport };
    for (int i = 0; i < 2; i++) {
        e2e_resp_t r;
        assert_int_equal(e2e_http(ports[i], "GET", "/health", NULL, NULL, 10, &r), 0);
        assert_int_equal(r.status, 200);
        e2e_resp_free(&r);
        assert_int_equal(e2e_http(ports[i], "GET", "/v1/completions", NULL, NULL, 10, &r), 0);
        assert_int_equal(r.status, 404);
        e2e_resp_free(&r);
        assert_int_equal(e2e_http(ports[i], "POST", "/metrics", NULL, "x", 10, &r), 0);
        assert_int_equal(r.status, 405);
        e2e_resp_free(&r);
    }
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s ROUTER PREFILL DECODE MODEL\n", argv[0]);
        return 2;
    }
    g_router = argv[1];
    g_prefill = argv[2];
    g_decode = argv[3];
    g_model = argv[4];
    if (system("promtool --version > /dev/null 2>&1") != 0) {
        fprintf(stderr, "SKIP: promtool not installed (Debian package prometheus)\n");
        return 77;
    }
    const struct CMUnitTest t[] = { cmocka_unit_test(test_metrics_everywhere) };
    return cmocka_run_group_tests_name("ops-metrics", t, setup, teardown);
}
