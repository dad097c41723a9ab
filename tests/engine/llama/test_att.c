/* test_att.c - the query-blocked prefill attention (issue 34/37) against
 * the one-(token, head)-per-chunk path it replaces: bitwise, for every KV
 * dtype, ISA path, tile shape, thread count and chunking.
 *   test_att_multi_kernels: eng_ll_kv_{dot,axpy}_rows_multi equal the row
 *     kernels query by query (ragged counts, sub-runs, head_dim 40/64/128).
 *   test_att_exp: the engine's exp (softmax, SiLU): accuracy, clamps,
 *     and the same bits on every ISA path.
 *   test_att_tiled_equals_rows: the engine with PD_ATT's two settings
 *     (eng_ll_att_tiled_g): the same logits and the same KV bytes for
 *     one-shot and chunked prefills, decode steps and a fused step (decode
 *     items beside a prompt chunk), GQA groups of 2 and 5, a sliding-window
 *     model, K and V in different dtypes, 1 and 2 threads. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng.h"
#include "eng_llama.h"
#include "ll_kern.h"
#include "ll_testmodel.h"

static char tmpdir[256];

static float rnd_f(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static void test_att_multi_kernels(void **state)
{
    (void)state;
    enum { MAXN = 128, MAXR = 70, MAXQ = 10 };
    static const char *const isas[] = { "avx512", "avx2", "scalar" };
    static const eng_kv_dtype_t dts[] = { ENG_KV_F32, ENG_KV_F16, ENG_KV_Q8_0, ENG_KV_Q4_0,
                                          ENG_KV_BF16, ENG_KV_FP8_E4M3 };
    static const uint32_t ns[] = { 40, 64, 128 }, cnts[] = { 1, 3, 17, 70 },
                          nqs[] = { 1, 2, 3, 5, 7, 10 };
    static uint8_t kv[MAXR * MAXN * 4 * 3];
    enum { QF = MAXQ * (MAXN + 16), YF = MAXQ * (MAXN + 8) };
    static float q[QF], y0[YF], a[MAXQ * MAXR];
    static float ref_s[MAXQ * MAXR], ref_y[YF], s[MAXQ * MAXR], y[YF];
    uint64_t sd = 5;
    unsigned cases = 0;
    for (size_t di = 0; di < sizeof(dts) / sizeof(dts[0]); di++)
        for (size_t ni = 0; ni < 3; ni++) {
            const eng_kv_dtype_t dt = dts[di];
            const uint32_t n = ns[ni];
            if (n % 32 && dt != ENG_KV_F32 && dt != ENG_KV_F16)
                continue; /* the block formats need whole blocks */
            /* rows with room between them, as a KV head's rows in a layer block */
            const size_t rb = (size_t)eng_kv_row_bytes(dt, n), stride = 3 * rb;
            for (uint32_t r = 0; r < MAXR; r++) {
                float row[MAXN];
                for (uint32_t i = 0; i < n; i++)
                    row[i] = rnd_f(&sd) * (float)(1 + r % 5) * (r % 7 == 3 ? 1e-3f : 1.0f);
                eng_ll_kv_quantize(dt, kv + r * stride, row, n);
            }
            for (uint32_t i = 0; i < QF; i++)
                q[i] = rnd_f(&sd);
            for (uint32_t i = 0; i < YF; i++)
                y0[i] = i % 11 == 0 ? -0.0f : rnd_f(&sd) * 0.1f;
            for (uint32_t i = 0; i < MAXQ * MAXR; i++)
                a[i] = fabsf(rnd_f(&sd));
            for (size_t ci = 0; ci < 4; ci++)
                for (size_t qi = 0; qi < 6; qi++) {
                    const uint32_t cnt = cnts[ci], nq = nqs[qi];
                    /* query i at q + i * (n + 16), scores at s + i * MAXR,
                     * outputs at y + i * (n + 8), weights at a + i * MAXR */
                    const size_t qs = n + 16, ys = n + 8;
                    assert_int_equal(eng_ll_isa_force("scalar"), 0);
                    memcpy(ref_y, y0, sizeof(ref_y));
                    for (uint32_t i = 0; i < nq; i++) {
                        eng_ll_kv_dot_rows(dt, kv, stride, cnt, q + i * qs, n, ref_s + i * MAXR);
                        eng_ll_kv_axpy_rows(dt, ref_y + i * ys, a + i * MAXR, kv, stride, cnt, n);
                    }
                    for (size_t ii = 0; ii < 3; ii++) {
                        if (eng_ll_isa_force(isas[ii]) != 0)
                            continue;
                        memset(s, 0xff, sizeof(s));
                        memcpy(y, y0, sizeof(y));
                        eng_ll_kv_dot_rows_multi(dt, kv, stride, cnt, q, qs, nq, n, s, MAXR);
                        eng_ll_kv_axpy_rows_multi(dt, y, ys, a, MAXR, nq, kv, stride, cnt, n);
                        for (uint32_t i = 0; i < nq; i++) {
                            if (memcmp(s + i * MAXR, ref_s + i * MAXR, cnt * sizeof(float)) ||
                                memcmp(y + i * ys, ref_y + i * ys, n * sizeof(float)))
                                fail_msg("kv %s n %u cnt %u nq %u isa %s: query %u differs from "
                                         "the row kernels", eng_kv_dtype_name(dt), n, cnt, nq,
                                         isas[ii], i);
                        }
                        /* nothing written past the tile: the rows' gaps and tails */
                        for (uint32_t i = 0; i < nq; i++)
                            for (uint32_t j = cnt; j < MAXR; j++) {
                                uint32_t bits;
                                memcpy(&bits, &s[i * MAXR + j], 4);
                                assert_int_equal(bits, 0xffffffffu);
                            }
                        assert_memory_equal(y + nq * ys, y0 + nq * ys,
                                            (YF - nq * ys) * sizeof(float));
                        cases++;
                    }
                }
        }
    eng_ll_isa_force("avx512"); /* back to the best available */
    printf("multi-query kernels: %u cases bitwise equal to the row kernels\n", cases);
    assert_true(cases >= 14 * 24 * 2); /* 14 (dtype, n) pairs, at least 2 ISA paths */
}

