/* pb_report.c - pd-bench's results: the JSON of a pass, the printed table,
 * and figures side by side (--baseline FILE, --compare URL2). */
#include "pb_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- output ------------------------------------------------------------ */

static void add_summary(cJSON *o, const char *metric, const pb_summary_t *s)
{
    char k[64];

#define ADD(stat, val)                                                        \
    do {                                                                      \
        snprintf(k, sizeof(k), "%s_%s_ms", stat, metric);                     \
        cJSON_AddNumberToObject(o, k, val);                                   \
    } while (0)
    ADD("mean", s->mean);
    ADD("median", s->median);
    ADD("std", s->std);
    ADD("min", s->min);
    ADD("max", s->max);
    ADD("p50", s->p50);
    ADD("p90", s->p90);
    ADD("p99", s->p99);
#undef ADD
}

/* Multi-turn: the figures of each turn (1-based) over all conversations:
 * results.per_turn[{turn, completed, failed, mean_input_tokens,
 * mean_cached_tokens (null unless reported), TTFT/TPOT/E2EL}]. */
static void add_per_turn(pb_run_t *run, cJSON *res)
{
    cJSON *arr = cJSON_AddArrayToObject(res, "per_turn");
    pb_record_t *sub = malloc((run->n_recs + 1) * sizeof(*sub));
    uint32_t t;
    size_t i, n;

    if (arr == NULL || sub == NULL) {
        free(sub);
        return;
    }
    for (t = 0; t < run->cfg.turns; t++) {
        pb_aggregate_t a;
        cJSON *o;

        for (i = n = 0; i < run->n_recs; i++)
            if (run->recs[i].turn == t)
                sub[n++] = run->recs[i];
        if (n == 0 || pb_aggregate(sub, n, &run->slo, 1, &a) != PD_OK)
            continue;
        o = cJSON_CreateObject();
        if (o == NULL || !cJSON_AddItemToArray(arr, o))
            break;
        cJSON_AddNumberToObject(o, "turn", t + 1);
        cJSON_AddNumberToObject(o, "completed", a.completed);
        cJSON_AddNumberToObject(o, "failed", a.failed);
        cJSON_AddNumberToObject(o, "mean_input_tokens", a.completed
                                ? (double)a.total_input_tokens / a.completed : 0);
        if (a.cached_reported > 0)
            cJSON_AddNumberToObject(o, "mean_cached_tokens",
                                    (double)a.total_cached_tokens / a.cached_reported);
        else
            cJSON_AddNullToObject(o, "mean_cached_tokens");
        cJSON_AddNumberToObject(o, "mean_ttft_ms", a.ttft_ms.mean);
        cJSON_AddNumberToObject(o, "p50_ttft_ms", a.ttft_ms.p50);
        cJSON_AddNumberToObject(o, "p99_ttft_ms", a.ttft_ms.p99);
        cJSON_AddNumberToObject(o, "mean_tpot_ms", a.tpot_ms.mean);
        cJSON_AddNumberToObject(o, "p99_tpot_ms", a.tpot_ms.p99);
        cJSON_AddNumberToObject(o, "mean_e2el_ms", a.e2el_ms.mean);
    }
    free(sub);
}

