/* pd_loop.c - event loop, signals, deferred reaping, eventfd work queue. */
#include "pd_loop.h"

#include <systemd/sd-daemon.h>
#include "pd_log.h"
#include "pd_time.h"

#include <event2/event.h>
#include <event2/thread.h>

#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define LOOP_PRIORITIES 3
#define PRIO_REAPER     2

typedef struct {
    void (*fn)(void *obj);
    void *obj;
} reap_entry_t;

struct pd_loop {
    struct event_base *base;
    struct event *ev_term;
    struct event *ev_int;
    struct event *ev_hup;
    struct event *ev_reap;
    struct event *ev_watchdog;  /* systemd's WatchdogSec: fed from the loop */
    bool stopping_told;
    pd_loop_cb_t drain_cb, stop_cb;
    void *drain_arg, *stop_arg;
    unsigned drain_count;
    reap_entry_t *reap;        /* (reap_cap) FIFO of pending frees */
    size_t reap_len, reap_cap;
};

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static int evthread_status;

static void evthread_init(void)
{
    evthread_status = evthread_use_pthreads();
}

static void reap_run(pd_loop_t *loop)
{
    /* Frees may defer more frees: take the list, run it, repeat. */
    while (loop->reap_len > 0) {
        reap_entry_t *list = loop->reap;
        size_t n = loop->reap_len;
        loop->reap = NULL;
        loop->reap_len = loop->reap_cap = 0;
        for (size_t i = 0; i < n; i++)
            list[i].fn(list[i].obj);
        free(list);
    }
}

static void reap_cb(evutil_socket_t fd, short what, void *arg)
{
    reap_run(arg);
}

/* systemd (Type=notify): STOPPING=1 once, at the first SIGTERM/SIGINT */
static void tell_stopping(pd_loop_t *loop)
{
    if (!loop->stopping_told) {
        loop->stopping_told = true;
        sd_notify(0, "STOPPING=1");
    }
}

static void term_cb(evutil_socket_t fd, short what, void *arg)
{
    pd_loop_t *loop = arg;
    tell_stopping(loop);
    loop->drain_count++;
    PD_LOG_DEBUG("loop", "SIGTERM #%u", loop->drain_count);
    if (loop->drain_cb != NULL)
        loop->drain_cb(loop, loop->drain_arg);
    else
        pd_loop_stop(loop);
}

/* SIGHUP (logrotate's postrotate): reopen the log file; never exit. */
static void hup_cb(evutil_socket_t fd, short what, void *arg)
{
    if (pd_log_reopen() == PD_OK)
        pd_log(PD_LOG_INFO, "loop", NULL, "SIGHUP: log file reopened");
    else
        pd_log(PD_LOG_ERROR, "loop", NULL, "SIGHUP: cannot reopen the log file (%s): "
               "still writing the old one", strerror(errno));
}

/* The watchdog is fed from the loop itself, so a loop stuck in one callback
 * (the failure it exists for) stops feeding it and systemd restarts us. */
static void watchdog_cb(evutil_socket_t fd, short what, void *arg)
{
    sd_notify(0, "WATCHDOG=1");
}

static void int_cb(evutil_socket_t fd, short what, void *arg)
{
    PD_LOG_DEBUG("loop", "SIGINT: stopping");
    tell_stopping(arg);
    pd_loop_stop(arg);
}

pd_status_t pd_loop_create(pd_loop_t **loop_p)
{
    pthread_once(&evthread_once, evthread_init);
    if (evthread_status != 0)
        return PD_ERR_INTERNAL;
    signal(SIGPIPE, SIG_IGN);

    pd_loop_t *loop = calloc(1, sizeof(*loop));
    if (loop == NULL)
        goto err;
    loop->base = event_base_new();
    if (loop->base == NULL)
        goto err_free;
    if (event_base_priority_init(loop->base, LOOP_PRIORITIES) != 0)
        goto err_free;
    loop->ev_term = evsignal_new(loop->base, SIGTERM, term_cb, loop);
    loop->ev_int = evsignal_new(loop->base, SIGINT, int_cb, loop);
    loop->ev_hup = evsignal_new(loop->base, SIGHUP, hup_cb, loop);
    loop->ev_reap = event_new(loop->base, -1, 0, reap_cb, loop);
    if (loop->ev_term == NULL || loop->ev_int == NULL || loop->ev_hup == NULL ||
        loop->ev_reap == NULL)
        goto err_free;
    event_priority_set(loop->ev_reap, PRIO_REAPER);
    event_priority_set(loop->ev_term, 1);
    event_priority_set(loop->ev_int, 0);
    if (evsignal_add(loop->ev_term, NULL) != 0 || evsignal_add(loop->ev_int, NULL) != 0 ||
        evsignal_add(loop->ev_hup, NULL) != 0)
        goto err_free;
    *loop_p = loop;
    return PD_OK;

err_free:
    pd_loop_destroy(loop);
    return PD_ERR_INTERNAL;
err:
    return PD_ERR_NO_MEMORY;
}

