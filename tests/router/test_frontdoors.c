/* Unit tests: the event front doors (router/rtr_fd.h) - Anthropic's
 * Messages API and the Responses API: bodies -> the one request struct
 * (every refused field named), and their bodies and event streams. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rtr_anthropic.h"
#include "rtr_responses.h"

static const rtr_oai_limits_t lim = {
    .max_tokens_cap = 1024, .default_max_tokens = 16, .n_cap = 2,
    .max_prompt_bytes = 4096, .max_prompt_tokens = 100, .max_messages = 16,
    .vocab_size = 1000,
};

typedef pd_status_t (*parse_fn)(const char *, size_t, const rtr_oai_limits_t *, bool,
                                rtr_oai_req_t *, rtr_oai_error_t *);

static void expect_bad(parse_fn fn, bool count, const char *body, const char *param,
                       const char *code)
{
    rtr_oai_req_t req;
    rtr_oai_error_t err;
    if (fn(body, strlen(body), &lim, count, &req, &err) == PD_OK) {
        rtr_oai_req_free(&req);
        fail_msg("accepted: %s", body);
    }
    assert_int_equal(err.http_status, 400);
    if (param == NULL)
        assert_null(err.param);
    else if (err.param == NULL || strcmp(err.param, param) != 0)
        fail_msg("%s: param %s, want %s (%s)", body, err.param ? err.param : "(null)", param,
                 err.message);
    if (code != NULL)
        assert_string_equal(err.code, code);
    /* the message names the field, in this API's words */
    if (param != NULL && strstr(err.message, param) == NULL)
        fail_msg("message does not name %s: %s", param, err.message);
}

#define A(body) "{\"model\":\"m\",\"max_tokens\":32,\"messages\":[{\"role\":\"user\"," \
                "\"content\":\"hi\"}]" body "}"

static void test_anth_parse(void **state)
{
    (void)state;
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":40,\"system\":[{\"type\":\"text\",\"text\":\"Be \","
        "\"cache_control\":{\"type\":\"ephemeral\"}},{\"type\":\"text\",\"text\":\"brief.\"}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Let me see.\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\","
        "\"input\":{\"city\":\"Oslo\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
        "\"content\":[{\"type\":\"text\",\"text\":\"snow\"}]},{\"type\":\"text\",\"text\":\"And?\"}]}],"
        "\"tools\":[{\"name\":\"get_weather\",\"description\":\"d\",\"input_schema\":"
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}],"
        "\"tool_choice\":{\"type\":\"tool\",\"name\":\"get_weather\","
        "\"disable_parallel_tool_use\":true},"
        "\"stop_sequences\":[\"END\"],\"temperature\":0.5,\"top_p\":0.9,\"top_k\":7,"
        "\"metadata\":{\"user_id\":\"u1\"},\"stream\":true,\"seed\":18446744073709551615}";
    rtr_oai_req_t r;
    rtr_oai_error_t err;
    pd_status_t st = rtr_anth_parse(body, strlen(body), &lim, false, &r, &err);
    if (st != PD_OK)
        fail_msg("%s (%s)", err.message, err.param ? err.param : "-");
    assert_int_equal(r.api, RTR_API_MESSAGES);
    assert_int_equal(r.n_messages, 5);
    assert_string_equal(r.messages[0].role, "system");
    assert_string_equal(r.messages[0].content, "Be brief.");
    assert_string_equal(r.messages[2].role, "assistant");
    assert_string_equal(r.messages[2].content, "Let me see.");
    assert_int_equal(r.messages[2].n_calls, 1);
    assert_string_equal(r.messages[2].calls[0].name, "get_weather");
    assert_string_equal(r.messages[2].calls[0].arguments, "{\"city\":\"Oslo\"}");
    assert_string_equal(r.messages[3].role, "tool");
    assert_string_equal(r.messages[3].content, "snow");
    assert_string_equal(r.messages[4].role, "user");
    assert_string_equal(r.messages[4].content, "And?");
    assert_int_equal(r.n_tools, 1);
    assert_int_equal(r.tool_choice, RTR_OAI_TOOLS_NAMED);
    assert_true(r.single_call);
    assert_int_equal(r.max_tokens, 40);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "END");
    assert_true(r.temperature == 0.5f && r.top_p == 0.9f && r.top_k == 7);
    assert_true(r.stream && r.seed_set);
    assert_true(r.seed == UINT64_MAX); /* exact, not rounded through a double */
    assert_false(r.count_only);
    rtr_oai_req_free(&r);

    /* tool_choice any / none, an is_error result, count_tokens without max_tokens */
    const char *b2 = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
                     "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\","
                     "\"name\":\"f\",\"input\":{}}]},{\"role\":\"user\",\"content\":["
                     "{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":\"boom\","
                     "\"is_error\":true}]}],\"tools\":[{\"name\":\"f\",\"input_schema\":"
                     "{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"any\"}}";
    st = rtr_anth_parse(b2, strlen(b2), &lim, true, &r, &err);
    if (st != PD_OK)
        fail_msg("%s", err.message);
    assert_true(r.count_only);
    assert_int_equal(r.tool_choice, RTR_OAI_TOOLS_REQUIRED);
    assert_int_equal(r.n_messages, 3);
    assert_null(r.messages[1].content);
    assert_string_equal(r.messages[2].content, "Error: boom");
    rtr_oai_req_free(&r);
}

