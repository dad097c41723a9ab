/* test_tools.c - tool calling's pure parts (router/rtr_tools.c): the forced
 * call's schema (compiled and walked by engine/gram), scanning a streamed
 * answer, parsing calls out of Hermes and Llama answers, and the request
 * parser's tools / tool_choice / tool_calls rules (rtr_openai.c). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng_gram.h"
#include "rtr_tools.h"

static rtr_oai_tool_t tools[2];

static int setup(void **st)
{
    (void)st;
    memset(tools, 0, sizeof(tools));
    snprintf(tools[0].name, sizeof(tools[0].name), "get_weather");
    tools[0].params = strdup("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
                             "\"required\":[\"city\"],\"additionalProperties\":false}");
    snprintf(tools[1].name, sizeof(tools[1].name), "add");
    tools[1].params = strdup("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
                             "\"b\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"]}");
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    free(tools[0].params);
    free(tools[1].params);
    return 0;
}

static bool feeds(const eng_gram_t *g, const char *s)
{
    eng_gram_state_t *st = NULL;
    assert_int_equal(eng_gram_state_create(g, &st), PD_OK);
    bool ok = eng_gram_feed(st, (const uint8_t *)s, strlen(s)) && eng_gram_complete(st);
    eng_gram_state_free(st);
    return ok;
}

/* The schema of a forced call admits exactly the calls of the named tool
 * (or, "required", of any tool) with valid arguments. */
static void test_call_schema(void **st)
{
    (void)st;
    size_t len = 0;
    char *named = rtr_tools_call_schema(tools, 2, 1, "arguments", &len);
    assert_non_null(named);
    eng_gram_t *g = NULL;
    char why[200];
    assert_int_equal(eng_gram_compile(ENG_GRAM_JSON_SCHEMA, named, len, &g, why, sizeof(why)),
                     PD_OK);
    assert_true(feeds(g, "{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}"));
    assert_false(feeds(g, "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"x\"}}"));
    assert_false(feeds(g, "{\"name\":\"add\",\"arguments\":{\"a\":1}}"));
    assert_false(feeds(g, "{\"name\":\"add\",\"parameters\":{\"a\":1,\"b\":2}}"));
    eng_gram_free(g);
    free(named);
    char *any = rtr_tools_call_schema(tools, 2, -1, "parameters", &len);
    assert_non_null(any);
    assert_int_equal(eng_gram_compile(ENG_GRAM_JSON_SCHEMA, any, len, &g, why, sizeof(why)), PD_OK);
    assert_true(feeds(g, "{\"name\":\"add\",\"parameters\":{\"a\":1,\"b\":2}}"));
    assert_true(feeds(g, "{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Oslo\"}}"));
    assert_false(feeds(g, "{\"name\":\"get_weather\",\"parameters\":{\"a\":1,\"b\":2}}"));
    assert_false(feeds(g, "{\"name\":\"nope\",\"parameters\":{}}"));
    eng_gram_free(g);
    free(any);
    assert_null(rtr_tools_call_schema(tools, 2, 2, "arguments", &len));
}

/* "required" with many tools: every tool's branch stays reachable (the
 * grammar keeps one configuration per tool while the names are typed). */
static void test_call_schema_many(void **st)
{
    (void)st;
    enum { NT = 40 };
    rtr_oai_tool_t many[NT];
    memset(many, 0, sizeof(many));
    for (int i = 0; i < NT; i++) {
        snprintf(many[i].name, sizeof(many[i].name), "tool_%02d", i);
        many[i].params = strdup(i % 2 ? "{\"type\":\"object\",\"properties\":{\"n\":"
                                        "{\"type\":\"integer\"}},\"required\":[\"n\"]}"
                                      : "{\"type\":\"object\",\"properties\":{}}");
    }
    size_t len = 0;
    char *any = rtr_tools_call_schema(many, NT, -1, "arguments", &len);
    assert_non_null(any);
    eng_gram_t *g = NULL;
    char why[200];
    if (eng_gram_compile(ENG_GRAM_JSON_SCHEMA, any, len, &g, why, sizeof(why)) != PD_OK)
        fail_msg("%s", why);
    char call[128];
    for (int i = 0; i < NT; i++) {
        snprintf(call, sizeof(call), "{\"name\":\"tool_%02d\",\"arguments\":%s}", i,
                 i % 2 ? "{\"n\":7}" : "{}");
        if (!feeds(g, call))
            fail_msg("tool %d unreachable: %s", i, call);
        snprintf(call, sizeof(call), "{\"name\":\"tool_%02d\",\"arguments\":%s}", i,
                 i % 2 ? "{}" : "{\"n\":7}");
        assert_false(feeds(g, call));
    }
    eng_gram_free(g);
    free(any);
    for (int i = 0; i < NT; i++)
        free(many[i].params);
}

