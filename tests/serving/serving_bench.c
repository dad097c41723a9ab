/* serving_bench.c - pd-serving-bench: TTFT, KV handoff and router overhead
 * of one real deployment (pd-router + 1 pd-prefill + 1 pd-decode on
 * loopback, started with the e2e harness), per request, sequentially.
 *
 *   pd-serving-bench [--smoke] [--n=N] ROUTER PREFILL DECODE MODEL
 *
 * For the built-in model (MODEL) and the sim engine at the Llama-3-8B
 * geometry, each over the default UCX transports (shm) and UCX_TLS=tcp:
 *   disaggregated requests (prompt >= disagg-threshold, max_tokens 4,
 *   streamed): TTFT as the client sees it (first SSE chunk); pull time,
 *   decode's handoff share and the prefill -> router -> decode hop from the
 *   decode daemon's stats (per request: deltas of histogram sums, one
 *   request in flight at a time), handoff = hop + decode share, i.e.
 *   (decode's first step start - prefill's export) - pull time;
 *   decode-local requests (4-token prompts, max_tokens 1, not streamed):
 *   router overhead = client latency - the decode's own DECODE_REQ ->
 *   FINISH time (req_time), i.e. the router's HTTP, tokenizing,
 *   detokenizing and both control hops.
 * Prints p50 / p99 per figure; exit 0 unless the deployment failed.
 * Benchmark code: no assertions on speed. */
#include "pd_e2e.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LEASE_TTL_NS 30000000000.0 /* --lease-ttl=30s, see run_config */

static const char *g_router, *g_prefill, *g_decode;

typedef struct {
    double *v;
    int n;
} series_t;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quant(series_t *s, double q)
{
    if (s->n == 0)
        return -1;
    qsort(s->v, (size_t)s->n, sizeof(double), cmp_d);
    int i = (int)(q * (s->n - 1) + 0.5);
    return s->v[i];
}

/* The decode table's histogram `name` (count and sum_ns). */
static void dec_hist(const cJSON *stats, const char *name, double *count, double *sum)
{
    *count = *sum = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(stats, "stats")) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "table");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "decode") != 0)
            continue;
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(e, "values"), name);
        *count = e2e_jnum(h, "count");
        *sum = e2e_jnum(h, "sum_ns");
    }
}

#define HISTS(X) X(transfer_time) X(handoff) X(lease_left) X(req_time)
typedef struct {
#define H_FIELD(n) double n##_c, n##_s;
    HISTS(H_FIELD)
#undef H_FIELD
} snap_t;

static int snap(const e2e_proc_t *dec, snap_t *s)
{
    cJSON *j = e2e_admin(dec->sock, "stats");
    if (j == NULL)
        return -1;
#define H_READ(n) dec_hist(j, #n, &s->n##_c, &s->n##_s);
    HISTS(H_READ)
#undef H_READ
    cJSON_Delete(j);
    return 0;
}

/* One request; ttft_s / total_s as the client sees them. 0 or -1. */
static int one_request(uint16_t port, int n_prompt, int salt, int max_tokens, bool stream,
                       double *ttft_s, double *total_s)
{
    char body[16384];
    int o = snprintf(body, sizeof(body), "{\"prompt\":[");
    for (int i = 0; i < n_prompt; i++)
        o += snprintf(body + o, sizeof(body) - (size_t)o, "%s%d", i ? "," : "",
                      1 + (i * 7 + salt * 13) % 250);
    snprintf(body + o, sizeof(body) - (size_t)o,
             "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true%s}", max_tokens,
             stream ? ",\"stream\":true" : "");
    int fd = e2e_http_connect(port);
    if (fd < 0)
        return -1;
    double t0 = e2e_now();
    char *buf = NULL;
    size_t len = 0;
    int rc = -1;
    if (e2e_http_send(fd, "POST", "/v1/completions", NULL, body, strlen(body)) != 0)
        goto out;
    if (stream && e2e_http_read(fd, &buf, &len, "data: {", 30) != 1)
        goto out;
    *ttft_s = e2e_now() - t0;
    if (e2e_http_read(fd, &buf, &len, stream ? "data: [DONE]" : "\"usage\"", 30) != 1)
        goto out;
    *total_s = e2e_now() - t0;
    if (!stream)
        *ttft_s = *total_s;
    rc = strncmp(buf, "HTTP/1.1 200", 12) == 0 ? 0 : -1;
    if (rc != 0)
        fprintf(stderr, "bench: %.200s\n", buf);
out:
    free(buf);
    close(fd);
    return rc;
}

typedef struct {
    const char *name, *model, *tls;
    int n_prompt;
} config_t;

