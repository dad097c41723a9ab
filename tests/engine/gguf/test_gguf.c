/* test_gguf.c - GGUF reader/writer and ggml type unit tests:
 * conversions, quantizer layouts, writer->reader round trips (memory and
 * file), and one test per class of corrupt file (made by patching a valid
 * file from the writer), each expecting a specific status and message. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <cmocka.h>
#include "gguf.h"
#include "ggml_quants.h"

/* ---------- conversions ---------- */

static void test_fp16_roundtrip(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ggml_fp16_to_fp32((uint16_t)h);
        uint16_t back = ggml_fp32_to_fp16(f);
        if (isnan(f)) {
            assert_true((back & 0x7C00) == 0x7C00 && (back & 0x3FF) != 0);
            continue;
        }
        assert_int_equal(back, h);
    }
    assert_int_equal(ggml_fp32_to_fp16(1.0f), 0x3C00);
    assert_int_equal(ggml_fp32_to_fp16(65504.0f), 0x7BFF);
    assert_int_equal(ggml_fp32_to_fp16(65520.0f), 0x7C00);        /* rounds to inf */
    assert_int_equal(ggml_fp32_to_fp16(1.0f + 0x1.0p-11f), 0x3C00); /* tie -> even */
    assert_int_equal(ggml_fp32_to_fp16(1.0f + 0x1.8p-10f), 0x3C02); /* tie -> even (up) */
    assert_int_equal(ggml_fp32_to_fp16(0x1.0p-24f), 0x0001);      /* smallest subnormal */
    assert_int_equal(ggml_fp32_to_fp16(-2.0f), 0xC000);
    assert_int_equal(ggml_fp32_to_fp16(NAN), 0x7E00);
}

static void test_bf16(void **state)
{
    (void)state;
    assert_int_equal(ggml_fp32_to_bf16(1.0f), 0x3F80);
    assert_true(ggml_bf16_to_fp32(0x3F80) == 1.0f);
    assert_int_equal(ggml_fp32_to_bf16(1.0f + 0x1.0p-8f), 0x3F80);  /* tie -> even */
    assert_int_equal(ggml_fp32_to_bf16(1.0f + 0x1.8p-7f), 0x3F82);  /* tie -> even (up) */
    assert_true(isnan(ggml_bf16_to_fp32(ggml_fp32_to_bf16(NAN))));
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ggml_bf16_to_fp32((uint16_t)h);
        if (!isnan(f))
            assert_int_equal(ggml_fp32_to_bf16(f), h);
    }
}

static void test_type_table(void **state)
{
    uint64_t n;
    ggml_type_t t;
    (void)state;
    assert_int_equal(ggml_type_info(GGML_TYPE_Q8_0)->type_size, 34);
    assert_int_equal(ggml_type_info(GGML_TYPE_Q4_0)->type_size, 18);
    assert_int_equal(ggml_type_info(GGML_TYPE_BF16)->type_size, 2);
    assert_null(ggml_type_info(4));
    assert_null(ggml_type_info(31));
    assert_null(ggml_type_info(1000));
    assert_int_equal(ggml_nbytes(GGML_TYPE_Q4_0, 64, &n), PD_OK);
    assert_int_equal(n, 36);
    assert_int_equal(ggml_nbytes(GGML_TYPE_Q4_0, 33, &n), PD_ERR_BAD_INPUT);
    assert_int_equal(ggml_nbytes(GGML_TYPE_F32, UINT64_MAX / 2, &n), PD_ERR_TOO_BIG);
    assert_int_equal(ggml_nbytes(77, 1, &n), PD_ERR_BAD_TYPE);
    assert_int_equal(ggml_type_parse("q8_0", &t), PD_OK);
    assert_int_equal(t, GGML_TYPE_Q8_0);
    assert_int_equal(ggml_type_parse("q4_K", &t), PD_OK);
    assert_int_equal(t, GGML_TYPE_Q4_K);
    assert_int_equal(ggml_type_parse("Q6_K", &t), PD_OK);
    assert_int_equal(t, GGML_TYPE_Q6_K);
    assert_int_equal(ggml_type_parse("iq2_xs", &t), PD_ERR_BAD_INPUT);
    assert_string_equal(ggml_type_name(12), "q4_K");
}

static void test_q8_0_layout(void **state)
{
    float x[32], y[32];
    ggml_block_q8_0_t blk;
    (void)state;
    for (int i = 0; i < 32; i++)
        x[i] = (float)(i - 16) / 16.0f * 1.27f;   /* amax = 1.27 -> d = 0.01 */
    assert_int_equal(ggml_quantize_row(GGML_TYPE_Q8_0, x, &blk, 32), PD_OK);
    assert_int_equal(blk.d, ggml_fp32_to_fp16(1.27f / 127.0f));
    assert_int_equal(blk.qs[0], -127);
    assert_int_equal(blk.qs[16], 0);
    assert_int_equal(blk.qs[31], 119);  /* 15/16*1.27/0.01 = 119.06 */
    assert_int_equal(ggml_dequantize_row(GGML_TYPE_Q8_0, &blk, y, 32), PD_OK);
    for (int i = 0; i < 32; i++)
        assert_true(fabsf(x[i] - y[i]) <= 0.006f);
    /* all-zero block: d = 0, no NaN */
    memset(x, 0, sizeof(x));
    assert_int_equal(ggml_quantize_row(GGML_TYPE_Q8_0, x, &blk, 32), PD_OK);
    assert_int_equal(ggml_dequantize_row(GGML_TYPE_Q8_0, &blk, y, 32), PD_OK);
    for (int i = 0; i < 32; i++)
        assert_true(y[i] == 0.0f);
    assert_int_equal(ggml_quantize_row(GGML_TYPE_Q8_0, x, &blk, 31), PD_ERR_BAD_INPUT);
}

