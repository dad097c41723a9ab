/* test_sample.c - sampling: greedy, seeded reproducibility, state hand-off,
 * top-k / top-p on known distributions, token-level stop rules. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eng_sample.h"

static void fill_log(float *lg, const double *p, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        lg[i] = (float)log(p[i]);
}

/* Draw `draws` tokens from probs with params, counting per token. */
static void histogram(const double *probs, uint32_t n, const eng_sample_params_t *p,
                      uint32_t draws, uint32_t *count)
{
    eng_sampler_t s;
    eng_sample_scratch_t scr;
    assert_int_equal(eng_sample_scratch_create(&scr, n), PD_OK);
    eng_sampler_init(&s, p);
    float *lg = malloc(n * sizeof(float));
    memset(count, 0, n * sizeof(*count));
    for (uint32_t d = 0; d < draws; d++) {
        fill_log(lg, probs, n);
        int32_t t = eng_sample_next(&s, lg, n, &scr, NULL);
        assert_true(t >= 0 && (uint32_t)t < n);
        count[t]++;
    }
    free(lg);
    eng_sample_scratch_destroy(&scr);
}

static void test_greedy(void **state)
{
    (void)state;
    eng_sample_params_t p;
    eng_sample_params_default(&p);
    eng_sampler_t s;
    eng_sampler_init(&s, &p);
    eng_sample_scratch_t scr;
    assert_int_equal(eng_sample_scratch_create(&scr, 5), PD_OK);
    float lg[5] = { 0.1f, 2.0f, -1.0f, 2.0f, 1.9f };
    assert_int_equal(eng_sample_next(&s, lg, 5, &scr, NULL), 1); /* tie: lowest id */
    /* greedy does not advance the PRNG */
    eng_sampler_t s0;
    eng_sampler_init(&s0, &p);
    assert_memory_equal(&s.rng, &s0.rng, sizeof(s.rng));
    /* top_k = 1 is greedy as well */
    p.temperature = 1.0f;
    p.top_k = 1;
    eng_sampler_init(&s, &p);
    float lg2[5] = { 0.1f, 0.5f, 3.0f, 2.0f, 1.9f };
    assert_int_equal(eng_sample_next(&s, lg2, 5, &scr, NULL), 2);
    eng_sample_scratch_destroy(&scr);
}

/* temperature > 0: exactly one draw per token, for every top_k/top_p, so
 * replaying tokens sampled elsewhere reproduces the sampler state. */
static void test_one_draw_per_token_and_replay(void **state)
{
    (void)state;
    enum { V = 300 };
    static const struct { uint32_t top_k; float top_p; } cfg[] = {
        { 0, 1.0f }, { 1, 1.0f }, { 5, 1.0f }, { 0, 0.3f }, { 40, 0.9f },
    };
    eng_sample_scratch_t scr;
    assert_int_equal(eng_sample_scratch_create(&scr, V), PD_OK);
    float lg[V];
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
        eng_sample_params_t p;
        eng_sample_params_default(&p);
        p.temperature = 0.8f;
        p.top_k = cfg[c].top_k;
        p.top_p = cfg[c].top_p;
        p.seed = 99;
        eng_sampler_t s, r, ref;
        eng_sampler_init(&s, &p);
        eng_sampler_init(&r, &p);
        eng_sampler_init(&ref, &p);
        for (int i = 0; i < 10; i++) {
            for (int v = 0; v < V; v++)
                lg[v] = (float)((v * 37 + i * 11) % 101) / 10.0f;
            int32_t t = eng_sample_next(&s, lg, V, &scr, NULL);
            eng_sampler_accept(&s, t);
            eng_sampler_replay(&r, t);
            (void)eng_rng_next(&ref.rng);
            assert_memory_equal(&s.rng, &ref.rng, sizeof(s.rng));
            assert_memory_equal(&s.rng, &r.rng, sizeof(s.rng));
            assert_int_equal(s.n_generated, r.n_generated);
        }
    }
    eng_sample_scratch_destroy(&scr);
}

