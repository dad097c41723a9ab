/* rtr_http.c - pd-router's OpenAI front end (the only file that includes
 * evhttp) and the request flow of the serving spec:
 *   HTTP in -> parse -> tokenize -> limits -> route
 *   -> PREFILL_REQ (disaggregated) -> PREFILL_DONE: token 0 to the client
 *   -> DECODE_REQ -> TOKENS... -> FINISH -> finish_reason, usage, [DONE]
 * with retries (decode-local, generated = tokens already streamed), client
 * disconnects (CANCEL / RELEASE upstream) and exactly one terminal state per
 * accepted request.
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
#include "rtr_int.h"

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

#include "pd_idhash.h"
#include "pd_log.h"
#include "pd_time.h"

struct rtr_req {
    rtr_t *r;
    rtr_req_t *prev, *next;              /* r->reqs */
    pd_idhash_node_t hnode;              /* req_by_id, keyed by wire_id */
    struct evhttp_request *http;         /* NULL once the client is gone */
    struct evhttp_request *orphan;       /* detached by libevent: ours to free */
    struct evhttp_connection *evcon;
    struct event *watch;                 /* client EOF watcher, then the
                                            half-close probe's timer */
    evutil_socket_t probe_fd;            /* the client socket being probed */
    struct event *timer;                 /* request timeout */
    char id[PROTO_REQID_MAX + 1];        /* the client's (X-Request-Id): logs, headers */
    char wire_id[PROTO_REQID_MAX + 1];   /* ours, unique per router run: the
                                            only id daemons see and answer to */
    char resp_id[PROTO_REQID_MAX + 16];
    rtr_req_fsm_t fsm;
    rtr_oai_req_t oai;
    int32_t *prompt;                     /* (n_prompt) */
    uint32_t n_prompt;
    int32_t *gen;                        /* (n_gen) tokens streamed to the client */
    uint32_t n_gen, cap_gen;
    rtr_backend_t *prefill, *decode;
    uint64_t lease_id;
    bool lease_held;                     /* PREFILL_DONE seen, lease not handed on */
    bool disagg;
    bool headers_sent;
    uint32_t retries;
    uint32_t next_tok_seq;
    uint32_t slow_checks;
    rtr_textpipe_t pipe;
    char *text;                          /* non-streaming: whole completion */
    size_t text_len, text_cap;
    uint64_t t_accept, t_last_tok;
};

static pd_idhash_t req_by_id;

static rtr_req_t *req_find(const char *id)
{
    pd_idhash_node_t *n = pd_idhash_find(&req_by_id, id);
    return n != NULL ? PD_CONTAINER_OF(n, rtr_req_t, hnode) : NULL;
}

static void req_link(rtr_t *r, rtr_req_t *q)
{
    pd_idhash_add(&req_by_id, &q->hnode, q->wire_id);
    q->next = r->reqs;
    if (r->reqs != NULL)
        r->reqs->prev = q;
    r->reqs = q;
    r->n_reqs++;
}

static void req_unlink(rtr_t *r, rtr_req_t *q)
{
    pd_idhash_del(&req_by_id, &q->hnode);
    if (q->prev != NULL)
        q->prev->next = q->next;
    else
        r->reqs = q->next;
    if (q->next != NULL)
        q->next->prev = q->prev;
    q->prev = q->next = NULL;
    r->n_reqs--;
}

static void req_set_backend(rtr_backend_t **slot, rtr_backend_t *be)
{
    if (*slot != NULL) {
        (*slot)->assigned--;
        pd_stats_gauge_add((*slot)->stats, RTR_BE_assigned, -1);
    }
    *slot = be;
    if (be != NULL) {
        be->assigned++;
        pd_stats_gauge_add(be->stats, RTR_BE_assigned, 1);
    }
}

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

