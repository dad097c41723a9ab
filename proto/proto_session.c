/* proto_session.c - see proto_session.h. */
#include "proto_session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include "pd_log.h"
#include "pd_time.h"

#define SESS_COMP "session"

struct proto_session {
    struct event_base *base;
    proto_session_opts_t o;
    char addr[128];
    proto_sess_state_t state;
    proto_conn_t *conn;
    uint8_t nonce[PROTO_AUTH_NONCE_LEN]; /* of the HELLO on this connection */
    uint8_t challenge[PROTO_AUTH_NONCE_LEN]; /* the router's, this connection */
    bool connected;                      /* TCP up, waiting for CHALLENGE */
    uint64_t hb_ns;                      /* current heartbeat interval */
    uint64_t backoff_ns;                 /* next reconnect delay */
    struct event *hb_ev;                 /* persistent heartbeat timer */
    struct event *retry_ev;              /* one-shot reconnect timer */
    char router_id[PROTO_DAEMON_ID_MAX + 1];
    char last_error[PROTO_REASON_MAX + 64];
    uint64_t registrations;
    uint64_t rejects;
    uint64_t last_rx_ns;                 /* last frame received (liveness) */
    bool shutting_down;
    void (*shutdown_done)(void *arg);
    void *shutdown_arg;
};

static void sess_connect(proto_session_t *s);

static struct timeval tv_of(uint64_t ns)
{
    struct timeval tv = { (time_t)(ns / 1000000000ull),
                          (suseconds_t)(ns % 1000000000ull / 1000) };
    return tv;
}

static void sess_schedule_retry(proto_session_t *s)
{
    struct timeval tv = tv_of(s->backoff_ns);
    event_add(s->retry_ev, &tv);
    s->backoff_ns *= 2;
    if (s->backoff_ns > s->o.backoff_max_ns)
        s->backoff_ns = s->o.backoff_max_ns;
}

static void sess_send_hello(proto_session_t *s)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_HELLO;
    m.u.hello = s->o.hello;
    proto_auth_nonce(s->nonce);
    memcpy(m.u.hello.nonce, s->nonce, PROTO_AUTH_NONCE_LEN);
    pd_status_t st = PD_OK;
    if (s->o.secret != NULL)
        st = proto_auth_hello_sign(s->o.secret, &m, s->challenge);
    if (st == PD_OK)
        st = proto_conn_send(s->conn, &m);
    if (st != PD_OK) {
        snprintf(s->last_error, sizeof(s->last_error), "cannot send HELLO: %s",
                 pd_status_str(st));
        proto_conn_close(s->conn, st);
        return;
    }
    s->state = PROTO_SESS_HELLO_SENT;
}

/* Connected: wait for the router's CHALLENGE (hb_cb gives up after 3
 * intervals of silence). */
static void on_connected(proto_conn_t *c, void *arg)
{
    (void)c;
    proto_session_t *s = arg;
    if (s == NULL)
        return;
    s->last_rx_ns = pd_now_ns();
    s->connected = true;
}

static void on_challenge(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    proto_session_t *s = arg;
    if (s == NULL || s->state != PROTO_SESS_CONNECTING || !s->connected) {
        proto_conn_close(c, PD_ERR_BAD_INPUT); /* one CHALLENGE, first */
        return;
    }
    s->last_rx_ns = pd_now_ns();
    memcpy(s->challenge, msg->u.challenge.nonce, PROTO_AUTH_NONCE_LEN);
    sess_send_hello(s);
}

