/* test_sim_ep.c - the sim engine's expert parallelism (issue 36) over the
 * in-process transport (engine/eng_ep_local.h): 2 and 4 ranks, one thread
 * each, give bitwise the logits of ep_size 1 for chunked prompts and decode
 * steps with a rank idling, and through the fused step; every rank's
 * dispatch and combine bytes equal eng.h's format for the routing; the
 * same with two micro-batches per pass (overlap=1: post/wait, micro-batch
 * 1's own phases); the slept compute follows the model; bad specs and
 * transports are refused. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "eng.h"
#include "eng_ep_local.h"
#include "eng_sim.h"

/* 4 layers (1 dense, 3 MoE), 8 experts top-3, hidden 16; max_batch 4 */
#define SPEC "sim:layers=4,kv_heads=2,head_dim=8,vocab=300,ctx=512,no_sleep=1," \
             "experts=8,top=3,embd=16,first_dense=1"
#define MAXB 4u
#define PROMPT 10u       /* 3 passes of <= MAXB tokens */
#define STEPS 5u
#define IDLE_STEP 2u     /* the last rank idles this step */
#define NB 4u
#define MAX_R 4u

static const eng_ops_t *ops;

static eng_model_t *load_ep(const char *spec, uint32_t rank, uint32_t size, pd_status_t want)
{
    eng_load_opts_t o = { .engine = "sim", .model_path = spec, .kv_dtype = ENG_KV_F16,
                          .max_batch = MAXB, .ep_rank = rank, .ep_size = size };
    eng_model_t *m = NULL;
    char err[200] = "";

    assert_int_equal(ops->load(&o, &m, err, sizeof(err)), want);
    if (want != PD_OK)
        printf("refused as expected: %s\n", err);
    return m;
}

static void prompt_of(uint32_t r, int32_t *t)
{
    for (uint32_t i = 0; i < PROMPT; i++)
        t[i] = (int32_t)(32 + (i * 7u + r * 13u) % 90u);
}

static int32_t argmax(const float *l, uint32_t n)
{
    uint32_t b = 0;

    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return (int32_t)b;
}

typedef struct {
    eng_model_t *m;
    uint32_t rank, size, vocab;
    bool idles;              /* idle at IDLE_STEP */
    float *logits;           /* (1 + STEPS, vocab) */
    int32_t tok[STEPS];      /* decode inputs */
    uint32_t pos[STEPS];
    pd_status_t st;
} rank_t;

/* A rank's sequence: prompt, then STEPS decode steps (an idle pass at
 * IDLE_STEP if it idles); with ep_size 1 the same calls alone. */
static void *rank_main(void *arg)
{
    rank_t *r = arg;
    const eng_kv_geom_t *g = ops->geometry(r->m);
    void *arena = calloc(NB, g->block_bytes);
    uint32_t bt[NB] = { 0, 1, 2, 3 }, pos = PROMPT;
    int32_t prompt[PROMPT], next;

    r->st = PD_ERR_NO_MEMORY;
    if (arena == NULL)
        return NULL;
    prompt_of(r->rank, prompt);
    r->st = ops->prefill(r->m, arena, bt, NB, prompt, PROMPT, 0, r->logits);
    next = argmax(r->logits, r->vocab);
    for (uint32_t s = 0; s < STEPS && r->st == PD_OK; s++) {
        float *l = r->logits + (size_t)(1 + s) * r->vocab;
        if (r->idles && s == IDLE_STEP && r->size > 1) {
            r->st = ops->ep_idle(r->m);
            r->tok[s] = -1;
            continue;
        }
        if (r->idles && s == IDLE_STEP) {   /* the reference: no call */
            r->tok[s] = -1;
            continue;
        }
        eng_decode_item_t it = { bt, NB, pos, next };
        r->tok[s] = next;
        r->pos[s] = pos;
        r->st = ops->decode(r->m, arena, &it, 1, l);
        next = argmax(l, r->vocab);
        pos++;
    }
    free(arena);
    return NULL;
}

