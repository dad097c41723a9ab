/* pd_cpuarb.c - see pd_cpuarb.h. */
#include "pd_cpuarb.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pd_time.h"

#define ARB_MAGIC 0x31425241435044ULL /* "DPCARB1" */
#define ARB_VERSION 1u

typedef struct {
    _Atomic int32_t pid;                /* 0: free */
    _Atomic uint32_t prio, want, used;
    _Atomic uint64_t start;             /* the process's start time (pid reuse) */
    char name[PD_CPUARB_NAME_MAX];
} __attribute__((aligned(64))) arb_slot_t;

typedef struct {
    uint64_t magic;
    uint32_t version, n_slots;
    arb_slot_t slot[PD_CPUARB_SLOTS];
} arb_table_t;

struct pd_cpuarb {
    int fd;
    arb_table_t *t;
    arb_slot_t *mine;
    uint32_t prio;
    uint64_t next_check_ns;
};

/* Field 22 of /proc/PID/stat (start time in clock ticks since boot); 0 if
 * the process is gone or unreadable. */
static uint64_t proc_start(int32_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* comm may hold spaces and ')' */
    if (p == NULL)
        return 0;
    unsigned long long v = 0;
    /* after ") ": state(3) ppid pgrp session tty tpgid flags minflt cminflt
     * majflt cmajflt utime stime cutime cstime priority nice threads
     * itrealvalue starttime(22) */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
                      "%*d %*d %llu", &v) != 1)
        return 0;
    return (uint64_t)v;
}

/* The slot's process is alive (and the same one that claimed it). */
static bool slot_alive(arb_slot_t *s)
{
    int32_t pid = atomic_load_explicit(&s->pid, memory_order_relaxed);
    if (pid <= 0)
        return false;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return false;
    uint64_t st = proc_start(pid);
    return st == 0 || st == atomic_load_explicit(&s->start, memory_order_relaxed);
}

pd_status_t pd_cpuarb_join(const char *path, const char *name, uint32_t prio,
                           pd_cpuarb_t **arb_p, char *why, size_t why_len)
{
    if (path == NULL)
        path = PD_CPUARB_DEFAULT;
    pd_cpuarb_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return PD_ERR_NO_MEMORY;
    pd_status_t st = PD_ERR_IO;
    a->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (a->fd < 0) {
        snprintf(why, why_len, "open %s: %s", path, strerror(errno));
        goto err_free;
    }
    if (flock(a->fd, LOCK_EX) != 0) {
        snprintf(why, why_len, "flock %s: %s", path, strerror(errno));
        goto err_close;
    }
    struct stat sb;
    if (fstat(a->fd, &sb) != 0 ||
        (sb.st_size != (off_t)sizeof(arb_table_t) &&
         ftruncate(a->fd, (off_t)sizeof(arb_table_t)) != 0)) {
        snprintf(why, why_len, "size %s: %s", path, strerror(errno));
        goto err_unlock;
    }
    a->t = mmap(NULL, sizeof(arb_table_t), PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
    if (a->t == MAP_FAILED) {
        a->t = NULL;
        snprintf(why, why_len, "mmap %s: %s", path, strerror(errno));
        goto err_unlock;
    }
    if (a->t->magic != ARB_MAGIC || a->t->version != ARB_VERSION ||
        a->t->n_slots != PD_CPUARB_SLOTS) {
        /* new, or another layout: start over (we hold the lock) */
        memset(a->t, 0, sizeof(*a->t));
        a->t->magic = ARB_MAGIC;
        a->t->version = ARB_VERSION;
        a->t->n_slots = PD_CPUARB_SLOTS;
    }
    for (uint32_t i = 0; i < PD_CPUARB_SLOTS && a->mine == NULL; i++) {
        arb_slot_t *s = &a->t->slot[i];
        if (atomic_load(&s->pid) == 0 || !slot_alive(s))
            a->mine = s;
    }
    if (a->mine == NULL) {
        snprintf(why, why_len, "%s: all %u slots held by live processes", path, PD_CPUARB_SLOTS);
        st = PD_ERR_NO_SPACE;
        goto err_unmap;
    }
    arb_slot_t *m = a->mine;
    atomic_store(&m->pid, 0);
    atomic_store(&m->want, 0);
    atomic_store(&m->used, 0);
    atomic_store(&m->prio, prio);
    atomic_store(&m->start, proc_start(getpid()));
    snprintf(m->name, sizeof(m->name), "%s", name ? name : "");
    atomic_store(&m->pid, (int32_t)getpid());
    a->prio = prio;
    flock(a->fd, LOCK_UN);
    *arb_p = a;
    return PD_OK;
err_unmap:
    munmap(a->t, sizeof(arb_table_t));
err_unlock:
    flock(a->fd, LOCK_UN);
err_close:
    close(a->fd);
err_free:
    free(a);
    return st;
}

void pd_cpuarb_leave(pd_cpuarb_t *a)
{
    if (a == NULL)
        return;
    atomic_store(&a->mine->want, 0);
    atomic_store(&a->mine->used, 0);
    atomic_store(&a->mine->pid, 0);
    munmap(a->t, sizeof(arb_table_t));
    close(a->fd);
    free(a);
}

void pd_cpuarb_set_want(pd_cpuarb_t *a, uint32_t want)
{
    atomic_store_explicit(&a->mine->want, want, memory_order_relaxed);
}

void pd_cpuarb_set_used(pd_cpuarb_t *a, uint32_t used)
{
    atomic_store_explicit(&a->mine->used, used, memory_order_relaxed);
}

uint32_t pd_cpuarb_want_after(pd_cpuarb_t *a)
{
    uint64_t now = pd_now_ns();
    bool check = now >= a->next_check_ns;
    if (check)
        a->next_check_ns = now + PD_NS_PER_S;
    uint32_t sum = 0;
    for (uint32_t i = 0; i < PD_CPUARB_SLOTS; i++) {
        arb_slot_t *s = &a->t->slot[i];
        if (s == a->mine || atomic_load_explicit(&s->pid, memory_order_relaxed) == 0)
            continue;
        if (atomic_load_explicit(&s->prio, memory_order_relaxed) <= a->prio)
            continue;
        uint32_t w = atomic_load_explicit(&s->want, memory_order_relaxed);
        if (w == 0)
            continue;
        if (check && !slot_alive(s)) {
            /* died wanting: clear it (a racing claimer stores pid last) */
            int32_t pid = atomic_load(&s->pid);
            atomic_store(&s->want, 0);
            atomic_compare_exchange_strong(&s->pid, &pid, 0);
            continue;
        }
        sum += w < PD_CPUARB_WANT_MAX ? w : PD_CPUARB_WANT_MAX;
    }
    return sum;
}

uint32_t pd_cpuarb_list(pd_cpuarb_t *a, pd_cpuarb_entry_t *out, uint32_t max)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < PD_CPUARB_SLOTS && n < max; i++) {
        arb_slot_t *s = &a->t->slot[i];
        int32_t pid = atomic_load(&s->pid);
        if (pid == 0 || !slot_alive(s))
            continue;
        out[n].pid = pid;
        out[n].prio = atomic_load(&s->prio);
        out[n].want = atomic_load(&s->want);
        out[n].used = atomic_load(&s->used);
        memcpy(out[n].name, s->name, sizeof(out[n].name));
        out[n].name[sizeof(out[n].name) - 1] = '\0';
        n++;
    }
    return n;
}
