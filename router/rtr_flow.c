/* rtr_flow.c - pd-router's request life cycle, without evhttp:
 *   accepted -> PREFILL_REQ (disaggregated) -> PREFILL_DONE: token 0 to the
 *   client -> DECODE_REQ -> TOKENS... -> FINISH -> finish_reason, usage,
 *   [DONE]
 * with retries (decode-local, generated = tokens already streamed),
 * backend loss, client disconnects (CANCEL / RELEASE upstream), timeouts
 * and exactly one terminal state per accepted request (req_end). What
 * reaches the client or a backend goes through r->out (rtr_flow.h): the
 * evhttp front end (rtr_http.c) in the daemon, a recorder in the unit test. */
#include "rtr_flow.h"

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <inttypes.h>
#include <sodium.h>
#include <time.h>

#include "eng_chat.h"
#include "pd_blockname.h"
#include "pd_log.h"
#include "pd_time.h"
#include "rtr_tools.h"

_Static_assert(RTR_MAX_BACKENDS == RTR_KVINDEX_MAX_BACKENDS, "one slot per backend in the KV index");
/* prompt blocks looked up in the KV index at most (the rest is routed as
 * if uncached): 16 Ki blocks = 256 Ki tokens at 16 tokens a block */
#define RTR_KV_LOOKUP_MAX_BLOCKS 16384u

rtr_req_t *rtr_flow_find(const rtr_t *r, const char *id)
{
    pd_idhash_node_t *n = pd_idhash_find(&r->req_by_id, id);
    return n != NULL ? PD_CONTAINER_OF(n, rtr_req_t, hnode) : NULL;
}

static void req_link(rtr_t *r, rtr_req_t *q)
{
    pd_idhash_add(&r->req_by_id, &q->hnode, q->wire_id);
    q->next = r->reqs;
    if (r->reqs != NULL)
        r->reqs->prev = q;
    r->reqs = q;
    r->n_reqs++;
}

static void req_unlink(rtr_t *r, rtr_req_t *q)
{
    pd_idhash_del(&r->req_by_id, &q->hnode);
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
        pd_stats_gauge_add((*slot)->stats, RTR_BE_STAT_assigned, -1);
    }
    *slot = be;
    if (be != NULL) {
        be->assigned++;
        pd_stats_gauge_add(be->stats, RTR_BE_STAT_assigned, 1);
    }
}

/* ---- per-request output --------------------------------------------------- */

static void req_free(void *obj)
{
    rtr_req_t *q = obj;
    q->r->out->release(q);
    if (q->lead == NULL) { /* a choice borrows its lead's */
        rtr_oai_req_free(&q->oai);
        free(q->prompt);
    }
    if (q->ch != NULL) {
        for (uint32_t i = 0; i < q->ch->n; i++) {
            free(q->ch->text[i]);
            free(q->ch->lps[i]);
            rtr_tools_calls_free(q->ch->calls[i], q->ch->n_calls[i]);
            free(q->ch->calls[i]);
        }
        free(q->ch);
    }
    rtr_tools_calls_free(q->calls, q->n_calls);
    free(q->calls);
    free(q->gen);
    free(q->lps);
    free(q->text);
    rtr_fd_stream_free(&q->fd);
    free(q);
}

void rtr_flow_check_idle(rtr_t *r)
{
    if (r->draining && r->n_reqs == 0)
        r->out->idle(r);
}

static void cancel_upstream(rtr_req_t *q);
static void early_drop(rtr_req_t *q);

/* The one terminal path: state, counters, unlink, deferred free. A lead
 * ends its live choices first (canceled); a choice leaves its lead's
 * record (the counters count client requests: the lead's). */
/* The access log: one info line per accepted request, where it ends
 * (refusals are logged by rtr_http.c's reply_error, in the same shape). */
static void access_log(const rtr_req_t *q, rtr_req_state_t st, uint64_t now)
{
    uint32_t n_gen = q->n_gen;
    if (q->ch != NULL)
        for (uint32_t i = 0; i < q->ch->n; i++)
            n_gen += q->ch->c[i] != NULL ? q->ch->c[i]->n_gen : q->ch->n_gen[i];
    char status[16] = "-";
    if (q->client.status > 0)
        snprintf(status, sizeof(status), "%d", q->client.status);
    pd_log(PD_LOG_INFO, RTR_COMP, q->id,
           "access client=%s endpoint=%s status=%s outcome=%s prompt_tokens=%u "
           "cached_tokens=%u completion_tokens=%u ttft_ms=%.1f total_ms=%.1f prefill=%s "
           "decode=%s retries=%u", q->client.peer[0] ? q->client.peer : "-",
           q->client.endpoint != NULL ? q->client.endpoint : "-", status,
           rtr_req_state_name(st), q->n_prompt,
           q->ch != NULL ? q->ch->cached_tokens : q->cached_tokens, n_gen,
           q->t_first_tok_ns ? (double)(q->t_first_tok_ns - q->t_accept_ns) / 1e6 : -1.0,
           (double)(now - q->t_accept_ns) / 1e6,
           q->prefill != NULL ? q->prefill->id : "-", q->decode != NULL ? q->decode->id : "-",
           q->retries);
}

static void req_end(rtr_req_t *q, rtr_req_state_t st)
{
    rtr_t *r = q->r;
    if (q->ch != NULL) {
        for (uint32_t i = 0; i < q->ch->n; i++) {
            rtr_req_t *c = q->ch->c[i];
            if (c != NULL) {
                cancel_upstream(c);
                req_end(c, RTR_REQ_CANCELED);
            }
        }
    }
    early_drop(q);
    uint64_t now = pd_now_ns();
    rtr_req_fsm_set(&q->fsm, st, now);
    if (q->lead == NULL)
        access_log(q, st, now);
    r->out->ended(q);
    if (q->timer != NULL) {
        event_free(q->timer);
        q->timer = NULL;
    }
    if (q->xtimer != NULL) {
        event_free(q->xtimer);
        q->xtimer = NULL;
    }
    req_set_backend(&q->export_from, NULL);
    req_set_backend(&q->prefill, NULL);
    req_set_backend(&q->decode, NULL);
    req_set_backend(&q->migrate_to, NULL);
    if (q->lead != NULL) {
        rtr_choices_t *ch = q->lead->ch;
        ch->c[q->choice] = NULL;
        ch->open--;
        pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "choice %u %s, %u tokens", q->choice,
               rtr_req_state_name(st), q->n_gen);
        req_unlink(r, q);
        if (pd_loop_defer_free(r->loop, req_free, q) != PD_OK)
            req_free(q);
        return;
    }
    pd_stats_inc(r->stats, st == RTR_REQ_COMPLETED ? RTR_STAT_requests_completed
                           : st == RTR_REQ_FAILED  ? RTR_STAT_requests_failed
                                                   : RTR_STAT_requests_canceled);
    pd_stats_gauge_add(r->stats, RTR_STAT_requests_inflight, -1);
    pd_stats_observe_ns(r->stats, RTR_STAT_request_e2e, now - q->t_accept_ns);
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "%s after %.3f ms, %u tokens, %u retries",
           rtr_req_state_name(st), (double)(now - q->t_accept_ns) / 1e6, q->n_gen, q->retries);
    req_unlink(r, q);
    if (pd_loop_defer_free(r->loop, req_free, q) != PD_OK)
        req_free(q);
    rtr_flow_check_idle(r);
}

/* Where q's output goes: a choice writes to its lead's client. */
static rtr_req_t *cli(rtr_req_t *q)
{
    return q->lead != NULL ? q->lead : q;
}

static void send_sse(rtr_req_t *q, char *json)
{
    q = cli(q);
    if (json == NULL || !q->r->out->attached(q)) {
        free(json);
        return;
    }
    size_t len = strlen(json);
    size_t need = rtr_sse_frame(json, len, NULL, 0);
    char *frame = need > 0 ? malloc(need + 1) : NULL;
    if (frame != NULL) {
        rtr_sse_frame(json, len, frame, need + 1);
        q->r->out->write(q, frame, need);
    }
    free(frame);
    free(json);
}

static void send_raw_chunk(rtr_req_t *q, const char *text)
{
    q = cli(q);
    if (!q->r->out->attached(q))
        return;
    q->r->out->write(q, text, strlen(text));
}

/* Whole SSE events a front door rendered (rtr_fd.h); takes bytes. */
static void send_events(rtr_req_t *q, char *bytes)
{
    q = cli(q);
    if (bytes != NULL && q->r->out->attached(q))
        q->r->out->write(q, bytes, strlen(bytes));
    free(bytes);
}

/* Token bytes for logprobs (control tokens as their text). */
static size_t lp_piece(void *ctx, int32_t id, char *buf, size_t cap)
{
    const eng_tok_t *tok = ctx;
    return tok != NULL ? eng_tok_token_piece(tok, id, true, buf, cap) : 0;
}

static rtr_oai_logprobs_t req_lps(rtr_req_t *q, uint32_t from, uint32_t to)
{
    rtr_oai_logprobs_t l = { q->lps + from, to - from, q->lp_chars, lp_piece, q->r->tok };
    return l;
}

static rtr_oai_resp_meta_t req_meta(rtr_req_t *q)
{
    rtr_oai_resp_meta_t m = { q->resp_id, q->r->model_name, q->created, q->oai.api };
    return m;
}

/* What a front door renders (Messages, Responses: never n > 1, so q is
 * the client's request): usage so far, the finish and the stop string. */
static rtr_fd_answer_t fd_answer(rtr_req_t *q, const rtr_oai_resp_meta_t *m, const char *finish)
{
    rtr_fd_answer_t a = { m, &q->oai, q->text != NULL ? q->text : "", q->text_len, finish, NULL,
                          { q->calls, q->n_calls },
                          { q->n_prompt, q->n_gen,
                            q->cached_tokens < q->n_prompt ? q->cached_tokens : q->n_prompt } };
    int k = q->pipe.stop.matched;
    if (finish != NULL && q->pipe.stopped && k >= 0 && (uint32_t)k < q->oai.n_stop)
        a.stop_seq = q->oai.stop[k];
    return a;
}

/* The SSE response is open (once per client) and q's choice has had its
 * chat role chunk. */
static void stream_start(rtr_req_t *q)
{
    rtr_req_t *c = cli(q);
    if (!c->r->out->attached(c) || !c->oai.stream)
        return;
    if (!c->headers_sent) {
        c->r->out->stream_open(c);
        c->headers_sent = true;
    }
    if (!q->role_sent && q->ch == NULL) {
        q->role_sent = true;
        const rtr_fd_api_t *fd = rtr_fd_api(q->oai.api);
        if (fd != NULL) {
            rtr_oai_resp_meta_t m = req_meta(q);
            rtr_fd_answer_t a = fd_answer(q, &m, NULL);
            send_events(q, fd->stream_head(&q->fd, &a));
        } else if (q->oai.api == RTR_API_CHAT) {
            rtr_oai_resp_meta_t m = req_meta(q);
            send_sse(q, rtr_oai_chunk_json(&m, q->choice, "", 0, NULL, true));
        }
    }
}

