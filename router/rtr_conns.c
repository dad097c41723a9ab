/* rtr_conns.c - bounds on the router's HTTP connections (see rtr_conns.h).
 *
 * evhttp (libevent 2.1) has no hook at accept time that sees the socket,
 * and its connections' close callback is the request flow's. So: each
 * connection's bufferevent is made here (evhttp_set_bevcb) and held by one
 * extra reference until the end of the loop turn, when evhttp has set its
 * fd; the connection is then known by (fd, socket inode). A connection is
 * gone once its fd no longer refers to that inode (fstat on the sweep
 * timer, or when a new connection gets the same fd). A connection is ended
 * from here only with shutdown(2): evhttp then sees EOF and frees it the
 * normal way, so no evhttp state is touched from outside. */
#include "rtr_conns.h"
#include "rtr_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#include "pd_log.h"
#include "pd_time.h"

#define CONNS_COMP "router"
#define CONNS_PENDING_MAX 256              /* accepted in one loop turn */
#define CONNS_ACCEPT_RETRY_NS (100 * PD_NS_PER_MS)
#define CONNS_SWEEP_NS (200 * PD_NS_PER_MS)
#define CONNS_LOG_EVERY_NS (5 * PD_NS_PER_S)

/* The framing of the request heads on a connection, read before evhttp
 * (which is lenient: "Content-Length : 5" is not a Content-Length to it,
 * "-0", "+5" and "5<NUL>" are read as numbers): RFC 9112 strictly. Bodies
 * framed by Content-Length are skipped to find the next head; a chunked
 * body stops the scan until the request is in (rtr_conns_request_in). */
typedef enum { SCAN_HEAD, SCAN_BODY, SCAN_OFF } scan_state_t;

typedef struct {
    scan_state_t st;
    bool prev_cr;
    bool colon;                            /* the current line's name ended */
    bool name_bad;                         /* a byte that is no tchar before the colon */
    bool have_cl, te;
    bool no_body;                          /* HEAD or TRACE: evhttp reads no body */
    uint8_t name_len, val_len;
    uint32_t line_len;
    uint32_t n_lines;                      /* lines of this head so far */
    uint64_t cl, body_left;
    char name[20];                         /* lower case; longer names are no CL/TE */
    char val[24];                          /* of a Content-Length */
} head_scan_t;

typedef struct {
    bool used;
    evutil_socket_t fd;
    ino_t ino;                             /* of the socket: fd reuse check */
    char peer[INET6_ADDRSTRLEN];           /* client address, no port */
    uint64_t deadline_ns;                  /* request must be in by then; 0 = serving */
    struct bufferevent *bev;               /* valid only inside conns_input_cb */
    rtr_conns_t *cs;
    head_scan_t hs;                        /* the request heads on this connection */
} conn_slot_t;

struct rtr_conns {
    struct event_base *base;
    rtr_conns_opts_t o;
    conn_slot_t *slots;                    /* (n_slots) */
    uint32_t n_slots;
    uint32_t live;                         /* used slots */
    struct bufferevent *pending[CONNS_PENDING_MAX]; /* referenced until classified */
    uint32_t n_pending;
    struct evconnlistener *listener;       /* evhttp's, or NULL */
    bool paused_full;                      /* listener off: max_total reached */
    bool paused_err;                       /* listener off: accept failed (EMFILE...) */
    struct event *classify_ev;
    struct event *sweep_ev;
    struct event *retry_ev;
    uint64_t accept_errors, accept_errors_logged, last_err_log_ns;
    rtr_conns_counts_t c;
};

static void conns_gauge(rtr_conns_t *cs)
{
    if (cs->o.stats)
        pd_stats_gauge_set(cs->o.stats, RTR_STAT_http_conns, cs->live);
}

static void conns_release(rtr_conns_t *cs, conn_slot_t *s)
{
    if (!s->used)
        return;
    s->used = false;
    s->fd = -1;
    cs->live--;
}

/* Still the socket we classified? */
static bool conns_slot_alive(const conn_slot_t *s)
{
    struct stat sb;
    return fstat(s->fd, &sb) == 0 && S_ISSOCK(sb.st_mode) && sb.st_ino == s->ino;
}

