/* rtr_responses.c - OpenAI's Responses API (docs/API.md "Responses API"):
 * a Responses body is checked field by field and translated into a chat
 * body for rtr_oai_parse (rtr_fd.h); the flow's events are rendered as the
 * response object and its event stream (response.created ...
 * response.completed). */
#include "rtr_responses.h"
#include "rtr_tools.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parse ------------------------------------------------------------------ */

typedef rtr_fd_ctx_t rctx_t;

/* Content: a string or an array of input_text / output_text parts. */
static bool parts_text(rctx_t *c, const cJSON *v, const char *where, rtr_fd_buf_t *out)
{
    if (!rtr_fd_ptext(c, out, ""))
        return false;
    if (cJSON_IsString(v))
        return rtr_fd_ptext(c, out, v->valuestring);
    if (!cJSON_IsArray(v))
        return rtr_fd_pbad(c, where, "must be a string or an array of input_text parts");
    const cJSON *p;
    int j = 0;
    cJSON_ArrayForEach(p, v) {
        char w[128], q[192];
        snprintf(w, sizeof(w), "%s[%d]", where, j++);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
        if (!cJSON_IsObject(p) || !cJSON_IsString(t))
            return rtr_fd_pbad(c, w, "must be a content part with a string 'type'");
        snprintf(q, sizeof(q), "%s.type", w);
        bool out_text = strcmp(t->valuestring, "output_text") == 0;
        if (strcmp(t->valuestring, "input_text") != 0 && !out_text) {
            if (strncmp(t->valuestring, "input_", 6) == 0 || strcmp(t->valuestring, "refusal") == 0)
                return rtr_fd_punsup(c, q, "text parts only (this model takes text)");
            return rtr_fd_pbad(c, q, "is not a known content part type");
        }
        static const char *const in_keys[] = { "type", "text", NULL };
        static const char *const out_keys[] = { "type", "text", "annotations", "logprobs", NULL };
        if (!rtr_fd_keys(c->err, p, out_text ? out_keys : in_keys, w))
            return false;
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        snprintf(q, sizeof(q), "%s.text", w);
        if (!cJSON_IsString(text))
            return rtr_fd_pbad(c, q, "must be a string");
        if (!rtr_fd_ptext(c, out, text->valuestring))
            return false;
    }
    return true;
}

/* input -> chat messages. function_call items join the assistant message
 * right before them (or start one with content null): parallel calls are
 * one assistant turn; function_call_output items are "tool" messages. */