static void test_anth_refusals(void **state)
{
    (void)state;
    parse_fn P = rtr_anth_parse;
    expect_bad(P, false, A(",\"foo\":1"), "foo", "unknown_parameter");
    expect_bad(P, false, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
               "max_tokens", NULL);
    expect_bad(P, false, A(",\"temperature\":1.5"), "temperature", NULL);
    expect_bad(P, false, "{\"max_tokens\":5000,\"messages\":[{\"role\":\"user\",\"content\":"
               "\"hi\"}]}", "max_tokens", NULL);
    expect_bad(P, false, "{\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":"
               "\"hi\"}]}", "messages[0].role", NULL);
    expect_bad(P, false, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
               "[{\"type\":\"image\",\"source\":{}}]}]}", "messages[0].content[0].type",
               "unsupported_parameter");
    expect_bad(P, false, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
               "[{\"type\":\"text\",\"text\":\"a\",\"bogus\":1}]}]}",
               "messages[0].content[0].bogus", "unknown_parameter");
    expect_bad(P, false, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
               "[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":{}}]}]}",
               "messages[0].content[0].type", NULL);
    expect_bad(P, false, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
               "{\"role\":\"assistant\",\"content\":\"The answer is\"}]}", "messages[1]",
               "unsupported_parameter");
    expect_bad(P, false, A(",\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024}"),
               "thinking", "unsupported_parameter");
    expect_bad(P, false, A(",\"tools\":[{\"type\":\"bash_20250124\",\"name\":\"bash\"}]"),
               "tools[0].type", "unsupported_parameter");
    expect_bad(P, false, A(",\"tools\":[{\"name\":\"f\"}]"), "tools[0].input_schema", NULL);
    expect_bad(P, false, A(",\"tools\":[{\"name\":\"f\",\"input_schema\":{}},"
               "{\"name\":\"f\",\"input_schema\":{}}]"), "tools[1].name", NULL);
    expect_bad(P, false, A(",\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
               "\"tool_choice\":{\"type\":\"sometimes\"}"), "tool_choice.type", NULL);
    expect_bad(P, false, A(",\"stop_sequences\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\","
               "\"8\",\"9\"]"), "stop_sequences", NULL);
    expect_bad(P, false, A(",\"container\":\"c1\""), "container", "unsupported_parameter");
    expect_bad(P, false, A(",\"mcp_servers\":[{\"type\":\"url\"}]"), "mcp_servers",
               "unsupported_parameter");
    expect_bad(P, false, A(",\"metadata\":{\"tag\":\"x\"}"), "metadata.tag", NULL);
    expect_bad(P, false, "{\"max_tokens\":5,\"system\":[{\"type\":\"text\",\"text\":\"s\","
               "\"cache_control\":{\"type\":\"forever\"}}],\"messages\":[{\"role\":\"user\","
               "\"content\":\"x\"}]}", "system[0].cache_control", NULL);
    expect_bad(P, true, A(""), "max_tokens", "unknown_parameter"); /* count_tokens */
    expect_bad(P, false, A(",\"seed\":1.5"), "seed", NULL);
    expect_bad(P, false, "{\"max_tokens\":5,\"messages\":[],\"max_tokens\":6}", "max_tokens",
               NULL);
}

