/* test_security.c - what an attacker on the control network or a hostile
 * HTTP client can do, tried against real pd-router / pd-prefill / pd-decode
 * processes (issue 12). Each group is one deployment:
 *   replay   - a real daemon's HELLO (and the frames after it) recorded by a
 *              relay on the wire and replayed to the real router: refused;
 *              unauthenticated connections are bounded in number, size and
 *              time;
 *   cache    - prefix-cache isolation: another API key or cache_salt never
 *              sees cached_tokens of a prompt it did not send (issue 28);
 *   lockout  - SIGSTOP a prefill until the router drops it, SIGCONT: it
 *              registers again with the same incarnation and disaggregated
 *              requests are pulled from it again (not decode-local).
 * Usage: test-security GROUP ROUTER PREFILL DECODE MODEL */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <dirent.h>
#include <sys/stat.h>

#include "pd_e2e.h"
#include "proto_auth.h"
#include "proto_msg.h"

static const char *g_router, *g_prefill, *g_decode, *g_model;
static e2e_deploy_t g_d;
static bool g_up;
static int g_teardown_failures;

static int stop_deploy(void)
{
    if (!g_up)
        return 0;
    g_up = false;
    int bad = e2e_deploy_stop(&g_d, false);
    if (bad != 0) {
        fprintf(stderr, "security: %d daemon(s) exited badly\n", bad);
        g_teardown_failures++;
    }
    return bad == 0 ? 0 : -1;
}

static int start_deploy(const char *const *rargs, const char *const *pargs,
                        const char *const *dargs, int np, int nd)
{
    e2e_opts_t o = {
        .router_bin = g_router, .prefill_bin = g_prefill, .decode_bin = g_decode,
        .model = g_model, .router_args = rargs, .prefill_args = pargs, .decode_args = dargs,
        .n_prefill = np, .n_decode = nd, .ready_timeout_s = 30,
    };
    g_up = true;
    if (e2e_deploy_start(&g_d, &o) != 0) {
        stop_deploy();
        return -1;
    }
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    return stop_deploy();
}

static double router_stat(const char *name)
{
    return e2e_router_stat(&g_d.router, name);
}

/* State of backend `id` in the router's `backends` ("" if absent). */
static void backend_state(const char *id, char *out, size_t cap)
{
    out[0] = '\0';
    cJSON *j = e2e_admin(g_d.router.sock, "backends");
    const cJSON *b;
    cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(j, "backends")) {
        const cJSON *bid = cJSON_GetObjectItemCaseSensitive(b, "id");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(b, "state");
        if (cJSON_IsString(bid) && strcmp(bid->valuestring, id) == 0 && cJSON_IsString(s))
            snprintf(out, cap, "%s", s->valuestring);
    }
    cJSON_Delete(j);
}

static bool wait_backend_state(const char *id, const char *want, double timeout_s)
{
    char s[32];
    double end = e2e_now() + timeout_s;
    for (;;) {
        backend_state(id, s, sizeof(s));
        if (strcmp(s, want) == 0)
            return true;
        if (e2e_now() > end)
            return false;
        e2e_nap_ms(20);
    }
}

static int tcp_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Read exactly n bytes within timeout_s: n, 0 on EOF first, -1 timeout/error. */
static ssize_t read_n(int fd, uint8_t *buf, size_t n, double timeout_s)
{
    size_t got = 0;
    double end = e2e_now() + timeout_s;
    while (got < n) {
        int ms = (int)((end - e2e_now()) * 1000);
        if (ms <= 0)
            return -1;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, ms) <= 0)
            continue;
        ssize_t r = read(fd, buf + got, n - got);
        if (r == 0)
            return 0;
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return errno == ECONNRESET ? 0 : -1;
        }
        got += (size_t)r;
    }
    return (ssize_t)n;
}

/* Read one whole frame (header + body; + tag if flagged). Returns its type,
 * 0 on EOF, -1 on timeout. */
static int read_frame(int fd, uint8_t *buf, size_t cap, size_t *len_p, double timeout_s)
{
    ssize_t r = read_n(fd, buf, PROTO_HDR_LEN, timeout_s);
    if (r <= 0)
        return (int)r;
    proto_hdr_t h;
    if (proto_hdr_decode(buf, PROTO_HDR_LEN, &h) != PD_OK)
        return -1;
    size_t len = PROTO_HDR_LEN + h.body_len +
                 ((h.flags & PROTO_FLAG_AUTH) ? PROTO_AUTH_TAG_LEN : 0);
    if (len > cap)
        return -1;
    r = read_n(fd, buf + PROTO_HDR_LEN, len - PROTO_HDR_LEN, timeout_s);
    if (r < 0 || (r == 0 && len > PROTO_HDR_LEN))
        return r < 0 ? -1 : 0;
    *len_p = len;
    return h.type;
}

/* Wait for EOF (or reset) on fd: true if it came within timeout_s. */
static bool eof_within(int fd, double timeout_s)
{
    uint8_t b[4096];
    double end = e2e_now() + timeout_s;
    for (;;) {
        int ms = (int)((end - e2e_now()) * 1000);
        if (ms <= 0)
            return false;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, ms) <= 0)
            continue;
        ssize_t r = read(fd, b, sizeof(b));
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            return true;
    }
}

static int run_capture(const char *const *argv, char *out, size_t cap, double timeout_s);

/* ---- a relay that records what a daemon sends to the router ------------ */

typedef struct {
    int lfd;                 /* listening */
    uint16_t port;
    uint16_t router_port;
    volatile bool stop;
    pthread_mutex_t mu;
    uint8_t rec[256 * 1024]; /* daemon -> router bytes */
    size_t rec_len;
    pthread_t th;
} relay_t;

static void *relay_main(void *arg)
{
    relay_t *r = arg;
    struct pollfd lp = { .fd = r->lfd, .events = POLLIN };
    while (!r->stop && poll(&lp, 1, 50) <= 0) {
    }
    if (r->stop)
        return NULL;
    int d = accept(r->lfd, NULL, NULL);
    int u = tcp_connect(r->router_port);
    if (d < 0 || u < 0)
        goto out;
    uint8_t buf[65536];
    while (!r->stop) {
        struct pollfd p[2] = { { .fd = d, .events = POLLIN }, { .fd = u, .events = POLLIN } };
        if (poll(p, 2, 50) <= 0)
            continue;
        for (int i = 0; i < 2; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t n = read(p[i].fd, buf, sizeof(buf));
            if (n <= 0)
                goto out;
            if (i == 0) {
                pthread_mutex_lock(&r->mu);
                size_t room = sizeof(r->rec) - r->rec_len;
                size_t k = (size_t)n < room ? (size_t)n : room;
                memcpy(r->rec + r->rec_len, buf, k);
                r->rec_len += k;
                pthread_mutex_unlock(&r->mu);
            }
            if (write(p[1 - i].fd, buf, (size_t)n) != n)
                goto out;
        }
    }
out:
    if (d >= 0)
        close(d);
    if (u >= 0)
        close(u);
    return NULL;
}

static void relay_start(relay_t *r, uint16_t router_port)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    r->router_port = router_port;
    r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(r->lfd >= 0);
    struct sockaddr_in a = { .sin_family = AF_INET };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(r->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(r->lfd, 4), 0);
    socklen_t al = sizeof(a);
    assert_int_equal(getsockname(r->lfd, (struct sockaddr *)&a, &al), 0);
    r->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&r->th, NULL, relay_main, r), 0);
}

static void relay_stop(relay_t *r)
{
    r->stop = true;
    pthread_join(r->th, NULL);
    close(r->lfd);
    pthread_mutex_destroy(&r->mu);
}

/* ---- replay group --------------------------------------------------------- */

static int replay_setup(void **st)
{
    (void)st;
    return start_deploy(NULL, NULL, NULL, 0, 1);
}

/* Finding 1 (critical): a HELLO recorded on the wire from a real prefill,
 * replayed to the real router after that prefill is gone, must not
 * register anyone; nor may the recorded session frames that followed it. */
