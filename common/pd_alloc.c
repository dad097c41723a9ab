/* pd_alloc.c - jemalloc statistics through mallctl (no-ops without it). */
#include "pd_alloc.h"
#include "pd_config.h"

#include <stddef.h>

#if PD_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

bool pd_alloc_have_jemalloc(void)
{
    return PD_HAVE_JEMALLOC != 0;
}

#if PD_HAVE_JEMALLOC
static int read_size(const char *name, uint64_t *out)
{
    size_t v = 0, sz = sizeof(v);
    if (mallctl(name, &v, &sz, NULL, 0) != 0)
        return -1;
    *out = v;
    return 0;
}
#endif

pd_status_t pd_alloc_stats(pd_alloc_stats_t *stats)
{
#if PD_HAVE_JEMALLOC
    /* jemalloc caches its stats; writing "epoch" refreshes them */
    uint64_t epoch = 1;
    size_t sz = sizeof(epoch);
    if (mallctl("epoch", &epoch, &sz, &epoch, sz) != 0)
        return PD_ERR_INTERNAL;
    if (read_size("stats.allocated", &stats->allocated) != 0 ||
        read_size("stats.active", &stats->active) != 0 ||
        read_size("stats.resident", &stats->resident) != 0 ||
        read_size("stats.mapped", &stats->mapped) != 0)
        return PD_ERR_INTERNAL;
    return PD_OK;
#else
    (void)stats;
    return PD_ERR_UNSUPPORTED;
#endif
}
