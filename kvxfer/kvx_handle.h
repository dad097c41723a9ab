/* kvx_handle.h - the KV handle wire format: pure codec, no I/O, no UCX.
 *
 * A handle names a set of blocks of one exporter region under one lease. It
 * is built by the exporter (kvx_export), carried by the daemons' control
 * plane, and validated completely by the importer before any UCX call.
 *
 * Wire layout (little-endian, 92 + runs_len bytes, at most 256):
 *   off size field
 *     0   4  magic 0x4858564b ("KVXH")
 *     4   1  version (1)
 *     5   1  flags: bit 0 KVX_HANDLE_F_STREAM (the KV may still be being
 *            written: poll the lease's readiness words), others 0
 *     6   2  n_runs            1..KVX_HANDLE_MAX_RUNS
 *     8   8  exporter node id
 *    16   8  exporter incarnation (random per exporter start)
 *    24   8  intended importer node id
 *    32   8  lease generation
 *    40   8  expiry, CLOCK_REALTIME ns (wall: clocks of two hosts)
 *    48   8  model/geometry compatibility hash
 *    56   4  region id
 *    60   4  lease slot (lease id)
 *    64   4  block bytes
 *    68   4  n_blocks (sum of run lengths)
 *    72   2  runs_len (bytes of the run encoding)
 *    74   2  reserved (0)
 *    76   .  runs: per run varint(zigzag(start - previous run end)),
 *            varint(count - 1)   (LEB128; order of blocks is preserved)
 *   ...  16  tag: keyed BLAKE2b-128 (libsodium crypto_generichash, 32-byte
 *            deployment secret) over every byte before it
 */
#ifndef KVX_HANDLE_H
#define KVX_HANDLE_H

#include "pd_status.h"

#include <stddef.h>
#include <stdint.h>

#define KVX_HANDLE_MAGIC      0x4858564bu
#define KVX_HANDLE_VERSION    1
#define KVX_HANDLE_HDR_BYTES  76
#define KVX_TAG_BYTES         16
#define KVX_KEY_BYTES         32
#define KVX_HANDLE_MAX_BYTES  256
#define KVX_HANDLE_MAX_RUNS   64
#define KVX_HANDLE_MAX_BLOCKS 65536u
#define KVX_HANDLE_F_STREAM   0x01u

/* Why a handle was rejected: X(name, help). One counter per reason. */
#define KVX_REJECT_LIST(X)                                                    \
    X(TRUNCATED,       "shorter than its header says")                        \
    X(EXTENDED,        "longer than its header says")                         \
    X(BAD_MAGIC,       "bad magic")                                           \
    X(BAD_VERSION,     "unsupported version")                                 \
    X(RESERVED,        "reserved field set")                                  \
    X(BAD_MAC,         "authentication tag mismatch")                         \
    X(TOO_MANY,        "run or block count above cap")                        \
    X(OVERFLOW,        "block index or byte range overflows")                 \
    X(BAD_RUNS,        "run encoding inconsistent")                           \
    X(WRONG_IMPORTER,  "handle meant for another importer")                   \
    X(UNKNOWN_PEER,    "exporter not known (no peer metadata)")               \
    X(OLD_INCARNATION, "exporter restarted since the handle was made")        \
    X(PEER_DOWN,       "exporter marked dead")                                \
    X(UNKNOWN_REGION,  "region not advertised by the exporter")               \
    X(GEOMETRY,        "block size or compatibility hash differs")            \
    X(OUT_OF_REGION,   "block outside the advertised region")                 \
    X(BAD_LEASE,       "lease slot outside the exporter's table")             \
    X(EXPIRED,         "lease expired")                                       \
    X(REPLAYED,        "lease already released by this importer")             \
    X(COUNT_MISMATCH,  "local block count differs from handle")               \
    X(STALE,           "generation changed: blocks were reused")

typedef enum {
    KVX_REJECT_NONE = 0,
#define KVX_REJECT_ENUM(name, help) KVX_REJECT_##name,
    KVX_REJECT_LIST(KVX_REJECT_ENUM)
#undef KVX_REJECT_ENUM
    KVX_REJECT__COUNT
} kvx_reject_t;

