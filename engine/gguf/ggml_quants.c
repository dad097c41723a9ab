/* ggml_quants.c - row (de)quantization of the ggml types beyond Q8_0/Q4_0:
 * Q4_1, Q5_0, Q5_1, IQ4_NL (32-element blocks) and the K-quants Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K (256-element super-blocks). Layouts are ggml's (see
 * ggml_types.h); written from the published block layouts.
 *
 * Dequantization follows ggml's reference order of float operations
 * (e.g. Q4_K: (d * sc) * q - (dmin * m)), so values match llama.cpp's
 * dequantized weights. It is the ONE dequantizer pdserve uses for these
 * types (engine kernels included), compiled for the baseline ISA, so no
 * path can contract it differently.
 *
 * Quantizers are pdserve's own: simple and deterministic (min/max or
 * abs-max per sub-block, 6/4/8-bit sub-block scales relative to an fp16
 * super-block scale, round to nearest, then each element re-quantized
 * against the fp16/quantized scales it will be decoded with). They aim for
 * valid, reasonably accurate files, not llama-quantize's error search. */
#include <immintrin.h>
#include <math.h>
#include "ggml_quants.h"

static inline uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline float h2f(const uint8_t *p)
{
    return ggml_fp16_to_fp32(rd16(p));
}

static inline int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* round half away from zero, as ggml's nearest_int for the values used */
static inline int nint(float x)
{
    return (int)lrintf(x);
}

const int8_t ggml_iq4nl_values[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

/* ------------------------------------------------------------------ */
/* dequantization                                                      */

/* Q4_1 { f16 d; f16 m; u8 qs[16]; }: x = q * d + m */
static void dq_q4_1(const uint8_t *b, float *y)
{
    float d = h2f(b), m = h2f(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(b[4 + j] & 0x0F) * d + m;
        y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
}

/* Q5_0 { f16 d; u8 qh[4]; u8 qs[16]; }: 5th bit of element j is qh bit j */
static void dq_q5_0(const uint8_t *b, float *y)
{
    float d = h2f(b);
    uint32_t qh = (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 |
                  (uint32_t)b[5] << 24;
    for (int j = 0; j < 16; j++) {
        int x0 = (int)((b[6 + j] & 0x0F) | (((qh >> j) & 1u) << 4)) - 16;
        int x1 = (int)((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
        y[j] = (float)x0 * d;
        y[j + 16] = (float)x1 * d;
    }
}

/* Q5_1 { f16 d; f16 m; u8 qh[4]; u8 qs[16]; }: x = q * d + m */
static void dq_q5_1(const uint8_t *b, float *y)
{
    float d = h2f(b), m = h2f(b + 2);
    uint32_t qh = (uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 |
                  (uint32_t)b[7] << 24;
    for (int j = 0; j < 16; j++) {
        uint32_t x0 = (b[8 + j] & 0x0Fu) | (((qh >> j) & 1u) << 4);
        uint32_t x1 = (b[8 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4);
        y[j] = (float)x0 * d + m;
        y[j + 16] = (float)x1 * d + m;
    }
}

/* IQ4_NL { f16 d; u8 qs[16]; }: x = d * values[nibble] */
static void dq_iq4_nl(const uint8_t *b, float *y)
{
    float d = h2f(b);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)ggml_iq4nl_values[b[2 + j] & 0x0F];
        y[j + 16] = d * (float)ggml_iq4nl_values[b[2 + j] >> 4];
    }
}

/* Q2_K { u8 scales[16] (lo: scale, hi: min); u8 qs[64]; f16 d; f16 dmin; } */
static void dq_q2_k(const uint8_t *b, float *y)
{
    const uint8_t *sc = b, *q = b + 16;
    float d = h2f(b + 80), dmin = h2f(b + 82);
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                uint8_t s = sc[is++];
                float dl = d * (float)(s & 0x0F), ml = dmin * (float)(s >> 4);
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
            }
        }
        q += 32;
    }
}

/* Q3_K { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d; } */
static void dq_q3_k(const uint8_t *b, float *y)
{
    const uint8_t *hm = b, *q = b + 32;
    int8_t sc[16];
    ggml_q3k_scales(b + 96, sc);
    float d_all = h2f(b + 108);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                float dl = d_all * (float)sc[is++];
                for (int l = 16 * half; l < 16 * half + 16; l++)
                    *y++ = dl * (float)(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
            }
            m = (uint8_t)(m << 1);
        }
        q += 32;
    }
}

