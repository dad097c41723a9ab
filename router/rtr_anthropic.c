/* rtr_anthropic.c - Anthropic's Messages API (docs/API.md "Messages API"):
 * a Messages body is checked field by field and translated into a chat
 * body for rtr_oai_parse (rtr_fd.h); the flow's events are rendered as
 * Anthropic's message object and its event stream. */
#include "rtr_anthropic.h"
#include "rtr_tools.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"

/* ---- parse ------------------------------------------------------------------ */

typedef rtr_fd_ctx_t actx_t;

/* cache_control (prompt caching hints): accepted, nothing to do. The
 * router's prefix cache keeps every prompt's blocks without being asked. */
static bool cache_control_ok(actx_t *c, const cJSON *blk, const char *where)
{
    const cJSON *cc = cJSON_GetObjectItemCaseSensitive(blk, "cache_control");
    if (cc == NULL || cJSON_IsNull(cc))
        return true;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cc, "type");
    const cJSON *ttl = cJSON_GetObjectItemCaseSensitive(cc, "ttl");
    char p[192];
    snprintf(p, sizeof(p), "%s.cache_control", where);
    if (!cJSON_IsObject(cc) || !cJSON_IsString(t) || strcmp(t->valuestring, "ephemeral") != 0 ||
        (ttl != NULL && !cJSON_IsString(ttl)) ||
        cJSON_GetArraySize(cc) != (ttl != NULL ? 2 : 1))
        return rtr_fd_pbad(c, p, "must be {\"type\": \"ephemeral\"} (optionally with \"ttl\")");
    return true;
}

/* A {"type":"text","text":...} block (cache_control, citations: null or []). */
static bool text_block(actx_t *c, const cJSON *b, const char *where, rtr_fd_buf_t *out)
{
    static const char *const keys[] = { "type", "text", "cache_control", "citations", NULL };
    if (!rtr_fd_keys(c->err, b, keys, where))
        return false;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "text");
    char p[192];
    snprintf(p, sizeof(p), "%s.text", where);
    if (!cJSON_IsString(t))
        return rtr_fd_pbad(c, p, "must be a string");
    const cJSON *ci = cJSON_GetObjectItemCaseSensitive(b, "citations");
    if (ci != NULL && !cJSON_IsNull(ci) && !(cJSON_IsArray(ci) && ci->child == NULL)) {
        snprintf(p, sizeof(p), "%s.citations", where);
        return rtr_fd_punsup(c, p, "citations are not produced by this server");
    }
    return cache_control_ok(c, b, where) && rtr_fd_ptext(c, out, t->valuestring);
}

/* Text as a string or an array of text blocks (system, tool_result content). */
static bool text_content(actx_t *c, const cJSON *v, const char *where, rtr_fd_buf_t *out)
{
    if (v == NULL || cJSON_IsNull(v))
        return rtr_fd_ptext(c, out, "");
    if (cJSON_IsString(v))
        return rtr_fd_ptext(c, out, v->valuestring);
    if (!cJSON_IsArray(v))
        return rtr_fd_pbad(c, where, "must be a string or an array of text blocks");
    const cJSON *b;
    int j = 0;
    bool ok = rtr_fd_ptext(c, out, "");
    cJSON_ArrayForEach(b, v) {
        char w[128];
        snprintf(w, sizeof(w), "%s[%d]", where, j++);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type");
        if (!cJSON_IsObject(b) || !cJSON_IsString(t))
            return rtr_fd_pbad(c, w, "must be a content block with a string 'type'");
        if (strcmp(t->valuestring, "text") != 0) {
            char p[192];
            snprintf(p, sizeof(p), "%s.type", w);
            return rtr_fd_punsup(c, p,
                                 "only text blocks are accepted here (this model takes text)");
        }
        ok = ok && text_block(c, b, w, out);
    }
    return ok;
}

