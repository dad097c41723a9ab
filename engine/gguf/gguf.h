/* gguf.h - GGUF v3 reader (memory-mapped, strictly validated) and writer.
 *
 * Reader: gguf_open() maps the file read-only and validates ALL of it before
 * returning (header, every key/value, every tensor info, alignment, sizes,
 * data ranges). A bad file yields PD_ERR_* and ONE line in `err` naming the
 * problem (e.g. "tensor 'blk.0.attn_q.weight': data range exceeds file");
 * it never crashes. After a successful open everything below is read-only
 * and safe to use from any thread until gguf_close().
 *
 * Strings from the file (keys, tensor names) are copied and NUL-terminated;
 * string VALUES (scalars and array elements) point into the mapping and are
 * NOT NUL-terminated: always use the (ptr, len) pair. Keys and tensor names
 * are validated: 1..GGUF_MAX_KEY_LEN bytes, printable ASCII, no duplicates.
 *
 * Tensor dims use ggml order: ne[0] is the innermost (row length), a weight
 * matrix W of shape (out, in) is stored with ne[0] = in, ne[1] = out.
 * Unused dims are 1. Tensor data pointers are aligned to gguf_alignment()
 * (>= 8) when the file was opened with gguf_open() (page-aligned map).
 *
 * The mapping is MAP_PRIVATE read-only: the file must not be truncated
 * while open (SIGBUS on access, as with any mmap'd model loader); replace
 * model files by rename, as pd-mkmodel and gguf_writer_write do.
 *
 * Writer: collect metadata and tensors in memory, then gguf_writer_write()
 * writes a GGUF v3 file atomically (tmp file + fsync + rename).
 */
#ifndef GGUF_H
#define GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "pd_status.h"
#include "ggml_types.h"

#define GGUF_MAGIC            0x46554747u /* "GGUF" little-endian */
#define GGUF_VERSION          3u
#define GGUF_DEFAULT_ALIGNMENT 32u

/* Hard limits enforced by the reader (and the writer). */
#define GGUF_MAX_TENSORS      65536u      /* tensor infos per file */
#define GGUF_MAX_KVS          65536u      /* metadata pairs per file */
#define GGUF_MAX_KEY_LEN      256u        /* key / tensor name bytes */
#define GGUF_MAX_STRING_LEN   (1u << 24)  /* one string value: 16 MiB */
#define GGUF_MAX_ARRAY_LEN    (1u << 26)  /* elements of one array */
#define GGUF_MAX_DIMS         4u
#define GGUF_MAX_ALIGNMENT    (1u << 16)  /* general.alignment in [8, 64 KiB] */
#define GGUF_MIN_ALIGNMENT    8u

/* Metadata value types (GGUF spec ids). */
typedef enum {
    GGUF_TYPE_UINT8   = 0,
    GGUF_TYPE_INT8    = 1,
    GGUF_TYPE_UINT16  = 2,
    GGUF_TYPE_INT16   = 3,
    GGUF_TYPE_UINT32  = 4,
    GGUF_TYPE_INT32   = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL    = 7,
    GGUF_TYPE_STRING  = 8,
    GGUF_TYPE_ARRAY   = 9,
    GGUF_TYPE_UINT64  = 10,
    GGUF_TYPE_INT64   = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT   = 13,
} gguf_type_t;

/* "uint32", "string", ... ; "?" for unknown ids. */
const char *gguf_type_name(uint32_t type);

typedef struct gguf gguf_t;            /* an opened, validated file */

/* An array value. Element data is raw little-endian and possibly UNALIGNED;
 * read elements through the gguf_arr_* accessors. */
typedef struct {
    gguf_type_t type;          /* element type (never ARRAY: nested arrays are rejected) */
    uint64_t count;            /* number of elements */
    const uint8_t *data;       /* first element (fixed-size types) */
    const uint64_t *str_off;   /* STRING arrays: (count) byte offset of each
                                  element's u64 length prefix from data */
} gguf_arr_t;

/* One metadata pair. */
typedef struct {
    const char *key;           /* NUL-terminated copy */
    gguf_type_t type;
    union {
        uint64_t u64;          /* UINT8/16/32/64, BOOL (0/1) */
        int64_t i64;           /* INT8/16/32/64 */
        double f64;            /* FLOAT32/FLOAT64 */
        struct {
            const char *ptr;   /* into the mapping, NOT NUL-terminated */
            uint64_t len;
        } str;                 /* STRING */
        gguf_arr_t arr;        /* ARRAY */
    } v;
} gguf_kv_t;