static bool tr_input(rctx_t *c, const cJSON *in, cJSON *msgs)
{
    if (cJSON_IsString(in)) {
        cJSON *m = rtr_fd_chat_msg(msgs, "user");
        return (m != NULL && cJSON_AddStringToObject(m, "content", in->valuestring)) ||
            rtr_fd_pnomem(c);
    }
    if (!cJSON_IsArray(in) || in->child == NULL)
        return rtr_fd_pbad(c, "input", "must be a string or a non-empty array of items");
    cJSON *asst = NULL; /* the assistant message a function_call joins */
    const cJSON *it;
    int i = 0;
    cJSON_ArrayForEach(it, in) {
        char w[128], p[192];
        snprintf(w, sizeof(w), "input[%d]", i++);
        if (!cJSON_IsObject(it))
            return rtr_fd_pbad(c, w, "must be an object");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
        snprintf(p, sizeof(p), "%s.type", w);
        if (ty != NULL && !cJSON_IsString(ty))
            return rtr_fd_pbad(c, p, "must be a string");
        const char *t = ty != NULL ? ty->valuestring : "message";
        if (strcmp(t, "message") == 0) {
            static const char *const keys[] = { "type", "role", "content", "id", "status", NULL };
            if (!rtr_fd_keys(c->err, it, keys, w))
                return false;
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
            snprintf(p, sizeof(p), "%s.role", w);
            static const char *const roles[] = { "user", "assistant", "system", "developer" };
            bool ok = false;
            for (size_t k = 0; k < 4 && cJSON_IsString(role); k++)
                ok = ok || strcmp(role->valuestring, roles[k]) == 0;
            if (!ok)
                return rtr_fd_pbad(c, p,
                                   "must be \"user\", \"assistant\", \"system\" or \"developer\"");
            rtr_fd_buf_t text = PD_SBUF_INIT;
            snprintf(p, sizeof(p), "%s.content", w);
            ok = parts_text(c, cJSON_GetObjectItemCaseSensitive(it, "content"), p, &text);
            cJSON *m = ok ? rtr_fd_chat_msg(msgs, role->valuestring) : NULL;
            if (ok && (m == NULL || !cJSON_AddStringToObject(m, "content", text.buf)))
                ok = rtr_fd_pnomem(c);
            free(text.buf);
            if (!ok)
                return false;
            asst = strcmp(role->valuestring, "assistant") == 0 ? m : NULL;
        } else if (strcmp(t, "function_call") == 0) {
            static const char *const keys[] = { "type", "call_id", "name", "arguments", "id",
                                                "status", NULL };
            if (!rtr_fd_keys(c->err, it, keys, w))
                return false;
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(it, "arguments");
            snprintf(p, sizeof(p), "%s.call_id", w);
            if (!cJSON_IsString(id) || id->valuestring[0] == '\0' || strlen(id->valuestring) > 256)
                return rtr_fd_pbad(c, p, "must be a string of 1-256 bytes");
            snprintf(p, sizeof(p), "%s.name", w);
            if (!cJSON_IsString(name) || !rtr_tools_name_ok(name->valuestring))
                return rtr_fd_pbad(c, p, "must be 1-64 characters of a-z, A-Z, 0-9, _ and -");
            snprintf(p, sizeof(p), "%s.arguments", w);
            cJSON *a = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
            bool obj = cJSON_IsObject(a);
            cJSON_Delete(a);
            if (!obj)
                return rtr_fd_pbad(c, p, "must be a JSON object as a string");
            if (asst == NULL) {
                asst = rtr_fd_chat_msg(msgs, "assistant");
                if (asst == NULL || !cJSON_AddNullToObject(asst, "content"))
                    return rtr_fd_pnomem(c);
            }
            cJSON *calls = cJSON_GetObjectItemCaseSensitive(asst, "tool_calls");
            if (calls == NULL && (calls = cJSON_AddArrayToObject(asst, "tool_calls")) == NULL)
                return rtr_fd_pnomem(c);
            cJSON *call = cJSON_CreateObject();
            cJSON *fn = cJSON_AddObjectToObject(call, "function");
            if (fn == NULL || !cJSON_AddItemToArray(calls, call)) {
                cJSON_Delete(call);
                return rtr_fd_pnomem(c);
            }
            if (!cJSON_AddStringToObject(call, "id", id->valuestring) ||
                !cJSON_AddStringToObject(call, "type", "function") ||
                !cJSON_AddStringToObject(fn, "name", name->valuestring) ||
                !cJSON_AddStringToObject(fn, "arguments", args->valuestring))
                return rtr_fd_pnomem(c);
        } else if (strcmp(t, "function_call_output") == 0) {
            static const char *const keys[] = { "type", "call_id", "output", "id", "status",
                                                NULL };
            if (!rtr_fd_keys(c->err, it, keys, w))
                return false;
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
            snprintf(p, sizeof(p), "%s.call_id", w);
            if (!cJSON_IsString(id) || strlen(id->valuestring) > 256)
                return rtr_fd_pbad(c, p, "must be a string of at most 256 bytes");
            rtr_fd_buf_t text = PD_SBUF_INIT;
            snprintf(p, sizeof(p), "%s.output", w);
            bool ok = parts_text(c, cJSON_GetObjectItemCaseSensitive(it, "output"), p, &text);
            cJSON *m = ok ? rtr_fd_chat_msg(msgs, "tool") : NULL;
            if (ok && (m == NULL || !cJSON_AddStringToObject(m, "tool_call_id", id->valuestring) ||
                       !cJSON_AddStringToObject(m, "content", text.buf)))
                ok = rtr_fd_pnomem(c);
            free(text.buf);
            if (!ok)
                return false;
            asst = NULL;
        } else if (strcmp(t, "reasoning") == 0 || strcmp(t, "item_reference") == 0 ||
                   strstr(t, "_call") != NULL) {
            return rtr_fd_punsup(c, p, "message, function_call and function_call_output items "
                                     "only (nothing is stored to refer to; no hosted tools)");
        } else {
            return rtr_fd_pbad(c, p, "is not a known item type");
        }
    }
    return true;
}

