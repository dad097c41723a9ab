/* test_kvx_handle - the handle codec on its own (no UCX): round trips,
 * size bound, every rejection reason of decode and check. */
#include "kvx_handle.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sodium.h>
#include <string.h>

static const uint8_t key[KVX_KEY_BYTES] = "unit-test-key-0123456789abcdefgh";

static kvx_handle_t base_handle(void)
{
    kvx_handle_t h;
    memset(&h, 0, sizeof(h));
    h.exporter_id = 11;
    h.incarnation = 0x1234;
    h.importer_id = 22;
    h.lease_gen = 7;
    h.expiry_wall_ns = 5000;
    h.compat_hash = 0xabc;
    h.region_id = 1;
    h.lease_slot = 3;
    h.block_bytes = 2u << 20;
    h.n_runs = 2;
    h.runs[0] = (kvx_run_t){ 100, 4 };
    h.runs[1] = (kvx_run_t){ 7, 1 };
    return h;
}

static kvx_handle_expect_t base_expect(void)
{
    static uint64_t released[16];
    memset(released, 0, sizeof(released));
    kvx_handle_expect_t e = {
        .exporter_id = 11, .incarnation = 0x1234, .importer_id = 22,
        .region_id = 1, .region_blocks = 2048, .block_bytes = 2u << 20,
        .compat_hash = 0xabc, .n_lease_slots = 16, .released_gen = released,
        .now_wall_ns = 1000,
    };
    return e;
}

static void test_roundtrip(void **state)
{
    kvx_handle_t h = base_handle(), d;
    uint8_t buf[KVX_HANDLE_MAX_BYTES];
    size_t len;
    kvx_reject_t r;
    assert_int_equal(kvx_handle_encode(&h, key, buf, sizeof(buf), &len), PD_OK);
    assert_int_equal(kvx_handle_decode(buf, len, key, &d, &r), PD_OK);
    assert_int_equal(r, KVX_REJECT_NONE);
    assert_int_equal(d.n_runs, 2);
    assert_int_equal(d.n_blocks, 5);
    assert_int_equal(d.runs[0].start, 100);
    assert_int_equal(d.runs[1].start, 7); /* backwards delta kept */
    assert_int_equal(d.lease_gen, 7);
    kvx_handle_expect_t e = base_expect();
    assert_int_equal(kvx_handle_check(&d, &e, &r), PD_OK);
}

/* 64 scattered runs in a Llama-3-8B arena (2 MiB blocks, 2048 of them,
 * gaps < 64 blocks): the handle stays within 256 bytes. */
static void test_size_bound(void **state)
{
    kvx_handle_t h = base_handle(), d;
    uint8_t buf[KVX_HANDLE_MAX_BYTES];
    size_t len;
    h.n_runs = 64;
    uint32_t b = 0;
    for (int i = 0; i < 64; i++) {
        b += 1 + (uint32_t)randombytes_uniform(62);
        h.runs[i] = (kvx_run_t){ b, 1 + randombytes_uniform(100) };
        b += h.runs[i].count;
    }
    assert_int_equal(kvx_handle_encode(&h, key, buf, sizeof(buf), &len), PD_OK);
    assert_true(len <= 256);
    assert_int_equal(kvx_handle_decode(buf, len, key, &d, NULL), PD_OK);
    assert_memory_equal(d.runs, h.runs, sizeof(h.runs[0]) * 64);
    h.n_runs = 65;
    assert_int_equal(kvx_handle_encode(&h, key, buf, sizeof(buf), &len), PD_ERR_TOO_BIG);
}

/* kvx_handle_runs_fitting: the prefix it names encodes within 256 bytes and
 * one more run would not (or the 64-run cap is reached). */
