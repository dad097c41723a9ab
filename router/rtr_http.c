/* rtr_http.c - pd-router's OpenAI front end, the only file that includes
 * evhttp: routes, request parsing and limits, tokenizing, plain replies,
 * the SSE response, client watchers (EOF, close, slow reader) and, while
 * draining, flushing. The request life cycle is rtr_flow.c; it reaches the
 * client through the output calls at the end of this file (rtr_http_out).
 *
 * evhttp lifetime rules followed here (libevent 2.1.12):
 *   - a request is answered exactly once (evhttp_send_reply or
 *     send_reply_start ... send_reply_end);
 *   - evhttp disables reading while the user holds a request, so a client
 *     that goes away is noticed by a separate EV_READ watcher on the socket
 *     (recv MSG_PEEK == 0) or by the connection close callback (write error);
 *   - in the close callback the request is either detached by libevent
 *     (evhttp_request_get_connection == NULL: ours to free) or about to be
 *     freed with the connection: the pointer is dropped either way and never
 *     used again. */
#include "rtr_anthropic.h"
#include "rtr_embed_job.h"
#include "rtr_flow.h"
#include "rtr_tools.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/http_struct.h>
#include <event2/keyvalq_struct.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

#include "pd_log.h"
#include "rtr_tok.h"
#include "pd_time.h"

/* ---- plain HTTP replies ---------------------------------------------------- */

static void add_common_headers(struct evhttp_request *h, const char *reqid)
{
    struct evkeyvalq *out = evhttp_request_get_output_headers(h);
    if (reqid != NULL && reqid[0] != '\0')
        evhttp_add_header(out, "X-Request-Id", reqid);
}

static void reply_json(struct evhttp_request *h, int status, const char *json,
                       const char *reqid, unsigned retry_after)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_error(h, 500, NULL);
        return;
    }
    evbuffer_add(b, json, strlen(json));
    evbuffer_add(b, "\n", 1);
    add_common_headers(h, reqid);
    struct evkeyvalq *out = evhttp_request_get_output_headers(h);
    evhttp_add_header(out, "Content-Type", "application/json");
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof(ra), "%u", retry_after);
        evhttp_add_header(out, "Retry-After", ra);
    }
    evhttp_send_reply(h, status, NULL, b);
    evbuffer_free(b);
}

/* "address:port" of the client of h, "-" if unknown. */
static void peer_of(struct evhttp_request *h, char *buf, size_t cap)
{
    struct evhttp_connection *evcon = h != NULL ? evhttp_request_get_connection(h) : NULL;
    char *addr = NULL;
    ev_uint16_t port = 0;
    if (evcon != NULL)
        evhttp_connection_get_peer(evcon, &addr, &port);
    if (addr != NULL)
        snprintf(buf, cap, strchr(addr, ':') != NULL ? "[%s]:%u" : "%s:%u", addr, port);
    else
        snprintf(buf, cap, "-");
}

static void send_error(rtr_t *r, struct evhttp_request *h, const rtr_oai_error_t *err,
                       const char *reqid);

/* A request refused before acceptance: the error reply and its access-log
 * line (accepted requests get theirs where they end, rtr_flow.c req_end). */
static void reply_error(rtr_t *r, struct evhttp_request *h, const rtr_oai_error_t *err,
                        const char *reqid)
{
    char peer[64];
    const char *path = h != NULL ? evhttp_uri_get_path(evhttp_request_get_evhttp_uri(h)) : NULL;
    peer_of(h, peer, sizeof(peer));
    pd_log(PD_LOG_INFO, RTR_COMP, reqid,
           "access client=%s endpoint=%s status=%d outcome=refused prompt_tokens=0 "
           "cached_tokens=0 completion_tokens=0 ttft_ms=-1.0 total_ms=0.0 prefill=- decode=- "
           "retries=0 code=%s", peer, path != NULL ? path : "-", err->http_status,
           err->code != NULL ? err->code : "-");
    send_error(r, h, err, reqid);
}

/* An error in the envelope of the API the client called: Anthropic's on
 * /v1/messages*, OpenAI's everywhere else. */
static char *error_json_for(struct evhttp_request *h, const rtr_oai_error_t *err)
{
    const char *path = h != NULL ? evhttp_uri_get_path(evhttp_request_get_evhttp_uri(h)) : NULL;
    if (path != NULL && (strcmp(path, "/v1/messages") == 0 ||
                         strncmp(path, "/v1/messages/", 13) == 0))
        return rtr_anth_error_json(err);
    return rtr_oai_error_json(err);
}

static void send_error(rtr_t *r, struct evhttp_request *h, const rtr_oai_error_t *err,
                       const char *reqid)
{
    char *json = error_json_for(h, err);
    unsigned ra = (err->http_status == 429 || err->http_status == 503)
                      ? (unsigned)r->cfg.retry_after : 0;
    reply_json(h, err->http_status,
               json != NULL ? json : "{\"error\":{\"message\":\"out of memory\","
                                     "\"type\":\"server_error\",\"param\":null,\"code\":null}}",
               reqid, ra);
    free(json);
    if (err->http_status >= 500 && err->http_status != 503)
        pd_log(PD_LOG_WARN, RTR_COMP, reqid, "HTTP %d: %s", err->http_status, err->message);
    else
        pd_log(PD_LOG_DEBUG, RTR_COMP, reqid, "HTTP %d: %s", err->http_status, err->message);
}

static void reply_status(rtr_t *r, struct evhttp_request *h, const char *reqid, int status,
                         const char *type, const char *code, const char *param,
                         const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static void reply_status(rtr_t *r, struct evhttp_request *h, const char *reqid, int status,
                         const char *type, const char *code, const char *param,
                         const char *fmt, ...)
{
    rtr_oai_error_t err;
    memset(&err, 0, sizeof(err));
    err.http_status = status;
    err.type = type;
    err.code = code;
    err.param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.message, sizeof(err.message), fmt, ap);
    va_end(ap);
    reply_error(r, h, &err, reqid);
}

/* The admission every request passes once its body is checked: refused
 * while draining (503) and at max-concurrent requests in flight (429;
 * r->n_reqs counts chat requests and embeddings jobs alike). false: refused
 * (replied, counted). */
static bool admit(rtr_t *r, struct evhttp_request *h, const char *reqid)
{
    if (r->draining) {
        pd_stats_inc(r->stats, RTR_STAT_requests_overloaded);
        reply_status(r, h, reqid, 503, "server_error", "shutting_down", NULL,
                     "the router is draining");
        return false;
    }
    if (r->n_reqs >= r->cfg.max_concurrent) {
        pd_stats_inc(r->stats, RTR_STAT_requests_overloaded);
        reply_status(r, h, reqid, 429, "rate_limit_error", "too_many_requests", NULL,
                     "too many requests in flight (%u); retry later", r->n_reqs);
        return false;
    }
    return true;
}

/* ---- the client of one request --------------------------------------------- */

static void req_stop_watching(rtr_req_t *q)
{
    rtr_client_t *c = &q->client;
    if (c->watch != NULL) {
        event_free(c->watch);
        c->watch = NULL;
    }
    if (c->http != NULL && c->evcon != NULL)
        evhttp_connection_set_closecb(c->evcon, NULL, NULL);
}

/* Draining: responses that ended are tracked until their bytes left the
 * process (output buffer empty) or their connection closed, so exiting does
 * not cut the last chunks ([DONE]) of a stream. */
#define FLUSH_MAX 256
static struct evhttp_connection *flushing[FLUSH_MAX];
static unsigned n_flushing;

static void flush_forget(struct evhttp_connection *evcon)
{
    for (unsigned i = 0; i < n_flushing; i++) {
        if (flushing[i] == evcon) {
            flushing[i] = flushing[--n_flushing];
            return;
        }
    }
}

static void on_flush_close(struct evhttp_connection *evcon, void *arg)
{
    flush_forget(evcon);
}

