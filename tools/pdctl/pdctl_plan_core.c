/* pdctl_plan_core.c - the SLO planner's pure core: figures + state ->
 * decision (pdctl_plan.h says the model). No I/O, no clock. */
#include "pdctl_plan.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define ROW(field, key, type, def, help, min, max) \
    PD_CFG_ROW(pdctl_plan_cfg_t, field, key, type, def, help, min, max, NULL)

/* The [planner] section of a deployment file (also PDCTL_PLANNER_<KEY>). */
static const pd_cfg_field_t pdctl_plan_fields[] = {
    ROW(budget, "budget", UINT, "0",
        "prefill + decode daemons to split (0: the file's prefill + decode)", 0, 64),
    ROW(min_prefill, "min-prefill", UINT, "0",
        "fewest prefill daemons (0 allows PD-mixed: decodes prefill their own prompts)", 0, 32),
    ROW(min_decode, "min-decode", UINT, "1", "fewest decode daemons", 1, 32),
    ROW(ttft_p90_ns, "ttft-p90", DURATION, "1s", "SLO: 90th percentile time to first token",
        1e6, 36e11),
    ROW(tpot_p90_ns, "tpot-p90", DURATION, "50ms",
        "SLO: 90th percentile time between tokens (decode step)", 1e5, 6e10),
    ROW(target_util, "target-util", DOUBLE, "0.7",
        "plan each daemon to this fraction of its measured capacity", 0.05, 1),
    ROW(hysteresis, "hysteresis", DOUBLE, "0.3",
        "re-split only when the desired split is 0.5 + this many daemons away", 0, 4),
    ROW(noise_z, "noise-band", DOUBLE, "2",
        "widen the hysteresis, and the mode's margins, by this many standard errors of "
        "the demand's average (Poisson: 1/sqrt(the requests the window holds)); 0: off",
        0, 5),
    ROW(dwell_ns, "dwell", DURATION, "60s",
        "least time between two re-splits (a window, if shorter, for a step the same way as "
        "the last one)", 0, 864e11),
    ROW(confirm, "confirm", UINT, "3", "ticks in a row the same new split must be desired",
        1, 1000),
    ROW(interval_ns, "interval", DURATION, "2s", "one planning tick", 1e8, 36e11),
    ROW(window_ns, "window", DURATION, "20s",
        "time constant of the demand's moving average (longer: calmer, slower)", 1e8, 864e11),
    ROW(etcd, "etcd", STRING, NULL,
        "leader election through etcd host:port (default: the deployment's etcd; else an "
        "flock on the run dir)", 0, 0),
    ROW(metrics_listen, "metrics-listen", STRING, NULL,
        "host:port where the planner serves /metrics (pd_planner_*), e.g. for a KEDA scaler",
        0, 0),
    PD_CFG_ROW(pdctl_plan_cfg_t, act, "act", BOOL, "true",
               "re-split through pdctl scale (false: decide, log and export only, for an "
               "external scaler such as KEDA or an HPA)", 0, 0, NULL),
    ROW(separate_mode, "separate-mode", STRING, NULL,
        "the routers' disagg-mode (threshold|always|cost) when the planner leaves PD-mixed "
        "(it sets never for PD-mixed; default: the file's, else threshold)", 0, 0),
    PD_CFG_END,
};

const pd_cfg_schema_t pdctl_plan_schema = {
    .prog = "pdctl",
    .summary = "[planner] section of a deployment file",
    .env_prefix = "PDCTL_PLANNER_",
    .fields = pdctl_plan_fields,
};

static const char *const pdctl_plan_reason_names[] = {
#define PDCTL_X_REASON(id, name, help) name,
    PDCTL_PLAN_REASONS(PDCTL_X_REASON)
#undef PDCTL_X_REASON
};

static const char *const pdctl_plan_reason_helps[] = {
#define PDCTL_X_REASON(id, name, help) help,
    PDCTL_PLAN_REASONS(PDCTL_X_REASON)
#undef PDCTL_X_REASON
};

