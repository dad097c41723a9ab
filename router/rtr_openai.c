#include "rtr_openai.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"

rtr_oai_error_t *rtr_oai_error_set(rtr_oai_error_t *err, int http_status,
                                   const char *type, const char *code,
                                   const char *param, const char *fmt, ...)
{
    err->http_status = http_status;
    err->type = type;
    err->code = code;
    err->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return err;
}

void rtr_oai_req_free(rtr_oai_req_t *req)
{
    if (req == NULL)
        return;
    free(req->prompt);
    free(req->prompt_tokens);
    if (req->messages != NULL) {
        for (uint32_t i = 0; i < req->n_messages; i++) {
            free((char *)req->messages[i].role);
            free((char *)req->messages[i].content);
        }
        free(req->messages);
    }
    for (uint32_t i = 0; i < req->n_stop; i++)
        free(req->stop[i]);
    memset(req, 0, sizeof(*req));
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d != NULL) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* A JSON number that is an integer within [lo, hi]. */
static bool get_int(const cJSON *item, double lo, double hi, int64_t *out)
{
    if (!cJSON_IsNumber(item))
        return false;
    double v = item->valuedouble;
    if (!isfinite(v) || floor(v) != v || v < lo || v > hi)
        return false;
    *out = (int64_t)v;
    return true;
}

/* Parsing context: one place that turns "bad field" into the envelope. */
typedef struct {
    rtr_oai_error_t *err;
    pd_status_t status;
} parse_ctx_t;

/* Message "'param' <detail>", e.g. "'top_p' must be a number in (0, 1]". */
static bool bad(parse_ctx_t *pc, const char *param, const char *detail)
{
    rtr_oai_error_set(pc->err, 400, INVALID, NULL, param, "'%s' %s", param, detail);
    pc->status = PD_ERR_BAD_INPUT;
    return false;
}

static bool parse_uint_field(parse_ctx_t *pc, const cJSON *root, const char *name,
                             double lo, double hi, uint32_t *out, bool *set_p)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, name);
    if (it == NULL || cJSON_IsNull(it))
        return true;
    int64_t v;
    if (!get_int(it, lo, hi, &v)) {
        char detail[96];
        snprintf(detail, sizeof(detail), "must be an integer in [%.0f, %.0f]", lo, hi);
        return bad(pc, name, detail);
    }
    *out = (uint32_t)v;
    if (set_p != NULL)
        *set_p = true;
    return true;
}

static bool parse_float_field(parse_ctx_t *pc, const cJSON *root, const char *name,
                              double lo, double hi, bool lo_open, float *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, name);
    if (it == NULL || cJSON_IsNull(it))
        return true;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) ||
        it->valuedouble > hi || it->valuedouble < lo ||
        (lo_open && it->valuedouble <= lo)) {
        char detail[96];
        snprintf(detail, sizeof(detail), "must be a number in %s%g, %g]",
                 lo_open ? "(" : "[", lo, hi);
        return bad(pc, name, detail);
    }
    *out = (float)it->valuedouble;
    return true;
}

static bool parse_bool_field(parse_ctx_t *pc, const cJSON *root, const char *name, bool *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, name);
    if (it == NULL || cJSON_IsNull(it))
        return true;
    if (!cJSON_IsBool(it))
        return bad(pc, name, "must be a boolean");
    *out = cJSON_IsTrue(it);
    return true;
}

