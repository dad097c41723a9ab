/* rtr_openai_parse.c - OpenAI request bodies -> rtr_oai_req_t: the table of
 * known fields, type and range checks, caps; every refusal as an OpenAI
 * error envelope (rtr_openai.h rtr_oai_parse). */
#include "rtr_openai.h"
#include "rtr_tools.h"

#include "eng_gram.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"

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
            free(req->messages[i].name);
            if (req->messages[i].calls != NULL) {
                rtr_tools_calls_free(req->messages[i].calls, req->messages[i].n_calls);
                free(req->messages[i].calls);
            }
        }
        free(req->messages);
    }
    for (uint32_t i = 0; i < req->n_stop; i++)
        free(req->stop[i]);
    free(req->gram_schema);
    for (uint32_t i = 0; i < req->n_tools; i++) {
        cJSON_free(req->tools[i].def);
        cJSON_free(req->tools[i].params);
    }
    free(req->tools);
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

/* ---- the strict policy: every top-level field is known here ------------ */

#define API_CMPL 0x1u
#define API_CHAT 0x2u
#define API_BOTH (API_CMPL | API_CHAT)

/* Every field a request may carry, per endpoint. A field not listed for the
 * endpoint is refused (code "unknown_parameter"); a listed field is either
 * honoured or refused below with "unsupported_parameter". docs/API.md has
 * the same list with each field's range and behaviour. */
static const struct {
    const char *name;
    unsigned apis;
} known_fields[] = {
    { "model", API_BOTH },             { "prompt", API_CMPL },
    { "messages", API_CHAT },          { "max_tokens", API_BOTH },
    { "max_completion_tokens", API_CHAT }, { "min_tokens", API_BOTH },
    { "temperature", API_BOTH },       { "top_p", API_BOTH },
    { "top_k", API_BOTH },             { "min_p", API_BOTH },
    { "seed", API_BOTH },              { "stop", API_BOTH },
    { "stop_token_ids", API_BOTH },    { "ignore_eos", API_BOTH },
    { "n", API_BOTH },                 { "stream", API_BOTH },
    { "stream_options", API_BOTH },    { "presence_penalty", API_BOTH },
    { "frequency_penalty", API_BOTH }, { "repetition_penalty", API_BOTH },
    { "logit_bias", API_BOTH },        { "user", API_BOTH },
    { "logprobs", API_BOTH },          { "top_logprobs", API_CHAT },
    { "echo", API_CMPL },              { "best_of", API_CMPL },
    { "suffix", API_CMPL },            { "response_format", API_CHAT },
    { "tools", API_CHAT },             { "tool_choice", API_CHAT },
    { "parallel_tool_calls", API_CHAT }, { "functions", API_CHAT },
    { "function_call", API_CHAT },     { "store", API_CHAT },
    { "metadata", API_CHAT },          { "service_tier", API_CHAT },
    { "reasoning_effort", API_CHAT },  { "modalities", API_CHAT },
    { "audio", API_CHAT },             { "prediction", API_CHAT },
    { "web_search_options", API_CHAT }, { "cache_salt", API_BOTH },
    { "grammar", API_BOTH },           { "structured_outputs", API_BOTH },
    { "guided_json", API_BOTH },       { "guided_regex", API_BOTH },
    { "guided_choice", API_BOTH },     { "guided_grammar", API_BOTH },
};

static bool unsupported(parse_ctx_t *pc, const char *param, const char *why)
{
    rtr_oai_error_set(pc->err, 400, INVALID, "unsupported_parameter", param,
                      "'%s' is not supported by this server%s%s", param, why ? ": " : "",
                      why ? why : "");
    pc->status = PD_ERR_BAD_INPUT;
    return false;
}

/* Copy a client-chosen name into err->param_buf (bounded) and point param at it. */
static const char *param_name(parse_ctx_t *pc, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static const char *param_name(parse_ctx_t *pc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pc->err->param_buf, sizeof(pc->err->param_buf), fmt, ap);
    va_end(ap);
    return pc->err->param_buf;
}

static bool check_known_fields(parse_ctx_t *pc, const cJSON *root, rtr_api_t api)
{
    unsigned bit = api == RTR_API_CHAT ? API_CHAT : API_CMPL;
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        const char *k = it->string != NULL ? it->string : "";
        bool other_api = false, ok = false;
        for (size_t i = 0; i < sizeof(known_fields) / sizeof(known_fields[0]); i++) {
            if (strcmp(k, known_fields[i].name) != 0)
                continue;
            ok = (known_fields[i].apis & bit) != 0;
            other_api = !ok;
            break;
        }
        if (ok)
            continue;
        const char *name = param_name(pc, "%s", k);
        rtr_oai_error_set(pc->err, 400, INVALID, "unknown_parameter", name,
                          other_api ? "'%s' is not a parameter of %s%s" :
                                      "'%s' is not a known parameter of %s%s", name,
                          api == RTR_API_CHAT ? "/v1/chat/completions"
                                              : "/v1/completions",
                          strcmp(k, "max_completion_tokens") == 0 ? " (use max_tokens)" : "");
        pc->status = PD_ERR_BAD_INPUT;
        return false;
    }
    return true;
}

/* A field that may only carry its neutral value(s): absent, null, false, an
 * empty array/object, or the given string. Anything else is refused. */
