/* test_qdot.c - integer-dot kernels (engine/llama/ggml_qdot.c) for Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and Q2_K..Q6_K weight rows against
 * quantized activations:
 *  - the scalar, AVX2, VNNI and AMX paths return identical bits, and a row dot
 *    computed in a batch of items equals the same item alone; every type
 *    but Q6_K on the packed layout (any row range, any item count) gives
 *    them too;
 *  - each dot equals the exact (f64) dot of the dequantized weights with
 *    the dequantized activations to f32 accumulation accuracy (1e-5 of the
 *    sum of |terms|), which catches any wrong scale, sign or offset;
 *  - and the exact dot of the dequantized weights with the f32 activations
 *    within the activation rounding bound sum |w| * d_a / 2 (+ 1e-5). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "ggml_qdot.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

#define NROWS 19 /* > 16: the row tiling; odd: the wide K-quant row pairs leave one */
#define NITEMS 21 /* > 4: the item tiles; > 16: two groups of the wide K-quant kernel */

/* the dequantized activation value of element e of item row a */
static double act_val(int act, const uint8_t *a, uint64_t n, uint64_t e)
{
    return (double)ggml_qdot_act_q(act, a, n, e) * ggml_qdot_act_scale(act, a, n, e);
}

static double act_d(int act, const uint8_t *a, uint64_t n, uint64_t e)
{
    return ggml_qdot_act_scale(act, a, n, e);
}

/* Q8_0 / Q4_0 / Q4_K: the packed kernel gives the row kernels' bits for
 * every row range (group-aligned or not, cutting groups or not) and item
 * count */
static void check_packed(uint32_t type, const uint8_t *wq, size_t rb, uint64_t n,
                         const uint8_t *a, size_t ab, float ref[NITEMS][NROWS])
{
    size_t pb = ggml_qdot_pack_bytes(type, NROWS, n);
    if (type == GGML_TYPE_Q6_K) {
        assert_int_equal(pb, 0);
        return;
    }
    assert_int_equal(pb, ggml_qdot_pack_bytes(type, 16, n)); /* one full group of 19 rows */
    void *pk = NULL;
    assert_int_equal(posix_memalign(&pk, 64, pb), 0);
    assert_int_equal(ggml_qdot_pack(type, wq, rb, NROWS, n, pk), PD_OK);
    static const uint32_t ranges[][2] = { { 0, NROWS }, { 0, 16 }, { 3, 19 }, { 16, 19 },
                                          { 5, 9 }, { 0, 1 } };
    static const uint32_t items[] = { 1, 3, 4, 5, 8, 9, NITEMS };
    for (int p = GGML_QDOT_SCALAR; p <= GGML_QDOT_AMX; p++)
        for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++)
            for (size_t j = 0; j < sizeof items / sizeof items[0]; j++) {
                uint32_t r0 = ranges[k][0], r1 = ranges[k][1], ni = items[j];
                float got[NITEMS][NROWS];
                memset(got, 0xFF, sizeof got);
                assert_int_equal(ggml_qdot_rows_packed(p, type, wq, rb, pk, r0, r1, n, a, ab, ni,
                                                       &got[0][0], NROWS), PD_OK);
                for (uint32_t i = 0; i < ni; i++)
                    assert_memory_equal(&got[i][0], &ref[i][r0], (r1 - r0) * sizeof(float));
            }
    free(pk);
}