static void test_runs_fitting(void **state)
{
    kvx_handle_t h = base_handle();
    kvx_run_t runs[200];
    uint8_t buf[KVX_HANDLE_MAX_BYTES];
    size_t len;
    for (int i = 0; i < 200; i++)
        runs[i] = (kvx_run_t){ (uint32_t)((i * 7919) % 100000), 1 };
    unsigned fit = kvx_handle_runs_fitting(runs, 200);
    assert_true(fit >= 1 && fit <= KVX_HANDLE_MAX_RUNS);
    h.n_runs = (uint16_t)fit;
    memcpy(h.runs, runs, sizeof(runs[0]) * fit);
    assert_int_equal(kvx_handle_encode(&h, key, buf, sizeof(buf), &len), PD_OK);
    assert_true(len <= KVX_HANDLE_MAX_BYTES);
    if (fit < KVX_HANDLE_MAX_RUNS) {
        h.n_runs = (uint16_t)(fit + 1);
        memcpy(h.runs, runs, sizeof(runs[0]) * (fit + 1));
        assert_int_equal(kvx_handle_encode(&h, key, buf, sizeof(buf), &len), PD_ERR_TOO_BIG);
    }
    /* adjacent-ish runs: the 64-run cap binds first */
    for (int i = 0; i < 200; i++)
        runs[i] = (kvx_run_t){ (uint32_t)(i * 2), 1 };
    assert_int_equal(kvx_handle_runs_fitting(runs, 200), KVX_HANDLE_MAX_RUNS);
    assert_int_equal(kvx_handle_runs_fitting(runs, 3), 3);
}

static void test_decode_rejects(void **state)
{
    kvx_handle_t h = base_handle(), d;
    uint8_t buf[KVX_HANDLE_MAX_BYTES + 8], bad[KVX_HANDLE_MAX_BYTES + 8];
    size_t len;
    kvx_reject_t r;
    assert_int_equal(kvx_handle_encode(&h, key, buf, sizeof(buf), &len), PD_OK);
    for (size_t l = 0; l < len; l++) {
        assert_int_not_equal(kvx_handle_decode(buf, l, key, &d, &r), PD_OK);
        assert_int_equal(r, KVX_REJECT_TRUNCATED);
    }
    memcpy(bad, buf, len);
    bad[len] = 0;
    assert_int_equal(kvx_handle_decode(bad, len + 1, key, &d, &r), PD_ERR_TOO_BIG);
    assert_int_equal(r, KVX_REJECT_EXTENDED);
    /* every single bit flip is rejected */
    for (size_t i = 0; i < len * 8; i++) {
        memcpy(bad, buf, len);
        bad[i / 8] ^= (uint8_t)(1u << (i % 8));
        assert_int_not_equal(kvx_handle_decode(bad, len, key, &d, &r), PD_OK);
        assert_int_not_equal(r, KVX_REJECT_NONE);
    }
    memcpy(bad, buf, len);
    bad[40] ^= 1;
    kvx_handle_decode(bad, len, key, &d, &r);
    assert_int_equal(r, KVX_REJECT_BAD_MAC);
    memcpy(bad, buf, len);
    bad[4] = 2;
    kvx_handle_decode(bad, len, key, &d, &r);
    assert_int_equal(r, KVX_REJECT_BAD_VERSION);
    memcpy(bad, buf, len);
    bad[0] ^= 0xff;
    kvx_handle_decode(bad, len, key, &d, &r);
    assert_int_equal(r, KVX_REJECT_BAD_MAGIC);
    /* a different deployment key */
    uint8_t key2[KVX_KEY_BYTES];
    memcpy(key2, key, sizeof(key2));
    key2[0] ^= 1;
    assert_int_equal(kvx_handle_decode(buf, len, key2, &d, &r), PD_ERR_AUTH);
}

/* Correctly signed but malformed bodies (a buggy exporter). */
static void sign(uint8_t *b, size_t len)
{
    crypto_generichash(b + len - KVX_TAG_BYTES, KVX_TAG_BYTES, b,
                       len - KVX_TAG_BYTES, key, KVX_KEY_BYTES);
}

