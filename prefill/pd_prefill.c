/* pd_prefill.c - the pd-prefill daemon (see prefill/README.md, pf.h and the
 * flow spec in proto/PROTOCOL.md "Flows").
 *
 * Loop thread: router session, admission, kvx (export/leases), admin.
 * Compute thread (eng_runner): prompt pass into the arena + token 0. */
#include "pf.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include <event2/event.h>
#include <xxhash.h>

#include "eng_boot.h"
#include "pd_log.h"
#include "pd_time.h"
#include "proto_boot.h"

#define PF_COMP "prefill"

static const char *const pf_kv_dtypes[] = { "f32", "f16", NULL };

#define PF_ROW(field, key, type, def, help, min, max, en)                     \
    PD_CFG_ROW(pf_config_t, field, key, type, def, help, min, max, en)
#define PF_ROW_X(field, key, type, def, help, min, max, en) PF_ROW(field, key, type, def, help, min, max, en),
static const pd_cfg_field_t pf_fields[] = {
    PROTO_BOOT_HEAD_ROWS(PF_ROW_X, "daemon id (default prefill-<pid>)")
    ENG_BOOT_ROWS(PF_ROW_X, pf_kv_dtypes)
    PF_ROW(kv_blocks, "kv-blocks", UINT, "1024", "KV blocks in the arena", 1, 1e8, NULL),
    PF_ROW(max_queue, "max-queue", UINT, "64", "requests queued or computing before OVERLOADED", 1, 1e6, NULL),
    PF_ROW(lease_ttl_ns, "lease-ttl", DURATION, "30s", "KV lease length after PREFILL_DONE", 1e6, 600e9, NULL),
    PF_ROW(max_prompt_tokens, "max-prompt-tokens", UINT, "1048576", "longest prompt accepted", 1, 1048576, NULL),
    PROTO_BOOT_TAIL_ROWS(PF_ROW_X)
    PF_ROW(metrics_listen, "metrics.listen", STRING, NULL, "HTTP /metrics + /health address host:port (port 0: any; default off)", 0, 0, NULL),
    PD_CFG_END,
};

static const pd_cfg_schema_t pf_schema = {
    .prog = "pd-prefill",
    .summary = "pd-prefill [--config FILE] [--key=value ...]: prefill daemon (prompt pass, KV export)",
    .fields = pf_fields,
};

static const pd_stat_desc_t pf_stat_descs[] = { PF_STATS(PD_STAT_DESC) };
/* Prometheus: outcomes as one labeled family, buckets fit for each figure */
static const pd_stat_prom_t pf_stat_prom[] = {
    PD_STAT_PROM_LABEL("completed", "requests", "outcome", "completed", "requests ended, by outcome"),
    PD_STAT_PROM_LABEL("failed", "requests", "outcome", "failed", NULL),
    PD_STAT_PROM_LABEL("canceled", "requests", "outcome", "canceled", NULL),
    PD_STAT_PROM_LE("queue_time", MS), PD_STAT_PROM_LE("prefill_time", MS),
    PD_STAT_PROM_LE("lease_time", S),
};
static const pd_stats_table_t pf_stats_table =
    PD_STATS_TABLE_PROM("prefill", pf_stat_descs, pf_stat_prom);

static const char *const pf_state_names[] = {
#define PF_X_NAME(name, text) text,
    PF_STATES(PF_X_NAME)
#undef PF_X_NAME
};

/* ---- requests: lookup ---------------------------------------------------- */

static pf_req_t *pf_req_find(pf_t *pf, const char *id)
{
    pd_idhash_node_t *n = pd_idhash_find(&pf->by_id, id);
    return n != NULL ? PD_CONTAINER_OF(n, pf_req_t, hnode) : NULL;
}

static void pf_req_link(pf_t *pf, pf_req_t *r)
{
    pd_idhash_add(&pf->by_id, &r->hnode, r->id);
    r->next = pf->live;
    r->prev = NULL;
    if (pf->live)
        pf->live->prev = r;
    pf->live = r;
    pf->n_live++;
    pd_stats_gauge_set(pf->stats, PF_ST_live, pf->n_live);
}

static void pf_req_unlink(pf_t *pf, pf_req_t *r)
{
    pd_idhash_del(&pf->by_id, &r->hnode);
    if (r->prev)
        r->prev->next = r->next;
    else
        pf->live = r->next;
    if (r->next)
        r->next->prev = r->prev;
    pf->n_live--;
    pd_stats_gauge_set(pf->stats, PF_ST_live, pf->n_live);
}

static void pf_req_free(void *obj)
{
    pf_req_t *r = obj;
    free(r->prompt);
    free(r->blocks);
    free(r);
}

/* ---- the one state setter ------------------------------------------------ */

static bool pf_transition_ok(pf_state_t from, pf_state_t to)
{
    switch (from) {
    case PF_ST_NEW:       return to == PF_ST_COMPUTING;
    case PF_ST_COMPUTING: return to == PF_ST_LEASED || to == PF_ST_FAILED ||
                                 to == PF_ST_CANCELED;
    case PF_ST_LEASED:    return to == PF_ST_COMPLETED || to == PF_ST_FAILED ||
                                 to == PF_ST_CANCELED;
    default:              return false;
    }
}

static void pf_maybe_drained(pf_t *pf);

/* Assert the transition, stamp the time, keep gauges; on a terminal state
 * free the blocks (the lease is over by then), count the outcome, unlink
 * and defer the free. */
