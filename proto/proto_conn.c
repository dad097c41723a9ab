/* proto_conn.c - framing of proto messages over libevent bufferevents.
 *
 * The header/body state machine is proto_frame_check() (pure, in
 * proto_msg.c); this file only moves bytes between the socket buffers and
 * that function, dispatches, counts, and manages connection lifetime.
 * Connections are never freed inside their own callbacks: close marks the
 * connection and activates its reap event; on_close runs from there. */
#include "proto_conn.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <event2/util.h>

#include <sodium.h>

#include "pd_log.h"
#include "pd_time.h"
#include "proto_auth.h"

_Static_assert(PROTO_AUTH_TAG_LEN == 32, "crypto_verify_32 compares the tags");

#define PROTO_PEER_LEN 64
#define PROTO_FLUSH_TIMEOUT_NS (5 * PD_NS_PER_S)
#define PROTO_ACCEPT_RETRY_NS  (100 * PD_NS_PER_MS)

struct proto_conn {
    struct bufferevent *bev;
    struct event *reap_ev;     /* fires on_close + free, outside callbacks */
    proto_conn_cbs_t cbs;
    void *arg;
    size_t out_cap;
    uint64_t flush_timeout_ns;
    uint64_t idle_timeout_ns;  /* 0 = none */
    proto_stats_t stats;
    proto_stats_t *sink;       /* shared counters, may be NULL */
    proto_msg_t *msg;          /* decode target, reused for every frame */
    const uint8_t *cur_frame;  /* (cur_frame_len) while dispatching */
    size_t cur_frame_len;
    size_t want;               /* current read low-watermark */
    uint32_t body_max;         /* extra cap on received bodies; 0 = type caps */
    bool auth;                 /* session keys set: every frame is tagged */
    proto_auth_keys_t keys;
    uint64_t seq_out, seq_in;  /* implicit per-direction frame counters */
    bool connecting;
    bool slow;
    bool closing;              /* close scheduled, no more I/O */
    bool flushing;             /* close once output is empty */
    pd_status_t why;
    pd_status_t flush_why;
    char peer[PROTO_PEER_LEN];
};

struct proto_listener {
    struct evconnlistener *evl;
    struct event *retry_ev;    /* re-enables accepting after EMFILE & co */
    proto_accept_cb_t on_accept;
    proto_conn_cbs_t cbs;
    proto_conn_opts_t opts;
    void *arg;
    uint16_t port;
};

const proto_stat_desc_t proto_stat_descs[] = {
#define PROTO_X_DESC(name, desc) { #name, desc, offsetof(proto_stats_t, name) },
    PROTO_STATS_FIELDS(PROTO_X_DESC)
#undef PROTO_X_DESC
    { NULL, NULL, 0 },
};

/* Bump a counter in the connection and in the shared sink. */
#define STAT_ADD(c, field, n)                                                 \
    do {                                                                      \
        (c)->stats.field += (n);                                              \
        if ((c)->sink)                                                        \
            (c)->sink->field += (n);                                          \
    } while (0)

static void conn_set_want(proto_conn_t *c, size_t want)
{
    if (c->want == want)
        return;
    c->want = want;
    bufferevent_setwatermark(c->bev, EV_READ, want, 0);
}

/* Read timeout = idle timeout (always); write timeout = write_ns (connect
 * or flush deadline), 0 = none. */
static void conn_set_timeouts(proto_conn_t *c, uint64_t write_ns)
{
    struct timeval rtv = pd_ns_to_timeval(c->idle_timeout_ns);
    struct timeval wtv = pd_ns_to_timeval(write_ns);
    bufferevent_set_timeouts(c->bev, c->idle_timeout_ns ? &rtv : NULL,
                             write_ns ? &wtv : NULL);
}

static void conn_schedule_reap(proto_conn_t *c, pd_status_t why)
{
    if (c->closing)
        return;
    c->closing = true;
    c->why = why;
    bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    event_active(c->reap_ev, EV_TIMEOUT, 0);
}

void proto_conn_close(proto_conn_t *conn, pd_status_t why)
{
    if (conn != NULL)
        conn_schedule_reap(conn, why);
}

