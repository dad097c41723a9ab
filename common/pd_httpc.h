/* pd_httpc.h - the one HTTP/1.1 client of the tree (etcd membership, pdctl,
 * pd-bench, the test harness). Three parts:
 *
 *  - a pure, incremental response parser (status line, headers, body framed
 *    by Content-Length, chunked transfer coding or connection close). No I/O:
 *    bytes go in, de-chunked body bytes come out through a callback. Strict
 *    framing (RFC 9112): Content-Length is digits only, chunk sizes are hex
 *    digits only, a response with both Content-Length and Transfer-Encoding
 *    is refused, header names carry no white space, no obsolete line
 *    folding. Hard caps: a line, the header count, the whole head and the
 *    body (set per response).
 *  - a Server-Sent Events parser (`data:` lines joined, `:` comments and
 *    other fields dropped, a blank line ends an event; each event capped).
 *  - a small blocking request helper with a deadline: connect, send one
 *    request with Connection: close, read until the response is complete.
 *    For worker threads and command-line tools, never for an event loop.
 *
 * Expected statuses (the server is not trusted): PD_ERR_BAD_INPUT (framing),
 * PD_ERR_TOO_BIG (a cap), PD_ERR_IO (connect/send/recv, early close),
 * PD_ERR_TIMED_OUT (deadline), PD_ERR_NO_MEMORY. */
#ifndef PD_HTTPC_H
#define PD_HTTPC_H

#include "pd_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PD_HTTPC_LINE_MAX    8192        /* status/header/chunk-size line */
#define PD_HTTPC_HEADERS_MAX 100
#define PD_HTTPC_HEAD_MAX    (64u << 10) /* status line + headers, bytes */
#define PD_SSE_EVENT_MAX     (1u << 20)

/* ---- response parser ---------------------------------------------------- */

/* Body bytes as they arrive (already de-chunked). */
typedef void (*pd_httpc_body_cb_t)(void *arg, const char *data, size_t len);

typedef struct {
    int state;                  /* internal */
    int status;                 /* once the status line is in */
    bool headers_done;
    bool complete;              /* whole body received */
    bool chunked;
    bool conn_close;            /* server said Connection: close (or HTTP/1.0) */
    int64_t content_length;     /* -1 = none */
    uint64_t remaining;         /* body or chunk bytes left */
    uint64_t body_len;          /* de-chunked body bytes so far */
    uint64_t body_max;          /* cap on body_len */
    uint64_t consumed;          /* bytes fed and used so far */
    uint64_t head_start;        /* offset of the final response's status line */
    uint64_t head_end;          /* offset just past its blank line (headers_done) */
    size_t n_headers;
    size_t line_len;
    char line[PD_HTTPC_LINE_MAX];
} pd_httpc_resp_t;

/* Ready for a new response whose body may be at most body_max bytes. */
void pd_httpc_resp_init(pd_httpc_resp_t *r, uint64_t body_max);

/* Feed bytes. Body bytes go to body_cb (may be NULL). Bytes after a
 * complete response are not consumed (*used_p tells how many were; may be
 * NULL). PD_OK, or PD_ERR_BAD_INPUT / PD_ERR_TOO_BIG; after an error the
 * parser refuses further bytes the same way. */
pd_status_t pd_httpc_resp_feed(pd_httpc_resp_t *r, const char *data, size_t len,
                               pd_httpc_body_cb_t body_cb, void *arg, size_t *used_p);

/* The connection closed: completes a read-until-close body. Returns true
 * if the response is complete. */
bool pd_httpc_resp_eof(pd_httpc_resp_t *r);

/* ---- SSE ---------------------------------------------------------------- */

/* One event's data (data lines joined with '\n', NUL-terminated). */
typedef void (*pd_sse_event_cb_t)(void *arg, const char *data, size_t len);

