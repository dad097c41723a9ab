/* pdctl_plan.c - the SLO planner's controller (issue 35): `pdctl plan`
 * (dry run), `pdctl autoscale on|off|status|run`.
 *
 * A planner is `pdctl autoscale run` as a process of its own, started by
 * `autoscale on` (setsid, like the daemons) and recorded in the run dir
 * (planner-<k>.pid, .log, .json); `pdctl status` lists it, `pdctl down`
 * and `autoscale off` stop it. Each tick it reads the routers' `planner`
 * admin command (counters, TTFT / inter-token buckets, cost rates), every
 * router's `backends` (KV per decode) and the prefill / decode daemons'
 * `stats` (computed tokens and compute time; steps, tokens, step time),
 * turns two reads into one tick's figures and calls the pure core
 * (pdctl_plan_core.c). Several may run (one per router host): only the
 * leader acts - leader by a lease-bound key in etcd when the deployment has
 * etcd, else by an flock on <run>/planner.lock; the others compute the same
 * figures (so their state is warm) and take over when the leader dies. The
 * leader acts only through `pdctl scale` (drain with live migration, start,
 * wait until registered and ready), the shrinking pool first, so the
 * budget is never exceeded. Every decision is logged with its inputs;
 * pd_planner_* metrics go to <run>/planner.prom and, with [planner]
 * metrics-listen, to GET /metrics. */
#include "pdctl.h"
#include "pdctl_plan.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pd_etcd.h"
#include "pd_sbuf.h"
#include "pd_stats.h"

#define PLAN_MAX_PLANNERS 8

/* ---- config ------------------------------------------------------------------- */

/* The [planner] rows of dep over the defaults (and PDCTL_PLANNER_* env);
 * the budget resolved. 0 or PDCTL_EXIT_USAGE (printed). */
static int plan_cfg_load(const pdctl_dep_t *dep, pdctl_plan_cfg_t *cfg, unsigned *budget_p)
{
    memset(cfg, 0, sizeof(*cfg));
    pd_cfg_result_t res;
    char *argv0[] = { "pdctl", NULL };
    if (pd_config_load(&pdctl_plan_schema, cfg, 1, argv0, &res) != PD_OK) {
        fprintf(stderr, "pdctl: [planner]: %s\n", res.message);
        pd_config_result_free(&res);
        return PDCTL_EXIT_USAGE;
    }
    pd_config_result_free(&res);
    char err[256];
    for (size_t i = 0; i < dep->planner.n; i++) {
        if (pd_config_set(&pdctl_plan_schema, cfg, dep->planner.v[i].key, dep->planner.v[i].val,
                          dep->planner.v[i].key, err, sizeof(err)) != PD_OK) {
            fprintf(stderr, "pdctl: [planner] %s\n", err);
            return PDCTL_EXIT_USAGE;
        }
    }
    const char *mode = pdctl_kvs_get(&dep->role_kv[PDCTL_ROUTER], "disagg-mode");
    if (mode != NULL && strcmp(mode, "always") == 0 && cfg->min_prefill == 0)
        cfg->min_prefill = 1;   /* nothing would prefill */
    if (cfg->separate_mode == NULL && mode != NULL && strcmp(mode, "never") != 0 &&
        (cfg->separate_mode = strdup(mode)) == NULL)
        return PDCTL_EXIT_FAIL;
    unsigned b = cfg->budget ? (unsigned)cfg->budget
                             : dep->count[PDCTL_PREFILL] + dep->count[PDCTL_DECODE];
    if (b > PDCTL_MAX_PER_ROLE)
        b = PDCTL_MAX_PER_ROLE;
    *budget_p = b;
    return 0;
}

/* ---- one read of the deployment ------------------------------------------------ */

typedef struct {
    char name[48];
    pdctl_role_t role;
    double x, y, z, w;         /* prefill: computed tokens, compute ns; decode: steps, tokens,
                                * step ns, prompt chunks */
} plan_dsample_t;

typedef struct {
    double t;                  /* monotonic seconds */
    unsigned n_routers;        /* that answered */
    double acc, prompt, cached, gen, failed;
    uint64_t ttft[PD_HIST_BUCKETS], itl[PD_HIST_BUCKETS];
    double pf_tok_ns;          /* the routers' cost-mode rate (first non-zero) */
    double hop_ns;             /* the routers' hop (first non-zero) */
    double dec_tok_ns;         /* the routers' decode-local prompt rate (first non-zero) */
    double tail_ns, tail_tokens;  /* the routers' kv_pull_tail sum and its pulled tokens */
    bool mixed;                /* a router runs disagg-mode = never */
    unsigned n_prefill, n_decode;
    int nd;
    plan_dsample_t d[PDCTL_MAX_DAEMONS];
    double max_batch;          /* per decode, by KV and by its max-batch (smallest);
                                * 0: unknown */
} plan_sample_t;

static double plan_num(const cJSON *o, const char *k)
{
    double v = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k));
    return v == v ? v : 0;
}

static void plan_buckets_add(uint64_t *acc, const cJSON *hist)
{
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(hist, "buckets");
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, b) {
        if (i >= PD_HIST_BUCKETS)
            break;
        double x = cJSON_GetNumberValue(v);
        acc[i++] += x == x && x > 0 ? (uint64_t)x : 0;
    }
}

/* *dst = o's key, from the first router that has measured it (> 0). */
static void plan_first_rate(double *dst, const cJSON *o, const char *key)
{
    double v = plan_num(o, key);
    if (*dst <= 0 && v > 0)
        *dst = v;
}

/* A decode's own max-batch caps its batch below what its KV holds (the
 * three-phase benchmark's chat: KV for 48 sequences, max-batch 16; the
 * planner saw capacity for 48 and asked for 3 decodes where 5 were short) */
static void plan_cfg_max_batch(const pdctl_daemon_t *x, plan_sample_t *s)
{
    char err[256];
    cJSON *j = pdctl_admin(x->sock, "config show", 2.0, err, sizeof(err));
    double mb = plan_num(cJSON_GetObjectItemCaseSensitive(j, "config"), "max-batch");
    if (mb >= 1 && (s->max_batch <= 0 || mb < s->max_batch))
        s->max_batch = mb;
    cJSON_Delete(j);
}

