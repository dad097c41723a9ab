/* kvx.c - kvxfer over UCX: context/worker on the daemon's libevent loop,
 * registered regions, leases with generation words, peer metadata, handle
 * import and batched pulls with deadlines. See kvx.h for the contracts and
 * README.md for the protocol. */
#include "kvx.h"

#include "pd_build_config.h"
#include "pd_log.h"
#include "pd_stats.h"
#include "pd_time.h"

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <sodium.h>
#include <ucp/api/ucp.h>

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>

#define KVX_COMP              "kvx"
#define KVX_MAX_REGIONS       4
#define KVX_AM_NOTIFY         17
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

/* ---- statistics ---------------------------------------------------------- */

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
static const char *const kvx_ps_names[] = {
#define KVX_PS_NAME(name, help) #name,
    KVX_PULL_STATS(KVX_PS_NAME)
#undef KVX_PS_NAME
};
static const char *const kvx_cs_names[] = {
#define KVX_CS_NAME(name, help) #name,
    KVX_CTX_STATS(KVX_CS_NAME)
#undef KVX_CS_NAME
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

static pd_stat_desc_t kvx_prom_descs[KVX_PROM__COUNT];
static char kvx_prom_names[KVX_REJECT__COUNT][48];
/* Prometheus shape, per stats role (kvx_stats_role_t): reasons are labels
 * of one family (pd_kvx_rejected_total{reason}, pd_kvx_pulls_failed_total
 * {reason}, pd_kvx_leases_ended_total{how}); the other side's figures are
 * hidden. */
static pd_stat_prom_t kvx_prom_meta[3][KVX_PROM__COUNT];
static pd_stats_table_t kvx_prom_table[3] = {
    { "kvx", kvx_prom_descs, KVX_PROM__COUNT, kvx_prom_meta[KVX_STATS_BOTH], KVX_PROM__COUNT },
    { "kvx", kvx_prom_descs, KVX_PROM__COUNT, kvx_prom_meta[KVX_STATS_EXPORTER], KVX_PROM__COUNT },
    { "kvx", kvx_prom_descs, KVX_PROM__COUNT, kvx_prom_meta[KVX_STATS_IMPORTER], KVX_PROM__COUNT },
};

/* Importer-side rows: pulls, their gets, rkeys, handle validation. */
static bool kvx_prom_importer_row(unsigned i)
{
    return i < KVX_PROM_PS0 + KVX_PS__COUNT || /* KVX_PROM_PS0 is 0 */
           (i >= KVX_PROM_REJ0 && i < KVX_PROM_G0) || i == KVX_PROM_LATENCY ||
           i == KVX_PROM_G_pulls_in_flight || i == KVX_PROM_G_ops_in_flight ||
           i == KVX_PROM_G_rkeys_live;
}

/* Exporter-side rows: leases and the notifies that end or renew them. */
static bool kvx_prom_exporter_row(unsigned i)
{
    return i == KVX_PROM_CS0 + KVX_CS_leases_exported ||
           i == KVX_PROM_CS0 + KVX_CS_leases_released ||
           i == KVX_PROM_CS0 + KVX_CS_leases_expired ||
           i == KVX_PROM_CS0 + KVX_CS_leases_renewed ||
           i == KVX_PROM_CS0 + KVX_CS_leases_revoked ||
           i == KVX_PROM_CS0 + KVX_CS_notifies_rejected ||
           i == KVX_PROM_G_leases_active || i == KVX_PROM_G_blocks_pinned;
}

/* Per importer peer (Prometheus pd_kvx_peer_*{node, peer}): which prefill
 * the KV came from. A set lives as long as the peer slot. */
#define KVX_PEER_PROM(X)                                                      \
    X(pulls_ok,     COUNTER,   "pulls from this peer completed OK")           \
    X(pulls_failed, COUNTER,   "pulls from this peer that failed")            \
    X(bytes_pulled, COUNTER,   "bytes landed from this peer")                 \
    X(pull_latency, HISTOGRAM, "pull latency from this peer")
#define KVX_PEER_PROM_ID(name, kind, help) KVX_PP_##name,
enum { KVX_PEER_PROM(KVX_PEER_PROM_ID) KVX_PP__COUNT };
#undef KVX_PEER_PROM_ID
static const pd_stat_desc_t kvx_peer_prom_descs[] = { KVX_PEER_PROM(PD_STAT_DESC) };
static const pd_stat_prom_t kvx_peer_prom_meta[] = {
    PD_STAT_PROM_LABEL("pulls_ok", "pulls", "result", "ok", "pulls from one peer, by result"),
    PD_STAT_PROM_LABEL("pulls_failed", "pulls", "result", "failed", NULL),
    PD_STAT_PROM_LE("pull_latency", MS),
};
static const pd_stats_table_t kvx_peer_prom_table =
    PD_STATS_TABLE_PROM("kvx_peer", kvx_peer_prom_descs, kvx_peer_prom_meta);

static void kvx_prom_meta_init(void)
{
    static const char *const pull_fail[] = { "pulls_timed_out", "pulls_canceled",
        "pulls_peer_gone", "pulls_stale", "pulls_transport", "pulls_shutdown" };
    static const char *const lease_end[] = { "leases_released", "leases_expired",
                                             "leases_revoked" };
    for (unsigned role = 0; role < 3; role++) {
        for (unsigned i = 0; i < KVX_PROM__COUNT; i++) {
            pd_stat_prom_t *m = &kvx_prom_meta[role][i];
            const char *n = kvx_prom_descs[i].name;
            m->name = n;
            if (i >= KVX_PROM_REJ0 && i < KVX_PROM_G0) {
                m->family = "rejected";
                m->key = "reason";
                m->value = n + strlen("rejected_");
                m->family_help = "KV handles refused by the importer before any UCX "
                                 "operation, by reason";
            }
            for (size_t k = 0; k < sizeof(pull_fail) / sizeof(pull_fail[0]); k++) {
                if (strcmp(n, pull_fail[k]) == 0) {
                    m->family = "pulls_failed";
                    m->key = "reason";
                    m->value = n + strlen("pulls_");
                    m->family_help = "pulls that failed, by reason";
                }
            }
            for (size_t k = 0; k < sizeof(lease_end) / sizeof(lease_end[0]); k++) {
                if (strcmp(n, lease_end[k]) == 0) {
                    m->family = "leases_ended";
                    m->key = "how";
                    m->value = n + strlen("leases_");
                    m->family_help = "leases ended: released by the importer, expired "
                                     "(TTL) or revoked by the exporter";
                }
            }
            if (i == KVX_PROM_LATENCY)
                m->le = PD_HIST_LE_MS;
            m->hidden = (role == KVX_STATS_EXPORTER && kvx_prom_importer_row(i)) ||
                        (role == KVX_STATS_IMPORTER && kvx_prom_exporter_row(i));
        }
    }
}

static void kvx_prom_table_init(void)
{
    static const char *const ps_help[] = {
#define KVX_HELP(name, help) help,
        KVX_PULL_STATS(KVX_HELP)
    };
    static const char *const cs_help[] = { KVX_CTX_STATS(KVX_HELP) };
    static const char *const g_names[] = {
#define KVX_GN(name, help) #name,
        KVX_GAUGE_LIST(KVX_GN)
#undef KVX_GN
    };
    static const char *const g_help[] = { KVX_GAUGE_LIST(KVX_HELP) };
#undef KVX_HELP
    if (kvx_prom_descs[0].name)
        return;
    for (unsigned i = 0; i < KVX_PS__COUNT; i++)
        kvx_prom_descs[KVX_PROM_PS0 + i] =
            (pd_stat_desc_t){ kvx_ps_names[i], PD_STAT_COUNTER, ps_help[i] };
    for (unsigned i = 0; i < KVX_CS__COUNT; i++)
        kvx_prom_descs[KVX_PROM_CS0 + i] =
            (pd_stat_desc_t){ kvx_cs_names[i], PD_STAT_COUNTER, cs_help[i] };
    for (unsigned r = 1; r < KVX_REJECT__COUNT; r++) {
        char *n = kvx_prom_names[r];
        snprintf(n, sizeof(kvx_prom_names[r]), "rejected_%s", kvx_reject_name(r));
        for (char *c = n; *c; c++)
            if (*c >= 'A' && *c <= 'Z')
                *c = (char)(*c - 'A' + 'a');
        kvx_prom_descs[KVX_PROM_REJ0 + r - 1] =
            (pd_stat_desc_t){ n, PD_STAT_COUNTER, "handles rejected for this reason" };
    }
    for (unsigned i = 0; i < sizeof(g_names) / sizeof(g_names[0]); i++)
        kvx_prom_descs[KVX_PROM_G0 + i] =
            (pd_stat_desc_t){ g_names[i], PD_STAT_GAUGE, g_help[i] };
    kvx_prom_descs[KVX_PROM_LATENCY] = (pd_stat_desc_t){
        "pull_latency", PD_STAT_HISTOGRAM, "pull latency, start to completion callback" };
    kvx_prom_meta_init();
}

typedef struct {
    uint64_t c[KVX_PS__COUNT];
    uint64_t hist[KVX_HIST_BUCKETS];   /* pull latency, ns */
    uint64_t hist_n;
    uint64_t bw_win_start_ns;
    uint64_t bw_win_bytes;
    uint64_t bw_last;                  /* bytes/s of the last full window */
} kvx_pstats_t;

static unsigned kvx_hist_index(uint64_t ns)
{
    if (ns < 4)
        return (unsigned)ns;
    unsigned oct = 63u - (unsigned)__builtin_clzll(ns);
    unsigned sub = (unsigned)(ns >> (oct - 2)) & 3u;
    return oct * 4 + sub;
}

static uint64_t kvx_hist_upper(unsigned idx)
{
    if (idx < 4)
        return idx;
    unsigned oct = idx / 4, sub = idx % 4;
    return ((uint64_t)(4 + sub + 1) << (oct - 2)) - 1;
}

static uint64_t kvx_hist_quantile(const kvx_pstats_t *s, double q)
{
    if (s->hist_n == 0)
        return 0;
    uint64_t want = (uint64_t)(q * (double)s->hist_n + 0.999999);
    uint64_t seen = 0;
    for (unsigned i = 0; i < KVX_HIST_BUCKETS; i++) {
        seen += s->hist[i];
        if (seen >= want && s->hist[i])
            return kvx_hist_upper(i);
    }
    return kvx_hist_upper(KVX_HIST_BUCKETS - 1);
}

static void kvx_pstats_pull_done(kvx_pstats_t *s, uint64_t lat_ns,
                                 uint64_t bytes, uint64_t now)
{
    unsigned i = kvx_hist_index(lat_ns);
    s->hist[i < KVX_HIST_BUCKETS ? i : KVX_HIST_BUCKETS - 1]++;
    s->hist_n++;
    if (s->bw_win_start_ns == 0)
        s->bw_win_start_ns = now;
    if (now - s->bw_win_start_ns >= PD_NS_PER_S) {
        s->bw_last = (uint64_t)((double)s->bw_win_bytes * 1e9 /
                                (double)(now - s->bw_win_start_ns));
        s->bw_win_start_ns = now;
        s->bw_win_bytes = 0;
    }
    s->bw_win_bytes += bytes;
}

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
    ucp_ep_h ep;
    void *close_req;            /* pending ucp_ep_close_nbx request */
    bool ep_open;               /* counted in eps_live */
    pd_status_t pending_fail;   /* set from the UCX error callback */
    pd_status_t fail_status;
    uint64_t fail_ns;
    struct event *grace_timer;
    bool grace_expired;
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
                                  * scans only below (256 pull slots cost
                                  * ~0.1-0.3 us per kick, measured) */
    uint64_t pull_seq;
    kvx_notify_buf_t notify[KVX_NOTIFY_SLOTS];
    uint32_t rkeys_live, eps_live;
    /* stats */
    kvx_pstats_t total;
    uint64_t cs[KVX_CS__COUNT];
    uint64_t rejects[KVX_REJECT__COUNT];
    pd_stats_t *prom;            /* the same, as a pd_stats set */
    uint64_t prom_sent[KVX_PROM__COUNT]; /* counter values already added */
};

/* Bring the pd_stats set up to date: counter deltas and gauge levels.
 * Called at the end of every kick and public entry point that counts. */
static void kvx_prom_publish(kvx_ctx_h *ctx)
{
    if (ctx->prom == NULL)
        return;
    uint64_t v[KVX_PROM__COUNT];
    for (unsigned i = 0; i < KVX_PS__COUNT; i++)
        v[KVX_PROM_PS0 + i] = ctx->total.c[i];
    for (unsigned i = 0; i < KVX_CS__COUNT; i++)
        v[KVX_PROM_CS0 + i] = ctx->cs[i];
    for (unsigned r = 1; r < KVX_REJECT__COUNT; r++)
        v[KVX_PROM_REJ0 + r - 1] = ctx->rejects[r];
    for (unsigned i = 0; i < KVX_PROM_G0; i++) {
        if (v[i] != ctx->prom_sent[i]) {
            pd_stats_add(ctx->prom, i, v[i] - ctx->prom_sent[i]);
            ctx->prom_sent[i] = v[i];
        }
    }
    kvx_gauges_t g;
    kvx_gauges(ctx, &g);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_leases_active, g.leases_active);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_blocks_pinned, (int64_t)g.blocks_pinned);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_pulls_in_flight, g.pulls_in_flight);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_ops_in_flight, g.ops_in_flight);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_peers_live, g.peers_live);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_rkeys_live, g.rkeys_live);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_eps_live, g.eps_live);
    for (uint32_t i = 0; i < ctx->peer_hwm; i++) {
        kvx_peer_t *p = &ctx->peers[i];
        if (p->prom == NULL)
            continue;
        uint64_t failed = 0;
        for (unsigned c = KVX_PS_pulls_timed_out; c <= KVX_PS_pulls_shutdown; c++)
            failed += p->st.c[c];
        uint64_t now[3] = { p->st.c[KVX_PS_pulls_ok], failed, p->st.c[KVX_PS_bytes_pulled] };
        static const unsigned id[3] = { KVX_PP_pulls_ok, KVX_PP_pulls_failed, KVX_PP_bytes_pulled };
        for (int k = 0; k < 3; k++) {
            if (now[k] > p->prom_sent[k])
                pd_stats_add(p->prom, id[k], now[k] - p->prom_sent[k]);
            p->prom_sent[k] = now[k];
        }
    }
}

