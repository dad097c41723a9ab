/* pd_decode.c - the pd-decode daemon's own part (see decode/README.md and DESIGN.md, dec.h
 * and the flow spec in proto/PROTOCOL.md "Flows"): admission with KV
 * reservation, kvx import / pull / release, step scheduling, streaming.
 * Boot, session, drain, the common admin commands: node/.
 *
 * Loop thread: admission, kvx, step scheduling, streaming, admin.
 * Compute thread (eng_runner): one step at a time = at most one local
 * prefill chunk + one decode step for every running sequence. */
#include "dec.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "pd_log.h"
#include "pd_time.h"

#define DEC_COMP "decode"

#define DEC_ROW(field, key, type, def, help, min, max, en)                    \
    PD_CFG_ROW(dec_config_t, field, key, type, def, help, min, max, en)
static const pd_cfg_field_t dec_fields[] = {
    NODE_HEAD_ROWS(dec_config_t, "daemon id (default decode-<pid>)")
    DEC_ROW(max_batch, "max-batch", UINT, "32", "sequences admitted at once (continuous batch)", 1, 4096, NULL),
    DEC_ROW(max_queue, "max-queue", UINT, "64", "requests waiting for room before NO_KV_SPACE", 0, 1e6, NULL),
    DEC_ROW(transfer_timeout_ns, "transfer-timeout", DURATION, "5s", "deadline of one KV pull", 1e6, 600e9, NULL),
    DEC_ROW(prefill_chunk, "prefill-chunk", UINT, "256", "tokens per decode-local prefill chunk", 1, 1048576, NULL),
    DEC_ROW(lease_ttl_ns, "lease-ttl", DURATION, "30s", "KV lease length of a live migration's handle", 1e6, 600e9, NULL),
    DEC_ROW(fused_step, "fused-step", BOOL, "true", "a decode-local prefill chunk runs in the same forward passes as the running batch (weights read once; same tokens either way)", 0, 0, NULL),
    DEC_ROW(tpot_target_ns, "tpot-target", DURATION, "0", "step time a decode-local prefill chunk may stretch a running batch to: the chunk is sized from measured step times (at most prefill-chunk, at least one block); 0: always prefill-chunk tokens", 0, 60e9, NULL),
    NODE_TAIL_ROWS(dec_config_t)
    PD_CFG_END,
};

static const pd_cfg_schema_t dec_schema = {
    .prog = "pd-decode",
    .summary = "pd-decode [--config FILE] [--key=value ...]: decode daemon (KV pull, continuous batching)",
    .fields = dec_fields,
    .check = node_check_config, /* node_config_t is the first member */
};

static const char *const dec_state_names[] = { DEC_STATES(NODE_STATE_NAME) };

static void dec_kick(dec_t *d);
static void dec_req_cancel(dec_t *d, dec_req_t *r);
static void dec_log_timeline(const dec_req_t *r);
static double dec_rel_ms(const dec_req_t *r, uint64_t t);
static void dec_migrate_out(dec_t *d, dec_req_t *r);
static void dec_admit_waiting(dec_t *d);
static void dec_fork_release(dec_t *d, dec_req_t *r);
static void dec_forks_end(dec_t *d, dec_req_t *r, pd_status_t status);

/* ---- lookup ----------------------------------------------------------------- */

static dec_req_t *dec_req_find(dec_t *d, const node_link_t *from, const char *id)
{
    node_req_t *n = node_req_find(&d->n, from, id);
    return n != NULL ? NODE_REQ(n, dec_req_t) : NULL;
}

static void dec_wait_remove(dec_t *d, dec_req_t *r)
{
    dec_req_t **pp = &d->wait_head, *prev = NULL;
    while (*pp != NULL && *pp != r) {
        prev = *pp;
        pp = &(*pp)->wnext;
    }
    if (*pp == NULL)
        return;
    *pp = r->wnext;
    if (d->wait_tail == r)
        d->wait_tail = prev;
    r->wnext = NULL;
    d->n_waiting--;
    pd_stats_gauge_set(d->n.stats, DEC_STAT_waiting, d->n_waiting);
}

static void dec_req_free(void *obj)
{
    dec_req_t *r = obj;
    if (r->renew_ev)
        event_free(r->renew_ev);
    free(r->tok);
    free(r->nr.blocks);
    free(r->handle);
    node_gram_end(&r->gram);
    free(r);
}

/* ---- messages out -------------------------------------------------------- */

static bool dec_can_reply(dec_t *d, dec_req_t *r)
{
    return !dec_req_is(r, DEC_RF_QUIET) && node_req_can_reply(&d->n, &r->nr);
}

/* TOKENS with the generated tokens [from, n_gen). */
static void dec_send_tokens(dec_t *d, dec_req_t *r, uint32_t from)
{
    if (from >= r->n_gen)
        return;
    if (r->seq == 0) {
        r->first_token_ns = pd_now_ns();
        r->step0_start_ns = d->step.start_ns;
        pd_stats_observe_ns(d->n.stats, DEC_STAT_ttft, r->first_token_ns - r->t[DEC_ST_NEW]);
    }
    if (!dec_can_reply(d, r)) {
        r->seq++;
        return;
    }
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_TOKENS;
    snprintf(m.u.tokens.request_id, sizeof(m.u.tokens.request_id), "%s", r->nr.id);
    m.u.tokens.seq = r->seq++;
    m.u.tokens.tokens.n = r->n_gen - from;
    m.u.tokens.tokens.v = r->tok + r->n_prompt + from;
    proto_logprob_t lp;
    if (r->lp_on && m.u.tokens.tokens.n == 1) { /* pend_lp is the last token's */
        _Static_assert(ENG_SAMPLE_MAX_TOP_LOGPROBS == PROTO_MAX_TOP_LOGPROBS, "top logprobs");
        lp.logprob = r->pend_lp.logprob;
        memcpy(lp.top_ids, r->pend_lp.top_ids, sizeof(lp.top_ids));
        memcpy(lp.top_lp, r->pend_lp.top_lp, sizeof(lp.top_lp));
        m.u.tokens.logprobs = (proto_logprobs_t){ r->pend_lp.n_top, 1, &lp, NULL };
    }
    pd_status_t st = node_req_send(&d->n, &r->nr, &m);
    if (st != PD_OK)
        pd_log(st == PD_ERR_SHUTDOWN ? PD_LOG_DEBUG : PD_LOG_WARN, DEC_COMP, r->nr.id,
               "TOKENS not sent: %s", pd_status_str(st));
}

/* ---- the one state setter ------------------------------------------------ */

static bool dec_terminal(dec_state_t s)
{
    return s == DEC_ST_FINISHED || s == DEC_ST_FAILED || s == DEC_ST_CANCELED;
}

static bool dec_transition_ok(dec_state_t from, dec_state_t to)
{
    if (dec_terminal(from) || to == DEC_ST_NEW)
        return false;
    if (dec_terminal(to))
        return true;
    switch (from) {
    case DEC_ST_NEW:        return true;
    case DEC_ST_WAITING:    return to == DEC_ST_PULLING || to == DEC_ST_PREFILLING ||
                                   to == DEC_ST_RUNNING;
    case DEC_ST_PULLING:    return to == DEC_ST_PREFILLING || to == DEC_ST_RUNNING;
    case DEC_ST_PREFILLING: return to == DEC_ST_RUNNING;
    case DEC_ST_RUNNING:    return to == DEC_ST_MIGRATING;
    default:                return false;
    }
}

static bool dec_active(dec_state_t s)
{
    return s == DEC_ST_PULLING || s == DEC_ST_PREFILLING || s == DEC_ST_RUNNING;
}

static void dec_req_set_state(dec_req_t *r, dec_state_t to)
{
    dec_t *d = r->d;
    assert(dec_transition_ok(r->state, to));
    if (!dec_transition_ok(r->state, to)) {
        pd_log(PD_LOG_ERROR, DEC_COMP, r->nr.id, "illegal state change %s -> %s",
               dec_state_names[r->state], dec_state_names[to]);
        return;
    }
    dec_state_t from = r->state;
    r->state = to;
    r->t[to] = pd_now_ns();
    if (dec_active(from) && !dec_active(to))
        d->n_active--;
    if (!dec_active(from) && dec_active(to))
        d->n_active++;
    if (from == DEC_ST_RUNNING)
        pd_stats_gauge_add(d->n.stats, DEC_STAT_running, -1);
    if (to == DEC_ST_RUNNING)
        pd_stats_gauge_add(d->n.stats, DEC_STAT_running, 1);
    if (from == DEC_ST_WAITING) {
        dec_wait_remove(d, r);
        if (r->renew_ev)
            event_del(r->renew_ev); /* the pull starts now (or the request ends) */
    }
    if (!dec_terminal(to))
        return;
    assert(!dec_req_is(r, DEC_RF_IN_STEP | DEC_RF_PULL_LIVE));
    pd_stats_inc(d->n.stats, to == DEC_ST_FINISHED ? DEC_STAT_completed
                         : to == DEC_ST_FAILED ? DEC_STAT_failed : DEC_STAT_canceled);
    node_req_retire(&d->n, &r->nr, dec_req_free, r);
    dec_admit_waiting(d);
    node_maybe_drained(&d->n);
}

/* End a request with its one final message. reason: a proto finish reason
 * (STOP/LENGTH/CANCELED), or ERROR with status. A failure before any
 * TOKENS is an ERROR message (the router may retry); after, FINISH error. */
