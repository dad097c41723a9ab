/* test_proto_msg.c - unit tests of the pure codecs (proto_msg.c):
 * round trips at boundary values, truncation at every offset, header bit
 * flips, caps, reserved fields, trailing bytes, bad values, random garbage,
 * golden bytes that pin the documented layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "proto_msg.h"
#include "proto_samples.h"

/* Exact-size heap copy of an encoded message so ASan catches over-reads. */
static uint8_t *enc(const proto_msg_t *m, size_t *len_p)
{
    size_t need = 0, len = 0;
    assert_int_equal(proto_msg_encode(m, NULL, 0, &need), PD_ERR_NO_SPACE);
    uint8_t *buf = malloc(need);
    assert_non_null(buf);
    assert_int_equal(proto_msg_encode(m, buf, need, &len), PD_OK);
    assert_int_equal(len, need);
    *len_p = len;
    return buf;
}

static uint8_t *dup_bytes(const uint8_t *p, size_t n)
{
    uint8_t *d = malloc(n ? n : 1);
    assert_non_null(d);
    if (n)
        memcpy(d, p, n);
    return d;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

/* Decode buf in place (views in *out point into buf; callers pass
 * exact-size heap buffers where over-reads matter). If PD_OK the re-encode
 * must give the same bytes. */
static pd_status_t decode_check(const uint8_t *buf, size_t len, proto_msg_t *out)
{
    pd_status_t st = proto_msg_decode(buf, len, out);
    if (st == PD_OK) {
        size_t n2;
        uint8_t *again = enc(out, &n2);
        assert_int_equal(n2, len);
        assert_memory_equal(again, buf, len);
        free(again);
    }
    return st;
}

static void test_names(void **state)
{
    assert_int_equal(PROTO_MSG_COUNT, 24);
    assert_int_equal(PROTO_MSG_EMBED_REQ, 33);
    assert_int_equal(PROTO_MSG_EMBED_DONE, 34);
    assert_string_equal(proto_msg_name(PROTO_MSG_EMBED_DONE), "EMBED_DONE");
    assert_int_equal(PROTO_MSG_PREFILL_HANDLE, 31);
    assert_int_equal(PROTO_MSG_FIRST_TOKEN, 32);
    assert_string_equal(proto_msg_name(PROTO_MSG_PREFILL_HANDLE), "PREFILL_HANDLE");
    assert_string_equal(proto_msg_name(PROTO_MSG_FIRST_TOKEN), "FIRST_TOKEN");
    assert_string_equal(proto_msg_name(PROTO_MSG_KV_EXPORT_DONE), "KV_EXPORT_DONE");
    assert_int_equal(PROTO_MSG_CHALLENGE, 5);
    assert_string_equal(proto_msg_name(PROTO_MSG_CHALLENGE), "CHALLENGE");
    assert_string_equal(proto_msg_name(PROTO_MSG_PEER_INFO), "PEER_INFO");
    assert_int_equal(PROTO_MSG_PEER_DOWN, 25);
    assert_int_equal(PROTO_MSG_MIGRATE, 26);
    assert_int_equal(PROTO_MSG_MIGRATE_DONE, 27);
    assert_string_equal(proto_msg_name(PROTO_MSG_MIGRATE_DONE), "MIGRATE_DONE");
    assert_string_equal(proto_msg_name(PROTO_MSG_HELLO), "HELLO");
    assert_string_equal(proto_msg_name(PROTO_MSG_DECODE_REQ), "DECODE_REQ");
    assert_string_equal(proto_msg_name(PROTO_MSG_ERROR), "ERROR");
    assert_string_equal(proto_msg_name(0), "UNKNOWN");
    assert_string_equal(proto_msg_name(999), "UNKNOWN");
    for (int i = 0; i < PROTO_MSG_COUNT; i++) {
        assert_true(proto_msg_type_known(ps_types[i]));
        assert_true(proto_msg_body_max(ps_types[i]) <= PROTO_BODY_MAX);
        assert_string_not_equal(proto_msg_name(ps_types[i]), "UNKNOWN");
    }
    assert_false(proto_msg_type_known(0));
    assert_false(proto_msg_type_known(6));
    assert_false(proto_msg_type_known(0xffff));
}

/* Every type x variant: size query, exact encode, NO_SPACE one byte short,
 * decode, field equality, byte-identical re-encode; the MAX variant must
 * encode to exactly the type's body cap (caps add up). */
static void test_roundtrip_all(void **state)
{
    proto_msg_t m, d;

    for (int i = 0; i < PROTO_MSG_COUNT; i++) {
        for (int v = 0; v < PS_VARIANTS; v++) {
            ps_make(ps_types[i], v, &m);
            size_t len, short_len = 0;
            uint8_t *buf = enc(&m, &len);
            assert_int_equal(proto_msg_encode(&m, buf, len - 1, &short_len),
                             PD_ERR_NO_SPACE);
            assert_int_equal(short_len, len);
            assert_int_equal(decode_check(buf, len, &d), PD_OK);
            assert_int_equal(d.hdr.body_len, len - PROTO_HDR_LEN);
            if (!ps_equal(&m, &d))
                fail_msg("%s variant %d: decoded fields differ",
                         proto_msg_name(ps_types[i]), v);
            if (v == PS_MAX)
                assert_int_equal(len - PROTO_HDR_LEN, proto_msg_body_max(ps_types[i]));
            size_t blen = 0;
            assert_int_equal(proto_body_encode(&m, NULL, 0, &blen), PD_ERR_NO_SPACE);
            assert_int_equal(blen, len - PROTO_HDR_LEN);
            free(buf);
        }
    }
}

/* Truncation at every offset: whole frame and body alone. For the huge MAX
 * variants only the first and last 2 KiB of offsets (same code paths). */
static void test_truncated_every_offset(void **state)
{
    proto_msg_t m, d;

    for (int i = 0; i < PROTO_MSG_COUNT; i++) {
        for (int v = 0; v < PS_VARIANTS; v++) {
            ps_make(ps_types[i], v, &m);
            size_t len;
            uint8_t *buf = enc(&m, &len);
            for (size_t k = 0; k < len; k++) {
                if (len > 8192 && k > 2048 && k < len - 2048)
                    k = len - 2048;
                /* exact-size copies, except for the multi-MiB variants */
                uint8_t *cut = len > 8192 ? buf : dup_bytes(buf, k);
                pd_status_t st = proto_msg_decode(cut, k, &d);
                if (st != PD_ERR_TRUNCATED)
                    fail_msg("%s v%d frame cut at %zu: %s", proto_msg_name(ps_types[i]),
                             v, k, pd_status_name(st));
                if (k >= PROTO_HDR_LEN) {
                    st = proto_body_decode(ps_types[i], cut + PROTO_HDR_LEN,
                                           k - PROTO_HDR_LEN, &d);
                    if (st != PD_ERR_TRUNCATED)
                        fail_msg("%s v%d body cut at %zu: %s",
                                 proto_msg_name(ps_types[i]), v,
                                 k - PROTO_HDR_LEN, pd_status_name(st));
                }
                if (cut != buf)
                    free(cut);
            }
            free(buf);
        }
    }
}

/* Every single-bit flip of the 32 header bytes of every type. */
static void test_header_bitflips(void **state)
{
    proto_msg_t m, d;

    for (int i = 0; i < PROTO_MSG_COUNT; i++) {
        ps_make(ps_types[i], PS_MID, &m);
        size_t len;
        uint8_t *buf = enc(&m, &len);
        for (unsigned bit = 0; bit < PROTO_HDR_LEN * 8; bit++) {
            unsigned byte = bit / 8;
            buf[byte] ^= (uint8_t)(1u << (bit % 8));
            pd_status_t st = decode_check(buf, len, &d);
            if (byte < 4) {
                assert_int_equal(st, PD_ERR_BAD_MAGIC);
            } else if (byte < 6) {
                assert_int_equal(st, PD_ERR_BAD_VERSION);
            } else if (byte < 8) {
                /* another type: unknown, or a body that fails its decoder,
                 * or (layout twins) a valid message of the other type */
                uint16_t t = (uint16_t)(buf[6] | buf[7] << 8);
                if (!proto_msg_type_known(t))
                    assert_int_equal(st, PD_ERR_BAD_TYPE);
                else if (st == PD_OK)
                    assert_int_equal(d.hdr.type, t);
            } else if (byte < 10) {
                if (bit == 64) { /* PROTO_FLAG_REPLY */
                    assert_int_equal(st, PD_OK);
                    assert_int_equal(d.hdr.flags, PROTO_FLAG_REPLY);
                } else if (bit == 65) { /* PROTO_FLAG_AUTH (the tag is
                                           proto_conn's, not the codec's) */
                    assert_int_equal(st, PD_OK);
                    assert_int_equal(d.hdr.flags, PROTO_FLAG_AUTH);
                } else {
                    assert_int_equal(st, PD_ERR_RESERVED);
                }
            } else if (byte < 12) {
                assert_int_equal(st, PD_ERR_RESERVED);
            } else if (byte < 16) {
                uint32_t bl = get32(buf + 12);
                if (bl > proto_msg_body_max(ps_types[i]))
                    assert_int_equal(st, PD_ERR_TOO_BIG);
                else if (bl > len - PROTO_HDR_LEN)
                    assert_int_equal(st, PD_ERR_TRUNCATED);
                else
                    assert_int_equal(st, PD_ERR_BAD_INPUT); /* trailing */
            } else if (byte < 24) {
                assert_int_equal(st, PD_OK); /* tag is opaque */
                assert_int_not_equal(d.hdr.tag, m.hdr.tag);
            } else {
                assert_int_equal(st, PD_ERR_RESERVED);
            }
            buf[byte] ^= (uint8_t)(1u << (bit % 8));
        }
        assert_int_equal(decode_check(buf, len, &d), PD_OK);
        free(buf);
    }
}

/* Caps: header body_len over the absolute and the per-type cap; counts and
 * lengths inside bodies over their caps, including 0xffffffff. */
static void test_oversized(void **state)
{
    proto_msg_t m, d;
    proto_hdr_t h;
    size_t need;
    uint8_t hdr[PROTO_HDR_LEN];

    for (int i = 0; i < PROTO_MSG_COUNT; i++) {
        h.type = ps_types[i];
        h.flags = 0;
        h.tag = 0;
        uint32_t lens[] = { proto_msg_body_max(ps_types[i]) + 1, PROTO_BODY_MAX,
                            PROTO_BODY_MAX + 1, UINT32_MAX };
        for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
            h.body_len = lens[k];
            proto_hdr_encode(&h, hdr);
            assert_int_equal(proto_hdr_decode(hdr, sizeof(hdr), &h), PD_ERR_TOO_BIG);
            assert_int_equal(proto_frame_check(hdr, sizeof(hdr), &h, &need),
                             PD_ERR_TOO_BIG);
            h.type = ps_types[i];
        }
    }

    /* TOKENS: token count field (after the request id) over cap / huge. */
    ps_make(PROTO_MSG_TOKENS, PS_MID, &m);
    size_t len;
    uint8_t *buf = enc(&m, &len);
    size_t cnt_off = PROTO_HDR_LEN + 2 + strlen(m.u.tokens.request_id) + 4;
    assert_int_equal(get32(buf + cnt_off), 1);
    put32(buf + cnt_off, PROTO_MAX_TOKENS_MSG + 1);
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_TOO_BIG);
    put32(buf + cnt_off, UINT32_MAX);
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_TOO_BIG);
    put32(buf + cnt_off, PROTO_MAX_TOKENS_MSG); /* within cap, past the end */
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_TRUNCATED);
    /* text blob length: last blob in the body */
    put32(buf + cnt_off, 1);
    size_t txt_off = cnt_off + 4 + 4;
    assert_int_equal(get32(buf + txt_off), 5);
    put32(buf + txt_off, PROTO_MAX_TEXT + 1);
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_TOO_BIG);
    put32(buf + txt_off, UINT32_MAX);
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_TOO_BIG);
    free(buf);

    /* string length prefix over its cap (request id, u16) */
    ps_make(PROTO_MSG_RELEASE, PS_MID, &m);
    buf = enc(&m, &len);
    buf[PROTO_HDR_LEN] = (uint8_t)(PROTO_REQID_MAX + 1);
    buf[PROTO_HDR_LEN + 1] = 0;
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_TOO_BIG);
    buf[PROTO_HDR_LEN] = 0xff;
    buf[PROTO_HDR_LEN + 1] = 0xff;
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_TOO_BIG);
    free(buf);

    /* body_decode with a length over the type cap, without a header */
    static uint8_t zeros[PROTO_HEARTBEAT_BODY_MAX + 1];
    assert_int_equal(proto_body_decode(PROTO_MSG_HEARTBEAT, zeros, sizeof(zeros), &d),
                     PD_ERR_TOO_BIG);
    assert_int_equal(proto_body_decode(PROTO_MSG_HEARTBEAT, zeros, sizeof(zeros) - 1,
                                       &d), PD_OK);
    assert_int_equal(proto_body_decode(7, zeros, 8, &d), PD_ERR_BAD_TYPE);
}

