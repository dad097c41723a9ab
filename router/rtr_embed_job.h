/* rtr_embed_job.h - POST /v1/embeddings, the job: one per request, each
 * input (parsed and tokenized by rtr_http.c, rtr_embed.c's body) sent to a
 * prefill daemon as an EMBED_REQ with the control-plane id "emb-<job>-<i>",
 * at most RTR_EMB_WINDOW in flight; the EMBED_DONEs fill the vectors and
 * the last one renders the answer (rtr_emb_render). A prefill lost or
 * overloaded: the input goes to another (max-retries per request). The
 * client gone: CANCEL what is in flight, the job ends. Not the chat core
 * (rtr_flow.c): rtr_main.c hands EMBED_DONE / ERROR / a backend's loss to
 * the job before the flow.
 *
 * Admission: a job counts in r->n_reqs, the one in-flight count
 * max-concurrent and the drain read, from rtr_emb_job_start to its one end
 * (answered, failed, timed out or its client gone), like a chat request.
 *
 * No evhttp here: the client is rtr_http.c's request, opaque to the job,
 * reached only through the rtr_emb_client_t it gives (calls go one way:
 * rtr_http.c -> the job -> rtr_ctl.c, as for the flow's r->out). */
#ifndef RTR_EMBED_JOB_H
#define RTR_EMBED_JOB_H

#include "rtr_embed.h"
#include "rtr_int.h"

#define RTR_EMB_WINDOW 16u /* inputs of one job in flight */

typedef struct rtr_emb_job rtr_emb_job_t;

/* The client side, rtr_http.c's: the client's "address:port" ("-" if
 * unknown, for the access log); a 200 JSON answer; an error in the
 * client's API envelope (Retry-After on 429 / 503); the connection no
 * longer watched. */
typedef struct {
    void (*peer)(void *client, char *buf, size_t cap);
    void (*json)(void *client, const char *json, const char *reqid);
    void (*error)(rtr_t *r, void *client, const rtr_oai_error_t *err, const char *reqid);
    void (*unwatch)(void *conn);
} rtr_emb_client_t;

/* Accept req (every input tokenized and within the context; the caller
 * admitted it) for client, answered through out (static) under reqid. PD_OK: *req moved in (left
 * empty) and the first inputs sent; *j_p the job, or NULL when it ended
 * already (no prefill took an input: the error was sent). PD_ERR_NO_MEMORY:
 * nothing accepted, *req untouched (the caller replies). */
pd_status_t rtr_emb_job_start(rtr_t *r, const rtr_emb_client_t *out, void *client,
                              const char *reqid, rtr_emb_req_t *req, rtr_emb_job_t **j_p);

/* The connection the caller watches for j's client (evhttp's close
 * callback, with j as its argument): released when j ends. */
void rtr_emb_job_set_conn(rtr_emb_job_t *j, void *conn);

/* j's client went away (from the close callback of its connection): CANCEL
 * what is in flight, j ends. Returns the client (the caller decides if it
 * is its to free) and *r_p. */
void *rtr_emb_job_client_gone(rtr_emb_job_t *j, rtr_t **r_p);

/* The router stops (rtr_http_stop): every job ends with a 503. */
void rtr_emb_job_fail_all(rtr_t *r);

/* rtr_emb_job_msg / rtr_emb_job_down (rtr_main.c's calls): rtr_int.h. */

#endif