/* rows/pairs rank `me`'s tokens send to each peer in one layer */
static void count(const eng_sim_params_t *p, uint32_t size, const int32_t *tok,
                  const uint32_t *pos, uint32_t n, uint32_t l, uint32_t *rows, uint32_t *pairs)
{
    uint32_t per = p->n_experts / size, e[64];

    memset(rows, 0, size * sizeof(uint32_t));
    memset(pairs, 0, size * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++) {
        uint32_t hit[MAX_R] = { 0 };
        eng_sim_route(p, tok[i], pos[i], l, e);
        for (uint32_t k = 0; k < p->top_k; k++) {
            assert_true(e[k] < p->n_experts);
            for (uint32_t j = 0; j < k; j++)
                assert_int_not_equal(e[j], e[k]);
            pairs[e[k] / per]++;
            if (!hit[e[k] / per]++)
                rows[e[k] / per]++;
        }
    }
}

/* Expected bytes rank r sends to other ranks over its passes: dispatch
 * (its tokens' rows) and, summed over the group, combine (the answers). */
static void expected_bytes(const eng_sim_params_t *p, const rank_t *r, uint32_t size,
                           uint64_t *disp, uint64_t *comb_back)
{
    uint32_t two = p->overlap; /* a pass's rows in two messages per peer */
    int32_t prompt[PROMPT], tok[MAXB];
    uint32_t pos[MAXB], rows[MAX_R], pairs[MAX_R];

    *disp = *comb_back = 0;
    prompt_of(r->rank, prompt);
    for (uint32_t pass = 0; pass < 3 + STEPS; pass++) {
        uint32_t n = 0;
        if (pass < 3) {
            for (uint32_t i = pass * MAXB; i < PROMPT && n < MAXB; i++, n++) {
                tok[n] = prompt[i];
                pos[n] = i;
            }
        } else if (r->tok[pass - 3] >= 0) {
            tok[0] = r->tok[pass - 3];
            pos[0] = r->pos[pass - 3];
            n = 1;
        }
        for (uint32_t l = p->first_dense; l < p->n_layers; l++)
            for (uint32_t mb = 0; mb <= two; mb++) {
                uint32_t r0 = mb ? (n + 1) / 2 : 0, cnt = two ? (mb ? n / 2 : (n + 1) / 2) : n;
                count(p, size, tok + r0, pos + r0, cnt, l, rows, pairs);
                for (uint32_t q = 0; q < size; q++)
                    if (q != r->rank) {
                        *disp += eng_ep_dispatch_bytes(rows[q], pairs[q], p->n_embd);
                        *comb_back += eng_ep_combine_bytes(pairs[q], p->n_embd);
                    }
            }
    }
}