void proto_conn_close_after_flush(proto_conn_t *conn, pd_status_t why)
{
    if (conn == NULL || conn->closing || conn->flushing)
        return;
    conn->flushing = true;
    conn->flush_why = why;
    bufferevent_disable(conn->bev, EV_READ);
    /* a peer that never reads must not keep us forever */
    conn_set_timeouts(conn, conn->flush_timeout_ns);
    if (evbuffer_get_length(bufferevent_get_output(conn->bev)) == 0)
        conn_schedule_reap(conn, why);
}

static void conn_free(proto_conn_t *c)
{
    if (c == NULL)
        return;
    if (c->bev)
        bufferevent_free(c->bev); /* BEV_OPT_CLOSE_ON_FREE closes the fd */
    if (c->reap_ev)
        event_free(c->reap_ev);
    free(c->msg);
    sodium_memzero(&c->keys, sizeof(c->keys));
    free(c);
}

static void conn_reap_cb(evutil_socket_t fd, short what, void *ctx)
{
    proto_conn_t *c = ctx;

    STAT_ADD(c, conns_closed, 1);
    pd_log(PD_LOG_DEBUG, "proto", NULL, "conn %s closed: %s", c->peer,
           pd_status_name(c->why));
    if (c->cbs.on_close)
        c->cbs.on_close(c, c->why, c->arg);
    conn_free(c);
}

static void conn_protocol_error(proto_conn_t *c, pd_status_t st)
{
    c->stats.proto_errors[pd_status_index(st)]++;
    if (c->sink)
        c->sink->proto_errors[pd_status_index(st)]++;
    STAT_ADD(c, proto_disconnects, 1);
    conn_schedule_reap(c, st);
}

static proto_msg_cb_t conn_callback(const proto_conn_t *c, uint16_t type)
{
    proto_msg_cb_t cb = NULL;

    switch (type) {
#define PROTO_X_PICK(NAME, name, code, max)                                   \
    case code: cb = c->cbs.on_##name; break;
    PROTO_MSG_LIST(PROTO_X_PICK)
#undef PROTO_X_PICK
    }
    return cb ? cb : c->cbs.on_other;
}

/* Parse and dispatch every complete frame in the input buffer. The header
 * is looked at first (32 bytes), so a bad or oversized header is refused
 * before any body is buffered; the read low-watermark is then set to the
 * whole frame (+ its tag on an authenticated connection), so the callback
 * is not re-run for every partial read. A tagged frame is verified before
 * its body is decoded. */
static void conn_read_cb(struct bufferevent *bev, void *ctx)
{
    proto_conn_t *c = ctx;
    struct evbuffer *in = bufferevent_get_input(bev);

    while (!c->closing && !c->flushing) {
        size_t avail = evbuffer_get_length(in);
        size_t look = avail < PROTO_HDR_LEN ? avail : PROTO_HDR_LEN;
        size_t total = PROTO_HDR_LEN, need = 0;
        const uint8_t *p = look ? evbuffer_pullup(in, (ev_ssize_t)look) : NULL;
        const uint8_t *key = c->auth ? c->keys.recv : NULL;

        /* header first: refuse a bad or oversized one before buffering */
        pd_status_t st = proto_auth_frame_next(key, &c->seq_in, c->body_max, p, look,
                                               c->msg, &total, &need);
        if (st == PD_INPROGRESS && avail >= total) {
            p = evbuffer_pullup(in, (ev_ssize_t)total);
            if (p == NULL) {
                conn_schedule_reap(c, PD_ERR_NO_MEMORY);
                return;
            }
            st = proto_auth_frame_next(key, &c->seq_in, c->body_max, p, total, c->msg,
                                       &total, &need);
        }
        if (PD_IS_ERR(st)) {
            conn_protocol_error(c, st);
            return;
        }
        if (st == PD_INPROGRESS) {
            conn_set_want(c, total);
            return;
        }
        STAT_ADD(c, frames_in, 1);
        STAT_ADD(c, bytes_in, total);

        proto_msg_cb_t cb = conn_callback(c, c->msg->hdr.type);
        if (cb) {
            c->cur_frame = p;
            c->cur_frame_len = need;
            cb(c, c->msg, c->arg);
            c->cur_frame = NULL;
            c->cur_frame_len = 0;
        } else {
            STAT_ADD(c, unhandled, 1);
        }
        evbuffer_drain(in, total);
    }
}