static bool parse_stop(parse_ctx_t *pc, const cJSON *root, rtr_oai_req_t *req)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (it == NULL || cJSON_IsNull(it))
        return true;
    const cJSON *one = it;
    int n = 1;
    if (cJSON_IsArray(it)) {
        n = cJSON_GetArraySize(it);
        if (n > RTR_OAI_MAX_STOP) {
            rtr_oai_error_set(pc->err, 400, INVALID, NULL, "stop",
                              "'stop' allows at most %d strings", RTR_OAI_MAX_STOP);
            pc->status = PD_ERR_BAD_INPUT;
            return false;
        }
        one = it->child;
    } else if (!cJSON_IsString(it)) {
        return bad(pc, "stop", "must be a string or an array of strings");
    }
    for (int i = 0; i < n && one != NULL; i++, one = one->next) {
        if (!cJSON_IsString(one))
            return bad(pc, "stop", "must be a string or an array of strings");
        size_t len = strlen(one->valuestring);
        if (len == 0)
            continue; /* an empty stop string never matches: ignore it */
        if (len > RTR_OAI_MAX_STOP_BYTES) {
            rtr_oai_error_set(pc->err, 400, INVALID, NULL, "stop",
                              "each 'stop' string is at most %d bytes", RTR_OAI_MAX_STOP_BYTES);
            pc->status = PD_ERR_BAD_INPUT;
            return false;
        }
        req->stop[req->n_stop] = dup_n(one->valuestring, len);
        if (req->stop[req->n_stop] == NULL) {
            pc->status = PD_ERR_NO_MEMORY;
            return false;
        }
        req->n_stop++;
    }
    return true;
}

static bool parse_prompt(parse_ctx_t *pc, const cJSON *root, const rtr_oai_limits_t *lim,
                         rtr_oai_req_t *req)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (p == NULL || cJSON_IsNull(p))
        return bad(pc, "prompt", "is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child))
        p = p->child; /* ["text"]: a batch of one prompt */
    if (cJSON_IsString(p)) {
        size_t len = strlen(p->valuestring);
        if (len > lim->max_prompt_bytes) {
            rtr_oai_error_set(pc->err, 400, INVALID, "context_length_exceeded", "prompt",
                              "the prompt is %zu bytes; this server accepts at most %zu",
                              len, lim->max_prompt_bytes);
            pc->status = PD_ERR_TOO_BIG;
            return false;
        }
        req->prompt = dup_n(p->valuestring, len);
        req->prompt_len = len;
        if (req->prompt == NULL) {
            pc->status = PD_ERR_NO_MEMORY;
            return false;
        }
        return true;
    }
    if (!cJSON_IsArray(p))
        return bad(pc, "prompt", "must be a string or an array of token ids");
    int n = cJSON_GetArraySize(p);
    if (n == 0)
        return bad(pc, "prompt", "must be non-empty");
    if ((uint32_t)n > lim->max_prompt_tokens) {
        rtr_oai_error_set(pc->err, 400, INVALID, "context_length_exceeded", "prompt",
                          "the prompt has %d tokens; the maximum is %u", n,
                          lim->max_prompt_tokens);
        pc->status = PD_ERR_TOO_BIG;
        return false;
    }
    req->prompt_tokens = malloc(sizeof(int32_t) * (size_t)n);
    if (req->prompt_tokens == NULL) {
        pc->status = PD_ERR_NO_MEMORY;
        return false;
    }
    const cJSON *t = p->child;
    for (int i = 0; i < n; i++, t = t->next) {
        int64_t v;
        double hi = lim->vocab_size ? (double)lim->vocab_size - 1 : 2147483647.0;
        if (!get_int(t, 0, hi, &v))
            return bad(pc, "prompt", "must be a string, or an array of valid token ids "
                                     "(batches of prompts are not supported)");
        req->prompt_tokens[i] = (int32_t)v;
    }
    req->n_prompt_tokens = (uint32_t)n;
    return true;
}

