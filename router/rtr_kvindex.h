/* rtr_kvindex.h - the router's index of the daemons' prefix caches: block
 * name (pd_blockname.h) -> which backends hold it, fed by KV_EVENTS.
 * Pure: no I/O, no logging, no clock; memory fixed at create.
 *
 * Bounds: at most max_names distinct names in all, and at most
 * per_backend names held by any one backend; a name over either cap is
 * not indexed (counted in `dropped`): the index only ever under-reports,
 * which costs a routing hint, never correctness (a daemon checks its own
 * cache). A backend's names go when it leaves (clear_backend).
 *
 * Backends are slots 0..RTR_KVINDEX_MAX_BACKENDS-1 (the router's be[]
 * index); a name's holders are a 64-bit mask. */
#ifndef RTR_KVINDEX_H
#define RTR_KVINDEX_H

#include <stdbool.h>
#include <stdint.h>
#include "pd_status.h"

#define RTR_KVINDEX_MAX_BACKENDS 64u

typedef struct rtr_kvindex rtr_kvindex_t;

typedef struct {
    uint32_t names;              /* distinct names indexed now */
    uint64_t held;               /* (name, backend) pairs now */
    uint64_t dropped;            /* stores not indexed: a cap was reached */
} rtr_kvindex_stats_t;

/* max_names 1..2^26, per_backend 1..max_names. Expected: PD_ERR_BAD_INPUT,
 * PD_ERR_NO_MEMORY. */
pd_status_t rtr_kvindex_create(uint32_t max_names, uint32_t per_backend, rtr_kvindex_t **x_p);
void rtr_kvindex_destroy(rtr_kvindex_t *x); /* NULL-safe */

/* Backend be now holds name. false when not indexed (a cap; counted) or be
 * is out of range. Idempotent. */
bool rtr_kvindex_add(rtr_kvindex_t *x, uint32_t be, uint64_t name);
/* Backend be no longer holds name (no-op if it did not). */
void rtr_kvindex_remove(rtr_kvindex_t *x, uint32_t be, uint64_t name);
/* Forget everything backend be holds (it left, or sent a RESET). */
void rtr_kvindex_clear_backend(rtr_kvindex_t *x, uint32_t be);
/* Names backend be holds (0 out of range). */
uint32_t rtr_kvindex_count(const rtr_kvindex_t *x, uint32_t be);

/* The longest prefix of names[0..n) (a prompt's chained block names, in
 * order) each backend holds: out[b] = blocks, for every b <
 * RTR_KVINDEX_MAX_BACKENDS. A chain is only as long as its first gap. */
void rtr_kvindex_match(const rtr_kvindex_t *x, const uint64_t *names, uint32_t n,
                       uint32_t out[RTR_KVINDEX_MAX_BACKENDS]);

void rtr_kvindex_stats(const rtr_kvindex_t *x, rtr_kvindex_stats_t *out);

#endif