/* One tensor info. */
typedef struct {
    const char *name;          /* NUL-terminated copy */
    uint32_t type;             /* ggml_type_t id (validated known) */
    uint32_t n_dims;           /* 1..4 */
    uint64_t ne[GGUF_MAX_DIMS];/* ggml order, ne[0] innermost; unused = 1 */
    uint64_t n_elements;
    uint64_t n_bytes;
    uint64_t offset;           /* from the start of the data section */
    const void *data;          /* into the mapping */
} gguf_tensor_t;

/* ---- reader ---- */

/* Map and validate the file at path. On success *gguf_p owns the mapping.
 * Expected: PD_ERR_IO (open/stat/mmap failed), PD_ERR_BAD_MAGIC,
 * PD_ERR_BAD_VERSION, PD_ERR_TRUNCATED, PD_ERR_TOO_BIG (a count/length over
 * a cap or an overflow), PD_ERR_BAD_TYPE (unknown value or tensor type),
 * PD_ERR_EXISTS (duplicate key or tensor name), PD_ERR_BAD_INPUT (other
 * invalid content), PD_ERR_NO_MEMORY. err gets one line (may be NULL). */
pd_status_t gguf_open(const char *path, gguf_t **gguf_p, char *err, size_t err_len);

/* Same as gguf_open over a caller-owned buffer (no copy): the buffer must
 * outlive the gguf_t. Data pointers are only as aligned as `data` is.
 * Used by the fuzz target and tests. */
pd_status_t gguf_open_memory(const void *data, size_t size, gguf_t **gguf_p,
                             char *err, size_t err_len);

/* The caller will rarely read [p, p + n) (data of this file) again: for a
 * mapped file its whole pages leave the process's memory (read again, they
 * fault back from the file); for a gguf_open_memory buffer, nothing. */
void gguf_release(const gguf_t *gguf, const void *p, size_t n);

/* Unmap and free. Accepts NULL. */
void gguf_close(gguf_t *gguf);

uint32_t gguf_version(const gguf_t *gguf);
uint32_t gguf_alignment(const gguf_t *gguf);
uint64_t gguf_data_offset(const gguf_t *gguf);   /* file offset of the data section */
uint64_t gguf_file_size(const gguf_t *gguf);
const void *gguf_file_data(const gguf_t *gguf); /* whole file bytes */

/* Metadata, in file order. kv_at: NULL if i out of range. find: NULL if absent. */
uint64_t gguf_kv_count(const gguf_t *gguf);
const gguf_kv_t *gguf_kv_at(const gguf_t *gguf, uint64_t i);
const gguf_kv_t *gguf_kv_find(const gguf_t *gguf, const char *key);

/* Typed lookups. Set *v_p only on success. Expected: PD_ERR_NOT_FOUND (key
 * absent), PD_ERR_BAD_TYPE (wrong type, or an integer that does not fit the
 * requested type). Integer getters accept any integer value type whose
 * value fits; gguf_get_f32 accepts FLOAT32 and FLOAT64; gguf_get_bool only
 * BOOL. */
pd_status_t gguf_get_u32(const gguf_t *gguf, const char *key, uint32_t *v_p);
pd_status_t gguf_get_i32(const gguf_t *gguf, const char *key, int32_t *v_p);
pd_status_t gguf_get_u64(const gguf_t *gguf, const char *key, uint64_t *v_p);
pd_status_t gguf_get_f32(const gguf_t *gguf, const char *key, float *v_p);
pd_status_t gguf_get_bool(const gguf_t *gguf, const char *key, bool *v_p);
/* *s_p points into the mapping, NOT NUL-terminated; length in *len_p. */
pd_status_t gguf_get_string(const gguf_t *gguf, const char *key,
                            const char **s_p, uint64_t *len_p);
/* Array value; elem_type GGUF_TYPE_COUNT = any element type, otherwise
 * PD_ERR_BAD_TYPE unless the elements are of elem_type. */
pd_status_t gguf_get_arr(const gguf_t *gguf, const char *key, gguf_type_t elem_type,
                         const gguf_arr_t **arr_p);

/* Array element accessors; i must be < count (asserted).
 * gguf_arr_int: any integer or BOOL element type, as int64 (UINT64 values
 *   above INT64_MAX saturate to INT64_MAX).
 * gguf_arr_float: FLOAT32/FLOAT64 elements.
 * gguf_arr_str: STRING elements; pointer into the mapping, length in *len_p. */
int64_t gguf_arr_int(const gguf_arr_t *arr, uint64_t i);
double gguf_arr_float(const gguf_arr_t *arr, uint64_t i);
const char *gguf_arr_str(const gguf_arr_t *arr, uint64_t i, uint64_t *len_p);

/* Tensors, in file order. at: NULL if out of range. find: NULL if absent. */
uint64_t gguf_tensor_count(const gguf_t *gguf);
const gguf_tensor_t *gguf_tensor_at(const gguf_t *gguf, uint64_t i);
const gguf_tensor_t *gguf_tensor_find(const gguf_t *gguf, const char *name);