static void test_seed_reproducible_and_handoff(void **state)
{
    (void)state;
    enum { V = 50, N = 200 };
    eng_sample_params_t p;
    eng_sample_params_default(&p);
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.top_k = 40;
    p.seed = 1234;
    eng_sample_scratch_t scr;
    assert_int_equal(eng_sample_scratch_create(&scr, V), PD_OK);
    float base[V], lg[V];
    for (int i = 0; i < V; i++)
        base[i] = (float)sin(i * 1.7) * 2.0f;
    int32_t a[N], b[N], c[N];
    eng_sampler_t s;
    eng_sampler_init(&s, &p);
    for (int i = 0; i < N; i++) {
        memcpy(lg, base, sizeof(lg));
        a[i] = eng_sample_next(&s, lg, V, &scr, NULL);
        eng_sampler_accept(&s, a[i]);
    }
    eng_sampler_init(&s, &p);
    for (int i = 0; i < N; i++) {
        memcpy(lg, base, sizeof(lg));
        b[i] = eng_sample_next(&s, lg, V, &scr, NULL);
        eng_sampler_accept(&s, b[i]);
        if (i == 0) {
            /* prefill samples the first token, hands the state to decode */
            uint8_t buf[ENG_SAMPLER_STATE_BYTES];
            eng_sampler_state_pack(&s, buf);
            eng_sampler_t d;
            eng_sampler_init(&d, &p);
            eng_sampler_state_unpack(&d, buf);
            assert_int_equal(d.n_generated, 1);
            s = d;
        }
    }
    assert_memory_equal(a, b, sizeof(a));
    p.seed = 1235;
    eng_sampler_init(&s, &p);
    for (int i = 0; i < N; i++) {
        memcpy(lg, base, sizeof(lg));
        c[i] = eng_sample_next(&s, lg, V, &scr, NULL);
    }
    assert_true(memcmp(a, c, sizeof(a)) != 0);
    eng_sample_scratch_destroy(&scr);
}

static void test_top_k(void **state)
{
    (void)state;
    static const double probs[4] = { 0.4, 0.3, 0.2, 0.1 };
    uint32_t cnt[4];
    eng_sample_params_t p;
    eng_sample_params_default(&p);
    p.temperature = 1.0f;
    p.top_k = 2;
    p.seed = 7;
    histogram(probs, 4, &p, 4000, cnt);
    assert_int_equal(cnt[2] + cnt[3], 0);
    /* renormalized: 4/7 = 0.571; 5 sigma over 4000 draws is ~0.04 */
    assert_true(fabs(cnt[0] / 4000.0 - 4.0 / 7.0) < 0.04);
    /* no truncation: all four appear in proportion */
    p.top_k = 0;
    histogram(probs, 4, &p, 4000, cnt);
    for (int i = 0; i < 4; i++)
        assert_true(fabs(cnt[i] / 4000.0 - probs[i]) < 0.04);
}

static void test_top_p(void **state)
{
    (void)state;
    static const double probs[4] = { 0.4, 0.3, 0.2, 0.1 };
    uint32_t cnt[4];
    eng_sample_params_t p;
    eng_sample_params_default(&p);
    p.temperature = 1.0f;
    p.seed = 9;
    p.top_p = 0.65f; /* 0.4 + 0.3 >= 0.65: keep two */
    histogram(probs, 4, &p, 4000, cnt);
    assert_int_equal(cnt[2] + cnt[3], 0);
    assert_true(fabs(cnt[1] / 4000.0 - 3.0 / 7.0) < 0.04);
    p.top_p = 0.75f; /* needs the third */
    histogram(probs, 4, &p, 4000, cnt);
    assert_int_equal(cnt[3], 0);
    assert_true(cnt[2] > 0);
    assert_true(fabs(cnt[2] / 4000.0 - 0.2 / 0.9) < 0.04);

    /* nucleus larger than the first candidate list (64): uniform over 1000
     * tokens, top_p 0.5 keeps ids 0..499 (ties: lower id first) */
    enum { V = 1000 };
    double *u = malloc(V * sizeof(double));
    uint32_t *c = malloc(V * sizeof(uint32_t));
    for (int i = 0; i < V; i++)
        u[i] = 1.0 / V;
    p.top_p = 0.5f;
    histogram(u, V, &p, 3000, c);
    uint32_t lo = 0;
    for (int i = 0; i < V; i++) {
        if (i >= 500)
            assert_int_equal(c[i], 0);
        else
            lo += c[i] > 0;
    }
    assert_true(lo > 400);
    free(u);
    free(c);
}

