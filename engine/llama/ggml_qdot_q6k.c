/* ggml_qdot_q6k.c - the Q6_K integer-dot kernels (lane form, scalar /
 * AVX2 / VNNI; ggml_qdot.h has the canonical order), moved out of
 * ggml_qdot.c (issue 33's file-size rule). */
#include <immintrin.h>
#include <math.h>
#include <string.h>
#include "ggml_qdot_int.h"

/* ---- Q6_K, lane form (see the header): per block 16 int32 lanes V[l] of
 * scale x 4-product sums, accumulated in f32 lanes F[l] with
 * fma(V, d_w * d_a); r = tree16(F). */

static float tree8_f(const float v[8])
{
    float s4[4], s2[2];
    for (int l = 0; l < 4; l++)
        s4[l] = v[l] + v[l + 4];
    for (int l = 0; l < 2; l++)
        s2[l] = s4[l] + s4[l + 2];
    return s2[0] + s2[1];
}

static float tree16_f(const float F[16])
{
    float v[8];
    for (int l = 0; l < 8; l++)
        v[l] = F[l] + F[l + 8];
    return tree8_f(v);
}

/* the 256 signed Q6_K weights (q - 32) of a block, element order */
static void q6k_unpack(const uint8_t *blk, int8_t *w)
{
    const uint8_t *ql = blk, *qh = blk + 128;
    for (int n = 0; n < 2; n++) {
        for (int l = 0; l < 32; l++) {
            w[128 * n + l] = (int8_t)((int)((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32);
            w[128 * n + l + 32] = (int8_t)((int)((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32);
            w[128 * n + l + 64] = (int8_t)((int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            w[128 * n + l + 96] = (int8_t)((int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
        ql += 64;
        qh += 32;
    }
}

static void q6k_row_scalar(const uint8_t *w, uint64_t nb, const uint8_t *a, size_t as,
                           uint32_t ni, float *out, size_t os)
{
    for (uint32_t i = 0; i < ni; i++) {
        const ggml_q8k_block *ab = (const ggml_q8k_block *)(const void *)(a + i * as);
        float F[16] = { 0 };
        for (uint64_t b = 0; b < nb; b++) {
            const int8_t *q8 = ab[b].qs;
            int8_t wv[256];
            const uint8_t *blk = w + b * Q6_K_BYTES;
            q6k_unpack(blk, wv);
            const float s = h2f(blk + 208) * ab[b].d;
            for (int l = 0; l < 16; l++) {
                int32_t V = 0;
                for (int j = 0; j < 4; j++) {
                    int e = 64 * j + 4 * l;
                    int32_t P = 0;
                    for (int t = 0; t < 4; t++)
                        P += wv[e + t] * q8[e + t];
                    V += ((const int8_t *)(blk + 192))[4 * j + l / 4] * P;
                }
                F[l] = fmaf((float)V, s, F[l]);
            }
        }
        out[i * os] = tree16_f(F);
    }
}

/* scalar product of two floats as one SSE op the compiler cannot fuse */
__attribute__((target(AVX2_TARGET))) static inline __m256 bmul(float x, float y)
{
    return _mm256_broadcastss_ps(_mm_mul_ss(_mm_set_ss(x), _mm_set_ss(y)));
}

/* ---- AVX2: 16 lanes as two ymm (lo = lanes 0-7, hi = 8-15) ---- */
__attribute__((target(AVX2_TARGET))) static inline __attribute__((always_inline)) void
q6k_row_avx2_t(const uint8_t *w, uint64_t nb, const uint8_t *a, size_t as,
              float *out, size_t os, const int NI)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256 Flo[4], Fhi[4];
#pragma GCC unroll 4
    for (int i = 0; i < NI; i++)
        Flo[i] = Fhi[i] = _mm256_setzero_ps();
    for (uint64_t b = 0; b < nb; b++) {
        __m256i wq[8], S[8];  /* 32-element groups (element order), their scales */
        __m256i aw[8], sg[8]; /* |w| and w for the sign trick */
        float dw;
        {
            const uint8_t *blk = w + b * Q6_K_BYTES;
            _mm_prefetch((const char *)blk + QDOT_PF, _MM_HINT_T0);
            const int8_t *sc = (const int8_t *)(blk + 192);
            dw = _cvtsh_ss(rd16(blk + 208));
            for (int n = 0; n < 2; n++) {
                const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
                __m256i l0 = _mm256_loadu_si256((const __m256i_u *)ql);
                __m256i l1 = _mm256_loadu_si256((const __m256i_u *)(ql + 32));
                __m256i h = _mm256_loadu_si256((const __m256i_u *)qh);
                wq[4 * n] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                            _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
                wq[4 * n + 1] = _mm256_or_si256(
                    _mm256_and_si256(l1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
                wq[4 * n + 2] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
                wq[4 * n + 3] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
            }
            for (int g = 0; g < 8; g++) {
                sg[g] = _mm256_sub_epi8(wq[g], _mm256_set1_epi8(32));
                aw[g] = _mm256_sign_epi8(sg[g], sg[g]);
                /* group g = elements 32g..: lanes 0-3 sub-block 2g, 4-7 2g + 1 */
                S[g] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * g + 1]), _mm_set1_epi16(sc[2 * g]));
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++) {
            const ggml_q8k_block *ab = (const ggml_q8k_block *)(const void *)(a + i * as) + b;
            __m256i vlo = _mm256_setzero_si256(), vhi = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {
                __m256i av = _mm256_loadu_si256((const __m256i_u *)(ab->qs + 32 * g));
                /* |w| * (a * sign w) (pairs <= 8128) */
                __m256i p = _mm256_maddubs_epi16(aw[g], _mm256_sign_epi8(av, sg[g]));
                p = _mm256_madd_epi16(p, S[g]);
                if (g & 1)
                    vhi = _mm256_add_epi32(vhi, p);
                else
                    vlo = _mm256_add_epi32(vlo, p);
            }
            __m256 sv = bmul(dw, ab->d);
            Flo[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(vlo), sv, Flo[i]);
            Fhi[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(vhi), sv, Fhi[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NI; i++) {
        out[i * os] = tree8_avx2(_mm256_add_ps(Flo[i], Fhi[i]));
    }
}

/* ---- VNNI: 64 elements per vpdpbusd (lane l of chunk j = elements
 * 64j + 4l ..); every lane sum fits int16, so one vpmaddwd with the scale
 * in the low half of each 32-bit lane applies the sub-block scales
 * (vpdpwssd). Q6_K dots the unsigned 6-bit q with the signed activations,
 * starting from the activation's n32s4 = -32 x its 4-sums, so each lane is
 * exactly sum (q - 32) * a with no per-block weight preparation. ---- */
/* A Q6_K block's 16 signed scales as int32 (low 16 bits, the form the
 * kernels' madd takes), broadcast so that S[k] holds chunk k's four scales,
 * each over the four lanes its 16 weights' dot lands in. */
__attribute__((target(VNNI_TARGET))) static inline __attribute__((always_inline)) void
q6k_scales_vnni(const int8_t *sc, __m512i S[4])
{
    const __m512i sv = _mm512_and_si512(
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i_u *)sc)), _mm512_set1_epi32(0xFFFF));
    for (int k = 0; k < 4; k++)
        S[k] = _mm512_permutexvar_epi32(
            _mm512_set_epi32(4 * k + 3, 4 * k + 3, 4 * k + 3, 4 * k + 3, 4 * k + 2, 4 * k + 2,
                             4 * k + 2, 4 * k + 2, 4 * k + 1, 4 * k + 1, 4 * k + 1, 4 * k + 1,
                             4 * k, 4 * k, 4 * k, 4 * k),
            sv);
}

/* A Q6_K block's unsigned 6-bit q, both 128-element halves at once (zmm
 * half n = half n of the block), as four zmm of chunks in element order. */
__attribute__((target(VNNI_TARGET))) static inline __attribute__((always_inline)) void
q6k_unpack_vnni(const uint8_t *blk, __m512i wq[4])
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3);
    __m512i l0 = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i_u *)blk)),
        _mm256_loadu_si256((const __m256i_u *)(blk + 64)), 1);
    __m512i l1 = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i_u *)(blk + 32))),
        _mm256_loadu_si256((const __m256i_u *)(blk + 96)), 1);
    __m512i h = _mm512_loadu_si512(blk + 128);
    __m512i g0 = _mm512_or_si512(_mm512_and_si512(l0, m4),
                                 _mm512_slli_epi16(_mm512_and_si512(h, m2), 4));
    __m512i g1 = _mm512_or_si512(
        _mm512_and_si512(l1, m4),
        _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 2), m2), 4));
    __m512i g2 = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi16(l0, 4), m4),
        _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 4), m2), 4));
    __m512i g3 = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
        _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 6), m2), 4));
    wq[0] = _mm512_shuffle_i64x2(g0, g1, _MM_SHUFFLE(1, 0, 1, 0));
    wq[1] = _mm512_shuffle_i64x2(g2, g3, _MM_SHUFFLE(1, 0, 1, 0));
    wq[2] = _mm512_shuffle_i64x2(g0, g1, _MM_SHUFFLE(3, 2, 3, 2));
    wq[3] = _mm512_shuffle_i64x2(g2, g3, _MM_SHUFFLE(3, 2, 3, 2));
}

