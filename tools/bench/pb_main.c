/* pb_main.c - pd-bench: a serving load generator for OpenAI-compatible
 * streaming servers (what `vllm bench serve` measures, in C on libevent).
 *
 * One event loop, one process. A fixed pool of request slots (the
 * concurrency cap) is allocated at boot; each slot owns at most one TCP
 * connection (kept alive between its requests, as aiohttp's pooled
 * session in `vllm bench serve`; --no-keep-alive opens one per request),
 * an HTTP/1.1 response parser and an SSE parser (pb_http.h). Finished slots are reaped from a deferred "pump"
 * event, never inside their own callbacks; the pump also issues new work:
 *   concurrency mode: keep N requests in flight;
 *   rate mode: Poisson arrivals (seeded), queued while all slots are busy.
 * Bounded by construction: caps on concurrency, requests, duration, request
 * timeout, and a hard run deadline after which in-flight requests count as
 * timeouts. Connects only to the --url given. */
#include "pb_http.h"
#include "pb_stats.h"
#include "pb_work.h"
#include "pd_config.h"
#include "pd_time.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define PB_PROG             "pd-bench"
#define PB_MAX_CONCURRENCY  4096
#define PB_MAX_REQUESTS     1000000
#define PB_MAX_ITL          65536     /* ITL samples kept per request */
#define PB_MAX_PROMPT_LINES 100000
#define PB_MAX_PROMPT_FILE  (64u << 20)
#define PB_RATE_DEFAULT_CAP 1024      /* slots in rate mode without --concurrency */
#define PB_MAX_ANSWER       (1u << 20) /* multi-turn: answer bytes kept per turn */
#define PB_MAX_CONV_BYTES   (16u << 20) /* multi-turn: history bytes per conversation */

/* ---- configuration ----------------------------------------------------- */

typedef enum { PB_EP_COMPLETIONS, PB_EP_CHAT } pb_endpoint_t;
static const char *const endpoint_names[] = { "completions", "chat", NULL };

typedef enum {
    PB_WL_SYNTHETIC, PB_WL_MULTI_TURN, PB_WL_SHARED_PREFIX, PB_WL_TRACE,
} pb_workload_t;
static const char *const workload_names[] = {
    "synthetic", "multi-turn", "shared-prefix", "trace", NULL,
};

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
               0, 0, workload_names),
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

static const pd_cfg_schema_t pb_schema = {
    .prog = PB_PROG,
    .summary = "load generator for OpenAI-compatible streaming servers "
               "(TTFT, TPOT, ITL, E2E, throughput, goodput)",
    .env_prefix = "PD_BENCH_",
    .fields = pb_fields,
};

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
    pb_http_resp_t http;
    pb_sse_t sse;
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

static void slot_finish(pb_slot_t *s, pb_err_kind_t err, const char *msg);
static void slot_connect(pb_slot_t *s);
static void slot_reconnect(pb_slot_t *s);

static void ready_push(pb_run_t *run, uint32_t c)
{
    run->ready[(run->ready_head + run->ready_n) % run->n_convs] = c;
    run->ready_n++;
}

static uint32_t ready_pop(pb_run_t *run)
{
    uint32_t c = run->ready[run->ready_head];

    run->ready_head = (run->ready_head + 1) % run->n_convs;
    run->ready_n--;
    return c;
}

static void pump_kick(pb_run_t *run)
{
    event_active(run->pump_ev, EV_TIMEOUT, 0);
}

/* ---- workload ---------------------------------------------------------- */


/* Synthetic prompt of n common words (about one token each for BPE
 * tokenizers; usage.prompt_tokens reports the server's count). */
static char *synth_prompt(pb_rng_t *rng, uint32_t n)
{
    size_t nw = pb_n_words;
    size_t cap = (size_t)n * 8 + 1, len = 0;
    char *p = malloc(cap);
    uint32_t i;

    if (p == NULL)
        return NULL;
    for (i = 0; i < n; i++) {
        const char *w = pb_words[pb_rng_next(rng) % nw];
        size_t wl = strlen(w);
        if (len + wl + 2 > cap)
            break;
        if (i > 0)
            p[len++] = ' ';
        memcpy(p + len, w, wl);
        len += wl;
    }
    p[len] = '\0';
    return p;
}

static pd_status_t load_prompts(pb_run_t *run, const char *path)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t lcap = 0, total = 0;
    ssize_t n;
    unsigned lineno = 0;

    if (f == NULL) {
        fprintf(stderr, "%s: --prompts: cannot open %s: %s\n", PB_PROG, path,
                strerror(errno));
        return PD_ERR_IO;
    }
    while ((n = getline(&line, &lcap, f)) >= 0) {
        cJSON *j, *p, *mt;
        pb_prompt_t *np;

        lineno++;
        total += (size_t)n;
        if (total > PB_MAX_PROMPT_FILE || run->n_prompts >= PB_MAX_PROMPT_LINES) {
            fprintf(stderr, "%s: --prompts: %s exceeds %u lines / %u bytes\n",
                    PB_PROG, path, PB_MAX_PROMPT_LINES, PB_MAX_PROMPT_FILE);
            goto err;
        }
        if (strspn(line, " \t\r\n") == (size_t)n)
            continue;
        j = cJSON_Parse(line);
        p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        mt = cJSON_GetObjectItemCaseSensitive(j, "max_tokens");
        if (!cJSON_IsString(p) ||
            (mt != NULL && (!cJSON_IsNumber(mt) || mt->valuedouble < 1 ||
                            mt->valuedouble > PB_LEN_MAX))) {
            fprintf(stderr, "%s: --prompts: %s:%u: expected {\"prompt\": string, "
                    "\"max_tokens\": 1..%u}\n", PB_PROG, path, lineno, PB_LEN_MAX);
            cJSON_Delete(j);
            goto err;
        }
        np = realloc(run->prompts, (run->n_prompts + 1) * sizeof(*np));
        if (np == NULL) {
            cJSON_Delete(j);
            goto err;
        }
        run->prompts = np;
        np[run->n_prompts].prompt = strdup(p->valuestring);
        np[run->n_prompts].max_tokens = mt ? (uint32_t)mt->valuedouble : 0;
        cJSON_Delete(j);
        if (np[run->n_prompts].prompt == NULL)
            goto err;
        run->n_prompts++;
    }
    free(line);
    fclose(f);
    if (run->n_prompts == 0) {
        fprintf(stderr, "%s: --prompts: %s has no prompts\n", PB_PROG, path);
        return PD_ERR_BAD_INPUT;
    }
    return PD_OK;
err:
    free(line);
    fclose(f);
    return PD_ERR_BAD_INPUT;
}

