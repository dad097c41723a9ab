/* llama.c - the "llama" engine: GGUF loading and the transformer forward
 * pass (RMSNorm, RoPE, grouped-query attention over a paged block-major KV
 * cache, SwiGLU/GELU FFN or routed experts) for archs `llama`, `qwen2`,
 * `qwen3` (QK-norm), `qwen3moe` (top-k experts) and `gemma3` (post norms,
 * sliding-window layers). Semantics follow llama.cpp's graphs for these
 * archs (tests/engine/llama runs llama.cpp on the same files).
 *
 * Prefill and decode run through one routine, ll_forward(), over a list of
 * tokens each carrying its own (block table, position): a prefill chunk is
 * consecutive positions of one sequence, a decode step is one token of many
 * sequences. Every per-token quantity is computed by code that does not look
 * at the other tokens (matmuls per ll_kern.h's canonical dot, attention per
 * (token, head) reading K/V back from the cache), which is what makes chunked
 * prefill, batched decode and any thread count bitwise identical. */
#include "pd_memledger.h"
#include "eng_llama.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "gguf.h"
#include "ll_kern.h"

#define LL_DEFAULT_BLOCK_TOKENS 16
#define LL_PREFILL_CHUNK 64      /* tokens per forward pass in prefill */
#define LL_STEP_ROWS(m) ((m)->t_max < 256 ? (m)->t_max : 256u) /* rows per pass of ll_step */
#define LL_ATT_TILE 8            /* tokens per attention tile, at most */
#define LL_ATT_TILE_BYTES (4u << 20) /* a thread's tile score rows, at most */
#define LL_ATT_CHUNKS 8          /* attention chunks per active thread, at least */
#define LL_DEFAULT_MAX_BATCH 32
#define LL_MAX_THREADS 256

typedef enum {
    LL_ARCH_LLAMA = 0,
    LL_ARCH_QWEN2 = 1,
    LL_ARCH_QWEN3 = 2,           /* + per-head Q/K RMSNorm, no biases */
    LL_ARCH_QWEN3MOE = 3,        /* qwen3 attention + top-k routed experts */
    LL_ARCH_GEMMA3 = 4,          /* embd scale, pre/post norms, QK-norm, GELU,
                                  * interleaved sliding-window layers */
} ll_arch_t;

static const char *const ll_arch_names[] = { "llama", "qwen2", "qwen3", "qwen3moe", "gemma3" };
#define LL_MAX_EXPERTS 512
#define LL_MAX_EXPERTS_USED 64

typedef struct {
    float *attn_norm;            /* (n_embd) */
    float *ffn_norm;             /* (n_embd) */
    float *bq, *bk, *bv;         /* (q_dim), (kv_dim), (kv_dim) or NULL */
    eng_ll_tensor_t wq;          /* (q_dim, n_embd) */
    eng_ll_tensor_t wk, wv;      /* (kv_dim, n_embd) */
    eng_ll_tensor_t wo;          /* (n_embd, q_dim) */
    eng_ll_tensor_t w_gate, w_up;/* (n_ff, n_embd); MoE: (n_expert * n_ff_exp, n_embd) */
    eng_ll_tensor_t w_down;      /* (n_embd, n_ff); MoE: (n_expert * n_embd, n_ff_exp) */
    float *q_norm, *k_norm;      /* (head_dim) per-head RMSNorm (qwen3, gemma3) or NULL */
    float *post_attn_norm;       /* (n_embd) gemma3 or NULL */
    float *post_ffn_norm;        /* (n_embd) gemma3 or NULL */
    eng_ll_tensor_t w_router;    /* (n_expert, n_embd) MoE: ffn_gate_inp */
    int swa;                     /* sliding-window layer (gemma3) */
} ll_layer_t;

/* One token of a forward pass. */
typedef struct {
    int32_t token;
    uint32_t pos;
    const uint32_t *bt;          /* (nb) block table of its sequence */
    uint32_t nb;
} ll_tok_t;

struct eng_model {
    gguf_t *gguf;
    eng_kv_layout_t lay;       /* where a layer block lives in the arena */
    eng_layer_hook_t hook;     /* prefill: layer done (compute thread) */
    void *hook_arg;
    ll_arch_t arch;
    uint32_t n_embd, n_layers, n_heads, n_kv_heads, head_dim, n_ff, vocab;
    uint32_t q_dim, kv_dim;
    size_t kv_row_bytes;       /* one token's K row in the arena, eng_kv_row_bytes(kv_dtype) */
    size_t kv_row_bytes_v;     /* one token's V row, eng_kv_row_bytes(kv_dtype_v) */
    uint32_t rope_dim;
    float rope_base, rms_eps;
    double *inv_freq;            /* (rope_dim / 2) */
    double *inv_freq_swa;        /* (rope_dim / 2) sliding-window layers (gemma3) */
    int neox;                    /* RoPE pairs (i, i + rope_dim/2) */
    uint32_t n_expert, n_expert_used, n_ff_exp; /* MoE (0 = dense) */
    uint32_t n_swa;              /* sliding window (tokens), 0 = none */
    uint32_t swa_period;         /* layer l slides iff l % period < period - 1 */
    const void *swa_flags;       /* or (n_layers) bools from the file */
    float rope_base_swa;
    float embd_scale;            /* token embedding multiplier (gemma3 sqrt(n_embd)) */
    float att_scale;             /* attention score scale */
    float softcap;               /* final logit soft-capping, 0 = none */
    eng_ll_tensor_t tok_embd;    /* (vocab, n_embd) */
    eng_ll_tensor_t output;      /* (vocab, n_embd), == tok_embd when tied */
    float *out_norm;             /* (n_embd) */
    ll_layer_t *layers;          /* (n_layers) */
    eng_kv_geom_t geom;
    uint64_t n_params;
    uint64_t weight_bytes_per_token;

    eng_ll_pool_t *pool;
    uint32_t n_threads;
    uint32_t t_max;              /* tokens per forward pass */
    /* activations */
    float *x;                    /* (t_max, n_embd) residual stream */
    float *xb;                   /* (t_max, n_embd) normed input */
    float *xb2;                  /* (t_max, n_embd) block output */
    float *q;                    /* (t_max, q_dim) */
    float *k;                    /* (t_max, kv_dim) */
    float *v;                    /* (t_max, kv_dim) */
    float *att;                  /* (t_max, q_dim) attention output */
    float *hb;                   /* (t_max, n_ff) gate, then silu(gate)*up */
    float *hb2;                  /* (t_max, n_ff) up */
    float *rope_cs;              /* (t_max, rope_dim/2, 2) cos, sin */
    float *rope_cs_swa;          /* same for sliding-window layers, or NULL */
    /* MoE */
    float *router;               /* (t_max, n_expert) router logits */
    int32_t *sel;                /* (t_max, n_expert_used) chosen experts */
    float *selw;                 /* (t_max, n_expert_used) their weights */
    uint32_t *erows;             /* (t_max) token indices routed to one expert */
    float *ex;                   /* (t_max, n_embd) gathered inputs */
    float *eout;                 /* (t_max, n_expert_used, n_embd) expert outputs */
    float **mm_scratch;          /* (n_threads) -> (4, max_cols) */
    uint8_t *mm_qx;              /* quantized activations, eng_ll_qx_bytes(t_max, max_cols) */
    float **att_scratch;         /* (n_threads) -> ll_att_scratch_floats: scores (and the
                                  * tiled path's queries and outputs) */
    uint32_t att_tile_max;       /* tokens per attention tile (query-blocked path) */
    uint32_t att_nq_max;         /* queries per tile: att_tile_max x GQA group */
    uint32_t att_srow;           /* a tile query's score row (floats) */
    uint32_t *att_tile;          /* (t_max + 1) the current pass's tile starts */
    void **pk_bufs;              /* (n_pk) the weights' packed copies (eng_ll_pack) */
    uint32_t n_pk;
    /* expert parallelism (ep_size > 1): this rank's experts are
     * [ep_e0, ep_e0 + ep_ne); w_gate/w_up/w_down hold only theirs */
    uint32_t ep_rank, ep_size, ep_e0, ep_ne;
    bool ep_two;                 /* two micro-batches per pass (ep_overlap) */
    eng_ep_xport_t ep;           /* .exchange NULL until set_ep */
    pd_status_t ep_status;       /* the first transport error of a pass */
    uint64_t expert_bytes_owned, expert_bytes_total;
    /* the compat hash of a MoE model: the digest of everything but the
     * routed experts' bytes, then one XXH64 per (expert tensor, expert)
     * this model holds (tensor-major; an EP rank: its ep_ne per tensor) */
    uint64_t hash_base;
    uint64_t *exp_dig;
    size_t n_exp_dig;
    uint32_t *ep_pair;           /* (t_max, n_expert_used) slot -> its pair index
                                    in the dispatch to the owning rank */
    int32_t *ep_row;             /* (t_max) token -> row in the current message */
    uint32_t *ep_gather;         /* (ep_size * t_max) (src << 24 | pair) of one expert */
    size_t *ep_len;              /* (ep_size) */
    const void **ep_recv;        /* (2 halves, ep_size) */
    size_t *ep_recv_len;         /* (2, ep_size) */
    const void **ep_crecv;       /* (2, ep_size) combine messages */
    size_t *ep_crecv_len;        /* (2, ep_size) */
    uint32_t *ep_npairs;         /* (2, ep_size) pairs sent to each rank */
};

/* ------------------------------------------------------------------ */
/* loading                                                             */

static void ll_free(eng_model_t *m)
{
    if (!m)
        return;
    eng_ll_pool_destroy(m->pool);
    if (m->layers) {
        for (uint32_t l = 0; l < m->n_layers; l++) {
            ll_layer_t *L = &m->layers[l];
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->bq);
            free(L->bk);
            free(L->bv);
            free(L->q_norm);
            free(L->k_norm);
            free(L->post_attn_norm);
            free(L->post_ffn_norm);
        }
        free(m->layers);
    free(m->exp_dig);
    }
    if (m->mm_scratch)
        for (uint32_t t = 0; t < m->n_threads; t++)
            free(m->mm_scratch[t]);
    if (m->att_scratch)
        for (uint32_t t = 0; t < m->n_threads; t++)
            free(m->att_scratch[t]);
    free(m->mm_scratch);
    free(m->mm_qx);
    for (uint32_t i = 0; i < m->n_pk; i++)
        free(m->pk_bufs[i]);
    free(m->pk_bufs);
    free(m->att_scratch);
    free(m->att_tile);
    free(m->out_norm);
    free(m->inv_freq);
    free(m->inv_freq_swa);
    free(m->rope_cs_swa);
    free(m->router);
    free(m->sel);
    free(m->selw);
    free(m->erows);
    free(m->ep_pair);
    free(m->ep_row);
    free(m->ep_gather);
    free(m->ep_len);
    free(m->ep_recv);
    free(m->ep_recv_len);
    free(m->ep_crecv);
    free(m->ep_crecv_len);
    free(m->ep_npairs);
    free(m->ex);
    free(m->eout);
    free(m->x);
    free(m->xb);
    free(m->xb2);
    free(m->q);
    free(m->k);
    free(m->v);
    free(m->att);
    free(m->hb);
    free(m->hb2);
    free(m->rope_cs);
    gguf_close(m->gguf);
    free(m);
}

static pd_status_t __attribute__((format(printf, 4, 5)))
ll_bad(char *err, size_t err_len, pd_status_t st, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

static pd_status_t ll_get_u32(const gguf_t *g, const char *arch, const char *suffix,
                              uint32_t *v_p, int required, char *err, size_t err_len)
{
    char key[160];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    pd_status_t st = gguf_get_u32(g, key, v_p);
    if (st == PD_ERR_NOT_FOUND && !required)
        return PD_OK;
    if (st != PD_OK)
        return ll_bad(err, err_len, PD_ERR_BAD_INPUT, "metadata key %s missing or bad", key);
    return PD_OK;
}

static pd_status_t ll_get_f32(const gguf_t *g, const char *arch, const char *suffix,
                              float *v_p, char *err, size_t err_len)
{
    char key[160];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    pd_status_t st = gguf_get_f32(g, key, v_p);
    if (st == PD_ERR_NOT_FOUND)
        return PD_OK;
    if (st != PD_OK)
        return ll_bad(err, err_len, PD_ERR_BAD_INPUT, "metadata key %s bad", key);
    return PD_OK;
}

/* The one error for a weight the engine cannot use: the tensor, its type
 * name, and what is supported. */
static pd_status_t ll_unsupported(const gguf_tensor_t *t, const char *name, char *err,
                                  size_t err_len)
{
    const ggml_type_info_t *info = ggml_type_info(t->type);
    if (info && info->supported) /* a supported type whose row is not whole blocks */
        return ll_bad(err, err_len, PD_ERR_UNSUPPORTED,
                      "tensor %s: type %s needs rows of a multiple of %u elements, "
                      "has %" PRIu64, name, info->name, info->block_size, t->ne[0]);
    return ll_bad(err, err_len, PD_ERR_UNSUPPORTED,
                  "tensor %s: unsupported weight type %s (id %u); supported: %s", name,
                  ggml_type_name(t->type), t->type, ggml_supported_types());
}

static pd_status_t ll_bind_3d(eng_model_t *m, const gguf_tensor_t *t, const char *name,
                              uint32_t rows, uint32_t cols, uint32_t n_mat,
                              eng_ll_tensor_t *t_p, char *err, size_t err_len);

/* Bind a 2-D weight (rows, cols) in place. */
static pd_status_t ll_bind_mat(eng_model_t *m, const char *name, uint32_t rows,
                               uint32_t cols, int optional, eng_ll_tensor_t *t_p,
                               char *err, size_t err_len)
{
    const gguf_tensor_t *t = gguf_tensor_find(m->gguf, name);
    if (!t) {
        if (optional)
            return PD_ERR_NOT_FOUND;
        return ll_bad(err, err_len, PD_ERR_BAD_INPUT, "tensor %s missing", name);
    }
    return ll_bind_3d(m, t, name, rows, cols, 1, t_p, err, err_len);
}

/* Bind a (n_mat, rows, cols) stack of matrices (MoE *_exps) as one matrix of
 * n_mat * rows rows; matrix e is rows [e * rows, (e + 1) * rows). */
static pd_status_t ll_bind_3d(eng_model_t *m, const gguf_tensor_t *t, const char *name,
                              uint32_t rows, uint32_t cols, uint32_t n_mat,
                              eng_ll_tensor_t *t_p, char *err, size_t err_len)
{
    (void)m;
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n_mat || t->ne[3] != 1 ||
        (uint64_t)rows * n_mat > UINT32_MAX)
        return ll_bad(err, err_len, PD_ERR_BAD_INPUT, "tensor %s has wrong shape", name);
    rows *= n_mat;
    size_t rb = eng_ll_row_bytes(t->type, cols);
    if (rb == 0)
        return ll_unsupported(t, name, err, err_len);
    if ((uint64_t)rb * rows != t->n_bytes)
        return ll_bad(err, err_len, PD_ERR_BAD_INPUT, "tensor %s: size mismatch", name);
    t_p->data = t->data;
    t_p->type = t->type;
    t_p->rows = rows;
    t_p->cols = cols;
    t_p->row_bytes = rb;
    return PD_OK;
}

