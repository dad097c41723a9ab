/* gguf_writer.c - build a GGUF v3 file in memory, write it atomically.
 *
 * Each metadata pair is serialized (type + value bytes) when added, so the
 * final write is a concatenation. Tensor data is converted when added and
 * kept until the writer is destroyed.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "gguf.h"

typedef struct {
    char *key;
    uint8_t *val;               /* (val_len) u32 type + value bytes, file format */
    size_t val_len;
} gguf_wkv_t;

typedef struct {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint8_t *data;              /* (n_bytes) */
    uint64_t n_bytes;
} gguf_wtensor_t;

struct gguf_writer {
    uint32_t alignment;
    gguf_wkv_t *kvs;
    size_t n_kv, cap_kv;
    gguf_wtensor_t *tensors;
    size_t n_tensors, cap_tensors;
};

/* Growable byte buffer for values and for whole-file serialization. */
typedef struct {
    uint8_t *p;
    size_t len, cap;
    bool failed;
} gguf_buf_t;

static void buf_put(gguf_buf_t *b, const void *data, size_t n)
{
    if (b->failed || n == 0)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (p == NULL) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void buf_u32(gguf_buf_t *b, uint32_t v) { buf_put(b, &v, 4); }
static void buf_u64(gguf_buf_t *b, uint64_t v) { buf_put(b, &v, 8); }

static void buf_str(gguf_buf_t *b, const char *s, uint64_t len)
{
    buf_u64(b, len);
    buf_put(b, s, len);
}

pd_status_t gguf_writer_create(gguf_writer_t **writer_p)
{
    gguf_writer_t *w = calloc(1, sizeof(*w));

    if (w == NULL)
        return PD_ERR_NO_MEMORY;
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    *writer_p = w;
    return PD_OK;
}

void gguf_writer_destroy(gguf_writer_t *w)
{
    if (w == NULL)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].val);
    }
    free(w->kvs);
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->tensors);
    free(w);
}

/* strdup through malloc (so allocation-failure tests see it). */
static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d != NULL)
        memcpy(d, s, n);
    return d;
}

static bool name_ok(const char *s)
{
    size_t len = strlen(s);

    if (len == 0 || len > GGUF_MAX_KEY_LEN)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((uint8_t)s[i] < 0x20 || (uint8_t)s[i] > 0x7E)
            return false;
    return true;
}

#define GGUF_KEY_ALIGNMENT "general.alignment"

/* Takes ownership of val (freed on failure). general.alignment is only
 * accepted from gguf_writer_set_alignment (reserved), so the key and the
 * padding the writer produces always agree. */
static pd_status_t add_kv_ex(gguf_writer_t *w, const char *key, gguf_buf_t *val, bool reserved)
{
    pd_status_t status;

    if (!reserved && strcmp(key, GGUF_KEY_ALIGNMENT) == 0) {
        status = PD_ERR_BAD_INPUT;
        goto err;
    }
    if (val->failed) {
        status = PD_ERR_NO_MEMORY;
        goto err;
    }
    if (!name_ok(key)) {
        status = PD_ERR_BAD_INPUT;
        goto err;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            status = PD_ERR_EXISTS;
            goto err;
        }
    }
    if (w->n_kv >= GGUF_MAX_KVS) {
        status = PD_ERR_TOO_BIG;
        goto err;
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
        gguf_wkv_t *kvs = realloc(w->kvs, cap * sizeof(*kvs));
        if (kvs == NULL) {
            status = PD_ERR_NO_MEMORY;
            goto err;
        }
        w->kvs = kvs;
        w->cap_kv = cap;
    }
    char *k = dup_str(key);
    if (k == NULL) {
        status = PD_ERR_NO_MEMORY;
        goto err;
    }
    w->kvs[w->n_kv].key = k;
    w->kvs[w->n_kv].val = val->p;
    w->kvs[w->n_kv].val_len = val->len;
    w->n_kv++;
    return PD_OK;

err:
    free(val->p);
    return status;
}

static pd_status_t add_kv(gguf_writer_t *w, const char *key, gguf_buf_t *val)
{
    return add_kv_ex(w, key, val, false);
}

static pd_status_t add_scalar(gguf_writer_t *w, const char *key, gguf_type_t type,
                              const void *v, size_t n)
{
    gguf_buf_t b = {0};

    buf_u32(&b, type);
    buf_put(&b, v, n);
    return add_kv(w, key, &b);
}