/* 6-bit scale and min j (0..7) of Q4_K / Q5_K */
static inline void k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; } */
static void dq_q4_k(const uint8_t *b, float *y)
{
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *sc = b + 4, *q = b + 16;
    for (int j = 0; j < 8; j += 2) {
        uint8_t s, mm;
        k4_scale_min(j, sc, &s, &mm);
        float d1 = d * (float)s, m1 = dmin * (float)mm;
        k4_scale_min(j + 1, sc, &s, &mm);
        float d2 = d * (float)s, m2 = dmin * (float)mm;
        for (int l = 0; l < 32; l++)
            *y++ = d1 * (float)(q[l] & 0x0F) - m1;
        for (int l = 0; l < 32; l++)
            *y++ = d2 * (float)(q[l] >> 4) - m2;
        q += 32;
    }
}

/* Q5_K { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; } */
static void dq_q5_k(const uint8_t *b, float *y)
{
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *sc = b + 4, *qh = b + 16, *ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < 8; j += 2) {
        uint8_t s, mm;
        k4_scale_min(j, sc, &s, &mm);
        float d1 = d * (float)s, m1 = dmin * (float)mm;
        k4_scale_min(j + 1, sc, &s, &mm);
        float d2 = d * (float)s, m2 = dmin * (float)mm;
        for (int l = 0; l < 32; l++)
            *y++ = d1 * (float)((ql[l] & 0x0F) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++)
            *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        ql += 32;
        u1 = (uint8_t)(u1 << 2);
        u2 = (uint8_t)(u2 << 2);
    }
}

/* Q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; } */
static void dq_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(const void *)(b + 192);
    float d = h2f(b + 208);
    for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32;
            int q2 = (int)((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* ---- AVX2 forms of the common K-quant decoders. Bitwise equal to the
 * scalar ones: the same per-sub-block scale products are computed in scalar
 * code, then each element is one IEEE multiply (and one subtract). The target
 * is "avx2" WITHOUT "fma", so the compiler cannot fuse them either. */
#define TGT_AVX2 __attribute__((target("avx2")))

/* 8 bytes -> 8 floats */
static inline TGT_AVX2 __m256 u8x8_ps(__m128i v)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}

/* y[0..32) = d * q - m for 32 unsigned byte values in qv */
static inline TGT_AVX2 void affine32(float *y, __m256i qv, float d, float m)
{
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    __m128i lo = _mm256_castsi256_si128(qv), hi = _mm256_extracti128_si256(qv, 1);
    _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(dv, u8x8_ps(lo)), mv));
    _mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(dv, u8x8_ps(_mm_srli_si128(lo, 8))), mv));
    _mm256_storeu_ps(y + 16, _mm256_sub_ps(_mm256_mul_ps(dv, u8x8_ps(hi)), mv));
    _mm256_storeu_ps(y + 24, _mm256_sub_ps(_mm256_mul_ps(dv, u8x8_ps(_mm_srli_si128(hi, 8))), mv));
}