static void check_type(uint32_t type, size_t bytes, uint32_t bs)
{
    static const uint64_t nbs[] = { 1, 2, 3, 5, 7, 33, 113 };
    int act = ggml_qdot_act(type);
    assert_int_not_equal(act, GGML_QACT_NONE);
    assert_int_equal(ggml_qdot_block(type), bs);
    for (size_t t = 0; t < sizeof nbs / sizeof nbs[0]; t++) {
        uint64_t nb = nbs[t], n = nb * bs;
        if (bs == 256 && nb > 7)
            continue;
        size_t ab = ggml_qdot_act_bytes(act, n);
        float *w = malloc(NROWS * n * sizeof *w), *x = malloc(NITEMS * n * sizeof *x);
        float *wd = malloc(NROWS * n * sizeof *wd);
        uint8_t *wq = malloc(NROWS * nb * bytes), *a = malloc(NITEMS * ab);
        assert_true(w && x && wd && wq && a);
        for (uint64_t i = 0; i < NROWS * n; i++)
            w[i] = frand() + (i % 7 == 0 ? 0.5f : 0.0f); /* K-quant mins non-zero */
        for (uint64_t i = 0; i < NITEMS * n; i++)
            x[i] = frand() * 3.0f;
        x[0] = -3.0f; /* full-scale activation */
        x[n + 5] = 40.0f; /* an outlier block */
        for (int r = 0; r < NROWS; r++) {
            assert_int_equal(ggml_quantize_row(type, w + r * n, wq + r * nb * bytes, n), PD_OK);
            assert_int_equal(ggml_dequantize_row(type, wq + r * nb * bytes, wd + r * n, n), PD_OK);
        }
        for (int i = 0; i < NITEMS; i++)
            ggml_qdot_quantize(act, x + i * n, n, a + i * ab);

        float ref[NITEMS][NROWS], got[NITEMS][NROWS], one;
        for (int p = GGML_QDOT_SCALAR; p <= GGML_QDOT_AMX; p++) {
            assert_int_equal(ggml_qdot_rows(p, type, wq, nb * bytes, NROWS, n, a, ab, NITEMS,
                                            &got[0][0], NROWS), PD_OK);
            if (p == GGML_QDOT_SCALAR)
                memcpy(ref, got, sizeof ref);
            else
                assert_memory_equal(ref, got, sizeof ref);
            /* one item alone = the same item in the batch */
            for (int i = 0; i < NITEMS; i++)
                for (int r = 0; r < NROWS; r++) {
                    assert_int_equal(ggml_qdot_rows(p, type, wq + r * nb * bytes, 0, 1, n,
                                                    a + i * ab, 0, 1, &one, 0), PD_OK);
                    assert_memory_equal(&one, &ref[i][r], sizeof one);
                }
        }
        check_packed(type, wq, nb * bytes, n, a, ab, ref);
        for (int i = 0; i < NITEMS; i++)
            for (int r = 0; r < NROWS; r++) {
                double xq = 0.0, mag = 0.0, exact = 0.0, bound = 0.0;
                for (uint64_t e = 0; e < n; e++) {
                    double wv = wd[r * n + e], av = act_val(act, a + i * ab, n, e);
                    xq += wv * av;
                    mag += fabs(wv * av);
                    exact += wv * x[i * n + e];
                    bound += fabs(wv) * act_d(act, a + i * ab, n, e) * 0.5;
                }
                if (fabs(ref[i][r] - xq) > 1e-5 * mag + 1e-6)
                    fail_msg("type %u nb %lu item %d row %d: %.9g vs %.9g (mag %.3g)", type,
                             (unsigned long)nb, i, r, ref[i][r], xq, mag);
                assert_true(fabs(exact - ref[i][r]) <= bound + 1e-5 * (1.0 + mag));
            }
        free(w);
        free(x);
        free(wd);
        free(wq);
        free(a);
    }
    ggml_qdot_set_path(GGML_QDOT_AMX);
}

/* AMX (issue 37): the packed kernel on the AMX path, 1..64 items (the full
 * 16s on the tiles, the rest on VNNI) over row ranges cutting groups, rows
 * of 1..130 blocks (the B tiles are built 64 blocks at a time), gives the
 * scalar row kernel's bits. On a CPU without AMX (or with PD_QDOT capping
 * the path below it) the AMX path is the VNNI one: checked the same way,
 * and said so. */