static void test_hello_replay(void **st)
{
    (void)st;
    relay_t rl;
    relay_start(&rl, g_d.control_port);
    char rarg[64];
    snprintf(rarg, sizeof(rarg), "--router=127.0.0.1:%u", rl.port);
    const char *extra[] = { rarg, NULL };
    e2e_proc_t *pf = e2e_add_daemon(&g_d, E2E_PREFILL, "pf-replay", extra);
    assert_non_null(pf);
    assert_true(wait_backend_state("pf-replay", "ready", 20));
    e2e_nap_ms(1200); /* a few heartbeats recorded after the HELLO */
    e2e_proc_signal(pf, SIGKILL);
    e2e_proc_wait(pf, 10);
    pf->stopped = true;
    relay_stop(&rl);
    assert_true(wait_backend_state("pf-replay", "down", 20));

    /* the recording: HELLO first (untagged), then tagged session frames */
    proto_hdr_t h;
    assert_true(rl.rec_len > PROTO_HDR_LEN);
    assert_int_equal(proto_hdr_decode(rl.rec, rl.rec_len, &h), PD_OK);
    assert_int_equal(h.type, PROTO_MSG_HELLO);
    size_t hello_len = PROTO_HDR_LEN + h.body_len;
    assert_true(rl.rec_len > hello_len + PROTO_HDR_LEN);
    proto_hdr_t h2;
    assert_int_equal(proto_hdr_decode(rl.rec + hello_len, rl.rec_len - hello_len, &h2), PD_OK);
    assert_true((h2.flags & PROTO_FLAG_AUTH) != 0);
    double rej0 = router_stat("backends_rejected");

    /* replay 1: the HELLO alone; replay 2: the whole recorded stream */
    for (int k = 0; k < 2; k++) {
        int fd = tcp_connect(g_d.control_port);
        assert_true(fd >= 0);
        uint8_t buf[16384];
        size_t len = 0;
        assert_int_equal(read_frame(fd, buf, sizeof(buf), &len, 5), PROTO_MSG_CHALLENGE);
        size_t n = k == 0 ? hello_len : rl.rec_len;
        assert_int_equal(write(fd, rl.rec, n), (ssize_t)n);
        int t = read_frame(fd, buf, sizeof(buf), &len, 5);
        if (t != PROTO_MSG_REGISTER_REJECT)
            fail_msg("replayed HELLO answered with type %d, not REGISTER_REJECT", t);
        proto_msg_t m;
        assert_int_equal(proto_msg_decode(buf, len, &m), PD_OK);
        assert_int_equal(m.u.register_reject.status, PD_ERR_AUTH);
        assert_true(eof_within(fd, 5));
        close(fd);
        char s[32];
        backend_state("pf-replay", s, sizeof(s));
        assert_string_equal(s, "down");
    }
    assert_true(router_stat("backends_rejected") >= rej0 + 2);

    /* the recorded session frames without a HELLO: closed, nothing
     * delivered (the router wants a HELLO first) */
    int fd = tcp_connect(g_d.control_port);
    assert_true(fd >= 0);
    uint8_t buf[4096];
    size_t len;
    assert_int_equal(read_frame(fd, buf, sizeof(buf), &len, 5), PROTO_MSG_CHALLENGE);
    size_t n = rl.rec_len - hello_len;
    assert_int_equal(write(fd, rl.rec + hello_len, n), (ssize_t)n);
    assert_true(eof_within(fd, 5));
    close(fd);

    /* the real daemon still registers (with a fresh challenge) */
    e2e_proc_t *again = e2e_add_daemon(&g_d, E2E_PREFILL, "pf-replay-2", NULL);
    assert_non_null(again);
    assert_true(wait_backend_state("pf-replay-2", "ready", 20));
}

/* Finding 6: before registering, a peer may open only a bounded number of
 * connections, send only a HELLO-sized frame, and must finish within the
 * handshake deadline even if it trickles bytes. */
static void test_preauth_bounds(void **st)
{
    (void)st;
    double drop0 = router_stat("ctl_unauth_dropped");
    /* 1. an 8 MiB DECODE_REQ header before HELLO: closed on the header */
    int fd = tcp_connect(g_d.control_port);
    assert_true(fd >= 0);
    uint8_t buf[4096];
    size_t len;
    assert_int_equal(read_frame(fd, buf, sizeof(buf), &len, 5), PROTO_MSG_CHALLENGE);
    proto_hdr_t h = { .type = PROTO_MSG_DECODE_REQ, .body_len = 8u << 20 };
    uint8_t hb[PROTO_HDR_LEN];
    proto_hdr_encode(&h, hb);
    assert_int_equal(write(fd, hb, sizeof(hb)), (ssize_t)sizeof(hb));
    double t0 = e2e_now();
    assert_true(eof_within(fd, 3));
    assert_true(e2e_now() - t0 < 2.0);
    close(fd);

    /* 2. many idle connections: at most RTR_CTL_PENDING_MAX (32) get a
     * CHALLENGE, the rest are closed at once */
    enum { N = 48 };
    int fds[N];
    int challenged = 0, refused = 0;
    for (int i = 0; i < N; i++) {
        fds[i] = tcp_connect(g_d.control_port);
        assert_true(fds[i] >= 0);
    }
    for (int i = 0; i < N; i++) {
        int t = read_frame(fds[i], buf, sizeof(buf), &len, 3);
        if (t == PROTO_MSG_CHALLENGE)
            challenged++;
        else if (t == 0)
            refused++;
    }
    fprintf(stderr, "security: %d of %d idle connections challenged, %d closed at once\n",
            challenged, N, refused);
    assert_true(challenged <= 32);
    assert_true(refused >= N - 32);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    assert_true(router_stat("ctl_unauth_dropped") >= drop0 + (N - 32));

    /* 3. a trickler (one byte every 300 ms keeps the idle timer happy):
     * closed at the 5 s handshake deadline */
    e2e_nap_ms(300);
    fd = tcp_connect(g_d.control_port);
    assert_true(fd >= 0);
    assert_int_equal(read_frame(fd, buf, sizeof(buf), &len, 5), PROTO_MSG_CHALLENGE);
    /* a valid HELLO header, then body bytes: nothing to refuse early */
    proto_hdr_t hh = { .type = PROTO_MSG_HELLO, .body_len = 400 };
    uint8_t trickle[PROTO_HDR_LEN + 400] = { 0 };
    proto_hdr_encode(&hh, trickle);
    t0 = e2e_now();
    bool closed = false;
    for (int i = 0; i < 40 && !closed; i++) {
        if (write(fd, trickle + i, 1) != 1)
            closed = true;
        else
            closed = eof_within(fd, 0.3);
    }
    assert_true(closed);
    double took = e2e_now() - t0;
    fprintf(stderr, "security: trickling control peer closed after %.1f s\n", took);
    assert_true(took < 8.0);
    close(fd);
}

static bool file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return false;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

