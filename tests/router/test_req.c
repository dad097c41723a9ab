/* Unit tests for router/rtr_req: request state machine, X-Request-Id
 * validation, SSE framing and the token -> text pipeline (detok + stop). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "rtr_req.h"

static void test_fsm_legal_paths(void **st)
{
    rtr_req_fsm_t f;
    rtr_req_fsm_init(&f, 10);
    assert_int_equal(f.state, RTR_REQ_RECEIVED);
    assert_int_equal(rtr_req_fsm_set(&f, RTR_REQ_ROUTED, 20), PD_OK);
    assert_int_equal(rtr_req_fsm_set(&f, RTR_REQ_PREFILLING, 30), PD_OK);
    /* prefill failed: back to ROUTED, then decode-local */
    assert_int_equal(rtr_req_fsm_set(&f, RTR_REQ_ROUTED, 40), PD_OK);
    assert_int_equal(rtr_req_fsm_set(&f, RTR_REQ_DECODING, 50), PD_OK);
    assert_int_equal(rtr_req_fsm_set(&f, RTR_REQ_COMPLETED, 60), PD_OK);
    assert_int_equal(f.enter_ns[RTR_REQ_RECEIVED], 10);
    assert_int_equal(f.enter_ns[RTR_REQ_ROUTED], 40);   /* last entry */
    assert_int_equal(f.enter_ns[RTR_REQ_COMPLETED], 60);
    assert_int_equal(f.transitions, 5);
}

static void test_fsm_terminal_is_final(void **st)
{
    for (int t = RTR_REQ_COMPLETED; t <= RTR_REQ_CANCELED; t++) {
        assert_true(rtr_req_state_terminal((rtr_req_state_t)t));
        for (int to = 0; to < RTR_REQ__COUNT; to++)
            assert_false(rtr_req_transition_legal((rtr_req_state_t)t, (rtr_req_state_t)to));
    }
    /* every live state can fail or be canceled: exactly one terminal state */
    for (int s = RTR_REQ_RECEIVED; s <= RTR_REQ_DECODING; s++) {
        assert_false(rtr_req_state_terminal((rtr_req_state_t)s));
        assert_true(rtr_req_transition_legal((rtr_req_state_t)s, RTR_REQ_FAILED));
        assert_true(rtr_req_transition_legal((rtr_req_state_t)s, RTR_REQ_CANCELED));
    }
    /* no skipping routing, no success before routing */
    assert_false(rtr_req_transition_legal(RTR_REQ_RECEIVED, RTR_REQ_DECODING));
    assert_false(rtr_req_transition_legal(RTR_REQ_RECEIVED, RTR_REQ_COMPLETED));
    assert_false(rtr_req_transition_legal(RTR_REQ_DECODING, RTR_REQ_PREFILLING));
    /* a decode's prefix export comes before the prefill, never after */
    assert_true(rtr_req_transition_legal(RTR_REQ_ROUTED, RTR_REQ_EXPORTING));
    assert_true(rtr_req_transition_legal(RTR_REQ_EXPORTING, RTR_REQ_PREFILLING));
    assert_false(rtr_req_transition_legal(RTR_REQ_EXPORTING, RTR_REQ_DECODING));
    assert_false(rtr_req_transition_legal(RTR_REQ_PREFILLING, RTR_REQ_EXPORTING));
    assert_string_equal(rtr_req_state_name(RTR_REQ_PREFILLING), "prefilling");
    assert_string_equal(rtr_req_state_name((rtr_req_state_t)99), "invalid");
}

static void test_reqid(void **st)
{
    assert_true(rtr_reqid_valid("abc-123_XYZ", 11));
    char id64[65];
    memset(id64, 'a', 64);
    id64[64] = '\0';
    assert_true(rtr_reqid_valid(id64, 64));
    assert_false(rtr_reqid_valid(id64, 65));
    assert_false(rtr_reqid_valid("", 0));
    assert_false(rtr_reqid_valid("a b", 3));
    assert_false(rtr_reqid_valid("a\nb", 3));
    assert_false(rtr_reqid_valid("\x7f", 1));
    assert_false(rtr_reqid_valid("\xc3\xa9", 2));
    assert_false(rtr_reqid_valid(NULL, 3));
}

static void test_sse_frame(void **st)
{
    char out[64];
    size_t n = rtr_sse_frame("{\"a\":1}", 7, out, sizeof(out));
    assert_int_equal(n, 15);
    assert_string_equal(out, "data: {\"a\":1}\n\n");
    assert_int_equal(rtr_sse_frame("{\"a\":1}", 7, NULL, 0), 15); /* size query */
    assert_int_equal(rtr_sse_frame("a\nb", 3, out, sizeof(out)), 0);  /* would break framing */
    assert_int_equal(rtr_sse_frame("a\rb", 3, out, sizeof(out)), 0);
    assert_int_equal(strlen(RTR_SSE_DONE), 14);
}

