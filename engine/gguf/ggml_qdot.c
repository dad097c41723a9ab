/* ggml_qdot.c - integer-dot kernels (see ggml_qdot.h). */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ggml_qdot.h"

#define Q8_0_BYTES 34
#define Q4_0_BYTES 18

static inline float h2f(const uint8_t *p)
{
    return ggml_fp16_to_fp32((uint16_t)(p[0] | (p[1] << 8)));
}

void ggml_q8a_quantize(const float *x, uint64_t n, ggml_q8a_block *out)
{
    for (uint64_t b = 0; b < n / GGML_Q8A_BLOCK; b++) {
        const float *v = x + b * GGML_Q8A_BLOCK;
        float amax = 0.0f;
        for (int j = 0; j < GGML_Q8A_BLOCK; j++) {
            float a = fabsf(v[j]);
            if (a > amax)
                amax = a;
        }
        float d = amax / 127.0f;
        float id = d > 0.0f ? 1.0f / d : 0.0f;
        out[b].d = d;
        for (int j = 0; j < GGML_Q8A_BLOCK; j++) {
            long q = lrintf(v[j] * id);
            out[b].qs[j] = (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
        }
    }
}

/* ---- scalar ---- */
static void isums_q8_0_scalar(const uint8_t *w, const ggml_q8a_block *a, uint64_t nb, int32_t *s)
{
    for (uint64_t b = 0; b < nb; b++) {
        const int8_t *q = (const int8_t *)(w + b * Q8_0_BYTES + 2);
        int32_t acc = 0;
        for (int j = 0; j < 32; j++)
            acc += (int32_t)q[j] * a[b].qs[j];
        s[b] = acc;
    }
}

static void isums_q4_0_scalar(const uint8_t *w, const ggml_q8a_block *a, uint64_t nb, int32_t *s)
{
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *q = w + b * Q4_0_BYTES + 2;
        int32_t acc = 0;
        for (int j = 0; j < 16; j++) {
            acc += ((int32_t)(q[j] & 0x0F) - 8) * a[b].qs[j];
            acc += ((int32_t)(q[j] >> 4) - 8) * a[b].qs[j + 16];
        }
        s[b] = acc;
    }
}

/* ---- AVX2 ---- */
__attribute__((target("avx2"))) static inline int32_t hsum8_avx2(__m256i v)
{
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    return _mm_cvtsi128_si32(x);
}

/* Lane sums of v[0..7] as one vector: lane i = sum of v[i]'s 8 int32 lanes. */
__attribute__((target("avx2"))) static inline __m256i hsum8x8_avx2(const __m256i *v)
{
    __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
    a = _mm256_hadd_epi32(a, b);
    c = _mm256_hadd_epi32(c, d);
    /* a: lanes {0,1,2,3 | 0,1,2,3} halves; c likewise for 4..7 */
    __m256i lo = _mm256_permute2x128_si256(a, c, 0x20), hi = _mm256_permute2x128_si256(a, c, 0x31);
    return _mm256_add_epi32(lo, hi);
}

__attribute__((target("avx2"))) static inline __m256i q4_unpack_avx2(const uint8_t *q)
{
    __m128i lo = _mm_loadu_si128((const __m128i_u *)q);
    __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(lo, 4), m), _mm_and_si128(lo, m));
}

__attribute__((target("avx2"))) static void isums_q8_0_avx2(const uint8_t *w,
                                                             const ggml_q8a_block *a, uint64_t nb,
                                                             int32_t *s)
{
    const __m256i ones = _mm256_set1_epi16(1);
    uint64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256i v[8];
        for (int k = 0; k < 8; k++) {
            __m256i wq = _mm256_loadu_si256((const __m256i_u *)(w + (b + k) * Q8_0_BYTES + 2));
            __m256i aq = _mm256_loadu_si256((const __m256i_u *)a[b + k].qs);
            v[k] = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(aq, wq)), ones);
        }
        _mm256_storeu_si256((__m256i_u *)(s + b), hsum8x8_avx2(v));
    }
    for (; b < nb; b++) {
        __m256i wq = _mm256_loadu_si256((const __m256i_u *)(w + b * Q8_0_BYTES + 2));
        __m256i aq = _mm256_loadu_si256((const __m256i_u *)a[b].qs);
        /* |w| * (a * sign(w)); |w| <= 128 so 2 * 128 * 127 fits int16 */
        __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(aq, wq));
        s[b] = hsum8_avx2(_mm256_madd_epi16(p, ones));
    }
}