/* Finding 7, the smaller ones, against the real processes. */
static void test_smaller_ones(void **st)
{
    (void)st;
    /* a daemon id with a newline, correctly signed: refused, logged escaped */
    proto_auth_secret_t sec;
    assert_int_equal(proto_auth_secret_parse((const uint8_t *)g_d.secret_hex,
                                             strlen(g_d.secret_hex), &sec), PD_OK);
    int fd = tcp_connect(g_d.control_port);
    assert_true(fd >= 0);
    uint8_t buf[16384];
    size_t len = 0;
    assert_int_equal(read_frame(fd, buf, sizeof(buf), &len, 5), PROTO_MSG_CHALLENGE);
    proto_msg_t ch;
    assert_int_equal(proto_msg_decode(buf, len, &ch), PD_OK);
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_HELLO;
    m.u.hello.role = PROTO_ROLE_DECODE;
    m.u.hello.caps = PROTO_CAP_DECODE;
    snprintf(m.u.hello.daemon_id, sizeof(m.u.hello.daemon_id), "evil\nid 2026-01-01 forged");
    proto_auth_nonce(m.u.hello.nonce);
    assert_int_equal(proto_auth_hello_sign(&sec, &m, ch.u.challenge.nonce), PD_OK);
    size_t n = 0;
    assert_int_equal(proto_msg_encode(&m, buf, sizeof(buf), &n), PD_OK);
    assert_int_equal(write(fd, buf, n), (ssize_t)n);
    assert_int_equal(read_frame(fd, buf, sizeof(buf), &len, 5), PROTO_MSG_REGISTER_REJECT);
    assert_int_equal(proto_msg_decode(buf, len, &m), PD_OK);
    assert_int_equal(m.u.register_reject.status, PD_ERR_BAD_INPUT);
    close(fd);
    e2e_nap_ms(100);
    assert_true(file_has(g_d.router.log, "evil\\x0aid\\x202026"));
    assert_false(file_has(g_d.router.log, "evil\nid"));

    /* admin: words beyond the usage are refused, nothing happens */
    cJSON *j = e2e_admin(g_d.decode[0].sock, "drain now please");
    assert_non_null(j);
    assert_true(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "ok")));
    cJSON_Delete(j);
    e2e_nap_ms(300);
    assert_true(e2e_proc_alive(&g_d.decode[0]));
    j = e2e_admin(g_d.decode[0].sock, "session");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "ok")));
    cJSON_Delete(j);

    /* --config=/dev/urandom: refused at once, no hang */
    static char out[4096];
    const char *argv[] = { g_router, "--config=/dev/urandom", NULL };
    double t0 = e2e_now();
    assert_int_equal(run_capture(argv, out, sizeof(out), 10), 2);
    assert_true(e2e_now() - t0 < 5);
    assert_non_null(strstr(out, "not a regular file"));

    /* lease-ttl: the router refuses what the prefill would refuse */
    const char *lr[] = { g_router, "--check-config", "--lease-ttl=700s", NULL };
    assert_int_equal(run_capture(lr, out, sizeof(out), 10), 2);
    assert_non_null(strstr(out, "out of range"));
    const char *lp[] = { g_prefill, "--check-config", "--lease-ttl=700s", NULL };
    assert_int_equal(run_capture(lp, out, sizeof(out), 10), 2);
    const char *lok[] = { g_router, "--check-config", "--lease-ttl=600s", "--insecure-no-auth",
                          NULL };
    assert_int_equal(run_capture(lok, out, sizeof(out), 10), 0);

    /* --check-config loads the secret as the daemon would at boot (it said
     * "configuration ok" for a secret the daemon then refused), and the
     * error says why: the file's errno, or what is wrong with its text */
    const char *nosec[] = { g_decode, "--check-config", NULL };
    assert_int_equal(run_capture(nosec, out, sizeof(out), 10), 2);
    assert_non_null(strstr(out, "no deployment secret"));
    const char *miss[] = { g_router, "--check-config", "--secret-file=/nonexistent/secret", NULL };
    assert_int_equal(run_capture(miss, out, sizeof(out), 10), 2);
    assert_non_null(strstr(out, "/nonexistent/secret: No such file or directory"));
    char shortf[] = "/tmp/pd-sec-short-XXXXXX";
    int sfd = mkstemp(shortf);
    assert_true(sfd >= 0);
    assert_int_equal(write(sfd, "0123456789abcdef", 16), 16);
    close(sfd);
    char sarg[64];
    snprintf(sarg, sizeof(sarg), "--secret-file=%s", shortf);
    const char *shrt[] = { g_prefill, "--check-config", sarg, NULL };
    assert_int_equal(run_capture(shrt, out, sizeof(out), 10), 2);
    assert_non_null(strstr(out, "need at least 32 bytes"));
    const char *dir[] = { g_decode, "--check-config", "--secret-file=/tmp", NULL };
    assert_int_equal(run_capture(dir, out, sizeof(out), 10), 2);
    assert_non_null(strstr(out, "/tmp: Is a directory"));
    unlink(shortf);

    /* --secret as text (the harness passes it): warned */
    assert_true(file_has(g_d.router.log, "prefer --secret-file"));
    assert_true(file_has(g_d.decode[0].log, "prefer --secret-file"));
    proto_auth_secret_wipe(&sec);
}

/* ---- lockout group -------------------------------------------------------- */

static int lockout_setup(void **st)
{
    (void)st;
    static const char *ra[] = { "--disagg-mode=always", NULL };
    return start_deploy(ra, NULL, NULL, 1, 1);
}

static double admin_num(const e2e_proc_t *p, const char *cmd, const char *path)
{
    cJSON *j = e2e_admin(p->sock, cmd);
    double v = e2e_jnum(j, path);
    cJSON_Delete(j);
    return v;
}

static void backend_incarnation(const char *id, char *out, size_t cap)
{
    out[0] = '\0';
    cJSON *j = e2e_admin(g_d.router.sock, "backends");
    const cJSON *b;
    cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(j, "backends")) {
        const cJSON *bid = cJSON_GetObjectItemCaseSensitive(b, "id");
        const cJSON *inc = cJSON_GetObjectItemCaseSensitive(b, "incarnation");
        if (cJSON_IsString(bid) && strcmp(bid->valuestring, id) == 0 && cJSON_IsString(inc))
            snprintf(out, cap, "%s", inc->valuestring);
    }
    cJSON_Delete(j);
}

static void one_request(int salt)
{
    char body[512];
    int o = snprintf(body, sizeof(body), "{\"prompt\":[");
    for (int i = 0; i < 40; i++)
        o += snprintf(body + o, sizeof(body) - (size_t)o, "%s%d", i ? "," : "",
                      10 + (i * 7 + salt * 13) % 200);
    snprintf(body + o, sizeof(body) - (size_t)o, "],\"max_tokens\":4,\"temperature\":0}");
    e2e_resp_t r;
    e2e_http(g_d.http_port, "POST", "/v1/completions", NULL, body, 30.0, &r);
    if (r.status != 200)
        fail_msg("request %d: status %d body %s", salt, r.status, r.body ? r.body : "");
    e2e_resp_free(&r);
}

/* Finding 2: the prefill is stopped long enough for the router to drop it
 * (PEER_DOWN to the decode), then resumed. It registers again with the
 * same incarnation and must be used again: disaggregated requests are
 * pulled over kvxfer, not silently re-done decode-local. */
static void test_stop_resume_prefill(void **st)
{
    (void)st;
    e2e_proc_t *pf = &g_d.prefill[0], *dec = &g_d.decode[0];
    const char *id = pf->id;
    assert_true(wait_backend_state(id, "ready", 20));
    char inc0[32], inc1[32];
    backend_incarnation(id, inc0, sizeof(inc0));
    double ok0 = admin_num(dec, "requests", "counters.pulls_ok");
    one_request(0);
    assert_true(admin_num(dec, "requests", "counters.pulls_ok") >= ok0 + 1);

    double t0 = e2e_now();
    e2e_proc_signal(pf, SIGSTOP);
    assert_true(wait_backend_state(id, "down", 10));
    while (e2e_now() - t0 < 3.0)
        e2e_nap_ms(50);
    e2e_proc_signal(pf, SIGCONT);
    assert_true(wait_backend_state(id, "ready", 20));
    backend_incarnation(id, inc1, sizeof(inc1));
    assert_string_equal(inc0, inc1);    /* the same process, not a restart */

    double ok1 = admin_num(dec, "requests", "counters.pulls_ok");
    double local0 = router_stat("requests_local");
    double dis0 = router_stat("requests_disaggregated");
    double retried0 = router_stat("requests_retried");
    for (int i = 1; i <= 3; i++)
        one_request(i);
    double pulled = admin_num(dec, "requests", "counters.pulls_ok") - ok1;
    double local = router_stat("requests_local") - local0;
    fprintf(stderr, "security: after stop/resume: %.0f pulled, %.0f decode-local, "
            "%.0f disaggregated\n", pulled, local, router_stat("requests_disaggregated") - dis0);
    assert_true(pulled >= 3);
    assert_true(local == 0);
    assert_true(router_stat("requests_retried") == retried0); /* no fallback retries */
}

/* ---- memory group ------------------------------------------------------------ */

#include <dirent.h>
#include <sys/wait.h>

#include <sys/stat.h>
#include <time.h>

