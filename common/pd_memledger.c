/* pd_memledger.c - the host-wide memory budget for KV arenas (see
 * pd_memledger.h): MemAvailable and cgroup (v1, v2) room, the flock'd
 * ledger file, the budget check and its sentence. */
#include "pd_memledger.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pd_log.h"

#define LEDGER_FILE_MAX (PD_MEMLEDGER_MAX_ENTRIES * 128)
#define CG_UNLIMITED    (UINT64_C(1) << 60)   /* v1 writes ~2^63 for "no limit" */

void pd_mem_fmt(uint64_t bytes, char *buf, size_t len)
{
    if (bytes >= UINT64_C(1000000000))
        snprintf(buf, len, "%.1f GB", (double)bytes / 1e9);
    else if (bytes >= UINT64_C(1000000))
        snprintf(buf, len, "%.1f MB", (double)bytes / 1e6);
    else
        snprintf(buf, len, "%" PRIu64 " B", bytes);
}

/* ---- what the machine has ------------------------------------------------ */

/* One number from a one-line file; false if absent, "max" or not a number. */
static bool read_u64_file(const char *path, uint64_t *v_p)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return false;
    char line[64];
    bool ok = fgets(line, sizeof(line), f) != NULL;
    fclose(f);
    if (!ok || line[0] < '0' || line[0] > '9')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(line, &end, 10);
    if (errno != 0 || (*end != '\n' && *end != '\0'))
        return false;
    *v_p = v;
    return true;
}

/* The least limit - usage from dir up to root (dir is under root). */
static bool cg_walk(char *dir, size_t root_len, const char *limit_name, const char *usage_name,
                    uint64_t *room_p, uint64_t *limit_p)
{
    bool found = false;
    char path[4096];
    for (;;) {
        uint64_t lim, use;
        snprintf(path, sizeof(path), "%s/%s", dir, limit_name);
        if (read_u64_file(path, &lim) && lim < CG_UNLIMITED) {
            snprintf(path, sizeof(path), "%s/%s", dir, usage_name);
            if (!read_u64_file(path, &use))
                use = 0;
            uint64_t room = lim > use ? lim - use : 0;
            if (!found || room < *room_p) {
                *room_p = room;
                *limit_p = lim;
            }
            found = true;
        }
        if (strlen(dir) <= root_len)
            break;
        char *slash = strrchr(dir + root_len, '/');
        if (slash == NULL)
            break;
        *slash = '\0';
    }
    return found;
}

/* This process's directory of the hierarchy that holds v1_ctrl (cgroup
 * v1, e.g. "memory", "cpu") or of the unified one (v2), from the text of
 * /proc/<pid>/cgroup: dir (under cgroup_root), *root_len_p the length of
 * its root part, *v1_p which one. A hybrid host has both lines: the
 * controller is where v1 says. A path that is not there (a container
 * without a cgroup namespace) falls back to the mount's root. */
static pd_status_t cg_dir(const char *cgroup_file, const char *cgroup_root, const char *v1_ctrl,
                          const char *v1_mount, char *dir, size_t dir_cap, size_t *root_len_p,
                          bool *v1_p)
{
    FILE *f = fopen(cgroup_file, "re");
    if (f == NULL)
        return PD_ERR_NOT_FOUND;
    char line[1024], v1[1024] = "", v2[1024] = "";
    bool have_v1 = false, have_v2 = false;
    while (fgets(line, sizeof(line), f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        /* hierarchy-id ":" controllers ":" path */
        char *c1 = strchr(line, ':');
        char *c2 = c1 != NULL ? strchr(c1 + 1, ':') : NULL;
        if (c2 == NULL || c2[1] != '/')
            continue;
        *c1 = '\0';
        *c2 = '\0';
        const char *ctrls = c1 + 1, *path = c2 + 1;
        if (strcmp(line, "0") == 0 && ctrls[0] == '\0') {
            snprintf(v2, sizeof(v2), "%s", path);
            have_v2 = true;
            continue;
        }
        char list[1024];
        snprintf(list, sizeof(list), "%s", ctrls);
        char *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save))
            if (strcmp(t, v1_ctrl) == 0) {
                snprintf(v1, sizeof(v1), "%s", path);
                have_v1 = true;
            }
    }
    fclose(f);
    const char *rel = have_v1 ? v1 : v2;
    if (!have_v1 && !have_v2)
        return PD_ERR_NOT_FOUND;
    if (strstr(rel, "/..") != NULL)
        return PD_ERR_NOT_FOUND;
    char root[2048];
    snprintf(root, sizeof(root), "%s%s", cgroup_root, have_v1 ? v1_mount : "");
    *root_len_p = strlen(root);
    snprintf(dir, dir_cap, "%s%s", root, strcmp(rel, "/") == 0 ? "" : rel);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        snprintf(dir, dir_cap, "%s", root);
    *v1_p = have_v1;
    return PD_OK;
}

