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

/* KV-aware prefill: overlap against load, in tokens of work. */
static void test_prefill_kv(void **state)
{
    (void)state;
    rtr_backend_load_t b[3] = {
        { true, 0, 0, 0 }, { true, 0, 0, 0 }, { true, 0, 0, 0 },
    };
    uint32_t none[3] = { 0, 0, 0 }, rr = 2;
    /* no cache anywhere: least outstanding, round robin among equals */
    int seen[3] = { 0 };
    for (int i = 0; i < 6; i++)
        seen[rtr_pick_prefill_kv(b, none, 3, 1000, &rr)]++;
    assert_int_equal(seen[0], 2);
    assert_int_equal(seen[1], 2);
    assert_int_equal(seen[2], 2);
    /* the daemon holding 2400 of 2500 tokens wins while idle-ish ... */
    uint32_t c[3] = { 0, 2400, 320 };
    b[1].outstanding_prefill_tokens = 1500;
    assert_int_equal(rtr_pick_prefill_kv(b, c, 3, 2500, &rr), 1); /* 1600 < 2180 < 2500 */
    /* ... but not when its queue costs more than recomputing elsewhere */
    b[1].outstanding_prefill_tokens = 2300;
    assert_int_equal(rtr_pick_prefill_kv(b, c, 3, 2500, &rr), 2); /* 2180 < 2400 */
    /* ties on cost: the larger overlap */
    uint32_t t[3] = { 100, 300, 0 };
    b[0].outstanding_prefill_tokens = 200;
    b[1].outstanding_prefill_tokens = 400;
    b[2].outstanding_prefill_tokens = 1000;
    assert_int_equal(rtr_pick_prefill_kv(b, t, 3, 1000, &rr), 1); /* 1100 = 1100 */
    /* a whole-prompt hit still costs the last token; overlap beyond the
     * prompt (index over-report) is capped */
    rtr_backend_load_t one[2] = { { true, 0, 0, 0 }, { true, 0, 0, 0 } };
    uint32_t full[2] = { 64, 5000 };
    assert_int_equal(rtr_pick_prefill_kv(one, full, 2, 64, &rr), 1); /* 1 vs 1: overlap */
    one[1].outstanding_prefill_tokens = 1;
    assert_int_equal(rtr_pick_prefill_kv(one, full, 2, 64, &rr), 0); /* 1 < 2 */
    /* ineligible daemons are never picked, whatever they hold */
    one[0].eligible = false;
    assert_int_equal(rtr_pick_prefill_kv(one, full, 2, 64, &rr), 1);
    one[1].eligible = false;
    assert_int_equal(rtr_pick_prefill_kv(one, full, 2, 64, &rr), -1);
    assert_int_equal(rtr_pick_prefill_kv(one, full, 0, 64, &rr), -1);
    /* prompt 0 (never sent, but no underflow) */
    one[0].eligible = true;
    assert_int_equal(rtr_pick_prefill_kv(one, full, 2, 0, &rr), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_kv),
        cmocka_unit_test(test_prefill_least_tokens),
        cmocka_unit_test(test_prefill_round_robin_ties),
        cmocka_unit_test(test_decode_choice),
        cmocka_unit_test(test_decode_spreads_equal_load),
        cmocka_unit_test(test_disaggregation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
