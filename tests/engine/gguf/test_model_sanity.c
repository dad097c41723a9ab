/* test_model_sanity.c - does a pd-mkmodel model behave like a model?
 *
 * A deliberately plain f32 reference forward pass (dequantize everything,
 * one token at a time, llama.cpp semantics: RMSNorm, RoPE adjacent pairs
 * for `llama` / NEOX halves for `qwen2`, GQA attention, SwiGLU FFN) runs
 * greedy decoding on generated models and checks that the generator's
 * scaling keeps activations sane and outputs varied:
 *   - logits finite, residual RMS bounded at every layer
 *   - greedy continuations use many distinct tokens, mostly printable bytes
 *   - different prompts give different continuations
 * It also prints the greedy tokens: engine/llama can compare its own.
 *   usage: test-model-sanity MODEL.gguf [MODEL.gguf...]        */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "gguf.h"

typedef struct {
    float *attn_norm, *wq, *wk, *wv, *bq, *bk, *bv, *wo;   /* wq: (dim, dim) row-major out x in */
    float *ffn_norm, *wg, *wu, *wd;
} ref_layer_t;

typedef struct {
    uint32_t dim, layers, heads, kv_heads, head_dim, ffn, vocab, ctx;
    float eps, rope_base;
    bool neox;
    float *embd;               /* (vocab, dim) */
    float *out_norm;           /* (dim) */
    float *out;                /* (vocab, dim), may alias embd */
    ref_layer_t *l;            /* (layers) */
    float *kc, *vc;            /* (layers, ctx, kv_heads * head_dim) */
    double max_rms;            /* largest residual RMS seen */
} ref_model_t;

static float *load(const gguf_t *g, const char *name, uint64_t n_expect, bool optional)
{
    const gguf_tensor_t *t = gguf_tensor_find(g, name);
    if (t == NULL) {
        if (!optional)
            fail_msg("missing %s", name);
        return NULL;
    }
    assert_int_equal(t->n_elements, n_expect);
    float *f = malloc(n_expect * sizeof(float));
    assert_int_equal(ggml_dequantize_row(t->type, t->data, f, n_expect), PD_OK);
    return f;
}

static uint32_t u32(const gguf_t *g, const char *arch, const char *sfx)
{
    char key[128];
    uint32_t v;
    snprintf(key, sizeof(key), "%s.%s", arch, sfx);
    assert_int_equal(gguf_get_u32(g, key, &v), PD_OK);
    return v;
}

static void ref_load(ref_model_t *m, const gguf_t *g)
{
    const char *s;
    uint64_t len;
    char arch[16] = "", key[128], name[96];

    assert_int_equal(gguf_get_string(g, "general.architecture", &s, &len), PD_OK);
    assert_true(len < sizeof(arch));
    memcpy(arch, s, len);
    memset(m, 0, sizeof(*m));
    m->dim = u32(g, arch, "embedding_length");
    m->layers = u32(g, arch, "block_count");
    m->heads = u32(g, arch, "attention.head_count");
    m->kv_heads = u32(g, arch, "attention.head_count_kv");
    m->ffn = u32(g, arch, "feed_forward_length");
    m->vocab = u32(g, arch, "vocab_size");
    m->ctx = 256;
    m->head_dim = m->dim / m->heads;
    m->neox = strcmp(arch, "qwen2") == 0;
    snprintf(key, sizeof(key), "%s.attention.layer_norm_rms_epsilon", arch);
    assert_int_equal(gguf_get_f32(g, key, &m->eps), PD_OK);
    snprintf(key, sizeof(key), "%s.rope.freq_base", arch);
    assert_int_equal(gguf_get_f32(g, key, &m->rope_base), PD_OK);
    uint32_t kvd = m->kv_heads * m->head_dim;
    m->embd = load(g, "token_embd.weight", (uint64_t)m->vocab * m->dim, false);
    m->out_norm = load(g, "output_norm.weight", m->dim, false);
    m->out = load(g, "output.weight", (uint64_t)m->vocab * m->dim, true);
    if (m->out == NULL)
        m->out = m->embd;
    m->l = calloc(m->layers, sizeof(*m->l));
    for (uint32_t i = 0; i < m->layers; i++) {
        ref_layer_t *L = &m->l[i];
#define LD(field, sfx, n, opt) (snprintf(name, sizeof(name), "blk.%u." sfx, i), \
                                L->field = load(g, name, n, opt))
        LD(attn_norm, "attn_norm.weight", m->dim, false);
        LD(wq, "attn_q.weight", (uint64_t)m->dim * m->dim, false);
        LD(wk, "attn_k.weight", (uint64_t)kvd * m->dim, false);
        LD(wv, "attn_v.weight", (uint64_t)kvd * m->dim, false);
        LD(bq, "attn_q.bias", m->dim, true);
        LD(bk, "attn_k.bias", kvd, true);
        LD(bv, "attn_v.bias", kvd, true);
        LD(wo, "attn_output.weight", (uint64_t)m->dim * m->dim, false);
        LD(ffn_norm, "ffn_norm.weight", m->dim, false);
        LD(wg, "ffn_gate.weight", (uint64_t)m->ffn * m->dim, false);
        LD(wu, "ffn_up.weight", (uint64_t)m->ffn * m->dim, false);
        LD(wd, "ffn_down.weight", (uint64_t)m->dim * m->ffn, false);
#undef LD
    }
    m->kc = calloc((size_t)m->layers * m->ctx * kvd, sizeof(float));
    m->vc = calloc((size_t)m->layers * m->ctx * kvd, sizeof(float));
}

