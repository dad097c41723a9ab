/* eng_sample.c - sampling (greedy, temperature, top-k, top-p, min-p; logit
 * bias; presence, frequency and repetition penalties), per-sequence PRNG and
 * token-level stop conditions. See eng_sample.h. */
#include "eng_sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t eng_rng_next(eng_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double eng_rng_uniform(eng_rng_t *r)
{
    return (double)(eng_rng_next(r) >> 11) * 0x1.0p-53;
}

void eng_sample_params_default(eng_sample_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
}

static bool in_range(float v, float lo, float hi)
{
    return isfinite(v) && v >= lo && v <= hi;
}

pd_status_t eng_sample_params_check(const eng_sample_params_t *p)
{
    if (!p || !isfinite(p->temperature) || p->temperature < 0.0f)
        return PD_ERR_BAD_INPUT;
    if (!in_range(p->top_p, 0.0f, 1.0f) || !in_range(p->min_p, 0.0f, 1.0f))
        return PD_ERR_BAD_INPUT;
    if (!in_range(p->presence_penalty, -2.0f, 2.0f) ||
        !in_range(p->frequency_penalty, -2.0f, 2.0f) ||
        !in_range(p->repetition_penalty, 0.0f, 2.0f))
        return PD_ERR_BAD_INPUT;
    if (p->n_eos > ENG_SAMPLE_MAX_EOS || p->n_stop_ids > ENG_SAMPLE_MAX_STOP_IDS ||
        p->n_bias > ENG_SAMPLE_MAX_BIAS)
        return PD_ERR_BAD_INPUT;
    for (uint32_t i = 0; i < p->n_bias; i++)
        if (p->bias[i].id < 0 || !in_range(p->bias[i].bias, -100.0f, 100.0f))
            return PD_ERR_BAD_INPUT;
    if (p->max_tokens && p->min_tokens > p->max_tokens)
        return PD_ERR_BAD_INPUT;
    return PD_OK;
}

void eng_sampler_init(eng_sampler_t *s, const eng_sample_params_t *p)
{
    memset(s, 0, sizeof(*s));
    s->p = *p;
    if (s->p.n_eos > ENG_SAMPLE_MAX_EOS)
        s->p.n_eos = ENG_SAMPLE_MAX_EOS;
    if (s->p.n_stop_ids > ENG_SAMPLE_MAX_STOP_IDS)
        s->p.n_stop_ids = ENG_SAMPLE_MAX_STOP_IDS;
    if (s->p.n_bias > ENG_SAMPLE_MAX_BIAS)
        s->p.n_bias = ENG_SAMPLE_MAX_BIAS;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        s->rng.s[i] = splitmix64(&x);
}

pd_status_t eng_sample_scratch_create(eng_sample_scratch_t *scr, uint32_t vocab)
{
    memset(scr, 0, sizeof(*scr));
    scr->idx = malloc((size_t)vocab * sizeof(*scr->idx));
    scr->prob = malloc((size_t)vocab * sizeof(*scr->prob));
    scr->cnt = calloc(vocab ? vocab : 1, sizeof(*scr->cnt));
    scr->raw = malloc((size_t)(vocab ? vocab : 1) * sizeof(*scr->raw));
    if (!scr->idx || !scr->prob || !scr->cnt || !scr->raw) {
        eng_sample_scratch_destroy(scr);
        return PD_ERR_NO_MEMORY;
    }
    scr->cap = vocab;
    return PD_OK;
}

void eng_sample_scratch_destroy(eng_sample_scratch_t *scr)
{
    if (!scr)
        return;
    free(scr->idx);
    free(scr->prob);
    free(scr->cnt);
    free(scr->raw);
    memset(scr, 0, sizeof(*scr));
}

static bool in_list(const int32_t *ids, uint32_t n, int32_t t)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] == t)
            return true;
    return false;
}

/* Candidate order: higher logit first, lower id on ties. */
static inline bool cand_before(const float *lg, uint32_t a, uint32_t b)
{
    return lg[a] > lg[b] || (lg[a] == lg[b] && a < b);
}

/* Min-heap (worst candidate at the root) of candidate ids. */
static void heap_sift_down(uint32_t *h, uint32_t n, uint32_t i, const float *lg)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && cand_before(lg, h[w], h[l]))
            w = l;
        if (r < n && cand_before(lg, h[w], h[r]))
            w = r;
        if (w == i)
            return;
        uint32_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* The m best ids of lg, best first, into out (m <= vocab). */
