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
    /* a repeated key: param names the top-level field it is (in) */
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"prompt\":\"y\"}", 400, "prompt", NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\","
               "\"content\":\"b\"}]}", 400, "messages", NULL);
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
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":true}", 400, "logprobs", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"model\":7}", 400, "model", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"stream_options\":1}", 400, "stream_options", NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":[]}", 400, "messages", NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":\"hi\"}", 400, "messages", NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages", NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages", NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400, "messages", NULL);
    expect_bad(RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":5000}", 400, "max_completion_tokens", NULL);
}

/* The strict policy: every field is honoured or refused with a 400 naming it. */
/* "name" on every role (LangChain's ToolNode sends {"role":"tool","name":...},
 * multi-agent code names users and assistants); kept on the message. */
static void test_message_names(void **state)
{
    (void)state;
    rtr_oai_req_t req;
    rtr_oai_error_t err;
    const char *body =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"s\",\"name\":\"rules\"},"
        "{\"role\":\"user\",\"content\":\"x\",\"name\":\"alice\"},"
        "{\"role\":\"assistant\",\"content\":null,\"name\":\"agent-1\",\"tool_calls\":"
        "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"content\":\"r\",\"tool_call_id\":\"c1\",\"name\":\"f\"},"
        "{\"role\":\"developer\",\"content\":\"d\",\"name\":null}]}";
    if (parse(RTR_API_CHAT, body, &req, &err) != PD_OK)
        fail_msg("refused: %s", err.message);
    assert_string_equal(req.messages[0].name, "rules");
    assert_string_equal(req.messages[1].name, "alice");
    assert_string_equal(req.messages[2].name, "agent-1");
    assert_string_equal(req.messages[3].name, "f");
    assert_null(req.messages[4].name);
    rtr_oai_req_free(&req);
    char big[400];
    snprintf(big, sizeof(big), "{\"messages\":[{\"role\":\"user\",\"content\":\"x\","
             "\"name\":\"%0257d\"}]}", 0);
    expect_bad(RTR_API_CHAT, big, 400, "messages[0].name", NULL);
}

/* seed: every integer in [-2^63, 2^64), exact (not through a double),
 * reduced mod 2^64; GET /v1/models/{id}. */
static void test_seed_and_model(void **state)
{
    (void)state;
    static const struct { const char *txt; uint64_t want; } ok[] = {
        { "0", 0 },
        { "9007199254740993", 9007199254740993ull },          /* 2^53 + 1: not a double */
        { "18446744073709551615", 18446744073709551615ull },  /* 2^64 - 1 */
        { "-1", 18446744073709551615ull },
        { "-9223372036854775808", 9223372036854775808ull },   /* -2^63 */
        { "12345678901234567891", 12345678901234567891ull },
        { "1e3", 1000 },
        { "-7.0", (uint64_t)-7 },
    };
    char body[256];
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        rtr_oai_req_t req;
        rtr_oai_error_t err;
        /* "seed" also inside a nested object first: only the top-level one counts */
        snprintf(body, sizeof(body), "{\"prompt\":\"x\",\"stream_options\":null,"
                 "\"user\":\"seed\",\"logit_bias\":{\"5\":1} , \"seed\" : %s}", ok[i].txt);
        if (parse(RTR_API_COMPLETIONS, body, &req, &err) != PD_OK)
            fail_msg("refused (%s): %s", err.message, body);
        assert_true(req.seed_set);
        if (req.seed != ok[i].want)
            fail_msg("seed %s -> %llu", ok[i].txt, (unsigned long long)req.seed);
        rtr_oai_req_free(&req);
    }
    static const char *const bad_seeds[] = {
        "18446744073709551616", "-9223372036854775809", "1.5", "\"7\"", "true",
        "1e30", "99999999999999999999999999999999",
    };
    for (size_t i = 0; i < sizeof(bad_seeds) / sizeof(bad_seeds[0]); i++) {
        snprintf(body, sizeof(body), "{\"prompt\":\"x\",\"seed\":%s}", bad_seeds[i]);
        expect_bad(RTR_API_COMPLETIONS, body, 400, "seed", NULL);
    }

    const char *ids[1] = { "org/My Model" };
    rtr_oai_error_t err;
    char *j = rtr_oai_model_get_json("org%2FMy%20Model", ids, 1, 42, "pdserve", &err);
    assert_non_null(j);
    cJSON *m = cJSON_Parse(j);
    assert_string_equal(cJSON_GetObjectItem(m, "id")->valuestring, "org/My Model");
    assert_string_equal(cJSON_GetObjectItem(m, "object")->valuestring, "model");
    assert_int_equal((int)cJSON_GetObjectItem(m, "created")->valuedouble, 42);
    assert_string_equal(cJSON_GetObjectItem(m, "owned_by")->valuestring, "pdserve");
    cJSON_Delete(m);
    free(j);
    static const char *const missing[] = { "other", "org%2FMy", "%00", "%zz", "" };
    for (size_t i = 0; i < sizeof(missing) / sizeof(missing[0]); i++) {
        assert_null(rtr_oai_model_get_json(missing[i], ids, 1, 42, "pdserve", &err));
        assert_int_equal(err.http_status, 404);
        assert_string_equal(err.code, "model_not_found");
        char *e = rtr_oai_error_json(&err);
        assert_non_null(strstr(e, "\"type\":\"invalid_request_error\""));
        free(e);
    }
}

