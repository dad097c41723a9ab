/* kvx_int.h - kvxfer's private header: the objects (region, lease, peer,
 * pull, context) and the functions the kvx_*.c files call across each other.
 * Not installed; only kvxfer/ includes it. */
#ifndef PD_KVX_INT_H
#define PD_KVX_INT_H

#include "kvx.h"
#include "pd_stats.h"

#include <event2/event.h>
#include <ucp/api/ucp.h>

#include <stdbool.h>
#include <stdint.h>

#define KVX_COMP              "kvx"
#define KVX_MAX_REGIONS       4
#define KVX_WARM_SLICE        (4ull << 20) /* peer mapping bytes faulted in per loop turn */
#define KVX_AM_NOTIFY         17
#define KVX_AM_READ_REQ       18  /* AM reads: where UCX has no RMA lane */
#define KVX_AM_READ_REP       19
#define KVX_READ_REQ_MAGIC    0x5258564bu /* "KVXR" */
#define KVX_READ_REP_MAGIC    0x4158564bu /* "KVXA" */
#define KVX_READ_REQ_BYTES    80
#define KVX_READ_REP_BYTES    16
#define KVX_READ_REP_SLOTS    1024 /* exporter: replies in flight */
#define KVX_META_MAGIC        0x4d58564bu /* "KVXM" */
#define KVX_META_VERSION      2
#define KVX_META_HDR          56
#define KVX_META_REGION_HDR   36
#define KVX_META_MAX_ADDR     4096
#define KVX_META_MAX_RKEY     1024
#define KVX_META_MAX_SLOTS    65536u
#define KVX_NOTIFY_MAGIC      0x4e58564bu /* "KVXN" */
#define KVX_NOTIFY_BYTES      64
#define KVX_NOTIFY_RELEASE    1
#define KVX_NOTIFY_RENEW      2
#define KVX_NOTIFY_SLOTS      256
#define KVX_PULL_INLINE       256
#define KVX_TOMBSTONES        32
#define KVX_HIST_BUCKETS      256 /* 4 per power of two of ns */
#define KVX_POISON_BYTE       0xdb
#define KVX_MAX_LAYERS        1024 /* per region / readiness words per lease */

enum {
#define KVX_PS_ENUM(name, help) KVX_PS_##name,
    KVX_PULL_STATS(KVX_PS_ENUM)
#undef KVX_PS_ENUM
    KVX_PS__COUNT
};
enum {
#define KVX_CS_ENUM(name, help) KVX_CS_##name,
    KVX_CTX_STATS(KVX_CS_ENUM)
#undef KVX_CS_ENUM
    KVX_CS__COUNT
};

/* The same lists, published as one pd_stats set (Prometheus pd_kvx_*):
 * counters of both lists, one counter per rejection reason
 * (rejected_<reason>), the gauges of kvx_gauges_t, the latency histogram. */
#define KVX_GAUGE_LIST(X)                                                     \
    X(leases_active,   "leases held by importers")                            \
    X(blocks_pinned,   "exporter blocks pinned by leases")                    \
    X(pulls_in_flight, "pulls started and not completed")                     \
    X(ops_in_flight,   "gets posted and not completed")                       \
    X(peers_live,      "importer peers with state")                           \
    X(rkeys_live,      "unpacked rkeys")                                      \
    X(eps_live,        "endpoints not yet closed")

enum {
    KVX_PROM_PS0 = 0,
    KVX_PROM_CS0 = KVX_PROM_PS0 + KVX_PS__COUNT,
    KVX_PROM_REJ0 = KVX_PROM_CS0 + KVX_CS__COUNT,
    KVX_PROM_G0 = KVX_PROM_REJ0 + (KVX_REJECT__COUNT - 1),
#define KVX_G_ENUM(name, help) KVX_PROM_G_##name,
    KVX_PROM_G__BASE = KVX_PROM_G0 - 1,
    KVX_GAUGE_LIST(KVX_G_ENUM)
#undef KVX_G_ENUM
    KVX_PROM_LATENCY,
    KVX_PROM__COUNT
};

typedef struct {
    uint64_t c[KVX_PS__COUNT];
    uint64_t hist[KVX_HIST_BUCKETS];   /* pull latency, ns */
    uint64_t hist_n;
    uint64_t bw_win_start_ns;
    uint64_t bw_win_bytes;
    uint64_t bw_last;                  /* bytes/s of the last full window */
} kvx_pstats_t;