/* Entries of /dev/shm changed since t0 (wall clock) and larger than 64 MiB:
 * what a leftover KV arena would look like (other processes on the machine
 * may create small segments meanwhile). */
static int big_new_shm(time_t t0)
{
    DIR *d = opendir("/dev/shm");
    int n = 0;
    if (d == NULL)
        return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char p[512];
        struct stat sb;
        snprintf(p, sizeof(p), "/dev/shm/%s", e->d_name);
        if (e->d_name[0] != '.' && stat(p, &sb) == 0 && sb.st_mtime >= t0 &&
            sb.st_size > (64 << 20))
            n++;
    }
    closedir(d);
    return n;
}

/* Run bin with args; its stderr+stdout into out; exit status or -1. */
static int run_capture(const char *const *argv, char *out, size_t cap, double timeout_s)
{
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    size_t n = 0;
    double end = e2e_now() + timeout_s;
    for (;;) {
        struct pollfd p = { .fd = pfd[0], .events = POLLIN };
        int ms = (int)((end - e2e_now()) * 1000);
        if (ms <= 0 || poll(&p, 1, ms) <= 0)
            break;
        ssize_t r = read(pfd[0], out + n, cap - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
        if (n >= cap - 1)
            break;
    }
    out[n] = '\0';
    close(pfd[0]);
    int st;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (e2e_now() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        e2e_nap_ms(20);
    }
}

/* Finding 3: --kv-blocks inside the documented range but far beyond the
 * machine: a clear error at boot, exit 1, nothing left in /dev/shm. */
static void test_kv_blocks_vs_machine(void **st)
{
    (void)st;
    time_t wall0 = time(NULL);
    const char *bins[] = { g_prefill, g_decode };
    for (int i = 0; i < 2; i++) {
        char model[512];
        snprintf(model, sizeof(model), "--model=%s", g_model);
        const char *argv[] = { bins[i], model, "--id=mem-test", "--router=127.0.0.1:1",
                               "--kv-blocks=100000000", "--insecure-no-auth", "--threads=1",
                               NULL };
        static char out[16384];
        double t0 = e2e_now();
        int rc = run_capture(argv, out, sizeof(out), 60);
        if (rc != 1 || strstr(out, "does not fit") == NULL || strstr(out, "--kv-blocks") == NULL)
            fail_msg("%s --kv-blocks=100000000: exit %d, output:\n%s", bins[i], rc, out);
        fprintf(stderr, "security: %s refused the arena in %.2f s\n", bins[i], e2e_now() - t0);
    }
    assert_int_equal(big_new_shm(wall0), 0);
}

/* ---- http group -------------------------------------------------------------- */

#include <sys/resource.h>

static int http_setup(void **st)
{
    (void)st;
    static const char *ra[] = { "--http-max-conns=24", "--http-max-conns-per-client=8",
                                "--http-read-timeout=2s", NULL };
    return start_deploy(ra, NULL, NULL, 0, 1);
}

/* A TCP connection to the router's HTTP port from source address src
 * (any 127/8 address is loopback on Linux). */
static int http_connect_from(const char *src)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in b = { .sin_family = AF_INET };
    inet_pton(AF_INET, src, &b.sin_addr);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(g_d.http_port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&b, sizeof(b)) != 0 ||
        connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int health_status(double timeout_s)
{
    e2e_resp_t r;
    e2e_http(g_d.http_port, "GET", "/health", NULL, NULL, timeout_s, &r);
    int st = r.status;
    e2e_resp_free(&r);
    return st;
}

/* What arrived on fd within timeout_s: 1 = a 503 then EOF, 2 = EOF alone,
 * 0 = nothing (still open). */
static int http_refused(int fd, double timeout_s)
{
    char b[1024];
    size_t n = 0;
    double end = e2e_now() + timeout_s;
    for (;;) {
        int ms = (int)((end - e2e_now()) * 1000);
        if (ms <= 0)
            return 0;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, ms) <= 0)
            continue;
        ssize_t r = read(fd, b + n, sizeof(b) - 1 - n);
        if (r <= 0) {
            b[n] = '\0';
            return strncmp(b, "HTTP/1.1 503", 12) == 0 ? 1 : 2;
        }
        n += (size_t)r;
        if (n >= sizeof(b) - 1)
            return 0;
    }
}

/* Finding 4: per-client cap (503 + close), a slow client closed at the
 * read deadline however it trickles, the total cap (accept pauses, other
 * clients wait instead of failing). */
static void test_http_conn_caps(void **st)
{
    (void)st;
    double refused0 = router_stat("http_conns_refused");
    int fds[32], n_open = 0, n_503 = 0;
    for (int i = 0; i < 12; i++) {
        fds[i] = http_connect_from("127.0.0.2");
        assert_true(fds[i] >= 0);
    }
    for (int i = 0; i < 12; i++) {
        int k = http_refused(fds[i], i < 8 ? 0.05 : 1.0);
        if (k == 1)
            n_503++;
        else if (k == 0)
            n_open++;
    }
    fprintf(stderr, "security: 12 connections from one client: %d open, %d refused with 503\n",
            n_open, n_503);
    assert_int_equal(n_open, 8);
    assert_int_equal(n_503, 4);
    assert_int_equal(health_status(5), 200); /* other clients unaffected */
    assert_true(router_stat("http_conns_refused") >= refused0 + 4);
    for (int i = 0; i < 12; i++)
        close(fds[i]);

    /* slowloris: one header byte every 300 ms */
    double to0 = router_stat("http_read_timeouts");
    int fd = http_connect_from("127.0.0.3");
    assert_true(fd >= 0);
    static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa"
                              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    double t0 = e2e_now();
    bool closed = false;
    for (size_t i = 0; i < sizeof(req) - 1 && !closed; i++) {
        if (send(fd, req + i, 1, MSG_NOSIGNAL) != 1)
            closed = true;
        else
            closed = eof_within(fd, 0.3);
    }
    double took = e2e_now() - t0;
    fprintf(stderr, "security: trickling HTTP client closed after %.1f s\n", took);
    assert_true(closed);
    assert_true(took < 4.0);
    assert_true(router_stat("http_read_timeouts") >= to0 + 1);
    close(fd);

    /* total cap 24: 24 idle connections from 4 addresses fill it; a new
     * client waits in the backlog (no error) until the idle ones hit their
     * read deadline */
    static const char *src[] = { "127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14" };
    for (int i = 0; i < 24; i++) {
        fds[i] = http_connect_from(src[i % 4]);
        assert_true(fds[i] >= 0);
    }
    e2e_nap_ms(300);
    t0 = e2e_now();
    int stt = health_status(8);
    took = e2e_now() - t0;
    fprintf(stderr, "security: /health with %d idle connections open: %d after %.1f s\n", 24,
            stt, took);
    assert_int_equal(stt, 200);
    assert_true(took > 0.8); /* it had to wait for the read deadline */
    for (int i = 0; i < 24; i++)
        close(fds[i]);
}

/* Send raw request bytes; the response's status (0 if none within 5 s) and
 * whether the router closed the connection after it. */
static int raw_http(const char *req, bool *closed, char *body, size_t cap)
{
    int fd = http_connect_from("127.0.0.5");
    assert_true(fd >= 0);
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    char b[8192];
    size_t n = 0;
    double end = e2e_now() + 5;
    *closed = false;
    while (e2e_now() < end && n < sizeof(b) - 1) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 100) <= 0) {
            if (n > 0 && strstr(b, "\r\n\r\n") != NULL)
                break; /* a whole answer, connection kept */
            continue;
        }
        ssize_t r = read(fd, b + n, sizeof(b) - 1 - n);
        if (r <= 0) {
            *closed = true;
            break;
        }
        n += (size_t)r;
        b[n] = '\0';
    }
    b[n] = '\0';
    close(fd);
    int st = 0;
    if (strncmp(b, "HTTP/1.1 ", 9) == 0)
        st = atoi(b + 9);
    const char *bd = strstr(b, "\r\n\r\n");
    snprintf(body, cap, "%s", bd ? bd + 4 : "");
    return st;
}

