/* rtr_tok.h - tokenizing off the router's event loop (issue 31).
 *
 * A small pool of worker threads with a bounded queue. The loop submits a
 * job (its run function is called on a worker: it may only read immutable
 * state, e.g. the loaded tokenizer, and write the job's own fields); when
 * it has run, its done function is called on the loop thread, woken through
 * a pd_queue_t attached to the loop (no libevent call from a worker).
 * The router tokenizes small prompts inline and sends the large ones here,
 * so one huge prompt never stalls the streams of everyone else.
 */
#ifndef RTR_TOK_H
#define RTR_TOK_H

#include <stdbool.h>
#include <stdint.h>
#include "pd_loop.h"
#include "pd_status.h"

typedef struct rtr_tok_pool rtr_tok_pool_t;
typedef struct rtr_tok_job rtr_tok_job_t;

struct rtr_tok_job {
    pd_queue_node_t node;                /* pool-owned while submitted */
    void (*run)(rtr_tok_job_t *job);     /* on a worker */
    /* On the loop thread, exactly once per submitted job. canceled: the
     * pool stopped before the job ran (run was not called). */
    void (*done)(rtr_tok_job_t *job, bool canceled);
};

/* Start n_threads workers (>= 1) taking at most queue_max jobs waiting
 * (running ones not counted; >= 1). PD_ERR_NO_MEMORY, PD_ERR_IO (eventfd/thread). */
pd_status_t rtr_tok_pool_create(pd_loop_t *loop, uint32_t n_threads,
                                uint32_t queue_max, rtr_tok_pool_t **pool_p);

/* Queue a job. PD_ERR_NO_SPACE: queue_max jobs are waiting (the caller
 * answers 503 / retries later: expected under a burst of huge prompts);
 * PD_ERR_CANCELED after rtr_tok_pool_destroy began. */
pd_status_t rtr_tok_pool_submit(rtr_tok_pool_t *pool, rtr_tok_job_t *job);

/* Jobs submitted and not yet delivered (waiting, running or done). */
uint32_t rtr_tok_pool_pending(const rtr_tok_pool_t *pool);

/* Stop: running jobs finish, waiting ones are not run; every job not yet
 * delivered gets its done call here (canceled or not). Accepts NULL. */
void rtr_tok_pool_destroy(rtr_tok_pool_t *pool);

#endif
