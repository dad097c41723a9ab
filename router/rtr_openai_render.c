/* rtr_openai_render.c - OpenAI response bodies <- values: errors, stream
 * chunks, whole responses and the model list, all JSON built with cJSON
 * (rtr_openai.h). */
#include "rtr_openai.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Generated text as a JSON string. cJSON strings end at NUL, and a model
 * can emit a byte 0 (a byte token), which would cut the text there; so the
 * literal is escaped here (control bytes as \u00XX, NUL included) and
 * inserted with cJSON_CreateRaw. Other bytes are copied as they are (the
 * detokenizer only releases whole UTF-8 characters). */
cJSON *rtr_oai_text_item(const char *text, size_t len)
{
    if (text == NULL)
        len = 0;
    char *s = malloc(len * 6 + 3);
    if (s == NULL)
        return NULL;
    size_t o = 0;
    s[o++] = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '"' || c == '\\') {
            s[o++] = '\\';
            s[o++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            o += (size_t)snprintf(s + o, 7, "\\u%04x", c);
        } else {
            s[o++] = (char)c;
        }
    }
    s[o++] = '"';
    s[o] = '\0';
    cJSON *it = cJSON_CreateRaw(s);
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
    cJSON *details = cJSON_AddObjectToObject(usage, "prompt_tokens_details");
    if (details != NULL)
        cJSON_AddNumberToObject(details, "cached_tokens", u->cached_tokens);
}

static void add_finish(cJSON *choice, const char *finish_reason)
{
    if (finish_reason)
        cJSON_AddStringToObject(choice, "finish_reason", finish_reason);
    else
        cJSON_AddNullToObject(choice, "finish_reason");
}

/* ---- logprobs ------------------------------------------------------------- */

/* Length of the UTF-8 sequence starting at p (1 for an invalid byte), and
 * whether it is valid. */
static size_t utf8_seq(const unsigned char *p, size_t n, bool *ok)
{
    unsigned char c = p[0];
    size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
               : (c & 0xf8) == 0xf0 ? 4 : 0;
    *ok = len != 0 && len <= n && c != 0 && c != 0xc0 && c != 0xc1 && c < 0xf5;
    for (size_t i = 1; *ok && i < len; i++)
        *ok = (p[i] & 0xc0) == 0x80;
    return *ok ? len : 1;
}

static uint64_t utf8_chars(const char *s, size_t n)
{
    uint64_t chars = 0;
    for (size_t i = 0; i < n; chars++) {
        bool ok;
        i += utf8_seq((const unsigned char *)s + i, n - i, &ok);
    }
    return chars;
}

/* A JSON string for token bytes: valid UTF-8 kept, every invalid byte (and
 * NUL) as U+FFFD; the exact bytes go in "bytes". */
static cJSON *token_string(const char *b, size_t n)
{
    char *s = malloc(n * 3 + 1);
    if (s == NULL)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        bool ok;
        size_t l = utf8_seq((const unsigned char *)b + i, n - i, &ok);
        if (ok) {
            memcpy(s + o, b + i, l);
            o += l;
        } else {
            memcpy(s + o, "\xef\xbf\xbd", 3);
            o += 3;
        }
        i += l;
    }
    s[o] = '\0';
    cJSON *it = cJSON_CreateString(s);
    free(s);
    return it;
}

#define PIECE_MAX 256

static size_t lp_piece(const rtr_oai_logprobs_t *lp, int32_t id, char *buf)
{
    return lp->piece != NULL ? lp->piece(lp->ctx, id, buf, PIECE_MAX) : 0;
}

uint64_t rtr_oai_logprobs_chars(const rtr_oai_logprobs_t *lp)
{
    char buf[PIECE_MAX];
    uint64_t chars = 0;
    for (uint32_t i = 0; lp != NULL && i < lp->n; i++)
        chars += utf8_chars(buf, lp_piece(lp, lp->v[i].id, buf));
    return chars;
}

