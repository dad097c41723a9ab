/* rtr_policy.c - the router's choice of daemons: eligibility and load of
 * each backend, the prefill / decode / prefix-source pickers, and whether
 * to disaggregate. Pure (rtr_policy.h). */
#include "rtr_policy.h"

/* Round-robin order: candidates are visited starting after the cursor, so
 * among equals the first one visited wins and the cursor moves past it. */
static size_t rr_index(size_t i, size_t n, uint32_t cursor)
{
    return (cursor + 1 + i) % n;
}

int rtr_pick_prefill(const rtr_backend_load_t *b, size_t n, uint32_t *rr_cursor)
{
    int best = -1;
    for (size_t i = 0; i < n; i++) {
        size_t k = rr_index(i, n, *rr_cursor);
        if (!b[k].eligible)
            continue;
        if (best < 0 || b[k].outstanding_prefill_tokens < b[best].outstanding_prefill_tokens)
            best = (int)k;
    }
    if (best >= 0)
        *rr_cursor = (uint32_t)best;
    return best;
}

static uint64_t kv_cost(const rtr_backend_load_t *b, uint32_t cached, uint32_t prompt)
{
    uint32_t reuse = prompt == 0 ? 0 : cached < prompt - 1 ? cached : prompt - 1;
    return b->outstanding_prefill_tokens + (prompt - reuse);
}

int rtr_pick_prefill_kv(const rtr_backend_load_t *b, const uint32_t *cached, size_t n,
                        uint32_t prompt, uint32_t *rr_cursor)
{
    int best = -1;
    uint64_t best_cost = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = rr_index(i, n, *rr_cursor);
        if (!b[k].eligible)
            continue;
        uint64_t c = kv_cost(&b[k], cached[k], prompt);
        if (best < 0 || c < best_cost || (c == best_cost && cached[k] > cached[best])) {
            best = (int)k;
            best_cost = c;
        }
    }
    if (best >= 0)
        *rr_cursor = (uint32_t)best;
    return best;
}

static bool decode_better(const rtr_backend_load_t *a, const rtr_backend_load_t *b,
                          uint32_t needed)
{
    bool a_fits = a->free_blocks >= needed, b_fits = b->free_blocks >= needed;
    if (a_fits != b_fits)
        return a_fits;
    if (a->free_blocks != b->free_blocks)
        return a->free_blocks > b->free_blocks;
    return a->running_seqs < b->running_seqs;
}

int rtr_pick_decode(const rtr_backend_load_t *b, size_t n, uint32_t needed_blocks,
                    uint32_t *rr_cursor)
{
    int best = -1;
    for (size_t i = 0; i < n; i++) {
        size_t k = rr_index(i, n, *rr_cursor);
        if (!b[k].eligible)
            continue;
        if (best < 0 || decode_better(&b[k], &b[best], needed_blocks))
            best = (int)k;
    }
    if (best >= 0)
        *rr_cursor = (uint32_t)best;
    return best;
}

int rtr_pick_decode_kv(const rtr_backend_load_t *b, const uint32_t *cached, size_t n,
                       uint32_t needed_blocks, uint32_t *rr_cursor)
{
    bool any_fit = false;
    uint32_t min_run = UINT32_MAX;
    for (size_t k = 0; k < n; k++)
        if (b[k].eligible && b[k].free_blocks >= needed_blocks) {
            any_fit = true;
            if (b[k].running_seqs < min_run)
                min_run = b[k].running_seqs;
        }
    int best = -1;
    for (size_t i = 0; any_fit && i < n; i++) {
        size_t k = rr_index(i, n, *rr_cursor);
        if (!b[k].eligible || cached[k] == 0 || b[k].free_blocks < needed_blocks ||
            b[k].running_seqs > min_run + RTR_DECODE_AFFINITY_SLACK)
            continue;
        if (best < 0 || cached[k] > cached[best] ||
            (cached[k] == cached[best] && decode_better(&b[k], &b[best], needed_blocks)))
            best = (int)k;
    }
    if (best < 0)
        return rtr_pick_decode(b, n, needed_blocks, rr_cursor);
    *rr_cursor = (uint32_t)best;
    return best;
}

int rtr_pick_prefix_source(const rtr_backend_load_t *b, const uint32_t *cached, size_t n,
                           uint32_t prompt_tokens, uint32_t prefill_cached,
                           uint32_t min_gain_tokens, int prefer)
{
    if (min_gain_tokens == 0 || prompt_tokens < 2 || cached == NULL)
        return -1;
    uint64_t need = (uint64_t)prefill_cached + min_gain_tokens;
    int best = -1;
    uint32_t best_held = 0;
    for (size_t k = 0; k < n; k++) {
        if (!b[k].eligible)
            continue;
        uint32_t held = cached[k] < prompt_tokens - 1 ? cached[k] : prompt_tokens - 1;
        if (held < need)
            continue;
        bool better = best < 0 || held > best_held;
        if (!better && held == best_held && best != prefer)
            better = (int)k == prefer || b[k].running_seqs < b[best].running_seqs;
        if (better) {
            best = (int)k;
            best_held = held;
        }
    }
    return best;
}

