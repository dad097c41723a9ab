/* test_failover.c - decode failover with real processes (issue 14): a
 * pd-router, one pd-prefill and three pd-decode daemons on loopback; streams
 * run greedy and seeded, short prompts (decode-local) and long ones
 * (disaggregated); a decode serving several of them is SIGKILLed at a
 * random point (right after the requests went out: before the first step or
 * during the pull; or mid-stream), a fresh decode joins, and every stream
 * must end with [DONE], no error frame, and exactly the text the same request
 * produced without a fault (the reference run before the kills).
 *
 * usage: test-failover ROUTER PREFILL DECODE MODEL [ROUNDS]
 * After the rounds: nothing failed, every live pool is free and every
 * ledger balances (e2e_quiescent), the router counted the failovers. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pd_e2e.h"

static const char *g_router, *g_prefill, *g_decode, *g_model;
static int g_rounds = 4;
static e2e_deploy_t g_d;
static bool g_up;

#define NREQ 6
#define MAX_TOKENS 240
#define MIGRATE_TOKENS 900

/* A long prompt (over the router's disaggregation threshold) or a short
 * one (decode-local); greedy or seeded sampling; all stream. */
static void make_body(int i, bool stream, int max_tokens, char *out, size_t cap)
{
    static const char *const prompts[] = {
        "The quick brown fox",
        "Permission is hereby granted, free of charge, to any person obtaining a copy of "
        "this software and associated documentation files, to deal in the Software without "
        "restriction, including without limitation the rights to use, copy, modify, merge, "
        "publish, distribute, sublicense, and or sell copies of the Software",
        "Once upon a time",
        "This program is free software; you can redistribute it and or modify it under the "
        "terms of the GNU General Public License as published by the Free Software "
        "Foundation; either version 2 of the License, or any later version. This program is "
        "distributed in the hope that it will be useful, but without any warranty",
    };
    const char *p = prompts[i % 4];
    if (i % 2 == 0)
        snprintf(out, cap,
                 "{\"prompt\":\"%s\",\"max_tokens\":%d,\"ignore_eos\":true,"
                 "\"temperature\":0,\"stream\":%s}",
                 p, max_tokens, stream ? "true" : "false");
    else
        snprintf(out, cap,
                 "{\"prompt\":\"%s\",\"max_tokens\":%d,\"ignore_eos\":true,"
                 "\"temperature\":0.9,\"top_p\":0.95,\"seed\":%d,\"presence_penalty\":0.5,"
                 "\"stream\":%s}",
                 p, max_tokens, 1000 + i, stream ? "true" : "false");
}

static double router_stat(const char *name, const char *field)
{
    char path[128];
    snprintf(path, sizeof(path), "%s%s%s", name, field ? "." : "", field ? field : "");
    return e2e_router_stat(&g_d.router, path);
}

static int setup(void **st)
{
    (void)st;
    static const char *ra[] = { "--heartbeat-interval=300ms", "--max-retries=3", NULL };
    static const char *pa[] = { "--kv-blocks=512", NULL };
    static const char *da[] = { "--kv-blocks=512", NULL };
    e2e_opts_t o = {
        .router_bin = g_router, .prefill_bin = g_prefill, .decode_bin = g_decode,
        .model = g_model, .router_args = ra, .prefill_args = pa, .decode_args = da,
        .n_prefill = 1, .n_decode = 3, .ready_timeout_s = 30,
    };
    int rc = e2e_deploy_start(&g_d, &o);
    g_up = true;
    /* PD_KV_DTYPE / _K / _V (e2e-failover-kv-*): every daemon stores K and
     * V in those dtypes, so replay and migration run on them */
    const char *kvd = getenv("PD_KV_DTYPE"), *want[2] = { getenv("PD_KV_DTYPE_K"),
                                                          getenv("PD_KV_DTYPE_V") };
    kvd = kvd && *kvd ? kvd : "f16";
    for (int kv = 0; kv < 2; kv++)
        want[kv] = want[kv] && *want[kv] ? want[kv] : kvd;
    const e2e_proc_t *dm[] = { &g_d.prefill[0], &g_d.decode[0], &g_d.decode[1], &g_d.decode[2] };
    for (size_t i = 0; rc == 0 && i < sizeof(dm) / sizeof(dm[0]); i++) {
        cJSON *j = e2e_admin(dm[i]->sock, "kv");
        for (int kv = 0; kv < 2; kv++) {
            const cJSON *d = cJSON_GetObjectItem(j, kv ? "kv_dtype_v" : "kv_dtype_k");
            if (!cJSON_IsString(d) || strcmp(d->valuestring, want[kv]) != 0) {
                fprintf(stderr, "failover: daemon %zu kv_dtype_%c %s, want %s\n", i,
                        kv ? 'v' : 'k', cJSON_IsString(d) ? d->valuestring : "?", want[kv]);
                rc = -1;
            }
        }
        cJSON_Delete(j);
    }
    return rc;
}

