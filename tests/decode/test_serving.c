/* test_serving.c - pd-prefill + pd-decode as real processes, driven by a
 * small fake router built on proto_conn (this test plays the router side of
 * proto/PROTOCOL.md "Flows"): registration with the real secret handling
 * (and a wrong-secret daemon that must be refused), PEER_INFO, heartbeats,
 * PREFILL_REQ -> PREFILL_DONE -> DECODE_REQ -> TOKENS/FINISH compared with
 * `pd-run --tokens-out` on the same model; decode-local prefill (chunked),
 * retries with generated tokens, CANCEL mid-decode, lease expiry, SIGKILL of
 * a prefill between PREFILL_DONE and the pull, SIGTERM drain; a decode with
 * two router sessions (the same request id on both: two requests; CANCEL
 * and session loss scoped to their session). Every wait
 * polls a condition with a deadline; nothing sleeps a fixed time.
 *
 * usage: test-serving PD_PREFILL PD_DECODE PD_RUN MODEL.gguf */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include <event2/event.h>

#include "eng_sample.h"
#include "pd_blockname.h"
#include "pd_e2e.h"
#include "proto_samples.h"
#include "pd_time.h"
#include "proto_auth.h"
#include "proto_conn.h"

static const char *g_prefill_bin, *g_decode_bin, *g_run_bin, *g_model;
static bool g_sim; /* model "sim:...": pd-run --engine sim, and EOS ignored
                      (pd-run has no tokenizer, hence no EOS, for sim) */
static char g_dir[256];
static const char *SECRET_HEX =
    "5a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a";
static const char *WRONG_HEX =
    "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20";

/* ---- fake router ---------------------------------------------------------- */

#define MAX_DAEMONS 16
#define MAX_REQS 512
#define MAX_TOK 4096

typedef struct {
    bool used, registered, closed;
    proto_conn_t *conn;
    char id[PROTO_DAEMON_ID_MAX + 1];
    uint16_t role;
    uint64_t incarnation;
    uint8_t kv_addr[PROTO_KV_ADDR_MAX];
    uint32_t kv_addr_len;
    proto_heartbeat_t hb;               /* last heartbeat received */
    unsigned n_hb;
    /* the router's index of this daemon's prefix cache, from KV_EVENTS */
    uint64_t compat;
    uint64_t names[4096];               /* (n_names) */
    uint32_t n_names;
    unsigned n_kve, n_resets;
    bool names_overflow;
} fr_daemon_t;

typedef struct {
    char id[PROTO_REQID_MAX + 1];
    bool done, error, finish;
    int32_t first_token;
    uint32_t n_prompt;
    uint64_t lease_id;
    uint8_t handle[PROTO_KV_HANDLE_MAX];
    uint32_t handle_len;
    int32_t err_status;
    uint64_t err_at_ns;
    bool exists_err;                    /* ERROR{EXISTS} for a duplicate id */
    int32_t tokens[MAX_TOK];
    uint32_t n_tokens;
    uint32_t next_seq;
    bool seq_bad;
    proto_finish_t fin;
} fr_req_t;

static struct {
    struct event_base *base;
    proto_listener_t *l;
    uint16_t port;
    proto_auth_secret_t secret;
    fr_daemon_t d[MAX_DAEMONS];
    fr_req_t r[MAX_REQS];
    unsigned bad_macs;
    struct event *hb_ev, *tick_ev;
    /* several sessions of one daemon (test_two_sessions): registrations do
     * not replace each other, and replies are recorded per connection */
    bool multi;
    struct {
        proto_conn_t *conn;
        char id[PROTO_REQID_MAX + 1];
        unsigned tokens, finishes, errors;
        int32_t reason, status;
        uint32_t completion;
    } mx[16];
    unsigned n_mx;
    /* the first check that failed inside a callback: cmocka's failure
     * would longjmp out of event_base_loop, leave the base "running" and
     * fail every later test; run_until reports it instead */
    char cb_fail[256];
} fr;

#define CB_CHECK(cond)                                                          \
    do {                                                                        \
        if (!(cond)) {                                                          \
            if (fr.cb_fail[0] == '\0')                                          \
                snprintf(fr.cb_fail, sizeof(fr.cb_fail), "%s:%d: %s", __FILE__, \
                         __LINE__, #cond);                                      \
            event_base_loopbreak(fr.base);                                      \
            return;                                                             \
        }                                                                       \
    } while (0)

/* fr.multi: the reply record of (connection, id). */
static void *fr_mx(proto_conn_t *c, const char *id)
{
    for (unsigned i = 0; i < fr.n_mx; i++)
        if (fr.mx[i].conn == c && strcmp(fr.mx[i].id, id) == 0)
            return &fr.mx[i];
    if (fr.n_mx == 16)
        return NULL;
    memset(&fr.mx[fr.n_mx], 0, sizeof(fr.mx[0]));
    fr.mx[fr.n_mx].conn = c;
    snprintf(fr.mx[fr.n_mx].id, sizeof(fr.mx[0].id), "%s", id);
    return &fr.mx[fr.n_mx++];
}

static fr_daemon_t *fr_by_conn(proto_conn_t *c)
{
    for (int i = 0; i < MAX_DAEMONS; i++)
        if (fr.d[i].used && fr.d[i].conn == c && !fr.d[i].closed)
            return &fr.d[i];
    return NULL;
}

static fr_daemon_t *fr_by_id(const char *id)
{
    for (int i = 0; i < MAX_DAEMONS; i++)
        if (fr.d[i].used && fr.d[i].registered && !fr.d[i].closed && strcmp(fr.d[i].id, id) == 0)
            return &fr.d[i];
    return NULL;
}

static fr_req_t *fr_req(const char *id, bool create)
{
    for (int i = 0; i < MAX_REQS; i++)
        if (fr.r[i].id[0] && strcmp(fr.r[i].id, id) == 0)
            return &fr.r[i];
    if (!create)
        return NULL;
    for (int i = 0; i < MAX_REQS; i++)
        if (!fr.r[i].id[0]) {
            memset(&fr.r[i], 0, sizeof(fr.r[i]));
            snprintf(fr.r[i].id, sizeof(fr.r[i].id), "%s", id);
            return &fr.r[i];
        }
    return NULL;
}

/* A request the daemon answers to: one we sent, or a fork of one (n > 1:
 * "<id>/<i>", started by the decode itself from a DECODE_REQ's n_fork). */
static fr_req_t *fr_answered(const char *id)
{
    fr_req_t *r = fr_req(id, false);
    const char *slash = strrchr(id, '/');
    if (r == NULL && slash != NULL) {
        char parent[PROTO_REQID_MAX + 1];
        snprintf(parent, sizeof(parent), "%.*s", (int)(slash - id), id);
        if (fr_req(parent, false) != NULL)
            r = fr_req(id, true);
    }
    return r;
}

static void fr_send(fr_daemon_t *d, proto_msg_t *m)
{
    assert_non_null(d);
    assert_int_equal(proto_conn_send(d->conn, m), PD_OK);
}

static void fr_peer_info(fr_daemon_t *dec, fr_daemon_t *pf)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_PEER_INFO;
    snprintf(m.u.peer_info.daemon_id, sizeof(m.u.peer_info.daemon_id), "%s", pf->id);
    m.u.peer_info.role = PROTO_ROLE_PREFILL;
    m.u.peer_info.incarnation = pf->incarnation;
    m.u.peer_info.kv_addr.p = pf->kv_addr;
    m.u.peer_info.kv_addr.len = pf->kv_addr_len;
    fr_send(dec, &m);
}

/* The challenge sent on each accepted connection (a small ring). */
static struct {
    proto_conn_t *c;
    uint8_t nonce[PROTO_AUTH_NONCE_LEN];
} fr_ch[64];
static unsigned fr_ch_next;

static void fr_on_accept(proto_listener_t *l, proto_conn_t *c, void *arg)
{
    (void)l;
    (void)arg;
    unsigned i = fr_ch_next++ % 64;
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_CHALLENGE;
    proto_auth_nonce(m.u.challenge.nonce);
    fr_ch[i].c = c;
    memcpy(fr_ch[i].nonce, m.u.challenge.nonce, PROTO_AUTH_NONCE_LEN);
    CB_CHECK(proto_conn_send(c, &m) == PD_OK);
}

static const uint8_t *fr_challenge(proto_conn_t *c)
{
    /* newest first: a freed connection's address is reused */
    for (unsigned k = 1; k <= 64; k++) {
        unsigned i = (fr_ch_next - k) % 64;
        if (fr_ch[i].c == c)
            return fr_ch[i].nonce;
    }
    return NULL;
}

static void fr_on_hello(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)arg;
    const uint8_t *ch = fr_challenge(c);
    CB_CHECK(ch != NULL); /* no challenge for this connection */
    const uint8_t *f;
    size_t flen;
    CB_CHECK(proto_conn_frame(c, &f, &flen) == PD_OK);
    const proto_hello_t *h = &msg->u.hello;
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    if (proto_auth_hello_verify(&fr.secret, f, flen, ch) != PD_OK) {
        fr.bad_macs++;
        m.hdr.type = PROTO_MSG_REGISTER_REJECT;
        m.u.register_reject.status = PD_ERR_AUTH;
        snprintf(m.u.register_reject.reason, sizeof(m.u.register_reject.reason),
                 "HELLO from %s: bad MAC (wrong secret?)", h->daemon_id);
        proto_conn_send(c, &m);
        proto_conn_close_after_flush(c, PD_ERR_AUTH);
        return;
    }
    fr_daemon_t *d = NULL;
    for (int i = 0; i < MAX_DAEMONS; i++) /* a re-registration replaces the old entry */
        if (fr.d[i].used && strcmp(fr.d[i].id, h->daemon_id) == 0 &&
            !(fr.multi && !fr.d[i].closed)) {
            if (!fr.d[i].closed)
                proto_conn_close(fr.d[i].conn, PD_ERR_STALE);
            fr.d[i].used = false;
        }
    for (int i = 0; i < MAX_DAEMONS && d == NULL; i++)
        if (!fr.d[i].used)
            d = &fr.d[i];
    CB_CHECK(d != NULL);
    memset(d, 0, sizeof(*d));
    d->used = true;
    d->registered = true;
    d->conn = c;
    snprintf(d->id, sizeof(d->id), "%s", h->daemon_id);
    d->role = h->role;
    d->incarnation = h->incarnation;
    d->compat = h->compat_hash;
    memcpy(d->kv_addr, h->kv_addr.p, h->kv_addr.len);
    d->kv_addr_len = h->kv_addr.len;
    m.hdr.type = PROTO_MSG_REGISTER_ACK;
    snprintf(m.u.register_ack.daemon_id, sizeof(m.u.register_ack.daemon_id), "fake-router");
    m.u.register_ack.incarnation = 7;
    /* 500 ms: daemons drop a router silent for 1.5 s (loaded sanitizer runs
     * can stall this loop for a few hundred ms) */
    m.u.register_ack.heartbeat_interval_ns = 500000000ull;
    m.u.register_ack.lease_ns = 30000000000ull;
    memcpy(m.u.register_ack.nonce, ch, PROTO_AUTH_NONCE_LEN);
    CB_CHECK(proto_auth_ack_sign(&fr.secret, &m, h->nonce, ch) == PD_OK);
    CB_CHECK(proto_conn_send(d->conn, &m) == PD_OK);
    proto_auth_keys_t k;
    proto_auth_session_keys(&fr.secret, ch, h->nonce, true, &k);
    proto_conn_set_keys(c, &k);
    /* PEER_INFO: every decode learns every prefill */
    for (int i = 0; i < MAX_DAEMONS; i++) {
        fr_daemon_t *o = &fr.d[i];
        if (!o->used || !o->registered || o->closed || o == d)
            continue;
        if (d->role == PROTO_ROLE_DECODE && o->role == PROTO_ROLE_PREFILL)
            fr_peer_info(d, o);
        if (d->role == PROTO_ROLE_PREFILL && o->role == PROTO_ROLE_DECODE)
            fr_peer_info(o, d);
    }
}

static void fr_on_prefill_done(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    (void)arg;
    const proto_prefill_done_t *p = &msg->u.prefill_done;
    fr_req_t *r = fr_req(p->request_id, false);
    CB_CHECK(r != NULL);
    CB_CHECK(!(r->done || r->error));
    r->done = true;
    r->first_token = p->first_token;
    r->n_prompt = p->n_prompt_tokens;
    r->lease_id = p->lease_id;
    memcpy(r->handle, p->kv_handle.p, p->kv_handle.len);
    r->handle_len = p->kv_handle.len;
}

static void fr_on_tokens(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    (void)arg;
    const proto_tokens_msg_t *t = &msg->u.tokens;
    if (fr.multi) {
        typeof(fr.mx[0]) *x = fr_mx(c, t->request_id);
        if (x != NULL)
            x->tokens += t->tokens.n;
        return;
    }
    fr_req_t *r = fr_req(t->request_id, false);
    CB_CHECK(r != NULL);
    CB_CHECK(!(r->finish || r->error));
    if (t->seq != r->next_seq)
        r->seq_bad = true;
    r->next_seq++;
    for (uint32_t i = 0; i < t->tokens.n && r->n_tokens < MAX_TOK; i++)
        r->tokens[r->n_tokens++] = proto_tokens_get(&t->tokens, i);
}

