/* pd_decode.c - the pd-decode daemon (see decode/README.md, dec.h and the
 * flow spec in proto/PROTOCOL.md "Flows").
 *
 * Loop thread: router session, admission with KV reservation, kvx import /
 * pull / release, step scheduling, streaming, admin.
 * Compute thread (eng_runner): one step at a time = at most one local
 * prefill chunk + one decode step for every running sequence. */
#include "dec.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
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

#define DEC_COMP "decode"

static const char *const dec_kv_dtypes[] = { "f32", "f16", NULL };

#define DEC_ROW(field, key, type, def, help, min, max, en)                    \
    PD_CFG_ROW(dec_config_t, field, key, type, def, help, min, max, en)
#define DEC_ROW_X(field, key, type, def, help, min, max, en) DEC_ROW(field, key, type, def, help, min, max, en),
static const pd_cfg_field_t dec_fields[] = {
    PROTO_BOOT_HEAD_ROWS(DEC_ROW_X, "daemon id (default decode-<pid>)")
    ENG_BOOT_ROWS(DEC_ROW_X, dec_kv_dtypes)
    DEC_ROW(kv_blocks, "kv-blocks", UINT, "1024", "KV blocks in the arena", 1, 1e8, NULL),
    DEC_ROW(max_batch, "max-batch", UINT, "32", "sequences admitted at once (continuous batch)", 1, 4096, NULL),
    DEC_ROW(max_queue, "max-queue", UINT, "64", "requests waiting for room before NO_KV_SPACE", 0, 1e6, NULL),
    DEC_ROW(transfer_timeout_ns, "transfer-timeout", DURATION, "5s", "deadline of one KV pull", 1e6, 600e9, NULL),
    DEC_ROW(prefill_chunk, "prefill-chunk", UINT, "256", "tokens per decode-local prefill chunk", 1, 1048576, NULL),
    PROTO_BOOT_TAIL_ROWS(DEC_ROW_X)
    DEC_ROW(metrics_listen, "metrics.listen", STRING, NULL, "HTTP /metrics + /health address host:port (port 0: any; default off)", 0, 0, NULL),
    PD_CFG_END,
};

static const pd_cfg_schema_t dec_schema = {
    .prog = "pd-decode",
    .summary = "pd-decode [--config FILE] [--key=value ...]: decode daemon (KV pull, continuous batching)",
    .fields = dec_fields,
};

static const pd_stat_desc_t dec_stat_descs[] = { DEC_STATS(PD_STAT_DESC) };
static const pd_stats_table_t dec_stats_table = PD_STATS_TABLE("decode", dec_stat_descs);

static const char *const dec_state_names[] = {
#define DEC_X_NAME(name, text) text,
    DEC_STATES(DEC_X_NAME)
#undef DEC_X_NAME
};

static void dec_kick(dec_t *d);
static void dec_admit_waiting(dec_t *d);
static void dec_maybe_drained(dec_t *d);

/* ---- lookup ----------------------------------------------------------------- */

static dec_req_t *dec_req_find(dec_t *d, const char *id)
{
    pd_idhash_node_t *n = pd_idhash_find(&d->by_id, id);
    return n != NULL ? PD_CONTAINER_OF(n, dec_req_t, hnode) : NULL;
}

static void dec_req_link(dec_t *d, dec_req_t *r)
{
    pd_idhash_add(&d->by_id, &r->hnode, r->id);
    r->next = d->live;
    r->prev = NULL;
    if (d->live)
        d->live->prev = r;
    d->live = r;
    d->n_live++;
    pd_stats_gauge_set(d->stats, DEC_ST_live, d->n_live);
}

static void dec_req_unlink(dec_t *d, dec_req_t *r)
{
    pd_idhash_del(&d->by_id, &r->hnode);
    if (r->prev)
        r->prev->next = r->next;
    else
        d->live = r->next;
    if (r->next)
        r->next->prev = r->prev;
    d->n_live--;
    pd_stats_gauge_set(d->stats, DEC_ST_live, d->n_live);
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
    pd_stats_gauge_set(d->stats, DEC_ST_waiting, d->n_waiting);
}

static void dec_req_free(void *obj)
{
    dec_req_t *r = obj;
    if (r->renew_ev)
        event_free(r->renew_ev);
    free(r->tok);
    free(r->blocks);
    free(r->handle);
    free(r);
}

/* ---- messages out -------------------------------------------------------- */

static bool dec_can_reply(dec_t *d, dec_req_t *r)
{
    return !r->quiet && r->epoch == d->epoch && proto_session_up(d->sess) && !d->stopping;
}

static void dec_send_error(dec_t *d, const char *id, pd_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void dec_send_error(dec_t *d, const char *id, pd_status_t status, const char *fmt, ...)
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
    (void)proto_session_send(d->sess, &m);
}