/* Copy a 1-D tensor of n elements to an owned f32 array. */
static pd_status_t ll_load_vec(eng_model_t *m, const char *name, uint32_t n,
                               int optional, float **v_p, char *err, size_t err_len)
{
    const gguf_tensor_t *t = gguf_tensor_find(m->gguf, name);
    if (!t) {
        if (optional) {
            *v_p = NULL;
            return PD_OK;
        }
        return ll_bad(err, err_len, PD_ERR_BAD_INPUT, "tensor %s missing", name);
    }
    if (t->n_elements != n || t->ne[0] != n)
        return ll_bad(err, err_len, PD_ERR_BAD_INPUT, "tensor %s has wrong shape", name);
    if (eng_ll_row_bytes(t->type, n) == 0)
        return ll_unsupported(t, name, err, err_len);
    float *v = malloc((size_t)n * sizeof(float));
    if (!v)
        return PD_ERR_NO_MEMORY;
    eng_ll_tensor_t tt = { t->data, t->type, 1, n, eng_ll_row_bytes(t->type, n) };
    eng_ll_dequant_row(&tt, 0, v);
    *v_p = v;
    return PD_OK;
}

static pd_status_t ll_pack_one(eng_model_t *m, eng_ll_tensor_t *t)
{
    void *buf;
    pd_status_t st = eng_ll_pack(t, &buf);
    if (st == PD_OK && buf) {
        m->pk_bufs[m->n_pk++] = buf;
        /* the kernels read the packed rows only (tail rows and token_embd
         * lookups fault theirs back): the model stays ~1x in memory */
        gguf_release(m->gguf, t->data, (size_t)(t->rows / 16 * 16) * t->row_bytes);
    }
    return st; /* on failure ll_free frees the ones made */
}

/* The packed copies of every matmul weight the integer-dot kernel has a
 * packed form for on this CPU (the output too when tied: token_embd itself
 * is only read row by row, from the file). */
static pd_status_t ll_pack_weights(eng_model_t *m)
{
    m->pk_bufs = calloc(1 + 8 * (size_t)m->n_layers, sizeof(*m->pk_bufs));
    if (!m->pk_bufs)
        return PD_ERR_NO_MEMORY;
    pd_status_t st = ll_pack_one(m, &m->output);
    for (uint32_t l = 0; l < m->n_layers && st == PD_OK; l++) {
        ll_layer_t *L = &m->layers[l];
        eng_ll_tensor_t *lw[] = { &L->wq, &L->wk, &L->wv, &L->wo,
                                  &L->w_gate, &L->w_up, &L->w_down, &L->w_router };
        for (size_t j = 0; j < sizeof(lw) / sizeof(lw[0]) && st == PD_OK; j++)
            if (lw[j]->data)
                st = ll_pack_one(m, lw[j]);
    }
    return st;
}

static pd_status_t ll_load_layers(eng_model_t *m, char *err, size_t err_len)
{
    char name[128];
    pd_status_t st;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        ll_layer_t *L = &m->layers[l];
#define LL_MAT(field, suffix, rows, cols)                                     \
        snprintf(name, sizeof(name), "blk.%u." suffix ".weight", l);           \
        st = ll_bind_mat(m, name, rows, cols, 0, &L->field, err, err_len);    \
        if (st != PD_OK)                                                       \
            return st;
#define LL_VEC(field, suffix, n, optional)                                    \
        snprintf(name, sizeof(name), "blk.%u." suffix, l);                     \
        st = ll_load_vec(m, name, n, optional, &L->field, err, err_len);      \
        if (st != PD_OK)                                                       \
            return st;
        LL_MAT(wq, "attn_q", m->q_dim, m->n_embd)
        LL_MAT(wk, "attn_k", m->kv_dim, m->n_embd)
        LL_MAT(wv, "attn_v", m->kv_dim, m->n_embd)
        LL_MAT(wo, "attn_output", m->n_embd, m->q_dim)
        if (m->n_expert) {
#define LL_EXPS(field, suffix, rows, cols)                                    \
            snprintf(name, sizeof(name), "blk.%u." suffix ".weight", l);       \
            {                                                                  \
                const gguf_tensor_t *t_ = gguf_tensor_find(m->gguf, name);     \
                if (!t_)                                                       \
                    return ll_bad(err, err_len, PD_ERR_BAD_INPUT,              \
                                  "tensor %s missing", name);                  \
                st = ll_bind_3d(m, t_, name, rows, cols, m->n_expert, &L->field, \
                                err, err_len);                                 \
                if (st != PD_OK)                                               \
                    return st;                                                 \
                m->expert_bytes_total += t_->n_bytes;                          \
                /* EP: a view of this rank's experts only (nothing read) */    \
                L->field = eng_ll_rows_view(&L->field, m->ep_e0 * (rows),      \
                                            m->ep_ne * (rows));                \
                m->expert_bytes_owned += (uint64_t)L->field.row_bytes * m->ep_ne * (rows); \
            }
            LL_MAT(w_router, "ffn_gate_inp", m->n_expert, m->n_embd)
            LL_EXPS(w_gate, "ffn_gate_exps", m->n_ff_exp, m->n_embd)
            LL_EXPS(w_up, "ffn_up_exps", m->n_ff_exp, m->n_embd)
            LL_EXPS(w_down, "ffn_down_exps", m->n_embd, m->n_ff_exp)
#undef LL_EXPS
        } else {
            LL_MAT(w_gate, "ffn_gate", m->n_ff, m->n_embd)
            LL_MAT(w_up, "ffn_up", m->n_ff, m->n_embd)
            LL_MAT(w_down, "ffn_down", m->n_embd, m->n_ff)
        }
        LL_VEC(attn_norm, "attn_norm.weight", m->n_embd, 0)
        LL_VEC(ffn_norm, "ffn_norm.weight", m->n_embd, 0)
        if (m->arch == LL_ARCH_QWEN3 || m->arch == LL_ARCH_QWEN3MOE ||
            m->arch == LL_ARCH_GEMMA3) {
            LL_VEC(q_norm, "attn_q_norm.weight", m->head_dim, 0)
            LL_VEC(k_norm, "attn_k_norm.weight", m->head_dim, 0)
        }
        if (m->arch == LL_ARCH_GEMMA3) {
            LL_VEC(post_attn_norm, "post_attention_norm.weight", m->n_embd, 0)
            LL_VEC(post_ffn_norm, "post_ffw_norm.weight", m->n_embd, 0)
            uint32_t p = m->swa_period;
            L->swa = m->n_swa > 0 &&
                     (m->swa_flags ? ((const uint8_t *)m->swa_flags)[l] != 0
                                   : p == 0 || l % p < p - 1);
        }
        LL_VEC(bq, "attn_q.bias", m->q_dim, 1)
        LL_VEC(bk, "attn_k.bias", m->kv_dim, 1)
        LL_VEC(bv, "attn_v.bias", m->kv_dim, 1)
#undef LL_MAT
#undef LL_VEC
    }
    return PD_OK;
}

/* The final compat hash of a MoE model: its base digest and the digest of
 * every (expert tensor, expert) digest in order. */
static uint64_t ll_hash_fold(uint64_t base, const uint64_t *dig, size_t n)
{
    uint64_t v[2] = { base, XXH64(dig, n * sizeof(*dig), 0) };
    return XXH64(v, sizeof(v), 0x65787065727473ULL);
}

static bool ll_is_exps(const eng_model_t *m, const gguf_tensor_t *t)
{
    size_t nl = strlen(t->name);
    return m->n_expert > 0 && nl > 12 && strcmp(t->name + nl - 12, "_exps.weight") == 0 &&
           t->ne[2] == m->n_expert;
}

/* xxh64 over the model identity (arch, hyper-parameters, every tensor's
 * name, type, dims and data) and the KV geometry. A MoE model's routed
 * experts are hashed one expert at a time (m->exp_dig) and folded in at the
 * end (ll_hash_fold), so an EP rank, which reads only its experts (the
 * others' pages are never touched), gets the whole model's hash once the
 * group has pooled its digests (eng_llama_ep_group_hash); until then its
 * hash covers its slice and its rank. 0 on no memory. */
static uint64_t ll_compat_hash(eng_model_t *m)
{
    XXH64_state_t *s = XXH64_createState();
    if (!s)
        return 0;
    XXH64_reset(s, 0x70647365727665ULL);
    static const char tag[] = "pdserve-llama-kv-v1";
    XXH64_update(s, tag, sizeof(tag));
    uint32_t hp[] = { m->arch, m->n_embd, m->n_layers, m->n_heads, m->n_kv_heads,
                      m->head_dim, m->n_ff, m->vocab, m->rope_dim, m->n_expert,
                      m->n_expert_used, m->n_ff_exp, m->n_swa };
    XXH64_update(s, hp, sizeof(hp));
    float hf[] = { m->rope_base_swa, m->embd_scale, m->att_scale, m->softcap };
    XXH64_update(s, hf, sizeof(hf));
    XXH64_update(s, &m->rope_base, sizeof(m->rope_base));
    XXH64_update(s, &m->rms_eps, sizeof(m->rms_eps));
    uint64_t n = gguf_tensor_count(m->gguf);
    uint32_t e0 = m->ep_size > 1 ? m->ep_e0 : 0, ne = m->ep_size > 1 ? m->ep_ne : m->n_expert;
    size_t n_exps = 0;
    for (uint64_t i = 0; i < n; i++)
        n_exps += ll_is_exps(m, gguf_tensor_at(m->gguf, i));
    free(m->exp_dig);
    m->n_exp_dig = 0;
    m->exp_dig = n_exps ? malloc(n_exps * ne * sizeof(*m->exp_dig)) : NULL;
    if (n_exps && !m->exp_dig) {
        XXH64_freeState(s);
        return 0;
    }
    for (uint64_t i = 0; i < n; i++) {
        const gguf_tensor_t *t = gguf_tensor_at(m->gguf, i);
        XXH64_update(s, t->name, strlen(t->name) + 1);
        XXH64_update(s, &t->type, sizeof(t->type));
        XXH64_update(s, t->ne, sizeof(t->ne));
        if (ll_is_exps(m, t)) { /* one digest per expert held */
            uint64_t per = t->n_bytes / m->n_expert;
            for (uint32_t e = e0; e < e0 + ne; e++)
                m->exp_dig[m->n_exp_dig++] = XXH64((const uint8_t *)t->data + per * e, per, 0);
            continue;
        }
        uint64_t dh = XXH64(t->data, t->n_bytes, 0);
        XXH64_update(s, &dh, sizeof(dh));
    }
    const eng_kv_geom_t *g = &m->geom;
    uint64_t gv[] = { g->n_layers, g->n_kv_heads, g->head_dim, g->block_tokens,
                      /* V's dtype only when it differs (the same hashes as before kv-dtype-v) */
                      (uint64_t)g->kv_dtype |
                          (g->kv_dtype_v != g->kv_dtype ? (uint64_t)(g->kv_dtype_v + 1) << 8 : 0),
                      g->bytes_per_token, g->block_bytes,
                      g->vocab_size };
    XXH64_update(s, gv, sizeof(gv));
    uint64_t h = XXH64_digest(s);
    XXH64_freeState(s);
    m->hash_base = h;
    if (n_exps == 0)
        return h; /* dense: the hash it always had */
    if (m->ep_size > 1) { /* this rank's slice only, until the group's digests come */
        uint32_t er[2] = { m->ep_rank, m->ep_size };
        return ll_hash_fold(h ^ XXH64(er, sizeof(er), 0), m->exp_dig, m->n_exp_dig);
    }
    return ll_hash_fold(h, m->exp_dig, m->n_exp_dig);
}

size_t eng_llama_ep_digests(const eng_model_t *m, const uint64_t **dig_p)
{
    *dig_p = m->ep_size > 1 ? m->exp_dig : NULL;
    return m->ep_size > 1 ? m->n_exp_dig : 0;
}