__attribute__((target(VNNI_TARGET))) static inline __attribute__((always_inline)) void
q6k_row_vnni_t(const uint8_t *w, uint64_t nb, const uint8_t *a, size_t as, float *out,
               size_t os, const int NI)
{
    __m512 F[4];
#pragma GCC unroll 4
    for (int i = 0; i < NI; i++)
        F[i] = _mm512_setzero_ps();
    for (uint64_t b = 0; b < nb; b++) {
        __m512i wq[4], S[4];
        const uint8_t *blk = w + b * Q6_K_BYTES;
        _mm_prefetch((const char *)blk + QDOT_PF, _MM_HINT_T0);
        const float dw = _cvtsh_ss(rd16(blk + 208));
        q6k_unpack_vnni(blk, wq);
        q6k_scales_vnni((const int8_t *)(blk + 192), S);
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++) {
            const ggml_q8k_block *ab = (const ggml_q8k_block *)(const void *)(a + i * as) + b;
            __m512i v2[2] = { _mm512_setzero_si512(), _mm512_setzero_si512() };
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m512i av = _mm512_loadu_si512(ab->qs + 64 * k);
                /* q * a from -32 x the activations' 4-sums = (q - 32) * a */
                __m512i p = _mm512_dpbusd_epi32(
                    _mm512_loadu_si512((const int32_t *)(const void *)((const ggml_q8k_block *)(
                                           const void *)(a + i * as) + nb) + 64 * b + 16 * k),
                    wq[k], av);
                /* v += madd(p, S), exact; two chains for latency */
                v2[k & 1] = _mm512_dpwssd_epi32(v2[k & 1], p, S[k]);
            }
            __m512i v = _mm512_add_epi32(v2[0], v2[1]);
            __m512 s16 = _mm512_broadcastss_ps(_mm_mul_ss(_mm_set_ss(dw), _mm_set_ss(ab->d)));
            F[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), s16, F[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NI; i++) {
        __m256 lo = _mm512_castps512_ps256(F[i]);
        __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(F[i]), 1));
        out[i * os] = tree8_avx2(_mm256_add_ps(lo, hi));
    }
}

