/* test_cpuarb.c - the host's core arbiter table (common/pd_cpuarb.h): what
 * a daemon reads is the want of the daemons after it (priority greater),
 * never its own or those before it; a process that died wanting is
 * cleared; a table of another layout is started over; every slot held
 * refuses the next with NO_SPACE. tests/pdctl pdctl-lending runs real
 * daemons through it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pd_cpuarb.h"

static char path[64];

static int setup(void **state)
{
    (void)state;
    snprintf(path, sizeof(path), "/tmp/pd-test-cpuarb-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    return 0;
}

static pd_cpuarb_t *join(const char *name, uint32_t prio)
{
    pd_cpuarb_t *a = NULL;
    char why[256] = "";
    pd_status_t st = pd_cpuarb_join(path, name, prio, &a, why, sizeof(why));
    if (st != PD_OK)
        fprintf(stderr, "join %s: %s\n", name, why);
    assert_int_equal(st, PD_OK);
    return a;
}

static void test_want_after(void **state)
{
    (void)state;
    pd_cpuarb_t *dec = join("pd-decode d0", 0), *pf = join("pd-prefill p0", 1),
                *pf2 = join("pd-prefill p1", 1);
    assert_int_equal(pd_cpuarb_want_after(dec), 0);
    pd_cpuarb_set_want(pf, 2);
    pd_cpuarb_set_want(dec, 2);            /* its own: never counted */
    assert_int_equal(pd_cpuarb_want_after(dec), 2);
    pd_cpuarb_set_want(pf2, 3);
    assert_int_equal(pd_cpuarb_want_after(dec), 5);
    assert_int_equal(pd_cpuarb_want_after(pf), 0); /* the decode is before it, pf2 level */
    pd_cpuarb_set_want(pf, 0);
    assert_int_equal(pd_cpuarb_want_after(dec), 3);
    pd_cpuarb_entry_t e[8];
    pd_cpuarb_set_used(dec, 1);
    uint32_t n = pd_cpuarb_list(dec, e, 8);
    assert_int_equal(n, 3);
    bool seen = false;
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(e[i].name, "pd-decode d0") == 0) {
            seen = true;
            assert_int_equal(e[i].used, 1);
            assert_int_equal(e[i].want, 2);
            assert_int_equal(e[i].pid, getpid());
        }
    assert_true(seen);
    pd_cpuarb_leave(pf2);                  /* leaving takes its want along */
    assert_int_equal(pd_cpuarb_want_after(dec), 0);
    pd_cpuarb_leave(pf);
    pd_cpuarb_leave(dec);
}

/* a prefill that dies wanting cores: the decode stops parking for it (the
 * liveness check runs on the first read and then once a second) */
static void test_dead_cleared(void **state)
{
    (void)state;
    pd_cpuarb_t *dec = join("pd-decode d0", 0); /* first: the child takes another slot */
    pid_t pid = fork();
    if (pid == 0) {
        pd_cpuarb_t *a = NULL;
        char why[64];
        if (pd_cpuarb_join(path, "pd-prefill gone", 1, &a, why, sizeof(why)) != PD_OK)
            _exit(1);
        pd_cpuarb_set_want(a, 4);
        _exit(0); /* no leave */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(pd_cpuarb_want_after(dec), 0);
    pd_cpuarb_entry_t e[4];
    assert_int_equal(pd_cpuarb_list(dec, e, 4), 1);
    pd_cpuarb_leave(dec);
}

/* another layout (or garbage) in the file: started over, not trusted */
static void test_garbage_restarted(void **state)
{
    (void)state;
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 70000; i++)
        fputc(0xA5, f);
    fclose(f);
    pd_cpuarb_t *dec = join("pd-decode d0", 0);
    assert_int_equal(pd_cpuarb_want_after(dec), 0);
    pd_cpuarb_entry_t e[4];
    assert_int_equal(pd_cpuarb_list(dec, e, 4), 1);
    pd_cpuarb_leave(dec);
}

static void test_full(void **state)
{
    (void)state;
    pd_cpuarb_t *a[PD_CPUARB_SLOTS];
    for (uint32_t i = 0; i < PD_CPUARB_SLOTS; i++)
        a[i] = join("pd-prefill x", 1);
    pd_cpuarb_t *b = NULL;
    char why[256] = "";
    assert_int_equal(pd_cpuarb_join(path, "one more", 1, &b, why, sizeof(why)), PD_ERR_NO_SPACE);
    assert_non_null(strstr(why, "slots"));
    for (uint32_t i = 0; i < PD_CPUARB_SLOTS; i++)
        pd_cpuarb_leave(a[i]);
    b = join("now room", 1);
    pd_cpuarb_leave(b);
    assert_int_equal(pd_cpuarb_join("/nonexistent-dir/x.arb", "x", 0, &b, why, sizeof(why)),
                     PD_ERR_IO);
    assert_non_null(strstr(why, "/nonexistent-dir/x.arb"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_want_after),
        cmocka_unit_test(test_dead_cleared),
        cmocka_unit_test(test_garbage_restarted),
        cmocka_unit_test(test_full),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