pd_status_t eng_llama_ep_group_hash(eng_model_t *m, const uint64_t *all, size_t n_all)
{
    if (!m || m->ep_size <= 1 || !all || m->n_exp_dig == 0 || n_all != m->n_exp_dig * m->ep_size)
        return PD_ERR_BAD_INPUT;
    /* rank-major (each rank's tensor-major block) -> tensor-major, expert order */
    size_t n_t = m->n_exp_dig / m->ep_ne;
    uint64_t *whole = malloc(n_all * sizeof(*whole));
    if (!whole)
        return PD_ERR_NO_MEMORY;
    for (uint32_t r = 0; r < m->ep_size; r++)
        for (size_t t = 0; t < n_t; t++)
            for (uint32_t j = 0; j < m->ep_ne; j++) {
                uint64_t d = all[(size_t)r * m->n_exp_dig + t * m->ep_ne + j];
                if (r == m->ep_rank && d != m->exp_dig[t * m->ep_ne + j]) {
                    free(whole);
                    return PD_ERR_MISMATCH; /* our own slice stated otherwise */
                }
                whole[t * m->n_expert + (size_t)r * m->ep_ne + j] = d;
            }
    m->geom.compat_hash = ll_hash_fold(m->hash_base, whole, n_all);
    free(whole);
    return PD_OK;
}

/* threads = 0: the CPUs this process may use (affinity mask, capped by the
 * cgroup quota: a container's CPU limit, not the node's cores) */
static uint32_t ll_online_cores(void)
{
    uint32_t n = pd_cpu_budget(NULL, NULL);
    return n > LL_MAX_THREADS ? LL_MAX_THREADS : n;
}

static pd_status_t ll_alloc_buffers(eng_model_t *m)
{
    size_t T = m->t_max;
#define LL_ALLOC(ptr, n)                                                      \
    do {                                                                      \
        (ptr) = calloc((n), sizeof(*(ptr)));                                   \
        if (!(ptr))                                                           \
            return PD_ERR_NO_MEMORY;                                          \
    } while (0)
    LL_ALLOC(m->x, T * m->n_embd);
    LL_ALLOC(m->xb, T * m->n_embd);
    LL_ALLOC(m->xb2, T * m->n_embd);
    LL_ALLOC(m->q, T * m->q_dim);
    LL_ALLOC(m->k, T * m->kv_dim);
    LL_ALLOC(m->v, T * m->kv_dim);
    LL_ALLOC(m->att, T * m->q_dim);
    size_t ff = m->n_ff > m->n_ff_exp ? m->n_ff : m->n_ff_exp;
    LL_ALLOC(m->hb, T * ff);
    LL_ALLOC(m->hb2, T * ff);
    LL_ALLOC(m->rope_cs, T * (m->rope_dim / 2 + 1) * 2);
    if (m->inv_freq_swa)
        LL_ALLOC(m->rope_cs_swa, T * (m->rope_dim / 2 + 1) * 2);
    if (m->n_expert) {
        LL_ALLOC(m->router, T * m->n_expert);
        LL_ALLOC(m->sel, T * m->n_expert_used);
        LL_ALLOC(m->selw, T * m->n_expert_used);
        LL_ALLOC(m->erows, T);
        LL_ALLOC(m->ex, T * m->n_embd);
        LL_ALLOC(m->eout, T * m->n_expert_used * m->n_embd);
    }
    if (m->ep_size > 1) {
        LL_ALLOC(m->ep_pair, T * m->n_expert_used);
        LL_ALLOC(m->ep_row, T);
        LL_ALLOC(m->ep_gather, T * m->ep_size);
        LL_ALLOC(m->ep_len, m->ep_size);
        LL_ALLOC(m->ep_recv, 2 * m->ep_size);
        LL_ALLOC(m->ep_recv_len, 2 * m->ep_size);
        LL_ALLOC(m->ep_crecv, 2 * m->ep_size);
        LL_ALLOC(m->ep_crecv_len, 2 * m->ep_size);
        LL_ALLOC(m->ep_npairs, 2 * m->ep_size);
    }
    LL_ALLOC(m->mm_scratch, m->n_threads);
    LL_ALLOC(m->att_scratch, m->n_threads);
    size_t max_cols = m->n_embd > ff ? m->n_embd : ff;
    if (m->q_dim > max_cols)
        max_cols = m->q_dim;
    LL_ALLOC(m->mm_qx, eng_ll_qx_bytes(T, (uint32_t)max_cols));
    /* attention tiles: up to LL_ATT_TILE tokens x the GQA group, fewer
     * where their score rows would pass LL_ATT_TILE_BYTES a thread */
    const uint32_t group = m->n_heads / m->n_kv_heads;
    m->att_srow = m->geom.context_length + 16;
    m->att_tile_max = LL_ATT_TILE;
    while (m->att_tile_max > 1 &&
           (uint64_t)m->att_tile_max * group * m->att_srow * sizeof(float) > LL_ATT_TILE_BYTES)
        m->att_tile_max /= 2;
    m->att_nq_max = m->att_tile_max * group;
    size_t att_floats = (size_t)m->att_nq_max * (m->att_srow + 2 * (size_t)m->head_dim);
    LL_ALLOC(m->att_tile, T + 1);
    for (uint32_t t = 0; t < m->n_threads; t++) {
        LL_ALLOC(m->mm_scratch[t], 4 * max_cols);
        LL_ALLOC(m->att_scratch[t], att_floats);
    }
#undef LL_ALLOC
    return PD_OK;
}

/* RoPE frequency adjustments: `<arch>.rope.scaling.type` "linear" (positions
 * divided by `.rope.scaling.factor`) and the per-pair divisors of an optional
 * `rope_freqs.weight` (Llama 3.1 style), both as llama.cpp applies them.
 * Other scaling types (yarn, ...) are refused rather than silently wrong. */
static pd_status_t ll_rope_scaling(eng_model_t *m, const char *arch, char *err, size_t err_len)
{
    char key[160];
    const char *ty;
    uint64_t ty_len;
    snprintf(key, sizeof(key), "%s.rope.scaling.type", arch);
    if (gguf_get_string(m->gguf, key, &ty, &ty_len) == PD_OK &&
        !(ty_len == 4 && memcmp(ty, "none", 4) == 0)) {
        if (!(ty_len == 6 && memcmp(ty, "linear", 6) == 0))
            return ll_bad(err, err_len, PD_ERR_UNSUPPORTED, "rope scaling '%.*s' unsupported",
                          (int)(ty_len > 32 ? 32 : ty_len), ty);
        float factor = 1.0f;
        if (ll_get_f32(m->gguf, arch, "rope.scaling.factor", &factor, err, err_len) != PD_OK ||
            !(factor >= 1.0f) || factor > 1024.0f)
            return ll_bad(err, err_len, PD_ERR_BAD_INPUT, "%s", "bad rope.scaling.factor");
        for (uint32_t i = 0; i < m->rope_dim / 2; i++)
            m->inv_freq[i] /= factor;
    }
    float *ff = NULL;
    pd_status_t st = ll_load_vec(m, "rope_freqs.weight", m->rope_dim / 2, 1, &ff, err, err_len);
    if (st != PD_OK)
        return st;
    if (ff) {
        for (uint32_t i = 0; i < m->rope_dim / 2; i++) {
            if (!(ff[i] > 0.0f)) {
                free(ff);
                return ll_bad(err, err_len, PD_ERR_BAD_INPUT, "%s", "bad rope_freqs.weight");
            }
            m->inv_freq[i] /= ff[i];
        }
        free(ff);
    }
    return PD_OK;
}

