/* test_embed.c - /v1/embeddings body and answer (router/rtr_embed.c): the
 * input forms, every refusal naming its field, float and base64 answers,
 * dimensions truncated and renormalised, usage. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "pd_etcd.h"
#include "rtr_embed.h"

static const rtr_emb_limits_t lim = { .max_inputs = 4, .max_input_tokens = 8,
                                      .max_input_bytes = 64, .vocab_size = 100 };

static pd_status_t parse(const char *body, rtr_emb_req_t *q, rtr_oai_error_t *err)
{
    memset(err, 0, sizeof(*err));
    return rtr_emb_parse(body, strlen(body), &lim, q, err);
}

static void test_forms(void **state)
{
    (void)state;
    rtr_emb_req_t q;
    rtr_oai_error_t err;
    assert_int_equal(parse("{\"input\":\"hi\",\"model\":\"m\",\"user\":\"u\"}", &q, &err), PD_OK);
    assert_int_equal(q.n_inputs, 1);
    assert_string_equal(q.inputs[0].text, "hi");
    assert_string_equal(q.model, "m");
    assert_false(q.base64);
    rtr_emb_req_free(&q);
    assert_int_equal(parse("{\"input\":[\"a\",\"bc\"],\"encoding_format\":\"base64\","
                           "\"dimensions\":3}", &q, &err), PD_OK);
    assert_int_equal(q.n_inputs, 2);
    assert_string_equal(q.inputs[1].text, "bc");
    assert_true(q.base64);
    assert_int_equal(q.dimensions, 3);
    rtr_emb_req_free(&q);
    assert_int_equal(parse("{\"input\":[1,2,3]}", &q, &err), PD_OK);
    assert_int_equal(q.n_inputs, 1);
    assert_int_equal(q.inputs[0].n_ids, 3);
    assert_int_equal(q.inputs[0].ids[2], 3);
    assert_null(q.inputs[0].text);
    rtr_emb_req_free(&q);
    assert_int_equal(parse("{\"input\":[[1],[2,99]],\"encoding_format\":\"float\"}", &q, &err),
                     PD_OK);
    assert_int_equal(q.n_inputs, 2);
    assert_int_equal(q.inputs[1].ids[1], 99);
    rtr_emb_req_free(&q);
}

static void refused(const char *body, const char *param, int status)
{
    rtr_emb_req_t q;
    rtr_oai_error_t err;
    pd_status_t s = parse(body, &q, &err);
    if (s == PD_OK)
        fail_msg("accepted: %s", body);
    assert_int_equal(err.http_status, status);
    if (param != NULL && (err.param == NULL || strcmp(err.param, param) != 0))
        fail_msg("%s: param %s, want %s (%s)", body, err.param ? err.param : "(null)", param,
                 err.message);
    assert_null(q.inputs);
}

static void test_refusals(void **state)
{
    (void)state;
    refused("{}", "input", 400);
    refused("{\"input\":null}", "input", 400);
    refused("{\"input\":\"\"}", "input", 400);
    refused("{\"input\":[]}", "input", 400);
    refused("{\"input\":7}", "input", 400);
    refused("{\"input\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "input", 400); /* max_inputs */
    refused("{\"input\":[\"a\",7]}", "input[1]", 400);
    refused("{\"input\":[[1],\"a\"]}", "input[1]", 400);
    refused("{\"input\":[[1],[]]}", "input[1]", 400);
    refused("{\"input\":[1,2,3,4,5,6,7,8,9]}", "input", 400);           /* > context */
    refused("{\"input\":[1,100]}", "input", 400);                        /* vocab */
    refused("{\"input\":[1,-1]}", "input", 400);
    refused("{\"input\":[1,1.5]}", "input", 400);
    refused("{\"input\":[[1],[1,2,3,4,5,6,7,8,9]]}", "input[1]", 400);
    refused("{\"input\":\"" "0123456789012345678901234567890123456789012345678901234567890123456789"
            "\"}", "input", 413);                                         /* bytes */
    refused("{\"input\":\"a\",\"encoding_format\":\"int8\"}", "encoding_format", 400);
    refused("{\"input\":\"a\",\"encoding_format\":1}", "encoding_format", 400);
    refused("{\"input\":\"a\",\"dimensions\":0}", "dimensions", 400);
    refused("{\"input\":\"a\",\"dimensions\":2.5}", "dimensions", 400);
    refused("{\"input\":\"a\",\"dimensions\":\"8\"}", "dimensions", 400);
    refused("{\"input\":\"a\",\"user\":3}", "user", 400);
    refused("{\"input\":\"a\",\"model\":3}", "model", 400);
    refused("{\"input\":\"a\",\"pooling\":\"mean\"}", "pooling", 400);
    refused("{\"input\":\"a\",\"input\":\"b\"}", NULL, 400); /* duplicate key */
    refused("[1]", NULL, 400);
    rtr_emb_req_t q;
    rtr_oai_error_t err;
    assert_int_equal(parse("{\"input\":\"abc\"}", &q, &err), PD_OK);
    assert_int_equal(rtr_emb_check_len(&q, 0, 9, 8, &err), PD_ERR_BAD_INPUT);
    assert_string_equal(err.param, "input");
    assert_string_equal(err.code, "context_length_exceeded");
    assert_int_equal(rtr_emb_check_len(&q, 0, 8, 8, &err), PD_OK);
    rtr_emb_req_free(&q);
}