static void pf_req_set_state(pf_req_t *r, pf_state_t to)
{
    pf_t *pf = r->pf;
    assert(pf_transition_ok(r->state, to));
    if (!pf_transition_ok(r->state, to)) {
        pd_log(PD_LOG_ERROR, PF_COMP, r->id, "illegal state change %s -> %s",
               pf_state_names[r->state], pf_state_names[to]);
        return;
    }
    pf_state_t from = r->state;
    uint64_t now = pd_now_ns();
    r->state = to;
    r->t[to] = now;
    if (from == PF_ST_COMPUTING)
        pd_stats_gauge_set(pf->stats, PF_ST_computing, --pf->n_computing);
    if (to == PF_ST_COMPUTING)
        pd_stats_gauge_set(pf->stats, PF_ST_computing, ++pf->n_computing);
    if (to == PF_ST_LEASED)
        pd_stats_gauge_add(pf->stats, PF_ST_leased, 1);
    if (from == PF_ST_LEASED) {
        pd_stats_gauge_add(pf->stats, PF_ST_leased, -1);
        pd_stats_observe_ns(pf->stats, PF_ST_lease_time, now - r->t[PF_ST_LEASED]);
        if (r->lease.slot < pf->max_leases && pf->lease_slots[r->lease.slot] == r)
            pf->lease_slots[r->lease.slot] = NULL;
    }
    if (to != PF_ST_COMPLETED && to != PF_ST_FAILED && to != PF_ST_CANCELED)
        return;
    if (r->blocks_held) {
        pd_status_t st = kvx_blocks_free(pf->blocks, r->blocks, r->n_blocks);
        if (st != PD_OK)
            pd_log(PD_LOG_ERROR, PF_COMP, r->id, "freeing %u blocks: %s (leaked)",
                   r->n_blocks, pd_status_str(st));
        r->blocks_held = false;
    }
    pd_stats_inc(pf->stats, to == PF_ST_COMPLETED ? PF_ST_completed
                          : to == PF_ST_FAILED ? PF_ST_failed : PF_ST_canceled);
    pf_req_unlink(pf, r);
    if (pd_loop_defer_free(pf->loop, pf_req_free, r) != PD_OK)
        pf_req_free(r); /* nothing references it any more */
    pf_maybe_drained(pf);
}

/* ---- replies ---------------------------------------------------------------- */

static void pf_send_error(pf_t *pf, const char *id, pd_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void pf_send_error(pf_t *pf, const char *id, pd_status_t status, const char *fmt, ...)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_ERROR;
    snprintf(m.u.error.request_id, sizeof(m.u.error.request_id), "%s", id);
    m.u.error.status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.u.error.message, sizeof(m.u.error.message), fmt, ap);
    va_end(ap);
    (void)proto_session_send(pf->sess, &m);
}

/* A request's one answer (PREFILL_DONE or ERROR), only to the router
 * session it came from. */
static bool pf_can_reply(pf_t *pf, pf_req_t *r)
{
    return r->reply_pending && r->epoch == pf->epoch && proto_session_up(pf->sess);
}

/* ---- compute thread ----------------------------------------------------- */

static void pf_job_run(eng_job_t *job)
{
    pf_req_t *r = (pf_req_t *)job;
    pf_t *pf = r->pf;
    r->run_start_ns = pd_now_ns();
    if (atomic_load(&r->cancel)) {
        r->cstatus = PD_ERR_CANCELED;
        r->run_end_ns = r->run_start_ns;
        return;
    }
    pd_status_t st = pf->ops->prefill(pf->model, kvx_region_base(pf->region), r->blocks,
                                      r->n_blocks, r->prompt, r->n_prompt, 0, pf->logits);
    if (st == PD_OK) {
        eng_sampler_t s;
        eng_sampler_init(&s, &r->sp);
        eng_sample_hist_t hist = { r->prompt, r->n_prompt, NULL, 0 };
        r->token0 = eng_sample_next_lp(&s, pf->logits, pf->geom->vocab_size, &pf->scratch,
                                       &hist, r->lp_top, r->lp_on ? &r->lp0 : NULL);
        if (r->token0 < 0)
            st = PD_ERR_INTERNAL;
    }
    r->cstatus = st;
    r->run_end_ns = pd_now_ns();
}

/* ---- loop: compute done -> export -> PREFILL_DONE ------------------------ */