static void reply_error(rtr_t *r, struct evhttp_request *h, const rtr_oai_error_t *err,
                        const char *reqid)
{
    char *json = rtr_oai_error_json(err);
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

/* ---- per-request output --------------------------------------------------- */

static void req_stop_watching(rtr_req_t *q)
{
    if (q->watch != NULL) {
        event_free(q->watch);
        q->watch = NULL;
    }
    if (q->http != NULL && q->evcon != NULL)
        evhttp_connection_set_closecb(q->evcon, NULL, NULL);
}

static void req_free(void *obj)
{
    rtr_req_t *q = obj;
    if (q->orphan != NULL)
        evhttp_request_free(q->orphan);
    rtr_oai_req_free(&q->oai);
    free(q->prompt);
    free(q->gen);
    free(q->text);
    free(q);
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

static void maybe_drained(rtr_t *r)
{
    if (!r->draining || r->n_reqs != 0 || r->flush_timer != NULL)
        return;
    r->flush_timer = event_new(r->base, -1, EV_PERSIST, flush_tick, r);
    struct timeval tv = { 0, 2000 };
    if (r->flush_timer == NULL || event_add(r->flush_timer, &tv) != 0)
        pd_loop_stop(r->loop);
}

/* The one terminal path: state, counters, unlink, deferred free. */
static void req_end(rtr_req_t *q, rtr_req_state_t st)
{
    rtr_t *r = q->r;
    uint64_t now = pd_now_ns();
    rtr_req_fsm_set(&q->fsm, st, now);
    req_stop_watching(q);
    if (q->timer != NULL) {
        event_free(q->timer);
        q->timer = NULL;
    }
    req_set_backend(&q->prefill, NULL);
    req_set_backend(&q->decode, NULL);
    if (r->draining && q->evcon != NULL)
        flush_track(q->evcon);
    pd_stats_inc(r->stats, st == RTR_REQ_COMPLETED ? RTR_ST_requests_completed
                           : st == RTR_REQ_FAILED  ? RTR_ST_requests_failed
                                                   : RTR_ST_requests_canceled);
    pd_stats_gauge_add(r->stats, RTR_ST_requests_inflight, -1);
    pd_stats_observe_ns(r->stats, RTR_ST_request_e2e, now - q->t_accept);
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "%s after %.3f ms, %u tokens, %u retries",
           rtr_req_state_name(st), (double)(now - q->t_accept) / 1e6, q->n_gen, q->retries);
    req_unlink(r, q);
    q->http = NULL;
    if (pd_loop_defer_free(r->loop, req_free, q) != PD_OK)
        req_free(q);
    maybe_drained(r);
}

/* A client that does not read: bytes queued for it in the evbuffer plus
 * those still in the kernel's send queue (SIOCOUTQ; checked every 8th call,
 * one ioctl) over client-max-unsent. */
static bool client_slow(rtr_req_t *q)
{
    if (q->http == NULL || q->evcon == NULL)
        return false;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(q->evcon);
    if (bev == NULL)
        return false;
    uint64_t unsent = evbuffer_get_length(bufferevent_get_output(bev));
    if ((++q->slow_checks & 7) == 0) {
        int outq = 0;
        evutil_socket_t fd = bufferevent_getfd(bev);
        if (fd >= 0 && ioctl(fd, SIOCOUTQ, &outq) == 0 && outq > 0)
            unsent += (uint64_t)outq;
    }
    return unsent > q->r->cfg.client_max_unsent;
}

static void req_client_gone(rtr_req_t *q, const char *why);

static void send_sse(rtr_req_t *q, char *json)
{
    if (json == NULL || q->http == NULL) {
        free(json);
        return;
    }
    size_t len = strlen(json);
    size_t need = rtr_sse_frame(json, len, NULL, 0);
    char *frame = need > 0 ? malloc(need + 1) : NULL;
    if (frame != NULL) {
        rtr_sse_frame(json, len, frame, need + 1);
        struct evbuffer *b = evbuffer_new();
        if (b != NULL) {
            evbuffer_add(b, frame, need);
            evhttp_send_reply_chunk(q->http, b);
            evbuffer_free(b);
        }
    }
    free(frame);
    free(json);
}

static void send_raw_chunk(rtr_req_t *q, const char *text)
{
    if (q->http == NULL)
        return;
    struct evbuffer *b = evbuffer_new();
    if (b != NULL) {
        evbuffer_add(b, text, strlen(text));
        evhttp_send_reply_chunk(q->http, b);
        evbuffer_free(b);
    }
}

static rtr_oai_resp_meta_t req_meta(rtr_req_t *q)
{
    rtr_oai_resp_meta_t m = { q->resp_id, q->r->model_name, q->r->created, q->oai.api };
    return m;
}

static void stream_start(rtr_req_t *q)
{
    if (q->headers_sent || q->http == NULL || !q->oai.stream)
        return;
    struct evkeyvalq *out = evhttp_request_get_output_headers(q->http);
    evhttp_add_header(out, "Content-Type", "text/event-stream");
    evhttp_add_header(out, "Cache-Control", "no-cache");
    add_common_headers(q->http, q->id);
    evhttp_send_reply_start(q->http, 200, "OK");
    q->headers_sent = true;
    if (q->oai.api == RTR_API_CHAT) {
        rtr_oai_resp_meta_t m = req_meta(q);
        send_sse(q, rtr_oai_chunk_json(&m, 0, "", 0, NULL, true));
    }
}

static void emit_text(rtr_req_t *q, const char *text, size_t len)
{
    if (len == 0)
        return;
    if (q->oai.stream) {
        stream_start(q);
        rtr_oai_resp_meta_t m = req_meta(q);
        send_sse(q, rtr_oai_chunk_json(&m, 0, text, len, NULL, false));
        return;
    }
    if (q->text_len + len + 1 > q->text_cap) {
        size_t cap = q->text_cap ? q->text_cap : 256;
        while (cap < q->text_len + len + 1)
            cap *= 2;
        char *t = realloc(q->text, cap);
        if (t == NULL)
            return;
        q->text = t;
        q->text_cap = cap;
    }
    memcpy(q->text + q->text_len, text, len);
    q->text_len += len;
    q->text[q->text_len] = '\0';
}

static void end_http_ok(rtr_req_t *q)
{
    req_stop_watching(q);
    if (q->http == NULL)
        return;
    evhttp_send_reply_end(q->http);
    q->http = NULL;
}

/* Success: flush held text, finish_reason, usage, [DONE] / JSON body. */
static void req_complete(rtr_req_t *q, const char *finish_reason)
{
    char out[RTR_TEXTPIPE_OUT_MAX];
    size_t n = rtr_textpipe_finish(&q->pipe, out, sizeof(out));
    emit_text(q, out, n);
    if (q->pipe.stopped)
        finish_reason = "stop";
    rtr_oai_resp_meta_t m = req_meta(q);
    rtr_oai_usage_t usage = { q->n_prompt, q->n_gen };
    if (q->http != NULL) {
        if (q->oai.stream) {
            stream_start(q);
            send_sse(q, rtr_oai_chunk_json(&m, 0, "", 0, finish_reason, false));
            if (q->oai.include_usage)
                send_sse(q, rtr_oai_usage_chunk_json(&m, &usage));
            send_raw_chunk(q, RTR_SSE_DONE);
            end_http_ok(q);
        } else {
            const char *texts[1] = { q->text != NULL ? q->text : "" };
            size_t lens[1] = { q->text_len };
            const char *fr[1] = { finish_reason };
            char *json = rtr_oai_response_json(&m, 1, texts, lens, fr, &usage);
            req_stop_watching(q);
            reply_json(q->http, json != NULL ? 200 : 500,
                       json != NULL ? json : "{\"error\":{\"message\":\"out of memory\","
                                             "\"type\":\"server_error\",\"param\":null,"
                                             "\"code\":null}}", q->id, 0);
            free(json);
            q->http = NULL;
        }
    }
    pd_log(PD_LOG_INFO, RTR_COMP, q->id, "done: finish_reason=%s prompt=%u completion=%u %s",
           finish_reason, q->n_prompt, q->n_gen, q->disagg ? "disaggregated" : "local");
    req_end(q, RTR_REQ_COMPLETED);
}

/* Failure: a pre-stream HTTP error or a mid-stream error frame. */
static void req_fail(rtr_req_t *q, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void req_fail(rtr_req_t *q, int status, const char *code, const char *fmt, ...)
{
    rtr_oai_error_t err;
    memset(&err, 0, sizeof(err));
    err.http_status = status;
    err.type = status == 429 ? "rate_limit_error" : "server_error";
    err.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.message, sizeof(err.message), fmt, ap);
    va_end(ap);
    pd_log(PD_LOG_WARN, RTR_COMP, q->id, "failed (%d %s): %s%s", status, code, err.message,
           q->headers_sent ? " [mid-stream]" : "");
    if (q->http != NULL) {
        if (q->headers_sent) {
            send_sse(q, rtr_oai_error_json(&err));
            end_http_ok(q);
        } else {
            req_stop_watching(q);
            reply_error(q->r, q->http, &err, q->id);
            q->http = NULL;
        }
    }
    req_end(q, RTR_REQ_FAILED);
}

/* ---- upstream messages ---------------------------------------------------- */

static void fill_sampling(const rtr_req_t *q, proto_sampling_t *s)
{
    memset(s, 0, sizeof(*s));
    s->temperature = q->oai.temperature;
    s->top_p = q->oai.top_p;
    s->top_k = q->oai.top_k > 0 ? (uint32_t)q->oai.top_k : 0;
    s->flags = (q->oai.ignore_eos ? PROTO_SAMPLE_IGNORE_EOS : 0) |
               (q->oai.seed_set ? PROTO_SAMPLE_HAS_SEED : 0);
    s->seed = q->oai.seed;
    s->max_tokens = q->oai.max_tokens;
    s->min_tokens = q->oai.min_tokens;
}

static uint64_t req_budget_ns(const rtr_req_t *q)
{
    uint64_t el = pd_now_ns() - q->t_accept;
    uint64_t to = q->r->cfg.request_timeout;
    return el < to ? to - el : 1;
}

static void send_simple(rtr_backend_t *be, uint16_t type, rtr_req_t *q, uint64_t lease_id)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = type;
    if (type == PROTO_MSG_CANCEL) {
        snprintf(m.u.cancel.request_id, sizeof(m.u.cancel.request_id), "%s", q->wire_id);
        m.u.cancel.status = PD_ERR_CANCELED;
        snprintf(m.u.cancel.reason, sizeof(m.u.cancel.reason), "canceled by router");
    } else {
        snprintf(m.u.release.request_id, sizeof(m.u.release.request_id), "%s", q->wire_id);
        m.u.release.lease_id = lease_id;
    }
    pd_status_t s = rtr_backend_send(be, &m);
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "%s -> %s: %s", proto_msg_name(type),
           be != NULL ? be->id : "-", pd_status_name(s));
}