/* Add a built prompt to a JSON object as `key`: a string (words) or an
 * array of token ids. */
static bool add_prompt_buf(cJSON *o, const char *key, const pb_prompt_buf_t *b)
{
    uint32_t k;
    cJSON *ids;

    if (!b->ids)
        return cJSON_AddStringToObject(o, key, b->text ? b->text : "") != NULL;
    ids = cJSON_AddArrayToObject(o, key);
    if (ids == NULL)
        return false;
    for (k = 0; k < b->n_tokens; k++)
        if (!cJSON_AddItemToArray(ids, cJSON_CreateNumber((double)b->id[k])))
            return false;
    return true;
}

static bool add_message(cJSON *msgs, const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();

    if (m == NULL || !cJSON_AddItemToArray(msgs, m))
        return false;
    return cJSON_AddStringToObject(m, "role", role) != NULL &&
           cJSON_AddStringToObject(m, "content", content) != NULL;
}

static void add_max_tokens(pb_run_t *run, cJSON *body, uint32_t max_tokens)
{
    cJSON_AddNumberToObject(body, run->endpoint == PB_EP_CHAT
                            ? "max_completion_tokens" : "max_tokens", max_tokens);
}

/* The plain synthetic workload (and every workload's warm-up). */
static bool body_synthetic(pb_run_t *run, pb_slot_t *s, uint64_t seq, cJSON *body)
{
    cJSON *msgs;
    char *prompt;
    uint32_t in_len = 0, max_tokens;

    if (run->n_prompts > 0) {
        const pb_prompt_t *p = &run->prompts[seq % run->n_prompts];
        prompt = strdup(p->prompt);
        max_tokens = p->max_tokens ? p->max_tokens
                                   : pb_dist_sample(&run->out_dist, &run->rng_prompt);
    } else if (run->use_ids) {
        in_len = pb_dist_sample(&run->in_dist, &run->rng_prompt);
        max_tokens = pb_dist_sample(&run->out_dist, &run->rng_prompt);
        prompt = NULL;
    } else {
        in_len = pb_dist_sample(&run->in_dist, &run->rng_prompt);
        max_tokens = pb_dist_sample(&run->out_dist, &run->rng_prompt);
        prompt = synth_prompt(&run->rng_prompt, in_len);
    }
    if (prompt == NULL && !(run->use_ids && run->n_prompts == 0))
        return false;
    s->rec.input_tokens = in_len;
    if (run->endpoint == PB_EP_CHAT) {
        msgs = cJSON_AddArrayToObject(body, "messages");
        add_message(msgs, "user", prompt);
    } else if (prompt == NULL) {
        /* Token ids: exact input length whatever the tokenizer. */
        cJSON *ids = cJSON_AddArrayToObject(body, "prompt");
        uint64_t span = (uint64_t)run->id_hi - run->id_lo + 1;
        uint32_t k;

        for (k = 0; k < in_len; k++)
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(
                (double)(run->id_lo + pb_rng_next(&run->rng_prompt) % span)));
    } else {
        cJSON_AddStringToObject(body, "prompt", prompt);
    }
    add_max_tokens(run, body, max_tokens);
    free(prompt);
    return true;
}

/* Shared prefix: request seq belongs to group seq % groups; its prompt is
 * the group's prefix (--prefix-len tokens, the same for every request and
 * every pass) + --input-len tokens of its own. Chat: the prefix is the
 * system message. */
static bool body_shared_prefix(pb_run_t *run, pb_slot_t *s, uint64_t seq,
                               cJSON *body)
{
    pb_prompt_buf_t pre, own;
    pb_rng_t grng;
    uint32_t in_len = pb_dist_sample(&run->in_dist, &run->rng_prompt);
    uint32_t max_tokens = pb_dist_sample(&run->out_dist, &run->rng_prompt);
    bool ok = false;

    pb_prompt_buf_init(&pre, run->use_ids, run->id_lo, run->id_hi);
    pb_prompt_buf_init(&own, run->use_ids, run->id_lo, run->id_hi);
    pb_block_rng(&grng, run->cfg.seed ^ 0x70726566ULL,
                 seq % run->cfg.prefix_groups);
    if (pb_prompt_add(&pre, &grng, (uint32_t)run->cfg.prefix_len) != PD_OK)
        goto out;
    s->rec.input_tokens = (uint32_t)run->cfg.prefix_len + in_len;
    if (run->endpoint == PB_EP_CHAT) {
        cJSON *msgs = cJSON_AddArrayToObject(body, "messages");

        if (pb_prompt_add(&own, &run->rng_prompt, in_len) != PD_OK ||
            !add_message(msgs, "system", pre.text) ||
            !add_message(msgs, "user", own.text))
            goto out;
    } else {
        /* One buffer: the prefix, then this request's tokens. */
        if (pb_prompt_add(&pre, &run->rng_prompt, in_len) != PD_OK ||
            !add_prompt_buf(body, "prompt", &pre))
            goto out;
    }
    add_max_tokens(run, body, max_tokens);
    ok = true;
out:
    pb_prompt_buf_fini(&pre);
    pb_prompt_buf_fini(&own);
    return ok;
}

/* Trace replay: entry seq's prompt from its hash ids, its output length. */
static bool body_trace(pb_run_t *run, pb_slot_t *s, uint64_t seq, cJSON *body)
{
    const pb_trace_entry_t *e = &run->trace.e[seq % run->trace.n];
    pb_prompt_buf_t b;
    bool ok = false;

    pb_prompt_buf_init(&b, run->use_ids, run->id_lo, run->id_hi);
    if (pb_prompt_from_trace(&b, e, (uint32_t)run->cfg.block_size, run->cfg.seed,
                             seq) != PD_OK)
        goto out;
    s->rec.input_tokens = e->input_len;
    if (run->endpoint == PB_EP_CHAT) {
        cJSON *msgs = cJSON_AddArrayToObject(body, "messages");
        if (!add_message(msgs, "user", b.text))
            goto out;
    } else if (!add_prompt_buf(body, "prompt", &b)) {
        goto out;
    }
    add_max_tokens(run, body, e->output_len);
    ok = true;
out:
    pb_prompt_buf_fini(&b);
    return ok;
}

/* Multi-turn: the conversation so far (the user messages sent and the
 * server's actual answers) + a new user message. The new message of
 * (conversation, turn) depends only on the seed, not on timing. */
