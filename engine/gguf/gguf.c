/* gguf.c - GGUF v3 reader: map, validate everything, then serve lookups.
 *
 * The parser walks the file once with a bounds-checked cursor. Every count
 * is capped twice: by a hard limit (GGUF_MAX_*) and by what the remaining
 * bytes could possibly hold, so an allocation is never larger than a small
 * multiple of the file size. Every size computation is overflow-checked.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "gguf.h"

struct gguf {
    const uint8_t *base;        /* (size) whole file */
    size_t size;
    bool mapped;                /* munmap on close */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    uint64_t n_kv;
    gguf_kv_t *kvs;             /* (n_kv) */
    uint64_t n_tensors;
    gguf_tensor_t *tensors;     /* (n_tensors) */
    uint32_t kv_ht_mask;        /* hash tables: index+1, 0 = empty */
    uint32_t *kv_ht;            /* (kv_ht_mask + 1) */
    uint32_t t_ht_mask;
    uint32_t *t_ht;             /* (t_ht_mask + 1) */
};

typedef struct {
    const uint8_t *p;
    size_t size;
    size_t off;
    char *err;
    size_t err_len;
} gguf_rd_t;

static const char *const gguf_type_names[GGUF_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64",
};

/* Size in bytes of a fixed-size value type; 0 for STRING/ARRAY/unknown. */
static size_t gguf_type_size(uint32_t type)
{
    static const uint8_t sizes[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type < GGUF_TYPE_COUNT ? sizes[type] : 0;
}

const char *gguf_type_name(uint32_t type)
{
    return type < GGUF_TYPE_COUNT ? gguf_type_names[type] : "?";
}

static pd_status_t __attribute__((format(printf, 3, 4)))
gguf_fail(gguf_rd_t *rd, pd_status_t status, const char *fmt, ...)
{
    va_list ap;

    if (rd->err != NULL && rd->err_len > 0) {
        va_start(ap, fmt);
        vsnprintf(rd->err, rd->err_len, fmt, ap);
        va_end(ap);
    }
    return status;
}

static size_t rd_left(const gguf_rd_t *rd)
{
    return rd->size - rd->off;
}

static pd_status_t rd_bytes(gguf_rd_t *rd, void *dst, size_t n, const char *what)
{
    if (rd_left(rd) < n)
        return gguf_fail(rd, PD_ERR_TRUNCATED, "truncated: %s at offset %zu needs %zu bytes, %zu left",
                         what, rd->off, n, rd_left(rd));
    memcpy(dst, rd->p + rd->off, n);
    rd->off += n;
    return PD_OK;
}

static pd_status_t rd_u32(gguf_rd_t *rd, uint32_t *v, const char *what)
{
    return rd_bytes(rd, v, sizeof(*v), what);
}

static pd_status_t rd_u64(gguf_rd_t *rd, uint64_t *v, const char *what)
{
    return rd_bytes(rd, v, sizeof(*v), what);
}

static bool name_chars_ok(const uint8_t *s, uint64_t len)
{
    for (uint64_t i = 0; i < len; i++)
        if (s[i] < 0x20 || s[i] > 0x7E)
            return false;
    return true;
}

/* Read a key / tensor name: u64 len + bytes; copy NUL-terminated. */
static pd_status_t rd_name(gguf_rd_t *rd, const char *what, uint64_t index, char **name_p)
{
    uint64_t len = 0;
    pd_status_t status;
    char *name;

    status = rd_u64(rd, &len, what);
    if (status != PD_OK)
        return status;
    if (len == 0)
        return gguf_fail(rd, PD_ERR_BAD_INPUT, "%s %" PRIu64 ": empty name", what, index);
    if (len > GGUF_MAX_KEY_LEN)
        return gguf_fail(rd, PD_ERR_TOO_BIG, "%s %" PRIu64 ": name length %" PRIu64 " exceeds cap %u",
                         what, index, len, GGUF_MAX_KEY_LEN);
    if (rd_left(rd) < len)
        return gguf_fail(rd, PD_ERR_TRUNCATED, "truncated: %s %" PRIu64 " name at offset %zu", what,
                         index, rd->off);
    if (!name_chars_ok(rd->p + rd->off, len))
        return gguf_fail(rd, PD_ERR_BAD_INPUT, "%s %" PRIu64 ": name has non-printable bytes",
                         what, index);
    name = malloc(len + 1);
    if (name == NULL)
        return gguf_fail(rd, PD_ERR_NO_MEMORY, "out of memory");
    memcpy(name, rd->p + rd->off, len);
    name[len] = '\0';
    rd->off += len;
    *name_p = name;
    return PD_OK;
}

/* Read one string value (u64 len + bytes), pointing into the file. */
static pd_status_t rd_str(gguf_rd_t *rd, const char *key, const char **ptr_p, uint64_t *len_p)
{
    uint64_t len = 0;
    pd_status_t status = rd_u64(rd, &len, "string length");

    if (status != PD_OK)
        return status;
    if (len > GGUF_MAX_STRING_LEN)
        return gguf_fail(rd, PD_ERR_TOO_BIG, "key '%s': string length %" PRIu64 " exceeds cap %u",
                         key, len, GGUF_MAX_STRING_LEN);
    if (rd_left(rd) < len)
        return gguf_fail(rd, PD_ERR_TRUNCATED, "truncated: key '%s' string of %" PRIu64
                         " bytes at offset %zu, %zu left", key, len, rd->off, rd_left(rd));
    *ptr_p = (const char *)rd->p + rd->off;
    *len_p = len;
    rd->off += len;
    return PD_OK;
}

static pd_status_t rd_scalar(gguf_rd_t *rd, gguf_kv_t *kv)
{
    uint8_t buf[8];
    size_t n = gguf_type_size(kv->type);
    pd_status_t status = rd_bytes(rd, buf, n, kv->key);

    if (status != PD_OK)
        return status;
    switch (kv->type) {
    case GGUF_TYPE_UINT8:   kv->v.u64 = buf[0]; break;
    case GGUF_TYPE_INT8:    kv->v.i64 = (int8_t)buf[0]; break;
    case GGUF_TYPE_UINT16:  { uint16_t x; memcpy(&x, buf, 2); kv->v.u64 = x; break; }
    case GGUF_TYPE_INT16:   { int16_t x; memcpy(&x, buf, 2); kv->v.i64 = x; break; }
    case GGUF_TYPE_UINT32:  { uint32_t x; memcpy(&x, buf, 4); kv->v.u64 = x; break; }
    case GGUF_TYPE_INT32:   { int32_t x; memcpy(&x, buf, 4); kv->v.i64 = x; break; }
    case GGUF_TYPE_FLOAT32: { float x; memcpy(&x, buf, 4); kv->v.f64 = x; break; }
    case GGUF_TYPE_UINT64:  { uint64_t x; memcpy(&x, buf, 8); kv->v.u64 = x; break; }
    case GGUF_TYPE_INT64:   { int64_t x; memcpy(&x, buf, 8); kv->v.i64 = x; break; }
    case GGUF_TYPE_FLOAT64: { double x; memcpy(&x, buf, 8); kv->v.f64 = x; break; }
    case GGUF_TYPE_BOOL:
        if (buf[0] > 1)
            return gguf_fail(rd, PD_ERR_BAD_INPUT, "key '%s': bool value %u is not 0 or 1",
                             kv->key, buf[0]);
        kv->v.u64 = buf[0];
        break;
    default:
        return gguf_fail(rd, PD_ERR_INTERNAL, "key '%s': not a scalar", kv->key);
    }
    return PD_OK;
}

static pd_status_t rd_array(gguf_rd_t *rd, gguf_kv_t *kv)
{
    gguf_arr_t *arr = &kv->v.arr;
    uint32_t elem_type = 0;
    uint64_t count = 0;
    size_t esize;
    pd_status_t status;

    status = rd_u32(rd, &elem_type, "array element type");
    if (status != PD_OK)
        return status;
    if (elem_type >= GGUF_TYPE_COUNT)
        return gguf_fail(rd, PD_ERR_BAD_TYPE, "key '%s': unknown array element type %u",
                         kv->key, elem_type);
    if (elem_type == GGUF_TYPE_ARRAY)
        return gguf_fail(rd, PD_ERR_BAD_TYPE, "key '%s': nested arrays are not supported", kv->key);
    status = rd_u64(rd, &count, "array length");
    if (status != PD_OK)
        return status;
    if (count > GGUF_MAX_ARRAY_LEN)
        return gguf_fail(rd, PD_ERR_TOO_BIG, "key '%s': array length %" PRIu64 " exceeds cap %u",
                         kv->key, count, GGUF_MAX_ARRAY_LEN);
    arr->type = (gguf_type_t)elem_type;
    arr->count = count;
    arr->data = rd->p + rd->off;
    arr->str_off = NULL;
    esize = gguf_type_size(elem_type);
    if (elem_type != GGUF_TYPE_STRING) {
        /* count <= 2^26 and esize <= 8: no overflow */
        uint64_t bytes = count * esize;
        if (rd_left(rd) < bytes)
            return gguf_fail(rd, PD_ERR_TRUNCATED, "truncated: key '%s' array of %" PRIu64
                             " %s at offset %zu, %zu bytes left", kv->key, count,
                             gguf_type_name(elem_type), rd->off, rd_left(rd));
        if (elem_type == GGUF_TYPE_BOOL)
            for (uint64_t i = 0; i < count; i++)
                if (arr->data[i] > 1)
                    return gguf_fail(rd, PD_ERR_BAD_INPUT, "key '%s': bool element %" PRIu64
                                     " value %u is not 0 or 1", kv->key, i, arr->data[i]);
        rd->off += bytes;
        return PD_OK;
    }
    /* Strings: every element needs >= 8 bytes, so bound the offset table
     * by the file before allocating it. */
    if (rd_left(rd) / 8 < count)
        return gguf_fail(rd, PD_ERR_TRUNCATED, "truncated: key '%s' array of %" PRIu64
                         " strings cannot fit in %zu bytes left", kv->key, count, rd_left(rd));
    uint64_t *off = malloc((count ? count : 1) * sizeof(*off));
    if (off == NULL)
        return gguf_fail(rd, PD_ERR_NO_MEMORY, "out of memory");
    arr->str_off = off;
    for (uint64_t i = 0; i < count; i++) {
        const char *s;
        uint64_t len;
        off[i] = (uint64_t)(rd->off - (size_t)(arr->data - rd->p));
        status = rd_str(rd, kv->key, &s, &len);
        if (status != PD_OK)
            return status;
    }
    return PD_OK;
}

static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static pd_status_t ht_alloc(uint64_t n, uint32_t **ht_p, uint32_t *mask_p)
{
    uint32_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    *ht_p = calloc(cap, sizeof(uint32_t));
    if (*ht_p == NULL)
        return PD_ERR_NO_MEMORY;
    *mask_p = cap - 1;
    return PD_OK;
}

/* Insert names[i] (stride-addressed); PD_ERR_EXISTS if present. */
static pd_status_t ht_insert(uint32_t *ht, uint32_t mask, const char *name, uint32_t idx,
                             const char *(*name_of)(const gguf_t *, uint32_t), const gguf_t *g)
{
    for (uint32_t h = name_hash(name) & mask;; h = (h + 1) & mask) {
        if (ht[h] == 0) {
            ht[h] = idx + 1;
            return PD_OK;
        }
        if (strcmp(name_of(g, ht[h] - 1), name) == 0)
            return PD_ERR_EXISTS;
    }
}

static uint32_t ht_find(const uint32_t *ht, uint32_t mask, const char *name,
                        const char *(*name_of)(const gguf_t *, uint32_t), const gguf_t *g)
{
    for (uint32_t h = name_hash(name) & mask;; h = (h + 1) & mask) {
        if (ht[h] == 0)
            return 0;
        if (strcmp(name_of(g, ht[h] - 1), name) == 0)
            return ht[h];
    }
}

static const char *kv_name_of(const gguf_t *g, uint32_t i)
{
    return g->kvs[i].key;
}

static const char *tensor_name_of(const gguf_t *g, uint32_t i)
{
    return g->tensors[i].name;
}

static pd_status_t parse_kvs(gguf_t *g, gguf_rd_t *rd)
{
    pd_status_t status;

    for (uint64_t i = 0; i < g->n_kv; i++) {
        gguf_kv_t *kv = &g->kvs[i];
        char *key;
        uint32_t type = 0;

        status = rd_name(rd, "kv", i, &key);
        if (status != PD_OK)
            return status;
        kv->key = key;
        if (ht_insert(g->kv_ht, g->kv_ht_mask, key, (uint32_t)i, kv_name_of, g) != PD_OK)
            return gguf_fail(rd, PD_ERR_EXISTS, "duplicate key '%s'", key);
        status = rd_u32(rd, &type, "value type");
        if (status != PD_OK)
            return status;
        if (type >= GGUF_TYPE_COUNT)
            return gguf_fail(rd, PD_ERR_BAD_TYPE, "key '%s': unknown value type %u", key, type);
        kv->type = (gguf_type_t)type;
        if (type == GGUF_TYPE_STRING)
            status = rd_str(rd, key, &kv->v.str.ptr, &kv->v.str.len);
        else if (type == GGUF_TYPE_ARRAY)
            status = rd_array(rd, kv);
        else
            status = rd_scalar(rd, kv);
        if (status != PD_OK)
            return status;
    }
    return PD_OK;
}

static pd_status_t parse_alignment(gguf_t *g, gguf_rd_t *rd)
{
    const gguf_kv_t *kv = gguf_kv_find(g, "general.alignment");

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (kv == NULL)
        return PD_OK;
    if (kv->type != GGUF_TYPE_UINT32)
        return gguf_fail(rd, PD_ERR_BAD_TYPE, "general.alignment has type %s, want uint32",
                         gguf_type_name(kv->type));
    uint64_t a = kv->v.u64;
    if (a == 0 || (a & (a - 1)) != 0)
        return gguf_fail(rd, PD_ERR_BAD_INPUT, "general.alignment %" PRIu64
                         " is not a power of two", a);
    if (a < GGUF_MIN_ALIGNMENT || a > GGUF_MAX_ALIGNMENT)
        return gguf_fail(rd, PD_ERR_BAD_INPUT, "general.alignment %" PRIu64
                         " outside [%u, %u]", a, GGUF_MIN_ALIGNMENT, GGUF_MAX_ALIGNMENT);
    g->alignment = (uint32_t)a;
    return PD_OK;
}

static pd_status_t parse_tensor_infos(gguf_t *g, gguf_rd_t *rd)
{
    pd_status_t status;

    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor_t *t = &g->tensors[i];
        const ggml_type_info_t *info;
        char *name;
        uint32_t n_dims = 0, type = 0;
        uint64_t nel = 1;

        status = rd_name(rd, "tensor", i, &name);
        if (status != PD_OK)
            return status;
        t->name = name;
        if (ht_insert(g->t_ht, g->t_ht_mask, name, (uint32_t)i, tensor_name_of, g) != PD_OK)
            return gguf_fail(rd, PD_ERR_EXISTS, "duplicate tensor name '%s'", name);
        status = rd_u32(rd, &n_dims, "tensor n_dims");
        if (status != PD_OK)
            return status;
        if (n_dims == 0 || n_dims > GGUF_MAX_DIMS)
            return gguf_fail(rd, PD_ERR_BAD_INPUT, "tensor '%s': n_dims %u outside [1, %u]",
                             name, n_dims, GGUF_MAX_DIMS);
        t->n_dims = n_dims;
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            status = rd_u64(rd, &t->ne[d], "tensor dim");
            if (status != PD_OK)
                return status;
            if (t->ne[d] == 0)
                return gguf_fail(rd, PD_ERR_BAD_INPUT, "tensor '%s': dim %u is zero", name, d);
            if (t->ne[d] > (uint64_t)INT64_MAX ||
                __builtin_mul_overflow(nel, t->ne[d], &nel) || nel > (uint64_t)INT64_MAX)
                return gguf_fail(rd, PD_ERR_TOO_BIG, "tensor '%s': element count overflows at dim %u",
                                 name, d);
        }
        t->n_elements = nel;
        status = rd_u32(rd, &type, "tensor type");
        if (status != PD_OK)
            return status;
        info = ggml_type_info(type);
        if (info == NULL)
            return gguf_fail(rd, PD_ERR_BAD_TYPE, "tensor '%s': unknown ggml type %u", name, type);
        t->type = type;
        if (t->ne[0] % info->block_size != 0)
            return gguf_fail(rd, PD_ERR_BAD_INPUT, "tensor '%s': row length %" PRIu64
                             " not a multiple of %s block size %u", name, t->ne[0],
                             info->name, info->block_size);
        if (ggml_nbytes(type, nel, &t->n_bytes) != PD_OK)
            return gguf_fail(rd, PD_ERR_TOO_BIG, "tensor '%s': byte size overflows", name);
        status = rd_u64(rd, &t->offset, "tensor offset");
        if (status != PD_OK)
            return status;
    }
    return PD_OK;
}

