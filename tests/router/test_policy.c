/* Unit tests: the router's pure choice functions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "rtr_policy.h"

static void test_prefill_least_tokens(void **state)
{
    rtr_backend_load_t b[3] = {
        { true, 500, 0, 0 }, { true, 100, 0, 0 }, { true, 300, 0, 0 },
    };
    uint32_t rr = 0;
    assert_int_equal(rtr_pick_prefill(b, 3, &rr), 1);
    b[1].eligible = false;
    assert_int_equal(rtr_pick_prefill(b, 3, &rr), 2);
    b[0].eligible = b[2].eligible = false;
    assert_int_equal(rtr_pick_prefill(b, 3, &rr), -1);
    assert_int_equal(rtr_pick_prefill(b, 0, &rr), -1);
}

static void test_prefill_round_robin_ties(void **state)
{
    rtr_backend_load_t b[3] = { { true, 0, 0, 0 }, { true, 0, 0, 0 }, { true, 0, 0, 0 } };
    uint32_t rr = 2;
    int seen[3] = { 0 };
    for (int i = 0; i < 9; i++)
        seen[rtr_pick_prefill(b, 3, &rr)]++;
    assert_int_equal(seen[0], 3);
    assert_int_equal(seen[1], 3);
    assert_int_equal(seen[2], 3);
}

static void test_decode_choice(void **state)
{
    rtr_backend_load_t b[3] = {
        { true, 0, 10, 1 }, { true, 0, 50, 9 }, { true, 0, 50, 2 },
    };
    uint32_t rr = 0;
    /* most free blocks, then fewest running sequences */
    assert_int_equal(rtr_pick_decode(b, 3, 4, &rr), 2);
    /* a daemon that cannot fit the request loses to one that can */
    b[0].free_blocks = 60;
    assert_int_equal(rtr_pick_decode(b, 3, 4, &rr), 0);
    assert_int_equal(rtr_pick_decode(b, 3, 55, &rr), 0);
    /* none fits: still the one with the most room (it queues) */
    assert_int_equal(rtr_pick_decode(b, 3, 100, &rr), 0);
    b[0].eligible = false;
    assert_int_equal(rtr_pick_decode(b, 3, 100, &rr), 2);
    b[1].eligible = b[2].eligible = false;
    assert_int_equal(rtr_pick_decode(b, 3, 1, &rr), -1);
}

static void test_decode_spreads_equal_load(void **state)
{
    rtr_backend_load_t b[3] = { { true, 0, 8, 0 }, { true, 0, 8, 0 }, { true, 0, 8, 0 } };
    uint32_t rr = 0;
    int seen[3] = { 0 };
    for (int i = 0; i < 30; i++)
        seen[rtr_pick_decode(b, 3, 1, &rr)]++;
    assert_int_equal(seen[0], 10);
    assert_int_equal(seen[1], 10);
    assert_int_equal(seen[2], 10);
}

static void test_disaggregation(void **state)
{
    assert_true(rtr_should_disaggregate(RTR_DISAGG_THRESHOLD, 64, 64, true));
    assert_false(rtr_should_disaggregate(RTR_DISAGG_THRESHOLD, 63, 64, true));
    assert_false(rtr_should_disaggregate(RTR_DISAGG_THRESHOLD, 1000, 64, false));
    assert_true(rtr_should_disaggregate(RTR_DISAGG_ALWAYS, 1, 64, true));
    assert_false(rtr_should_disaggregate(RTR_DISAGG_ALWAYS, 1, 64, false));
    assert_false(rtr_should_disaggregate(RTR_DISAGG_NEVER, 1000, 64, true));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_least_tokens),
        cmocka_unit_test(test_prefill_round_robin_ties),
        cmocka_unit_test(test_decode_choice),
        cmocka_unit_test(test_decode_spreads_equal_load),
        cmocka_unit_test(test_disaggregation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