pd_status_t pd_mem_cgroup_room(const char *cgroup_file, const char *cgroup_root,
                               uint64_t *room_p, uint64_t *limit_p)
{
    char dir[4096];
    size_t rl;
    bool v1;
    pd_status_t st = cg_dir(cgroup_file, cgroup_root, "memory", "/memory", dir, sizeof(dir), &rl,
                            &v1);
    if (st != PD_OK)
        return st;
    uint64_t room = 0, limit = 0;
    bool found = v1 ? cg_walk(dir, rl, "memory.limit_in_bytes", "memory.usage_in_bytes",
                              &room, &limit)
                    : cg_walk(dir, rl, "memory.max", "memory.current", &room, &limit);
    if (!found)
        return PD_ERR_NOT_FOUND;
    *room_p = room;
    *limit_p = limit;
    return PD_OK;
}

pd_status_t pd_cpu_cgroup_quota(const char *cgroup_file, const char *cgroup_root,
                                double *cpus_p)
{
    char dir[4096], path[4200];
    size_t rl;
    bool v1;
    pd_status_t st = cg_dir(cgroup_file, cgroup_root, "cpu", "/cpu", dir, sizeof(dir), &rl, &v1);
    if (st != PD_OK)
        return st;
    bool found = false;
    double best = 0;
    for (;;) {
        unsigned long long quota = 0, period = 0;
        bool lim = false;
        if (v1) {
            uint64_t q, p;
            /* cfs_quota_us is -1 for none: read_u64_file refuses it */
            snprintf(path, sizeof(path), "%s/cpu.cfs_quota_us", dir);
            if (read_u64_file(path, &q)) {
                snprintf(path, sizeof(path), "%s/cpu.cfs_period_us", dir);
                if (read_u64_file(path, &p)) {
                    quota = q;
                    period = p;
                    lim = true;
                }
            }
        } else {
            /* cpu.max: "QUOTA PERIOD" or "max PERIOD" */
            snprintf(path, sizeof(path), "%s/cpu.max", dir);
            FILE *f = fopen(path, "re");
            if (f != NULL) {
                lim = fscanf(f, "%llu %llu", &quota, &period) == 2;
                fclose(f);
            }
        }
        if (lim && quota > 0 && period > 0) {
            double c = (double)quota / (double)period;
            if (!found || c < best)
                best = c;
            found = true;
        }
        if (strlen(dir) <= rl)
            break;
        char *slash = strrchr(dir + rl, '/');
        if (slash == NULL)
            break;
        *slash = '\0';
    }
    if (!found)
        return PD_ERR_NOT_FOUND;
    *cpus_p = best;
    return PD_OK;
}

uint32_t pd_cpu_budget(const char *proc_root, const char *cgroup_root)
{
    if (proc_root == NULL)
        proc_root = "/proc";
    if (cgroup_root == NULL)
        cgroup_root = "/sys/fs/cgroup";
    uint32_t n = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        n = (uint32_t)CPU_COUNT(&set);
    if (n == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (uint32_t)c : 1;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/self/cgroup", proc_root);
    double q;
    if (pd_cpu_cgroup_quota(path, cgroup_root, &q) == PD_OK) {
        /* a quota of 1.5 CPUs runs 2 threads at 75 %: round up, at least 1 */
        uint32_t qc = (uint32_t)ceil(q - 1e-9);
        if (qc < 1)
            qc = 1;
        if (qc < n)
            n = qc;
    }
    return n;
}

uint64_t pd_mem_available(const char *proc_root, const char *cgroup_root)
{
    if (proc_root == NULL)
        proc_root = "/proc";
    if (cgroup_root == NULL)
        cgroup_root = "/sys/fs/cgroup";
    uint64_t avail = UINT64_MAX;
    char path[4096];
    snprintf(path, sizeof(path), "%s/meminfo", proc_root);
    FILE *f = fopen(path, "re");
    if (f != NULL) {
        char line[128];
        unsigned long long kb;
        while (fgets(line, sizeof(line), f) != NULL)
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                avail = (uint64_t)kb * 1024;
                break;
            }
        fclose(f);
    }
    snprintf(path, sizeof(path), "%s/self/cgroup", proc_root);
    uint64_t room, limit;
    if (pd_mem_cgroup_room(path, cgroup_root, &room, &limit) == PD_OK && room < avail)
        avail = room;
    return avail;
}

