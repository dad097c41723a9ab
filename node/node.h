/* node.h - what every KV-holding daemon (pd-prefill, pd-decode) has, once:
 * the shared config rows, boot (log, router address, secret, daemon id,
 * engine + model, event loop, kvx context, the one KV region and its block
 * pool, stats, compute runner, admin socket, /metrics), the router session
 * (HELLO, heartbeats, up/down, the ready file), drain, the common admin
 * commands (kv, xfer, session, drain), teardown, the live request table,
 * and the node-id / lease-id helpers.
 *
 * A role plugs in through node_role_t: its message callbacks (request,
 * cancel, ...), how it cancels everything, fills its heartbeat load
 * figures, adds to the kv / session admin replies, and its own admin
 * commands. The role's daemon struct starts with a node_t, so the one
 * callback argument (the session's, the admin's) is both.
 *
 * One loop thread owns all of it; nothing here runs on the compute thread.
 * Depends on common, proto, kvxfer, engine (+ engine runner). */
#ifndef NODE_H
#define NODE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <event2/event.h>

#include "eng.h"
#include "eng_gram.h"
#include "eng_runner.h"
#include "eng_sample.h"
#include "kvx.h"
#include "kvx_blocks.h"
#include "kvx_prefix.h"
#include "pd_admin.h"
#include "pd_boot.h"
#include "pd_config.h"
#include "pd_cpuacct.h"
#include "pd_cpuarb.h"
#include "pd_idhash.h"
#include "pd_loop.h"
#include "pd_memledger.h"
#include "pd_stats.h"
#include "proto_auth.h"
#include "proto_session.h"

/* ---- config ------------------------------------------------------------- */

/* The rows every node has; a role's config struct starts with one of these
 * as member `node`. */
typedef struct {
    char *id;
    char *router;
    pd_boot_cfg_t boot;         /* secret, admin socket, log */
    char *model;
    char *engine;
    uint64_t threads;
    uint64_t block_tokens;
    int kv_dtype;
    int kv_dtype_k;             /* node_kv_dtypes_kv: "same" = kv_dtype */
    int kv_dtype_v;
    uint64_t kv_blocks;
    bool prefix_cache;
    uint64_t kv_events_ns;
    char *kv_listen;
    uint64_t heartbeat_ns;
    uint64_t reconnect_min_ns;
    uint64_t drain_timeout_ns;
    char *ready_file;
    char *metrics_listen;
    char *etcd;
    char *etcd_prefix;
    uint64_t etcd_ttl_ns;
    uint64_t etcd_routers_max;
    uint64_t mem_budget;
    char *mem_ledger;
    bool print_arena_bytes;
    int64_t nice;
    uint64_t cpu_share;
    char *cpu_arbiter;
    int qdot;
    uint64_t ep_size;           /* expert parallelism: ranks of the group (1: the whole model) */
    uint64_t ep_rank;           /* this daemon's rank, < ep_size */
    char *ep_dir;               /* the group's rendezvous directory */
    uint64_t ep_timeout_ns;     /* every exchange's deadline */
    int ep_tls;                 /* node_ep_tls: the window's transport */
    bool ep_overlap;            /* two micro-batches per pass (eng_load_opts_t) */
} node_config_t;

extern const char *const node_kv_dtypes[];   /* { "f32", "f16", "q8_0", "q4_0", "bf16", "fp8_e4m3", NULL } (eng_kv_dtype_t order) */
extern const char *const node_kv_dtypes_kv[]; /* node_kv_dtypes then "same" (= kv-dtype) */
#define NODE_KV_SAME 6                         /* "same"'s index in node_kv_dtypes_kv */
extern const char *const node_ep_tls[];     /* { "shm", "tcp", "auto", NULL } */
extern const char *const node_qdot_paths[];  /* { "auto", "amx", "vnni", "avx2", "scalar", "off", NULL } */

/* Rows over the role's config struct stype (member `node`), in --help
 * order: NODE_HEAD_ROWS, the role's own rows, NODE_TAIL_ROWS, PD_CFG_END. */
#define NODE_ROW(stype, field, key, type, def, help, min, max, en)            \
    PD_CFG_ROW(stype, node.field, key, type, def, help, min, max, en),
