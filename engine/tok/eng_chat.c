/* eng_chat.c - fixed renderers for the chat template families we recognize. */
#include <stdlib.h>
#include <string.h>

#include "eng_chat.h"

static const char *const chat_names[] = {
#define ENG_CHAT_NAME(e, name, desc) name,
    ENG_CHAT_LIST(ENG_CHAT_NAME)
#undef ENG_CHAT_NAME
};

const char *eng_chat_name(eng_chat_kind_t kind)
{
    return (unsigned)kind < ENG_CHAT_COUNT ? chat_names[kind] : "?";
}

pd_status_t eng_chat_by_name(const char *name, eng_chat_kind_t *kind_p)
{
    unsigned i;

    for (i = 0; name != NULL && i < ENG_CHAT_COUNT; i++) {
        if (strcmp(name, chat_names[i]) == 0) {
            *kind_p = (eng_chat_kind_t)i;
            return PD_OK;
        }
    }
    return PD_ERR_NOT_FOUND;
}

pd_status_t eng_chat_detect(const char *t, eng_chat_kind_t *kind_p)
{
    if (t == NULL)
        return PD_ERR_NOT_FOUND;
    if (strstr(t, "<|im_start|>") != NULL) {
        if (strstr(t, "You are Qwen, created by Alibaba Cloud") != NULL)
            *kind_p = ENG_CHAT_QWEN25;
        else if (strstr(t, "You are a helpful assistant") != NULL)
            *kind_p = ENG_CHAT_QWEN2;
        else
            *kind_p = ENG_CHAT_CHATML;
    } else if (strstr(t, "<|start_header_id|>") != NULL &&
               strstr(t, "<|end_header_id|>") != NULL) {
        *kind_p = strstr(t, "Cutting Knowledge Date") != NULL ? ENG_CHAT_LLAMA31 : ENG_CHAT_LLAMA3;
    } else if (strstr(t, "[INST]") != NULL && strstr(t, "<<SYS>>") != NULL) {
        *kind_p = ENG_CHAT_LLAMA2;
    } else if (strstr(t, "[INST]") != NULL) {
        *kind_p = ENG_CHAT_MISTRAL;
    } else if (strstr(t, "<start_of_turn>") != NULL && strstr(t, "<end_of_turn>") != NULL) {
        *kind_p = ENG_CHAT_GEMMA;
    } else if (strstr(t, "<|user|>") != NULL && strstr(t, "<|assistant|>") != NULL) {
        *kind_p = strstr(t, "<|end|>") != NULL ? ENG_CHAT_PHI3 : ENG_CHAT_ZEPHYR;
    } else {
        return PD_ERR_NOT_FOUND;
    }
    return PD_OK;
}

pd_status_t eng_chat_for_tok(const eng_tok_t *tok, const char *override,
                             eng_chat_kind_t *kind_p)
{
    if (override != NULL && override[0] != '\0')
        return eng_chat_by_name(override, kind_p);
    if (eng_tok_chat_template(tok) != NULL)
        return eng_chat_detect(eng_tok_chat_template(tok), kind_p);
    if (eng_tok_kind(tok) == ENG_TOK_BYTE) {
        *kind_p = ENG_CHAT_CHATML;
        return PD_OK;
    }
    return PD_ERR_NOT_FOUND;
}

/* ---- output buffer ---- */

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf_t;

