/* rtr_int.h - pd-router internals shared by rtr_main.c (config, boot,
 * admin), rtr_ctl.c (control plane: registration, heartbeats, backends),
 * rtr_flow.c (the request life cycle, see rtr_flow.h) and rtr_http.c (the
 * evhttp front end). Not a public API. */
#ifndef RTR_INT_H
#define RTR_INT_H

#include <stdbool.h>
#include <stdint.h>
#include "pd_admin.h"
#include "pd_boot.h"
#include "pd_config.h"
#include "pd_idhash.h"
#include "pd_loop.h"
#include "pd_stats.h"
#include "proto_auth.h"
#include "proto_conn.h"
#include "rtr_conns.h"
#include "rtr_kvindex.h"
#include "rtr_openai.h"
#include "rtr_policy.h"
#include "rtr_req.h"
#include "eng_tok.h"
#include "eng_chat.h"

#define RTR_COMP "router"
#define RTR_MAX_BACKENDS 64
/* Control connections that have not registered yet: at most this many at
 * once (more are closed at accept), each for at most RTR_CTL_HANDSHAKE_NS,
 * and each may send only a HELLO-sized frame. */
#define RTR_CTL_PENDING_MAX 32
#define RTR_CTL_HANDSHAKE_NS (5ull * 1000000000ull)

/* ---- configuration (one table in rtr_main.c) ---------------------------- */
typedef struct {
    char *id;
    char *http;
    char *control;
    pd_boot_cfg_t boot;         /* secret, admin socket, log */
    char *model;
    char *engine;
    char *served_model_name;
    char *chat_template;
    char *api_key;
    int disagg_mode;              /* rtr_disagg_mode_t */
    uint64_t disagg_threshold;
    uint64_t max_body;
    uint64_t max_body_hard;
    uint64_t max_tokens_cap;
    uint64_t default_max_tokens;
    uint64_t n_cap;
    uint64_t max_concurrent;
    uint64_t max_retries;
    uint64_t context_length;
    uint64_t heartbeat_interval_ns;
    uint64_t request_timeout_ns;
    uint64_t drain_timeout_ns;
    uint64_t lease_ns;            /* announced in REGISTER_ACK */
    uint64_t retry_after;         /* seconds, Retry-After on 429/503 */
    uint64_t client_max_unsent;   /* bytes queued to a client before it is dropped */
    uint64_t http_max_conns;
    uint64_t http_max_conns_per_client;
    uint64_t http_read_timeout_ns;
    bool kv_routing;              /* route by the daemons' cached prefixes */
    uint64_t kv_index_names;      /* block names the index holds at most */
    uint64_t kv_index_per_backend; /* of which one backend at most */
    uint64_t kv_pull_min_blocks;  /* a decode's cached prefix is pulled by the
                                     prefill when it holds this many more
                                     blocks of the prompt (0 = never); 1: an
                                     export + pull costs ~0.3 ms, computing a
                                     block tens of ms (docs/BENCHMARKS.md) */
    uint64_t kv_export_timeout_ns; /* wait for KV_EXPORT_DONE this long */
    char *ready_file;
    char *etcd;                   /* etcd client address (membership), NULL: off */
    char *etcd_prefix;            /* deployment prefix in etcd */
    uint64_t etcd_ttl_ns;         /* lease TTL of our key */
    char *etcd_advertise;         /* control address daemons should dial */
    uint64_t tok_threads;         /* tokenizer worker threads, 0: tokenize on the loop */
    uint64_t tok_queue;           /* prompts waiting for a worker at most (503 above) */
    uint64_t tok_inline_bytes;    /* prompts up to this many bytes: tokenized on the loop */
} rtr_cfg_t;

