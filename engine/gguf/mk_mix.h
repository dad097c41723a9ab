/* mk_mix.h - pd-mkmodel's weight types: a plain ggml type for every 2-D
 * weight, or a llama-quantize style preset mix (Q4_K_M, Q3_K_L, ...) that
 * picks a type per tensor. Internal to pd-mkmodel. */
#ifndef MK_MIX_H
#define MK_MIX_H

#include <stdint.h>
#include "ggml_types.h"

typedef struct {
    const char *name;      /* "q4_K_M", or a plain type name */
    uint32_t base;         /* ggml type of most weights */
    uint32_t file_type;    /* general.file_type (llama_ftype) */
    char variant;          /* 'S' | 'M' | 'L' for a mix, 0 for a plain type */
} mk_mix_t;

/* Parse a plain supported type ("q4_K", "f16", ...) or a preset mix name
 * ("q4_k_m", "Q3_K_L", ...; case-insensitive). PD_ERR_BAD_INPUT if none. */
pd_status_t mk_mix_parse(const char *s, mk_mix_t *mix);

/* "q2_K q3_K_S ..." : the mix names, space separated. */
const char *mk_mix_names(void);

/* The type of 2-D weight `name` (GGUF tensor name; layer from blk.N.) whose
 * rows have ne0 elements, in a model of n_layers; tied = no output.weight
 * (token_embd then gets the output's type, as llama-quantize does). Rows
 * that are not whole 256-element super-blocks fall back to a 32-block type
 * (Q2_K/Q3_K -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0). */
uint32_t mk_mix_type(const mk_mix_t *mix, const char *name, uint64_t ne0,
                     uint32_t n_layers, bool tied);

#endif
