/* test_cpuacct.c - CPU use against a share (common/pd_cpuacct.h): the
 * accounting on fed numbers (borrowed, idle, lent as the min of own idle
 * and the others' use above their part), and one real sample of this
 * process spinning. tests/ops/test_lending.sh runs real daemons. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>

#include "pd_cpuacct.h"
#include "pd_time.h"

#define S PD_NS_PER_S
#define MS PD_NS_PER_MS

/* share 1 of 2 cores: using 1.8 core-seconds in 1 s borrows 0.8 */
static void test_borrow(void **state)
{
    (void)state;
    pd_cpuacct_t c;
    pd_cpuacct_init(&c, 1000, 2000);
    pd_cpuacct_account(&c, S, 1800 * MS, 1900 * MS);
    assert_int_equal(c.used_ns, 1800 * MS);
    assert_int_equal(c.borrowed_ns, 800 * MS);
    assert_int_equal(c.idle_ns, 0);
    assert_int_equal(c.lent_ns, 0);
}

/* using 0.2 of its 1 core while the others use 1.7 (0.7 above their 1):
 * 0.8 idle, 0.7 of it lent; when the others stay within theirs, none */
static void test_lend(void **state)
{
    (void)state;
    pd_cpuacct_t c;
    pd_cpuacct_init(&c, 1000, 2000);
    pd_cpuacct_account(&c, S, 200 * MS, 1900 * MS);
    assert_int_equal(c.borrowed_ns, 0);
    assert_int_equal(c.idle_ns, 800 * MS);
    assert_int_equal(c.lent_ns, 700 * MS);
    pd_cpuacct_account(&c, S, 200 * MS, 500 * MS);
    assert_int_equal(c.idle_ns, 1600 * MS);
    assert_int_equal(c.lent_ns, 700 * MS);
    /* lent never exceeds idle: the others far above theirs */
    pd_cpuacct_account(&c, S, 900 * MS, 2000 * MS);
    assert_int_equal(c.lent_ns, 800 * MS);
    assert_int_equal(c.used_ns, 1300 * MS);
}

/* a share of the whole host: nothing to borrow, and a host clock that
 * moved less than our own (tick granularity) lends nothing */
static void test_edges(void **state)
{
    (void)state;
    pd_cpuacct_t c;
    pd_cpuacct_init(&c, 2000, 2000);
    pd_cpuacct_account(&c, S, 1500 * MS, 1400 * MS);
    assert_int_equal(c.borrowed_ns, 0);
    assert_int_equal(c.idle_ns, 500 * MS);
    assert_int_equal(c.lent_ns, 0);
    pd_cpuacct_init(&c, 0, 2000); /* no share: everything used is borrowed */
    pd_cpuacct_account(&c, S, 300 * MS, 300 * MS);
    assert_int_equal(c.borrowed_ns, 300 * MS);
    assert_int_equal(c.idle_ns, 0);
}

static atomic_bool stop;

static void *spin(void *arg)
{
    (void)arg;
    volatile uint64_t x = 0;
    while (!atomic_load(&stop))
        x++;
    return NULL;
}

/* the real clocks: a spinning thread's CPU time shows up as used, and
 * with a zero share all of it is borrowed */
static void test_sample(void **state)
{
    (void)state;
    pd_cpuacct_t c;
    pd_cpuacct_init(&c, 0, 2000);
    uint64_t busy0, busy1;
    assert_int_equal(pd_cpuacct_host_busy_ns(&busy0), PD_OK);
    assert_int_equal(pd_cpuacct_sample(&c, pd_now_ns()), PD_OK);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, spin, NULL), 0);
    uint64_t t0 = pd_now_ns();
    while (pd_now_ns() - t0 < 300 * MS)
        ;
    atomic_store(&stop, true);
    pthread_join(t, NULL);
    assert_int_equal(pd_cpuacct_sample(&c, pd_now_ns()), PD_OK);
    assert_int_equal(pd_cpuacct_host_busy_ns(&busy1), PD_OK);
    assert_true(busy1 >= busy0);
    assert_true(c.used_ns >= 100 * MS); /* two spinning threads for 0.3 s */
    assert_int_equal(c.borrowed_ns, c.used_ns);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_borrow),
        cmocka_unit_test(test_lend),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_sample),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