static void on_ack(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    proto_session_t *s = arg;
    if (s == NULL || s->state != PROTO_SESS_HELLO_SENT) {
        proto_conn_close(c, PD_ERR_BAD_INPUT);
        return;
    }
    s->last_rx_ns = pd_now_ns();
    if (s->o.secret != NULL) {
        const uint8_t *f;
        size_t flen;
        pd_status_t st = proto_conn_frame(c, &f, &flen);
        if (st == PD_OK)
            st = proto_auth_ack_verify(s->o.secret, f, flen, s->nonce, s->challenge);
        if (st != PD_OK) {
            s->rejects++;
            snprintf(s->last_error, sizeof(s->last_error),
                     "REGISTER_ACK from %s failed verification: %s",
                     proto_conn_peer(c), pd_status_str(st));
            if (s->o.on_reject)
                s->o.on_reject(s, PD_ERR_AUTH, s->last_error, s->o.arg);
            proto_conn_close(c, PD_ERR_AUTH);
            return;
        }
    }
    if (s->o.secret != NULL) {
        /* every frame from here on is tagged with this session's keys */
        proto_auth_keys_t k;
        proto_auth_session_keys(s->o.secret, s->challenge, s->nonce, false, &k);
        proto_conn_set_keys(c, &k);
        sodium_memzero(&k, sizeof(k));
    }
    proto_conn_set_body_max(c, 0);
    const proto_register_ack_t *ack = &msg->u.register_ack;
    snprintf(s->router_id, sizeof(s->router_id), "%s", ack->daemon_id);
    if (ack->heartbeat_interval_ns >= 1000000ull &&
        ack->heartbeat_interval_ns <= 60000000000ull &&
        ack->heartbeat_interval_ns != s->hb_ns) {
        s->hb_ns = ack->heartbeat_interval_ns;
        struct timeval tv = tv_of(s->hb_ns);
        event_add(s->hb_ev, &tv);
    }
    s->state = PROTO_SESS_UP;
    s->registrations++;
    s->backoff_ns = s->o.backoff_min_ns;
    s->last_error[0] = '\0';
    if (s->o.on_up)
        s->o.on_up(s, ack, s->o.arg);
    proto_session_heartbeat_now(s);
}

static void on_reject(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    proto_session_t *s = arg;
    if (s == NULL)
        return;
    const proto_register_reject_t *r = &msg->u.register_reject;
    s->rejects++;
    snprintf(s->last_error, sizeof(s->last_error), "router rejected registration: %s: %s",
             pd_status_name(r->status), r->reason);
    if (s->o.on_reject)
        s->o.on_reject(s, r->status, r->reason, s->o.arg);
    /* a rejected daemon waits the long way before trying again */
    if (s->backoff_ns < s->o.backoff_min_ns * 2)
        s->backoff_ns = s->o.backoff_min_ns * 2 < s->o.backoff_max_ns
                        ? s->o.backoff_min_ns * 2 : s->o.backoff_max_ns;
    proto_conn_close(c, r->status);
}

static void on_heartbeat(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    (void)msg;
    proto_session_t *s = arg;
    if (s != NULL)
        s->last_rx_ns = pd_now_ns(); /* arrival alone proves liveness */
}

static void on_hello(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)msg;
    (void)arg;
    proto_conn_close(c, PD_ERR_BAD_INPUT); /* routers never say HELLO to us */
}

/* Every daemon message: the caller's callback, only while UP. */
static void on_other(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    proto_session_t *s = arg;
    if (s == NULL || s->state != PROTO_SESS_UP)
        return;
    s->last_rx_ns = pd_now_ns();
    proto_msg_cb_t cb = NULL;
    switch (msg->hdr.type) {
#define SESS_X_CB(NAME, name, code, max) case code: cb = s->o.cbs.on_##name; break;
    PROTO_MSG_LIST(SESS_X_CB)
#undef SESS_X_CB
    }
    if (cb == NULL)
        cb = s->o.cbs.on_other;
    if (cb != NULL)
        cb(c, msg, s->o.arg);
}