static void flush_track(struct evhttp_connection *evcon)
{
    if (evcon == NULL || n_flushing == FLUSH_MAX)
        return;
    flush_forget(evcon);
    flushing[n_flushing++] = evcon;
    evhttp_connection_set_closecb(evcon, on_flush_close, NULL);
}

static void flush_tick(evutil_socket_t fd, short what, void *arg)
{
    rtr_t *r = arg;
    for (unsigned i = 0; i < n_flushing;) {
        struct bufferevent *bev = evhttp_connection_get_bufferevent(flushing[i]);
        if (bev == NULL || evbuffer_get_length(bufferevent_get_output(bev)) == 0) {
            evhttp_connection_set_closecb(flushing[i], NULL, NULL);
            flushing[i] = flushing[--n_flushing];
        } else {
            i++;
        }
    }
    if (n_flushing == 0) {
        pd_log(PD_LOG_INFO, RTR_COMP, NULL, "drain complete: no requests in flight, exiting");
        pd_loop_stop(r->loop);
    }
}

/* ---- output calls for the flow (rtr_flow.h) -------------------------------- */

static bool out_attached(const rtr_req_t *q)
{
    return q->client.http != NULL;
}

/* The seed the request samples with (the client's, or the one drawn for it),
 * so that any answer can be reproduced by sending it back as "seed". */
static void add_seed_header(rtr_req_t *q)
{
    char v[24];
    snprintf(v, sizeof(v), "%" PRId64, (int64_t)q->oai.seed);
    evhttp_add_header(evhttp_request_get_output_headers(q->client.http), "X-Seed", v);
}

static void out_stream_open(rtr_req_t *q)
{
    struct evhttp_request *h = q->client.http;
    struct evkeyvalq *out = evhttp_request_get_output_headers(h);
    evhttp_add_header(out, "Content-Type", "text/event-stream");
    evhttp_add_header(out, "Cache-Control", "no-cache");
    add_common_headers(h, q->id);
    add_seed_header(q);
    q->client.status = 200;
    evhttp_send_reply_start(h, 200, "OK");
}

static void out_write(rtr_req_t *q, const char *bytes, size_t len)
{
    struct evbuffer *b = evbuffer_new();
    if (b != NULL) {
        evbuffer_add(b, bytes, len);
        evhttp_send_reply_chunk(q->client.http, b);
        evbuffer_free(b);
    }
}

static void out_stream_end(rtr_req_t *q)
{
    req_stop_watching(q);
    if (q->client.http == NULL)
        return;
    evhttp_send_reply_end(q->client.http);
    q->client.http = NULL;
}

static void out_reply(rtr_req_t *q, int status, const char *json, const rtr_oai_error_t *err)
{
    req_stop_watching(q);
    q->client.status = err != NULL ? err->http_status : status;
    if (err != NULL) {
        send_error(q->r, q->client.http, err, q->id);
    } else {
        if (status == 200)
            add_seed_header(q);
        reply_json(q->client.http, status, json, q->id, 0);
    }
    q->client.http = NULL;
}

/* A client that does not read: bytes queued for it in the evbuffer plus
 * those still in the kernel's send queue (SIOCOUTQ; checked every 8th call,
 * one ioctl) over client-max-unsent. */
static bool out_slow(rtr_req_t *q)
{
    if (q->client.http == NULL || q->client.evcon == NULL)
        return false;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(q->client.evcon);
    if (bev == NULL)
        return false;
    uint64_t unsent = evbuffer_get_length(bufferevent_get_output(bev));
    if ((++q->client.slow_checks & 7) == 0) {
        int outq = 0;
        evutil_socket_t fd = bufferevent_getfd(bev);
        if (fd >= 0 && ioctl(fd, SIOCOUTQ, &outq) == 0 && outq > 0)
            unsent += (uint64_t)outq;
    }
    return unsent > q->r->cfg.client_max_unsent;
}

static void out_drop(rtr_req_t *q)
{
    if (q->client.http != NULL) {
        /* Still attached to its connection: drop the connection (which
         * frees the request with it). */
        struct evhttp_connection *evcon = q->client.evcon;
        req_stop_watching(q);
        q->client.http = NULL;
        if (evcon != NULL)
            evhttp_connection_free(evcon);
    }
    q->client.evcon = NULL;
}

static void out_ended(rtr_req_t *q)
{
    req_stop_watching(q);
    if (q->r->draining && q->client.evcon != NULL)
        flush_track(q->client.evcon);
    q->client.http = NULL;
}

static void out_release(rtr_req_t *q)
{
    if (q->client.orphan != NULL)
        evhttp_request_free(q->client.orphan);
}

static void out_idle(rtr_t *r)
{
    if (r->flush_timer != NULL)
        return;
    r->flush_timer = event_new(r->base, -1, EV_PERSIST, flush_tick, r);
    struct timeval tv = { 0, 2000 };
    if (r->flush_timer == NULL || event_add(r->flush_timer, &tv) != 0)
        pd_loop_stop(r->loop);
}

const rtr_flow_out_t rtr_http_out = {
    .attached = out_attached,
    .stream_open = out_stream_open,
    .write = out_write,
    .stream_end = out_stream_end,
    .reply = out_reply,
    .slow = out_slow,
    .drop = out_drop,
    .ended = out_ended,
    .release = out_release,
    .idle = out_idle,
    .send = rtr_backend_send,
};

/* ---- client watchers -------------------------------------------------------- */

static void on_conn_close(struct evhttp_connection *evcon, void *arg)
{
    rtr_req_t *q = arg;
    rtr_client_t *c = &q->client;
    if (c->watch != NULL) {
        event_free(c->watch);
        c->watch = NULL;
    }
    if (c->http != NULL && evhttp_request_get_connection(c->http) == NULL)
        c->orphan = c->http;      /* detached by libevent: ours to free */
    c->http = NULL;               /* never touch it again */
    c->evcon = NULL;              /* being freed by libevent */
    rtr_flow_client_gone(q, "connection closed");
}

/* The probe was answered (or not): a client that closed its socket has
 * sent a RST back by now; one that only shut down its sending side still
 * waits for the answer, which it gets. */
static void on_client_probe(evutil_socket_t unused, short what, void *arg)
{
    (void)unused;
    (void)what;
    rtr_req_t *q = arg;
    struct tcp_info ti;
    socklen_t tl = sizeof(ti);
    int err = 0;
    socklen_t el = sizeof(err);
    rtr_client_t *c = &q->client;
    bool closed = getsockopt(c->probe_fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0 ||
                  ti.tcpi_state == TCP_CLOSE ||
                  getsockopt(c->probe_fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0;
    event_free(c->watch);
    c->watch = NULL;
    if (closed) {
        rtr_flow_client_gone(q, "connection closed");
        return;
    }
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "client half-closed its connection: still answering");
}

/* EOF from the client: a half-close (it still reads: `nc -N`, HTTP/1.0
 * clients, pipelining clients that are done sending) and a full close look
 * the same until bytes are sent to it (a closed socket answers them with a
 * RST). Only a client that sent "Expect: 100-continue" may be sent an
 * interim "100 Continue" for that (RFC 9110 10.1.1); look again shortly.
 * False: no probe. */
static bool client_probe(rtr_req_t *q, evutil_socket_t fd)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    rtr_client_t *c = &q->client;
    struct bufferevent *bev = c->evcon ? evhttp_connection_get_bufferevent(c->evcon) : NULL;
    const char *expect = c->http != NULL
        ? evhttp_find_header(evhttp_request_get_input_headers(c->http), "Expect") : NULL;
    if (c->http == NULL || bev == NULL || q->oai.stream || q->headers_sent ||
        expect == NULL || strcasecmp(expect, "100-continue") != 0 ||
        c->http->major != 1 || c->http->minor < 1 ||
        evbuffer_get_length(bufferevent_get_output(bev)) != 0 ||
        send(fd, cont, sizeof(cont) - 1, MSG_NOSIGNAL | MSG_DONTWAIT) !=
            (ssize_t)(sizeof(cont) - 1))
        return false;
    event_free(c->watch);
    c->watch = evtimer_new(q->r->base, on_client_probe, q);
    if (c->watch == NULL)
        return false;
    c->probe_fd = fd;
    struct timeval tv = { 0, 300000 };
    event_add(c->watch, &tv);
    return true;
}