static void test_q4_0_layout(void **state)
{
    float x[32], y[32];
    ggml_block_q4_0_t blk;
    (void)state;
    /* max-magnitude value -8 -> d = 1; elements i: value (i%16) - 8 for the
     * low half, 7 - (i%16) for the high half */
    for (int i = 0; i < 16; i++) {
        x[i] = (float)(i - 8);
        x[16 + i] = (float)(7 - i);
    }
    assert_int_equal(ggml_quantize_row(GGML_TYPE_Q4_0, x, &blk, 32), PD_OK);
    assert_true(ggml_fp16_to_fp32(blk.d) == 1.0f);
    for (int i = 0; i < 16; i++) {
        assert_int_equal(blk.qs[i] & 0xF, i);        /* low nibble = element i */
        assert_int_equal(blk.qs[i] >> 4, 15 - i);    /* high nibble = element i+16 */
    }
    assert_int_equal(ggml_dequantize_row(GGML_TYPE_Q4_0, &blk, y, 32), PD_OK);
    for (int i = 0; i < 32; i++)
        assert_true(x[i] == y[i]);
    /* random-ish data: error within d/2 */
    for (int i = 0; i < 32; i++)
        x[i] = sinf((float)i * 0.7f) * 3.0f;
    assert_int_equal(ggml_quantize_row(GGML_TYPE_Q4_0, x, &blk, 32), PD_OK);
    assert_int_equal(ggml_dequantize_row(GGML_TYPE_Q4_0, &blk, y, 32), PD_OK);
    float d = fabsf(ggml_fp16_to_fp32(blk.d));
    for (int i = 0; i < 32; i++)
        assert_true(fabsf(x[i] - y[i]) <= d * 0.5f + 1e-5f || fabsf(x[i] - y[i]) <= d);
}

/* Every quantized type: quantize -> dequantize keeps the RMS error within
 * what its bit width allows, over several value distributions (incl. all
 * positive, all negative, constant and zero blocks). */
static void test_quant_roundtrip_all(void **state)
{
    (void)state;
    static const struct { uint32_t type; double tol; } types[] = {
        { GGML_TYPE_Q4_0, 0.10 }, { GGML_TYPE_Q4_1, 0.08 }, { GGML_TYPE_Q5_0, 0.05 },
        { GGML_TYPE_Q5_1, 0.04 }, { GGML_TYPE_IQ4_NL, 0.10 }, { GGML_TYPE_Q8_0, 0.008 },
        { GGML_TYPE_Q2_K, 0.35 }, { GGML_TYPE_Q3_K, 0.20 }, { GGML_TYPE_Q4_K, 0.08 },
        { GGML_TYPE_Q5_K, 0.04 }, { GGML_TYPE_Q6_K, 0.025 },
    };
    enum { N = 1024 };
    static float x[N], y[N];
    static uint8_t buf[N * 2];
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        for (int dist = 0; dist < 5; dist++) {
            uint64_t s = 1234 + (uint64_t)dist;
            for (int i = 0; i < N; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                float u = (float)((s >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
                switch (dist) {
                case 0: x[i] = u * 2.0f; break;
                case 1: x[i] = u * 0.01f + 0.5f; break;            /* all positive */
                case 2: x[i] = -fabsf(u) * (float)(1 + i % 7); break; /* negative */
                case 3: x[i] = i < N / 2 ? 0.0f : 0.25f; break;      /* constant */
                default: x[i] = u * (i % 64 == 3 ? 40.0f : 1.0f); break; /* outliers */
                }
            }
            uint64_t nb;
            assert_int_equal(ggml_nbytes(types[t].type, N, &nb), PD_OK);
            assert_true(nb <= sizeof(buf));
            assert_int_equal(ggml_quantize_row(types[t].type, x, buf, N), PD_OK);
            assert_int_equal(ggml_dequantize_row(types[t].type, buf, y, N), PD_OK);
            /* the AVX2 decoders equal the scalar ones bit for bit */
            static float ys[N];
            ggml_quants_set_simd(0);
            assert_int_equal(ggml_dequantize_row(types[t].type, buf, ys, N), PD_OK);
            ggml_quants_set_simd(1);
            assert_memory_equal(y, ys, sizeof(ys));
            double se = 0, sx = 0;
            for (int i = 0; i < N; i++) {
                assert_true(isfinite(y[i]));
                se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
                sx += (double)x[i] * x[i];
            }
            double rel = sx > 0 ? sqrt(se / sx) : sqrt(se);
            double tol = types[t].tol * (dist == 4 ? 2.0 : 1.0); /* 40x outliers */
            if (rel > tol)
                fprintf(stderr, "%s dist %d: rms rel err %.4f > %.4f\n",
                        ggml_type_name(types[t].type), dist, rel, tol);
            assert_true(rel <= tol);
        }
        assert_int_equal(ggml_quantize_row(types[t].type, x, buf, 16), PD_ERR_BAD_INPUT);
    }
}

/* Arbitrary block bytes (every scale/bit pattern): AVX2 decoders = scalar. */
static void test_dequant_simd_random_bytes(void **state)
{
    (void)state;
    static const struct { uint32_t type, ts; uint32_t d_off[2]; } ks[] = {
        { GGML_TYPE_Q4_K, 144, { 0, 2 } }, { GGML_TYPE_Q5_K, 176, { 0, 2 } },
        { GGML_TYPE_Q6_K, 210, { 208, 208 } }, { GGML_TYPE_Q2_K, 84, { 80, 82 } },
        { GGML_TYPE_Q3_K, 110, { 108, 108 } },
    };
    enum { NB = 64 };
    static uint8_t buf[NB * 210];
    static float a[NB * 256], b[NB * 256];
    uint64_t s = 99;
    for (size_t k = 0; k < sizeof(ks) / sizeof(ks[0]); k++) {
        for (size_t i = 0; i < sizeof(buf); i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            buf[i] = (uint8_t)(s >> 56);
        }
        for (int blk = 0; blk < NB; blk++)
            for (int j = 0; j < 2; j++) { /* finite fp16 scales */
                uint8_t *p = buf + (size_t)blk * ks[k].ts + ks[k].d_off[j];
                p[1] &= 0x3B;
            }
        assert_int_equal(ggml_dequantize_row(ks[k].type, buf, a, NB * 256), PD_OK);
        ggml_quants_set_simd(0);
        assert_int_equal(ggml_dequantize_row(ks[k].type, buf, b, NB * 256), PD_OK);
        ggml_quants_set_simd(1);
        assert_memory_equal(a, b, sizeof(a));
    }
}

/* ---------- writer -> reader round trip ---------- */

#define RT_ROWS 3
#define RT_COLS 64

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = sinf((float)i * 0.37f + scale) * scale;
}

