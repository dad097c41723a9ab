/* rtr_anthropic.h - Anthropic's Messages API on the router's request core
 * (rtr_fd.h says how a front door plugs in). POST /v1/messages and
 * /v1/messages/count_tokens; the renderer is rtr_anth_api. */
#ifndef RTR_ANTHROPIC_H
#define RTR_ANTHROPIC_H

#include "rtr_fd.h"

/* A Messages body (count_only: a count_tokens body, no max_tokens) ->
 * *req, api RTR_API_MESSAGES. rtr_oai_parse's contract: PD_OK, or
 * PD_ERR_BAD_INPUT / PD_ERR_TOO_BIG with *err naming the field (render it
 * with rtr_anth_error_json), or PD_ERR_NO_MEMORY. */
pd_status_t rtr_anth_parse(const char *body, size_t len, const rtr_oai_limits_t *lim,
                           bool count_only, rtr_oai_req_t *req, rtr_oai_error_t *err);

/* Anthropic's error envelope {"type":"error","error":{"type","message"}},
 * the type from the HTTP status (400 invalid_request_error, 401
 * authentication_error, 404 not_found_error, 413 request_too_large, 429
 * rate_limit_error, 503 overloaded_error, else api_error). */
char *rtr_anth_error_json(const rtr_oai_error_t *err);

#endif
