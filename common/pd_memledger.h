/* pd_memledger.h - the host-wide memory budget for KV arenas.
 *
 * Every daemon of one host reserves its arena in a shared ledger before it
 * commits (maps and touches) it, so two daemons that each fit but not
 * together cannot both start and drive the host into the OOM killer. The
 * ledger is a small text file (default /dev/shm/pdserve-mem.ledger), one
 * line per reservation "<pid> <starttime> <bytes> <committed> <name>",
 * read and rewritten under flock(LOCK_EX). Entries whose process is gone
 * (pid dead, or reused: /proc/<pid>/stat start time differs) are dropped
 * on every pass.
 *
 * The budget, recomputed at each reservation:
 *
 *     budget = 90% x (avail + committed)
 *
 * avail: MemAvailable, capped by the cgroup room (limit - usage, the
 * tightest level of this process's hierarchy; cgroup v1 memory controller
 * or v2); committed: the bytes of the live entries that have finished
 * touching their arena. Those are already missing from avail, so they are
 * added back; an entry reserved but not yet committed is still in avail and
 * is not (adding it would count it twice). Every live entry plus the new
 * one must fit under the budget. An explicit budget (mem.budget) caps it
 * further. A refusal names every share:
 *     "pd-decode d0 18.4 GB + pd-prefill p0 18.4 GB > budget 20.7 GB (...)".
 *
 * The ledger must be a regular file owned by the caller's user (created
 * 0644): daemons of one user share a budget; a file of another user (in
 * the sticky /dev/shm it could hold made-up entries) is refused
 * (PD_ERR_IO), and the caller falls back to its own process's check.
 *
 * Blocking file I/O: call at boot / exit, never on the loop. No logging
 * above DEBUG (the caller prints the sentence). */
#ifndef PD_MEMLEDGER_H
#define PD_MEMLEDGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "pd_status.h"

#define PD_MEMLEDGER_NAME_MAX    64     /* bytes of a name, with the NUL */
#define PD_MEMLEDGER_MAX_ENTRIES 256    /* lines read; more is a corrupt file */
#define PD_MEMLEDGER_DEFAULT     "/dev/shm/pdserve-mem.ledger"

typedef struct {
    pid_t pid;
    uint64_t start;                     /* /proc/<pid>/stat field 22 (0 = unknown) */
    uint64_t bytes;
    bool committed;                     /* the arena is touched: counted in avail no more */
    char name[PD_MEMLEDGER_NAME_MAX];   /* "pd-decode d0": printable, no newline */
} pd_memledger_entry_t;

typedef struct {
    const char *path;           /* ledger file; NULL = PD_MEMLEDGER_DEFAULT */
    uint64_t budget;            /* explicit cap in bytes (0 = none) */
    const char *proc_root;      /* meminfo and self/cgroup; NULL = "/proc" (tests: fixtures) */
    const char *cgroup_root;    /* NULL = "/sys/fs/cgroup" */
} pd_memledger_opts_t;

/* Memory the process can still get: MemAvailable (<proc_root>/meminfo)
 * capped by the cgroup room. UINT64_MAX if nothing can be read. */
uint64_t pd_mem_available(const char *proc_root, const char *cgroup_root);

/* The cgroup room of the process whose /proc/<pid>/cgroup text is at
 * cgroup_file: for cgroup v1 (a line "N:...memory...:/path"; files
 * memory.limit_in_bytes / memory.usage_in_bytes under <root>/memory) or v2
 * ("0::/path"; memory.max / memory.current under <root>), the least of
 * limit - usage over the path and its ancestors (a path absent under root,
 * as in a container without a cgroup namespace, falls back to root).
 * PD_OK with *room_p and *limit_p, PD_ERR_NOT_FOUND if no level has a limit. */
pd_status_t pd_mem_cgroup_room(const char *cgroup_file, const char *cgroup_root,
                               uint64_t *room_p, uint64_t *limit_p);

/* CPUs: the CPU quota of the cgroup hierarchy (v2 cpu.max "QUOTA PERIOD",
 * v1 cpu.cfs_quota_us / cpu.cfs_period_us; the tightest level) in CPUs,
 * PD_ERR_NOT_FOUND when none is set. */
pd_status_t pd_cpu_cgroup_quota(const char *cgroup_file, const char *cgroup_root,
                                double *cpus_p);
/* How many threads this process can run at once: the CPUs of its affinity
 * mask, capped by the cgroup quota rounded up (a Kubernetes pod's CPU
 * limit), at least 1. NULL roots: /proc, /sys/fs/cgroup. What `threads = 0`
 * means. */
uint32_t pd_cpu_budget(const char *proc_root, const char *cgroup_root);

/* Reserve bytes under name for this process (replacing an entry of the
 * same pid and name). PD_OK; PD_ERR_NO_MEMORY (over budget: why names
 * every share and the budget); PD_ERR_IO (the ledger cannot be opened or
 * locked: why says so). */
pd_status_t pd_memledger_reserve(const pd_memledger_opts_t *o, const char *name, uint64_t bytes,
                                 char *why, size_t why_len);

/* Mark this process's entry name committed (its arena is touched). PD_OK,
 * PD_ERR_NOT_FOUND, PD_ERR_IO. */
pd_status_t pd_memledger_commit(const pd_memledger_opts_t *o, const char *name);

/* Drop this process's entry name. NULL-safe on name; missing is fine. */
void pd_memledger_release(const pd_memledger_opts_t *o, const char *name);

/* Would the plan's entries (not yet running: pid 0) fit beside the live
 * ledger entries? Nothing is written. PD_OK, or PD_ERR_NO_MEMORY with the
 * same sentence as a refused reservation. */
pd_status_t pd_memledger_check_plan(const pd_memledger_opts_t *o,
                                    const pd_memledger_entry_t *plan, unsigned n_plan,
                                    char *why, size_t why_len);

/* The live entries (dead ones dropped, the file rewritten). Count, or -1. */
int pd_memledger_list(const pd_memledger_opts_t *o, pd_memledger_entry_t *out, unsigned cap);

/* "18.4 GB", "40.0 MB", "512 B" (decimal units). */
void pd_mem_fmt(uint64_t bytes, char *buf, size_t len);

#endif