#define R(body) "{\"model\":\"m\",\"input\":\"hi\"" body "}"

static void test_resp_parse(void **state)
{
    (void)state;
    const char *body =
        "{\"model\":\"m\",\"instructions\":\"Be brief.\",\"input\":["
        "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Weather \"},"
        "{\"type\":\"input_text\",\"text\":\"in Oslo?\"}]},"
        "{\"type\":\"message\",\"role\":\"assistant\",\"id\":\"msg_1\",\"status\":\"completed\","
        "\"content\":[{\"type\":\"output_text\",\"text\":\"Checking.\",\"annotations\":[]}]},"
        "{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"call_1\",\"name\":\"w\","
        "\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\"}\",\"status\":\"completed\"},"
        "{\"type\":\"function_call\",\"call_id\":\"call_2\",\"name\":\"w\","
        "\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"snow\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_2\",\"output\":\"sun\"}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"w\",\"description\":\"d\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}},\"strict\":true}],"
        "\"tool_choice\":{\"type\":\"function\",\"name\":\"w\"},\"max_output_tokens\":50,"
        "\"temperature\":0.7,\"seed\":5,\"store\":false,\"parallel_tool_calls\":false,"
        "\"truncation\":\"disabled\",\"stream\":true}";
    rtr_oai_req_t r;
    rtr_oai_error_t err;
    pd_status_t st = rtr_resp_parse(body, strlen(body), &lim, false, &r, &err);
    if (st != PD_OK)
        fail_msg("%s (%s)", err.message, err.param ? err.param : "-");
    assert_int_equal(r.api, RTR_API_RESPONSES);
    assert_int_equal(r.n_messages, 5);
    assert_string_equal(r.messages[0].role, "system");
    assert_string_equal(r.messages[1].content, "Weather in Oslo?");
    assert_string_equal(r.messages[2].role, "assistant");
    assert_string_equal(r.messages[2].content, "Checking.");
    assert_int_equal(r.messages[2].n_calls, 2); /* both calls join the one turn */
    assert_string_equal(r.messages[2].calls[0].arguments, "{\"city\":\"Oslo\"}");
    assert_string_equal(r.messages[3].role, "tool");
    assert_string_equal(r.messages[4].content, "sun");
    assert_int_equal(r.tool_choice, RTR_OAI_TOOLS_NAMED);
    assert_true(r.single_call && r.stream && r.seed_set && r.seed == 5);
    assert_int_equal(r.max_tokens, 50);
    rtr_oai_req_free(&r);

    const char *b2 = R(",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"x\","
                       "\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":"
                       "{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}");
    st = rtr_resp_parse(b2, strlen(b2), &lim, false, &r, &err);
    if (st != PD_OK)
        fail_msg("%s", err.message);
    assert_int_equal(r.gram_kind, RTR_OAI_GRAM_JSON_SCHEMA);
    assert_int_equal(r.n_messages, 1);
    assert_int_equal(r.max_tokens, 16); /* the default */
    rtr_oai_req_free(&r);
}

