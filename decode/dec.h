/* dec.h - pd-decode internals: config, the daemon, one request.
 *
 * One request, one struct, one state enum, one setter (dec_req_set_state):
 *
 *   NEW -> WAITING (no room yet: bounded wait queue)
 *   NEW/WAITING -> PULLING (KV handle: import + pull into reserved blocks)
 *               -> PREFILLING (decode-local: chunked, interleaved with steps)
 *               -> RUNNING (in the continuous batch)
 *   PULLING -> PREFILLING (generated tokens beyond token 0) | RUNNING
 *   NEW (parked fork, n > 1) -> as NEW once the parent's prompt KV is in
 *   RUNNING -> MIGRATING (router's MIGRATE: KV exported to another decode
 *               under a lease; ends FINISHED, quietly, when the lease does)
 *   any live -> FINISHED (FINISH stop/length) | FAILED (ERROR, or FINISH
 *               error once TOKENS were sent) | CANCELED (FINISH canceled)
 *
 * Blocks for min(n_prompt + max_tokens, context) tokens are reserved at
 * admission and freed only on entering a terminal state. The compute thread
 * touches a request only while it is part of the step in flight
 * (DEC_RF_IN_STEP); the loop defers ending such a request until the step is back. */
#ifndef DEC_H
#define DEC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "node.h"

typedef struct {
    node_config_t node;                 /* first: the rows every node has */
    uint64_t max_batch;
    uint64_t max_queue;
    uint64_t transfer_timeout_ns;
    uint64_t prefill_chunk;
    uint64_t lease_ttl_ns;              /* a migration's handle */
    bool fused_step;                    /* a local chunk rides in the batch's passes */
    uint64_t tpot_target_ns;            /* 0: chunks of prefill_chunk; else sized so a
                                           step with a chunk stays within this */
} dec_config_t;

/* Step time = the batch's own step (measured on steps without a chunk)
 * + a chunk token's cost (measured on steps with one, less that base),
 * each an exponentially weighted mean, per count of engine threads the
 * step ran on (dec_chunk_budget, dec_threads_pick). */
#define DEC_SM_THREADS 64               /* counts above share the last entry */
typedef struct {
    double base_ns[DEC_SM_THREADS + 1]; /* [k]: a step of the running batch alone on k threads */
    double tok_ns[DEC_SM_THREADS + 1];  /* [k]: one chunk token on top of it */
    uint32_t n_base[DEC_SM_THREADS + 1], n_tok[DEC_SM_THREADS + 1]; /* samples of each */
} dec_step_model_t;

#define DEC_STATES(X)                                                         \
    X(NEW,        "new")                                                      \
    X(WAITING,    "waiting")                                                  \
    X(PULLING,    "pulling")                                                  \
    X(PREFILLING, "prefilling")                                               \
    X(RUNNING,    "running")                                                  \
    X(MIGRATING,  "migrating")                                                \
    X(FINISHED,   "finished")                                                 \
    X(FAILED,     "failed")                                                   \
    X(CANCELED,   "canceled")

#define DEC_ST_ENUM(name, text) DEC_ST_##name,
typedef enum { DEC_STATES(DEC_ST_ENUM) DEC_ST__COUNT } dec_state_t;

typedef struct dec dec_t;

/* What a request is doing or owes beside its state, one bit each, set
 * with dec_req_flag only (loop thread). The state enum says where the
 * request is in its life; these say what is pending across states (a
 * CANCEL that must wait for the step or the pull to come back, a MIGRATE
 * seen mid-pull, a handle still imported) or how it started (LOCAL,
 * T0_WAIT). chunk_logits and lp_on stay bools: the compute thread reads
 * them while the loop changes these bits. */
#define DEC_RF_LOCAL       (1u << 0)    /* PROTO_DEC_PREFILL_LOCALLY */
#define DEC_RF_T0_WAIT     (1u << 1)    /* PROTO_DEC_TOKEN0_LATER (early hand-off,
                                         * kv-stream=layer): the pull may run, the
                                         * first step waits for FIRST_TOKEN */