static int run_config(const config_t *c, int n)
{
    const char *rargs[] = { "--disagg-mode=threshold", "--disagg-threshold=32", NULL };
    const char *pargs[] = { "--lease-ttl=30s", "--kv-blocks=160", NULL };
    const char *dargs[] = { "--kv-blocks=160", NULL };
    char tls[64];
    snprintf(tls, sizeof(tls), "UCX_TLS=%s", c->tls ? c->tls : "");
    const char *env[] = { tls, NULL };
    e2e_opts_t o = {
        .router_bin = g_router, .prefill_bin = g_prefill, .decode_bin = g_decode,
        .model = c->model, .router_args = rargs, .prefill_args = pargs, .decode_args = dargs,
        .env = c->tls ? env : NULL, .n_prefill = 1, .n_decode = 1, .ready_timeout_s = 60,
    };
    e2e_deploy_t d;
    if (e2e_deploy_start(&d, &o) != 0) {
        fprintf(stderr, "bench: %s: deployment did not start\n", c->name);
        return -1;
    }
    const e2e_proc_t *dec = &d.decode[0];
    series_t ttft = { calloc((size_t)n, sizeof(double)), 0 }, pull = ttft, hand = ttft,
             hop = ttft, full = ttft, rover = ttft, lat = ttft;
    pull.v = calloc((size_t)n, sizeof(double));
    hand.v = calloc((size_t)n, sizeof(double));
    hop.v = calloc((size_t)n, sizeof(double));
    full.v = calloc((size_t)n, sizeof(double));
    rover.v = calloc((size_t)n, sizeof(double));
    lat.v = calloc((size_t)n, sizeof(double));
    int rc = 0;
    /* warm-up: endpoints, rkeys, first allocations */
    double a, b;
    for (int i = 0; i < 3 && rc == 0; i++) {
        rc |= one_request(d.http_port, c->n_prompt, 1000 + i, 4, true, &a, &b);
        rc |= one_request(d.http_port, 4, 2000 + i, 1, false, &a, &b);
    }
    for (int i = 0; i < n && rc == 0; i++) {
        snap_t s0, s1;
        double t, tot;
        /* disaggregated */
        if (snap(dec, &s0) != 0 || one_request(d.http_port, c->n_prompt, i, 4, true, &t, &tot) ||
            snap(dec, &s1) != 0) {
            rc = -1;
            break;
        }
        if (s1.transfer_time_c - s0.transfer_time_c == 1 && s1.handoff_c - s0.handoff_c == 1 &&
            s1.lease_left_c - s0.lease_left_c == 1) {
            ttft.v[ttft.n++] = t;
            pull.v[pull.n++] = (s1.transfer_time_s - s0.transfer_time_s) / 1e9;
            hand.v[hand.n++] = (s1.handoff_s - s0.handoff_s) / 1e9;
            double h = (LEASE_TTL_NS - (s1.lease_left_s - s0.lease_left_s)) / 1e9;
            hop.v[hop.n++] = h;
            full.v[full.n++] = h + (s1.handoff_s - s0.handoff_s) / 1e9;
        }
        /* decode-local */
        if (snap(dec, &s0) != 0 || one_request(d.http_port, 4, i, 1, false, &t, &tot) ||
            snap(dec, &s1) != 0) {
            rc = -1;
            break;
        }
        if (s1.req_time_c - s0.req_time_c == 1) {
            lat.v[lat.n++] = tot;
            rover.v[rover.n++] = tot - (s1.req_time_s - s0.req_time_s) / 1e9;
        }
    }
#define MS(s) quant(&s, 0.5) * 1e3, quant(&s, 0.99) * 1e3
    printf("%-22s n=%-4d TTFT %7.3f/%7.3f  pull %7.3f/%7.3f  handoff %6.3f/%6.3f "
           "(hop %6.3f/%6.3f + decode %6.3f/%6.3f)  local e2e %6.3f/%6.3f  router %6.3f/%6.3f"
           "  [ms p50/p99]\n",
           c->name, ttft.n, MS(ttft), MS(pull), MS(full), MS(hop), MS(hand), MS(lat), MS(rover));
#undef MS
    fflush(stdout);
    free(ttft.v); free(pull.v); free(hand.v); free(hop.v); free(full.v); free(rover.v);
    free(lat.v);
    int bad = e2e_deploy_stop(&d, rc != 0);
    return rc != 0 || bad != 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
    bool smoke = false;
    int n = 200, ai = 1;
    for (; ai < argc && strncmp(argv[ai], "--", 2) == 0; ai++) {
        if (strcmp(argv[ai], "--smoke") == 0)
            smoke = true;
        else if (strncmp(argv[ai], "--n=", 4) == 0)
            n = atoi(argv[ai] + 4);
    }
    if (argc - ai != 4 || n <= 0) {
        fprintf(stderr, "usage: %s [--smoke] [--n=N] ROUTER PREFILL DECODE MODEL\n", argv[0]);
        return 2;
    }
    g_router = argv[ai];
    g_prefill = argv[ai + 1];
    g_decode = argv[ai + 2];
    if (smoke)
        n = 5;
    const config_t cfgs[] = {
        { "builtin shm", argv[ai + 3], NULL, 200 },
        { "builtin tcp", argv[ai + 3], "tcp", 200 },
        { "sim-8b shm", "sim:llama3-8b,no_sleep=1", NULL, 1000 },
        { "sim-8b tcp", "sim:llama3-8b,no_sleep=1", "tcp", 1000 },
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
        if (smoke && i != 0 && i != 3)
            continue;
        rc |= run_config(&cfgs[i], n);
    }
    return rc == 0 ? 0 : 1;
}
