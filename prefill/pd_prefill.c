/* pd_prefill.c - the pd-prefill daemon's own part (see prefill/README.md and DESIGN.md,
 * pf.h and the flow spec in proto/PROTOCOL.md "Flows"): admission, the
 * prompt pass into the arena + token 0, export under a lease, lease end.
 * Boot, session, drain, the common admin commands: node/.
 *
 * Loop thread: admission, kvx (export/leases), admin.
 * Compute thread (eng_runner): prompt pass into the arena + token 0. */
#include "pf.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "pd_log.h"
#include "pd_time.h"

#define PF_COMP "prefill"

static const char *const pf_kv_streams[] = { "layer", "whole", NULL };
/* eng_pooling_t order */
static const char *const pf_poolings[] = { "none", "mean", "cls", "last", NULL };

static const pd_cfg_field_t pf_fields[] = {
    NODE_HEAD_ROWS(pf_config_t, "daemon id (default prefill-<pid>)")
    PD_CFG_ROW(pf_config_t, max_queue, "max-queue", UINT, "64", "requests queued or computing before OVERLOADED", 1, 1e6, NULL),
    PD_CFG_ROW(pf_config_t, lease_ttl_ns, "lease-ttl", DURATION, "30s", "KV lease length after PREFILL_DONE", 1e6, 600e9, NULL),
    PD_CFG_ROW(pf_config_t, max_prompt_tokens, "max-prompt-tokens", UINT, "1048576", "longest prompt accepted", 1, 1048576, NULL),
    PD_CFG_ROW(pf_config_t, src_pull_timeout_ns, "src-pull-timeout", DURATION, "2s", "deadline of a pull from a decode's cached prefix (then computed here)", 1e6, 600e9, NULL),
    PD_CFG_ROW(pf_config_t, kv_stream, "kv-stream", ENUM, "layer", "layer (default): export the KV lease at admission and publish each layer as it is computed (the decode pulls layer by layer); whole: export after the whole prompt pass", 0, 0, pf_kv_streams),
    PD_CFG_ROW(pf_config_t, embed_pooling, "embeddings.pooling", ENUM, "none", "pooling of /v1/embeddings (EMBED_REQ) when the GGUF has no <arch>.pooling_type: mean, cls, last; none refuses embeddings for such a model", 0, 0, pf_poolings),
    PD_CFG_ROW(pf_config_t, embed_batch_tokens, "embeddings.batch-tokens", UINT, "2048", "EMBED_REQs waiting for the compute thread run as one batch (their rows share forward passes) up to this many prompt tokens; 1: one at a time", 1, 1048576, NULL),
    NODE_TAIL_ROWS(pf_config_t)
    PD_CFG_END,
};

static const pd_cfg_schema_t pf_schema = {
    .prog = "pd-prefill",
    .summary = "pd-prefill [--config FILE] [--key=value ...]: prefill daemon (prompt pass, KV export)",
    .fields = pf_fields,
    .check = node_check_config, /* node_config_t is the first member */
};

static const char *const pf_state_names[] = { PF_STATES(NODE_STATE_NAME) };

static pf_req_t *pf_req_find(pf_t *pf, const node_link_t *from, const char *id)
{
    node_req_t *n = node_req_find(&pf->n, from, id);
    return n != NULL ? NODE_REQ(n, pf_req_t) : NULL;
}

static void pf_req_free(void *obj)
{
    pf_req_t *r = obj;
    free(r->prompt);
    free(r->nr.blocks);
    free(r->vec);
    node_gram_end(&r->gram);
    free(r);
}

/* ---- the one state setter ------------------------------------------------ */

static bool pf_transition_ok(const pf_req_t *r, pf_state_t from, pf_state_t to)
{
    if (r->embed && from == PF_ST_COMPUTING && to == PF_ST_COMPLETED)
        return true; /* an embedding: no lease */
    switch (from) {
    case PF_ST_NEW:       return to == PF_ST_COMPUTING || to == PF_ST_PULLING;
    case PF_ST_PULLING:   return to == PF_ST_COMPUTING || to == PF_ST_FAILED ||
                                 to == PF_ST_CANCELED;
    case PF_ST_COMPUTING: return to == PF_ST_LEASED || to == PF_ST_FAILED ||
                                 to == PF_ST_CANCELED;
    case PF_ST_LEASED:    return to == PF_ST_COMPLETED || to == PF_ST_FAILED ||
                                 to == PF_ST_CANCELED;
    default:              return false;
    }
}

/* Assert the transition, stamp the time, keep gauges; on a terminal state
 * free the blocks (the lease is over by then), count the outcome, unlink
 * and defer the free. */
static void pf_req_set_state(pf_req_t *r, pf_state_t to)
{
    pf_t *pf = r->pf;
    assert(pf_transition_ok(r, r->state, to));
    if (!pf_transition_ok(r, r->state, to)) {
        pd_log(PD_LOG_ERROR, PF_COMP, r->nr.id, "illegal state change %s -> %s",
               pf_state_names[r->state], pf_state_names[to]);
        return;
    }
    pf_state_t from = r->state;
    uint64_t now = pd_now_ns();
    r->state = to;
    r->t[to] = now;
    if (from == PF_ST_COMPUTING) {
        pd_stats_gauge_set(pf->n.stats, PF_STAT_computing, --pf->n_computing);
        /* idle again: tell the router now, not at the next heartbeat; its
         * KV-aware choice weighs a daemon's queue against its cached
         * prefix, and a stale queue sends the next request elsewhere */
        if (pf->n_computing == 0 && !pf->n.stopping)
            node_heartbeat_now(&pf->n);
    }
    if (to == PF_ST_COMPUTING)
        pd_stats_gauge_set(pf->n.stats, PF_STAT_computing, ++pf->n_computing);
    if (to == PF_ST_LEASED)
        pd_stats_gauge_add(pf->n.stats, PF_STAT_leased, 1);
    if (from == PF_ST_LEASED) {
        pd_stats_gauge_add(pf->n.stats, PF_STAT_leased, -1);
        pd_stats_observe_ns(pf->n.stats, PF_STAT_lease_time, now - r->t[PF_ST_LEASED]);
    }
    if (to != PF_ST_COMPLETED && to != PF_ST_FAILED && to != PF_ST_CANCELED)
        return;
    assert(!r->pull_live);
    if (r->src_imported) { /* the decode gets its blocks back */
        (void)kvx_lease_release(pf->n.kvx, &r->src_imp);
        r->src_imported = false;
    }
    pd_stats_inc(pf->n.stats, to == PF_ST_COMPLETED ? PF_STAT_completed
                          : to == PF_ST_FAILED ? PF_STAT_failed : PF_STAT_canceled);
    node_req_retire(&pf->n, &r->nr, pf_req_free, r);
    node_maybe_drained(&pf->n);
}