/* Kicks chained by callbacks (a pull completing starts the next one) run in
 * one libevent pass that never looks at timers or fds. After
 * KVX_KICK_CHAIN_MAX such kicks the next goes through a zero timer, so
 * deadlines, the watchdog and the worker fd are served at least that often
 * (before: a stuck chain starved a pull deadline for ~10 minutes). */
#define KVX_KICK_CHAIN_MAX 64

static void kvx_kick(kvx_ctx_h *ctx)
{
    if (ctx->kick_pending)
        return;
    ctx->kick_pending = true;
    if (ctx->kick_chain < KVX_KICK_CHAIN_MAX) {
        event_active(ctx->ev_kick, 0, 0);
    } else {
        static const struct timeval zero = { 0, 0 };
        evtimer_add(ctx->ev_kick_later, &zero);
    }
}

static pd_status_t kvx_ucs_status(ucs_status_t s)
{
    switch (s) {
    case UCS_OK:                return PD_OK;
    case UCS_ERR_NO_MEMORY:     return PD_ERR_NO_MEMORY;
    case UCS_ERR_CANCELED:      return PD_ERR_CANCELED;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:      return PD_ERR_PEER_GONE;
    default:                    return PD_ERR_TRANSPORT;
    }
}

/* ---- progress: worker event fd on the loop -------------------------------- */

/* Drain progress, then arm; BUSY means events arrived meanwhile. Returns
 * how many progress calls did work. The arm (an eventfd read plus one
 * recvfrom per shared-memory interface: ~1 us here, measured with perf on
 * the 64 KiB latency path) is skipped when the worker is still armed: no
 * progress call consumed an event since the last successful arm, the event
 * fd did not fire, and none of our gets is outstanding (a get that returned
 * a request is always followed by a fresh arm). */
#define KVX_ARM_SPIN_NS (50 * PD_NS_PER_US)
#define KVX_WD_MIN_US 1000
#define KVX_WD_MAX_US 100000

/* One drain of ucp_worker_progress runs for at most this long (checked
 * every 8 calls): with UCX tcp an importer receiving a large pull finds
 * work on every call for as long as the data keeps coming (measured with
 * kv-stream = layer: 831 drains over 5 streamed 3000-token pulls went past
 * the slice), and the old unbounded drain held the loop - steps, messages,
 * timers - meanwhile. Past the slice the drain stops, unarmed, and a zero
 * timer continues it after libevent served the other fds and timers
 * (progress_yields). A single call is not cut (an exporter sends a whole
 * get's software-RMA reply in one). */
#define KVX_PROGRESS_SLICE_NS (500 * PD_NS_PER_US)

static unsigned kvx_progress(kvx_ctx_h *ctx)
{
    ucs_status_t s;
    unsigned worked = 0;
    uint64_t t0 = 0;
    while (ucp_worker_progress(ctx->worker) != 0) {
        worked++;
        if ((worked & 7) != 0)
            continue;
        uint64_t now = pd_now_ns();
        if (t0 == 0) {
            t0 = now;
        } else if (now - t0 > KVX_PROGRESS_SLICE_NS) {
            ctx->armed = false;
            ctx->cs[KVX_CS_progress_yields]++;
            if (!evtimer_pending(ctx->ev_kick_later, NULL)) {
                static const struct timeval zero = { 0, 0 };
                ctx->kick_pending = true;
                evtimer_add(ctx->ev_kick_later, &zero);
            }
            return worked;
        }
    }
    if (worked == 0 && ctx->armed && ctx->ops_in_flight == 0 &&
        ctx->notifies_in_flight == 0)
        return 0;
    /* Bounded: measured (UCX 1.13.1, posix), arm kept returning BUSY for
     * ever while a release notify sat in an endpoint's pending queue behind
     * the asleep exporter's full FIFO, and progress had nothing to do. The
     * old unbounded loop spun here at 100 % CPU and starved every libevent
     * timer (pull deadlines included): the ~10 minute kvxfer-bench stall.
     * Usually the peer drains within microseconds (the retry loop is the
     * backpressure on notifies), so retry for at most KVX_ARM_SPIN_NS; then
     * return unarmed and let the watchdog retry. */
    uint64_t spin_until = 0;
    for (;;) {
        s = ucp_worker_arm(ctx->worker);
        if (s != UCS_ERR_BUSY)
            break;
        uint64_t now = pd_now_ns();
        if (spin_until == 0)
            spin_until = now + KVX_ARM_SPIN_NS;
        else if (now > spin_until)
            break;
        while (ucp_worker_progress(ctx->worker) != 0)
            worked++;
    }
    ctx->armed = s == UCS_OK;
    if (s == UCS_ERR_BUSY)
        ctx->cs[KVX_CS_arm_busy]++;
    return worked;
}

/* Safety net against a lost event-fd wakeup: measured with UCX 1.13.1's
 * posix transport (UCX_TLS=posix,self, ~1 in 8 runs of 5000 64 KiB pulls),
 * a get stayed pending with both workers armed and asleep until the pull's
 * deadline. While gets are outstanding a 1 ms one-shot timer progresses the
 * worker once more; it is not armed when nothing is in flight (no polling
 * when idle). Rescues are counted (progress_rescues). */
static void kvx_watchdog_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_ctx_h *ctx = arg;
    ctx->kick_chain = 0;
    ctx->armed = false;
    if (kvx_progress(ctx) > 0) {
        ctx->cs[KVX_CS_progress_rescues]++;
        ctx->wd_us = KVX_WD_MIN_US;
    } else if (ctx->ops_in_flight == 0 && ctx->wd_us < KVX_WD_MAX_US) {
        ctx->wd_us *= 2; /* idle but unarmed or serving leases: back off */
    }
    kvx_kick(ctx);
}

static void kvx_efd_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_ctx_h *ctx = arg;
    ctx->kick_chain = 0;
    ctx->armed = false; /* the fd fired: the arm is used up */
    kvx_progress(ctx);
}

static void kvx_kick_cb(evutil_socket_t fd, short what, void *arg);
static void kvx_kick_later_cb(evutil_socket_t fd, short what, void *arg);

/* ---- leases (exporter) --------------------------------------------------- */

static void kvx_region_pin(kvx_region_h *r, const kvx_lease_t *l, int delta)
{
    kvx_ctx_h *ctx = r->ctx;
    for (unsigned i = 0; i < l->n_runs; i++) {
        for (uint32_t b = l->runs[i].start;
             b < l->runs[i].start + l->runs[i].count; b++) {
            if (delta > 0) {
                if (r->pins[b]++ == 0)
                    ctx->blocks_pinned++;
            } else {
                assert(r->pins[b] > 0);
                if (--r->pins[b] == 0)
                    ctx->blocks_pinned--;
            }
        }
    }
}

/* Bump the generation first, then unpin: from here a pull that reads the
 * generation word sees the lease is gone before any block can be reused. */
static void kvx_lease_end(kvx_lease_t *l, kvx_lease_end_t why)
{
    kvx_ctx_h *ctx = l->region->ctx;
    if (l->state != KVX_LEASE_ACTIVE)
        return;
    __atomic_store_n(&ctx->gen_words[l->slot], l->gen + 1, __ATOMIC_RELEASE);
    kvx_region_pin(l->region, l, -1);
    evtimer_del(l->timer);
    l->state = KVX_LEASE_ENDING;
    l->why = why;
    ctx->leases_active--;
    ctx->cs[why == KVX_LEASE_RELEASED ? KVX_CS_leases_released :
            why == KVX_LEASE_EXPIRED ? KVX_CS_leases_expired :
                                       KVX_CS_leases_revoked]++;
    l->next = ctx->lease_ending;
    ctx->lease_ending = l;
    kvx_kick(ctx);
}

static void kvx_lease_deliver(kvx_ctx_h *ctx)
{
    while (ctx->lease_ending) {
        kvx_lease_t *l = ctx->lease_ending;
        ctx->lease_ending = l->next;
        kvx_lease_info_t info = {
            .slot = l->slot, .gen = l->gen, .importer_id = l->importer_id,
            .region_id = l->region->id, .n_blocks = l->n_blocks,
            .user_tag = l->user_tag,
        };
        kvx_lease_end_t why = l->why;
        l->state = KVX_LEASE_FREE;
        l->region = NULL;
        l->next = ctx->lease_free;
        ctx->lease_free = l;
        if (ctx->cfg.on_lease_end)
            ctx->cfg.on_lease_end(ctx->cfg.cb_arg, &info, why);
    }
}

static void kvx_lease_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_lease_t *l = arg;
    if (l->state != KVX_LEASE_ACTIVE)
        return;
    uint64_t now = pd_now_ns();
    if (now < l->expiry_ns) { /* renewed meanwhile */
        struct timeval tv = pd_ns_to_timeval(l->expiry_ns - now);
        evtimer_add(l->timer, &tv);
        return;
    }
    kvx_lease_end(l, KVX_LEASE_EXPIRED);
}

static pd_status_t kvx_export_impl(kvx_region_h *r, uint64_t importer_id,
                                   const uint32_t *blocks, uint32_t n,
                                   uint64_t ttl_ns, uint64_t user_tag,
                                   void *buf, size_t cap, size_t *len_p,
                                   kvx_lease_id_t *lease_p, uint32_t *taken_p,
                                   uint32_t stream_ready, kvx_ready_t *ready_p)
{
    kvx_ctx_h *ctx = r->ctx;
    kvx_handle_t h;
    pd_status_t status;
    /* one run more than a handle holds, to know when to stop */
    kvx_run_t runs[KVX_HANDLE_MAX_RUNS + 1];
    unsigned n_runs = 0;

    if (n == 0 || ttl_ns == 0 || importer_id == 0)
        return PD_ERR_BAD_INPUT;
    if (ready_p != NULL && ctx->cfg.ready_layers < r->n_layers)
        return PD_ERR_BAD_INPUT; /* no readiness words for this region */
    if (n > KVX_HANDLE_MAX_BLOCKS) {
        if (taken_p == NULL)
            return PD_ERR_TOO_BIG;
        n = KVX_HANDLE_MAX_BLOCKS;
    }
    if (ttl_ns > ctx->cfg.max_lease_ttl_ns)
        ttl_ns = ctx->cfg.max_lease_ttl_ns;
    for (uint32_t i = 0; i < n; i++) {
        if (blocks[i] >= r->n_blocks)
            return PD_ERR_BAD_INPUT;
        if (n_runs > 0 &&
            blocks[i] == runs[n_runs - 1].start + runs[n_runs - 1].count) {
            runs[n_runs - 1].count++;
            continue;
        }
        if (n_runs == KVX_HANDLE_MAX_RUNS + 1)
            break;
        runs[n_runs].start = blocks[i];
        runs[n_runs].count = 1;
        n_runs++;
    }
    unsigned fit = kvx_handle_runs_fitting(runs, n_runs);
    if (fit < n_runs && (taken_p == NULL || fit == 0))
        return PD_ERR_TOO_BIG;
    h.n_runs = (uint16_t)fit;
    uint32_t taken = 0;
    for (unsigned i = 0; i < fit; i++) {
        h.runs[i] = runs[i];
        taken += runs[i].count;
    }
    n = taken;
    kvx_lease_t *l = ctx->lease_free;
    if (l == NULL)
        return PD_ERR_NO_SPACE;

    uint64_t now = pd_now_ns();
    h.version = KVX_HANDLE_VERSION;
    h.flags = ready_p != NULL ? KVX_HANDLE_F_STREAM : 0;
    h.exporter_id = ctx->cfg.node_id;
    h.incarnation = ctx->incarnation;
    h.importer_id = importer_id;
    h.lease_gen = ctx->gen_words[l->slot] + 1;
    h.expiry_wall_ns = pd_wall_ns() + ttl_ns;
    h.compat_hash = r->compat_hash;
    h.region_id = r->id;
    h.lease_slot = l->slot;
    h.block_bytes = (uint32_t)r->block_bytes;
    h.n_blocks = n;
    status = kvx_handle_encode(&h, ctx->cfg.secret, buf, cap, len_p);
    if (status != PD_OK)
        return status;

    ctx->lease_free = l->next;
    l->next = NULL;
    l->state = KVX_LEASE_ACTIVE;
    l->gen = h.lease_gen;
    l->importer_id = importer_id;
    l->expiry_ns = now + ttl_ns;
    l->user_tag = user_tag;
    l->region = r;
    l->n_runs = h.n_runs;
    l->n_blocks = n;
    memcpy(l->runs, h.runs, sizeof(h.runs[0]) * h.n_runs);
    memcpy(l->tag, (uint8_t *)buf + *len_p - KVX_TAG_BYTES, KVX_TAG_BYTES);
    __atomic_store_n(&ctx->gen_words[l->slot], l->gen, __ATOMIC_RELEASE);
    if (ctx->cfg.ready_layers > 0) {
        /* a plain export is complete; a streamed one starts at stream_ready
         * blocks per layer (e.g. a cached prefix) */
        kvx_ready_t rd = { ctx->gen_words + ctx->cfg.max_leases +
                               (size_t)l->slot * ctx->cfg.ready_layers,
                           ctx->cfg.ready_layers, (uint32_t)l->gen };
        uint32_t init = ready_p != NULL ? (stream_ready < n ? stream_ready : n) : n;
        for (uint32_t i = 0; i < rd.n_layers; i++)
            kvx_ready_publish(&rd, i, init);
        if (ready_p != NULL) {
            rd.n_layers = r->n_layers;
            *ready_p = rd;
        }
    }
    kvx_region_pin(r, l, +1);
    struct timeval tv = pd_ns_to_timeval(ttl_ns);
    evtimer_add(l->timer, &tv);
    ctx->leases_active++;
    ctx->cs[KVX_CS_leases_exported]++;
    if (lease_p) {
        lease_p->slot = l->slot;
        lease_p->gen = l->gen;
    }
    if (taken_p)
        *taken_p = taken;
    return PD_OK;
}

