/* test_proto_conn.c - framing over real sockets (socketpair and loopback
 * TCP) with libevent: 1-byte writes, many frames back to back, garbage ->
 * disconnect + counters, output cap -> PD_ERR_BUSY then on_drained, close
 * from inside a callback, close after flush, refused connect, idle timeout.
 * Waits poll the loop for a condition with a deadline; no fixed sleeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <cmocka.h>
#include <event2/event.h>

#include "proto_conn.h"
#include "proto_samples.h"
#include "pd_time.h"

typedef struct {
    struct event_base *base;
    proto_conn_t *conn;
    int n_msgs;
    int n_bad;                 /* messages that differed from expectations */
    uint32_t next_seq;
    int closed;
    pd_status_t why;
    int connected;
    int drained;
    int in_cb;
    int close_in_cb;           /* close self from inside the first callback */
    pd_status_t send_in_cb;    /* status of a send attempted after that close */
    int frame_ok;              /* proto_conn_frame matched the encoding */
    int other;
    int accepted;
} peer_t;

/* ---- loop helpers -------------------------------------------------- */

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
}

typedef int (*pred_fn)(const peer_t *p, const void *arg);

/* Run the loop until pred holds or timeout_ms passes (then fail). A 2 ms
 * tick keeps EVLOOP_ONCE from blocking past the deadline. */
static void run_until(struct event_base *base, pred_fn pred, const peer_t *p,
                      const void *arg, unsigned timeout_ms)
{
    struct timeval tv = { 0, 2000 };
    struct event *tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    uint64_t deadline = pd_now_ns() + (uint64_t)timeout_ms * PD_NS_PER_MS;

    event_add(tick, &tv);
    while (!pred(p, arg)) {
        if (pd_now_ns() > deadline) {
            event_free(tick);
            fail_msg("condition not reached in %u ms", timeout_ms);
        }
        event_base_loop(base, EVLOOP_ONCE);
    }
    event_free(tick);
}

static int is_closed(const peer_t *p, const void *arg)
{
    return p->closed;
}

static int is_connected(const peer_t *p, const void *arg)
{
    return p->connected;
}

static int has_msgs(const peer_t *p, const void *arg)
{
    return p->n_msgs >= *(const int *)arg;
}

static int is_drained(const peer_t *p, const void *arg)
{
    return p->drained > (arg ? *(const int *)arg : 0);
}

/* ---- callbacks --------------------------------------------------------- */

static void on_close(proto_conn_t *c, pd_status_t why, void *arg)
{
    peer_t *p = arg;
    p->closed++;
    p->why = why;
    if (p->in_cb)
        p->n_bad++; /* on_close must never run inside a message callback */
}

static void on_connected(proto_conn_t *c, void *arg)
{
    ((peer_t *)arg)->connected = 1;
}

static void on_drained(proto_conn_t *c, void *arg)
{
    ((peer_t *)arg)->drained++;
}

/* Expects the MID sample of the message's type; checks the raw frame. */
static void on_sample(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    peer_t *p = arg;
    proto_msg_t want;
    const uint8_t *raw;
    size_t raw_len;

    p->in_cb = 1;
    ps_make(msg->hdr.type, PS_MID, &want);
    want.hdr.flags |= msg->hdr.flags & PROTO_FLAG_AUTH; /* set by proto_conn */
    if (!ps_equal(&want, msg))
        p->n_bad++;
    if (proto_conn_frame(c, &raw, &raw_len) == PD_OK &&
        raw_len == PROTO_HDR_LEN + msg->hdr.body_len) {
        uint8_t *again = malloc(raw_len);
        size_t n;
        if (proto_msg_encode(msg, again, raw_len, &n) == PD_OK && n == raw_len &&
            memcmp(again, raw, n) == 0)
            p->frame_ok++;
        free(again);
    }
    p->n_msgs++;
    if (p->close_in_cb) {
        proto_conn_close(c, PD_ERR_CANCELED);
        p->send_in_cb = proto_conn_send(c, &want);
    }
    p->in_cb = 0;
}

/* TOKENS in sequence order. */
static void on_seq(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    peer_t *p = arg;
    if (msg->u.tokens.seq != p->next_seq)
        p->n_bad++;
    p->next_seq = msg->u.tokens.seq + 1;
    p->n_msgs++;
}

static void on_other(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    ((peer_t *)arg)->other++;
}

static proto_conn_cbs_t sample_cbs(void)
{
    proto_conn_cbs_t cbs;
    memset(&cbs, 0, sizeof(cbs));
#define CB_ALL(NAME, name, code, max) cbs.on_##name = on_sample;
    PROTO_MSG_LIST(CB_ALL)
#undef CB_ALL
    cbs.on_close = on_close;
    cbs.on_connected = on_connected;
    cbs.on_drained = on_drained;
    return cbs;
}

static uint8_t *enc(const proto_msg_t *m, size_t *len_p)
{
    size_t need = 0;
    assert_int_equal(proto_msg_encode(m, NULL, 0, &need), PD_ERR_NO_SPACE);
    uint8_t *buf = malloc(need);
    assert_int_equal(proto_msg_encode(m, buf, need, len_p), PD_OK);
    return buf;
}