static void test_stop_rules(void **state)
{
    (void)state;
    eng_sample_params_t p;
    eng_sample_params_default(&p);
    p.max_tokens = 5;
    p.min_tokens = 2;
    p.n_eos = 1;
    p.eos_ids[0] = 3;
    p.n_stop_ids = 1;
    p.stop_ids[0] = 4;
    assert_int_equal(eng_sample_params_check(&p), PD_OK);
    eng_sampler_t s;
    eng_sampler_init(&s, &p);
    eng_sample_scratch_t scr;
    assert_int_equal(eng_sample_scratch_create(&scr, 5), PD_OK);
    float lg[5] = { 0, 0, 0, 5, 4 };
    /* below min_tokens: EOS and stop ids are masked */
    assert_int_equal(eng_sample_next(&s, lg, 5, &scr, NULL), 0);
    assert_int_equal(eng_sampler_accept(&s, 0), ENG_FINISH_NONE);
    float lg1[5] = { 0, 0, 0, 5, 4 };
    assert_int_equal(eng_sample_next(&s, lg1, 5, &scr, NULL), 0);
    assert_int_equal(eng_sampler_accept(&s, 0), ENG_FINISH_NONE);
    float lg2[5] = { 0, 0, 0, 5, 4 };
    assert_int_equal(eng_sample_next(&s, lg2, 5, &scr, NULL), 3);
    assert_int_equal(eng_sampler_accept(&s, 3), ENG_FINISH_STOP);
    assert_int_equal(eng_sampler_accept(&s, 4), ENG_FINISH_STOP);
    assert_string_equal(eng_finish_name(ENG_FINISH_STOP), "stop");
    /* ignore_eos: EOS does not finish; max_tokens does */
    p.ignore_eos = true;
    eng_sampler_init(&s, &p);
    for (int i = 0; i < 4; i++)
        assert_int_equal(eng_sampler_accept(&s, 3), ENG_FINISH_NONE);
    assert_int_equal(eng_sampler_accept(&s, 3), ENG_FINISH_LENGTH);
    assert_string_equal(eng_finish_name(ENG_FINISH_LENGTH), "length");
    /* bad params */
    p.top_p = 1.5f;
    assert_int_equal(eng_sample_params_check(&p), PD_ERR_BAD_INPUT);
    p.top_p = 1.0f;
    p.temperature = NAN;
    assert_int_equal(eng_sample_params_check(&p), PD_ERR_BAD_INPUT);
    p.temperature = 0;
    p.min_tokens = 9;
    assert_int_equal(eng_sample_params_check(&p), PD_ERR_BAD_INPUT);
    eng_sample_scratch_destroy(&scr);
}

/* ---- penalties, biases, min_p: against a straightforward reference -------- */

/* The documented pipeline, written plainly in double: bias, min_tokens mask,
 * repetition / frequency / presence penalties, then greedy one-hot or
 * softmax(l / T) -> top_k -> top_p -> min_p -> renormalize. */