static bool tr_tools(rctx_t *c, const cJSON *tl, cJSON *chat)
{
    if (!cJSON_IsArray(tl))
        return rtr_fd_pbad(c, "tools", "must be an array of function tools");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    if (out == NULL)
        return rtr_fd_pnomem(c);
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tl) {
        char w[128], p[192];
        snprintf(w, sizeof(w), "tools[%d]", i++);
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
        snprintf(p, sizeof(p), "%s.type", w);
        if (!cJSON_IsObject(t) || !cJSON_IsString(ty))
            return rtr_fd_pbad(c, w, "must be an object with a string 'type'");
        if (strcmp(ty->valuestring, "function") != 0)
            return rtr_fd_punsup(c, p, "function tools only (hosted tools are not run here)");
        static const char *const keys[] = { "type", "name", "description", "parameters",
                                            "strict", NULL };
        if (!rtr_fd_keys(c->err, t, keys, w))
            return false;
        cJSON *fn = cJSON_Duplicate(t, true);
        cJSON *o = cJSON_CreateObject();
        if (fn == NULL || o == NULL || !cJSON_AddItemToArray(out, o)) {
            cJSON_Delete(fn);
            cJSON_Delete(o);
            return rtr_fd_pnomem(c);
        }
        cJSON_DeleteItemFromObjectCaseSensitive(fn, "type");
        /* the chat parser checks the rest and names it (renamed back) */
        if (!cJSON_AddStringToObject(o, "type", "function") ||
            !cJSON_AddItemToObject(o, "function", fn))
            return rtr_fd_pnomem(c);
    }
    return true;
}

static bool tr_tool_choice(rctx_t *c, const cJSON *tc, cJSON *chat)
{
    cJSON *v = NULL;
    if (cJSON_IsString(tc)) {
        if (strcmp(tc->valuestring, "none") != 0 && strcmp(tc->valuestring, "auto") != 0 &&
            strcmp(tc->valuestring, "required") != 0)
            return rtr_fd_pbad(c, "tool_choice", "must be \"none\", \"auto\", \"required\" or "
                                         "{\"type\": \"function\", \"name\": ...}");
        v = cJSON_CreateString(tc->valuestring);
    } else {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(tc, "name");
        if (!cJSON_IsObject(tc) || !cJSON_IsString(ty))
            return rtr_fd_pbad(c, "tool_choice", "must be \"none\", \"auto\", \"required\" or "
                                         "{\"type\": \"function\", \"name\": ...}");
        if (strcmp(ty->valuestring, "function") != 0)
            return rtr_fd_punsup(c, "tool_choice", "a function tool, \"none\", \"auto\" or "
                                                 "\"required\" only");
        static const char *const keys[] = { "type", "name", NULL };
        if (!rtr_fd_keys(c->err, tc, keys, "tool_choice"))
            return false;
        if (!cJSON_IsString(name))
            return rtr_fd_pbad(c, "tool_choice.name", "must be a string");
        v = cJSON_CreateObject();
        cJSON *fn = cJSON_AddObjectToObject(v, "function");
        if (fn == NULL || !cJSON_AddStringToObject(v, "type", "function") ||
            !cJSON_AddStringToObject(fn, "name", name->valuestring)) {
            cJSON_Delete(v);
            return rtr_fd_pnomem(c);
        }
    }
    return (v != NULL && cJSON_AddItemToObject(chat, "tool_choice", v)) || rtr_fd_pnomem(c);
}

/* text: {format: {type: text | json_object | json_schema (+ name, schema,
 * strict, description)}, verbosity} -> response_format. */