#define DEC_RF_T0_PULLED   (1u << 2)    /* the pull landed while T0_WAIT */
#define DEC_RF_CANCEL      (1u << 3)    /* end as CANCELED when the step/pull is back */
#define DEC_RF_CANCEL_STOP (1u << 4)    /* the CANCEL was the router's stop string: end as STOP */
#define DEC_RF_QUIET       (1u << 5)    /* router gone: end without a reply */
#define DEC_RF_IN_STEP     (1u << 6)    /* in the compute thread's step */
#define DEC_RF_FINISHING   (1u << 7)    /* step result: ends after its TOKENS go out */
#define DEC_RF_PEND_SEND   (1u << 8)    /* step result: a new token to stream */
#define DEC_RF_IMPORTED    (1u << 9)    /* imp holds an imported handle */
#define DEC_RF_PULL_LIVE   (1u << 10)   /* a pull (pull_id) is in flight */
#define DEC_RF_MIGRATE     (1u << 11)   /* MIGRATE seen: leaves the batch, then exports */

typedef struct dec_req {
    node_req_t nr;                      /* id, table links, epoch, blocks */
    dec_t *d;
    struct dec_req *wnext;              /* wait queue */
    dec_state_t state;
    uint64_t t[DEC_ST__COUNT];          /* pd_now_ns() on entering each state */
    uint32_t flags;                     /* DEC_RF_*: dec_req_is / dec_req_flag */
    uint16_t pend_reason;               /* proto finish reason if finishing */
    pd_status_t pend_status;
    /* tokens: prompt then generated, (cap) */
    int32_t *tok;
    uint64_t partition;                 /* prefix-cache partition (DECODE_REQ) */
    uint32_t cap;                       /* max_pos + 1 */
    uint32_t n_prompt;
    uint32_t n_gen;                     /* generated so far (incl. those given) */
    uint32_t n_gen_given;               /* in the DECODE_REQ */
    uint32_t max_pos;                   /* min(n_prompt + max_tokens, ctx) */
    uint32_t kv_have;                   /* positions with KV present */
    uint32_t kv_pull;                   /* positions the handle's KV covers */
    uint32_t n_reused;                  /* first blocks shared from the prefix
                                           cache (read only; not pulled) */
    uint64_t pulled_bytes;              /* KV bytes pulled from peers (FINISH) */
    uint32_t chunk_n;                   /* step in flight: prefill chunk size */
    bool chunk_logits;
    /* sampling (compute thread while in_step) */
    eng_sampler_t smp;
    node_gram_t gram;                   /* structured output (compute thread) */
    bool lp_on;                         /* report logprobs with each token */
    uint32_t lp_top;                    /* alternatives per token */
    eng_logprobs_t step_lp;             /* step_token's (when lp_on; compute thread) */
    eng_logprobs_t pend_lp;             /* the last taken token's (loop): the next
                                         * step may overwrite step_lp meanwhile */
    int32_t step_token;
    eng_finish_t step_finish;
    pd_status_t step_status;
    /* transfer */
    char peer[PROTO_DAEMON_ID_MAX + 1];
    uint8_t *handle;                    /* (handle_len) copy of the KV handle */
    uint32_t handle_len;
    uint64_t budget_ns;                 /* the router's relative deadline (0: none) */
    kvx_import_t imp;
    uint64_t pull_id;
    uint64_t transfer_ns;
    uint64_t prefill_ns;
    struct event *renew_ev;             /* WAITING with an imported handle */
    uint64_t renew_ttl_ns;              /* asked for on each renewal */
    uint64_t first_step_ns;             /* the first step with it submitted */
    uint64_t handoff_ns;                /* see DEC_STATS handoff */
    /* live migration (out; DEC_RF_MIGRATE) */
    char migrate_to[PROTO_DAEMON_ID_MAX + 1];
    kvx_lease_id_t mig_lease;           /* MIGRATING: the exported KV */
    /* n > 1 (DECODE_REQ n_fork): forks wait parked on their parent, in
     * NEW, until its prompt's KV is complete (dec_fork_release) */
    struct dec_req *forks;              /* a parent's parked forks */
    struct dec_req *fork_next;          /* in the parent's list */
    struct dec_req *fork_parent;        /* a parked fork's parent */
    /* streaming */
    uint32_t seq;                       /* TOKENS messages sent */
    uint64_t first_token_ns;
    /* early hand-off timeline (pd_now_ns(), 0: not yet; admin `requests`,
     * debug log "timeline" at the end) */
    uint64_t pull_end_ns;               /* the pull's callback ran */
    uint64_t pull_ready_ns;             /* the pull saw every layer ready */
    uint64_t pull_posted_ns;            /* the pull posted its last get */
    uint64_t t0_at_ns;                  /* FIRST_TOKEN arrived */
    uint64_t step0_start_ns;            /* the step that made our first TOKENS */
} dec_req_t;

