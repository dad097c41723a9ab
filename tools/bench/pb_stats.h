/* pb_stats.h - pure pieces of pd-bench: seeded random numbers, length
 * distributions, SLO parsing, per-request records, percentiles and the
 * aggregate figures (`vllm bench serve` names). No I/O, no allocation
 * except where a function says so; unit-tested in tests/tools. */
#ifndef PB_STATS_H
#define PB_STATS_H

#include "pd_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- random numbers (splitmix64: small, seedable, good enough) ------- */
typedef struct {
    uint64_t s;
} pb_rng_t;

void pb_rng_seed(pb_rng_t *rng, uint64_t seed);
uint64_t pb_rng_next(pb_rng_t *rng);
/* Uniform double in [0, 1). */
double pb_rng_uniform(pb_rng_t *rng);
/* Exponential inter-arrival gap in seconds for a Poisson process of
 * `rate` events/s (rate > 0). */
double pb_rng_exp(pb_rng_t *rng, double rate);

/* ---- length distributions: "N", "fixed:N", "uniform:A:B" ------------- */
typedef enum { PB_DIST_FIXED, PB_DIST_UNIFORM } pb_dist_kind_t;
typedef struct {
    pb_dist_kind_t kind;
    uint32_t a, b;          /* FIXED: a; UNIFORM: inclusive [a, b] */
} pb_dist_t;

#define PB_LEN_MAX 1000000u  /* hard cap on any token length */

/* Parse a distribution. PD_ERR_BAD_INPUT on bad text, a > b, a zero or a
 * value above PB_LEN_MAX. *dist_p set only on success. */
pd_status_t pb_dist_parse(const char *text, pb_dist_t *dist_p);
uint32_t pb_dist_sample(const pb_dist_t *dist, pb_rng_t *rng);

/* ---- SLOs: "ttft=200ms,tpot=50ms,e2el=2s" (any subset; bare number = ms,
 * as vllm's --goodput) ------------------------------------------------- */
typedef struct {
    bool has_ttft, has_tpot, has_e2el;
    uint64_t ttft_ns, tpot_ns, e2el_ns;
} pb_slo_t;

/* Empty or NULL text = no SLO (all fields false). PD_ERR_BAD_INPUT on an
 * unknown key, a bad duration or a repeated key. */
pd_status_t pb_slo_parse(const char *text, pb_slo_t *slo_p);
bool pb_slo_any(const pb_slo_t *slo);

/* ---- per-request record ------------------------------------------------ */
/* Error kinds: X(enum suffix, JSON name). NONE means success. */
#define PB_ERR_KINDS(X)                                                       \
    X(NONE,         "none")                                                   \
    X(CONNECT,      "connect")       /* TCP connect failed */                 \
    X(DISCONNECT,   "disconnect")    /* closed before response headers */     \
    X(TIMEOUT,      "timeout")       /* --request-timeout or run deadline */  \
    X(HTTP_4XX,     "http_4xx")                                               \
    X(HTTP_5XX,     "http_5xx")                                               \
    X(HTTP_OTHER,   "http_other")    /* 1xx/3xx or 2xx other than 200 */      \
    X(STREAM_ERROR, "stream_error")  /* data: {"error":...} frame */          \
    X(NO_DONE,      "no_done")       /* stream ended without [DONE] */        \
    X(PROTOCOL,     "protocol")      /* malformed HTTP, SSE or JSON */

typedef enum {
#define PB_ERR_ENUM(name, str) PB_ERR_##name,
    PB_ERR_KINDS(PB_ERR_ENUM)
#undef PB_ERR_ENUM
    PB_ERR_COUNT
} pb_err_kind_t;

const char *pb_err_kind_name(pb_err_kind_t kind);

typedef struct {
    uint32_t id;
    bool success;               /* 200 + [DONE], no error frame */
    pb_err_kind_t err;
    int http_status;            /* 0 if no response */
    uint64_t start_ns;          /* send time, relative to the run's t0 */
    uint64_t ttft_ns;           /* 0 if no content chunk arrived */
    uint64_t e2el_ns;
    uint32_t input_tokens;      /* usage.prompt_tokens, else requested */
    uint32_t output_tokens;     /* usage.completion_tokens, else chunks */
    uint32_t content_chunks;
    bool usage_seen;
    bool conn_reused;           /* sent on a kept-alive connection */
    bool reconnected;           /* that connection was closed before any
                                   response byte; resent once on a new one */
    bool cached_seen;           /* usage.prompt_tokens_details.cached_tokens */
    uint32_t cached_tokens;
    uint32_t turn;              /* multi-turn: 0-based turn; else 0 */
    uint32_t conv;              /* multi-turn: conversation index */
    uint32_t n_itl;
    uint64_t *itl_ns;           /* (n_itl) gaps between content chunks;
                                   owned by the record, may be NULL */
    char err_msg[160];
} pb_record_t;

/* TPOT in ns: (e2el - ttft) / (output_tokens - 1); 0 when output_tokens
 * <= 1 or no first token (undefined, like vllm). */
double pb_record_tpot_ns(const pb_record_t *rec);
/* A successful record that meets every SLO given (TPOT undefined passes). */
bool pb_slo_met(const pb_slo_t *slo, const pb_record_t *rec);

/* ---- percentiles and summaries ----------------------------------------- */
/* q in [0, 100] over sorted values; linear interpolation between closest
 * ranks (numpy's default). n == 0 -> 0. */
double pb_percentile(const double *sorted, size_t n, double q);

typedef struct {
    size_t n;
    double mean, std, min, max;
    double median, p50, p90, p99;
} pb_summary_t;

/* Sorts `values` in place and fills *sum (all zero when n == 0). */
void pb_summary(double *values, size_t n, pb_summary_t *sum);

typedef struct {
    uint32_t num_requests;      /* records given */
    uint32_t completed;         /* successes */
    uint32_t failed;
    uint32_t good;              /* successes meeting the SLOs */
    uint32_t errors[PB_ERR_COUNT];
    uint64_t total_input_tokens;
    uint64_t total_output_tokens;
    uint32_t reconnects;        /* records with reconnected set (any outcome) */
    uint32_t cached_reported;   /* successes whose usage had cached_tokens */
    uint64_t total_cached_tokens;
    double duration_s;
    double request_throughput;  /* completed / duration */
    double request_goodput;     /* good / duration (all completed if no SLO) */
    double output_throughput;   /* output tokens of completed / duration */
    double total_token_throughput;
    pb_summary_t ttft_ms, tpot_ms, itl_ms, e2el_ms;
} pb_aggregate_t;

/* Aggregate records over duration_ns (> 0). Only successful records feed
 * tokens and latencies (as vllm); TTFT/TPOT only those with a content chunk. PD_ERR_NO_MEMORY possible (scratch
 * arrays). */
pd_status_t pb_aggregate(const pb_record_t *recs, size_t n,
                         const pb_slo_t *slo, uint64_t duration_ns,
                         pb_aggregate_t *agg);

#endif
