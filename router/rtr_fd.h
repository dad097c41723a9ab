/* rtr_fd.h - the front doors whose answers are events rather than chat
 * chunks: Anthropic's Messages API (rtr_anthropic.c, POST /v1/messages and
 * /v1/messages/count_tokens) and OpenAI's Responses API (rtr_responses.c,
 * POST /v1/responses). Each is a parser and a renderer only: its body is
 * checked field by field (every field honoured or refused with its name,
 * docs/API.md) and turned into a chat body that rtr_oai_parse reads into
 * the one request struct, rtr_oai_req_t (api = RTR_API_MESSAGES /
 * RTR_API_RESPONSES); the request then lives the chat request's life
 * (rtr_flow.c: routing, failover, migration, prefix cache, tools, grammar)
 * and the flow renders its events through the table below. Pure: no I/O,
 * no logging. */
#ifndef RTR_FD_H
#define RTR_FD_H

#include "pd_sbuf.h"
#include "rtr_openai.h"

/* What the flow knows of an answer when it renders one. */
typedef struct {
    const rtr_oai_resp_meta_t *meta;
    const rtr_oai_req_t *req;
    const char *text;              /* body: the whole answer (streams: unused) */
    size_t text_len;
    const char *finish;            /* "stop" | "length" | "tool_calls"; NULL while streaming */
    const char *stop_seq;          /* the stop string that ended it, or NULL */
    rtr_oai_calls_t calls;
    rtr_oai_usage_t usage;         /* completion_tokens: so far */
} rtr_fd_answer_t;

/* One stream's state (zeroed with the request; rtr_fd_stream_free). */
typedef struct {
    uint32_t seq;                  /* Responses: the next event's sequence_number */
    uint32_t n_items;              /* content blocks / output items closed so far */
    bool text_open;                /* a text block / message item is open */
    char *text;                    /* Responses: the text streamed (its .done events repeat it) */
    size_t text_len, text_cap;
} rtr_fd_stream_t;

void rtr_fd_stream_free(rtr_fd_stream_t *st);

/* One front door. Renderers return malloc'd bytes, NULL when out of
 * memory: streams one or more whole SSE events ("event: T\ndata: J\n\n"),
 * bodies JSON. */
typedef struct {
    const char *endpoint;          /* "/v1/messages": access log */
    const char *resp_prefix;       /* the answer's id: prefix + request id */
    const char *prompt_param;      /* the field a too-long prompt is blamed on */
    /* body -> *req (rtr_oai_parse's contract); count_only: count_tokens */
    pd_status_t (*parse)(const char *body, size_t len, const rtr_oai_limits_t *lim,
                         bool count_only, rtr_oai_req_t *req, rtr_oai_error_t *err);
    char *(*stream_head)(rtr_fd_stream_t *st, const rtr_fd_answer_t *a);
    char *(*stream_text)(rtr_fd_stream_t *st, const rtr_fd_answer_t *a, const char *text,
                         size_t len);
    char *(*stream_end)(rtr_fd_stream_t *st, const rtr_fd_answer_t *a);
    char *(*stream_error)(rtr_fd_stream_t *st, const rtr_fd_answer_t *a,
                          const rtr_oai_error_t *err);
    char *(*body)(const rtr_fd_answer_t *a);
    char *(*error_body)(const rtr_oai_error_t *err);
} rtr_fd_api_t;

extern const rtr_fd_api_t rtr_anth_api;   /* rtr_anthropic.c */
extern const rtr_fd_api_t rtr_resp_api;   /* rtr_responses.c */

/* The front door of api, or NULL (completions, chat: rtr_openai.h). */
const rtr_fd_api_t *rtr_fd_api(rtr_api_t api);

/* ---- shared by rtr_anthropic.c and rtr_responses.c ------------------------ */
struct cJSON;

/* Events into a growing buffer: common's string builder (a failed
 * allocation sticks: take -> NULL). */
typedef pd_sbuf_t rtr_fd_buf_t;
/* A front door's parse context: the error to fill and a sticky
 * out-of-memory; the helpers return false so a parse can `ok = ok && ...`. */
typedef struct {
    rtr_oai_error_t *err;
    bool oom;
} rtr_fd_ctx_t;
bool rtr_fd_pbad(rtr_fd_ctx_t *c, const char *param, const char *detail); /* "'param' detail" */
bool rtr_fd_punsup(rtr_fd_ctx_t *c, const char *param, const char *why);  /* unsupported_parameter */
bool rtr_fd_pnomem(rtr_fd_ctx_t *c);
bool rtr_fd_ptext(rtr_fd_ctx_t *c, rtr_fd_buf_t *b, const char *s);      /* append s */
/* {"role": role} appended to the chat messages array; NULL on ENOMEM. */
struct cJSON *rtr_fd_chat_msg(struct cJSON *msgs, const char *role);
/* "event: type\ndata: <data printed>\n\n"; data is consumed. */
void rtr_fd_event(rtr_fd_buf_t *b, const char *type, struct cJSON *data);
char *rtr_fd_buf_take(rtr_fd_buf_t *b);
/* Print and delete. */
char *rtr_fd_print(struct cJSON *o);
/* Keep the streamed text (Responses). */
void rtr_fd_text_keep(rtr_fd_stream_t *st, const char *text, size_t len);

/* A 400 naming param (copied into err->param_buf), printf message. Returns false. */
bool rtr_fd_bad(rtr_oai_error_t *err, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Every key of obj is in keys (NULL-terminated), else a 400 naming
 * "<where>.<key>" (where "" at the top level) as unknown_parameter. */
bool rtr_fd_keys(rtr_oai_error_t *err, const struct cJSON *obj, const char *const *keys,
                 const char *where);
/* The translated chat body -> *req through rtr_oai_parse, then req->api =
 * api. chat is consumed; seed_raw: the body's seed text (exact), or NULL.
 * renames: pairs {chat name, this API's name}, NULL-terminated: applied to
 * the error's param and message (an error the chat parser finds is told in
 * this API's words). */
pd_status_t rtr_fd_parse_chat(struct cJSON *chat, rtr_api_t api, const char *seed_raw,
                              size_t seed_len, const rtr_oai_limits_t *lim,
                              const char *const *renames, rtr_oai_req_t *req,
                              rtr_oai_error_t *err);
/* A call's arguments (compact JSON text of an object; a cut forced call's
 * prefix of one) as an object: {} when it does not parse. */
struct cJSON *rtr_fd_args_object(const char *arguments);

#endif
