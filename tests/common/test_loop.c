/* test_loop.c - deferred reaping, signals, and the eventfd work queue
 * between threads and the loop. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "pd_loop.h"
#include "pd_time.h"

#include <event2/event.h>

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* ---- deferred free ----------------------------------------------------- */

typedef struct {
    pd_loop_t *loop;
    int order[16];
    int n_freed;
    int in_callback;        /* set while a normal callback runs */
    int freed_in_callback;  /* must stay 0 */
    int other_ran;          /* default-priority event activated in the cb */
    int other_ran_before_free;
} defer_ctx_t;

typedef struct {
    defer_ctx_t *ctx;
    int id;
    int nest;               /* defer another object when reaped */
} obj_t;

static void obj_free(void *p)
{
    obj_t *o = p;
    defer_ctx_t *ctx = o->ctx;
    if (ctx->in_callback)
        ctx->freed_in_callback++;
    if (ctx->n_freed == 0)
        ctx->other_ran_before_free = ctx->other_ran;
    ctx->order[ctx->n_freed++] = o->id;
    if (o->nest) {
        obj_t *n = calloc(1, sizeof(*n));
        n->ctx = ctx;
        n->id = 100;
        assert_int_equal(pd_loop_defer_free(ctx->loop, obj_free, n), PD_OK);
    }
    free(o);
    if (ctx->n_freed == 4)
        pd_loop_stop(ctx->loop);
}

static void other_cb(evutil_socket_t fd, short what, void *arg)
{
    defer_ctx_t *ctx = arg;
    ctx->other_ran = 1;
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct event **other = arg;
    defer_ctx_t *ctx = event_get_callback_arg(other[0]);
    ctx->in_callback = 1;
    for (int i = 0; i < 3; i++) {
        obj_t *o = calloc(1, sizeof(*o));
        o->ctx = ctx;
        o->id = i;
        o->nest = i == 2;
        assert_int_equal(pd_loop_defer_free(ctx->loop, obj_free, o), PD_OK);
    }
    assert_int_equal(pd_loop_defer_pending(ctx->loop), 3);
    event_active(other[0], EV_TIMEOUT, 0);
    assert_int_equal(ctx->n_freed, 0);
    ctx->in_callback = 0;
}

static void test_defer_free(void **state)
{
    pd_loop_t *loop;
    defer_ctx_t ctx = { 0 };
    assert_int_equal(pd_loop_create(&loop), PD_OK);
    ctx.loop = loop;
    struct event *other = event_new(pd_loop_base(loop), -1, 0, other_cb, &ctx);
    struct event *others[1] = { other };
    struct event *timer = evtimer_new(pd_loop_base(loop), timer_cb, others);
    struct timeval tv = { 0, 1000 };
    evtimer_add(timer, &tv);
    assert_int_equal(pd_loop_run(loop), PD_OK);
    assert_int_equal(ctx.n_freed, 4);
    assert_int_equal(ctx.freed_in_callback, 0);
    assert_int_equal(ctx.other_ran_before_free, 1); /* reaper runs last */
    assert_int_equal(ctx.order[0], 0);
    assert_int_equal(ctx.order[1], 1);
    assert_int_equal(ctx.order[2], 2);
    assert_int_equal(ctx.order[3], 100);
    event_free(timer);
    event_free(other);

    /* pending frees run at destroy */
    obj_t *o = calloc(1, sizeof(*o));
    o->ctx = &ctx;
    o->id = 7;
    assert_int_equal(pd_loop_defer_free(loop, obj_free, o), PD_OK);
    pd_loop_destroy(loop);
    assert_int_equal(ctx.n_freed, 5);
    assert_int_equal(ctx.order[4], 7);
    pd_loop_destroy(NULL);
}

/* ---- signals ----------------------------------------------------------- */

typedef struct {
    int drained;
    int stopped;
} sig_ctx_t;

static void drain_cb(pd_loop_t *loop, void *arg)
{
    ((sig_ctx_t *)arg)->drained++;
    pd_loop_stop(loop);
}

static void stop_cb(pd_loop_t *loop, void *arg)
{
    ((sig_ctx_t *)arg)->stopped++;
}

static void raise_cb(evutil_socket_t fd, short what, void *arg)
{
    raise(*(int *)arg);
}

static void run_with_signal(pd_loop_t *loop, int sig)
{
    struct event *t = evtimer_new(pd_loop_base(loop), raise_cb, &sig);
    struct timeval tv = { 0, 1000 };
    evtimer_add(t, &tv);
    assert_int_equal(pd_loop_run(loop), PD_OK);
    event_free(t);
}

