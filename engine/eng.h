/* eng.h - the engine interface both daemons and pd-run call.
 *
 * An engine is an ops table (eng_ops_t) plus an opaque model. Two engines
 * implement it: "llama" (real CPU inference from a GGUF file, engine/llama)
 * and "sim" (a timing-model simulation at real KV geometries, engine/sim).
 *
 * KV layout (in caller-provided memory):
 *   The caller owns one arena (the kvxfer-registered region). One "layer
 *   block" (block b of layer l) holds block_tokens tokens of one layer, K
 *   and V, contiguous:
 *     layer block: (2 /K,V/, block_tokens, n_kv_heads, head_dim) of kv_dtype
 *   (K rows in kv_dtype, V rows in kv_dtype_v: one token's K row is
 *   eng_kv_row_bytes(kv_dtype, n_kv_heads*head_dim) bytes, e.g. q8_0: each
 *   head's head_dim values are head_dim/32 blocks of 34 bytes; the V rows
 *   start block_tokens K rows into the layer block)
 *   (geom.layer_block_bytes) and starts at
 *     arena + b * layout.block_stride + l * layout.layer_stride.
 *   Two layouts (eng_kv_layout_block_major / _layer_major below):
 *   - block-major (the default until set_kv_layout is called): block b at
 *     arena + b * block_bytes holds every layer, (n_layers, 2, block_tokens,
 *     n_kv_heads, head_dim): one block is one contiguous byte range;
 *   - layer-major (the daemons): the arena is n_layers regions of n_blocks
 *     layer blocks, (n_layers, n_blocks, 2, block_tokens, n_kv_heads,
 *     head_dim): one layer of a request whose blocks are contiguous is one
 *     contiguous byte range, so it can be transferred while later layers
 *     are still computed (kvxfer/DESIGN.md "Layer streaming").
 *   The bytes of a layer block and what the model computes are the same in
 *   both (the engines' outputs are bitwise identical).
 *   A sequence's KV is described by a block table: block_table[i] holds
 *   positions [i*block_tokens, (i+1)*block_tokens).
 *
 * Threading: one model may be used by one compute thread at a time (the
 * engine uses its own worker threads internally). geometry() and the
 * tokenizer are read-only and safe from any thread.
 */
#ifndef ENG_H
#define ENG_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include "pd_status.h"

typedef enum {
    ENG_KV_F32 = 0,
    ENG_KV_F16 = 1,
    ENG_KV_Q8_0 = 2,           /* llama.cpp's block_q8_0 along head_dim: per 32
                                  values one f16 scale d then 32 int8 (34 bytes);
                                  head_dim must be a multiple of 32 */
    ENG_KV_Q4_0 = 3,           /* llama.cpp's block_q4_0: per 32 values one f16
                                  d then 16 bytes of nibbles (value j: low nibble
                                  of byte j, j >= 16: high nibble of byte j-16;
                                  q - 8) (18 bytes); head_dim a multiple of 32 */
    ENG_KV_BF16 = 4,           /* bfloat16 (2 bytes, round to nearest even);
                                  head_dim a multiple of 16 */
    ENG_KV_FP8_E4M3 = 5,       /* OCP MXFP8: per 32 values one E8M0 scale byte
                                  (2^(s-127)) then 32 fp8 e4m3 (33 bytes); the
                                  scale makes the block's largest |x| <= 448
                                  (no saturation); head_dim a multiple of 32 */
} eng_kv_dtype_t;

#define ENG_KV_DTYPES 6u           /* eng_kv_dtype_t values are 0 .. ENG_KV_DTYPES-1 */
#define ENG_KV_Q8_0_BLOCK 32u      /* values per q8_0 / q4_0 / fp8_e4m3 block */
#define ENG_KV_Q8_0_BYTES 34u      /* bytes per q8_0 block */
#define ENG_KV_Q4_0_BYTES 18u      /* bytes per q4_0 block */
#define ENG_KV_FP8_BYTES 33u       /* bytes per fp8_e4m3 block */

