/* Unit tests for common/pd_httpc: the incremental HTTP/1.1 response parser
 * (split feeds at every byte boundary, chunked, strict framing refused,
 * caps), the SSE parser, and the blocking request helper against a
 * one-shot server thread (exact request bytes, chunked reply, deadline,
 * early close). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "pd_httpc.h"
#include "pd_time.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- HTTP ---------------------------------------------------------------- */

typedef struct {
    char buf[4096];
    size_t len;
} sink_t;

static void sink(void *arg, const char *d, size_t n)
{
    sink_t *s = arg;
    assert_true(s->len + n < sizeof(s->buf));
    memcpy(s->buf + s->len, d, n);
    s->len += n;
    s->buf[s->len] = '\0';
}

static void feed_split(const char *resp, size_t step, pd_httpc_resp_t *r,
                       sink_t *s, pd_status_t want)
{
    size_t len = strlen(resp), off = 0;
    pd_status_t st = PD_OK;

    pd_httpc_resp_init(r, 1u << 20);
    memset(s, 0, sizeof(*s));
    while (off < len && st == PD_OK) {
        size_t n = len - off < step ? len - off : step;
        st = pd_httpc_resp_feed(r, resp + off, n, sink, s, NULL);
        off += n;
    }
    assert_int_equal(st, want);
}

static void test_http_chunked(void **state)
{
    const char *resp =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
        "6\r\ndata: \r\n"
        "a;ext=1\r\nhello\n\nxyz\r\n"
        "0\r\nX-Trailer: 1\r\n\r\n";
    size_t steps[] = { 1, 2, 7, 1000 }, i;
    pd_httpc_resp_t *r = malloc(sizeof(*r));
    sink_t *s = malloc(sizeof(*s));

    for (i = 0; i < 4; i++) {
        feed_split(resp, steps[i], r, s, PD_OK);
        assert_true(r->headers_done && r->complete && r->chunked);
        assert_int_equal(r->status, 200);
        assert_false(r->conn_close);
        assert_string_equal(s->buf, "data: hello\n\nxyz");
    }
    free(r);
    free(s);
}

static void test_http_length_close_interim(void **state)
{
    pd_httpc_resp_t *r = malloc(sizeof(*r));
    sink_t *s = malloc(sizeof(*s));
    size_t used = 0;
    const char *lenresp =
        "HTTP/1.1 400 Bad Request\r\ncontent-length: 5\r\nConnection: close\r\n\r\n"
        "{\"a\":EXTRA";

    pd_httpc_resp_init(r, 1u << 20);
    memset(s, 0, sizeof(*s));
    assert_int_equal(pd_httpc_resp_feed(r, lenresp, strlen(lenresp), sink, s, &used),
                     PD_OK);
    assert_true(r->complete && r->conn_close);
    assert_int_equal(r->status, 400);
    assert_string_equal(s->buf, "{\"a\":");
    assert_int_equal(used, strlen(lenresp) - 5);

    feed_split("HTTP/1.0 200 OK\r\n\r\nuntil close", 3, r, s, PD_OK);
    assert_false(r->complete);
    assert_true(r->conn_close);
    assert_true(pd_httpc_resp_eof(r));
    assert_string_equal(s->buf, "until close");

    feed_split("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
               5, r, s, PD_OK);
    assert_true(r->complete);
    assert_int_equal(r->status, 204);

    /* Chunked body cut short: EOF does not complete it. */
    feed_split("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", 4,
               r, s, PD_OK);
    assert_false(pd_httpc_resp_eof(r));
    free(r);
    free(s);
}

static void test_http_malformed(void **state)
{
    pd_httpc_resp_t *r = malloc(sizeof(*r));
    sink_t *s = malloc(sizeof(*s));
    char *big;

    feed_split("HTTP/2 200 OK\r\n\r\n", 100, r, s, PD_ERR_BAD_INPUT);
    feed_split("HTTP/1.1 20 OK\r\n\r\n", 100, r, s, PD_ERR_BAD_INPUT);
    feed_split("HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", 100, r, s, PD_ERR_BAD_INPUT);
    feed_split("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", 100, r, s,
               PD_ERR_BAD_INPUT);
    feed_split("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
               100, r, s, PD_ERR_BAD_INPUT);
    feed_split("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", 100, r, s,
               PD_ERR_BAD_INPUT);
    feed_split("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 100,
               r, s, PD_ERR_BAD_INPUT);
    feed_split("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n",
               100, r, s, PD_ERR_BAD_INPUT);
    big = malloc(PD_HTTPC_LINE_MAX + 64);
    strcpy(big, "HTTP/1.1 200 OK\r\nX: ");
    memset(big + strlen(big), 'a', PD_HTTPC_LINE_MAX);
    big[PD_HTTPC_LINE_MAX + 20] = '\0';
    feed_split(big, 4096, r, s, PD_ERR_TOO_BIG);
    free(big);
    free(r);
    free(s);
}

