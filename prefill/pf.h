/* pf.h - pd-prefill internals: config, the daemon, one request.
 *
 * One request, one struct, one state enum, one setter (pf_req_set_state)
 * that asserts the transition and stamps pd_now_ns() per state:
 *
 *   COMPUTING --export ok--> LEASED --released--> COMPLETED
 *       |                      |-----expired----> FAILED
 *       |                      '-----revoked----> CANCELED
 *       |--error------------------------------> FAILED
 *       '--CANCEL / RELEASE / router lost------> CANCELED
 *
 * Blocks are freed only on entering a terminal state; a LEASED request's
 * blocks only after kvx's on_lease_end (the lease is over, pins are 0). */
#ifndef PF_H
#define PF_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "eng.h"
#include "eng_runner.h"
#include "eng_sample.h"
#include "kvx.h"
#include "kvx_blocks.h"
#include "pd_admin.h"
#include "pd_config.h"
#include "pd_idhash.h"
#include "pd_loop.h"
#include "pd_stats.h"
#include "proto_auth.h"
#include "proto_session.h"

typedef struct {
    char *id;
    char *router;
    char *secret_file;
    char *secret;
    bool insecure_no_auth;
    char *admin_socket;
    char *log_level;
    char *log_file;
    char *model;
    char *engine;
    uint64_t threads;
    uint64_t block_tokens;
    int kv_dtype;
    uint64_t kv_blocks;
    uint64_t max_queue;
    uint64_t lease_ttl_ns;
    uint64_t max_prompt_tokens;
    uint64_t heartbeat_ns;
    uint64_t reconnect_min_ns;
    uint64_t drain_timeout_ns;
    char *ready_file;
    char *metrics_listen;
} pf_config_t;

#define PF_STATES(X)                                                          \
    X(NEW,       "new")                                                       \
    X(COMPUTING, "computing")                                                 \
    X(LEASED,    "leased")                                                    \
    X(COMPLETED, "completed")                                                 \
    X(FAILED,    "failed")                                                    \
    X(CANCELED,  "canceled")

typedef enum {
#define PF_X_ENUM(name, text) PF_ST_##name,
    PF_STATES(PF_X_ENUM)
#undef PF_X_ENUM
    PF_ST__COUNT
} pf_state_t;

#define PF_STATS(X)                                                           \
    X(accepted,        COUNTER,   "PREFILL_REQs admitted")                    \
    X(completed,       COUNTER,   "requests whose KV lease was released by the importer") \
    X(failed,          COUNTER,   "requests failed (compute, export, lease expiry)") \
    X(canceled,        COUNTER,   "requests canceled (CANCEL, RELEASE, router lost)") \
    X(rejected,        COUNTER,   "PREFILL_REQs refused at admission")        \
    X(prompt_tokens,   COUNTER,   "prompt tokens prefilled")                  \
    X(live,            GAUGE,     "requests not yet terminal")                \
    X(computing,       GAUGE,     "requests queued or running on the compute thread") \
    X(leased,          GAUGE,     "requests holding a KV lease")              \
    X(queue_time,      HISTOGRAM, "accept -> compute start")                  \
    X(prefill_time,    HISTOGRAM, "compute of prompt + token 0")              \
    X(lease_time,      HISTOGRAM, "export -> lease end")

#define PF_STAT_ID(name, kind, help) PF_ST_##name,
typedef enum { PF_STATS(PF_STAT_ID) PF_STAT__COUNT } pf_stat_id_t;
#undef PF_STAT_ID

typedef struct pf pf_t;

typedef struct pf_req {
    eng_job_t job;                      /* first: compute hand-off */
    pf_t *pf;
    pd_idhash_node_t hnode;             /* pf->by_id, keyed by id */
    struct pf_req *prev, *next;         /* live list */
    char id[PROTO_REQID_MAX + 1];
    char target[PROTO_DAEMON_ID_MAX + 1];
    pf_state_t state;
    uint64_t t[PF_ST__COUNT];           /* pd_now_ns() on entering each state */
    uint64_t epoch;                     /* router session it arrived on */
    _Atomic bool cancel;                /* compute thread skips/discards */
    bool reply_pending;                 /* no PREFILL_DONE/ERROR sent yet */
    uint32_t n_prompt;
    int32_t *prompt;                    /* (n_prompt) */
    uint32_t n_blocks;
    uint32_t *blocks;                   /* (n_blocks) arena block ids */
    bool blocks_held;
    eng_sample_params_t sp;
    bool lp_on;                         /* report token 0's logprobs */
    uint32_t lp_top;                    /* with this many alternatives */
    /* written by the compute thread, read after done() */
    pd_status_t cstatus;
    int32_t token0;
    eng_logprobs_t lp0;
    uint64_t run_start_ns, run_end_ns;
    /* lease */
    kvx_lease_id_t lease;
    uint64_t lease_ttl_ns;
} pf_req_t;


/* pf_metrics.c: HTTP /metrics on cfg.metrics_listen (no-op when unset). */
pd_status_t pf_metrics_start(pf_t *pf);
uint16_t pf_metrics_port(void);          /* 0 when off */
void pf_metrics_stop(void);

struct pf {
    pf_config_t cfg;
    pd_loop_t *loop;
    pd_admin_t *admin;
    pd_stats_t *stats;
    proto_stats_t pstats;
    proto_auth_secret_t secret;
    bool have_secret;
    /* engine */
    const eng_ops_t *ops;
    eng_model_t *model;
    const eng_kv_geom_t *geom;
    eng_runner_t *runner;
    float *logits;                      /* (vocab) compute thread only */
    eng_sample_scratch_t scratch;       /* compute thread only */
    int32_t eos_ids[ENG_SAMPLE_MAX_EOS];
    uint32_t n_eos;
    /* kv */
    kvx_ctx_h *kvx;
    kvx_region_h *region;
    kvx_blocks_t *blocks;
    uint8_t meta[KVX_META_MAX_BYTES];
    size_t meta_len;
    uint32_t max_leases;
    pf_req_t **lease_slots;             /* (max_leases) request per slot */
    /* control plane */
    proto_session_t *sess;
    uint64_t epoch;
    bool registered_once;
    char daemon_id[PROTO_DAEMON_ID_MAX + 1];
    uint64_t incarnation;
    /* requests */
    pd_idhash_t by_id;                  /* live requests by id */
    pf_req_t *live;
    uint32_t n_live;
    uint32_t n_computing;
    bool draining;
    bool stopping;
    struct event *drain_ev;
};

#endif