static void dec_req_end(dec_req_t *r, uint16_t reason, pd_status_t status)
{
    dec_t *d = r->d;
    if (dec_req_is(r, DEC_RF_IN_STEP | DEC_RF_PULL_LIVE)) { /* the compute step / pull returns first */
        dec_req_flag(r, DEC_RF_CANCEL, true);
        return;
    }
    if (dec_req_is(r, DEC_RF_IMPORTED)) {
        (void)kvx_lease_release(d->n.kvx, &r->imp); /* prefill gets its blocks back */
        dec_req_flag(r, DEC_RF_IMPORTED, false);
    }
    dec_forks_end(d, r, reason == PROTO_FINISH_ERROR ? status : PD_ERR_CANCELED);
    pd_stats_observe_ns(d->n.stats, DEC_STAT_req_time, pd_now_ns() - r->t[DEC_ST_NEW]);
    dec_log_timeline(r);
    if (reason == PROTO_FINISH_CANCELED && dec_req_is(r, DEC_RF_CANCEL_STOP)) {
        reason = PROTO_FINISH_STOP; /* a stop string ended it: not a cancel */
        status = PD_OK;
    }
    dec_state_t to = reason == PROTO_FINISH_CANCELED ? DEC_ST_CANCELED
                   : reason == PROTO_FINISH_ERROR ? DEC_ST_FAILED : DEC_ST_FINISHED;
    /* a finished sequence's KV (prompt + generated, full blocks) stays as
     * cache; never a failed or canceled one's (a failed pull leaves garbage) */
    if (to == DEC_ST_FINISHED && d->n.prefix != NULL && r->nr.blocks_held) {
        /* every step succeeded: KV is written for all tokens but the last
         * sampled one (kv_have counts prefill chunks / the pull only) */
        uint32_t n_kv = r->n_gen > 0 ? r->n_prompt + r->n_gen - 1 : r->kv_have;
        (void)kvx_prefix_insert(d->n.prefix, r->partition, r->tok, n_kv, r->nr.blocks,
                                r->nr.n_blocks, NULL);
    }
    if (dec_can_reply(d, r)) {
        if (reason == PROTO_FINISH_ERROR && r->seq == 0) {
            node_send_error(&d->n, r->nr.link, r->nr.id, status, "%s", pd_status_str(status));
        } else {
            uint64_t now = pd_now_ns();
            proto_msg_t m;
            memset(&m, 0, sizeof(m));
            m.hdr.type = PROTO_MSG_FINISH;
            proto_finish_t *f = &m.u.finish;
            snprintf(f->request_id, sizeof(f->request_id), "%s", r->nr.id);
            f->reason = reason;
            f->status = reason == PROTO_FINISH_ERROR ? status
                      : reason == PROTO_FINISH_CANCELED ? PD_ERR_CANCELED : PD_OK;
            f->prompt_tokens = r->n_prompt;
            f->completion_tokens = r->n_gen;
            uint64_t admitted = r->t[DEC_ST_WAITING] ? r->t[DEC_ST_WAITING] : r->t[DEC_ST_NEW];
            uint64_t started = r->t[DEC_ST_PULLING] ? r->t[DEC_ST_PULLING]
                             : r->t[DEC_ST_PREFILLING] ? r->t[DEC_ST_PREFILLING]
                             : r->t[DEC_ST_RUNNING] ? r->t[DEC_ST_RUNNING] : now;
            f->queue_ns = r->t[DEC_ST_WAITING] ? started - admitted : 0;
            f->prefill_ns = r->prefill_ns;
            f->transfer_ns = r->transfer_ns;
            f->decode_ns = r->t[DEC_ST_RUNNING] ? now - r->t[DEC_ST_RUNNING] : 0;
            f->ttft_ns = r->first_token_ns ? r->first_token_ns - r->t[DEC_ST_NEW] : 0;
            f->total_ns = now - r->t[DEC_ST_NEW];
            uint64_t cached = (uint64_t)r->n_reused * d->n.geom->block_tokens;
            f->cached_tokens = cached < r->n_prompt ? (uint32_t)cached : r->n_prompt;
            f->kv_bytes = r->pulled_bytes;
            (void)node_req_send(&d->n, &r->nr, &m);
        }
    }
    dec_req_set_state(r, to);
}

/* Loop, phase A: take a sampled token into the request (no messages yet);
 * decide whether it ends. */
static void dec_take_token(dec_t *d, dec_req_t *r)
{
    if (r->step_status != PD_OK || r->step_token < 0) {
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "compute failed: %s", pd_status_str(r->step_status));
        dec_req_flag(r, DEC_RF_FINISHING, true);
        r->pend_reason = PROTO_FINISH_ERROR;
        r->pend_status = r->step_status != PD_OK ? r->step_status : PD_ERR_INTERNAL;
        return;
    }
    r->tok[r->n_prompt + r->n_gen++] = r->step_token;
    if (r->lp_on)
        r->pend_lp = r->step_lp;
    pd_stats_inc(d->n.stats, DEC_STAT_tokens_out);
    dec_req_flag(r, DEC_RF_PEND_SEND, true);
    if (r->step_finish != ENG_FINISH_NONE) {
        dec_req_flag(r, DEC_RF_FINISHING, true);
        r->pend_reason = r->step_finish == ENG_FINISH_STOP ? PROTO_FINISH_STOP
                                                           : PROTO_FINISH_LENGTH;
        r->pend_status = PD_OK;
    }
}

static void dec_mark_end(dec_req_t *r, uint16_t reason, pd_status_t status)
{
    dec_req_flag(r, DEC_RF_FINISHING, true);
    r->pend_reason = reason;
    r->pend_status = status;
}

/* EP rank: the idle tick (an idle group's next vote). */
static void dec_ep_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dec_t *d = arg;
    d->ep_tick_due = true;
    dec_kick(d);
}

/* The EP group lost a rank (a vote or a pass failed: a rank died or
 * stalled past ep-timeout, or the transport failed): this rank cannot
 * compute any more. Every stream it holds ends with an error (the router
 * replays them elsewhere, as for a lost decode), the router is told we
 * drain, and the daemon exits 1 once the replies are out (or after 2 s). */
static void dec_ep_lost(dec_t *d, pd_status_t st)
{
    pd_log(PD_LOG_ERROR, DEC_COMP, NULL,
           "EP group lost a rank (rank %llu of %llu: %s): failing %u streams and exiting",
           (unsigned long long)d->n.cfg->ep_rank, (unsigned long long)d->n.cfg->ep_size,
           pd_status_str(st), d->n.n_live);
    NODE_FOR_EACH(&d->n, dec_req_t, r) {
        if (dec_req_is(r, DEC_RF_CANCEL | DEC_RF_IN_STEP))
            continue;
        if (r->state == DEC_ST_MIGRATING || dec_req_is(r, DEC_RF_PULL_LIVE))
            dec_req_cancel(d, r); /* ends when the pull / lease comes back */
        else
            dec_req_end(r, PROTO_FINISH_ERROR, PD_ERR_PEER_GONE);
    }
    d->n.draining = true;
    d->n.ep_group_drained = true;
    node_heartbeat_now(&d->n);
    if (d->n.drain_ev != NULL) {
        struct timeval tv = pd_ns_to_timeval(2000000000ull);
        evtimer_add(d->n.drain_ev, &tv);
    }
    node_maybe_drained(&d->n);
}

/* A step came back. Phase A: fold its results into the requests without
 * sending anything; phase B: submit the next step at once (the compute
 * thread works while we talk); phase C: stream TOKENS, end the finished. */
static void dec_step_done(eng_job_t *job)
{
    dec_step_t *s = (dec_step_t *)job;
    dec_t *d = s->d;
    d->step_busy = false;
    if (!job->aborted && d->n.ep_win != NULL) {
        d->ep_hot = s->ep_work;
        if (s->ep_status != PD_OK)
            d->ep_lost = true; /* the round's requests fail below, the rest after */
    }
    bool real = s->chunk != NULL || s->n_items > 0;
    if (!job->aborted && real) {
        pd_stats_inc(d->n.stats, DEC_STAT_steps);
        pd_stats_observe_ns(d->n.stats, DEC_STAT_step_time, s->end_ns - s->start_ns);
        if (s->chunk != NULL) {
            pd_stats_inc(d->n.stats, DEC_STAT_chunks);
            pd_stats_add(d->n.stats, DEC_STAT_chunk_tokens, s->chunk->chunk_n);
            if (s->fused)
                pd_stats_inc(d->n.stats, DEC_STAT_fused_chunks);
        }
        dec_sm_add(&d->sm, s->threads, s->chunk != NULL ? s->chunk->chunk_n : 0, s->n_items,
                   (double)(s->end_ns - s->start_ns));
    }
    uint32_t np = 0;
    dec_req_t *c = s->chunk;
    s->chunk = NULL;
    if (c != NULL) {
        dec_req_flag(c, DEC_RF_IN_STEP, false);
        s->prev[np++] = c;
        if (job->aborted)
            c->step_status = PD_ERR_SHUTDOWN;
        if (dec_req_is(c, DEC_RF_CANCEL)) {
            dec_mark_end(c, PROTO_FINISH_CANCELED, PD_ERR_CANCELED);
        } else if (c->step_status != PD_OK) {
            dec_mark_end(c, PROTO_FINISH_ERROR, c->step_status);
        } else {
            c->kv_have += c->chunk_n;
            c->prefill_ns += (uint64_t)dec_sm_chunk_ns(&d->sm, s->threads, s->n_items,
                                                       (double)(s->end_ns - s->start_ns));
            uint32_t need = c->n_prompt + (c->n_gen ? c->n_gen - 1 : 0);
            if (c->kv_have >= need) {
                dec_req_set_state(c, DEC_ST_RUNNING);
                if (c->chunk_logits)
                    dec_take_token(d, c); /* token 0 of a local prefill */
            }
        }
    }
    for (uint32_t i = 0; i < s->n_items; i++) {
        dec_req_t *r = s->items[i];
        dec_req_flag(r, DEC_RF_IN_STEP, false);
        s->prev[np++] = r;
        if (job->aborted)
            r->step_status = PD_ERR_SHUTDOWN;
        if (dec_req_is(r, DEC_RF_CANCEL))
            dec_mark_end(r, PROTO_FINISH_CANCELED, PD_ERR_CANCELED);
        else
            dec_take_token(d, r);
    }
    s->n_items = 0;
    if (c != NULL && c->forks != NULL && c->state == DEC_ST_RUNNING &&
        !dec_req_is(c, DEC_RF_FINISHING))
        dec_fork_release(d, c); /* a local parent's prompt is in */
    if (!job->aborted)
        dec_kick(d); /* skips the finishing ones */
    for (uint32_t i = 0; i < np; i++) {
        dec_req_t *r = s->prev[i];
        if (dec_req_is(r, DEC_RF_PEND_SEND)) {
            dec_req_flag(r, DEC_RF_PEND_SEND, false);
            dec_send_tokens(d, r, r->n_gen - 1);
        }
        if (dec_req_is(r, DEC_RF_FINISHING)) {
            dec_req_flag(r, DEC_RF_FINISHING, false);
            dec_req_flag(r, DEC_RF_CANCEL, false);
            dec_req_end(r, r->pend_reason, r->pend_status);
        } else if (dec_req_is(r, DEC_RF_MIGRATE) && !dec_req_is(r, DEC_RF_CANCEL) &&
                   r->state == DEC_ST_RUNNING) {
            dec_migrate_out(d, r); /* its TOKENS went out just above */
        }
    }
    if (d->ep_lost && !job->aborted) {
        dec_ep_lost(d, s->ep_status);
        return;
    }
    if (!job->aborted && d->n.ep_win != NULL && s->ep_all_drained) {
        d->n.ep_group_drained = true; /* the whole group leaves in this round */
        node_maybe_drained(&d->n);
        return;
    }
    if (!job->aborted)
        dec_kick(d); /* admissions made room for new work */
}