static void reference_probs(const float *raw, uint32_t V, const eng_sample_params_t *p,
                            uint32_t n_generated, const int32_t *prompt, uint32_t np,
                            const int32_t *gen, uint32_t ng, double *out)
{
    double *l = malloc(V * sizeof(double));
    for (uint32_t i = 0; i < V; i++)
        l[i] = raw[i];
    for (uint32_t i = 0; i < p->n_bias; i++)
        if ((uint32_t)p->bias[i].id < V)
            l[p->bias[i].id] += p->bias[i].bias;
    if (n_generated < p->min_tokens)
        for (uint32_t i = 0; i < p->n_eos; i++)
            l[p->eos_ids[i]] = -INFINITY;
    for (uint32_t t = 0; t < V; t++) {
        uint32_t count = 0;
        bool in_prompt = false;
        for (uint32_t i = 0; i < ng; i++)
            count += gen[i] == (int32_t)t;
        for (uint32_t i = 0; i < np; i++)
            in_prompt = in_prompt || prompt[i] == (int32_t)t;
        double rp = p->repetition_penalty;
        if ((in_prompt || count > 0) && rp > 0 && rp != 1)
            l[t] = l[t] > 0 ? l[t] / rp : l[t] * rp;
        l[t] -= p->frequency_penalty * count + p->presence_penalty * (count > 0);
    }
    uint32_t best = 0;
    for (uint32_t i = 1; i < V; i++)
        if (l[i] > l[best])
            best = i;
    memset(out, 0, V * sizeof(double));
    if (p->temperature <= 0 || p->top_k == 1) {
        out[best] = 1.0;
        free(l);
        return;
    }
    /* order: probability descending, lower id first on ties (selection sort) */
    uint32_t *ord = malloc(V * sizeof(uint32_t));
    double *pr = malloc(V * sizeof(double));
    for (uint32_t i = 0; i < V; i++) {
        ord[i] = i;
        pr[i] = exp((l[i] - l[best]) / p->temperature);
    }
    for (uint32_t i = 0; i < V; i++)
        for (uint32_t j = i + 1; j < V; j++)
            if (pr[ord[j]] > pr[ord[i]] || (pr[ord[j]] == pr[ord[i]] && ord[j] < ord[i])) {
                uint32_t x = ord[i];
                ord[i] = ord[j];
                ord[j] = x;
            }
    uint32_t keep = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    double total = 0;
    for (uint32_t i = 0; i < keep; i++)
        total += pr[ord[i]];
    if (p->top_p > 0 && p->top_p < 1) {
        double acc = 0;
        uint32_t k = 0;
        while (k < keep && acc < p->top_p * total)
            acc += pr[ord[k++]];
        keep = k;
    }
    double sum = 0;
    for (uint32_t i = 0; i < keep; i++) {
        if (pr[ord[i]] < p->min_p * pr[ord[0]])
            break;
        out[ord[i]] = pr[ord[i]];
        sum += pr[ord[i]];
    }
    for (uint32_t i = 0; i < V; i++)
        out[i] /= sum;
    free(ord);
    free(pr);
    free(l);
}

static uint32_t lcg(uint32_t *x)
{
    *x = *x * 1664525u + 1013904223u;
    return *x >> 8;
}

/* Hand-computed values: vLLM's repetition penalty divides positive logits and
 * multiplies negative ones; frequency/presence count generated tokens only. */