/* A forced call cut short still reads as a call: name + arguments so far. */
static void test_partial(void **st)
{
    (void)st;
    static const struct {
        const char *key, *text;
        int32_t named;
        const char *name, *args;
    } ok[] = {
        { "arguments", "{\"name\":\"get_weather\",\"arguments\":{\"city\":\" is", -1,
          "get_weather", "{\"city\":\" is" },
        { "parameters", "{\"name\":\"add\",\"parameters\":{\"a\":1", -1, "add", "{\"a\":1" },
        { "arguments", "{\"name\":\"get_weather\",\"argu", -1, "get_weather", "" },
        { "arguments", "{\"name\":\"ad", -1, "add", "" },
        { "arguments", "{\"na", 1, "add", "" },
        { "arguments", "", 0, "get_weather", "" },
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        rtr_oai_call_t c;
        assert_int_equal(rtr_tools_partial(ok[i].key, ok[i].text, strlen(ok[i].text), tools, 2,
                                           ok[i].named, &c), PD_OK);
        assert_string_equal(c.name, ok[i].name);
        assert_string_equal(c.arguments, ok[i].args);
        rtr_tools_calls_free(&c, 1);
    }
    rtr_oai_call_t c;
    const char *bad[] = { "Sure, here", "{\"name\":\"sub\",", "{\"name\":\"ge" };
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(rtr_tools_partial("arguments", bad[i], strlen(bad[i]), tools, 2,
                                           i == 2 ? 1 : -1, &c), PD_ERR_BAD_INPUT);
}

static void test_scan(void **st)
{
    (void)st;
    const char *h = "<tool_call>\n";
    assert_int_equal(rtr_tools_scan(h, "", 0), RTR_TOOLSCAN_MAYBE);
    assert_int_equal(rtr_tools_scan(h, "  <tool", 7), RTR_TOOLSCAN_MAYBE);
    assert_int_equal(rtr_tools_scan(h, "<tool_call>", 11), RTR_TOOLSCAN_CALL);
    assert_int_equal(rtr_tools_scan(h, "<tool_call>\n{", 13), RTR_TOOLSCAN_CALL);
    assert_int_equal(rtr_tools_scan(h, "<tools", 6), RTR_TOOLSCAN_TEXT);
    assert_int_equal(rtr_tools_scan(h, "Hello", 5), RTR_TOOLSCAN_TEXT);
    assert_int_equal(rtr_tools_scan("", "\n{", 2), RTR_TOOLSCAN_CALL); /* Llama: JSON */
    assert_int_equal(rtr_tools_scan("", "Sure", 4), RTR_TOOLSCAN_TEXT);
}

static void parse_ok(const char *opener, const char *key, bool forced, const char *text,
                     uint32_t want_n, const char *name0, const char *args0)
{
    rtr_oai_call_t c[4];
    memset(c, 0, sizeof(c));
    uint32_t n = 99;
    assert_int_equal(rtr_tools_parse(opener, key, forced, text, strlen(text), tools, 2, c, 4, &n),
                     PD_OK);
    assert_int_equal(n, want_n);
    assert_string_equal(c[0].name, name0);
    assert_string_equal(c[0].arguments, args0);
    assert_null(c[0].id);
    rtr_tools_calls_free(c, n);
}

static void parse_bad(const char *opener, const char *key, bool forced, const char *text)
{
    rtr_oai_call_t c[4];
    memset(c, 0, sizeof(c));
    uint32_t n = 99;
    assert_int_equal(rtr_tools_parse(opener, key, forced, text, strlen(text), tools, 2, c, 4, &n),
                     PD_ERR_BAD_INPUT);
    assert_int_equal(n, 0);
    for (int i = 0; i < 4; i++)
        assert_null(c[i].name);
}

