/* test_daemon_parts.c - unit tests of the pieces both daemons share:
 * kvx_blocks (all-or-nothing alloc, double/foreign free refused, counts)
 * and eng_runner (jobs run on another thread, done() on the loop, in
 * order; destroy aborts queued jobs exactly once). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eng_runner.h"
#include "kvx_blocks.h"
#include "pd_loop.h"

static void test_blocks(void **state)
{
    (void)state;
    kvx_blocks_t *b;
    assert_int_equal(kvx_blocks_create(NULL, 0, &b), PD_ERR_BAD_INPUT);
    assert_int_equal(kvx_blocks_create(NULL, 10, &b), PD_OK);
    uint32_t a[10], c[10];
    assert_int_equal(kvx_blocks_alloc(b, 4, a), PD_OK);
    assert_int_equal(a[0], 0);
    assert_int_equal(kvx_blocks_free_count(b), 6);
    assert_int_equal(kvx_blocks_alloc(b, 7, c), PD_ERR_NO_KV_SPACE);
    assert_int_equal(kvx_blocks_free_count(b), 6); /* nothing taken */
    assert_int_equal(kvx_blocks_alloc(b, 6, c), PD_OK);
    assert_int_equal(kvx_blocks_used(b), 10);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++)
            assert_int_not_equal(a[i], c[j]);
    assert_int_equal(kvx_blocks_free(b, a, 4), PD_OK);
    assert_int_equal(kvx_blocks_free(b, a, 4), PD_ERR_BAD_INPUT);     /* double free */
    uint32_t dup[2] = { c[0], c[0] };
    assert_int_equal(kvx_blocks_free(b, dup, 2), PD_ERR_BAD_INPUT);   /* twice in one call */
    uint32_t bad[1] = { 10 };
    assert_int_equal(kvx_blocks_free(b, bad, 1), PD_ERR_BAD_INPUT);   /* out of range */
    assert_int_equal(kvx_blocks_used(b), 6);                          /* nothing changed */
    assert_int_equal(kvx_blocks_free(b, c, 6), PD_OK);
    assert_int_equal(kvx_blocks_free_count(b), 10);
    assert_int_equal(kvx_blocks_alloc(b, 0, c), PD_OK);
    kvx_blocks_destroy(b);
    kvx_blocks_destroy(NULL);

    /* contiguity: after fragmentation a request that fits in a hole gets
     * one run; otherwise the lowest free blocks */
    assert_int_equal(kvx_blocks_create(NULL, 200, &b), PD_OK);
    uint32_t all[200];
    assert_int_equal(kvx_blocks_alloc(b, 200, all), PD_OK);
    for (uint32_t i = 0; i < 200; i++)
        assert_int_equal(all[i], i);
    uint32_t holes[] = { 3, 4, 70, 71, 72, 73, 74, 150 };
    assert_int_equal(kvx_blocks_free(b, holes, 8), PD_OK);
    uint32_t got[8];
    assert_int_equal(kvx_blocks_alloc(b, 4, got), PD_OK); /* fits 70..73 */
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(got[i], 70 + i);
    assert_int_equal(kvx_blocks_alloc(b, 3, got), PD_OK); /* no run of 3: lowest */
    assert_int_equal(got[0], 3);
    assert_int_equal(got[1], 4);
    assert_int_equal(got[2], 74);
    assert_int_equal(kvx_blocks_free_count(b), 1);
    assert_int_equal(kvx_blocks_alloc(b, 2, got), PD_ERR_NO_KV_SPACE);
    kvx_blocks_destroy(b);
}

typedef struct {
    eng_job_t job;
    int idx;
    pthread_t ran_on;
    bool ran;
} tjob_t;

static pthread_t g_main;
static int g_order[16], g_n_done, g_want;
static pd_loop_t *g_loop;

static void tjob_run(eng_job_t *j)
{
    tjob_t *t = (tjob_t *)j;
    t->ran_on = pthread_self();
    t->ran = true;
}

static void tjob_done(eng_job_t *j)
{
    tjob_t *t = (tjob_t *)j;
    assert_true(pthread_equal(pthread_self(), g_main));
    assert_true(t->ran != j->aborted); /* ran XOR aborted */
    g_order[g_n_done++] = t->idx;
    if (g_n_done == g_want && g_loop)
        pd_loop_stop(g_loop);
}