static void conn_write_cb(struct bufferevent *bev, void *ctx)
{
    proto_conn_t *c = ctx;

    /* Called when the output drained to the low watermark (0). */
    if (c->flushing) {
        conn_schedule_reap(c, c->flush_why);
        return;
    }
    if (c->slow) {
        c->slow = false;
        if (c->cbs.on_drained)
            c->cbs.on_drained(c, c->arg);
    }
}

static void conn_set_nodelay(proto_conn_t *c)
{
    int one = 1;
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    /* Fails harmlessly on non-TCP sockets (socketpair in tests). */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void conn_fill_peer(proto_conn_t *c)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    char ip[INET6_ADDRSTRLEN];
    evutil_socket_t fd = bufferevent_getfd(c->bev);

    snprintf(c->peer, sizeof(c->peer), "local");
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
        return;
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in sin;
        memcpy(&sin, &ss, sizeof(sin));
        if (evutil_inet_ntop(AF_INET, &sin.sin_addr, ip, sizeof(ip)))
            snprintf(c->peer, sizeof(c->peer), "%s:%u", ip, ntohs(sin.sin_port));
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 sin6;
        memcpy(&sin6, &ss, sizeof(sin6));
        if (evutil_inet_ntop(AF_INET6, &sin6.sin6_addr, ip, sizeof(ip)))
            snprintf(c->peer, sizeof(c->peer), "[%s]:%u", ip,
                     ntohs(sin6.sin6_port));
    }
}

static void conn_event_cb(struct bufferevent *bev, short what, void *ctx)
{
    proto_conn_t *c = ctx;

    if (what & BEV_EVENT_CONNECTED) {
        c->connecting = false;
        conn_set_nodelay(c);
        conn_fill_peer(c);
        conn_set_timeouts(c, 0);
        if (c->cbs.on_connected)
            c->cbs.on_connected(c, c->arg);
        return;
    }
    if (what & BEV_EVENT_TIMEOUT)
        conn_schedule_reap(c, PD_ERR_TIMED_OUT);
    else if (what & BEV_EVENT_EOF)
        conn_schedule_reap(c, c->connecting ? PD_ERR_IO : PD_ERR_PEER_GONE);
    else
        conn_schedule_reap(c, PD_ERR_IO);
}

