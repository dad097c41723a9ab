/* ggml_qdot.h - integer-dot kernels for quantized weight rows against an
 * activation row quantized once per step (issue 11).
 *
 * Two activation formats, chosen by the weight type (ggml_qdot_act):
 *  - Q8A (weights Q8_0, Q4_0): 32-element blocks, d = absmax / 127 (f32),
 *    q = round(x / d) in [-127, 127]. A row of n elements is stored as
 *    planes so SIMD loads of consecutive blocks are contiguous:
 *      int8  qs[n]            the quantized values
 *      int32 ns4[n / 4]       -128 times the sum of each 4 consecutive qs
 *      float d[n / 4]         each block's d, repeated 8 times
 *    (96 bytes per block).
 *  - Q8K (weights Q4_K, Q6_K): 256-element blocks ggml_q8k_block
 *    { f32 d; int8 qs[256]; int16 bsums[16] } (bsums = sums of 16 qs),
 *    d = absmax / 127; the row's nb blocks are followed by a plane
 *    int32 n32s4[64 * nb] = -32 x the sum of each 4 consecutive qs (the
 *    VNNI Q6_K kernel for 1-4 items starts its lanes from it).
 *
 * Canonical results (every path returns the same bits):
 *  - Q8_0 / Q4_0: for block b, 8 lane integers p_j = sum_{t<4} w[4j+t] *
 *    q[4j+t] (exact), s_b = d_w[b] * d_a[b] (f32), acc[b mod 4][j] =
 *    fma((float)p_j, s_b, acc[b mod 4][j]) from +0; then v_j = (acc0_j +
 *    acc2_j) + (acc1_j + acc3_j) and the tree s4_l = v_l + v_{l+4},
 *    s2_l = s4_l + s4_{l+2}, r = s2_0 + s2_1.
 *  - Q4_K / Q6_K: per block 16 exact int32 lanes V[l] = sum over the 4
 *    64-element chunks j of scale(j, l) * sum_{t<4} w[64j+4l+t] *
 *    q[64j+4l+t], where w is the nibble (Q4_K; scale = sc_2j for l < 8,
 *    sc_2j+1 for l >= 8) or q6 - 32 (Q6_K; scale = sc_{4j + l/4}); Q4_K
 *    also 8 lanes M[k] = m_k * (bsums[2k] + bsums[2k+1]). In block order
 *    F[l] = fma((float)V[l], d_w * d_a, F[l]), G[k] = fma((float)M[k],
 *    dmin_w * d_a, G[k]); r = tree16(F) - tree8(G) (Q6_K: tree16(F)), with
 *    tree16(F) = tree8(F[l] + F[l+8]).
 * Paths: scalar, AVX2 (maddubs/madd; sign trick for the signed weights),
 * AVX-512 VNNI (vpdpbusd on 512-bit pairs of Q8_0/Q4_0 blocks or 64-element
 * K-quant chunks; the K-quant sub-block scales by one vpmaddwd, as every
 * lane sum of 4 products fits int16). */
#ifndef GGML_QDOT_H
#define GGML_QDOT_H

#include <stddef.h>
#include <stdint.h>
#include "ggml_types.h"

#define GGML_Q8A_BLOCK 32
#define GGML_Q8K_BLOCK 256

typedef struct {
    float d;
    int8_t qs[GGML_Q8K_BLOCK];
    int16_t bsums[GGML_Q8K_BLOCK / 16];
} ggml_q8k_block;

enum { GGML_QDOT_SCALAR = 0, GGML_QDOT_AVX2 = 1, GGML_QDOT_VNNI = 2 };
enum { GGML_QACT_NONE = 0, GGML_QACT_Q8A = 1, GGML_QACT_Q8K = 2 };

/* Activation format the int-dot of weight type `type` uses (NONE: the type
 * has no integer kernel). */
int ggml_qdot_act(uint32_t type);
/* Elements per weight block of a type with an integer kernel (32 / 256). */
uint32_t ggml_qdot_block(uint32_t type);
/* Bytes of one quantized activation row of n elements in format act (n a
 * multiple of the format's block); 0 for NONE. */
size_t ggml_qdot_act_bytes(int act, uint64_t n);
/* Quantizes n floats into one activation row of format act (AVX2 or
 * scalar by the current path; the same bytes either way). */
void ggml_qdot_quantize(int act, const float *x, uint64_t n, void *out);

/* Path in use: the best the CPU supports, capped by PD_QDOT=scalar|avx2
 * read at the first call; ggml_qdot_set_path caps it for tests (a path the
 * CPU lacks falls back to the next lower). Returns the path now in use. */
int ggml_qdot_path(void);
int ggml_qdot_set_path(int path);

/* out[i * out_stride + r] = dot(weight row r, activation row i) for
 * r < n_rows (rows row_bytes apart from w) and i < n_items (activation rows
 * a_stride bytes apart from a), rows of n elements, on `path` (capped to
 * what the CPU has). The weight row is read once for up to 4 items (VNNI
 * K-quants with more than 4 items: each block decoded once per 16).
 * PD_ERR_UNSUPPORTED if the type has no integer kernel or n is not a
 * multiple of its block. */
pd_status_t ggml_qdot_rows(int path, uint32_t type, const uint8_t *w, size_t row_bytes,
                           uint32_t n_rows, uint64_t n, const void *a, size_t a_stride,
                           uint32_t n_items, float *out, size_t out_stride);

/* One row, one item, on the current path. */
pd_status_t ggml_qdot_row(uint32_t type, const uint8_t *w, const void *a, uint64_t n,
                          float *out);

#endif