static int cmp_tensor_by_offset(const void *a, const void *b)
{
    const gguf_tensor_t *x = *(const gguf_tensor_t *const *)a;
    const gguf_tensor_t *y = *(const gguf_tensor_t *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static pd_status_t check_tensor_data(gguf_t *g, gguf_rd_t *rd)
{
    uint64_t data_size = g->size - g->data_offset;
    const gguf_tensor_t **order;

    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor_t *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return gguf_fail(rd, PD_ERR_BAD_INPUT, "tensor '%s': offset %" PRIu64
                             " not aligned to %u", t->name, t->offset, g->alignment);
        if (t->offset > data_size || t->n_bytes > data_size - t->offset)
            return gguf_fail(rd, PD_ERR_TRUNCATED, "tensor '%s': data range [%" PRIu64 ", +%" PRIu64
                             ") exceeds the %" PRIu64 "-byte data section", t->name, t->offset,
                             t->n_bytes, data_size);
        t->data = g->base + g->data_offset + t->offset;
    }
    if (g->n_tensors < 2)
        return PD_OK;
    order = malloc(g->n_tensors * sizeof(*order));
    if (order == NULL)
        return gguf_fail(rd, PD_ERR_NO_MEMORY, "out of memory");
    for (uint64_t i = 0; i < g->n_tensors; i++)
        order[i] = &g->tensors[i];
    qsort(order, g->n_tensors, sizeof(*order), cmp_tensor_by_offset);
    for (uint64_t i = 0; i + 1 < g->n_tensors; i++) {
        if (order[i]->offset + order[i]->n_bytes > order[i + 1]->offset) {
            pd_status_t status = gguf_fail(rd, PD_ERR_BAD_INPUT, "tensors '%s' and '%s' overlap",
                                           order[i]->name, order[i + 1]->name);
            free(order);
            return status;
        }
    }
    free(order);
    return PD_OK;
}

static pd_status_t gguf_parse(gguf_t *g, char *err, size_t err_len)
{
    gguf_rd_t rd = {.p = g->base, .size = g->size, .off = 0, .err = err, .err_len = err_len};
    uint32_t magic;
    pd_status_t status;

    if (g->size < 4)
        return gguf_fail(&rd, PD_ERR_TRUNCATED, "truncated: file of %zu bytes has no GGUF magic",
                         g->size);
    memcpy(&magic, g->base, 4);
    if (magic != GGUF_MAGIC)
        return gguf_fail(&rd, PD_ERR_BAD_MAGIC, "bad magic 0x%08x (not a GGUF file)", magic);
    rd.off = 4;
    status = rd_u32(&rd, &g->version, "version");
    if (status != PD_OK)
        return status;
    if (g->version != GGUF_VERSION)
        return gguf_fail(&rd, PD_ERR_BAD_VERSION, "GGUF version %u unsupported (need %u)",
                         g->version, GGUF_VERSION);
    status = rd_u64(&rd, &g->n_tensors, "tensor count");
    if (status != PD_OK)
        return status;
    status = rd_u64(&rd, &g->n_kv, "kv count");
    if (status != PD_OK)
        return status;
    if (g->n_tensors > GGUF_MAX_TENSORS)
        return gguf_fail(&rd, PD_ERR_TOO_BIG, "tensor count %" PRIu64 " exceeds cap %u",
                         g->n_tensors, GGUF_MAX_TENSORS);
    if (g->n_kv > GGUF_MAX_KVS)
        return gguf_fail(&rd, PD_ERR_TOO_BIG, "kv count %" PRIu64 " exceeds cap %u", g->n_kv,
                         GGUF_MAX_KVS);
    /* A kv takes >= 14 bytes (8 len + 1 key + 4 type + 1 value), a tensor
     * info >= 33: bound allocations by what the file can hold. */
    if (g->n_kv > rd_left(&rd) / 14)
        return gguf_fail(&rd, PD_ERR_TRUNCATED, "truncated: %" PRIu64
                         " kvs cannot fit in %zu bytes", g->n_kv, rd_left(&rd));
    if (g->n_tensors > rd_left(&rd) / 33)
        return gguf_fail(&rd, PD_ERR_TRUNCATED, "truncated: %" PRIu64
                         " tensor infos cannot fit in %zu bytes", g->n_tensors, rd_left(&rd));
    g->kvs = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kvs));
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
    if (g->kvs == NULL || g->tensors == NULL ||
        ht_alloc(g->n_kv, &g->kv_ht, &g->kv_ht_mask) != PD_OK ||
        ht_alloc(g->n_tensors, &g->t_ht, &g->t_ht_mask) != PD_OK)
        return gguf_fail(&rd, PD_ERR_NO_MEMORY, "out of memory");
    status = parse_kvs(g, &rd);
    if (status != PD_OK)
        return status;
    status = parse_alignment(g, &rd);
    if (status != PD_OK)
        return status;
    status = parse_tensor_infos(g, &rd);
    if (status != PD_OK)
        return status;
    /* data section starts at the next multiple of alignment */
    uint64_t pad = (g->alignment - rd.off % g->alignment) % g->alignment;
    g->data_offset = rd.off + pad;
    if (g->n_tensors == 0) {
        if (g->data_offset > g->size)
            g->data_offset = g->size;   /* writers may omit trailing padding */
        return PD_OK;
    }
    if (g->data_offset > g->size)
        return gguf_fail(&rd, PD_ERR_TRUNCATED, "truncated: data section at offset %" PRIu64
                         " beyond end of file (%zu bytes)", g->data_offset, g->size);
    return check_tensor_data(g, &rd);
}

