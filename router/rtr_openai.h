/* rtr_openai.h - the OpenAI API surface of pd-router, as pure functions:
 * request bodies -> validated request structs (rtr_openai_parse.c), and
 * response/chunk/error bodies <- values (rtr_openai_render.c). No I/O, no
 * logging: the HTTP layer and the request flow call these.
 *
 * Parsing follows "parse -> validate -> act": every field a client controls
 * is type-checked and capped here, so later layers never see a bad value. */
#ifndef RTR_OPENAI_H
#define RTR_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "pd_status.h"

#define RTR_OAI_MAX_STOP        8      /* stop strings per request */
#define RTR_OAI_MAX_STOP_BYTES  256    /* bytes per stop string */
#define RTR_OAI_MODEL_MAX       256
#define RTR_OAI_MSG_NAME_MAX    256    /* bytes of a message's "name" */
#define RTR_OAI_MAX_BIAS        300    /* logit_bias entries (OpenAI's cap) */
#define RTR_OAI_MAX_STOP_IDS    32     /* stop_token_ids (= ENG_SAMPLE_MAX_STOP_IDS) */
#define RTR_OAI_MAX_TOP_LOGPROBS 20    /* top_logprobs / completions logprobs */
#define RTR_OAI_MAX_N           16     /* choices per request (n; = 1 + PROTO_MAX_FORK) */
#define RTR_OAI_MAX_TOOLS       64     /* tools per request */
#define RTR_OAI_MAX_CALLS       8      /* tool calls per message / per answer */
#define RTR_OAI_CACHE_SALT_MAX  256    /* bytes of cache_salt */

/* tool_choice */
#define RTR_OAI_TOOLS_NONE     0u   /* no call (also: no tools) */
#define RTR_OAI_TOOLS_AUTO     1u   /* the model may call: the output is scanned */
#define RTR_OAI_TOOLS_REQUIRED 2u   /* a call to one of the tools, constrained */
#define RTR_OAI_TOOLS_NAMED    3u   /* a call to tool_named, constrained */

#define RTR_OAI_GRAM_NONE        0u  /* = PROTO_GRAM_* = ENG_GRAM_* */
#define RTR_OAI_GRAM_JSON_OBJECT 1u
#define RTR_OAI_GRAM_JSON_SCHEMA 2u
#define RTR_OAI_GRAM_REGEX       3u  /* guided_regex, structured_outputs.regex */
#define RTR_OAI_GRAM_GBNF        4u  /* grammar, guided_grammar, guided_choice (as GBNF) */

typedef enum {
    RTR_API_COMPLETIONS = 0,  /* POST /v1/completions */
    RTR_API_CHAT        = 1,  /* POST /v1/chat/completions */
    RTR_API_MESSAGES    = 2,  /* POST /v1/messages (Anthropic; rtr_anthropic.c) */
    RTR_API_RESPONSES   = 3,  /* POST /v1/responses (rtr_responses.c) */
} rtr_api_t;
/* Messages and Responses are chat requests (messages, template, tools)
 * with their own bodies and events: rtr_fd.h. */

/* A tool call: in an assistant message of the request, or parsed from an
 * answer. All strings owned; name is [A-Za-z0-9_-]{1,64}, arguments
 * compact JSON text of an object. id may be NULL (parsed, not named yet). */
typedef struct {
    char *id;
    char *name;
    char *arguments;
} rtr_oai_call_t;

/* One tool of the request: its definition as the templates render it,
 * {"type":"function","function":{"name","description","parameters"}}, and
 * its parameters schema (both compact JSON, owned). */
typedef struct {
    char name[65];
    char *def;
    size_t def_len;
    char *params;
} rtr_oai_tool_t;