/* A request's one answer (PREFILL_DONE or ERROR), only to the router
 * session it came from. */
static bool pf_can_reply(pf_t *pf, pf_req_t *r)
{
    return r->reply_pending && node_req_can_reply(&pf->n, &r->nr);
}

/* ---- compute thread ----------------------------------------------------- */

/* Compute thread: layer `layer` of positions [0, pos_end) is in the arena:
 * publish its complete blocks (all of them once the prompt is done). */
static void pf_layer_hook(void *arg, uint32_t layer, uint32_t pos_end)
{
    pf_req_t *r = arg;
    uint32_t blocks = pos_end >= r->n_prompt ? r->nr.n_blocks
                                             : pos_end / r->pf->n.geom->block_tokens;
    kvx_ready_publish(&r->ready, layer, blocks);
    if (layer == 0 && r->layer0_ns == 0)
        r->layer0_ns = pd_now_ns();
    if (pos_end >= r->n_prompt)
        r->layer_last_ns = pd_now_ns();
}

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
    /* KV of [0, n_cached) is already in the first (cached, read-only) blocks */
    if (r->early)
        pf->n.ops->set_layer_hook(pf->n.model, pf_layer_hook, r);
    pd_status_t st = pf->n.ops->prefill(pf->n.model, kvx_region_base(pf->n.region), r->nr.blocks,
                                      r->nr.n_blocks, r->prompt + r->n_cached,
                                      r->n_prompt - r->n_cached, r->n_cached, pf->logits);
    if (r->early)
        pf->n.ops->set_layer_hook(pf->n.model, NULL, NULL);
    if (st == PD_OK) {
        eng_sampler_t s;
        eng_sampler_init(&s, &r->sp);
        eng_sample_hist_t hist = { r->prompt, r->n_prompt, NULL, 0 };
        r->token0 = node_sample(&pf->n, &r->gram, &s, pf->logits, &hist,
                                r->sp.max_tokens ? r->sp.max_tokens : UINT32_MAX, r->lp_top,
                                r->lp_on ? &r->lp0 : NULL);
        if (r->token0 < 0)
            st = PD_ERR_INTERNAL;
    }
    r->cstatus = st;
    r->run_end_ns = pd_now_ns();
}

/* ---- loop: compute done -> export -> PREFILL_DONE ------------------------ */

/* End a request whose job is done in state `to`. An early lease still live
 * is revoked first: the request ends when its on_lease_end comes (the blocks
 * are unpinned by then). */
static void pf_req_end(pf_t *pf, pf_req_t *r, pf_state_t to)
{
    if (r->early && !r->lease_over) {
        r->final = to;
        if (kvx_lease_revoke(pf->n.kvx, r->lease) == PD_OK)
            return;
        r->lease_over = true;
    }
    pf_req_set_state(r, to);
}

/* A prompt-pass job is back on the loop (done or aborted at shutdown):
 * its queue time, and an aborted one's status. */
static void pf_job_back(pf_t *pf, pf_req_t *r, const eng_job_t *job)
{
    r->job_done = true;
    if (job->aborted) {
        r->cstatus = PD_ERR_SHUTDOWN;
        r->run_start_ns = r->run_end_ns = pd_now_ns();
    }
    pd_stats_observe_ns(pf->n.stats, PF_STAT_queue_time, r->run_start_ns - r->t[PF_ST_COMPUTING]);
}