static void conns_purge(rtr_conns_t *cs)
{
    for (uint32_t i = 0; i < cs->n_slots; i++)
        if (cs->slots[i].used && !conns_slot_alive(&cs->slots[i]))
            conns_release(cs, &cs->slots[i]);
    conns_gauge(cs);
}

static void conns_listener_update(rtr_conns_t *cs)
{
    if (cs->listener == NULL)
        return;
    bool full = cs->live + cs->n_pending >= cs->o.max_total;
    if (full && !cs->paused_full) {
        conns_purge(cs);
        full = cs->live + cs->n_pending >= cs->o.max_total;
    }
    if (full && !cs->paused_full) {
        cs->paused_full = true;
        cs->c.paused++;
        evconnlistener_disable(cs->listener);
    } else if (!full && cs->paused_full) {
        cs->paused_full = false;
        if (!cs->paused_err)
            evconnlistener_enable(cs->listener);
    }
}

static void conns_sweep_arm(rtr_conns_t *cs)
{
    if ((cs->live > 0 || cs->paused_full) && !evtimer_pending(cs->sweep_ev, NULL)) {
        struct timeval tv = pd_ns_to_timeval(CONNS_SWEEP_NS);
        evtimer_add(cs->sweep_ev, &tv);
    }
}

static void conns_classify_cb(evutil_socket_t unused, short what, void *arg);

struct bufferevent *rtr_conns_bevcb(struct event_base *base, void *arg)
{
    rtr_conns_t *cs = arg;
    struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (bev == NULL)
        return NULL;
    cs->c.accepted++;
    /* A burst (libevent accepts until the backlog is empty, in one loop
     * turn): the connections already pending were set up by evhttp when
     * their own bevcb returned, so classify them now rather than leave any
     * connection untracked. */
    if (cs->n_pending == CONNS_PENDING_MAX)
        conns_classify_cb(-1, 0, cs);
    /* evhttp sets the fd after we return; look at it later this turn,
     * holding a reference so an evhttp error path cannot free it */
    bufferevent_incref(bev);
    cs->pending[cs->n_pending++] = bev;
    event_active(cs->classify_ev, EV_TIMEOUT, 0);
    conns_listener_update(cs);
    return bev;
}

static void conns_peer(evutil_socket_t fd, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    snprintf(out, cap, "?");
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0)
        return;
    if (ss.ss_family == AF_INET)
        evutil_inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, out, cap);
    else if (ss.ss_family == AF_INET6)
        evutil_inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, out, cap);
}

