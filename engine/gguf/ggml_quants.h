/* ggml_quants.h - (de)quantization of Q4_1, Q5_0, Q5_1, IQ4_NL and the
 * K-quants Q2_K..Q6_K (internal to engine/gguf; callers use
 * ggml_dequantize_row / ggml_quantize_row from ggml_types.h). */
#ifndef GGML_QUANTS_H
#define GGML_QUANTS_H

#include <string.h>
#include "ggml_types.h"

/* The 16 IQ4_NL code points. */
extern const int8_t ggml_iq4nl_values[16];
/* The 16 signed scales (-32..31) of a Q3_K block from its 12 scale bytes:
 * scale j's low 4 bits are the low (j < 8) or high nibble of byte j % 8,
 * its top 2 bits bits 2 (j / 4).. of byte 8 + j % 4; stored + 32. Four
 * bytes at a time. */
static inline void ggml_q3k_scales(const uint8_t *s12, int8_t out[16])
{
    uint32_t a0, a1, t, w[4];
    memcpy(&a0, s12, 4);
    memcpy(&a1, s12 + 4, 4);
    memcpy(&t, s12 + 8, 4);
    w[0] = (a0 & 0x0F0F0F0Fu) | ((t & 0x03030303u) << 4);
    w[1] = (a1 & 0x0F0F0F0Fu) | (((t >> 2) & 0x03030303u) << 4);
    w[2] = ((a0 >> 4) & 0x0F0F0F0Fu) | (((t >> 4) & 0x03030303u) << 4);
    w[3] = ((a1 >> 4) & 0x0F0F0F0Fu) | (((t >> 6) & 0x03030303u) << 4);
    memcpy(out, w, 16);
    for (int j = 0; j < 16; j++)
        out[j] = (int8_t)(out[j] - 32);
}

/* n is a multiple of the type's block size (checked by the caller).
 * PD_ERR_UNSUPPORTED for a type not handled here. */
pd_status_t ggml_quants_dequantize(uint32_t type, const uint8_t *src, float *dst, uint64_t n);
/* Decoder path: AVX2 forms (Q2_K..Q6_K; bitwise equal to the scalar
 * ones) when the CPU has AVX2 (the default), or scalar only (on = 0). For
 * tests; call while no decode is running. */
void ggml_quants_set_simd(int on);
pd_status_t ggml_quants_quantize(uint32_t type, const float *src, uint8_t *dst, uint64_t n);

#endif
