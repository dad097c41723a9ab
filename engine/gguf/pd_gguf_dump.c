/* pd_gguf_dump.c - pd-gguf-dump: validate a GGUF file with pdserve's reader
 * and print it as JSON (metadata, tensor infos, per-tensor xxh64 of data).
 *
 *   pd-gguf-dump [--max-array N] [--no-hash] FILE.gguf
 *   pd-gguf-dump --types      (the ggml type table as JSON)
 *
 * u64/i64 values beyond 2^53 are printed as strings (JSON numbers are
 * doubles). String values containing NUL are cut at the NUL. Exit 0 ok,
 * 1 invalid file (one-line error on stderr), 2 bad usage.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include <xxhash.h>
#include "gguf.h"

#define JSON_SAFE_INT (1ull << 53)

static cJSON *str_json(const char *p, uint64_t len)
{
    char *s = malloc(len + 1);
    cJSON *j;
    if (s == NULL)
        return NULL;
    memcpy(s, p, len);
    s[len] = '\0';
    j = cJSON_CreateString(s);
    free(s);
    return j;
}

static cJSON *u64_json(uint64_t v)
{
    char buf[32];
    if (v <= JSON_SAFE_INT)
        return cJSON_CreateNumber((double)v);
    snprintf(buf, sizeof(buf), "%" PRIu64, v);
    return cJSON_CreateString(buf);
}

static cJSON *i64_json(int64_t v)
{
    char buf[32];
    if (v <= (int64_t)JSON_SAFE_INT && v >= -(int64_t)JSON_SAFE_INT)
        return cJSON_CreateNumber((double)v);
    snprintf(buf, sizeof(buf), "%" PRId64, v);
    return cJSON_CreateString(buf);
}

/* Shortest exact text: %.9g round-trips any float32, %.17g any double.
 * Non-finite values are not JSON numbers: printed as strings. */
static cJSON *float_json(double v, bool is_f32)
{
    char buf[40];
    if (v != v)
        return cJSON_CreateString("nan");
    if (v > 1.7976931348623157e308 || v < -1.7976931348623157e308)
        return cJSON_CreateString(v > 0 ? "inf" : "-inf");
    snprintf(buf, sizeof(buf), is_f32 ? "%.9g" : "%.17g", v);
    return cJSON_CreateRaw(buf);
}

static cJSON *arr_elem_json(const gguf_arr_t *arr, uint64_t i)
{
    switch (arr->type) {
    case GGUF_TYPE_STRING: {
        uint64_t len;
        const char *s = gguf_arr_str(arr, i, &len);
        return str_json(s, len);
    }
    case GGUF_TYPE_FLOAT32:
    case GGUF_TYPE_FLOAT64:
        return float_json(gguf_arr_float(arr, i), arr->type == GGUF_TYPE_FLOAT32);
    case GGUF_TYPE_BOOL:
        return cJSON_CreateBool(gguf_arr_int(arr, i) != 0);
    case GGUF_TYPE_UINT64: {
        uint64_t v;
        memcpy(&v, arr->data + 8 * i, 8);
        return u64_json(v);
    }
    default:
        return i64_json(gguf_arr_int(arr, i));
    }
}