cJSON *pb_build_json(pb_run_t *run, const pb_aggregate_t *agg)
{
    cJSON *root = cJSON_CreateObject(), *cfg, *res, *errs, *st, *slo, *reqs;
    size_t i;
    char buf[32];

    cJSON_AddStringToObject(root, "tool", PB_PROG);
    cJSON_AddStringToObject(root, "version", PD_VERSION);
    cJSON_AddNumberToObject(root, "date_unix_s", (double)time(NULL));
    cfg = pd_config_to_json(&pb_schema, &run->cfg);
    if (cfg != NULL) {
        cJSON_DeleteItemFromObject(cfg, "api-key");
        cJSON_AddItemToObject(root, "config", cfg);
    }
    cJSON_AddStringToObject(root, "url", run->target_url);
    cJSON_AddStringToObject(root, "mode", run->workload == PB_WL_TRACE ? "trace"
                            : run->rate_mode ? "rate" : "concurrency");
    cJSON_AddStringToObject(root, "workload", pb_workload_names[run->workload]);
    cJSON_AddNumberToObject(root, "max_concurrency", run->n_slots);
    cJSON_AddStringToObject(root, "model", run->model);

    res = cJSON_AddObjectToObject(root, "results");
    cJSON_AddNumberToObject(res, "num_requests", agg->num_requests);
    cJSON_AddNumberToObject(res, "completed", agg->completed);
    cJSON_AddNumberToObject(res, "failed", agg->failed);
    cJSON_AddNumberToObject(res, "warmup", (double)run->warm_issued);
    cJSON_AddNumberToObject(res, "duration", agg->duration_s);
    cJSON_AddNumberToObject(res, "total_input_tokens", (double)agg->total_input_tokens);
    cJSON_AddNumberToObject(res, "total_output_tokens", (double)agg->total_output_tokens);
    cJSON_AddNumberToObject(res, "request_throughput", agg->request_throughput);
    if (pb_slo_any(&run->slo))
        cJSON_AddNumberToObject(res, "request_goodput", agg->request_goodput);
    else
        cJSON_AddNullToObject(res, "request_goodput");
    cJSON_AddNumberToObject(res, "good_requests", agg->good);
    cJSON_AddNumberToObject(res, "output_throughput", agg->output_throughput);
    cJSON_AddNumberToObject(res, "total_token_throughput", agg->total_token_throughput);
    cJSON_AddNumberToObject(res, "max_concurrency_observed", run->max_inflight);
    if (run->rate_mode)
        cJSON_AddNumberToObject(res, "arrivals", (double)run->arrivals);
    cJSON_AddNumberToObject(res, "reconnects", agg->reconnects);
    cJSON_AddNumberToObject(res, "connections_closed_idle", (double)run->idle_closed);
    if (agg->cached_reported > 0) {
        cJSON_AddNumberToObject(res, "total_cached_tokens",
                                (double)agg->total_cached_tokens);
        cJSON_AddNumberToObject(res, "cached_token_fraction",
                                agg->total_input_tokens
                                ? (double)agg->total_cached_tokens /
                                  (double)agg->total_input_tokens : 0.0);
    } else {
        cJSON_AddNullToObject(res, "total_cached_tokens");
        cJSON_AddNullToObject(res, "cached_token_fraction");
    }
    if (run->workload == PB_WL_MULTI_TURN)
        cJSON_AddNumberToObject(res, "skipped_turns", (double)run->skipped_turns);
    add_summary(res, "ttft", &agg->ttft_ms);
    add_summary(res, "tpot", &agg->tpot_ms);
    add_summary(res, "itl", &agg->itl_ms);
    add_summary(res, "e2el", &agg->e2el_ms);
    errs = cJSON_AddObjectToObject(res, "errors");
    for (i = 1; i < PB_ERR_COUNT; i++)
        cJSON_AddNumberToObject(errs, pb_err_kind_name((pb_err_kind_t)i),
                                agg->errors[i]);
    st = cJSON_AddObjectToObject(res, "errors_by_status");
    for (i = 0; i < run->n_recs; i++) {
        const pb_record_t *r = &run->recs[i];
        cJSON *c;
        if (r->http_status == 0 || r->http_status == 200)
            continue;
        snprintf(buf, sizeof(buf), "%d", r->http_status);
        c = cJSON_GetObjectItemCaseSensitive(st, buf);
        if (c == NULL)
            cJSON_AddNumberToObject(st, buf, 1);
        else
            cJSON_SetNumberValue(c, c->valuedouble + 1);
    }
    if (run->workload == PB_WL_MULTI_TURN)
        add_per_turn(run, res);
    slo = cJSON_AddObjectToObject(root, "slo");
    if (run->slo.has_ttft)
        cJSON_AddNumberToObject(slo, "ttft_ms", (double)run->slo.ttft_ns / 1e6);
    if (run->slo.has_tpot)
        cJSON_AddNumberToObject(slo, "tpot_ms", (double)run->slo.tpot_ns / 1e6);
    if (run->slo.has_e2el)
        cJSON_AddNumberToObject(slo, "e2el_ms", (double)run->slo.e2el_ns / 1e6);

    if (run->cfg.no_per_request)
        return root;
    reqs = cJSON_AddArrayToObject(root, "requests");
    for (i = 0; i < run->n_recs; i++) {
        const pb_record_t *r = &run->recs[i];
        cJSON *o = cJSON_CreateObject(), *itl;
        uint32_t j;

        cJSON_AddNumberToObject(o, "id", r->id);
        snprintf(buf, sizeof(buf), "pd-bench-%llu-%u",
                 (unsigned long long)run->cfg.seed, r->id);
        cJSON_AddStringToObject(o, "request_id", buf);
        cJSON_AddNumberToObject(o, "start_ms", (double)r->start_ns / 1e6);
        cJSON_AddBoolToObject(o, "success", r->success);
        cJSON_AddStringToObject(o, "error", pb_err_kind_name(r->err));
        if (r->err_msg[0] != '\0')
            cJSON_AddStringToObject(o, "error_msg", r->err_msg);
        cJSON_AddNumberToObject(o, "http_status", r->http_status);
        if (r->content_chunks > 0)
            cJSON_AddNumberToObject(o, "ttft_ms", (double)r->ttft_ns / 1e6);
        else
            cJSON_AddNullToObject(o, "ttft_ms");
        if (r->output_tokens > 1 && r->content_chunks > 0)
            cJSON_AddNumberToObject(o, "tpot_ms", pb_record_tpot_ns(r) / 1e6);
        else
            cJSON_AddNullToObject(o, "tpot_ms");
        cJSON_AddNumberToObject(o, "e2el_ms", (double)r->e2el_ns / 1e6);
        cJSON_AddNumberToObject(o, "input_tokens", r->input_tokens);
        cJSON_AddNumberToObject(o, "output_tokens", r->output_tokens);
        cJSON_AddStringToObject(o, "output_tokens_source",
                                r->usage_seen ? "usage" : "chunks");
        cJSON_AddNumberToObject(o, "content_chunks", r->content_chunks);
        cJSON_AddBoolToObject(o, "conn_reused", r->conn_reused);
        cJSON_AddBoolToObject(o, "reconnected", r->reconnected);
        if (r->cached_seen)
            cJSON_AddNumberToObject(o, "cached_tokens", r->cached_tokens);
        else
            cJSON_AddNullToObject(o, "cached_tokens");
        if (run->workload == PB_WL_MULTI_TURN) {
            cJSON_AddNumberToObject(o, "conversation", r->conv);
            cJSON_AddNumberToObject(o, "turn", r->turn + 1);
        }
        cJSON_AddBoolToObject(o, "slo_met", pb_slo_met(&run->slo, r));
        itl = cJSON_AddArrayToObject(o, "itl_ms");
        for (j = 0; j < r->n_itl; j++)
            cJSON_AddItemToArray(itl, cJSON_CreateNumber((double)r->itl_ns[j] / 1e6));
        cJSON_AddItemToArray(reqs, o);
    }
    return root;
}