static void conns_refuse(evutil_socket_t fd, uint32_t retry_after)
{
    static const char body[] =
        "{\"error\":{\"message\":\"too many connections from this client\","
        "\"type\":\"server_error\",\"param\":null,\"code\":\"too_many_connections\"}}";
    char msg[512];
    int n = snprintf(msg, sizeof(msg),
                     "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nRetry-After: %u\r\nConnection: close\r\n\r\n%s",
                     sizeof(body) - 1, retry_after, body);
    /* a fresh connection: evhttp has written nothing and, once we shut the
     * socket, reads EOF and frees it */
    (void)send(fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    shutdown(fd, SHUT_RDWR);
}

static conn_slot_t *conns_find_fd(rtr_conns_t *cs, evutil_socket_t fd)
{
    for (uint32_t i = 0; i < cs->n_slots; i++)
        if (cs->slots[i].used && cs->slots[i].fd == fd)
            return &cs->slots[i];
    return NULL;
}

static void head_scan_reset(head_scan_t *h)
{
    memset(h, 0, sizeof(*h));
    h->st = SCAN_HEAD;
}

static bool is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* A header line ended: NULL if it is well formed. */
static const char *head_scan_line(head_scan_t *h)
{
    if (!h->colon)
        return "a header line without a colon";
    if (h->name_bad || h->name_len == 0)
        return "a header field name with whitespace or a byte that is not a token character "
               "(nothing may stand between the name and its colon)";
    bool is_cl = h->name_len == 14 && memcmp(h->name, "content-length", 14) == 0;
    bool is_te = h->name_len == 17 && memcmp(h->name, "transfer-encoding", 17) == 0;
    if (is_te)
        h->te = true;
    if (!is_cl)
        return NULL;
    /* 1*DIGIT between optional spaces or tabs, at most 18 digits */
    size_t a = 0, b = h->val_len;
    while (a < b && (h->val[a] == ' ' || h->val[a] == '\t'))
        a++;
    while (b > a && (h->val[b - 1] == ' ' || h->val[b - 1] == '\t'))
        b--;
    if (h->val_len == sizeof(h->val) || b == a || b - a > 18)
        return "a Content-Length that is not 1 to 18 digits";
    uint64_t v = 0;
    for (size_t i = a; i < b; i++) {
        if (h->val[i] < '0' || h->val[i] > '9')
            return "a Content-Length that is not digits only";
        v = v * 10 + (uint64_t)(h->val[i] - '0');
    }
    if (h->have_cl && v != h->cl)
        return "two different Content-Length values";
    h->have_cl = true;
    h->cl = v;
    return NULL;
}

/* Scans n bytes; NULL, or why the head is refused. */
static const char *head_scan(head_scan_t *h, const unsigned char *p, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (h->st == SCAN_OFF)
            return NULL;
        if (h->st == SCAN_BODY) {
            size_t take = n - k < h->body_left ? n - k : (size_t)h->body_left;
            h->body_left -= take;
            k += take - 1;
            if (h->body_left == 0)
                head_scan_reset(h);
            continue;
        }
        unsigned char c = p[k];
        if (h->prev_cr && c != '\n')
            return "a CR not followed by LF in the request head";
        if (c == '\n') {
            if (!h->prev_cr)
                return "a bare LF line end in the request head (CRLF required)";
            h->prev_cr = false;
            if (h->line_len == 0) {
                if (h->n_lines == 0)
                    continue; /* an empty line before the request line: ignored */
                /* the end of the head */
                if (h->no_body && (h->te || (h->have_cl && h->cl > 0)))
                    return "a body on a HEAD or TRACE request (read as the next request "
                           "by some servers, as a body by others)";
                if (h->te) {
                    h->st = SCAN_OFF; /* chunked (or refused by rtr_http) */
                } else if (h->have_cl && h->cl > 0) {
                    uint64_t cl = h->cl;
                    head_scan_reset(h);
                    h->st = SCAN_BODY;
                    h->body_left = cl;
                } else {
                    head_scan_reset(h);
                }
                continue;
            }
            if (h->n_lines > 0) {
                const char *why = head_scan_line(h);
                if (why != NULL)
                    return why;
            }
            h->n_lines++;
            h->line_len = 0;
            h->colon = h->name_bad = false;
            h->name_len = h->val_len = 0;
            continue;
        }
        if (c == '\r') {
            h->prev_cr = true;
            continue;
        }
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return "a control character (NUL, ...) in the request head";
        h->line_len++;
        if (h->n_lines == 0) {
            /* the request line: evhttp checks it; the method decides
             * whether evhttp reads a body */
            if (h->line_len <= 6 && h->name_len < sizeof(h->name))
                h->name[h->name_len++] = (char)c;
            if (h->line_len == 6)
                h->no_body = memcmp(h->name, "HEAD ", 5) == 0 ||
                             memcmp(h->name, "TRACE ", 6) == 0;
            continue;
        }
        if (h->line_len == 1 && (c == ' ' || c == '\t'))
            return "a folded header line (obsolete line folding)";
        if (!h->colon) {
            if (c == ':')
                h->colon = true;
            else if (!is_tchar(c))
                h->name_bad = true;
            else if (h->name_len < sizeof(h->name))
                h->name[h->name_len++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
            else
                h->name_len = sizeof(h->name); /* too long to be CL or TE */
        } else if (h->val_len < sizeof(h->val)) {
            h->val[h->val_len++] = (char)c;
        }
    }
    return NULL;
}

/* Bytes arrived on a connection (evbuffer callback of its input, run
 * before evhttp parses them): request heads are checked (head_scan; a
 * bare LF, which libevent would accept and a proxy in front might not, is
 * one of the refusals). A bad head gets a 400 naming what is wrong and the
 * connection is closed; nothing of it reaches evhttp. */
static void conns_input_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    conn_slot_t *s = arg;
    if (info->n_added == 0 || !s->used || s->hs.st == SCAN_OFF)
        return;
    size_t len = evbuffer_get_length(buf);
    if (info->n_added > len)
        return;
    struct evbuffer_ptr pos;
    if (evbuffer_ptr_set(buf, &pos, len - info->n_added, EVBUFFER_PTR_SET) != 0)
        return;
    const char *why = NULL;
    size_t left = info->n_added;
    while (left > 0 && why == NULL && s->hs.st != SCAN_OFF) {
        struct evbuffer_iovec v[16];
        int n = evbuffer_peek(buf, (ev_ssize_t)left, &pos, v, 16);
        if (n <= 0)
            break;
        size_t done = 0;
        for (int i = 0; i < n && i < 16 && why == NULL && done < left; i++) {
            size_t l = v[i].iov_len < left - done ? v[i].iov_len : left - done;
            why = head_scan(&s->hs, v[i].iov_base, l);
            done += l;
        }
        left -= done;
        if (left > 0 && evbuffer_ptr_set(buf, &pos, done, EVBUFFER_PTR_ADD) != 0)
            break;
    }
    if (why == NULL)
        return;
    s->hs.st = SCAN_OFF;
    rtr_conns_t *cs = s->cs;
    cs->c.bad_head++;
    if (cs->o.stats)
        pd_stats_inc(cs->o.stats, RTR_STAT_requests_rejected);
    pd_log(PD_LOG_DEBUG, CONNS_COMP, NULL, "HTTP client %s: request head refused: %s", s->peer,
           why);
    char body[512], msg[768];
    int bl = snprintf(body, sizeof(body),
                      "{\"error\":{\"message\":\"malformed HTTP request head: %s\","
                      "\"type\":\"invalid_request_error\",\"param\":null,"
                      "\"code\":\"ambiguous_request\"}}", why);
    int m = snprintf(msg, sizeof(msg),
                     "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                     "Content-Length: %d\r\nConnection: close\r\n\r\n%s", bl, body);
    if (s->bev != NULL && evbuffer_get_length(bufferevent_get_output(s->bev)) == 0 && m > 0 &&
        (size_t)m < sizeof(msg))
        (void)send(s->fd, msg, (size_t)m, MSG_NOSIGNAL | MSG_DONTWAIT);
    evbuffer_drain(buf, len); /* evhttp never sees it */
    shutdown(s->fd, SHUT_RDWR);
}

static void conns_classify_one(rtr_conns_t *cs, struct bufferevent *bev)
{
    bufferevent_data_cb rcb = NULL;
    bufferevent_getcb(bev, &rcb, NULL, NULL, NULL);
    evutil_socket_t fd = bufferevent_getfd(bev);
    struct stat sb;
    if (rcb == NULL || fd < 0 || fstat(fd, &sb) != 0)
        return; /* evhttp already gave up on it */
    conn_slot_t *old = conns_find_fd(cs, fd);
    if (old != NULL)
        conns_release(cs, old); /* that fd's previous socket is gone */
    conn_slot_t *s = NULL;
    for (uint32_t i = 0; i < cs->n_slots && s == NULL; i++)
        if (!cs->slots[i].used)
            s = &cs->slots[i];
    if (s == NULL) {
        /* no slot (the listener pauses before this can happen): an
         * untracked connection would have no deadline and no count */
        cs->c.no_slot++;
        conns_refuse(fd, cs->o.retry_after);
        return;
    }
    s->used = true;
    s->fd = fd;
    s->ino = sb.st_ino;
    s->cs = cs;
    s->bev = bev;
    head_scan_reset(&s->hs);
    evbuffer_add_cb(bufferevent_get_input(bev), conns_input_cb, s);
    s->deadline_ns = pd_now_ns() + cs->o.read_timeout_ns;
    conns_peer(fd, s->peer, sizeof(s->peer));
    cs->live++;
    uint32_t same = 0;
    for (uint32_t j = 0; j < cs->n_slots; j++)
        if (cs->slots[j].used && strcmp(cs->slots[j].peer, s->peer) == 0)
            same++;
    if (same > cs->o.max_per_client) {
        conns_purge(cs); /* count only sockets still open */
        same = 0;
        for (uint32_t j = 0; j < cs->n_slots; j++)
            if (cs->slots[j].used && strcmp(cs->slots[j].peer, s->peer) == 0)
                same++;
    }
    if (s->used && same > cs->o.max_per_client) {
        cs->c.refused_per_client++;
        if (cs->o.stats)
            pd_stats_inc(cs->o.stats, RTR_STAT_http_conns_refused);
        pd_log(PD_LOG_DEBUG, CONNS_COMP, NULL, "HTTP client %s: over %u connections, refused",
               s->peer, cs->o.max_per_client);
        s->deadline_ns = 0;
        conns_refuse(fd, cs->o.retry_after);
    }
}

static void conns_classify_cb(evutil_socket_t unused, short what, void *arg)
{
    (void)unused;
    (void)what;
    rtr_conns_t *cs = arg;
    uint32_t n = cs->n_pending;
    cs->n_pending = 0;
    for (uint32_t i = 0; i < n; i++) {
        conns_classify_one(cs, cs->pending[i]);
        bufferevent_decref(cs->pending[i]);
        cs->pending[i] = NULL;
    }
    conns_gauge(cs);
    conns_listener_update(cs);
    conns_sweep_arm(cs);
}

static void conns_sweep_cb(evutil_socket_t unused, short what, void *arg)
{
    (void)unused;
    (void)what;
    rtr_conns_t *cs = arg;
    uint64_t now = pd_now_ns();
    for (uint32_t i = 0; i < cs->n_slots; i++) {
        conn_slot_t *s = &cs->slots[i];
        if (!s->used)
            continue;
        if (!conns_slot_alive(s)) {
            conns_release(cs, s);
            continue;
        }
        if (s->deadline_ns != 0 && now > s->deadline_ns) {
            s->deadline_ns = 0;
            cs->c.read_timeouts++;
            if (cs->o.stats)
                pd_stats_inc(cs->o.stats, RTR_STAT_http_read_timeouts);
            pd_log(PD_LOG_DEBUG, CONNS_COMP, NULL,
                   "HTTP client %s: request not read within %.1f s, closing", s->peer,
                   (double)cs->o.read_timeout_ns / 1e9);
            shutdown(s->fd, SHUT_RDWR);
        }
    }
    conns_gauge(cs);
    conns_listener_update(cs);
    conns_sweep_arm(cs);
}

static void conns_retry_cb(evutil_socket_t unused, short what, void *arg)
{
    (void)unused;
    (void)what;
    rtr_conns_t *cs = arg;
    cs->paused_err = false;
    if (cs->listener != NULL && !cs->paused_full)
        evconnlistener_enable(cs->listener);
}

/* accept() failed. Out of fds (or memory) leaves the connection in the
 * backlog, so the level-triggered listen socket would spin the loop and
 * libevent would log each failure: pause accepting instead, log rarely. */
static rtr_conns_t *g_conns; /* the error cb's arg is evhttp's, not ours */

static void conns_accept_error_cb(struct evconnlistener *l, void *arg)
{
    (void)arg;
    rtr_conns_t *cs = g_conns;
    if (cs == NULL)
        return;
    int err = EVUTIL_SOCKET_ERROR();
    cs->accept_errors++;
    cs->c.accept_errors++;
    if (cs->o.stats)
        pd_stats_inc(cs->o.stats, RTR_STAT_http_accept_errors);
    uint64_t now = pd_now_ns();
    if (now - cs->last_err_log_ns >= CONNS_LOG_EVERY_NS || cs->last_err_log_ns == 0) {
        pd_log(PD_LOG_WARN, CONNS_COMP, NULL,
               "HTTP accept: %s (%llu failures since the last report); pausing accept %llu ms",
               evutil_socket_error_to_string(err),
               (unsigned long long)(cs->accept_errors - cs->accept_errors_logged),
               (unsigned long long)(CONNS_ACCEPT_RETRY_NS / PD_NS_PER_MS));
        cs->accept_errors_logged = cs->accept_errors;
        cs->last_err_log_ns = now;
    }
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        cs->paused_err = true;
        evconnlistener_disable(l);
        struct timeval tv = pd_ns_to_timeval(CONNS_ACCEPT_RETRY_NS);
        evtimer_add(cs->retry_ev, &tv);
    }
}