/* Bytes of one K (or V) row of `n` values (n_kv_heads * head_dim) in dtype
 * dt; 0 if dt is unknown or n is not whole blocks of it. */
static inline uint64_t eng_kv_row_bytes(eng_kv_dtype_t dt, uint64_t n)
{
    switch (dt) {
    case ENG_KV_F32: return n * 4;
    case ENG_KV_F16: return n * 2;
    case ENG_KV_BF16: return n % 16 ? 0 : n * 2;
    case ENG_KV_Q8_0:
        return n % ENG_KV_Q8_0_BLOCK ? 0 : n / ENG_KV_Q8_0_BLOCK * ENG_KV_Q8_0_BYTES;
    case ENG_KV_Q4_0:
        return n % ENG_KV_Q8_0_BLOCK ? 0 : n / ENG_KV_Q8_0_BLOCK * ENG_KV_Q4_0_BYTES;
    case ENG_KV_FP8_E4M3:
        return n % ENG_KV_Q8_0_BLOCK ? 0 : n / ENG_KV_Q8_0_BLOCK * ENG_KV_FP8_BYTES;
    }
    return 0;
}

/* The values a head_dim must be a multiple of for dtype dt (1, 16 or 32). */
static inline uint32_t eng_kv_dtype_align(eng_kv_dtype_t dt)
{
    return dt == ENG_KV_F32 || dt == ENG_KV_F16 ? 1 : dt == ENG_KV_BF16 ? 16 : 32;
}

/* "f32" | "f16" | "q8_0" | "q4_0" | "bf16" | "fp8_e4m3" (the kv-dtype
 * config names, in eng_kv_dtype_t order). */
static inline const char *eng_kv_dtype_name(eng_kv_dtype_t dt)
{
    switch (dt) {
    case ENG_KV_F32: return "f32";
    case ENG_KV_F16: return "f16";
    case ENG_KV_Q8_0: return "q8_0";
    case ENG_KV_Q4_0: return "q4_0";
    case ENG_KV_BF16: return "bf16";
    case ENG_KV_FP8_E4M3: return "fp8_e4m3";
    }
    return "?";
}

/* dt named s (eng_kv_dtype_name's spelling): 0, or -1 if none is. */
static inline int eng_kv_dtype_parse(const char *s, eng_kv_dtype_t *dt)
{
    for (unsigned i = 0; i < ENG_KV_DTYPES; i++) {
        const char *n = eng_kv_dtype_name((eng_kv_dtype_t)i), *p = s;
        while (*n && *n == *p)
            n++, p++;
        if (*n == '\0' && *p == '\0') {
            *dt = (eng_kv_dtype_t)i;
            return 0;
        }
    }
    return -1;
}

typedef struct {
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t block_tokens;     /* tokens per block (default 16) */
    eng_kv_dtype_t kv_dtype;   /* K's dtype */
    eng_kv_dtype_t kv_dtype_v; /* V's dtype (kv-dtype-v; = kv_dtype unless set apart) */
    uint64_t bytes_per_token;  /* n_layers * (eng_kv_row_bytes(kv_dtype, n_kv_heads *
                                  head_dim) + eng_kv_row_bytes(kv_dtype_v, ...)) */
    uint64_t block_bytes;      /* block_tokens * bytes_per_token */
    uint64_t layer_block_bytes;/* block_bytes / n_layers: one layer of a block */
    uint32_t vocab_size;
    uint32_t context_length;   /* max positions */
    uint32_t n_embd;           /* hidden size: the length of an embedding */
    int32_t pooling;           /* the GGUF's <arch>.pooling_type (eng_pooling_t), or -1
                                  when absent */
    uint64_t compat_hash;      /* xxh64 over model identity + geometry: a decode
                                  daemon only accepts KV from an equal hash */
} eng_kv_geom_t;

typedef struct eng_model eng_model_t;

