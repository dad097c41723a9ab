/* test_ep.c - expert parallelism in the llama engine (issue 36) over the
 * in-process transport (engine/eng_ep_local.h): a generated qwen3moe (64
 * experts, top-8) split over 2 and 4 ranks, one thread each, gives bitwise
 * the logits (so the greedy tokens) of one model holding every expert, over
 * prompts and batched decode steps, a rank idling a step (ep_idle); each
 * rank binds expert bytes / N; refusals (N not dividing the experts, a
 * dense model, no transport); a rank that never comes fails the others'
 * pass by the deadline. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eng.h"
#include "ep_workload.h"
#include "eng_ep_local.h"
#include "eng_llama.h"
#include "ggml_types.h"
#include "ll_testmodel.h"

#define S 2          /* sequences per rank */
#define D EP_WL_D
#define NB EP_WL_NB

static char tmpdir[256];
static char moe_path[300];
static const eng_ops_t *ops;

/* 64 experts, top-8, Q8_0 weights (the integer-dot kernels, packed) */
static const ll_tm_spec_t moe_spec = {
    "qwen3moe", 64, 2, 4, 2, 96, 300, 256, 0, GGML_TYPE_Q8_0, false, false, 361,
    NULL, false, 0, 0, 0, 64, 8, 32 };

static bool two_halves; /* load with ep_overlap (test_ep*_two_halves) */

static eng_model_t *load_ep(uint32_t rank, uint32_t size, pd_status_t want, const char *path,
                            char *err, size_t err_len)
{
    eng_load_opts_t o = { .engine = "llama", .model_path = path, .block_tokens = 16,
                          .kv_dtype = ENG_KV_F32, .n_threads = 1, .max_batch = 8,
                          .ep_rank = rank, .ep_size = size, .ep_overlap = two_halves };
    eng_model_t *m = NULL;
    pd_status_t st = ops->load(&o, &m, err, err_len);
    if (st != want)
        fprintf(stderr, "load rank %u/%u: %s (%s)\n", rank, size, pd_status_str(st), err);
    assert_int_equal(st, want);
    return m;
}




typedef struct {
    eng_model_t *m;
    uint32_t rank, size, vocab;
    float *out;               /* (size*S, 1 + D, vocab) this rank's rows */
    pd_status_t st;
} rank_arg_t;


static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    a->st = ep_wl_run(ops, a->m, a->rank * S, S, a->vocab, a->out, (a->size - 1) * S);
    return NULL;
}

static void check_group(uint32_t N)
{
    char err[256] = "";
    eng_model_t *whole = load_ep(0, 1, PD_OK, moe_path, err, sizeof(err));
    uint32_t vocab = ops->geometry(whole)->vocab_size;
    size_t rows = (size_t)N * S * (1 + D) * vocab;
    float *ref = calloc(rows, sizeof(float)), *got = calloc(rows, sizeof(float));
    pd_status_t st;
    st = ep_wl_run(ops, whole, 0, N * S, vocab, ref, (N - 1) * S);
    assert_int_equal(st, PD_OK);
    eng_llama_info_t wi;
    eng_llama_info(whole, &wi);
    assert_true(wi.expert_bytes_total > 0);
    assert_true(wi.expert_bytes_owned == wi.expert_bytes_total);

    eng_model_t *m[4];
    eng_llama_info_t ri;
    for (uint32_t r = 0; r < N; r++) {
        m[r] = load_ep(r, N, PD_OK, moe_path, err, sizeof(err));
        eng_llama_info(m[r], &ri);
        assert_int_equal(ri.ep_size, N);
        assert_true(ri.expert_bytes_owned * N == wi.expert_bytes_total);
        printf("ep %u rank %u: expert bytes %llu of %llu\n", N, r,
               (unsigned long long)ri.expert_bytes_owned,
               (unsigned long long)ri.expert_bytes_total);
    }
    /* no transport yet: refused */
    int32_t t0 = 1;
    uint32_t b0 = 0;
    float *l0 = malloc(vocab * sizeof(float));
    void *a0 = calloc(1, ops->geometry(m[0])->block_bytes);
    assert_int_equal(ops->prefill(m[0], a0, &b0, 1, &t0, 1, 0, l0), PD_ERR_BAD_INPUT);
    free(a0);
    free(l0);
    eng_ep_local_h *hub;
    assert_int_equal(eng_ep_local_create(N, ri.ep_cap, 10ull * 1000000000u, &hub), PD_OK);
    pthread_t th[4];
    rank_arg_t ra[4];
    for (uint32_t r = 0; r < N; r++) {
        eng_ep_xport_t x;
        eng_ep_local_xport(hub, r, &x);
        if (two_halves) { /* two halves need post and wait */
            eng_ep_xport_t y = x;
            y.post = NULL;
            y.wait = NULL;
            assert_int_equal(ops->set_ep(m[r], &y), PD_ERR_BAD_INPUT);
        }
        assert_int_equal(ops->set_ep(m[r], &x), PD_OK);
        ra[r] = (rank_arg_t){ m[r], r, N, vocab, got, PD_ERR_INTERNAL };
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &ra[r]), 0);
    }
    for (uint32_t r = 0; r < N; r++) {
        pthread_join(th[r], NULL);
        assert_int_equal(ra[r].st, PD_OK);
    }
    /* bitwise: every prompt's and every decode step's logits */
    size_t diff = 0;
    for (size_t i = 0; i < rows; i++)
        diff += memcmp(&ref[i], &got[i], sizeof(float)) != 0;
    printf("ep %u%s: %zu logits, %zu differ\n", N, two_halves ? " (two micro-batches per pass)" : "",
           rows, diff);
    assert_int_equal(diff, 0);
    for (uint32_t r = 0; r < N; r++)
        ops->destroy(m[r]);
    eng_ep_local_destroy(hub);
    ops->destroy(whole);
    free(ref);
    free(got);
}