static gguf_writer_t *make_writer(uint32_t alignment)
{
    gguf_writer_t *w;
    static const char *const strs[] = {"alpha", "", "g\xc3\xa4mma"};
    static const int32_t ints[] = {-1, 0, 7, INT32_MAX};
    static const float fl[] = {0.5f, -2.25f};
    static const uint8_t bools[] = {1, 0, 1};
    float data[RT_ROWS * RT_COLS];

    assert_int_equal(gguf_writer_create(&w), PD_OK);
    assert_int_equal(gguf_writer_set_alignment(w, alignment), PD_OK);
    assert_int_equal(gguf_writer_add_string(w, "general.architecture", "llama"), PD_OK);
    assert_int_equal(gguf_writer_add_u8(w, "t.u8", 200), PD_OK);
    assert_int_equal(gguf_writer_add_u32(w, "t.u32", 4000000000u), PD_OK);
    assert_int_equal(gguf_writer_add_i32(w, "t.i32", -5), PD_OK);
    assert_int_equal(gguf_writer_add_u64(w, "t.u64", 1ull << 40), PD_OK);
    assert_int_equal(gguf_writer_add_f32(w, "t.f32", 1e-5f), PD_OK);
    assert_int_equal(gguf_writer_add_bool(w, "t.bool", true), PD_OK);
    assert_int_equal(gguf_writer_add_arr_str(w, "t.strs", strs, NULL, 3), PD_OK);
    assert_int_equal(gguf_writer_add_arr_i32(w, "t.arr", ints, 4), PD_OK);
    assert_int_equal(gguf_writer_add_arr_f32(w, "t.f32s", fl, 2), PD_OK);
    assert_int_equal(gguf_writer_add_arr(w, "t.bools", GGUF_TYPE_BOOL, bools, 3), PD_OK);
    assert_int_equal(gguf_writer_add_u32(w, "t.u32", 1), PD_ERR_EXISTS);
    assert_int_equal(gguf_writer_add_u32(w, "", 1), PD_ERR_BAD_INPUT);
    assert_int_equal(gguf_writer_add_u32(w, "bad\nkey", 1), PD_ERR_BAD_INPUT);
    /* the alignment key only comes from set_alignment */
    assert_int_equal(gguf_writer_add_u32(w, "general.alignment", 64), PD_ERR_BAD_INPUT);
    assert_int_equal(gguf_writer_set_alignment(w, 48), PD_ERR_BAD_INPUT);
    assert_int_equal(gguf_writer_set_alignment(w, 4), PD_ERR_BAD_INPUT);

    static const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16,
                                     GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    for (size_t t = 0; t < 5; t++) {
        char name[64];
        uint64_t ne[2] = {RT_COLS, RT_ROWS};
        snprintf(name, sizeof(name), "tensor_%s", ggml_type_name(types[t]));
        fill(data, RT_ROWS * RT_COLS, (float)(t + 1));
        assert_int_equal(gguf_writer_add_tensor_f32(w, name, types[t], 2, ne, data), PD_OK);
    }
    uint64_t ne1[1] = {RT_COLS};
    fill(data, RT_COLS, 1.0f);
    assert_int_equal(gguf_writer_add_tensor_f32(w, "tensor_f32", GGML_TYPE_F32, 1, ne1, data),
                     PD_ERR_EXISTS);
    uint64_t bad[1] = {33};
    assert_int_equal(gguf_writer_add_tensor_f32(w, "odd", GGML_TYPE_Q8_0, 1, bad, data),
                     PD_ERR_BAD_INPUT);
    assert_int_equal(gguf_writer_add_tensor_f32(w, "iq2xxs", 16, 1, ne1, data), PD_ERR_UNSUPPORTED);
    assert_int_equal(gguf_writer_add_tensor_f32(w, "vec", GGML_TYPE_F32, 1, ne1, data), PD_OK);
    return w;
}