static TGT_AVX2 void dq_q4_k_avx2(const uint8_t *b, float *y)
{
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *sc = b + 4, *q = b + 16;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 8; j += 2) {
        uint8_t s, mm;
        k4_scale_min(j, sc, &s, &mm);
        float d1 = d * (float)s, m1 = dmin * (float)mm;
        k4_scale_min(j + 1, sc, &s, &mm);
        float d2 = d * (float)s, m2 = dmin * (float)mm;
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)q);
        affine32(y, _mm256_and_si256(v, m4), d1, m1);
        affine32(y + 32, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), d2, m2);
        y += 64;
        q += 32;
    }
}

static TGT_AVX2 void dq_q5_k_avx2(const uint8_t *b, float *y)
{
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *sc = b + 4, *qh = b + 16, *ql = b + 48;
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)qh);
    for (int j = 0; j < 8; j += 2) {
        uint8_t s, mm;
        k4_scale_min(j, sc, &s, &mm);
        float d1 = d * (float)s, m1 = dmin * (float)mm;
        k4_scale_min(j + 1, sc, &s, &mm);
        float d2 = d * (float)s, m2 = dmin * (float)mm;
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)ql);
        /* bit j of qh (bytes) -> 16 */
        __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(h, j), one);
        __m256i h2 = _mm256_and_si256(_mm256_srli_epi16(h, j + 1), one);
        __m256i q1 = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_slli_epi16(h1, 4));
        __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                     _mm256_slli_epi16(h2, 4));
        affine32(y, q1, d1, m1);
        affine32(y + 32, q2, d2, m2);
        y += 64;
        ql += 32;
    }
}

/* y[0..16) = ds * (float)q for 16 signed bytes in v */
static inline TGT_AVX2 void scale16(float *y, __m128i v, float ds)
{
    const __m256 dv = _mm256_set1_ps(ds);
    _mm256_storeu_ps(y, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(
                                                  _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)))));
}

static TGT_AVX2 void dq_q6_k_avx2(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(const void *)(b + 192);
    float d = h2f(b + 208);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    const __m256i off = _mm256_set1_epi8(32);
    for (int n = 0; n < 256; n += 128) {
        __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
        __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
        __m256i hh = _mm256_loadu_si256((const __m256i *)(const void *)qh);
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                               _mm256_slli_epi16(_mm256_and_si256(hh, m2), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 2), m2), 4));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 4), m2), 4));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 6), m2), 4));
        for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_sub_epi8(q[k], off); /* -32..31 */
            /* elements k*32 + l: l < 16 scale sc[2k], l >= 16 scale sc[2k+1] */
            scale16(y + 32 * k, _mm256_castsi256_si128(v), d * (float)sc[2 * k]);
            scale16(y + 32 * k + 16, _mm256_extracti128_si256(v, 1), d * (float)sc[2 * k + 1]);
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* y[0..16) = d * q - m for 16 unsigned bytes */
static inline TGT_AVX2 void affine16(float *y, __m128i v, float d, float m)
{
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(dv, u8x8_ps(v)), mv));
    _mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(dv, u8x8_ps(_mm_srli_si128(v, 8))), mv));
}

static TGT_AVX2 void dq_q2_k_avx2(const uint8_t *b, float *y)
{
    const uint8_t *sc = b, *q = b + 16;
    float d = h2f(b + 80), dmin = h2f(b + 82);
    const __m256i m2 = _mm256_set1_epi8(3);
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
        __m256i qv = _mm256_loadu_si256((const __m256i *)(const void *)q);
        for (int shift = 0; shift < 8; shift += 2) {
            __m256i v = _mm256_and_si256(_mm256_srli_epi16(qv, shift), m2);
            uint8_t s0 = sc[is++], s1 = sc[is++];
            affine16(y, _mm256_castsi256_si128(v), d * (float)(s0 & 0x0F),
                     dmin * (float)(s0 >> 4));
            affine16(y + 16, _mm256_extracti128_si256(v, 1), d * (float)(s1 & 0x0F),
                     dmin * (float)(s1 >> 4));
            y += 32;
        }
        q += 32;
    }
}