static bool tr_text(rctx_t *c, const cJSON *tx, cJSON *chat)
{
    static const char *const keys[] = { "format", "verbosity", NULL };
    if (!cJSON_IsObject(tx))
        return rtr_fd_pbad(c, "text", "must be an object");
    if (!rtr_fd_keys(c->err, tx, keys, "text"))
        return false;
    const cJSON *vb = cJSON_GetObjectItemCaseSensitive(tx, "verbosity");
    if (vb != NULL && !cJSON_IsNull(vb) &&
        !(cJSON_IsString(vb) && strcmp(vb->valuestring, "medium") == 0))
        return rtr_fd_punsup(c, "text.verbosity", "only \"medium\" (the model's own)");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(tx, "format");
    if (f == NULL || cJSON_IsNull(f))
        return true;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(f, "type");
    if (!cJSON_IsObject(f) || !cJSON_IsString(ty))
        return rtr_fd_pbad(c, "text.format", "must be an object with a string 'type'");
    const char *t = ty->valuestring;
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    if (rf == NULL || !cJSON_AddStringToObject(rf, "type", t))
        return rtr_fd_pnomem(c);
    if (strcmp(t, "text") == 0 || strcmp(t, "json_object") == 0) {
        static const char *const k1[] = { "type", NULL };
        return rtr_fd_keys(c->err, f, k1, "text.format");
    }
    if (strcmp(t, "json_schema") != 0)
        return rtr_fd_pbad(c, "text.format.type",
                           "must be \"text\", \"json_object\" or \"json_schema\"");
    static const char *const k2[] = { "type", "name", "schema", "strict", "description", NULL };
    if (!rtr_fd_keys(c->err, f, k2, "text.format"))
        return false;
    cJSON *js = cJSON_Duplicate(f, true);
    if (js == NULL || !cJSON_AddItemToObject(rf, "json_schema", js)) {
        cJSON_Delete(js);
        return rtr_fd_pnomem(c);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(js, "type");
    return true;
}

/* Known fields that are refused unless absent, null or neutral. */
static bool neutral_only(rctx_t *c, const cJSON *root)
{
    static const struct {
        const char *name, *neutral_str, *why;
    } fields[] = {
        { "store", NULL, "responses are not stored (send store: false and the whole "
                         "conversation as input)" },
        { "previous_response_id", NULL, "responses are not stored: send the whole "
                                        "conversation as input" },
        { "conversation", NULL, "conversations are not stored" },
        { "metadata", NULL, "responses are not stored" },
        { "truncation", "disabled", "the input is never truncated: a too-long one is refused" },
        { "include", NULL, "no extra output (logprobs, reasoning, hosted tool results)" },
        { "reasoning", NULL, "no reasoning options for this model" },
        { "background", NULL, "responses are answered in the foreground" },
        { "max_tool_calls", NULL, "no hosted tools" },
        { "top_logprobs", NULL, "logprobs are not served on /v1/responses" },
        { "prompt", NULL, "no stored prompt templates" },
        { "prompt_cache_key", NULL, "the prefix cache needs no key (use cache_salt on "
                                    "/v1/chat/completions to isolate a tenant)" },
        { "stream_options", NULL, "no stream obfuscation" },
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, fields[i].name);
        if (it == NULL || cJSON_IsNull(it) || cJSON_IsFalse(it))
            continue;
        if ((cJSON_IsArray(it) || cJSON_IsObject(it)) && it->child == NULL)
            continue;
        if (cJSON_IsNumber(it) && it->valuedouble == 0)
            continue;
        if (fields[i].neutral_str != NULL && cJSON_IsString(it) &&
            strcmp(it->valuestring, fields[i].neutral_str) == 0)
            continue;
        if (strcmp(fields[i].name, "stream_options") == 0 && cJSON_IsObject(it)) {
            const cJSON *ob = cJSON_GetObjectItemCaseSensitive(it, "include_obfuscation");
            if (cJSON_GetArraySize(it) == 1 && cJSON_IsFalse(ob))
                continue;
        }
        return rtr_fd_punsup(c, fields[i].name, fields[i].why);
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "service_tier");
    if (st != NULL && !cJSON_IsNull(st) &&
        !(cJSON_IsString(st) && (strcmp(st->valuestring, "auto") == 0 ||
                                 strcmp(st->valuestring, "default") == 0)))
        return rtr_fd_punsup(c, "service_tier", "one tier: \"auto\" or \"default\"");
    const cJSON *si = cJSON_GetObjectItemCaseSensitive(root, "safety_identifier");
    if (si != NULL && !cJSON_IsNull(si) &&
        (!cJSON_IsString(si) || strlen(si->valuestring) > 256))
        return rtr_fd_pbad(c, "safety_identifier", "must be a string of at most 256 bytes");
    return true;
}

static const char *const resp_renames[] = {
    ".function.parameters", ".parameters", ".function.name", ".name",
    ".function.description", ".description", ".function.strict", ".strict",
    "response_format.json_schema.", "text.format.", "response_format", "text.format",
    "max_tokens", "max_output_tokens", "messages", "input", NULL,
};