static void pf_job_done(eng_job_t *job)
{
    pf_req_t *r = (pf_req_t *)job;
    pf_t *pf = r->pf;
    pf_job_back(pf, r, job);
    if (atomic_load(&r->cancel) || pf->n.stopping) {
        if (pf_can_reply(pf, r) && !pf->n.stopping)
            node_send_error(&pf->n, r->nr.link, r->nr.id, PD_ERR_CANCELED, "canceled");
        r->reply_pending = false;
        pf_req_end(pf, r, PF_ST_CANCELED);
        return;
    }
    if (r->cstatus != PD_OK) {
        pd_log(PD_LOG_WARN, PF_COMP, r->nr.id, "prefill failed: %s", pd_status_str(r->cstatus));
        if (pf_can_reply(pf, r))
            node_send_error(&pf->n, r->nr.link, r->nr.id, r->cstatus, "prefill: %s", pd_status_str(r->cstatus));
        r->reply_pending = false;
        pf_req_end(pf, r, PF_ST_FAILED);
        return;
    }
    pd_stats_observe_ns(pf->n.stats, PF_STAT_prefill_time, r->run_end_ns - r->run_start_ns);
    pd_stats_add(pf->n.stats, PF_STAT_prompt_tokens, r->n_prompt);
    pd_stats_add(pf->n.stats, PF_STAT_cached_tokens, r->n_cached - r->n_pulled);
    pd_stats_add(pf->n.stats, PF_STAT_computed_tokens, r->n_prompt - r->n_cached);
    pd_stats_add(pf->n.stats, PF_STAT_saved_bytes, (uint64_t)r->n_own * pf->n.geom->block_bytes);
    if (pf->n.prefix != NULL) /* the prompt's full blocks become shareable */
        (void)kvx_prefix_insert(pf->n.prefix, r->partition, r->prompt, r->n_prompt,
                                r->nr.blocks, r->nr.n_blocks, NULL);
    if (!pf_can_reply(pf, r)) { /* the router that asked is gone */
        pf_req_end(pf, r, PF_ST_CANCELED);
        return;
    }
    pd_status_t st = PD_OK;
    if (r->early) {
        /* exported at admission with kvx's maximum TTL (the prompt pass may
         * be long and the router may wait for PREFILL_DONE): from now it
         * lasts lease-ttl, as for a whole export. It may have ended since
         * (the decode released it, a revoke). */
        if (r->lease_over || kvx_lease_set_ttl(pf->n.kvx, r->lease, r->lease_ttl_ns) != PD_OK) {
            pd_log(PD_LOG_WARN, PF_COMP, r->nr.id, "lease ended during the prompt pass");
            node_send_error(&pf->n, r->nr.link, r->nr.id, PD_ERR_EXPIRED, "kv lease ended during prefill");
            r->reply_pending = false;
            pf_req_end(pf, r, PF_ST_FAILED);
            return;
        }
    } else {
        st = node_export(&pf->n, &r->nr, r->target, r->nr.blocks, r->nr.n_blocks,
                         r->lease_ttl_ns, r->handle, sizeof(r->handle), &r->hlen, &r->lease);
    }
    if (st != PD_OK) {
        pd_log(PD_LOG_WARN, PF_COMP, r->nr.id, "export: %s", pd_status_str(st));
        node_send_error(&pf->n, r->nr.link, r->nr.id, st == PD_ERR_NO_SPACE ? PD_ERR_OVERLOADED : st,
                      "kv export: %s", pd_status_str(st));
        pf_req_set_state(r, PF_ST_FAILED);
        return;
    }
    pf_req_set_state(r, PF_ST_LEASED);
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_PREFILL_DONE;
    proto_prefill_done_t *d = &m.u.prefill_done;
    snprintf(d->request_id, sizeof(d->request_id), "%s", r->nr.id);
    d->first_token = r->token0;
    d->n_prompt_tokens = r->n_prompt;
    d->lease_id = node_lease_wire_id(r->lease);
    d->lease_ns = r->lease_ttl_ns; /* from now, early or not */
    d->kv_handle.p = r->handle;
    d->kv_handle.len = (uint32_t)r->hlen;
    d->queue_ns = r->run_start_ns - r->t[PF_ST_COMPUTING];
    d->prefill_ns = r->run_end_ns - r->run_start_ns;
    d->cached_tokens = r->n_cached;
    proto_logprob_t lp0;
    if (r->lp_on) {
        _Static_assert(ENG_SAMPLE_MAX_TOP_LOGPROBS == PROTO_MAX_TOP_LOGPROBS, "top logprobs");
        lp0.logprob = r->lp0.logprob;
        memcpy(lp0.top_ids, r->lp0.top_ids, sizeof(lp0.top_ids));
        memcpy(lp0.top_lp, r->lp0.top_lp, sizeof(lp0.top_lp));
        d->logprobs = (proto_logprobs_t){ r->lp0.n_top, 1, &lp0, NULL };
    }
    r->reply_pending = false;
    st = node_req_send(&pf->n, &r->nr, &m);
    if (r->early && pd_log_get_level() >= PD_LOG_DEBUG) {
        /* where the streamed prompt pass went (ms since compute start) */
        uint64_t now = pd_now_ns(), t0 = r->run_start_ns;
        pd_log(PD_LOG_DEBUG, PF_COMP, r->nr.id,
               "timeline ms: queued %.1f, layer 0 %.1f, last layer %.1f, done %.1f, "
               "PREFILL_DONE %.1f",
               (double)(t0 - r->t[PF_ST_COMPUTING]) / 1e6,
               r->layer0_ns ? (double)(r->layer0_ns - t0) / 1e6 : -1.0,
               r->layer_last_ns ? (double)(r->layer_last_ns - t0) / 1e6 : -1.0,
               (double)(r->run_end_ns - t0) / 1e6, (double)(now - t0) / 1e6);
    }
    if (st != PD_OK) {
        pd_log(PD_LOG_WARN, PF_COMP, r->nr.id, "PREFILL_DONE not sent: %s; revoking",
               pd_status_str(st));
        (void)kvx_lease_revoke(pf->n.kvx, r->lease); /* -> CANCELED */
    }
}

static void pf_on_lease_end(node_t *n, node_req_t *nr, kvx_lease_end_t why)
{
    (void)n;
    pf_req_t *r = NODE_REQ(nr, pf_req_t);
    if (r->early && r->state == PF_ST_COMPUTING) {
        /* an early lease ended (released, expired, revoked) before or while
         * the job ran: the blocks stay until the job is done */
        r->lease_over = true;
        if (r->job_done)
            pf_req_set_state(r, r->final);
        return;
    }
    if (r->state != PF_ST_LEASED) {
        pd_log(PD_LOG_ERROR, PF_COMP, r->nr.id, "lease end in state %s", pf_state_names[r->state]);
        return;
    }
    pf_req_set_state(r, why == KVX_LEASE_RELEASED ? PF_ST_COMPLETED
                      : why == KVX_LEASE_EXPIRED ? PF_ST_FAILED : PF_ST_CANCELED);
}

/* ---- loop: messages ----------------------------------------------------- */

/* The prompt's blocks: the longest cached prefix (never the whole prompt:
 * the last token is computed for its logits), then fresh blocks, evicting
 * unused cached ones when short. All or nothing. */
static pd_status_t pf_take_blocks(pf_t *pf, pf_req_t *r, uint32_t nb)
{
    uint32_t m = 0;
    if (pf->n.prefix != NULL)
        m = kvx_prefix_match(pf->n.prefix, r->partition, r->prompt, r->n_prompt - 1,
                             r->nr.blocks, nb);
    pd_status_t st = pf->n.prefix != NULL
                         ? kvx_prefix_alloc(pf->n.prefix, nb - m, r->nr.blocks + m)
                         : kvx_blocks_alloc(pf->n.blocks, nb - m, r->nr.blocks + m);
    if (st != PD_OK) {
        (void)kvx_blocks_unref(pf->n.blocks, r->nr.blocks, m, NULL); /* the cache keeps them */
        return PD_ERR_NO_KV_SPACE;
    }
    r->nr.n_blocks = nb;
    r->nr.blocks_held = true;
    r->n_own = m;
    r->n_cached = m * pf->n.geom->block_tokens;
    return PD_OK;
}

/* kv-stream=layer: the streamed lease goes to the router now (PREFILL_HANDLE)
 * so that the decode can pull each layer while the prompt pass runs; the
 * router may also ignore it and hand the same lease on with PREFILL_DONE.
 * Not an answer: PREFILL_DONE or ERROR still follows. Best effort. */
