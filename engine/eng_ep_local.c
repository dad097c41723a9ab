/* eng_ep_local.c - the in-process EP transport: buf[phase][src][dst]
 * written by src, read by dst; one barrier per phase (a generation
 * counter under a mutex, timed waits), arrived at by post and waited for
 * by wait, so micro-batch 0's and 1's exchanges overlap. Two exchanges
 * per layer and micro-batch keep the reuse safe without double buffers: src writes its dispatch(l+1) only
 * after the combine(l) barrier, which dst passes only after it finished
 * reading dispatch(l); the same holds for combine. */
#include "eng_ep_local.h"

#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
    eng_ep_local_h *hub;
    uint32_t rank;
    uint64_t want[ENG_EP_SLOTS];   /* the generation its post completes */
    bool posted[ENG_EP_SLOTS];
} ep_local_rank_t;

struct eng_ep_local {
    uint32_t n;
    size_t cap[ENG_EP_SLOTS];    /* micro-batch 1's phases: 0's caps */
    uint64_t timeout_ns;
    uint8_t *buf[ENG_EP_SLOTS];  /* (n src, n dst, cap[phase]) */
    size_t *len[ENG_EP_SLOTS];   /* (n src, n dst) */
    ep_local_rank_t *ranks;      /* (n) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t arrived[ENG_EP_SLOTS];
    uint64_t gen[ENG_EP_SLOTS];
    pd_status_t failed;
};

static void ep_local_free(eng_ep_local_h *h)
{
    for (int ph = 0; ph < ENG_EP_SLOTS; ph++) {
        free(h->buf[ph]);
        free(h->len[ph]);
    }
    free(h->ranks);
    free(h);
}

pd_status_t eng_ep_local_create(uint32_t n_ranks, const size_t cap[2], uint64_t timeout_ns,
                                eng_ep_local_h **hub_p)
{
    if (n_ranks == 0 || n_ranks > 256 || !cap || !hub_p || timeout_ns == 0)
        return PD_ERR_BAD_INPUT;
    eng_ep_local_h *h = calloc(1, sizeof(*h));
    if (!h)
        return PD_ERR_NO_MEMORY;
    h->n = n_ranks;
    h->timeout_ns = timeout_ns;
    for (int ph = 0; ph < ENG_EP_SLOTS; ph++) {
        h->cap[ph] = (cap[ph & 1] + 63) / 64 * 64;
        h->buf[ph] = calloc((size_t)n_ranks * n_ranks, h->cap[ph] ? h->cap[ph] : 1);
        h->len[ph] = calloc((size_t)n_ranks * n_ranks, sizeof(size_t));
        if (!h->buf[ph] || !h->len[ph]) {
            ep_local_free(h);
            return PD_ERR_NO_MEMORY;
        }
    }
    h->ranks = calloc(n_ranks, sizeof(*h->ranks));
    if (!h->ranks) {
        ep_local_free(h);
        return PD_ERR_NO_MEMORY;
    }
    for (uint32_t r = 0; r < n_ranks; r++)
        h->ranks[r] = (ep_local_rank_t){ .hub = h, .rank = r };
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&h->mu, NULL);
    *hub_p = h;
    return PD_OK;
}

void eng_ep_local_destroy(eng_ep_local_h *h)
{
    if (!h)
        return;
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    ep_local_free(h);
}

static void *ep_local_send_buf(void *ctx, eng_ep_phase_t ph, uint32_t peer)
{
    ep_local_rank_t *r = ctx;
    eng_ep_local_h *h = r->hub;
    return h->buf[ph] + ((size_t)r->rank * h->n + peer) * h->cap[ph];
}

/* This rank's messages of phase ph are written: arrive at the phase's
 * barrier (the last to arrive opens it) without waiting. */
static pd_status_t ep_local_post(void *ctx, eng_ep_phase_t ph, uint32_t layer,
                                 const size_t *len)
{
    ep_local_rank_t *r = ctx;
    eng_ep_local_h *h = r->hub;
    (void)layer;
    if ((unsigned)ph >= ENG_EP_SLOTS || r->posted[ph])
        return PD_ERR_BAD_INPUT;
    for (uint32_t p = 0; p < h->n; p++)
        if (len[p] > h->cap[ph])
            return PD_ERR_TOO_BIG;
    for (uint32_t p = 0; p < h->n; p++)
        h->len[ph][(size_t)r->rank * h->n + p] = len[p];
    pthread_mutex_lock(&h->mu);
    pd_status_t st = h->failed;
    if (st == PD_OK) {
        r->want[ph] = h->gen[ph] + 1;
        r->posted[ph] = true;
        if (++h->arrived[ph] == h->n) {
            h->arrived[ph] = 0;
            h->gen[ph]++;
            pthread_cond_broadcast(&h->cv);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return st;
}

/* Wait (timed) until every rank posted phase ph. */
static pd_status_t ep_local_wait(void *ctx, eng_ep_phase_t ph, uint32_t layer,
                                 const void **recv, size_t *recv_len)
{
    ep_local_rank_t *r = ctx;
    eng_ep_local_h *h = r->hub;
    (void)layer;
    if ((unsigned)ph >= ENG_EP_SLOTS || !r->posted[ph])
        return PD_ERR_BAD_INPUT;
    r->posted[ph] = false;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    uint64_t ns = (uint64_t)dl.tv_nsec + h->timeout_ns;
    dl.tv_sec += (time_t)(ns / 1000000000u);
    dl.tv_nsec = (long)(ns % 1000000000u);
    pthread_mutex_lock(&h->mu);
    while (h->gen[ph] < r->want[ph] && h->failed == PD_OK)
        if (pthread_cond_timedwait(&h->cv, &h->mu, &dl) == ETIMEDOUT &&
            h->gen[ph] < r->want[ph]) {
            h->failed = PD_ERR_TIMED_OUT;
            pthread_cond_broadcast(&h->cv);
        }
    pd_status_t st = h->gen[ph] >= r->want[ph] ? PD_OK : h->failed;
    pthread_mutex_unlock(&h->mu);
    if (st != PD_OK)
        return st;
    for (uint32_t p = 0; p < h->n; p++) {
        recv[p] = h->buf[ph] + ((size_t)p * h->n + r->rank) * h->cap[ph];
        recv_len[p] = h->len[ph][(size_t)p * h->n + r->rank];
    }
    return PD_OK;
}

static pd_status_t ep_local_exchange(void *ctx, eng_ep_phase_t ph, uint32_t layer,
                                     const size_t *len, const void **recv, size_t *recv_len)
{
    pd_status_t st = ep_local_post(ctx, ph, layer, len);
    return st != PD_OK ? st : ep_local_wait(ctx, ph, layer, recv, recv_len);
}

void eng_ep_local_xport(eng_ep_local_h *h, uint32_t rank, eng_ep_xport_t *x)
{
    *x = (eng_ep_xport_t){
        .ctx = &h->ranks[rank], .rank = rank, .size = h->n,
        .cap = { h->cap[0], h->cap[1], h->cap[2], h->cap[3] },
        .send_buf = ep_local_send_buf, .exchange = ep_local_exchange,
        .post = ep_local_post, .wait = ep_local_wait,
    };
}
