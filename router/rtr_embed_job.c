/* rtr_embed_job.c - POST /v1/embeddings, the job: inputs to prefill
 * daemons, their answers, retries, timeout, the answer. See
 * rtr_embed_job.h. */
#include "rtr_embed_job.h"

#include "rtr_flow.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pd_log.h"
#include "pd_time.h"

struct rtr_emb_job {
    struct rtr_emb_job *next;
    rtr_t *r;
    const rtr_emb_client_t *out;
    void *client;                  /* rtr_http.c's request; NULL once the connection is gone */
    void *conn;                    /* its connection, watched by rtr_http.c */
    struct event *timer;           /* request-timeout */
    uint64_t seq;
    char reqid[PROTO_REQID_MAX + 1];
    rtr_emb_req_t req;
    int8_t *state;                 /* (n_inputs) 0 waiting, 1 in flight, 2 done */
    rtr_backend_t **be;            /* (n_inputs) where an input in flight went */
    uint32_t n_done, n_sent, retries;
    uint32_t n_embd;
    float *vecs;                   /* (n_inputs, n_embd) once the first answer came */
    uint64_t prompt_tokens, t0_ns;
};

static rtr_emb_job_t *g_emb_jobs;     /* one router per process */

/* The one end of a job (and the undo of a start that failed): unlinked, its
 * admission released (once: only a linked job holds one). */
static void emb_free(rtr_emb_job_t *j)
{
    rtr_t *r = j->r;
    bool admitted = false;
    for (rtr_emb_job_t **pp = &g_emb_jobs; *pp != NULL; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            admitted = true;
            break;
        }
    if (j->conn != NULL)
        j->out->unwatch(j->conn);
    if (j->timer != NULL)
        event_free(j->timer);
    rtr_emb_req_free(&j->req);
    free(j->state);
    free(j->be);
    free(j->vecs);
    free(j);
    if (admitted) {
        r->n_reqs--;
        pd_stats_gauge_add(r->stats, RTR_STAT_requests_inflight, -1);
        rtr_flow_check_idle(r);
    }
}

static void emb_cancel_inflight(rtr_emb_job_t *j)
{
    for (uint32_t i = 0; i < j->req.n_inputs; i++) {
        if (j->state[i] != 1 || j->be[i] == NULL)
            continue;
        proto_msg_t m;
        memset(&m, 0, sizeof(m));
        m.hdr.type = PROTO_MSG_CANCEL;
        snprintf(m.u.cancel.request_id, sizeof(m.u.cancel.request_id), "emb-%" PRIu64 "-%u",
                 j->seq, i);
        snprintf(m.u.cancel.reason, sizeof(m.u.cancel.reason), "embeddings request ended");
        (void)rtr_backend_send(j->be[i], &m);
        j->be[i]->assigned--;
        j->state[i] = 0;
    }
}

static void emb_access(rtr_emb_job_t *j, int status, const char *outcome)
{
    char peer[64];
    j->out->peer(j->client, peer, sizeof(peer));
    pd_log(PD_LOG_INFO, RTR_COMP, j->reqid,
           "access client=%s endpoint=/v1/embeddings status=%d outcome=%s inputs=%u "
           "prompt_tokens=%" PRIu64 " total_ms=%.1f retries=%u", peer, status, outcome,
           j->req.n_inputs, j->prompt_tokens, (double)(pd_now_ns() - j->t0_ns) / 1e6,
           j->retries);
}

static void emb_fail(rtr_emb_job_t *j, const rtr_oai_error_t *err)
{
    emb_cancel_inflight(j);
    if (j->client != NULL) {
        emb_access(j, err->http_status, "failed");
        j->out->error(j->r, j->client, err, j->reqid);
    }
    pd_stats_inc(j->r->stats, RTR_STAT_requests_failed);
    emb_free(j);
}