/* Reserved header fields, undefined flag bits in header and bodies,
 * reserved body fields. */
static void test_reserved(void **state)
{
    proto_msg_t m, d;
    size_t len;
    uint8_t *buf;

    ps_make(PROTO_MSG_HEARTBEAT, PS_MID, &m);
    buf = enc(&m, &len);
    buf[10] = 1;
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_RESERVED);
    buf[10] = 0;
    buf[31] = 0x80;
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_RESERVED);
    buf[31] = 0;
    buf[9] = 0x80;
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_RESERVED);
    buf[9] = 0;
    /* heartbeat flags at body offset 16 */
    buf[PROTO_HDR_LEN + 16] = 0x2;
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_RESERVED);
    buf[PROTO_HDR_LEN + 16] = PROTO_HB_DRAINING;
    assert_int_equal(decode_check(buf, len, &d), PD_OK);
    assert_int_equal(d.u.heartbeat.flags, PROTO_HB_DRAINING);
    free(buf);

    /* HELLO: reserved u16 at body offset 2, caps at offset 4 */
    ps_make(PROTO_MSG_HELLO, PS_MID, &m);
    buf = enc(&m, &len);
    buf[PROTO_HDR_LEN + 2] = 1;
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_RESERVED);
    buf[PROTO_HDR_LEN + 2] = 0;
    buf[PROTO_HDR_LEN + 4] = 0x20;
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_RESERVED);
    free(buf);

    /* FINISH: reserved u16 after reason */
    ps_make(PROTO_MSG_FINISH, PS_MID, &m);
    buf = enc(&m, &len);
    size_t off = PROTO_HDR_LEN + 2 + strlen(m.u.finish.request_id) + 2;
    buf[off + 1] = 0x40;
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_RESERVED);
    free(buf);

    /* sampling flags (PREFILL_REQ, after reqid + tokens + 3 floats/u32s) */
    ps_make(PROTO_MSG_PREFILL_REQ, PS_MID, &m);
    buf = enc(&m, &len);
    off = PROTO_HDR_LEN + 2 + strlen(m.u.prefill_req.request_id) + 4 +
          4 * m.u.prefill_req.prompt.n + 12;
    assert_int_equal(get32(buf + off), PROTO_SAMPLE_HAS_SEED);
    put32(buf + off, 0x4);
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_RESERVED);
    free(buf);

    /* DECODE_REQ flags */
    ps_make(PROTO_MSG_DECODE_REQ, PS_MID, &m);
    buf = enc(&m, &len);
    off = PROTO_HDR_LEN + 2 + strlen(m.u.decode_req.request_id);
    put32(buf + off, 0x80000000u);
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_RESERVED);
    free(buf);
}