pd_status_t kvx_export(kvx_region_h *r, uint64_t importer_id,
                       const uint32_t *blocks, uint32_t n, uint64_t ttl_ns,
                       uint64_t user_tag, void *buf, size_t cap,
                       size_t *len_p, kvx_lease_id_t *lease_p)
{
    return kvx_export_impl(r, importer_id, blocks, n, ttl_ns, user_tag, buf,
                           cap, len_p, lease_p, NULL, 0, NULL);
}

pd_status_t kvx_export_stream(kvx_region_h *r, uint64_t importer_id,
                              const uint32_t *blocks, uint32_t n, uint64_t ttl_ns,
                              uint64_t user_tag, uint32_t blocks_ready, void *buf,
                              size_t cap, size_t *len_p, kvx_lease_id_t *lease_p,
                              kvx_ready_t *ready_p)
{
    if (ready_p == NULL)
        return PD_ERR_BAD_INPUT;
    return kvx_export_impl(r, importer_id, blocks, n, ttl_ns, user_tag, buf,
                           cap, len_p, lease_p, NULL, blocks_ready, ready_p);
}

pd_status_t kvx_export_part(kvx_region_h *r, uint64_t importer_id,
                            const uint32_t *blocks, uint32_t n, uint64_t ttl_ns,
                            uint64_t user_tag, void *buf, size_t cap,
                            size_t *len_p, kvx_lease_id_t *lease_p,
                            uint32_t *taken_p)
{
    return kvx_export_impl(r, importer_id, blocks, n, ttl_ns, user_tag, buf,
                           cap, len_p, lease_p, taken_p, 0, NULL);
}

pd_status_t kvx_lease_revoke(kvx_ctx_h *ctx, kvx_lease_id_t id)
{
    if (id.slot >= ctx->cfg.max_leases)
        return PD_ERR_NOT_FOUND;
    kvx_lease_t *l = &ctx->leases[id.slot];
    if (l->state != KVX_LEASE_ACTIVE || l->gen != id.gen)
        return PD_ERR_NOT_FOUND;
    kvx_lease_end(l, KVX_LEASE_REVOKED);
    return PD_OK;
}

pd_status_t kvx_lease_set_ttl(kvx_ctx_h *ctx, kvx_lease_id_t id, uint64_t ttl_ns)
{
    if (id.slot >= ctx->cfg.max_leases)
        return PD_ERR_NOT_FOUND;
    kvx_lease_t *l = &ctx->leases[id.slot];
    if (l->state != KVX_LEASE_ACTIVE || l->gen != id.gen)
        return PD_ERR_NOT_FOUND;
    if (ttl_ns > ctx->cfg.max_lease_ttl_ns)
        ttl_ns = ctx->cfg.max_lease_ttl_ns;
    l->expiry_ns = pd_now_ns() + ttl_ns;
    struct timeval tv = pd_ns_to_timeval(ttl_ns); /* sooner: re-arm */
    evtimer_add(l->timer, &tv);
    return PD_OK;
}

/* AM handler (inside ucp_worker_progress): validate, then end/renew. No UCX
 * calls and no user callbacks from here (lease_end defers them). */
static ucs_status_t kvx_am_notify_cb(void *arg, const void *header,
                                     size_t header_length, void *data,
                                     size_t length,
                                     const ucp_am_recv_param_t *param)
{
    kvx_ctx_h *ctx = arg;
    const uint8_t *m = header;

    if (header_length != KVX_NOTIFY_BYTES || length != 0 ||
        kvx_get_u32(m) != KVX_NOTIFY_MAGIC || m[4] != 1 ||
        kvx_get_u16(m + 6) != 0 || kvx_get_u32(m + 28) != 0)
        goto reject;
    uint8_t type = m[5];
    uint64_t importer = kvx_get_u64(m + 8);
    uint64_t incarnation = kvx_get_u64(m + 16);
    uint32_t slot = kvx_get_u32(m + 24);
    uint64_t gen = kvx_get_u64(m + 32);
    uint64_t ttl = kvx_get_u64(m + 40);
    if (incarnation != ctx->incarnation || slot >= ctx->cfg.max_leases)
        goto reject;
    kvx_lease_t *l = &ctx->leases[slot];
    if (l->state != KVX_LEASE_ACTIVE || l->gen != gen ||
        l->importer_id != importer ||
        crypto_verify_16(l->tag, m + 48) != 0)
        goto reject;
    if (type == KVX_NOTIFY_RELEASE) {
        kvx_lease_end(l, KVX_LEASE_RELEASED);
    } else if (type == KVX_NOTIFY_RENEW) {
        if (ttl == 0)
            goto reject;
        if (ttl > ctx->cfg.max_lease_ttl_ns)
            ttl = ctx->cfg.max_lease_ttl_ns;
        l->expiry_ns = pd_now_ns() + ttl; /* timer re-arms itself */
        ctx->cs[KVX_CS_leases_renewed]++;
    } else {
        goto reject;
    }
    return UCS_OK;
reject:
    ctx->cs[KVX_CS_notifies_rejected]++;
    return UCS_OK;
}

/* ---- regions -------------------------------------------------------------- */

static pd_status_t kvx_mem_map(kvx_ctx_h *ctx, void *addr, size_t len,
                               bool allocate, ucp_mem_h *memh_p,
                               void **addr_p)
{
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_PROT |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .length = len,
        /* never REMOTE_WRITE: importers only read */
        .prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
                UCP_MEM_MAP_PROT_REMOTE_READ,
        .flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0,
    };
    if (!allocate) {
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_ADDRESS;
        mp.address = addr;
    }
    ucp_mem_h memh;
    if (ucp_mem_map(ctx->ucp, &mp, &memh) != UCS_OK)
        return PD_ERR_TRANSPORT;
    ucp_mem_attr_t attr = { .field_mask = UCP_MEM_ATTR_FIELD_ADDRESS };
    if (ucp_mem_query(memh, &attr) != UCS_OK) {
        ucp_mem_unmap(ctx->ucp, memh);
        return PD_ERR_TRANSPORT;
    }
    *memh_p = memh;
    *addr_p = attr.address;
    return PD_OK;
}

/* A number from a one-line file (cgroup v2); false if absent or "max". */
static bool kvx_read_u64_file(const char *path, uint64_t *v_p)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return false;
    unsigned long long v;
    bool ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    if (ok)
        *v_p = v;
    return ok;
}

uint64_t kvx_mem_available(void)
{
    uint64_t avail = UINT64_MAX;
    FILE *f = fopen("/proc/meminfo", "re");
    if (f != NULL) {
        char line[128];
        unsigned long long kb;
        while (fgets(line, sizeof(line), f) != NULL)
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                avail = (uint64_t)kb * 1024;
                break;
            }
        fclose(f);
    }
    uint64_t max, cur;
    if (kvx_read_u64_file("/sys/fs/cgroup/memory.max", &max) &&
        kvx_read_u64_file("/sys/fs/cgroup/memory.current", &cur)) {
        uint64_t room = max > cur ? max - cur : 0;
        if (room < avail)
            avail = room;
    }
    return avail;
}

pd_status_t kvx_arena_check(uint64_t len, char *why, size_t why_len)
{
    uint64_t avail = kvx_mem_available();
    if (avail == UINT64_MAX)
        return PD_OK; /* nothing to check against */
    /* leave a tenth for the model, the engine and the rest of the machine */
    if (len > avail - avail / 10) {
        snprintf(why, why_len,
                 "KV arena of %.1f MiB does not fit: %.1f MiB of memory available "
                 "(MemAvailable / cgroup limit, 90%% usable); lower --kv-blocks",
                 (double)len / 1048576.0, (double)avail / 1048576.0);
        return PD_ERR_NO_MEMORY;
    }
    return PD_OK;
}

pd_status_t kvx_region_register(kvx_ctx_h *ctx, uint32_t region_id,
                                uint64_t block_bytes, uint32_t n_blocks,
                                uint64_t compat_hash, kvx_alloc_t alloc,
                                kvx_region_h **region_p)
{
    return kvx_region_register_layers(ctx, region_id, block_bytes, n_blocks, 1, compat_hash,
                                      alloc, region_p);
}

pd_status_t kvx_region_register_layers(kvx_ctx_h *ctx, uint32_t region_id,
                                       uint64_t block_bytes, uint32_t n_blocks,
                                       uint32_t n_layers, uint64_t compat_hash,
                                       kvx_alloc_t alloc, kvx_region_h **region_p)
{
    kvx_region_h *r = NULL;
    pd_status_t status;

    if (block_bytes == 0 || n_blocks == 0 || n_layers == 0 || n_layers > KVX_MAX_LAYERS ||
        block_bytes % n_layers != 0)
        return PD_ERR_BAD_INPUT;
    if (block_bytes > UINT32_MAX || n_blocks > (1u << 31))
        return PD_ERR_TOO_BIG;
    for (unsigned i = 0; i < KVX_MAX_REGIONS; i++) {
        if (ctx->regions[i].in_use && ctx->regions[i].id == region_id)
            return PD_ERR_EXISTS;
        if (!ctx->regions[i].in_use && r == NULL)
            r = &ctx->regions[i];
    }
    if (r == NULL)
        return PD_ERR_NO_SPACE;
    char why[256];
    if (kvx_arena_check((uint64_t)block_bytes * n_blocks, why, sizeof(why)) != PD_OK) {
        pd_log(PD_LOG_ERROR, "kvx", NULL, "%s", why);
        return PD_ERR_NO_MEMORY;
    }
    if (alloc == KVX_ALLOC_UCX) {
        /* UCX may back the arena with a POSIX segment in /dev/shm; one
         * larger than the tmpfs has room for would SIGBUS on first touch
         * (and a killed process leaves the file behind): map our own. */
        struct statvfs sv;
        if (statvfs("/dev/shm", &sv) == 0 &&
            (uint64_t)sv.f_bavail * sv.f_frsize < (uint64_t)block_bytes * n_blocks) {
            pd_log(PD_LOG_WARN, "kvx", NULL,
                   "KV arena (%.1f MiB) larger than the free space of /dev/shm (%.1f MiB): "
                   "allocating it with mmap instead of UCX (same-host pulls go slower)",
                   (double)block_bytes * n_blocks / 1048576.0,
                   (double)sv.f_bavail * sv.f_frsize / 1048576.0);
            alloc = KVX_ALLOC_OWN;
        }
    }
    memset(r, 0, sizeof(*r));
    r->ctx = ctx;
    r->id = region_id;
    r->block_bytes = block_bytes;
    r->n_blocks = n_blocks;
    r->n_layers = n_layers;
    r->layer_bytes = block_bytes / n_layers;
    r->compat_hash = compat_hash;
    r->alloc = alloc;
    r->len = (size_t)block_bytes * n_blocks;
    r->pins = calloc(n_blocks, sizeof(*r->pins));
    if (r->pins == NULL) {
        status = PD_ERR_NO_MEMORY;
        goto err;
    }
    void *own = NULL;
    if (alloc == KVX_ALLOC_OWN) {
        own = mmap(NULL, r->len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (own == MAP_FAILED) {
            status = PD_ERR_NO_MEMORY;
            goto err_free_pins;
        }
    }
    void *addr;
    status = kvx_mem_map(ctx, own, r->len, alloc == KVX_ALLOC_UCX, &r->memh,
                         &addr);
    if (status != PD_OK)
        goto err_munmap;
    r->base = addr;
    memset(r->base, 0, r->len); /* fault every page in now, not on a request */
    if (ucp_rkey_pack(ctx->ucp, r->memh, &r->rkey_buf, &r->rkey_len) != UCS_OK) {
        status = PD_ERR_TRANSPORT;
        goto err_unmap;
    }
    if (r->rkey_len > KVX_META_MAX_RKEY) {
        status = PD_ERR_TOO_BIG;
        goto err_release_rkey;
    }
    r->in_use = true;
    *region_p = r;
    return PD_OK;

err_release_rkey:
    ucp_rkey_buffer_release(r->rkey_buf);
err_unmap:
    ucp_mem_unmap(ctx->ucp, r->memh);
err_munmap:
    if (own)
        munmap(own, r->len);
err_free_pins:
    free(r->pins);
err:
    memset(r, 0, sizeof(*r));
    return status;
}

void kvx_region_deregister(kvx_region_h *r)
{
    if (r == NULL || !r->in_use)
        return;
    kvx_ctx_h *ctx = r->ctx;
    for (uint32_t i = 0; i < ctx->cfg.max_leases; i++)
        if (ctx->leases[i].state == KVX_LEASE_ACTIVE && ctx->leases[i].region == r)
            kvx_lease_end(&ctx->leases[i], KVX_LEASE_REVOKED);
    kvx_lease_deliver(ctx);
    ucp_rkey_buffer_release(r->rkey_buf);
    ucp_mem_unmap(ctx->ucp, r->memh);
    if (r->alloc == KVX_ALLOC_OWN)
        munmap(r->base, r->len);
    free(r->pins);
    memset(r, 0, sizeof(*r));
}

void *kvx_region_base(const kvx_region_h *r) { return r->base; }
uint64_t kvx_region_block_bytes(const kvx_region_h *r) { return r->block_bytes; }
uint32_t kvx_region_n_blocks(const kvx_region_h *r) { return r->n_blocks; }
uint32_t kvx_region_n_layers(const kvx_region_h *r) { return r->n_layers; }

/* Block b of layer l: layer-major, (n_layers, n_blocks, layer_bytes); with
 * one layer that is the block-major (n_blocks, block_bytes). */
static inline uint64_t kvx_layer_off(uint32_t n_blocks, uint64_t layer_bytes, uint32_t l,
                                     uint64_t b)
{
    return ((uint64_t)l * n_blocks + b) * layer_bytes;
}

unsigned kvx_region_block_pins(const kvx_region_h *r, uint32_t block)
{
    return block < r->n_blocks ? r->pins[block] : 0;
}

pd_status_t kvx_region_blocks_free(kvx_region_h *r, const uint32_t *blocks,
                                   uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (blocks[i] >= r->n_blocks || r->pins[blocks[i]] != 0)
            return blocks[i] >= r->n_blocks ? PD_ERR_BAD_INPUT : PD_ERR_BUSY;
#if PD_DEBUG_POISON
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < r->n_layers; l++)
            memset(r->base + kvx_layer_off(r->n_blocks, r->layer_bytes, l, blocks[i]),
                   KVX_POISON_BYTE, r->layer_bytes);
#endif
    return PD_OK;
}