/* Send what the window allows. false: the job ended (failed). */
static bool emb_pump(rtr_emb_job_t *j)
{
    rtr_t *r = j->r;
    uint32_t inflight = j->n_sent - j->n_done;
    for (uint32_t i = 0; i < j->req.n_inputs && inflight < RTR_EMB_WINDOW; i++) {
        if (j->state[i] != 0)
            continue;
        const rtr_emb_input_t *in = &j->req.inputs[i];
        uint32_t bt = r->geom_fixed && r->geom.block_tokens ? r->geom.block_tokens : 16;
        rtr_backend_t *be = rtr_pick_backend(r, PROTO_CAP_PREFILL, (in->n_ids + bt - 1) / bt,
                                             NULL);
        rtr_oai_error_t err;
        if (be == NULL) {
            pd_stats_inc(r->stats, RTR_STAT_requests_overloaded);
            rtr_oai_error_set(&err, 503, "server_error", "no_prefill_daemon", NULL,
                              rtr_have_backend(r, PROTO_CAP_PREFILL)
                                  ? "every prefill daemon is busy; retry later"
                                  : "embeddings are computed by prefill daemons and this "
                                    "deployment has none ready");
            emb_fail(j, &err);
            return false;
        }
        proto_msg_t m;
        memset(&m, 0, sizeof(m));
        m.hdr.type = PROTO_MSG_EMBED_REQ;
        snprintf(m.u.embed_req.request_id, sizeof(m.u.embed_req.request_id),
                 "emb-%" PRIu64 "-%u", j->seq, i);
        m.u.embed_req.pooling = PROTO_POOL_DEFAULT;
        m.u.embed_req.prompt = (proto_tokens_t){ in->n_ids, in->ids, NULL };
        if (rtr_backend_send(be, &m) != PD_OK) {
            rtr_oai_error_set(&err, 503, "server_error", NULL, NULL,
                              "prefill daemon '%s' unreachable", be->id);
            emb_fail(j, &err);
            return false;
        }
        be->assigned++;
        j->be[i] = be;
        j->state[i] = 1;
        j->n_sent++;
        inflight++;
    }
    return true;
}

static void emb_finish(rtr_emb_job_t *j)
{
    rtr_oai_error_t err;
    memset(&err, 0, sizeof(err));
    char *json = rtr_emb_render(&j->req, j->vecs, j->n_embd, j->r->model_name,
                                j->prompt_tokens, &err);
    if (json == NULL) {
        emb_fail(j, &err);
        return;
    }
    if (j->client != NULL) {
        emb_access(j, 200, "completed");
        j->out->json(j->client, json, j->reqid);
    }
    free(json);
    pd_stats_inc(j->r->stats, RTR_STAT_requests_completed);
    pd_stats_add(j->r->stats, RTR_STAT_prompt_tokens, j->prompt_tokens);
    emb_free(j);
}

/* An input whose daemon failed it or went away: again elsewhere, or the end. */
static void emb_input_lost(rtr_emb_job_t *j, uint32_t i, pd_status_t st, const char *why)
{
    j->state[i] = 0;
    if (j->be[i] != NULL)
        j->be[i]->assigned--;
    j->be[i] = NULL;
    j->n_sent--;
    rtr_oai_error_t err;
    bool again = (st == PD_ERR_OVERLOADED || st == PD_ERR_PEER_GONE || st == PD_ERR_SHUTDOWN ||
                  st == PD_ERR_NO_KV_SPACE) && j->retries < j->r->cfg.max_retries;
    if (again) {
        j->retries++;
        pd_stats_inc(j->r->stats, RTR_STAT_requests_retried);
        (void)emb_pump(j);
        return;
    }
    if (st == PD_ERR_UNSUPPORTED)
        rtr_oai_error_set(&err, 400, "invalid_request_error", "embeddings_unsupported", "model",
                          "this deployment serves no embeddings: %s", why);
    else if (st == PD_ERR_TOO_BIG)
        rtr_oai_error_set(&err, 400, "invalid_request_error", "context_length_exceeded",
                          "input", "input %u: %s", i, why);
    else if (st == PD_ERR_OVERLOADED || st == PD_ERR_PEER_GONE || st == PD_ERR_SHUTDOWN ||
             st == PD_ERR_NO_KV_SPACE)
        rtr_oai_error_set(&err, 503, "server_error", NULL, NULL, "prefill: %s", why);
    else
        rtr_oai_error_set(&err, 502, "server_error", NULL, NULL, "prefill: %s (%s)", why,
                          pd_status_name(st));
    emb_fail(j, &err);
}

static rtr_emb_job_t *emb_find(const char *id, uint32_t *i_p)
{
    uint64_t seq;
    unsigned i;
    int used = 0;
    if (sscanf(id, "emb-%" SCNu64 "-%u%n", &seq, &i, &used) != 2 || id[used] != '\0')
        return NULL;
    for (rtr_emb_job_t *j = g_emb_jobs; j != NULL; j = j->next)
        if (j->seq == seq && i < j->req.n_inputs) {
            *i_p = i;
            return j;
        }
    return NULL;
}