/* Any of the bits f set. */
static inline bool dec_req_is(const dec_req_t *r, uint32_t f)
{
    return (r->flags & f) != 0;
}

/* The one setter of r->flags: bits f on or off. */
static inline void dec_req_flag(dec_req_t *r, uint32_t f, bool on)
{
    r->flags = on ? r->flags | f : r->flags & ~f;
}



/* A cached prefix exported to a prefill (KV_EXPORT_REQ, "the KV pool is
 * one cache"): references on the matched cached blocks, held until the
 * lease ends (released by the prefill after its pull, expired, revoked:
 * router RELEASE, router lost, teardown). Not in the node's live table: the
 * request id is the router's wire id, which the same request's DECODE_REQ
 * carries later. At most DEC_MAX_EXPORTS at once. */
#define DEC_MAX_EXPORTS 64u

typedef struct dec_export {
    node_req_t nr;                      /* id; blocks = the exported ones (references) */
    struct dec_export *next;            /* dec_t.exports */
    char target[PROTO_DAEMON_ID_MAX + 1];
    kvx_lease_id_t lease;
    uint64_t start_ns;
} dec_export_t;


/* The one compute step in flight. */
typedef struct {
    eng_job_t job;
    dec_t *d;
    dec_req_t *chunk;                   /* prefill chunk owner or NULL */
    uint32_t n_items;
    dec_req_t **items;                  /* (max_batch) */
    dec_req_t **prev;                   /* (max_batch + 1) the step just done */
    eng_decode_item_t *eitems;          /* (max_batch) */
    float *logits;                      /* (max_batch + 1, vocab): a chunk's, the batch's */
    bool fused;                         /* the chunk rode in the batch's passes */
    uint32_t threads;                   /* engine threads it runs on (core arbiter) */
    uint64_t start_ns, end_ns;
    pd_status_t status;
    /* an EP rank's round (README "Expert parallelism"): the vote, then the
     * group's passes (its own step, padded with idle passes) */
    bool ep_drained;                    /* in: this rank votes drained */
    bool ep_work;                       /* out: some rank had work this round */
    bool ep_all_drained;                /* out: every rank voted drained */
    pd_status_t ep_status;              /* out: the group is lost (vote or pass) */
} dec_step_t;

/* An idle EP rank votes again after this long (the first token of a
 * request that comes to an idle group waits at most this for the round). */
#define DEC_EP_IDLE_TICK_NS 2000000ull

struct dec {
    node_t n;                           /* first: boot, session, kv, live table */
    dec_config_t cfg;
    dec_step_t step;
    bool step_busy;
    dec_export_t *exports;              /* cached prefixes under a lease to a prefill */
    uint32_t n_exports;
    /* requests beyond the node's live table */
    dec_req_t *wait_head, *wait_tail;
    uint32_t n_waiting;
    uint32_t n_active;                  /* PULLING + PREFILLING + RUNNING */
    dec_step_model_t sm;                /* tpot-target: measured step times */
    /* EP rank: idle rounds on a timer, the group's loss */
    struct event *ep_tick;
    bool ep_hot;                        /* the last round had work: vote at once */
    bool ep_tick_due;                   /* the idle tick fired: vote now */
    bool ep_lost;                       /* a rank died: fail the streams, exit 1 */
};