/* eng_ll_scale_max / eng_ll_scale: the plain loops' bits (the max's value;
 * the sign of a zero max may differ) with NaN, -inf and zeros about. */
static void test_att_softmax_pieces(void **state)
{
    (void)state;
    static const char *const isas[] = { "avx512", "avx2", "scalar" };
    uint64_t sd = 11;
    for (uint32_t n = 1; n <= 70; n++)
        for (int kind = 0; kind < 4; kind++) {
            float x0[70], ref[70], x[70];
            for (uint32_t i = 0; i < n; i++) {
                x0[i] = rnd_f(&sd) * 20.0f;
                if (kind == 1 && i % 5 == 2)
                    x0[i] = NAN;
                if (kind == 2)
                    x0[i] = i % 2 ? -0.0f : 0.0f;
                if (kind == 3 && i % 3 == 0)
                    x0[i] = -INFINITY;
            }
            float mref = -INFINITY;
            for (uint32_t i = 0; i < n; i++) {
                ref[i] = x0[i] * 0.125f;
                if (ref[i] > mref)
                    mref = ref[i];
            }
            for (size_t ii = 0; ii < 3; ii++) {
                if (eng_ll_isa_force(isas[ii]) != 0)
                    continue;
                memcpy(x, x0, n * sizeof(float));
                float mx = eng_ll_scale_max(x, n, 0.125f);
                assert_memory_equal(x, ref, n * sizeof(float));
                assert_true(mx == mref);
                eng_ll_scale(x, n, 3.0f);
                for (uint32_t i = 0; i < n; i++) {
                    float r = ref[i] * 3.0f;
                    assert_memory_equal(&x[i], &r, sizeof(float));
                }
            }
        }
    eng_ll_isa_force("avx512");
}

/* The engine's exp: ~1 ulp against exp in double over its range, the
 * clamps, NaN kept; eng_ll_exp_sum / eng_ll_silu_mul give, on every ISA
 * path and every length (full 16-groups and tails), the bits of the
 * scalar definition: eng_ll_exp per element, the sum in 16 lanes (i % 16)
 * then the pairwise tree, and g / (1 + exp(0 - g)) * u. */
static float lanes_sum(const float *e, size_t n)
{
    float l[16] = { 0 }, s8[8], s4[4], s2[2];
    for (size_t i = 0; i < n; i++)
        l[i % 16] += e[i];
    for (int k = 0; k < 8; k++)
        s8[k] = l[k] + l[k + 8];
    for (int k = 0; k < 4; k++)
        s4[k] = s8[k] + s8[k + 4];
    for (int k = 0; k < 2; k++)
        s2[k] = s4[k] + s4[k + 2];
    return s2[0] + s2[1];
}