/* Finding 7: HTTP a proxy in front would frame differently is refused
 * (and the connection closed); JSON with bytes after the value or a key
 * twice is refused. */
static void test_http_ambiguous(void **st)
{
    (void)st;
    static const char *const bad[] = {
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 30\r\nContent-Length: 30\r\n\r\n{\"prompt\":\"hi\",\"max_tokens\":1}",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: gzip, chunked\r\nContent-Length: 30\r\n\r\n"
        "{\"prompt\":\"hi\",\"max_tokens\":1}",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\nContent-Length: 30\r\n\r\n1e\r\n"
        "{\"prompt\":\"hi\",\"max_tokens\":1}\r\n0\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: gzip, chunked\r\n\r\n1e\r\n"
        "{\"prompt\":\"hi\",\"max_tokens\":1}\r\n0\r\n\r\n",
        /* bare LF line ends, all or one */
        "GET /health HTTP/1.1\nHost: x\n\n",
        "GET /health HTTP/1.1\r\nHost: x\nX-A: b\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        bool closed;
        char body[4096];
        int stt = raw_http(bad[i], &closed, body, sizeof(body));
        /* ours ("ambiguous HTTP framing") or libevent's own plain 400 */
        if (stt != 400 || !closed)
            fail_msg("ambiguous request %zu: status %d closed %d body %s", i, stt, closed, body);
    }
    static const struct { const char *json, *why; } js[] = {
        { "{\"prompt\":\"hi\",\"max_tokens\":1} {}", "bytes after" },
        { "{\"prompt\":\"hi\",\"max_tokens\":1,\"prompt\":\"other\"}", "twice" },
        { "{\"prompt\":\"hi\",\"max_tokens\":1,\"stop\":{\"a\":1,\"a\":2}}", "twice" },
    };
    for (size_t i = 0; i < sizeof(js) / sizeof(js[0]); i++) {
        char req[1024];
        snprintf(req, sizeof(req),
                 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\n\r\n%s", strlen(js[i].json), js[i].json);
        bool closed;
        char body[4096];
        int stt = raw_http(req, &closed, body, sizeof(body));
        if (stt != 400 || strstr(body, js[i].why) == NULL)
            fail_msg("JSON %zu: status %d body %s", i, stt, body);
    }
    /* the same request, well-formed, works */
    static const char good[] = "{\"prompt\":\"hi\",\"max_tokens\":1}";
    char req[512];
    snprintf(req, sizeof(req),
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", strlen(good), good);
    bool closed;
    char body[4096];
    assert_int_equal(raw_http(req, &closed, body, sizeof(body)), 200);
}

/* Finding 7: a client that shuts down its sending side after a
 * non-streaming request (shutdown(SHUT_WR), `nc -N`) still gets its answer
 * (a streaming one does not: evhttp ends a started stream on EOF); one
 * that closes its socket is still noticed (router-int, e2e-faults). */
static void test_http_half_close(void **st)
{
    (void)st;
    static const char *const bodies[] = {
        "{\"prompt\":\"hello there\",\"max_tokens\":6,\"temperature\":0}",
    };
    for (int k = 0; k < 1; k++) {
        int fd = http_connect_from("127.0.0.6");
        assert_true(fd >= 0);
        char req[512];
        int n = snprintf(req, sizeof(req),
                         "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         "application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                         strlen(bodies[k]), bodies[k]);
        assert_int_equal(write(fd, req, (size_t)n), n);
        shutdown(fd, SHUT_WR);
        static char b[65536];
        size_t got = 0;
        double end = e2e_now() + 20;
        while (e2e_now() < end && got < sizeof(b) - 1) {
            struct pollfd p = { .fd = fd, .events = POLLIN };
            if (poll(&p, 1, 100) <= 0)
                continue;
            ssize_t r = read(fd, b + got, sizeof(b) - 1 - got);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        b[got] = '\0';
        close(fd);
        if (strstr(b, "HTTP/1.1 200") == NULL ||
            strstr(b, k == 0 ? "\"finish_reason\"" : "data: [DONE]") == NULL)
            fail_msg("half-closed client (%s) got: %.400s", k ? "stream" : "json", b);
    }
}

static double proc_cpu_s(pid_t pid)
{
    char p[64], b[1024];
    snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "re");
    if (f == NULL)
        return -1;
    size_t n = fread(b, 1, sizeof(b) - 1, f);
    fclose(f);
    b[n] = '\0';
    char *q = strrchr(b, ')');
    unsigned long ut = 0, stt = 0;
    if (q == NULL || sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                            &ut, &stt) != 2)
        return -1;
    return (double)(ut + stt) / (double)sysconf(_SC_CLK_TCK);
}

static int proc_fds(pid_t pid)
{
    char p[64];
    snprintf(p, sizeof(p), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(p);
    int n = 0;
    if (d == NULL)
        return -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static long file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* Finding 4: the router at its fd limit neither spins nor floods its log,
 * and serves again once fds are free. */
static void test_http_emfile(void **st)
{
    (void)st;
    pid_t pid = g_d.router.pid;
    struct rlimit old, lim;
    assert_int_equal(prlimit(pid, RLIMIT_NOFILE, NULL, &old), 0);
    int open_fds = proc_fds(pid);
    assert_true(open_fds > 0);
    lim = old;
    lim.rlim_cur = (rlim_t)open_fds + 2;
    assert_int_equal(prlimit(pid, RLIMIT_NOFILE, &lim, NULL), 0);
    static const char *src[] = { "127.0.0.21", "127.0.0.22", "127.0.0.23", "127.0.0.24" };
    int fds[16];
    for (int i = 0; i < 16; i++)
        fds[i] = http_connect_from(src[i % 4]); /* the kernel completes them (backlog) */
    e2e_nap_ms(300);
    double cpu0 = proc_cpu_s(pid);
    long log0 = file_size(g_d.router.log);
    e2e_nap_ms(2000);
    double cpu = proc_cpu_s(pid) - cpu0;
    long grew = file_size(g_d.router.log) - log0;
    fprintf(stderr, "security: at the fd limit for 2 s: router CPU %.2f s, log +%ld bytes, "
            "accept errors %.0f\n", cpu, grew, router_stat("http_accept_errors"));
    assert_int_equal(prlimit(pid, RLIMIT_NOFILE, &old, NULL), 0);
    assert_true(cpu < 0.5);
    assert_true(grew < 16384);
    assert_true(router_stat("http_accept_errors") >= 1);
    for (int i = 0; i < 16; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    assert_int_equal(health_status(5), 200);
}

/* ---- HTTP edges (issue 28) -------------------------------------------------- */

static int edges_setup(void **st)
{
    (void)st;
    static const char *ra[] = { "--http-max-conns=1024", "--http-max-conns-per-client=256",
                                "--http-read-timeout=2s", "--log.level=debug", NULL };
    return start_deploy(ra, NULL, NULL, 0, 1);
}

#define BURST_N 400

/* The router's listening HTTP socket, duplicated into this process
 * (pidfd_getfd), or -1. */
static int router_listen_fd(void)
{
    int pfd = (int)syscall(SYS_pidfd_open, g_d.router.pid, 0);
    if (pfd < 0)
        return -1;
    int found = -1;
    for (int fd = 3; fd < 4096 && found < 0; fd++) {
        int d = (int)syscall(SYS_pidfd_getfd, pfd, fd, 0);
        if (d < 0)
            continue;
        int acc = 0;
        socklen_t al = sizeof(acc);
        struct sockaddr_in a;
        socklen_t sl = sizeof(a);
        if (getsockopt(d, SOL_SOCKET, SO_ACCEPTCONN, &acc, &al) == 0 && acc &&
            getsockname(d, (struct sockaddr *)&a, &sl) == 0 && a.sin_family == AF_INET &&
            ntohs(a.sin_port) == g_d.http_port)
            found = d;
        else
            close(d);
    }
    close(pfd);
    return found;
}

/* Finding 5: 400 connections from one address accepted in one turn of the
 * router's loop (the router stopped while they connect, its listen backlog
 * raised so the kernel completes them all; then it runs): the per-client
 * cap holds (256 admitted, the rest get a 503) and every admitted one is
 * closed by the read deadline (2 s). Before, the 144 beyond the first 256
 * were untracked: no 503 and no deadline. */
static void test_http_burst(void **st)
{
    (void)st;
    static int fds[BURST_N];
    int lfd = router_listen_fd();
    assert_true(lfd >= 0);
    assert_int_equal(kill(g_d.router.pid, SIGSTOP), 0);
    int rc = listen(lfd, 1024);
    int n_ok = 0;
    for (int i = 0; i < BURST_N && rc == 0; i++) {
        fds[i] = http_connect_from("127.0.0.7");
        n_ok += fds[i] >= 0;
    }
    assert_int_equal(kill(g_d.router.pid, SIGCONT), 0);
    close(lfd);
    assert_int_equal(rc, 0);
    double t0 = e2e_now();
    static double ended_at[BURST_N];
    static char got503[BURST_N];
    static struct pollfd p[BURST_N];
    int n_ended = 0;
    for (int i = 0; i < BURST_N; i++) {
        ended_at[i] = fds[i] < 0 ? t0 : 0;
        got503[i] = 0;
        n_ended += fds[i] < 0;
    }
    while (n_ended < BURST_N && e2e_now() < t0 + 6.0) {
        int np = 0;
        for (int i = 0; i < BURST_N; i++)
            if (ended_at[i] == 0)
                p[np++] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
        int r = poll(p, (nfds_t)np, 50);
        for (int j = 0; r > 0 && j < np; j++) {
            if (p[j].revents == 0)
                continue;
            int i = 0;
            while (fds[i] != p[j].fd)
                i++;
            char b[512];
            ssize_t m = read(p[j].fd, b, sizeof(b) - 1);
            if (m > 0) {
                got503[i] |= strncmp(b, "HTTP/1.1 503", 12) == 0;
                continue;
            }
            ended_at[i] = e2e_now();
            n_ended++;
        }
    }
    int n_503 = 0, left = 0, admitted = 0;
    double last = 0;
    for (int i = 0; i < BURST_N; i++) {
        n_503 += got503[i];
        admitted += !got503[i];
        left += ended_at[i] == 0;
        if (ended_at[i] > last)
            last = ended_at[i];
        if (fds[i] >= 0)
            close(fds[i]);
    }
    fprintf(stderr, "security: burst of %d connections in one loop turn (%d connected): %d "
            "refused with 503, %d admitted (cap 256), %d still open after 6 s, the last "
            "closed %.1f s after the router resumed\n",
            BURST_N, n_ok, n_503, admitted, left, last > 0 ? last - t0 : 0);
    assert_int_equal(n_ok, BURST_N);
    assert_int_equal(left, 0);
    assert_true(admitted <= 256);
    assert_true(last - t0 < 4.0);
    assert_int_equal(health_status(5), 200);
}

/* Send n raw bytes from 127.0.0.8; everything the router sends back until
 * it closes (or until quiet_s without a byte). */
static size_t raw_exchange(const char *req, size_t n, char *out, size_t cap, double quiet_s,
                           bool half_close, bool *closed)
{
    int fd = http_connect_from("127.0.0.8");
    assert_true(fd >= 0);
    assert_int_equal(write(fd, req, n), (ssize_t)n);
    if (half_close)
        shutdown(fd, SHUT_WR);
    size_t got = 0;
    double end = e2e_now() + quiet_s;
    *closed = false;
    while (got < cap - 1) {
        int ms = (int)((end - e2e_now()) * 1000);
        if (ms <= 0)
            break;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, ms) <= 0)
            continue;
        ssize_t r = read(fd, out + got, cap - 1 - got);
        if (r <= 0) {
            *closed = true;
            break;
        }
        got += (size_t)r;
        end = e2e_now() + quiet_s;
    }
    out[got] = '\0';
    close(fd);
    return got;
}

static int count_str(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p != NULL; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* Finding 6: a body that is itself a request ("GET /v1/models") behind a
 * Content-Length evhttp would not read as one (space before the colon,
 * "-0", "+N", "N<NUL>", two values, folded) is refused with one 400 and
 * the connection closed: it is never answered as a second request. */
static void test_http_content_length(void **st)
{
    (void)st;
    static const char inner[] = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
    char n[16];
    snprintf(n, sizeof(n), "%zu", strlen(inner));
    static const struct { const char *fmt; size_t nul_at; } bad[] = {
        { "Content-Length : %s\r\n", 0 },
        { "Content-Length\t: %s\r\n", 0 },
        { "Content-Length: -0\r\n", 0 },
        { "Content-Length: +%s\r\n", 0 },
        { "Content-Length: %sX\r\n", 17 }, /* X becomes a NUL after the digits */
        { "Content-Length: 0x%s\r\n", 0 },
        { "Content-Length: %s\r\nContent-Length: 0\r\n", 0 },
        { "Content-Length: 0\r\nContent-Length: %s\r\n", 0 },
        { "Content-Length: %s, 0\r\n", 0 },
        { "X-A: b\r\n Content-Length: %s\r\n", 0 },
        { "Content-Length:\r\n %s\r\n", 0 },
        { "Transfer-Encoding: chunked\r\nContent-Length: %s\r\n", 0 },
    };
    int n_fail = 0;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char hdr[256], req[1024], out[8192];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(hdr, sizeof(hdr), bad[i].fmt, n);
#pragma GCC diagnostic pop
        int len = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\nHost: x\r\n%s\r\n%s",
                           hdr, inner);
        if (bad[i].nul_at) {
            char *x = strstr(req, "X\r\n");
            assert_non_null(x);
            *x = '\0';
        }
        bool closed;
        raw_exchange(req, (size_t)len, out, sizeof(out), 1.0, false, &closed);
        int n_resp = count_str(out, "HTTP/1.1 ");
        if (strncmp(out, "HTTP/1.1 400", 12) != 0 || n_resp != 1 || !closed ||
            strstr(out, "\"object\":\"list\"") != NULL)
        {
            fprintf(stderr, "security: Content-Length case %zu (%s): %d responses, closed %d: "
                    "%.300s\n", i, hdr, n_resp, closed, out);
            n_fail++;
        }
    }
    assert_int_equal(n_fail, 0);
    /* a body on a GET is read as a body (one answer), on a HEAD refused */
    {
        char req[1024], out[8192];
        bool closed;
        int len = snprintf(req, sizeof(req), "GET /health HTTP/1.1\r\nHost: x\r\n"
                           "Content-Length: %s\r\n\r\n%s", n, inner);
        raw_exchange(req, (size_t)len, out, sizeof(out), 1.0, false, &closed);
        if (count_str(out, "HTTP/1.1 ") != 1 || strstr(out, "\"object\":\"list\"") != NULL)
            fail_msg("GET with a body: %.600s", out);
        len = snprintf(req, sizeof(req), "HEAD /health HTTP/1.1\r\nHost: x\r\n"
                       "Content-Length: %s\r\n\r\n%s", n, inner);
        raw_exchange(req, (size_t)len, out, sizeof(out), 1.0, false, &closed);
        if (strncmp(out, "HTTP/1.1 400", 12) != 0 || count_str(out, "HTTP/1.1 ") != 1 ||
            !closed)
            fail_msg("HEAD with a body: %.600s", out);
    }
    /* HTTP/1.0 with Transfer-Encoding: faulty framing (RFC 9112 6.1) */
    {
        static const char req[] = "POST /v1/completions HTTP/1.0\r\nHost: x\r\n"
                                  "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        char out[8192];
        bool closed;
        raw_exchange(req, strlen(req), out, sizeof(out), 1.0, false, &closed);
        if (strstr(out, " 400 ") == NULL || !closed)
            fail_msg("HTTP/1.0 with Transfer-Encoding: %.400s", out);
    }
    /* well-formed, with optional whitespace around the value: one request
     * whose body is JSON, then a pipelined second request on the same
     * connection; both answered */
    {
        static const char body[] = "{\"prompt\":\"hi\",\"max_tokens\":1}";
        char req[1024], out[16384];
        int len = snprintf(req, sizeof(req),
                           "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                           "application/json\r\nContent-Length: \t%zu \r\n\r\n%s"
                           "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                           strlen(body), body);
        bool closed;
        raw_exchange(req, (size_t)len, out, sizeof(out), 5.0, false, &closed);
        if (strncmp(out, "HTTP/1.1 200", 12) != 0 || count_str(out, "HTTP/1.1 200") != 2)
            fail_msg("well-formed Content-Length then a pipelined request: %.800s", out);
    }
}

/* Finding 7: a \u0000 inside a JSON string (cJSON would cut the string
 * there: a tool named "ab" instead of "ab\u0000rm -rf", stop "of" instead
 * of "of\u0000ZZZ", the served model's name with junk after a NUL) is
 * refused with a 400 whose param is the JSON pointer of the string (or of
 * the member whose key it is). */
static void test_http_json_nul(void **st)
{
    (void)st;
    e2e_resp_t mr;
    e2e_http(g_d.http_port, "GET", "/v1/models", NULL, NULL, 5, &mr);
    cJSON *mj = cJSON_Parse(mr.body ? mr.body : "");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(mj, "data"), 0), "id");
    assert_true(cJSON_IsString(id));
    char model[256];
    snprintf(model, sizeof(model), "%s", id->valuestring);
    cJSON_Delete(mj);
    e2e_resp_free(&mr);

    char model_req[512];
    snprintf(model_req, sizeof(model_req),
             "{\"model\":\"%s\\u0000junk\",\"prompt\":\"hi\",\"max_tokens\":1}", model);
#define TOOL(name, props)                                                                  \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1,"              \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"" name "\",\"parameters\":" \
    "{\"type\":\"object\",\"properties\":{" props "}}}}],\"tool_choice\":\"required\"}"
    const struct { const char *path, *body, *param; } cases[] = {
        { "/v1/completions", model_req, "/model" },
        { "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":1,\"stop\":\"of\\u0000ZZZ\"}",
          "/stop" },
        { "/v1/completions",
          "{\"prompt\":\"hi\",\"max_tokens\":1,\"stop\":[\"a\",\"of\\u0000ZZZ\"]}", "/stop/1" },
        { "/v1/completions", "{\"prompt\":\"hi\\u0000there\",\"max_tokens\":1}", "/prompt" },
        { "/v1/chat/completions", TOOL("ab\\u0000rm -rf", ""), "/tools/0/function/name" },
        { "/v1/chat/completions", TOOL("f", "\"a\\u0000b\":{\"type\":\"string\"}"),
          "/tools/0/function/parameters/properties/a\\u0000b" },
        { "/v1/chat/completions",
          "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\","
          "\"content\":\"x\\u0000y\"}],\"max_tokens\":1}", "/messages/1/content" },
        /* JSON in a JSON string: a tool call's arguments, parsed again */
        { "/v1/chat/completions",
          "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
          "\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
          "{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":\\\"x\\\\u0000y\\\"}\"}}]},"
          "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r\"}],\"max_tokens\":1}",
          "/messages/1/tool_calls/0/function/arguments/a" },
    };
#undef TOOL
    int n_fail = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        e2e_resp_t r;
        e2e_http(g_d.http_port, "POST", cases[i].path, "Content-Type: application/json\r\n",
                 cases[i].body, 10, &r);
        cJSON *j = cJSON_Parse(r.body ? r.body : "");
        const cJSON *param = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(j, "error"), "param");
        bool ok = r.status == 400 && cJSON_IsString(param) &&
                  strcmp(param->valuestring, cases[i].param) == 0;
        if (!ok) {
            fprintf(stderr, "security: NUL case %zu (%s): status %d, body %.300s\n", i,
                    cases[i].param, r.status, r.body ? r.body : "");
            n_fail++;
        }
        cJSON_Delete(j);
        e2e_resp_free(&r);
    }
    assert_int_equal(n_fail, 0);
    /* an escaped backslash before "u0000" is text, not a NUL */
    e2e_resp_t r;
    e2e_http(g_d.http_port, "POST", "/v1/completions", "Content-Type: application/json\r\n",
             "{\"prompt\":\"a\\\\u0000\",\"max_tokens\":1}", 10, &r);
    assert_int_equal(r.status, 200);
    e2e_resp_free(&r);
}