static bool body_turn(pb_run_t *run, pb_slot_t *s, cJSON *body)
{
    pb_conv_t *c = &run->convs[s->conv];
    pb_prompt_buf_t b;
    pb_rng_t rng;
    uint32_t in_len, max_tokens;
    cJSON *msgs;
    bool ok = false;

    pb_block_rng(&rng, run->cfg.seed ^ 0x7475726eULL,
                 (uint64_t)s->conv * 1000003ULL + c->turn);
    in_len = pb_dist_sample(&run->in_dist, &rng);
    max_tokens = pb_dist_sample(&run->out_dist, &rng);
    pb_prompt_buf_init(&b, false, 0, 0);
    if (pb_prompt_add(&b, &rng, in_len) != PD_OK)
        goto out;
    s->rec.turn = c->turn;
    s->rec.conv = s->conv;
    s->rec.input_tokens = in_len;
    free(s->user_msg);
    s->user_msg = strdup(b.text);
    msgs = cJSON_Duplicate(c->msgs, 1);
    if (s->user_msg == NULL || msgs == NULL ||
        !cJSON_AddItemToObject(body, "messages", msgs) ||
        !add_message(msgs, "user", b.text))
        goto out;
    add_max_tokens(run, body, max_tokens);
    ok = true;
out:
    pb_prompt_buf_fini(&b);
    return ok;
}

/* Build the HTTP request for one slot. Returns malloc'd bytes. */
static char *build_request(pb_run_t *run, pb_slot_t *s, uint64_t seq,
                           size_t *len_p)
{
    cJSON *body = cJSON_CreateObject(), *so;
    char *json, *req = NULL;
    bool ok;
    int n;

    if (body == NULL)
        return NULL;
    cJSON_AddStringToObject(body, "model", run->model);
    if (s->warmup || run->workload == PB_WL_SYNTHETIC)
        ok = body_synthetic(run, s, seq, body);
    else if (run->workload == PB_WL_SHARED_PREFIX)
        ok = body_shared_prefix(run, s, seq, body);
    else if (run->workload == PB_WL_TRACE)
        ok = body_trace(run, s, seq, body);
    else
        ok = body_turn(run, s, body);
    if (!ok)
        goto out;
    cJSON_AddNumberToObject(body, "temperature", run->cfg.temperature);
    cJSON_AddBoolToObject(body, "stream", 1);
    so = cJSON_AddObjectToObject(body, "stream_options");
    cJSON_AddBoolToObject(so, "include_usage", 1);
    if (run->cfg.ignore_eos)
        cJSON_AddBoolToObject(body, "ignore_eos", 1);
    json = cJSON_PrintUnformatted(body);
    if (json == NULL)
        goto out;
    {
        size_t jl = strlen(json);
        size_t cap = jl + 1024 + (run->cfg.api_key ? strlen(run->cfg.api_key) : 0);
        req = malloc(cap);
        if (req != NULL) {
            n = snprintf(req, cap,
                         "POST %s HTTP/1.1\r\n"
                         "Host: %s\r\n"
                         "User-Agent: pd-bench/%s\r\n"
                         "Content-Type: application/json\r\n"
                         "Accept: text/event-stream\r\n"
                         "X-Request-Id: pd-bench-%llu-%s%llu\r\n"
                         "%s%s%s"
                         "Connection: %s\r\n"
                         "Content-Length: %zu\r\n\r\n",
                         run->path, run->host_hdr, PD_VERSION,
                         (unsigned long long)run->cfg.seed,
                         s->warmup ? "w" : "", (unsigned long long)seq,
                         run->cfg.api_key ? "Authorization: Bearer " : "",
                         run->cfg.api_key ? run->cfg.api_key : "",
                         run->cfg.api_key ? "\r\n" : "",
                         run->cfg.keep_alive ? "keep-alive" : "close", jl);
            if (n < 0 || (size_t)n + jl >= cap) {
                free(req);
                req = NULL;
            } else {
                memcpy(req + n, json, jl);
                *len_p = (size_t)n + jl;
            }
        }
    }
    free(json);
out:
    cJSON_Delete(body);
    return req;
}

/* ---- one request ------------------------------------------------------- */

static void itl_push(pb_slot_t *s, uint64_t gap)
{
    uint64_t *n;

    if (s->rec.n_itl >= PB_MAX_ITL)
        return;
    if (s->rec.n_itl == s->itl_cap) {
        uint32_t cap = s->itl_cap ? s->itl_cap * 2 : 64;
        n = realloc(s->rec.itl_ns, cap * sizeof(*n));
        if (n == NULL)
            return;
        s->rec.itl_ns = n;
        s->itl_cap = cap;
    }
    s->rec.itl_ns[s->rec.n_itl++] = gap;
}

static void copy_msg(char *dst, size_t cap, const char *src)
{
    size_t i, j = 0;

    for (i = 0; src[i] != '\0' && j + 1 < cap; i++)
        dst[j++] = (src[i] >= 0x20 && src[i] < 0x7f) ? src[i] : ' ';
    dst[j] = '\0';
}

/* Multi-turn: keep the answer for the next turn's history (capped; the
 * rest of a longer answer is dropped). */
static void answer_append(pb_slot_t *s, const char *text)
{
    size_t tl = strlen(text);

    if (tl > PB_MAX_ANSWER - s->ans_len)
        tl = PB_MAX_ANSWER - s->ans_len;
    if (tl == 0)
        return;
    if (s->ans_len + tl + 1 > s->ans_cap) {
        size_t cap = s->ans_cap ? s->ans_cap : 1024;
        char *n;

        while (cap < s->ans_len + tl + 1)
            cap *= 2;
        n = realloc(s->answer, cap);
        if (n == NULL)
            return;
        s->answer = n;
        s->ans_cap = cap;
    }
    memcpy(s->answer + s->ans_len, text, tl);
    s->ans_len += tl;
    s->answer[s->ans_len] = '\0';
}

