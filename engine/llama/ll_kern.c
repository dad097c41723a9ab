/* ll_kern.c - dequantization, canonical dot products, batched matmul and
 * the persistent thread pool of the llama engine. See ll_kern.h for the
 * determinism contract every kernel here implements. */
#include "ll_kern.h"

#include "ggml_qdot.h"
#include "ggml_types.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LL_LANES 16
#define QK 32 /* elements per Q8_0 / Q4_0 block */

/* ------------------------------------------------------------------ */
/* scalar helpers                                                      */

static inline float ll_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static inline float ll_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static inline uint16_t ll_rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

size_t eng_ll_row_bytes(uint32_t type, uint64_t cols)
{
    switch (type) {
    case ENG_LL_T_F32: return (size_t)cols * 4;
    case ENG_LL_T_F16:
    case ENG_LL_T_BF16: return (size_t)cols * 2;
    case ENG_LL_T_Q8_0: return cols % QK ? 0 : (size_t)(cols / QK) * 34;
    case ENG_LL_T_Q4_0: return cols % QK ? 0 : (size_t)(cols / QK) * 18;
    default: {
        /* the other supported types: one dequantizer (engine/gguf) */
        const ggml_type_info_t *info = ggml_type_info(type);
        uint64_t nb;
        if (!info || !info->supported || ggml_nbytes(type, cols, &nb) != PD_OK)
            return 0;
        return (size_t)nb;
    }
    }
}

const char *eng_ll_type_name(uint32_t type)
{
    switch (type) {
    case ENG_LL_T_F32: return "F32";
    case ENG_LL_T_F16: return "F16";
    case ENG_LL_T_BF16: return "BF16";
    case ENG_LL_T_Q8_0: return "Q8_0";
    case ENG_LL_T_Q4_0: return "Q4_0";
    default: return ggml_type_name(type);
    }
}

static void ll_dequant_scalar(uint32_t type, const uint8_t *src, size_t n,
                              float *out /* (n) */)
{
    switch (type) {
    case ENG_LL_T_F32:
        memcpy(out, src, n * 4);
        break;
    case ENG_LL_T_F16:
        for (size_t i = 0; i < n; i++)
            out[i] = ll_f16_to_f32(ll_rd16(src + 2 * i));
        break;
    case ENG_LL_T_BF16:
        for (size_t i = 0; i < n; i++)
            out[i] = ll_bf16_to_f32(ll_rd16(src + 2 * i));
        break;
    case ENG_LL_T_Q8_0:
        for (size_t b = 0; b < n / QK; b++) {
            const uint8_t *blk = src + b * 34;
            float d = ll_f16_to_f32(ll_rd16(blk));
            for (int j = 0; j < QK; j++)
                out[b * QK + j] = (float)(int8_t)blk[2 + j] * d;
        }
        break;
    case ENG_LL_T_Q4_0:
        for (size_t b = 0; b < n / QK; b++) {
            const uint8_t *blk = src + b * 18;
            float d = ll_f16_to_f32(ll_rd16(blk));
            for (int j = 0; j < QK / 2; j++) {
                out[b * QK + j] = (float)((int)(blk[2 + j] & 0x0f) - 8) * d;
                out[b * QK + j + QK / 2] = (float)((int)(blk[2 + j] >> 4) - 8) * d;
            }
        }
        break;
    default:
        /* K-quants, Q4_1, Q5_0/1, IQ4_NL: engine/gguf's scalar reference
         * dequantizer is the only one, so every path gets the same floats */
        if (ggml_dequantize_row(type, src, out, n) != PD_OK)
            memset(out, 0, n * 4);
        break;
    }
}

/* The canonical 16-lane reduction tree. */
static inline float ll_tree16(const float a[LL_LANES])
{
    float s8[8], s4[4], s2[2];
    for (int l = 0; l < 8; l++)
        s8[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; l++)
        s4[l] = s8[l] + s8[l + 4];
    for (int l = 0; l < 2; l++)
        s2[l] = s4[l] + s4[l + 2];
    return s2[0] + s2[1];
}

static float ll_dot_scalar(const float *a, const float *b, size_t n)
{
    float acc[LL_LANES] = { 0 };
    for (size_t k = 0; k < n; k++)
        acc[k % LL_LANES] = fmaf(a[k], b[k], acc[k % LL_LANES]);
    return ll_tree16(acc);
}

/* ------------------------------------------------------------------ */
/* AVX-512                                                             */

#define TGT512 __attribute__((target("avx512f,avx512vl,avx512bw,fma,f16c,avx2")))
#define TGT256 __attribute__((target("avx2,fma,f16c")))

static inline TGT256 float ll_tree8_256(__m256 s8)
{
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

static inline TGT512 float ll_tree8_512v(__m256 s8)
{
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

static inline TGT512 float ll_hsum512(__m512 a)
{
    __m256 lo = _mm512_castps512_ps256(a);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    return ll_tree8_512v(_mm256_add_ps(lo, hi));
}

static TGT512 void ll_dequant_512(uint32_t type, const uint8_t *src, size_t n,
                                  float *out /* (n), n % 16 == 0 */)
{
    switch (type) {
    case ENG_LL_T_F16:
        for (size_t i = 0; i < n; i += 16)
            _mm512_storeu_ps(out + i, _mm512_cvtph_ps(
                _mm256_loadu_si256((const __m256i *)(const void *)(src + 2 * i))));
        break;
    case ENG_LL_T_BF16:
        for (size_t i = 0; i < n; i += 16) {
            __m512i v = _mm512_cvtepu16_epi32(
                _mm256_loadu_si256((const __m256i *)(const void *)(src + 2 * i)));
            _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
        }
        break;
    case ENG_LL_T_Q8_0:
        for (size_t b = 0; b < n / QK; b++) {
            const uint8_t *blk = src + b * 34;
            __m512 d = _mm512_set1_ps(_cvtsh_ss(ll_rd16(blk)));
            __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(blk + 2)));
            __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(blk + 18)));
            _mm512_storeu_ps(out + b * QK, _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d));
            _mm512_storeu_ps(out + b * QK + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d));
        }
        break;
    case ENG_LL_T_Q4_0: {
        const __m128i m4 = _mm_set1_epi8(0x0f);
        const __m512i eight = _mm512_set1_epi32(8);
        for (size_t b = 0; b < n / QK; b++) {
            const uint8_t *blk = src + b * 18;
            __m512 d = _mm512_set1_ps(_cvtsh_ss(ll_rd16(blk)));
            __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(blk + 2));
            __m128i lo = _mm_and_si128(v, m4);
            __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
            __m512i q0 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(lo), eight);
            __m512i q1 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(hi), eight);
            _mm512_storeu_ps(out + b * QK, _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d));
            _mm512_storeu_ps(out + b * QK + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d));
        }
        break;
    }
    default:
        ll_dequant_scalar(type, src, n, out);
        break;
    }
}

/* The canonical tree (ll_tree16: lanes l + l+8, then + 4, + 2, + 1) of
 * sixteen accumulators at once, each step pairing two vectors' halves
 * with one shuffle each way and one add, instead of ll_hsum512 sixteen
 * times (three quarters fewer shuffles and adds): the same additions of
 * the same pairs, so the same bits. Dot (r, i) = acc[r][i] lands at
 * element 4i + r: o[i * os + r] for r < 4 is one 128-bit store per i. */
static inline __attribute__((always_inline)) TGT512 void
ll_tree16x16_store(__m512 acc[4][4], float *o, size_t os)
{
    __m512 p[8], q[4], t[2];
    for (int j = 0; j < 8; j++) { /* v = acc[a / 4][a % 4], a = 2j, 2j + 1 */
        __m512 a = acc[(2 * j) / 4][(2 * j) % 4], b = acc[(2 * j + 1) / 4][(2 * j + 1) % 4];
        p[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    for (int k = 0; k < 4; k++)
        q[k] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * k], p[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(p[2 * k], p[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int m = 0; m < 2; m++)
        t[m] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * m], q[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(q[2 * m], q[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 s = _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 1, 3, 1)));
    _mm_storeu_ps(o, _mm512_castps512_ps128(s));
    _mm_storeu_ps(o + os, _mm512_extractf32x4_ps(s, 1));
    _mm_storeu_ps(o + 2 * os, _mm512_extractf32x4_ps(s, 2));
    _mm_storeu_ps(o + 3 * os, _mm512_extractf32x4_ps(s, 3));
}

/* R weight rows (stride ws floats) x NI items (stride xs floats):
 * o[i * os + r] = canonical dot. Fully unrolled for constant R, NI. */
static inline __attribute__((always_inline)) TGT512 void
ll_mk512(const float *w, size_t ws, const float *x, size_t xs, size_t K,
         float *o, size_t os, const int R, const int NI)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (size_t k = 0; k < K; k += 16) {
        __m512 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            wv[r] = _mm512_loadu_ps(w + r * ws + k);
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++) {
            __m512 xv = _mm512_loadu_ps(x + i * xs + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][i] = _mm512_fmadd_ps(wv[r], xv, acc[r][i]);
        }
    }
    if (R == 4 && NI == 4) {
        ll_tree16x16_store(acc, o, os);
        return;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++)
            o[i * os + r] = ll_hsum512(acc[r][i]);
}

#define LL_MK512_FN(R, NI)                                                    \
    static TGT512 void ll_mk512_##R##x##NI(const float *w, size_t ws,         \
        const float *x, size_t xs, size_t K, float *o, size_t os)             \
    {                                                                         \
        ll_mk512(w, ws, x, xs, K, o, os, R, NI);                              \
    }
LL_MK512_FN(4, 4) LL_MK512_FN(4, 3) LL_MK512_FN(4, 2) LL_MK512_FN(4, 1)
LL_MK512_FN(1, 4) LL_MK512_FN(1, 3) LL_MK512_FN(1, 2) LL_MK512_FN(1, 1)

typedef void (*ll_mk_fn)(const float *, size_t, const float *, size_t, size_t,
                         float *, size_t);
static const ll_mk_fn ll_mk512_tab[2][5] = {
    { NULL, ll_mk512_1x1, ll_mk512_1x2, ll_mk512_1x3, ll_mk512_1x4 },
    { NULL, ll_mk512_4x1, ll_mk512_4x2, ll_mk512_4x3, ll_mk512_4x4 },
};


/* Fused kernels for small batches (n_items <= 4): weights are widened in
 * registers straight from the mmap instead of through the scratch rows.
 * The widened value is bit-identical to ll_dequant_512's (exact), and the
 * accumulation is the canonical one, so results equal the scratch path. */
static inline __attribute__((always_inline)) TGT512 __m512
ll_wload512(const uint8_t *row, size_t k, const uint32_t type)
{
    switch (type) {
    case ENG_LL_T_F32:
        return _mm512_loadu_ps((const float *)(const void *)row + k);
    case ENG_LL_T_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * k)));
    case ENG_LL_T_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * k))), 16));
    case ENG_LL_T_Q8_0: {
        const uint8_t *blk = row + (k / QK) * 34;
        __m512 d = _mm512_set1_ps(_cvtsh_ss(ll_rd16(blk)));
        __m512i q = _mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i *)(const void *)(blk + 2 + (k % QK))));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
    }
    default: { /* Q4_0 */
        const uint8_t *blk = row + (k / QK) * 18;
        __m512 d = _mm512_set1_ps(_cvtsh_ss(ll_rd16(blk)));
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(blk + 2));
        if (k % QK)
            v = _mm_srli_epi16(v, 4);
        v = _mm_and_si128(v, _mm_set1_epi8(0x0f));
        __m512i q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(v), _mm512_set1_epi32(8));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
    }
    }
}

static inline __attribute__((always_inline)) TGT512 void
ll_mkf512(const uint8_t *w, size_t rb, const float *x, size_t xs, size_t K,
          float *o, size_t os, const int R, const int NI, const uint32_t type)
{
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++)
            acc[r][i] = _mm512_setzero_ps();
    if (type == ENG_LL_T_Q8_0 || type == ENG_LL_T_Q4_0) {
        /* one block (32) per step: one scale conversion for two vectors */
        const size_t bb = type == ENG_LL_T_Q8_0 ? 34 : 18;
        for (size_t k = 0; k < K; k += QK) {
            __m512 w0[8], w1[8];
            if (eng_ll_pf_g && (k & 63) == 0)
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    _mm_prefetch((const char *)(w + r * rb + (k / QK) * bb) + eng_ll_pf_g,
                                 _MM_HINT_T0);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const uint8_t *blk = w + r * rb + (k / QK) * bb;
                __m512 d = _mm512_set1_ps(_cvtsh_ss(ll_rd16(blk)));
                __m512i q0, q1;
                if (type == ENG_LL_T_Q8_0) {
                    q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(blk + 2)));
                    q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(blk + 18)));
                } else {
                    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(blk + 2));
                    const __m128i m4 = _mm_set1_epi8(0x0f);
                    const __m512i eight = _mm512_set1_epi32(8);
                    q0 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(v, m4)), eight);
                    q1 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(
                             _mm_and_si128(_mm_srli_epi16(v, 4), m4)), eight);
                }
                w0[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d);
                w1[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d);
            }