static void put(sbuf_t *b, const char *s, size_t len)
{
    if (b->oom || len == 0)
        return;
    if (b->n + len + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        char *np;
        while (nc < b->n + len + 1)
            nc *= 2;
        np = realloc(b->p, nc);
        if (np == NULL) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
}

static void puts_(sbuf_t *b, const char *s)
{
    put(b, s, strlen(s));
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Jinja/Python strip(): trim ASCII whitespace both ends. */
static void put_trim(sbuf_t *b, const char *s, size_t len)
{
    while (len > 0 && is_ws(s[0])) {
        s++;
        len--;
    }
    while (len > 0 && is_ws(s[len - 1]))
        len--;
    put(b, s, len);
}

typedef enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL } role_t;

static int parse_role(const char *r)
{
    if (r == NULL)
        return -1;
    if (strcmp(r, "system") == 0 || strcmp(r, "developer") == 0)
        return ROLE_SYSTEM;
    if (strcmp(r, "user") == 0)
        return ROLE_USER;
    if (strcmp(r, "assistant") == 0)
        return ROLE_ASSISTANT;
    if (strcmp(r, "tool") == 0)
        return ROLE_TOOL;
    return -1;
}

static const char *const role_names[] = { "system", "user", "assistant", "tool" };

eng_chat_tools_fmt_t eng_chat_tools_format(eng_chat_kind_t kind)
{
    switch (kind) {
    case ENG_CHAT_CHATML:
    case ENG_CHAT_QWEN2:
    case ENG_CHAT_QWEN25:
        return ENG_CHAT_TOOLS_HERMES;
    case ENG_CHAT_LLAMA3:
    case ENG_CHAT_LLAMA31:
        return ENG_CHAT_TOOLS_LLAMA;
    default:
        return ENG_CHAT_TOOLS_NONE;
    }
}

const char *eng_chat_call_opener(eng_chat_tools_fmt_t f)
{
    return f == ENG_CHAT_TOOLS_HERMES ? "<tool_call>\n" : "";
}

const char *eng_chat_call_args_key(eng_chat_tools_fmt_t f)
{
    return f == ENG_CHAT_TOOLS_LLAMA ? "parameters" : "arguments";
}

static void put_indent(sbuf_t *b, unsigned indent, unsigned depth)
{
    puts_(b, "\n");
    for (unsigned i = 0; i < indent * depth; i++)
        puts_(b, " ");
}

/* JSON text re-printed as the templates' `tojson` filter prints it
 * (Python's json.dumps, ensure_ascii off): ", " and ": " between items,
 * or with indent > 0 one item per line. Strings are copied as they are;
 * whitespace outside strings is dropped. */
static void put_pyjson(sbuf_t *b, const char *s, size_t len, unsigned indent)
{
    unsigned depth = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '"') {
            size_t j = i + 1;
            while (j < len && s[j] != '"')
                j += s[j] == '\\' ? 2 : 1;
            j = j < len ? j + 1 : len;
            put(b, s + i, j - i);
            i = j - 1;
        } else if (c == '{' || c == '[') {
            size_t j = i + 1;
            while (j < len && is_ws(s[j]))
                j++;
            if (j < len && (s[j] == '}' || s[j] == ']')) { /* empty: {} [] */
                put(b, s + i, 1);
                put(b, s + j, 1);
                i = j;
                continue;
            }
            put(b, &c, 1);
            depth++;
            if (indent)
                put_indent(b, indent, depth);
        } else if (c == '}' || c == ']') {
            depth = depth ? depth - 1 : 0;
            if (indent)
                put_indent(b, indent, depth);
            put(b, &c, 1);
        } else if (c == ',') {
            puts_(b, ",");
            if (indent)
                put_indent(b, indent, depth);
            else
                puts_(b, " ");
        } else if (c == ':') {
            puts_(b, ": ");
        } else if (!is_ws(c)) {
            put(b, &c, 1);
        }
    }
}

/* A string as a JSON string literal (tojson of a string). */
static void put_json_string(sbuf_t *b, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    puts_(b, "\"");
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[7] = { '\\', 0, 0, 0, 0, 0, 0 };
        if (c == '"' || c == '\\') {
            e[1] = (char)c;
            put(b, e, 2);
        } else if (c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f') {
            e[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : c == '\b' ? 'b' : 'f';
            put(b, e, 2);
        } else if (c < 0x20) {
            e[1] = 'u';
            e[2] = e[3] = '0';
            e[4] = hex[c >> 4];
            e[5] = hex[c & 15];
            put(b, e, 6);
        } else {
            put(b, s + i, 1);
        }
    }
    puts_(b, "\"");
}

/* {"name": "N", "<key>": ARGS} as the templates write a call. */
static void put_call(sbuf_t *b, const eng_chat_call_t *c, const char *key)
{
    puts_(b, "{\"name\": \"");
    puts_(b, c->name);
    puts_(b, "\", \"");
    puts_(b, key);
    puts_(b, "\": ");
    put_pyjson(b, c->arguments, strlen(c->arguments), 0);
    puts_(b, "}");
}