static void run_group(uint32_t N, bool two)
{
    const char *spec = two ? SPEC ",overlap=1" : SPEC;
    uint32_t vocab;
    rank_t ref[MAX_R], got[MAX_R];
    pthread_t th[MAX_R];
    eng_ep_local_h *hub;
    size_t cap[ENG_EP_SLOTS];

    /* the reference: each rank's sequence alone on the whole model */
    for (uint32_t r = 0; r < N; r++) {
        ref[r] = (rank_t){ .m = load_ep(SPEC, 0, 1, PD_OK), .rank = r, .size = 1,
                           .idles = r == N - 1 };
        ref[r].vocab = vocab = ops->geometry(ref[r].m)->vocab_size;
        ref[r].logits = calloc((size_t)(1 + STEPS) * vocab, sizeof(float));
        rank_main(&ref[r]);
        assert_int_equal(ref[r].st, PD_OK);
    }
    for (uint32_t r = 0; r < N; r++) {
        got[r] = (rank_t){ .m = load_ep(spec, r, N, PD_OK), .rank = r, .size = N,
                           .vocab = vocab, .idles = r == N - 1 };
        got[r].logits = calloc((size_t)(1 + STEPS) * vocab, sizeof(float));
    }
    assert_int_equal(ops->ep_cap(got[0].m, cap), PD_OK);
    /* per peer: MAXB rows (a micro-batch: half), each with min(top, 8/N)
     * pairs; micro-batch 1's phases only with overlap */
    uint32_t k = 3 < 8 / N ? 3 : 8 / N, rows = two ? MAXB / 2 : MAXB;
    assert_int_equal(cap[ENG_EP_DISPATCH], eng_ep_dispatch_bytes(rows, rows * k, 16));
    assert_int_equal(cap[ENG_EP_COMBINE], eng_ep_combine_bytes(rows * k, 16));
    assert_int_equal(cap[ENG_EP_DISPATCH_1], two ? cap[ENG_EP_DISPATCH] : 0);
    assert_int_equal(cap[ENG_EP_COMBINE_1], two ? cap[ENG_EP_COMBINE] : 0);
    assert_int_equal(eng_ep_local_create(N, cap, 10ull * 1000000000u, &hub), PD_OK);
    for (uint32_t r = 0; r < N; r++) {
        eng_ep_xport_t x;
        eng_ep_local_xport(hub, r, &x);
        assert_int_equal(ops->set_ep(got[r].m, &x), PD_OK);
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &got[r]), 0);
    }
    for (uint32_t r = 0; r < N; r++) {
        pthread_join(th[r], NULL);
        assert_int_equal(got[r].st, PD_OK);
    }
    /* bitwise the same logits (the idle step's row is never written) */
    for (uint32_t r = 0; r < N; r++)
        assert_memory_equal(ref[r].logits, got[r].logits,
                            (size_t)(1 + STEPS) * vocab * sizeof(float));
    /* bytes: each rank's dispatch exactly; combine summed over the group */
    uint64_t comb_want = 0, comb_got = 0, exch_ns = 0;
    for (uint32_t r = 0; r < N; r++) {
        eng_sim_stats_t s;
        uint64_t d, c;
        assert_true(eng_sim_stats(got[r].m, &s));
        expected_bytes(eng_sim_params(got[r].m), &got[r], N, &d, &c);
        assert_int_equal(s.ep_dispatch_bytes, d);
        comb_want += c;
        comb_got += s.ep_combine_bytes;
        exch_ns += s.ep_exchange_ns;
        assert_int_equal(s.ep_passes + s.ep_idle_passes, 3 + STEPS);
        assert_int_equal(s.ep_idle_passes, r == N - 1 ? 1 : 0);
        assert_int_equal(s.ep_exchanges, (3 + STEPS) * 3 * 2 * (two ? 2 : 1));
    }
    assert_int_equal(comb_got, comb_want);
    printf("ep %u%s: logits equal, dispatch/combine bytes as routed (%llu combine B), "
           "exchange %.2f ms\n", N, two ? " (two micro-batches)" : "", (unsigned long long)comb_got, (double)exch_ns / 1e6);
    for (uint32_t r = 0; r < N; r++) {
        ops->destroy(ref[r].m);
        ops->destroy(got[r].m);
        free(ref[r].logits);
        free(got[r].logits);
    }
    eng_ep_local_destroy(hub);
}

static void test_ep2(void **state)
{
    (void)state;
    run_group(2, false);
}

static void test_ep2_two_micro_batches(void **state)
{
    (void)state;
    run_group(2, true);
}

static void test_ep4_two_micro_batches(void **state)
{
    (void)state;
    run_group(4, true);
}

static void test_ep4(void **state)
{
    (void)state;
    run_group(4, false);
}

/* The fused step (decode's EP round): a chunk of a second prompt and a
 * decode item in one pass, on both ranks of a group, gives the logits of
 * prefill(chunk) then decode(item) on the whole model; a whole model has no
 * fused step (UNSUPPORTED: callers run them apart). */
typedef struct {
    eng_model_t *m;
    uint32_t rank, vocab;
    float *logits;           /* (3, vocab): prompt, chunk, item */
    pd_status_t st;
} step_rank_t;