static cJSON *kv_json(const gguf_kv_t *kv, uint64_t max_array)
{
    switch (kv->type) {
    case GGUF_TYPE_STRING:
        return str_json(kv->v.str.ptr, kv->v.str.len);
    case GGUF_TYPE_FLOAT32:
    case GGUF_TYPE_FLOAT64:
        return float_json(kv->v.f64, kv->type == GGUF_TYPE_FLOAT32);
    case GGUF_TYPE_BOOL:
        return cJSON_CreateBool(kv->v.u64 != 0);
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_UINT64:
        return u64_json(kv->v.u64);
    case GGUF_TYPE_ARRAY: {
        cJSON *a = cJSON_CreateArray();
        uint64_t n = kv->v.arr.count < max_array ? kv->v.arr.count : max_array;
        for (uint64_t i = 0; a != NULL && i < n; i++)
            cJSON_AddItemToArray(a, arr_elem_json(&kv->v.arr, i));
        return a;
    }
    default:
        return i64_json(kv->v.i64);
    }
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"max-array", required_argument, NULL, 'm'},
        {"no-hash", no_argument, NULL, 'n'},
        {"types", no_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    uint64_t max_array = UINT64_MAX;
    bool hash = true;
    int opt;

    while ((opt = getopt_long(argc, argv, "m:nth", opts, NULL)) != -1) {
        switch (opt) {
        case 'm': {
            char *end;
            max_array = strtoull(optarg, &end, 10);
            if (*end != '\0' || optarg[0] == '-' || optarg[0] == '\0') {
                fprintf(stderr, "pd-gguf-dump: --max-array '%s' is not a count\n", optarg);
                return 2;
            }
            break;
        }
        case 'n': hash = false; break;
        case 't': {
            cJSON *tt = cJSON_CreateObject();
            for (uint32_t t = 0; t < GGML_TYPE_COUNT; t++) {
                const ggml_type_info_t *info = ggml_type_info(t);
                char id[16];
                if (info == NULL)
                    continue;
                cJSON *e = cJSON_CreateObject();
                cJSON_AddStringToObject(e, "name", info->name);
                cJSON_AddNumberToObject(e, "block_size", info->block_size);
                cJSON_AddNumberToObject(e, "type_size", info->type_size);
                cJSON_AddBoolToObject(e, "supported", info->supported);
                snprintf(id, sizeof(id), "%u", t);
                cJSON_AddItemToObject(tt, id, e);
            }
            char *out = cJSON_Print(tt);
            puts(out ? out : "{}");
            free(out);
            cJSON_Delete(tt);
            return 0;
        }
        case 'h':
            printf("usage: pd-gguf-dump [--max-array N] [--no-hash] FILE.gguf\n");
            return 0;
        default:
            fprintf(stderr, "usage: pd-gguf-dump [--max-array N] [--no-hash] FILE.gguf\n");
            return 2;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "usage: pd-gguf-dump [--max-array N] [--no-hash] FILE.gguf\n");
        return 2;
    }

    gguf_t *g;
    char err[512];
    if (gguf_open(argv[optind], &g, err, sizeof(err)) != PD_OK) {
        fprintf(stderr, "pd-gguf-dump: %s: %s\n", argv[optind], err);
        return 1;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "version", gguf_version(g));
    cJSON_AddNumberToObject(root, "alignment", gguf_alignment(g));
    cJSON_AddNumberToObject(root, "data_offset", (double)gguf_data_offset(g));
    cJSON_AddNumberToObject(root, "file_size", (double)gguf_file_size(g));
    cJSON *kvs = cJSON_AddObjectToObject(root, "metadata");
    cJSON *types = cJSON_AddObjectToObject(root, "metadata_types");
    for (uint64_t i = 0; i < gguf_kv_count(g); i++) {
        const gguf_kv_t *kv = gguf_kv_at(g, i);
        char tname[64];
        cJSON_AddItemToObject(kvs, kv->key, kv_json(kv, max_array));
        if (kv->type == GGUF_TYPE_ARRAY)
            snprintf(tname, sizeof(tname), "array[%s]", gguf_type_name(kv->v.arr.type));
        else
            snprintf(tname, sizeof(tname), "%s", gguf_type_name(kv->type));
        cJSON_AddStringToObject(types, kv->key, tname);
    }
    cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
    uint64_t n_params = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(g, i);
        cJSON *jt = cJSON_CreateObject();
        cJSON *dims = cJSON_AddArrayToObject(jt, "dims");
        cJSON_AddStringToObject(jt, "name", t->name);
        cJSON_AddNumberToObject(jt, "type", t->type);
        cJSON_AddStringToObject(jt, "type_name", ggml_type_name(t->type));
        for (uint32_t d = 0; d < t->n_dims; d++)
            cJSON_AddItemToArray(dims, u64_json(t->ne[d]));
        cJSON_AddNumberToObject(jt, "offset", (double)t->offset);
        cJSON_AddNumberToObject(jt, "n_elements", (double)t->n_elements);
        cJSON_AddNumberToObject(jt, "n_bytes", (double)t->n_bytes);
        if (hash) {
            char hex[17];
            snprintf(hex, sizeof(hex), "%016llx",
                     (unsigned long long)XXH64(t->data, t->n_bytes, 0));
            cJSON_AddStringToObject(jt, "xxh64", hex);
        }
        cJSON_AddItemToArray(tensors, jt);
        n_params += t->n_elements;
    }
    cJSON_AddNumberToObject(root, "n_params", (double)n_params);
    char *out = cJSON_Print(root);
    if (out == NULL) {
        fprintf(stderr, "pd-gguf-dump: out of memory\n");
        return 1;
    }
    puts(out);
    free(out);
    cJSON_Delete(root);
    gguf_close(g);
    return 0;
}
