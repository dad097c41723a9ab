/* test_etcd.c - the etcd client's pieces without etcd: base64 both ways
 * (and refusals), the bounded HTTP POST against a fake server (status,
 * Content-Length and chunked bodies, a reply over the 1 MiB cap, a server
 * that never answers, a refused connection), and pd_member_start's checks.
 * e2e-etcd (tests/serving) runs the real thing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "pd_etcd.h"

static void test_b64(void **st)
{
    (void)st;
    char enc[64];
    uint8_t dec[64];
    static const char *const plain[] = { "", "f", "fo", "foo", "foob", "/pdserve/e2e/" };
    static const char *const coded[] = { "", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==",
                                         "L3Bkc2VydmUvZTJlLw==" };
    for (int i = 0; i < 6; i++) {
        assert_int_equal(pd_b64_encode(plain[i], strlen(plain[i]), enc), strlen(coded[i]));
        assert_string_equal(enc, coded[i]);
        long n = pd_b64_decode(coded[i], strlen(coded[i]), dec, sizeof(dec));
        assert_int_equal(n, (long)strlen(plain[i]));
        assert_memory_equal(dec, plain[i], (size_t)n);
    }
    assert_int_equal(pd_b64_decode("Zm9", 3, dec, sizeof(dec)), -1);       /* length */
    assert_int_equal(pd_b64_decode("Zm!v", 4, dec, sizeof(dec)), -1);      /* alphabet */
    assert_int_equal(pd_b64_decode("Zg==Zm9v", 8, dec, sizeof(dec)), -1);  /* pad inside */
    assert_int_equal(pd_b64_decode("Zm9vYg==", 8, dec, 3), -1);            /* does not fit */
}

/* A one-shot fake server: answers the first connection with `reply`
 * (NULL: reads and never answers, until the client gives up). */
typedef struct {
    int lfd;
    const char *reply;
    size_t reply_len;
} fake_t;

static void *fake_main(void *arg)
{
    fake_t *f = arg;
    int c = accept(f->lfd, NULL, NULL);
    if (c < 0)
        return NULL;
    char buf[4096];
    ssize_t r = recv(c, buf, sizeof(buf), 0);
    (void)r;
    if (f->reply != NULL) {
        size_t off = 0;
        while (off < f->reply_len) {
            ssize_t w = send(c, f->reply + off, f->reply_len - off, MSG_NOSIGNAL);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        /* read what is left of the request before closing: unread data
         * would turn the close into a reset that loses the reply */
        shutdown(c, SHUT_WR);
        while (recv(c, buf, sizeof(buf), 0) > 0)
            ;
    } else {
        while (recv(c, buf, sizeof(buf), 0) > 0)
            ;
    }
    close(c);
    return NULL;
}

static int fake_post(const char *reply, size_t len, int timeout_ms, char **body)
{
    fake_t f = { socket(AF_INET, SOCK_STREAM, 0), reply, len };
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(f.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(f.lfd, 1), 0);
    assert_int_equal(getsockname(f.lfd, (struct sockaddr *)&sa, &sl), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fake_main, &f), 0);
    char ep[32];
    snprintf(ep, sizeof(ep), "127.0.0.1:%u", ntohs(sa.sin_port));
    int code = pd_etcd_post(ep, "/v3/kv/range", "{}", timeout_ms, body);
    shutdown(f.lfd, SHUT_RDWR);
    pthread_join(th, NULL);
    close(f.lfd);
    return code;
}

static void test_post(void **st)
{
    (void)st;
    char *body = NULL;
    const char *r1 = "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"count\":1}";
    assert_int_equal(fake_post(r1, strlen(r1), 2000, &body), 200);
    assert_string_equal(body, "{\"count\":1}");
    free(body);
    const char *r2 = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "5\r\n{\"a\":\r\n3\r\n12}\r\n0\r\n\r\n";
    assert_int_equal(fake_post(r2, strlen(r2), 2000, &body), 200);
    assert_string_equal(body, "{\"a\":12}");
    free(body);
    const char *r3 = "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno";
    assert_int_equal(fake_post(r3, strlen(r3), 2000, &body), 404);
    free(body);
    const char *r4 = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
    assert_int_equal(fake_post(r4, strlen(r4), 2000, &body), PD_ERR_BAD_INPUT);
    assert_null(body);
    assert_int_equal(fake_post("garbage", 7, 2000, &body), PD_ERR_BAD_INPUT);
    /* over the cap: refused, nothing kept */
    size_t big = (2u << 20);
    char *r5 = malloc(big);
    assert_non_null(r5);
    memset(r5, 'x', big);
    memcpy(r5, "HTTP/1.1 200 OK\r\n\r\n", 19);
    assert_int_equal(fake_post(r5, big, 5000, &body), PD_ERR_TOO_BIG);
    assert_null(body);
    free(r5);
    /* a server that never answers: bounded by the timeout */
    assert_int_equal(fake_post(NULL, 0, 300, &body), PD_ERR_TIMED_OUT);
    /* nobody listening */
    assert_int_equal(pd_etcd_post("127.0.0.1:1", "/", "{}", 500, &body), PD_ERR_IO);
    assert_int_equal(pd_etcd_post("no-port", "/", "{}", 500, &body), PD_ERR_BAD_INPUT);
    /* a name is resolved (localhost), an unknown one is an I/O error */
    assert_int_equal(pd_etcd_post("localhost:1", "/", "{}", 500, &body), PD_ERR_IO);
    assert_int_equal(pd_etcd_post("no-such-host.invalid:2379", "/", "{}", 500, &body), PD_ERR_IO);
}