static void *step_main(void *arg)
{
    step_rank_t *r = arg;
    const eng_kv_geom_t *g = ops->geometry(r->m);
    void *arena = calloc(8, g->block_bytes);
    uint32_t bt_a[4] = { 0, 1, 2, 3 }, bt_b[4] = { 4, 5, 6, 7 };
    int32_t prompt[PROMPT], chunk_tok[3] = { 50, 60, (int32_t)(70 + r->rank) };

    r->st = PD_ERR_NO_MEMORY;
    if (arena == NULL)
        return NULL;
    prompt_of(r->rank, prompt);
    r->st = ops->prefill(r->m, arena, bt_a, 4, prompt, PROMPT, 0, r->logits);
    eng_decode_item_t it = { bt_a, 4, PROMPT, argmax(r->logits, r->vocab) };
    eng_chunk_t ch = { bt_b, 4, chunk_tok, 3, 0, true };
    if (r->st == PD_OK) {
        r->st = ops->step(r->m, arena, &ch, &it, 1, r->logits + r->vocab);
        if (r->st == PD_ERR_UNSUPPORTED) { /* the whole model: apart */
            r->st = ops->prefill(r->m, arena, bt_b, 4, chunk_tok, 3, 0, r->logits + r->vocab);
            if (r->st == PD_OK)
                r->st = ops->decode(r->m, arena, &it, 1, r->logits + 2 * (size_t)r->vocab);
        }
    }
    free(arena);
    return NULL;
}

static void test_fused_step(void **state)
{
    step_rank_t ref[2], got[2];
    pthread_t th[2];
    eng_ep_local_h *hub;
    size_t cap[ENG_EP_SLOTS];

    (void)state;
    assert_non_null(ops->step);
    for (uint32_t r = 0; r < 2; r++) {
        ref[r] = (step_rank_t){ .m = load_ep(SPEC, 0, 1, PD_OK), .rank = r };
        got[r] = (step_rank_t){ .m = load_ep(SPEC, r, 2, PD_OK), .rank = r };
        ref[r].vocab = got[r].vocab = ops->geometry(ref[r].m)->vocab_size;
        ref[r].logits = calloc(3 * (size_t)ref[r].vocab, sizeof(float));
        got[r].logits = calloc(3 * (size_t)ref[r].vocab, sizeof(float));
        step_main(&ref[r]);
        assert_int_equal(ref[r].st, PD_OK);
    }
    assert_int_equal(ops->ep_cap(got[0].m, cap), PD_OK);
    assert_int_equal(eng_ep_local_create(2, cap, 10ull * 1000000000u, &hub), PD_OK);
    for (uint32_t r = 0; r < 2; r++) {
        eng_ep_xport_t x;
        eng_ep_local_xport(hub, r, &x);
        assert_int_equal(ops->set_ep(got[r].m, &x), PD_OK);
        assert_int_equal(pthread_create(&th[r], NULL, step_main, &got[r]), 0);
    }
    for (uint32_t r = 0; r < 2; r++) {
        eng_sim_stats_t s;
        pthread_join(th[r], NULL);
        assert_int_equal(got[r].st, PD_OK);
        assert_memory_equal(ref[r].logits, got[r].logits, 3 * (size_t)ref[r].vocab * sizeof(float));
        assert_true(eng_sim_stats(got[r].m, &s));
        assert_int_equal(s.ep_passes, 3 + 1);      /* 4 rows: one pass */
        assert_int_equal(s.ep_tokens, PROMPT + 4);
        ops->destroy(ref[r].m);
        ops->destroy(got[r].m);
        free(ref[r].logits);
        free(got[r].logits);
    }
    eng_ep_local_destroy(hub);
}

/* With sleeps: a step's slept compute follows the modeled time (the
 * overrun of one segment taken off the next), the exchanges are counted
 * apart. */