static TGT_AVX2 void dq_q3_k_avx2(const uint8_t *b, float *y)
{
    const uint8_t *q = b + 32;
    int8_t sc[16];
    ggml_q3k_scales(b + 96, sc);
    float d_all = h2f(b + 108);
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m256i hm = _mm256_loadu_si256((const __m256i *)(const void *)b);
    int is = 0, bit = 0;
    for (int n = 0; n < 256; n += 128) {
        __m256i qv = _mm256_loadu_si256((const __m256i *)(const void *)q);
        for (int shift = 0; shift < 8; shift += 2, bit++) {
            __m256i lo2 = _mm256_and_si256(_mm256_srli_epi16(qv, shift), m2);
            __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, bit), one);
            /* minus 4 where the high bit is clear */
            __m256i v = _mm256_sub_epi8(lo2, _mm256_slli_epi16(_mm256_xor_si256(hb, one), 2));
            scale16(y, _mm256_castsi256_si128(v), d_all * (float)sc[is]);
            scale16(y + 16, _mm256_extracti128_si256(v, 1), d_all * (float)sc[is + 1]);
            is += 2;
            y += 32;
        }
        q += 32;
    }
}

static int quants_simd = -1; /* -1: not decided, 0: scalar, 1: AVX2 */

void ggml_quants_set_simd(int on)
{
    __builtin_cpu_init();
    quants_simd = on && __builtin_cpu_supports("avx2");
}

/* Runs a block kernel over n elements; block geometry from the type table. */
static void each_block_dq(uint32_t type, void (*fn)(const uint8_t *, float *),
                          const uint8_t *src, float *dst, uint64_t n)
{
    const ggml_type_info_t *t = ggml_type_info(type);
    for (uint64_t b = 0; b < n / t->block_size; b++)
        fn(src + b * t->type_size, dst + b * t->block_size);
}

pd_status_t ggml_quants_dequantize(uint32_t type, const uint8_t *src, float *dst, uint64_t n)
{
    void (*fn)(const uint8_t *, float *) = NULL;
    int simd = __atomic_load_n(&quants_simd, __ATOMIC_RELAXED);
    if (simd < 0) {
        __builtin_cpu_init();
        simd = __builtin_cpu_supports("avx2") ? 1 : 0;
        __atomic_store_n(&quants_simd, simd, __ATOMIC_RELAXED);
    }
    switch (type) {
    case GGML_TYPE_Q4_1: fn = dq_q4_1; break;
    case GGML_TYPE_Q5_0: fn = dq_q5_0; break;
    case GGML_TYPE_Q5_1: fn = dq_q5_1; break;
    case GGML_TYPE_IQ4_NL: fn = dq_iq4_nl; break;
    case GGML_TYPE_Q2_K: fn = simd ? dq_q2_k_avx2 : dq_q2_k; break;
    case GGML_TYPE_Q3_K: fn = simd ? dq_q3_k_avx2 : dq_q3_k; break;
    case GGML_TYPE_Q4_K: fn = simd ? dq_q4_k_avx2 : dq_q4_k; break;
    case GGML_TYPE_Q5_K: fn = simd ? dq_q5_k_avx2 : dq_q5_k; break;
    case GGML_TYPE_Q6_K: fn = simd ? dq_q6_k_avx2 : dq_q6_k; break;
    default: return PD_ERR_UNSUPPORTED;
    }
    each_block_dq(type, fn, src, dst, n);
    return PD_OK;
}

/* ------------------------------------------------------------------ */
/* quantization                                                        */

static void minmax(const float *x, int n, float *mn, float *mx)
{
    float a = x[0], b = x[0];
    for (int i = 1; i < n; i++) {
        a = x[i] < a ? x[i] : a;
        b = x[i] > b ? x[i] : b;
    }
    *mn = a;
    *mx = b;
}

/* value of largest magnitude (keeps its sign) */
static float absmax_signed(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    return max;
}