static void fr_on_finish(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    (void)arg;
    if (fr.multi) {
        typeof(fr.mx[0]) *x = fr_mx(c, msg->u.finish.request_id);
        if (x != NULL) {
            x->finishes++;
            x->reason = msg->u.finish.reason;
            x->completion = msg->u.finish.completion_tokens;
        }
        return;
    }
    fr_req_t *r = fr_answered(msg->u.finish.request_id);
    CB_CHECK(r != NULL);
    CB_CHECK(!(r->finish || r->error)); /* exactly one terminal message */
    r->finish = true;
    r->fin = msg->u.finish;
}

static void fr_on_error(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    (void)arg;
    if (fr.multi) {
        typeof(fr.mx[0]) *x = fr_mx(c, msg->u.error.request_id);
        if (x != NULL) {
            x->errors++;
            x->status = msg->u.error.status;
        }
        return;
    }
    fr_req_t *r = fr_answered(msg->u.error.request_id);
    CB_CHECK(r != NULL);
    if (msg->u.error.status == PD_ERR_EXISTS) { /* answers the duplicate, not r */
        r->exists_err = true;
        return;
    }
    CB_CHECK(!(r->finish || r->error));
    r->error = true;
    r->err_status = msg->u.error.status;
    r->err_at_ns = pd_now_ns();
}

static void fr_on_heartbeat(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)arg;
    fr_daemon_t *d = fr_by_conn(c);
    if (d != NULL) {
        d->hb = msg->u.heartbeat;
        d->n_hb++;
    }
}

static bool fr_has_name(const fr_daemon_t *d, uint64_t name)
{
    for (uint32_t i = 0; i < d->n_names; i++)
        if (d->names[i] == name)
            return true;
    return false;
}

/* KV_EVENTS, applied as the router does: RESET, removed, stored. */
static void fr_on_kv_events(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)arg;
    fr_daemon_t *d = fr_by_conn(c);
    if (d == NULL)
        return;
    const proto_kv_events_t *e = &msg->u.kv_events;
    d->n_kve++;
    if (e->flags & PROTO_KVE_RESET) {
        d->n_resets++;
        d->n_names = 0;
    }
    for (uint32_t i = 0; i < e->removed.n; i++) {
        uint64_t nm = proto_names_get(&e->removed, i);
        for (uint32_t k = 0; k < d->n_names; k++)
            if (d->names[k] == nm) {
                d->names[k] = d->names[--d->n_names];
                break;
            }
    }
    for (uint32_t i = 0; i < e->stored.n; i++) {
        uint64_t nm = proto_names_get(&e->stored, i);
        if (fr_has_name(d, nm))
            continue;
        if (d->n_names == sizeof(d->names) / sizeof(d->names[0]))
            d->names_overflow = true;
        else
            d->names[d->n_names++] = nm;
    }
}

static void fr_on_close(proto_conn_t *c, pd_status_t why, void *arg)
{
    (void)why;
    (void)arg;
    fr_daemon_t *d = fr_by_conn(c);
    if (d != NULL)
        d->closed = true;
}

static void fr_hb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    for (int i = 0; i < MAX_DAEMONS; i++) {
        fr_daemon_t *d = &fr.d[i];
        if (!d->used || !d->registered || d->closed)
            continue;
        proto_msg_t m;
        memset(&m, 0, sizeof(m));
        m.hdr.type = PROTO_MSG_HEARTBEAT;
        m.u.heartbeat.incarnation = 7;
        m.u.heartbeat.sent_ns = pd_now_ns();
        proto_conn_send(d->conn, &m);
    }
}

static void fr_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg; /* wakes the loop so run_until re-checks its condition */
}

static void fr_start(void)
{
    memset(&fr, 0, sizeof(fr));
    assert_int_equal(proto_auth_secret_parse((const uint8_t *)SECRET_HEX, strlen(SECRET_HEX),
                                             &fr.secret), PD_OK);
    fr.base = event_base_new();
    assert_non_null(fr.base);
    proto_conn_cbs_t cbs;
    memset(&cbs, 0, sizeof(cbs));
    cbs.on_hello = fr_on_hello;
    cbs.on_prefill_done = fr_on_prefill_done;
    cbs.on_tokens = fr_on_tokens;
    cbs.on_finish = fr_on_finish;
    cbs.on_error = fr_on_error;
    cbs.on_heartbeat = fr_on_heartbeat;
    cbs.on_kv_events = fr_on_kv_events;
    cbs.on_close = fr_on_close;
    assert_int_equal(proto_listener_create(fr.base, "127.0.0.1:0", fr_on_accept, &cbs, NULL,
                                           NULL, &fr.l),
                     PD_OK);
    fr.port = proto_listener_port(fr.l);
    struct timeval hb = { 0, 200000 }, tick = { 0, 5000 };
    fr.hb_ev = event_new(fr.base, -1, EV_PERSIST, fr_hb, NULL);
    fr.tick_ev = event_new(fr.base, -1, EV_PERSIST, fr_tick, NULL);
    event_add(fr.hb_ev, &hb);
    event_add(fr.tick_ev, &tick);
}

typedef bool (*pred_t)(void *arg);

/* Run the fake router's loop until pred holds or timeout. */
static bool run_until(pred_t pred, void *arg, double timeout_s)
{
    uint64_t end = pd_now_ns() + (uint64_t)(timeout_s * 1e9);
    while (!pred(arg)) {
        if (pd_now_ns() > end)
            return false;
        event_base_loop(fr.base, EVLOOP_ONCE);
        if (fr.cb_fail[0] != '\0') {
            char why[sizeof(fr.cb_fail)];
            memcpy(why, fr.cb_fail, sizeof(why));
            fr.cb_fail[0] = '\0';
            fail_msg("in a callback: %s", why);
        }
    }
    return true;
}

static bool p_registered(void *arg) { return fr_by_id(arg) != NULL; }
static bool p_bad_mac(void *arg) { return fr.bad_macs >= *(unsigned *)arg; }
static bool p_done_or_error(void *arg) { fr_req_t *r = arg; return r->done || r->error; }
static bool p_final(void *arg) { fr_req_t *r = arg; return r->finish || r->error; }
static bool p_has_tokens(void *arg) { fr_req_t *r = arg; return r->n_tokens > 0 || r->finish || r->error; }
static bool p_draining_hb(void *arg)
{
    fr_daemon_t *d = arg;
    return d->closed || (d->hb.flags & PROTO_HB_DRAINING) != 0;
}
static bool p_closed(void *arg) { fr_daemon_t *d = arg; return d->closed; }


/* ---- processes ------------------------------------------------------------ */

typedef struct {
    pid_t pid;
    char id[64];
    char sock[100];
} proc_t;

static void spawn(proc_t *p, const char *bin, const char *id, const char *secret_hex,
                  const char *const *extra)
{
    char router[64], sock[340], secret[160], idarg[100], model[600];
    snprintf(router, sizeof(router), "--router=127.0.0.1:%u", fr.port);
    snprintf(p->sock, sizeof(p->sock), "%.60s/%.30s.sock", g_dir, id);
    snprintf(sock, sizeof(sock), "--admin.socket=%s", p->sock);
    snprintf(secret, sizeof(secret), "--secret=%s", secret_hex);
    snprintf(idarg, sizeof(idarg), "--id=%s", id);
    snprintf(model, sizeof(model), "--model=%s", g_model);
    snprintf(p->id, sizeof(p->id), "%s", id);
    const char *argv[40];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = router;
    argv[n++] = sock;
    argv[n++] = secret;
    argv[n++] = idarg;
    argv[n++] = model;
    argv[n++] = "--threads=1";
    argv[n++] = "--kv-blocks=64";
    argv[n++] = "--heartbeat-interval=200ms";
    argv[n++] = "--reconnect-min=100ms";
    argv[n++] = "--log.level=warn";
    static char ready[8][340];
    static int n_ready;
    char *rf = ready[n_ready++ % 8];
    snprintf(rf, sizeof(ready[0]), "--ready-file=%.60s/%.30s.ready", g_dir, id);
    argv[n++] = rf;
    for (int i = 0; extra && extra[i]; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        execv(bin, (char *const *)argv);
        _exit(127);
    }
}

static int wait_exit(proc_t *p, double timeout_s)
{
    uint64_t end = pd_now_ns() + (uint64_t)(timeout_s * 1e9);
    for (;;) {
        int status;
        pid_t w = waitpid(p->pid, &status, WNOHANG);
        if (w == p->pid) {
            p->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        if (pd_now_ns() > end)
            return -1;
        event_base_loop(fr.base, EVLOOP_ONCE); /* keep serving while waiting */
    }
}

static void kill_proc(proc_t *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
    }
}

/* One admin command -> parsed JSON reply (caller deletes). */
static cJSON *admin(proc_t *p, const char *cmd)
{
    return e2e_admin(p->sock, cmd);
}

static double jnum(const cJSON *o, const char *path1, const char *path2)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, path1);
    if (path2)
        x = cJSON_GetObjectItemCaseSensitive(x, path2);
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

/* Poll `kv` until free == blocks_total. */
static bool kv_all_free(proc_t *p, double timeout_s)
{
    uint64_t end = pd_now_ns() + (uint64_t)(timeout_s * 1e9);
    for (;;) {
        cJSON *j = admin(p, "kv");
        bool ok = j && jnum(j, "free", NULL) == jnum(j, "blocks_total", NULL) &&
                  jnum(j, "free", NULL) > 0;
        cJSON_Delete(j);
        if (ok)
            return true;
        if (pd_now_ns() > end)
            return false;
        event_base_loop(fr.base, EVLOOP_ONCE);
    }
}

/* accepted == completed + failed + canceled once nothing is live. */
static void check_ledger(proc_t *p)
{
    cJSON *j = admin(p, "requests");
    assert_non_null(j);
    double acc = jnum(j, "counters", "accepted"), com = jnum(j, "counters", "completed"),
           fail = jnum(j, "counters", "failed"), can = jnum(j, "counters", "canceled");
    cJSON *reqs = cJSON_GetObjectItemCaseSensitive(j, "requests");
    assert_int_equal(cJSON_GetArraySize(reqs), 0);
    assert_true(acc > 0);
    assert_true(acc == com + fail + can);
    cJSON_Delete(j);
}

/* ---- reference ------------------------------------------------------------- */

typedef struct {
    float temperature;
    uint64_t seed;
    uint32_t max_tokens;
    bool ignore_eos;
    /* penalties and one logit bias (0 = off; repetition 0 = off) */
    float presence, frequency, repetition, min_p;
    int32_t bias_id;
    float bias;
} samp_t;

/* pd-run --tokens-out on the same model; the fake router keeps serving
 * (heartbeats) while it runs. */
static uint32_t reference(const int32_t *prompt, uint32_t n, const samp_t *s, int32_t *out,
                          uint32_t cap)
{
    static char toks[16384];
    char mt[32], temp[32], seed[32], outp[300], pres[32], freq[32], rep[32], minp[32],
         bias[48];
    int off = 0;
    for (uint32_t i = 0; i < n; i++)
        off += snprintf(toks + off, sizeof(toks) - (size_t)off, i ? ",%d" : "%d", prompt[i]);
    snprintf(mt, sizeof(mt), "%u", s->max_tokens);
    snprintf(temp, sizeof(temp), "%g", s->temperature);
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)s->seed);
    snprintf(outp, sizeof(outp), "%.200s/ref.out", g_dir);
    snprintf(pres, sizeof(pres), "%g", s->presence);
    snprintf(freq, sizeof(freq), "%g", s->frequency);
    snprintf(rep, sizeof(rep), "%g", s->repetition ? s->repetition : 1.0f);
    snprintf(minp, sizeof(minp), "%g", s->min_p);
    snprintf(bias, sizeof(bias), "%d:%g", s->bias_id, s->bias);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *o = freopen(outp, "w", stdout);
        FILE *e = freopen("/dev/null", "w", stderr);
        (void)o;
        (void)e;
        const char *argv[] = { g_run_bin, "--model", g_model, "--threads", "1", "--tokens-out",
                               "--max-tokens", mt, "--temperature", temp, "--seed", seed,
                               "--engine", g_sim ? "sim" : "llama", "--tokens", toks,
                               "--presence-penalty", pres, "--frequency-penalty", freq,
                               "--repetition-penalty", rep, "--min-p", minp,
                               "--logit-bias", bias,
                               s->ignore_eos || g_sim ? "--ignore-eos" : NULL, NULL };
        execv(g_run_bin, (char *const *)argv);
        _exit(127);
    }
    proc_t p = { .pid = pid };
    assert_int_equal(wait_exit(&p, 60), 0);
    FILE *f = fopen(outp, "r");
    assert_non_null(f);
    uint32_t k = 0;
    int v;
    while (k < cap && fscanf(f, "%d", &v) == 1)
        out[k++] = v;
    fclose(f);
    assert_true(k > 0);
    return k;
}