static void check_kvs(const gguf_t *g, uint32_t alignment)
{
    uint32_t u32;
    int32_t i32;
    uint64_t u64, len;
    float f;
    bool b;
    const char *s;
    const gguf_arr_t *arr;

    assert_int_equal(gguf_version(g), 3);
    assert_int_equal(gguf_alignment(g), alignment);
    assert_int_equal(gguf_kv_count(g), 11 + (alignment != 32));
    assert_int_equal(gguf_get_string(g, "general.architecture", &s, &len), PD_OK);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "llama", 5);
    assert_int_equal(gguf_get_u32(g, "t.u8", &u32), PD_OK);
    assert_int_equal(u32, 200);
    assert_int_equal(gguf_get_u32(g, "t.u32", &u32), PD_OK);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(gguf_get_i32(g, "t.u32", &i32), PD_ERR_BAD_TYPE); /* does not fit */
    assert_int_equal(gguf_get_i32(g, "t.i32", &i32), PD_OK);
    assert_int_equal(i32, -5);
    assert_int_equal(gguf_get_u32(g, "t.i32", &u32), PD_ERR_BAD_TYPE);
    assert_int_equal(gguf_get_u64(g, "t.u64", &u64), PD_OK);
    assert_int_equal(u64, 1ull << 40);
    assert_int_equal(gguf_get_u32(g, "t.u64", &u32), PD_ERR_BAD_TYPE);
    assert_int_equal(gguf_get_f32(g, "t.f32", &f), PD_OK);
    assert_true(f == 1e-5f);
    assert_int_equal(gguf_get_f32(g, "t.u32", &f), PD_ERR_BAD_TYPE);
    assert_int_equal(gguf_get_bool(g, "t.bool", &b), PD_OK);
    assert_true(b);
    assert_int_equal(gguf_get_u32(g, "nope", &u32), PD_ERR_NOT_FOUND);
    assert_int_equal(gguf_get_string(g, "t.u32", &s, &len), PD_ERR_BAD_TYPE);

    assert_int_equal(gguf_get_arr(g, "t.strs", GGUF_TYPE_STRING, &arr), PD_OK);
    assert_int_equal(arr->count, 3);
    s = gguf_arr_str(arr, 0, &len);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "alpha", 5);
    s = gguf_arr_str(arr, 1, &len);
    assert_int_equal(len, 0);
    s = gguf_arr_str(arr, 2, &len);
    assert_int_equal(len, 6);
    assert_memory_equal(s, "g\xc3\xa4mma", 6);
    assert_int_equal(gguf_get_arr(g, "t.strs", GGUF_TYPE_INT32, &arr), PD_ERR_BAD_TYPE);
    assert_int_equal(gguf_get_arr(g, "t.arr", GGUF_TYPE_INT32, &arr), PD_OK);
    assert_int_equal(arr->count, 4);
    assert_int_equal(gguf_arr_int(arr, 0), -1);
    assert_int_equal(gguf_arr_int(arr, 3), INT32_MAX);
    assert_int_equal(gguf_get_arr(g, "t.f32s", GGUF_TYPE_COUNT, &arr), PD_OK);
    assert_true(gguf_arr_float(arr, 1) == -2.25);
    assert_int_equal(gguf_get_arr(g, "t.bools", GGUF_TYPE_BOOL, &arr), PD_OK);
    assert_int_equal(gguf_arr_int(arr, 0), 1);
    assert_int_equal(gguf_arr_int(arr, 1), 0);

    /* first kv in file order */
    assert_string_equal(gguf_kv_at(g, 0)->key, alignment != 32 ? "general.alignment"
                                                                : "general.architecture");
    assert_null(gguf_kv_at(g, 100));
}

