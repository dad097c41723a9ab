/* rtr_flow.h - pd-router's request life cycle (rtr_flow.c) and the few
 * output calls through which it reaches the client and the backends
 * (rtr_flow_out_t). The flow never includes evhttp: rtr_http.c plugs the
 * evhttp front end in (rtr_http_out); the unit test plugs a recorder in and
 * drives the state machine without sockets.
 *
 * Who calls what:
 *   rtr_http.c: rtr_flow_route + rtr_flow_new + rtr_flow_start (intake),
 *     rtr_flow_client_gone (EOF, close, slow), rtr_flow_fail_all (drain
 *     timeout, stop), rtr_flow_check_idle (drain);
 *   rtr_ctl.c, through r->on_backend_msg / r->on_backend_down /
 *     r->on_backend_drain (set by rtr_main.c): rtr_flow_on_msg,
 *     rtr_flow_backend_down, rtr_flow_migrate_from;
 *   rtr_flow_find: rtr_flow_on_msg (a backend message's wire id) and the
 *     unit test;
 *   rtr_flow.c -> rtr_ctl.c: rtr_choose_backend (every rule of the
 *     choice: rtr_policy.c).
 * Every accepted request ends exactly once, in req_end, reached from
 * req_complete, req_fail or rtr_flow_client_gone. */
#ifndef RTR_FLOW_H
#define RTR_FLOW_H

#include "pd_idhash.h"
#include "rtr_fd.h"
#include "rtr_int.h"

struct evhttp_request;
struct evhttp_connection;
struct event;

/* The front end's per-request state: the flow carries it, never reads it. */
typedef struct {
    struct evhttp_request *http;         /* NULL once the client is gone */
    struct evhttp_request *orphan;       /* detached by libevent: ours to free */
    struct evhttp_connection *evcon;
    struct event *watch;                 /* client EOF watcher, then the
                                            half-close probe's timer */
    int probe_fd;                        /* the client socket being probed */
    uint32_t slow_checks;
    int status;                          /* HTTP status sent (0: none): access log */
    const char *endpoint;                /* "/v1/completions" ...: access log */
    char peer[64];                       /* client address:port: access log */
} rtr_client_t;