static void test_att_exp(void **state)
{
    (void)state;
    double worst = 0.0;
    for (float x = -87.0f; x <= 88.0f; x = nextafterf(x, INFINITY) + 0.000731f) {
        double want = exp((double)x), got = (double)eng_ll_exp(x);
        double ulp = (double)nextafterf((float)want, INFINITY) - (double)(float)want;
        double err = fabs(got - want) / ulp;
        if (err > worst)
            worst = err;
    }
    print_message("exp: worst %.3f ulp over [-87, 88]\n", worst);
    assert_true(worst < 2.0);
    assert_true(eng_ll_exp(0.0f) == 1.0f);
    assert_true(eng_ll_exp(-1000.0f) == eng_ll_exp(-87.0f));
    assert_true(eng_ll_exp(-INFINITY) == eng_ll_exp(-87.0f));
    assert_true(eng_ll_exp(1000.0f) == eng_ll_exp(88.0f) && isfinite(eng_ll_exp(88.0f)));
    assert_true(isnan(eng_ll_exp(NAN)));

    static const char *const isas[] = { "avx512", "avx2", "scalar" };
    enum { NMAX = 600 };
    static float x0[NMAX], ref[NMAX], x[NMAX], u[NMAX], gref[NMAX];
    uint64_t sd = 5;
    for (uint32_t n = 0; n <= NMAX; n += n < 70 ? 1 : 53) {
        for (uint32_t i = 0; i < n; i++) {
            x0[i] = rnd_f(&sd) * 40.0f - 20.0f;
            u[i] = rnd_f(&sd);
        }
        if (n > 7)
            x0[3] = -150.0f, x0[5] = 95.0f; /* past both clamps */
        float mx = 3.5f;
        for (uint32_t i = 0; i < n; i++) {
            ref[i] = eng_ll_exp(x0[i] - mx);
            gref[i] = x0[i] / (1.0f + eng_ll_exp(0.0f - x0[i])) * u[i];
        }
        float sref = lanes_sum(ref, n);
        for (size_t ii = 0; ii < 3; ii++) {
            if (eng_ll_isa_force(isas[ii]) != 0)
                continue;
            memcpy(x, x0, n * sizeof(float));
            float s = eng_ll_exp_sum(x, n, mx);
            assert_memory_equal(x, ref, n * sizeof(float));
            assert_memory_equal(&s, &sref, sizeof(float));
            memcpy(x, x0, n * sizeof(float));
            eng_ll_silu_mul(x, u, n);
            assert_memory_equal(x, gref, n * sizeof(float));
        }
    }
    eng_ll_isa_force("avx512");
}

/* ---- the engine: tiled vs rows ---------------------------------------- */

typedef struct {
    float *lg;      /* every logit row the script produces */
    size_t n_lg;
    uint8_t *arena;
    size_t bytes;
} att_out_t;

enum { NSEQ = 3, NB = 12, BT = 8, NT = 75 };

/* A fixed script on one model: a one-shot 61-token prefill (logits), the
 * same prompt in chunks 0-5, 5-38, 38-61 on other blocks, 3 decode steps
 * on each, then a fused step (a 14-token chunk of a third prompt beside
 * two decode items). Blocks are scattered. */
