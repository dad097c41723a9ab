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

#include "pd_build_config.h"
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
/* Sum of the series of `sel`: a metric name, optionally with {label="v"}
 * (which must appear in the series' labels); -1 if there is none. */
static double metric(const char *text, const char *sel)
{
    double sum = -1;
    char name[256], want[256] = "";
    size_t nl = strcspn(sel, "{");
    snprintf(name, sizeof(name), "%.*s", (int)nl, sel);
    if (sel[nl] == '{')
        snprintf(want, sizeof(want), "%.*s", (int)(strlen(sel) - nl - 2), sel + nl + 1);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, name, nl) != 0 || (l[nl] != '{' && l[nl] != ' '))
            continue;
        const char *sp = l[nl] == '{' ? strchr(l + nl, '}') : l + nl;
        if (sp == NULL)
            continue;
        if (want[0] != '\0') {
            const char *w = l[nl] == '{' ? strstr(l + nl, want) : NULL;
            if (w == NULL || w > sp)
                continue;
        }
        sum = (sum < 0 ? 0 : sum) + strtod(sp + 1, NULL);
    }
    return sum;
}

static void absent(const char *text, const char *what, const char *name)
{
    if (metric(text, name) >= 0 || strstr(text, name) != NULL)
        fail_msg("%s exports %s (it must not)", what, name);
}

/* The le="..." bounds of one histogram's first series, as text. */
static void bucket_bounds(const char *text, const char *hist, char *out, size_t cap)
{
    char pre[256];
    snprintf(pre, sizeof(pre), "%s_bucket{", hist);
    out[0] = '\0';
    const char *first = strstr(text, pre);
    for (const char *l = first; l != NULL && strncmp(l, pre, strlen(pre)) == 0;
         l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *le = strstr(l, "le=\"");
        if (le == NULL)
            break;
        size_t n = strcspn(le + 4, "\"");
        size_t o = strlen(out);
        snprintf(out + o, cap - o, "%s%.*s", o ? " " : "", (int)n, le + 4);
        if (strncmp(le + 4, "+Inf", 4) == 0)
            break;
    }
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
    need(dr.body, "decode", "pd_decode_requests_total{outcome=\"completed\"}", 4);
    need(dr.body, "decode", "pd_decode_requests_total{outcome=\"canceled\"}", 0);
    need(dr.body, "decode", "pd_decode_pulls_total{result=\"ok\"}", 4);
    need(dr.body, "decode", "pd_decode_tokens_out_total", 1);
    need(dr.body, "decode", "pd_kvx_pull_latency_seconds_count", 4);
    need(dr.body, "decode", "pd_kv_pool_blocks", 256);
    need(dr.body, "decode", "pd_kv_pool_blocks_free", 256);
    need(dr.body, "decode", "pd_kv_pool_blocks_used", 0);
    /* prefill: leases exported and released, requests, pool */
    need(pr.body, "prefill", "pd_kvx_leases_exported_total", 4);
    need(pr.body, "prefill", "pd_kvx_leases_ended_total{how=\"released\"}", 4);
    need(pr.body, "prefill", "pd_kvx_leases_ended_total{how=\"expired\"}", 0);
    need(pr.body, "prefill", "pd_prefill_accepted_total", 4);
    need(pr.body, "prefill", "pd_prefill_prompt_tokens_total", 10);
    need(pr.body, "prefill", "pd_kv_pool_blocks", 256);
    need(pr.body, "prefill", "pd_kv_pool_blocks_free", 256);
    need(dr.body, "decode", "pd_kv_pool_usage_ratio", 0);
    /* which prefill the KV came from: per-peer series on the decode */
    need(dr.body, "decode", "pd_kvx_peer_bytes_pulled_total{peer=\"}", 1);
    need(dr.body, "decode", "pd_kvx_peer_pulls_total{result=\"ok\"}", 4);
    need(dr.body, "decode", "pd_kvx_peer_pull_latency_seconds_count", 4);
    need(pr.body, "prefill", "pd_kv_pool_usage_ratio", 0);
    /* reasons are one labeled family, not a metric each */
    need(dr.body, "decode", "pd_kvx_rejected_total{reason=\"bad_mac\"}", 0);
    need(dr.body, "decode", "pd_kvx_pulls_failed_total{reason=\"timed_out\"}", 0);
    absent(dr.body, "decode", "pd_kvx_rejected_bad_mac_total");
    absent(dr.body, "decode", "pd_kvx_pulls_timed_out_total");
    /* both roles export and pull: a prefill pulls a decode's cached
     * prefix (none here), a decode pulls and exports (live migration, its
     * cached prefix to a prefill) */
    need(pr.body, "prefill", "pd_kvx_pulls_started_total", 0);
    need(pr.body, "prefill", "pd_kvx_bytes_pulled_total", 0);
    need(pr.body, "prefill", "pd_kvx_leases_exported_total", 4);
    need(dr.body, "decode", "pd_kvx_leases_exported_total", 0);
    need(dr.body, "decode", "pd_decode_migrated_out_total", 0);
    /* router: outcomes, finish reasons and the model as labels */
    need(rr.body, "router", "pd_router_requests_total{outcome=\"completed\"}", 4);
    need(rr.body, "router", "pd_router_requests_finished_total{finish_reason=\"length\"}", 4);
    need(rr.body, "router", "pd_router_requests_refused_total{reason=\"overloaded\"}", 0);
    need(rr.body, "router", "pd_router_requests_prefilled_total{where=\"prefill_daemon\"}", 4);
    need(rr.body, "router", "pd_router_requests_accepted_total{model=\"}", 4);
    /* every daemon: build info and the standard process metrics */
    const char *bodies[3] = { rr.body, pr.body, dr.body };
    const char *names[3] = { "router", "prefill", "decode" };
    for (int i = 0; i < 3; i++) {
        need(bodies[i], names[i], "pd_build_info{version=\"" PD_VERSION "\"}", 1);
        need(bodies[i], names[i], "process_cpu_seconds_total", 0);
        need(bodies[i], names[i], "process_resident_memory_bytes", 1 << 20);
        need(bodies[i], names[i], "process_open_fds", 3);
        need(bodies[i], names[i], "process_start_time_seconds", 1.6e9);
    }
    /* buckets fit the figure: request scale from 1 ms, a step from 1 us */
    char b[1024];
    bucket_bounds(rr.body, "pd_router_request_ttft_seconds", b, sizeof(b));
    if (strncmp(b, "0.001024 0.002048 ", 18) != 0 || strstr(b, "134.217728 +Inf") == NULL)
        fail_msg("router TTFT buckets: %s", b);
    bucket_bounds(dr.body, "pd_decode_step_time_seconds", b, sizeof(b));
    if (strncmp(b, "1e-06 4e-06 1.6e-05 ", 20) != 0 || strstr(b, "1.048576 +Inf") == NULL)
        fail_msg("decode step buckets: %s", b);
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