/* ---- stats ------------------------------------------------------------ */
#define RTR_STATS(X)                                                             \
    X(requests_accepted,   COUNTER,   "Requests accepted (routed to a backend)")  \
    X(requests_completed,  COUNTER,   "Accepted requests that finished with a finish_reason") \
    X(requests_failed,     COUNTER,   "Accepted requests that ended with an error") \
    X(requests_canceled,   COUNTER,   "Accepted requests canceled (client gone)") \
    X(requests_rejected,   COUNTER,   "Requests refused before acceptance (4xx)") \
    X(requests_overloaded, COUNTER,   "Requests refused with 429/503 (overload, no backend)") \
    X(requests_retried,    COUNTER,   "Request retries (prefill or KV pull failure, failover)") \
    X(requests_failed_over, COUNTER,  "Streams moved to another decode after theirs was lost or failed mid-stream") \
    X(failover_resume,     HISTOGRAM, "Failover: decode lost to the next token reaching the router") \
    X(requests_migrated,   COUNTER,   "Streams moved live to another decode (KV pulled from the old one)") \
    X(requests_kept_on_drain, COUNTER, "Streams left to end on a draining decode (nearly done, or no other decode with room)") \
    X(migration_resume,    HISTOGRAM, "Live migration: MIGRATE sent to the next token from the new decode") \
    X(requests_disaggregated, COUNTER, "Requests prefilled on a prefill daemon") \
    X(requests_local,      COUNTER,   "Requests prefilled on their decode daemon") \
    X(requests_inflight,   GAUGE,     "Accepted requests not finished yet")       \
    X(prompt_tokens,       COUNTER,   "Prompt tokens of accepted requests")       \
    X(generation_tokens,   COUNTER,   "Tokens streamed to clients")               \
    X(request_ttft,        HISTOGRAM, "Time to first token (acceptance to first token)") \
    X(request_inter_token, HISTOGRAM, "Time between consecutive tokens")          \
    X(request_e2e,         HISTOGRAM, "Acceptance to finish")                     \
    X(request_queue_time,  HISTOGRAM, "Queue time reported by daemons")           \
    X(kv_transfer_bytes,   COUNTER,   "KV bytes pulled by decode daemons (from FINISH)") \
    X(prompt_cached_tokens, COUNTER,  "Prompt tokens whose KV came from a prefix cache (usage cached_tokens)") \
    X(kv_route_lookups,    COUNTER,   "Requests whose prompt was looked up in the KV index") \
    X(kv_route_prefill_hits, COUNTER, "Prefill choices where the chosen daemon held part of the prompt (index)") \
    X(kv_route_decode_hits, COUNTER,  "Decode choices where the chosen daemon held part of the prompt (index)") \
    X(kv_route_hit_tokens, COUNTER,   "Prompt tokens the chosen prefill (or decode-local decode) held per the index") \
    X(kv_events,           COUNTER,   "KV_EVENTS frames received from daemons") \
    X(kv_index_dropped,    COUNTER,   "Stored block names not indexed (kv-index caps)") \
    X(kv_index_names,      GAUGE,     "Distinct block names in the KV index") \
    X(kv_transfer,         HISTOGRAM, "KV transfer time reported by decode daemons") \
    X(kv_transfer_failures, COUNTER,  "KV pulls that failed (decode ERROR)")      \
    X(kv_pull_tail,        HISTOGRAM, "Disaggregated, >= 256 tokens pulled: the gap token 0 -> 1 minus one step (the KV pull's tail after the prompt pass)") \
    X(kv_pull_tail_tokens, COUNTER,   "Prompt tokens pulled by the requests in kv_pull_tail")  \
    X(kv_early_handoffs,   COUNTER,   "DECODE_REQs sent on PREFILL_HANDLE, before the prompt pass ended (kv-stream=layer)") \
    X(kv_early_canceled,   COUNTER,   "early DECODE_REQs canceled before token 0 went (prefill failed, token 0 ended the request)") \
    X(kv_src_exports,      COUNTER,   "KV_EXPORT_REQ sent: a decode's cached prefix for the prefill") \
    X(kv_src_used,         COUNTER,   "PREFILL_REQs sent with a decode's cached prefix (source)") \
    X(kv_src_tokens,       COUNTER,   "Prompt tokens in those sources")             \
    X(kv_src_refused,      COUNTER,   "KV_EXPORT_REQ refused by the decode (plain PREFILL_REQ)") \
    X(kv_src_timeouts,     COUNTER,   "KV_EXPORT_REQ unanswered in kv-export-timeout or decode lost (plain PREFILL_REQ)") \
    X(kv_src_export_time,  HISTOGRAM, "KV_EXPORT_REQ sent to KV_EXPORT_DONE (what a source adds before the PREFILL_REQ)") \
    X(backends_registered, COUNTER,   "Successful registrations")                 \
    X(backends_rejected,   COUNTER,   "Registrations refused")                    \
    X(backends_lost,       COUNTER,   "Backends marked down (lost, not drained)")  \
    X(backends_left,       COUNTER,   "Backends gone after a drain (scaled down)") \
    X(ctl_unauth_dropped,  COUNTER,   "Control connections dropped before registering (pending cap or handshake timeout)") \
    X(client_disconnects,  COUNTER,   "Clients gone before their request ended") \
    X(tokenize_offloaded,  COUNTER,   "Prompts tokenized on a worker thread (larger than tokenize-inline-bytes)") \
    X(tokenize_time,       HISTOGRAM, "Tokenizing one prompt (chat template included), inline or on a worker") \
    X(finish_stop,         COUNTER,   "Completed requests with finish_reason stop") \
    X(finish_length,       COUNTER,   "Completed requests with finish_reason length") \
    X(tool_calls,          COUNTER,   "Answers that are tool calls (finish_reason tool_calls)") \
    X(http_conns,          GAUGE,     "Open HTTP connections")                    \
    X(http_conns_refused,  COUNTER,   "HTTP connections refused: over http-max-conns-per-client") \
    X(http_read_timeouts,  COUNTER,   "HTTP connections closed: request not read within http-read-timeout") \
    X(http_accept_errors,  COUNTER,   "HTTP accept() failures (out of fds: accepting pauses 100 ms)")

