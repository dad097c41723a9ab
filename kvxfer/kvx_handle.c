/* kvx_handle.c - KV handle codec (see kvx_handle.h for the layout). Pure:
 * no I/O, no allocation, no UCX; fuzzed by tests/kvxfer/fuzz_handle.c. */
#include "kvx_handle.h"

#include <sodium.h>
#include <string.h>

static const char *const kvx_reject_names[] = {
    "NONE",
#define KVX_REJECT_NAME(name, help) #name,
    KVX_REJECT_LIST(KVX_REJECT_NAME)
#undef KVX_REJECT_NAME
};

const char *kvx_reject_name(kvx_reject_t reason)
{
    if ((unsigned)reason >= KVX_REJECT__COUNT)
        return "UNKNOWN";
    return kvx_reject_names[reason];
}

static size_t kvx_varint_put(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* Reads at most 10 bytes; returns bytes used or 0 on truncation/overlong. */
static size_t kvx_varint_get(const uint8_t *p, size_t avail, uint64_t *v_p)
{
    uint64_t v = 0;
    for (size_t i = 0; i < avail && i < 10; i++) {
        uint64_t byte = p[i];
        if (i == 9 && byte > 1)
            return 0; /* more than 64 bits */
        v |= (byte & 0x7f) << (7 * i);
        if (!(byte & 0x80)) {
            *v_p = v;
            return i + 1;
        }
    }
    return 0;
}

static inline uint64_t kvx_zigzag(int64_t v)
{
    return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
}

static inline int64_t kvx_unzigzag(uint64_t v)
{
    return (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
}

static void kvx_mac(const uint8_t *buf, size_t len,
                    const uint8_t key[KVX_KEY_BYTES], uint8_t tag[KVX_TAG_BYTES])
{
    crypto_generichash(tag, KVX_TAG_BYTES, buf, len, key, KVX_KEY_BYTES);
}

static size_t kvx_varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

unsigned kvx_handle_runs_fitting(const kvx_run_t *runs, unsigned n)
{
    size_t bytes = KVX_HANDLE_HDR_BYTES + KVX_TAG_BYTES;
    uint64_t prev_end = 0;
    unsigned i;
    for (i = 0; i < n && i < KVX_HANDLE_MAX_RUNS; i++) {
        if (runs[i].count == 0)
            break;
        bytes += kvx_varint_len(kvx_zigzag((int64_t)runs[i].start - (int64_t)prev_end));
        bytes += kvx_varint_len((uint64_t)runs[i].count - 1);
        if (bytes > KVX_HANDLE_MAX_BYTES)
            break;
        prev_end = (uint64_t)runs[i].start + runs[i].count;
    }
    return i;
}

pd_status_t kvx_handle_encode(const kvx_handle_t *h,
                              const uint8_t key[KVX_KEY_BYTES],
                              uint8_t *buf, size_t cap, size_t *len_p)
{
    uint8_t runs[KVX_HANDLE_MAX_BYTES]; /* run encoding, bounded below */
    size_t runs_len = 0;
    uint64_t prev_end = 0, n_blocks = 0;

    if (h->n_runs == 0)
        return PD_ERR_BAD_INPUT;
    if (h->n_runs > KVX_HANDLE_MAX_RUNS)
        return PD_ERR_TOO_BIG;
    if (cap > KVX_HANDLE_MAX_BYTES)
        cap = KVX_HANDLE_MAX_BYTES;
    for (unsigned i = 0; i < h->n_runs; i++) {
        const kvx_run_t *r = &h->runs[i];
        if (r->count == 0)
            return PD_ERR_BAD_INPUT;
        /* worst case 20 bytes per run; stop as soon as it cannot fit */
        if (runs_len + 20 > sizeof(runs))
            return PD_ERR_TOO_BIG;
        runs_len += kvx_varint_put(runs + runs_len,
                                   kvx_zigzag((int64_t)r->start - (int64_t)prev_end));
        runs_len += kvx_varint_put(runs + runs_len, (uint64_t)r->count - 1);
        prev_end = (uint64_t)r->start + r->count;
        n_blocks += r->count;
    }
    if (n_blocks > KVX_HANDLE_MAX_BLOCKS)
        return PD_ERR_TOO_BIG;
    size_t total = KVX_HANDLE_HDR_BYTES + runs_len + KVX_TAG_BYTES;
    if (total > cap)
        return PD_ERR_TOO_BIG;

    kvx_put_u32(buf + 0, KVX_HANDLE_MAGIC);
    buf[4] = KVX_HANDLE_VERSION;
    buf[5] = h->flags;
    kvx_put_u16(buf + 6, h->n_runs);
    kvx_put_u64(buf + 8, h->exporter_id);
    kvx_put_u64(buf + 16, h->incarnation);
    kvx_put_u64(buf + 24, h->importer_id);
    kvx_put_u64(buf + 32, h->lease_gen);
    kvx_put_u64(buf + 40, h->expiry_wall_ns);
    kvx_put_u64(buf + 48, h->compat_hash);
    kvx_put_u32(buf + 56, h->region_id);
    kvx_put_u32(buf + 60, h->lease_slot);
    kvx_put_u32(buf + 64, h->block_bytes);
    kvx_put_u32(buf + 68, (uint32_t)n_blocks);
    kvx_put_u16(buf + 72, (uint16_t)runs_len);
    kvx_put_u16(buf + 74, 0);
    memcpy(buf + KVX_HANDLE_HDR_BYTES, runs, runs_len);
    kvx_mac(buf, total - KVX_TAG_BYTES, key, buf + total - KVX_TAG_BYTES);
    *len_p = total;
    return PD_OK;
}

#define KVX_REJECT(r, st)                                                     \
    do {                                                                      \
        if (reason_p)                                                         \
            *reason_p = KVX_REJECT_##r;                                       \
        return (st);                                                          \
    } while (0)

pd_status_t kvx_handle_decode(const uint8_t *buf, size_t len,
                              const uint8_t key[KVX_KEY_BYTES],
                              kvx_handle_t *h, kvx_reject_t *reason_p)
{
    uint8_t tag[KVX_TAG_BYTES];

    if (len < KVX_HANDLE_HDR_BYTES + KVX_TAG_BYTES)
        KVX_REJECT(TRUNCATED, PD_ERR_TRUNCATED);
    if (kvx_get_u32(buf) != KVX_HANDLE_MAGIC)
        KVX_REJECT(BAD_MAGIC, PD_ERR_BAD_MAGIC);
    if (buf[4] != KVX_HANDLE_VERSION)
        KVX_REJECT(BAD_VERSION, PD_ERR_BAD_VERSION);
    size_t runs_len = kvx_get_u16(buf + 72);
    size_t total = KVX_HANDLE_HDR_BYTES + runs_len + KVX_TAG_BYTES;
    if (len < total)
        KVX_REJECT(TRUNCATED, PD_ERR_TRUNCATED);
    if (len > total || total > KVX_HANDLE_MAX_BYTES)
        KVX_REJECT(EXTENDED, PD_ERR_TOO_BIG);
    /* authenticate before believing any other field */
    kvx_mac(buf, total - KVX_TAG_BYTES, key, tag);
    if (crypto_verify_16(tag, buf + total - KVX_TAG_BYTES) != 0)
        KVX_REJECT(BAD_MAC, PD_ERR_AUTH);
    if ((buf[5] & ~KVX_HANDLE_F_STREAM) != 0 || kvx_get_u16(buf + 74) != 0)
        KVX_REJECT(RESERVED, PD_ERR_RESERVED);

    h->version = buf[4];
    h->flags = buf[5];
    h->n_runs = kvx_get_u16(buf + 6);
    h->exporter_id = kvx_get_u64(buf + 8);
    h->incarnation = kvx_get_u64(buf + 16);
    h->importer_id = kvx_get_u64(buf + 24);
    h->lease_gen = kvx_get_u64(buf + 32);
    h->expiry_wall_ns = kvx_get_u64(buf + 40);
    h->compat_hash = kvx_get_u64(buf + 48);
    h->region_id = kvx_get_u32(buf + 56);
    h->lease_slot = kvx_get_u32(buf + 60);
    h->block_bytes = kvx_get_u32(buf + 64);
    h->n_blocks = kvx_get_u32(buf + 68);
    memcpy(h->tag, buf + total - KVX_TAG_BYTES, KVX_TAG_BYTES);

    if (h->n_runs == 0 || h->n_runs > KVX_HANDLE_MAX_RUNS ||
        h->n_blocks == 0 || h->n_blocks > KVX_HANDLE_MAX_BLOCKS)
        KVX_REJECT(TOO_MANY, PD_ERR_TOO_BIG);

    const uint8_t *p = buf + KVX_HANDLE_HDR_BYTES;
    size_t avail = runs_len;
    uint64_t prev_end = 0, n_blocks = 0;
    for (unsigned i = 0; i < h->n_runs; i++) {
        uint64_t zz, cm1;
        size_t n = kvx_varint_get(p, avail, &zz);
        if (n == 0)
            KVX_REJECT(BAD_RUNS, PD_ERR_BAD_HANDLE);
        p += n;
        avail -= n;
        n = kvx_varint_get(p, avail, &cm1);
        if (n == 0)
            KVX_REJECT(BAD_RUNS, PD_ERR_BAD_HANDLE);
        p += n;
        avail -= n;
        int64_t delta = kvx_unzigzag(zz);
        /* prev_end <= 2^32, so start stays in int64 range for |delta| < 2^62 */
        if (delta > ((int64_t)1 << 40) || delta < -((int64_t)1 << 40))
            KVX_REJECT(OVERFLOW, PD_ERR_BAD_HANDLE);
        int64_t start = (int64_t)prev_end + delta;
        if (start < 0 || start > (int64_t)UINT32_MAX ||
            cm1 >= KVX_HANDLE_MAX_BLOCKS)
            KVX_REJECT(OVERFLOW, PD_ERR_BAD_HANDLE);
        uint64_t end = (uint64_t)start + cm1 + 1;
        if (end > (uint64_t)UINT32_MAX + 1)
            KVX_REJECT(OVERFLOW, PD_ERR_BAD_HANDLE);
        h->runs[i].start = (uint32_t)start;
        h->runs[i].count = (uint32_t)(cm1 + 1);
        n_blocks += cm1 + 1;
        if (n_blocks > KVX_HANDLE_MAX_BLOCKS)
            KVX_REJECT(TOO_MANY, PD_ERR_TOO_BIG);
        prev_end = end;
    }
    if (avail != 0 || n_blocks != h->n_blocks)
        KVX_REJECT(BAD_RUNS, PD_ERR_BAD_HANDLE);
    if (reason_p)
        *reason_p = KVX_REJECT_NONE;
    return PD_OK;
}

pd_status_t kvx_handle_check(const kvx_handle_t *h,
                             const kvx_handle_expect_t *e,
                             kvx_reject_t *reason_p)
{
    if (h->importer_id != e->importer_id)
        KVX_REJECT(WRONG_IMPORTER, PD_ERR_PERMISSION);
    if (h->exporter_id != e->exporter_id)
        KVX_REJECT(UNKNOWN_PEER, PD_ERR_BAD_HANDLE);
    if (h->incarnation != e->incarnation)
        KVX_REJECT(OLD_INCARNATION, PD_ERR_STALE);
    if (h->region_id != e->region_id)
        KVX_REJECT(UNKNOWN_REGION, PD_ERR_BAD_HANDLE);
    if (h->block_bytes != e->block_bytes || h->compat_hash != e->compat_hash)
        KVX_REJECT(GEOMETRY, PD_ERR_MISMATCH);
    if (h->lease_slot >= e->n_lease_slots)
        KVX_REJECT(BAD_LEASE, PD_ERR_BAD_HANDLE);
    for (unsigned i = 0; i < h->n_runs; i++) {
        /* 64-bit: start + count cannot wrap (both < 2^32) */
        uint64_t end = (uint64_t)h->runs[i].start + h->runs[i].count;
        if (end > e->region_blocks)
            KVX_REJECT(OUT_OF_REGION, PD_ERR_BAD_HANDLE);
    }
    if (h->expiry_wall_ns <= e->now_wall_ns)
        KVX_REJECT(EXPIRED, PD_ERR_EXPIRED);
    if (e->released_gen && h->lease_gen <= e->released_gen[h->lease_slot])
        KVX_REJECT(REPLAYED, PD_ERR_STALE);
    if (reason_p)
        *reason_p = KVX_REJECT_NONE;
    return PD_OK;
}