static bool only_neutral(parse_ctx_t *pc, const cJSON *root, const char *name,
                         const char *neutral_str, const char *why)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, name);
    if (it == NULL || cJSON_IsNull(it) || cJSON_IsFalse(it))
        return true;
    if ((cJSON_IsArray(it) || cJSON_IsObject(it)) && it->child == NULL)
        return true;
    if (neutral_str != NULL && cJSON_IsString(it) && strcmp(it->valuestring, neutral_str) == 0)
        return true;
    return unsupported(pc, name, why);
}

/* response_format: text | json_object | json_schema {name, schema, strict,
 * description}. The schema is compiled here (engine/gram) so a schema the
 * daemons would refuse gets its 400 naming the keyword. */
static bool parse_response_format(parse_ctx_t *pc, const cJSON *rf, rtr_oai_req_t *req)
{
    const cJSON *type = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
    if (!cJSON_IsString(type))
        return bad(pc, "response_format", "must be an object with a string 'type'");
    const char *t = type->valuestring;
    const cJSON *k;
    cJSON_ArrayForEach(k, rf) {
        if (strcmp(k->string, "type") != 0 &&
            !(strcmp(t, "json_schema") == 0 && strcmp(k->string, "json_schema") == 0)) {
            rtr_oai_error_set(pc->err, 400, INVALID, "unknown_parameter",
                              "response_format", "'response_format.%.64s' is not known for "
                              "type \"%.32s\"", k->string, t);
            pc->status = PD_ERR_BAD_INPUT;
            return false;
        }
    }
    if (strcmp(t, "text") == 0)
        return true;
    if (req->ignore_eos)
        return unsupported(pc, "ignore_eos", "cannot be combined with response_format "
                                             "(the JSON ends with the EOS token)");
    if (req->min_tokens > 0)
        return unsupported(pc, "min_tokens", "cannot be combined with response_format "
                                             "(EOS must be allowed once the JSON is complete)");
    if (strcmp(t, "json_object") == 0) {
        req->gram_kind = RTR_OAI_GRAM_JSON_OBJECT;
        return true;
    }
    if (strcmp(t, "json_schema") != 0)
        return bad(pc, "response_format", "'type' must be \"text\", \"json_object\" or "
                                          "\"json_schema\"");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return bad(pc, "response_format", "'json_schema' must be an object");
    cJSON_ArrayForEach(k, js) {
        if (strcmp(k->string, "name") && strcmp(k->string, "schema") &&
            strcmp(k->string, "strict") && strcmp(k->string, "description")) {
            rtr_oai_error_set(pc->err, 400, INVALID, "unknown_parameter", "response_format",
                              "'response_format.json_schema.%.64s' is not a known field",
                              k->string);
            pc->status = PD_ERR_BAD_INPUT;
            return false;
        }
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    if (!cJSON_IsString(name) || name->valuestring[0] == '\0' ||
        strlen(name->valuestring) > 64 ||
        strspn(name->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                  "0123456789_-") != strlen(name->valuestring))
        return bad(pc, "response_format",
                   "'json_schema.name' must be 1-64 characters of a-z, A-Z, 0-9, _ and -");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
        return bad(pc, "response_format", "'json_schema.strict' must be a boolean");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(js, "description");
    if (desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc))
        return bad(pc, "response_format", "'json_schema.description' must be a string");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!cJSON_IsObject(schema))
        return bad(pc, "response_format", "'json_schema.schema' must be a JSON schema object");
    char *text = cJSON_PrintUnformatted(schema);
    if (text == NULL) {
        pc->status = PD_ERR_NO_MEMORY;
        return false;
    }
    char why[256];
    eng_gram_t *g = NULL;
    pd_status_t st = eng_gram_compile(ENG_GRAM_JSON_SCHEMA, text, strlen(text), &g, why,
                                      sizeof(why));
    eng_gram_free(g);
    if (st == PD_ERR_NO_MEMORY) {
        cJSON_free(text);
        pc->status = st;
        return false;
    }
    if (st != PD_OK) {
        cJSON_free(text);
        rtr_oai_error_set(pc->err, 400, INVALID, st == PD_ERR_TOO_BIG ? "schema_too_large"
                                                                        : "unsupported_schema",
                          "response_format", "'response_format.json_schema.schema': %s", why);
        pc->status = PD_ERR_BAD_INPUT;
        return false;
    }
    req->gram_schema = dup_n(text, strlen(text));
    req->gram_schema_len = strlen(text);
    cJSON_free(text);
    if (req->gram_schema == NULL) {
        pc->status = PD_ERR_NO_MEMORY;
        return false;
    }
    req->gram_kind = RTR_OAI_GRAM_JSON_SCHEMA;
    return true;
}

/* The other constrained forms, on the same engine: llama-server's "grammar"
 * (GBNF), vLLM's guided_json / guided_regex / guided_choice /
 * guided_grammar and structured_outputs {json | regex | choice | grammar}.
 * One constraint per request. The text is compiled here (a 400 naming the
 * field and the construct or cap) and crosses to the daemons as kind + text. */