struct rtr_req {
    rtr_t *r;
    rtr_req_t *prev, *next;              /* r->reqs */
    pd_idhash_node_t hnode;              /* by wire_id */
    rtr_client_t client;                 /* the front end's */
    struct event *timer;                 /* request timeout */
    char id[PROTO_REQID_MAX + 1];        /* the client's (X-Request-Id): logs, headers */
    char wire_id[PROTO_REQID_MAX + 1];   /* ours, unique per router run: the
                                            only id daemons see and answer to */
    char resp_id[PROTO_REQID_MAX + 16];
    int64_t created;                     /* unix seconds at acceptance: the response's "created" */
    rtr_req_fsm_t fsm;
    rtr_oai_req_t oai;
    int32_t *prompt;                     /* (n_prompt) */
    uint32_t n_prompt;
    int32_t *gen;                        /* (n_gen) tokens streamed to the client */
    uint32_t n_gen, cap_gen;
    rtr_oai_logprob_t *lps;              /* (cap_gen) when oai.logprobs: gen's logprobs */
    uint64_t lp_chars;                   /* completions text_offset streamed so far */
    rtr_backend_t *prefill, *decode;
    rtr_backend_t *export_from;          /* EXPORTING: the decode asked for its
                                            cached prefix (KV_EXPORT_REQ) */
    struct event *xtimer;                /* EXPORTING: kv-export-timeout */
    uint64_t lease_id;
    uint32_t cached_tokens;              /* prompt tokens the computing daemon
                                            reused (PREFILL_DONE, or FINISH
                                            when decode-local): usage */
    bool lease_held;                     /* PREFILL_DONE seen, lease not handed on */
    bool early_dec;                      /* PREFILLING: the decode has the streamed
                                            handle (DECODE_REQ TOKEN0_LATER) and
                                            waits for FIRST_TOKEN */
    bool src_used;                       /* PREFILL_REQ carried a decode's prefix */
    rtr_backend_t *early_end_be;         /* a canceled early copy lives there until
                                            its one answer (ERROR / FINISH) comes */
    bool retry_deferred;                 /* the retry goes to early_end_be: it
                                            waits for that answer (same id) */
    bool disagg;
    bool headers_sent;
    bool role_sent;                      /* chat: the choice's role chunk */
    uint32_t retries;
    uint32_t failovers;                  /* decode losses survived mid-stream */
    uint64_t t_failover_ns;              /* last failover, until the next token: resume time */
    rtr_backend_t *migrate_to;           /* MIGRATE sent, MIGRATE_DONE not yet */
    bool migrated;                       /* MIGRATE_DONE seen: resume time pending */
    bool drain_kept;                     /* left on a draining decode (counted once) */
    uint64_t t_dec_req_ns;               /* last DECODE_REQ sent (0 = none yet) */
    uint64_t t_migrate_ns;               /* MIGRATE sent */
    uint32_t migrate_kv;                 /* the KV tokens that move would pull */
    uint32_t next_tok_seq;
    rtr_textpipe_t pipe;
    char *text;                          /* non-streaming: whole completion */
    size_t text_len, text_cap;
    uint64_t t_accept_ns, t_last_tok_ns;
    uint64_t t_first_tok_ns;             /* first token to the client (TTFT; a lead:
                                            its first choice's) */
    uint64_t gap1_ns, t_tok1_ns;         /* token 0 -> token 1 (a step + the KV pull's
                                            tail), and when token 1 came */
    /* n > 1 ("choices" in rtr_flow.c): the client's request is the lead:
     * it holds the client and the timer and talks to no daemon; each
     * choice is a request of its own (own wire id, seed + i, retries,
     * failover) whose output goes to the lead's client. */
    rtr_req_t *lead;                     /* a choice: its lead (else NULL) */
    uint32_t choice;                     /* a choice: its index */
    bool fork_pending;                   /* choice i > 0: rides on choice 0's
                                            DECODE_REQ (n_fork), not sent yet */
    /* tools: while the answer may be (MAYBE) or is (CALL) a tool call its
     * text is held in `text`; at the end it is parsed into calls */
    uint8_t tool_scan;                   /* RTR_TOOL_* */
    rtr_oai_call_t *calls;               /* (n_calls) the answer's, ids set */
    uint32_t n_calls;
    struct rtr_choices *ch;              /* the lead's */
    rtr_fd_stream_t fd;                  /* Messages / Responses streams (rtr_fd.h) */
};

/* The lead's record of its choices: live ones and the results of ended
 * ones (non-streaming responses are written when the last one ends). */
typedef struct rtr_choices {
    uint32_t n, open;
    rtr_req_t *c[RTR_OAI_MAX_N];         /* NULL once ended */
    char *text[RTR_OAI_MAX_N];
    size_t text_len[RTR_OAI_MAX_N];
    const char *finish[RTR_OAI_MAX_N];
    rtr_oai_logprob_t *lps[RTR_OAI_MAX_N];
    uint32_t n_gen[RTR_OAI_MAX_N];
    uint64_t lp_chars[RTR_OAI_MAX_N];
    rtr_oai_call_t *calls[RTR_OAI_MAX_N];
    uint32_t n_calls[RTR_OAI_MAX_N];
    uint32_t cached_tokens;              /* choice 0's: usage */
} rtr_choices_t;

enum { RTR_TOOL_OFF = 0, RTR_TOOL_MAYBE = 1, RTR_TOOL_CALL = 2 };

