/* dec_step.c - the decode's compute step (see dec.h): what runs on the
 * compute thread (the chunk and the batch through the engine, sampling,
 * the finish check) and the chunk budget of tpot-target (loop thread).
 * The step's building and its results are pd_decode.c's (dec_kick,
 * dec_step_done). */
#include "dec.h"

#include "pd_time.h"

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

/* Tokens r may still generate, the next one included (max_tokens and the
 * context), for the structured-output mask. */
static uint32_t dec_budget(const dec_req_t *r)
{
    uint32_t used = r->n_prompt + r->n_gen;
    uint32_t b = r->max_pos > used ? r->max_pos - used : 1;
    if (r->smp.p.max_tokens) {
        uint32_t m = r->smp.p.max_tokens > r->smp.n_generated
                         ? r->smp.p.max_tokens - r->smp.n_generated : 1;
        b = m < b ? m : b;
    }
    return b;
}

/* Sample c's token 0 from its chunk's logits (a chunk that ends the prompt). */
static void dec_chunk_sample(dec_t *d, dec_req_t *c, float *logits)
{
    c->step_token = -1;
    c->step_finish = ENG_FINISH_NONE;
    if (c->step_status == PD_OK && c->chunk_logits) {
        eng_sample_hist_t h = { c->tok, c->n_prompt, c->tok + c->n_prompt, c->n_gen };
        c->step_token = node_sample(&d->n, &c->gram, &c->smp, logits, &h, dec_budget(c),
                                    c->lp_top, c->lp_on ? &c->step_lp : NULL);
        c->step_finish = dec_accept(d, c, c->step_token);
    }
}

static void dec_items_sample(dec_t *d, dec_step_t *s, pd_status_t st, float *logits)
{
    uint32_t vocab = d->n.geom->vocab_size;
    for (uint32_t i = 0; i < s->n_items; i++) {
        dec_req_t *r = s->items[i];
        r->step_status = st;
        r->step_token = -1;
        r->step_finish = ENG_FINISH_NONE;
        if (st == PD_OK) {
            eng_sample_hist_t h = { r->tok, r->n_prompt, r->tok + r->n_prompt, r->n_gen };
            r->step_token = node_sample(&d->n, &r->gram, &r->smp, logits + (size_t)i * vocab, &h,
                                        dec_budget(r), r->lp_top, r->lp_on ? &r->step_lp : NULL);
            r->step_finish = dec_accept(d, r, r->step_token);
        }
    }
    s->status = st;
}

/* An EP rank's round: the vote, then as many forward passes as the
 * busiest rank needs, ours (the fused step: chunk and batch in one call,
 * passes of the engine's step_rows rows, node_t.ep_pass_rows) first, then idle passes. A status the
 * engine returns before its first pass (a bad token) still pads with idle
 * passes so the group stays in step; a transport status loses the group. */
static bool dec_ep_lost_status(pd_status_t st)
{
    return st == PD_ERR_TIMED_OUT || st == PD_ERR_TRANSPORT || st == PD_ERR_PEER_GONE;
}

static void dec_ep_round(dec_t *d, dec_step_t *s, void *arena)
{
    dec_req_t *c = s->chunk;
    uint32_t vocab = d->n.geom->vocab_size, rows = s->n_items + (c != NULL ? c->chunk_n : 0);
    uint32_t per = d->n.ep_pass_rows;
    node_ep_vote_t mine = { .passes = (rows + per - 1) / per,
                            .flags = s->ep_drained ? NODE_EP_DRAINED : 0 }, all;
    pd_status_t st = node_ep_vote(&d->n, &mine, &all);
    s->ep_work = st == PD_OK && all.passes > 0;
    s->ep_all_drained = st == PD_OK && all.passes == 0 && (all.flags & NODE_EP_DRAINED);
    uint32_t done = 0;
    if (st == PD_OK && rows > 0) {
        eng_chunk_t ch = { 0 };
        if (c != NULL)
            ch = (eng_chunk_t){ c->nr.blocks, c->nr.n_blocks, c->tok + c->kv_have, c->chunk_n,
                                c->kv_have, c->chunk_logits };
        pd_status_t rs = d->n.ops->step(d->n.model, arena, c != NULL ? &ch : NULL, s->eitems,
                                        s->n_items, s->logits);
        if (rs == PD_OK || dec_ep_lost_status(rs))
            done = mine.passes;
        if (dec_ep_lost_status(rs))
            st = rs;
        s->fused = c != NULL && s->n_items > 0;
        if (c != NULL) {
            c->step_status = rs;
            dec_chunk_sample(d, c, s->logits);
        }
        dec_items_sample(d, s, rs, s->logits + (c != NULL && c->chunk_logits ? vocab : 0));
    }
    for (; st == PD_OK && done < all.passes; done++)
        st = d->n.ops->ep_idle(d->n.model);
    s->ep_status = st;
    if (st != PD_OK) { /* every request of the round fails with the group */
        if (c != NULL)
            c->step_status = st;
        for (uint32_t i = 0; i < s->n_items; i++)
            s->items[i]->step_status = st;
        s->status = st;
    }
}

/* One step: the chunk (if any) and the batch in the same forward passes
 * (the engine's `step`); should that fail, or the engine have none, the
 * chunk and the batch run apart, so each learns its own status. */