/* Build and submit the next step if there is work and none in flight. */
static void dec_kick(dec_t *d)
{
    if (d->step_busy || d->n.stopping || d->ep_lost || d->n.ep_group_drained)
        return;
    dec_step_t *s = &d->step;
    s->chunk = NULL;
    s->n_items = 0;
    /* the oldest PREFILLING request gets one chunk (list is newest first) */
    dec_req_t *oldest = NULL;
    NODE_FOR_EACH(&d->n, dec_req_t, r) {
        if (dec_req_is(r, DEC_RF_CANCEL | DEC_RF_FINISHING))
            continue;
        if (r->state == DEC_ST_PREFILLING)
            oldest = r;
        else if (r->state == DEC_ST_RUNNING && dec_req_is(r, DEC_RF_MIGRATE))
            continue; /* leaving: dec_migrate_out once it is out of the step */
        else if (r->state == DEC_ST_RUNNING && s->n_items < d->cfg.max_batch)
            s->items[s->n_items++] = r;
    }
    /* the host's core arbiter: park threads for prefills that want them
     * while tpot-target holds */
    uint32_t want_after = node_cpu_want_after(&d->n);
    s->threads = dec_threads_pick(d, s->n_items, want_after);
    if (oldest != NULL) {
        uint32_t need = oldest->n_prompt + (oldest->n_gen ? oldest->n_gen - 1 : 0);
        uint32_t left = need - oldest->kv_have;
        uint32_t budget = dec_chunk_budget(d, s->n_items, s->threads);
        pd_stats_gauge_set(d->n.stats, DEC_STAT_chunk_budget, budget);
        oldest->chunk_n = left < budget ? left : budget;
        oldest->chunk_logits = oldest->n_gen == 0 && oldest->kv_have + oldest->chunk_n == need;
        dec_req_flag(oldest, DEC_RF_IN_STEP, true);
        s->chunk = oldest;
    }
    if (s->chunk == NULL && s->n_items == 0) {
        if (d->n.ep_win == NULL)
            return;
        if (!d->ep_hot && !d->ep_tick_due) { /* an idle group: vote again on the tick */
            if (d->ep_tick != NULL && !evtimer_pending(d->ep_tick, NULL)) {
                struct timeval tv = pd_ns_to_timeval(DEC_EP_IDLE_TICK_NS);
                evtimer_add(d->ep_tick, &tv);
            }
            return;
        }
    }
    d->ep_tick_due = false;
    s->ep_drained = d->n.draining && d->n.n_live == 0;
    uint64_t now = pd_now_ns();
    for (uint32_t i = 0; i < s->n_items; i++) {
        dec_req_t *r = s->items[i];
        dec_req_flag(r, DEC_RF_IN_STEP, true);
        if (r->first_step_ns == 0) {
            r->first_step_ns = now;
            if (r->t[DEC_ST_PULLING] != 0) { /* the handoff: what is neither wait nor pull */
                uint64_t waited = r->t[DEC_ST_WAITING] ? r->t[DEC_ST_PULLING] - r->t[DEC_ST_WAITING]
                                                       : 0;
                uint64_t busy = now - r->t[DEC_ST_NEW];
                r->handoff_ns = busy > waited + r->transfer_ns ? busy - waited - r->transfer_ns : 0;
                pd_stats_observe_ns(d->n.stats, DEC_STAT_handoff, r->handoff_ns);
            }
        }
    }
    d->step_busy = true;
    pd_stats_gauge_set(d->n.stats, DEC_STAT_threads_active, s->threads);
    if (s->threads < d->n.threads)
        pd_stats_inc(d->n.stats, DEC_STAT_steps_yielded);
    pd_status_t st = eng_runner_submit(d->n.runner, &s->job);
    if (d->n.arb != NULL)
        pd_cpuarb_set_used(d->n.arb, s->threads);
    if (st != PD_OK) { /* the runner queue is unbounded: shutting down */
        d->step_busy = false;
        if (s->chunk)
            dec_req_flag(s->chunk, DEC_RF_IN_STEP, false);
        for (uint32_t i = 0; i < s->n_items; i++)
            dec_req_flag(s->items[i], DEC_RF_IN_STEP, false);
        s->chunk = NULL;
        s->n_items = 0;
    }
}

/* ---- transfer ---------------------------------------------------------- */

/* ms since the request came, or -1 for a moment that did not happen */
static double dec_rel_ms(const dec_req_t *r, uint64_t t)
{
    return t != 0 ? (double)(t - r->t[DEC_ST_NEW]) / 1e6 : -1.0;
}

/* Where the hand-off's time went (debug log): pull start / every layer
 * ready / last get posted / end, FIRST_TOKEN, the first step's start and
 * its TOKENS (ms since DECODE_REQ). */
static void dec_log_timeline(const dec_req_t *r)
{
    if (pd_log_get_level() < PD_LOG_DEBUG || r->t[DEC_ST_PULLING] == 0)
        return;
    pd_log(PD_LOG_DEBUG, DEC_COMP, r->nr.id,
           "timeline ms: wait %.1f pull %.1f ready %.1f posted %.1f end %.1f, FIRST_TOKEN %.1f, "
           "step %.1f, tokens %.1f",
           dec_rel_ms(r, r->t[DEC_ST_WAITING]), dec_rel_ms(r, r->t[DEC_ST_PULLING]),
           dec_rel_ms(r, r->pull_ready_ns),
           dec_rel_ms(r, r->pull_posted_ns), dec_rel_ms(r, r->pull_end_ns),
           dec_rel_ms(r, r->t0_at_ns), dec_rel_ms(r, r->step0_start_ns),
           dec_rel_ms(r, r->first_token_ns));
}

/* The early hand-off's waits: the prompt's KV was in and waited for token
 * 0 (first_token_wait), or token 0 was in and waited for the pull. */
static uint64_t dec_first_token_wait_ns(const dec_req_t *r)
{
    return r->t0_at_ns > r->pull_end_ns && r->pull_end_ns ? r->t0_at_ns - r->pull_end_ns : 0;
}

static uint64_t dec_pull_after_t0_ns(const dec_req_t *r)
{
    return r->pull_end_ns > r->t0_at_ns && r->t0_at_ns ? r->pull_end_ns - r->t0_at_ns : 0;
}

static void dec_start_compute(dec_t *d, dec_req_t *r)
{
    uint32_t need = r->n_prompt + (r->n_gen ? r->n_gen - 1 : 0);
    if (r->kv_have < need) {
        if (dec_req_is(r, DEC_RF_LOCAL) && r->kv_have == r->n_reused * d->n.geom->block_tokens)
            pd_stats_inc(d->n.stats, DEC_STAT_local_prefills);
        dec_req_set_state(r, DEC_ST_PREFILLING);
    } else {
        dec_req_set_state(r, DEC_ST_RUNNING);
        if (r->forks != NULL)
            dec_fork_release(d, r); /* a pulled parent's prompt is in */
        if (dec_req_is(r, DEC_RF_MIGRATE)) { /* MIGRATE came while it pulled */
            dec_migrate_out(d, r);
            return;
        }
    }
    dec_kick(d);
}

static void dec_pull_done(void *arg, pd_status_t status, const kvx_pull_result_t *res)
{
    dec_req_t *r = arg;
    dec_t *d = r->d;
    dec_req_flag(r, DEC_RF_PULL_LIVE, false);
    r->transfer_ns = res ? res->latency_ns : pd_now_ns() - r->t[DEC_ST_PULLING];
    r->pull_end_ns = pd_now_ns();
    if (res != NULL && res->ready_ns)
        r->pull_ready_ns = r->t[DEC_ST_PULLING] + res->ready_ns;
    if (res != NULL && res->posted_ns)
        r->pull_posted_ns = r->t[DEC_ST_PULLING] + res->posted_ns;
    pd_stats_observe_ns(d->n.stats, DEC_STAT_transfer_time, r->transfer_ns);
    if (status == PD_OK) {
        pd_stats_inc(d->n.stats, DEC_STAT_pulls_ok);
        if (res != NULL)
            r->pulled_bytes += res->bytes;
    } else {
        pd_stats_inc(d->n.stats, DEC_STAT_pulls_failed);
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "KV pull from %s failed: %s", r->peer,
               pd_status_str(status));
    }
    if (dec_req_is(r, DEC_RF_CANCEL)) {
        dec_req_end(r, PROTO_FINISH_CANCELED, PD_ERR_CANCELED);
        return;
    }
    if (status != PD_OK) {
        dec_req_end(r, PROTO_FINISH_ERROR, status);
        return;
    }
    r->kv_have = r->kv_pull;
    if (r->kv_pull > r->n_prompt)
        pd_stats_inc(d->n.stats, DEC_STAT_migrated_in);
    if (dec_req_is(r, DEC_RF_T0_WAIT)) { /* the prompt is in; FIRST_TOKEN starts it (and releases) */
        dec_req_flag(r, DEC_RF_T0_PULLED, true);
        return;
    }
    dec_start_compute(d, r);
    /* The release after the first step is on its way: posting the notify
     * can take milliseconds after a large pull (UCX tcp), which the compute
     * thread spends on the step instead of waiting. */
    (void)kvx_lease_release(d->n.kvx, &r->imp); /* prefill gets its blocks back */
    dec_req_flag(r, DEC_RF_IMPORTED, false);
}

