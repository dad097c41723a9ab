/* ggml_quants.h - (de)quantization of Q4_1, Q5_0, Q5_1, IQ4_NL and the
 * K-quants Q2_K..Q6_K (internal to engine/gguf; callers use
 * ggml_dequantize_row / ggml_quantize_row from ggml_types.h). */
#ifndef GGML_QUANTS_H
#define GGML_QUANTS_H

#include "ggml_types.h"

/* The 16 IQ4_NL code points. */
extern const int8_t ggml_iq4nl_values[16];

/* n is a multiple of the type's block size (checked by the caller).
 * PD_ERR_UNSUPPORTED for a type not handled here. */
pd_status_t ggml_quants_dequantize(uint32_t type, const uint8_t *src, float *dst, uint64_t n);
/* Decoder path: AVX2 forms (Q2_K..Q6_K; bitwise equal to the scalar
 * ones) when the CPU has AVX2 (the default), or scalar only (on = 0). For
 * tests; call while no decode is running. */
void ggml_quants_set_simd(int on);
pd_status_t ggml_quants_quantize(uint32_t type, const float *src, uint8_t *dst, uint64_t n);

#endif