static void test_strict_policy(void **state)
{
    const rtr_api_t C = RTR_API_COMPLETIONS, H = RTR_API_CHAT;
#define CM "{\"prompt\":\"x\","
#define HM "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
    /* unknown fields, on either endpoint */
    expect_bad(C, CM "\"foo\":1}", 400, "foo", "unknown_parameter");
    expect_bad(H, HM "\"temprature\":0.5}", 400, "temprature", "unknown_parameter");
    expect_bad(C, CM "\"foo\":null}", 400, "foo", "unknown_parameter");
    /* a chat-only field on /v1/completions, and the reverse */
    expect_bad(C, CM "\"max_completion_tokens\":5}", 400, "max_completion_tokens",
               "unknown_parameter");
    expect_bad(C, CM "\"top_logprobs\":2}", 400, "top_logprobs", "unknown_parameter");
    expect_bad(C, CM "\"response_format\":{\"type\":\"text\"}}", 400, "response_format",
               "unknown_parameter");
    expect_bad(H, HM "\"echo\":false}", 400, "echo", "unknown_parameter");
    expect_bad(H, HM "\"prompt\":\"y\"}", 400, "prompt", "unknown_parameter");
    /* logprobs */
    expect_bad(H, HM "\"top_logprobs\":3}", 400, "top_logprobs", NULL);
    expect_bad(H, HM "\"logprobs\":false,\"top_logprobs\":3}", 400, "top_logprobs", NULL);
    expect_bad(H, HM "\"logprobs\":true,\"top_logprobs\":21}", 400, "top_logprobs", NULL);
    expect_bad(H, HM "\"logprobs\":1}", 400, "logprobs", NULL);
    expect_bad(C, CM "\"logprobs\":21}", 400, "logprobs", NULL);
    expect_bad(C, CM "\"logprobs\":-1}", 400, "logprobs", NULL);
    /* structured output, storage: refused unless neutral; tool_choice needs
     * tools (tools themselves: test_tools.c) */
    expect_bad(H, HM "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}}", 400,
               "response_format", NULL);
    expect_bad(H, HM "\"response_format\":\"json\"}", 400, "response_format", NULL);
    expect_bad(H, HM "\"tool_choice\":\"auto\"}", 400, "tool_choice", NULL);
    expect_bad(H, HM "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}",
               400, "tool_choice", NULL);
    expect_bad(H, HM "\"functions\":[{\"name\":\"f\"}]}", 400, "functions",
               "unsupported_parameter");
    expect_bad(H, HM "\"function_call\":\"auto\"}", 400, "function_call", "unsupported_parameter");
    expect_bad(H, HM "\"store\":true}", 400, "store", "unsupported_parameter");
    expect_bad(H, HM "\"modalities\":[\"audio\"]}", 400, "modalities", "unsupported_parameter");
    expect_bad(H, HM "\"parallel_tool_calls\":1}", 400, "parallel_tool_calls", NULL);
    /* completions-only refusals */
    expect_bad(C, CM "\"echo\":true}", 400, "echo", "unsupported_parameter");
    expect_bad(C, CM "\"echo\":\"yes\"}", 400, "echo", NULL);
    expect_bad(C, CM "\"best_of\":2}", 400, "best_of", "unsupported_parameter");
    expect_bad(C, CM "\"suffix\":\"end\"}", 400, "suffix", "unsupported_parameter");
    expect_bad(C, CM "\"user\":5}", 400, "user", NULL);
    /* cache_salt (issue 28): a non-empty string of at most 256 bytes */
    expect_bad(C, CM "\"cache_salt\":5}", 400, "cache_salt", NULL);
    expect_bad(H, HM "\"cache_salt\":\"\"}", 400, "cache_salt", NULL);
    expect_bad(H, HM "\"cache_salt\":[\"a\"]}", 400, "cache_salt", NULL);
    {
        char body[600];
        char big[258];
        memset(big, 's', 257);
        big[257] = '\0';
        snprintf(body, sizeof(body), CM "\"cache_salt\":\"%s\"}", big);
        expect_bad(C, body, 400, "cache_salt", NULL);
        big[256] = '\0'; /* 256 bytes: the cap */
        snprintf(body, sizeof(body), CM "\"cache_salt\":\"%s\"}", big);
        rtr_oai_req_t req;
        rtr_oai_error_t err;
        assert_int_equal(parse(RTR_API_COMPLETIONS, body, &req, &err), PD_OK);
        assert_true(req.cache_salt_set);
        assert_string_equal(req.cache_salt, big);
        rtr_oai_req_free(&req);
        assert_int_equal(parse(RTR_API_CHAT, HM "\"cache_salt\":\"tenant-7\"}", &req, &err),
                         PD_OK);
        assert_string_equal(req.cache_salt, "tenant-7");
        rtr_oai_req_free(&req);
        assert_int_equal(parse(RTR_API_CHAT, HM "\"cache_salt\":null}", &req, &err), PD_OK);
        assert_false(req.cache_salt_set);
        assert_string_equal(req.cache_salt, "");
        rtr_oai_req_free(&req);
    }
    /* messages: content is required except for the assistant; no unknown keys */
    expect_bad(H, "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content", NULL);
    expect_bad(H, "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
                  "{\"role\":\"user\",\"content\":null}]}", 400, "messages[1].content", NULL);
    expect_bad(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":5}]}", 400,
               "messages[0].name", NULL);
    expect_bad(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"colour\":1}]}", 400,
               "messages[0].colour", NULL);
    expect_bad(H, "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
                  "[{\"id\":\"1\"}]}]}", 400, "messages[0].tool_calls[0]", NULL);
    expect_bad(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                  "\"text\":\"a\",\"cache\":1}]}]}", 400, "messages", NULL);
    expect_bad(H, HM "\"stream_options\":{\"include_usage\":true,\"continuous\":true}}", 400,
               "stream_options.continuous", NULL);
    /* penalties and biases: ranges */
    expect_bad(C, CM "\"presence_penalty\":2.5}", 400, "presence_penalty", NULL);
    expect_bad(C, CM "\"frequency_penalty\":-3}", 400, "frequency_penalty", NULL);
    expect_bad(C, CM "\"repetition_penalty\":0}", 400, "repetition_penalty", NULL);
    expect_bad(C, CM "\"min_p\":1.5}", 400, "min_p", NULL);
    expect_bad(C, CM "\"logit_bias\":[1]}", 400, "logit_bias", NULL);
    expect_bad(C, CM "\"logit_bias\":{\"abc\":1}}", 400, "logit_bias", NULL);
    expect_bad(C, CM "\"logit_bias\":{\"-1\":1}}", 400, "logit_bias", NULL);
    expect_bad(C, CM "\"logit_bias\":{\"1000\":1}}", 400, "logit_bias", NULL);
    expect_bad(C, CM "\"logit_bias\":{\"5\":100.5}}", 400, "logit_bias", NULL);
    expect_bad(C, CM "\"logit_bias\":{\"5\":\"1\"}}", 400, "logit_bias", NULL);
    expect_bad(C, CM "\"stop_token_ids\":[1000]}", 400, "stop_token_ids", NULL);
    expect_bad(C, CM "\"stop_token_ids\":7}", 400, "stop_token_ids", NULL);

    /* neutral values of the refused fields are accepted (they change nothing) */
    static const char *const ok_chat[] = {
        HM "\"logprobs\":false,\"tools\":[],\"tool_choice\":\"none\",\"functions\":null,"
           "\"function_call\":\"none\",\"store\":false,\"response_format\":{\"type\":\"text\"},"
           "\"parallel_tool_calls\":true,\"user\":\"u-1\",\"metadata\":{},\"service_tier\":\"auto\"}",
        "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[],"
        "\"refusal\":null,\"name\":null},{\"role\":\"tool\",\"content\":\"r\","
        "\"tool_call_id\":\"c1\"},{\"role\":\"user\",\"content\":\"x\"}]}",
    };
    static const char *const ok_cmpl[] = {
        CM "\"echo\":false,\"best_of\":1,\"suffix\":\"\",\"logprobs\":null,\"user\":\"u\"}",
    };
    rtr_oai_req_t req;
    rtr_oai_error_t err;
    for (size_t i = 0; i < sizeof(ok_chat) / sizeof(ok_chat[0]); i++) {
        if (parse(H, ok_chat[i], &req, &err) != PD_OK)
            fail_msg("refused (%s): %s", err.message, ok_chat[i]);
        rtr_oai_req_free(&req);
    }
    for (size_t i = 0; i < sizeof(ok_cmpl) / sizeof(ok_cmpl[0]); i++) {
        if (parse(C, ok_cmpl[i], &req, &err) != PD_OK)
            fail_msg("refused (%s): %s", err.message, ok_cmpl[i]);
        rtr_oai_req_free(&req);
    }
#undef CM
#undef HM
}