/* TOKENS with the generated tokens [from, n_gen). */
static void dec_send_tokens(dec_t *d, dec_req_t *r, uint32_t from)
{
    if (from >= r->n_gen)
        return;
    if (r->seq == 0) {
        r->first_token_ns = pd_now_ns();
        pd_stats_observe_ns(d->stats, DEC_ST_ttft, r->first_token_ns - r->t[DEC_ST_NEW]);
    }
    if (!dec_can_reply(d, r)) {
        r->seq++;
        return;
    }
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_TOKENS;
    snprintf(m.u.tokens.request_id, sizeof(m.u.tokens.request_id), "%s", r->id);
    m.u.tokens.seq = r->seq++;
    m.u.tokens.tokens.n = r->n_gen - from;
    m.u.tokens.tokens.v = r->tok + r->n_prompt + from;
    pd_status_t st = proto_session_send(d->sess, &m);
    if (st != PD_OK)
        pd_log(st == PD_ERR_SHUTDOWN ? PD_LOG_DEBUG : PD_LOG_WARN, DEC_COMP, r->id,
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
        pd_log(PD_LOG_ERROR, DEC_COMP, r->id, "illegal state change %s -> %s",
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
        pd_stats_gauge_add(d->stats, DEC_ST_running, -1);
    if (to == DEC_ST_RUNNING)
        pd_stats_gauge_add(d->stats, DEC_ST_running, 1);
    if (from == DEC_ST_WAITING) {
        dec_wait_remove(d, r);
        if (r->renew_ev)
            event_del(r->renew_ev); /* the pull starts now (or the request ends) */
    }
    if (!dec_terminal(to))
        return;
    assert(!r->in_step && !r->pull_live);
    if (r->blocks_held) {
        pd_status_t st = kvx_blocks_free(d->blocks, r->blocks, r->n_blocks);
        if (st != PD_OK)
            pd_log(PD_LOG_ERROR, DEC_COMP, r->id, "freeing %u blocks: %s (leaked)",
                   r->n_blocks, pd_status_str(st));
        r->blocks_held = false;
    }
    pd_stats_inc(d->stats, to == DEC_ST_FINISHED ? DEC_ST_completed
                         : to == DEC_ST_FAILED ? DEC_ST_failed : DEC_ST_canceled);
    dec_req_unlink(d, r);
    if (pd_loop_defer_free(d->loop, dec_req_free, r) != PD_OK)
        dec_req_free(r);
    dec_admit_waiting(d);
    dec_maybe_drained(d);
}

/* End a request with its one final message. reason: a proto finish reason
 * (STOP/LENGTH/CANCELED), or ERROR with status. A failure before any
 * TOKENS is an ERROR message (the router may retry); after, FINISH error. */
static void dec_req_end(dec_req_t *r, uint16_t reason, pd_status_t status)
{
    dec_t *d = r->d;
    if (r->in_step || r->pull_live) { /* the compute step / pull returns first */
        r->cancel = true;
        return;
    }
    if (r->imported) {
        (void)kvx_lease_release(d->kvx, &r->imp); /* prefill gets its blocks back */
        r->imported = false;
    }
    pd_stats_observe_ns(d->stats, DEC_ST_req_time, pd_now_ns() - r->t[DEC_ST_NEW]);
    dec_state_t to = reason == PROTO_FINISH_CANCELED ? DEC_ST_CANCELED
                   : reason == PROTO_FINISH_ERROR ? DEC_ST_FAILED : DEC_ST_FINISHED;
    if (dec_can_reply(d, r)) {
        if (reason == PROTO_FINISH_ERROR && r->seq == 0) {
            dec_send_error(d, r->id, status, "%s", pd_status_str(status));
        } else {
            uint64_t now = pd_now_ns();
            proto_msg_t m;
            memset(&m, 0, sizeof(m));
            m.hdr.type = PROTO_MSG_FINISH;
            proto_finish_t *f = &m.u.finish;
            snprintf(f->request_id, sizeof(f->request_id), "%s", r->id);
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
            (void)proto_session_send(d->sess, &m);
        }
    }
    dec_req_set_state(r, to);
}

/* ---- compute thread: one step ------------------------------------------ */

/* Finish check after a sampled token (compute thread). */
static eng_finish_t dec_accept(dec_t *d, dec_req_t *r, int32_t t)
{
    (void)d;
    eng_finish_t f = eng_sampler_accept(&r->smp, t);
    if (f == ENG_FINISH_NONE && r->n_prompt + r->n_gen + 1 >= r->max_pos)
        f = ENG_FINISH_LENGTH;
    return f;
}

static void dec_step_run(eng_job_t *job)
{
    dec_step_t *s = (dec_step_t *)job;
    dec_t *d = s->d;
    void *arena = kvx_region_base(d->region);
    uint32_t vocab = d->geom->vocab_size;
    s->start_ns = pd_now_ns();
    s->status = PD_OK;
    dec_req_t *c = s->chunk;
    if (c != NULL) {
        c->step_status = d->ops->prefill(d->model, arena, c->blocks, c->n_blocks,
                                         c->tok + c->kv_have, c->chunk_n, c->kv_have,
                                         c->chunk_logits ? s->logits : NULL);
        c->step_token = -1;
        c->step_finish = ENG_FINISH_NONE;
        if (c->step_status == PD_OK && c->chunk_logits) {
            c->step_token = eng_sample_next(&c->smp, s->logits, vocab, &d->scratch);
            c->step_finish = dec_accept(d, c, c->step_token);
        }
    }
    if (s->n_items > 0) {
        for (uint32_t i = 0; i < s->n_items; i++) {
            dec_req_t *r = s->items[i];
            s->eitems[i] = (eng_decode_item_t){ r->blocks, r->n_blocks,
                                                r->n_prompt + r->n_gen - 1,
                                                r->tok[r->n_prompt + r->n_gen - 1] };
        }
        pd_status_t st = d->ops->decode(d->model, arena, s->eitems, s->n_items, s->logits);
        for (uint32_t i = 0; i < s->n_items; i++) {
            dec_req_t *r = s->items[i];
            r->step_status = st;
            r->step_token = -1;
            r->step_finish = ENG_FINISH_NONE;
            if (st == PD_OK) {
                r->step_token = eng_sample_next(&r->smp, s->logits + (size_t)i * vocab,
                                                vocab, &d->scratch);
                r->step_finish = dec_accept(d, r, r->step_token);
            }
        }
        s->status = st;
    }
    s->end_ns = pd_now_ns();
}

/* Loop, phase A: take a sampled token into the request (no messages yet);
 * decide whether it ends. */
static void dec_take_token(dec_t *d, dec_req_t *r)
{
    if (r->step_status != PD_OK || r->step_token < 0) {
        pd_log(PD_LOG_WARN, DEC_COMP, r->id, "compute failed: %s", pd_status_str(r->step_status));
        r->finishing = true;
        r->pend_reason = PROTO_FINISH_ERROR;
        r->pend_status = r->step_status != PD_OK ? r->step_status : PD_ERR_INTERNAL;
        return;
    }
    r->tok[r->n_prompt + r->n_gen++] = r->step_token;
    pd_stats_inc(d->stats, DEC_ST_tokens_out);
    r->pend_send = true;
    if (r->step_finish != ENG_FINISH_NONE) {
        r->finishing = true;
        r->pend_reason = r->step_finish == ENG_FINISH_STOP ? PROTO_FINISH_STOP
                                                           : PROTO_FINISH_LENGTH;
        r->pend_status = PD_OK;
    }
}

static void dec_mark_end(dec_req_t *r, uint16_t reason, pd_status_t status)
{
    r->finishing = true;
    r->pend_reason = reason;
    r->pend_status = status;
}

/* A step came back. Phase A: fold its results into the requests without
 * sending anything; phase B: submit the next step at once (the compute
 * thread works while we talk); phase C: stream TOKENS, end the finished. */
static void dec_step_done(eng_job_t *job)
{
    dec_step_t *s = (dec_step_t *)job;
    dec_t *d = s->d;
    d->step_busy = false;
    if (!job->aborted) {
        pd_stats_inc(d->stats, DEC_ST_steps);
        pd_stats_observe_ns(d->stats, DEC_ST_step_time, s->end_ns - s->start_ns);
    }
    uint32_t np = 0;
    dec_req_t *c = s->chunk;
    s->chunk = NULL;
    if (c != NULL) {
        c->in_step = false;
        s->prev[np++] = c;
        if (job->aborted)
            c->step_status = PD_ERR_SHUTDOWN;
        if (c->cancel) {
            dec_mark_end(c, PROTO_FINISH_CANCELED, PD_ERR_CANCELED);
        } else if (c->step_status != PD_OK) {
            dec_mark_end(c, PROTO_FINISH_ERROR, c->step_status);
        } else {
            c->kv_have += c->chunk_n;
            c->prefill_ns += s->end_ns - s->start_ns;
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
        r->in_step = false;
        s->prev[np++] = r;
        if (job->aborted)
            r->step_status = PD_ERR_SHUTDOWN;
        if (r->cancel)
            dec_mark_end(r, PROTO_FINISH_CANCELED, PD_ERR_CANCELED);
        else
            dec_take_token(d, r);
    }
    s->n_items = 0;
    if (!job->aborted)
        dec_kick(d); /* skips the finishing ones */
    for (uint32_t i = 0; i < np; i++) {
        dec_req_t *r = s->prev[i];
        if (r->pend_send) {
            r->pend_send = false;
            dec_send_tokens(d, r, r->n_gen - 1);
        }
        if (r->finishing) {
            r->finishing = false;
            r->cancel = false;
            dec_req_end(r, r->pend_reason, r->pend_status);
        }
    }
    if (!job->aborted)
        dec_kick(d); /* admissions made room for new work */
}

/* Build and submit the next step if there is work and none in flight. */
static void dec_kick(dec_t *d)
{
    if (d->step_busy || d->stopping)
        return;
    dec_step_t *s = &d->step;
    s->chunk = NULL;
    s->n_items = 0;
    /* the oldest PREFILLING request gets one chunk (list is newest first) */
    dec_req_t *oldest = NULL;
    for (dec_req_t *r = d->live; r != NULL; r = r->next) {
        if (r->cancel || r->finishing)
            continue;
        if (r->state == DEC_ST_PREFILLING)
            oldest = r;
        else if (r->state == DEC_ST_RUNNING && s->n_items < d->cfg.max_batch)
            s->items[s->n_items++] = r;
    }
    if (oldest != NULL) {
        uint32_t need = oldest->n_prompt + (oldest->n_gen ? oldest->n_gen - 1 : 0);
        uint32_t left = need - oldest->kv_have;
        oldest->chunk_n = left < d->cfg.prefill_chunk ? left : (uint32_t)d->cfg.prefill_chunk;
        oldest->chunk_logits = oldest->n_gen == 0 && oldest->kv_have + oldest->chunk_n == need;
        oldest->in_step = true;
        s->chunk = oldest;
    }
    if (s->chunk == NULL && s->n_items == 0)
        return;
    uint64_t now = pd_now_ns();
    for (uint32_t i = 0; i < s->n_items; i++) {
        dec_req_t *r = s->items[i];
        r->in_step = true;
        if (r->first_step_ns == 0) {
            r->first_step_ns = now;
            if (r->t[DEC_ST_PULLING] != 0) { /* the handoff: what is neither wait nor pull */
                uint64_t waited = r->t[DEC_ST_WAITING] ? r->t[DEC_ST_PULLING] - r->t[DEC_ST_WAITING]
                                                       : 0;
                uint64_t busy = now - r->t[DEC_ST_NEW];
                r->handoff_ns = busy > waited + r->transfer_ns ? busy - waited - r->transfer_ns : 0;
                pd_stats_observe_ns(d->stats, DEC_ST_handoff, r->handoff_ns);
            }
        }
    }
    d->step_busy = true;
    pd_status_t st = eng_runner_submit(d->runner, &s->job);
    if (st != PD_OK) { /* the runner queue is unbounded: shutting down */
        d->step_busy = false;
        if (s->chunk)
            s->chunk->in_step = false;
        for (uint32_t i = 0; i < s->n_items; i++)
            s->items[i]->in_step = false;
        s->chunk = NULL;
        s->n_items = 0;
    }
}

/* ---- transfer ---------------------------------------------------------- */

static void dec_start_compute(dec_t *d, dec_req_t *r)
{
    uint32_t need = r->n_prompt + (r->n_gen ? r->n_gen - 1 : 0);
    if (r->kv_have < need) {
        if (r->local && r->kv_have == 0)
            pd_stats_inc(d->stats, DEC_ST_local_prefills);
        dec_req_set_state(r, DEC_ST_PREFILLING);
    } else {
        dec_req_set_state(r, DEC_ST_RUNNING);
    }
    dec_kick(d);
}

static void dec_pull_done(void *arg, pd_status_t status, const kvx_pull_result_t *res)
{
    dec_req_t *r = arg;
    dec_t *d = r->d;
    r->pull_live = false;
    r->transfer_ns = res ? res->latency_ns : pd_now_ns() - r->t[DEC_ST_PULLING];
    pd_stats_observe_ns(d->stats, DEC_ST_transfer_time, r->transfer_ns);
    if (status == PD_OK) {
        pd_stats_inc(d->stats, DEC_ST_pulls_ok);
    } else {
        pd_stats_inc(d->stats, DEC_ST_pulls_failed);
        pd_log(PD_LOG_WARN, DEC_COMP, r->id, "KV pull from %s failed: %s", r->peer,
               pd_status_str(status));
    }
    if (r->cancel) {
        dec_req_end(r, PROTO_FINISH_CANCELED, PD_ERR_CANCELED);
        return;
    }
    if (status != PD_OK) {
        dec_req_end(r, PROTO_FINISH_ERROR, status);
        return;
    }
    r->kv_have = r->n_prompt;
    dec_start_compute(d, r);
    /* The release after the first step is on its way: posting the notify
     * can take milliseconds after a large pull (UCX tcp), which the compute
     * thread spends on the step instead of waiting. */
    (void)kvx_lease_release(d->kvx, &r->imp); /* prefill gets its blocks back */
    r->imported = false;
}

/* A handle was imported: how much of its lease was left when the
 * DECODE_REQ came (the exporter's TTL minus this is the hop prefill ->
 * router -> decode; same-host wall clocks). */
static void dec_note_import(dec_t *d, dec_req_t *r)
{
    r->imported = true;
    uint64_t arrival = pd_wall_ns() - (pd_now_ns() - r->t[DEC_ST_NEW]);
    if (r->imp.h.expiry_wall_ns > arrival)
        pd_stats_observe_ns(d->stats, DEC_ST_lease_left, r->imp.h.expiry_wall_ns - arrival);
}

static void dec_start_pull(dec_t *d, dec_req_t *r)
{
    kvx_reject_t why = 0;
    pd_status_t st = r->imported ? PD_OK /* while waiting, see dec_wait_import */
                   : kvx_handle_import(d->kvx, r->handle, r->handle_len, d->geom->compat_hash,
                                       &r->imp, &why);
    dec_req_set_state(r, DEC_ST_PULLING);
    if (st != PD_OK) {
        pd_stats_inc(d->stats, DEC_ST_pulls_failed);
        pd_log(PD_LOG_WARN, DEC_COMP, r->id, "KV handle from %s rejected: %s (%s)", r->peer,
               pd_status_str(st), kvx_reject_name(why));
        dec_req_end(r, PROTO_FINISH_ERROR, st);
        return;
    }
    if (!r->imported)
        dec_note_import(d, r);
    uint32_t nb = (r->n_prompt + d->geom->block_tokens - 1) / d->geom->block_tokens;
    uint64_t budget = d->cfg.transfer_timeout_ns;
    if (r->deadline_ns != 0 && r->deadline_ns < budget)
        budget = r->deadline_ns;
    st = kvx_pull_start(d->kvx, &r->imp, d->region, r->blocks, nb, pd_now_ns() + budget,
                        0, dec_pull_done, r, &r->pull_id);
    if (st != PD_INPROGRESS) {
        pd_stats_inc(d->stats, DEC_ST_pulls_failed);
        pd_log(PD_LOG_WARN, DEC_COMP, r->id, "KV pull from %s not started: %s", r->peer,
               pd_status_str(st));
        dec_req_end(r, PROTO_FINISH_ERROR, st == PD_OK ? PD_ERR_INTERNAL : st);
        return;
    }
    r->pull_live = true;
}

/* Lease renewal while waiting: the prefill's lease runs out while the
 * request sits in the wait queue, so the handle is imported (validated) on
 * entering WAITING and the lease renewed at half the remaining TTL, each
 * time for the TTL it had at import (the exporter caps it). */
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
    if (r->state != DEC_ST_WAITING || !r->imported)
        return;
    pd_status_t st = kvx_lease_renew(d->kvx, &r->imp, r->renew_ttl_ns);
    if (st != PD_OK) { /* the pull will tell (stale / peer gone) */
        pd_log(PD_LOG_WARN, DEC_COMP, r->id, "lease renewal to %s not sent: %s", r->peer,
               pd_status_str(st));
        return;
    }
    pd_stats_inc(d->stats, DEC_ST_lease_renews);
    r->imp.h.expiry_wall_ns = pd_wall_ns() + r->renew_ttl_ns;
    dec_renew_arm(r, r->renew_ttl_ns / 2);
}

/* Import r's handle now (it is going to wait) and arm the renewal. false:
 * ended with an ERROR (handle rejected). */
static bool dec_wait_import(dec_t *d, dec_req_t *r)
{
    kvx_reject_t why = 0;
    pd_status_t st = kvx_handle_import(d->kvx, r->handle, r->handle_len, d->geom->compat_hash,
                                       &r->imp, &why);
    if (st != PD_OK) {
        pd_stats_inc(d->stats, DEC_ST_pulls_failed);
        pd_log(PD_LOG_WARN, DEC_COMP, r->id, "KV handle from %s rejected: %s (%s)", r->peer,
               pd_status_str(st), kvx_reject_name(why));
        dec_req_end(r, PROTO_FINISH_ERROR, st);
        return false;
    }
    dec_note_import(d, r);
    uint64_t now = pd_wall_ns();
    uint64_t left = r->imp.h.expiry_wall_ns > now ? r->imp.h.expiry_wall_ns - now : 0;
    r->renew_ttl_ns = left > 1000000 ? left : 1000000;
    r->renew_ev = event_new(pd_loop_base(d->loop), -1, 0, dec_renew_cb, r);
    if (r->renew_ev != NULL)
        dec_renew_arm(r, left / 2);
    return true;
}

/* ---- admission ---------------------------------------------------------- */

/* Reserve blocks and start; false if no room now. */
static bool dec_try_start(dec_t *d, dec_req_t *r)
{
    if (d->n_active >= d->cfg.max_batch || r->n_blocks > kvx_blocks_free_count(d->blocks))
        return false;
    (void)kvx_blocks_alloc(d->blocks, r->n_blocks, r->blocks);
    r->blocks_held = true;
    if (!r->local)
        dec_start_pull(d, r);
    else
        dec_start_compute(d, r);
    return true;
}

static void dec_admit_waiting(dec_t *d)
{
    while (d->wait_head != NULL && !d->stopping) {
        dec_req_t *r = d->wait_head;
        if (!dec_try_start(d, r))
            break;
    }
}

static pd_status_t dec_sampling(dec_t *d, const proto_sampling_t *ps, eng_sample_params_t *sp)
{
    eng_sample_params_default(sp);
    sp->temperature = ps->temperature;
    sp->top_p = ps->top_p;
    sp->top_k = ps->top_k;
    sp->seed = ps->seed;
    sp->max_tokens = ps->max_tokens;
    sp->min_tokens = ps->min_tokens;
    sp->ignore_eos = (ps->flags & PROTO_SAMPLE_IGNORE_EOS) != 0;
    sp->n_eos = d->n_eos;
    memcpy(sp->eos_ids, d->eos_ids, sizeof(sp->eos_ids));
    if (ps->stop.n > ENG_SAMPLE_MAX_STOP_IDS)
        return PD_ERR_TOO_BIG;
    sp->n_stop_ids = proto_tokens_copy(&ps->stop, sp->stop_ids, ENG_SAMPLE_MAX_STOP_IDS);
    return eng_sample_params_check(sp);
}

/* Best effort: give the exporter its blocks back for a handle we will not
 * pull (validated first; nothing happens for garbage). */
static void dec_release_handle(dec_t *d, const proto_blob_t *h)
{
    if (h->len == 0)
        return;
    kvx_import_t imp;
    if (kvx_handle_import(d->kvx, h->p, h->len, d->geom->compat_hash, &imp, NULL) == PD_OK)
        (void)kvx_lease_release(d->kvx, &imp);
}

static void dec_on_decode_req(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    dec_t *d = arg;
    const proto_decode_req_t *q = &msg->u.decode_req;
    uint32_t ctx = d->geom->context_length, vocab = d->geom->vocab_size;
    uint32_t np = q->prompt.n, ng = q->generated.n;
    bool local = (q->flags & PROTO_DEC_PREFILL_LOCALLY) != 0;
    pd_status_t st = PD_OK;
    const char *why = "";
    eng_sample_params_t sp;
    if (d->draining || d->stopping) {
        st = PD_ERR_SHUTDOWN; why = "draining";
    } else if (dec_req_find(d, q->request_id) != NULL) {
        st = PD_ERR_EXISTS; why = "request id already live";
    } else if (np == 0) {
        st = PD_ERR_BAD_INPUT; why = "empty prompt";
    } else if ((uint64_t)np + ng >= ctx) {
        st = PD_ERR_TOO_BIG; why = "prompt + generated reach the context length";
    } else if (!local && (ng == 0 || q->kv_handle.len == 0)) {
        st = PD_ERR_BAD_INPUT; why = "a KV handle needs generated = [token 0]";
    } else if (dec_sampling(d, &q->sampling, &sp) != PD_OK) {
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
    uint32_t nb = (max_pos + d->geom->block_tokens - 1) / d->geom->block_tokens;
    if (st == PD_OK && nb > kvx_blocks_total(d->blocks)) {
        st = PD_ERR_NO_KV_SPACE; why = "request larger than the whole KV pool";
    }
    if (st == PD_OK && d->n_waiting >= d->cfg.max_queue &&
        (d->n_active >= d->cfg.max_batch || nb > kvx_blocks_free_count(d->blocks))) {
        st = d->n_active >= d->cfg.max_batch ? PD_ERR_OVERLOADED : PD_ERR_NO_KV_SPACE;
        why = "no room and the wait queue is full";
    }
    dec_req_t *r = NULL;
    if (st == PD_OK) {
        r = calloc(1, sizeof(*r));
        if (r == NULL || (r->tok = malloc(((size_t)max_pos + 1) * sizeof(int32_t))) == NULL ||
            (r->blocks = malloc((size_t)nb * sizeof(uint32_t))) == NULL ||
            (!local && (r->handle = malloc(q->kv_handle.len)) == NULL)) {
            if (r)
                dec_req_free(r);
            r = NULL;
            st = PD_ERR_NO_MEMORY; why = "out of memory";
        }
    }
    if (st != PD_OK) {
        pd_stats_inc(d->stats, DEC_ST_rejected);
        pd_log(PD_LOG_DEBUG, DEC_COMP, q->request_id, "rejected: %s", why);
        if (st != PD_ERR_EXISTS)
            dec_release_handle(d, &q->kv_handle);
        dec_send_error(d, q->request_id, st, "%s", why);
        return;
    }
    r->d = d;
    snprintf(r->id, sizeof(r->id), "%s", q->request_id);
    snprintf(r->peer, sizeof(r->peer), "%s", q->prefill_peer_id);
    r->epoch = d->epoch;
    r->local = local;
    r->cap = max_pos + 1;
    r->max_pos = max_pos;
    r->n_prompt = proto_tokens_copy(&q->prompt, r->tok, np);
    r->n_gen_given = proto_tokens_copy(&q->generated, r->tok + np, ng);
    r->n_blocks = nb;
    r->deadline_ns = q->deadline_ns;
    if (!local) {
        memcpy(r->handle, q->kv_handle.p, q->kv_handle.len);
        r->handle_len = q->kv_handle.len;
    }
    r->state = DEC_ST_NEW;
    r->t[DEC_ST_NEW] = pd_now_ns();
    dec_req_link(d, r);
    pd_stats_inc(d->stats, DEC_ST_accepted);

    /* sampler continuity: replay the tokens already generated */
    eng_sampler_init(&r->smp, &sp);
    eng_finish_t f = ENG_FINISH_NONE;
    for (uint32_t i = 0; i < ng; i++) {
        if (f != ENG_FINISH_NONE) {
            dec_req_end(r, PROTO_FINISH_ERROR, PD_ERR_BAD_INPUT); /* ended mid-list */
            return;
        }
        if (sp.temperature > 0.0f)
            (void)eng_rng_next(&r->smp.rng);
        f = eng_sampler_accept(&r->smp, r->tok[np + i]);
        r->n_gen++;
        if (f == ENG_FINISH_NONE && np + r->n_gen >= max_pos)
            f = ENG_FINISH_LENGTH;
    }
    if (q->rng_state != 0 && q->rng_state != r->smp.rng.s[0]) {
        pd_log(PD_LOG_WARN, DEC_COMP, r->id, "sampler state mismatch after replay");
        dec_req_end(r, PROTO_FINISH_ERROR, PD_ERR_MISMATCH);
        return;
    }
    if (f != ENG_FINISH_NONE) { /* the given tokens already end it */
        if (!local)
            dec_release_handle(d, &q->kv_handle);
        dec_req_end(r, f == ENG_FINISH_STOP ? PROTO_FINISH_STOP : PROTO_FINISH_LENGTH, PD_OK);
        return;
    }
    if (!dec_try_start(d, r)) {
        r->state = DEC_ST_NEW;
        dec_req_set_state(r, DEC_ST_WAITING);
        if (d->wait_tail)
            d->wait_tail->wnext = r;
        else
            d->wait_head = r;
        d->wait_tail = r;
        d->n_waiting++;
        pd_stats_gauge_set(d->stats, DEC_ST_waiting, d->n_waiting);
        if (!local)
            (void)dec_wait_import(d, r);
    }
}

static void dec_req_cancel(dec_t *d, dec_req_t *r)
{
    if (r->pull_live) {
        r->cancel = true;
        (void)kvx_pull_cancel(d->kvx, r->pull_id); /* -> dec_pull_done */
        return;
    }
    dec_req_end(r, PROTO_FINISH_CANCELED, PD_ERR_CANCELED);
}

static void dec_on_cancel(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    dec_t *d = arg;
    dec_req_t *r = dec_req_find(d, msg->u.cancel.request_id);
    if (r != NULL && !r->cancel)
        dec_req_cancel(d, r);
}

/* ---- peers ---------------------------------------------------------------- */

static dec_peer_t *dec_peer_find(dec_t *d, const char *id, bool create)
{
    dec_peer_t *free_slot = NULL;
    for (uint32_t i = 0; i < DEC_MAX_PEERS; i++) {
        if (d->peers[i].id[0] != '\0' && strcmp(d->peers[i].id, id) == 0)
            return &d->peers[i];
        if (d->peers[i].id[0] == '\0' && free_slot == NULL)
            free_slot = &d->peers[i];
    }
    if (!create || free_slot == NULL)
        return NULL;
    snprintf(free_slot->id, sizeof(free_slot->id), "%s", id);
    return free_slot;
}

static void dec_on_peer_info(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    dec_t *d = arg;
    const proto_peer_info_t *pi = &msg->u.peer_info;
    if (pi->role != PROTO_ROLE_PREFILL)
        return;
    dec_peer_t *p = dec_peer_find(d, pi->daemon_id, true);
    if (p == NULL) {
        pd_log(PD_LOG_WARN, DEC_COMP, NULL, "peer table full: %s ignored", pi->daemon_id);
        return;
    }
    pd_status_t st = kvx_peer_add(d->kvx, pi->kv_addr.p, pi->kv_addr.len);
    if (st == PD_ERR_STALE) {
        /* PEER_DOWN tombstoned this incarnation, and now the router (over
         * our authenticated session) says it registered again: it was
         * unreachable for a while, not dead. Use it again. */
        uint64_t node = XXH64(pi->daemon_id, strlen(pi->daemon_id), 0);
        if (kvx_peer_revive(d->kvx, node, pi->incarnation) == PD_OK)
            st = kvx_peer_add(d->kvx, pi->kv_addr.p, pi->kv_addr.len);
    }
    if (st == PD_OK || st == PD_ERR_EXISTS) {
        p->incarnation = pi->incarnation;
        p->node_id = XXH64(pi->daemon_id, strlen(pi->daemon_id), 0);
        p->live = true;
        pd_log(st == PD_OK ? PD_LOG_INFO : PD_LOG_DEBUG, DEC_COMP, NULL,
               "prefill peer %s (incarnation %llx) %s", pi->daemon_id,
               (unsigned long long)pi->incarnation, st == PD_OK ? "added" : "known");
    } else {
        pd_log(PD_LOG_WARN, DEC_COMP, NULL, "prefill peer %s refused: %s", pi->daemon_id,
               pd_status_str(st));
    }
}

static void dec_on_peer_down(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    dec_t *d = arg;
    const proto_peer_down_t *pd = &msg->u.peer_down;
    dec_peer_t *p = dec_peer_find(d, pd->daemon_id, false);
    if (p == NULL || !p->live || (pd->incarnation != 0 && pd->incarnation != p->incarnation))
        return; /* unknown, or an older incarnation than the one we use */
    p->live = false;
    pd_status_t st = kvx_peer_fail(d->kvx, p->node_id, PD_ERR_PEER_GONE);
    pd_log(PD_LOG_INFO, DEC_COMP, NULL, "prefill peer %s down (%s): %s", pd->daemon_id,
           pd_status_name(pd->status), pd_status_str(st));
}

static void dec_on_error(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c;
    (void)arg;
    pd_log(PD_LOG_WARN, DEC_COMP, msg->u.error.request_id[0] ? msg->u.error.request_id : NULL,
           "router error: %s: %s", pd_status_name(msg->u.error.status), msg->u.error.message);
}

/* ---- session ------------------------------------------------------------ */

static void dec_write_ready(dec_t *d)
{
    if (d->cfg.ready_file == NULL || d->registered_once)
        return;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", d->daemon_id);
    cJSON_AddStringToObject(j, "role", "decode");
    cJSON_AddNumberToObject(j, "pid", (double)getpid());
    cJSON_AddStringToObject(j, "router", proto_session_router_id(d->sess));
    if (d->cfg.admin_socket)
        cJSON_AddStringToObject(j, "admin", d->cfg.admin_socket);
    if (dec_metrics_port() != 0)
        cJSON_AddNumberToObject(j, "metrics", dec_metrics_port());
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (txt == NULL)
        return;
    d->registered_once = proto_boot_ready_write(d->cfg.ready_file, txt, DEC_COMP);
    free(txt);
}

static void dec_on_up(proto_session_t *s, const proto_register_ack_t *ack, void *arg)
{
    (void)s;
    dec_t *d = arg;
    d->epoch++;
    pd_log(PD_LOG_INFO, DEC_COMP, NULL, "registered with router %s as %s", ack->daemon_id,
           d->daemon_id);
    dec_write_ready(d);
}

static void dec_on_down(proto_session_t *s, pd_status_t why, void *arg)
{
    (void)s;
    dec_t *d = arg;
    d->epoch++;
    pd_log(PD_LOG_WARN, DEC_COMP, NULL, "router lost (%s): canceling %u requests, reconnecting",
           pd_status_str(why), d->n_live);
    dec_req_t *next;
    for (dec_req_t *r = d->live; r != NULL; r = next) {
        next = r->next;
        r->quiet = true;
        if (!r->cancel)
            dec_req_cancel(d, r);
    }
}

static void dec_on_reject(proto_session_t *s, pd_status_t status, const char *reason, void *arg)
{
    (void)s;
    (void)arg;
    pd_log(PD_LOG_ERROR, DEC_COMP, NULL, "registration refused (%s): %s; retrying with backoff",
           pd_status_name(status), reason);
}

static void dec_fill_hb(proto_session_t *s, proto_heartbeat_t *hb, void *arg)
{
    (void)s;
    dec_t *d = arg;
    hb->flags = d->draining ? PROTO_HB_DRAINING : 0;
    hb->queue_depth = d->n_waiting;
    hb->running_seqs = d->n_active;
    hb->free_blocks = kvx_blocks_free_count(d->blocks);
    hb->total_blocks = kvx_blocks_total(d->blocks);
    hb->leases = 0;
    uint64_t tok = 0;
    for (dec_req_t *r = d->live; r != NULL; r = r->next)
        if (r->state == DEC_ST_PREFILLING || r->state == DEC_ST_WAITING)
            tok += r->local ? r->n_prompt + r->n_gen - r->kv_have : 0;
    hb->outstanding_prefill_tokens = tok;
}

/* ---- drain -------------------------------------------------------------- */

static void dec_stop_loop(void *arg)
{
    dec_t *d = arg;
    pd_loop_stop(d->loop);
}

static void dec_maybe_drained(dec_t *d)
{
    if (d->draining && !d->stopping && d->n_live == 0) {
        pd_log(PD_LOG_INFO, DEC_COMP, NULL, "drained: flushing and exiting");
        d->stopping = true;
        /* the last TOKENS/FINISH must reach the router before we exit */
        proto_session_shutdown(d->sess, dec_stop_loop, d);
    }
}

static void dec_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dec_t *d = arg;
    pd_log(PD_LOG_WARN, DEC_COMP, NULL, "drain timeout: %u requests still live; exiting", d->n_live);
    d->stopping = true;
    pd_loop_stop(d->loop);
}

static void dec_start_drain(dec_t *d)
{
    if (d->draining)
        return;
    d->draining = true;
    pd_log(PD_LOG_INFO, DEC_COMP, NULL, "draining: %u requests live", d->n_live);
    proto_session_heartbeat_now(d->sess);
    struct timeval tv = { (time_t)(d->cfg.drain_timeout_ns / 1000000000ull),
                          (suseconds_t)(d->cfg.drain_timeout_ns % 1000000000ull / 1000) };
    evtimer_add(d->drain_ev, &tv);
    dec_maybe_drained(d);
}

static void dec_on_sigterm(pd_loop_t *loop, void *arg)
{
    dec_t *d = arg;
    if (pd_loop_drain_count(loop) > 1) {
        d->stopping = true;
        pd_loop_stop(loop);
        return;
    }
    dec_start_drain(d);
}

/* ---- admin -------------------------------------------------------------- */

static pd_status_t dec_adm_kv(pd_admin_req_t *req, cJSON *reply)
{
    dec_t *d = req->arg;
    cJSON_AddNumberToObject(reply, "arena_bytes",
                            (double)kvx_region_block_bytes(d->region) * kvx_region_n_blocks(d->region));
    cJSON_AddNumberToObject(reply, "block_bytes", (double)kvx_region_block_bytes(d->region));
    cJSON_AddNumberToObject(reply, "block_tokens", d->geom->block_tokens);
    cJSON_AddNumberToObject(reply, "blocks_total", kvx_blocks_total(d->blocks));
    cJSON_AddNumberToObject(reply, "free", kvx_blocks_free_count(d->blocks));
    cJSON_AddNumberToObject(reply, "used", kvx_blocks_used(d->blocks));
    cJSON_AddNumberToObject(reply, "running", d->n_active);
    cJSON_AddNumberToObject(reply, "waiting", d->n_waiting);
    return PD_OK;
}

static pd_status_t dec_adm_requests(pd_admin_req_t *req, cJSON *reply)
{
    dec_t *d = req->arg;
    cJSON *a = cJSON_AddArrayToObject(reply, "requests");
    uint64_t now = pd_now_ns();
    for (dec_req_t *r = d->live; r != NULL; r = r->next) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "request_id", r->id);
        cJSON_AddStringToObject(o, "state", dec_state_names[r->state]);
        cJSON_AddBoolToObject(o, "local", r->local);
        cJSON_AddNumberToObject(o, "prompt_tokens", r->n_prompt);
        cJSON_AddNumberToObject(o, "generated", r->n_gen);
        cJSON_AddNumberToObject(o, "blocks", r->n_blocks);
        cJSON_AddNumberToObject(o, "age_ns", (double)(now - r->t[DEC_ST_NEW]));
        cJSON_AddNumberToObject(o, "transfer_ns", (double)r->transfer_ns);
        cJSON_AddNumberToObject(o, "handoff_ns", (double)r->handoff_ns);
        cJSON_AddNumberToObject(o, "prefill_ns", (double)r->prefill_ns);
        cJSON_AddItemToArray(a, o);
    }
    cJSON *c = cJSON_AddObjectToObject(reply, "counters");
#define DEC_X_CNT(name, kind, help) \
    if (PD_STAT_##kind == PD_STAT_COUNTER) \
        cJSON_AddNumberToObject(c, #name, (double)pd_stats_counter(d->stats, DEC_ST_##name));
    DEC_STATS(DEC_X_CNT)
#undef DEC_X_CNT
    return PD_OK;
}

static pd_status_t dec_adm_drain(pd_admin_req_t *req, cJSON *reply)
{
    dec_t *d = req->arg;
    dec_start_drain(d);
    cJSON_AddBoolToObject(reply, "draining", 1);
    cJSON_AddNumberToObject(reply, "live", d->n_live);
    return PD_OK;
}

static pd_status_t dec_adm_xfer(pd_admin_req_t *req, cJSON *reply)
{
    dec_t *d = req->arg;
    cJSON *x = kvx_stats_json(d->kvx);
    if (x == NULL)
        return PD_ERR_NO_MEMORY;
    cJSON_AddItemToObject(reply, "xfer", x);
    return PD_OK;
}

static pd_status_t dec_adm_session(pd_admin_req_t *req, cJSON *reply)
{
    dec_t *d = req->arg;
    static const char *const names[] = { "down", "connecting", "hello_sent", "up" };
    cJSON_AddStringToObject(reply, "state", names[proto_session_state(d->sess)]);
    cJSON_AddStringToObject(reply, "router_id", proto_session_router_id(d->sess));
    cJSON_AddNumberToObject(reply, "registrations", (double)proto_session_registrations(d->sess));
    cJSON_AddNumberToObject(reply, "rejects", (double)proto_session_rejects(d->sess));
    cJSON_AddStringToObject(reply, "last_error", proto_session_last_error(d->sess));
    cJSON_AddBoolToObject(reply, "draining", d->draining);
    cJSON *p = cJSON_AddArrayToObject(reply, "peers");
    for (uint32_t i = 0; i < DEC_MAX_PEERS; i++) {
        if (d->peers[i].id[0] == '\0')
            continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", d->peers[i].id);
        cJSON_AddBoolToObject(o, "live", d->peers[i].live);
        cJSON_AddItemToArray(p, o);
    }
    return PD_OK;
}

static const pd_admin_cmd_t dec_cmds[] = {
    { "kv", PD_ADMIN_USER, dec_adm_kv, "kv - arena and block counts" },
    { "requests", PD_ADMIN_USER, dec_adm_requests, "requests - live requests and outcome counters" },
    { "xfer", PD_ADMIN_USER, dec_adm_xfer, "xfer - kvxfer statistics (pulls per prefill peer)" },
    { "session", PD_ADMIN_USER, dec_adm_session, "session - router session state and prefill peers" },
    { "drain", PD_ADMIN_ADMIN, dec_adm_drain, "drain - stop admitting, exit when idle" },
    PD_ADMIN_CMD_END,
};

/* ---- boot ----------------------------------------------------------------- */

static int dec_fail(const char *what, pd_status_t st, const char *detail)
{
    pd_log(PD_LOG_ERROR, DEC_COMP, NULL, "%s: %s%s%s", what, pd_status_str(st),
           detail && detail[0] ? ": " : "", detail ? detail : "");
    return 1;
}

int main(int argc, char **argv)
{
    static dec_t g;
    dec_t *d = &g;
    pd_cfg_result_t res;
    pd_config_load_or_exit(&dec_schema, &d->cfg, argc, argv, &res);
    pd_status_t st;
    char err[256] = "";

    proto_boot_cfg_t bc = {
        .prog = "pd-decode", .role = "decode",
        .log_level = d->cfg.log_level, .log_file = d->cfg.log_file,
        .model = d->cfg.model, .router = d->cfg.router,
        .secret_file = d->cfg.secret_file, .secret_hex = d->cfg.secret,
        .insecure_no_auth = d->cfg.insecure_no_auth, .id = d->cfg.id,
    };
    if (proto_boot_daemon(&bc, &d->secret, &d->have_secret, d->daemon_id) != PD_OK)
        goto usage;

    eng_boot_opts_t eo = {
        .model = d->cfg.model, .engine = d->cfg.engine,
        .block_tokens = (uint32_t)d->cfg.block_tokens,
        .kv_dtype = (eng_kv_dtype_t)d->cfg.kv_dtype,
        .n_threads = (uint32_t)d->cfg.threads, .max_batch = (uint32_t)d->cfg.max_batch,
    };
    eng_boot_t eb;
    st = eng_boot_load(&eo, &eb, err, sizeof(err));
    if (st == PD_ERR_NOT_FOUND) {
        fprintf(stderr, "pd-decode: --engine: %s\n", err);
        goto usage;
    }
    if (st != PD_OK)
        return dec_fail("model load", st, err);
    d->ops = eb.ops;
    d->model = eb.model;
    d->geom = eb.geom;
    memcpy(d->eos_ids, eb.eos_ids, sizeof(d->eos_ids));
    d->n_eos = eb.n_eos;
    if (eb.tok_err[0] != '\0')
        pd_log(PD_LOG_WARN, DEC_COMP, NULL, "no tokenizer (%s): no EOS ids", eb.tok_err);
    uint32_t mb = (uint32_t)d->cfg.max_batch;
    d->step.d = d;
    d->step.job.run = dec_step_run;
    d->step.job.done = dec_step_done;
    d->step.items = calloc(mb, sizeof(*d->step.items));
    d->step.prev = calloc((size_t)mb + 1, sizeof(*d->step.prev));
    d->step.eitems = calloc(mb, sizeof(*d->step.eitems));
    d->step.logits = malloc((size_t)mb * d->geom->vocab_size * sizeof(float));
    if (!d->step.items || !d->step.prev || !d->step.eitems || !d->step.logits ||
        eng_sample_scratch_create(&d->scratch, d->geom->vocab_size) != PD_OK)
        return dec_fail("boot", PD_ERR_NO_MEMORY, NULL);

    st = pd_loop_create(&d->loop);
    if (st != PD_OK)
        return dec_fail("event loop", st, NULL);
    struct event_base *base = pd_loop_base(d->loop);

    kvx_config_t kc;
    kvx_config_default(&kc);
    kc.node_id = XXH64(d->daemon_id, strlen(d->daemon_id), 0);
    if (kc.node_id == 0)
        kc.node_id = 1;
    if (d->have_secret)
        proto_auth_derive(&d->secret, "pdserve kvx v1", kc.secret);
    st = kvx_ctx_create(&kc, base, &d->kvx);
    if (st != PD_OK)
        return dec_fail("kvxfer init", st, NULL);
    st = kvx_region_register(d->kvx, 1, d->geom->block_bytes, (uint32_t)d->cfg.kv_blocks,
                             d->geom->compat_hash, KVX_ALLOC_UCX, &d->region);
    if (st != PD_OK)
        return dec_fail("KV arena registration", st, NULL);
    st = kvx_blocks_create(d->region, (uint32_t)d->cfg.kv_blocks, &d->blocks);
    if (st != PD_OK)
        return dec_fail("block allocator", st, NULL);
    st = kvx_meta_pack(d->kvx, d->meta, sizeof(d->meta), &d->meta_len);
    if (st != PD_OK || d->meta_len > PROTO_KV_ADDR_MAX)
        return dec_fail("kvx metadata", st != PD_OK ? st : PD_ERR_TOO_BIG, NULL);

    st = pd_stats_create(&dec_stats_table, (const char *[]){ "daemon", d->daemon_id, NULL },
                         &d->stats);
    if (st != PD_OK)
        return dec_fail("stats", st, NULL);
    st = eng_runner_create(d->loop, 0, &d->runner);
    if (st != PD_OK)
        return dec_fail("compute thread", st, NULL);
    d->drain_ev = evtimer_new(base, dec_drain_timeout, d);
    if (d->cfg.admin_socket) {
        pd_admin_opts_t ao = { .path = d->cfg.admin_socket, .prog = "pd-decode",
                               .cfg_schema = &dec_schema, .cfg_target = &d->cfg };
        st = pd_admin_create(d->loop, &ao, &d->admin);
        if (st != PD_OK)
            return dec_fail("admin socket", st, d->cfg.admin_socket);
        pd_admin_register(d->admin, dec_cmds, d);
        pd_admin_add_stats(d->admin, d->stats);
    }
    st = dec_metrics_start(d);
    if (st != PD_OK)
        return dec_fail("metrics.listen", st, d->cfg.metrics_listen);

    proto_session_opts_t so;
    memset(&so, 0, sizeof(so));
    so.router_addr = d->cfg.router;
    so.secret = d->have_secret ? &d->secret : NULL;
    so.hello.role = PROTO_ROLE_DECODE;
    so.hello.caps = PROTO_CAP_DECODE | PROTO_CAP_PREFILL_LOCAL | PROTO_CAP_KV_IMPORT;
    snprintf(so.hello.daemon_id, sizeof(so.hello.daemon_id), "%s", d->daemon_id);
    so.hello.incarnation = kvx_ctx_incarnation(d->kvx);
    so.hello.compat_hash = d->geom->compat_hash;
    so.hello.geom = (proto_kv_geom_t){
        .n_layers = d->geom->n_layers, .n_kv_heads = d->geom->n_kv_heads,
        .head_dim = d->geom->head_dim, .block_tokens = d->geom->block_tokens,
        .kv_dtype = (uint32_t)d->geom->kv_dtype, .total_blocks = (uint32_t)d->cfg.kv_blocks,
        .block_bytes = d->geom->block_bytes, .context_length = d->geom->context_length,
        .vocab_size = d->geom->vocab_size,
    };
    so.hello.kv_addr.p = d->meta;
    so.hello.kv_addr.len = (uint32_t)d->meta_len;
    so.heartbeat_interval_ns = d->cfg.heartbeat_ns;
    so.backoff_min_ns = d->cfg.reconnect_min_ns;
    so.cbs.on_decode_req = dec_on_decode_req;
    so.cbs.on_cancel = dec_on_cancel;
    so.cbs.on_peer_info = dec_on_peer_info;
    so.cbs.on_peer_down = dec_on_peer_down;
    so.cbs.on_error = dec_on_error;
    so.on_up = dec_on_up;
    so.on_down = dec_on_down;
    so.on_reject = dec_on_reject;
    so.fill_heartbeat = dec_fill_hb;
    so.arg = d;
    so.stats = &d->pstats;
    st = proto_session_create(base, &so, &d->sess);
    if (st != PD_OK) {
        fprintf(stderr, "pd-decode: --router: bad address \"%s\"\n", d->cfg.router);
        return 2;
    }
    if (!d->have_secret)
        pd_log(PD_LOG_WARN, DEC_COMP, NULL,
               "RUNNING WITHOUT AUTHENTICATION (--insecure-no-auth): loopback only");
    pd_loop_on_drain(d->loop, dec_on_sigterm, d);
    pd_log(PD_LOG_INFO, DEC_COMP, NULL,
           "%s up: model %s (%s), %llu blocks x %llu bytes, max-batch %u, router %s",
           d->daemon_id, d->cfg.model, eb.engine, (unsigned long long)d->cfg.kv_blocks,
           (unsigned long long)d->geom->block_bytes, mb, d->cfg.router);

    st = pd_loop_run(d->loop);
    int rc = st == PD_OK ? 0 : 1;

    d->stopping = true;
    proto_session_destroy(d->sess);
    d->sess = NULL;
    eng_runner_destroy(d->runner); /* the step in flight comes back (done) */
    dec_req_t *next;
    for (dec_req_t *r = d->live; r != NULL; r = next) {
        next = r->next;
        r->quiet = true;
        if (!r->cancel)
            dec_req_cancel(d, r);
    }
    if (d->admin) {
        pd_admin_remove_stats(d->admin, d->stats);
        pd_admin_destroy(d->admin);
    }
    dec_metrics_stop();
    kvx_ctx_destroy(d->kvx); /* fails pulls -> callbacks end their requests */
    for (dec_req_t *r = d->live; r != NULL; r = next) {
        next = r->next;
        r->in_step = r->pull_live = false;
        r->blocks_held = false; /* the region is gone with the context */
        dec_req_end(r, PROTO_FINISH_CANCELED, PD_ERR_CANCELED);
    }
    kvx_blocks_destroy(d->blocks);
    event_free(d->drain_ev);
    pd_loop_destroy(d->loop);
    pd_stats_destroy(d->stats);
    d->ops->destroy(d->model);
    eng_sample_scratch_destroy(&d->scratch);
    free(d->step.items);
    free(d->step.prev);
    free(d->step.eitems);
    free(d->step.logits);
    proto_auth_secret_wipe(&d->secret);
    if (d->cfg.ready_file)
        unlink(d->cfg.ready_file);
    pd_config_free(&dec_schema, &d->cfg);
    pd_config_result_free(&res);
    pd_log_close();
    return rc;
usage:
    proto_auth_secret_wipe(&d->secret);
    pd_config_free(&dec_schema, &d->cfg);
    pd_config_result_free(&res);
    pd_log_close();
    return 2;
}