typedef struct {
    char *buf;                  /* current line + event data; owned */
    size_t cap;
    size_t line_start;          /* where the current line starts in buf */
    size_t len;                 /* bytes used */
    size_t data_len;            /* bytes of event data at buf[0..) */
    bool has_data;
    bool skip_lf;               /* last line ended with '\r' */
} pd_sse_t;

void pd_sse_init(pd_sse_t *s);
void pd_sse_fini(pd_sse_t *s);
/* Feed stream bytes; complete events go to cb. PD_ERR_TOO_BIG when an
 * event exceeds PD_SSE_EVENT_MAX, PD_ERR_NO_MEMORY. */
pd_status_t pd_sse_feed(pd_sse_t *s, const char *data, size_t len,
                        pd_sse_event_cb_t cb, void *arg);
/* Bytes of an unfinished event (a line or data without its blank line)
 * are held: the stream was cut if it ends here. */
bool pd_sse_pending(const pd_sse_t *s);

/* ---- blocking request helper ------------------------------------------- */

typedef struct {
    const char *method;         /* "GET", "POST", ... */
    const char *host;           /* Host header value */
    const char *path;
    const char *headers;        /* extra "Name: value\r\n" lines, or NULL */
    const char *body;           /* NULL: no body, no Content-Type/-Length */
    size_t body_len;
    const char *content_type;   /* NULL: application/json */
} pd_httpc_req_t;

typedef struct {
    int status;                 /* HTTP status; 0 before the status line */
    char *head;                 /* status line + headers, no blank line; malloc'd */
    char *body;                 /* de-chunked, NUL-terminated; malloc'd */
    size_t body_len;
    bool complete;
} pd_httpc_reply_t;

/* Connect to host:port (a name is resolved here: blocking) within
 * deadline_ns (pd_now_ns clock). The fd (non-blocking, close-on-exec,
 * TCP_NODELAY) or a negative status: PD_ERR_BAD_INPUT (no port),
 * PD_ERR_IO, PD_ERR_TIMED_OUT. */
int pd_httpc_connect(const char *host, const char *port, uint64_t deadline_ns);

/* Write the request: request line, Host, the extra headers, Content-Type
 * and Content-Length when there is a body, Connection: close, then the
 * body. PD_OK, PD_ERR_IO, PD_ERR_TIMED_OUT, PD_ERR_TOO_BIG (head > 4 KiB). */
pd_status_t pd_httpc_send(int fd, const pd_httpc_req_t *req, uint64_t deadline_ns);

/* Read fd into the parser until the response is complete, the peer closes
 * or the deadline. The head and body go to *rep (what arrived, also on an
 * error: the caller frees with pd_httpc_reply_free). PD_OK when complete;
 * a close inside the head is PD_ERR_BAD_INPUT, one after it PD_ERR_IO. */
pd_status_t pd_httpc_recv(int fd, pd_httpc_resp_t *r, uint64_t deadline_ns,
                          pd_httpc_reply_t *rep);

/* One whole exchange with addr "host:port" (a name is resolved): connect,
 * send, recv, close, all within timeout_ns; body at most body_max bytes.
 * *rep is always initialised (free with pd_httpc_reply_free). */
pd_status_t pd_httpc_fetch(const char *addr, const pd_httpc_req_t *req, uint64_t timeout_ns,
                           uint64_t body_max, pd_httpc_reply_t *rep);

/* Parse one captured response raw[0..len) (the end of raw counts as the
 * peer's close) into *rep, as pd_httpc_recv would have: the head, the
 * body up to where it ended or broke off. PD_OK or the parser's status;
 * *rep is always initialised. */
pd_status_t pd_httpc_parse(const char *raw, size_t len, uint64_t body_max,
                           pd_httpc_reply_t *rep);

void pd_httpc_reply_free(pd_httpc_reply_t *rep);

/* "host:port" -> host, port (digits, 1..65535). 0 or -1. */
int pd_httpc_split_addr(const char *addr, char *host, size_t host_cap, char *port,
                        size_t port_cap);

#endif