static void test_trailing(void **state)
{
    proto_msg_t m, d;

    for (int i = 0; i < PROTO_MSG_COUNT; i++) {
        ps_make(ps_types[i], PS_MID, &m);
        size_t len;
        uint8_t *buf = enc(&m, &len);
        uint8_t *big = malloc(len + 1);
        memcpy(big, buf, len);
        big[len] = 0;
        /* frame followed by a stray byte */
        assert_int_equal(decode_check(big, len + 1, &d), PD_ERR_BAD_INPUT);
        /* body with one more byte, announced in body_len */
        put32(big + 12, get32(big + 12) + 1);
        if (get32(big + 12) > proto_msg_body_max(ps_types[i]))
            assert_int_equal(decode_check(big, len + 1, &d), PD_ERR_TOO_BIG);
        else
            assert_int_equal(decode_check(big, len + 1, &d), PD_ERR_BAD_INPUT);
        free(big);
        free(buf);
    }
}

static void test_bad_values(void **state)
{
    proto_msg_t m, d;
    size_t len, off;
    uint8_t *buf;

    /* NUL inside a string */
    ps_make(PROTO_MSG_RELEASE, PS_MID, &m);
    buf = enc(&m, &len);
    buf[PROTO_HDR_LEN + 2 + 3] = 0;
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
    free(buf);

    /* empty required request id: hand-made body */
    uint8_t rel[PROTO_HDR_LEN + 10] = { 0 };
    proto_hdr_t h = { PROTO_MSG_RELEASE, 0, 10, 0 };
    proto_hdr_encode(&h, rel);
    assert_int_equal(decode_check(rel, sizeof(rel), &d), PD_ERR_BAD_INPUT);
    m.u.release.request_id[0] = '\0';
    assert_int_equal(proto_msg_encode(&m, rel, sizeof(rel), &len), PD_ERR_BAD_INPUT);

    /* token id >= 2^31 */
    ps_make(PROTO_MSG_TOKENS, PS_MID, &m);
    buf = enc(&m, &len);
    off = PROTO_HDR_LEN + 2 + strlen(m.u.tokens.request_id) + 4 + 4;
    put32(buf + off, 0x80000000u);
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
    put32(buf + off, 0x7fffffffu);
    assert_int_equal(decode_check(buf, len, &d), PD_OK);
    assert_int_equal(proto_tokens_get(&d.u.tokens.tokens, 0), INT32_MAX);
    free(buf);

    /* NaN / negative temperature, top_p > 1 */
    ps_make(PROTO_MSG_PREFILL_REQ, PS_MID, &m);
    m.u.prefill_req.sampling.temperature = NAN;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    m.u.prefill_req.sampling.temperature = -1.0f;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    m.u.prefill_req.sampling.temperature = 1.0f;
    m.u.prefill_req.sampling.top_p = 1.5f;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    m.u.prefill_req.sampling.top_p = INFINITY;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    /* ...and the decoder says the same when the wire carries them */
    m.u.prefill_req.sampling.top_p = 1.0f;
    buf = enc(&m, &len);
    off = PROTO_HDR_LEN + 2 + strlen(m.u.prefill_req.request_id) + 4 +
          4 * m.u.prefill_req.prompt.n;
    put32(buf + off, 0x7fc00000u); /* NaN */
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
    free(buf);

    /* DECODE_REQ: handle XOR prefill-locally */
    ps_make(PROTO_MSG_DECODE_REQ, PS_MID, &m);
    m.u.decode_req.flags = PROTO_DEC_PREFILL_LOCALLY;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    m.u.decode_req.flags = 0;
    m.u.decode_req.kv_handle.len = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    /* DECODE_REQ: a handle's KV covers the prompt (0) up to prompt +
     * generated - 1 (a migration), never more, and never without a handle */
    ps_make(PROTO_MSG_DECODE_REQ, PS_MID, &m); /* prompt 37, generated 1 */
    m.u.decode_req.kv_tokens = 36;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    m.u.decode_req.kv_tokens = 38;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    m.u.decode_req.kv_tokens = 37;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_NO_SPACE);
    m.u.decode_req.kv_tokens = 37;
    m.u.decode_req.flags = PROTO_DEC_PREFILL_LOCALLY;
    m.u.decode_req.kv_handle.len = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    /* MIGRATE_DONE: a handle, at least one generated token */
    ps_make(PROTO_MSG_MIGRATE_DONE, PS_MID, &m);
    m.u.migrate_done.n_gen = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_MIGRATE_DONE, PS_MID, &m);
    m.u.migrate_done.kv_handle.len = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_MIGRATE, PS_MID, &m);
    m.u.migrate.target_decode_id[0] = '\0';
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);

    /* statuses and enums out of range */
    ps_make(PROTO_MSG_ERROR, PS_MID, &m);
    m.u.error.status = PD_OK;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    m.u.error.status = PD_STATUS_MIN - 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_FINISH, PS_MID, &m);
    m.u.finish.reason = PROTO_FINISH_REASON_MAX + 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_HELLO, PS_MID, &m);
    m.u.hello.role = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    m.u.hello.role = PROTO_ROLE_ROUTER + 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_PREFILL_DONE, PS_MID, &m);
    m.u.prefill_done.first_token = -1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    /* cached_tokens never exceed the prompt */
    ps_make(PROTO_MSG_PREFILL_DONE, PS_MID, &m);
    m.u.prefill_done.cached_tokens = m.u.prefill_done.n_prompt_tokens + 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_FINISH, PS_MID, &m);
    m.u.finish.cached_tokens = m.u.finish.prompt_tokens + 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    /* PREFILL_REQ's source: all or nothing, never the whole prompt */
    ps_make(PROTO_MSG_PREFILL_REQ, PS_MID, &m);
    m.u.prefill_req.src_kv_tokens = m.u.prefill_req.prompt.n;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_PREFILL_REQ, PS_MID, &m);
    m.u.prefill_req.src_peer_id[0] = '\0';
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_PREFILL_REQ, PS_MID, &m);
    m.u.prefill_req.src_handle.len = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_PREFILL_REQ, PS_MID, &m);
    m.u.prefill_req.src_kv_tokens = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_PREFILL_REQ, PS_MIN, &m);
    m.u.prefill_req.src_lease_id = 1; /* a lease without a source */
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_PREFILL_REQ, PS_MID, &m);
    m.u.prefill_req.src_handle.len = PROTO_KV_HANDLE_MAX + 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_TOO_BIG);
    /* KV_EXPORT_REQ: a target, a prompt of 2+ tokens, min_tokens below it */
    ps_make(PROTO_MSG_KV_EXPORT_REQ, PS_MID, &m);
    m.u.kv_export_req.target_prefill_id[0] = '\0';
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_KV_EXPORT_REQ, PS_MID, &m);
    m.u.kv_export_req.min_tokens = m.u.kv_export_req.prompt.n;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_KV_EXPORT_REQ, PS_MIN, &m);
    m.u.kv_export_req.prompt.n = 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    /* DECODE_REQ TOKEN0_LATER: a prefill's handle, nothing generated, no forks */
    ps_make(PROTO_MSG_DECODE_REQ, PS_MID, &m); /* generated 1 */
    m.u.decode_req.flags = PROTO_DEC_TOKEN0_LATER;
    m.u.decode_req.kv_tokens = 0;
    m.u.decode_req.n_fork = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    m.u.decode_req.generated.n = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_NO_SPACE);
    m.u.decode_req.n_fork = 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    m.u.decode_req.n_fork = 0;
    m.u.decode_req.flags = PROTO_DEC_TOKEN0_LATER | PROTO_DEC_PREFILL_LOCALLY;
    m.u.decode_req.kv_handle.len = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    /* PREFILL_HANDLE: a handle of a non-empty prompt */
    ps_make(PROTO_MSG_PREFILL_HANDLE, PS_MID, &m);
    m.u.prefill_handle.kv_handle.len = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_PREFILL_HANDLE, PS_MID, &m);
    m.u.prefill_handle.n_prompt_tokens = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    /* EMBED_REQ: a defined pooling, a non-empty prompt */
    ps_make(PROTO_MSG_EMBED_REQ, PS_MID, &m);
    m.u.embed_req.pooling = 4;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_EMBED_REQ, PS_MID, &m);
    m.u.embed_req.prompt.n = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    /* EMBED_DONE: whole floats, at least one, a prompt token */
    ps_make(PROTO_MSG_EMBED_DONE, PS_MID, &m);
    m.u.embed_done.vec.len = 6;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_EMBED_DONE, PS_MID, &m);
    m.u.embed_done.vec.len = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_EMBED_DONE, PS_MID, &m);
    m.u.embed_done.n_prompt_tokens = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    {
        const uint8_t one[4] = { 0x00, 0x00, 0x80, 0x3f }; /* 1.0f LE */
        proto_embed_done_t ed = { .vec = { one, 4 } };
        assert_true(proto_embed_get(&ed, 0) == 1.0f);
    }
    /* FIRST_TOKEN: a token id */
    ps_make(PROTO_MSG_FIRST_TOKEN, PS_MID, &m);
    m.u.first_token.first_token = -1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    /* KV_EXPORT_DONE: a handle covering at least one token */
    ps_make(PROTO_MSG_KV_EXPORT_DONE, PS_MID, &m);
    m.u.kv_export_done.kv_tokens = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_KV_EXPORT_DONE, PS_MID, &m);
    m.u.kv_export_done.kv_handle.len = 0;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    /* KV_EVENTS: at most PROTO_MAX_KV_EVENTS names in all, defined flags */
    ps_make(PROTO_MSG_KV_EVENTS, PS_MAX, &m);
    m.u.kv_events.removed.n++;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_TOO_BIG);
    ps_make(PROTO_MSG_KV_EVENTS, PS_MID, &m);
    m.u.kv_events.flags = 0x2;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_RESERVED);
    ps_make(PROTO_MSG_KV_EVENTS, PS_MID, &m);
    m.u.kv_events.stored.v = NULL; /* count without data */
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    {
        /* a decoder sees a count over the cap before it sizes anything,
         * and a sum over the cap after */
        uint8_t kb[PROTO_HDR_LEN + 64];
        ps_make(PROTO_MSG_KV_EVENTS, PS_MIN, &m);
        assert_int_equal(proto_msg_encode(&m, kb, sizeof(kb), &len), PD_OK);
        put32(kb + PROTO_HDR_LEN + 8, PROTO_MAX_KV_EVENTS + 1); /* stored.n */
        proto_msg_t kd;
        assert_int_equal(decode_check(kb, len, &kd), PD_ERR_TOO_BIG);
        static uint64_t names[PROTO_MAX_KV_EVENTS];
        ps_make(PROTO_MSG_KV_EVENTS, PS_MIN, &m);
        m.u.kv_events.stored = (proto_names_t){ PROTO_MAX_KV_EVENTS, names, NULL };
        size_t blen;
        assert_int_equal(proto_msg_encode(&m, NULL, 0, &blen), PD_ERR_NO_SPACE);
        uint8_t *big = malloc(blen + 8);
        assert_non_null(big);
        assert_int_equal(proto_msg_encode(&m, big, blen, &blen), PD_OK);
        assert_int_equal(proto_msg_decode(big, blen, &kd), PD_OK);
        assert_int_equal(kd.u.kv_events.stored.n, PROTO_MAX_KV_EVENTS);
        /* one more removed name: the sum is over the cap */
        put32(big + blen - 4, 1);
        memset(big + blen, 0, 8);
        put32(big + 12, (uint32_t)(blen + 8 - PROTO_HDR_LEN));
        assert_int_equal(decode_check(big, blen + 8, &kd), PD_ERR_TOO_BIG);
        free(big);
    }
}

