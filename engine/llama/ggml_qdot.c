/* ggml_qdot.c - integer-dot kernels (see ggml_qdot.h for the activation
 * formats and the canonical result every path reproduces bit for bit). */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ggml_qdot.h"
#include "ggml_quants.h"
#include "ggml_qdot_int.h"

#define Q2_K_BYTES 84
#define Q3_K_BYTES 110
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176

int ggml_qdot_act(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_IQ4_NL: return GGML_QACT_Q8A;
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K: return GGML_QACT_Q8K;
    default: return GGML_QACT_NONE;
    }
}

uint32_t ggml_qdot_block(uint32_t type)
{
    int act = ggml_qdot_act(type);
    return act == GGML_QACT_Q8A ? GGML_Q8A_BLOCK : act == GGML_QACT_Q8K ? GGML_Q8K_BLOCK : 0;
}

size_t ggml_qdot_act_bytes(int act, uint64_t n)
{
    if (act == GGML_QACT_Q8A)
        return (size_t)(n / GGML_Q8A_BLOCK) * 44;
    if (act == GGML_QACT_Q8K)
        return (size_t)(n / GGML_Q8K_BLOCK) * (sizeof(ggml_q8k_block) + 4 * GGML_Q8K_BLOCK / 4);
    return 0;
}

/* round(v * id) clamped to [-127, 127] */
static inline int8_t q8(float v, float id)
{
    long q = lrintf(v * id);
    return (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
}

static float absmax(const float *v, int n)
{
    float amax = 0.0f;
    for (int j = 0; j < n; j++) {
        float a = fabsf(v[j]);
        if (a > amax)
            amax = a;
    }
    return amax;
}


/* AVX2 form of the quantizers: the same IEEE operations (|x| max, d =
 * amax / 127, id = 1 / d, x * id rounded to nearest-even as lrintf does in
 * the default rounding mode, clamp), so the same bytes. */
__attribute__((target("avx2,f16c"))) static float q8_block_avx2(const float *v, int n, int8_t *q)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8)
        m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(v + j)), m); /* NaN: keeps m */
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    float d = _mm_cvtss_f32(m4) / 127.0f;
    float id = d > 0.0f ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    for (int j = 0; j < n; j += 32) {
        __m256i r[4];
        for (int k = 0; k < 4; k++) {
            __m256i t = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + j + 8 * k), vid));
            r[k] = _mm256_min_epi32(_mm256_max_epi32(t, lo), hi);
        }
        /* packs interleave 128-bit lanes: restore element order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i_u *)(q + j), p);
    }
    return d;
}

static void q8a_quantize(const float *x, uint64_t n, uint8_t *out)
{
    uint64_t nb = n / GGML_Q8A_BLOCK;
    int8_t *qs = (int8_t *)out;
    int32_t *c128 = (int32_t *)(void *)(out + 32 * nb), *c8 = c128 + nb;
    float *dd = (float *)(void *)(c8 + nb);
    for (uint64_t b = 0; b < nb; b++) {
        const float *v = x + b * GGML_Q8A_BLOCK;
        float d;
        if (ggml_qdot_path() >= GGML_QDOT_AVX2) {
            d = q8_block_avx2(v, GGML_Q8A_BLOCK, qs + b * 32);
        } else {
            d = absmax(v, GGML_Q8A_BLOCK) / 127.0f;
            float id = d > 0.0f ? 1.0f / d : 0.0f;
            for (int j = 0; j < GGML_Q8A_BLOCK; j++)
                qs[b * 32 + j] = q8(v[j], id);
        }
        int32_t sum = 0;
        for (int j = 0; j < GGML_Q8A_BLOCK; j++)
            sum += qs[b * 32 + j];
        c128[b] = -128 * sum;
        c8[b] = -8 * sum;
        dd[b] = d;
    }
}

static void q8k_quantize(const float *x, uint64_t n, ggml_q8k_block *out)
{
    for (uint64_t b = 0; b < n / GGML_Q8K_BLOCK; b++) {
        const float *v = x + b * GGML_Q8K_BLOCK;
        if (ggml_qdot_path() >= GGML_QDOT_AVX2) {
            out[b].d = q8_block_avx2(v, GGML_Q8K_BLOCK, out[b].qs);
        } else {
            float d = absmax(v, GGML_Q8K_BLOCK) / 127.0f;
            float id = d > 0.0f ? 1.0f / d : 0.0f;
            out[b].d = d;
            for (int j = 0; j < GGML_Q8K_BLOCK; j++)
                out[b].qs[j] = q8(v[j], id);
        }
        for (int k = 0; k < GGML_Q8K_BLOCK / 16; k++) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += out[b].qs[16 * k + j];
            out[b].bsums[k] = (int16_t)s;
        }
        int32_t *n4 = (int32_t *)(void *)(out + n / GGML_Q8K_BLOCK) + b * (GGML_Q8K_BLOCK / 4);
        for (int k = 0; k < GGML_Q8K_BLOCK / 4; k++)
            n4[k] = -32 * ((int32_t)out[b].qs[4 * k] + out[b].qs[4 * k + 1] +
                           out[b].qs[4 * k + 2] + out[b].qs[4 * k + 3]);
    }
}

void ggml_qdot_quantize(int act, const float *x, uint64_t n, void *out)
{
    if (act == GGML_QACT_Q8A)
        q8a_quantize(x, n, out);
    else if (act == GGML_QACT_Q8K)
        q8k_quantize(x, n, out);
}

/* ------------------------------------------------------------------ */
/* 32-element types against Q8A: one exact int32 per block, one chain  */

/* the block's 32 integer weights w (x = d * w, + m with a min), element
 * order: Q8_0 q; Q4_0 n - 8; Q4_1 n; Q5_0 n5 - 16; Q5_1 n5 (n5 = nibble +
 * 16 x bit e of qh); IQ4_NL its code point of n */
static inline void w32_unpack(uint32_t type, const uint8_t *blk, int8_t *wq)
{
    const q32_fmt_t f = q32_fmt(type);
    if (type == GGML_TYPE_Q8_0) {
        memcpy(wq, blk + 2, 32);
        return;
    }
    uint32_t qh = 0;
    if (f.qh)
        qh = (uint32_t)blk[f.qh] | (uint32_t)blk[f.qh + 1] << 8 |
             (uint32_t)blk[f.qh + 2] << 16 | (uint32_t)blk[f.qh + 3] << 24;
    for (int e = 0; e < 32; e++) {
        uint8_t q = blk[f.qs + e % 16];
        int n = (e < 16 ? q & 0x0F : q >> 4) | (int)((qh >> e) & 1u) << 4;
        switch (type) {
        case GGML_TYPE_Q4_0: n -= 8; break;
        case GGML_TYPE_Q5_0: n -= 16; break;
        case GGML_TYPE_IQ4_NL: n = ggml_iq4nl_values[n]; break;
        default: break;
        }
        wq[e] = (int8_t)n;
    }
}

static float q32_dot_scalar(uint32_t type, const uint8_t *w, uint64_t nb, const uint8_t *a)
{
    const q32_fmt_t f = q32_fmt(type);
    const int8_t *qs = (const int8_t *)a;
    const float *da = Q8A_D(a, nb);
    float r = 0.0f;
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * f.bytes;
        int8_t wq[32];
        w32_unpack(type, blk, wq);
        int32_t p = 0, sum = 0;
        for (int j = 0; j < 32; j++) {
            p += (int32_t)wq[j] * qs[b * 32 + j];
            sum += qs[b * 32 + j];
        }
        r = fmaf((float)p, h2f(blk) * da[b], r);
        if (f.has_min)
            r = fmaf((float)sum, h2f(blk + 2) * da[b], r);
    }
    return r;
}

/* ---- AVX2 ---- */

__attribute__((target(AVX2_TARGET))) static inline int32_t hsum8_avx2(__m256i v)
{
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    return _mm_cvtsi128_si32(x);
}