static pd_status_t ll_load(const eng_load_opts_t *opts, eng_model_t **model_p,
                           char *err, size_t err_len)
{
    pd_status_t st;
    if (err && err_len)
        err[0] = '\0';
    if (!opts || !opts->model_path || !model_p)
        return PD_ERR_BAD_INPUT;
    if ((unsigned)opts->kv_dtype >= ENG_KV_DTYPES ||
        (unsigned)eng_load_kv_dtype_v(opts) >= ENG_KV_DTYPES)
        return ll_bad(err, err_len, PD_ERR_BAD_INPUT, "%s", "bad kv_dtype");
    eng_model_t *m = calloc(1, sizeof(*m));
    if (!m)
        return PD_ERR_NO_MEMORY;
    st = gguf_open(opts->model_path, &m->gguf, err, err_len);
    if (st != PD_OK)
        goto err_free;

    const char *arch_s;
    uint64_t arch_len;
    st = gguf_get_string(m->gguf, "general.architecture", &arch_s, &arch_len);
    if (st != PD_OK) {
        st = ll_bad(err, err_len, PD_ERR_BAD_INPUT, "%s", "general.architecture missing");
        goto err_free;
    }
    char arch[32];
    if (arch_len >= sizeof(arch))
        arch_len = sizeof(arch) - 1;
    memcpy(arch, arch_s, arch_len);
    arch[arch_len] = '\0';
    uint32_t ai = 0, n_archs = sizeof(ll_arch_names) / sizeof(ll_arch_names[0]);
    while (ai < n_archs && strcmp(arch, ll_arch_names[ai]) != 0)
        ai++;
    if (ai == n_archs) {
        st = ll_bad(err, err_len, PD_ERR_UNSUPPORTED,
                    "unsupported architecture '%s' (supported: llama qwen2 qwen3 qwen3moe "
                    "gemma3)", arch);
        goto err_free;
    }
    m->arch = (ll_arch_t)ai;
    m->neox = m->arch != LL_ARCH_LLAMA;

    uint32_t ctx_len = 2048;
    m->rope_base = 10000.0f;
    m->rms_eps = 1e-5f;
    if ((st = ll_get_u32(m->gguf, arch, "embedding_length", &m->n_embd, 1, err, err_len)) ||
        (st = ll_get_u32(m->gguf, arch, "block_count", &m->n_layers, 1, err, err_len)) ||
        (st = ll_get_u32(m->gguf, arch, "feed_forward_length", &m->n_ff,
                         m->arch != LL_ARCH_QWEN3MOE, err, err_len)) ||
        (st = ll_get_u32(m->gguf, arch, "attention.head_count", &m->n_heads, 1, err, err_len)) ||
        (st = ll_get_u32(m->gguf, arch, "context_length", &ctx_len, 0, err, err_len)) ||
        (st = ll_get_f32(m->gguf, arch, "rope.freq_base", &m->rope_base, err, err_len)) ||
        (st = ll_get_f32(m->gguf, arch, "attention.layer_norm_rms_epsilon", &m->rms_eps,
                         err, err_len)))
        goto err_free;
    m->n_kv_heads = m->n_heads;
    if ((st = ll_get_u32(m->gguf, arch, "attention.head_count_kv", &m->n_kv_heads, 0,
                         err, err_len)))
        goto err_free;
    if (m->arch == LL_ARCH_QWEN3MOE) {
        if ((st = ll_get_u32(m->gguf, arch, "expert_count", &m->n_expert, 1, err, err_len)) ||
            (st = ll_get_u32(m->gguf, arch, "expert_used_count", &m->n_expert_used, 1, err,
                             err_len)) ||
            (st = ll_get_u32(m->gguf, arch, "expert_feed_forward_length", &m->n_ff_exp, 0,
                             err, err_len)))
            goto err_free;
        if (m->n_expert == 0 || m->n_expert > LL_MAX_EXPERTS || m->n_expert_used == 0 ||
            m->n_expert_used > m->n_expert || m->n_expert_used > LL_MAX_EXPERTS_USED) {
            st = ll_bad(err, err_len, PD_ERR_BAD_INPUT, "%s", "bad expert_count/expert_used_count");
            goto err_free;
        }
        if (m->n_ff_exp == 0) /* llama.cpp's default */
            m->n_ff_exp = m->n_ff / m->n_expert_used;
        if (m->n_ff == 0)
            m->n_ff = m->n_ff_exp;
        if (m->n_ff_exp == 0 || m->n_ff_exp > 1u << 20) {
            st = ll_bad(err, err_len, PD_ERR_BAD_INPUT, "%s", "bad expert_feed_forward_length");
            goto err_free;
        }
    }
    m->ep_size = opts->ep_size ? opts->ep_size : 1;
    m->ep_rank = opts->ep_rank;
    if (m->ep_rank >= m->ep_size || m->ep_size > 256) {
        st = ll_bad(err, err_len, PD_ERR_BAD_INPUT, "ep rank %u of %u", m->ep_rank, m->ep_size);
        goto err_free;
    }
    if (m->ep_size > 1 && m->n_expert == 0) {
        st = ll_bad(err, err_len, PD_ERR_BAD_INPUT,
                    "ep_size %u: expert parallelism needs a MoE model (arch %s has no experts)",
                    m->ep_size, arch);
        goto err_free;
    }
    if (m->n_expert && m->n_expert % m->ep_size != 0) {
        st = ll_bad(err, err_len, PD_ERR_BAD_INPUT,
                    "ep_size %u does not divide the expert count %u (each rank holds "
                    "expert_count / ep_size experts)", m->ep_size, m->n_expert);
        goto err_free;
    }
    m->ep_ne = m->n_expert / m->ep_size;
    m->ep_two = m->ep_size > 1 && opts->ep_overlap;
    m->ep_e0 = m->ep_rank * m->ep_ne;
    m->rope_base_swa = 10000.0f;
    m->softcap = 0.0f;
    if (m->arch == LL_ARCH_GEMMA3) {
        if ((st = ll_get_u32(m->gguf, arch, "attention.sliding_window", &m->n_swa, 0, err,
                             err_len)) ||
            (st = ll_get_f32(m->gguf, arch, "rope.freq_base_swa", &m->rope_base_swa, err,
                             err_len)) ||
            (st = ll_get_f32(m->gguf, arch, "final_logit_softcapping", &m->softcap, err,
                             err_len)))
            goto err_free;
        if (!(m->rope_base_swa > 0) || !(m->softcap >= 0) || m->softcap > 1e6f) {
            st = ll_bad(err, err_len, PD_ERR_BAD_INPUT, "%s", "bad gemma3 hyper-parameters");
            goto err_free;
        }
        /* which layers slide: `.attention.sliding_window_pattern` as a
         * u32 period N (layer l slides iff l % N < N - 1; N = 0: all) or a
         * bool per layer; default period 6, as llama.cpp */
        char key[160];
        snprintf(key, sizeof(key), "%s.attention.sliding_window_pattern", arch);
        const gguf_arr_t *pa;
        m->swa_period = 6;
        if (gguf_kv_find(m->gguf, key)) {
            if (gguf_get_arr(m->gguf, key, GGUF_TYPE_BOOL, &pa) == PD_OK) {
                if (pa->count != m->n_layers) {
                    st = ll_bad(err, err_len, PD_ERR_BAD_INPUT, "%s",
                                "sliding_window_pattern: one bool per layer expected");
                    goto err_free;
                }
                m->swa_flags = pa->data;
            } else if (gguf_get_u32(m->gguf, key, &m->swa_period) != PD_OK) {
                st = ll_bad(err, err_len, PD_ERR_BAD_INPUT, "%s", "bad sliding_window_pattern");
                goto err_free;
            }
        }
    }
    st = PD_ERR_BAD_INPUT;
    if (m->n_embd == 0 || m->n_embd > 65536 || m->n_layers == 0 || m->n_layers > 1024 ||
        m->n_heads == 0 || m->n_kv_heads == 0 || m->n_heads % m->n_kv_heads != 0 ||
        m->n_embd % m->n_heads != 0 || m->n_ff == 0 || m->n_ff > 1u << 20 ||
        ctx_len == 0 || ctx_len > 1u << 20 || !(m->rms_eps > 0) || !(m->rope_base > 0)) {
        ll_bad(err, err_len, st, "%s", "inconsistent hyper-parameters");
        goto err_free;
    }
    m->head_dim = m->n_embd / m->n_heads;
    if ((st = ll_get_u32(m->gguf, arch, "attention.key_length", &m->head_dim, 0,
                         err, err_len)))
        goto err_free;
    uint32_t vlen = m->head_dim;
    if ((st = ll_get_u32(m->gguf, arch, "attention.value_length", &vlen, 0, err, err_len)))
        goto err_free;
    if (vlen != m->head_dim) {
        st = ll_bad(err, err_len, PD_ERR_UNSUPPORTED, "%s",
                    "attention.value_length != key_length is not supported");
        goto err_free;
    }
    m->rope_dim = m->head_dim;
    if ((st = ll_get_u32(m->gguf, arch, "rope.dimension_count", &m->rope_dim, 0,
                         err, err_len)))
        goto err_free;
    if (m->head_dim == 0 || m->head_dim > 1024 || m->rope_dim > m->head_dim ||
        m->rope_dim % 2 != 0) {
        st = ll_bad(err, err_len, PD_ERR_BAD_INPUT, "%s", "bad head or rope dimension");
        goto err_free;
    }
    m->q_dim = m->n_heads * m->head_dim;
    m->kv_dim = m->n_kv_heads * m->head_dim;

    const gguf_tensor_t *te = gguf_tensor_find(m->gguf, "token_embd.weight");
    if (!te || te->n_dims != 2 || te->ne[1] == 0 || te->ne[1] > (1u << 24)) {
        st = ll_bad(err, err_len, PD_ERR_BAD_INPUT, "%s", "token_embd.weight missing or bad");
        goto err_free;
    }
    m->vocab = (uint32_t)te->ne[1];
    if ((st = ll_bind_mat(m, "token_embd.weight", m->vocab, m->n_embd, 0, &m->tok_embd,
                          err, err_len)))
        goto err_free;
    st = ll_bind_mat(m, "output.weight", m->vocab, m->n_embd, 1, &m->output, err, err_len);
    if (st == PD_ERR_NOT_FOUND)
        m->output = m->tok_embd; /* tied */
    else if (st != PD_OK)
        goto err_free;
    if ((st = ll_load_vec(m, "output_norm.weight", m->n_embd, 0, &m->out_norm, err, err_len)))
        goto err_free;
    m->layers = calloc(m->n_layers, sizeof(*m->layers));
    if (!m->layers) {
        st = PD_ERR_NO_MEMORY;
        goto err_free;
    }
    if ((st = ll_load_layers(m, err, err_len)))
        goto err_free;

    m->inv_freq = calloc(m->rope_dim / 2 + 1, sizeof(double));
    if (!m->inv_freq) {
        st = PD_ERR_NO_MEMORY;
        goto err_free;
    }
    for (uint32_t i = 0; i < m->rope_dim / 2; i++)
        m->inv_freq[i] = pow((double)m->rope_base, -(double)(2 * i) / (double)m->rope_dim);
    if ((st = ll_rope_scaling(m, arch, err, err_len)))
        goto err_free;
    if (m->n_swa) { /* gemma3 local layers: their own base, no scaling */
        m->inv_freq_swa = calloc(m->rope_dim / 2 + 1, sizeof(double));
        if (!m->inv_freq_swa) {
            st = PD_ERR_NO_MEMORY;
            goto err_free;
        }
        for (uint32_t i = 0; i < m->rope_dim / 2; i++)
            m->inv_freq_swa[i] = pow((double)m->rope_base_swa,
                                     -(double)(2 * i) / (double)m->rope_dim);
    }
    m->embd_scale = m->arch == LL_ARCH_GEMMA3 ? sqrtf((float)m->n_embd) : 1.0f;
    /* gemma3: 1/sqrt(n_embd/n_head) for the 62-layer (27B) model, as llama.cpp */
    m->att_scale = 1.0f / sqrtf((float)(m->arch == LL_ARCH_GEMMA3 && m->n_layers == 62
                                            ? m->n_embd / m->n_heads : m->head_dim));

    /* sizes */
    for (uint64_t i = 0; i < gguf_tensor_count(m->gguf); i++)
        m->n_params += gguf_tensor_at(m->gguf, i)->n_elements;
    m->weight_bytes_per_token = (uint64_t)m->output.row_bytes * m->output.rows;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        const ll_layer_t *L = &m->layers[l];
        const eng_ll_tensor_t *ws[] = { &L->wq, &L->wk, &L->wv, &L->wo,
                                        &L->w_gate, &L->w_up, &L->w_down };
        for (size_t j = 0; j < sizeof(ws) / sizeof(ws[0]); j++) {
            uint64_t b = (uint64_t)ws[j]->row_bytes * ws[j]->rows;
            if (j >= 4 && m->n_expert) /* only the chosen experts are read */
                b = b / m->n_expert * m->n_expert_used;
            m->weight_bytes_per_token += b;
        }
        if (m->n_expert)
            m->weight_bytes_per_token += (uint64_t)L->w_router.row_bytes * L->w_router.rows;
    }

    eng_kv_geom_t *g = &m->geom;
    g->n_layers = m->n_layers;
    g->n_kv_heads = m->n_kv_heads;
    g->head_dim = m->head_dim;
    g->block_tokens = opts->block_tokens ? opts->block_tokens : LL_DEFAULT_BLOCK_TOKENS;
    g->kv_dtype = opts->kv_dtype;
    g->kv_dtype_v = eng_load_kv_dtype_v(opts);
    for (int kv = 0; kv < 2; kv++) {
        eng_kv_dtype_t dt = kv ? g->kv_dtype_v : g->kv_dtype;
        if (m->head_dim % eng_kv_dtype_align(dt)) {
            snprintf(err, err_len, "kv-dtype %s needs head_dim a multiple of %u (this model: %u); "
                     "use kv-dtype f16", eng_kv_dtype_name(dt), eng_kv_dtype_align(dt), m->head_dim);
            st = PD_ERR_BAD_INPUT;
            goto err_free;
        }
    }
    m->kv_row_bytes = (size_t)eng_kv_row_bytes(g->kv_dtype, m->kv_dim);
    m->kv_row_bytes_v = (size_t)eng_kv_row_bytes(g->kv_dtype_v, m->kv_dim);
    g->bytes_per_token = (uint64_t)m->n_layers * (m->kv_row_bytes + m->kv_row_bytes_v);
    g->block_bytes = g->block_tokens * g->bytes_per_token;
    g->layer_block_bytes = g->block_bytes / m->n_layers;
    g->vocab_size = m->vocab;
    g->context_length = ctx_len;
    g->n_embd = m->n_embd;
    g->pooling = -1;
    uint32_t pool = UINT32_MAX;
    if ((st = ll_get_u32(m->gguf, arch, "pooling_type", &pool, 0, err, err_len)))
        goto err_free;
    if (pool != UINT32_MAX)
        g->pooling = pool <= ENG_POOL_LAST ? (int32_t)pool : ENG_POOL_NONE; /* rank etc.: none */
    g->compat_hash = ll_compat_hash(m);
    m->lay = eng_kv_layout_block_major(g);
    /* after the hash (which reads every byte): packing releases the rows
     * it copies from the file mapping */
    if ((st = ll_pack_weights(m))) {
        snprintf(err, err_len, "packing the weights for the integer-dot kernel: %s",
                 pd_status_str(st));
        goto err_free;
    }

    m->n_threads = opts->n_threads ? opts->n_threads : ll_online_cores();
    if (m->n_threads > LL_MAX_THREADS)
        m->n_threads = LL_MAX_THREADS;
    uint32_t mb = opts->max_batch ? opts->max_batch : LL_DEFAULT_MAX_BATCH;
    if (mb > 1024)
        mb = 1024;
    m->t_max = mb > LL_PREFILL_CHUNK ? mb : LL_PREFILL_CHUNK;
    if ((st = ll_alloc_buffers(m)))
        goto err_free;
    if ((st = eng_ll_pool_create(m->n_threads, &m->pool)))
        goto err_free;
    *model_p = m;
    return PD_OK;
err_free:
    ll_free(m);
    return st;
}

static void ll_destroy(eng_model_t *m)
{
    ll_free(m);
}

static const eng_kv_geom_t *ll_geometry(const eng_model_t *m)
{
    return &m->geom;
}

static void ll_describe(const eng_model_t *m, char *buf, size_t len)
{
    (void)m; /* one path for the process (PD_QDOT, the CPU) */
    eng_ll_qdot_describe(buf, len);
}

void eng_llama_info(const eng_model_t *m, eng_llama_info_t *info)
{
    memset(info, 0, sizeof(*info));
    info->arch = ll_arch_names[m->arch];
    info->n_embd = m->n_embd;
    info->n_layers = m->n_layers;
    info->n_heads = m->n_heads;
    info->n_kv_heads = m->n_kv_heads;
    info->head_dim = m->head_dim;
    info->n_ff = m->n_ff;
    info->vocab = m->vocab;
    info->rope_dim = m->rope_dim;
    info->rope_base = m->rope_base;
    info->rms_eps = m->rms_eps;
    info->weight_type = m->layers[0].wq.type;
    info->n_params = m->n_params;
    info->weight_bytes_per_token = m->weight_bytes_per_token;
    info->n_threads = m->n_threads;
    info->isa = eng_ll_isa();
    info->ep_rank = m->ep_rank;
    info->ep_size = m->ep_size;
    info->expert_bytes_owned = m->expert_bytes_owned;
    info->expert_bytes_total = m->expert_bytes_total;
    info->step_rows = LL_STEP_ROWS(m);
    if (m->n_expert) {
        uint32_t K = m->n_expert_used;
        info->ep_cap[ENG_EP_DISPATCH] = eng_ep_dispatch_bytes(m->t_max, m->t_max * K, m->n_embd);
        info->ep_cap[ENG_EP_COMBINE] = eng_ep_combine_bytes(m->t_max * K, m->n_embd);
    }
}

/* ------------------------------------------------------------------ */
/* forward                                                             */

/* Byte offset of (layer, K|V, pos, kv head 0) within the arena. */
static inline size_t ll_kv_off(const eng_model_t *m, const ll_tok_t *t, uint32_t pos,
                               uint32_t layer, uint32_t kv)
{
    const eng_kv_geom_t *g = &m->geom;
    uint32_t blk = t->bt[pos / g->block_tokens];
    uint32_t slot = pos % g->block_tokens;
    return (size_t)blk * m->lay.block_stride + (size_t)layer * m->lay.layer_stride +
           (kv ? (size_t)g->block_tokens * m->kv_row_bytes + slot * m->kv_row_bytes_v
               : (size_t)slot * m->kv_row_bytes);
}