pd_status_t rtr_resp_parse(const char *body, size_t len, const rtr_oai_limits_t *lim,
                           bool count_only, rtr_oai_req_t *req, rtr_oai_error_t *err)
{
    static const char *const keys[] = {
        "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "seed",
        "stream", "tools", "tool_choice", "parallel_tool_calls", "text", "store",
        "previous_response_id", "metadata", "user", "truncation", "include", "reasoning",
        "service_tier", "background", "max_tool_calls", "top_logprobs", "prompt",
        "prompt_cache_key", "safety_identifier", "stream_options", "conversation", NULL,
    };
    memset(req, 0, sizeof(*req));
    if (count_only) {
        rtr_fd_bad(err, NULL, NULL, "/v1/responses has no token count");
        return PD_ERR_BAD_INPUT;
    }
    cJSON *root = NULL;
    pd_status_t s = rtr_oai_json_load(body, len, &root, err);
    if (s != PD_OK)
        return s;
    rctx_t c = { err, false };
    cJSON *chat = cJSON_CreateObject();
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    bool ok = msgs != NULL || rtr_fd_pnomem(&c);
    ok = ok && rtr_fd_keys(err, root, keys, "") && neutral_only(&c, root);
    const cJSON *ins = cJSON_GetObjectItemCaseSensitive(root, "instructions");
    if (ok && ins != NULL && !cJSON_IsNull(ins)) {
        cJSON *m = cJSON_IsString(ins) ? rtr_fd_chat_msg(msgs, "system") : NULL;
        if (!cJSON_IsString(ins))
            ok = rtr_fd_pbad(&c, "instructions", "must be a string");
        else if (m == NULL || !cJSON_AddStringToObject(m, "content", ins->valuestring))
            ok = rtr_fd_pnomem(&c);
    }
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (ok && (in == NULL || cJSON_IsNull(in)))
        ok = rtr_fd_pbad(&c, "input", "is required");
    ok = ok && tr_input(&c, in, msgs);
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(root, "tools");
    ok = ok && (tl == NULL || cJSON_IsNull(tl) || tr_tools(&c, tl, chat));
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    ok = ok && (tc == NULL || cJSON_IsNull(tc) || tr_tool_choice(&c, tc, chat));
    const cJSON *tx = cJSON_GetObjectItemCaseSensitive(root, "text");
    ok = ok && (tx == NULL || cJSON_IsNull(tx) || tr_text(&c, tx, chat));
    /* the same meaning under the chat name: its checks name them (renamed) */
    static const char *const same[][2] = {
        { "model", "model" }, { "max_output_tokens", "max_tokens" },
        { "temperature", "temperature" }, { "top_p", "top_p" }, { "stream", "stream" },
        { "parallel_tool_calls", "parallel_tool_calls" }, { "user", "user" },
    };
    for (size_t i = 0; ok && i < sizeof(same) / sizeof(same[0]); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, same[i][0]);
        if (v != NULL && !cJSON_AddItemToObject(chat, same[i][1], cJSON_Duplicate(v, true)))
            ok = rtr_fd_pnomem(&c);
    }
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
    size_t seed_len = 0;
    const char *seed_raw = NULL;
    if (ok && seed != NULL && !cJSON_IsNull(seed)) {
        seed_raw = rtr_oai_raw_member(body, len, "seed", &seed_len);
        if (!cJSON_IsNumber(seed) || seed_raw == NULL || seed_len == 0)
            ok = rtr_fd_bad(err, NULL, "seed", "'seed' must be an integer in [-2^63, 2^64)");
    }
    if (!ok) {
        cJSON_Delete(chat);
        cJSON_Delete(root);
        if (c.oom) {
            rtr_oai_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
            return PD_ERR_NO_MEMORY;
        }
        return PD_ERR_BAD_INPUT;
    }
    bool has_ins = ins != NULL && cJSON_IsString(ins);
    s = rtr_fd_parse_chat(chat, RTR_API_RESPONSES, seed_raw, seed_len, lim, resp_renames, req,
                          err);
    if (s == PD_OK)
        req->instructions_first = has_ins && req->n_messages > 0;
    cJSON_Delete(root);
    return s;
}

/* ---- render ------------------------------------------------------------------ */

static const char *id_tail(const rtr_fd_answer_t *a)
{
    const char *id = a->meta->id;
    return strncmp(id, "resp_", 5) == 0 ? id + 5 : id;
}

static cJSON *usage_object(const rtr_fd_answer_t *a)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", a->usage.prompt_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "input_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", a->usage.cached_tokens);
    cJSON_AddNumberToObject(u, "output_tokens", a->usage.completion_tokens);
    d = cJSON_AddObjectToObject(u, "output_tokens_details");
    cJSON_AddNumberToObject(d, "reasoning_tokens", 0);
    cJSON_AddNumberToObject(u, "total_tokens",
                            (double)a->usage.prompt_tokens + a->usage.completion_tokens);
    return u;
}

static cJSON *tools_array(const rtr_oai_req_t *o)
{
    cJSON *arr = cJSON_CreateArray();
    for (uint32_t i = 0; o != NULL && i < o->n_tools; i++) {
        cJSON *def = cJSON_Parse(o->tools[i].def);
        cJSON *fn = cJSON_DetachItemFromObjectCaseSensitive(def, "function");
        cJSON_Delete(def);
        if (fn == NULL)
            continue;
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "type", "function");
        cJSON *it;
        while ((it = fn->child) != NULL) {
            cJSON_DetachItemViaPointer(fn, it);
            cJSON_AddItemToObject(t, it->string, it);
        }
        cJSON_Delete(fn);
        cJSON_AddBoolToObject(t, "strict", false);
        cJSON_AddItemToArray(arr, t);
    }
    return arr;
}