#pragma GCC unroll 4
            for (int i = 0; i < NI; i++) {
                __m512 x0 = _mm512_loadu_ps(x + i * xs + k);
                __m512 x1 = _mm512_loadu_ps(x + i * xs + k + 16);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    acc[r][i] = _mm512_fmadd_ps(w0[r], x0, acc[r][i]);
                    acc[r][i] = _mm512_fmadd_ps(w1[r], x1, acc[r][i]);
                }
            }
        }
    } else {
        for (size_t k = 0; k < K; k += 16) {
            __m512 wv[8];
            if (eng_ll_pf_g && (k & 31) == 0)
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    _mm_prefetch((const char *)(w + r * rb + (type == ENG_LL_T_F32 ? 4 : 2) * k) +
                                 eng_ll_pf_g, _MM_HINT_T0);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                wv[r] = ll_wload512(w + r * rb, k, type);
#pragma GCC unroll 4
            for (int i = 0; i < NI; i++) {
                __m512 xv = _mm512_loadu_ps(x + i * xs + k);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    acc[r][i] = _mm512_fmadd_ps(wv[r], xv, acc[r][i]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++)
            o[i * os + r] = ll_hsum512(acc[r][i]);
}

typedef void (*ll_mkf_fn)(const uint8_t *, size_t, const float *, size_t, size_t,
                          float *, size_t);
#define LL_MKF_FN(T, TN, R, NI)                                               \
    static TGT512 void ll_mkf_##TN##_##R##x##NI(const uint8_t *w, size_t rb,  \
        const float *x, size_t xs, size_t K, float *o, size_t os)             \
    {                                                                         \
        ll_mkf512(w, rb, x, xs, K, o, os, R, NI, T);                          \
    }
#define LL_MKF_TYPE(T, TN)                                                    \
    LL_MKF_FN(T, TN, 8, 1) LL_MKF_FN(T, TN, 8, 2)                             \
    LL_MKF_FN(T, TN, 4, 1) LL_MKF_FN(T, TN, 4, 2) LL_MKF_FN(T, TN, 4, 3)      \
    LL_MKF_FN(T, TN, 4, 4) LL_MKF_FN(T, TN, 1, 1) LL_MKF_FN(T, TN, 1, 2)      \
    LL_MKF_FN(T, TN, 1, 3) LL_MKF_FN(T, TN, 1, 4)                             \
    static const ll_mkf_fn ll_mkf_##TN##_tab[2][5] = {                        \
        { NULL, ll_mkf_##TN##_1x1, ll_mkf_##TN##_1x2, ll_mkf_##TN##_1x3,      \
          ll_mkf_##TN##_1x4 },                                                \
        { NULL, ll_mkf_##TN##_4x1, ll_mkf_##TN##_4x2, ll_mkf_##TN##_4x3,      \
          ll_mkf_##TN##_4x4 },                                                \
    };
LL_MKF_TYPE(ENG_LL_T_F32, f32)
LL_MKF_TYPE(ENG_LL_T_F16, f16)
LL_MKF_TYPE(ENG_LL_T_BF16, bf16)
LL_MKF_TYPE(ENG_LL_T_Q8_0, q8)
LL_MKF_TYPE(ENG_LL_T_Q4_0, q4)

/* 8-row tiles for 1-2 items: more weight streams in flight per core (the
 * batch-1 path is bound by memory-level parallelism and, for Q8_0/Q4_0, by
 * widening work that 8 independent accumulators overlap better). */
static ll_mkf_fn ll_mkf8_fn(uint32_t type, uint32_t n_items)
{
    int two = n_items == 2;
    switch (type) {
    case ENG_LL_T_F32: return two ? ll_mkf_f32_8x2 : ll_mkf_f32_8x1;
    case ENG_LL_T_F16: return two ? ll_mkf_f16_8x2 : ll_mkf_f16_8x1;
    case ENG_LL_T_BF16: return two ? ll_mkf_bf16_8x2 : ll_mkf_bf16_8x1;
    case ENG_LL_T_Q8_0: return two ? ll_mkf_q8_8x2 : ll_mkf_q8_8x1;
    case ENG_LL_T_Q4_0: return two ? ll_mkf_q4_8x2 : ll_mkf_q4_8x1;
    default: return NULL;
    }
}

static const ll_mkf_fn (*ll_mkf_tab(uint32_t type))[5]
{
    switch (type) {
    case ENG_LL_T_F32: return ll_mkf_f32_tab;
    case ENG_LL_T_F16: return ll_mkf_f16_tab;
    case ENG_LL_T_BF16: return ll_mkf_bf16_tab;
    case ENG_LL_T_Q8_0: return ll_mkf_q8_tab;
    case ENG_LL_T_Q4_0: return ll_mkf_q4_tab;
    default: return NULL;
    }
}

static TGT512 float ll_dot_512(const float *a, const float *b, size_t n)
{
    float r;
    ll_mk512(a, 0, b, 0, n, &r, 0, 1, 1);
    return r;
}

static TGT512 float ll_dot_f16_512(const uint16_t *a, const float *b, size_t n)
{
    __m512 acc = _mm512_setzero_ps();
    for (size_t k = 0; k < n; k += 16)
        acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(a + k))),
                              _mm512_loadu_ps(b + k), acc);
    return ll_hsum512(acc);
}

static TGT512 void ll_axpy_f16_512(float *y, float a, const uint16_t *x, size_t n)
{
    __m512 av = _mm512_set1_ps(a);
    for (size_t k = 0; k < n; k += 16)
        _mm512_storeu_ps(y + k, _mm512_fmadd_ps(av,
            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(x + k))),
            _mm512_loadu_ps(y + k)));
}

static TGT512 void ll_axpy_512(float *y, float a, const float *x, size_t n)
{
    __m512 av = _mm512_set1_ps(a);
    for (size_t k = 0; k < n; k += 16)
        _mm512_storeu_ps(y + k, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + k),
                                                _mm512_loadu_ps(y + k)));
}

/* cnt dot products against rows k + j*stride (attention scores). */
static TGT512 void ll_dot_rows_f16_512(const uint16_t *k, size_t stride, uint32_t cnt,
                                       const float *q, size_t n, float *out)
{
    for (uint32_t j = 0; j < cnt; j++)
        out[j] = ll_dot_f16_512(k + j * stride, q, n);
}

/* y += sum_j a[j] * v_j in j order, y kept in registers for n <= 256. */
static TGT512 void ll_axpy_rows_f16_512(float *y, const float *a, const uint16_t *v,
                                        size_t stride, uint32_t cnt, size_t n)
{
    if (n > 256) {
        for (uint32_t j = 0; j < cnt; j++)
            ll_axpy_f16_512(y, a[j], v + j * stride, n);
        return;
    }
    __m512 acc[16];
    const size_t nv = n / 16;
    for (size_t c = 0; c < nv; c++)
        acc[c] = _mm512_loadu_ps(y + 16 * c);
    for (uint32_t j = 0; j < cnt; j++) {
        __m512 av = _mm512_set1_ps(a[j]);
        const uint16_t *vj = v + j * stride;
        for (size_t c = 0; c < nv; c++)
            acc[c] = _mm512_fmadd_ps(av, _mm512_cvtph_ps(_mm256_loadu_si256(
                         (const __m256i *)(const void *)(vj + 16 * c))), acc[c]);
    }
    for (size_t c = 0; c < nv; c++)
        _mm512_storeu_ps(y + 16 * c, acc[c]);
}

/* ------------------------------------------------------------------ */
/* AVX2: two ymm per canonical 16-lane accumulator                     */

static TGT256 void ll_dequant_256(uint32_t type, const uint8_t *src, size_t n,
                                  float *out)
{
    if (type == ENG_LL_T_F16) {
        for (size_t i = 0; i < n; i += 8)
            _mm256_storeu_ps(out + i, _mm256_cvtph_ps(
                _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i))));
        return;
    }
    ll_dequant_scalar(type, src, n, out);
}

static inline __attribute__((always_inline)) TGT256 void
ll_mk256(const float *w, size_t ws, const float *x, size_t xs, size_t K,
         float *o, size_t os, const int R, const int NI)
{
    __m256 lo[2][2], hi[2][2];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int i = 0; i < NI; i++) {
            lo[r][i] = _mm256_setzero_ps();
            hi[r][i] = _mm256_setzero_ps();
        }
    for (size_t k = 0; k < K; k += 16) {
        __m256 wl[2], wh[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            wl[r] = _mm256_loadu_ps(w + r * ws + k);
            wh[r] = _mm256_loadu_ps(w + r * ws + k + 8);
        }
#pragma GCC unroll 2
        for (int i = 0; i < NI; i++) {
            __m256 xl = _mm256_loadu_ps(x + i * xs + k);
            __m256 xh = _mm256_loadu_ps(x + i * xs + k + 8);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                lo[r][i] = _mm256_fmadd_ps(wl[r], xl, lo[r][i]);
                hi[r][i] = _mm256_fmadd_ps(wh[r], xh, hi[r][i]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int i = 0; i < NI; i++)
            o[i * os + r] = ll_tree8_256(_mm256_add_ps(lo[r][i], hi[r][i]));
}

#define LL_MK256_FN(R, NI)                                                    \
    static TGT256 void ll_mk256_##R##x##NI(const float *w, size_t ws,         \
        const float *x, size_t xs, size_t K, float *o, size_t os)             \
    {                                                                         \
        ll_mk256(w, ws, x, xs, K, o, os, R, NI);                              \
    }
LL_MK256_FN(2, 2) LL_MK256_FN(2, 1) LL_MK256_FN(1, 2) LL_MK256_FN(1, 1)

static TGT256 float ll_dot_256(const float *a, const float *b, size_t n)
{
    float r;
    ll_mk256(a, 0, b, 0, n, &r, 0, 1, 1);
    return r;
}

/* ------------------------------------------------------------------ */
/* dispatch                                                            */

enum { LL_ISA_SCALAR = 0, LL_ISA_AVX2 = 1, LL_ISA_AVX512 = 2 };
static _Atomic int ll_isa_g = -1;

