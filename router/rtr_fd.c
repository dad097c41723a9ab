/* rtr_fd.c - what the event front doors share (rtr_fd.h): the table
 * lookup, SSE event framing, strict-key checks and the hand-over of a
 * translated body to the chat parser. */
#include "rtr_fd.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const rtr_fd_api_t *rtr_fd_api(rtr_api_t api)
{
    switch (api) {
    case RTR_API_MESSAGES:
        return &rtr_anth_api;
    case RTR_API_RESPONSES:
        return &rtr_resp_api;
    default:
        return NULL;
    }
}

void rtr_fd_stream_free(rtr_fd_stream_t *st)
{
    if (st == NULL)
        return;
    free(st->text);
    memset(st, 0, sizeof(*st));
}

char *rtr_fd_print(cJSON *o)
{
    if (o == NULL)
        return NULL;
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

void rtr_fd_event(rtr_fd_buf_t *b, const char *type, cJSON *data)
{
    char *j = rtr_fd_print(data); /* compact: no newline inside */
    if (j == NULL) {
        b->failed = 1;
        return;
    }
    pd_sbuf_printf(b, "event: %s\ndata: %s\n\n", type, j);
    cJSON_free(j);
}

char *rtr_fd_buf_take(rtr_fd_buf_t *b)
{
    return pd_sbuf_finish(b, NULL);
}

void rtr_fd_text_keep(rtr_fd_stream_t *st, const char *text, size_t len)
{
    if (st->text_len + len + 1 > st->text_cap) {
        size_t cap = st->text_cap ? st->text_cap : 256;
        while (cap < st->text_len + len + 1)
            cap *= 2;
        char *t = realloc(st->text, cap);
        if (t == NULL)
            return;
        st->text = t;
        st->text_cap = cap;
    }
    memcpy(st->text + st->text_len, text, len);
    st->text_len += len;
    st->text[st->text_len] = '\0';
}

bool rtr_fd_bad(rtr_oai_error_t *err, const char *code, const char *param, const char *fmt, ...)
{
    memset(err, 0, sizeof(*err));
    err->http_status = 400;
    err->type = "invalid_request_error";
    err->code = code;
    if (param != NULL) {
        snprintf(err->param_buf, sizeof(err->param_buf), "%s", param);
        err->param = err->param_buf;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return false;
}

bool rtr_fd_keys(rtr_oai_error_t *err, const cJSON *obj, const char *const *keys,
                 const char *where)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, obj) {
        const char *k = it->string != NULL ? it->string : "";
        bool ok = false;
        for (size_t i = 0; keys[i] != NULL && !ok; i++)
            ok = strcmp(k, keys[i]) == 0;
        if (ok)
            continue;
        char p[192];
        snprintf(p, sizeof(p), "%s%s%.40s", where, where[0] ? "." : "", k);
        return rtr_fd_bad(err, "unknown_parameter", p, "'%s' is not a known field", p);
    }
    return true;
}

/* Replace the first `from` in s (cap bytes) by `to`. */
static void replace_in(char *s, size_t cap, const char *from, const char *to)
{
    char *at = strstr(s, from);
    if (at == NULL)
        return;
    char rest[512];
    snprintf(rest, sizeof(rest), "%s", at + strlen(from));
    snprintf(at, cap - (size_t)(at - s), "%s%s", to, rest);
}

pd_status_t rtr_fd_parse_chat(cJSON *chat, rtr_api_t api, const char *seed_raw,
                              size_t seed_len, const rtr_oai_limits_t *lim,
                              const char *const *renames, rtr_oai_req_t *req,
                              rtr_oai_error_t *err)
{
    memset(req, 0, sizeof(*req));
    if (seed_raw != NULL && seed_len > 0 && seed_len < 40) {
        char txt[40];
        memcpy(txt, seed_raw, seed_len);
        txt[seed_len] = '\0';
        /* the number's own text: exact beyond 2^53 (rtr_oai_raw_member) */
        cJSON_AddItemToObject(chat, "seed", cJSON_CreateRaw(txt));
    }
    char *text = rtr_fd_print(chat);
    if (text == NULL) {
        rtr_oai_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return PD_ERR_NO_MEMORY;
    }
    pd_status_t s = rtr_oai_parse(RTR_API_CHAT, text, strlen(text), lim, req, err);
    cJSON_free(text);
    if (s == PD_OK) {
        req->api = api;
        return PD_OK;
    }
    /* an error about a field this API names otherwise: told in its words */
    bool ours = false;
    for (size_t i = 0; renames != NULL && renames[i] != NULL; i += 2)
        ours = ours || (err->param != NULL && strstr(err->param, renames[i]) != NULL);
    if (!ours)
        return s;
    if (err->param != err->param_buf) {
        snprintf(err->param_buf, sizeof(err->param_buf), "%s", err->param);
        err->param = err->param_buf;
    }
    for (size_t i = 0; renames[i] != NULL; i += 2) {
        replace_in(err->param_buf, sizeof(err->param_buf), renames[i], renames[i + 1]);
        replace_in(err->message, sizeof(err->message), renames[i], renames[i + 1]);
    }
    return s;
}

cJSON *rtr_fd_args_object(const char *arguments)
{
    cJSON *o = arguments != NULL ? cJSON_Parse(arguments) : NULL;
    if (cJSON_IsObject(o))
        return o;
    cJSON_Delete(o);
    return cJSON_CreateObject();
}

bool rtr_fd_pbad(rtr_fd_ctx_t *c, const char *param, const char *detail)
{
    return rtr_fd_bad(c->err, NULL, param, "'%s' %s", param, detail);
}

bool rtr_fd_punsup(rtr_fd_ctx_t *c, const char *param, const char *why)
{
    return rtr_fd_bad(c->err, "unsupported_parameter", param,
                      "'%s' is not supported by this server: %s", param, why);
}

bool rtr_fd_pnomem(rtr_fd_ctx_t *c)
{
    c->oom = true;
    return false;
}

bool rtr_fd_ptext(rtr_fd_ctx_t *c, rtr_fd_buf_t *b, const char *s)
{
    pd_sbuf_append(b, s, strlen(s));
    return !b->failed || rtr_fd_pnomem(c);
}

cJSON *rtr_fd_chat_msg(cJSON *msgs, const char *role)
{
    cJSON *m = cJSON_CreateObject();
    if (m == NULL || !cJSON_AddItemToArray(msgs, m)) {
        cJSON_Delete(m);
        return NULL;
    }
    return cJSON_AddStringToObject(m, "role", role) != NULL ? m : NULL;
}