static void plan_sample(const pdctl_state_t *st, plan_sample_t *s)
{
    memset(s, 0, sizeof(*s));
    s->t = pdctl_now();
    char err[256];
    for (int i = 0; i < st->n; i++) {
        const pdctl_daemon_t *x = &st->d[i];
        if (!pdctl_daemon_alive(x))
            continue;
        if (x->role == PDCTL_ROUTER) {
            cJSON *p = pdctl_admin(x->sock, "planner", 2.0, err, sizeof(err));
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(p, "counters");
            if (c != NULL) {
                s->n_routers++;
                s->acc += plan_num(c, "requests_accepted");
                s->prompt += plan_num(c, "prompt_tokens");
                s->cached += plan_num(c, "prompt_cached_tokens");
                s->gen += plan_num(c, "generation_tokens");
                s->failed += plan_num(c, "requests_failed");
                const cJSON *h = cJSON_GetObjectItemCaseSensitive(p, "histograms");
                plan_buckets_add(s->ttft, cJSON_GetObjectItemCaseSensitive(h, "request_ttft"));
                plan_buckets_add(s->itl, cJSON_GetObjectItemCaseSensitive(h, "request_inter_token"));
                const cJSON *cost = cJSON_GetObjectItemCaseSensitive(p, "cost");
                plan_first_rate(&s->pf_tok_ns, cost, "pf_tok_ns");
                plan_first_rate(&s->hop_ns, cost, "hop_ns");
                plan_first_rate(&s->dec_tok_ns, cost, "dec_tok_ns");
                s->tail_tokens += plan_num(c, "kv_pull_tail_tokens");
                s->tail_ns += plan_num(cJSON_GetObjectItemCaseSensitive(h, "kv_pull_tail"), "sum_ns");
                if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "mixed")))
                    s->mixed = true;
            }
            cJSON_Delete(p);
            /* what a decode's KV holds: blocks in use per running sequence */
            cJSON *b = pdctl_admin(x->sock, "backends", 2.0, err, sizeof(err));
            const cJSON *o;
            cJSON_ArrayForEach(o, cJSON_GetObjectItemCaseSensitive(b, "backends")) {
                const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "role"));
                double run = plan_num(o, "running_seqs"), tot = plan_num(o, "total_blocks");
                double used = tot - plan_num(o, "free_blocks");
                if (role == NULL || strcmp(role, "decode") != 0 || run < 1 || used <= 0)
                    continue;
                double mb = floor(tot / (used / run));
                if (mb >= 1 && (s->max_batch <= 0 || mb < s->max_batch))
                    s->max_batch = mb;
            }
            cJSON_Delete(b);
            continue;
        }
        if (x->role == PDCTL_PREFILL)
            s->n_prefill++;
        else
            s->n_decode++;
        cJSON *j = pdctl_admin(x->sock, "stats", 2.0, err, sizeof(err));
        const cJSON *v = pdctl_stats_values(j, pdctl_role_name(x->role));
        if (v != NULL && s->nd < PDCTL_MAX_DAEMONS) {
            plan_dsample_t *d = &s->d[s->nd++];
            snprintf(d->name, sizeof(d->name), "%s", x->name);
            d->role = x->role;
            if (x->role == PDCTL_PREFILL) {
                d->x = plan_num(v, "computed_tokens");
                d->y = plan_num(cJSON_GetObjectItemCaseSensitive(v, "prefill_time"), "sum_ns");
            } else {
                d->x = plan_num(v, "steps");
                d->y = plan_num(v, "tokens_out");
                d->z = plan_num(cJSON_GetObjectItemCaseSensitive(v, "step_time"), "sum_ns");
                d->w = plan_num(v, "chunks");
            }
        }
        cJSON_Delete(j);
        if (x->role == PDCTL_DECODE)
            plan_cfg_max_batch(x, s);
    }
}

/* Fewer pulled tokens than this in a tick do not make a rate. */
#define PLAN_MIN_TAIL_TOKENS 64.0

static double plan_d(double a, double b)
{
    return b > a ? b - a : 0;   /* a restarted router / daemon starts from 0 */
}

static double plan_p90(const uint64_t *a, const uint64_t *b)
{
    pd_hist_snapshot_t snap;
    memset(&snap, 0, sizeof(snap));
    for (int i = 0; i < PD_HIST_BUCKETS; i++) {
        snap.buckets[i] = b[i] > a[i] ? b[i] - a[i] : 0;
        snap.count += snap.buckets[i];
    }
    return (double)pd_hist_quantile(&snap, 0.90) / 1e9;
}

/* Two reads -> one tick's figures (a NULL: the first tick, no deltas). */
static void plan_figures(const plan_sample_t *a, const plan_sample_t *b, uint64_t now_ns,
                         pdctl_plan_in_t *in)
{
    memset(in, 0, sizeof(*in));
    in->now_ns = now_ns;
    in->n_prefill = b->n_prefill;
    in->n_decode = b->n_decode;
    in->dec_max_batch = b->max_batch;
    in->pf_tok_s_hint = b->pf_tok_ns > 0 ? 1e9 / b->pf_tok_ns : 0;
    in->hop_s = b->hop_ns / 1e9;
    in->local_tok_s = b->dec_tok_ns / 1e9;
    in->mixed = b->mixed;
    if (a == NULL || b->t <= a->t || a->n_routers == 0 || b->n_routers != a->n_routers)
        return;   /* a router came or went: its counters do not difference */
    in->dt_s = b->t - a->t;
    in->requests = plan_d(a->acc, b->acc);
    in->prompt_tokens = plan_d(a->prompt, b->prompt);
    in->cached_tokens = plan_d(a->cached, b->cached);
    in->gen_tokens = plan_d(a->gen, b->gen);
    /* what a pull costs its stream this tick: the gap it left before token
     * 1 (with layer-wise streaming most of a pull hides under the prompt
     * pass; the routers' whole-pull rate, pull_tok_ns, overstates it several times) */
    double tail_tokens = plan_d(a->tail_tokens, b->tail_tokens);
    if (tail_tokens >= PLAN_MIN_TAIL_TOKENS)
        in->pull_tok_s = plan_d(a->tail_ns, b->tail_ns) / 1e9 / tail_tokens;
    in->ttft_p90_s = plan_p90(a->ttft, b->ttft);
    in->itl_p90_s = plan_p90(a->itl, b->itl);
    for (int i = 0; i < b->nd; i++) {
        const plan_dsample_t *y = &b->d[i], *x = NULL;
        for (int k = 0; k < a->nd && x == NULL; k++)
            if (strcmp(a->d[k].name, y->name) == 0 && a->d[k].role == y->role)
                x = &a->d[k];
        if (x == NULL)
            continue;
        if (y->role == PDCTL_PREFILL) {
            in->pf_tokens += plan_d(x->x, y->x);
            in->pf_busy_s += plan_d(x->y, y->y) / 1e9;
        } else {
            double steps = plan_d(x->x, y->x);
            if (steps >= 1 && in->n_dec < PDCTL_PLAN_MAX_SAMPLES) {
                in->dec[in->n_dec].batch = plan_d(x->y, y->y) / steps;
                in->dec[in->n_dec].step_s = plan_d(x->z, y->z) / steps / 1e9;
                in->dec[in->n_dec].chunked = plan_d(x->w, y->w) > 0;
                in->n_dec++;
            }
        }
    }
}

/* ---- decisions: log line, status JSON, metrics -------------------------------- */

static void plan_log(const char *name, bool leader, bool act, const pdctl_plan_in_t *in,
                     const pdctl_plan_out_t *o)
{
    char stamp[32];
    time_t now = time(NULL);
    strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    double dt = in->dt_s > 0 ? in->dt_s : 1;
    printf("%s %s %s %s reason=%s want=%u:%u running=%u:%u mode=%s running_mode=%s "
           "pull_gap=%.4fs stall=%.1fus/tok work=%.2f dload=%.2f prompt_len=%.0f split=%.2f band=%.2f need=%.2f/%.2f "
           "cap=%.0f/%.0f tok/s step=%.1fms+%.3fms*b bcap=%.0f | req/s=%.2f prompt/s=%.0f "
           "cached/s=%.0f gen/s=%.0f ttft_p90=%.3fs itl_p90=%.4fs dt=%.1fs\n",
           stamp, name, leader ? "leader" : "standby",
           o->act ? (leader && act ? "RESPLIT" : "would-resplit") : "hold", pdctl_plan_reason_name(o->reason),
           o->want_prefill, o->want_decode, in->n_prefill, in->n_decode,
           o->mixed ? "mixed" : "separate", in->mixed ? "mixed" : "separate", o->pull_gap_s,
           o->local_stall_s * 1e6, o->prompt_work, o->dec_load, o->prompt_len, o->split_prefill,
           o->split_band,
           o->need_p, o->need_d, o->pf_tok_s, o->dec_tok_s, o->step_a_s * 1e3,
           o->step_k_s * 1e3, o->dec_batch_cap, in->requests / dt, in->prompt_tokens / dt,
           in->cached_tokens / dt, in->gen_tokens / dt, in->ttft_p90_s, in->itl_p90_s, in->dt_s);
    fflush(stdout);
}

