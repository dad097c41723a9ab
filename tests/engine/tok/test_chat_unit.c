/* test_chat_unit.c - chat templates: detection and exact renderings; the
 * built-in model's tokenizer (pd-mkmodel output) against eng_tok_create_byte.
 * argv[1]: path of tiny.gguf from engine/gguf. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "eng_chat.h"
#include "eng_tok.h"

static const char *g_model_path;

#define M(r, c) { r, c, sizeof(c) - 1 }

static const eng_chat_msg_t conv[] = {
    M("system", "You are terse."),
    M("user", " Hi there \n"),
    M("assistant", "Hello!"),
    M("user", "2+2?"),
};

static void render_eq(eng_chat_kind_t kind, const eng_chat_msg_t *m, size_t n, bool gen,
                      const char *want)
{
    char *out = NULL;
    size_t len = 0;

    assert_int_equal(eng_chat_render(kind, m, n, gen, NULL, NULL, &out, &len), PD_OK);
    assert_string_equal(out, want);
    assert_int_equal(len, strlen(want));
    free(out);
}

static void test_chatml(void **state)
{
    (void)state;
    render_eq(ENG_CHAT_CHATML, conv, 4, true,
              "<|im_start|>system\nYou are terse.<|im_end|>\n"
              "<|im_start|>user\n Hi there \n<|im_end|>\n"
              "<|im_start|>assistant\nHello!<|im_end|>\n"
              "<|im_start|>user\n2+2?<|im_end|>\n"
              "<|im_start|>assistant\n");
    render_eq(ENG_CHAT_QWEN2, conv + 3, 1, false,
              "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
              "<|im_start|>user\n2+2?<|im_end|>\n");
    render_eq(ENG_CHAT_QWEN25, conv, 1, false,
              "<|im_start|>system\nYou are terse.<|im_end|>\n");
}

static void test_llama3(void **state)
{
    (void)state;
    render_eq(ENG_CHAT_LLAMA3, conv, 4, true,
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    render_eq(ENG_CHAT_LLAMA3, conv + 3, 1, false,
              "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>");
}

static void test_llama31(void **state)
{
    (void)state;
    render_eq(ENG_CHAT_LLAMA31, conv, 2, true,
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
              "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
              "You are terse.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    render_eq(ENG_CHAT_LLAMA31, conv + 3, 1, false,
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
              "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>");
}

static void test_llama2(void **state)
{
    (void)state;
    render_eq(ENG_CHAT_LLAMA2, conv, 4, true,
              "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\n Hi there [/INST]"
              " Hello! </s>"
              "<s>[INST] 2+2? [/INST]");
    render_eq(ENG_CHAT_LLAMA2, conv + 1, 1, true, "<s>[INST] Hi there [/INST]");
}

static void test_mistral_zephyr(void **state)
{
    (void)state;
    render_eq(ENG_CHAT_MISTRAL, conv, 4, true,
              "<s>[INST] You are terse.\n\n Hi there \n [/INST]Hello!</s>[INST] 2+2? [/INST]");
    render_eq(ENG_CHAT_ZEPHYR, conv, 4, true,
              "<|system|>\nYou are terse.</s>\n<|user|>\n Hi there \n</s>\n"
              "<|assistant|>\nHello!</s>\n<|user|>\n2+2?</s>\n<|assistant|>\n");
    render_eq(ENG_CHAT_PHI3, conv + 3, 1, true, "<|user|>\n2+2?<|end|>\n<|assistant|>\n");
    render_eq(ENG_CHAT_GEMMA, conv, 4, true,
              "<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n"
              "<start_of_turn>model\nHello!<end_of_turn>\n"
              "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n");
}

static void test_detect(void **state)
{
    eng_chat_kind_t k;
    static const char qwen25[] =
        "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]"
        "['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, "
        "created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}";
    static const char llama3[] =
        "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
        "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] "
        "| trim + '<|eot_id|>' %}";
    static const char llama2[] =
        "{% if messages[0]['role'] == 'system' %}...{{ bos_token + '[INST] ' + content.strip() "
        "+ ' [/INST]' }}... '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n'";

    (void)state;
    assert_int_equal(eng_chat_detect(qwen25, &k), PD_OK);
    assert_int_equal(k, ENG_CHAT_QWEN25);
    assert_int_equal(eng_chat_detect(llama3, &k), PD_OK);
    assert_int_equal(k, ENG_CHAT_LLAMA3);
    assert_int_equal(eng_chat_detect(llama2, &k), PD_OK);
    assert_int_equal(k, ENG_CHAT_LLAMA2);
    assert_int_equal(eng_chat_detect("<|start_header_id|>{{ 'Cutting Knowledge Date: ' }}"
                                     "<|end_header_id|>", &k), PD_OK);
    assert_int_equal(k, ENG_CHAT_LLAMA31);
    assert_int_equal(eng_chat_detect("{{ bos_token }}{% for message in messages %}{{ '[INST] ' + "
                                     "message['content'] + ' [/INST]' }}", &k), PD_OK);
    assert_int_equal(k, ENG_CHAT_MISTRAL);
    assert_int_equal(eng_chat_detect("{{ '<|user|>\n' + message['content'] + eos_token }}"
                                     "{{ '<|assistant|>' }}", &k), PD_OK);
    assert_int_equal(k, ENG_CHAT_ZEPHYR);
    assert_int_equal(eng_chat_detect("{{'<|user|>' + '\n' + message['content'] + '<|end|>' + "
                                     "'\n' + '<|assistant|>' + '\n'}}", &k), PD_OK);
    assert_int_equal(k, ENG_CHAT_PHI3);
    assert_int_equal(eng_chat_detect("{{ bos_token }}{{ '<start_of_turn>' + role + '\n' + "
                                     "(message['content'] | trim) + '<end_of_turn>\n' }}", &k),
                     PD_OK);
    assert_int_equal(k, ENG_CHAT_GEMMA);
    assert_int_equal(eng_chat_detect("{{ messages }}", &k), PD_ERR_NOT_FOUND);
    assert_int_equal(eng_chat_by_name("llama3", &k), PD_OK);
    assert_int_equal(k, ENG_CHAT_LLAMA3);
    assert_int_equal(eng_chat_by_name("jinja", &k), PD_ERR_NOT_FOUND);
    assert_string_equal(eng_chat_name(ENG_CHAT_QWEN2), "qwen2");
}

/* Tools (the Qwen2.5 and Llama 3.1 renderings are checked byte for byte
 * against the models' own Jinja templates by tok_chat_xcheck): the forced
 * call's opener after the generation prompt, tojson's spacing, and what
 * families without a tool format refuse. */