static void ll_rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps)
{
    double ss = 0.0;
    for (uint32_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (uint32_t i = 0; i < n; i++)
        out[i] = x[i] * scale * w[i];
}

/* Rotate one head in place; cs = (rope_dim/2, 2) cos/sin for its position. */
static void ll_rope(const eng_model_t *m, float *h, const float *cs)
{
    uint32_t half = m->rope_dim / 2;
    if (m->neox) { /* NEOX: pairs (i, i + rope_dim/2) */
        for (uint32_t i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float a = h[i], b = h[i + half];
            h[i] = a * c - b * s;
            h[i + half] = a * s + b * c;
        }
    } else { /* Meta layout: adjacent pairs (2i, 2i+1) */
        for (uint32_t i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float a = h[2 * i], b = h[2 * i + 1];
            h[2 * i] = a * c - b * s;
            h[2 * i + 1] = a * s + b * c;
        }
    }
}

typedef struct {
    eng_model_t *m;
    uint8_t *arena;
    const ll_tok_t *toks;
    uint32_t n;
    uint32_t layer;
    int swa;
    /* the tiled path: tile i is toks [att_tile[i], att_tile[i+1]), each
     * tile cut in n_kv_heads x hsplit chunks */
    uint32_t n_tiles, hsplit;
} ll_att_ctx_t;

int eng_ll_att_tiled_g = -1;

static int ll_att_tiled(void)
{
    if (eng_ll_att_tiled_g < 0) {
        const char *e = getenv("PD_ATT");
        eng_ll_att_tiled_g = !(e && strcmp(e, "rows") == 0);
    }
    return eng_ll_att_tiled_g;
}

/* Softmax of one query's scores scl[lo .. n_pos), scaled (both attention
 * paths): the scale / max, the engine's exp with the sum in its canonical
 * lanes, and the 1/sum scaling, each the same bits on every ISA path. */
static inline void ll_softmax(float *scl, uint32_t lo, uint32_t n_pos, float scale)
{
    float mx = eng_ll_scale_max(scl + lo, n_pos - lo, scale);
    float inv = 1.0f / eng_ll_exp_sum(scl + lo, n_pos - lo, mx);
    eng_ll_scale(scl + lo, n_pos - lo, inv);
}

/* First position a query at n_pos attends to (sliding-window layers:
 * positions (pos - n_swa, pos] only). */
static inline uint32_t ll_att_lo(const eng_model_t *m, int swa, uint32_t n_pos)
{
    return swa && n_pos > m->n_swa ? n_pos - m->n_swa : 0;
}

/* Attention for one (token, head) pair per chunk (PD_ATT=rows). */
static void ll_att_task(void *arg, uint32_t chunk, uint32_t tid)
{
    const ll_att_ctx_t *c = arg;
    const eng_model_t *m = c->m;
    const uint32_t hd = m->head_dim, group = m->n_heads / m->n_kv_heads;
    const float scale = m->att_scale;
    float *sc = m->att_scratch[tid];
    const eng_kv_dtype_t dk = m->geom.kv_dtype, dv = m->geom.kv_dtype_v;

    {
        uint32_t ti = chunk / m->n_heads, h = chunk % m->n_heads;
        const ll_tok_t *t = &c->toks[ti];
        const float *q = m->q + (size_t)ti * m->q_dim + (size_t)h * hd;
        float *out = m->att + (size_t)ti * m->q_dim + (size_t)h * hd;
        /* byte offsets: a token's K (V) row is rowk (rowv) bytes, its kv
         * head's values start hoffk (hoffv) bytes in (block formats: whole
         * blocks, head_dim a multiple of 32); the V rows follow btk K rows */
        const size_t rowk = m->kv_row_bytes, rowv = m->kv_row_bytes_v;
        const size_t hoffk = (size_t)(h / group) * (size_t)eng_kv_row_bytes(dk, hd);
        const size_t hoffv = (size_t)(h / group) * (size_t)eng_kv_row_bytes(dv, hd);
        const uint32_t btk = m->geom.block_tokens;
        const size_t blk_bytes = m->lay.block_stride;
        const size_t loff = (size_t)c->layer * m->lay.layer_stride;
        const size_t koff = loff + hoffk;
        const size_t voff = loff + (size_t)btk * rowk + hoffv;
        const uint32_t n_pos = t->pos + 1;
        /* sliding-window layer: positions (pos - n_swa, pos] only */
        const uint32_t lo = c->swa && n_pos > m->n_swa ? n_pos - m->n_swa : 0;
        float *scl = sc - lo; /* scl[s] for s in [lo, n_pos) */
        /* scores, one KV block (a run of contiguous slots) at a time */
        for (uint32_t s0 = lo; s0 < n_pos;) {
            uint32_t cnt = btk - s0 % btk;
            if (cnt > n_pos - s0)
                cnt = n_pos - s0;
            size_t base = (size_t)t->bt[s0 / btk] * blk_bytes + (size_t)(s0 % btk) * rowk + koff;
            eng_ll_kv_dot_rows(dk, c->arena + base, rowk, cnt, q, hd, scl + s0);
            s0 += cnt;
        }
        ll_softmax(scl, lo, n_pos, scale);
        memset(out, 0, hd * sizeof(float));
        for (uint32_t s0 = lo; s0 < n_pos;) {
            uint32_t cnt = btk - s0 % btk;
            if (cnt > n_pos - s0)
                cnt = n_pos - s0;
            size_t base = (size_t)t->bt[s0 / btk] * blk_bytes + (size_t)(s0 % btk) * rowv + voff;
            eng_ll_kv_axpy_rows(dv, out, scl + s0, c->arena + base, rowv, cnt, hd);
            s0 += cnt;
        }
    }
}

/* Attention for one tile per chunk (the default): tokens [t0, t1) of one
 * sequence at consecutive positions, times heads [g0, g1) of one KV head's
 * group; query (t, g) is row t * ng + g of the tile's Q, S (scores, a row
 * of att_srow floats from position `base`) and O. The K (then V) rows are
 * walked once in segments [s, e) inside one KV block where the set of
 * queries that attend to them is constant (tokens [ta, tb): causal tails
 * and sliding windows are ragged), each segment one multi-query kernel
 * call. Per query: the same dots, the same softmax, the same fma chain in
 * position order as ll_att_task, so the same bits. */
static void ll_att_tile_task(void *arg, uint32_t chunk, uint32_t tid)
{
    const ll_att_ctx_t *c = arg;
    const eng_model_t *m = c->m;
    const uint32_t hd = m->head_dim, group = m->n_heads / m->n_kv_heads;
    const uint32_t per_tile = m->n_kv_heads * c->hsplit;
    /* the last tiles (the longest rows) first: the pool claims chunks in
     * order, so the cheap ones are left to even the threads out */
    const uint32_t tile = c->n_tiles - 1 - chunk / per_tile, kvh = chunk % per_tile / c->hsplit;
    const uint32_t part = chunk % c->hsplit;
    const uint32_t g0 = part * group / c->hsplit, g1 = (part + 1) * group / c->hsplit;
    const uint32_t ng = g1 - g0;
    const uint32_t t0 = m->att_tile[tile], nt = m->att_tile[tile + 1] - t0;
    const ll_tok_t *tk = c->toks + t0;
    const uint32_t *bt = tk[0].bt;
    const eng_kv_dtype_t dk = m->geom.kv_dtype, dv = m->geom.kv_dtype_v;
    const size_t srow = m->att_srow;
    float *S = m->att_scratch[tid];
    float *Q = S + (size_t)m->att_nq_max * srow, *O = Q + (size_t)m->att_nq_max * hd;
    const size_t rowk = m->kv_row_bytes, rowv = m->kv_row_bytes_v;
    const uint32_t btk = m->geom.block_tokens;
    const size_t blk_bytes = m->lay.block_stride;
    const size_t loff = (size_t)c->layer * m->lay.layer_stride;
    const size_t koff = loff + (size_t)kvh * (size_t)eng_kv_row_bytes(dk, hd);
    const size_t voff = loff + (size_t)btk * rowk + (size_t)kvh * (size_t)eng_kv_row_bytes(dv, hd);

    for (uint32_t t = 0; t < nt; t++)
        memcpy(Q + (size_t)t * ng * hd,
               m->q + (size_t)(t0 + t) * m->q_dim + (size_t)(kvh * group + g0) * hd,
               (size_t)ng * hd * sizeof(float));
    const uint32_t base = ll_att_lo(m, c->swa, tk[0].pos + 1), end = tk[nt - 1].pos + 1;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            for (uint32_t t = 0; t < nt; t++) {
                const uint32_t n_pos = tk[t].pos + 1, lo = ll_att_lo(m, c->swa, n_pos);
                for (uint32_t g = 0; g < ng; g++)
                    ll_softmax(S + (size_t)(t * ng + g) * srow - base, lo, n_pos, m->att_scale);
            }
            memset(O, 0, (size_t)nt * ng * hd * sizeof(float));
        }
        uint32_t ta = 0, tb = 0;
        for (uint32_t s = base; s < end;) {
            while (tk[ta].pos + 1 <= s)
                ta++;                   /* first token still attending at s */
            while (tb < nt && ll_att_lo(m, c->swa, tk[tb].pos + 1) <= s)
                tb++;                   /* tokens [0, tb) attend from <= s */
            uint32_t e = (s / btk + 1) * btk;
            if (e > tk[ta].pos + 1)
                e = tk[ta].pos + 1;
            if (tb < nt && e > ll_att_lo(m, c->swa, tk[tb].pos + 1))
                e = ll_att_lo(m, c->swa, tk[tb].pos + 1);
            if (ta < tb) {
                const uint32_t nq = (tb - ta) * ng;
                float *sq = S + (size_t)ta * ng * srow + (s - base);
                size_t blk = (size_t)bt[s / btk] * blk_bytes;
                if (pass == 0)
                    eng_ll_kv_dot_rows_multi(dk, c->arena + blk + (size_t)(s % btk) * rowk + koff,
                                             rowk, e - s, Q + (size_t)ta * ng * hd, hd, nq, hd,
                                             sq, srow);
                else
                    eng_ll_kv_axpy_rows_multi(dv, O + (size_t)ta * ng * hd, hd, sq, srow, nq,
                                              c->arena + blk + (size_t)(s % btk) * rowv + voff,
                                              rowv, e - s, hd);
            }
            s = e;
        }
    }
    for (uint32_t t = 0; t < nt; t++)
        memcpy(m->att + (size_t)(t0 + t) * m->q_dim + (size_t)(kvh * group + g0) * hd,
               O + (size_t)t * ng * hd, (size_t)ng * hd * sizeof(float));
}

/* The tiled path's tiles for a pass (m->att_tile) and how many parts each
 * KV head's group is cut in: runs of one sequence at consecutive
 * positions, at most att_tile_max tokens, fewer (then group parts) while
 * the pass would give the active threads under LL_ATT_CHUNKS chunks each
 * (a thread that loses its core to a neighbour holds one chunk up). Only
 * the speed depends on the cut. */
static void ll_att_plan(eng_model_t *m, const ll_tok_t *toks, uint32_t n, ll_att_ctx_t *ac)
{
    const uint32_t want = LL_ATT_CHUNKS * eng_ll_pool_active(m->pool);
    const uint32_t group = m->n_heads / m->n_kv_heads;
    for (uint32_t tmax = m->att_tile_max;; tmax /= 2) {
        uint32_t nt = 0;
        for (uint32_t i = 0; i < n; i++)
            if (i == 0 || toks[i].bt != toks[i - 1].bt || toks[i].pos != toks[i - 1].pos + 1 ||
                i - m->att_tile[nt - 1] >= tmax)
                m->att_tile[nt++] = i;
        m->att_tile[nt] = n;
        ac->n_tiles = nt;
        if (tmax <= 1 || (uint64_t)nt * m->n_kv_heads >= want)
            break;
    }
    uint32_t hs = 1;
    while (hs < group && (uint64_t)ac->n_tiles * m->n_kv_heads * hs < want)
        hs++;
    ac->hsplit = hs;
}

typedef struct {
    eng_model_t *m;
    uint32_t n;
    uint32_t width;              /* n_ff or n_ff_exp */
} ll_swiglu_ctx_t;

/* act(gate) * up for one token per chunk: SiLU, or GELU (tanh form, as
 * ggml_gelu) for gemma3. */
static void ll_swiglu_task(void *arg, uint32_t chunk, uint32_t tid)
{
    const ll_swiglu_ctx_t *c = arg;
    size_t i0 = (size_t)chunk * c->width, i1 = i0 + c->width;
    float *g = c->m->hb;
    const float *u = c->m->hb2;
    if (c->m->arch == LL_ARCH_GEMMA3) {
        for (size_t i = i0; i < i1; i++) {
            float x = g[i];
            g[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x *
                                            (1.0f + 0.044715f * x * x))) * u[i];
        }
        return;
    }
    eng_ll_silu_mul(g + i0, u + i0, c->width);
}

static void ll_act(eng_model_t *m, uint32_t n, uint32_t width)
{
    ll_swiglu_ctx_t sc = { m, n, width };
    if ((uint64_t)n * width < (1u << 14))
        for (uint32_t c = 0; c < n; c++)
            ll_swiglu_task(&sc, c, 0);
    else
        eng_ll_pool_run(m->pool, ll_swiglu_task, &sc, n);
}

/* A view of matrix e of a stacked (n_mat * rows, cols) tensor. */
static eng_ll_tensor_t ll_sub(const eng_ll_tensor_t *t, uint32_t e, uint32_t rows)
{
    return eng_ll_rows_view(t, e * rows, rows);
}

/* Routed experts (qwen3moe) over xb (n tokens) -> xb2. Router: softmax over
 * all experts, the top n_expert_used (ties: lower id), weights renormalized
 * to sum 1. Each expert runs once over the tokens that chose it (each a
 * canonical per-item matmul); a token's result is then summed in its own
 * rank order, so it never depends on which other tokens are in the pass. */
/* Route tokens [i0, i0 + n) (their normed rows in m->xb): each one's top-k
 * experts and weights (m->sel, m->selw, row-indexed). */
static void ll_moe_route_rows(eng_model_t *m, const ll_layer_t *L, uint32_t i0, uint32_t n)
{
    const uint32_t E = m->n_embd, K = m->n_expert_used, NE = m->n_expert;
    float *const *scr = m->mm_scratch;
    if (n == 0)
        return;
    eng_ll_matmul_t rt = {
        .qx = m->mm_qx,
        .n_mats = 1, .w = { &L->w_router }, .out = { m->router + (size_t)i0 * NE },
        .out_stride = { NE }, .x = m->xb + (size_t)i0 * E, .x_stride = E, .n_items = n,
    };
    eng_ll_matmul(m->pool, &rt, scr);
    for (uint32_t i = i0; i < i0 + n; i++) {
        const float *r = m->router + (size_t)i * NE;
        int32_t *sel = m->sel + (size_t)i * K;
        float *w = m->selw + (size_t)i * K;
        float mx = -INFINITY;
        for (uint32_t e = 0; e < NE; e++)
            mx = r[e] > mx ? r[e] : mx;
        double tot = 0.0;
        for (uint32_t e = 0; e < NE; e++)
            tot += exp((double)r[e] - mx);
        for (uint32_t k = 0; k < K; k++) { /* selection by logit = by probability */
            int32_t best = -1;
            for (uint32_t e = 0; e < NE; e++) {
                int used = 0;
                for (uint32_t j = 0; j < k; j++)
                    used |= sel[j] == (int32_t)e;
                if (!used && (best < 0 || r[e] > r[best]))
                    best = (int32_t)e;
            }
            sel[k] = best;
            w[k] = (float)(exp((double)r[best] - mx) / tot);
        }
        float ws = 0.0f;
        for (uint32_t k = 0; k < K; k++)
            ws += w[k];
        for (uint32_t k = 0; k < K; k++)
            w[k] /= ws;
    }
}