pd_status_t rtr_conns_create(struct event_base *base, const rtr_conns_opts_t *o,
                             rtr_conns_t **cs_p)
{
    rtr_conns_t *cs = calloc(1, sizeof(*cs));
    if (cs == NULL)
        return PD_ERR_NO_MEMORY;
    cs->base = base;
    cs->o = *o;
    if (cs->o.max_total == 0)
        cs->o.max_total = 1;
    if (cs->o.max_per_client == 0 || cs->o.max_per_client > cs->o.max_total)
        cs->o.max_per_client = cs->o.max_total;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        uint64_t room = rl.rlim_cur > o->reserved_fds ? rl.rlim_cur - o->reserved_fds : 1;
        if (room < cs->o.max_total) {
            pd_log(PD_LOG_WARN, CONNS_COMP, NULL,
                   "http-max-conns %u lowered to %llu: the fd limit is %llu (ulimit -n), "
                   "%u kept for the control plane and admin", cs->o.max_total,
                   (unsigned long long)room, (unsigned long long)rl.rlim_cur, o->reserved_fds);
            cs->o.max_total = (uint32_t)room;
            if (cs->o.max_per_client > cs->o.max_total)
                cs->o.max_per_client = cs->o.max_total;
        }
    }
    cs->n_slots = cs->o.max_total + CONNS_PENDING_MAX;
    cs->slots = calloc(cs->n_slots, sizeof(*cs->slots));
    cs->classify_ev = event_new(base, -1, 0, conns_classify_cb, cs);
    cs->sweep_ev = evtimer_new(base, conns_sweep_cb, cs);
    cs->retry_ev = evtimer_new(base, conns_retry_cb, cs);
    if (cs->slots == NULL || cs->classify_ev == NULL || cs->sweep_ev == NULL ||
        cs->retry_ev == NULL) {
        rtr_conns_destroy(cs);
        return PD_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < cs->n_slots; i++)
        cs->slots[i].fd = -1;
    *cs_p = cs;
    return PD_OK;
}