/* {"token", "logprob", "bytes"} (+ "top_logprobs" when top is set). */
static cJSON *chat_lp_item(const rtr_oai_logprobs_t *lp, int32_t id, float logprob,
                           const rtr_oai_logprob_t *top)
{
    char buf[PIECE_MAX];
    size_t n = lp_piece(lp, id, buf);
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return NULL;
    cJSON_AddItemToObject(o, "token", token_string(buf, n));
    cJSON_AddNumberToObject(o, "logprob", (double)logprob);
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
    for (size_t i = 0; bytes != NULL && i < n; i++)
        cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)buf[i]));
    if (top != NULL) {
        cJSON *arr = cJSON_AddArrayToObject(o, "top_logprobs");
        for (uint32_t k = 0; arr != NULL && k < top->n_top; k++)
            cJSON_AddItemToArray(arr, chat_lp_item(lp, top->top_ids[k], top->top_lp[k], NULL));
    }
    return o;
}

static cJSON *logprobs_json(rtr_api_t api, const rtr_oai_logprobs_t *lp)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return NULL;
    if (api == RTR_API_CHAT) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        for (uint32_t i = 0; content != NULL && i < lp->n; i++)
            cJSON_AddItemToArray(content, chat_lp_item(lp, lp->v[i].id, lp->v[i].logprob,
                                                       &lp->v[i]));
        cJSON_AddNullToObject(o, "refusal");
        return o;
    }
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens");
    cJSON *tlp = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *off = cJSON_AddArrayToObject(o, "text_offset");
    if (tokens == NULL || tlp == NULL || top == NULL || off == NULL)
        return o;
    uint64_t at = lp->text_offset;
    char buf[PIECE_MAX], tb[PIECE_MAX];
    for (uint32_t i = 0; i < lp->n; i++) {
        const rtr_oai_logprob_t *e = &lp->v[i];
        size_t n = lp_piece(lp, e->id, buf);
        cJSON_AddItemToArray(tokens, token_string(buf, n));
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber((double)e->logprob));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
        at += utf8_chars(buf, n);
        /* the top alternatives, then the chosen token (OpenAI: up to n + 1) */
        cJSON *d = cJSON_CreateObject();
        cJSON_AddItemToArray(top, d);
        for (uint32_t k = 0; d != NULL && k <= e->n_top; k++) {
            int32_t id = k < e->n_top ? e->top_ids[k] : e->id;
            float v = k < e->n_top ? e->top_lp[k] : e->logprob;
            cJSON *key = token_string(tb, lp_piece(lp, id, tb));
            if (key != NULL && cJSON_GetObjectItemCaseSensitive(d, key->valuestring) == NULL)
                cJSON_AddNumberToObject(d, key->valuestring, (double)v);
            cJSON_Delete(key);
        }
    }
    return o;
}

static void add_logprobs(cJSON *choice, rtr_api_t api, const rtr_oai_logprobs_t *lp)
{
    if (lp == NULL)
        cJSON_AddNullToObject(choice, "logprobs");
    else
        cJSON_AddItemToObject(choice, "logprobs", logprobs_json(api, lp));
}

/* [{"id", "type": "function", "function": {"name", "arguments"}}], with
 * "index" per call in stream deltas. */
static cJSON *calls_json(const rtr_oai_calls_t *c, bool stream)
{
    cJSON *arr = cJSON_CreateArray();
    for (uint32_t k = 0; arr != NULL && k < c->n; k++) {
        cJSON *o = cJSON_CreateObject(), *f;
        if (o == NULL)
            break;
        cJSON_AddItemToArray(arr, o);
        if (stream)
            cJSON_AddNumberToObject(o, "index", k);
        cJSON_AddStringToObject(o, "id", c->v[k].id != NULL ? c->v[k].id : "");
        cJSON_AddStringToObject(o, "type", "function");
        if ((f = cJSON_AddObjectToObject(o, "function")) != NULL) {
            cJSON_AddStringToObject(f, "name", c->v[k].name);
            cJSON_AddStringToObject(f, "arguments", c->v[k].arguments);
        }
    }
    return arr;
}

/* ---- the one response writer -------------------------------------------- */