static void on_close(proto_conn_t *c, pd_status_t why, void *arg)
{
    (void)c;
    proto_session_t *s = arg;
    if (s == NULL)
        return;
    bool was_up = s->state == PROTO_SESS_UP;
    s->conn = NULL;
    s->state = PROTO_SESS_DOWN;
    if (s->shutting_down) {
        if (s->shutdown_done) {
            void (*done)(void *) = s->shutdown_done;
            s->shutdown_done = NULL;
            done(s->shutdown_arg);
        }
        return;
    }
    if (was_up) {
        snprintf(s->last_error, sizeof(s->last_error), "router connection lost: %s",
                 pd_status_str(why));
        if (s->o.on_down)
            s->o.on_down(s, why, s->o.arg);
    } else if (s->last_error[0] == '\0') {
        snprintf(s->last_error, sizeof(s->last_error), "cannot reach router %s: %s",
                 s->addr, pd_status_str(why));
    }
    sess_schedule_retry(s);
}

static void sess_connect(proto_session_t *s)
{
    proto_conn_cbs_t cbs;
    memset(&cbs, 0, sizeof(cbs));
    cbs.on_hello = on_hello;
    cbs.on_challenge = on_challenge;
    cbs.on_register_ack = on_ack;
    cbs.on_register_reject = on_reject;
    cbs.on_heartbeat = on_heartbeat;
    cbs.on_other = on_other;
    cbs.on_connected = on_connected;
    cbs.on_close = on_close;
    proto_conn_opts_t co;
    memset(&co, 0, sizeof(co));
    co.idle_timeout_ns = 0; /* liveness: hb_cb, at 3 intervals of the ACK's period */
    co.connect_timeout_ns = s->o.connect_timeout_ns;
    co.stats = s->o.stats;
    /* before the ACK only CHALLENGE, REJECT, ACK: never buffer more */
    co.body_max = PROTO_REGISTER_REJECT_BODY_MAX > PROTO_REGISTER_ACK_BODY_MAX
                  ? PROTO_REGISTER_REJECT_BODY_MAX : PROTO_REGISTER_ACK_BODY_MAX;
    s->state = PROTO_SESS_CONNECTING;
    s->connected = false;
    pd_status_t st = proto_conn_connect(s->base, s->addr, &cbs, s, &co, &s->conn);
    if (st != PD_OK) {
        s->conn = NULL;
        s->state = PROTO_SESS_DOWN;
        snprintf(s->last_error, sizeof(s->last_error), "connect %s: %s", s->addr,
                 pd_status_str(st));
        sess_schedule_retry(s);
    }
}

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    proto_session_t *s = arg;
    if (s->state == PROTO_SESS_DOWN && s->conn == NULL && !s->shutting_down)
        sess_connect(s);
}

static void hb_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    proto_session_t *s = arg;
    if (s->conn != NULL && (s->state != PROTO_SESS_CONNECTING || s->connected) &&
        pd_now_ns() - s->last_rx_ns > 3 * s->hb_ns) {
        proto_conn_close(s->conn, PD_ERR_TIMED_OUT); /* router silent 3 intervals */
        return;
    }
    proto_session_heartbeat_now(s);
}

void proto_session_heartbeat_now(proto_session_t *s)
{
    if (s == NULL || s->state != PROTO_SESS_UP || s->conn == NULL)
        return;
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_HEARTBEAT;
    if (s->o.fill_heartbeat)
        s->o.fill_heartbeat(s, &m.u.heartbeat, s->o.arg);
    m.u.heartbeat.incarnation = s->o.hello.incarnation;
    m.u.heartbeat.sent_ns = pd_now_ns();
    m.u.heartbeat.flags &= PROTO_HB_DEFINED;
    (void)proto_conn_send(s->conn, &m); /* BUSY: the next one will do */
}