/* One tool_use block -> a chat tool call appended to calls. */
static bool tool_use(actx_t *c, const cJSON *b, const char *w, cJSON *calls)
{
    static const char *const keys[] = { "type", "id", "name", "input", "cache_control", NULL };
    if (!rtr_fd_keys(c->err, b, keys, w))
        return false;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "name");
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(b, "input");
    char p[192];
    if (!cJSON_IsString(id) || id->valuestring[0] == '\0' || strlen(id->valuestring) > 256) {
        snprintf(p, sizeof(p), "%s.id", w);
        return rtr_fd_pbad(c, p, "must be a string of 1-256 bytes");
    }
    if (!cJSON_IsString(name) || !rtr_tools_name_ok(name->valuestring)) {
        snprintf(p, sizeof(p), "%s.name", w);
        return rtr_fd_pbad(c, p, "must be 1-64 characters of a-z, A-Z, 0-9, _ and -");
    }
    if (!cJSON_IsObject(input)) {
        snprintf(p, sizeof(p), "%s.input", w);
        return rtr_fd_pbad(c, p, "must be an object");
    }
    if (!cache_control_ok(c, b, w))
        return false;
    char *args = cJSON_PrintUnformatted(input);
    cJSON *call = cJSON_CreateObject();
    cJSON *fn = cJSON_AddObjectToObject(call, "function");
    if (args == NULL || fn == NULL || !cJSON_AddItemToArray(calls, call)) {
        cJSON_free(args);
        cJSON_Delete(call);
        return rtr_fd_pnomem(c);
    }
    bool ok = cJSON_AddStringToObject(call, "id", id->valuestring) &&
              cJSON_AddStringToObject(call, "type", "function") &&
              cJSON_AddStringToObject(fn, "name", name->valuestring) &&
              cJSON_AddStringToObject(fn, "arguments", args);
    cJSON_free(args);
    return ok || rtr_fd_pnomem(c);
}

/* One tool_result block -> a chat "tool" message. */
static bool tool_result(actx_t *c, const cJSON *b, const char *w, cJSON *msgs)
{
    static const char *const keys[] = { "type", "tool_use_id", "content", "is_error",
                                        "cache_control", NULL };
    if (!rtr_fd_keys(c->err, b, keys, w))
        return false;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "tool_use_id");
    const cJSON *ie = cJSON_GetObjectItemCaseSensitive(b, "is_error");
    char p[192];
    if (!cJSON_IsString(id) || strlen(id->valuestring) > 256) {
        snprintf(p, sizeof(p), "%s.tool_use_id", w);
        return rtr_fd_pbad(c, p, "must be a string of at most 256 bytes");
    }
    if (ie != NULL && !cJSON_IsNull(ie) && !cJSON_IsBool(ie)) {
        snprintf(p, sizeof(p), "%s.is_error", w);
        return rtr_fd_pbad(c, p, "must be a boolean");
    }
    if (!cache_control_ok(c, b, w))
        return false;
    rtr_fd_buf_t t = PD_SBUF_INIT;
    /* an error result says so in its text: the chat templates have no flag */
    bool ok = rtr_fd_ptext(c, &t, cJSON_IsTrue(ie) ? "Error: " : "");
    snprintf(p, sizeof(p), "%s.content", w);
    ok = ok && text_content(c, cJSON_GetObjectItemCaseSensitive(b, "content"), p, &t);
    cJSON *m = ok ? rtr_fd_chat_msg(msgs, "tool") : NULL;
    if (ok && (m == NULL || !cJSON_AddStringToObject(m, "tool_call_id", id->valuestring) ||
               !cJSON_AddStringToObject(m, "content", t.buf)))
        ok = rtr_fd_pnomem(c);
    free(t.buf);
    return ok;
}

/* messages -> chat messages: a user turn's tool_result blocks become
 * "tool" messages (in order, text between them a user message); an
 * assistant turn's tool_use blocks its tool_calls. */
