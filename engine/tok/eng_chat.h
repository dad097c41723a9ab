/* eng_chat.h - chat templates for /v1/chat/completions.
 *
 * No Jinja engine: the GGUF tokenizer.chat_template is recognized by
 * distinctive substrings and rendered by a fixed C function per family.
 * The rendered text contains the control tokens as text (including the BOS
 * text where the template has one); encode it with add_bos = false and
 * parse_special = true (eng_chat_encode does exactly that).
 */
#ifndef ENG_CHAT_H
#define ENG_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "pd_status.h"
#include "eng_tok.h"

#define ENG_CHAT_MAX_MESSAGES 1024
#define ENG_CHAT_MAX_BYTES    (4u << 20) /* total content bytes */

/* X(enum, name, description) */
#define ENG_CHAT_LIST(X)                                                      \
    X(CHATML,  "chatml",  "<|im_start|>role\\n...<|im_end|> (no default system)") \
    X(QWEN2,   "qwen2",   "ChatML + default system 'You are a helpful assistant.'") \
    X(QWEN25,  "qwen2.5", "ChatML + default system 'You are Qwen, created by Alibaba Cloud...'") \
    X(LLAMA2,  "llama2",  "<s>[INST] <<SYS>>...<</SYS>> ... [/INST] answer </s>") \
    X(LLAMA3,  "llama3",  "<|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>") \
    X(LLAMA31, "llama3.1", "llama3 + system block 'Cutting Knowledge Date: December 2023...'") \
    X(MISTRAL, "mistral", "<s>[INST] user [/INST]answer</s> (system folded into the next user turn)") \
    X(ZEPHYR,  "zephyr",  "<|system|>\\n...</s>\\n<|user|>\\n...</s>\\n<|assistant|>\\n (TinyLlama chat)") \
    X(PHI3,    "phi3",    "<|user|>\\n...<|end|>\\n<|assistant|>\\n") \
    X(GEMMA,   "gemma",   "<bos><start_of_turn>user\\n...<end_of_turn>\\n<start_of_turn>model\\n (system folded into the first user turn)")

typedef enum {
#define ENG_CHAT_ENUM(e, name, desc) ENG_CHAT_##e,
    ENG_CHAT_LIST(ENG_CHAT_ENUM)
#undef ENG_CHAT_ENUM
    ENG_CHAT_COUNT
} eng_chat_kind_t;

/* A tool call an assistant message made (NUL-terminated; name matches
 * [A-Za-z0-9_-]{1,64}, arguments is JSON text: both checked by the caller). */
typedef struct {
    const char *name;
    const char *arguments;
} eng_chat_call_t;

typedef struct {
    const char *role;     /* "system" | "user" | "assistant" | "tool" */
    const char *content;  /* need not be NUL-terminated; NULL only with calls */
    size_t content_len;
    const eng_chat_call_t *calls;  /* assistant: its tool calls */
    size_t n_calls;
} eng_chat_msg_t;

/* The tool-call format of a family: how tools are described in the prompt,
 * how the model writes a call and how tool results come back.
 *   HERMES (ChatML / Qwen2 / Qwen2.5, as Qwen2.5's template): tools in the
 *     system turn inside <tools></tools>; a call is
 *     <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>; results are a
 *     user turn of <tool_response> blocks.
 *   LLAMA (Llama 3 / 3.1, Meta's JSON tool calling, tools in the first user
 *     message): a call is {"name": N, "parameters": {...}}; results come
 *     back in an "ipython" turn; one call per assistant turn.
 * Other families have none: tools, calls and tool messages are refused. */
typedef enum {
    ENG_CHAT_TOOLS_NONE = 0,
    ENG_CHAT_TOOLS_HERMES,
    ENG_CHAT_TOOLS_LLAMA,
} eng_chat_tools_fmt_t;

eng_chat_tools_fmt_t eng_chat_tools_format(eng_chat_kind_t kind);
/* What a call opens with in the output ("<tool_call>\n" / ""), and the key
 * of its arguments ("arguments" / "parameters"). */
const char *eng_chat_call_opener(eng_chat_tools_fmt_t f);
const char *eng_chat_call_args_key(eng_chat_tools_fmt_t f);

/* One tool definition as JSON text: {"type":"function","function":{...}}. */
typedef struct {
    const char *json;
    size_t len;
} eng_chat_tool_t;

/* Rendering options: the tools to describe, and text appended after the
 * generation prompt (a forced call's opener). */
typedef struct {
    const eng_chat_tool_t *tools;
    size_t n_tools;
    const char *gen_prefix;
} eng_chat_opts_t;

/* Template by config name ("chatml", "llama3", ...). PD_ERR_NOT_FOUND. */
pd_status_t eng_chat_by_name(const char *name, eng_chat_kind_t *kind_p);
/* Recognize a Jinja template text (tokenizer.chat_template). PD_ERR_NOT_FOUND
 * when it matches no known family. */
pd_status_t eng_chat_detect(const char *tmpl, eng_chat_kind_t *kind_p);
/* The template a tokenizer should use: override name if non-NULL/non-empty,
 * else detect from its chat_template, else ChatML for the byte tokenizer
 * (pd-mkmodel writes a ChatML template for the built-in model).
 * PD_ERR_NOT_FOUND (unknown override or unrecognized template). */
pd_status_t eng_chat_for_tok(const eng_tok_t *tok, const char *override,
                             eng_chat_kind_t *kind_p);
const char *eng_chat_name(eng_chat_kind_t kind);

/* Render messages into a malloc'd NUL-terminated string (*out_p, caller
 * frees) of *len_p bytes. add_generation_prompt appends the assistant
 * header. bos/eos are the texts of the BOS/EOS tokens (NULL = family
 * default). Statuses: PD_ERR_BAD_INPUT (no messages, unknown role, NULL
 * content), PD_ERR_TOO_BIG (caps), PD_ERR_NO_MEMORY. */
pd_status_t eng_chat_render(eng_chat_kind_t kind, const eng_chat_msg_t *msgs,
                            size_t n_msgs, bool add_generation_prompt,
                            const char *bos, const char *eos,
                            char **out_p, size_t *len_p);
/* The same with tools (opts may be NULL). PD_ERR_UNSUPPORTED: tools, a
 * tool message or calls with a family that has no tool format; more than
 * one call in a LLAMA-format turn; PD_ERR_BAD_INPUT: LLAMA tools with no
 * user message to carry them. */
pd_status_t eng_chat_render_opts(eng_chat_kind_t kind, const eng_chat_msg_t *msgs,
                                 size_t n_msgs, bool add_generation_prompt,
                                 const char *bos, const char *eos,
                                 const eng_chat_opts_t *opts, char **out_p, size_t *len_p);

/* Render with the tokenizer's BOS/EOS texts and encode (parse_special on,
 * no extra BOS). Statuses: those of eng_chat_render and eng_tok_encode. */
pd_status_t eng_chat_encode(const eng_tok_t *tok, eng_chat_kind_t kind,
                            const eng_chat_msg_t *msgs, size_t n_msgs,
                            bool add_generation_prompt,
                            int32_t *ids /* (cap) */, size_t cap, size_t *n_p);
pd_status_t eng_chat_encode_opts(const eng_tok_t *tok, eng_chat_kind_t kind,
                                 const eng_chat_msg_t *msgs, size_t n_msgs,
                                 bool add_generation_prompt, const eng_chat_opts_t *opts,
                                 int32_t *ids /* (cap) */, size_t cap, size_t *n_p);

#endif
