/* kvx.h - kvxfer: KV block transfer between daemons over UCX (pull model).
 *
 * Roles: an EXPORTER (prefill) registers its KV arena once, leases sets of
 * blocks to one importer and hands out small authenticated handles; an
 * IMPORTER (decode) learns the exporter's metadata once per (peer, region),
 * validates each handle completely and pulls the blocks with one-sided gets
 * into blocks of its own registered region. One process may be both.
 *
 * Threading: every kvx_* call and every callback happens on the thread that
 * runs the event_base given to kvx_ctx_create (the daemon's loop). Nothing
 * here is thread-safe; nothing here blocks; UCX is progressed only from the
 * loop through the worker's event fd (no busy polling, no extra thread).
 *
 * Only kvxfer/ includes <ucp/api/ucp.h>; this header does not. */
#ifndef KVX_H
#define KVX_H

#include "kvx_handle.h"
#include "pd_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct cJSON;
struct pd_stats;

typedef struct kvx_ctx kvx_ctx_h;
typedef struct kvx_region kvx_region_h;

/* How an arena is allocated (see kvxfer/DESIGN.md, "Arena allocation"). */
typedef enum {
    KVX_ALLOC_UCX = 0,   /* ucp_mem_map(ALLOCATE): shm segment, same-host gets
                            served in place by sysv/posix (default) */
    KVX_ALLOC_OWN = 1,   /* own mmap + ucp_mem_map: cma on the same host */
} kvx_alloc_t;

/* Endpoint error-handling mode per peer. */
typedef enum {
    KVX_ERRMODE_AUTO = 0, /* PEER for another host, NONE on the same host
                             (UCX 1.13 drops all shm/cma lanes in PEER mode) */
    KVX_ERRMODE_PEER = 1, /* always PEER (tcp only on the same host) */
    KVX_ERRMODE_NONE = 2, /* never; liveness only from kvx_peer_fail + deadlines */
} kvx_errmode_t;

/* How an importer reads an exporter's memory (DESIGN.md "Reads without an
 * RMA lane"). */
typedef enum {
    KVX_READ_AUTO = 0, /* ucp_get_nbx where the endpoint has an RMA lane
                          (shm, cma, RDMA); kvx AM reads where UCX would
                          emulate the get in software (tcp) */
    KVX_READ_RMA = 1,  /* always ucp_get_nbx */
    KVX_READ_AM = 2,   /* always kvx AM reads */
} kvx_readmode_t;

/* Why a lease ended (exporter side). */
typedef enum {
    KVX_LEASE_RELEASED = 0, /* importer sent "released" */
    KVX_LEASE_EXPIRED  = 1, /* TTL ran out */
    KVX_LEASE_REVOKED  = 2, /* kvx_lease_revoke / context destroy */
} kvx_lease_end_t;

typedef struct {
    uint32_t slot;          /* lease id */
    uint64_t gen;           /* generation it had (now bumped) */
    uint64_t importer_id;
    uint32_t region_id;
    uint32_t n_blocks;
    uint64_t user_tag;      /* as given to kvx_export */
} kvx_lease_info_t;

/* Exporter: a lease ended; the generation word is already bumped and the
 * blocks unpinned, so the daemon may reuse them now. Called on the loop,
 * never from inside UCX progress. */
typedef void (*kvx_lease_end_cb_t)(void *arg, const kvx_lease_info_t *info,
                                   kvx_lease_end_t why);

/* The side a context works on, for its Prometheus set: an exporter-only
 * context (prefill) has no pulls, an importer-only one (decode) no leases,
 * so their always-zero counters are left out. */
typedef enum {
    KVX_STATS_BOTH = 0,
    KVX_STATS_EXPORTER,
    KVX_STATS_IMPORTER,
} kvx_stats_role_t;