/* ---- objects ------------------------------------------------------------- */

struct kvx_region {
    kvx_ctx_h *ctx;
    bool in_use;
    uint32_t id;
    uint64_t block_bytes;
    uint32_t n_blocks;
    uint32_t n_layers;          /* 1: block-major; else layer-major */
    uint64_t layer_bytes;       /* block_bytes / n_layers */
    uint64_t compat_hash;
    kvx_alloc_t alloc;
    uint8_t *base;              /* (n_layers, n_blocks, layer_bytes) */
    size_t len;
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
    uint16_t *pins;             /* (n_blocks) leases holding each block */
};

typedef enum {
    KVX_LEASE_FREE = 0,
    KVX_LEASE_ACTIVE,
    KVX_LEASE_ENDING,           /* gen bumped, callback pending */
} kvx_lease_state_t;

typedef struct kvx_lease {
    kvx_lease_state_t state;
    kvx_lease_end_t why;
    uint32_t slot;
    uint64_t gen;
    uint64_t importer_id;
    uint64_t expiry_ns;         /* pd_now_ns */
    uint64_t user_tag;
    kvx_region_h *region;
    struct event *timer;
    uint8_t tag[KVX_TAG_BYTES]; /* the handle's tag: proves possession */
    uint16_t n_runs;
    uint32_t n_blocks;
    kvx_run_t runs[KVX_HANDLE_MAX_RUNS];
    struct kvx_lease *next;     /* free list / ending list */
} kvx_lease_t;

typedef struct {
    uint32_t id;
    uint32_t n_blocks;
    uint32_t block_bytes;
    uint32_t n_layers;
    uint64_t base;
    uint64_t compat_hash;
    ucp_rkey_h rkey;
} kvx_rregion_t;

typedef enum {
    KVX_PEER_FREE = 0,
    KVX_PEER_ACTIVE,
    KVX_PEER_FAILED,            /* endpoint force-closed, draining */
} kvx_peer_state_t;

typedef struct kvx_peer {
    kvx_ctx_h *ctx;
    kvx_peer_state_t state;
    uint32_t idx;
    uint64_t node_id;
    uint64_t incarnation;
    uint64_t host_id;
    bool err_mode_peer;
    bool am_read;               /* reads as kvx AM messages (no RMA lane) */
    ucp_ep_h ep;
    void *wire_req;             /* the flush that ends wireup (kvx_peer_wired) */
    bool wired;                 /* wireup done on both sides */
    void *close_req;            /* pending ucp_ep_close_nbx request */
    bool ep_open;               /* counted in eps_live */
    pd_status_t pending_fail;   /* set from the UCX error callback */
    pd_status_t fail_status;
    uint64_t fail_ns;
    struct event *grace_timer;
    bool grace_expired;
    struct event *warm_timer;   /* faults the peer's mapped arena in, a slice a turn */
    uint32_t warm_region;       /* where the next slice starts */
    uint64_t warm_off;
    unsigned n_regions;
    kvx_rregion_t regions[KVX_MAX_REGIONS];
    uint64_t gen_base;
    uint32_t n_slots;
    uint32_t ready_words;       /* readiness words per lease slot (0: none) */
    ucp_rkey_h gen_rkey;
    uint64_t *released_gen;     /* (n_slots) highest gen we released */
    uint32_t pulls_ref;         /* pulls (incl. zombies) using this peer */
    kvx_pstats_t st;
    pd_stats_t *prom;           /* pd_kvx_peer_* {node, peer}; NULL: none */
    uint64_t prom_sent[3];      /* ok, failed, bytes already added to it */
} kvx_peer_t;

typedef enum {
    KVX_PULL_FREE = 0,
    KVX_PULL_POSTING,
    KVX_PULL_DATA_WAIT,
    KVX_PULL_GEN_WAIT,
    KVX_PULL_ZOMBIE,            /* callback delivered, gets never returned */
} kvx_pull_state_t;