static void pair(int fds[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
}

/* Close our side and let on_close run (frees the connection). */
static void finish(peer_t *p)
{
    if (!p->closed) {
        proto_conn_close(p->conn, PD_OK);
        run_until(p->base, is_closed, p, NULL, 2000);
    }
    assert_int_equal(p->closed, 1);
}

/* ---- tests ------------------------------------------------------------- */

/* Three frames written one byte at a time: each is dispatched exactly when
 * its last byte arrives, with the right contents and raw frame. */
static void test_one_byte_writes(void **state)
{
    peer_t p = { .base = event_base_new() };
    proto_conn_cbs_t cbs = sample_cbs();
    proto_stats_t sink = { 0 };
    proto_conn_opts_t opts = { .stats = &sink };
    int fds[2];
    uint16_t types[] = { PROTO_MSG_TOKENS, PROTO_MSG_HEARTBEAT, PROTO_MSG_PREFILL_REQ,
                         PROTO_MSG_HELLO };
    uint8_t *stream = NULL;
    size_t total = 0, ends[4];

    for (int i = 0; i < 4; i++) {
        proto_msg_t m;
        size_t n;
        ps_make(types[i], PS_MID, &m);
        uint8_t *b = enc(&m, &n);
        stream = realloc(stream, total + n);
        memcpy(stream + total, b, n);
        total += n;
        ends[i] = total;
        free(b);
    }
    pair(fds);
    assert_int_equal(proto_conn_create(p.base, fds[0], &cbs, &p, &opts, &p.conn), PD_OK);
    int done = 0;
    for (size_t k = 0; k < total; k++) {
        assert_int_equal(write(fds[1], stream + k, 1), 1);
        event_base_loop(p.base, EVLOOP_NONBLOCK);
        if (done < 4 && k + 1 == ends[done])
            done++;
        if (p.n_msgs != done)
            fail_msg("after byte %zu: %d messages, want %d", k, p.n_msgs, done);
    }
    assert_int_equal(p.n_bad, 0);
    assert_int_equal(p.frame_ok, 4);
    const proto_stats_t *st = proto_conn_stats(p.conn);
    assert_int_equal(st->frames_in, 4);
    assert_int_equal(st->bytes_in, total);
    assert_int_equal(sink.frames_in, 4);
    assert_int_equal(sink.conns_opened, 1);
    /* outside a callback there is no current frame */
    const uint8_t *raw;
    size_t raw_len;
    assert_int_equal(proto_conn_frame(p.conn, &raw, &raw_len), PD_ERR_BAD_INPUT);
    /* peer closes: on_close(PEER_GONE) */
    close(fds[1]);
    run_until(p.base, is_closed, &p, NULL, 2000);
    assert_int_equal(p.why, PD_ERR_PEER_GONE);
    assert_int_equal(sink.conns_closed, 1);
    free(stream);
    event_base_free(p.base);
}

static void on_accept(proto_listener_t *l, proto_conn_t *conn, void *arg)
{
    peer_t *p = arg;
    p->conn = conn;
    p->accepted++;
}

/* Loopback TCP through the helpers: many frames back to back, in order,
 * counters agree on both sides, busy sends wait for on_drained. */
static void test_tcp_back_to_back(void **state)
{
    struct event_base *base = event_base_new();
    peer_t srv = { .base = base }, cli = { .base = base };
    proto_conn_cbs_t scbs = { 0 }, ccbs = sample_cbs();
    proto_stats_t ssink = { 0 }, csink = { 0 };
    proto_conn_opts_t sopts = { .stats = &ssink };
    proto_conn_opts_t copts = { .stats = &csink, .out_cap = 64 * 1024,
                                .connect_timeout_ns = 5 * PD_NS_PER_S };
    proto_listener_t *l;
    char addr[64];
    const int N = 20000;

    scbs.on_tokens = on_seq;
    scbs.on_close = on_close;
    assert_int_equal(proto_listener_create(base, "127.0.0.1:0", on_accept, &scbs,
                                           &srv, &sopts, &l), PD_OK);
    assert_int_not_equal(proto_listener_port(l), 0);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", proto_listener_port(l));
    assert_int_equal(proto_conn_connect(base, addr, &ccbs, &cli, &copts, &cli.conn),
                     PD_OK);
    run_until(base, is_connected, &cli, NULL, 5000);

    proto_msg_t m;
    ps_make(PROTO_MSG_TOKENS, PS_MID, &m);
    int busy = 0;
    for (int i = 0; i < N;) {
        m.u.tokens.seq = (uint32_t)i;
        pd_status_t st = proto_conn_send(cli.conn, &m);
        if (st == PD_ERR_BUSY) {
            busy++;
            assert_true(proto_conn_is_slow(cli.conn));
            int before = cli.drained;
            run_until(base, is_drained, &cli, &before, 5000);
            continue;
        }
        assert_int_equal(st, PD_OK);
        i++;
    }
    run_until(base, has_msgs, &srv, &N, 10000);
    assert_int_equal(srv.accepted, 1);
    assert_int_equal(srv.n_bad, 0);
    assert_int_equal(srv.n_msgs, N);
    assert_true(busy > 0);                /* 20000 frames > 64 KiB cap */
    assert_int_equal(cli.drained, busy);
    assert_int_equal(csink.send_busy, (uint64_t)busy);
    assert_int_equal(csink.frames_out, (uint64_t)N);
    assert_int_equal(ssink.frames_in, (uint64_t)N);
    assert_int_equal(ssink.bytes_in, csink.bytes_out);
    assert_int_equal(ssink.proto_disconnects, 0);
    assert_string_not_equal(proto_conn_peer(srv.conn), "local");

    /* server replies, client's per-type table dispatches it */
    proto_msg_t hb;
    ps_make(PROTO_MSG_HEARTBEAT, PS_MID, &hb);
    assert_int_equal(proto_conn_send(srv.conn, &hb), PD_OK);
    int one = 1;
    run_until(base, has_msgs, &cli, &one, 5000);
    assert_int_equal(cli.n_bad, 0);

    /* client closes: server sees PEER_GONE */
    finish(&cli);
    run_until(base, is_closed, &srv, NULL, 5000);
    assert_int_equal(srv.why, PD_ERR_PEER_GONE);
    proto_listener_destroy(l);
    event_base_free(base);
}

typedef struct {
    const char *name;
    pd_status_t want;
} garbage_case_t;

/* Garbage of several kinds: the connection is dropped, the status is
 * reported to on_close and counted, the peer sees EOF. */
static void test_garbage_disconnects(void **state)
{
    garbage_case_t cases[] = {
        { "bad magic", PD_ERR_BAD_MAGIC },
        { "bad version", PD_ERR_BAD_VERSION },
        { "unknown type", PD_ERR_BAD_TYPE },
        { "reserved", PD_ERR_RESERVED },
        { "oversized body", PD_ERR_TOO_BIG },
        { "bad body", PD_ERR_BAD_INPUT },
        { "truncated body", PD_ERR_TRUNCATED },
    };
    proto_stats_t sink = { 0 };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        peer_t p = { .base = event_base_new() };
        proto_conn_cbs_t cbs = sample_cbs();
        proto_conn_opts_t opts = { .stats = &sink };
        proto_msg_t m;
        size_t len;
        int fds[2];

        ps_make(PROTO_MSG_RELEASE, PS_MID, &m);
        uint8_t *b = enc(&m, &len);
        switch (i) {
        case 0: b[0] = 'X'; break;
        case 1: b[4] = 9; break;
        case 2: b[6] = 99; break;
        case 3: b[30] = 1; break;
        case 4: b[12] = 0xff; b[13] = 0xff; b[14] = 0xff; break;
        case 5: b[PROTO_HDR_LEN + 3] = 0; break;           /* NUL in id */
        case 6: b[PROTO_HDR_LEN] = 60; break;              /* id runs past body */
        }
        pair(fds);
        assert_int_equal(proto_conn_create(p.base, fds[0], &cbs, &p, &opts, &p.conn),
                         PD_OK);
        /* one good frame first: it is dispatched, then the bad one */
        ps_make(PROTO_MSG_HEARTBEAT, PS_MID, &m);
        size_t glen;
        uint8_t *good = enc(&m, &glen);
        assert_int_equal(write(fds[1], good, glen), (ssize_t)glen);
        assert_int_equal(write(fds[1], b, len), (ssize_t)len);
        run_until(p.base, is_closed, &p, NULL, 2000);
        if (p.why != cases[i].want)
            fail_msg("%s: closed with %s", cases[i].name, pd_status_name(p.why));
        assert_int_equal(p.n_msgs, 1);
        assert_int_equal(sink.proto_errors[pd_status_index(cases[i].want)], 1);
        assert_int_equal(sink.proto_disconnects, i + 1);
        /* our side is closed: the peer reads EOF */
        char c;
        fcntl(fds[1], F_SETFL, 0);
        assert_int_equal(read(fds[1], &c, 1), 0);
        close(fds[1]);
        free(good);
        free(b);
        event_base_free(p.base);
    }
}