typedef struct {
    uint64_t node_id;                  /* this daemon's id, nonzero */
    uint8_t secret[KVX_KEY_BYTES];     /* deployment secret (handles, meta) */
    uint32_t max_leases;               /* exporter lease slots (4096) */
    uint32_t max_pulls;                /* concurrent pulls (256) */
    uint32_t max_ops_in_flight;        /* gets posted and not done (64) */
    uint64_t max_op_bytes;             /* larger runs are split (8 MiB) */
    uint32_t max_peers;                /* importer peers (64) */
    uint64_t max_lease_ttl_ns;         /* cap for export/renew (600 s) */
    uint64_t close_grace_ns;           /* wait for canceled gets after a
                                          forced close (200 ms) */
    kvx_errmode_t err_mode;
    kvx_readmode_t read_mode;          /* importer (KVX_READ_AUTO) */
    bool warm_peer_mappings;           /* fault in a same-host exporter's
                                          mapped arena after kvx_peer_add,
                                          KVX_WARM_SLICE bytes per loop
                                          turn (true) */
    kvx_lease_end_cb_t on_lease_end;   /* may be NULL */
    void *cb_arg;
    kvx_stats_role_t stats_role;       /* which side's figures kvx_stats_set
                                          exports (KVX_STATS_BOTH) */
    uint32_t ready_layers;             /* exporter: readiness words per lease
                                          (>= the region's layers for
                                          kvx_export_stream; 0 = none) */
    uint64_t ready_poll_ns;            /* importer: re-read the readiness words
                                          of a streamed pull this long after a
                                          read that found nothing new (100 us) */
    /* The network devices UCX may use (its NET_DEVICES list: interface
     * names such as "lo" or "eth0,eth1"), NULL = all of them (UCX's
     * default). UCX 1.13's tcp transport opens one listening socket per
     * device it uses, bound to that interface's address, and accepts
     * connections there from anyone: limiting the devices is what keeps
     * the KV plane off other interfaces. Shared-memory transports are not
     * network devices and stay available. Overrides UCX_NET_DEVICES. */
    const char *net_devices;
} kvx_config_t;

/* Defaults for every field except node_id and secret (zeroed). */
void kvx_config_default(kvx_config_t *cfg);

/* Put kvx's UCX tuning into the environment where the operator has not set
 * it (today UCX_TCP_TX_SEG_SIZE=64K: kvx.c says why, docs/BENCHMARKS.md
 * "Figures behind kvx.c's choices" what it gains). setenv: call it before the process starts threads;
 * kvx_ctx_create calls it too (a no-op the second time). */
void kvx_ucx_env_defaults(void);

/* Create the UCP context (RMA | AM | WAKEUP) and worker, hook the worker's
 * event fd into base (EV_READ|EV_PERSIST: progress, then arm, retry on
 * BUSY) and allocate every pool (leases, pulls, peers) now.
 * Expected: PD_ERR_BAD_INPUT (node_id 0, net_devices refused by UCX),
 * PD_ERR_TRANSPORT (UCX init),
 * PD_ERR_NO_MEMORY. */
pd_status_t kvx_ctx_create(const kvx_config_t *cfg, struct event_base *base,
                           kvx_ctx_h **ctx_p);
/* Revoke every lease, fail every pull (PD_ERR_SHUTDOWN; callbacks run
 * before this returns), close endpoints, release rkeys, regions, worker and
 * context. NULL-safe. Regions must have been deregistered or are
 * deregistered here. */
void kvx_ctx_destroy(kvx_ctx_h *ctx);

uint64_t kvx_ctx_node_id(const kvx_ctx_h *ctx);
uint64_t kvx_ctx_incarnation(const kvx_ctx_h *ctx);

/* ---- regions ------------------------------------------------------------ */

/* Memory this process can still get: MemAvailable, capped by the room of
 * its cgroup (v1 or v2, the tightest level; pd_mem_available in
 * common/pd_memledger.h). UINT64_MAX if neither can be read. The host-wide
 * budget over several daemons is the ledger's (node boot reserves there
 * first); this check is the process's own. */
uint64_t kvx_mem_available(void);
/* Would an arena of len bytes fit (at most 90% of kvx_mem_available)?
 * PD_OK, or PD_ERR_NO_MEMORY with a sentence in why. kvx_region_register
 * runs it first (and logs why), so a huge --kv-blocks is a clear error at
 * boot instead of an OOM kill (which would leave a /dev/shm segment). */
