/* rtr_tok.c - worker threads that run tokenize jobs off the event loop.
 *
 * Two pd_queue_t (common/pd_loop.h): `in`, bounded, which the workers wait
 * on; `out`, attached to the loop, whose eventfd delivers each job that has
 * run to its done function on the loop thread. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "rtr_tok.h"

#define RTR_TOK_MAX_THREADS 64

struct rtr_tok_pool {
    pd_queue_t *in, *out;
    uint32_t n_pending;           /* loop thread only */
    bool stopping;                /* loop thread only */
    pthread_t th[RTR_TOK_MAX_THREADS];
    uint32_t n_threads;
};

static void *worker(void *arg)
{
    rtr_tok_pool_t *p = arg;
    pd_queue_node_t *n;
    while ((n = pd_queue_pop_wait(p->in, UINT64_MAX)) != NULL) {
        rtr_tok_job_t *j = PD_CONTAINER_OF(n, rtr_tok_job_t, node);
        j->run(j);
        (void)pd_queue_push(p->out, &j->node); /* unbounded, open until destroy */
    }
    return NULL;
}

/* On the loop: a job has run. */
static void on_done(pd_queue_t *q, pd_queue_node_t *n, void *arg)
{
    rtr_tok_pool_t *p = arg;
    rtr_tok_job_t *j = PD_CONTAINER_OF(n, rtr_tok_job_t, node);
    (void)q;
    p->n_pending--;
    j->done(j, false);
}

pd_status_t rtr_tok_pool_create(pd_loop_t *loop, uint32_t n_threads, uint32_t queue_max,
                                rtr_tok_pool_t **pool_p)
{
    pd_status_t status;

    if (n_threads == 0 || n_threads > RTR_TOK_MAX_THREADS || queue_max == 0)
        return PD_ERR_BAD_INPUT;
    rtr_tok_pool_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return PD_ERR_NO_MEMORY;
    if ((status = pd_queue_create(queue_max, &p->in)) != PD_OK)
        goto err_free;
    if ((status = pd_queue_create(0, &p->out)) != PD_OK ||
        (status = pd_queue_attach(p->out, loop, on_done, p, 0)) != PD_OK)
        goto err_queues;
    for (; p->n_threads < n_threads; p->n_threads++)
        if (pthread_create(&p->th[p->n_threads], NULL, worker, p) != 0) {
            rtr_tok_pool_destroy(p); /* the threads started so far */
            return PD_ERR_IO;
        }
    *pool_p = p;
    return PD_OK;

err_queues:
    pd_queue_destroy(p->out);
    pd_queue_destroy(p->in);
err_free:
    free(p);
    return status;
}

pd_status_t rtr_tok_pool_submit(rtr_tok_pool_t *p, rtr_tok_job_t *job)
{
    if (p->stopping)
        return PD_ERR_CANCELED;
    pd_status_t s = pd_queue_push(p->in, &job->node);
    if (s == PD_ERR_BUSY)
        return PD_ERR_NO_SPACE;
    if (s != PD_OK)
        return PD_ERR_CANCELED;
    p->n_pending++;
    return PD_OK;
}

uint32_t rtr_tok_pool_pending(const rtr_tok_pool_t *p)
{
    return p != NULL ? p->n_pending : 0;
}

void rtr_tok_pool_destroy(rtr_tok_pool_t *p)
{
    pd_queue_node_t *n;

    if (p == NULL)
        return;
    p->stopping = true;
    /* waiting jobs are not run; then the workers finish the ones they hold */
    while ((n = pd_queue_pop(p->in)) != NULL) {
        rtr_tok_job_t *j = PD_CONTAINER_OF(n, rtr_tok_job_t, node);
        p->n_pending--;
        j->done(j, true);
    }
    pd_queue_close(p->in);
    for (uint32_t i = 0; i < p->n_threads; i++)
        pthread_join(p->th[i], NULL);
    while ((n = pd_queue_pop(p->out)) != NULL) {
        rtr_tok_job_t *j = PD_CONTAINER_OF(n, rtr_tok_job_t, node);
        p->n_pending--;
        j->done(j, false);
    }
    pd_queue_destroy(p->out);
    pd_queue_destroy(p->in);
    free(p);
}