/* A session frame as a peer with `key` would send it as its seq-th: the
 * sample with PROTO_FLAG_AUTH, then the tag. */
static uint8_t *tagged(uint16_t type, const uint8_t key[PROTO_AUTH_TAG_LEN], uint64_t seq,
                       size_t *len_p)
{
    proto_msg_t m;
    size_t len;
    ps_make(type, PS_MID, &m);
    m.hdr.flags |= PROTO_FLAG_AUTH;
    uint8_t *b = enc(&m, &len);
    b = realloc(b, len + PROTO_AUTH_TAG_LEN);
    assert_non_null(b);
    proto_auth_frame_tag(key, seq, b, len, b + len);
    *len_p = len + PROTO_AUTH_TAG_LEN;
    return b;
}

/* Authenticated connections: in-order tagged frames pass; a replayed,
 * reordered, untagged, foreign-session or tampered frame closes with
 * PD_ERR_AUTH before anything of it is dispatched. Two proto_conns with
 * matching keys talk both ways. */
static void test_auth_frames(void **state)
{
    proto_auth_secret_t sec;
    static const char hex[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    assert_int_equal(proto_auth_secret_parse((const uint8_t *)hex, 64, &sec), PD_OK);
    uint8_t ch[PROTO_AUTH_NONCE_LEN], hn[PROTO_AUTH_NONCE_LEN];
    proto_auth_nonce(ch);
    proto_auth_nonce(hn);
    proto_auth_keys_t acc, con, other;
    proto_auth_session_keys(&sec, ch, hn, true, &acc);
    proto_auth_session_keys(&sec, ch, hn, false, &con);
    hn[0] ^= 1;
    proto_auth_session_keys(&sec, ch, hn, false, &other);

    enum { GOOD, REPLAY, REORDER, UNTAGGED, FOREIGN, TAMPER, N_CASES };
    for (int c = 0; c < N_CASES; c++) {
        peer_t p = { .base = event_base_new() };
        proto_conn_cbs_t cbs = sample_cbs();
        int fds[2];
        pair(fds);
        assert_int_equal(proto_conn_create(p.base, fds[0], &cbs, &p, NULL, &p.conn), PD_OK);
        proto_conn_set_keys(p.conn, &acc);
        assert_true(proto_conn_is_authenticated(p.conn));
        size_t l0, l1;
        uint8_t *f0 = tagged(PROTO_MSG_TOKENS, con.send, 0, &l0);
        uint8_t *f1 = tagged(PROTO_MSG_HEARTBEAT, con.send, 1, &l1);
        int want_msgs = 0;
        switch (c) {
        case GOOD:
            assert_int_equal(write(fds[1], f0, l0), (ssize_t)l0);
            assert_int_equal(write(fds[1], f1, l1), (ssize_t)l1);
            want_msgs = 2;
            break;
        case REPLAY:     /* the same frame twice */
            assert_int_equal(write(fds[1], f0, l0), (ssize_t)l0);
            assert_int_equal(write(fds[1], f0, l0), (ssize_t)l0);
            want_msgs = 1;
            break;
        case REORDER:    /* seq 1 before seq 0 */
            assert_int_equal(write(fds[1], f1, l1), (ssize_t)l1);
            break;
        case UNTAGGED: { /* a valid plain frame */
            proto_msg_t m;
            size_t l;
            ps_make(PROTO_MSG_TOKENS, PS_MID, &m);
            uint8_t *b = enc(&m, &l);
            assert_int_equal(write(fds[1], b, l), (ssize_t)l);
            free(b);
            break;
        }
        case FOREIGN: {  /* tagged with another session's key */
            size_t l;
            uint8_t *b = tagged(PROTO_MSG_TOKENS, other.send, 0, &l);
            assert_int_equal(write(fds[1], b, l), (ssize_t)l);
            free(b);
            break;
        }
        case TAMPER:     /* header tag field changed after tagging */
            f0[16] ^= 1;
            assert_int_equal(write(fds[1], f0, l0), (ssize_t)l0);
            break;
        }
        if (c == GOOD) {
            run_until(p.base, has_msgs, &p, &want_msgs, 2000);
            /* and back: our replies are tagged with acc.send, seq from 0 */
            proto_msg_t m;
            ps_make(PROTO_MSG_CANCEL, PS_MID, &m);
            assert_int_equal(proto_conn_send(p.conn, &m), PD_OK);
            event_base_loop(p.base, EVLOOP_NONBLOCK);
            uint8_t rb[4096];
            fcntl(fds[1], F_SETFL, 0);
            ssize_t n = read(fds[1], rb, sizeof(rb));
            assert_true(n > (ssize_t)(PROTO_HDR_LEN + PROTO_AUTH_TAG_LEN));
            size_t fl = (size_t)n - PROTO_AUTH_TAG_LEN;
            assert_int_equal(rb[8] & PROTO_FLAG_AUTH, PROTO_FLAG_AUTH);
            assert_int_equal(proto_auth_frame_check(con.recv, 0, rb, fl, rb + fl), PD_OK);
            assert_int_equal(proto_auth_frame_check(con.recv, 1, rb, fl, rb + fl), PD_ERR_AUTH);
            assert_int_equal(p.closed, 0);
            finish(&p);
        } else {
            run_until(p.base, is_closed, &p, NULL, 2000);
            if (p.why != PD_ERR_AUTH)
                fail_msg("case %d: closed with %s", c, pd_status_name(p.why));
        }
        assert_int_equal(p.n_msgs, want_msgs);
        assert_int_equal(p.n_bad, 0);
        close(fds[1]);
        free(f0);
        free(f1);
        event_base_free(p.base);
    }

    /* Two proto_conns, keys on both ends: 200 frames each way arrive. */
    peer_t a = { .base = event_base_new() }, b = { .base = a.base };
    proto_conn_cbs_t cbs = sample_cbs();
    int fds[2];
    pair(fds);
    assert_int_equal(proto_conn_create(a.base, fds[0], &cbs, &a, NULL, &a.conn), PD_OK);
    assert_int_equal(proto_conn_create(b.base, fds[1], &cbs, &b, NULL, &b.conn), PD_OK);
    proto_conn_set_keys(a.conn, &acc);
    proto_conn_set_keys(b.conn, &con);
    proto_msg_t m;
    ps_make(PROTO_MSG_PREFILL_DONE, PS_MID, &m);
    for (int i = 0; i < 200; i++) {
        assert_int_equal(proto_conn_send(a.conn, &m), PD_OK);
        assert_int_equal(proto_conn_send(b.conn, &m), PD_OK);
    }
    int want = 200;
    run_until(a.base, has_msgs, &a, &want, 5000);
    run_until(b.base, has_msgs, &b, &want, 5000);
    assert_int_equal(a.n_bad + b.n_bad, 0);
    assert_int_equal(a.frame_ok, 200);
    finish(&a);
    finish(&b);
    event_base_free(a.base);
}

/* opts.body_max: a body over it is refused from its header alone (before it
 * is buffered), PD_ERR_TOO_BIG; set_body_max(0) lifts it. */
static void test_body_max(void **state)
{
    peer_t p = { .base = event_base_new() };
    proto_conn_cbs_t cbs = sample_cbs();
    proto_conn_opts_t opts = { .body_max = 64 };
    int fds[2];
    pair(fds);
    assert_int_equal(proto_conn_create(p.base, fds[0], &cbs, &p, &opts, &p.conn), PD_OK);
    proto_msg_t m;
    size_t len;
    ps_make(PROTO_MSG_HEARTBEAT, PS_MID, &m);        /* 48 bytes: fits */
    uint8_t *hb = enc(&m, &len);
    assert_int_equal(write(fds[1], hb, len), (ssize_t)len);
    int one = 1;
    run_until(p.base, has_msgs, &p, &one, 2000);
    ps_make(PROTO_MSG_DECODE_REQ, PS_MID, &m);
    uint8_t *big = enc(&m, &len);
    assert_true(len > PROTO_HDR_LEN + 64);
    assert_int_equal(write(fds[1], big, PROTO_HDR_LEN), PROTO_HDR_LEN); /* header only */
    run_until(p.base, is_closed, &p, NULL, 2000);
    assert_int_equal(p.why, PD_ERR_TOO_BIG);
    close(fds[1]);
    free(hb);
    free(big);
    event_base_free(p.base);
}

/* Output cap: a peer that does not read makes sends fail with PD_ERR_BUSY;
 * after it reads everything, on_drained fires and sends work again; what
 * arrived is exactly the frames that were accepted. */
static void test_output_cap(void **state)
{
    peer_t p = { .base = event_base_new() };
    proto_conn_cbs_t cbs = sample_cbs();
    proto_stats_t sink = { 0 };
    proto_conn_opts_t opts = { .stats = &sink, .out_cap = 100 * 1024 };
    proto_msg_t m;
    int fds[2], small = 4096;

    pair(fds);
    setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    assert_int_equal(proto_conn_create(p.base, fds[0], &cbs, &p, &opts, &p.conn), PD_OK);
    ps_make(PROTO_MSG_TOKENS, PS_MAX, &m); /* ~82 KiB per frame */
    int sent = 0;
    pd_status_t st;
    while ((st = proto_conn_send(p.conn, &m)) == PD_OK) {
        sent++;
        event_base_loop(p.base, EVLOOP_NONBLOCK);
        assert_true(sent < 100);
    }
    assert_int_equal(st, PD_ERR_BUSY);
    assert_true(proto_conn_out_len(p.conn) > opts.out_cap);
    assert_true(proto_conn_is_slow(p.conn));
    assert_int_equal(sink.send_busy, 1);
    assert_int_equal(proto_conn_send(p.conn, &m), PD_ERR_BUSY);
    assert_int_equal(sink.send_busy, 2);

    /* the peer reads and parses everything */
    size_t cap = 4u << 20, have = 0;
    uint8_t *in = malloc(cap);
    int frames = 0;
    fcntl(fds[1], F_SETFL, O_NONBLOCK);
    uint64_t deadline = pd_now_ns() + 5 * PD_NS_PER_S;
    while (frames < sent) {
        assert_true(pd_now_ns() < deadline);
        ssize_t r = read(fds[1], in + have, cap - have);
        if (r > 0)
            have += (size_t)r;
        proto_hdr_t h;
        size_t need;
        while (proto_frame_check(in, have, &h, &need) == PD_OK) {
            proto_msg_t d;
            assert_int_equal(proto_msg_decode(in, need, &d), PD_OK);
            assert_int_equal(d.u.tokens.tokens.n, PROTO_MAX_TOKENS_MSG);
            memmove(in, in + need, have - need);
            have -= need;
            frames++;
        }
        event_base_loop(p.base, EVLOOP_NONBLOCK);
    }
    free(in);
    assert_int_equal(frames, sent);
    run_until(p.base, is_drained, &p, NULL, 2000);
    assert_int_equal(p.drained, 1);
    assert_false(proto_conn_is_slow(p.conn));
    assert_int_equal(proto_conn_send(p.conn, &m), PD_OK);
    assert_int_equal(sink.frames_out, (uint64_t)sent + 1);
    finish(&p);
    close(fds[1]);
    event_base_free(p.base);
}

/* A callback closes its own connection: later frames are not dispatched,
 * sends fail with SHUTDOWN, on_close runs once, after the callback. */
static void test_close_in_callback(void **state)
{
    peer_t p = { .base = event_base_new(), .close_in_cb = 1 };
    proto_conn_cbs_t cbs = sample_cbs();
    proto_msg_t m;
    size_t len;
    int fds[2];

    pair(fds);
    assert_int_equal(proto_conn_create(p.base, fds[0], &cbs, &p, NULL, &p.conn), PD_OK);
    ps_make(PROTO_MSG_FINISH, PS_MID, &m);
    uint8_t *b = enc(&m, &len);
    for (int i = 0; i < 3; i++)
        assert_int_equal(write(fds[1], b, len), (ssize_t)len);
    run_until(p.base, is_closed, &p, NULL, 2000);
    assert_int_equal(p.n_msgs, 1);
    assert_int_equal(p.closed, 1);
    assert_int_equal(p.why, PD_ERR_CANCELED);
    assert_int_equal(p.send_in_cb, PD_ERR_SHUTDOWN);
    assert_int_equal(p.n_bad, 0);
    /* a few more loop turns: no second on_close */
    for (int i = 0; i < 5; i++)
        event_base_loop(p.base, EVLOOP_NONBLOCK);
    assert_int_equal(p.closed, 1);
    free(b);
    close(fds[1]);
    event_base_free(p.base);
}

static void on_hello_reject(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    proto_msg_t rej;
    ps_make(PROTO_MSG_REGISTER_REJECT, PS_MID, &rej);
    rej.hdr.tag = msg->hdr.tag; /* same as the sample's tag */
    ((peer_t *)arg)->n_msgs++;
    if (proto_conn_send(c, &rej) != PD_OK)
        ((peer_t *)arg)->n_bad++;
    proto_conn_close_after_flush(c, PD_ERR_AUTH);
}

/* Server rejects a HELLO: the reject reaches the client before the close. */
static void test_reject_then_close(void **state)
{
    struct event_base *base = event_base_new();
    peer_t srv = { .base = base }, cli = { .base = base };
    proto_conn_cbs_t scbs = { 0 }, ccbs = sample_cbs();
    proto_listener_t *l;
    char addr[64];

    scbs.on_hello = on_hello_reject;
    scbs.on_close = on_close;
    assert_int_equal(proto_listener_create(base, ":0", on_accept, &scbs, &srv, NULL, &l),
                     PD_OK);
    snprintf(addr, sizeof(addr), "localhost:%u", proto_listener_port(l));
    assert_int_equal(proto_conn_connect(base, addr, &ccbs, &cli, NULL, &cli.conn), PD_OK);
    proto_msg_t hello;
    ps_make(PROTO_MSG_HELLO, PS_MID, &hello);
    /* queued before the connect completes */
    assert_int_equal(proto_conn_send(cli.conn, &hello), PD_OK);
    run_until(base, is_closed, &cli, NULL, 5000);
    assert_int_equal(cli.connected, 1);
    assert_int_equal(cli.n_msgs, 1); /* the REGISTER_REJECT, checked by on_sample */
    assert_int_equal(cli.n_bad, 0);
    assert_int_equal(cli.why, PD_ERR_PEER_GONE);
    run_until(base, is_closed, &srv, NULL, 5000);
    assert_int_equal(srv.why, PD_ERR_AUTH);
    assert_int_equal(srv.n_bad, 0);
    proto_listener_destroy(l);
    event_base_free(base);
}

/* Peer never reads: close_after_flush gives up after flush_timeout_ns. */
static void test_flush_timeout(void **state)
{
    peer_t p = { .base = event_base_new() };
    proto_conn_cbs_t cbs = sample_cbs();
    proto_conn_opts_t opts = { .flush_timeout_ns = 100 * PD_NS_PER_MS };
    proto_msg_t m;
    int fds[2], small = 4096;

    pair(fds);
    setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    assert_int_equal(proto_conn_create(p.base, fds[0], &cbs, &p, &opts, &p.conn), PD_OK);
    ps_make(PROTO_MSG_TOKENS, PS_MAX, &m);
    assert_int_equal(proto_conn_send(p.conn, &m), PD_OK);
    uint64_t t0 = pd_now_ns();
    proto_conn_close_after_flush(p.conn, PD_ERR_AUTH);
    assert_true(proto_conn_is_closing(p.conn));
    assert_int_equal(proto_conn_send(p.conn, &m), PD_ERR_SHUTDOWN);
    run_until(p.base, is_closed, &p, NULL, 3000);
    assert_int_equal(p.why, PD_ERR_TIMED_OUT);
    assert_true(pd_now_ns() - t0 >= 90 * PD_NS_PER_MS);
    close(fds[1]);
    event_base_free(p.base);
}

static int accept_errors_at_least(const peer_t *p, const void *arg)
{
    const proto_stats_t *sink = arg;
    return sink->accept_errors >= 2;
}

static int has_accepted(const peer_t *p, const void *arg)
{
    return p->accepted > 0;
}

/* Out of fds: accept fails, the listener pauses (no busy loop) and
 * accepts the pending connection once fds are available again. */
static void test_accept_emfile(void **state)
{
    struct event_base *base = event_base_new();
    peer_t srv = { .base = base };
    proto_conn_cbs_t scbs = { .on_close = on_close };
    proto_stats_t sink = { 0 };
    proto_conn_opts_t opts = { .stats = &sink };
    proto_listener_t *l;
    struct rlimit old, low;
    struct sockaddr_in sin = { .sin_family = AF_INET };

    assert_int_equal(proto_listener_create(base, "127.0.0.1:0", on_accept, &scbs, &srv,
                                           &opts, &l), PD_OK);
    int cli = socket(AF_INET, SOCK_STREAM, 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sin.sin_port = htons(proto_listener_port(l));
    assert_int_equal(connect(cli, (struct sockaddr *)&sin, sizeof(sin)), 0);

    /* no fd can be created from here on */
    int next = dup(0);
    assert_true(next >= 0);
    close(next);
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = (rlim_t)next;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    uint64_t t0 = pd_now_ns();
    run_until(base, accept_errors_at_least, &srv, &sink, 3000);
    uint64_t dt = pd_now_ns() - t0;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    assert_int_equal(srv.accepted, 0);
    assert_true(dt >= 90 * PD_NS_PER_MS); /* paused between attempts */

    run_until(base, has_accepted, &srv, NULL, 3000);
    assert_int_equal(sink.conns_opened, 1);
    close(cli);
    run_until(base, is_closed, &srv, NULL, 3000);
    assert_int_equal(srv.why, PD_ERR_PEER_GONE);
    proto_listener_destroy(l);
    event_base_free(base);
}

static void test_connect_refused(void **state)
{
    struct event_base *base = event_base_new();
    peer_t cli = { .base = base };
    proto_conn_cbs_t cbs = sample_cbs();
    struct sockaddr_in sin = { .sin_family = AF_INET };
    socklen_t sl = sizeof(sin);
    char addr[64];

    /* a port that was free a moment ago and has no listener */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(s, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(getsockname(s, (struct sockaddr *)&sin, &sl), 0);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", ntohs(sin.sin_port));
    close(s);
    pd_status_t st = proto_conn_connect(base, addr, &cbs, &cli, NULL, &cli.conn);
    if (st == PD_OK) {
        run_until(base, is_closed, &cli, NULL, 5000);
        assert_int_equal(cli.why, PD_ERR_IO);
        assert_int_equal(cli.connected, 0);
    } else {
        assert_int_equal(st, PD_ERR_IO);
    }
    assert_int_equal(proto_conn_connect(base, "not-an-address:1", &cbs, &cli, NULL,
                                        &cli.conn), PD_ERR_BAD_INPUT);
    event_base_free(base);
}

static void test_idle_timeout_and_unhandled(void **state)
{
    peer_t p = { .base = event_base_new() };
    proto_conn_cbs_t cbs = { .on_close = on_close };
    proto_conn_opts_t opts = { .idle_timeout_ns = 100 * PD_NS_PER_MS };
    proto_msg_t m;
    size_t len;
    int fds[2];

    pair(fds);
    assert_int_equal(proto_conn_create(p.base, fds[0], &cbs, &p, &opts, &p.conn), PD_OK);
    ps_make(PROTO_MSG_CANCEL, PS_MID, &m);
    uint8_t *b = enc(&m, &len);
    assert_int_equal(write(fds[1], b, len), (ssize_t)len);
    uint64_t t0 = pd_now_ns();
    run_until(p.base, is_closed, &p, NULL, 3000);
    assert_int_equal(p.why, PD_ERR_TIMED_OUT);
    assert_true(pd_now_ns() - t0 >= 90 * PD_NS_PER_MS);
    free(b);
    close(fds[1]);
    event_base_free(p.base);

    /* unhandled type is counted; on_other catches types without a callback */
    peer_t q = { .base = event_base_new() };
    proto_conn_cbs_t cbs2 = { .on_close = on_close };
    pair(fds);
    assert_int_equal(proto_conn_create(q.base, fds[0], &cbs2, &q, NULL, &q.conn), PD_OK);
    ps_make(PROTO_MSG_CANCEL, PS_MID, &m);
    b = enc(&m, &len);
    assert_int_equal(write(fds[1], b, len), (ssize_t)len);
    while (proto_conn_stats(q.conn)->unhandled == 0)
        event_base_loop(q.base, EVLOOP_ONCE);
    assert_int_equal(proto_conn_stats(q.conn)->frames_in, 1);
    finish(&q);
    close(fds[1]);
    event_base_free(q.base);

    peer_t r = { .base = event_base_new() };
    proto_conn_cbs_t cbs3 = { .on_close = on_close, .on_other = on_other };
    pair(fds);
    assert_int_equal(proto_conn_create(r.base, fds[0], &cbs3, &r, NULL, &r.conn), PD_OK);
    assert_int_equal(write(fds[1], b, len), (ssize_t)len);
    while (r.other == 0)
        event_base_loop(r.base, EVLOOP_ONCE);
    assert_int_equal(proto_conn_stats(r.conn)->unhandled, 0);
    finish(&r);
    close(fds[1]);
    free(b);
    event_base_free(r.base);
}

/* Outgoing connection with connect and idle timeouts: connects, then the
 * idle timeout (not cleared by the connect) closes it. */
static void test_connect_idle_timeout(void **state)
{
    struct event_base *base = event_base_new();
    peer_t srv = { .base = base }, cli = { .base = base };
    proto_conn_cbs_t scbs = { .on_close = on_close }, ccbs = sample_cbs();
    proto_conn_opts_t copts = { .idle_timeout_ns = 100 * PD_NS_PER_MS,
                                .connect_timeout_ns = 2 * PD_NS_PER_S };
    proto_listener_t *l;
    char addr[64];

    assert_int_equal(proto_listener_create(base, "127.0.0.1:0", on_accept, &scbs, &srv,
                                           NULL, &l), PD_OK);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", proto_listener_port(l));
    assert_int_equal(proto_conn_connect(base, addr, &ccbs, &cli, &copts, &cli.conn),
                     PD_OK);
    run_until(base, is_connected, &cli, NULL, 3000);
    uint64_t t0 = pd_now_ns();
    run_until(base, is_closed, &cli, NULL, 3000);
    assert_int_equal(cli.why, PD_ERR_TIMED_OUT);
    assert_true(pd_now_ns() - t0 >= 50 * PD_NS_PER_MS);
    run_until(base, is_closed, &srv, NULL, 3000);
    assert_int_equal(srv.why, PD_ERR_PEER_GONE);
    proto_listener_destroy(l);
    event_base_free(base);
}

static void test_addr_parse(void **state)
{
    struct sockaddr_storage ss;
    int len;
    struct sockaddr_in sin;

    assert_int_equal(proto_addr_parse("127.0.0.1:5000", &ss, &len), PD_OK);
    assert_int_equal(proto_addr_parse("5000", &ss, &len), PD_OK);
    memcpy(&sin, &ss, sizeof(sin));
    assert_int_equal(sin.sin_family, AF_INET);
    assert_int_equal(ntohs(sin.sin_port), 5000);
    assert_int_equal(ntohl(sin.sin_addr.s_addr), INADDR_LOOPBACK);
    assert_int_equal(proto_addr_parse(":7", &ss, &len), PD_OK);
    assert_int_equal(proto_addr_parse("localhost:7", &ss, &len), PD_OK);
    assert_int_equal(proto_addr_parse("[::1]:7", &ss, &len), PD_OK);
    assert_int_equal(ss.ss_family, AF_INET6);
    assert_int_equal(proto_addr_parse("example.com:80", &ss, &len), PD_ERR_BAD_INPUT);
    assert_int_equal(proto_addr_parse("", &ss, &len), PD_ERR_BAD_INPUT);
    assert_int_equal(proto_addr_parse(NULL, &ss, &len), PD_ERR_BAD_INPUT);
    assert_int_equal(proto_addr_parse("1.2.3.4:99999", &ss, &len), PD_ERR_BAD_INPUT);
}

static void test_stat_descs(void **state)
{
    int n = 0;
    for (const proto_stat_desc_t *d = proto_stat_descs; d->name; d++, n++) {
        assert_true(d->offset + sizeof(uint64_t) <= sizeof(proto_stats_t));
        assert_true(strlen(d->desc) > 0);
    }
    assert_int_equal(n, 10);
    assert_string_equal(proto_stat_descs[0].name, "frames_in");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_byte_writes),
        cmocka_unit_test(test_tcp_back_to_back),
        cmocka_unit_test(test_garbage_disconnects),
        cmocka_unit_test(test_auth_frames),
        cmocka_unit_test(test_body_max),
        cmocka_unit_test(test_output_cap),
        cmocka_unit_test(test_close_in_callback),
        cmocka_unit_test(test_reject_then_close),
        cmocka_unit_test(test_flush_timeout),
        cmocka_unit_test(test_accept_emfile),
        cmocka_unit_test(test_connect_refused),
        cmocka_unit_test(test_idle_timeout_and_unhandled),
        cmocka_unit_test(test_connect_idle_timeout),
        cmocka_unit_test(test_addr_parse),
        cmocka_unit_test(test_stat_descs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