static void pf_send_handle(pf_t *pf, pf_req_t *r)
{
    if (!pf_can_reply(pf, r))
        return;
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_PREFILL_HANDLE;
    proto_prefill_handle_t *h = &m.u.prefill_handle;
    snprintf(h->request_id, sizeof(h->request_id), "%s", r->nr.id);
    h->n_prompt_tokens = r->n_prompt;
    h->lease_id = node_lease_wire_id(r->lease);
    h->lease_ns = r->lease_ttl_ns;
    h->kv_handle.p = r->handle;
    h->kv_handle.len = (uint32_t)r->hlen;
    pd_status_t st = node_req_send(&pf->n, &r->nr, &m);
    if (st == PD_OK)
        pd_stats_inc(pf->n.stats, PF_STAT_early_handles);
    else
        pd_log(PD_LOG_WARN, PF_COMP, r->nr.id, "PREFILL_HANDLE not sent: %s", pd_status_str(st));
}

/* To the compute thread (from NEW or PULLING). */
static void pf_compute_start(pf_t *pf, pf_req_t *r)
{
    pd_status_t st;
    if (pf->cfg.kv_stream == PF_KV_STREAM_LAYER) {
        /* the lease now, before compute: cached (and pulled) blocks are
         * ready at once, the rest layer by layer (pf_layer_hook). Its TTL
         * covers the prompt pass however long (kvx caps it at its maximum)
         * and becomes lease-ttl at PREFILL_DONE (pf_job_done); a request
         * that ends before that revokes it (pf_req_end) */
        st = node_export_stream(&pf->n, &r->nr, r->target, r->nr.blocks, r->nr.n_blocks,
                                UINT64_MAX, r->n_cached / pf->n.geom->block_tokens,
                                r->handle, sizeof(r->handle), &r->hlen, &r->lease, &r->ready);
        if (st != PD_OK) {
            pd_log(PD_LOG_WARN, PF_COMP, r->nr.id, "export: %s", pd_status_str(st));
            if (pf_can_reply(pf, r))
                node_send_error(&pf->n, r->nr.link, r->nr.id,
                                st == PD_ERR_NO_SPACE ? PD_ERR_OVERLOADED : st, "kv export: %s",
                                pd_status_str(st));
            r->reply_pending = false;
            if (r->state != PF_ST_COMPUTING)
                pf_req_set_state(r, PF_ST_COMPUTING); /* to a terminal state from here */
            pf_req_set_state(r, PF_ST_FAILED);
            return;
        }
        r->early = true;
        pf_send_handle(pf, r);
    }
    pf_req_set_state(r, PF_ST_COMPUTING);
    st = eng_runner_submit(pf->n.runner, &r->job);
    if (st != PD_OK) { /* cannot happen below max_queue; answer anyway */
        if (pf_can_reply(pf, r))
            node_send_error(&pf->n, r->nr.link, r->nr.id, PD_ERR_OVERLOADED, "compute queue: %s",
                            pd_status_str(st));
        r->reply_pending = false;
        r->job_done = true;
        pf_req_end(pf, r, PF_ST_FAILED);
    }
}

/* The decode's lease is not needed any more: it gets its blocks back. */
static void pf_src_release(pf_t *pf, pf_req_t *r)
{
    if (r->src_imported) {
        (void)kvx_lease_release(pf->n.kvx, &r->src_imp);
        r->src_imported = false;
    }
}

static void pf_src_pull_done(void *arg, pd_status_t status, const kvx_pull_result_t *res)
{
    pf_req_t *r = arg;
    pf_t *pf = r->pf;
    uint32_t bt = pf->n.geom->block_tokens;
    r->pull_live = false;
    r->pull_ns = res != NULL ? res->latency_ns : pd_now_ns() - r->t[PF_ST_PULLING];
    pd_stats_observe_ns(pf->n.stats, PF_STAT_src_pull_time, r->pull_ns);
    if (status == PD_OK) {
        uint32_t nb = r->src_imp.h.n_blocks;
        r->n_pulled = (nb - r->n_own) * bt;
        r->n_cached = nb * bt;
        pd_stats_inc(pf->n.stats, PF_STAT_src_pulls_ok);
        pd_stats_add(pf->n.stats, PF_STAT_src_pulled_tokens, r->n_pulled);
        pd_stats_add(pf->n.stats, PF_STAT_src_pulled_bytes, res != NULL ? res->bytes : 0);
        pd_log(PD_LOG_DEBUG, PF_COMP, r->nr.id, "pulled %u prompt tokens from %s in %.3f ms",
               r->n_pulled, r->src_peer, (double)r->pull_ns / 1e6);
    } else if (status != PD_ERR_CANCELED && status != PD_ERR_SHUTDOWN) {
        /* the blocks we pulled into hold garbage: computed over below */
        pd_stats_inc(pf->n.stats, PF_STAT_src_pulls_failed);
        pd_log(PD_LOG_WARN, PF_COMP, r->nr.id, "pull from %s's cache failed (%s): computing",
               r->src_peer, pd_status_str(status));
    }
    pf_src_release(pf, r);
    if (atomic_load(&r->cancel) || pf->n.stopping) {
        if (pf_can_reply(pf, r) && !pf->n.stopping)
            node_send_error(&pf->n, r->nr.link, r->nr.id, PD_ERR_CANCELED, "canceled");
        r->reply_pending = false;
        pf_req_set_state(r, PF_ST_CANCELED);
        return;
    }
    pf_compute_start(pf, r);
}

/* PREFILL_REQ named a decode's cached prefix (q's source tail): pull the
 * blocks of it we do not hold ourselves (KVX_PULL_SKIP for ours) into our
 * fresh blocks, with a deadline. true: PULLING (pf_src_pull_done goes on);
 * false: nothing to pull or the source is unusable: compute now. Never
 * fails the request. */
