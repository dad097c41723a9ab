/* fuzz_gguf.c - fuzz target for the GGUF reader (gguf_open_memory).
 * Accepted inputs are then walked completely (every kv, array element and
 * tensor byte range, a dequantized row for supported types) and re-emitted
 * through the writer; the re-emitted file must be accepted again and carry
 * the same kvs and tensors (reader/writer agreement). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void walk(const gguf_t *g)
{
    for (uint64_t i = 0; i < gguf_kv_count(g); i++) {
        const gguf_kv_t *kv = gguf_kv_at(g, i);
        sink += strlen(kv->key);
        if (kv->type == GGUF_TYPE_STRING && kv->v.str.len > 0)
            sink += (uint8_t)kv->v.str.ptr[kv->v.str.len - 1];
        if (kv->type != GGUF_TYPE_ARRAY)
            continue;
        const gguf_arr_t *arr = &kv->v.arr;
        for (uint64_t j = 0; j < arr->count; j++) {
            uint64_t len;
            switch (arr->type) {
            case GGUF_TYPE_STRING: {
                const char *s = gguf_arr_str(arr, j, &len);
                if (len > 0)
                    sink += (uint8_t)s[len - 1];
                break;
            }
            case GGUF_TYPE_FLOAT32:
            case GGUF_TYPE_FLOAT64:
                sink += (uint64_t)(gguf_arr_float(arr, j) != 0.0);
                break;
            default:
                sink += (uint64_t)gguf_arr_int(arr, j);
                break;
            }
        }
    }
    for (uint64_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        if (gguf_tensor_find(g, t->name) != t)
            abort();
        sink += p[0] + p[t->n_bytes - 1];
        const ggml_type_info_t *info = ggml_type_info(t->type);
        if (info->supported && t->ne[0] <= 4096) {
            float row[4096];
            if (ggml_dequantize_row(t->type, t->data, row, t->ne[0]) != PD_OK)
                abort();
        }
    }
}

static void reemit(const gguf_t *g)
{
    gguf_writer_t *w;
    uint8_t *buf;
    size_t size;
    gguf_t *g2;
    char err[256];

    if (gguf_writer_create(&w) != PD_OK)
        return;
    for (uint64_t i = 0; i < gguf_kv_count(g); i++)
        if (gguf_writer_add_kv_from(w, gguf_kv_at(g, i)) != PD_OK)
            abort();
    for (uint64_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(g, i);
        if (gguf_writer_add_tensor_raw(w, t->name, t->type, t->n_dims, t->ne, t->data,
                                       t->n_bytes) != PD_OK)
            abort();
    }
    if (gguf_writer_write_memory(w, &buf, &size) != PD_OK)
        abort();
    if (gguf_open_memory(buf, size, &g2, err, sizeof(err)) != PD_OK) {
        fprintf(stderr, "re-emitted file rejected: %s\n", err);
        abort();
    }
    if (gguf_kv_count(g2) != gguf_kv_count(g) || gguf_tensor_count(g2) != gguf_tensor_count(g) ||
        gguf_alignment(g2) != gguf_alignment(g))
        abort();
    for (uint64_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor_t *a = gguf_tensor_at(g, i), *b = gguf_tensor_at(g2, i);
        if (strcmp(a->name, b->name) != 0 || a->n_bytes != b->n_bytes ||
            memcmp(a->data, b->data, a->n_bytes) != 0)
            abort();
    }
    gguf_close(g2);
    free(buf);
    gguf_writer_destroy(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_t *g;
    char err[256];

    if (gguf_open_memory(data, size, &g, err, sizeof(err)) != PD_OK) {
        if (err[0] == '\0' || strchr(err, '\n') != NULL)
            abort(); /* every rejection has exactly one line of reason */
        return 0;
    }
    walk(g);
    reemit(g);
    gguf_close(g);
    return 0;
}
