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
static cJSON *text_item(const char *text, size_t len)
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

/* A stream chunk with one choice (its "index" set): the root, or NULL. */
static cJSON *chunk_object(const rtr_oai_resp_meta_t *meta, uint32_t index, cJSON **choice_p)
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
    *choice_p = choice;
    return root;
}

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
    cJSON *choice;
    cJSON *root = chunk_object(meta, index, &choice);
    if (root == NULL)
        return NULL;
    if (meta->api == RTR_API_CHAT) {
        cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
        if (with_role)
            cJSON_AddStringToObject(delta, "role", "assistant");
        if (text_len > 0 || finish_reason == NULL)
            cJSON_AddItemToObject(delta, "content", text_item(text, text_len));
    } else {
        cJSON_AddItemToObject(choice, "text", text_item(text, text_len));
    }
    add_logprobs(choice, meta->api, lp);
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
    return rtr_oai_response_lp_json(meta, n_choices, texts, text_lens, finish_reasons, usage,
                                    NULL);
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

char *rtr_oai_tool_chunk_json(const rtr_oai_resp_meta_t *meta, uint32_t index,
                              const rtr_oai_calls_t *calls)
{
    cJSON *choice;
    cJSON *root = chunk_object(meta, index, &choice);
    if (root == NULL)
        return NULL;
    cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
    if (delta != NULL)
        cJSON_AddItemToObject(delta, "tool_calls", calls_json(calls, true));
    add_logprobs(choice, meta->api, NULL);
    add_finish(choice, NULL);
    return print_and_free(root);
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
            bool call = calls != NULL && calls[i].n > 0;
            cJSON_AddItemToObject(msg, "content", call && text_lens[i] == 0
                                                      ? cJSON_CreateNull()
                                                      : text_item(texts[i], text_lens[i]));
            if (call)
                cJSON_AddItemToObject(msg, "tool_calls", calls_json(&calls[i], false));
        } else {
            cJSON_AddItemToObject(choice, "text", text_item(texts[i], text_lens[i]));
        }
        add_logprobs(choice, meta->api, lps != NULL ? &lps[i] : NULL);
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