static void pf_job_done(eng_job_t *job)
{
    pf_req_t *r = (pf_req_t *)job;
    pf_t *pf = r->pf;
    if (job->aborted) {
        r->cstatus = PD_ERR_SHUTDOWN;
        r->run_start_ns = r->run_end_ns = pd_now_ns();
    }
    pd_stats_observe_ns(pf->stats, PF_ST_queue_time, r->run_start_ns - r->t[PF_ST_COMPUTING]);
    if (atomic_load(&r->cancel) || pf->stopping) {
        if (pf_can_reply(pf, r) && !pf->stopping)
            pf_send_error(pf, r->id, PD_ERR_CANCELED, "canceled");
        pf_req_set_state(r, PF_ST_CANCELED);
        return;
    }
    if (r->cstatus != PD_OK) {
        pd_log(PD_LOG_WARN, PF_COMP, r->id, "prefill failed: %s", pd_status_str(r->cstatus));
        if (pf_can_reply(pf, r))
            pf_send_error(pf, r->id, r->cstatus, "prefill: %s", pd_status_str(r->cstatus));
        pf_req_set_state(r, PF_ST_FAILED);
        return;
    }
    pd_stats_observe_ns(pf->stats, PF_ST_prefill_time, r->run_end_ns - r->run_start_ns);
    pd_stats_add(pf->stats, PF_ST_prompt_tokens, r->n_prompt);
    if (!pf_can_reply(pf, r)) { /* the router that asked is gone */
        pf_req_set_state(r, PF_ST_CANCELED);
        return;
    }
    uint64_t importer = XXH64(r->target, strlen(r->target), 0);
    if (importer == 0)
        importer = 1;
    uint8_t handle[KVX_HANDLE_MAX_BYTES];
    size_t hlen = 0;
    pd_status_t st = kvx_export(pf->region, importer, r->blocks, r->n_blocks,
                                r->lease_ttl_ns, (uint64_t)(uintptr_t)r, handle,
                                sizeof(handle), &hlen, &r->lease);
    if (st != PD_OK) {
        pd_log(PD_LOG_WARN, PF_COMP, r->id, "export: %s", pd_status_str(st));
        pf_send_error(pf, r->id, st == PD_ERR_NO_SPACE ? PD_ERR_OVERLOADED : st,
                      "kv export: %s", pd_status_str(st));
        pf_req_set_state(r, PF_ST_FAILED);
        return;
    }
    if (r->lease.slot < pf->max_leases)
        pf->lease_slots[r->lease.slot] = r;
    pf_req_set_state(r, PF_ST_LEASED);
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_PREFILL_DONE;
    proto_prefill_done_t *d = &m.u.prefill_done;
    snprintf(d->request_id, sizeof(d->request_id), "%s", r->id);
    d->first_token = r->token0;
    d->n_prompt_tokens = r->n_prompt;
    d->lease_id = (uint64_t)r->lease.slot << 32 | (r->lease.gen & 0xffffffffu);
    d->lease_ns = r->lease_ttl_ns;
    d->kv_handle.p = handle;
    d->kv_handle.len = (uint32_t)hlen;
    d->queue_ns = r->run_start_ns - r->t[PF_ST_COMPUTING];
    d->prefill_ns = r->run_end_ns - r->run_start_ns;
    proto_logprob_t lp0;
    if (r->lp_on) {
        _Static_assert(ENG_SAMPLE_MAX_TOP_LOGPROBS == PROTO_MAX_TOP_LOGPROBS, "top logprobs");
        lp0.logprob = r->lp0.logprob;
        memcpy(lp0.top_ids, r->lp0.top_ids, sizeof(lp0.top_ids));
        memcpy(lp0.top_lp, r->lp0.top_lp, sizeof(lp0.top_lp));
        d->logprobs = (proto_logprobs_t){ r->lp0.n_top, 1, &lp0, NULL };
    }
    r->reply_pending = false;
    st = proto_session_send(pf->sess, &m);
    if (st != PD_OK) {
        pd_log(PD_LOG_WARN, PF_COMP, r->id, "PREFILL_DONE not sent: %s; revoking",
               pd_status_str(st));
        (void)kvx_lease_revoke(pf->kvx, r->lease); /* -> CANCELED */
    }
}

static void pf_on_lease_end(void *arg, const kvx_lease_info_t *info, kvx_lease_end_t why)
{
    pf_t *pf = arg;
    pf_req_t *r = info->slot < pf->max_leases ? pf->lease_slots[info->slot] : NULL;
    if (r == NULL || (uint64_t)(uintptr_t)r != info->user_tag || r->state != PF_ST_LEASED) {
        pd_log(PD_LOG_ERROR, PF_COMP, NULL, "lease end for unknown slot %u", info->slot);
        return;
    }
    pd_log(PD_LOG_DEBUG, PF_COMP, r->id, "lease ended: %s",
           why == KVX_LEASE_RELEASED ? "released" : why == KVX_LEASE_EXPIRED ? "expired"
                                                                              : "revoked");
    pf_req_set_state(r, why == KVX_LEASE_RELEASED ? PF_ST_COMPLETED
                      : why == KVX_LEASE_EXPIRED ? PF_ST_FAILED : PF_ST_CANCELED);
}

/* ---- loop: messages ----------------------------------------------------- */

static pd_status_t pf_sampling(pf_t *pf, const proto_sampling_t *ps, eng_sample_params_t *sp)
{
    eng_sample_params_default(sp);
    sp->temperature = ps->temperature;
    sp->top_p = ps->top_p;
    sp->top_k = ps->top_k;
    sp->seed = ps->seed;
    sp->max_tokens = ps->max_tokens;
    sp->min_tokens = ps->min_tokens;
    sp->ignore_eos = (ps->flags & PROTO_SAMPLE_IGNORE_EOS) != 0;
    sp->n_eos = pf->n_eos;
    memcpy(sp->eos_ids, pf->eos_ids, sizeof(sp->eos_ids));
    if (ps->stop.n > ENG_SAMPLE_MAX_STOP_IDS)
        return PD_ERR_TOO_BIG;
    sp->n_stop_ids = proto_tokens_copy(&ps->stop, sp->stop_ids, ENG_SAMPLE_MAX_STOP_IDS);
    sp->presence_penalty = ps->presence_penalty;
    sp->frequency_penalty = ps->frequency_penalty;
    sp->repetition_penalty = ps->repetition_penalty;
    sp->min_p = ps->min_p;
    if (ps->n_bias > ENG_SAMPLE_MAX_BIAS)
        return PD_ERR_TOO_BIG;
    sp->n_bias = ps->n_bias;
    for (uint32_t i = 0; i < ps->n_bias; i++)
        sp->bias[i] = (eng_logit_bias_t){ ps->bias_ids[i], ps->bias[i] };
    return eng_sample_params_check(sp);
}