#define NODE_HEAD_ROWS(stype, id_help)                                        \
    NODE_ROW(stype, id, "id", STRING, NULL, id_help, 0, 0, NULL)              \
    NODE_ROW(stype, router, "router", STRING, NULL, "router control address host:port, or a comma-separated list (one session per router, at most 16); default 127.0.0.1:7000 unless etcd is set", 0, 0, NULL) \
    PD_BOOT_ROWS(stype, node.boot),                                           \
    NODE_ROW(stype, model, "model", STRING, NULL, "GGUF path or sim:<preset or spec>", 0, 0, NULL) \
    NODE_ROW(stype, engine, "engine", STRING, NULL, "llama|sim (default: from model)", 0, 0, NULL) \
    NODE_ROW(stype, threads, "threads", UINT, "0", "engine threads (0 = the CPUs it may use: affinity, capped by the cgroup CPU quota)", 0, 1024, NULL) \
    NODE_ROW(stype, block_tokens, "block-tokens", UINT, "16", "tokens per KV block", 1, 4096, NULL) \
    NODE_ROW(stype, kv_dtype, "kv-dtype", ENUM, "f16", "KV dtype of K and V: f32|f16|bf16|q8_0|fp8_e4m3|q4_0 (bytes per 32 values: 128|64|64|34|33|18; q8_0, q4_0: llama.cpp block_q8_0/q4_0; fp8_e4m3: OCP MXFP8, an E8M0 scale per 32 e4m3; the block formats need head_dim a multiple of 32, bf16 of 16)", 0, 0, node_kv_dtypes) \
    NODE_ROW(stype, kv_dtype_k, "kv-dtype-k", ENUM, "same", "K's dtype apart from V's (same: kv-dtype)", 0, 0, node_kv_dtypes_kv) \
    NODE_ROW(stype, kv_dtype_v, "kv-dtype-v", ENUM, "same", "V's dtype apart from K's (same: kv-dtype)", 0, 0, node_kv_dtypes_kv) \
    NODE_ROW(stype, kv_blocks, "kv-blocks", UINT, "1024", "KV blocks in the arena", 1, 1e8, NULL) \
    NODE_ROW(stype, prefix_cache, "prefix-cache", BOOL, "true", "reuse the KV of cached prompt prefixes (full blocks)", 0, 0, NULL) \
    NODE_ROW(stype, kv_events_ns, "kv-events-interval", DURATION, "50ms", "prefix cache: batch store/remove events to the router this long", 1e6, 10e9, NULL) \
    NODE_ROW(stype, kv_listen, "kv-listen", STRING, NULL, "KV plane (UCX) address or interface: an IP address of this host, an interface name, or * for every interface; default: loopback when every router address is loopback and etcd is off, else every interface", 0, 0, NULL)
