/* pb_main.c - pd-bench: a serving load generator for OpenAI-compatible
 * streaming servers (what `vllm bench serve` measures, in C on libevent).
 * This file: the flags, setup, and main (the passes, --out). */
#include "pb_int.h"
#include "pd_config.h"

#include <cjson/cJSON.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* ---- configuration ----------------------------------------------------- */

static const char *const endpoint_names[] = { "completions", "chat", NULL };
const char *const pb_workload_names[] = {
    "synthetic", "multi-turn", "shared-prefix", "trace", NULL,
};

static const pd_cfg_field_t pb_fields[] = {
    PD_CFG_ROW(pb_config_t, url, "url", STRING, "http://127.0.0.1:8000",
               "server base URL (http only); /v1/... is appended", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, endpoint, "endpoint", ENUM, "completions",
               "API: completions (/v1/completions) or chat (/v1/chat/completions)",
               0, 0, endpoint_names),
    PD_CFG_ROW(pb_config_t, model, "model", STRING, NULL,
               "model name (default: first id from GET /v1/models)", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, api_key, "api-key", STRING, NULL,
               "sent as Authorization: Bearer KEY", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, rate, "rate", DOUBLE, "0",
               "Poisson arrivals per second (0 = fixed-concurrency mode)", 0, 100000, NULL),
    PD_CFG_ROW(pb_config_t, concurrency, "concurrency", UINT, "0",
               "requests in flight (concurrency mode, default 1) or cap (rate mode, default 1024)",
               0, PB_MAX_CONCURRENCY, NULL),
    PD_CFG_ROW(pb_config_t, input_len, "input-len", STRING, "fixed:128",
               "synthetic prompt words: N | fixed:N | uniform:A:B", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, output_len, "output-len", STRING, "fixed:128",
               "max_tokens: N | fixed:N | uniform:A:B (prompt files may override)", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, prompts, "prompts", STRING, NULL,
               "JSONL file, one {\"prompt\": \"...\", \"max_tokens\": N} per line (cycled)", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, warmup, "warmup", UINT, "0",
               "requests run first and not counted", 0, 10000, NULL),
    PD_CFG_ROW(pb_config_t, duration_ns, "duration", DURATION, "0",
               "stop issuing after this long (0 = no limit)", 0, 86400e9, NULL),
    PD_CFG_ROW(pb_config_t, num_requests, "num-requests", UINT, "0",
               "requests to count (0 = 100 unless --duration is given)", 0, PB_MAX_REQUESTS, NULL),
    PD_CFG_ROW(pb_config_t, ignore_eos, "ignore-eos", BOOL, "false",
               "ask the server to ignore EOS so output length is exact", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, seed, "seed", UINT, "0",
               "seed for prompts, lengths and arrivals", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, slo, "slo", STRING, NULL,
               "goodput SLOs: ttft=200ms,tpot=50ms,e2el=2s (any subset; bare number = ms)", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, out, "out", STRING, NULL,
               "write the JSON result here", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, request_timeout_ns, "request-timeout", DURATION, "300s",
               "per-request deadline (counted as a timeout error)", 1e6, 3600e9, NULL),
    PD_CFG_ROW(pb_config_t, temperature, "temperature", DOUBLE, "0",
               "sampling temperature sent", 0, 100, NULL),
    PD_CFG_ROW(pb_config_t, quiet, "quiet", BOOL, "false",
               "do not print the result table", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, no_per_request, "no-per-request", BOOL, "false",
               "omit per-request records from the JSON", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, keep_alive, "keep-alive", BOOL, "true",
               "reuse each slot's connection between requests", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, prompt_ids, "prompt-ids", STRING, NULL,
               "A:B: synthetic prompts as --input-len token ids drawn from [A, B] "
               "(completions only; exact input length)", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, baseline, "baseline", STRING, NULL,
               "earlier --out JSON: print figures side by side with ratios", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, workload, "workload", ENUM, "synthetic",
               "synthetic | multi-turn (--conversations x --turns, chat) | "
               "shared-prefix (--prefix-groups x --prefix-prompts) | trace (--trace)",
               0, 0, pb_workload_names),
    PD_CFG_ROW(pb_config_t, conversations, "conversations", UINT, "4",
               "multi-turn: conversations (each turn's prompt: the whole conversation "
               "so far, with the server's answers, + --input-len new words)",
               1, 100000, NULL),
    PD_CFG_ROW(pb_config_t, turns, "turns", UINT, "3",
               "multi-turn: turns per conversation", 1, 1000, NULL),
    PD_CFG_ROW(pb_config_t, system_len, "system-len", UINT, "0",
               "multi-turn: tokens of a system prompt every conversation starts with "
               "(the same for all; 0: none)", 0, PB_PROMPT_TOKENS_MAX / 2, NULL),
    PD_CFG_ROW(pb_config_t, prefix_len, "prefix-len", UINT, "256",
               "shared-prefix: tokens of each group's shared system prompt",
               1, PB_PROMPT_TOKENS_MAX / 2, NULL),
    PD_CFG_ROW(pb_config_t, prefix_groups, "prefix-groups", UINT, "1",
               "shared-prefix: groups (distinct shared prefixes)", 1, 10000, NULL),
    PD_CFG_ROW(pb_config_t, prefix_prompts, "prefix-prompts", UINT, "8",
               "shared-prefix: prompts per group (each: prefix + --input-len tokens)",
               1, 100000, NULL),
    PD_CFG_ROW(pb_config_t, trace, "trace", STRING, NULL,
               "trace: JSONL, one {\"timestamp\": ms, \"input_length\": N, "
               "\"output_length\": M, \"hash_ids\": [...]} per line (Mooncake)",
               0, 0, NULL),
    PD_CFG_ROW(pb_config_t, block_size, "block-size", UINT, "512",
               "trace: tokens per hash id block (512 in Mooncake's trace)",
               1, PB_BLOCK_SIZE_MAX, NULL),
    PD_CFG_ROW(pb_config_t, trace_speed, "trace-speed", DOUBLE, "1",
               "trace: replay speed (2 = arrivals twice as fast)", 0.001, 1000, NULL),
    PD_CFG_ROW(pb_config_t, compare, "compare", STRING, NULL,
               "second server URL: run the same workload (same seed, same arrivals) "
               "against --url, then this; print every figure with the ratio", 0, 0, NULL),
    PD_CFG_ROW(pb_config_t, compare_model, "compare-model", STRING, NULL,
               "model name at --compare (default: --model, else GET /v1/models)",
               0, 0, NULL),
    PD_CFG_END,
};

