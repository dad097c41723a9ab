/* pd_time.h - one unit of time everywhere: nanoseconds.
 * Durations and deadlines use CLOCK_MONOTONIC (pd_now_ns); wall time
 * (pd_wall_ns) is only for log lines and for values shown to humans. */
#ifndef PD_TIME_H
#define PD_TIME_H

#include <stdint.h>
#include <time.h>
#include <sys/time.h>

#define PD_NS_PER_US 1000ULL
#define PD_NS_PER_MS 1000000ULL
#define PD_NS_PER_S  1000000000ULL

static inline uint64_t pd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * PD_NS_PER_S + (uint64_t)ts.tv_nsec;
}

static inline uint64_t pd_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * PD_NS_PER_S + (uint64_t)ts.tv_nsec;
}

static inline struct timeval pd_ns_to_timeval(uint64_t ns)
{
    struct timeval tv = { (time_t)(ns / PD_NS_PER_S),
                          (suseconds_t)((ns % PD_NS_PER_S) / PD_NS_PER_US) };
    return tv;
}

#endif
