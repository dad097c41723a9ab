/* test_routers.c - several routers (issue 18) with real processes: two
 * pd-routers, one pd-prefill and two pd-decode daemons on loopback, every
 * daemon with --router=<both control ports> (one authenticated session per
 * router).
 *
 *   both        every daemon is registered with both routers; requests
 *               through either succeed (short: decode-local; long:
 *               disaggregated, so leases and KV handles work whichever
 *               router sent the request); each router sees the daemons'
 *               load caused by the other one (heartbeats carry the
 *               daemon's whole load).
 *   kill        client threads round-robin streaming requests over the two
 *               routers; router 1 is SIGKILLed under load: every request
 *               router 0 owned (before and after the kill) ends 200 +
 *               [DONE] without an error frame; every daemon stays
 *               registered with router 0 (one registration, never lost);
 *               the daemons end the dead router's requests (ledgers
 *               balance, pools free); router 1 restarted on its control
 *               port gets every daemon back and serves again.
 *   bad lists   a daemon refuses a bad --router list at boot (exit 2).
 *
 * usage: test-routers ROUTER PREFILL DECODE MODEL */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pd_e2e.h"

static const char *g_router, *g_prefill, *g_decode, *g_model;
static e2e_deploy_t g_d;
static bool g_up;

static int setup(void **st)
{
    (void)st;
    static const char *ra[] = { "--heartbeat-interval=200ms", NULL };
    static const char *pa[] = { "--kv-blocks=512", NULL };
    static const char *da[] = { "--kv-blocks=512", NULL };
    e2e_opts_t o = {
        .router_bin = g_router, .prefill_bin = g_prefill, .decode_bin = g_decode,
        .model = g_model, .router_args = ra, .prefill_args = pa, .decode_args = da,
        .n_prefill = 1, .n_decode = 2, .n_routers = 2, .ready_timeout_s = 30,
    };
    int rc = e2e_deploy_start(&g_d, &o);
    g_up = true;
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
        fprintf(stderr, "routers: %d daemon(s) exited badly or left sanitizer reports\n", bad);
    return bad == 0 ? 0 : -1;
}

static const char *const g_prompts[] = {
    "The quick brown fox",
    "Permission is hereby granted, free of charge, to any person obtaining a copy of "
    "this software and associated documentation files, to deal in the Software without "
    "restriction, including without limitation the rights to use, copy, modify, merge, "
    "publish, distribute, sublicense, and or sell copies of the Software",
};

static void make_body(int i, int max_tokens, bool stream, char *out, size_t cap)
{
    snprintf(out, cap,
             "{\"prompt\":\"%d. %s\",\"max_tokens\":%d,\"ignore_eos\":true,"
             "\"temperature\":0.8,\"seed\":%d,\"stream\":%s}",
             i, g_prompts[i % 2], max_tokens, 100 + i, stream ? "true" : "false");
}

/* One streamed request to port: 1 = 200, [DONE], no error frame, at least
 * one content chunk; 0 = could not connect / send (router gone); -1 = any
 * other end (why written). */
static int one_stream(uint16_t port, int i, int max_tokens, char *why, size_t cap)
{
    char body[1024];
    make_body(i, max_tokens, true, body, sizeof(body));
    int fd = e2e_http_connect(port);
    if (fd < 0)
        return 0;
    if (e2e_http_send(fd, "POST", "/v1/completions", NULL, body, strlen(body)) != 0) {
        close(fd);
        return 0;
    }
    char *buf = NULL;
    size_t len = 0;
    int rc = e2e_http_read(fd, &buf, &len, NULL, 180.0);
    close(fd);
    if (rc != 1 && len == 0) {
        free(buf);
        return 0;
    }
    e2e_resp_t r;
    memset(&r, 0, sizeof(r));
    e2e_http_parse(buf ? buf : "", len, &r);
    e2e_sse_t s;
    e2e_sse_parse(r.body, &s);
    int ok = r.status == 200 && s.done && !s.error_frame && !s.bad && s.text != NULL &&
             s.text[0] != '\0';
    if (!ok)
        snprintf(why, cap, "status %d done %d error_frame %d rc %d len %zu: %.300s", r.status,
                 s.done, s.error_frame, rc, len, r.body ? r.body : (buf ? buf : ""));
    e2e_sse_free(&s);
    e2e_resp_free(&r);
    free(buf);
    return ok ? 1 : -1;
}