/* ---- writer ---- */

typedef struct gguf_writer gguf_writer_t;

/* Expected: PD_ERR_NO_MEMORY. */
pd_status_t gguf_writer_create(gguf_writer_t **writer_p);
/* Accepts NULL. */
void gguf_writer_destroy(gguf_writer_t *writer);

/* Data alignment (power of two in [GGUF_MIN_ALIGNMENT, GGUF_MAX_ALIGNMENT]).
 * A value other than 32 also emits the `general.alignment` u32 key; that
 * key cannot be added any other way (PD_ERR_BAD_INPUT), so it always
 * matches the padding. Call at most once (PD_ERR_EXISTS otherwise, when the
 * key was emitted). Expected: PD_ERR_BAD_INPUT, PD_ERR_EXISTS. */
pd_status_t gguf_writer_set_alignment(gguf_writer_t *writer, uint32_t alignment);

/* Add metadata. Keys are copied; adding an existing key gives PD_ERR_EXISTS,
 * an invalid key (empty, too long, non-printable) PD_ERR_BAD_INPUT. Values
 * are copied. */
pd_status_t gguf_writer_add_u8(gguf_writer_t *writer, const char *key, uint8_t v);
pd_status_t gguf_writer_add_u32(gguf_writer_t *writer, const char *key, uint32_t v);
pd_status_t gguf_writer_add_i32(gguf_writer_t *writer, const char *key, int32_t v);
pd_status_t gguf_writer_add_u64(gguf_writer_t *writer, const char *key, uint64_t v);
pd_status_t gguf_writer_add_f32(gguf_writer_t *writer, const char *key, float v);
pd_status_t gguf_writer_add_bool(gguf_writer_t *writer, const char *key, bool v);
pd_status_t gguf_writer_add_string(gguf_writer_t *writer, const char *key, const char *s);
pd_status_t gguf_writer_add_string_len(gguf_writer_t *writer, const char *key,
                                       const char *s, uint64_t len);
/* Array of fixed-size elements (any scalar type except STRING/ARRAY):
 * `data` holds count little-endian elements of elem_type. */
pd_status_t gguf_writer_add_arr(gguf_writer_t *writer, const char *key,
                                gguf_type_t elem_type, const void *data, uint64_t count);
pd_status_t gguf_writer_add_arr_f32(gguf_writer_t *writer, const char *key,
                                    const float *v, uint64_t count);
pd_status_t gguf_writer_add_arr_i32(gguf_writer_t *writer, const char *key,
                                    const int32_t *v, uint64_t count);
/* Array of strings; lens NULL = each is NUL-terminated. */
pd_status_t gguf_writer_add_arr_str(gguf_writer_t *writer, const char *key,
                                    const char *const *strs, const uint64_t *lens,
                                    uint64_t count);
/* Copy one pair from an opened file (any type, arrays included);
 * `general.alignment` becomes gguf_writer_set_alignment(value). */
pd_status_t gguf_writer_add_kv_from(gguf_writer_t *writer, const gguf_kv_t *kv);

/* Add a tensor converted from f32 data (ne[0] innermost, ggml order).
 * type: any supported ggml type; ne[0] must be a multiple of its block size.
 * Data is converted and copied now. Expected: PD_ERR_EXISTS (name taken),
 * PD_ERR_BAD_INPUT (bad name/dims), PD_ERR_UNSUPPORTED (type),
 * PD_ERR_TOO_BIG, PD_ERR_NO_MEMORY. */
pd_status_t gguf_writer_add_tensor_f32(gguf_writer_t *writer, const char *name,
                                       uint32_t type, uint32_t n_dims,
                                       const uint64_t *ne, const float *data);
/* Add a tensor from raw bytes already in `type` (any known ggml type);
 * n_bytes must equal ggml_nbytes(type, prod(ne)). Copied now. */
pd_status_t gguf_writer_add_tensor_raw(gguf_writer_t *writer, const char *name,
                                       uint32_t type, uint32_t n_dims,
                                       const uint64_t *ne, const void *data,
                                       uint64_t n_bytes);

/* Write the file atomically (path.tmp.<pid> + fsync + rename). Metadata in
 * insertion order, then tensor infos, padding, aligned tensor data.
 * Expected: PD_ERR_IO (message in err), PD_ERR_NO_MEMORY. */
pd_status_t gguf_writer_write(gguf_writer_t *writer, const char *path,
                              char *err, size_t err_len);

/* Serialize into a malloc'd buffer (*buf_p, *size_p; caller frees). Same
 * bytes gguf_writer_write would write. Expected: PD_ERR_NO_MEMORY. */
pd_status_t gguf_writer_write_memory(gguf_writer_t *writer, uint8_t **buf_p,
                                     size_t *size_p);

#endif
