/* pd_cpuacct.c - see pd_cpuacct.h. */
#include "pd_cpuacct.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pd_time.h"

void pd_cpuacct_init(pd_cpuacct_t *c, uint32_t share_milli, uint32_t host_milli)
{
    memset(c, 0, sizeof(*c));
    c->share_milli = share_milli;
    c->host_milli = host_milli;
}

static uint64_t sub0(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

void pd_cpuacct_account(pd_cpuacct_t *c, uint64_t dt_ns, uint64_t own_ns, uint64_t host_busy_ns)
{
    /* share and the others' part of dt, ns of one core (dt <= 2^64/1e6:
     * over 5 hours per interval, far above any sampling period) */
    uint64_t share = dt_ns / 1000 * c->share_milli;
    uint64_t others_part = dt_ns / 1000 * sub0(c->host_milli, c->share_milli);
    uint64_t idle = sub0(share, own_ns);
    uint64_t others_above = sub0(sub0(host_busy_ns, own_ns), others_part);
    c->used_ns += own_ns;
    c->borrowed_ns += sub0(own_ns, share);
    c->idle_ns += idle;
    c->lent_ns += idle < others_above ? idle : others_above;
}

pd_status_t pd_cpuacct_host_busy_ns(uint64_t *busy_ns)
{
    FILE *f = fopen("/proc/stat", "re");
    if (f == NULL)
        return PD_ERR_IO;
    unsigned long long v[8] = { 0 };
    int got = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                     &v[3], &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (got < 4)
        return PD_ERR_IO;
    long hz = sysconf(_SC_CLK_TCK);
    if (hz <= 0)
        hz = 100;
    /* user nice system [idle iowait] irq softirq steal */
    unsigned long long ticks = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    *busy_ns = (uint64_t)ticks * (PD_NS_PER_S / (uint64_t)hz);
    return PD_OK;
}

pd_status_t pd_cpuacct_sample(pd_cpuacct_t *c, uint64_t now_ns)
{
    uint64_t busy;
    pd_status_t st = pd_cpuacct_host_busy_ns(&busy);
    if (st != PD_OK)
        return st;
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    uint64_t own = (uint64_t)ts.tv_sec * PD_NS_PER_S + (uint64_t)ts.tv_nsec;
    if (c->have && now_ns > c->t_ns)
        pd_cpuacct_account(c, now_ns - c->t_ns, sub0(own, c->own_ns), sub0(busy, c->host_busy_ns));
    c->have = true;
    c->t_ns = now_ns;
    c->own_ns = own;
    c->host_busy_ns = busy;
    return PD_OK;
}
