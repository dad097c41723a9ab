/* test_etcd.c - membership in etcd (issue 18) with real processes: etcd on
 * loopback (Debian's etcd-server), two pd-routers registering routers/<id>,
 * one pd-prefill and one pd-decode with --etcd and no --router (they find
 * the routers in etcd) and --reconnect-min=5s (so a reconnect that waits
 * out its backoff is told apart from one etcd triggered).
 *
 *   found     every daemon has a session with both routers (source etcd);
 *             each router serves; the daemons' and routers' keys are there.
 *   forged    (issue #28 finding 3) 16 unsigned keys routers/aa-fake-NN
 *             pointing at 16 trap listeners, a bad signature, router 0's
 *             signed value copied under another key, a key of a bad shape:
 *             a daemon started now registers with both real routers (the
 *             forged keys sort first: they filled every slot before), the
 *             daemons count them (admin session etcd.ignored), and nothing
 *             ever connects to the trap. They stay for the next two tests.
 *   restart   router 1 SIGKILLed and started again on its control port:
 *             every daemon is back with it well before its 5 s backoff
 *             (its key was put again: the daemons reconnect at once).
 *   etcd-down etcd SIGKILLed: both routers keep serving, no daemon loses
 *             or re-registers a session, the daemons report etcd
 *             unreachable; etcd started again on the same data dir: every
 *             member is registered again. Then router 1 dies for good: once
 *             its lease runs out the daemons drop it.
 *
 * usage: test-etcd ROUTER PREFILL DECODE MODEL (exit 77 without etcd). */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pd_e2e.h"
#include "pd_etcd.h"

static const char *g_router, *g_prefill, *g_decode, *g_model;
static e2e_deploy_t g_d;
static bool g_up;
static char g_etcd_bin[256], g_etcd_dir[128], g_etcd_arg[64];
static uint16_t g_etcd_port, g_peer_port;
static pid_t g_etcd_pid;

#define PREFIX "/pdserve/e2e/"

static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    close(fd);
    return ntohs(sa.sin_port);
}

/* POST a JSON body to etcd's gateway: the parsed reply or NULL. */
static cJSON *etcd_call(const char *path, const char *body)
{
    e2e_resp_t r;
    e2e_http(g_etcd_port, "POST", path, "Content-Type: application/json\r\n", body, 2.0, &r);
    cJSON *j = r.status == 200 && r.body != NULL ? cJSON_Parse(r.body) : NULL;
    e2e_resp_free(&r);
    return j;
}

/* Keys under PREFIX (range over "/pdserve/e2e/" .. "/pdserve/e2e0"). */
static int etcd_count(void)
{
    /* base64("/pdserve/e2e/") and base64("/pdserve/e2e0") */
    cJSON *j = etcd_call("/v3/kv/range",
                         "{\"key\":\"L3Bkc2VydmUvZTJlLw==\",\"range_end\":\"L3Bkc2VydmUvZTJlMA==\","
                         "\"count_only\":true}");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "count");
    int n = cJSON_IsString(c) ? atoi(c->valuestring) : cJSON_IsNumber(c) ? c->valueint : j ? 0 : -1;
    cJSON_Delete(j);
    return n;
}

static int etcd_start(void)
{
    char client[64], peer[64], init[96];
    snprintf(client, sizeof(client), "http://127.0.0.1:%u", g_etcd_port);
    snprintf(peer, sizeof(peer), "http://127.0.0.1:%u", g_peer_port);
    snprintf(init, sizeof(init), "e2e=%s", peer);
    char log[200];
    snprintf(log, sizeof(log), "%s/etcd.log", g_etcd_dir);
    char data[200];
    snprintf(data, sizeof(data), "%s/data", g_etcd_dir);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(126);
        FILE *f = freopen(log, "a", stdout);
        (void)f;
        dup2(1, 2);
        execl(g_etcd_bin, g_etcd_bin, "--name", "e2e", "--data-dir", data,
              "--listen-client-urls", client, "--advertise-client-urls", client,
              "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
              "--initial-cluster", init, (char *)NULL);
        _exit(127);
    }
    g_etcd_pid = pid;
    double end = e2e_now() + 20.0;
    while (e2e_now() < end) {
        if (etcd_count() >= 0)
            return 0;
        e2e_nap_ms(50);
    }
    fprintf(stderr, "etcd did not answer within 20 s (log %s)\n", log);
    return -1;
}