static bool pf_src_start(pf_t *pf, pf_req_t *r, const proto_prefill_req_t *q)
{
    uint32_t bt = pf->n.geom->block_tokens;
    snprintf(r->src_peer, sizeof(r->src_peer), "%s", q->src_peer_id);
    kvx_reject_t why = 0;
    pd_status_t st = node_import(&pf->n, q->src_handle.p, q->src_handle.len, &r->src_imp, &why);
    if (st != PD_OK) {
        pd_stats_inc(pf->n.stats, PF_STAT_src_pulls_failed);
        pd_log(PD_LOG_WARN, PF_COMP, r->nr.id, "KV handle from %s rejected: %s (%s): computing",
               r->src_peer, pd_status_str(st), kvx_reject_name(why));
        return false;
    }
    r->src_imported = true;
    uint32_t nb = r->src_imp.h.n_blocks;
    /* whole blocks of the prompt, never its last token (proto checked
     * src_kv_tokens < prompt; the handle must agree) */
    if ((uint64_t)nb * bt != q->src_kv_tokens || nb > (r->n_prompt - 1) / bt ||
        pf->n.prefix == NULL) {
        if (pf->n.prefix != NULL) {
            pd_stats_inc(pf->n.stats, PF_STAT_src_pulls_failed);
            pd_log(PD_LOG_WARN, PF_COMP, r->nr.id, "source from %s: %u blocks for %u tokens: "
                   "computing", r->src_peer, nb, q->src_kv_tokens);
        }
        pf_src_release(pf, r);
        return false;
    }
    if (nb <= r->n_own) { /* our own cache holds as much */
        pd_stats_inc(pf->n.stats, PF_STAT_src_skipped);
        pf_src_release(pf, r);
        return false;
    }
    uint64_t budget = pf->cfg.src_pull_timeout_ns;
    if (q->deadline_ns != 0 && q->deadline_ns < budget)
        budget = q->deadline_ns;
    pf_req_set_state(r, PF_ST_PULLING);
    st = node_pull_start(&pf->n, &r->src_imp, r->nr.blocks, nb, r->n_own, budget,
                         pf_src_pull_done, r, &r->pull_id);
    if (st != PD_INPROGRESS) {
        pd_stats_inc(pf->n.stats, PF_STAT_src_pulls_failed);
        pd_log(PD_LOG_WARN, PF_COMP, r->nr.id, "pull from %s not started (%s): computing",
               r->src_peer, pd_status_str(st));
        pf_src_release(pf, r);
        pf_compute_start(pf, r);
        return true;
    }
    r->pull_live = true;
    return true;
}

static void pf_on_prefill_req(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    pf_t *pf = PD_CONTAINER_OF(node, pf_t, n);
    const proto_prefill_req_t *q = &msg->u.prefill_req;
    pd_status_t st = PD_OK;
    const char *why = "";
    uint32_t n = q->prompt.n;
    if (pf->n.draining || pf->n.stopping) {
        st = PD_ERR_SHUTDOWN; why = "draining";
    } else if (pf_req_find(pf, from, q->request_id) != NULL) {
        st = PD_ERR_EXISTS; why = "request id already live";
    } else if (n == 0) {
        st = PD_ERR_BAD_INPUT; why = "empty prompt";
    } else if (n > pf->cfg.max_prompt_tokens || n >= pf->n.geom->context_length) {
        st = PD_ERR_TOO_BIG; why = "prompt too long";
    } else if (q->target_decode_id[0] == '\0') {
        st = PD_ERR_BAD_INPUT; why = "no target decode id";
    } else if (pf->n_computing >= pf->cfg.max_queue) {
        st = PD_ERR_OVERLOADED; why = "queue full";
    }
    for (uint32_t i = 0; st == PD_OK && i < n; i++)
        if ((uint32_t)proto_tokens_get(&q->prompt, i) >= pf->n.geom->vocab_size) {
            st = PD_ERR_BAD_INPUT; why = "token id out of range";
        }
    eng_sample_params_t sp;
    if (st == PD_OK && node_sampling(&pf->n, &q->sampling, &sp) != PD_OK) {
        st = PD_ERR_BAD_INPUT; why = "bad sampling parameters";
    }
    uint32_t nb = (n + pf->n.geom->block_tokens - 1) / pf->n.geom->block_tokens;
    node_gram_t gram = { NULL, NULL };
    if (st == PD_OK) { /* KV room: pf_take_blocks (cached prefix + new blocks) */
        pd_status_t gs = node_gram_start(&pf->n, &q->sampling, &gram);
        if (gs != PD_OK) {
            st = gs; why = gs == PD_ERR_NO_MEMORY ? "out of memory"
                                                  : "response_format grammar refused";
        }
    }
    pf_req_t *r = NULL;
    if (st == PD_OK) {
        r = calloc(1, sizeof(*r));
        if (r != NULL)
            r->gram = gram; /* owned by r from here, freed with it */
        else
            node_gram_end(&gram);
        if (r == NULL || (r->prompt = malloc((size_t)n * sizeof(int32_t))) == NULL ||
            (r->nr.blocks = malloc((size_t)nb * sizeof(uint32_t))) == NULL) {
            if (r)
                pf_req_free(r);
            r = NULL;
            st = PD_ERR_NO_MEMORY; why = "out of memory";
        }
    }
    if (st == PD_OK) {
        r->n_prompt = proto_tokens_copy(&q->prompt, r->prompt, n);
        r->partition = q->cache_partition;
        st = pf_take_blocks(pf, r, nb);
        if (st != PD_OK) {
            why = "no free KV blocks";
            pf_req_free(r);
            r = NULL;
        }
    }
    if (st != PD_OK) {
        pd_stats_inc(pf->n.stats, PF_STAT_rejected);
        pd_log(PD_LOG_DEBUG, PF_COMP, q->request_id, "rejected: %s", why);
        node_send_error(&pf->n, from, q->request_id, st, "%s", why);
        return;
    }
    r->pf = pf;
    snprintf(r->nr.id, sizeof(r->nr.id), "%s", q->request_id);
    snprintf(r->target, sizeof(r->target), "%s", q->target_decode_id);
    r->reply_pending = true;
    r->sp = sp;
    r->lp_on = q->sampling.logprobs != 0;
    r->lp_top = q->sampling.top_logprobs;
    r->lease_ttl_ns = pf->cfg.lease_ttl_ns;
    r->lease.slot = UINT32_MAX;
    r->job.run = pf_job_run;
    r->job.done = pf_job_done;
    r->state = PF_ST_NEW;
    r->t[PF_ST_NEW] = pd_now_ns();
    node_req_link(&pf->n, from, &r->nr);
    pd_stats_inc(pf->n.stats, PF_STAT_accepted);
    if (q->src_handle.len > 0 && pf_src_start(pf, r, q))
        return; /* pulling (or already on to compute) */
    pf_compute_start(pf, r);
}