static void print_summary_rows(const char *name, const char *label,
                               const pb_summary_t *s)
{
    char t[96];

    printf("%s\n", label);
    snprintf(t, sizeof(t), "Mean %s (ms):", name);
    printf("%-40s %-10.2f\n", t, s->mean);
    snprintf(t, sizeof(t), "Median %s (ms):", name);
    printf("%-40s %-10.2f\n", t, s->median);
    snprintf(t, sizeof(t), "P90 %s (ms):", name);
    printf("%-40s %-10.2f\n", t, s->p90);
    snprintf(t, sizeof(t), "P99 %s (ms):", name);
    printf("%-40s %-10.2f\n", t, s->p99);
}

void pb_print_table(pb_run_t *run, const pb_aggregate_t *agg,
                        const cJSON *per_turn)
{
    size_t i;

    printf("%s\n", "============ Serving Benchmark Result ============");
    printf("%-40s %-10s\n", "Server:", run->target_url);
    printf("%-40s %-10s\n", "Workload:", pb_workload_names[run->workload]);
    printf("%-40s %-10s\n", "Mode:", run->workload == PB_WL_TRACE ? "trace replay"
           : run->rate_mode ? "rate (Poisson)" : "concurrency");
    printf("%-40s %-10u\n", "Max concurrency:", run->n_slots);
    printf("%-40s %-10u\n", "Successful requests:", agg->completed);
    printf("%-40s %-10u\n", "Failed requests:", agg->failed);
    printf("%-40s %-10.2f\n", "Benchmark duration (s):", agg->duration_s);
    printf("%-40s %-10llu\n", "Total input tokens:",
           (unsigned long long)agg->total_input_tokens);
    printf("%-40s %-10llu\n", "Total generated tokens:",
           (unsigned long long)agg->total_output_tokens);
    if (agg->cached_reported > 0)
        printf("%-40s %-10llu (%.1f %%)\n", "Total cached prompt tokens:",
               (unsigned long long)agg->total_cached_tokens,
               agg->total_input_tokens ? 100.0 * (double)agg->total_cached_tokens /
                                         (double)agg->total_input_tokens : 0.0);
    printf("%-40s %-10u\n", "Reconnects (resent, not errors):", agg->reconnects);
    if (run->workload == PB_WL_MULTI_TURN)
        printf("%-40s %-10llu\n", "Skipped turns (conversation failed):",
               (unsigned long long)run->skipped_turns);
    printf("%-40s %-10.2f\n", "Request throughput (req/s):", agg->request_throughput);
    if (pb_slo_any(&run->slo))
        printf("%-40s %-10.2f\n", "Request goodput (req/s):", agg->request_goodput);
    printf("%-40s %-10.2f\n", "Output token throughput (tok/s):", agg->output_throughput);
    printf("%-40s %-10.2f\n", "Total Token throughput (tok/s):",
           agg->total_token_throughput);
    print_summary_rows("TTFT", "---------------Time to First Token----------------",
                       &agg->ttft_ms);
    print_summary_rows("TPOT", "-----Time per Output Token (excl. 1st token)------",
                       &agg->tpot_ms);
    print_summary_rows("ITL", "---------------Inter-token Latency----------------",
                       &agg->itl_ms);
    print_summary_rows("E2EL", "----------------End-to-end Latency----------------",
                       &agg->e2el_ms);
    if (per_turn != NULL) {
        const cJSON *o;

        printf("%s\n", "---------------------Per turn---------------------");
        printf("%-5s %5s %8s %7s %9s %9s %9s\n", "turn", "ok", "in tok", "cached",
               "TTFT ms", "P99 TTFT", "TPOT ms");
        cJSON_ArrayForEach(o, per_turn) {
            const cJSON *c = cJSON_GetObjectItem(o, "mean_cached_tokens");
            char cached[32] = "-";

            if (cJSON_IsNumber(c))
                snprintf(cached, sizeof(cached), "%.0f", c->valuedouble);
            printf("%-5.0f %5.0f %8.0f %7s %9.2f %9.2f %9.2f\n",
                   cJSON_GetObjectItem(o, "turn")->valuedouble,
                   cJSON_GetObjectItem(o, "completed")->valuedouble,
                   cJSON_GetObjectItem(o, "mean_input_tokens")->valuedouble, cached,
                   cJSON_GetObjectItem(o, "mean_ttft_ms")->valuedouble,
                   cJSON_GetObjectItem(o, "p99_ttft_ms")->valuedouble,
                   cJSON_GetObjectItem(o, "mean_tpot_ms")->valuedouble);
        }
    }
    if (agg->failed > 0) {
        printf("%s\n", "---------------------Errors-----------------------");
        for (i = 1; i < PB_ERR_COUNT; i++)
            if (agg->errors[i] > 0)
                printf("%-40s %-10u\n", pb_err_kind_name((pb_err_kind_t)i),
                       agg->errors[i]);
    }
    printf("%s\n", "==================================================");
    fflush(stdout);
}