static bool tr_messages(actx_t *c, const cJSON *ms, cJSON *msgs)
{
    if (!cJSON_IsArray(ms) || ms->child == NULL)
        return rtr_fd_pbad(c, "messages", "must be a non-empty array");
    int n = cJSON_GetArraySize(ms), i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        char w[48];
        snprintf(w, sizeof(w), "messages[%d]", i);
        static const char *const keys[] = { "role", "content", NULL };
        if (!cJSON_IsObject(m))
            return rtr_fd_pbad(c, w, "must be an object with 'role' and 'content'");
        if (!rtr_fd_keys(c->err, m, keys, w))
            return false;
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(m, "content");
        char p[192];
        snprintf(p, sizeof(p), "%s.role", w);
        if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") != 0 &&
                                      strcmp(role->valuestring, "assistant") != 0))
            return rtr_fd_pbad(c, p, "must be \"user\" or \"assistant\" (the system prompt "
                                        "is the top-level 'system')");
        bool asst = role->valuestring[0] == 'a';
        if (asst && i == n - 1)
            return rtr_fd_punsup(c, w, "a final assistant message (a prefill the answer would "
                                     "continue) is not supported: the answer is a new turn");
        snprintf(p, sizeof(p), "%s.content", w);
        if (cJSON_IsString(ct)) {
            cJSON *o = rtr_fd_chat_msg(msgs, role->valuestring);
            if (o == NULL || !cJSON_AddStringToObject(o, "content", ct->valuestring))
                return rtr_fd_pnomem(c);
            i++;
            continue;
        }
        if (!cJSON_IsArray(ct))
            return rtr_fd_pbad(c, p, "must be a string or an array of content blocks");
        rtr_fd_buf_t text = PD_SBUF_INIT;
        bool have_text = false, had_result = false, ok = true;
        cJSON *calls = asst ? cJSON_CreateArray() : NULL;
        if (asst && calls == NULL)
            return rtr_fd_pnomem(c);
        const cJSON *b;
        int j = 0;
        cJSON_ArrayForEach(b, ct) {
            char bw[128];
            snprintf(bw, sizeof(bw), "%s.content[%d]", w, j++);
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type");
            if (!cJSON_IsObject(b) || !cJSON_IsString(t)) {
                ok = rtr_fd_pbad(c, bw, "must be a content block with a string 'type'");
                break;
            }
            const char *ty = t->valuestring;
            char tp[192];
            snprintf(tp, sizeof(tp), "%s.type", bw);
            if (strcmp(ty, "text") == 0) {
                ok = text_block(c, b, bw, &text);
                have_text = true;
            } else if (strcmp(ty, "tool_use") == 0 && asst) {
                ok = tool_use(c, b, bw, calls);
            } else if (strcmp(ty, "tool_result") == 0 && !asst) {
                if (have_text) { /* the text before it is a turn of its own */
                    cJSON *o = rtr_fd_chat_msg(msgs, "user");
                    ok = o != NULL && cJSON_AddStringToObject(o, "content", text.buf) != NULL;
                    if (!ok)
                        rtr_fd_pnomem(c);
                    text.len = 0; /* reuse: the next block starts empty */
                    if (text.buf != NULL)
                        text.buf[0] = '\0';
                    have_text = false;
                }
                ok = ok && tool_result(c, b, bw, msgs);
                had_result = true;
            } else if (strcmp(ty, "tool_use") == 0 || strcmp(ty, "tool_result") == 0) {
                ok = rtr_fd_pbad(c, tp, asst ? "\"tool_result\" belongs in a user message"
                                                : "\"tool_use\" belongs in an assistant message");
            } else if (strcmp(ty, "image") == 0 || strcmp(ty, "document") == 0 ||
                       strcmp(ty, "thinking") == 0 || strcmp(ty, "redacted_thinking") == 0 ||
                       strcmp(ty, "search_result") == 0 || strcmp(ty, "server_tool_use") == 0 ||
                       strcmp(ty, "web_search_tool_result") == 0 ||
                       strcmp(ty, "container_upload") == 0) {
                ok = rtr_fd_punsup(c, tp, "text, tool_use and tool_result blocks only (this model "
                                        "takes text; no thinking or server tools)");
            } else {
                ok = rtr_fd_pbad(c, tp, "is not a known content block type");
            }
            if (!ok)
                break;
        }
        if (ok && asst) {
            cJSON *o = rtr_fd_chat_msg(msgs, "assistant");
            bool has_calls = cJSON_GetArraySize(calls) > 0;
            ok = o != NULL &&
                 (have_text ? cJSON_AddStringToObject(o, "content", text.buf) != NULL
                  : has_calls ? cJSON_AddNullToObject(o, "content") != NULL
                              : cJSON_AddStringToObject(o, "content", "") != NULL);
            if (ok && has_calls) {
                cJSON_AddItemToObject(o, "tool_calls", calls);
                calls = NULL;
            }
            if (!ok)
                rtr_fd_pnomem(c);
        } else if (ok && (have_text || !had_result)) {
            cJSON *o = rtr_fd_chat_msg(msgs, "user");
            ok = o != NULL && cJSON_AddStringToObject(o, "content", text.buf ? text.buf : "");
            if (!ok)
                rtr_fd_pnomem(c);
        }
        cJSON_Delete(calls);
        free(text.buf);
        if (!ok)
            return false;
        i++;
    }
    return true;
}