const char *pdctl_plan_reason_name(pdctl_plan_reason_t r)
{
    return r < PDCTL_PLAN_REASON_N ? pdctl_plan_reason_names[r] : "?";
}

const char *pdctl_plan_reason_help(pdctl_plan_reason_t r)
{
    return r < PDCTL_PLAN_REASON_N ? pdctl_plan_reason_helps[r] : "?";
}

void pdctl_plan_state_init(pdctl_plan_state_t *st)
{
    memset(st, 0, sizeof(*st));
    st->pending = PDCTL_PLAN_NO_PENDING;
    st->mode_pending = -1;
    st->prompt_work = -1;
}

/* Fewer computed tokens than this in a tick say more about fixed costs than
 * a rate (the router's cost mode uses the same floor). */
#define PLAN_MIN_PF_TOKENS 16.0
/* Weight of a new prefill-rate sample. */
#define PLAN_RATE_WEIGHT 0.3
/* Total need below this (daemons) is no traffic. */
#define PLAN_IDLE_NEED 0.02

/* The decode step fit takes a decode's tick only when its steps were
 * decode steps: not in the first window after a re-split ended (settled
 * false: the change's own CPU) and, in separate pools, not with
 * decode-local prompt chunks in them (the prefills' overflow: prompt work,
 * which the prefill need already counts; in PD-mixed they are how the
 * decodes work). At 12 long
 * prompts/s of modeled time the prefill's overflow ran on the decodes, the
 * fit read 76 ms + 10 ms x b instead of 81 ms + 2 ms x b for 45 s, the
 * decode need doubled and 2:4 held a minute where 3:3 was due. Until the
 * fit's ring is full, every tick counts: a first fit from a warm-up's one
 * batch size (82 ms x b, proportional) held through a re-split's window read
 * 12 tokens/s a decode, a decode need of 40 daemons, and went PD-mixed. */
static void plan_measure(const pdctl_plan_in_t *in, pdctl_plan_state_t *st, bool settled)
{
    if (in->pf_busy_s > 0 && in->pf_tokens >= PLAN_MIN_PF_TOKENS) {
        double r = in->pf_tokens / in->pf_busy_s;
        st->pf_tok_s = st->pf_tok_s > 0 ? st->pf_tok_s + PLAN_RATE_WEIGHT * (r - st->pf_tok_s) : r;
    } else if (st->pf_tok_s <= 0 && in->pf_tok_s_hint > 0) {
        st->pf_tok_s = in->pf_tok_s_hint;   /* PD-mixed so far: the router's estimate */
    } else if (st->pf_tok_s <= 0 && in->local_tok_s > 0) {
        /* PD-mixed from the start: no prefill daemon ever ran, the decodes'
         * own prompts are the only rate (without it the planner held
         * no_data forever and never left PD-mixed) */
        st->pf_tok_s = 1 / in->local_tok_s;
    }
    for (unsigned i = 0; i < in->n_dec && i < PDCTL_PLAN_MAX_SAMPLES; i++) {
        if (!(in->dec[i].batch > 0) || !(in->dec[i].step_s > 0) ||
            ((!settled || (in->dec[i].chunked && !in->mixed)) &&
             st->fit_n >= PDCTL_PLAN_FIT_POINTS))
            continue;
        st->fit_b[st->fit_next] = in->dec[i].batch;
        st->fit_s[st->fit_next] = in->dec[i].step_s;
        st->fit_next = (st->fit_next + 1) % PDCTL_PLAN_FIT_POINTS;
        if (st->fit_n < PDCTL_PLAN_FIT_POINTS)
            st->fit_n++;
    }
    if (in->dec_max_batch > 0)
        st->max_batch = in->dec_max_batch;
}

static int plan_cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static double plan_median(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), plan_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Two points' batches must differ this much before their slope counts. */
#define PLAN_FIT_MIN_DB 0.5

