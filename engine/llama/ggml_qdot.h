/* ggml_qdot.h - integer-dot kernels for quantized weight rows against an
 * activation row quantized once per step (issue 11).
 *
 * Two activation formats, chosen by the weight type (ggml_qdot_act):
 *  - Q8A (weights Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): 32-element blocks, d =
 *    absmax / 127 (f32), q = round(x / d) in [-127, 127]. A row of nb
 *    blocks is stored as planes (44 bytes per block):
 *      int8  qs[32 * nb]      the quantized values
 *      int32 c128[nb]         -128 times each block's sum of qs
 *      int32 c8[nb]           -8 times each block's sum of qs
 *      float d[nb]            each block's d
 *  - Q8K (weights Q2_K .. Q6_K): 256-element blocks ggml_q8k_block
 *    { f32 d; int8 qs[256]; int16 bsums[16] } (bsums = sums of 16 qs),
 *    d = absmax / 127; the row's nb blocks are followed by a plane
 *    int32 n32s4[64 * nb] = -32 x the sum of each 4 consecutive qs (the
 *    VNNI Q6_K kernel for 1-4 items starts its lanes from it).
 *
 * Canonical results (every path returns the same bits):
 *  - 32-element types: per block b the exact int32 P_b = sum of the 32
 *    w * q, w the block's integer weights (Q8_0 q; Q4_0 n - 8; Q4_1 n;
 *    Q5_0 n5 - 16; Q5_1 n5; IQ4_NL its code point of n, -127..113;
 *    |P_b| <= 32 * 128 * 127 < 2^24, so (float)P_b
 *    is exact), s_b = d_w[b] * d_a[b] (f32), and one chain r =
 *    fma((float)P_b, s_b, r) from +0 in block order; Q4_1 / Q5_1 follow
 *    each block with r = fma((float)S_b, m_w[b] * d_a[b], r), S_b the
 *    block's sum of q. (llama.cpp's repacked GEMM forms the same exact
 *    block sums; one f32 rounding per block.)
 *  - Q4_K / Q5_K: per block the exact int32 V = sum over the 8 sub-blocks
 *    k of sc_k * P_k (P_k = sum of the 32 products of the 4- / 5-bit value
 *    and q) and M = sum_k m_k * (bsums[2k] + bsums[2k+1]); in block order
 *    r = fma((float)V, d_w * d_a, r), r = fma((float)M, -(dmin_w * d_a), r)
 *    from +0.
 *  - Q2_K / Q3_K: the same with their 16 sub-blocks s of 16 elements: V =
 *    sum_s sc_s * P_s (Q2_K: 2-bit value, sc 0..15; Q3_K: 3-bit value - 4,
 *    sc -32..31), Q2_K's M = sum_s m_s * bsums[s]; Q3_K has no M term.
 *  - Q6_K: per block 16 exact int32 lanes V[l] = sum over the 4 64-element
 *    chunks j of sc_{4j + l/4} * sum_{t<4} (q6 - 32)[64j+4l+t] *
 *    q[64j+4l+t]; in block order F[l] = fma((float)V[l], d_w * d_a, F[l]);
 *    r = tree8(F[l] + F[l+8]) (s4_l = v_l + v_{l+4}, s2_l = s4_l +
 *    s4_{l+2}, r = s2_0 + s2_1).
 * Paths: scalar, AVX2 (maddubs/madd; sign trick for the signed weights;
 * the 32-element types gather 4 blocks' sums into one xmm by horizontal
 * adds; Q2_K / Q3_K: one block decoded once for up to 16 items), AVX-512
 * VNNI (every type but Q6_K on the packed layout below, 16
 * rows in the 16 lanes of vpdpbusd; Q6_K: 64-element chunks per vpdpbusd,
 * the sub-block scales by one vpmaddwd, as every lane sum of 4 products
 * fits int16).
 *
 * Packed layout (ggml_qdot_pack, made once at model load; all types with
 * an integer kernel but Q6_K): each full group of 16 rows is one
 * 64-byte-aligned region. 32-element types: for every block b its 4-byte
 * weight groups t (Q8_0, Q5_0, Q5_1: 8 of them, stored as w + 128; Q4_0,
 * Q4_1, IQ4_NL: 4, the raw nibble bytes, low nibbles = elements 4t..,
 * high = 16 + 4t..; IQ4_NL's looked up by vpshufb as value + 128) as
 * [t][row][4 bytes], then a plane of the 16 rows' f16 d per block (and
 * one of m for Q4_1 / Q5_1). Q4_K / Q5_K: see ggml_qdot.c (quads per
 * 64-element chunk, then sc, m, d, dmin and Q5_K's qh). Q2_K / Q3_K: see
 * ggml_qdot.c (the qs bytes as stored, 4 values each; Q3_K's hmask; one
 * byte per sub-block scale / min and row; d, dmin).
 * A trailing group of fewer than 16 rows is not packed: those rows are read
 * from the original tensor, with the same bits.
 *
 * AMX (issue 37; 32-element types on the packed layout above, nothing
 * more in memory): per group of 16 rows, a segment of up to 64 blocks is
 * turned into signed int8 tiles on the stack ([t][row][4 bytes] = the B
 * operand of tdpbssd, 8 rows x 64 bytes per block: the BYTE form xor 0x80,
 * nibbles and / or table lookup), then per 16 items and block one tdpbssd
 * with K = 32 (A: the 16 items' 32 activation bytes of the block, read in
 * place with the activation row stride) leaves the exact P_b of 16 items
 * x 16 rows in a C tile; it is stored, and each item's row of 16 P_b
 * takes the canonical r = fma((float)P_b, d_w * d_a, r) (+ the min term)
 * in block order with AVX-512, rows in the lanes as on VNNI. Q4_K / Q5_K:
 * one tdpbssd per 32-element sub-block (the packed nibbles, Q5_K with its
 * qh bit) gives P_k exactly, V = sum sc_k P_k exactly (Q4_K: f32 parts
 * below 2^24; Q5_K: int32), then the VNNI fold. Q6_K has no tile kernel
 * (its canonical 4-product lanes do not fit tiles: DESIGN.md). Items
 * beyond the last full 16 run the VNNI packed kernel: same bits. */
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

