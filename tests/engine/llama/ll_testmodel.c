/* ll_testmodel.c - seeded tiny models (GGUF writer) and the reference
 * forward pass. The reference deliberately shares no code with the engine:
 * weights are dequantized with engine/gguf's reference routines into f64,
 * every sum is an f64 loop, attention recomputes the whole sequence. */
#include "ll_testmodel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_qdot.h"
#include "gguf.h"

static uint64_t tm_rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static float tm_uniform(uint64_t *s) /* [-1, 1) */
{
    return (float)((double)(tm_rng(s) >> 11) * 0x1.0p-52 - 1.0);
}

static const char *tm_omit;

static uint32_t tm_nmat = 1; /* > 1: the next tensor is (tm_nmat, rows/tm_nmat, cols) */

static int tm_add(gguf_writer_t *w, const char *name, uint32_t type, uint32_t rows,
                  uint32_t cols, float scale, float offset, uint64_t *rng)
{
    if (tm_omit && strcmp(name, tm_omit) == 0)
        return 0;
    size_t n = (size_t)rows * cols;
    float *d = malloc(n * sizeof(float));
    if (!d)
        return -1;
    for (size_t i = 0; i < n; i++)
        d[i] = offset + scale * tm_uniform(rng);
    uint64_t ne[3] = { cols, rows / tm_nmat, tm_nmat };
    uint32_t nd = tm_nmat > 1 ? 3 : rows == 1 ? 1 : 2;
    const ggml_type_info_t *info = ggml_type_info(type);
    pd_status_t st;
    if (info && !info->supported) { /* a type pdserve cannot write: zero bytes */
        uint64_t nb = 0;
        ggml_nbytes(type, n, &nb);
        void *raw = calloc(1, nb ? nb : 1);
        st = raw ? gguf_writer_add_tensor_raw(w, name, type, nd, ne, raw, nb)
                 : PD_ERR_NO_MEMORY;
        free(raw);
    } else {
        st = gguf_writer_add_tensor_f32(w, name, type, nd, ne, d);
    }
    free(d);
    return st == PD_OK ? 0 : -1;
}

