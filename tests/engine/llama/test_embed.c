/* test_embed.c - embeddings: eng_pool on known rows, and the llama engine's
 * embed op on a real GGUF (argv[1]): unit length, one token pools the same
 * under every pooling, the mean of a prompt lies in the span of its
 * prefixes' last-position embeddings (causal attention) with positive
 * weights, the result does not depend on where the blocks are, refusals. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng.h"

static const char *g_model;

static double dot(const float *a, const float *b, uint32_t n)
{
    double s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

static void test_pool_rows(void **state)
{
    (void)state;
    const float h[3 * 2] = { 3, 4, 0, 2, 6, 0 };
    float o[2];
    assert_int_equal(eng_pool(h, 3, 2, ENG_POOL_CLS, o), PD_OK);
    assert_true(fabsf(o[0] - 0.6f) < 1e-6f && fabsf(o[1] - 0.8f) < 1e-6f);
    assert_int_equal(eng_pool(h, 3, 2, ENG_POOL_LAST, o), PD_OK);
    assert_true(fabsf(o[0] - 1.0f) < 1e-6f && fabsf(o[1]) < 1e-6f);
    assert_int_equal(eng_pool(h, 3, 2, ENG_POOL_MEAN, o), PD_OK); /* (3, 2) / sqrt(13) */
    assert_true(fabsf(o[0] - 3 / sqrtf(13)) < 1e-6f && fabsf(o[1] - 2 / sqrtf(13)) < 1e-6f);
    assert_int_equal(eng_pool(h, 3, 2, ENG_POOL_NONE, o), PD_ERR_BAD_INPUT);
    assert_int_equal(eng_pool(h, 0, 2, ENG_POOL_MEAN, o), PD_ERR_BAD_INPUT);
    float z[2] = { 0, 0 };
    eng_l2_normalize(z, 2);
    assert_true(z[0] == 0 && z[1] == 0);
    assert_int_equal(eng_pooling_from_name("mean"), ENG_POOL_MEAN);
    assert_int_equal(eng_pooling_from_name("cls"), ENG_POOL_CLS);
    assert_int_equal(eng_pooling_from_name("last"), ENG_POOL_LAST);
    assert_int_equal(eng_pooling_from_name("none"), -1);
    assert_int_equal(eng_pooling_from_name("max"), -1);
    assert_string_equal(eng_pooling_name(ENG_POOL_LAST), "last");
}

typedef struct {
    const eng_ops_t *ops;
    eng_model_t *m;
    const eng_kv_geom_t *g;
    void *arena;
    uint32_t n_blocks;
} fx_t;

static int fx_setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    char err[256];
    f->ops = eng_find("llama");
    eng_load_opts_t lo = { "llama", g_model, 4, ENG_KV_F32, 2, 1 };
    if (f->ops->load(&lo, &f->m, err, sizeof(err)) != PD_OK) {
        fprintf(stderr, "load %s: %s\n", g_model, err);
        return -1;
    }
    f->g = f->ops->geometry(f->m);
    f->n_blocks = 64;
    f->arena = calloc(f->n_blocks, f->g->block_bytes);
    *state = f;
    return f->arena ? 0 : -1;
}

static int fx_teardown(void **state)
{
    fx_t *f = *state;
    f->ops->destroy(f->m);
    free(f->arena);
    free(f);
    return 0;
}

static pd_status_t embed1(fx_t *f, const uint32_t *bt, uint32_t nb, const int32_t *t, uint32_t n,
                          eng_pooling_t p, float *out)
{
    eng_embed_item_t it = { bt, nb, t, n, p, out };
    return f->ops->embed(f->m, f->arena, &it, 1);
}

static void embed(fx_t *f, const int32_t *t, uint32_t n, eng_pooling_t p, float *out,
                  uint32_t shift)
{
    uint32_t bt[64];
    for (uint32_t i = 0; i < 64; i++)
        bt[i] = (i * 7 + shift) % 64; /* scattered blocks */
    assert_int_equal(embed1(f, bt, 32, t, n, p, out), PD_OK);
}