/* ---- EMBED_REQ: a prompt pass into scratch blocks, no lease ------------- */

/* The EMBED_REQs waiting together at the head of the compute queue (the
 * runner joins them up to embeddings.batch-tokens): one engine call whose
 * rows share forward passes; each vector is bitwise the one it gets alone.
 * Should the batch fail, each runs alone so an error is its own. */
static void pf_embed_batch(eng_job_t *const *jobs, uint32_t n)
{
    pf_t *pf = ((pf_req_t *)jobs[0])->pf;
    eng_embed_item_t items[ENG_RUNNER_BATCH_MAX];
    pf_req_t *rs[ENG_RUNNER_BATCH_MAX];
    uint32_t k = 0;
    uint64_t t0 = pd_now_ns();
    for (uint32_t i = 0; i < n; i++) {
        pf_req_t *r = (pf_req_t *)jobs[i];
        r->run_start_ns = t0;
        if (atomic_load(&r->cancel)) {
            r->cstatus = PD_ERR_CANCELED;
            continue;
        }
        rs[k] = r;
        items[k++] = (eng_embed_item_t){ r->nr.blocks, r->nr.n_blocks, r->prompt, r->n_prompt,
                                         (eng_pooling_t)r->embed, r->vec };
    }
    void *arena = kvx_region_base(pf->n.region);
    pd_status_t st = k > 0 ? pf->n.ops->embed(pf->n.model, arena, items, k) : PD_OK;
    for (uint32_t i = 0; i < k; i++)
        rs[i]->cstatus = st == PD_OK || k == 1 ? st : pf->n.ops->embed(pf->n.model, arena,
                                                                      &items[i], 1);
    uint64_t t1 = pd_now_ns();
    for (uint32_t i = 0; i < n; i++) {
        pf_req_t *r = (pf_req_t *)jobs[i];
        r->run_end_ns = t1;
        r->embed_batch = 0;
    }
    if (k > 0)
        rs[0]->embed_batch = k;
}

static void pf_embed_done(eng_job_t *job)
{
    pf_req_t *r = (pf_req_t *)job;
    pf_t *pf = r->pf;
    pf_job_back(pf, r, job);
    if (r->embed_batch > 0 && !job->aborted)
        pd_stats_inc(pf->n.stats, PF_STAT_embed_batches);
    bool reply = pf_can_reply(pf, r) && !pf->n.stopping;
    r->reply_pending = false;
    if (atomic_load(&r->cancel) || pf->n.stopping) {
        if (reply)
            node_send_error(&pf->n, r->nr.link, r->nr.id, PD_ERR_CANCELED, "canceled");
        pf_req_set_state(r, PF_ST_CANCELED);
        return;
    }
    if (r->cstatus != PD_OK) {
        pd_log(PD_LOG_WARN, PF_COMP, r->nr.id, "embed failed: %s", pd_status_str(r->cstatus));
        if (reply)
            node_send_error(&pf->n, r->nr.link, r->nr.id, r->cstatus, "embed: %s",
                            pd_status_str(r->cstatus));
        pf_req_set_state(r, PF_ST_FAILED);
        return;
    }
    pd_stats_observe_ns(pf->n.stats, PF_STAT_prefill_time, r->run_end_ns - r->run_start_ns);
    pd_stats_add(pf->n.stats, PF_STAT_prompt_tokens, r->n_prompt);
    pd_stats_add(pf->n.stats, PF_STAT_computed_tokens, r->n_prompt);
    pd_stats_inc(pf->n.stats, PF_STAT_embeddings);
    const uint32_t E = pf->n.geom->n_embd;
    uint8_t *le = reply ? malloc((size_t)E * 4) : NULL;
    if (le != NULL) {
        for (uint32_t i = 0; i < E; i++) { /* f32 LE on the wire */
            uint32_t u;
            memcpy(&u, &r->vec[i], 4);
            le[4 * i] = (uint8_t)u;
            le[4 * i + 1] = (uint8_t)(u >> 8);
            le[4 * i + 2] = (uint8_t)(u >> 16);
            le[4 * i + 3] = (uint8_t)(u >> 24);
        }
        proto_msg_t m;
        memset(&m, 0, sizeof(m));
        m.hdr.type = PROTO_MSG_EMBED_DONE;
        proto_embed_done_t *d = &m.u.embed_done;
        snprintf(d->request_id, sizeof(d->request_id), "%s", r->nr.id);
        d->n_prompt_tokens = r->n_prompt;
        d->queue_ns = r->run_start_ns - r->t[PF_ST_COMPUTING];
        d->compute_ns = r->run_end_ns - r->run_start_ns;
        d->vec = (proto_blob_t){ le, E * 4 };
        pd_status_t st = node_req_send(&pf->n, &r->nr, &m);
        if (st != PD_OK)
            pd_log(PD_LOG_WARN, PF_COMP, r->nr.id, "EMBED_DONE not sent: %s", pd_status_str(st));
        free(le);
    } else if (reply) {
        node_send_error(&pf->n, r->nr.link, r->nr.id, PD_ERR_NO_MEMORY, "out of memory");
    }
    pf_req_set_state(r, PF_ST_COMPLETED); /* the scratch blocks go back */
}