static void ll_moe_route(eng_model_t *m, const ll_layer_t *L, uint32_t n)
{
    ll_moe_route_rows(m, L, 0, n);
}

/* Expert `e` (a local index into this model's w_gate/w_up/w_down) over the
 * cnt <= t_max rows in m->ex -> m->ex. Each row's result is the canonical
 * per-item matmul of that row alone (ll_kern.h): it does not depend on
 * which or how many rows share the call. */
static void ll_expert(eng_model_t *m, const ll_layer_t *L, uint32_t e, uint32_t cnt)
{
    const uint32_t E = m->n_embd, F = m->n_ff_exp;
    float *const *scr = m->mm_scratch;
    eng_ll_tensor_t g = ll_sub(&L->w_gate, e, F), u = ll_sub(&L->w_up, e, F);
    eng_ll_tensor_t d = ll_sub(&L->w_down, e, E);
    eng_ll_matmul_t gu = {
        .qx = m->mm_qx,
        .n_mats = 2, .w = { &g, &u }, .out = { m->hb, m->hb2 }, .out_stride = { F, F },
        .x = m->ex, .x_stride = E, .n_items = cnt,
    };
    eng_ll_matmul(m->pool, &gu, scr);
    ll_act(m, cnt, F);
    eng_ll_matmul_t dn = {
        .qx = m->mm_qx,
        .n_mats = 1, .w = { &d }, .out = { m->ex }, .out_stride = { E },
        .x = m->hb, .x_stride = F, .n_items = cnt,
    };
    eng_ll_matmul(m->pool, &dn, scr);
}

static void ll_moe(eng_model_t *m, const ll_layer_t *L, uint32_t n)
{
    const uint32_t E = m->n_embd, K = m->n_expert_used, NE = m->n_expert;
    ll_moe_route(m, L, n);
    for (uint32_t e = 0; e < NE; e++) {
        uint32_t cnt = 0;
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t k = 0; k < K; k++)
                if (m->sel[(size_t)i * K + k] == (int32_t)e) {
                    m->erows[cnt] = i * K + k; /* (token, rank) slot */
                    memcpy(m->ex + (size_t)cnt * E, m->xb + (size_t)i * E, E * sizeof(float));
                    cnt++;
                }
        if (cnt == 0)
            continue;
        ll_expert(m, L, e, cnt);
        for (uint32_t j = 0; j < cnt; j++)
            memcpy(m->eout + (size_t)m->erows[j] * E, m->ex + (size_t)j * E, E * sizeof(float));
    }
    for (uint32_t i = 0; i < n; i++) {
        float *y = m->xb2 + (size_t)i * E;
        const float *w = m->selw + (size_t)i * K;
        for (uint32_t c = 0; c < E; c++) {
            float acc = 0.0f;
            for (uint32_t k = 0; k < K; k++)
                acc += w[k] * m->eout[((size_t)i * K + k) * E + c];
            y[c] = acc;
        }
    }
}

/* ll_moe across an EP group (m->ep_size > 1): route this rank's n tokens,
 * dispatch (rows + (row, expert) pairs to each owning rank, itself
 * included), run this rank's experts over every row received (chunks of
 * t_max rows, sources in rank order; each row's bits independent of the
 * others), combine (outputs back in the sender's pair order), then sum each
 * token's top-k in k order with its router weights exactly as ll_moe: the
 * same bits as the whole model. Message layout: eng.h "Expert parallelism".
 * Every length and index a peer states is checked before use. A transport
 * error is kept in m->ep_status (the pass's later layers are skipped).
 * With ep_two a pass runs as two micro-batches (ll_layers_two), each with
 * its own dispatch and combine (phases 2, 3 for the second); the pieces
 * below serve both. */

/* Half h's dispatch messages (tokens [i0, i1)) into phase ENG_EP_DISPATCH +
 * 2h; m->ep_len their bytes. */
static void ll_ep_dispatch_build(eng_model_t *m, uint32_t h, uint32_t i0, uint32_t i1)
{
    const uint32_t E = m->n_embd, K = m->n_expert_used, N = m->ep_size;
    const size_t rowb = (size_t)E * sizeof(float);
    for (uint32_t p = 0; p < N; p++) {
        uint8_t *b = m->ep.send_buf(m->ep.ctx, (eng_ep_phase_t)(ENG_EP_DISPATCH + 2 * h), p);
        uint32_t n_rows = 0, n_pairs = 0;
        for (uint32_t i = i0; i < i1; i++) {
            m->ep_row[i] = -1;
            for (uint32_t k = 0; k < K; k++)
                if ((uint32_t)m->sel[(size_t)i * K + k] / m->ep_ne == p) {
                    if (m->ep_row[i] < 0)
                        m->ep_row[i] = (int32_t)n_rows++;
                    n_pairs++;
                }
        }
        uint32_t *pr = (void *)(b + 8);
        float *rows = (void *)(b + 8 + (size_t)n_pairs * 8);
        uint32_t j = 0;
        for (uint32_t i = i0; i < i1; i++) {
            if (m->ep_row[i] < 0)
                continue;
            memcpy(rows + (size_t)m->ep_row[i] * E, m->xb + (size_t)i * E, rowb);
            for (uint32_t k = 0; k < K; k++) {
                uint32_t e = (uint32_t)m->sel[(size_t)i * K + k];
                if (e / m->ep_ne != p)
                    continue;
                m->ep_pair[(size_t)i * K + k] = j;
                pr[2 * j] = (uint32_t)m->ep_row[i];
                pr[2 * j + 1] = e;
                j++;
            }
        }
        memcpy(b, &n_rows, 4);
        memcpy(b + 4, &n_pairs, 4);
        m->ep_npairs[(size_t)h * N + p] = n_pairs;
        m->ep_len[p] = eng_ep_dispatch_bytes(n_rows, n_pairs, E);
    }
}

/* Half h's received dispatch (recv): validated, then this rank's experts
 * over every row, outputs into phase ENG_EP_COMBINE + 2h; m->ep_len the
 * combine messages' bytes. */
static pd_status_t ll_ep_experts(eng_model_t *m, const ll_layer_t *L, uint32_t h,
                                 const void **recv, const size_t *recv_len)
{
    const uint32_t E = m->n_embd, K = m->n_expert_used, N = m->ep_size;
    const size_t rowb = (size_t)E * sizeof(float);
    /* validate every message before computing anything */
    for (uint32_t p = 0; p < N; p++) {
        const uint8_t *b = recv[p];
        uint32_t n_rows, n_pairs;
        if (recv_len[p] < 8)
            return PD_ERR_BAD_INPUT;
        memcpy(&n_rows, b, 4);
        memcpy(&n_pairs, b + 4, 4);
        if (n_rows > m->t_max || n_pairs > m->t_max * K || n_rows > n_pairs ||
            recv_len[p] != eng_ep_dispatch_bytes(n_rows, n_pairs, E))
            return PD_ERR_BAD_INPUT;
        for (uint32_t j = 0; j < n_pairs; j++) {
            uint32_t pr[2];
            memcpy(pr, b + 8 + (size_t)j * 8, 8);
            if (pr[0] >= n_rows || pr[1] < m->ep_e0 || pr[1] >= m->ep_e0 + m->ep_ne)
                return PD_ERR_BAD_INPUT;
        }
    }
    /* this rank's experts over every row received */
    for (uint32_t le = 0; le < m->ep_ne; le++) {
        uint32_t cnt = 0;
        for (uint32_t p = 0; p < N; p++) {
            const uint8_t *b = recv[p];
            uint32_t n_pairs;
            memcpy(&n_pairs, b + 4, 4);
            for (uint32_t j = 0; j < n_pairs; j++) {
                uint32_t e;
                memcpy(&e, b + 8 + (size_t)j * 8 + 4, 4);
                if (e != m->ep_e0 + le)
                    continue;
                if (cnt == m->t_max * N) /* a token chooses an expert once */
                    return PD_ERR_BAD_INPUT;
                m->ep_gather[cnt++] = p << 24 | j;
            }
        }
        for (uint32_t c0 = 0; c0 < cnt; c0 += m->t_max) {
            uint32_t cn = cnt - c0 < m->t_max ? cnt - c0 : m->t_max;
            for (uint32_t r = 0; r < cn; r++) {
                uint32_t p = m->ep_gather[c0 + r] >> 24, j = m->ep_gather[c0 + r] & 0xffffff;
                const uint8_t *b = recv[p];
                uint32_t n_pairs, row;
                memcpy(&n_pairs, b + 4, 4);
                memcpy(&row, b + 8 + (size_t)j * 8, 4);
                memcpy(m->ex + (size_t)r * E, b + 8 + (size_t)n_pairs * 8 + (size_t)row * rowb,
                       rowb);
            }
            ll_expert(m, L, le, cn);
            for (uint32_t r = 0; r < cn; r++) {
                uint32_t p = m->ep_gather[c0 + r] >> 24, j = m->ep_gather[c0 + r] & 0xffffff;
                uint8_t *cb = m->ep.send_buf(m->ep.ctx, (eng_ep_phase_t)(ENG_EP_COMBINE + 2 * h),
                                             p);
                memcpy(cb + (size_t)j * rowb, m->ex + (size_t)r * E, rowb);
            }
        }
    }
    for (uint32_t p = 0; p < N; p++) {
        uint32_t n_pairs;
        memcpy(&n_pairs, (const uint8_t *)recv[p] + 4, 4);
        m->ep_len[p] = eng_ep_combine_bytes(n_pairs, E);
    }
    return PD_OK;
}

/* Half h's combine (crecv): each of tokens [i0, i1)'s top-k in k order, as
 * ll_moe. */
static pd_status_t ll_ep_sum(eng_model_t *m, uint32_t h, uint32_t i0, uint32_t i1,
                             const void **crecv, const size_t *crecv_len)
{
    const uint32_t E = m->n_embd, K = m->n_expert_used, N = m->ep_size;
    for (uint32_t p = 0; p < N; p++)
        if (crecv_len[p] != eng_ep_combine_bytes(m->ep_npairs[(size_t)h * N + p], E))
            return PD_ERR_BAD_INPUT;
    for (uint32_t i = i0; i < i1; i++) {
        float *y = m->xb2 + (size_t)i * E;
        const float *w = m->selw + (size_t)i * K;
        const float *o[LL_MAX_EXPERTS_USED];
        for (uint32_t k = 0; k < K; k++) {
            uint32_t p = (uint32_t)m->sel[(size_t)i * K + k] / m->ep_ne;
            o[k] = (const float *)crecv[p] + (size_t)m->ep_pair[(size_t)i * K + k] * E;
        }
        for (uint32_t c = 0; c < E; c++) {
            float acc = 0.0f;
            for (uint32_t k = 0; k < K; k++)
                acc += w[k] * o[k][c];
            y[c] = acc;
        }
    }
    return PD_OK;
}

static void ll_moe_ep(eng_model_t *m, const ll_layer_t *L, uint32_t layer, uint32_t n)
{
    pd_status_t st;
    ll_moe_route(m, L, n);
    ll_ep_dispatch_build(m, 0, 0, n);
    if ((st = m->ep.exchange(m->ep.ctx, ENG_EP_DISPATCH, layer, m->ep_len, m->ep_recv,
                             m->ep_recv_len)) != PD_OK ||
        (st = ll_ep_experts(m, L, 0, m->ep_recv, m->ep_recv_len)) != PD_OK ||
        (st = m->ep.exchange(m->ep.ctx, ENG_EP_COMBINE, layer, m->ep_len, m->ep_crecv,
                             m->ep_crecv_len)) != PD_OK ||
        (st = ll_ep_sum(m, 0, 0, n, m->ep_crecv, m->ep_crecv_len)) != PD_OK)
        m->ep_status = st;
}

/* One attention call's context and how to run it (ll_att_prepare). */
typedef struct {
    ll_att_ctx_t ac;
    uint64_t work;               /* positions x heads: tiny passes stay inline */
    eng_ll_pool_fn fn;
    uint32_t chunks;
} ll_att_run_t;

/* Attention over toks[0..n) (their q rows from m->q's row 0): the tiled
 * plan (m->att_tile: the last prepared call's) or one chunk per (token,
 * head). */
static void ll_att_prepare(eng_model_t *m, uint8_t *arena, const ll_tok_t *toks, uint32_t n,
                           ll_att_run_t *r)
{
    r->ac = (ll_att_ctx_t){ m, arena, toks, n, 0, 0, 0, 1 };
    r->work = 0;
    for (uint32_t i = 0; i < n; i++)
        r->work += (uint64_t)(toks[i].pos + 1) * m->n_heads * m->head_dim;
    r->fn = ll_att_task;
    r->chunks = n * m->n_heads;
    if (n > 0 && ll_att_tiled()) {
        ll_att_plan(m, toks, n, &r->ac);
        r->fn = ll_att_tile_task;
        r->chunks = r->ac.n_tiles * m->n_kv_heads * r->ac.hsplit;
    }
}

/* Layer l's start for the pass's tokens [i0, i0 + n) (rows of m->x,
 * m->xb): attention norm, QKV into m->q/k/v from row 0, biases, q/k
 * norms, RoPE, the KV write. */