static void pf_on_prefill_req(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    pf_t *pf = arg;
    const proto_prefill_req_t *q = &msg->u.prefill_req;
    pd_status_t st = PD_OK;
    const char *why = "";
    uint32_t n = q->prompt.n;
    if (pf->draining || pf->stopping) {
        st = PD_ERR_SHUTDOWN; why = "draining";
    } else if (pf_req_find(pf, q->request_id) != NULL) {
        st = PD_ERR_EXISTS; why = "request id already live";
    } else if (n == 0) {
        st = PD_ERR_BAD_INPUT; why = "empty prompt";
    } else if (n > pf->cfg.max_prompt_tokens || n >= pf->geom->context_length) {
        st = PD_ERR_TOO_BIG; why = "prompt too long";
    } else if (q->target_decode_id[0] == '\0') {
        st = PD_ERR_BAD_INPUT; why = "no target decode id";
    } else if (pf->n_computing >= pf->cfg.max_queue) {
        st = PD_ERR_OVERLOADED; why = "queue full";
    }
    for (uint32_t i = 0; st == PD_OK && i < n; i++)
        if ((uint32_t)proto_tokens_get(&q->prompt, i) >= pf->geom->vocab_size) {
            st = PD_ERR_BAD_INPUT; why = "token id out of range";
        }
    eng_sample_params_t sp;
    if (st == PD_OK && pf_sampling(pf, &q->sampling, &sp) != PD_OK) {
        st = PD_ERR_BAD_INPUT; why = "bad sampling parameters";
    }
    uint32_t nb = (n + pf->geom->block_tokens - 1) / pf->geom->block_tokens;
    if (st == PD_OK && nb > kvx_blocks_free_count(pf->blocks)) {
        st = PD_ERR_NO_KV_SPACE; why = "no free KV blocks";
    }
    pf_req_t *r = NULL;
    if (st == PD_OK) {
        r = calloc(1, sizeof(*r));
        if (r == NULL || (r->prompt = malloc((size_t)n * sizeof(int32_t))) == NULL ||
            (r->blocks = malloc((size_t)nb * sizeof(uint32_t))) == NULL) {
            if (r)
                pf_req_free(r);
            r = NULL;
            st = PD_ERR_NO_MEMORY; why = "out of memory";
        }
    }
    if (st != PD_OK) {
        pd_stats_inc(pf->stats, PF_ST_rejected);
        pd_log(PD_LOG_DEBUG, PF_COMP, q->request_id, "rejected: %s", why);
        pf_send_error(pf, q->request_id, st, "%s", why);
        return;
    }
    r->pf = pf;
    snprintf(r->id, sizeof(r->id), "%s", q->request_id);
    snprintf(r->target, sizeof(r->target), "%s", q->target_decode_id);
    r->epoch = pf->epoch;
    r->reply_pending = true;
    r->n_prompt = proto_tokens_copy(&q->prompt, r->prompt, n);
    r->n_blocks = nb;
    r->sp = sp;
    r->lp_on = q->sampling.logprobs != 0;
    r->lp_top = q->sampling.top_logprobs;
    r->lease_ttl_ns = pf->cfg.lease_ttl_ns;
    r->lease.slot = UINT32_MAX;
    (void)kvx_blocks_alloc(pf->blocks, nb, r->blocks); /* checked above */
    r->blocks_held = true;
    r->job.run = pf_job_run;
    r->job.done = pf_job_done;
    r->state = PF_ST_NEW;
    r->t[PF_ST_NEW] = pd_now_ns();
    pf_req_link(pf, r);
    pd_stats_inc(pf->stats, PF_ST_accepted);
    pf_req_set_state(r, PF_ST_COMPUTING);
    st = eng_runner_submit(pf->runner, &r->job);
    if (st != PD_OK) { /* cannot happen below max_queue; answer anyway */
        pf_send_error(pf, r->id, PD_ERR_OVERLOADED, "compute queue: %s", pd_status_str(st));
        r->reply_pending = false;
        pf_req_set_state(r, PF_ST_FAILED);
    }
}

/* Stop a request wherever it is. Computing: discard when the job returns;
 * leased: revoke (on_lease_end -> CANCELED). */
static void pf_req_cancel(pf_t *pf, pf_req_t *r)
{
    if (r->state == PF_ST_COMPUTING) {
        atomic_store(&r->cancel, true);
    } else if (r->state == PF_ST_LEASED) {
        if (kvx_lease_revoke(pf->kvx, r->lease) != PD_OK && r->state == PF_ST_LEASED)
            pf_req_set_state(r, PF_ST_CANCELED);
    }
}

static void pf_on_cancel(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    pf_t *pf = arg;
    pf_req_t *r = pf_req_find(pf, msg->u.cancel.request_id);
    if (r != NULL)
        pf_req_cancel(pf, r);
}

static void pf_on_release(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    pf_t *pf = arg;
    pf_req_t *r = pf_req_find(pf, msg->u.release.request_id);
    if (r == NULL)
        return;
    uint64_t lid = (uint64_t)r->lease.slot << 32 | (r->lease.gen & 0xffffffffu);
    if (r->state == PF_ST_LEASED && msg->u.release.lease_id != 0 &&
        msg->u.release.lease_id != lid) {
        pd_log(PD_LOG_WARN, PF_COMP, r->id, "RELEASE with a foreign lease id ignored");
        return;
    }
    pf_req_cancel(pf, r);
}