static bool tr_tools(actx_t *c, const cJSON *tl, cJSON *chat)
{
    if (!cJSON_IsArray(tl))
        return rtr_fd_pbad(c, "tools", "must be an array of tool definitions");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    if (out == NULL)
        return rtr_fd_pnomem(c);
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tl) {
        char w[128], p[192];
        snprintf(w, sizeof(w), "tools[%d]", i++);
        static const char *const keys[] = { "name", "description", "input_schema",
                                            "cache_control", "type", NULL };
        if (!cJSON_IsObject(t))
            return rtr_fd_pbad(c, w, "must be an object");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
        snprintf(p, sizeof(p), "%s.type", w);
        if (ty != NULL && !cJSON_IsNull(ty) &&
            !(cJSON_IsString(ty) && strcmp(ty->valuestring, "custom") == 0))
            return rtr_fd_punsup(c, p, "server tools (web search, bash, text editor, ...) are not "
                                     "run by this server: custom tools only");
        if (!rtr_fd_keys(c->err, t, keys, w) || !cache_control_ok(c, t, w))
            return false;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(t, "description");
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
        snprintf(p, sizeof(p), "%s.name", w);
        if (!cJSON_IsString(name) || !rtr_tools_name_ok(name->valuestring))
            return rtr_fd_pbad(c, p, "must be 1-64 characters of a-z, A-Z, 0-9, _ and -");
        snprintf(p, sizeof(p), "%s.description", w);
        if (desc != NULL && !cJSON_IsNull(desc) && !cJSON_IsString(desc))
            return rtr_fd_pbad(c, p, "must be a string");
        snprintf(p, sizeof(p), "%s.input_schema", w);
        if (!cJSON_IsObject(schema))
            return rtr_fd_pbad(c, p, "is required: a JSON schema object");
        cJSON *o = cJSON_CreateObject();
        cJSON *fn = cJSON_AddObjectToObject(o, "function");
        if (fn == NULL || !cJSON_AddItemToArray(out, o)) {
            cJSON_Delete(o);
            return rtr_fd_pnomem(c);
        }
        if (!cJSON_AddStringToObject(o, "type", "function") ||
            !cJSON_AddStringToObject(fn, "name", name->valuestring) ||
            (cJSON_IsString(desc) && !cJSON_AddStringToObject(fn, "description",
                                                               desc->valuestring)) ||
            !cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(schema, true)))
            return rtr_fd_pnomem(c);
    }
    return true;
}

