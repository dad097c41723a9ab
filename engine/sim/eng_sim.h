/* eng_sim.h - the "sim" engine: real KV geometries, modeled compute time.
 *
 * For transfer benchmarks and P:D capacity planning at real sizes on one box.
 * eng_ops_t semantics are those of the llama engine (chunked prefill = one
 * shot, batch-invariant, prefix reuse), but:
 *   - KV content is a deterministic function of (token, position, layer, K/V),
 *     written into the caller's blocks at the real bytes per token, so
 *     transfers move real bytes;
 *   - the logits of a position depend on an XXH3 checksum of ALL the KV the
 *     step reads (positions [0, pos] through the block table), so a lost,
 *     stale or corrupted block changes the next token;
 *   - compute time is modeled: prefill n tokens = n / prefill_tps seconds,
 *     a decode step of batch b = (a + b_coef * b) ms; the compute thread
 *     sleeps the modeled time / speedup minus the real time spent.
 * The model's text is meaningless: only printable-ASCII byte tokens and EOS
 * (id 258) ever get a non-zero probability, so the tokenizer to use with
 * this engine is the built-in byte tokenizer: eng_tok_create_byte(vocab_size)
 * or, where the geometry is not at hand (pd-router),
 * eng_tok_create_byte(ENG_TOK_BYTE_VOCAB_MIN).
 *
 * model_path selects a preset and/or overrides, comma-separated, optional
 * "sim:" prefix:  "llama3-8b"  "sim:llama3-70b,speedup=100"
 *   "sim:layers=32,kv_heads=8,head_dim=128,vocab=32000,prefill_tps=8000,decode_ms=20+0.5*b"
 * Keys: layers kv_heads head_dim vocab ctx prefill_tps decode_ms speedup no_sleep
 * kv_check=full|sample, and the MoE layout experts top embd first_dense
 * overlap (expert parallelism below). full (default) checksums every KV byte a step reads
 * (its cost: docs/BENCHMARKS.md "pd-sim-bench: can the sim engine honour
 * its own timing model?"); sample checksums 128 B per (block, layer, K/V) — lost or stale blocks still
 * change the output, a single corrupted byte may not — for capacity runs
 * where the modeled step time must be honoured.
 *
 * Expert parallelism (eng.h, issue 36): a model with experts > 0 loaded with
 * ep_size > 1 (dividing experts) is rank ep_rank of a group; after set_ep,
 * every forward pass (prefill in slices of max_batch tokens, decode) runs,
 * per MoE layer, a dispatch and a combine exchange of eng.h's format with
 * the real byte volumes of its tokens' routing: top-k distinct experts per
 * (token, position, layer) from a hash. The modeled time is split evenly
 * over the layers; a MoE layer's slice is half before dispatch (attention,
 * router), half between dispatch and combine (its experts). Rows carry an
 * 8-byte tag (the rest of a row is not written: the volume is real, the
 * content is not); an expert answers tag ^ f(expert) and the token's rank
 * checks every answer (PD_ERR_MISMATCH otherwise). The logits still depend
 * on the KV only, so they are bitwise the same at any ep_size. `step` (the
 * fused chunk + batch an EP decode round runs) exists for EP models only:
 * rows in passes of max_batch (a node pads the group with ep_idle to the
 * busiest rank's ceil(rows / max_batch) passes); a model without EP returns
 * PD_ERR_UNSUPPORTED and callers run prefill then decode as before.
 * overlap=1 runs each pass as two micro-batches (the first ceil(n/2) rows,
 * the rest) whose exchanges go through the transport's post and wait:
 * micro-batch 0's dispatch flies while 1 computes, each combine while the
 * other runs its experts or its next layer (ep_pass_two in eng_sim.c).
 * Each micro-batch pays decode_ms's fixed part (the weights read again):
 * the split wins only where it hides more exchange than that.
 */
#ifndef ENG_SIM_H
#define ENG_SIM_H

#include <stdbool.h>
#include <stdint.h>
#include "eng.h"

/* X(id, name, layers, kv_heads, head_dim, vocab, ctx, prefill_tps, dec_a_ms, dec_b_ms,
 *   experts, top, embd, first_dense)
 * DeepSeek-V3's MLA caches one 576-wide latent per layer (no separate K and
 * V): it is laid out as kv_heads 1 x head_dim 288 in each of the K and V
 * halves, which gives the real 61 * 576 * 2 B = 68.6 KiB per token (f16).
 * DeepSeek-V3 and -R1 share the geometry: 61 layers, the first 3 dense, the
 * other 58 MoE with 256 routed experts, top-8, hidden 7168 (the shared
 * expert runs on every rank: it moves nothing). Dense presets: experts 0. */