static void text_append(rtr_req_t *q, const char *text, size_t len);

static const char *tool_opener(const rtr_req_t *q)
{
    return eng_chat_call_opener((eng_chat_tools_fmt_t)q->oai.tool_fmt);
}

static bool tool_forced(const rtr_req_t *q)
{
    return q->oai.tool_choice == RTR_OAI_TOOLS_REQUIRED ||
           q->oai.tool_choice == RTR_OAI_TOOLS_NAMED;
}

/* Where a request's text goes first: held while it may be a tool call. */
static uint8_t tool_scan_init(const rtr_oai_req_t *o)
{
    if (o->tool_fmt == ENG_CHAT_TOOLS_NONE || o->tool_choice == RTR_OAI_TOOLS_NONE)
        return RTR_TOOL_OFF;
    return o->tool_choice == RTR_OAI_TOOLS_AUTO ? RTR_TOOL_MAYBE : RTR_TOOL_CALL;
}

static void emit_text(rtr_req_t *q, const char *text, size_t len)
{
    if (len == 0)
        return;
    if (q->tool_scan != RTR_TOOL_OFF) { /* held until we know */
        text_append(q, text, len);
        if (q->tool_scan == RTR_TOOL_CALL)
            return;
        rtr_toolscan_t st = rtr_tools_scan(tool_opener(q), q->text, q->text_len);
        if (st == RTR_TOOLSCAN_CALL) {
            q->tool_scan = RTR_TOOL_CALL;
        } else if (st == RTR_TOOLSCAN_TEXT) {
            q->tool_scan = RTR_TOOL_OFF; /* plain text: what was held goes out */
            if (q->oai.stream && q->text_len > 0) {
                size_t held = q->text_len;
                q->text_len = 0;
                emit_text(q, q->text, held);
            }
        }
        return;
    }
    if (q->oai.stream) {
        stream_start(q);
        rtr_oai_resp_meta_t m = req_meta(q);
        const rtr_fd_api_t *fd = rtr_fd_api(q->oai.api);
        if (fd != NULL) {
            rtr_fd_answer_t a = fd_answer(q, &m, NULL);
            send_events(q, fd->stream_text(&q->fd, &a, text, len));
            return;
        }
        send_sse(q, rtr_oai_chunk_json(&m, q->choice, text, len, NULL, false));
        return;
    }
    text_append(q, text, len);
}