static void release_lease(rtr_req_t *q)
{
    if (q->lease_held) {
        send_simple(q->prefill, PROTO_MSG_RELEASE, q, q->lease_id);
        q->lease_held = false;
    }
}

static uint32_t needed_blocks(const rtr_req_t *q)
{
    const rtr_t *r = q->r;
    if (!r->geom_fixed || r->geom.block_tokens == 0)
        return 0;
    uint64_t toks = (uint64_t)q->n_prompt + q->oai.max_tokens;
    if (r->context_length != 0 && toks > r->context_length)
        toks = r->context_length;
    return (uint32_t)((toks + r->geom.block_tokens - 1) / r->geom.block_tokens);
}

static pd_status_t send_decode_req(rtr_req_t *q, const proto_prefill_done_t *pd)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_DECODE_REQ;
    proto_decode_req_t *d = &m.u.decode_req;
    snprintf(d->request_id, sizeof(d->request_id), "%s", q->wire_id);
    d->prompt.n = q->n_prompt;
    d->prompt.v = q->prompt;
    d->generated.n = q->n_gen;
    d->generated.v = q->gen;
    fill_sampling(q, &d->sampling);
    /* rng_state 0 = "not provided": the router cannot replay the sampler
     * (it links only the tokenizer part of the engine). */
    d->rng_state = 0;
    d->deadline_ns = req_budget_ns(q);
    if (pd != NULL) {
        d->flags = 0;
        snprintf(d->prefill_peer_id, sizeof(d->prefill_peer_id), "%s", q->prefill->id);
        d->lease_id = pd->lease_id;
        d->kv_handle = pd->kv_handle;
    } else {
        d->flags = PROTO_DEC_PREFILL_LOCALLY;
    }
    q->next_tok_seq = 0;
    return rtr_backend_send(q->decode, &m);
}

/* Decode-local (re)try on some decode daemon with generated = tokens already
 * streamed. `avoid` is tried last. */
static void req_go_local(rtr_req_t *q, rtr_backend_t *avoid, const char *why)
{
    rtr_t *r = q->r;
    uint64_t now = pd_now_ns();
    if (q->fsm.state != RTR_REQ_ROUTED)
        rtr_req_fsm_set(&q->fsm, RTR_REQ_ROUTED, now);
    req_set_backend(&q->prefill, NULL);
    rtr_backend_t *d = rtr_pick_backend(r, PROTO_CAP_DECODE, needed_blocks(q), avoid);
    if (d == NULL)
        d = rtr_pick_backend(r, PROTO_CAP_DECODE, needed_blocks(q), NULL);
    if (d == NULL) {
        if (q->headers_sent)
            req_fail(q, 503, "no_backend", "no decode daemon available (%s)", why);
        else
            req_fail(q, 503, "no_backend", "no decode daemon available (%s)", why);
        return;
    }
    req_set_backend(&q->decode, d);
    q->disagg = false;
    pd_status_t s = send_decode_req(q, NULL);
    if (s != PD_OK) {
        req_fail(q, 503, "backend_busy", "DECODE_REQ to '%s' not sent: %s", d->id,
                 pd_status_name(s));
        return;
    }
    rtr_req_fsm_set(&q->fsm, RTR_REQ_DECODING, pd_now_ns());
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "decode-local on '%s' (generated %u)%s%s", d->id,
           q->n_gen, why ? ": " : "", why ? why : "");
}

static void req_retry(rtr_req_t *q, rtr_backend_t *failed, const char *why)
{
    rtr_t *r = q->r;
    if (q->retries >= r->cfg.max_retries) {
        req_fail(q, 502, "backend_failed", "%s (after %u retries)", why, q->retries);
        return;
    }
    q->retries++;
    pd_stats_inc(r->stats, RTR_ST_requests_retried);
    pd_log(PD_LOG_INFO, RTR_COMP, q->id, "retry %u decode-local: %s", q->retries, why);
    req_go_local(q, failed, why);
}

/* Tokens that reached the router (token 0 from PREFILL_DONE or TOKENS):
 * record, detokenize, stop strings, stream. Returns false if the request
 * ended (stop string or max_tokens reached). */