static void test_signals(void **state)
{
    pd_loop_t *loop;
    sig_ctx_t ctx = { 0 };
    assert_int_equal(pd_loop_create(&loop), PD_OK);
    pd_loop_on_drain(loop, drain_cb, &ctx);
    pd_loop_on_stop(loop, stop_cb, &ctx);
    run_with_signal(loop, SIGTERM);
    assert_int_equal(ctx.drained, 1);
    assert_int_equal(pd_loop_drain_count(loop), 1);
    assert_int_equal(ctx.stopped, 1);
    run_with_signal(loop, SIGINT);
    assert_int_equal(ctx.drained, 1);
    assert_int_equal(ctx.stopped, 2);
    /* without a drain callback SIGTERM stops */
    pd_loop_on_drain(loop, NULL, NULL);
    run_with_signal(loop, SIGTERM);
    assert_int_equal(pd_loop_drain_count(loop), 2);
    assert_int_equal(ctx.stopped, 3);
    pd_loop_destroy(loop);
}

/* ---- queue ------------------------------------------------------------- */

#define PRODUCERS 4
#define PER_PRODUCER 20000

typedef struct {
    pd_queue_node_t node;
    int producer;
    int seq;
} item_t;

typedef struct {
    pd_loop_t *loop;
    pd_queue_t *q;
    item_t *items;          /* (PRODUCERS, PER_PRODUCER) */
    int producer;
    int next_seq[PRODUCERS];
    int received;
    int out_of_order;
    pthread_t loop_thread;
    int wrong_thread;
} q_ctx_t;

static void *producer(void *arg)
{
    q_ctx_t *ctx = ((q_ctx_t **)arg)[0];
    int p = (int)(intptr_t)((void **)arg)[1];
    for (int i = 0; i < PER_PRODUCER; i++) {
        item_t *it = &ctx->items[p * PER_PRODUCER + i];
        it->producer = p;
        it->seq = i;
        pd_status_t s;
        while ((s = pd_queue_push(ctx->q, &it->node)) == PD_ERR_BUSY)
            sched_yield(); /* back-pressure from the bounded queue */
        assert_int_equal(s, PD_OK);
    }
    return NULL;
}

static void consume_cb(pd_queue_t *q, pd_queue_node_t *node, void *arg)
{
    q_ctx_t *ctx = arg;
    item_t *it = PD_CONTAINER_OF(node, item_t, node);
    if (!pthread_equal(pthread_self(), ctx->loop_thread))
        ctx->wrong_thread++;
    if (it->seq != ctx->next_seq[it->producer])
        ctx->out_of_order++;
    ctx->next_seq[it->producer] = it->seq + 1;
    if (++ctx->received == PRODUCERS * PER_PRODUCER)
        pd_loop_stop(ctx->loop);
}

static void test_queue_threads_to_loop(void **state)
{
    q_ctx_t ctx = { 0 };
    assert_int_equal(pd_loop_create(&ctx.loop), PD_OK);
    assert_int_equal(pd_queue_create(1024, &ctx.q), PD_OK);
    ctx.items = calloc(PRODUCERS * PER_PRODUCER, sizeof(item_t));
    ctx.loop_thread = pthread_self();
    assert_int_equal(pd_queue_attach(ctx.q, ctx.loop, consume_cb, &ctx, 16), PD_OK);
    assert_int_equal(pd_queue_attach(ctx.q, ctx.loop, consume_cb, &ctx, 16), PD_ERR_EXISTS);
    pthread_t th[PRODUCERS];
    void *args[PRODUCERS][2];
    for (int p = 0; p < PRODUCERS; p++) {
        args[p][0] = &ctx;
        args[p][1] = (void *)(intptr_t)p;
        assert_int_equal(pthread_create(&th[p], NULL, producer, args[p]), 0);
    }
    assert_int_equal(pd_loop_run(ctx.loop), PD_OK);
    for (int p = 0; p < PRODUCERS; p++)
        pthread_join(th[p], NULL);
    assert_int_equal(ctx.received, PRODUCERS * PER_PRODUCER);
    assert_int_equal(ctx.out_of_order, 0);
    assert_int_equal(ctx.wrong_thread, 0);
    assert_int_equal(pd_queue_len(ctx.q), 0);
    pd_queue_destroy(ctx.q);
    pd_loop_destroy(ctx.loop);
    free(ctx.items);
}

