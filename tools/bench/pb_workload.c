/* pb_workload.c - pd-bench's workloads: what each request sends (synthetic
 * words or token ids, --prompts lines, shared prefixes, trace entries,
 * multi-turn histories) and the HTTP request bytes around it. */
#include "pb_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

pd_status_t pb_load_prompts(pb_run_t *run, const char *path)
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

bool pb_add_message(cJSON *msgs, const char *role, const char *content)
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
        pb_add_message(msgs, "user", prompt);
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
            !pb_add_message(msgs, "system", pre.text) ||
            !pb_add_message(msgs, "user", own.text))
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
        if (!pb_add_message(msgs, "user", b.text))
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
        !pb_add_message(msgs, "user", b.text))
        goto out;
    add_max_tokens(run, body, max_tokens);
    ok = true;
out:
    pb_prompt_buf_fini(&b);
    return ok;
}

/* Build the HTTP request for one slot. Returns malloc'd bytes. */
char *pb_build_request(pb_run_t *run, pb_slot_t *s, uint64_t seq,
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