static void test_tools(void **state)
{
    (void)state;
    static const char def[] = "{\"type\":\"function\",\"function\":{\"name\":\"f\","
                              "\"parameters\":{\"type\":\"object\",\"properties\":{}}}}";
    eng_chat_tool_t tools[1] = { { def, sizeof(def) - 1 } };
    eng_chat_call_t call = { "f", "{\"x\":[1,2],\"y\":\"a,b: c\"}" };
    eng_chat_msg_t m[4] = { M("user", "go"), M("assistant", ""), M("tool", "ok"),
                            M("tool", "ok2") };
    m[1].calls = &call;
    m[1].n_calls = 1;
    eng_chat_opts_t o = { tools, 1, "<tool_call>\n" };
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(eng_chat_render_opts(ENG_CHAT_CHATML, m, 4, true, NULL, NULL, &o, &out, &len),
                     PD_OK);
    assert_string_equal(out,
        "<|im_start|>system\n\n\n# Tools\n\nYou may call one or more functions to assist with "
        "the user query.\n\nYou are provided with function signatures within <tools></tools> "
        "XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\", "
        "\"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each "
        "function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
        "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\ngo<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2], "
        "\"y\": \"a,b: c\"}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nok\n</tool_response>\n<tool_response>\nok2\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n");
    free(out);
    /* Llama: tools (indent 4) in the first message, one call per turn,
     * results as JSON strings in an ipython turn */
    o.gen_prefix = NULL;
    assert_int_equal(eng_chat_render_opts(ENG_CHAT_LLAMA3, m, 3, false, NULL, NULL, &o, &out, &len),
                     PD_OK);
    assert_non_null(strstr(out, "<|start_header_id|>user<|end_header_id|>\n\nGiven the following"));
    assert_non_null(strstr(out, "{\n    \"type\": \"function\",\n    \"function\": {\n"));
    assert_non_null(strstr(out, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"f\", "
                                "\"parameters\": {\"x\": [1, 2], \"y\": \"a,b: c\"}}<|eot_id|>"));
    assert_non_null(strstr(out, "<|start_header_id|>ipython<|end_header_id|>\n\n\"ok\"<|eot_id|>"));
    free(out);
    eng_chat_call_t two[2] = { call, call };
    m[1].calls = two;
    m[1].n_calls = 2;
    assert_int_equal(eng_chat_render_opts(ENG_CHAT_LLAMA31, m, 3, false, NULL, NULL, &o, &out,
                                          &len), PD_ERR_UNSUPPORTED);
    /* no tool format: tools, calls and tool results refused */
    assert_int_equal(eng_chat_render_opts(ENG_CHAT_LLAMA2, m, 1, false, NULL, NULL, &o, &out, &len),
                     PD_ERR_UNSUPPORTED);
    assert_int_equal(eng_chat_render(ENG_CHAT_GEMMA, m + 2, 1, false, NULL, NULL, &out, &len),
                     PD_ERR_UNSUPPORTED);
    assert_int_equal(eng_chat_render(ENG_CHAT_MISTRAL, m, 2, false, NULL, NULL, &out, &len),
                     PD_ERR_UNSUPPORTED);
    /* a call on a user message; Llama tools with nothing to carry them */
    m[0].calls = &call;
    m[0].n_calls = 1;
    assert_int_equal(eng_chat_render(ENG_CHAT_CHATML, m, 1, false, NULL, NULL, &out, &len),
                     PD_ERR_BAD_INPUT);
    eng_chat_msg_t sys[1] = { M("system", "s") };
    assert_int_equal(eng_chat_render_opts(ENG_CHAT_LLAMA31, sys, 1, true, NULL, NULL, &o, &out,
                                          &len), PD_ERR_BAD_INPUT);
    assert_int_equal(eng_chat_tools_format(ENG_CHAT_QWEN25), ENG_CHAT_TOOLS_HERMES);
    assert_int_equal(eng_chat_tools_format(ENG_CHAT_LLAMA31), ENG_CHAT_TOOLS_LLAMA);
    assert_int_equal(eng_chat_tools_format(ENG_CHAT_PHI3), ENG_CHAT_TOOLS_NONE);
}