/* The session reply's link to router i (matched by control port). */
static const cJSON *link_of(const cJSON *sess, int i)
{
    char want[32];
    snprintf(want, sizeof(want), "127.0.0.1:%u", g_d.router_control[i]);
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(sess, "routers")) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "addr");
        if (cJSON_IsString(a) && strcmp(a->valuestring, want) == 0)
            return e;
    }
    return NULL;
}

static e2e_proc_t *daemon_at(int k)
{
    return k < g_d.n_prefill ? &g_d.prefill[k] : &g_d.decode[k - g_d.n_prefill];
}

/* Poll until every daemon's link to router i is up (or timeout). */
static bool all_linked(int i, double timeout_s)
{
    double end = e2e_now() + timeout_s;
    for (;;) {
        bool all = true;
        for (int k = 0; k < g_d.n_prefill + g_d.n_decode && all; k++) {
            cJSON *j = e2e_admin(daemon_at(k)->sock, "session");
            const cJSON *l = link_of(j, i);
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(l, "state");
            all = cJSON_IsString(s) && strcmp(s->valuestring, "up") == 0;
            cJSON_Delete(j);
        }
        if (all)
            return true;
        if (e2e_now() > end)
            return false;
        e2e_nap_ms(20);
    }
}

/* Router i's backends, all READY: how many. */
static int ready_backends(int i)
{
    cJSON *j = e2e_admin(e2e_router(&g_d, i)->sock, "backends");
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "backends")) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(e, "state");
        n += cJSON_IsString(s) && strcmp(s->valuestring, "ready") == 0;
    }
    cJSON_Delete(j);
    return n;
}

static double router_stat(int i, const char *name)
{
    return e2e_router_stat(e2e_router(&g_d, i), name);
}

/* ---- both routers serve ---------------------------------------------------- */

typedef struct {
    uint16_t port;
    int i, max_tokens;
    int rc;
    char why[512];
} bg_stream_t;

static void *bg_stream(void *arg)
{
    bg_stream_t *b = arg;
    b->rc = one_stream(b->port, b->i, b->max_tokens, b->why, sizeof(b->why));
    return NULL;
}

static void test_both(void **st)
{
    (void)st;
    for (int i = 0; i < 2; i++) {
        assert_true(all_linked(i, 10.0));
        assert_int_equal(ready_backends(i), g_d.n_prefill + g_d.n_decode);
    }
    /* every daemon: two links, both up, each registered once */
    for (int k = 0; k < g_d.n_prefill + g_d.n_decode; k++) {
        cJSON *j = e2e_admin(daemon_at(k)->sock, "session");
        assert_int_equal((int)e2e_jnum(j, "routers_up"), 2);
        assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "routers")), 2);
        cJSON_Delete(j);
    }
    /* short and long prompts through each router */
    char why[512] = "";
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 4; i++) {
            /* distinct prompts (the numbered first block): a decode holding
             * an earlier one would prefill the rest itself */
            int rc = one_stream(g_d.router_http[r], 4 * r + i, 12, why, sizeof(why));
            if (rc != 1)
                fail_msg("router %d request %d: rc %d %s", r, i, rc, why);
        }
    assert_true(router_stat(0, "requests_disaggregated") >= 2);
    assert_true(router_stat(1, "requests_disaggregated") >= 2);
    assert_true(router_stat(0, "requests_completed") >= 4);
    assert_true(router_stat(1, "requests_completed") >= 4);
    /* every daemon sends its cache's KV_EVENTS to every router: both
     * indexes hold the blocks the requests of both routers left cached */
    for (int r = 0; r < 2; r++) {
        double names = 0;
        for (int w = 0; w < 100 && (names = router_stat(r, "kv_index_names")) == 0; w++)
            usleep(20000);
        if (names == 0 || router_stat(r, "kv_events") == 0)
            fail_msg("router %d has no KV index (%.0f names, %.0f KV_EVENTS)", r, names,
                     router_stat(r, "kv_events"));
    }

    /* load sent through router 0 only shows in router 1's view of the
     * decodes: their heartbeats to every router carry their whole load */
    bg_stream_t b[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        b[i] = (bg_stream_t){ .port = g_d.router_http[0], .i = 2 * i, .max_tokens = 400 };
        assert_int_equal(pthread_create(&th[i], NULL, bg_stream, &b[i]), 0);
    }
    bool seen = false;
    double end = e2e_now() + 20.0;
    while (!seen && e2e_now() < end) {
        cJSON *j = e2e_admin(e2e_router(&g_d, 1)->sock, "backends");
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "backends")) {
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
            if (cJSON_IsString(role) && strcmp(role->valuestring, "decode") == 0 &&
                e2e_jnum(e, "running_seqs") > 0)
                seen = true;
        }
        cJSON_Delete(j);
        /* ... while router 1 itself has nothing in flight */
        if (seen && router_stat(1, "requests_inflight") != 0)
            seen = false;
        e2e_nap_ms(20);
    }
    for (int i = 0; i < 2; i++) /* both, before any check: b[] lives on this stack */
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        if (b[i].rc != 1)
            fail_msg("background stream %d: %s", i, b[i].why);
    assert_true(seen);
    char qwhy[512] = "";
    if (!e2e_quiescent(&g_d, 15.0, qwhy, sizeof(qwhy)))
        fail_msg("not quiescent: %s (logs in %s)", qwhy, g_d.dir);
}