static void pf_on_error(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    (void)arg;
    pd_log(PD_LOG_WARN, PF_COMP, msg->u.error.request_id[0] ? msg->u.error.request_id : NULL,
           "router error: %s: %s", pd_status_name(msg->u.error.status), msg->u.error.message);
}

/* ---- session ------------------------------------------------------------ */

static void pf_write_ready(pf_t *pf)
{
    if (pf->cfg.ready_file == NULL || pf->registered_once)
        return;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", pf->daemon_id);
    cJSON_AddStringToObject(j, "role", "prefill");
    cJSON_AddNumberToObject(j, "pid", (double)getpid());
    cJSON_AddStringToObject(j, "router", proto_session_router_id(pf->sess));
    if (pf->cfg.admin_socket)
        cJSON_AddStringToObject(j, "admin", pf->cfg.admin_socket);
    if (pf_metrics_port() != 0)
        cJSON_AddNumberToObject(j, "metrics", pf_metrics_port());
    char nid[32];
    snprintf(nid, sizeof(nid), "%016llx", (unsigned long long)kvx_ctx_node_id(pf->kvx));
    cJSON_AddStringToObject(j, "kv_node", nid);
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (txt == NULL)
        return;
    pf->registered_once = proto_boot_ready_write(pf->cfg.ready_file, txt, PF_COMP);
    free(txt);
}

static void pf_on_up(proto_session_t *s, const proto_register_ack_t *ack, void *arg)
{
    (void)s;
    pf_t *pf = arg;
    pf->epoch++;
    pd_log(PD_LOG_INFO, PF_COMP, NULL, "registered with router %s as %s (heartbeat %llu ms)",
           ack->daemon_id, pf->daemon_id,
           (unsigned long long)(ack->heartbeat_interval_ns / 1000000));
    pf_write_ready(pf);
}

static void pf_on_down(proto_session_t *s, pd_status_t why, void *arg)
{
    (void)s;
    pf_t *pf = arg;
    pf->epoch++;
    pd_log(PD_LOG_WARN, PF_COMP, NULL, "router lost (%s): canceling %u requests, reconnecting",
           pd_status_str(why), pf->n_live);
    pf_req_t *next;
    for (pf_req_t *r = pf->live; r != NULL; r = next) {
        next = r->next; /* revoke may free r (deferred) and unlink it */
        pf_req_cancel(pf, r);
    }
}

static void pf_on_reject(proto_session_t *s, pd_status_t status, const char *reason, void *arg)
{
    (void)s;
    (void)arg;
    pd_log(PD_LOG_ERROR, PF_COMP, NULL, "registration refused (%s): %s; retrying with backoff",
           pd_status_name(status), reason);
}

static void pf_fill_hb(proto_session_t *s, proto_heartbeat_t *hb, void *arg)
{
    (void)s;
    pf_t *pf = arg;
    kvx_gauges_t g;
    kvx_gauges(pf->kvx, &g);
    hb->flags = pf->draining ? PROTO_HB_DRAINING : 0;
    hb->queue_depth = pf->n_computing;
    hb->running_seqs = 0;
    hb->free_blocks = kvx_blocks_free_count(pf->blocks);
    hb->total_blocks = kvx_blocks_total(pf->blocks);
    hb->leases = g.leases_active;
    uint64_t tok = 0;
    for (pf_req_t *r = pf->live; r != NULL; r = r->next)
        if (r->state == PF_ST_COMPUTING)
            tok += r->n_prompt;
    hb->outstanding_prefill_tokens = tok;
}

/* ---- drain -------------------------------------------------------------- */

static void pf_stop_loop(void *arg)
{
    pf_t *pf = arg;
    pd_loop_stop(pf->loop);
}

static void pf_maybe_drained(pf_t *pf)
{
    if (pf->draining && !pf->stopping && pf->n_live == 0) {
        pd_log(PD_LOG_INFO, PF_COMP, NULL, "drained: flushing and exiting");
        pf->stopping = true;
        /* the last TOKENS/FINISH must reach the router before we exit */
        proto_session_shutdown(pf->sess, pf_stop_loop, pf);
    }
}

static void pf_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    pf_t *pf = arg;
    pd_log(PD_LOG_WARN, PF_COMP, NULL, "drain timeout: %u requests still live; exiting",
           pf->n_live);
    pf->stopping = true;
    pd_loop_stop(pf->loop);
}

static void pf_start_drain(pf_t *pf)
{
    if (pf->draining)
        return;
    pf->draining = true;
    pd_log(PD_LOG_INFO, PF_COMP, NULL, "draining: %u requests live", pf->n_live);
    proto_session_heartbeat_now(pf->sess);
    struct timeval tv = { (time_t)(pf->cfg.drain_timeout_ns / 1000000000ull),
                          (suseconds_t)(pf->cfg.drain_timeout_ns % 1000000000ull / 1000) };
    evtimer_add(pf->drain_ev, &tv);
    pf_maybe_drained(pf);
}

static void pf_on_sigterm(pd_loop_t *loop, void *arg)
{
    pf_t *pf = arg;
    if (pd_loop_drain_count(loop) > 1) {
        pf->stopping = true;
        pd_loop_stop(loop);
        return;
    }
    pf_start_drain(pf);
}

/* ---- admin -------------------------------------------------------------- */