static void text_append(rtr_req_t *q, const char *text, size_t len)
{
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

static void choice_complete(rtr_req_t *q, const char *finish_reason);

/* The answer is complete: a held tool call becomes q->calls (ids drawn
 * here) and the finish reason "tool_calls"; anything else that was held is
 * text after all (streamed now). */
static const char *tools_finish(rtr_req_t *q, const char *finish_reason)
{
    if (q->tool_scan == RTR_TOOL_OFF)
        return finish_reason;
    rtr_oai_call_t calls[RTR_OAI_MAX_CALLS];
    memset(calls, 0, sizeof(calls));
    uint32_t n = 0;
    eng_chat_tools_fmt_t f = (eng_chat_tools_fmt_t)q->oai.tool_fmt;
    pd_status_t st = q->tool_scan == RTR_TOOL_CALL
                         ? rtr_tools_parse(eng_chat_call_opener(f), eng_chat_call_args_key(f),
                                           tool_forced(q), q->text ? q->text : "", q->text_len,
                                           q->oai.tools, q->oai.n_tools, calls,
                                           q->oai.single_call ? 1 : RTR_OAI_MAX_CALLS, &n)
                         : PD_ERR_BAD_INPUT;
    bool cut = false;
    if (st == PD_ERR_BAD_INPUT && tool_forced(q)) {
        /* a forced call is a call even when cut short (max_tokens, a stop
         * string): its truncated arguments, the finish reason as it came */
        rtr_tools_calls_free(calls, n);
        n = 0;
        st = rtr_tools_partial(eng_chat_call_args_key(f), q->text ? q->text : "", q->text_len,
                               q->oai.tools, q->oai.n_tools,
                               q->oai.tool_choice == RTR_OAI_TOOLS_NAMED
                                   ? (int32_t)q->oai.tool_named : -1, &calls[0]);
        n = st == PD_OK ? 1 : 0;
        cut = st == PD_OK;
    }
    q->tool_scan = RTR_TOOL_OFF;
    if (st == PD_OK && (q->calls = calloc(n, sizeof(*q->calls))) != NULL) {
        static const char an[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        for (uint32_t i = 0; i < n; i++) {
            q->calls[i] = calls[i];
            char id[32] = "call_";
            for (int k = 5; k < 29; k++)
                id[k] = an[randombytes_uniform(sizeof(an) - 1)];
            id[29] = '\0';
            q->calls[i].id = strdup(id);
        }
        q->n_calls = n;
        q->text_len = 0; /* the call is the answer */
        if (q->text != NULL)
            q->text[0] = '\0';
        pd_stats_inc(q->r->stats, RTR_STAT_tool_calls);
        return cut ? finish_reason : "tool_calls";
    }
    rtr_tools_calls_free(calls, n);
    if (q->oai.stream && q->text_len > 0) { /* not a call: the held text */
        size_t held = q->text_len;
        q->text_len = 0;
        emit_text(q, q->text, held);
    }
    return finish_reason;
}

/* Success: flush held text, finish_reason, usage, [DONE] / JSON body. */
static void req_complete(rtr_req_t *q, const char *finish_reason)
{
    char out[RTR_TEXTPIPE_OUT_MAX];
    size_t n = rtr_textpipe_finish(&q->pipe, out, sizeof(out));
    emit_text(q, out, n);
    if (q->pipe.stopped)
        finish_reason = "stop";
    finish_reason = tools_finish(q, finish_reason);
    pd_stats_inc(q->r->stats, strcmp(finish_reason, "length") == 0 ? RTR_STAT_finish_length
                                                                   : RTR_STAT_finish_stop);
    if (q->lead != NULL) {
        choice_complete(q, finish_reason);
        return;
    }
    rtr_oai_resp_meta_t m = req_meta(q);
    rtr_oai_usage_t usage = { q->n_prompt, q->n_gen,
                              q->cached_tokens < q->n_prompt ? q->cached_tokens : q->n_prompt };
    pd_stats_add(q->r->stats, RTR_STAT_prompt_cached_tokens, usage.cached_tokens);
    const rtr_fd_api_t *fd = rtr_fd_api(q->oai.api);
    if (fd != NULL && q->r->out->attached(q)) {
        rtr_fd_answer_t a = fd_answer(q, &m, finish_reason);
        if (q->oai.stream) {
            stream_start(q);
            send_events(q, fd->stream_end(&q->fd, &a));
            q->r->out->stream_end(q);
        } else {
            char *json = fd->body(&a);
            q->r->out->reply(q, json != NULL ? 200 : 500,
                             json != NULL ? json : "{\"error\":{\"message\":\"out of memory\","
                                                   "\"type\":\"server_error\",\"param\":null,"
                                                   "\"code\":null}}", NULL);
            free(json);
        }
    } else if (q->r->out->attached(q)) {
        if (q->oai.stream) {
            stream_start(q);
            if (q->n_calls > 0) {
                rtr_oai_calls_t c = { q->calls, q->n_calls };
                send_sse(q, rtr_oai_tool_chunk_json(&m, 0, &c));
            }
            send_sse(q, rtr_oai_chunk_json(&m, 0, "", 0, finish_reason, false));
            if (q->oai.include_usage)
                send_sse(q, rtr_oai_usage_chunk_json(&m, &usage));
            send_raw_chunk(q, RTR_SSE_DONE);
            q->r->out->stream_end(q);
        } else {
            const char *texts[1] = { q->text != NULL ? q->text : "" };
            size_t lens[1] = { q->text_len };
            const char *fr[1] = { finish_reason };
            rtr_oai_logprobs_t lps;
            if (q->oai.logprobs)
                lps = req_lps(q, 0, q->n_gen);
            rtr_oai_calls_t calls = { q->calls, q->n_calls };
            char *json = rtr_oai_response_full_json(&m, 1, texts, lens, fr, &usage,
                                                    q->oai.logprobs ? &lps : NULL, &calls);
            q->r->out->reply(q, json != NULL ? 200 : 500,
                             json != NULL ? json : "{\"error\":{\"message\":\"out of memory\","
                                                   "\"type\":\"server_error\",\"param\":null,"
                                                   "\"code\":null}}", NULL);
            free(json);
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
    if (q->lead != NULL) { /* one choice failed: the request fails */
        rtr_req_t *lead = q->lead;
        pd_log(PD_LOG_WARN, RTR_COMP, q->id, "choice %u failed: %s", q->choice, err.message);
        req_end(q, RTR_REQ_FAILED);
        req_fail(lead, status, code, "choice %u: %s", q->choice, err.message);
        return;
    }
    pd_log(PD_LOG_WARN, RTR_COMP, q->id, "failed (%d %s): %s%s", status, code, err.message,
           q->headers_sent ? " [mid-stream]" : "");
    if (q->r->out->attached(q)) {
        const rtr_fd_api_t *fd = rtr_fd_api(q->oai.api);
        if (q->headers_sent && fd != NULL) {
            rtr_oai_resp_meta_t m = req_meta(q);
            rtr_fd_answer_t a = fd_answer(q, &m, NULL);
            send_events(q, fd->stream_error(&q->fd, &a, &err));
            q->r->out->stream_end(q);
        } else if (q->headers_sent) {
            send_sse(q, rtr_oai_error_json(&err));
            q->r->out->stream_end(q);
        } else {
            q->r->out->reply(q, status, NULL, &err);
        }
    }
    req_end(q, RTR_REQ_FAILED);
}

/* ---- upstream messages ---------------------------------------------------- */

_Static_assert(RTR_OAI_MAX_BIAS <= PROTO_MAX_LOGIT_BIAS, "logit_bias cap");
_Static_assert(RTR_OAI_MAX_STOP_IDS <= PROTO_MAX_STOP_TOKENS, "stop_token_ids cap");

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
    s->stop.n = q->oai.n_stop_ids;
    s->stop.v = q->oai.stop_ids;
    s->logprobs = q->oai.logprobs ? 1 : 0;
    s->top_logprobs = q->oai.logprobs ? q->oai.top_logprobs : 0;
    s->presence_penalty = q->oai.presence_penalty;
    s->frequency_penalty = q->oai.frequency_penalty;
    s->repetition_penalty = q->oai.repetition_penalty;
    s->min_p = q->oai.min_p;
    s->n_bias = q->oai.n_bias;
    memcpy(s->bias_ids, q->oai.bias_ids, q->oai.n_bias * sizeof(s->bias_ids[0]));
    memcpy(s->bias, q->oai.bias, q->oai.n_bias * sizeof(s->bias[0]));
    s->gram_kind = q->oai.gram_kind;
    s->gram.p = (const uint8_t *)q->oai.gram_schema;
    s->gram.len = q->oai.gram_schema ? (uint32_t)q->oai.gram_schema_len : 0;
}

static uint64_t req_budget_ns(const rtr_req_t *q)
{
    uint64_t el = pd_now_ns() - q->t_accept_ns;
    uint64_t to = q->r->cfg.request_timeout_ns;
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
    pd_status_t s = q->r->out->send(be, &m);
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "%s -> %s: %s", proto_msg_name(type),
           be != NULL ? be->id : "-", pd_status_name(s));
}

/* A stop string matched: CANCEL with status PD_OK, which the decode ends as
 * a STOP finish rather than a cancel (PROTOCOL.md, CANCEL). */
static void send_stop(rtr_req_t *q)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_CANCEL;
    snprintf(m.u.cancel.request_id, sizeof(m.u.cancel.request_id), "%s", q->wire_id);
    m.u.cancel.status = PD_OK;
    snprintf(m.u.cancel.reason, sizeof(m.u.cancel.reason), "stop string");
    (void)q->r->out->send(q->decode, &m);
}

/* The decode holds an early DECODE_REQ (TOKEN0_LATER) it will not get
 * token 0 for: CANCEL it. The copy still answers once (ERROR or FINISH
 * canceled, under the same id): until then a retry on that decode waits
 * (early_end_be, see req_go_local), or the two would share the id. */
static void early_drop(rtr_req_t *q)
{
    if (!q->early_dec)
        return;
    q->early_dec = false;
    if (q->decode != NULL) {
        send_simple(q->decode, PROTO_MSG_CANCEL, q, 0);
        q->early_end_be = q->decode;
    }
    pd_stats_inc(q->r->stats, RTR_STAT_kv_early_canceled);
}

static void release_lease(rtr_req_t *q)
{
    if (q->lease_held) {
        send_simple(q->prefill, PROTO_MSG_RELEASE, q, q->lease_id);
        q->lease_held = false;
    }
}

/* The request ends here: CANCEL to the daemon that has it, RELEASE the
 * lease the router still holds. */
static void cancel_upstream(rtr_req_t *q)
{
    if (q->fsm.state == RTR_REQ_PREFILLING)
        send_simple(q->prefill, PROTO_MSG_CANCEL, q, 0);
    else if (q->fsm.state == RTR_REQ_DECODING)
        send_simple(q->decode, PROTO_MSG_CANCEL, q, 0);
    release_lease(q);
}

static uint32_t blocks_for(const rtr_t *r, uint32_t n_prompt, uint32_t max_tokens)
{
    if (!r->geom_fixed || r->geom.block_tokens == 0)
        return 0;
    uint64_t toks = (uint64_t)n_prompt + max_tokens;
    if (r->context_length != 0 && toks > r->context_length)
        toks = r->context_length;
    return (uint32_t)((toks + r->geom.block_tokens - 1) / r->geom.block_tokens);
}

static uint32_t needed_blocks(const rtr_req_t *q)
{
    return blocks_for(q->r, q->n_prompt, q->oai.max_tokens);
}

static void promise_blocks(uint32_t *room, const rtr_t *r, const rtr_backend_t *t, uint32_t n)
{
    uint32_t *f = &room[t - r->be];
    *f = *f > n ? *f - n : 0;
}

/* Each decode's room as the router can know it: its heartbeat's free
 * blocks less what it was handed since (DECODE_REQs sent after that
 * heartbeat or not sent yet, moves in flight: a decode reserves a stream's
 * blocks when it starts it), none while it queues requests (a new stream
 * would wait behind them). Without it every request between two heartbeats
 * went to the decode that had the most room at the first: a burst landed
 * on one decode. */
static void known_room(const rtr_t *r, uint32_t room[RTR_MAX_BACKENDS])
{
    for (size_t i = 0; i < RTR_MAX_BACKENDS; i++)
        room[i] = r->be[i].hb.queue_depth > 0 ? 0 : r->be[i].hb.free_blocks;
    for (const rtr_req_t *q = r->reqs; q != NULL; q = q->next) {
        if (q->migrate_to != NULL)
            promise_blocks(room, r, q->migrate_to, needed_blocks(q));
        else if (q->decode != NULL &&
                 (q->t_dec_req_ns == 0 || q->t_dec_req_ns >= q->decode->last_hb_ns))
            promise_blocks(room, r, q->decode, needed_blocks(q));
    }
}

/* Each prefill's outstanding prompt tokens as the router can know them:
 * its heartbeat's, plus the prompts routed to it and not yet sent or sent
 * after that heartbeat (the whole prompt: what the prefill has cached of
 * it is not known here). Without it a burst went to the prefill that had
 * the least work at the last heartbeat. */
static void known_outstanding(const rtr_t *r, uint64_t out[RTR_MAX_BACKENDS])
{
    for (size_t i = 0; i < RTR_MAX_BACKENDS; i++)
        out[i] = r->be[i].hb.outstanding_prefill_tokens;
    for (const rtr_req_t *q = r->reqs; q != NULL; q = q->next) {
        rtr_req_state_t st = q->fsm.state;
        if (q->prefill != NULL &&
            (st == RTR_REQ_ROUTED || st == RTR_REQ_EXPORTING ||
             (st == RTR_REQ_PREFILLING &&
              q->fsm.enter_ns[RTR_REQ_PREFILLING] >= q->prefill->last_hb_ns)))
            out[q->prefill - r->be] += q->n_prompt;
    }
}

/* The decode for a new stream of `blocks` over room (known_room's, or as
 * a drain keeps it): KV-aware when cached is given; `avoid` is never
 * chosen. */
static rtr_backend_t *pick_decode(rtr_t *r, const uint32_t *room, uint32_t blocks,
                                  const rtr_backend_t *avoid, const uint32_t *cached,
                                  uint32_t n_prompt)
{
    rtr_choice_t c = { .what = RTR_CHOOSE_DECODE, .caps = PROTO_CAP_DECODE,
                       .exclude = avoid != NULL ? (int)(avoid - r->be) : -1,
                       .needed_blocks = blocks, .cached_tokens = cached,
                       .prompt_tokens = n_prompt, .free_blocks = room };
    return rtr_choose_backend(r, &c);
}

/* DECODE_REQ to q->decode: decode-local (handle.len 0), or pull the KV the
 * handle grants on peer (a prefill's: kv_tokens 0 = the prompt; a decode's
 * in a live migration: prompt + generated - 1). */
static pd_status_t send_decode_req_flags(rtr_req_t *q, const char *peer, uint64_t lease_id,
                                         proto_blob_t handle, uint32_t kv_tokens, uint32_t flags);
/* A running average of a measured rate (the cost figures, r->cost). */
static void cost_note(double *avg, double sample);

static pd_status_t send_decode_req(rtr_req_t *q, const char *peer, uint64_t lease_id,
                                   proto_blob_t handle, uint32_t kv_tokens)
{
    return send_decode_req_flags(q, peer, lease_id, handle, kv_tokens, 0);
}

static pd_status_t send_decode_req_flags(rtr_req_t *q, const char *peer, uint64_t lease_id,
                                         proto_blob_t handle, uint32_t kv_tokens, uint32_t flags)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_DECODE_REQ;
    proto_decode_req_t *d = &m.u.decode_req;
    snprintf(d->request_id, sizeof(d->request_id), "%s", q->wire_id);
    d->cache_partition = q->oai.cache_partition;
    d->prompt.n = q->n_prompt;
    d->prompt.v = q->prompt;
    d->generated.n = q->n_gen;
    d->generated.v = q->gen;
    fill_sampling(q, &d->sampling);
    /* rng_state 0 = "not provided": the router cannot replay the sampler
     * (it links only the tokenizer part of the engine). */
    d->rng_state = 0;
    d->deadline_ns = req_budget_ns(q);
    if (handle.len != 0) {
        d->flags = flags;
        snprintf(d->prefill_peer_id, sizeof(d->prefill_peer_id), "%s", peer);
        d->lease_id = lease_id;
        d->kv_handle = handle;
        d->kv_tokens = kv_tokens;
    } else {
        d->flags = PROTO_DEC_PREFILL_LOCALLY;
    }
    /* n > 1: choice 0's first DECODE_REQ carries the other choices */
    rtr_choices_t *ch = q->lead != NULL && q->choice == 0 ? q->lead->ch : NULL;
    bool fork = ch != NULL && ch->n > 1 && ch->c[1] != NULL && ch->c[1]->fork_pending &&
                q->n_gen <= 1 && kv_tokens == 0 && !(flags & PROTO_DEC_TOKEN0_LATER);
    if (fork)
        d->n_fork = ch->n - 1;
    q->next_tok_seq = 0;
    pd_status_t st = q->r->out->send(q->decode, &m);
    if (st == PD_OK)
        q->t_dec_req_ns = pd_now_ns();
    if (st == PD_OK && fork) {
        for (uint32_t i = 1; i < ch->n; i++) {
            rtr_req_t *c = ch->c[i];
            if (c == NULL || !c->fork_pending)
                continue;
            c->fork_pending = false;
            req_set_backend(&c->decode, q->decode);
            c->next_tok_seq = 0;
            rtr_req_fsm_set(&c->fsm, RTR_REQ_DECODING, pd_now_ns());
        }
    }
    return st;
}

/* What each backend holds of this prompt per the KV index, in tokens
 * (full blocks, named as the daemons name them: pd_blockname.h). false
 * (all 0) when KV routing is off, the geometry is not known yet or no
 * block of the prompt is indexed anywhere. */
static bool kv_match(rtr_t *r, uint64_t partition, const int32_t *prompt, uint32_t n_prompt,
                     uint32_t cached[RTR_MAX_BACKENDS])
{
    memset(cached, 0, RTR_MAX_BACKENDS * sizeof(cached[0]));
    if (r->kvidx == NULL || !r->geom_fixed || r->geom.block_tokens == 0)
        return false;
    uint32_t bt = r->geom.block_tokens, nb = n_prompt / bt;
    if (nb > RTR_KV_LOOKUP_MAX_BLOCKS)
        nb = RTR_KV_LOOKUP_MAX_BLOCKS;
    if (nb == 0)
        return false;
    uint64_t inline_names[256];
    uint64_t *names = nb <= 256 ? inline_names : malloc((size_t)nb * sizeof(*names));
    if (names == NULL)
        return false;
    nb = pd_block_names(bt, r->compat_hash, partition, prompt, n_prompt, names, nb);
    uint32_t blocks[RTR_KVINDEX_MAX_BACKENDS];
    rtr_kvindex_match(r->kvidx, names, nb, blocks);
    if (names != inline_names)
        free(names);
    bool any = false;
    for (uint32_t i = 0; i < RTR_MAX_BACKENDS; i++) {
        cached[i] = blocks[i] * bt;
        any |= cached[i] != 0;
    }
    return any;
}

