/* pd_cpuacct.h - a daemon's CPU use against its share of the host's cores
 * (issue 34): thread-seconds it borrowed (used above its share) and lent
 * (of its share, left idle and used by other processes on the host).
 *
 * Daemons on one host lend idle cores through the kernel's scheduler
 * (`nice`, or cgroup cpu weights): nothing here moves threads. This only
 * measures what the lending did, from two clocks every daemon can read:
 * its own CPU time (CLOCK_PROCESS_CPUTIME_ID) and the host's busy time
 * (/proc/stat). Over one interval dt, with share S cores of C:
 *
 *   borrowed = max(0, used - S*dt)
 *   idle     = max(0, S*dt - used)                  (own share unused)
 *   others   = max(0, host_busy - used - (C - S)*dt) (others above their part)
 *   lent     = min(idle, others)
 *
 * With two daemons whose shares sum to C this is exact; with more it is
 * what this daemon could have lent (an upper bound per daemon). The
 * accounting step is pure (tests feed it numbers); pd_cpuacct_sample()
 * reads the clocks. One owner thread; not thread-safe. */
#ifndef PD_CPUACCT_H
#define PD_CPUACCT_H

#include "pd_status.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    uint32_t share_milli;  /* this daemon's share, milli-cores */
    uint32_t host_milli;   /* the host's cores, milli-cores */
    /* last sample */
    bool have;
    uint64_t t_ns, own_ns, host_busy_ns;
    /* totals, ns of one core */
    uint64_t used_ns, borrowed_ns, lent_ns, idle_ns;
} pd_cpuacct_t;

void pd_cpuacct_init(pd_cpuacct_t *c, uint32_t share_milli, uint32_t host_milli);

/* Account one interval: dt_ns of wall time, own_ns of this process's CPU
 * and host_busy_ns of every CPU's busy time in it. Pure. */
void pd_cpuacct_account(pd_cpuacct_t *c, uint64_t dt_ns, uint64_t own_ns, uint64_t host_busy_ns);

/* Read the clocks at now_ns (CLOCK_MONOTONIC) and account the interval
 * since the last sample (the first sample only records). PD_ERR_IO if
 * /proc/stat cannot be read (then nothing is accounted). */
pd_status_t pd_cpuacct_sample(pd_cpuacct_t *c, uint64_t now_ns);

/* The host's busy CPU time so far, ns (sum over CPUs of /proc/stat user,
 * nice, system, irq, softirq, steal). */
pd_status_t pd_cpuacct_host_busy_ns(uint64_t *busy_ns);

#endif