static void check_reader(const gguf_t *g, uint32_t alignment)
{
    check_kvs(g, alignment);
    assert_int_equal(gguf_tensor_count(g), 6);
    static const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16,
                                     GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    static const float tol[] = {0.0f, 0.004f, 0.03f, 0.05f, 0.7f};
    float ref[RT_ROWS * RT_COLS], got[RT_ROWS * RT_COLS];
    for (size_t t = 0; t < 5; t++) {
        char name[64];
        snprintf(name, sizeof(name), "tensor_%s", ggml_type_name(types[t]));
        const gguf_tensor_t *ten = gguf_tensor_find(g, name);
        assert_non_null(ten);
        assert_ptr_equal(ten, gguf_tensor_at(g, t));
        assert_int_equal(ten->type, types[t]);
        assert_int_equal(ten->n_dims, 2);
        assert_int_equal(ten->ne[0], RT_COLS);
        assert_int_equal(ten->ne[1], RT_ROWS);
        assert_int_equal(ten->ne[2], 1);
        assert_int_equal(ten->n_elements, RT_ROWS * RT_COLS);
        assert_int_equal(ten->offset % alignment, 0);
        assert_int_equal(((uintptr_t)ten->data - (uintptr_t)gguf_file_data(g)) % alignment, 0);
        fill(ref, RT_ROWS * RT_COLS, (float)(t + 1));
        assert_int_equal(ggml_dequantize_row(ten->type, ten->data, got, ten->n_elements), PD_OK);
        for (size_t i = 0; i < RT_ROWS * RT_COLS; i++)
            assert_true(fabsf(ref[i] - got[i]) <= tol[t] * (float)(t + 1));
    }
    assert_null(gguf_tensor_find(g, "missing"));
    assert_non_null(gguf_tensor_find(g, "vec"));
}

static void test_roundtrip_memory(void **state)
{
    (void)state;
    static const uint32_t aligns[] = {32, 8, 64, 4096};
    for (size_t a = 0; a < 4; a++) {
        gguf_writer_t *w = make_writer(aligns[a]);
        uint8_t *buf;
        size_t size;
        gguf_t *g;
        char err[256] = "";
        assert_int_equal(gguf_writer_write_memory(w, &buf, &size), PD_OK);
        /* copy into an aligned buffer so data alignment is meaningful */
        void *al = NULL;
        assert_int_equal(posix_memalign(&al, 4096, size), 0);
        memcpy(al, buf, size);
        assert_int_equal(gguf_open_memory(al, size, &g, err, sizeof(err)), PD_OK);
        check_reader(g, aligns[a]);
        gguf_close(g);
        free(al);
        free(buf);
        gguf_writer_destroy(w);
    }
}

/* gguf_release: a mapped file's released pages read back as the file's
 * bytes; a memory buffer is left alone */
static void test_release(void **state)
{
    (void)state;
    enum { N = 4 * 4096 };
    static float v[N];
    for (int i = 0; i < N; i++)
        v[i] = (float)i;
    gguf_writer_t *w;
    assert_int_equal(gguf_writer_create(&w), PD_OK);
    const uint64_t ne[1] = { N };
    assert_int_equal(gguf_writer_add_tensor_f32(w, "t", GGML_TYPE_F32, 1, ne, v), PD_OK);
    char path[] = "/tmp/pd-gguf-release-XXXXXX", err[256] = "";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(gguf_writer_write(w, path, err, sizeof(err)), PD_OK);
    gguf_t *g;
    assert_int_equal(gguf_open(path, &g, err, sizeof(err)), PD_OK);
    const gguf_tensor_t *t = gguf_tensor_find(g, "t");
    assert_non_null(t);
    assert_memory_equal(t->data, v, sizeof v);
    gguf_release(g, t->data, sizeof v);
    assert_memory_equal(t->data, v, sizeof v);
    gguf_release(g, (const uint8_t *)t->data - 1, 10); /* not its own: ignored */
    gguf_close(g);
    unlink(path);

    uint8_t *buf;
    size_t size;
    assert_int_equal(gguf_writer_write_memory(w, &buf, &size), PD_OK);
    void *al = NULL;
    assert_int_equal(posix_memalign(&al, 4096, size), 0);
    memcpy(al, buf, size);
    assert_int_equal(gguf_open_memory(al, size, &g, err, sizeof(err)), PD_OK);
    t = gguf_tensor_find(g, "t");
    gguf_release(g, t->data, sizeof v);
    assert_memory_equal(t->data, v, sizeof v);
    gguf_close(g);
    free(al);
    free(buf);
    gguf_writer_destroy(w);
}

static void test_roundtrip_file(void **state)
{
    char path[] = "/tmp/pd-gguf-test-XXXXXX";
    int fd = mkstemp(path);
    gguf_writer_t *w = make_writer(32);
    gguf_t *g;
    char err[256] = "";
    uint8_t *buf;
    size_t size;
    (void)state;

    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(gguf_writer_write(w, path, err, sizeof(err)), PD_OK);
    assert_int_equal(gguf_open(path, &g, err, sizeof(err)), PD_OK);
    check_reader(g, 32);
    /* the file and the memory image are the same bytes */
    assert_int_equal(gguf_writer_write_memory(w, &buf, &size), PD_OK);
    assert_int_equal(gguf_file_size(g), size);
    assert_memory_equal(gguf_file_data(g), buf, size);
    free(buf);

    /* copy every kv into a new writer: identical metadata */
    gguf_writer_t *w2;
    assert_int_equal(gguf_writer_create(&w2), PD_OK);
    for (uint64_t i = 0; i < gguf_kv_count(g); i++)
        assert_int_equal(gguf_writer_add_kv_from(w2, gguf_kv_at(g, i)), PD_OK);
    assert_int_equal(gguf_writer_write_memory(w2, &buf, &size), PD_OK);
    gguf_t *g2;
    assert_int_equal(gguf_open_memory(buf, size, &g2, err, sizeof(err)), PD_OK);
    assert_int_equal(gguf_kv_count(g2), gguf_kv_count(g));
    assert_int_equal(gguf_tensor_count(g2), 0);
    for (uint64_t i = 0; i < gguf_kv_count(g); i++) {
        assert_string_equal(gguf_kv_at(g, i)->key, gguf_kv_at(g2, i)->key);
        assert_int_equal(gguf_kv_at(g, i)->type, gguf_kv_at(g2, i)->type);
    }
    check_kvs(g2, 32);
    gguf_close(g2);
    free(buf);
    gguf_writer_destroy(w2);
    gguf_close(g);
    gguf_writer_destroy(w);

    assert_int_equal(gguf_open("/nonexistent/x.gguf", &g, err, sizeof(err)), PD_ERR_IO);
    assert_non_null(strstr(err, "No such file"));
    assert_int_equal(gguf_open("/tmp", &g, err, sizeof(err)), PD_ERR_IO);
    unlink(path);
}