void rtr_conns_set_listener(rtr_conns_t *cs, struct evconnlistener *l)
{
    cs->listener = l;
    if (l == NULL)
        return;
    g_conns = cs;
    evconnlistener_set_error_cb(l, conns_accept_error_cb);
    conns_listener_update(cs);
}

void rtr_conns_request_in(rtr_conns_t *cs, evutil_socket_t fd)
{
    if (cs->n_pending > 0)
        conns_classify_cb(-1, 0, cs); /* in case the deferred step has not run */
    conn_slot_t *s = conns_find_fd(cs, fd);
    if (s != NULL) {
        s->deadline_ns = 0;
        /* after a chunked body the scan stopped: the next bytes that
         * arrive start the next head (the scan is in step otherwise) */
        if (s->hs.st == SCAN_OFF)
            head_scan_reset(&s->hs);
    }
}

void rtr_conns_response_done(rtr_conns_t *cs, evutil_socket_t fd)
{
    conn_slot_t *s = conns_find_fd(cs, fd);
    if (s != NULL)
        s->deadline_ns = pd_now_ns() + cs->o.read_timeout_ns;
}

void rtr_conns_counts(const rtr_conns_t *cs, rtr_conns_counts_t *out)
{
    *out = cs->c;
    out->live = cs->live;
    out->max_total = cs->o.max_total;
}

void rtr_conns_destroy(rtr_conns_t *cs)
{
    if (cs == NULL)
        return;
    if (g_conns == cs)
        g_conns = NULL;
    for (uint32_t i = 0; i < cs->n_pending; i++)
        bufferevent_decref(cs->pending[i]);
    if (cs->classify_ev)
        event_free(cs->classify_ev);
    if (cs->sweep_ev)
        event_free(cs->sweep_ev);
    if (cs->retry_ev)
        event_free(cs->retry_ev);
    free(cs->slots);
    free(cs);
}
