/* rtr_tok.c - worker threads that run tokenize jobs off the event loop.
 *
 * One mutex guards two singly linked FIFOs (waiting, done) and the counts;
 * workers sleep on a condition variable. A finished job goes to done and
 * the worker writes the eventfd; the loop's EV_READ on it delivers every
 * done job (memcached's thread-notify pattern, as in engine/eng_runner.c). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <event2/event.h>

#include "rtr_tok.h"

#define RTR_TOK_MAX_THREADS 64

typedef struct {
    rtr_tok_job_t *head, *tail;
} job_list_t;

struct rtr_tok_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_list_t waiting, done;
    uint32_t n_waiting, n_pending, queue_max;
    bool stopping;
    int efd;
    struct event *ev;
    pthread_t th[RTR_TOK_MAX_THREADS];
    uint32_t n_threads;
};

static void list_push(job_list_t *l, rtr_tok_job_t *j)
{
    j->next = NULL;
    if (l->tail != NULL)
        l->tail->next = j;
    else
        l->head = j;
    l->tail = j;
}

static rtr_tok_job_t *list_pop(job_list_t *l)
{
    rtr_tok_job_t *j = l->head;
    if (j != NULL) {
        l->head = j->next;
        if (l->head == NULL)
            l->tail = NULL;
        j->next = NULL;
    }
    return j;
}

static void *worker(void *arg)
{
    rtr_tok_pool_t *p = arg;
    uint64_t one = 1;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stopping && p->waiting.head == NULL)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->stopping)
            break;
        rtr_tok_job_t *j = list_pop(&p->waiting);
        p->n_waiting--;
        pthread_mutex_unlock(&p->mu);
        j->run(j);
        pthread_mutex_lock(&p->mu);
        list_push(&p->done, j);
        /* a full eventfd counter cannot happen (one write per job) */
        ssize_t w = write(p->efd, &one, sizeof(one));
        (void)w;
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Deliver every finished job on the loop. */
static void on_done(evutil_socket_t fd, short what, void *arg)
{
    rtr_tok_pool_t *p = arg;
    uint64_t n;
    job_list_t got;

    (void)what;
    if (read(fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
        return;
    pthread_mutex_lock(&p->mu);
    got = p->done;
    p->done.head = p->done.tail = NULL;
    pthread_mutex_unlock(&p->mu);
    for (rtr_tok_job_t *j; (j = list_pop(&got)) != NULL;) {
        p->n_pending--;
        j->done(j, false);
    }
}

pd_status_t rtr_tok_pool_create(struct event_base *base, uint32_t n_threads,
                                uint32_t queue_max, rtr_tok_pool_t **pool_p)
{
    rtr_tok_pool_t *p;
    pd_status_t status = PD_ERR_IO;

    if (n_threads == 0 || n_threads > RTR_TOK_MAX_THREADS)
        return PD_ERR_BAD_INPUT;
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return PD_ERR_NO_MEMORY;
    p->queue_max = queue_max;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->efd < 0)
        goto err_free;
    p->ev = event_new(base, p->efd, EV_READ | EV_PERSIST, on_done, p);
    if (p->ev == NULL || event_add(p->ev, NULL) != 0)
        goto err_efd;
    for (; p->n_threads < n_threads; p->n_threads++)
        if (pthread_create(&p->th[p->n_threads], NULL, worker, p) != 0)
            goto err_threads;
    *pool_p = p;
    return PD_OK;

err_threads:
    rtr_tok_pool_destroy(p);
    return status;
err_efd:
    if (p->ev != NULL)
        event_free(p->ev);
    close(p->efd);
err_free:
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
    return status;
}

pd_status_t rtr_tok_pool_submit(rtr_tok_pool_t *p, rtr_tok_job_t *job)
{
    pd_status_t status = PD_OK;

    pthread_mutex_lock(&p->mu);
    if (p->stopping)
        status = PD_ERR_CANCELED;
    else if (p->n_waiting >= p->queue_max)
        status = PD_ERR_NO_SPACE;
    if (status == PD_OK) {
        list_push(&p->waiting, job);
        p->n_waiting++;
        p->n_pending++;
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return status;
}

uint32_t rtr_tok_pool_pending(const rtr_tok_pool_t *p)
{
    return p != NULL ? p->n_pending : 0;
}

void rtr_tok_pool_destroy(rtr_tok_pool_t *p)
{
    rtr_tok_job_t *j;

    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < p->n_threads; i++)
        pthread_join(p->th[i], NULL);
    /* workers are gone: no lock needed */
    while ((j = list_pop(&p->done)) != NULL) {
        p->n_pending--;
        j->done(j, false);
    }
    while ((j = list_pop(&p->waiting)) != NULL) {
        p->n_pending--;
        j->done(j, true);
    }
    if (p->ev != NULL)
        event_free(p->ev);
    close(p->efd);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