/* What any body carries: a whole response (choices with "message", then
 * "usage"), a stream chunk (its choice with "delta"; a tool chunk's delta
 * holds the whole calls) or the include_usage chunk (no choice, "usage").
 * Choice i of n is numbered index + i; an array left NULL means none for
 * every choice (no text, finish_reason null, logprobs null, no calls). */
typedef struct {
    bool stream;                        /* "...chunk" object, "delta" */
    bool with_role;                     /* stream: delta.role (chat's first chunk) */
    uint32_t index;
    uint32_t n;
    const char *const *texts;           /* (n) */
    const size_t *text_lens;            /* (n) */
    const char *const *finish_reasons;  /* (n) */
    const rtr_oai_logprobs_t *lps;      /* (n) */
    const rtr_oai_calls_t *calls;       /* (n); stream: a tool chunk */
    const rtr_oai_usage_t *usage;       /* NULL: no "usage" */
} body_t;

/* Chat's message (whole response) or delta (stream chunk). A message has
 * its role, its content (null when it is only tool calls) and its calls;
 * a delta its role on the first chunk, its content unless it is the last
 * chunk and empty, or (a tool chunk) only the calls. */
static void add_message(cJSON *choice, const body_t *b, const char *text, size_t len,
                        const char *finish_reason, const rtr_oai_calls_t *calls)
{
    bool call = calls != NULL && (b->stream || calls->n > 0);
    cJSON *m = cJSON_AddObjectToObject(choice, b->stream ? "delta" : "message");
    if (m == NULL)
        return;
    if (!b->stream || b->with_role)
        cJSON_AddStringToObject(m, "role", "assistant");
    if (!b->stream)
        cJSON_AddItemToObject(m, "content", call && len == 0 ? cJSON_CreateNull()
                                                             : rtr_oai_text_item(text, len));
    else if (!call && (len > 0 || finish_reason == NULL))
        cJSON_AddItemToObject(m, "content", rtr_oai_text_item(text, len));
    if (call)
        cJSON_AddItemToObject(m, "tool_calls", calls_json(calls, b->stream));
}

static bool add_choice(cJSON *choices, const rtr_oai_resp_meta_t *meta, const body_t *b,
                       uint32_t i)
{
    cJSON *choice = cJSON_CreateObject();
    if (choice == NULL)
        return false;
    cJSON_AddItemToArray(choices, choice);
    cJSON_AddNumberToObject(choice, "index", b->index + i);
    const char *text = b->texts != NULL ? b->texts[i] : NULL;
    size_t len = b->text_lens != NULL ? b->text_lens[i] : 0;
    const char *finish_reason = b->finish_reasons != NULL ? b->finish_reasons[i] : NULL;
    const rtr_oai_calls_t *calls = b->calls != NULL ? &b->calls[i] : NULL;
    /* a tool chunk is a delta whatever the API (tools are chat's) */
    if (meta->api == RTR_API_CHAT || (b->stream && calls != NULL))
        add_message(choice, b, text, len, finish_reason, calls);
    else
        cJSON_AddItemToObject(choice, "text", rtr_oai_text_item(text, len));
    add_logprobs(choice, meta->api, b->lps != NULL ? &b->lps[i] : NULL);
    add_finish(choice, finish_reason);
    return true;
}

static char *write_body(const rtr_oai_resp_meta_t *meta, const body_t *b)
{
    cJSON *root = meta_object(meta, b->stream);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    for (uint32_t i = 0; choices != NULL && i < b->n; i++)
        if (!add_choice(choices, meta, b, i))
            choices = NULL;
    if (choices == NULL) {
        cJSON_Delete(root);
        return NULL;
    }
    if (b->usage != NULL)
        add_usage(root, b->usage);
    return print_and_free(root);
}

/* ---- its entry points (rtr_openai.h) ------------------------------------- */

char *rtr_oai_chunk_json(const rtr_oai_resp_meta_t *meta, uint32_t index,
                         const char *text, size_t text_len,
                         const char *finish_reason, bool with_role)
{
    return rtr_oai_chunk_lp_json(meta, index, text, text_len, finish_reason, with_role, NULL);
}

