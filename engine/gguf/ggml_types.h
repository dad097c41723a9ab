/* ggml_types.h - ggml tensor element types: sizes, scalar conversions and
 * reference (scalar, bit-exact with ggml's C reference code) row
 * quantize/dequantize for the types pdserve computes with.
 *
 * Supported for compute: F32=0, F16=1, Q4_0=2, Q4_1=3, Q5_0=6, Q5_1=7,
 * Q8_0=8, Q2_K=10, Q3_K=11, Q4_K=12, Q5_K=13, Q6_K=14, IQ4_NL=20, BF16=30
 * (the types llama-quantize's standard presets write).
 * Known for validation only (sizes, names): every other ggml type id, so a
 * foreign GGUF file can still be opened and its metadata read.
 *
 * Block layouts (exactly ggml's, little-endian, packed):
 *   Q8_0: { fp16 d; int8  qs[32]; }  34 bytes / 32 elements, x[i] = qs[i] * d
 *   Q4_0: { fp16 d; uint8 qs[16]; }  18 bytes / 32 elements,
 *         x[i]    = ((qs[i] & 0xF) - 8) * d   for i in 0..15
 *         x[i+16] = ((qs[i] >>  4) - 8) * d   for i in 0..15
 *   Q4_1:   { fp16 d, m; uint8 qs[16]; }          20 B / 32, x = q*d + m
 *   Q5_0:   { fp16 d; uint8 qh[4]; uint8 qs[16]; } 22 B / 32, x = (q-16)*d,
 *           bit 4 of element j = bit j of qh (little-endian u32)
 *   Q5_1:   { fp16 d, m; uint8 qh[4]; uint8 qs[16]; } 24 B / 32, x = q*d + m
 *   IQ4_NL: { fp16 d; uint8 qs[16]; }             18 B / 32,
 *           x = d * {-127,-104,-83,-65,-49,-35,-22,-10,1,13,25,38,53,69,89,113}[q]
 *   Q2_K: { uint8 scales[16]; uint8 qs[64]; fp16 d, dmin; }  84 B / 256,
 *         16 sub-blocks of 16: x = d*(sc&15) * q - dmin*(sc>>4), q 2-bit
 *   Q3_K: { uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; fp16 d; } 110 B,
 *         16 x 16: x = d*(s6-32) * (q2 - (hmask bit ? 0 : 4))
 *   Q4_K: { fp16 d, dmin; uint8 scales[12]; uint8 qs[128]; }  144 B,
 *         8 x 32: x = d*s6 * q4 - dmin*m6
 *   Q5_K: { fp16 d, dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]; } 176 B
 *   Q6_K: { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d; } 210 B,
 *         16 x 16: x = d*sc * (q6 - 32)
 * (element order within a block and bit packing: ggml_quants.c)
 */
#ifndef GGML_TYPES_H
#define GGML_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "pd_status.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pdserve's GGUF code assumes a little-endian host"
#endif

typedef enum {
    GGML_TYPE_F32  = 0,
    GGML_TYPE_F16  = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_COUNT = 43,   /* ids >= this are rejected */
} ggml_type_t;

#define GGML_QK4_0 32
#define GGML_QK8_0 32

typedef struct {
    uint16_t d;                 /* fp16 scale */
    int8_t qs[GGML_QK8_0];      /* (32) */
} ggml_block_q8_0_t;

typedef struct {
    uint16_t d;                 /* fp16 scale */
    uint8_t qs[GGML_QK4_0 / 2]; /* (16) nibbles: low = elem i, high = elem i+16 */
} ggml_block_q4_0_t;

_Static_assert(sizeof(ggml_block_q8_0_t) == 34, "q8_0 block layout");
_Static_assert(sizeof(ggml_block_q4_0_t) == 18, "q4_0 block layout");

typedef struct {
    const char *name;      /* "f32", "q8_0", ... (lower case, as ggml) */
    uint32_t block_size;   /* elements per block */
    uint32_t type_size;    /* bytes per block */
    bool supported;        /* pdserve can (de)quantize it */
} ggml_type_info_t;

/* Type table entry for a ggml type id; NULL if the id is unknown/removed
 * (e.g. 4, 5, 31..33, 36..38) or >= GGML_TYPE_COUNT. */
const ggml_type_info_t *ggml_type_info(uint32_t type);

/* Lower-case name or "?" for unknown ids. */
const char *ggml_type_name(uint32_t type);

/* "f32 f16 bf16 q8_0 ..." : the supported types, space-separated. */
const char *ggml_supported_types(void);

/* Parse a supported type's name ("f32", "q4_K", "q4_k", ...; case-
 * insensitive) -> type.
 * PD_ERR_BAD_INPUT if not one of those. */
pd_status_t ggml_type_parse(const char *name, ggml_type_t *type_p);

/* Bytes of n_elements of `type`, overflow-checked. PD_ERR_BAD_TYPE unknown
 * type; PD_ERR_BAD_INPUT n_elements not a multiple of the block size;
 * PD_ERR_TOO_BIG on overflow. */
pd_status_t ggml_nbytes(uint32_t type, uint64_t n_elements, uint64_t *bytes_p);

/* ---- scalar conversions (IEEE half, round-to-nearest-even; bf16 as ggml:
 * round-to-nearest-even, NaN kept quiet) ---- */

static inline uint32_t ggml_f32_bits_(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float ggml_bits_f32_(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline float ggml_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    if (exp == 0x1F) /* inf / nan */
        return ggml_bits_f32_(sign | 0x7F800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return ggml_bits_f32_(sign);
        /* subnormal: man * 2^-24 (exact in f32) */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return ggml_bits_f32_(sign | ((exp + 112u) << 23) | (man << 13));
}

/* ggml's (FP16 library) branch-light conversion; NaN -> 0x7E00. Needs
 * IEEE single precision arithmetic without excess precision (SSE). */
static inline uint16_t ggml_fp32_to_fp16(float f)
{
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (__builtin_fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = ggml_f32_bits_(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u)
        bias = 0x71000000u;
    base = ggml_bits_f32_((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = ggml_f32_bits_(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline float ggml_bf16_to_fp32(uint16_t h)
{
    return ggml_bits_f32_((uint32_t)h << 16);
}

static inline uint16_t ggml_fp32_to_bf16(float f)
{
    uint32_t u = ggml_f32_bits_(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* nan: keep it quiet */
        return (uint16_t)((u >> 16) | 64u);
    return (uint16_t)((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
}

/* ---- rows ---- */

/* Convert n elements of `type` at src into f32 at dst. n must be a multiple
 * of the block size. PD_ERR_UNSUPPORTED for types pdserve cannot decode,
 * PD_ERR_BAD_INPUT for a bad n. src may be unaligned. */
pd_status_t ggml_dequantize_row(uint32_t type, const void *src, float *dst /* (n) */,
                                uint64_t n);

/* Convert n f32 values into `type` at dst (ggml_nbytes(type, n) bytes).
 * Same statuses as ggml_dequantize_row. Deterministic, bit-exact with
 * ggml's quantize_row_*_ref. */
pd_status_t ggml_quantize_row(uint32_t type, const float *src /* (n) */, void *dst,
                              uint64_t n);

#endif