static void test_adjust_values(void **state)
{
    (void)state;
    eng_sample_params_t p;
    eng_sample_params_default(&p);
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.n_bias = 2;
    p.bias[0] = (eng_logit_bias_t){ 4, 1.5f };
    p.bias[1] = (eng_logit_bias_t){ 99, 50.0f }; /* out of the vocabulary: ignored */
    eng_sampler_t s;
    eng_sampler_init(&s, &p);
    eng_sample_scratch_t scr;
    assert_int_equal(eng_sample_scratch_create(&scr, 6), PD_OK);
    float lg[6] = { 2.0f, -1.0f, 0.5f, 3.0f, 1.0f, 7.0f };
    const int32_t prompt[] = { 0, 1, 1, 0 }, gen[] = { 3, 2, 3 };
    eng_sample_hist_t h = { prompt, 4, gen, 3 };
    eng_sample_adjust(&s, lg, 6, &scr, &h);
    assert_float_equal(lg[0], 1.0, 1e-6);                     /* prompt: 2 / 2 */
    assert_float_equal(lg[1], -2.0, 1e-6);                    /* prompt: -1 * 2 */
    assert_float_equal(lg[2], 0.25 - 0.5 - 0.25, 1e-6);       /* generated once */
    assert_float_equal(lg[3], 1.5 - 2 * 0.5 - 0.25, 1e-6);    /* generated twice */
    assert_float_equal(lg[4], 2.5, 1e-6);                     /* bias only */
    assert_float_equal(lg[5], 7.0, 1e-6);                     /* untouched */
    for (uint32_t i = 0; i < 6; i++)
        assert_int_equal(scr.cnt[i], 0);                      /* scratch left clean */
    /* no history: only the bias */
    float lg2[6] = { 2.0f, -1.0f, 0.5f, 3.0f, 1.0f, 7.0f };
    eng_sample_adjust(&s, lg2, 6, &scr, NULL);
    assert_float_equal(lg2[0], 2.0, 1e-6);
    assert_float_equal(lg2[4], 2.5, 1e-6);
    /* greedy picks what the adjusted logits say: a +100 bias wins, -100 loses */
    eng_sample_params_default(&p);
    p.n_bias = 2;
    p.bias[0] = (eng_logit_bias_t){ 2, 100.0f };
    p.bias[1] = (eng_logit_bias_t){ 5, -100.0f };
    eng_sampler_init(&s, &p);
    float lg3[6] = { 2.0f, -1.0f, 0.5f, 3.0f, 1.0f, 7.0f };
    assert_int_equal(eng_sample_next(&s, lg3, 6, &scr, NULL), 2);
    p.bias[0].bias = 0.0f;
    eng_sampler_init(&s, &p);
    float lg4[6] = { 2.0f, -1.0f, 0.5f, 3.0f, 1.0f, 7.0f };
    assert_int_equal(eng_sample_next(&s, lg4, 6, &scr, NULL), 3);
    eng_sample_scratch_destroy(&scr);
}