static pd_status_t pf_adm_kv(pd_admin_req_t *req, cJSON *reply)
{
    pf_t *pf = req->arg;
    kvx_gauges_t g;
    kvx_gauges(pf->kvx, &g);
    uint32_t leased = 0;
    for (pf_req_t *r = pf->live; r != NULL; r = r->next)
        if (r->state == PF_ST_LEASED)
            leased += r->n_blocks;
    cJSON_AddNumberToObject(reply, "arena_bytes",
                            (double)kvx_region_block_bytes(pf->region) * kvx_region_n_blocks(pf->region));
    cJSON_AddNumberToObject(reply, "block_bytes", (double)kvx_region_block_bytes(pf->region));
    cJSON_AddNumberToObject(reply, "block_tokens", pf->geom->block_tokens);
    cJSON_AddNumberToObject(reply, "blocks_total", kvx_blocks_total(pf->blocks));
    cJSON_AddNumberToObject(reply, "free", kvx_blocks_free_count(pf->blocks));
    cJSON_AddNumberToObject(reply, "used", kvx_blocks_used(pf->blocks));
    cJSON_AddNumberToObject(reply, "leased", leased);
    cJSON_AddNumberToObject(reply, "blocks_pinned", (double)g.blocks_pinned);
    cJSON_AddNumberToObject(reply, "leases_active", g.leases_active);
    return PD_OK;
}

static pd_status_t pf_adm_leases(pd_admin_req_t *req, cJSON *reply)
{
    pf_t *pf = req->arg;
    cJSON *a = cJSON_AddArrayToObject(reply, "leases");
    uint64_t now = pd_now_ns();
    for (pf_req_t *r = pf->live; r != NULL; r = r->next) {
        if (r->state != PF_ST_LEASED)
            continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "request_id", r->id);
        cJSON_AddStringToObject(o, "decode", r->target);
        cJSON_AddNumberToObject(o, "blocks", r->n_blocks);
        uint64_t age = now - r->t[PF_ST_LEASED];
        cJSON_AddNumberToObject(o, "age_ms", (double)age / 1e6);
        cJSON_AddNumberToObject(o, "expires_in_ms",
                                age >= r->lease_ttl_ns ? 0.0 : (double)(r->lease_ttl_ns - age) / 1e6);
        cJSON_AddItemToArray(a, o);
    }
    return PD_OK;
}

static pd_status_t pf_adm_requests(pd_admin_req_t *req, cJSON *reply)
{
    pf_t *pf = req->arg;
    cJSON *a = cJSON_AddArrayToObject(reply, "requests");
    uint64_t now = pd_now_ns();
    for (pf_req_t *r = pf->live; r != NULL; r = r->next) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "request_id", r->id);
        cJSON_AddStringToObject(o, "state", pf_state_names[r->state]);
        cJSON_AddNumberToObject(o, "prompt_tokens", r->n_prompt);
        cJSON_AddNumberToObject(o, "age_ns", (double)(now - r->t[PF_ST_NEW]));
        if (r->state == PF_ST_LEASED) {
            cJSON_AddNumberToObject(o, "queue_ns", (double)(r->run_start_ns - r->t[PF_ST_COMPUTING]));
            cJSON_AddNumberToObject(o, "prefill_ns", (double)(r->run_end_ns - r->run_start_ns));
            cJSON_AddNumberToObject(o, "leased_ns", (double)(now - r->t[PF_ST_LEASED]));
        }
        cJSON_AddItemToArray(a, o);
    }
    cJSON *c = cJSON_AddObjectToObject(reply, "counters");