typedef struct kvx_pull {
    kvx_ctx_h *ctx;
    kvx_pull_state_t state;
    uint32_t idx;
    uint64_t id;
    kvx_peer_t *peer;
    kvx_rregion_t *rr;
    kvx_region_h *local;
    kvx_handle_t h;
    uint32_t n;
    uint32_t *local_blocks;     /* (n): local_inline or heap */
    uint32_t local_inline[KVX_PULL_INLINE];
    uint32_t *remote_blocks;    /* (n) the handle's blocks, in order */
    uint32_t n_layers;
    uint32_t *posted;           /* (n_layers) blocks posted per layer */
    uint32_t *ready;            /* (n_layers) blocks ready per layer */
    uint64_t *rd_words;         /* (n_layers) last readiness read */
    /* posting cursor: a block split into several gets */
    uint32_t split_layer;
    uint64_t cur_byte_off;
    /* layer streaming: readiness polls */
    bool stream;
    bool poll_posted;           /* a poll's gets are in flight */
    uint32_t poll_inflight;
    uint64_t poll_gen;
    uint32_t polls, polls_partial;
    struct event *poll_timer;
    uint64_t prev_raddr_end;
    uintptr_t prev_laddr_end;
    /* progress */
    uint32_t inflight;
    bool gen_posted, gen_done;
    uint64_t gen_word;
    pd_status_t err;
    uint64_t t_start_ns;
    uint64_t t_ready_ns, t_posted_ns; /* every layer seen ready / last get posted */
    uint64_t bytes;
    uint32_t runs, ops;
    uint64_t user_tag;
    kvx_pull_cb_t cb;
    void *cb_arg;
    struct event *timer;
} kvx_pull_t;

typedef struct {
    bool in_use;
    kvx_ctx_h *ctx;
    uint8_t msg[KVX_NOTIFY_BYTES];
} kvx_notify_buf_t;

/* What a read is for: its completion updates the pull accordingly. */
typedef enum {
    KVX_READ_DATA = 0,          /* KV bytes (and the final generation read) */
    KVX_READ_POLL,              /* a layer-streaming readiness poll */
} kvx_read_kind_t;

/* An AM read's answer, on the wire (the reply's status word). */
typedef enum {
    KVX_READ_OK = 0,
    KVX_READ_REFUSED = 1,       /* names nothing a live lease of the reader covers */
    KVX_READ_STALE = 2,         /* the lease is over (generation moved on) */
} kvx_read_verdict_t;

/* Importer: one AM read in flight (kvxfer/DESIGN.md "Reads without an RMA
 * lane"). Freed when the reply is handled and the request send is done. */
typedef struct kvx_amread {
    uint64_t id;                /* (seq << 16) | idx; 0 when free */
    uint32_t idx;
    kvx_ctx_h *ctx;
    bool waiting;               /* reply not handled yet */
    bool send_busy;             /* the request's send not completed */
    kvx_read_kind_t kind;
    struct kvx_pull *pl;        /* while waiting / receiving */
    kvx_peer_t *peer;
    void *dst;
    size_t len;
    uint8_t req[KVX_READ_REQ_BYTES];
    struct kvx_amread *next_free;
} kvx_amread_t;

/* Exporter: a reply's header, alive until its send completes. */
typedef struct kvx_amreply {
    uint8_t hdr[KVX_READ_REP_BYTES];
    kvx_ctx_h *ctx;
    const uint8_t *src;         /* the bytes (registered memory), len long */
    size_t len;
    struct kvx_amreply *next_free;
} kvx_amreply_t;