static int teardown(void **st)
{
    (void)st;
    if (!g_up)
        return 0;
    g_up = false;
    int bad = e2e_deploy_stop(&g_d, false);
    if (bad != 0)
        fprintf(stderr, "failover: %d daemon(s) exited badly or left sanitizer reports\n", bad);
    return bad == 0 ? 0 : -1;
}

/* The text of a whole (non-streamed) completion. */
static char *reference_text(int i, int max_tokens)
{
    char body[1024];
    make_body(i, false, max_tokens, body, sizeof(body));
    e2e_resp_t r;
    e2e_http(g_d.http_port, "POST", "/v1/completions", NULL, body, 60.0, &r);
    if (r.status != 200)
        fail_msg("reference %d: HTTP %d %s", i, r.status, r.body ? r.body : "");
    cJSON *j = cJSON_Parse(r.body);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0), "text");
    assert_true(cJSON_IsString(t));
    char *s = strdup(t->valuestring);
    cJSON_Delete(j);
    e2e_resp_free(&r);
    return s;
}

/* NREQ streams of the make_body requests: opened (each waits for its
 * first `chunks` chunks; 0: only sent), then read to the end and checked:
 * 200, [DONE], no error frame, and the text of the fault-free run. */
typedef struct {
    int fd;
    char *buf;
    size_t len;
} stream_t;

static void streams_open(stream_t *st, int max_tokens, int chunks)
{
    for (int i = 0; i < NREQ; i++) {
        char body[1024];
        make_body(i, true, max_tokens, body, sizeof(body));
        st[i].buf = NULL;
        st[i].len = 0;
        if (chunks > 0) {
            int got = 0;
            st[i].fd = e2e_stream_open(g_d.http_port, "/v1/completions", NULL, body, chunks,
                                       30.0, &st[i].buf, &st[i].len, &got);
        } else {
            st[i].fd = e2e_http_connect(g_d.http_port);
            if (st[i].fd >= 0 && e2e_http_send(st[i].fd, "POST", "/v1/completions", NULL, body,
                                               strlen(body)) != 0) {
                close(st[i].fd);
                st[i].fd = -1;
            }
        }
        assert_true(st[i].fd >= 0);
    }
}

static void streams_check(stream_t *st, char *const *ref, const char *what)
{
    for (int i = 0; i < NREQ; i++) {
        int rc = e2e_http_read(st[i].fd, &st[i].buf, &st[i].len, NULL, 60.0);
        close(st[i].fd);
        if (rc != 1)
            fail_msg("%s stream %d: no end within 60 s", what, i);
        e2e_resp_t r;
        memset(&r, 0, sizeof(r));
        e2e_http_parse(st[i].buf, st[i].len, &r);
        free(st[i].buf);
        e2e_sse_t s;
        e2e_sse_parse(r.body, &s);
        if (r.status != 200 || s.error_frame || !s.done || s.bad)
            fail_msg("%s stream %d: status %d, error frame %d, done %d: %.400s", what, i,
                     r.status, s.error_frame, s.done,
                     r.body_len > 400 ? r.body + r.body_len - 400 : r.body);
        if (s.text == NULL || strcmp(s.text, ref[i]) != 0)
            fail_msg("%s stream %d: text differs from the uninterrupted run\n"
                     "got:  %.300s\nwant: %.300s", what, i, s.text ? s.text : "(null)", ref[i]);
        e2e_sse_free(&s);
        e2e_resp_free(&r);
    }
}