static bool kv_lookup(rtr_t *r, uint64_t partition, const int32_t *prompt, uint32_t n_prompt,
                      uint32_t cached[RTR_MAX_BACKENDS])
{
    bool any = kv_match(r, partition, prompt, n_prompt, cached);
    if (r->kvidx != NULL && r->geom_fixed && r->geom.block_tokens != 0 &&
        n_prompt >= r->geom.block_tokens)
        pd_stats_inc(r->stats, RTR_STAT_kv_route_lookups);
    return any;
}

/* Count a KV-aware choice: the chosen daemon held part of the prompt. */
static void kv_note_choice(rtr_t *r, const rtr_backend_t *be, const uint32_t *cached,
                           rtr_stat_id_t hits, bool work)
{
    if (be == NULL || cached[be - r->be] == 0)
        return;
    pd_stats_inc(r->stats, hits);
    if (work) /* the backend that computes the prompt */
        pd_stats_add(r->stats, RTR_STAT_kv_route_hit_tokens, cached[be - r->be]);
}

/* Decode-local (re)try on some decode daemon with generated = tokens already
 * streamed: `prefer` when given and still ready (the route's choice), else
 * the KV-aware choice; `avoid` is tried last. */
static void req_go_local(rtr_req_t *q, rtr_backend_t *avoid, const char *why,
                         rtr_backend_t *prefer)
{
    rtr_t *r = q->r;
    uint64_t now = pd_now_ns();
    early_drop(q);
    if (avoid == NULL) /* a decode that still holds a canceled early copy: last */
        avoid = q->early_end_be;
    if (q->fsm.state != RTR_REQ_ROUTED)
        rtr_req_fsm_set(&q->fsm, RTR_REQ_ROUTED, now);
    req_set_backend(&q->prefill, NULL);
    req_set_backend(&q->export_from, NULL); /* a late KV_EXPORT_DONE is RELEASEd */
    if (q->xtimer != NULL)
        event_del(q->xtimer);
    rtr_backend_t *d = NULL;
    if (prefer != NULL && prefer->conn != NULL && prefer->state == RTR_BE_READY) {
        d = prefer;
    } else {
        uint32_t cached[RTR_MAX_BACKENDS], room[RTR_MAX_BACKENDS];
        bool kv = kv_lookup(r, q->oai.cache_partition, q->prompt, q->n_prompt, cached);
        known_room(r, room);
        d = pick_decode(r, room, needed_blocks(q), avoid, kv ? cached : NULL, q->n_prompt);
        if (d == NULL)
            d = pick_decode(r, room, needed_blocks(q), NULL, NULL, 0);
    }
    if (d == NULL) {
        req_fail(q, 503, "no_backend", "no decode daemon available (%s)", why);
        return;
    }
    req_set_backend(&q->decode, d);
    if (q->early_end_be != NULL && d == q->early_end_be) {
        /* its canceled early copy has not answered yet: go on then */
        q->retry_deferred = true;
        pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "retry on '%s' waits for its early copy's end",
               d->id);
        return;
    }
    req_set_backend(&q->migrate_to, NULL);
    q->migrated = false;
    q->disagg = false;
    pd_status_t s = send_decode_req(q, NULL, 0, (proto_blob_t){ NULL, 0 }, 0);
    if (s != PD_OK) {
        req_fail(q, 503, "backend_busy", "DECODE_REQ to '%s' not sent: %s", d->id,
                 pd_status_name(s));
        return;
    }
    rtr_req_fsm_set(&q->fsm, RTR_REQ_DECODING, pd_now_ns());
    if (q->t_failover_ns != 0) {
        q->failovers++;
        pd_stats_inc(r->stats, RTR_STAT_requests_failed_over);
        pd_log(PD_LOG_INFO, RTR_COMP, q->id, "failover %u to '%s' after %u tokens: %s",
               q->failovers, d->id, q->n_gen, why != NULL ? why : "");
    }
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
    pd_stats_inc(r->stats, RTR_STAT_requests_retried);
    pd_log(PD_LOG_INFO, RTR_COMP, q->id, "retry %u decode-local: %s", q->retries, why);
    req_go_local(q, failed, why, NULL);
}

/* The decode serving q is lost (connection, heartbeats) or failed: the
 * stream goes on elsewhere. The retry is decode-local on another decode with
 * generated = the tokens already streamed; the new decode replays the
 * sampler over them (same seed, penalties), so greedy and seeded output is
 * the uninterrupted run's, with no token lost or repeated (tokens the lost
 * decode made but never delivered are made again). Bounded by max-retries;
 * with no decode left the client reads an error. */
static void req_failover(rtr_req_t *q, rtr_backend_t *lost, const char *why)
{
    if (q->disagg && q->prefill != NULL) {
        /* the handle will not be used again (the retry is decode-local):
         * let the prefill revoke the lease now, in case the decode had not
         * pulled yet (a RELEASE after the decode's own is ignored) */
        q->lease_held = true;
        release_lease(q);
    }
    if (q->n_gen > 0) /* counted by req_go_local once the stream moved */
        q->t_failover_ns = pd_now_ns();
    req_retry(q, lost, why);
}

/* Tokens that reached the router (token 0 from PREFILL_DONE or TOKENS):
 * record, detokenize, stop strings, stream. Returns false if the request
 * ended (stop string or max_tokens reached). */