/* The client sent EOF (a half-close) with requests it pipelined still in
 * evhttp's input buffer: evhttp reads the EOF as soon as it reads again
 * (after this answer) and drops the connection with them unanswered. A
 * read high-watermark of 1 byte keeps the bufferevent from reading while
 * any byte is buffered, so evhttp takes the buffered requests first; after
 * an EOF no other byte can come, and the last read (1 byte) finds the EOF
 * once the buffer is empty. */
static void hold_eof(struct evhttp_connection *evcon)
{
    struct bufferevent *bev = evcon != NULL ? evhttp_connection_get_bufferevent(evcon) : NULL;
    if (bev != NULL)
        bufferevent_setwatermark(bev, EV_READ, 0, 1);
}

static void on_client_readable(evutil_socket_t fd, short what, void *arg)
{
    rtr_req_t *q = arg;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) {
        /* A pipelined request: evhttp reads it after this one; stop
         * watching (the close callback still covers write errors). */
        event_free(q->client.watch);
        q->client.watch = NULL;
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n == 0 && client_probe(q, fd))
        return; /* maybe only half-closed: decided by on_client_probe */
    if (n == 0 && !q->oai.stream && !q->headers_sent) {
        /* Maybe only half-closed, and no bytes may be sent to find out:
         * answer; a closed socket fails the write (the close callback).
         * Streams end on EOF (evhttp ends a started stream on it). */
        event_free(q->client.watch);
        q->client.watch = NULL;
        hold_eof(q->client.evcon);
        pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "client sent EOF: answering (a half-close)");
        return;
    }
    rtr_flow_client_gone(q, n == 0 ? "EOF" : strerror(errno));
}

/* ---- request intake ------------------------------------------------------- */

/* Is the request's key one of api-key's (a comma-separated list; every
 * key is compared)? The key: "Authorization: Bearer K", or, without an
 * Authorization header, Anthropic's "x-api-key: K". key_id: BLAKE2b-256 of the key it carries, the
 * client's identity for its prefix-cache partition (all zero when no key
 * is configured: one identity for everyone). */
static bool check_api_key(rtr_t *r, struct evhttp_request *h, unsigned char key_id[32])
{
    memset(key_id, 0, 32);
    const char *keys = r->cfg.api_key;
    if (keys == NULL || keys[0] == '\0')
        return true;
    struct evkeyvalq *in = evhttp_request_get_input_headers(h);
    const char *auth = evhttp_find_header(in, "Authorization");
    if (auth == NULL) {
        auth = evhttp_find_header(in, "x-api-key");
        if (auth == NULL)
            return false;
    } else if (strncasecmp(auth, "Bearer ", 7) == 0) {
        auth += 7;
    } else {
        return false;
    }
    unsigned char a[32], b[32];
    crypto_generichash(a, sizeof(a), (const unsigned char *)auth, strlen(auth), NULL, 0);
    bool ok = false;
    for (const char *k = keys; *k != '\0';) {
        size_t kl = strcspn(k, ",");
        if (kl > 0) {
            crypto_generichash(b, sizeof(b), (const unsigned char *)k, kl, NULL, 0);
            ok |= sodium_memcmp(a, b, sizeof(a)) == 0;
        }
        k += kl + (k[kl] == ',');
    }
    if (ok)
        memcpy(key_id, a, 32);
    return ok;
}

/* The prefix-cache partition of a request (pd_blockname.h): 0, the shared
 * one, for a request without a key identity and without cache_salt; else
 * the first 8 bytes of BLAKE2b(key = the deployment secret's "pdserve cache
 * partition v1" subkey (none without a secret), key_id || LE32(salt
 * length) || salt), never 0. Every router of a deployment computes the
 * same one, and it cannot be guessed without the secret. */
static uint64_t cache_partition(const rtr_t *r, const unsigned char key_id[32], const char *salt)
{
    static const unsigned char zero[32];
    size_t sl = strlen(salt);
    if (sl == 0 && sodium_memcmp(key_id, zero, 32) == 0)
        return 0;
    uint8_t sub[32];
    if (r->auth)
        proto_auth_derive(&r->secret, "pdserve cache partition v1", sub);
    crypto_generichash_state st;
    crypto_generichash_init(&st, r->auth ? sub : NULL, r->auth ? sizeof(sub) : 0, 8);
    crypto_generichash_update(&st, key_id, 32);
    uint8_t len4[4] = { (uint8_t)sl, (uint8_t)(sl >> 8), (uint8_t)(sl >> 16), (uint8_t)(sl >> 24) };
    crypto_generichash_update(&st, len4, sizeof(len4));
    crypto_generichash_update(&st, (const unsigned char *)salt, sl);
    uint8_t out[8];
    crypto_generichash_final(&st, out, sizeof(out));
    sodium_memzero(sub, sizeof(sub));
    uint64_t p = 0;
    for (int k = 0; k < 8; k++)
        p |= (uint64_t)out[k] << (8 * k);
    return p != 0 ? p : 1;
}

/* Tools need a template with a call format; a forced call gets its
 * grammar (the call's JSON schema with the format's arguments key). */
static pd_status_t tools_prepare(rtr_t *r, rtr_oai_req_t *o, rtr_oai_error_t *err)
{
    bool used = o->n_tools > 0;
    for (uint32_t i = 0; i < o->n_messages && !used; i++)
        used = o->messages[i].n_calls > 0 || strcmp(o->messages[i].role, "tool") == 0;
    if (!used || !r->chat_ok)
        return PD_OK; /* no chat template: tokenize says so */
    eng_chat_tools_fmt_t f = eng_chat_tools_format(r->chat_kind);
    if (f == ENG_CHAT_TOOLS_NONE) {
        rtr_oai_error_set(err, 400, "invalid_request_error", "unsupported_parameter",
                          o->n_tools > 0 ? "tools" : "messages",
                          "this model's chat template (%s) has no tool-call format; tools work "
                          "with chatml, qwen2, qwen2.5, llama3 and llama3.1",
                          eng_chat_name(r->chat_kind));
        return PD_ERR_BAD_INPUT;
    }
    o->tool_fmt = f;
    if (o->tool_choice != RTR_OAI_TOOLS_REQUIRED && o->tool_choice != RTR_OAI_TOOLS_NAMED)
        return PD_OK;
    o->gram_schema = rtr_tools_call_schema(o->tools, o->n_tools,
                                           o->tool_choice == RTR_OAI_TOOLS_NAMED
                                               ? (int32_t)o->tool_named : -1,
                                           eng_chat_call_args_key(f), &o->gram_schema_len);
    if (o->gram_schema == NULL)
        return PD_ERR_NO_MEMORY;
    o->gram_kind = RTR_OAI_GRAM_JSON_SCHEMA;
    return PD_OK;
}