static void etcd_kill(void)
{
    if (g_etcd_pid > 0) {
        kill(g_etcd_pid, SIGKILL);
        waitpid(g_etcd_pid, NULL, 0);
        g_etcd_pid = 0;
    }
}

static int setup(void **st)
{
    (void)st;
    snprintf(g_etcd_dir, sizeof(g_etcd_dir), "/tmp/pd-etcd-XXXXXX");
    g_etcd_port = free_port();
    g_peer_port = free_port();
    if (mkdtemp(g_etcd_dir) == NULL || g_etcd_port == 0 || g_peer_port == 0 || etcd_start() != 0)
        return -1;
    snprintf(g_etcd_arg, sizeof(g_etcd_arg), "--etcd=127.0.0.1:%u", g_etcd_port);
    static const char *ra[] = { "--heartbeat-interval=200ms", NULL, "--etcd.prefix=" PREFIX,
                                "--etcd.ttl=2s", NULL };
    static const char *na[] = { "--kv-blocks=256", NULL, "--etcd.prefix=" PREFIX,
                                "--etcd.ttl=2s", "--reconnect-min=5s", NULL };
    ra[1] = g_etcd_arg;
    na[1] = g_etcd_arg;
    e2e_opts_t o = {
        .router_bin = g_router, .prefill_bin = g_prefill, .decode_bin = g_decode,
        .model = g_model, .router_args = ra, .prefill_args = na, .decode_args = na,
        .n_prefill = 1, .n_decode = 1, .n_routers = 2, .no_router_arg = true,
        .ready_timeout_s = 30,
    };
    int rc = e2e_deploy_start(&g_d, &o);
    g_up = true;
    return rc;
}

static int teardown(void **st)
{
    (void)st;
    int bad = 0;
    if (g_up) {
        g_up = false;
        bad = e2e_deploy_stop(&g_d, false);
    }
    etcd_kill();
    if (getenv("E2E_KEEP") == NULL && bad == 0) {
        char cmd[200];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_etcd_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", g_etcd_dir);
    }
    return bad == 0 ? 0 : -1;
}

static e2e_proc_t *daemon_at(int k)
{
    return k == 0 ? &g_d.prefill[0] : &g_d.decode[0];
}

/* Sessions up at every daemon == want, each from etcd; registrations of
 * the link to router i summed over the daemons (-1 if absent). */
static bool sessions_up(int want, double timeout_s)
{
    double end = e2e_now() + timeout_s;
    for (;;) {
        bool all = true;
        for (int k = 0; k < 2 && all; k++) {
            cJSON *j = e2e_admin(daemon_at(k)->sock, "session");
            all = (int)e2e_jnum(j, "routers_up") == want;
            cJSON_Delete(j);
        }
        if (all)
            return true;
        if (e2e_now() > end)
            return false;
        e2e_nap_ms(10);
    }
}

static double registrations(int i)
{
    char want[32];
    snprintf(want, sizeof(want), "127.0.0.1:%u", g_d.router_control[i]);
    double sum = 0;
    for (int k = 0; k < 2; k++) {
        cJSON *j = e2e_admin(daemon_at(k)->sock, "session");
        const cJSON *e;
        bool found = false;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "routers")) {
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "addr");
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(e, "source");
            if (cJSON_IsString(a) && strcmp(a->valuestring, want) == 0 && cJSON_IsString(s) &&
                strcmp(s->valuestring, "etcd") == 0) {
                sum += e2e_jnum(e, "registrations");
                found = true;
            }
        }
        cJSON_Delete(j);
        if (!found)
            return -1;
    }
    return sum;
}

static bool etcd_connected_all(bool want, double timeout_s)
{
    double end = e2e_now() + timeout_s;
    for (;;) {
        bool all = true;
        for (int k = 0; k < 2 && all; k++) {
            cJSON *j = e2e_admin(daemon_at(k)->sock, "session");
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(j, "etcd"), "connected");
            all = cJSON_IsBool(c) && (cJSON_IsTrue(c) == want);
            cJSON_Delete(j);
        }
        if (all)
            return true;
        if (e2e_now() > end)
            return false;
        e2e_nap_ms(20);
    }
}