static void test_penalties_parsed(void **state)
{
    rtr_oai_req_t req;
    rtr_oai_error_t err;
    const char *body = "{\"prompt\":\"x\",\"presence_penalty\":0.5,\"frequency_penalty\":-1,"
                       "\"repetition_penalty\":1.25,\"min_p\":0.1,"
                       "\"logit_bias\":{\"5\":-100,\"999\":100,\"0\":0.5},"
                       "\"stop_token_ids\":[1,2,999]}";
    assert_int_equal(parse(RTR_API_COMPLETIONS, body, &req, &err), PD_OK);
    assert_true(req.presence_penalty == 0.5f && req.frequency_penalty == -1.0f);
    assert_true(req.repetition_penalty == 1.25f && req.min_p == 0.1f);
    assert_int_equal(req.n_bias, 3);
    assert_int_equal(req.bias_ids[0], 5);
    assert_true(req.bias[0] == -100.0f);
    assert_int_equal(req.bias_ids[1], 999);
    assert_true(req.bias[1] == 100.0f);
    assert_int_equal(req.bias_ids[2], 0);
    assert_int_equal(req.n_stop_ids, 3);
    assert_int_equal(req.stop_ids[2], 999);
    rtr_oai_req_free(&req);
    /* defaults: all off */
    assert_int_equal(parse(RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                           &req, &err), PD_OK);
    assert_true(req.presence_penalty == 0.0f && req.frequency_penalty == 0.0f);
    assert_true(req.repetition_penalty == 1.0f && req.min_p == 0.0f);
    assert_int_equal(req.n_bias, 0);
    assert_int_equal(req.n_stop_ids, 0);
    rtr_oai_req_free(&req);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"5\":1,\"5\":2}}", 400,
               "logit_bias", NULL);
    char big[8192] = "{\"prompt\":\"x\",\"logit_bias\":{";
    for (int i = 0; i < 301; i++)
        snprintf(big + strlen(big), sizeof(big) - strlen(big), "%s\"%d\":1", i ? "," : "", i);
    strcat(big, "}}");
    expect_bad(RTR_API_COMPLETIONS, big, 400, "logit_bias", NULL);
    expect_bad(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"stop_token_ids\":[1,2,3,4,5,6,7,8,9,10,"
               "11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33]}", 400,
               "stop_token_ids", NULL);
}