static void quiet_ok(void)
{
    char why[512] = "";
    if (!e2e_quiescent(&g_d, 15.0, why, sizeof(why)))
        fail_msg("not quiescent: %s (logs in %s)", why, g_d.dir);
}

/* The decode with the most of our requests in flight (router's view), and
 * how many of them it has and in which state. */
static e2e_proc_t *busiest_decode(int *n_p, char *states, size_t cap)
{
    cJSON *j = e2e_admin(g_d.router.sock, "requests");
    int best = -1, best_n = 0;
    for (int k = 0; k < g_d.n_decode; k++) {
        if (!e2e_proc_alive(&g_d.decode[k]))
            continue;
        int n = 0;
        const cJSON *q;
        cJSON_ArrayForEach(q, cJSON_GetObjectItemCaseSensitive(j, "requests")) {
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(q, "decode");
            if (cJSON_IsString(d) && strcmp(d->valuestring, g_d.decode[k].id) == 0)
                n++;
        }
        if (best < 0 || n > best_n) {
            best = k;
            best_n = n;
        }
    }
    size_t o = 0;
    states[0] = '\0';
    const cJSON *q;
    cJSON_ArrayForEach(q, cJSON_GetObjectItemCaseSensitive(j, "requests")) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(q, "decode");
        if (best < 0 || !cJSON_IsString(d) || strcmp(d->valuestring, g_d.decode[best].id) != 0)
            continue;
        int w = snprintf(states + o, cap - o, "%s%s/%d", o ? " " : "",
                         cJSON_GetObjectItemCaseSensitive(q, "state")->valuestring,
                         (int)e2e_jnum(q, "generated"));
        if (w > 0 && (size_t)w < cap - o)
            o += (size_t)w;
    }
    cJSON_Delete(j);
    *n_p = best_n;
    return best >= 0 ? &g_d.decode[best] : NULL;
}

/* What a failover redoes: one decode-local prefill of prompt + generated.
 * Median wall time of a max_tokens=1 request over prompt i + its reference
 * text (generated tokens), for the figure next to the resume time. */
static double prefill_redo_ms(char *const *ref, int max_tokens)
{
    double t[NREQ];
    for (int i = 0; i < NREQ; i++) {
        char body[1024];
        make_body(i, false, max_tokens, body, sizeof(body));
        cJSON *j = cJSON_Parse(body);
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        size_t n = strlen(p->valuestring) + strlen(ref[i]) + 1;
        char *prompt = malloc(n);
        snprintf(prompt, n, "%s%s", p->valuestring, ref[i]);
        cJSON_ReplaceItemInObject(j, "prompt", cJSON_CreateString(prompt));
        cJSON_ReplaceItemInObject(j, "max_tokens", cJSON_CreateNumber(1));
        char *b = cJSON_PrintUnformatted(j);
        e2e_resp_t r;
        double t0 = e2e_now();
        e2e_http(g_d.http_port, "POST", "/v1/completions", NULL, b, 60.0, &r);
        t[i] = (e2e_now() - t0) * 1e3;
        assert_int_equal(r.status, 200);
        e2e_resp_free(&r);
        free(b);
        free(prompt);
        cJSON_Delete(j);
    }
    for (int i = 1; i < NREQ; i++) /* insertion sort: median */
        for (int k = i; k > 0 && t[k] < t[k - 1]; k--) {
            double x = t[k];
            t[k] = t[k - 1];
            t[k - 1] = x;
        }
    return (t[NREQ / 2 - 1] + t[NREQ / 2]) / 2;
}