static bool req_tokens(rtr_req_t *q, const proto_tokens_t *toks)
{
    rtr_t *r = q->r;
    char out[RTR_TEXTPIPE_OUT_MAX];
    char *acc = NULL;
    size_t acc_len = 0, acc_cap = 0;
    for (uint32_t i = 0; i < toks->n; i++) {
        if (q->n_gen >= q->oai.max_tokens || q->pipe.stopped)
            break;
        int32_t t = proto_tokens_get(toks, i);
        if (q->n_gen == q->cap_gen) {
            uint32_t cap = q->cap_gen ? q->cap_gen * 2 : 64;
            int32_t *g = realloc(q->gen, cap * sizeof(*g));
            if (g == NULL)
                break;
            q->gen = g;
            q->cap_gen = cap;
        }
        q->gen[q->n_gen++] = t;
        uint64_t now = pd_now_ns();
        if (q->n_gen == 1)
            pd_stats_observe_ns(r->stats, RTR_ST_request_ttft, now - q->t_accept);
        else
            pd_stats_observe_ns(r->stats, RTR_ST_request_inter_token, now - q->t_last_tok);
        q->t_last_tok = now;
        pd_stats_inc(r->stats, RTR_ST_generation_tokens);
        size_t n = rtr_textpipe_feed(&q->pipe, t, out, sizeof(out));
        if (n > 0) {
            if (acc_len + n > acc_cap) {
                size_t cap = acc_cap ? acc_cap * 2 : 1024;
                while (cap < acc_len + n)
                    cap *= 2;
                char *a = realloc(acc, cap);
                if (a == NULL)
                    break;
                acc = a;
                acc_cap = cap;
            }
            memcpy(acc + acc_len, out, n);
            acc_len += n;
        }
    }
    /* First token: open the stream even if no text is releasable yet, so
     * the client sees its first chunk (TTFT) right away. */
    if (q->oai.stream)
        stream_start(q);
    emit_text(q, acc, acc_len);
    free(acc);
    if (client_slow(q)) {
        req_client_gone(q, "client not reading (output over cap)");
        return false;
    }
    if (q->pipe.stopped) {
        if (q->fsm.state == RTR_REQ_DECODING)
            send_simple(q->decode, PROTO_MSG_CANCEL, q, 0);
        release_lease(q);
        req_complete(q, "stop");
        return false;
    }
    if (q->n_gen >= q->oai.max_tokens) {
        /* Decode finishes by itself at max_tokens; wait for its FINISH unless
         * it never got the request (token 0 from prefill). */
        if (q->fsm.state != RTR_REQ_DECODING) {
            release_lease(q);
            req_complete(q, "length");
            return false;
        }
    }
    return true;
}

static void on_prefill_done(rtr_req_t *q, rtr_backend_t *be, const proto_prefill_done_t *pd)
{
    rtr_t *r = q->r;
    q->lease_id = pd->lease_id;
    q->lease_held = true;
    pd_stats_observe_ns(r->stats, RTR_ST_request_queue_time, pd->queue_ns);
    if (pd->n_prompt_tokens != q->n_prompt)
        pd_log(PD_LOG_WARN, RTR_COMP, q->id, "prefill '%s' reports %u prompt tokens, sent %u",
               be->id, pd->n_prompt_tokens, q->n_prompt);
    int32_t t0 = pd->first_token;
    proto_tokens_t toks = { 1, &t0, NULL };
    if (!req_tokens(q, &toks))
        return;
    if (r->tok != NULL && eng_tok_is_eog(r->tok, t0) && !q->oai.ignore_eos &&
        q->n_gen >= q->oai.min_tokens) {
        release_lease(q);
        req_complete(q, "stop");
        return;
    }
    if (q->decode == NULL || q->decode->conn == NULL || q->decode->state != RTR_BE_READY) {
        release_lease(q);
        req_retry(q, q->decode, "target decode gone before DECODE_REQ");
        return;
    }
    pd_status_t s = send_decode_req(q, pd);
    if (s != PD_OK) {
        release_lease(q);
        req_retry(q, q->decode, "DECODE_REQ not sent");
        return;
    }
    q->lease_held = false;   /* decode owns the lease now (it releases after its pull) */
    rtr_req_fsm_set(&q->fsm, RTR_REQ_DECODING, pd_now_ns());
}

static void on_finish(rtr_req_t *q, const proto_finish_t *f)
{
    rtr_t *r = q->r;
    if (f->queue_ns > 0 && !q->disagg)
        pd_stats_observe_ns(r->stats, RTR_ST_request_queue_time, f->queue_ns);
    if (q->disagg && f->transfer_ns > 0) {
        pd_stats_observe_ns(r->stats, RTR_ST_kv_transfer, f->transfer_ns);
        if (r->geom_fixed && r->geom.block_tokens > 0)
            pd_stats_add(r->stats, RTR_ST_kv_transfer_bytes,
                         (uint64_t)((q->n_prompt + r->geom.block_tokens - 1) / r->geom.block_tokens) *
                         r->geom.block_bytes);
    }
    switch (f->reason) {
    case PROTO_FINISH_STOP:
        req_complete(q, "stop");
        break;
    case PROTO_FINISH_LENGTH:
        req_complete(q, "length");
        break;
    default:
        req_fail(q, 502, "backend_failed", "decode '%s' finished with %s",
                 q->decode != NULL ? q->decode->id : "-", pd_status_name(f->status));
        break;
    }
}

static bool is_pull_failure(pd_status_t s)
{
    return s == PD_ERR_PEER_GONE || s == PD_ERR_TIMED_OUT || s == PD_ERR_STALE ||
           s == PD_ERR_BAD_HANDLE || s == PD_ERR_EXPIRED || s == PD_ERR_TRANSPORT ||
           s == PD_ERR_MISMATCH || s == PD_ERR_IO;
}

