/* eng_ep_local.h - the in-process transport of an expert-parallel group
 * (issue 36): N ranks, one thread each, in one process, exchanging their
 * MoE dispatch and combine messages through shared buffers (eng.h
 * "Expert parallelism"). For tests and tools: the between-process
 * transport is kvxfer's window (kvxfer/kvx_win.h). */
#ifndef ENG_EP_LOCAL_H
#define ENG_EP_LOCAL_H

#include "eng.h"

typedef struct eng_ep_local eng_ep_local_h;

/* A hub for n_ranks ranks (1..256) whose messages are at most cap[phase]
 * bytes (micro-batch 1's phases as micro-batch 0's: post and wait too); every wait gives up after timeout_ns (PD_ERR_TIMED_OUT, and the
 * hub stays failed: every later exchange returns it too). Expected:
 * PD_ERR_BAD_INPUT, PD_ERR_NO_MEMORY. */
pd_status_t eng_ep_local_create(uint32_t n_ranks, const size_t cap[2], uint64_t timeout_ns,
                                eng_ep_local_h **hub_p);
void eng_ep_local_destroy(eng_ep_local_h *hub); /* accepts NULL */
/* Rank `rank`'s transport (for eng_ops_t.set_ep): used by one thread. */
void eng_ep_local_xport(eng_ep_local_h *hub, uint32_t rank, eng_ep_xport_t *xport_p);

#endif