#define NODE_TAIL_ROWS(stype)                                                 \
    NODE_ROW(stype, heartbeat_ns, "heartbeat-interval", DURATION, "500ms", "heartbeat interval before the router's ACK", 1e6, 60e9, NULL) \
    NODE_ROW(stype, reconnect_min_ns, "reconnect-min", DURATION, "1s", "first reconnect backoff (doubles to 30 s)", 1e6, 60e9, NULL) \
    NODE_ROW(stype, drain_timeout_ns, "drain-timeout", DURATION, "30s", "SIGTERM: max wait for in-flight work", 0, 3600e9, NULL) \
    NODE_ROW(stype, ready_file, "ready-file", STRING, NULL, "write JSON here once registered with the router", 0, 0, NULL) \
    NODE_ROW(stype, metrics_listen, "metrics.listen", STRING, NULL, "HTTP /metrics + /health address host:port (port 0: any; default off)", 0, 0, NULL) \
    NODE_ROW(stype, etcd, "etcd", STRING, NULL, "etcd client address host:port: register daemons/<id>, connect to every routers/* found (off by default)", 0, 0, NULL) \
    NODE_ROW(stype, etcd_prefix, "etcd.prefix", STRING, "/pdserve/default/", "deployment prefix in etcd (ends with /)", 0, 0, NULL) \
    NODE_ROW(stype, etcd_ttl_ns, "etcd.ttl", DURATION, "5s", "lease TTL of the daemon's etcd key", 1e9, 3600e9, NULL) \
    NODE_ROW(stype, etcd_routers_max, "etcd.routers-max", UINT, "8", "routers taken from etcd at most (signed entries, in key order; the static list's are extra)", 1, 16, NULL) \
    NODE_ROW(stype, mem_budget, "mem.budget", SIZE, "0", "host-wide cap on the KV arenas of this host's daemons, shared through mem.ledger (0: 90% of MemAvailable + arenas already committed, or the cgroup room)", 0, 0, NULL) \
    NODE_ROW(stype, mem_ledger, "mem.ledger", STRING, PD_MEMLEDGER_DEFAULT, "file where the daemons of one host reserve their KV arenas (flock'd; dead processes reclaimed)", 0, 0, NULL) \
    NODE_ROW(stype, print_arena_bytes, "print-arena-bytes", BOOL, "false", "load the model, print the KV arena's size in bytes and exit (pdctl's memory plan check)", 0, 0, NULL) \
    NODE_ROW(stype, nice, "nice", INT, "0", "scheduling niceness of every thread (setpriority at boot, before the engine's): daemons sharing a host's cores with threads = all of them lend their idle cores; the lower value wins when both are busy (e.g. prefill 10, decode 0: the decode's steps first, the prefill takes what they leave); a daemon leading its own session (pdctl, systemd) also gives its autogroup that nice, else with sched_autogroup_enabled sessions share the CPU first and nice would count only inside one. Below 0 needs CAP_SYS_NICE", -20, 19, NULL) \
    NODE_ROW(stype, cpu_share, "cpu-share", UINT, "0", "this daemon's share of the host's cores in milli-cores (1000 = one core; 0 = its engine threads): what pd_cpu_borrowed/lent_seconds and pdctl top's BORROW/LENT count against. Accounting only: lending itself is the kernel's (nice)", 0, 1048576, NULL) \
    NODE_ROW(stype, cpu_arbiter, "cpu-arbiter", STRING, PD_CPUARB_DEFAULT, "the host's core arbiter: a shared-memory table where the daemons of one host say how many threads they want now; a decode with tpot-target runs its steps on fewer threads while prefills want cores and its step time stays within the target (off: none)", 0, 0, NULL) \
    NODE_ROW(stype, qdot, "qdot", ENUM, "auto", "integer-dot path of quantized weights (what PD_QDOT sets; pdctl passes no PD_* to daemons): auto (the environment's PD_QDOT, else the best the CPU has: amx > vnni > avx2 > scalar), amx|vnni|avx2|scalar cap the path, off = the exact f32 path; the boot log line says which runs", 0, 0, node_qdot_paths) \
    NODE_ROW(stype, ep_size, "ep-size", UINT, "1", "expert parallelism (issue 36): ranks of this daemon's EP group; > 1 loads only this rank's slice of a MoE model's routed experts (ep-size must divide the expert count). a decode only: the ranks meet through ep-dir, then every step is a round of the group (a vote, then the same number of forward passes on every rank, idle ones where a rank has nothing: an idle group votes every 2 ms); attention is per rank (its own requests and KV); a rank lost fails its streams and the daemon exits 1 (decode/README.md)", 1, 256, NULL) \
    NODE_ROW(stype, ep_rank, "ep-rank", UINT, "0", "this daemon's rank in its EP group, 0..ep-size-1 (it holds experts [ep-rank*E/ep-size, (ep-rank+1)*E/ep-size))", 0, 255, NULL) \
    NODE_ROW(stype, ep_dir, "ep-dir", STRING, NULL, "ep-size > 1: the group's rendezvous directory, one every rank sees (one host, or a filesystem the hosts share): each rank writes rank-<r>.meta (its exchange window's metadata) and reads the others' (waits up to 60 s; sizes capped, every field validated); the group's ranks must start with it empty", 0, 0, NULL) \
    NODE_ROW(stype, ep_timeout_ns, "ep-timeout", DURATION, "5s", "ep-size > 1: deadline of every dispatch and combine exchange of the group", 1e6, 600e9, NULL) \
    NODE_ROW(stype, ep_overlap, "ep-overlap", BOOL, "false", "ep-size > 1: two micro-batches per forward pass, each's dispatch and combine in flight while the other computes its attention or experts (the same tokens; every rank of the group must agree: set it in [decode]; docs/BENCHMARKS.md 'Two micro-batches')", 0, 0, NULL) \
    NODE_ROW(stype, ep_tls, "ep-tls", ENUM, "shm", "ep-size > 1: the exchange window's transport: shm (the group on one host), tcp (ranks on several hosts: one eager active message per peer and phase, on kv-listen's interface), auto (UCX's choice, UCX_TLS)", 0, 0, node_ep_tls)

/* ---- role tables ---------------------------------------------------------- */

/* The counters every role keeps, first in its stats list: X(name, kind,
 * help); req names its request message, the others say what each outcome
 * means for the role. */
#define NODE_REQ_STATS(X, req, completed_help, failed_help, canceled_help)    \
    X(accepted,  COUNTER, req "s admitted")                                   \
    X(completed, COUNTER, completed_help)                                     \
    X(failed,    COUNTER, failed_help)                                        \
    X(canceled,  COUNTER, canceled_help)                                      \
    X(rejected,  COUNTER, req "s refused at admission")                       \
    X(live,      GAUGE,   "requests not yet terminal")

/* The prefix cache's counters, the same on every KV-holding role: prompt
 * tokens whose KV came from the cache, and the KV bytes that were neither
 * computed nor pulled for them. */
#define NODE_CACHE_STATS(X)                                                   \
    X(cached_tokens, COUNTER, "prompt tokens whose KV came from the prefix cache") \
    X(saved_bytes,   COUNTER, "KV bytes neither computed nor pulled (cached blocks)")

/* Their ids, the same in every role's stats enum (they come first). */
#define NODE_STAT_ENUM(name, kind, help) NODE_STAT_##name,
enum { NODE_REQ_STATS(NODE_STAT_ENUM, "", "", "", "") NODE_STAT__COUNT };
#undef NODE_STAT_ENUM

/* A role's Prometheus rows for them (first in its pd_stat_prom_t table):
 * the three outcomes as one labeled family, pd_<role>_requests{outcome}. */
