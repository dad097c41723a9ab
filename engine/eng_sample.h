/* eng_sample.h - token sampling and token-level stop conditions.
 *
 * A sampler is a small value (no heap): parameters + a per-sequence PRNG
 * state + the count of generated tokens. Its state packs into
 * ENG_SAMPLER_STATE_BYTES little-endian bytes, so a prefill daemon can
 * sample the first token and hand the stream to a decode daemon, which
 * continues EXACTLY where prefill stopped (same seed => same tokens as the
 * single-process path).
 *
 * Order of operations for one token (all deterministic):
 *   1. logit_bias: logit[id] += bias (OpenAI);
 *   2. while n_generated < min_tokens: EOS ids and stop ids get -inf;
 *   3. penalties over the history (eng_sample_hist_t), vLLM's order and
 *      semantics, each token id once:
 *        repetition (id in prompt or generated): logit > 0 ? logit / r
 *                                                        : logit * r;
 *        then logit -= frequency * count + presence * (count > 0), where
 *        count = occurrences of id among the GENERATED tokens (OpenAI);
 *   4. temperature <= 0: argmax (lowest id on ties), no PRNG draw;
 *      top_k == 1: argmax too, but still one (discarded) draw;
 *   5. otherwise logits / temperature -> softmax (double), keep the top_k
 *      most likely (ties: lower id first), renormalize, keep the smallest
 *      prefix whose mass >= top_p, then drop the tokens whose probability
 *      is below min_p * (the most likely one's), draw one uniform double
 *      from the PRNG (xoshiro256**, seeded by splitmix64(seed)) and walk
 *      the kept tokens.
 * Penalties need no sampler state beyond the history itself: a decode that
 * holds prompt + generated tokens recomputes them exactly, which is what
 * makes a P->D hand-off or a retry continue as the colocated run would.
 *
 * Stop STRINGS are matched on detokenized text by engine/tok's eng_stop_t
 * (eng_stop_init / eng_stop_feed / eng_stop_flush, fed from the streaming
 * detokenizer eng_detok_feed); the caller then ends the sequence with
 * finish reason ENG_FINISH_STOP. Token-level stops live here.
 */
#ifndef ENG_SAMPLE_H
#define ENG_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "pd_status.h"

#define ENG_SAMPLE_MAX_EOS 8
#define ENG_SAMPLE_MAX_STOP_IDS 32
#define ENG_SAMPLE_MAX_BIAS 300
#define ENG_SAMPLER_STATE_BYTES 40

typedef struct {
    int32_t id;                /* token id (ids >= vocab are ignored) */
    float bias;                /* added to the logit, [-100, 100] */
} eng_logit_bias_t;

typedef struct {
    float temperature;         /* <= 0: greedy */
    uint32_t top_k;            /* 0: off */
    float top_p;               /* <= 0 or >= 1: off */
    uint64_t seed;
    uint32_t max_tokens;       /* 0: no limit here (context length still applies) */
    uint32_t min_tokens;       /* EOS/stop ids are masked until this many */
    bool ignore_eos;           /* EOS does not finish (and is not masked) */
    uint32_t n_eos;
    int32_t eos_ids[ENG_SAMPLE_MAX_EOS];          /* end-of-generation ids */
    uint32_t n_stop_ids;
    int32_t stop_ids[ENG_SAMPLE_MAX_STOP_IDS];    /* extra stop token ids */
    float presence_penalty;    /* [-2, 2], 0: off */
    float frequency_penalty;   /* [-2, 2], 0: off */
    float repetition_penalty;  /* (0, 2]; 1 (or 0, as zeroed params have): off */
    float min_p;               /* [0, 1], 0: off */
    uint32_t n_bias;
    eng_logit_bias_t bias[ENG_SAMPLE_MAX_BIAS];   /* logit_bias, distinct ids */
} eng_sample_params_t;

/* The tokens a sequence has seen, for the penalties: its prompt and what it
 * generated so far (the token being sampled excluded). Views, not owned. */
typedef struct {
    const int32_t *prompt;     /* (n_prompt) */
    uint32_t n_prompt;
    const int32_t *gen;        /* (n_gen) */
    uint32_t n_gen;
} eng_sample_hist_t;

typedef struct {
    uint64_t s[4];             /* xoshiro256** state */
} eng_rng_t;

typedef enum {
    ENG_FINISH_NONE = 0,       /* keep going */
    ENG_FINISH_STOP = 1,       /* EOS, a stop id or a stop string */
    ENG_FINISH_LENGTH = 2,     /* max_tokens reached */
} eng_finish_t;

typedef struct {
    eng_sample_params_t p;
    eng_rng_t rng;
    uint32_t n_generated;      /* tokens accepted so far */
} eng_sampler_t;

/* Scratch for one sampling thread: (vocab) candidate arrays. */
typedef struct {
    uint32_t cap;
    uint32_t *idx;             /* (cap) */
    double *prob;              /* (cap) */
    uint32_t *cnt;             /* (cap) penalty counts; all zero between calls */
    float *raw;                /* (cap) raw logits kept for eng_sample_next_lp */
} eng_sample_scratch_t;

/* Default parameters: greedy, no limits. */
void eng_sample_params_default(eng_sample_params_t *p);
/* Validate ranges (temperature finite, >= 0; top_p, min_p in [0,1];
 * presence/frequency in [-2, 2]; repetition in [0, 2]; biases finite in
 * [-100, 100] on ids >= 0; counts within caps; min_tokens <= max_tokens when
 * both set). PD_ERR_BAD_INPUT. */
