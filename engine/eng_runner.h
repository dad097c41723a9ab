/* eng_runner.h - one compute thread and its job queues (memcached's thread
 * notify pattern, on pd_queue_t): the loop submits jobs, the compute thread
 * runs job->run(job), and job->done(job) is called back on the loop thread.
 *
 * Engine-agnostic: a job is whatever the daemon wraps around an eng_ops
 * call (a prefill, one continuous-batching step). One model is used by one
 * compute thread (eng.h), so a daemon has one runner per model.
 * Depends on common only. */
#ifndef ENG_RUNNER_H
#define ENG_RUNNER_H

#include <stdbool.h>
#include <stdint.h>
#include "pd_loop.h"
#include "pd_status.h"

typedef struct eng_job eng_job_t;
struct eng_job {
    pd_queue_node_t node;                /* internal */
    void (*run)(eng_job_t *job);         /* compute thread */
    void (*done)(eng_job_t *job);        /* loop thread, once per submit */
    bool aborted;                        /* set when the runner was destroyed
                                            before run() happened */
    /* Optional (NULL: run() alone; set, run may be NULL). Jobs waiting at
     * the head of the queue behind this one with the same run_batch join
     * it: one call
     * run_batch(jobs, n) runs them all, as long as their summed cost stays
     * within this job's budget (this job always runs) and n <=
     * ENG_RUNNER_BATCH_MAX. Only jobs already waiting join (no waiting
     * for more), in queue order. done() is still called once per job. */
    void (*run_batch)(eng_job_t *const *jobs, uint32_t n);
    uint32_t cost, budget;
};

#define ENG_RUNNER_BATCH_MAX 64u

typedef struct eng_runner eng_runner_t;

/* Start the compute thread; completions are delivered on `loop`.
 * queue_cap bounds the submitted-and-not-started jobs (0 = unbounded).
 * Expected: PD_ERR_NO_MEMORY, PD_ERR_IO, PD_ERR_INTERNAL. */
pd_status_t eng_runner_create(pd_loop_t *loop, size_t queue_cap,
                              eng_runner_t **r_p);
/* Stop the thread (after the job it is running), then call done() for
 * every job still queued (aborted = true) and every completed one not yet
 * delivered. Loop thread. NULL-safe. */
void eng_runner_destroy(eng_runner_t *r);

/* Queue a job (loop thread). Expected: PD_ERR_BUSY (queue full),
 * PD_ERR_SHUTDOWN. On error the job is not queued and done() not called. */
pd_status_t eng_runner_submit(eng_runner_t *r, eng_job_t *job);
/* Jobs submitted and not yet delivered back. */
size_t eng_runner_pending(const eng_runner_t *r);
/* fn(arg, true) when a job is submitted with none pending, fn(arg, false)
 * when the last pending one is delivered (loop thread): the host's core
 * arbiter hears when this daemon wants its threads. NULL fn: none. */
void eng_runner_on_busy(eng_runner_t *r, void (*fn)(void *arg, bool busy), void *arg);

#endif