/* X(name, type, help) of the pd_planner_* families. */
#define PLAN_METRICS(X)                                                                    \
    X("pd_planner_desired_daemons", "gauge", "Daemons the planner wants, by role")         \
    X("pd_planner_actual_daemons", "gauge", "Daemons running, by role")                    \
    X("pd_planner_need_daemons", "gauge", "Smoothed need in daemons at target-util, by role") \
    X("pd_planner_capacity_tokens_per_second", "gauge",                                    \
      "Measured capacity of one daemon (prefill: prompt tokens/s; decode: tokens/s at the TPOT target)") \
    X("pd_planner_budget_daemons", "gauge", "Prefill + decode daemons the planner splits")  \
    X("pd_planner_decisions_total", "counter", "Planner ticks by decision reason")          \
    X("pd_planner_resplits_total", "counter", "Re-splits carried out (leader)")             \
    X("pd_planner_last_decision_timestamp_seconds", "gauge", "Unix time of the last re-split (0: none)") \
    X("pd_planner_leader", "gauge", "1 if this planner acts for the deployment")          \
    X("pd_planner_mode", "gauge",                                                          \
      "Disaggregation mode, by mode: 1 for the one wanted (mixed: 0 prefills, routers never)") \
    X("pd_planner_pull_gap_seconds", "gauge",                                              \
      "Predicted KV pull of a mean prompt (prompt length x measured pull per token)") \
    X("pd_planner_prompt_work_daemons", "gauge",                                           \
      "Prompt compute in daemons (uncached prompt tokens/s / prefill rate, smoothed); PD-mixed below 0.5") \
    X("pd_planner_decode_load_daemons", "gauge",                                          \
      "Decode load in daemons at full capacity (need x target-util; PD-mixed: + prompt work); PD-mixed only above budget - 1") \
    X("pd_planner_split_band_daemons", "gauge",                                           \
      "Noise band added to the hysteresis: how far the split's sampling error moves it")


typedef struct {
    const char *name, *type, *help;
} plan_metric_t;

static const plan_metric_t plan_metrics[] = {
#define PLAN_X_METRIC(n, t, h) { n, t, h },
    PLAN_METRICS(PLAN_X_METRIC)
#undef PLAN_X_METRIC
};

enum {   /* PLAN_METRICS' rows, in order */
    PLAN_M_DESIRED, PLAN_M_ACTUAL, PLAN_M_NEED, PLAN_M_CAP, PLAN_M_BUDGET, PLAN_M_DECISIONS,
    PLAN_M_RESPLITS, PLAN_M_LAST, PLAN_M_LEADER, PLAN_M_MODE, PLAN_M_PULL_GAP,
    PLAN_M_PROMPT_WORK, PLAN_M_DECODE_LOAD, PLAN_M_SPLIT_BAND, PLAN_M_N
};
_Static_assert(sizeof(plan_metrics) / sizeof(plan_metrics[0]) == PLAN_M_N, "PLAN_METRICS rows");

static void plan_family(pd_sbuf_t *sb, int m)
{
    pd_sbuf_printf(sb, "# HELP %s %s\n# TYPE %s %s\n", plan_metrics[m].name, plan_metrics[m].help,
                   plan_metrics[m].name, plan_metrics[m].type);
}

/* What the planner knows beyond the core's state. */
typedef struct {
    char name[32];             /* planner-<k> */
    bool leader;
    unsigned budget;
    uint64_t resplits;
    int64_t last_unix;         /* last re-split, wall clock; 0 none */
    pdctl_plan_in_t in;
    pdctl_plan_out_t out;
    pdctl_plan_state_t st;
} plan_ctl_t;

/* The Prometheus text of the planner's decisions (caller frees). */
static char *plan_metrics_text(const plan_ctl_t *c)
{
    pd_sbuf_t sb = PD_SBUF_INIT;
    plan_family(&sb, PLAN_M_DESIRED);
    pd_sbuf_printf(&sb, "%s{role=\"prefill\"} %u\n%s{role=\"decode\"} %u\n",
                   plan_metrics[PLAN_M_DESIRED].name, c->out.want_prefill,
                   plan_metrics[PLAN_M_DESIRED].name, c->out.want_decode);
    plan_family(&sb, PLAN_M_ACTUAL);
    pd_sbuf_printf(&sb, "%s{role=\"prefill\"} %u\n%s{role=\"decode\"} %u\n",
                   plan_metrics[PLAN_M_ACTUAL].name, c->in.n_prefill,
                   plan_metrics[PLAN_M_ACTUAL].name, c->in.n_decode);
    plan_family(&sb, PLAN_M_NEED);
    pd_sbuf_printf(&sb, "%s{role=\"prefill\"} %.4g\n%s{role=\"decode\"} %.4g\n",
                   plan_metrics[PLAN_M_NEED].name, c->out.need_p, plan_metrics[PLAN_M_NEED].name,
                   c->out.need_d);
    plan_family(&sb, PLAN_M_CAP);
    pd_sbuf_printf(&sb, "%s{role=\"prefill\"} %.6g\n%s{role=\"decode\"} %.6g\n",
                   plan_metrics[PLAN_M_CAP].name, c->out.pf_tok_s, plan_metrics[PLAN_M_CAP].name,
                   c->out.dec_tok_s);
    plan_family(&sb, PLAN_M_BUDGET);
    pd_sbuf_printf(&sb, "%s %u\n", plan_metrics[PLAN_M_BUDGET].name, c->budget);
    plan_family(&sb, PLAN_M_DECISIONS);
    for (int r = 0; r < PDCTL_PLAN_REASON_N; r++)
        pd_sbuf_printf(&sb, "%s{reason=\"%s\"} %llu\n", plan_metrics[PLAN_M_DECISIONS].name,
                       pdctl_plan_reason_name((pdctl_plan_reason_t)r),
                       (unsigned long long)c->st.decisions[r]);
    plan_family(&sb, PLAN_M_RESPLITS);
    pd_sbuf_printf(&sb, "%s %llu\n", plan_metrics[PLAN_M_RESPLITS].name,
                   (unsigned long long)c->resplits);
    plan_family(&sb, PLAN_M_LAST);
    pd_sbuf_printf(&sb, "%s %lld\n", plan_metrics[PLAN_M_LAST].name, (long long)c->last_unix);
    plan_family(&sb, PLAN_M_LEADER);
    pd_sbuf_printf(&sb, "%s %d\n", plan_metrics[PLAN_M_LEADER].name, c->leader ? 1 : 0);
    plan_family(&sb, PLAN_M_MODE);
    pd_sbuf_printf(&sb, "%s{mode=\"separate\"} %d\n%s{mode=\"mixed\"} %d\n",
                   plan_metrics[PLAN_M_MODE].name, c->out.mixed ? 0 : 1,
                   plan_metrics[PLAN_M_MODE].name, c->out.mixed ? 1 : 0);
    plan_family(&sb, PLAN_M_PULL_GAP);
    pd_sbuf_printf(&sb, "%s %.6g\n", plan_metrics[PLAN_M_PULL_GAP].name, c->out.pull_gap_s);
    plan_family(&sb, PLAN_M_PROMPT_WORK);
    pd_sbuf_printf(&sb, "%s %.6g\n", plan_metrics[PLAN_M_PROMPT_WORK].name, c->out.prompt_work);
    plan_family(&sb, PLAN_M_DECODE_LOAD);
    pd_sbuf_printf(&sb, "%s %.6g\n", plan_metrics[PLAN_M_DECODE_LOAD].name, c->out.dec_load);
    plan_family(&sb, PLAN_M_SPLIT_BAND);
    pd_sbuf_printf(&sb, "%s %.4g\n", plan_metrics[PLAN_M_SPLIT_BAND].name, c->out.split_band);
    return pd_sbuf_finish(&sb, NULL);
}