static uint32_t held_of(uint32_t cached, uint32_t prompt)
{
    return prompt == 0 ? 0 : (cached < prompt - 1 ? cached : prompt - 1);
}

bool rtr_should_disaggregate(rtr_disagg_mode_t mode, const rtr_disagg_in_t *in,
                             uint32_t threshold, bool prefill, rtr_disagg_why_t *why)
{
    rtr_disagg_why_t w = { 0 };
    w.uncached = in->prompt_tokens - held_of(in->decode_cached, in->prompt_tokens);
    bool disagg = false;
    if (!prefill)
        disagg = false;
    else if (mode == RTR_DISAGG_ALWAYS)
        disagg = true;
    else if (mode == RTR_DISAGG_NEVER)
        disagg = false;
    else if (mode == RTR_DISAGG_COST && in->pf_tok_ns > 0 && in->pull_tok_ns > 0) {
        uint32_t pf_work = in->prompt_tokens - held_of(in->prefill_cached, in->prompt_tokens);
        /* the same model on the same kind of engine: until a decode-local
         * prefill is measured, the prefills' rate (else it never would be) */
        double dec_tok_ns = in->dec_tok_ns > 0 ? in->dec_tok_ns : in->pf_tok_ns;
        w.measured = true;
        w.local_ns = (double)w.uncached * dec_tok_ns * (1.0 + in->decode_running);
        w.disagg_ns = ((double)in->prefill_outstanding + pf_work) * in->pf_tok_ns +
                      (double)w.uncached * in->pull_tok_ns + in->hop_ns;
        disagg = w.disagg_ns < w.local_ns;
    } else {
        disagg = w.uncached >= threshold;
    }
    if (why != NULL)
        *why = w;
    return disagg;
}

bool rtr_finish_in_place(uint32_t tokens_left, double step_ns, uint32_t kv_tokens,
                         double move_tok_ns, double pull_tok_ns, double hop_ns)
{
    double move_ns = move_tok_ns > 0   ? (double)kv_tokens * move_tok_ns
                     : pull_tok_ns > 0 ? (double)kv_tokens * pull_tok_ns + 2.0 * hop_ns
                                       : 0;
    return step_ns > 0 && move_ns > 0 && (double)tokens_left * step_ns <= move_ns;
}

/* ---- the router's backend choice ------------------------------------------ */

static bool eligible(const rtr_backend_view_t *v, size_t k, const rtr_choice_t *c)
{
    return v->up && v->ready && !v->draining && (v->caps & c->caps) == c->caps &&
           (int)k != c->exclude;
}

int rtr_policy_choose(const rtr_backend_view_t *v, size_t n, const rtr_choice_t *c,
                      rtr_rr_t *rr)
{
    rtr_backend_load_t loads[RTR_POLICY_MAX_BACKENDS];
    if (n > RTR_POLICY_MAX_BACKENDS)
        n = RTR_POLICY_MAX_BACKENDS;
    for (size_t k = 0; k < n; k++) {
        loads[k].eligible = eligible(&v[k], k, c);
        if (c->what == RTR_CHOOSE_ANY && loads[k].eligible)
            return (int)k;
        loads[k].outstanding_prefill_tokens =
            c->outstanding != NULL ? c->outstanding[k] : v[k].outstanding_prefill_tokens;
        loads[k].free_blocks = c->free_blocks != NULL ? c->free_blocks[k] : v[k].free_blocks;
        loads[k].running_seqs = v[k].running_seqs + v[k].assigned;
    }
    const uint32_t *cached = c->cached_tokens;
    switch (c->what) {
    case RTR_CHOOSE_PREFILL:
        return cached != NULL
            ? rtr_pick_prefill_kv(loads, cached, n, c->prompt_tokens, &rr->prefill)
            : rtr_pick_prefill(loads, n, &rr->prefill);
    case RTR_CHOOSE_DECODE:
        return cached != NULL
            ? rtr_pick_decode_kv(loads, cached, n, c->needed_blocks, &rr->decode)
            : rtr_pick_decode(loads, n, c->needed_blocks, &rr->decode);
    case RTR_CHOOSE_PREFIX_SOURCE:
        return rtr_pick_prefix_source(loads, cached, n, c->prompt_tokens, c->prefill_cached,
                                      c->min_gain_tokens, c->prefer);
    case RTR_CHOOSE_ANY:
    default:
        return -1;
    }
}
