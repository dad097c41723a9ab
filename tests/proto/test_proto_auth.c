/* test_proto_auth.c - secret parsing, HELLO / ACK sign + verify, tampering,
 * wrong secret, wrong nonce (replayed ACK). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include "proto_auth.h"
#include "proto_samples.h"

static const char *HEX64 =
    "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

static void test_secret_parse(void **state)
{
    (void)state;
    proto_auth_secret_t s;
    char buf[200];
    snprintf(buf, sizeof(buf), "  %s\n", HEX64);
    assert_int_equal(proto_auth_secret_parse((const uint8_t *)buf, strlen(buf), &s), PD_OK);
    assert_int_equal(s.len, 32);
    assert_int_equal(s.key[1], 0x11);
    assert_int_equal(s.key[31], 0xff);
    /* raw bytes (not hex) */
    const char *raw = "this is a raw secret of more than 32 bytes!!";
    assert_int_equal(proto_auth_secret_parse((const uint8_t *)raw, strlen(raw), &s), PD_OK);
    assert_int_equal(s.len, strlen(raw));
    /* too short: 31 hex bytes, 10 raw */
    assert_int_equal(proto_auth_secret_parse((const uint8_t *)HEX64, 62, &s), PD_ERR_BAD_INPUT);
    assert_int_equal(proto_auth_secret_parse((const uint8_t *)"0123456789", 10, &s), PD_ERR_BAD_INPUT);
    assert_int_equal(proto_auth_secret_parse(NULL, 0, &s), PD_ERR_BAD_INPUT);
    uint8_t big[600];
    memset(big, 'x', sizeof(big));
    assert_int_equal(proto_auth_secret_parse(big, sizeof(big), &s), PD_ERR_TOO_BIG);
    /* file */
    char path[] = "/tmp/pd-auth-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, HEX64, 64), 64);
    close(fd);
    assert_int_equal(proto_auth_secret_load(path, &s), PD_OK);
    assert_int_equal(s.len, 32);
    unlink(path);
    assert_int_equal(proto_auth_secret_load(path, &s), PD_ERR_IO);
    uint8_t k1[32], k2[32], k3[32];
    proto_auth_derive(&s, "kvx", k1);
    proto_auth_derive(&s, "kvx", k2);
    proto_auth_derive(&s, "other", k3);
    assert_memory_equal(k1, k2, 32);
    assert_memory_not_equal(k1, k3, 32);
    proto_auth_secret_wipe(&s);
    assert_int_equal(s.len, 0);
    proto_auth_secret_wipe(NULL);
}

static uint8_t *enc(const proto_msg_t *m, size_t *len_p)
{
    size_t need = 0;
    proto_msg_encode(m, NULL, 0, &need);
    uint8_t *b = malloc(need);
    assert_non_null(b);
    assert_int_equal(proto_msg_encode(m, b, need, len_p), PD_OK);
    return b;
}

static void test_hello(void **state)
{
    (void)state;
    proto_auth_secret_t s, other;
    assert_int_equal(proto_auth_secret_parse((const uint8_t *)HEX64, 64, &s), PD_OK);
    other = s;
    other.key[0] ^= 1;
    uint8_t ch[PROTO_AUTH_NONCE_LEN], ch2[PROTO_AUTH_NONCE_LEN];
    proto_auth_nonce(ch);
    proto_auth_nonce(ch2);
    for (int v = 0; v < PS_VARIANTS; v++) {
        proto_msg_t m;
        ps_make(PROTO_MSG_HELLO, v, &m);
        proto_auth_nonce(m.u.hello.nonce);
        assert_int_equal(proto_auth_hello_sign(&s, &m, ch), PD_OK);
        size_t len;
        uint8_t *f = enc(&m, &len);
        assert_int_equal(proto_auth_hello_verify(&s, f, len, ch), PD_OK);
        assert_int_equal(proto_auth_hello_verify(&other, f, len, ch), PD_ERR_AUTH);
        /* the same HELLO replayed on a connection with another challenge */
        assert_int_equal(proto_auth_hello_verify(&s, f, len, ch2), PD_ERR_AUTH);
        /* the ACK check refuses a HELLO frame */
        assert_int_equal(proto_auth_ack_verify(&s, f, len, m.u.hello.nonce, ch),
                         PD_ERR_BAD_TYPE);
        /* flip every byte in turn, header included (except magic/version/
         * type, which the header check refuses first): always rejected */
        for (size_t i = 8; i < len; i += (len > 2000 ? 97 : 1)) {
            if (i >= 12 && i < 16)
                continue; /* body_len: a length change is TRUNCATED/AUTH */
            f[i] ^= 0x40;
            pd_status_t st = proto_auth_hello_verify(&s, f, len, ch);
            assert_true(st == PD_ERR_AUTH || st == PD_ERR_RESERVED);
            f[i] ^= 0x40;
        }
        /* the tag field of the header (16..23) is covered */
        f[16] ^= 1;
        assert_int_equal(proto_auth_hello_verify(&s, f, len, ch), PD_ERR_AUTH);
        f[16] ^= 1;
        assert_int_equal(proto_auth_hello_verify(&s, f, PROTO_HDR_LEN + 4, ch),
                         PD_ERR_TRUNCATED);
        free(f);
    }
}