enum { GGML_QDOT_SCALAR = 0, GGML_QDOT_AVX2 = 1, GGML_QDOT_VNNI = 2, GGML_QDOT_AMX = 3 };
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

/* Path in use: the best the CPU supports, capped by PD_QDOT=scalar|avx2|
 * vnni|amx read at the first call (a cap for the whole process, tests'
 * ggml_qdot_set_path included); ggml_qdot_set_path caps it for tests (a
 * path the CPU lacks falls back to the next lower). Returns the path now
 * in use. AMX needs CPUID AMX-TILE + AMX-INT8, XCR0 bits 17/18 (the OS
 * saves tile state) and the kernel's permission for XTILEDATA, asked once
 * for the process (arch_prctl(ARCH_REQ_XCOMP_PERM)) at the first call;
 * without any of them the best path is VNNI and ggml_qdot_amx_why() says
 * why (logged once at debug). */
int ggml_qdot_path(void);
int ggml_qdot_set_path(int path);
/* NULL if the AMX path is usable, else why not (a static string). */
const char *ggml_qdot_amx_why(void);
/* Name of a path: "scalar", "avx2", "vnni", "amx". */
const char *ggml_qdot_path_name(int path);

/* out[i * out_stride + r] = dot(weight row r, activation row i) for
 * r < n_rows (rows row_bytes apart from w) and i < n_items (activation rows
 * a_stride bytes apart from a), rows of n elements, on `path` (capped to
 * what the CPU has). The weight row is read once for up to 4 items (VNNI
 * Q6_K with more than 4 items: each block decoded once per 16); on VNNI
 * the other types run the AVX2 row kernel here (their fast kernel is on
 * the packed layout, ggml_qdot_rows_packed); the AMX path is VNNI here.
 * PD_ERR_UNSUPPORTED if the type has no integer kernel or n is not a
 * multiple of its block. */
pd_status_t ggml_qdot_rows(int path, uint32_t type, const uint8_t *w, size_t row_bytes,
                           uint32_t n_rows, uint64_t n, const void *a, size_t a_stride,
                           uint32_t n_items, float *out, size_t out_stride);

/* Bytes of the packed layout of n_rows rows of n elements (full groups of
 * 16 only); 0 if the type has no packed kernel (Q6_K and the types with no
 * integer kernel). */
size_t ggml_qdot_pack_bytes(uint32_t type, uint32_t n_rows, uint64_t n);
/* Packs the full groups of 16 of rows w (row_bytes apart) into out
 * (ggml_qdot_pack_bytes bytes, 64-byte aligned for full-speed loads). */
pd_status_t ggml_qdot_pack(uint32_t type, const uint8_t *w, size_t row_bytes, uint32_t n_rows,
                           uint64_t n, uint8_t *out);
/* ggml_qdot_rows for rows [r0, r1) of a tensor w (row 0 at w) whose packed
 * layout is pk (NULL: none): out[i * out_stride + r - r0]. The full groups
 * of 16 in the range run the packed kernel on the VNNI path (AMX path: the
 * 32-element types', Q4_K's and Q5_K's full 16s of items on tiles, the
 * other items and types as on VNNI), the rest the row kernels: the same bits either way. */
pd_status_t ggml_qdot_rows_packed(int path, uint32_t type, const uint8_t *w, size_t row_bytes,
                                  const uint8_t *pk, uint32_t r0, uint32_t r1, uint64_t n,
                                  const void *a, size_t a_stride, uint32_t n_items, float *out,
                                  size_t out_stride);

/* Element e of a quantized activation row of n elements: its int8 value
 * and its block's scale (tests and checks read the rows through these). */
int8_t ggml_qdot_act_q(int act, const void *a, uint64_t n, uint64_t e);
float ggml_qdot_act_scale(int act, const void *a, uint64_t n, uint64_t e);

/* One row, one item, on the current path. */
pd_status_t ggml_qdot_row(uint32_t type, const uint8_t *w, const void *a, uint64_t n,
                          float *out);

#endif