/* tool_choice {type: auto | any | tool (+ name) | none, disable_parallel_tool_use} */
static bool tr_tool_choice(actx_t *c, const cJSON *tc, cJSON *chat)
{
    static const char *const keys[] = { "type", "name", "disable_parallel_tool_use", NULL };
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(ty))
        return rtr_fd_pbad(c, "tool_choice", "must be an object with a string 'type'");
    if (!rtr_fd_keys(c->err, tc, keys, "tool_choice"))
        return false;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(tc, "name");
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(tc, "disable_parallel_tool_use");
    const char *t = ty->valuestring;
    cJSON *v = NULL;
    if (strcmp(t, "tool") == 0) {
        if (!cJSON_IsString(name))
            return rtr_fd_pbad(c, "tool_choice.name", "is required with type \"tool\"");
        v = cJSON_CreateObject();
        cJSON *fn = cJSON_AddObjectToObject(v, "function");
        if (fn == NULL || !cJSON_AddStringToObject(v, "type", "function") ||
            !cJSON_AddStringToObject(fn, "name", name->valuestring)) {
            cJSON_Delete(v);
            return rtr_fd_pnomem(c);
        }
    } else if (name != NULL && !cJSON_IsNull(name)) {
        return rtr_fd_pbad(c, "tool_choice.name", "goes with type \"tool\" only");
    } else if (strcmp(t, "auto") == 0 || strcmp(t, "any") == 0 || strcmp(t, "none") == 0) {
        v = cJSON_CreateString(t[0] == 'a' && t[1] == 'n' ? "required" : t);
    } else {
        return rtr_fd_pbad(c, "tool_choice.type",
                   "must be \"auto\", \"any\", \"tool\" or \"none\"");
    }
    if (v == NULL || !cJSON_AddItemToObject(chat, "tool_choice", v))
        return rtr_fd_pnomem(c);
    if (dp != NULL && !cJSON_IsNull(dp)) {
        if (!cJSON_IsBool(dp))
            return rtr_fd_pbad(c, "tool_choice.disable_parallel_tool_use", "must be a boolean");
        if (cJSON_AddBoolToObject(chat, "parallel_tool_calls", !cJSON_IsTrue(dp)) == NULL)
            return rtr_fd_pnomem(c);
    }
    return true;
}

/* The top-level fields that are not messages, system or tools. */
static bool tr_sampling(actx_t *c, const cJSON *root, bool count_only, cJSON *chat)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "max_tokens");
    if (!count_only) {
        if (mt == NULL || cJSON_IsNull(mt))
            return rtr_fd_pbad(c, "max_tokens", "is required");
        if (!cJSON_IsNumber(mt) || !isfinite(mt->valuedouble) || mt->valuedouble < 1 ||
            floor(mt->valuedouble) != mt->valuedouble)
            return rtr_fd_pbad(c, "max_tokens", "must be an integer >= 1");
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "temperature");
    if (t != NULL && !cJSON_IsNull(t) &&
        (!cJSON_IsNumber(t) || !(t->valuedouble >= 0 && t->valuedouble <= 1)))
        return rtr_fd_pbad(c, "temperature", "must be a number in [0, 1]");
    const cJSON *ss = cJSON_GetObjectItemCaseSensitive(root, "stop_sequences");
    if (ss != NULL && !cJSON_IsNull(ss)) {
        if (!cJSON_IsArray(ss) || cJSON_GetArraySize(ss) > RTR_OAI_MAX_STOP)
            return rtr_fd_pbad(c, "stop_sequences", "must be an array of at most 8 strings");
        const cJSON *s;
        cJSON_ArrayForEach(s, ss) {
            if (!cJSON_IsString(s) || strlen(s->valuestring) > RTR_OAI_MAX_STOP_BYTES)
                return rtr_fd_pbad(c, "stop_sequences",
                           "entries must be strings of at most 256 bytes");
        }
        if (!cJSON_AddItemToObject(chat, "stop", cJSON_Duplicate(ss, true)))
            return rtr_fd_pnomem(c);
    }
    /* the same name and meaning in the chat body: its checks name them */
    static const char *const same[] = { "model", "max_tokens", "temperature", "top_p", "top_k",
                                        "stream", NULL };
    for (size_t i = 0; same[i] != NULL; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, same[i]);
        if (v != NULL && !cJSON_AddItemToObject(chat, same[i], cJSON_Duplicate(v, true)))
            return rtr_fd_pnomem(c);
    }
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(root, "top_k");
    if (tk != NULL && !cJSON_IsNull(tk) && (!cJSON_IsNumber(tk) || tk->valuedouble < 0))
        return rtr_fd_pbad(c, "top_k", "must be an integer >= 0 (0: off)");
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    if (md != NULL && !cJSON_IsNull(md)) {
        static const char *const keys[] = { "user_id", NULL };
        if (!cJSON_IsObject(md))
            return rtr_fd_pbad(c, "metadata", "must be an object");
        if (!rtr_fd_keys(c->err, md, keys, "metadata"))
            return false;
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(md, "user_id");
        if (u != NULL && !cJSON_IsNull(u) &&
            (!cJSON_IsString(u) || strlen(u->valuestring) > 256))
            return rtr_fd_pbad(c, "metadata.user_id", "must be a string of at most 256 bytes");
        if (cJSON_IsString(u) && !cJSON_AddStringToObject(chat, "user", u->valuestring))
            return rtr_fd_pnomem(c);
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "service_tier");
    if (st != NULL && !cJSON_IsNull(st) &&
        !(cJSON_IsString(st) && (strcmp(st->valuestring, "auto") == 0 ||
                                 strcmp(st->valuestring, "standard_only") == 0)))
        return rtr_fd_pbad(c, "service_tier", "must be \"auto\" or \"standard_only\"");
    return true;
}

