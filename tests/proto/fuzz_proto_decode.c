/* fuzz_proto_decode.c - libFuzzer target for every proto decoder.
 * Two views of each input:
 *   1. a whole frame: proto_msg_decode(data, size)
 *   2. a body: type chosen by data[0], body = data[1..]
 * Anything that decodes OK must re-encode to the identical bytes (the
 * encoding is canonical), and must pass the encoder's own validation. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint16_t types[] = {
#define FZ_X(NAME, name, code, max) code,
    PROTO_MSG_LIST(FZ_X)
#undef FZ_X
};

static void reencode_frame(const proto_msg_t *m, const uint8_t *data, size_t size)
{
    size_t len = 0;
    uint8_t *out = malloc(size);
    if (out == NULL)
        abort();
    if (proto_msg_encode(m, out, size, &len) != PD_OK || len != size ||
        memcmp(out, data, size) != 0)
        abort();
    free(out);
}

static void reencode_body(const proto_msg_t *m, const uint8_t *body, size_t size)
{
    size_t len = 0;
    uint8_t *out = malloc(size ? size : 1);
    if (out == NULL)
        abort();
    if (proto_body_encode(m, out, size, &len) != PD_OK || len != size ||
        memcmp(out, body, size) != 0)
        abort();
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static proto_msg_t m;
    proto_hdr_t hdr;
    size_t need = 0;

    /* whole frame */
    pd_status_t st = proto_msg_decode(data, size, &m);
    if (st == PD_OK) {
        if (m.hdr.body_len != size - PROTO_HDR_LEN)
            abort();
        reencode_frame(&m, data, size);
    }
    /* the framing view of the same bytes must agree */
    pd_status_t fst = proto_frame_check(data, size, &hdr, &need);
    if (st == PD_OK && (fst != PD_OK || need != size))
        abort();
    if (fst == PD_OK && need > size)
        abort();

    /* body of a type picked by the first byte */
    if (size >= 1) {
        uint16_t type = types[data[0] % (sizeof(types) / sizeof(types[0]))];
        memset(&m, 0, sizeof(m));
        if (proto_body_decode(type, data + 1, size - 1, &m) == PD_OK) {
            m.hdr.type = type;
            reencode_body(&m, data + 1, size - 1);
        }
    }
    return 0;
}