pd_status_t kvx_arena_check(uint64_t len, char *why, size_t why_len);

/* Allocate and register an arena of n_blocks * block_bytes, once, at start:
 * prot LOCAL_READ|LOCAL_WRITE|REMOTE_READ (never REMOTE_WRITE); the rkey is
 * packed here. region_id is the daemon's name for it (unique per ctx);
 * compat_hash is the model/geometry hash handles must carry.
 * Expected: PD_ERR_EXISTS, PD_ERR_TOO_BIG (block_bytes >= 4 GiB or
 * n_blocks > 2^31), PD_ERR_NO_MEMORY, PD_ERR_TRANSPORT. */
pd_status_t kvx_region_register(kvx_ctx_h *ctx, uint32_t region_id,
                                uint64_t block_bytes, uint32_t n_blocks,
                                uint64_t compat_hash, kvx_alloc_t alloc,
                                kvx_region_h **region_p);
/* The same, for a layer-major arena (engine/eng.h): block b of layer l at
 * base + (l * n_blocks + b) * (block_bytes / n_layers), so one layer of a
 * set of contiguous blocks is one contiguous range. n_layers = 1 is the
 * block-major layout of kvx_region_register. Importer and exporter regions
 * must have the same n_layers (metadata carries it). Expected: as above,
 * PD_ERR_BAD_INPUT (n_layers 0, above 1024, or not dividing block_bytes). */
pd_status_t kvx_region_register_layers(kvx_ctx_h *ctx, uint32_t region_id,
                                       uint64_t block_bytes, uint32_t n_blocks,
                                       uint32_t n_layers, uint64_t compat_hash,
                                       kvx_alloc_t alloc, kvx_region_h **region_p);
/* Revokes the region's leases first. NULL-safe. */
void kvx_region_deregister(kvx_region_h *region);

void *kvx_region_base(const kvx_region_h *region);   /* (n_blocks, block_bytes) */
uint64_t kvx_region_block_bytes(const kvx_region_h *region);
uint32_t kvx_region_n_blocks(const kvx_region_h *region);
uint32_t kvx_region_n_layers(const kvx_region_h *region);
/* Leases currently holding the block (0 = free to reuse). */
unsigned kvx_region_block_pins(const kvx_region_h *region, uint32_t block);
/* The daemon frees blocks (returns them to its allocator): checks none is
 * pinned and, in debug builds (PD_DEBUG_POISON), fills them with 0xdb so a
 * reader of stale blocks sees poison. Expected: PD_ERR_BUSY (a block is
 * still leased: caller bug), PD_ERR_BAD_INPUT (out of range). */
pd_status_t kvx_region_blocks_free(kvx_region_h *region,
                                   const uint32_t *blocks, uint32_t n);

/* ---- peer metadata (once per peer) -------------------------------------- */

#define KVX_META_MAX_BYTES 8192

/* Pack this node's metadata (node id, incarnation, host id, worker address,
 * every region's address/geometry/rkey, the lease generation table) signed
 * with the secret. The daemon ships it over its control plane.
 * Expected: PD_ERR_NO_SPACE (cap too small). */
pd_status_t kvx_meta_pack(kvx_ctx_h *ctx, void *buf, size_t cap,
                          size_t *len_p);

/* Importer: validate metadata (MAC, caps), create the endpoint and unpack
 * every rkey once. A known node with the same incarnation: PD_ERR_EXISTS
 * (nothing changes); with a new incarnation the old peer is failed
 * (PD_ERR_PEER_GONE to its pulls) and replaced. A peer that failed can only
 * come back with a new incarnation, PD_ERR_STALE otherwise, unless
 * kvx_peer_revive dropped its tombstone first.
 * Expected: PD_ERR_AUTH, PD_ERR_BAD_INPUT, PD_ERR_TRUNCATED, PD_ERR_STALE,
 * PD_ERR_EXISTS, PD_ERR_NO_SPACE (peer table full), PD_ERR_TRANSPORT. */
pd_status_t kvx_peer_add(kvx_ctx_h *ctx, const void *meta, size_t len);