static void test_timing_split(void **state)
{
    static const char spec[] = "sim:layers=4,kv_heads=2,head_dim=8,vocab=300,ctx=512,"
                               "decode_ms=8,experts=8,top=3,embd=16,first_dense=1";
    eng_model_t *m[2];
    step_rank_t ra[2];
    pthread_t th[2];
    eng_ep_local_h *hub;
    size_t cap[ENG_EP_SLOTS];

    (void)state;
    for (uint32_t r = 0; r < 2; r++)
        m[r] = load_ep(spec, r, 2, PD_OK);
    assert_int_equal(ops->ep_cap(m[0], cap), PD_OK);
    assert_int_equal(eng_ep_local_create(2, cap, 10ull * 1000000000u, &hub), PD_OK);
    for (uint32_t r = 0; r < 2; r++) {
        eng_ep_xport_t x;
        eng_ep_local_xport(hub, r, &x);
        assert_int_equal(ops->set_ep(m[r], &x), PD_OK);
        ra[r] = (step_rank_t){ .m = m[r], .rank = r, .vocab = 300 };
        ra[r].logits = calloc(3 * 300, sizeof(float));
        assert_int_equal(pthread_create(&th[r], NULL, step_main, &ra[r]), 0);
    }
    for (uint32_t r = 0; r < 2; r++) {
        eng_sim_stats_t s;
        pthread_join(th[r], NULL);
        assert_int_equal(ra[r].st, PD_OK);
        assert_true(eng_sim_stats(m[r], &s));
        printf("rank %u: compute %.2f ms (target %.2f), exchange %.2f ms, %llu exchanges\n", r,
               (double)s.ep_compute_ns / 1e6, (double)s.target_ns / 1e6,
               (double)s.ep_exchange_ns / 1e6, (unsigned long long)s.ep_exchanges);
        /* the step's 8 ms decode share is slept; prefill is 10 / 4000 s */
        assert_true(s.ep_compute_ns >= s.target_ns * 9 / 10);
        assert_int_equal(s.ep_exchanges, 4 * 3 * 2);
        ops->destroy(m[r]);
        free(ra[r].logits);
    }
    eng_ep_local_destroy(hub);
}