pd_status_t gguf_writer_set_alignment(gguf_writer_t *w, uint32_t alignment)
{
    if (alignment < GGUF_MIN_ALIGNMENT || alignment > GGUF_MAX_ALIGNMENT ||
        (alignment & (alignment - 1)) != 0)
        return PD_ERR_BAD_INPUT;
    if (alignment != GGUF_DEFAULT_ALIGNMENT) {
        gguf_buf_t b = {0};
        buf_u32(&b, GGUF_TYPE_UINT32);
        buf_u32(&b, alignment);
        pd_status_t status = add_kv_ex(w, GGUF_KEY_ALIGNMENT, &b, true);
        if (status != PD_OK)
            return status;
    }
    w->alignment = alignment;
    return PD_OK;
}

pd_status_t gguf_writer_add_u8(gguf_writer_t *w, const char *key, uint8_t v)
{
    return add_scalar(w, key, GGUF_TYPE_UINT8, &v, 1);
}

pd_status_t gguf_writer_add_u32(gguf_writer_t *w, const char *key, uint32_t v)
{
    return add_scalar(w, key, GGUF_TYPE_UINT32, &v, 4);
}

pd_status_t gguf_writer_add_i32(gguf_writer_t *w, const char *key, int32_t v)
{
    return add_scalar(w, key, GGUF_TYPE_INT32, &v, 4);
}

pd_status_t gguf_writer_add_u64(gguf_writer_t *w, const char *key, uint64_t v)
{
    return add_scalar(w, key, GGUF_TYPE_UINT64, &v, 8);
}

pd_status_t gguf_writer_add_f32(gguf_writer_t *w, const char *key, float v)
{
    return add_scalar(w, key, GGUF_TYPE_FLOAT32, &v, 4);
}

pd_status_t gguf_writer_add_bool(gguf_writer_t *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return add_scalar(w, key, GGUF_TYPE_BOOL, &b, 1);
}

pd_status_t gguf_writer_add_string_len(gguf_writer_t *w, const char *key, const char *s,
                                       uint64_t len)
{
    gguf_buf_t b = {0};

    if (len > GGUF_MAX_STRING_LEN)
        return PD_ERR_TOO_BIG;
    buf_u32(&b, GGUF_TYPE_STRING);
    buf_str(&b, s, len);
    return add_kv(w, key, &b);
}

pd_status_t gguf_writer_add_string(gguf_writer_t *w, const char *key, const char *s)
{
    return gguf_writer_add_string_len(w, key, s, strlen(s));
}

