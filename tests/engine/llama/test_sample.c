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
        int32_t t = eng_sample_next(&s, lg, n, &scr);
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
    assert_int_equal(eng_sample_next(&s, lg, 5, &scr), 1); /* tie: lowest id */
    /* greedy does not advance the PRNG */
    eng_sampler_t s0;
    eng_sampler_init(&s0, &p);
    assert_memory_equal(&s.rng, &s0.rng, sizeof(s.rng));
    /* top_k = 1 is greedy as well */
    p.temperature = 1.0f;
    p.top_k = 1;
    eng_sampler_init(&s, &p);
    float lg2[5] = { 0.1f, 0.5f, 3.0f, 2.0f, 1.9f };
    assert_int_equal(eng_sample_next(&s, lg2, 5, &scr), 2);
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
            int32_t t = eng_sample_next(&s, lg, V, &scr);
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
        a[i] = eng_sample_next(&s, lg, V, &scr);
        eng_sampler_accept(&s, a[i]);
    }
    eng_sampler_init(&s, &p);
    for (int i = 0; i < N; i++) {
        memcpy(lg, base, sizeof(lg));
        b[i] = eng_sample_next(&s, lg, V, &scr);
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
        c[i] = eng_sample_next(&s, lg, V, &scr);
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
    assert_int_equal(eng_sample_next(&s, lg, 5, &scr), 0);
    assert_int_equal(eng_sampler_accept(&s, 0), ENG_FINISH_NONE);
    float lg1[5] = { 0, 0, 0, 5, 4 };
    assert_int_equal(eng_sample_next(&s, lg1, 5, &scr), 0);
    assert_int_equal(eng_sampler_accept(&s, 0), ENG_FINISH_NONE);
    float lg2[5] = { 0, 0, 0, 5, 4 };
    assert_int_equal(eng_sample_next(&s, lg2, 5, &scr), 3);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_seed_reproducible_and_handoff),
        cmocka_unit_test(test_one_draw_per_token_and_replay),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_stop_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