static pd_status_t tokenize(rtr_t *r, const rtr_oai_req_t *o, int32_t **ids_p, uint32_t *n_p,
                            rtr_oai_error_t *err)
{
    size_t cap, n = 0;
    int32_t *ids;
    pd_status_t s;
    if (o->api == RTR_API_COMPLETIONS && o->prompt_tokens != NULL) {
        ids = malloc(((size_t)o->n_prompt_tokens + 1) * sizeof(*ids));
        if (ids == NULL)
            return PD_ERR_NO_MEMORY;
        memcpy(ids, o->prompt_tokens, o->n_prompt_tokens * sizeof(*ids));
        *ids_p = ids;
        *n_p = o->n_prompt_tokens;
        return PD_OK;
    }
    if (o->api == RTR_API_COMPLETIONS) {
        cap = 3 * o->prompt_len + 8;
        ids = malloc(cap * sizeof(*ids));
        if (ids == NULL)
            return PD_ERR_NO_MEMORY;
        s = eng_tok_encode(r->tok, o->prompt, o->prompt_len, eng_tok_add_bos(r->tok), false, ids,
                           cap, &n);
    } else {
        if (!r->chat_ok) {
            rtr_oai_error_set(err, 400, "invalid_request_error", "chat_template_missing", NULL,
                              "this model has no chat template the router recognizes; "
                              "use /v1/completions or start pd-router with --chat-template");
            return PD_ERR_BAD_INPUT;
        }
        eng_chat_msg_t *msgs = calloc(o->n_messages ? o->n_messages : 1, sizeof(*msgs));
        if (msgs == NULL)
            return PD_ERR_NO_MEMORY;
        size_t total = 0, n_calls = 0;
        for (uint32_t i = 0; i < o->n_messages; i++)
            n_calls += o->messages[i].n_calls;
        eng_chat_call_t *calls = calloc(n_calls ? n_calls : 1, sizeof(*calls));
        eng_chat_tool_t *tools = calloc(o->n_tools ? o->n_tools : 1, sizeof(*tools));
        if (calls == NULL || tools == NULL) {
            free(calls);
            free(tools);
            free(msgs);
            return PD_ERR_NO_MEMORY;
        }
        n_calls = 0;
        for (uint32_t i = 0; i < o->n_messages; i++) {
            const rtr_chat_msg_t *m = &o->messages[i];
            /* developer is OpenAI's new name for system. */
            msgs[i].role = strcmp(m->role, "developer") == 0 ? "system" : m->role;
            msgs[i].content = m->content;
            msgs[i].content_len = m->content_len;
            msgs[i].calls = calls + n_calls;
            msgs[i].n_calls = m->n_calls;
            for (uint32_t k = 0; k < m->n_calls; k++, n_calls++) {
                calls[n_calls].name = m->calls[k].name;
                calls[n_calls].arguments = m->calls[k].arguments;
                total += strlen(m->calls[k].arguments) + 80;
            }
            total += m->content_len;
        }
        for (uint32_t i = 0; i < o->n_tools; i++) {
            tools[i].json = o->tools[i].def;
            tools[i].len = o->tools[i].def_len;
            total += o->tools[i].def_len;
        }
        bool forced = o->tool_choice == RTR_OAI_TOOLS_REQUIRED ||
                      o->tool_choice == RTR_OAI_TOOLS_NAMED;
        eng_chat_opts_t opts = { tools, o->n_tools,
                                 forced ? eng_chat_call_opener(o->tool_fmt) : NULL };
        cap = 3 * total + 256 * (size_t)o->n_messages + 1024;
        ids = malloc(cap * sizeof(*ids));
        if (ids == NULL) {
            free(calls);
            free(tools);
            free(msgs);
            return PD_ERR_NO_MEMORY;
        }
        s = eng_chat_encode_opts(r->tok, r->chat_kind, msgs, o->n_messages, true, &opts, ids,
                                 cap, &n);
        free(calls);
        free(tools);
        free(msgs);
        if (s == PD_ERR_UNSUPPORTED) {
            free(ids);
            rtr_oai_error_set(err, 400, "invalid_request_error", "unsupported_parameter",
                              "messages", "messages cannot be rendered: the %s template takes "
                              "one tool call per assistant turn", eng_chat_name(r->chat_kind));
            return PD_ERR_BAD_INPUT;
        }
        if (s == PD_ERR_BAD_INPUT || s == PD_ERR_TOO_BIG) {
            free(ids);
            rtr_oai_error_set(err, s == PD_ERR_TOO_BIG ? 413 : 400, "invalid_request_error", NULL,
                              "messages", "messages cannot be rendered: %s", pd_status_str(s));
            return PD_ERR_BAD_INPUT;
        }
    }
    if (s != PD_OK) {
        free(ids);
        if (s == PD_ERR_TOO_BIG) {
            rtr_oai_error_set(err, 413, "invalid_request_error", NULL, "prompt",
                              "prompt too large to tokenize");
            return PD_ERR_BAD_INPUT;
        }
        return s;
    }
    *ids_p = ids;
    *n_p = (uint32_t)n;
    return PD_OK;
}

static void generate_tokenized(rtr_t *r, struct evhttp_request *h, rtr_api_t api,
                               const char *reqid, rtr_oai_req_t *o, pd_status_t s,
                               int32_t *ids, uint32_t n_ids, rtr_oai_error_t *err);
static void tok_offload(rtr_t *r, struct evhttp_request *h, rtr_api_t api, const char *reqid,
                        rtr_oai_req_t *o);

/* Bytes of text the tokenizer will see (chat: every message, call, tool). */
static uint64_t prompt_bytes(const rtr_oai_req_t *o)
{
    uint64_t n = o->prompt_len;
    for (uint32_t i = 0; i < o->n_messages; i++) {
        n += o->messages[i].content_len;
        for (uint32_t k = 0; k < o->messages[i].n_calls; k++)
            n += strlen(o->messages[i].calls[k].arguments);
    }
    for (uint32_t i = 0; i < o->n_tools; i++)
        n += o->tools[i].def_len;
    return n;
}

static void handle_generate(rtr_t *r, struct evhttp_request *h, rtr_api_t api, bool count_only,
                            const char *reqid, const unsigned char key_id[32])
{
    rtr_oai_error_t err;
    memset(&err, 0, sizeof(err));
    struct evbuffer *in = evhttp_request_get_input_buffer(h);
    size_t len = evbuffer_get_length(in);
    if (len > r->cfg.max_body) {
        pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
        reply_status(r, h, reqid, 413, "invalid_request_error", "request_too_large", NULL,
                     "request body is %zu bytes; the limit is %" PRIu64, len, r->cfg.max_body);
        return;
    }
    const char *body = (const char *)evbuffer_pullup(in, -1);
    rtr_oai_limits_t lim = {
        .max_tokens_cap = (uint32_t)r->cfg.max_tokens_cap,
        .default_max_tokens = (uint32_t)r->cfg.default_max_tokens,
        .n_cap = (uint32_t)r->cfg.n_cap,
        .max_prompt_bytes = r->cfg.max_body,
        .max_prompt_tokens = r->context_length ? r->context_length : PROTO_MAX_PROMPT_TOKENS,
        .max_messages = ENG_CHAT_MAX_MESSAGES,
        .vocab_size = r->geom_fixed ? r->geom.vocab_size : eng_tok_vocab_size(r->tok),
    };
    char nul_at[256];
    if (body != NULL && rtr_json_nul_find(body, len, nul_at, sizeof(nul_at))) {
        /* it would be cut short at the NUL once parsed */
        pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
        rtr_oai_error_set(&err, 400, "invalid_request_error", "invalid_string", NULL,
                          "a JSON string at \"%s\" contains a NUL (\\u0000): strings with "
                          "NUL are refused", nul_at);
        size_t pl = strnlen(nul_at, sizeof(err.param_buf) - 1);
        memcpy(err.param_buf, nul_at, pl);
        err.param_buf[pl] = '\0';
        err.param = err.param_buf;
        reply_error(r, h, &err, reqid);
        return;
    }
    rtr_oai_req_t o;
    memset(&o, 0, sizeof(o));
    const rtr_fd_api_t *fd = rtr_fd_api(api);
    pd_status_t s = fd != NULL ? fd->parse(body != NULL ? body : "", len, &lim, count_only, &o, &err)
                               : rtr_oai_parse(api, body != NULL ? body : "", len, &lim, &o, &err);
    if (s != PD_OK) {
        pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
        if (s == PD_ERR_NO_MEMORY)
            rtr_oai_error_set(&err, 500, "server_error", NULL, NULL, "out of memory");
        reply_error(r, h, &err, reqid);
        return;
    }
    o.cache_partition = cache_partition(r, key_id, o.cache_salt);
    if (o.model[0] != '\0' && strcmp(o.model, r->model_name) != 0) {
        pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
        reply_status(r, h, reqid, 404, "invalid_request_error", "model_not_found", "model",
                     "The model '%s' does not exist; this server serves '%s'", o.model,
                     r->model_name);
        rtr_oai_req_free(&o);
        return;
    }
    s = tools_prepare(r, &o, &err);
    if (s != PD_OK) {
        generate_tokenized(r, h, api, reqid, &o, s, NULL, 0, &err);
        return;
    }
    if (r->tok_pool != NULL && prompt_bytes(&o) > r->cfg.tok_inline_bytes) {
        tok_offload(r, h, api, reqid, &o);
        return;
    }
    int32_t *ids = NULL;
    uint32_t n_ids = 0;
    uint64_t t0 = pd_now_ns();
    s = tokenize(r, &o, &ids, &n_ids, &err);
    pd_stats_observe_ns(r->stats, RTR_STAT_tokenize_time, pd_now_ns() - t0);
    generate_tokenized(r, h, api, reqid, &o, s, ids, n_ids, &err);
}