typedef struct {
    const char *role;          /* "system" | "user" | "assistant" | "tool" | "developer" */
    const char *content;       /* concatenated text parts (owned by the request); NULL
                                  for an assistant message with only tool calls */
    size_t content_len;
    char *name;                /* the message's "name" (owned; NULL when absent): a
                                  participant, or the tool a result comes from. Kept for
                                  templates that render names; none of the supported
                                  ones does (docs/API.md "Messages") */
    rtr_oai_call_t *calls;     /* assistant: its tool_calls (owned) */
    uint32_t n_calls;
} rtr_chat_msg_t;

/* Hard caps applied while parsing; the daemon fills them from its config. */
typedef struct {
    uint32_t max_tokens_cap;     /* largest max_tokens accepted */
    uint32_t default_max_tokens; /* when the client sends none */
    uint32_t n_cap;              /* largest n accepted (>= 1) */
    size_t   max_prompt_bytes;   /* total prompt / message text */
    uint32_t max_prompt_tokens;  /* when the prompt is given as token ids */
    uint32_t max_messages;
    uint32_t vocab_size;         /* token ids must be < vocab_size (0: unchecked) */
} rtr_oai_limits_t;

typedef struct {
    rtr_api_t api;
    char model[RTR_OAI_MODEL_MAX];   /* "" when absent */
    /* Completions: exactly one of prompt / prompt_tokens is set. */
    char *prompt;                    /* NUL-terminated, owned */
    size_t prompt_len;
    int32_t *prompt_tokens;          /* (n_prompt_tokens), owned */
    uint32_t n_prompt_tokens;
    /* Chat */
    rtr_chat_msg_t *messages;        /* (n_messages), owned */
    uint32_t n_messages;
    /* Sampling */
    uint32_t max_tokens;
    uint32_t min_tokens;
    float temperature;               /* 0 = greedy */
    float top_p;                     /* (0, 1] */
    int32_t top_k;                   /* <= 0: off */
    uint64_t seed;
    bool seed_set;
    char *stop[RTR_OAI_MAX_STOP];    /* owned */
    uint32_t n_stop;
    bool ignore_eos;
    uint32_t n;
    /* Penalties and biases (see docs/API.md for the exact semantics) */
    float presence_penalty;          /* [-2, 2], 0 = off (OpenAI) */
    float frequency_penalty;         /* [-2, 2], 0 = off (OpenAI) */
    float repetition_penalty;        /* (0, 2], 1 = off (vLLM) */
    float min_p;                     /* [0, 1], 0 = off (vLLM) */
    uint32_t n_bias;
    int32_t bias_ids[RTR_OAI_MAX_BIAS];   /* logit_bias keys (token ids < vocab) */
    float bias[RTR_OAI_MAX_BIAS];         /* [-100, 100] */
    uint32_t n_stop_ids;
    int32_t stop_ids[RTR_OAI_MAX_STOP_IDS]; /* stop_token_ids */
    /* logprobs: chat logprobs/top_logprobs, completions logprobs = N */
    bool logprobs;
    uint32_t top_logprobs;           /* alternatives per token, <= 20 */
    /* Structured output (response_format, grammar, guided_*, structured_outputs):
     * RTR_OAI_GRAM_*; for JSON_SCHEMA / REGEX / GBNF the text (owned),
     * compiled once to check it. */
    uint32_t gram_kind;
    char *gram_schema;
    size_t gram_schema_len;
    /* Tools (chat): definitions and tool_choice (RTR_OAI_TOOLS_*); for
     * NAMED the index of the tool. tool_fmt: the chat template's call
     * format (eng_chat_tools_fmt_t), set by the HTTP layer. */
    rtr_oai_tool_t *tools;           /* (n_tools), owned */
    uint32_t n_tools;
    uint32_t tool_choice;
    uint32_t tool_named;
    uint32_t tool_fmt;
    bool single_call;                /* parallel_tool_calls: false */
    bool instructions_first;         /* Responses: messages[0] is `instructions` (echoed) */
    /* Streaming */
    bool stream;
    bool include_usage;
    /* Prefix-cache isolation (vLLM's cache_salt): requests share cached
     * KV only with requests of the same API key and the same salt. The
     * HTTP layer turns (key, salt) into cache_partition (rtr_cache_partition). */
    char cache_salt[RTR_OAI_CACHE_SALT_MAX + 1]; /* "" when absent */
    bool cache_salt_set;
    uint64_t cache_partition;        /* 0 = the shared partition */
    /* POST /v1/messages/count_tokens: tokenize, answer the count, no generation */
    bool count_only;
} rtr_oai_req_t;