/* Common part of create/connect. fd < 0: the bufferevent will connect. */
static pd_status_t conn_new(struct event_base *base, evutil_socket_t fd,
                            const proto_conn_cbs_t *cbs, void *arg,
                            const proto_conn_opts_t *opts, proto_conn_t **conn_p)
{
    proto_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        goto err;
    c->msg = malloc(sizeof(*c->msg));
    if (c->msg == NULL)
        goto err_free;
    c->reap_ev = event_new(base, -1, 0, conn_reap_cb, c);
    if (c->reap_ev == NULL)
        goto err_free;
    c->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (c->bev == NULL)
        goto err_free;
    fd = -1; /* owned by bev from here */
    if (cbs)
        c->cbs = *cbs;
    c->arg = arg;
    c->out_cap = opts && opts->out_cap ? opts->out_cap : PROTO_OUT_CAP_DEFAULT;
    c->sink = opts ? opts->stats : NULL;
    c->flush_timeout_ns = opts && opts->flush_timeout_ns ? opts->flush_timeout_ns
                                                         : PROTO_FLUSH_TIMEOUT_NS;
    c->want = PROTO_HDR_LEN;
    c->body_max = opts ? opts->body_max : 0;
    bufferevent_setwatermark(c->bev, EV_READ, PROTO_HDR_LEN, 0);
    bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
    bufferevent_setcb(c->bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
    c->idle_timeout_ns = opts ? opts->idle_timeout_ns : 0;
    conn_set_timeouts(c, 0);
    if (bufferevent_enable(c->bev, EV_READ | EV_WRITE) != 0)
        goto err_free;
    snprintf(c->peer, sizeof(c->peer), "local");
    *conn_p = c;
    return PD_OK;

err_free:
    conn_free(c);
err:
    if (fd >= 0)
        evutil_closesocket(fd);
    return PD_ERR_NO_MEMORY;
}

pd_status_t proto_conn_create(struct event_base *base, int fd,
                              const proto_conn_cbs_t *cbs, void *arg,
                              const proto_conn_opts_t *opts,
                              proto_conn_t **conn_p)
{
    proto_conn_t *c;

    if (evutil_make_socket_nonblocking(fd) != 0) {
        evutil_closesocket(fd);
        return PD_ERR_IO;
    }
    pd_status_t st = conn_new(base, fd, cbs, arg, opts, &c);
    if (st != PD_OK)
        return st;
    conn_set_nodelay(c);
    conn_fill_peer(c);
    STAT_ADD(c, conns_opened, 1);
    *conn_p = c;
    return PD_OK;
}

pd_status_t proto_addr_parse(const char *addr, struct sockaddr_storage *ss,
                             int *ss_len_p)
{
    char host[INET6_ADDRSTRLEN + 1] = "127.0.0.1";
    const char *port_s;
    char *end;

    if (addr == NULL || addr[0] == '\0')
        return PD_ERR_BAD_INPUT;
    if (addr[0] == '[') {                         /* [v6]:port */
        const char *close = strchr(addr, ']');
        size_t n = close ? (size_t)(close - addr - 1) : 0;
        if (close == NULL || close[1] != ':' || n == 0 || n >= sizeof(host))
            return PD_ERR_BAD_INPUT;
        memcpy(host, addr + 1, n);
        host[n] = '\0';
        port_s = close + 2;
    } else if ((port_s = strrchr(addr, ':')) != NULL) { /* host:port, :port */
        size_t n = (size_t)(port_s - addr);
        if (n >= sizeof(host) || memchr(addr, ':', n) != NULL)
            return PD_ERR_BAD_INPUT;              /* bare v6 needs [] */
        if (n > 0) {
            memcpy(host, addr, n);
            host[n] = '\0';
        }
        port_s++;
    } else {                                      /* port */
        port_s = addr;
    }
    if (strcmp(host, "localhost") == 0)
        strcpy(host, "127.0.0.1");
    if (port_s[0] < '0' || port_s[0] > '9')
        return PD_ERR_BAD_INPUT;
    errno = 0;
    unsigned long port = strtoul(port_s, &end, 10);
    if (errno != 0 || *end != '\0' || port > 65535)
        return PD_ERR_BAD_INPUT;

    memset(ss, 0, sizeof(*ss));
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    struct sockaddr_in6 sin6 = { .sin6_family = AF_INET6,
                                 .sin6_port = htons((uint16_t)port) };
    if (evutil_inet_pton(AF_INET, host, &sin.sin_addr) == 1) {
        memcpy(ss, &sin, sizeof(sin));
        *ss_len_p = (int)sizeof(sin);
    } else if (evutil_inet_pton(AF_INET6, host, &sin6.sin6_addr) == 1) {
        memcpy(ss, &sin6, sizeof(sin6));
        *ss_len_p = (int)sizeof(sin6);
    } else {
        return PD_ERR_BAD_INPUT;                  /* no DNS on the loop */
    }
    return PD_OK;
}

pd_status_t proto_conn_connect(struct event_base *base, const char *addr,
                               const proto_conn_cbs_t *cbs, void *arg,
                               const proto_conn_opts_t *opts,
                               proto_conn_t **conn_p)
{
    struct sockaddr_storage ss;
    int ss_len;
    proto_conn_t *c;

    pd_status_t st = proto_addr_parse(addr, &ss, &ss_len);
    if (st != PD_OK)
        return st;
    st = conn_new(base, -1, cbs, arg, opts, &c);
    if (st != PD_OK)
        return st;
    c->connecting = true;
    snprintf(c->peer, sizeof(c->peer), "%s", addr);
    /* libevent applies the write timeout to the connect itself */
    if (opts && opts->connect_timeout_ns)
        conn_set_timeouts(c, opts->connect_timeout_ns);
    if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&ss, ss_len) != 0) {
        /* libevent may already have reported through the event callback */
        c->closing = true;
        conn_free(c);
        return PD_ERR_IO;
    }
    STAT_ADD(c, conns_opened, 1);
    *conn_p = c;
    return PD_OK;
}