#define AMX_ROWS 51 /* 3 groups of 16 + 3: the 2 x 2 pairs and a group left over */
#define AMX_NI 64
static void check_amx(uint32_t type, size_t bytes)
{
    if (ggml_qdot_set_path(GGML_QDOT_AMX) != GGML_QDOT_AMX) {
        const char *why = ggml_qdot_amx_why();
        print_message("skipped: no AMX (%s; path %s checked instead)\n",
                      why ? why : "PD_QDOT caps the path",
                      ggml_qdot_path_name(ggml_qdot_path()));
    }
    static const uint64_t nbs[] = { 1, 2, 3, 63, 64, 65, 130 };
    static const uint64_t nbs_k[] = { 1, 2, 3, 4, 5, 9 }; /* K-quants: 256-element blocks */
    const int kq = ggml_qdot_block(type) == GGML_Q8K_BLOCK;
    static const uint32_t ranges[][2] = { { 0, AMX_ROWS }, { 0, 16 }, { 16, 32 }, { 3, AMX_ROWS },
                                          { 5, 9 }, { 7, 30 } };
    static const uint32_t items[] = { 1, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64 };
    const int act = ggml_qdot_act(type);
    for (size_t t = 0; t < (kq ? sizeof nbs_k / sizeof nbs_k[0] : sizeof nbs / sizeof nbs[0]);
         t++) {
        const uint64_t nb = kq ? nbs_k[t] : nbs[t], n = nb * ggml_qdot_block(type);
        const size_t ab = ggml_qdot_act_bytes(act, n), rb = nb * bytes;
        float *w = malloc(AMX_ROWS * n * sizeof *w), *x = malloc(AMX_NI * n * sizeof *x);
        uint8_t *wq = malloc(AMX_ROWS * rb), *a = malloc(AMX_NI * ab);
        float *ref = malloc(AMX_NI * AMX_ROWS * sizeof *ref);
        float *got = malloc(AMX_NI * AMX_ROWS * sizeof *got);
        assert_true(w && x && wq && a && ref && got);
        for (uint64_t i = 0; i < AMX_ROWS * n; i++)
            w[i] = frand() + (i % 5 == 0 ? 0.25f : 0.0f);
        for (uint64_t i = 0; i < AMX_NI * n; i++)
            x[i] = frand() * (i % 61 == 0 ? 30.0f : 2.0f);
        for (int r = 0; r < AMX_ROWS; r++)
            assert_int_equal(ggml_quantize_row(type, w + r * n, wq + r * rb, n), PD_OK);
        for (int i = 0; i < AMX_NI; i++)
            ggml_qdot_quantize(act, x + i * n, n, a + i * ab);
        assert_int_equal(ggml_qdot_rows(GGML_QDOT_SCALAR, type, wq, rb, AMX_ROWS, n, a, ab,
                                        AMX_NI, ref, AMX_ROWS), PD_OK);
        const size_t pb = ggml_qdot_pack_bytes(type, AMX_ROWS, n);
        void *pk = NULL; /* Q6_K has no packed layout: its row kernels run */
        if (pb) {
            assert_int_equal(posix_memalign(&pk, 64, pb), 0);
            assert_int_equal(ggml_qdot_pack(type, wq, rb, AMX_ROWS, n, pk), PD_OK);
        }
        for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++)
            for (size_t j = 0; j < sizeof items / sizeof items[0]; j++) {
                const uint32_t r0 = ranges[k][0], r1 = ranges[k][1], ni = items[j];
                /* the packed groups of a view that starts at row r0 (whole
                 * groups only: the engine's views do the same) */
                const uint8_t *pkv = pk && r0 % 16 == 0 ? (const uint8_t *)pk +
                                     ggml_qdot_pack_bytes(type, r0, n) : NULL;
                memset(got, 0xFF, AMX_NI * AMX_ROWS * sizeof *got);
                assert_int_equal(ggml_qdot_rows_packed(GGML_QDOT_AMX, type, wq + r0 * rb, rb,
                                                       pkv, 0, r1 - r0, n, a, ab, ni, got,
                                                       AMX_ROWS), PD_OK);
                for (uint32_t i = 0; i < ni; i++)
                    if (memcmp(got + i * AMX_ROWS, ref + i * AMX_ROWS + r0,
                               (r1 - r0) * sizeof(float)) != 0)
                        fail_msg("type %u nb %lu rows [%u, %u) items %u: item %u differs", type,
                                 (unsigned long)nb, r0, r1, ni, i);
                /* and from the whole tensor's packed copy, cutting groups */
                assert_int_equal(ggml_qdot_rows_packed(GGML_QDOT_AMX, type, wq, rb, pk, r0, r1,
                                                       n, a, ab, ni, got, AMX_ROWS), PD_OK);
                for (uint32_t i = 0; i < ni; i++)
                    assert_memory_equal(got + i * AMX_ROWS, ref + i * AMX_ROWS + r0,
                                        (r1 - r0) * sizeof(float));
            }
        free(pk);
        free(w);
        free(x);
        free(wq);
        free(a);
        free(ref);
        free(got);
    }
}