#define NODE_REQ_STAT_PROM                                                     \
    PD_STAT_PROM_LABEL("completed", "requests", "outcome", "completed",        \
                       "requests ended, by outcome"),                         \
    PD_STAT_PROM_LABEL("failed", "requests", "outcome", "failed", NULL),       \
    PD_STAT_PROM_LABEL("canceled", "requests", "outcome", "canceled", NULL)

/* Over a role's X(NAME, "text") state list: the names array entries. */
#define NODE_STATE_NAME(name, text) text,

/* ---- requests ----------------------------------------------------------- */

/* ---- router links ------------------------------------------------------- */

/* At most this many routers per daemon (static list or found in etcd). */
#define NODE_ROUTERS_MAX 16u

typedef struct node node_t;

/* One router: its address and the authenticated session to it. A daemon
 * keeps one per router, each connecting, registering, heartbeating and
 * reconnecting on its own; a request belongs to the session it arrived on
 * and is answered only there. epoch is the session serial: a fresh
 * node-wide number on every up and every down of this link, so a reply
 * never reaches a later session and request ids (router-generated, unique
 * only per router) are keyed by it. Slots live in node_t.links and never
 * move. */
typedef struct node_link {
    node_t *n;
    uint32_t idx;                       /* slot in n->links (bit in masks) */
    bool in_use;
    char addr[128];                     /* host:port */
    proto_session_t *sess;
    uint64_t epoch;                     /* current session serial */
    bool shut;                          /* drain: this session's shutdown is done */
    bool from_etcd;                     /* found in etcd (else the static list) */
    int64_t etcd_rev;                   /* mod revision of its etcd key last seen */
} node_link_t;

/* The part of a role's request the node keeps: id, table + live list
 * links, the router session it came on, its KV blocks. A role's request
 * embeds one as member `nr` (NODE_REQ gives the role's request back). */
typedef struct node_req {
    pd_idhash_node_t hnode;             /* node->by_id, keyed by key */
    struct node_req *prev, *next;       /* live list, newest first */
    char id[PROTO_REQID_MAX + 1];       /* the router's wire id */
    char key[PROTO_REQID_MAX + 24];     /* "<epoch hex>/<id>": unique across routers */
    node_link_t *link;                  /* the router it came from */
    uint64_t epoch;                     /* that link's session serial then */
    uint32_t n_blocks;
    uint32_t *blocks;                   /* (n_blocks) arena block ids */
    bool blocks_held;
} node_req_t;

#define NODE_REQ(n, type) PD_CONTAINER_OF((n), type, nr)
/* for (type *r over the live list, newest first); safe against unlinking r.
 * The body must not `break` (it would only leave the inner loop). */