static void test_runner(void **state)
{
    (void)state;
    g_main = pthread_self();
    assert_int_equal(pd_loop_create(&g_loop), PD_OK);
    eng_runner_t *r;
    assert_int_equal(eng_runner_create(g_loop, 8, &r), PD_OK);
    tjob_t jobs[5];
    memset(jobs, 0, sizeof(jobs));
    g_n_done = 0;
    g_want = 5;
    for (int i = 0; i < 5; i++) {
        jobs[i].idx = i;
        jobs[i].job.run = tjob_run;
        jobs[i].job.done = tjob_done;
        assert_int_equal(eng_runner_submit(r, &jobs[i].job), PD_OK);
    }
    assert_int_equal(eng_runner_pending(r), 5);
    assert_int_equal(pd_loop_run(g_loop), PD_OK);
    assert_int_equal(g_n_done, 5);
    assert_int_equal(eng_runner_pending(r), 0);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(g_order[i], i); /* FIFO */
        assert_true(jobs[i].ran);
        assert_false(pthread_equal(jobs[i].ran_on, g_main));
    }
    /* destroy with jobs in flight: each done() exactly once */
    memset(jobs, 0, sizeof(jobs));
    g_n_done = 0;
    g_want = 100;
    for (int i = 0; i < 5; i++) {
        jobs[i].idx = i;
        jobs[i].job.run = tjob_run;
        jobs[i].job.done = tjob_done;
        assert_int_equal(eng_runner_submit(r, &jobs[i].job), PD_OK);
    }
    eng_runner_destroy(r);
    assert_int_equal(g_n_done, 5);
    eng_runner_destroy(NULL);
    pd_loop_destroy(g_loop);
    g_loop = NULL;
}

/* Batched jobs: the ones already waiting behind a run_batch job join it
 * up to its budget, in order; a job of another kind ends the run; each
 * done() still comes once, in FIFO order. */
static _Atomic int g_gate;
static int g_batch_of[16], g_n_batches;

static void tjob_gate(eng_job_t *j)
{
    while (!atomic_load(&g_gate))
        usleep(1000);
    tjob_run(j);
}

static void tjob_batch(eng_job_t *const *jobs, uint32_t n)
{
    g_n_batches++;
    for (uint32_t i = 0; i < n; i++) {
        g_batch_of[((tjob_t *)jobs[i])->idx] = g_n_batches;
        tjob_run(jobs[i]);
    }
}

static void test_runner_batch(void **state)
{
    (void)state;
    g_main = pthread_self();
    assert_int_equal(pd_loop_create(&g_loop), PD_OK);
    eng_runner_t *r;
    assert_int_equal(eng_runner_create(g_loop, 16, &r), PD_OK);
    tjob_t jobs[9];
    memset(jobs, 0, sizeof(jobs));
    memset(g_batch_of, 0, sizeof(g_batch_of));
    g_n_done = g_n_batches = 0;
    g_want = 9;
    atomic_store(&g_gate, 0);
    for (int i = 0; i < 9; i++) {
        jobs[i].idx = i;
        jobs[i].job.run = i == 0 ? tjob_gate : tjob_run;
        jobs[i].job.done = tjob_done;
        if (i >= 1 && i != 6) { /* 1..5 and 7..8 batchable, cost 2, budget 6 */
            jobs[i].job.run_batch = tjob_batch;
            jobs[i].job.cost = 2;
            jobs[i].job.budget = 6;
        }
        assert_int_equal(eng_runner_submit(r, &jobs[i].job), PD_OK);
    }
    atomic_store(&g_gate, 1); /* everything is queued behind job 0 */
    assert_int_equal(pd_loop_run(g_loop), PD_OK);
    assert_int_equal(g_n_done, 9);
    for (int i = 0; i < 9; i++) {
        assert_int_equal(g_order[i], i);
        assert_true(jobs[i].ran);
    }
    static const int want[9] = { 0, 1, 1, 1, 2, 2, 0, 3, 3 };
    for (int i = 0; i < 9; i++)
        assert_int_equal(g_batch_of[i], want[i]);
    eng_runner_destroy(r);
    pd_loop_destroy(g_loop);
    g_loop = NULL;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks),
        cmocka_unit_test(test_runner),
        cmocka_unit_test(test_runner_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
