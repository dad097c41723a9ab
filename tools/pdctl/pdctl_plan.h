/* pdctl_plan.h - the SLO planner (issue 35): how many of a fixed budget of
 * daemons prefill and how many decode.
 *
 * pdctl_plan_core.c is the pure part: one tick's measured figures
 * (pdctl_plan_in_t) + the planner's state -> a decision (pdctl_plan_out_t).
 * No I/O, no clock, no globals: tests/pdctl/test_plan_core.c drives it with
 * made-up figures. pdctl_plan.c is the controller around it: it reads the
 * routers' and daemons' admin sockets, calls the core each tick, logs every
 * decision with its inputs, exports pd_planner_* metrics, and acts through
 * `pdctl scale` (drain with live migration, start, ready), one leader per
 * deployment.
 *
 * The model (from measurement, not constants):
 *   prefill capacity  = computed prompt tokens / compute time, measured on
 *                       the prefill daemons (the router's disagg-mode=cost
 *                       rate until a prefill ran);
 *   decode capacity   = b_cap / step(b_cap) tokens/s, step(b) = a + k*b
 *                       fitted (Theil-Sen: median of pairwise slopes, robust
 *                       to steps slowed by CPU contention) to the decodes'
 *                       (mean batch, mean step time) of recent ticks (in
 *                       separate pools not a tick with decode-local prompt
 *                       chunks, nor the first window after a re-split ended),
 *                       b_cap the largest batch whose step meets tpot-p90, at
 *                       most what a decode's KV holds and its max-batch;
 *   need (daemons)    = demand / (capacity * target-util), demand = the
 *                       uncached prompt tokens/s (prefill) and generated
 *                       tokens/s (decode) the routers saw; times
 *                       min(2, p90 / target) of that pool's SLO when it is
 *                       missed (decode: only as far as the decodes' own mean
 *                       step misses it too - the gap after token 0 holds the
 *                       KV pull); smoothed (EWMA, time constant `window`);
 *   split             = budget * need_p / (need_p + need_d), clamped to
 *                       [min-prefill, budget - min-decode].
 *   mode              = PD-mixed (0 prefills, all decodes, router
 *                       disagg-mode = never) when the prompts are light work:
 *                       their compute (uncached prompt tokens/s x the measured
 *                       seconds a token, smoothed) is less than
 *                       PDCTL_PLAN_MIXED_WORK of one daemon, so a dedicated
 *                       prefill would idle most of its time, and the decodes
 *                       lack it: their load (need_d x target-util, in
 *                       PD-mixed + the prompt work) exceeds the budget - 1
 *                       daemons separate pools leave them (out of PD-mixed
 *                       PDCTL_PLAN_MIXED_LOAD_HYST below; the three-phase
 *                       benchmark's chat carries 4.5 on five decodes, and
 *                       1P:5D beat PD-mixed there); or when the KV pull is the bottleneck: the
 *                       predicted pull of a mean prompt (prompt length x the
 *                       routers' gap token 0 -> 1 per pulled token: the pull's
 *                       tail after the prompt pass) misses tpot-p90 by
 *                       PDCTL_PLAN_MODE_MARGIN and a pulled token costs more
 *                       than computing it on the decode, where a local prompt
 *                       stalls every sequence of the batch (local time a token
 *                       x (1 + mean batch), the routers' cost-mode formula).
 *                       Separate pools otherwise; each bound with the margin
 *                       as hysteresis. Only with min-prefill = 0. In PD-mixed
 *                       the prefill rate is the decodes' own (the routers'
 *                       dec_tok_ns) until a prefill daemon has run.
 *   decode need       also counts the KV pulls separate pools put on the
 *                       decodes (uncached tokens/s x pull time a token).
 * No flapping: a re-split needs the fractional split to be more than
 * 0.5 + hysteresis daemons from the running one even at the near edge of its
 * noise band (need_p and need_d each `noise-band` standard errors the other
 * way; relative error 1/sqrt(2 x requests/s x window), Poisson arrivals, so
 * a low rate, whose average holds few requests, needs a larger move), the
 * same target for `confirm` ticks in a row, and `dwell` since the last
 * re-split ended (a window, if shorter, when it moves the same way as the
 * last one: that is no flap); a mode switch, its margin, `confirm` and
 * `dwell`. Between separate splits a re-split moves one prefill more, or
 * toward fewer prefills as far as the noise band's high edge (the most
 * prefills the noise allows). Measures settle after a change: the pull's
 * cost counts from a window after a re-split ends (its first pulls carry
 * the backlog), the prompt work from a dwell (at least a window) after a
 * mode switch ends (the new mode's prefix caches start cold, and its first
 * prompts look several times heavier than the mode's own steady state);
 * the mode moves only when the far edge of the prompt work's noise band is
 * past the margin. */
#ifndef PDCTL_PLAN_H
#define PDCTL_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "pd_config.h"