static void test_encode_refuses(void **state)
{
    proto_msg_t m;
    size_t len;
    int32_t neg = -5;

    ps_make(PROTO_MSG_RELEASE, PS_MID, &m);
    memset(m.u.release.request_id, 'x', sizeof(m.u.release.request_id)); /* no NUL */
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_TOO_BIG);
    ps_make(PROTO_MSG_RELEASE, PS_MID, &m);
    m.hdr.flags = 0x8000;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_RESERVED);
    m.hdr.flags = 0;
    m.hdr.type = 6;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_TYPE);

    ps_make(PROTO_MSG_TOKENS, PS_MID, &m);
    m.u.tokens.tokens.n = PROTO_MAX_TOKENS_MSG + 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_TOO_BIG);
    m.u.tokens.tokens.n = 1;
    m.u.tokens.tokens.v = &neg;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    m.u.tokens.tokens.v = NULL; /* count without data */
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_TOKENS, PS_MID, &m);
    m.u.tokens.text.len = PROTO_MAX_TEXT + 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_TOO_BIG);
    m.u.tokens.text.len = 3;
    m.u.tokens.text.p = NULL;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);

    ps_make(PROTO_MSG_PREFILL_REQ, PS_MID, &m);
    m.u.prefill_req.sampling.stop.n = PROTO_MAX_STOP_TOKENS + 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_TOO_BIG);

    /* the sampling tail: ranges and the logit_bias cap, on both messages */
    for (int k = 0; k < 2; k++) {
        uint16_t type = k ? PROTO_MSG_DECODE_REQ : PROTO_MSG_PREFILL_REQ;
        proto_sampling_t *sp = k ? &m.u.decode_req.sampling : &m.u.prefill_req.sampling;
        ps_make(type, PS_MID, &m);
        sp->presence_penalty = 2.5f;
        assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
        ps_make(type, PS_MID, &m);
        sp->frequency_penalty = NAN;
        assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
        ps_make(type, PS_MID, &m);
        sp->repetition_penalty = -1.0f;
        assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
        ps_make(type, PS_MID, &m);
        sp->min_p = 1.01f;
        assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
        ps_make(type, PS_MID, &m);
        sp->bias[1] = -100.5f;
        assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
        ps_make(type, PS_MID, &m);
        sp->bias_ids[0] = -1;
        assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
        ps_make(type, PS_MID, &m);
        sp->n_bias = PROTO_MAX_LOGIT_BIAS + 1;
        assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_TOO_BIG);
    }
}