static void make_prompt(int32_t *p, uint32_t n, uint32_t salt)
{
    for (uint32_t i = 0; i < n; i++)
        p[i] = (int32_t)(32 + (i * 7 + salt * 13) % 90); /* printable bytes */
}

static void fill_sampling(proto_sampling_t *ps, const samp_t *s)
{
    memset(ps, 0, sizeof(*ps));
    ps->temperature = s->temperature;
    ps->top_p = 1.0f;
    ps->seed = s->seed;
    ps->flags = PROTO_SAMPLE_HAS_SEED | (s->ignore_eos || g_sim ? PROTO_SAMPLE_IGNORE_EOS : 0);
    ps->max_tokens = s->max_tokens;
    ps->presence_penalty = s->presence;
    ps->frequency_penalty = s->frequency;
    ps->repetition_penalty = s->repetition;
    ps->min_p = s->min_p;
    ps->n_bias = 1;
    ps->bias_ids[0] = s->bias_id;
    ps->bias[0] = s->bias;
}

/* rng_state the router sends: sampler replayed over `generated`. */
static uint64_t rng_after(const samp_t *s, const int32_t *gen, uint32_t n)
{
    eng_sample_params_t p;
    eng_sample_params_default(&p);
    p.temperature = s->temperature;
    p.seed = s->seed;
    eng_sampler_t smp;
    eng_sampler_init(&smp, &p);
    for (uint32_t i = 0; i < n; i++) {
        if (s->temperature > 0)
            (void)eng_rng_next(&smp.rng);
        (void)eng_sampler_accept(&smp, gen[i]);
    }
    return smp.rng.s[0];
}

static unsigned g_reqno;

static fr_req_t *send_prefill(const char *pf_id, const char *dec_id, const int32_t *prompt,
                              uint32_t n, const samp_t *s)
{
    char id[64];
    snprintf(id, sizeof(id), "req-%u", ++g_reqno);
    fr_req_t *r = fr_req(id, true);
    assert_non_null(r);
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_PREFILL_REQ;
    snprintf(m.u.prefill_req.request_id, sizeof(m.u.prefill_req.request_id), "%s", id);
    m.u.prefill_req.prompt.n = n;
    m.u.prefill_req.prompt.v = prompt;
    fill_sampling(&m.u.prefill_req.sampling, s);
    snprintf(m.u.prefill_req.target_decode_id, sizeof(m.u.prefill_req.target_decode_id), "%s",
             dec_id);
    fr_send(fr_by_id(pf_id), &m);
    return r;
}

static void send_decode(fr_req_t *r, const char *dec_id, const char *pf_id,
                        const int32_t *prompt, uint32_t n, const int32_t *gen, uint32_t ng,
                        const samp_t *s, bool local)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_DECODE_REQ;
    proto_decode_req_t *q = &m.u.decode_req;
    snprintf(q->request_id, sizeof(q->request_id), "%s", r->id);
    q->flags = local ? PROTO_DEC_PREFILL_LOCALLY : 0;
    q->prompt.n = n;
    q->prompt.v = prompt;
    q->generated.n = ng;
    q->generated.v = gen;
    fill_sampling(&q->sampling, s);
    q->rng_state = rng_after(s, gen, ng);
    if (!local) {
        snprintf(q->prefill_peer_id, sizeof(q->prefill_peer_id), "%s", pf_id);
        q->lease_id = r->lease_id;
        q->kv_handle.p = r->handle;
        q->kv_handle.len = r->handle_len;
    }
    fr_send(fr_by_id(dec_id), &m);
}

static fr_req_t *new_req(void)
{
    char id[64];
    snprintf(id, sizeof(id), "req-%u", ++g_reqno);
    return fr_req(id, true);
}

static void send_cancel(const char *to, fr_req_t *r)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_CANCEL;
    snprintf(m.u.cancel.request_id, sizeof(m.u.cancel.request_id), "%s", r->id);
    m.u.cancel.status = PD_ERR_CANCELED;
    fr_send(fr_by_id(to), &m);
}

/* ---- the scenario ---------------------------------------------------------- */

static proc_t P, D, PL, PK, BAD, PS, PR, PC, PC2, D2S, PSL;

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/pd-serving-XXXXXX");
    if (mkdtemp(g_dir) == NULL)
        return -1;
    fr_start();
    spawn(&P, g_prefill_bin, "pf-a", SECRET_HEX, NULL);
    spawn(&D, g_decode_bin, "dec-a", SECRET_HEX,
          (const char *const[]){ "--prefill-chunk=16", "--transfer-timeout=2s", "--max-batch=8",
                                 NULL });
    if (!run_until(p_registered, "pf-a", 20) || !run_until(p_registered, "dec-a", 20))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kill_proc(&P);
    kill_proc(&D);
    kill_proc(&PL);
    kill_proc(&PK);
    kill_proc(&BAD);
    kill_proc(&PS);
    kill_proc(&PR);
    kill_proc(&PC);
    kill_proc(&PC2);
    kill_proc(&D2S);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0)
        return -1;
    return 0;
}

static cJSON *read_ready(const char *id)
{
    char path[300];
    snprintf(path, sizeof(path), "%.60s/%.30s.ready", g_dir, id);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return cJSON_Parse(buf);
}

/* --ready-file: written once registered (JSON), absent otherwise. */
static void test_ready_file(void **state)
{
    (void)state;
    const char *ids[] = { "pf-a", "dec-a" }, *roles[] = { "prefill", "decode" };
    for (int i = 0; i < 2; i++) {
        cJSON *j = NULL;
        uint64_t end = pd_now_ns() + 10000000000ull;
        while ((j = read_ready(ids[i])) == NULL && pd_now_ns() < end)
            event_base_loop(fr.base, EVLOOP_ONCE); /* written once the ACK is in */
        assert_non_null(j);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(j, "role");
        const cJSON *router = cJSON_GetObjectItemCaseSensitive(j, "router");
        assert_true(cJSON_IsString(id) && strcmp(id->valuestring, ids[i]) == 0);
        assert_true(cJSON_IsString(role) && strcmp(role->valuestring, roles[i]) == 0);
        assert_true(cJSON_IsString(router) && strcmp(router->valuestring, "fake-router") == 0);
        assert_true(jnum(j, "pid", NULL) == (i == 0 ? P.pid : D.pid));
        cJSON_Delete(j);
    }
}

static void test_wrong_secret(void **state)
{
    (void)state;
    unsigned before = fr.bad_macs, want = before + 1;
    spawn(&BAD, g_prefill_bin, "pf-bad", WRONG_HEX, NULL);
    assert_true(run_until(p_bad_mac, &want, 20));
    assert_null(fr_by_id("pf-bad"));
    /* the daemon saw the REGISTER_REJECT and keeps retrying, never registered */
    bool seen = false;
    uint64_t end = pd_now_ns() + 10000000000ull;
    while (!seen && pd_now_ns() < end) {
        cJSON *j = admin(&BAD, "session");
        seen = j && jnum(j, "rejects", NULL) >= 1 && jnum(j, "registrations", NULL) == 0;
        cJSON_Delete(j);
        if (!seen)
            event_base_loop(fr.base, EVLOOP_ONCE);
    }
    assert_true(seen);
    assert_null(read_ready("pf-bad")); /* never registered: no ready file */
    kill_proc(&BAD);
}

static void disagg_prompt_on(const char *pf, const int32_t *prompt, uint32_t n, const samp_t *s)
{
    int32_t ref[MAX_TOK];
    uint32_t nref = reference(prompt, n, s, ref, MAX_TOK);
    fr_req_t *r = send_prefill(pf, "dec-a", prompt, n, s);
    assert_true(run_until(p_done_or_error, r, 20));
    assert_false(r->error);
    assert_int_equal(r->first_token, ref[0]);
    assert_int_equal(r->n_prompt, n);
    send_decode(r, "dec-a", pf, prompt, n, &r->first_token, 1, s, false);
    assert_true(run_until(p_final, r, 30));
    assert_false(r->error);
    assert_false(r->seq_bad);
    assert_int_equal(r->n_tokens + 1, nref);
    for (uint32_t i = 1; i < nref; i++)
        assert_int_equal(r->tokens[i - 1], ref[i]);
    assert_int_equal(r->fin.completion_tokens, nref);
    assert_int_equal(r->fin.prompt_tokens, n);
    assert_true(r->fin.reason == PROTO_FINISH_LENGTH || r->fin.reason == PROTO_FINISH_STOP);
}

static void disagg_prompt(const int32_t *prompt, uint32_t n, const samp_t *s)
{
    disagg_prompt_on("pf-a", prompt, n, s);
}

static void disagg_one(uint32_t n, uint32_t salt, const samp_t *s)
{
    int32_t prompt[512];
    make_prompt(prompt, n, salt);
    disagg_prompt(prompt, n, s);
}

static double counter(proc_t *p, const char *name)
{
    cJSON *j = admin(p, "requests");
    assert_non_null(j);
    double v = jnum(j, "counters", name);
    cJSON_Delete(j);
    return v;
}

static double pf_counter(const char *name)
{
    cJSON *j = admin(&P, "requests");
    assert_non_null(j);
    double v = jnum(j, "counters", name);
    cJSON_Delete(j);
    return v;
}

/* Prefix cache (on by default): a repeated prompt and one sharing its first
 * blocks reuse the prefill's cached blocks (only full blocks, never the last
 * token) and still produce pd-run's tokens (pd-run computes everything:
 * the cache-off reference), greedy and with penalties; afterwards every
 * block is free or cached and unused (no leak). */
static void test_prefix_reuse(void **state)
{
    (void)state;
    cJSON *kv = admin(&P, "kv");
    assert_non_null(kv);
    uint32_t bt = (uint32_t)jnum(kv, "block_tokens", NULL);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(kv, "prefix_cache")));
    cJSON_Delete(kv);
    assert_true(bt >= 1 && bt <= 32);
    uint32_t n = 5 * bt + 3;
    int32_t a[512], b[512];
    make_prompt(a, n, 21);
    samp_t greedy = { 0.0f, 0, 12, false };
    samp_t pen = { 0.8f, 4321, 12, true, 1.2f, 0.6f, 1.4f, 0.05f, 40, 2.0f };
    double c0 = pf_counter("cached_tokens"), k0 = pf_counter("computed_tokens");
    double d0 = counter(&D, "cached_tokens");
    disagg_prompt(a, n, &greedy);                   /* cold */
    assert_true(pf_counter("cached_tokens") == c0);
    assert_true(pf_counter("computed_tokens") == k0 + n);
    assert_true(counter(&D, "cached_tokens") == d0);
    disagg_prompt(a, n, &greedy);                   /* the same prompt: 5 blocks */
    assert_true(pf_counter("cached_tokens") == c0 + 5 * bt);
    assert_true(pf_counter("computed_tokens") == k0 + n + 3);
    /* the decode kept the finished sequence's blocks: it pulled only the
     * last (partial) block of the prompt */
    assert_true(counter(&D, "cached_tokens") == d0 + 5 * bt);
    disagg_prompt(a, n, &pen);
    /* shares 3 blocks, then diverges */
    memcpy(b, a, sizeof(int32_t) * 3 * bt);
    for (uint32_t i = 3 * bt; i < n + 4; i++)
        b[i] = (int32_t)(40 + (i * 11) % 70);
    double c1 = pf_counter("cached_tokens");
    disagg_prompt(b, n + 4, &greedy);
    assert_true(pf_counter("cached_tokens") == c1 + 3 * bt);
    /* a prompt of exactly 2 blocks reuses 1: the last token is computed */
    double c2 = pf_counter("cached_tokens");
    disagg_prompt(a, 2 * bt, &greedy);
    assert_true(pf_counter("cached_tokens") == c2 + bt);
    /* local path (the decode prefills itself) from the decode's cache: a
     * prompt continuing a's first 4 blocks */
    int32_t cc[512], ref[MAX_TOK];
    memcpy(cc, a, sizeof(int32_t) * 4 * bt);
    for (uint32_t i = 4 * bt; i < 4 * bt + 9; i++)
        cc[i] = (int32_t)(35 + (i * 5) % 80);
    uint32_t nc = 4 * bt + 9;
    uint32_t nref = reference(cc, nc, &greedy, ref, MAX_TOK);
    double d1 = counter(&D, "cached_tokens");
    fr_req_t *r = new_req();
    send_decode(r, "dec-a", NULL, cc, nc, NULL, 0, &greedy, true);
    assert_true(run_until(p_final, r, 30));
    assert_false(r->error);
    assert_int_equal(r->n_tokens, nref);
    for (uint32_t i = 0; i < nref; i++)
        assert_int_equal(r->tokens[i], ref[i]);
    assert_true(counter(&D, "cached_tokens") == d1 + 4 * bt);
    /* multi-turn: the next prompt is a + the decode's answer + new tokens;
     * the decode kept the answer's KV (computed by decode steps) and pulls
     * neither those blocks nor the prompt's, and the tokens stay pd-run's */
    samp_t ans = { 0.0f, 0, 2 * bt, true };
    int32_t gen[MAX_TOK], t2[512];
    uint32_t ng = reference(a, n, &ans, gen, MAX_TOK);
    assert_int_equal(ng, 2 * bt);
    disagg_prompt(a, n, &ans);
    memcpy(t2, a, sizeof(int32_t) * n);
    memcpy(t2 + n, gen, sizeof(int32_t) * ng);
    for (uint32_t i = 0; i < 6; i++)
        t2[n + ng + i] = (int32_t)(33 + i * 9);
    uint32_t n2 = n + ng + 6; /* KV cached for n + ng - 1 = 7 bt + 2 tokens */
    double d2 = counter(&D, "cached_tokens");
    disagg_prompt(t2, n2, &greedy);
    assert_true(counter(&D, "cached_tokens") == d2 + 7 * bt);
    kv = admin(&P, "kv");
    assert_non_null(kv);
    assert_true(jnum(kv, "cache", "blocks") >= 6);
    assert_true(jnum(kv, "cache", "hit_tokens") > 0);
    cJSON_Delete(kv);
    assert_true(kv_all_free(&P, 10));
    assert_true(kv_all_free(&D, 10));
}