static eng_tok_t *byte_tok(void)
{
    eng_tok_t *tok = NULL;
    assert_int_equal(eng_tok_create_byte(260, &tok), PD_OK);
    return tok;
}

static size_t feed_str(rtr_textpipe_t *p, const char *s, char *acc)
{
    char out[RTR_TEXTPIPE_OUT_MAX];
    size_t total = strlen(acc);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        size_t n = rtr_textpipe_feed(p, *c, out, sizeof(out));
        memcpy(acc + total, out, n);
        total += n;
        acc[total] = '\0';
    }
    return total;
}

static void test_textpipe_utf8_split(void **st)
{
    eng_tok_t *tok = byte_tok();
    rtr_textpipe_t p;
    assert_int_equal(rtr_textpipe_init(&p, tok, NULL, 0), PD_OK);
    char out[RTR_TEXTPIPE_OUT_MAX];
    /* "é" = C3 A9 as two byte tokens: nothing until complete */
    assert_int_equal(rtr_textpipe_feed(&p, 0xc3, out, sizeof(out)), 0);
    size_t n = rtr_textpipe_feed(&p, 0xa9, out, sizeof(out));
    assert_int_equal(n, 2);
    assert_memory_equal(out, "\xc3\xa9", 2);
    /* a dangling lead byte becomes U+FFFD at the end */
    assert_int_equal(rtr_textpipe_feed(&p, 0xe2, out, sizeof(out)), 0);
    n = rtr_textpipe_finish(&p, out, sizeof(out));
    assert_int_equal(n, 3);
    assert_memory_equal(out, "\xef\xbf\xbd", 3);
    /* control tokens (EOS 258) give no text */
    assert_int_equal(rtr_textpipe_feed(&p, 258, out, sizeof(out)), 0);
    eng_tok_destroy(tok);
}

static void test_textpipe_stop_across_tokens(void **st)
{
    eng_tok_t *tok = byte_tok();
    rtr_textpipe_t p;
    const char *stops[] = { "END", "xyz" };
    assert_int_equal(rtr_textpipe_init(&p, tok, stops, 2), PD_OK);
    char acc[256] = "";
    feed_str(&p, "hello E", acc);
    /* "E" may start "END": held back */
    assert_string_equal(acc, "hello ");
    feed_str(&p, "Nx", acc);
    assert_false(p.stopped);
    /* "ENx" cannot be END any more; "x" may start "xyz": held */
    assert_string_equal(acc, "hello EN");
    /* "ENx" can no longer be END: released up to the possible "x" start */
    feed_str(&p, "E", acc);
    assert_string_equal(acc, "hello ENx");
    feed_str(&p, "ND tail", acc);
    assert_true(p.stopped);
    assert_string_equal(acc, "hello ENx");
    char out[RTR_TEXTPIPE_OUT_MAX];
    assert_int_equal(rtr_textpipe_feed(&p, 'a', out, sizeof(out)), 0);
    assert_int_equal(rtr_textpipe_finish(&p, out, sizeof(out)), 0);
    eng_tok_destroy(tok);
}

static void test_textpipe_flush_held(void **st)
{
    eng_tok_t *tok = byte_tok();
    rtr_textpipe_t p;
    const char *stops[] = { "STOP" };
    assert_int_equal(rtr_textpipe_init(&p, tok, stops, 1), PD_OK);
    char acc[64] = "";
    feed_str(&p, "abST", acc);
    assert_string_equal(acc, "ab");
    char out[RTR_TEXTPIPE_OUT_MAX];
    size_t n = rtr_textpipe_finish(&p, out, sizeof(out));
    assert_int_equal(n, 2);
    assert_memory_equal(out, "ST", 2);
    eng_tok_destroy(tok);
}

static void test_textpipe_bad_stops(void **st)
{
    eng_tok_t *tok = byte_tok();
    rtr_textpipe_t p;
    const char *many[ENG_STOP_MAX + 1];
    for (int i = 0; i <= ENG_STOP_MAX; i++)
        many[i] = "x";
    assert_int_equal(rtr_textpipe_init(&p, tok, many, ENG_STOP_MAX + 1), PD_ERR_TOO_BIG);
    eng_tok_destroy(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fsm_legal_paths),
        cmocka_unit_test(test_fsm_terminal_is_final),
        cmocka_unit_test(test_reqid),
        cmocka_unit_test(test_sse_frame),
        cmocka_unit_test(test_textpipe_utf8_split),
        cmocka_unit_test(test_textpipe_stop_across_tokens),
        cmocka_unit_test(test_textpipe_flush_held),
        cmocka_unit_test(test_textpipe_bad_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