/* Piece callback for the logprobs tests: id 1 "Hi", 2 " there", 3 a lone
 * UTF-8 lead byte, 4 "é"; others "t<id>". */
static size_t test_piece(void *ctx, int32_t id, char *buf, size_t cap)
{
    (void)ctx;
    const char *s = id == 1 ? "Hi" : id == 2 ? " there" : id == 3 ? "\xe6" : id == 4 ? "\xc3\xa9"
                                                                                   : NULL;
    char tmp[16];
    if (s == NULL) {
        snprintf(tmp, sizeof(tmp), "t%d", id);
        s = tmp;
    }
    size_t n = strlen(s);
    if (n > cap)
        return 0;
    memcpy(buf, s, n);
    return n;
}

static void test_logprobs_parse_and_shapes(void **state)
{
    rtr_oai_req_t req;
    rtr_oai_error_t err;
    assert_int_equal(parse(RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"logprobs\":true,\"top_logprobs\":20}", &req, &err), PD_OK);
    assert_true(req.logprobs && req.top_logprobs == 20);
    rtr_oai_req_free(&req);
    assert_int_equal(parse(RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"logprobs\":false}", &req, &err), PD_OK);
    assert_false(req.logprobs);
    rtr_oai_req_free(&req);
    assert_int_equal(parse(RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":0}", &req, &err),
                     PD_OK);
    assert_true(req.logprobs && req.top_logprobs == 0);
    rtr_oai_req_free(&req);

    rtr_oai_logprob_t v[3] = {
        { .id = 1, .logprob = -0.5f, .n_top = 2, .top_ids = { 1, 7 }, .top_lp = { -0.5f, -1.5f } },
        { .id = 3, .logprob = -2.0f, .n_top = 2, .top_ids = { 4, 2 }, .top_lp = { -0.25f, -1.0f } },
        { .id = 4, .logprob = -0.25f, .n_top = 0 },
    };
    rtr_oai_logprobs_t lp = { v, 3, 10, test_piece, NULL };
    assert_int_equal(rtr_oai_logprobs_chars(&lp), 2 + 1 + 1);
    /* chat: {content: [{token, logprob, bytes, top_logprobs: [...]}], refusal: null} */
    rtr_oai_resp_meta_t meta = { "chatcmpl-1", "m", 1700000000, RTR_API_CHAT };
    const char *texts[1] = { "Hi\xef\xbf\xbd\xc3\xa9" };
    size_t lens[1] = { strlen(texts[0]) };
    const char *fr[1] = { "length" };
    rtr_oai_usage_t u = { 3, 3 };
    char *json = rtr_oai_response_lp_json(&meta, 1, texts, lens, fr, &u, &lp);
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root);
    cJSON *l = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0),
                                   "logprobs");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(l, "refusal")));
    cJSON *content = cJSON_GetObjectItem(l, "content");
    assert_int_equal(cJSON_GetArraySize(content), 3);
    cJSON *c0 = cJSON_GetArrayItem(content, 0), *c1 = cJSON_GetArrayItem(content, 1);
    assert_string_equal(cJSON_GetObjectItem(c0, "token")->valuestring, "Hi");
    assert_float_equal(cJSON_GetObjectItem(c0, "logprob")->valuedouble, -0.5, 1e-9);
    cJSON *bytes = cJSON_GetObjectItem(c0, "bytes");
    assert_int_equal(cJSON_GetArraySize(bytes), 2);
    assert_int_equal(cJSON_GetArrayItem(bytes, 0)->valueint, 'H');
    cJSON *top = cJSON_GetObjectItem(c0, "top_logprobs");
    assert_int_equal(cJSON_GetArraySize(top), 2);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(top, 1), "token")->valuestring, "t7");
    assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(top, 1), "top_logprobs"));
    /* a lone lead byte: U+FFFD in the string, the exact byte in "bytes" */
    assert_string_equal(cJSON_GetObjectItem(c1, "token")->valuestring, "\xef\xbf\xbd");
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(c1, "bytes"), 0)->valueint, 0xe6);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(content, 2),
                                                            "top_logprobs")), 0);
    cJSON_Delete(root);
    free(json);
    /* streaming chunk: the same object inside the choice */
    json = rtr_oai_chunk_lp_json(&meta, 0, "Hi", 2, NULL, false, &lp);
    root = cJSON_Parse(json);
    l = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0), "logprobs");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(l, "content")), 3);
    cJSON_Delete(root);
    free(json);
    /* completions: tokens, token_logprobs, top_logprobs (top n + chosen), text_offset */
    meta.api = RTR_API_COMPLETIONS;
    json = rtr_oai_chunk_lp_json(&meta, 0, "Hi", 2, NULL, false, &lp);
    root = cJSON_Parse(json);
    assert_non_null(root);
    l = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0), "logprobs");
    cJSON *tokens = cJSON_GetObjectItem(l, "tokens");
    assert_int_equal(cJSON_GetArraySize(tokens), 3);
    assert_string_equal(cJSON_GetArrayItem(tokens, 2)->valuestring, "\xc3\xa9");
    assert_float_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(l, "token_logprobs"), 1)->valuedouble,
                       -2.0, 1e-9);
    cJSON *off = cJSON_GetObjectItem(l, "text_offset");
    assert_int_equal(cJSON_GetArrayItem(off, 0)->valueint, 10);
    assert_int_equal(cJSON_GetArrayItem(off, 1)->valueint, 12);
    assert_int_equal(cJSON_GetArrayItem(off, 2)->valueint, 13);
    cJSON *tl = cJSON_GetObjectItem(l, "top_logprobs");
    cJSON *d0 = cJSON_GetArrayItem(tl, 0), *d1 = cJSON_GetArrayItem(tl, 1);
    assert_int_equal(cJSON_GetArraySize(d0), 2);        /* Hi (top and chosen) + t7 */
    assert_float_equal(cJSON_GetObjectItem(d0, "t7")->valuedouble, -1.5, 1e-9);
    assert_int_equal(cJSON_GetArraySize(d1), 3);        /* é, " there", and the chosen */
    assert_float_equal(cJSON_GetObjectItem(d1, "\xef\xbf\xbd")->valuedouble, -2.0, 1e-9);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetArrayItem(tl, 2)), 1); /* logprobs 0: chosen */
    cJSON_Delete(root);
    free(json);
    /* no logprobs asked: null, as before */
    json = rtr_oai_chunk_json(&meta, 0, "Hi", 2, NULL, false);
    root = cJSON_Parse(json);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root,
                                                 "choices"), 0), "logprobs")));
    cJSON_Delete(root);
    free(json);
}