/* step(b) = a + k*b, robust to CPU noise (docs/BENCHMARKS.md "SLO planner",
 * finding 3: a neighbour's burst makes some steps several times slower, and
 * least squares followed it from 20 ms + 0.3 ms x b to 5.6 ms + 7.4 ms x b
 * within a minute). Theil-Sen: k = the median of the pairwise slopes, a = the
 * median of step - k*b; a minority of inflated steps moves neither. Until
 * the batches spread, proportional (a = 0, k = median step / median batch):
 * the pessimistic reading, which sees no headroom in batching. */
static void plan_fit(const pdctl_plan_state_t *st, double *a_p, double *k_p, double *bmax_p)
{
    double slopes[PDCTL_PLAN_FIT_POINTS * (PDCTL_PLAN_FIT_POINTS - 1) / 2];
    double res[PDCTL_PLAN_FIT_POINTS], bs[PDCTL_PLAN_FIT_POINTS];
    size_t ns = 0, n = st->fit_n;
    double bmax = 0;
    for (size_t i = 0; i < n; i++) {
        if (st->fit_b[i] > bmax)
            bmax = st->fit_b[i];
        for (size_t j = i + 1; j < n; j++) {
            double db = st->fit_b[j] - st->fit_b[i];
            if (fabs(db) >= PLAN_FIT_MIN_DB)
                slopes[ns++] = (st->fit_s[j] - st->fit_s[i]) / db;
        }
    }
    double a, k;
    if (ns >= n) {   /* the batches spread: at least as many pairs as points */
        k = plan_median(slopes, ns);
        if (k < 0)   /* noise: a flat step */
            k = 0;
        for (size_t i = 0; i < n; i++)
            res[i] = st->fit_s[i] - k * st->fit_b[i];
        a = plan_median(res, n);
        if (a < 0) {   /* through the origin */
            for (size_t i = 0; i < n; i++)
                res[i] = st->fit_s[i] / st->fit_b[i];
            a = 0;
            k = plan_median(res, n);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            res[i] = st->fit_s[i];
            bs[i] = st->fit_b[i];
        }
        a = 0;
        k = plan_median(res, n) / plan_median(bs, n);
    }
    *a_p = a;
    *k_p = k;
    *bmax_p = bmax;
}

/* Tokens/s one decode gives at the largest batch meeting the TPOT target. */
static double plan_dec_capacity(const pdctl_plan_cfg_t *cfg, const pdctl_plan_state_t *st,
                                pdctl_plan_out_t *out)
{
    double a, k, bseen;
    plan_fit(st, &a, &k, &bseen);
    double t = (double)cfg->tpot_p90_ns / 1e9;
    double b = k > 0 ? (t - a) / k : (st->max_batch > 0 ? st->max_batch : bseen);
    if (st->max_batch > 0 && b > st->max_batch)
        b = st->max_batch;
    if (b < 1)
        b = 1;
    out->step_a_s = a;
    out->step_k_s = k;
    out->dec_batch_cap = b;
    double step = a + k * b;
    return step > 0 ? b / step : 0;
}

static double plan_pressure(double p90, uint64_t target_ns)
{
    double t = (double)target_ns / 1e9;
    if (!(p90 > t) || t <= 0)
        return 1;
    return p90 / t > 2 ? 2 : p90 / t;
}

/* The mean of the decodes' positive samples of one field this tick (0: none). */
static double plan_dec_mean(const pdctl_plan_in_t *in, bool batch)
{
    double sum = 0;
    unsigned n = 0;
    for (unsigned i = 0; i < in->n_dec && i < PDCTL_PLAN_MAX_SAMPLES; i++) {
        double v = batch ? in->dec[i].batch : in->dec[i].step_s;
        if (v > 0) {
            sum += v;
            n++;
        }
    }
    return n > 0 ? sum / n : 0;
}

/* Weight of one tick of dt_s seconds in a moving average of time constant
 * windows x window. */