/* Chat content: a string, or an array of {"type":"text","text":...} parts. */
static bool parse_content(parse_ctx_t *pc, const cJSON *c, char **out, size_t *len_p,
                          size_t *budget)
{
    size_t total = 0;
    char *buf = NULL;
    if (c == NULL || cJSON_IsNull(c)) {
        buf = dup_n("", 0);
    } else if (cJSON_IsString(c)) {
        total = strlen(c->valuestring);
        if (total > *budget)
            goto too_big;
        buf = dup_n(c->valuestring, total);
    } else if (cJSON_IsArray(c)) {
        const cJSON *part;
        cJSON_ArrayForEach(part, c) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
                !cJSON_IsString(text)) {
                free(buf);
                return bad(pc, "messages", "content parts must be {\"type\":\"text\","
                                           "\"text\":...} (this model takes text only)");
            }
            size_t l = strlen(text->valuestring);
            if (l > *budget - total) {
                free(buf);
                goto too_big;
            }
            char *nb = realloc(buf, total + l + 1);
            if (nb == NULL) {
                free(buf);
                pc->status = PD_ERR_NO_MEMORY;
                return false;
            }
            buf = nb;
            memcpy(buf + total, text->valuestring, l);
            total += l;
            buf[total] = '\0';
        }
        if (buf == NULL)
            buf = dup_n("", 0);
    } else {
        return bad(pc, "messages", "content must be a string or an array of text parts");
    }
    if (buf == NULL) {
        pc->status = PD_ERR_NO_MEMORY;
        return false;
    }
    *budget -= total;
    *out = buf;
    *len_p = total;
    return true;
too_big:
    rtr_oai_error_set(pc->err, 400, INVALID, "context_length_exceeded", "messages",
                      "the messages are longer than this server accepts");
    pc->status = PD_ERR_TOO_BIG;
    return false;
}

static bool parse_messages(parse_ctx_t *pc, const cJSON *root, const rtr_oai_limits_t *lim,
                           rtr_oai_req_t *req)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (m == NULL)
        return bad(pc, "messages", "is required");
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0)
        return bad(pc, "messages", "must be a non-empty array");
    int n = cJSON_GetArraySize(m);
    if ((uint32_t)n > lim->max_messages) {
        rtr_oai_error_set(pc->err, 400, INVALID, NULL, "messages",
                          "at most %u messages are accepted", lim->max_messages);
        pc->status = PD_ERR_TOO_BIG;
        return false;
    }
    req->messages = calloc((size_t)n, sizeof(*req->messages));
    if (req->messages == NULL) {
        pc->status = PD_ERR_NO_MEMORY;
        return false;
    }
    size_t budget = lim->max_prompt_bytes;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, m) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsObject(msg) || !cJSON_IsString(role))
            return bad(pc, "messages", "entries must be objects with a string 'role'");
        static const char *const roles[] = { "system", "user", "assistant", "tool", "developer" };
        bool ok = false;
        for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
            ok = ok || strcmp(role->valuestring, roles[i]) == 0;
        if (!ok)
            return bad(pc, "messages",
                       "role must be one of system, user, assistant, tool, developer");
        rtr_chat_msg_t *out = &req->messages[req->n_messages];
        out->role = dup_n(role->valuestring, strlen(role->valuestring));
        if (out->role == NULL) {
            pc->status = PD_ERR_NO_MEMORY;
            return false;
        }
        req->n_messages++;
        char *content = NULL;
        if (!parse_content(pc, cJSON_GetObjectItemCaseSensitive(msg, "content"), &content,
                           &out->content_len, &budget))
            return false;
        out->content = content;
    }
    return true;
}

static int key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A key appearing twice in one object, anywhere in the tree: a proxy in
 * front may take the last where cJSON takes the first. Sorting keeps it
 * O(n log n) per object. Returns the duplicated key or NULL (and NULL with
 * *oom set if a scratch array could not be had). */
static const char *dup_key(const cJSON *node, bool *oom)
{
    size_t n = 0;
    for (const cJSON *c = node->child; c != NULL; c = c->next)
        n++;
    if (cJSON_IsObject(node) && n > 1) {
        const char **keys = malloc(n * sizeof(*keys));
        if (keys == NULL) {
            *oom = true;
            return NULL;
        }
        size_t i = 0;
        for (const cJSON *c = node->child; c != NULL; c = c->next)
            keys[i++] = c->string != NULL ? c->string : "";
        qsort(keys, n, sizeof(*keys), key_cmp);
        const char *dup = NULL;
        for (i = 1; i < n && dup == NULL; i++)
            if (strcmp(keys[i - 1], keys[i]) == 0)
                dup = keys[i];
        free(keys);
        if (dup != NULL)
            return dup;
    }
    for (const cJSON *c = node->child; c != NULL; c = c->next) {
        const char *d = dup_key(c, oom);
        if (d != NULL || *oom)
            return d;
    }
    return NULL;
}