/* Pooling of an embedding (the values of llama.cpp's llama_pooling_type,
 * as the GGUF's <arch>.pooling_type stores them). */
typedef enum {
    ENG_POOL_NONE = 0,
    ENG_POOL_MEAN = 1,
    ENG_POOL_CLS = 2,
    ENG_POOL_LAST = 3,
} eng_pooling_t;

/* Where block b of layer l starts: arena + b * block_stride + l * layer_stride. */
typedef struct {
    uint64_t block_stride;
    uint64_t layer_stride;
} eng_kv_layout_t;

static inline eng_kv_layout_t eng_kv_layout_block_major(const eng_kv_geom_t *g)
{
    return (eng_kv_layout_t){ g->block_bytes, g->layer_block_bytes };
}

/* An arena of n_blocks blocks, layer-major. */
static inline eng_kv_layout_t eng_kv_layout_layer_major(const eng_kv_geom_t *g,
                                                        uint32_t n_blocks)
{
    return (eng_kv_layout_t){ g->layer_block_bytes, (uint64_t)n_blocks * g->layer_block_bytes };
}

/* Called on the compute thread during prefill when layer `layer`'s KV of
 * positions [0, pos_end) is written (chunked: once per layer per chunk, in
 * order). The model runs nothing else until it returns: keep it short. */
typedef void (*eng_layer_hook_t)(void *arg, uint32_t layer, uint32_t pos_end);

typedef struct {
    const char *engine;        /* "llama" | "sim" */
    const char *model_path;    /* GGUF file (llama) or preset name/spec (sim) */
    uint32_t block_tokens;     /* 0 = default 16 */
    eng_kv_dtype_t kv_dtype;   /* K's dtype, and V's unless kv_split */
    uint32_t n_threads;        /* 0 = number of online cores */
    uint32_t max_batch;        /* largest decode batch the caller will pass */
    bool kv_split;             /* V in kv_dtype_v (kv-dtype-v), K in kv_dtype;
                                  false: both in kv_dtype */
    eng_kv_dtype_t kv_dtype_v;
    /* Expert parallelism (issue 36): this process is rank ep_rank of an
     * ep_size-rank group and holds only the routed experts
     * [ep_rank * E/ep_size, (ep_rank + 1) * E/ep_size) of a MoE model (the
     * other experts' bytes are never read); 0 or 1 = the whole model.
     * ep_size must divide the expert count (PD_ERR_BAD_INPUT otherwise).
     * Such a model computes nothing until set_ep gives it a transport. */
    uint32_t ep_rank;
    uint32_t ep_size;
    /* ep_size > 1: two micro-batches per MoE layer (or pass), each's
     * exchanges in flight while the other computes: ep_cap then states
     * phases 2 and 3 and set_ep needs the transport's post and wait. Every
     * rank of a group must agree. Both engines split each forward pass
     * in two micro-batches (the llama engine: the same bits; the sim: its
     * overlap= key). */
    bool ep_overlap;
} eng_load_opts_t;

/* V's dtype of load options o. */
static inline eng_kv_dtype_t eng_load_kv_dtype_v(const eng_load_opts_t *o)
{
    return o->kv_split ? o->kv_dtype_v : o->kv_dtype;
}

/* One sequence in a decode step. */
typedef struct {
    const uint32_t *block_table; /* (n_blocks) block indices into the arena */
    uint32_t n_blocks;
    uint32_t pos;                /* position of `token`; KV for [0,pos) is present */
    int32_t token;               /* input token at pos; its KV is written at pos */
} eng_decode_item_t;

/* A prompt chunk riding in a decode step (eng_ops_t.step). */
typedef struct {
    const uint32_t *block_table; /* (n_blocks) */
    uint32_t n_blocks;
    const int32_t *tokens;       /* (n_tokens) at positions start_pos.. */
    uint32_t n_tokens;
    uint32_t start_pos;          /* KV for [0,start_pos) is present */
    bool logits;                 /* the last position's logits (the prompt's end) */
} eng_chunk_t;