static bool set_gram(parse_ctx_t *pc, rtr_oai_req_t *req, uint32_t kind, const char *text,
                     size_t len, const char *field)
{
    if (req->gram_kind != RTR_OAI_GRAM_NONE) {
        char why[160];
        snprintf(why, sizeof(why), "cannot be combined with another constraint "
                 "(response_format, grammar, structured_outputs, guided_*)");
        return unsupported(pc, field, why);
    }
    if (req->ignore_eos)
        return unsupported(pc, "ignore_eos", "cannot be combined with a constrained output "
                                             "(EOS ends it)");
    if (req->min_tokens > 0)
        return unsupported(pc, "min_tokens", "cannot be combined with a constrained output "
                                             "(EOS must be allowed once it is complete)");
    char why[256];
    eng_gram_t *g = NULL;
    pd_status_t st = eng_gram_compile((eng_gram_kind_t)kind, text, len, &g, why, sizeof(why));
    eng_gram_free(g);
    if (st == PD_ERR_NO_MEMORY) {
        pc->status = st;
        return false;
    }
    if (st != PD_OK) {
        rtr_oai_error_set(pc->err, 400, INVALID, st == PD_ERR_TOO_BIG ? "grammar_too_large"
                                                                        : "unsupported_grammar",
                          field, "'%s': %s", field, why);
        pc->status = PD_ERR_BAD_INPUT;
        return false;
    }
    req->gram_schema = dup_n(text, len);
    req->gram_schema_len = len;
    if (req->gram_schema == NULL) {
        pc->status = PD_ERR_NO_MEMORY;
        return false;
    }
    req->gram_kind = kind;
    return true;
}

/* guided_choice: the GBNF root ::= "a" | "b" | ... */
static bool set_choice(parse_ctx_t *pc, rtr_oai_req_t *req, const cJSON *ch, const char *field)
{
    int n = cJSON_GetArraySize(ch);
    if (!cJSON_IsArray(ch) || n < 1 || n > 256)
        return bad(pc, field, "must be an array of 1 to 256 strings");
    size_t cap = 16, len = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ch) {
        if (!cJSON_IsString(e))
            return bad(pc, field, "must be an array of 1 to 256 strings");
        cap += strlen(e->valuestring) * 4 + 8;
    }
    if (cap > 65536)
        return bad(pc, field, "is too large");
    char *t = malloc(cap);
    if (t == NULL) {
        pc->status = PD_ERR_NO_MEMORY;
        return false;
    }
    len += (size_t)snprintf(t, cap, "root ::= ");
    bool first = true;
    cJSON_ArrayForEach(e, ch) {
        if (!first)
            t[len++] = '|';
        first = false;
        t[len++] = '"';
        for (const unsigned char *q = (const unsigned char *)e->valuestring; *q; q++) {
            if (*q == '"' || *q == '\\') {
                t[len++] = '\\';
                t[len++] = (char)*q;
            } else if (*q < 0x20) {
                len += (size_t)snprintf(t + len, cap - len, "\\x%02x", *q);
            } else {
                t[len++] = (char)*q;
            }
        }
        t[len++] = '"';
    }
    t[len] = '\0';
    bool ok = set_gram(pc, req, RTR_OAI_GRAM_GBNF, t, len, field);
    free(t);
    return ok;
}

/* A JSON schema given as an object or as its JSON text (vLLM takes both). */
static bool set_json(parse_ctx_t *pc, rtr_oai_req_t *req, const cJSON *js, const char *field)
{
    if (cJSON_IsString(js))
        return set_gram(pc, req, RTR_OAI_GRAM_JSON_SCHEMA, js->valuestring,
                        strlen(js->valuestring), field);
    if (!cJSON_IsObject(js))
        return bad(pc, field, "must be a JSON schema (an object, or its JSON text)");
    char *text = cJSON_PrintUnformatted(js);
    if (text == NULL) {
        pc->status = PD_ERR_NO_MEMORY;
        return false;
    }
    bool ok = set_gram(pc, req, RTR_OAI_GRAM_JSON_SCHEMA, text, strlen(text), field);
    cJSON_free(text);
    return ok;
}

static bool set_text(parse_ctx_t *pc, rtr_oai_req_t *req, const cJSON *it, uint32_t kind,
                     const char *field)
{
    if (!cJSON_IsString(it) || it->valuestring[0] == '\0')
        return bad(pc, field, "must be a non-empty string");
    return set_gram(pc, req, kind, it->valuestring, strlen(it->valuestring), field);
}

static bool parse_guided(parse_ctx_t *pc, const cJSON *root, rtr_oai_req_t *req)
{
    const cJSON *it;
#define PRESENT(name) ((it = cJSON_GetObjectItemCaseSensitive(root, name)) != NULL && \
                       !cJSON_IsNull(it))
    if (PRESENT("grammar") && !set_text(pc, req, it, RTR_OAI_GRAM_GBNF, "grammar"))
        return false;
    if (PRESENT("guided_json") && !set_json(pc, req, it, "guided_json"))
        return false;
    if (PRESENT("guided_regex") && !set_text(pc, req, it, RTR_OAI_GRAM_REGEX, "guided_regex"))
        return false;
    if (PRESENT("guided_choice") && !set_choice(pc, req, it, "guided_choice"))
        return false;
    if (PRESENT("guided_grammar") &&
        !set_text(pc, req, it, RTR_OAI_GRAM_GBNF, "guided_grammar"))
        return false;
    if (PRESENT("structured_outputs")) {
        if (!cJSON_IsObject(it))
            return bad(pc, "structured_outputs", "must be an object");
        const cJSON *so = it, *k;
        cJSON_ArrayForEach(k, so) {
            if (cJSON_IsNull(k))
                continue;
            if (strcmp(k->string, "json") == 0) {
                if (!set_json(pc, req, k, "structured_outputs.json"))
                    return false;
            } else if (strcmp(k->string, "regex") == 0) {
                if (!set_text(pc, req, k, RTR_OAI_GRAM_REGEX, "structured_outputs.regex"))
                    return false;
            } else if (strcmp(k->string, "choice") == 0) {
                if (!set_choice(pc, req, k, "structured_outputs.choice"))
                    return false;
            } else if (strcmp(k->string, "grammar") == 0) {
                if (!set_text(pc, req, k, RTR_OAI_GRAM_GBNF, "structured_outputs.grammar"))
                    return false;
            } else {
                rtr_oai_error_set(pc->err, 400, INVALID, "unsupported_parameter",
                                  "structured_outputs", "'structured_outputs.%.64s' is not "
                                  "supported (json, regex, choice, grammar are)", k->string);
                pc->status = PD_ERR_BAD_INPUT;
                return false;
            }
        }
    }