/* The rest of a generate request once its prompt is tokenized (s: how the
 * tokenizer did; ids owned here). Owns o. */
static void generate_tokenized(rtr_t *r, struct evhttp_request *h, rtr_api_t api,
                               const char *reqid, rtr_oai_req_t *o, pd_status_t s,
                               int32_t *ids, uint32_t n_ids, rtr_oai_error_t *err)
{
    if (s != PD_OK) {
        pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
        if (s != PD_ERR_BAD_INPUT)
            rtr_oai_error_set(err, 500, "server_error", NULL, NULL, "tokenizer: %s",
                              pd_status_str(s));
        reply_error(r, h, err, reqid);
        rtr_oai_req_free(o);
        return;
    }
    if (o->count_only) { /* POST /v1/messages/count_tokens: the count is the answer */
        char json[48], peer[64];
        snprintf(json, sizeof(json), "{\"input_tokens\":%u}", n_ids);
        peer_of(h, peer, sizeof(peer));
        pd_log(PD_LOG_INFO, RTR_COMP, reqid,
               "access client=%s endpoint=/v1/messages/count_tokens status=200 outcome=counted "
               "prompt_tokens=%u", peer, n_ids);
        reply_json(h, 200, json, reqid, 0);
        goto out;
    }
    const rtr_fd_api_t *door = rtr_fd_api(api);
    if (n_ids == 0) {
        pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
        reply_status(r, h, reqid, 400, "invalid_request_error", NULL, "prompt",
                     "the prompt is empty after tokenization");
        goto out;
    }
    if (n_ids > PROTO_MAX_PROMPT_TOKENS ||
        (r->context_length != 0 && (uint64_t)n_ids + o->max_tokens > r->context_length)) {
        pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
        reply_status(r, h, reqid, 400, "invalid_request_error", "context_length_exceeded",
                     door != NULL ? door->prompt_param : api == RTR_API_CHAT ? "messages" : "prompt",
                     "This model's maximum context length is %u tokens. However, you requested "
                     "%" PRIu64 " tokens (%u in the prompt, %u in the completion). Please reduce "
                     "the prompt or %s.", r->context_length,
                     (uint64_t)n_ids + o->max_tokens, n_ids, o->max_tokens,
                     api == RTR_API_RESPONSES ? "max_output_tokens" : "max_tokens");
        goto out;
    }
    if (o->n_stop > ENG_STOP_MAX) {
        pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
        reply_status(r, h, reqid, 400, "invalid_request_error", NULL, "stop",
                     "at most %d stop strings", ENG_STOP_MAX);
        goto out;
    }
    if (!admit(r, h, reqid))
        goto out;
    /* Route: a decode always, a prefill when disaggregating. */
    rtr_backend_t *dec, *pre;
    bool disagg = rtr_flow_route(r, ids, n_ids, o->max_tokens, o->cache_partition, &dec, &pre);
    if (dec == NULL || (disagg && pre == NULL)) {
        pd_stats_inc(r->stats, RTR_STAT_requests_overloaded);
        reply_status(r, h, reqid, 503, "server_error", "no_backend", NULL,
                     "no %s daemon is available; retry later", dec == NULL ? "decode" : "prefill");
        goto out;
    }

    /* Accepted. */
    rtr_req_t *q;
    s = rtr_flow_new(r, reqid, api, o, &ids, n_ids, &q);
    if (s == PD_ERR_NO_MEMORY) {
        reply_status(r, h, reqid, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    if (s != PD_OK) {
        reply_status(r, h, reqid, 400, "invalid_request_error", NULL, "stop", "bad stop strings");
        goto out;
    }
    rtr_client_t *c = &q->client;
    c->http = h;
    c->evcon = evhttp_request_get_connection(h);
    c->endpoint = door != NULL ? door->endpoint
                  : api == RTR_API_CHAT ? "/v1/chat/completions" : "/v1/completions";
    peer_of(h, c->peer, sizeof(c->peer));
    if (c->evcon != NULL) {
        evhttp_connection_set_closecb(c->evcon, on_conn_close, q);
        struct bufferevent *bev = evhttp_connection_get_bufferevent(c->evcon);
        evutil_socket_t fd = bev != NULL ? bufferevent_getfd(bev) : -1;
        if (fd >= 0) {
            c->watch = event_new(r->base, fd, EV_READ | EV_PERSIST, on_client_readable, q);
            if (c->watch != NULL)
                event_add(c->watch, NULL);
        }
    }
    rtr_flow_start(q, dec, disagg ? pre : NULL);
    return;
out:
    free(ids);
    rtr_oai_req_free(o);
}

/* ---- tokenizing off the loop (rtr_tok.h) -------------------------------------
 * A prompt larger than tokenize-inline-bytes is tokenized on a worker: the
 * request waits with its evhttp request and parsed body in a tok_job_t,
 * the worker reads only the loaded tokenizer and chat template (immutable)
 * and the job's own fields, and the loop finishes the request in
 * tok_job_done exactly as the inline path would. A client whose connection
 * is freed meanwhile (evhttp: closecb) is noted; its request is dropped. */
typedef struct {
    rtr_tok_job_t job;             /* first: the pool hands back this pointer */
    rtr_t *r;
    struct evhttp_request *h;      /* NULL once the connection is gone */
    struct evhttp_request *orphan; /* detached by libevent: ours to free */
    struct evhttp_connection *evcon;
    rtr_api_t api;
    char reqid[PROTO_REQID_MAX + 1];
    rtr_oai_req_t o;
    rtr_oai_error_t err;
    pd_status_t status;
    int32_t *ids;
    uint32_t n_ids;
    uint64_t t_submit_ns, t_run_ns;
} tok_job_t;

static void tok_job_run(rtr_tok_job_t *job)
{
    tok_job_t *j = (tok_job_t *)job;
    uint64_t t0 = pd_now_ns();
    j->status = tokenize(j->r, &j->o, &j->ids, &j->n_ids, &j->err);
    j->t_run_ns = pd_now_ns() - t0;
}

static void tok_conn_close(struct evhttp_connection *evcon, void *arg)
{
    tok_job_t *j = arg;
    (void)evcon;
    if (j->h != NULL && evhttp_request_get_connection(j->h) == NULL)
        j->orphan = j->h;
    j->h = NULL;
    j->evcon = NULL;
}

static void tok_job_done(rtr_tok_job_t *job, bool canceled)
{
    tok_job_t *j = (tok_job_t *)job;
    rtr_t *r = j->r;
    if (j->evcon != NULL)
        evhttp_connection_set_closecb(j->evcon, NULL, NULL);
    if (!canceled)
        pd_stats_observe_ns(r->stats, RTR_STAT_tokenize_time, j->t_run_ns);
    pd_log(PD_LOG_DEBUG, RTR_COMP, j->reqid, "tokenized on a worker: %u tokens, %.1f ms "
           "(%.1f ms after submit)%s", j->n_ids, (double)j->t_run_ns / 1e6,
           (double)(pd_now_ns() - j->t_submit_ns) / 1e6, canceled ? ", canceled" : "");
    if (j->h == NULL) {
        pd_stats_inc(r->stats, RTR_STAT_client_disconnects);
        if (j->orphan != NULL)
            evhttp_request_free(j->orphan);
        free(j->ids);
        rtr_oai_req_free(&j->o);
    } else if (canceled || r->tok_closing) {
        pd_stats_inc(r->stats, RTR_STAT_requests_overloaded);
        reply_status(r, j->h, j->reqid, 503, "server_error", "shutting_down", NULL,
                     "the router is stopping");
        free(j->ids);
        rtr_oai_req_free(&j->o);
    } else {
        generate_tokenized(r, j->h, j->api, j->reqid, &j->o, j->status, j->ids, j->n_ids,
                           &j->err);
    }
    free(j);
}

static void tok_offload(rtr_t *r, struct evhttp_request *h, rtr_api_t api, const char *reqid,
                        rtr_oai_req_t *o)
{
    tok_job_t *j = calloc(1, sizeof(*j));
    pd_status_t s = j != NULL ? PD_OK : PD_ERR_NO_MEMORY;
    if (j != NULL) {
        j->job.run = tok_job_run;
        j->job.done = tok_job_done;
        j->r = r;
        j->h = h;
        j->api = api;
        snprintf(j->reqid, sizeof(j->reqid), "%s", reqid);
        j->o = *o; /* the body is moved into the job */
        j->t_submit_ns = pd_now_ns();
        s = rtr_tok_pool_submit(r->tok_pool, &j->job);
    }
    if (s != PD_OK) {
        if (j != NULL)
            *o = j->o;
        free(j);
        pd_stats_inc(r->stats, RTR_STAT_requests_overloaded);
        if (s == PD_ERR_NO_SPACE)
            reply_status(r, h, reqid, 503, "server_error", "tokenizer_busy", NULL,
                         "%" PRIu64 " large prompts are waiting to be tokenized; retry later",
                         r->cfg.tok_queue);
        else
            reply_status(r, h, reqid, 503, "server_error", NULL, NULL, "tokenizer: %s",
                         pd_status_str(s));
        rtr_oai_req_free(o);
        return;
    }
    pd_stats_inc(r->stats, RTR_STAT_tokenize_offloaded);
    j->evcon = evhttp_request_get_connection(h);
    if (j->evcon != NULL)
        evhttp_connection_set_closecb(j->evcon, tok_conn_close, j);
}

/* ---- /v1/embeddings ----------------------------------------------------------
 * The intake (body, tokenizing, admission) and the client side of the job;
 * the job itself (its inputs' way to the prefills and back) is
 * rtr_embed_job.c. */

static void emb_peer(void *client, char *buf, size_t cap)
{
    peer_of(client, buf, cap);
}

static void emb_json(void *client, const char *json, const char *reqid)
{
    reply_json(client, 200, json, reqid, 0);
}

static void emb_error(rtr_t *r, void *client, const rtr_oai_error_t *err, const char *reqid)
{
    send_error(r, client, err, reqid);
}

static void emb_unwatch(void *conn)
{
    evhttp_connection_set_closecb(conn, NULL, NULL);
}

static const rtr_emb_client_t emb_client = {
    .peer = emb_peer, .json = emb_json, .error = emb_error, .unwatch = emb_unwatch,
};

static void emb_orphan_free(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    evhttp_request_free(arg);
}

static void emb_conn_close(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    rtr_t *r;
    struct evhttp_request *h = rtr_emb_job_client_gone(arg, &r);
    /* a request libevent detached is ours to free (as tok_conn_close's),
     * after this callback */
    if (h != NULL && evhttp_request_get_connection(h) == NULL) {
        struct timeval zero = { 0, 0 };
        (void)event_base_once(r->base, -1, EV_TIMEOUT, emb_orphan_free, h, &zero);
    }
}

static void handle_embeddings(rtr_t *r, struct evhttp_request *h, const char *reqid)
{
    rtr_oai_error_t err;
    memset(&err, 0, sizeof(err));
    struct evbuffer *inb = evhttp_request_get_input_buffer(h);
    size_t len = evbuffer_get_length(inb);
    if (len > r->cfg.max_body) {
        pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
        reply_status(r, h, reqid, 413, "invalid_request_error", "request_too_large", NULL,
                     "request body is %zu bytes; the limit is %" PRIu64, len, r->cfg.max_body);
        return;
    }
    const char *body = (const char *)evbuffer_pullup(inb, -1);
    uint32_t ctx = r->context_length ? r->context_length : PROTO_MAX_PROMPT_TOKENS;
    rtr_emb_limits_t lim = {
        .max_inputs = RTR_EMB_MAX_INPUTS, .max_input_tokens = ctx,
        .max_input_bytes = ENG_TOK_MAX_INPUT,
        .vocab_size = r->geom_fixed ? r->geom.vocab_size : eng_tok_vocab_size(r->tok),
    };
    rtr_emb_req_t req;
    memset(&req, 0, sizeof(req));
    pd_status_t s = rtr_emb_parse(body != NULL ? body : "", len, &lim, &req, &err);
    if (s == PD_OK && req.model[0] != '\0' && strcmp(req.model, r->model_name) != 0) {
        rtr_oai_error_set(&err, 404, "invalid_request_error", "model_not_found", "model",
                          "The model '%s' does not exist; this server serves '%s'", req.model,
                          r->model_name);
        s = PD_ERR_BAD_INPUT;
    }
    for (uint32_t i = 0; s == PD_OK && i < req.n_inputs; i++) {
        rtr_emb_input_t *in = &req.inputs[i];
        if (in->text != NULL) {
            size_t cap = 3 * in->text_len + 8, n = 0;
            in->ids = malloc(cap * sizeof(int32_t));
            s = in->ids == NULL ? PD_ERR_NO_MEMORY
                                : eng_tok_encode(r->tok, in->text, in->text_len,
                                                 eng_tok_add_bos(r->tok), false, in->ids, cap, &n);
            /* as llama.cpp (llama-server, node-llama-cpp): EOS after the text
             * when the GGUF says add_eos_token (embedding models ending in
             * their EOS, pooled last) */
            if (s == PD_OK && eng_tok_add_eos(r->tok) && n < cap &&
                (n == 0 || in->ids[n - 1] != eng_tok_eos(r->tok)))
                in->ids[n++] = eng_tok_eos(r->tok);
            if (s != PD_OK && s != PD_ERR_NO_MEMORY) {
                rtr_oai_error_set(&err, 400, "invalid_request_error", NULL, "input",
                                  "input %u could not be tokenized: %s", i, pd_status_str(s));
                s = PD_ERR_BAD_INPUT;
            }
            in->n_ids = (uint32_t)n;
        }
        if (s == PD_OK)
            s = rtr_emb_check_len(&req, i, in->n_ids, ctx, &err);
    }
    /* admitted as a chat request is (draining 503, max-concurrent 429) */
    if (s == PD_OK && !admit(r, h, reqid)) {
        rtr_emb_req_free(&req);
        return;
    }
    if (s == PD_OK && !rtr_have_backend(r, PROTO_CAP_PREFILL)) {
        pd_stats_inc(r->stats, RTR_STAT_requests_overloaded);
        rtr_oai_error_set(&err, 503, "server_error", "no_prefill_daemon", NULL,
                          "embeddings are computed by prefill daemons and this deployment has "
                          "none ready");
        s = PD_ERR_OVERLOADED;
    }
    rtr_emb_job_t *j = NULL;
    if (s == PD_OK)
        s = rtr_emb_job_start(r, &emb_client, h, reqid, &req, &j);
    if (s != PD_OK) {
        if (s == PD_ERR_NO_MEMORY)
            rtr_oai_error_set(&err, 500, "server_error", NULL, NULL, "out of memory");
        else if (err.http_status < 500)
            pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
        reply_error(r, h, &err, reqid);
        rtr_emb_req_free(&req);
        return;
    }
    if (j == NULL)
        return; /* it ended already (the error was sent) */
    struct evhttp_connection *evcon = evhttp_request_get_connection(h);
    if (evcon != NULL) {
        rtr_emb_job_set_conn(j, evcon);
        evhttp_connection_set_closecb(evcon, emb_conn_close, j);
    }
}

static void handle_metrics(rtr_t *r, struct evhttp_request *h)
{
    char *text = NULL;
    size_t len = 0;
    pd_status_t s;
    if (r->admin != NULL) {
        s = pd_admin_stats_prometheus(r->admin, &text, &len);
    } else {
        pd_stats_t *sets[RTR_MAX_BACKENDS + 1];
        size_t n = 0;
        sets[n++] = r->stats;
        for (size_t i = 0; i < RTR_MAX_BACKENDS; i++)
            if (r->be[i].used && r->be[i].stats != NULL)
                sets[n++] = r->be[i].stats;
        s = pd_stats_render_scrape(sets, n, &text, &len);
    }
    if (s != PD_OK) {
        evhttp_send_error(h, 500, NULL);
        return;
    }
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, text, len);
    evhttp_add_header(evhttp_request_get_output_headers(h), "Content-Type",
                      "text/plain; version=0.0.4; charset=utf-8");
    evhttp_send_reply(h, 200, "OK", b);
    evbuffer_free(b);
    free(text);
}

static bool prefill_capable(rtr_t *r)
{
    if (rtr_have_backend(r, PROTO_CAP_PREFILL))
        return true;
    return rtr_have_backend(r, PROTO_CAP_PREFILL_LOCAL);
}

/* Streams are many small writes: without TCP_NODELAY, Nagle holds the chunk
 * after the first token until the client's delayed ACK (a stall per token on
 * a kept-alive connection: docs/BENCHMARKS.md, router). evhttp has no
 * per-connection accept hook, so set it per request (idempotent, cheap). */
static void http_set_nodelay(struct evhttp_request *h)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(h);
    struct bufferevent *bev = evcon != NULL ? evhttp_connection_get_bufferevent(evcon) : NULL;
    evutil_socket_t fd = bev != NULL ? bufferevent_getfd(bev) : -1;
    int one = 1;
    if (fd >= 0)
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static evutil_socket_t http_fd(struct evhttp_request *h)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(h);
    struct bufferevent *bev = evcon != NULL ? evhttp_connection_get_bufferevent(evcon) : NULL;
    return bev != NULL ? bufferevent_getfd(bev) : -1;
}