/* ChatML; with tools, the Hermes format of Qwen2.5's template. */
static void render_chatml(sbuf_t *b, const eng_chat_msg_t *m, const int *roles, size_t n,
                          bool gen, const char *default_system, const eng_chat_opts_t *o)
{
    size_t i = 0;

    if (o->n_tools > 0) {
        puts_(b, "<|im_start|>system\n");
        if (roles[0] == ROLE_SYSTEM) {
            put(b, m[0].content, m[0].content_len);
            i = 1;
        } else if (default_system != NULL) {
            puts_(b, default_system);
        }
        puts_(b, "\n\n# Tools\n\nYou may call one or more functions to assist with the user "
                 "query.\n\nYou are provided with function signatures within <tools></tools> "
                 "XML tags:\n<tools>");
        for (size_t t = 0; t < o->n_tools; t++) {
            puts_(b, "\n");
            put_pyjson(b, o->tools[t].json, o->tools[t].len, 0);
        }
        puts_(b, "\n</tools>\n\nFor each function call, return a json object with function "
                 "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                 "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                 "</tool_call><|im_end|>\n");
    } else if (default_system != NULL && roles[0] != ROLE_SYSTEM) {
        puts_(b, "<|im_start|>system\n");
        puts_(b, default_system);
        puts_(b, "<|im_end|>\n");
    }
    for (; i < n; i++) {
        if (roles[i] == ROLE_TOOL) { /* consecutive results: one user turn */
            if (i == 0 || roles[i - 1] != ROLE_TOOL)
                puts_(b, "<|im_start|>user");
            puts_(b, "\n<tool_response>\n");
            put(b, m[i].content, m[i].content_len);
            puts_(b, "\n</tool_response>");
            if (i + 1 == n || roles[i + 1] != ROLE_TOOL)
                puts_(b, "<|im_end|>\n");
            continue;
        }
        puts_(b, "<|im_start|>");
        puts_(b, role_names[roles[i]]);
        puts_(b, "\n");
        put(b, m[i].content, m[i].content_len);
        for (size_t k = 0; k < m[i].n_calls; k++) {
            if (m[i].content_len > 0 || k > 0)
                puts_(b, "\n");
            puts_(b, "<tool_call>\n");
            put_call(b, &m[i].calls[k], "arguments");
            puts_(b, "\n</tool_call>");
        }
        puts_(b, "<|im_end|>\n");
    }
    if (gen) {
        puts_(b, "<|im_start|>assistant\n");
        if (o->gen_prefix != NULL)
            puts_(b, o->gen_prefix);
    }
}

/* Meta's Llama-3 template; Llama-3.1's (date_header) always opens with a
 * system block carrying its knowledge-cutoff lines (the default date string of
 * the official template, no tools), the first system message trimmed inside. */