/* ---- context -------------------------------------------------------------- */

void kvx_config_default(kvx_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_leases = 4096;
    cfg->max_pulls = 256;
    cfg->max_ops_in_flight = 64;
    cfg->max_op_bytes = 8ull << 20;
    cfg->max_peers = 64;
    cfg->max_lease_ttl_ns = 600 * PD_NS_PER_S;
    cfg->close_grace_ns = 200 * PD_NS_PER_MS;
    cfg->err_mode = KVX_ERRMODE_AUTO;
    cfg->warm_peer_mappings = true;
    cfg->ready_poll_ns = 100 * PD_NS_PER_US;
}

static uint64_t kvx_read_host_id(void)
{
    char buf[128] = { 0 };
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(buf, sizeof(buf), f) == NULL)
            buf[0] = 0;
        fclose(f);
    }
    uint64_t id = 0;
    crypto_generichash((uint8_t *)&id, sizeof(id), (uint8_t *)buf,
                       strlen(buf), NULL, 0);
    return id | 1;
}

static void kvx_peer_grace_cb(evutil_socket_t fd, short what, void *arg);
static void kvx_pull_timer_cb(evutil_socket_t fd, short what, void *arg);
static void kvx_pull_poll_cb(evutil_socket_t fd, short what, void *arg);

/* UCX settings kvx changes from UCX's defaults, each unless the operator
 * set that variable (or one it must agree with) in the environment. Set in
 * the environment, because UCX 1.13 reads transport settings there (a
 * ucp_config_modify of TCP_TX_SEG_SIZE was accepted and had no effect,
 * measured with kvxfer-bench).
 * UCX_TCP_TX_SEG_SIZE 8K -> 64K (= UCX_TCP_RX_SEG_SIZE's default, which must
 * stay >= it, so an operator's RX_SEG_SIZE leaves both alone): over UCX tcp
 * a get is software RMA and the exporter sends the reply in TX_SEG
 * fragments, a copy and a send() each, on its loop thread. Measured on the
 * 2-core VM, release build: kvxfer-bench --preset=llama3-8b over tcp 0.98
 * -> 2.33 GB/s; tests/bench/kv-stream.sh (docs/BENCHMARKS.md, issue 15): a
 * whole 3000-token pull (376 MiB) 403 -> 168-201 ms, and with kv-stream =
 * layer the prefill's loop, no longer held in those copies, sends token 0
 * on time (TTFT +2.5-2.8 % over whole instead of +3-14 %). */
void kvx_ucx_env_defaults(void)
{
    static const struct {
        const char *name, *value, *unless;
    } tune[] = {
        { "UCX_TCP_TX_SEG_SIZE", "64K", "UCX_TCP_RX_SEG_SIZE" },
    };
    for (size_t i = 0; i < sizeof(tune) / sizeof(tune[0]); i++)
        if (getenv(tune[i].unless) == NULL)
            (void)setenv(tune[i].name, tune[i].value, 0 /* the operator's wins */);
}

pd_status_t kvx_ctx_create(const kvx_config_t *cfg, struct event_base *base,
                           kvx_ctx_h **ctx_p)
{
    pd_status_t status = PD_ERR_NO_MEMORY;
    ucp_config_t *ucfg;
    kvx_ctx_h *ctx;

    if (cfg->node_id == 0 || cfg->max_leases == 0 || cfg->ready_layers > KVX_MAX_LAYERS ||
        cfg->max_leases > KVX_META_MAX_SLOTS || cfg->max_pulls == 0 ||
        cfg->max_pulls > 65535 || cfg->max_ops_in_flight == 0 ||
        cfg->max_peers == 0 || cfg->max_op_bytes < 4096)
        return PD_ERR_BAD_INPUT;
    if (sodium_init() < 0)
        return PD_ERR_INTERNAL;
    ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        goto err;
    ctx->cfg = *cfg;
    ctx->wd_us = KVX_WD_MIN_US;
    ctx->base = base;
    randombytes_buf(&ctx->incarnation, sizeof(ctx->incarnation));
    ctx->incarnation |= 1;
    ctx->host_id = kvx_read_host_id();
    ctx->leases = calloc(cfg->max_leases, sizeof(*ctx->leases));
    ctx->peers = calloc(cfg->max_peers, sizeof(*ctx->peers));
    ctx->pulls = calloc(cfg->max_pulls, sizeof(*ctx->pulls));
    if (!ctx->leases || !ctx->peers || !ctx->pulls)
        goto err_free;
    for (uint32_t i = cfg->max_leases; i-- > 0;) {
        kvx_lease_t *l = &ctx->leases[i];
        l->slot = i;
        l->timer = evtimer_new(base, kvx_lease_timer_cb, l);
        if (l->timer == NULL)
            goto err_free;
        l->next = ctx->lease_free;
        ctx->lease_free = l;
    }
    for (uint32_t i = 0; i < cfg->max_peers; i++) {
        ctx->peers[i].ctx = ctx;
        ctx->peers[i].idx = i;
        ctx->peers[i].grace_timer = evtimer_new(base, kvx_peer_grace_cb,
                                                &ctx->peers[i]);
        if (ctx->peers[i].grace_timer == NULL)
            goto err_free;
    }
    for (uint32_t i = 0; i < cfg->max_pulls; i++) {
        ctx->pulls[i].ctx = ctx;
        ctx->pulls[i].idx = i;
        ctx->pulls[i].timer = evtimer_new(base, kvx_pull_timer_cb,
                                          &ctx->pulls[i]);
        ctx->pulls[i].poll_timer = evtimer_new(base, kvx_pull_poll_cb, &ctx->pulls[i]);
        if (ctx->pulls[i].timer == NULL || ctx->pulls[i].poll_timer == NULL)
            goto err_free;
    }

    ucp_params_t up = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
    };
    status = PD_ERR_TRANSPORT;
    kvx_ucx_env_defaults(); /* no-op when the daemon did it before its threads */
    if (ucp_config_read(NULL, NULL, &ucfg) != UCS_OK)
        goto err_free;
    ucs_status_t us = ucp_init(&up, ucfg, &ctx->ucp);
    ucp_config_release(ucfg);
    if (us != UCS_OK)
        goto err_free;
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    if (ucp_worker_create(ctx->ucp, &wp, &ctx->worker) != UCS_OK)
        goto err_cleanup;
    if (ucp_worker_get_address(ctx->worker, &ctx->addr, &ctx->addr_len) != UCS_OK)
        goto err_worker;
    if (ctx->addr_len > KVX_META_MAX_ADDR)
        goto err_addr;
    void *gen_addr;
    size_t gen_len = (size_t)cfg->max_leases * (1 + cfg->ready_layers) * sizeof(uint64_t);
    status = kvx_mem_map(ctx, NULL, gen_len, true, &ctx->gen_memh, &gen_addr);
    if (status != PD_OK)
        goto err_addr;
    ctx->gen_words = gen_addr;
    memset(ctx->gen_words, 0, gen_len);
    status = PD_ERR_TRANSPORT;
    if (ucp_rkey_pack(ctx->ucp, ctx->gen_memh, &ctx->gen_rkey_buf,
                      &ctx->gen_rkey_len) != UCS_OK)
        goto err_gen;
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                      UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = KVX_AM_NOTIFY,
        .cb = kvx_am_notify_cb,
        .arg = ctx,
    };
    if (ucp_worker_set_am_recv_handler(ctx->worker, &ap) != UCS_OK)
        goto err_gen_rkey;
    int efd;
    if (ucp_worker_get_efd(ctx->worker, &efd) != UCS_OK)
        goto err_gen_rkey;
    status = PD_ERR_INTERNAL;
    ctx->ev_efd = event_new(base, efd, EV_READ | EV_PERSIST, kvx_efd_cb, ctx);
    ctx->ev_kick = event_new(base, -1, 0, kvx_kick_cb, ctx);
    ctx->ev_watchdog = evtimer_new(base, kvx_watchdog_cb, ctx);
    ctx->ev_kick_later = evtimer_new(base, kvx_kick_later_cb, ctx);
    if (!ctx->ev_efd || !ctx->ev_kick || !ctx->ev_watchdog || !ctx->ev_kick_later ||
        event_add(ctx->ev_efd, NULL) != 0)
        goto err_events;
    kvx_prom_table_init();
    char node[24];
    snprintf(node, sizeof(node), "%016llx", (unsigned long long)cfg->node_id);
    unsigned role = (unsigned)cfg->stats_role <= KVX_STATS_IMPORTER ? (unsigned)cfg->stats_role
                                                                    : KVX_STATS_BOTH;
    if (pd_stats_create(&kvx_prom_table[role], (const char *[]){ "node", node, NULL },
                        &ctx->prom) != PD_OK)
        ctx->prom = NULL; /* JSON stats still work */
    kvx_progress(ctx);
    *ctx_p = ctx;
    return PD_OK;

err_events:
    if (ctx->ev_efd)
        event_free(ctx->ev_efd);
    if (ctx->ev_kick)
        event_free(ctx->ev_kick);
    if (ctx->ev_watchdog)
        event_free(ctx->ev_watchdog);
    if (ctx->ev_kick_later)
        event_free(ctx->ev_kick_later);
err_gen_rkey:
    ucp_rkey_buffer_release(ctx->gen_rkey_buf);
err_gen:
    ucp_mem_unmap(ctx->ucp, ctx->gen_memh);
err_addr:
    ucp_worker_release_address(ctx->worker, ctx->addr);
err_worker:
    ucp_worker_destroy(ctx->worker);
err_cleanup:
    ucp_cleanup(ctx->ucp);
err_free:
    for (uint32_t i = 0; ctx->leases && i < cfg->max_leases; i++)
        if (ctx->leases[i].timer)
            event_free(ctx->leases[i].timer);
    for (uint32_t i = 0; ctx->peers && i < cfg->max_peers; i++)
        if (ctx->peers[i].grace_timer)
            event_free(ctx->peers[i].grace_timer);
    for (uint32_t i = 0; ctx->pulls && i < cfg->max_pulls; i++) {
        if (ctx->pulls[i].timer)
            event_free(ctx->pulls[i].timer);
        if (ctx->pulls[i].poll_timer)
            event_free(ctx->pulls[i].poll_timer);
    }
    free(ctx->leases);
    free(ctx->peers);
    free(ctx->pulls);
    free(ctx);
err:
    return status;
}

uint64_t kvx_ctx_node_id(const kvx_ctx_h *ctx) { return ctx->cfg.node_id; }
uint64_t kvx_ctx_incarnation(const kvx_ctx_h *ctx) { return ctx->incarnation; }

/* ---- peer metadata -------------------------------------------------------- */

pd_status_t kvx_meta_pack(kvx_ctx_h *ctx, void *out, size_t cap, size_t *len_p)
{
    uint8_t *b = out;
    size_t need = KVX_META_HDR + ctx->addr_len + ctx->gen_rkey_len + KVX_TAG_BYTES;
    unsigned n_regions = 0;
    for (unsigned i = 0; i < KVX_MAX_REGIONS; i++) {
        if (ctx->regions[i].in_use) {
            need += KVX_META_REGION_HDR + ctx->regions[i].rkey_len;
            n_regions++;
        }
    }
    if (need > cap || need > KVX_META_MAX_BYTES)
        return PD_ERR_NO_SPACE;
    kvx_put_u32(b, KVX_META_MAGIC);
    b[4] = KVX_META_VERSION;
    b[5] = (uint8_t)n_regions;
    kvx_put_u16(b + 6, 0);
    kvx_put_u64(b + 8, ctx->cfg.node_id);
    kvx_put_u64(b + 16, ctx->incarnation);
    kvx_put_u64(b + 24, ctx->host_id);
    kvx_put_u64(b + 32, (uint64_t)(uintptr_t)ctx->gen_words);
    kvx_put_u32(b + 40, ctx->cfg.max_leases);
    kvx_put_u16(b + 44, (uint16_t)ctx->gen_rkey_len);
    kvx_put_u16(b + 46, (uint16_t)ctx->addr_len);
    kvx_put_u32(b + 48, (uint32_t)need);
    kvx_put_u32(b + 52, ctx->cfg.ready_layers);
    size_t off = KVX_META_HDR;
    memcpy(b + off, ctx->addr, ctx->addr_len);
    off += ctx->addr_len;
    memcpy(b + off, ctx->gen_rkey_buf, ctx->gen_rkey_len);
    off += ctx->gen_rkey_len;
    for (unsigned i = 0; i < KVX_MAX_REGIONS; i++) {
        const kvx_region_h *r = &ctx->regions[i];
        if (!r->in_use)
            continue;
        kvx_put_u32(b + off, r->id);
        kvx_put_u32(b + off + 4, r->n_blocks);
        kvx_put_u32(b + off + 8, (uint32_t)r->block_bytes);
        kvx_put_u64(b + off + 12, (uint64_t)(uintptr_t)r->base);
        kvx_put_u64(b + off + 20, r->compat_hash);
        kvx_put_u16(b + off + 28, (uint16_t)r->rkey_len);
        kvx_put_u16(b + off + 30, (uint16_t)r->n_layers);
        kvx_put_u32(b + off + 32, 0);
        off += KVX_META_REGION_HDR;
        memcpy(b + off, r->rkey_buf, r->rkey_len);
        off += r->rkey_len;
    }
    crypto_generichash(b + off, KVX_TAG_BYTES, b, off, ctx->cfg.secret,
                       KVX_KEY_BYTES);
    *len_p = off + KVX_TAG_BYTES;
    return PD_OK;
}

