/* pb_http.c - see pb_http.h. */
#include "pb_http.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum {
    ST_STATUS, ST_HEADER, ST_BODY_LEN, ST_BODY_CLOSE, ST_CHUNK_SIZE,
    ST_CHUNK_DATA, ST_CHUNK_CRLF, ST_TRAILER, ST_DONE,
};

void pb_http_resp_init(pb_http_resp_t *r)
{
    memset(r, 0, sizeof(*r));
    r->state = ST_STATUS;
    r->content_length = -1;
}

static bool has_token(const char *value, const char *token)
{
    /* Comma-separated list, case-insensitive ("keep-alive, close"). */
    size_t tl = strlen(token);
    const char *p = value;

    while (*p != '\0') {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (strncasecmp(p, token, tl) == 0 &&
            (p[tl] == '\0' || p[tl] == ',' || p[tl] == ' ' || p[tl] == '\t' ||
             p[tl] == ';'))
            return true;
        while (*p != '\0' && *p != ',')
            p++;
    }
    return false;
}

static pd_status_t on_status_line(pb_http_resp_t *r, char *line)
{
    char *end;
    long code;

    if (strncmp(line, "HTTP/1.", 7) != 0 || (line[7] != '0' && line[7] != '1') ||
        line[8] != ' ')
        return PD_ERR_BAD_INPUT;
    if (!isdigit((unsigned char)line[9]))
        return PD_ERR_BAD_INPUT;
    code = strtol(line + 9, &end, 10);
    if (end != line + 12 || (*end != ' ' && *end != '\0') || code < 100 ||
        code > 599)
        return PD_ERR_BAD_INPUT;
    r->status = (int)code;
    r->conn_close = line[7] == '0';
    r->state = ST_HEADER;
    return PD_OK;
}

static void start_body(pb_http_resp_t *r)
{
    r->headers_done = true;
    if (r->status == 204 || r->status == 304) {
        r->state = ST_DONE;
    } else if (r->chunked) {
        r->state = ST_CHUNK_SIZE;
    } else if (r->content_length >= 0) {
        r->remaining = (uint64_t)r->content_length;
        r->state = r->remaining == 0 ? ST_DONE : ST_BODY_LEN;
    } else {
        r->state = ST_BODY_CLOSE;
    }
    r->complete = r->state == ST_DONE;
}

static pd_status_t on_header_line(pb_http_resp_t *r, char *line)
{
    char *colon, *value, *end;

    if (*line == '\0') {
        if (r->status < 200) {
            /* 1xx interim response: a real one follows. */
            pb_http_resp_init(r);
            return PD_OK;
        }
        start_body(r);
        return PD_OK;
    }
    if (++r->n_headers > PB_HTTP_HEADERS_MAX)
        return PD_ERR_TOO_BIG;
    colon = strchr(line, ':');
    if (colon == NULL || colon == line)
        return PD_ERR_BAD_INPUT;
    *colon = '\0';
    value = colon + 1;
    while (*value == ' ' || *value == '\t')
        value++;
    end = value + strlen(value);
    while (end > value && (end[-1] == ' ' || end[-1] == '\t'))
        *--end = '\0';
    if (strcasecmp(line, "content-length") == 0) {
        unsigned long long v;
        if (!isdigit((unsigned char)*value))
            return PD_ERR_BAD_INPUT;
        errno = 0;
        v = strtoull(value, &end, 10);
        if (errno != 0 || *end != '\0' || v > (1ULL << 40))
            return PD_ERR_BAD_INPUT;
        if (r->content_length >= 0 && (uint64_t)r->content_length != v)
            return PD_ERR_BAD_INPUT;
        r->content_length = (int64_t)v;
    } else if (strcasecmp(line, "transfer-encoding") == 0) {
        if (has_token(value, "chunked"))
            r->chunked = true;
        else if (!has_token(value, "identity"))
            return PD_ERR_BAD_INPUT;
    } else if (strcasecmp(line, "connection") == 0) {
        if (has_token(value, "close"))
            r->conn_close = true;
        else if (has_token(value, "keep-alive"))
            r->conn_close = false;
    }
    return PD_OK;
}

static pd_status_t on_chunk_size(pb_http_resp_t *r, char *line)
{
    char *end;
    unsigned long long v;

    if (!isxdigit((unsigned char)*line))
        return PD_ERR_BAD_INPUT;
    errno = 0;
    v = strtoull(line, &end, 16);
    if (errno != 0 || v > (1ULL << 32))
        return PD_ERR_TOO_BIG;
    while (*end == ' ' || *end == '\t')
        end++;
    if (*end != '\0' && *end != ';')
        return PD_ERR_BAD_INPUT;
    r->remaining = v;
    r->state = v == 0 ? ST_TRAILER : ST_CHUNK_DATA;
    return PD_OK;
}