/* One prompt of an embeddings batch (eng_ops_t.embed). */
typedef struct {
    const uint32_t *block_table; /* (n_blocks) scratch blocks for its KV */
    uint32_t n_blocks;
    const int32_t *tokens;       /* (n_tokens), positions 0.. */
    uint32_t n_tokens;
    eng_pooling_t pooling;
    float *out;                  /* (n_embd) */
} eng_embed_item_t;

/* Expert parallelism: what travels between the ranks of an EP group for
 * one MoE layer of one forward pass. Two phases, in this order:
 *   dispatch: rank r -> rank p: the rows of r's tokens that chose an
 *     expert p owns (each row once, however many of its experts p owns) and
 *     the (row, expert) pairs:
 *       u32 n_rows, u32 n_pairs, (n_pairs) x { u32 row, u32 expert },
 *       (n_rows, n_embd) f32 rows                 eng_ep_dispatch_bytes()
 *   combine: rank p -> rank r: one output row per pair r sent, in r's
 *     pair order (n_pairs, n_embd) f32, unweighted    eng_ep_combine_bytes()
 * The token's own rank applies the router weights and sums its top-k in
 * k order, as the whole model does: the group's logits are bitwise those
 * of one process holding every expert (engine/llama/DESIGN.md). Every rank
 * sends to every rank (itself included; a message may hold 0 pairs). */
typedef enum {
    ENG_EP_DISPATCH = 0,
    ENG_EP_COMBINE = 1,
    /* two-micro-batch overlap: micro-batch 1's exchanges have their own
     * buffers (same caps as micro-batch 0's phases) */
    ENG_EP_DISPATCH_1 = 2,
    ENG_EP_COMBINE_1 = 3,
} eng_ep_phase_t;
#define ENG_EP_SLOTS 4

static inline size_t eng_ep_dispatch_bytes(uint32_t n_rows, uint32_t n_pairs, uint32_t n_embd)
{
    return 8 + (size_t)n_pairs * 8 + (size_t)n_rows * n_embd * sizeof(float);
}

static inline size_t eng_ep_combine_bytes(uint32_t n_pairs, uint32_t n_embd)
{
    return (size_t)n_pairs * n_embd * sizeof(float);
}

/* The transport of an EP rank (in-process threads for tests, kvxfer's
 * window between processes: engine/llama/ll_ep.h, kvxfer/kvx_win.h). The
 * engine calls it on the compute thread, for every MoE layer of every
 * forward pass, dispatch then combine; every rank of the group makes the
 * same sequence of calls (a rank with no tokens runs ep_idle). */
typedef struct {
    void *ctx;
    uint32_t rank, size;       /* must equal the load options' */
    size_t cap[ENG_EP_SLOTS];  /* bytes of one message per phase (>= what
                                  the engine states: ep_cap) */
    /* The buffer of this rank's message to `peer` in `phase` (cap[phase]
     * bytes); the engine fills it before exchange(phase) / post(phase). */
    void *(*send_buf)(void *ctx, eng_ep_phase_t phase, uint32_t peer);
    /* Deliver len[p] bytes of send_buf(phase, p) to every peer p and wait
     * for every peer's message to this rank: recv[p], recv_len[p] bytes,
     * valid until this rank's next exchange of the same phase (recv[rank]
     * may be this rank's own send buffer: until the engine refills it,
     * which it does only for that next exchange). Every wait
     * has a deadline. Expected: PD_ERR_TIMED_OUT (a rank stalled),
     * PD_ERR_PEER_GONE, PD_ERR_TOO_BIG (a peer stated more than cap). */
    pd_status_t (*exchange)(void *ctx, eng_ep_phase_t phase, uint32_t layer,
                            const size_t *len, const void **recv, size_t *recv_len);
    /* exchange in two halves, for two-micro-batch overlap (NULL in a
     * transport without it; a model whose ep_cap states phases 2 and 3
     * needs them): post delivers len[p] bytes of send_buf(phase, p) to
     * every peer and returns without waiting; wait then waits for every
     * peer's message of that phase as exchange does (same results, same
     * deadline, counted from post). Each phase alternates post, wait;
     * phases interleave freely (post D0, post D1, wait D0, ...). */
    pd_status_t (*post)(void *ctx, eng_ep_phase_t phase, uint32_t layer, const size_t *len);
    pd_status_t (*wait)(void *ctx, eng_ep_phase_t phase, uint32_t layer, const void **recv,
                        size_t *recv_len);
} eng_ep_xport_t;