static void pf_on_embed_req(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    pf_t *pf = PD_CONTAINER_OF(node, pf_t, n);
    const proto_embed_req_t *q = &msg->u.embed_req;
    const eng_kv_geom_t *g = pf->n.geom;
    pd_status_t st = PD_OK;
    const char *why = "";
    uint32_t n = q->prompt.n;
    int pool = q->pooling != PROTO_POOL_DEFAULT ? (int)q->pooling
               : g->pooling >= 0                ? g->pooling
                                                : pf->cfg.embed_pooling;
    if (pf->n.draining || pf->n.stopping) {
        st = PD_ERR_SHUTDOWN; why = "draining";
    } else if (pf->n.ops->embed == NULL || g->n_embd == 0 || g->n_embd > PROTO_MAX_EMBD) {
        st = PD_ERR_UNSUPPORTED; why = "this engine computes no embeddings";
    } else if (pool <= ENG_POOL_NONE || pool > ENG_POOL_LAST) {
        st = PD_ERR_UNSUPPORTED;
        why = "the model has no pooling for embeddings (no pooling_type in the GGUF; "
              "set the prefill's embeddings.pooling)";
    } else if (pf_req_find(pf, from, q->request_id) != NULL) {
        st = PD_ERR_EXISTS; why = "request id already live";
    } else if (n > pf->cfg.max_prompt_tokens || n > g->context_length) {
        st = PD_ERR_TOO_BIG; why = "input too long";
    } else if (pf->n_computing >= pf->cfg.max_queue) {
        st = PD_ERR_OVERLOADED; why = "queue full";
    }
    for (uint32_t i = 0; st == PD_OK && i < n; i++)
        if ((uint32_t)proto_tokens_get(&q->prompt, i) >= g->vocab_size) {
            st = PD_ERR_BAD_INPUT; why = "token id out of range";
        }
    uint32_t nb = (n + g->block_tokens - 1) / g->block_tokens;
    pf_req_t *r = NULL;
    if (st == PD_OK) {
        r = calloc(1, sizeof(*r));
        if (r == NULL || (r->prompt = malloc((size_t)n * sizeof(int32_t))) == NULL ||
            (r->nr.blocks = malloc((size_t)nb * sizeof(uint32_t))) == NULL ||
            (r->vec = malloc((size_t)g->n_embd * sizeof(float))) == NULL) {
            if (r)
                pf_req_free(r);
            r = NULL;
            st = PD_ERR_NO_MEMORY; why = "out of memory";
        }
    }
    if (st == PD_OK) {
        r->n_prompt = proto_tokens_copy(&q->prompt, r->prompt, n);
        st = pf->n.prefix != NULL ? kvx_prefix_alloc(pf->n.prefix, nb, r->nr.blocks)
                                  : kvx_blocks_alloc(pf->n.blocks, nb, r->nr.blocks);
        if (st != PD_OK) {
            st = PD_ERR_NO_KV_SPACE; why = "no free KV blocks";
            pf_req_free(r);
            r = NULL;
        }
    }
    if (st != PD_OK) {
        pd_stats_inc(pf->n.stats, PF_STAT_rejected);
        pd_log(PD_LOG_DEBUG, PF_COMP, q->request_id, "embed rejected: %s", why);
        node_send_error(&pf->n, from, q->request_id, st, "%s", why);
        return;
    }
    r->nr.n_blocks = nb;
    r->nr.blocks_held = true;
    r->pf = pf;
    r->embed = pool;
    snprintf(r->nr.id, sizeof(r->nr.id), "%s", q->request_id);
    r->reply_pending = true;
    r->lease.slot = UINT32_MAX;
    r->job.run_batch = pf_embed_batch; /* run() unused: a batch of one at least */
    r->job.cost = r->n_prompt;
    r->job.budget = (uint32_t)pf->cfg.embed_batch_tokens;
    r->job.done = pf_embed_done;
    r->state = PF_ST_NEW;
    r->t[PF_ST_NEW] = pd_now_ns();
    node_req_link(&pf->n, from, &r->nr);
    pd_stats_inc(pf->n.stats, PF_STAT_accepted);
    pf_req_set_state(r, PF_ST_COMPUTING);
    st = eng_runner_submit(pf->n.runner, &r->job);
    if (st != PD_OK) {
        node_send_error(&pf->n, r->nr.link, r->nr.id, PD_ERR_OVERLOADED, "compute queue: %s",
                        pd_status_str(st));
        r->reply_pending = false;
        r->job_done = true;
        pf_req_set_state(r, PF_ST_FAILED);
    }
}

/* Stop a request wherever it is. Computing: discard when the job returns;
 * leased: revoke (on_lease_end -> CANCELED). */
static void pf_req_cancel(pf_t *pf, pf_req_t *r)
{
    if (r->state == PF_ST_PULLING) {
        atomic_store(&r->cancel, true);
        if (r->pull_live)
            (void)kvx_pull_cancel(pf->n.kvx, r->pull_id); /* -> pf_src_pull_done */
    } else if (r->state == PF_ST_COMPUTING) {
        atomic_store(&r->cancel, true);
    } else if (r->state == PF_ST_LEASED) {
        if (kvx_lease_revoke(pf->n.kvx, r->lease) != PD_OK && r->state == PF_ST_LEASED)
            pf_req_set_state(r, PF_ST_CANCELED);
    }
}

static void pf_on_cancel(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    pf_t *pf = PD_CONTAINER_OF(node, pf_t, n);
    pf_req_t *r = pf_req_find(pf, from, msg->u.cancel.request_id);
    if (r != NULL)
        pf_req_cancel(pf, r);
}

static void pf_on_release(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    pf_t *pf = PD_CONTAINER_OF(node, pf_t, n);
    pf_req_t *r = pf_req_find(pf, from, msg->u.release.request_id);
    if (r == NULL)
        return;
    uint64_t lid = node_lease_wire_id(r->lease);
    if (r->state == PF_ST_LEASED && msg->u.release.lease_id != 0 &&
        msg->u.release.lease_id != lid) {
        pd_log(PD_LOG_WARN, PF_COMP, r->nr.id, "RELEASE with a foreign lease id ignored");
        return;
    }
    pf_req_cancel(pf, r);
}

/* ---- node callbacks ----------------------------------------------------- */

/* A router lost (its requests) or teardown (from NULL: all): computing
 * ones are discarded when their job returns, leased ones revoked. */
static void pf_cancel_all(node_t *n, const node_link_t *from)
{
    node_peers_forget_link(n, from); /* what that router said of the decodes */
    NODE_FOR_EACH(n, pf_req_t, r) { /* revoke may free r (deferred) and unlink it */
        if (from == NULL || r->nr.link == from)
            pf_req_cancel((pf_t *)n, r);
    }
}

/* After the kvx context is gone: a request whose pull never called back
 * (the context ended it) ends here. */
static void pf_after_kvx(node_t *n)
{
    NODE_FOR_EACH(n, pf_req_t, r) {
        if (r->state != PF_ST_PULLING)
            continue;
        r->pull_live = false;
        r->src_imported = false;
        r->nr.blocks_held = false;
        r->reply_pending = false;
        pf_req_set_state(r, PF_ST_CANCELED);
    }
}

/* The decodes: a PREFILL_REQ's source is one of their caches. */
static void pf_on_peer_info(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    node_peer_info(node, from, &msg->u.peer_info, 1u << PROTO_ROLE_DECODE);
}