void pd_loop_destroy(pd_loop_t *loop)
{
    if (loop == NULL)
        return;
    reap_run(loop);
    if (loop->ev_term)
        event_free(loop->ev_term);
    if (loop->ev_int)
        event_free(loop->ev_int);
    if (loop->ev_hup)
        event_free(loop->ev_hup);
    if (loop->ev_reap)
        event_free(loop->ev_reap);
    if (loop->ev_watchdog)
        event_free(loop->ev_watchdog);
    if (loop->base)
        event_base_free(loop->base);
    free(loop->reap);
    free(loop);
}

struct event_base *pd_loop_base(pd_loop_t *loop)
{
    return loop->base;
}

void pd_loop_on_drain(pd_loop_t *loop, pd_loop_cb_t cb, void *arg)
{
    loop->drain_cb = cb;
    loop->drain_arg = arg;
}

void pd_loop_on_stop(pd_loop_t *loop, pd_loop_cb_t cb, void *arg)
{
    loop->stop_cb = cb;
    loop->stop_arg = arg;
}

pd_status_t pd_loop_run(pd_loop_t *loop)
{
    uint64_t wd_us = 0;
    if (loop->ev_watchdog == NULL && sd_watchdog_enabled(0, &wd_us) > 0 && wd_us > 0) {
        /* feed at half the period (sd_watchdog_enabled(3)) */
        struct timeval tv = pd_ns_to_timeval(wd_us * PD_NS_PER_US / 2);
        loop->ev_watchdog = event_new(loop->base, -1, EV_PERSIST, watchdog_cb, loop);
        if (loop->ev_watchdog == NULL || event_add(loop->ev_watchdog, &tv) != 0)
            pd_log(PD_LOG_WARN, "loop", NULL, "systemd watchdog: cannot arm the timer");
        else
            sd_notify(0, "WATCHDOG=1");
    }
    int rc = event_base_dispatch(loop->base);
    reap_run(loop);
    if (loop->stop_cb != NULL)
        loop->stop_cb(loop, loop->stop_arg);
    reap_run(loop);
    return rc < 0 ? PD_ERR_INTERNAL : PD_OK;
}

void pd_loop_notify_ready(const char *status)
{
    sd_notifyf(0, "READY=1\nSTATUS=%s", status != NULL ? status : "serving");
}

void pd_loop_notify_status(const char *status)
{
    sd_notifyf(0, "STATUS=%s", status);
}

void pd_loop_stop(pd_loop_t *loop)
{
    /* thread-safe: the base was created with evthread locking enabled */
    event_base_loopbreak(loop->base);
}

unsigned pd_loop_drain_count(const pd_loop_t *loop)
{
    return loop->drain_count;
}

pd_status_t pd_loop_defer_free(pd_loop_t *loop, void (*fn)(void *obj),
                               void *obj)
{
    if (loop->reap_len == loop->reap_cap) {
        size_t cap = loop->reap_cap ? loop->reap_cap * 2 : 16;
        reap_entry_t *n = realloc(loop->reap, cap * sizeof(*n));
        if (n == NULL)
            return PD_ERR_NO_MEMORY;
        loop->reap = n;
        loop->reap_cap = cap;
    }
    loop->reap[loop->reap_len++] = (reap_entry_t){ fn, obj };
    if (!event_pending(loop->ev_reap, EV_TIMEOUT, NULL))
        event_active(loop->ev_reap, EV_TIMEOUT, 0);
    return PD_OK;
}

size_t pd_loop_defer_pending(const pd_loop_t *loop)
{
    return loop->reap_len;
}

/* ---- pd_queue_t -------------------------------------------------------- */

struct pd_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* signalled on push and close */
    pd_queue_node_t *head, *tail;
    size_t len, capacity;
    int closed;
    int efd;                    /* eventfd: empty -> non-empty edges */
    struct event *ev;           /* loop-side consumer, NULL if detached */
    pd_queue_cb_t cb;
    void *cb_arg;
    unsigned batch;
};

pd_status_t pd_queue_create(size_t capacity, pd_queue_t **queue_p)
{
    pthread_condattr_t ca;
    pd_queue_t *q = calloc(1, sizeof(*q));
    if (q == NULL)
        goto err;
    q->capacity = capacity;
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->efd < 0)
        goto err_free;
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
    *queue_p = q;
    return PD_OK;

err_free:
    free(q);
    return PD_ERR_IO;
err:
    return PD_ERR_NO_MEMORY;
}

void pd_queue_destroy(pd_queue_t *q)
{
    if (q == NULL)
        return;
    if (q->ev != NULL)
        event_free(q->ev);
    close(q->efd);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}