/* the 32 signed weights of a 32-element block (w32_unpack), element order */
__attribute__((target(AVX2_TARGET))) static inline __m256i w32_avx2(uint32_t type,
                                                                     const uint8_t *blk)
{
    const q32_fmt_t f = q32_fmt(type);
    if (type == GGML_TYPE_Q8_0)
        return _mm256_loadu_si256((const __m256i_u *)(blk + 2));
    __m128i x = _mm_loadu_si128((const __m128i_u *)(blk + f.qs));
    __m128i m = _mm_set1_epi8(0x0F);
    __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
    if (f.qh) { /* byte e |= 16 x bit e of qh */
        uint32_t qh;
        memcpy(&qh, blk + f.qh, 4);
        __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1,
                                                         1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                                                         3, 3, 3, 3));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
        u = _mm256_or_si256(u, _mm256_and_si256(v, _mm256_set1_epi8(16)));
    }
    switch (type) {
    case GGML_TYPE_Q4_0: return _mm256_sub_epi8(u, _mm256_set1_epi8(8));
    case GGML_TYPE_Q5_0: return _mm256_sub_epi8(u, _mm256_set1_epi8(16));
    case GGML_TYPE_IQ4_NL:
        return _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i_u *)ggml_iq4nl_values)), u);
    default: return u; /* Q4_1, Q5_1 */
    }
}

/* 8 int32 lanes summing to the block's exact dot: |w| * (q * sign(w)),
 * |w| <= 128, so the pairs fit int16 */
__attribute__((target(AVX2_TARGET))) static inline __m256i p8_avx2(__m256i wq, __m256i aw,
                                                                    const uint8_t *q)
{
    __m256i aq = _mm256_loadu_si256((const __m256i_u *)q);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(aq, wq)),
                             _mm256_set1_epi16(1));
}


/* the same for blocks b..b + 3 (-8 x the sum is exact in f32, and so is
 * the scaling by -1/8) */
__attribute__((target(AVX2_TARGET))) static inline __m128 q8a_sum4(const uint8_t *ai, uint64_t nb,
                                                                   uint64_t b)
{
    __m128i c8 = _mm_loadu_si128((const __m128i_u *)(Q8A_C8(ai, nb) + b));
    return _mm_mul_ps(_mm_cvtepi32_ps(c8), _mm_set1_ps(-0.125f));
}

/* r = fma(P_k, s_k, r) (then fma(S_k, m_k, r) with a min) for lanes k < 4 */
#define Q32_FOLD4(r, f, s, sv, ms, has_min)                                                      \
    do {                                                                                         \
        r = _mm_fmadd_ss(f, s, r);                                                               \
        if (has_min)                                                                             \
            r = _mm_fmadd_ss(sv, ms, r);                                                         \
        r = _mm_fmadd_ss(_mm_shuffle_ps(f, f, 1), _mm_shuffle_ps(s, s, 1), r);                   \
        if (has_min)                                                                             \
            r = _mm_fmadd_ss(_mm_shuffle_ps(sv, sv, 1), _mm_shuffle_ps(ms, ms, 1), r);           \
        r = _mm_fmadd_ss(_mm_shuffle_ps(f, f, 2), _mm_shuffle_ps(s, s, 2), r);                   \
        if (has_min)                                                                             \
            r = _mm_fmadd_ss(_mm_shuffle_ps(sv, sv, 2), _mm_shuffle_ps(ms, ms, 2), r);           \
        r = _mm_fmadd_ss(_mm_shuffle_ps(f, f, 3), _mm_shuffle_ps(s, s, 3), r);                   \
        if (has_min)                                                                             \
            r = _mm_fmadd_ss(_mm_shuffle_ps(sv, sv, 3), _mm_shuffle_ps(ms, ms, 3), r);           \
    } while (0)

/* One weight row against ni <= 4 activation rows: 4 blocks at a time,
 * their 4 exact sums gathered into one xmm by horizontal adds, converted
 * and scaled together, then folded into the chain in block order. */
__attribute__((target(AVX2_TARGET))) static void
q32_row_avx2(uint32_t type, const uint8_t *w, uint64_t nb, const uint8_t *a, size_t as,
             uint32_t ni, float *out, size_t os)
{
    const q32_fmt_t fm = q32_fmt(type);
    const size_t bytes = fm.bytes;
    __m128 r[4];
    for (uint32_t i = 0; i < 4; i++)
        r[i] = _mm_setzero_ps();
    uint64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        __m256i wq[4], aw[4];
        const uint8_t *blk = w + b * bytes;
        for (int k = 0; k < 4; k++) {
            wq[k] = w32_avx2(type, blk + k * bytes);
            aw[k] = _mm256_sign_epi8(wq[k], wq[k]);
        }
        const __m128 dw = _mm_setr_ps(_cvtsh_ss(rd16(blk)), _cvtsh_ss(rd16(blk + bytes)),
                                      _cvtsh_ss(rd16(blk + 2 * bytes)),
                                      _cvtsh_ss(rd16(blk + 3 * bytes)));
        const __m128 mw = fm.has_min ? _mm_setr_ps(_cvtsh_ss(rd16(blk + 2)),
                                                   _cvtsh_ss(rd16(blk + bytes + 2)),
                                                   _cvtsh_ss(rd16(blk + 2 * bytes + 2)),
                                                   _cvtsh_ss(rd16(blk + 3 * bytes + 2)))
                                     : _mm_setzero_ps();
        for (uint32_t i = 0; i < ni; i++) {
            const uint8_t *ai = a + i * as;
            __m256i p[4];
            for (int k = 0; k < 4; k++)
                p[k] = p8_avx2(wq[k], aw[k], ai + 32 * (b + (uint64_t)k));
            __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]),
                                          _mm256_hadd_epi32(p[2], p[3]));
            __m128 f = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h),
                                                     _mm256_extracti128_si256(h, 1)));
            const __m128 da = _mm_loadu_ps(Q8A_D(ai, nb) + b);
            __m128 s = _mm_mul_ps(dw, da);
            __m128 sv = _mm_setzero_ps(), ms = _mm_setzero_ps();
            if (fm.has_min) {
                sv = q8a_sum4(ai, nb, b);
                ms = _mm_mul_ps(mw, da);
            }
            Q32_FOLD4(r[i], f, s, sv, ms, fm.has_min);
        }
    }
    for (; b < nb; b++) {
        const uint8_t *blk = w + b * bytes;
        __m256i wq = w32_avx2(type, blk), aw = _mm256_sign_epi8(wq, wq);
        const float dw = _cvtsh_ss(rd16(blk));
        for (uint32_t i = 0; i < ni; i++) {
            const uint8_t *ai = a + i * as;
            const float da = Q8A_D(ai, nb)[b];
            float f = (float)hsum8_avx2(p8_avx2(wq, aw, ai + 32 * b));
            r[i] = _mm_fmadd_ss(_mm_set_ss(f), _mm_set_ss(dw * da), r[i]);
            if (fm.has_min)
                r[i] = _mm_fmadd_ss(_mm_set_ss(q8a_sum(ai, nb, b)),
                                    _mm_set_ss(_cvtsh_ss(rd16(blk + 2)) * da), r[i]);
        }
    }
    for (uint32_t i = 0; i < ni; i++)
        out[i * os] = _mm_cvtss_f32(r[i]);
}

/* ---- AVX-512 VNNI on the packed layout (ggml_qdot_pack): 16 weight
 * rows in the 16 int32 lanes, so one vpdpbusd adds 4 products to each of
 * 16 rows (the activation's 4 bytes broadcast) and a block's 8 of them
 * leave each row's exact block sum in its lane. vpdpbusd wants unsigned
 * weights: the BYTE form is w + 128 (the chain starts from the
 * activation's -128 * block sum), Q4_0's nibbles are w + 8 (from -8 *
 * sum), Q4_1's are w. Per block and item: one convert, one scale
 * multiply, one fma (and one for the min) for 16 rows. */
#define Q32_PK_ITEMS 8 /* items per pass over a packed group */