static void ll_layer_qkv(eng_model_t *m, uint8_t *arena, const ll_layer_t *L, uint32_t l,
                         const ll_tok_t *toks, uint32_t i0, uint32_t n)
{
    const uint32_t E = m->n_embd, half = m->rope_dim / 2;
    float *const *scr = m->mm_scratch;
    for (uint32_t i = i0; i < i0 + n; i++)
        ll_rmsnorm(m->xb + (size_t)i * E, m->x + (size_t)i * E, L->attn_norm, E, m->rms_eps);
    eng_ll_matmul_t qkv = {
        .qx = m->mm_qx,
        .n_mats = 3, .w = { &L->wq, &L->wk, &L->wv },
        .out = { m->q, m->k, m->v },
        .out_stride = { m->q_dim, m->kv_dim, m->kv_dim },
        .x = m->xb + (size_t)i0 * E, .x_stride = E, .n_items = n,
    };
    if (n > 0)
        eng_ll_matmul(m->pool, &qkv, scr);

    /* bias, RoPE, KV write */
    for (uint32_t r = 0; r < n; r++) {
        const uint32_t i = i0 + r;
        float *q = m->q + (size_t)r * m->q_dim;
        float *k = m->k + (size_t)r * m->kv_dim;
        float *v = m->v + (size_t)r * m->kv_dim;
        if (L->bq)
            for (uint32_t j = 0; j < m->q_dim; j++)
                q[j] += L->bq[j];
        if (L->bk)
            for (uint32_t j = 0; j < m->kv_dim; j++)
                k[j] += L->bk[j];
        if (L->bv)
            for (uint32_t j = 0; j < m->kv_dim; j++)
                v[j] += L->bv[j];
        if (L->q_norm) {
            for (uint32_t h = 0; h < m->n_heads; h++)
                ll_rmsnorm(q + (size_t)h * m->head_dim, q + (size_t)h * m->head_dim,
                           L->q_norm, m->head_dim, m->rms_eps);
            for (uint32_t h = 0; h < m->n_kv_heads; h++)
                ll_rmsnorm(k + (size_t)h * m->head_dim, k + (size_t)h * m->head_dim,
                           L->k_norm, m->head_dim, m->rms_eps);
        }
        const float *cs = (L->swa ? m->rope_cs_swa : m->rope_cs) + (size_t)i * half * 2;
        for (uint32_t h = 0; h < m->n_heads; h++)
            ll_rope(m, q + (size_t)h * m->head_dim, cs);
        for (uint32_t h = 0; h < m->n_kv_heads; h++)
            ll_rope(m, k + (size_t)h * m->head_dim, cs);
        size_t ko = ll_kv_off(m, &toks[i], toks[i].pos, l, 0);
        size_t vo = ll_kv_off(m, &toks[i], toks[i].pos, l, 1);
        /* stored (quantized on store) in each one's dtype */
        eng_ll_kv_quantize(m->geom.kv_dtype, arena + ko, k, m->kv_dim);
        eng_ll_kv_quantize(m->geom.kv_dtype_v, arena + vo, v, m->kv_dim);
    }
}

/* A sublayer's output XB2 (N rows): its optional post-norm (gemma's
 * post_attn_norm / post_ffn_norm; NULL: none), then the residual into X. */
static void ll_norm_residual(eng_model_t *m, const float *norm, float *X, float *XB2, uint32_t N)
{
    const uint32_t E = m->n_embd;
    if (norm)
        for (uint32_t i = 0; i < N; i++)
            ll_rmsnorm(XB2 + (size_t)i * E, XB2 + (size_t)i * E, norm, E, m->rms_eps);
    for (size_t i = 0; i < (size_t)N * E; i++)
        X[i] += XB2[i];
}

/* Layer l's attention (run: its tokens, q from row 0), wo into XB2, the
 * post-attention norm, the residual into X, the FFN norm into XB (N rows
 * each). */
static void ll_layer_att(eng_model_t *m, const ll_layer_t *L, uint32_t l, ll_att_run_t *run,
                         float *X, float *XB, float *XB2, uint32_t N)
{
    const uint32_t E = m->n_embd;
    float *const *scr = m->mm_scratch;
    if (N == 0)
        return;
    run->ac.layer = l;
    run->ac.swa = L->swa;
    if (run->work < (1u << 15))
        for (uint32_t c = 0; c < run->chunks; c++)
            run->fn(&run->ac, c, 0);
    else
        eng_ll_pool_run(m->pool, run->fn, &run->ac, run->chunks);

    eng_ll_matmul_t wo = {
        .qx = m->mm_qx,
        .n_mats = 1, .w = { &L->wo }, .out = { XB2 }, .out_stride = { E },
        .x = m->att, .x_stride = m->q_dim, .n_items = N,
    };
    eng_ll_matmul(m->pool, &wo, scr);
    ll_norm_residual(m, L->post_attn_norm, X, XB2, N);
    for (uint32_t i = 0; i < N; i++)
        ll_rmsnorm(XB + (size_t)i * E, X + (size_t)i * E, L->ffn_norm, E, m->rms_eps);
}

/* The dense FFN of N rows: XB -> XB2. */
static void ll_ffn_dense(eng_model_t *m, const ll_layer_t *L, float *XB, float *XB2, uint32_t N)
{
    const uint32_t E = m->n_embd;
    float *const *scr = m->mm_scratch;
    eng_ll_matmul_t gu = {
        .qx = m->mm_qx,
        .n_mats = 2, .w = { &L->w_gate, &L->w_up }, .out = { m->hb, m->hb2 },
        .out_stride = { m->n_ff, m->n_ff }, .x = XB, .x_stride = E, .n_items = N,
    };
    eng_ll_matmul(m->pool, &gu, scr);
    ll_act(m, N, m->n_ff);
    eng_ll_matmul_t dn = {
        .qx = m->mm_qx,
        .n_mats = 1, .w = { &L->w_down }, .out = { XB2 }, .out_stride = { E },
        .x = m->hb, .x_stride = m->n_ff, .n_items = N,
    };
    eng_ll_matmul(m->pool, &dn, scr);
}

/* After the FFN of N rows: the post-FFN norm of XB2, the residual into X. */
static void ll_ffn_finish(eng_model_t *m, const ll_layer_t *L, float *X, float *XB2, uint32_t N)
{
    ll_norm_residual(m, L->post_ffn_norm, X, XB2, N);
}

/* Micro-batch h (rows [i0, i0 + c)) of layer pl: wait for its combine,
 * sum each token's experts, the post-FFN norm and residual. */
static pd_status_t ll_two_combine(eng_model_t *m, uint32_t h, uint32_t pl, uint32_t i0,
                                  uint32_t c, const void **cv, size_t *cl)
{
    const uint32_t E = m->n_embd;
    pd_status_t st = m->ep.wait(m->ep.ctx, (eng_ep_phase_t)(ENG_EP_COMBINE + 2 * h), pl, cv, cl);
    if (st == PD_OK)
        st = ll_ep_sum(m, h, i0, i0 + c, cv, cl);
    if (st == PD_OK)
        ll_ffn_finish(m, &m->layers[pl], m->x + (size_t)i0 * E, m->xb2 + (size_t)i0 * E, c);
    return st;
}

/* Every layer of an EP pass as two micro-batches (m->ep_two: the pass's
 * first ceil(n/2) tokens, then the rest; either may be empty, every rank
 * runs the same exchanges), two-batch overlap: per layer, micro-batch 0's
 * attention, its dispatch posted; micro-batch 1's attention while that
 * dispatch flies, its dispatch posted; 0's experts while 1's dispatch
 * flies, 0's combine posted; 1's experts while 0's combine flies; 1's
 * combine flies through the next layer's attention of micro-batch 0.
 * Every row's work is its own (canonical per-item dots, per-query softmax,
 * per-row norms), so the bits are those of one batch. Errors: m->ep_status. */
static void ll_layers_two(eng_model_t *m, uint8_t *arena, uint32_t hook_pos,
                          const ll_tok_t *toks, uint32_t n)
{
    const uint32_t E = m->n_embd, N = m->ep_size;
    const uint32_t cut[3] = { 0, (n + 1) / 2, n };
    const void **rv[2] = { m->ep_recv, m->ep_recv + N }, **cv[2] = { m->ep_crecv, m->ep_crecv + N };
    size_t *rl[2] = { m->ep_recv_len, m->ep_recv_len + N };
    size_t *cl[2] = { m->ep_crecv_len, m->ep_crecv_len + N };
    bool pend[2] = { false, false };
    uint32_t pl = 0;
    pd_status_t st = PD_OK;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        const ll_layer_t *L = &m->layers[l];
        for (uint32_t h = 0; h < 2; h++) {
            const uint32_t i0 = cut[h], c = cut[h + 1] - cut[h];
            float *X = m->x + (size_t)i0 * E, *XB = m->xb + (size_t)i0 * E;
            float *XB2 = m->xb2 + (size_t)i0 * E;
            if (pend[h]) { /* the previous layer's combine of this half */
                if ((st = ll_two_combine(m, h, pl, i0, c, cv[h], cl[h])) != PD_OK)
                    goto err;
                pend[h] = false;
            }
            ll_layer_qkv(m, arena, L, l, toks, i0, c);
            if (h == 1 && hook_pos && m->hook) /* both halves' layer-l KV is written */
                m->hook(m->hook_arg, l, hook_pos);
            if (c > 0) {
                ll_att_run_t run;
                ll_att_prepare(m, arena, toks + i0, c, &run);
                ll_layer_att(m, L, l, &run, X, XB, XB2, c);
            }
            ll_moe_route_rows(m, L, i0, c);
            ll_ep_dispatch_build(m, h, i0, i0 + c);
            if ((st = m->ep.post(m->ep.ctx, (eng_ep_phase_t)(ENG_EP_DISPATCH + 2 * h), l,
                                 m->ep_len)) != PD_OK)
                goto err;
        }
        for (uint32_t h = 0; h < 2; h++) {
            if ((st = m->ep.wait(m->ep.ctx, (eng_ep_phase_t)(ENG_EP_DISPATCH + 2 * h), l, rv[h],
                                 rl[h])) != PD_OK ||
                (st = ll_ep_experts(m, L, h, rv[h], rl[h])) != PD_OK ||
                (st = m->ep.post(m->ep.ctx, (eng_ep_phase_t)(ENG_EP_COMBINE + 2 * h), l,
                                 m->ep_len)) != PD_OK)
                goto err;
            pend[h] = true;
        }
        pl = l;
    }
    for (uint32_t h = 0; h < 2; h++)
        if (pend[h] && (st = ll_two_combine(m, h, pl, cut[h], cut[h + 1] - cut[h], cv[h],
                                            cl[h])) != PD_OK)
            goto err;
    return;
err:
    m->ep_status = st;
}

/* One pass over n <= t_max tokens. Logits of toks[logit_from..n) go to
 * logits (n - logit_from, vocab). Final hidden states (m->x) are computed
 * for toks[keep_from..n) only (<= logit_from; 0: all, for embeddings; n:
 * none, a prompt chunk that only writes KV): the last layer stops after
 * its KV write for the others. */
static void ll_forward(eng_model_t *m, uint8_t *arena, uint32_t hook_pos, const ll_tok_t *toks,
                       uint32_t n, float *logits, uint32_t logit_from, uint32_t keep_from)
{
    const uint32_t E = m->n_embd, half = m->rope_dim / 2;
    float *const *scr = m->mm_scratch;

    for (uint32_t i = 0; i < n; i++) {
        float *xi = m->x + (size_t)i * E;
        eng_ll_dequant_row(&m->tok_embd, (uint32_t)toks[i].token, xi);
        if (m->embd_scale != 1.0f)
            for (uint32_t j = 0; j < E; j++)
                xi[j] *= m->embd_scale;
        float *cs = m->rope_cs + (size_t)i * half * 2;
        for (uint32_t j = 0; j < half; j++) {
            double a = (double)toks[i].pos * m->inv_freq[j];
            cs[2 * j] = (float)cos(a);
            cs[2 * j + 1] = (float)sin(a);
        }
        if (m->rope_cs_swa) {
            cs = m->rope_cs_swa + (size_t)i * half * 2;
            for (uint32_t j = 0; j < half; j++) {
                double a = (double)toks[i].pos * m->inv_freq_swa[j];
                cs[2 * j] = (float)cos(a);
                cs[2 * j + 1] = (float)sin(a);
            }
        }
    }

    if (m->ep_two) {
        ll_layers_two(m, arena, hook_pos, toks, n);
        if (m->ep_status != PD_OK)
            return; /* the group's pass is lost */
    } else {
        ll_att_run_t run;
        ll_att_prepare(m, arena, toks, n, &run);
        for (uint32_t l = 0; l < m->n_layers; l++) {
            const ll_layer_t *L = &m->layers[l];
            ll_layer_qkv(m, arena, L, l, toks, 0, n);
            if (hook_pos && m->hook) /* this chunk's layer-l KV is written */
                m->hook(m->hook_arg, l, hook_pos);
            /* The last layer: every token's K and V are written; what
             * comes after (attention, wo, FFN) only matters for the tokens
             * whose final hidden state is read (keep_from on: logits,
             * embeddings), so the rest stop here, as llama.cpp's output
             * ids do. Each row's work is its own (canonical per-item dots,
             * per-query softmax, per-row norms), so the kept rows' bits are
             * the same. Not on an EP rank: every rank must run every MoE
             * exchange. */
            float *X = m->x;
            uint32_t N = n;
            if (l + 1 == m->n_layers && keep_from > 0 && m->ep_size <= 1) {
                if (keep_from >= n)
                    break;
                X = m->x + (size_t)keep_from * E;
                N = n - keep_from;
                memmove(m->q, m->q + (size_t)keep_from * m->q_dim,
                        (size_t)N * m->q_dim * sizeof(float));
                ll_att_prepare(m, arena, toks + keep_from, N, &run);
            }
            ll_layer_att(m, L, l, &run, X, m->xb, m->xb2, N);
            if (m->ep_size > 1) {
                ll_moe_ep(m, L, l, N);
                if (m->ep_status != PD_OK)
                    return; /* the group's pass is lost */
            } else if (m->n_expert) {
                ll_moe(m, L, N);
            } else {
                ll_ffn_dense(m, L, m->xb, m->xb2, N);
            }
            ll_ffn_finish(m, L, X, m->xb2, N);
        }
    }

    if (!logits || logit_from >= n)
        return;
    for (uint32_t i = logit_from; i < n; i++)
        ll_rmsnorm(m->xb + (size_t)(i - logit_from) * E, m->x + (size_t)i * E,
                   m->out_norm, E, m->rms_eps);
    eng_ll_matmul_t out = {
        .qx = m->mm_qx,
        .n_mats = 1, .w = { &m->output }, .out = { logits }, .out_stride = { m->vocab },
        .x = m->xb, .x_stride = E, .n_items = n - logit_from,
    };
    eng_ll_matmul(m->pool, &out, scr);
    if (m->softcap > 0.0f)
        for (size_t i = 0; i < (size_t)(n - logit_from) * m->vocab; i++)
            logits[i] = m->softcap * tanhf(logits[i] / m->softcap);
}