/* A handle was imported: how much of its lease was left when the
 * DECODE_REQ came (the exporter's TTL minus this is the hop prefill ->
 * router -> decode; same-host wall clocks). */
static void dec_note_import(dec_t *d, dec_req_t *r)
{
    dec_req_flag(r, DEC_RF_IMPORTED, true);
    uint64_t arrival = pd_wall_ns() - (pd_now_ns() - r->t[DEC_ST_NEW]);
    if (r->imp.h.expiry_wall_ns > arrival)
        pd_stats_observe_ns(d->n.stats, DEC_STAT_lease_left, r->imp.h.expiry_wall_ns - arrival);
}

static void dec_start_pull(dec_t *d, dec_req_t *r)
{
    kvx_reject_t why = 0;
    pd_status_t st = dec_req_is(r, DEC_RF_IMPORTED) ? PD_OK /* while waiting, see dec_wait_import */
                   : node_import(&d->n, r->handle, r->handle_len, &r->imp, &why);
    dec_req_set_state(r, DEC_ST_PULLING);
    if (st != PD_OK) {
        pd_stats_inc(d->n.stats, DEC_STAT_pulls_failed);
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "KV handle from %s rejected: %s (%s)", r->peer,
               pd_status_str(st), kvx_reject_name(why));
        dec_req_end(r, PROTO_FINISH_ERROR, st);
        return;
    }
    if (!dec_req_is(r, DEC_RF_IMPORTED))
        dec_note_import(d, r);
    uint32_t nb = (r->kv_pull + d->n.geom->block_tokens - 1) / d->n.geom->block_tokens;
    uint64_t budget = d->cfg.transfer_timeout_ns;
    if (dec_req_is(r, DEC_RF_T0_WAIT) && r->budget_ns != 0)
        budget = r->budget_ns; /* early hand-off: the prompt pass runs inside this
                                * pull (a lost prefill ends it: PEER_DOWN) */
    else if (r->budget_ns != 0 && r->budget_ns < budget)
        budget = r->budget_ns;
    /* incremental: the blocks we share from the prefix cache are skipped */
    st = node_pull_start(&d->n, &r->imp, r->nr.blocks, nb, r->n_reused, budget, dec_pull_done, r,
                         &r->pull_id);
    if (st != PD_INPROGRESS) {
        pd_stats_inc(d->n.stats, DEC_STAT_pulls_failed);
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "KV pull from %s not started: %s", r->peer,
               pd_status_str(st));
        dec_req_end(r, PROTO_FINISH_ERROR, st);
        return;
    }
    dec_req_flag(r, DEC_RF_PULL_LIVE, true);
}

/* Lease renewal while waiting: the prefill's lease runs out while the
 * request sits in the wait queue, so the handle is imported (validated) on
 * entering WAITING and the lease renewed at once, then at half the TTL,
 * each time for the TTL the handle had left at import, at most
 * DEC_RENEW_TTL_MAX_NS (the exporter caps it too). */
#define DEC_RENEW_TTL_MAX_NS (10 * PD_NS_PER_S)
static void dec_renew_arm(dec_req_t *r, uint64_t in_ns)
{
    struct timeval tv = pd_ns_to_timeval(in_ns);
    (void)event_add(r->renew_ev, &tv);
}

static void dec_renew_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dec_req_t *r = arg;
    dec_t *d = r->d;
    if (r->state != DEC_ST_WAITING || !dec_req_is(r, DEC_RF_IMPORTED))
        return;
    pd_status_t st = kvx_lease_renew(d->n.kvx, &r->imp, r->renew_ttl_ns);
    if (st != PD_OK) { /* the pull will tell (stale / peer gone) */
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "lease renewal to %s not sent: %s", r->peer,
               pd_status_str(st));
        return;
    }
    pd_stats_inc(d->n.stats, DEC_STAT_lease_renews);
    r->imp.h.expiry_wall_ns = pd_wall_ns() + r->renew_ttl_ns;
    dec_renew_arm(r, r->renew_ttl_ns / 2);
}

/* Import r's handle now (it is going to wait) and arm the renewal. false:
 * ended with an ERROR (handle rejected). */
static bool dec_wait_import(dec_t *d, dec_req_t *r)
{
    kvx_reject_t why = 0;
    pd_status_t st = node_import(&d->n, r->handle, r->handle_len, &r->imp, &why);
    if (st != PD_OK) {
        pd_stats_inc(d->n.stats, DEC_STAT_pulls_failed);
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "KV handle from %s rejected: %s (%s)", r->peer,
               pd_status_str(st), kvx_reject_name(why));
        dec_req_end(r, PROTO_FINISH_ERROR, st);
        return false;
    }
    dec_note_import(d, r);
    uint64_t now = pd_wall_ns();
    uint64_t left = r->imp.h.expiry_wall_ns > now ? r->imp.h.expiry_wall_ns - now : 0;
    r->renew_ttl_ns = left > 1000000 ? left : 1000000;
    if (r->renew_ttl_ns > DEC_RENEW_TTL_MAX_NS)
        r->renew_ttl_ns = DEC_RENEW_TTL_MAX_NS;
    r->renew_ev = event_new(pd_loop_base(d->n.loop), -1, 0, dec_renew_cb, r);
    /* the first renewal at once: a streamed export's handle (kv-stream =
     * layer) states the TTL of its prompt pass, but the lease became
     * lease-ttl at PREFILL_DONE and may run out long before the handle
     * says; renewed now, it lasts what we ask (the exporter caps it) */
    if (r->renew_ev != NULL)
        dec_renew_arm(r, 0);
    return true;
}

/* ---- admission ---------------------------------------------------------- */

/* No room now: to the back of the wait queue. */
static void dec_wait(dec_t *d, dec_req_t *r)
{
    dec_req_set_state(r, DEC_ST_WAITING);
    if (d->wait_tail)
        d->wait_tail->wnext = r;
    else
        d->wait_head = r;
    d->wait_tail = r;
    d->n_waiting++;
    pd_stats_gauge_set(d->n.stats, DEC_STAT_waiting, d->n_waiting);
}

/* Reserve blocks and start; false if no room now. */
static bool dec_try_start(dec_t *d, dec_req_t *r)
{
    if (d->n_active >= d->cfg.max_batch || r->nr.n_blocks > node_kv_available(&d->n))
        return false;
    /* the longest cached prefix of the prompt: pulled requests skip those
     * blocks, local ones compute from there (never the last prompt token:
     * its logits give token 0) */
    uint32_t m = 0;
    if (d->n.prefix != NULL)
        m = kvx_prefix_match(d->n.prefix, r->partition, r->tok,
                             dec_req_is(r, DEC_RF_LOCAL) ? r->n_prompt - 1 : r->n_prompt,
                             r->nr.blocks, r->nr.n_blocks);
    pd_status_t st = d->n.prefix != NULL
                         ? kvx_prefix_alloc(d->n.prefix, r->nr.n_blocks - m, r->nr.blocks + m)
                         : kvx_blocks_alloc(d->n.blocks, r->nr.n_blocks, r->nr.blocks);
    if (st != PD_OK) { /* cannot happen after the check above; stay queued */
        (void)kvx_blocks_unref(d->n.blocks, r->nr.blocks, m, NULL);
        return false;
    }
    r->nr.blocks_held = true;
    r->n_reused = m;
    if (dec_req_is(r, DEC_RF_LOCAL))
        r->kv_have = m * d->n.geom->block_tokens;
    pd_stats_add(d->n.stats, DEC_STAT_cached_tokens, (uint64_t)m * d->n.geom->block_tokens);
    pd_stats_add(d->n.stats, DEC_STAT_saved_bytes, (uint64_t)m * d->n.geom->block_bytes);
    if (!dec_req_is(r, DEC_RF_LOCAL))
        dec_start_pull(d, r);
    else
        dec_start_compute(d, r);
    return true;
}

/* r's prompt KV is complete: its full blocks go to the prefix cache (so
 * that its forks match them: shared, refcounted, never pulled or computed
 * again; each fork computes only the prompt's last partial block) and the
 * parked forks start in the order they came. Without a prefix cache the
 * forks compute their whole prompt. */
static void dec_fork_release(dec_t *d, dec_req_t *r)
{
    if (d->n.prefix != NULL)
        (void)kvx_prefix_insert(d->n.prefix, r->partition, r->tok, r->n_prompt, r->nr.blocks,
                                r->nr.n_blocks, NULL);
    dec_req_t *list = NULL; /* reverse: the list is newest first */
    while (r->forks != NULL) {
        dec_req_t *f = r->forks;
        r->forks = f->fork_next;
        f->fork_next = list;
        list = f;
    }
    while (list != NULL) {
        dec_req_t *f = list;
        list = f->fork_next;
        f->fork_next = NULL;
        f->fork_parent = NULL;
        if (!dec_try_start(d, f))
            dec_wait(d, f);
    }
}

/* r ends: forks still parked on it end with an ERROR (the router starts
 * them elsewhere); a parked fork that ends leaves its parent's list. */
static void dec_forks_end(dec_t *d, dec_req_t *r, pd_status_t status)
{
    if (r->fork_parent != NULL) {
        dec_req_t **pp = &r->fork_parent->forks;
        while (*pp != NULL && *pp != r)
            pp = &(*pp)->fork_next;
        if (*pp == r)
            *pp = r->fork_next;
        r->fork_parent = NULL;
        r->fork_next = NULL;
    }
    while (r->forks != NULL) {
        dec_req_t *f = r->forks;
        r->forks = f->fork_next;
        f->fork_next = NULL;
        f->fork_parent = NULL;
        dec_req_end(f, PROTO_FINISH_ERROR, status == PD_OK ? PD_ERR_CANCELED : status);
    }
}

static void dec_admit_waiting(dec_t *d)
{
    while (d->wait_head != NULL && !d->n.stopping) {
        dec_req_t *r = d->wait_head;
        if (!dec_try_start(d, r))
            break;
    }
}