static void test_refusals(void **state)
{
    eng_model_t *m;
    size_t cap[ENG_EP_SLOTS];
    eng_sim_params_t p;
    char err[200];

    (void)state;
    load_ep(SPEC, 0, 3, PD_ERR_BAD_INPUT);                      /* 3 does not divide 8 */
    load_ep(SPEC, 2, 2, PD_ERR_BAD_INPUT);                      /* rank >= size */
    load_ep("sim:layers=2,kv_heads=2,head_dim=8,vocab=300", 0, 2, PD_ERR_BAD_INPUT);
    load_ep("llama3-8b", 0, 2, PD_ERR_BAD_INPUT);               /* no experts */
    assert_int_equal(eng_sim_parse("sim:layers=4,experts=8,top=9,embd=16", &p, err,
                                   sizeof(err)), PD_ERR_BAD_INPUT);
    assert_int_equal(eng_sim_parse("sim:layers=4,experts=8", &p, err, sizeof(err)),
                     PD_ERR_BAD_INPUT);                          /* no top */
    assert_int_equal(eng_sim_parse("sim:layers=4,experts=8,top=2,embd=1", &p, err,
                                   sizeof(err)), PD_ERR_BAD_INPUT);
    assert_int_equal(eng_sim_parse("sim:layers=4,experts=8,top=2,embd=16,first_dense=4", &p,
                                   err, sizeof(err)), PD_ERR_BAD_INPUT);
    assert_int_equal(eng_sim_parse("deepseek-r1", &p, err, sizeof(err)), PD_OK);
    assert_int_equal(p.n_layers, 61);
    assert_int_equal(p.n_experts, 256);
    assert_int_equal(p.top_k, 8);
    assert_int_equal(p.n_embd, 7168);
    assert_int_equal(p.first_dense, 3);
    /* dense: no caps; whole model: no set_ep */
    m = load_ep("llama3-8b", 0, 1, PD_OK);
    assert_int_equal(ops->ep_cap(m, cap), PD_OK);
    assert_int_equal(cap[0] + cap[1], 0);
    ops->destroy(m);
    /* EP rank without a transport computes nothing; small caps refused */
    m = load_ep(SPEC, 1, 2, PD_OK);
    {
        const eng_kv_geom_t *g = ops->geometry(m);
        void *arena = calloc(1, g->block_bytes);
        float *l = calloc(g->vocab_size, sizeof(float));
        uint32_t b0 = 0;
        int32_t t0 = 40;
        eng_ep_local_h *hub;
        eng_ep_xport_t x;
        assert_int_equal(ops->prefill(m, arena, &b0, 1, &t0, 1, 0, l), PD_ERR_BAD_INPUT);
        assert_int_equal(ops->ep_idle(m), PD_ERR_BAD_INPUT);
        assert_int_equal(ops->ep_cap(m, cap), PD_OK);
        assert_int_equal(eng_ep_local_create(2, cap, 1000000000u, &hub), PD_OK);
        eng_ep_local_xport(hub, 1, &x);
        x.cap[ENG_EP_COMBINE] = cap[ENG_EP_COMBINE] - 1;         /* the hub rounds up */
        assert_int_equal(ops->set_ep(m, &x), PD_ERR_TOO_BIG);
        eng_ep_local_xport(hub, 0, &x);                          /* another rank's */
        assert_int_equal(ops->set_ep(m, &x), PD_ERR_BAD_INPUT);
        eng_ep_local_destroy(hub);
        free(arena);
        free(l);
    }
    ops->destroy(m);
    /* two micro-batches: a dense model has none; a transport without post
     * and wait (or with one of them) is refused */
    assert_int_equal(eng_sim_parse("sim:layers=4,overlap=1", &p, err, sizeof(err)),
                     PD_ERR_BAD_INPUT);
    m = load_ep(SPEC ",overlap=1", 0, 2, PD_OK);
    {
        eng_ep_local_h *hub;
        eng_ep_xport_t x;
        assert_int_equal(ops->ep_cap(m, cap), PD_OK);
        assert_int_equal(eng_ep_local_create(2, cap, 1000000000u, &hub), PD_OK);
        eng_ep_local_xport(hub, 0, &x);
        x.post = NULL;
        assert_int_equal(ops->set_ep(m, &x), PD_ERR_BAD_INPUT);
        x.wait = NULL;
        assert_int_equal(ops->set_ep(m, &x), PD_ERR_BAD_INPUT);
        eng_ep_local_xport(hub, 0, &x);
        x.cap[ENG_EP_COMBINE_1] = 0;
        assert_int_equal(ops->set_ep(m, &x), PD_ERR_TOO_BIG);
        eng_ep_local_xport(hub, 0, &x);
        assert_int_equal(ops->set_ep(m, &x), PD_OK);
        eng_ep_local_destroy(hub);
    }
    ops->destroy(m);
}

/* A pass alone times out when its peer never comes (the hub's deadline),
 * and the time is counted as exchange. */
static void test_peer_missing(void **state)
{
    eng_model_t *m = load_ep(SPEC, 0, 2, PD_OK);
    eng_ep_local_h *hub;
    eng_ep_xport_t x;
    eng_sim_stats_t s;
    size_t cap[ENG_EP_SLOTS];

    (void)state;
    assert_int_equal(ops->ep_cap(m, cap), PD_OK);
    assert_int_equal(eng_ep_local_create(2, cap, 100u * 1000000u, &hub), PD_OK);
    eng_ep_local_xport(hub, 0, &x);
    assert_int_equal(ops->set_ep(m, &x), PD_OK);
    assert_int_equal(ops->ep_idle(m), PD_ERR_TIMED_OUT);
    assert_true(eng_sim_stats(m, &s));
    assert_true(s.ep_exchange_ns >= 50u * 1000000u);
    ops->destroy(m);
    eng_ep_local_destroy(hub);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ep2),
        cmocka_unit_test(test_ep4),
        cmocka_unit_test(test_ep2_two_micro_batches),
        cmocka_unit_test(test_ep4_two_micro_batches),
        cmocka_unit_test(test_fused_step),
        cmocka_unit_test(test_timing_split),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_peer_missing),
    };

    ops = eng_find("sim");
    if (ops == NULL)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