#undef PRESENT
    return true;
}

/* The grammar names a refused keyword by its JSON pointer in the call's
 * schema ("at /anyOf/3/properties/arguments/properties/age/minimum"):
 * make it the pointer in the tool's parameters ("at /properties/age/minimum"). */
static void params_pointer(char *why, size_t cap)
{
    char *at = strstr(why, " at /");
    if (at == NULL)
        return;
    char *p = at + 4;
    if (strncmp(p, "/anyOf/", 7) == 0) {
        p += 7;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    static const char args[] = "/properties/arguments";
    if (strncmp(p, args, sizeof(args) - 1) != 0)
        return;
    p += sizeof(args) - 1;
    char rest[256];
    snprintf(rest, sizeof(rest), "%s", *p == '\0' ? "(the root)" : p);
    snprintf(at + 4, cap - (size_t)(at + 4 - why), "%s", rest);
}

/* tools + tool_choice (docs/API.md "Tools"). A forced call (required /
 * named) is grammar-constrained: its schema is compiled here so that
 * parameters the grammar cannot express get their 400. */
static bool parse_tools(parse_ctx_t *pc, const cJSON *root, rtr_oai_req_t *req)
{
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(root, "tools");
    int n = 0;
    if (tl != NULL && !cJSON_IsNull(tl)) {
        if (!cJSON_IsArray(tl))
            return bad(pc, "tools", "must be an array of {\"type\": \"function\", "
                                    "\"function\": {...}}");
        n = cJSON_GetArraySize(tl);
    }
    if (n > RTR_OAI_MAX_TOOLS) {
        rtr_oai_error_set(pc->err, 400, INVALID, NULL, "tools", "at most %d tools are accepted",
                          RTR_OAI_MAX_TOOLS);
        pc->status = PD_ERR_BAD_INPUT;
        return false;
    }
    if (n > 0 && (req->tools = calloc((size_t)n, sizeof(*req->tools))) == NULL) {
        pc->status = PD_ERR_NO_MEMORY;
        return false;
    }
    const cJSON *t, *arr = n > 0 ? tl : NULL;
    cJSON_ArrayForEach(t, arr) {
        uint32_t i = req->n_tools;
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) ||
            strcmp(type->valuestring, "function") != 0 || !cJSON_IsObject(fn) ||
            cJSON_GetArraySize(t) != 2)
            return bad(pc, param_name(pc, "tools[%u]", i),
                       "must be {\"type\": \"function\", \"function\": {...}}");
        const cJSON *k;
        cJSON_ArrayForEach(k, fn) {
            if (strcmp(k->string, "name") && strcmp(k->string, "description") &&
                strcmp(k->string, "parameters") && strcmp(k->string, "strict"))
                return bad(pc, param_name(pc, "tools[%u].function.%.24s", i, k->string),
                           "is not a known field");
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(fn, "strict");
        if (!cJSON_IsString(name) || !rtr_tools_name_ok(name->valuestring))
            return bad(pc, param_name(pc, "tools[%u].function.name", i),
                       "must be 1-64 characters of a-z, A-Z, 0-9, _ and -");
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(req->tools[j].name, name->valuestring) == 0)
                return bad(pc, param_name(pc, "tools[%u].function.name", i),
                           "repeats the name of another tool");
        if (desc != NULL && !cJSON_IsNull(desc) && !cJSON_IsString(desc))
            return bad(pc, param_name(pc, "tools[%u].function.description", i), "must be a string");
        if (params != NULL && !cJSON_IsNull(params) && !cJSON_IsObject(params))
            return bad(pc, param_name(pc, "tools[%u].function.parameters", i),
                       "must be a JSON schema object");
        if (strict != NULL && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
            return bad(pc, param_name(pc, "tools[%u].function.strict", i), "must be a boolean");
        rtr_oai_tool_t *o = &req->tools[i];
        req->n_tools++;
        snprintf(o->name, sizeof(o->name), "%s", name->valuestring);
        /* the definition as the templates show it */
        cJSON *def = cJSON_CreateObject(), *f = cJSON_AddObjectToObject(def, "function");
        cJSON *p = cJSON_IsObject(params) ? cJSON_Duplicate(params, true)
                                          : cJSON_Parse("{\"type\":\"object\",\"properties\":{}}");
        if (def != NULL)
            cJSON_AddStringToObject(def, "type", "function");
        if (f != NULL) {
            cJSON_AddStringToObject(f, "name", o->name);
            if (cJSON_IsString(desc))
                cJSON_AddStringToObject(f, "description", desc->valuestring);
        }
        o->params = p != NULL ? cJSON_PrintUnformatted(p) : NULL;
        if (f != NULL && p != NULL)
            cJSON_AddItemToObject(f, "parameters", p);
        else
            cJSON_Delete(p);
        o->def = def != NULL ? cJSON_PrintUnformatted(def) : NULL;
        cJSON_Delete(def);
        if (o->def == NULL || o->params == NULL) {
            pc->status = PD_ERR_NO_MEMORY;
            return false;
        }
        o->def_len = strlen(o->def);
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    req->tool_choice = req->n_tools > 0 ? RTR_OAI_TOOLS_AUTO : RTR_OAI_TOOLS_NONE;
    if (tc != NULL && !cJSON_IsNull(tc)) {
        if (cJSON_IsString(tc) && strcmp(tc->valuestring, "none") == 0) {
            req->tool_choice = RTR_OAI_TOOLS_NONE;
        } else if (req->n_tools == 0) {
            return bad(pc, "tool_choice", "needs 'tools'");
        } else if (cJSON_IsString(tc) && strcmp(tc->valuestring, "auto") == 0) {
            req->tool_choice = RTR_OAI_TOOLS_AUTO;
        } else if (cJSON_IsString(tc) && strcmp(tc->valuestring, "required") == 0) {
            req->tool_choice = RTR_OAI_TOOLS_REQUIRED;
        } else {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(tc, "type");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsObject(tc) || !cJSON_IsString(type) ||
                strcmp(type->valuestring, "function") != 0 || !cJSON_IsString(name))
                return bad(pc, "tool_choice", "must be \"none\", \"auto\", \"required\" or "
                                              "{\"type\": \"function\", \"function\": "
                                              "{\"name\": ...}}");
            uint32_t j = 0;
            while (j < req->n_tools && strcmp(req->tools[j].name, name->valuestring) != 0)
                j++;
            if (j == req->n_tools)
                return bad(pc, "tool_choice", "names a function that is not in 'tools'");
            req->tool_choice = RTR_OAI_TOOLS_NAMED;
            req->tool_named = j;
        }
    }
    if (req->tool_choice == RTR_OAI_TOOLS_NONE || req->tool_choice == RTR_OAI_TOOLS_AUTO)
        return true;
    /* forced: constrained like response_format, so the same rules */
    if (req->gram_kind != RTR_OAI_GRAM_NONE)
        return unsupported(pc, "tool_choice", "a forced call cannot be combined with "
                                              "response_format, grammar or guided_*");
    if (req->ignore_eos || req->min_tokens > 0)
        return unsupported(pc, req->ignore_eos ? "ignore_eos" : "min_tokens",
                           "cannot be combined with a forced tool call (the call ends with EOS)");
    for (uint32_t i = 0; i < req->n_tools; i++) {
        if (req->tool_choice == RTR_OAI_TOOLS_NAMED && i != req->tool_named)
            continue;
        size_t len = 0;
        char *schema = rtr_tools_call_schema(req->tools, req->n_tools, (int32_t)i, "arguments",
                                             &len);
        if (schema == NULL) {
            pc->status = PD_ERR_NO_MEMORY;
            return false;
        }
        char why[256];
        eng_gram_t *g = NULL;
        pd_status_t st = eng_gram_compile(ENG_GRAM_JSON_SCHEMA, schema, len, &g, why, sizeof(why));
        eng_gram_free(g);
        cJSON_free(schema);
        if (st == PD_ERR_NO_MEMORY) {
            pc->status = st;
            return false;
        }
        if (st != PD_OK) {
            params_pointer(why, sizeof(why));
            rtr_oai_error_set(pc->err, 400, INVALID, st == PD_ERR_TOO_BIG ? "schema_too_large"
                                                                            : "unsupported_schema",
                              param_name(pc, "tools[%u].function.parameters", i),
                              "a forced call to '%s' is constrained by its parameters: %s",
                              req->tools[i].name, why);
            pc->status = PD_ERR_BAD_INPUT;
            return false;
        }
    }
    return true;
}