pd_status_t eng_sample_params_check(const eng_sample_params_t *p);

/* Seed the PRNG with splitmix64(seed) and reset the count. */
void eng_sampler_init(eng_sampler_t *s, const eng_sample_params_t *p);

/* Expected: PD_ERR_NO_MEMORY. */
pd_status_t eng_sample_scratch_create(eng_sample_scratch_t *scr, uint32_t vocab);
void eng_sample_scratch_destroy(eng_sample_scratch_t *scr); /* accepts zeroed */

/* Pick the next token from logits (vocab; modified in place: bias, masking,
 * penalties). hist: the sequence's tokens so far, for the penalties (NULL =
 * none seen). PRNG contract: a call with temperature > 0 consumes EXACTLY
 * ONE draw (eng_rng_next), whatever top_k/top_p/min_p; temperature <= 0
 * consumes none. So a sampler can be fast-forwarded over tokens chosen
 * elsewhere with eng_sampler_replay. Does NOT count the token: call
 * eng_sampler_accept. Returns the token id (never fails when vocab <=
 * scr->cap; returns -1 if vocab == 0 or exceeds scr->cap). */
int32_t eng_sample_next(eng_sampler_t *s, float *logits /* (vocab) */, uint32_t vocab,
                        eng_sample_scratch_t *scr, const eng_sample_hist_t *hist);

/* The distribution eng_sample_next draws from, normalized, into probs
 * (vocab; 0 for every token it cannot pick; one-hot on the argmax when
 * greedy). Adjusts logits in place like eng_sample_next; draws nothing.
 * Returns false if vocab == 0 or exceeds scr->cap. */
bool eng_sample_probs(const eng_sampler_t *s, float *logits /* (vocab) */, uint32_t vocab,
                      eng_sample_scratch_t *scr, const eng_sample_hist_t *hist,
                      double *probs /* (vocab) */);

/* Log-probabilities of one step under the MODEL's distribution: the
 * log-softmax of the raw logits, before bias, penalties, temperature and
 * truncation (what vLLM reports by default). */
#define ENG_SAMPLE_MAX_TOP_LOGPROBS 20
typedef struct {
    float logprob;                                  /* of the chosen token */
    uint32_t n_top;                                 /* <= ENG_SAMPLE_MAX_TOP_LOGPROBS */
    int32_t top_ids[ENG_SAMPLE_MAX_TOP_LOGPROBS];   /* most likely first, lower id on ties */
    float top_lp[ENG_SAMPLE_MAX_TOP_LOGPROBS];
} eng_logprobs_t;

/* Fill *out for `chosen` from raw logits (vocab, not modified; copy them
 * before eng_sample_next adjusts them in place) with the n_top most likely
 * tokens (n_top capped at ENG_SAMPLE_MAX_TOP_LOGPROBS and vocab). */
void eng_sample_logprobs(const float *raw /* (vocab) */, uint32_t vocab, int32_t chosen,
                         uint32_t n_top, eng_logprobs_t *out);

/* eng_sample_next, and when lp is not NULL also the chosen token's
 * log-probabilities (eng_sample_logprobs on the logits as they came in, with
 * n_top alternatives). Same PRNG contract. */
int32_t eng_sample_next_lp(eng_sampler_t *s, float *logits /* (vocab) */, uint32_t vocab,
                           eng_sample_scratch_t *scr, const eng_sample_hist_t *hist,
                           uint32_t n_top, eng_logprobs_t *lp);

/* Steps 1-3 above (bias, min_tokens masking, penalties) on logits in place,
 * without sampling: the logits eng_sample_next samples from (exposed for
 * tests and for logprobs). */
void eng_sample_adjust(const eng_sampler_t *s, float *logits /* (vocab) */, uint32_t vocab,
                       eng_sample_scratch_t *scr, const eng_sample_hist_t *hist);

/* Count `token` as generated and say whether the sequence ends with it:
 * ENG_FINISH_STOP for an EOS id (unless ignore_eos) or a stop id,
 * ENG_FINISH_LENGTH when max_tokens is reached, else ENG_FINISH_NONE. */
eng_finish_t eng_sampler_accept(eng_sampler_t *s, int32_t token);

/* Account for a token another process sampled with the same parameters
 * (e.g. prefill's first token): advance the PRNG exactly as
 * eng_sample_next did, then eng_sampler_accept. Replaying the generated
 * tokens of a request reproduces the state the sampler had. */
eng_finish_t eng_sampler_replay(eng_sampler_t *s, int32_t token);

/* "stop" | "length" | NULL for NONE (OpenAI finish_reason). */
const char *eng_finish_name(eng_finish_t f);

/* PRNG draws (exposed for tests). */
uint64_t eng_rng_next(eng_rng_t *r);
double eng_rng_uniform(eng_rng_t *r); /* [0, 1), 53 random bits */

/* Pack/unpack the mutable state (rng + n_generated) as 40 LE bytes. The
 * parameters travel separately (they come from the request). */
void eng_sampler_state_pack(const eng_sampler_t *s, uint8_t out[ENG_SAMPLER_STATE_BYTES]);
void eng_sampler_state_unpack(eng_sampler_t *s, const uint8_t in[ENG_SAMPLER_STATE_BYTES]);

#endif