static cJSON *plan_status_json(const plan_ctl_t *c)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", c->name);
    cJSON_AddNumberToObject(j, "pid", (double)getpid());
    cJSON_AddBoolToObject(j, "leader", c->leader);
    cJSON_AddNumberToObject(j, "budget", c->budget);
    cJSON_AddStringToObject(j, "reason", pdctl_plan_reason_name(c->out.reason));
    cJSON_AddBoolToObject(j, "act", c->out.act);
    cJSON_AddStringToObject(j, "mode", c->out.mixed ? "mixed" : "separate");
    cJSON_AddStringToObject(j, "running_mode", c->in.mixed ? "mixed" : "separate");
    cJSON_AddNumberToObject(j, "pull_gap_s", c->out.pull_gap_s);
    cJSON_AddNumberToObject(j, "prompt_work", c->out.prompt_work);
    cJSON_AddNumberToObject(j, "decode_load", c->out.dec_load);
    cJSON_AddNumberToObject(j, "prompt_len", c->out.prompt_len);
    cJSON_AddNumberToObject(j, "want_prefill", c->out.want_prefill);
    cJSON_AddNumberToObject(j, "want_decode", c->out.want_decode);
    cJSON_AddNumberToObject(j, "prefill", c->in.n_prefill);
    cJSON_AddNumberToObject(j, "decode", c->in.n_decode);
    cJSON_AddNumberToObject(j, "split_prefill", c->out.split_prefill);
    cJSON_AddNumberToObject(j, "split_band", c->out.split_band);
    cJSON_AddNumberToObject(j, "need_prefill", c->out.need_p);
    cJSON_AddNumberToObject(j, "need_decode", c->out.need_d);
    cJSON_AddNumberToObject(j, "prefill_tok_s", c->out.pf_tok_s);
    cJSON_AddNumberToObject(j, "decode_tok_s", c->out.dec_tok_s);
    cJSON_AddNumberToObject(j, "step_a_ms", c->out.step_a_s * 1e3);
    cJSON_AddNumberToObject(j, "step_k_ms", c->out.step_k_s * 1e3);
    cJSON_AddNumberToObject(j, "decode_batch_cap", c->out.dec_batch_cap);
    cJSON_AddNumberToObject(j, "resplits", (double)c->resplits);
    cJSON_AddNumberToObject(j, "last_resplit_unix", (double)c->last_unix);
    cJSON_AddNumberToObject(j, "updated_unix", (double)time(NULL));
    cJSON *d = cJSON_AddObjectToObject(j, "decisions");
    for (int r = 0; r < PDCTL_PLAN_REASON_N; r++)
        cJSON_AddNumberToObject(d, pdctl_plan_reason_name((pdctl_plan_reason_t)r),
                                (double)c->st.decisions[r]);
    double dt = c->in.dt_s > 0 ? c->in.dt_s : 1;
    cJSON *in = cJSON_AddObjectToObject(j, "inputs");
    cJSON_AddNumberToObject(in, "window_s", c->in.dt_s);
    cJSON_AddNumberToObject(in, "requests_per_s", c->in.requests / dt);
    cJSON_AddNumberToObject(in, "prompt_tokens_per_s", c->in.prompt_tokens / dt);
    cJSON_AddNumberToObject(in, "cached_tokens_per_s", c->in.cached_tokens / dt);
    cJSON_AddNumberToObject(in, "generation_tokens_per_s", c->in.gen_tokens / dt);
    cJSON_AddNumberToObject(in, "ttft_p90_s", c->in.ttft_p90_s);
    cJSON_AddNumberToObject(in, "itl_p90_s", c->in.itl_p90_s);
    cJSON_AddNumberToObject(in, "decode_max_batch", c->in.dec_max_batch);
    return j;
}

/* ---- acting: the operator's own command ---------------------------------------- */

typedef struct plan_leader plan_leader_t;
static void plan_leader_hold(plan_leader_t *l);
static volatile sig_atomic_t plan_stop;

/* Run `pdctl scale ROLE N --run-dir D` (this binary) and wait, keeping the
 * leadership alive meanwhile (a drain may take the stop-timeout). Its exit
 * code. */
static int plan_scale(const char *run_dir, pdctl_role_t role, unsigned n, plan_leader_t *l)
{
    char self[PATH_MAX], num[16];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len <= 0)
        return PDCTL_EXIT_FAIL;
    self[len] = '\0';
    snprintf(num, sizeof(num), "%u", n);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return PDCTL_EXIT_FAIL;
    if (pid == 0) {
        execl(self, "pdctl", "scale", pdctl_role_name(role), num, "--run-dir", run_dir,
              (char *)NULL);
        _exit(127);
    }
    int status = 0;
    double next = pdctl_now() + 1;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            break;
        if (w < 0 && errno != EINTR)
            return PDCTL_EXIT_FAIL;
        if (pdctl_now() >= next) {
            plan_leader_hold(l);
            next = pdctl_now() + 1;
        }
        pdctl_nap_ms(50);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : PDCTL_EXIT_FAIL;
}

/* Every live router's disagg-mode (admin set-disagg-mode). 0, or
 * PDCTL_EXIT_FAIL when a router refused. */
static int plan_set_mode(const char *run_dir, const char *mode)
{
    pdctl_state_t st;
    if (pdctl_state_load(run_dir, &st) != 0)
        return PDCTL_EXIT_FAIL;
    char cmd[64], err[256];
    snprintf(cmd, sizeof(cmd), "set-disagg-mode %s", mode);
    int rc = 0;
    for (int i = 0; i < st.n; i++) {
        const pdctl_daemon_t *x = &st.d[i];
        if (x->role != PDCTL_ROUTER || !pdctl_daemon_alive(x))
            continue;
        cJSON *j = pdctl_admin(x->sock, cmd, 2.0, err, sizeof(err));
        if (j == NULL) {
            fprintf(stderr, "pdctl autoscale: %s: %s: %s\n", x->name, cmd, err);
            rc = PDCTL_EXIT_FAIL;
        }
        cJSON_Delete(j);
    }
    return rc;
}

/* Re-split to o's counts one daemon at a time: drain one of the shrinking
 * pool (live migration, stop), start one of the growing pool, wait until it
 * is ready, repeat. prefill + decode never exceeds the budget, and at most
 * one daemon's capacity is missing at any moment (3:3 -> 0:6 in one step
 * left three decodes carrying everything while three more booted: 26 client
 * timeouts in docs/BENCHMARKS.md "SLO planner, 150-s phases"). A mode switch
 * orders the routers around it so no request meets a missing pool: to
 * PD-mixed, the routers keep disaggregating to the prefills left until the
 * last one is drained (a router with no prefill runs the prompt on the
 * decode), then switch to never; to separate pools, the first prefill is up
 * and ready (pdctl scale waits) BEFORE the routers disaggregate again (the
 * [planner] separate-mode). 0, or the first failing step's exit code. */