__attribute__((target(VNNI_TARGET))) static inline __attribute__((always_inline)) void
q32_pk_vnni_t(const uint32_t type, const uint8_t *pg, uint64_t nb, const uint8_t *a, size_t as,
              float *out, size_t os, const int NI)
{
    const q32_fmt_t fm = q32_fmt(type);
    const size_t qb = q32_pk_qbytes(type);
    const uint16_t *sp = (const uint16_t *)(const void *)(pg + nb * qb), *mp = sp + 16 * nb;
    __m512 r[Q32_PK_ITEMS];
#pragma GCC unroll 8
    for (int i = 0; i < NI; i++)
        r[i] = _mm512_setzero_ps();
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *q = pg + b * qb;
        _mm_prefetch((const char *)q + QDOT_PF, _MM_HINT_T0);
        __m512i wv[8];
        if (fm.form == Q32_BYTE) {
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++)
                wv[t] = _mm512_loadu_si512(q + 64 * t);
        } else {
            const __m512i m = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                __m512i x = _mm512_loadu_si512(q + 64 * t);
                wv[t] = _mm512_and_si512(x, m);
                wv[t + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m);
            }
            if (fm.form == Q32_LUT) {
                const __m512i lut = _mm512_broadcast_i32x4(_mm_xor_si128( /* value + 128 */
                    _mm_loadu_si128((const __m128i_u *)ggml_iq4nl_values), _mm_set1_epi8(-128)));
#pragma GCC unroll 8
                for (int t = 0; t < 8; t++)
                    wv[t] = _mm512_shuffle_epi8(lut, wv[t]);
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i_u *)(sp + 16 * b)));
        const __m512 mw = fm.has_min
                              ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i_u *)(mp + 16 * b)))
                              : _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int i = 0; i < NI; i++) {
            const uint8_t *ai = a + i * as;
            const int32_t *g4 = (const int32_t *)(const void *)(ai + 32 * b);
            /* the lanes hold (w + o) * q: start from -o x the block sum */
            const int32_t c = type == GGML_TYPE_Q4_0 ? Q8A_C8(ai, nb)[b]
                              : type == GGML_TYPE_Q4_1 ? 0
                                                       : Q8A_C128(ai, nb)[b];
            __m512i p0 = _mm512_set1_epi32(c), p1 = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int t = 0; t < 8; t += 2) {
                p0 = _mm512_dpbusd_epi32(p0, wv[t], _mm512_set1_epi32(g4[t]));
                p1 = _mm512_dpbusd_epi32(p1, wv[t + 1], _mm512_set1_epi32(g4[t + 1]));
            }
            __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(p0, p1));
            const __m512 da = _mm512_set1_ps(Q8A_D(ai, nb)[b]);
            r[i] = _mm512_fmadd_ps(f, _mm512_mul_ps(dw, da), r[i]);
            if (fm.has_min)
                r[i] = _mm512_fmadd_ps(_mm512_set1_ps(q8a_sum(ai, nb, b)),
                                       _mm512_mul_ps(mw, da), r[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < NI; i++)
        _mm512_storeu_ps(out + i * os, r[i]);
}

typedef void (*q32_pk_fn)(const uint8_t *, uint64_t, const uint8_t *, size_t, float *, size_t);
#define Q32_PK(T, TN, NI)                                                                      \
    __attribute__((target(VNNI_TARGET))) static void q32_pk_##TN##_##NI(                      \
        const uint8_t *pg, uint64_t nb, const uint8_t *a, size_t as, float *out, size_t os)    \
    {                                                                                          \
        q32_pk_vnni_t(T, pg, nb, a, as, out, os, NI);                                          \
    }
#define Q32_PKS(T, TN)                                                                         \
    Q32_PK(T, TN, 1) Q32_PK(T, TN, 2) Q32_PK(T, TN, 3) Q32_PK(T, TN, 4) Q32_PK(T, TN, 5)       \
    Q32_PK(T, TN, 6) Q32_PK(T, TN, 7) Q32_PK(T, TN, 8)                                         \
    static const q32_pk_fn q32_pk_##TN[Q32_PK_ITEMS + 1] = {                                   \
        NULL, q32_pk_##TN##_1, q32_pk_##TN##_2, q32_pk_##TN##_3, q32_pk_##TN##_4,              \
        q32_pk_##TN##_5, q32_pk_##TN##_6, q32_pk_##TN##_7, q32_pk_##TN##_8 };
Q32_PKS(GGML_TYPE_Q8_0, q8)
Q32_PKS(GGML_TYPE_Q4_0, q4)
Q32_PKS(GGML_TYPE_Q4_1, q41)
Q32_PKS(GGML_TYPE_Q5_0, q50)
Q32_PKS(GGML_TYPE_Q5_1, q51)
Q32_PKS(GGML_TYPE_IQ4_NL, iq4)

/* one group of 16 rows (w: its first row) in the packed layout: per block
 * the quads (BYTE: w + 128, 8 of them; NIB: the qs bytes, 4), after all
 * blocks the plane of f16 d, then (with a min) the plane of f16 m */
static void q32_pack_group(uint32_t type, const uint8_t *w, size_t row_bytes, uint64_t nb,
                           uint8_t *pg)
{
    const q32_fmt_t f = q32_fmt(type);
    const size_t qb = q32_pk_qbytes(type);
    uint8_t *sp = pg + nb * qb, *mp = sp + 32 * nb;
    for (uint64_t b = 0; b < nb; b++)
        for (uint32_t r = 0; r < 16; r++) {
            const uint8_t *blk = w + (size_t)r * row_bytes + b * f.bytes;
            memcpy(sp + 2 * (16 * b + r), blk, 2);
            if (f.has_min)
                memcpy(mp + 2 * (16 * b + r), blk + 2, 2);
            if (f.form != Q32_BYTE) {
                for (int t = 0; t < 4; t++)
                    memcpy(pg + b * qb + 64 * (size_t)t + 4 * r, blk + f.qs + 4 * t, 4);
                continue;
            }
            int8_t wq[32];
            w32_unpack(type, blk, wq);
            for (int t = 0; t < 8; t++)
                for (int j = 0; j < 4; j++)
                    pg[b * qb + 64 * (size_t)t + 4 * r + j] = (uint8_t)(wq[4 * t + j] + 128);
        }
}

/* ------------------------------------------------------------------ */
/* K-quants against Q8K: exact integers per block                     */

/* The 8 6-bit scales and 8 mins of a Q4_K block (12 bytes): bytes 0-3 hold
 * sc0..3 in their low 6 bits, bytes 4-7 m0..3; bytes 8-11 the low 4 bits of
 * sc4..7 (low nibble) and m4..7 (high nibble), whose top 2 bits are the top
 * 2 bits of bytes 0-3 (sc) and 4-7 (m). */
static inline void k4_scales(const uint8_t *p, uint8_t sc[8], uint8_t m[8])
{
    uint32_t w0, w1, w2;
    memcpy(&w0, p, 4);
    memcpy(&w1, p + 4, 4);
    memcpy(&w2, p + 8, 4);
    uint32_t s03 = w0 & 0x3F3F3F3Fu, m03 = w1 & 0x3F3F3F3Fu;
    uint32_t s47 = (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u);
    uint32_t m47 = ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u);
    memcpy(sc, &s03, 4);
    memcpy(sc + 4, &s47, 4);
    memcpy(m, &m03, 4);
    memcpy(m + 4, &m47, 4);
}

/* ------------------------------------------------------------------ */
/* Q4_K / Q5_K against Q8K: one exact int32 per block for the scaled dot,
 * one for the mins, one f32 chain (see the header) */

static inline size_t k45_bytes(uint32_t type)
{
    return type == GGML_TYPE_Q5_K ? Q5_K_BYTES : Q4_K_BYTES;
}

/* a Q4_K / Q5_K block's 8 sub-block dots P_k (elements 32k..: chunk j =
 * k / 2's low nibbles for even k, high for odd; Q5_K: + 16 x bit k of
 * qh[l]) as V = sum sc_k P_k, and M */
static void k45_block_scalar(uint32_t type, const uint8_t *blk, const ggml_q8k_block *ab,
                             int32_t *V_p, int32_t *M_p)
{
    uint8_t sc[8], m[8];
    k4_scales(blk + 4, sc, m);
    const int q5 = type == GGML_TYPE_Q5_K;
    const uint8_t *qh = blk + 16;
    int32_t V = 0, M = 0;
    for (int k = 0; k < 8; k++) {
        const uint8_t *qs = blk + (q5 ? 48 : 16) + 32 * (k / 2);
        int32_t P = 0;
        for (int l = 0; l < 32; l++) {
            int v = (k & 1) ? qs[l] >> 4 : qs[l] & 0x0F;
            if (q5)
                v |= ((qh[l] >> k) & 1) << 4;
            P += v * ab->qs[32 * k + l];
        }
        V += sc[k] * P;
        M += m[k] * (ab->bsums[2 * k] + ab->bsums[2 * k + 1]);
    }
    *V_p = V;
    *M_p = M;
}