/* "BAD_MAC" etc.; "NONE" for 0. Never NULL. */
const char *kvx_reject_name(kvx_reject_t reason);

typedef struct {
    uint32_t start;     /* first block index in the exporter region */
    uint32_t count;     /* >= 1 */
} kvx_run_t;

/* A decoded handle. Plain value, caller-owned. */
typedef struct {
    uint64_t exporter_id;
    uint64_t incarnation;
    uint64_t importer_id;
    uint64_t lease_gen;
    uint64_t expiry_wall_ns;
    uint64_t compat_hash;
    uint32_t region_id;
    uint32_t lease_slot;
    uint32_t block_bytes;
    uint32_t n_blocks;
    uint16_t n_runs;
    uint8_t version;
    uint8_t flags;                         /* KVX_HANDLE_F_* */
    kvx_run_t runs[KVX_HANDLE_MAX_RUNS];   /* (n_runs) */
    uint8_t tag[KVX_TAG_BYTES];
} kvx_handle_t;

/* What the importer knows about one exporter region (from peer metadata). */
typedef struct {
    uint64_t exporter_id;
    uint64_t incarnation;
    uint64_t importer_id;       /* our own node id */
    uint32_t region_id;
    uint32_t region_blocks;     /* blocks in the advertised region */
    uint32_t block_bytes;
    uint64_t compat_hash;
    uint32_t n_lease_slots;
    const uint64_t *released_gen; /* (n_lease_slots) or NULL */
    uint64_t now_wall_ns;
} kvx_handle_expect_t;

/* Encode h (runs, ids; n_blocks is recomputed) and sign it with key.
 * Writes at most cap bytes. Expected: PD_ERR_TOO_BIG (more than
 * KVX_HANDLE_MAX_RUNS runs, or the encoding exceeds cap or 256 bytes: the
 * caller splits the set into several handles). PD_ERR_BAD_INPUT for an
 * empty run. No syscalls. */
pd_status_t kvx_handle_encode(const kvx_handle_t *h,
                              const uint8_t key[KVX_KEY_BYTES],
                              uint8_t *buf, size_t cap, size_t *len_p);

/* How many of runs[0..n) fit one handle (<= KVX_HANDLE_MAX_RUNS runs,
 * <= KVX_HANDLE_MAX_BYTES bytes). Pure arithmetic, no syscalls. */
unsigned kvx_handle_runs_fitting(const kvx_run_t *runs, unsigned n);

/* Parse and authenticate buf into *h: structure, MAC, run decoding with
 * overflow and cap checks. On error *reason_p (may be NULL) says why and
 * the status is PD_ERR_TRUNCATED, PD_ERR_BAD_MAGIC, PD_ERR_BAD_VERSION,
 * PD_ERR_RESERVED, PD_ERR_AUTH, PD_ERR_TOO_BIG or PD_ERR_BAD_HANDLE. */
pd_status_t kvx_handle_decode(const uint8_t *buf, size_t len,
                              const uint8_t key[KVX_KEY_BYTES],
                              kvx_handle_t *h, kvx_reject_t *reason_p);

/* Semantic checks of a decoded handle against what the importer knows:
 * importer id, incarnation, region, geometry, every block inside the
 * region (64-bit arithmetic), lease slot, expiry, replay. Expected errors:
 * PD_ERR_BAD_HANDLE, PD_ERR_EXPIRED, PD_ERR_STALE, PD_ERR_MISMATCH,
 * PD_ERR_PERMISSION (other importer); *reason_p set on error. */
pd_status_t kvx_handle_check(const kvx_handle_t *h,
                             const kvx_handle_expect_t *expect,
                             kvx_reject_t *reason_p);

/* Little-endian helpers shared by the kvxfer codecs. */
static inline void kvx_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void kvx_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kvx_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t kvx_get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t kvx_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
static inline uint64_t kvx_get_u64(const uint8_t *p)
{
    return (uint64_t)kvx_get_u32(p) | ((uint64_t)kvx_get_u32(p + 4) << 32);
}

#endif