/* The fake router's view of a daemon's cache equals the daemon's own
 * (admin `kv` cache.blocks) and holds g_idx_names. */
static proc_t *g_idx_proc;
static uint64_t g_idx_names[8];
static uint32_t g_idx_names_n;
static bool p_index_matches(void *arg)
{
    fr_daemon_t *d = arg;
    cJSON *kv = admin(g_idx_proc, "kv");
    double blocks = jnum(kv, "cache", "blocks");
    cJSON_Delete(kv);
    if (d->names_overflow || blocks != (double)d->n_names)
        return false;
    for (uint32_t i = 0; i < g_idx_names_n; i++)
        if (!fr_has_name(d, g_idx_names[i]))
            return false;
    return true;
}

/* Reuse racing eviction, lease expiry and a prefill restart, on a small
 * pool (12 blocks): a leased cached block is never evicted (the pressure
 * request is refused instead), blocks come back as evictable cache when the
 * lease expires, eviction makes room, and every answer is pd-run's (a stale
 * or overwritten block would change the tokens). A new prefill process
 * starts with an empty cache while the decode still skips the blocks it
 * holds. */
static void send_peer_down(const char *to, const char *id, uint64_t incarnation);

static void test_prefix_races(void **state)
{
    (void)state;
    spawn(&PC, g_prefill_bin, "pf-cache", SECRET_HEX,
          (const char *const[]){ "--lease-ttl=300ms", "--kv-blocks=12", NULL });
    assert_true(run_until(p_registered, "pf-cache", 20));
    cJSON *kv = admin(&PC, "kv");
    assert_non_null(kv);
    uint32_t bt = (uint32_t)jnum(kv, "block_tokens", NULL);
    cJSON_Delete(kv);
    assert_true(bt >= 1 && bt <= 32);
    samp_t g = { 0.0f, 0, 6, false };
    int32_t a[512], b[512], c[512];
    uint32_t na = 5 * bt + 3, nb = 6 * bt + 5, nc = 5 * bt + 1; /* 6, 7, 6 blocks */
    make_prompt(a, na, 61);
    make_prompt(b, nb, 62);
    make_prompt(c, nc, 63);
    disagg_prompt_on("pf-cache", a, na, &g);            /* a's 5 full blocks cached */
    double h0 = counter(&PC, "cached_tokens");
    /* a reuse that is never forwarded: its lease pins a's cached blocks */
    fr_req_t *r = send_prefill("pf-cache", "dec-a", a, na, &g);
    assert_true(run_until(p_done_or_error, r, 20));
    assert_false(r->error);
    assert_true(counter(&PC, "cached_tokens") == h0 + 5 * bt);
    /* 7 blocks wanted, 6 free, the rest leased: refused, nothing evicted */
    fr_req_t *rb = send_prefill("pf-cache", "dec-a", b, nb, &g);
    assert_true(run_until(p_done_or_error, rb, 20));
    assert_true(rb->error);
    assert_int_equal(rb->err_status, PD_ERR_NO_KV_SPACE);
    disagg_prompt_on("pf-cache", c, nc, &g);            /* fits beside the lease */
    /* the lease expires: a's blocks are cache again, nothing held */
    assert_true(kv_all_free(&PC, 10));
    /* b now evicts (a's chain is older than c's) and is right */
    disagg_prompt_on("pf-cache", b, nb, &g);
    cJSON *k2 = admin(&PC, "kv");
    assert_non_null(k2);
    assert_true(jnum(k2, "cache", "evicted") >= 5);
    cJSON_Delete(k2);
    /* reuse after eviction: whatever is still cached, the tokens are right */
    disagg_prompt_on("pf-cache", a, na, &g);
    disagg_prompt_on("pf-cache", c, nc, &g);
    disagg_prompt_on("pf-cache", b, nb, &g);
    assert_true(kv_all_free(&PC, 10));
    check_ledger(&PC);
    /* through all that churn (stores, evictions, a lease pinning cached
     * blocks) the router's view from KV_EVENTS converges on the cache:
     * as many names, b's (the newest) among them, a's evicted root not */
    fr_daemon_t *dpc = fr_by_id("pf-cache");
    assert_non_null(dpc);
    g_idx_proc = &PC;
    g_idx_names_n = pd_block_names(bt, dpc->compat, 0, b, nb, g_idx_names, 8);
    assert_int_equal(g_idx_names_n, 6);
    if (!run_until(p_index_matches, dpc, 10))
        fail_msg("router view: %u names, cache %.0f blocks, overflow %d", dpc->n_names,
                 jnum(admin(&PC, "kv"), "cache", "blocks"), dpc->names_overflow);
    assert_true(dpc->n_kve >= 2);
    assert_int_equal(dpc->n_resets, 1); /* the registration's snapshot */
    /* the prefill goes away; a new process serves the same prompts: no
     * cache there, the decode still has a's blocks and pulls only the rest */
    fr_daemon_t *dc = fr_by_id("pf-cache");
    kill_proc(&PC);
    assert_true(run_until(p_closed, dc, 10));
    send_peer_down("dec-a", "pf-cache", dc->incarnation);
    /* (and with its prefix cache switched off: the same tokens, twice) */
    spawn(&PC2, g_prefill_bin, "pf-cache-2", SECRET_HEX,
          (const char *const[]){ "--kv-blocks=12", "--prefix-cache=false", NULL });
    assert_true(run_until(p_registered, "pf-cache-2", 20));
    kv = admin(&PC2, "kv");
    assert_non_null(kv);
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(kv, "prefix_cache")));
    assert_null(cJSON_GetObjectItem(kv, "cache"));
    cJSON_Delete(kv);
    double d0 = counter(&D, "cached_tokens");
    disagg_prompt_on("pf-cache-2", a, na, &g);
    disagg_prompt_on("pf-cache-2", a, na, &g);
    assert_true(counter(&PC2, "cached_tokens") == 0);
    assert_true(counter(&PC2, "computed_tokens") == 2 * na);
    assert_true(counter(&D, "cached_tokens") >= d0 + 2 * 5 * bt);
    assert_true(kv_all_free(&PC2, 10));
    assert_true(kv_all_free(&D, 10));
    kill(PC2.pid, SIGTERM);
    assert_int_equal(wait_exit(&PC2, 20), 0);
}

static void test_disagg_matches_pd_run(void **state)
{
    (void)state;
    samp_t greedy = { 0.0f, 0, 12, false };
    disagg_one(5, 1, &greedy);    /* < 1 block */
    disagg_one(16, 2, &greedy);   /* exactly one block */
    disagg_one(32, 3, &greedy);   /* exactly two blocks */
    disagg_one(41, 4, &greedy);   /* > 2 blocks */
    samp_t hot = { 0.9f, 1234, 10, true };
    disagg_one(23, 5, &hot);      /* sampling: token 0 in prefill, the rest in decode */
    /* penalties + bias + min_p: the decode recomputes them from prompt + generated */
    samp_t pen = { 0.8f, 4321, 12, true, 1.2f, 0.6f, 1.4f, 0.05f, 40, 2.0f };
    disagg_one(23, 6, &pen);
    disagg_one(37, 7, &pen);
    assert_true(kv_all_free(&P, 10));
    assert_true(kv_all_free(&D, 10));
}

static void test_local_matches_pd_run(void **state)
{
    (void)state;
    samp_t greedy = { 0.0f, 0, 10, false };
    samp_t hot = { 0.7f, 99, 9, true };
    /* penalties survive a retry: the replayed tokens are history too */
    samp_t pen = { 0.9f, 77, 10, true, 1.5f, 0.8f, 1.3f, 0.02f, 33, -3.0f };
    const samp_t *ss[] = { &greedy, &hot, &pen };
    uint32_t lens[] = { 7, 16, 50 };
    for (int k = 0; k < 3; k++)
        for (int li = 0; li < 3; li++) {
            int32_t prompt[512], ref[MAX_TOK];
            make_prompt(prompt, lens[li], 10 + (uint32_t)li);
            uint32_t nref = reference(prompt, lens[li], ss[k], ref, MAX_TOK);
            /* all local: decode samples token 0 itself */
            fr_req_t *r = new_req();
            send_decode(r, "dec-a", NULL, prompt, lens[li], NULL, 0, ss[k], true);
            /* a retry with 2 tokens already streamed */
            fr_req_t *r2 = new_req();
            uint32_t given = nref >= 3 ? 2 : 0;
            send_decode(r2, "dec-a", NULL, prompt, lens[li], ref, given, ss[k], true);
            assert_true(run_until(p_final, r, 30));
            assert_true(run_until(p_final, r2, 30));
            assert_false(r->error);
            assert_false(r2->error);
            assert_int_equal(r->n_tokens, nref);
            for (uint32_t i = 0; i < nref; i++)
                assert_int_equal(r->tokens[i], ref[i]);
            assert_int_equal(r2->n_tokens + given, nref);
            for (uint32_t i = given; i < nref; i++)
                assert_int_equal(r2->tokens[i - given], ref[i]);
            assert_int_equal(r2->fin.completion_tokens, nref);
        }
    assert_true(kv_all_free(&D, 10));
}

/* The early hand-off as the decode sees it (kv-stream=layer's router
 * sends DECODE_REQ TOKEN0_LATER before the prompt pass ends; here the
 * handle is a finished one, which the decode treats alike): no TOKENS
 * before FIRST_TOKEN, then pd-run's tokens; a CANCEL before token 0 ends
 * it (the lease released: both pools free); FIRST_TOKEN for an unknown id
 * is dropped, a second one ends the request with an error. */
static void send_first_token(const char *to, fr_req_t *r, int32_t t, const samp_t *s)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_FIRST_TOKEN;
    snprintf(m.u.first_token.request_id, sizeof(m.u.first_token.request_id), "%s", r->id);
    m.u.first_token.first_token = t;
    m.u.first_token.rng_state = rng_after(s, &t, 1);
    fr_send(fr_by_id(to), &m);
}

static void send_decode_early(fr_req_t *r, const char *pf_id, const int32_t *prompt, uint32_t n,
                              const samp_t *s)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_DECODE_REQ;
    proto_decode_req_t *q = &m.u.decode_req;
    snprintf(q->request_id, sizeof(q->request_id), "%s", r->id);
    q->flags = PROTO_DEC_TOKEN0_LATER;
    q->prompt.n = n;
    q->prompt.v = prompt;
    fill_sampling(&q->sampling, s);
    snprintf(q->prefill_peer_id, sizeof(q->prefill_peer_id), "%s", pf_id);
    q->lease_id = r->lease_id;
    q->kv_handle.p = r->handle;
    q->kv_handle.len = r->handle_len;
    fr_send(fr_by_id("dec-a"), &m);
}

static bool p_counter_at_least(void *arg)
{
    const double *want = arg;
    cJSON *j = admin(&D, "requests");
    double v = j != NULL ? jnum(j, "counters", "pulls_ok") : 0;
    cJSON_Delete(j);
    return v >= *want;
}