static void request_ok(int r, const char *what)
{
    e2e_resp_t resp;
    e2e_http(g_d.router_http[r], "POST", "/v1/completions", NULL,
             "{\"prompt\":\"Permission is hereby granted, free of charge, to any person "
             "obtaining a copy of this software and associated documentation files\","
             "\"max_tokens\":8,\"temperature\":0}", 30.0, &resp);
    if (resp.status != 200 || resp.body == NULL || strstr(resp.body, "\"finish_reason\"") == NULL)
        fail_msg("%s: router %d: HTTP %d %.300s", what, r, resp.status,
                 resp.body ? resp.body : "");
    e2e_resp_free(&resp);
}

static void test_found(void **st)
{
    (void)st;
    assert_true(sessions_up(2, 10.0));
    assert_int_equal((int)registrations(0), 2);
    assert_int_equal((int)registrations(1), 2);
    for (int r = 0; r < 2; r++)
        request_ok(r, "found");
    assert_int_equal(etcd_count(), 4); /* routers/router, routers/router-1, daemons/... */
    cJSON *j = e2e_admin(e2e_router(&g_d, 1)->sock, "membership");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "etcd");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "connected")));
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "key")),
                        PREFIX "routers/router-1");
    cJSON_Delete(j);
}

/* Put prefix + key = value (raw strings). */
static bool etcd_put(const char *key, const char *value)
{
    char full[256], kb[400], vb[400], body[900];
    snprintf(full, sizeof(full), PREFIX "%s", key);
    pd_b64_encode(full, strlen(full), kb);
    pd_b64_encode(value, strlen(value), vb);
    snprintf(body, sizeof(body), "{\"key\":\"%s\",\"value\":\"%s\"}", kb, vb);
    cJSON *j = etcd_call("/v3/kv/put", body);
    bool ok = j != NULL;
    cJSON_Delete(j);
    return ok;
}

/* The value of prefix + key, or "" (out: cap bytes). */
static void etcd_get(const char *key, char *out, size_t cap)
{
    char full[256], kb[400], body[500];
    snprintf(full, sizeof(full), PREFIX "%s", key);
    pd_b64_encode(full, strlen(full), kb);
    snprintf(body, sizeof(body), "{\"key\":\"%s\"}", kb);
    cJSON *j = etcd_call("/v3/kv/range", body);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "kvs"), 0), "value");
    long n = cJSON_IsString(v) ? pd_b64_decode(v->valuestring, strlen(v->valuestring), out,
                                               cap - 1) : -1;
    out[n > 0 ? n : 0] = '\0';
    cJSON_Delete(j);
}

/* A live member whose key is deleted (etcdctl del, a cleanup script)
 * puts it back within a keepalive round (ttl/3): it never wrote it again
 * before, so a daemon started later saw one router of two. */
static void test_key_deleted(void **st)
{
    (void)st;
    char full[256], kb[400], body[500], v[256];
    snprintf(full, sizeof(full), PREFIX "routers/router-1");
    pd_b64_encode(full, strlen(full), kb);
    snprintf(body, sizeof(body), "{\"key\":\"%s\"}", kb);
    cJSON *j = etcd_call("/v3/kv/deleterange", body);
    assert_non_null(j);
    cJSON_Delete(j);
    etcd_get("routers/router-1", v, sizeof(v));
    assert_string_equal(v, "");
    double t0 = e2e_now();
    do {
        e2e_nap_ms(50);
        etcd_get("routers/router-1", v, sizeof(v));
    } while (v[0] == '\0' && e2e_now() - t0 < 10.0);
    if (v[0] == '\0')
        fail_msg("router-1's key not put back within 10 s (ttl 2 s)");
    assert_int_equal(etcd_count(), 4);
}

#define N_FORGED 16
static int g_trap[N_FORGED];
static char g_trap_addr[N_FORGED][32];

/* Nothing connected to any trap listener (their backlogs are empty). */
static bool trap_untouched(void)
{
    bool untouched = true;
    for (int i = 0; i < N_FORGED; i++) {
        int c = accept(g_trap[i], NULL, NULL);
        if (c >= 0) {
            fprintf(stderr, "etcd forged: a connection to %s\n", g_trap_addr[i]);
            close(c);
            untouched = false;
        }
    }
    return untouched;
}