static void test_amx(void **state)
{
    (void)state;
    static const struct { uint32_t type; size_t bytes; } types[] = {
        { GGML_TYPE_Q8_0, 34 }, { GGML_TYPE_Q4_0, 18 }, { GGML_TYPE_Q4_1, 20 },
        { GGML_TYPE_Q5_0, 22 }, { GGML_TYPE_Q5_1, 24 }, { GGML_TYPE_IQ4_NL, 18 },
        { GGML_TYPE_Q4_K, 144 }, { GGML_TYPE_Q5_K, 176 }, { GGML_TYPE_Q6_K, 210 },
    };
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        check_amx(types[t].type, types[t].bytes);
    /* PD_QDOT caps the path for the whole process */
    const char *e = getenv("PD_QDOT");
    if (e && strcmp(e, "vnni") == 0)
        assert_int_equal(ggml_qdot_set_path(GGML_QDOT_AMX), GGML_QDOT_VNNI);
}

static void test_q8_0(void **state)
{
    (void)state;
    check_type(GGML_TYPE_Q8_0, 34, 32);
}

static void test_q4_0(void **state)
{
    (void)state;
    check_type(GGML_TYPE_Q4_0, 18, 32);
}

static void test_q4_1(void **state)
{
    (void)state;
    check_type(GGML_TYPE_Q4_1, 20, 32);
}

static void test_q5_0(void **state)
{
    (void)state;
    check_type(GGML_TYPE_Q5_0, 22, 32);
}

static void test_q5_1(void **state)
{
    (void)state;
    check_type(GGML_TYPE_Q5_1, 24, 32);
}

static void test_iq4_nl(void **state)
{
    (void)state;
    check_type(GGML_TYPE_IQ4_NL, 18, 32);
}

static void test_q2_K(void **state)
{
    (void)state;
    check_type(GGML_TYPE_Q2_K, 84, 256);
}

static void test_q3_K(void **state)
{
    (void)state;
    check_type(GGML_TYPE_Q3_K, 110, 256);
}

static void test_q4_K(void **state)
{
    (void)state;
    check_type(GGML_TYPE_Q4_K, 144, 256);
}

static void test_q5_K(void **state)
{
    (void)state;
    check_type(GGML_TYPE_Q5_K, 176, 256);
}

static void test_q6_K(void **state)
{
    (void)state;
    check_type(GGML_TYPE_Q6_K, 210, 256);
}

static void test_unsupported(void **state)
{
    (void)state;
    uint8_t w[176] = { 0 }, a[292] = { 0 };
    float o;
    /* f16 / f32 weights: exact f32 dot, no integer kernel */
    assert_int_equal(ggml_qdot_act(GGML_TYPE_F16), GGML_QACT_NONE);
    assert_int_equal(ggml_qdot_act(GGML_TYPE_F32), GGML_QACT_NONE);
    assert_int_equal(ggml_qdot_rows(GGML_QDOT_SCALAR, GGML_TYPE_F16, w, 64, 1, 32, a, 0, 1,
                                    &o, 0), PD_ERR_UNSUPPORTED);
    /* a row that is not whole blocks */
    assert_int_equal(ggml_qdot_rows(GGML_QDOT_SCALAR, GGML_TYPE_Q4_K, w, 144, 1, 128, a, 0, 1,
                                    &o, 0), PD_ERR_UNSUPPORTED);
}