static void test_token0_later(void **state)
{
    (void)state;
    samp_t hot = { 0.8f, 555, 10, true };
    int32_t prompt[64], ref[MAX_TOK];
    make_prompt(prompt, 37, 77);
    uint32_t nref = reference(prompt, 37, &hot, ref, MAX_TOK);
    assert_true(nref >= 3);
    double early0 = counter(&D, "early_handoffs"), canc0 = counter(&D, "early_canceled");
    fr_req_t *r = send_prefill("pf-a", "dec-a", prompt, 37, &hot);
    assert_true(run_until(p_done_or_error, r, 20));
    assert_false(r->error);
    double want = counter(&D, "pulls_ok") + 1;
    send_decode_early(r, "pf-a", prompt, 37, &hot);
    assert_true(run_until(p_counter_at_least, &want, 20)); /* pulled, then waits */
    assert_int_equal(r->n_tokens, 0);
    assert_false(r->finish || r->error);
    send_first_token("dec-a", r, r->first_token, &hot);
    assert_true(run_until(p_final, r, 30));
    assert_false(r->error);
    assert_int_equal(r->n_tokens + 1, nref);
    for (uint32_t i = 1; i < nref; i++)
        assert_int_equal(r->tokens[i - 1], ref[i]);
    assert_int_equal(r->fin.completion_tokens, nref);
    assert_int_equal(counter(&D, "early_handoffs"), early0 + 1);
    /* FIRST_TOKEN for an ended (unknown) request: dropped, nothing sent */
    fr_req_t *gone = new_req();
    send_first_token("dec-a", gone, 5, &hot);

    /* CANCEL before token 0: ends, the lease goes back, pools free */
    fr_req_t *c = send_prefill("pf-a", "dec-a", prompt, 37, &hot);
    assert_true(run_until(p_done_or_error, c, 20));
    send_decode_early(c, "pf-a", prompt, 37, &hot);
    send_cancel("dec-a", c);
    assert_true(run_until(p_final, c, 20));
    assert_int_equal(c->n_tokens, 0);
    assert_true(c->error || c->fin.reason == PROTO_FINISH_CANCELED);
    assert_int_equal(counter(&D, "early_canceled"), canc0 + 1);
    send_first_token("dec-a", c, c->first_token, &hot); /* late: dropped */

    /* a second token 0: an error that ends the request */
    samp_t longer = { 0.0f, 0, 400, true };
    fr_req_t *t2 = send_prefill("pf-a", "dec-a", prompt, 37, &longer);
    assert_true(run_until(p_done_or_error, t2, 20));
    want = counter(&D, "pulls_ok") + 1;
    send_decode_early(t2, "pf-a", prompt, 37, &longer);
    assert_true(run_until(p_counter_at_least, &want, 20)); /* the KV waits for token 0 */
    send_first_token("dec-a", t2, t2->first_token, &longer);
    assert_true(run_until(p_has_tokens, t2, 20));
    /* requests: the landed pull waited for FIRST_TOKEN, not the reverse */
    cJSON *j = admin(&D, "requests"), *o, *mine = NULL;
    cJSON_ArrayForEach(o, cJSON_GetObjectItemCaseSensitive(j, "requests"))
        if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "request_id")),
                   t2->id) == 0)
            mine = o;
    assert_non_null(mine);
    assert_true(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(mine, "first_token_wait_ns")) > 0);
    assert_true(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(mine,
                                                                      "pull_after_first_token_ns")) == 0);
    cJSON_Delete(j);
    send_first_token("dec-a", t2, t2->first_token, &longer);
    assert_true(run_until(p_final, t2, 20));
    assert_true(t2->error || (t2->finish && (t2->fin.reason == PROTO_FINISH_ERROR ||
                                             t2->fin.reason == PROTO_FINISH_CANCELED)));
    assert_true(t2->n_tokens < 399);
    assert_false(gone->finish || gone->error);
    assert_true(kv_all_free(&D, 10));
    assert_true(kv_all_free(&P, 10));
}

static void test_cancel_mid_decode(void **state)
{
    (void)state;
    samp_t s = { 0.0f, 0, 600, true };
    int32_t prompt[64];
    make_prompt(prompt, 20, 30);
    fr_req_t *r = send_prefill("pf-a", "dec-a", prompt, 20, &s);
    assert_true(run_until(p_done_or_error, r, 20));
    assert_false(r->error);
    send_decode(r, "dec-a", "pf-a", prompt, 20, &r->first_token, 1, &s, false);
    assert_true(run_until(p_has_tokens, r, 20));
    assert_false(r->finish);
    send_cancel("dec-a", r);
    assert_true(run_until(p_final, r, 20));
    assert_true(r->finish);
    assert_int_equal(r->fin.reason, PROTO_FINISH_CANCELED);
    /* a CANCEL for a finished request is ignored; and a local one, too */
    fr_req_t *r2 = new_req();
    send_decode(r2, "dec-a", NULL, prompt, 20, NULL, 0, &s, true);
    assert_true(run_until(p_has_tokens, r2, 20));
    send_cancel("dec-a", r2);
    assert_true(run_until(p_final, r2, 20));
    assert_int_equal(r2->fin.reason, PROTO_FINISH_CANCELED);
    assert_true(kv_all_free(&D, 10));
    assert_true(kv_all_free(&P, 10));
}

static void test_lease_expiry(void **state)
{
    (void)state;
    spawn(&PL, g_prefill_bin, "pf-lease", SECRET_HEX,
          (const char *const[]){ "--lease-ttl=300ms", NULL });
    assert_true(run_until(p_registered, "pf-lease", 20));
    samp_t s = { 0.0f, 0, 4, false };
    int32_t prompt[64];
    make_prompt(prompt, 40, 40);
    fr_req_t *r = send_prefill("pf-lease", "dec-a", prompt, 40, &s);
    assert_true(run_until(p_done_or_error, r, 20));
    assert_false(r->error);
    cJSON *j = admin(&PL, "kv");
    assert_non_null(j);
    assert_true(jnum(j, "leased", NULL) == 3);
    cJSON_Delete(j);
    /* never forwarded: the lease expires and the blocks come back */
    assert_true(kv_all_free(&PL, 10));
    j = admin(&PL, "requests");
    assert_true(jnum(j, "counters", "failed") == 1);
    cJSON_Delete(j);
    check_ledger(&PL);
    /* CANCEL while leased (client went away): revoked at once */
    fr_req_t *r2 = send_prefill("pf-lease", "dec-a", prompt, 40, &s);
    assert_true(run_until(p_done_or_error, r2, 20));
    send_cancel("pf-lease", r2);
    assert_true(kv_all_free(&PL, 10));
    check_ledger(&PL);
    /* idle SIGTERM: clean exit (sanitizer builds: no leaks) */
    kill(PL.pid, SIGTERM);
    assert_int_equal(wait_exit(&PL, 20), 0);
}

static void send_peer_down(const char *to, const char *id, uint64_t incarnation)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_PEER_DOWN;
    snprintf(m.u.peer_down.daemon_id, sizeof(m.u.peer_down.daemon_id), "%s", id);
    m.u.peer_down.incarnation = incarnation;
    m.u.peer_down.status = PD_ERR_PEER_GONE;
    fr_send(fr_by_id(to), &m);
}

static void test_prefill_killed_before_pull(void **state)
{
    (void)state;
    spawn(&PK, g_prefill_bin, "pf-kill", SECRET_HEX, NULL);
    assert_true(run_until(p_registered, "pf-kill", 20));
    samp_t s = { 0.0f, 0, 6, false };
    int32_t prompt[64], ref[MAX_TOK];
    make_prompt(prompt, 33, 50);
    uint32_t nref = reference(prompt, 33, &s, ref, MAX_TOK);
    fr_req_t *r = send_prefill("pf-kill", "dec-a", prompt, 33, &s);
    fr_req_t *r2 = send_prefill("pf-kill", "dec-a", prompt, 33, &s);
    assert_true(run_until(p_done_or_error, r, 20));
    assert_true(run_until(p_done_or_error, r2, 20));
    assert_false(r->error);
    assert_false(r2->error);
    fr_daemon_t *dk = fr_by_id("pf-kill");
    uint64_t inc = dk->incarnation;
    kill_proc(&PK);
    assert_true(run_until(p_closed, dk, 10));
    /* before the router's PEER_DOWN: the pull either fails within the
     * transfer timeout or (same-host shared memory outlives the process)
     * lands the right bytes; never a hang, never wrong tokens */
    uint64_t t0 = pd_now_ns();
    send_decode(r, "dec-a", "pf-kill", prompt, 33, &r->first_token, 1, &s, false);
    assert_true(run_until(p_final, r, 10));
    /* within the 2 s transfer timeout, with room for a loaded machine */
    uint64_t end_ms = (pd_now_ns() - t0) / PD_NS_PER_MS;
    if (end_ms > 2000 + 6000)
        fail_msg("the pull from the lost prefill ended after %llu ms, want <= 8000 "
                 "(transfer timeout 2 s)", (unsigned long long)end_ms);
    if (r->error) {
        if (!(r->err_status == PD_ERR_PEER_GONE || r->err_status == PD_ERR_TIMED_OUT ||
              r->err_status == PD_ERR_TRANSPORT || r->err_status == PD_ERR_STALE))
            fprintf(stderr, "pull to a killed prefill ended with %s\n",
                    pd_status_name(r->err_status));
        assert_true(r->err_status == PD_ERR_PEER_GONE || r->err_status == PD_ERR_TIMED_OUT ||
                    r->err_status == PD_ERR_TRANSPORT || r->err_status == PD_ERR_STALE);
    } else {
        assert_int_equal(r->n_tokens + 1, nref);
        for (uint32_t i = 1; i < nref; i++)
            assert_int_equal(r->tokens[i - 1], ref[i]);
    }
    /* after PEER_DOWN (what the router sends when the prefill's connection
     * dies): the handle is refused at once with PEER_GONE */
    send_peer_down("dec-a", "pf-kill", inc);
    t0 = pd_now_ns();
    send_decode(r2, "dec-a", "pf-kill", prompt, 33, &r2->first_token, 1, &s, false);
    assert_true(run_until(p_final, r2, 10));
    assert_true(r2->error);
    assert_int_equal(r2->err_status, PD_ERR_PEER_GONE);
    assert_true(pd_now_ns() - t0 < 2000000000ull);
    assert_true(kv_all_free(&D, 10));
}

/* Handles the decode will not pull still give the prefill its blocks back
 * at once (not after the 30 s lease): max_tokens 1 (token 0 ends it) and a
 * request refused for KV space. */
static void test_handle_released_without_pull(void **state)
{
    (void)state;
    int32_t prompt[64];
    make_prompt(prompt, 30, 95);
    samp_t one = { 0.0f, 0, 1, false };
    fr_req_t *r = send_prefill("pf-a", "dec-a", prompt, 30, &one);
    assert_true(run_until(p_done_or_error, r, 20));
    assert_false(r->error);
    send_decode(r, "dec-a", "pf-a", prompt, 30, &r->first_token, 1, &one, false);
    assert_true(run_until(p_final, r, 20));
    assert_true(r->finish);
    assert_int_equal(r->fin.reason, PROTO_FINISH_LENGTH);
    assert_int_equal(r->fin.completion_tokens, 1);
    assert_int_equal(r->n_tokens, 0);
    samp_t huge = { 0.0f, 0, 3000, true }; /* 3030 tokens > 64 blocks of 16 */
    fr_req_t *r2 = send_prefill("pf-a", "dec-a", prompt, 30, &huge);
    assert_true(run_until(p_done_or_error, r2, 20));
    assert_false(r2->error);
    send_decode(r2, "dec-a", "pf-a", prompt, 30, &r2->first_token, 1, &huge, false);
    assert_true(run_until(p_final, r2, 20));
    assert_true(r2->error);
    assert_int_equal(r2->err_status, PD_ERR_NO_KV_SPACE);
    assert_true(kv_all_free(&P, 5));
    assert_true(kv_all_free(&D, 5));
}

/* Bad inputs get an ERROR (never a crash, never a hang): replayed and
 * garbage handles, out-of-range tokens, duplicate ids, wrong message types. */
static void test_bad_inputs(void **state)
{
    (void)state;
    int32_t prompt[64];
    make_prompt(prompt, 20, 97);
    samp_t g = { 0.0f, 0, 4, false };
    fr_req_t *r = send_prefill("pf-a", "dec-a", prompt, 20, &g);
    assert_true(run_until(p_done_or_error, r, 20));
    send_decode(r, "dec-a", "pf-a", prompt, 20, &r->first_token, 1, &g, false);
    assert_true(run_until(p_final, r, 20));
    assert_true(r->finish);
    /* the same (released) handle again, under a new request id */
    fr_req_t *r2 = new_req();
    memcpy(r2->handle, r->handle, r->handle_len);
    r2->handle_len = r->handle_len;
    send_decode(r2, "dec-a", "pf-a", prompt, 20, &r->first_token, 1, &g, false);
    assert_true(run_until(p_final, r2, 20));
    assert_true(r2->error);
    /* garbage handle */
    fr_req_t *r3 = new_req();
    for (uint32_t i = 0; i < 100; i++)
        r3->handle[i] = (uint8_t)(i * 37 + 5);
    r3->handle_len = 100;
    send_decode(r3, "dec-a", "pf-a", prompt, 20, &r->first_token, 1, &g, false);
    assert_true(run_until(p_final, r3, 20));
    assert_true(r3->error);
    /* token id beyond the vocabulary, to both daemons */
    int32_t badp[3] = { 1, 5000, 2 };
    fr_req_t *r4 = send_prefill("pf-a", "dec-a", badp, 3, &g);
    assert_true(run_until(p_done_or_error, r4, 20));
    assert_true(r4->error);
    assert_int_equal(r4->err_status, PD_ERR_BAD_INPUT);
    fr_req_t *r5 = new_req();
    send_decode(r5, "dec-a", NULL, badp, 3, NULL, 0, &g, true);
    assert_true(run_until(p_final, r5, 20));
    assert_true(r5->error);
    assert_int_equal(r5->err_status, PD_ERR_BAD_INPUT);
    /* a sampler state that does not match the replay */
    fr_req_t *r6 = new_req();
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_DECODE_REQ;
    snprintf(m.u.decode_req.request_id, sizeof(m.u.decode_req.request_id), "%s", r6->id);
    m.u.decode_req.flags = PROTO_DEC_PREFILL_LOCALLY;
    m.u.decode_req.prompt.n = 20;
    m.u.decode_req.prompt.v = prompt;
    fill_sampling(&m.u.decode_req.sampling, &g);
    m.u.decode_req.rng_state = 12345;
    fr_send(fr_by_id("dec-a"), &m);
    assert_true(run_until(p_final, r6, 20));
    assert_true(r6->error);
    assert_int_equal(r6->err_status, PD_ERR_MISMATCH);
    /* a message type the daemon does not serve is dropped, it stays up */
    proto_msg_t w;
    memset(&w, 0, sizeof(w));
    w.hdr.type = PROTO_MSG_RELEASE;
    snprintf(w.u.release.request_id, sizeof(w.u.release.request_id), "nope");
    fr_send(fr_by_id("dec-a"), &w);
    /* duplicate live id: the second one is refused, the first completes */
    samp_t longer = { 0.0f, 0, 60, true };
    fr_req_t *r7 = new_req();
    /* back to back: the daemon admits the first before it reads the
     * second (waiting for its tokens raced its end on a loaded host) */
    send_decode(r7, "dec-a", NULL, prompt, 20, NULL, 0, &longer, true);
    send_decode(r7, "dec-a", NULL, prompt, 20, NULL, 0, &longer, true);
    assert_true(run_until(p_final, r7, 20)); /* the original ends exactly once */
    assert_true(r7->exists_err);
    assert_true(r7->finish);
    assert_true(kv_all_free(&D, 10));
    assert_true(kv_all_free(&P, 10));
}