const pd_cfg_schema_t pb_schema = {
    .prog = PB_PROG,
    .summary = "load generator for OpenAI-compatible streaming servers "
               "(TTFT, TPOT, ITL, E2E, throughput, goodput)",
    .env_prefix = "PD_BENCH_",
    .fields = pb_fields,
};

/* ---- main -------------------------------------------------------------- */

static void run_free(pb_run_t *run)
{
    size_t i;

    if (run->slots != NULL) {
        for (i = 0; i < run->n_slots; i++) {
            pb_slot_t *s = &run->slots[i];
            if (s->bev != NULL)
                bufferevent_free(s->bev);
            if (s->timer != NULL)
                event_free(s->timer);
            pd_sse_fini(&s->sse);
            free(s->rec.itl_ns);
            free(s->req);
            free(s->user_msg);
            free(s->answer);
        }
        free(run->slots);
    }
    for (i = 0; i < run->n_recs; i++)
        free(run->recs[i].itl_ns);
    free(run->recs);
    for (i = 0; i < run->n_prompts; i++)
        free(run->prompts[i].prompt);
    free(run->prompts);
    if (run->pump_ev)
        event_free(run->pump_ev);
    if (run->arrival_ev)
        event_free(run->arrival_ev);
    if (run->deadline_ev)
        event_free(run->deadline_ev);
    if (run->sigint_ev)
        event_free(run->sigint_ev);
    cJSON_Delete(run->baseline);
    pb_trace_free(&run->trace);
    for (i = 0; i < run->n_convs; i++)
        cJSON_Delete(run->convs[i].msgs);
    free(run->convs);
    free(run->ready);
    free(run->model_fetched);
    if (run->base)
        event_base_free(run->base);
    pd_config_free(&pb_schema, &run->cfg);
}

static int usage_error(const char *flag, const char *what, const char *value)
{
    fprintf(stderr, "%s: %s: %s, got \"%s\"\n", PB_PROG, flag, what,
            value ? value : "");
    return PD_CONFIG_EXIT_USAGE;
}

