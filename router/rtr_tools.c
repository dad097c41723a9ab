/* rtr_tools.c - see rtr_tools.h. */
#include "rtr_tools.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool rtr_tools_name_ok(const char *s)
{
    size_t n = s != NULL ? strlen(s) : 0;
    return n >= 1 && n <= 64 &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == n;
}

/* {"type":"object","properties":{"name":{"const":N},"<key>":P},
 *  "required":["name","<key>"],"additionalProperties":false} */
static cJSON *call_branch(const rtr_oai_tool_t *t, const char *key)
{
    cJSON *params = cJSON_Parse(t->params);
    cJSON *o = cJSON_CreateObject();
    cJSON *props = cJSON_AddObjectToObject(o, "properties");
    cJSON *name = cJSON_AddObjectToObject(props, "name");
    cJSON *req = cJSON_CreateArray();
    if (params == NULL || name == NULL || req == NULL) {
        cJSON_Delete(params);
        cJSON_Delete(req);
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddStringToObject(o, "type", "object");
    cJSON_AddStringToObject(name, "const", t->name);
    cJSON_AddItemToObject(props, key, params);
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString(key));
    cJSON_AddItemToObject(o, "required", req);
    cJSON_AddFalseToObject(o, "additionalProperties");
    return o;
}

char *rtr_tools_call_schema(const rtr_oai_tool_t *tools, uint32_t n_tools, int32_t named,
                            const char *args_key, size_t *len_p)
{
    cJSON *root = NULL;
    if (named >= 0) {
        if ((uint32_t)named >= n_tools)
            return NULL;
        root = call_branch(&tools[named], args_key);
    } else {
        if (n_tools == 0 || n_tools > RTR_OAI_MAX_TOOLS)
            return NULL;
        if (n_tools == 1) {
            root = call_branch(&tools[0], args_key);
        } else {
            root = cJSON_CreateObject();
            cJSON *any = cJSON_AddArrayToObject(root, "anyOf");
            if (any == NULL) {
                cJSON_Delete(root);
                return NULL;
            }
            cJSON_AddStringToObject(root, "type", "object");
            for (uint32_t i = 0; i < n_tools; i++) {
                cJSON *b = call_branch(&tools[i], args_key);
                if (b == NULL) {
                    cJSON_Delete(root);
                    return NULL;
                }
                cJSON_AddItemToArray(any, b);
            }
        }
    }
    if (root == NULL)
        return NULL;
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (text != NULL && len_p != NULL)
        *len_p = strlen(text);
    return text;
}

static size_t skip_ws(const char *s, size_t len, size_t i)
{
    while (i < len && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t'))
        i++;
    return i;
}

/* Auto detection uses the opener without its trailing newline (Hermes) or
 * "{" (Llama's JSON call has no opener). */
static void detect_opener(const char *opener, const char **o, size_t *n)
{
    *o = opener != NULL && opener[0] != '\0' ? opener : "{";
    *n = strlen(*o);
    while (*n > 1 && ((*o)[*n - 1] == '\n'))
        (*n)--;
}

rtr_toolscan_t rtr_tools_scan(const char *opener, const char *text, size_t len)
{
    const char *o;
    size_t on;
    detect_opener(opener, &o, &on);
    size_t i = skip_ws(text, len, 0);
    size_t have = len - i;
    size_t k = have < on ? have : on;
    if (memcmp(text + i, o, k) != 0)
        return RTR_TOOLSCAN_TEXT;
    return have < on ? RTR_TOOLSCAN_MAYBE : RTR_TOOLSCAN_CALL;
}

void rtr_tools_calls_free(rtr_oai_call_t *calls, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        free(calls[i].id);
        free(calls[i].name);
        free(calls[i].arguments);
        calls[i].id = calls[i].name = calls[i].arguments = NULL;
    }
}

/* One call's JSON text [s, s + len) (whitespace around allowed). */
static pd_status_t parse_one(const char *s, size_t len, const char *args_key,
                             const rtr_oai_tool_t *tools, uint32_t n_tools, rtr_oai_call_t *out)
{
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, len, &end, false);
    if (j == NULL)
        return PD_ERR_BAD_INPUT;
    size_t used = (size_t)(end - s);
    pd_status_t st = skip_ws(s, len, used) == len ? PD_OK : PD_ERR_BAD_INPUT;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, args_key);
    if (st == PD_OK && (!cJSON_IsObject(j) || !cJSON_IsString(name) || !cJSON_IsObject(args) ||
                        cJSON_GetArraySize(j) != 2))
        st = PD_ERR_BAD_INPUT;
    bool known = false;
    for (uint32_t i = 0; st == PD_OK && i < n_tools && !known; i++)
        known = strcmp(tools[i].name, name->valuestring) == 0;
    if (st == PD_OK && !known)
        st = PD_ERR_BAD_INPUT;
    if (st == PD_OK) {
        out->name = strdup(name->valuestring);
        out->arguments = cJSON_PrintUnformatted(args);
        if (out->name == NULL || out->arguments == NULL)
            st = PD_ERR_NO_MEMORY;
    }
    cJSON_Delete(j);
    return st;
}

