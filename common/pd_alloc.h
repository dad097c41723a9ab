/* pd_alloc.h - allocator introspection. Daemons link jemalloc (see the root
 * meson.build); sanitizer builds do not, and then these report
 * PD_ERR_UNSUPPORTED. Only common/ talks to mallctl. */
#ifndef PD_ALLOC_H
#define PD_ALLOC_H

#include "pd_status.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    uint64_t allocated;   /* bytes allocated by the application */
    uint64_t active;      /* bytes in active pages */
    uint64_t resident;    /* bytes in physically resident pages */
    uint64_t mapped;      /* bytes in active extents mapped */
} pd_alloc_stats_t;

/* True when built with jemalloc (PD_HAVE_JEMALLOC). */
bool pd_alloc_have_jemalloc(void);

/* Refresh jemalloc's cached stats (bumps "epoch") and read them.
 * PD_ERR_UNSUPPORTED without jemalloc, PD_ERR_INTERNAL if mallctl fails. */
pd_status_t pd_alloc_stats(pd_alloc_stats_t *stats);

#endif