static int plan_apply(const char *run_dir, const pdctl_plan_cfg_t *cfg, const pdctl_plan_in_t *in,
                      const pdctl_plan_out_t *o, plan_leader_t *l)
{
    int rc = 0;
    unsigned have[PDCTL_ROLE_N] = { 0 }, want[PDCTL_ROLE_N] = { 0 };
    have[PDCTL_PREFILL] = in->n_prefill;
    have[PDCTL_DECODE] = in->n_decode;
    want[PDCTL_PREFILL] = o->want_prefill;
    want[PDCTL_DECODE] = o->want_decode;
    bool to_separate = !o->mixed && in->mixed;
    const pdctl_role_t roles[2] = { PDCTL_PREFILL, PDCTL_DECODE };
    while (rc == 0 && !plan_stop &&
           (have[PDCTL_PREFILL] != want[PDCTL_PREFILL] || have[PDCTL_DECODE] != want[PDCTL_DECODE])) {
        for (int k = 0; k < 2 && rc == 0; k++) {   /* shrink one */
            pdctl_role_t r = roles[k];
            if (have[r] > want[r]) {
                rc = plan_scale(run_dir, r, have[r] - 1, l);
                have[r]--;
                break;
            }
        }
        if (rc != 0 || plan_stop)   /* stopped meanwhile: not the second half */
            break;
        for (int k = 0; k < 2 && rc == 0; k++) {   /* grow one */
            pdctl_role_t r = roles[k];
            if (have[r] < want[r]) {
                rc = plan_scale(run_dir, r, have[r] + 1, l);
                have[r]++;
                if (rc == 0 && r == PDCTL_PREFILL && to_separate) {
                    rc = plan_set_mode(run_dir, cfg->separate_mode ? cfg->separate_mode
                                                                   : "threshold");
                    to_separate = false;
                }
                break;
            }
        }
    }
    if (rc == 0 && o->mixed && !in->mixed && have[PDCTL_PREFILL] == 0)
        rc = plan_set_mode(run_dir, "never");
    return rc;
}

/* ---- leader election ------------------------------------------------------------- */

struct plan_leader {
    bool leader;
    int fd;                    /* flock: <run>/planner.lock, held while leader */
    char lock_path[PATH_MAX];
    /* etcd: a key under the deployment prefix bound to our lease */
    const char *endpoint;
    char key[256], value[96];
    char lease[32];
    unsigned ttl_s;
    double last_ok;            /* last successful keep-alive */
};

static bool plan_etcd_json(const char *endpoint, const char *path, const char *body, cJSON **out)
{
    char *reply = NULL;
    int code = pd_etcd_post(endpoint, path, body, 2000, &reply);
    *out = code == 200 && reply != NULL ? cJSON_Parse(reply) : NULL;
    free(reply);
    return *out != NULL;
}

static void plan_etcd_revoke(plan_leader_t *l)
{
    if (l->lease[0] == '\0')
        return;
    char body[96];
    snprintf(body, sizeof(body), "{\"ID\":\"%s\"}", l->lease);
    cJSON *r = NULL;
    plan_etcd_json(l->endpoint, "/v3/lease/revoke", body, &r);
    cJSON_Delete(r);
    l->lease[0] = '\0';
}

/* Grant a lease and create the key with it unless it exists: leader. */
static bool plan_etcd_campaign(plan_leader_t *l)
{
    char body[2048];
    cJSON *r = NULL;
    snprintf(body, sizeof(body), "{\"TTL\":%u}", l->ttl_s);
    if (!plan_etcd_json(l->endpoint, "/v3/lease/grant", body, &r))
        return false;
    const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "ID"));
    if (id == NULL || strlen(id) >= sizeof(l->lease)) {
        cJSON_Delete(r);
        return false;
    }
    snprintf(l->lease, sizeof(l->lease), "%s", id);
    cJSON_Delete(r);
    char k64[400], v64[160];
    pd_b64_encode(l->key, strlen(l->key), k64);
    pd_b64_encode(l->value, strlen(l->value), v64);
    snprintf(body, sizeof(body),
             "{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"create_revision\":\"0\"}],"
             "\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%s\"}}]}",
             k64, k64, v64, l->lease);
    bool won = false;
    if (plan_etcd_json(l->endpoint, "/v3/kv/txn", body, &r))
        won = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "succeeded"));
    cJSON_Delete(r);
    if (!won)
        plan_etcd_revoke(l);
    return won;
}

static bool plan_etcd_keepalive(plan_leader_t *l)
{
    char body[96];
    cJSON *r = NULL;
    snprintf(body, sizeof(body), "{\"ID\":\"%s\"}", l->lease);
    bool ok = false;
    if (plan_etcd_json(l->endpoint, "/v3/lease/keepalive", body, &r)) {
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(r, "result");
        const char *ttl = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(res, "TTL"));
        ok = ttl != NULL && atoi(ttl) > 0;   /* an expired lease answers without TTL */
    }
    cJSON_Delete(r);
    return ok;
}

/* Are we the leader now? Campaigns when not. */
static bool plan_leader_check(plan_leader_t *l)
{
    if (l->endpoint == NULL) {
        if (l->leader)
            return true;
        if (l->fd < 0)
            l->fd = open(l->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        l->leader = l->fd >= 0 && flock(l->fd, LOCK_EX | LOCK_NB) == 0;
        return l->leader;
    }
    double now = pdctl_now();
    if (l->leader) {
        if (plan_etcd_keepalive(l)) {
            l->last_ok = now;
        } else if (now - l->last_ok >= (double)l->ttl_s * 2 / 3) {
            /* the lease is (about to be) gone: someone else may win now */
            fprintf(stderr, "pdctl: planner: lost the etcd lease %s; standing by\n", l->lease);
            l->leader = false;
            l->lease[0] = '\0';
        }
        return l->leader;
    }
    if (plan_etcd_campaign(l)) {
        l->leader = true;
        l->last_ok = now;
    }
    return l->leader;
}

/* During a long re-split: the etcd lease must outlive it (an flock does). */
static void plan_leader_hold(plan_leader_t *l)
{
    if (l->endpoint != NULL && l->leader && plan_etcd_keepalive(l))
        l->last_ok = pdctl_now();
}

static void plan_leader_release(plan_leader_t *l)
{
    if (l->endpoint != NULL && l->leader)
        plan_etcd_revoke(l);
    if (l->fd >= 0)
        close(l->fd);   /* drops the flock */
    l->fd = -1;
    l->leader = false;
}

/* ---- /metrics ------------------------------------------------------------------- */

static int plan_listen(const char *addr)
{
    char host[128];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL)
        return -1;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1)) };
    if (inet_pton(AF_INET, host[0] ? host : "0.0.0.0", &sa.sin_addr) != 1)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 8) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* One request on a new connection, bounded to 1 s: GET /metrics or 404. */