/* A model ready to run: not EP, or EP with its transport set (resets the
 * last pass's transport error). */
static bool ll_ep_ready(eng_model_t *m)
{
    m->ep_status = PD_OK;
    return m->ep_size <= 1 || m->ep.exchange != NULL;
}

static pd_status_t ll_check_tok(const eng_model_t *m, int32_t token, uint32_t pos,
                                uint32_t n_blocks)
{
    if (token < 0 || (uint32_t)token >= m->vocab)
        return PD_ERR_BAD_INPUT;
    if (pos >= m->geom.context_length)
        return PD_ERR_TOO_BIG;
    if ((uint64_t)pos >= (uint64_t)n_blocks * m->geom.block_tokens)
        return PD_ERR_NO_KV_SPACE;
    return PD_OK;
}

static pd_status_t ll_prefill(eng_model_t *m, void *arena, const uint32_t *block_table,
                              uint32_t n_blocks, const int32_t *tokens, uint32_t n_tokens,
                              uint32_t start_pos, float *logits)
{
    if (!m || !arena || !block_table || !tokens || n_tokens == 0 || !ll_ep_ready(m))
        return PD_ERR_BAD_INPUT;
    for (uint32_t i = 0; i < n_tokens; i++) {
        pd_status_t st = ll_check_tok(m, tokens[i], start_pos + i, n_blocks);
        if (st != PD_OK)
            return st;
    }
    ll_tok_t toks[LL_PREFILL_CHUNK];
    for (uint32_t c0 = 0; c0 < n_tokens; c0 += LL_PREFILL_CHUNK) {
        uint32_t cn = n_tokens - c0 < LL_PREFILL_CHUNK ? n_tokens - c0 : LL_PREFILL_CHUNK;
        for (uint32_t i = 0; i < cn; i++) {
            toks[i].token = tokens[c0 + i];
            toks[i].pos = start_pos + c0 + i;
            toks[i].bt = block_table;
            toks[i].nb = n_blocks;
        }
        int last = c0 + cn == n_tokens;
        ll_forward(m, arena, start_pos + c0 + cn, toks, cn, last ? logits : NULL, cn - 1,
                   last ? cn - 1 : cn);
        if (m->ep_status != PD_OK)
            return m->ep_status;
    }
    return PD_OK;
}

/* Rows: the chunk's, then one per item; passes of up to t_max rows. The
 * logit rows (the chunk's last if asked, then every item's) are the tail
 * of the row list, so each pass computes logits for its rows from
 * max(first logit row, pass start) on. */
static pd_status_t ll_step(eng_model_t *m, void *arena, const eng_chunk_t *chunk,
                           const eng_decode_item_t *items, uint32_t n_items, float *logits)
{
    uint32_t cn = chunk != NULL ? chunk->n_tokens : 0;
    if (!m || !arena || (n_items > 0 && !items) || cn + n_items == 0 ||
        (chunk != NULL && (!chunk->block_table || !chunk->tokens || cn == 0)) ||
        ((n_items > 0 || (chunk != NULL && chunk->logits)) && !logits) || !ll_ep_ready(m))
        return PD_ERR_BAD_INPUT;
    for (uint32_t i = 0; i < cn; i++) {
        pd_status_t st = ll_check_tok(m, chunk->tokens[i], chunk->start_pos + i,
                                      chunk->n_blocks);
        if (st != PD_OK)
            return st;
    }
    for (uint32_t i = 0; i < n_items; i++) {
        if (!items[i].block_table)
            return PD_ERR_BAD_INPUT;
        pd_status_t st = ll_check_tok(m, items[i].token, items[i].pos, items[i].n_blocks);
        if (st != PD_OK)
            return st;
    }
    const uint32_t total = cn + n_items, lfirst = chunk != NULL && chunk->logits ? cn - 1 : cn;
    const uint32_t step = LL_STEP_ROWS(m);
    ll_tok_t toks[256];
    for (uint32_t p0 = 0; p0 < total; p0 += step) {
        uint32_t pn = total - p0 < step ? total - p0 : step;
        for (uint32_t i = 0; i < pn; i++) {
            uint32_t row = p0 + i;
            if (row < cn) {
                toks[i] = (ll_tok_t){ .token = chunk->tokens[row], .pos = chunk->start_pos + row,
                                      .bt = chunk->block_table, .nb = chunk->n_blocks };
            } else {
                const eng_decode_item_t *it = &items[row - cn];
                toks[i] = (ll_tok_t){ .token = it->token, .pos = it->pos, .bt = it->block_table,
                                      .nb = it->n_blocks };
            }
        }
        uint32_t from = lfirst > p0 ? lfirst - p0 : 0;
        float *out = from < pn ? logits + (size_t)(p0 + from - lfirst) * m->vocab : NULL;
        ll_forward(m, arena, 0, toks, pn, out, from, from);
        if (m->ep_status != PD_OK)
            return m->ep_status;
    }
    return PD_OK;
}

/* A decode step is a step without a chunk (one row per item, each with
 * its logits). */
static pd_status_t ll_decode(eng_model_t *m, void *arena, const eng_decode_item_t *items,
                             uint32_t n_items, float *logits)
{
    if (!items || n_items == 0 || !logits)
        return PD_ERR_BAD_INPUT;
    return ll_step(m, arena, NULL, items, n_items, logits);
}

/* Every item's rows from position 0, packed in item order into forward
 * passes of up to LL_PREFILL_CHUNK rows (an item may span passes: its
 * earlier positions are always in an earlier or the same pass), without
 * logits. After each pass the final residuals in m->x are normed
 * (output_norm) and pooled into their item's accumulator: mean sums every
 * row in double in position order, cls keeps position 0, last the final
 * one. A row's result does not depend on the other rows of its pass
 * (DESIGN.md: batch invariance), so each item's vector is bitwise the one
 * it gets alone. */
static pd_status_t ll_embed(eng_model_t *m, void *arena, const eng_embed_item_t *items,
                            uint32_t n_items)
{
    if (!m || !arena || !items || n_items == 0 || !ll_ep_ready(m))
        return PD_ERR_BAD_INPUT;
    for (uint32_t k = 0; k < n_items; k++) {
        const eng_embed_item_t *it = &items[k];
        if (!it->block_table || !it->tokens || it->n_tokens == 0 || !it->out ||
            (it->pooling != ENG_POOL_MEAN && it->pooling != ENG_POOL_CLS &&
             it->pooling != ENG_POOL_LAST))
            return PD_ERR_BAD_INPUT;
        for (uint32_t i = 0; i < it->n_tokens; i++) {
            pd_status_t st = ll_check_tok(m, it->tokens[i], i, it->n_blocks);
            if (st != PD_OK)
                return st;
        }
    }
    const uint32_t E = m->n_embd;
    double *acc = calloc((size_t)n_items * E, sizeof(double));
    if (acc == NULL)
        return PD_ERR_NO_MEMORY;
    ll_tok_t toks[LL_PREFILL_CHUNK];
    uint32_t item_of[LL_PREFILL_CHUNK];
    uint32_t k = 0, pos = 0; /* the next row to pack */
    while (k < n_items) {
        uint32_t cn = 0;
        while (cn < LL_PREFILL_CHUNK && k < n_items) {
            const eng_embed_item_t *it = &items[k];
            toks[cn].token = it->tokens[pos];
            toks[cn].pos = pos;
            toks[cn].bt = it->block_table;
            toks[cn].nb = it->n_blocks;
            item_of[cn++] = k;
            if (++pos == it->n_tokens) {
                k++;
                pos = 0;
            }
        }
        ll_forward(m, arena, 0, toks, cn, NULL, cn, 0);
        if (m->ep_status != PD_OK) {
            free(acc);
            return m->ep_status;
        }
        for (uint32_t i = 0; i < cn; i++) {
            const eng_embed_item_t *it = &items[item_of[i]];
            uint32_t p = toks[i].pos;
            if (it->pooling != ENG_POOL_MEAN && !(it->pooling == ENG_POOL_CLS && p == 0) &&
                !(it->pooling == ENG_POOL_LAST && p == it->n_tokens - 1))
                continue;
            double *a = acc + (size_t)item_of[i] * E;
            ll_rmsnorm(m->xb, m->x + (size_t)i * E, m->out_norm, E, m->rms_eps);
            for (uint32_t j = 0; j < E; j++)
                a[j] += m->xb[j];
        }
    }
    for (k = 0; k < n_items; k++) {
        const eng_embed_item_t *it = &items[k];
        double div = it->pooling == ENG_POOL_MEAN ? (double)it->n_tokens : 1.0;
        for (uint32_t j = 0; j < E; j++)
            it->out[j] = (float)(acc[(size_t)k * E + j] / div);
        eng_l2_normalize(it->out, E);
    }
    free(acc);
    return PD_OK;
}

static pd_status_t ll_set_kv_layout(eng_model_t *m, const eng_kv_layout_t *lay)
{
    const uint64_t lbb = m ? m->geom.layer_block_bytes : 0;
    if (!m || !lay)
        return PD_ERR_BAD_INPUT;
    if (!((lay->layer_stride == lbb && lay->block_stride == m->geom.block_bytes) ||
          (lay->block_stride == lbb && lay->layer_stride >= lbb && lay->layer_stride % lbb == 0)))
        return PD_ERR_BAD_INPUT;
    m->lay = *lay;
    return PD_OK;
}

static void ll_set_layer_hook(eng_model_t *m, eng_layer_hook_t hook, void *arg)
{
    if (!m)
        return;
    m->hook = hook;
    m->hook_arg = arg;
}

static void ll_set_threads(eng_model_t *m, uint32_t n)
{
    if (m)
        eng_ll_pool_set_active(m->pool, n);
}

static pd_status_t ll_set_ep(eng_model_t *m, const eng_ep_xport_t *x)
{
    if (!m || !x || m->ep_size <= 1 || x->rank != m->ep_rank || x->size != m->ep_size ||
        !x->send_buf || !x->exchange || (m->ep_two && (!x->post || !x->wait)))
        return PD_ERR_BAD_INPUT;
    eng_llama_info_t info;
    eng_llama_info(m, &info);
    if (x->cap[ENG_EP_DISPATCH] < info.ep_cap[ENG_EP_DISPATCH] ||
        x->cap[ENG_EP_COMBINE] < info.ep_cap[ENG_EP_COMBINE] ||
        (m->ep_two && (x->cap[ENG_EP_DISPATCH_1] < info.ep_cap[ENG_EP_DISPATCH] ||
                       x->cap[ENG_EP_COMBINE_1] < info.ep_cap[ENG_EP_COMBINE])))
        return PD_ERR_TOO_BIG;
    m->ep = *x;
    return PD_OK;
}

/* Every MoE layer's exchanges with no tokens of this rank (its experts
 * still serve the others' rows). */
static pd_status_t ll_ep_idle(eng_model_t *m)
{
    if (!m || m->ep_size <= 1 || !ll_ep_ready(m))
        return PD_ERR_BAD_INPUT;
    if (m->ep_two) {
        ll_layers_two(m, NULL, 0, NULL, 0);
        return m->ep_status;
    }
    for (uint32_t l = 0; l < m->n_layers && m->ep_status == PD_OK; l++)
        ll_moe_ep(m, &m->layers[l], l, 0);
    return m->ep_status;
}

static uint32_t ll_ep_pass_rows(const eng_model_t *m)
{
    eng_llama_info_t info;

    eng_llama_info(m, &info);
    return info.step_rows ? info.step_rows : 1;
}

static pd_status_t ll_ep_cap(const eng_model_t *m, size_t cap[ENG_EP_SLOTS])
{
    eng_llama_info_t info;

    if (!m || !cap)
        return PD_ERR_BAD_INPUT;
    eng_llama_info(m, &info);
    cap[ENG_EP_DISPATCH] = info.ep_cap[ENG_EP_DISPATCH];
    cap[ENG_EP_COMBINE] = info.ep_cap[ENG_EP_COMBINE];
    /* the second half's phases: as the first's (ep_overlap) */
    cap[ENG_EP_DISPATCH_1] = m->ep_two ? cap[ENG_EP_DISPATCH] : 0;
    cap[ENG_EP_COMBINE_1] = m->ep_two ? cap[ENG_EP_COMBINE] : 0;
    return PD_OK;
}

const eng_ops_t eng_llama_ops = {
    .name = "llama",
    .load = ll_load,
    .destroy = ll_destroy,
    .geometry = ll_geometry,
    .prefill = ll_prefill,
    .decode = ll_decode,
    .set_kv_layout = ll_set_kv_layout,
    .set_layer_hook = ll_set_layer_hook,
    .embed = ll_embed,
    .step = ll_step,
    .describe = ll_describe,
    .set_threads = ll_set_threads,
    .set_ep = ll_set_ep,
    .ep_idle = ll_ep_idle,
    .ep_cap = ll_ep_cap,
    .ep_pass_rows = ll_ep_pass_rows,
};