static void test_bad_input(void **state)
{
    eng_chat_msg_t bad[1] = { M("robot", "x") };
    eng_chat_msg_t *many;
    char *out;
    size_t len, i;

    (void)state;
    assert_int_equal(eng_chat_render(ENG_CHAT_CHATML, bad, 1, true, NULL, NULL, &out, &len),
                     PD_ERR_BAD_INPUT);
    assert_int_equal(eng_chat_render(ENG_CHAT_CHATML, conv, 0, true, NULL, NULL, &out, &len),
                     PD_ERR_BAD_INPUT);
    bad[0].role = NULL;
    assert_int_equal(eng_chat_render(ENG_CHAT_CHATML, bad, 1, true, NULL, NULL, &out, &len),
                     PD_ERR_BAD_INPUT);
    many = calloc(ENG_CHAT_MAX_MESSAGES + 1, sizeof(*many));
    assert_non_null(many);
    for (i = 0; i <= ENG_CHAT_MAX_MESSAGES; i++)
        many[i] = conv[1];
    assert_int_equal(eng_chat_render(ENG_CHAT_CHATML, many, ENG_CHAT_MAX_MESSAGES + 1, true,
                                     NULL, NULL, &out, &len), PD_ERR_TOO_BIG);
    many[0].content_len = ENG_CHAT_MAX_BYTES; /* length check comes before any read */
    assert_int_equal(eng_chat_render(ENG_CHAT_CHATML, many, 2, true, NULL, NULL, &out, &len),
                     PD_ERR_TOO_BIG);
    free(many);
}