/* A byte 0 in generated text (a byte token) must not cut the JSON string:
 * control bytes are escaped, the rest of the text follows. */
static void test_text_escaping(void **state)
{
    rtr_oai_resp_meta_t meta = { "cmpl-1", "m", 1700000000, RTR_API_COMPLETIONS };
    const char text[] = "a\0b\"\\\n\x7f" "\xc3\xa9z";
    const char *texts[1] = { text };
    size_t lens[1] = { sizeof(text) - 1 };
    const char *fr[1] = { "stop" };
    rtr_oai_usage_t u = { 1, 1 };
    char *json = rtr_oai_response_json(&meta, 1, texts, lens, fr, &u);
    assert_non_null(strstr(json, "\"text\":\"a\\u0000b\\\"\\\\\\u000a\\u007f\xc3\xa9z\""));
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root); /* still valid JSON */
    cJSON_Delete(root);
    free(json);
    meta.api = RTR_API_CHAT;
    json = rtr_oai_chunk_json(&meta, 0, text, sizeof(text) - 1, NULL, false);
    assert_non_null(strstr(json, "\"content\":\"a\\u0000b\\\"\\\\\\u000a\\u007f\xc3\xa9z\""));
    root = cJSON_Parse(json);
    assert_non_null(root);
    cJSON_Delete(root);
    free(json);
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

    rtr_oai_usage_t u = { 5, 3, 4 };
    s = rtr_oai_usage_chunk_json(&meta, &u);
    o = cJSON_Parse(s);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "choices")), 0);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "total_tokens")->valueint, 8);
    /* the prefix cache's share of the prompt (chat stream) */
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"),
                                                             "prompt_tokens_details"),
                                         "cached_tokens")->valueint, 4);
    cJSON_Delete(o);
    free(s);
    {
        const char *tx[] = { "abc" };
        size_t ln[] = { 3 };
        const char *fr[] = { "stop" };
        s = rtr_oai_response_json(&meta, 1, tx, ln, fr, &u); /* chat, not streamed */
        o = cJSON_Parse(s);
        cJSON *pd = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "prompt_tokens_details");
        assert_int_equal(cJSON_GetObjectItem(pd, "cached_tokens")->valueint, 4);
        cJSON_Delete(o);
        free(s);
    }

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
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"),
                                                             "prompt_tokens_details"),
                                         "cached_tokens")->valueint, 4);
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