/* Best effort: give the exporter its blocks back for a handle we will not
 * pull (validated first; nothing happens for garbage). */
static void dec_release_handle(dec_t *d, const proto_blob_t *h)
{
    if (h->len == 0)
        return;
    kvx_import_t imp;
    if (node_import(&d->n, h->p, h->len, &imp, NULL) == PD_OK)
        (void)kvx_lease_release(d->n.kvx, &imp);
}

/* One DECODE_REQ (or a fork of one: parent != NULL, parked on the parent
 * until its prompt's KV is complete) admitted, queued or refused. Returns
 * the request if it is live (not ended already). */
static dec_req_t *dec_admit(dec_t *d, node_link_t *from, const proto_decode_req_t *q,
                            dec_req_t *parent)
{
    uint32_t ctx = d->n.geom->context_length, vocab = d->n.geom->vocab_size;
    uint32_t np = q->prompt.n, ng = q->generated.n;
    bool local = (q->flags & PROTO_DEC_PREFILL_LOCALLY) != 0;
    bool t0_later = (q->flags & PROTO_DEC_TOKEN0_LATER) != 0; /* proto checked: ng 0 */
    pd_status_t st = PD_OK;
    const char *why = "";
    eng_sample_params_t sp;
    if (d->n.draining || d->n.stopping) {
        st = PD_ERR_SHUTDOWN; why = "draining";
    } else if (dec_req_find(d, from, q->request_id) != NULL) {
        st = PD_ERR_EXISTS; why = "request id already live";
    } else if (np == 0) {
        st = PD_ERR_BAD_INPUT; why = "empty prompt";
    } else if ((uint64_t)np + ng >= ctx) {
        st = PD_ERR_TOO_BIG; why = "prompt + generated reach the context length";
    } else if (!local && ((ng == 0 && !t0_later) || q->kv_handle.len == 0)) {
        st = PD_ERR_BAD_INPUT; why = "a KV handle needs generated = [token 0]";
    } else if (node_sampling(&d->n, &q->sampling, &sp) != PD_OK) {
        st = PD_ERR_BAD_INPUT; why = "bad sampling parameters";
    }
    for (uint32_t i = 0; st == PD_OK && i < np + ng; i++) {
        int32_t t = i < np ? proto_tokens_get(&q->prompt, i) : proto_tokens_get(&q->generated, i - np);
        if ((uint32_t)t >= vocab) {
            st = PD_ERR_BAD_INPUT; why = "token id out of range";
        }
    }
    uint32_t max_pos = ctx;
    if (st == PD_OK && sp.max_tokens != 0 && (uint64_t)np + sp.max_tokens < ctx)
        max_pos = np + sp.max_tokens;
    uint32_t nb = (max_pos + d->n.geom->block_tokens - 1) / d->n.geom->block_tokens;
    if (st == PD_OK && nb > kvx_blocks_total(d->n.blocks)) {
        st = PD_ERR_NO_KV_SPACE; why = "request larger than the whole KV pool";
    }
    if (st == PD_OK && d->n_waiting >= d->cfg.max_queue &&
        (d->n_active >= d->cfg.max_batch || nb > node_kv_available(&d->n))) {
        st = d->n_active >= d->cfg.max_batch ? PD_ERR_OVERLOADED : PD_ERR_NO_KV_SPACE;
        why = "no room and the wait queue is full";
    }
    dec_req_t *r = NULL;
    if (st == PD_OK) {
        r = calloc(1, sizeof(*r));
        if (r == NULL || (r->tok = malloc(((size_t)max_pos + 1) * sizeof(int32_t))) == NULL ||
            (r->nr.blocks = malloc((size_t)nb * sizeof(uint32_t))) == NULL ||
            (!local && (r->handle = malloc(q->kv_handle.len)) == NULL)) {
            if (r)
                dec_req_free(r);
            r = NULL;
            st = PD_ERR_NO_MEMORY; why = "out of memory";
        }
    }
    if (st != PD_OK) {
        pd_stats_inc(d->n.stats, DEC_STAT_rejected);
        pd_log(PD_LOG_DEBUG, DEC_COMP, q->request_id, "rejected: %s", why);
        if (st != PD_ERR_EXISTS)
            dec_release_handle(d, &q->kv_handle);
        node_send_error(&d->n, from, q->request_id, st, "%s", why);
        return NULL;
    }
    r->d = d;
    snprintf(r->nr.id, sizeof(r->nr.id), "%s", q->request_id);
    snprintf(r->peer, sizeof(r->peer), "%s", q->prefill_peer_id);
    dec_req_flag(r, DEC_RF_LOCAL, local);
    dec_req_flag(r, DEC_RF_T0_WAIT, t0_later);
    r->cap = max_pos + 1;
    r->max_pos = max_pos;
    r->n_prompt = proto_tokens_copy(&q->prompt, r->tok, np);
    r->n_gen_given = proto_tokens_copy(&q->generated, r->tok + np, ng);
    r->partition = q->cache_partition;
    r->kv_pull = q->kv_tokens != 0 ? q->kv_tokens : np; /* proto_msg checked the range */
    r->nr.n_blocks = nb;
    r->budget_ns = q->deadline_ns;
    r->lp_on = q->sampling.logprobs != 0;
    r->lp_top = q->sampling.top_logprobs;
    if (!local) {
        memcpy(r->handle, q->kv_handle.p, q->kv_handle.len);
        r->handle_len = q->kv_handle.len;
    }
    r->state = DEC_ST_NEW;
    r->t[DEC_ST_NEW] = pd_now_ns();
    node_req_link(&d->n, from, &r->nr);
    pd_stats_inc(d->n.stats, DEC_STAT_accepted);

    /* grammar + sampler continuity: replay the tokens already generated */
    pd_status_t gst = node_gram_start(&d->n, &q->sampling, &r->gram);
    for (uint32_t i = 0; gst == PD_OK && i < ng; i++)
        if (!node_gram_take(&d->n, &r->gram, r->tok[np + i]))
            gst = PD_ERR_BAD_INPUT;
    if (gst != PD_OK) {
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "response_format: %s", pd_status_str(gst));
        if (!local)
            dec_release_handle(d, &q->kv_handle);
        dec_req_end(r, PROTO_FINISH_ERROR, gst);
        return NULL;
    }
    eng_sampler_init(&r->smp, &sp);
    eng_finish_t f = ENG_FINISH_NONE;
    for (uint32_t i = 0; i < ng; i++) {
        if (f != ENG_FINISH_NONE) {
            dec_req_end(r, PROTO_FINISH_ERROR, PD_ERR_BAD_INPUT); /* ended mid-list */
            return NULL;
        }
        f = eng_sampler_replay(&r->smp, r->tok[np + i]);
        r->n_gen++;
        if (f == ENG_FINISH_NONE && np + r->n_gen >= max_pos)
            f = ENG_FINISH_LENGTH;
    }
    if (q->rng_state != 0 && q->rng_state != r->smp.rng.s[0]) {
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "sampler state mismatch after replay");
        dec_req_end(r, PROTO_FINISH_ERROR, PD_ERR_MISMATCH);
        return NULL;
    }
    if (f != ENG_FINISH_NONE) { /* the given tokens already end it */
        if (!local)
            dec_release_handle(d, &q->kv_handle);
        dec_req_end(r, f == ENG_FINISH_STOP ? PROTO_FINISH_STOP : PROTO_FINISH_LENGTH, PD_OK);
        return NULL;
    }
    if (parent != NULL) { /* parked: dec_fork_release starts it */
        r->fork_parent = parent;
        r->fork_next = parent->forks;
        parent->forks = r;
        return r;
    }
    if (!dec_try_start(d, r)) {
        dec_wait(d, r);
        if (!local && !dec_wait_import(d, r))
            return NULL;
    }
    return dec_terminal(r->state) ? NULL : r;
}

/* n > 1: the n_fork extra choices, decode-local forks of q's prompt that
 * start once r's prompt KV is complete (dec_fork_release) and share its
 * full blocks through the prefix cache. Refused with r: each gets its
 * ERROR so that the router starts it elsewhere. */
static void dec_on_decode_req(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    dec_t *d = PD_CONTAINER_OF(node, dec_t, n);
    const proto_decode_req_t *q = &msg->u.decode_req;
    dec_req_t *r = dec_admit(d, from, q, NULL);
    for (uint32_t i = 1; i <= q->n_fork; i++) {
        proto_decode_req_t f = *q;
        snprintf(f.request_id, sizeof(f.request_id), "%s/%u", q->request_id, i);
        if (r == NULL || (r->state != DEC_ST_NEW && r->state != DEC_ST_WAITING &&
                          r->state != DEC_ST_PULLING && r->state != DEC_ST_PREFILLING)) {
            node_send_error(&d->n, from, f.request_id, PD_ERR_CANCELED, "the request it forks from %s",
                            r == NULL ? "was refused or ended" : "already runs");
            continue;
        }
        f.flags = PROTO_DEC_PREFILL_LOCALLY;
        f.generated.n = 0;
        f.rng_state = 0;
        f.prefill_peer_id[0] = '\0';
        f.lease_id = 0;
        f.kv_handle = (proto_blob_t){ NULL, 0 };
        f.kv_tokens = 0;
        f.n_fork = 0;
        f.sampling.seed = q->sampling.seed + i;
        (void)dec_admit(d, from, &f, r);
    }
}

static void dec_req_cancel(dec_t *d, dec_req_t *r)
{
    if (dec_req_is(r, DEC_RF_T0_WAIT)) /* an early hand-off the router gave up (prefill failed,
                     * token 0 ended the request); answered as any cancel */
        pd_stats_inc(d->n.stats, DEC_STAT_early_canceled);
    if (r->state == DEC_ST_MIGRATING) {
        dec_req_flag(r, DEC_RF_CANCEL, true);
        (void)kvx_lease_revoke(d->n.kvx, r->mig_lease); /* -> dec_on_lease_end */
        return;
    }
    if (dec_req_is(r, DEC_RF_PULL_LIVE)) {
        dec_req_flag(r, DEC_RF_CANCEL, true);
        (void)kvx_pull_cancel(d->n.kvx, r->pull_id); /* -> dec_pull_done */
        return;
    }
    dec_req_end(r, PROTO_FINISH_CANCELED, PD_ERR_CANCELED);
}

