/* Fuzz target: request bodies -> rtr_oai_parse (completions, chat) and the
 * front doors' parsers (Messages, count_tokens, Responses: rtr_fd.h), and
 * /v1/embeddings' (rtr_embed.h, rendered too), and every accepted request's
 * fields respect the limits; an accepted grammar (schema, regex, GBNF)
 * compiles the same way again (as a daemon would) and its state walks the
 * input's bytes. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include "eng_gram.h"
#include "rtr_anthropic.h"
#include "rtr_embed.h"
#include "rtr_openai.h"
#include "rtr_responses.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const rtr_oai_limits_t lim = { .max_tokens_cap = 4096, .default_max_tokens = 16,
                                   .n_cap = 4, .max_prompt_bytes = 1 << 16,
                                   .max_prompt_tokens = 2048, .max_messages = 64,
                                   .vocab_size = 32000 };
    for (int api = 0; api < 5; api++) {
        rtr_oai_req_t req;
        rtr_oai_error_t err;
        const char *body = (const char *)data;
        pd_status_t st = api < 2 ? rtr_oai_parse((rtr_api_t)api, body, size, &lim, &req, &err)
                         : api < 4 ? rtr_anth_parse(body, size, &lim, api == 3, &req, &err)
                                   : rtr_resp_parse(body, size, &lim, false, &req, &err);
        if (st == PD_OK) {
            assert(req.max_tokens >= 1 && req.max_tokens <= lim.max_tokens_cap);
            assert(req.n >= 1 && req.n <= lim.n_cap);
            assert(req.n_stop <= RTR_OAI_MAX_STOP);
            assert(req.prompt_len <= lim.max_prompt_bytes);
            assert(req.n_prompt_tokens <= lim.max_prompt_tokens);
            for (uint32_t i = 0; i < req.n_prompt_tokens; i++)
                assert(req.prompt_tokens[i] >= 0 && (uint32_t)req.prompt_tokens[i] < lim.vocab_size);
            /* penalties, biases, stop ids, logprobs: within their ranges */
            assert(req.presence_penalty >= -2 && req.presence_penalty <= 2);
            assert(req.frequency_penalty >= -2 && req.frequency_penalty <= 2);
            assert(req.repetition_penalty > 0 && req.repetition_penalty <= 2);
            assert(req.min_p >= 0 && req.min_p <= 1);
            assert(req.n_bias <= RTR_OAI_MAX_BIAS && req.n_stop_ids <= RTR_OAI_MAX_STOP_IDS);
            for (uint32_t i = 0; i < req.n_bias; i++)
                assert(req.bias_ids[i] >= 0 && (uint32_t)req.bias_ids[i] < lim.vocab_size &&
                       req.bias[i] >= -100 && req.bias[i] <= 100);
            for (uint32_t i = 0; i < req.n_stop_ids; i++)
                assert(req.stop_ids[i] >= 0 && (uint32_t)req.stop_ids[i] < lim.vocab_size);
            assert(req.top_logprobs <= RTR_OAI_MAX_TOP_LOGPROBS);
            assert(req.logprobs || req.top_logprobs == 0);
            if (req.gram_kind >= RTR_OAI_GRAM_JSON_SCHEMA) {
                assert(req.gram_schema_len > 0 && req.gram_schema_len <= ENG_GRAM_MAX_SCHEMA_BYTES);
                eng_gram_t *g = NULL;
                eng_gram_state_t *gs = NULL;
                assert(eng_gram_compile((eng_gram_kind_t)req.gram_kind, req.gram_schema,
                                        req.gram_schema_len, &g, NULL, 0) == PD_OK);
                assert(eng_gram_state_create(g, &gs) == PD_OK);
                for (size_t i = 0; i < size && i < 256; i++)
                    (void)eng_gram_feed(gs, data + i, 1);
                (void)eng_gram_complete(gs);
                eng_gram_state_free(gs);
                eng_gram_free(g);
            }
            rtr_oai_req_free(&req);
        } else {
            assert(err.http_status >= 400 && err.http_status < 600);
            char *json = api == 2 || api == 3 ? rtr_anth_error_json(&err)
                                              : rtr_oai_error_json(&err);
            free(json);
        }
    }
    const rtr_emb_limits_t el = { .max_inputs = 16, .max_input_tokens = 64,
                                  .max_input_bytes = 256, .vocab_size = 32000 };
    rtr_emb_req_t eq;
    rtr_oai_error_t err;
    if (rtr_emb_parse((const char *)data, size, &el, &eq, &err) == PD_OK) {
        assert(eq.n_inputs >= 1 && eq.n_inputs <= el.max_inputs);
        float *v = calloc((size_t)eq.n_inputs * 8, sizeof(float));
        for (uint32_t i = 0; i < eq.n_inputs; i++) {
            const rtr_emb_input_t *in = &eq.inputs[i];
            assert((in->text != NULL) != (in->ids != NULL));
            assert(in->text == NULL || (in->text_len >= 1 && in->text_len <= el.max_input_bytes));
            assert(in->ids == NULL || (in->n_ids >= 1 && in->n_ids <= el.max_input_tokens));
            for (uint32_t k = 0; in->ids != NULL && k < in->n_ids; k++)
                assert(in->ids[k] >= 0 && (uint32_t)in->ids[k] < el.vocab_size);
            if (v != NULL)
                v[(size_t)i * 8 + i % 8] = 1.0f;
        }
        if (v != NULL)
            free(rtr_emb_render(&eq, v, 8, "m", 1, &err));
        free(v);
        rtr_emb_req_free(&eq);
    } else {
        assert(err.http_status >= 400 && err.http_status < 600);
    }
    return 0;
}
