/* pb_int.h - pd-bench's private header: the configuration, the run state
 * (request slots, conversations, a pass's records) and what pd-bench's
 * files share (pb_main.c, pb_workload.c, pb_run.c, pb_report.c). */
#ifndef PB_INT_H
#define PB_INT_H

#include "pd_httpc.h"
#include "pb_stats.h"
#include "pb_work.h"
#include "pd_config.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct bufferevent;
struct event;
struct event_base;

#define PB_PROG             "pd-bench"
#define PB_MAX_CONCURRENCY  4096
#define PB_MAX_REQUESTS     1000000
#define PB_MAX_ITL          65536     /* ITL samples kept per request */
#define PB_MAX_PROMPT_LINES 100000
#define PB_MAX_PROMPT_FILE  (64u << 20)
#define PB_RATE_DEFAULT_CAP 1024      /* slots in rate mode without --concurrency */
#define PB_MAX_ANSWER       (1u << 20) /* multi-turn: answer bytes kept per turn */
#define PB_BODY_MAX         (1ULL << 30) /* one response body, de-chunked */
#define PB_MAX_CONV_BYTES   (16u << 20) /* multi-turn: history bytes per conversation */

/* ---- configuration ----------------------------------------------------- */

typedef enum { PB_EP_COMPLETIONS, PB_EP_CHAT } pb_endpoint_t;

typedef enum {
    PB_WL_SYNTHETIC, PB_WL_MULTI_TURN, PB_WL_SHARED_PREFIX, PB_WL_TRACE,
} pb_workload_t;
/* pb_workload_t's names (--workload), NULL-terminated; pb_main.c. */
extern const char *const pb_workload_names[];

typedef struct {
    char *url;
    int endpoint;
    char *model;
    char *api_key;
    double rate;
    uint64_t concurrency;
    char *input_len;
    char *output_len;
    char *prompts;
    uint64_t warmup;
    uint64_t duration_ns;
    uint64_t num_requests;
    bool ignore_eos;
    uint64_t seed;
    char *slo;
    char *out;
    uint64_t request_timeout_ns;
    double temperature;
    bool quiet;
    bool no_per_request;
    bool keep_alive;
    char *baseline;
    char *prompt_ids;
    int workload;
    uint64_t conversations;
    uint64_t turns;
    uint64_t system_len;
    uint64_t prefix_len;
    uint64_t prefix_groups;
    uint64_t prefix_prompts;
    char *trace;
    uint64_t block_size;
    double trace_speed;
    char *compare;
    char *compare_model;
} pb_config_t;

/* The flag table of pb_config_t (flags, env PD_BENCH_*, --help); pb_main.c. */
extern const pd_cfg_schema_t pb_schema;

/* ---- run state --------------------------------------------------------- */

typedef struct {
    char *prompt;
    uint32_t max_tokens;        /* 0 = from --output-len */
} pb_prompt_t;

typedef struct pb_run pb_run_t;

typedef enum { SLOT_FREE, SLOT_ACTIVE, SLOT_FINISHED } pb_slot_state_t;

typedef struct pb_slot {
    pb_run_t *run;
    pb_slot_state_t state;
    bool warmup;
    bool connected;
    bool got_done;
    bool got_error_frame;
    bool reused;                /* this request went on a kept-alive conn */
    bool bev_dead;              /* idle connection closed by the server */
    uint32_t rec_idx;           /* into run->recs (main phase) */
    pb_record_t rec;            /* filled while running, copied on reap */
    struct bufferevent *bev;
    struct event *timer;        /* request timeout */
    uint64_t t_send;
    uint64_t t_last;            /* last content chunk */
    uint64_t t_now;             /* stamp of the current read */
    uint64_t t_done;            /* [DONE] seen (body may still be ending) */
    uint32_t itl_cap;
    pd_httpc_resp_t http;
    pd_sse_t sse;
    bool got_bytes;             /* a response byte arrived on this connection */
    bool retried;               /* resent once on a fresh connection */
    char *req;                  /* request bytes (kept for the one resend) */
    size_t req_len;
    uint32_t conv;              /* multi-turn: conversation of this request */
    char *user_msg;             /* multi-turn: the new user message sent */
    char *answer;               /* multi-turn: streamed content (capped) */
    size_t ans_len, ans_cap;
    char errbody[160];
    size_t errbody_len;
    struct pb_slot *next;       /* free list */
} pb_slot_t;

typedef enum { PHASE_WARMUP, PHASE_MAIN, PHASE_DONE } pb_phase_t;

/* Multi-turn: one conversation's history (user/assistant messages). */
typedef struct {
    cJSON *msgs;
    uint32_t turn;              /* turns finished */
    size_t bytes;               /* history size (capped) */
} pb_conv_t;

