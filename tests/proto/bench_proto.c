/* bench_proto.c - speed of the control-plane codecs and framing, printed
 * side by side with a baseline that does the least possible work on the
 * same bytes:
 *   codec:   encode / decode (+ token copy-out) vs memcpy of the frame
 *   framing: frames through two proto_conns on a socketpair (encode, send,
 *            frame, decode, dispatch) vs the same bytes written and read
 *            raw on a socketpair (the kernel's share)
 *   bench-proto [--smoke]     (--smoke: tiny counts, for the bench-smoke suite) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <event2/event.h>

#include "proto_conn.h"
#include "proto_samples.h"
#include "pd_time.h"

static volatile uint64_t sink_v;

typedef struct {
    const char *name;
    uint16_t type;
    uint32_t n_prompt;  /* prompt tokens for PREFILL_REQ / DECODE_REQ */
} bench_case_t;

static void make_case(const bench_case_t *bc, proto_msg_t *m, int32_t *tok)
{
    ps_make(bc->type, PS_MID, m);
    for (uint32_t i = 0; i < bc->n_prompt; i++)
        tok[i] = (int32_t)(i * 7919u % 128000u);
    if (bc->type == PROTO_MSG_PREFILL_REQ) {
        m->u.prefill_req.prompt.n = bc->n_prompt;
        m->u.prefill_req.prompt.v = tok;
    } else if (bc->type == PROTO_MSG_DECODE_REQ) {
        m->u.decode_req.prompt.n = bc->n_prompt;
        m->u.decode_req.prompt.v = tok;
        m->u.decode_req.kv_tokens = 0; /* a prefill handle: the prompt */
    }
}

static void bench_codec(const bench_case_t *bc, unsigned iters)
{
    static int32_t tok[1 << 16], out_tok[1 << 16];
    proto_msg_t m, d;
    size_t len = 0;

    make_case(bc, &m, tok);
    proto_msg_encode(&m, NULL, 0, &len);
    uint8_t *buf = malloc(len), *copy = malloc(len);

    uint64_t t0 = pd_now_ns();
    for (unsigned i = 0; i < iters; i++) {
        size_t n;
        if (proto_msg_encode(&m, buf, len, &n) != PD_OK)
            abort();
        sink_v += buf[n - 1];
    }
    uint64_t t_enc = pd_now_ns() - t0;

    t0 = pd_now_ns();
    for (unsigned i = 0; i < iters; i++) {
        if (proto_msg_decode(buf, len, &d) != PD_OK)
            abort();
        const proto_tokens_t *t = bc->type == PROTO_MSG_PREFILL_REQ ? &d.u.prefill_req.prompt
                                : bc->type == PROTO_MSG_DECODE_REQ ? &d.u.decode_req.prompt
                                : bc->type == PROTO_MSG_TOKENS ? &d.u.tokens.tokens : NULL;
        if (t)
            sink_v += proto_tokens_copy(t, out_tok, 1 << 16);
        sink_v += d.hdr.body_len;
    }
    uint64_t t_dec = pd_now_ns() - t0;

    t0 = pd_now_ns();
    for (unsigned i = 0; i < iters; i++) {
        memcpy(copy, buf, len);
        __asm__ __volatile__("" : : "r"(copy) : "memory");
        sink_v += copy[i % len];
    }
    uint64_t t_cpy = pd_now_ns() - t0;
    if (t_cpy == 0)
        t_cpy = 1;

    printf("%-22s %8zu B  encode %9.1f ns  decode %9.1f ns  memcpy %7.1f ns  "
           "enc/memcpy %6.1fx  dec/memcpy %6.1fx  dec %7.0f MB/s\n",
           bc->name, len, (double)t_enc / iters, (double)t_dec / iters,
           (double)t_cpy / iters, (double)t_enc / t_cpy, (double)t_dec / t_cpy,
           (double)len * iters / ((double)t_dec / 1e9) / 1e6);
    free(buf);
    free(copy);
}

/* ---- framing over a socketpair ------------------------------------------ */