pd_status_t rtr_oai_parse(rtr_api_t api, const char *body, size_t len,
                          const rtr_oai_limits_t *lim, rtr_oai_req_t *req,
                          rtr_oai_error_t *err)
{
    memset(req, 0, sizeof(*req));
    req->api = api;
    req->temperature = 1.0f;
    req->top_p = 1.0f;
    req->top_k = 0;
    req->n = 1;
    req->max_tokens = lim->default_max_tokens;
    parse_ctx_t pc = { err, PD_OK };

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (root == NULL) {
        rtr_oai_error_set(err, 400, INVALID, NULL, NULL,
                          "the request body is not valid JSON");
        return PD_ERR_BAD_INPUT;
    }
    /* one JSON value and nothing after it but whitespace */
    while (end != NULL && end < body + len &&
           (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
        end++;
    if (end == NULL || end != body + len) {
        rtr_oai_error_set(err, 400, INVALID, NULL, NULL,
                          "the request body has bytes after its JSON value");
        cJSON_Delete(root);
        return PD_ERR_BAD_INPUT;
    }
    bool oom = false;
    const char *dup = dup_key(root, &oom);
    if (dup != NULL || oom) {
        if (oom)
            rtr_oai_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        else
            rtr_oai_error_set(err, 400, INVALID, NULL, NULL,
                              "the request body has the key \"%.64s\" twice in one object", dup);
        cJSON_Delete(root);
        return oom ? PD_ERR_NO_MEMORY : PD_ERR_BAD_INPUT;
    }
    if (!cJSON_IsObject(root)) {
        rtr_oai_error_set(err, 400, INVALID, NULL, NULL,
                          "the request body must be a JSON object");
        cJSON_Delete(root);
        return PD_ERR_BAD_INPUT;
    }

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model != NULL && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model) || strlen(model->valuestring) >= RTR_OAI_MODEL_MAX) {
            bad(&pc, "model", "must be a string naming a served model");
            goto out;
        }
        snprintf(req->model, sizeof(req->model), "%s", model->valuestring);
    }

    if (api == RTR_API_COMPLETIONS ? !parse_prompt(&pc, root, lim, req)
                                   : !parse_messages(&pc, root, lim, req))
        goto out;

    bool max_set = false;
    uint32_t mct = 0;
    bool mct_set = false;
    double cap = (double)lim->max_tokens_cap;
    const char *max_name = "max_tokens";
    if (!parse_uint_field(&pc, root, "max_tokens", 1, 1e12, &req->max_tokens, &max_set))
        goto out;
    if (api == RTR_API_CHAT) {
        if (!parse_uint_field(&pc, root, "max_completion_tokens", 1, 1e12, &mct, &mct_set))
            goto out;
        if (mct_set) {
            req->max_tokens = mct;
            max_name = "max_completion_tokens";
        }
    }
    {   /* separate the range check so the message names the cap */
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, max_name);
        int64_t v;
        if (it != NULL && get_int(it, 1, 1e12, &v) && (double)v > cap) {
            rtr_oai_error_set(err, 400, INVALID, NULL, max_name,
                              "'%s' is %lld; this server allows at most %u", max_name,
                              (long long)v, lim->max_tokens_cap);
            pc.status = PD_ERR_BAD_INPUT;
            goto out;
        }
    }
    if (!parse_uint_field(&pc, root, "min_tokens", 0, cap, &req->min_tokens, NULL) ||
        !parse_float_field(&pc, root, "temperature", 0, 2, false, &req->temperature) ||
        !parse_float_field(&pc, root, "top_p", 0, 1, true, &req->top_p) ||
        !parse_bool_field(&pc, root, "stream", &req->stream) ||
        !parse_bool_field(&pc, root, "ignore_eos", &req->ignore_eos) ||
        !parse_stop(&pc, root, req))
        goto out;
    if (req->min_tokens > req->max_tokens) {
        bad(&pc, "min_tokens", "must be at most max_tokens");
        goto out;
    }
    {
        const cJSON *tk = cJSON_GetObjectItemCaseSensitive(root, "top_k");
        int64_t v;
        if (tk != NULL && !cJSON_IsNull(tk)) {
            if (!get_int(tk, -1, 1e9, &v)) {
                bad(&pc, "top_k", "must be an integer >= -1 (-1 or 0: off)");
                goto out;
            }
            req->top_k = (int32_t)v;
        }
        const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
        if (seed != NULL && !cJSON_IsNull(seed)) {
            if (!get_int(seed, -9007199254740991.0, 9007199254740991.0, &v)) {
                bad(&pc, "seed", "must be an integer");
                goto out;
            }
            req->seed = (uint64_t)v;
            req->seed_set = true;
        }
        uint32_t n = 1;
        if (!parse_uint_field(&pc, root, "n", 1, 1e9, &n, NULL))
            goto out;
        if (n > lim->n_cap) {
            rtr_oai_error_set(err, 400, INVALID, NULL, "n",
                              "'n' is %u; this server allows at most %u", n, lim->n_cap);
            pc.status = PD_ERR_BAD_INPUT;
            goto out;
        }
        req->n = n;
    }
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so != NULL && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) {
            bad(&pc, "stream_options", "must be an object");
            goto out;
        }
        if (!parse_bool_field(&pc, so, "include_usage", &req->include_usage))
            goto out;
    }
    {   /* fields we do not implement: refuse rather than silently ignore */
        static const char *const unsupported[] = { "logprobs", "echo", "best_of",
                                                   "tools", "suffix" };
        for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); i++) {
            const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, unsupported[i]);
            if (it != NULL && !cJSON_IsNull(it) && !cJSON_IsFalse(it) &&
                !(cJSON_IsArray(it) && cJSON_GetArraySize(it) == 0)) {
                rtr_oai_error_set(err, 400, INVALID, "unsupported_parameter", unsupported[i],
                                  "'%s' is not supported by this server", unsupported[i]);
                pc.status = PD_ERR_BAD_INPUT;
                goto out;
            }
        }
    }