static pd_status_t gguf_open_common(const void *data, size_t size, bool mapped, gguf_t **gguf_p,
                                    char *err, size_t err_len)
{
    gguf_t *g = calloc(1, sizeof(*g));
    pd_status_t status;

    if (g == NULL) {
        if (mapped)
            munmap((void *)data, size);
        if (err && err_len)
            snprintf(err, err_len, "out of memory");
        return PD_ERR_NO_MEMORY;
    }
    g->base = data;
    g->size = size;
    g->mapped = mapped;
    status = gguf_parse(g, err, err_len);
    if (status != PD_OK) {
        gguf_close(g);
        return status;
    }
    *gguf_p = g;
    return PD_OK;
}

pd_status_t gguf_open(const char *path, gguf_t **gguf_p, char *err, size_t err_len)
{
    struct stat st;
    void *map;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        goto err_errno;
    if (fstat(fd, &st) != 0)
        goto err_close;
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        if (err && err_len)
            snprintf(err, err_len, "%s: not a regular file", path);
        return PD_ERR_IO;
    }
    if (st.st_size < 4) {
        close(fd);
        if (err && err_len)
            snprintf(err, err_len, "truncated: %s has %lld bytes, not a GGUF file", path,
                     (long long)st.st_size);
        return PD_ERR_TRUNCATED;
    }
    map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
        goto err_close;
    close(fd);
    return gguf_open_common(map, (size_t)st.st_size, true, gguf_p, err, err_len);