static void dec_on_cancel(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    dec_t *d = PD_CONTAINER_OF(node, dec_t, n);
    dec_req_t *r = dec_req_find(d, from, msg->u.cancel.request_id);
    if (r != NULL && !dec_req_is(r, DEC_RF_CANCEL)) {
        dec_req_flag(r, DEC_RF_CANCEL_STOP, msg->u.cancel.status == PD_OK); /* PROTOCOL.md: CANCEL */
        dec_req_cancel(d, r);
    }
}

/* FIRST_TOKEN: token 0 of a DECODE_REQ sent with TOKEN0_LATER. Replayed
 * like DECODE_REQ.generated; the first step starts once the pull landed
 * too. Dropped for an unknown or ended request; for a request not waiting
 * for it (a second token 0) it is an error that ends the request. */
static void dec_on_first_token(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    dec_t *d = PD_CONTAINER_OF(node, dec_t, n);
    const proto_first_token_t *ft = &msg->u.first_token;
    dec_req_t *r = dec_req_find(d, from, ft->request_id);
    if (r == NULL || dec_req_is(r, DEC_RF_CANCEL) || dec_terminal(r->state)) {
        pd_log(PD_LOG_DEBUG, DEC_COMP, ft->request_id, "FIRST_TOKEN for no live request: dropped");
        return;
    }
    int32_t t = ft->first_token;
    pd_status_t st = PD_OK;
    if (!dec_req_is(r, DEC_RF_T0_WAIT)) {
        st = PD_ERR_BAD_INPUT;
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "FIRST_TOKEN for a request not waiting for one");
    } else if ((uint32_t)t >= d->n.geom->vocab_size) {
        st = PD_ERR_BAD_INPUT;
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "FIRST_TOKEN id %d out of range", t);
    } else if (!node_gram_take(&d->n, &r->gram, t)) {
        st = PD_ERR_BAD_INPUT;
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "FIRST_TOKEN %d refused by the grammar", t);
    }
    if (st != PD_OK) {
        dec_req_end(r, PROTO_FINISH_ERROR, st);
        return;
    }
    /* the replay of dec_admit for one given token */
    dec_req_flag(r, DEC_RF_T0_WAIT, false);
    r->t0_at_ns = pd_now_ns();
    eng_finish_t f = eng_sampler_replay(&r->smp, t);
    r->tok[r->n_prompt] = t;
    r->n_gen = r->n_gen_given = 1;
    if (f == ENG_FINISH_NONE && r->n_prompt + r->n_gen >= r->max_pos)
        f = ENG_FINISH_LENGTH;
    if (ft->rng_state != 0 && ft->rng_state != r->smp.rng.s[0]) {
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "sampler state mismatch after token 0");
        dec_req_end(r, PROTO_FINISH_ERROR, PD_ERR_MISMATCH);
        return;
    }
    pd_stats_inc(d->n.stats, DEC_STAT_early_handoffs);
    if (f != ENG_FINISH_NONE) { /* token 0 already ends it */
        dec_req_end(r, f == ENG_FINISH_STOP ? PROTO_FINISH_STOP : PROTO_FINISH_LENGTH, PD_OK);
        return;
    }
    if (dec_req_is(r, DEC_RF_T0_PULLED)) { /* the pull is done: run now, then the lease goes */
        dec_req_flag(r, DEC_RF_T0_PULLED, false);
        dec_start_compute(d, r);
        (void)kvx_lease_release(d->n.kvx, &r->imp);
        dec_req_flag(r, DEC_RF_IMPORTED, false);
    } /* else dec_pull_done starts it */
}

/* ---- live migration (this decode hands a stream on) ---------------------- */

/* r is RUNNING, out of the step, all its tokens sent: export the KV of its
 * prompt + generated tokens but the last (the next step's input) to the
 * target under a lease, tell the router (MIGRATE_DONE) and wait for the
 * lease to end. If the export fails the stream simply goes on here. */
static void dec_migrate_out(dec_t *d, dec_req_t *r)
{
    uint32_t kv = r->n_prompt + r->n_gen - 1;
    uint32_t nb = (kv + d->n.geom->block_tokens - 1) / d->n.geom->block_tokens;
    uint8_t handle[KVX_HANDLE_MAX_BYTES];
    size_t hlen = 0;
    pd_status_t st = r->n_gen == 0 || !dec_can_reply(d, r)
                         ? PD_ERR_BAD_INPUT
                         : node_export(&d->n, &r->nr, r->migrate_to, r->nr.blocks, nb,
                                       d->cfg.lease_ttl_ns, handle, sizeof(handle), &hlen,
                                       &r->mig_lease);
    if (st != PD_OK) {
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "migration to %s not possible (%s): staying",
               r->migrate_to, pd_status_str(st));
        dec_req_flag(r, DEC_RF_MIGRATE, false);
        dec_kick(d);
        return;
    }
    dec_req_set_state(r, DEC_ST_MIGRATING);
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_MIGRATE_DONE;
    proto_migrate_done_t *md = &m.u.migrate_done;
    snprintf(md->request_id, sizeof(md->request_id), "%s", r->nr.id);
    md->n_gen = r->n_gen;
    md->kv_tokens = kv;
    md->lease_id = node_lease_wire_id(r->mig_lease);
    md->lease_ns = d->cfg.lease_ttl_ns;
    md->kv_handle.p = handle;
    md->kv_handle.len = (uint32_t)hlen;
    st = node_req_send(&d->n, &r->nr, &m);
    pd_log(PD_LOG_INFO, DEC_COMP, r->nr.id, "migrating to %s after %u tokens (%u KV blocks)%s%s",
           r->migrate_to, r->n_gen, nb, st == PD_OK ? "" : ": MIGRATE_DONE not sent: ",
           st == PD_OK ? "" : pd_status_str(st));
    if (st != PD_OK)
        (void)kvx_lease_revoke(d->n.kvx, r->mig_lease); /* -> dec_on_lease_end */
    dec_kick(d);
}

/* The migration's lease ended: released by the target after its pull (the
 * stream lives there now), or expired / revoked (the router has failed the
 * stream over, or it ended). Either way it ends here without a reply. */
static bool dec_export_lease_end(dec_t *d, node_req_t *nr, kvx_lease_end_t why);

static void dec_on_lease_end(node_t *n, node_req_t *nr, kvx_lease_end_t why)
{
    dec_t *d = (dec_t *)n;
    if (dec_export_lease_end(d, nr, why))
        return; /* a cached prefix exported to a prefill */
    dec_req_t *r = NODE_REQ(nr, dec_req_t);
    if (r->state != DEC_ST_MIGRATING) {
        pd_log(PD_LOG_ERROR, DEC_COMP, r->nr.id, "lease end in state %s",
               dec_state_names[r->state]);
        return;
    }
    pd_stats_inc(d->n.stats, why == KVX_LEASE_RELEASED ? DEC_STAT_migrated_out
                                                       : DEC_STAT_migrations_lost);
    if (why != KVX_LEASE_RELEASED)
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "migration lease %s",
               why == KVX_LEASE_EXPIRED ? "expired unpulled" : "revoked");
    pd_stats_observe_ns(d->n.stats, DEC_STAT_req_time, pd_now_ns() - r->t[DEC_ST_NEW]);
    dec_req_set_state(r, dec_req_is(r, DEC_RF_CANCEL) ? DEC_ST_CANCELED : DEC_ST_FINISHED);
}

static void dec_on_migrate(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    dec_t *d = PD_CONTAINER_OF(node, dec_t, n);
    const proto_migrate_t *m = &msg->u.migrate;
    dec_req_t *r = dec_req_find(d, from, m->request_id);
    if (r == NULL || dec_req_is(r, DEC_RF_CANCEL | DEC_RF_FINISHING | DEC_RF_MIGRATE) ||
        dec_terminal(r->state) ||
        r->state == DEC_ST_MIGRATING || strcmp(m->target_decode_id, d->n.daemon_id) == 0) {
        pd_log(PD_LOG_DEBUG, DEC_COMP, m->request_id, "MIGRATE ignored (%s)",
               r == NULL ? "not here" : "ending or moving");
        return;
    }
    dec_req_flag(r, DEC_RF_MIGRATE, true);
    snprintf(r->migrate_to, sizeof(r->migrate_to), "%s", m->target_decode_id);
    if (r->state == DEC_ST_RUNNING && !dec_req_is(r, DEC_RF_IN_STEP))
        dec_migrate_out(d, r);
    /* else: after its step (dec_step_done), or once its pull / prefill
     * made it RUNNING (dec_start_compute, dec_step_done) */
}

/* ---- cached prefixes exported to a prefill (KV_EXPORT_REQ) ----------------- */

/* The export of request id from router link l (ids are unique per router
 * only). */
static dec_export_t *dec_export_find(dec_t *d, const node_link_t *l, const char *id,
                                     uint64_t lease_id)
{
    for (dec_export_t *x = d->exports; x != NULL; x = x->next)
        if (x->nr.link == l && strcmp(x->nr.id, id) == 0 &&
            (lease_id == 0 || lease_id == node_lease_wire_id(x->lease)))
            return x;
    return NULL;
}

/* nr is an export's: its lease ended. Drop the block references (the
 * blocks stay cached; nothing else is freed), unlink, free. false: nr is
 * a request's. */