pd_status_t proto_session_create(struct event_base *base,
                                 const proto_session_opts_t *opts,
                                 proto_session_t **s_p)
{
    struct sockaddr_storage ss;
    int sl;
    if (opts->router_addr == NULL || strlen(opts->router_addr) >= 128 ||
        proto_addr_parse(opts->router_addr, &ss, &sl) != PD_OK)
        return PD_ERR_BAD_INPUT;
    proto_session_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return PD_ERR_NO_MEMORY;
    s->base = base;
    s->o = *opts;
    snprintf(s->addr, sizeof(s->addr), "%s", opts->router_addr);
    s->o.router_addr = s->addr;
    if (s->o.heartbeat_interval_ns == 0)
        s->o.heartbeat_interval_ns = 500000000ull;
    if (s->o.connect_timeout_ns == 0)
        s->o.connect_timeout_ns = 2000000000ull;
    if (s->o.backoff_min_ns == 0)
        s->o.backoff_min_ns = 1000000000ull;
    if (s->o.backoff_max_ns < s->o.backoff_min_ns)
        s->o.backoff_max_ns = s->o.backoff_min_ns > 30000000000ull
                              ? s->o.backoff_min_ns : 30000000000ull;
    s->hb_ns = s->o.heartbeat_interval_ns;
    s->backoff_ns = s->o.backoff_min_ns;
    s->hb_ev = event_new(base, -1, EV_PERSIST, hb_cb, s);
    if (s->hb_ev == NULL)
        goto err_free;
    s->retry_ev = evtimer_new(base, retry_cb, s);
    if (s->retry_ev == NULL)
        goto err_hb;
    struct timeval tv = tv_of(s->hb_ns);
    event_add(s->hb_ev, &tv);
    sess_connect(s);
    *s_p = s;
    return PD_OK;
err_hb:
    event_free(s->hb_ev);
err_free:
    free(s);
    return PD_ERR_NO_MEMORY;
}

void proto_session_destroy(proto_session_t *s)
{
    if (s == NULL)
        return;
    if (s->conn != NULL) {
        proto_conn_set_arg(s->conn, NULL);
        proto_conn_close(s->conn, PD_ERR_SHUTDOWN);
    }
    event_free(s->hb_ev);
    event_free(s->retry_ev);
    free(s);
}

void proto_session_shutdown(proto_session_t *s, void (*done)(void *arg), void *arg)
{
    if (s->shutting_down)
        return;
    s->shutting_down = true;
    event_del(s->retry_ev);
    event_del(s->hb_ev);
    if (s->conn == NULL) {
        if (done)
            done(arg);
        return;
    }
    s->shutdown_done = done;
    s->shutdown_arg = arg;
    proto_conn_close_after_flush(s->conn, PD_OK);
}

pd_status_t proto_session_send(proto_session_t *s, const proto_msg_t *msg)
{
    if (s == NULL || s->state != PROTO_SESS_UP || s->conn == NULL)
        return PD_ERR_SHUTDOWN;
    pd_status_t st = proto_conn_send(s->conn, msg);
    if (st == PD_ERR_BUSY) {
        /* The router has stopped reading (the output cap holds megabytes of
         * control traffic). Dropping this one message would silently skip
         * tokens or lose a FINISH, so end the session instead: the router
         * sees the connection drop and ends every request of this daemon
         * with an error the client can read; we cancel ours and reconnect. */
        proto_conn_close(s->conn, PD_ERR_BUSY);
    }
    return st;
}

void proto_session_retry_now(proto_session_t *s)
{
    if (s == NULL || s->shutting_down || s->state != PROTO_SESS_DOWN || s->conn != NULL)
        return;
    event_del(s->retry_ev);
    s->backoff_ns = s->o.backoff_min_ns;
    sess_connect(s);
}

proto_sess_state_t proto_session_state(const proto_session_t *s) { return s->state; }
bool proto_session_up(const proto_session_t *s) { return s != NULL && s->state == PROTO_SESS_UP; }
const char *proto_session_router_id(const proto_session_t *s) { return s->router_id; }
uint64_t proto_session_registrations(const proto_session_t *s) { return s->registrations; }
uint64_t proto_session_rejects(const proto_session_t *s) { return s->rejects; }
const char *proto_session_last_error(const proto_session_t *s) { return s->last_error; }
