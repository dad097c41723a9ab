/* eng_llama.h - the "llama" engine: CPU inference for GGUF models of arch
 * `llama` (Llama 2/3, TinyLlama, SmolLM, Mistral), `qwen2`, `qwen3`,
 * `qwen3moe` and `gemma3`.
 *
 * Use it through eng_find("llama") (eng.h). This header adds the ops table
 * symbol and a read-only description of a loaded model for tools
 * (pd-run, pd-eng-bench). */
#ifndef ENG_LLAMA_H
#define ENG_LLAMA_H

#include "eng.h"

extern const eng_ops_t eng_llama_ops;

typedef struct {
    const char *arch;              /* "llama" | "qwen2" | "qwen3" | "qwen3moe" | "gemma3" */
    uint32_t n_embd, n_layers, n_heads, n_kv_heads, head_dim, n_ff, vocab;
    uint32_t rope_dim;
    float rope_base, rms_eps;
    uint32_t weight_type;          /* ggml type of blk.0.attn_q.weight */
    uint64_t n_params;             /* all tensor elements */
    uint64_t weight_bytes_per_token; /* bytes a decode step streams per
                                        token at batch 1: every matrix but
                                        the embedding table (one row) */
    uint32_t n_threads;
    const char *isa;               /* "avx512" | "avx2" | "scalar" */
    /* expert parallelism (issue 36) */
    uint32_t ep_rank, ep_size;     /* 0, 1: the whole model */
    uint64_t expert_bytes_owned;   /* routed-expert weight bytes this rank
                                      binds (and may read): total / ep_size */
    uint64_t expert_bytes_total;   /* every routed expert's, in the file */
    size_t ep_cap[2];              /* bytes one EP message may need, per
                                      eng_ep_phase_t (0: not MoE) */
    uint32_t step_rows;            /* rows of one forward pass of `step` /
                                      `decode` (an EP rank's passes per step:
                                      ceil(rows / step_rows)) */
} eng_llama_info_t;

/* Describe a model loaded by eng_llama_ops.load. */
void eng_llama_info(const eng_model_t *model, eng_llama_info_t *info_p);

/* An EP rank's compat hash (issue 36). The whole model's hash folds in one
 * digest per (routed-expert tensor, expert); a rank reads only its experts,
 * so its hash is its slice's until the group pools its digests:
 * eng_llama_ep_digests gives this rank's (tensor-major, its experts in
 * order; the count; 0 / NULL for the whole model), and
 * eng_llama_ep_group_hash takes every rank's in rank order (n_all = count
 * x ep_size) and sets the geometry's compat_hash to the whole model's.
 * Before the model serves. Expected: PD_ERR_BAD_INPUT (not an EP rank, a
 * wrong count), PD_ERR_MISMATCH (this rank's own digests stated otherwise),
 * PD_ERR_NO_MEMORY. */
size_t eng_llama_ep_digests(const eng_model_t *model, const uint64_t **dig_p);
pd_status_t eng_llama_ep_group_hash(eng_model_t *model, const uint64_t *all, size_t n_all);

#endif