typedef struct {
    unsigned got;
    int closed;
} rx_t;

static void on_tokens(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    ((rx_t *)arg)->got++;
}

static void on_close(proto_conn_t *c, pd_status_t why, void *arg)
{
    ((rx_t *)arg)->closed = 1;
}

static void bench_framing(unsigned frames)
{
    struct event_base *base = event_base_new();
    proto_conn_cbs_t rcbs = { .on_tokens = on_tokens, .on_close = on_close };
    proto_conn_cbs_t scbs = { .on_close = on_close };
    rx_t rx = { 0 }, tx = { 0 };
    proto_conn_t *a, *b;
    int fds[2];
    proto_msg_t m;
    size_t len = 0;

    ps_make(PROTO_MSG_TOKENS, PS_MID, &m);
    proto_msg_encode(&m, NULL, 0, &len);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
        abort();
    proto_conn_create(base, fds[0], &scbs, &tx, NULL, &a);
    proto_conn_create(base, fds[1], &rcbs, &rx, NULL, &b);

    uint64_t t0 = pd_now_ns();
    unsigned sent = 0;
    while (rx.got < frames) {
        while (sent < frames && proto_conn_send(a, &m) == PD_OK)
            sent++;
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    }
    uint64_t t_conn = pd_now_ns() - t0;
    proto_conn_close(a, PD_OK);
    proto_conn_close(b, PD_OK);
    while (!rx.closed || !tx.closed)
        event_base_loop(base, EVLOOP_ONCE);
    event_base_free(base);

    /* baseline: the same byte count written/read raw in 64 KiB chunks */
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
        abort();
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    fcntl(fds[1], F_SETFL, O_NONBLOCK);
    size_t total = len * frames, wr = 0, rd = 0;
    static uint8_t chunk[65536], in[65536];
    memset(chunk, 0x5a, sizeof(chunk));
    t0 = pd_now_ns();
    while (rd < total) {
        if (wr < total) {
            size_t n = total - wr < sizeof(chunk) ? total - wr : sizeof(chunk);
            ssize_t w = write(fds[0], chunk, n);
            if (w > 0)
                wr += (size_t)w;
        }
        ssize_t r = read(fds[1], in, sizeof(in));
        if (r > 0)
            rd += (size_t)r;
    }
    uint64_t t_raw = pd_now_ns() - t0;
    close(fds[0]);
    close(fds[1]);

    printf("%-22s %8zu B  proto_conn %8.0f frames/s (%6.1f MB/s)  raw socketpair "
           "%7.1f MB/s  conn/raw time %5.1fx\n",
           "framing TOKENS(1 tok)", len, frames / ((double)t_conn / 1e9),
           (double)total / ((double)t_conn / 1e9) / 1e6,
           (double)total / ((double)t_raw / 1e9) / 1e6,
           (double)t_conn / (double)(t_raw ? t_raw : 1));
}

int main(int argc, char **argv)
{
    int smoke = argc > 1 && strcmp(argv[1], "--smoke") == 0;
    unsigned scale = smoke ? 1 : 100;
    const bench_case_t cases[] = {
        { "HEARTBEAT", PROTO_MSG_HEARTBEAT, 0 },
        { "TOKENS(1 tok)", PROTO_MSG_TOKENS, 0 },
        { "FINISH", PROTO_MSG_FINISH, 0 },
        { "PREFILL_REQ(4k tok)", PROTO_MSG_PREFILL_REQ, 4096 },
        { "DECODE_REQ(32k tok)", PROTO_MSG_DECODE_REQ, 32768 },
    };

    printf("bench-proto (%s): per message, best of one run; baseline = memcpy "
           "of the same frame / raw socketpair I/O of the same bytes\n",
           smoke ? "smoke" : "full");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        unsigned iters = cases[i].n_prompt > 8192 ? 20 * scale
                       : cases[i].n_prompt ? 200 * scale : 2000 * scale;
        bench_codec(&cases[i], iters);
    }
    bench_framing(2000 * scale);
    return sink_v == 42 ? 1 : 0;
}