static bool req_tokens(rtr_req_t *q, const proto_tokens_t *toks, const proto_logprobs_t *lps)
{
    rtr_t *r = q->r;
    char out[RTR_TEXTPIPE_OUT_MAX];
    char *acc = NULL;
    size_t acc_len = 0, acc_cap = 0;
    uint32_t first_new = q->n_gen;
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
            if (q->oai.logprobs) {
                rtr_oai_logprob_t *l = realloc(q->lps, cap * sizeof(*l));
                if (l == NULL)
                    break;
                q->lps = l;
            }
            q->cap_gen = cap;
        }
        if (q->oai.logprobs) {
            rtr_oai_logprob_t *e = &q->lps[q->n_gen];
            memset(e, 0, sizeof(*e));
            e->id = t;
            if (lps != NULL && i < lps->n) {
                proto_logprob_t pl;
                proto_logprobs_get(lps, i, &pl);
                e->logprob = pl.logprob;
                e->n_top = lps->top_n < RTR_OAI_MAX_TOP_LOGPROBS ? lps->top_n
                                                                 : RTR_OAI_MAX_TOP_LOGPROBS;
                memcpy(e->top_ids, pl.top_ids, e->n_top * sizeof(e->top_ids[0]));
                memcpy(e->top_lp, pl.top_lp, e->n_top * sizeof(e->top_lp[0]));
            }
        }
        q->gen[q->n_gen++] = t;
        uint64_t now = pd_now_ns();
        if (q->t_failover_ns != 0) {
            pd_stats_observe_ns(r->stats, RTR_STAT_failover_resume, now - q->t_failover_ns);
            q->t_failover_ns = 0;
        }
        if (q->migrated) {
            pd_stats_observe_ns(r->stats, RTR_STAT_migration_resume, now - q->t_migrate_ns);
            if (q->migrate_kv > 0)
                cost_note(&r->cost.move_tok_ns, (double)(now - q->t_migrate_ns) / q->migrate_kv);
            q->migrated = false;
        }
        if (cli(q)->t_first_tok_ns == 0)
            cli(q)->t_first_tok_ns = now;
        if (q->n_gen == 1)
            pd_stats_observe_ns(r->stats, RTR_STAT_request_ttft, now - q->t_accept_ns);
        else
            pd_stats_observe_ns(r->stats, RTR_STAT_request_inter_token, now - q->t_last_tok_ns);
        if (q->n_gen == 2) {
            q->gap1_ns = now - q->t_last_tok_ns;
            q->t_tok1_ns = now;
        }
        q->t_last_tok_ns = now;
        pd_stats_inc(r->stats, RTR_STAT_generation_tokens);
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
    if (q->oai.logprobs && q->oai.stream && q->n_gen > first_new) {
        /* the chunk carries these tokens' logprobs, even with no text yet;
         * text that may be a tool call is held (emit_text), not sent here */
        bool held = q->tool_scan != RTR_TOOL_OFF;
        rtr_oai_resp_meta_t m = req_meta(q);
        rtr_oai_logprobs_t l = req_lps(q, first_new, q->n_gen);
        send_sse(q, rtr_oai_chunk_lp_json(&m, q->choice, acc, held ? 0 : acc_len, NULL, false,
                                          &l));
        q->lp_chars += rtr_oai_logprobs_chars(&l);
        if (held)
            emit_text(q, acc, acc_len);
    } else {
        emit_text(q, acc, acc_len);
    }
    free(acc);
    if (q->r->out->slow(cli(q))) {
        rtr_flow_client_gone(cli(q), "client not reading (output over cap)"); /* ends q too */
        return false;
    }
    if (q->pipe.stopped) {
        if (q->fsm.state == RTR_REQ_DECODING)
            send_stop(q);
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

/* disagg-mode=cost's measured rates (rtr_policy.h rtr_disagg_in_t). */
static void cost_note(double *avg, double sample)
{
    if (sample <= 0)
        return;
    *avg = *avg == 0 ? sample : *avg + (sample - *avg) / 8.0; /* 1/8 weight */
}

/* Fewer computed tokens than this say more about fixed costs than a rate. */
#define COST_MIN_TOKENS 16u
/* The pull's tail of a shorter prompt is its fixed latencies (a 128-token
 * chat prompt read as 1.4 ms a token, a 2000-token one ~0.1 ms): no rate. */
#define PULL_TAIL_MIN_TOKENS 256u

static void cost_note_prefill(rtr_t *r, const rtr_req_t *q, const proto_prefill_done_t *pd)
{
    uint32_t n = pd->n_prompt_tokens;
    uint32_t computed = n - (pd->cached_tokens < n ? pd->cached_tokens : n);
    if (computed >= COST_MIN_TOKENS)
        cost_note(&r->cost.pf_tok_ns, (double)pd->prefill_ns / computed);
    /* the hop: the router's view of the prefill minus the prefill's own */
    uint64_t sent = q->fsm.enter_ns[RTR_REQ_PREFILLING], now = pd_now_ns();
    if (sent != 0 && now > sent + pd->queue_ns + pd->prefill_ns)
        cost_note(&r->cost.hop_ns, (double)(now - sent - pd->queue_ns - pd->prefill_ns));
}

/* A stream's mean step: token 1 to its last token (token 0 -> 1 holds the
 * KV pull's tail); 0 before three tokens. */
static double stream_step_ns(const rtr_req_t *q)
{
    if (q->n_gen < 3 || q->t_last_tok_ns <= q->t_tok1_ns)
        return 0;
    return (double)(q->t_last_tok_ns - q->t_tok1_ns) / (q->n_gen - 2);
}

static void cost_note_finish(rtr_t *r, const rtr_req_t *q, const proto_finish_t *f)
{
    uint32_t n = f->prompt_tokens;
    uint32_t missing = n - (f->cached_tokens < n ? f->cached_tokens : n);
    if (missing < COST_MIN_TOKENS)
        return;
    if (!q->disagg) /* decode-local: the decode computed what it lacked */
        cost_note(&r->cost.dec_tok_ns, (double)f->prefill_ns / missing);
    else if (f->transfer_ns > 0) { /* it pulled what it lacked */
        cost_note(&r->cost.pull_tok_ns, (double)f->transfer_ns / missing);
        /* the pull's tail (the SLO planner's pull cost): the gap before
         * token 1 minus one step (the mean gap of the later tokens); with
         * layer-wise streaming most of a pull hides under the prompt pass */
        double step = stream_step_ns(q);
        if (q->gap1_ns > 0 && step > 0 && missing >= PULL_TAIL_MIN_TOKENS) {
            double tail = (double)q->gap1_ns > step ? (double)q->gap1_ns - step : 0;
            pd_stats_observe_ns(r->stats, RTR_STAT_kv_pull_tail, (uint64_t)tail);
            pd_stats_add(r->stats, RTR_STAT_kv_pull_tail_tokens, missing);
        }
    }
}

static void on_prefill_done(rtr_req_t *q, rtr_backend_t *be, const proto_prefill_done_t *pd)
{
    rtr_t *r = q->r;
    q->lease_id = pd->lease_id;
    q->lease_held = true;
    q->cached_tokens = pd->cached_tokens;
    pd_stats_observe_ns(r->stats, RTR_STAT_request_queue_time, pd->queue_ns);
    cost_note_prefill(r, q, pd);
    if (pd->n_prompt_tokens != q->n_prompt)
        pd_log(PD_LOG_WARN, RTR_COMP, q->id, "prefill '%s' reports %u prompt tokens, sent %u",
               be->id, pd->n_prompt_tokens, q->n_prompt);
    int32_t t0 = pd->first_token;
    proto_tokens_t toks = { 1, &t0, NULL };
    if (!req_tokens(q, &toks, &pd->logprobs))
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
    if (q->early_dec) { /* the decode has the handle: token 0 completes it */
        proto_msg_t m;
        memset(&m, 0, sizeof(m));
        m.hdr.type = PROTO_MSG_FIRST_TOKEN;
        snprintf(m.u.first_token.request_id, sizeof(m.u.first_token.request_id), "%s",
                 q->wire_id);
        m.u.first_token.first_token = t0;
        m.u.first_token.rng_state = 0; /* as DECODE_REQ's: not checked */
        pd_status_t s = r->out->send(q->decode, &m);
        if (s != PD_OK) {
            release_lease(q); /* early_drop (in the retry) cancels the decode's copy */
            req_retry(q, q->decode, "FIRST_TOKEN not sent");
            return;
        }
        q->early_dec = false;
        q->lease_held = false; /* the decode releases it after its pull */
        rtr_req_fsm_set(&q->fsm, RTR_REQ_DECODING, pd_now_ns());
        return;
    }
    pd_status_t s = send_decode_req(q, q->prefill->id, pd->lease_id, pd->kv_handle, 0);
    if (s != PD_OK) {
        release_lease(q);
        req_retry(q, q->decode, "DECODE_REQ not sent");
        return;
    }
    q->lease_held = false;   /* decode owns the lease now (it releases after its pull) */
    rtr_req_fsm_set(&q->fsm, RTR_REQ_DECODING, pd_now_ns());
}

/* PREFILL_HANDLE (kv-stream=layer): the prefill's streamed lease, before
 * its prompt pass. The early hand-off: DECODE_REQ with TOKEN0_LATER at once,
 * so the decode pulls each layer as it is computed; token 0 follows in a
 * FIRST_TOKEN once PREFILL_DONE is in (on_prefill_done). Not taken (the
 * handle then goes with PREFILL_DONE as usual) for n > 1 (the forks ride on
 * the first DECODE_REQ and want token 0's position settled), a prefill that
 * pulled a decode's cached prefix (its handle reaches back into that
 * decode's blocks only through the prefill; kept on the plain path), and
 * when the target decode is not ready. */
static void on_prefill_handle(rtr_req_t *q, rtr_backend_t *be, const proto_prefill_handle_t *h)
{
    rtr_t *r = q->r;
    const char *why = NULL;
    if (q->early_dec)
        why = "a second PREFILL_HANDLE";
    else if (q->lead != NULL)
        why = "n > 1";
    else if (q->src_used)
        why = "prompt prefix pulled from a decode";
    else if (h->n_prompt_tokens != q->n_prompt)
        why = "prompt length differs";
    else if (q->decode == NULL || q->decode->conn == NULL || q->decode->state != RTR_BE_READY)
        why = "target decode not ready";
    if (why != NULL) {
        pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "PREFILL_HANDLE from '%s' not used: %s", be->id,
               why);
        return;
    }
    pd_status_t s = send_decode_req_flags(q, be->id, h->lease_id, h->kv_handle, 0,
                                          PROTO_DEC_TOKEN0_LATER);
    if (s != PD_OK) { /* the handle goes with PREFILL_DONE instead */
        pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "early DECODE_REQ not sent: %s", pd_status_name(s));
        return;
    }
    q->early_dec = true;
    pd_stats_inc(r->stats, RTR_STAT_kv_early_handoffs);
}

/* ---- a decode's cached prefix for the prefill (KV_EXPORT_REQ) ------------ */

/* PREFILL_REQ to q->prefill, with a decode's exported prefix (src, may be
 * NULL). PREFILLING on success; else decode-local on q->decode. */
static void send_prefill_req(rtr_req_t *q, const rtr_backend_t *src_be,
                             const proto_kv_export_done_t *src)
{
    rtr_t *r = q->r;
    rtr_backend_t *pre = q->prefill;
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_PREFILL_REQ;
    proto_prefill_req_t *p = &m.u.prefill_req;
    snprintf(p->request_id, sizeof(p->request_id), "%s", q->wire_id);
    p->cache_partition = q->oai.cache_partition;
    p->prompt.n = q->n_prompt;
    p->prompt.v = q->prompt;
    fill_sampling(q, &p->sampling);
    snprintf(p->target_decode_id, sizeof(p->target_decode_id), "%s",
             q->decode != NULL ? q->decode->id : "");
    p->deadline_ns = req_budget_ns(q);
    if (src != NULL) {
        snprintf(p->src_peer_id, sizeof(p->src_peer_id), "%s", src_be->id);
        p->src_lease_id = src->lease_id;
        p->src_handle = src->kv_handle;
        p->src_kv_tokens = src->kv_tokens;
    }
    pd_status_t s = r->out->send(pre, &m);
    if (s == PD_OK) {
        if (src != NULL) {
            pd_stats_inc(r->stats, RTR_STAT_kv_src_used);
            pd_stats_add(r->stats, RTR_STAT_kv_src_tokens, src->kv_tokens);
        }
        q->src_used = src != NULL;
        rtr_req_fsm_set(&q->fsm, RTR_REQ_PREFILLING, pd_now_ns());
        return;
    }
    pd_log(PD_LOG_WARN, RTR_COMP, q->id, "PREFILL_REQ to '%s' not sent (%s): decode-local",
           pre != NULL ? pre->id : "-", pd_status_name(s));
    if (src != NULL) /* the prefill will not pull it: the decode's blocks back */
        send_simple((rtr_backend_t *)src_be, PROTO_MSG_RELEASE, q, src->lease_id);
    req_go_local(q, NULL, NULL, q->decode);
}

/* EXPORTING is over without a source (refused, timed out, decode lost):
 * the plain PREFILL_REQ. */
static void export_give_up(rtr_req_t *q, rtr_stat_id_t why_stat, const char *why)
{
    pd_stats_inc(q->r->stats, why_stat);
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "prefix export from '%s': %s: prefilling without",
           q->export_from != NULL ? q->export_from->id : "-", why);
    req_set_backend(&q->export_from, NULL);
    if (q->xtimer != NULL)
        event_del(q->xtimer);
    send_prefill_req(q, NULL, NULL);
}

static void on_export_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    rtr_req_t *q = arg;
    if (q->fsm.state == RTR_REQ_EXPORTING)
        export_give_up(q, RTR_STAT_kv_src_timeouts, "no answer in kv-export-timeout");
}

/* The decode exported its cached prefix to q's prefill: PREFILL_REQ with
 * it (the prefill pulls what it lacks, then releases the lease). */
static void on_kv_export_done(rtr_req_t *q, rtr_backend_t *be, const proto_kv_export_done_t *x)
{
    pd_stats_observe_ns(q->r->stats, RTR_STAT_kv_src_export_time,
                        pd_now_ns() - q->fsm.enter_ns[RTR_REQ_EXPORTING]);
    req_set_backend(&q->export_from, NULL);
    if (q->xtimer != NULL)
        event_del(q->xtimer);
    if (x->kv_tokens >= q->n_prompt) { /* the decode broke the rule: not usable */
        send_simple(be, PROTO_MSG_RELEASE, q, x->lease_id);
        export_give_up(q, RTR_STAT_kv_src_refused, "export covers the whole prompt");
        return;
    }
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "'%s' exported %u prompt tokens to '%s'", be->id,
           x->kv_tokens, q->prefill != NULL ? q->prefill->id : "-");
    send_prefill_req(q, be, x);
}

/* Disaggregated dispatch: does a decode hold enough more of the prompt
 * than the prefill for the prefill to pull it (rtr_pick_prefix_source)?
 * Then KV_EXPORT_REQ to it and EXPORTING; true if so. */