/* The output calls. */
struct rtr_flow_out {
    /* Is a client still there to answer (no reply sent / ended yet)? */
    bool (*attached)(const rtr_req_t *q);
    /* Open the SSE response (200, text/event-stream, X-Request-Id, X-Seed). */
    void (*stream_open)(rtr_req_t *q);
    /* Bytes on the open response (SSE frames, [DONE]). */
    void (*write)(rtr_req_t *q, const char *bytes, size_t len);
    /* End the open response; the client is detached after. */
    void (*stream_end)(rtr_req_t *q);
    /* One whole reply: json (status) or, with err, an OpenAI error body
     * (err->http_status, Retry-After on 429/503); detaches the client. A
     * 200 carries X-Seed: the seed the request sampled with. */
    void (*reply)(rtr_req_t *q, int status, const char *json, const rtr_oai_error_t *err);
    /* The client does not read (output over client-max-unsent). */
    bool (*slow)(rtr_req_t *q);
    /* Forget the client; close its connection if it still holds one. */
    void (*drop)(rtr_req_t *q);
    /* The request reached its terminal state (once): stop watching the
     * client; while draining, keep its connection until it flushed. */
    void (*ended)(rtr_req_t *q);
    /* The request's memory goes (deferred): free the front end's part. */
    void (*release)(rtr_req_t *q);
    /* Draining and no request is left. */
    void (*idle)(rtr_t *r);
    /* A message to a backend; PD_ERR_PEER_GONE if it is down. */
    pd_status_t (*send)(rtr_backend_t *be, proto_msg_t *msg);
};

/* The live request with this wire id (what daemons answer to), or NULL.
 * Not the client's X-Request-Id: the front end never looks requests up. */
rtr_req_t *rtr_flow_find(const rtr_t *r, const char *id);

/* Intake. route: the daemons for a new request (a decode always; a
 * prefill when disaggregating: returns true then; a request is
 * disaggregated only when a prefill is eligible, rtr_should_disaggregate
 * decides on what the chosen decode lacks); KV-aware when the router has
 * a KV index: the prompt's block names in the request's cache partition
 * (pd_blockname.h; o->cache_partition) are looked up
 * (rtr_kvindex_match) and the choice is rtr_pick_prefill_kv /
 * rtr_pick_decode_kv's. new: allocate, link, count, RECEIVED -> ROUTED;
 * takes *o and *ids (zeroed) unless PD_ERR_NO_MEMORY; draws a fresh seed
 * when the client gave none; stamps "created"; PD_ERR_BAD_INPUT:
 * bad stop strings (nothing linked). start: timeout, PREFILL_REQ or
 * decode-local (pre == NULL); before the PREFILL_REQ, when a decode holds
 * at least kv-pull-min-blocks more of the prompt than the prefill
 * (rtr_pick_prefix_source), KV_EXPORT_REQ to that decode (EXPORTING): its
 * KV_EXPORT_DONE goes to the prefill as PREFILL_REQ's source; an ERROR,
 * no answer within kv-export-timeout or its loss: plain PREFILL_REQ. */
bool rtr_flow_route(rtr_t *r, const int32_t *prompt, uint32_t n_prompt, uint32_t max_tokens,
                    uint64_t partition, rtr_backend_t **dec, rtr_backend_t **pre);
pd_status_t rtr_flow_new(rtr_t *r, const char *reqid, rtr_api_t api, rtr_oai_req_t *o,
                         int32_t **ids, uint32_t n_ids, rtr_req_t **q_p);
void rtr_flow_start(rtr_req_t *q, rtr_backend_t *dec, rtr_backend_t *pre);

/* The client went away (why: for the log): CANCEL upstream, RELEASE a held
 * lease, drop the client, CANCELED. */
void rtr_flow_client_gone(rtr_req_t *q, const char *why);

/* PREFILL_DONE, TOKENS, FINISH, ERROR, MIGRATE_DONE, KV_EXPORT_DONE from a
 * backend. */
void rtr_flow_on_msg(rtr_t *r, rtr_backend_t *be, const proto_msg_t *msg);
/* A backend went down: retry or fail its requests. */
void rtr_flow_backend_down(rtr_t *r, rtr_backend_t *be);
/* Live migration: ask the decode `be` to hand each stream it is running to
 * another decode (MIGRATE). Streams with nowhere to go stay. Returns how
 * many were asked. */
uint32_t rtr_flow_migrate_from(rtr_t *r, rtr_backend_t *be);

/* End every live request with 503 shutting_down (why: the message). */
void rtr_flow_fail_all(rtr_t *r, const char *why);
/* Draining and nothing live: out->idle. */
void rtr_flow_check_idle(rtr_t *r);

#endif