static void kvx_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvx_peer_t *p = arg;
    /* inside progress: only mark; the kick closes the endpoint */
    if (p->state == KVX_PEER_ACTIVE && p->pending_fail == PD_OK) {
        p->pending_fail = PD_ERR_PEER_GONE;
        kvx_kick(p->ctx);
    }
}

static void kvx_peer_release_rkeys(kvx_peer_t *p)
{
    kvx_ctx_h *ctx = p->ctx;
    for (unsigned i = 0; i < p->n_regions; i++) {
        if (p->regions[i].rkey) {
            ucp_rkey_destroy(p->regions[i].rkey);
            p->regions[i].rkey = NULL;
            ctx->rkeys_live--;
        }
    }
    if (p->gen_rkey) {
        ucp_rkey_destroy(p->gen_rkey);
        p->gen_rkey = NULL;
        ctx->rkeys_live--;
    }
}

static void kvx_peer_clear(kvx_peer_t *p)
{
    kvx_ctx_h *ctx = p->ctx;
    uint32_t idx = p->idx;
    struct event *gt = p->grace_timer;
    evtimer_del(gt);
    kvx_peer_release_rkeys(p);
    free(p->released_gen);
    pd_stats_destroy(p->prom); /* its series end with the peer */
    memset(p, 0, sizeof(*p));
    p->ctx = ctx;
    p->idx = idx;
    p->grace_timer = gt;
}

/* Force-close the endpoint; pulls end with `why` once their gets return. */
static void kvx_peer_fail_now(kvx_peer_t *p, pd_status_t why)
{
    kvx_ctx_h *ctx = p->ctx;
    if (p->state != KVX_PEER_ACTIVE)
        return;
    p->state = KVX_PEER_FAILED;
    p->fail_status = why;
    p->fail_ns = pd_now_ns();
    ctx->cs[KVX_CS_peers_failed]++;
    if (why == PD_ERR_PEER_GONE) {
        ctx->dead[ctx->dead_next].node_id = p->node_id;
        ctx->dead[ctx->dead_next].incarnation = p->incarnation;
        ctx->dead_next = (ctx->dead_next + 1) % KVX_TOMBSTONES;
    }
    for (uint32_t i = 0; i < ctx->cfg.max_pulls; i++) {
        kvx_pull_t *pl = &ctx->pulls[i];
        if (pl->state != KVX_PULL_FREE && pl->state != KVX_PULL_ZOMBIE &&
            pl->peer == p && pl->err == PD_OK)
            pl->err = why;
    }
    ucp_request_param_t cp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
    };
    void *req = ucp_ep_close_nbx(p->ep, &cp);
    ctx->cs[KVX_CS_eps_forced_closed]++;
    if (UCS_PTR_IS_PTR(req))
        p->close_req = req;
    else {
        p->ep_open = false;
        ctx->eps_live--;
    }
    p->ep = NULL;
    struct timeval tv = pd_ns_to_timeval(ctx->cfg.close_grace_ns);
    evtimer_add(p->grace_timer, &tv);
    kvx_kick(ctx);
}

static void kvx_peer_grace_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_peer_t *p = arg;
    p->grace_expired = true;
    kvx_kick(p->ctx);
}

static kvx_peer_t *kvx_peer_find(kvx_ctx_h *ctx, uint64_t node_id)
{
    for (uint32_t i = 0; i < ctx->cfg.max_peers; i++)
        if (ctx->peers[i].state == KVX_PEER_ACTIVE &&
            ctx->peers[i].node_id == node_id)
            return &ctx->peers[i];
    return NULL;
}

static bool kvx_peer_is_dead(kvx_ctx_h *ctx, uint64_t node_id, uint64_t inc)
{
    for (unsigned i = 0; i < KVX_TOMBSTONES; i++)
        if (ctx->dead[i].node_id == node_id && ctx->dead[i].incarnation == inc)
            return true;
    return false;
}

static pd_status_t kvx_rkey_unpack(kvx_peer_t *p, const uint8_t *buf,
                                   ucp_rkey_h *rkey_p)
{
    if (ucp_ep_rkey_unpack(p->ep, buf, rkey_p) != UCS_OK)
        return PD_ERR_TRANSPORT;
    p->ctx->rkeys_live++;
    return PD_OK;
}

/* Same host, shared-memory lanes: the exporter's segment is attached at
 * rkey unpack, but each page is faulted in on its first get (~60-80 ms per
 * 256 MiB). Touch every page now, at peer setup, not on a request's path.
 * ucp_rkey_ptr only succeeds when the memory is directly mapped here. */
static void kvx_peer_warm(kvx_peer_t *p)
{
    for (unsigned i = 0; i < p->n_regions; i++) {
        const kvx_rregion_t *rr = &p->regions[i];
        void *ptr;
        if (ucp_rkey_ptr(rr->rkey, rr->base, &ptr) != UCS_OK)
            continue;
        const volatile uint8_t *b = ptr;
        uint64_t len = (uint64_t)rr->n_blocks * rr->block_bytes;
        uint8_t sink = 0;
        for (uint64_t off = 0; off < len; off += 4096)
            sink ^= b[off];
        (void)sink;
    }
}
/* Whether UCX may pick shared-memory lanes (posix/sysv/cma) for a same-host
 * peer. AUTO mode gives up PEER error handling on the same host only to keep
 * those lanes (UCX 1.13 drops them in PEER mode). When UCX_TLS leaves them
 * out (e.g. UCX_TLS=tcp) the lanes are tcp anyway, and an endpoint in mode
 * NONE is worse than useless there: when the connection breaks, UCX 1.13's
 * tcp transport asserts in uct_tcp_ep_pending_purge on the exporter. */
static bool kvx_shm_lanes_enabled(void)
{
    const char *tls = getenv("UCX_TLS");
    if (tls == NULL || *tls == '\0' || *tls == '^')
        return true; /* default or an exclusion list: shm stays possible */
    static const char *const shm[] = { "all", "sm", "shm", "posix", "sysv", "cma",
                                       "knem", "xpmem" };
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", tls);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save))
        for (size_t i = 0; i < sizeof(shm) / sizeof(shm[0]); i++)
            if (strcmp(t, shm[i]) == 0)
                return true;
    return false;
}


pd_status_t kvx_peer_add(kvx_ctx_h *ctx, const void *meta, size_t len)
{
    const uint8_t *b = meta;
    uint8_t tag[KVX_TAG_BYTES];
    pd_status_t status;

    if (len < KVX_META_HDR + KVX_TAG_BYTES)
        return PD_ERR_TRUNCATED;
    if (len > KVX_META_MAX_BYTES)
        return PD_ERR_TOO_BIG;
    if (kvx_get_u32(b) != KVX_META_MAGIC)
        return PD_ERR_BAD_MAGIC;
    if (b[4] != KVX_META_VERSION)
        return PD_ERR_BAD_VERSION;
    if (kvx_get_u32(b + 48) != len)
        return PD_ERR_TRUNCATED;
    crypto_generichash(tag, KVX_TAG_BYTES, b, len - KVX_TAG_BYTES,
                       ctx->cfg.secret, KVX_KEY_BYTES);
    if (crypto_verify_16(tag, b + len - KVX_TAG_BYTES) != 0)
        return PD_ERR_AUTH;
    unsigned n_regions = b[5];
    uint64_t node_id = kvx_get_u64(b + 8);
    uint64_t incarnation = kvx_get_u64(b + 16);
    uint32_t n_slots = kvx_get_u32(b + 40);
    size_t gen_rkey_len = kvx_get_u16(b + 44);
    size_t addr_len = kvx_get_u16(b + 46);
    uint32_t ready_words = kvx_get_u32(b + 52);
    if (kvx_get_u16(b + 6) != 0)
        return PD_ERR_RESERVED;
    if (ready_words > KVX_MAX_LAYERS)
        return PD_ERR_BAD_INPUT;
    if (n_regions > KVX_MAX_REGIONS || n_slots == 0 ||
        n_slots > KVX_META_MAX_SLOTS || addr_len == 0 ||
        addr_len > KVX_META_MAX_ADDR || gen_rkey_len > KVX_META_MAX_RKEY ||
        node_id == 0 || node_id == ctx->cfg.node_id)
        return PD_ERR_BAD_INPUT;
    /* walk the region table once, bounds-checked, before touching UCX */
    size_t end = len - KVX_TAG_BYTES;
    size_t off = KVX_META_HDR + addr_len + gen_rkey_len;
    if (off > end)
        return PD_ERR_TRUNCATED;
    size_t roff = off;
    for (unsigned i = 0; i < n_regions; i++) {
        if (roff + KVX_META_REGION_HDR > end)
            return PD_ERR_TRUNCATED;
        size_t rk = kvx_get_u16(b + roff + 28);
        uint32_t nl = kvx_get_u16(b + roff + 30), bb = kvx_get_u32(b + roff + 8);
        if (rk == 0 || rk > KVX_META_MAX_RKEY || nl == 0 || nl > KVX_MAX_LAYERS ||
            bb % nl != 0)
            return PD_ERR_BAD_INPUT;
        if (kvx_get_u32(b + roff + 32) != 0)
            return PD_ERR_RESERVED;
        roff += KVX_META_REGION_HDR + rk;
        if (roff > end)
            return PD_ERR_TRUNCATED;
    }
    if (roff != end)
        return PD_ERR_BAD_INPUT;

    if (kvx_peer_is_dead(ctx, node_id, incarnation))
        return PD_ERR_STALE;
    kvx_peer_t *old = kvx_peer_find(ctx, node_id);
    if (old && old->incarnation == incarnation)
        return PD_ERR_EXISTS;
    kvx_peer_t *p = NULL;
    for (uint32_t i = 0; i < ctx->cfg.max_peers; i++) {
        if (ctx->peers[i].state == KVX_PEER_FREE) {
            p = &ctx->peers[i];
            if (i + 1 > ctx->peer_hwm)
                ctx->peer_hwm = i + 1;
            break;
        }
    }
    if (p == NULL)
        return PD_ERR_NO_SPACE;
    if (old) /* restarted exporter: the old incarnation is gone */
        kvx_peer_fail_now(old, PD_ERR_PEER_GONE);

    p->released_gen = calloc(n_slots, sizeof(uint64_t));
    if (p->released_gen == NULL)
        return PD_ERR_NO_MEMORY;
    p->node_id = node_id;
    p->incarnation = incarnation;
    p->host_id = kvx_get_u64(b + 24);
    p->gen_base = kvx_get_u64(b + 32);
    p->n_slots = n_slots;
    p->ready_words = ready_words;

    bool want_peer = ctx->cfg.err_mode == KVX_ERRMODE_PEER ||
                     (ctx->cfg.err_mode == KVX_ERRMODE_AUTO &&
                      (p->host_id != ctx->host_id || !kvx_shm_lanes_enabled()));
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = (const ucp_address_t *)(b + KVX_META_HDR),
        .err_mode = UCP_ERR_HANDLING_MODE_NONE,
    };
    ucs_status_t us = UCS_ERR_UNSUPPORTED;
    if (want_peer) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = kvx_ep_err_cb;
        ep.err_handler.arg = p;
        us = ucp_ep_create(ctx->worker, &ep, &p->ep);
        p->err_mode_peer = us == UCS_OK;
    }
    if (us != UCS_OK && ctx->cfg.err_mode != KVX_ERRMODE_PEER) {
        /* shm-only transports refuse PEER mode; deadlines still hold */
        ep.field_mask &= ~(uint64_t)UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        us = ucp_ep_create(ctx->worker, &ep, &p->ep);
    }
    if (us != UCS_OK) {
        status = PD_ERR_TRANSPORT;
        goto err_clear;
    }
    p->ep_open = true;
    ctx->eps_live++;
    p->state = KVX_PEER_ACTIVE; /* from here fail_now() can undo it */
    if (ctx->prom != NULL && ctx->cfg.stats_role != KVX_STATS_EXPORTER && p->prom == NULL) {
        char self[24], peer[24];
        snprintf(self, sizeof(self), "%016llx", (unsigned long long)ctx->cfg.node_id);
        snprintf(peer, sizeof(peer), "%016llx", (unsigned long long)node_id);
        if (pd_stats_create(&kvx_peer_prom_table,
                            (const char *[]){ "node", self, "peer", peer, NULL }, &p->prom) != PD_OK)
            p->prom = NULL; /* the totals still count it */
    }
    status = kvx_rkey_unpack(p, b + KVX_META_HDR + addr_len, &p->gen_rkey);
    if (status != PD_OK)
        goto err_close;
    roff = off;
    for (unsigned i = 0; i < n_regions; i++) {
        kvx_rregion_t *rr = &p->regions[i];
        rr->id = kvx_get_u32(b + roff);
        rr->n_blocks = kvx_get_u32(b + roff + 4);
        rr->block_bytes = kvx_get_u32(b + roff + 8);
        rr->n_layers = kvx_get_u16(b + roff + 30);
        rr->base = kvx_get_u64(b + roff + 12);
        rr->compat_hash = kvx_get_u64(b + roff + 20);
        size_t rk = kvx_get_u16(b + roff + 28);
        p->n_regions = i + 1;
        status = kvx_rkey_unpack(p, b + roff + KVX_META_REGION_HDR, &rr->rkey);
        if (status != PD_OK)
            goto err_close;
        roff += KVX_META_REGION_HDR + rk;
    }
    memset(&p->st, 0, sizeof(p->st));
    if (ctx->cfg.warm_peer_mappings)
        kvx_peer_warm(p);
    ctx->cs[KVX_CS_peers_added]++;
    kvx_progress(ctx);
    return PD_OK;