/* Whether the endpoint to exporter node_id is connected on both sides
 * (UCX's wireup exchange came back). Pulls do not wait for it; a caller
 * that can wait before its first pull shortens the window in which its
 * death can abort a UCX 1.13 exporter over tcp (DESIGN.md). */
bool kvx_peer_wired(kvx_ctx_h *ctx, uint64_t node_id);

/* The control plane says the peer is dead (heartbeats lost, connection
 * closed): all its pulls end with `why` (normally PD_ERR_PEER_GONE) as soon
 * as their gets are canceled, its endpoint is force-closed, its rkeys
 * released. PD_ERR_NOT_FOUND if unknown. */
pd_status_t kvx_peer_fail(kvx_ctx_h *ctx, uint64_t node_id, pd_status_t why);

/* The control plane vouches that a failed exporter incarnation is alive
 * (it registered again, authenticated, with the same incarnation: it was
 * unreachable, not dead): drop its tombstone so kvx_peer_add accepts its
 * metadata again. Handles it issued before still fail their lease checks
 * (the exporter revoked them when it lost the control plane).
 * PD_OK if a tombstone was dropped, PD_ERR_NOT_FOUND otherwise. */
pd_status_t kvx_peer_revive(kvx_ctx_h *ctx, uint64_t node_id, uint64_t incarnation);

/* Forget a peer after its pulls ended (same as fail with PD_ERR_SHUTDOWN,
 * but the node may come back with the same incarnation). */
pd_status_t kvx_peer_remove(kvx_ctx_h *ctx, uint64_t node_id);

/* ---- exporter: leases and handles --------------------------------------- */

typedef struct {
    uint32_t slot;
    uint64_t gen;
} kvx_lease_id_t;

/* Lease blocks[0..n) of region to importer_id for ttl_ns and encode the
 * handle into buf (<= KVX_HANDLE_MAX_BYTES). Blocks are pinned until the
 * importer releases, the lease expires or is revoked; then on_lease_end.
 * Block order is kept: the importer's i-th local block receives blocks[i].
 * No syscalls, no UCX calls. Expected: PD_ERR_NO_SPACE (no lease slot),
 * PD_ERR_TOO_BIG (more than 64 runs or 65536 blocks: split the set),
 * PD_ERR_BAD_INPUT (block out of range, n == 0, ttl 0). */
pd_status_t kvx_export(kvx_region_h *region, uint64_t importer_id,
                       const uint32_t *blocks, uint32_t n, uint64_t ttl_ns,
                       uint64_t user_tag, void *buf, size_t cap,
                       size_t *len_p, kvx_lease_id_t *lease_p);

/* Like kvx_export, for sets that may not fit one handle: leases and
 * encodes the longest prefix of blocks[0..n) that fits (at least one block;
 * at most 64 runs, 256 bytes, 65536 blocks) and sets *taken_p. The caller
 * exports blocks + taken next, with the same importer, until all are
 * covered; the importer pulls each handle into the matching slice of its
 * local blocks. Expected errors as kvx_export. */
pd_status_t kvx_export_part(kvx_region_h *region, uint64_t importer_id,
                            const uint32_t *blocks, uint32_t n, uint64_t ttl_ns,
                            uint64_t user_tag, void *buf, size_t cap,
                            size_t *len_p, kvx_lease_id_t *lease_p,
                            uint32_t *taken_p);

/* ---- exporter: layer streaming ------------------------------------------ */

/* A streamed lease's readiness words, in the registered generation table:
 * words[l] = (low 32 bits of the lease generation) << 32 | the number of the
 * lease's leading blocks whose layer l is complete. A plain export writes
 * every layer complete; a word of another generation reads as "nothing
 * ready", so a recycled slot never looks ready. */
typedef struct {
    uint64_t *words;      /* (n_layers) */
    uint32_t n_layers;
    uint32_t gen32;
} kvx_ready_t;

/* Publish that the first `blocks` blocks of the lease hold layer `layer`
 * completely (values only grow). Thread-safe: one release store, so the
 * compute thread may call it after writing the KV, without the loop. The
 * caller must stop publishing once the lease may have ended (it ends only
 * on the loop: publish only while the job that owns the blocks runs). */