/* Finding 8: at log.level=debug the router's 4xx lines quote client bytes
 * (model names, unknown keys, paths): a newline or an ESC in them must not
 * start a forged line or reach a terminal. */
static void test_http_log_escape(void **st)
{
    (void)st;
    long off = file_size(g_d.router.log);
    assert_true(off >= 0);
    static const char *const bodies[] = {
        "{\"model\":\"m\\nFORGED-1 error router admin logged in\\u001b[2J\",\"prompt\":\"hi\"}",
        "{\"prompt\":\"hi\",\"x\\r\\nFORGED-2 error router\\u001b]0;t\\u0007\":1}",
    };
    for (size_t i = 0; i < 2; i++) {
        e2e_resp_t r;
        e2e_http(g_d.http_port, "POST", "/v1/completions", "Content-Type: application/json\r\n",
                 bodies[i], 10, &r);
        assert_true(r.status >= 400 && r.status < 500);
        e2e_resp_free(&r);
    }
    /* a path with an ESC and a raw DEL (the request line allows them) */
    static const char req[] = "GET /v1/x\x1b[31mFORGED-3\x7f HTTP/1.1\r\nHost: x\r\n"
                              "Connection: close\r\n\r\n";
    char out[4096];
    bool closed;
    raw_exchange(req, strlen(req), out, sizeof(out), 2.0, false, &closed);
    assert_true(strncmp(out, "HTTP/1.1 4", 10) == 0);
    e2e_nap_ms(200);
    FILE *f = fopen(g_d.router.log, "re");
    assert_non_null(f);
    fseek(f, off, SEEK_SET);
    static char line[8192];
    int forged = 0, ctl = 0, quoted = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "FORGED", 6) == 0)
            forged++;
        for (const char *c = line; *c; c++)
            ctl += (*c > 0 && *c < 0x20 && *c != '\n') || *c == 0x7f;
        quoted += strstr(line, "FORGED") != NULL;
    }
    fclose(f);
    fprintf(stderr, "security: debug log after 3 hostile 4xx: %d forged lines, %d control "
            "bytes, %d lines quoting the text escaped\n", forged, ctl, quoted);
    assert_int_equal(forged, 0);
    assert_int_equal(ctl, 0);
    assert_true(quoted >= 2);
}

