/* pd_metrics_http.h - a tiny HTTP/1.1 endpoint for Prometheus scrapes and
 * liveness probes, for daemons that have no HTTP server of their own
 * (pd-prefill, pd-decode). Not evhttp: an evconnlistener + one bufferevent
 * per client, one request per connection.
 *
 *   GET /metrics  -> 200, Content-Type: text/plain; version=0.0.4, the text
 *                    the render callback returns (500 if it fails)
 *   GET /health   -> 200 "ok\n" (or 503 + the reason if the health callback
 *                    says not ok)
 *   GET /ready    -> the same with the ready callback (404 without one):
 *                    readiness probes
 *   HEAD of those -> the same headers, no body
 *   other paths   -> 404; other methods on those paths -> 405;
 *   bad request line -> 400; headers over max_header -> 431
 * Every reply has Content-Length and "Connection: close"; the connection is
 * closed once the reply is flushed (keep-alive is not offered).
 *
 * Limits (enforced on the loop thread, nothing ever blocks):
 *   max_clients   one more connection gets a short 503 (non-blocking send)
 *                 and is closed
 *   max_header    request line + headers larger than this without the
 *                 blank line -> 431, close
 *   idle_timeout  no complete request / reply not drained in this long ->
 *                 close
 * Callbacks run synchronously on the loop thread and must not block. */
#ifndef PD_METRICS_HTTP_H
#define PD_METRICS_HTTP_H

#include "pd_loop.h"
#include "pd_stats.h"
#include "pd_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pd_metrics_http pd_metrics_http_t;

/* Produce the Prometheus text: *text_p malloc'd (freed by the server),
 * *len_p its length. Anything but PD_OK -> 500. */
typedef pd_status_t (*pd_metrics_render_t)(void *arg, char **text_p,
                                           size_t *len_p);
/* Health: return true when healthy; on false, `why` (NUL-terminated, at
 * most why_cap bytes) becomes the 503 body. */
typedef bool (*pd_metrics_health_t)(void *arg, char *why, size_t why_cap);

typedef struct {
    const char *listen;             /* "127.0.0.1:9100", "[::1]:0" (port 0 ok) */
    pd_metrics_render_t render;     /* required */
    pd_metrics_health_t health;     /* NULL: always healthy */
    pd_metrics_health_t ready;      /* GET /ready: the same form (NULL: /ready is 404) */
    void *arg;
    unsigned max_clients;           /* 0 -> 16 */
    size_t max_header;              /* 0 -> 8192 bytes */
    uint64_t idle_timeout_ns;       /* 0 -> 10 s */
} pd_metrics_http_opts_t;

/* Bind and listen on opts->listen. Expected: PD_ERR_BAD_INPUT (unparseable
 * address, no render), PD_ERR_IO (bind/listen failed: in use, not local),
 * PD_ERR_NO_MEMORY. opts is copied. */
pd_status_t pd_metrics_http_create(pd_loop_t *loop,
                                   const pd_metrics_http_opts_t *opts,
                                   pd_metrics_http_t **m_p);
/* Close every client and stop listening; call on the loop thread, before
 * pd_loop_destroy. NULL-safe. */
void pd_metrics_http_destroy(pd_metrics_http_t *m);

/* The bound port (host order), e.g. after listening on port 0. */
uint16_t pd_metrics_http_port(const pd_metrics_http_t *m);
/* Connected clients now (tests). */
unsigned pd_metrics_http_client_count(const pd_metrics_http_t *m);
/* True if the address parses and is a loopback address (127/8, ::1), so a
 * daemon can warn loudly about anything else. */
bool pd_metrics_http_addr_is_loopback(const char *listen);

#endif
