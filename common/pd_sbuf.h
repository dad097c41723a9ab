/* pd_sbuf.h - a growable NUL-terminated string for building text output
 * (help, INI dumps, Prometheus exposition). Errors are sticky: after an
 * allocation failure every append is a no-op and pd_sbuf_finish returns
 * NULL, so builders check once at the end. */
#ifndef PD_SBUF_H
#define PD_SBUF_H

#include <stddef.h>

typedef struct {
    char *buf;      /* NUL-terminated when len > 0 */
    size_t len, cap;
    int failed;
} pd_sbuf_t;

#define PD_SBUF_INIT { NULL, 0, 0, 0 }

/* Append formatted text. */
void pd_sbuf_printf(pd_sbuf_t *sb, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Append n raw bytes. */
void pd_sbuf_append(pd_sbuf_t *sb, const char *data, size_t n);
/* Hand over the buffer (caller frees) or NULL after a failure (buffer
 * freed). An empty builder yields "". *len_p (may be NULL) gets the length. */
char *pd_sbuf_finish(pd_sbuf_t *sb, size_t *len_p);
/* Drop the contents. */
void pd_sbuf_free(pd_sbuf_t *sb);

#endif