/* Finding 8: a client that half-closes (shutdown(SHUT_WR)) after sending
 * gets an answer to every request it sent: one HTTP/1.0 request; three
 * pipelined HTTP/1.1 ones. No "100 Continue" unless it sent
 * "Expect: 100-continue". */
static void test_http_half_close_all(void **st)
{
    (void)st;
    static const char body[] = "{\"prompt\":\"hello there\",\"max_tokens\":4,\"temperature\":0}";
    char one[512], req[2048], out[65536];
    bool closed;
    /* HTTP/1.0 */
    int len = snprintf(req, sizeof(req),
                       "POST /v1/completions HTTP/1.0\r\nHost: x\r\nContent-Type: "
                       "application/json\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
    raw_exchange(req, (size_t)len, out, sizeof(out), 10.0, true, &closed);
    bool ok10 = strstr(out, " 200 ") != NULL && strstr(out, "\"finish_reason\"") != NULL &&
                strstr(out, " 100 ") == NULL;
    if (!ok10)
        fprintf(stderr, "security: half-closed HTTP/1.0 client got: %.400s\n", out);
    /* three pipelined HTTP/1.1 requests (one answered at once, two later),
     * the last with Connection: close */
    len = 0;
    for (int k = 0; k < 3; k++) {
        if (k == 1)
            snprintf(one, sizeof(one), "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
        else
            snprintf(one, sizeof(one),
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\n%s\r\n%s", strlen(body),
                     k == 2 ? "Connection: close\r\n" : "", body);
        len += snprintf(req + len, sizeof(req) - (size_t)len, "%s", one);
    }
    raw_exchange(req, (size_t)len, out, sizeof(out), 10.0, true, &closed);
    int n200 = count_str(out, "HTTP/1.1 200"), n100 = count_str(out, "100 Continue");
    bool ok3 = n200 == 3 && n100 == 0;
    if (!ok3) {
        fprintf(stderr, "security: 3 pipelined requests then a half-close: %d answers, %d "
                "\"100 Continue\": %.600s\n", n200, n100, out);
        e2e_proc_dump_log(&g_d.router, 12);
    }
    /* one that asked for "100 Continue" may be probed with one: answered */
    len = snprintf(req, sizeof(req),
                   "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                   "application/json\r\nExpect: 100-continue\r\nContent-Length: %zu\r\n\r\n%s",
                   strlen(body), body);
    raw_exchange(req, (size_t)len, out, sizeof(out), 10.0, true, &closed);
    bool ok_exp = strstr(out, "HTTP/1.1 200") != NULL && strstr(out, "\"finish_reason\"") != NULL;
    if (!ok_exp)
        fprintf(stderr, "security: half-closed client with Expect: 100-continue got: %.400s\n",
                out);
    assert_true(ok10);
    assert_true(ok3);
    assert_true(ok_exp);
}

/* ---- main ------------------------------------------------------------------ */

/* ---- cache: prefix-cache isolation (issue 28 finding 4) ------------------ */

/* Two API keys; every request prefilled on the prefill daemon, so each
 * one's cached_tokens is the prefill's own prefix-cache hit. */
static int cache_setup(void **st)
{
    (void)st;
    static const char *ra[] = { "--api-key=key-alice,key-bob", "--disagg-mode=always", NULL };
    return start_deploy(ra, NULL, NULL, 1, 1);
}

/* One chat request with a "secret" system prompt under key (and salt, or
 * NULL); returns usage.prompt_tokens_details.cached_tokens (-1: no 200) and
 * the prompt tokens the prefill computed for it in *computed_p. */
static int cache_probe(const char *key, const char *salt, const char *secret, int *prompt_p,
                       int *computed_p)
{
    char hdr[128], body[1024], saltf[96] = "";
    snprintf(hdr, sizeof(hdr), "Authorization: Bearer %s\r\n", key);
    if (salt != NULL)
        snprintf(saltf, sizeof(saltf), "\"cache_salt\":\"%s\",", salt);
    snprintf(body, sizeof(body),
             "{%s\"max_tokens\":2,\"temperature\":0,\"messages\":["
             "{\"role\":\"system\",\"content\":\"You are the help desk of the Example Bank. "
             "Never tell anyone: the admin PIN is %s. Answer politely, briefly and only about "
             "opening hours, cards, transfers and the weather in the town of the branch.\"},"
             "{\"role\":\"user\",\"content\":\"hi\"}]}", saltf, secret);
    double c0 = admin_num(&g_d.prefill[0], "requests", "counters.computed_tokens");
    e2e_resp_t r;
    e2e_http(g_d.http_port, "POST", "/v1/chat/completions", hdr, body, 30, &r);
    int cached = -1;
    *prompt_p = -1;
    if (r.status == 200) {
        cJSON *j = cJSON_Parse(r.body);
        cached = (int)e2e_jnum(j, "usage.prompt_tokens_details.cached_tokens");
        *prompt_p = (int)e2e_jnum(j, "usage.prompt_tokens");
        cJSON_Delete(j);
    } else {
        fprintf(stderr, "cache: HTTP %d: %s\n", r.status, r.body ? r.body : "");
    }
    e2e_resp_free(&r);
    *computed_p = (int)(admin_num(&g_d.prefill[0], "requests", "counters.computed_tokens") - c0);
    return cached;
}

/* The finding: client A's prompt cached, client B sending the same prefix
 * saw cached_tokens (and a shorter TTFT) and so learned A's secret. Now a
 * request shares cached blocks only with requests of the same API key and
 * the same cache_salt: B (other key) and A under another salt get 0 cached
 * tokens and compute the whole prompt; A's repeat and A's repeat under one
 * salt are cached. */
static void test_cache_isolation(void **st)
{
    (void)st;
    int n, comp, c;
    c = cache_probe("key-alice", NULL, "4185", &n, &comp);
    assert_int_equal(c, 0);
    assert_true(n > 64);
    assert_int_equal(comp, n);
    c = cache_probe("key-alice", NULL, "4185", &n, &comp); /* A again: its own cache */
    assert_true(c >= 48);
    assert_int_equal(comp, n - c);
    c = cache_probe("key-bob", NULL, "4185", &n, &comp);   /* B guesses right */
    fprintf(stderr, "cache: other key, same prompt: cached_tokens %d, computed %d of %d\n", c,
            comp, n);
    assert_int_equal(c, 0);
    assert_int_equal(comp, n);
    c = cache_probe("key-alice", "s1", "4185", &n, &comp); /* A, another partition */
    assert_int_equal(c, 0);
    assert_int_equal(comp, n);
    c = cache_probe("key-alice", "s1", "4185", &n, &comp); /* same key, same salt: shared */
    assert_true(c >= 48);
    c = cache_probe("key-bob", "s1", "4185", &n, &comp);   /* same salt, other key */
    assert_int_equal(c, 0);
    assert_int_equal(comp, n);
    c = cache_probe("key-bob", NULL, "4185", &n, &comp);   /* B's own repeat is cached */
    assert_true(c >= 48);
    /* a bad salt is refused, naming the field */
    e2e_resp_t r;
    e2e_http(g_d.http_port, "POST", "/v1/completions", "Authorization: Bearer key-bob\r\n",
             "{\"prompt\":\"hi\",\"max_tokens\":1,\"cache_salt\":7}", 30, &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "\"param\":\"cache_salt\""));
    e2e_resp_free(&r);
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: %s GROUP ROUTER PREFILL DECODE MODEL\n", argv[0]);
        return 2;
    }
    const char *group = argv[1];
    g_router = argv[2];
    g_prefill = argv[3];
    g_decode = argv[4];
    g_model = argv[5];
    signal(SIGPIPE, SIG_IGN);
    int rc;
    if (strcmp(group, "replay") == 0) {
        const struct CMUnitTest t[] = {
            cmocka_unit_test(test_hello_replay),
            cmocka_unit_test(test_preauth_bounds),
            cmocka_unit_test(test_smaller_ones),
        };
        rc = cmocka_run_group_tests_name("security-replay", t, replay_setup, teardown);
    } else if (strcmp(group, "memory") == 0) {
        const struct CMUnitTest t[] = { cmocka_unit_test(test_kv_blocks_vs_machine) };
        rc = cmocka_run_group_tests_name("security-memory", t, NULL, NULL);
    } else if (strcmp(group, "http") == 0) {
        const struct CMUnitTest t[] = { cmocka_unit_test(test_http_conn_caps),
                                        cmocka_unit_test(test_http_ambiguous),
                                        cmocka_unit_test(test_http_half_close),
                                        cmocka_unit_test(test_http_emfile) };
        rc = cmocka_run_group_tests_name("security-http", t, http_setup, teardown);
    } else if (strcmp(group, "edges") == 0) {
        const struct CMUnitTest t[] = { cmocka_unit_test(test_http_burst),
                                        cmocka_unit_test(test_http_content_length),
                                        cmocka_unit_test(test_http_json_nul),
                                        cmocka_unit_test(test_http_log_escape),
                                        cmocka_unit_test(test_http_half_close_all) };
        rc = cmocka_run_group_tests_name("security-http-edges", t, edges_setup, teardown);
    } else if (strcmp(group, "cache") == 0) {
        const struct CMUnitTest t[] = { cmocka_unit_test(test_cache_isolation) };
        rc = cmocka_run_group_tests_name("security-cache-salt", t, cache_setup, teardown);
    } else if (strcmp(group, "lockout") == 0) {
        const struct CMUnitTest t[] = { cmocka_unit_test(test_stop_resume_prefill) };
        rc = cmocka_run_group_tests_name("security-lockout", t, lockout_setup, teardown);
    } else {
        fprintf(stderr, "unknown group %s\n", group);
        return 2;
    }
    return rc + g_teardown_failures;
}