/* Counters, gauges and histograms (NODE_REQ_STATS first). */
#define DEC_STATS(X)                                                          \
    NODE_REQ_STATS(X, "DECODE_REQ",                                           \
                   "requests finished (stop / length)",                       \
                   "requests failed (ERROR or FINISH error)",                 \
                   "requests canceled (CANCEL, router lost)")                 \
    X(pulls_ok,        COUNTER,   "KV pulls completed")                       \
    X(pulls_failed,    COUNTER,   "KV imports or pulls failed")               \
    X(local_prefills,  COUNTER,   "decode-local prefills")                    \
    NODE_CACHE_STATS(X)                                                       \
    X(tokens_out,      COUNTER,   "tokens generated")                         \
    X(steps,           COUNTER,   "compute steps")                            \
    X(chunks,          COUNTER,   "decode-local prefill chunks computed")     \
    X(chunk_tokens,    COUNTER,   "prompt tokens in those chunks (chunk_tokens / chunks = mean chunk)") \
    X(fused_chunks,    COUNTER,   "chunks that rode in a batch's forward passes (fused-step)") \
    X(chunk_budget,    GAUGE,     "tokens the next chunk may take beside a running batch (tpot-target; else prefill-chunk)") \
    X(threads_active,  GAUGE,     "engine threads the last step ran on (fewer than it has: cores parked for the host's prefills, tpot-target holding)") \
    X(steps_yielded,   COUNTER,   "steps run on fewer threads than the decode has, cores parked for prefills on the host") \
    X(waiting,         GAUGE,     "requests in the wait queue")               \
    X(running,         GAUGE,     "sequences in the batch")                   \
    X(step_time,       HISTOGRAM, "one compute step (chunk + batch)")         \
    X(transfer_time,   HISTOGRAM, "KV pull, start to completion")             \
    X(ttft,            HISTOGRAM, "DECODE_REQ -> first TOKENS")                  \
    X(handoff,         HISTOGRAM, "pulled: DECODE_REQ -> first step start, minus wait and pull") \
    X(lease_renews,    COUNTER,   "lease renewals sent while waiting for KV room") \
    X(early_handoffs,  COUNTER,   "DECODE_REQs sent before the prompt pass ended (TOKEN0_LATER) whose FIRST_TOKEN came") \
    X(early_canceled,  COUNTER,   "TOKEN0_LATER requests canceled before their FIRST_TOKEN") \
    X(lease_left,      HISTOGRAM, "pulled: handle's lease left at DECODE_REQ (wall clocks)") \
    X(req_time,        HISTOGRAM, "DECODE_REQ -> FINISH / ERROR")            \
    X(migrated_out,    COUNTER,   "sequences handed to another decode (KV pulled from here)") \
    X(migrated_in,     COUNTER,   "sequences taken over from another decode (KV pulled)") \
    X(migrations_lost, COUNTER,   "exported sequences whose lease expired or was revoked unpulled") \
    X(prefix_exports,  COUNTER,   "cached prefixes exported to a prefill (KV_EXPORT_REQ)") \
    X(prefix_export_tokens, COUNTER, "prompt tokens of those exports")       \
    X(prefix_exports_refused, COUNTER, "KV_EXPORT_REQ refused (too little cached, no lease slot)") \
    X(prefix_exports_unpulled, COUNTER, "exports whose lease expired or was revoked (not released by the prefill)") \
    X(exports_live,    GAUGE,     "cached prefixes under a lease to a prefill now")

#define DEC_STAT_ID(name, kind, help) DEC_STAT_##name,
typedef enum { DEC_STATS(DEC_STAT_ID) DEC_STAT__COUNT } dec_stat_id_t;

/* ---- dec_step.c ----------------------------------------------------------
 * The compute thread's step: the chunk (s->chunk) and the batch (s->items)
 * through the engine (fused when it can), then sampling and the finish
 * check into each request's step_* fields. eng_job_t.run of d->step. */
void dec_step_run(eng_job_t *job);
/* tpot-target's cost model: learn from a finished step of `chunk` prompt
 * tokens and `items` sequences on k threads that took t ns (loop thread). */
void dec_sm_add(dec_step_model_t *m, uint32_t k, uint32_t chunk, uint32_t items, double t);
double dec_sm_chunk_ns(const dec_step_model_t *m, uint32_t k, uint32_t items, double t);
/* Tokens the next chunk may take beside n_items running sequences on k threads. */
uint32_t dec_chunk_budget(const dec_t *d, uint32_t n_items, uint32_t k);
/* Engine threads the next step runs on: all of them, unless daemons after
 * this one on the host want `want_after` threads now and tpot-target is
 * set: then the fewest (parking at most want_after) whose measured step
 * time stays within 90 % of the target; one fewer than the fewest measured
 * is tried when the last measured count predicts (linearly) it fits. */
uint32_t dec_threads_pick(const dec_t *d, uint32_t n_items, uint32_t want_after);

#endif