static const uint8_t elem_sizes[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

pd_status_t gguf_writer_add_arr(gguf_writer_t *w, const char *key, gguf_type_t elem_type,
                                const void *data, uint64_t count)
{
    gguf_buf_t b = {0};

    if ((uint32_t)elem_type >= GGUF_TYPE_COUNT || elem_sizes[elem_type] == 0)
        return PD_ERR_BAD_INPUT;
    if (count > GGUF_MAX_ARRAY_LEN)
        return PD_ERR_TOO_BIG;
    if (elem_type == GGUF_TYPE_BOOL)
        for (uint64_t i = 0; i < count; i++)
            if (((const uint8_t *)data)[i] > 1)
                return PD_ERR_BAD_INPUT;
    buf_u32(&b, GGUF_TYPE_ARRAY);
    buf_u32(&b, elem_type);
    buf_u64(&b, count);
    buf_put(&b, data, count * elem_sizes[elem_type]);
    return add_kv(w, key, &b);
}

pd_status_t gguf_writer_add_arr_f32(gguf_writer_t *w, const char *key, const float *v,
                                    uint64_t count)
{
    return gguf_writer_add_arr(w, key, GGUF_TYPE_FLOAT32, v, count);
}

pd_status_t gguf_writer_add_arr_i32(gguf_writer_t *w, const char *key, const int32_t *v,
                                    uint64_t count)
{
    return gguf_writer_add_arr(w, key, GGUF_TYPE_INT32, v, count);
}

pd_status_t gguf_writer_add_arr_str(gguf_writer_t *w, const char *key, const char *const *strs,
                                    const uint64_t *lens, uint64_t count)
{
    gguf_buf_t b = {0};

    if (count > GGUF_MAX_ARRAY_LEN)
        return PD_ERR_TOO_BIG;
    buf_u32(&b, GGUF_TYPE_ARRAY);
    buf_u32(&b, GGUF_TYPE_STRING);
    buf_u64(&b, count);
    for (uint64_t i = 0; i < count; i++) {
        uint64_t len = lens ? lens[i] : strlen(strs[i]);
        if (len > GGUF_MAX_STRING_LEN) {
            free(b.p);
            return PD_ERR_TOO_BIG;
        }
        buf_str(&b, strs[i], len);
    }
    return add_kv(w, key, &b);
}

pd_status_t gguf_writer_add_kv_from(gguf_writer_t *w, const gguf_kv_t *kv)
{
    gguf_buf_t b = {0};

    if (strcmp(kv->key, GGUF_KEY_ALIGNMENT) == 0) {
        if (kv->type != GGUF_TYPE_UINT32 || kv->v.u64 > UINT32_MAX)
            return PD_ERR_BAD_INPUT;
        return gguf_writer_set_alignment(w, (uint32_t)kv->v.u64);
    }

    buf_u32(&b, kv->type);
    switch (kv->type) {
    case GGUF_TYPE_STRING:
        buf_str(&b, kv->v.str.ptr, kv->v.str.len);
        break;
    case GGUF_TYPE_ARRAY: {
        const gguf_arr_t *arr = &kv->v.arr;
        buf_u32(&b, arr->type);
        buf_u64(&b, arr->count);
        if (arr->type == GGUF_TYPE_STRING) {
            for (uint64_t i = 0; i < arr->count; i++) {
                uint64_t len;
                const char *s = gguf_arr_str(arr, i, &len);
                buf_str(&b, s, len);
            }
        } else {
            buf_put(&b, arr->data, arr->count * elem_sizes[arr->type]);
        }
        break;
    }
    case GGUF_TYPE_FLOAT32: {
        float f = (float)kv->v.f64;
        buf_put(&b, &f, 4);
        break;
    }
    case GGUF_TYPE_FLOAT64:
        buf_put(&b, &kv->v.f64, 8);
        break;
    default:
        if ((uint32_t)kv->type >= GGUF_TYPE_COUNT) {
            free(b.p);
            return PD_ERR_BAD_INPUT;
        }
        /* integers and bool: low bytes of the 64-bit value (little-endian) */
        buf_put(&b, &kv->v.u64, elem_sizes[kv->type]);
        break;
    }
    return add_kv(w, kv->key, &b);
}

static pd_status_t add_tensor_slot(gguf_writer_t *w, const char *name, uint32_t type,
                                   uint32_t n_dims, const uint64_t *ne, uint64_t *nbytes_p,
                                   gguf_wtensor_t **t_p)
{
    uint64_t nel = 1;
    pd_status_t status;

    if (!name_ok(name) || n_dims == 0 || n_dims > GGUF_MAX_DIMS)
        return PD_ERR_BAD_INPUT;
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return PD_ERR_EXISTS;
    if (w->n_tensors >= GGUF_MAX_TENSORS)
        return PD_ERR_TOO_BIG;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0)
            return PD_ERR_BAD_INPUT;
        if (__builtin_mul_overflow(nel, ne[d], &nel) || nel > (uint64_t)INT64_MAX)
            return PD_ERR_TOO_BIG;
    }
    const ggml_type_info_t *info = ggml_type_info(type);
    if (info == NULL)
        return PD_ERR_UNSUPPORTED;
    if (ne[0] % info->block_size != 0)
        return PD_ERR_BAD_INPUT;
    status = ggml_nbytes(type, nel, nbytes_p);
    if (status != PD_OK)
        return status;
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        gguf_wtensor_t *ts = realloc(w->tensors, cap * sizeof(*ts));
        if (ts == NULL)
            return PD_ERR_NO_MEMORY;
        w->tensors = ts;
        w->cap_tensors = cap;
    }
    gguf_wtensor_t *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof(*t));
    t->name = dup_str(name);
    t->data = malloc(*nbytes_p ? *nbytes_p : 1);
    if (t->name == NULL || t->data == NULL) {
        free(t->name);
        free(t->data);
        return PD_ERR_NO_MEMORY;
    }
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->n_bytes = *nbytes_p;
    *t_p = t;
    return PD_OK;
}

pd_status_t gguf_writer_add_tensor_f32(gguf_writer_t *w, const char *name, uint32_t type,
                                       uint32_t n_dims, const uint64_t *ne, const float *data)
{
    const ggml_type_info_t *info = ggml_type_info(type);
    gguf_wtensor_t *t;
    uint64_t nbytes;
    pd_status_t status;

    if (info == NULL || !info->supported)
        return PD_ERR_UNSUPPORTED;
    status = add_tensor_slot(w, name, type, n_dims, ne, &nbytes, &t);
    if (status != PD_OK)
        return status;
    /* row by row: ne[0] is a multiple of the block size */
    uint64_t row_bytes = nbytes / (t->ne[1] * t->ne[2] * t->ne[3]);
    uint64_t n_rows = t->ne[1] * t->ne[2] * t->ne[3];
    for (uint64_t r = 0; r < n_rows; r++) {
        status = ggml_quantize_row(type, data + r * t->ne[0], t->data + r * row_bytes, t->ne[0]);
        if (status != PD_OK) {
            free(t->name);
            free(t->data);
            return status;
        }
    }
    w->n_tensors++;
    return PD_OK;
}