static void test_ep2_bitwise(void **state)
{
    (void)state;
    check_group(2);
}

static void test_ep4_bitwise(void **state)
{
    (void)state;
    check_group(4);
}

static void test_ep2_two_halves(void **state)
{
    (void)state;
    two_halves = true;
    check_group(2);
    two_halves = false;
}

static void test_ep4_two_halves(void **state)
{
    (void)state;
    two_halves = true;
    check_group(4);
    two_halves = false;
}

static void test_ep_refusals(void **state)
{
    (void)state;
    char err[256] = "";
    load_ep(0, 3, PD_ERR_BAD_INPUT, moe_path, err, sizeof(err));
    assert_non_null(strstr(err, "does not divide the expert count 64"));
    load_ep(2, 2, PD_ERR_BAD_INPUT, moe_path, err, sizeof(err));
    char dense[300];
    snprintf(dense, sizeof(dense), "%s/dense.gguf", tmpdir);
    static const ll_tm_spec_t ds = { "qwen3", 64, 2, 4, 2, 96, 300, 256, 0, 0, false, false, 5 };
    assert_int_equal(ll_tm_write(&ds, dense), 0);
    load_ep(0, 2, PD_ERR_BAD_INPUT, dense, err, sizeof(err));
    assert_non_null(strstr(err, "needs a MoE model"));
    /* a whole model takes no transport */
    eng_model_t *w = load_ep(0, 1, PD_OK, moe_path, err, sizeof(err));
    eng_ep_xport_t x = { 0 };
    assert_int_equal(ops->set_ep(w, &x), PD_ERR_BAD_INPUT);
    ops->destroy(w);
}

/* rank 1 never comes: rank 0's pass fails by the deadline, no hang */
static void test_ep_deadline(void **state)
{
    (void)state;
    char err[256] = "";
    eng_model_t *m = load_ep(0, 2, PD_OK, moe_path, err, sizeof(err));
    eng_llama_info_t ri;
    eng_llama_info(m, &ri);
    eng_ep_local_h *hub;
    assert_int_equal(eng_ep_local_create(2, ri.ep_cap, 200u * 1000000u, &hub), PD_OK);
    eng_ep_xport_t x;
    eng_ep_local_xport(hub, 0, &x);
    x.cap[ENG_EP_DISPATCH] = 64; /* caps below the engine's: refused */
    assert_int_equal(ops->set_ep(m, &x), PD_ERR_TOO_BIG);
    eng_ep_local_xport(hub, 0, &x);
    assert_int_equal(ops->set_ep(m, &x), PD_OK);
    uint32_t vocab = ops->geometry(m)->vocab_size;
    float *lg = malloc(vocab * sizeof(float));
    void *arena = calloc(NB, ops->geometry(m)->block_bytes);
    uint32_t bt[NB] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    int32_t p[16] = { 1, 2, 3, 4 };
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    assert_int_equal(ops->prefill(m, arena, bt, NB, p, 4, 0, lg), PD_ERR_TIMED_OUT);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
    assert_true(s >= 0.19 && s < 5.0);
    assert_int_equal(ops->ep_idle(m), PD_ERR_TIMED_OUT); /* the hub stays failed */
    free(arena);
    free(lg);
    ops->destroy(m);
    eng_ep_local_destroy(hub);
}

/* A peer's dispatch message is checked before any of it is used: a fake
 * rank 1 whose messages are crafted here. */
typedef struct {
    uint8_t *buf[2][2];          /* [phase][peer] this rank's sends */
    uint8_t bad[1 << 16];        /* rank 1's dispatch to rank 0 */
    size_t bad_len;
    uint8_t *zero;               /* rank 1's combine: zero rows */
} fake_t;

static void *fake_send_buf(void *ctx, eng_ep_phase_t ph, uint32_t peer)
{
    return ((fake_t *)ctx)->buf[ph][peer];
}

