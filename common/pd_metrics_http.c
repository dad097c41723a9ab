/* pd_metrics_http.c - GET /metrics and /health over a minimal HTTP/1.1
 * server (see pd_metrics_http.h). One request per connection; the reply is
 * queued whole in the bufferevent and the client is freed when it drained. */
#include "pd_metrics_http.h"

#include "pd_log.h"
#include "pd_time.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <cjson/cJSON.h>

#define MH_COMP "metrics"
#define MH_DEF_MAX_CLIENTS 16u
#define MH_DEF_MAX_HEADER 8192u
#define MH_DEF_IDLE_NS 10000000000ULL

typedef struct mh_client {
    pd_metrics_http_t *m;
    struct bufferevent *bev;
    struct mh_client *prev, *next;
    bool replied;               /* reply queued: only waiting for the flush */
} mh_client_t;

struct pd_metrics_http {
    struct event *resume;       /* re-enables accept after EMFILE & co */
    pd_loop_t *loop;
    struct evconnlistener *lev;
    pd_metrics_http_opts_t o;   /* listen not kept */
    uint16_t port;
    unsigned n_clients;
    mh_client_t *clients;       /* doubly linked */
};

/* "a.b.c.d:port" or "[v6]:port"; port 0..65535 (0: any). evutil's parser
 * refuses port 0, hence by hand. */
static bool mh_parse_addr(const char *listen, struct sockaddr_storage *ss, int *len)
{
    char host[64];
    const char *colon;
    memset(ss, 0, sizeof(*ss));
    if (listen == NULL || (colon = strrchr(listen, ':')) == NULL)
        return false;
    const char *h = listen;
    size_t hl = (size_t)(colon - listen);
    if (h[0] == '[') {
        if (hl < 2 || h[hl - 1] != ']')
            return false;
        h++;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof(host))
        return false;
    memcpy(host, h, hl);
    host[hl] = '\0';
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (colon[1] < '0' || colon[1] > '9' || *end != '\0' || errno != 0 || port > 65535)
        return false;
    struct sockaddr_in *sin = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    if (listen[0] != '[' && evutil_inet_pton(AF_INET, host, &sin->sin_addr) == 1) {
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)port);
        *len = (int)sizeof(*sin);
        return true;
    }
    if (listen[0] == '[' && evutil_inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        *len = (int)sizeof(*s6);
        return true;
    }
    return false;
}

bool pd_metrics_http_addr_is_loopback(const char *listen)
{
    struct sockaddr_storage ss;
    int len;
    if (!mh_parse_addr(listen, &ss, &len))
        return false;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)&ss;
        return (ntohl(sin->sin_addr.s_addr) >> 24) == 127;
    }
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&ss;
        return IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr);
    }
    return false;
}

static void mh_client_free(mh_client_t *c)
{
    pd_metrics_http_t *m = c->m;
    if (c->prev)
        c->prev->next = c->next;
    else
        m->clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    m->n_clients--;
    bufferevent_free(c->bev);
    free(c);
}

/* Queue status line + headers (+ body unless head_only); the write callback
 * frees the client once the output drained. */
static void mh_reply(mh_client_t *c, int code, const char *reason, const char *ctype,
                     const char *body, size_t len, bool head_only)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    evbuffer_add_printf(out,
                        "HTTP/1.1 %d %s\r\n"
                        "Content-Type: %s\r\n"
                        "Content-Length: %zu\r\n"
                        "Cache-Control: no-store\r\n"
                        "Connection: close\r\n"
                        "\r\n",
                        code, reason, ctype, len);
    if (!head_only && len > 0)
        evbuffer_add(out, body, len);
    c->replied = true;
    bufferevent_disable(c->bev, EV_READ);
    bufferevent_enable(c->bev, EV_WRITE);
}

static void mh_reply_text(mh_client_t *c, int code, const char *reason, const char *body,
                          bool head_only)
{
    mh_reply(c, code, reason, "text/plain; charset=utf-8", body, strlen(body), head_only);
}