struct pb_run {
    pb_config_t cfg;
    pb_endpoint_t endpoint;
    bool rate_mode;
    uint32_t n_slots;
    uint64_t num_requests;      /* 0 = only duration bounds */
    pb_dist_t in_dist, out_dist;
    bool use_ids;               /* --prompt-ids */
    uint32_t id_lo, id_hi;
    pb_slo_t slo;
    pb_rng_t rng_prompt, rng_arrival;
    pb_prompt_t *prompts;
    size_t n_prompts;
    /* target */
    char host_hdr[300];
    char path[512];
    struct sockaddr_storage addr;
    socklen_t addrlen;
    /* loop */
    struct event_base *base;
    struct event *pump_ev;
    struct event *arrival_ev;
    struct event *deadline_ev;
    struct event *sigint_ev;
    pb_slot_t *slots;
    pb_slot_t *free_slots;
    uint32_t inflight;
    uint32_t max_inflight;
    pb_phase_t phase;
    uint64_t warm_issued;
    /* main phase */
    uint64_t t0, t_end_issue, t_last_done;
    uint64_t next_arrival_ns;
    uint64_t arrivals;          /* rate mode: arrivals generated */
    bool arrivals_over;
    uint64_t pending;           /* arrived, waiting for a slot */
    uint64_t issued;
    bool stopping;              /* SIGINT: issue nothing more */
    pb_record_t *recs;
    size_t n_recs, cap_recs;
    cJSON *baseline;            /* --baseline file, parsed at boot */
    /* workloads */
    pb_workload_t workload;
    pb_trace_t trace;
    pb_conv_t *convs;
    uint32_t n_convs;
    uint32_t *ready;            /* ring of conversations ready for a turn */
    uint32_t ready_head, ready_n;
    uint64_t skipped_turns;     /* turns not sent (their conversation ended) */
    uint64_t idle_closed;       /* kept-alive connections closed while idle */
    /* target of this pass (--url, then --compare) */
    const char *target_url;
    const char *model;
    char *model_fetched;        /* owned */
};

/* ---- pb_workload.c: what each request sends ----------------------------- */

/* --prompts FILE (JSONL) into run->prompts. PD_OK, or PD_ERR_IO /
 * PD_ERR_BAD_INPUT with the reason printed. */
pd_status_t pb_load_prompts(pb_run_t *run, const char *path);
/* Append {"role": role, "content": content} to the array msgs. */
bool pb_add_message(cJSON *msgs, const char *role, const char *content);
/* The HTTP request of slot s (request number seq of its phase): the body of
 * the run's workload (synthetic for warm-up), headers for run->path. Sets
 * s->rec.input_tokens (multi-turn: s->user_msg, turn, conv). Returns
 * malloc'd bytes and their length in *len_p, or NULL. */
char *pb_build_request(pb_run_t *run, pb_slot_t *s, uint64_t seq, size_t *len_p);

/* ---- pb_run.c: one pass of the workload against one server -------------- */

/* The event loop, its pump/arrival/deadline/SIGINT events and the slot
 * pool (n_slots); run_free() in pb_main.c frees them. 0, or 1 when out of
 * memory. */
int pb_loop_setup(pb_run_t *run);
/* http://HOST[:PORT][/PATH] into run->host_hdr, run->path (+ /v1 and the
 * endpoint) and run->addr (resolved now). PD_OK, or PD_ERR_BAD_INPUT with
 * the reason printed. */
pd_status_t pb_parse_url(pb_run_t *run, const char *url);
/* Prepare a pass against url with model (NULL: GET /v1/models) and kick
 * the pump; event_base_dispatch() then runs it to its end. 0, or an exit
 * code (PD_CONFIG_EXIT_USAGE for a bad URL, 1 otherwise). */
int pb_pass_begin(pb_run_t *run, const char *url, const char *model);

/* ---- pb_report.c: results, the table, comparisons ------------------------ */

/* The whole result of the pass just run (config, results, slo, requests). */
cJSON *pb_build_json(pb_run_t *run, const pb_aggregate_t *agg);
/* The result table on stdout (per_turn: results.per_turn or NULL). */
void pb_print_table(pb_run_t *run, const pb_aggregate_t *agg, const cJSON *per_turn);
/* --baseline FILE into run->baseline. PD_OK, or PD_ERR_IO / PD_ERR_BAD_INPUT
 * with the reason printed. */
pd_status_t pb_load_baseline(pb_run_t *run, const char *path);
/* Every figure of results a that b has too, side by side with the ratio
 * b / a (printed under title unless --quiet); the JSON of the comparison. */
cJSON *pb_compare_results(pb_run_t *run, const cJSON *a, const cJSON *b,
                          const char *title, const char *col_a,
                          const char *col_b, const char *a_key,
                          const char *b_key);

#endif