static void on_sse_event(void *arg, const char *data, size_t len)
{
    pb_slot_t *s = arg;
    cJSON *j, *e, *u, *ch, *c0, *t;

    if (s->state != SLOT_ACTIVE)
        return;
    if (strcmp(data, "[DONE]") == 0) {
        s->got_done = true;
        s->t_done = s->t_now;
        return;
    }
    j = cJSON_ParseWithLength(data, len);
    if (j == NULL) {
        slot_finish(s, PB_ERR_PROTOCOL, "SSE data is not JSON");
        return;
    }
    e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (e != NULL && !cJSON_IsNull(e)) {
        cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
        s->got_error_frame = true;
        slot_finish(s, PB_ERR_STREAM_ERROR,
                    cJSON_IsString(m) ? m->valuestring : "error frame");
        cJSON_Delete(j);
        return;
    }
    u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    if (cJSON_IsObject(u)) {
        cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
        cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
        if (cJSON_IsNumber(ct) && ct->valuedouble >= 0 && ct->valuedouble <= UINT32_MAX) {
            s->rec.output_tokens = (uint32_t)ct->valuedouble;
            s->rec.usage_seen = true;
        }
        cJSON *ptd = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details");
        cJSON *cached = cJSON_GetObjectItemCaseSensitive(ptd, "cached_tokens");
        if (cJSON_IsNumber(pt) && pt->valuedouble >= 0 && pt->valuedouble <= UINT32_MAX)
            s->rec.input_tokens = (uint32_t)pt->valuedouble;
        /* Shown when the server reports it (vLLM, SGLang, llama-server). */
        if (cJSON_IsNumber(cached) && cached->valuedouble >= 0 &&
            cached->valuedouble <= UINT32_MAX) {
            s->rec.cached_tokens = (uint32_t)cached->valuedouble;
            s->rec.cached_seen = true;
        }
    }
    ch = cJSON_GetObjectItemCaseSensitive(j, "choices");
    c0 = cJSON_IsArray(ch) ? cJSON_GetArrayItem(ch, 0) : NULL;
    if (c0 != NULL) {
        if (s->run->endpoint == PB_EP_CHAT) {
            cJSON *d = cJSON_GetObjectItemCaseSensitive(c0, "delta");
            t = cJSON_GetObjectItemCaseSensitive(d, "content");
        } else {
            t = cJSON_GetObjectItemCaseSensitive(c0, "text");
        }
        if (cJSON_IsString(t) && t->valuestring[0] != '\0') {
            if (s->rec.content_chunks == 0)
                s->rec.ttft_ns = s->t_now - s->t_send;
            else
                itl_push(s, s->t_now - s->t_last);
            s->t_last = s->t_now;
            s->rec.content_chunks++;
            if (s->run->workload == PB_WL_MULTI_TURN && !s->warmup)
                answer_append(s, t->valuestring);
        }
    }
    cJSON_Delete(j);
}

static void on_body(void *arg, const char *data, size_t len)
{
    pb_slot_t *s = arg;
    pd_status_t status;

    if (s->state != SLOT_ACTIVE)
        return;
    if (s->http.status != 200) {
        size_t room = sizeof(s->errbody) - 1 - s->errbody_len;
        if (len > room)
            len = room;
        memcpy(s->errbody + s->errbody_len, data, len);
        s->errbody_len += len;
        s->errbody[s->errbody_len] = '\0';
        return;
    }
    status = pb_sse_feed(&s->sse, data, len, on_sse_event, s);
    if (status != PD_OK)
        slot_finish(s, PB_ERR_PROTOCOL, pd_status_str(status));
}

static pb_err_kind_t http_kind(int status)
{
    if (status >= 400 && status < 500)
        return PB_ERR_HTTP_4XX;
    if (status >= 500)
        return PB_ERR_HTTP_5XX;
    return PB_ERR_HTTP_OTHER;
}

/* The response ended (complete body or EOF after headers). */
static void slot_end_of_response(pb_slot_t *s)
{
    if (s->http.status != 200) {
        char msg[160];
        cJSON *j = cJSON_Parse(s->errbody);
        cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
        snprintf(msg, sizeof(msg), "HTTP %d%s%s", s->http.status,
                 cJSON_IsString(m) ? ": " : "",
                 cJSON_IsString(m) ? m->valuestring : "");
        cJSON_Delete(j);
        slot_finish(s, http_kind(s->http.status), msg);
    } else if (s->got_done) {
        slot_finish(s, PB_ERR_NONE, NULL);
    } else {
        slot_finish(s, PB_ERR_NO_DONE, "stream ended without [DONE]");
    }
}

static void slot_read_cb(struct bufferevent *bev, void *arg)
{
    pb_slot_t *s = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    char buf[16384];
    int n;

    if (s->state == SLOT_FREE) {
        /* Bytes on an idle kept-alive connection: not reusable. */
        s->bev_dead = true;
        bufferevent_disable(bev, EV_READ | EV_WRITE);
        return;
    }
    s->t_now = pd_now_ns();
    while (s->state == SLOT_ACTIVE &&
           (n = evbuffer_remove(in, buf, sizeof(buf))) > 0) {
        s->got_bytes = true;
        pd_status_t status = pb_http_resp_feed(&s->http, buf, (size_t)n,
                                               on_body, s, NULL);
        if (s->state != SLOT_ACTIVE)
            return;
        if (status != PD_OK) {
            slot_finish(s, PB_ERR_PROTOCOL, "malformed HTTP response");
            return;
        }
        /* [DONE] ends the measurement (t_done). Without keep-alive the rest
         * of the body is not needed; with it, the connection is reusable
         * only once the body has ended. */
        if (s->http.complete || (s->got_done && !s->run->cfg.keep_alive)) {
            slot_end_of_response(s);
            return;
        }
    }
}

static void slot_event_cb(struct bufferevent *bev, short what, void *arg)
{
    pb_slot_t *s = arg;

    if (s->state == SLOT_FREE) {
        /* The server closed an idle kept-alive connection. */
        s->bev_dead = true;
        bufferevent_disable(bev, EV_READ | EV_WRITE);
        return;
    }
    if (s->state != SLOT_ACTIVE)
        return;
    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        s->connected = true;
        setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one,
                   sizeof(one));
        return;
    }
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        char msg[160];
        int err = EVUTIL_SOCKET_ERROR();

        s->t_now = pd_now_ns();
        /* Drain anything still buffered before judging the end. */
        slot_read_cb(bev, s);
        if (s->state != SLOT_ACTIVE)
            return;
        if (s->reused && !s->got_bytes && !s->retried && s->req != NULL) {
            /* The server had closed the kept-alive connection (idle
             * timeout, keep-alive budget) before answering: nothing of
             * this request was processed. Send it once more on a fresh
             * connection, as wrk and aiohttp do; counted as a reconnect,
             * not an error. The request keeps its original send time. */
            slot_reconnect(s);
            return;
        }
        if (!s->connected) {
            snprintf(msg, sizeof(msg), "connect: %s", strerror(err));
            slot_finish(s, PB_ERR_CONNECT, msg);
        } else if (!s->http.headers_done) {
            slot_finish(s, PB_ERR_DISCONNECT, s->reused
                        ? "kept-alive connection closed before response headers"
                        : "connection closed before response headers");
        } else if (pb_http_resp_eof(&s->http) || s->http.status != 200 ||
                   s->got_done) {
            slot_end_of_response(s);
        } else {
            slot_finish(s, PB_ERR_NO_DONE, "connection closed mid-stream");
        }
    }
}