static void test_signed_garbage(void **state)
{
    kvx_handle_t h = base_handle(), d;
    uint8_t buf[KVX_HANDLE_MAX_BYTES];
    size_t len;
    kvx_reject_t r;
    assert_int_equal(kvx_handle_encode(&h, key, buf, sizeof(buf), &len), PD_OK);
    uint8_t b[KVX_HANDLE_MAX_BYTES];
    /* reserved field */
    memcpy(b, buf, len);
    b[74] = 1;
    sign(b, len);
    kvx_handle_decode(b, len, key, &d, &r);
    assert_int_equal(r, KVX_REJECT_RESERVED);
    /* n_runs says 3, runs hold 2 */
    memcpy(b, buf, len);
    b[6] = 3;
    sign(b, len);
    kvx_handle_decode(b, len, key, &d, &r);
    assert_int_equal(r, KVX_REJECT_BAD_RUNS);
    /* n_blocks disagrees with the runs */
    memcpy(b, buf, len);
    b[68] = 9;
    sign(b, len);
    kvx_handle_decode(b, len, key, &d, &r);
    assert_int_equal(r, KVX_REJECT_BAD_RUNS);
    /* too many runs */
    memcpy(b, buf, len);
    b[6] = 65;
    sign(b, len);
    kvx_handle_decode(b, len, key, &d, &r);
    assert_int_equal(r, KVX_REJECT_TOO_MANY);
    /* overlong varint (11 continuation bytes) */
    uint8_t v[KVX_HANDLE_HDR_BYTES + 12 + KVX_TAG_BYTES];
    memcpy(v, buf, KVX_HANDLE_HDR_BYTES);
    v[6] = 1;
    v[7] = 0;
    memset(v + KVX_HANDLE_HDR_BYTES, 0xff, 11);
    v[KVX_HANDLE_HDR_BYTES + 11] = 0;
    v[72] = 12;
    v[73] = 0;
    sign(v, sizeof(v));
    kvx_handle_decode(v, sizeof(v), key, &d, &r);
    assert_int_equal(r, KVX_REJECT_BAD_RUNS);
    /* start + count beyond 2^32 */
    h.n_runs = 1;
    h.runs[0] = (kvx_run_t){ 0xfffffff0u, 0x20 };
    assert_int_equal(kvx_handle_encode(&h, key, buf, sizeof(buf), &len), PD_OK);
    kvx_handle_decode(buf, len, key, &d, &r);
    assert_int_equal(r, KVX_REJECT_OVERFLOW);
}

static void expect_reject_check(kvx_handle_t h, kvx_handle_expect_t e, kvx_reject_t want)
{
    kvx_reject_t r = KVX_REJECT_NONE;
    assert_int_not_equal(kvx_handle_check(&h, &e, &r), PD_OK);
    assert_int_equal(r, want);
}

static void test_check_rejects(void **state)
{
    kvx_handle_t h = base_handle();
    kvx_handle_expect_t e = base_expect();
    kvx_handle_t x;
    kvx_handle_expect_t y;

    x = h; x.importer_id = 23;             expect_reject_check(x, e, KVX_REJECT_WRONG_IMPORTER);
    x = h; x.exporter_id = 12;             expect_reject_check(x, e, KVX_REJECT_UNKNOWN_PEER);
    x = h; x.incarnation = 1;              expect_reject_check(x, e, KVX_REJECT_OLD_INCARNATION);
    x = h; x.region_id = 2;                expect_reject_check(x, e, KVX_REJECT_UNKNOWN_REGION);
    x = h; x.block_bytes = 4096;           expect_reject_check(x, e, KVX_REJECT_GEOMETRY);
    x = h; x.compat_hash = 1;              expect_reject_check(x, e, KVX_REJECT_GEOMETRY);
    x = h; x.lease_slot = 16;              expect_reject_check(x, e, KVX_REJECT_BAD_LEASE);
    x = h; x.runs[1] = (kvx_run_t){ 2047, 2 }; expect_reject_check(x, e, KVX_REJECT_OUT_OF_REGION);
    x = h; x.runs[0] = (kvx_run_t){ 0xffffffffu, 0xffffffffu };
    expect_reject_check(x, e, KVX_REJECT_OUT_OF_REGION);
    y = e; y.now_wall_ns = 5000;           expect_reject_check(h, y, KVX_REJECT_EXPIRED);
    y = e;
    uint64_t rel[16] = { 0 };
    rel[3] = 7;
    y.released_gen = rel;                  expect_reject_check(h, y, KVX_REJECT_REPLAYED);
    rel[3] = 6;
    assert_int_equal(kvx_handle_check(&h, &y, NULL), PD_OK);
    assert_string_equal(kvx_reject_name(KVX_REJECT_STALE), "STALE");
    assert_string_equal(kvx_reject_name(KVX_REJECT__COUNT), "UNKNOWN");
}

int main(void)
{
    if (sodium_init() < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_size_bound),
        cmocka_unit_test(test_runs_fitting),
        cmocka_unit_test(test_decode_rejects),
        cmocka_unit_test(test_signed_garbage),
        cmocka_unit_test(test_check_rejects),
    };
    return cmocka_run_group_tests_name("kvx_handle", tests, NULL, NULL);
}