err_close:
    kvx_peer_fail_now(p, PD_ERR_SHUTDOWN); /* reaped by the kick */
    return status;
err_clear:
    kvx_peer_clear(p);
    return status;
}

pd_status_t kvx_peer_fail(kvx_ctx_h *ctx, uint64_t node_id, pd_status_t why)
{
    kvx_peer_t *p = kvx_peer_find(ctx, node_id);
    if (p == NULL)
        return PD_ERR_NOT_FOUND;
    kvx_peer_fail_now(p, why);
    return PD_OK;
}

pd_status_t kvx_peer_revive(kvx_ctx_h *ctx, uint64_t node_id, uint64_t incarnation)
{
    pd_status_t st = PD_ERR_NOT_FOUND;
    for (unsigned i = 0; i < KVX_TOMBSTONES; i++)
        if (ctx->dead[i].node_id == node_id && ctx->dead[i].incarnation == incarnation) {
            ctx->dead[i].node_id = 0;
            ctx->dead[i].incarnation = 0;
            st = PD_OK;
        }
    return st;
}

pd_status_t kvx_peer_remove(kvx_ctx_h *ctx, uint64_t node_id)
{
    return kvx_peer_fail(ctx, node_id, PD_ERR_SHUTDOWN);
}

/* ---- import ---------------------------------------------------------------- */

#define KVX_IMPORT_REJECT(r, st)                                              \
    do {                                                                      \
        reason = KVX_REJECT_##r;                                              \
        status = (st);                                                        \
        goto rejected;                                                        \
    } while (0)

pd_status_t kvx_handle_import(kvx_ctx_h *ctx, const void *buf, size_t len,
                              uint64_t expect_compat_hash, kvx_import_t *imp,
                              kvx_reject_t *reason_p)
{
    kvx_reject_t reason = KVX_REJECT_NONE;
    pd_status_t status;
    kvx_handle_t *h = &imp->h;

    status = kvx_handle_decode(buf, len, ctx->cfg.secret, h, &reason);
    if (status != PD_OK)
        goto rejected;
    if (h->importer_id != ctx->cfg.node_id)
        KVX_IMPORT_REJECT(WRONG_IMPORTER, PD_ERR_PERMISSION);
    kvx_peer_t *p = kvx_peer_find(ctx, h->exporter_id);
    if (p == NULL) {
        if (kvx_peer_is_dead(ctx, h->exporter_id, h->incarnation))
            KVX_IMPORT_REJECT(PEER_DOWN, PD_ERR_PEER_GONE);
        KVX_IMPORT_REJECT(UNKNOWN_PEER, PD_ERR_NOT_FOUND);
    }
    if (p->pending_fail != PD_OK)
        KVX_IMPORT_REJECT(PEER_DOWN, PD_ERR_PEER_GONE);
    const kvx_rregion_t *rr = NULL;
    for (unsigned i = 0; i < p->n_regions; i++)
        if (p->regions[i].id == h->region_id)
            rr = &p->regions[i];
    if (rr == NULL && h->incarnation == p->incarnation)
        KVX_IMPORT_REJECT(UNKNOWN_REGION, PD_ERR_BAD_HANDLE);
    kvx_handle_expect_t e = {
        .exporter_id = p->node_id,
        .incarnation = p->incarnation,
        .importer_id = ctx->cfg.node_id,
        .region_id = rr ? rr->id : h->region_id,
        .region_blocks = rr ? rr->n_blocks : 0,
        .block_bytes = rr ? rr->block_bytes : 0,
        .compat_hash = rr ? rr->compat_hash : 0,
        .n_lease_slots = p->n_slots,
        .released_gen = p->released_gen,
        .now_wall_ns = pd_wall_ns(),
    };
    status = kvx_handle_check(h, &e, &reason);
    if (status != PD_OK)
        goto rejected;
    if ((h->flags & KVX_HANDLE_F_STREAM) && rr != NULL && p->ready_words < rr->n_layers)
        KVX_IMPORT_REJECT(GEOMETRY, PD_ERR_MISMATCH); /* streamed, but no readiness words */
    if (expect_compat_hash != 0 && h->compat_hash != expect_compat_hash)
        KVX_IMPORT_REJECT(GEOMETRY, PD_ERR_MISMATCH);
    imp->peer_idx = p->idx;
    imp->imported_ns = pd_now_ns();
    return PD_OK;

rejected:
    ctx->rejects[reason]++;
    if (reason_p)
        *reason_p = reason;
    return status;
}

/* ---- pulls ------------------------------------------------------------------ */

static void kvx_op_done(void *req, ucs_status_t us, void *user_data)
{
    kvx_pull_t *pl = user_data;
    kvx_ctx_h *ctx = pl->ctx;
    ucp_request_free(req);
    assert(pl->inflight > 0);
    pl->inflight--;
    if (pl->state == KVX_PULL_ZOMBIE) {
        /* a get given up for lost came back after all: the slot can go */
        kvx_kick(ctx);
        return;
    }
    ctx->ops_in_flight--;
    if (us != UCS_OK && pl->err == PD_OK) {
        pd_status_t st = kvx_ucs_status(us);
        if (pl->peer->state == KVX_PEER_FAILED)
            st = pl->peer->fail_status;
        pl->err = st == PD_ERR_CANCELED ? PD_ERR_TRANSPORT : st;
    }
    if (pl->gen_posted && pl->inflight == 0)
        pl->gen_done = true;
    kvx_kick(ctx);
}

static void kvx_gen_done(void *req, ucs_status_t us, void *user_data)
{
    kvx_op_done(req, us, user_data);
}

/* Every block of every layer posted? */
static bool kvx_pull_all_posted(const kvx_pull_t *pl)
{
    for (uint32_t l = 0; l < pl->n_layers; l++)
        if (pl->posted[l] < pl->n)
            return false;
    return true;
}

/* Post gets until every ready block of every layer is posted or the
 * in-flight budget is used. Layer by layer, in layer order; within a layer
 * blocks adjacent on both sides merge into one get, runs above max_op_bytes
 * are split (a split block is finished before anything else is posted). */
static void kvx_pull_post(kvx_pull_t *pl)
{
    kvx_ctx_h *ctx = pl->ctx;
    const uint64_t lb = pl->h.block_bytes / pl->n_layers;
    const uint64_t max_op = ctx->cfg.max_op_bytes;
    uint32_t l = pl->cur_byte_off > 0 ? pl->split_layer : 0;

    while (pl->err == PD_OK && l < pl->n_layers &&
           ctx->ops_in_flight < ctx->cfg.max_ops_in_flight) {
        uint32_t i = pl->posted[l];
        if (i >= pl->ready[l]) {
            l++;
            continue;
        }
        uint64_t rblk = pl->remote_blocks[i];
        uint64_t lblk = pl->local_blocks[i];
        uint64_t off = pl->cur_byte_off;
        if (lblk == KVX_PULL_SKIP) { /* the importer has it (off is 0 here) */
            pl->posted[l]++;
            continue;
        }
        uint64_t len;
        if (off > 0 || lb >= max_op) {
            len = lb - off < max_op ? lb - off : max_op;
            pl->cur_byte_off += len;
            pl->split_layer = l;
            if (pl->cur_byte_off == lb) {
                pl->cur_byte_off = 0;
                pl->posted[l]++;
            }
        } else {
            uint32_t k = 1;
            while (i + k < pl->ready[l] && pl->remote_blocks[i + k] == rblk + k &&
                   pl->local_blocks[i + k] == lblk + k && (uint64_t)(k + 1) * lb <= max_op)
                k++;
            len = (uint64_t)k * lb;
            pl->posted[l] += k;
        }
        uint64_t raddr = pl->rr->base + kvx_layer_off(pl->rr->n_blocks, lb, l, rblk) + off;
        uint8_t *laddr = pl->local->base +
                         kvx_layer_off(pl->local->n_blocks, lb, l, lblk) + off;
        if (raddr != pl->prev_raddr_end || (uintptr_t)laddr != pl->prev_laddr_end)
            pl->runs++;
        pl->prev_raddr_end = raddr + len;
        pl->prev_laddr_end = (uintptr_t)laddr + len;

        ucp_request_param_t rp = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                            UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_MEMH,
            .cb.send = kvx_op_done,
            .user_data = pl,
            .memh = pl->local->memh,
        };
        void *req = ucp_get_nbx(pl->peer->ep, laddr, len, raddr, pl->rr->rkey, &rp);
        pl->ops++;
        pl->bytes += len;
        if (UCS_PTR_IS_ERR(req)) {
            pl->err = kvx_ucs_status(UCS_PTR_STATUS(req));
        } else if (req != NULL) {
            pl->inflight++;
            ctx->ops_in_flight++;
        }
    }
    if (pl->state == KVX_PULL_POSTING && kvx_pull_all_posted(pl)) {
        pl->state = KVX_PULL_DATA_WAIT;
        pl->t_posted_ns = pd_now_ns();
    }
}

/* ---- layer streaming: readiness polls ---- */

static void kvx_poll_done(void *req, ucs_status_t us, void *user_data)
{
    kvx_pull_t *pl = user_data;
    assert(pl->poll_inflight > 0);
    pl->poll_inflight--;
    kvx_op_done(req, us, user_data); /* inflight, errors, kick */
}

/* Read the lease's generation and readiness words (two gets, one round
 * trip); kvx_pull_poll_read applies them when both landed. */
static void kvx_pull_poll_post(kvx_pull_t *pl)
{
    kvx_peer_t *p = pl->peer;
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = kvx_poll_done,
        .user_data = pl,
    };
    struct { void *dst; size_t len; uint64_t raddr; } g[2] = {
        { &pl->poll_gen, sizeof(pl->poll_gen), p->gen_base + (uint64_t)pl->h.lease_slot * 8 },
        { pl->rd_words, (size_t)pl->n_layers * 8,
          p->gen_base + ((uint64_t)p->n_slots + (uint64_t)pl->h.lease_slot * p->ready_words) * 8 },
    };
    pl->poll_posted = true;
    pl->polls++;
    for (int i = 0; i < 2 && pl->err == PD_OK; i++) {
        void *req = ucp_get_nbx(p->ep, g[i].dst, g[i].len, g[i].raddr, p->gen_rkey, &rp);
        if (UCS_PTR_IS_ERR(req)) {
            pl->err = kvx_ucs_status(UCS_PTR_STATUS(req));
        } else if (req != NULL) {
            pl->inflight++;
            pl->poll_inflight++;
            pl->ctx->ops_in_flight++;
        }
    }
}

/* A poll landed: a changed generation ends the pull (STALE: the lease is
 * over, the slot may be someone else's); readiness words of another
 * generation count as nothing ready. Then poll again: at once if something
 * new became ready, else after ready_poll_ns. */
static void kvx_pull_poll_read(kvx_pull_t *pl)
{
    bool more = false, partial = false;
    pl->poll_posted = false;
    if (pl->poll_gen != pl->h.lease_gen) {
        pl->err = PD_ERR_STALE;
        return;
    }
    for (uint32_t l = 0; l < pl->n_layers; l++) {
        uint64_t w = pl->rd_words[l];
        uint32_t got = (uint32_t)(w >> 32) == (uint32_t)pl->h.lease_gen ? (uint32_t)w : 0;
        if (got > pl->n)
            got = pl->n;
        if (got > pl->ready[l]) {
            pl->ready[l] = got;
            more = true;
        }
        if (pl->ready[l] < pl->n)
            partial = true;
    }
    if (!partial) {
        pl->stream = false; /* everything is ready: no more polls */
        pl->t_ready_ns = pd_now_ns();
        return;
    }
    pl->polls_partial++;
    if (more || pl->ctx->cfg.ready_poll_ns == 0) {
        kvx_pull_poll_post(pl);
        kvx_kick(pl->ctx); /* the gets may have completed in place */
    } else {
        struct timeval tv = pd_ns_to_timeval(pl->ctx->cfg.ready_poll_ns);
        evtimer_add(pl->poll_timer, &tv);
    }
}

static void kvx_pull_poll_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvx_pull_t *pl = arg;
    if (pl->state != KVX_PULL_POSTING || pl->err != PD_OK || !pl->stream || pl->poll_posted)
        return;
    kvx_pull_poll_post(pl);
    kvx_kick(pl->ctx);
}

static void kvx_pull_free(kvx_pull_t *pl)
{
    if (pl->local_blocks != pl->local_inline)
        free(pl->local_blocks);
    pl->local_blocks = NULL;
    free(pl->rd_words); /* posted, ready, remote_blocks live in it too */
    pl->remote_blocks = NULL;
    pl->posted = pl->ready = NULL;
    pl->rd_words = NULL;
    if (pl->peer)
        pl->peer->pulls_ref--;
    pl->peer = NULL;
    pl->state = KVX_PULL_FREE;
    pl->id = 0;
}