static bool dec_export_lease_end(dec_t *d, node_req_t *nr, kvx_lease_end_t why)
{
    dec_export_t **pp = &d->exports;
    while (*pp != NULL && &(*pp)->nr != nr)
        pp = &(*pp)->next;
    if (*pp == NULL)
        return false;
    dec_export_t *x = *pp;
    *pp = x->next;
    d->n_exports--;
    pd_stats_gauge_set(d->n.stats, DEC_STAT_exports_live, d->n_exports);
    if (why != KVX_LEASE_RELEASED)
        pd_stats_inc(d->n.stats, DEC_STAT_prefix_exports_unpulled);
    pd_log(why == KVX_LEASE_RELEASED ? PD_LOG_DEBUG : PD_LOG_INFO, DEC_COMP, x->nr.id,
           "prefix export to %s (%u blocks) %s after %.3f ms", x->target, x->nr.n_blocks,
           why == KVX_LEASE_RELEASED ? "released" : why == KVX_LEASE_EXPIRED ? "expired"
                                                                              : "revoked",
           (double)(pd_now_ns() - x->start_ns) / 1e6);
    if (x->nr.blocks_held &&
        kvx_blocks_unref(d->n.blocks, x->nr.blocks, x->nr.n_blocks, NULL) != PD_OK)
        pd_log(PD_LOG_ERROR, DEC_COMP, x->nr.id, "export: dropping %u block references failed",
               x->nr.n_blocks);
    free(x->nr.blocks);
    free(x);
    dec_admit_waiting(d); /* the blocks may be evictable again */
    return true;
}

/* KV_EXPORT_REQ: the router wants the prefill target_prefill_id to pull
 * our cached KV of this prompt's prefix (turn k+1 of a conversation whose
 * turn k ran here). Match the cache (never the last prompt token), hold
 * references on the matched blocks, export them to the prefill under a
 * lease, KV_EXPORT_DONE; the references go when the lease ends. Refused
 * with ERROR (NOT_FOUND: less than min_tokens cached) and nothing held. */
static void dec_on_kv_export_req(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    dec_t *d = PD_CONTAINER_OF(node, dec_t, n);
    const proto_kv_export_req_t *q = &msg->u.kv_export_req;
    uint32_t bt = d->n.geom->block_tokens, n = q->prompt.n;
    uint32_t want = q->min_tokens > 0 ? q->min_tokens : 1;
    pd_status_t st = PD_OK;
    const char *why = "";
    if (d->n.draining || d->n.stopping) {
        st = PD_ERR_SHUTDOWN; why = "draining";
    } else if (d->n.prefix == NULL) {
        st = PD_ERR_NOT_FOUND; why = "no prefix cache";
    } else if (n >= d->n.geom->context_length) {
        st = PD_ERR_TOO_BIG; why = "prompt reaches the context length";
    } else if ((n - 1) / bt * bt < want) {
        st = PD_ERR_NOT_FOUND; why = "prompt shorter than min_tokens";
    } else if (d->n_exports >= DEC_MAX_EXPORTS) {
        st = PD_ERR_OVERLOADED; why = "too many prefix exports";
    } else if (dec_export_find(d, from, q->request_id, 0) != NULL) {
        st = PD_ERR_EXISTS; why = "export already live";
    }
    uint32_t nb = (n - 1) / bt;
    dec_export_t *x = NULL;
    int32_t *tok = NULL;
    if (st == PD_OK) {
        x = calloc(1, sizeof(*x));
        tok = malloc((size_t)nb * bt * sizeof(int32_t));
        if (x == NULL || tok == NULL ||
            (x->nr.blocks = malloc((size_t)nb * sizeof(uint32_t))) == NULL) {
            st = PD_ERR_NO_MEMORY; why = "out of memory";
        }
    }
    uint32_t m = 0;
    if (st == PD_OK) {
        for (uint32_t i = 0; i < nb * bt; i++)
            tok[i] = proto_tokens_get(&q->prompt, i);
        m = kvx_prefix_match(d->n.prefix, q->cache_partition, tok, nb * bt, x->nr.blocks, nb);
        if (m * bt < want) {
            st = PD_ERR_NOT_FOUND; why = "not enough of the prompt cached";
            (void)kvx_blocks_unref(d->n.blocks, x->nr.blocks, m, NULL);
        }
    }
    free(tok);
    uint8_t handle[KVX_HANDLE_MAX_BYTES];
    size_t hlen = 0;
    uint32_t taken = 0;
    if (st == PD_OK) {
        snprintf(x->nr.id, sizeof(x->nr.id), "%s", q->request_id);
        x->nr.link = from; /* answered there, revoked when that router is lost */
        x->nr.epoch = from != NULL ? from->epoch : 0;
        x->nr.n_blocks = m;
        x->nr.blocks_held = true;
        st = node_export_part(&d->n, &x->nr, q->target_prefill_id, x->nr.blocks, m,
                              d->cfg.lease_ttl_ns, handle, sizeof(handle), &hlen, &x->lease,
                              &taken);
        if (st != PD_OK) {
            why = "kv export";
            (void)kvx_blocks_unref(d->n.blocks, x->nr.blocks, m, NULL);
        } else if (taken < m) { /* more runs than one handle holds: the first ones */
            (void)kvx_blocks_unref(d->n.blocks, x->nr.blocks + taken, m - taken, NULL);
            x->nr.n_blocks = m = taken;
        }
    }
    if (st != PD_OK) {
        if (x != NULL)
            free(x->nr.blocks);
        free(x);
        pd_stats_inc(d->n.stats, DEC_STAT_prefix_exports_refused);
        pd_log(PD_LOG_DEBUG, DEC_COMP, q->request_id, "prefix export refused: %s", why);
        node_send_error(&d->n, from, q->request_id, st == PD_ERR_NO_SPACE ? PD_ERR_OVERLOADED : st,
                        "prefix export: %s", why);
        return;
    }
    snprintf(x->target, sizeof(x->target), "%s", q->target_prefill_id);
    x->start_ns = pd_now_ns();
    x->next = d->exports;
    d->exports = x;
    d->n_exports++;
    pd_stats_gauge_set(d->n.stats, DEC_STAT_exports_live, d->n_exports);
    pd_stats_inc(d->n.stats, DEC_STAT_prefix_exports);
    pd_stats_add(d->n.stats, DEC_STAT_prefix_export_tokens, (uint64_t)m * bt);
    proto_msg_t out;
    memset(&out, 0, sizeof(out));
    out.hdr.type = PROTO_MSG_KV_EXPORT_DONE;
    proto_kv_export_done_t *xd = &out.u.kv_export_done;
    snprintf(xd->request_id, sizeof(xd->request_id), "%s", q->request_id);
    xd->kv_tokens = m * bt;
    xd->lease_id = node_lease_wire_id(x->lease);
    xd->lease_ns = d->cfg.lease_ttl_ns;
    xd->kv_handle.p = handle;
    xd->kv_handle.len = (uint32_t)hlen;
    st = node_req_send(&d->n, &x->nr, &out);
    pd_log(PD_LOG_DEBUG, DEC_COMP, q->request_id, "prefix of %u tokens (%u blocks) exported to %s%s%s",
           m * bt, m, x->target, st == PD_OK ? "" : ": KV_EXPORT_DONE not sent: ",
           st == PD_OK ? "" : pd_status_str(st));
    if (st != PD_OK)
        (void)kvx_lease_revoke(d->n.kvx, x->lease); /* -> dec_export_lease_end */
}

/* Router `from` lost (NULL: teardown, all): the leases of the exports it
 * asked for end now (it will not hand them on). */
static void dec_exports_revoke(dec_t *d, const node_link_t *from)
{
    dec_export_t *x = d->exports, *next;
    for (; x != NULL; x = next) {
        next = x->next;
        if (from == NULL || x->nr.link == from)
            (void)kvx_lease_revoke(d->n.kvx, x->lease); /* may unlink and free x */
    }
}

/* RELEASE of a migration's lease: the router will not forward the handle
 * (the request ended, or the target is gone): revoke it now. The same for
 * an export's lease (the router will not send the PREFILL_REQ with it). */
static void dec_on_release(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    dec_t *d = PD_CONTAINER_OF(node, dec_t, n);
    dec_export_t *x = dec_export_find(d, from, msg->u.release.request_id,
                                      msg->u.release.lease_id);
    if (x != NULL && msg->u.release.lease_id != 0) {
        (void)kvx_lease_revoke(d->n.kvx, x->lease); /* -> dec_export_lease_end */
        return;
    }
    dec_req_t *r = dec_req_find(d, from, msg->u.release.request_id);
    if (r == NULL || r->state != DEC_ST_MIGRATING)
        return;
    if (msg->u.release.lease_id != 0 && msg->u.release.lease_id != node_lease_wire_id(r->mig_lease)) {
        pd_log(PD_LOG_WARN, DEC_COMP, r->nr.id, "RELEASE with a foreign lease id ignored");
        return;
    }
    (void)kvx_lease_revoke(d->n.kvx, r->mig_lease); /* -> dec_on_lease_end */
}

/* ---- peers ---------------------------------------------------------------- */

/* prefills, and other decodes (a live migration pulls from one) */
static void dec_on_peer_info(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    node_peer_info(node, from, &msg->u.peer_info, 1u << PROTO_ROLE_PREFILL | 1u << PROTO_ROLE_DECODE);
}

static void dec_on_peer_down(node_t *node, node_link_t *from, const proto_msg_t *msg)
{
    node_peer_down(node, from, &msg->u.peer_down);
}

/* ---- node callbacks ----------------------------------------------------- */

/* A router lost (its requests; from NULL at teardown: all): end them
 * without a reply (a request in the step or in a pull ends when that comes
 * back), and forget that router's peer reports. */
static void dec_cancel_all(node_t *n, const node_link_t *from)
{
    dec_t *d = (dec_t *)n;
    dec_exports_revoke(d, from);
    node_peers_forget_link(n, from);
    NODE_FOR_EACH(n, dec_req_t, r) {
        if (from != NULL && r->nr.link != from)
            continue;
        dec_req_flag(r, DEC_RF_QUIET, true);
        if (!dec_req_is(r, DEC_RF_CANCEL))
            dec_req_cancel(d, r);
    }
}

static void dec_fill_hb(node_t *n, proto_heartbeat_t *hb)
{
    dec_t *d = (dec_t *)n;
    hb->queue_depth = d->n_waiting;
    hb->running_seqs = d->n_active;
    hb->leases = 0;
    uint64_t tok = 0;
    NODE_FOR_EACH(n, dec_req_t, r)
        if (r->state == DEC_ST_PREFILLING || r->state == DEC_ST_WAITING)
            tok += dec_req_is(r, DEC_RF_LOCAL) ? r->n_prompt + r->n_gen - r->kv_have : 0;
    hb->outstanding_prefill_tokens = tok;
}