static void slot_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    pb_slot_t *s = arg;

    if (s->state != SLOT_ACTIVE)
        return;
    if (s->got_done && s->http.status == 200)
        slot_finish(s, PB_ERR_NONE, NULL);   /* only the body end was late */
    else
        slot_finish(s, PB_ERR_TIMEOUT, "request timeout");
}

/* Record the outcome once; the pump reaps the slot later. */
static void slot_finish(pb_slot_t *s, pb_err_kind_t err, const char *msg)
{
    uint64_t now = pd_now_ns();

    if (s->state != SLOT_ACTIVE)
        return;
    s->state = SLOT_FINISHED;
    s->rec.err = err;
    s->rec.success = err == PB_ERR_NONE;
    s->rec.http_status = s->http.headers_done ? s->http.status : 0;
    s->rec.e2el_ns = (s->t_done ? s->t_done : now) - s->t_send;
    if (!s->rec.usage_seen)
        s->rec.output_tokens = s->rec.content_chunks;
    if (msg != NULL)
        copy_msg(s->rec.err_msg, sizeof(s->rec.err_msg), msg);
    if (s->bev != NULL)
        bufferevent_disable(s->bev, EV_READ | EV_WRITE);
    evtimer_del(s->timer);
    if (!s->warmup && now > s->run->t_last_done)
        s->run->t_last_done = now;
    pump_kick(s->run);
}

static void slot_issue(pb_run_t *run, bool warmup)
{
    pb_slot_t *s = run->free_slots;
    char *req;
    size_t req_len = 0;
    uint64_t seq = warmup ? run->warm_issued : run->issued;
    struct timeval tv;

    run->free_slots = s->next;
    s->next = NULL;
    run->inflight++;
    if (run->inflight > run->max_inflight && !warmup)
        run->max_inflight = run->inflight;
    if (warmup)
        run->warm_issued++;
    else
        run->issued++;

    memset(&s->rec, 0, sizeof(s->rec));
    s->rec.id = (uint32_t)seq;
    s->state = SLOT_ACTIVE;
    s->warmup = warmup;
    s->connected = s->got_done = s->got_error_frame = s->reused = false;
    s->got_bytes = s->retried = false;
    s->ans_len = 0;
    if (run->workload == PB_WL_MULTI_TURN && !warmup)
        s->conv = ready_pop(run);
    s->t_done = 0;
    s->itl_cap = 0;
    s->errbody_len = 0;
    s->errbody[0] = '\0';
    pb_http_resp_init(&s->http);
    pb_sse_init(&s->sse);

    req = build_request(run, s, seq, &req_len);
    s->t_send = pd_now_ns();
    s->rec.start_ns = warmup ? 0 : s->t_send - run->t0;
    tv = pd_ns_to_timeval(run->cfg.request_timeout_ns);
    evtimer_add(s->timer, &tv);
    if (req == NULL) {
        slot_finish(s, PB_ERR_PROTOCOL, "out of memory building request");
        return;
    }
    s->req = req;
    s->req_len = req_len;
    if (s->bev != NULL && !s->bev_dead) {
        /* Kept-alive connection of this slot. */
        s->reused = s->connected = s->rec.conn_reused = true;
        bufferevent_enable(s->bev, EV_READ | EV_WRITE);
        bufferevent_write(s->bev, req, req_len);
        return;
    }
    if (s->bev != NULL) {
        if (!warmup)
            run->idle_closed++;
        bufferevent_free(s->bev);
        s->bev = NULL;
    }
    slot_connect(s);
}