/* Fields known and refused unless neutral. */
static bool neutral_only(actx_t *c, const cJSON *root)
{
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(root, "thinking");
    if (th != NULL && !cJSON_IsNull(th)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(th, "type");
        if (!(cJSON_IsObject(th) && cJSON_IsString(t) && strcmp(t->valuestring, "disabled") == 0 &&
              cJSON_GetArraySize(th) == 1))
            return rtr_fd_punsup(c, "thinking", "extended thinking is not available (send "
                                              "{\"type\": \"disabled\"} or leave it out)");
    }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "container");
    if (ct != NULL && !cJSON_IsNull(ct))
        return rtr_fd_punsup(c, "container", "no code execution containers");
    const cJSON *mcp = cJSON_GetObjectItemCaseSensitive(root, "mcp_servers");
    if (mcp != NULL && !cJSON_IsNull(mcp) && !(cJSON_IsArray(mcp) && mcp->child == NULL))
        return rtr_fd_punsup(c, "mcp_servers", "the server does not connect to MCP servers");
    return true;
}

static const char *const anth_renames[] = {
    ".function.parameters", ".input_schema", ".function.name", ".name", NULL,
};

pd_status_t rtr_anth_parse(const char *body, size_t len, const rtr_oai_limits_t *lim,
                           bool count_only, rtr_oai_req_t *req, rtr_oai_error_t *err)
{
    static const char *const keys[] = { "model", "messages", "max_tokens", "system",
                                        "stop_sequences", "stream", "temperature", "top_p",
                                        "top_k", "tools", "tool_choice", "metadata", "seed",
                                        "service_tier", "thinking", "container", "mcp_servers",
                                        NULL };
    static const char *const count_keys[] = { "model", "messages", "system", "tools",
                                              "tool_choice", "thinking", "mcp_servers", NULL };
    memset(req, 0, sizeof(*req));
    cJSON *root = NULL;
    pd_status_t s = rtr_oai_json_load(body, len, &root, err);
    if (s != PD_OK)
        return s;
    actx_t c = { err, false };
    cJSON *chat = cJSON_CreateObject();
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    bool ok = msgs != NULL || rtr_fd_pnomem(&c);
    ok = ok && rtr_fd_keys(err, root, count_only ? count_keys : keys, "");
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(root, "system");
    if (ok && sys != NULL && !cJSON_IsNull(sys)) {
        rtr_fd_buf_t t = PD_SBUF_INIT;
        ok = text_content(&c, sys, "system", &t);
        cJSON *m = ok ? rtr_fd_chat_msg(msgs, "system") : NULL;
        if (ok && (m == NULL || !cJSON_AddStringToObject(m, "content", t.buf)))
            ok = rtr_fd_pnomem(&c);
        free(t.buf);
    }
    ok = ok && tr_messages(&c, cJSON_GetObjectItemCaseSensitive(root, "messages"), msgs);
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(root, "tools");
    ok = ok && (tl == NULL || cJSON_IsNull(tl) || tr_tools(&c, tl, chat));
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    ok = ok && (tc == NULL || cJSON_IsNull(tc) || tr_tool_choice(&c, tc, chat));
    ok = ok && tr_sampling(&c, root, count_only, chat) && neutral_only(&c, root);
    if (!ok) {
        cJSON_Delete(chat);
        cJSON_Delete(root);
        if (c.oom) {
            rtr_oai_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
            return PD_ERR_NO_MEMORY;
        }
        return PD_ERR_BAD_INPUT;
    }
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
    size_t seed_len = 0;
    const char *seed_raw = NULL;
    if (seed != NULL && !cJSON_IsNull(seed)) {
        seed_raw = rtr_oai_raw_member(body, len, "seed", &seed_len);
        if (!cJSON_IsNumber(seed) || seed_raw == NULL || seed_len == 0) {
            cJSON_Delete(chat);
            cJSON_Delete(root);
            rtr_fd_bad(err, NULL, "seed", "'seed' must be an integer in [-2^63, 2^64)");
            return PD_ERR_BAD_INPUT;
        }
    }
    s = rtr_fd_parse_chat(chat, RTR_API_MESSAGES, seed_raw, seed_len, lim, anth_renames, req,
                          err);
    cJSON_Delete(root);
    if (s == PD_OK)
        req->count_only = count_only;
    return s;
}