static void test_probs_vs_reference(void **state)
{
    (void)state;
    enum { V = 64, NP = 24, NG = 18 };
    uint32_t x = 12345;
    eng_sample_scratch_t scr;
    assert_int_equal(eng_sample_scratch_create(&scr, V), PD_OK);
    static const struct {
        float temp, top_p, min_p, pres, freq, rep;
        uint32_t top_k, min_tokens;
        bool bias;
    } cases[] = {
        { 1.0f, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0, 0, false },    /* plain */
        { 0.8f, 1.0f, 0.0f, 0.7f, 0.0f, 1.0f, 0, 0, false },    /* presence */
        { 0.8f, 1.0f, 0.0f, 0.0f, 0.9f, 1.0f, 0, 0, false },    /* frequency */
        { 0.8f, 1.0f, 0.0f, -1.0f, -0.5f, 1.0f, 0, 0, false },  /* negative penalties */
        { 1.2f, 1.0f, 0.0f, 0.0f, 0.0f, 1.8f, 0, 0, false },    /* repetition > 1 */
        { 1.2f, 1.0f, 0.0f, 0.0f, 0.0f, 0.6f, 0, 0, false },    /* repetition < 1 */
        { 1.0f, 1.0f, 0.1f, 0.0f, 0.0f, 1.0f, 0, 0, false },    /* min_p alone */
        { 1.0f, 0.9f, 0.05f, 0.3f, 0.2f, 1.3f, 20, 0, true },   /* everything */
        { 0.7f, 0.8f, 0.02f, 0.0f, 0.4f, 1.1f, 0, 0, true },    /* top_p + min_p */
        { 1.5f, 1.0f, 0.3f, 0.2f, 0.0f, 1.0f, 30, 0, true },    /* top_k + min_p */
        { 0.0f, 1.0f, 0.0f, 1.5f, 0.5f, 1.4f, 0, 0, true },     /* greedy + penalties */
        { 0.9f, 1.0f, 0.0f, 0.5f, 0.5f, 1.2f, 0, 30, true },    /* min_tokens mask */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        eng_sample_params_t p;
        eng_sample_params_default(&p);
        p.temperature = cases[c].temp;
        p.top_p = cases[c].top_p;
        p.top_k = cases[c].top_k;
        p.min_p = cases[c].min_p;
        p.presence_penalty = cases[c].pres;
        p.frequency_penalty = cases[c].freq;
        p.repetition_penalty = cases[c].rep;
        p.min_tokens = cases[c].min_tokens;
        p.n_eos = 1;
        p.eos_ids[0] = 7;
        if (cases[c].bias) {
            p.n_bias = 3;
            p.bias[0] = (eng_logit_bias_t){ 3, 4.0f };
            p.bias[1] = (eng_logit_bias_t){ 11, -100.0f };
            p.bias[2] = (eng_logit_bias_t){ 40, 2.5f };
        }
        assert_int_equal(eng_sample_params_check(&p), PD_OK);
        float raw[V], lg[V];
        int32_t prompt[NP], gen[NG];
        for (uint32_t i = 0; i < V; i++)
            raw[i] = (float)((int)(lcg(&x) % 2000) - 1000) / 250.0f; /* [-4, 4) */
        /* repeats on purpose: few distinct ids, the argmax among them */
        for (uint32_t i = 0; i < NP; i++)
            prompt[i] = (int32_t)(lcg(&x) % 16);
        for (uint32_t i = 0; i < NG; i++)
            gen[i] = (int32_t)(lcg(&x) % 12) + 8;
        uint32_t top = 0;
        for (uint32_t i = 1; i < V; i++)
            top = raw[i] > raw[top] ? i : top;
        gen[0] = gen[5] = (int32_t)top;
        eng_sampler_t s;
        eng_sampler_init(&s, &p);
        s.n_generated = NG;
        eng_sample_hist_t h = { prompt, NP, gen, NG };
        double want[V], got[V];
        reference_probs(raw, V, &p, NG, prompt, NP, gen, NG, want);
        memcpy(lg, raw, sizeof(lg));
        assert_true(eng_sample_probs(&s, lg, V, &scr, &h, got));
        for (uint32_t i = 0; i < V; i++)
            if (fabs(got[i] - want[i]) > 1e-5)
                fail_msg("case %zu token %u: sampler p=%.8f, reference p=%.8f", c, i, got[i],
                         want[i]);
        /* eng_sample_next draws from that distribution: never outside it, and
         * the frequencies match it */
        enum { DRAWS = 40000 };
        uint32_t count[V] = { 0 };
        for (uint32_t d = 0; d < DRAWS; d++) {
            memcpy(lg, raw, sizeof(lg));
            int32_t t = eng_sample_next(&s, lg, V, &scr, &h);
            assert_true(t >= 0 && t < V);
            if (want[t] == 0.0)
                fail_msg("case %zu: drew token %d, which has probability 0", c, t);
            count[t]++;
        }
        for (uint32_t i = 0; i < V; i++) {
            double sd = sqrt(want[i] * (1 - want[i]) / DRAWS);
            if (fabs((double)count[i] / DRAWS - want[i]) > 5 * sd + 1e-3)
                fail_msg("case %zu token %u: drawn %.4f, expected %.4f", c, i,
                         (double)count[i] / DRAWS, want[i]);
        }
        for (uint32_t i = 0; i < V; i++)
            assert_int_equal(scr.cnt[i], 0);
    }
    eng_sample_scratch_destroy(&scr);
}

/* P->D hand-off with penalties: prefill samples token 0 (history = the
 * prompt), decode replays it and continues with prompt + generated: the same
 * tokens as one sampler running the whole sequence. */