static void k45_row_scalar(uint32_t type, const uint8_t *w, uint64_t nb, const uint8_t *a,
                           size_t as, uint32_t ni, float *out, size_t os)
{
    for (uint32_t i = 0; i < ni; i++) {
        const ggml_q8k_block *ab = (const ggml_q8k_block *)(const void *)(a + i * as);
        float r = 0.0f;
        for (uint64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * k45_bytes(type);
            int32_t V, M;
            k45_block_scalar(type, blk, &ab[b], &V, &M);
            r = fmaf((float)V, h2f(blk) * ab[b].d, r);
            r = fmaf((float)M, -(h2f(blk + 2) * ab[b].d), r);
        }
        out[i * os] = r;
    }
}

/* AVX2 (and VNNI's rows outside the packed groups): per block and item the
 * 8 sub-blocks' maddubs (nibble * a, pairs <= 3810) madd'ed with their
 * scale into 8 int32 lanes, one horizontal sum; the mins by one madd. */
__attribute__((target(AVX2_TARGET))) static void
k45_row_avx2(uint32_t type, const uint8_t *w, uint64_t nb, const uint8_t *a, size_t as, uint32_t ni,
             float *out, size_t os)
{
    const int q5 = type == GGML_TYPE_Q5_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m128 r[4];
    for (uint32_t i = 0; i < 4; i++)
        r[i] = _mm_setzero_ps();
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * k45_bytes(type);
        _mm_prefetch((const char *)blk + QDOT_PF, _MM_HINT_T0);
        uint8_t sc[8], m[8];
        k4_scales(blk + 4, sc, m);
        __m256i wq[8], S[8];
        const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i_u *)(blk + 16))
                              : _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i_u *)(blk + (q5 ? 48 : 16) + 32 * j));
            wq[2 * j] = _mm256_and_si256(q, m4);
            wq[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (q5) /* bit k of qh[l] is bit 4 of sub-block k's element l (pairs <= 7874) */
                for (int h = 0; h < 2; h++)
                    wq[2 * j + h] = _mm256_or_si256(
                        wq[2 * j + h],
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(
                                                               qh, _mm_cvtsi32_si128(2 * j + h)),
                                                           _mm256_set1_epi8(1)),
                                          4));
            S[2 * j] = _mm256_set1_epi16(sc[2 * j]);
            S[2 * j + 1] = _mm256_set1_epi16(sc[2 * j + 1]);
        }
        /* m_k against bsums 2k and 2k + 1 */
        __m128i mv = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i_u *)m));
        const __m256i mm = _mm256_set_m128i(_mm_unpackhi_epi16(mv, mv), _mm_unpacklo_epi16(mv, mv));
        const float dw = _cvtsh_ss(rd16(blk)), dmin = _cvtsh_ss(rd16(blk + 2));
        for (uint32_t i = 0; i < ni; i++) {
            const ggml_q8k_block *ab = (const ggml_q8k_block *)(const void *)(a + i * as) + b;
            __m256i v = _mm256_setzero_si256();
            for (int k = 0; k < 8; k++) {
                __m256i av = _mm256_loadu_si256((const __m256i_u *)(ab->qs + 32 * k));
                v = _mm256_add_epi32(v, _mm256_madd_epi16(_mm256_maddubs_epi16(wq[k], av), S[k]));
            }
            __m256i mk = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i_u *)ab->bsums), mm);
            const float fv = (float)hsum8_avx2(v), fm = (float)hsum8_avx2(mk);
            r[i] = _mm_fmadd_ss(_mm_set_ss(fv), _mm_set_ss(dw * ab->d), r[i]);
            r[i] = _mm_fmadd_ss(_mm_set_ss(fm), _mm_set_ss(-(dmin * ab->d)), r[i]);
        }
    }
    for (uint32_t i = 0; i < ni; i++)
        out[i * os] = _mm_cvtss_f32(r[i]);
}

/* ------------------------------------------------------------------ */
/* Q2_K / Q3_K against Q8K: 16 sub-blocks of 16 with integer scales, so
 * per block the exact int32 V = sum_s sc_s * P_s (and Q2_K's M = sum_s
 * m_s * bsums[s]), one f32 chain as Q4_K's (see the header). Element e =
 * 128n + 32j + l has its 2 low bits at bit 2j of qs[32n + l]; Q3_K's third
 * bit is bit 4n + j of hmask[l] (clear: -4). */

#define K23_ITEMS 16 /* items per decoded block (the row kernels' bound) */

typedef struct {
    int q3;                     /* Q3_K (else Q2_K) */
    size_t bytes, qs, d, dmin;  /* block bytes and offsets */
} k23_fmt_t;

static inline k23_fmt_t k23_fmt(uint32_t type)
{
    return type == GGML_TYPE_Q3_K ? (k23_fmt_t){ 1, Q3_K_BYTES, 32, 108, 0 }
                                  : (k23_fmt_t){ 0, Q2_K_BYTES, 16, 80, 82 };
}

/* the 16 sub-block scales (Q3_K: -32..31) and Q2_K's 16 mins */
static inline void k23_scales(const k23_fmt_t f, const uint8_t *blk, int8_t sc[16], uint8_t m[16])
{
    if (f.q3) {
        ggml_q3k_scales(blk + 96, sc);
        memset(m, 0, 16);
        return;
    }
    for (int s = 0; s < 16; s++) {
        sc[s] = (int8_t)(blk[s] & 0x0F);
        m[s] = (uint8_t)(blk[s] >> 4);
    }
}

static void k23_row_scalar(uint32_t type, const uint8_t *w, uint64_t nb, const uint8_t *a,
                           size_t as, uint32_t ni, float *out, size_t os)
{
    const k23_fmt_t f = k23_fmt(type);
    for (uint32_t i = 0; i < ni; i++) {
        const ggml_q8k_block *ab = (const ggml_q8k_block *)(const void *)(a + i * as);
        float r = 0.0f;
        for (uint64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * f.bytes, *qs = blk + f.qs;
            int8_t sc[16];
            uint8_t m[16];
            k23_scales(f, blk, sc, m);
            int32_t V = 0, M = 0;
            for (int s = 0; s < 16; s++) {
                int32_t P = 0;
                for (int t = 0; t < 16; t++) {
                    const int e = 16 * s + t, n = e / 128, j = (e / 32) % 4, l = e % 32;
                    int v = (qs[32 * n + l] >> (2 * j)) & 3;
                    if (f.q3 && !((blk[l] >> (4 * n + j)) & 1))
                        v -= 4;
                    P += v * ab[b].qs[e];
                }
                V += sc[s] * P;
                M += m[s] * ab[b].bsums[s];
            }
            r = fmaf((float)V, h2f(blk + f.d) * ab[b].d, r);
            if (!f.q3)
                r = fmaf((float)M, -(h2f(blk + f.dmin) * ab[b].d), r);
        }
        out[i * os] = r;
    }
}

/* AVX2 (and VNNI's rows outside the packed groups): per block the 8 chunks of 32 as unsigned bytes (Q2_K
 * 0..3; Q3_K 0..7, the value + 4) decoded once for up to K23_ITEMS items;
 * per item maddubs (pairs <= 1778) madd'ed with the chunk's 2 sub-block
 * scales, one horizontal sum; Q3_K's -4 and Q2_K's mins by one madd of
 * the bsums each. */