int ll_tm_write(const ll_tm_spec_t *s, const char *path)
{
    gguf_writer_t *w;
    if (gguf_writer_create(&w) != PD_OK)
        return -1;
    uint64_t rng = s->seed;
    char key[128];
    tm_omit = s->omit;
    uint32_t hd = s->head_dim ? s->head_dim : s->n_embd / s->n_heads;
    bool qkn = strcmp(s->arch, "qwen3") == 0 || strcmp(s->arch, "qwen3moe") == 0 ||
               strcmp(s->arch, "gemma3") == 0;
    bool gemma = strcmp(s->arch, "gemma3") == 0;
    int rc = 0;
#define KU32(suffix, v)                                                       \
    snprintf(key, sizeof(key), "%s." suffix, s->arch);                         \
    rc |= gguf_writer_add_u32(w, key, (v)) != PD_OK;
    rc |= gguf_writer_add_string(w, "general.architecture", s->arch) != PD_OK;
    rc |= gguf_writer_add_string(w, "general.name", "ll-test") != PD_OK;
    KU32("context_length", s->ctx)
    KU32("embedding_length", s->n_embd)
    KU32("block_count", s->n_layers)
    KU32("feed_forward_length", s->n_ff)
    KU32("attention.head_count", s->n_heads)
    KU32("attention.head_count_kv", s->n_kv_heads)
    KU32("rope.dimension_count", s->rope_dim ? s->rope_dim : hd)
    if (s->head_dim) {
        KU32("attention.key_length", hd)
        KU32("attention.value_length", hd)
    }
    if (s->n_expert) {
        KU32("expert_count", s->n_expert)
        KU32("expert_used_count", s->n_expert_used)
        KU32("expert_feed_forward_length", s->n_ff_exp)
    }
    if (s->swa) {
        KU32("attention.sliding_window", s->swa)
    }
#undef KU32
    snprintf(key, sizeof(key), "%s.attention.layer_norm_rms_epsilon", s->arch);
    rc |= gguf_writer_add_f32(w, key, 1e-5f) != PD_OK;
    snprintf(key, sizeof(key), "%s.rope.freq_base", s->arch);
    rc |= gguf_writer_add_f32(w, key, 10000.0f) != PD_OK;
    if (s->rope_linear > 0) {
        snprintf(key, sizeof(key), "%s.rope.scaling.type", s->arch);
        rc |= gguf_writer_add_string(w, key, "linear") != PD_OK;
        snprintf(key, sizeof(key), "%s.rope.scaling.factor", s->arch);
        rc |= gguf_writer_add_f32(w, key, s->rope_linear) != PD_OK;
    }

    uint32_t E = s->n_embd, qd = s->n_heads * hd, kvd = s->n_kv_heads * hd;
    float se = 1.0f / sqrtf((float)E), sf = 1.0f / sqrtf((float)s->n_ff);
    rc |= tm_add(w, "token_embd.weight", s->wtype, s->vocab, E, 1.0f, 0, &rng);
    rc |= tm_add(w, "output_norm.weight", 0, 1, E, 0.1f, 1.0f, &rng);
    if (s->rope_freqs) /* divisors in [1, 9) */
        rc |= tm_add(w, "rope_freqs.weight", 0, 1, (s->rope_dim ? s->rope_dim : hd) / 2,
                     4.0f, 5.0f, &rng);
    uint32_t alt = s->wtype_alt ? s->wtype_alt : s->wtype;
    if (!s->tied)
        rc |= tm_add(w, "output.weight", alt, s->vocab, E, se, 0, &rng);
    for (uint32_t l = 0; l < s->n_layers && !rc; l++) {
        char n[96];
#define T(suffix, type, rows, cols, scale, off)                               \
        do {                                                                  \
            snprintf(n, sizeof(n), "blk.%u." suffix, l);                       \
            rc |= tm_add(w, n, type, rows, cols, scale, off, &rng);           \
        } while (0);
        T("attn_norm.weight", 0, 1, E, 0.1f, 1.0f)
        T("attn_q.weight", s->wtype, qd, E, 2 * se, 0)
        T("attn_k.weight", s->wtype, kvd, E, 2 * se, 0)
        T("attn_v.weight", alt, kvd, E, se, 0)
        if (s->bias) {
            T("attn_q.bias", 0, 1, qd, 0.2f, 0)
            T("attn_k.bias", 0, 1, kvd, 0.2f, 0)
            T("attn_v.bias", 0, 1, kvd, 0.2f, 0)
        }
        if (qkn) {
            T("attn_q_norm.weight", 0, 1, hd, 0.1f, 1.0f)
            T("attn_k_norm.weight", 0, 1, hd, 0.1f, 1.0f)
        }
        T("attn_output.weight", s->wtype, E, qd, se, 0)
        if (gemma)
            T("post_attention_norm.weight", 0, 1, E, 0.1f, 1.0f)
        T("ffn_norm.weight", 0, 1, E, 0.1f, 1.0f)
        if (s->n_expert) {
            uint32_t NE = s->n_expert, FE = s->n_ff_exp;
            T("ffn_gate_inp.weight", 0, NE, E, 4 * se, 0)
            tm_nmat = NE;
            T("ffn_gate_exps.weight", s->wtype, NE * FE, E, 2 * se, 0)
            T("ffn_up_exps.weight", s->wtype, NE * FE, E, se, 0)
            T("ffn_down_exps.weight", alt, NE * E, FE, 1.0f / sqrtf((float)FE), 0)
            tm_nmat = 1;
        } else {
            T("ffn_gate.weight", s->wtype, s->n_ff, E, 2 * se, 0)
            T("ffn_up.weight", s->wtype, s->n_ff, E, se, 0)
            T("ffn_down.weight", alt, E, s->n_ff, sf, 0)
        }
        if (gemma)
            T("post_ffw_norm.weight", 0, 1, E, 0.1f, 1.0f)
#undef T
    }
    char err[200];
    if (!rc && gguf_writer_write(w, path, err, sizeof(err)) != PD_OK) {
        fprintf(stderr, "ll_tm_write: %s\n", err);
        rc = 1;
    }
    gguf_writer_destroy(w);
    return rc ? -1 : 0;
}