static inline void kvx_ready_publish(const kvx_ready_t *rd, uint32_t layer, uint32_t blocks)
{
    if (rd->words != NULL && layer < rd->n_layers)
        __atomic_store_n(&rd->words[layer], ((uint64_t)rd->gen32 << 32) | blocks,
                         __ATOMIC_RELEASE);
}

/* Like kvx_export, before the KV is complete: the handle carries
 * KVX_HANDLE_F_STREAM, every layer starts at blocks_ready blocks (a cached
 * prefix: 0 if none) and *ready_p is what the writer publishes progress
 * with. The importer's pull polls the readiness words and gets each layer's
 * blocks as they become ready. Needs cfg.ready_layers >= the region's
 * layers. Expected errors as kvx_export. */
pd_status_t kvx_export_stream(kvx_region_h *region, uint64_t importer_id,
                              const uint32_t *blocks, uint32_t n, uint64_t ttl_ns,
                              uint64_t user_tag, uint32_t blocks_ready, void *buf,
                              size_t cap, size_t *len_p, kvx_lease_id_t *lease_p,
                              kvx_ready_t *ready_p);

/* End a lease now (exporter decides: abort, shutdown). PD_ERR_NOT_FOUND if
 * it already ended. on_lease_end runs with KVX_LEASE_REVOKED. */
pd_status_t kvx_lease_revoke(kvx_ctx_h *ctx, kvx_lease_id_t lease);
/* Exporter: the lease now ends ttl_ns from now (capped at max_lease_ttl_ns),
 * sooner or later than it would have; the importer's renewals go on as
 * before. For a streamed lease exported before the prompt pass with the
 * maximum TTL: at PREFILL_DONE it gets its real lease-ttl. The handle's
 * signed expiry is not changed (it may outlive the lease: the generation
 * check still refuses every pull of an ended lease). PD_ERR_NOT_FOUND if it
 * already ended. */
pd_status_t kvx_lease_set_ttl(kvx_ctx_h *ctx, kvx_lease_id_t lease, uint64_t ttl_ns);

/* ---- importer: import, pull, release ------------------------------------ */

/* A validated handle, bound to a known peer. Plain value. */
typedef struct {
    kvx_handle_t h;
    uint32_t peer_idx;     /* internal */
    uint64_t imported_ns;
} kvx_import_t;

/* Decode + validate completely (version, MAC, importer id, peer and
 * incarnation, region, geometry, every block inside the region, lease slot,
 * expiry, replay of a released lease, caps) WITHOUT any UCX call. Each
 * rejection is counted by reason. expect_compat_hash: 0 = don't care.
 * Expected: PD_ERR_TRUNCATED, PD_ERR_TOO_BIG, PD_ERR_BAD_MAGIC,
 * PD_ERR_BAD_VERSION, PD_ERR_RESERVED, PD_ERR_AUTH, PD_ERR_PERMISSION,
 * PD_ERR_BAD_HANDLE, PD_ERR_STALE, PD_ERR_EXPIRED, PD_ERR_MISMATCH,
 * PD_ERR_PEER_GONE (peer failed), PD_ERR_NOT_FOUND (no metadata for the
 * exporter yet). *reason_p (may be NULL) is set on error. */
pd_status_t kvx_handle_import(kvx_ctx_h *ctx, const void *buf, size_t len,
                              uint64_t expect_compat_hash, kvx_import_t *imp_p,
                              kvx_reject_t *reason_p);

typedef struct {
    uint64_t pull_id;
    uint64_t bytes;        /* bytes landed */
    uint32_t runs;         /* merged runs */
    uint32_t ops;          /* gets posted (runs after splitting) */
    uint64_t latency_ns;   /* start -> completion */
    uint64_t user_tag;
    uint32_t polls;        /* streamed: readiness reads */
    uint32_t polls_partial;/* streamed: reads that found a layer not ready */
    uint64_t ready_ns;     /* start -> every layer of every block seen ready
                            * (0 for a plain pull: ready at start) */
    uint64_t posted_ns;    /* start -> the last data get posted */
} kvx_pull_result_t;

