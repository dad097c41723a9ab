/* rtr_conns.h - bounds on what HTTP clients can make the router hold:
 *   - at most max_total connections (the listener pauses at the cap and
 *     resumes when one ends; clamped below the fd limit);
 *   - at most max_per_client per client address (more get a 503 and are
 *     closed at once); every accepted connection is tracked (deadline and
 *     count) from its accept, however many arrive in one loop turn;
 *   - a request's headers and body must be in within read_timeout of the
 *     connection's accept (or of the end of the previous response on a
 *     keep-alive connection), however slowly the bytes trickle;
 *   - a request head that is not RFC 9112 (bare LF or CR, a control byte,
 *     whitespace or a non-token byte in a field name, obs-fold, a
 *     Content-Length that is not 1*DIGIT, two different Content-Lengths)
 *     gets a 400 naming it and the connection is closed before evhttp
 *     (which would accept it) sees it;
 *   - accept() failing for lack of fds or memory pauses accepting 100 ms
 *     (no busy loop, one log line per 5 s).
 * Used by rtr_http.c through evhttp_set_bevcb (rtr_conns_bevcb). Uses
 * libevent core only (bufferevents, listener), no evhttp. */
#ifndef RTR_CONNS_H
#define RTR_CONNS_H

#include <stdbool.h>
#include <stdint.h>
#include <event2/event.h>
#include "pd_status.h"

struct evconnlistener;
struct bufferevent;
typedef struct rtr_conns rtr_conns_t;

typedef struct {
    uint32_t max_total;
    uint32_t max_per_client;
    uint64_t read_timeout_ns;
    uint32_t reserved_fds;     /* kept below RLIMIT_NOFILE for everything else */
    uint32_t retry_after;      /* Retry-After of the per-client 503 */
    struct pd_stats *stats;    /* router stats (RTR_STAT_http_*), may be NULL */
} rtr_conns_opts_t;

typedef struct {
    uint64_t accepted;
    uint64_t refused_per_client;
    uint64_t read_timeouts;
    uint64_t accept_errors;
    uint64_t paused;           /* times the listener paused at max_total */
    uint64_t no_slot;          /* refused: no slot left (not expected: accept pauses first) */
    uint64_t bad_head;         /* request heads refused: bare LF, bad Content-Length, ... */
    uint32_t live;
    uint32_t max_total;        /* after clamping */
} rtr_conns_counts_t;

pd_status_t rtr_conns_create(struct event_base *base, const rtr_conns_opts_t *o,
                             rtr_conns_t **cs_p);
/* After evhttp_free (which ends every connection). NULL-safe. */
void rtr_conns_destroy(rtr_conns_t *cs);
/* evhttp_set_bevcb(http, rtr_conns_bevcb, cs). */
struct bufferevent *rtr_conns_bevcb(struct event_base *base, void *arg);
/* The evhttp listener (evhttp_bound_socket_get_listener), or NULL before
 * evhttp frees it (drain). */
void rtr_conns_set_listener(rtr_conns_t *cs, struct evconnlistener *l);
/* A whole request was read on the connection with this fd: no read
 * deadline while it is served. */
void rtr_conns_request_in(rtr_conns_t *cs, evutil_socket_t fd);
/* Its response was sent: the next request must be in within read_timeout. */
void rtr_conns_response_done(rtr_conns_t *cs, evutil_socket_t fd);
void rtr_conns_counts(const rtr_conns_t *cs, rtr_conns_counts_t *out);

#endif