err_close: {
        int e = errno;
        close(fd);
        errno = e;
    }
err_errno:
    if (err && err_len)
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
    return PD_ERR_IO;
}

pd_status_t gguf_open_memory(const void *data, size_t size, gguf_t **gguf_p, char *err,
                             size_t err_len)
{
    return gguf_open_common(data, size, false, gguf_p, err, err_len);
}

void gguf_close(gguf_t *g)
{
    if (g == NULL)
        return;
    if (g->kvs != NULL) {
        for (uint64_t i = 0; i < g->n_kv; i++) {
            free((char *)g->kvs[i].key);
            if (g->kvs[i].type == GGUF_TYPE_ARRAY)
                free((uint64_t *)g->kvs[i].v.arr.str_off);
        }
        free(g->kvs);
    }
    if (g->tensors != NULL) {
        for (uint64_t i = 0; i < g->n_tensors; i++)
            free((char *)g->tensors[i].name);
        free(g->tensors);
    }
    free(g->kv_ht);
    free(g->t_ht);
    if (g->mapped)
        munmap((void *)g->base, g->size);
    free(g);
}

void gguf_release(const gguf_t *g, const void *p, size_t n)
{
    const uintptr_t base = (uintptr_t)g->base, pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p, b = a + n;
    if (!g->mapped || a < base || b > base + g->size || b < a)
        return;
    a = (a + pg - 1) & ~(pg - 1);
    b &= ~(pg - 1);
    if (a < b) /* read-only private file pages: dropping them loses nothing */
        (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

uint32_t gguf_version(const gguf_t *g) { return g->version; }
uint32_t gguf_alignment(const gguf_t *g) { return g->alignment; }
uint64_t gguf_data_offset(const gguf_t *g) { return g->data_offset; }
uint64_t gguf_file_size(const gguf_t *g) { return g->size; }
const void *gguf_file_data(const gguf_t *g) { return g->base; }
uint64_t gguf_kv_count(const gguf_t *g) { return g->n_kv; }
uint64_t gguf_tensor_count(const gguf_t *g) { return g->n_tensors; }

const gguf_kv_t *gguf_kv_at(const gguf_t *g, uint64_t i)
{
    return i < g->n_kv ? &g->kvs[i] : NULL;
}

const gguf_kv_t *gguf_kv_find(const gguf_t *g, const char *key)
{
    uint32_t idx = ht_find(g->kv_ht, g->kv_ht_mask, key, kv_name_of, g);
    return idx ? &g->kvs[idx - 1] : NULL;
}

const gguf_tensor_t *gguf_tensor_at(const gguf_t *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const gguf_tensor_t *gguf_tensor_find(const gguf_t *g, const char *name)
{
    uint32_t idx = ht_find(g->t_ht, g->t_ht_mask, name, tensor_name_of, g);
    return idx ? &g->tensors[idx - 1] : NULL;
}

static bool type_is_unsigned(gguf_type_t t)
{
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 ||
           t == GGUF_TYPE_UINT64;
}

static bool type_is_signed(gguf_type_t t)
{
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 ||
           t == GGUF_TYPE_INT64;
}

/* Integer value of kv as a (negative flag, magnitude-ish) pair via i64/u64. */
static pd_status_t get_int(const gguf_t *g, const char *key, int64_t lo, uint64_t hi,
                           int64_t *sv, uint64_t *uv)
{
    const gguf_kv_t *kv = gguf_kv_find(g, key);

    if (kv == NULL)
        return PD_ERR_NOT_FOUND;
    if (type_is_unsigned(kv->type)) {
        if (kv->v.u64 > hi)
            return PD_ERR_BAD_TYPE;
        *uv = kv->v.u64;
        *sv = (int64_t)(kv->v.u64 <= (uint64_t)INT64_MAX ? kv->v.u64 : (uint64_t)INT64_MAX);
        return PD_OK;
    }
    if (type_is_signed(kv->type)) {
        if (kv->v.i64 < lo || (kv->v.i64 >= 0 && (uint64_t)kv->v.i64 > hi))
            return PD_ERR_BAD_TYPE;
        *sv = kv->v.i64;
        *uv = (uint64_t)kv->v.i64;
        return PD_OK;
    }
    return PD_ERR_BAD_TYPE;
}

pd_status_t gguf_get_u32(const gguf_t *g, const char *key, uint32_t *v_p)
{
    int64_t s;
    uint64_t u;
    pd_status_t status = get_int(g, key, 0, UINT32_MAX, &s, &u);
    if (status == PD_OK)
        *v_p = (uint32_t)u;
    return status;
}

pd_status_t gguf_get_i32(const gguf_t *g, const char *key, int32_t *v_p)
{
    int64_t s;
    uint64_t u;
    pd_status_t status = get_int(g, key, INT32_MIN, INT32_MAX, &s, &u);
    if (status == PD_OK)
        *v_p = (int32_t)s;
    return status;
}

pd_status_t gguf_get_u64(const gguf_t *g, const char *key, uint64_t *v_p)
{
    int64_t s;
    uint64_t u;
    pd_status_t status = get_int(g, key, 0, UINT64_MAX, &s, &u);
    if (status == PD_OK)
        *v_p = u;
    return status;
}

pd_status_t gguf_get_f32(const gguf_t *g, const char *key, float *v_p)
{
    const gguf_kv_t *kv = gguf_kv_find(g, key);

    if (kv == NULL)
        return PD_ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_FLOAT32 && kv->type != GGUF_TYPE_FLOAT64)
        return PD_ERR_BAD_TYPE;
    *v_p = (float)kv->v.f64;
    return PD_OK;
}

pd_status_t gguf_get_bool(const gguf_t *g, const char *key, bool *v_p)
{
    const gguf_kv_t *kv = gguf_kv_find(g, key);

    if (kv == NULL)
        return PD_ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_BOOL)
        return PD_ERR_BAD_TYPE;
    *v_p = kv->v.u64 != 0;
    return PD_OK;
}

pd_status_t gguf_get_string(const gguf_t *g, const char *key, const char **s_p, uint64_t *len_p)
{
    const gguf_kv_t *kv = gguf_kv_find(g, key);

    if (kv == NULL)
        return PD_ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_STRING)
        return PD_ERR_BAD_TYPE;
    *s_p = kv->v.str.ptr;
    *len_p = kv->v.str.len;
    return PD_OK;
}