/* asymmetric 32-blocks: Q4_1 (bits 4) / Q5_1 (bits 5) */
static void q_affine32(const float *x, uint8_t *b, int bits)
{
    float mn, mx;
    minmax(x, 32, &mn, &mx);
    const int qmax = (1 << bits) - 1;
    uint16_t dh = ggml_fp32_to_fp16((mx - mn) / (float)qmax);
    uint16_t mh = ggml_fp32_to_fp16(mn);
    float d = ggml_fp16_to_fp32(dh), m = ggml_fp16_to_fp32(mh);
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[32];
    for (int j = 0; j < 32; j++)
        q[j] = clampi(nint((x[j] - m) * id), 0, qmax);
    wr16(b, dh);
    wr16(b + 2, mh);
    uint8_t *qs = b + 4;
    if (bits == 5) {
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++)
            qh |= (uint32_t)(q[j] >> 4) << j;
        for (int i = 0; i < 4; i++)
            b[4 + i] = (uint8_t)(qh >> (8 * i));
        qs = b + 8;
    }
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
}

static void q_q5_0(const float *x, uint8_t *b)
{
    float max = absmax_signed(x, 32);
    uint16_t dh = ggml_fp32_to_fp16(max / -16.0f);
    float d = ggml_fp16_to_fp32(dh);
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[32];
    for (int j = 0; j < 32; j++)
        q[j] = clampi(nint(x[j] * id) + 16, 0, 31);
    wr16(b, dh);
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++)
        qh |= (uint32_t)(q[j] >> 4) << j;
    for (int i = 0; i < 4; i++)
        b[2 + i] = (uint8_t)(qh >> (8 * i));
    for (int j = 0; j < 16; j++)
        b[6 + j] = (uint8_t)((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
}

static int iq4nl_best(float v)
{
    int best = 0;
    float be = fabsf(v - ggml_iq4nl_values[0]);
    for (int k = 1; k < 16; k++) {
        float e = fabsf(v - ggml_iq4nl_values[k]);
        if (e < be) {
            be = e;
            best = k;
        }
    }
    return best;
}

static void q_iq4_nl(const float *x, uint8_t *b)
{
    float max = absmax_signed(x, 32);
    uint16_t dh = ggml_fp32_to_fp16(max / -127.0f);
    float d = ggml_fp16_to_fp32(dh);
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    wr16(b, dh);
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(iq4nl_best(x[j] * id) | iq4nl_best(x[j + 16] * id) << 4);
}

/* Affine sub-blocks for Q2_K / Q4_K / Q5_K: x ~ (d*ls) * q - (dmin*lm),
 * q in [0, qmax]. ns sub-blocks of sl elements; 6-bit (lsmax 63) or 4-bit
 * (15) scales. Writes ls/lm and q (ns * sl). Returns fp16 d, dmin. */
static void k_affine(const float *x, int ns, int sl, int qmax, int lsmax, uint8_t *ls,
                     uint8_t *lm, uint8_t *q, uint16_t *dh_p, uint16_t *mh_p)
{
    float scale[16], mins[16], smax = 0.0f, mmax = 0.0f;
    for (int s = 0; s < ns; s++) {
        float mn, mx;
        minmax(x + s * sl, sl, &mn, &mx);
        if (mn > 0.0f)
            mn = 0.0f;
        scale[s] = (mx - mn) / (float)qmax;
        mins[s] = -mn;
        smax = scale[s] > smax ? scale[s] : smax;
        mmax = mins[s] > mmax ? mins[s] : mmax;
    }
    uint16_t dh = ggml_fp32_to_fp16(smax / (float)lsmax);
    uint16_t mh = ggml_fp32_to_fp16(mmax / (float)lsmax);
    float d = ggml_fp16_to_fp32(dh), dmin = ggml_fp16_to_fp32(mh);
    for (int s = 0; s < ns; s++) {
        ls[s] = (uint8_t)(d > 0.0f ? clampi(nint(scale[s] / d), 0, lsmax) : 0);
        /* round the min UP so the sub-block's minimum stays representable */
        lm[s] = (uint8_t)(dmin > 0.0f ? clampi((int)ceilf(mins[s] / dmin), 0, lsmax) : 0);
        float dl = d * (float)ls[s], ml = dmin * (float)lm[s];
        float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
        for (int l = 0; l < sl; l++)
            q[s * sl + l] = (uint8_t)clampi(nint((x[s * sl + l] + ml) * idl), 0, qmax);
    }
    *dh_p = dh;
    *mh_p = mh;
}

static void q_q2_k(const float *x, uint8_t *b)
{
    uint8_t ls[16], lm[16], q[256];
    uint16_t dh, mh;
    k_affine(x, 16, 16, 3, 15, ls, lm, q, &dh, &mh);
    for (int s = 0; s < 16; s++)
        b[s] = (uint8_t)(ls[s] | lm[s] << 4);
    uint8_t *qs = b + 16;
    memset(qs, 0, 64);
    for (int i = 0; i < 256; i++) {
        int c = i / 128, j = (i % 128) / 32, l = i % 32;
        qs[c * 32 + l] |= (uint8_t)(q[i] << (2 * j));
    }
    wr16(b + 80, dh);
    wr16(b + 82, mh);
}

/* pack 8 6-bit scales + 8 6-bit mins (Q4_K / Q5_K) */
static void k4_pack(const uint8_t *ls, const uint8_t *lm, uint8_t *s12)
{
    for (int j = 0; j < 4; j++) {
        s12[j] = (uint8_t)(ls[j] | (ls[j + 4] >> 4) << 6);
        s12[j + 4] = (uint8_t)(lm[j] | (lm[j + 4] >> 4) << 6);
        s12[j + 8] = (uint8_t)((ls[j + 4] & 0x0F) | (lm[j + 4] & 0x0F) << 4);
    }
}

static void q_q4_k(const float *x, uint8_t *b)
{
    uint8_t ls[8], lm[8], q[256];
    uint16_t dh, mh;
    k_affine(x, 8, 32, 15, 63, ls, lm, q, &dh, &mh);
    wr16(b, dh);
    wr16(b + 2, mh);
    k4_pack(ls, lm, b + 4);
    uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            qs[c * 32 + l] = (uint8_t)(q[c * 64 + l] | q[c * 64 + 32 + l] << 4);
}

static void q_q5_k(const float *x, uint8_t *b)
{
    uint8_t ls[8], lm[8], q[256];
    uint16_t dh, mh;
    k_affine(x, 8, 32, 31, 63, ls, lm, q, &dh, &mh);
    wr16(b, dh);
    wr16(b + 2, mh);
    k4_pack(ls, lm, b + 4);
    uint8_t *qh = b + 16, *ql = b + 48;
    memset(qh, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            uint8_t a = q[c * 64 + l], e = q[c * 64 + 32 + l];
            ql[c * 32 + l] = (uint8_t)((a & 0x0F) | (e & 0x0F) << 4);
            qh[l] |= (uint8_t)((a >> 4) << (2 * c) | (e >> 4) << (2 * c + 1));
        }
}

/* Symmetric 16-element sub-blocks with signed integer scales (Q3_K, Q6_K):
 * x ~ (d * ls) * q, q in [qmin, qmax]. */
static void k_sym(const float *x, int qmin, int qmax, int lsmax, int8_t *ls, int8_t *q,
                  uint16_t *dh_p)
{
    float sc[16], amax_sc = 0.0f;
    for (int s = 0; s < 16; s++) {
        float m = absmax_signed(x + 16 * s, 16);
        /* the extreme value maps to qmin (the larger magnitude side) */
        sc[s] = m / (float)qmin;
        if (fabsf(sc[s]) > amax_sc)
            amax_sc = fabsf(sc[s]);
    }
    uint16_t dh = ggml_fp32_to_fp16(amax_sc / (float)lsmax);
    float d = ggml_fp16_to_fp32(dh);
    for (int s = 0; s < 16; s++) {
        ls[s] = (int8_t)(d > 0.0f ? clampi(nint(sc[s] / d), -lsmax, lsmax) : 0);
        float dl = d * (float)ls[s];
        float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
        for (int l = 0; l < 16; l++)
            q[16 * s + l] = (int8_t)clampi(nint(x[16 * s + l] * idl), qmin, qmax);
    }
    *dh_p = dh;
}

static void q_q3_k(const float *x, uint8_t *b)
{
    int8_t ls[16], q[256];
    uint16_t dh;
    k_sym(x, -4, 3, 31, ls, q, &dh);
    uint8_t *hm = b, *qs = b + 32, *s12 = b + 96;
    memset(b, 0, 110);
    for (int i = 0; i < 256; i++) {
        int v = q[i] + 4; /* 0..7 */
        int c = i / 128, j = (i % 128) / 32, l = i % 32;
        qs[c * 32 + l] |= (uint8_t)((v & 3) << (2 * j));
        if (v & 4)
            hm[l] |= (uint8_t)(1u << (c * 4 + j));
    }
    for (int j = 0; j < 16; j++) {
        int l = ls[j] + 32; /* 1..63 */
        if (j < 8)
            s12[j] |= (uint8_t)(l & 0x0F);
        else
            s12[j - 8] |= (uint8_t)((l & 0x0F) << 4);
        s12[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
    }
    wr16(b + 108, dh);
}

static void q_q6_k(const float *x, uint8_t *b)
{
    int8_t ls[16], q[256];
    uint16_t dh;
    k_sym(x, -32, 31, 127, ls, q, &dh);
    uint8_t *ql = b, *qh = b + 128;
    memset(b, 0, 210);
    for (int i = 0; i < 256; i++) {
        int v = q[i] + 32; /* 0..63 */
        int c = i / 128, k = (i % 128) / 32, l = i % 32;
        uint8_t *p = &ql[c * 64 + l + (k & 1) * 32];
        *p |= (uint8_t)((v & 0x0F) << (k >= 2 ? 4 : 0));
        qh[c * 32 + l] |= (uint8_t)((v >> 4) << (2 * k));
    }
    memcpy(b + 192, ls, 16);
    wr16(b + 208, dh);
}

static void q_q4_1(const float *x, uint8_t *b)
{
    q_affine32(x, b, 4);
}

static void q_q5_1(const float *x, uint8_t *b)
{
    q_affine32(x, b, 5);
}

pd_status_t ggml_quants_quantize(uint32_t type, const float *src, uint8_t *dst, uint64_t n)
{
    void (*fn)(const float *, uint8_t *);
    switch (type) {
    case GGML_TYPE_Q4_1: fn = q_q4_1; break;
    case GGML_TYPE_Q5_1: fn = q_q5_1; break;
    case GGML_TYPE_Q5_0: fn = q_q5_0; break;
    case GGML_TYPE_IQ4_NL: fn = q_iq4_nl; break;
    case GGML_TYPE_Q2_K: fn = q_q2_k; break;
    case GGML_TYPE_Q3_K: fn = q_q3_k; break;
    case GGML_TYPE_Q4_K: fn = q_q4_k; break;
    case GGML_TYPE_Q5_K: fn = q_q5_k; break;
    case GGML_TYPE_Q6_K: fn = q_q6_k; break;
    default: return PD_ERR_UNSUPPORTED;
    }
    const ggml_type_info_t *t = ggml_type_info(type);
    for (uint64_t b = 0; b < n / t->block_size; b++)
        fn(src + b * t->block_size, dst + b * t->type_size);
    return PD_OK;
}