static void plan_serve(int lfd, const char *text)
{
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    char req[2048];
    size_t n = 0;
    double end = pdctl_now() + 1.0;
    while (n < sizeof(req) - 1 && strstr(req, "\r\n\r\n") == NULL && pdctl_now() < end) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t r = read(fd, req + n, sizeof(req) - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
        req[n] = '\0';
    }
    req[n] = '\0';
    bool ok = strncmp(req, "GET /metrics ", 13) == 0 || strncmp(req, "GET /metrics?", 13) == 0;
    const char *body = ok ? text : "not found\n";
    char head[256];
    int hl = snprintf(head, sizeof(head),
                      "HTTP/1.1 %s\r\nContent-Type: text/plain; version=0.0.4\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                      ok ? "200 OK" : "404 Not Found", strlen(body));
    if (write(fd, head, (size_t)hl) == hl)
        (void)!write(fd, body, strlen(body));
    close(fd);
}

/* ---- the loop: pdctl autoscale run ------------------------------------------------ */

static void plan_on_signal(int sig)
{
    (void)sig;
    plan_stop = 1;
}

static void plan_write_status(const char *run_dir, const plan_ctl_t *c)
{
    char path[PATH_MAX];
    cJSON *j = plan_status_json(c);
    char *text = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (text != NULL && pdctl_fmt(path, sizeof(path), "%s/%s.json", run_dir, c->name))
        pdctl_write_file(path, text, 0644);
    free(text);
    if (!c->leader)
        return;
    char *prom = plan_metrics_text(c);
    if (prom != NULL && pdctl_fmt(path, sizeof(path), "%s/planner.prom", run_dir))
        pdctl_write_file(path, prom, 0644);
    free(prom);
}

/* The etcd the leader election uses: [planner] etcd, else the deployment's. */
static const char *plan_etcd_endpoint(const pdctl_plan_cfg_t *cfg, const pdctl_dep_t *dep)
{
    if (cfg->etcd != NULL && cfg->etcd[0] != '\0')
        return cfg->etcd;
    return pdctl_kvs_get(&dep->role_kv[PDCTL_ROUTER], "etcd");
}

static int plan_run(const char *run_dir, const char *name)
{
    pdctl_state_t st;
    int rc = pdctl_state_load(run_dir, &st);
    if (rc != 0)
        return rc;
    pdctl_dep_t dep;
    if ((rc = pdctl_dep_of_state(&st, &dep)) != 0)
        return rc;
    pdctl_plan_cfg_t cfg;
    plan_ctl_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        pdctl_dep_free(&dep);
        return PDCTL_EXIT_FAIL;
    }
    if ((rc = plan_cfg_load(&dep, &cfg, &c->budget)) != 0)
        goto out;
    snprintf(c->name, sizeof(c->name), "%s", name);
    pdctl_plan_state_init(&c->st);
    plan_leader_t l = { .fd = -1 };
    pdctl_fmt(l.lock_path, sizeof(l.lock_path), "%s/planner.lock", run_dir);
    l.endpoint = plan_etcd_endpoint(&cfg, &dep);
    const char *pfx = pdctl_kvs_get(&dep.role_kv[PDCTL_ROUTER], "etcd.prefix");
    snprintf(l.key, sizeof(l.key), "%splanner/leader", pfx ? pfx : "/pdserve/default/");
    char host[64] = "";
    gethostname(host, sizeof(host) - 1);
    snprintf(l.value, sizeof(l.value), "%s %s pid %d", host, name, (int)getpid());
    double interval = (double)cfg.interval_ns / 1e9;
    l.ttl_s = (unsigned)ceil(interval * 3);
    if (l.ttl_s < 2)
        l.ttl_s = 2;

    struct sigaction sa = { .sa_handler = plan_on_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    printf("%s: planning %s (budget %u daemons; leader by %s%s; tick %.1fs, window %.0fs, "
           "dwell %.0fs, confirm %u, hysteresis %.2f, ttft-p90 %.3fs, tpot-p90 %.3fs)\n",
           name, run_dir, c->budget, l.endpoint ? "etcd " : "flock on ",
           l.endpoint ? l.endpoint : l.lock_path, interval, (double)cfg.window_ns / 1e9,
           (double)cfg.dwell_ns / 1e9, (unsigned)cfg.confirm, cfg.hysteresis,
           (double)cfg.ttft_p90_ns / 1e9, (double)cfg.tpot_p90_ns / 1e9);
    fflush(stdout);
    plan_sample_t *samples = calloc(2, sizeof(*samples)), *prev = samples, *cur = samples + 1;
    if (samples == NULL) {
        rc = PDCTL_EXIT_FAIL;
        goto out;
    }
    bool have_prev = false;
    int lfd = -1;
    pdctl_plan_reason_t last_reason = PDCTL_PLAN_REASON_N;
    unsigned quiet = 0;
    while (!plan_stop) {
        double tick_end = pdctl_now() + interval;
        bool was_leader = l.leader;
        c->leader = plan_leader_check(&l);
        if (c->leader && !was_leader) {
            printf("%s: leader (%s)\n", name, l.endpoint ? l.key : l.lock_path);
            fflush(stdout);
        }
        if (c->leader && lfd < 0 && cfg.metrics_listen != NULL && cfg.metrics_listen[0]) {
            lfd = plan_listen(cfg.metrics_listen);
            if (lfd < 0)
                fprintf(stderr, "%s: cannot listen on %s for /metrics: %s\n", name,
                        cfg.metrics_listen, strerror(errno));
        }
        pdctl_state_t now_st;
        if (pdctl_state_load(run_dir, &now_st) != 0)
            break;   /* pdctl down removed the deployment */
        plan_sample(&now_st, cur);
        plan_figures(have_prev ? prev : NULL, cur, (uint64_t)(cur->t * 1e9), &c->in);
        pdctl_plan_step(&cfg, c->budget, &c->in, &c->st, &c->out);
        bool log = c->out.act || c->out.reason != last_reason || ++quiet >= 15;
        if (log) {
            plan_log(name, c->leader, cfg.act, &c->in, &c->out);
            quiet = 0;
        }
        last_reason = c->out.reason;
        if (c->out.act && c->leader && cfg.act) {
            c->resplits++;
            c->last_unix = (int64_t)time(NULL);
            plan_write_status(run_dir, c);
            int arc = plan_apply(run_dir, &cfg, &c->in, &c->out, &l);
            /* dwell and the measures' settling count from the end: a
             * re-split took 10-25 s in the three-phase benchmark, longer
             * than its 10-s dwell */
            pdctl_plan_applied(&c->st, (uint64_t)(pdctl_now() * 1e9));
            printf("%s: re-split %u:%u -> %u:%u %s (rc %d)\n", name, c->in.n_prefill,
                   c->in.n_decode, c->out.want_prefill, c->out.want_decode,
                   arc == 0 ? "done" : "FAILED", arc);
            fflush(stdout);
            have_prev = false;   /* daemons came and went: start the deltas afresh */
            continue;
        }
        plan_write_status(run_dir, c);
        plan_sample_t *t = prev;
        prev = cur;
        cur = t;
        have_prev = true;
        /* until the next tick: serve /metrics, or sleep */
        char *text = lfd >= 0 ? plan_metrics_text(c) : NULL;
        for (double left; !plan_stop && (left = tick_end - pdctl_now()) > 0;) {
            if (lfd < 0) {
                pdctl_nap_ms(left > 0.1 ? 100 : (unsigned)(left * 1000) + 1);
                continue;
            }
            struct pollfd p = { .fd = lfd, .events = POLLIN };
            if (poll(&p, 1, (int)(left * 1000) + 1) > 0)
                plan_serve(lfd, text ? text : "");
        }
        free(text);
    }
    printf("%s: stopping\n", name);
    fflush(stdout);
    if (l.leader) {   /* no stale metrics for a textfile collector */
        char prom[PATH_MAX];
        if (pdctl_fmt(prom, sizeof(prom), "%s/planner.prom", run_dir))
            unlink(prom);
    }
    if (lfd >= 0)
        close(lfd);
    plan_leader_release(&l);
    free(samples);
    rc = 0;
out:
    pd_config_free(&pdctl_plan_schema, &cfg);
    pdctl_dep_free(&dep);
    free(c);
    return rc;
}

/* ---- the run dir's planners ------------------------------------------------------ */

static void plan_pid_path(const char *run_dir, int k, char *buf, size_t cap)
{
    pdctl_fmt(buf, cap, "%s/planner-%d.pid", run_dir, k);
}

/* planner-k's pid if it runs, else 0. */
static pid_t plan_pid(const char *run_dir, int k)
{
    char p[PATH_MAX];
    plan_pid_path(run_dir, k, p, sizeof(p));
    char *t = pdctl_read_file(p, NULL);
    pid_t pid = t ? (pid_t)atoi(t) : 0;
    free(t);
    return pid > 0 && pdctl_pid_runs(pid, "pdctl") ? pid : 0;
}

static cJSON *plan_status_read(const char *run_dir, int k)
{
    char p[PATH_MAX];
    pdctl_fmt(p, sizeof(p), "%s/planner-%d.json", run_dir, k);
    char *t = pdctl_read_file(p, NULL);
    cJSON *j = t ? cJSON_Parse(t) : NULL;
    free(t);
    return j;
}

cJSON *pdctl_planners_json(const char *run_dir)
{
    cJSON *arr = cJSON_CreateArray();
    for (int k = 0; k < PLAN_MAX_PLANNERS; k++) {
        pid_t pid = plan_pid(run_dir, k);
        if (pid == 0)
            continue;
        cJSON *j = plan_status_read(run_dir, k);
        if (j == NULL) {
            j = cJSON_CreateObject();
            char name[32];
            snprintf(name, sizeof(name), "planner-%d", k);
            cJSON_AddStringToObject(j, "name", name);
            cJSON_AddNumberToObject(j, "pid", pid);
        }
        cJSON_AddItemToArray(arr, j);
    }
    return arr;
}

int pdctl_planners_status(const char *run_dir)
{
    cJSON *arr = pdctl_planners_json(run_dir);
    int n = 0;
    const cJSON *j;
    cJSON_ArrayForEach(j, arr) {
        n++;
        const char *reason = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "reason"));
        printf("%-10s planner  %-8s pid %.0f  want %.0f:%.0f  running %.0f:%.0f  last %s  "
               "re-splits %.0f\n",
               cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "name")),
               cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "leader")) ? "leader" : "standby",
               plan_num(j, "pid"), plan_num(j, "want_prefill"), plan_num(j, "want_decode"),
               plan_num(j, "prefill"), plan_num(j, "decode"), reason ? reason : "starting",
               plan_num(j, "resplits"));
    }
    cJSON_Delete(arr);
    return n;
}