static cJSON *render(const char *body, const float *vecs, uint32_t n_embd, rtr_oai_error_t *err)
{
    rtr_emb_req_t q;
    assert_int_equal(parse(body, &q, err), PD_OK);
    char *json = rtr_emb_render(&q, vecs, n_embd, "m1", 7, err);
    rtr_emb_req_free(&q);
    if (json == NULL)
        return NULL;
    cJSON *o = cJSON_Parse(json);
    free(json);
    assert_non_null(o);
    return o;
}

static void test_render(void **state)
{
    (void)state;
    const float v[2][4] = { { 0.6f, 0.8f, 0.0f, 0.0f }, { 0.5f, 0.5f, 0.5f, 0.5f } };
    rtr_oai_error_t err;
    cJSON *o = render("{\"input\":[\"a\",\"b\"]}", &v[0][0], 4, &err);
    assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "list");
    assert_string_equal(cJSON_GetObjectItem(o, "model")->valuestring, "m1");
    cJSON *u = cJSON_GetObjectItem(o, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 7);
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, 7);
    cJSON *d = cJSON_GetObjectItem(o, "data");
    assert_int_equal(cJSON_GetArraySize(d), 2);
    cJSON *e1 = cJSON_GetArrayItem(d, 1);
    assert_string_equal(cJSON_GetObjectItem(e1, "object")->valuestring, "embedding");
    assert_int_equal(cJSON_GetObjectItem(e1, "index")->valueint, 1);
    cJSON *a = cJSON_GetObjectItem(e1, "embedding");
    assert_int_equal(cJSON_GetArraySize(a), 4);
    for (int i = 0; i < 4; i++)
        assert_true((float)cJSON_GetArrayItem(a, i)->valuedouble == v[1][i]);
    cJSON_Delete(o);
    /* dimensions 2: the first two, unit length again */
    o = render("{\"input\":[\"a\",\"b\"],\"dimensions\":2}", &v[0][0], 4, &err);
    a = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "data"), 1), "embedding");
    assert_int_equal(cJSON_GetArraySize(a), 2);
    assert_true(fabs(cJSON_GetArrayItem(a, 0)->valuedouble - sqrt(0.5)) < 1e-6);
    cJSON_Delete(o);
    /* base64: little-endian f32 bytes */
    o = render("{\"input\":\"a\",\"encoding_format\":\"base64\"}", &v[0][0], 4, &err);
    const char *b = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "data"), 0),
                                        "embedding")->valuestring;
    uint8_t raw[16];
    assert_int_equal(pd_b64_decode(b, strlen(b), raw, sizeof(raw)), 16);
    float back[4];
    memcpy(back, raw, sizeof(back)); /* x86: little-endian */
    assert_memory_equal(back, v[0], sizeof(back));
    cJSON_Delete(o);
    /* dimensions over the model's: refused by name */
    assert_null(render("{\"input\":\"a\",\"dimensions\":5}", &v[0][0], 4, &err));
    assert_int_equal(err.http_status, 400);
    assert_string_equal(err.param, "dimensions");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forms),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