/* ---- the ledger file ------------------------------------------------------- */

/* Field 22 of /proc/<pid>/stat (after the parenthesised command, which may
 * hold spaces and parentheses); 0 if unreadable. */
static uint64_t proc_start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return 0;
    p++;
    for (int field = 2; field < 21 && p != NULL; field++) /* ")" ends field 2 */
        p = strchr(p + 1, ' ');
    return p != NULL ? strtoull(p + 1, NULL, 10) : 0;
}

static bool entry_live(const pd_memledger_entry_t *e)
{
    if (e->pid <= 0)
        return false;
    if (kill(e->pid, 0) != 0 && errno == ESRCH)
        return false;
    uint64_t st = proc_start_time(e->pid);
    return e->start == 0 || st == 0 || st == e->start;   /* a reused pid starts later */
}

typedef struct {
    int fd;
    const char *path;
    pd_memledger_entry_t e[PD_MEMLEDGER_MAX_ENTRIES];
    unsigned n;
    bool dirty;
    char buf[LEDGER_FILE_MAX + 512];     /* the file's text, in and out */
} ledger_t;

static const char *ledger_path(const pd_memledger_opts_t *o)
{
    return o != NULL && o->path != NULL && o->path[0] != '\0' ? o->path : PD_MEMLEDGER_DEFAULT;
}