#define NODE_FOR_EACH(node, type, r)                                          \
    for (node_req_t *r##_n_ = (node)->live, *r##_next_;                       \
         r##_n_ != NULL && (r##_next_ = r##_n_->next, 1); r##_n_ = r##_next_) \
        for (type *r = NODE_REQ(r##_n_, type); r != NULL; r = NULL)

/* ---- the role ----------------------------------------------------------- */

typedef struct node_kve node_kve_t;

/* KV peers the router told us about (PEER_INFO): the daemons this node may
 * pull from (a decode: prefills and other decodes; a prefill: decodes). */
#define NODE_MAX_PEERS 64u

typedef struct {
    char id[PROTO_DAEMON_ID_MAX + 1];
    uint64_t incarnation;
    uint64_t node_id;
    bool live;
    uint32_t links;                     /* routers that reported it up (bit = link idx):
                                           PEER_DOWN fails it only when none is left */
} node_peer_t;

/* A role's handler of one session message type. */
typedef void (*node_msg_cb_t)(node_t *n, node_link_t *from, const proto_msg_t *msg);
typedef struct {
#define NODE_MSG_CB_FIELD(NAME, name, code, max) node_msg_cb_t on_##name;
    PROTO_MSG_LIST(NODE_MSG_CB_FIELD)
#undef NODE_MSG_CB_FIELD
} node_msgs_t;

typedef struct {
    const char *name;                   /* "prefill": log component, ready role, default id */
    const pd_cfg_schema_t *schema;      /* the role's config rows (for `config show`) */
    const pd_stats_table_t *stats;      /* the role's counters (NODE_REQ_STATS first) */
    uint16_t proto_role;                /* PROTO_ROLE_* */
    uint32_t caps;                      /* PROTO_CAP_* */
    uint32_t cpu_prio;                  /* in the host's core arbiter: 0 first (decode) */
    /* Session messages for the role (request, cancel, release, peer info,
     * ...), from any router: msgs.on_<type>(n, from, msg), `from` the link
     * (router session) it arrived on. ERROR from the router is logged by
     * the node unless the role sets on_error; types without a callback are
     * dropped. */
    node_msgs_t msgs;
    /* The session of router `from` is lost (its epoch is already bumped):
     * stop every live request that came on it without replying, and forget
     * what that router told (decode: its peer reports). from == NULL:
     * teardown, every request. */
    void (*cancel_all)(node_t *n, const node_link_t *from);
    /* Fill the role's heartbeat load figures (queue_depth, running_seqs,
     * leases, outstanding_prefill_tokens); the node sets flags and blocks. */
    void (*fill_hb)(node_t *n, proto_heartbeat_t *hb);
    /* Extra fields of the admin `kv` / `session` replies. May be NULL. */
    void (*adm_kv)(node_t *n, cJSON *reply);
    void (*adm_session)(node_t *n, cJSON *reply);
    const pd_admin_cmd_t *cmds;         /* the role's own admin commands (arg = node) */
    const char *xfer_help;              /* help line of `xfer` */
    const char *session_help;           /* help line of `session` */
    /* A lease granted with node_export ended (released by the importer,
     * expired, revoked): r is the request it was granted for. May be NULL
     * for a role that never exports. */
    void (*on_lease_end)(node_t *n, node_req_t *r, kvx_lease_end_t why);
} node_role_t;

struct node {
    const node_role_t *role;
    struct kvx_win *ep_win;             /* ep-size > 1: the group's window (node_ep.c) */
    uint64_t ep_votes;                  /* votes made (compute thread): the slot's parity */
    uint32_t ep_pass_rows;              /* rows of one forward pass of the engine's step */
    bool ep_group_drained;              /* every rank voted drained: this one may stop */
    node_config_t *cfg;                 /* the `node` member of the role's config */
    pd_loop_t *loop;
    pd_admin_t *admin;
    pd_stats_t *stats;                  /* the role's table */
    proto_stats_t pstats;
    proto_auth_secret_t secret;
    bool have_secret;
    /* engine */
    const char *engine;
    const eng_ops_t *ops;
    eng_model_t *model;
    const eng_kv_geom_t *geom;
    eng_runner_t *runner;
    eng_sample_scratch_t scratch;       /* compute thread only */
    int32_t eos_ids[ENG_SAMPLE_MAX_EOS];
    uint32_t n_eos;
    eng_gram_vocab_t *gram_vocab;       /* token pieces for structured output (NULL:
                                           no tokenizer, response_format refused) */
    uint8_t *gram_scratch;              /* (vocab) compute thread only */
    float *gram_raw;                    /* (vocab) unmasked logits, for logprobs */
    /* kv */
    kvx_ctx_h *kvx;
    kvx_region_h *region;
    kvx_blocks_t *blocks;
    kvx_prefix_t *prefix;               /* NULL when prefix-cache is off */
    node_kve_t *kve;                    /* its events to the router (NULL: off) */
    uint8_t meta[KVX_META_MAX_BYTES];
    size_t meta_len;
    char kv_dev[64];                    /* kv-listen's interface, "*" = every one */
    char kv_addr[64];                   /* its address (the first IPv4, else IPv6), "*" */
    node_req_t **lease_reqs;            /* (max_leases) request per live lease slot */
    uint32_t max_leases;
    node_peer_t peers[NODE_MAX_PEERS];  /* KV peers (PEER_INFO / PEER_DOWN) */
    /* control plane: one link per router */
    node_link_t links[NODE_ROUTERS_MAX];
    uint32_t n_links;                   /* slots in use */
    uint64_t serial;                    /* last session serial handed out */
    uint32_t n_shut;                    /* drain: sessions still flushing */
    struct pd_member *member;           /* etcd membership, NULL when off */
    struct event *member_ev;            /* periodic reconcile with etcd */
    bool member_up;
    uint64_t member_sig;                /* of the last etcd set (log once per change) */
    uint8_t etcd_key[32];               /* signs / verifies etcd values (from the secret) */
    /* etcd entries not used, each counted once (by mod revision): a key
     * outside the shape routers/<id>, a value that is no address, a
     * signature missing or wrong, signed ones past etcd.routers-max */
    uint64_t etcd_bad_key, etcd_bad_value, etcd_forged, etcd_over_max;
    int64_t etcd_counted[32];           /* revisions already counted (ring) */
    uint32_t etcd_counted_next;
    bool registered_once;
    char daemon_id[PROTO_DAEMON_ID_MAX + 1];
    char mem_name[PD_MEMLEDGER_NAME_MAX]; /* "pd-<role> <id>" in the memory ledger */
    bool mem_reserved;                  /* released at teardown */
    uint64_t incarnation;
    /* requests */
    pd_idhash_t by_id;                  /* live requests by id */
    node_req_t *live;
    uint32_t n_live;
    bool draining;
    bool stopping;                      /* no replies, no new work */
    struct event *drain_ev;
    /* /metrics (node_metrics.c) */
    struct pd_metrics_http *mh;
    pd_stats_t *pool;
    /* CPU use against cpu-share (node_metrics.c; admin `stats`, /metrics) */
    pd_cpuacct_t cpu;
    struct pd_cpuarb *arb;              /* the host's core arbiter, NULL: off */
    uint32_t threads;                   /* the engine's threads (threads, or the CPU budget) */
    pd_stats_t *cpu_stats;
    struct event *cpu_ev;
    uint64_t cpu_pub_ms[4];             /* used, borrowed, lent, idle: published */
    /* admin command tables (borrowed by pd_admin) */
    pd_admin_cmd_t cmds_head[2];
    pd_admin_cmd_t cmds_tail[4];
};

/* ---- boot and teardown (node_boot.c) ------------------------------------ */

typedef struct {
    uint32_t max_batch;                 /* the engine's batch size */
    /* kvx options beyond node id / secret (prefill: lease callbacks). May
     * be NULL. */
    void (*kvx_config)(node_t *n, kvx_config_t *kc);
} node_boot_opts_t;

/* Boot n (zeroed, role and cfg set): the shared checks, log, secret, id,
 * engine, loop, kvx, region + pool, stats, runner, admin, /metrics. The
 * role then allocates its own parts and calls node_start. Returns
 * PD_CONFIG_RUN on success, else the exit status (2 usage, 1 failure) after
 * one line on stderr or in the log. */
int node_boot(node_t *n, const node_boot_opts_t *o);
/* ep-size > 1: create the exchange window, meet the group's other ranks
 * through ep-dir, set the engine's transport and run one idle pass of the
 * group (node_ep.c). Expected: PD_ERR_BAD_INPUT (no ep-dir, an engine
 * without EP), PD_ERR_IO / PD_ERR_TOO_BIG (a rank's file), kvx_win's. */
pd_status_t node_ep_join(node_t *n, char *err, size_t err_len);
/* The end of an EP rank's boot: every rank's boot done (ep-dir), then one
 * idle pass of the group. Expected: PD_ERR_TIMED_OUT, the window's. */
pd_status_t node_ep_ready(node_t *n, char *err, size_t err_len);
void node_ep_leave(node_t *n);

/* The step barrier's vote (issue 36): before each round of forward passes
 * every rank states how many passes its own work needs and whether it is
 * drained; node_ep_vote exchanges the votes (window slots 2 and 3,
 * alternating: a rank's next vote into a cell of one slot follows the
 * owner's reading of it, since the owner put its vote of the round in
 * between) and returns the group's: the most passes any rank needs, and
 * NODE_EP_DRAINED only when every rank is. Compute thread (the window's).
 * Expected: the window's statuses (PD_ERR_TIMED_OUT: a rank did not vote
 * by ep-timeout; the window is failed from then on), PD_ERR_BAD_INPUT (a
 * peer's vote malformed). */
#define NODE_EP_DRAINED 1u
typedef struct {
    uint32_t passes;                    /* forward passes this round */
    uint32_t flags;                     /* NODE_EP_DRAINED */
} node_ep_vote_t;
pd_status_t node_ep_vote(node_t *n, const node_ep_vote_t *mine, node_ep_vote_t *group);
/* The schema's --check-config hook (pd_cfg_schema_t.check) for a daemon
 * config whose first member is node_config_t: the deployment secret as
 * node_boot would load it (file readable, long enough; or an allowed
 * --insecure-no-auth). */
pd_status_t node_check_config(const void *target, char *err, size_t err_len);

/* Open one session per router of the `router` list, install the SIGTERM drain, log the boot line
 * (extra: the role's part of it, e.g. ", max-batch 32"), run the loop.
 * Returns the loop's status (PD_OK on a clean stop); on a session error,
 * PD_ERR_BAD_INPUT after a line on stderr. */
pd_status_t node_run(node_t *n, const char *extra);

/* Tear down (no replies from here on): session, runner (the jobs in
 * flight come back aborted), cancel_all, admin, /metrics, kvx, pool, loop
 * (runs the deferred frees), stats, model, secret, ready file. after_kvx
 * (may be NULL) runs once the kvx context is gone (decode: end what its
 * pulls left). */
void node_teardown(node_t *n, void (*after_kvx)(node_t *n));

/* Write text + "\n" to path atomically (tmp + rename). true when the file
 * is in place; false after an error log line (component comp). */
bool node_ready_write(const char *path, const char *text, const char *comp);


/* The boot's log line for a failed step; returns 1 (the exit status). */
int node_fail(const node_t *n, const char *what, pd_status_t st, const char *detail);

/* ---- requests (node.c) -------------------------------------------------- */

/* The live request of wire id `id` that router link `from` sent (ids are
 * per router session); NULL if none. */
node_req_t *node_req_find(node_t *n, const node_link_t *from, const char *id);
/* Make r live, as a request of router link `from` (its current session). */
void node_req_link(node_t *n, node_link_t *from, node_req_t *r);
/* A request reached its terminal state: free its blocks, unlink it, free
 * obj (the role's request) later through free_fn, and check the drain. */
void node_req_retire(node_t *n, node_req_t *r, void (*free_fn)(void *), void *obj);
/* Blocks a new request can get: free ones plus cached ones nobody uses
 * (evicted on demand). What heartbeats, admin `kv` "free" and /metrics
 * report as free. */
uint32_t node_kv_available(const node_t *n);

/* Sampling parameters from a PROTO sampling block + the model's EOS ids. */
pd_status_t node_sampling(const node_t *n, const proto_sampling_t *ps, eng_sample_params_t *sp);

/* Structured output (node_gram.c): the grammar of one sequence. */
typedef struct {
    eng_gram_t *g;              /* NULL: unconstrained */
    eng_gram_state_t *st;
} node_gram_t;
/* Compile ps's grammar (none: g stays NULL). PD_ERR_BAD_INPUT when the
 * schema does not compile or the node has no tokenizer. */
pd_status_t node_gram_start(const node_t *n, const proto_sampling_t *ps, node_gram_t *ng);
/* Sample the next token (compute thread) as eng_sample_next_lp does, under
 * ng's mask when constrained: budget = tokens that may still come, this one
 * included (UINT32_MAX: unlimited), so the JSON is closed before max_tokens;
 * logprobs stay those of the unmasked logits. The token is fed to the
 * grammar; -1 if it cannot be (never with a mask that left a choice). */
int32_t node_sample(node_t *n, node_gram_t *ng, eng_sampler_t *s, float *logits,
                    const eng_sample_hist_t *h, uint32_t budget, uint32_t n_top,
                    eng_logprobs_t *lp);
/* Advance over a chosen token (EOS ids are accepted as the end). false if
 * the token cannot continue the JSON. */
bool node_gram_take(const node_t *n, node_gram_t *ng, int32_t token);
void node_gram_end(node_gram_t *ng); /* accepts zeroed */
/* Boot: the token pieces of tok over the model's vocabulary. */
struct eng_tok;
pd_status_t node_gram_vocab(node_t *n, const struct eng_tok *tok);

/* ERROR for request id to the router of link l (best effort; l may be
 * NULL: nothing sent). Before a request exists, l is the message's link. */
void node_send_error(node_t *n, node_link_t *l, const char *id, pd_status_t status,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* r's router session is the one it arrived on and is up: a reply reaches
 * the router that owns r. */
bool node_req_can_reply(const node_t *n, const node_req_t *r);
/* Send msg on r's router session (PD_ERR_SHUTDOWN if that session ended;
 * else as proto_session_send). */
pd_status_t node_req_send(node_t *n, const node_req_t *r, const proto_msg_t *msg);

/* ---- router links (node.c) ---------------------------------------------- */

/* Parse a router list "a:1,b:2" (spaces allowed around entries) into
 * addrs; PD_ERR_BAD_INPUT for an empty entry, an entry of 128 bytes or
 * more, a bad address, a duplicate, or more than max entries. */
pd_status_t node_routers_parse(const char *list, char (*addrs)[128], uint32_t max,
                               uint32_t *n_p);
/* Open a session to addr in a free slot. Expected: PD_ERR_EXISTS (already
 * linked), PD_ERR_NO_SPACE (NODE_ROUTERS_MAX), PD_ERR_BAD_INPUT. */
pd_status_t node_link_add(node_t *n, const char *addr, node_link_t **l_p);
/* Close l's session (its requests are canceled as on a loss) and free the
 * slot. Not from inside one of l's session callbacks. */
void node_link_remove(node_t *n, node_link_t *l);
/* Links whose session is up. */
uint32_t node_links_up(const node_t *n);
/* A heartbeat (load report) to every router now, not at the next tick. */
void node_heartbeat_now(node_t *n);
/* The static router list: the `router` config, or 127.0.0.1:7000 when
 * neither it nor etcd is set ("" with etcd only). */
const char *node_router_list(const node_config_t *c);
/* etcd (node.c): register daemons/<id> and watch routers/; stop revokes. */
pd_status_t node_member_start(node_t *n);
void node_member_stop(node_t *n);

/* ---- drain (node.c) ----------------------------------------------------- */

void node_start_drain(node_t *n);
/* Draining and nothing live: flush the session, then stop the loop. */
void node_maybe_drained(node_t *n);

/* ---- ids ---------------------------------------------------------------- */

/* kvx node id of a daemon: xxh64(daemon id), never 0 (0 means "none"). */
uint64_t node_id_of(const char *daemon_id);
/* The lease id on the wire: slot << 32 | low 32 bits of the generation. */
uint64_t node_lease_wire_id(kvx_lease_id_t l);

/* ---- leases --------------------------------------------------------------- */

/* Lease blocks[0..nb) of the arena to importer (a daemon id) for ttl_ns
 * on behalf of r and encode the handle into buf: kvx_export, plus the
 * node's slot -> request table, so the lease's end reaches
 * role->on_lease_end with r. Errors as kvx_export. */
pd_status_t node_export(node_t *n, node_req_t *r, const char *importer, const uint32_t *blocks,
                        uint32_t nb, uint64_t ttl_ns, void *buf, size_t cap, size_t *len_p,
                        kvx_lease_id_t *lease_p);
/* The same with kvx_export_stream: before the KV is computed (layer
 * streaming); *ready_p publishes each layer's progress. */
pd_status_t node_export_stream(node_t *n, node_req_t *r, const char *importer,
                               const uint32_t *blocks, uint32_t nb, uint64_t ttl_ns,
                               uint32_t blocks_ready, void *buf, size_t cap, size_t *len_p,
                               kvx_lease_id_t *lease_p, kvx_ready_t *ready_p);

/* node_export for a set that may not fit one handle (kvx_export_part):
 * leases the longest prefix of blocks[0..nb) that fits, *taken_p blocks
 * (at least one). Errors as kvx_export. */
pd_status_t node_export_part(node_t *n, node_req_t *r, const char *importer,
                             const uint32_t *blocks, uint32_t nb, uint64_t ttl_ns, void *buf,
                             size_t cap, size_t *len_p, kvx_lease_id_t *lease_p,
                             uint32_t *taken_p);

/* The importer twins of node_export. node_import: validate a handle
 * against this node's geometry (kvx_handle_import; *why_p says why not).
 * node_pull_start: pull the imported lease's nb blocks into blocks[0..nb),
 * the first n_skip of which this node holds already (prefix cache: not
 * fetched, KVX_PULL_SKIP), within budget_ns from now; cb(arg, status, res)
 * follows on the loop. PD_INPROGRESS, or the error (nothing started; the
 * caller releases the lease). */
pd_status_t node_import(node_t *n, const void *handle, size_t len, kvx_import_t *imp,
                        kvx_reject_t *why_p);
pd_status_t node_pull_start(node_t *n, const kvx_import_t *imp, const uint32_t *blocks,
                            uint32_t nb, uint32_t n_skip, uint64_t budget_ns, kvx_pull_cb_t cb,
                            void *arg, uint64_t *pull_id_p);

/* PEER_INFO (from router link `from`): add (or revive) a KV peer of one of the
 * roles in role_mask (1 << proto_role); others, and ourselves, are
 * ignored. PEER_DOWN: that router lost it; once no router reports it up,
 * that incarnation is gone and its pulls fail with PD_ERR_PEER_GONE.
 * forget_link: router `from` is lost, its reports with it (NULL: none). */
void node_peer_info(node_t *n, const node_link_t *from, const proto_peer_info_t *pi,
                    unsigned role_mask);
void node_peer_down(node_t *n, const node_link_t *from, const proto_peer_down_t *pd);
void node_peers_forget_link(node_t *n, const node_link_t *from);
/* The `session` reply's "peers" array. */
void node_adm_peers(node_t *n, cJSON *reply);

/* ---- prefix cache events to the router (node_kve.c) ---------------------- */

typedef struct {
    uint64_t events;                    /* store / remove events seen */
    uint64_t frames;                    /* KV_EVENTS sent */
    uint64_t names;                     /* block names in them */
    uint64_t snapshots;                 /* RESET + whole-cache snapshots */
    uint64_t snapshots_truncated;       /* cache over the snapshot cap (256 Ki names) */
    uint32_t pending;                   /* coalesced, not sent yet */
} node_kve_stats_t;

/* Fixed memory (one frame's worth of pending names); the first flush is
 * a snapshot. Expected: PD_ERR_NO_MEMORY. */
pd_status_t node_kve_create(node_t *n, node_kve_t **k_p);
void node_kve_destroy(node_kve_t *k); /* NULL-safe */
/* kvx_prefix_config_t.on_event (arg = the node_kve_t). */
void node_kve_on_event(void *arg, kvx_prefix_event_t ev, uint64_t name);
/* A new router session: RESET + a snapshot of the cache now. */
void node_kve_session_up(node_kve_t *k);
/* Send what is pending (a snapshot if one is due). No-op while down. */
void node_kve_flush(node_kve_t *k);
void node_kve_stats(const node_kve_t *k, node_kve_stats_t *out);

/* ---- /metrics (node_metrics.c) ------------------------------------------ */

pd_status_t node_metrics_start(node_t *n);
uint16_t node_metrics_port(const node_t *n);     /* 0 when off */
void node_metrics_stop(node_t *n);
/* CPU accounting against cpu-share: a stats set "cpu" (admin `stats`,
 * /metrics pd_cpu_*) sampled every 500 ms on the loop. */
pd_status_t node_cpu_start(node_t *n);
void node_cpu_stop(node_t *n);
/* Threads the daemons after this one on the host want now (the core
 * arbiter; 0 when it is off), also kept as the gauge threads_want_after.
 * Loop thread. */
uint32_t node_cpu_want_after(node_t *n);

/* ---- internal: the session and admin wiring (node.c) -------------------- */

void node_session_opts(node_t *n, proto_session_opts_t *so);
/* The role's counters (COUNTER rows of its stats table) as reply.counters. */
void node_adm_counters(const node_t *n, cJSON *reply);
void node_drain_init(node_t *n);
void node_admin_register(node_t *n);
void node_on_lease_end(void *arg, const kvx_lease_info_t *info, kvx_lease_end_t why);

#endif