static bool p_out_empty(void *arg)
{
    fr_daemon_t *d = arg;
    return d->closed || proto_conn_out_len(d->conn) == 0;
}

/* Wait for every answer; RELEASE the leases made for decodes that will
 * never pull them. */
static void release_leases(fr_req_t **sent, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        fr_req_t *r = sent[i];
        if (!r->finish && !r->error && !r->done)
            (void)run_until(p_final, r, 20);
        if (r->done) {
            proto_msg_t m;
            memset(&m, 0, sizeof(m));
            m.hdr.type = PROTO_MSG_RELEASE;
            snprintf(m.u.release.request_id, sizeof(m.u.release.request_id), "%s", r->id);
            fr_send(fr_by_id("pf-a"), &m);
        }
    }
}

/* Every message type in its MIN/MID/MAX sample form (valid frames, hostile
 * values: 1M-token prompts, foreign handles, garbage kv_addr...) to both
 * daemons: each request they accept ends exactly once, nothing crashes,
 * pools come back, ledgers hold. Registration messages come last: they
 * make a registered daemon drop the connection and register again. */
static void test_sample_messages(void **state)
{
    (void)state;
    const char *targets[] = { "pf-a", "dec-a" };
    fr_req_t *sent[64];
    unsigned n_sent = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int t = 0; t < PROTO_MSG_COUNT; t++) {
            uint16_t type = ps_types[t];
            bool reg = type == PROTO_MSG_HELLO || type == PROTO_MSG_REGISTER_ACK ||
                       type == PROTO_MSG_REGISTER_REJECT || type == PROTO_MSG_CHALLENGE;
            if (reg != (pass == 1))
                continue;
            for (int v = 0; v < PS_VARIANTS; v++)
                for (int k = 0; k < 2; k++) {
                    proto_msg_t m;
                    ps_make(type, v, &m);
                    m.hdr.flags = 0;
                    fr_req_t *r = new_req();
                    char *rid = NULL;
                    switch (type) {
                    case PROTO_MSG_PREFILL_REQ: rid = m.u.prefill_req.request_id; break;
                    case PROTO_MSG_DECODE_REQ:  rid = m.u.decode_req.request_id; break;
                    case PROTO_MSG_CANCEL:      rid = m.u.cancel.request_id; break;
                    case PROTO_MSG_RELEASE:     rid = m.u.release.request_id; break;
                    case PROTO_MSG_KV_EXPORT_REQ: rid = m.u.kv_export_req.request_id; break;
                    case PROTO_MSG_EMBED_REQ:   rid = m.u.embed_req.request_id; break;
                    default: break;
                    }
                    if (rid != NULL)
                        snprintf(rid, PROTO_REQID_MAX + 1, "%s", r->id);
                    bool answers = (type == PROTO_MSG_PREFILL_REQ && k == 0) ||
                                   (type == PROTO_MSG_DECODE_REQ && k == 1);
                    if (answers && n_sent < 64)
                        sent[n_sent++] = r;
                    assert_true(run_until(p_registered, (void *)targets[k], 20));
                    fr_daemon_t *d = fr_by_id(targets[k]);
                    assert_true(run_until(p_out_empty, d, 20));
                    (void)proto_conn_send(d->conn, &m);
                    if (reg) /* a registered daemon drops the connection, comes back */
                        assert_true(run_until(p_closed, d, 20));
                }
            if (pass == 0)
                release_leases(sent, n_sent);
        }
    for (int k = 0; k < 2; k++)
        assert_true(run_until(p_registered, (void *)targets[k], 20));
    assert_true(kv_all_free(&P, 20));
    assert_true(kv_all_free(&D, 20));
    check_ledger(&P);
    check_ledger(&D);
    /* still serving correctly */
    samp_t g = { 0.0f, 0, 6, false };
    disagg_one(18, 99, &g);
}

/* Several sequences at once (disaggregated and local, different lengths):
 * continuous batching must not change any sequence's tokens. */
static void test_concurrent_batch(void **state)
{
    (void)state;
    enum { N = 6 };
    samp_t s = { 0.0f, 0, 14, true };
    int32_t prompts[N][128], refs[N][MAX_TOK];
    uint32_t lens[N] = { 3, 17, 48, 9, 31, 64 }, nref[N];
    fr_req_t *rs[N];
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], lens[i], 60 + (uint32_t)i);
        nref[i] = reference(prompts[i], lens[i], &s, refs[i], MAX_TOK);
    }
    for (int i = 0; i < N; i++) {
        if (i % 2 == 0) {
            rs[i] = send_prefill("pf-a", "dec-a", prompts[i], lens[i], &s);
        } else {
            rs[i] = new_req();
            send_decode(rs[i], "dec-a", NULL, prompts[i], lens[i], NULL, 0, &s, true);
        }
    }
    for (int i = 0; i < N; i += 2) {
        assert_true(run_until(p_done_or_error, rs[i], 20));
        assert_false(rs[i]->error);
        send_decode(rs[i], "dec-a", "pf-a", prompts[i], lens[i], &rs[i]->first_token, 1, &s,
                    false);
    }
    for (int i = 0; i < N; i++) {
        assert_true(run_until(p_final, rs[i], 30));
        assert_false(rs[i]->error);
        uint32_t off = i % 2 == 0 ? 1 : 0;
        assert_int_equal(rs[i]->n_tokens + off, nref[i]);
        for (uint32_t k = off; k < nref[i]; k++)
            assert_int_equal(rs[i]->tokens[k - off], refs[i][k]);
    }
    assert_true(kv_all_free(&D, 10));
    assert_true(kv_all_free(&P, 10));
}

static bool p_state(proc_t *p, const char *id, const char *state)
{
    cJSON *j = admin(p, "requests");
    bool ok = false;
    cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "requests"), *o;
    cJSON_ArrayForEach(o, a) {
        const cJSON *rid = cJSON_GetObjectItemCaseSensitive(o, "request_id");
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "state");
        if (cJSON_IsString(rid) && strcmp(rid->valuestring, id) == 0 && cJSON_IsString(st))
            ok = strcmp(st->valuestring, state) == 0;
    }
    cJSON_Delete(j);
    return ok;
}

/* Two requests that each reserve most of the pool: the second waits (no
 * KV exhaustion mid-stream), starts when the first ends, and is correct. */
static void test_wait_queue(void **state)
{
    (void)state;
    samp_t big = { 0.0f, 0, 600, true };   /* 620 tokens -> 39 of 64 blocks */
    samp_t s2 = { 0.0f, 0, 600, true };
    int32_t prompt[64], ref[MAX_TOK];
    make_prompt(prompt, 20, 70);
    uint32_t nref = reference(prompt, 20, &s2, ref, MAX_TOK);
    fr_req_t *a = new_req(), *b = new_req();
    send_decode(a, "dec-a", NULL, prompt, 20, NULL, 0, &big, true);
    assert_true(run_until(p_has_tokens, a, 20));
    send_decode(b, "dec-a", NULL, prompt, 20, NULL, 0, &s2, true);
    uint64_t end = pd_now_ns() + 10000000000ull;
    bool waiting = false;
    while (!waiting && pd_now_ns() < end && !b->finish && !b->error) {
        waiting = p_state(&D, b->id, "waiting");
        if (!waiting)
            event_base_loop(fr.base, EVLOOP_ONCE);
    }
    assert_true(waiting);
    assert_int_equal(b->n_tokens, 0);
    send_cancel("dec-a", a);
    assert_true(run_until(p_final, a, 20));
    assert_int_equal(a->fin.reason, PROTO_FINISH_CANCELED);
    assert_true(run_until(p_final, b, 60));
    assert_false(b->error);
    assert_int_equal(b->n_tokens, nref);
    for (uint32_t i = 0; i < nref; i++)
        assert_int_equal(b->tokens[i], ref[i]);
    assert_true(b->fin.queue_ns > 0);
    assert_true(kv_all_free(&D, 10));
}

static bool p_renewed(void *arg)
{
    cJSON *j = admin(&PR, "xfer");
    double n = jnum(cJSON_GetObjectItemCaseSensitive(j, "xfer"), "total", "leases_renewed");
    cJSON_Delete(j);
    return n >= *(double *)arg;
}

/* A disaggregated request waits for KV room longer than its prefill lease
 * lives: decode renews the lease while it waits (prefill's renew counter
 * goes up), and the pull afterwards succeeds with the right tokens. With
 * kv-stream=whole the handle states the lease's TTL and the renewals come
 * every half of it (three outlive it); with layer the handle states the
 * prompt pass's TTL while the lease became lease-ttl at PREFILL_DONE, so
 * the decode renews at once (it used to wait half the stated TTL, and the
 * pull found the lease gone: "stale generation"). */
static bool p_never(void *arg)
{
    (void)arg;
    return false;
}

static void lease_renew_scenario(const char *stream, double renewals)
{
    if (g_sim) /* the sim engine's blocker request ends too fast to wait on */
        skip();
    spawn(&PR, g_prefill_bin, "pf-renew", SECRET_HEX,
          (const char *const[]){ "--lease-ttl=100ms", stream, NULL });
    assert_true(run_until(p_registered, "pf-renew", 20));
    samp_t big = { 0.0f, 0, 900, true };   /* 920 tokens -> 58 of 64 blocks */
    samp_t s = { 0.0f, 0, 200, true };     /* 220 tokens -> 14 blocks: waits */
    int32_t prompt[64], ref[MAX_TOK];
    make_prompt(prompt, 20, 90);
    uint32_t nref = reference(prompt, 20, &s, ref, MAX_TOK);
    fr_req_t *a = new_req();
    send_decode(a, "dec-a", NULL, prompt, 20, NULL, 0, &big, true);
    assert_true(run_until(p_has_tokens, a, 20));
    fr_req_t *b = send_prefill("pf-renew", "dec-a", prompt, 20, &s);
    assert_true(run_until(p_done_or_error, b, 20));
    assert_false(b->error);
    send_decode(b, "dec-a", "pf-renew", prompt, 20, &b->first_token, 1, &s, false);
    assert_true(run_until(p_renewed, &renewals, 20));
    (void)run_until(p_never, NULL, 0.3); /* three lease-ttls more, serving meanwhile */
    assert_true(p_state(&D, b->id, "waiting"));
    assert_false(a->finish || a->error);
    send_cancel("dec-a", a);
    assert_true(run_until(p_final, a, 20));
    assert_true(run_until(p_final, b, 60));
    assert_false(b->error);
    assert_int_equal(b->n_tokens + 1, nref);
    for (uint32_t i = 1; i < nref; i++)
        assert_int_equal(b->tokens[i - 1], ref[i]);
    assert_true(b->fin.queue_ns > 100000000ull); /* waited longer than the TTL */
    assert_true(kv_all_free(&D, 10));
    assert_true(kv_all_free(&PR, 10));
    check_ledger(&PR);
    fr_daemon_t *dr = fr_by_id("pf-renew");
    uint64_t inc = dr->incarnation;
    kill_proc(&PR);
    assert_true(run_until(p_closed, dr, 10));
    send_peer_down("dec-a", "pf-renew", inc); /* as the router would: decode drops the peer */
}

static void test_lease_renew_while_waiting(void **state)
{
    (void)state;
    lease_renew_scenario("--kv-stream=whole", 3); /* every ttl/2: three outlive the TTL */
}

static void test_lease_renew_streamed(void **state)
{
    (void)state;
    lease_renew_scenario("--kv-stream=layer", 1);
}