#define RTR_STAT_ID(name, kind, help) RTR_STAT_##name,
typedef enum { RTR_STATS(RTR_STAT_ID) RTR_STAT__COUNT } rtr_stat_id_t;

#define RTR_BE_STATS(X)                                                          \
    X(state,        GAUGE, "Backend state: 0 down, 1 ready, 2 drain, 3 maint")    \
    X(queue_depth,  GAUGE, "Queued requests (last heartbeat)")                    \
    X(running_seqs, GAUGE, "Running sequences (last heartbeat)")                  \
    X(free_blocks,  GAUGE, "Free KV blocks (last heartbeat)")                     \
    X(total_blocks, GAUGE, "Total KV blocks (last heartbeat)")                    \
    X(assigned,     GAUGE, "Router requests currently assigned")

#define RTR_BE_STAT_ID(name, kind, help) RTR_BE_STAT_##name,
typedef enum { RTR_BE_STATS(RTR_BE_STAT_ID) RTR_BE_STAT__COUNT } rtr_be_stat_id_t;

/* ---- backends ----------------------------------------------------------- */
typedef enum {
    RTR_BE_DOWN  = 0,
    RTR_BE_READY = 1,
    RTR_BE_DRAIN = 2,
    RTR_BE_MAINT = 3,
} rtr_be_state_t;

typedef struct rtr rtr_t;

typedef struct rtr_backend {
    bool used;                       /* slot holds a (possibly down) backend */
    char id[PROTO_DAEMON_ID_MAX + 1];
    uint16_t role;                   /* proto_role_t */
    uint32_t caps;
    uint64_t incarnation;
    rtr_be_state_t state;            /* DOWN when conn == NULL */
    rtr_be_state_t admin_state;      /* READY / DRAIN / MAINT as set by admin */
    proto_conn_t *conn;              /* NULL when down */
    proto_heartbeat_t hb;            /* last heartbeat */
    uint64_t last_hb_ns;
    uint64_t registered_ns;
    uint8_t kv_addr[PROTO_KV_ADDR_MAX];
    uint32_t kv_addr_len;
    uint32_t assigned;               /* requests using it */
    pd_stats_t *stats;
} rtr_backend_t;

/* Per control connection (freed deferred after on_close). */
typedef struct {
    rtr_t *r;
    rtr_backend_t *be;               /* NULL until registered */
    proto_conn_t *conn;
    bool pending;                    /* counted in rtr_t.n_ctl_pending */
    struct event *hs_timer;          /* handshake deadline while pending */
    uint8_t challenge[PROTO_AUTH_NONCE_LEN]; /* sent on accept */
} rtr_ctlconn_t;

typedef struct rtr_req rtr_req_t;
typedef struct rtr_flow_out rtr_flow_out_t;

struct rtr {
    rtr_cfg_t cfg;
    pd_loop_t *loop;
    struct event_base *base;
    pd_admin_t *admin;
    pd_stats_t *stats;
    proto_auth_secret_t secret;
    bool auth;
    uint64_t incarnation;

    /* model */
    eng_tok_t *tok;
    eng_chat_kind_t chat_kind;
    bool chat_ok;
    bool tok_vocab_fixed;            /* tokenizer vocab must match daemons' */
    uint32_t context_length;         /* 0 = unknown yet */
    char model_name[RTR_OAI_MODEL_MAX];
    int64_t created;

    /* the daemons' prefix caches: block name -> backends (be[] index) */
    rtr_kvindex_t *kvidx;            /* NULL: KV routing off */

    /* deployment geometry, fixed by the first registration */
    bool geom_fixed;
    uint64_t compat_hash;
    proto_kv_geom_t geom;

    /* control plane */
    proto_listener_t *ctl;
    proto_stats_t ctl_stats;
    rtr_backend_t be[RTR_MAX_BACKENDS];
    struct event *hb_timer;
    rtr_rr_t rr;                     /* the policy's round-robin cursors */
    /* measured rates for disagg-mode=cost (running averages, 0 = none yet;
     * rtr_flow.c cost_note, rtr_policy.h rtr_disagg_in_t) */
    struct {
        double pf_tok_ns, dec_tok_ns, pull_tok_ns, hop_ns;
        double move_tok_ns; /* a live move's stall (MIGRATE -> next token) per KV token */
    } cost;
    uint32_t n_ctl_pending;          /* connections not registered yet */