/* ------------------------------------------------------------------ */

bool ll_ref_qact;

/* The ggml type of each dequantized tensor (newest first on lookup: freed
 * addresses are reused), so ref_mv knows which activation format pdserve's
 * integer dot quantizes to. */
#define REF_NREG 1024
static struct {
    const double *p;
    uint64_t n;
    uint32_t type;
} ref_reg[REF_NREG];
static unsigned ref_nreg;

static uint32_t ref_type_of(const double *W)
{
    for (unsigned k = ref_nreg; k-- > 0 && k + REF_NREG >= ref_nreg;) {
        unsigned j = k % REF_NREG;
        if (W >= ref_reg[j].p && W < ref_reg[j].p + ref_reg[j].n)
            return ref_reg[j].type;
    }
    return GGML_TYPE_F32;
}

static double *ref_tensor(const gguf_t *g, const char *name, uint64_t *n_p)
{
    const gguf_tensor_t *t = gguf_tensor_find(g, name);
    if (!t) {
        *n_p = 0;
        return NULL;
    }
    float *f = malloc(t->n_elements * sizeof(float));
    double *d = malloc(t->n_elements * sizeof(double));
    if (!f || !d || ggml_dequantize_row(t->type, t->data, f, t->n_elements) != PD_OK) {
        free(f);
        free(d);
        return NULL;
    }
    for (uint64_t i = 0; i < t->n_elements; i++)
        d[i] = f[i];
    free(f);
    *n_p = t->n_elements;
    ref_reg[ref_nreg % REF_NREG].p = d;
    ref_reg[ref_nreg % REF_NREG].n = t->n_elements;
    ref_reg[ref_nreg % REF_NREG].type = t->type;
    ref_nreg++;
    return d;
}

static double *ref_get(const gguf_t *g, const char *suffix, uint32_t l)
{
    char name[96];
    uint64_t n;
    snprintf(name, sizeof(name), "blk.%u.%s", l, suffix);
    return ref_tensor(g, name, &n);
}

/* ll_ref_qact: x as pdserve's integer dot sees it for W's type - the f32
 * activation rounded to 8 bits per block by engine/gguf's quantizer,
 * read back as q * d. */
static void ref_qact(double *xq, const double *x, uint32_t cols, uint32_t type)
{
    int act = ggml_qdot_act(type);
    float *xf = malloc(cols * sizeof(float));
    uint8_t *a = malloc(ggml_qdot_act_bytes(act, cols));
    if (!xf || !a)
        abort();
    for (uint32_t c = 0; c < cols; c++)
        xf[c] = (float)x[c];
    ggml_qdot_quantize(act, xf, cols, a);
    for (uint32_t c = 0; c < cols; c++) {
        xq[c] = (double)ggml_qdot_act_q(act, a, cols, c) * ggml_qdot_act_scale(act, a, cols, c);
    }
    free(xf);
    free(a);
}

