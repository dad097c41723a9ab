/* rtr_tools.h - tool calling, the pure parts (docs/API.md "Tools"): the
 * schema a forced call is constrained to, and reading calls out of an
 * answer. The chat template's call format decides the shapes
 * (eng_chat_tools_fmt_t): its opener ("<tool_call>\n" for Hermes, none for
 * Llama's JSON) and the arguments key ("arguments" / "parameters"). */
#ifndef RTR_TOOLS_H
#define RTR_TOOLS_H

#include "rtr_openai.h"

/* The JSON schema of a forced call: {"name": <const>, "<args_key>":
 * <the tool's parameters>}, every property required, nothing else; for
 * named < 0 an anyOf over the tools (at most RTR_OAI_MAX_TOOLS).
 * malloc'd text (*len_p bytes) or NULL (no memory / bad arguments). */
char *rtr_tools_call_schema(const rtr_oai_tool_t *tools, uint32_t n_tools, int32_t named,
                            const char *args_key, size_t *len_p);

/* While streaming with tool_choice auto: is the answer so far a call?
 * MAYBE while (after leading whitespace) it is still a prefix of the
 * opener, CALL once it starts with it, TEXT otherwise. */
typedef enum { RTR_TOOLSCAN_MAYBE = 0, RTR_TOOLSCAN_TEXT, RTR_TOOLSCAN_CALL } rtr_toolscan_t;
rtr_toolscan_t rtr_tools_scan(const char *opener, const char *text, size_t len);

/* The calls in a whole answer: forced (the opener was part of the prompt:
 * the answer is the call's JSON) or auto (the answer starts with the
 * opener; Hermes: one or more <tool_call> blocks). Each call must be a JSON
 * object with a known tool name and an object of arguments (printed
 * compact into calls[i].arguments; ids stay NULL). At most cap calls are
 * read: blocks after them are dropped (parallel_tool_calls false: cap 1).
 * PD_ERR_BAD_INPUT: not a
 * well-formed call (the caller answers with the text); PD_ERR_NO_MEMORY.
 * Free with rtr_tools_calls_free. */
pd_status_t rtr_tools_parse(const char *opener, const char *args_key, bool forced,
                            const char *text, size_t len, const rtr_oai_tool_t *tools,
                            uint32_t n_tools, rtr_oai_call_t *calls, uint32_t cap,
                            uint32_t *n_calls_p);
void rtr_tools_calls_free(rtr_oai_call_t *calls, uint32_t n);

/* A forced call that did not finish (max_tokens, the context or a stop
 * string cut it): text is a prefix of the grammar's {"name":"N","<key>":
 * ...}. out gets the tool's name (the only tool the prefix can name: for
 * named >= 0 that one, else the first whose name the prefix starts) and
 * the arguments text as far as it got, unparsed ("" if not begun), as
 * OpenAI returns a truncated call. PD_ERR_BAD_INPUT if text is not such a
 * prefix; PD_ERR_NO_MEMORY. Free with rtr_tools_calls_free(out, 1). */
pd_status_t rtr_tools_partial(const char *args_key, const char *text, size_t len,
                              const rtr_oai_tool_t *tools, uint32_t n_tools, int32_t named,
                              rtr_oai_call_t *out);

/* A tool name: 1-64 of [A-Za-z0-9_-]. */
bool rtr_tools_name_ok(const char *s);

#endif