/* The sampling tail is the last thing in PREFILL_REQ and DECODE_REQ: the
 * decoder checks its values too (a peer cannot smuggle an out-of-range
 * penalty or bias past proto). */
static void test_sampling_tail(void **state)
{
    proto_msg_t m, d;
    size_t len;
    for (int k = 0; k < 2; k++) {
        uint16_t type = k ? PROTO_MSG_DECODE_REQ : PROTO_MSG_PREFILL_REQ;
        ps_make(type, PS_MID, &m);
        uint8_t *buf = enc(&m, &len);
        /* DECODE_REQ ends with n_fork (u32) after the tail, PREFILL_REQ
         * with its source (peer id, lease id, handle, kv_tokens); both
         * then with cache_partition (u64) */
        const proto_prefill_req_t *pq = &m.u.prefill_req;
        size_t e = len - 8 -
                   (k ? 4 : 2 + strlen(pq->src_peer_id) + 8 + 4 + pq->src_handle.len + 4);
        /* tail = 4 f32 + u32 count + 2 x (u32 id, f32 bias) + 2 u32 (logprobs)
         * + u32 gram_kind + empty gram blob (u32 0) */
        size_t tail = e - (16 + 4 + 2 * 8 + 8 + 8);
        assert_int_equal(get32(buf + e - 8), PROTO_GRAM_JSON_OBJECT);
        assert_int_equal(get32(buf + e - 4), 0);
        put32(buf + e - 8, PROTO_GRAM_GBNF + 1); /* unknown grammar kind */
        assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
        put32(buf + e - 8, PROTO_GRAM_JSON_SCHEMA); /* a schema needs its text */
        assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
        put32(buf + e - 8, PROTO_GRAM_REGEX); /* so do a regex and a grammar */
        assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
        put32(buf + e - 8, PROTO_GRAM_GBNF);
        assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
        put32(buf + e - 8, PROTO_GRAM_JSON_OBJECT);
        put32(buf + e - 4, PROTO_MAX_GRAMMAR + 1);
        assert_int_equal(decode_check(buf, len, &d), PD_ERR_TOO_BIG);
        put32(buf + e - 4, 0);
        assert_int_equal(get32(buf + e - 16), 1);   /* logprobs */
        assert_int_equal(get32(buf + e - 12), 3);   /* top_logprobs */
        put32(buf + e - 12, PROTO_MAX_TOP_LOGPROBS + 1);
        assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
        put32(buf + e - 12, 3);
        put32(buf + e - 16, 0); /* top_logprobs without logprobs */
        assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
        put32(buf + e - 16, 1);
        assert_int_equal(get32(buf + tail + 16), 2);
        float f;
        memcpy(&f, buf + tail, 4);
        assert_true(f == 0.5f); /* presence_penalty, as proto_samples sets it */
        put32(buf + tail + 16, PROTO_MAX_LOGIT_BIAS + 1);
        assert_int_equal(decode_check(buf, len, &d), PD_ERR_TOO_BIG);
        put32(buf + tail + 16, 2);
        assert_int_equal(decode_check(buf, len, &d), PD_OK);
        f = 3.0f; /* presence_penalty out of range */
        memcpy(buf + tail, &f, 4);
        assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
        f = 0.5f;
        memcpy(buf + tail, &f, 4);
        f = 101.0f; /* a bias out of range */
        memcpy(buf + tail + 24, &f, 4);
        assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
        free(buf);
    }
    /* n_fork: capped, and only on a DECODE_REQ for a prompt (no migration) */
    ps_make(PROTO_MSG_DECODE_REQ, PS_MIN, &m);
    assert_int_equal(m.u.decode_req.n_fork, PROTO_MAX_FORK);
    free(enc(&m, &len));
    m.u.decode_req.n_fork = PROTO_MAX_FORK + 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_TOO_BIG);
    ps_make(PROTO_MSG_DECODE_REQ, PS_MID, &m); /* kv_tokens 37: a migration's */
    m.u.decode_req.n_fork = 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    ps_make(PROTO_MSG_DECODE_REQ, PS_MAX, &m); /* "<64-byte id>/<i>" does not fit */
    m.u.decode_req.kv_tokens = 0;
    m.u.decode_req.generated.n = 1;
    free(enc(&m, &len));
    m.u.decode_req.n_fork = 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_BAD_INPUT);
    /* the logprobs tail of TOKENS: one entry per token or none; values <= 0 */
    ps_make(PROTO_MSG_TOKENS, PS_MID, &m);
    uint8_t *buf = enc(&m, &len);
    size_t tail = len - (8 + 4 + 8 * 4);     /* top_n 4, one token */
    assert_int_equal(get32(buf + tail), 4);
    assert_int_equal(get32(buf + tail + 4), 1);
    assert_int_equal(decode_check(buf, len, &d), PD_OK);
    proto_logprob_t e;
    proto_logprobs_get(&d.u.tokens.logprobs, 0, &e);
    assert_true(e.logprob == 0.0f && e.top_ids[0] == INT32_MAX);
    put32(buf + tail + 4, 2); /* more entries than tokens */
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_TOO_BIG);
    put32(buf + tail + 4, 1);
    float f = 0.5f; /* a positive logprob */
    memcpy(buf + tail + 8, &f, 4);
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
    f = NAN;
    memcpy(buf + tail + 8, &f, 4);
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
    f = -1.0f;
    memcpy(buf + tail + 8, &f, 4);
    put32(buf + tail + 12, 0x80000000u); /* a negative id */
    assert_int_equal(decode_check(buf, len, &d), PD_ERR_BAD_INPUT);
    free(buf);
    ps_make(PROTO_MSG_TOKENS, PS_MID, &m);
    m.u.tokens.logprobs.top_n = PROTO_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(proto_msg_encode(&m, NULL, 0, &len), PD_ERR_TOO_BIG);
}