/* The response is out: the connection's next request has a read deadline
 * again (rtr_conns). */
static void on_http_complete(struct evhttp_request *h, void *arg)
{
    rtr_t *r = arg;
    if (r->conns != NULL)
        rtr_conns_response_done(r->conns, http_fd(h));
}

/* Framing a proxy in front could read differently from libevent: more
 * than one Content-Length or Transfer-Encoding, a Transfer-Encoding other
 * than plain "chunked", or both. NULL if the request is unambiguous. */
static const char *http_ambiguous(struct evhttp_request *h)
{
    const struct evkeyvalq *hd = evhttp_request_get_input_headers(h);
    const struct evkeyval *kv;
    int n_cl = 0, n_te = 0;
    const char *te = NULL;
    for (kv = hd->tqh_first; kv != NULL; kv = kv->next.tqe_next) {
        if (strcasecmp(kv->key, "Content-Length") == 0)
            n_cl++;
        if (strcasecmp(kv->key, "Transfer-Encoding") == 0) {
            n_te++;
            te = kv->value;
        }
    }
    if (n_cl > 1)
        return "more than one Content-Length header";
    if (n_te > 1)
        return "more than one Transfer-Encoding header";
    if (te != NULL && strcasecmp(te, "chunked") != 0)
        return "Transfer-Encoding other than \"chunked\"";
    if (te != NULL && n_cl > 0)
        return "both Content-Length and Transfer-Encoding";
    if (te != NULL && h->major == 1 && h->minor == 0)
        return "Transfer-Encoding in an HTTP/1.0 request";
    return NULL;
}