__attribute__((target("avx2"))) static void isums_q4_0_avx2(const uint8_t *w,
                                                             const ggml_q8a_block *a, uint64_t nb,
                                                             int32_t *s)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i eight = _mm256_set1_epi32(8);
    uint64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256i v[8], t[8];
        for (int k = 0; k < 8; k++) {
            __m256i u = q4_unpack_avx2(w + (b + k) * Q4_0_BYTES + 2);
            __m256i aq = _mm256_loadu_si256((const __m256i_u *)a[b + k].qs);
            v[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(u, aq), ones);
            t[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, aq), ones);
        }
        __m256i r = _mm256_sub_epi32(hsum8x8_avx2(v), _mm256_mullo_epi32(eight, hsum8x8_avx2(t)));
        _mm256_storeu_si256((__m256i_u *)(s + b), r);
    }
    for (; b < nb; b++) {
        __m256i u = q4_unpack_avx2(w + b * Q4_0_BYTES + 2);
        __m256i aq = _mm256_loadu_si256((const __m256i_u *)a[b].qs);
        /* sum((u - 8) * a) = sum(u * a) - 8 * sum(a); u <= 15 so no int16 saturation */
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, aq), ones);
        __m256i sa = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, aq), ones);
        s[b] = hsum8_avx2(p) - 8 * hsum8_avx2(sa);
    }
}

/* ---- AVX-512 VNNI (256-bit vpdpbusd) ---- */
#define VNNI_TARGET "avx2,avx512f,avx512vl,avx512bw,avx512vnni"
__attribute__((target(VNNI_TARGET))) static void isums_q8_0_vnni(const uint8_t *w,
                                                                 const ggml_q8a_block *a,
                                                                 uint64_t nb, int32_t *s)
{
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i k128 = _mm256_set1_epi32(128);
    uint64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256i v[8], t[8];
        for (int k = 0; k < 8; k++) {
            __m256i wq = _mm256_loadu_si256((const __m256i_u *)(w + (b + k) * Q8_0_BYTES + 2));
            __m256i aq = _mm256_loadu_si256((const __m256i_u *)a[b + k].qs);
            v[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_xor_si256(wq, bias), aq);
            t[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones8, aq);
        }
        __m256i r = _mm256_sub_epi32(hsum8x8_avx2(v), _mm256_mullo_epi32(k128, hsum8x8_avx2(t)));
        _mm256_storeu_si256((__m256i_u *)(s + b), r);
    }
    for (; b < nb; b++) {
        __m256i wq = _mm256_loadu_si256((const __m256i_u *)(w + b * Q8_0_BYTES + 2));
        __m256i aq = _mm256_loadu_si256((const __m256i_u *)a[b].qs);
        /* (w + 128) as u8: sum(w * a) = sum((w + 128) * a) - 128 * sum(a) */
        __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_xor_si256(wq, bias), aq);
        __m256i sa = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones8, aq);
        s[b] = hsum8_avx2(p) - 128 * hsum8_avx2(sa);
    }
}

__attribute__((target(VNNI_TARGET))) static void isums_q4_0_vnni(const uint8_t *w,
                                                                 const ggml_q8a_block *a,
                                                                 uint64_t nb, int32_t *s)
{
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i eight = _mm256_set1_epi32(8);
    uint64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256i v[8], t[8];
        for (int k = 0; k < 8; k++) {
            __m256i u = q4_unpack_avx2(w + (b + k) * Q4_0_BYTES + 2);
            __m256i aq = _mm256_loadu_si256((const __m256i_u *)a[b + k].qs);
            v[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, aq);
            t[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones8, aq);
        }
        __m256i r = _mm256_sub_epi32(hsum8x8_avx2(v), _mm256_mullo_epi32(eight, hsum8x8_avx2(t)));
        _mm256_storeu_si256((__m256i_u *)(s + b), r);
    }
    for (; b < nb; b++) {
        __m256i u = q4_unpack_avx2(w + b * Q4_0_BYTES + 2);
        __m256i aq = _mm256_loadu_si256((const __m256i_u *)a[b].qs);
        __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, aq);
        __m256i sa = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones8, aq);
        s[b] = hsum8_avx2(p) - 8 * hsum8_avx2(sa);
    }
}