/* ---- SSE ----------------------------------------------------------------- */

typedef struct {
    int n;
    char ev[8][64];
} events_t;

static void on_event(void *arg, const char *data, size_t len)
{
    events_t *e = arg;
    assert_int_equal(strlen(data), len);
    assert_true(e->n < 8 && len < 64);
    strcpy(e->ev[e->n++], data);
}

static void test_sse(void **state)
{
    const char *stream =
        ": keep-alive\n\n"
        "data: {\"a\":1}\n\n"
        "data:nospace\r\n\r\n"
        "event: x\nid: 7\ndata: one\ndata: two\n\n"
        "data\n\n"
        "data: [DONE]\r\r"
        "data: pending-without-blank-line\n";
    size_t steps[] = { 1, 3, 1000 }, i, off;

    for (i = 0; i < 3; i++) {
        pd_sse_t s;
        events_t e;

        memset(&e, 0, sizeof(e));
        pd_sse_init(&s);
        for (off = 0; off < strlen(stream); off += steps[i]) {
            size_t n = strlen(stream) - off;
            if (n > steps[i])
                n = steps[i];
            assert_int_equal(pd_sse_feed(&s, stream + off, n, on_event, &e), PD_OK);
        }
        assert_int_equal(e.n, 5);
        assert_string_equal(e.ev[0], "{\"a\":1}");
        assert_string_equal(e.ev[1], "nospace");
        assert_string_equal(e.ev[2], "one\ntwo");
        assert_string_equal(e.ev[3], "");
        assert_string_equal(e.ev[4], "[DONE]");
        pd_sse_fini(&s);
    }
}

static void test_sse_cap(void **state)
{
    pd_sse_t s;
    events_t e;
    char *chunk = malloc(65536);
    pd_status_t st = PD_OK;
    int i;

    memset(&e, 0, sizeof(e));
    memset(chunk, 'x', 65536);
    pd_sse_init(&s);
    st = pd_sse_feed(&s, "data: ", 6, on_event, &e);
    for (i = 0; i < 40 && st == PD_OK; i++)
        st = pd_sse_feed(&s, chunk, 65536, on_event, &e);
    assert_int_equal(st, PD_ERR_TOO_BIG);
    pd_sse_fini(&s);
    free(chunk);
}

/* ---- every byte boundary, strict framing, caps -------------------------- */

/* Feed resp whole, then split in two at every offset: the same status,
 * body and completion each time. */
static void check_splits(const char *resp, int want_status, const char *want_body)
{
    size_t len = strlen(resp), k, u1, u2;
    pd_httpc_resp_t *r = malloc(sizeof(*r));
    sink_t *s = malloc(sizeof(*s));

    for (k = 0; k <= len; k++) {
        pd_httpc_resp_init(r, 1u << 20);
        memset(s, 0, sizeof(*s));
        assert_int_equal(pd_httpc_resp_feed(r, resp, k, sink, s, &u1), PD_OK);
        assert_int_equal(pd_httpc_resp_feed(r, resp + k, len - k, sink, s, &u2), PD_OK);
        assert_int_equal(u1 + u2, len);
        assert_true(r->complete);
        assert_int_equal(r->status, want_status);
        assert_string_equal(s->buf, want_body);
    }
    free(r);
    free(s);
}

static void test_http_every_boundary(void **state)
{
    (void)state;
    check_splits("HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world", 200,
                 "hello world");
    check_splits("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "5\r\nhello\r\n1;x=y\r\n \r\n000005\r\nworld\r\n0\r\nT: 1\r\n\r\n",
                 200, "hello world");
    check_splits("HTTP/1.1 100 Continue\r\n\r\n"
                 "HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\nno", 404, "no");
    check_splits("HTTP/1.1 200 OK\nContent-Length: 1\n\nx", 200, "x");
}

static void test_http_strict_framing(void **state)
{
    pd_httpc_resp_t *r = malloc(sizeof(*r));
    sink_t *s = malloc(sizeof(*s));
    const char *bad[] = {
        "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 5 5\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 0x5\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n 5\r\nhello\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5x\r\nhello\r\n",
        "HTTP/1.1 200 OK\r\nContent Length: 5\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX: a\r\n folded\r\n\r\n",
        "HTTP/1.1 2000 OK\r\n\r\n",
        "HTTP/1.1 2x0 OK\r\n\r\n",
        "HTTP/1.1 099 OK\r\n\r\n",
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        feed_split(bad[i], 1000, r, s, PD_ERR_BAD_INPUT);
        /* refused for good: more bytes are refused the same way */
        assert_int_equal(pd_httpc_resp_feed(r, "x", 1, sink, s, NULL), PD_ERR_BAD_INPUT);
    }
    feed_split("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999\r\n\r\n", 1000, r, s,
               PD_ERR_TOO_BIG);
    feed_split("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n100000001\r\n", 1000,
               r, s, PD_ERR_TOO_BIG);
    free(r);
    free(s);
}