/* Open a fresh connection for the slot and queue its request bytes. */
static void slot_connect(pb_slot_t *s)
{
    pb_run_t *run = s->run;

    s->bev_dead = false;
    s->bev = bufferevent_socket_new(run->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (s->bev == NULL) {
        slot_finish(s, PB_ERR_CONNECT, "cannot create socket");
        return;
    }
    bufferevent_setcb(s->bev, slot_read_cb, NULL, slot_event_cb, s);
    bufferevent_enable(s->bev, EV_READ | EV_WRITE);
    bufferevent_write(s->bev, s->req, s->req_len);
    if (bufferevent_socket_connect(s->bev, (struct sockaddr *)&run->addr,
                                   (int)run->addrlen) < 0) {
        char msg[160];
        snprintf(msg, sizeof(msg), "connect: %s", strerror(errno));
        slot_finish(s, PB_ERR_CONNECT, msg);
    }
}

static void slot_reconnect(pb_slot_t *s)
{
    s->retried = true;
    s->rec.reconnected = true;
    s->reused = s->connected = false;
    bufferevent_free(s->bev);
    s->bev = NULL;
    pb_http_resp_init(&s->http);
    slot_connect(s);
}

/* Multi-turn: a turn ended. On success the user message and the answer
 * join the history and the conversation is ready for its next turn; a
 * failed turn ends its conversation (its later turns are skipped). */
static void conv_turn_done(pb_run_t *run, pb_slot_t *s)
{
    pb_conv_t *c = &run->convs[s->conv];
    size_t add = (s->user_msg ? strlen(s->user_msg) : 0) + s->ans_len + 64;
    bool ok = s->rec.success && s->user_msg != NULL &&
              add_message(c->msgs, "user", s->user_msg) &&
              add_message(c->msgs, "assistant", s->ans_len > 0 ? s->answer : "");

    free(s->user_msg);
    s->user_msg = NULL;
    s->ans_len = 0;
    c->turn++;
    c->bytes += add;
    if (c->turn >= run->cfg.turns)
        return;
    if (ok && c->bytes <= PB_MAX_CONV_BYTES) {
        ready_push(run, s->conv);
        return;
    }
    run->skipped_turns += run->cfg.turns - c->turn;
    c->turn = (uint32_t)run->cfg.turns;
}

static void slot_reap(pb_run_t *run, pb_slot_t *s)
{
    /* Keep the connection only after a whole response with nothing left
     * over and no "Connection: close" (an error frame closes the stream). */
    bool reuse = run->cfg.keep_alive && s->bev != NULL && s->http.complete &&
                 !s->http.conn_close && !s->bev_dead &&
                 (s->rec.err == PB_ERR_NONE || s->rec.err == PB_ERR_HTTP_4XX ||
                  s->rec.err == PB_ERR_HTTP_5XX || s->rec.err == PB_ERR_NO_DONE) &&
                 evbuffer_get_length(bufferevent_get_input(s->bev)) == 0;

    if (reuse) {
        /* Idle: watch for the server closing it (slot callbacks see
         * SLOT_FREE and mark it dead). */
        bufferevent_enable(s->bev, EV_READ);
    } else if (s->bev != NULL) {
        bufferevent_free(s->bev);
        s->bev = NULL;
    }
    pb_sse_fini(&s->sse);
    free(s->req);
    s->req = NULL;
    if (!s->warmup && run->workload == PB_WL_MULTI_TURN)
        conv_turn_done(run, s);
    if (s->warmup) {
        free(s->rec.itl_ns);
    } else {
        /* n_recs was reserved at issue time; records are indexed by seq. */
        run->recs[s->rec.id] = s->rec;
    }
    s->rec.itl_ns = NULL;
    s->state = SLOT_FREE;
    s->next = run->free_slots;
    run->free_slots = s;
    run->inflight--;
}

/* ---- scheduling -------------------------------------------------------- */

static bool reserve_record(pb_run_t *run)
{
    pb_record_t *n;
    size_t cap;

    if (run->issued >= PB_MAX_REQUESTS)
        return false;
    if (run->issued < run->cap_recs)
        return true;
    cap = run->cap_recs ? run->cap_recs * 2 : 1024;
    if (cap > PB_MAX_REQUESTS)
        cap = PB_MAX_REQUESTS;
    n = realloc(run->recs, cap * sizeof(*n));
    if (n == NULL)
        return false;
    memset(n + run->cap_recs, 0, (cap - run->cap_recs) * sizeof(*n));
    run->recs = n;
    run->cap_recs = cap;
    return true;
}

static bool main_may_issue_more(pb_run_t *run, uint64_t now)
{
    if (run->stopping)
        return false;
    if (run->num_requests && run->issued >= run->num_requests)
        return false;
    if (run->cfg.duration_ns && now >= run->t0 + run->cfg.duration_ns)
        return false;
    if (run->workload == PB_WL_MULTI_TURN && run->ready_n == 0)
        return false;
    return run->issued < PB_MAX_REQUESTS;
}

static void schedule_arrival(pb_run_t *run, uint64_t now)
{
    struct timeval tv;
    uint64_t at;

    if (run->workload == PB_WL_TRACE)
        run->next_arrival_ns = run->t0 +
            run->trace.e[run->arrivals < run->trace.n ? run->arrivals : 0].at_ns;
    else
        run->next_arrival_ns += (uint64_t)(pb_rng_exp(&run->rng_arrival,
                                                      run->cfg.rate) * 1e9);
    at = run->next_arrival_ns;
    if (run->stopping ||
        (run->num_requests && run->arrivals >= run->num_requests) ||
        (run->workload == PB_WL_TRACE && run->arrivals >= run->trace.n) ||
        (run->cfg.duration_ns && at >= run->t0 + run->cfg.duration_ns) ||
        run->arrivals >= PB_MAX_REQUESTS) {
        run->arrivals_over = true;
        pump_kick(run);
        return;
    }
    tv = pd_ns_to_timeval(at > now ? at - now : 0);
    evtimer_add(run->arrival_ev, &tv);
}

static void arrival_cb(evutil_socket_t fd, short what, void *arg)
{
    pb_run_t *run = arg;

    run->arrivals++;
    run->pending++;
    schedule_arrival(run, pd_now_ns());
    pump_kick(run);
}

static void start_main_phase(pb_run_t *run)
{
    struct timeval tv;
    uint64_t deadline_ns;

    run->phase = PHASE_MAIN;
    run->t0 = pd_now_ns();
    run->t_last_done = run->t0;
    /* Hard stop: duration (or a generous bound for count-only runs) plus
     * one request timeout for the tail. */
    deadline_ns = run->cfg.request_timeout_ns + PD_NS_PER_S;
    if (run->cfg.duration_ns)
        deadline_ns += run->cfg.duration_ns;
    else
        deadline_ns += 86400ULL * PD_NS_PER_S;
    tv = pd_ns_to_timeval(deadline_ns);
    evtimer_add(run->deadline_ev, &tv);
    if (run->rate_mode) {
        run->next_arrival_ns = run->t0;
        /* The first request arrives at t0, the rest after exp() gaps. */
        run->arrivals = 1;
        run->pending = 1;
        if ((run->num_requests && run->num_requests <= 1) || run->stopping)
            run->arrivals_over = true;
        else
            schedule_arrival(run, run->t0);
    }
}

static void pump_cb(evutil_socket_t fd, short what, void *arg)
{
    pb_run_t *run = arg;
    uint32_t i;
    uint64_t now = pd_now_ns();

    for (i = 0; i < run->n_slots; i++)
        if (run->slots[i].state == SLOT_FINISHED)
            slot_reap(run, &run->slots[i]);

    if (run->phase == PHASE_WARMUP) {
        uint32_t cap = run->n_slots;
        while (run->free_slots != NULL && run->warm_issued < run->cfg.warmup &&
               run->inflight < cap && !run->stopping)
            slot_issue(run, true);
        if ((run->warm_issued >= run->cfg.warmup || run->stopping) &&
            run->inflight == 0)
            start_main_phase(run);
        else
            return;
    }
    if (run->phase != PHASE_MAIN)
        return;
    if (run->rate_mode) {
        while (run->pending > 0 && run->free_slots != NULL && !run->stopping &&
               reserve_record(run)) {
            run->pending--;
            slot_issue(run, false);
        }
        if (run->stopping)
            run->pending = 0;
        if ((run->arrivals_over || run->stopping) && run->pending == 0 &&
            run->inflight == 0)
            goto done;
    } else {
        while (run->free_slots != NULL && main_may_issue_more(run, now) &&
               reserve_record(run))
            slot_issue(run, false);
        if (!main_may_issue_more(run, now) && run->inflight == 0)
            goto done;
    }
    return;
done:
    run->phase = PHASE_DONE;
    run->n_recs = run->issued;
    event_base_loopbreak(run->base);
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    pb_run_t *run = arg;
    uint32_t i;

    run->stopping = true;
    run->arrivals_over = true;
    evtimer_del(run->arrival_ev);
    for (i = 0; i < run->n_slots; i++)
        slot_finish(&run->slots[i], PB_ERR_TIMEOUT, "run deadline");
    pump_kick(run);
}

static void sigint_cb(evutil_socket_t fd, short what, void *arg)
{
    pb_run_t *run = arg;

    if (run->stopping) {
        deadline_cb(-1, 0, run);
        return;
    }
    fprintf(stderr, "%s: interrupted: finishing requests in flight "
            "(again to abort them)\n", PB_PROG);
    run->stopping = true;
    run->arrivals_over = true;
    evtimer_del(run->arrival_ev);
    pump_kick(run);
}

/* ---- target ------------------------------------------------------------ */

static pd_status_t parse_url(pb_run_t *run, const char *url)
{
    const char *p, *host_end, *path;
    char host[256], port[16] = "80";
    struct addrinfo hints, *res = NULL;
    size_t hl, bl;
    int rc;

    if (strncmp(url, "http://", 7) != 0) {
        fprintf(stderr, "%s: --url: only http:// URLs are supported, got \"%s\"\n",
                PB_PROG, url);
        return PD_ERR_BAD_INPUT;
    }
    p = url + 7;
    path = strchr(p, '/');
    if (path == NULL)
        path = p + strlen(p);
    if (*p == '[') {
        host_end = memchr(p, ']', (size_t)(path - p));
        if (host_end == NULL)
            goto bad;
        hl = (size_t)(host_end - p - 1);
        if (hl >= sizeof(host))
            goto bad;
        memcpy(host, p + 1, hl);
        host[hl] = '\0';
        host_end++;
    } else {
        host_end = memchr(p, ':', (size_t)(path - p));
        if (host_end == NULL)
            host_end = path;
        hl = (size_t)(host_end - p);
        if (hl == 0 || hl >= sizeof(host))
            goto bad;
        memcpy(host, p, hl);
        host[hl] = '\0';
    }
    if (*host_end == ':') {
        size_t pl = (size_t)(path - host_end - 1);
        if (pl == 0 || pl >= sizeof(port) || strspn(host_end + 1, "0123456789") < pl)
            goto bad;
        memcpy(port, host_end + 1, pl);
        port[pl] = '\0';
    } else if (host_end != path) {
        goto bad;
    }
    snprintf(run->host_hdr, sizeof(run->host_hdr), "%.*s", (int)(path - p), p);
    /* Base path without a trailing '/'; "/v1" is added unless present. */
    bl = strlen(path);
    while (bl > 0 && path[bl - 1] == '/')
        bl--;
    if (bl >= 256)
        goto bad;
    snprintf(run->path, sizeof(run->path), "%.*s%s%s", (int)bl, path,
             (bl >= 3 && strncmp(path + bl - 3, "/v1", 3) == 0) ? "" : "/v1",
             run->endpoint == PB_EP_CHAT ? "/chat/completions" : "/completions");

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0 || res == NULL) {
        fprintf(stderr, "%s: --url: cannot resolve %s: %s\n", PB_PROG, host,
                gai_strerror(rc));
        return PD_ERR_BAD_INPUT;
    }
    memcpy(&run->addr, res->ai_addr, res->ai_addrlen);
    run->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    return PD_OK;
bad:
    fprintf(stderr, "%s: --url: cannot parse \"%s\" (want http://HOST[:PORT][/PATH])\n",
            PB_PROG, url);
    return PD_ERR_BAD_INPUT;
}