/* The same per-item operations for up to KQ_WIDE items: each block is
 * decoded once for all of them (batched decode and prefill), so it gives
 * the bits of the 1-4 item tiles above (tests/engine/qdot checks). R = 2
 * does two consecutive weight rows (rb bytes apart) at once: each
 * activation chunk is loaded once for both (KQ_WIDE items of a 3584-wide
 * row are ~65 KB, more than L1, so one row at a time streams them from L2
 * per row); the per-output operations and their order are unchanged. */
#define KQ_WIDE GGML_QDOT_Q6K_WIDE
__attribute__((target(VNNI_TARGET))) static inline __attribute__((always_inline)) void
q6k_wide_vnni_t(const uint8_t *w, size_t rb, uint64_t nb, const uint8_t *a, size_t as, float *out,
                size_t os, const uint32_t ni, const int R)
{
    __m512 F[2][KQ_WIDE];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (uint32_t i = 0; i < ni; i++)
            F[r][i] = _mm512_setzero_ps();
    for (uint64_t b = 0; b < nb; b++) {
        __m512i wq[2][4], S[2][4], src[2][4];
        __m512 dwv[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = w + r * rb + b * Q6_K_BYTES;
            _mm_prefetch((const char *)blk + QDOT_PF, _MM_HINT_T0);
            dwv[r] = _mm512_set1_ps(_cvtsh_ss(rd16(blk + 208)));
            q6k_unpack_vnni(blk, wq[r]);
            /* many items: signed q - 32 against a + 128 (one xor per
             * chunk and item) keeps the activations compact in cache */
            for (int k = 0; k < 4; k++) {
                wq[r][k] = _mm512_sub_epi8(wq[r][k], _mm512_set1_epi8(32));
                src[r][k] = _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80),
                                        wq[r][k]));
            }
            q6k_scales_vnni((const int8_t *)(blk + 192), S[r]);
        }
