/* ggml_qdot.h - integer-dot kernels for quantized weight rows against an
 * activation row quantized once to Q8 blocks (issue 11, step 1).
 *
 * Activation blocks: { float d; int8 qs[32]; }, d = absmax / 127, q =
 * round(x / d). The dot of a Q8_0 or Q4_0 weight row with such a row is
 * sum over blocks b of (d_w[b] * d_a[b]) * isum[b], isum[b] the exact int32
 * sum of the 32 products, accumulated in f32 in block order. The integer
 * sums are computed by the scalar, AVX2 (maddubs/madd) or AVX-512 VNNI
 * (vpdpbusd) kernel; the float part is one shared scalar loop, so every
 * path returns the same bits (tests/engine/gguf/test_qdot.c). Not yet
 * wired into engine/llama's matvec. */
#ifndef GGML_QDOT_H
#define GGML_QDOT_H

#include <stdint.h>
#include "ggml_types.h"

#define GGML_Q8A_BLOCK 32

typedef struct {
    float d;
    int8_t qs[GGML_Q8A_BLOCK];
} ggml_q8a_block;

enum { GGML_QDOT_SCALAR = 0, GGML_QDOT_AVX2 = 1, GGML_QDOT_VNNI = 2 };

/* Quantizes n floats (n a multiple of 32) into n / 32 blocks. */
void ggml_q8a_quantize(const float *x, uint64_t n, ggml_q8a_block *out);

/* Path in use: the best the CPU supports, capped by PD_QDOT=scalar|avx2
 * read at the first call; ggml_qdot_set_path caps it for tests (a path the
 * CPU lacks falls back to the next lower). Returns the path now in use. */
int ggml_qdot_path(void);
int ggml_qdot_set_path(int path);

/* Integer block sums of nb weight blocks (type GGML_TYPE_Q8_0 or
 * GGML_TYPE_Q4_0) against nb activation blocks with the given path.
 * PD_ERR_UNSUPPORTED for another type. */
pd_status_t ggml_qdot_isums(int path, uint32_t type, const uint8_t *w, const ggml_q8a_block *a,
                            uint64_t nb, int32_t *isum);

/* Dot product of one weight row (nb blocks) with the quantized activation
 * row, on the current path. Same bits on every path. */
pd_status_t ggml_qdot_row(uint32_t type, const uint8_t *w, const ggml_q8a_block *a, uint64_t nb,
                          float *out);

#endif
