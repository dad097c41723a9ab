/* ll_testmodel.h - tiny seeded GGUF models for the llama engine tests, and
 * an independent reference forward pass (plain loops, f64 accumulation,
 * full recompute, no KV paging) to check the engine against. */
#ifndef LL_TESTMODEL_H
#define LL_TESTMODEL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const char *arch;          /* "llama" | "qwen2" | "qwen3" | "qwen3moe" | "gemma3" */
    uint32_t n_embd, n_layers, n_heads, n_kv_heads, n_ff, vocab, ctx;
    uint32_t rope_dim;         /* 0 = head_dim */
    uint32_t wtype;            /* ggml type of the 2-D weights */
    bool tied;                 /* no output.weight */
    bool bias;                 /* Q/K/V biases (qwen2 style) */
    uint64_t seed;
    const char *omit;          /* tensor name to leave out (tests of bad files) */
    bool rope_freqs;           /* add a rope_freqs.weight (Llama 3.1 style) */
    float rope_linear;         /* > 0: rope.scaling.type "linear" with this factor */
    uint32_t wtype_alt;        /* != 0: attn_v, ffn_down and output use this type
                                * (a llama-quantize style mix, e.g. Q4_K + Q6_K) */
    uint32_t head_dim;         /* 0 = n_embd / n_heads (else key/value_length) */
    uint32_t n_expert, n_expert_used, n_ff_exp; /* qwen3moe */
    uint32_t swa;              /* gemma3 sliding window (0 = none) */
} ll_tm_spec_t;

/* Write the model to path. Returns 0 on success. */
int ll_tm_write(const ll_tm_spec_t *spec, const char *path);

/* true: every matrix-vector product whose weight type pdserve dots in
 * integers (engine/llama/ggml_qdot.h: Q8_0, Q4_0, Q4_K, Q6_K, rows of whole
 * blocks) first rounds its input as pdserve's activation quantizer does, so
 * the reference is the exact function of the quantized-activation model.
 * false (default): the exact dequantized model. */
extern bool ll_ref_qact;

/* Reference forward over toks[0..n) with the model at path; writes the
 * logits of the last position to logits (vocab). kv_f16 rounds K and V to
 * f16 as the engine's f16 cache does. Returns 0 on success. */
int ll_ref_logits(const char *path, const int32_t *toks, uint32_t n, bool kv_f16,
                  double *logits /* (vocab) */);

#endif