static void test_kill_decodes(void **st)
{
    (void)st;
    char *ref[NREQ];
    for (int i = 0; i < NREQ; i++)
        ref[i] = reference_text(i, MAX_TOKENS);
    unsigned seed = (unsigned)getpid();
    fprintf(stderr, "failover: rounds %d, seed %u\n", g_rounds, seed);
    srand(seed);
    int moved = 0;
    for (int round = 0; round < g_rounds; round++) {
        stream_t sts[NREQ];
        streams_open(sts, MAX_TOKENS, 0);
        /* round 0: at once (queued, pulling, before the first step);
         * the others: a random point mid-stream */
        unsigned delay_ms = round == 0 ? 0 : 20 + (unsigned)(rand() % 400);
        if (delay_ms)
            e2e_nap_ms(delay_ms);
        int n_on = 0;
        char states[1024];
        e2e_proc_t *victim = busiest_decode(&n_on, states, sizeof(states));
        assert_non_null(victim);
        fprintf(stderr, "failover: round %d: SIGKILL %s after %u ms with %d streams (%s)\n",
                round, victim->id, delay_ms, n_on, states);
        moved += n_on;
        assert_int_equal(e2e_proc_signal(victim, SIGKILL), 0);
        char what[32];
        snprintf(what, sizeof(what), "round %d", round);
        streams_check(sts, ref, what);
        e2e_proc_wait(victim, 5.0);
        char id[48];
        snprintf(id, sizeof(id), "decode-r%d", round);
        static const char *da[] = { "--kv-blocks=512", NULL };
        assert_non_null(e2e_add_daemon(&g_d, E2E_DECODE, id, da));
    }
    double redo = prefill_redo_ms(ref, MAX_TOKENS);
    for (int i = 0; i < NREQ; i++)
        free(ref[i]);
    quiet_ok();
    double failed = router_stat("requests_failed", NULL);
    double fo = router_stat("requests_failed_over", NULL);
    double p50 = router_stat("failover_resume", "p50_ns");
    double p99 = router_stat("failover_resume", "p99_ns");
    fprintf(stderr, "failover: %d streams on killed decodes, %.0f failed over, resume p50 %.1f "
                    "ms p99 %.1f ms; one prefill of prompt + generated (idle, median) %.1f ms: "
                    "p50 %.2fx, p99 %.2fx\n", moved, fo, p50 / 1e6, p99 / 1e6, redo,
            p50 / 1e6 / redo, p99 / 1e6 / redo);
    assert_true(failed == 0);
    /* streams still pulling / queued when their decode died are retried
     * before their first decode token: failovers count the mid-stream ones */
    assert_true(fo >= 1);
}

static double proc_stat(const e2e_proc_t *p, const char *table, const char *name)
{
    cJSON *j = e2e_admin(p->sock, "stats");
    double v = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "stats")) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "table");
        if (cJSON_IsString(t) && strcmp(t->valuestring, table) == 0)
            v = e2e_jnum(cJSON_GetObjectItemCaseSensitive(e, "values"), name);
    }
    cJSON_Delete(j);
    return v;
}

/* The migration tests' start: the fault-free texts of MIGRATE_TOKENS-long
 * requests, the same requests streaming (a first chunk each), and the
 * decode running most of them. */
static e2e_proc_t *migration_streams(char **ref, stream_t *sts, int *n_on, char *states,
                                     size_t cap)
{
    for (int i = 0; i < NREQ; i++)
        ref[i] = reference_text(i, MIGRATE_TOKENS);
    streams_open(sts, MIGRATE_TOKENS, 1);
    e2e_proc_t *src = busiest_decode(n_on, states, cap);
    assert_non_null(src);
    return src;
}

/* Live migration: `set-backend <decode> drain` (what `pdctl drain` and
 * `pdctl scale decode N-1` send) moves the decode's running streams to the
 * others with their KV (MIGRATE -> export -> MIGRATE_DONE -> DECODE_REQ with
 * the handle -> pull): every stream ends with the fault-free text, nothing
 * fails or fails over, the drained decode's pool comes back empty. */