/* ---- kill one under load ---------------------------------------------------- */

#define CLIENTS 6

static atomic_int g_next;          /* round robin over the routers */
static atomic_bool g_stop;
static atomic_bool g_killed;
static atomic_int g_ok[2], g_gone[2], g_bad[2], g_ok_after[2];
static char g_bad_why[2][512];

static void *client(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_stop)) {
        int n = atomic_fetch_add(&g_next, 1);
        int r = n % 2;
        bool after = atomic_load(&g_killed);
        char why[512] = "";
        int rc = one_stream(g_d.router_http[r], n, 24 + n % 40, why, sizeof(why));
        if (rc == 1) {
            atomic_fetch_add(&g_ok[r], 1);
            if (after)
                atomic_fetch_add(&g_ok_after[r], 1);
        } else if (rc == 0) {
            atomic_fetch_add(&g_gone[r], 1);
        } else {
            if (atomic_fetch_add(&g_bad[r], 1) == 0)
                snprintf(g_bad_why[r], sizeof(g_bad_why[r]), "%s", why);
        }
    }
    return NULL;
}

static void test_kill(void **st)
{
    (void)st;
    assert_true(all_linked(0, 10.0) && all_linked(1, 10.0));
    double reg0 = router_stat(0, "backends_registered");
    double lost0 = router_stat(0, "backends_lost");
    pthread_t th[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, client, NULL), 0);
    /* let streams be in flight on both, then kill router 1 */
    double end = e2e_now() + 20.0;
    while ((atomic_load(&g_ok[0]) < 6 || atomic_load(&g_ok[1]) < 6) && e2e_now() < end)
        e2e_nap_ms(10);
    assert_true(atomic_load(&g_ok[1]) >= 6);
    double inflight1 = router_stat(1, "requests_inflight");
    e2e_proc_signal(e2e_router(&g_d, 1), SIGKILL);
    atomic_store(&g_killed, true);
    e2e_proc_wait(e2e_router(&g_d, 1), 5.0);
    /* keep the load on for a while: router 0 alone */
    end = e2e_now() + 20.0;
    while (atomic_load(&g_ok_after[0]) < 12 && e2e_now() < end)
        e2e_nap_ms(10);
    atomic_store(&g_stop, true);
    for (int i = 0; i < CLIENTS; i++)
        pthread_join(th[i], NULL);
    fprintf(stderr, "routers: router 0: %d ok (%d after the kill), %d bad; router 1: %d ok, "
            "%d unreachable, %d cut (%.0f in flight at the kill)\n",
            atomic_load(&g_ok[0]), atomic_load(&g_ok_after[0]), atomic_load(&g_bad[0]),
            atomic_load(&g_ok[1]), atomic_load(&g_gone[1]), atomic_load(&g_bad[1]), inflight1);
    if (atomic_load(&g_bad[0]) != 0 || atomic_load(&g_gone[0]) != 0)
        fail_msg("router 0 lost %d requests (%d unreachable): %s", atomic_load(&g_bad[0]),
                 atomic_load(&g_gone[0]), g_bad_why[0]);
    assert_true(atomic_load(&g_ok_after[0]) >= 12);
    assert_int_equal((int)router_stat(0, "requests_failed"), 0);
    /* every daemon is still registered with router 0: never lost, never
     * registered again; router 0 still has all of them READY */
    for (int k = 0; k < g_d.n_prefill + g_d.n_decode; k++) {
        cJSON *j = e2e_admin(daemon_at(k)->sock, "session");
        const cJSON *l0 = link_of(j, 0);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(l0, "state");
        assert_true(cJSON_IsString(s) && strcmp(s->valuestring, "up") == 0);
        assert_int_equal((int)e2e_jnum(l0, "registrations"), 1);
        const cJSON *l1 = link_of(j, 1);
        s = cJSON_GetObjectItemCaseSensitive(l1, "state");
        assert_true(cJSON_IsString(s) && strcmp(s->valuestring, "up") != 0);
        assert_int_equal((int)e2e_jnum(j, "routers_up"), 1);
        cJSON_Delete(j);
    }
    assert_int_equal(ready_backends(0), g_d.n_prefill + g_d.n_decode);
    assert_true(router_stat(0, "backends_registered") == reg0);
    assert_true(router_stat(0, "backends_lost") == lost0);
    /* the daemons ended what the dead router owned: nothing live, pools
     * free, ledgers balanced (router 1 is skipped: killed on purpose) */
    char why[512] = "";
    if (!e2e_quiescent(&g_d, 15.0, why, sizeof(why)))
        fail_msg("not quiescent: %s (logs in %s)", why, g_d.dir);

    /* router 1 back on its control port: every daemon finds it, it serves */
    assert_int_equal(e2e_restart_router_i(&g_d, 1), 0);
    assert_true(all_linked(1, 15.0));
    end = e2e_now() + 10.0;
    while (ready_backends(1) < g_d.n_prefill + g_d.n_decode && e2e_now() < end)
        e2e_nap_ms(20);
    assert_int_equal(ready_backends(1), g_d.n_prefill + g_d.n_decode);
    for (int i = 0; i < 4; i++) {
        int rc = one_stream(g_d.router_http[1], i, 12, why, sizeof(why));
        if (rc != 1)
            fail_msg("restarted router request %d: rc %d %s", i, rc, why);
    }
    if (!e2e_quiescent(&g_d, 15.0, why, sizeof(why)))
        fail_msg("not quiescent after the restart: %s (logs in %s)", why, g_d.dir);
}