static void queue_event_cb(evutil_socket_t fd, short what, void *arg)
{
    pd_queue_t *q = arg;
    uint64_t v;
    /* reset the edge first: a push that finds the queue empty after our
     * last pop writes again and wakes us */
    ssize_t r = read(q->efd, &v, sizeof(v));
    (void)r;
    for (unsigned i = 0; i < q->batch; i++) {
        pd_queue_node_t *node = pd_queue_pop(q);
        if (node == NULL)
            return;
        q->cb(q, node, q->cb_arg);
    }
    if (pd_queue_len(q) > 0)
        event_active(q->ev, EV_READ, 0);
}

pd_status_t pd_queue_attach(pd_queue_t *q, pd_loop_t *loop, pd_queue_cb_t cb,
                            void *arg, unsigned batch)
{
    if (q->ev != NULL)
        return PD_ERR_EXISTS;
    q->cb = cb;
    q->cb_arg = arg;
    q->batch = batch ? batch : 64;
    q->ev = event_new(loop->base, q->efd, EV_READ | EV_PERSIST, queue_event_cb, q);
    if (q->ev == NULL)
        return PD_ERR_INTERNAL;
    if (event_add(q->ev, NULL) != 0) {
        event_free(q->ev);
        q->ev = NULL;
        return PD_ERR_INTERNAL;
    }
    /* nodes pushed before attaching */
    if (pd_queue_len(q) > 0)
        event_active(q->ev, EV_READ, 0);
    return PD_OK;
}

pd_status_t pd_queue_push(pd_queue_t *q, pd_queue_node_t *node)
{
    pthread_mutex_lock(&q->mu);
    if (q->closed) {
        pthread_mutex_unlock(&q->mu);
        return PD_ERR_SHUTDOWN;
    }
    if (q->capacity != 0 && q->len >= q->capacity) {
        pthread_mutex_unlock(&q->mu);
        return PD_ERR_BUSY;
    }
    node->next = NULL;
    if (q->tail != NULL)
        q->tail->next = node;
    else
        q->head = node;
    q->tail = node;
    int was_empty = q->len++ == 0;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    if (was_empty) {
        uint64_t one = 1;
        ssize_t w = write(q->efd, &one, sizeof(one));
        (void)w; /* EAGAIN only at counter overflow: already readable */
    }
    return PD_OK;
}

static pd_queue_node_t *pop_locked(pd_queue_t *q)
{
    pd_queue_node_t *node = q->head;
    if (node != NULL) {
        q->head = node->next;
        if (q->head == NULL)
            q->tail = NULL;
        q->len--;
        node->next = NULL;
    }
    return node;
}

pd_queue_node_t *pd_queue_pop(pd_queue_t *q)
{
    pthread_mutex_lock(&q->mu);
    pd_queue_node_t *node = pop_locked(q);
    pthread_mutex_unlock(&q->mu);
    return node;
}

pd_queue_node_t *pd_queue_pop_if(pd_queue_t *q,
                                 bool (*take)(const pd_queue_node_t *node, void *arg), void *arg)
{
    pthread_mutex_lock(&q->mu);
    pd_queue_node_t *node = q->head != NULL && take(q->head, arg) ? pop_locked(q) : NULL;
    pthread_mutex_unlock(&q->mu);
    return node;
}

pd_queue_node_t *pd_queue_pop_wait(pd_queue_t *q, uint64_t timeout_ns)
{
    struct timespec deadline;
    if (timeout_ns != UINT64_MAX) {
        uint64_t d = pd_now_ns() + timeout_ns;
        deadline.tv_sec = (time_t)(d / PD_NS_PER_S);
        deadline.tv_nsec = (long)(d % PD_NS_PER_S);
    }
    pthread_mutex_lock(&q->mu);
    while (q->head == NULL && !q->closed) {
        int rc;
        if (timeout_ns == UINT64_MAX)
            rc = pthread_cond_wait(&q->cv, &q->mu);
        else
            rc = pthread_cond_timedwait(&q->cv, &q->mu, &deadline);
        if (rc == ETIMEDOUT)
            break;
    }
    pd_queue_node_t *node = pop_locked(q);
    pthread_mutex_unlock(&q->mu);
    return node;
}

void pd_queue_close(pd_queue_t *q)
{
    pthread_mutex_lock(&q->mu);
    q->closed = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    uint64_t one = 1;
    ssize_t w = write(q->efd, &one, sizeof(one));
    (void)w;
}

int pd_queue_closed(pd_queue_t *q)
{
    pthread_mutex_lock(&q->mu);
    int c = q->closed;
    pthread_mutex_unlock(&q->mu);
    return c;
}

size_t pd_queue_len(pd_queue_t *q)
{
    pthread_mutex_lock(&q->mu);
    size_t n = q->len;
    pthread_mutex_unlock(&q->mu);
    return n;
}
