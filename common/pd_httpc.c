/* pd_httpc.c - see pd_httpc.h. */
#include "pd_httpc.h"
#include "pd_time.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

enum {
    ST_STATUS, ST_HEADER, ST_BODY_LEN, ST_BODY_CLOSE, ST_CHUNK_SIZE,
    ST_CHUNK_DATA, ST_CHUNK_CRLF, ST_TRAILER, ST_DONE, ST_ERROR,
};

#define CONTENT_LENGTH_MAX (1ULL << 40)
#define CHUNK_MAX          (1ULL << 32)

/* ---- response parser ---------------------------------------------------- */

void pd_httpc_resp_init(pd_httpc_resp_t *r, uint64_t body_max)
{
    memset(r, 0, sizeof(*r));
    r->state = ST_STATUS;
    r->content_length = -1;
    r->body_max = body_max;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int hex_val(char c)
{
    if (is_digit(c))
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* RFC 9110 tchar: what a header name is made of. */
static bool is_tchar(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
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

static pd_status_t on_status_line(pd_httpc_resp_t *r, const char *line)
{
    int code;

    if (strncmp(line, "HTTP/1.", 7) != 0 || (line[7] != '0' && line[7] != '1') ||
        line[8] != ' ' || !is_digit(line[9]) || !is_digit(line[10]) ||
        !is_digit(line[11]) || (line[12] != ' ' && line[12] != '\0'))
        return PD_ERR_BAD_INPUT;
    code = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
    if (code < 100 || code > 599)
        return PD_ERR_BAD_INPUT;
    r->status = code;
    r->conn_close = line[7] == '0';
    r->state = ST_HEADER;
    return PD_OK;
}

static pd_status_t start_body(pd_httpc_resp_t *r)
{
    r->headers_done = true;
    if (r->status == 204 || r->status == 304) {
        r->state = ST_DONE;
    } else if (r->chunked) {
        if (r->content_length >= 0)
            return PD_ERR_BAD_INPUT;    /* RFC 9112 6.3: smuggling shape */
        r->state = ST_CHUNK_SIZE;
    } else if (r->content_length >= 0) {
        if ((uint64_t)r->content_length > r->body_max)
            return PD_ERR_TOO_BIG;
        r->remaining = (uint64_t)r->content_length;
        r->state = r->remaining == 0 ? ST_DONE : ST_BODY_LEN;
    } else {
        r->state = ST_BODY_CLOSE;
    }
    r->complete = r->state == ST_DONE;
    return PD_OK;
}

static pd_status_t on_content_length(pd_httpc_resp_t *r, const char *value)
{
    uint64_t v = 0;
    const char *p = value;

    if (*p == '\0')
        return PD_ERR_BAD_INPUT;
    for (; *p != '\0'; p++) {
        if (!is_digit(*p))
            return PD_ERR_BAD_INPUT;
        v = v * 10 + (uint64_t)(*p - '0');
        if (v > CONTENT_LENGTH_MAX)
            return PD_ERR_TOO_BIG;
    }
    if (r->content_length >= 0 && (uint64_t)r->content_length != v)
        return PD_ERR_BAD_INPUT;
    r->content_length = (int64_t)v;
    return PD_OK;
}

static pd_status_t on_header_line(pd_httpc_resp_t *r, char *line)
{
    char *colon, *value, *end, *p;

    if (*line == '\0') {
        if (r->status < 200) {
            /* 1xx interim response: the real one follows. */
            uint64_t consumed = r->consumed, body_max = r->body_max;

            pd_httpc_resp_init(r, body_max);
            r->consumed = r->head_start = consumed;
            return PD_OK;
        }
        r->head_end = r->consumed;
        return start_body(r);
    }
    if (++r->n_headers > PD_HTTPC_HEADERS_MAX)
        return PD_ERR_TOO_BIG;
    colon = strchr(line, ':');
    if (colon == NULL || colon == line)
        return PD_ERR_BAD_INPUT;
    for (p = line; p < colon; p++)      /* also refuses obs-fold lines */
        if (!is_tchar(*p))
            return PD_ERR_BAD_INPUT;
    *colon = '\0';
    value = colon + 1;
    while (*value == ' ' || *value == '\t')
        value++;
    end = value + strlen(value);
    while (end > value && (end[-1] == ' ' || end[-1] == '\t'))
        *--end = '\0';
    if (strcasecmp(line, "content-length") == 0)
        return on_content_length(r, value);
    if (strcasecmp(line, "transfer-encoding") == 0) {
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

/* chunk-size [ BWS ";" chunk-ext ]: hex digits only, capped. */
static pd_status_t on_chunk_size(pd_httpc_resp_t *r, const char *line)
{
    uint64_t v = 0;
    const char *p = line;
    int d;

    if (hex_val(*p) < 0)
        return PD_ERR_BAD_INPUT;
    for (; (d = hex_val(*p)) >= 0; p++) {
        v = v * 16 + (uint64_t)d;
        if (v > CHUNK_MAX)
            return PD_ERR_TOO_BIG;
    }
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p != '\0' && *p != ';')
        return PD_ERR_BAD_INPUT;
    if (v > r->body_max - r->body_len)
        return PD_ERR_TOO_BIG;
    r->remaining = v;
    r->state = v == 0 ? ST_TRAILER : ST_CHUNK_DATA;
    return PD_OK;
}

static pd_status_t on_line(pd_httpc_resp_t *r, char *line)
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
        } else if (++r->n_headers > PD_HTTPC_HEADERS_MAX) {
            return PD_ERR_TOO_BIG;      /* trailers count as headers */
        }
        return PD_OK;
    default:
        return PD_ERR_INTERNAL;
    }
}

static bool in_head(const pd_httpc_resp_t *r)
{
    return r->state == ST_STATUS || r->state == ST_HEADER;
}

pd_status_t pd_httpc_resp_feed(pd_httpc_resp_t *r, const char *data, size_t len,
                               pd_httpc_body_cb_t body_cb, void *arg, size_t *used_p)
{
    size_t i = 0;
    pd_status_t status = PD_OK;

    if (r->state == ST_ERROR) {
        status = PD_ERR_BAD_INPUT;
        len = 0;
    }
    while (i < len && r->state != ST_DONE) {
        if (r->state == ST_BODY_LEN || r->state == ST_CHUNK_DATA ||
            r->state == ST_BODY_CLOSE) {
            size_t n = len - i;

            if (r->state != ST_BODY_CLOSE && n > r->remaining)
                n = (size_t)r->remaining;
            if (n > r->body_max - r->body_len) {
                status = PD_ERR_TOO_BIG;   /* only a close-delimited body */
                break;
            }
            if (body_cb != NULL)
                body_cb(arg, data + i, n);
            i += n;
            r->consumed += n;
            r->body_len += n;
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
        if (in_head(r) && r->consumed - r->head_start >= PD_HTTPC_HEAD_MAX) {
            status = PD_ERR_TOO_BIG;
            break;
        }
        r->consumed++;
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
    if (status != PD_OK)
        r->state = ST_ERROR;
    if (used_p != NULL)
        *used_p = i;
    return status;
}

bool pd_httpc_resp_eof(pd_httpc_resp_t *r)
{
    if (r->state == ST_BODY_CLOSE) {
        r->state = ST_DONE;
        r->complete = true;
    }
    return r->complete;
}

/* ---- SSE ---------------------------------------------------------------- */

void pd_sse_init(pd_sse_t *s)
{
    memset(s, 0, sizeof(*s));
}

void pd_sse_fini(pd_sse_t *s)
{
    if (s == NULL)
        return;
    free(s->buf);
    memset(s, 0, sizeof(*s));
}

bool pd_sse_pending(const pd_sse_t *s)
{
    return s->has_data || s->len > s->line_start;
}

static pd_status_t sse_reserve(pd_sse_t *s, size_t need)
{
    size_t cap;
    char *nb;

    if (need <= s->cap)
        return PD_OK;
    if (need > PD_SSE_EVENT_MAX + 2)
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

static void sse_line(pd_sse_t *s, pd_sse_event_cb_t cb, void *arg)
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

pd_status_t pd_sse_feed(pd_sse_t *s, const char *data, size_t len,
                        pd_sse_event_cb_t cb, void *arg)
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

/* ---- blocking request helper ------------------------------------------- */

int pd_httpc_split_addr(const char *addr, char *host, size_t host_cap, char *port,
                        size_t port_cap)
{
    const char *colon = strrchr(addr, ':');
    unsigned long p = 0;
    const char *d;

    if (colon == NULL || colon == addr || (size_t)(colon - addr) >= host_cap ||
        colon[1] == '\0')
        return -1;
    for (d = colon + 1; *d != '\0'; d++) {
        if (!is_digit(*d))
            return -1;
        p = p * 10 + (unsigned long)(*d - '0');
        if (p > 65535)
            return -1;
    }
    if (p == 0)
        return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    snprintf(port, port_cap, "%lu", p);
    return 0;
}

/* Milliseconds left before deadline_ns for poll(); 0 when past it. */
static int ms_left(uint64_t deadline_ns)
{
    uint64_t now = pd_now_ns();

    if (now >= deadline_ns)
        return 0;
    return (int)((deadline_ns - now + PD_NS_PER_MS - 1) / PD_NS_PER_MS);
}

static pd_status_t wait_fd(int fd, short events, uint64_t deadline_ns)
{
    struct pollfd p = { fd, events, 0 };

    for (;;) {
        int left = ms_left(deadline_ns);
        int n;

        if (left == 0)
            return PD_ERR_TIMED_OUT;
        n = poll(&p, 1, left);
        if (n > 0)
            return PD_OK;
        if (n < 0 && errno != EINTR)
            return PD_ERR_IO;
    }
}

static int connect_one(const struct addrinfo *ai, uint64_t deadline_ns)
{
    int fd, one = 1, err = 0;
    socklen_t el = sizeof(err);
    pd_status_t status;

    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return PD_ERR_IO;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            close(fd);
            return PD_ERR_IO;
        }
        status = wait_fd(fd, POLLOUT, deadline_ns);
        if (status != PD_OK) {
            close(fd);
            return status;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
            close(fd);
            return PD_ERR_IO;
        }
    }
    return fd;
}

int pd_httpc_connect(const char *host, const char *port, uint64_t deadline_ns)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
    struct addrinfo *list = NULL, *ai;
    int fd = PD_ERR_IO;

    if (port == NULL || *port == '\0')
        return PD_ERR_BAD_INPUT;
    if (getaddrinfo(host, port, &hints, &list) != 0 || list == NULL)
        return PD_ERR_IO;               /* unresolvable now: the caller retries */
    for (ai = list; ai != NULL; ai = ai->ai_next) {
        fd = connect_one(ai, deadline_ns);
        if (fd >= 0 || fd == PD_ERR_TIMED_OUT)
            break;
    }
    freeaddrinfo(list);
    return fd;
}

static pd_status_t send_all(int fd, const char *p, size_t n, uint64_t deadline_ns)
{
    pd_status_t status;

    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return PD_ERR_IO;
        status = wait_fd(fd, POLLOUT, deadline_ns);
        if (status != PD_OK)
            return status;
    }
    return PD_OK;
}