static pd_status_t feed_capped(const char *resp, uint64_t body_max)
{
    pd_httpc_resp_t *r = malloc(sizeof(*r));
    pd_status_t st;

    pd_httpc_resp_init(r, body_max);
    st = pd_httpc_resp_feed(r, resp, strlen(resp), NULL, NULL, NULL);
    free(r);
    return st;
}

static void test_http_caps(void **state)
{
    pd_httpc_resp_t *r = malloc(sizeof(*r));
    size_t cap = PD_HTTPC_HEAD_MAX + 4096, n, i;
    char *big = malloc(cap);

    (void)state;
    /* body cap: Content-Length, chunked (one chunk, two chunks), close */
    assert_int_equal(feed_capped("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcd", 4), PD_OK);
    assert_int_equal(feed_capped("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabcde", 4),
                     PD_ERR_TOO_BIG);
    assert_int_equal(feed_capped("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "5\r\nabcde\r\n", 4), PD_ERR_TOO_BIG);
    assert_int_equal(feed_capped("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "3\r\nabc\r\n2\r\nde\r\n", 4), PD_ERR_TOO_BIG);
    assert_int_equal(feed_capped("HTTP/1.1 200 OK\r\n\r\nabcde", 4), PD_ERR_TOO_BIG);
    assert_int_equal(feed_capped("HTTP/1.1 200 OK\r\n\r\nabcd", 4), PD_OK);
    /* header count */
    n = (size_t)snprintf(big, cap, "HTTP/1.1 200 OK\r\n");
    for (i = 0; i <= PD_HTTPC_HEADERS_MAX; i++)
        n += (size_t)snprintf(big + n, cap - n, "X-%zu: 1\r\n", i);
    assert_int_equal(feed_capped(big, 100), PD_ERR_TOO_BIG);
    /* trailers count as headers */
    n = (size_t)snprintf(big, cap, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n");
    for (i = 0; i <= PD_HTTPC_HEADERS_MAX; i++)
        n += (size_t)snprintf(big + n, cap - n, "T-%zu: 1\r\n", i);
    assert_int_equal(feed_capped(big, 100), PD_ERR_TOO_BIG);
    /* the whole head: 20 long headers of 4000 bytes each */
    n = (size_t)snprintf(big, cap, "HTTP/1.1 200 OK\r\n");
    for (i = 0; i < 20 && n + 4010 < cap; i++) {
        n += (size_t)snprintf(big + n, cap - n, "X-%zu: ", i);
        memset(big + n, 'a', 4000);
        n += 4000;
        n += (size_t)snprintf(big + n, cap - n, "\r\n");
    }
    assert_true(n > PD_HTTPC_HEAD_MAX);
    assert_int_equal(feed_capped(big, 100), PD_ERR_TOO_BIG);
    free(big);
    free(r);
}

/* ---- the blocking helper against a one-shot server ---------------------- */

typedef struct {
    int lfd;
    uint16_t port;
    const char *reply;          /* NULL: read the request, then stay silent */
    size_t reply_len;           /* sent in 3-byte writes when split */
    bool split;
    char req[2048];
    size_t req_len;
} srv_t;

static void *srv_main(void *arg)
{
    srv_t *sv = arg;
    int fd = accept(sv->lfd, NULL, NULL);
    ssize_t n;

    if (fd < 0)
        return NULL;
    /* the request: head and body arrive before the reply is due */
    while (sv->req_len < sizeof(sv->req) - 1 &&
           (n = recv(fd, sv->req + sv->req_len, sizeof(sv->req) - 1 - sv->req_len, 0)) > 0) {
        sv->req_len += (size_t)n;
        sv->req[sv->req_len] = '\0';
        char *h = strstr(sv->req, "\r\n\r\n");
        const char *cl = strstr(sv->req, "Content-Length: ");
        if (h != NULL && sv->req_len >= (size_t)(h + 4 - sv->req) + (cl ? strtoul(cl + 16, NULL, 10) : 0))
            break;
    }
    if (sv->reply == NULL) {
        usleep(500 * 1000);
    } else if (sv->split) {
        for (size_t off = 0; off < sv->reply_len; off += 3) {
            size_t k = sv->reply_len - off < 3 ? sv->reply_len - off : 3;
            if (send(fd, sv->reply + off, k, MSG_NOSIGNAL) < 0)
                break;
            usleep(200);
        }
    } else {
        (void)!send(fd, sv->reply, sv->reply_len, MSG_NOSIGNAL);
    }
    close(fd);
    return NULL;
}

static void srv_start(srv_t *sv, pthread_t *th)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001) };
    socklen_t sl = sizeof(sa);

    sv->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(sv->lfd >= 0);
    assert_int_equal(bind(sv->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(sv->lfd, 1), 0);
    assert_int_equal(getsockname(sv->lfd, (struct sockaddr *)&sa, &sl), 0);
    sv->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(th, NULL, srv_main, sv), 0);
}

static void srv_stop(srv_t *sv, pthread_t th)
{
    pthread_join(th, NULL);
    close(sv->lfd);
}

static void test_fetch_exchange(void **state)
{
    static const char reply[] =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n";
    srv_t sv = { .reply = reply, .reply_len = sizeof(reply) - 1, .split = true };
    pd_httpc_req_t req = { .method = "POST", .path = "/v3/kv/range", .body = "{}",
                           .body_len = 2 };
    pd_httpc_reply_t rep;
    char addr[32], want[256];
    pthread_t th;

    (void)state;
    srv_start(&sv, &th);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", sv.port);
    req.host = addr;
    assert_int_equal(pd_httpc_fetch(addr, &req, 5 * PD_NS_PER_S, 1024, &rep), PD_OK);
    srv_stop(&sv, th);
    /* the request bytes, to the letter (etcd's POST) */
    snprintf(want, sizeof(want),
             "POST /v3/kv/range HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
             "Content-Length: 2\r\nConnection: close\r\n\r\n{}", addr);
    assert_string_equal(sv.req, want);
    assert_int_equal(rep.status, 200);
    assert_true(rep.complete);
    assert_string_equal(rep.body, "{\"a\":1}");
    assert_int_equal(rep.body_len, 7);
    assert_string_equal(rep.head, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                  "Transfer-Encoding: chunked");
    pd_httpc_reply_free(&rep);
}

static void test_fetch_deadline_and_cut(void **state)
{
    static const char cut[] = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc";
    srv_t sv = { 0 };
    pd_httpc_req_t req = { .method = "GET", .host = "x", .path = "/health" };
    pd_httpc_reply_t rep;
    char addr[32];
    pthread_t th;
    uint64_t t0;

    (void)state;
    /* silent server: the deadline ends the exchange */
    srv_start(&sv, &th);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", sv.port);
    t0 = pd_now_ns();
    assert_int_equal(pd_httpc_fetch(addr, &req, 150 * PD_NS_PER_MS, 1024, &rep),
                     PD_ERR_TIMED_OUT);
    assert_true(pd_now_ns() - t0 < 450 * PD_NS_PER_MS);
    assert_int_equal(rep.status, 0);
    pd_httpc_reply_free(&rep);
    srv_stop(&sv, th);
    assert_string_equal(sv.req, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");

    /* closed mid body: an I/O error, with what arrived */
    memset(&sv, 0, sizeof(sv));
    sv.reply = cut;
    sv.reply_len = sizeof(cut) - 1;
    srv_start(&sv, &th);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", sv.port);
    assert_int_equal(pd_httpc_fetch(addr, &req, 5 * PD_NS_PER_S, 1024, &rep), PD_ERR_IO);
    srv_stop(&sv, th);
    assert_int_equal(rep.status, 200);
    assert_false(rep.complete);
    assert_string_equal(rep.body, "abc");
    pd_httpc_reply_free(&rep);

    /* bad addresses */
    assert_int_equal(pd_httpc_fetch("no-port", &req, PD_NS_PER_S, 1024, &rep), PD_ERR_BAD_INPUT);
    pd_httpc_reply_free(&rep);
    assert_int_equal(pd_httpc_fetch("127.0.0.1:0x50", &req, PD_NS_PER_S, 1024, &rep),
                     PD_ERR_BAD_INPUT);
    pd_httpc_reply_free(&rep);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_http_chunked),
        cmocka_unit_test(test_http_length_close_interim),
        cmocka_unit_test(test_http_malformed),
        cmocka_unit_test(test_http_every_boundary),
        cmocka_unit_test(test_http_strict_framing),
        cmocka_unit_test(test_http_caps),
        cmocka_unit_test(test_sse),
        cmocka_unit_test(test_sse_cap),
        cmocka_unit_test(test_fetch_exchange),
        cmocka_unit_test(test_fetch_deadline_and_cut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