/* Fields the router knows but does not implement, and the requests where
 * they would change nothing (accepted). */
static bool check_unsupported(parse_ctx_t *pc, const cJSON *root, rtr_api_t api,
                              rtr_oai_req_t *req)
{
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (api == RTR_API_CHAT) {
        if (lp != NULL && !cJSON_IsNull(lp) && !cJSON_IsBool(lp))
            return bad(pc, "logprobs", "must be a boolean");
        req->logprobs = cJSON_IsTrue(lp);
        const cJSON *tl = cJSON_GetObjectItemCaseSensitive(root, "top_logprobs");
        if (tl != NULL && !cJSON_IsNull(tl)) {
            int64_t v;
            if (!get_int(tl, 0, RTR_OAI_MAX_TOP_LOGPROBS, &v))
                return bad(pc, "top_logprobs", "must be an integer in [0, 20]");
            if (!req->logprobs)
                return bad(pc, "top_logprobs", "requires 'logprobs': true");
            req->top_logprobs = (uint32_t)v;
        }
    } else {
        if (lp != NULL && !cJSON_IsNull(lp)) {
            int64_t v;
            if (!get_int(lp, 0, RTR_OAI_MAX_TOP_LOGPROBS, &v))
                return bad(pc, "logprobs", "must be an integer in [0, 20] or null");
            req->logprobs = true;
            req->top_logprobs = (uint32_t)v;
        }
        const cJSON *echo = cJSON_GetObjectItemCaseSensitive(root, "echo");
        if (echo != NULL && !cJSON_IsNull(echo) && !cJSON_IsBool(echo))
            return bad(pc, "echo", "must be a boolean");
        if (cJSON_IsTrue(echo))
            return unsupported(pc, "echo", NULL);
        const cJSON *bo = cJSON_GetObjectItemCaseSensitive(root, "best_of");
        if (bo != NULL && !cJSON_IsNull(bo)) {
            int64_t v;
            if (!get_int(bo, 1, 1e9, &v))
                return bad(pc, "best_of", "must be an integer >= 1");
            if ((uint64_t)v != req->n)
                return unsupported(pc, "best_of", "only best_of = n is served");
        }
        const cJSON *sf = cJSON_GetObjectItemCaseSensitive(root, "suffix");
        if (sf != NULL && !cJSON_IsNull(sf) && !cJSON_IsString(sf))
            return bad(pc, "suffix", "must be a string");
        if (cJSON_IsString(sf) && sf->valuestring[0] != '\0')
            return unsupported(pc, "suffix", "insertion is not implemented");
    }
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (user != NULL && !cJSON_IsNull(user) &&
        (!cJSON_IsString(user) || strlen(user->valuestring) > 256))
        return bad(pc, "user", "must be a string of at most 256 bytes");
    /* cache_salt (vLLM): a non-empty string; its own prefix-cache partition */
    const cJSON *salt = cJSON_GetObjectItemCaseSensitive(root, "cache_salt");
    if (salt != NULL && !cJSON_IsNull(salt)) {
        if (!cJSON_IsString(salt) || salt->valuestring[0] == '\0' ||
            strlen(salt->valuestring) > RTR_OAI_CACHE_SALT_MAX)
            return bad(pc, "cache_salt", "must be a non-empty string of at most 256 bytes");
        memcpy(req->cache_salt, salt->valuestring, strlen(salt->valuestring) + 1);
        req->cache_salt_set = true;
    }
    const cJSON *rf = api == RTR_API_CHAT
                          ? cJSON_GetObjectItemCaseSensitive(root, "response_format") : NULL;
    if (rf != NULL && !cJSON_IsNull(rf) && !parse_response_format(pc, rf, req))
        return false;
    if (!parse_guided(pc, root, req))
        return false;
    if (api != RTR_API_CHAT)
        return true;
    const cJSON *ptc = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    if (ptc != NULL && !cJSON_IsNull(ptc) && !cJSON_IsBool(ptc))
        return bad(pc, "parallel_tool_calls", "must be a boolean");
    req->single_call = cJSON_IsFalse(ptc);
    static const char *const fn_why = "deprecated: use tools and tool_choice";
    return parse_tools(pc, root, req) &&
           only_neutral(pc, root, "functions", NULL, fn_why) &&
           only_neutral(pc, root, "function_call", "none", fn_why) &&
           only_neutral(pc, root, "store", NULL, "responses are not stored") &&
           only_neutral(pc, root, "metadata", NULL, "responses are not stored") &&
           only_neutral(pc, root, "service_tier", "auto", NULL) &&
           only_neutral(pc, root, "reasoning_effort", NULL, NULL) &&
           only_neutral(pc, root, "modalities", NULL, "text output only") &&
           only_neutral(pc, root, "audio", NULL, "text output only") &&
           only_neutral(pc, root, "prediction", NULL, NULL) &&
           only_neutral(pc, root, "web_search_options", NULL, NULL);
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
                !cJSON_IsString(text) || cJSON_GetArraySize(part) != 2) {
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

/* An assistant message's tool_calls: [{id, type: "function", function:
 * {name, arguments: JSON text of an object}}], at most RTR_OAI_MAX_CALLS. */
static bool parse_msg_calls(parse_ctx_t *pc, const cJSON *arr, uint32_t mi, rtr_chat_msg_t *out)
{
    int n = cJSON_GetArraySize(arr);
    if (n > RTR_OAI_MAX_CALLS)
        return bad(pc, param_name(pc, "messages[%u].tool_calls", mi), "has too many calls");
    out->calls = calloc((size_t)n, sizeof(*out->calls));
    if (out->calls == NULL) {
        pc->status = PD_ERR_NO_MEMORY;
        return false;
    }
    const cJSON *c;
    cJSON_ArrayForEach(c, arr) {
        uint32_t k = out->n_calls;
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsObject(c) || !cJSON_IsString(id) || strlen(id->valuestring) > 256 ||
            !cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 ||
            !cJSON_IsObject(fn) || !cJSON_IsString(name) || !rtr_tools_name_ok(name->valuestring) ||
            !cJSON_IsString(args))
            return bad(pc, param_name(pc, "messages[%u].tool_calls[%u]", mi, k),
                       "must be {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                       "\"arguments\": a JSON object as a string}}");
        cJSON *a = cJSON_Parse(args->valuestring);
        if (!cJSON_IsObject(a)) {
            cJSON_Delete(a);
            return bad(pc, param_name(pc, "messages[%u].tool_calls[%u].function.arguments", mi, k),
                       "must be a JSON object (as a string)");
        }
        rtr_oai_call_t *o = &out->calls[k];
        out->n_calls++;
        o->id = strdup(id->valuestring);
        o->name = strdup(name->valuestring);
        o->arguments = cJSON_PrintUnformatted(a);
        cJSON_Delete(a);
        if (o->id == NULL || o->name == NULL || o->arguments == NULL) {
            pc->status = PD_ERR_NO_MEMORY;
            return false;
        }
    }
    return true;
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
        uint32_t mi = req->n_messages - 1;
        bool assistant = strcmp(role->valuestring, "assistant") == 0;
        bool tool = strcmp(role->valuestring, "tool") == 0;
        const cJSON *key;
        cJSON_ArrayForEach(key, msg) {
            const char *k = key->string != NULL ? key->string : "";
            if (strcmp(k, "role") == 0 || strcmp(k, "content") == 0)
                continue;
            if (cJSON_IsNull(key))
                continue;
            if (strcmp(k, "tool_call_id") == 0 && tool && cJSON_IsString(key))
                continue; /* tool results render by position; the id is not needed */
            if (strcmp(k, "name") == 0) { /* any role: a participant, or the tool's name */
                if (!cJSON_IsString(key) || strlen(key->valuestring) > RTR_OAI_MSG_NAME_MAX)
                    return bad(pc, param_name(pc, "messages[%u].name", mi),
                               "must be a string of at most 256 bytes");
                free(out->name);
                if ((out->name = strdup(key->valuestring)) == NULL) {
                    pc->status = PD_ERR_NO_MEMORY;
                    return false;
                }
                continue;
            }
            if (strcmp(k, "tool_calls") == 0 && assistant && cJSON_IsArray(key) &&
                key->child != NULL) {
                if (!parse_msg_calls(pc, key, mi, out))
                    return false;
                continue;
            }
            if (strcmp(k, "refusal") == 0 && assistant)
                return bad(pc, param_name(pc, "messages[%u].refusal", mi),
                           "is not supported (send it as content)");
            bool known_key = strcmp(k, "tool_calls") == 0 || strcmp(k, "function_call") == 0 ||
                             strcmp(k, "tool_call_id") == 0;
            if (known_key && (cJSON_IsArray(key) && key->child == NULL))
                continue;
            return known_key
                ? unsupported(pc, param_name(pc, "messages[%u].%.24s", mi, k),
                              "deprecated: use tool_calls")
                : bad(pc, param_name(pc, "messages[%u].%.24s", mi, k), "is not a known field");
        }
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (!assistant && (c == NULL || cJSON_IsNull(c)))
            return bad(pc, param_name(pc, "messages[%u].content", mi),
                       "is required for this role");
        char *content = NULL;
        if (out->n_calls > 0 && (c == NULL || cJSON_IsNull(c)))
            continue; /* only tool calls */
        if (!parse_content(pc, c, &content, &out->content_len, &budget))
            return false;
        out->content = content;
    }
    return true;
}