static bool try_prefix_source(rtr_req_t *q)
{
    rtr_t *r = q->r;
    if (r->cfg.kv_pull_min_blocks == 0 || r->kvidx == NULL || !r->geom_fixed ||
        r->geom.block_tokens == 0 || q->prefill == NULL)
        return false;
    uint32_t cached[RTR_MAX_BACKENDS];
    if (!kv_match(r, q->oai.cache_partition, q->prompt, q->n_prompt, cached))
        return false;
    uint64_t gain = r->cfg.kv_pull_min_blocks * r->geom.block_tokens;
    rtr_choice_t c = { .what = RTR_CHOOSE_PREFIX_SOURCE,
                       .caps = PROTO_CAP_DECODE | PROTO_CAP_KV_EXPORT, .exclude = -1,
                       .cached_tokens = cached, .prompt_tokens = q->n_prompt,
                       .prefill_cached = cached[q->prefill - r->be],
                       .min_gain_tokens = gain > UINT32_MAX ? UINT32_MAX : (uint32_t)gain,
                       .prefer = q->decode != NULL ? (int)(q->decode - r->be) : -1 };
    rtr_backend_t *src = rtr_choose_backend(r, &c);
    if (src == NULL)
        return false;
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_KV_EXPORT_REQ;
    proto_kv_export_req_t *x = &m.u.kv_export_req;
    snprintf(x->request_id, sizeof(x->request_id), "%s", q->wire_id);
    x->cache_partition = q->oai.cache_partition;
    snprintf(x->target_prefill_id, sizeof(x->target_prefill_id), "%s", q->prefill->id);
    x->prompt.n = q->n_prompt;
    x->prompt.v = q->prompt;
    /* less than that is not worth it: the prefill has it already */
    uint64_t min = (uint64_t)cached[q->prefill - r->be] + gain;
    x->min_tokens = min < q->n_prompt ? (uint32_t)min : q->n_prompt - 1;
    if (r->out->send(src, &m) != PD_OK)
        return false;
    if (q->xtimer == NULL)
        q->xtimer = event_new(r->base, -1, 0, on_export_timeout, q);
    if (q->xtimer != NULL) {
        struct timeval tv = pd_ns_to_timeval(r->cfg.kv_export_timeout_ns);
        event_add(q->xtimer, &tv);
    }
    req_set_backend(&q->export_from, src);
    pd_stats_inc(r->stats, RTR_STAT_kv_src_exports);
    rtr_req_fsm_set(&q->fsm, RTR_REQ_EXPORTING, pd_now_ns());
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "'%s' holds %u prompt tokens, prefill '%s' %u: "
           "KV_EXPORT_REQ", src->id, cached[src - r->be], q->prefill->id, cached[q->prefill - r->be]);
    return true;
}

static void on_finish(rtr_req_t *q, const proto_finish_t *f)
{
    rtr_t *r = q->r;
    if (f->queue_ns > 0 && !q->disagg)
        pd_stats_observe_ns(r->stats, RTR_STAT_request_queue_time, f->queue_ns);
    if (q->disagg && f->transfer_ns > 0)
        pd_stats_observe_ns(r->stats, RTR_STAT_kv_transfer, f->transfer_ns);
    /* what was really pulled: blocks the decode had cached were skipped */
    pd_stats_add(r->stats, RTR_STAT_kv_transfer_bytes, f->kv_bytes);
    cost_note_finish(r, q, f);
    if (!q->disagg) /* decode-local: the decode's own reuse */
        q->cached_tokens = f->cached_tokens;
    switch (f->reason) {
    case PROTO_FINISH_STOP:
        req_complete(q, "stop");
        break;
    case PROTO_FINISH_LENGTH:
        req_complete(q, "length");
        break;
    default: { /* e.g. the decode stopping past its drain timeout */
        char why[128];
        snprintf(why, sizeof(why), "decode '%s' finished with %s",
                 q->decode != NULL ? q->decode->id : "-", pd_status_name(f->status));
        req_failover(q, q->decode, why);
        break;
    }
    }
}

/* ---- live migration ---------------------------------------------------------- */

/* The old decode stopped the stream after m->n_gen tokens (all of them
 * already here: TOKENS come first on its connection) and exported its KV
 * to the target under a lease: the target pulls it and goes on. */
static void on_migrate_done(rtr_req_t *q, rtr_backend_t *from, const proto_migrate_done_t *m)
{
    rtr_t *r = q->r;
    rtr_backend_t *t = q->migrate_to;
    char why[160];
    if (m->n_gen != q->n_gen) {
        send_simple(from, PROTO_MSG_RELEASE, q, m->lease_id);
        snprintf(why, sizeof(why), "migration from '%s': %u tokens there, %u here", from->id,
                 m->n_gen, q->n_gen);
        req_failover(q, from, why);
        return;
    }
    if (t->conn == NULL || t->state != RTR_BE_READY || (t->hb.flags & PROTO_HB_DRAINING)) {
        /* the handle names its importer: another target cannot use it */
        send_simple(from, PROTO_MSG_RELEASE, q, m->lease_id);
        snprintf(why, sizeof(why), "migration target '%s' gone", t->id);
        req_failover(q, from, why);
        return;
    }
    req_set_backend(&q->decode, t);
    req_set_backend(&q->migrate_to, NULL);
    pd_status_t s = send_decode_req(q, from->id, m->lease_id, m->kv_handle, m->kv_tokens);
    if (s != PD_OK) {
        send_simple(from, PROTO_MSG_RELEASE, q, m->lease_id);
        snprintf(why, sizeof(why), "DECODE_REQ to migration target '%s' not sent: %s", t->id,
                 pd_status_name(s));
        req_failover(q, t, why);
        return;
    }
    q->migrated = true;
    pd_stats_inc(r->stats, RTR_STAT_requests_migrated);
    pd_log(PD_LOG_INFO, RTR_COMP, q->id, "migrating from '%s' to '%s' after %u tokens (KV of %u)",
           from->id, t->id, q->n_gen, m->kv_tokens);
}

static void drain_keep(rtr_req_t *q, const rtr_backend_t *be, const char *why)
{
    if (!q->drain_kept)
        pd_stats_inc(q->r->stats, RTR_STAT_requests_kept_on_drain);
    q->drain_kept = true;
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "stays on draining '%s': %s", be->id, why);
}

uint32_t rtr_flow_migrate_from(rtr_t *r, rtr_backend_t *be)
{
    uint32_t n = 0, kept = 0;
    uint32_t room[RTR_MAX_BACKENDS];
    known_room(r, room);
    for (rtr_req_t *q = r->reqs; q != NULL; q = q->next) {
        if (q->fsm.state != RTR_REQ_DECODING || q->decode != be || q->migrate_to != NULL ||
            q->n_gen == 0)
            continue;
        /* nearly done: it ends where it is before a move would resume it */
        uint32_t left = q->oai.max_tokens > q->n_gen ? q->oai.max_tokens - q->n_gen : 0;
        uint32_t kv = q->n_prompt + q->n_gen - 1;
        if (rtr_finish_in_place(left, stream_step_ns(q), kv, r->cost.move_tok_ns,
                                r->cost.pull_tok_ns, r->cost.hop_ns)) {
            drain_keep(q, be, "nearly done");
            kept++;
            continue;
        }
        uint32_t need = needed_blocks(q);
        rtr_backend_t *t = pick_decode(r, room, need, be, NULL, 0);
        if (t == NULL)
            break; /* nowhere to go: the rest finish where they are */
        if (room[t - r->be] < need) {
            /* queued on a full decode it would stall; here it runs (asked
             * again at the draining decode's next heartbeat) */
            drain_keep(q, be, "no other decode has room");
            kept++;
            continue;
        }
        proto_msg_t m;
        memset(&m, 0, sizeof(m));
        m.hdr.type = PROTO_MSG_MIGRATE;
        snprintf(m.u.migrate.request_id, sizeof(m.u.migrate.request_id), "%s", q->wire_id);
        snprintf(m.u.migrate.target_decode_id, sizeof(m.u.migrate.target_decode_id), "%s",
                 t->id);
        if (r->out->send(be, &m) != PD_OK)
            continue;
        req_set_backend(&q->migrate_to, t); /* counts as assigned: the next pick spreads */
        promise_blocks(room, r, t, need);
        q->t_migrate_ns = pd_now_ns();
        q->migrate_kv = kv;
        n++;
    }
    pd_log(n > 0 ? PD_LOG_INFO : PD_LOG_DEBUG, RTR_COMP, NULL,
           "decode '%s' draining: %u stream(s) asked to migrate, %u stay", be->id, n, kept);
    return n;
}

static bool is_pull_failure(pd_status_t s)
{
    return s == PD_ERR_PEER_GONE || s == PD_ERR_TIMED_OUT || s == PD_ERR_STALE ||
           s == PD_ERR_BAD_HANDLE || s == PD_ERR_EXPIRED || s == PD_ERR_TRANSPORT ||
           s == PD_ERR_MISMATCH || s == PD_ERR_IO;
}

