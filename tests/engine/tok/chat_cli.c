/* chat_cli.c - test helper: render one conversation with eng_chat.
 *
 * stdin: {"template": NAME, "messages": [{"role", "content",
 *   "tool_calls": [{"function": {"name", "arguments": {...}}}]}],
 *   "tools": [...], "add_generation_prompt": bool, "gen_prefix": str}
 * stdout: the rendered text, exactly. Used by chat_xcheck.mjs against the
 * templates' own Jinja sources (llama.cpp's models/templates). Exit 2 on
 * bad input, 3 when eng_chat refuses (status on stderr). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng_chat.h"

int main(void)
{
    static char in[1 << 20];
    size_t n = fread(in, 1, sizeof(in) - 1, stdin);
    in[n] = '\0';
    cJSON *j = cJSON_Parse(in);
    const cJSON *tn = cJSON_GetObjectItem(j, "template");
    const cJSON *ms = cJSON_GetObjectItem(j, "messages");
    const cJSON *ts = cJSON_GetObjectItem(j, "tools");
    const cJSON *gp = cJSON_GetObjectItem(j, "gen_prefix");
    eng_chat_kind_t kind;
    if (!cJSON_IsString(tn) || eng_chat_by_name(tn->valuestring, &kind) != PD_OK ||
        !cJSON_IsArray(ms)) {
        fprintf(stderr, "bad input\n");
        return 2;
    }
    int nm = cJSON_GetArraySize(ms), nt = cJSON_GetArraySize(ts);
    eng_chat_msg_t *m = calloc((size_t)nm + 1, sizeof(*m));
    eng_chat_call_t *calls = calloc(64, sizeof(*calls));
    eng_chat_tool_t *tools = calloc((size_t)nt + 1, sizeof(*tools));
    int nc = 0;
    for (int i = 0; i < nm; i++) {
        const cJSON *x = cJSON_GetArrayItem(ms, i);
        const cJSON *c = cJSON_GetObjectItem(x, "content");
        m[i].role = cJSON_GetStringValue(cJSON_GetObjectItem(x, "role"));
        m[i].content = cJSON_IsString(c) ? c->valuestring : NULL;
        m[i].content_len = m[i].content ? strlen(m[i].content) : 0;
        m[i].calls = calls + nc;
        const cJSON *tc;
        cJSON_ArrayForEach(tc, cJSON_GetObjectItem(x, "tool_calls")) {
            const cJSON *f = cJSON_GetObjectItem(tc, "function");
            calls[nc].name = cJSON_GetStringValue(cJSON_GetObjectItem(f, "name"));
            calls[nc].arguments = cJSON_PrintUnformatted(cJSON_GetObjectItem(f, "arguments"));
            nc++;
            m[i].n_calls++;
        }
    }
    for (int i = 0; i < nt; i++) {
        tools[i].json = cJSON_PrintUnformatted(cJSON_GetArrayItem(ts, i));
        tools[i].len = strlen(tools[i].json);
    }
    eng_chat_opts_t o = { tools, (size_t)nt, cJSON_GetStringValue(gp) };
    char *out = NULL;
    size_t len = 0;
    pd_status_t st = eng_chat_render_opts(kind, m, (size_t)nm,
                                          cJSON_IsTrue(cJSON_GetObjectItem(j, "add_generation_prompt")),
                                          NULL, NULL, &o, &out, &len);
    if (st != PD_OK) {
        fprintf(stderr, "eng_chat_render_opts: %s\n", pd_status_str(st));
        return 3;
    }
    fwrite(out, 1, len, stdout);
    free(out);
    for (int i = 0; i < nc; i++)
        free((char *)calls[i].arguments);
    for (int i = 0; i < nt; i++)
        free((char *)tools[i].json);
    free(calls);
    free(tools);
    free(m);
    cJSON_Delete(j);
    return 0;
}