out:
    cJSON_Delete(root);
    if (pc.status != PD_OK) {
        if (pc.status == PD_ERR_NO_MEMORY)
            rtr_oai_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        rtr_oai_req_free(req);
    }
    return pc.status;
}

/* ---- response bodies ---------------------------------------------------- */

static char *print_and_free(cJSON *o)
{
    if (o == NULL)
        return NULL;
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

char *rtr_oai_error_json(const rtr_oai_error_t *err)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    if (e == NULL) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(e, "message", err->message);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : "server_error");
    if (err->param)
        cJSON_AddStringToObject(e, "param", err->param);
    else
        cJSON_AddNullToObject(e, "param");
    if (err->code)
        cJSON_AddStringToObject(e, "code", err->code);
    else
        cJSON_AddNullToObject(e, "code");
    return print_and_free(root);
}

/* cJSON strings are NUL-terminated: text with an embedded NUL is cut there. */
static cJSON *text_item(const char *text, size_t len)
{
    char *s = dup_n(text ? text : "", text ? len : 0);
    if (s == NULL)
        return NULL;
    cJSON *it = cJSON_CreateString(s);
    free(s);
    return it;
}

static cJSON *meta_object(const rtr_oai_resp_meta_t *meta, bool chunk)
{
    cJSON *root = cJSON_CreateObject();
    if (root == NULL)
        return NULL;
    cJSON_AddStringToObject(root, "id", meta->id);
    const char *object = meta->api == RTR_API_CHAT
        ? (chunk ? "chat.completion.chunk" : "chat.completion")
        : "text_completion";
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)meta->created);
    cJSON_AddStringToObject(root, "model", meta->model);
    return root;
}

