/* eng_sim.c - the "sim" engine (see eng_sim.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "eng_sim.h"
#include "pd_time.h"

#define SIM_MAGIC           0x73696d2d6b763031ULL /* "sim-kv01" */
#define SIM_DEFAULT_BLOCK   16u
#define SIM_MAX_LAYERS      512u
#define SIM_MAX_KV_HEADS    256u
#define SIM_MAX_HEAD_DIM    4096u
#define SIM_MAX_CTX         (1u << 21)
#define SIM_MIN_VOCAB       260u      /* the byte tokenizer's size */
#define SIM_MAX_VOCAB       (1u << 20)
#define SIM_MAX_BLOCK_BYTES (1ull << 31)
#define SIM_MAX_SPEC        512u
#define SIM_MAX_EXPERTS     4096u
#define SIM_MAX_TOP         64u
#define SIM_MAX_EMBD        65536u
#define SIM_MAX_EP          256u      /* eng_ep_local's ranks */
#define SIM_EP_T_DEFAULT    64u       /* tokens per pass when max_batch is 0 */
#define SIM_EP_T_MAX        4096u

/* token ids of the byte tokenizer (engine/tok eng_tok_create_byte) */
#define SIM_TOK_EOS         258
#define SIM_PRINT_FIRST     32
#define SIM_PRINT_COUNT     95        /* ' ' .. '~' */
#define SIM_LOGIT_NEVER     (-1e9f)

struct eng_model {
    uint64_t magic;
    eng_sim_params_t p;
    eng_kv_geom_t geom;
    uint32_t elem_bytes;           /* 4 (f32 K) or 2 (other K dtypes use f16's pattern) */
    uint64_t row_bytes;            /* K row: eng_kv_row_bytes(kv_dtype, n_kv_heads * head_dim) */
    uint64_t row_bytes_v;          /* V row: eng_kv_row_bytes(kv_dtype_v, ...) */
    uint64_t *tmpl;                /* (n_layers, 2, row_bytes / 8 + 1) random rows */
    uint64_t tmpl_words;           /* words per template row */
    XXH3_state_t *hs;              /* checksum state, compute thread only */
    eng_kv_layout_t lay;           /* where a layer block lives in the arena */
    eng_layer_hook_t hook;         /* prefill: layer done (compute thread) */
    void *hook_arg;
    eng_sim_stats_t stats;         /* updated with relaxed atomics */
    /* expert parallelism (ep_size > 1) */
    uint32_t ep_rank, ep_size;     /* 1: the whole model, no exchanges */
    uint32_t ep_t_max;             /* tokens per forward pass (slice) */
    eng_ep_xport_t ep;             /* .exchange NULL until set_ep */
    uint32_t *ep_route;            /* (ep_t_max, top_k) experts of this pass */
    uint64_t *ep_tag;              /* (ep_t_max) row tags of this pass */
    int32_t *ep_tok;               /* (ep_t_max) tokens of this pass */
    uint32_t *ep_pos;              /* (ep_t_max) their positions */
    uint32_t *ep_rows, *ep_pairs;  /* (2 micro-batches, ep_size) sent to each
                                      peer this layer */
    uint64_t ep_debt;              /* compute overrun of this call (ep_compute) */
    uint64_t ep_extra;             /* modeled time two micro-batches added */
};

typedef struct {
    const char *name;
    uint32_t layers, kv_heads, head_dim, vocab, ctx;
    double tps, a, b;
    uint32_t experts, top, embd, first_dense;
} sim_preset_t;

static const sim_preset_t sim_presets[] = {
#define SIM_PRESET_ROW(id, name, l, h, d, v, c, tps, a, b, e, k, hd, fd) \
    { name, l, h, d, v, c, tps, a, b, e, k, hd, fd },
    ENG_SIM_PRESETS(SIM_PRESET_ROW)
#undef SIM_PRESET_ROW
};

#define STAT_ADD(m, field, v) __atomic_fetch_add(&(m)->stats.field, (uint64_t)(v), __ATOMIC_RELAXED)