pd_status_t rtr_tools_parse(const char *opener, const char *args_key, bool forced,
                            const char *text, size_t len, const rtr_oai_tool_t *tools,
                            uint32_t n_tools, rtr_oai_call_t *calls, uint32_t cap,
                            uint32_t *n_calls_p)
{
    *n_calls_p = 0;
    bool blocks = opener != NULL && opener[0] != '\0';
    if (forced || !blocks) { /* the answer is one call's JSON */
        if (cap == 0)
            return PD_ERR_BAD_INPUT;
        pd_status_t st = parse_one(text, len, args_key, tools, n_tools, &calls[0]);
        if (st != PD_OK) {
            rtr_tools_calls_free(calls, 1);
            return st;
        }
        *n_calls_p = 1;
        return PD_OK;
    }
    /* <tool_call> JSON </tool_call>, one or more, whitespace between */
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    size_t i = skip_ws(text, len, 0), n = 0;
    pd_status_t st = PD_OK;
    while (st == PD_OK && i < len && n < cap) { /* blocks after the cap are dropped */
        if (len - i < sizeof(open) - 1 || memcmp(text + i, open, sizeof(open) - 1)) {
            st = PD_ERR_BAD_INPUT;
            break;
        }
        i += sizeof(open) - 1;
        size_t j = i;
        while (j + sizeof(close) - 1 <= len && memcmp(text + j, close, sizeof(close) - 1))
            j++;
        if (j + sizeof(close) - 1 > len)
            j = len; /* the last block may end without its closer (EOS) */
        st = parse_one(text + i, j - i, args_key, tools, n_tools, &calls[n]);
        if (st != PD_OK)
            break;
        n++;
        i = j < len ? j + sizeof(close) - 1 : len;
        i = skip_ws(text, len, i);
    }
    if (st == PD_OK && n == 0)
        st = PD_ERR_BAD_INPUT;
    if (st != PD_OK) {
        rtr_tools_calls_free(calls, n + (n < cap ? 1 : 0));
        return st;
    }
    *n_calls_p = (uint32_t)n;
    return PD_OK;
}

pd_status_t rtr_tools_partial(const char *args_key, const char *text, size_t len,
                              const rtr_oai_tool_t *tools, uint32_t n_tools, int32_t named,
                              rtr_oai_call_t *out)
{
    static const char head[] = "{\"name\":\"";
    memset(out, 0, sizeof(*out));
    size_t i = skip_ws(text, len, 0), k = 0;
    while (k < sizeof(head) - 1 && i < len && text[i] == head[k])
        i++, k++;
    if (i < len && k < sizeof(head) - 1)
        return PD_ERR_BAD_INPUT; /* not the grammar's shape */
    size_t ns = i;
    while (i < len && text[i] != '"')
        i++;
    size_t nl = i - ns;
    bool closed = i < len;
    const char *name = NULL;
    for (uint32_t t = 0; t < n_tools && name == NULL; t++) {
        if (named >= 0 && (uint32_t)named != t)
            continue;
        size_t tl = strlen(tools[t].name);
        if (closed ? tl == nl && memcmp(tools[t].name, text + ns, nl) == 0
                   : tl >= nl && memcmp(tools[t].name, text + ns, nl) == 0)
            name = tools[t].name;
    }
    if (name == NULL)
        return PD_ERR_BAD_INPUT;
    /* ","<args_key>": then the arguments as far as they got */
    const char *args = "";
    size_t al = 0;
    if (closed) {
        char mid[80];
        int ml = snprintf(mid, sizeof(mid), "\",\"%s\":", args_key);
        size_t a = i, m = 0;
        while (m < (size_t)ml && a < len && text[a] == mid[m])
            a++, m++;
        if (m == (size_t)ml) {
            args = text + a;
            al = len - a;
        }
    }
    out->name = strdup(name);
    out->arguments = malloc(al + 1);
    if (out->name == NULL || out->arguments == NULL) {
        rtr_tools_calls_free(out, 1);
        return PD_ERR_NO_MEMORY;
    }
    memcpy(out->arguments, args, al);
    out->arguments[al] = '\0';
    return PD_OK;
}