static void add_usage(cJSON *root, const rtr_oai_usage_t *u)
{
    cJSON *usage = cJSON_AddObjectToObject(root, "usage");
    if (usage == NULL)
        return;
    cJSON_AddNumberToObject(usage, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(usage, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(usage, "total_tokens",
                            (double)u->prompt_tokens + (double)u->completion_tokens);
}

static void add_finish(cJSON *choice, const char *finish_reason)
{
    if (finish_reason)
        cJSON_AddStringToObject(choice, "finish_reason", finish_reason);
    else
        cJSON_AddNullToObject(choice, "finish_reason");
}

char *rtr_oai_chunk_json(const rtr_oai_resp_meta_t *meta, uint32_t index,
                         const char *text, size_t text_len,
                         const char *finish_reason, bool with_role)
{
    cJSON *root = meta_object(meta, true);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *choice = cJSON_CreateObject();
    if (choices == NULL || choice == NULL) {
        cJSON_Delete(choice);
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddItemToArray(choices, choice);
    cJSON_AddNumberToObject(choice, "index", index);
    if (meta->api == RTR_API_CHAT) {
        cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
        if (with_role)
            cJSON_AddStringToObject(delta, "role", "assistant");
        if (text_len > 0 || finish_reason == NULL)
            cJSON_AddItemToObject(delta, "content", text_item(text, text_len));
    } else {
        cJSON_AddItemToObject(choice, "text", text_item(text, text_len));
    }
    cJSON_AddNullToObject(choice, "logprobs");
    add_finish(choice, finish_reason);
    return print_and_free(root);
}

char *rtr_oai_usage_chunk_json(const rtr_oai_resp_meta_t *meta, const rtr_oai_usage_t *usage)
{
    cJSON *root = meta_object(meta, true);
    if (root == NULL)
        return NULL;
    cJSON_AddArrayToObject(root, "choices");
    add_usage(root, usage);
    return print_and_free(root);
}

char *rtr_oai_response_json(const rtr_oai_resp_meta_t *meta, uint32_t n_choices,
                            const char *const *texts, const size_t *text_lens,
                            const char *const *finish_reasons,
                            const rtr_oai_usage_t *usage)
{
    cJSON *root = meta_object(meta, false);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    if (choices == NULL) {
        cJSON_Delete(root);
        return NULL;
    }
    for (uint32_t i = 0; i < n_choices; i++) {
        cJSON *choice = cJSON_CreateObject();
        if (choice == NULL)
            break;
        cJSON_AddItemToArray(choices, choice);
        cJSON_AddNumberToObject(choice, "index", i);
        if (meta->api == RTR_API_CHAT) {
            cJSON *msg = cJSON_AddObjectToObject(choice, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            cJSON_AddItemToObject(msg, "content", text_item(texts[i], text_lens[i]));
        } else {
            cJSON_AddItemToObject(choice, "text", text_item(texts[i], text_lens[i]));
        }
        cJSON_AddNullToObject(choice, "logprobs");
        add_finish(choice, finish_reasons[i]);
    }
    add_usage(root, usage);
    return print_and_free(root);
}

char *rtr_oai_models_json(const char *const *model_ids, uint32_t n, int64_t created,
                          const char *owned_by)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    if (data == NULL) {
        cJSON_Delete(root);
        return NULL;
    }
    for (uint32_t i = 0; i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        if (m == NULL)
            break;
        cJSON_AddItemToArray(data, m);
        cJSON_AddStringToObject(m, "id", model_ids[i]);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)created);
        cJSON_AddStringToObject(m, "owned_by", owned_by);
    }
    return print_and_free(root);
}