static void pf_on_peer_down(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    node_peer_down(node, from, &msg->u.peer_down);
}

static void pf_adm_session(node_t *n, cJSON *reply)
{
    node_adm_peers(n, reply);
}

static void pf_fill_hb(node_t *n, proto_heartbeat_t *hb)
{
    pf_t *pf = (pf_t *)n;
    kvx_gauges_t g;
    kvx_gauges(n->kvx, &g);
    hb->queue_depth = pf->n_computing;
    hb->running_seqs = 0;
    hb->leases = g.leases_active;
    uint64_t tok = 0;
    NODE_FOR_EACH(n, pf_req_t, r)
        if (r->state == PF_ST_COMPUTING || r->state == PF_ST_PULLING)
            tok += r->n_prompt - r->n_cached; /* the work left: cached tokens are not computed */
    hb->outstanding_prefill_tokens = tok;
}

/* ---- admin -------------------------------------------------------------- */

static void pf_adm_kv(node_t *n, cJSON *reply)
{
    kvx_gauges_t g;
    kvx_gauges(n->kvx, &g);
    uint32_t leased = 0;
    NODE_FOR_EACH(n, pf_req_t, r)
        if (r->state == PF_ST_LEASED)
            leased += r->nr.n_blocks;
    cJSON_AddNumberToObject(reply, "leased", leased);
    cJSON_AddNumberToObject(reply, "blocks_pinned", (double)g.blocks_pinned);
    cJSON_AddNumberToObject(reply, "leases_active", g.leases_active);
}

static pd_status_t pf_adm_leases(pd_admin_req_t *req, cJSON *reply)
{
    pf_t *pf = req->arg;
    cJSON *a = cJSON_AddArrayToObject(reply, "leases");
    uint64_t now = pd_now_ns();
    NODE_FOR_EACH(&pf->n, pf_req_t, r) {
        if (r->state != PF_ST_LEASED)
            continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "request_id", r->nr.id);
        cJSON_AddStringToObject(o, "decode", r->target);
        cJSON_AddNumberToObject(o, "blocks", r->nr.n_blocks);
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
    NODE_FOR_EACH(&pf->n, pf_req_t, r) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "request_id", r->nr.id);
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
    node_adm_counters(&pf->n, reply);
    return PD_OK;
}

static const pd_admin_cmd_t pf_cmds[] = {
    { "leases", PD_ADMIN_USER, pf_adm_leases, "leases - KV leases held for decodes" },
    { "requests", PD_ADMIN_USER, pf_adm_requests, "requests - live requests and outcome counters" },
    PD_ADMIN_CMD_END,
};

/* ---- boot ----------------------------------------------------------------- */

static const pd_stat_desc_t pf_stat_descs[] = { PF_STATS(PD_STAT_DESC) };
/* Prometheus: outcomes (and pulls) as labeled families, buckets fit for each figure */
static const pd_stat_prom_t pf_stat_prom[] = {
    NODE_REQ_STAT_PROM,
    PD_STAT_PROM_LE("queue_time", MS), PD_STAT_PROM_LE("prefill_time", MS),
    PD_STAT_PROM_LE("lease_time", S), PD_STAT_PROM_LE("src_pull_time", MS),
};
static const pd_stats_table_t pf_stats_table =
    PD_STATS_TABLE_PROM("prefill", pf_stat_descs, pf_stat_prom);

static const node_role_t pf_role = {
    .name = "prefill", .schema = &pf_schema, .stats = &pf_stats_table,
    .proto_role = PROTO_ROLE_PREFILL, .cpu_prio = 1, .caps = PROTO_CAP_PREFILL | PROTO_CAP_KV_EXPORT,
    .msgs = { .on_prefill_req = pf_on_prefill_req, .on_embed_req = pf_on_embed_req,
             .on_cancel = pf_on_cancel,
             .on_release = pf_on_release, .on_peer_info = pf_on_peer_info,
             .on_peer_down = pf_on_peer_down },
    .cancel_all = pf_cancel_all, .fill_hb = pf_fill_hb, .adm_kv = pf_adm_kv,
    .adm_session = pf_adm_session, .cmds = pf_cmds,
    .xfer_help = "xfer - kvxfer statistics (pulls from decodes' caches per peer)",
    .session_help = "session - router session state and peers (decodes)",
    .on_lease_end = pf_on_lease_end,
};

/* kvx: leases last at least lease-ttl; their ends come to pf_on_lease_end
 * (through the node's lease table). It pulls too: a decode's cached
 * prefix (PREFILL_REQ source). */
static void pf_kvx_config(node_t *n, kvx_config_t *kc)
{
    pf_t *pf = (pf_t *)n;
    kc->stats_role = KVX_STATS_BOTH; /* exports to decodes, pulls from decodes' caches */
    kc->max_lease_ttl_ns = pf->cfg.lease_ttl_ns > kc->max_lease_ttl_ns ? pf->cfg.lease_ttl_ns
                                                                       : kc->max_lease_ttl_ns;
}

int main(int argc, char **argv)
{
    static pf_t g;
    pf_t *pf = &g;
    pd_cfg_result_t res;
    pd_config_load_or_exit(&pf_schema, &pf->cfg, argc, argv, &res);
    pf->n.role = &pf_role;
    pf->n.cfg = &pf->cfg.node;
    node_boot_opts_t bo = { .max_batch = 1, .kvx_config = pf_kvx_config };
    int rc = node_boot(&pf->n, &bo);
    if (rc == PD_CONFIG_RUN) {
        pf->logits = malloc((size_t)pf->n.geom->vocab_size * sizeof(float));
        if (pf->logits == NULL)
            rc = node_fail(&pf->n, "boot", PD_ERR_NO_MEMORY, NULL);
    }
    if (rc == PD_CONFIG_RUN) {
        pd_status_t st = node_run(&pf->n, "");
        rc = st == PD_OK ? 0 : st == PD_ERR_BAD_INPUT ? 2 : 1;
        if (st != PD_ERR_BAD_INPUT)
            node_teardown(&pf->n, pf_after_kvx);
    }
    free(pf->logits);
    proto_auth_secret_wipe(&pf->n.secret);
    pd_config_free(&pf_schema, &pf->cfg);
    pd_config_result_free(&res);
    pd_log_close();
    return rc;
}