static void mh_handle(mh_client_t *c, char *line)
{
    pd_metrics_http_t *m = c->m;
    /* "METHOD SP target SP HTTP/1.x" */
    char *sp1 = strchr(line, ' ');
    char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (sp1 == NULL || sp2 == NULL || strchr(sp2 + 1, ' ') != NULL ||
        strncmp(sp2 + 1, "HTTP/1.", 7) != 0 || sp1 == line) {
        mh_reply_text(c, 400, "Bad Request", "bad request\n", false);
        return;
    }
    *sp1 = '\0';
    *sp2 = '\0';
    const char *method = line, *target = sp1 + 1;
    char path[64];
    size_t plen = strcspn(target, "?");
    if (plen >= sizeof(path))
        plen = sizeof(path) - 1;
    memcpy(path, target, plen);
    path[plen] = '\0';
    bool is_metrics = strcmp(path, "/metrics") == 0;
    bool is_ready = m->o.ready != NULL && strcmp(path, "/ready") == 0;
    bool is_health = is_ready || strcmp(path, "/health") == 0;
    if (!is_metrics && !is_health) {
        mh_reply_text(c, 404, "Not Found", "not found\n", false);
        return;
    }
    bool head = strcmp(method, "HEAD") == 0;
    if (!head && strcmp(method, "GET") != 0) {
        mh_reply_text(c, 405, "Method Not Allowed", "method not allowed\n", false);
        return;
    }
    if (is_health) {
        /* the router's bodies: {"status":"ok"} / {"status":"ready"}; a 503
         * says why ({"status":"unavailable"|"not_ready","reason":...}) */
        char why[256] = "";
        pd_metrics_health_t cb = is_ready ? m->o.ready : m->o.health;
        cJSON *o = cJSON_CreateObject();
        bool up = cb == NULL || cb(m->o.arg, why, sizeof(why));
        why[sizeof(why) - 1] = '\0';
        if (o != NULL) {
            cJSON_AddStringToObject(o, "status", up ? (is_ready ? "ready" : "ok")
                                                    : (is_ready ? "not_ready" : "unavailable"));
            if (!up)
                cJSON_AddStringToObject(o, "reason", why);
        }
        char *body = o != NULL ? cJSON_PrintUnformatted(o) : NULL;
        cJSON_Delete(o);
        if (body == NULL) {
            mh_reply_text(c, 500, "Internal Server Error", "out of memory\n", head);
            return;
        }
        mh_reply(c, up ? 200 : 503, up ? "OK" : "Service Unavailable", "application/json",
                 body, strlen(body), head);
        free(body);
        return;
    }
    char *text = NULL;
    size_t len = 0;
    pd_status_t st = m->o.render(m->o.arg, &text, &len);
    if (st != PD_OK || text == NULL) {
        free(text);
        mh_reply_text(c, 500, "Internal Server Error", "render failed\n", head);
        return;
    }
    mh_reply(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", text, len, head);
    free(text);
}

static void mh_read_cb(struct bufferevent *bev, void *arg)
{
    mh_client_t *c = arg;
    pd_metrics_http_t *m = c->m;
    struct evbuffer *in = bufferevent_get_input(bev);
    if (c->replied) {
        evbuffer_drain(in, evbuffer_get_length(in));
        return;
    }
    struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
    if (end.pos < 0)
        end = evbuffer_search(in, "\n\n", 2, NULL);
    size_t have = evbuffer_get_length(in);
    if (end.pos < 0 || (size_t)end.pos > m->o.max_header) {
        if (have > m->o.max_header) {
            evbuffer_drain(in, have);
            mh_reply_text(c, 431, "Request Header Fields Too Large", "headers too large\n",
                          false);
        }
        return;                 /* wait for more (the read timeout bounds it) */
    }
    size_t n_eol;
    char *line = evbuffer_readln(in, &n_eol, EVBUFFER_EOL_CRLF);
    evbuffer_drain(in, evbuffer_get_length(in));  /* headers ignored; no body */
    if (line == NULL) {
        mh_reply_text(c, 400, "Bad Request", "bad request\n", false);
        return;
    }
    mh_handle(c, line);
    free(line);
}

static void mh_write_cb(struct bufferevent *bev, void *arg)
{
    mh_client_t *c = arg;
    if (c->replied && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        mh_client_free(c);
}

static void mh_event_cb(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    mh_client_t *c = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
        mh_client_free(c);
}

static void mh_accept_cb(struct evconnlistener *lev, evutil_socket_t fd,
                         struct sockaddr *sa, int salen, void *arg)
{
    (void)lev;
    (void)sa;
    (void)salen;
    pd_metrics_http_t *m = arg;
    if (m->n_clients >= m->o.max_clients) {
        static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\n"
                                   "Content-Length: 0\r\nConnection: close\r\n\r\n";
        ssize_t rc = send(fd, busy, sizeof(busy) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)rc;               /* best effort: the close tells the client too */
        evutil_closesocket(fd);
        return;
    }
    mh_client_t *c = calloc(1, sizeof(*c));
    struct bufferevent *bev = c ? bufferevent_socket_new(pd_loop_base(m->loop), fd,
                                                         BEV_OPT_CLOSE_ON_FREE)
                                : NULL;
    if (bev == NULL) {
        free(c);
        evutil_closesocket(fd);
        return;
    }
    c->m = m;
    c->bev = bev;
    c->next = m->clients;
    if (m->clients)
        m->clients->prev = c;
    m->clients = c;
    m->n_clients++;
    struct timeval tv = pd_ns_to_timeval(m->o.idle_timeout_ns);
    bufferevent_set_timeouts(bev, &tv, &tv);
    bufferevent_setwatermark(bev, EV_READ, 0, m->o.max_header + 1);
    bufferevent_setcb(bev, mh_read_cb, mh_write_cb, mh_event_cb, c);
    bufferevent_enable(bev, EV_READ);
}

/* EMFILE and friends: the connection stays in the backlog and the listen
 * socket readable, so a still-enabled listener would spin the loop; pause
 * accepting for 100 ms instead. */
static void mh_listen_error_cb(struct evconnlistener *lev, void *arg)
{
    pd_metrics_http_t *m = arg;
    int err = EVUTIL_SOCKET_ERROR();
    PD_LOG_DEBUG(MH_COMP, "accept failed: %s; pausing 100 ms",
                 evutil_socket_error_to_string(err));
    if (m->resume != NULL) {
        struct timeval tv = { 0, 100000 };
        evconnlistener_disable(lev);
        evtimer_add(m->resume, &tv);
    }
}

static void mh_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    pd_metrics_http_t *m = arg;
    evconnlistener_enable(m->lev);
}

pd_status_t pd_metrics_http_create(pd_loop_t *loop, const pd_metrics_http_opts_t *opts,
                                   pd_metrics_http_t **m_p)
{
    struct sockaddr_storage ss;
    int sslen;
    if (loop == NULL || opts == NULL || opts->render == NULL || m_p == NULL ||
        !mh_parse_addr(opts->listen, &ss, &sslen))
        return PD_ERR_BAD_INPUT;
    pd_metrics_http_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return PD_ERR_NO_MEMORY;
    m->loop = loop;
    m->o = *opts;
    m->o.listen = NULL;
    if (m->o.max_clients == 0)
        m->o.max_clients = MH_DEF_MAX_CLIENTS;
    if (m->o.max_header == 0)
        m->o.max_header = MH_DEF_MAX_HEADER;
    if (m->o.idle_timeout_ns == 0)
        m->o.idle_timeout_ns = MH_DEF_IDLE_NS;
    m->lev = evconnlistener_new_bind(pd_loop_base(loop), mh_accept_cb, m,
                                     LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE |
                                         LEV_OPT_CLOSE_ON_EXEC,
                                     64, (struct sockaddr *)&ss, sslen);
    if (m->lev == NULL) {
        free(m);
        return PD_ERR_IO;
    }
    evconnlistener_set_error_cb(m->lev, mh_listen_error_cb);
    m->resume = evtimer_new(pd_loop_base(loop), mh_resume_cb, m);
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    if (getsockname(evconnlistener_get_fd(m->lev), (struct sockaddr *)&bound, &blen) == 0)
        m->port = ntohs(bound.ss_family == AF_INET6
                            ? ((struct sockaddr_in6 *)&bound)->sin6_port
                            : ((struct sockaddr_in *)&bound)->sin_port);
    *m_p = m;
    return PD_OK;
}

void pd_metrics_http_destroy(pd_metrics_http_t *m)
{
    if (m == NULL)
        return;
    evconnlistener_free(m->lev);
    if (m->resume != NULL)
        event_free(m->resume);
    while (m->clients != NULL)
        mh_client_free(m->clients);
    free(m);
}

uint16_t pd_metrics_http_port(const pd_metrics_http_t *m)
{
    return m->port;
}

unsigned pd_metrics_http_client_count(const pd_metrics_http_t *m)
{
    return m->n_clients;
}