static void test_drain_migrates(void **st)
{
    (void)st;
    char *ref[NREQ];
    stream_t sts[NREQ];
    int n_on = 0;
    char states[1024];
    double fo0 = router_stat("requests_failed_over", NULL);
    double mig0 = router_stat("requests_migrated", NULL);
    e2e_proc_t *src = migration_streams(ref, sts, &n_on, states, sizeof(states));
    double out0 = proc_stat(src, "decode", "migrated_out");
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "set-backend %s drain", src->id);
    cJSON *rep = e2e_admin(g_d.router.sock, cmd);
    double asked = e2e_jnum(rep, "migrating");
    cJSON_Delete(rep);
    fprintf(stderr, "migrate: drain %s with %d streams (%s): %.0f asked to migrate\n", src->id,
            n_on, states, asked);
    streams_check(sts, ref, "drain");
    for (int i = 0; i < NREQ; i++)
        free(ref[i]);
    double moved = router_stat("requests_migrated", NULL) - mig0;
    double out = proc_stat(src, "decode", "migrated_out") - out0;
    double p50 = router_stat("migration_resume", "p50_ns");
    fprintf(stderr, "migrate: %.0f moved (router), %.0f handed out by %s, resume p50 %.1f ms\n",
            moved, out, src->id, p50 / 1e6);
    assert_true(asked >= 1);
    /* a stream left at the drain (no room then) may move at a later heartbeat */
    assert_true(moved >= asked);
    assert_true(out == moved);
    assert_true(router_stat("requests_failed_over", NULL) == fo0);
    assert_true(router_stat("requests_failed", NULL) == 0);
    assert_true(e2e_wait_kv_free(src, 10.0));
    snprintf(cmd, sizeof(cmd), "set-backend %s ready", src->id);
    cJSON_Delete(e2e_admin(g_d.router.sock, cmd));
    quiet_ok();
}

/* SIGTERM (what `pdctl down` / a stopping unit does) on a decode with
 * streams: it drains, its heartbeat says so, the router moves its streams
 * live, and the daemon exits 0 long before the streams end; every stream
 * ends with the fault-free text. */
static void test_sigterm_migrates(void **st)
{
    (void)st;
    char *ref[NREQ];
    stream_t sts[NREQ];
    int n_on = 0;
    char states[1024];
    double mig0 = router_stat("requests_migrated", NULL);
    e2e_proc_t *src = migration_streams(ref, sts, &n_on, states, sizeof(states));
    double t0 = e2e_now();
    assert_int_equal(e2e_proc_signal(src, SIGTERM), 0);
    int rc = e2e_proc_wait(src, 30.0);
    double exited = e2e_now() - t0;
    fprintf(stderr, "migrate: SIGTERM %s with %d streams (%s): exit %d after %.0f ms\n", src->id,
            n_on, states, rc, exited * 1e3);
    assert_int_equal(rc, 0);
    streams_check(sts, ref, "sigterm");
    for (int i = 0; i < NREQ; i++)
        free(ref[i]);
    double moved = router_stat("requests_migrated", NULL) - mig0;
    fprintf(stderr, "migrate: %d streams done, %.0f moved live\n", NREQ, moved);
    assert_true(moved >= 1);
    assert_true(router_stat("requests_failed", NULL) == 0);
    quiet_ok();
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s ROUTER PREFILL DECODE MODEL [ROUNDS]\n", argv[0]);
        return 2;
    }
    g_router = argv[1];
    g_prefill = argv[2];
    g_decode = argv[3];
    g_model = argv[4];
    if (argc > 5)
        g_rounds = atoi(argv[5]);
    if (g_rounds < 1 || g_rounds > E2E_MAX_DAEMONS - 3) /* one decode added per round */
        g_rounds = 4;
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest t[] = { cmocka_unit_test(test_drain_migrates),
                                    cmocka_unit_test(test_sigterm_migrates),
                                    cmocka_unit_test(test_kill_decodes) };
    return cmocka_run_group_tests_name("failover", t, setup, teardown);
}