static void on_http(struct evhttp_request *h, void *arg)
{
    rtr_t *r = arg;
    char reqid[PROTO_REQID_MAX + 1];
    http_set_nodelay(h);
    if (r->conns != NULL) {
        rtr_conns_request_in(r->conns, http_fd(h));
        evhttp_request_set_on_complete_cb(h, on_http_complete, r);
    }
    /* requests pipelined behind this one, then EOF: answer them all */
    struct evhttp_connection *evcon = evhttp_request_get_connection(h);
    struct bufferevent *bev = evcon != NULL ? evhttp_connection_get_bufferevent(evcon) : NULL;
    char peek;
    if (bev != NULL && evbuffer_get_length(bufferevent_get_input(bev)) > 0 &&
        recv(http_fd(h), &peek, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
        hold_eof(evcon);
    const char *amb = http_ambiguous(h);
    if (amb != NULL) {
        /* and close: the next request's start is uncertain */
        evhttp_add_header(evhttp_request_get_output_headers(h), "Connection", "close");
        pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
        reply_status(r, h, NULL, 400, "invalid_request_error", "ambiguous_request", NULL,
                     "ambiguous HTTP framing: %s", amb);
        return;
    }
    const char *hid = evhttp_find_header(evhttp_request_get_input_headers(h), "X-Request-Id");
    if (hid != NULL && !rtr_reqid_valid(hid, strlen(hid))) {
        pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
        reply_status(r, h, NULL, 400, "invalid_request_error", "invalid_request_id", NULL,
                     "X-Request-Id must be 1-64 printable ASCII characters without spaces");
        return;
    }
    if (hid != NULL) {
        /* kept even if another request uses it: daemons never see it */
        snprintf(reqid, sizeof(reqid), "%s", hid);
    } else {
        /* absent: generate one; the client sees it in the response */
        snprintf(reqid, sizeof(reqid), "%08" PRIx64 "%08" PRIx64, r->incarnation & 0xffffffffu,
                 ++r->next_seq);
    }
    const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(h));
    if (path == NULL)
        path = "/";
    enum evhttp_cmd_type cmd = evhttp_request_get_command(h);
    bool get = cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD;
    bool post = cmd == EVHTTP_REQ_POST;

    if (strcmp(path, "/health") == 0 && get) {
        reply_json(h, 200, "{\"status\":\"ok\"}", reqid, 0);
        return;
    }
    if (strcmp(path, "/ready") == 0 && get) {
        bool dec = rtr_have_backend(r, PROTO_CAP_DECODE), pre = prefill_capable(r);
        if (dec && pre && !r->draining) {
            reply_json(h, 200, "{\"status\":\"ready\"}", reqid, 0);
        } else {
            const char *why[3];
            int n = 0;
            if (r->draining)
                why[n++] = "draining";
            if (!dec)
                why[n++] = "no decode daemon";
            if (!pre)
                why[n++] = "no prefill-capable daemon";
            reply_status(r, h, reqid, 503, "server_error", "not_ready", NULL,
                         "not ready: %s%s%s%s%s", why[0], n > 1 ? "; " : "", n > 1 ? why[1] : "",
                         n > 2 ? "; " : "", n > 2 ? why[2] : "");
        }
        return;
    }
    if (strcmp(path, "/metrics") == 0 && get) {
        handle_metrics(r, h);
        return;
    }
    bool is_v1 = strncmp(path, "/v1/", 4) == 0;
    unsigned char key_id[32] = { 0 };
    if (is_v1 && !check_api_key(r, h, key_id)) {
        pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
        reply_status(r, h, reqid, 401, "invalid_request_error", "invalid_api_key", NULL,
                     "Incorrect or missing API key (Authorization: Bearer ... or x-api-key)");
        return;
    }
    if (strncmp(path, "/v1/models/", 11) == 0 && get) {
        const char *ids[1] = { r->model_name };
        rtr_oai_error_t err;
        char *json = rtr_oai_model_get_json(path + 11, ids, 1, r->created, "pdserve", &err);
        if (json != NULL)
            reply_json(h, 200, json, reqid, 0);
        else
            reply_error(r, h, &err, reqid);
        free(json);
        return;
    }
    if (strcmp(path, "/v1/models") == 0 && get) {
        const char *ids[1] = { r->model_name };
        char *json = rtr_oai_models_json(ids, 1, r->created, "pdserve");
        reply_json(h, 200, json != NULL ? json : "{}", reqid, 0);
        free(json);
        return;
    }
    static const struct {
        const char *path;
        rtr_api_t api;
        bool count_only;
    } routes[] = {
        { "/v1/completions", RTR_API_COMPLETIONS, false },
        { "/v1/chat/completions", RTR_API_CHAT, false },
        { "/v1/messages", RTR_API_MESSAGES, false },
        { "/v1/messages/count_tokens", RTR_API_MESSAGES, true },
        { "/v1/responses", RTR_API_RESPONSES, false },
    };
    bool known = strcmp(path, "/v1/embeddings") == 0;
    if (known && post) {
        handle_embeddings(r, h, reqid);
        return;
    }
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]) && !known; i++) {
        if (strcmp(path, routes[i].path) != 0)
            continue;
        known = true;
        if (post) {
            handle_generate(r, h, routes[i].api, routes[i].count_only, reqid, key_id);
            return;
        }
    }
    pd_stats_inc(r->stats, RTR_STAT_requests_rejected);
    if (known || strncmp(path, "/v1/models", 10) == 0 || strcmp(path, "/health") == 0 ||
        strcmp(path, "/ready") == 0 || strcmp(path, "/metrics") == 0)
        reply_status(r, h, reqid, 405, "invalid_request_error", "method_not_allowed", NULL,
                     "method not allowed on %s", path);
    else
        reply_status(r, h, reqid, 404, "invalid_request_error", "not_found", NULL,
                     "unknown route %s", path);
}