/* presence/frequency/repetition penalties, min_p, logit_bias, stop_token_ids. */
static bool parse_penalties(parse_ctx_t *pc, const cJSON *root, const rtr_oai_limits_t *lim,
                            rtr_oai_req_t *req)
{
    if (!parse_float_field(pc, root, "presence_penalty", -2, 2, false, &req->presence_penalty) ||
        !parse_float_field(pc, root, "frequency_penalty", -2, 2, false,
                           &req->frequency_penalty) ||
        !parse_float_field(pc, root, "repetition_penalty", 0, 2, true,
                           &req->repetition_penalty) ||
        !parse_float_field(pc, root, "min_p", 0, 1, false, &req->min_p))
        return false;
    double hi = lim->vocab_size ? (double)lim->vocab_size - 1 : 2147483647.0;
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (lb != NULL && !cJSON_IsNull(lb)) {
        if (!cJSON_IsObject(lb))
            return bad(pc, "logit_bias", "must be an object mapping token ids to biases");
        if (cJSON_GetArraySize(lb) > RTR_OAI_MAX_BIAS) {
            rtr_oai_error_set(pc->err, 400, INVALID, NULL, "logit_bias",
                              "'logit_bias' allows at most %d entries", RTR_OAI_MAX_BIAS);
            pc->status = PD_ERR_BAD_INPUT;
            return false;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, lb) {
            const char *k = e->string != NULL ? e->string : "";
            char *end = NULL;
            long long id = strtoll(k, &end, 10);
            if (k[0] < '0' || k[0] > '9' || *end != '\0' || strlen(k) > 10 || id < 0 ||
                (double)id > hi) {
                rtr_oai_error_set(pc->err, 400, INVALID, NULL, "logit_bias",
                                  "'logit_bias' keys must be token ids in [0, %.0f]", hi);
                pc->status = PD_ERR_BAD_INPUT;
                return false;
            }
            if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble < -100 ||
                e->valuedouble > 100)
                return bad(pc, "logit_bias", "values must be numbers in [-100, 100]");
            for (uint32_t i = 0; i < req->n_bias; i++)
                if (req->bias_ids[i] == (int32_t)id)
                    return bad(pc, "logit_bias", "has the same token id twice");
            req->bias_ids[req->n_bias] = (int32_t)id;
            req->bias[req->n_bias] = (float)e->valuedouble;
            req->n_bias++;
        }
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "stop_token_ids");
    if (st != NULL && !cJSON_IsNull(st)) {
        if (!cJSON_IsArray(st) || cJSON_GetArraySize(st) > RTR_OAI_MAX_STOP_IDS) {
            rtr_oai_error_set(pc->err, 400, INVALID, NULL, "stop_token_ids",
                              "'stop_token_ids' must be an array of at most %d token ids",
                              RTR_OAI_MAX_STOP_IDS);
            pc->status = PD_ERR_BAD_INPUT;
            return false;
        }
        const cJSON *t;
        cJSON_ArrayForEach(t, st) {
            int64_t v;
            if (!get_int(t, 0, hi, &v)) {
                rtr_oai_error_set(pc->err, 400, INVALID, NULL, "stop_token_ids",
                                  "'stop_token_ids' entries must be token ids in [0, %.0f]", hi);
                pc->status = PD_ERR_BAD_INPUT;
                return false;
            }
            req->stop_ids[req->n_stop_ids++] = (int32_t)v;
        }
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

/* The raw text of the top-level member `key` of the JSON object in
 * body[0..len) (already parsed by cJSON: well-formed), or NULL. Keys with
 * escapes are not matched. */
const char *rtr_oai_raw_member(const char *body, size_t len, const char *key, size_t *n_p)
{
    size_t i = 0, kl = strlen(key);
    int depth = 0;
    bool want_key = false;
    const char *found = NULL;
    while (i < len) {
        char ch = body[i];
        if (ch == '"') {
            size_t j = i + 1;
            while (j < len && body[j] != '"')
                j += body[j] == '\\' ? 2 : 1;
            if (j >= len)
                return NULL;
            size_t k = j + 1;
            while (k < len && strchr(" \t\r\n", body[k]) != NULL && body[k] != '\0')
                k++;
            if (depth == 1 && want_key && k < len && body[k] == ':' && j - i - 1 == kl &&
                memcmp(body + i + 1, key, kl) == 0) {
                k++;
                while (k < len && strchr(" \t\r\n", body[k]) != NULL && body[k] != '\0')
                    k++;
                found = body + k;
                size_t e = k;
                while (e < len && strchr("+-.0123456789eE", body[e]) != NULL && body[e] != '\0')
                    e++;
                *n_p = e - k;
                return found;
            }
            want_key = false;
            i = j + 1;
            continue;
        }
        if (ch == '{' || ch == '[')
            depth++;
        else if (ch == '}' || ch == ']')
            depth--;
        if ((ch == '{' || ch == ',') && depth == 1)
            want_key = true;
        i++;
    }
    return NULL;
}

/* "seed": any integer in [-2^63, 2^64), exactly (cJSON's double loses the
 * low bits above 2^53, so the number's own text is read), reduced mod 2^64
 * to the sampler's 64-bit state: -1 and 2^64 - 1 are the same seed. */
static bool parse_seed(const cJSON *it, const char *body, size_t len, uint64_t *out)
{
    if (!cJSON_IsNumber(it))
        return false;
    size_t n = 0;
    const char *raw = rtr_oai_raw_member(body, len, "seed", &n);
    char txt[32];
    if (raw != NULL && n > 0 && n < sizeof(txt))
        memcpy(txt, raw, n);
    txt[raw != NULL && n < sizeof(txt) ? n : 0] = '\0';
    if (txt[0] != '\0' && strpbrk(txt, ".eE") == NULL) {
        char *end = NULL;
        errno = 0;
        if (txt[0] == '-') {
            long long v = strtoll(txt, &end, 10);
            if (errno != 0 || *end != '\0')
                return false;
            *out = (uint64_t)v;
        } else {
            unsigned long long v = strtoull(txt, &end, 10);
            if (errno != 0 || *end != '\0')
                return false;
            *out = (uint64_t)v;
        }
        return true;
    }
    /* 1e3, 7.0, or a key spelt with escapes: exact only within 2^53 */
    int64_t v;
    if (!get_int(it, -9007199254740992.0, 9007199254740992.0, &v))
        return false;
    *out = (uint64_t)v;
    return true;
}

pd_status_t rtr_oai_json_load(const char *body, size_t len, cJSON **root_p,
                              rtr_oai_error_t *err)
{
    *root_p = NULL;
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
        if (oom) {
            rtr_oai_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        } else {
            /* param: the top-level field the repeated key is in (or is) */
            const char *field = dup;
            for (const cJSON *c = root->child; c != NULL && c->string != NULL; c = c->next) {
                bool dummy = false;
                if (dup_key(c, &dummy) == dup) {
                    field = c->string;
                    break;
                }
            }
            snprintf(err->param_buf, sizeof(err->param_buf), "%s", field);
            rtr_oai_error_set(err, 400, INVALID, NULL, err->param_buf,
                              "the request body has the key \"%.64s\" twice in one object", dup);
        }
        cJSON_Delete(root);
        return oom ? PD_ERR_NO_MEMORY : PD_ERR_BAD_INPUT;
    }
    if (!cJSON_IsObject(root)) {
        rtr_oai_error_set(err, 400, INVALID, NULL, NULL,
                          "the request body must be a JSON object");
        cJSON_Delete(root);
        return PD_ERR_BAD_INPUT;
    }
    *root_p = root;
    return PD_OK;
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
    req->repetition_penalty = 1.0f;
    req->max_tokens = lim->default_max_tokens;
    parse_ctx_t pc = { err, PD_OK };

    cJSON *root = NULL;
    pd_status_t ls = rtr_oai_json_load(body, len, &root, err);
    if (ls != PD_OK)
        return ls;

    if (!check_known_fields(&pc, root, api))
        goto out;
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
            if (!parse_seed(seed, body, len, &req->seed)) {
                bad(&pc, "seed", "must be an integer in [-2^63, 2^64)");
                goto out;
            }
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
        const cJSON *k;
        cJSON_ArrayForEach(k, so) {
            if (k->string == NULL || strcmp(k->string, "include_usage") != 0) {
                bad(&pc, param_name(&pc, "stream_options.%.32s", k->string ? k->string : ""),
                    "is not a known field (only include_usage)");
                goto out;
            }
        }
    }
    if (!parse_penalties(&pc, root, lim, req) || !check_unsupported(&pc, root, api, req))
        goto out;
out:
    cJSON_Delete(root);
    if (pc.status != PD_OK) {
        if (pc.status == PD_ERR_NO_MEMORY)
            rtr_oai_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        rtr_oai_req_free(req);
    }
    return pc.status;
}