static int setup(pb_run_t *run, int argc, char **argv)
{
    pd_cfg_result_t res;
    struct rlimit rl;

    pd_config_load_or_exit(&pb_schema, &run->cfg, argc, argv, &res);
    pd_config_result_free(&res);
    run->workload = (pb_workload_t)run->cfg.workload;
    if (run->cfg.trace != NULL && run->workload == PB_WL_SYNTHETIC)
        run->workload = PB_WL_TRACE;
    if (run->workload == PB_WL_MULTI_TURN)
        run->cfg.endpoint = PB_EP_CHAT;      /* roles: user / assistant */
    run->endpoint = (pb_endpoint_t)run->cfg.endpoint;
    if (pb_dist_parse(run->cfg.input_len, &run->in_dist) != PD_OK)
        return usage_error("--input-len", "expected N, fixed:N or uniform:A:B "
                           "(1..1000000)", run->cfg.input_len);
    if (pb_dist_parse(run->cfg.output_len, &run->out_dist) != PD_OK)
        return usage_error("--output-len", "expected N, fixed:N or uniform:A:B "
                           "(1..1000000)", run->cfg.output_len);
    if (run->cfg.prompt_ids != NULL) {
        unsigned lo, hi;
        int used = 0;

        if (sscanf(run->cfg.prompt_ids, "%u:%u%n", &lo, &hi, &used) != 2 ||
            run->cfg.prompt_ids[used] != '\0' || lo > hi || hi > 100000000u ||
            run->cfg.prompt_ids[0] == '-')
            return usage_error("--prompt-ids", "expected A:B with 0 <= A <= B",
                               run->cfg.prompt_ids);
        if (run->cfg.endpoint == PB_EP_CHAT || run->cfg.prompts != NULL)
            return usage_error("--prompt-ids", "needs --endpoint completions and "
                               "no --prompts", run->cfg.prompt_ids);
        run->use_ids = true;
        run->id_lo = lo;
        run->id_hi = hi;
    }
    if (pb_slo_parse(run->cfg.slo, &run->slo) != PD_OK)
        return usage_error("--slo", "expected ttft=DUR,tpot=DUR,e2el=DUR (any "
                           "subset)", run->cfg.slo);
    if (run->workload != PB_WL_SYNTHETIC && run->cfg.prompts != NULL)
        return usage_error("--prompts", "only with --workload synthetic",
                           run->cfg.prompts);
    if (run->workload == PB_WL_MULTI_TURN) {
        if (run->cfg.rate > 0 || run->use_ids || run->cfg.num_requests > 0)
            return usage_error("--workload", "multi-turn runs in concurrency mode "
                               "with text prompts (--conversations x --turns "
                               "requests; no --rate, --prompt-ids, --num-requests)",
                               pb_workload_names[run->workload]);
        if (run->cfg.conversations * run->cfg.turns > PB_MAX_REQUESTS)
            return usage_error("--conversations", "conversations x turns must be "
                               "at most 1000000", "");
    }
    if (run->workload == PB_WL_TRACE) {
        char why[512];

        if (run->cfg.trace == NULL || run->cfg.rate > 0)
            return usage_error("--workload", "trace needs --trace FILE (arrivals "
                               "come from it; no --rate)", pb_workload_names[run->workload]);
        if (pb_trace_load(run->cfg.trace, (uint32_t)run->cfg.block_size,
                          run->cfg.trace_speed, &run->trace, why,
                          sizeof(why)) != PD_OK) {
            fprintf(stderr, "%s: --trace: %s\n", PB_PROG, why);
            return PD_CONFIG_EXIT_USAGE;
        }
    } else if (run->cfg.trace != NULL) {
        return usage_error("--trace", "only with --workload trace", run->cfg.trace);
    }
    run->rate_mode = run->cfg.rate > 0 || run->workload == PB_WL_TRACE;
    run->n_slots = (uint32_t)run->cfg.concurrency;
    if (run->n_slots == 0)
        run->n_slots = run->rate_mode ? PB_RATE_DEFAULT_CAP : 1;
    run->num_requests = run->cfg.num_requests;
    if (run->workload == PB_WL_MULTI_TURN)
        run->num_requests = run->cfg.conversations * run->cfg.turns;
    else if (run->workload == PB_WL_TRACE &&
             (run->num_requests == 0 || run->num_requests > run->trace.n))
        run->num_requests = run->trace.n;
    else if (run->workload == PB_WL_SHARED_PREFIX && run->num_requests == 0 &&
             run->cfg.duration_ns == 0)
        run->num_requests = run->cfg.prefix_groups * run->cfg.prefix_prompts;
    if (run->num_requests == 0 && run->cfg.duration_ns == 0)
        run->num_requests = 100;
    if (run->num_requests > PB_MAX_REQUESTS)
        return usage_error("--prefix-groups", "groups x prompts must be at most "
                           "1000000", "");
    if (run->cfg.prompts != NULL && pb_load_prompts(run, run->cfg.prompts) != PD_OK)
        return PD_CONFIG_EXIT_USAGE;
    if (run->cfg.baseline != NULL && pb_load_baseline(run, run->cfg.baseline) != PD_OK)
        return PD_CONFIG_EXIT_USAGE;
    if (run->cfg.compare != NULL && pb_parse_url(run, run->cfg.compare) != PD_OK)
        return PD_CONFIG_EXIT_USAGE;
    run->target_url = run->cfg.url;
    if (pb_parse_url(run, run->cfg.url) != PD_OK)
        return PD_CONFIG_EXIT_USAGE;
    if (run->workload == PB_WL_MULTI_TURN) {
        run->n_convs = (uint32_t)run->cfg.conversations;
        run->convs = calloc(run->n_convs, sizeof(*run->convs));
        run->ready = calloc(run->n_convs, sizeof(*run->ready));
        if (run->convs == NULL || run->ready == NULL)
            return 1;
    }

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < run->n_slots + 64) {
        rl.rlim_cur = rl.rlim_max < run->n_slots + 64 ? rl.rlim_max
                                                       : run->n_slots + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    return pb_loop_setup(run);
}