static void test_parse(void **st)
{
    (void)st;
    const char *h = "<tool_call>\n";
    /* forced Hermes: the opener was in the prompt, the answer is the JSON */
    parse_ok(h, "arguments", true, "{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}", 1, "add",
             "{\"a\":1,\"b\":2}");
    /* auto Hermes: blocks, the last one may lack its closer (EOS) */
    parse_ok(h, "arguments", false,
             "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
             "</tool_call>\n<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}", 2,
             "get_weather", "{\"city\":\"Oslo\"}");
    /* Llama: one JSON object with "parameters" */
    parse_ok("", "parameters", false, " {\"name\": \"add\", \"parameters\": {\"a\": 3, \"b\": 4}} ",
             1, "add", "{\"a\":3,\"b\":4}");
    parse_bad(h, "arguments", true, "{\"name\":\"add\",\"arguments\":{\"a\":1");   /* cut off */
    parse_bad(h, "arguments", true, "{\"name\":\"sub\",\"arguments\":{}}");       /* unknown */
    parse_bad(h, "arguments", true, "{\"name\":\"add\",\"arguments\":[1]}");      /* not object */
    parse_bad(h, "arguments", true, "{\"name\":\"add\",\"arguments\":{},\"x\":1}");
    parse_bad(h, "arguments", false, "<tool_call>\n{\"name\":\"add\"} trailing");
    parse_bad(h, "arguments", false, "<tool_call>{\"name\":\"add\",\"arguments\":{}}</tool_call>x");
    parse_bad("", "parameters", false, "{\"name\":\"add\",\"arguments\":{}}");
    /* parallel_tool_calls false: room for one call, two in the answer: the
     * first is the answer, the second dropped */
    rtr_oai_call_t one[1];
    memset(one, 0, sizeof(one));
    uint32_t n1 = 9;
    const char *two = "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1}}</tool_call>"
                      "<tool_call>{\"name\":\"get_weather\",\"arguments\":{}}</tool_call>";
    assert_int_equal(rtr_tools_parse(h, "arguments", false, two, strlen(two), tools, 2, one, 1,
                                     &n1), PD_OK);
    assert_int_equal(n1, 1);
    assert_string_equal(one[0].name, "add");
    assert_string_equal(one[0].arguments, "{\"a\":1}");
    rtr_tools_calls_free(one, 1);
    assert_true(rtr_tools_name_ok("a_b-C9"));
    assert_false(rtr_tools_name_ok(""));
    assert_false(rtr_tools_name_ok("a b"));
    assert_false(rtr_tools_name_ok("x\"y"));
}

static const rtr_oai_limits_t lim = {
    .max_tokens_cap = 1024, .default_max_tokens = 16, .n_cap = 2,
    .max_prompt_bytes = 1 << 20, .max_prompt_tokens = 4096, .max_messages = 64,
    .vocab_size = 260,
};

#define TOOLS_JSON "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"," \
    "\"description\":\"d\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":" \
    "{\"type\":\"integer\"}},\"required\":[\"x\"]}}},{\"type\":\"function\",\"function\":" \
    "{\"name\":\"g\"}}]"

static void expect_400(const char *body, const char *param)
{
    rtr_oai_req_t r;
    rtr_oai_error_t err;
    memset(&err, 0, sizeof(err));
    pd_status_t s = rtr_oai_parse(RTR_API_CHAT, body, strlen(body), &lim, &r, &err);
    if (s == PD_OK)
        rtr_oai_req_free(&r);
    assert_int_equal(s, PD_ERR_BAD_INPUT);
    assert_int_equal(err.http_status, 400);
    assert_non_null(err.param);
    assert_string_equal(err.param, param);
}

static void test_request(void **st)
{
    (void)st;
    rtr_oai_req_t r;
    rtr_oai_error_t err;
    const char *ok = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                     "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
                     "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
                     "\"{\\\"x\\\": 1}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\","
                     "\"content\":\"42\"}]," TOOLS_JSON ",\"tool_choice\":{\"type\":\"function\","
                     "\"function\":{\"name\":\"g\"}}}";
    assert_int_equal(rtr_oai_parse(RTR_API_CHAT, ok, strlen(ok), &lim, &r, &err), PD_OK);
    assert_int_equal(r.n_tools, 2);
    assert_int_equal(r.tool_choice, RTR_OAI_TOOLS_NAMED);
    assert_int_equal(r.tool_named, 1);
    assert_string_equal(r.tools[1].params, "{\"type\":\"object\",\"properties\":{}}");
    assert_non_null(strstr(r.tools[0].def, "\"description\":\"d\""));
    assert_int_equal(r.messages[1].n_calls, 1);
    assert_null(r.messages[1].content);
    assert_string_equal(r.messages[1].calls[0].arguments, "{\"x\":1}");
    rtr_oai_req_free(&r);
    /* default: auto with tools, none without */
    const char *dflt = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]," TOOLS_JSON "}";
    assert_int_equal(rtr_oai_parse(RTR_API_CHAT, dflt, strlen(dflt), &lim, &r, &err), PD_OK);
    assert_int_equal(r.tool_choice, RTR_OAI_TOOLS_AUTO);
    rtr_oai_req_free(&r);

    const char *M = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],";
    char b[2048];
