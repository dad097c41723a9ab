/* test_memledger.c - the host's memory ledger (common/pd_memledger.h): two
 * reservations that together exceed the budget (the second refused, the
 * sentence names both), a dead pid's and a reused pid's entries reclaimed,
 * the budget formula (committed arenas added back to MemAvailable,
 * uncommitted ones not) on fixture files, cgroup v1 / v2 / hybrid parsing
 * from fixture trees, a corrupt ledger, and pdctl's plan check.
 * serving-mem-budget (tests/serving) runs the real daemons. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pd_memledger.h"

static char dir[64];

static void put(const char *rel, const char *text)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    /* mkdir -p the parent */
    for (char *s = strchr(p + strlen(dir) + 1, '/'); s != NULL; s = strchr(s + 1, '/')) {
        *s = '\0';
        mkdir(p, 0755);
        *s = '/';
    }
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static const char *at(const char *rel)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof(p[k]), "%s/%s", dir, rel);
    return p[k];
}

static int setup(void **st)
{
    (void)st;
    snprintf(dir, sizeof(dir), "/tmp/pd-memledger-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The finding: each fits, both do not; the refusal names every share. */
static void test_two_exceed(void **st)
{
    (void)st;
    pd_memledger_opts_t o = { .path = at("ledger"), .budget = 100000000 };
    char why[1024] = "";
    assert_int_equal(pd_memledger_reserve(&o, "pd-decode d0", 60000000, why, sizeof(why)), PD_OK);
    assert_int_equal(pd_memledger_commit(&o, "pd-decode d0"), PD_OK);
    assert_int_equal(pd_memledger_reserve(&o, "pd-prefill p0", 60000000, why, sizeof(why)),
                     PD_ERR_NO_MEMORY);
    assert_non_null(strstr(why, "pd-decode d0 60.0 MB + pd-prefill p0 60.0 MB > budget 100.0 MB"));
    assert_non_null(strstr(why, "mem.budget"));
    pd_memledger_entry_t e[4];
    assert_int_equal(pd_memledger_list(&o, e, 4), 1);   /* the refused one left nothing */
    assert_string_equal(e[0].name, "pd-decode d0");
    assert_true(e[0].committed);
    /* the same name again replaces its own entry (a restart in-process) */
    assert_int_equal(pd_memledger_reserve(&o, "pd-decode d0", 90000000, why, sizeof(why)), PD_OK);
    assert_int_equal(pd_memledger_list(&o, e, 4), 1);
    assert_int_equal(e[0].bytes, 90000000);
    /* released: the other one fits */
    pd_memledger_release(&o, "pd-decode d0");
    assert_int_equal(pd_memledger_reserve(&o, "pd-prefill p0", 60000000, why, sizeof(why)), PD_OK);
    pd_memledger_release(&o, "pd-prefill p0");
    assert_int_equal(pd_memledger_list(&o, e, 4), 0);
}

/* A daemon that died without releasing (SIGKILL, OOM) and a pid reused by
 * another process: both entries dropped on the next pass. */
static void test_dead_reclaimed(void **st)
{
    (void)st;
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    assert_true(child > 0);
    int ws;
    assert_int_equal(waitpid(child, &ws, 0), child);
    char text[256];
    snprintf(text, sizeof(text),
             "%d 0 60000000 1 pd-prefill ghost\n"
             "%d 1 60000000 1 pd-decode reused\n",   /* our pid, an older start time */
             (int)child, (int)getpid());
    put("ledger2", text);
    pd_memledger_opts_t o = { .path = at("ledger2"), .budget = 100000000 };
    char why[1024] = "";
    assert_int_equal(pd_memledger_reserve(&o, "pd-decode d1", 60000000, why, sizeof(why)), PD_OK);
    pd_memledger_entry_t e[4];
    assert_int_equal(pd_memledger_list(&o, e, 4), 1);
    assert_string_equal(e[0].name, "pd-decode d1");
    assert_int_equal(e[0].pid, getpid());
    pd_memledger_release(&o, "pd-decode d1");
}

/* Lines that do not parse are dropped, not trusted. */
static void test_corrupt(void **st)
{
    (void)st;
    put("ledger3", "garbage\n1 2\n-5 0 10 1 x\n1 0 10 7 bad-flag\n\n\x01\x02\n1 0 10 1 \n");
    pd_memledger_opts_t o = { .path = at("ledger3"), .budget = 1000 };
    char why[256];
    assert_int_equal(pd_memledger_reserve(&o, "pd-x\nforged 1", 900, why, sizeof(why)), PD_OK);
    pd_memledger_entry_t e[4];
    assert_int_equal(pd_memledger_list(&o, e, 4), 1);
    assert_string_equal(e[0].name, "pd-x?forged 1");   /* no line forged through a name */
    pd_memledger_release(&o, "pd-x\nforged 1");
}

/* budget = 90% x (avail + committed): an arena committed is missing from
 * MemAvailable and added back; one reserved but untouched is still in it. */
static void test_budget_formula(void **st)
{
    (void)st;
    put("f1/proc/meminfo", "MemTotal: 4000000 kB\nMemAvailable: 1000000 kB\n");
    put("f1/proc/self/cgroup", "0::/\n");
    put("f1/cg/cgroup.controllers", "memory\n");  /* root: no memory.max */
    pd_memledger_opts_t o = { .path = at("ledger4"), .proc_root = at("f1/proc"),
                              .cgroup_root = at("f1/cg") };
    assert_int_equal(pd_mem_available(o.proc_root, o.cgroup_root), 1024000000ull);
    char why[1024] = "";
    assert_int_equal(pd_memledger_reserve(&o, "pd-prefill a", 600000000, why, sizeof(why)), PD_OK);
    /* a not yet touched: 600 + 400 > 90% of 1024 */
    assert_int_equal(pd_memledger_reserve(&o, "pd-decode b", 400000000, why, sizeof(why)),
                     PD_ERR_NO_MEMORY);
    assert_non_null(strstr(why, "pd-prefill a 600.0 MB + pd-decode b 400.0 MB > budget 921.6 MB"));
    assert_non_null(strstr(why, "90% of 1.0 GB available"));
    /* a touched (MemAvailable would show it gone: the fixture stands still,
     * which is the conservative side): budget 90% x (1024 + 600) */
    assert_int_equal(pd_memledger_commit(&o, "pd-prefill a"), PD_OK);
    assert_int_equal(pd_memledger_reserve(&o, "pd-decode b", 400000000, why, sizeof(why)), PD_OK);
    /* an explicit mem.budget caps it further */
    o.budget = 500000000;
    assert_int_equal(pd_memledger_reserve(&o, "pd-decode c", 1, why, sizeof(why)),
                     PD_ERR_NO_MEMORY);
    assert_non_null(strstr(why, "> budget 500.0 MB (mem.budget"));
    pd_memledger_release(&o, "pd-prefill a");
    pd_memledger_release(&o, "pd-decode b");
}

static void test_cgroup_v2(void **st)
{
    (void)st;
    put("v2/cgroup", "0::/a/b\n");
    put("v2/cg/a/memory.max", "1000\n");
    put("v2/cg/a/memory.current", "100\n");
    put("v2/cg/a/b/memory.max", "max\n");
    put("v2/cg/a/b/memory.current", "50\n");
    uint64_t room = 0, limit = 0;
    assert_int_equal(pd_mem_cgroup_room(at("v2/cgroup"), at("v2/cg"), &room, &limit), PD_OK);
    assert_int_equal(room, 900);
    assert_int_equal(limit, 1000);
    /* a tighter child wins */
    put("v2/cg/a/b/memory.max", "400\n");
    assert_int_equal(pd_mem_cgroup_room(at("v2/cgroup"), at("v2/cg"), &room, &limit), PD_OK);
    assert_int_equal(room, 350);
    /* no limit anywhere */
    put("v2/cgroup2", "0::/a/b\n");
    put("v2/cg2/a/b/memory.max", "max\n");
    assert_int_equal(pd_mem_cgroup_room(at("v2/cgroup2"), at("v2/cg2"), &room, &limit),
                     PD_ERR_NOT_FOUND);
    /* MemAvailable capped by the room */
    put("v2/proc/meminfo", "MemAvailable: 1000 kB\n");
    put("v2/proc/self/cgroup", "0::/a/b\n");
    char cg[512];
    snprintf(cg, sizeof(cg), "%s", at("v2/cg"));
    assert_int_equal(pd_mem_available(at("v2/proc"), cg), 350);
}

static void test_cgroup_v1(void **st)
{
    (void)st;
    /* hybrid: v1 memory controller plus the v2 line; v1 is where memory is */
    put("v1/cgroup", "12:cpu,cpuacct:/x\n11:blkio,memory:/kube/pod1\n0::/\n");
    put("v1/cg/memory/kube/pod1/memory.limit_in_bytes", "5000\n");
    put("v1/cg/memory/kube/pod1/memory.usage_in_bytes", "1000\n");
    put("v1/cg/memory/kube/memory.limit_in_bytes", "9223372036854771712\n"); /* v1 "none" */
    put("v1/cg/memory/kube/memory.usage_in_bytes", "7000\n");
    put("v1/cg/memory.max", "10\n");   /* v2 files are not read on a v1 memory host */
    uint64_t room = 0, limit = 0;
    assert_int_equal(pd_mem_cgroup_room(at("v1/cgroup"), at("v1/cg"), &room, &limit), PD_OK);
    assert_int_equal(room, 4000);
    assert_int_equal(limit, 5000);
    /* a path not under the mount (no cgroup namespace): the mount's root */
    put("v1/cgroup2", "11:memory:/not/here\n");
    put("v1/cg/memory/memory.limit_in_bytes", "3000\n");
    put("v1/cg/memory/memory.usage_in_bytes", "3500\n");   /* over: room 0 */
    assert_int_equal(pd_mem_cgroup_room(at("v1/cgroup2"), at("v1/cg"), &room, &limit), PD_OK);
    assert_int_equal(room, 0);
    /* no memory line at all, and a path that climbs out */
    put("v1/cgroup3", "12:cpu:/x\n");
    assert_int_equal(pd_mem_cgroup_room(at("v1/cgroup3"), at("v1/cg"), &room, &limit),
                     PD_ERR_NOT_FOUND);
    put("v1/cgroup4", "11:memory:/../../etc\n");
    assert_int_equal(pd_mem_cgroup_room(at("v1/cgroup4"), at("v1/cg"), &room, &limit),
                     PD_ERR_NOT_FOUND);
}

/* threads = 0 in a container: the cgroup CPU quota, not the node's cores */
static void test_cpu_quota(void **st)
{
    (void)st;
    double c = 0;
    /* v2: cpu.max "QUOTA PERIOD", the tightest level; "max" is none */
    put("c2/cgroup", "0::/kubepods/pod1/ctr\n");
    put("c2/cg/kubepods/cpu.max", "max 100000\n");
    put("c2/cg/kubepods/pod1/cpu.max", "150000 100000\n");
    put("c2/cg/kubepods/pod1/ctr/cpu.max", "max 100000\n");
    assert_int_equal(pd_cpu_cgroup_quota(at("c2/cgroup"), at("c2/cg"), &c), PD_OK);
    assert_true(c == 1.5);
    put("c2/cg/kubepods/pod1/ctr/cpu.max", "50000 100000\n");
    assert_int_equal(pd_cpu_cgroup_quota(at("c2/cgroup"), at("c2/cg"), &c), PD_OK);
    assert_true(c == 0.5);
    put("c2/cgroup2", "0::/free\n");
    put("c2/cg2/free/cpu.max", "max 100000\n");
    assert_int_equal(pd_cpu_cgroup_quota(at("c2/cgroup2"), at("c2/cg2"), &c), PD_ERR_NOT_FOUND);
    /* v1 (hybrid: the cpu controller is where v1 says): quota -1 is none */
    put("c1/cgroup", "12:cpu,cpuacct:/kube/pod2\n11:memory:/kube/pod2\n0::/\n");
    put("c1/cg/cpu/kube/cpu.cfs_quota_us", "-1\n");
    put("c1/cg/cpu/kube/cpu.cfs_period_us", "100000\n");
    put("c1/cg/cpu/kube/pod2/cpu.cfs_quota_us", "300000\n");
    put("c1/cg/cpu/kube/pod2/cpu.cfs_period_us", "100000\n");
    put("c1/cg/cpu.max", "10000 100000\n");  /* v2 files are not read on a v1 cpu host */
    assert_int_equal(pd_cpu_cgroup_quota(at("c1/cgroup"), at("c1/cg"), &c), PD_OK);
    assert_true(c == 3.0);
    /* the budget: the quota rounded up, capped by the affinity mask */
    put("c2/proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
    put("c2/cg/kubepods/pod1/ctr/cpu.max", "max 100000\n");   /* 1.5 CPUs: 2 threads */
    char cg[512];
    snprintf(cg, sizeof(cg), "%s", at("c2/cg"));
    cpu_set_t set;
    assert_int_equal(sched_getaffinity(0, sizeof(set), &set), 0);
    uint32_t cpus = (uint32_t)CPU_COUNT(&set);
    assert_int_equal(pd_cpu_budget(at("c2/proc"), cg), cpus < 2 ? cpus : 2);
    put("c2/cg/kubepods/pod1/ctr/cpu.max", "20000 100000\n"); /* 0.2 CPUs: still 1 thread */
    assert_int_equal(pd_cpu_budget(at("c2/proc"), cg), 1);
    put("c2/cg/kubepods/pod1/cpu.max", "max 100000\n");
    put("c2/cg/kubepods/pod1/ctr/cpu.max", "max 100000\n");   /* none: the affinity mask */
    assert_int_equal(pd_cpu_budget(at("c2/proc"), cg), cpus);
}

/* A ledger that is not our own regular file is refused (the caller falls
 * back to its process's check): a directory, and (as root) another
 * user's file. */
static void test_foreign_ledger(void **st)
{
    (void)st;
    char p[512];
    snprintf(p, sizeof(p), "%s", at("a-dir"));
    assert_int_equal(mkdir(p, 0755), 0);
    pd_memledger_opts_t o = { .path = p, .budget = 1000 };
    char why[256] = "";
    assert_int_equal(pd_memledger_reserve(&o, "pd-x y", 1, why, sizeof(why)), PD_ERR_IO);
    assert_non_null(strstr(why, "memory ledger"));
    if (geteuid() == 0) {
        put("foreign", "1 0 999999 1 pd-decode made-up\n");
        assert_int_equal(chown(at("foreign"), 12345, 12345), 0);
        o.path = at("foreign");
        assert_int_equal(pd_memledger_reserve(&o, "pd-x y", 1, why, sizeof(why)), PD_ERR_IO);
        assert_non_null(strstr(why, "not a regular file of this user"));
    }
}

/* pdctl's check: the plan's daemons beside what the ledger holds. */
static void test_plan(void **st)
{
    (void)st;
    pd_memledger_opts_t o = { .path = at("ledger5"), .budget = 100000000 };
    char why[1024] = "";
    assert_int_equal(pd_memledger_reserve(&o, "pd-decode other", 30000000, why, sizeof(why)),
                     PD_OK);
    pd_memledger_entry_t plan[2] = { { .bytes = 40000000 }, { .bytes = 40000000 } };
    snprintf(plan[0].name, sizeof(plan[0].name), "pd-prefill prefill-0");
    snprintf(plan[1].name, sizeof(plan[1].name), "pd-decode decode-0");
    assert_int_equal(pd_memledger_check_plan(&o, plan, 2, why, sizeof(why)), PD_ERR_NO_MEMORY);
    assert_non_null(strstr(why, "pd-decode other 30.0 MB + pd-prefill prefill-0 40.0 MB + "
                                "pd-decode decode-0 40.0 MB > budget 100.0 MB"));
    pd_memledger_release(&o, "pd-decode other");
    assert_int_equal(pd_memledger_check_plan(&o, plan, 2, why, sizeof(why)), PD_OK);
    pd_memledger_entry_t e[2];
    assert_int_equal(pd_memledger_list(&o, e, 2), 0);   /* a check writes nothing */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_exceed),
        cmocka_unit_test(test_dead_reclaimed),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_budget_formula),
        cmocka_unit_test(test_cgroup_v2),
        cmocka_unit_test(test_cgroup_v1),
        cmocka_unit_test(test_cpu_quota),
        cmocka_unit_test(test_foreign_ledger),
        cmocka_unit_test(test_plan),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