#define ENG_SIM_PRESETS(X)                                                        \
    X(LLAMA3_8B,   "llama3-8b",   32, 8, 128, 128256,  8192,  8000.0, 20.0, 0.25,   0, 0, 4096, 0) \
    X(LLAMA3_70B,  "llama3-70b",  80, 8, 128, 128256,  8192,  1500.0, 45.0, 1.00,   0, 0, 8192, 0) \
    X(QWEN3_8B,    "qwen3-8b",    36, 8, 128, 151936, 32768,  8000.0, 21.0, 0.25,   0, 0, 4096, 0) \
    X(DEEPSEEK_V3, "deepseek-v3", 61, 1, 288, 129280, 16384,  4000.0, 60.0, 0.50, 256, 8, 7168, 3) \
    X(DEEPSEEK_R1, "deepseek-r1", 61, 1, 288, 129280, 16384,  4000.0, 60.0, 0.50, 256, 8, 7168, 3)

typedef struct {
    char preset[32];           /* preset name, or "custom" */
    uint32_t n_layers, n_kv_heads, head_dim, vocab, ctx;
    double prefill_tps;        /* modeled prefill tokens per second */
    double decode_a_ms;        /* decode step = a + b * batch (ms) */
    double decode_b_ms;
    double speedup;            /* sleep modeled / speedup (>= 1e-3) */
    bool no_sleep;             /* account only, never sleep */
    bool kv_sample;            /* kv_check=sample: hash 2x64 B per (block, layer,
                                  K/V) instead of every byte (see eng_sim.c) */
    /* MoE (expert parallelism, issue 36): 0 experts = a dense model */
    uint32_t n_experts;        /* routed experts per MoE layer (experts=) */
    uint32_t top_k;            /* experts per token (top=) */
    uint32_t n_embd;           /* hidden size: f32 row of a message (embd=) */
    uint32_t first_dense;      /* layers [0, first_dense) have no experts */
    uint32_t overlap;          /* 1: two micro-batches per EP forward pass,
                                  each's exchanges in flight while the
                                  other computes (overlap=; the group's
                                  ranks must agree: the spec is the group's) */
} eng_sim_params_t;

typedef struct {
    uint64_t prefill_calls, prefill_tokens;
    uint64_t decode_steps, decode_items;
    uint64_t modeled_ns;       /* sum of modeled times (before speedup) */
    uint64_t target_ns;        /* sum of modeled / speedup */
    uint64_t real_ns;          /* compute actually spent (before sleeping) */
    uint64_t slept_ns;         /* time slept to reach the target */
    uint64_t late_ns;          /* sum of real - target where real > target */
    uint64_t kv_bytes_written, kv_bytes_hashed; /* hashed: bytes actually read */
    /* expert parallelism (ep_size > 1): forward passes (slices of at most
     * max_batch tokens) and idle ones, exchange calls, the time spent in
     * exchange() (both phases, waiting for the slowest rank included) and
     * in the passes' modeled compute (real work + sleep), the bytes of this
     * rank's messages to OTHER ranks per phase, and the tokens it routed */
    uint64_t ep_passes, ep_idle_passes, ep_exchanges;
    uint64_t ep_exchange_ns, ep_compute_ns;
    uint64_t ep_dispatch_bytes, ep_combine_bytes;
    uint64_t ep_tokens;
} eng_sim_stats_t;

extern const eng_ops_t eng_sim_ops;

/* Parse a model_path spec (see above). PD_ERR_BAD_INPUT (unknown preset or
 * key, bad value; message in err), PD_ERR_TOO_BIG (value over a cap). */
pd_status_t eng_sim_parse(const char *spec, eng_sim_params_t *p, char *err, size_t err_len);

/* Parameters and counters of a model loaded by eng_sim_ops (NULL / false if
 * model is not a sim model). Counters are read without locking: exact when
 * the compute thread is idle. */
const eng_sim_params_t *eng_sim_params(const eng_model_t *model);
bool eng_sim_stats(const eng_model_t *model, eng_sim_stats_t *stats);
/* The largest message per phase of model (eng_ops_t.ep_cap): {0, 0} for a
 * model with no experts. */
pd_status_t eng_sim_ep_cap(const eng_model_t *model, size_t cap[ENG_EP_SLOTS]);
/* The top_k experts of a token at a position in a layer, in k order
 * (distinct, < n_experts): the routing every rank of the group agrees on. */
void eng_sim_route(const eng_sim_params_t *p, int32_t token, uint32_t pos, uint32_t layer,
                   uint32_t *experts);
/* Modeled compute time of a prefill of n tokens / a decode step of batch b. */
uint64_t eng_sim_prefill_ns(const eng_sim_params_t *p, uint32_t n_tokens);
uint64_t eng_sim_decode_ns(const eng_sim_params_t *p, uint32_t batch);

#endif