static int ll_isa_get(void)
{
    int isa = atomic_load_explicit(&ll_isa_g, memory_order_relaxed);
    if (isa >= 0)
        return isa;
    __builtin_cpu_init();
    isa = LL_ISA_SCALAR;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        isa = LL_ISA_AVX2; /* f16c is present on every AVX2+FMA x86 CPU */
    if (isa == LL_ISA_AVX2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
        isa = LL_ISA_AVX512;
    const char *force = getenv("ENG_LL_ISA");
    if (force && strcmp(force, "scalar") == 0)
        isa = LL_ISA_SCALAR;
    else if (force && strcmp(force, "avx2") == 0 && isa > LL_ISA_AVX2)
        isa = LL_ISA_AVX2;
    atomic_store_explicit(&ll_isa_g, isa, memory_order_relaxed);
    return isa;
}

int eng_ll_isa_force(const char *name)
{
    atomic_store(&ll_isa_g, -1);
    int best = ll_isa_get();
    int want = strcmp(name, "scalar") == 0 ? LL_ISA_SCALAR
             : strcmp(name, "avx2") == 0 ? LL_ISA_AVX2 : LL_ISA_AVX512;
    if (want > best)
        return -1;
    atomic_store(&ll_isa_g, want);
    return 0;
}

const char *eng_ll_isa(void)
{
    static const char *const names[] = { "scalar", "avx2", "avx512" };
    return names[ll_isa_get()];
}

void eng_ll_dequant_row(const eng_ll_tensor_t *t, uint32_t row, float *out)
{
    const uint8_t *src = t->data + (size_t)row * t->row_bytes;
    int isa = ll_isa_get();
    if (isa == LL_ISA_AVX512 && t->cols % 16 == 0 && t->type != ENG_LL_T_F32)
        ll_dequant_512(t->type, src, t->cols, out);
    else if (isa == LL_ISA_AVX2 && t->cols % 16 == 0)
        ll_dequant_256(t->type, src, t->cols, out);
    else
        ll_dequant_scalar(t->type, src, t->cols, out);
}

float eng_ll_dot(const float *a, const float *b, size_t n)
{
    int isa = ll_isa_get();
    if (n % 16 == 0 && isa == LL_ISA_AVX512)
        return ll_dot_512(a, b, n);
    if (n % 16 == 0 && isa == LL_ISA_AVX2)
        return ll_dot_256(a, b, n);
    return ll_dot_scalar(a, b, n);
}

float eng_ll_dot_f16(const uint16_t *a, const float *b, size_t n)
{
    if (n % 16 == 0 && ll_isa_get() == LL_ISA_AVX512)
        return ll_dot_f16_512(a, b, n);
    float acc[LL_LANES] = { 0 };
    for (size_t k = 0; k < n; k++)
        acc[k % LL_LANES] = fmaf(ll_f16_to_f32(a[k]), b[k], acc[k % LL_LANES]);
    return ll_tree16(acc);
}

void eng_ll_axpy_f16(float *y, float a, const uint16_t *x, size_t n)
{
    if (n % 16 == 0 && ll_isa_get() == LL_ISA_AVX512) {
        ll_axpy_f16_512(y, a, x, n);
        return;
    }
    for (size_t k = 0; k < n; k++)
        y[k] = fmaf(a, ll_f16_to_f32(x[k]), y[k]);
}

void eng_ll_axpy(float *y, float a, const float *x, size_t n)
{
    if (n % 16 == 0 && ll_isa_get() == LL_ISA_AVX512) {
        ll_axpy_512(y, a, x, n);
        return;
    }
    for (size_t k = 0; k < n; k++)
        y[k] = fmaf(a, x[k], y[k]);
}

void eng_ll_dot_rows_f16(const uint16_t *k, size_t stride, uint32_t cnt,
                         const float *q, size_t n, float *out)
{
    if (n % 16 == 0 && ll_isa_get() == LL_ISA_AVX512) {
        ll_dot_rows_f16_512(k, stride, cnt, q, n, out);
        return;
    }
    for (uint32_t j = 0; j < cnt; j++)
        out[j] = eng_ll_dot_f16(k + j * stride, q, n);
}

void eng_ll_dot_rows(const float *k, size_t stride, uint32_t cnt, const float *q,
                     size_t n, float *out)
{
    for (uint32_t j = 0; j < cnt; j++)
        out[j] = eng_ll_dot(k + j * stride, q, n);
}

void eng_ll_axpy_rows_f16(float *y, const float *a, const uint16_t *v, size_t stride,
                          uint32_t cnt, size_t n)
{
    if (n % 16 == 0 && ll_isa_get() == LL_ISA_AVX512) {
        ll_axpy_rows_f16_512(y, a, v, stride, cnt, n);
        return;
    }
    for (uint32_t j = 0; j < cnt; j++)
        eng_ll_axpy_f16(y, a[j], v + j * stride, n);
}

/* ------------------------------------------------------------------ */
/* KV cache in q8_0 (ll_kern.h)                                         */

#define LL_KVQ_BYTES 34 /* f16 d + 32 int8 */

void eng_ll_kv_q8_0_quantize(uint8_t *dst, const float *x, size_t n)
{
    for (size_t b = 0; b < n / QK; b++, x += QK, dst += LL_KVQ_BYTES) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = ggml_fp32_to_fp16(d);
        memcpy(dst, &dh, 2);
        for (int j = 0; j < QK; j++)
            dst[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

void eng_ll_kv_q8_0_dequantize(float *out, const uint8_t *src, size_t n)
{
    for (size_t b = 0; b < n / QK; b++, src += LL_KVQ_BYTES) {
        const float d = ll_f16_to_f32(ll_rd16(src));
        for (int j = 0; j < QK; j++)
            out[b * QK + j] = (float)(int8_t)src[2 + j] * d;
    }
}

static float ll_dot_q8_0_scalar(const uint8_t *a, const float *b, size_t n)
{
    float acc[LL_LANES] = { 0 };
    for (size_t k0 = 0; k0 < n; k0 += QK, a += LL_KVQ_BYTES) {
        const float d = ll_f16_to_f32(ll_rd16(a));
        for (int j = 0; j < QK; j++)
            acc[j % LL_LANES] = fmaf((float)(int8_t)a[2 + j] * d, b[k0 + j],
                                     acc[j % LL_LANES]);
    }
    return ll_tree16(acc);
}

static void ll_axpy_q8_0_scalar(float *y, float a, const uint8_t *x, size_t n)
{
    for (size_t k0 = 0; k0 < n; k0 += QK, x += LL_KVQ_BYTES) {
        const float d = ll_f16_to_f32(ll_rd16(x));
        for (int j = 0; j < QK; j++)
            y[k0 + j] = fmaf(a, (float)(int8_t)x[2 + j] * d, y[k0 + j]);
    }
}

/* 16 int8 at p as exact floats times d */
static inline TGT512 __m512 ll_q8x16_512(const uint8_t *p, __m512 d)
{
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                             _mm_loadu_si128((const __m128i *)(const void *)p))), d);
}

static TGT512 float ll_dot_q8_0_512(const uint8_t *a, const float *b, size_t n)
{
    __m512 acc = _mm512_setzero_ps();
    for (size_t k0 = 0; k0 < n; k0 += QK, a += LL_KVQ_BYTES) {
        const __m512 d = _mm512_set1_ps(ll_f16_to_f32(ll_rd16(a)));
        acc = _mm512_fmadd_ps(ll_q8x16_512(a + 2, d), _mm512_loadu_ps(b + k0), acc);
        acc = _mm512_fmadd_ps(ll_q8x16_512(a + 18, d), _mm512_loadu_ps(b + k0 + 16), acc);
    }
    return ll_hsum512(acc);
}

static TGT512 void ll_axpy_q8_0_512(float *y, float a, const uint8_t *x, size_t n)
{
    const __m512 av = _mm512_set1_ps(a);
    for (size_t k0 = 0; k0 < n; k0 += QK, x += LL_KVQ_BYTES) {
        const __m512 d = _mm512_set1_ps(ll_f16_to_f32(ll_rd16(x)));
        for (int h = 0; h < 2; h++)
            _mm512_storeu_ps(y + k0 + 16 * h,
                             _mm512_fmadd_ps(av, ll_q8x16_512(x + 2 + 16 * h, d),
                                             _mm512_loadu_ps(y + k0 + 16 * h)));
    }
}

/* 8 int8 at p as exact floats times d */
static inline TGT256 __m256 ll_q8x8_256(const uint8_t *p, __m256 d)
{
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                             _mm_loadl_epi64((const __m128i *)(const void *)p))), d);
}

/* lanes 0-7 in lo, 8-15 in hi; the canonical tree: s8 = lo + hi, then 8 */
static TGT256 float ll_dot_q8_0_256(const uint8_t *a, const float *b, size_t n)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (size_t k0 = 0; k0 < n; k0 += QK, a += LL_KVQ_BYTES) {
        const __m256 d = _mm256_set1_ps(ll_f16_to_f32(ll_rd16(a)));
        for (int h = 0; h < 2; h++) {
            lo = _mm256_fmadd_ps(ll_q8x8_256(a + 2 + 16 * h, d),
                                 _mm256_loadu_ps(b + k0 + 16 * h), lo);
            hi = _mm256_fmadd_ps(ll_q8x8_256(a + 10 + 16 * h, d),
                                 _mm256_loadu_ps(b + k0 + 16 * h + 8), hi);
        }
    }
    return ll_tree8_256(_mm256_add_ps(lo, hi));
}

static TGT256 void ll_axpy_q8_0_256(float *y, float a, const uint8_t *x, size_t n)
{
    const __m256 av = _mm256_set1_ps(a);
    for (size_t k0 = 0; k0 < n; k0 += QK, x += LL_KVQ_BYTES) {
        const __m256 d = _mm256_set1_ps(ll_f16_to_f32(ll_rd16(x)));
        for (int h = 0; h < 4; h++)
            _mm256_storeu_ps(y + k0 + 8 * h,
                             _mm256_fmadd_ps(av, ll_q8x8_256(x + 2 + 8 * h, d),
                                             _mm256_loadu_ps(y + k0 + 8 * h)));
    }
}

float eng_ll_dot_q8_0(const uint8_t *a, const float *b, size_t n)
{
    int isa = ll_isa_get();
    if (isa == LL_ISA_AVX512)
        return ll_dot_q8_0_512(a, b, n);
    if (isa == LL_ISA_AVX2)
        return ll_dot_q8_0_256(a, b, n);
    return ll_dot_q8_0_scalar(a, b, n);
}

void eng_ll_axpy_q8_0(float *y, float a, const uint8_t *x, size_t n)
{
    int isa = ll_isa_get();
    if (isa == LL_ISA_AVX512)
        ll_axpy_q8_0_512(y, a, x, n);
    else if (isa == LL_ISA_AVX2)
        ll_axpy_q8_0_256(y, a, x, n);
    else
        ll_axpy_q8_0_scalar(y, a, x, n);
}

void eng_ll_dot_rows_q8_0(const uint8_t *k, size_t stride, uint32_t cnt, const float *q,
                          size_t n, float *out)
{
    int isa = ll_isa_get();
    for (uint32_t j = 0; j < cnt; j++, k += stride)
        out[j] = isa == LL_ISA_AVX512 ? ll_dot_q8_0_512(k, q, n)
               : isa == LL_ISA_AVX2 ? ll_dot_q8_0_256(k, q, n) : ll_dot_q8_0_scalar(k, q, n);
}

void eng_ll_axpy_rows_q8_0(float *y, const float *a, const uint8_t *v, size_t stride,
                           uint32_t cnt, size_t n)
{
    for (uint32_t j = 0; j < cnt; j++, v += stride)
        eng_ll_axpy_q8_0(y, a[j], v, n);
}

/* ------------------------------------------------------------------ */
/* KV cache in q4_0, bf16, fp8_e4m3 (ll_kern.h)                         */
/* Each format is read in blocks of NB values (32; bf16: 16): per block a
 * scale sc (q4_0: f16 d; fp8_e4m3: 2^(s-127); bf16: 1) and NB unscaled
 * values u (q4_0: nibble - 8; fp8_e4m3: the e4m3 value; bf16: the value);
 * element j is u_j * sc, one IEEE product on every path, then the dot and
 * axpy are the canonical ones of the f32 path over those elements (lane j %
 * 16, the fixed tree), so the scalar / AVX2 / AVX-512 paths agree bitwise. */

/* e4m3 -> f32 (S.1111.111, NaN in OCP, is never written: read as +-480,
 * as the SIMD paths' bit construction gives it) */
static const float ll_e4m3_lut[256] = {
    0.0f, 0.001953125f, 0.00390625f, 0.005859375f, 0.0078125f, 0.009765625f, 0.01171875f, 0.013671875f,
    0.015625f, 0.017578125f, 0.01953125f, 0.021484375f, 0.0234375f, 0.025390625f, 0.02734375f, 0.029296875f,
    0.03125f, 0.03515625f, 0.0390625f, 0.04296875f, 0.046875f, 0.05078125f, 0.0546875f, 0.05859375f,
    0.0625f, 0.0703125f, 0.078125f, 0.0859375f, 0.09375f, 0.1015625f, 0.109375f, 0.1171875f,
    0.125f, 0.140625f, 0.15625f, 0.171875f, 0.1875f, 0.203125f, 0.21875f, 0.234375f,
    0.25f, 0.28125f, 0.3125f, 0.34375f, 0.375f, 0.40625f, 0.4375f, 0.46875f,
    0.5f, 0.5625f, 0.625f, 0.6875f, 0.75f, 0.8125f, 0.875f, 0.9375f,
    1.0f, 1.125f, 1.25f, 1.375f, 1.5f, 1.625f, 1.75f, 1.875f,
    2.0f, 2.25f, 2.5f, 2.75f, 3.0f, 3.25f, 3.5f, 3.75f,
    4.0f, 4.5f, 5.0f, 5.5f, 6.0f, 6.5f, 7.0f, 7.5f,
    8.0f, 9.0f, 10.0f, 11.0f, 12.0f, 13.0f, 14.0f, 15.0f,
    16.0f, 18.0f, 20.0f, 22.0f, 24.0f, 26.0f, 28.0f, 30.0f,
    32.0f, 36.0f, 40.0f, 44.0f, 48.0f, 52.0f, 56.0f, 60.0f,
    64.0f, 72.0f, 80.0f, 88.0f, 96.0f, 104.0f, 112.0f, 120.0f,
    128.0f, 144.0f, 160.0f, 176.0f, 192.0f, 208.0f, 224.0f, 240.0f,
    256.0f, 288.0f, 320.0f, 352.0f, 384.0f, 416.0f, 448.0f, 480.0f,
    -0.0f, -0.001953125f, -0.00390625f, -0.005859375f, -0.0078125f, -0.009765625f, -0.01171875f, -0.013671875f,
    -0.015625f, -0.017578125f, -0.01953125f, -0.021484375f, -0.0234375f, -0.025390625f, -0.02734375f, -0.029296875f,
    -0.03125f, -0.03515625f, -0.0390625f, -0.04296875f, -0.046875f, -0.05078125f, -0.0546875f, -0.05859375f,
    -0.0625f, -0.0703125f, -0.078125f, -0.0859375f, -0.09375f, -0.1015625f, -0.109375f, -0.1171875f,
    -0.125f, -0.140625f, -0.15625f, -0.171875f, -0.1875f, -0.203125f, -0.21875f, -0.234375f,
    -0.25f, -0.28125f, -0.3125f, -0.34375f, -0.375f, -0.40625f, -0.4375f, -0.46875f,
    -0.5f, -0.5625f, -0.625f, -0.6875f, -0.75f, -0.8125f, -0.875f, -0.9375f,
    -1.0f, -1.125f, -1.25f, -1.375f, -1.5f, -1.625f, -1.75f, -1.875f,
    -2.0f, -2.25f, -2.5f, -2.75f, -3.0f, -3.25f, -3.5f, -3.75f,
    -4.0f, -4.5f, -5.0f, -5.5f, -6.0f, -6.5f, -7.0f, -7.5f,
    -8.0f, -9.0f, -10.0f, -11.0f, -12.0f, -13.0f, -14.0f, -15.0f,
    -16.0f, -18.0f, -20.0f, -22.0f, -24.0f, -26.0f, -28.0f, -30.0f,
    -32.0f, -36.0f, -40.0f, -44.0f, -48.0f, -52.0f, -56.0f, -60.0f,
    -64.0f, -72.0f, -80.0f, -88.0f, -96.0f, -104.0f, -112.0f, -120.0f,
    -128.0f, -144.0f, -160.0f, -176.0f, -192.0f, -208.0f, -224.0f, -240.0f,
    -256.0f, -288.0f, -320.0f, -352.0f, -384.0f, -416.0f, -448.0f, -480.0f,
};