/* Completion of a pull, on the loop. status: PD_OK (every byte landed and
 * the lease generation was still valid afterwards), PD_ERR_TIMED_OUT,
 * PD_ERR_CANCELED, PD_ERR_PEER_GONE, PD_ERR_STALE (generation changed: the
 * local blocks hold garbage), PD_ERR_TRANSPORT, PD_ERR_SHUTDOWN. When it
 * runs, no get of this pull can still write into the local blocks (unless
 * UCX never returned a get after a forced close: counted as
 * ops_abandoned). */
typedef void (*kvx_pull_cb_t)(void *arg, pd_status_t status,
                              const kvx_pull_result_t *res);

/* A local block id that means "do not fetch this block of the handle" (the
 * importer already holds the same KV, e.g. from its prefix cache): an
 * incremental pull. The generation check still runs, even if every block
 * is skipped. */
#define KVX_PULL_SKIP UINT32_MAX

/* A streamed handle (KVX_HANDLE_F_STREAM): the pull first reads the
 * lease's generation and readiness words (one round trip), gets what is
 * ready layer by layer, and reads them again (at once after progress, else
 * after ready_poll_ns) until every layer of every block is posted; a
 * generation change ends it with PD_ERR_STALE at once. The deadline bounds
 * the whole, polls included.
 *
 * Pull imp's blocks into local region blocks local[0..n) (n must equal the
 * handle's block count; local blocks must not be in use; KVX_PULL_SKIP
 * entries are not fetched). deadline_at_ns is
 * absolute pd_now_ns() time. Adjacent blocks (remote AND local contiguous)
 * merge into runs; runs above max_op_bytes are split; at most
 * max_ops_in_flight gets are posted at once. Returns PD_INPROGRESS and
 * later calls cb exactly once; any other return means no callback.
 * Expected: PD_ERR_PEER_GONE, PD_ERR_NOT_FOUND (peer removed),
 * PD_ERR_BUSY (max_pulls in flight), PD_ERR_BAD_INPUT (count mismatch,
 * local block out of range, geometry), PD_ERR_TIMED_OUT (deadline past). */
pd_status_t kvx_pull_start(kvx_ctx_h *ctx, const kvx_import_t *imp,
                           kvx_region_h *local, const uint32_t *local_blocks,
                           uint32_t n, uint64_t deadline_at_ns, uint64_t user_tag,
                           kvx_pull_cb_t cb, void *cb_arg,
                           uint64_t *pull_id_p);

/* Cancel a pull: no new gets; the callback runs with PD_ERR_CANCELED once
 * the posted ones finished (bounded by the pull's deadline, then the peer's
 * endpoint is force-closed). PD_ERR_NOT_FOUND if it already completed. */
pd_status_t kvx_pull_cancel(kvx_ctx_h *ctx, uint64_t pull_id);

/* Notify the exporter: the importer is done with the lease (release) or
 * needs it longer (renew, ttl capped by the exporter). The handle is
 * remembered as released: importing it again is rejected (REPLAYED).
 * Fire-and-forget AM; Expected: PD_ERR_PEER_GONE, PD_ERR_NOT_FOUND,
 * PD_ERR_TRANSPORT. */
pd_status_t kvx_lease_release(kvx_ctx_h *ctx, const kvx_import_t *imp);
pd_status_t kvx_lease_renew(kvx_ctx_h *ctx, const kvx_import_t *imp,
                            uint64_t ttl_ns);

/* ---- statistics --------------------------------------------------------- */

/* Counters per peer and total, declared once here (kvx.c keeps a set per
 * peer plus the total; kvx_stats_json / kvx_stats_set show them). */