void rtr_http_on_msg(rtr_t *r, rtr_backend_t *be, const proto_msg_t *msg)
{
    const char *id;
    switch (msg->hdr.type) {
    case PROTO_MSG_PREFILL_DONE: id = msg->u.prefill_done.request_id; break;
    case PROTO_MSG_TOKENS:       id = msg->u.tokens.request_id; break;
    case PROTO_MSG_FINISH:       id = msg->u.finish.request_id; break;
    case PROTO_MSG_ERROR:        id = msg->u.error.request_id; break;
    default: return;
    }
    rtr_req_t *q = id[0] != '\0' ? req_find(id) : NULL;
    if (q == NULL) {
        if (msg->hdr.type == PROTO_MSG_PREFILL_DONE) {
            /* The request is gone (client left, stop string): give the
             * blocks back now rather than at lease expiry. */
            proto_msg_t m;
            memset(&m, 0, sizeof(m));
            m.hdr.type = PROTO_MSG_RELEASE;
            snprintf(m.u.release.request_id, sizeof(m.u.release.request_id), "%s", id);
            m.u.release.lease_id = msg->u.prefill_done.lease_id;
            (void)rtr_backend_send(be, &m);
        }
        if (msg->hdr.type == PROTO_MSG_ERROR && id[0] == '\0')
            pd_log(PD_LOG_WARN, RTR_COMP, NULL, "ERROR from '%s': %s: %s", be->id,
                   pd_status_name(msg->u.error.status), msg->u.error.message);
        else
            pd_log(PD_LOG_DEBUG, RTR_COMP, id, "%s from '%s' for no live request",
                   proto_msg_name(msg->hdr.type), be->id);
        return;
    }
    bool from_prefill = q->fsm.state == RTR_REQ_PREFILLING && be == q->prefill;
    bool from_decode = q->fsm.state == RTR_REQ_DECODING && be == q->decode;
    switch (msg->hdr.type) {
    case PROTO_MSG_PREFILL_DONE:
        if (!from_prefill)
            goto stale;
        on_prefill_done(q, be, &msg->u.prefill_done);
        return;
    case PROTO_MSG_TOKENS:
        if (!from_decode)
            goto stale;
        if (msg->u.tokens.seq != q->next_tok_seq)
            pd_log(PD_LOG_WARN, RTR_COMP, q->id, "TOKENS seq %u from '%s', expected %u",
                   msg->u.tokens.seq, be->id, q->next_tok_seq);
        q->next_tok_seq = msg->u.tokens.seq + 1;
        (void)req_tokens(q, &msg->u.tokens.tokens);
        return;
    case PROTO_MSG_FINISH:
        if (from_prefill) {
            /* A prefill ends a request only with PREFILL_DONE or ERROR;
             * treat anything else as a failed prefill. */
            req_retry(q, NULL, "prefill sent FINISH instead of PREFILL_DONE");
            return;
        }
        if (!from_decode)
            goto stale;
        on_finish(q, &msg->u.finish);
        return;
    case PROTO_MSG_ERROR: {
        pd_status_t st = msg->u.error.status;
        char why[PROTO_ERRMSG_MAX + 128];
        snprintf(why, sizeof(why), "%s '%s': %s: %s", from_prefill ? "prefill" : "decode", be->id,
                 pd_status_name(st), msg->u.error.message);
        if (from_prefill) {
            req_retry(q, NULL, why);
        } else if (from_decode) {
            if (q->disagg && is_pull_failure(st))
                pd_stats_inc(r->stats, RTR_ST_kv_transfer_failures);
            if (q->disagg && q->prefill != NULL) {
                /* The handle will not be used again (the retry is
                 * decode-local): let the prefill revoke the lease now. */
                q->lease_held = true;
                release_lease(q);
            }
            if (st == PD_ERR_NO_KV_SPACE || st == PD_ERR_OVERLOADED) {
                if (!q->headers_sent && q->retries >= r->cfg.max_retries) {
                    req_fail(q, 503, "overloaded", "%s", why);
                    return;
                }
            }
            req_retry(q, be, why);
        } else {
            goto stale;
        }
        return;
    }
    default:
        return;
    }
stale:
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "stale %s from '%s' in state %s: ignored",
           proto_msg_name(msg->hdr.type), be->id, rtr_req_state_name(q->fsm.state));
}

void rtr_http_backend_down(rtr_t *r, rtr_backend_t *be)
{
    rtr_req_t *q = r->reqs;
    while (q != NULL) {
        rtr_req_t *next = q->next;   /* q may end (unlinked) below */
        if (q->fsm.state == RTR_REQ_PREFILLING && q->prefill == be) {
            req_retry(q, NULL, "prefill daemon down");
        } else if (q->fsm.state == RTR_REQ_DECODING && q->decode == be) {
            if (q->headers_sent || q->n_gen > 0)
                req_fail(q, 502, "backend_failed", "decode daemon '%s' died mid-stream", be->id);
            else
                req_retry(q, be, "decode daemon down before the first token");
        }
        q = next;
    }
}

/* ---- client side ------------------------------------------------------------ */

static void req_client_gone(rtr_req_t *q, const char *why)
{
    rtr_t *r = q->r;
    pd_stats_inc(r->stats, RTR_ST_client_disconnects);
    pd_log(PD_LOG_INFO, RTR_COMP, q->id, "client gone in %s: %s", rtr_req_state_name(q->fsm.state),
           why);
    if (q->fsm.state == RTR_REQ_PREFILLING)
        send_simple(q->prefill, PROTO_MSG_CANCEL, q, 0);
    else if (q->fsm.state == RTR_REQ_DECODING)
        send_simple(q->decode, PROTO_MSG_CANCEL, q, 0);
    release_lease(q);
    if (q->http != NULL) {
        /* Still attached to its connection: drop the connection (which
         * frees the request with it). */
        struct evhttp_connection *evcon = q->evcon;
        req_stop_watching(q);
        q->http = NULL;
        if (evcon != NULL)
            evhttp_connection_free(evcon);
    }
    q->evcon = NULL;
    req_end(q, RTR_REQ_CANCELED);
}

static void on_conn_close(struct evhttp_connection *evcon, void *arg)
{
    rtr_req_t *q = arg;
    if (q->watch != NULL) {
        event_free(q->watch);
        q->watch = NULL;
    }
    if (q->http != NULL && evhttp_request_get_connection(q->http) == NULL)
        q->orphan = q->http;      /* detached by libevent: ours to free */
    q->http = NULL;               /* never touch it again */
    q->evcon = NULL;              /* being freed by libevent */
    req_client_gone(q, "connection closed");
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
    bool closed = getsockopt(q->probe_fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0 ||
                  ti.tcpi_state == TCP_CLOSE ||
                  getsockopt(q->probe_fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0;
    event_free(q->watch);
    q->watch = NULL;
    if (closed) {
        req_client_gone(q, "connection closed");
        return;
    }
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "client half-closed its connection: still answering");
}

/* EOF from the client: a half-close (it still reads) and a full close look
 * the same. For a non-streaming request send an interim "100 Continue"
 * (HTTP/1.1 clients must accept one at any time; nothing of ours is on the
 * wire yet) and look again shortly: a closed socket answers it with a RST.
 * Streaming responses cannot be kept for a half-closed client (evhttp ends
 * the connection on EOF once the stream starts). False: no probe. */
static bool client_probe(rtr_req_t *q, evutil_socket_t fd)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    struct bufferevent *bev = q->evcon ? evhttp_connection_get_bufferevent(q->evcon) : NULL;
    if (q->http == NULL || bev == NULL || q->oai.stream || q->headers_sent ||
        q->http->major != 1 || q->http->minor < 1 ||
        evbuffer_get_length(bufferevent_get_output(bev)) != 0 ||
        send(fd, cont, sizeof(cont) - 1, MSG_NOSIGNAL | MSG_DONTWAIT) !=
            (ssize_t)(sizeof(cont) - 1))
        return false;
    event_free(q->watch);
    q->watch = evtimer_new(q->r->base, on_client_probe, q);
    if (q->watch == NULL)
        return false;
    q->probe_fd = fd;
    struct timeval tv = { 0, 300000 };
    event_add(q->watch, &tv);
    return true;
}