/* f32 -> e4m3 (sign, 4-bit exponent bias 7, 3-bit mantissa), round to
 * nearest even, saturating at 448 (0x7e); |x| must not be NaN. */
static uint8_t ll_f32_to_e4m3(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (a >= 448.0f)
        return sign | 0x7e;
    if (a < 0.015625f) /* below 2^-6: subnormal steps of 2^-9 (code m = 8 is 2^-6) */
        return sign | (uint8_t)nearbyintf(a * 512.0f);
    int ex;
    float f = frexpf(a, &ex); /* a = f * 2^ex, f in [0.5, 1) */
    ex -= 1;                  /* a = (2f) * 2^ex, 2f in [1, 2) */
    int m = (int)nearbyintf((2.0f * f - 1.0f) * 8.0f);
    if (m == 8) {
        m = 0;
        ex++;
    }
    int code = ((ex + 7) << 3) | m;
    return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

/* scale and unscaled element j of a block, per format (scalar) */
static inline float ll_kv_sc_q4_0(const uint8_t *b) { return ll_f16_to_f32(ll_rd16(b)); }
static inline float ll_kv_u_q4_0(const uint8_t *b, int j)
{
    return (float)((j < 16 ? b[2 + j] & 0x0f : b[2 + j - 16] >> 4) - 8);
}
static inline float ll_kv_sc_fp8(const uint8_t *b)
{
    uint32_t bits = (uint32_t)b[0] << 23;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}
static inline float ll_kv_u_fp8(const uint8_t *b, int j) { return ll_e4m3_lut[b[1 + j]]; }
static inline float ll_kv_sc_bf16(const uint8_t *b) { (void)b; return 1.0f; }
static inline float ll_kv_u_bf16(const uint8_t *b, int j) { return ll_bf16_to_f32(ll_rd16(b + 2 * j)); }

/* 16 unscaled values 16h .. 16h+15 (AVX-512) */
static inline TGT512 __m512 ll_kv_u16_q4_0(const uint8_t *b, int h)
{
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(b + 2)));
    v = h ? _mm512_srli_epi32(v, 4) : _mm512_and_si512(v, _mm512_set1_epi32(0x0f));
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(v, _mm512_set1_epi32(8)));
}
/* e4m3 built from its bits (the table's values, exactly): normal codes
 * (exponent field >= 1) as f32 bits (mag << 20) + (120 << 23), subnormal
 * ones as mag * 2^-9, then the sign */
static inline TGT512 __m512 ll_kv_u16_fp8(const uint8_t *b, int h)
{
    __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(b + 1 + 16 * h)));
    __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7f));
    __m512 nrm = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(mag, 20),
                                                      _mm512_set1_epi32(120 << 23)));
    __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(1.0f / 512));
    __m512 v = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8)), nrm, sub);
    __m512i sgn = _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x80)), 24);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sgn));
}
static inline TGT512 __m512 ll_kv_u16_bf16(const uint8_t *b, int h)
{
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(b + 32 * h)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/* 8 unscaled values 8h .. 8h+7 (AVX2) */
static inline TGT256 __m256 ll_kv_u8_q4_0(const uint8_t *b, int h)
{
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(b + 2 + 8 * (h & 1))));
    v = h >> 1 ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(0x0f));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_set1_epi32(8)));
}
static inline TGT256 __m256 ll_kv_u8_fp8(const uint8_t *b, int h)
{
    __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(b + 1 + 8 * h)));
    __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7f));
    __m256 nrm = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(mag, 20),
                                                      _mm256_set1_epi32(120 << 23)));
    __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(1.0f / 512));
    __m256 v = _mm256_blendv_ps(nrm, sub, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag)));
    __m256i sgn = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24);
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sgn));
}
static inline TGT256 __m256 ll_kv_u8_bf16(const uint8_t *b, int h)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(b + 16 * h)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* dot / axpy over one row of n values (n % NB == 0) on each path */
#define LL_KV_KERNELS(F, NB, BB)                                                       \
    static float ll_kv_dot_##F##_scalar(const uint8_t *a, const float *b, size_t n)    \
    {                                                                                  \
        float acc[LL_LANES] = { 0 };                                                   \
        for (size_t k0 = 0; k0 < n; k0 += NB, a += BB) {                               \
            const float d = ll_kv_sc_##F(a);                                           \
            for (int j = 0; j < NB; j++)                                               \
                acc[j % LL_LANES] = fmaf(ll_kv_u_##F(a, j) * d, b[k0 + j],             \
                                         acc[j % LL_LANES]);                           \
        }                                                                              \
        return ll_tree16(acc);                                                         \
    }                                                                                  \
    static void ll_kv_axpy_##F##_scalar(float *y, float a, const uint8_t *x, size_t n) \
    {                                                                                  \
        for (size_t k0 = 0; k0 < n; k0 += NB, x += BB) {                               \
            const float d = ll_kv_sc_##F(x);                                           \
            for (int j = 0; j < NB; j++)                                               \
                y[k0 + j] = fmaf(a, ll_kv_u_##F(x, j) * d, y[k0 + j]);                 \
        }                                                                              \
    }                                                                                  \
    static TGT512 float ll_kv_dot_##F##_512(const uint8_t *a, const float *b, size_t n) \
    {                                                                                  \
        __m512 acc = _mm512_setzero_ps();                                              \
        for (size_t k0 = 0; k0 < n; k0 += NB, a += BB) {                               \
            const __m512 d = _mm512_set1_ps(ll_kv_sc_##F(a));                          \
            for (int h = 0; h < NB / 16; h++)                                          \
                acc = _mm512_fmadd_ps(_mm512_mul_ps(ll_kv_u16_##F(a, h), d),           \
                                      _mm512_loadu_ps(b + k0 + 16 * h), acc);          \
        }                                                                              \
        return ll_hsum512(acc);                                                        \
    }                                                                                  \
    static TGT512 void ll_kv_axpy_##F##_512(float *y, float a, const uint8_t *x, size_t n) \
    {                                                                                  \
        const __m512 av = _mm512_set1_ps(a);                                           \
        for (size_t k0 = 0; k0 < n; k0 += NB, x += BB) {                               \
            const __m512 d = _mm512_set1_ps(ll_kv_sc_##F(x));                          \
            for (int h = 0; h < NB / 16; h++)                                          \
                _mm512_storeu_ps(y + k0 + 16 * h,                                      \
                                 _mm512_fmadd_ps(av, _mm512_mul_ps(ll_kv_u16_##F(x, h), d), \
                                                 _mm512_loadu_ps(y + k0 + 16 * h)));   \
        }                                                                              \
    }                                                                                  \
    static TGT256 float ll_kv_dot_##F##_256(const uint8_t *a, const float *b, size_t n) \
    {                                                                                  \
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();                     \
        for (size_t k0 = 0; k0 < n; k0 += NB, a += BB) {                               \
            const __m256 d = _mm256_set1_ps(ll_kv_sc_##F(a));                          \
            for (int h = 0; h < NB / 16; h++) {                                        \
                lo = _mm256_fmadd_ps(_mm256_mul_ps(ll_kv_u8_##F(a, 2 * h), d),         \
                                     _mm256_loadu_ps(b + k0 + 16 * h), lo);            \
                hi = _mm256_fmadd_ps(_mm256_mul_ps(ll_kv_u8_##F(a, 2 * h + 1), d),     \
                                     _mm256_loadu_ps(b + k0 + 16 * h + 8), hi);        \
            }                                                                          \
        }                                                                              \
        return ll_tree8_256(_mm256_add_ps(lo, hi));                                    \
    }                                                                                  \
    static TGT256 void ll_kv_axpy_##F##_256(float *y, float a, const uint8_t *x, size_t n) \
    {                                                                                  \
        const __m256 av = _mm256_set1_ps(a);                                           \
        for (size_t k0 = 0; k0 < n; k0 += NB, x += BB) {                               \
            const __m256 d = _mm256_set1_ps(ll_kv_sc_##F(x));                          \
            for (int h = 0; h < NB / 8; h++)                                           \
                _mm256_storeu_ps(y + k0 + 8 * h,                                       \
                                 _mm256_fmadd_ps(av, _mm256_mul_ps(ll_kv_u8_##F(x, h), d), \
                                                 _mm256_loadu_ps(y + k0 + 8 * h)));    \
        }                                                                              \
    }                                                                                  \
    static float ll_kv_dot_##F(const uint8_t *a, const float *b, size_t n)             \
    {                                                                                  \
        int isa = ll_isa_get();                                                        \
        return isa == LL_ISA_AVX512 ? ll_kv_dot_##F##_512(a, b, n)                     \
             : isa == LL_ISA_AVX2 ? ll_kv_dot_##F##_256(a, b, n)                       \
             : ll_kv_dot_##F##_scalar(a, b, n);                                        \
    }                                                                                  \
    static void ll_kv_axpy_##F(float *y, float a, const uint8_t *x, size_t n)          \
    {                                                                                  \
        int isa = ll_isa_get();                                                        \
        if (isa == LL_ISA_AVX512)                                                      \
            ll_kv_axpy_##F##_512(y, a, x, n);                                          \
        else if (isa == LL_ISA_AVX2)                                                   \
            ll_kv_axpy_##F##_256(y, a, x, n);                                          \
        else                                                                           \
            ll_kv_axpy_##F##_scalar(y, a, x, n);                                       \
    }

LL_KV_KERNELS(q4_0, 32, 18)
LL_KV_KERNELS(fp8, 32, 33)
LL_KV_KERNELS(bf16, 16, 32)

/* q4_0 KV: llama.cpp's block_q4_0 (f16 d, 32 nibbles q, x = (q - 8) * d), but
 * not its quantize_row_q4_0_ref scale (d = max / -8, the largest value
 * exact): the block's scale is searched. Candidates: that reference, and 19
 * scales mapping the largest value to -8.9 .. -7.1, each refitted by least
 * squares (d = sum x l / sum l^2, rounded to f16) and re-rounded to it; the
 * candidate with the least squared error over the block wins (ties: the
 * earlier), so a block is never further from x than the reference's. The
 * format is unchanged (llama.cpp reads these blocks as its own); what it buys
 * is in docs/BENCHMARKS.md (KV cache dtypes against llama.cpp). Scalar only:
 * every path writes the same bytes. */
static float ll_q4_0_err(const float *x, float d, int8_t *l)
{
    float e = 0.0f;
    for (int j = 0; j < QK; j++) {
        float r = x[j] - (float)l[j] * d;
        e = fmaf(r, r, e);
    }
    return e;
}

static void ll_kv_q4_0_quantize(uint8_t *dst, const float *x, size_t n)
{
    for (size_t b = 0; b < n / QK; b++, x += QK, dst += 18) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++)
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        /* the reference: d = max / -8, q = x / d + 8.5 truncated, capped at 15 */
        const float d0 = max / -8.0f;
        const float id0 = d0 != 0.0f ? 1.0f / d0 : 0.0f;
        int8_t best[QK], l[QK];
        for (int j = 0; j < QK; j++) {
            int q = (int)(int8_t)(x[j] * id0 + 8.5f);
            best[j] = (int8_t)((q < 15 ? q : 15) - 8);
        }
        uint16_t best_dh = ggml_fp32_to_fp16(d0);
        float best_err = ll_q4_0_err(x, ll_f16_to_f32(best_dh), best);
        for (int is = -9; amax > 0.0f && is <= 9; is++) {
            const float idc = (-8.0f + 0.1f * (float)is) / max;
            float sxl = 0.0f, sll = 0.0f;
            for (int j = 0; j < QK; j++) {
                float q = nearbyintf(x[j] * idc);
                q = q < -8.0f ? -8.0f : q > 7.0f ? 7.0f : q;
                l[j] = (int8_t)q;
                sxl = fmaf(x[j], q, sxl);
                sll = fmaf(q, q, sll);
            }
            if (sll <= 0.0f)
                continue;
            const uint16_t dh = ggml_fp32_to_fp16(sxl / sll);
            const float d = ll_f16_to_f32(dh);
            if (!(d != 0.0f) || !isfinite(d))
                continue;
            for (int j = 0; j < QK; j++) { /* re-round to the stored scale */
                float q = nearbyintf(x[j] / d);
                l[j] = (int8_t)(q < -8.0f ? -8.0f : q > 7.0f ? 7.0f : q);
            }
            const float e = ll_q4_0_err(x, d, l);
            if (e < best_err) {
                best_err = e;
                best_dh = dh;
                memcpy(best, l, sizeof(best));
            }
        }
        memcpy(dst, &best_dh, 2);
        for (int j = 0; j < QK / 2; j++)
            dst[2 + j] = (uint8_t)((best[j] + 8) | ((best[QK / 2 + j] + 8) << 4));
    }
}

static void ll_kv_fp8_quantize(uint8_t *dst, const float *x, size_t n)
{
    for (size_t b = 0; b < n / QK; b++, x += QK, dst += 33) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        /* the smallest power of two e with amax / 2^e <= 448 */
        int e = 0;
        if (amax > 0.0f) {
            frexpf(amax / 448.0f, &e); /* amax/448 in [2^(e-1), 2^e) */
            if (ldexpf(448.0f, e) < amax) /* the division rounded down */
                e++;
            if (ldexpf(448.0f, e - 1) >= amax)
                e--;
        }
        e = e < -126 ? -126 : e > 127 ? 127 : e;
        dst[0] = (uint8_t)(e + 127);
        for (int j = 0; j < QK; j++)
            dst[1 + j] = ll_f32_to_e4m3(ldexpf(x[j], -e));
    }
}

static void ll_kv_bf16_quantize(uint8_t *dst, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        uint16_t h = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 64) /* NaN */
                                                     : (uint16_t)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
        memcpy(dst + 2 * i, &h, 2);
    }
}

void eng_ll_kv_quantize(eng_kv_dtype_t dt, uint8_t *dst, const float *x, size_t n)
{
    switch (dt) {
    case ENG_KV_F32:
        memcpy(dst, x, n * sizeof(float));
        break;
    case ENG_KV_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = ggml_fp32_to_fp16(x[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
        break;
    case ENG_KV_Q8_0: eng_ll_kv_q8_0_quantize(dst, x, n); break;
    case ENG_KV_Q4_0: ll_kv_q4_0_quantize(dst, x, n); break;
    case ENG_KV_BF16: ll_kv_bf16_quantize(dst, x, n); break;
    case ENG_KV_FP8_E4M3: ll_kv_fp8_quantize(dst, x, n); break;
    }
}

void eng_ll_kv_dequantize(eng_kv_dtype_t dt, float *out, const uint8_t *src, size_t n)
{
    switch (dt) {
    case ENG_KV_F32:
        memcpy(out, src, n * sizeof(float));
        break;
    case ENG_KV_F16:
        for (size_t i = 0; i < n; i++)
            out[i] = ll_f16_to_f32(ll_rd16(src + 2 * i));
        break;
    case ENG_KV_Q8_0: eng_ll_kv_q8_0_dequantize(out, src, n); break;
    case ENG_KV_Q4_0:
        for (size_t b = 0; b < n / QK; b++, src += 18)
            for (int j = 0; j < QK; j++)
                out[b * QK + j] = ll_kv_u_q4_0(src, j) * ll_kv_sc_q4_0(src);
        break;
    case ENG_KV_BF16:
        for (size_t i = 0; i < n; i++)
            out[i] = ll_bf16_to_f32(ll_rd16(src + 2 * i));
        break;
    case ENG_KV_FP8_E4M3:
        for (size_t b = 0; b < n / QK; b++, src += 33)
            for (int j = 0; j < QK; j++)
                out[b * QK + j] = ll_kv_u_fp8(src, j) * ll_kv_sc_fp8(src);
        break;
    }
}

float eng_ll_kv_dot(eng_kv_dtype_t dt, const uint8_t *a, const float *b, size_t n)
{
    switch (dt) {
    case ENG_KV_F32: return eng_ll_dot((const float *)(const void *)a, b, n);
    case ENG_KV_F16: return eng_ll_dot_f16((const uint16_t *)(const void *)a, b, n);
    case ENG_KV_Q8_0: return eng_ll_dot_q8_0(a, b, n);
    case ENG_KV_Q4_0: return ll_kv_dot_q4_0(a, b, n);
    case ENG_KV_BF16: return ll_kv_dot_bf16(a, b, n);
    case ENG_KV_FP8_E4M3: return ll_kv_dot_fp8(a, b, n);
    }
    return 0.0f;
}

void eng_ll_kv_dot_rows(eng_kv_dtype_t dt, const uint8_t *k, size_t stride, uint32_t cnt,
                        const float *q, size_t n, float *out)
{
    switch (dt) {
    case ENG_KV_F32:
        eng_ll_dot_rows((const float *)(const void *)k, stride / 4, cnt, q, n, out);
        return;
    case ENG_KV_F16:
        eng_ll_dot_rows_f16((const uint16_t *)(const void *)k, stride / 2, cnt, q, n, out);
        return;
    case ENG_KV_Q8_0:
        eng_ll_dot_rows_q8_0(k, stride, cnt, q, n, out);
        return;
    default:
        for (uint32_t j = 0; j < cnt; j++, k += stride)
            out[j] = eng_ll_kv_dot(dt, k, q, n);
    }
}

void eng_ll_kv_axpy_rows(eng_kv_dtype_t dt, float *y, const float *a, const uint8_t *v,
                         size_t stride, uint32_t cnt, size_t n)
{
    switch (dt) {
    case ENG_KV_F32:
        eng_ll_axpy_rows(y, a, (const float *)(const void *)v, stride / 4, cnt, n);
        return;
    case ENG_KV_F16:
        eng_ll_axpy_rows_f16(y, a, (const uint16_t *)(const void *)v, stride / 2, cnt, n);
        return;
    case ENG_KV_Q8_0:
        eng_ll_axpy_rows_q8_0(y, a, v, stride, cnt, n);
        return;
    case ENG_KV_Q4_0:
        for (uint32_t j = 0; j < cnt; j++, v += stride)
            ll_kv_axpy_q4_0(y, a[j], v, n);
        return;
    case ENG_KV_BF16:
        for (uint32_t j = 0; j < cnt; j++, v += stride)
            ll_kv_axpy_bf16(y, a[j], v, n);
        return;
    case ENG_KV_FP8_E4M3:
        for (uint32_t j = 0; j < cnt; j++, v += stride)
            ll_kv_axpy_fp8(y, a[j], v, n);
        return;
    }
}

void eng_ll_axpy_rows(float *y, const float *a, const float *v, size_t stride,
                      uint32_t cnt, size_t n)
{
    for (uint32_t j = 0; j < cnt; j++)
        eng_ll_axpy(y, a[j], v + j * stride, n);
}

/* ------------------------------------------------------------------ */
/* softmax helpers (ll_kern.h)                                          */

static TGT512 float ll_scale_max_512(float *x, size_t n, float scale)
{
    const __m512 sv = _mm512_set1_ps(scale);
    __m512 mv = _mm512_set1_ps(-INFINITY);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), sv);
        _mm512_storeu_ps(x + i, v);
        mv = _mm512_max_ps(v, mv); /* v > mv ? v : mv, per lane */
    }
    float l[16], mx = -INFINITY;
    _mm512_storeu_ps(l, mv);
    for (int k = 0; k < 16; k++)
        if (l[k] > mx)
            mx = l[k];
    for (; i < n; i++) {
        x[i] *= scale;
        if (x[i] > mx)
            mx = x[i];
    }
    return mx;
}

static TGT256 float ll_scale_max_256(float *x, size_t n, float scale)
{
    const __m256 sv = _mm256_set1_ps(scale);
    __m256 mv = _mm256_set1_ps(-INFINITY);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sv);
        _mm256_storeu_ps(x + i, v);
        mv = _mm256_max_ps(v, mv);
    }
    float l[8], mx = -INFINITY;
    _mm256_storeu_ps(l, mv);
    for (int k = 0; k < 8; k++)
        if (l[k] > mx)
            mx = l[k];
    for (; i < n; i++) {
        x[i] *= scale;
        if (x[i] > mx)
            mx = x[i];
    }
    return mx;
}

float eng_ll_scale_max(float *x, size_t n, float scale)
{
    int isa = ll_isa_get();
    if (isa == LL_ISA_AVX512)
        return ll_scale_max_512(x, n, scale);
    if (isa == LL_ISA_AVX2)
        return ll_scale_max_256(x, n, scale);
    float mx = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        x[i] *= scale;
        if (x[i] > mx)
            mx = x[i];
    }
    return mx;
}

static TGT512 void ll_scale_512(float *x, size_t n, float s)
{
    const __m512 sv = _mm512_set1_ps(s);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), sv));
    for (; i < n; i++)
        x[i] *= s;
}