static void kvx_pull_deliver(kvx_pull_t *pl, pd_status_t status)
{
    kvx_ctx_h *ctx = pl->ctx;
    kvx_peer_t *p = pl->peer;
    uint64_t now = pd_now_ns();
    kvx_pull_result_t res = {
        .pull_id = pl->id,
        .bytes = status == PD_OK ? pl->bytes : 0,
        .runs = pl->runs,
        .ops = pl->ops,
        .latency_ns = now - pl->t_start_ns,
        .user_tag = pl->user_tag,
        .polls = pl->polls,
        .polls_partial = pl->polls_partial,
        .ready_ns = pl->t_ready_ns ? pl->t_ready_ns - pl->t_start_ns : 0,
        .posted_ns = pl->t_posted_ns ? pl->t_posted_ns - pl->t_start_ns : 0,
    };
    unsigned c;
    switch (status) {
    case PD_OK:            c = KVX_PS_pulls_ok; break;
    case PD_ERR_TIMED_OUT: c = KVX_PS_pulls_timed_out; break;
    case PD_ERR_CANCELED:  c = KVX_PS_pulls_canceled; break;
    case PD_ERR_PEER_GONE: c = KVX_PS_pulls_peer_gone; break;
    case PD_ERR_STALE:     c = KVX_PS_pulls_stale; break;
    case PD_ERR_SHUTDOWN:  c = KVX_PS_pulls_shutdown; break;
    default:               c = KVX_PS_pulls_transport; break;
    }
    kvx_pstats_t *sets[2] = { &ctx->total, &p->st };
    for (int i = 0; i < 2; i++) {
        sets[i]->c[c]++;
        sets[i]->c[KVX_PS_runs_posted] += pl->runs;
        sets[i]->c[KVX_PS_ops_posted] += pl->ops;
        sets[i]->c[KVX_PS_pulls_streamed] += pl->polls > 0;
        sets[i]->c[KVX_PS_ready_polls] += pl->polls;
        sets[i]->c[KVX_PS_ready_polls_partial] += pl->polls_partial;
        if (status == PD_OK) {
            sets[i]->c[KVX_PS_bytes_pulled] += pl->bytes;
            kvx_pstats_pull_done(sets[i], res.latency_ns, pl->bytes, now);
        }
        if (pl->inflight)
            sets[i]->c[KVX_PS_ops_abandoned] += pl->inflight;
    }
    if (status == PD_ERR_STALE)
        ctx->rejects[KVX_REJECT_STALE]++;
    if (status == PD_OK) {
        pd_stats_observe_ns(ctx->prom, KVX_PROM_LATENCY, res.latency_ns);
        pd_stats_observe_ns(p->prom, KVX_PP_pull_latency, res.latency_ns);
    }
    evtimer_del(pl->timer);
    evtimer_del(pl->poll_timer);
    ctx->pulls_in_flight--;
    kvx_pull_cb_t cb = pl->cb;
    void *arg = pl->cb_arg;
    pl->cb = NULL;
    if (pl->inflight) {
        /* UCX never returned these gets after the forced close (seen on
         * tcp and cma with a dead peer). Their endpoint is gone, so they
         * cannot write any more: stop counting them against the in-flight
         * budget and let the peer (rkeys) go; only this slot waits. */
        pl->state = KVX_PULL_ZOMBIE;
        ctx->ops_in_flight -= pl->inflight;
        pl->peer->pulls_ref--;
        pl->peer = NULL;
    } else {
        kvx_pull_free(pl);
    }
    cb(arg, status, &res);
}

/* Advance one pull as far as it goes; deliver when done. Loop context. */
static void kvx_pull_step(kvx_pull_t *pl)
{
    switch (pl->state) {
    case KVX_PULL_FREE:
        return;
    case KVX_PULL_ZOMBIE:
        if (pl->inflight == 0)
            kvx_pull_free(pl);
        return;
    default:
        break;
    }
    if (pl->err != PD_OK) {
        if (pl->inflight == 0 || pl->peer->grace_expired)
            kvx_pull_deliver(pl, pl->err);
        return;
    }
    if (pl->stream && pl->poll_posted && pl->poll_inflight == 0)
        kvx_pull_poll_read(pl);
    if (pl->state == KVX_PULL_POSTING && pl->err == PD_OK)
        kvx_pull_post(pl);
    if (pl->err != PD_OK) {
        if (pl->inflight == 0)
            kvx_pull_deliver(pl, pl->err);
        return;
    }
    if (pl->state == KVX_PULL_DATA_WAIT && pl->inflight == 0) {
        /* every get completed = every byte landed; only now read the lease
         * generation: if it still matches, no block was reused before our
         * reads finished (vLLM #52234) */
        ucp_request_param_t rp = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                            UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = kvx_gen_done,
            .user_data = pl,
        };
        pl->state = KVX_PULL_GEN_WAIT;
        pl->gen_posted = true;
        void *req = ucp_get_nbx(pl->peer->ep, &pl->gen_word, sizeof(pl->gen_word),
                                pl->peer->gen_base + (uint64_t)pl->h.lease_slot * 8,
                                pl->peer->gen_rkey, &rp);
        if (UCS_PTR_IS_ERR(req)) {
            kvx_pull_deliver(pl, kvx_ucs_status(UCS_PTR_STATUS(req)));
            return;
        }
        if (req == NULL) {
            pl->gen_done = true;
        } else {
            pl->inflight++;
            pl->ctx->ops_in_flight++;
        }
    }
    if (pl->state == KVX_PULL_GEN_WAIT && pl->gen_done && pl->inflight == 0)
        kvx_pull_deliver(pl, pl->gen_word == pl->h.lease_gen ? PD_OK : PD_ERR_STALE);
}

static void kvx_pull_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_pull_t *pl = arg;
    if (pl->state == KVX_PULL_FREE || pl->state == KVX_PULL_ZOMBIE)
        return;
    if (pl->err == PD_OK)
        pl->err = PD_ERR_TIMED_OUT;
    if (pl->inflight > 0) {
        /* a get to a stopped peer never returns on its own: force-close
         * the endpoint, which cancels every get to that peer */
        kvx_peer_fail_now(pl->peer, PD_ERR_TIMED_OUT);
        kvx_progress(pl->ctx);
    }
    kvx_kick(pl->ctx);
}

pd_status_t kvx_pull_start(kvx_ctx_h *ctx, const kvx_import_t *imp,
                           kvx_region_h *local, const uint32_t *local_blocks,
                           uint32_t n, uint64_t deadline_at_ns, uint64_t user_tag,
                           kvx_pull_cb_t cb, void *cb_arg, uint64_t *pull_id_p)
{
    const kvx_handle_t *h = &imp->h;
    if (imp->peer_idx >= ctx->cfg.max_peers || cb == NULL)
        return PD_ERR_BAD_INPUT;
    kvx_peer_t *p = &ctx->peers[imp->peer_idx];
    if (p->node_id != h->exporter_id || p->incarnation != h->incarnation ||
        p->state == KVX_PEER_FREE)
        return PD_ERR_NOT_FOUND;
    if (p->state != KVX_PEER_ACTIVE || p->pending_fail != PD_OK)
        return PD_ERR_PEER_GONE;
    if (n != h->n_blocks || local->block_bytes != h->block_bytes)
        return PD_ERR_BAD_INPUT;
    bool stream = (h->flags & KVX_HANDLE_F_STREAM) != 0;
    for (uint32_t i = 0; i < n; i++)
        if (local_blocks[i] >= local->n_blocks && local_blocks[i] != KVX_PULL_SKIP)
            return PD_ERR_BAD_INPUT;
    kvx_rregion_t *rr = NULL;
    for (unsigned i = 0; i < p->n_regions; i++)
        if (p->regions[i].id == h->region_id)
            rr = &p->regions[i];
    if (rr == NULL)
        return PD_ERR_NOT_FOUND;
    if (rr->n_layers != local->n_layers || (stream && p->ready_words < rr->n_layers))
        return PD_ERR_BAD_INPUT; /* layouts differ / no readiness words */
    uint64_t now = pd_now_ns();
    if (deadline_at_ns <= now)
        return PD_ERR_TIMED_OUT;
    kvx_pull_t *pl = NULL;
    for (uint32_t i = 0; i < ctx->cfg.max_pulls; i++) {
        if (ctx->pulls[i].state == KVX_PULL_FREE) {
            pl = &ctx->pulls[i];
            if (i + 1 > ctx->pull_hwm)
                ctx->pull_hwm = i + 1;
            break;
        }
    }
    if (pl == NULL)
        return PD_ERR_BUSY;
    const uint32_t nl = rr->n_layers;
    /* one allocation: rd_words (nl), posted (nl), ready (nl), remote_blocks (n) */
    uint64_t *mem = malloc((size_t)nl * 16 + (size_t)n * sizeof(uint32_t));
    if (mem == NULL)
        return PD_ERR_NO_MEMORY;
    if (n <= KVX_PULL_INLINE) {
        pl->local_blocks = pl->local_inline;
    } else {
        pl->local_blocks = malloc((size_t)n * sizeof(uint32_t));
        if (pl->local_blocks == NULL) {
            free(mem);
            return PD_ERR_NO_MEMORY;
        }
    }
    memcpy(pl->local_blocks, local_blocks, (size_t)n * sizeof(uint32_t));
    pl->rd_words = mem;
    pl->posted = (uint32_t *)(void *)(mem + nl);
    pl->ready = pl->posted + nl;
    pl->remote_blocks = pl->ready + nl;
    pl->n_layers = nl;
    for (uint32_t i = 0, k = 0; i < h->n_runs; i++)
        for (uint32_t j = 0; j < h->runs[i].count && k < n; j++)
            pl->remote_blocks[k++] = h->runs[i].start + j;
    for (uint32_t l = 0; l < nl; l++) {
        pl->posted[l] = 0;
        pl->ready[l] = stream ? 0 : n;
        pl->rd_words[l] = 0;
    }
    pl->split_layer = 0;
    pl->stream = stream;
    pl->poll_posted = false;
    pl->poll_inflight = 0;
    pl->poll_gen = 0;
    pl->polls = pl->polls_partial = 0;
    pl->id = (++ctx->pull_seq << 16) | pl->idx;
    pl->state = KVX_PULL_POSTING;
    pl->peer = p;
    pl->rr = rr;
    pl->local = local;
    pl->h = *h;
    pl->n = n;
    pl->cur_byte_off = 0;
    pl->prev_raddr_end = 0;
    pl->prev_laddr_end = 0;
    pl->inflight = 0;
    pl->gen_posted = pl->gen_done = false;
    pl->gen_word = 0;
    pl->err = PD_OK;
    pl->t_start_ns = now;
    pl->t_ready_ns = pl->t_posted_ns = 0;
    pl->bytes = 0;
    pl->runs = pl->ops = 0;
    pl->user_tag = user_tag;
    pl->cb = cb;
    pl->cb_arg = cb_arg;
    p->pulls_ref++;
    ctx->pulls_in_flight++;
    ctx->total.c[KVX_PS_pulls_started]++;
    p->st.c[KVX_PS_pulls_started]++;
    struct timeval tv = pd_ns_to_timeval(deadline_at_ns - now);
    evtimer_add(pl->timer, &tv);
    /* post now (fast path); completion is always delivered from the loop */
    if (stream)
        kvx_pull_poll_post(pl);
    else
        kvx_pull_post(pl);
    kvx_kick(ctx);
    if (pull_id_p)
        *pull_id_p = pl->id;
    return PD_INPROGRESS;
}

pd_status_t kvx_pull_cancel(kvx_ctx_h *ctx, uint64_t pull_id)
{
    uint32_t idx = (uint32_t)(pull_id & 0xffff);
    if (idx >= ctx->cfg.max_pulls)
        return PD_ERR_NOT_FOUND;
    kvx_pull_t *pl = &ctx->pulls[idx];
    if (pl->id != pull_id || pl->state == KVX_PULL_FREE ||
        pl->state == KVX_PULL_ZOMBIE)
        return PD_ERR_NOT_FOUND;
    if (pl->err == PD_OK)
        pl->err = PD_ERR_CANCELED;
    kvx_kick(ctx);
    return PD_OK;
}

/* ---- notify (importer -> exporter) -------------------------------------------- */

static void kvx_notify_done(void *req, ucs_status_t us, void *user_data)
{
    kvx_notify_buf_t *nb = user_data;
    ucp_request_free(req);
    nb->in_use = false;
    nb->ctx->notifies_in_flight--;
}

static pd_status_t kvx_notify_send(kvx_ctx_h *ctx, const kvx_import_t *imp,
                                   uint8_t type, uint64_t ttl_ns)
{
    const kvx_handle_t *h = &imp->h;
    if (imp->peer_idx >= ctx->cfg.max_peers)
        return PD_ERR_BAD_INPUT;
    kvx_peer_t *p = &ctx->peers[imp->peer_idx];
    if (p->state == KVX_PEER_FREE || p->node_id != h->exporter_id ||
        p->incarnation != h->incarnation)
        return PD_ERR_NOT_FOUND;
    if (p->state != KVX_PEER_ACTIVE || p->pending_fail != PD_OK)
        return PD_ERR_PEER_GONE;
    kvx_notify_buf_t *nb = NULL;
    for (unsigned i = 0; i < KVX_NOTIFY_SLOTS; i++) {
        if (!ctx->notify[i].in_use) {
            nb = &ctx->notify[i];
            break;
        }
    }
    if (nb == NULL)
        return PD_ERR_BUSY;
    uint8_t *m = nb->msg;
    memset(m, 0, KVX_NOTIFY_BYTES);
    kvx_put_u32(m, KVX_NOTIFY_MAGIC);
    m[4] = 1;
    m[5] = type;
    kvx_put_u64(m + 8, ctx->cfg.node_id);
    kvx_put_u64(m + 16, h->incarnation);
    kvx_put_u32(m + 24, h->lease_slot);
    kvx_put_u64(m + 32, h->lease_gen);
    kvx_put_u64(m + 40, ttl_ns);
    memcpy(m + 48, h->tag, KVX_TAG_BYTES);
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = kvx_notify_done,
        .user_data = nb,
        .flags = UCP_AM_SEND_FLAG_EAGER,
    };
    void *req = ucp_am_send_nbx(p->ep, KVX_AM_NOTIFY, m, KVX_NOTIFY_BYTES,
                                NULL, 0, &rp);
    if (UCS_PTR_IS_ERR(req))
        return kvx_ucs_status(UCS_PTR_STATUS(req));
    nb->in_use = req != NULL;
    nb->ctx = ctx;
    if (req != NULL)
        ctx->notifies_in_flight++;
    ctx->total.c[KVX_PS_notifies_sent]++;
    p->st.c[KVX_PS_notifies_sent]++;
    kvx_kick(ctx); /* progress + arm after posting */
    return PD_OK;
}

