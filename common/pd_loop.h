/* pd_loop.h - the one libevent loop of a daemon, plus the two things every
 * daemon needs around it:
 *   - signals: SIGTERM -> the daemon's drain callback (stop admitting, finish
 *     in-flight work, then call pd_loop_stop); SIGINT -> stop now;
 *     SIGPIPE ignored.
 *   - deferred reaping: objects are never freed inside a callback (Redis
 *     freeClientAsync); pd_loop_defer_free queues them and a lowest-priority
 *     event frees them after the current round of callbacks.
 * and pd_queue_t, an MPSC work queue between threads (memcached's thread
 * notify pattern): workers push, an eventfd wakes the loop, the loop drains;
 * in the other direction a worker thread blocks in pd_queue_pop_wait.
 *
 * Thread rules: everything on pd_loop_t runs on the loop thread except
 * pd_loop_stop (any thread). pd_queue_push/close are any-thread. */
#ifndef PD_LOOP_H
#define PD_LOOP_H

#include "pd_status.h"

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

struct event_base;

typedef struct pd_loop pd_loop_t;
typedef void (*pd_loop_cb_t)(pd_loop_t *loop, void *arg);

/* Create the event base (libevent pthreads support enabled first, once per
 * process; 3 priorities: 0 urgent, 1 default, 2 reaper) and install
 * SIGTERM/SIGINT handlers. PD_ERR_NO_MEMORY, PD_ERR_INTERNAL (libevent). */
pd_status_t pd_loop_create(pd_loop_t **loop_p);
/* Runs pending deferred frees, then frees the base. NULL-safe. */
void pd_loop_destroy(pd_loop_t *loop);

struct event_base *pd_loop_base(pd_loop_t *loop);

/* SIGTERM handler. Without one, SIGTERM stops the loop like SIGINT. The
 * callback runs on the loop thread; it may be called again on a second
 * SIGTERM (the daemon decides whether to escalate). */
void pd_loop_on_drain(pd_loop_t *loop, pd_loop_cb_t cb, void *arg);
/* Called on the loop thread when SIGINT (or pd_loop_stop) stops the loop,
 * before pd_loop_run returns. Optional. */
void pd_loop_on_stop(pd_loop_t *loop, pd_loop_cb_t cb, void *arg);

/* Run until pd_loop_stop/SIGINT (or no events left). PD_OK, or
 * PD_ERR_INTERNAL if libevent fails. */
pd_status_t pd_loop_run(pd_loop_t *loop);
/* systemd's notify protocol (units are Type=notify; no-ops outside
 * systemd, i.e. without $NOTIFY_SOCKET): READY=1 once the daemon serves,
 * a STATUS= line for `systemctl status`. pd_loop itself sends STOPPING=1
 * at the first SIGTERM/SIGINT and, under WatchdogSec=, feeds the watchdog
 * from a loop timer at half the period (started by pd_loop_run), so a loop
 * stuck in a callback is restarted. */
void pd_loop_notify_ready(const char *status);
void pd_loop_notify_status(const char *status);
/* Ask the loop to stop after the current callback. Any thread. */
void pd_loop_stop(pd_loop_t *loop);
/* Number of SIGTERMs seen (for tests and drain escalation). */
unsigned pd_loop_drain_count(const pd_loop_t *loop);

/* Queue fn(obj) to run after the current round of callbacks, on the loop
 * thread, in FIFO order. Loop thread only. PD_ERR_NO_MEMORY (nothing queued:
 * the caller still owns obj). */
pd_status_t pd_loop_defer_free(pd_loop_t *loop, void (*fn)(void *obj),
                               void *obj);
/* Number of objects waiting to be reaped. */
size_t pd_loop_defer_pending(const pd_loop_t *loop);

/* ---- pd_queue_t: MPSC/MPMC queue of intrusive nodes ------------------ */

typedef struct pd_queue_node {
    struct pd_queue_node *next;
} pd_queue_node_t;

#define PD_CONTAINER_OF(ptr, type, member)                                    \
    ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

typedef struct pd_queue pd_queue_t;
/* Loop-side consumer: called once per node, on the loop thread. */
typedef void (*pd_queue_cb_t)(pd_queue_t *queue, pd_queue_node_t *node,
                              void *arg);

/* capacity: max queued nodes (0 = unbounded). PD_ERR_NO_MEMORY,
 * PD_ERR_IO (eventfd). */
pd_status_t pd_queue_create(size_t capacity, pd_queue_t **queue_p);
/* Detaches from the loop; nodes still queued are NOT freed (the caller
 * drains with pd_queue_pop first if it owns them). NULL-safe. */
void pd_queue_destroy(pd_queue_t *queue);

/* Deliver nodes to cb on the loop thread: an eventfd EV_READ|EV_PERSIST
 * event drains up to `batch` nodes per wakeup (0 = 64) and re-arms itself if
 * more remain, so one busy producer cannot starve the loop.
 * PD_ERR_EXISTS (already attached), PD_ERR_INTERNAL (libevent). */
pd_status_t pd_queue_attach(pd_queue_t *queue, pd_loop_t *loop,
                            pd_queue_cb_t cb, void *arg, unsigned batch);

/* Any thread; never blocks for long (one mutex). Expected: PD_ERR_BUSY
 * (full: back-pressure), PD_ERR_SHUTDOWN (closed). The node is not queued
 * on error. */
pd_status_t pd_queue_push(pd_queue_t *queue, pd_queue_node_t *node);
/* Non-blocking; NULL when empty. */
pd_queue_node_t *pd_queue_pop(pd_queue_t *queue);
/* Non-blocking; the head only if take(head, arg) says so, else NULL
 * (take runs under the queue's lock: keep it a field test). */
pd_queue_node_t *pd_queue_pop_if(pd_queue_t *queue,
                                 bool (*take)(const pd_queue_node_t *node, void *arg),
                                 void *arg);
/* For worker threads (never the loop): wait up to timeout_ns
 * (UINT64_MAX = forever) for a node. NULL on timeout or when the queue is
 * closed and empty (check pd_queue_closed). */
pd_queue_node_t *pd_queue_pop_wait(pd_queue_t *queue, uint64_t timeout_ns);
/* Refuse further pushes and wake every waiter. Any thread. */
void pd_queue_close(pd_queue_t *queue);
int pd_queue_closed(pd_queue_t *queue);
size_t pd_queue_len(pd_queue_t *queue);

#endif