__attribute__((target(AVX2_TARGET))) static void
k23_row_avx2(uint32_t type, const uint8_t *w, uint64_t nb, const uint8_t *a, size_t as, uint32_t ni,
             float *out, size_t os)
{
    const k23_fmt_t f = k23_fmt(type);
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m128 r[K23_ITEMS];
    for (uint32_t i = 0; i < ni; i++)
        r[i] = _mm_setzero_ps();
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * f.bytes;
        _mm_prefetch((const char *)blk + QDOT_PF, _MM_HINT_T0);
        int8_t sc[16];
        uint8_t m[16];
        if (f.q3) {
            ggml_q3k_scales(blk + 96, sc);
        } else { /* low nibbles: scales, high: mins */
            const __m128i x = _mm_loadu_si128((const __m128i_u *)blk);
            _mm_storeu_si128((__m128i_u *)sc, _mm_and_si128(x, _mm_set1_epi8(0x0F)));
            _mm_storeu_si128((__m128i_u *)m,
                             _mm_and_si128(_mm_srli_epi16(x, 4), _mm_set1_epi8(0x0F)));
        }
        /* the 16 scales as int16, each 128-bit half broadcast: chunk c's
         * 2 scales by one byte shuffle */
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i_u *)sc));
        const __m256i slo = _mm256_permute2x128_si256(s16, s16, 0x00),
                      shi = _mm256_permute2x128_si256(s16, s16, 0x11);
        __m256i wq[8], S[8];
        const __m256i hm = f.q3 ? _mm256_loadu_si256((const __m256i_u *)blk) : _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
            const __m256i q = _mm256_loadu_si256((const __m256i_u *)(blk + f.qs + 32 * n));
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const int c = 4 * n + j;
                __m256i u = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), m3);
                if (f.q3)
                    u = _mm256_or_si256(
                        u, _mm256_slli_epi16(
                               _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(c)), one),
                               2));
                wq[c] = u;
                const char k0 = (char)(4 * j), k1 = (char)(4 * j + 1), k2 = (char)(4 * j + 2),
                           k3 = (char)(4 * j + 3);
                S[c] = _mm256_shuffle_epi8(
                    n ? shi : slo, _mm256_setr_epi8(k0, k1, k0, k1, k0, k1, k0, k1, k0, k1, k0, k1, k0,
                                                    k1, k0, k1, k2, k3, k2, k3, k2, k3, k2, k3, k2, k3,
                                                    k2, k3, k2, k3, k2, k3));
            }
        }
        /* Q3_K: -4 x sc_s against bsums[s]; Q2_K: m_s against bsums[s] */
        const __m256i cs = f.q3 ? _mm256_mullo_epi16(_mm256_cvtepi8_epi16(
                                                         _mm_loadu_si128((const __m128i_u *)sc)),
                                                     _mm256_set1_epi16(-4))
                                : _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i_u *)m));
        const float dw = _cvtsh_ss(rd16(blk + f.d)), dmin = f.q3 ? 0.0f : _cvtsh_ss(rd16(blk + f.dmin));
        for (uint32_t i = 0; i < ni; i++) {
            const ggml_q8k_block *ab = (const ggml_q8k_block *)(const void *)(a + i * as) + b;
            __m256i v = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                __m256i av = _mm256_loadu_si256((const __m256i_u *)(ab->qs + 32 * c));
                v = _mm256_add_epi32(v, _mm256_madd_epi16(_mm256_maddubs_epi16(wq[c], av), S[c]));
            }
            const __m256i ck = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i_u *)ab->bsums), cs);
            if (f.q3) {
                const float fv = (float)hsum8_avx2(_mm256_add_epi32(v, ck));
                r[i] = _mm_fmadd_ss(_mm_set_ss(fv), _mm_set_ss(dw * ab->d), r[i]);
            } else {
                const float fv = (float)hsum8_avx2(v), fm = (float)hsum8_avx2(ck);
                r[i] = _mm_fmadd_ss(_mm_set_ss(fv), _mm_set_ss(dw * ab->d), r[i]);
                r[i] = _mm_fmadd_ss(_mm_set_ss(fm), _mm_set_ss(-(dmin * ab->d)), r[i]);
            }
        }
    }
    for (uint32_t i = 0; i < ni; i++)
        out[i * os] = _mm_cvtss_f32(r[i]);
}

/* VNNI on the packed Q4_K layout: per group of 16 rows and block,
 *   [j < 4][t < 8][row][4 bytes]  chunk j's quad t (low nibbles: elements
 *                                 64j + 4t.., high: 64j + 32 + 4t..)
 *   [k < 8][row] sc, then [k < 8][row] m   (6-bit, one byte each)
 *   [row] d, then [row] dmin                (f16)
 * (2368 bytes, a multiple of 64). Half a sub-block (16 elements: 4
 * vpdpbusd) sums to at most 16 * 15 * 127 < 2^15, so one vpdpwssd applies
 * the sub-block scale (in the low 16 bits of each lane, 0 above); the mins
 * by vpdpwssd of (m_k, m_k) against the item's bsums pairs. */
#define Q4K_PK_BYTES 2368

/* a K-quant block into 16 rows' chains: r = fma(V, d_w * d_a, r), then
 * r = fma(M, dmin_w * -d_a, r) */
__attribute__((target(VNNI_TARGET))) static inline __m512 kq_fold_vnni(__m512 r, __m512i V, __m512i M,
                                                                       __m512 dw, __m512 dm, float d)
{
    r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(V), _mm512_mul_ps(dw, _mm512_set1_ps(d)), r);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(dm, _mm512_set1_ps(-d)), r);
}
#define Q5K_PK_BYTES (Q4K_PK_BYTES + 512) /* + [t < 8][row] qh[4t..4t+3] */
#define Q4K_PK_ITEMS 4

__attribute__((target(VNNI_TARGET))) static inline __attribute__((always_inline)) void
k45_pk_vnni_t(const uint32_t type, const uint8_t *pg, uint64_t nb, const uint8_t *a, size_t as,
              float *out, size_t os, const int NI)
{
    const int q5 = type == GGML_TYPE_Q5_K;
    const size_t pkb = q5 ? Q5K_PK_BYTES : Q4K_PK_BYTES;
    const __m512i m4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
    __m512 r[Q4K_PK_ITEMS];
#pragma GCC unroll 4
    for (int i = 0; i < NI; i++)
        r[i] = _mm512_setzero_ps();
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *p = pg + b * pkb;
        const ggml_q8k_block *ab[Q4K_PK_ITEMS]; /* each item's block b */
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++)
            ab[i] = (const ggml_q8k_block *)(const void *)(a + i * as) + b;
        __m512i V[Q4K_PK_ITEMS];
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++)
            V[i] = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            _mm_prefetch((const char *)p + QDOT_PF + 512 * j, _MM_HINT_T0);
            const __m512i S0 = _mm512_cvtepu8_epi32(
                _mm_loadu_si128((const __m128i_u *)(p + 2048 + 16 * (2 * j))));
            const __m512i S1 = _mm512_cvtepu8_epi32(
                _mm_loadu_si128((const __m128i_u *)(p + 2048 + 16 * (2 * j + 1))));
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m512i lo[4], hi[4];
#pragma GCC unroll 4
                for (int t = 0; t < 4; t++) {
                    __m512i x = _mm512_loadu_si512(p + 512 * j + 64 * (4 * h + t));
                    lo[t] = _mm512_and_si512(x, m4);
                    hi[t] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
                    if (q5) { /* bit 2j / 2j + 1 of qh: bit 4 of the low / high value */
                        __m512i qh = _mm512_loadu_si512(p + Q4K_PK_BYTES + 64 * (4 * h + t));
                        lo[t] = _mm512_or_si512(
                            lo[t], _mm512_slli_epi16(
                                       _mm512_and_si512(_mm512_srl_epi16(
                                                            qh, _mm_cvtsi32_si128(2 * j)), one), 4));
                        hi[t] = _mm512_or_si512(
                            hi[t], _mm512_slli_epi16(
                                       _mm512_and_si512(_mm512_srl_epi16(
                                                            qh, _mm_cvtsi32_si128(2 * j + 1)), one),
                                       4));
                    }
                }