void pdctl_planners_stop(const char *run_dir, double timeout_s)
{
    pid_t pids[PLAN_MAX_PLANNERS] = { 0 };
    for (int k = 0; k < PLAN_MAX_PLANNERS; k++)
        if ((pids[k] = plan_pid(run_dir, k)) > 0)
            kill(pids[k], SIGTERM);
    /* a planner in the middle of a re-split finishes its `pdctl scale` first */
    double end = pdctl_now() + timeout_s;
    for (int k = 0; k < PLAN_MAX_PLANNERS; k++) {
        while (pids[k] > 0 && pdctl_pid_runs(pids[k], "pdctl") && pdctl_now() < end)
            pdctl_nap_ms(20);
        if (pids[k] > 0 && pdctl_pid_runs(pids[k], "pdctl"))
            kill(pids[k], SIGKILL);
        char p[PATH_MAX];
        plan_pid_path(run_dir, k, p, sizeof(p));
        if (pids[k] > 0 || access(p, F_OK) == 0)
            unlink(p);
    }
}

/* autoscale on: a new planner-<k> (setsid, its own log), recorded in the run dir. */
static int plan_start(const char *run_dir, const pdctl_plan_cfg_t *cfg)
{
    int k = 0;
    char pidf[PATH_MAX];
    for (; k < PLAN_MAX_PLANNERS; k++) {
        plan_pid_path(run_dir, k, pidf, sizeof(pidf));
        if (plan_pid(run_dir, k) == 0)
            break;
    }
    if (k == PLAN_MAX_PLANNERS) {
        fprintf(stderr, "pdctl: %d planners run already\n", PLAN_MAX_PLANNERS);
        return PDCTL_EXIT_FAIL;
    }
    char name[32], log[PATH_MAX], js[PATH_MAX], self[PATH_MAX];
    snprintf(name, sizeof(name), "planner-%d", k);
    pdctl_fmt(log, sizeof(log), "%s/%s.log", run_dir, name);
    pdctl_fmt(js, sizeof(js), "%s/%s.json", run_dir, name);
    unlink(js);
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len <= 0)
        return PDCTL_EXIT_FAIL;
    self[len] = '\0';
    int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0) {
        fprintf(stderr, "pdctl: cannot open %s: %s\n", log, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        close(logfd);
        return PDCTL_EXIT_FAIL;
    }
    if (pid == 0) {
        setsid();
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0)
            dup2(null, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        execl(self, "pdctl", "autoscale", "run", name, "--run-dir", run_dir, (char *)NULL);
        _exit(127);
    }
    close(logfd);
    char txt[32];
    snprintf(txt, sizeof(txt), "%d\n", (int)pid);
    pdctl_write_file(pidf, txt, 0644);
    /* running once its first tick wrote its status */
    double end = pdctl_now() + (double)cfg->interval_ns / 1e9 + 15;
    while (access(js, F_OK) != 0) {
        if (!pdctl_pid_runs(pid, "pdctl") || pdctl_now() > end) {
            fprintf(stderr, "pdctl: %s did not start (log %s)\n", name, log);
            kill(pid, SIGKILL);
            unlink(pidf);
            return PDCTL_EXIT_FAIL;
        }
        pdctl_nap_ms(50);
    }
    cJSON *j = plan_status_read(run_dir, k);
    printf("%s started (pid %d, %s; log %s)\n", name, (int)pid,
           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "leader")) ? "leader" : "standby",
           log);
    cJSON_Delete(j);
    return 0;
}

int pdctl_cmd_autoscale(int argc, char **argv)
{
    pdctl_opts_t o = { 0 };
    pdctl_parse_opts(&argc, argv, &o);
    const char *what = argc >= 1 ? argv[0] : "status";
    if (strcmp(what, "run") == 0 && argc == 2)
        return plan_run(o.run_dir, argv[1]);
    if (argc > 1 || (strcmp(what, "on") != 0 && strcmp(what, "off") != 0 &&
                     strcmp(what, "status") != 0)) {
        fprintf(stderr, "usage: pdctl autoscale on|off|status [--run-dir D] [--json]\n");
        return PDCTL_EXIT_USAGE;
    }
    pdctl_state_t st;
    int rc = pdctl_state_load(o.run_dir, &st);
    if (rc != 0)
        return rc;
    if (strcmp(what, "status") == 0) {
        if (o.json) {
            cJSON *arr = pdctl_planners_json(o.run_dir);
            char *s = cJSON_PrintUnformatted(arr);
            printf("%s\n", s);
            free(s);
            cJSON_Delete(arr);
        } else if (pdctl_planners_status(o.run_dir) == 0) {
            printf("no planner runs (pdctl autoscale on)\n");
        }
        return 0;
    }
    if ((rc = pdctl_refuse_installed(&st, "autoscale")) != 0)
        return rc;
    pdctl_dep_t dep;
    if ((rc = pdctl_dep_of_state(&st, &dep)) != 0)
        return rc;
    pdctl_plan_cfg_t cfg;
    unsigned budget;
    if ((rc = plan_cfg_load(&dep, &cfg, &budget)) == 0) {
        if (strcmp(what, "on") == 0) {
            rc = plan_start(o.run_dir, &cfg);
        } else {
            int n = 0;
            for (int k = 0; k < PLAN_MAX_PLANNERS; k++)
                n += plan_pid(o.run_dir, k) > 0;
            pdctl_planners_stop(o.run_dir, (double)dep.stop_timeout_ns / 1e9 + 10);
            printf("autoscale off (%d planner%s stopped)\n", n, n == 1 ? "" : "s");
        }
    }
    pd_config_free(&pdctl_plan_schema, &cfg);
    pdctl_dep_free(&dep);
    return rc;
}