/* ---------- corrupt files ---------- */

typedef struct {
    uint8_t *buf;
    size_t size;
} image_t;

/* A small valid file with alignment 64, two kvs of interest and two tensors. */
static image_t base_image(void)
{
    gguf_writer_t *w;
    image_t im;
    static const char *const strs[] = {"a", "bc"};
    static const int32_t ints[] = {1, 2, 3};
    float data[64];

    fill(data, 64, 1.0f);
    assert_int_equal(gguf_writer_create(&w), PD_OK);
    assert_int_equal(gguf_writer_set_alignment(w, 64), PD_OK);
    assert_int_equal(gguf_writer_add_string(w, "general.name", "tiny"), PD_OK);
    assert_int_equal(gguf_writer_add_u32(w, "k.u32", 7), PD_OK);
    assert_int_equal(gguf_writer_add_arr_i32(w, "k.arr", ints, 3), PD_OK);
    assert_int_equal(gguf_writer_add_arr_str(w, "k.strs", strs, NULL, 2), PD_OK);
    assert_int_equal(gguf_writer_add_bool(w, "k.bool", true), PD_OK);
    uint64_t ne_a[2] = {32, 2};
    uint64_t ne_b[1] = {64};
    assert_int_equal(gguf_writer_add_tensor_f32(w, "tensor_alpha", GGML_TYPE_F32, 2, ne_a, data),
                     PD_OK);
    assert_int_equal(gguf_writer_add_tensor_f32(w, "tensor_betaa", GGML_TYPE_Q8_0, 1, ne_b, data),
                     PD_OK);
    assert_int_equal(gguf_writer_write_memory(w, &im.buf, &im.size), PD_OK);
    gguf_writer_destroy(w);
    return im;
}

/* Offset just past the (unique) string s in the image. */
static size_t after(const image_t *im, const char *s)
{
    const uint8_t *p = memmem(im->buf, im->size, s, strlen(s));
    assert_non_null(p);
    assert_null(memmem(p + 1, im->size - (size_t)(p + 1 - im->buf), s, strlen(s)));
    return (size_t)(p - im->buf) + strlen(s);
}

static void put_u32(image_t *im, size_t off, uint32_t v) { memcpy(im->buf + off, &v, 4); }
static void put_u64(image_t *im, size_t off, uint64_t v) { memcpy(im->buf + off, &v, 8); }

static void expect_fail(const image_t *im, pd_status_t want, const char *msg)
{
    gguf_t *g = NULL;
    char err[256] = "";
    pd_status_t got = gguf_open_memory(im->buf, im->size, &g, err, sizeof(err));
    if (got != want || strstr(err, msg) == NULL)
        fail_msg("want %s '%s', got %s '%s'", pd_status_name(want), msg, pd_status_name(got), err);
    assert_null(g);
    assert_null(strchr(err, '\n'));
}

#define CORRUPT(name, want, msg, ...)                        \
    static void name(void **state)                           \
    {                                                        \
        image_t im = base_image();                           \
        (void)state;                                         \
        __VA_ARGS__;                                         \
        expect_fail(&im, want, msg);                         \
        free(im.buf);                                        \
    }

CORRUPT(t_bad_magic, PD_ERR_BAD_MAGIC, "bad magic", im.buf[0] = 'X')
CORRUPT(t_version_2, PD_ERR_BAD_VERSION, "version 2 unsupported", put_u32(&im, 4, 2))
CORRUPT(t_version_4, PD_ERR_BAD_VERSION, "version 4 unsupported", put_u32(&im, 4, 4))
CORRUPT(t_huge_tensor_count, PD_ERR_TOO_BIG, "tensor count", put_u64(&im, 8, 1ull << 40))
CORRUPT(t_huge_kv_count, PD_ERR_TOO_BIG, "kv count", put_u64(&im, 16, UINT64_MAX))
CORRUPT(t_kv_count_unfit, PD_ERR_TRUNCATED, "kvs cannot fit", put_u64(&im, 16, 60000))
CORRUPT(t_huge_string, PD_ERR_TOO_BIG, "string length",
        put_u64(&im, after(&im, "general.name") + 4, 1ull << 40))
