/* test_gguf_nomem.c - SQLite-style allocation failure injection: fail the
 * Nth malloc/calloc/realloc for N = 1, 2, ... while opening a valid file
 * and while building + serializing one with the writer. Every run must end
 * in PD_OK or PD_ERR_NO_MEMORY, never crash, and (under ASan) leak nothing.
 * Linked with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "gguf.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);

static long fail_at = -1;   /* fail the fail_at-th allocation (1-based); -1 never */
static long n_allocs;
static int armed;

static int should_fail(void)
{
    if (!armed)
        return 0;
    return ++n_allocs == fail_at;
}

void *__wrap_malloc(size_t n) { return should_fail() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t m) { return should_fail() ? NULL : __real_calloc(n, m); }
void *__wrap_realloc(void *p, size_t n) { return should_fail() ? NULL : __real_realloc(p, n); }

static void arm(long at)
{
    fail_at = at;
    n_allocs = 0;
    armed = 1;
}

static void disarm(void)
{
    armed = 0;
}

/* Build a writer with every kind of content; returns status of the first
 * failing step (or PD_OK) and the writer (to destroy) in *w_p. */
static pd_status_t build(gguf_writer_t **w_p)
{
    static const char *const strs[] = {"a", "bc", "def"};
    static const int32_t ints[] = {1, 2, 3};
    float data[128];
    uint64_t ne[2] = {64, 2};
    pd_status_t st;

    for (int i = 0; i < 128; i++)
        data[i] = (float)(i % 17) - 8.0f;
    *w_p = NULL;
    st = gguf_writer_create(w_p);
    if (st != PD_OK)
        return st;
#define TRY(e) do { st = (e); if (st != PD_OK) return st; } while (0)
    TRY(gguf_writer_set_alignment(*w_p, 64));
    TRY(gguf_writer_add_string(*w_p, "general.architecture", "llama"));
    TRY(gguf_writer_add_u32(*w_p, "k.u32", 7));
    TRY(gguf_writer_add_arr_str(*w_p, "k.strs", strs, NULL, 3));
    TRY(gguf_writer_add_arr_i32(*w_p, "k.ints", ints, 3));
    for (int i = 0; i < 40; i++) {   /* enough to grow the kv table */
        char key[32];
        snprintf(key, sizeof(key), "k.n%d", i);
        TRY(gguf_writer_add_u32(*w_p, key, (uint32_t)i));
    }
    TRY(gguf_writer_add_tensor_f32(*w_p, "t.f32", GGML_TYPE_F32, 2, ne, data));
    TRY(gguf_writer_add_tensor_f32(*w_p, "t.q8", GGML_TYPE_Q8_0, 2, ne, data));
    TRY(gguf_writer_add_tensor_f32(*w_p, "t.q4", GGML_TYPE_Q4_0, 2, ne, data));
#undef TRY
    return PD_OK;
}

static void test_writer_nomem(void **state)
{
    long n_ok = 0, n_fail = 0;
    (void)state;
    for (long at = 1; at < 100000; at++) {
        gguf_writer_t *w;
        uint8_t *buf = NULL;
        size_t size;
        arm(at);
        pd_status_t st = build(&w);
        if (st == PD_OK)
            st = gguf_writer_write_memory(w, &buf, &size);
        long used = n_allocs;
        disarm();
        gguf_writer_destroy(w);
        free(buf);
        if (st == PD_OK) {
            n_ok++;
            if (used < at)
                break;  /* every allocation point has been failed once */
            continue;
        }
        if (st != PD_ERR_NO_MEMORY)
            fail_msg("allocation %ld failed -> %s, want ERR_NO_MEMORY", at, pd_status_name(st));
        n_fail++;
    }
    printf("writer: %ld allocation points failed cleanly\n", n_fail);
    assert_true(n_fail > 10);
    assert_int_equal(n_ok, 1);
}

static void test_reader_nomem(void **state)
{
    gguf_writer_t *w;
    uint8_t *buf;
    size_t size;
    long n_fail = 0;
    (void)state;
    disarm();
    assert_int_equal(build(&w), PD_OK);
    assert_int_equal(gguf_writer_write_memory(w, &buf, &size), PD_OK);
    gguf_writer_destroy(w);
    for (long at = 1; at < 100000; at++) {
        gguf_t *g = NULL;
        char err[256] = "";
        arm(at);
        pd_status_t st = gguf_open_memory(buf, size, &g, err, sizeof(err));
        long used = n_allocs;
        disarm();
        if (st == PD_OK) {
            assert_non_null(gguf_tensor_find(g, "t.q4"));
            gguf_close(g);
            if (used < at)
                break;
            continue;
        }
        if (st != PD_ERR_NO_MEMORY)
            fail_msg("allocation %ld failed -> %s '%s'", at, pd_status_name(st), err);
        assert_null(g);
        assert_string_equal(err, "out of memory");
        n_fail++;
    }
    printf("reader: %ld allocation points failed cleanly\n", n_fail);
    assert_true(n_fail > 40);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_nomem),
        cmocka_unit_test(test_reader_nomem),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