static void test_resp_refusals(void **state)
{
    (void)state;
    parse_fn P = rtr_resp_parse;
    expect_bad(P, false, R(",\"foo\":1"), "foo", "unknown_parameter");
    expect_bad(P, false, R(",\"store\":true"), "store", "unsupported_parameter");
    expect_bad(P, false, R(",\"previous_response_id\":\"resp_1\""), "previous_response_id",
               "unsupported_parameter");
    expect_bad(P, false, R(",\"metadata\":{\"k\":\"v\"}"), "metadata", "unsupported_parameter");
    expect_bad(P, false, R(",\"include\":[\"reasoning.encrypted_content\"]"), "include",
               "unsupported_parameter");
    expect_bad(P, false, R(",\"truncation\":\"auto\""), "truncation", "unsupported_parameter");
    expect_bad(P, false, R(",\"reasoning\":{\"effort\":\"high\"}"), "reasoning",
               "unsupported_parameter");
    expect_bad(P, false, R(",\"background\":true"), "background", "unsupported_parameter");
    expect_bad(P, false, "{\"model\":\"m\"}", "input", NULL);
    expect_bad(P, false, "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\","
               "\"image_url\":\"x\"}]}]}", "input[0].content[0].type", "unsupported_parameter");
    expect_bad(P, false, "{\"input\":[{\"type\":\"reasoning\",\"summary\":[]}]}", "input[0].type",
               "unsupported_parameter");
    expect_bad(P, false, "{\"input\":[{\"role\":\"user\",\"content\":\"x\",\"extra\":1}]}",
               "input[0].extra", "unknown_parameter");
    expect_bad(P, false, "{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\","
               "\"name\":\"f\",\"arguments\":\"[1]\"}]}", "input[0].arguments", NULL);
    expect_bad(P, false, R(",\"tools\":[{\"type\":\"web_search\"}]"), "tools[0].type",
               "unsupported_parameter");
    expect_bad(P, false, R(",\"tools\":[{\"type\":\"function\",\"name\":\"bad name\"}]"),
               "tools[0].name", NULL);
    expect_bad(P, false, R(",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"color\":1}]"),
               "tools[0].color", "unknown_parameter");
    expect_bad(P, false, R(",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
               "\"tool_choice\":{\"type\":\"allowed_tools\"}"), "tool_choice",
               "unsupported_parameter");
    expect_bad(P, false, R(",\"text\":{\"format\":{\"type\":\"yaml\"}}"), "text.format.type",
               NULL);
    expect_bad(P, false, R(",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"x\","
               "\"schema\":{\"type\":\"object\",\"patternProperties\":{\"a\":{}}}}}"),
               "text.format", "unsupported_schema");
    expect_bad(P, false, R(",\"max_output_tokens\":5000"), "max_output_tokens", NULL);
    expect_bad(P, false, R(",\"temperature\":3"), "temperature", NULL);
    expect_bad(P, true, R(""), NULL, NULL);
}

/* The events of an SSE text: each "event: T\ndata: J\n\n" with J's type T;
 * *last gets the last J. */
static int events(const char *sse, cJSON **last)
{
    int n = 0;
    const char *p = sse;
    while (*p != '\0') {
        assert_memory_equal(p, "event: ", 7);
        const char *nl = strchr(p, '\n');
        assert_non_null(nl);
        char type[96];
        snprintf(type, sizeof(type), "%.*s", (int)(nl - p - 7), p + 7);
        assert_memory_equal(nl + 1, "data: ", 6);
        const char *end = strstr(nl + 7, "\n\n");
        assert_non_null(end);
        cJSON *j = cJSON_ParseWithLength(nl + 7, (size_t)(end - nl - 7));
        assert_non_null(j);
        assert_string_equal(cJSON_GetObjectItem(j, "type")->valuestring, type);
        if (last != NULL) {
            cJSON_Delete(*last);
            *last = j;
        } else {
            cJSON_Delete(j);
        }
        n++;
        p = end + 2;
    }
    return n;
}

/* Concatenated event types of an SSE text, "a,b,c". */
static void event_types(const char *sse, char *out, size_t cap)
{
    out[0] = '\0';
    for (const char *p = strstr(sse, "event: "); p != NULL; p = strstr(p + 1, "\nevent: ")) {
        if (*p == '\n')
            p++;
        size_t n = strcspn(p + 7, "\n");
        size_t l = strlen(out);
        snprintf(out + l, cap - l, "%s%.*s", l ? "," : "", (int)n, p + 7);
    }
}