CORRUPT(t_long_string, PD_ERR_TRUNCATED, "'general.name' string",
        put_u64(&im, after(&im, "general.name") + 4, 1u << 20))
CORRUPT(t_empty_key, PD_ERR_BAD_INPUT, "empty name", put_u64(&im, after(&im, "k.u32") - 13, 0))
CORRUPT(t_long_key, PD_ERR_TOO_BIG, "name length 300 exceeds",
        put_u64(&im, after(&im, "k.u32") - 13, 300))
CORRUPT(t_key_bad_char, PD_ERR_BAD_INPUT, "non-printable",
        im.buf[after(&im, "k.u32") - 2] = 0x01)
CORRUPT(t_unknown_value_type, PD_ERR_BAD_TYPE, "unknown value type 99",
        put_u32(&im, after(&im, "k.u32"), 99))
CORRUPT(t_unknown_elem_type, PD_ERR_BAD_TYPE, "unknown array element type 42",
        put_u32(&im, after(&im, "k.arr") + 4, 42))
CORRUPT(t_nested_array, PD_ERR_BAD_TYPE, "nested arrays",
        put_u32(&im, after(&im, "k.arr") + 4, GGUF_TYPE_ARRAY))
CORRUPT(t_huge_array, PD_ERR_TOO_BIG, "array length",
        put_u64(&im, after(&im, "k.arr") + 8, 1ull << 32))
CORRUPT(t_array_unfit, PD_ERR_TRUNCATED, "'k.arr' array",
        put_u64(&im, after(&im, "k.arr") + 8, 1u << 20))
CORRUPT(t_str_array_unfit, PD_ERR_TRUNCATED, "strings cannot fit",
        put_u64(&im, after(&im, "k.strs") + 8, 1u << 20))
CORRUPT(t_str_elem_huge, PD_ERR_TOO_BIG, "string length",
        put_u64(&im, after(&im, "k.strs") + 16, 1ull << 62))
CORRUPT(t_duplicate_key, PD_ERR_EXISTS, "duplicate key 'k.arr'",
        memcpy(im.buf + after(&im, "k.u32") - 5, "k.arr", 5))
CORRUPT(t_bool_value, PD_ERR_BAD_INPUT, "bool value 2", im.buf[after(&im, "k.bool") + 4] = 2)
CORRUPT(t_align_not_pow2, PD_ERR_BAD_INPUT, "not a power of two",
        put_u32(&im, after(&im, "general.alignment") + 4, 48))
CORRUPT(t_align_zero, PD_ERR_BAD_INPUT, "not a power of two",
        put_u32(&im, after(&im, "general.alignment") + 4, 0))
CORRUPT(t_align_huge, PD_ERR_BAD_INPUT, "outside [8, 65536]",
        put_u32(&im, after(&im, "general.alignment") + 4, 1u << 30))
CORRUPT(t_align_small, PD_ERR_BAD_INPUT, "outside [8, 65536]",
        put_u32(&im, after(&im, "general.alignment") + 4, 2))
CORRUPT(t_align_type, PD_ERR_BAD_TYPE, "general.alignment has type int32",
        put_u32(&im, after(&im, "general.alignment"), GGUF_TYPE_INT32))
CORRUPT(t_ndims_5, PD_ERR_BAD_INPUT, "n_dims 5 outside",
        put_u32(&im, after(&im, "tensor_alpha"), 5))
CORRUPT(t_ndims_0, PD_ERR_BAD_INPUT, "n_dims 0 outside",
        put_u32(&im, after(&im, "tensor_alpha"), 0))
CORRUPT(t_dim_zero, PD_ERR_BAD_INPUT, "dim 1 is zero",
        put_u64(&im, after(&im, "tensor_alpha") + 12, 0))
CORRUPT(t_dim_overflow, PD_ERR_TOO_BIG, "element count overflows",
        put_u64(&im, after(&im, "tensor_alpha") + 4, 1ull << 40);
        put_u64(&im, after(&im, "tensor_alpha") + 12, 1ull << 40))
CORRUPT(t_dim_negative, PD_ERR_TOO_BIG, "element count overflows",
        put_u64(&im, after(&im, "tensor_alpha") + 4, UINT64_MAX))
CORRUPT(t_nbytes_overflow, PD_ERR_TOO_BIG, "byte size overflows",
        put_u64(&im, after(&im, "tensor_alpha") + 4, 1ull << 61);
        put_u64(&im, after(&im, "tensor_alpha") + 12, 2))
CORRUPT(t_unknown_tensor_type, PD_ERR_BAD_TYPE, "unknown ggml type 99",
        put_u32(&im, after(&im, "tensor_alpha") + 20, 99))
CORRUPT(t_removed_tensor_type, PD_ERR_BAD_TYPE, "unknown ggml type 4",
        put_u32(&im, after(&im, "tensor_alpha") + 20, 4))
CORRUPT(t_block_mismatch, PD_ERR_BAD_INPUT, "not a multiple of q8_0 block size",
        put_u64(&im, after(&im, "tensor_betaa") + 4, 48))
CORRUPT(t_misaligned_offset, PD_ERR_BAD_INPUT, "not aligned to 64",
        put_u64(&im, after(&im, "tensor_betaa") + 4 + 8 + 4, 72))