static void test_member_checks(void **st)
{
    (void)st;
    evthread_use_pthreads(); /* the worker wakes the base from its thread */
    struct event_base *base = event_base_new();
    pd_member_t *m = NULL;
    pd_member_opts_t o = { .endpoint = "127.0.0.1:2379", .prefix = "/p/", .key = "k",
                           .value = "v", .ttl_s = 0 };
    assert_int_equal(pd_member_start(base, &o, &m), PD_ERR_BAD_INPUT);       /* ttl */
    o.ttl_s = 5;
    o.endpoint = "etcd.example";
    assert_int_equal(pd_member_start(base, &o, &m), PD_ERR_BAD_INPUT);       /* no port */
    o.endpoint = "etcd.example:0";
    assert_int_equal(pd_member_start(base, &o, &m), PD_ERR_BAD_INPUT);
    o.endpoint = "127.0.0.1:2379";
    char longv[300];
    memset(longv, 'v', sizeof(longv) - 1);
    longv[sizeof(longv) - 1] = '\0';
    o.value = longv;
    assert_int_equal(pd_member_start(base, &o, &m), PD_ERR_BAD_INPUT);       /* value cap */
    o.value = "v";
    o.watch = "";
    assert_int_equal(pd_member_start(base, &o, &m), PD_ERR_BAD_INPUT);
    /* unreachable etcd: starts, reports not connected, stops in bounded time */
    o.watch = "routers/";
    o.endpoint = "127.0.0.1:1";
    assert_int_equal(pd_member_start(base, &o, &m), PD_OK);
    char err[160];
    assert_false(pd_member_connected(m, err, sizeof(err)));
    pd_member_entry_t e[4];
    assert_int_equal(pd_member_snapshot(m, e, 4), 0);
    pd_member_stop(m);
    pd_member_stop(NULL);
    event_base_free(base);
}

/* Signed values (issue #28 finding 3): what verifies and what does not. */
static void test_signed_values(void **st)
{
    (void)st;
    uint8_t k[PD_ETCD_SIG_KEY_LEN], k2[PD_ETCD_SIG_KEY_LEN];
    memset(k, 7, sizeof(k));
    memset(k2, 8, sizeof(k2));
    const char *full = "/pdserve/e2e/routers/router-1";
    char v[PD_MEMBER_VAL_MAX], out[PD_MEMBER_VAL_MAX];
    assert_int_equal(pd_etcd_value_sign(k, full, "10.0.0.5:7000", v, sizeof(v)), PD_OK);
    assert_int_equal(strlen(v), strlen("10.0.0.5:7000") + PD_ETCD_SIG_OVERHEAD);
    assert_int_equal(pd_etcd_value_verify(k, full, v, out, sizeof(out)), PD_OK);
    assert_string_equal(out, "10.0.0.5:7000");
    /* another secret, another key (a replay), a changed payload, no MAC */
    assert_int_equal(pd_etcd_value_verify(k2, full, v, out, sizeof(out)), PD_ERR_AUTH);
    assert_int_equal(pd_etcd_value_verify(k, "/pdserve/e2e/routers/router-2", v, out,
                                          sizeof(out)), PD_ERR_AUTH);
    char t[PD_MEMBER_VAL_MAX];
    snprintf(t, sizeof(t), "%s", v);
    t[1] = '1';
    assert_int_equal(pd_etcd_value_verify(k, full, t, out, sizeof(out)), PD_ERR_AUTH);
    snprintf(t, sizeof(t), "%s", v);
    t[strlen(t) - 3] ^= 1;                                   /* the MAC's last byte */
    assert_int_equal(pd_etcd_value_verify(k, full, t, out, sizeof(out)), PD_ERR_AUTH);
    static const char *const junk[] = { "", "10.0.0.5:7000", " s1:", "x s1:AAAA",
                                        "x s1:!!!!!!!!!!!!!!!!!!!!!!!!", "x s2:AAAAAAAAAAAAAAAAAAAAAA==" };
    for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++)
        assert_int_equal(pd_etcd_value_verify(k, full, junk[i], out, sizeof(out)), PD_ERR_AUTH);
    /* sizes: the payload that fits, one byte more; a small out buffer */
    char big[PD_MEMBER_VAL_MAX];
    memset(big, 'a', sizeof(big));
    big[PD_MEMBER_VAL_MAX - PD_ETCD_SIG_OVERHEAD - 1] = '\0';
    assert_int_equal(pd_etcd_value_sign(k, full, big, v, sizeof(v)), PD_OK);
    assert_int_equal(pd_etcd_value_verify(k, full, v, out, 8), PD_ERR_TOO_BIG);
    big[PD_MEMBER_VAL_MAX - PD_ETCD_SIG_OVERHEAD - 1] = 'a';
    big[PD_MEMBER_VAL_MAX - PD_ETCD_SIG_OVERHEAD] = '\0';
    assert_int_equal(pd_etcd_value_sign(k, full, big, v, sizeof(v)), PD_ERR_TOO_BIG);
    assert_int_equal(pd_etcd_value_sign(k, full, "a\nb", v, sizeof(v)), PD_ERR_BAD_INPUT);
    /* key shapes */
    assert_true(pd_etcd_key_ok("router-1", 63));
    assert_true(pd_etcd_key_ok("r.a_b-C9", 63));
    assert_false(pd_etcd_key_ok("", 63));
    assert_false(pd_etcd_key_ok("..", 63));
    assert_false(pd_etcd_key_ok("a/b", 63));
    assert_false(pd_etcd_key_ok("a b", 63));
    assert_false(pd_etcd_key_ok("abcd", 3));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_b64),
        cmocka_unit_test(test_post),
        cmocka_unit_test(test_member_checks),
        cmocka_unit_test(test_signed_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