pd_status_t proto_conn_send(proto_conn_t *conn, const proto_msg_t *msg)
{
    struct evbuffer *out;
    struct evbuffer_iovec vec;
    size_t need = 0, len = 0;

    if (conn->closing || conn->flushing)
        return PD_ERR_SHUTDOWN;
    out = bufferevent_get_output(conn->bev);
    if (evbuffer_get_length(out) > conn->out_cap) {
        conn->slow = true;
        STAT_ADD(conn, send_busy, 1);
        return PD_ERR_BUSY;
    }
    pd_status_t st = proto_msg_encode(msg, NULL, 0, &need);
    if (st != PD_ERR_NO_SPACE)
        return st;
    size_t tag = conn->auth ? PROTO_AUTH_TAG_LEN : 0;
    if (evbuffer_reserve_space(out, (ev_ssize_t)(need + tag), &vec, 1) != 1 ||
        vec.iov_len < need + tag)
        return PD_ERR_NO_MEMORY;
    st = proto_msg_encode(msg, vec.iov_base, need, &len);
    if (st != PD_OK) {
        vec.iov_len = 0;
        evbuffer_commit_space(out, &vec, 1);
        return st;
    }
    /* PROTO_FLAG_AUTH (LE u16 flags at offset 8) is ours to set: exactly
     * on an authenticated connection; the tag covers the header */
    uint8_t *f = vec.iov_base;
    uint16_t flags = (uint16_t)(f[8] | f[9] << 8);
    flags = conn->auth ? (uint16_t)(flags | PROTO_FLAG_AUTH)
                       : (uint16_t)(flags & ~PROTO_FLAG_AUTH);
    f[8] = (uint8_t)flags;
    f[9] = (uint8_t)(flags >> 8);
    if (conn->auth) {
        proto_auth_frame_tag(conn->keys.send, conn->seq_out++, f, len, f + len);
        len += tag;
    }
    vec.iov_len = len;
    if (evbuffer_commit_space(out, &vec, 1) != 0)
        return PD_ERR_NO_MEMORY;
    STAT_ADD(conn, frames_out, 1);
    STAT_ADD(conn, bytes_out, len);
    return PD_OK;
}

void proto_conn_set_keys(proto_conn_t *conn, const proto_auth_keys_t *keys)
{
    conn->keys = *keys;
    conn->auth = true;
    conn->seq_out = 0;
    conn->seq_in = 0;
}

bool proto_conn_is_authenticated(const proto_conn_t *conn)
{
    return conn->auth;
}

void proto_conn_set_body_max(proto_conn_t *conn, uint32_t body_max)
{
    conn->body_max = body_max;
}

void proto_conn_set_arg(proto_conn_t *conn, void *arg)
{
    conn->arg = arg;
}

void *proto_conn_get_arg(const proto_conn_t *conn)
{
    return conn->arg;
}

const char *proto_conn_peer(const proto_conn_t *conn)
{
    return conn->peer;
}

const proto_stats_t *proto_conn_stats(const proto_conn_t *conn)
{
    return &conn->stats;
}

size_t proto_conn_out_len(const proto_conn_t *conn)
{
    return evbuffer_get_length(bufferevent_get_output(conn->bev));
}

bool proto_conn_is_slow(const proto_conn_t *conn)
{
    return conn->slow;
}

bool proto_conn_is_closing(const proto_conn_t *conn)
{
    return conn->closing || conn->flushing;
}

