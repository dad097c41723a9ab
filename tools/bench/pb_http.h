/* pb_http.h - pure, incremental parsers for pd-bench's client side: an
 * HTTP/1.1 response (status line, headers, body framed by Content-Length,
 * chunked transfer coding or connection close) and a Server-Sent Events
 * stream (`data:` lines, `:` comments, blank line ends an event). No I/O;
 * bytes go in, callbacks come out. Every line and event is capped. */
#ifndef PB_HTTP_H
#define PB_HTTP_H

#include "pd_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PB_HTTP_LINE_MAX    8192     /* status/header/chunk-size line */
#define PB_HTTP_HEADERS_MAX 100
#define PB_SSE_EVENT_MAX    (1u << 20)

/* Body bytes as they arrive (already de-chunked). */
typedef void (*pb_http_body_cb_t)(void *arg, const char *data, size_t len);

typedef struct {
    int state;                  /* internal */
    int status;                 /* after headers_done */
    bool headers_done;
    bool complete;              /* whole body received */
    bool chunked;
    bool conn_close;            /* server said Connection: close */
    int64_t content_length;     /* -1 = none */
    uint64_t remaining;         /* body or chunk bytes left */
    size_t n_headers;
    size_t line_len;
    char line[PB_HTTP_LINE_MAX];
} pb_http_resp_t;

void pb_http_resp_init(pb_http_resp_t *r);

/* Feed bytes. Body bytes go to body_cb (may be NULL). Bytes after a
 * complete response are ignored (*used_p tells how many were consumed;
 * may be NULL). PD_OK, or PD_ERR_BAD_INPUT / PD_ERR_TOO_BIG on a malformed
 * or oversized response (expected: the server is not trusted). */
pd_status_t pb_http_resp_feed(pb_http_resp_t *r, const char *data, size_t len,
                              pb_http_body_cb_t body_cb, void *arg,
                              size_t *used_p);

/* The connection closed: completes a read-until-close body. Returns true
 * if the response is complete. */
bool pb_http_resp_eof(pb_http_resp_t *r);

/* One SSE event's data (data lines joined with '\n', NUL-terminated). */
typedef void (*pb_sse_event_cb_t)(void *arg, const char *data, size_t len);

typedef struct {
    char *buf;                  /* current line + event data; owned */
    size_t cap;
    size_t line_start;          /* where the current line starts in buf */
    size_t len;                 /* bytes used */
    size_t data_len;            /* bytes of event data at buf[0..) */
    bool has_data;
    bool skip_lf;               /* last line ended with '\r' */
} pb_sse_t;

void pb_sse_init(pb_sse_t *s);
void pb_sse_fini(pb_sse_t *s);
/* Feed stream bytes; complete events go to cb. PD_ERR_TOO_BIG when an
 * event exceeds PB_SSE_EVENT_MAX, PD_ERR_NO_MEMORY. */
pd_status_t pb_sse_feed(pb_sse_t *s, const char *data, size_t len,
                        pb_sse_event_cb_t cb, void *arg);

#endif