static void top_m(const float *lg, uint32_t vocab, uint32_t m, uint32_t *out)
{
    for (uint32_t i = 0; i < m; i++)
        out[i] = i;
    for (int64_t i = (int64_t)m / 2 - 1; i >= 0; i--)
        heap_sift_down(out, m, (uint32_t)i, lg);
    for (uint32_t i = m; i < vocab; i++) {
        if (cand_before(lg, i, out[0])) {
            out[0] = i;
            heap_sift_down(out, m, 0, lg);
        }
    }
    /* heap sort: repeatedly move the worst to the end */
    for (uint32_t n = m; n > 1; n--) {
        uint32_t t = out[0];
        out[0] = out[n - 1];
        out[n - 1] = t;
        heap_sift_down(out, n - 1, 0, lg);
    }
}

#define CNT_PROMPT 0x80000000u /* scr->cnt: the id is in the prompt */

static bool rep_on(const eng_sample_params_t *p)
{
    return p->repetition_penalty > 0.0f && p->repetition_penalty != 1.0f;
}

/* Repetition, frequency and presence penalties, each distinct id once.
 * scr->cnt is zero on entry and on return. */
static void apply_penalties(const eng_sample_params_t *p, float *lg, uint32_t vocab,
                            eng_sample_scratch_t *scr, const eng_sample_hist_t *h)
{
    const bool rep = rep_on(p);
    const bool fp = p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
    if ((!rep && !fp) || h == NULL)
        return;
    uint32_t *cnt = scr->cnt;
    uint32_t np = rep ? h->n_prompt : 0;
    for (uint32_t i = 0; i < np; i++) {
        int32_t t = h->prompt[i];
        if (t >= 0 && (uint32_t)t < vocab)
            cnt[t] |= CNT_PROMPT;
    }
    for (uint32_t i = 0; i < h->n_gen; i++) {
        int32_t t = h->gen[i];
        if (t >= 0 && (uint32_t)t < vocab)
            cnt[t]++;
    }
    for (uint32_t k = 0; k < np + h->n_gen; k++) {
        int32_t t = k < np ? h->prompt[k] : h->gen[k - np];
        if (t < 0 || (uint32_t)t >= vocab || cnt[t] == 0)
            continue; /* out of range, or done already */
        uint32_t c = cnt[t] & ~CNT_PROMPT;
        float l = lg[t];
        if (rep)
            l = l > 0.0f ? l / p->repetition_penalty : l * p->repetition_penalty;
        l -= p->frequency_penalty * (float)c + p->presence_penalty * (c > 0 ? 1.0f : 0.0f);
        lg[t] = l;
        cnt[t] = 0;
    }
}

void eng_sample_adjust(const eng_sampler_t *s, float *lg, uint32_t vocab,
                       eng_sample_scratch_t *scr, const eng_sample_hist_t *hist)
{
    const eng_sample_params_t *p = &s->p;
    for (uint32_t i = 0; i < p->n_bias; i++)
        if (p->bias[i].id >= 0 && (uint32_t)p->bias[i].id < vocab)
            lg[p->bias[i].id] += p->bias[i].bias;
    if (s->n_generated < p->min_tokens) {
        for (uint32_t i = 0; i < p->n_eos; i++)
            if (p->eos_ids[i] >= 0 && (uint32_t)p->eos_ids[i] < vocab && !p->ignore_eos)
                lg[p->eos_ids[i]] = -INFINITY;
        for (uint32_t i = 0; i < p->n_stop_ids; i++)
            if (p->stop_ids[i] >= 0 && (uint32_t)p->stop_ids[i] < vocab)
                lg[p->stop_ids[i]] = -INFINITY;
    }
    apply_penalties(p, lg, vocab, scr, hist);
}

/* The candidates of one sampled step (temperature > 0, top_k != 1), with
 * unnormalized probabilities exp((logit - max) / T) (the best one is 1):
 * dense: prob[i] is token i's, for every id; otherwise idx[0..n) best
 * first with prob[0..n). Tokens cut by min_p have prob 0 (dense) or are
 * past n. *mass_p = the sum over the kept candidates. */
typedef struct {
    bool dense;
    uint32_t n;
    double mass;
} cands_t;