pd_status_t pd_httpc_send(int fd, const pd_httpc_req_t *req, uint64_t deadline_ns)
{
    char head[4096];
    int n;
    pd_status_t status;

    if (req->body != NULL)
        n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: %s\r\n%sContent-Type: %s\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     req->method, req->path, req->host, req->headers ? req->headers : "",
                     req->content_type ? req->content_type : "application/json",
                     req->body_len);
    else
        n = snprintf(head, sizeof(head),
                     "%s %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n",
                     req->method, req->path, req->host, req->headers ? req->headers : "");
    if (n < 0 || (size_t)n >= sizeof(head))
        return PD_ERR_TOO_BIG;
    status = send_all(fd, head, (size_t)n, deadline_ns);
    if (status == PD_OK && req->body != NULL && req->body_len > 0)
        status = send_all(fd, req->body, req->body_len, deadline_ns);
    return status;
}

typedef struct {
    pd_httpc_reply_t *rep;
    size_t cap;
    bool oom;
} recv_body_t;

static void recv_body(void *arg, const char *data, size_t len)
{
    recv_body_t *b = arg;
    pd_httpc_reply_t *rep = b->rep;

    if (b->oom)
        return;
    if (rep->body_len + len + 1 > b->cap) {
        size_t cap = (rep->body_len + len + 1) * 2;
        char *nb = realloc(rep->body, cap);

        if (nb == NULL) {
            b->oom = true;
            return;
        }
        rep->body = nb;
        b->cap = cap;
    }
    memcpy(rep->body + rep->body_len, data, len);
    rep->body_len += len;
    rep->body[rep->body_len] = '\0';
}

