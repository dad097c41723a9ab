/* pd_cpuarb.h - the host's core arbiter (issue 34): daemons on one host
 * say, in a shared-memory table, how many engine threads they could use
 * now ("want") and on how many they run ("using"), each with a priority
 * (0 first: decodes; prefills after). A daemon with a latency bound (a
 * decode with tpot-target) reads what the daemons after it want and runs
 * its steps on fewer threads while they want cores and its bound holds;
 * the cores it parks go to them through the kernel (they are niced below
 * it, so its steps still preempt them). Nothing blocks on the table:
 * every read and write is one relaxed atomic, a slot is claimed under
 * flock, and a slot whose process is gone is reclaimed (kill(pid, 0) +
 * the process's start time, so a reused pid is not mistaken for it).
 *
 * The file (default /dev/shm/pdserve-cpu.arb, mode 0600) is trusted like
 * the memory ledger: whoever can write it can make a decode park threads,
 * never break its bound (the decode only parks while its own measured
 * step time stays within tpot-target). Values read are clamped. Daemons
 * sharing a table must see each other's pids (one pid namespace): a
 * table shared across pid namespaces would take live slots for dead ones;
 * give each namespace its own path. */
#ifndef PD_CPUARB_H
#define PD_CPUARB_H

#include "pd_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PD_CPUARB_DEFAULT "/dev/shm/pdserve-cpu.arb"
#define PD_CPUARB_SLOTS 64
#define PD_CPUARB_NAME_MAX 48
#define PD_CPUARB_WANT_MAX 4096 /* a slot's want is read clamped to this */

typedef struct pd_cpuarb pd_cpuarb_t;

/* One slot as read (pd_cpuarb_list). */
typedef struct {
    int32_t pid;
    uint32_t prio, want, used;
    char name[PD_CPUARB_NAME_MAX];
} pd_cpuarb_entry_t;

/* Open (create) the table at path (NULL: PD_CPUARB_DEFAULT) and claim a
 * slot for this process under name ("pd-decode decode-0") with priority
 * prio. PD_OK; PD_ERR_IO (open, lock, map: why says so); PD_ERR_NO_SPACE
 * (every slot held by a live process). */
pd_status_t pd_cpuarb_join(const char *path, const char *name, uint32_t prio,
                           pd_cpuarb_t **arb_p, char *why, size_t why_len);
/* Free the slot, unmap. NULL-safe. */
void pd_cpuarb_leave(pd_cpuarb_t *arb);

/* This daemon's threads it could use now / runs on now. Any thread. */
void pd_cpuarb_set_want(pd_cpuarb_t *arb, uint32_t want);
void pd_cpuarb_set_used(pd_cpuarb_t *arb, uint32_t used);

/* Threads wanted now by the live daemons after this one (priority
 * greater than its own). Slots of dead processes are cleared, checked at
 * most once a second. One thread at a time per arb. */
uint32_t pd_cpuarb_want_after(pd_cpuarb_t *arb);

/* Up to max live slots of the table into out; their number. */
uint32_t pd_cpuarb_list(pd_cpuarb_t *arb, pd_cpuarb_entry_t *out, uint32_t max);

#endif
