/* pf.h - pd-prefill internals: config, the daemon, one request.
 *
 * One request, one struct, one state enum, one setter (pf_req_set_state)
 * that asserts the transition and stamps pd_now_ns() per state:
 *
 *   [PULLING] -> COMPUTING --export ok--> LEASED --released--> COMPLETED
 *       |           |                      |-----expired----> FAILED
 *       |           |                      '-----revoked----> CANCELED
 *       |           |--error------------------------------> FAILED
 *       '-----------'--CANCEL / RELEASE / router lost------> CANCELED
 *
 * PULLING: PREFILL_REQ named a decode's cached prefix of the prompt (its
 * source tail): the blocks this prefill's own cache lacks are pulled from
 * that decode first (KVX_PULL_SKIP for the rest); a failed pull is not a
 * failed request (it computes from its own cached prefix instead).
 *
 * Blocks are freed only on entering a terminal state; a LEASED request's
 * blocks only after kvx's on_lease_end (the lease is over, pins are 0).
 *
 * kv-stream=layer: the lease is exported (streamed) at admission, before
 * COMPUTING; the compute thread publishes each layer's readiness. The
 * request stays COMPUTING until its job returns whatever happens to the
 * lease meanwhile (the blocks are being written); a failed or canceled job
 * revokes the lease and ends when on_lease_end comes (r->final). */
#ifndef PF_H
#define PF_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "node.h"

typedef struct {
    node_config_t node;                 /* first: the rows every node has */
    uint64_t max_queue;
    uint64_t lease_ttl_ns;
    uint64_t max_prompt_tokens;
    uint64_t src_pull_timeout_ns;       /* deadline of a pull from a decode's cache */
    int kv_stream;                      /* PF_KV_STREAM_* */
    int embed_pooling;                  /* eng_pooling_t when the GGUF has none */
    uint64_t embed_batch_tokens;        /* queued EMBED_REQs computed together, tokens */
} pf_config_t;

enum { PF_KV_STREAM_LAYER = 0, PF_KV_STREAM_WHOLE = 1 }; /* pf_kv_streams order; default layer */

#define PF_STATES(X)                                                          \
    X(NEW,       "new")                                                       \
    X(PULLING,   "pulling")                                                   \
    X(COMPUTING, "computing")                                                 \
    X(LEASED,    "leased")                                                    \
    X(COMPLETED, "completed")                                                 \
    X(FAILED,    "failed")                                                    \
    X(CANCELED,  "canceled")

#define PF_ST_ENUM(name, text) PF_ST_##name,
typedef enum { PF_STATES(PF_ST_ENUM) PF_ST__COUNT } pf_state_t;

typedef struct pf pf_t;

typedef struct pf_req {
    eng_job_t job;                      /* first: compute hand-off */
    node_req_t nr;                      /* id, table links, epoch, blocks */
    pf_t *pf;
    char target[PROTO_DAEMON_ID_MAX + 1];
    pf_state_t state;
    uint64_t t[PF_ST__COUNT];           /* pd_now_ns() on entering each state */
    _Atomic bool cancel;                /* compute thread skips/discards */
    bool reply_pending;                 /* no PREFILL_DONE/ERROR sent yet */
    uint32_t n_prompt;
    int32_t *prompt;                    /* (n_prompt) */
    uint64_t partition;                 /* its prefix-cache partition (PREFILL_REQ) */
    uint32_t n_cached;                  /* prompt tokens whose KV came from the
                                           prefix cache (full blocks) */
    eng_sample_params_t sp;
    node_gram_t gram;                   /* structured output (token 0's mask) */
    bool lp_on;                         /* report token 0's logprobs */
    uint32_t lp_top;                    /* with this many alternatives */
    /* written by the compute thread, read after done() */
    pd_status_t cstatus;
    int32_t token0;
    eng_logprobs_t lp0;
    uint64_t run_start_ns, run_end_ns;
    uint64_t layer0_ns, layer_last_ns;  /* streamed: first / last layer published */
    /* lease */
    kvx_lease_id_t lease;
    uint64_t lease_ttl_ns;
    /* a decode's cached prefix (PREFILL_REQ source tail) */
    char src_peer[PROTO_DAEMON_ID_MAX + 1];
    kvx_import_t src_imp;
    bool src_imported;                  /* lease not released yet */
    uint32_t n_own;                     /* prompt blocks from our own cache */
    uint32_t n_pulled;                  /* prompt tokens whose KV was pulled */
    uint64_t pull_id;
    bool pull_live;
    uint64_t pull_ns;
    /* kv-stream=layer: exported at admission */
    bool early;                         /* lease exported before compute */
    bool lease_over;                    /* it ended while COMPUTING */
    bool job_done;                      /* pf_job_done ran */
    pf_state_t final;                   /* the terminal state on lease end */
    /* EMBED_REQ: COMPUTING -> COMPLETED, scratch blocks, no lease */
    int embed;                          /* its eng_pooling_t, 0 = a PREFILL_REQ */
    float *vec;                         /* (n_embd) the embedding (compute thread) */
    uint32_t embed_batch;               /* the first of a batch: its size (compute thread) */
    kvx_ready_t ready;                  /* readiness words (compute thread) */
    size_t hlen;
    uint8_t handle[KVX_HANDLE_MAX_BYTES];
} pf_req_t;

struct pf {
    node_t n;                           /* first: boot, session, kv, live table */
    pf_config_t cfg;
    float *logits;                      /* (vocab) compute thread only */
    uint32_t n_computing;
};

/* Counters, gauges and histograms (NODE_REQ_STATS first). */
#define PF_STATS(X)                                                           \
    NODE_REQ_STATS(X, "PREFILL_REQ", "requests whose KV lease was released by the importer", \
                   "requests failed (compute, export, lease expiry)",                         \
                   "requests canceled (CANCEL, RELEASE, router lost)")                        \
    X(prompt_tokens,   COUNTER,   "prompt tokens prefilled")                  \
    NODE_CACHE_STATS(X)                                                       \
    X(computed_tokens, COUNTER,   "prompt tokens computed")                   \
    X(embeddings,      COUNTER,   "embeddings computed (EMBED_REQ: no lease)") \
    X(embed_batches,   COUNTER,   "forward batches that computed embeddings (queued EMBED_REQs run together)") \
    X(src_pulled_tokens, COUNTER, "prompt tokens whose KV was pulled from a decode's cache") \
    X(src_pulled_bytes,  COUNTER, "KV bytes pulled from decodes' caches")     \
    X(src_pulls_ok,    COUNTER,   "pulls from a decode's cache completed")    \
    X(src_pulls_failed, COUNTER,  "sources not used: handle rejected, pull failed (computed instead)") \
    X(src_skipped,     COUNTER,   "sources not pulled: our own cache held as much") \
    X(early_handles,   COUNTER,   "kv-stream=layer: streamed leases sent to the router before the prompt pass (PREFILL_HANDLE)") \
    X(computing,       GAUGE,     "requests queued or running on the compute thread") \
    X(leased,          GAUGE,     "requests holding a KV lease")              \
    X(queue_time,      HISTOGRAM, "accept -> compute start")                  \
    X(prefill_time,    HISTOGRAM, "compute of prompt + token 0")              \
    X(src_pull_time,   HISTOGRAM, "pull from a decode's cache")               \
    X(lease_time,      HISTOGRAM, "export -> lease end")

#define PF_STAT_ID(name, kind, help) PF_STAT_##name,
typedef enum { PF_STATS(PF_STAT_ID) PF_STAT__COUNT } pf_stat_id_t;

#endif