/* X(id, name in logs and metrics, what it means) */
#define PDCTL_PLAN_REASONS(X)                                                         \
    X(NO_DATA,      "no_data",      "hold: capacities not measured yet")               \
    X(IDLE,         "idle",         "hold: no traffic in the window")                  \
    X(BALANCED,     "balanced",     "hold: the running split is within hysteresis")    \
    X(CONFIRM,      "confirm",      "hold: the new split has not held for `confirm` ticks") \
    X(DWELL,        "dwell",        "hold: the last re-split is younger than `dwell` (a step the same way: `window`)") \
    X(MORE_PREFILL, "more_prefill", "re-split: prefill daemons are short")             \
    X(MORE_DECODE,  "more_decode",  "re-split: decode daemons are short")              \
    X(BUDGET,       "budget",       "re-split: the deployment's size is not the budget") \
    X(MIXED,        "mixed",        "hold: PD-mixed, every daemon decodes and prefills its own prompts") \
    X(TO_MIXED,     "to_mixed",     "switch: PD-mixed, the prompts are light work or a KV pull costs more than its local prefill") \
    X(TO_SEPARATE,  "to_separate",  "switch: separate pools, the prompts are heavy work and the KV pull is cheap enough")

typedef enum {
#define PDCTL_X_REASON(id, name, help) PDCTL_PLAN_##id,
    PDCTL_PLAN_REASONS(PDCTL_X_REASON)
#undef PDCTL_X_REASON
    PDCTL_PLAN_REASON_N
} pdctl_plan_reason_t;

const char *pdctl_plan_reason_name(pdctl_plan_reason_t r);
const char *pdctl_plan_reason_help(pdctl_plan_reason_t r);

/* The [planner] section of a deployment file (pdctl_plan_schema rows). */
typedef struct {
    uint64_t budget;           /* prefill + decode daemons; 0: the file's prefill + decode */
    uint64_t min_prefill, min_decode;
    uint64_t ttft_p90_ns, tpot_p90_ns;   /* SLO targets */
    double target_util;        /* plan to this fraction of measured capacity */
    double hysteresis;         /* daemons beyond 0.5 before a re-split */
    double noise_z;            /* the noise band: standard errors of the needs' averages */
    uint64_t dwell_ns;         /* least time between re-splits */
    uint64_t confirm;          /* ticks the same new split must hold */
    uint64_t interval_ns;      /* one tick */
    uint64_t window_ns;        /* EWMA time constant of the demand */
    char *etcd;                /* leader election in etcd (host:port); NULL: the
                                  deployment's etcd, else flock on the run dir */
    char *metrics_listen;      /* the leader's /metrics (host:port), NULL: none */
    bool act;                  /* false: decide and export only (an external scaler acts) */
    char *separate_mode;       /* the routers' disagg-mode after PD-mixed */
} pdctl_plan_cfg_t;

extern const pd_cfg_schema_t pdctl_plan_schema;

/* Decode samples one tick carries at most (one per decode daemon). */
#define PDCTL_PLAN_MAX_SAMPLES 32
/* (batch, step) points the decode fit keeps. */
#define PDCTL_PLAN_FIT_POINTS 48

/* One tick's figures: counts over the last dt_s seconds, all routers. */
typedef struct {
    uint64_t now_ns;
    double dt_s;                   /* seconds the deltas cover; 0: first tick */
    unsigned n_prefill, n_decode;  /* daemons running now */
    double requests;               /* accepted */
    double prompt_tokens, cached_tokens, gen_tokens;
    double ttft_p90_s, itl_p90_s;  /* over dt_s; 0: none observed */
    double pf_tokens, pf_busy_s;   /* prefill daemons: computed tokens, their compute time */
    double pf_tok_s_hint;          /* the router's cost-mode rate (tokens/s), 0: none */
    unsigned n_dec;                /* decode samples below */
    struct {
        double batch;              /* mean sequences per step */
        double step_s;             /* mean step time */
        bool chunked;              /* it ran decode-local prompt chunks: its steps hold
                                      prompt work (kept out of the fit once it has points) */
    } dec[PDCTL_PLAN_MAX_SAMPLES];
    double dec_max_batch;          /* sequences a decode runs: what its KV holds, at most its
                                      max-batch (0: unknown) */
    double pull_tok_s;             /* this tick's KV pull cost per pulled token: the routers'
                                      kv_pull_tail (gap token 0 -> 1 minus a step) over
                                      kv_pull_tail_tokens; 0: none this tick */
    double hop_s;                  /* the routers' fixed hop (cost mode), 0: not measured */
    double local_tok_s;            /* the routers' decode-local prompt time per token
                                      (dec_tok_ns), 0: not measured */
    bool mixed;                    /* running PD-mixed (the routers' disagg-mode = never) */
} pdctl_plan_in_t;

/* Hysteresis of the mode: the pull must miss (meet) the TPOT target by this
 * factor to switch to PD-mixed (back to separate pools). */