void eng_ll_scale(float *x, size_t n, float s)
{
    if (ll_isa_get() == LL_ISA_AVX512) {
        ll_scale_512(x, n, s);
        return;
    }
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

/* ------------------------------------------------------------------ */
/* the engine's exp (ll_kern.h eng_ll_exp_sum, eng_ll_silu_mul)         */
/* exp(x) = 2^n * e^r: n = x / ln2 rounded to nearest even by the 1.5 *
 * 2^23 shift (one fma: the product is not rounded first), r = x - n ln2
 * in two fma steps (ln2 split hi + lo, hi with 16 trailing zero bits),
 * e^r by its Taylor series to r^7 in Horner form (|r| <= ln2 / 2: the
 * truncation is below 6e-9 relative), 2^n built in the exponent field
 * from the shifted value's low bits (no float -> int conversion, so a NaN
 * input cannot be undefined behaviour). x is clamped to [-87, 88] first
 * so 2^n stays a normal float (e^-87 ~ 1.6e-38 stands for anything
 * smaller: nothing in a softmax or a SiLU can tell). Max error ~1 ulp
 * against exp in double (test_exp in tests/engine/llama). The scalar,
 * AVX2 and AVX-512 forms are the same operations in the same order
 * (fmaf is exact wherever it runs), so every path gives the same bits,
 * which libm's expf (a call per element, and ifunc variants per CPU)
 * could not promise. */
#define LL_EXP_LO (-87.0f)
#define LL_EXP_HI 88.0f
#define LL_EXP_SHIFT 12582912.0f                  /* 1.5 * 2^23 */
#define LL_EXP_SHIFT_BITS 0x4B400000u
#define LL_LOG2E 1.44269504088896341f
#define LL_LN2_HI 0.693145751953125f            /* 0x3F317200 */
#define LL_LN2_LO 1.42860676533018e-06f
#define LL_EXP_C7 (1.0f / 5040.0f)
#define LL_EXP_C6 (1.0f / 720.0f)
#define LL_EXP_C5 (1.0f / 120.0f)
#define LL_EXP_C4 (1.0f / 24.0f)
#define LL_EXP_C3 (1.0f / 6.0f)
#define LL_EXP_C2 0.5f

static inline float ll_exp_scalar(float x)
{
    x = LL_EXP_LO > x ? LL_EXP_LO : x; /* maxps(lo, x): a NaN stays NaN */
    x = LL_EXP_HI < x ? LL_EXP_HI : x; /* minps(hi, x) */
    float t = fmaf(x, LL_LOG2E, LL_EXP_SHIFT);
    float n = t - LL_EXP_SHIFT;
    float r = fmaf(n, -LL_LN2_HI, x);
    r = fmaf(n, -LL_LN2_LO, r);
    float p = fmaf(LL_EXP_C7, r, LL_EXP_C6);
    p = fmaf(p, r, LL_EXP_C5);
    p = fmaf(p, r, LL_EXP_C4);
    p = fmaf(p, r, LL_EXP_C3);
    p = fmaf(p, r, LL_EXP_C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    uint32_t tb, sb;
    memcpy(&tb, &t, 4);
    sb = (tb - LL_EXP_SHIFT_BITS + 127u) << 23;
    float s;
    memcpy(&s, &sb, 4);
    return p * s;
}

static inline TGT512 __m512 ll_exp512(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(LL_EXP_LO), x);
    x = _mm512_min_ps(_mm512_set1_ps(LL_EXP_HI), x);
    __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(LL_LOG2E), _mm512_set1_ps(LL_EXP_SHIFT));
    __m512 n = _mm512_sub_ps(t, _mm512_set1_ps(LL_EXP_SHIFT));
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LL_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LL_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(LL_EXP_C7), r, _mm512_set1_ps(LL_EXP_C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(LL_EXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(LL_EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(LL_EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(LL_EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i sb = _mm512_sub_epi32(_mm512_castps_si512(t),
                                  _mm512_set1_epi32((int)(LL_EXP_SHIFT_BITS - 127u)));
    return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(sb, 23)));
}

static inline TGT256 __m256 ll_exp256(__m256 x)
{
    x = _mm256_max_ps(_mm256_set1_ps(LL_EXP_LO), x);
    x = _mm256_min_ps(_mm256_set1_ps(LL_EXP_HI), x);
    __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(LL_LOG2E), _mm256_set1_ps(LL_EXP_SHIFT));
    __m256 n = _mm256_sub_ps(t, _mm256_set1_ps(LL_EXP_SHIFT));
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LL_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LL_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(LL_EXP_C7), r, _mm256_set1_ps(LL_EXP_C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LL_EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LL_EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LL_EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LL_EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i sb = _mm256_sub_epi32(_mm256_castps_si256(t),
                                  _mm256_set1_epi32((int)(LL_EXP_SHIFT_BITS - 127u)));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(sb, 23)));
}

float eng_ll_exp(float x)
{
    return ll_exp_scalar(x);
}

/* x[i] = exp(x[i] - mx); the sum in the canonical 16 lanes (element i
 * into lane i % 16, each lane in order, then ll_tree16). The SIMD forms
 * run the full 16-element groups in registers and the tail as the
 * scalar form, into the same lanes. */
static TGT512 void ll_exp_sum_512(float *x, size_t n, float mx, float l[LL_LANES])
{
    const __m512 mv = _mm512_set1_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    for (size_t i = 0; i + 16 <= n; i += 16) {
        __m512 e = ll_exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
        _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    _mm512_storeu_ps(l, acc);
}

static TGT256 void ll_exp_sum_256(float *x, size_t n, float mx, float l[LL_LANES])
{
    const __m256 mv = _mm256_set1_ps(mx);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (size_t i = 0; i + 16 <= n; i += 16) {
        __m256 e0 = ll_exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        __m256 e1 = ll_exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), mv));
        _mm256_storeu_ps(x + i, e0);
        _mm256_storeu_ps(x + i + 8, e1);
        a0 = _mm256_add_ps(a0, e0);
        a1 = _mm256_add_ps(a1, e1);
    }
    _mm256_storeu_ps(l, a0);
    _mm256_storeu_ps(l + 8, a1);
}