/* ---- baseline comparison ------------------------------------------------ */

/* Figures compared with --baseline; "higher" says which way is better. */
static const struct {
    const char *key;
    const char *label;
    bool higher_better;
} cmp_rows[] = {
    { "completed",              "Successful requests",        true },
    { "failed",                 "Failed requests",            false },
    { "request_throughput",     "Request throughput (req/s)", true },
    { "request_goodput",        "Request goodput (req/s)",    true },
    { "output_throughput",      "Output tok/s",               true },
    { "total_token_throughput", "Total tok/s",                true },
    { "mean_ttft_ms",           "Mean TTFT (ms)",             false },
    { "p50_ttft_ms",            "P50 TTFT (ms)",              false },
    { "p99_ttft_ms",            "P99 TTFT (ms)",              false },
    { "mean_tpot_ms",           "Mean TPOT (ms)",             false },
    { "p99_tpot_ms",            "P99 TPOT (ms)",              false },
    { "mean_itl_ms",            "Mean ITL (ms)",              false },
    { "p50_itl_ms",             "P50 ITL (ms)",               false },
    { "p99_itl_ms",             "P99 ITL (ms)",               false },
    { "mean_e2el_ms",           "Mean E2EL (ms)",             false },
    { "p99_e2el_ms",            "P99 E2EL (ms)",              false },
    { "good_requests",          "Good requests",              true },
    { "reconnects",             "Reconnects",                 false },
    { "total_cached_tokens",    "Cached prompt tokens",       true },
    { "cached_token_fraction",  "Cached / prompt tokens",     true },
    { "mean_cached_tokens",     "Mean cached tokens",         true },
    { "skipped_turns",          "Skipped turns",              false },
    { "duration",               "Duration (s)",               false },
    { "median_ttft_ms",         "Median TTFT (ms)",           false },
    { "p90_ttft_ms",            "P90 TTFT (ms)",              false },
    { "median_tpot_ms",         "Median TPOT (ms)",           false },
    { "p50_tpot_ms",            "P50 TPOT (ms)",              false },
    { "p90_tpot_ms",            "P90 TPOT (ms)",              false },
    { "median_itl_ms",          "Median ITL (ms)",            false },
    { "p90_itl_ms",             "P90 ITL (ms)",               false },
    { "median_e2el_ms",         "Median E2EL (ms)",           false },
    { "p50_e2el_ms",            "P50 E2EL (ms)",              false },
    { "p90_e2el_ms",            "P90 E2EL (ms)",              false },
};