/* ---- render ------------------------------------------------------------------ */

static const char *error_type(int status)
{
    switch (status) {
    case 400: case 405: case 422:
        return INVALID;
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503: case 529:
        return "overloaded_error";
    default:
        return "api_error";
    }
}

static cJSON *error_object(const rtr_oai_error_t *err)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "type", "error");
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    if (e == NULL) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(e, "type", error_type(err->http_status));
    cJSON_AddStringToObject(e, "message", err->message);
    return root;
}

char *rtr_anth_error_json(const rtr_oai_error_t *err)
{
    return rtr_fd_print(error_object(err));
}

static const char *stop_reason(const rtr_fd_answer_t *a)
{
    if (a->finish == NULL)
        return NULL;
    if (strcmp(a->finish, "tool_calls") == 0)
        return "tool_use";
    if (strcmp(a->finish, "length") == 0)
        return "max_tokens";
    return a->stop_seq != NULL ? "stop_sequence" : "end_turn";
}

static void add_str_or_null(cJSON *o, const char *k, const char *v)
{
    if (v != NULL)
        cJSON_AddStringToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

/* Anthropic counts input_tokens without the cached ones (those are
 * cache_read_input_tokens); nothing is written to a cache on request. */
static cJSON *usage_object(const rtr_fd_answer_t *a)
{
    cJSON *u = cJSON_CreateObject();
    uint32_t cached = a->usage.cached_tokens;
    cJSON_AddNumberToObject(u, "input_tokens", a->usage.prompt_tokens - cached);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", cached);
    cJSON_AddNumberToObject(u, "output_tokens", a->usage.completion_tokens);
    return u;
}

/* Tool ids: the flow's call_<24> as toolu_<24> (clients send it back as
 * tool_use_id; results render by position, the id is not looked up). */
static void tool_id(char *buf, size_t cap, const char *id)
{
    if (id == NULL)
        id = "";
    snprintf(buf, cap, "toolu_%s", strncmp(id, "call_", 5) == 0 ? id + 5 : id);
}

static cJSON *tool_use_block(const rtr_oai_call_t *call, bool empty_input)
{
    cJSON *b = cJSON_CreateObject();
    char id[300];
    tool_id(id, sizeof(id), call->id);
    cJSON_AddStringToObject(b, "type", "tool_use");
    cJSON_AddStringToObject(b, "id", id);
    cJSON_AddStringToObject(b, "name", call->name);
    cJSON_AddItemToObject(b, "input", empty_input ? cJSON_CreateObject()
                                                  : rtr_fd_args_object(call->arguments));
    return b;
}

static cJSON *message_object(const rtr_fd_answer_t *a)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", a->meta->id);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "model", a->meta->model);
    cJSON_AddArrayToObject(m, "content");
    add_str_or_null(m, "stop_reason", stop_reason(a));
    add_str_or_null(m, "stop_sequence", a->finish != NULL ? a->stop_seq : NULL);
    cJSON_AddItemToObject(m, "usage", usage_object(a));
    return m;
}

static char *anth_body(const rtr_fd_answer_t *a)
{
    cJSON *m = message_object(a);
    cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (a->text_len > 0 || a->calls.n == 0) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddItemToObject(b, "text", rtr_oai_text_item(a->text, a->text_len));
        cJSON_AddItemToArray(content, b);
    }
    for (uint32_t i = 0; i < a->calls.n; i++)
        cJSON_AddItemToArray(content, tool_use_block(&a->calls.v[i], false));
    return rtr_fd_print(m);
}

static cJSON *typed(const char *type)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