static void on_client_readable(evutil_socket_t fd, short what, void *arg)
{
    rtr_req_t *q = arg;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) {
        /* A pipelined request: evhttp reads it after this one; stop
         * watching (the close callback still covers write errors). */
        event_free(q->watch);
        q->watch = NULL;
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n == 0 && client_probe(q, fd))
        return; /* maybe only half-closed: decided by on_client_probe */
    req_client_gone(q, n == 0 ? "EOF" : strerror(errno));
}

static void on_req_timeout(evutil_socket_t fd, short what, void *arg)
{
    rtr_req_t *q = arg;
    if (q->fsm.state == RTR_REQ_PREFILLING)
        send_simple(q->prefill, PROTO_MSG_CANCEL, q, 0);
    else if (q->fsm.state == RTR_REQ_DECODING)
        send_simple(q->decode, PROTO_MSG_CANCEL, q, 0);
    release_lease(q);
    req_fail(q, 504, "timeout", "request timed out in state %s",
             rtr_req_state_name(q->fsm.state));
}

/* ---- request intake ------------------------------------------------------- */

static bool check_api_key(rtr_t *r, struct evhttp_request *h)
{
    if (r->cfg.api_key == NULL || r->cfg.api_key[0] == '\0')
        return true;
    const char *auth = evhttp_find_header(evhttp_request_get_input_headers(h), "Authorization");
    if (auth == NULL || strncasecmp(auth, "Bearer ", 7) != 0)
        return false;
    auth += 7;
    unsigned char a[32], b[32];
    crypto_generichash(a, sizeof(a), (const unsigned char *)auth, strlen(auth), NULL, 0);
    crypto_generichash(b, sizeof(b), (const unsigned char *)r->cfg.api_key,
                       strlen(r->cfg.api_key), NULL, 0);
    return sodium_memcmp(a, b, sizeof(a)) == 0;
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
        size_t total = 0;
        for (uint32_t i = 0; i < o->n_messages; i++) {
            const char *role = o->messages[i].role;
            /* developer is OpenAI's new name for system. */
            msgs[i].role = strcmp(role, "developer") == 0 ? "system" : role;
            msgs[i].content = o->messages[i].content;
            msgs[i].content_len = o->messages[i].content_len;
            total += o->messages[i].content_len;
        }
        cap = 3 * total + 256 * (size_t)o->n_messages + 256;
        ids = malloc(cap * sizeof(*ids));
        if (ids == NULL) {
            free(msgs);
            return PD_ERR_NO_MEMORY;
        }
        s = eng_chat_encode(r->tok, r->chat_kind, msgs, o->n_messages, true, ids, cap, &n);
        free(msgs);
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

static void handle_generate(rtr_t *r, struct evhttp_request *h, rtr_api_t api, const char *reqid)
{
    rtr_oai_error_t err;
    memset(&err, 0, sizeof(err));
    struct evbuffer *in = evhttp_request_get_input_buffer(h);
    size_t len = evbuffer_get_length(in);
    if (len > r->cfg.max_body) {
        pd_stats_inc(r->stats, RTR_ST_requests_rejected);
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
    rtr_oai_req_t o;
    memset(&o, 0, sizeof(o));
    pd_status_t s = rtr_oai_parse(api, body != NULL ? body : "", len, &lim, &o, &err);
    if (s != PD_OK) {
        pd_stats_inc(r->stats, RTR_ST_requests_rejected);
        if (s == PD_ERR_NO_MEMORY)
            rtr_oai_error_set(&err, 500, "server_error", NULL, NULL, "out of memory");
        reply_error(r, h, &err, reqid);
        return;
    }
    if (o.model[0] != '\0' && strcmp(o.model, r->model_name) != 0) {
        pd_stats_inc(r->stats, RTR_ST_requests_rejected);
        reply_status(r, h, reqid, 404, "invalid_request_error", "model_not_found", "model",
                     "The model '%s' does not exist; this server serves '%s'", o.model,
                     r->model_name);
        rtr_oai_req_free(&o);
        return;
    }
    int32_t *ids = NULL;
    uint32_t n_ids = 0;
    s = tokenize(r, &o, &ids, &n_ids, &err);
    if (s != PD_OK) {
        pd_stats_inc(r->stats, RTR_ST_requests_rejected);
        if (s != PD_ERR_BAD_INPUT)
            rtr_oai_error_set(&err, 500, "server_error", NULL, NULL, "tokenizer: %s",
                              pd_status_str(s));
        reply_error(r, h, &err, reqid);
        rtr_oai_req_free(&o);
        return;
    }
    if (n_ids == 0) {
        pd_stats_inc(r->stats, RTR_ST_requests_rejected);
        reply_status(r, h, reqid, 400, "invalid_request_error", NULL, "prompt",
                     "the prompt is empty after tokenization");
        goto out;
    }
    if (n_ids > PROTO_MAX_PROMPT_TOKENS ||
        (r->context_length != 0 && (uint64_t)n_ids + o.max_tokens > r->context_length)) {
        pd_stats_inc(r->stats, RTR_ST_requests_rejected);
        reply_status(r, h, reqid, 400, "invalid_request_error", "context_length_exceeded",
                     api == RTR_API_CHAT ? "messages" : "prompt",
                     "This model's maximum context length is %u tokens. However, you requested "
                     "%" PRIu64 " tokens (%u in the prompt, %u in the completion). Please reduce "
                     "the prompt or max_tokens.", r->context_length,
                     (uint64_t)n_ids + o.max_tokens, n_ids, o.max_tokens);
        goto out;
    }
    if (o.n_stop > ENG_STOP_MAX) {
        pd_stats_inc(r->stats, RTR_ST_requests_rejected);
        reply_status(r, h, reqid, 400, "invalid_request_error", NULL, "stop",
                     "at most %d stop strings", ENG_STOP_MAX);
        goto out;
    }
    if (r->draining) {
        pd_stats_inc(r->stats, RTR_ST_requests_overloaded);
        reply_status(r, h, reqid, 503, "server_error", "shutting_down", NULL,
                     "the router is draining");
        goto out;
    }
    if (r->n_reqs >= r->cfg.max_concurrent) {
        pd_stats_inc(r->stats, RTR_ST_requests_overloaded);
        reply_status(r, h, reqid, 429, "rate_limit_error", "too_many_requests", NULL,
                     "too many requests in flight (%u); retry later", r->n_reqs);
        goto out;
    }
    /* Route: a decode always, a prefill when disaggregating. */
    uint32_t thr = (uint32_t)r->cfg.disagg_threshold;
    bool prefill_up = rtr_have_backend(r, PROTO_CAP_PREFILL);
    bool disagg = rtr_should_disaggregate((rtr_disagg_mode_t)r->cfg.disagg_mode, n_ids, thr,
                                          prefill_up);
    rtr_req_t tmp_q = { .n_prompt = n_ids, .r = r };
    tmp_q.oai.max_tokens = o.max_tokens;
    rtr_backend_t *dec = rtr_pick_backend(r, PROTO_CAP_DECODE, needed_blocks(&tmp_q), NULL);
    rtr_backend_t *pre = disagg ? rtr_pick_backend(r, PROTO_CAP_PREFILL, 0, NULL) : NULL;
    if (dec == NULL || (disagg && pre == NULL)) {
        pd_stats_inc(r->stats, RTR_ST_requests_overloaded);
        reply_status(r, h, reqid, 503, "server_error", "no_backend", NULL,
                     "no %s daemon is available; retry later", dec == NULL ? "decode" : "prefill");
        goto out;
    }

    /* Accepted. */
    rtr_req_t *q = calloc(1, sizeof(*q));
    if (q == NULL) {
        reply_status(r, h, reqid, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    q->r = r;
    q->http = h;
    q->evcon = evhttp_request_get_connection(h);
    snprintf(q->id, sizeof(q->id), "%s", reqid);
    /* never the client's id on the control plane: a late reply to an
     * ended request must not reach a new one that reused its id */
    snprintf(q->wire_id, sizeof(q->wire_id), "w%08" PRIx64 "-%" PRIx64,
             r->incarnation & 0xffffffffu, ++r->next_wire);
    snprintf(q->resp_id, sizeof(q->resp_id), "%s%s", api == RTR_API_CHAT ? "chatcmpl-" : "cmpl-",
             reqid);
    q->t_accept = pd_now_ns();
    rtr_req_fsm_init(&q->fsm, q->t_accept);
    q->oai = o;
    memset(&o, 0, sizeof(o));
    q->prompt = ids;
    q->n_prompt = n_ids;
    ids = NULL;
    if (rtr_textpipe_init(&q->pipe, r->tok, (const char *const *)q->oai.stop, q->oai.n_stop) !=
        PD_OK) {
        reply_status(r, h, reqid, 400, "invalid_request_error", NULL, "stop", "bad stop strings");
        req_free(q);
        goto out;
    }
    req_link(r, q);
    pd_stats_inc(r->stats, RTR_ST_requests_accepted);
    pd_stats_gauge_add(r->stats, RTR_ST_requests_inflight, 1);
    pd_stats_add(r->stats, RTR_ST_prompt_tokens, n_ids);
    rtr_req_fsm_set(&q->fsm, RTR_REQ_ROUTED, pd_now_ns());

    if (q->evcon != NULL) {
        evhttp_connection_set_closecb(q->evcon, on_conn_close, q);
        struct bufferevent *bev = evhttp_connection_get_bufferevent(q->evcon);
        evutil_socket_t fd = bev != NULL ? bufferevent_getfd(bev) : -1;
        if (fd >= 0) {
            q->watch = event_new(r->base, fd, EV_READ | EV_PERSIST, on_client_readable, q);
            if (q->watch != NULL)
                event_add(q->watch, NULL);
        }
    }
    q->timer = event_new(r->base, -1, 0, on_req_timeout, q);
    if (q->timer != NULL) {
        struct timeval tv = { (time_t)(r->cfg.request_timeout / 1000000000ull),
                              (suseconds_t)(r->cfg.request_timeout % 1000000000ull / 1000) };
        event_add(q->timer, &tv);
    }
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "accepted %s: %u prompt tokens, max_tokens %u, %s%s%s",
           api == RTR_API_CHAT ? "chat" : "completion", n_ids, q->oai.max_tokens,
           disagg ? "prefill on " : "local", disagg ? pre->id : "", q->oai.stream ? " stream" : "");

    req_set_backend(&q->decode, dec);
    if (disagg) {
        req_set_backend(&q->prefill, pre);
        q->disagg = true;
        pd_stats_inc(r->stats, RTR_ST_requests_disaggregated);
        proto_msg_t m;
        memset(&m, 0, sizeof(m));
        m.hdr.type = PROTO_MSG_PREFILL_REQ;
        proto_prefill_req_t *p = &m.u.prefill_req;
        snprintf(p->request_id, sizeof(p->request_id), "%s", q->wire_id);
        p->prompt.n = q->n_prompt;
        p->prompt.v = q->prompt;
        fill_sampling(q, &p->sampling);
        snprintf(p->target_decode_id, sizeof(p->target_decode_id), "%s", dec->id);
        p->deadline_ns = req_budget_ns(q);
        s = rtr_backend_send(pre, &m);
        if (s == PD_OK) {
            rtr_req_fsm_set(&q->fsm, RTR_REQ_PREFILLING, pd_now_ns());
            return;
        }
        pd_log(PD_LOG_WARN, RTR_COMP, q->id, "PREFILL_REQ to '%s' not sent (%s): decode-local",
               pre->id, pd_status_name(s));
    } else {
        pd_stats_inc(r->stats, RTR_ST_requests_local);
    }
    req_go_local(q, NULL, NULL);
    return;
out:
    free(ids);
    rtr_oai_req_free(&o);
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
        s = pd_stats_render_prometheus(sets, n, &text, &len);
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
 * after the first token until the client's delayed ACK (~40 ms per token on
 * a kept-alive connection, measured with pd-bench). evhttp has no
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
    const char *amb = http_ambiguous(h);
    if (amb != NULL) {
        /* and close: the next request's start is uncertain */
        evhttp_add_header(evhttp_request_get_output_headers(h), "Connection", "close");
        pd_stats_inc(r->stats, RTR_ST_requests_rejected);
        reply_status(r, h, NULL, 400, "invalid_request_error", "ambiguous_request", NULL,
                     "ambiguous HTTP framing: %s", amb);
        return;
    }
    const char *hid = evhttp_find_header(evhttp_request_get_input_headers(h), "X-Request-Id");
    if (hid != NULL && !rtr_reqid_valid(hid, strlen(hid))) {
        pd_stats_inc(r->stats, RTR_ST_requests_rejected);
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
            reply_status(r, h, reqid, 503, "server_error", "not_ready", NULL,
                         "not ready: %s%s%s", r->draining ? "draining; " : "",
                         dec ? "" : "no decode daemon; ", pre ? "" : "no prefill-capable daemon");
        }
        return;
    }
    if (strcmp(path, "/metrics") == 0 && get) {
        handle_metrics(r, h);
        return;
    }
    bool is_v1 = strncmp(path, "/v1/", 4) == 0;
    if (is_v1 && !check_api_key(r, h)) {
        pd_stats_inc(r->stats, RTR_ST_requests_rejected);
        reply_status(r, h, reqid, 401, "invalid_request_error", "invalid_api_key", NULL,
                     "Incorrect or missing API key (Authorization: Bearer ...)");
        return;
    }
    if (strcmp(path, "/v1/models") == 0 && get) {
        const char *ids[1] = { r->model_name };
        char *json = rtr_oai_models_json(ids, 1, r->created, "pdserve");
        reply_json(h, 200, json != NULL ? json : "{}", reqid, 0);
        free(json);
        return;
    }
    bool cmpl = strcmp(path, "/v1/completions") == 0;
    bool chat = strcmp(path, "/v1/chat/completions") == 0;
    if ((cmpl || chat) && post) {
        handle_generate(r, h, chat ? RTR_API_CHAT : RTR_API_COMPLETIONS, reqid);
        return;
    }
    pd_stats_inc(r->stats, RTR_ST_requests_rejected);
    if (cmpl || chat || strcmp(path, "/v1/models") == 0 || strcmp(path, "/health") == 0 ||
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
    rtr_conns_opts_t co = {
        .max_total = (uint32_t)r->cfg.http_max_conns,
        .max_per_client = (uint32_t)r->cfg.http_max_conns_per_client,
        .read_timeout_ns = r->cfg.http_read_timeout,
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
    while (r->reqs != NULL) {
        rtr_req_t *q = r->reqs;
        if (q->fsm.state == RTR_REQ_PREFILLING)
            send_simple(q->prefill, PROTO_MSG_CANCEL, q, 0);
        else if (q->fsm.state == RTR_REQ_DECODING)
            send_simple(q->decode, PROTO_MSG_CANCEL, q, 0);
        release_lease(q);
        req_fail(q, 503, "shutting_down", "router shutting down");
    }
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
        struct timeval tv = { (time_t)(r->cfg.drain_timeout / 1000000000ull),
                              (suseconds_t)(r->cfg.drain_timeout % 1000000000ull / 1000) };
        event_add(r->drain_timer, &tv);
    }
    maybe_drained(r);
}

void rtr_http_stop(rtr_t *r)
{
    /* Whatever is still in flight ends here (SIGINT / drain timeout). */
    while (r->reqs != NULL) {
        rtr_req_t *q = r->reqs;
        if (q->fsm.state == RTR_REQ_PREFILLING)
            send_simple(q->prefill, PROTO_MSG_CANCEL, q, 0);
        else if (q->fsm.state == RTR_REQ_DECODING)
            send_simple(q->decode, PROTO_MSG_CANCEL, q, 0);
        release_lease(q);
        req_fail(q, 503, "shutting_down", "router stopping");
    }
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

pd_status_t rtr_admin_requests(pd_admin_req_t *req, cJSON *reply)
{
    rtr_t *r = req->arg;
    cJSON *arr = cJSON_AddArrayToObject(reply, "requests");
    if (arr == NULL)
        return PD_ERR_NO_MEMORY;
    uint64_t now = pd_now_ns();
    for (rtr_req_t *q = r->reqs; q != NULL; q = q->next) {
        cJSON *o = cJSON_CreateObject();
        if (o == NULL)
            return PD_ERR_NO_MEMORY;
        cJSON_AddItemToArray(arr, o);
        cJSON_AddStringToObject(o, "request_id", q->id);
        cJSON_AddStringToObject(o, "wire_id", q->wire_id);
        cJSON_AddStringToObject(o, "state", rtr_req_state_name(q->fsm.state));
        cJSON_AddStringToObject(o, "prefill", q->prefill != NULL ? q->prefill->id : "");
        cJSON_AddStringToObject(o, "decode", q->decode != NULL ? q->decode->id : "");
        cJSON_AddBoolToObject(o, "disaggregated", q->disagg);
        cJSON_AddBoolToObject(o, "stream", q->oai.stream);
        cJSON_AddNumberToObject(o, "prompt_tokens", q->n_prompt);
        cJSON_AddNumberToObject(o, "generated", q->n_gen);
        cJSON_AddNumberToObject(o, "retries", q->retries);
        cJSON_AddNumberToObject(o, "age_ms", (double)(now - q->t_accept) / 1e6);
        cJSON *ph = cJSON_AddObjectToObject(o, "state_entered_ms");
        for (int s = 0; s < RTR_REQ__COUNT && ph != NULL; s++)
            if (q->fsm.enter_ns[s] != 0)
                cJSON_AddNumberToObject(ph, rtr_req_state_name((rtr_req_state_t)s),
                                        (double)(q->fsm.enter_ns[s] - q->t_accept) / 1e6);
    }
    cJSON_AddNumberToObject(reply, "in_flight", r->n_reqs);
    return PD_OK;
}