typedef struct eng_ops {
    const char *name;
    /* Load a model. Expected errors: PD_ERR_IO, PD_ERR_BAD_INPUT (bad file,
     * message in err), PD_ERR_UNSUPPORTED, PD_ERR_NO_MEMORY. */
    pd_status_t (*load)(const eng_load_opts_t *opts, eng_model_t **model_p,
                        char *err, size_t err_len);
    void (*destroy)(eng_model_t *model); /* accepts NULL */
    const eng_kv_geom_t *(*geometry)(const eng_model_t *model);
    /* Run tokens[0..n_tokens) at positions start_pos.. ; KV for positions
     * [0,start_pos) must already be in the first blocks (prefix reuse,
     * chunked prefill). Writes KV for the new positions into the blocks of
     * block_table and the logits of the LAST position into logits (vocab).
     * logits may be NULL (an intermediate chunk: KV only). Re-running a
     * range rewrites the same bytes (retries are idempotent).
     * Expected: PD_ERR_BAD_INPUT (token out of range), PD_ERR_NO_KV_SPACE
     * (a position beyond n_blocks * block_tokens), PD_ERR_TOO_BIG (beyond
     * context_length). Block indices are the caller's contract (the engine
     * does not know the arena size). */
    pd_status_t (*prefill)(eng_model_t *model, void *arena,
                           const uint32_t *block_table, uint32_t n_blocks,
                           const int32_t *tokens, uint32_t n_tokens,
                           uint32_t start_pos, float *logits /* (vocab) */);
    /* One decode step for a batch; logits (n_items, vocab). Results are
     * bitwise independent of batch composition and thread count (llama:
     * also of chunking and block placement, see engine/DESIGN.md).
     * n_items may exceed max_batch (run in slices). Expected statuses as
     * prefill; nothing is written if any item is invalid. */
    pd_status_t (*decode)(eng_model_t *model, void *arena,
                          const eng_decode_item_t *items, uint32_t n_items,
                          float *logits /* (n_items, vocab) */);
    /* One continuous-batching step, Sarathi-style: a prompt chunk (NULL:
     * none) and a decode batch in the same forward passes, so the weights
     * are read once for both. logits: the chunk's last position's first
     * (if chunk->logits), then each item's: (logits? + n_items, vocab).
     * Bitwise the same KV and logits as prefill(chunk) then decode(items);
     * nothing is written if the chunk or any item is invalid (the caller
     * may then run them apart to learn whose). NULL in an engine without
     * it (callers run prefill then decode). */
    pd_status_t (*step)(eng_model_t *model, void *arena, const eng_chunk_t *chunk,
                        const eng_decode_item_t *items, uint32_t n_items, float *logits);
    /* Address the arena with this layout from now on (both engines; call it
     * before any prefill/decode, not concurrently with them). Expected:
     * PD_ERR_BAD_INPUT (strides that overlap a layer block). */
    pd_status_t (*set_kv_layout)(eng_model_t *model, const eng_kv_layout_t *layout);
    /* The layer hook for the following prefill calls (NULL: none). Set on
     * the compute thread, between calls. */
    void (*set_layer_hook)(eng_model_t *model, eng_layer_hook_t hook, void *arg);
    /* The embeddings of a batch of prompts: for each item, its tokens
     * (positions 0..) run through the model, the hidden states after the
     * last norm pooled (ENG_POOL_MEAN: their mean, _CLS: the first
     * position's, _LAST: the last's) and L2-normalised into item->out
     * (geom.n_embd). The items' rows share forward passes; each vector is
     * bitwise the one its item gets alone. Each item's KV is written into
     * the blocks of its block_table (scratch: nothing else reads it; the
     * items' blocks must not overlap). NULL in an engine without
     * embeddings. Expected: as prefill (nothing is computed if any item
     * is invalid); PD_ERR_BAD_INPUT for another pooling. */
    pd_status_t (*embed)(eng_model_t *model, void *arena, const eng_embed_item_t *items,
                         uint32_t n_items);
    /* One line (NUL-terminated, at most len bytes) saying which kernel path
     * the model runs on and why not a faster one (llama: "qdot path: amx
     * (...)" / "qdot path: vnni (amx: no permission ...)"); the daemons log
     * it once at boot. NULL: nothing to say. */
    void (*describe)(const eng_model_t *model, char *buf, size_t len);
    /* Run the following calls on at most n of the model's threads (1 ..
     * its n_threads; 0 or more: all). The others park (no spinning), so a
     * daemon can hand cores to another on the host between steps (issue
     * 34). Results are bitwise the same whatever n. Compute thread,
     * between calls. NULL: the engine always uses what it has. */
    void (*set_threads)(eng_model_t *model, uint32_t n);
    /* Expert parallelism: the transport of a model loaded with ep_size > 1
     * (copied; its ctx must outlive the model's calls). Compute thread,
     * between calls. Expected: PD_ERR_BAD_INPUT (not an EP model, rank or
     * size differ), PD_ERR_TOO_BIG (caps below the engine's). NULL in an
     * engine without EP. After a transport error prefill/decode/step
     * return it (the group's pass is lost: the caller fails the group). */
    pd_status_t (*set_ep)(eng_model_t *model, const eng_ep_xport_t *xport);
    /* One forward pass's exchanges with no tokens of this rank's own, so
     * the other ranks' pass completes (a rank with nothing to run this
     * step). Expected: the transport's statuses. */
    pd_status_t (*ep_idle)(eng_model_t *model);
    /* The bytes of one EP message per phase this model may send or
     * receive (cap[ENG_EP_DISPATCH] ... cap[ENG_EP_COMBINE_1]): what a
     * transport's slots must hold and eng_ep_xport_t.cap must state for
     * set_ep to accept it. All 0 for a model with no experts; phases 2
     * and 3 are 0 unless the model runs two micro-batches per pass (then
     * set_ep also needs the transport's post and wait). Any thread, after
     * load. NULL in an engine without EP. */
    pd_status_t (*ep_cap)(const eng_model_t *model, size_t cap[ENG_EP_SLOTS]);
    /* Rows of one forward pass of `step` on an EP rank: a step of R rows
     * runs ceil(R / this) passes, and every rank of a group runs the
     * busiest rank's count (node_ep, decode's EP round). >= 1. NULL in an
     * engine without EP. */
    uint32_t (*ep_pass_rows)(const eng_model_t *model);
} eng_ops_t;

/* Pooling names ("mean", "cls", "last") <-> eng_pooling_t; -1 if unknown. */
int eng_pooling_from_name(const char *name);
const char *eng_pooling_name(int pooling);
/* Scale v[0..n) to unit L2 norm (a zero vector stays zero). */
void eng_l2_normalize(float *v, uint32_t n);
/* Pool hidden states h (n_rows, n) of positions 0..n_rows-1 into out (n)
 * as `pooling` asks (mean in double), then L2-normalise. Expected:
 * PD_ERR_BAD_INPUT (NONE, unknown pooling, n_rows 0). */
pd_status_t eng_pool(const float *h, uint32_t n_rows, uint32_t n, eng_pooling_t pooling,
                     float *out);

/* Find an engine by name ("llama", "sim"); NULL if unknown. */
const eng_ops_t *eng_find(const char *name);

#endif