static void ref_free(ref_model_t *m)
{
    for (uint32_t i = 0; i < m->layers; i++) {
        ref_layer_t *L = &m->l[i];
        float *p[] = {L->attn_norm, L->wq, L->wk, L->wv, L->bq, L->bk, L->bv, L->wo,
                      L->ffn_norm, L->wg, L->wu, L->wd};
        for (size_t j = 0; j < sizeof(p) / sizeof(p[0]); j++)
            free(p[j]);
    }
    if (m->out != m->embd)
        free(m->out);
    free(m->embd);
    free(m->out_norm);
    free(m->l);
    free(m->kc);
    free(m->vc);
}

/* y (rows) = W (rows, cols) x (cols) [+ b] */
static void matvec(float *y, const float *w, const float *x, uint32_t rows, uint32_t cols,
                   const float *b)
{
    for (uint32_t r = 0; r < rows; r++) {
        double acc = 0;
        for (uint32_t c = 0; c < cols; c++)
            acc += (double)w[(size_t)r * cols + c] * x[c];
        y[r] = (float)acc + (b ? b[r] : 0.0f);
    }
}

static void rmsnorm(float *o, const float *x, const float *w, uint32_t n, float eps)
{
    double ss = 0;
    for (uint32_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float s = 1.0f / sqrtf((float)(ss / n) + eps);
    for (uint32_t i = 0; i < n; i++)
        o[i] = x[i] * s * w[i];
}

static void rope(float *v, uint32_t n_heads, uint32_t hd, uint32_t pos, float base, bool neox)
{
    for (uint32_t h = 0; h < n_heads; h++) {
        float *x = v + h * hd;
        for (uint32_t i = 0; i < hd / 2; i++) {
            double theta = pos * pow(base, -2.0 * i / hd);
            float c = (float)cos(theta), s = (float)sin(theta);
            uint32_t a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
            float x0 = x[a], x1 = x[b];
            x[a] = x0 * c - x1 * s;
            x[b] = x0 * s + x1 * c;
        }
    }
}

static void ref_forward(ref_model_t *m, int32_t token, uint32_t pos, float *logits)
{
    uint32_t d = m->dim, hd = m->head_dim, kvd = m->kv_heads * hd;
    float *x = malloc(d * sizeof(float)), *xn = malloc(d * sizeof(float));
    float *q = malloc(d * sizeof(float)), *att = malloc(d * sizeof(float));
    float *tmp = malloc(d * sizeof(float)), *sc = malloc((pos + 1) * sizeof(float));
    float *g = malloc(m->ffn * sizeof(float)), *u = malloc(m->ffn * sizeof(float));

    assert_true(pos < m->ctx && token >= 0 && (uint32_t)token < m->vocab);
    memcpy(x, m->embd + (size_t)token * d, d * sizeof(float));
    for (uint32_t l = 0; l < m->layers; l++) {
        ref_layer_t *L = &m->l[l];
        float *kc = m->kc + ((size_t)l * m->ctx) * kvd, *vc = m->vc + ((size_t)l * m->ctx) * kvd;
        rmsnorm(xn, x, L->attn_norm, d, m->eps);
        matvec(q, L->wq, xn, d, d, L->bq);
        matvec(kc + (size_t)pos * kvd, L->wk, xn, kvd, d, L->bk);
        matvec(vc + (size_t)pos * kvd, L->wv, xn, kvd, d, L->bv);
        rope(q, m->heads, hd, pos, m->rope_base, m->neox);
        rope(kc + (size_t)pos * kvd, m->kv_heads, hd, pos, m->rope_base, m->neox);
        for (uint32_t h = 0; h < m->heads; h++) {
            uint32_t kh = h / (m->heads / m->kv_heads);
            float mx = -INFINITY;
            for (uint32_t t = 0; t <= pos; t++) {
                double dot = 0;
                for (uint32_t i = 0; i < hd; i++)
                    dot += (double)q[h * hd + i] * kc[(size_t)t * kvd + kh * hd + i];
                sc[t] = (float)(dot / sqrt((double)hd));
                mx = fmaxf(mx, sc[t]);
            }
            double sum = 0;
            for (uint32_t t = 0; t <= pos; t++)
                sum += sc[t] = expf(sc[t] - mx);
            for (uint32_t i = 0; i < hd; i++) {
                double acc = 0;
                for (uint32_t t = 0; t <= pos; t++)
                    acc += sc[t] * vc[(size_t)t * kvd + kh * hd + i];
                att[h * hd + i] = (float)(acc / sum);
            }
        }
        matvec(tmp, L->wo, att, d, d, NULL);
        for (uint32_t i = 0; i < d; i++)
            x[i] += tmp[i];
        rmsnorm(xn, x, L->ffn_norm, d, m->eps);
        matvec(g, L->wg, xn, m->ffn, d, NULL);
        matvec(u, L->wu, xn, m->ffn, d, NULL);
        for (uint32_t i = 0; i < m->ffn; i++)
            g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        matvec(tmp, L->wd, g, d, m->ffn, NULL);
        double ss = 0;
        for (uint32_t i = 0; i < d; i++) {
            x[i] += tmp[i];
            ss += (double)x[i] * x[i];
        }
        double rms = sqrt(ss / d);
        if (rms > m->max_rms)
            m->max_rms = rms;
    }
    rmsnorm(xn, x, m->out_norm, d, m->eps);
    matvec(logits, m->out, xn, m->vocab, d, NULL);
    free(x); free(xn); free(q); free(att); free(tmp); free(sc); free(g); free(u);
}

static int argmax(const float *v, uint32_t n)
{
    int best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = (int)i;
    return best;
}

#define GEN 40

/* Greedy: BOS + prompt bytes, then GEN tokens into out. */
static void greedy(ref_model_t *m, const char *prompt, int32_t *out)
{
    float *logits = malloc(m->vocab * sizeof(float));
    uint32_t pos = 0;
    int32_t tok = 256;
    size_t n = strlen(prompt);

    for (size_t i = 0; i <= n; i++) {
        ref_forward(m, tok, pos++, logits);
        tok = i < n ? (uint8_t)prompt[i] : 0;
    }
    for (int i = 0; i < GEN; i++) {
        for (uint32_t v = 0; v < m->vocab; v++)
            assert_true(isfinite(logits[v]));
        out[i] = argmax(logits, m->vocab);
        ref_forward(m, out[i], pos++, logits);
    }
    free(logits);
}

static const char *const *model_paths;
static int n_models;

static void test_greedy_varied(void **state)
{
    static const char *const prompts[] = {"Hello", "The capital of France is", "1 2 3 4"};
    (void)state;
    for (int mi = 0; mi < n_models; mi++) {
        gguf_t *g;
        char err[256];
        ref_model_t m;
        int32_t out[3][GEN];
        assert_int_equal(gguf_open(model_paths[mi], &g, err, sizeof(err)), PD_OK);
        ref_load(&m, g);
        for (int p = 0; p < 3; p++) {
            greedy(&m, prompts[p], out[p]);
            int distinct = 0, printable = 0;
            bool seen[1 << 16] = {0};
            printf("%s \"%s\" ->", model_paths[mi], prompts[p]);
            for (int i = 0; i < GEN; i++) {
                printf(" %d", out[p][i]);
                if (!seen[out[p][i] & 0xFFFF]) {
                    seen[out[p][i] & 0xFFFF] = true;
                    distinct++;
                }
                printable += (out[p][i] >= 0x20 && out[p][i] < 0x7F) || out[p][i] == '\n';
            }
            printf("  [distinct %d printable %d]\n", distinct, printable);
            if (distinct < 8)
                fail_msg("%s: only %d distinct tokens in %d greedy steps", model_paths[mi],
                         distinct, GEN);
            if (printable < GEN / 2)
                fail_msg("%s: only %d of %d greedy tokens printable", model_paths[mi], printable,
                         GEN);
        }
        assert_memory_not_equal(out[0], out[1], sizeof(out[0]));
        assert_memory_not_equal(out[1], out[2], sizeof(out[0]));
        printf("%s: max residual RMS %.2f\n", model_paths[mi], m.max_rms);
        if (!(m.max_rms < 50.0))
            fail_msg("%s: residual RMS %.2f out of range", model_paths[mi], m.max_rms);
        ref_free(&m);
        gguf_close(g);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test-model-sanity MODEL.gguf...\n");
        return 2;
    }
    model_paths = (const char *const *)argv + 1;
    n_models = argc - 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_varied),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