static void render_llama3(sbuf_t *b, const eng_chat_msg_t *m, const int *roles, size_t n,
                          bool gen, const char *bos, bool date_header, const eng_chat_opts_t *o)
{
    size_t i = 0;
    bool tools_due = o->n_tools > 0; /* go into the first message after the system one */

    puts_(b, bos);
    if (date_header) {
        puts_(b, "<|start_header_id|>system<|end_header_id|>\n\n");
        if (o->n_tools > 0)
            puts_(b, "Environment: ipython\n");
        puts_(b, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
        if (n > 0 && roles[0] == ROLE_SYSTEM) {
            put_trim(b, m[0].content, m[0].content_len);
            i = 1;
        }
        puts_(b, "<|eot_id|>");
    }
    for (; i < n; i++) {
        bool carry = tools_due && roles[i] != ROLE_SYSTEM;
        puts_(b, "<|start_header_id|>");
        puts_(b, carry ? "user" : roles[i] == ROLE_TOOL ? "ipython" : role_names[roles[i]]);
        puts_(b, "<|end_header_id|>\n\n");
        if (carry) { /* Meta's template: whatever that message's role */
            tools_due = false;
            puts_(b, "Given the following functions, please respond with a JSON for a function "
                     "call with its proper arguments that best answers the given prompt.\n\n"
                     "Respond in the format {\"name\": function name, \"parameters\": "
                     "dictionary of argument name and its value}.Do not use variables.\n\n");
            for (size_t t = 0; t < o->n_tools; t++) {
                put_pyjson(b, o->tools[t].json, o->tools[t].len, 4);
                puts_(b, "\n\n");
            }
            put_trim(b, m[i].content, m[i].content_len);
        } else if (m[i].n_calls > 0) {
            put_call(b, &m[i].calls[0], "parameters");
        } else if (roles[i] == ROLE_TOOL) {
            /* Meta's template: `content | tojson` (a string is iterable) */
            put_json_string(b, m[i].content, m[i].content_len);
        } else {
            put_trim(b, m[i].content, m[i].content_len);
        }
        puts_(b, "<|eot_id|>");
    }
    if (gen) {
        puts_(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        if (o->gen_prefix != NULL)
            puts_(b, o->gen_prefix);
    }
}

/* Meta's Llama-2 chat template: the system prompt is folded into the next
 * user turn inside <<SYS>>; every user turn is "<s>[INST] ... [/INST]", every
 * assistant turn " answer </s>". The whole user content is strip()ped. */
static void render_llama2(sbuf_t *b, const eng_chat_msg_t *m, const int *roles, size_t n,
                          const char *bos, const char *eos)
{
    const eng_chat_msg_t *sys = NULL;
    size_t i;

    for (i = 0; i < n; i++) {
        if (roles[i] == ROLE_SYSTEM) {
            sys = &m[i];
        } else if (roles[i] == ROLE_USER) {
            sbuf_t c = { 0 };
            if (sys != NULL) {
                puts_(&c, "<<SYS>>\n");
                put(&c, sys->content, sys->content_len);
                puts_(&c, "\n<</SYS>>\n\n");
                sys = NULL;
            }
            put(&c, m[i].content, m[i].content_len);
            puts_(b, bos);
            puts_(b, "[INST] ");
            if (c.oom)
                b->oom = true;
            else if (c.n > 0)
                put_trim(b, c.p, c.n);
            puts_(b, " [/INST]");
            free(c.p);
        } else {
            puts_(b, " ");
            put_trim(b, m[i].content, m[i].content_len);
            puts_(b, " ");
            puts_(b, eos);
        }
    }
}

/* Mistral-7B-Instruct v0.1/v0.2: no system role in the official template;
 * like llama.cpp, a system message is prepended to the next user turn. */
static void render_mistral(sbuf_t *b, const eng_chat_msg_t *m, const int *roles, size_t n,
                           const char *bos, const char *eos)
{
    const eng_chat_msg_t *sys = NULL;
    size_t i;

    puts_(b, bos);
    for (i = 0; i < n; i++) {
        if (roles[i] == ROLE_SYSTEM) {
            sys = &m[i];
        } else if (roles[i] == ROLE_USER) {
            puts_(b, "[INST] ");
            if (sys != NULL) {
                put(b, sys->content, sys->content_len);
                puts_(b, "\n\n");
                sys = NULL;
            }
            put(b, m[i].content, m[i].content_len);
            puts_(b, " [/INST]");
        } else {
            put(b, m[i].content, m[i].content_len);
            puts_(b, eos);
        }
    }
}

/* Zephyr / TinyLlama-1.1B-Chat as HF renders it (trim_blocks): every turn is
 * "<|role|>\ncontent" + EOS text + "\n"; the prompt ends "<|assistant|>\n". */
static void render_zephyr(sbuf_t *b, const eng_chat_msg_t *m, const int *roles, size_t n,
                          bool gen, const char *eos)
{
    size_t i;

    for (i = 0; i < n; i++) {
        puts_(b, "<|");
        puts_(b, role_names[roles[i]]);
        puts_(b, "|>\n");
        put(b, m[i].content, m[i].content_len);
        puts_(b, eos);
        puts_(b, "\n");
    }
    if (gen)
        puts_(b, "<|assistant|>\n");
}

/* Gemma 2/3: "<start_of_turn>user|model\ncontent<end_of_turn>\n" after BOS,
 * content trimmed; a leading system message is prepended (+ "\n\n") to the
 * first user turn; the prompt ends "<start_of_turn>model\n". */
static void render_gemma(sbuf_t *b, const eng_chat_msg_t *m, const int *roles, size_t n,
                         bool gen, const char *bos)
{
    size_t i = 0;
    const eng_chat_msg_t *sys = NULL;

    puts_(b, bos);
    if (n > 0 && roles[0] == ROLE_SYSTEM) {
        sys = &m[0];
        i = 1;
    }
    for (; i < n; i++) {
        puts_(b, "<start_of_turn>");
        puts_(b, roles[i] == ROLE_ASSISTANT ? "model" : role_names[roles[i]]);
        puts_(b, "\n");
        if (sys != NULL) {
            put(b, sys->content, sys->content_len); /* not trimmed, as HF's template */
            puts_(b, "\n\n");
            sys = NULL;
        }
        put_trim(b, m[i].content, m[i].content_len);
        puts_(b, "<end_of_turn>\n");
    }
    if (gen)
        puts_(b, "<start_of_turn>model\n");
}

pd_status_t eng_chat_render(eng_chat_kind_t kind, const eng_chat_msg_t *msgs,
                            size_t n, bool gen, const char *bos, const char *eos,
                            char **out_p, size_t *len_p)
{
    return eng_chat_render_opts(kind, msgs, n, gen, bos, eos, NULL, out_p, len_p);
}

pd_status_t eng_chat_render_opts(eng_chat_kind_t kind, const eng_chat_msg_t *msgs,
                                 size_t n, bool gen, const char *bos, const char *eos,
                                 const eng_chat_opts_t *opts, char **out_p, size_t *len_p)
{
    static const eng_chat_opts_t none = { NULL, 0, NULL };
    const eng_chat_opts_t *o = opts != NULL ? opts : &none;
    sbuf_t b = { 0 };
    int *roles;
    size_t i, total = 0;
    bool has_other = false;

    if (msgs == NULL || n == 0 || (unsigned)kind >= ENG_CHAT_COUNT)
        return PD_ERR_BAD_INPUT;
    if (n > ENG_CHAT_MAX_MESSAGES)
        return PD_ERR_TOO_BIG;
    eng_chat_tools_fmt_t fmt = eng_chat_tools_format(kind);
    if (o->n_tools > 0 && fmt == ENG_CHAT_TOOLS_NONE)
        return PD_ERR_UNSUPPORTED;
    for (i = 0; i < o->n_tools; i++) {
        if (o->tools[i].json == NULL || o->tools[i].len > ENG_CHAT_MAX_BYTES - total)
            return o->tools[i].json == NULL ? PD_ERR_BAD_INPUT : PD_ERR_TOO_BIG;
        total += o->tools[i].len;
    }
    for (i = 0; i < n; i++) {
        int role = parse_role(msgs[i].role);
        if (msgs[i].content == NULL && msgs[i].content_len > 0)
            return PD_ERR_BAD_INPUT;
        if (role < 0 || (msgs[i].n_calls > 0 && role != ROLE_ASSISTANT))
            return PD_ERR_BAD_INPUT;
        if ((role == ROLE_TOOL || msgs[i].n_calls > 0) && fmt == ENG_CHAT_TOOLS_NONE)
            return PD_ERR_UNSUPPORTED;
        if (msgs[i].n_calls > 1 && fmt == ENG_CHAT_TOOLS_LLAMA)
            return PD_ERR_UNSUPPORTED;
        for (size_t k = 0; k < msgs[i].n_calls; k++) {
            const eng_chat_call_t *c = &msgs[i].calls[k];
            if (c->name == NULL || c->arguments == NULL)
                return PD_ERR_BAD_INPUT;
            size_t cl = strlen(c->name) + strlen(c->arguments);
            if (cl > ENG_CHAT_MAX_BYTES - total)
                return PD_ERR_TOO_BIG;
            total += cl;
        }
        has_other = has_other || role != ROLE_SYSTEM;
        if (msgs[i].content_len > ENG_CHAT_MAX_BYTES - total)
            return PD_ERR_TOO_BIG;
        total += msgs[i].content_len;
    }
    if (o->n_tools > 0 && fmt == ENG_CHAT_TOOLS_LLAMA && !has_other)
        return PD_ERR_BAD_INPUT; /* no message after the system one to carry them */
    roles = malloc(n * sizeof(int));
    if (roles == NULL)
        return PD_ERR_NO_MEMORY;
    for (i = 0; i < n; i++)
        roles[i] = parse_role(msgs[i].role);

    switch (kind) {
    case ENG_CHAT_CHATML:
        render_chatml(&b, msgs, roles, n, gen, NULL, o);
        break;
    case ENG_CHAT_QWEN2:
        render_chatml(&b, msgs, roles, n, gen, "You are a helpful assistant.", o);
        break;
    case ENG_CHAT_QWEN25:
        render_chatml(&b, msgs, roles, n, gen,
                      "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", o);
        break;
    case ENG_CHAT_LLAMA3:
        render_llama3(&b, msgs, roles, n, gen, bos != NULL ? bos : "<|begin_of_text|>", false, o);
        break;
    case ENG_CHAT_LLAMA31:
        render_llama3(&b, msgs, roles, n, gen, bos != NULL ? bos : "<|begin_of_text|>", true, o);
        break;
    case ENG_CHAT_LLAMA2:
        render_llama2(&b, msgs, roles, n, bos != NULL ? bos : "<s>", eos != NULL ? eos : "</s>");
        break;
    case ENG_CHAT_MISTRAL:
        render_mistral(&b, msgs, roles, n, bos != NULL ? bos : "<s>", eos != NULL ? eos : "</s>");
        break;
    case ENG_CHAT_ZEPHYR:
        render_zephyr(&b, msgs, roles, n, gen, eos != NULL ? eos : "</s>");
        break;
    case ENG_CHAT_PHI3:
        render_zephyr(&b, msgs, roles, n, gen, "<|end|>");
        break;
    case ENG_CHAT_GEMMA:
        render_gemma(&b, msgs, roles, n, gen, bos != NULL ? bos : "<bos>");
        break;
    default:
        break;
    }
    free(roles);
    if (b.oom) {
        free(b.p);
        return PD_ERR_NO_MEMORY;
    }
    if (b.p == NULL) {
        b.p = strdup("");
        if (b.p == NULL)
            return PD_ERR_NO_MEMORY;
    }
    *out_p = b.p;
    *len_p = b.n;
    return PD_OK;
}

pd_status_t eng_chat_encode(const eng_tok_t *tok, eng_chat_kind_t kind,
                            const eng_chat_msg_t *msgs, size_t n_msgs, bool gen,
                            int32_t *ids, size_t cap, size_t *n_p)
{
    return eng_chat_encode_opts(tok, kind, msgs, n_msgs, gen, NULL, ids, cap, n_p);
}

pd_status_t eng_chat_encode_opts(const eng_tok_t *tok, eng_chat_kind_t kind,
                                 const eng_chat_msg_t *msgs, size_t n_msgs, bool gen,
                                 const eng_chat_opts_t *opts, int32_t *ids, size_t cap,
                                 size_t *n_p)
{
    char bos[64], eos[64];
    const char *t;
    size_t tl, len;
    char *text;
    pd_status_t status;

    bos[0] = eos[0] = '\0';
    t = eng_tok_token_text(tok, eng_tok_bos(tok), &tl);
    if (t != NULL && tl < sizeof(bos)) {
        memcpy(bos, t, tl);
        bos[tl] = '\0';
    }
    t = eng_tok_token_text(tok, eng_tok_eos(tok), &tl);
    if (t != NULL && tl < sizeof(eos)) {
        memcpy(eos, t, tl);
        eos[tl] = '\0';
    }
    status = eng_chat_render_opts(kind, msgs, n_msgs, gen, bos, eos, opts, &text, &len);
    if (status != PD_OK)
        return status;
    status = eng_tok_encode(tok, text, len, false, true, ids, cap, n_p);
    free(text);
    return status;
}
