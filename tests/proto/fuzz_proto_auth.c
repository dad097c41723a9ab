/* fuzz_proto_auth.c - libFuzzer target for the control-plane handshake and
 * session framing (proto_auth.c): HELLO / REGISTER_ACK verification and
 * proto_auth_frame_next, the receive step every proto_conn runs.
 * Input: data[0] seeds chunk sizes and the tamper position, data[1..] is a
 * byte stream. The stream is
 *   1. verified as a HELLO and as an ACK (fixed secret and nonces): no
 *      crash, no over-read;
 *   2. read as an unauthenticated connection (HELLO-sized body cap) and as
 *      an authenticated one (random bytes never pass a tag);
 *   3. parsed as plain frames, which are re-sent tagged (seq 0, 1, ...) and
 *      read back through proto_auth_frame_next in random chunks: the same
 *      frames must come out; then one byte of the tagged stream is flipped:
 *      every frame before the flipped one still decodes, the flipped one
 *      never does (tag, header or length check refuses it). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto_auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_FRAMES 1024

static proto_msg_t msg;
static const uint8_t KEY[PROTO_AUTH_TAG_LEN] = { 0x6b, 0x65, 0x79, 1, 2, 3, 4, 5, 6, 7, 8,
                                                 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                                                 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29 };

typedef struct {
    uint16_t type[MAX_FRAMES];
    size_t off[MAX_FRAMES];   /* start offset in the tagged stream */
    size_t n;
    pd_status_t end;
} trace_t;

/* Read buf as one connection would (chunked arrival when seed != 0). */
static void read_stream(const uint8_t *key, uint32_t body_max, const uint8_t *buf,
                        size_t len, uint32_t seed, trace_t *t)
{
    uint64_t seq = 0;
    size_t off = 0, avail = 0;
    t->n = 0;
    t->end = PD_OK;
    for (;;) {
        if (seed != 0 && avail < len) {
            seed = seed * 1103515245u + 12345u;
            avail += 1 + (seed >> 16) % 97;
            if (avail > len)
                avail = len;
        } else {
            avail = len;
        }
        for (;;) {
            size_t flen = 0, mlen = 0;
            if (off == avail) {
                t->end = PD_OK;
                break;
            }
            pd_status_t st = proto_auth_frame_next(key, &seq, body_max, buf + off,
                                                   avail - off, &msg, &flen, &mlen);
            if (st == PD_INPROGRESS) {
                if (flen <= avail - off)
                    abort(); /* said "need more" but had enough */
                t->end = st;
                break;
            }
            if (st != PD_OK) {
                t->end = st;
                return;
            }
            if (flen > avail - off || mlen < PROTO_HDR_LEN || mlen > flen)
                abort();
            if (t->n < MAX_FRAMES) {
                t->type[t->n] = msg.hdr.type;
                t->off[t->n] = off;
            }
            t->n++;
            off += flen;
        }
        if (avail == len)
            return;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint32_t seed = data[0] * 2654435761u + 1;
    const uint8_t *in = data + 1;
    size_t len = size - 1;

    /* 1. handshake MACs over arbitrary bytes */
    proto_auth_secret_t sec;
    memset(&sec, 0, sizeof(sec));
    memset(sec.key, 0x42, 32);
    sec.len = 32;
    uint8_t ch[PROTO_AUTH_NONCE_LEN], hn[PROTO_AUTH_NONCE_LEN];
    memset(ch, 0xc1, sizeof(ch));
    memset(hn, 0xd2, sizeof(hn));
    (void)proto_auth_hello_verify(&sec, in, len, ch);
    (void)proto_auth_ack_verify(&sec, in, len, hn, ch);

    /* 2. raw bytes on a pre-auth and on an authenticated connection */
    static trace_t t1, t2;
    read_stream(NULL, PROTO_HELLO_BODY_MAX, in, len, seed, &t1);
    read_stream(KEY, 0, in, len, seed, &t2);
    for (size_t i = 0; i < t1.n && i < MAX_FRAMES; i++)
        if (proto_msg_body_max(t1.type[i]) == 0)
            abort();
    if (t2.n > 0)
        abort(); /* an untagged / randomly tagged frame passed the tag check */

    /* 3. valid plain frames, tagged, read back; then tampered */
    uint8_t *tagged = malloc(len + (len / PROTO_HDR_LEN + 1) * PROTO_AUTH_TAG_LEN + 1);
    if (tagged == NULL)
        abort();
    size_t off = 0, out = 0, nf = 0;
    uint16_t types[MAX_FRAMES];
    while (off < len && nf < MAX_FRAMES) {
        size_t need = 0;
        if (proto_frame_next(in + off, len - off, &msg, &need) != PD_OK)
            break;
        memcpy(tagged + out, in + off, need);
        uint16_t fl = (uint16_t)(tagged[out + 8] | tagged[out + 9] << 8) | PROTO_FLAG_AUTH;
        tagged[out + 8] = (uint8_t)fl;
        tagged[out + 9] = (uint8_t)(fl >> 8);
        proto_auth_frame_tag(KEY, nf, tagged + out, need, tagged + out + need);
        types[nf++] = msg.hdr.type;
        out += need + PROTO_AUTH_TAG_LEN;
        off += need;
    }
    static trace_t t3;
    read_stream(KEY, 0, tagged, out, seed, &t3);
    if (t3.end != PD_OK || t3.n != nf)
        abort();
    for (size_t i = 0; i < nf; i++)
        if (t3.type[i] != types[i])
            abort();
    if (out > 0) {
        size_t pos = (seed >> 3) % out;
        size_t k = 0; /* frame holding pos */
        while (k + 1 < nf && t3.off[k + 1] <= pos)
            k++;
        tagged[pos] ^= (uint8_t)(1u << (seed % 8));
        read_stream(KEY, 0, tagged, out, 0, &t3);
        if (t3.n != k || t3.end == PD_OK)
            abort();
        for (size_t i = 0; i < k; i++)
            if (t3.type[i] != types[i])
                abort();
    }
    free(tagged);
    return 0;
}