static pd_status_t on_line(pb_http_resp_t *r, char *line)
{
    switch (r->state) {
    case ST_STATUS:
        return on_status_line(r, line);
    case ST_HEADER:
        return on_header_line(r, line);
    case ST_CHUNK_SIZE:
        return on_chunk_size(r, line);
    case ST_CHUNK_CRLF:
        if (*line != '\0')
            return PD_ERR_BAD_INPUT;
        r->state = ST_CHUNK_SIZE;
        return PD_OK;
    case ST_TRAILER:
        if (*line == '\0') {
            r->state = ST_DONE;
            r->complete = true;
        }
        return PD_OK;
    default:
        return PD_ERR_INTERNAL;
    }
}

pd_status_t pb_http_resp_feed(pb_http_resp_t *r, const char *data, size_t len,
                              pb_http_body_cb_t body_cb, void *arg,
                              size_t *used_p)
{
    size_t i = 0;
    pd_status_t status = PD_OK;

    while (i < len && r->state != ST_DONE) {
        if (r->state == ST_BODY_LEN || r->state == ST_CHUNK_DATA ||
            r->state == ST_BODY_CLOSE) {
            size_t n = len - i;

            if (r->state != ST_BODY_CLOSE && n > r->remaining)
                n = (size_t)r->remaining;
            if (body_cb != NULL)
                body_cb(arg, data + i, n);
            i += n;
            if (r->state == ST_BODY_CLOSE)
                continue;
            r->remaining -= n;
            if (r->remaining == 0) {
                if (r->state == ST_CHUNK_DATA) {
                    r->state = ST_CHUNK_CRLF;
                } else {
                    r->state = ST_DONE;
                    r->complete = true;
                }
            }
            continue;
        }
        /* Line-oriented states. */
        if (data[i] == '\n') {
            i++;
            if (r->line_len > 0 && r->line[r->line_len - 1] == '\r')
                r->line_len--;
            r->line[r->line_len] = '\0';
            r->line_len = 0;
            status = on_line(r, r->line);
            if (status != PD_OK)
                break;
            continue;
        }
        if (r->line_len + 1 >= sizeof(r->line)) {
            status = PD_ERR_TOO_BIG;
            break;
        }
        r->line[r->line_len++] = data[i++];
    }
    if (used_p != NULL)
        *used_p = i;
    return status;
}

bool pb_http_resp_eof(pb_http_resp_t *r)
{
    if (r->state == ST_BODY_CLOSE) {
        r->state = ST_DONE;
        r->complete = true;
    }
    return r->complete;
}

/* ---- SSE ------------------------------------------------------------ */

void pb_sse_init(pb_sse_t *s)
{
    memset(s, 0, sizeof(*s));
}

void pb_sse_fini(pb_sse_t *s)
{
    if (s == NULL)
        return;
    free(s->buf);
    memset(s, 0, sizeof(*s));
}

static pd_status_t sse_reserve(pb_sse_t *s, size_t need)
{
    size_t cap;
    char *nb;

    if (need <= s->cap)
        return PD_OK;
    if (need > PB_SSE_EVENT_MAX + 2)
        return PD_ERR_TOO_BIG;
    cap = s->cap ? s->cap : 512;
    while (cap < need)
        cap *= 2;
    nb = realloc(s->buf, cap);
    if (nb == NULL)
        return PD_ERR_NO_MEMORY;
    s->buf = nb;
    s->cap = cap;
    return PD_OK;
}

static void sse_line(pb_sse_t *s, pb_sse_event_cb_t cb, void *arg)
{
    char *line = s->buf + s->line_start;
    size_t ll = s->len - s->line_start;
    size_t vstart, vlen, sep;

    if (ll == 0) {
        if (s->has_data) {
            s->buf[s->data_len] = '\0';
            cb(arg, s->buf, s->data_len);
        }
        s->data_len = 0;
        s->has_data = false;
    } else if (ll >= 4 && memcmp(line, "data", 4) == 0 &&
               (ll == 4 || line[4] == ':')) {
        vstart = ll == 4 ? 4 : 5;
        if (vstart < ll && line[vstart] == ' ')
            vstart++;
        vlen = ll - vstart;
        sep = s->has_data ? 1 : 0;
        if (sep)
            s->buf[s->data_len] = '\n';
        memmove(s->buf + s->data_len + sep, line + vstart, vlen);
        s->data_len += sep + vlen;
        s->has_data = true;
    }
    /* Comments (':') and other fields (event, id, retry) are dropped. */
    s->len = s->line_start = s->data_len;
}

pd_status_t pb_sse_feed(pb_sse_t *s, const char *data, size_t len,
                        pb_sse_event_cb_t cb, void *arg)
{
    size_t i;
    pd_status_t status;

    for (i = 0; i < len; i++) {
        char c = data[i];

        if (s->skip_lf) {
            s->skip_lf = false;
            if (c == '\n')
                continue;
        }
        if (c == '\r' || c == '\n') {
            /* +1 leaves room for the NUL written on dispatch. */
            status = sse_reserve(s, s->len + 1);
            if (status != PD_OK)
                return status;
            s->skip_lf = c == '\r';
            sse_line(s, cb, arg);
            continue;
        }
        status = sse_reserve(s, s->len + 2);
        if (status != PD_OK)
            return status;
        s->buf[s->len++] = c;
    }
    return PD_OK;
}