pd_status_t pb_load_baseline(pb_run_t *run, const char *path)
{
    FILE *f = fopen(path, "r");
    char *text;
    long n;

    if (f == NULL) {
        fprintf(stderr, "%s: --baseline: cannot open %s: %s\n", PB_PROG, path,
                strerror(errno));
        return PD_ERR_IO;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || n > (256L << 20) ||
        fseek(f, 0, SEEK_SET) != 0 || (text = malloc((size_t)n + 1)) == NULL) {
        fclose(f);
        fprintf(stderr, "%s: --baseline: cannot read %s\n", PB_PROG, path);
        return PD_ERR_IO;
    }
    if (fread(text, 1, (size_t)n, f) != (size_t)n) {
        free(text);
        fclose(f);
        fprintf(stderr, "%s: --baseline: cannot read %s\n", PB_PROG, path);
        return PD_ERR_IO;
    }
    fclose(f);
    text[n] = '\0';
    run->baseline = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(run->baseline, "results"))) {
        fprintf(stderr, "%s: --baseline: %s is not a pd-bench result (no \"results\")\n",
                PB_PROG, path);
        return PD_ERR_BAD_INPUT;
    }
    return PD_OK;
}

/* One figure of two result objects side by side (row in the table, entry
 * {a_key: a, b_key: b, ratio: b / a or null[, higher_is_better]}). */