#define B(...) (snprintf(b, sizeof(b), __VA_ARGS__), b)
    expect_400(B("%s\"tool_choice\":\"required\"}", M), "tool_choice");
    expect_400(B("%s" TOOLS_JSON ",\"tool_choice\":{\"type\":\"function\",\"function\":"
                 "{\"name\":\"h\"}}}", M), "tool_choice");
    expect_400(B("%s" TOOLS_JSON ",\"tool_choice\":\"sometimes\"}", M), "tool_choice");
    expect_400(B("%s\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}", M),
               "tools[0].function.name");
    expect_400(B("%s\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},"
                 "{\"type\":\"function\",\"function\":{\"name\":\"a\"}}]}", M),
               "tools[1].function.name");
    expect_400(B("%s\"tools\":[{\"type\":\"code\"}]}", M), "tools[0]");
    expect_400(B("%s\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\","
                 "\"examples\":[]}}]}", M), "tools[0].function.examples");
    /* a forced call's parameters must be expressible by the grammar */
    expect_400(B("%s\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\","
                 "\"parameters\":{\"type\":\"object\",\"properties\":{\"s\":{\"type\":"
                 "\"string\",\"pattern\":\"(?=x)\"}}}}}],\"tool_choice\":\"required\"}", M),
               "tools[0].function.parameters");
    /* ... and names the keyword by its pointer in the parameters */
    B("%s\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"z\"}},{\"type\":"
      "\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"object\","
      "\"properties\":{\"s\":{\"type\":\"string\",\"pattern\":\"(?=x)\"}}}}}],"
      "\"tool_choice\":\"required\"}", M);
    assert_int_equal(rtr_oai_parse(RTR_API_CHAT, b, strlen(b), &lim, &r, &err), PD_ERR_BAD_INPUT);
    if (strstr(err.message, "lookaround") == NULL ||
        strstr(err.message, "at /properties/s/pattern") == NULL)
        fail_msg("%s", err.message);
    expect_400(B("%s" TOOLS_JSON ",\"tool_choice\":\"required\",\"response_format\":"
                 "{\"type\":\"json_object\"}}", M), "tool_choice");
    /* logprobs with tools, auto and forced */
    const char *lp[] = { ",\"logprobs\":true,\"top_logprobs\":2}",
                         ",\"logprobs\":true,\"tool_choice\":\"required\"}" };
    for (int i = 0; i < 2; i++) {
        B("%s" TOOLS_JSON "%s", M, lp[i]);
        if (rtr_oai_parse(RTR_API_CHAT, b, strlen(b), &lim, &r, &err) != PD_OK)
            fail_msg("refused (%s): %s", err.message, b);
        assert_true(r.logprobs);
        rtr_oai_req_free(&r);
    }
    expect_400(B("%s\"functions\":[{\"name\":\"f\"}]}", M), "functions");
    expect_400("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"type\":"
               "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"[1]\"}}]}]}",
               "messages[0].tool_calls[0].function.arguments");
    expect_400("{\"messages\":[{\"role\":\"tool\",\"tool_call_id\":\"c\"}]}",
               "messages[0].content");
    /* the cap on tools */
    size_t o = (size_t)snprintf(b, sizeof(b), "%s\"tools\":[", M);
    static char big[8192];
    memcpy(big, b, o);
    for (int i = 0; i <= RTR_OAI_MAX_TOOLS; i++)
        o += (size_t)snprintf(big + o, sizeof(big) - o, "%s{\"type\":\"function\",\"function\":"
                              "{\"name\":\"t%d\"}}", i ? "," : "", i);
    snprintf(big + o, sizeof(big) - o, "]}");
    expect_400(big, "tools");
    /* "required" with the most tools there may be */
    o = (size_t)snprintf(big, sizeof(big), "%s\"tool_choice\":\"required\",\"tools\":[", M);
    for (int i = 0; i < RTR_OAI_MAX_TOOLS; i++)
        o += (size_t)snprintf(big + o, sizeof(big) - o, "%s{\"type\":\"function\",\"function\":"
                              "{\"name\":\"t%d\"}}", i ? "," : "", i);
    snprintf(big + o, sizeof(big) - o, "]}");
    if (rtr_oai_parse(RTR_API_CHAT, big, strlen(big), &lim, &r, &err) != PD_OK)
        fail_msg("refused: %s", err.message);
    assert_int_equal(r.n_tools, RTR_OAI_MAX_TOOLS);
    assert_int_equal(r.tool_choice, RTR_OAI_TOOLS_REQUIRED);
    rtr_oai_req_free(&r);
}

int main(void)
{
    const struct CMUnitTest t[] = {
        cmocka_unit_test(test_call_schema),
        cmocka_unit_test(test_call_schema_many),
        cmocka_unit_test(test_partial),
        cmocka_unit_test(test_scan),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_request),
    };
    return cmocka_run_group_tests_name("rtr-tools", t, setup, teardown);
}