static cands_t candidates(const eng_sample_params_t *p, const float *lg, uint32_t vocab,
                          uint32_t best, eng_sample_scratch_t *scr)
{
    cands_t c = { false, 0, 0.0 };
    const double inv_t = 1.0 / (double)p->temperature;
    const double mx = lg[best];
    const bool use_p = p->top_p > 0.0f && p->top_p < 1.0f;
    const double min_p = p->min_p > 0.0f ? (double)p->min_p : 0.0;
    uint32_t m = p->top_k > 0 && p->top_k < vocab ? p->top_k : vocab;

    if (m == vocab && !use_p) {
        /* plain temperature sampling: walk in id order */
        c.dense = true;
        c.n = vocab;
        for (uint32_t i = 0; i < vocab; i++) {
            /* masked (-inf) logits skip exp(), whose -inf path is slow */
            double e = lg[i] == -INFINITY ? 0.0 : exp(((double)lg[i] - mx) * inv_t);
            if (e < min_p)
                e = 0.0;
            scr->prob[i] = e;
            c.mass += e;
        }
        return c;
    }

    /* Mass of the whole (top-k truncated) distribution. */
    double total = 0.0;
    if (m == vocab)
        for (uint32_t i = 0; i < vocab; i++)
            if (lg[i] != -INFINITY)
                total += exp(((double)lg[i] - mx) * inv_t);

    /* Candidates best-first; for top-p alone grow the list until it holds
     * the nucleus (the sorted prefix is the same whatever the list size). */
    uint32_t n = m < 64 || m != vocab ? m : 64;
    uint32_t keep;
    for (;;) {
        top_m(lg, vocab, n, scr->idx);
        for (uint32_t i = 0; i < n; i++)
            scr->prob[i] = exp(((double)lg[scr->idx[i]] - mx) * inv_t);
        if (m != vocab) {
            total = 0.0;
            for (uint32_t i = 0; i < n; i++)
                total += scr->prob[i];
        }
        keep = n;
        if (use_p) {
            double acc = 0.0, target = (double)p->top_p * total;
            keep = 0;
            for (uint32_t i = 0; i < n; i++) {
                acc += scr->prob[i];
                keep = i + 1;
                if (acc >= target)
                    break;
            }
            if (acc < target && n < m) {
                n = n * 4 < m ? n * 4 : m;
                continue;
            }
        }
        break;
    }
    /* min_p: probabilities relative to the best one, which is 1 here */
    while (keep > 1 && scr->prob[keep - 1] < min_p)
        keep--;
    c.n = keep;
    for (uint32_t i = 0; i < keep; i++)
        c.mass += scr->prob[i];
    return c;
}

static uint32_t argmax(const float *lg, uint32_t vocab)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < vocab; i++)
        if (lg[i] > lg[best])
            best = i;
    return best;
}

int32_t eng_sample_next(eng_sampler_t *s, float *lg, uint32_t vocab,
                        eng_sample_scratch_t *scr, const eng_sample_hist_t *hist)
{
    if (vocab == 0 || !scr || vocab > scr->cap)
        return -1;
    const eng_sample_params_t *p = &s->p;
    eng_sample_adjust(s, lg, vocab, scr, hist);
    uint32_t best = argmax(lg, vocab);
    if (!(p->temperature > 0.0f))
        return (int32_t)best;
    if (p->top_k == 1) {
        (void)eng_rng_next(&s->rng); /* one draw per sampled token, always */
        return (int32_t)best;
    }
    cands_t c = candidates(p, lg, vocab, best, scr);
    double r = eng_rng_uniform(&s->rng) * c.mass, acc = 0.0;
    if (c.dense) {
        uint32_t last = best;
        for (uint32_t i = 0; i < vocab; i++) {
            if (scr->prob[i] <= 0.0)
                continue;
            acc += scr->prob[i];
            last = i;
            if (r < acc)
                return (int32_t)i;
        }
        return (int32_t)last;
    }
    for (uint32_t i = 0; i < c.n; i++) {
        acc += scr->prob[i];
        if (r < acc)
            return (int32_t)scr->idx[i];
    }
    return (int32_t)scr->idx[c.n - 1];
}