char *rtr_oai_chunk_lp_json(const rtr_oai_resp_meta_t *meta, uint32_t index,
                            const char *text, size_t text_len, const char *finish_reason,
                            bool with_role, const rtr_oai_logprobs_t *lp)
{
    body_t b = { .stream = true, .with_role = with_role, .index = index, .n = 1,
                 .texts = &text, .text_lens = &text_len, .finish_reasons = &finish_reason,
                 .lps = lp };
    return write_body(meta, &b);
}

char *rtr_oai_tool_chunk_json(const rtr_oai_resp_meta_t *meta, uint32_t index,
                              const rtr_oai_calls_t *calls)
{
    body_t b = { .stream = true, .index = index, .n = 1, .calls = calls };
    return write_body(meta, &b);
}

char *rtr_oai_usage_chunk_json(const rtr_oai_resp_meta_t *meta, const rtr_oai_usage_t *usage)
{
    body_t b = { .stream = true, .usage = usage };
    return write_body(meta, &b);
}

char *rtr_oai_response_json(const rtr_oai_resp_meta_t *meta, uint32_t n_choices,
                            const char *const *texts, const size_t *text_lens,
                            const char *const *finish_reasons,
                            const rtr_oai_usage_t *usage)
{
    return rtr_oai_response_full_json(meta, n_choices, texts, text_lens, finish_reasons, usage,
                                      NULL, NULL);
}

char *rtr_oai_response_lp_json(const rtr_oai_resp_meta_t *meta, uint32_t n_choices,
                               const char *const *texts, const size_t *text_lens,
                               const char *const *finish_reasons,
                               const rtr_oai_usage_t *usage, const rtr_oai_logprobs_t *lps)
{
    return rtr_oai_response_full_json(meta, n_choices, texts, text_lens, finish_reasons, usage,
                                      lps, NULL);
}

char *rtr_oai_response_full_json(const rtr_oai_resp_meta_t *meta, uint32_t n_choices,
                                 const char *const *texts, const size_t *text_lens,
                                 const char *const *finish_reasons,
                                 const rtr_oai_usage_t *usage, const rtr_oai_logprobs_t *lps,
                                 const rtr_oai_calls_t *calls)
{
    body_t b = { .n = n_choices, .texts = texts, .text_lens = text_lens,
                 .finish_reasons = finish_reasons, .lps = lps, .calls = calls, .usage = usage };
    return write_body(meta, &b);
}

static cJSON *model_obj(const char *id, int64_t created, const char *owned_by)
{
    cJSON *m = cJSON_CreateObject();
    if (m != NULL) {
        cJSON_AddStringToObject(m, "id", id);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)created);
        cJSON_AddStringToObject(m, "owned_by", owned_by);
    }
    return m;
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
        cJSON *m = model_obj(model_ids[i], created, owned_by);
        if (m == NULL)
            break;
        cJSON_AddItemToArray(data, m);
    }
    return print_and_free(root);
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

char *rtr_oai_model_get_json(const char *id_enc, const char *const *model_ids, uint32_t n,
                             int64_t created, const char *owned_by, rtr_oai_error_t *err)
{
    char id[RTR_OAI_MODEL_MAX];
    size_t k = 0;
    bool ok = id_enc != NULL;
    for (const char *p = id_enc; ok && *p != '\0'; p++) {
        int c = (unsigned char)*p;
        if (c == '%') {
            int h = hexval(p[1]), l = h >= 0 ? hexval(p[2]) : -1;
            ok = l >= 0 && (h | l) != 0;
            c = ok ? h * 16 + l : 0;
            p += ok ? 2 : 0;
        }
        ok = ok && k + 1 < sizeof(id);
        if (ok)
            id[k++] = (char)c;
    }
    id[ok ? k : 0] = '\0';
    for (uint32_t i = 0; ok && i < n; i++)
        if (strcmp(id, model_ids[i]) == 0) {
            char *j = print_and_free(model_obj(model_ids[i], created, owned_by));
            if (j == NULL)
                rtr_oai_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
            return j;
        }
    rtr_oai_error_set(err, 404, "invalid_request_error", "model_not_found", "model",
                      "The model '%.200s' does not exist", ok ? id : "");
    return NULL;
}