pd_status_t rtr_http_start(rtr_t *r)
{
    char host[256];
    const char *spec = r->cfg.http;
    const char *colon = strrchr(spec, ':');
    unsigned long port;
    if (colon == NULL) {
        snprintf(host, sizeof(host), "127.0.0.1");
        port = strtoul(spec, NULL, 10);
    } else {
        size_t hl = (size_t)(colon - spec);
        if (hl >= sizeof(host))
            return PD_ERR_BAD_INPUT;
        memcpy(host, spec, hl);
        host[hl] = '\0';
        if (hl == 0)
            snprintf(host, sizeof(host), "127.0.0.1");
        if (host[0] == '[' && hl > 2) {   /* [v6] */
            memmove(host, host + 1, hl - 2);
            host[hl - 2] = '\0';
        }
        port = strtoul(colon + 1, NULL, 10);
    }
    if (port > 65535)
        return PD_ERR_BAD_INPUT;
    r->http = evhttp_new(r->base);
    if (r->http == NULL)
        return PD_ERR_NO_MEMORY;
    /* Bodies over max-body get the OpenAI 413 from handle_generate; only
     * bodies over max-body-hard meet libevent's own (HTML) 413, which
     * libevent 2.1 offers no hook to replace. */
    evhttp_set_max_body_size(r->http, (ev_ssize_t)r->cfg.max_body_hard);
    evhttp_set_max_headers_size(r->http, 64 * 1024);
    evhttp_set_timeout(r->http, 120);
    evhttp_set_allowed_methods(r->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                            EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                            EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
    evhttp_set_gencb(r->http, on_http, r);
    if (r->cfg.tok_threads > 0) {
        pd_status_t ts = rtr_tok_pool_create(r->loop, (uint32_t)r->cfg.tok_threads,
                                             (uint32_t)r->cfg.tok_queue, &r->tok_pool);
        if (ts != PD_OK)
            return ts;
    }
    rtr_conns_opts_t co = {
        .max_total = (uint32_t)r->cfg.http_max_conns,
        .max_per_client = (uint32_t)r->cfg.http_max_conns_per_client,
        .read_timeout_ns = r->cfg.http_read_timeout_ns,
        .reserved_fds = 2 * RTR_MAX_BACKENDS + RTR_CTL_PENDING_MAX + 64,
        .retry_after = (uint32_t)r->cfg.retry_after,
        .stats = r->stats,
    };
    pd_status_t cst = rtr_conns_create(r->base, &co, &r->conns);
    if (cst != PD_OK)
        return cst;
    evhttp_set_bevcb(r->http, rtr_conns_bevcb, r->conns);
    r->http_sock = evhttp_bind_socket_with_handle(r->http, host, (uint16_t)port);
    if (r->http_sock == NULL)
        return PD_ERR_IO;
    rtr_conns_set_listener(r->conns, evhttp_bound_socket_get_listener(r->http_sock));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    evutil_socket_t fd = evhttp_bound_socket_get_fd(r->http_sock);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET)
            r->http_port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6)
            r->http_port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    bool wildcard = strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0;
    if (wildcard && (r->cfg.api_key == NULL || r->cfg.api_key[0] == '\0'))
        pd_log(PD_LOG_WARN, RTR_COMP, NULL,
               "HTTP listens on wildcard %s without --api-key: anyone who can reach it may use it",
               host);
    return PD_OK;
}

static void drain_timeout(evutil_socket_t fd, short what, void *arg)
{
    rtr_t *r = arg;
    pd_log(PD_LOG_WARN, RTR_COMP, NULL, "drain timeout: failing %u requests still in flight",
           r->n_reqs);
    rtr_flow_fail_all(r, "router shutting down");
    pd_loop_stop(r->loop);
}

void rtr_http_drain(rtr_t *r)
{
    if (r->draining) {
        pd_log(PD_LOG_WARN, RTR_COMP, NULL, "second SIGTERM: stopping now");
        drain_timeout(-1, 0, r);
        return;
    }
    r->draining = true;
    pd_log(PD_LOG_INFO, RTR_COMP, NULL, "SIGTERM: draining (%u requests in flight)", r->n_reqs);
    if (r->http_sock != NULL) {
        rtr_conns_set_listener(r->conns, NULL);
        evhttp_del_accept_socket(r->http, r->http_sock);
        r->http_sock = NULL;
    }
    r->drain_timer = event_new(r->base, -1, 0, drain_timeout, r);
    if (r->drain_timer != NULL) {
        struct timeval tv = pd_ns_to_timeval(r->cfg.drain_timeout_ns);
        event_add(r->drain_timer, &tv);
    }
    rtr_flow_check_idle(r);
}

void rtr_http_stop(rtr_t *r)
{
    /* Prompts being tokenized get their 503 first, then whatever is still
     * in flight ends here (SIGINT / drain timeout). */
    r->tok_closing = true;
    rtr_tok_pool_destroy(r->tok_pool);
    r->tok_pool = NULL;
    rtr_flow_fail_all(r, "router stopping");
    rtr_emb_job_fail_all(r);
    if (r->drain_timer != NULL) {
        event_free(r->drain_timer);
        r->drain_timer = NULL;
    }
    if (r->flush_timer != NULL) {
        event_free(r->flush_timer);
        r->flush_timer = NULL;
    }
    if (r->http != NULL) {
        evhttp_free(r->http);
        r->http = NULL;
    }
    rtr_conns_destroy(r->conns);
    r->conns = NULL;
}