/* Blocking GET /v1/models before the loop starts (boot code; 5 s cap).
 * Returns the first model id (malloc'd) or NULL. */
typedef struct {
    char buf[65536];
    size_t len;
} pb_body_t;

static void collect_body(void *arg, const char *data, size_t len)
{
    pb_body_t *b = arg;
    size_t room = sizeof(b->buf) - 1 - b->len;

    if (len > room)
        len = room;
    memcpy(b->buf + b->len, data, len);
    b->len += len;
    b->buf[b->len] = '\0';
}

static char *fetch_model(pb_run_t *run)
{
    char req[1024], buf[4096], base[512], *id = NULL, *v1;
    struct timeval tv = { 5, 0 };
    pb_http_resp_t *http = malloc(sizeof(*http));
    pb_body_t *body = calloc(1, sizeof(*body));
    cJSON *j, *data, *m0, *mid;
    ssize_t n;
    int fd;

    if (http == NULL || body == NULL)
        goto out_free;
    snprintf(base, sizeof(base), "%s", run->path);
    v1 = strstr(base, "/v1/");
    if (v1 == NULL)
        goto out_free;
    strcpy(v1, "/v1/models");
    fd = socket(run->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        goto out_free;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&run->addr, run->addrlen) < 0)
        goto out_close;
    n = snprintf(req, sizeof(req),
                 "GET %s HTTP/1.1\r\nHost: %s\r\n%s%s%sConnection: close\r\n\r\n",
                 base, run->host_hdr,
                 run->cfg.api_key ? "Authorization: Bearer " : "",
                 run->cfg.api_key ? run->cfg.api_key : "",
                 run->cfg.api_key ? "\r\n" : "");
    if (n < 0 || (size_t)n >= sizeof(req) ||
        send(fd, req, (size_t)n, MSG_NOSIGNAL) != n)
        goto out_close;
    pb_http_resp_init(http);
    while (!http->complete && (n = recv(fd, buf, sizeof(buf), 0)) > 0)
        if (pb_http_resp_feed(http, buf, (size_t)n, collect_body, body,
                              NULL) != PD_OK)
            goto out_close;
    if (n == 0)
        pb_http_resp_eof(http);
    if (!http->complete || http->status != 200)
        goto out_close;
    j = cJSON_Parse(body->buf);
    data = cJSON_GetObjectItemCaseSensitive(j, "data");
    m0 = cJSON_IsArray(data) ? cJSON_GetArrayItem(data, 0) : NULL;
    mid = cJSON_GetObjectItemCaseSensitive(m0, "id");
    if (cJSON_IsString(mid))
        id = strdup(mid->valuestring);
    cJSON_Delete(j);
out_close:
    close(fd);
out_free:
    free(http);
    free(body);
    return id;
}

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

static cJSON *build_json(pb_run_t *run, const pb_aggregate_t *agg)
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
    cJSON_AddStringToObject(root, "workload", workload_names[run->workload]);
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