/* the AVX2 and scalar activation quantizers write the same bytes */
static void test_quantize_paths(void **state)
{
    (void)state;
    enum { N = 2048 };
    static float x[N];
    static uint8_t a0[N / 32 * 44], a1[N / 32 * 44];
    static uint8_t k0[N / 256 * (sizeof(ggml_q8k_block) + 256)], k1[sizeof k0];
    assert_int_equal(ggml_qdot_act_bytes(GGML_QACT_Q8K, N), sizeof k0);
    assert_int_equal(ggml_qdot_act_bytes(GGML_QACT_Q8A, N), sizeof a0);
    for (int i = 0; i < N; i++)
        x[i] = frand() * (i % 97 == 0 ? 50.0f : 2.0f);
    for (int i = 0; i < 32; i++) /* x * id lands on halves: round to even */
        x[256 + i] = (float)(i - 16) * 0.5f;
    x[256] = -127.0f; /* the block's absmax: id = 1, so x * id = k + 0.5 */
    ggml_qdot_set_path(GGML_QDOT_SCALAR);
    ggml_qdot_quantize(GGML_QACT_Q8A, x, N, a0);
    ggml_qdot_quantize(GGML_QACT_Q8K, x, N, k0);
    ggml_qdot_set_path(GGML_QDOT_AMX);
    ggml_qdot_quantize(GGML_QACT_Q8A, x, N, a1);
    ggml_qdot_quantize(GGML_QACT_Q8K, x, N, k1);
    assert_memory_equal(a0, a1, sizeof a0);
    assert_memory_equal(k0, k1, sizeof k0);
    /* the Q8A row's planes: -128 and -8 x each block's sum of qs, its d */
    const int32_t *c128 = (const int32_t *)(const void *)(a0 + 32 * (N / 32)), *c8 = c128 + N / 32;
    for (int b = 0; b < N / 32; b++) {
        int32_t sum = 0;
        for (int j = 0; j < 32; j++)
            sum += ((const int8_t *)a0)[32 * b + j];
        assert_int_equal(c128[b], -128 * sum);
        assert_int_equal(c8[b], -8 * sum);
        assert_true(ggml_qdot_act_scale(GGML_QACT_Q8A, a0, N, 32 * b) ==
                    ((const float *)(const void *)(c8 + N / 32))[b]);
    }
    /* the Q8K row's n32s4 plane: -32 x each 4-sum of qs */
    const ggml_q8k_block *kb = (const ggml_q8k_block *)(const void *)k0;
    const int32_t *n4 = (const int32_t *)(const void *)(kb + N / 256);
    for (int e = 0; e < N; e += 4) {
        const int8_t *q = kb[e / 256].qs + e % 256;
        assert_int_equal(n4[e / 4], -32 * (q[0] + q[1] + q[2] + q[3]));
    }
}

static void test_zero_row(void **state)
{
    (void)state;
    float x[256] = { 0 };
    uint8_t a[2 * 44];
    union {
        ggml_q8k_block k;
        uint8_t b[sizeof(ggml_q8k_block) + 256];
    } u;
    ggml_qdot_quantize(GGML_QACT_Q8A, x, 64, a);
    ggml_qdot_quantize(GGML_QACT_Q8K, x, 256, u.b);
    const ggml_q8k_block k = u.k;
    assert_true(ggml_qdot_act_scale(GGML_QACT_Q8A, a, 64, 0) == 0.0f &&
                ggml_qdot_act_scale(GGML_QACT_Q8A, a, 64, 32) == 0.0f && k.d == 0.0f);
    for (int j = 0; j < 64; j++)
        assert_int_equal(((int8_t *)a)[j], 0);
    for (int j = 0; j < 16; j++)
        assert_int_equal(k.bsums[j], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_0),
        cmocka_unit_test(test_q4_0),
        cmocka_unit_test(test_q4_1),
        cmocka_unit_test(test_q5_0),
        cmocka_unit_test(test_q5_1),
        cmocka_unit_test(test_iq4_nl),
        cmocka_unit_test(test_q2_K),
        cmocka_unit_test(test_q3_K),
        cmocka_unit_test(test_q4_K),
        cmocka_unit_test(test_q5_K),
        cmocka_unit_test(test_q6_K),
        cmocka_unit_test(test_amx),
        cmocka_unit_test(test_unsupported),
        cmocka_unit_test(test_quantize_paths),
        cmocka_unit_test(test_zero_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