/* An error the client can read: HTTP status + OpenAI error envelope. */
typedef struct {
    int http_status;       /* 400, 401, 404, 413, 429, 500, 502, 503, 504 */
    const char *type;      /* "invalid_request_error", ... */
    const char *code;      /* e.g. "context_length_exceeded" or NULL */
    const char *param;     /* offending parameter or NULL (may point at param_buf) */
    char message[320];
    char param_buf[64];    /* room for a built name such as "messages[3].content" */
} rtr_oai_error_t;

/* Parse and validate a request body. On success fills *req (free with
 * rtr_oai_req_free) and returns PD_OK. On a client error returns
 * PD_ERR_BAD_INPUT (or PD_ERR_TOO_BIG) and fills *err (400/413); *req is
 * then already released. PD_ERR_NO_MEMORY is the only other status. */
pd_status_t rtr_oai_parse(rtr_api_t api, const char *body, size_t len,
                          const rtr_oai_limits_t *limits, rtr_oai_req_t *req,
                          rtr_oai_error_t *err);
void rtr_oai_req_free(rtr_oai_req_t *req);

/* The first step of every body parser (all four APIs): one JSON object
 * and nothing after it, no key twice in one object (a proxy may take the
 * last where cJSON takes the first). PD_OK with *root_p (cJSON_Delete it);
 * PD_ERR_BAD_INPUT / PD_ERR_NO_MEMORY with *err filled. */
struct cJSON;
pd_status_t rtr_oai_json_load(const char *body, size_t len, struct cJSON **root_p,
                              rtr_oai_error_t *err);
/* The raw text of the top-level member `key` of the JSON object in
 * body[0..len) (already loaded: well-formed) when it is a number (*n_p
 * bytes; "seed" is read from its text, exact beyond 2^53), or NULL. */
const char *rtr_oai_raw_member(const char *body, size_t len, const char *key, size_t *n_p);
/* Generated text as a JSON string item, NUL and control bytes escaped
 * (cJSON strings end at NUL; a byte token can be 0). NULL: no memory. */
struct cJSON *rtr_oai_text_item(const char *text, size_t len);