static void att_script(const char *path, eng_kv_dtype_t k, eng_kv_dtype_t v, uint32_t threads,
                       att_out_t *o)
{
    const eng_ops_t *ops = eng_find("llama");
    eng_load_opts_t lo = { "llama", path, BT, k, threads, 8, true, v };
    eng_model_t *m = NULL;
    char err[200] = "";
    assert_int_equal(ops->load(&lo, &m, err, sizeof(err)), PD_OK);
    const eng_kv_geom_t *g = ops->geometry(m);
    const uint32_t V = g->vocab_size;
    o->bytes = (size_t)NSEQ * NB * g->block_bytes;
    o->arena = calloc(1, o->bytes);
    o->lg = calloc(16 * (size_t)V, sizeof(float));
    uint32_t bt[NSEQ][NB];
    for (uint32_t sq = 0; sq < NSEQ; sq++)
        for (uint32_t j = 0; j < NB; j++)
            bt[sq][j] = (j * 7 + sq * 5) % NB * NSEQ + sq;
    int32_t toks[NSEQ][NT];
    for (uint32_t sq = 0; sq < NSEQ; sq++)
        for (uint32_t i = 0; i < NT; i++)
            toks[sq][i] = (int32_t)((i * 2654435761u + sq * 40503u + 7) % V);
    float *lg = o->lg;
    assert_int_equal(ops->prefill(m, o->arena, bt[0], NB, toks[0], 61, 0, lg), PD_OK);
    lg += V;
    static const uint32_t cuts[] = { 0, 5, 38, 61 };
    for (int c = 0; c < 3; c++) {
        assert_int_equal(ops->prefill(m, o->arena, bt[1], NB, toks[1] + cuts[c],
                                      cuts[c + 1] - cuts[c], cuts[c], lg), PD_OK);
    }
    lg += V;
    for (uint32_t p = 61; p < 64; p++) {
        eng_decode_item_t it[2] = { { bt[0], NB, p, toks[0][p] }, { bt[1], NB, p, toks[1][p] } };
        assert_int_equal(ops->decode(m, o->arena, it, 2, lg), PD_OK);
        lg += 2 * (size_t)V;
    }
    assert_int_equal(ops->prefill(m, o->arena, bt[2], NB, toks[2], 20, 0, NULL), PD_OK);
    eng_chunk_t ch = { bt[2], NB, toks[2] + 20, 14, 20, true };
    eng_decode_item_t it[2] = { { bt[0], NB, 64, toks[0][64] }, { bt[1], NB, 64, toks[1][64] } };
    assert_non_null(ops->step);
    assert_int_equal(ops->step(m, o->arena, &ch, it, 2, lg), PD_OK);
    lg += 3 * (size_t)V;
    o->n_lg = (size_t)(lg - o->lg);
    ops->destroy(m);
}

static void test_att_tiled_equals_rows(void **state)
{
    (void)state;
    /* n_embd, layers, heads, kv heads, ffn, vocab, ctx: head_dim 64 group
     * 5; head_dim 128 group 2; gemma3 sliding window 6 (head_dim 64) */
    static const ll_tm_spec_t g5 = { "llama", 320, 2, 5, 1, 160, 300, 256, 0, 1, true, false, 71 };
    static const ll_tm_spec_t g2 = { "qwen2", 512, 1, 4, 2, 160, 300, 256, 0, 0, true, true, 72 };
    static const ll_tm_spec_t sw = { "gemma3", 256, 3, 4, 2, 160, 300, 256, 0, 1, true, false, 73,
                                     NULL, false, 0, 0, 64, 0, 0, 0, 6 };
    static const struct {
        const ll_tm_spec_t *spec;
        const char *tag;
        eng_kv_dtype_t k, v;
    } cases[] = {
        { &g5, "g5", ENG_KV_F16, ENG_KV_F16 },
        { &g5, "g5", ENG_KV_Q8_0, ENG_KV_Q4_0 },
        { &g5, "g5", ENG_KV_FP8_E4M3, ENG_KV_BF16 },
        { &g2, "g2", ENG_KV_F32, ENG_KV_F32 },
        { &g2, "g2", ENG_KV_Q4_0, ENG_KV_FP8_E4M3 },
        { &sw, "swa", ENG_KV_F16, ENG_KV_Q8_0 },
        { &sw, "swa", ENG_KV_BF16, ENG_KV_F32 },
    };
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        char path[300];
        snprintf(path, sizeof(path), "%s/%s.gguf", tmpdir, cases[ci].tag);
        assert_int_equal(ll_tm_write(cases[ci].spec, path), 0);
        for (uint32_t th = 1; th <= 2; th++) {
            att_out_t rows, tiled;
            eng_ll_att_tiled_g = 0;
            att_script(path, cases[ci].k, cases[ci].v, th, &rows);
            eng_ll_att_tiled_g = 1;
            att_script(path, cases[ci].k, cases[ci].v, th, &tiled);
            assert_int_equal(rows.n_lg, tiled.n_lg);
            assert_int_equal(rows.bytes, tiled.bytes);
            if (memcmp(rows.lg, tiled.lg, rows.n_lg * sizeof(float)) ||
                memcmp(rows.arena, tiled.arena, rows.bytes))
                fail_msg("%s k %s v %s, %u thread(s): the tiled attention differs from the rows",
                         cases[ci].tag, eng_kv_dtype_name(cases[ci].k),
                         eng_kv_dtype_name(cases[ci].v), th);
            free(rows.lg);
            free(rows.arena);
            free(tiled.lg);
            free(tiled.arena);
        }
    }
    eng_ll_att_tiled_g = -1;
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/pd-test-att-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_att_multi_kernels),
        cmocka_unit_test(test_att_softmax_pieces),
        cmocka_unit_test(test_att_exp),
        cmocka_unit_test(test_att_tiled_equals_rows),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
