/* ggml_qdot_int.h - what ggml_qdot.c, ggml_qdot_q6k.c and ggml_qdot_amx.c
 * share (internal to engine/llama: the Q8A planes, the 32-element types'
 * formats, the Q6_K and AMX entry points). ggml_qdot.h has the layouts and
 * the canonical results. */
#ifndef GGML_QDOT_INT_H
#define GGML_QDOT_INT_H

#include <stddef.h>
#include <stdint.h>
#include <immintrin.h>
#include "ggml_qdot.h"
#include "ggml_quants.h"

#define Q6_K_BYTES 210
#define AVX2_TARGET "avx2,fma,f16c"
#define QDOT_PF 1024 /* software prefetch distance on the weight rows */
#define VNNI_TARGET "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"

static inline uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline float h2f(const uint8_t *p)
{
    return ggml_fp16_to_fp32((uint16_t)(p[0] | (p[1] << 8)));
}

/* the Q8A planes of a row of nb blocks */
#define Q8A_C128(a, nb) ((const int32_t *)(const void *)((const uint8_t *)(a) + 32 * (nb)))
#define Q8A_C8(a, nb) ((const int32_t *)(const void *)((const uint8_t *)(a) + 36 * (nb)))
#define Q8A_D(a, nb) ((const float *)(const void *)((const uint8_t *)(a) + 40 * (nb)))

/* The 32-element weight types: block bytes, offsets of qs and of the
 * high-bit word (0: none), a min at +2 (x = d * n + m), and the packed
 * form (q32_pk_vnni_t): BYTE = the int8 value + 128, NIB = qs as stored,
 * LUT = qs as stored, each nibble looked up as its IQ4_NL value + 128. */
enum { Q32_BYTE = 0, Q32_NIB = 1, Q32_LUT = 2 };
typedef struct {
    uint8_t bytes, qs, qh, has_min, form;
} q32_fmt_t;

static inline q32_fmt_t q32_fmt(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_Q8_0: return (q32_fmt_t){ 34, 2, 0, 0, Q32_BYTE };
    case GGML_TYPE_Q4_1: return (q32_fmt_t){ 20, 4, 0, 1, Q32_NIB };
    case GGML_TYPE_Q5_0: return (q32_fmt_t){ 22, 6, 2, 0, Q32_BYTE };
    case GGML_TYPE_Q5_1: return (q32_fmt_t){ 24, 8, 4, 1, Q32_BYTE };
    case GGML_TYPE_IQ4_NL: return (q32_fmt_t){ 18, 2, 0, 0, Q32_LUT };
    default: return (q32_fmt_t){ 18, 2, 0, 0, Q32_NIB }; /* Q4_0 */
    }
}

/* (float) of block b's sum of qs, from the c8 plane (-8 x the sum) */
static inline float q8a_sum(const uint8_t *ai, uint64_t nb, uint64_t b)
{
    return (float)(Q8A_C8(ai, nb)[b] / -8);
}

static inline size_t q32_pk_qbytes(uint32_t type) /* quads of one block of a group */
{
    return q32_fmt(type).form == Q32_BYTE ? 16 * 32 : 16 * 16;
}

__attribute__((target(AVX2_TARGET))) static inline float tree8_avx2(__m256 v)
{
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

/* ---- Q6_K (ggml_qdot_q6k.c) ---- */
#define GGML_QDOT_Q6K_WIDE 16 /* items per decoded block in ggml_qdot_q6k_wide */
/* one weight row against ni <= 4 items on path (scalar / AVX2 / VNNI) */
void ggml_qdot_q6k_row(int path, const uint8_t *row, uint64_t nb, const uint8_t *a, size_t as,
                       uint32_t ni, float *out, size_t os);
/* VNNI: nr rows (row_bytes apart) against ni <= 16 items, each block
 * decoded once for the items, row pairs sharing the activation loads */
void ggml_qdot_q6k_wide(const uint8_t *w, size_t rb, uint32_t nr, uint64_t nb, const uint8_t *a,
                        size_t as, uint32_t ni, float *out, size_t os);

/* ---- AMX (ggml_qdot_amx.c) ---- */
#define GGML_QDOT_AMX_ITEMS 16 /* items per tile pass: the AMX kernels take multiples */
/* NULL if AMX is usable (CPUID, XCR0, XTILEDATA granted), else why not */
const char *ggml_qdot_amx_probe(void);
/* loads this thread's tile config once (before the first AMX kernel) */
void ggml_qdot_amx_thread_init(void);
/* n16 (a multiple of 16) items against ng packed groups of 16 rows of nb
 * blocks (pg, gs bytes apart): out[i * os + 16 * g + r] */
typedef void (*ggml_qdot_amx_fn)(const uint8_t *pg, size_t gs, uint32_t ng, uint64_t nb,
                                 const uint8_t *a, size_t as, uint32_t n16, float *out, size_t os);
/* the AMX kernel of a type on the packed layout, NULL if none */
ggml_qdot_amx_fn ggml_qdot_amx_kernel(uint32_t type);

#endif