#pragma GCC unroll 4
                for (int i = 0; i < NI; i++) {
                    const int32_t *g = (const int32_t *)(const void *)ab[i]->qs + 16 * j + 4 * h;
                    if (!q5) { /* 16 products of a nibble: < 2^15 */
                        __m512i pl = _mm512_setzero_si512(), ph = _mm512_setzero_si512();
#pragma GCC unroll 4
                        for (int t = 0; t < 4; t++) {
                            pl = _mm512_dpbusd_epi32(pl, lo[t], _mm512_set1_epi32(g[t]));
                            ph = _mm512_dpbusd_epi32(ph, hi[t], _mm512_set1_epi32(g[8 + t]));
                        }
                        V[i] = _mm512_dpwssd_epi32(V[i], pl, S0);
                        V[i] = _mm512_dpwssd_epi32(V[i], ph, S1);
                        continue;
                    }
                    /* 5-bit values: 8 products (31 * 127 * 8 < 2^15) per vpdpwssd */
#pragma GCC unroll 2
                    for (int t = 0; t < 4; t += 2) {
                        __m512i pl = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[t],
                                                         _mm512_set1_epi32(g[t]));
                        __m512i ph = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[t],
                                                         _mm512_set1_epi32(g[8 + t]));
                        pl = _mm512_dpbusd_epi32(pl, lo[t + 1], _mm512_set1_epi32(g[t + 1]));
                        ph = _mm512_dpbusd_epi32(ph, hi[t + 1], _mm512_set1_epi32(g[8 + t + 1]));
                        V[i] = _mm512_dpwssd_epi32(V[i], pl, S0);
                        V[i] = _mm512_dpwssd_epi32(V[i], ph, S1);
                    }
                }
            }
        }
        __m512i M[Q4K_PK_ITEMS];
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++)
            M[i] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m512i mk = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i_u *)(p + 2176 + 16 * k)));
            mk = _mm512_or_si512(mk, _mm512_slli_epi32(mk, 16));
#pragma GCC unroll 4
            for (int i = 0; i < NI; i++) {
                int32_t pair;
                memcpy(&pair, ab[i]->bsums + 2 * k, 4);
                M[i] = _mm512_dpwssd_epi32(M[i], mk, _mm512_set1_epi32(pair));
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i_u *)(p + 2304)));
        const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i_u *)(p + 2336)));
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++)
            r[i] = kq_fold_vnni(r[i], V[i], M[i], dw, dm, ab[i]->d);
    }
#pragma GCC unroll 4
    for (int i = 0; i < NI; i++)
        _mm512_storeu_ps(out + i * os, r[i]);
}

/* the K-quant packed kernels' instances for 1..Q4K_PK_ITEMS items: TN_pk[] */
#define KQ_PK(KERN, TN, T, NI)                                                                 \
    __attribute__((target(VNNI_TARGET))) static void TN##_pk_##NI(                            \
        const uint8_t *pg, uint64_t nb, const uint8_t *a, size_t as, float *out, size_t os)    \
    {                                                                                          \
        KERN(T, pg, nb, a, as, out, os, NI);                                                   \
    }
#define KQ_PKS(KERN, TN, T)                                                                    \
    KQ_PK(KERN, TN, T, 1) KQ_PK(KERN, TN, T, 2) KQ_PK(KERN, TN, T, 3) KQ_PK(KERN, TN, T, 4)    \
    static const q32_pk_fn TN##_pk[Q4K_PK_ITEMS + 1] = { NULL, TN##_pk_1, TN##_pk_2,           \
                                                         TN##_pk_3, TN##_pk_4 };
KQ_PKS(k45_pk_vnni_t, q4k, GGML_TYPE_Q4_K)
KQ_PKS(k45_pk_vnni_t, q5k, GGML_TYPE_Q5_K)

/* VNNI on the packed Q2_K / Q3_K layout: per group of 16 rows and block,
 *   qs  [n < 2][t < 8][row][4 bytes]  qs[32n + 4t..]: bits 2j of its bytes
 *                                     are elements 128n + 32j + 4t..
 *   hm  [t < 8][row][4 bytes]         Q3_K: hmask[4t..]
 *   sc  [s < 16][row]                 scales (Q3_K: -32..31)
 *   m   [s < 16][row]                 Q2_K: mins
 *   d, dmin [row]                     f16
 * (sizes padded to 64 bytes). A sub-block's 16 products of an unsigned
 * value (Q2_K 0..3, Q3_K 0..7 = the value + 4) sum to at most 16 * 7 *
 * 127 < 2^15, so one vpdpwssd applies its scale; Q3_K's -4 and Q2_K's mins
 * by vpdpwssd of scale / min pairs against the item's bsums pairs. */
typedef struct {
    size_t size, qs, hm, sc, m, d, dmin;
} k23_pk_t;

static inline k23_pk_t k23_pk(uint32_t type)
{
    return type == GGML_TYPE_Q3_K ? (k23_pk_t){ 1856, 0, 1024, 1536, 0, 1792, 0 }
                                  : (k23_pk_t){ 1600, 0, 0, 1024, 1280, 1536, 1568 };
}

/* 16 int32 lanes of 16 rows' byte at p, in the low 16 bits (0 above) */
__attribute__((target(VNNI_TARGET))) static inline __m512i k23_lo16(const uint8_t *p, int sgn)
{
    const __m128i x = _mm_loadu_si128((const __m128i_u *)p);
    return sgn ? _mm512_and_si512(_mm512_cvtepi8_epi32(x), _mm512_set1_epi32(0xFFFF))
               : _mm512_cvtepu8_epi32(x);
}

__attribute__((target(VNNI_TARGET))) static inline __attribute__((always_inline)) void
k23_pk_vnni_t(const uint32_t type, const uint8_t *pg, uint64_t nb, const uint8_t *a, size_t as,
              float *out, size_t os, const int NI)
{
    const int q3 = type == GGML_TYPE_Q3_K;
    const k23_pk_t L = k23_pk(type);
    const __m512i m3 = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1);
    __m512 r[Q4K_PK_ITEMS];
#pragma GCC unroll 4
    for (int i = 0; i < NI; i++)
        r[i] = _mm512_setzero_ps();
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *p = pg + b * L.size;
        const ggml_q8k_block *ab[Q4K_PK_ITEMS];
        __m512i V[Q4K_PK_ITEMS], M[Q4K_PK_ITEMS];
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++) {
            ab[i] = (const ggml_q8k_block *)(const void *)(a + i * as) + b;
            V[i] = _mm512_setzero_si512();
            M[i] = _mm512_setzero_si512();
        }
        for (int n = 0; n < 2; n++) {
            _mm_prefetch((const char *)p + QDOT_PF + 512 * n, _MM_HINT_T0);
            _mm_prefetch((const char *)p + QDOT_PF + 512 * n + 256, _MM_HINT_T0);
            __m512i x[8];
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++)
                x[t] = _mm512_loadu_si512(p + L.qs + 512 * n + 64 * t);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const int s0 = 8 * n + 2 * j;
                const __m512i S0 = k23_lo16(p + L.sc + 16 * s0, q3);
                const __m512i S1 = k23_lo16(p + L.sc + 16 * (s0 + 1), q3);
                __m512i u[8];
#pragma GCC unroll 8
                for (int t = 0; t < 8; t++) {
                    u[t] = _mm512_and_si512(_mm512_srli_epi16(x[t], 2 * j), m3);
                    if (q3) /* bit 4n + j of hmask: + 4 */
                        u[t] = _mm512_or_si512(
                            u[t], _mm512_slli_epi16(
                                      _mm512_and_si512(
                                          _mm512_srli_epi16(_mm512_loadu_si512(p + L.hm + 64 * t),
                                                            4 * n + j),
                                          one),
                                      2));
                }
#pragma GCC unroll 4
                for (int i = 0; i < NI; i++) {
                    const int32_t *g = (const int32_t *)(const void *)ab[i]->qs + 32 * n + 8 * j;
                    __m512i pl = _mm512_setzero_si512(), ph = _mm512_setzero_si512();
#pragma GCC unroll 4
                    for (int t = 0; t < 4; t++) {
                        pl = _mm512_dpbusd_epi32(pl, u[t], _mm512_set1_epi32(g[t]));
                        ph = _mm512_dpbusd_epi32(ph, u[t + 4], _mm512_set1_epi32(g[t + 4]));
                    }
                    V[i] = _mm512_dpwssd_epi32(V[i], pl, S0);
                    V[i] = _mm512_dpwssd_epi32(V[i], ph, S1);
                }
            }
        }
        /* Q3_K: sum sc_s bsums[s] (times -4 below); Q2_K: M = sum m_s bsums[s] */
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const uint8_t *cp = p + (q3 ? L.sc : L.m) + 32 * k;
            const __m512i ck = _mm512_or_si512(k23_lo16(cp, q3),
                                               _mm512_slli_epi32(k23_lo16(cp + 16, q3), 16));