/* ---- the router list is checked at boot ------------------------------------ */

static int boot_status(const char *routers)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "'%s' --model='%s' --insecure-no-auth --router='%s' "
             ">/dev/null 2>&1 </dev/null", g_decode, g_model, routers);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_bad_lists(void **st)
{
    (void)st;
    assert_int_equal(boot_status("127.0.0.1:1,,127.0.0.1:2"), 2);      /* empty entry */
    assert_int_equal(boot_status("127.0.0.1:1,"), 2);
    assert_int_equal(boot_status("127.0.0.1:1, 127.0.0.1:1"), 2);      /* duplicate */
    assert_int_equal(boot_status("127.0.0.1:1,example.com:2"), 2);     /* not numeric */
    assert_int_equal(boot_status("127.0.0.1:1,10.0.0.1:2"), 2);        /* insecure, not loopback */
    char many[1024] = "";
    for (int i = 0; i < 17; i++) /* one over NODE_ROUTERS_MAX */
        snprintf(many + strlen(many), sizeof(many) - strlen(many), "%s127.0.0.1:%d",
                 i ? "," : "", 1000 + i);
    assert_int_equal(boot_status(many), 2);
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s ROUTER PREFILL DECODE MODEL\n", argv[0]);
        return 2;
    }
    g_router = argv[1];
    g_prefill = argv[2];
    g_decode = argv[3];
    g_model = argv[4];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_both),
        cmocka_unit_test(test_kill),
        cmocka_unit_test(test_bad_lists),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
