/* mk_mix.c - per-tensor weight types for pd-mkmodel's preset mixes.
 *
 * The rules follow what llama-quantize's standard presets are documented to
 * do (more bits for attn_v / ffn_down in some layers, Q6_K output), written
 * as a small table so tests can make files of every mix:
 *
 *   mix     base  output  attn_v                 ffn_down               attn_output
 *   Q2_K    Q2_K  Q6_K    Q4_K (GQA>=4) else Q3_K Q3_K                  Q3_K
 *   Q3_K_S  Q3_K  Q6_K    base                   base                   base
 *   Q3_K_M  Q3_K  Q6_K    Q5_K (l<2) else Q4_K   Q5_K (l<n/16) else Q4_K Q4_K
 *   Q3_K_L  Q3_K  Q6_K    Q5_K                   Q5_K                   Q5_K
 *   Q4_K_S  Q4_K  Q6_K    Q5_K (l<4) else base   Q5_K (l<n/8) else base base
 *   Q4_K_M  Q4_K  Q6_K    Q6_K if more_bits(l)   Q6_K if more_bits(l)   base
 *   Q5_K_S  Q5_K  Q6_K    base                   base                   base
 *   Q5_K_M  Q5_K  Q6_K    Q6_K if more_bits(l)   Q6_K if more_bits(l)   base
 *   Q6_K    Q6_K  Q6_K    base                   base                   base
 * more_bits(l) = l < n/8 || l >= 7n/8 || (l - n/8) % 3 == 2. MoE expert
 * tensors (*_exps) follow their dense counterpart. token_embd: base (the
 * output type when tied). The GQA rule of Q2_K is applied as Q4_K. */
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include "mk_mix.h"

static const mk_mix_t mk_mixes[] = {
    {"q2_K", GGML_TYPE_Q2_K, 10, 'M'},
    {"q3_K_S", GGML_TYPE_Q3_K, 11, 'S'},
    {"q3_K_M", GGML_TYPE_Q3_K, 12, 'M'},
    {"q3_K_L", GGML_TYPE_Q3_K, 13, 'L'},
    {"q4_K_S", GGML_TYPE_Q4_K, 14, 'S'},
    {"q4_K_M", GGML_TYPE_Q4_K, 15, 'M'},
    {"q5_K_S", GGML_TYPE_Q5_K, 16, 'S'},
    {"q5_K_M", GGML_TYPE_Q5_K, 17, 'M'},
    {"q6_K", GGML_TYPE_Q6_K, 18, 'M'},
};

const char *mk_mix_names(void)
{
    return "q2_K q3_K_S q3_K_M q3_K_L q4_K_S q4_K_M q5_K_S q5_K_M q6_K";
}

/* llama_ftype of a plain (every weight the same type) file */
static uint32_t plain_file_type(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_F32: return 0;
    case GGML_TYPE_F16: return 1;
    case GGML_TYPE_Q4_0: return 2;
    case GGML_TYPE_Q4_1: return 3;
    case GGML_TYPE_Q8_0: return 7;
    case GGML_TYPE_Q5_0: return 8;
    case GGML_TYPE_Q5_1: return 9;
    case GGML_TYPE_IQ4_NL: return 25;
    case GGML_TYPE_BF16: return 32;
    default: return 1024; /* "guessed": no preset writes it alone */
    }
}

pd_status_t mk_mix_parse(const char *s, mk_mix_t *mix)
{
    /* "q2_K" and "q6_K" name both a type and a preset: the preset wins
     * (Q6_K output etc.), as llama-quantize's names do */
    for (size_t i = 0; i < sizeof(mk_mixes) / sizeof(mk_mixes[0]); i++)
        if (strcasecmp(s, mk_mixes[i].name) == 0) {
            *mix = mk_mixes[i];
            return PD_OK;
        }
    ggml_type_t t;
    if (ggml_type_parse(s, &t) != PD_OK)
        return PD_ERR_BAD_INPUT;
    mix->name = ggml_type_name(t);
    mix->base = t;
    mix->file_type = plain_file_type(t);
    mix->variant = 0;
    return PD_OK;
}

static bool more_bits(int l, int n)
{
    return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2;
}

static uint32_t fallback(uint32_t type, uint64_t ne0)
{
    if (ne0 % 256 == 0)
        return type;
    switch (type) {
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K: return GGML_TYPE_IQ4_NL;
    case GGML_TYPE_Q4_K: return GGML_TYPE_Q5_0;
    case GGML_TYPE_Q5_K: return GGML_TYPE_Q5_1;
    case GGML_TYPE_Q6_K: return GGML_TYPE_Q8_0;
    default: return type;
    }
}

uint32_t mk_mix_type(const mk_mix_t *mix, const char *name, uint64_t ne0,
                     uint32_t n_layers, bool tied)
{
    uint32_t base = mix->base, t = base;
    if (strstr(name, "ffn_gate_inp") != NULL) /* MoE routers stay f32 */
        return GGML_TYPE_F32;
    if (mix->variant == 0)
        return fallback(base, ne0);
    int l = -1, n = (int)n_layers;
    if (strncmp(name, "blk.", 4) == 0)
        l = atoi(name + 4);
    const char *dot = l >= 0 ? strchr(name + 4, '.') : NULL;
    const char *part = dot ? dot + 1 : name;
    bool q2 = base == GGML_TYPE_Q2_K, q3 = base == GGML_TYPE_Q3_K;
    bool q4 = base == GGML_TYPE_Q4_K, q5 = base == GGML_TYPE_Q5_K;
    char v = mix->variant;
    if (strcmp(name, "output.weight") == 0 || (tied && strcmp(name, "token_embd.weight") == 0)) {
        t = GGML_TYPE_Q6_K;
    } else if (strncmp(part, "attn_v.", 7) == 0) {
        if (q2)
            t = GGML_TYPE_Q4_K;
        else if (q3 && v == 'M')
            t = l < 2 ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K;
        else if (q3 && v == 'L')
            t = GGML_TYPE_Q5_K;
        else if (q4 && v == 'S')
            t = l < 4 ? GGML_TYPE_Q5_K : base;
        else if ((q4 || q5) && v == 'M')
            t = more_bits(l, n) ? GGML_TYPE_Q6_K : base;
    } else if (strncmp(part, "ffn_down", 8) == 0) {
        if (q2)
            t = GGML_TYPE_Q3_K;
        else if (q3 && v == 'M')
            t = l < n / 16 ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K;
        else if (q3 && v == 'L')
            t = GGML_TYPE_Q5_K;
        else if (q4 && v == 'S')
            t = l < n / 8 ? GGML_TYPE_Q5_K : base;
        else if ((q4 || q5) && v == 'M')
            t = more_bits(l, n) ? GGML_TYPE_Q6_K : base;
    } else if (strncmp(part, "attn_output.", 12) == 0) {
        if (q2)
            t = GGML_TYPE_Q3_K;
        else if (q3 && v == 'M')
            t = GGML_TYPE_Q4_K;
        else if (q3 && v == 'L')
            t = GGML_TYPE_Q5_K;
    }
    return fallback(t, ne0);
}