static cJSON *tool_choice_item(const rtr_oai_req_t *o)
{
    if (o->tool_choice == RTR_OAI_TOOLS_NAMED && o->tool_named < o->n_tools) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "type", "function");
        cJSON_AddStringToObject(t, "name", o->tools[o->tool_named].name);
        return t;
    }
    return cJSON_CreateString(o->tool_choice == RTR_OAI_TOOLS_REQUIRED ? "required"
                              : o->tool_choice == RTR_OAI_TOOLS_NONE && o->n_tools > 0 ? "none"
                                                                                        : "auto");
}

/* The response object; status "in_progress" has no usage yet. */
static cJSON *response_object(const rtr_fd_answer_t *a, const char *status,
                              const rtr_oai_error_t *err)
{
    const rtr_oai_req_t *o = a->req;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", a->meta->id);
    cJSON_AddStringToObject(r, "object", "response");
    cJSON_AddNumberToObject(r, "created_at", (double)a->meta->created);
    cJSON_AddStringToObject(r, "status", status);
    cJSON_AddBoolToObject(r, "background", false);
    if (err != NULL) {
        cJSON *e = cJSON_AddObjectToObject(r, "error");
        cJSON_AddStringToObject(e, "code", err->code != NULL ? err->code : "server_error");
        cJSON_AddStringToObject(e, "message", err->message);
    } else {
        cJSON_AddNullToObject(r, "error");
    }
    if (strcmp(status, "incomplete") == 0) {
        cJSON *d = cJSON_AddObjectToObject(r, "incomplete_details");
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    } else {
        cJSON_AddNullToObject(r, "incomplete_details");
    }
    if (o->instructions_first && o->messages[0].content != NULL)
        cJSON_AddStringToObject(r, "instructions", o->messages[0].content);
    else
        cJSON_AddNullToObject(r, "instructions");
    cJSON_AddNumberToObject(r, "max_output_tokens", o->max_tokens);
    cJSON_AddStringToObject(r, "model", a->meta->model);
    cJSON_AddArrayToObject(r, "output");
    cJSON_AddBoolToObject(r, "parallel_tool_calls", !o->single_call);
    cJSON_AddNullToObject(r, "previous_response_id");
    cJSON *rs = cJSON_AddObjectToObject(r, "reasoning");
    cJSON_AddNullToObject(rs, "effort");
    cJSON_AddNullToObject(rs, "summary");
    cJSON_AddStringToObject(r, "service_tier", "default");
    cJSON_AddBoolToObject(r, "store", false);
    cJSON_AddNumberToObject(r, "temperature", o->temperature);
    cJSON *tx = cJSON_AddObjectToObject(r, "text");
    cJSON *f = cJSON_AddObjectToObject(tx, "format");
    cJSON_AddStringToObject(f, "type", o->gram_kind == RTR_OAI_GRAM_JSON_OBJECT ? "json_object"
                                       : o->gram_kind == RTR_OAI_GRAM_JSON_SCHEMA &&
                                                 o->tool_choice != RTR_OAI_TOOLS_REQUIRED &&
                                                 o->tool_choice != RTR_OAI_TOOLS_NAMED
                                           ? "json_schema" : "text");
    cJSON_AddItemToObject(r, "tool_choice", tool_choice_item(o));
    cJSON_AddItemToObject(r, "tools", tools_array(o));
    cJSON_AddNumberToObject(r, "top_p", o->top_p);
    cJSON_AddStringToObject(r, "truncation", "disabled");
    if (strcmp(status, "in_progress") == 0)
        cJSON_AddNullToObject(r, "usage");
    else
        cJSON_AddItemToObject(r, "usage", usage_object(a));
    cJSON_AddNullToObject(r, "user");
    cJSON_AddObjectToObject(r, "metadata");
    return r;
}

static cJSON *text_part(const char *text, size_t len)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    cJSON_AddArrayToObject(p, "annotations");
    cJSON_AddArrayToObject(p, "logprobs");
    cJSON_AddItemToObject(p, "text", rtr_oai_text_item(text, len));
    return p;
}

