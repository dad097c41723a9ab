/* rtr_embed.h - POST /v1/embeddings: the body (every field honoured or
 * refused with its name, docs/API.md) and the answer. Pure: no I/O, no
 * logging. The router tokenizes string inputs (no chat template, BOS as
 * the model adds it, EOS when the GGUF says add_eos_token), sends one
 * EMBED_REQ per input to a prefill daemon (rtr_embed_job.c, the job) and
 * renders the vectors here. */
#ifndef RTR_EMBED_H
#define RTR_EMBED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pd_status.h"
#include "rtr_openai.h"

#define RTR_EMB_MAX_INPUTS 2048u /* inputs per request (OpenAI's) */

typedef struct {
    uint32_t max_inputs;         /* inputs per request (<= RTR_EMB_MAX_INPUTS) */
    uint32_t max_input_tokens;   /* tokens per token-array input (the context) */
    size_t max_input_bytes;      /* bytes per string input */
    uint32_t vocab_size;         /* token ids must be < vocab_size (0: unchecked) */
} rtr_emb_limits_t;

typedef struct {
    char *text;                  /* a string input (owned), or NULL */
    size_t text_len;
    int32_t *ids;                /* token ids: given, or the text tokenized (owned) */
    uint32_t n_ids;
} rtr_emb_input_t;

typedef struct {
    char model[RTR_OAI_MODEL_MAX];   /* "" when absent */
    uint32_t n_inputs;
    rtr_emb_input_t *inputs;     /* (n_inputs) */
    bool base64;                 /* encoding_format "base64" (else "float") */
    uint32_t dimensions;         /* 0: the model's */
} rtr_emb_req_t;

/* body -> *req. PD_OK, or PD_ERR_BAD_INPUT / PD_ERR_TOO_BIG with *err
 * (400 / 413, param named; *req released), or PD_ERR_NO_MEMORY. */
pd_status_t rtr_emb_parse(const char *body, size_t len, const rtr_emb_limits_t *lim,
                          rtr_emb_req_t *req, rtr_oai_error_t *err);
void rtr_emb_req_free(rtr_emb_req_t *req);

/* Input i tokenized (or given as ids) has n tokens: refused above the
 * context with the field named ("input" / "input[i]"). */
pd_status_t rtr_emb_check_len(const rtr_emb_req_t *req, uint32_t i, uint32_t n,
                              uint32_t max_tokens, rtr_oai_error_t *err);

/* The answer: vecs (n_inputs, n_embd), each L2-normalised. dimensions
 * (when set) truncates each to its first `dimensions` values and
 * renormalises; over n_embd it is refused (400, "dimensions"). Returns
 * malloc'd JSON, or NULL with *err (or out of memory: err->http_status
 * 500). */
char *rtr_emb_render(const rtr_emb_req_t *req, const float *vecs, uint32_t n_embd,
                     const char *model, uint64_t prompt_tokens, rtr_oai_error_t *err);

#endif