struct kvx_ctx {
    kvx_config_t cfg;
    struct event_base *base;
    uint64_t incarnation;
    uint64_t host_id;
    ucp_context_h ucp;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    struct event *ev_efd;
    struct event *ev_kick;
    struct event *ev_watchdog;
    struct event *ev_kick_later; /* zero timer: a kick through epoll + timers */
    bool kick_pending;
    uint32_t kick_chain;        /* kicks run back to back without the loop
                                 * polling (libevent runs an event activated
                                 * in a callback in the same pass) */
    bool armed;                 /* worker armed, no event consumed since */
    uint32_t wd_us;             /* watchdog period: 1 ms, backs off to 100 */
    bool destroying;
    /* exporter */
    kvx_region_h regions[KVX_MAX_REGIONS];
    ucp_mem_h gen_memh;
    uint64_t *gen_words;        /* (max_leases) generations, then (max_leases,
                                   ready_layers) readiness words; registered,
                                   remote-readable */
    void *gen_rkey_buf;
    size_t gen_rkey_len;
    kvx_lease_t *leases;        /* (max_leases) */
    kvx_lease_t *lease_free;
    kvx_lease_t *lease_ending;
    uint32_t leases_active;
    uint64_t blocks_pinned;
    /* importer */
    kvx_peer_t *peers;          /* (max_peers) */
    struct { uint64_t node_id, incarnation; } dead[KVX_TOMBSTONES];
    unsigned dead_next;
    kvx_pull_t *pulls;          /* (max_pulls) */
    uint32_t pulls_in_flight;
    uint32_t ops_in_flight;
    uint32_t notifies_in_flight; /* AM sends UCX returned a request for */
    uint32_t pull_hwm, peer_hwm; /* slots above were never used: the kick
                                  * scans only below (the cost of a full
                                  * scan: docs/BENCHMARKS.md, kvxfer) */
    uint64_t pull_seq;
    kvx_notify_buf_t notify[KVX_NOTIFY_SLOTS];
    uint32_t rkeys_live, eps_live;
    /* AM reads: importer requests, exporter replies */
    kvx_amread_t *amreads;      /* (n_amreads) */
    uint32_t n_amreads;
    kvx_amread_t *amread_free;
    uint64_t amread_seq;
    kvx_amreply_t *amreplies;   /* (KVX_READ_REP_SLOTS) */
    kvx_amreply_t *amreply_free;
    ucp_datatype_t reply_dt;    /* generic: replies are copy sends only */
    uint32_t amreplies_live;
    /* stats */
    kvx_pstats_t total;
    uint64_t cs[KVX_CS__COUNT];
    uint64_t rejects[KVX_REJECT__COUNT];
    pd_stats_t *prom;            /* the same, as a pd_stats set */
    uint64_t prom_sent[KVX_PROM__COUNT]; /* counter values already added */
};


/* ---- across files ---------------------------------------------------------- */

/* kvx.c: the core (context, progress on the loop, the kick, destroy) */
void kvx_kick(kvx_ctx_h *ctx);
unsigned kvx_progress(kvx_ctx_h *ctx);
pd_status_t kvx_ucs_status(ucs_status_t s);

/* kvx_stats.c: counters, histograms, Prometheus sets (no UCX call) */
void kvx_prom_publish(kvx_ctx_h *ctx);
void kvx_prom_ctx_create(kvx_ctx_h *ctx);
void kvx_prom_peer_create(kvx_peer_t *p);
void kvx_prom_pull_latency(kvx_ctx_h *ctx, kvx_peer_t *p, uint64_t ns);
void kvx_pstats_pull_done(kvx_pstats_t *s, uint64_t lat_ns, uint64_t bytes, uint64_t now);

/* kvx_export.c: regions, leases, peer metadata, notify receive */
pd_status_t kvx_mem_map(kvx_ctx_h *ctx, void *addr, size_t len, bool alloc,
                        ucp_mem_h *memh_p, void **addr_p);
void kvx_lease_timer_cb(evutil_socket_t fd, short what, void *arg);
void kvx_lease_end(kvx_lease_t *l, kvx_lease_end_t why);
void kvx_lease_deliver(kvx_ctx_h *ctx);
ucs_status_t kvx_am_notify_cb(void *arg, const void *header, size_t header_length,
                              void *data, size_t length, const ucp_am_recv_param_t *param);
pd_status_t kvx_reply_dt_create(kvx_ctx_h *ctx);
ucs_status_t kvx_am_read_req_cb(void *arg, const void *header, size_t header_length,
                                void *data, size_t length, const ucp_am_recv_param_t *param);

/* kvx_import.c: peers, handle import, pulls, notify send */
void kvx_peer_grace_cb(evutil_socket_t fd, short what, void *arg);
void kvx_peer_warm_cb(evutil_socket_t fd, short what, void *arg);
void kvx_pull_timer_cb(evutil_socket_t fd, short what, void *arg);
void kvx_pull_poll_cb(evutil_socket_t fd, short what, void *arg);
void kvx_peer_fail_now(kvx_peer_t *p, pd_status_t why);
void kvx_peer_reap(kvx_peer_t *p);
void kvx_peer_clear(kvx_peer_t *p);
void kvx_pull_step(kvx_pull_t *pl);
ucs_status_t kvx_am_read_rep_cb(void *arg, const void *header, size_t header_length,
                                void *data, size_t length, const ucp_am_recv_param_t *param);
bool kvx_ep_has_rma_lane(ucp_ep_h ep);

/* Byte offset of (layer l, block b) in a region of n_blocks blocks */
static inline uint64_t kvx_layer_off(uint32_t n_blocks, uint64_t layer_bytes, uint32_t l,
                                     uint64_t b)
{
    return ((uint64_t)l * n_blocks + b) * layer_bytes;
}

#endif