/* The message item (text NULL: no content yet). */
static cJSON *message_item(const rtr_fd_answer_t *a, const char *status, const char *text,
                           size_t len)
{
    char id[96];
    snprintf(id, sizeof(id), "msg_%s", id_tail(a));
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "status", status);
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON *c = cJSON_AddArrayToObject(m, "content");
    if (text != NULL)
        cJSON_AddItemToArray(c, text_part(text, len));
    return m;
}

static void call_item_id(char *buf, size_t cap, const rtr_oai_call_t *call)
{
    const char *id = call->id != NULL ? call->id : "";
    snprintf(buf, cap, "fc_%s", strncmp(id, "call_", 5) == 0 ? id + 5 : id);
}

static cJSON *call_item(const rtr_oai_call_t *call, const char *status, bool with_args)
{
    char id[300];
    call_item_id(id, sizeof(id), call);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "type", "function_call");
    cJSON_AddStringToObject(m, "status", status);
    cJSON_AddStringToObject(m, "call_id", call->id != NULL ? call->id : "");
    cJSON_AddStringToObject(m, "name", call->name);
    cJSON_AddStringToObject(m, "arguments",
                            with_args && call->arguments != NULL ? call->arguments : "");
    return m;
}

static const char *final_status(const rtr_fd_answer_t *a)
{
    return a->finish != NULL && strcmp(a->finish, "length") == 0 ? "incomplete" : "completed";
}

/* output: the message (when there is text, or nothing else), then the calls */
static void add_output(cJSON *r, const rtr_fd_answer_t *a, const char *text, size_t len,
                       bool message)
{
    cJSON *out = cJSON_GetObjectItemCaseSensitive(r, "output");
    const char *st = final_status(a);
    if (message)
        cJSON_AddItemToArray(out, message_item(a, st, text, len));
    for (uint32_t i = 0; i < a->calls.n; i++)
        cJSON_AddItemToArray(out, call_item(&a->calls.v[i], "completed", true));
}

static char *resp_body(const rtr_fd_answer_t *a)
{
    cJSON *r = response_object(a, final_status(a), NULL);
    add_output(r, a, a->text, a->text_len, a->text_len > 0 || a->calls.n == 0);
    return rtr_fd_print(r);
}

/* An event: {"type": T, "sequence_number": N, ...e}. */
static cJSON *ev_new(rtr_fd_stream_t *st, const char *type)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNumberToObject(e, "sequence_number", st->seq++);
    return e;
}

static void ev_item_ref(cJSON *e, const char *item_id, uint32_t output_index)
{
    cJSON_AddStringToObject(e, "item_id", item_id);
    cJSON_AddNumberToObject(e, "output_index", output_index);
}

static char *resp_stream_head(rtr_fd_stream_t *st, const rtr_fd_answer_t *a)
{
    rtr_fd_buf_t b = PD_SBUF_INIT;
    cJSON *e = ev_new(st, "response.created");
    cJSON_AddItemToObject(e, "response", response_object(a, "in_progress", NULL));
    rtr_fd_event(&b, "response.created", e);
    e = ev_new(st, "response.in_progress");
    cJSON_AddItemToObject(e, "response", response_object(a, "in_progress", NULL));
    rtr_fd_event(&b, "response.in_progress", e);
    return rtr_fd_buf_take(&b);
}

static void open_message(rtr_fd_buf_t *b, rtr_fd_stream_t *st, const rtr_fd_answer_t *a)
{
    char id[96];
    snprintf(id, sizeof(id), "msg_%s", id_tail(a));
    st->text_open = true;
    cJSON *e = ev_new(st, "response.output_item.added");
    cJSON_AddNumberToObject(e, "output_index", st->n_items);
    cJSON_AddItemToObject(e, "item", message_item(a, "in_progress", NULL, 0));
    rtr_fd_event(b, "response.output_item.added", e);
    e = ev_new(st, "response.content_part.added");
    ev_item_ref(e, id, st->n_items);
    cJSON_AddNumberToObject(e, "content_index", 0);
    cJSON_AddItemToObject(e, "part", text_part("", 0));
    rtr_fd_event(b, "response.content_part.added", e);
}

static char *resp_stream_text(rtr_fd_stream_t *st, const rtr_fd_answer_t *a, const char *text,
                              size_t len)
{
    rtr_fd_buf_t b = PD_SBUF_INIT;
    if (!st->text_open)
        open_message(&b, st, a);
    char id[96];
    snprintf(id, sizeof(id), "msg_%s", id_tail(a));
    cJSON *e = ev_new(st, "response.output_text.delta");
    ev_item_ref(e, id, st->n_items);
    cJSON_AddNumberToObject(e, "content_index", 0);
    cJSON_AddItemToObject(e, "delta", rtr_oai_text_item(text, len));
    cJSON_AddArrayToObject(e, "logprobs");
    rtr_fd_event(&b, "response.output_text.delta", e);
    rtr_fd_text_keep(st, text, len);
    return rtr_fd_buf_take(&b);
}