/* Layout pinned to PROTOCOL.md: header and a RELEASE, byte by byte. */
static void test_golden_bytes(void **state)
{
    proto_msg_t m;
    uint8_t buf[64];
    size_t len;
    static const uint8_t want[] = {
        'P', 'D', 'S', 'V', 0x04, 0x00, 0x16, 0x00, /* magic, ver 4, type 22 */
        0x01, 0x00, 0x00, 0x00, 0x0d, 0x00, 0x00, 0x00, /* REPLY, rsv, len 13 */
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* tag */
        0, 0, 0, 0, 0, 0, 0, 0,                         /* reserved1 */
        0x03, 0x00, 'r', '-', '1',                      /* request id */
        0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, /* lease id */
    };

    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_RELEASE;
    m.hdr.flags = PROTO_FLAG_REPLY;
    m.hdr.tag = 0x0102030405060708ull;
    strcpy(m.u.release.request_id, "r-1");
    m.u.release.lease_id = 0x0123456789abcdefull;
    assert_int_equal(proto_msg_encode(&m, buf, sizeof(buf), &len), PD_OK);
    assert_int_equal(len, sizeof(want));
    assert_memory_equal(buf, want, sizeof(want));
}

static void test_frame_check(void **state)
{
    proto_msg_t a, b;
    proto_hdr_t h;
    size_t la, lb, need = 0;

    ps_make(PROTO_MSG_HEARTBEAT, PS_MID, &a);
    ps_make(PROTO_MSG_TOKENS, PS_MID, &b);
    uint8_t *ba = enc(&a, &la), *bb = enc(&b, &lb);
    uint8_t *stream = malloc(la + lb);
    memcpy(stream, ba, la);
    memcpy(stream + la, bb, lb);

    for (size_t k = 0; k < PROTO_HDR_LEN; k++) {
        assert_int_equal(proto_frame_check(stream, k, &h, &need), PD_INPROGRESS);
        assert_int_equal(need, PROTO_HDR_LEN);
    }
    for (size_t k = PROTO_HDR_LEN; k < la; k++) {
        assert_int_equal(proto_frame_check(stream, k, &h, &need), PD_INPROGRESS);
        assert_int_equal(need, la);
    }
    assert_int_equal(proto_frame_check(stream, la + lb, &h, &need), PD_OK);
    assert_int_equal(need, la);
    assert_int_equal(h.type, PROTO_MSG_HEARTBEAT);
    assert_int_equal(proto_frame_check(stream + la, lb, &h, &need), PD_OK);
    assert_int_equal(need, lb);
    assert_int_equal(h.type, PROTO_MSG_TOKENS);
    stream[la] = 'X';
    assert_int_equal(proto_frame_check(stream + la, lb, &h, &need), PD_ERR_BAD_MAGIC);
    free(stream);
    free(ba);
    free(bb);
}