/* kv-stream=layer exports the lease before the prompt pass, but it lasts
 * lease-ttl from PREFILL_DONE, as for a whole export: a prompt pass four
 * times longer than lease-ttl with no decode renewing it (a router that
 * waits for PREFILL_DONE) still ends in PREFILL_DONE, not "kv lease ended
 * during prefill", and the lease expires lease-ttl later with every block
 * free. (Sim engine: its prompt pass takes n / prefill_tps.) */
static void test_stream_lease_ttl_from_done(void **state)
{
    (void)state;
    if (!g_sim)
        skip();
    char model[700];
    snprintf(model, sizeof(model), "--model=%s", g_model);
    char *ns = strstr(model, ",no_sleep=1");
    if (ns != NULL)
        memmove(ns, ns + 11, strlen(ns + 11) + 1);
    snprintf(model + strlen(model), sizeof(model) - strlen(model), ",prefill_tps=100");
    spawn(&PSL, g_prefill_bin, "pf-slowstream", SECRET_HEX,
          (const char *const[]){ model, "--kv-stream=layer", "--lease-ttl=100ms", NULL });
    assert_true(run_until(p_registered, "pf-slowstream", 20));
    samp_t s = { 0.0f, 0, 4, true };
    int32_t prompt[64];
    make_prompt(prompt, 40, 77); /* 40 tokens at 100/s: a 400 ms prompt pass */
    uint64_t t0 = pd_now_ns();
    fr_req_t *r = send_prefill("pf-slowstream", "dec-a", prompt, 40, &s);
    assert_true(run_until(p_done_or_error, r, 20));
    assert_false(r->error);
    assert_true(r->done);
    assert_true(pd_now_ns() - t0 > 300000000ull); /* the pass outlived the TTL */
    assert_true(kv_all_free(&PSL, 10)); /* the lease expired, nobody pulled */
    check_ledger(&PSL);
    fr_daemon_t *d = fr_by_id("pf-slowstream");
    kill_proc(&PSL);
    assert_true(run_until(p_closed, d, 10));
}

/* The router connection drops: both daemons cancel everything, free their
 * blocks and register again. */
static void test_router_loss(void **state)
{
    (void)state;
    samp_t s = { 0.0f, 0, 600, true };
    int32_t prompt[64];
    make_prompt(prompt, 40, 80);
    fr_req_t *a = new_req();
    send_decode(a, "dec-a", NULL, prompt, 40, NULL, 0, &s, true);
    fr_req_t *b = send_prefill("pf-a", "dec-a", prompt, 40, &s); /* leased, never pulled */
    assert_true(run_until(p_has_tokens, a, 20));
    assert_true(run_until(p_done_or_error, b, 20));
    fr_daemon_t *dd = fr_by_id("dec-a"), *pd = fr_by_id("pf-a");
    proto_conn_close(dd->conn, PD_ERR_SHUTDOWN);
    proto_conn_close(pd->conn, PD_ERR_SHUTDOWN);
    assert_true(run_until(p_closed, dd, 10));
    assert_true(run_until(p_closed, pd, 10));
    assert_true(run_until(p_registered, "dec-a", 20));
    assert_true(run_until(p_registered, "pf-a", 20));
    assert_true(kv_all_free(&D, 10));
    assert_true(kv_all_free(&P, 10));
    /* and serving works again */
    samp_t g = { 0.0f, 0, 5, false };
    disagg_one(12, 81, &g);
    /* a router that stops heartbeating is dropped after 3-4 intervals
     * (500 ms here), then the daemons register again */
    event_del(fr.hb_ev);
    dd = fr_by_id("dec-a");
    pd = fr_by_id("pf-a");
    uint64_t t0 = pd_now_ns();
    assert_true(run_until(p_closed, dd, 10));
    assert_true(run_until(p_closed, pd, 10));
    /* 3-4 intervals nominally; the bound only catches a daemon that never
     * notices (a loaded machine runs timers late: 3.5 s was a flake) */
    uint64_t gone_ms = (pd_now_ns() - t0) / PD_NS_PER_MS;
    if (gone_ms > 8000)
        fail_msg("daemons dropped the silent router after %llu ms, want <= 8000",
                 (unsigned long long)gone_ms);
    struct timeval hb = { 0, 200000 };
    event_add(fr.hb_ev, &hb);
    assert_true(run_until(p_registered, "dec-a", 20));
    assert_true(run_until(p_registered, "pf-a", 20));
    disagg_one(20, 82, &g);
}

/* SIGSTOP the prefill past the transfer deadline: the pull ends within the
 * deadline (TIMED_OUT over tcp; shared memory may still serve the bytes:
 * then the tokens must be right); after SIGCONT the prefill's pool is free. */
static void test_prefill_stopped(void **state)
{
    (void)state;
    /* a timed-out pull may leave the lease to expire (its release cannot
     * reach a peer whose endpoint was closed): keep the TTL short */
    spawn(&PS, g_prefill_bin, "pf-stop", SECRET_HEX,
          (const char *const[]){ "--lease-ttl=4s", NULL });
    assert_true(run_until(p_registered, "pf-stop", 20));
    samp_t s = { 0.0f, 0, 6, true };
    int32_t prompt[64], ref[MAX_TOK];
    make_prompt(prompt, 35, 120);
    uint32_t nref = reference(prompt, 35, &s, ref, MAX_TOK);
    fr_req_t *r = send_prefill("pf-stop", "dec-a", prompt, 35, &s);
    assert_true(run_until(p_done_or_error, r, 20));
    assert_false(r->error);
    kill(PS.pid, SIGSTOP);
    uint64_t t0 = pd_now_ns();
    send_decode(r, "dec-a", "pf-stop", prompt, 35, &r->first_token, 1, &s, false);
    assert_true(run_until(p_final, r, 10));
    /* within the 2 s transfer timeout, with room for a loaded machine */
    uint64_t end_ms = (pd_now_ns() - t0) / PD_NS_PER_MS;
    if (end_ms > 2000 + 6000)
        fail_msg("the pull from the lost prefill ended after %llu ms, want <= 8000 "
                 "(transfer timeout 2 s)", (unsigned long long)end_ms);
    if (r->error) {
        assert_true(r->err_status == PD_ERR_TIMED_OUT || r->err_status == PD_ERR_PEER_GONE ||
                    r->err_status == PD_ERR_TRANSPORT);
    } else {
        assert_int_equal(r->n_tokens + 1, nref);
        for (uint32_t i = 1; i < nref; i++)
            assert_int_equal(r->tokens[i - 1], ref[i]);
    }
    assert_true(kv_all_free(&D, 10));
    kill(PS.pid, SIGCONT);
    /* released (shm pull done, or release AM) or expired (4 s) */
    assert_true(kv_all_free(&PS, 20));
    kill(PS.pid, SIGTERM);
    assert_int_equal(wait_exit(&PS, 20), 0);
}

/* ---- several routers: one decode, two sessions with (here) one router ------ */

typedef struct {
    const char *id;
    int n;
} p_sessions_t;

static bool p_sessions(void *arg)
{
    p_sessions_t *ps = arg;
    int n = 0;
    for (int i = 0; i < MAX_DAEMONS; i++)
        n += fr.d[i].used && fr.d[i].registered && !fr.d[i].closed &&
             strcmp(fr.d[i].id, ps->id) == 0;
    return n == ps->n;
}

static fr_daemon_t *fr_session(const char *id, int k)
{
    for (int i = 0; i < MAX_DAEMONS; i++)
        if (fr.d[i].used && fr.d[i].registered && !fr.d[i].closed &&
            strcmp(fr.d[i].id, id) == 0 && k-- == 0)
            return &fr.d[i];
    return NULL;
}

static void send_local_on(fr_daemon_t *d, const char *id, const int32_t *prompt, uint32_t n,
                          uint32_t max_tokens)
{
    samp_t s = { 0.0f, 0, max_tokens, true };
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_DECODE_REQ;
    snprintf(m.u.decode_req.request_id, sizeof(m.u.decode_req.request_id), "%s", id);
    m.u.decode_req.flags = PROTO_DEC_PREFILL_LOCALLY;
    m.u.decode_req.prompt.n = n;
    m.u.decode_req.prompt.v = prompt;
    fill_sampling(&m.u.decode_req.sampling, &s);
    fr_send(d, &m);
}

static void cancel_on(fr_daemon_t *d, const char *id)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_CANCEL;
    snprintf(m.u.cancel.request_id, sizeof(m.u.cancel.request_id), "%s", id);
    m.u.cancel.status = PD_ERR_CANCELED;
    fr_send(d, &m);
}

typedef struct {
    proto_conn_t *c;
    const char *id;
    unsigned tokens;                    /* at least this many tokens, or an end */
} p_mx_t;

static bool p_mx(void *arg)
{
    p_mx_t *p = arg;
    for (unsigned i = 0; i < fr.n_mx; i++)
        if (fr.mx[i].conn == p->c && strcmp(fr.mx[i].id, p->id) == 0)
            return fr.mx[i].finishes + fr.mx[i].errors > 0 || fr.mx[i].tokens >= p->tokens;
    return false;
}

static void *mx_of(proto_conn_t *c, const char *id)
{
    for (unsigned i = 0; i < fr.n_mx; i++)
        if (fr.mx[i].conn == c && strcmp(fr.mx[i].id, id) == 0)
            return &fr.mx[i];
    return NULL;
}

static bool p_routers_up2(void *arg)
{
    cJSON *j = admin(arg, "session");
    bool ok = (int)jnum(j, "routers_up", NULL) == 2;
    cJSON_Delete(j);
    return ok;
}

/* Also after a failure: the fake router back to one session per daemon. */
static int two_sessions_end(void **state)
{
    (void)state;
    kill_proc(&D2S);
    fr.multi = false;
    for (int i = 0; i < MAX_DAEMONS; i++)
        if (fr.d[i].used && strcmp(fr.d[i].id, "dec-2s") == 0)
            fr.d[i].used = false;
    return 0;
}

/* A decode with `--router=A,B` (two addresses of this fake router: two
 * sessions, as with two routers). Router-generated ids are only unique per
 * router: the same id on both sessions is two requests, each answered on
 * its own session; a CANCEL reaches only its session's request; losing one
 * session ends only that session's requests. */