/* y (rows) = W (rows, cols) x (cols) */
static void ref_mv(double *y, const double *W, const double *x, uint32_t rows, uint32_t cols)
{
    uint32_t type = ref_type_of(W);
    double *xq = NULL;
    if (ll_ref_qact && ggml_qdot_act(type) != GGML_QACT_NONE &&
        cols % ggml_qdot_block(type) == 0) {
        xq = malloc(cols * sizeof(double));
        if (!xq)
            abort();
        ref_qact(xq, x, cols, type);
        x = xq;
    }
    for (uint32_t r = 0; r < rows; r++) {
        double s = 0;
        for (uint32_t c = 0; c < cols; c++)
            s += W[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
    free(xq);
}

static void ref_norm(double *y, const double *x, const double *w, uint32_t n, double eps)
{
    double ss = 0;
    for (uint32_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + eps);
    for (uint32_t i = 0; i < n; i++)
        y[i] = x[i] * sc * w[i];
}

static double ref_linear = 1.0; /* rope.scaling.factor of the model being run */

static void ref_rope(double *h, uint32_t pos, uint32_t rope_dim, double base, bool neox,
                     const double *ff, double linear)
{
    for (uint32_t i = 0; i < rope_dim / 2; i++) {
        double th = pos / linear * pow(base, -(double)(2 * i) / rope_dim) /
                    (ff ? ff[i] : 1.0);
        double c = cos(th), s = sin(th);
        uint32_t a = neox ? i : 2 * i, b = neox ? i + rope_dim / 2 : 2 * i + 1;
        double x0 = h[a], x1 = h[b];
        h[a] = x0 * c - x1 * s;
        h[b] = x0 * s + x1 * c;
    }
}

int ll_ref_logits(const char *path, const int32_t *toks, uint32_t n, bool kv_f16,
                  double *logits)
{
    gguf_t *g;
    char err[200];
    if (gguf_open(path, &g, err, sizeof(err)) != PD_OK)
        return -1;
    const char *as;
    uint64_t al;
    char arch[16] = "";
    gguf_get_string(g, "general.architecture", &as, &al);
    memcpy(arch, as, al < 15 ? al : 15);
    bool neox = strcmp(arch, "llama") != 0;
    bool gemma = strcmp(arch, "gemma3") == 0;
    uint32_t E, L, F = 0, H, KH, RD, HD = 0, NE = 0, NU = 0, FE = 0, SWA = 0;
    float eps, base;
    char key[128];
#define GU(suffix, v) snprintf(key, sizeof(key), "%s." suffix, arch); gguf_get_u32(g, key, &v);
    GU("embedding_length", E)
    GU("block_count", L)
    GU("feed_forward_length", F)
    GU("attention.head_count", H)
    GU("attention.head_count_kv", KH)
    GU("rope.dimension_count", RD)
    GU("attention.key_length", HD)
    GU("expert_count", NE)
    GU("expert_used_count", NU)
    GU("expert_feed_forward_length", FE)
    GU("attention.sliding_window", SWA)
#undef GU
    float base_swa = 10000.0f, softcap = 0.0f;
    snprintf(key, sizeof(key), "%s.rope.freq_base_swa", arch);
    gguf_get_f32(g, key, &base_swa);
    snprintf(key, sizeof(key), "%s.final_logit_softcapping", arch);
    gguf_get_f32(g, key, &softcap);
    if (NE && FE == 0)
        FE = F / NU;
    if (F < FE)
        F = FE;
    snprintf(key, sizeof(key), "%s.attention.layer_norm_rms_epsilon", arch);
    gguf_get_f32(g, key, &eps);
    snprintf(key, sizeof(key), "%s.rope.freq_base", arch);
    gguf_get_f32(g, key, &base);
    float lin = 1.0f;
    snprintf(key, sizeof(key), "%s.rope.scaling.factor", arch);
    gguf_get_f32(g, key, &lin);
    ref_linear = lin;
    uint32_t hd = HD ? HD : E / H, qd = H * hd, kvd = KH * hd;
    uint64_t ne;
    double *emb = ref_tensor(g, "token_embd.weight", &ne);
    uint32_t V = (uint32_t)(ne / E);
    double *outw = ref_tensor(g, "output.weight", &ne);
    double *onorm = ref_tensor(g, "output_norm.weight", &ne);
    double *rff = ref_tensor(g, "rope_freqs.weight", &ne);

    double *X = calloc((size_t)n * E, sizeof(double));     /* (n, E) */
    double *Kc = calloc((size_t)n * kvd, sizeof(double));  /* (n, kvd) this layer */
    double *Vc = calloc((size_t)n * kvd, sizeof(double));
    double *Q = calloc((size_t)n * qd, sizeof(double));
    double *xb = calloc(E > F ? (E > qd ? E : qd) : (F > qd ? F : qd), sizeof(double));
    double *xb2 = calloc(E + qd + F, sizeof(double));
    double *hb = calloc(F, sizeof(double)), *hb2 = calloc(F, sizeof(double));
    double *att = calloc((size_t)n * qd, sizeof(double));
    double *sc = calloc(n, sizeof(double));
    double *rl = calloc(NE + 1, sizeof(double));
    double *moe = calloc(E, sizeof(double));
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t i = 0; i < E; i++)
            X[(size_t)t * E + i] = emb[(size_t)toks[t] * E + i] *
                                   (gemma ? (double)sqrtf((float)E) : 1.0);

    for (uint32_t l = 0; l < L; l++) {
        double *an = ref_get(g, "attn_norm.weight", l);
        double *wq = ref_get(g, "attn_q.weight", l);
        double *wk = ref_get(g, "attn_k.weight", l);
        double *wv = ref_get(g, "attn_v.weight", l);
        double *bq = ref_get(g, "attn_q.bias", l);
        double *bk = ref_get(g, "attn_k.bias", l);
        double *bv = ref_get(g, "attn_v.bias", l);
        double *wo = ref_get(g, "attn_output.weight", l);
        double *fn = ref_get(g, "ffn_norm.weight", l);
        double *wg = ref_get(g, "ffn_gate.weight", l);
        double *wu = ref_get(g, "ffn_up.weight", l);
        double *wd = ref_get(g, "ffn_down.weight", l);
        double *qn = ref_get(g, "attn_q_norm.weight", l);
        double *kn = ref_get(g, "attn_k_norm.weight", l);
        double *pan = ref_get(g, "post_attention_norm.weight", l);
        double *pfn = ref_get(g, "post_ffw_norm.weight", l);
        double *wr = ref_get(g, "ffn_gate_inp.weight", l);
        double *wge = ref_get(g, "ffn_gate_exps.weight", l);
        double *wue = ref_get(g, "ffn_up_exps.weight", l);
        double *wde = ref_get(g, "ffn_down_exps.weight", l);
        bool swa = SWA > 0 && l % 6 < 5;
        for (uint32_t t = 0; t < n; t++) {
            double *x = X + (size_t)t * E;
            ref_norm(xb, x, an, E, eps);
            double *q = Q + (size_t)t * qd, *k = Kc + (size_t)t * kvd, *v = Vc + (size_t)t * kvd;
            ref_mv(q, wq, xb, qd, E);
            ref_mv(k, wk, xb, kvd, E);
            ref_mv(v, wv, xb, kvd, E);
            for (uint32_t i = 0; bq && i < qd; i++)
                q[i] += bq[i];
            for (uint32_t i = 0; bk && i < kvd; i++)
                k[i] += bk[i];
            for (uint32_t i = 0; bv && i < kvd; i++)
                v[i] += bv[i];
            for (uint32_t h = 0; qn && h < H; h++)
                ref_norm(q + h * hd, q + h * hd, qn, hd, eps);
            for (uint32_t h = 0; kn && h < KH; h++)
                ref_norm(k + h * hd, k + h * hd, kn, hd, eps);
            for (uint32_t h = 0; h < H; h++)
                ref_rope(q + h * hd, t, RD, swa ? base_swa : base, neox, swa ? NULL : rff,
                         swa ? 1.0 : ref_linear);
            for (uint32_t h = 0; h < KH; h++)
                ref_rope(k + h * hd, t, RD, swa ? base_swa : base, neox, swa ? NULL : rff,
                         swa ? 1.0 : ref_linear);
            if (kv_f16)
                for (uint32_t i = 0; i < kvd; i++) {
                    k[i] = ggml_fp16_to_fp32(ggml_fp32_to_fp16((float)k[i]));
                    v[i] = ggml_fp16_to_fp32(ggml_fp32_to_fp16((float)v[i]));
                }
        }
        for (uint32_t t = 0; t < n; t++) {
            for (uint32_t h = 0; h < H; h++) {
                const double *q = Q + (size_t)t * qd + h * hd;
                uint32_t kh = h / (H / KH);
                double mx = -INFINITY, sum = 0;
                uint32_t lo = swa && t + 1 > SWA ? t + 1 - SWA : 0;
                for (uint32_t s = 0; s < lo; s++)
                    sc[s] = 0;
                for (uint32_t s = lo; s <= t; s++) {
                    double d = 0;
                    for (uint32_t i = 0; i < hd; i++)
                        d += q[i] * Kc[(size_t)s * kvd + kh * hd + i];
                    sc[s] = d / sqrt((double)hd);
                    if (sc[s] > mx)
                        mx = sc[s];
                }
                for (uint32_t s = lo; s <= t; s++) {
                    sc[s] = exp(sc[s] - mx);
                    sum += sc[s];
                }
                double *o = att + (size_t)t * qd + h * hd;
                for (uint32_t i = 0; i < hd; i++) {
                    double a = 0;
                    for (uint32_t s = 0; s <= t; s++)
                        a += sc[s] / sum * Vc[(size_t)s * kvd + kh * hd + i];
                    o[i] = a;
                }
            }
        }
        for (uint32_t t = 0; t < n; t++) {
            double *x = X + (size_t)t * E;
            ref_mv(xb2, wo, att + (size_t)t * qd, E, qd);
            if (pan)
                ref_norm(xb2, xb2, pan, E, eps);
            for (uint32_t i = 0; i < E; i++)
                x[i] += xb2[i];
            ref_norm(xb, x, fn, E, eps);
            uint32_t n_ex = NE ? NU : 1;
            int used[64] = { 0 };
            double wsum = 0, ew[64];
            if (NE) { /* softmax router, top-NU by logit, renormalized */
                ref_mv(rl, wr, xb, NE, E);
                for (uint32_t k = 0; k < NU; k++) {
                    int best = -1;
                    for (uint32_t e = 0; e < NE; e++) {
                        bool taken = false;
                        for (uint32_t j = 0; j < k; j++)
                            taken |= used[j] == (int)e;
                        if (!taken && (best < 0 || rl[e] > rl[best]))
                            best = (int)e;
                    }
                    used[k] = best;
                    ew[k] = exp(rl[best] - rl[used[0]]); /* softmax denominators cancel */
                    wsum += ew[k];
                }
            }
            memset(moe, 0, E * sizeof(double));
            for (uint32_t k = 0; k < n_ex; k++) {
                uint32_t FF = NE ? FE : F;
                const double *g_ = NE ? wge + (size_t)used[k] * FE * E : wg;
                const double *u_ = NE ? wue + (size_t)used[k] * FE * E : wu;
                const double *d_ = NE ? wde + (size_t)used[k] * E * FE : wd;
                ref_mv(hb, g_, xb, FF, E);
                ref_mv(hb2, u_, xb, FF, E);
                for (uint32_t i = 0; i < FF; i++) {
                    double a = hb[i];
                    hb[i] = gemma ? 0.5 * a * (1.0 + tanh(0.7978845608028654 * a *
                                                          (1.0 + 0.044715 * a * a))) * hb2[i]
                                  : a / (1.0 + exp(-a)) * hb2[i];
                }
                ref_mv(xb2, d_, hb, E, FF);
                for (uint32_t i = 0; i < E; i++)
                    moe[i] += (NE ? ew[k] / wsum : 1.0) * xb2[i];
            }
            if (pfn)
                ref_norm(moe, moe, pfn, E, eps);
            for (uint32_t i = 0; i < E; i++)
                x[i] += moe[i];
        }
        free(an); free(wq); free(wk); free(wv); free(bq); free(bk); free(bv);
        free(wo); free(fn); free(wg); free(wu); free(wd);
        free(qn); free(kn); free(pan); free(pfn); free(wr); free(wge); free(wue); free(wde);
    }
    ref_norm(xb, X + (size_t)(n - 1) * E, onorm, E, eps);
    ref_mv(logits, outw ? outw : emb, xb, V, E);
    for (uint32_t i = 0; softcap > 0 && i < V; i++)
        logits[i] = softcap * tanh(logits[i] / softcap);
    free(rl);
    free(moe);
    free(X); free(Kc); free(Vc); free(Q); free(xb); free(xb2); free(hb); free(hb2);
    free(att); free(sc); free(emb); free(outw); free(onorm); free(rff);
    gguf_close(g);
    return 0;
}
