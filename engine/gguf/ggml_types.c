/* ggml_types.c - ggml type table and reference row (de)quantization. */
#include <math.h>
#include <strings.h>
#include "ggml_types.h"
#include "ggml_quants.h"

/* X(id, name, block_size, type_size, supported). Sizes as ggml's
 * type_traits (ggml.c); ids that ggml removed are absent. 40..42 as
 * @huggingface/gguf 0.4.6 (checked by the gguf-crosscheck-hf test). */
#define GGML_TYPE_LIST(X)                   \
    X(0,  "f32",     1,   4,   true)        \
    X(1,  "f16",     1,   2,   true)        \
    X(2,  "q4_0",    32,  18,  true)        \
    X(3,  "q4_1",    32,  20,  true)        \
    X(6,  "q5_0",    32,  22,  true)        \
    X(7,  "q5_1",    32,  24,  true)        \
    X(8,  "q8_0",    32,  34,  true)        \
    X(9,  "q8_1",    32,  36,  false)       \
    X(10, "q2_K",    256, 84,  true)        \
    X(11, "q3_K",    256, 110, true)        \
    X(12, "q4_K",    256, 144, true)        \
    X(13, "q5_K",    256, 176, true)        \
    X(14, "q6_K",    256, 210, true)        \
    X(15, "q8_K",    256, 292, false)       \
    X(16, "iq2_xxs", 256, 66,  false)       \
    X(17, "iq2_xs",  256, 74,  false)       \
    X(18, "iq3_xxs", 256, 98,  false)       \
    X(19, "iq1_s",   256, 50,  false)       \
    X(20, "iq4_nl",  32,  18,  true)        \
    X(21, "iq3_s",   256, 110, false)       \
    X(22, "iq2_s",   256, 82,  false)       \
    X(23, "iq4_xs",  256, 136, false)       \
    X(24, "i8",      1,   1,   false)       \
    X(25, "i16",     1,   2,   false)       \
    X(26, "i32",     1,   4,   false)       \
    X(27, "i64",     1,   8,   false)       \
    X(28, "f64",     1,   8,   false)       \
    X(29, "iq1_m",   256, 56,  false)       \
    X(30, "bf16",    1,   2,   true)        \
    X(34, "tq1_0",   256, 54,  false)       \
    X(35, "tq2_0",   256, 66,  false)       \
    X(39, "mxfp4",   32,  17,  false)       \
    X(40, "nvfp4",   64,  36,  false)       \
    X(41, "q1_0",    128, 18,  false)       \
    X(42, "q2_0",    64,  18,  false)

static const ggml_type_info_t ggml_type_table[GGML_TYPE_COUNT] = {
#define GGML_TYPE_ENTRY(id, nm, bs, ts, sup) [id] = {nm, bs, ts, sup},
    GGML_TYPE_LIST(GGML_TYPE_ENTRY)
#undef GGML_TYPE_ENTRY
};

const ggml_type_info_t *ggml_type_info(uint32_t type)
{
    if (type >= GGML_TYPE_COUNT || ggml_type_table[type].name == NULL)
        return NULL;
    return &ggml_type_table[type];
}

const char *ggml_type_name(uint32_t type)
{
    const ggml_type_info_t *info = ggml_type_info(type);
    return info ? info->name : "?";
}

pd_status_t ggml_type_parse(const char *name, ggml_type_t *type_p)
{
    for (uint32_t t = 0; t < GGML_TYPE_COUNT; t++) {
        const ggml_type_info_t *info = ggml_type_info(t);
        if (info && info->supported && strcasecmp(info->name, name) == 0) {
            *type_p = (ggml_type_t)t;
            return PD_OK;
        }
    }
    return PD_ERR_BAD_INPUT;
}

const char *ggml_supported_types(void)
{
    return "f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl q2_K q3_K q4_K q5_K q6_K";
}

pd_status_t ggml_nbytes(uint32_t type, uint64_t n_elements, uint64_t *bytes_p)
{
    const ggml_type_info_t *info = ggml_type_info(type);
    uint64_t bytes;

    if (info == NULL)
        return PD_ERR_BAD_TYPE;
    if (n_elements % info->block_size != 0)
        return PD_ERR_BAD_INPUT;
    if (__builtin_mul_overflow(n_elements / info->block_size, (uint64_t)info->type_size,
                               &bytes))
        return PD_ERR_TOO_BIG;
    *bytes_p = bytes;
    return PD_OK;
}

static void dequant_q8_0(const uint8_t *src, float *dst, uint64_t n)
{
    for (uint64_t b = 0; b < n / GGML_QK8_0; b++) {
        ggml_block_q8_0_t blk;
        memcpy(&blk, src + b * sizeof(blk), sizeof(blk));
        float d = ggml_fp16_to_fp32(blk.d);
        for (int j = 0; j < GGML_QK8_0; j++)
            dst[b * GGML_QK8_0 + j] = (float)blk.qs[j] * d;
    }
}

