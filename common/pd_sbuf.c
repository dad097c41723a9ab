#include "pd_sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int sbuf_reserve(pd_sbuf_t *sb, size_t extra)
{
    if (sb->failed)
        return -1;
    if (sb->len + extra + 1 <= sb->cap)
        return 0;
    size_t cap = sb->cap ? sb->cap : 256;
    while (cap < sb->len + extra + 1) {
        if (cap > ((size_t)-1) / 2) {
            sb->failed = 1;
            return -1;
        }
        cap *= 2;
    }
    char *nb = realloc(sb->buf, cap);
    if (nb == NULL) {
        sb->failed = 1;
        return -1;
    }
    sb->buf = nb;
    sb->cap = cap;
    return 0;
}

void pd_sbuf_printf(pd_sbuf_t *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        sb->failed = 1;
        return;
    }
    if (sbuf_reserve(sb, (size_t)n) != 0)
        return;
    va_start(ap, fmt);
    vsnprintf(sb->buf + sb->len, sb->cap - sb->len, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

void pd_sbuf_append(pd_sbuf_t *sb, const char *data, size_t n)
{
    if (sbuf_reserve(sb, n) != 0)
        return;
    memcpy(sb->buf + sb->len, data, n);
    sb->len += n;
    sb->buf[sb->len] = '\0';
}

char *pd_sbuf_finish(pd_sbuf_t *sb, size_t *len_p)
{
    if (!sb->failed && sb->buf == NULL)
        sbuf_reserve(sb, 0);
    if (sb->failed) {
        pd_sbuf_free(sb);
        return NULL;
    }
    sb->buf[sb->len] = '\0';
    char *out = sb->buf;
    if (len_p != NULL)
        *len_p = sb->len;
    sb->buf = NULL;
    sb->len = sb->cap = 0;
    return out;
}

void pd_sbuf_free(pd_sbuf_t *sb)
{
    free(sb->buf);
    sb->buf = NULL;
    sb->len = sb->cap = 0;
    sb->failed = 0;
}