#define PF_X_CNT(name, kind, help) \
    if (PD_STAT_##kind == PD_STAT_COUNTER) \
        cJSON_AddNumberToObject(c, #name, (double)pd_stats_counter(pf->stats, PF_ST_##name));
    PF_STATS(PF_X_CNT)
#undef PF_X_CNT
    return PD_OK;
}

static pd_status_t pf_adm_drain(pd_admin_req_t *req, cJSON *reply)
{
    pf_t *pf = req->arg;
    pf_start_drain(pf);
    cJSON_AddBoolToObject(reply, "draining", 1);
    cJSON_AddNumberToObject(reply, "live", pf->n_live);
    return PD_OK;
}

static pd_status_t pf_adm_xfer(pd_admin_req_t *req, cJSON *reply)
{
    pf_t *pf = req->arg;
    cJSON *x = kvx_stats_json(pf->kvx);
    if (x == NULL)
        return PD_ERR_NO_MEMORY;
    cJSON_AddItemToObject(reply, "xfer", x);
    return PD_OK;
}

static pd_status_t pf_adm_session(pd_admin_req_t *req, cJSON *reply)
{
    pf_t *pf = req->arg;
    static const char *const names[] = { "down", "connecting", "hello_sent", "up" };
    cJSON_AddStringToObject(reply, "state", names[proto_session_state(pf->sess)]);
    cJSON_AddStringToObject(reply, "router_id", proto_session_router_id(pf->sess));
    cJSON_AddNumberToObject(reply, "registrations", (double)proto_session_registrations(pf->sess));
    cJSON_AddNumberToObject(reply, "rejects", (double)proto_session_rejects(pf->sess));
    cJSON_AddStringToObject(reply, "last_error", proto_session_last_error(pf->sess));
    cJSON_AddBoolToObject(reply, "draining", pf->draining);
    return PD_OK;
}

static const pd_admin_cmd_t pf_cmds[] = {
    { "kv", PD_ADMIN_USER, pf_adm_kv, "kv - arena and block counts" },
    { "leases", PD_ADMIN_USER, pf_adm_leases, "leases - KV leases held for decodes" },
    { "requests", PD_ADMIN_USER, pf_adm_requests, "requests - live requests and outcome counters" },
    { "xfer", PD_ADMIN_USER, pf_adm_xfer, "xfer - kvxfer statistics" },
    { "session", PD_ADMIN_USER, pf_adm_session, "session - router session state" },
    { "drain", PD_ADMIN_ADMIN, pf_adm_drain, "drain - stop admitting, exit when idle" },
    PD_ADMIN_CMD_END,
};

/* ---- boot ----------------------------------------------------------------- */

static int pf_fail(const char *what, pd_status_t st, const char *detail)
{
    pd_log(PD_LOG_ERROR, PF_COMP, NULL, "%s: %s%s%s", what, pd_status_str(st),
           detail && detail[0] ? ": " : "", detail ? detail : "");
    return 1;
}

int main(int argc, char **argv)
{
    static pf_t g;
    pf_t *pf = &g;
    pd_cfg_result_t res;
    pd_config_load_or_exit(&pf_schema, &pf->cfg, argc, argv, &res);
    int rc = 1;
    pd_status_t st;
    char err[256] = "";

    proto_boot_cfg_t bc = {
        .prog = "pd-prefill", .role = "prefill",
        .log_level = pf->cfg.log_level, .log_file = pf->cfg.log_file,
        .model = pf->cfg.model, .router = pf->cfg.router,
        .secret_file = pf->cfg.secret_file, .secret_hex = pf->cfg.secret,
        .insecure_no_auth = pf->cfg.insecure_no_auth, .id = pf->cfg.id,
    };
    if (proto_boot_daemon(&bc, &pf->secret, &pf->have_secret, pf->daemon_id) != PD_OK)
        goto usage;

    /* engine */
    eng_boot_opts_t eo = {
        .model = pf->cfg.model, .engine = pf->cfg.engine,
        .block_tokens = (uint32_t)pf->cfg.block_tokens,
        .kv_dtype = (eng_kv_dtype_t)pf->cfg.kv_dtype,
        .n_threads = (uint32_t)pf->cfg.threads, .max_batch = 1,
    };
    eng_boot_t eb;
    st = eng_boot_load(&eo, &eb, err, sizeof(err));
    if (st == PD_ERR_NOT_FOUND) {
        fprintf(stderr, "pd-prefill: --engine: %s\n", err);
        goto usage;
    }
    if (st != PD_OK)
        return pf_fail("model load", st, err);
    pf->ops = eb.ops;
    pf->model = eb.model;
    pf->geom = eb.geom;
    memcpy(pf->eos_ids, eb.eos_ids, sizeof(pf->eos_ids));
    pf->n_eos = eb.n_eos;
    if (eb.tok_err[0] != '\0')
        pd_log(PD_LOG_WARN, PF_COMP, NULL, "no tokenizer (%s): no EOS ids", eb.tok_err);
    pf->logits = malloc((size_t)pf->geom->vocab_size * sizeof(float));
    if (pf->logits == NULL || eng_sample_scratch_create(&pf->scratch, pf->geom->vocab_size) != PD_OK)
        return pf_fail("boot", PD_ERR_NO_MEMORY, NULL);

    st = pd_loop_create(&pf->loop);
    if (st != PD_OK)
        return pf_fail("event loop", st, NULL);
    struct event_base *base = pd_loop_base(pf->loop);

    /* kvxfer: node id = xxh64(daemon id), one region = the arena */
    kvx_config_t kc;
    kvx_config_default(&kc);
    kc.node_id = XXH64(pf->daemon_id, strlen(pf->daemon_id), 0);
    if (kc.node_id == 0)
        kc.node_id = 1;
    if (pf->have_secret)
        proto_auth_derive(&pf->secret, "pdserve kvx v1", kc.secret);
    kc.on_lease_end = pf_on_lease_end;
    kc.stats_role = KVX_STATS_EXPORTER; /* no pulls here: no pull counters in /metrics */
    kc.cb_arg = pf;
    kc.max_lease_ttl_ns = pf->cfg.lease_ttl_ns > kc.max_lease_ttl_ns ? pf->cfg.lease_ttl_ns
                                                                     : kc.max_lease_ttl_ns;
    pf->max_leases = kc.max_leases;
    pf->lease_slots = calloc(pf->max_leases, sizeof(*pf->lease_slots));
    if (pf->lease_slots == NULL)
        return pf_fail("boot", PD_ERR_NO_MEMORY, NULL);
    st = kvx_ctx_create(&kc, base, &pf->kvx);
    if (st != PD_OK)
        return pf_fail("kvxfer init", st, NULL);
    st = kvx_region_register(pf->kvx, 1, pf->geom->block_bytes, (uint32_t)pf->cfg.kv_blocks,
                             pf->geom->compat_hash, KVX_ALLOC_UCX, &pf->region);
    if (st != PD_OK)
        return pf_fail("KV arena registration", st, NULL);
    st = kvx_blocks_create(pf->region, (uint32_t)pf->cfg.kv_blocks, &pf->blocks);
    if (st != PD_OK)
        return pf_fail("block allocator", st, NULL);
    st = kvx_meta_pack(pf->kvx, pf->meta, sizeof(pf->meta), &pf->meta_len);
    if (st != PD_OK || pf->meta_len > PROTO_KV_ADDR_MAX)
        return pf_fail("kvx metadata", st != PD_OK ? st : PD_ERR_TOO_BIG, NULL);
    pf->incarnation = kvx_ctx_incarnation(pf->kvx);

    st = pd_stats_create(&pf_stats_table, (const char *[]){ "daemon", pf->daemon_id, NULL },
                         &pf->stats);
    if (st != PD_OK)
        return pf_fail("stats", st, NULL);
    st = eng_runner_create(pf->loop, 0, &pf->runner);
    if (st != PD_OK)
        return pf_fail("compute thread", st, NULL);
    pf->drain_ev = evtimer_new(base, pf_drain_timeout, pf);

    if (pf->cfg.admin_socket) {
        pd_admin_opts_t ao = { .path = pf->cfg.admin_socket, .prog = "pd-prefill",
                               .cfg_schema = &pf_schema, .cfg_target = &pf->cfg };
        st = pd_admin_create(pf->loop, &ao, &pf->admin);
        if (st != PD_OK)
            return pf_fail("admin socket", st, pf->cfg.admin_socket);
        pd_admin_register(pf->admin, pf_cmds, pf);
        pd_admin_add_stats(pf->admin, pf->stats);
    }
    st = pf_metrics_start(pf);
    if (st != PD_OK)
        return pf_fail("metrics.listen", st, pf->cfg.metrics_listen);

    proto_session_opts_t so;
    memset(&so, 0, sizeof(so));
    so.router_addr = pf->cfg.router;
    so.secret = pf->have_secret ? &pf->secret : NULL;
    so.hello.role = PROTO_ROLE_PREFILL;
    so.hello.caps = PROTO_CAP_PREFILL | PROTO_CAP_KV_EXPORT;
    snprintf(so.hello.daemon_id, sizeof(so.hello.daemon_id), "%s", pf->daemon_id);
    so.hello.incarnation = pf->incarnation;
    so.hello.compat_hash = pf->geom->compat_hash;
    so.hello.geom = (proto_kv_geom_t){
        .n_layers = pf->geom->n_layers, .n_kv_heads = pf->geom->n_kv_heads,
        .head_dim = pf->geom->head_dim, .block_tokens = pf->geom->block_tokens,
        .kv_dtype = (uint32_t)pf->geom->kv_dtype, .total_blocks = (uint32_t)pf->cfg.kv_blocks,
        .block_bytes = pf->geom->block_bytes, .context_length = pf->geom->context_length,
        .vocab_size = pf->geom->vocab_size,
    };
    so.hello.kv_addr.p = pf->meta;
    so.hello.kv_addr.len = (uint32_t)pf->meta_len;
    so.heartbeat_interval_ns = pf->cfg.heartbeat_ns;
    so.backoff_min_ns = pf->cfg.reconnect_min_ns;
    so.cbs.on_prefill_req = pf_on_prefill_req;
    so.cbs.on_cancel = pf_on_cancel;
    so.cbs.on_release = pf_on_release;
    so.cbs.on_error = pf_on_error;
    so.on_up = pf_on_up;
    so.on_down = pf_on_down;
    so.on_reject = pf_on_reject;
    so.fill_heartbeat = pf_fill_hb;
    so.arg = pf;
    so.stats = &pf->pstats;
    st = proto_session_create(base, &so, &pf->sess);
    if (st != PD_OK) {
        fprintf(stderr, "pd-prefill: --router: bad address \"%s\"\n", pf->cfg.router);
        return 2;
    }
    if (!pf->have_secret)
        pd_log(PD_LOG_WARN, PF_COMP, NULL,
               "RUNNING WITHOUT AUTHENTICATION (--insecure-no-auth): loopback only");
    pd_loop_on_drain(pf->loop, pf_on_sigterm, pf);
    pd_log(PD_LOG_INFO, PF_COMP, NULL,
           "%s up: model %s (%s), %llu blocks x %llu bytes (%u tokens), router %s",
           pf->daemon_id, pf->cfg.model, eb.engine, (unsigned long long)pf->cfg.kv_blocks,
           (unsigned long long)pf->geom->block_bytes, pf->geom->block_tokens, pf->cfg.router);

    st = pd_loop_run(pf->loop);
    rc = st == PD_OK ? 0 : 1;

    /* teardown: no replies from here on */
    pf->stopping = true;
    proto_session_destroy(pf->sess);
    pf->sess = NULL;
    eng_runner_destroy(pf->runner);          /* done() -> CANCELED, blocks freed */
    pf_req_t *next;
    for (pf_req_t *r = pf->live; r != NULL; r = next) {
        next = r->next;
        pf_req_cancel(pf, r);                 /* leased: revoke -> CANCELED */
    }
    if (pf->admin) {
        pd_admin_remove_stats(pf->admin, pf->stats);
        pd_admin_destroy(pf->admin);
    }
    pf_metrics_stop();
    kvx_blocks_destroy(pf->blocks);
    kvx_ctx_destroy(pf->kvx);                /* worker first, then the region */
    pf->region = NULL;
    event_free(pf->drain_ev);
    pd_loop_destroy(pf->loop);               /* runs the deferred frees */
    pd_stats_destroy(pf->stats);
    pf->ops->destroy(pf->model);
    eng_sample_scratch_destroy(&pf->scratch);
    free(pf->logits);
    free(pf->lease_slots);
    proto_auth_secret_wipe(&pf->secret);
    if (pf->cfg.ready_file)
        unlink(pf->cfg.ready_file);
    pd_config_free(&pf_schema, &pf->cfg);
    pd_config_result_free(&res);
    pd_log_close();
    return rc;
usage:
    proto_auth_secret_wipe(&pf->secret);
    pd_config_free(&pf_schema, &pf->cfg);
    pd_config_result_free(&res);
    pd_log_close();
    return 2;
}