#define PDCTL_PLAN_MODE_MARGIN 1.25
/* PD-mixed while the prompts' compute is below this share of one daemon
 * (into PD-mixed below it / margin, out above it x margin). */
#define PDCTL_PLAN_MIXED_WORK 0.5
/* ... and while the decodes' load exceeds budget - 1 daemons (into PD-mixed
 * above it, out below it minus this many daemons). */
#define PDCTL_PLAN_MIXED_LOAD_HYST 0.5

#define PDCTL_PLAN_NO_PENDING 2

/* What the planner carries from tick to tick. Zero it to start. */
typedef struct {
    bool primed;                   /* a tick with dt_s > 0 was seen */
    double need_p, need_d;         /* smoothed need, in daemons */
    double pf_tok_s;               /* measured capacity of one prefill */
    double fit_b[PDCTL_PLAN_FIT_POINTS], fit_s[PDCTL_PLAN_FIT_POINTS];
    unsigned fit_n, fit_next;
    double max_batch;
    int pending;                   /* direction awaiting confirm: +1 more prefill, -1 more
                                      decode, 0 size only; PDCTL_PLAN_NO_PENDING */
    unsigned pending_ticks;
    int last_dir;                  /* the last re-split's direction (+1 more prefill, -1
                                      more decode); 0: none yet, or a mode switch */
    uint64_t last_change_ns;       /* the last re-split or mode switch: its decision, then
                                      its end (pdctl_plan_applied); 0: never */
    uint64_t mode_change_ns;       /* the same for the last mode switch; 0: never */
    double prompt_len;             /* smoothed uncached prompt tokens per request */
    double req_rate;               /* smoothed requests/s (the noise band's sample size) */
    bool primed_rate;
    double prompt_work;            /* smoothed prompt compute, in daemons (-1: none yet), from
                                      ticks a dwell (at least a window) after a mode switch */
    double mean_batch;             /* smoothed sequences per decode step */
    double pull_tok_s;             /* smoothed pull cost per token (0: never measured), from
                                      ticks a window or more after the last re-split */
    int mode_pending;              /* -1 none, 0 separate, 1 mixed awaiting confirm */
    unsigned mode_ticks;
    uint64_t decisions[PDCTL_PLAN_REASON_N];
} pdctl_plan_state_t;

typedef struct {
    pdctl_plan_reason_t reason;
    bool act;                      /* re-split to want_prefill : want_decode now */
    bool mixed;                    /* the mode wanted (on act: switch to it; see pdctl_plan.c
                                      for the order of the steps) */
    double pull_gap_s;             /* predicted KV pull of a mean prompt, 0: unknown */
    double prompt_work;            /* prompt compute in daemons (smoothed), 0: unknown */
    double local_stall_s;          /* a local prompt token's cost to its batch: local x (1 + batch) */
    double dec_load;               /* the decodes' load in daemons at full capacity (need_d x
                                      target-util, + the prompt work in PD-mixed), 0: unknown */
    double prompt_len;
    unsigned want_prefill, want_decode;  /* desired (the running split on a hold) */
    double split_prefill;          /* fractional prefill share of the budget */
    double split_band;             /* the noise band's half width, daemons */
    double need_p, need_d;         /* smoothed, daemons */
    double pf_tok_s, dec_tok_s;    /* capacity of one daemon */
    double pull_tok_s;             /* the pull's cost per token the planner uses */
    double step_a_s, step_k_s;     /* decode step = a + k * batch */
    double dec_batch_cap;
} pdctl_plan_out_t;

void pdctl_plan_state_init(pdctl_plan_state_t *st);
/* One tick. budget: the resolved budget (cfg->budget or the file's).
 * Pure: the result depends only on the arguments and *st, which it updates. */
void pdctl_plan_step(const pdctl_plan_cfg_t *cfg, unsigned budget, const pdctl_plan_in_t *in,
                     pdctl_plan_state_t *st, pdctl_plan_out_t *out);
/* The re-split the last act asked for ended at now_ns (pdctl scale took its
 * time: drain, migration, start): dwell and the measures' settling count
 * from here, not from the decision. */
void pdctl_plan_applied(pdctl_plan_state_t *st, uint64_t now_ns);

/* ---- the controller (pdctl_plan.c) ----------------------------------------- */

int pdctl_cmd_plan(int argc, char **argv);
int pdctl_cmd_autoscale(int argc, char **argv);
int pdctl_cmd_disagg_mode(int argc, char **argv);
/* Stop the run dir's planners (SIGTERM; one in a re-split finishes its
 * `pdctl scale` first; SIGKILL after timeout_s). pdctl down, first. */
void pdctl_planners_stop(const char *run_dir, double timeout_s);
/* One status line per running planner of the run dir (pdctl status);
 * returns how many. */
int pdctl_planners_status(const char *run_dir);
/* The running planners' status objects (planner-<k>.json), an array. */
struct cJSON *pdctl_planners_json(const char *run_dir);

#endif