static void test_two_sessions(void **state)
{
    (void)state;
    fr.multi = true;
    fr.n_mx = 0;
    char routers[80];
    snprintf(routers, sizeof(routers), "--router=127.0.0.1:%u,localhost:%u", fr.port, fr.port);
    spawn(&D2S, g_decode_bin, "dec-2s", SECRET_HEX,
          (const char *const[]){ routers, "--max-batch=8", NULL });
    p_sessions_t two = { "dec-2s", 2 };
    assert_true(run_until(p_sessions, &two, 20));
    fr_daemon_t *a = fr_session("dec-2s", 0), *b = fr_session("dec-2s", 1);
    assert_non_null(a);
    assert_non_null(b);
    int32_t prompt[64];
    make_prompt(prompt, 12, 91);
    /* the same id on both sessions: two requests, no EXISTS */
    send_local_on(a, "same-1", prompt, 12, 600);
    send_local_on(b, "same-1", prompt, 12, 5);
    p_mx_t pb = { b->conn, "same-1", 1000 }, pa = { a->conn, "same-1", 3 };
    assert_true(run_until(p_mx, &pb, 20));
    assert_true(run_until(p_mx, &pa, 20));
    typeof(fr.mx[0]) *xb = mx_of(b->conn, "same-1"), *xa = mx_of(a->conn, "same-1");
    assert_non_null(xa);
    assert_non_null(xb);
    assert_int_equal(xb->errors, 0);
    assert_int_equal(xb->finishes, 1);
    assert_int_equal(xb->reason, PROTO_FINISH_LENGTH);
    assert_int_equal(xb->completion, 5);
    assert_int_equal(xa->errors + xa->finishes, 0);  /* a's still runs */
    /* CANCEL on b (its request is over): a's is not touched */
    cancel_on(b, "same-1");
    unsigned before = xa->tokens;
    pa.tokens = before + 3;
    assert_true(run_until(p_mx, &pa, 20));
    assert_int_equal(xa->finishes + xa->errors, 0);
    cancel_on(a, "same-1");
    pa.tokens = 100000;
    assert_true(run_until(p_mx, &pa, 20));
    assert_int_equal(xa->finishes, 1);
    assert_int_equal(xa->reason, PROTO_FINISH_CANCELED);
    /* one session lost: only its requests end */
    send_local_on(a, "same-2", prompt, 12, 40);
    send_local_on(b, "same-2", prompt, 12, 600);
    p_mx_t pb2 = { b->conn, "same-2", 2 };
    assert_true(run_until(p_mx, &pb2, 20));
    proto_conn_t *bconn = b->conn;
    proto_conn_close(bconn, PD_ERR_SHUTDOWN);
    assert_true(run_until(p_closed, b, 10));
    p_mx_t pa2 = { a->conn, "same-2", 100000 };
    assert_true(run_until(p_mx, &pa2, 30));
    typeof(fr.mx[0]) *xa2 = mx_of(a->conn, "same-2");
    assert_int_equal(xa2->finishes, 1);
    assert_int_equal(xa2->reason, PROTO_FINISH_LENGTH);
    assert_int_equal(xa2->completion, 40);
    /* the lost session comes back; the pool is whole again */
    assert_true(run_until(p_sessions, &two, 20));
    assert_true(run_until(p_routers_up2, &D2S, 10)); /* the daemon took the ACK */
    assert_true(kv_all_free(&D2S, 10));

    /* PEER_DOWN from one router: the prefill lost that router, it is not
     * gone (both sessions reported it with PEER_INFO): its handles still
     * pull. From every router: it is gone (PEER_GONE at once). */
    a = fr_session("dec-2s", 0);
    b = fr_session("dec-2s", 1);
    fr_daemon_t *pf = fr_by_id("pf-a");
    assert_non_null(pf);
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_PEER_DOWN;
    snprintf(m.u.peer_down.daemon_id, sizeof(m.u.peer_down.daemon_id), "pf-a");
    m.u.peer_down.incarnation = pf->incarnation;
    m.u.peer_down.status = PD_ERR_PEER_GONE;
    fr_send(b, &m);
    samp_t g = { 0.0f, 0, 4, true };
    for (int round = 0; round < 2; round++) {
        fr_req_t *r = send_prefill("pf-a", "dec-2s", prompt, 12, &g);
        assert_true(run_until(p_done_or_error, r, 20));
        assert_false(r->error);
        proto_msg_t q;
        memset(&q, 0, sizeof(q));
        q.hdr.type = PROTO_MSG_DECODE_REQ;
        proto_decode_req_t *dq = &q.u.decode_req;
        snprintf(dq->request_id, sizeof(dq->request_id), "%s", r->id);
        dq->prompt.n = 12;
        dq->prompt.v = prompt;
        dq->generated.n = 1;
        dq->generated.v = &r->first_token;
        fill_sampling(&dq->sampling, &g);
        snprintf(dq->prefill_peer_id, sizeof(dq->prefill_peer_id), "pf-a");
        dq->lease_id = r->lease_id;
        dq->kv_handle.p = r->handle;
        dq->kv_handle.len = r->handle_len;
        fr_send(a, &q);
        p_mx_t pr = { a->conn, r->id, 100000 };
        assert_true(run_until(p_mx, &pr, 20));
        typeof(fr.mx[0]) *x = mx_of(a->conn, r->id);
        if (round == 0) {   /* one router's PEER_DOWN: pulled, finished */
            assert_int_equal(x->errors, 0);
            assert_int_equal(x->finishes, 1);
            assert_int_equal(x->reason, PROTO_FINISH_LENGTH);
            fr_send(a, &m); /* now the other router says so too */
        } else {            /* every router's: the peer is gone */
            assert_int_equal(x->errors, 1);
            assert_int_equal(x->status, PD_ERR_PEER_GONE);
            proto_msg_t rel; /* as the router does after such an ERROR */
            memset(&rel, 0, sizeof(rel));
            rel.hdr.type = PROTO_MSG_RELEASE;
            snprintf(rel.u.release.request_id, sizeof(rel.u.release.request_id), "%s", r->id);
            rel.u.release.lease_id = r->lease_id;
            fr_send(pf, &rel);
        }
    }
    assert_true(kv_all_free(&D2S, 10));
    assert_true(kv_all_free(&P, 10));
}


static void test_drain_and_ledgers(void **state)
{
    (void)state;
    check_ledger(&P);
    check_ledger(&D);
    /* SIGTERM with a sequence running: it completes, new work is refused */
    samp_t s = { 0.0f, 0, 40, true };
    int32_t prompt[64], ref[MAX_TOK];
    make_prompt(prompt, 10, 90);
    uint32_t nref = reference(prompt, 10, &s, ref, MAX_TOK);
    fr_req_t *a = new_req();
    send_decode(a, "dec-a", NULL, prompt, 10, NULL, 0, &s, true);
    assert_true(run_until(p_has_tokens, a, 20));
    /* heartbeats carry the load: decode running 1, pools as `kv` says */
    fr_daemon_t *dd = fr_by_id("dec-a"), *pd = fr_by_id("pf-a");
    unsigned n0 = dd->n_hb;
    while (dd->n_hb < n0 + 2)
        event_base_loop(fr.base, EVLOOP_ONCE);
    if (!a->finish)
        assert_int_equal(dd->hb.running_seqs, 1);
    assert_int_equal(dd->hb.total_blocks, 64);
    assert_int_equal(pd->hb.total_blocks, 64);
    assert_int_equal(pd->hb.free_blocks, 64);
    assert_int_equal(pd->hb.flags, 0);
    kill(D.pid, SIGTERM);
    kill(P.pid, SIGTERM);
    assert_true(run_until(p_draining_hb, dd, 10)); /* DRAINING announced at once */
    assert_int_equal(wait_exit(&P, 20), 0);
    /* poll until the decode is draining, then a new request is refused */
    uint64_t end = pd_now_ns() + 10000000000ull;
    bool draining = false;
    while (!draining && pd_now_ns() < end && !a->finish) {
        cJSON *j = admin(&D, "session");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "draining");
        draining = cJSON_IsTrue(x);
        cJSON_Delete(j);
        if (!draining)
            event_base_loop(fr.base, EVLOOP_ONCE);
    }
    fr_req_t *b = new_req();
    if (!a->finish) {
        send_decode(b, "dec-a", NULL, prompt, 10, NULL, 0, &s, true);
        assert_true(run_until(p_final, b, 20));
        assert_true(b->error);
        assert_int_equal(b->err_status, PD_ERR_SHUTDOWN);
    }
    bool fin = run_until(p_final, a, 30);
    if (!fin) {
        cJSON *j = admin(&D, "requests");
        char *t = cJSON_PrintUnformatted(j);
        fprintf(stderr, "decode not finishing: tokens %u, b error %d: %s\n", a->n_tokens,
                b->error, t ? t : "(no reply)");
        free(t);
        cJSON_Delete(j);
    }
    assert_true(fin);
    assert_true(a->finish);
    assert_int_equal(a->n_tokens, nref);
    for (uint32_t i = 0; i < nref; i++)
        assert_int_equal(a->tokens[i], ref[i]);
    assert_int_equal(wait_exit(&D, 20), 0);
}

/* ---- bench mode -------------------------------------------------------------
 * test-serving --bench PD_PREFILL PD_DECODE PD_RUN MODEL [N_TOKENS]
 * Decode throughput of the daemons (continuous batching at batch 1, 4, 8;
 * decode-local and disaggregated) side by side with pd-run's single-process
 * decode rate on the same model and thread count (the baseline). */

static double pd_run_decode_tps(const int32_t *prompt, uint32_t n, uint32_t max_tokens)
{
    char cmd[8192], *p = cmd;
    p += snprintf(p, sizeof(cmd), "%s --model %s --engine %s --threads 1 --tokens-out "
                  "--ignore-eos --max-tokens %u --tokens ", g_run_bin, g_model,
                  g_sim ? "sim" : "llama", max_tokens);
    for (uint32_t i = 0; i < n; i++)
        p += snprintf(p, sizeof(cmd) - (size_t)(p - cmd), i ? ",%d" : "%d", prompt[i]);
    snprintf(p, sizeof(cmd) - (size_t)(p - cmd), " 2>&1 >/dev/null");
    FILE *f = popen(cmd, "r");
    char line[1024];
    double tps = 0;
    while (f && fgets(line, sizeof(line), f)) {
        const char *k = strstr(line, "decode ");
        if (k && strstr(k, "tok/s"))
            tps = atof(k + 7);
    }
    if (f)
        pclose(f);
    return tps;
}

static int bench(uint32_t T)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/pd-serving-XXXXXX");
    if (mkdtemp(g_dir) == NULL)
        return 1;
    fr_start();
    int32_t prompt[8][64];
    for (int i = 0; i < 8; i++)
        make_prompt(prompt[i], 32, 200 + (uint32_t)i);
    double base = pd_run_decode_tps(prompt[0], 32, T); /* before any daemon: no idle router */
    spawn(&P, g_prefill_bin, "pf-a", SECRET_HEX, (const char *const[]){ "--kv-blocks=512", NULL });
    spawn(&D, g_decode_bin, "dec-a", SECRET_HEX,
          (const char *const[]){ "--kv-blocks=512", "--max-batch=8", NULL });
    int rc = 1;
    if (!run_until(p_registered, "pf-a", 30) || !run_until(p_registered, "dec-a", 30))
        goto out;
    samp_t s = { 0.0f, 0, T, true };
    printf("%-8s %5s %7s %9s %9s %9s\n", "path", "batch", "tokens", "wall_ms", "tok/s",
           "x pd-run");
    printf("%-8s %5d %7u %9s %9.1f %9.2f\n", "pd-run", 1, T, "-", base, 1.0);
    static const int batches[] = { 1, 4, 8 };
    for (int mode = 0; mode < 2; mode++)
        for (int bi = 0; bi < 3; bi++) {
            int b = batches[bi];
            fr_req_t *rs[8];
            uint64_t t0 = pd_now_ns();
            for (int i = 0; i < b; i++) {
                if (mode == 0) {
                    rs[i] = new_req();
                    send_decode(rs[i], "dec-a", NULL, prompt[i], 32, NULL, 0, &s, true);
                } else {
                    rs[i] = send_prefill("pf-a", "dec-a", prompt[i], 32, &s);
                }
            }
            if (mode == 1)
                for (int i = 0; i < b; i++) {
                    if (!run_until(p_done_or_error, rs[i], 60) || rs[i]->error)
                        goto out;
                    send_decode(rs[i], "dec-a", "pf-a", prompt[i], 32, &rs[i]->first_token, 1,
                                &s, false);
                }
            uint64_t tokens = 0;
            for (int i = 0; i < b; i++) {
                if (!run_until(p_final, rs[i], 300) || rs[i]->error)
                    goto out;
                tokens += rs[i]->fin.completion_tokens;
            }
            double wall = (double)(pd_now_ns() - t0) / 1e9;
            double tps = (double)tokens / wall;
            printf("%-8s %5d %7llu %9.1f %9.1f %9.2f\n", mode == 0 ? "local" : "disagg", b,
                   (unsigned long long)tokens, wall * 1e3, tps, base > 0 ? tps / base : 0.0);
            fflush(stdout);
        }
    cJSON *st = admin(&D, "stats");
    const cJSON *sets = cJSON_GetObjectItemCaseSensitive(st, "stats"), *set;
    cJSON_ArrayForEach(set, sets) {
        const cJSON *tb = cJSON_GetObjectItemCaseSensitive(set, "table");
        if (!cJSON_IsString(tb) || strcmp(tb->valuestring, "decode") != 0)
            continue;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(set, "values");
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(v, "step_time");
        printf("decode: %.0f compute steps, step p50 %.0f us, p99 %.0f us (all batches)\n",
               jnum(v, "steps", NULL), jnum(h, "p50_ns", NULL) / 1e3,
               jnum(h, "p99_ns", NULL) / 1e3);
    }
    cJSON_Delete(st);
    kill(D.pid, SIGTERM);
    kill(P.pid, SIGTERM);
    rc = wait_exit(&D, 30) == 0 && wait_exit(&P, 30) == 0 ? 0 : 1;
out:
    if (rc != 0)
        fprintf(stderr, "bench failed\n");
    kill_proc(&D);
    kill_proc(&P);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0)
        rc = 1;
    return rc;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc >= 6 && strcmp(argv[1], "--bench") == 0) {
        g_prefill_bin = argv[2];
        g_decode_bin = argv[3];
        g_run_bin = argv[4];
        g_model = argv[5];
        g_sim = strncmp(g_model, "sim:", 4) == 0;
        return bench(argc >= 7 ? (uint32_t)atoi(argv[6]) : 128);
    }
    if (argc != 5) {
        fprintf(stderr, "usage: test-serving [--bench] PD_PREFILL PD_DECODE PD_RUN MODEL [N]\n");
        return 2;
    }
    g_prefill_bin = argv[1];
    g_decode_bin = argv[2];
    g_run_bin = argv[3];
    g_model = argv[4];
    g_sim = strncmp(g_model, "sim:", 4) == 0;
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_file),
        cmocka_unit_test(test_wrong_secret),
        cmocka_unit_test(test_disagg_matches_pd_run),
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_prefix_races),
        cmocka_unit_test(test_local_matches_pd_run),
        cmocka_unit_test(test_token0_later),
        cmocka_unit_test(test_cancel_mid_decode),
        cmocka_unit_test(test_lease_expiry),
        cmocka_unit_test(test_prefill_killed_before_pull),
        cmocka_unit_test(test_handle_released_without_pull),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_sample_messages),
        cmocka_unit_test(test_concurrent_batch),
        cmocka_unit_test(test_wait_queue),
        cmocka_unit_test(test_lease_renew_while_waiting),
        cmocka_unit_test(test_lease_renew_streamed),
        cmocka_unit_test(test_stream_lease_ttl_from_done),
        cmocka_unit_test(test_router_loss),
        cmocka_unit_test(test_prefill_stopped),
        cmocka_unit_test_teardown(test_two_sessions, two_sessions_end),
        cmocka_unit_test(test_drain_and_ledgers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