CORRUPT(t_offset_outside, PD_ERR_TRUNCATED, "exceeds the",
        put_u64(&im, after(&im, "tensor_betaa") + 4 + 8 + 4, 1ull << 20))
CORRUPT(t_offset_wraps, PD_ERR_TRUNCATED, "exceeds the",
        put_u64(&im, after(&im, "tensor_betaa") + 4 + 8 + 4, UINT64_MAX - 63))
CORRUPT(t_overlap, PD_ERR_BAD_INPUT, "overlap",
        put_u64(&im, after(&im, "tensor_betaa") + 4 + 8 + 4, 0))
CORRUPT(t_duplicate_tensor, PD_ERR_EXISTS, "duplicate tensor name 'tensor_alpha'",
        memcpy(im.buf + after(&im, "tensor_betaa") - 12, "tensor_alpha", 12))
CORRUPT(t_tensor_name_empty, PD_ERR_BAD_INPUT, "empty name",
        put_u64(&im, after(&im, "tensor_alpha") - 20, 0))

/* Every strict prefix of a valid file is rejected cleanly. */
static void test_truncated_everywhere(void **state)
{
    image_t im = base_image();
    (void)state;
    for (size_t n = 0; n < im.size; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        gguf_t *g = NULL;
        char err[256] = "";
        memcpy(copy, im.buf, n);
        pd_status_t st = gguf_open_memory(copy, n, &g, err, sizeof(err));
        if (st == PD_OK)
            fail_msg("prefix of %zu/%zu bytes accepted", n, im.size);
        assert_null(g);
        assert_true(err[0] != '\0');
        free(copy);
    }
    gguf_t *g;
    assert_int_equal(gguf_open_memory(im.buf, im.size, &g, NULL, 0), PD_OK);
    gguf_close(g);
    free(im.buf);
}

/* Truncated file on disk: the loader reports the tensor that no longer fits. */
static void test_truncated_file(void **state)
{
    image_t im = base_image();
    char path[] = "/tmp/pd-gguf-trunc-XXXXXX";
    int fd = mkstemp(path);
    gguf_t *g = NULL;
    char err[256];
    (void)state;
    assert_true(fd >= 0);
    assert_int_equal(write(fd, im.buf, im.size - 1), (ssize_t)(im.size - 1));
    close(fd);
    assert_int_equal(gguf_open(path, &g, err, sizeof(err)), PD_ERR_TRUNCATED);
    assert_non_null(strstr(err, "tensor 'tensor_betaa'"));
    fd = open(path, O_WRONLY | O_TRUNC);
    close(fd);
    assert_int_equal(gguf_open(path, &g, err, sizeof(err)), PD_ERR_TRUNCATED);
    unlink(path);
    free(im.buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_roundtrip),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_type_table),
        cmocka_unit_test(test_q8_0_layout),
        cmocka_unit_test(test_q4_0_layout),
        cmocka_unit_test(test_quant_roundtrip_all),
        cmocka_unit_test(test_dequant_simd_random_bytes),
        cmocka_unit_test(test_roundtrip_memory),
        cmocka_unit_test(test_roundtrip_file),
        cmocka_unit_test(test_release),
        cmocka_unit_test(t_bad_magic),
        cmocka_unit_test(t_version_2),
        cmocka_unit_test(t_version_4),
        cmocka_unit_test(t_huge_tensor_count),
        cmocka_unit_test(t_huge_kv_count),
        cmocka_unit_test(t_kv_count_unfit),
        cmocka_unit_test(t_huge_string),
        cmocka_unit_test(t_long_string),
        cmocka_unit_test(t_empty_key),
        cmocka_unit_test(t_long_key),
        cmocka_unit_test(t_key_bad_char),
        cmocka_unit_test(t_unknown_value_type),
        cmocka_unit_test(t_unknown_elem_type),
        cmocka_unit_test(t_nested_array),
        cmocka_unit_test(t_huge_array),
        cmocka_unit_test(t_array_unfit),
        cmocka_unit_test(t_str_array_unfit),
        cmocka_unit_test(t_str_elem_huge),
        cmocka_unit_test(t_duplicate_key),
        cmocka_unit_test(t_bool_value),
        cmocka_unit_test(t_align_not_pow2),
        cmocka_unit_test(t_align_zero),
        cmocka_unit_test(t_align_huge),
        cmocka_unit_test(t_align_small),
        cmocka_unit_test(t_align_type),
        cmocka_unit_test(t_ndims_5),
        cmocka_unit_test(t_ndims_0),
        cmocka_unit_test(t_dim_zero),
        cmocka_unit_test(t_dim_overflow),
        cmocka_unit_test(t_dim_negative),
        cmocka_unit_test(t_nbytes_overflow),
        cmocka_unit_test(t_unknown_tensor_type),
        cmocka_unit_test(t_removed_tensor_type),
        cmocka_unit_test(t_block_mismatch),
        cmocka_unit_test(t_misaligned_offset),
        cmocka_unit_test(t_offset_outside),
        cmocka_unit_test(t_offset_wraps),
        cmocka_unit_test(t_overlap),
        cmocka_unit_test(t_duplicate_tensor),
        cmocka_unit_test(t_tensor_name_empty),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_truncated_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