static void test_forged(void **st)
{
    (void)st;
    /* 16 listeners nobody should dial: one per forged key (the 16
     * distinct addresses filled all NODE_ROUTERS_MAX slots) */
    char key[64], val[PD_MEMBER_VAL_MAX], real[PD_MEMBER_VAL_MAX];
    for (int i = 0; i < N_FORGED; i++) {
        struct sockaddr_in sa = { .sin_family = AF_INET,
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t sl = sizeof(sa);
        g_trap[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        assert_true(g_trap[i] >= 0);
        assert_int_equal(bind(g_trap[i], (struct sockaddr *)&sa, sizeof(sa)), 0);
        assert_int_equal(listen(g_trap[i], 64), 0);
        assert_int_equal(getsockname(g_trap[i], (struct sockaddr *)&sa, &sl), 0);
        snprintf(g_trap_addr[i], sizeof(g_trap_addr[i]), "127.0.0.1:%u", ntohs(sa.sin_port));
        snprintf(key, sizeof(key), "routers/aa-fake-%02d", i); /* sorts before "router" */
        assert_true(etcd_put(key, g_trap_addr[i]));
    }
    snprintf(val, sizeof(val), "%s s1:AAAAAAAAAAAAAAAAAAAAAA==", g_trap_addr[0]);
    assert_true(etcd_put("routers/aa-badsig", val));
    etcd_get("routers/router", real, sizeof(real));
    assert_true(etcd_put("routers/zz-copy", real));      /* replayed under another key */
    assert_true(etcd_put("routers/a/b", g_trap_addr[1])); /* not a router id */

    /* a daemon that starts now: both real routers, nothing else */
    static const char *la[] = { "--kv-blocks=64", NULL, "--etcd.prefix=" PREFIX,
                                "--etcd.ttl=2s", NULL };
    la[1] = g_etcd_arg;
    double keep = g_d.o.ready_timeout_s;
    g_d.o.ready_timeout_s = 15;
    e2e_proc_t *late = e2e_add_daemon(&g_d, E2E_DECODE, "decode-late", la);
    g_d.o.ready_timeout_s = keep;
    assert_non_null(late);
    double end = e2e_now() + 10.0;
    int up = 0, links = -1;
    while (e2e_now() < end) {
        cJSON *j = e2e_admin(late->sock, "session");
        up = (int)e2e_jnum(j, "routers_up");
        links = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "routers"));
        cJSON_Delete(j);
        if (up == 2)
            break;
        e2e_nap_ms(20);
    }
    assert_int_equal(up, 2);
    assert_int_equal(links, 2);
    /* the daemons there before: still both routers, the forged ones counted */
    assert_true(sessions_up(2, 5.0));
    for (int k = 0; k < 3; k++) {
        e2e_proc_t *p = k < 2 ? daemon_at(k) : late;
        /* a daemon that was there before sees the puts through its watch,
         * which may still be catching up on a loaded machine */
        double forged = -1, bad_key = -1, until = e2e_now() + 10.0;
        do {
            if (forged >= 0)
                e2e_nap_ms(50);
            cJSON *j = e2e_admin(p->sock, "session");
            forged = e2e_jnum(j, "etcd.ignored.forged");
            bad_key = e2e_jnum(j, "etcd.ignored.bad_key");
            cJSON_Delete(j);
        } while ((forged < N_FORGED + 2 || bad_key < 1) && e2e_now() < until);
        fprintf(stderr, "etcd forged: %s counted forged %.0f, bad_key %.0f\n", p->id, forged,
                bad_key);
        assert_true(forged == N_FORGED + 2);
        assert_true(bad_key == 1);
    }
    request_ok(0, "forged keys present");
    assert_true(trap_untouched());
    assert_non_null(strstr(real, " s1:"));               /* the real one is signed */
    e2e_proc_signal(late, SIGTERM);
    assert_int_equal(e2e_proc_wait(late, 10.0), 0);
}