static char *resp_stream_end(rtr_fd_stream_t *st, const rtr_fd_answer_t *a)
{
    rtr_fd_buf_t b = PD_SBUF_INIT;
    bool message = st->text_open || a->calls.n == 0;
    if (message && !st->text_open)
        open_message(&b, st, a); /* an empty answer is an empty message */
    const char *text = st->text != NULL ? st->text : "";
    if (st->text_open) {
        char id[96];
        snprintf(id, sizeof(id), "msg_%s", id_tail(a));
        cJSON *e = ev_new(st, "response.output_text.done");
        ev_item_ref(e, id, st->n_items);
        cJSON_AddNumberToObject(e, "content_index", 0);
        cJSON_AddItemToObject(e, "text", rtr_oai_text_item(text, st->text_len));
        cJSON_AddArrayToObject(e, "logprobs");
        rtr_fd_event(&b, "response.output_text.done", e);
        e = ev_new(st, "response.content_part.done");
        ev_item_ref(e, id, st->n_items);
        cJSON_AddNumberToObject(e, "content_index", 0);
        cJSON_AddItemToObject(e, "part", text_part(text, st->text_len));
        rtr_fd_event(&b, "response.content_part.done", e);
        e = ev_new(st, "response.output_item.done");
        cJSON_AddNumberToObject(e, "output_index", st->n_items++);
        cJSON_AddItemToObject(e, "item", message_item(a, final_status(a), text, st->text_len));
        rtr_fd_event(&b, "response.output_item.done", e);
        st->text_open = false;
    }
    for (uint32_t i = 0; i < a->calls.n; i++) {
        const rtr_oai_call_t *call = &a->calls.v[i];
        char id[300];
        call_item_id(id, sizeof(id), call);
        cJSON *e = ev_new(st, "response.output_item.added");
        cJSON_AddNumberToObject(e, "output_index", st->n_items);
        cJSON_AddItemToObject(e, "item", call_item(call, "in_progress", false));
        rtr_fd_event(&b, "response.output_item.added", e);
        e = ev_new(st, "response.function_call_arguments.delta");
        ev_item_ref(e, id, st->n_items);
        cJSON_AddStringToObject(e, "delta", call->arguments != NULL ? call->arguments : "");
        rtr_fd_event(&b, "response.function_call_arguments.delta", e);
        e = ev_new(st, "response.function_call_arguments.done");
        ev_item_ref(e, id, st->n_items);
        cJSON_AddStringToObject(e, "name", call->name);
        cJSON_AddStringToObject(e, "arguments", call->arguments != NULL ? call->arguments : "");
        rtr_fd_event(&b, "response.function_call_arguments.done", e);
        e = ev_new(st, "response.output_item.done");
        cJSON_AddNumberToObject(e, "output_index", st->n_items++);
        cJSON_AddItemToObject(e, "item", call_item(call, "completed", true));
        rtr_fd_event(&b, "response.output_item.done", e);
    }
    const char *status = final_status(a);
    const char *type = strcmp(status, "incomplete") == 0 ? "response.incomplete"
                                                         : "response.completed";
    cJSON *r = response_object(a, status, NULL);
    add_output(r, a, text, st->text_len, message);
    cJSON *e = ev_new(st, type);
    cJSON_AddItemToObject(e, "response", r);
    rtr_fd_event(&b, type, e);
    return rtr_fd_buf_take(&b);
}

static char *resp_stream_error(rtr_fd_stream_t *st, const rtr_fd_answer_t *a,
                               const rtr_oai_error_t *err)
{
    rtr_fd_buf_t b = PD_SBUF_INIT;
    cJSON *e = ev_new(st, "response.failed");
    cJSON_AddItemToObject(e, "response", response_object(a, "failed", err));
    rtr_fd_event(&b, "response.failed", e);
    return rtr_fd_buf_take(&b);
}

const rtr_fd_api_t rtr_resp_api = {
    .endpoint = "/v1/responses",
    .resp_prefix = "resp_",
    .prompt_param = "input",
    .parse = rtr_resp_parse,
    .stream_head = resp_stream_head,
    .stream_text = resp_stream_text,
    .stream_end = resp_stream_end,
    .stream_error = resp_stream_error,
    .body = resp_body,
    .error_body = rtr_oai_error_json,
};