pd_status_t proto_conn_frame(const proto_conn_t *conn, const uint8_t **p_p,
                             size_t *len_p)
{
    if (conn->cur_frame == NULL)
        return PD_ERR_BAD_INPUT;
    *p_p = conn->cur_frame;
    *len_p = conn->cur_frame_len;
    return PD_OK;
}

/* ---- listener ---------------------------------------------------------- */

static void listener_accept_cb(struct evconnlistener *evl, evutil_socket_t fd,
                               struct sockaddr *sa, int salen, void *ctx)
{
    proto_listener_t *l = ctx;
    proto_conn_t *c;

    if (proto_conn_create(evconnlistener_get_base(evl), fd, &l->cbs, l->arg,
                          &l->opts, &c) != PD_OK)
        return; /* fd already closed; the peer sees a reset */
    if (l->on_accept)
        l->on_accept(l, c, l->arg);
}

/* accept() failed. Out of fds/memory would make the level-triggered
 * listen socket spin the loop: pause accepting for a moment instead. */
static void listener_error_cb(struct evconnlistener *evl, void *ctx)
{
    proto_listener_t *l = ctx;
    int err = EVUTIL_SOCKET_ERROR();

    if (l->opts.stats)
        l->opts.stats->accept_errors++;
    pd_log(PD_LOG_DEBUG, "proto", NULL, "accept: %s",
           evutil_socket_error_to_string(err));
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        struct timeval tv = pd_ns_to_timeval(PROTO_ACCEPT_RETRY_NS);
        evconnlistener_disable(evl);
        event_add(l->retry_ev, &tv);
    }
}

static void listener_retry_cb(evutil_socket_t fd, short what, void *ctx)
{
    proto_listener_t *l = ctx;
    evconnlistener_enable(l->evl);
}

pd_status_t proto_listener_create(struct event_base *base, const char *addr,
                                  proto_accept_cb_t on_accept,
                                  const proto_conn_cbs_t *cbs, void *arg,
                                  const proto_conn_opts_t *opts,
                                  proto_listener_t **l_p)
{
    struct sockaddr_storage ss;
    int ss_len;
    proto_listener_t *l;

    pd_status_t st = proto_addr_parse(addr, &ss, &ss_len);
    if (st != PD_OK)
        return st;
    l = calloc(1, sizeof(*l));
    if (l == NULL)
        return PD_ERR_NO_MEMORY;
    l->on_accept = on_accept;
    if (cbs)
        l->cbs = *cbs;
    if (opts)
        l->opts = *opts;
    l->arg = arg;
    l->evl = evconnlistener_new_bind(base, listener_accept_cb, l,
                                     LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE |
                                     LEV_OPT_CLOSE_ON_EXEC, 128,
                                     (struct sockaddr *)&ss, ss_len);
    if (l->evl == NULL)
        goto err_free;
    l->retry_ev = evtimer_new(base, listener_retry_cb, l);
    if (l->retry_ev == NULL)
        goto err_close;
    evconnlistener_set_error_cb(l->evl, listener_error_cb);
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    if (getsockname(evconnlistener_get_fd(l->evl), (struct sockaddr *)&bound,
                    &blen) != 0)
        goto err_close;
    if (bound.ss_family == AF_INET) {
        struct sockaddr_in sin;
        memcpy(&sin, &bound, sizeof(sin));
        l->port = ntohs(sin.sin_port);
    } else {
        struct sockaddr_in6 sin6;
        memcpy(&sin6, &bound, sizeof(sin6));
        l->port = ntohs(sin6.sin6_port);
    }
    *l_p = l;
    return PD_OK;

err_close:
    if (l->retry_ev)
        event_free(l->retry_ev);
    evconnlistener_free(l->evl);
err_free:
    free(l);
    return PD_ERR_IO;
}

void proto_listener_destroy(proto_listener_t *l)
{
    if (l == NULL)
        return;
    if (l->retry_ev)
        event_free(l->retry_ev);
    if (l->evl)
        evconnlistener_free(l->evl);
    free(l);
}

uint16_t proto_listener_port(const proto_listener_t *l)
{
    return l->port;
}