/* One pass of the workload against url: run, print, return the JSON. */
static cJSON *run_pass(pb_run_t *run, const char *url, const char *model)
{
    pb_aggregate_t agg;
    cJSON *root;

    if (pb_pass_begin(run, url, model) != 0)
        return NULL;
    event_base_dispatch(run->base);
    if (pb_aggregate(run->recs, run->n_recs, &run->slo,
                     run->t_last_done > run->t0 ? run->t_last_done - run->t0 : 1,
                     &agg) != PD_OK)
        return NULL;
    root = pb_build_json(run, &agg);
    if (root == NULL)
        return NULL;
    if (!run->cfg.quiet)
        pb_print_table(run, &agg, cJSON_GetObjectItem(cJSON_GetObjectItem(root, "results"),
                                                   "per_turn"));
    return root;
}

int main(int argc, char **argv)
{
    pb_run_t *run = calloc(1, sizeof(*run));
    cJSON *root = NULL, *second = NULL;
    int rc;

    if (run == NULL)
        return 1;
    rc = setup(run, argc, argv);
    if (rc != 0)
        goto out;
    rc = 1;
    root = run_pass(run, run->cfg.url, run->cfg.model);
    if (root == NULL)
        goto out;
    if (run->cfg.compare != NULL && !run->stopping) {
        /* The same workload against the second server: same seed, same
         * prompts, same arrivals (answers, and so multi-turn histories,
         * are each server's own). */
        second = run_pass(run, run->cfg.compare, run->cfg.compare_model
                          ? run->cfg.compare_model : run->cfg.model);
        if (second == NULL)
            goto out;
        cJSON_AddItemToObject(root, "side_by_side", pb_compare_results(
            run, cJSON_GetObjectItem(root, "results"),
            cJSON_GetObjectItem(second, "results"),
            "======= Side by side (ratio = --compare / --url) =======",
            "--url", "--compare", "url", "compare"));
        cJSON_AddItemToObject(root, "compare", second);
        second = NULL;
    }
    if (run->baseline != NULL)
        cJSON_AddItemToObject(root, "comparison", pb_compare_results(
            run, cJSON_GetObjectItemCaseSensitive(run->baseline, "results"),
            cJSON_GetObjectItem(root, "results"),
            "============ Comparison with baseline ============",
            "baseline", "this run", "baseline", "current"));
    if (run->cfg.out != NULL) {
        char *text = cJSON_Print(root);
        FILE *f = text ? fopen(run->cfg.out, "w") : NULL;
        bool ok = f != NULL && fputs(text, f) >= 0 && fputc('\n', f) != EOF;

        if (f != NULL && fclose(f) != 0)
            ok = false;
        free(text);
        if (!ok) {
            fprintf(stderr, "%s: --out: cannot write %s\n", PB_PROG, run->cfg.out);
            goto out;
        }
    }
    rc = 0;
out:
    cJSON_Delete(root);
    cJSON_Delete(second);
    run_free(run);
    free(run);
    return rc;
}