static void test_ack(void **state)
{
    (void)state;
    proto_auth_secret_t s;
    assert_int_equal(proto_auth_secret_parse((const uint8_t *)HEX64, 64, &s), PD_OK);
    uint8_t n1[PROTO_AUTH_NONCE_LEN], n2[PROTO_AUTH_NONCE_LEN], ch[PROTO_AUTH_NONCE_LEN];
    proto_auth_nonce(n1);
    proto_auth_nonce(n2);
    proto_auth_nonce(ch);
    assert_memory_not_equal(n1, n2, sizeof(n1));
    proto_msg_t m;
    ps_make(PROTO_MSG_REGISTER_ACK, PS_MID, &m);
    assert_int_equal(proto_auth_ack_sign(&s, &m, n1, ch), PD_OK);
    size_t len;
    uint8_t *f = enc(&m, &len);
    assert_int_equal(proto_auth_ack_verify(&s, f, len, n1, ch), PD_OK);
    /* an old ACK replayed to a HELLO with another nonce or challenge */
    assert_int_equal(proto_auth_ack_verify(&s, f, len, n2, ch), PD_ERR_AUTH);
    assert_int_equal(proto_auth_ack_verify(&s, f, len, n1, n2), PD_ERR_AUTH);
    assert_int_equal(proto_auth_hello_verify(&s, f, len, ch), PD_ERR_BAD_TYPE);
    f[len - 1] ^= 1;
    assert_int_equal(proto_auth_ack_verify(&s, f, len, n1, ch), PD_ERR_AUTH);
    free(f);
    /* wrong types refused by sign */
    ps_make(PROTO_MSG_HEARTBEAT, PS_MID, &m);
    assert_int_equal(proto_auth_hello_sign(&s, &m, ch), PD_ERR_BAD_TYPE);
    assert_int_equal(proto_auth_ack_sign(&s, &m, n1, ch), PD_ERR_BAD_TYPE);
}

/* Session keys: both ends agree, directions differ, any nonce or secret
 * change gives unrelated keys; frame tags bind key, sequence and bytes. */
static void test_session_keys(void **state)
{
    (void)state;
    proto_auth_secret_t s, other;
    assert_int_equal(proto_auth_secret_parse((const uint8_t *)HEX64, 64, &s), PD_OK);
    other = s;
    other.key[3] ^= 0x80;
    uint8_t ch[PROTO_AUTH_NONCE_LEN], hn[PROTO_AUTH_NONCE_LEN];
    proto_auth_nonce(ch);
    proto_auth_nonce(hn);
    proto_auth_keys_t a, c, x;
    proto_auth_session_keys(&s, ch, hn, true, &a);
    proto_auth_session_keys(&s, ch, hn, false, &c);
    assert_memory_equal(a.send, c.recv, sizeof(a.send));
    assert_memory_equal(a.recv, c.send, sizeof(a.recv));
    assert_memory_not_equal(a.send, a.recv, sizeof(a.send));
    proto_auth_session_keys(&other, ch, hn, true, &x);
    assert_memory_not_equal(a.send, x.send, sizeof(a.send));
    ch[0] ^= 1;
    proto_auth_session_keys(&s, ch, hn, true, &x);
    assert_memory_not_equal(a.send, x.send, sizeof(a.send));
    ch[0] ^= 1;
    hn[31] ^= 1;
    proto_auth_session_keys(&s, ch, hn, true, &x);
    assert_memory_not_equal(a.send, x.send, sizeof(a.send));

    proto_msg_t m;
    ps_make(PROTO_MSG_TOKENS, PS_MID, &m);
    size_t len;
    uint8_t *f = enc(&m, &len);
    uint8_t tag[PROTO_AUTH_TAG_LEN];
    proto_auth_frame_tag(c.send, 7, f, len, tag);
    assert_int_equal(proto_auth_frame_check(a.recv, 7, f, len, tag), PD_OK);
    assert_int_equal(proto_auth_frame_check(a.recv, 6, f, len, tag), PD_ERR_AUTH);
    assert_int_equal(proto_auth_frame_check(a.recv, 8, f, len, tag), PD_ERR_AUTH);
    assert_int_equal(proto_auth_frame_check(a.send, 7, f, len, tag), PD_ERR_AUTH);
    assert_int_equal(proto_auth_frame_check(x.recv, 7, f, len, tag), PD_ERR_AUTH);
    for (size_t i = 0; i < len; i += 13) {
        f[i] ^= 4;
        assert_int_equal(proto_auth_frame_check(a.recv, 7, f, len, tag), PD_ERR_AUTH);
        f[i] ^= 4;
    }
    free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_secret_parse),
        cmocka_unit_test(test_hello),
        cmocka_unit_test(test_ack),
        cmocka_unit_test(test_session_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