#pragma GCC unroll 2
        for (uint32_t i = 0; i < ni; i++) {
            const ggml_q8k_block *ab = (const ggml_q8k_block *)(const void *)(a + i * as) + b;
            __m512i v2[2][2] = { { _mm512_setzero_si512(), _mm512_setzero_si512() },
                                 { _mm512_setzero_si512(), _mm512_setzero_si512() } };
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m512i av = _mm512_xor_si512(_mm512_loadu_si512(ab->qs + 64 * k),
                                              _mm512_set1_epi8((char)0x80));
#pragma GCC unroll 2
                for (int r = 0; r < R; r++) {
                    /* (a + 128) * (q - 32) from -128 x the weights' 4-sums */
                    __m512i p = _mm512_dpbusd_epi32(src[r][k], av, wq[r][k]);
                    /* v += madd(p, S), exact; two chains for latency */
                    v2[r][k & 1] = _mm512_dpwssd_epi32(v2[r][k & 1], p, S[r][k]);
                }
            }
            /* d_w * d_a as one vector multiply of broadcasts (the same
             * f32 product as the scalar one), d_a broadcast once for R rows */
            const __m512 da = _mm512_set1_ps(ab->d);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                __m512i v = _mm512_add_epi32(v2[r][0], v2[r][1]);
                F[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(dwv[r], da),
                                          F[r][i]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (uint32_t i = 0; i < ni; i++) {
            __m256 lo = _mm512_castps512_ps256(F[r][i]);
            __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(F[r][i]), 1));
            out[r + i * os] = tree8_avx2(_mm256_add_ps(lo, hi));
        }
}

#define Q6K_WIDE_FN(R)                                                                           \
    __attribute__((target(VNNI_TARGET))) static void q6k_wide##R##_vnni(                         \
        const uint8_t *w, size_t rb, uint64_t nb, const uint8_t *a, size_t as, float *out,       \
        size_t os, uint32_t ni)                                                                  \
    {                                                                                            \
        q6k_wide_vnni_t(w, rb, nb, a, as, out, os, ni, R);                                       \
    }
Q6K_WIDE_FN(1)
Q6K_WIDE_FN(2)

typedef void (*kq_row_fn)(const uint8_t *, uint64_t, const uint8_t *, size_t, float *, size_t);
#define Q6K_ROW(TGT, BODY, NI)                                                                   \
    __attribute__((target(TGT))) static void q6k_##BODY##_##NI(                                  \
        const uint8_t *w, uint64_t nb, const uint8_t *a, size_t as, float *out, size_t os)       \
    {                                                                                            \
        q6k_row_##BODY##_t(w, nb, a, as, out, os, NI);                                           \
    }
#define Q6K_ROWS(TGT, BODY)                                                                      \
    Q6K_ROW(TGT, BODY, 1) Q6K_ROW(TGT, BODY, 2) Q6K_ROW(TGT, BODY, 3) Q6K_ROW(TGT, BODY, 4)      \
    static const kq_row_fn q6k_##BODY[5] = { NULL, q6k_##BODY##_1, q6k_##BODY##_2,              \
                                             q6k_##BODY##_3, q6k_##BODY##_4 };
Q6K_ROWS(AVX2_TARGET, avx2)
Q6K_ROWS(VNNI_TARGET, vnni)

void ggml_qdot_q6k_row(int path, const uint8_t *row, uint64_t nb, const uint8_t *a, size_t as,
                       uint32_t ni, float *out, size_t os)
{
    if (path >= GGML_QDOT_AVX2)
        (path >= GGML_QDOT_VNNI ? q6k_vnni : q6k_avx2)[ni](row, nb, a, as, out, os);
    else
        q6k_row_scalar(row, nb, a, as, ni, out, os);
}

void ggml_qdot_q6k_wide(const uint8_t *w, size_t rb, uint32_t nr, uint64_t nb, const uint8_t *a,
                        size_t as, uint32_t ni, float *out, size_t os)
{
    uint32_t r = 0;
    for (; r + 2 <= nr; r += 2) /* row pairs share the activation loads */
        q6k_wide2_vnni(w + (size_t)r * rb, rb, nb, a, as, out + r, os, ni);
    if (r < nr)
        q6k_wide1_vnni(w + (size_t)r * rb, rb, nb, a, as, out + r, os, ni);
}