pd_status_t kvx_lease_release(kvx_ctx_h *ctx, const kvx_import_t *imp)
{
    pd_status_t status = kvx_notify_send(ctx, imp, KVX_NOTIFY_RELEASE, 0);
    if (imp->peer_idx < ctx->cfg.max_peers) {
        kvx_peer_t *p = &ctx->peers[imp->peer_idx];
        /* remember even if the message could not be sent: never re-import */
        if (p->state != KVX_PEER_FREE && p->node_id == imp->h.exporter_id &&
            p->incarnation == imp->h.incarnation &&
            imp->h.lease_slot < p->n_slots &&
            p->released_gen[imp->h.lease_slot] < imp->h.lease_gen)
            p->released_gen[imp->h.lease_slot] = imp->h.lease_gen;
    }
    return status;
}

pd_status_t kvx_lease_renew(kvx_ctx_h *ctx, const kvx_import_t *imp,
                            uint64_t ttl_ns)
{
    if (ttl_ns == 0)
        return PD_ERR_BAD_INPUT;
    return kvx_notify_send(ctx, imp, KVX_NOTIFY_RENEW, ttl_ns);
}

/* ---- the kick: everything deferred out of UCX callbacks ----------------------- */

static void kvx_peer_reap(kvx_peer_t *p)
{
    kvx_ctx_h *ctx = p->ctx;
    if (p->pending_fail != PD_OK && p->state == KVX_PEER_ACTIVE) {
        pd_status_t why = p->pending_fail;
        kvx_peer_fail_now(p, why);
    }
    if (p->state != KVX_PEER_FAILED)
        return;
    if (p->close_req) {
        if (ucp_request_check_status(p->close_req) == UCS_INPROGRESS)
            return;
        ucp_request_free(p->close_req);
        p->close_req = NULL;
        p->ep_open = false;
        ctx->eps_live--;
    }
    if (p->pulls_ref == 0)
        kvx_peer_clear(p);
}

static void kvx_kick_run(kvx_ctx_h *ctx)
{
    ctx->kick_pending = false;
    for (uint32_t i = 0; i < ctx->peer_hwm; i++)
        if (ctx->peers[i].state != KVX_PEER_FREE &&
            ctx->peers[i].pending_fail != PD_OK &&
            ctx->peers[i].state == KVX_PEER_ACTIVE)
            kvx_peer_fail_now(&ctx->peers[i], ctx->peers[i].pending_fail);
    for (uint32_t i = 0; i < ctx->pull_hwm; i++)
        kvx_pull_step(&ctx->pulls[i]);
    for (uint32_t i = 0; i < ctx->peer_hwm; i++)
        if (ctx->peers[i].state == KVX_PEER_FAILED)
            kvx_peer_reap(&ctx->peers[i]);
    kvx_lease_deliver(ctx);
    kvx_progress(ctx);
    /* watchdog: 1 ms while our gets are outstanding; backing off to 100 ms
     * while the worker could not be armed (pending sends) or an exporter
     * holds leases; 1 ms again while a notify send is pending in UCX: a
     * send queued behind a full shared-memory FIFO is only retried by our
     * own progress (nobody signals the sender when space frees), yet
     * ucp_worker_arm returns OK for it - measured: release notifies stuck
     * until the lease TTL, exporter_rc=3 in kvxfer_bench_smoke) */
    if (ctx->ops_in_flight > 0 || ctx->notifies_in_flight > 0)
        ctx->wd_us = KVX_WD_MIN_US;
    if ((ctx->ops_in_flight > 0 || ctx->notifies_in_flight > 0 || !ctx->armed ||
         ctx->leases_active > 0) &&
        !evtimer_pending(ctx->ev_watchdog, NULL)) {
        struct timeval tv = { 0, (suseconds_t)ctx->wd_us };
        evtimer_add(ctx->ev_watchdog, &tv);
    }
    kvx_prom_publish(ctx);
}

static void kvx_kick_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_ctx_h *ctx = arg;
    ctx->kick_chain++;
    kvx_kick_run(ctx);
}

static void kvx_kick_later_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_ctx_h *ctx = arg;
    ctx->kick_chain = 0;
    kvx_kick_run(ctx);
}

/* ---- destroy -------------------------------------------------------------------- */

void kvx_ctx_destroy(kvx_ctx_h *ctx)
{
    if (ctx == NULL)
        return;
    ctx->destroying = true;
    for (uint32_t i = 0; i < ctx->cfg.max_pulls; i++) {
        kvx_pull_t *pl = &ctx->pulls[i];
        if (pl->state != KVX_PULL_FREE && pl->state != KVX_PULL_ZOMBIE &&
            pl->err == PD_OK)
            pl->err = PD_ERR_SHUTDOWN;
    }
    for (uint32_t i = 0; i < ctx->cfg.max_peers; i++)
        if (ctx->peers[i].state == KVX_PEER_ACTIVE)
            kvx_peer_fail_now(&ctx->peers[i], PD_ERR_SHUTDOWN);
    /* bounded drain: canceled gets and close requests return in progress */
    uint64_t until = pd_now_ns() + ctx->cfg.close_grace_ns;
    for (;;) {
        kvx_kick_run(ctx);
        bool busy = false;
        for (uint32_t i = 0; i < ctx->cfg.max_peers; i++)
            busy |= ctx->peers[i].state != KVX_PEER_FREE;
        if (!busy || pd_now_ns() > until)
            break;
    }
    for (uint32_t i = 0; i < ctx->cfg.max_peers; i++)
        ctx->peers[i].grace_expired = true;
    kvx_kick_run(ctx);
    for (uint32_t i = 0; i < ctx->cfg.max_peers; i++) {
        kvx_peer_t *p = &ctx->peers[i];
        if (p->close_req) {
            ucp_request_free(p->close_req);
            p->close_req = NULL;
        }
        if (p->state != KVX_PEER_FREE)
            kvx_peer_clear(p); /* gets that never came back: rkeys go too */
        event_free(p->grace_timer);
    }
    for (uint32_t i = 0; i < ctx->cfg.max_leases; i++)
        if (ctx->leases[i].state == KVX_LEASE_ACTIVE)
            kvx_lease_end(&ctx->leases[i], KVX_LEASE_REVOKED);
    kvx_lease_deliver(ctx);
    for (uint32_t i = 0; i < ctx->cfg.max_leases; i++)
        event_free(ctx->leases[i].timer);
    for (uint32_t i = 0; i < ctx->cfg.max_pulls; i++) {
        kvx_pull_t *pl = &ctx->pulls[i];
        if (pl->local_blocks && pl->local_blocks != pl->local_inline)
            free(pl->local_blocks);
        free(pl->rd_words);
        event_free(pl->timer);
        event_free(pl->poll_timer);
    }
    event_free(ctx->ev_efd);
    event_free(ctx->ev_kick);
    event_free(ctx->ev_watchdog);
    event_free(ctx->ev_kick_later);
    /* The worker goes BEFORE any memory is unmapped: over tcp an exporter
     * serves gets with active-message replies that its worker copies out of
     * the arena (uct_tcp_ep_am_bcopy), and endpoints other nodes created to
     * us can still hold such replies. Unmapping first made the worker read
     * freed memory at destroy (seen as a SEGV after a pull interrupted by
     * SIGSTOP). */
    ucp_worker_release_address(ctx->worker, ctx->addr);
    ucp_worker_destroy(ctx->worker);
    ctx->worker = NULL;
    for (unsigned i = 0; i < KVX_MAX_REGIONS; i++)
        kvx_region_deregister(&ctx->regions[i]);
    ucp_rkey_buffer_release(ctx->gen_rkey_buf);
    ucp_mem_unmap(ctx->ucp, ctx->gen_memh);
    ucp_cleanup(ctx->ucp);
    pd_stats_destroy(ctx->prom);
    free(ctx->leases);
    free(ctx->peers);
    free(ctx->pulls);
    free(ctx);
}

pd_stats_t *kvx_stats_set(kvx_ctx_h *ctx)
{
    kvx_prom_publish(ctx);
    return ctx->prom;
}

size_t kvx_stats_sets(kvx_ctx_h *ctx, pd_stats_t **sets, size_t cap)
{
    size_t n = 0;
    kvx_prom_publish(ctx);
    if (ctx->prom != NULL && n < cap)
        sets[n++] = ctx->prom;
    for (uint32_t i = 0; i < ctx->peer_hwm && n < cap; i++)
        if (ctx->peers[i].prom != NULL)
            sets[n++] = ctx->peers[i].prom;
    return n;
}

/* ---- statistics ------------------------------------------------------------------ */

void kvx_gauges(const kvx_ctx_h *ctx, kvx_gauges_t *g)
{
    memset(g, 0, sizeof(*g));
    g->leases_active = ctx->leases_active;
    g->blocks_pinned = ctx->blocks_pinned;
    g->pulls_in_flight = ctx->pulls_in_flight;
    g->ops_in_flight = ctx->ops_in_flight;
    for (uint32_t i = 0; i < ctx->peer_hwm; i++)
        g->peers_live += ctx->peers[i].state != KVX_PEER_FREE;
    g->rkeys_live = ctx->rkeys_live;
    g->eps_live = ctx->eps_live;
}

uint64_t kvx_rejects(const kvx_ctx_h *ctx, kvx_reject_t reason)
{
    return (unsigned)reason < KVX_REJECT__COUNT ? ctx->rejects[reason] : 0;
}

uint64_t kvx_counter(const kvx_ctx_h *ctx, const char *name)
{
    for (unsigned i = 0; i < KVX_PS__COUNT; i++)
        if (strcmp(name, kvx_ps_names[i]) == 0)
            return ctx->total.c[i];
    for (unsigned i = 0; i < KVX_CS__COUNT; i++)
        if (strcmp(name, kvx_cs_names[i]) == 0)
            return ctx->cs[i];
    return UINT64_MAX;
}

static void kvx_pstats_json(cJSON *o, const kvx_pstats_t *s)
{
    for (unsigned i = 0; i < KVX_PS__COUNT; i++)
        cJSON_AddNumberToObject(o, kvx_ps_names[i], (double)s->c[i]);
    cJSON *lat = cJSON_AddObjectToObject(o, "latency");
    if (lat) {
        cJSON_AddNumberToObject(lat, "count", (double)s->hist_n);
        cJSON_AddNumberToObject(lat, "p50_ns", (double)kvx_hist_quantile(s, 0.50));
        cJSON_AddNumberToObject(lat, "p99_ns", (double)kvx_hist_quantile(s, 0.99));
    }
    uint64_t now = pd_now_ns(), bw = s->bw_last;
    if (bw == 0 && s->bw_win_start_ns && now > s->bw_win_start_ns)
        bw = (uint64_t)((double)s->bw_win_bytes * 1e9 /
                        (double)(now - s->bw_win_start_ns));
    cJSON_AddNumberToObject(o, "recent_bw_bytes_per_s", (double)bw);
}

static const char *kvx_peer_state_name(kvx_peer_state_t s)
{
    return s == KVX_PEER_ACTIVE ? "active" : s == KVX_PEER_FAILED ? "failed" : "free";
}

cJSON *kvx_stats_json(const kvx_ctx_h *ctx)
{
    char id[32];
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return NULL;
    snprintf(id, sizeof(id), "%016llx", (unsigned long long)ctx->cfg.node_id);
    cJSON_AddStringToObject(o, "node_id", id);
    snprintf(id, sizeof(id), "%016llx", (unsigned long long)ctx->incarnation);
    cJSON_AddStringToObject(o, "incarnation", id);
    kvx_gauges_t g;
    kvx_gauges(ctx, &g);
    cJSON *gj = cJSON_AddObjectToObject(o, "gauges");
    if (gj) {
        cJSON_AddNumberToObject(gj, "leases_active", g.leases_active);
        cJSON_AddNumberToObject(gj, "blocks_pinned", (double)g.blocks_pinned);
        cJSON_AddNumberToObject(gj, "pulls_in_flight", g.pulls_in_flight);
        cJSON_AddNumberToObject(gj, "ops_in_flight", g.ops_in_flight);
        cJSON_AddNumberToObject(gj, "peers_live", g.peers_live);
        cJSON_AddNumberToObject(gj, "rkeys_live", g.rkeys_live);
        cJSON_AddNumberToObject(gj, "eps_live", g.eps_live);
    }
    cJSON *t = cJSON_AddObjectToObject(o, "total");
    if (t) {
        kvx_pstats_json(t, &ctx->total);
        for (unsigned i = 0; i < KVX_CS__COUNT; i++)
            cJSON_AddNumberToObject(t, kvx_cs_names[i], (double)ctx->cs[i]);
    }
    cJSON *rj = cJSON_AddObjectToObject(o, "rejected");
    for (unsigned i = 1; rj && i < KVX_REJECT__COUNT; i++)
        cJSON_AddNumberToObject(rj, kvx_reject_name(i), (double)ctx->rejects[i]);
    cJSON *pa = cJSON_AddArrayToObject(o, "peers");
    for (uint32_t i = 0; pa && i < ctx->cfg.max_peers; i++) {
        const kvx_peer_t *p = &ctx->peers[i];
        if (p->state == KVX_PEER_FREE)
            continue;
        cJSON *pj = cJSON_CreateObject();
        if (pj == NULL)
            break;
        snprintf(id, sizeof(id), "%016llx", (unsigned long long)p->node_id);
        cJSON_AddStringToObject(pj, "node_id", id);
        snprintf(id, sizeof(id), "%016llx", (unsigned long long)p->incarnation);
        cJSON_AddStringToObject(pj, "incarnation", id);
        cJSON_AddStringToObject(pj, "state", kvx_peer_state_name(p->state));
        cJSON_AddBoolToObject(pj, "err_mode_peer", p->err_mode_peer);
        kvx_pstats_json(pj, &p->st);
        cJSON_AddItemToArray(pa, pj);
    }
    return o;
}