#pragma GCC unroll 4
            for (int i = 0; i < NI; i++) {
                int32_t pair;
                memcpy(&pair, ab[i]->bsums + 2 * k, 4);
                M[i] = _mm512_dpwssd_epi32(M[i], ck, _mm512_set1_epi32(pair));
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i_u *)(p + L.d)));
        const __m512 dm = q3 ? _mm512_setzero_ps()
                             : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i_u *)(p + L.dmin)));
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++) {
            const float d = ab[i]->d;
            if (q3) {
                const __m512i v = _mm512_sub_epi32(V[i], _mm512_slli_epi32(M[i], 2));
                r[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(dw, _mm512_set1_ps(d)),
                                       r[i]);
                continue;
            }
            r[i] = kq_fold_vnni(r[i], V[i], M[i], dw, dm, d);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NI; i++)
        _mm512_storeu_ps(out + i * os, r[i]);
}

KQ_PKS(k23_pk_vnni_t, q2k, GGML_TYPE_Q2_K)
KQ_PKS(k23_pk_vnni_t, q3k, GGML_TYPE_Q3_K)

static void k23_pack_group(uint32_t type, const uint8_t *w, size_t row_bytes, uint64_t nb,
                           uint8_t *pg)
{
    const k23_fmt_t f = k23_fmt(type);
    const k23_pk_t L = k23_pk(type);
    for (uint64_t b = 0; b < nb; b++) {
        uint8_t *p = pg + b * L.size;
        memset(p, 0, L.size);
        for (uint32_t r = 0; r < 16; r++) {
            const uint8_t *blk = w + (size_t)r * row_bytes + b * f.bytes;
            int8_t sc[16];
            uint8_t m[16];
            k23_scales(f, blk, sc, m);
            for (int s = 0; s < 16; s++) {
                p[L.sc + 16 * s + r] = (uint8_t)sc[s];
                if (!f.q3)
                    p[L.m + 16 * s + r] = m[s];
            }
            memcpy(p + L.d + 2 * r, blk + f.d, 2);
            if (!f.q3)
                memcpy(p + L.dmin + 2 * r, blk + f.dmin, 2);
            for (int n = 0; n < 2; n++)
                for (int t = 0; t < 8; t++)
                    memcpy(p + L.qs + 512 * n + 64 * t + 4 * r, blk + f.qs + 32 * n + 4 * t, 4);
            if (f.q3)
                for (int t = 0; t < 8; t++)
                    memcpy(p + L.hm + 64 * t + 4 * r, blk + 4 * t, 4);
        }
    }
}

static void k45_pack_group(uint32_t type, const uint8_t *w, size_t row_bytes, uint64_t nb,
                           uint8_t *pg)
{
    const int q5 = type == GGML_TYPE_Q5_K;
    for (uint64_t b = 0; b < nb; b++) {
        uint8_t *p = pg + b * (q5 ? Q5K_PK_BYTES : Q4K_PK_BYTES);
        for (uint32_t r = 0; r < 16; r++) {
            const uint8_t *blk = w + (size_t)r * row_bytes + b * k45_bytes(type);
            uint8_t sc[8], m[8];
            k4_scales(blk + 4, sc, m);
            for (int k = 0; k < 8; k++) {
                p[2048 + 16 * k + r] = sc[k];
                p[2176 + 16 * k + r] = m[k];
            }
            memcpy(p + 2304 + 2 * r, blk, 2);
            memcpy(p + 2336 + 2 * r, blk + 2, 2);
            for (int j = 0; j < 4; j++)
                for (int t = 0; t < 8; t++)
                    memcpy(p + 512 * j + 64 * t + 4 * r, blk + (q5 ? 48 : 16) + 32 * j + 4 * t, 4);
            if (q5)
                for (int t = 0; t < 8; t++)
                    memcpy(p + Q4K_PK_BYTES + 64 * t + 4 * r, blk + 16 + 4 * t, 4);
        }
    }
}

/* ---- dispatch ---- */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C); /* clang lacks "f16c" */
}

static const char *amx_why = "not probed";

static int cpu_best(void)
{
    static int best = -1;
    if (best >= 0)
        return best;
    __builtin_cpu_init();
    int r = GGML_QDOT_SCALAR;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c()) {
        r = GGML_QDOT_AVX2;
        if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512f"))
            r = GGML_QDOT_VNNI;
    }
    amx_why = r == GGML_QDOT_VNNI ? ggml_qdot_amx_probe() : "no AVX-512 VNNI (the AMX kernels fold with it)";
    if (!amx_why)
        r = GGML_QDOT_AMX;
    best = r;
    return r;
}

const char *ggml_qdot_amx_why(void)
{
    cpu_best();
    return amx_why;
}

const char *ggml_qdot_path_name(int path)
{
    static const char *const names[] = { "scalar", "avx2", "vnni", "amx" };
    return path >= 0 && path <= GGML_QDOT_AMX ? names[path] : "off";
}

static int g_path = -1;

/* PD_QDOT=scalar|avx2|vnni|amx: a cap for the whole process, read once
 * (anything else: no cap; "off" is ll_kern.c's) */
static int env_cap(void)
{
    static int cap = -1;
    if (cap < 0) {
        const char *e = getenv("PD_QDOT");
        int c = GGML_QDOT_AMX;
        for (int p = GGML_QDOT_SCALAR; e && p <= GGML_QDOT_AMX; p++)
            if (strcmp(e, ggml_qdot_path_name(p)) == 0)
                c = p;
        cap = c;
    }
    return cap;
}

int ggml_qdot_set_path(int path)
{
    int best = cpu_best();
    if (best > env_cap())
        best = env_cap();
    g_path = path < best ? (path < 0 ? 0 : path) : best;
    return g_path;
}

/* path, capped by the CPU and PD_QDOT */
static int path_cap(int path)
{
    int best = cpu_best();
    if (best > env_cap())
        best = env_cap();
    return path < best ? path : best;
}

int ggml_qdot_path(void)
{
    if (g_path < 0)
        ggml_qdot_set_path(GGML_QDOT_AMX);
    return g_path;
}

pd_status_t ggml_qdot_rows(int path, uint32_t type, const uint8_t *w, size_t row_bytes,
                           uint32_t n_rows, uint64_t n, const void *a, size_t a_stride,
                           uint32_t n_items, float *out, size_t out_stride)
{
    int act = ggml_qdot_act(type);
    uint32_t bs = ggml_qdot_block(type);
    if (act == GGML_QACT_NONE || n == 0 || n % bs)
        return PD_ERR_UNSUPPORTED;
    path = path_cap(path);
    const uint64_t nb = n / bs;
    const uint8_t *ab = a;
    /* tiles of 16 weight rows (in L1) x 4 items: each weight row is read
     * from memory once, the activations once per 16 rows */
    /* VNNI Q6_K with more than 4 items: each weight block decoded once per
     * GGML_QDOT_Q6K_WIDE items (same per-item operations, same bits) */
    const int wide = type == GGML_TYPE_Q6_K && path >= GGML_QDOT_VNNI && n_items > 4;
    const int k23 = type == GGML_TYPE_Q2_K || type == GGML_TYPE_Q3_K;
    const uint32_t step = wide ? GGML_QDOT_Q6K_WIDE : k23 ? K23_ITEMS : 4;
    for (uint32_t r0 = 0; r0 < n_rows; r0 += 16) {
        uint32_t r1 = n_rows - r0 < 16 ? n_rows : r0 + 16;
        uint32_t ni;
        for (uint32_t i0 = 0; i0 < n_items; i0 += ni) {
            ni = n_items - i0 < step ? n_items - i0 : step;
            const uint8_t *ai = ab + (size_t)i0 * a_stride;
            if (wide) {
                ggml_qdot_q6k_wide(w + (size_t)r0 * row_bytes, row_bytes, r1 - r0, nb, ai, a_stride,
                                   ni, out + r0 + (size_t)i0 * out_stride, out_stride);
                continue;
            }
            for (uint32_t r = r0; r < r1; r++) {
                const uint8_t *row = w + (size_t)r * row_bytes;
                float *oi = out + r + (size_t)i0 * out_stride;
                if (k23) {
                    if (path >= GGML_QDOT_AVX2)
                        k23_row_avx2(type, row, nb, ai, a_stride, ni, oi, out_stride);
                    else
                        k23_row_scalar(type, row, nb, ai, a_stride, ni, oi, out_stride);
                } else if (type == GGML_TYPE_Q6_K) {
                    ggml_qdot_q6k_row(path, row, nb, ai, a_stride, ni, oi, out_stride);
                } else if (act == GGML_QACT_Q8K) { /* Q4_K / Q5_K; VNNI: packed layout */
                    if (path >= GGML_QDOT_AVX2)
                        k45_row_avx2(type, row, nb, ai, a_stride, ni, oi, out_stride);
                    else
                        k45_row_scalar(type, row, nb, ai, a_stride, ni, oi, out_stride);
                } else if (path >= GGML_QDOT_AVX2) { /* VNNI: on the packed layout */
                    q32_row_avx2(type, row, nb, ai, a_stride, ni, oi, out_stride);
                } else {
                    for (uint32_t i = 0; i < ni; i++)
                        oi[i * out_stride] = q32_dot_scalar(type, row, nb, ai + i * a_stride);
                }
            }
        }
    }
    return PD_OK;
}