static pd_status_t fake_exchange(void *ctx, eng_ep_phase_t ph, uint32_t layer, const size_t *len,
                                 const void **recv, size_t *recv_len)
{
    fake_t *f = ctx;
    (void)layer;
    recv[0] = f->buf[ph][0];
    recv_len[0] = len[0];
    if (ph == ENG_EP_DISPATCH) {
        recv[1] = f->bad;
        recv_len[1] = f->bad_len;
    } else { /* one zero row per pair rank 0 sent to rank 1 */
        uint32_t np;
        memcpy(&np, f->buf[ENG_EP_DISPATCH][1] + 4, 4);
        recv[1] = f->zero;
        recv_len[1] = eng_ep_combine_bytes(np, 64);
    }
    return PD_OK;
}

static void test_ep_bad_peer(void **state)
{
    (void)state;
    char err[256] = "";
    eng_model_t *m = load_ep(0, 2, PD_OK, moe_path, err, sizeof(err));
    eng_llama_info_t ri;
    eng_llama_info(m, &ri);
    fake_t *f = calloc(1, sizeof(*f));
    for (int ph = 0; ph < 2; ph++)
        for (int p = 0; p < 2; p++)
            f->buf[ph][p] = calloc(1, ri.ep_cap[ph]);
    f->zero = calloc(1, ri.ep_cap[ENG_EP_COMBINE]);
    eng_ep_xport_t x = { .ctx = f, .rank = 0, .size = 2, .cap = { ri.ep_cap[0], ri.ep_cap[1] },
                         .send_buf = fake_send_buf, .exchange = fake_exchange };
    assert_int_equal(ops->set_ep(m, &x), PD_OK);
    uint32_t vocab = ops->geometry(m)->vocab_size, E = 64;
    float *lg = malloc(vocab * sizeof(float));
    void *arena = calloc(NB, ops->geometry(m)->block_bytes);
    uint32_t bt[NB] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    int32_t p[4] = { 1, 2, 3, 4 };
    uint32_t *w = (void *)f->bad;
    /* cases: { n_rows, n_pairs, row, expert, stated length delta } */
    static const int64_t cases[][5] = {
        { 1, 1, 0, 0, 0 },        /* well-formed: expert 0 is rank 0's */
        { 1, 1, 0, 40, 0 },       /* expert 40 is rank 1's own */
        { 1, 1, 1, 0, 0 },        /* row beyond n_rows */
        { 1, 1, 0, 0, -4 },       /* length short of the stated counts */
        { 2, 1, 0, 0, 0 },        /* more rows than pairs */
        { 65, 65, 0, 0, 0 },      /* rows beyond t_max (64) */
        { 1, 600, 0, 0, 0 },      /* pairs beyond t_max * K */
        { 64, 512, 0, 0, 0 },     /* 512 pairs for one expert: beyond t_max * N rows */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        uint32_t nr = (uint32_t)cases[c][0], np = (uint32_t)cases[c][1];
        memset(f->bad, 0, sizeof(f->bad));
        w[0] = nr;
        w[1] = np;
        for (uint32_t j = 0; j < np && 2 + 2 * j + 1 < sizeof(f->bad) / 4; j++) {
            w[2 + 2 * j] = (uint32_t)cases[c][2] + (c == 7 ? j % nr : 0);
            w[2 + 2 * j + 1] = (uint32_t)cases[c][3];
        }
        f->bad_len = (size_t)((int64_t)(8 + (size_t)np * 8 + (size_t)nr * E * 4) + cases[c][4]);
        if (f->bad_len > sizeof(f->bad))
            f->bad_len = sizeof(f->bad);
        pd_status_t st = ops->prefill(m, arena, bt, NB, p, 4, 0, lg);
        if (st != (c == 0 ? PD_OK : PD_ERR_BAD_INPUT))
            fprintf(stderr, "case %zu: %s\n", c, pd_status_str(st));
        assert_int_equal(st, c == 0 ? PD_OK : PD_ERR_BAD_INPUT);
    }
    free(arena);
    free(lg);
    for (int ph = 0; ph < 2; ph++)
        for (int q = 0; q < 2; q++)
            free(f->buf[ph][q]);
    free(f->zero);
    free(f);
    ops->destroy(m);
}

static int setup(void **state)
{
    (void)state;
    ops = eng_find("llama");
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/pd-test-ep-XXXXXX");
    if (!mkdtemp(tmpdir))
        return -1;
    snprintf(moe_path, sizeof(moe_path), "%s/moe.gguf", tmpdir);
    return ll_tm_write(&moe_spec, moe_path);
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ep_refusals),
        cmocka_unit_test(test_ep2_bitwise),
        cmocka_unit_test(test_ep4_bitwise),
        cmocka_unit_test(test_ep2_two_halves),
        cmocka_unit_test(test_ep4_two_halves),
        cmocka_unit_test(test_ep_deadline),
        cmocka_unit_test(test_ep_bad_peer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