static void test_mac_input(void **state)
{
    proto_msg_t m;
    size_t len, mlen;
    const uint8_t *p;

    ps_make(PROTO_MSG_HELLO, PS_MID, &m);
    uint8_t *buf = enc(&m, &len);
    assert_int_equal(proto_mac_input(buf, len, &p, &mlen), PD_OK);
    assert_ptr_equal(p, buf); /* the header is covered too */
    assert_int_equal(mlen, len - PROTO_AUTH_MAC_LEN);
    assert_memory_equal(buf + len - PROTO_AUTH_MAC_LEN, m.u.hello.mac, PROTO_AUTH_MAC_LEN);
    assert_int_equal(proto_mac_input(buf, len - 1, &p, &mlen), PD_ERR_TRUNCATED);
    free(buf);
    ps_make(PROTO_MSG_REGISTER_ACK, PS_MID, &m);
    buf = enc(&m, &len);
    assert_int_equal(proto_mac_input(buf, len, &p, &mlen), PD_OK);
    assert_memory_equal(buf + len - PROTO_AUTH_MAC_LEN, m.u.register_ack.mac,
                        PROTO_AUTH_MAC_LEN);
    free(buf);
    ps_make(PROTO_MSG_RELEASE, PS_MID, &m);
    buf = enc(&m, &len);
    assert_int_equal(proto_mac_input(buf, len, &p, &mlen), PD_ERR_BAD_TYPE);
    free(buf);
}