/* bytes of one packed group of 16 rows of n elements, 64-byte aligned so
 * that every block's quads start a cache line; 0 = no packed kernel */
static size_t pk_group_bytes(uint32_t type, uint64_t n)
{
    const uint32_t bs = ggml_qdot_block(type);
    if (n == 0 || bs == 0 || n % bs)
        return 0;
    switch (type) {
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_IQ4_NL: /* quads, d (and m) planes */
        return ((n / bs) * (q32_pk_qbytes(type) + 32 * (1 + (size_t)q32_fmt(type).has_min)) + 63) &
               ~(size_t)63;
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K: return (size_t)(n / bs) * k23_pk(type).size;
    case GGML_TYPE_Q4_K: return (size_t)(n / bs) * Q4K_PK_BYTES;
    case GGML_TYPE_Q5_K: return (size_t)(n / bs) * Q5K_PK_BYTES;
    default: return 0;
    }
}

size_t ggml_qdot_pack_bytes(uint32_t type, uint32_t n_rows, uint64_t n)
{
    return (size_t)(n_rows / 16) * pk_group_bytes(type, n);
}

pd_status_t ggml_qdot_pack(uint32_t type, const uint8_t *w, size_t row_bytes, uint32_t n_rows,
                           uint64_t n, uint8_t *out)
{
    const size_t gb = pk_group_bytes(type, n);
    if (gb == 0)
        return PD_ERR_UNSUPPORTED;
    const uint64_t nb = n / ggml_qdot_block(type);
    for (uint32_t g = 0; g < n_rows / 16; g++) {
        const uint8_t *wg = w + (size_t)16 * g * row_bytes;
        if (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K)
            k45_pack_group(type, wg, row_bytes, nb, out + g * gb);
        else if (type == GGML_TYPE_Q2_K || type == GGML_TYPE_Q3_K)
            k23_pack_group(type, wg, row_bytes, nb, out + g * gb);
        else
            q32_pack_group(type, wg, row_bytes, nb, out + g * gb);
    }
    return PD_OK;
}

pd_status_t ggml_qdot_rows_packed(int path, uint32_t type, const uint8_t *w, size_t row_bytes,
                                  const uint8_t *pk, uint32_t r0, uint32_t r1, uint64_t n,
                                  const void *a, size_t a_stride, uint32_t n_items, float *out,
                                  size_t out_stride)
{
    if (r1 < r0)
        return PD_ERR_BAD_INPUT;
    path = path_cap(path);
    /* the full groups of 16 inside [r0, r1) */
    const uint32_t g0 = (r0 + 15) / 16, g1 = r1 / 16;
    const size_t gstride = pk_group_bytes(type, n);
    if (!pk || path < GGML_QDOT_VNNI || gstride == 0 || g0 >= g1)
        return ggml_qdot_rows(path, type, w + (size_t)r0 * row_bytes, row_bytes, r1 - r0, n, a,
                              a_stride, n_items, out, out_stride);
    const uint64_t nb = n / ggml_qdot_block(type);
    const q32_pk_fn *tab;
    /* AMX for the full 16s of items, VNNI for the rest */
    const ggml_qdot_amx_fn amx = path == GGML_QDOT_AMX ? ggml_qdot_amx_kernel(type) : NULL;
    switch (type) {
    case GGML_TYPE_Q8_0: tab = q32_pk_q8; break;
    case GGML_TYPE_Q4_0: tab = q32_pk_q4; break;
    case GGML_TYPE_Q4_1: tab = q32_pk_q41; break;
    case GGML_TYPE_Q5_0: tab = q32_pk_q50; break;
    case GGML_TYPE_Q5_1: tab = q32_pk_q51; break;
    case GGML_TYPE_IQ4_NL: tab = q32_pk_iq4; break;
    case GGML_TYPE_Q2_K: tab = q2k_pk; break;
    case GGML_TYPE_Q3_K: tab = q3k_pk; break;
    case GGML_TYPE_Q4_K: tab = q4k_pk; break;
    default: tab = q5k_pk; break;
    }
    const uint32_t step = ggml_qdot_act(type) == GGML_QACT_Q8K ? Q4K_PK_ITEMS : Q32_PK_ITEMS;
    pd_status_t st = PD_OK;
    if (r0 < 16 * g0) /* leading rows of a group the range cuts */
        st = ggml_qdot_rows(path, type, w + (size_t)r0 * row_bytes, row_bytes, 16 * g0 - r0, n,
                            a, a_stride, n_items, out, out_stride);
    const uint32_t n16 = amx ? n_items / GGML_QDOT_AMX_ITEMS * GGML_QDOT_AMX_ITEMS : 0;
    if (n16) {
        ggml_qdot_amx_thread_init();
        amx(pk + g0 * gstride, gstride, g1 - g0, nb, a, a_stride, n16, out + (16 * g0 - r0),
            out_stride);
    }
    for (uint32_t g = g0; g < g1 && st == PD_OK; g++) {
        uint32_t ni;
        for (uint32_t i0 = n16; i0 < n_items; i0 += ni) {
            ni = n_items - i0 < step ? n_items - i0 : step;
            tab[ni](pk + g * gstride, nb, (const uint8_t *)a + (size_t)i0 * a_stride, a_stride,
                    out + (16 * g - r0) + (size_t)i0 * out_stride, out_stride);
        }
    }
    if (st == PD_OK && 16 * g1 < r1) /* trailing rows */
        st = ggml_qdot_rows(path, type, w + (size_t)16 * g1 * row_bytes, row_bytes, r1 - 16 * g1,
                            n, a, a_stride, n_items, out + (16 * g1 - r0), out_stride);
    return st;
}

int8_t ggml_qdot_act_q(int act, const void *a, uint64_t n, uint64_t e)
{
    (void)n;
    if (act == GGML_QACT_Q8A)
        return ((const int8_t *)a)[e];
    return ((const ggml_q8k_block *)a)[e / GGML_Q8K_BLOCK].qs[e % GGML_Q8K_BLOCK];
}

float ggml_qdot_act_scale(int act, const void *a, uint64_t n, uint64_t e)
{
    if (act == GGML_QACT_Q8A)
        return Q8A_D(a, n / GGML_Q8A_BLOCK)[e / GGML_Q8A_BLOCK];
    return ((const ggml_q8k_block *)a)[e / GGML_Q8K_BLOCK].d;
}

pd_status_t ggml_qdot_row(uint32_t type, const uint8_t *w, const void *a, uint64_t n, float *out)
{
    return ggml_qdot_rows(ggml_qdot_path(), type, w, 0, 1, n, a, 0, 1, out, 0);
}