bool rtr_emb_job_msg(rtr_t *r, rtr_backend_t *be, const proto_msg_t *msg)
{
    (void)r;
    const char *id = msg->hdr.type == PROTO_MSG_EMBED_DONE ? msg->u.embed_done.request_id
                     : msg->hdr.type == PROTO_MSG_ERROR    ? msg->u.error.request_id
                                                           : NULL;
    if (id == NULL || strncmp(id, "emb-", 4) != 0)
        return false;
    uint32_t i = 0;
    rtr_emb_job_t *j = emb_find(id, &i);
    if (j == NULL || j->state[i] != 1 || j->be[i] != be)
        return true; /* late: the request ended or the input moved */
    if (msg->hdr.type == PROTO_MSG_ERROR) {
        emb_input_lost(j, i, msg->u.error.status, msg->u.error.message);
        return true;
    }
    const proto_embed_done_t *d = &msg->u.embed_done;
    uint32_t n = d->vec.len / 4;
    if (j->vecs == NULL) {
        j->n_embd = n;
        j->vecs = malloc((size_t)j->req.n_inputs * n * sizeof(float));
    }
    if (j->vecs == NULL || n != j->n_embd) {
        rtr_oai_error_t err;
        rtr_oai_error_set(&err, j->vecs == NULL ? 500 : 502, "server_error", NULL, NULL,
                          j->vecs == NULL ? "out of memory"
                                          : "prefill daemons answered embeddings of unequal sizes");
        emb_fail(j, &err);
        return true;
    }
    for (uint32_t k = 0; k < n; k++)
        j->vecs[(size_t)i * n + k] = proto_embed_get(d, k);
    j->state[i] = 2;
    be->assigned--;
    j->be[i] = NULL;
    j->n_done++;
    j->prompt_tokens += d->n_prompt_tokens;
    if (j->n_done == j->req.n_inputs)
        emb_finish(j);
    else
        (void)emb_pump(j);
    return true;
}

void rtr_emb_job_down(rtr_t *r, rtr_backend_t *be)
{
    (void)r;
again:
    for (rtr_emb_job_t *j = g_emb_jobs; j != NULL; j = j->next)
        for (uint32_t i = 0; i < j->req.n_inputs; i++)
            if (j->state[i] == 1 && j->be[i] == be) {
                emb_input_lost(j, i, PD_ERR_PEER_GONE, "prefill daemon lost");
                goto again; /* j may be gone */
            }
}

static void emb_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    rtr_emb_job_t *j = arg;
    rtr_oai_error_t err;
    rtr_oai_error_set(&err, 504, "server_error", "timeout", NULL,
                      "embeddings not computed within request-timeout");
    emb_fail(j, &err);
}

pd_status_t rtr_emb_job_start(rtr_t *r, const rtr_emb_client_t *out, void *client,
                              const char *reqid, rtr_emb_req_t *req, rtr_emb_job_t **j_p)
{
    *j_p = NULL;
    rtr_emb_job_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return PD_ERR_NO_MEMORY;
    j->r = r;
    j->state = calloc(req->n_inputs, sizeof(*j->state));
    j->be = calloc(req->n_inputs, sizeof(*j->be));
    j->timer = evtimer_new(r->base, emb_timeout, j);
    if (j->state == NULL || j->be == NULL || j->timer == NULL) {
        emb_free(j); /* not linked: *req untouched */
        return PD_ERR_NO_MEMORY;
    }
    static uint64_t seq;
    j->req = *req;
    memset(req, 0, sizeof(*req));
    j->out = out;
    j->client = client;
    j->seq = ++seq;
    j->t0_ns = pd_now_ns();
    snprintf(j->reqid, sizeof(j->reqid), "%s", reqid);
    j->next = g_emb_jobs;
    g_emb_jobs = j;
    r->n_reqs++; /* admitted: released by emb_free */
    pd_stats_gauge_add(r->stats, RTR_STAT_requests_inflight, 1);
    struct timeval tv = pd_ns_to_timeval(r->cfg.request_timeout_ns);
    event_add(j->timer, &tv);
    pd_stats_inc(r->stats, RTR_STAT_requests_accepted);
    if (emb_pump(j))
        *j_p = j;
    return PD_OK;
}

void rtr_emb_job_set_conn(rtr_emb_job_t *j, void *conn)
{
    j->conn = conn;
}

void *rtr_emb_job_client_gone(rtr_emb_job_t *j, rtr_t **r_p)
{
    void *client = j->client;
    *r_p = j->r;
    pd_stats_inc(j->r->stats, RTR_STAT_client_disconnects);
    pd_stats_inc(j->r->stats, RTR_STAT_requests_canceled);
    pd_log(PD_LOG_INFO, RTR_COMP, j->reqid, "embeddings: client gone");
    j->conn = NULL;
    j->client = NULL;
    emb_cancel_inflight(j);
    emb_free(j);
    return client;
}

void rtr_emb_job_fail_all(rtr_t *r)
{
    (void)r;
    while (g_emb_jobs != NULL) {
        rtr_oai_error_t err;
        rtr_oai_error_set(&err, 503, "server_error", "shutting_down", NULL,
                          "the router is stopping");
        emb_fail(g_emb_jobs, &err);
    }
}
