/* eng_runner.c - see eng_runner.h. */
#include "eng_runner.h"

#include <pthread.h>
#include <stdlib.h>

struct eng_runner {
    pd_queue_t *in;      /* loop -> compute */
    pd_queue_t *out;     /* compute -> loop (attached to the loop) */
    pthread_t thread;
    size_t pending;      /* loop-thread count */
    void (*on_busy)(void *arg, bool busy);
    void *busy_arg;
};

typedef struct {
    const eng_job_t *first;
    uint32_t cost;       /* of the batch so far */
} runner_batch_t;

static bool runner_joins(const pd_queue_node_t *n, void *arg)
{
    runner_batch_t *b = arg;
    const eng_job_t *job = PD_CONTAINER_OF(n, eng_job_t, node);
    return job->run_batch == b->first->run_batch && job->cost <= b->first->budget - b->cost;
}

static void *runner_main(void *arg)
{
    eng_runner_t *r = arg;
    eng_job_t *jobs[ENG_RUNNER_BATCH_MAX];
    for (;;) {
        pd_queue_node_t *n = pd_queue_pop_wait(r->in, UINT64_MAX);
        if (n == NULL) {
            if (pd_queue_closed(r->in))
                break;
            continue;
        }
        eng_job_t *job = PD_CONTAINER_OF(n, eng_job_t, node);
        uint32_t k = 1;
        jobs[0] = job;
        if (job->run_batch != NULL) {
            runner_batch_t b = { job, job->cost < job->budget ? job->cost : job->budget };
            while (k < ENG_RUNNER_BATCH_MAX &&
                   (n = pd_queue_pop_if(r->in, runner_joins, &b)) != NULL) {
                jobs[k] = PD_CONTAINER_OF(n, eng_job_t, node);
                b.cost += jobs[k++]->cost;
            }
            job->run_batch(jobs, k);
        } else {
            job->run(job);
        }
        for (uint32_t i = 0; i < k; i++)
            while (pd_queue_push(r->out, &jobs[i]->node) == PD_ERR_BUSY)
                ; /* out is unbounded: never taken */
    }
    return NULL;
}

static void runner_deliver(pd_queue_t *q, pd_queue_node_t *n, void *arg)
{
    (void)q;
    eng_runner_t *r = arg;
    eng_job_t *job = PD_CONTAINER_OF(n, eng_job_t, node);
    if (--r->pending == 0 && r->on_busy != NULL)
        r->on_busy(r->busy_arg, false);
    job->done(job);
}

pd_status_t eng_runner_create(pd_loop_t *loop, size_t queue_cap,
                              eng_runner_t **r_p)
{
    eng_runner_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return PD_ERR_NO_MEMORY;
    pd_status_t st = pd_queue_create(queue_cap, &r->in);
    if (st != PD_OK)
        goto err_free;
    st = pd_queue_create(0, &r->out);
    if (st != PD_OK)
        goto err_in;
    st = pd_queue_attach(r->out, loop, runner_deliver, r, 0);
    if (st != PD_OK)
        goto err_out;
    if (pthread_create(&r->thread, NULL, runner_main, r) != 0) {
        st = PD_ERR_INTERNAL;
        goto err_out;
    }
    *r_p = r;
    return PD_OK;
err_out:
    pd_queue_destroy(r->out);
err_in:
    pd_queue_destroy(r->in);
err_free:
    free(r);
    return st;
}

void eng_runner_destroy(eng_runner_t *r)
{
    if (r == NULL)
        return;
    pd_queue_close(r->in);
    pthread_join(r->thread, NULL);
    pd_queue_node_t *n;
    while ((n = pd_queue_pop(r->out)) != NULL) {
        eng_job_t *job = PD_CONTAINER_OF(n, eng_job_t, node);
        job->done(job);
    }
    while ((n = pd_queue_pop(r->in)) != NULL) {
        eng_job_t *job = PD_CONTAINER_OF(n, eng_job_t, node);
        job->aborted = true;
        job->done(job);
    }
    pd_queue_destroy(r->in);
    pd_queue_destroy(r->out);
    free(r);
}

pd_status_t eng_runner_submit(eng_runner_t *r, eng_job_t *job)
{
    job->aborted = false;
    pd_status_t st = pd_queue_push(r->in, &job->node);
    if (st == PD_OK && r->pending++ == 0 && r->on_busy != NULL)
        r->on_busy(r->busy_arg, true);
    return st;
}

void eng_runner_on_busy(eng_runner_t *r, void (*fn)(void *arg, bool busy), void *arg)
{
    r->on_busy = fn;
    r->busy_arg = arg;
}

size_t eng_runner_pending(const eng_runner_t *r)
{
    return r->pending;
}