static void test_penalties_handoff(void **state)
{
    (void)state;
    enum { V = 40, NP = 10, N = 30 };
    uint32_t x = 777;
    float table[N][V];
    for (uint32_t k = 0; k < N; k++)
        for (uint32_t i = 0; i < V; i++)
            table[k][i] = (float)((int)(lcg(&x) % 1000) - 500) / 200.0f;
    int32_t prompt[NP];
    for (uint32_t i = 0; i < NP; i++)
        prompt[i] = (int32_t)(lcg(&x) % V);
    eng_sample_params_t p;
    eng_sample_params_default(&p);
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.min_p = 0.02f;
    p.presence_penalty = 0.6f;
    p.frequency_penalty = 0.4f;
    p.repetition_penalty = 1.3f;
    p.seed = 99;
    p.n_bias = 1;
    p.bias[0] = (eng_logit_bias_t){ 5, 3.0f };
    eng_sample_scratch_t scr;
    assert_int_equal(eng_sample_scratch_create(&scr, V), PD_OK);
    int32_t a[N], b[N];
    float lg[V];
    eng_sampler_t s;
    eng_sampler_init(&s, &p);
    for (uint32_t k = 0; k < N; k++) {
        memcpy(lg, table[k], sizeof(lg));
        eng_sample_hist_t h = { prompt, NP, a, k };
        a[k] = eng_sample_next(&s, lg, V, &scr, &h);
        eng_sampler_accept(&s, a[k]);
    }
    eng_sampler_t pf, dc;
    eng_sampler_init(&pf, &p);
    memcpy(lg, table[0], sizeof(lg));
    eng_sample_hist_t h0 = { prompt, NP, NULL, 0 };
    b[0] = eng_sample_next(&pf, lg, V, &scr, &h0);
    eng_sampler_init(&dc, &p);
    eng_sampler_replay(&dc, b[0]);
    for (uint32_t k = 1; k < N; k++) {
        memcpy(lg, table[k], sizeof(lg));
        eng_sample_hist_t h = { prompt, NP, b, k };
        b[k] = eng_sample_next(&dc, lg, V, &scr, &h);
        eng_sampler_accept(&dc, b[k]);
    }
    assert_memory_equal(a, b, sizeof(a));
    /* and the penalties did act: without them the sequence differs */
    p.presence_penalty = p.frequency_penalty = 0.0f;
    p.repetition_penalty = 1.0f;
    eng_sampler_init(&s, &p);
    int differ = 0;
    for (uint32_t k = 0; k < N; k++) {
        memcpy(lg, table[k], sizeof(lg));
        eng_sample_hist_t h = { prompt, NP, b, k };
        differ += eng_sample_next(&s, lg, V, &scr, &h) != b[k];
    }
    assert_true(differ > 0);
    eng_sample_scratch_destroy(&scr);
}

static void test_params_ranges(void **state)
{
    (void)state;
    eng_sample_params_t p;
    float bad_pen[] = { 2.5f, -2.5f, NAN, INFINITY };
    for (size_t i = 0; i < 4; i++) {
        eng_sample_params_default(&p);
        p.presence_penalty = bad_pen[i];
        assert_int_equal(eng_sample_params_check(&p), PD_ERR_BAD_INPUT);
        eng_sample_params_default(&p);
        p.frequency_penalty = bad_pen[i];
        assert_int_equal(eng_sample_params_check(&p), PD_ERR_BAD_INPUT);
    }
    eng_sample_params_default(&p);
    p.repetition_penalty = -1.0f;
    assert_int_equal(eng_sample_params_check(&p), PD_ERR_BAD_INPUT);
    p.repetition_penalty = 0.0f; /* zeroed params: off */
    assert_int_equal(eng_sample_params_check(&p), PD_OK);
    p.min_p = 1.5f;
    assert_int_equal(eng_sample_params_check(&p), PD_ERR_BAD_INPUT);
    eng_sample_params_default(&p);
    p.n_bias = 1;
    p.bias[0] = (eng_logit_bias_t){ 1, 101.0f };
    assert_int_equal(eng_sample_params_check(&p), PD_ERR_BAD_INPUT);
    p.bias[0] = (eng_logit_bias_t){ -1, 1.0f };
    assert_int_equal(eng_sample_params_check(&p), PD_ERR_BAD_INPUT);
    p.n_bias = ENG_SAMPLE_MAX_BIAS + 1;
    assert_int_equal(eng_sample_params_check(&p), PD_ERR_BAD_INPUT);
}