static void name_copy(char *dst, const char *src)
{
    size_t i = 0;
    for (; src != NULL && src[i] != '\0' && i < PD_MEMLEDGER_NAME_MAX - 1; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    dst[i] = '\0';
}

/* Open and lock the ledger, read its live entries (a line that does not
 * parse or whose process is gone is dropped and the file marked dirty). */
static pd_status_t ledger_open(const pd_memledger_opts_t *o, ledger_t *l)
{
    memset(l, 0, sizeof(*l));
    l->path = ledger_path(o);
    l->fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (l->fd < 0)
        return PD_ERR_IO;
    /* only our own regular file: another user's (in sticky /dev/shm) could
     * hold entries made up to refuse every daemon */
    struct stat sb;
    if (fstat(l->fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid()) {
        close(l->fd);
        errno = EPERM;
        return PD_ERR_IO;
    }
    int r;
    while ((r = flock(l->fd, LOCK_EX)) != 0 && errno == EINTR)
        ;
    if (r != 0) {
        close(l->fd);
        return PD_ERR_IO;
    }
    char *buf = l->buf;
    size_t len = 0;
    ssize_t k;
    while (len < LEDGER_FILE_MAX &&
           (k = pread(l->fd, buf + len, LEDGER_FILE_MAX - len, (off_t)len)) > 0)
        len += (size_t)k;
    buf[len] = '\0';
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        pd_memledger_entry_t e;
        memset(&e, 0, sizeof(e));
        int pid, committed, used = 0;
        unsigned long long start, bytes;
        if (l->n >= PD_MEMLEDGER_MAX_ENTRIES ||
            sscanf(line, "%d %llu %llu %d %n", &pid, &start, &bytes, &committed, &used) != 4 ||
            used == 0 || pid <= 0 || (committed != 0 && committed != 1) || line[used] == '\0') {
            pd_log(PD_LOG_DEBUG, "memledger", NULL, "%s: dropping a bad line", l->path);
            l->dirty = true;
            continue;
        }
        e.pid = pid;
        e.start = start;
        e.bytes = bytes;
        e.committed = committed == 1;
        name_copy(e.name, line + used);
        if (!entry_live(&e)) {
            pd_log(PD_LOG_DEBUG, "memledger", NULL, "%s: reclaiming %s (pid %d gone)", l->path,
                   e.name, pid);
            l->dirty = true;
            continue;
        }
        l->e[l->n++] = e;
    }
    return PD_OK;
}

/* Write the entries back if they changed (new text first, then the
 * length: a crash leaves old or new lines, never none), unlock, close. */
static pd_status_t ledger_close(ledger_t *l)
{
    pd_status_t st = PD_OK;
    if (l->dirty) {
        char *out = l->buf;
        size_t len = 0;
        for (unsigned i = 0; i < l->n; i++) {
            const pd_memledger_entry_t *e = &l->e[i];
            int w = snprintf(out + len, sizeof(l->buf) - len, "%d %" PRIu64 " %" PRIu64 " %d %s\n",
                             (int)e->pid, e->start, e->bytes, e->committed ? 1 : 0, e->name);
            if (w < 0 || (size_t)w >= sizeof(l->buf) - len)
                break;
            len += (size_t)w;
        }
        if (pwrite(l->fd, out, len, 0) != (ssize_t)len || ftruncate(l->fd, (off_t)len) != 0)
            st = PD_ERR_IO;
    }
    flock(l->fd, LOCK_UN);
    close(l->fd);
    l->fd = -1;
    return st;
}

static int ledger_find(const ledger_t *l, pid_t pid, const char *name)
{
    char nm[PD_MEMLEDGER_NAME_MAX];
    name_copy(nm, name);
    for (unsigned i = 0; i < l->n; i++)
        if (l->e[i].pid == pid && strcmp(l->e[i].name, nm) == 0)
            return (int)i;
    return -1;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a + b < a ? UINT64_MAX : a + b;
}

/* Do live (minus index skip) + add fit under the budget? The sentence
 * names every share when not. */
static pd_status_t budget_check(const pd_memledger_opts_t *o, const ledger_t *l, int skip,
                                const pd_memledger_entry_t *add, unsigned n_add, char *why,
                                size_t why_len)
{
    uint64_t avail = pd_mem_available(o->proc_root, o->cgroup_root);
    uint64_t committed = 0, total = 0;
    for (unsigned i = 0; i < l->n; i++) {
        if ((int)i == skip)
            continue;
        if (l->e[i].committed)
            committed = sat_add(committed, l->e[i].bytes);
        total = sat_add(total, l->e[i].bytes);
    }
    for (unsigned i = 0; i < n_add; i++)
        total = sat_add(total, add[i].bytes);
    uint64_t machine = UINT64_MAX;
    if (avail != UINT64_MAX) {
        uint64_t base = sat_add(avail, committed);
        machine = base - base / 10;   /* a tenth for models, engines and the rest */
    }
    uint64_t budget = o->budget != 0 && o->budget < machine ? o->budget : machine;
    if (total <= budget)
        return PD_OK;
    size_t off = 0;
    char num[32];
    why[0] = '\0';
#define WHY(...)                                                                     \
    do {                                                                             \
        if (off < why_len) {                                                         \
            int w_ = snprintf(why + off, why_len - off, __VA_ARGS__);                \
            off += w_ > 0 ? (size_t)w_ : 0;                                          \
        }                                                                            \
    } while (0)
    unsigned k = 0;
    for (unsigned i = 0; i < l->n; i++) {
        if ((int)i == skip)
            continue;
        pd_mem_fmt(l->e[i].bytes, num, sizeof(num));
        WHY("%s%s %s", k++ ? " + " : "", l->e[i].name, num);
    }
    for (unsigned i = 0; i < n_add; i++) {
        pd_mem_fmt(add[i].bytes, num, sizeof(num));
        WHY("%s%s %s", k++ ? " + " : "", add[i].name, num);
    }
    pd_mem_fmt(budget, num, sizeof(num));
    WHY(" > budget %s (", num);
    if (budget == o->budget) {
        WHY("mem.budget");
    } else {
        char a[32], c[32];
        pd_mem_fmt(avail, a, sizeof(a));
        pd_mem_fmt(committed, c, sizeof(c));
        WHY("90%% of %s available (MemAvailable / cgroup room) + %s already committed", a, c);
    }
    WHY("; ledger %s)", l->path);
#undef WHY
    if (off >= why_len && why_len > 4)
        memcpy(why + why_len - 4, "...", 4);
    return PD_ERR_NO_MEMORY;
}

pd_status_t pd_memledger_reserve(const pd_memledger_opts_t *o, const char *name, uint64_t bytes,
                                 char *why, size_t why_len)
{
    ledger_t *l = malloc(sizeof(*l));
    if (l == NULL)
        return PD_ERR_NO_MEMORY;
    pd_status_t st = ledger_open(o, l);
    if (st != PD_OK) {
        snprintf(why, why_len, "memory ledger %s: %s", ledger_path(o),
                 errno == EPERM ? "not a regular file of this user" : strerror(errno));
        free(l);
        return st;
    }
    pid_t self = getpid();
    pd_memledger_entry_t e = { .pid = self, .start = proc_start_time(self), .bytes = bytes };
    name_copy(e.name, name);
    int old = ledger_find(l, self, name);
    st = budget_check(o, l, old, &e, 1, why, why_len);
    if (st == PD_OK) {
        if (old >= 0)
            l->e[old] = e;
        else if (l->n < PD_MEMLEDGER_MAX_ENTRIES)
            l->e[l->n++] = e;
        else {
            snprintf(why, why_len, "memory ledger %s: full (%u entries)", l->path, l->n);
            st = PD_ERR_NO_SPACE;
        }
        l->dirty = true;
    }
    pd_status_t cst = ledger_close(l);
    if (st == PD_OK && cst != PD_OK) {
        snprintf(why, why_len, "memory ledger %s: cannot write: %s", ledger_path(o),
                 strerror(errno));
        st = cst;
    }
    free(l);
    return st;
}

pd_status_t pd_memledger_commit(const pd_memledger_opts_t *o, const char *name)
{
    ledger_t *l = malloc(sizeof(*l));
    if (l == NULL)
        return PD_ERR_NO_MEMORY;
    pd_status_t st = ledger_open(o, l);
    if (st == PD_OK) {
        int i = ledger_find(l, getpid(), name);
        if (i >= 0) {
            l->e[i].committed = true;
            l->dirty = true;
        } else {
            st = PD_ERR_NOT_FOUND;
        }
        pd_status_t cst = ledger_close(l);
        st = st == PD_OK ? cst : st;
    }
    free(l);
    return st;
}

void pd_memledger_release(const pd_memledger_opts_t *o, const char *name)
{
    if (name == NULL)
        return;
    ledger_t *l = malloc(sizeof(*l));
    if (l == NULL || ledger_open(o, l) != PD_OK) {
        free(l);
        return;
    }
    int i = ledger_find(l, getpid(), name);
    if (i >= 0) {
        l->e[i] = l->e[--l->n];
        l->dirty = true;
    }
    ledger_close(l);
    free(l);
}

pd_status_t pd_memledger_check_plan(const pd_memledger_opts_t *o,
                                    const pd_memledger_entry_t *plan, unsigned n_plan,
                                    char *why, size_t why_len)
{
    ledger_t *l = malloc(sizeof(*l));
    if (l == NULL)
        return PD_ERR_NO_MEMORY;
    pd_status_t st = ledger_open(o, l);
    if (st != PD_OK) {
        /* no ledger to read: the plan alone against the machine */
        memset(l, 0, sizeof(*l));
        l->path = ledger_path(o);
        st = budget_check(o, l, -1, plan, n_plan, why, why_len);
        free(l);
        return st;
    }
    st = budget_check(o, l, -1, plan, n_plan, why, why_len);
    ledger_close(l);
    free(l);
    return st;
}

int pd_memledger_list(const pd_memledger_opts_t *o, pd_memledger_entry_t *out, unsigned cap)
{
    ledger_t *l = malloc(sizeof(*l));
    if (l == NULL || ledger_open(o, l) != PD_OK) {
        free(l);
        return -1;
    }
    unsigned n = l->n < cap ? l->n : cap;
    memcpy(out, l->e, n * sizeof(*out));
    ledger_close(l);
    free(l);
    return (int)n;
}