pd_status_t gguf_writer_add_tensor_raw(gguf_writer_t *w, const char *name, uint32_t type,
                                       uint32_t n_dims, const uint64_t *ne, const void *data,
                                       uint64_t n_bytes)
{
    gguf_wtensor_t *t;
    uint64_t nbytes;
    pd_status_t status;

    status = add_tensor_slot(w, name, type, n_dims, ne, &nbytes, &t);
    if (status != PD_OK)
        return status;
    if (nbytes != n_bytes) {
        free(t->name);
        free(t->data);
        return PD_ERR_BAD_INPUT;
    }
    memcpy(t->data, data, n_bytes);
    w->n_tensors++;
    return PD_OK;
}

static uint64_t align_up(uint64_t x, uint32_t a)
{
    return (x + a - 1) / a * a;
}

/* Header + kvs + tensor infos + padding (everything before the data). */
static pd_status_t build_head(gguf_writer_t *w, gguf_buf_t *b, uint64_t *data_size_p)
{
    static const uint8_t zeros[GGUF_MAX_ALIGNMENT] = {0};
    uint64_t off = 0;

    buf_u32(b, GGUF_MAGIC);
    buf_u32(b, GGUF_VERSION);
    buf_u64(b, w->n_tensors);
    buf_u64(b, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        buf_str(b, w->kvs[i].key, strlen(w->kvs[i].key));
        buf_put(b, w->kvs[i].val, w->kvs[i].val_len);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        const gguf_wtensor_t *t = &w->tensors[i];
        buf_str(b, t->name, strlen(t->name));
        buf_u32(b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            buf_u64(b, t->ne[d]);
        buf_u32(b, t->type);
        buf_u64(b, off);
        off = align_up(off + t->n_bytes, w->alignment);
    }
    buf_put(b, zeros, align_up(b->len, w->alignment) - b->len);
    *data_size_p = off;
    return b->failed ? PD_ERR_NO_MEMORY : PD_OK;
}

pd_status_t gguf_writer_write_memory(gguf_writer_t *w, uint8_t **buf_p, size_t *size_p)
{
    static const uint8_t zeros[GGUF_MAX_ALIGNMENT] = {0};
    gguf_buf_t b = {0};
    uint64_t data_size;
    pd_status_t status = build_head(w, &b, &data_size);

    for (size_t i = 0; status == PD_OK && i < w->n_tensors; i++) {
        const gguf_wtensor_t *t = &w->tensors[i];
        buf_put(&b, t->data, t->n_bytes);
        if (i + 1 < w->n_tensors)
            buf_put(&b, zeros, align_up(t->n_bytes, w->alignment) - t->n_bytes);
    }
    if (status != PD_OK || b.failed) {
        free(b.p);
        return PD_ERR_NO_MEMORY;
    }
    *buf_p = b.p;
    *size_p = b.len;
    return PD_OK;
}

static bool write_all(int fd, const void *p, size_t n)
{
    const uint8_t *c = p;
    while (n > 0) {
        ssize_t r = write(fd, c, n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return false;
        }
        c += r;
        n -= (size_t)r;
    }
    return true;
}

pd_status_t gguf_writer_write(gguf_writer_t *w, const char *path, char *err, size_t err_len)
{
    static const uint8_t zeros[GGUF_MAX_ALIGNMENT] = {0};
    gguf_buf_t head = {0};
    uint64_t data_size;
    char tmp[4096];
    int fd;
    pd_status_t status;

    status = build_head(w, &head, &data_size);
    if (status != PD_OK)
        goto err;
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >= sizeof(tmp)) {
        if (err && err_len)
            snprintf(err, err_len, "%s: path too long", path);
        status = PD_ERR_IO;
        goto err;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        goto err_errno;
    if (!write_all(fd, head.p, head.len))
        goto err_unlink;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const gguf_wtensor_t *t = &w->tensors[i];
        if (!write_all(fd, t->data, t->n_bytes))
            goto err_unlink;
        if (i + 1 < w->n_tensors &&
            !write_all(fd, zeros, align_up(t->n_bytes, w->alignment) - t->n_bytes))
            goto err_unlink;
    }
    if (fsync(fd) != 0)
        goto err_unlink;
    if (close(fd) != 0) {
        fd = -1;
        goto err_unlink;
    }
    fd = -1;
    if (rename(tmp, path) != 0)
        goto err_unlink;
    free(head.p);
    return PD_OK;

err_unlink: {
        int e = errno;
        if (fd >= 0)
            close(fd);
        unlink(tmp);
        errno = e;
    }
err_errno:
    if (err && err_len)
        snprintf(err, err_len, "write %s: %s", path, strerror(errno));
    status = PD_ERR_IO;
err:
    free(head.p);
    if (status == PD_ERR_NO_MEMORY && err && err_len)
        snprintf(err, err_len, "out of memory");
    return status;
}