    /* HTTP */
    struct evhttp *http;
    rtr_conns_t *conns;              /* connection caps and read deadlines */
    struct evhttp_bound_socket *http_sock;
    uint16_t http_port;
    uint16_t ctl_port;

    /* membership in etcd (rtr_main.c; NULL when etcd is off) */
    struct pd_member *member;
    bool member_up;

    /* requests (rtr_flow.c) and where they go out (rtr_flow.h) */
    const rtr_flow_out_t *out;
    rtr_req_t *reqs;                 /* doubly linked list of live requests */
    pd_idhash_t req_by_id;           /* the same requests by wire_id (rtr_flow_find) */
    uint32_t n_reqs;
    uint64_t next_seq;
    uint64_t next_wire;              /* control-plane request ids (rtr_flow.c) */
    bool draining;
    struct event *drain_timer;
    struct event *flush_timer;       /* draining: waits for responses to flush */
    struct rtr_tok_pool *tok_pool;   /* large prompts are tokenized here (rtr_tok.h) */
    bool tok_closing;                /* rtr_http_stop: jobs delivered now get 503 */

    /* What the control plane hands on (rtr_ctl.c calls these, rtr_main.c
     * sets them to rtr_flow_on_msg / rtr_flow_backend_down). */
    void (*on_backend_msg)(rtr_t *r, rtr_backend_t *be, const proto_msg_t *msg);
    void (*on_backend_down)(rtr_t *r, rtr_backend_t *be);
    /* A decode starts draining (admin set-backend drain, or its heartbeat
     * says so): its streams move elsewhere; returns how many were asked. */
    uint32_t (*on_backend_drain)(rtr_t *r, rtr_backend_t *be);
};

/* rtr_ctl.c */
pd_status_t rtr_ctl_start(rtr_t *r);
void rtr_ctl_stop(rtr_t *r);
/* Backend choice: r->be as the policy sees it (rtr_backend_view_t), chosen
 * by rtr_policy_choose (rtr_policy.c holds every rule); NULL: none. */
rtr_backend_t *rtr_choose_backend(rtr_t *r, const rtr_choice_t *c);
/* Its usual questions. pick: a prefill (cap PROTO_CAP_PREFILL) or a decode
 * (any other cap bit) with that cap by the heartbeats' load, never
 * `exclude` (may be NULL); a request's decode and prefill are chosen in
 * rtr_flow.c over the load the router knows (pick_decode, rtr_flow_route).
 * have: is any backend with that cap eligible. */
rtr_backend_t *rtr_pick_backend(rtr_t *r, uint32_t cap, uint32_t needed_blocks,
                                const rtr_backend_t *exclude);
bool rtr_have_backend(rtr_t *r, uint32_t cap);
/* Send on a backend's connection; PD_ERR_PEER_GONE if it is down. */
pd_status_t rtr_backend_send(rtr_backend_t *be, proto_msg_t *msg);
const char *rtr_be_state_name(rtr_be_state_t s);
pd_status_t rtr_admin_backends(pd_admin_req_t *req, struct cJSON *reply);
pd_status_t rtr_admin_set_backend(pd_admin_req_t *req, struct cJSON *reply);
/* admin `planner`: what the SLO planner (pdctl autoscale) reads: raw
 * counters, the TTFT / inter-token histograms' bucket counts (the planner
 * differences two reads for a window's p90), the cost mode's rates. */
pd_status_t rtr_admin_planner(pd_admin_req_t *req, struct cJSON *reply);

/* rtr_http.c: the evhttp front end and its output calls for the flow */
pd_status_t rtr_http_start(rtr_t *r);
void rtr_http_stop(rtr_t *r);
void rtr_http_drain(rtr_t *r);
extern const rtr_flow_out_t rtr_http_out;

/* rtr_embed_job.c (/v1/embeddings, rtr_embed_job.h): EMBED_DONE / ERROR of
 * an "emb-" id (true: taken, a late one dropped; false: the flow's), a
 * backend lost (its inputs move or their requests fail). */
bool rtr_emb_job_msg(rtr_t *r, rtr_backend_t *be, const proto_msg_t *msg);
void rtr_emb_job_down(rtr_t *r, rtr_backend_t *be);

/* rtr_flow.c */
pd_status_t rtr_admin_requests(pd_admin_req_t *req, struct cJSON *reply);

#endif
