/* test_qdot.c - integer-dot kernels (engine/gguf/ggml_qdot.c): the scalar,
 * AVX2 and VNNI paths give identical integer block sums and identical row
 * dots on odd block counts, the sums equal a plain int64 reference, and the
 * quantized-activation dot stays close to the exact dot of the dequantized
 * weights with the f32 activations. */
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

static void check_type(uint32_t type, size_t bytes)
{
    static const uint64_t nbs[] = {1, 3, 7, 33, 113};
    for (size_t t = 0; t < sizeof nbs / sizeof nbs[0]; t++) {
        uint64_t nb = nbs[t], n = nb * 32;
        float *w = malloc(n * sizeof *w), *x = malloc(n * sizeof *x);
        float *wd = malloc(n * sizeof *wd);
        uint8_t *wq = malloc(nb * bytes);
        ggml_q8a_block *a = malloc(nb * sizeof *a);
        int32_t *s0 = malloc(nb * sizeof *s0), *s1 = malloc(nb * sizeof *s1);
        assert_non_null(w);
        assert_non_null(x);
        assert_non_null(wd);
        assert_non_null(wq);
        assert_non_null(a);
        assert_non_null(s0);
        assert_non_null(s1);
        for (uint64_t i = 0; i < n; i++) {
            w[i] = frand();
            x[i] = frand() * 3.0f;
        }
        /* extremes: a block of -128-ish weights and full-scale activations */
        x[0] = -3.0f;
        assert_int_equal(ggml_quantize_row(type, w, wq, n), PD_OK);
        assert_int_equal(ggml_dequantize_row(type, wq, wd, n), PD_OK);
        ggml_q8a_quantize(x, n, a);

        /* integer reference */
        for (uint64_t b = 0; b < nb; b++) {
            int64_t r = 0;
            for (int j = 0; j < 32; j++) {
                const uint8_t *q = wq + b * bytes + 2;
                int wv = type == GGML_TYPE_Q8_0 ? (int8_t)q[j]
                                                : (j < 16 ? (q[j] & 15) : (q[j - 16] >> 4)) - 8;
                r += (int64_t)wv * a[b].qs[j];
            }
            s0[b] = (int32_t)r;
        }
        float ref_dot = 0.0f;
        for (int p = GGML_QDOT_SCALAR; p <= GGML_QDOT_VNNI; p++) {
            assert_int_equal(ggml_qdot_isums(p, type, wq, a, nb, s1), PD_OK);
            assert_memory_equal(s0, s1, nb * sizeof *s0);
            ggml_qdot_set_path(p);
            float d;
            assert_int_equal(ggml_qdot_row(type, wq, a, nb, &d), PD_OK);
            if (p == GGML_QDOT_SCALAR)
                ref_dot = d;
            else
                assert_memory_equal(&ref_dot, &d, sizeof d);
        }
        /* close to the exact dequantized function: error bounded by the
         * activation rounding, at most d_a / 2 per element */
        double exact = 0.0, bound = 0.0;
        for (uint64_t i = 0; i < n; i++) {
            exact += (double)wd[i] * x[i];
            bound += fabs((double)wd[i]) * a[i / 32].d * 0.5;
        }
        assert_true(fabs(exact - ref_dot) <= bound + 1e-4 * (1.0 + fabs(exact)));
        free(w);
        free(x);
        free(wd);
        free(wq);
        free(a);
        free(s0);
        free(s1);
    }
    ggml_qdot_set_path(GGML_QDOT_VNNI);
}

static void test_q8_0(void **state)
{
    (void)state;
    check_type(GGML_TYPE_Q8_0, 34);
}

static void test_q4_0(void **state)
{
    (void)state;
    check_type(GGML_TYPE_Q4_0, 18);
}

static void test_unsupported(void **state)
{
    (void)state;
    ggml_q8a_block a[1] = {{0}};
    uint8_t w[176] = {0};
    int32_t s[1];
    assert_int_equal(ggml_qdot_isums(GGML_QDOT_SCALAR, GGML_TYPE_Q5_K, w, a, 1, s),
                     PD_ERR_UNSUPPORTED);
}

static void test_zero_row(void **state)
{
    (void)state;
    float x[64] = {0};
    ggml_q8a_block a[2];
    ggml_q8a_quantize(x, 64, a);
    assert_true(a[0].d == 0.0f && a[1].d == 0.0f);
    for (int j = 0; j < 32; j++)
        assert_int_equal(a[0].qs[j], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_0),
        cmocka_unit_test(test_q4_0),
        cmocka_unit_test(test_unsupported),
        cmocka_unit_test(test_zero_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