static void test_anth_render(void **state)
{
    (void)state;
    rtr_oai_req_t o;
    memset(&o, 0, sizeof(o));
    o.max_tokens = 10;
    rtr_oai_resp_meta_t m = { "msg_abc", "e2e-model", 1700000000, RTR_API_MESSAGES };
    rtr_oai_call_t call = { "call_XYZ", "get_weather", "{\"city\":\"Oslo\"}" };
    rtr_fd_answer_t a = { &m, &o, "Sure", 4, "tool_calls", NULL, { &call, 1 }, { 30, 9, 16 } };
    char *body = rtr_anth_api.body(&a);
    cJSON *j = cJSON_Parse(body);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "type")->valuestring, "message");
    assert_string_equal(cJSON_GetObjectItem(j, "stop_reason")->valuestring, "tool_use");
    cJSON *c = cJSON_GetObjectItem(j, "content");
    assert_int_equal(cJSON_GetArraySize(c), 2);
    cJSON *tu = cJSON_GetArrayItem(c, 1);
    assert_string_equal(cJSON_GetObjectItem(tu, "id")->valuestring, "toolu_XYZ");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(tu, "input"), "city")->valuestring,
                        "Oslo");
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "input_tokens")->valueint, 14);
    assert_int_equal(cJSON_GetObjectItem(u, "cache_read_input_tokens")->valueint, 16);
    assert_int_equal(cJSON_GetObjectItem(u, "output_tokens")->valueint, 9);
    cJSON_Delete(j);
    free(body);

    /* the stream: text then a call; stop reasons */
    rtr_fd_stream_t st;
    memset(&st, 0, sizeof(st));
    a.finish = NULL;
    char buf[8192] = "", types[1024];
    char *s = rtr_anth_api.stream_head(&st, &a);
    strcat(buf, s);
    free(s);
    s = rtr_anth_api.stream_text(&st, &a, "Su", 2);
    strcat(buf, s);
    free(s);
    s = rtr_anth_api.stream_text(&st, &a, "re", 2);
    strcat(buf, s);
    free(s);
    a.finish = "tool_calls";
    s = rtr_anth_api.stream_end(&st, &a);
    strcat(buf, s);
    free(s);
    cJSON *last = NULL;
    assert_int_equal(events(buf, &last), 10);
    cJSON_Delete(last);
    event_types(buf, types, sizeof(types));
    assert_string_equal(types, "message_start,content_block_start,content_block_delta,"
                               "content_block_delta,content_block_stop,content_block_start,"
                               "content_block_delta,content_block_stop,message_delta,"
                               "message_stop");
    rtr_fd_stream_free(&st);
    assert_non_null(strstr(buf, "\"partial_json\":\"{\\\"city\\\":\\\"Oslo\\\"}\""));
    assert_non_null(strstr(buf, "\"index\":1"));

    a.calls.n = 0;
    a.finish = "stop";
    a.stop_seq = "END";
    body = rtr_anth_api.body(&a);
    assert_non_null(strstr(body, "\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"END\""));
    free(body);
    a.stop_seq = NULL;
    body = rtr_anth_api.body(&a);
    assert_non_null(strstr(body, "\"stop_reason\":\"end_turn\""));
    free(body);
    a.finish = "length";
    body = rtr_anth_api.body(&a);
    assert_non_null(strstr(body, "\"stop_reason\":\"max_tokens\""));
    free(body);

    /* errors: Anthropic's envelope, the type from the status */
    rtr_oai_error_t err;
    rtr_oai_error_set(&err, 401, "invalid_request_error", "invalid_api_key", NULL, "no key");
    body = rtr_anth_error_json(&err);
    assert_string_equal(body, "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\","
                              "\"message\":\"no key\"}}");
    free(body);
    err.http_status = 503;
    memset(&st, 0, sizeof(st));
    s = rtr_anth_api.stream_error(&st, &a, &err);
    assert_non_null(strstr(s, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
                              "\"overloaded_error\""));
    free(s);
}