/* ---- pdctl plan: the dry run ------------------------------------------------------ */

/* pdctl disagg-mode MODE: every router's disagg-mode, now (PD-mixed = never). */
int pdctl_cmd_disagg_mode(int argc, char **argv)
{
    pdctl_opts_t o = { 0 };
    pdctl_parse_opts(&argc, argv, &o);
    if (argc != 1) {
        fprintf(stderr, "usage: pdctl disagg-mode threshold|always|never|cost [--run-dir D]\n");
        return PDCTL_EXIT_USAGE;
    }
    return plan_set_mode(o.run_dir, argv[0]);
}

int pdctl_cmd_plan(int argc, char **argv)
{
    pdctl_opts_t o = { 0 };
    pdctl_parse_opts(&argc, argv, &o);
    double secs = -1;
    if (argc == 2 && strcmp(argv[0], "--seconds") == 0)
        secs = atof(argv[1]);
    else if (argc != 0) {
        fprintf(stderr, "usage: pdctl plan [--seconds S] [--run-dir D] [--json]\n");
        return PDCTL_EXIT_USAGE;
    }
    pdctl_state_t st;
    int rc = pdctl_state_load(o.run_dir, &st);
    if (rc != 0)
        return rc;
    pdctl_dep_t dep;
    if ((rc = pdctl_dep_of_state(&st, &dep)) != 0)
        return rc;
    pdctl_plan_cfg_t cfg;
    plan_ctl_t *c = calloc(1, sizeof(*c));
    plan_sample_t *s = calloc(2, sizeof(*s));
    if (c == NULL || s == NULL) {
        rc = PDCTL_EXIT_FAIL;
        goto out_free;
    }
    if ((rc = plan_cfg_load(&dep, &cfg, &c->budget)) != 0)
        goto out;
    if (secs < 0)
        secs = (double)cfg.interval_ns / 1e9;
    snprintf(c->name, sizeof(c->name), "plan");
    pdctl_plan_state_init(&c->st);
    plan_sample(&st, &s[0]);
    if (s[0].n_routers == 0) {
        fprintf(stderr, "pdctl: no router of %s answers\n", o.run_dir);
        rc = PDCTL_EXIT_FAIL;
        goto out;
    }
    pdctl_nap_ms((unsigned)(secs * 1000));
    plan_sample(&st, &s[1]);
    plan_figures(&s[0], &s[1], (uint64_t)(s[1].t * 1e9), &c->in);
    /* what the figures say now: no confirm, no dwell (the running planner
     * waits for both; its own status is shown below) */
    pdctl_plan_cfg_t now = cfg;
    now.confirm = 1;
    now.dwell_ns = 0;
    pdctl_plan_step(&now, c->budget, &c->in, &c->st, &c->out);
    cJSON *running = pdctl_planners_json(o.run_dir);
    if (o.json) {
        cJSON *j = plan_status_json(c);
        cJSON_DeleteItemFromObject(j, "pid");
        cJSON_DeleteItemFromObject(j, "leader");
        cJSON_AddItemToObject(j, "planners", running);
        char *t = cJSON_PrintUnformatted(j);
        printf("%s\n", t);
        free(t);
        cJSON_Delete(j);
        goto out;
    }
    const pdctl_plan_in_t *in = &c->in;
    const pdctl_plan_out_t *p = &c->out;
    double dt = in->dt_s > 0 ? in->dt_s : 1;
    printf("deployment \"%s\": budget %u daemons, running %u prefill : %u decode\n", st.name,
           c->budget, in->n_prefill, in->n_decode);
    printf("  measured over %.1f s: %.2f req/s; prompt %.0f tok/s (%.0f cached); generated %.0f tok/s\n",
           in->dt_s, in->requests / dt, in->prompt_tokens / dt, in->cached_tokens / dt,
           in->gen_tokens / dt);
    printf("  SLOs: TTFT p90 %.3f s (target %.3f s); inter-token p90 %.4f s (target %.4f s)\n",
           in->ttft_p90_s, (double)cfg.ttft_p90_ns / 1e9, in->itl_p90_s,
           (double)cfg.tpot_p90_ns / 1e9);
    printf("  capacity: prefill %.0f tok/s per daemon%s; decode step %.2f ms + %.3f ms x batch, "
           "batch cap %.0f -> %.0f tok/s per daemon%s\n",
           p->pf_tok_s, in->pf_busy_s > 0 ? " (measured)" : " (router's cost-mode rate)",
           p->step_a_s * 1e3, p->step_k_s * 1e3, p->dec_batch_cap, p->dec_tok_s,
           in->n_dec > 1 ? "" : " (one batch size seen: proportional until batches vary)");
    printf("  mode: running %s, wants %s: prompt compute %.2f daemons (PD-mixed below %.2f), "
           "decode load %.2f daemons (PD-mixed above %u); "
           "a mean prompt of %.0f tokens would pull in %.4f s (%.1f us a token vs %.1f us a "
           "local token stalls its batch; tpot-p90 %.4f s, margin %.2f)\n",
           in->mixed ? "PD-mixed" : "separate", p->mixed ? "PD-mixed" : "separate",
           p->prompt_work, PDCTL_PLAN_MIXED_WORK, p->dec_load, c->budget > 1 ? c->budget - 1 : 0,
           p->prompt_len, p->pull_gap_s,
           p->pull_tok_s * 1e6, p->local_stall_s * 1e6, (double)cfg.tpot_p90_ns / 1e9,
           PDCTL_PLAN_MODE_MARGIN);
    printf("  need at target-util %.2f: prefill %.2f, decode %.2f daemons -> prefill share %.2f of %u "
           "(re-split beyond %.2f: 0.5 + hysteresis %.2f + noise band %.2f)\n",
           cfg.target_util, p->need_p, p->need_d, p->split_prefill, c->budget,
           0.5 + cfg.hysteresis + p->split_band, cfg.hysteresis, p->split_band);
    if (p->act)
        printf("  would re-split: %u prefill : %u decode (%s: %s)\n", p->want_prefill,
               p->want_decode, pdctl_plan_reason_name(p->reason), pdctl_plan_reason_help(p->reason));
    else
        printf("  would hold %u : %u (%s: %s)\n", in->n_prefill, in->n_decode,
               pdctl_plan_reason_name(p->reason), pdctl_plan_reason_help(p->reason));
    printf("  a running planner also waits: %u ticks of %.1f s in agreement, %.0f s since its last re-split\n",
           (unsigned)cfg.confirm, (double)cfg.interval_ns / 1e9, (double)cfg.dwell_ns / 1e9);
    cJSON_Delete(running);
    if (pdctl_planners_status(o.run_dir) == 0)
        printf("  autoscale is off (pdctl autoscale on)\n");
out:
    pd_config_free(&pdctl_plan_schema, &cfg);
out_free:
    free(s);
    free(c);
    pdctl_dep_free(&dep);
    return rc;
}
