/* Unit tests: OpenAI request parsing/validation and response bodies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rtr_openai.h"

static const rtr_oai_limits_t lim = {
    .max_tokens_cap = 1024, .default_max_tokens = 16, .n_cap = 2,
    .max_prompt_bytes = 4096, .max_prompt_tokens = 100, .max_messages = 8,
    .vocab_size = 1000,
};

static pd_status_t parse(rtr_api_t api, const char *body, rtr_oai_req_t *req,
                         rtr_oai_error_t *err)
{
    return rtr_oai_parse(api, body, strlen(body), &lim, req, err);
}

static void expect_bad(rtr_api_t api, const char *body, int status, const char *param,
                       const char *code)
{
    rtr_oai_req_t req;
    rtr_oai_error_t err;
    pd_status_t st = parse(api, body, &req, &err);
    if (st == PD_OK)
        fail_msg("accepted: %s", body);
    assert_int_equal(err.http_status, status);
    if (param == NULL)
        assert_null(err.param);
    else
        assert_string_equal(err.param, param);
    if (code != NULL)
        assert_string_equal(err.code, code);
    /* the envelope is valid JSON with the OpenAI shape */
    char *json = rtr_oai_error_json(&err);
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root);
    cJSON *e = cJSON_GetObjectItem(root, "error");
    assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
    assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, err.type);
    assert_non_null(cJSON_GetObjectItem(e, "param"));
    assert_non_null(cJSON_GetObjectItem(e, "code"));
    cJSON_Delete(root);
    free(json);
}

static void test_completion_defaults(void **state)
{
    rtr_oai_req_t req;
    rtr_oai_error_t err;
    assert_int_equal(parse(RTR_API_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"Hi there\"}",
                           &req, &err), PD_OK);
    assert_string_equal(req.model, "m");
    assert_string_equal(req.prompt, "Hi there");
    assert_int_equal(req.prompt_len, 8);
    assert_int_equal(req.max_tokens, 16);
    assert_int_equal(req.n, 1);
    assert_false(req.stream);
    assert_true(req.temperature == 1.0f && req.top_p == 1.0f);
    rtr_oai_req_free(&req);
}

static void test_completion_full(void **state)
{
    rtr_oai_req_t req;
    rtr_oai_error_t err;
    const char *body = "{\"prompt\":[1,2,999],\"max_tokens\":1024,\"temperature\":0,"
                       "\"top_p\":0.5,\"top_k\":40,\"seed\":7,\"stop\":[\"a\",\"bc\",\"\"],"
                       "\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                       "\"n\":2,\"ignore_eos\":true,\"min_tokens\":3,\"logprobs\":null}";
    assert_int_equal(parse(RTR_API_COMPLETIONS, body, &req, &err), PD_OK);
    assert_null(req.prompt);
    assert_int_equal(req.n_prompt_tokens, 3);
    assert_int_equal(req.prompt_tokens[2], 999);
    assert_int_equal(req.max_tokens, 1024);
    assert_true(req.temperature == 0.0f);
    assert_int_equal(req.top_k, 40);
    assert_true(req.seed_set && req.seed == 7);
    assert_int_equal(req.n_stop, 2); /* the empty string is dropped */
    assert_string_equal(req.stop[1], "bc");
    assert_true(req.stream && req.include_usage && req.ignore_eos);
    assert_int_equal(req.n, 2);
    assert_int_equal(req.min_tokens, 3);
    rtr_oai_req_free(&req);
}

static void test_chat(void **state)
{
    rtr_oai_req_t req;
    rtr_oai_error_t err;
    const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                       "{\"type\":\"text\",\"text\":\"b\"}]},"
                       "{\"role\":\"assistant\",\"content\":null}],"
                       "\"max_tokens\":5,\"max_completion_tokens\":7}";
    assert_int_equal(parse(RTR_API_CHAT, body, &req, &err), PD_OK);
    assert_int_equal(req.n_messages, 3);
    assert_string_equal(req.messages[0].role, "system");
    assert_string_equal(req.messages[1].content, "ab");
    assert_int_equal(req.messages[1].content_len, 2);
    assert_string_equal(req.messages[2].content, "");
    assert_int_equal(req.max_tokens, 7); /* max_completion_tokens wins */
    rtr_oai_req_free(&req);
}

