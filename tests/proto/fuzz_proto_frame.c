/* fuzz_proto_frame.c - libFuzzer target for the framing state machine
 * (proto_frame_next, the step proto_conn runs on its input buffer).
 * Input: data[0] seeds the chunk sizes, data[1..] is a byte stream.
 * The stream is parsed twice: all at once, and as it would arrive on a
 * socket in random chunks (accumulate, run frames, drop consumed bytes),
 * exactly like proto_conn. Both must produce the same sequence of frames
 * and the same final state (clean / incomplete tail / error status).
 * Each decoded frame must re-encode to its own bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_EVENTS 4096

typedef struct {
    uint16_t type;
    uint64_t tag;
    size_t len;
} fz_event_t;

typedef struct {
    fz_event_t ev[MAX_EVENTS];
    size_t n;
    pd_status_t end;   /* PD_OK clean, PD_INPROGRESS tail, or error */
} fz_trace_t;

static proto_msg_t msg;

static void check_reencode(const uint8_t *frame, size_t len)
{
    size_t n = 0;
    uint8_t *out = malloc(len);
    if (out == NULL)
        abort();
    if (proto_msg_encode(&msg, out, len, &n) != PD_OK || n != len ||
        memcmp(out, frame, len) != 0)
        abort();
    free(out);
}

/* Run frames over buf[0..len); returns bytes consumed; sets *st to the
 * status that stopped the loop. */
static size_t run_frames(const uint8_t *buf, size_t len, fz_trace_t *t,
                         pd_status_t *st)
{
    size_t off = 0;
    for (;;) {
        size_t need = 0;
        if (off == len) {
            *st = PD_OK;
            return off;
        }
        *st = proto_frame_next(buf + off, len - off, &msg, &need);
        if (*st != PD_OK) {
            if (*st == PD_INPROGRESS && need <= len - off)
                abort(); /* said "need more" but had enough */
            return off;
        }
        if (need < PROTO_HDR_LEN || need > len - off)
            abort();
        check_reencode(buf + off, need);
        if (t->n < MAX_EVENTS)
            t->ev[t->n] = (fz_event_t){ msg.hdr.type, msg.hdr.tag, need };
        t->n++;
        off += need;
    }
}

static fz_trace_t whole, chunked;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint32_t seed = data[0] * 2654435761u + 1;
    const uint8_t *stream = data + 1;
    size_t len = size - 1;
    pd_status_t st;

    memset(&whole, 0, sizeof(whole));
    memset(&chunked, 0, sizeof(chunked));
    run_frames(stream, len, &whole, &st);
    whole.end = st;

    /* chunked arrival into a connection-style buffer */
    uint8_t *buf = malloc(len ? len : 1);
    if (buf == NULL)
        abort();
    size_t have = 0, fed = 0;
    chunked.end = PD_OK;
    while (fed < len) {
        seed = seed * 1103515245u + 12345u;
        size_t chunk = 1 + (seed >> 16) % 64;
        if (chunk > len - fed)
            chunk = len - fed;
        memcpy(buf + have, stream + fed, chunk);
        have += chunk;
        fed += chunk;
        size_t used = run_frames(buf, have, &chunked, &st);
        memmove(buf, buf + used, have - used);
        have -= used;
        if (PD_IS_ERR(st))
            break; /* the connection would be dropped here */
    }
    chunked.end = st;
    if (len == 0)
        chunked.end = PD_OK;
    free(buf);

    if (whole.end != chunked.end || whole.n != chunked.n)
        abort();
    size_t n = whole.n < MAX_EVENTS ? whole.n : MAX_EVENTS;
    for (size_t i = 0; i < n; i++)
        if (whole.ev[i].type != chunked.ev[i].type ||
            whole.ev[i].tag != chunked.ev[i].tag ||
            whole.ev[i].len != chunked.ev[i].len)
            abort();
    return 0;
}