/* ---- dispatch ---- */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C); /* clang lacks "f16c" */
}

static int cpu_best(void)
{
    __builtin_cpu_init();
    /* the SIMD paths' combine converts scales with F16C */
    if (!__builtin_cpu_supports("avx2") || !cpu_has_f16c())
        return GGML_QDOT_SCALAR;
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw"))
        return GGML_QDOT_VNNI;
    if (1)
        return GGML_QDOT_AVX2;
    return GGML_QDOT_SCALAR;
}

static int g_path = -1;

int ggml_qdot_set_path(int path)
{
    int best = cpu_best();
    g_path = path < best ? (path < 0 ? 0 : path) : best;
    return g_path;
}

int ggml_qdot_path(void)
{
    if (g_path < 0) {
        const char *e = getenv("PD_QDOT");
        int cap = GGML_QDOT_VNNI;
        if (e && strcmp(e, "scalar") == 0)
            cap = GGML_QDOT_SCALAR;
        else if (e && strcmp(e, "avx2") == 0)
            cap = GGML_QDOT_AVX2;
        ggml_qdot_set_path(cap);
    }
    return g_path;
}

pd_status_t ggml_qdot_isums(int path, uint32_t type, const uint8_t *w, const ggml_q8a_block *a,
                            uint64_t nb, int32_t *isum)
{
    int best = cpu_best();
    if (path > best)
        path = best;
    if (type == GGML_TYPE_Q8_0) {
        if (path == GGML_QDOT_VNNI)
            isums_q8_0_vnni(w, a, nb, isum);
        else if (path == GGML_QDOT_AVX2)
            isums_q8_0_avx2(w, a, nb, isum);
        else
            isums_q8_0_scalar(w, a, nb, isum);
        return PD_OK;
    }
    if (type == GGML_TYPE_Q4_0) {
        if (path == GGML_QDOT_VNNI)
            isums_q4_0_vnni(w, a, nb, isum);
        else if (path == GGML_QDOT_AVX2)
            isums_q4_0_avx2(w, a, nb, isum);
        else
            isums_q4_0_scalar(w, a, nb, isum);
        return PD_OK;
    }
    return PD_ERR_UNSUPPORTED;
}

/* The scalar combine with the fp16 scale converted by F16C (exact, like
 * h2f) and no FMA enabled, so it returns the scalar loop's bits. */
__attribute__((target("avx2,f16c"))) static float combine_f16c(float acc, const uint8_t *w,
                                                                size_t bytes,
                                                                const ggml_q8a_block *a,
                                                                const int32_t *s, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *p = w + i * bytes;
        float dw = _cvtsh_ss((unsigned short)(p[0] | (p[1] << 8)));
        acc += (dw * a[i].d) * (float)s[i];
    }
    return acc;
}

pd_status_t ggml_qdot_row(uint32_t type, const uint8_t *w, const ggml_q8a_block *a, uint64_t nb,
                          float *out)
{
    size_t bytes = type == GGML_TYPE_Q8_0 ? Q8_0_BYTES : Q4_0_BYTES;
    float acc = 0.0f;
    int path = ggml_qdot_path();
    for (uint64_t b0 = 0; b0 < nb; b0 += 64) {
        int32_t s[64];
        uint64_t n = nb - b0 < 64 ? nb - b0 : 64;
        pd_status_t st = ggml_qdot_isums(path, type, w + b0 * bytes, a + b0, n, s);
        if (st != PD_OK)
            return st;
        if (path != GGML_QDOT_SCALAR)
            acc = combine_f16c(acc, w + b0 * bytes, bytes, a + b0, s, n);
        else
            for (uint64_t i = 0; i < n; i++)
                acc += (h2f(w + (b0 + i) * bytes) * a[b0 + i].d) * (float)s[i];
    }
    *out = acc;
    return PD_OK;
}