static void test_llama_embed(void **state)
{
    fx_t *f = *state;
    const uint32_t E = f->g->n_embd;
    assert_true(E > 0);
    assert_non_null(f->ops->embed);
    int32_t toks[40];
    for (uint32_t i = 0; i < 40; i++)
        toks[i] = (int32_t)((i * 37 + 11) % f->g->vocab_size);
    float *a = malloc(E * sizeof(float)), *b = malloc(E * sizeof(float));
    float *c = malloc(E * sizeof(float)), *e[3];
    /* one token: every pooling is that token's state */
    embed(f, toks, 1, ENG_POOL_MEAN, a, 0);
    embed(f, toks, 1, ENG_POOL_CLS, b, 3);
    embed(f, toks, 1, ENG_POOL_LAST, c, 5);
    assert_true(fabs(dot(a, a, E) - 1.0) < 1e-5);
    assert_true(dot(a, b, E) > 0.99999 && dot(a, c, E) > 0.99999);
    /* mean of 3 = a positive combination of the 3 prefixes' last states */
    for (int k = 0; k < 3; k++) {
        e[k] = malloc(E * sizeof(float));
        embed(f, toks, (uint32_t)k + 1, ENG_POOL_LAST, e[k], (uint32_t)k);
    }
    embed(f, toks, 3, ENG_POOL_MEAN, a, 1);
    double G[3][3], r[3];
    for (int i = 0; i < 3; i++) {
        r[i] = dot(e[i], a, E);
        for (int j = 0; j < 3; j++)
            G[i][j] = dot(e[i], e[j], E);
    }
    /* solve G w = r (Cramer) */
    double det = G[0][0] * (G[1][1] * G[2][2] - G[1][2] * G[2][1]) -
                 G[0][1] * (G[1][0] * G[2][2] - G[1][2] * G[2][0]) +
                 G[0][2] * (G[1][0] * G[2][1] - G[1][1] * G[2][0]);
    assert_true(fabs(det) > 1e-9);
    double w[3];
    for (int k = 0; k < 3; k++) {
        double M[3][3];
        memcpy(M, G, sizeof(M));
        for (int i = 0; i < 3; i++)
            M[i][k] = r[i];
        w[k] = (M[0][0] * (M[1][1] * M[2][2] - M[1][2] * M[2][1]) -
                M[0][1] * (M[1][0] * M[2][2] - M[1][2] * M[2][0]) +
                M[0][2] * (M[1][0] * M[2][1] - M[1][1] * M[2][0])) / det;
        assert_true(w[k] > 0);
    }
    for (uint32_t j = 0; j < E; j++) {
        b[j] = (float)(w[0] * e[0][j] + w[1] * e[1][j] + w[2] * e[2][j]);
        assert_true(fabsf(b[j] - a[j]) < 1e-4f);
    }
    /* a long prompt (several chunks): the same bytes wherever its blocks are */
    embed(f, toks, 40, ENG_POOL_MEAN, a, 0);
    embed(f, toks, 40, ENG_POOL_MEAN, b, 9);
    assert_memory_equal(a, b, E * sizeof(float));
    embed(f, toks, 40, ENG_POOL_LAST, c, 2);
    assert_true(dot(a, c, E) < 0.99999); /* not the same pooling */
    /* refusals */
    uint32_t bt[2] = { 0, 1 };
    assert_int_equal(embed1(f, bt, 2, toks, 3, ENG_POOL_NONE, a),
                     PD_ERR_BAD_INPUT);
    assert_int_equal(embed1(f, bt, 2, toks, 0, ENG_POOL_MEAN, a),
                     PD_ERR_BAD_INPUT);
    int32_t bad = (int32_t)f->g->vocab_size;
    assert_int_equal(embed1(f, bt, 2, &bad, 1, ENG_POOL_MEAN, a),
                     PD_ERR_BAD_INPUT);
    assert_int_equal(embed1(f, bt, 1, toks, 40, ENG_POOL_MEAN, a),
                     PD_ERR_NO_KV_SPACE);
    for (int k = 0; k < 3; k++)
        free(e[k]);
    free(a);
    free(b);
    free(c);
}

/* A batch packs its items' rows into shared forward passes (short items
 * several to a pass, long ones across passes, a pass boundary inside an
 * item): each vector is bitwise the one its item gets alone. An invalid
 * item refuses the whole batch before anything is written. */
static void test_llama_embed_batch(void **state)
{
    fx_t *f = *state;
    const uint32_t E = f->g->n_embd, bt_tok = f->g->block_tokens;
    enum { N = 7 };
    static const uint32_t len[N] = { 1, 5, 63, 3, 64, 2, 65 };
    static const eng_pooling_t pool[N] = { ENG_POOL_MEAN, ENG_POOL_LAST, ENG_POOL_MEAN,
                                           ENG_POOL_CLS,  ENG_POOL_MEAN, ENG_POOL_LAST,
                                           ENG_POOL_MEAN };
    int32_t toks[N][65];
    uint32_t bts[N][64], next = 0;
    float *batch = malloc((size_t)N * E * sizeof(float)), *alone = malloc(E * sizeof(float));
    eng_embed_item_t it[N];
    for (uint32_t k = 0; k < N; k++) {
        for (uint32_t i = 0; i < len[k]; i++)
            toks[k][i] = (int32_t)((i * 31 + k * 101 + 7) % f->g->vocab_size);
        uint32_t nb = (len[k] + bt_tok - 1) / bt_tok;
        for (uint32_t i = 0; i < nb; i++)
            bts[k][i] = ((next + i) * 5) % f->n_blocks; /* disjoint, scattered */
        next += nb;
        assert_true(next <= f->n_blocks);
        it[k] = (eng_embed_item_t){ bts[k], nb, toks[k], len[k], pool[k], batch + (size_t)k * E };
    }
    assert_int_equal(f->ops->embed(f->m, f->arena, it, N), PD_OK);
    for (uint32_t k = 0; k < N; k++) {
        uint32_t bt[64];
        for (uint32_t i = 0; i < 64; i++)
            bt[i] = (i * 3 + k) % f->n_blocks;
        assert_int_equal(embed1(f, bt, 64, toks[k], len[k], pool[k], alone), PD_OK);
        assert_memory_equal(alone, batch + (size_t)k * E, E * sizeof(float));
    }
    /* one bad item: the batch is refused, no vector written */
    for (uint32_t j = 0; j < E; j++)
        batch[j] = -7.0f;
    it[3].pooling = ENG_POOL_NONE;
    assert_int_equal(f->ops->embed(f->m, f->arena, it, N), PD_ERR_BAD_INPUT);
    assert_true(batch[0] == -7.0f);
    free(batch);
    free(alone);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test-embed MODEL.gguf\n");
        return 2;
    }
    g_model = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_rows),
        cmocka_unit_test_setup_teardown(test_llama_embed, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_llama_embed_batch, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
