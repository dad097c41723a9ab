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
 * kv_check=full|sample. full (default) checksums every KV byte a step reads
 * (its cost: docs/BENCHMARKS.md "pd-sim-bench: can the sim engine honour
 * its own timing model?"); sample checksums 128 B per (block, layer, K/V) — lost or stale blocks still
 * change the output, a single corrupted byte may not — for capacity runs
 * where the modeled step time must be honoured.
 */
#ifndef ENG_SIM_H
#define ENG_SIM_H

#include <stdbool.h>
#include <stdint.h>
#include "eng.h"

/* X(id, name, layers, kv_heads, head_dim, vocab, ctx, prefill_tps, dec_a_ms, dec_b_ms)
 * DeepSeek-V3's MLA caches one 576-wide latent per layer (no separate K and
 * V): it is laid out as kv_heads 1 x head_dim 288 in each of the K and V
 * halves, which gives the real 61 * 576 * 2 B = 68.6 KiB per token (f16). */
#define ENG_SIM_PRESETS(X)                                                        \
    X(LLAMA3_8B,   "llama3-8b",   32, 8, 128, 128256,  8192,  8000.0, 20.0, 0.25) \
    X(LLAMA3_70B,  "llama3-70b",  80, 8, 128, 128256,  8192,  1500.0, 45.0, 1.00) \
    X(QWEN3_8B,    "qwen3-8b",    36, 8, 128, 151936, 32768,  8000.0, 21.0, 0.25) \
    X(DEEPSEEK_V3, "deepseek-v3", 61, 1, 288, 129280, 16384,  4000.0, 60.0, 0.50)

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
/* Modeled compute time of a prefill of n tokens / a decode step of batch b. */
uint64_t eng_sim_prefill_ns(const eng_sim_params_t *p, uint32_t n_tokens);
uint64_t eng_sim_decode_ns(const eng_sim_params_t *p, uint32_t batch);

#endif