#define KVX_PULL_STATS(X)                                                     \
    X(pulls_started,    "pulls started")                                      \
    X(pulls_ok,         "pulls completed OK")                                 \
    X(pulls_timed_out,  "pulls failed: deadline")                             \
    X(pulls_canceled,   "pulls failed: canceled")                             \
    X(pulls_peer_gone,  "pulls failed: peer gone")                            \
    X(pulls_stale,      "pulls failed: generation changed after the data")    \
    X(pulls_transport,  "pulls failed: transport error")                      \
    X(pulls_shutdown,   "pulls failed: shutdown")                             \
    X(bytes_pulled,     "bytes landed by successful pulls")                   \
    X(runs_posted,      "merged runs")                                        \
    X(ops_posted,       "gets posted (after splitting)")                      \
    X(ops_abandoned,    "gets UCX never completed after a forced close")      \
    X(notifies_sent,    "release/renew messages sent")                        \
    X(pulls_streamed,   "pulls of streamed leases (layer by layer)")          \
    X(ready_polls,      "readiness reads of streamed pulls")                  \
    X(ready_polls_partial, "readiness reads that found a layer not ready")  \
    X(am_reads,         "reads sent as kvx AM requests (peer without RMA lane)")

/* Exporter and context totals. */
#define KVX_CTX_STATS(X)                                                      \
    X(leases_exported,  "leases created (handles exported)")                  \
    X(leases_released,  "leases ended by the importer's release")             \
    X(leases_expired,   "leases ended by TTL")                                \
    X(leases_renewed,   "lease renewals")                                     \
    X(leases_revoked,   "leases revoked by the exporter")                     \
    X(notifies_rejected,"release/renew messages that matched no live lease")  \
    X(peers_added,      "peer metadata accepted")                             \
    X(peer_bytes_warmed,"same-host peers' mapped arena bytes faulted in ahead of pulls (a slice per loop turn)") \
    X(peers_failed,     "peers failed (dead or replaced)")                    \
    X(eps_forced_closed,"endpoints force-closed")                            \
    X(progress_rescues, "in-flight watchdog ticks that found UCX work")      \
    X(arm_busy,         "worker arms given up as BUSY (pending sends)")     \
    X(progress_yields,  "progress drains cut at the time slice (loop served first)") \
    X(am_reads_served,  "AM reads answered with data")                        \
    X(am_reads_refused, "AM reads refused: no live lease of the reader covers them") \
    X(am_replies_failed,"AM read replies UCX could not deliver (reader gone)")

typedef struct {
    uint32_t leases_active;
    uint64_t blocks_pinned;
    uint32_t pulls_in_flight;
    uint32_t ops_in_flight;
    uint32_t peers_live;     /* peers with an endpoint (any state) */
    uint32_t rkeys_live;     /* unpacked rkeys */
    uint32_t eps_live;       /* endpoints not yet fully closed */
} kvx_gauges_t;

void kvx_gauges(const kvx_ctx_h *ctx, kvx_gauges_t *g);

/* Handles rejected for `reason` (importer side). */
uint64_t kvx_rejects(const kvx_ctx_h *ctx, kvx_reject_t reason);
/* Named counter of the totals (either list above); UINT64_MAX if unknown. */
uint64_t kvx_counter(const kvx_ctx_h *ctx, const char *name);

/* The `xfer` admin command: {"node_id","incarnation","gauges":{..},
 * "total":{counters.., "latency":{"count","p50_ns","p99_ns"},
 * "recent_bw_bytes_per_s"}, "rejected":{reason:n}, "peers":[{..}]}.
 * Caller frees with cJSON_Delete. NULL on ENOMEM. */
struct cJSON *kvx_stats_json(const kvx_ctx_h *ctx);

/* The same totals as a pd_stats set (table "kvx", label node=<id>):
 * every counter above, rejected_<reason> counters, the gauges and a
 * pull_latency histogram; kept up to date by the loop. Register it with
 * pd_admin_add_stats for `stats` and /metrics (pd_kvx_*); it lives until
 * kvx_ctx_destroy (remove it from the admin server first). NULL if it could
 * not be allocated. */
struct pd_stats *kvx_stats_set(kvx_ctx_h *ctx);
/* For a /metrics scrape: that set (first), then one set per live importer
 * peer (table "kvx_peer", labels node, peer = the exporter's node id:
 * pulls {result}, bytes pulled, pull latency), at most cap of them, all
 * published. A peer's set ends (is freed) with its slot: call this per
 * scrape, on the loop, and do not keep the pointers. */
size_t kvx_stats_sets(kvx_ctx_h *ctx, struct pd_stats **sets, size_t cap);

#endif