static void test_resp_render(void **state)
{
    (void)state;
    rtr_oai_req_t o;
    memset(&o, 0, sizeof(o));
    o.max_tokens = 10;
    o.temperature = 1;
    o.top_p = 1;
    rtr_oai_resp_meta_t m = { "resp_abc", "e2e-model", 1700000000, RTR_API_RESPONSES };
    rtr_oai_call_t call = { "call_XYZ", "w", "{\"a\":1}" };
    rtr_fd_answer_t a = { &m, &o, "Hi", 2, "stop", NULL, { NULL, 0 }, { 30, 2, 16 } };
    char *body = rtr_resp_api.body(&a);
    cJSON *j = cJSON_Parse(body);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "response");
    assert_string_equal(cJSON_GetObjectItem(j, "status")->valuestring, "completed");
    cJSON *out = cJSON_GetObjectItem(j, "output");
    assert_int_equal(cJSON_GetArraySize(out), 1);
    cJSON *part = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(out, 0), "content"), 0);
    assert_string_equal(cJSON_GetObjectItem(part, "type")->valuestring, "output_text");
    assert_string_equal(cJSON_GetObjectItem(part, "text")->valuestring, "Hi");
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "input_tokens")->valueint, 30);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(u, "input_tokens_details"),
                                         "cached_tokens")->valueint, 16);
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, 32);
    cJSON_Delete(j);
    free(body);
    a.finish = "length";
    body = rtr_resp_api.body(&a);
    assert_non_null(strstr(body, "\"status\":\"incomplete\""));
    assert_non_null(strstr(body, "\"reason\":\"max_output_tokens\""));
    free(body);

    /* the stream: text, then a call, response.completed with both */
    rtr_fd_stream_t st;
    memset(&st, 0, sizeof(st));
    a.finish = NULL;
    char buf[8192] = "", types[1024];
    char *s = rtr_resp_api.stream_head(&st, &a);
    strcat(buf, s);
    free(s);
    s = rtr_resp_api.stream_text(&st, &a, "H", 1);
    strcat(buf, s);
    free(s);
    s = rtr_resp_api.stream_text(&st, &a, "i", 1);
    strcat(buf, s);
    free(s);
    a.finish = "tool_calls";
    a.calls = (rtr_oai_calls_t){ &call, 1 };
    s = rtr_resp_api.stream_end(&st, &a);
    strcat(buf, s);
    free(s);
    rtr_fd_stream_free(&st);
    event_types(buf, types, sizeof(types));
    assert_string_equal(types, "response.created,response.in_progress,"
                               "response.output_item.added,response.content_part.added,"
                               "response.output_text.delta,response.output_text.delta,"
                               "response.output_text.done,response.content_part.done,"
                               "response.output_item.done,response.output_item.added,"
                               "response.function_call_arguments.delta,"
                               "response.function_call_arguments.done,"
                               "response.output_item.done,response.completed");
    cJSON *last = NULL;
    assert_int_equal(events(buf, &last), 14);
    assert_int_equal(cJSON_GetObjectItem(last, "sequence_number")->valueint, 13);
    cJSON *r = cJSON_GetObjectItem(last, "response");
    out = cJSON_GetObjectItem(r, "output");
    assert_int_equal(cJSON_GetArraySize(out), 2);
    part = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(out, 0), "content"), 0);
    assert_string_equal(cJSON_GetObjectItem(part, "text")->valuestring, "Hi");
    cJSON *fc = cJSON_GetArrayItem(out, 1);
    assert_string_equal(cJSON_GetObjectItem(fc, "type")->valuestring, "function_call");
    assert_string_equal(cJSON_GetObjectItem(fc, "call_id")->valuestring, "call_XYZ");
    assert_string_equal(cJSON_GetObjectItem(fc, "arguments")->valuestring, "{\"a\":1}");
    cJSON_Delete(last);

    rtr_oai_error_t err;
    rtr_oai_error_set(&err, 502, "server_error", "backend_failed", NULL, "lost");
    memset(&st, 0, sizeof(st));
    s = rtr_resp_api.stream_error(&st, &a, &err);
    assert_non_null(strstr(s, "event: response.failed\n"));
    assert_non_null(strstr(s, "\"error\":{\"code\":\"backend_failed\",\"message\":\"lost\"}"));
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_anth_parse),
        cmocka_unit_test(test_anth_refusals),
        cmocka_unit_test(test_resp_parse),
        cmocka_unit_test(test_resp_refusals),
        cmocka_unit_test(test_anth_render),
        cmocka_unit_test(test_resp_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