/* Remove what test_forged put (the counts below are the real members'). */
static void forged_remove(void)
{
    char b0[64], b1[64], body[200];
    pd_b64_encode(PREFIX "routers/a", strlen(PREFIX "routers/a"), b0);
    pd_b64_encode(PREFIX "routers/ab", strlen(PREFIX "routers/ab"), b1);
    snprintf(body, sizeof(body), "{\"key\":\"%s\",\"range_end\":\"%s\"}", b0, b1);
    cJSON_Delete(etcd_call("/v3/kv/deleterange", body));
    pd_b64_encode(PREFIX "routers/zz-copy", strlen(PREFIX "routers/zz-copy"), b0);
    snprintf(body, sizeof(body), "{\"key\":\"%s\"}", b0);
    cJSON_Delete(etcd_call("/v3/kv/deleterange", body));
    for (int i = 0; i < N_FORGED; i++)
        close(g_trap[i]);
}

static void test_restart(void **st)
{
    (void)st;
    e2e_proc_signal(e2e_router(&g_d, 1), SIGKILL);
    e2e_proc_wait(e2e_router(&g_d, 1), 5.0);
    assert_true(sessions_up(1, 5.0));   /* both noticed: backoff of 5 s starts */
    e2e_nap_ms(300);
    double t0 = e2e_now();
    assert_int_equal(e2e_restart_router_i(&g_d, 1), 0);
    assert_true(sessions_up(2, 10.0));
    double took = e2e_now() - t0;
    fprintf(stderr, "etcd: restarted router found by every daemon %.0f ms after its start\n",
            took * 1e3);
    if (took > 2.5)
        fail_msg("re-registration took %.1f s: the daemons waited out their backoff", took);
    assert_int_equal((int)registrations(1), 4);
    assert_int_equal((int)registrations(0), 2); /* router 0 never lost */
    request_ok(1, "restarted router");
    assert_true(trap_untouched());   /* the forged keys are still there */
    forged_remove();
}

static void test_etcd_down(void **st)
{
    (void)st;
    double reg0 = registrations(0), reg1 = registrations(1);
    etcd_kill();
    assert_true(etcd_connected_all(false, 10.0));
    /* longer than the 2 s TTLs: sessions do not depend on etcd */
    double end = e2e_now() + 3.0;
    int n = 0;
    while (e2e_now() < end) {
        request_ok(n % 2, "etcd down");
        n++;
    }
    assert_true(sessions_up(2, 0.1));
    assert_true(registrations(0) == reg0 && registrations(1) == reg1);
    /* etcd back: every member registers again */
    assert_int_equal(etcd_start(), 0);
    assert_true(etcd_connected_all(true, 15.0));
    end = e2e_now() + 10.0;
    while (etcd_count() != 4 && e2e_now() < end)
        e2e_nap_ms(50);
    assert_int_equal(etcd_count(), 4);
    assert_true(registrations(0) == reg0 && registrations(1) == reg1);
    /* router 1 gone for good: its lease runs out, the daemons drop it */
    e2e_proc_signal(e2e_router(&g_d, 1), SIGKILL);
    e2e_proc_wait(e2e_router(&g_d, 1), 5.0);
    end = e2e_now() + 15.0;
    while (registrations(1) != -1 && e2e_now() < end)
        e2e_nap_ms(50);
    assert_true(registrations(1) == -1);
    assert_int_equal(etcd_count(), 3);
    request_ok(0, "after router 1 left");
    char why[512] = "";
    if (!e2e_quiescent(&g_d, 15.0, why, sizeof(why)))
        fail_msg("not quiescent: %s (logs in %s)", why, g_d.dir);
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
    const char *cands[] = { getenv("ETCD_BIN"), "/usr/bin/etcd", "/usr/local/bin/etcd", NULL };
    for (int i = 0; i < 3 && g_etcd_bin[0] == '\0'; i++)
        if (cands[i] != NULL && access(cands[i], X_OK) == 0)
            snprintf(g_etcd_bin, sizeof(g_etcd_bin), "%s", cands[i]);
    if (g_etcd_bin[0] == '\0') {
        fprintf(stderr, "SKIP: no etcd binary (install Debian's etcd-server: "
                "deploy/install-deps.sh)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_found),
        cmocka_unit_test(test_key_deleted),
        cmocka_unit_test(test_forged),
        cmocka_unit_test(test_restart),
        cmocka_unit_test(test_etcd_down),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