/* Logprobs: log-softmax of the raw logits, top n best first (lower id on
 * ties), whatever the sampling parameters; eng_sample_next_lp draws as
 * eng_sample_next does. */
static void test_logprobs(void **state)
{
    (void)state;
    enum { V = 50 };
    uint32_t x = 4242;
    float raw[V], lg[V];
    for (uint32_t i = 0; i < V; i++)
        raw[i] = (float)((int)(lcg(&x) % 1000) - 500) / 100.0f;
    raw[9] = raw[31]; /* a tie */
    double mx = -1e300, sum = 0;
    for (uint32_t i = 0; i < V; i++)
        mx = raw[i] > mx ? raw[i] : mx;
    for (uint32_t i = 0; i < V; i++)
        sum += exp(raw[i] - mx);
    double lse = mx + log(sum);
    eng_logprobs_t lp;
    eng_sample_logprobs(raw, V, 17, 20, &lp);
    assert_float_equal(lp.logprob, raw[17] - lse, 1e-5);
    assert_int_equal(lp.n_top, 20);
    for (uint32_t k = 0; k < 20; k++) {
        int32_t id = lp.top_ids[k];
        assert_float_equal(lp.top_lp[k], raw[id] - lse, 1e-5);
        /* rank: exactly k tokens are better (higher, or equal with lower id) */
        uint32_t better = 0;
        for (uint32_t i = 0; i < V; i++)
            better += raw[i] > raw[id] || (raw[i] == raw[id] && (int32_t)i < id);
        assert_int_equal(better, k);
    }
    eng_sample_logprobs(raw, 3, 1, 20, &lp); /* n_top capped by the vocabulary */
    assert_int_equal(lp.n_top, 3);
    eng_sample_logprobs(raw, V, 5, 0, &lp);
    assert_int_equal(lp.n_top, 0);
    assert_float_equal(lp.logprob, raw[5] - lse, 1e-5);
    /* with penalties and a bias the logprobs stay the model's; the draw is
     * the same as without logprobs */
    eng_sample_params_t p;
    eng_sample_params_default(&p);
    p.temperature = 0.7f;
    p.seed = 5;
    p.presence_penalty = 1.0f;
    p.n_bias = 1;
    p.bias[0] = (eng_logit_bias_t){ 3, 7.0f };
    eng_sample_scratch_t scr;
    assert_int_equal(eng_sample_scratch_create(&scr, V), PD_OK);
    eng_sampler_t a, b;
    eng_sampler_init(&a, &p);
    eng_sampler_init(&b, &p);
    const int32_t gen[] = { 3, 3, 8 };
    eng_sample_hist_t h = { NULL, 0, gen, 3 };
    for (int k = 0; k < 50; k++) {
        memcpy(lg, raw, sizeof(lg));
        int32_t t1 = eng_sample_next_lp(&a, lg, V, &scr, &h, 4, &lp);
        memcpy(lg, raw, sizeof(lg));
        int32_t t2 = eng_sample_next(&b, lg, V, &scr, &h);
        assert_int_equal(t1, t2);
        assert_float_equal(lp.logprob, raw[t1] - lse, 1e-5);
        assert_int_equal(lp.n_top, 4);
    }
    eng_sample_scratch_destroy(&scr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_seed_reproducible_and_handoff),
        cmocka_unit_test(test_one_draw_per_token_and_replay),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_stop_rules),
        cmocka_unit_test(test_adjust_values),
        cmocka_unit_test(test_probs_vs_reference),
        cmocka_unit_test(test_penalties_handoff),
        cmocka_unit_test(test_params_ranges),
        cmocka_unit_test(test_logprobs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