static void print_table(pb_run_t *run, const pb_aggregate_t *agg,
                        const cJSON *per_turn)
{
    size_t i;

    printf("%s\n", "============ Serving Benchmark Result ============");
    printf("%-40s %-10s\n", "Server:", run->target_url);
    printf("%-40s %-10s\n", "Workload:", workload_names[run->workload]);
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

static pd_status_t load_baseline(pb_run_t *run, const char *path)
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
static cJSON *compare_results(pb_run_t *run, const cJSON *a, const cJSON *b,
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
            pb_sse_fini(&s->sse);
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
    uint32_t i;

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
                               workload_names[run->workload]);
        if (run->cfg.conversations * run->cfg.turns > PB_MAX_REQUESTS)
            return usage_error("--conversations", "conversations x turns must be "
                               "at most 1000000", "");
    }
    if (run->workload == PB_WL_TRACE) {
        char why[512];

        if (run->cfg.trace == NULL || run->cfg.rate > 0)
            return usage_error("--workload", "trace needs --trace FILE (arrivals "
                               "come from it; no --rate)", workload_names[run->workload]);
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
    if (run->cfg.prompts != NULL && load_prompts(run, run->cfg.prompts) != PD_OK)
        return PD_CONFIG_EXIT_USAGE;
    if (run->cfg.baseline != NULL && load_baseline(run, run->cfg.baseline) != PD_OK)
        return PD_CONFIG_EXIT_USAGE;
    if (run->cfg.compare != NULL && parse_url(run, run->cfg.compare) != PD_OK)
        return PD_CONFIG_EXIT_USAGE;
    run->target_url = run->cfg.url;
    if (parse_url(run, run->cfg.url) != PD_OK)
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

    {
        /* Precise timers: arrivals and timeouts would otherwise follow the
         * coarse monotonic clock (~4 ms steps). */
        struct event_config *ec = event_config_new();
        if (ec == NULL)
            return 1;
        event_config_set_flag(ec, EVENT_BASE_FLAG_PRECISE_TIMER);
        run->base = event_base_new_with_config(ec);
        event_config_free(ec);
    }
    if (run->base == NULL)
        return 1;
    run->pump_ev = event_new(run->base, -1, 0, pump_cb, run);
    run->arrival_ev = evtimer_new(run->base, arrival_cb, run);
    run->deadline_ev = evtimer_new(run->base, deadline_cb, run);
    run->sigint_ev = evsignal_new(run->base, SIGINT, sigint_cb, run);
    run->slots = calloc(run->n_slots, sizeof(*run->slots));
    if (run->pump_ev == NULL || run->arrival_ev == NULL ||
        run->deadline_ev == NULL || run->sigint_ev == NULL || run->slots == NULL)
        return 1;
    evsignal_add(run->sigint_ev, NULL);
    for (i = run->n_slots; i-- > 0;) {
        pb_slot_t *s = &run->slots[i];
        s->run = run;
        s->timer = evtimer_new(run->base, slot_timeout_cb, s);
        if (s->timer == NULL)
            return 1;
        s->next = run->free_slots;
        run->free_slots = s;
    }
    return 0;
}

/* Prepare a pass against `url` (--url, then --compare): fresh slots,
 * records, conversations and generators, so both passes send the same
 * workload with the same arrivals. */
static int pass_begin(pb_run_t *run, const char *url, const char *model)
{
    uint32_t i;

    run->target_url = url;
    if (parse_url(run, url) != PD_OK)
        return PD_CONFIG_EXIT_USAGE;
    evtimer_del(run->arrival_ev);
    evtimer_del(run->deadline_ev);
    run->free_slots = NULL;
    for (i = run->n_slots; i-- > 0;) {
        pb_slot_t *s = &run->slots[i];

        if (s->bev != NULL)
            bufferevent_free(s->bev);
        s->bev = NULL;
        s->bev_dead = false;
        s->state = SLOT_FREE;
        s->next = run->free_slots;
        run->free_slots = s;
    }
    for (i = 0; i < run->n_recs; i++)
        free(run->recs[i].itl_ns);
    free(run->recs);
    run->recs = NULL;
    run->n_recs = run->cap_recs = 0;
    run->inflight = run->max_inflight = 0;
    run->warm_issued = run->issued = run->arrivals = run->pending = 0;
    run->arrivals_over = false;
    run->skipped_turns = run->idle_closed = 0;
    run->t0 = run->t_end_issue = run->t_last_done = run->next_arrival_ns = 0;
    pb_rng_seed(&run->rng_prompt, run->cfg.seed);
    pb_rng_seed(&run->rng_arrival, run->cfg.seed ^ 0xa5a5a5a5a5a5a5a5ULL);
    run->ready_head = run->ready_n = 0;
    for (i = 0; i < run->n_convs; i++) {
        cJSON_Delete(run->convs[i].msgs);
        run->convs[i].msgs = cJSON_CreateArray();
        run->convs[i].turn = 0;
        run->convs[i].bytes = 0;
        if (run->convs[i].msgs == NULL)
            return 1;
        if (run->workload == PB_WL_MULTI_TURN && run->cfg.system_len > 0) {
            /* one system prompt for every conversation (seeded once) */
            pb_prompt_buf_t sys;
            pb_rng_t srng;
            bool ok;
            pb_prompt_buf_init(&sys, false, 0, 0);
            pb_block_rng(&srng, run->cfg.seed ^ 0x73797374ULL, 0);
            ok = pb_prompt_add(&sys, &srng, (uint32_t)run->cfg.system_len) == PD_OK &&
                 add_message(run->convs[i].msgs, "system", sys.text);
            pb_prompt_buf_fini(&sys);
            if (!ok)
                return 1;
        }
        ready_push(run, i);
    }
    if (run->num_requests) {
        run->cap_recs = run->num_requests;
        run->recs = calloc(run->cap_recs, sizeof(*run->recs));
        if (run->recs == NULL)
            return 1;
    }
    run->model = model;
    if (run->model == NULL) {
        free(run->model_fetched);
        run->model_fetched = fetch_model(run);
        run->model = run->model_fetched;
        if (run->model == NULL) {
            fprintf(stderr, "%s: no model given and GET /v1/models at %s "
                    "gave no model id\n", PB_PROG, url);
            return 1;
        }
    }
    run->phase = run->cfg.warmup > 0 ? PHASE_WARMUP : PHASE_MAIN;
    if (run->phase == PHASE_MAIN)
        start_main_phase(run);
    pump_kick(run);
    return 0;
}

/* One pass of the workload against url: run, print, return the JSON. */
static cJSON *run_pass(pb_run_t *run, const char *url, const char *model)
{
    pb_aggregate_t agg;
    cJSON *root;

    if (pass_begin(run, url, model) != 0)
        return NULL;
    event_base_dispatch(run->base);
    if (pb_aggregate(run->recs, run->n_recs, &run->slo,
                     run->t_last_done > run->t0 ? run->t_last_done - run->t0 : 1,
                     &agg) != PD_OK)
        return NULL;
    root = build_json(run, &agg);
    if (root == NULL)
        return NULL;
    if (!run->cfg.quiet)
        print_table(run, &agg, cJSON_GetObjectItem(cJSON_GetObjectItem(root, "results"),
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
        cJSON_AddItemToObject(root, "side_by_side", compare_results(
            run, cJSON_GetObjectItem(root, "results"),
            cJSON_GetObjectItem(second, "results"),
            "======= Side by side (ratio = --compare / --url) =======",
            "--url", "--compare", "url", "compare"));
        cJSON_AddItemToObject(root, "compare", second);
        second = NULL;
    }
    if (run->baseline != NULL)
        cJSON_AddItemToObject(root, "comparison", compare_results(
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