/* The head as the caller sees it: the final response's status line and
 * headers without the blank line; all head bytes so far when incomplete. */
static char *head_copy(const pd_httpc_resp_t *r, const char *raw, size_t raw_len)
{
    size_t start = 0, end = raw_len;

    if (r->headers_done && r->head_end <= raw_len) {
        start = (size_t)r->head_start;
        end = (size_t)r->head_end;
        if (end >= start + 2 && raw[end - 1] == '\n')
            end -= raw[end - 2] == '\r' ? 2 : 1;
        if (end >= start + 2 && raw[end - 1] == '\n')
            end -= raw[end - 2] == '\r' ? 2 : 1;
    }
    return strndup(raw + start, end - start);
}

pd_status_t pd_httpc_recv(int fd, pd_httpc_resp_t *r, uint64_t deadline_ns,
                          pd_httpc_reply_t *rep)
{
    char buf[16384];
    char *raw = NULL;                   /* head bytes as received */
    size_t raw_len = 0;
    recv_body_t b = { rep, 0, false };
    pd_status_t status = PD_OK;

    while (!r->complete) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        size_t used = 0;

        if (n == 0) {
            if (!pd_httpc_resp_eof(r))  /* closed early: in the head, a malformed reply */
                status = !r->headers_done && r->consumed > 0 ? PD_ERR_BAD_INPUT : PD_ERR_IO;
            break;
        }
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                status = PD_ERR_IO;
                break;
            }
            status = wait_fd(fd, POLLIN, deadline_ns);
            if (status != PD_OK)
                break;
            continue;
        }
        if (!r->headers_done) {
            size_t keep = (size_t)n;
            char *nr;

            if (keep > PD_HTTPC_HEAD_MAX + 4 - raw_len)
                keep = PD_HTTPC_HEAD_MAX + 4 - raw_len;
            nr = realloc(raw, raw_len + keep + 1);
            if (nr == NULL) {
                status = PD_ERR_NO_MEMORY;
                break;
            }
            raw = nr;
            memcpy(raw + raw_len, buf, keep);
            raw_len += keep;
            raw[raw_len] = '\0';
        }
        status = pd_httpc_resp_feed(r, buf, (size_t)n, recv_body, &b, &used);
        if (status == PD_OK && b.oom)
            status = PD_ERR_NO_MEMORY;
        if (status != PD_OK)
            break;
    }
    rep->status = r->status;
    rep->complete = r->complete;
    free(rep->head);
    rep->head = head_copy(r, raw ? raw : "", raw_len);
    if (rep->body == NULL)
        rep->body = strdup("");
    free(raw);
    if (rep->head == NULL || rep->body == NULL)
        return PD_ERR_NO_MEMORY;
    return status;
}