static void test_tokens_accessors(void **state)
{
    int32_t v[3] = { 5, 6, INT32_MAX }, out[3] = { 0 };
    uint8_t wire[8] = { 1, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f };
    proto_tokens_t a = { 3, v, NULL }, b = { 2, NULL, wire };

    assert_int_equal(proto_tokens_get(&a, 2), INT32_MAX);
    assert_int_equal(proto_tokens_get(&a, 3), -1);
    assert_int_equal(proto_tokens_get(&b, 0), 1);
    assert_int_equal(proto_tokens_get(&b, 1), INT32_MAX);
    assert_int_equal(proto_tokens_copy(&a, out, 2), 2);
    assert_int_equal(out[1], 6);
    assert_int_equal(out[2], 0);
    assert_int_equal(proto_tokens_copy(&b, out, 3), 2);
    assert_int_equal(out[0], 1);
}

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Random garbage: raw random bytes, and valid headers with random bodies
 * (so the body decoders see garbage too). Nothing may crash; anything that
 * decodes must re-encode identically (checked in decode_check). */
static void test_random_garbage(void **state)
{
    proto_msg_t d;
    uint8_t buf[PROTO_HDR_LEN + 512];
    unsigned ok = 0;

    for (int iter = 0; iter < 60000; iter++) {
        size_t len = (size_t)(rnd() % sizeof(buf));
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)rnd();
        if (iter & 1 && len >= PROTO_HDR_LEN) {
            proto_hdr_t h = { ps_types[rnd() % PROTO_MSG_COUNT], 0,
                              (uint32_t)(len - PROTO_HDR_LEN), rnd() };
            proto_hdr_encode(&h, buf);
            /* small length prefixes make valid strings likely */
            if (len > PROTO_HDR_LEN + 2 && (iter & 2)) {
                buf[PROTO_HDR_LEN] = (uint8_t)(rnd() % 8);
                buf[PROTO_HDR_LEN + 1] = 0;
            }
        }
        uint8_t *copy = dup_bytes(buf, len);
        if (decode_check(copy, len, &d) == PD_OK)
            ok++;
        free(copy);
    }
    /* a random 48-byte HEARTBEAT body decodes whenever its flags word is
     * 0 or 1, so some inputs must have made it through the whole path */
    assert_true(ok > 0);
}

/* HELLO's kv_dtype: K's dtype, V's + 1 in bits 8-15 only when it differs
 * (issue 32), so one-dtype deployments send the plain value */
static void test_kv_dtype_pack(void **state)
{
    (void)state;
    char b[40];
    assert_int_equal(PROTO_KV_DTYPE_PACK(1, 1), 1);
    assert_int_equal(PROTO_KV_DTYPE_PACK(0, 0), 0);
    uint32_t x = PROTO_KV_DTYPE_PACK(2, 3);
    assert_int_equal(x, 2 | 4 << 8);
    assert_int_equal(PROTO_KV_DTYPE_K(x), 2);
    assert_int_equal(PROTO_KV_DTYPE_V(x), 3);
    x = PROTO_KV_DTYPE_PACK(1, 0); /* v = f32 (0) stays distinct from "as K" */
    assert_int_equal(PROTO_KV_DTYPE_K(x), 1);
    assert_int_equal(PROTO_KV_DTYPE_V(x), 0);
    assert_int_equal(PROTO_KV_DTYPE_V(5), 5);
    assert_string_equal(proto_kv_dtypes_str(5, b, sizeof b), "fp8_e4m3");
    assert_string_equal(proto_kv_dtypes_str(PROTO_KV_DTYPE_PACK(2, 3), b, sizeof b),
                        "k=q8_0,v=q4_0");
    assert_string_equal(proto_kv_dtypes_str(PROTO_KV_DTYPE_PACK(4, 1), b, sizeof b),
                        "k=bf16,v=f16");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_roundtrip_all),
        cmocka_unit_test(test_truncated_every_offset),
        cmocka_unit_test(test_header_bitflips),
        cmocka_unit_test(test_oversized),
        cmocka_unit_test(test_reserved),
        cmocka_unit_test(test_trailing),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_encode_refuses),
        cmocka_unit_test(test_sampling_tail),
        cmocka_unit_test(test_golden_bytes),
        cmocka_unit_test(test_frame_check),
        cmocka_unit_test(test_mac_input),
        cmocka_unit_test(test_tokens_accessors),
        cmocka_unit_test(test_random_garbage),
        cmocka_unit_test(test_kv_dtype_pack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