static void test_queue_limits(void **state)
{
    pd_queue_t *q;
    item_t a, b, c;
    assert_int_equal(pd_queue_create(2, &q), PD_OK);
    assert_null(pd_queue_pop(q));
    assert_int_equal(pd_queue_push(q, &a.node), PD_OK);
    assert_int_equal(pd_queue_push(q, &b.node), PD_OK);
    assert_int_equal(pd_queue_push(q, &c.node), PD_ERR_BUSY);
    assert_int_equal(pd_queue_len(q), 2);
    assert_ptr_equal(pd_queue_pop(q), &a.node);
    uint64_t t0 = pd_now_ns();
    assert_ptr_equal(pd_queue_pop_wait(q, 1000 * PD_NS_PER_MS), &b.node);
    assert_true(pd_now_ns() - t0 < 500 * PD_NS_PER_MS); /* did not wait */
    t0 = pd_now_ns();
    assert_null(pd_queue_pop_wait(q, 20 * PD_NS_PER_MS));
    uint64_t waited = pd_now_ns() - t0;
    assert_true(waited >= 19 * PD_NS_PER_MS && waited < 2 * PD_NS_PER_S);
    assert_false(pd_queue_closed(q));
    pd_queue_close(q);
    assert_true(pd_queue_closed(q));
    assert_int_equal(pd_queue_push(q, &c.node), PD_ERR_SHUTDOWN);
    assert_null(pd_queue_pop_wait(q, UINT64_MAX)); /* closed: returns at once */
    pd_queue_destroy(q);
    pd_queue_destroy(NULL);
}

/* Loop -> worker (blocking pop) -> loop round trips. */
typedef struct {
    pd_loop_t *loop;
    pd_queue_t *to_worker, *to_loop;
    item_t items[64];
    int returned;
    int sum;
} rt_ctx_t;

static void *rt_worker(void *arg)
{
    rt_ctx_t *ctx = arg;
    pd_queue_node_t *n;
    while ((n = pd_queue_pop_wait(ctx->to_worker, UINT64_MAX)) != NULL) {
        item_t *it = PD_CONTAINER_OF(n, item_t, node);
        it->seq *= 2; /* "compute" */
        assert_int_equal(pd_queue_push(ctx->to_loop, n), PD_OK);
    }
    return NULL; /* closed and empty */
}

static void rt_back_cb(pd_queue_t *q, pd_queue_node_t *node, void *arg)
{
    rt_ctx_t *ctx = arg;
    ctx->sum += PD_CONTAINER_OF(node, item_t, node)->seq;
    if (++ctx->returned == 64)
        pd_loop_stop(ctx->loop);
}

static void rt_start_cb(evutil_socket_t fd, short what, void *arg)
{
    rt_ctx_t *ctx = arg;
    for (int i = 0; i < 64; i++) {
        ctx->items[i].seq = i;
        assert_int_equal(pd_queue_push(ctx->to_worker, &ctx->items[i].node), PD_OK);
    }
}

static void test_queue_loop_to_worker(void **state)
{
    rt_ctx_t ctx = { 0 };
    pthread_t th;
    assert_int_equal(pd_loop_create(&ctx.loop), PD_OK);
    assert_int_equal(pd_queue_create(0, &ctx.to_worker), PD_OK);
    assert_int_equal(pd_queue_create(0, &ctx.to_loop), PD_OK);
    assert_int_equal(pd_queue_attach(ctx.to_loop, ctx.loop, rt_back_cb, &ctx, 0), PD_OK);
    assert_int_equal(pthread_create(&th, NULL, rt_worker, &ctx), 0);
    struct event *t = evtimer_new(pd_loop_base(ctx.loop), rt_start_cb, &ctx);
    struct timeval tv = { 0, 1000 };
    evtimer_add(t, &tv);
    assert_int_equal(pd_loop_run(ctx.loop), PD_OK);
    pd_queue_close(ctx.to_worker);  /* wakes the blocked worker */
    pthread_join(th, NULL);
    assert_int_equal(ctx.returned, 64);
    assert_int_equal(ctx.sum, 2 * (63 * 64 / 2));
    event_free(t);
    pd_queue_destroy(ctx.to_worker);
    pd_queue_destroy(ctx.to_loop);
    pd_loop_destroy(ctx.loop);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defer_free),
        cmocka_unit_test(test_signals),
        cmocka_unit_test(test_queue_threads_to_loop),
        cmocka_unit_test(test_queue_limits),
        cmocka_unit_test(test_queue_loop_to_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