/* response_format: json_object / json_schema accepted (the schema travels
 * as compact text), and every refused shape, field or keyword named. */
static void test_response_format(void **state)
{
    (void)state;
    const rtr_api_t H = RTR_API_CHAT;
#define HM "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
    rtr_oai_req_t req;
    rtr_oai_error_t err;
    const char *ok1 = HM "\"response_format\":{\"type\":\"json_object\"}}";
    assert_int_equal(parse(H, ok1, &req, &err), PD_OK);
    assert_int_equal(req.gram_kind, RTR_OAI_GRAM_JSON_OBJECT);
    assert_null(req.gram_schema);
    rtr_oai_req_free(&req);
    const char *ok2 = HM "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                      "{\"name\":\"p\",\"strict\":true,\"description\":\"d\",\"schema\":"
                      "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                      "\"required\":[\"a\"],\"additionalProperties\":false}}}}";
    assert_int_equal(parse(H, ok2, &req, &err), PD_OK);
    assert_int_equal(req.gram_kind, RTR_OAI_GRAM_JSON_SCHEMA);
    assert_string_equal(req.gram_schema, "{\"type\":\"object\",\"properties\":{\"a\":"
                        "{\"type\":\"integer\"}},\"required\":[\"a\"],"
                        "\"additionalProperties\":false}");
    assert_int_equal(req.gram_schema_len, strlen(req.gram_schema));
    rtr_oai_req_free(&req);
    assert_int_equal(parse(H, HM "\"response_format\":{\"type\":\"text\"}}", &req, &err), PD_OK);
    assert_int_equal(req.gram_kind, RTR_OAI_GRAM_NONE);
    rtr_oai_req_free(&req);

#define RF(x) HM "\"response_format\":" x "}"
#define SCH(x) RF("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":" x "}}")
    static const char *const kws[] = { "pattern", "format", "oneOf", "allOf",
                                       "not", "patternProperties", "uniqueItems", NULL };
    for (int i = 0; kws[i]; i++) {
        char body[512];
        snprintf(body, sizeof(body), SCH("{\"type\":\"object\",\"properties\":{\"a\":"
                 "{\"type\":\"string\",\"%s\":1}}}"), kws[i]);
        expect_bad(H, body, 400, "response_format", "unsupported_schema");
        assert_int_equal(parse(H, body, &req, &err), PD_ERR_BAD_INPUT);
        assert_non_null(strstr(err.message, kws[i]));
        char ptr[64]; /* the message names the keyword's JSON pointer */
        snprintf(ptr, sizeof(ptr), "at /properties/a/%s", kws[i]);
        if (strstr(err.message, ptr) == NULL)
            fail_msg("%s", err.message);
    }
    expect_bad(H, SCH("{\"type\":\"array\"}"), 400, "response_format", "unsupported_schema");
    /* a recursion with no end (every property is emitted) */
    expect_bad(H, SCH("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},"
                      "\"required\":[\"a\"]}"), 400, "response_format", "unsupported_schema");
    /* a recursive tree is accepted (refused before rules) */
    assert_int_equal(parse(H, SCH("{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
                                  "\"integer\"},\"kids\":{\"type\":\"array\",\"items\":"
                                  "{\"$ref\":\"#\"}}},\"required\":[\"v\",\"kids\"]}"),
                           &req, &err), PD_OK);
    rtr_oai_req_free(&req);
    expect_bad(H, SCH("[]"), 400, "response_format", NULL);
    expect_bad(H, RF("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a b\","
                     "\"schema\":{\"type\":\"object\"}}}"), 400, "response_format", NULL);
    expect_bad(H, RF("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"x\":1,"
                     "\"schema\":{\"type\":\"object\"}}}"), 400, "response_format",
               "unknown_parameter");
    expect_bad(H, RF("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
                     "\"strict\":1,\"schema\":{\"type\":\"object\"}}}"), 400,
               "response_format", NULL);
    expect_bad(H, RF("{\"type\":\"json_object\",\"schema\":{}}"), 400, "response_format",
               "unknown_parameter");
    expect_bad(H, RF("{\"type\":\"yaml\"}"), 400, "response_format", NULL);
    expect_bad(H, HM "\"ignore_eos\":true,\"response_format\":{\"type\":\"json_object\"}}",
               400, "ignore_eos", "unsupported_parameter");
    expect_bad(H, HM "\"min_tokens\":2,\"response_format\":{\"type\":\"json_object\"}}",
               400, "min_tokens", "unsupported_parameter");
#undef RF
#undef SCH
#undef HM
}

/* llama-server's grammar, vLLM's guided_* and structured_outputs: each
 * compiled here (a 400 names the field and the construct), carried as
 * kind + text; one constraint per request; both endpoints. */
static void test_guided(void **state)
{
    (void)state;
    rtr_oai_req_t req;
    rtr_oai_error_t err;
    static const struct {
        rtr_api_t api;
        const char *body;
        uint32_t kind;
        const char *text;
    } ok[] = {
        { RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
          "\"grammar\":\"root ::= [a-z]+\"}", RTR_OAI_GRAM_GBNF, "root ::= [a-z]+" },
        { RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"guided_regex\":\"\\\\d{3}\"}",
          RTR_OAI_GRAM_REGEX, "\\d{3}" },
        { RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
          "\"guided_choice\":[\"yes\",\"no \\\"way\\\"\"]}", RTR_OAI_GRAM_GBNF,
          "root ::= \"yes\"|\"no \\\"way\\\"\"" },
        { RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
          "\"guided_json\":{\"type\":\"object\"}}", RTR_OAI_GRAM_JSON_SCHEMA,
          "{\"type\":\"object\"}" },
        { RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"guided_json\":\"{\\\"type\\\":\\\"object\\\"}\"}",
          RTR_OAI_GRAM_JSON_SCHEMA, "{\"type\":\"object\"}" },
        { RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
          "\"guided_grammar\":\"root ::= \\\"a\\\" root?\"}", RTR_OAI_GRAM_GBNF,
          "root ::= \"a\" root?" },
        { RTR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
          "\"structured_outputs\":{\"regex\":\"a|b\"}}", RTR_OAI_GRAM_REGEX, "a|b" },
        { RTR_API_COMPLETIONS, "{\"prompt\":\"x\",\"structured_outputs\":{\"choice\":[\"A\"]}}",
          RTR_OAI_GRAM_GBNF, "root ::= \"A\"" },
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        if (parse(ok[i].api, ok[i].body, &req, &err) != PD_OK)
            fail_msg("%s: %s", ok[i].body, err.message);
        assert_int_equal(req.gram_kind, ok[i].kind);
        assert_string_equal(req.gram_schema, ok[i].text);
        assert_int_equal(req.gram_schema_len, strlen(ok[i].text));
        rtr_oai_req_free(&req);
    }
#define HM "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
    expect_bad(RTR_API_CHAT, HM "\"grammar\":\"root ::= root \\\"a\\\" | \\\"b\\\"\"}", 400,
               "grammar", "unsupported_grammar");
    assert_int_equal(parse(RTR_API_CHAT, HM "\"grammar\":\"root ::= root \\\"a\\\"|\\\"b\\\"\"}",
                           &req, &err), PD_ERR_BAD_INPUT);
    assert_non_null(strstr(err.message, "left recursion"));
    expect_bad(RTR_API_CHAT, HM "\"guided_regex\":\"(?=a)b\"}", 400, "guided_regex",
               "unsupported_grammar");
    expect_bad(RTR_API_CHAT, HM "\"guided_regex\":\"a{9000}\"}", 400, "guided_regex",
               "grammar_too_large");
    expect_bad(RTR_API_CHAT, HM "\"guided_choice\":[]}", 400, "guided_choice", NULL);
    expect_bad(RTR_API_CHAT, HM "\"guided_choice\":[1]}", 400, "guided_choice", NULL);
    expect_bad(RTR_API_CHAT, HM "\"guided_regex\":\"a\",\"grammar\":\"root ::= \\\"a\\\"\"}",
               400, "guided_regex", "unsupported_parameter");
    expect_bad(RTR_API_CHAT, HM "\"response_format\":{\"type\":\"json_object\"},"
               "\"guided_regex\":\"a\"}", 400, "guided_regex", "unsupported_parameter");
    expect_bad(RTR_API_CHAT, HM "\"structured_outputs\":{\"xml\":\"a\"}}", 400,
               "structured_outputs", "unsupported_parameter");
    expect_bad(RTR_API_CHAT, HM "\"ignore_eos\":true,\"guided_regex\":\"a\"}", 400,
               "ignore_eos", "unsupported_parameter");
    expect_bad(RTR_API_CHAT, HM "\"guided_json\":{\"type\":\"object\",\"properties\":"
               "{\"a\":{\"type\":\"string\",\"pattern\":\"\\\\1\"}}}}", 400, "guided_json",
               "unsupported_grammar");
#undef HM
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_response_format),
        cmocka_unit_test(test_guided),
        cmocka_unit_test(test_completion_defaults),
        cmocka_unit_test(test_completion_full),
        cmocka_unit_test(test_chat),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_strict_policy),
        cmocka_unit_test(test_message_names),
        cmocka_unit_test(test_seed_and_model),
        cmocka_unit_test(test_penalties_parsed),
        cmocka_unit_test(test_logprobs_parse_and_shapes),
        cmocka_unit_test(test_text_escaping),
        cmocka_unit_test(test_too_long),
        cmocka_unit_test(test_bodies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