/* The built-in model: its GGUF tokenizer equals eng_tok_create_byte, its
 * template is detected as ChatML, and a chat encodes with control tokens. */
static void test_builtin_model(void **state)
{
    eng_tok_t *g, *b;
    eng_chat_kind_t k;
    char err[256];
    int32_t ids[256];
    size_t n, i;
    uint32_t v;

    (void)state;
    if (g_model_path == NULL)
        skip();
    assert_int_equal(eng_tok_load_path(g_model_path, &g, err, sizeof(err)), PD_OK);
    assert_int_equal(eng_tok_kind(g), ENG_TOK_BYTE);
    v = eng_tok_vocab_size(g);
    assert_int_equal(eng_tok_create_byte(v, &b), PD_OK);
    for (i = 0; i < v; i++) {
        size_t la, lb;
        const char *ta = eng_tok_token_text(g, (int32_t)i, &la);
        const char *tb = eng_tok_token_text(b, (int32_t)i, &lb);
        assert_int_equal(la, lb);
        assert_memory_equal(ta, tb, la);
        assert_int_equal(eng_tok_token_type(g, (int32_t)i), eng_tok_token_type(b, (int32_t)i));
    }
    assert_int_equal(eng_tok_bos(g), eng_tok_bos(b));
    assert_int_equal(eng_tok_eos(g), eng_tok_eos(b));
    assert_true(eng_tok_add_bos(g));
    assert_int_equal(eng_chat_for_tok(g, NULL, &k), PD_OK);
    assert_int_equal(k, ENG_CHAT_CHATML);
    assert_int_equal(eng_chat_for_tok(g, "llama3", &k), PD_OK);
    assert_int_equal(k, ENG_CHAT_LLAMA3);
    assert_int_equal(eng_chat_for_tok(b, NULL, &k), PD_OK);
    assert_int_equal(k, ENG_CHAT_CHATML);
    assert_int_equal(eng_chat_encode(g, ENG_CHAT_CHATML, conv + 3, 1, true, ids, 256, &n), PD_OK);
    /* <|im_start|> u s e r \n 2 + 2 ? <|im_end|> \n <|im_start|> a s s i s t a n t \n */
    assert_int_equal(n, 1 + 5 + 4 + 1 + 1 + 1 + 10);
    assert_int_equal(ids[0], 257);
    assert_int_equal(ids[10], 258);
    assert_int_equal(ids[12], 257);
    eng_tok_destroy(g);
    eng_tok_destroy(b);
    /* engine-aware loading: sim -> byte tokenizer, otherwise the GGUF */
    assert_int_equal(eng_tok_load_for("sim", "llama3-8b", &b, err, sizeof(err)), PD_OK);
    assert_int_equal(eng_tok_kind(b), ENG_TOK_BYTE);
    assert_int_equal(eng_tok_eos(b), 258);
    eng_tok_destroy(b);
    assert_int_equal(eng_tok_load_for("llama", g_model_path, &g, err, sizeof(err)), PD_OK);
    eng_tok_destroy(g);
    assert_int_equal(eng_tok_load_for("llama", "/nonexistent.gguf", &g, err, sizeof(err)),
                     PD_ERR_IO);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chatml),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_llama31),
        cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_mistral_zephyr),
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_tools),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_builtin_model),
    };
    g_model_path = argc > 1 ? argv[1] : NULL;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