float eng_ll_exp_sum(float *x, size_t n, float mx)
{
    float l[LL_LANES] = { 0 };
    size_t i = 0;
    int isa = ll_isa_get();
    if (isa == LL_ISA_AVX512)
        ll_exp_sum_512(x, n, mx, l), i = n / 16 * 16;
    else if (isa == LL_ISA_AVX2)
        ll_exp_sum_256(x, n, mx, l), i = n / 16 * 16;
    for (; i < n; i++) {
        x[i] = ll_exp_scalar(x[i] - mx);
        l[i % LL_LANES] += x[i];
    }
    return ll_tree16(l);
}

/* g[i] = g[i] / (1 + exp(-g[i])) * u[i] (SiLU(gate) * up), elementwise. */
static TGT512 size_t ll_silu_mul_512(float *g, const float *u, size_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 e = ll_exp512(_mm512_sub_ps(zero, x));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)),
                                              _mm512_loadu_ps(u + i)));
    }
    return i;
}

static TGT256 size_t ll_silu_mul_256(float *g, const float *u, size_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 e = ll_exp256(_mm256_sub_ps(zero, x));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)),
                                              _mm256_loadu_ps(u + i)));
    }
    return i;
}

void eng_ll_silu_mul(float *g, const float *u, size_t n)
{
    size_t i = 0;
    int isa = ll_isa_get();
    if (isa == LL_ISA_AVX512)
        i = ll_silu_mul_512(g, u, n);
    else if (isa == LL_ISA_AVX2)
        i = ll_silu_mul_256(g, u, n);
    for (; i < n; i++)
        g[i] = g[i] / (1.0f + ll_exp_scalar(0.0f - g[i])) * u[i];
}

/* ------------------------------------------------------------------ */
/* query-blocked attention (ll_kern.h)                                  */
/* A run of K (V) rows is widened to f32 once, in sub-runs of at most
 * LL_MQ_FLOATS values on the stack, each element the same IEEE product
 * u * scale the single-row kernels form (f16 / bf16 / f32: exact), then
 * the canonical f32 dot (ll_mk512 / ll_mk256 / ll_dot_scalar) runs per
 * (row, query) and the axpy keeps each query's fma chain in row order:
 * per query the bits of eng_ll_kv_dot_rows / eng_ll_kv_axpy_rows. */

#define LL_MQ_FLOATS 4096