static void test_bad_requests(void **state)
{
    expect_bad(RTR_API_COMPLETIONS, "{", 400, NULL, NULL);
    /* one value, no bytes after it (whitespace aside), no key twice */
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\"} {}", 400, NULL, NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\"}x", 400, NULL, NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"prompt\":\"y\"}", 400, NULL, NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\","
               "\"content\":\"b\"}]}", 400, NULL, NULL);
    {
        rtr_oai_req_t req;
        rtr_oai_error_t err;
        assert_int_equal(parse(RTR_API_COMPLETIONS, " {\"prompt\":\"x\"} \r\n", &req, &err), PD_OK);
        rtr_oai_req_free(&req);
    }
    expect_bad(RTR_API_COMPLETIONS, "[1,2]", 400, NULL, NULL);
    expect_bad(RTR_API_COMPLETIONS, "{}", 400, "prompt", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":5}", 400, "prompt", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":[]}", 400, "prompt", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":[1,1000]}", 400, "prompt", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":[1,-1]}", 400, "prompt", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":[1.5]}", 400, "prompt", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":1025}", 400, "max_tokens", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":1e300}", 400, "max_tokens", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":\"8\"}", 400, "max_tokens", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":3}", 400, "n", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":0}", 400, "n", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":2.5}", 400, "temperature", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "temperature", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"top_p\":0}", 400, "top_p", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"top_k\":-2}", 400, "top_k", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"stream\":1}", 400, "stream", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[1]}", 400, "stop", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]}", 400, "stop", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":20}", 400, "min_tokens", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":3}", 400, "logprobs", "unsupported_parameter");
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"model\":7}", 400, "model", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"stream_options\":1}", 400, "stream_options", NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":[]}", 400, "messages", NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":\"hi\"}", 400, "messages", NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages", NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages", NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400, "messages", NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":5000}", 400, "max_completion_tokens", NULL);
}

static void test_too_long(void **state)
{
    size_t n = 5000;
    char *body = malloc(n + 64);
    strcpy(body, "{\"prompt\":\"");
    memset(body + 11, 'a', n);
    strcpy(body + 11 + n, "\"}");
    expect_bad(RTR_API_COMPLETIONS, body, 400, "prompt", "context_length_exceeded");
    /* the same text split over chat messages is capped in total */
    free(body);
    body = malloc(16384);
    size_t off = (size_t)snprintf(body, 16384, "{\"messages\":[");
    for (int i = 0; i < 3; i++) {
        off += (size_t)snprintf(body + off, 16384 - off, "%s{\"role\":\"user\",\"content\":\"",
                                i ? "," : "");
        memset(body + off, 'b', 1500);
        off += 1500;
        off += (size_t)snprintf(body + off, 16384 - off, "\"}");
    }
    snprintf(body + off, 16384 - off, "]}");
    expect_bad(RTR_API_CHAT, body, 400, "messages", "context_length_exceeded");
    free(body);
    char many[2048] = "{\"messages\":[";
    for (int i = 0; i < 9; i++)
        strcat(many, i ? ",{\"role\":\"user\",\"content\":\"x\"}" : "{\"role\":\"user\",\"content\":\"x\"}");
    strcat(many, "]}");
    expect_bad(RTR_API_CHAT, many, 400, "messages", NULL);
}

static void test_bodies(void **state)
{
    rtr_oai_resp_meta_t meta = { "chatcmpl-1", "pdserve-builtin", 1700000000, RTR_API_CHAT };
    char *s = rtr_oai_chunk_json(&meta, 0, "h\"i", 3, NULL, true);
    cJSON *o = cJSON_Parse(s);
    assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion.chunk");
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    cJSON *delta = cJSON_GetObjectItem(c0, "delta");
    assert_string_equal(cJSON_GetObjectItem(delta, "role")->valuestring, "assistant");
    assert_string_equal(cJSON_GetObjectItem(delta, "content")->valuestring, "h\"i");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
    cJSON_Delete(o);
    free(s);

    s = rtr_oai_chunk_json(&meta, 0, "", 0, "length", false);
    o = cJSON_Parse(s);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
    cJSON_Delete(o);
    free(s);

    rtr_oai_usage_t u = { 5, 3 };
    s = rtr_oai_usage_chunk_json(&meta, &u);
    o = cJSON_Parse(s);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "choices")), 0);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "total_tokens")->valueint, 8);
    cJSON_Delete(o);
    free(s);

    meta.api = RTR_API_COMPLETIONS;
    const char *texts[] = { "abc" };
    size_t lens[] = { 3 };
    const char *fin[] = { "stop" };
    s = rtr_oai_response_json(&meta, 1, texts, lens, fin, &u);
    o = cJSON_Parse(s);
    assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "text_completion");
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(c0, "text")->valuestring, "abc");
    assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "stop");
    cJSON_Delete(o);
    free(s);

    const char *ids[] = { "a", "b" };
    s = rtr_oai_models_json(ids, 2, 1, "pdserve");
    o = cJSON_Parse(s);
    assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "list");
    cJSON *m1 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "data"), 1);
    assert_string_equal(cJSON_GetObjectItem(m1, "id")->valuestring, "b");
    assert_string_equal(cJSON_GetObjectItem(m1, "object")->valuestring, "model");
    cJSON_Delete(o);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completion_defaults),
        cmocka_unit_test(test_completion_full),
        cmocka_unit_test(test_chat),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_too_long),
        cmocka_unit_test(test_bodies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