static double plan_ewma_wn(const pdctl_plan_cfg_t *cfg, double dt_s, double windows)
{
    return cfg->window_ns > 0 ? 1 - exp(-dt_s * 1e9 / (windows * (double)cfg->window_ns)) : 1;
}

static double plan_ewma_w(const pdctl_plan_cfg_t *cfg, double dt_s)
{
    return plan_ewma_wn(cfg, dt_s, 1);
}

/* At least d since t (0: never happened); a clock behind t has not. */
static bool plan_since(uint64_t now, uint64_t t, uint64_t d)
{
    return t == 0 || (now >= t && now - t >= d);
}

static double plan_clamp(double x, double lo, double hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

/* A missed TPOT is the decodes' only when their own steps are slow too: the
 * inter-token gap after token 0 also holds the KV pull, which more decodes
 * do not shorten (docs/BENCHMARKS.md "SLO planner"). The smaller of the
 * routers' inter-token p90 and the decodes' mean step this tick. */
static double plan_dec_pressure(const pdctl_plan_cfg_t *cfg, const pdctl_plan_in_t *in)
{
    double step = plan_dec_mean(in, false);
    double itl = plan_pressure(in->itl_p90_s, cfg->tpot_p90_ns);
    double own = step > 0 ? plan_pressure(step, cfg->tpot_p90_ns) : 1;
    return itl < own ? itl : own;
}

/* The noise band (pdctl_plan.h "No flapping"): the split with need_p and
 * need_d each `noise-band` standard errors apart, both ways: *lo with fewer
 * prefills needed and more decodes, *hi the other way. The
 * averages count Poisson arrivals: an EWMA of time constant window over a
 * rate r holds about 2 x r x window requests, so one standard error is
 * 1/sqrt(that) of it (the band caps at 1/2). At the three-phase benchmark's
 * long phase (2 requests/s, 6-s window) one is 20 %, and the split swung by
 * more than the bare hysteresis from tick to tick. */
#define PLAN_NOISE_MAX_REL 0.5
/* The request rate the band counts is averaged over this many windows. */
#define PLAN_RATE_WINDOWS 4.0

/* The relative half width of the noise band of an average over the window. */
static double plan_noise_rel(const pdctl_plan_cfg_t *cfg, const pdctl_plan_state_t *st)
{
    if (!(cfg->noise_z > 0))
        return 0;
    double n = st->req_rate * 2 * (double)cfg->window_ns / 1e9;
    double rel = n > 0 ? cfg->noise_z / sqrt(n) : PLAN_NOISE_MAX_REL;
    return rel < PLAN_NOISE_MAX_REL ? rel : PLAN_NOISE_MAX_REL;
}

static void plan_split_bounds(const pdctl_plan_cfg_t *cfg, unsigned budget,
                              const pdctl_plan_state_t *st, double *lo, double *hi)
{
    double p = st->need_p, d = st->need_d, rel = plan_noise_rel(cfg, st);
    double lp = p * (1 - rel), hd = d * (1 + rel), hp = p * (1 + rel), ld = d * (1 - rel);
    *lo = lp + hd > 0 ? (double)budget * lp / (lp + hd) : 0;
    *hi = hp + ld > 0 ? (double)budget * hp / (hp + ld) : 0;
}

/* The decodes' load in daemons at full capacity: generation and pulls
 * (need_d x target-util); in PD-mixed their own prompts too. */
static double plan_dec_load(const pdctl_plan_cfg_t *cfg, const pdctl_plan_in_t *in,
                            const pdctl_plan_state_t *st)
{
    double util = cfg->target_util > 0 ? cfg->target_util : 1;
    double load = st->need_d * util;
    if (in->mixed && st->prompt_work > 0)
        load += st->prompt_work;
    return load;
}

/* PD-mixed or separate pools (pdctl_plan.h "mode"). Without a measured
 * prompt load: the running mode. */
static bool plan_want_mixed(const pdctl_plan_cfg_t *cfg, unsigned budget,
                            const pdctl_plan_in_t *in, const pdctl_plan_state_t *st,
                            pdctl_plan_out_t *out)
{
    const double m = PDCTL_PLAN_MODE_MARGIN;
    if (cfg->min_prefill > 0)
        return false;
    if (st->prompt_work < 0 || !(in->requests > 0))
        return in->mixed;
    /* light prompts: a dedicated prefill would mostly idle. The work's
     * noise band too: in or out only when its far edge is past the margin
     * (the agent phase's 1.5 requests/s, 256 or 1,792 uncached tokens
     * each, read 0.19 then 0.70 four ticks later, and left PD-mixed) */
    double rel = plan_noise_rel(cfg, st);
    bool light = in->mixed ? st->prompt_work * (1 - rel) < PDCTL_PLAN_MIXED_WORK * m
                           : st->prompt_work * (1 + rel) < PDCTL_PLAN_MIXED_WORK / m;
    /* ... and an idle prefill costs only when the decodes lack the daemon
     * it holds: their load is more than the budget - 1 separate pools leave
     * them (the three-phase benchmark's chat: 4.5 daemons of decode work, on
     * five decodes 1P:5D beat PD-mixed on six, 737 vs 722 and 725 vs 715
     * good requests). Banded like the work; out half a daemon below. */
    double load = out->dec_load, room = budget > 1 ? (double)budget - 1 : 0;
    bool short_d = in->mixed ? load * (1 + rel) >= room - PDCTL_PLAN_MIXED_LOAD_HYST
                             : load * (1 - rel) > room;
    light = light && short_d;
    /* the pull alone: the hop (dispatch to the prefill) is TTFT's, not the
     * gap before token 1, and a hop measured under a re-split's load would
     * pin PD-mixed. Against it, a local prompt token stalls the whole batch. */
    double local = in->local_tok_s > 0 ? in->local_tok_s : (st->pf_tok_s > 0 ? 1 / st->pf_tok_s : 0);
    out->local_stall_s = local * (1 + st->mean_batch);
    bool pull_bound = false;
    if (st->pull_tok_s > 0 && st->prompt_len > 0 && local > 0) {
        double gap = st->prompt_len * st->pull_tok_s;
        double t = (double)cfg->tpot_p90_ns / 1e9;
        out->pull_gap_s = gap;
        pull_bound = in->mixed
                         ? !(gap < t / m || st->pull_tok_s < out->local_stall_s / m)
                         : gap > t * m && st->pull_tok_s >= out->local_stall_s;
    }
    return light || pull_bound;
}

void pdctl_plan_applied(pdctl_plan_state_t *st, uint64_t now_ns)
{
    if (st->last_change_ns == 0 || now_ns < st->last_change_ns)
        return;   /* nothing asked, or a clock from elsewhere */
    if (st->mode_change_ns == st->last_change_ns)
        st->mode_change_ns = now_ns ? now_ns : 1;
    st->last_change_ns = now_ns ? now_ns : 1;
}

void pdctl_plan_step(const pdctl_plan_cfg_t *cfg, unsigned budget, const pdctl_plan_in_t *in,
                     pdctl_plan_state_t *st, pdctl_plan_out_t *out)
{
    memset(out, 0, sizeof(*out));
    out->want_prefill = in->n_prefill;
    out->want_decode = in->n_decode;
    /* a window since the last re-split ended: the figures are the split's own */
    bool split_settled = plan_since(in->now_ns, st->last_change_ns, cfg->window_ns);
    plan_measure(in, st, split_settled);
    /* the pull's cost: this tick's measure, once a window has passed since
     * the last re-split (the pulls of a split's first seconds carry the
     * backlog and the cold arenas of the change: a PD-mixed start measured
     * a 2 s tail in its first 11 s at 1:5 and went back to PD-mixed for good);
     * kept through PD-mixed, where nothing is pulled */
    if (in->pull_tok_s > 0 && split_settled) {
        double w = in->dt_s > 0 ? plan_ewma_w(cfg, in->dt_s) : 1;
        st->pull_tok_s = st->pull_tok_s > 0 ? st->pull_tok_s + w * (in->pull_tok_s - st->pull_tok_s)
                                            : in->pull_tok_s;
    }
    out->pull_tok_s = st->pull_tok_s;
    out->pf_tok_s = st->pf_tok_s;
    out->dec_tok_s = st->fit_n > 0 ? plan_dec_capacity(cfg, st, out) : 0;

    pdctl_plan_reason_t why;
    if (in->dt_s > 0 && st->pf_tok_s > 0 && out->dec_tok_s > 0) {
        double util = cfg->target_util > 0 ? cfg->target_util : 1;
        double uncached = in->prompt_tokens - in->cached_tokens;
        double raw_p = (uncached > 0 ? uncached : 0) / in->dt_s / (st->pf_tok_s * util) *
                       plan_pressure(in->ttft_p90_s, cfg->ttft_p90_ns);
        double raw_d = in->gen_tokens / in->dt_s / (out->dec_tok_s * util) *
                       plan_dec_pressure(cfg, in);
        /* separate pools: every uncached prompt token is pulled by a decode */
        if (!in->mixed && st->pull_tok_s > 0 && uncached > 0)
            raw_d += uncached / in->dt_s * st->pull_tok_s / util;
        double w = plan_ewma_w(cfg, in->dt_s);
        if (!st->primed) {
            st->need_p = raw_p;
            st->need_d = raw_d;
            st->primed = true;
        } else {
            st->need_p += w * (raw_p - st->need_p);
            st->need_d += w * (raw_d - st->need_d);
        }
    }
    out->need_p = st->need_p;
    out->need_d = st->need_d;
    if (in->dt_s > 0) {
        /* over PLAN_RATE_WINDOWS windows: the band's own sample size must
         * not shrink with the burst it guards against */
        double w = plan_ewma_wn(cfg, in->dt_s, PLAN_RATE_WINDOWS);
        double r = in->requests / in->dt_s;
        st->req_rate = st->primed_rate ? st->req_rate + w * (r - st->req_rate) : r;
        st->primed_rate = true;
    }
    if (in->dt_s > 0 && in->requests > 0) {
        double w = plan_ewma_w(cfg, in->dt_s);
        double uncached = in->prompt_tokens - in->cached_tokens;
        double len = (uncached > 0 ? uncached : 0) / in->requests;
        st->prompt_len = st->prompt_len > 0 ? st->prompt_len + w * (len - st->prompt_len) : len;
    }
    out->prompt_len = st->prompt_len;
    /* the prompt work of a mode's first dwell (at least a window) after its
     * switch ended is not the mode's: its prefix caches start cold (the
     * three-phase benchmark's agent turns read 0.14-0.24 of a daemon in
     * separate pools, 0.72-0.82 in PD-mixed's first 3 s, 0.25 in PD-mixed
     * over 150 s; the planner went back and forth every 30 s on it) */
    uint64_t settle = cfg->dwell_ns > cfg->window_ns ? cfg->dwell_ns : cfg->window_ns;
    bool settled = plan_since(in->now_ns, st->mode_change_ns, settle);
    if (in->dt_s > 0 && st->pf_tok_s > 0) {
        double w = plan_ewma_w(cfg, in->dt_s);
        double uncached = in->prompt_tokens - in->cached_tokens;
        double work = (uncached > 0 ? uncached : 0) / in->dt_s / st->pf_tok_s;
        if (st->prompt_work < 0)
            st->prompt_work = work;
        else if (settled)
            st->prompt_work += w * (work - st->prompt_work);
        double b = plan_dec_mean(in, true);
        if (b > 0)
            st->mean_batch = st->mean_batch > 0 ? st->mean_batch + w * (b - st->mean_batch) : b;
    }
    out->prompt_work = st->prompt_work > 0 ? st->prompt_work : 0;
    out->dec_load = plan_dec_load(cfg, in, st);
    out->mixed = in->mixed;

    unsigned lo = (unsigned)cfg->min_prefill, min_d = cfg->min_decode ? (unsigned)cfg->min_decode : 1;
    unsigned hi = budget > min_d ? budget - min_d : 0;
    if (lo > hi)
        lo = hi;
    if (!st->primed) {
        why = PDCTL_PLAN_NO_DATA;
        goto hold;
    }
    bool want_mixed = plan_want_mixed(cfg, budget, in, st, out);
    if (want_mixed != in->mixed) {
        if (st->mode_pending != (int)want_mixed) {
            st->mode_pending = want_mixed;
            st->mode_ticks = 0;
        }
        if (in->dt_s > 0)
            st->mode_ticks++;
        st->pending = PDCTL_PLAN_NO_PENDING;   /* the split waits for the mode */
        st->pending_ticks = 0;
        if (st->mode_ticks < (cfg->confirm ? cfg->confirm : 1) || !(in->dt_s > 0)) {
            why = PDCTL_PLAN_CONFIRM;
            goto hold;
        }
        if (!plan_since(in->now_ns, st->last_change_ns, cfg->dwell_ns)) {
            why = PDCTL_PLAN_DWELL;
            goto hold;
        }
        out->mixed = want_mixed;
        if (want_mixed) {
            out->want_prefill = 0;
            out->want_decode = budget;
            why = PDCTL_PLAN_TO_MIXED;
        } else {
            double sp = st->need_p + st->need_d > 0
                            ? (double)budget * st->need_p / (st->need_p + st->need_d) : 1;
            unsigned wp = (unsigned)lround(sp);
            /* no pull measured yet (PD-mixed from the start): the decode
             * need lacks the pulls, which separate pools put on the decodes;
             * start with one prefill and let the measured need grow the pool
             * (a PD-mixed start went to 3:3 here and its three decodes could
             * not keep up with the pulls: TTFT p90 13.8 s, docs/BENCHMARKS.md) */
            if (!(st->pull_tok_s > 0))
                wp = 1;
            unsigned hi_m = budget > (cfg->min_decode ? cfg->min_decode : 1)
                                ? budget - (unsigned)(cfg->min_decode ? cfg->min_decode : 1) : 0;
            if (wp < 1)
                wp = 1;
            if (wp > hi_m)
                wp = hi_m;
            out->split_prefill = sp;
            out->want_prefill = wp;
            out->want_decode = budget - wp;
            why = PDCTL_PLAN_TO_SEPARATE;
        }
        out->act = true;
        st->last_change_ns = in->now_ns ? in->now_ns : 1;
        st->mode_change_ns = st->last_change_ns;
        st->last_dir = 0;
        st->mode_pending = -1;
        st->mode_ticks = 0;
        goto count;
    }
    st->mode_pending = -1;
    st->mode_ticks = 0;
    if (in->mixed) {
        why = PDCTL_PLAN_MIXED;   /* no prefills to place; a deployment off budget keeps */
        goto hold;
    }
    /* the mode decides PD-mixed (above); separate pools keep a prefill,
     * the pull measured or not (chat's 128-token pulls are under the
     * routers' tail floor: between two phases the split fell to 0:6 with
     * the routers still disaggregating, and the long phase took a step
     * more to reach 3:3) */
    if (lo < 1 && hi >= 1)
        lo = 1;
    if (st->need_p + st->need_d < PLAN_IDLE_NEED) {
        why = PDCTL_PLAN_IDLE;
        goto hold;
    }
    double split = plan_clamp((double)budget * st->need_p / (st->need_p + st->need_d), lo, hi);
    out->split_prefill = split;
    /* a move only when even the split's bound on the near side (the noise
     * band, clamped like the split) is beyond the hysteresis */
    double s_lo, s_hi, np = (double)in->n_prefill;
    plan_split_bounds(cfg, budget, st, &s_lo, &s_hi);
    out->split_band = (s_hi - s_lo) / 2;
    s_lo = plan_clamp(s_lo, lo, hi);
    s_hi = plan_clamp(s_hi, lo, hi);
    bool far = split > np ? s_lo - np >= 0.5 + cfg->hysteresis
                          : np - s_hi >= 0.5 + cfg->hysteresis;
    unsigned want_p = (unsigned)lround(split);
    bool resize = in->n_prefill + in->n_decode != budget;
    if (!resize && !far) {
        st->pending = -1;
        st->pending_ticks = 0;
        why = PDCTL_PLAN_BALANCED;
        goto hold;
    }
    if (resize && in->n_prefill >= lo && in->n_prefill <= hi && !far)
        want_p = in->n_prefill;    /* only the size is off: keep the prefill count */
    /* one daemon a re-split: the needs were measured at the running split,
     * and the other pool's pressure shows only once it is smaller (at
     * --time-scale 4 the long phase jumped 1 -> 4 -> 2 -> 4 -> 2: at 4:2 the
     * two decodes' pulls queued 3 s, at 2:4 the prompts did; 3:3, between
     * them, met both SLOs). The next step waits for confirm and dwell. */
    /* Toward fewer prefills, as far as the band's high edge (the most
     * prefills the noise allows): chat from 3:3, prefill need 0.2 of 3.2,
     * goes 3:3 -> 1:5 at once (one step held 2:4, which meets 45 % of chat,
     * for a dwell). Not toward more, where a missed TTFT's pressure doubles
     * the need the band is built on (the jumps above). */
    if (!resize && want_p > in->n_prefill + 1)
        want_p = in->n_prefill + 1;
    if (!resize && want_p + 1 < in->n_prefill) {
        unsigned edge = (unsigned)lround(s_hi);
        if (edge < want_p)
            edge = want_p;
        want_p = edge < in->n_prefill - 1 ? edge : in->n_prefill - 1;
    }
    out->want_prefill = want_p;
    out->want_decode = budget - want_p;
    /* confirm counts ticks that want to move the same way (the target
     * itself may still move while the average catches up) */
    int dir = want_p > in->n_prefill ? 1 : want_p < in->n_prefill ? -1 : 0;
    if (st->pending != dir) {
        st->pending = dir;
        st->pending_ticks = 0;
    }
    if (in->dt_s > 0)   /* only fresh figures count (none right after a re-split) */
        st->pending_ticks++;
    if (st->pending_ticks < (cfg->confirm ? cfg->confirm : 1) || !(in->dt_s > 0)) {
        why = PDCTL_PLAN_CONFIRM;
        goto count;
    }
    /* dwell keeps a step back away from the last step. A step the same way
     * (1:5 -> 2:4, then 2:4 -> 3:3 as a long phase's average climbs) is no
     * flap: it waits a window, by when the figures it acts on are the new
     * split's (held for the dwell, a long phase's burst at 20-30 s met 2:4,
     * docs/BENCHMARKS.md) */
    uint64_t hold_ns = cfg->dwell_ns;
    if (dir != 0 && dir == st->last_dir && cfg->window_ns < hold_ns)
        hold_ns = cfg->window_ns;
    if (!plan_since(in->now_ns, st->last_change_ns, hold_ns)) {
        why = PDCTL_PLAN_DWELL;
        goto count;
    }
    why = resize && want_p == in->n_prefill ? PDCTL_PLAN_BUDGET
          : want_p > in->n_prefill          ? PDCTL_PLAN_MORE_PREFILL
                                            : PDCTL_PLAN_MORE_DECODE;
    out->act = true;
    st->last_change_ns = in->now_ns ? in->now_ns : 1;
    st->last_dir = dir;
    st->pending = PDCTL_PLAN_NO_PENDING;
    st->pending_ticks = 0;
    goto count;
hold:
    out->want_prefill = in->n_prefill;
    out->want_decode = in->n_decode;
count:
    out->reason = why;
    st->decisions[why]++;
}