static void compare_one(pb_run_t *run, cJSON *cmp, const char *key, double a,
                        double b, const char *a_key, const char *b_key)
{
    cJSON *row = cJSON_AddObjectToObject(cmp, key);
    const char *label = key, *base = strchr(key, '.');
    int better = -1;
    size_t i;

    /* Per-turn keys ("turn2.mean_ttft_ms") take their metric's direction. */
    base = base ? base + 1 : key;
    for (i = 0; i < sizeof(cmp_rows) / sizeof(cmp_rows[0]); i++)
        if (strcmp(cmp_rows[i].key, base) == 0) {
            better = cmp_rows[i].higher_better;
            if (base == key)
                label = cmp_rows[i].label;
        }
    if (row == NULL)
        return;
    cJSON_AddNumberToObject(row, a_key, a);
    cJSON_AddNumberToObject(row, b_key, b);
    if (a != 0)
        cJSON_AddNumberToObject(row, "ratio", b / a);
    else
        cJSON_AddNullToObject(row, "ratio");
    if (better >= 0)
        cJSON_AddBoolToObject(row, "higher_is_better", better);
    if (run->cfg.quiet)
        return;
    if (a != 0)
        printf("%-32s %12.2f %12.2f %7.3fx\n", label, a, b, b / a);
    else
        printf("%-32s %12.2f %12.2f %8s\n", label, a, b, "-");
}

/* Every number of results `a` that `b` has too (errors.KIND and
 * turnN.METRIC flattened), side by side with the ratio b / a. */
cJSON *pb_compare_results(pb_run_t *run, const cJSON *a, const cJSON *b,
                              const char *title, const char *col_a,
                              const char *col_b, const char *a_key,
                              const char *b_key)
{
    cJSON *cmp = cJSON_CreateObject();
    const cJSON *it, *sub, *bsub;
    char key[96];

    if (cmp == NULL)
        return NULL;
    if (!run->cfg.quiet) {
        printf("%s\n", title);
        printf("%-32s %12s %12s %8s\n", "", col_a, col_b, "ratio");
    }
    cJSON_ArrayForEach(it, a) {
        const cJSON *bv = cJSON_GetObjectItemCaseSensitive(b, it->string);

        if (cJSON_IsNumber(it) && cJSON_IsNumber(bv)) {
            compare_one(run, cmp, it->string, it->valuedouble, bv->valuedouble,
                        a_key, b_key);
        } else if (cJSON_IsObject(it) && cJSON_IsObject(bv)) {
            cJSON_ArrayForEach(sub, it) {
                bsub = cJSON_GetObjectItemCaseSensitive(bv, sub->string);
                if (!cJSON_IsNumber(sub) || !cJSON_IsNumber(bsub))
                    continue;
                snprintf(key, sizeof(key), "%s.%s", it->string, sub->string);
                compare_one(run, cmp, key, sub->valuedouble, bsub->valuedouble,
                            a_key, b_key);
            }
        } else if (cJSON_IsArray(it) && cJSON_IsArray(bv) &&
                   strcmp(it->string, "per_turn") == 0) {
            cJSON_ArrayForEach(sub, it) {
                const cJSON *turn = cJSON_GetObjectItem(sub, "turn"), *bt, *f;

                bsub = NULL;
                cJSON_ArrayForEach(bt, bv)
                    if (cJSON_IsNumber(turn) &&
                        cJSON_IsNumber(cJSON_GetObjectItem(bt, "turn")) &&
                        cJSON_GetObjectItem(bt, "turn")->valuedouble == turn->valuedouble)
                        bsub = bt;
                if (bsub == NULL)
                    continue;
                cJSON_ArrayForEach(f, sub) {
                    const cJSON *bf = cJSON_GetObjectItemCaseSensitive(bsub, f->string);
                    if (strcmp(f->string, "turn") == 0 || !cJSON_IsNumber(f) ||
                        !cJSON_IsNumber(bf))
                        continue;
                    snprintf(key, sizeof(key), "turn%.0f.%s", turn->valuedouble,
                             f->string);
                    compare_one(run, cmp, key, f->valuedouble, bf->valuedouble,
                                a_key, b_key);
                }
            }
        }
    }
    if (!run->cfg.quiet) {
        printf("%s\n", "==================================================");
        fflush(stdout);
    }
    return cmp;
}