/* Fill an error (printf-style message). Returns err for chaining. */
rtr_oai_error_t *rtr_oai_error_set(rtr_oai_error_t *err, int http_status,
                                   const char *type, const char *code,
                                   const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Response bodies. All return malloc'd NUL-terminated JSON (NULL on OOM).
 * The completion bodies below (chunks, usage chunk, whole responses) are
 * one writer's output (rtr_openai_render.c write_body); each function
 * names one variant and its arguments. */
char *rtr_oai_error_json(const rtr_oai_error_t *err);

typedef struct {
    const char *id;        /* "cmpl-..." / "chatcmpl-..." */
    const char *model;
    int64_t created;       /* unix seconds */
    rtr_api_t api;
} rtr_oai_resp_meta_t;

typedef struct {
    uint32_t prompt_tokens;
    uint32_t completion_tokens;
    uint32_t cached_tokens;  /* of prompt_tokens, KV from a prefix cache:
                                usage.prompt_tokens_details.cached_tokens */
} rtr_oai_usage_t;

/* Log-probabilities of generated tokens (the model's distribution). */
typedef struct {
    int32_t id;
    float logprob;
    uint32_t n_top;
    int32_t top_ids[RTR_OAI_MAX_TOP_LOGPROBS];   /* most likely first */
    float top_lp[RTR_OAI_MAX_TOP_LOGPROBS];
} rtr_oai_logprob_t;

/* The bytes token `id` stands for (at most cap written; returns the count). */
typedef size_t (*rtr_oai_piece_fn)(void *ctx, int32_t id, char *buf, size_t cap);

typedef struct {
    const rtr_oai_logprob_t *v;      /* (n) */
    uint32_t n;
    uint64_t text_offset;            /* completions: characters before v[0] */
    rtr_oai_piece_fn piece;
    void *ctx;
} rtr_oai_logprobs_t;

/* Characters (UTF-8 code points; an invalid byte counts as one) that the
 * pieces of lp's tokens add: advance text_offset by this per chunk. */
uint64_t rtr_oai_logprobs_chars(const rtr_oai_logprobs_t *lp);

/* One streaming chunk (the JSON after "data: "). `text` may be empty;
 * finish_reason NULL while streaming, "stop"/"length" on the last one;
 * with_role adds delta.role (the first chat chunk). */
char *rtr_oai_chunk_json(const rtr_oai_resp_meta_t *meta, uint32_t index,
                         const char *text, size_t text_len,
                         const char *finish_reason, bool with_role);
/* The same with logprobs for the chunk's tokens (lp NULL: "logprobs": null).
 * Chat: {"content":[{token, logprob, bytes, top_logprobs:[...]}],
 * "refusal":null}; completions: {tokens, token_logprobs, top_logprobs
 * (top n + the chosen token), text_offset}. */
char *rtr_oai_chunk_lp_json(const rtr_oai_resp_meta_t *meta, uint32_t index,
                            const char *text, size_t text_len, const char *finish_reason,
                            bool with_role, const rtr_oai_logprobs_t *lp);
/* The include_usage chunk: choices [] and usage. */
char *rtr_oai_usage_chunk_json(const rtr_oai_resp_meta_t *meta,
                               const rtr_oai_usage_t *usage);
/* A whole non-streaming response with one choice per text. */
char *rtr_oai_response_json(const rtr_oai_resp_meta_t *meta, uint32_t n_choices,
                            const char *const *texts, const size_t *text_lens,
                            const char *const *finish_reasons,
                            const rtr_oai_usage_t *usage);
/* The same with logprobs per choice (lps (n_choices), or NULL). */
char *rtr_oai_response_lp_json(const rtr_oai_resp_meta_t *meta, uint32_t n_choices,
                               const char *const *texts, const size_t *text_lens,
                               const char *const *finish_reasons,
                               const rtr_oai_usage_t *usage, const rtr_oai_logprobs_t *lps);
/* A choice's tool calls (n 0: none). */
typedef struct {
    const rtr_oai_call_t *v;
    uint32_t n;
} rtr_oai_calls_t;
/* With calls (NULL, or one per choice): a choice with calls has
 * message.tool_calls and content null when it has no text. */
char *rtr_oai_response_full_json(const rtr_oai_resp_meta_t *meta, uint32_t n_choices,
                                 const char *const *texts, const size_t *text_lens,
                                 const char *const *finish_reasons,
                                 const rtr_oai_usage_t *usage, const rtr_oai_logprobs_t *lps,
                                 const rtr_oai_calls_t *calls);
/* A stream chunk whose delta carries a choice's whole tool calls. */
char *rtr_oai_tool_chunk_json(const rtr_oai_resp_meta_t *meta, uint32_t index,
                              const rtr_oai_calls_t *calls);
/* GET /v1/models body. */
char *rtr_oai_models_json(const char *const *model_ids, uint32_t n, int64_t created,
                          const char *owned_by);
/* GET /v1/models/{id} (id as it is in the path, %-escapes decoded here):
 * the model object of a served id, or NULL with *err filled (404
 * model_not_found; 500 when out of memory). */
char *rtr_oai_model_get_json(const char *id_enc, const char *const *model_ids, uint32_t n,
                             int64_t created, const char *owned_by, rtr_oai_error_t *err);

#endif