static char *anth_stream_head(rtr_fd_stream_t *st, const rtr_fd_answer_t *a)
{
    (void)st;
    rtr_fd_buf_t b = PD_SBUF_INIT;
    cJSON *e = typed("message_start");
    cJSON_AddItemToObject(e, "message", message_object(a));
    rtr_fd_event(&b, "message_start", e);
    return rtr_fd_buf_take(&b);
}

static char *anth_stream_text(rtr_fd_stream_t *st, const rtr_fd_answer_t *a, const char *text,
                              size_t len)
{
    (void)a;
    rtr_fd_buf_t b = PD_SBUF_INIT;
    if (!st->text_open) {
        st->text_open = true;
        cJSON *e = typed("content_block_start");
        cJSON_AddNumberToObject(e, "index", st->n_items);
        cJSON *cb = cJSON_AddObjectToObject(e, "content_block");
        cJSON_AddStringToObject(cb, "type", "text");
        cJSON_AddStringToObject(cb, "text", "");
        rtr_fd_event(&b, "content_block_start", e);
    }
    cJSON *e = typed("content_block_delta");
    cJSON_AddNumberToObject(e, "index", st->n_items);
    cJSON *d = cJSON_AddObjectToObject(e, "delta");
    cJSON_AddStringToObject(d, "type", "text_delta");
    cJSON_AddItemToObject(d, "text", rtr_oai_text_item(text, len));
    rtr_fd_event(&b, "content_block_delta", e);
    return rtr_fd_buf_take(&b);
}

static void block_stop(rtr_fd_buf_t *b, rtr_fd_stream_t *st)
{
    cJSON *e = typed("content_block_stop");
    cJSON_AddNumberToObject(e, "index", st->n_items++);
    rtr_fd_event(b, "content_block_stop", e);
}

static char *anth_stream_end(rtr_fd_stream_t *st, const rtr_fd_answer_t *a)
{
    rtr_fd_buf_t b = PD_SBUF_INIT;
    if (st->text_open) {
        st->text_open = false;
        block_stop(&b, st);
    }
    for (uint32_t i = 0; i < a->calls.n; i++) {
        cJSON *e = typed("content_block_start");
        cJSON_AddNumberToObject(e, "index", st->n_items);
        cJSON_AddItemToObject(e, "content_block", tool_use_block(&a->calls.v[i], true));
        rtr_fd_event(&b, "content_block_start", e);
        e = typed("content_block_delta");
        cJSON_AddNumberToObject(e, "index", st->n_items);
        cJSON *d = cJSON_AddObjectToObject(e, "delta");
        cJSON_AddStringToObject(d, "type", "input_json_delta");
        cJSON_AddStringToObject(d, "partial_json", a->calls.v[i].arguments ? a->calls.v[i].arguments : "");
        rtr_fd_event(&b, "content_block_delta", e);
        block_stop(&b, st);
    }
    cJSON *e = typed("message_delta");
    cJSON *d = cJSON_AddObjectToObject(e, "delta");
    add_str_or_null(d, "stop_reason", stop_reason(a));
    add_str_or_null(d, "stop_sequence", a->stop_seq);
    cJSON_AddItemToObject(e, "usage", usage_object(a));
    rtr_fd_event(&b, "message_delta", e);
    rtr_fd_event(&b, "message_stop", typed("message_stop"));
    return rtr_fd_buf_take(&b);
}

static char *anth_stream_error(rtr_fd_stream_t *st, const rtr_fd_answer_t *a,
                               const rtr_oai_error_t *err)
{
    (void)st;
    (void)a;
    rtr_fd_buf_t b = PD_SBUF_INIT;
    rtr_fd_event(&b, "error", error_object(err));
    return rtr_fd_buf_take(&b);
}

const rtr_fd_api_t rtr_anth_api = {
    .endpoint = "/v1/messages",
    .resp_prefix = "msg_",
    .prompt_param = "messages",
    .parse = rtr_anth_parse,
    .stream_head = anth_stream_head,
    .stream_text = anth_stream_text,
    .stream_end = anth_stream_end,
    .stream_error = anth_stream_error,
    .body = anth_body,
    .error_body = rtr_anth_error_json,
};