__attribute__((format(printf, 3, 4)))
static pd_status_t sim_err(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;

    if (err != NULL && err_len > 0) {
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return PD_ERR_BAD_INPUT;
}

static void apply_preset(eng_sim_params_t *p, const sim_preset_t *s)
{
    snprintf(p->preset, sizeof(p->preset), "%s", s->name);
    p->n_layers = s->layers;
    p->n_kv_heads = s->kv_heads;
    p->head_dim = s->head_dim;
    p->vocab = s->vocab;
    p->ctx = s->ctx;
    p->prefill_tps = s->tps;
    p->decode_a_ms = s->a;
    p->decode_b_ms = s->b;
    p->n_experts = s->experts;
    p->top_k = s->top;
    p->n_embd = s->embd;
    p->first_dense = s->first_dense;
}

static bool parse_u32(const char *v, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *e;
    unsigned long long x;

    errno = 0;
    if (*v < '0' || *v > '9')
        return false;
    x = strtoull(v, &e, 10);
    if (errno != 0 || *e != '\0' || x < lo || x > hi)
        return false;
    *out = (uint32_t)x;
    return true;
}

static bool parse_f64(const char *v, double lo, double hi, double *out)
{
    char *e;
    double x;

    errno = 0;
    x = strtod(v, &e);
    if (errno != 0 || e == v || *e != '\0' || !(x >= lo && x <= hi))
        return false;
    *out = x;
    return true;
}

/* "A" | "A+B*b" | "A+B*batch" (ms) */
static bool parse_decode_ms(const char *v, double *a, double *b)
{
    char *e, *e2;

    errno = 0;
    *a = strtod(v, &e);
    if (errno != 0 || e == v || !(*a >= 0 && *a <= 1e6))
        return false;
    *b = 0;
    if (*e == '\0')
        return true;
    if (*e != '+')
        return false;
    *b = strtod(e + 1, &e2);
    if (errno != 0 || e2 == e + 1 || !(*b >= 0 && *b <= 1e6))
        return false;
    return strcmp(e2, "*b") == 0 || strcmp(e2, "*batch") == 0;
}

/* The spec's whole-number keys: name, field, bounds. */
typedef struct {
    const char *key;
    size_t off;
    uint32_t min, max;
} sim_u32_key_t;

#define SIM_U32(k, field, lo, hi) { k, offsetof(eng_sim_params_t, field), lo, hi }
static const sim_u32_key_t sim_u32_keys[] = {
    SIM_U32("layers", n_layers, 1, SIM_MAX_LAYERS),
    SIM_U32("kv_heads", n_kv_heads, 1, SIM_MAX_KV_HEADS),
    SIM_U32("head_dim", head_dim, 1, SIM_MAX_HEAD_DIM),
    SIM_U32("vocab", vocab, SIM_MIN_VOCAB, SIM_MAX_VOCAB),
    SIM_U32("ctx", ctx, 1, SIM_MAX_CTX),
    SIM_U32("experts", n_experts, 0, SIM_MAX_EXPERTS),
    SIM_U32("top", top_k, 1, SIM_MAX_TOP),
    SIM_U32("embd", n_embd, 2, SIM_MAX_EMBD),
    SIM_U32("first_dense", first_dense, 0, SIM_MAX_LAYERS),
    SIM_U32("overlap", overlap, 0, 1),
};
#undef SIM_U32

static const sim_u32_key_t *sim_u32_key(const char *k)
{
    for (size_t i = 0; i < sizeof(sim_u32_keys) / sizeof(sim_u32_keys[0]); i++)
        if (strcmp(k, sim_u32_keys[i].key) == 0)
            return &sim_u32_keys[i];
    return NULL;
}

pd_status_t eng_sim_parse(const char *spec, eng_sim_params_t *p, char *err, size_t err_len)
{
    char buf[SIM_MAX_SPEC + 1], *save = NULL, *item;
    bool first = true;
    size_t i;

    if (spec == NULL)
        return sim_err(err, err_len, "sim: no model spec");
    if (strncmp(spec, "sim:", 4) == 0)
        spec += 4;
    if (strlen(spec) > SIM_MAX_SPEC) {
        sim_err(err, err_len, "sim: spec longer than %u bytes", SIM_MAX_SPEC);
        return PD_ERR_TOO_BIG;
    }
    memset(p, 0, sizeof(*p));
    apply_preset(p, &sim_presets[0]);
    snprintf(p->preset, sizeof(p->preset), "custom");
    p->speedup = 1.0;
    snprintf(buf, sizeof(buf), "%s", spec);
    for (item = strtok_r(buf, ",", &save); item != NULL;
         item = strtok_r(NULL, ",", &save), first = false) {
        char *eq = strchr(item, '=');
        const char *k = item, *v;
        if (eq == NULL) {
            if (!first)
                return sim_err(err, err_len, "sim: '%s': preset name must come first", item);
            for (i = 0; i < sizeof(sim_presets) / sizeof(sim_presets[0]); i++) {
                if (strcmp(item, sim_presets[i].name) == 0) {
                    apply_preset(p, &sim_presets[i]);
                    break;
                }
            }
            if (i == sizeof(sim_presets) / sizeof(sim_presets[0]))
                return sim_err(err, err_len, "sim: unknown preset '%s' (llama3-8b, llama3-70b, "
                               "qwen3-8b, deepseek-v3, deepseek-r1)", item);
            continue;
        }
        *eq = '\0';
        v = eq + 1;
        const sim_u32_key_t *uk = sim_u32_key(k);
        if (uk != NULL) {
            uint32_t x;
            if (!parse_u32(v, uk->min, uk->max, &x))
                goto bad;
            memcpy((char *)p + uk->off, &x, sizeof(x));
        } else if (strcmp(k, "prefill_tps") == 0) {
            if (!parse_f64(v, 1e-3, 1e12, &p->prefill_tps))
                goto bad;
        } else if (strcmp(k, "decode_ms") == 0) {
            if (!parse_decode_ms(v, &p->decode_a_ms, &p->decode_b_ms))
                goto bad;
        } else if (strcmp(k, "speedup") == 0) {
            if (!parse_f64(v, 1e-3, 1e9, &p->speedup))
                goto bad;
        } else if (strcmp(k, "kv_check") == 0) {
            if (strcmp(v, "full") == 0)
                p->kv_sample = false;
            else if (strcmp(v, "sample") == 0)
                p->kv_sample = true;
            else
                goto bad;
        } else if (strcmp(k, "no_sleep") == 0) {
            uint32_t b;
            if (!parse_u32(v, 0, 1, &b))
                goto bad;
            p->no_sleep = b != 0;
        } else {
            return sim_err(err, err_len, "sim: unknown key '%s' (layers kv_heads head_dim vocab "
                           "ctx prefill_tps decode_ms speedup no_sleep kv_check experts top "
                           "embd first_dense overlap)", k);
        }
        continue;
bad:
        return sim_err(err, err_len, "sim: bad value '%s' for %s", v, k);
    }
    if (p->n_experts > 0) {
        if (p->top_k == 0 || p->top_k > p->n_experts)
            return sim_err(err, err_len, "sim: top=%u needs 1..experts (%u)", p->top_k,
                           p->n_experts);
        if (p->n_embd < 2)
            return sim_err(err, err_len, "sim: experts=%u needs embd= (2..%u)", p->n_experts,
                           SIM_MAX_EMBD);
        if (p->first_dense >= p->n_layers)
            return sim_err(err, err_len, "sim: first_dense=%u leaves no MoE layer of %u",
                           p->first_dense, p->n_layers);
    } else if (p->overlap) {
        return sim_err(err, err_len, "sim: overlap=1 needs experts (an EP model)");
    }
    return PD_OK;
}

uint64_t eng_sim_prefill_ns(const eng_sim_params_t *p, uint32_t n_tokens)
{
    return (uint64_t)((double)n_tokens * 1e9 / p->prefill_tps);
}

uint64_t eng_sim_decode_ns(const eng_sim_params_t *p, uint32_t batch)
{
    return (uint64_t)((p->decode_a_ms + p->decode_b_ms * (double)batch) * 1e6);
}

static uint64_t sim_compat_hash(const eng_model_t *m)
{
    static const char tag[] = "pdserve-sim-kv-v1";
    uint64_t v[] = { m->p.n_layers, m->p.n_kv_heads, m->p.head_dim, m->p.vocab, m->p.ctx,
                     (uint64_t)m->geom.kv_dtype, m->geom.block_tokens, m->geom.bytes_per_token,
                     /* V's dtype only when it differs (same hashes as before kv-dtype-v) */
                     m->geom.kv_dtype_v != m->geom.kv_dtype ? m->geom.kv_dtype_v + 1u : 0 };
    XXH64_state_t *s = XXH64_createState();
    uint64_t h;

    if (s == NULL)
        return 0;
    XXH64_reset(s, 0);
    XXH64_update(s, tag, sizeof(tag));
    XXH64_update(s, v, sizeof(v));
    h = XXH64_digest(s);
    XXH64_freeState(s);
    return h;
}

static void sim_destroy(eng_model_t *m);
static pd_status_t make_templates(eng_model_t *m);

static pd_status_t sim_load(const eng_load_opts_t *opts, eng_model_t **model_p,
                            char *err, size_t err_len)
{
    eng_model_t *m;
    eng_kv_geom_t *g;
    pd_status_t status;

    if (opts == NULL || model_p == NULL)
        return PD_ERR_BAD_INPUT;
    if ((unsigned)opts->kv_dtype >= ENG_KV_DTYPES ||
        (unsigned)eng_load_kv_dtype_v(opts) >= ENG_KV_DTYPES)
        return sim_err(err, err_len, "sim: bad kv_dtype %d/%d", (int)opts->kv_dtype,
                       (int)eng_load_kv_dtype_v(opts));
    m = calloc(1, sizeof(*m));
    if (m == NULL)
        return PD_ERR_NO_MEMORY;
    status = eng_sim_parse(opts->model_path, &m->p, err, err_len);
    if (status != PD_OK)
        goto err_free;
    m->magic = SIM_MAGIC;
    m->ep_rank = opts->ep_rank;
    m->ep_size = opts->ep_size ? opts->ep_size : 1;
    if (opts->ep_overlap && m->p.n_experts > 0)
        m->p.overlap = 1; /* as the spec's overlap=1 */
    if (m->ep_size > 1) {
        if (m->p.n_experts == 0) {
            sim_err(err, err_len, "sim: ep_size %u but the model has no experts", m->ep_size);
            status = PD_ERR_BAD_INPUT;
            goto err_free;
        }
        if (m->ep_size > SIM_MAX_EP || m->p.n_experts % m->ep_size != 0 ||
            m->ep_rank >= m->ep_size) {
            sim_err(err, err_len, "sim: ep rank %u of %u: the size must divide experts=%u "
                    "(at most %u ranks)", m->ep_rank, m->ep_size, m->p.n_experts, SIM_MAX_EP);
            status = PD_ERR_BAD_INPUT;
            goto err_free;
        }
    } else if (m->ep_rank != 0) {
        sim_err(err, err_len, "sim: ep rank %u without ep_size", m->ep_rank);
        status = PD_ERR_BAD_INPUT;
        goto err_free;
    }
    m->ep_t_max = opts->max_batch ? opts->max_batch : SIM_EP_T_DEFAULT;
    if (m->ep_t_max > SIM_EP_T_MAX)
        m->ep_t_max = SIM_EP_T_MAX;
    if (m->ep_size > 1) {
        m->ep_route = calloc((size_t)m->ep_t_max * m->p.top_k, sizeof(uint32_t));
        m->ep_tag = calloc(m->ep_t_max, sizeof(uint64_t));
        m->ep_tok = calloc(m->ep_t_max, sizeof(int32_t));
        m->ep_pos = calloc(m->ep_t_max, sizeof(uint32_t));
        m->ep_rows = calloc(2 * (size_t)m->ep_size, sizeof(uint32_t));
        m->ep_pairs = calloc(2 * (size_t)m->ep_size, sizeof(uint32_t));
        if (!m->ep_route || !m->ep_tag || !m->ep_tok || !m->ep_pos || !m->ep_rows ||
            !m->ep_pairs) {
            status = PD_ERR_NO_MEMORY;
            goto err_free;
        }
    }
    m->elem_bytes = opts->kv_dtype == ENG_KV_F32 ? 4 : 2;
    m->row_bytes = eng_kv_row_bytes(opts->kv_dtype, (uint64_t)m->p.n_kv_heads * m->p.head_dim);
    m->row_bytes_v = eng_kv_row_bytes(eng_load_kv_dtype_v(opts),
                                      (uint64_t)m->p.n_kv_heads * m->p.head_dim);
    for (int kv = 0; kv < 2; kv++) {
        eng_kv_dtype_t dt = kv ? eng_load_kv_dtype_v(opts) : opts->kv_dtype;
        if ((kv ? m->row_bytes_v : m->row_bytes) == 0 ||
            m->p.head_dim % eng_kv_dtype_align(dt)) {
            sim_err(err, err_len, "sim: kv-dtype %s needs head_dim a multiple of %u (head_dim %u)",
                    eng_kv_dtype_name(dt), eng_kv_dtype_align(dt), m->p.head_dim);
            status = PD_ERR_BAD_INPUT;
            goto err_free;
        }
    }
    g = &m->geom;
    g->n_layers = m->p.n_layers;
    g->n_kv_heads = m->p.n_kv_heads;
    g->head_dim = m->p.head_dim;
    g->block_tokens = opts->block_tokens ? opts->block_tokens : SIM_DEFAULT_BLOCK;
    g->kv_dtype = opts->kv_dtype;
    g->kv_dtype_v = eng_load_kv_dtype_v(opts);
    g->bytes_per_token = (uint64_t)m->p.n_layers * (m->row_bytes + m->row_bytes_v);
    g->block_bytes = (uint64_t)g->block_tokens * g->bytes_per_token;
    g->layer_block_bytes = g->block_bytes / m->p.n_layers;
    g->vocab_size = m->p.vocab;
    g->context_length = m->p.ctx;
    g->pooling = -1; /* no embeddings (ops.embed NULL) */
    if (g->block_tokens > 4096 || g->block_bytes > SIM_MAX_BLOCK_BYTES) {
        sim_err(err, err_len, "sim: block of %u tokens x %llu bytes is too big", g->block_tokens,
                (unsigned long long)g->bytes_per_token);
        status = PD_ERR_TOO_BIG;
        goto err_free;
    }
    g->compat_hash = sim_compat_hash(m);
    m->lay = eng_kv_layout_block_major(g);
    m->hs = XXH3_createState();
    if (m->hs == NULL || make_templates(m) != PD_OK) {
        status = PD_ERR_NO_MEMORY;
        goto err_free;
    }
    *model_p = m;
    return PD_OK;

err_free:
    sim_destroy(m);
    return status;
}

static void sim_destroy(eng_model_t *m)
{
    if (m == NULL)
        return;
    if (m->hs != NULL)
        XXH3_freeState(m->hs);
    free(m->tmpl);
    free(m->ep_route);
    free(m->ep_tag);
    free(m->ep_tok);
    free(m->ep_pos);
    free(m->ep_rows);
    free(m->ep_pairs);
    m->magic = 0;
    free(m);
}

static const eng_kv_geom_t *sim_geometry(const eng_model_t *m)
{
    return &m->geom;
}

/* ---- KV content ------------------------------------------------------------ */

static inline uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t mix4(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    uint64_t s = a * 0x9e3779b97f4a7c15ULL ^ b * 0xc2b2ae3d27d4eb4fULL ^
                 c * 0x165667b19e3779f9ULL ^ d * 0xd6e8feb86659fd93ULL;

    return splitmix64(&s);
}

/* One (layer, K/V) row of a token: the layer's random template row XOR a
 * per-(token, pos, layer, kv) key stream, masked so every element stays a
 * finite value in +-[0.5, 1). One load, add, and, xor, store per 8 bytes:
 * generation runs near memory speed. */
static void fill_row(const eng_model_t *m, uint8_t *dst, int32_t token, uint32_t pos,
                     uint32_t layer, uint32_t kv)
{
    const uint64_t *t = m->tmpl + ((uint64_t)layer * 2 + kv) * m->tmpl_words;
    uint64_t key = mix4((uint64_t)(uint32_t)token + 1, pos, layer, kv + 1);
    uint64_t mask = m->elem_bytes == 2 ? 0x83ff83ff83ff83ffULL : 0x807fffff807fffffULL;
    uint64_t n = kv ? m->row_bytes_v : m->row_bytes, i, w;

    for (i = 0, w = 0; i + 8 <= n; i += 8, w++) {
        uint64_t r = t[w] ^ ((key + w * 0x9e3779b97f4a7c15ULL) & mask);
        memcpy(dst + i, &r, 8);
    }
    if (i < n) {
        uint64_t r = t[w] ^ ((key + w * 0x9e3779b97f4a7c15ULL) & mask);
        memcpy(dst + i, &r, n - i); /* little-endian: the low elements */
    }
}

/* Template rows: random finite elements, fixed per geometry. */
static pd_status_t make_templates(eng_model_t *m)
{
    uint64_t rows = (uint64_t)m->p.n_layers * 2, i, s = 0x7064736572766531ULL;
    uint64_t fix = m->elem_bytes == 2 ? 0x3800380038003800ULL : 0x3f0000003f000000ULL;
    uint64_t mask = m->elem_bytes == 2 ? 0x83ff83ff83ff83ffULL : 0x807fffff807fffffULL;

    m->tmpl_words = (m->row_bytes > m->row_bytes_v ? m->row_bytes : m->row_bytes_v) / 8 + 1;
    m->tmpl = malloc(rows * m->tmpl_words * sizeof(uint64_t));
    if (m->tmpl == NULL)
        return PD_ERR_NO_MEMORY;
    for (i = 0; i < rows * m->tmpl_words; i++)
        m->tmpl[i] = (splitmix64(&s) & mask) | fix;
    return PD_OK;
}

static inline uint8_t *row_ptr(const eng_model_t *m, void *arena, uint32_t block,
                               uint32_t layer, uint32_t kv, uint32_t slot)
{
    return (uint8_t *)arena + (uint64_t)block * m->lay.block_stride +
           (uint64_t)layer * m->lay.layer_stride +
           (kv ? (uint64_t)m->geom.block_tokens * m->row_bytes + (uint64_t)slot * m->row_bytes_v
               : (uint64_t)slot * m->row_bytes);
}

/* One layer's K and V rows of one token. */
static void write_token_layer_kv(eng_model_t *m, void *arena, const uint32_t *bt,
                                 int32_t token, uint32_t pos, uint32_t l)
{
    uint32_t block = bt[pos / m->geom.block_tokens], slot = pos % m->geom.block_tokens;
    uint32_t kv;

    for (kv = 0; kv < 2; kv++)
        fill_row(m, row_ptr(m, arena, block, l, kv, slot), token, pos, l, kv);
}

static void write_token_kv(eng_model_t *m, void *arena, const uint32_t *bt,
                           int32_t token, uint32_t pos)
{
    uint32_t l;

    for (l = 0; l < m->p.n_layers; l++)
        write_token_layer_kv(m, arena, bt, token, pos, l);
    STAT_ADD(m, kv_bytes_written, m->geom.bytes_per_token);
}

/* XXH3 over the KV of positions [0, n_pos) in block-table order: whole
 * blocks in one piece, the partial last block row range by row range.
 * kv_check=sample hashes only the first and last SIM_SAMPLE bytes of every
 * (layer, K/V) row range of every block: lost or stale blocks still change
 * the output, a corrupted byte elsewhere does not. */
#define SIM_SAMPLE 64u

static void hash_range(eng_model_t *m, const uint8_t *p, uint64_t n)
{
    if (!m->p.kv_sample || n <= 2 * SIM_SAMPLE) {
        XXH3_64bits_update(m->hs, p, n);
        STAT_ADD(m, kv_bytes_hashed, n);
        return;
    }
    XXH3_64bits_update(m->hs, p, SIM_SAMPLE);
    XXH3_64bits_update(m->hs, p + n - SIM_SAMPLE, SIM_SAMPLE);
    STAT_ADD(m, kv_bytes_hashed, 2 * SIM_SAMPLE);
}

static uint64_t kv_checksum(eng_model_t *m, const void *arena, const uint32_t *bt,
                            uint32_t n_pos)
{
    uint32_t bt_tokens = m->geom.block_tokens, n_blk = (n_pos + bt_tokens - 1) / bt_tokens;
    uint32_t i, l, kv;

    XXH3_64bits_reset(m->hs);
    for (i = 0; i < n_blk; i++) {
        uint32_t valid = i + 1 < n_blk || n_pos % bt_tokens == 0 ? bt_tokens : n_pos % bt_tokens;
        if (valid == bt_tokens && !m->p.kv_sample) {
            /* a full block: its layer blocks in layer order hash like the
             * block-major block in one piece (XXH3 streams) */
            if (m->lay.layer_stride == m->geom.layer_block_bytes)
                hash_range(m, row_ptr(m, (void *)(uintptr_t)arena, bt[i], 0, 0, 0),
                           m->geom.block_bytes);
            else
                for (l = 0; l < m->p.n_layers; l++)
                    hash_range(m, row_ptr(m, (void *)(uintptr_t)arena, bt[i], l, 0, 0),
                               m->geom.layer_block_bytes);
            continue;
        }
        for (l = 0; l < m->p.n_layers; l++)
            for (kv = 0; kv < 2; kv++)
                hash_range(m, row_ptr(m, (void *)(uintptr_t)arena, bt[i], l, kv, 0),
                           valid * (kv ? m->row_bytes_v : m->row_bytes));
    }
    return XXH3_64bits_digest(m->hs);
}

/* Logits of position pos from the checksum of everything it attends to:
 * printable bytes get U[0,4), one of them +6 (the greedy pick), EOS -10,
 * every other id -1e9 (probability exactly 0 after softmax, so the text is
 * always printable ASCII and any byte tokenizer of >= 260 ids decodes it). */
static void make_logits(const eng_model_t *m, uint64_t kv_hash, uint32_t pos, float *logits)
{
    uint64_t s = kv_hash ^ mix4(pos, 0x51f15eedULL, 0, 0);
    uint32_t i, win;

    for (i = 0; i < m->p.vocab; i++)
        logits[i] = SIM_LOGIT_NEVER;
    for (i = 0; i < SIM_PRINT_COUNT; i++)
        logits[SIM_PRINT_FIRST + i] = (float)(splitmix64(&s) >> 40) * (4.0f / 16777216.0f);
    win = SIM_PRINT_FIRST + (uint32_t)(splitmix64(&s) % SIM_PRINT_COUNT);
    logits[win] += 6.0f;
    logits[SIM_TOK_EOS] = -10.0f;
}

/* ---- timing ---------------------------------------------------------------- */

/* Sleep until t0 + target (unless no_sleep); the time slept is counted. */
static void sim_sleep_until(eng_model_t *m, uint64_t t0, uint64_t target)
{
    uint64_t now = pd_now_ns();

    if (m->p.no_sleep || now - t0 >= target)
        return;
    {
        uint64_t until = t0 + target;
        struct timespec ts = { .tv_sec = (time_t)(until / PD_NS_PER_S),
                               .tv_nsec = (long)(until % PD_NS_PER_S) };
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
        STAT_ADD(m, slept_ns, pd_now_ns() - now);
    }
}

static void sim_account(eng_model_t *m, uint64_t t0, uint64_t modeled)
{
    uint64_t target = (uint64_t)((double)modeled / m->p.speedup);
    uint64_t now = pd_now_ns(), real = now - t0;

    STAT_ADD(m, modeled_ns, modeled);
    STAT_ADD(m, target_ns, target);
    STAT_ADD(m, real_ns, real);
    if (real >= target) {
        STAT_ADD(m, late_ns, real - target);
        return;
    }
    sim_sleep_until(m, t0, target);
}

/* ---- expert parallelism ------------------------------------------------------ */

void eng_sim_route(const eng_sim_params_t *p, int32_t token, uint32_t pos, uint32_t layer,
                   uint32_t *experts)
{
    uint64_t s = mix4((uint64_t)(uint32_t)token + 1, pos, layer, 0x726f757465ULL);
    uint32_t n = 0, j;

    while (n < p->top_k) {
        uint32_t e = (uint32_t)(splitmix64(&s) % p->n_experts);
        for (j = 0; j < n && experts[j] != e; j++)
            ;
        if (j == n)
            experts[n++] = e;
    }
}

/* What expert e answers for a row tagged tag (the first 8 bytes of its
 * combine row). */
static inline uint64_t ep_answer(uint64_t tag, uint32_t e)
{
    return tag ^ mix4(e, 0x6578706572ULL, 0, 1);
}

static bool ep_model(const eng_model_t *m)
{
    return m->ep_size > 1;
}

/* A decode pass's cost whatever its rows (decode_ms's a), after speedup. */
static uint64_t sim_fixed_ns(const eng_model_t *m)
{
    return (uint64_t)(m->p.decode_a_ms * 1e6 / m->p.speedup);
}

static uint32_t sim_ep_pass_rows(const eng_model_t *m)
{
    return m != NULL && m->magic == SIM_MAGIC && m->ep_t_max > 0 ? m->ep_t_max : 1;
}

pd_status_t eng_sim_ep_cap(const eng_model_t *m, size_t cap[ENG_EP_SLOTS])
{
    uint32_t per, k, rows;

    if (m == NULL || m->magic != SIM_MAGIC || cap == NULL)
        return PD_ERR_BAD_INPUT;
    memset(cap, 0, ENG_EP_SLOTS * sizeof(size_t));
    if (m->p.n_experts == 0)
        return PD_OK;
    /* to one peer: every row of the pass, each with at most min(k, the
     * experts it owns) pairs */
    per = m->p.n_experts / m->ep_size;
    k = m->p.top_k < per ? m->p.top_k : per;
    rows = m->p.overlap ? (m->ep_t_max + 1) / 2 : m->ep_t_max; /* a micro-batch's */
    cap[ENG_EP_DISPATCH] = eng_ep_dispatch_bytes(rows, rows * k, m->p.n_embd);
    cap[ENG_EP_COMBINE] = eng_ep_combine_bytes(rows * k, m->p.n_embd);
    cap[ENG_EP_DISPATCH_1] = m->p.overlap ? cap[ENG_EP_DISPATCH] : 0;
    cap[ENG_EP_COMBINE_1] = m->p.overlap ? cap[ENG_EP_COMBINE] : 0;
    return PD_OK;
}

/* Modeled compute: sleep until *seg + share (work since *seg included),
 * counted as compute; the next segment starts now. What a segment overran
 * its share by (a late wake-up, slow work) is taken off the next shares of
 * the call (m->ep_debt), so ~120 sleeps of a step do not add up their
 * wake-up latencies. */
static void ep_compute(eng_model_t *m, uint64_t *seg, uint64_t share)
{
    uint64_t now, took;

    if (m->ep_debt >= share) {
        m->ep_debt -= share;
        share = 0;
    } else {
        share -= m->ep_debt;
        m->ep_debt = 0;
    }
    sim_sleep_until(m, *seg, share);
    now = pd_now_ns();
    took = now - *seg;
    if (took > share)
        m->ep_debt += took - share;
    STAT_ADD(m, ep_compute_ns, took);
    *seg = now;
}

/* Post this rank's messages of phase ph (len[p] to peer p); the time
 * blocked counts as exchange. */
static pd_status_t ep_post(eng_model_t *m, uint64_t *seg, eng_ep_phase_t ph, uint32_t layer,
                           const size_t *len)
{
    uint64_t t = pd_now_ns(), out = 0;
    pd_status_t st = m->ep.post != NULL ? m->ep.post(m->ep.ctx, ph, layer, len) : PD_OK;
    uint64_t now = pd_now_ns();

    for (uint32_t p = 0; p < m->ep_size; p++)
        if (p != m->ep_rank)
            out += len[p];
    STAT_ADD(m, ep_exchanges, 1);
    STAT_ADD(m, ep_exchange_ns, now - t);
    if (ph == ENG_EP_DISPATCH || ph == ENG_EP_DISPATCH_1)
        STAT_ADD(m, ep_dispatch_bytes, out);
    else
        STAT_ADD(m, ep_combine_bytes, out);
    *seg = now;
    return st;
}

/* Wait for every peer's messages of phase ph: exchange() where the
 * transport has no post (len then the messages posted), else wait(). */
static pd_status_t ep_wait(eng_model_t *m, uint64_t *seg, eng_ep_phase_t ph, uint32_t layer,
                           const size_t *len, const void **recv, size_t *recv_len)
{
    uint64_t t = pd_now_ns();
    pd_status_t st = m->ep.post != NULL ? m->ep.wait(m->ep.ctx, ph, layer, recv, recv_len)
                                        : m->ep.exchange(m->ep.ctx, ph, layer, len, recv,
                                                         recv_len);
    uint64_t now = pd_now_ns();

    STAT_ADD(m, ep_exchange_ns, now - t);
    *seg = now;
    return st;
}

static inline uint32_t rd32(const uint8_t *p)
{
    uint32_t v;

    memcpy(&v, p, 4);
    return v;
}

/* Route micro-batch mb's n rows (from row r0 of the pass: m->ep_tok/
 * ep_pos) at layer l and write its dispatch messages (phase
 * ENG_EP_DISPATCH + 2 mb): header, pairs (row order, k order), row tags;
 * len[p] their bytes. */
static void ep_dispatch_build(eng_model_t *m, uint32_t l, uint32_t mb, uint32_t r0, uint32_t n,
                              size_t *len)
{
    const uint32_t K = m->p.top_k, S = m->ep_size, per = m->p.n_experts / S;
    const size_t row_bytes = (size_t)m->p.n_embd * sizeof(float);
    uint32_t *rows_to = m->ep_rows + (size_t)mb * S, *pairs_to = m->ep_pairs + (size_t)mb * S;
    uint32_t i, k, p;

    memset(rows_to, 0, S * sizeof(uint32_t));
    memset(pairs_to, 0, S * sizeof(uint32_t));
    for (i = r0; i < r0 + n; i++) {
        uint32_t *r = m->ep_route + (size_t)i * K;
        eng_sim_route(&m->p, m->ep_tok[i], m->ep_pos[i], l, r);
        m->ep_tag[i] = mix4((uint64_t)(uint32_t)m->ep_tok[i] + 1, m->ep_pos[i], l, 0x746167ULL);
        for (p = 0; p < S; p++) {
            uint32_t np = 0;
            for (k = 0; k < K; k++)
                np += r[k] / per == p;
            if (np) {
                rows_to[p]++;
                pairs_to[p] += np;
            }
        }
    }
    for (p = 0; p < S; p++) {
        uint8_t *b = m->ep.send_buf(m->ep.ctx, (eng_ep_phase_t)(ENG_EP_DISPATCH + 2 * mb), p);
        uint32_t hdr[2] = { rows_to[p], pairs_to[p] }, row = 0, pair = 0;
        uint8_t *rows;
        len[p] = eng_ep_dispatch_bytes(hdr[0], hdr[1], m->p.n_embd);
        memcpy(b, hdr, 8);
        rows = b + 8 + (size_t)hdr[1] * 8;
        for (i = r0; i < r0 + n; i++) {
            const uint32_t *r = m->ep_route + (size_t)i * K;
            bool hit = false;
            for (k = 0; k < K; k++) {
                if (r[k] / per != p)
                    continue;
                uint32_t pr[2] = { row, r[k] };
                memcpy(b + 8 + (size_t)pair * 8, pr, 8);
                pair++;
                hit = true;
            }
            if (hit) {
                memcpy(rows + (size_t)row * row_bytes, &m->ep_tag[i], 8);
                row++;
            }
        }
    }
}

/* The experts of this rank answer every pair of micro-batch mb's received
 * dispatch, in each sender's pair order, into the combine messages. */
static pd_status_t ep_experts(eng_model_t *m, uint32_t mb, const void **recv,
                              const size_t *recv_len, size_t *len)
{
    const uint32_t K = m->p.top_k, S = m->ep_size, per = m->p.n_experts / S;
    const size_t row_bytes = (size_t)m->p.n_embd * sizeof(float);
    const uint32_t e_lo = m->ep_rank * per;
    size_t cap[ENG_EP_SLOTS];

    eng_sim_ep_cap(m, cap);
    for (uint32_t p = 0; p < S; p++) {
        const uint8_t *b = recv[p];
        uint8_t *out = m->ep.send_buf(m->ep.ctx, (eng_ep_phase_t)(ENG_EP_COMBINE + 2 * mb), p);
        uint32_t nr, np, j;
        if (recv_len[p] < 8 || b == NULL)
            return PD_ERR_MISMATCH;
        nr = rd32(b);
        np = rd32(b + 4);
        if (nr > m->ep_t_max || np > m->ep_t_max * K ||
            recv_len[p] != eng_ep_dispatch_bytes(nr, np, m->p.n_embd) ||
            eng_ep_combine_bytes(np, m->p.n_embd) > cap[ENG_EP_COMBINE])
            return PD_ERR_MISMATCH;
        for (j = 0; j < np; j++) {
            uint32_t row = rd32(b + 8 + (size_t)j * 8), e = rd32(b + 12 + (size_t)j * 8);
            uint64_t tag, ans;
            if (row >= nr || e < e_lo || e >= e_lo + per)
                return PD_ERR_MISMATCH;
            memcpy(&tag, b + 8 + (size_t)np * 8 + (size_t)row * row_bytes, 8);
            ans = ep_answer(tag, e);
            memcpy(out + (size_t)j * row_bytes, &ans, 8);
        }
        len[p] = eng_ep_combine_bytes(np, m->p.n_embd);
    }
    return PD_OK;
}

/* The token's rank checks every answer of micro-batch mb (rows r0..r0+n)
 * (they feed nothing else: the logits depend on the KV only). */
static pd_status_t ep_combine_check(eng_model_t *m, uint32_t mb, uint32_t r0, uint32_t n,
                                    const void **recv, const size_t *recv_len)
{
    const uint32_t K = m->p.top_k, S = m->ep_size, per = m->p.n_experts / S;
    const size_t row_bytes = (size_t)m->p.n_embd * sizeof(float);
    const uint32_t *pairs_to = m->ep_pairs + (size_t)mb * S;

    for (uint32_t p = 0; p < S; p++) {
        const uint8_t *b = recv[p];
        uint32_t j = 0;
        if (recv_len[p] != eng_ep_combine_bytes(pairs_to[p], m->p.n_embd) ||
            (recv_len[p] > 0 && b == NULL))
            return PD_ERR_MISMATCH;
        for (uint32_t i = r0; i < r0 + n; i++) {
            const uint32_t *r = m->ep_route + (size_t)i * K;
            for (uint32_t k = 0; k < K; k++) {
                uint64_t ans;
                if (r[k] / per != p)
                    continue;
                memcpy(&ans, b + (size_t)j * row_bytes, 8);
                if (ans != ep_answer(m->ep_tag[i], r[k]))
                    return PD_ERR_MISMATCH;
                j++;
            }
        }
    }
    return PD_OK;
}

/* One MoE layer of a pass of n tokens (m->ep_tok/ep_pos; n may be 0), one
 * micro-batch: compute half, dispatch, the experts' half, combine. */
static pd_status_t ep_moe_layer(eng_model_t *m, uint32_t l, uint32_t n, uint64_t *seg,
                                uint64_t share)
{
    size_t len[SIM_MAX_EP], recv_len[SIM_MAX_EP];
    const void *recv[SIM_MAX_EP];
    pd_status_t st;

    ep_dispatch_build(m, l, 0, 0, n, len);
    ep_compute(m, seg, share / 2);
    if ((st = ep_post(m, seg, ENG_EP_DISPATCH, l, len)) != PD_OK ||
        (st = ep_wait(m, seg, ENG_EP_DISPATCH, l, len, recv, recv_len)) != PD_OK ||
        (st = ep_experts(m, 0, recv, recv_len, len)) != PD_OK)
        return st;
    ep_compute(m, seg, share - share / 2);
    if ((st = ep_post(m, seg, ENG_EP_COMBINE, l, len)) != PD_OK ||
        (st = ep_wait(m, seg, ENG_EP_COMBINE, l, len, recv, recv_len)) != PD_OK)
        return st;
    return ep_combine_check(m, 0, 0, n, recv, recv_len);
}

/* Where a prefill slice writes its KV, layer by layer (NULL: decode, whose
 * KV is written before the pass). */
typedef struct {
    void *arena;
    const uint32_t *bt;
    uint32_t pos_end;              /* the hook's */
} ep_kv_t;

/* A pass's two micro-batches (overlap=1): rows [0, ceil(n/2)) and the
 * rest, each through every layer; per MoE layer, micro-batch 0's dispatch
 * is in flight while micro-batch 1 computes its first half, each combine
 * while the other runs its experts' half or its next layer's first half
 * (SGLang's two-batch overlap, DeepEP's hooks). Each micro-batch computes
 * its own share: `fixed` (what a pass costs whatever its rows: the
 * weights read again) plus its rows' part of the rest, so the split costs
 * one more `fixed` (counted in m->ep_extra), and what it gains is the
 * exchange time it hides. */
static pd_status_t ep_pass_two(eng_model_t *m, uint32_t n, uint64_t target, uint64_t fixed,
                               uint64_t *seg, const ep_kv_t *kv)
{
    const uint32_t L = m->p.n_layers;
    uint32_t cnt[2] = { (n + 1) / 2, n / 2 }, r0[2] = { 0, (n + 1) / 2 };
    uint64_t share[2];
    size_t len[2][SIM_MAX_EP], recv_len[SIM_MAX_EP];
    const void *recv[SIM_MAX_EP];
    bool pend[2] = { false, false };
    uint32_t l, i, mb, pl = 0;
    pd_status_t st;

    if (fixed > target)
        fixed = target;
    for (mb = 0; mb < 2; mb++)
        share[mb] = cnt[mb] ? (fixed + (target - fixed) * cnt[mb] / n) / L : 0;
    if (cnt[1] > 0)
        m->ep_extra += (uint64_t)((double)fixed * m->p.speedup);
    for (l = 0; l < L; l++) {
        bool moe = l >= m->p.first_dense;
        if (kv != NULL)
            for (i = 0; i < n; i++)
                write_token_layer_kv(m, kv->arena, kv->bt, m->ep_tok[i], m->ep_pos[i], l);
        for (mb = 0; mb < 2; mb++) {
            /* the previous MoE layer's combine of this micro-batch */
            if (pend[mb]) {
                eng_ep_phase_t ph = (eng_ep_phase_t)(ENG_EP_COMBINE + 2 * mb);
                if ((st = ep_wait(m, seg, ph, pl, NULL, recv, recv_len)) != PD_OK ||
                    (st = ep_combine_check(m, mb, r0[mb], cnt[mb], recv, recv_len)) != PD_OK)
                    return st;
                pend[mb] = false;
            }
            if (!moe) {
                ep_compute(m, seg, share[mb]);
                continue;
            }
            ep_dispatch_build(m, l, mb, r0[mb], cnt[mb], len[mb]);
            ep_compute(m, seg, share[mb] / 2);
            st = ep_post(m, seg, (eng_ep_phase_t)(ENG_EP_DISPATCH + 2 * mb), l, len[mb]);
            if (st != PD_OK)
                return st;
        }
        if (moe) {
            for (mb = 0; mb < 2; mb++) {
                if ((st = ep_wait(m, seg, (eng_ep_phase_t)(ENG_EP_DISPATCH + 2 * mb), l, NULL,
                                  recv, recv_len)) != PD_OK ||
                    (st = ep_experts(m, mb, recv, recv_len, len[mb])) != PD_OK)
                    return st;
                ep_compute(m, seg, share[mb] - share[mb] / 2);
                st = ep_post(m, seg, (eng_ep_phase_t)(ENG_EP_COMBINE + 2 * mb), l, len[mb]);
                if (st != PD_OK)
                    return st;
                pend[mb] = true;
            }
            pl = l;
        }
        if (kv != NULL && m->hook != NULL)
            m->hook(m->hook_arg, l, kv->pos_end);
    }
    for (mb = 0; mb < 2; mb++)
        if (pend[mb]) {
            eng_ep_phase_t ph = (eng_ep_phase_t)(ENG_EP_COMBINE + 2 * mb);
            if ((st = ep_wait(m, seg, ph, pl, NULL, recv, recv_len)) != PD_OK ||
                (st = ep_combine_check(m, mb, r0[mb], cnt[mb], recv, recv_len)) != PD_OK)
                return st;
        }
    return PD_OK;
}

/* One forward pass of the n tokens in m->ep_tok/ep_pos (n <= ep_t_max; 0:
 * idle) through every layer: target ns of modeled compute split evenly
 * over the layers (fixed of it a pass's cost whatever its rows: what a
 * second micro-batch pays again), seg the start of the current compute
 * segment. */
static pd_status_t ep_pass(eng_model_t *m, uint32_t n, uint64_t target, uint64_t fixed,
                           uint64_t *seg, const ep_kv_t *kv)
{
    uint64_t share = target / m->p.n_layers;
    uint32_t l, i;

    if (m->p.overlap) {
        pd_status_t st = ep_pass_two(m, n, target, fixed, seg, kv);
        if (st != PD_OK)
            return st;
        goto done;
    }
    for (l = 0; l < m->p.n_layers; l++) {
        pd_status_t st;
        if (kv != NULL)
            for (i = 0; i < n; i++)
                write_token_layer_kv(m, kv->arena, kv->bt, m->ep_tok[i], m->ep_pos[i], l);
        if (l < m->p.first_dense) {
            ep_compute(m, seg, share);
        } else {
            st = ep_moe_layer(m, l, n, seg, share);
            if (st != PD_OK)
                return st;
        }
        if (kv != NULL && m->hook != NULL)
            m->hook(m->hook_arg, l, kv->pos_end);
    }
done:
    if (n == 0)
        STAT_ADD(m, ep_idle_passes, 1);
    else
        STAT_ADD(m, ep_passes, 1);
    STAT_ADD(m, ep_tokens, n);
    return PD_OK;
}

/* modeled and target time of an EP call (the passes slept their shares;
 * real_ns and late_ns count the non-EP calls only) */
static void ep_account(eng_model_t *m, uint64_t modeled)
{
    modeled += m->ep_extra; /* a second micro-batch's fixed costs */
    m->ep_extra = 0;
    STAT_ADD(m, modeled_ns, modeled);
    STAT_ADD(m, target_ns, (uint64_t)((double)modeled / m->p.speedup));
}

/* ---- ops ---------------------------------------------------------------------- */

static pd_status_t check_tok(const eng_model_t *m, int32_t token, uint32_t pos, uint32_t n_blocks)
{
    if (token < 0 || (uint32_t)token >= m->p.vocab)
        return PD_ERR_BAD_INPUT;
    if (pos >= m->p.ctx)
        return PD_ERR_TOO_BIG;
    if ((uint64_t)pos >= (uint64_t)n_blocks * m->geom.block_tokens)
        return PD_ERR_NO_KV_SPACE;
    return PD_OK;
}

/* Every decode item: a block table, a token and position the model takes. */
static pd_status_t check_items(const eng_model_t *m, const eng_decode_item_t *items,
                               uint32_t n_items)
{
    for (uint32_t i = 0; i < n_items; i++) {
        if (items[i].block_table == NULL)
            return PD_ERR_BAD_INPUT;
        pd_status_t st = check_tok(m, items[i].token, items[i].pos, items[i].n_blocks);
        if (st != PD_OK)
            return st;
    }
    return PD_OK;
}

static pd_status_t sim_prefill(eng_model_t *m, void *arena, const uint32_t *bt,
                               uint32_t n_blocks, const int32_t *tokens, uint32_t n_tokens,
                               uint32_t start_pos, float *logits)
{
    uint64_t t0 = pd_now_ns();
    uint32_t i;

    if (m == NULL || m->magic != SIM_MAGIC || arena == NULL || bt == NULL ||
        tokens == NULL || n_tokens == 0 || start_pos > UINT32_MAX - n_tokens)
        return PD_ERR_BAD_INPUT;
    for (i = 0; i < n_tokens; i++) {
        pd_status_t st = check_tok(m, tokens[i], start_pos + i, n_blocks);
        if (st != PD_OK)
            return st;
    }
    if (ep_model(m)) {
        /* slices of at most ep_t_max tokens, each a forward pass whose MoE
         * layers exchange with the group; KV written layer by layer */
        uint64_t seg = t0;
        uint32_t off, nn;
        if (m->ep.exchange == NULL)
            return PD_ERR_BAD_INPUT;
        m->ep_debt = 0;
        m->ep_extra = 0;
        for (off = 0; off < n_tokens; off += nn) {
            ep_kv_t kv;
            pd_status_t st;
            nn = n_tokens - off < m->ep_t_max ? n_tokens - off : m->ep_t_max;
            for (i = 0; i < nn; i++) {
                m->ep_tok[i] = tokens[off + i];
                m->ep_pos[i] = start_pos + off + i;
            }
            kv = (ep_kv_t){ arena, bt, start_pos + off + nn };
            st = ep_pass(m, nn, (uint64_t)((double)eng_sim_prefill_ns(&m->p, nn) /
                                           m->p.speedup), 0, &seg, &kv);
            if (st != PD_OK)
                return st;
        }
        STAT_ADD(m, kv_bytes_written, (uint64_t)n_tokens * m->geom.bytes_per_token);
        if (logits != NULL)
            make_logits(m, kv_checksum(m, arena, bt, start_pos + n_tokens),
                        start_pos + n_tokens - 1, logits);
        STAT_ADD(m, prefill_calls, 1);
        STAT_ADD(m, prefill_tokens, n_tokens);
        ep_account(m, eng_sim_prefill_ns(&m->p, n_tokens));
        return PD_OK;
    }
    if (m->hook == NULL) {
        for (i = 0; i < n_tokens; i++)
            write_token_kv(m, arena, bt, tokens[i], start_pos + i);
    } else {
        /* layer by layer, each layer's share of the modeled time spent
         * before its hook runs, as a real engine would (the bytes written
         * are the same) */
        uint64_t target = (uint64_t)((double)eng_sim_prefill_ns(&m->p, n_tokens) /
                                     m->p.speedup);
        uint32_t l;
        for (l = 0; l < m->p.n_layers; l++) {
            for (i = 0; i < n_tokens; i++)
                write_token_layer_kv(m, arena, bt, tokens[i], start_pos + i, l);
            sim_sleep_until(m, t0, target / m->p.n_layers * (l + 1));
            m->hook(m->hook_arg, l, start_pos + n_tokens);
        }
        STAT_ADD(m, kv_bytes_written, (uint64_t)n_tokens * m->geom.bytes_per_token);
    }
    if (logits != NULL)
        make_logits(m, kv_checksum(m, arena, bt, start_pos + n_tokens),
                    start_pos + n_tokens - 1, logits);
    STAT_ADD(m, prefill_calls, 1);
    STAT_ADD(m, prefill_tokens, n_tokens);
    sim_account(m, t0, eng_sim_prefill_ns(&m->p, n_tokens));
    return PD_OK;
}

static pd_status_t sim_decode(eng_model_t *m, void *arena, const eng_decode_item_t *items,
                              uint32_t n_items, float *logits)
{
    uint64_t t0 = pd_now_ns();
    uint32_t i;

    if (m == NULL || m->magic != SIM_MAGIC || arena == NULL || items == NULL ||
        n_items == 0 || logits == NULL)
        return PD_ERR_BAD_INPUT;
    {
        pd_status_t st = check_items(m, items, n_items);
        if (st != PD_OK)
            return st;
    }
    if (ep_model(m) && m->ep.exchange == NULL)
        return PD_ERR_BAD_INPUT;
    for (i = 0; i < n_items; i++) {
        const eng_decode_item_t *it = &items[i];
        write_token_kv(m, arena, it->block_table, it->token, it->pos);
        make_logits(m, kv_checksum(m, arena, it->block_table, it->pos + 1), it->pos,
                    logits + (size_t)i * m->p.vocab);
    }
    STAT_ADD(m, decode_steps, 1);
    STAT_ADD(m, decode_items, n_items);
    if (ep_model(m)) {
        /* slices of at most ep_t_max items, one forward pass each; the KV
         * and checksums above are the first compute segment's work */
        uint64_t seg = t0;
        uint32_t off, nn;
        m->ep_debt = 0;
        m->ep_extra = 0;
        for (off = 0; off < n_items; off += nn) {
            pd_status_t st;
            nn = n_items - off < m->ep_t_max ? n_items - off : m->ep_t_max;
            for (i = 0; i < nn; i++) {
                m->ep_tok[i] = items[off + i].token;
                m->ep_pos[i] = items[off + i].pos;
            }
            st = ep_pass(m, nn, (uint64_t)((double)eng_sim_decode_ns(&m->p, nn) /
                                           m->p.speedup), sim_fixed_ns(m), &seg, NULL);
            if (st != PD_OK)
                return st;
        }
        ep_account(m, eng_sim_decode_ns(&m->p, n_items));
        return PD_OK;
    }
    sim_account(m, t0, eng_sim_decode_ns(&m->p, n_items));
    return PD_OK;
}

/* The fused step of an EP rank: the chunk's rows then the items', in
 * forward passes of ep_t_max rows (the node pads the group to the busiest
 * rank's ceil(rows / max_batch) passes with ep_idle). KV and logits are
 * prefill(chunk) then decode(items)'s; the modeled time is theirs summed,
 * split over the passes by rows. A model without EP has no fused step
 * (PD_ERR_UNSUPPORTED: the caller runs prefill then decode, as before). */
static pd_status_t sim_step(eng_model_t *m, void *arena, const eng_chunk_t *c,
                            const eng_decode_item_t *items, uint32_t n_items, float *logits)
{
    uint64_t t0 = pd_now_ns(), seg = t0, modeled, target;
    uint32_t nc = c != NULL ? c->n_tokens : 0, rows, off, nn, i;
    float *lg = logits;

    if (m == NULL || m->magic != SIM_MAGIC)
        return PD_ERR_BAD_INPUT;
    if (!ep_model(m))
        return PD_ERR_UNSUPPORTED;
    if (m->ep.exchange == NULL || arena == NULL || (n_items > 0 && items == NULL) ||
        (c != NULL && (c->block_table == NULL || c->tokens == NULL || c->n_tokens == 0 ||
                       c->start_pos > UINT32_MAX - c->n_tokens)) ||
        nc + n_items == 0 || nc > UINT32_MAX - n_items ||
        (logits == NULL && (n_items > 0 || (c != NULL && c->logits))))
        return PD_ERR_BAD_INPUT;
    for (i = 0; i < nc; i++) {
        pd_status_t st = check_tok(m, c->tokens[i], c->start_pos + i, c->n_blocks);
        if (st != PD_OK)
            return st;
    }
    {
        pd_status_t st = check_items(m, items, n_items);
        if (st != PD_OK)
            return st;
    }
    for (i = 0; i < nc; i++)
        write_token_kv(m, arena, c->block_table, c->tokens[i], c->start_pos + i);
    if (c != NULL && c->logits) {
        make_logits(m, kv_checksum(m, arena, c->block_table, c->start_pos + nc),
                    c->start_pos + nc - 1, lg);
        lg += m->p.vocab;
    }
    for (i = 0; i < n_items; i++) {
        const eng_decode_item_t *it = &items[i];
        write_token_kv(m, arena, it->block_table, it->token, it->pos);
        make_logits(m, kv_checksum(m, arena, it->block_table, it->pos + 1), it->pos,
                    lg + (size_t)i * m->p.vocab);
    }
    rows = nc + n_items;
    modeled = (nc ? eng_sim_prefill_ns(&m->p, nc) : 0) +
              (n_items ? eng_sim_decode_ns(&m->p, n_items) : 0);
    target = (uint64_t)((double)modeled / m->p.speedup);
    m->ep_debt = 0;
    m->ep_extra = 0;
    for (off = 0; off < rows; off += nn) {
        pd_status_t st;
        nn = rows - off < m->ep_t_max ? rows - off : m->ep_t_max;
        for (i = 0; i < nn; i++) {
            uint32_t r = off + i;
            m->ep_tok[i] = r < nc ? c->tokens[r] : items[r - nc].token;
            m->ep_pos[i] = r < nc ? c->start_pos + r : items[r - nc].pos;
        }
        st = ep_pass(m, nn, (uint64_t)((double)target * nn / rows),
                     n_items ? sim_fixed_ns(m) : 0, &seg, NULL);
        if (st != PD_OK)
            return st;
    }
    if (nc) {
        STAT_ADD(m, prefill_calls, 1);
        STAT_ADD(m, prefill_tokens, nc);
    }
    if (n_items) {
        STAT_ADD(m, decode_steps, 1);
        STAT_ADD(m, decode_items, n_items);
    }
    ep_account(m, modeled);
    return PD_OK;
}

static pd_status_t sim_set_kv_layout(eng_model_t *m, const eng_kv_layout_t *lay)
{
    const uint64_t lbb = m->geom.layer_block_bytes;

    if (m == NULL || m->magic != SIM_MAGIC || lay == NULL)
        return PD_ERR_BAD_INPUT;
    /* layer blocks must not overlap: one stride is the layer block, the
     * other a multiple of it covering every block/layer of the first */
    if (!((lay->layer_stride == lbb && lay->block_stride == m->geom.block_bytes) ||
          (lay->block_stride == lbb && lay->layer_stride >= lbb &&
           lay->layer_stride % lbb == 0)))
        return PD_ERR_BAD_INPUT;
    m->lay = *lay;
    return PD_OK;
}

static void sim_set_layer_hook(eng_model_t *m, eng_layer_hook_t hook, void *arg)
{
    if (m == NULL || m->magic != SIM_MAGIC)
        return;
    m->hook = hook;
    m->hook_arg = arg;
}

static pd_status_t sim_set_ep(eng_model_t *m, const eng_ep_xport_t *x)
{
    size_t cap[ENG_EP_SLOTS];

    if (m == NULL || m->magic != SIM_MAGIC || x == NULL || !ep_model(m) ||
        x->rank != m->ep_rank || x->size != m->ep_size || x->send_buf == NULL ||
        x->exchange == NULL || (x->post == NULL) != (x->wait == NULL) ||
        (m->p.overlap && x->post == NULL))
        return PD_ERR_BAD_INPUT;
    eng_sim_ep_cap(m, cap);
    for (int ph = 0; ph < ENG_EP_SLOTS; ph++)
        if (x->cap[ph] < cap[ph])
            return PD_ERR_TOO_BIG;
    m->ep = *x;
    return PD_OK;
}

/* A pass with no tokens: no compute of its own, the group's exchanges. */
static pd_status_t sim_ep_idle(eng_model_t *m)
{
    uint64_t seg = pd_now_ns();

    if (m == NULL || m->magic != SIM_MAGIC || !ep_model(m) || m->ep.exchange == NULL)
        return PD_ERR_BAD_INPUT;
    m->ep_debt = 0;
    m->ep_extra = 0;
    return ep_pass(m, 0, 0, 0, &seg, NULL);
}

const eng_sim_params_t *eng_sim_params(const eng_model_t *m)
{
    return m != NULL && m->magic == SIM_MAGIC ? &m->p : NULL;
}

bool eng_sim_stats(const eng_model_t *m, eng_sim_stats_t *out)
{
    const uint64_t *src;
    uint64_t *dst;
    size_t i;

    if (m == NULL || m->magic != SIM_MAGIC)
        return false;
    src = (const uint64_t *)&m->stats;
    dst = (uint64_t *)out;
    for (i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
    return true;
}

const eng_ops_t eng_sim_ops = {
    .name = "sim",
    .load = sim_load,
    .destroy = sim_destroy,
    .geometry = sim_geometry,
    .prefill = sim_prefill,
    .decode = sim_decode,
    .set_kv_layout = sim_set_kv_layout,
    .set_layer_hook = sim_set_layer_hook,
    .step = sim_step,
    .set_ep = sim_set_ep,
    .ep_idle = sim_ep_idle,
    .ep_cap = eng_sim_ep_cap,
    .ep_pass_rows = sim_ep_pass_rows,
};
