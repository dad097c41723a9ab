/* rtr_responses.h - OpenAI's Responses API on the router's request core
 * (rtr_fd.h says how a front door plugs in): POST /v1/responses. Nothing
 * is stored: store: true and previous_response_id are refused with their
 * names (docs/API.md "Responses API"). The renderer is rtr_resp_api. */
#ifndef RTR_RESPONSES_H
#define RTR_RESPONSES_H

#include "rtr_fd.h"

/* A Responses body -> *req, api RTR_API_RESPONSES; rtr_oai_parse's
 * contract (errors in OpenAI's envelope, rtr_oai_error_json). count_only
 * must be false. */
pd_status_t rtr_resp_parse(const char *body, size_t len, const rtr_oai_limits_t *lim,
                           bool count_only, rtr_oai_req_t *req, rtr_oai_error_t *err);

#endif