pd_status_t gguf_get_arr(const gguf_t *g, const char *key, gguf_type_t elem_type,
                         const gguf_arr_t **arr_p)
{
    const gguf_kv_t *kv = gguf_kv_find(g, key);

    if (kv == NULL)
        return PD_ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_ARRAY)
        return PD_ERR_BAD_TYPE;
    if (elem_type != GGUF_TYPE_COUNT && kv->v.arr.type != elem_type)
        return PD_ERR_BAD_TYPE;
    *arr_p = &kv->v.arr;
    return PD_OK;
}

int64_t gguf_arr_int(const gguf_arr_t *arr, uint64_t i)
{
    const uint8_t *p;

    assert(i < arr->count);
    p = arr->data + i * gguf_type_size(arr->type);
    switch (arr->type) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_BOOL:   return p[0];
    case GGUF_TYPE_INT8:   return (int8_t)p[0];
    case GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); return x; }
    case GGUF_TYPE_INT16:  { int16_t x; memcpy(&x, p, 2); return x; }
    case GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); return x; }
    case GGUF_TYPE_INT32:  { int32_t x; memcpy(&x, p, 4); return x; }
    case GGUF_TYPE_INT64:  { int64_t x; memcpy(&x, p, 8); return x; }
    case GGUF_TYPE_UINT64: {
        uint64_t x;
        memcpy(&x, p, 8);
        return x > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)x;
    }
    default:
        assert(!"gguf_arr_int on a non-integer array");
        return 0;
    }
}

double gguf_arr_float(const gguf_arr_t *arr, uint64_t i)
{
    assert(i < arr->count);
    if (arr->type == GGUF_TYPE_FLOAT32) {
        float x;
        memcpy(&x, arr->data + 4 * i, 4);
        return x;
    }
    if (arr->type == GGUF_TYPE_FLOAT64) {
        double x;
        memcpy(&x, arr->data + 8 * i, 8);
        return x;
    }
    assert(!"gguf_arr_float on a non-float array");
    return 0;
}

const char *gguf_arr_str(const gguf_arr_t *arr, uint64_t i, uint64_t *len_p)
{
    uint64_t len = 0;

    assert(i < arr->count && arr->type == GGUF_TYPE_STRING);
    memcpy(&len, arr->data + arr->str_off[i], 8);
    *len_p = len;
    return (const char *)arr->data + arr->str_off[i] + 8;
}