static void dequant_q4_0(const uint8_t *src, float *dst, uint64_t n)
{
    for (uint64_t b = 0; b < n / GGML_QK4_0; b++) {
        ggml_block_q4_0_t blk;
        memcpy(&blk, src + b * sizeof(blk), sizeof(blk));
        float d = ggml_fp16_to_fp32(blk.d);
        for (int j = 0; j < GGML_QK4_0 / 2; j++) {
            dst[b * GGML_QK4_0 + j] = (float)((blk.qs[j] & 0x0F) - 8) * d;
            dst[b * GGML_QK4_0 + j + GGML_QK4_0 / 2] = (float)((blk.qs[j] >> 4) - 8) * d;
        }
    }
}

/* ggml quantize_row_q8_0_ref */
static void quant_q8_0(const float *src, uint8_t *dst, uint64_t n)
{
    for (uint64_t b = 0; b < n / GGML_QK8_0; b++) {
        const float *x = src + b * GGML_QK8_0;
        ggml_block_q8_0_t blk;
        float amax = 0.0f;
        for (int j = 0; j < GGML_QK8_0; j++) {
            float v = fabsf(x[j]);
            amax = amax > v ? amax : v;
        }
        const float d = amax / ((1 << 7) - 1);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = ggml_fp32_to_fp16(d);
        for (int j = 0; j < GGML_QK8_0; j++)
            blk.qs[j] = (int8_t)roundf(x[j] * id);
        memcpy(dst + b * sizeof(blk), &blk, sizeof(blk));
    }
}

/* ggml quantize_row_q4_0_ref */
static void quant_q4_0(const float *src, uint8_t *dst, uint64_t n)
{
    for (uint64_t b = 0; b < n / GGML_QK4_0; b++) {
        const float *x = src + b * GGML_QK4_0;
        ggml_block_q4_0_t blk;
        float amax = 0.0f; /* absolute max */
        float max = 0.0f;
        for (int j = 0; j < GGML_QK4_0; j++) {
            const float v = x[j];
            if (amax < fabsf(v)) {
                amax = fabsf(v);
                max = v;
            }
        }
        const float d = max / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = ggml_fp32_to_fp16(d);
        for (int j = 0; j < GGML_QK4_0 / 2; j++) {
            const float x0 = x[j] * id;
            const float x1 = x[GGML_QK4_0 / 2 + j] * id;
            int xi0 = (int8_t)(x0 + 8.5f);
            int xi1 = (int8_t)(x1 + 8.5f);
            xi0 = xi0 < 15 ? xi0 : 15;
            xi1 = xi1 < 15 ? xi1 : 15;
            blk.qs[j] = (uint8_t)(xi0 | (xi1 << 4));
        }
        memcpy(dst + b * sizeof(blk), &blk, sizeof(blk));
    }
}

/* 16-bit float rows (F16, BF16) through one element conversion. */
static void half_to_f32(const uint8_t *s, float *dst, uint64_t n, float (*cv)(uint16_t))
{
    for (uint64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = cv(h);
    }
}

static void f32_to_half(const float *src, uint8_t *d, uint64_t n, uint16_t (*cv)(float))
{
    for (uint64_t i = 0; i < n; i++) {
        uint16_t h = cv(src[i]);
        memcpy(d + 2 * i, &h, 2);
    }
}

static pd_status_t check_row(uint32_t type, uint64_t n)
{
    const ggml_type_info_t *info = ggml_type_info(type);

    if (info == NULL || !info->supported)
        return PD_ERR_UNSUPPORTED;
    if (n % info->block_size != 0)
        return PD_ERR_BAD_INPUT;
    return PD_OK;
}

pd_status_t ggml_dequantize_row(uint32_t type, const void *src, float *dst, uint64_t n)
{
    const uint8_t *s = src;
    pd_status_t status = check_row(type, n);

    if (status != PD_OK)
        return status;
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case GGML_TYPE_F16:
        half_to_f32(s, dst, n, ggml_fp16_to_fp32);
        break;
    case GGML_TYPE_BF16:
        half_to_f32(s, dst, n, ggml_bf16_to_fp32);
        break;
    case GGML_TYPE_Q8_0:
        dequant_q8_0(s, dst, n);
        break;
    case GGML_TYPE_Q4_0:
        dequant_q4_0(s, dst, n);
        break;
    default:
        return ggml_quants_dequantize(type, s, dst, n);
    }
    return PD_OK;
}

pd_status_t ggml_quantize_row(uint32_t type, const float *src, void *dst, uint64_t n)
{
    uint8_t *d = dst;
    pd_status_t status = check_row(type, n);

    if (status != PD_OK)
        return status;
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case GGML_TYPE_F16:
        f32_to_half(src, d, n, ggml_fp32_to_fp16);
        break;
    case GGML_TYPE_BF16:
        f32_to_half(src, d, n, ggml_fp32_to_bf16);
        break;
    case GGML_TYPE_Q8_0:
        quant_q8_0(src, d, n);
        break;
    case GGML_TYPE_Q4_0:
        quant_q4_0(src, d, n);
        break;
    default:
        return ggml_quants_quantize(type, src, d, n);
    }
    return PD_OK;
}