/* ---- admin -------------------------------------------------------------- */

static void dec_adm_kv(node_t *n, cJSON *reply)
{
    dec_t *d = (dec_t *)n;
    cJSON_AddNumberToObject(reply, "running", d->n_active);
    cJSON_AddNumberToObject(reply, "waiting", d->n_waiting);
    uint32_t xb = 0;
    for (const dec_export_t *x = d->exports; x != NULL; x = x->next)
        xb += x->nr.n_blocks;
    cJSON_AddNumberToObject(reply, "exports", d->n_exports);
    cJSON_AddNumberToObject(reply, "export_blocks", xb);
}

static pd_status_t dec_adm_requests(pd_admin_req_t *req, cJSON *reply)
{
    dec_t *d = req->arg;
    cJSON *a = cJSON_AddArrayToObject(reply, "requests");
    uint64_t now = pd_now_ns();
    NODE_FOR_EACH(&d->n, dec_req_t, r) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "request_id", r->nr.id);
        cJSON_AddStringToObject(o, "state", dec_state_names[r->state]);
        cJSON_AddBoolToObject(o, "local", dec_req_is(r, DEC_RF_LOCAL));
        cJSON_AddNumberToObject(o, "prompt_tokens", r->n_prompt);
        cJSON_AddNumberToObject(o, "generated", r->n_gen);
        cJSON_AddNumberToObject(o, "blocks", r->nr.n_blocks);
        cJSON_AddNumberToObject(o, "age_ns", (double)(now - r->t[DEC_ST_NEW]));
        cJSON_AddNumberToObject(o, "transfer_ns", (double)r->transfer_ns);
        cJSON_AddNumberToObject(o, "handoff_ns", (double)r->handoff_ns);
        cJSON_AddNumberToObject(o, "prefill_ns", (double)r->prefill_ns);
        cJSON_AddNumberToObject(o, "first_token_wait_ns", (double)dec_first_token_wait_ns(r));
        cJSON_AddNumberToObject(o, "pull_after_first_token_ns", (double)dec_pull_after_t0_ns(r));
        cJSON_AddItemToArray(a, o);
    }
    node_adm_counters(&d->n, reply);
    /* decode-local chunks: what the next may take, and the step-time fit */
    cJSON *ch = cJSON_AddObjectToObject(reply, "chunking");
    cJSON_AddNumberToObject(ch, "budget_tokens", (double)pd_stats_gauge(d->n.stats,
                                                                        DEC_STAT_chunk_budget));
    cJSON_AddNumberToObject(ch, "prefill_chunk", (double)d->cfg.prefill_chunk);
    cJSON_AddNumberToObject(ch, "tpot_target_ns", (double)d->cfg.tpot_target_ns);
    cJSON_AddBoolToObject(ch, "fused_step", d->cfg.fused_step);
    /* per engine-thread count measured: the batch's step, a chunk token */
    cJSON *per = cJSON_AddArrayToObject(ch, "by_threads");
    for (uint32_t k = 1; k <= DEC_SM_THREADS; k++) {
        if (d->sm.n_base[k] == 0 && d->sm.n_tok[k] == 0)
            continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "threads", k);
        cJSON_AddNumberToObject(o, "batch_step_ns", d->sm.base_ns[k]);
        cJSON_AddNumberToObject(o, "chunk_token_ns", d->sm.tok_ns[k]);
        cJSON_AddItemToArray(per, o);
    }
    uint32_t ka = (uint32_t)pd_stats_gauge(d->n.stats, DEC_STAT_threads_active);
    ka = ka < 1 ? 1 : ka > DEC_SM_THREADS ? DEC_SM_THREADS : ka;
    cJSON_AddNumberToObject(ch, "batch_step_ns", d->sm.base_ns[ka]);
    cJSON_AddNumberToObject(ch, "chunk_token_ns", d->sm.tok_ns[ka]);
    cJSON_AddNumberToObject(ch, "threads", d->n.threads);
    cJSON_AddNumberToObject(ch, "threads_active", ka);
    return PD_OK;
}

static void dec_adm_session(node_t *n, cJSON *reply)
{
    node_adm_peers(n, reply);
}

static const pd_admin_cmd_t dec_cmds[] = {
    { "requests", PD_ADMIN_USER, dec_adm_requests, "requests - live requests and outcome counters" },
    PD_ADMIN_CMD_END,
};

/* ---- boot ----------------------------------------------------------------- */

static const pd_stat_desc_t dec_stat_descs[] = { DEC_STATS(PD_STAT_DESC) };
/* Prometheus: outcomes (and pulls) as labeled families, buckets fit for each figure */
static const pd_stat_prom_t dec_stat_prom[] = {
    NODE_REQ_STAT_PROM,
    PD_STAT_PROM_LABEL("pulls_ok", "pulls", "result", "ok", "KV imports + pulls, by result"),
    PD_STAT_PROM_LABEL("pulls_failed", "pulls", "result", "failed", NULL),
    PD_STAT_PROM_LE("step_time", US), PD_STAT_PROM_LE("transfer_time", MS),
    PD_STAT_PROM_LE("ttft", S), PD_STAT_PROM_LE("handoff", MS),
    PD_STAT_PROM_LE("lease_left", S), PD_STAT_PROM_LE("req_time", S),
};
static const pd_stats_table_t dec_stats_table =
    PD_STATS_TABLE_PROM("decode", dec_stat_descs, dec_stat_prom);

/* kvx: this node pulls, and exports for live migrations (lease ends come
 * to dec_on_lease_end through the node's table), so /metrics carries both
 * sides' counters. */
static void dec_kvx_config(node_t *n, kvx_config_t *kc)
{
    dec_t *d = (dec_t *)n;
    kc->stats_role = KVX_STATS_BOTH;
    kc->max_lease_ttl_ns = d->cfg.lease_ttl_ns > kc->max_lease_ttl_ns ? d->cfg.lease_ttl_ns
                                                                      : kc->max_lease_ttl_ns;
}

static const node_role_t dec_role = {
    .name = "decode", .schema = &dec_schema, .stats = &dec_stats_table,
    .proto_role = PROTO_ROLE_DECODE, .cpu_prio = 0,
    .caps = PROTO_CAP_DECODE | PROTO_CAP_PREFILL_LOCAL | PROTO_CAP_KV_IMPORT |
            PROTO_CAP_KV_EXPORT,
    .msgs = { .on_decode_req = dec_on_decode_req, .on_cancel = dec_on_cancel,
             .on_peer_info = dec_on_peer_info, .on_peer_down = dec_on_peer_down,
             .on_migrate = dec_on_migrate, .on_release = dec_on_release,
             .on_kv_export_req = dec_on_kv_export_req,
             .on_first_token = dec_on_first_token },
    .cancel_all = dec_cancel_all, .fill_hb = dec_fill_hb,
    .adm_kv = dec_adm_kv, .adm_session = dec_adm_session, .cmds = dec_cmds,
    .xfer_help = "xfer - kvxfer statistics (pulls per prefill peer)",
    .session_help = "session - router session state and peers",
    .on_lease_end = dec_on_lease_end,
};

/* After the kvx context is gone (its pulls failed, their callbacks ended
 * their requests): end what is left; the region went with the context. */
static void dec_after_kvx(node_t *n)
{
    NODE_FOR_EACH(n, dec_req_t, r) {
        dec_req_flag(r, DEC_RF_IN_STEP | DEC_RF_PULL_LIVE, false);
        r->nr.blocks_held = false;
        dec_req_end(r, PROTO_FINISH_CANCELED, PD_ERR_CANCELED);
    }
}

int main(int argc, char **argv)
{
    static dec_t g;
    dec_t *d = &g;
    pd_cfg_result_t res;
    pd_config_load_or_exit(&dec_schema, &d->cfg, argc, argv, &res);
    d->n.role = &dec_role;
    d->n.cfg = &d->cfg.node;
    uint32_t mb = (uint32_t)d->cfg.max_batch;
    node_boot_opts_t bo = { .max_batch = mb, .kvx_config = dec_kvx_config };
    int rc = node_boot(&d->n, &bo);
    if (rc == PD_CONFIG_RUN) {
        d->step.d = d;
        d->step.job.run = dec_step_run;
        d->step.job.done = dec_step_done;
        d->step.items = calloc(mb, sizeof(*d->step.items));
        d->step.prev = calloc((size_t)mb + 1, sizeof(*d->step.prev));
        d->step.eitems = calloc(mb, sizeof(*d->step.eitems));
        d->step.logits = malloc((size_t)(mb + 1) * d->n.geom->vocab_size * sizeof(float));
        if (!d->step.items || !d->step.prev || !d->step.eitems || !d->step.logits)
            rc = node_fail(&d->n, "boot", PD_ERR_NO_MEMORY, NULL);
    }
    if (rc == PD_CONFIG_RUN && d->n.ep_win != NULL) { /* the group's rounds start at once */
        d->ep_tick = evtimer_new(pd_loop_base(d->n.loop), dec_ep_tick, d);
        if (d->ep_tick == NULL)
            rc = node_fail(&d->n, "boot", PD_ERR_NO_MEMORY, NULL);
        else
            event_active(d->ep_tick, EV_TIMEOUT, 0);
    }
    if (rc == PD_CONFIG_RUN) {
        char extra[32];
        snprintf(extra, sizeof(extra), ", max-batch %u", mb);
        pd_status_t st = node_run(&d->n, extra);
        rc = st == PD_OK && !d->ep_lost ? 0 : st == PD_ERR_BAD_INPUT ? 2 : 1;
        if (d->ep_tick != NULL)
            event_free(d->ep_tick); /* before the loop goes */
        d->ep_tick = NULL;
        if (st != PD_ERR_BAD_INPUT)
            node_teardown(&d->n, dec_after_kvx);
    }
    free(d->step.items);
    free(d->step.prev);
    free(d->step.eitems);
    free(d->step.logits);
    proto_auth_secret_wipe(&d->n.secret);
    pd_config_free(&dec_schema, &d->cfg);
    pd_config_result_free(&res);
    pd_log_close();
    return rc;
}