pd_status_t pd_httpc_parse(const char *raw, size_t len, uint64_t body_max,
                           pd_httpc_reply_t *rep)
{
    pd_httpc_resp_t *r = malloc(sizeof(*r));
    recv_body_t b = { rep, 0, false };
    pd_status_t status;

    memset(rep, 0, sizeof(*rep));
    if (r == NULL)
        return PD_ERR_NO_MEMORY;
    pd_httpc_resp_init(r, body_max);
    status = pd_httpc_resp_feed(r, raw, len, recv_body, &b, NULL);
    if (status == PD_OK && b.oom)
        status = PD_ERR_NO_MEMORY;
    if (status == PD_OK)
        pd_httpc_resp_eof(r);
    rep->status = r->status;
    rep->complete = r->complete;
    rep->head = head_copy(r, raw != NULL ? raw : "", raw != NULL ? len : 0);
    if (rep->body == NULL)
        rep->body = strdup("");
    free(r);
    if (rep->head == NULL || rep->body == NULL)
        return PD_ERR_NO_MEMORY;
    return status;
}

pd_status_t pd_httpc_fetch(const char *addr, const pd_httpc_req_t *req, uint64_t timeout_ns,
                           uint64_t body_max, pd_httpc_reply_t *rep)
{
    uint64_t deadline_ns = pd_now_ns() + timeout_ns;
    char host[256], port[8];
    pd_httpc_resp_t *r;
    pd_status_t status;
    int fd;

    memset(rep, 0, sizeof(*rep));
    if (pd_httpc_split_addr(addr, host, sizeof(host), port, sizeof(port)) != 0)
        return PD_ERR_BAD_INPUT;
    fd = pd_httpc_connect(host, port, deadline_ns);
    if (fd < 0)
        return (pd_status_t)fd;
    status = pd_httpc_send(fd, req, deadline_ns);
    if (status != PD_OK)
        goto err_close;
    r = malloc(sizeof(*r));
    if (r == NULL) {
        status = PD_ERR_NO_MEMORY;
        goto err_close;
    }
    pd_httpc_resp_init(r, body_max);
    status = pd_httpc_recv(fd, r, deadline_ns, rep);
    free(r);
err_close:
    close(fd);
    return status;
}

void pd_httpc_reply_free(pd_httpc_reply_t *rep)
{
    if (rep == NULL)
        return;
    free(rep->head);
    free(rep->body);
    memset(rep, 0, sizeof(*rep));
}