void dec_step_run(eng_job_t *job)
{
    dec_step_t *s = (dec_step_t *)job;
    dec_t *d = s->d;
    void *arena = kvx_region_base(d->n.region);
    uint32_t vocab = d->n.geom->vocab_size;
    if (d->n.ops->set_threads != NULL)
        d->n.ops->set_threads(d->n.model, s->threads);
    s->start_ns = pd_now_ns();
    s->status = PD_OK;
    dec_req_t *c = s->chunk;
    for (uint32_t i = 0; i < s->n_items; i++) {
        dec_req_t *r = s->items[i];
        s->eitems[i] = (eng_decode_item_t){ r->nr.blocks, r->nr.n_blocks,
                                            r->n_prompt + r->n_gen - 1,
                                            r->tok[r->n_prompt + r->n_gen - 1] };
    }
    s->ep_status = PD_OK;
    if (d->n.ep_win != NULL) {
        dec_ep_round(d, s, arena);
        s->end_ns = pd_now_ns();
        return;
    }
    if (d->n.ops->step != NULL && c != NULL && s->n_items > 0 && d->cfg.fused_step) {
        eng_chunk_t ch = { c->nr.blocks, c->nr.n_blocks, c->tok + c->kv_have, c->chunk_n,
                           c->kv_have, c->chunk_logits };
        pd_status_t st = d->n.ops->step(d->n.model, arena, &ch, s->eitems, s->n_items,
                                        s->logits);
        if (st == PD_OK) {
            c->step_status = PD_OK;
            dec_chunk_sample(d, c, s->logits);
            dec_items_sample(d, s, PD_OK, s->logits + (c->chunk_logits ? vocab : 0));
            s->fused = true;
            s->end_ns = pd_now_ns();
            return;
        }
    }
    s->fused = false;
    if (c != NULL) {
        c->step_status = d->n.ops->prefill(d->n.model, arena, c->nr.blocks, c->nr.n_blocks,
                                         c->tok + c->kv_have, c->chunk_n, c->kv_have,
                                         c->chunk_logits ? s->logits : NULL);
        dec_chunk_sample(d, c, s->logits);
    }
    if (s->n_items > 0)
        dec_items_sample(d, s,
                         d->n.ops->decode(d->n.model, arena, s->eitems, s->n_items, s->logits),
                         s->logits);
    s->end_ns = pd_now_ns();
}

/* ---- tpot-target: chunk size and threads from measured step times ----- */
#define DEC_SM_NEW 0.1   /* weight of a new sample in the running means */

static uint32_t dec_sm_k(uint32_t k)
{
    return k == 0 ? 1 : k > DEC_SM_THREADS ? DEC_SM_THREADS : k;
}

/* Learn from a finished step: without a chunk it is the batch's base
 * time; with one (fused, or apart: the same work), what it took beyond the
 * base, per chunk token. Both per thread count k. */
void dec_sm_add(dec_step_model_t *m, uint32_t k, uint32_t chunk, uint32_t items, double t)
{
    k = dec_sm_k(k);
    if (chunk == 0) {
        if (items == 0)
            return;
        m->base_ns[k] = m->n_base[k]++ ? m->base_ns[k] + DEC_SM_NEW * (t - m->base_ns[k]) : t;
        return;
    }
    double per = (t - (items > 0 && m->n_base[k] ? m->base_ns[k] : 0.0)) / chunk;
    if (per <= 0)
        return;
    m->tok_ns[k] = m->n_tok[k]++ ? m->tok_ns[k] + DEC_SM_NEW * (per - m->tok_ns[k]) : per;
}

/* What a finished step's chunk cost beyond the batch's own step (the base
 * on k threads), ns: a prompt's share of a fused step (its decode-local
 * prompt time, FINISH prefill_ns: the routers' and the planner's local rate;
 * the whole step overstated a short prompt's cost several times). The whole
 * step without running sequences or before a base was seen. */
double dec_sm_chunk_ns(const dec_step_model_t *m, uint32_t k, uint32_t items, double t)
{
    k = dec_sm_k(k);
    if (items == 0 || m->n_base[k] == 0)
        return t;
    return t > m->base_ns[k] ? t - m->base_ns[k] : 0;
}

/* Tokens the next chunk may take beside n_items running sequences so the
 * step's predicted time (the batch's base + chunk x a token's cost, on k
 * threads) stays within tpot-target: at least one block (a prompt always
 * moves on), at most prefill-chunk; one block until both costs have been
 * seen. No running sequence: nothing to protect, prefill-chunk. */
uint32_t dec_chunk_budget(const dec_t *d, uint32_t n_items, uint32_t k)
{
    uint32_t hi = (uint32_t)d->cfg.prefill_chunk, lo = d->n.geom->block_tokens;
    lo = lo < hi ? lo : hi;
    if (d->cfg.tpot_target_ns == 0 || n_items == 0)
        return hi;
    const dec_step_model_t *m = &d->sm;
    k = dec_sm_k(k);
    if (m->n_base[k] == 0 || m->n_tok[k] == 0)
        return lo;
    double rows = ((double)d->cfg.tpot_target_ns - m->base_ns[k]) / m->tok_ns[k];
    return rows <= lo ? lo : rows >= hi ? hi : (uint32_t)rows;
}

uint32_t dec_threads_pick(const dec_t *d, uint32_t n_items, uint32_t want_after)
{
    uint32_t all = d->n.threads ? d->n.threads : 1;
    if (all <= 1 || d->cfg.tpot_target_ns == 0 || want_after == 0 || n_items == 0)
        return all;
    const dec_step_model_t *m = &d->sm;
    double target = 0.9 * (double)d->cfg.tpot_target_ns;
    uint32_t floor = all > want_after ? all - want_after : 1;
    uint32_t k = all;
    while (k > floor && k - 1 <= DEC_SM_THREADS) {
        uint32_t j = k - 1;
        if (m->n_base[j] > 0) {
            if (m->base_ns[j] > target)
                break;
            k = j;
            continue;
        }
        /* unseen: try it when the count above predicts it fits */
        if (k <= DEC_SM_THREADS && m->n_base[k] > 0 && m->base_ns[k] * k / j <= target)
            k = j;
        break;
    }
    return k;
}