#define LL_KV_WIDEN512(F, NB, BB)                                                   \
    for (size_t k0 = 0; k0 < n; k0 += NB, a += BB) {                                \
        const __m512 d = _mm512_set1_ps(ll_kv_sc_##F(a));                           \
        for (int h = 0; h < NB / 16; h++)                                           \
            _mm512_storeu_ps(o + k0 + 16 * h, _mm512_mul_ps(ll_kv_u16_##F(a, h), d)); \
    }
#define LL_KV_WIDEN256(F, NB, BB)                                                   \
    for (size_t k0 = 0; k0 < n; k0 += NB, a += BB) {                                \
        const __m256 d = _mm256_set1_ps(ll_kv_sc_##F(a));                           \
        for (int h = 0; h < NB / 8; h++)                                            \
            _mm256_storeu_ps(o + k0 + 8 * h, _mm256_mul_ps(ll_kv_u8_##F(a, h), d)); \
    }

/* rows src + j * stride (j < cnt) of n values (n % 16 == 0) to out + j * n */
static TGT512 void ll_kv_widen_512(eng_kv_dtype_t dt, const uint8_t *src, size_t stride,
                                   uint32_t cnt, size_t n, float *out)
{
    for (uint32_t j = 0; j < cnt; j++, src += stride) {
        const uint8_t *a = src;
        float *o = out + (size_t)j * n;
        switch (dt) {
        case ENG_KV_F32:
            memcpy(o, a, n * sizeof(float));
            break;
        case ENG_KV_F16:
            for (size_t k = 0; k < n; k += 16)
                _mm512_storeu_ps(o + k, _mm512_cvtph_ps(
                    _mm256_loadu_si256((const __m256i *)(const void *)(a + 2 * k))));
            break;
        case ENG_KV_Q8_0:
            for (size_t k0 = 0; k0 < n; k0 += QK, a += LL_KVQ_BYTES) {
                const __m512 d = _mm512_set1_ps(ll_f16_to_f32(ll_rd16(a)));
                _mm512_storeu_ps(o + k0, ll_q8x16_512(a + 2, d));
                _mm512_storeu_ps(o + k0 + 16, ll_q8x16_512(a + 18, d));
            }
            break;
        case ENG_KV_Q4_0: LL_KV_WIDEN512(q4_0, 32, 18) break;
        case ENG_KV_BF16: LL_KV_WIDEN512(bf16, 16, 32) break;
        case ENG_KV_FP8_E4M3: LL_KV_WIDEN512(fp8, 32, 33) break;
        }
    }
}

static TGT256 void ll_kv_widen_256(eng_kv_dtype_t dt, const uint8_t *src, size_t stride,
                                   uint32_t cnt, size_t n, float *out)
{
    for (uint32_t j = 0; j < cnt; j++, src += stride) {
        const uint8_t *a = src;
        float *o = out + (size_t)j * n;
        switch (dt) {
        case ENG_KV_F32:
            memcpy(o, a, n * sizeof(float));
            break;
        case ENG_KV_F16:
            for (size_t k = 0; k < n; k += 8)
                _mm256_storeu_ps(o + k, _mm256_cvtph_ps(
                    _mm_loadu_si128((const __m128i *)(const void *)(a + 2 * k))));
            break;
        case ENG_KV_Q8_0:
            for (size_t k0 = 0; k0 < n; k0 += QK, a += LL_KVQ_BYTES) {
                const __m256 d = _mm256_set1_ps(ll_f16_to_f32(ll_rd16(a)));
                for (int h = 0; h < 4; h++)
                    _mm256_storeu_ps(o + k0 + 8 * h, ll_q8x8_256(a + 2 + 8 * h, d));
            }
            break;
        case ENG_KV_Q4_0: LL_KV_WIDEN256(q4_0, 32, 18) break;
        case ENG_KV_BF16: LL_KV_WIDEN256(bf16, 16, 32) break;
        case ENG_KV_FP8_E4M3: LL_KV_WIDEN256(fp8, 32, 33) break;
        }
    }
}

/* the isa for a run of rows of n values: the vector paths need n % 16 == 0 */
static void ll_kv_widen(int isa, eng_kv_dtype_t dt, const uint8_t *src, size_t stride,
                        uint32_t cnt, size_t n, float *out)
{
    if (isa == LL_ISA_AVX512)
        ll_kv_widen_512(dt, src, stride, cnt, n, out);
    else if (isa == LL_ISA_AVX2)
        ll_kv_widen_256(dt, src, stride, cnt, n, out);
    else
        for (uint32_t j = 0; j < cnt; j++, src += stride)
            eng_ll_kv_dequantize(dt, out + (size_t)j * n, src, n);
}

/* R rows x up to 4 queries per call: the canonical dot (ll_mk512's) */
static TGT512 void ll_dot_multi_512(const float *w, size_t ws, uint32_t rows, const float *q,
                                    size_t qs, uint32_t nq, size_t n, float *out, size_t os)
{
    uint32_t r = 0;
    for (; r + 4 <= rows; r += 4)
        for (uint32_t i = 0; i < nq; i += 4)
            ll_mk512_tab[1][nq - i < 4 ? nq - i : 4](w + r * ws, ws, q + i * qs, qs, n,
                                                      out + i * os + r, os);
    for (; r < rows; r++)
        for (uint32_t i = 0; i < nq; i += 4)
            ll_mk512_tab[0][nq - i < 4 ? nq - i : 4](w + r * ws, ws, q + i * qs, qs, n,
                                                      out + i * os + r, os);
}

static TGT256 void ll_dot_multi_256(const float *w, size_t ws, uint32_t rows, const float *q,
                                    size_t qs, uint32_t nq, size_t n, float *out, size_t os)
{
    uint32_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        uint32_t i = 0;
        for (; i + 2 <= nq; i += 2)
            ll_mk256_2x2(w + r * ws, ws, q + i * qs, qs, n, out + i * os + r, os);
        if (i < nq)
            ll_mk256_2x1(w + r * ws, ws, q + i * qs, qs, n, out + i * os + r, os);
    }
    for (; r < rows; r++) {
        uint32_t i = 0;
        for (; i + 2 <= nq; i += 2)
            ll_mk256_1x2(w + r * ws, ws, q + i * qs, qs, n, out + i * os + r, os);
        if (i < nq)
            ll_mk256_1x1(w + r * ws, ws, q + i * qs, qs, n, out + i * os + r, os);
    }
}

void eng_ll_kv_dot_rows_multi(eng_kv_dtype_t dt, const uint8_t *k, size_t stride, uint32_t cnt,
                              const float *q, size_t qs, uint32_t nq, size_t n, float *out,
                              size_t os)
{
    if (n == 0 || n > LL_MQ_FLOATS) { /* not an attention head: the row kernels */
        for (uint32_t i = 0; i < nq; i++)
            eng_ll_kv_dot_rows(dt, k, stride, cnt, q + i * qs, n, out + i * os);
        return;
    }
    int isa = n % 16 ? LL_ISA_SCALAR : ll_isa_get();
    float w[LL_MQ_FLOATS] __attribute__((aligned(64)));
    const uint32_t rmax = (uint32_t)(LL_MQ_FLOATS / n);
    for (uint32_t j0 = 0; j0 < cnt; j0 += rmax) {
        const uint32_t rows = cnt - j0 < rmax ? cnt - j0 : rmax;
        const uint8_t *src = k + (size_t)j0 * stride;
        const float *wp = w;
        size_t ws = n;
        if (dt == ENG_KV_F32 && stride % sizeof(float) == 0) { /* in place */
            wp = (const float *)(const void *)src;
            ws = stride / sizeof(float);
        } else {
            ll_kv_widen(isa, dt, src, stride, rows, n, w);
        }
        if (isa == LL_ISA_AVX512)
            ll_dot_multi_512(wp, ws, rows, q, qs, nq, n, out + j0, os);
        else if (isa == LL_ISA_AVX2)
            ll_dot_multi_256(wp, ws, rows, q, qs, nq, n, out + j0, os);
        else
            for (uint32_t i = 0; i < nq; i++)
                for (uint32_t r = 0; r < rows; r++)
                    out[i * os + j0 + r] = ll_dot_scalar(wp + r * ws, q + i * qs, n);
    }
}

/* NQ queries x NC 16-lane column chunks from c0, every row j in order */
static inline __attribute__((always_inline)) TGT512 void
ll_ax512(const float *w, size_t ws, uint32_t rows, const float *a, size_t as, float *y,
         size_t ys, size_t c0, const int NQ, const int NC)
{
    __m512 acc[4][2];
#pragma GCC unroll 4
    for (int i = 0; i < NQ; i++)
#pragma GCC unroll 2
        for (int c = 0; c < NC; c++)
            acc[i][c] = _mm512_loadu_ps(y + i * ys + c0 + 16 * c);
    for (uint32_t j = 0; j < rows; j++) {
        __m512 wv[2];
#pragma GCC unroll 2
        for (int c = 0; c < NC; c++)
            wv[c] = _mm512_loadu_ps(w + j * ws + c0 + 16 * c);
#pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) {
            const __m512 av = _mm512_set1_ps(a[i * as + j]);
#pragma GCC unroll 2
            for (int c = 0; c < NC; c++)
                acc[i][c] = _mm512_fmadd_ps(av, wv[c], acc[i][c]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NQ; i++)
#pragma GCC unroll 2
        for (int c = 0; c < NC; c++)
            _mm512_storeu_ps(y + i * ys + c0 + 16 * c, acc[i][c]);
}

#define LL_AX512_FN(NQ, NC)                                                     \
    static TGT512 void ll_ax512_##NQ##x##NC(const float *w, size_t ws, uint32_t rows, \
        const float *a, size_t as, float *y, size_t ys, size_t c0)              \
    {                                                                           \
        ll_ax512(w, ws, rows, a, as, y, ys, c0, NQ, NC);                        \
    }
LL_AX512_FN(1, 1) LL_AX512_FN(2, 1) LL_AX512_FN(3, 1) LL_AX512_FN(4, 1)
LL_AX512_FN(1, 2) LL_AX512_FN(2, 2) LL_AX512_FN(3, 2) LL_AX512_FN(4, 2)

typedef void (*ll_ax_fn)(const float *, size_t, uint32_t, const float *, size_t, float *,
                         size_t, size_t);
static const ll_ax_fn ll_ax512_tab[2][5] = {
    { NULL, ll_ax512_1x1, ll_ax512_2x1, ll_ax512_3x1, ll_ax512_4x1 },
    { NULL, ll_ax512_1x2, ll_ax512_2x2, ll_ax512_3x2, ll_ax512_4x2 },
};

static inline __attribute__((always_inline)) TGT256 void
ll_ax256(const float *w, size_t ws, uint32_t rows, const float *a, size_t as, float *y,
         size_t ys, size_t c0, const int NQ, const int NC)
{
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int i = 0; i < NQ; i++)
#pragma GCC unroll 2
        for (int c = 0; c < NC; c++)
            acc[i][c] = _mm256_loadu_ps(y + i * ys + c0 + 8 * c);
    for (uint32_t j = 0; j < rows; j++) {
        __m256 wv[2];
#pragma GCC unroll 2
        for (int c = 0; c < NC; c++)
            wv[c] = _mm256_loadu_ps(w + j * ws + c0 + 8 * c);
#pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) {
            const __m256 av = _mm256_set1_ps(a[i * as + j]);
#pragma GCC unroll 2
            for (int c = 0; c < NC; c++)
                acc[i][c] = _mm256_fmadd_ps(av, wv[c], acc[i][c]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NQ; i++)
#pragma GCC unroll 2
        for (int c = 0; c < NC; c++)
            _mm256_storeu_ps(y + i * ys + c0 + 8 * c, acc[i][c]);
}

#define LL_AX256_FN(NQ)                                                         \
    static TGT256 void ll_ax256_##NQ(const float *w, size_t ws, uint32_t rows,  \
        const float *a, size_t as, float *y, size_t ys, size_t c0)              \
    {                                                                           \
        ll_ax256(w, ws, rows, a, as, y, ys, c0, NQ, 2);                         \
    }
LL_AX256_FN(1) LL_AX256_FN(2) LL_AX256_FN(3) LL_AX256_FN(4)
static const ll_ax_fn ll_ax256_tab[5] = { NULL, ll_ax256_1, ll_ax256_2, ll_ax256_3, ll_ax256_4 };

void eng_ll_kv_axpy_rows_multi(eng_kv_dtype_t dt, float *y, size_t ys, const float *a, size_t as,
                               uint32_t nq, const uint8_t *v, size_t stride, uint32_t cnt,
                               size_t n)
{
    if (n == 0 || n > LL_MQ_FLOATS) {
        for (uint32_t i = 0; i < nq; i++)
            eng_ll_kv_axpy_rows(dt, y + i * ys, a + i * as, v, stride, cnt, n);
        return;
    }
    int isa = n % 16 ? LL_ISA_SCALAR : ll_isa_get();
    float w[LL_MQ_FLOATS] __attribute__((aligned(64)));
    const uint32_t rmax = (uint32_t)(LL_MQ_FLOATS / n);
    for (uint32_t j0 = 0; j0 < cnt; j0 += rmax) {
        const uint32_t rows = cnt - j0 < rmax ? cnt - j0 : rmax;
        const uint8_t *src = v + (size_t)j0 * stride;
        const float *wp = w;
        size_t ws = n;
        if (dt == ENG_KV_F32 && stride % sizeof(float) == 0) {
            wp = (const float *)(const void *)src;
            ws = stride / sizeof(float);
        } else {
            ll_kv_widen(isa, dt, src, stride, rows, n, w);
        }
        for (uint32_t i = 0; i < nq; i += 4) {
            const uint32_t qn = nq - i < 4 ? nq - i : 4;
            float *yi = y + i * ys;
            const float *ai = a + i * as + j0;
            if (isa == LL_ISA_AVX512) {
                size_t c0 = 0;
                for (; c0 + 32 <= n; c0 += 32)
                    ll_ax512_tab[1][qn](wp, ws, rows, ai, as, yi, ys, c0);
                if (c0 < n)
                    ll_ax512_tab[0][qn](wp, ws, rows, ai, as, yi, ys, c0);
            } else if (isa == LL_ISA_AVX2) {
                for (size_t c0 = 0; c0 < n; c0 += 16)
                    ll_ax256_tab[qn](wp, ws, rows, ai, as, yi, ys, c0);
            } else {
                for (uint32_t ii = 0; ii < qn; ii++)
                    for (uint32_t r = 0; r < rows; r++) {
                        const float ar = ai[ii * as + r], *wr = wp + r * ws;
                        float *yr = yi + ii * ys;
                        for (size_t kk = 0; kk < n; kk++)
                            yr[kk] = fmaf(ar, wr[kk], yr[kk]);
                    }
            }
        }
    }
}

/* ------------------------------------------------------------------ */
/* matmul                                                              */

int eng_ll_nofuse_g; /* experiments only: force the scratch path */
int eng_ll_pf_g = 512;   /* software prefetch distance (bytes) on the fused path */
int eng_ll_r8_g = 1;     /* experiments only: 0 = no 8-row tiles */
uint32_t eng_ll_fuse_max_g = 8; /* largest batch on the fused path */

int eng_ll_qdot_g = -1;

/* The integer-dot path for the current ISA (capped like the f32 kernels,
 * so ENG_LL_ISA / eng_ll_isa_force exercise every path), -1 when off. */
static int ll_qdot_path(void)
{
    if (eng_ll_qdot_g < 0) {
        const char *e = getenv("PD_QDOT");
        eng_ll_qdot_g = !(e && strcmp(e, "off") == 0);
    }
    if (!eng_ll_qdot_g)
        return -1;
    int p = ggml_qdot_path();
    int isa = ll_isa_get();
    int cap = isa == LL_ISA_AVX512 ? GGML_QDOT_AMX : isa == LL_ISA_AVX2 ? GGML_QDOT_AVX2
                                                                         : GGML_QDOT_SCALAR;
    return p < cap ? p : cap;
}

uint32_t eng_ll_amx_min_g = 16;

void eng_ll_qdot_describe(char *buf, size_t len)
{
    const int p = ll_qdot_path();
    if (p < 0) {
        snprintf(buf, len, "qdot path: off (PD_QDOT=off: the exact f32 path)");
        return;
    }
    if (p == GGML_QDOT_AMX) {
        snprintf(buf, len,
                 "qdot path: amx (tiles from %u items: Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL Q4_K Q5_K; "
                 "the other types vnni)", eng_ll_amx_min_g);
        return;
    }
    const char *why = ggml_qdot_amx_why();
    if (!why)
        why = ggml_qdot_path() < GGML_QDOT_AMX ? "PD_QDOT caps the path" : "ENG_LL_ISA caps the path";
    snprintf(buf, len, "qdot path: %s (amx: %s)", ggml_qdot_path_name(p), why);
}

pd_status_t eng_ll_pack(eng_ll_tensor_t *t, void **buf_p)
{
    *buf_p = NULL;
    size_t bytes = ggml_qdot_pack_bytes(t->type, t->rows, t->cols);
    if (bytes == 0 || ll_qdot_path() < GGML_QDOT_VNNI) /* AMX reads the VNNI layout */
        return PD_OK;
    void *buf = NULL;
    if (posix_memalign(&buf, 64, bytes) != 0)
        return PD_ERR_NO_MEMORY;
    pd_status_t st = ggml_qdot_pack(t->type, t->data, t->row_bytes, t->rows, t->cols, buf);
    if (st != PD_OK) {
        free(buf);
        return st;
    }
    t->pk = buf;
    *buf_p = buf;
    return PD_OK;
}

eng_ll_tensor_t eng_ll_rows_view(const eng_ll_tensor_t *t, uint32_t r0, uint32_t rows)
{
    eng_ll_tensor_t v = *t;
    v.data = t->data + (size_t)r0 * t->row_bytes;
    v.rows = rows;
    v.pk = t->pk && r0 % 16 == 0 ? t->pk + ggml_qdot_pack_bytes(t->type, r0, t->cols) : NULL;
    return v;
}

size_t eng_ll_qx_bytes(uint32_t n_items, uint32_t cols)
{
    /* both formats for any row length <= cols (whole blocks of it: the
     * byte counts only grow with the length, so a shorter matrix fits) */
    uint32_t c8 = cols / GGML_Q8A_BLOCK * GGML_Q8A_BLOCK;
    uint32_t ck = cols / GGML_Q8K_BLOCK * GGML_Q8K_BLOCK;
    return (ggml_qdot_act_bytes(GGML_QACT_Q8A, c8) + ggml_qdot_act_bytes(GGML_QACT_Q8K, ck)) *
           n_items;
}

int eng_ll_qdot_check_g;
_Atomic uint64_t eng_ll_qdot_check_bad;

/* Tests only: every integer-dot output against the f64 dot of the
 * dequantized weight row with the dequantized activations it was given. */
static void ll_qdot_check(const eng_ll_tensor_t *w, uint32_t r0, uint32_t r1, const uint8_t *qa,
                          size_t qa_stride, uint32_t n_items, const float *out, uint32_t os,
                          float *scratch)
{
    const size_t K = w->cols;
    const int act = ggml_qdot_act(w->type);
    for (uint32_t r = r0; r < r1; r++) {
        if (ggml_dequantize_row(w->type, w->data + (size_t)r * w->row_bytes, scratch, K) != PD_OK)
            continue;
        for (uint32_t i = 0; i < n_items; i++) {
            const uint8_t *a = qa + i * qa_stride;
            double ref = 0.0, mag = 0.0;
            for (size_t e = 0; e < K; e++) {
                double av = (double)ggml_qdot_act_q(act, a, K, e) * ggml_qdot_act_scale(act, a, K, e);
                ref += scratch[e] * av;
                mag += fabs(scratch[e] * av);
            }
            if (fabs(out[(size_t)i * os + r] - ref) > 1e-5 * mag + 1e-30)
                atomic_fetch_add(&eng_ll_qdot_check_bad, 1);
        }
    }
}

/* Rows [r0, r1) of w for all items. scratch holds 4 dequantized rows. qa:
 * the items' activations quantized for w's integer dot (NULL: f32 path). */
static void ll_matmul_rows(const eng_ll_tensor_t *w, uint32_t r0, uint32_t r1,
                           const float *x, uint32_t xs, uint32_t n_items,
                           float *out, uint32_t os, float *scratch /* (4, cols) */,
                           const uint8_t *qa, size_t qa_stride, int qpath)
{
    const size_t K = w->cols;
    if (qa) {
        (void)ggml_qdot_rows_packed(qpath, w->type, w->data, w->row_bytes, w->pk, r0, r1, K, qa,
                                    qa_stride, n_items, out + r0, os);
        if (eng_ll_qdot_check_g)
            ll_qdot_check(w, r0, r1, qa, qa_stride, n_items, out, os, scratch);
        return;
    }
    int isa = ll_isa_get();
    if (K % 16 != 0)
        isa = LL_ISA_SCALAR; /* shape-determined, hence still deterministic */
    const uint32_t rt_max = isa == LL_ISA_AVX512 ? 4 : isa == LL_ISA_AVX2 ? 2 : 1;
    const uint32_t it_max = isa == LL_ISA_AVX512 ? 4 : isa == LL_ISA_AVX2 ? 2 : 1;

    if (!eng_ll_nofuse_g && isa == LL_ISA_AVX512 && n_items <= eng_ll_fuse_max_g &&
        ll_mkf_tab(w->type)) {
        const ll_mkf_fn (*tab)[5] = ll_mkf_tab(w->type);
        ll_mkf_fn f8 = n_items <= 2 && eng_ll_r8_g ? ll_mkf8_fn(w->type, n_items) : NULL;
        for (uint32_t r = r0; r < r1;) {
            if (f8 && r1 - r >= 8) {
                f8(w->data + (size_t)r * w->row_bytes, w->row_bytes, x, xs, K, out + r, os);
                r += 8;
                continue;
            }
            uint32_t rt = r1 - r >= 4 ? 4 : 1;
            for (uint32_t i = 0; i < n_items; i += 4) {
                uint32_t it = n_items - i < 4 ? n_items - i : 4;
                tab[rt == 4][it](w->data + (size_t)r * w->row_bytes, w->row_bytes,
                                 x + (size_t)i * xs, xs, K, out + (size_t)i * os + r, os);
            }
            r += rt;
        }
        return;
    }
    for (uint32_t r = r0; r < r1;) {
        uint32_t rt = r1 - r >= rt_max ? rt_max : 1;
        const float *wrows;
        size_t ws;
        if (w->type == ENG_LL_T_F32) {
            wrows = (const float *)(const void *)(w->data + (size_t)r * w->row_bytes);
            ws = K;
        } else {
            for (uint32_t j = 0; j < rt; j++)
                eng_ll_dequant_row(w, r + j, scratch + j * K);
            wrows = scratch;
            ws = K;
        }
        for (uint32_t i = 0; i < n_items;) {
            uint32_t it = n_items - i >= it_max ? it_max : n_items - i;
            float *o = out + (size_t)i * os + r;
            const float *xi = x + (size_t)i * xs;
            if (isa == LL_ISA_AVX512) {
                ll_mk512_tab[rt == 4][it](wrows, ws, xi, xs, K, o, os);
            } else if (isa == LL_ISA_AVX2) {
                if (rt == 2)
                    (it == 2 ? ll_mk256_2x2 : ll_mk256_2x1)(wrows, ws, xi, xs, K, o, os);
                else
                    (it == 2 ? ll_mk256_1x2 : ll_mk256_1x1)(wrows, ws, xi, xs, K, o, os);
            } else {
                o[0] = ll_dot_scalar(wrows, xi, K);
            }
            i += it;
        }
        r += rt;
    }
}

typedef struct {
    const eng_ll_matmul_t *mm;
    float *const *scratch;
    uint64_t total;              /* rows over all matrices */
    uint32_t chunk_rows;         /* multiple of 16 */
    int qpath;                   /* integer-dot path, -1 = off */
    uint8_t *qa[3];              /* per activation format (GGML_QACT_*) */
    size_t qa_stride[3];
} ll_matmul_ctx_t;

/* Quantize item `chunk`'s activation row into every format in use. */
static void ll_quant_task(void *arg, uint32_t chunk, uint32_t tid)
{
    (void)tid;
    const ll_matmul_ctx_t *ctx = arg;
    const eng_ll_matmul_t *mm = ctx->mm;
    for (int f = GGML_QACT_Q8A; f <= GGML_QACT_Q8K; f++)
        if (ctx->qa[f])
            ggml_qdot_quantize(f, mm->x + (size_t)chunk * mm->x_stride, mm->w[0]->cols,
                               ctx->qa[f] + chunk * ctx->qa_stride[f]);
}

static void ll_matmul_task(void *arg, uint32_t chunk, uint32_t tid)
{
    const ll_matmul_ctx_t *ctx = arg;
    const eng_ll_matmul_t *mm = ctx->mm;
    uint64_t g0 = (uint64_t)chunk * ctx->chunk_rows;
    uint64_t g1 = g0 + ctx->chunk_rows < ctx->total ? g0 + ctx->chunk_rows : ctx->total;
    uint64_t base = 0;
    for (uint32_t m = 0; m < mm->n_mats && g0 < g1; m++) {
        uint64_t rows = mm->w[m]->rows;
        if (g0 < base + rows) {
            uint32_t lr0 = (uint32_t)(g0 - base);
            uint32_t lr1 = (uint32_t)((g1 < base + rows ? g1 : base + rows) - base);
            int f = ctx->qpath >= 0 ? ggml_qdot_act(mm->w[m]->type) : GGML_QACT_NONE;
            ll_matmul_rows(mm->w[m], lr0, lr1, mm->x, mm->x_stride, mm->n_items,
                           mm->out[m], mm->out_stride[m], ctx->scratch[tid], ctx->qa[f],
                           ctx->qa_stride[f], ctx->qpath);
            g0 = base + lr1;
        }
        base += rows;
    }
}

void eng_ll_matmul(eng_ll_pool_t *pool, const eng_ll_matmul_t *mm,
                   float *const *scratch)
{
    ll_matmul_ctx_t ctx = { mm, scratch, 0, 0, -1, { NULL }, { 0 } };
    /* integer-dot types: quantize each item's row once for all matrices
     * (they share x, hence cols) in the formats they need */
    ctx.qpath = mm->qx ? ll_qdot_path() : -1;
    if (ctx.qpath == GGML_QDOT_AMX && mm->n_items < eng_ll_amx_min_g)
        ctx.qpath = GGML_QDOT_VNNI; /* same bits; fewer items than AMX pays for */
    if (ctx.qpath >= 0) {
        const uint32_t K = mm->w[0]->cols;
        uint8_t *q = mm->qx;
        for (uint32_t m = 0; m < mm->n_mats; m++) {
            int f = ggml_qdot_act(mm->w[m]->type);
            if (f == GGML_QACT_NONE || mm->w[m]->cols != K || K % ggml_qdot_block(mm->w[m]->type) ||
                ctx.qa[f])
                continue;
            ctx.qa[f] = q;
            ctx.qa_stride[f] = ggml_qdot_act_bytes(f, K);
            q += ctx.qa_stride[f] * mm->n_items;
        }
        if (ctx.qa[GGML_QACT_Q8A] || ctx.qa[GGML_QACT_Q8K]) {
            if (mm->n_items >= 4 && eng_ll_pool_active(pool) > 1)
                eng_ll_pool_run(pool, ll_quant_task, &ctx, mm->n_items);
            else
                for (uint32_t i = 0; i < mm->n_items; i++)
                    ll_quant_task(&ctx, i, 0);
        }
    }
    uint64_t macs = 0;
    for (uint32_t m = 0; m < mm->n_mats; m++) {
        ctx.total += mm->w[m]->rows;
        macs += (uint64_t)mm->w[m]->rows * mm->w[m]->cols * mm->n_items;
    }
    uint32_t nt = eng_ll_pool_active(pool);
    /* ~8 chunks per thread for balance, >= 16 rows each; tiny matmuls run
     * on the caller alone (waking a worker costs more than the work) */
    uint64_t cr = ctx.total / (8 * (uint64_t)nt);
    cr = (cr + 15) / 16 * 16; /* whole groups of the packed layout */
    if (cr < 16)
        cr = 16;
    if (macs < (1u << 17))
        cr = ctx.total + 4;
    ctx.chunk_rows = (uint32_t)cr;
    eng_ll_pool_run(pool, ll_matmul_task, &ctx, (uint32_t)((ctx.total + cr - 1) / cr));
}

/* ------------------------------------------------------------------ */
/* thread pool: persistent workers that CLAIM chunks of a job from an atomic
 * counter. The caller works too, so a worker the OS has descheduled (the
 * machine is shared) delays a job by at most the chunk it holds, never by
 * a whole static share. Which thread runs a chunk never changes its
 * result. Idle workers spin briefly, then sleep on a condvar. */

#define LL_SPIN 20000

typedef struct {
    eng_ll_pool_fn fn;
    void *ctx;
    uint32_t n_chunks;
    _Atomic uint32_t next;       /* next unclaimed chunk */
    _Atomic uint32_t done;       /* chunks finished */
} ll_job_t;

struct eng_ll_pool {
    uint32_t n_threads;
    pthread_t *threads;          /* (n_threads - 1) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t gen;        /* bumped once per published job */
    _Atomic(ll_job_t *) cur;     /* job being run, NULL between jobs */
    _Atomic uint32_t refs;       /* workers looking at `cur` */
    _Atomic uint32_t sleepers;
    _Atomic uint32_t active;     /* threads 0..active-1 take jobs */
    pthread_cond_t parked_cv;    /* workers tid >= active wait here */
    _Atomic int stop;
};

typedef struct {
    eng_ll_pool_t *pool;
    uint32_t tid;
} ll_worker_arg_t;

static void ll_job_work(ll_job_t *job, uint32_t tid)
{
    uint32_t c;
    while ((c = atomic_fetch_add(&job->next, 1)) < job->n_chunks) {
        job->fn(job->ctx, c, tid);
        atomic_fetch_add(&job->done, 1);
    }
}

static void *ll_worker(void *arg)
{
    ll_worker_arg_t wa = *(ll_worker_arg_t *)arg;
    free(arg);
    eng_ll_pool_t *p = wa.pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        if (wa.tid >= atomic_load(&p->active)) {
            /* parked: cores handed to another daemon; no spinning, and
             * the jobs published meanwhile are not ours */
            pthread_mutex_lock(&p->mu);
            while (wa.tid >= atomic_load(&p->active) && !atomic_load(&p->stop))
                pthread_cond_wait(&p->parked_cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
            seen = atomic_load(&p->gen);
            if (atomic_load(&p->stop))
                return NULL;
        }
        while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop) &&
               spins < LL_SPIN) {
            __builtin_ia32_pause();
            spins++;
        }
        if (g == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        atomic_fetch_add(&p->refs, 1);  /* then look: pairs with run()'s clear */
        ll_job_t *job = atomic_load(&p->cur);
        if (job && wa.tid < atomic_load(&p->active))
            ll_job_work(job, wa.tid);
        atomic_fetch_sub(&p->refs, 1);
    }
}

pd_status_t eng_ll_pool_create(uint32_t n_threads, eng_ll_pool_t **pool_p)
{
    if (n_threads == 0)
        n_threads = 1;
    eng_ll_pool_t *p = calloc(1, sizeof(*p));
    if (!p)
        return PD_ERR_NO_MEMORY;
    p->n_threads = n_threads;
    atomic_init(&p->active, n_threads);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->parked_cv, NULL);
    p->threads = calloc(n_threads, sizeof(pthread_t));
    if (!p->threads)
        goto err_free;
    uint32_t started = 0;
    for (uint32_t t = 1; t < n_threads; t++) {
        ll_worker_arg_t *wa = malloc(sizeof(*wa));
        if (!wa)
            goto err_join;
        wa->pool = p;
        wa->tid = t;
        if (pthread_create(&p->threads[t - 1], NULL, ll_worker, wa) != 0) {
            free(wa);
            goto err_join;
        }
        started++;
    }
    *pool_p = p;
    return PD_OK;
err_join:
    p->n_threads = started + 1;
    eng_ll_pool_destroy(p);
    return PD_ERR_INTERNAL;
err_free:
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->parked_cv);
    free(p);
    return PD_ERR_NO_MEMORY;
}

void eng_ll_pool_destroy(eng_ll_pool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_cond_broadcast(&p->parked_cv);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t t = 1; t < p->n_threads; t++)
        pthread_join(p->threads[t - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->parked_cv);
    free(p->threads);
    free(p);
}

uint32_t eng_ll_pool_size(const eng_ll_pool_t *p)
{
    return p->n_threads;
}

void eng_ll_pool_set_active(eng_ll_pool_t *p, uint32_t n)
{
    if (n == 0 || n > p->n_threads)
        n = p->n_threads;
    uint32_t was = atomic_load(&p->active);
    if (n == was)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->active, n);
    if (n > was)
        pthread_cond_broadcast(&p->parked_cv);
    pthread_mutex_unlock(&p->mu);
}

uint32_t eng_ll_pool_active(const eng_ll_pool_t *p)
{
    return atomic_load(&p->active);
}

static void ll_wait_zero(_Atomic uint32_t *v, uint32_t target)
{
    int spins = 0;
    while (atomic_load(v) != target) {
        if (spins < LL_SPIN) {
            __builtin_ia32_pause();
            spins++;
        } else {
            sched_yield();
        }
    }
}

void eng_ll_pool_run(eng_ll_pool_t *p, eng_ll_pool_fn fn, void *ctx, uint32_t n_chunks)
{
    if (n_chunks == 0)
        return;
    if (atomic_load(&p->active) == 1 || n_chunks == 1) {
        for (uint32_t c = 0; c < n_chunks; c++)
            fn(ctx, c, 0);
        return;
    }
    ll_job_t job = { fn, ctx, n_chunks, 0, 0 };
    atomic_store(&p->cur, &job);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    ll_job_work(&job, 0);
    ll_wait_zero(&job.done, n_chunks);
    atomic_store(&p->cur, NULL);
    ll_wait_zero(&p->refs, 0); /* nobody still holds &job */
}