bool eng_sample_probs(const eng_sampler_t *s, float *lg, uint32_t vocab,
                      eng_sample_scratch_t *scr, const eng_sample_hist_t *hist, double *probs)
{
    if (vocab == 0 || !scr || vocab > scr->cap)
        return false;
    const eng_sample_params_t *p = &s->p;
    eng_sample_adjust(s, lg, vocab, scr, hist);
    uint32_t best = argmax(lg, vocab);
    memset(probs, 0, (size_t)vocab * sizeof(*probs));
    if (!(p->temperature > 0.0f) || p->top_k == 1) {
        probs[best] = 1.0;
        return true;
    }
    cands_t c = candidates(p, lg, vocab, best, scr);
    if (c.dense) {
        for (uint32_t i = 0; i < vocab; i++)
            probs[i] = scr->prob[i] / c.mass;
    } else {
        for (uint32_t i = 0; i < c.n; i++)
            probs[scr->idx[i]] = scr->prob[i] / c.mass;
    }
    return true;
}

void eng_sample_logprobs(const float *raw, uint32_t vocab, int32_t chosen, uint32_t n_top,
                         eng_logprobs_t *out)
{
    memset(out, 0, sizeof(*out));
    if (vocab == 0)
        return;
    uint32_t best = argmax(raw, vocab);
    double mx = raw[best], sum = 0.0;
    for (uint32_t i = 0; i < vocab; i++)
        sum += exp((double)raw[i] - mx);
    double lse = mx + log(sum);
    if (chosen >= 0 && (uint32_t)chosen < vocab)
        out->logprob = (float)((double)raw[chosen] - lse);
    else
        out->logprob = -INFINITY;
    uint32_t m = n_top < ENG_SAMPLE_MAX_TOP_LOGPROBS ? n_top : ENG_SAMPLE_MAX_TOP_LOGPROBS;
    if (m > vocab)
        m = vocab;
    uint32_t idx[ENG_SAMPLE_MAX_TOP_LOGPROBS];
    if (m > 0)
        top_m(raw, vocab, m, idx);
    for (uint32_t i = 0; i < m; i++) {
        out->top_ids[i] = (int32_t)idx[i];
        out->top_lp[i] = (float)((double)raw[idx[i]] - lse);
    }
    out->n_top = m;
}

int32_t eng_sample_next_lp(eng_sampler_t *s, float *lg, uint32_t vocab,
                           eng_sample_scratch_t *scr, const eng_sample_hist_t *hist,
                           uint32_t n_top, eng_logprobs_t *lp)
{
    if (lp == NULL || vocab == 0 || !scr || vocab > scr->cap)
        return eng_sample_next(s, lg, vocab, scr, hist);
    memcpy(scr->raw, lg, (size_t)vocab * sizeof(*lg));
    int32_t t = eng_sample_next(s, lg, vocab, scr, hist);
    eng_sample_logprobs(scr->raw, vocab, t, n_top, lp);
    return t;
}

eng_finish_t eng_sampler_accept(eng_sampler_t *s, int32_t token)
{
    const eng_sample_params_t *p = &s->p;
    s->n_generated++;
    if (!p->ignore_eos && in_list(p->eos_ids, p->n_eos, token))
        return ENG_FINISH_STOP;
    if (in_list(p->stop_ids, p->n_stop_ids, token))
        return ENG_FINISH_STOP;
    if (p->max_tokens && s->n_generated >= p->max_tokens)
        return ENG_FINISH_LENGTH;
    return ENG_FINISH_NONE;
}

eng_finish_t eng_sampler_replay(eng_sampler_t *s, int32_t token)
{
    if (s->p.temperature > 0.0f)
        (void)eng_rng_next(&s->rng);
    return eng_sampler_accept(s, token);
}

const char *eng_finish_name(eng_finish_t f)
{
    switch (f) {
    case ENG_FINISH_STOP: return "stop";
    case ENG_FINISH_LENGTH: return "length";
    default: return NULL;
    }
}

static void put64(uint8_t *o, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        o[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *in)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)in[i] << (8 * i);
    return v;
}

void eng_sampler_state_pack(const eng_sampler_t *s, uint8_t out[ENG_SAMPLER_STATE_BYTES])
{
    for (int i = 0; i < 4; i++)
        put64(out + 8 * i, s->rng.s[i]);
    put64(out + 32, s->n_generated);
}

void eng_sampler_state_unpack(eng_sampler_t *s, const uint8_t in[ENG_SAMPLER_STATE_BYTES])
{
    for (int i = 0; i < 4; i++)
        s->rng.s[i] = get64(in + 8 * i);
    uint64_t n = get64(in + 32);
    s->n_generated = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}