void rtr_flow_on_msg(rtr_t *r, rtr_backend_t *be, const proto_msg_t *msg)
{
    const char *id;
    switch (msg->hdr.type) {
    case PROTO_MSG_PREFILL_DONE: id = msg->u.prefill_done.request_id; break;
    case PROTO_MSG_PREFILL_HANDLE: id = msg->u.prefill_handle.request_id; break;
    case PROTO_MSG_TOKENS:       id = msg->u.tokens.request_id; break;
    case PROTO_MSG_FINISH:       id = msg->u.finish.request_id; break;
    case PROTO_MSG_ERROR:        id = msg->u.error.request_id; break;
    case PROTO_MSG_MIGRATE_DONE: id = msg->u.migrate_done.request_id; break;
    case PROTO_MSG_KV_EXPORT_DONE: id = msg->u.kv_export_done.request_id; break;
    default: return;
    }
    rtr_req_t *q = id[0] != '\0' ? rtr_flow_find(r, id) : NULL;
    if (q == NULL) {
        if (msg->hdr.type == PROTO_MSG_PREFILL_DONE || msg->hdr.type == PROTO_MSG_MIGRATE_DONE ||
            msg->hdr.type == PROTO_MSG_KV_EXPORT_DONE) {
            /* The request is gone (client left, stop string): give the
             * blocks back now rather than at lease expiry. */
            proto_msg_t m;
            memset(&m, 0, sizeof(m));
            m.hdr.type = PROTO_MSG_RELEASE;
            snprintf(m.u.release.request_id, sizeof(m.u.release.request_id), "%s", id);
            m.u.release.lease_id = msg->hdr.type == PROTO_MSG_PREFILL_DONE
                                       ? msg->u.prefill_done.lease_id
                                   : msg->hdr.type == PROTO_MSG_MIGRATE_DONE
                                       ? msg->u.migrate_done.lease_id
                                       : msg->u.kv_export_done.lease_id;
            (void)r->out->send(be, &m);
        }
        if (msg->hdr.type == PROTO_MSG_ERROR && id[0] == '\0')
            pd_log(PD_LOG_WARN, RTR_COMP, NULL, "ERROR from '%s': %s: %s", be->id,
                   pd_status_name(msg->u.error.status), msg->u.error.message);
        else
            pd_log(PD_LOG_DEBUG, RTR_COMP, id, "%s from '%s' for no live request",
                   proto_msg_name(msg->hdr.type), be->id);
        return;
    }
    if (q->early_end_be == be &&
        (msg->hdr.type == PROTO_MSG_ERROR || msg->hdr.type == PROTO_MSG_FINISH)) {
        /* the one answer of a canceled early copy: a deferred retry goes now */
        q->early_end_be = NULL;
        if (q->retry_deferred) {
            q->retry_deferred = false;
            req_go_local(q, NULL, "early copy ended", be);
        }
        return;
    }
    bool from_prefill = q->fsm.state == RTR_REQ_PREFILLING && be == q->prefill;
    bool from_decode = q->fsm.state == RTR_REQ_DECODING && be == q->decode;
    bool from_export = q->fsm.state == RTR_REQ_EXPORTING && be == q->export_from;
    /* the decode holding an early DECODE_REQ (only an ERROR is expected) */
    bool from_early = q->fsm.state == RTR_REQ_PREFILLING && q->early_dec && be == q->decode;
    switch (msg->hdr.type) {
    case PROTO_MSG_PREFILL_HANDLE:
        if (!from_prefill)
            goto stale; /* the PREFILL_DONE (or the prefill's CANCEL) deals with its lease */
        on_prefill_handle(q, be, &msg->u.prefill_handle);
        return;
    case PROTO_MSG_KV_EXPORT_DONE:
        if (!from_export) { /* late (timed out, moved on): its blocks back */
            send_simple(be, PROTO_MSG_RELEASE, q, msg->u.kv_export_done.lease_id);
            goto stale;
        }
        on_kv_export_done(q, be, &msg->u.kv_export_done);
        return;
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
        (void)req_tokens(q, &msg->u.tokens.tokens, &msg->u.tokens.logprobs);
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
    case PROTO_MSG_MIGRATE_DONE:
        if (!from_decode || q->migrate_to == NULL) {
            send_simple(be, PROTO_MSG_RELEASE, q, msg->u.migrate_done.lease_id);
            goto stale;
        }
        on_migrate_done(q, be, &msg->u.migrate_done);
        return;
    case PROTO_MSG_ERROR: {
        pd_status_t st = msg->u.error.status;
        char why[PROTO_ERRMSG_MAX + 128];
        snprintf(why, sizeof(why), "%s '%s': %s: %s", from_prefill ? "prefill" : "decode", be->id,
                 pd_status_name(st), msg->u.error.message);
        if (from_export) {
            export_give_up(q, RTR_STAT_kv_src_refused, why);
        } else if (from_early) {
            /* the decode dropped its early copy (refused, pull failed): the
             * request goes on the plain path; PREFILL_DONE hands the lease
             * on again (or the prefill reports it ended, and retries) */
            if (is_pull_failure(st))
                pd_stats_inc(r->stats, RTR_STAT_kv_transfer_failures);
            q->early_dec = false;
            pd_log(PD_LOG_INFO, RTR_COMP, q->id, "early hand-off dropped: %s", why);
        } else if (from_prefill) {
            req_retry(q, NULL, why);
        } else if (from_decode) {
            if (q->disagg && is_pull_failure(st))
                pd_stats_inc(r->stats, RTR_STAT_kv_transfer_failures);
            if (st == PD_ERR_NO_KV_SPACE || st == PD_ERR_OVERLOADED) {
                if (!cli(q)->headers_sent && q->retries >= r->cfg.max_retries) {
                    req_fail(q, 503, "overloaded", "%s", why);
                    return;
                }
            }
            req_failover(q, be, why);
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

void rtr_flow_backend_down(rtr_t *r, rtr_backend_t *be)
{
    /* Each step may end other requests (a failed choice ends its whole
     * request): start over after each; a request that moved no longer
     * names be (a down backend is never picked again). */
again:
    for (rtr_req_t *q = r->reqs; q != NULL; q = q->next) {
        if (q->early_end_be == be) { /* its early copy will not answer now */
            q->early_end_be = NULL;
            if (q->retry_deferred) {
                q->retry_deferred = false;
                req_go_local(q, be, "decode lost", NULL);
                goto again;
            }
        }
        if (q->fsm.state == RTR_REQ_EXPORTING && q->export_from == be) {
            export_give_up(q, RTR_STAT_kv_src_timeouts, "decode lost");
            goto again;
        } else if ((q->fsm.state == RTR_REQ_PREFILLING || q->fsm.state == RTR_REQ_EXPORTING) &&
                   q->prefill == be) {
            req_retry(q, NULL, "prefill daemon down");
            goto again;
        } else if (q->fsm.state == RTR_REQ_PREFILLING && q->early_dec && q->decode == be) {
            q->early_dec = false; /* PREFILL_DONE then retries on another decode */
        } else if (q->fsm.state == RTR_REQ_DECODING && q->decode == be) {
            char why[128];
            snprintf(why, sizeof(why), "decode daemon '%s' lost", be->id);
            req_failover(q, be, why);
            goto again;
        }
    }
}

/* ---- client side ------------------------------------------------------------ */

void rtr_flow_client_gone(rtr_req_t *q, const char *why)
{
    rtr_t *r = q->r;
    pd_stats_inc(r->stats, RTR_STAT_client_disconnects);
    pd_log(PD_LOG_INFO, RTR_COMP, q->id, "client gone in %s: %s", rtr_req_state_name(q->fsm.state),
           why);
    cancel_upstream(q);
    q->r->out->drop(q); /* closes the connection if the client still holds it */
    req_end(q, RTR_REQ_CANCELED);
}

static void on_req_timeout(evutil_socket_t fd, short what, void *arg)
{
    rtr_req_t *q = arg;
    cancel_upstream(q);
    req_fail(q, 504, "timeout", "request timed out in state %s",
             rtr_req_state_name(q->fsm.state));
}

/* ---- choices (n > 1) ----------------------------------------------------------

 * The lead (the client's request) holds the client, the timer and the
 * counters; choice i is a request of its own with seed + i. Choice 0 goes
 * the usual way; choices 1..n-1 ride on its first DECODE_REQ (n_fork): the
 * decode forks them off its prompt once that KV is in (pulled or computed
 * once, full blocks shared). From then on each choice is on its own:
 * tokens, stop strings, retries, failover, migration. One failed choice
 * fails the request; the response ends when the last choice has. */

static pd_status_t choices_new(rtr_req_t *lead)
{
    rtr_t *r = lead->r;
    uint32_t n = lead->oai.n;
    lead->ch = calloc(1, sizeof(*lead->ch));
    if (lead->ch == NULL)
        return PD_ERR_NO_MEMORY;
    rtr_choices_t *ch = lead->ch;
    for (uint32_t i = 0; i < n; i++) {
        rtr_req_t *c = calloc(1, sizeof(*c));
        if (c == NULL)
            return PD_ERR_NO_MEMORY; /* req_end(lead) ends those made */
        c->r = r;
        c->lead = lead;
        c->choice = i;
        memcpy(c->id, lead->id, sizeof(c->id));
        if (i == 0)
            snprintf(c->wire_id, sizeof(c->wire_id), "w%08" PRIx64 "-%" PRIx64,
                     r->incarnation & 0xffffffffu, ++r->next_wire);
        else /* the decode names its forks so (PROTOCOL.md, DECODE_REQ) */
            snprintf(c->wire_id, sizeof(c->wire_id), "%.40s/%u", ch->c[0]->wire_id, i);
        memcpy(c->resp_id, lead->resp_id, sizeof(c->resp_id));
        c->created = lead->created;
        c->t_accept_ns = lead->t_accept_ns;
        rtr_req_fsm_init(&c->fsm, c->t_accept_ns);
        c->oai = lead->oai; /* borrowed: req_free frees the lead's only */
        c->oai.n = 1;
        c->oai.seed = lead->oai.seed + i;
        c->prompt = lead->prompt;
        c->n_prompt = lead->n_prompt;
        (void)rtr_textpipe_init(&c->pipe, r->tok, (const char *const *)c->oai.stop,
                                c->oai.n_stop); /* the lead's init checked them */
        c->fork_pending = i > 0;
        c->tool_scan = tool_scan_init(&c->oai);
        req_link(r, c);
        ch->c[i] = c;
        ch->n++;
        ch->open++;
        rtr_req_fsm_set(&c->fsm, RTR_REQ_ROUTED, pd_now_ns());
    }
    return PD_OK;
}

/* All choices ended well: usage and [DONE], or the JSON body with every
 * choice. */
static void choices_done(rtr_req_t *lead)
{
    rtr_choices_t *ch = lead->ch;
    rtr_oai_resp_meta_t m = req_meta(lead);
    rtr_oai_usage_t usage = { lead->n_prompt, 0,
                              ch->cached_tokens < lead->n_prompt ? ch->cached_tokens
                                                                 : lead->n_prompt };
    pd_stats_add(lead->r->stats, RTR_STAT_prompt_cached_tokens, usage.cached_tokens);
    for (uint32_t i = 0; i < ch->n; i++)
        usage.completion_tokens += ch->n_gen[i];
    if (lead->r->out->attached(lead)) {
        if (lead->oai.stream) {
            stream_start(lead);
            if (lead->oai.include_usage)
                send_sse(lead, rtr_oai_usage_chunk_json(&m, &usage));
            send_raw_chunk(lead, RTR_SSE_DONE);
            lead->r->out->stream_end(lead);
        } else {
            const char *texts[RTR_OAI_MAX_N];
            rtr_oai_logprobs_t lps[RTR_OAI_MAX_N];
            rtr_oai_calls_t calls[RTR_OAI_MAX_N];
            for (uint32_t i = 0; i < ch->n; i++) {
                texts[i] = ch->text[i] != NULL ? ch->text[i] : "";
                lps[i] = (rtr_oai_logprobs_t){ ch->lps[i], ch->n_gen[i], 0, lp_piece,
                                               lead->r->tok };
                calls[i] = (rtr_oai_calls_t){ ch->calls[i], ch->n_calls[i] };
            }
            char *json = rtr_oai_response_full_json(&m, ch->n, texts, ch->text_len, ch->finish,
                                                    &usage, lead->oai.logprobs ? lps : NULL,
                                                    calls);
            lead->r->out->reply(lead, json != NULL ? 200 : 500,
                                json != NULL ? json : "{\"error\":{\"message\":\"out of memory\","
                                                      "\"type\":\"server_error\",\"param\":null,"
                                                      "\"code\":null}}", NULL);
            free(json);
        }
    }
    pd_log(PD_LOG_INFO, RTR_COMP, lead->id, "done: %u choices, prompt=%u completion=%u", ch->n,
           lead->n_prompt, usage.completion_tokens);
    req_end(lead, RTR_REQ_COMPLETED);
}

/* Choice q ended well (its held text already flushed): its finish chunk,
 * or its result kept for the body; then, for choice 0, the choices that
 * were to ride on its DECODE_REQ start on their own (it ended before
 * sending one: token 0 ended it). */
static void choice_complete(rtr_req_t *q, const char *finish_reason)
{
    rtr_req_t *lead = q->lead;
    rtr_choices_t *ch = lead->ch;
    uint32_t i = q->choice;
    if (lead->oai.stream) {
        rtr_oai_resp_meta_t m = req_meta(q);
        stream_start(q);
        if (q->n_calls > 0) {
            rtr_oai_calls_t c = { q->calls, q->n_calls };
            send_sse(q, rtr_oai_tool_chunk_json(&m, i, &c));
        }
        send_sse(q, rtr_oai_chunk_json(&m, i, "", 0, finish_reason, false));
    } else {
        ch->text[i] = q->text;
        ch->text_len[i] = q->text_len;
        q->text = NULL;
        ch->lps[i] = q->lps;
        q->lps = NULL;
        ch->calls[i] = q->calls;
        ch->n_calls[i] = q->n_calls;
        q->calls = NULL;
        q->n_calls = 0;
    }
    ch->finish[i] = finish_reason; /* a string literal */
    if (i == 0) /* the prompt is computed (or found cached) once, by choice 0 */
        ch->cached_tokens = q->cached_tokens;
    ch->n_gen[i] = q->n_gen;
    req_end(q, RTR_REQ_COMPLETED);
    for (uint32_t k = 1; k < ch->n && !rtr_req_state_terminal(lead->fsm.state); k++) {
        rtr_req_t *c = ch->c[k];
        if (c != NULL && c->fork_pending) {
            c->fork_pending = false;
            req_go_local(c, NULL, NULL, c->decode); /* may fail the whole request */
        }
    }
    if (!rtr_req_state_terminal(lead->fsm.state) && ch->open == 0)
        choices_done(lead);
}

/* ---- intake ------------------------------------------------------------------ */

bool rtr_flow_route(rtr_t *r, const int32_t *prompt, uint32_t n_prompt, uint32_t max_tokens,
                    uint64_t partition, rtr_backend_t **dec, rtr_backend_t **pre)
{
    rtr_disagg_mode_t mode = (rtr_disagg_mode_t)r->cfg.disagg_mode;
    /* KV-aware: the decode that holds the conversation so far (less to
     * pull, or to prefill when local); the prefill that finishes first
     * counting what it has cached */
    uint32_t cached[RTR_MAX_BACKENDS];
    const uint32_t *kv = kv_lookup(r, partition, prompt, n_prompt, cached) ? cached : NULL;
    uint32_t room[RTR_MAX_BACKENDS];
    known_room(r, room);
    *dec = pick_decode(r, room, blocks_for(r, n_prompt, max_tokens), NULL, kv, n_prompt);
    uint64_t out[RTR_MAX_BACKENDS];
    known_outstanding(r, out);
    rtr_choice_t pc = { .what = RTR_CHOOSE_PREFILL, .caps = PROTO_CAP_PREFILL, .exclude = -1,
                        .cached_tokens = kv, .prompt_tokens = n_prompt, .outstanding = out };
    *pre = mode != RTR_DISAGG_NEVER ? rtr_choose_backend(r, &pc) : NULL;
    /* then whether to disaggregate: by what the chosen decode lacks */
    rtr_disagg_in_t in = { .prompt_tokens = n_prompt,
                           .pf_tok_ns = r->cost.pf_tok_ns, .dec_tok_ns = r->cost.dec_tok_ns,
                           .pull_tok_ns = r->cost.pull_tok_ns, .hop_ns = r->cost.hop_ns };
    if (*dec != NULL) {
        in.decode_cached = kv != NULL ? kv[*dec - r->be] : 0;
        in.decode_running = (*dec)->hb.running_seqs + (*dec)->assigned;
    }
    if (*pre != NULL) {
        in.prefill_cached = kv != NULL ? kv[*pre - r->be] : 0;
        in.prefill_outstanding = out[*pre - r->be];
    }
    rtr_disagg_why_t why;
    bool disagg = rtr_should_disaggregate(mode, &in, (uint32_t)r->cfg.disagg_threshold,
                                          *pre != NULL, &why);
    if (why.measured)
        pd_log(PD_LOG_DEBUG, RTR_COMP, NULL, "route: %u tokens, %u uncached on the decode: "
               "local %.2f ms, disaggregated %.2f ms", n_prompt, why.uncached,
               why.local_ns / 1e6, why.disagg_ns / 1e6);
    if (!disagg)
        *pre = NULL;
    if (kv != NULL) {
        kv_note_choice(r, *dec, kv, RTR_STAT_kv_route_decode_hits, !disagg);
        if (disagg)
            kv_note_choice(r, *pre, kv, RTR_STAT_kv_route_prefill_hits, true);
    }
    return disagg;
}

pd_status_t rtr_flow_new(rtr_t *r, const char *reqid, rtr_api_t api, rtr_oai_req_t *o,
                         int32_t **ids, uint32_t n_ids, rtr_req_t **q_p)
{
    *q_p = NULL;
    rtr_req_t *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return PD_ERR_NO_MEMORY;
    q->r = r;
    snprintf(q->id, sizeof(q->id), "%s", reqid);
    /* never the client's id on the control plane: a late reply to an
     * ended request must not reach a new one that reused its id */
    snprintf(q->wire_id, sizeof(q->wire_id), "w%08" PRIx64 "-%" PRIx64,
             r->incarnation & 0xffffffffu, ++r->next_wire);
    const rtr_fd_api_t *fd = rtr_fd_api(api);
    snprintf(q->resp_id, sizeof(q->resp_id), "%s%s",
             fd != NULL ? fd->resp_prefix : api == RTR_API_CHAT ? "chatcmpl-" : "cmpl-", reqid);
    q->t_accept_ns = pd_now_ns();
    /* not time(): glibc's reads the coarse clock, a tick behind a client's
     * gettimeofday at a second boundary */
    q->created = (int64_t)(pd_wall_ns() / PD_NS_PER_S);
    rtr_req_fsm_init(&q->fsm, q->t_accept_ns);
    if (!o->seed_set) /* a fresh seed per request, in the range "seed" accepts */
        o->seed = randombytes_uniform(1u << 31) * (1ull << 22) + randombytes_uniform(1u << 22);
    q->oai = *o;
    memset(o, 0, sizeof(*o));
    q->tool_scan = tool_scan_init(&q->oai);
    q->prompt = *ids;
    q->n_prompt = n_ids;
    *ids = NULL;
    if (rtr_textpipe_init(&q->pipe, r->tok, (const char *const *)q->oai.stop, q->oai.n_stop) !=
        PD_OK) {
        req_free(q);
        return PD_ERR_BAD_INPUT;
    }
    req_link(r, q);
    pd_stats_inc(r->stats, RTR_STAT_requests_accepted);
    pd_stats_gauge_add(r->stats, RTR_STAT_requests_inflight, 1);
    pd_stats_add(r->stats, RTR_STAT_prompt_tokens, n_ids);
    rtr_req_fsm_set(&q->fsm, RTR_REQ_ROUTED, pd_now_ns());
    *q_p = q;
    return PD_OK;
}

static void req_dispatch(rtr_req_t *q, rtr_backend_t *dec, rtr_backend_t *pre);
static pd_status_t choices_new(rtr_req_t *lead);

void rtr_flow_start(rtr_req_t *q, rtr_backend_t *dec, rtr_backend_t *pre)
{
    rtr_t *r = q->r;
    q->timer = event_new(r->base, -1, 0, on_req_timeout, q);
    if (q->timer != NULL) {
        struct timeval tv = pd_ns_to_timeval(r->cfg.request_timeout_ns);
        event_add(q->timer, &tv);
    }
    if (q->oai.n <= 1) {
        req_dispatch(q, dec, pre);
        return;
    }
    if (choices_new(q) != PD_OK) {
        req_fail(q, 500, "server_error", "out of memory");
        return;
    }
    /* choice 0 goes the usual way; the others ride on its DECODE_REQ */
    for (uint32_t i = 1; i < q->ch->n; i++)
        req_set_backend(&q->ch->c[i]->decode, dec);
    req_dispatch(q->ch->c[0], dec, pre);
}

/* PREFILL_REQ (disaggregated) or decode-local DECODE_REQ. */
static void req_dispatch(rtr_req_t *q, rtr_backend_t *dec, rtr_backend_t *pre)
{
    rtr_t *r = q->r;
    bool disagg = pre != NULL;
    pd_log(PD_LOG_DEBUG, RTR_COMP, q->id, "accepted %s: %u prompt tokens, max_tokens %u, %s%s%s",
           q->oai.api == RTR_API_COMPLETIONS ? "completion" : "chat", q->n_prompt, q->oai.max_tokens,
           disagg ? "prefill on " : "local", disagg ? pre->id : "", q->oai.stream ? " stream" : "");

    req_set_backend(&q->decode, dec);
    if (disagg) {
        req_set_backend(&q->prefill, pre);
        q->disagg = true;
        pd_stats_inc(r->stats, RTR_STAT_requests_disaggregated);
        if (!try_prefix_source(q))
            send_prefill_req(q, NULL, NULL);
        return;
    }
    pd_stats_inc(r->stats, RTR_STAT_requests_local);
    req_go_local(q, NULL, NULL, dec);
}

void rtr_flow_fail_all(rtr_t *r, const char *why)
{
    while (r->reqs != NULL) {
        rtr_req_t *q = r->reqs;
        cancel_upstream(q);
        req_fail(q, 503, "shutting_down", "%s", why);
    }
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
        if (q->export_from != NULL)
            cJSON_AddStringToObject(o, "exporting_from", q->export_from->id);
        cJSON_AddBoolToObject(o, "disaggregated", q->disagg);
        cJSON_AddBoolToObject(o, "stream", q->oai.stream);
        cJSON_AddNumberToObject(o, "prompt_tokens", q->n_prompt);
        cJSON_AddNumberToObject(o, "generated", q->n_gen);
        cJSON_AddNumberToObject(o, "retries", q->retries);
        cJSON_AddNumberToObject(o, "age_ms", (double)(now - q->t_accept_ns) / 1e6);
        cJSON *ph = cJSON_AddObjectToObject(o, "state_entered_ms");
        for (int s = 0; s < RTR_REQ__COUNT && ph != NULL; s++)
            if (q->fsm.enter_ns[s] != 0)
                cJSON_AddNumberToObject(ph, rtr_req_state_name((rtr_req_state_t)s),
                                        (double)(q->fsm.enter_ns[s] - q->t_accept_ns) / 1e6);
    }
    cJSON_AddNumberToObject(reply, "in_flight", r->n_reqs);
    return PD_OK;
}
