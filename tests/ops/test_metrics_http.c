/* test_metrics_http.c - pd_metrics_http (common/pd_metrics_http.h) against
 * raw sockets: replies and framing, HEAD, 404/405/400, the header cap
 * (431), max clients (503), the idle timeout, a failing render (500),
 * health callback, address parsing, accept at the fd limit (no spin).
 * The loop runs on its own thread. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pd_metrics_http.h"

typedef struct {
    pd_loop_t *loop;
    pd_metrics_http_t *m;
    pthread_t th;
    _Atomic int renders;
    _Atomic bool fail_render;
    _Atomic bool unhealthy;
    _Atomic bool unready;
} fx_t;

static pd_status_t render(void *arg, char **text_p, size_t *len_p)
{
    fx_t *f = arg;
    f->renders++;
    if (f->fail_render)
        return PD_ERR_NO_MEMORY;
    const char *t = "# HELP pd_x_total x\n# TYPE pd_x_total counter\npd_x_total 7\n";
    *text_p = strdup(t);
    *len_p = strlen(t);
    return *text_p ? PD_OK : PD_ERR_NO_MEMORY;
}

static bool health(void *arg, char *why, size_t cap)
{
    fx_t *f = arg;
    if (f->unhealthy)
        snprintf(why, cap, "router session down");
    return !f->unhealthy;
}

static bool ready(void *arg, char *why, size_t cap)
{
    fx_t *f = arg;
    if (f->unready)
        snprintf(why, cap, "no router session up");
    return !f->unready;
}

static void *loop_main(void *arg)
{
    fx_t *f = arg;
    pd_loop_run(f->loop);
    return NULL;
}

static int setup(void **st)
{
    fx_t *f = calloc(1, sizeof(*f));
    assert_int_equal(pd_loop_create(&f->loop), PD_OK);
    pd_metrics_http_opts_t o = { .listen = "127.0.0.1:0", .render = render, .health = health,
                                 .ready = ready, .arg = f, .max_clients = 4, .max_header = 1024,
                                 .idle_timeout_ns = 300000000ULL };
    assert_int_equal(pd_metrics_http_create(f->loop, &o, &f->m), PD_OK);
    assert_true(pd_metrics_http_port(f->m) != 0);
    assert_int_equal(pthread_create(&f->th, NULL, loop_main, f), 0);
    *st = f;
    return 0;
}

static int teardown(void **st)
{
    fx_t *f = *st;
    pd_loop_stop(f->loop);
    pthread_join(f->th, NULL);
    pd_metrics_http_destroy(f->m);
    pd_loop_destroy(f->loop);
    free(f);
    return 0;
}

static int conn(fx_t *f)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(pd_metrics_http_port(f->m)) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Read until EOF (bounded at 5 s); returns the bytes, NUL-terminated. */
static char *read_all(int fd, size_t *len_p)
{
    size_t cap = 65536, len = 0;
    char *b = malloc(cap);
    struct pollfd p = { .fd = fd, .events = POLLIN };
    while (poll(&p, 1, 5000) == 1) {
        ssize_t n = read(fd, b + len, cap - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    b[len] = '\0';
    if (len_p)
        *len_p = len;
    return b;
}

static char *ask(fx_t *f, const char *req)
{
    int fd = conn(f);
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    char *r = read_all(fd, NULL);
    close(fd);
    return r;
}

static void test_metrics_get(void **st)
{
    fx_t *f = *st;
    char *r = ask(f, "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n");
    assert_non_null(strstr(r, "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(r, "Content-Type: text/plain; version=0.0.4"));
    assert_non_null(strstr(r, "Connection: close\r\n"));
    const char *body = strstr(r, "\r\n\r\n") + 4;
    unsigned long cl = strtoul(strstr(r, "Content-Length: ") + 16, NULL, 10);
    assert_int_equal(cl, strlen(body));
    assert_string_equal(body, "# HELP pd_x_total x\n# TYPE pd_x_total counter\npd_x_total 7\n");
    free(r);
    /* query string ignored; HEAD: headers only */
    r = ask(f, "HEAD /metrics?x=1 HTTP/1.0\r\n\r\n");
    assert_non_null(strstr(r, "200 OK"));
    assert_string_equal(strstr(r, "\r\n\r\n"), "\r\n\r\n");
    free(r);
}

static void test_statuses(void **st)
{
    fx_t *f = *st;
    char *r = ask(f, "GET /health HTTP/1.1\r\n\r\n");
    assert_non_null(strstr(r, "200 OK"));
    assert_non_null(strstr(r, "Content-Type: application/json\r\n"));
    assert_non_null(strstr(r, "\r\n\r\n{\"status\":\"ok\"}"));
    free(r);
    f->unhealthy = true;
    r = ask(f, "GET /health HTTP/1.1\r\n\r\n");
    assert_non_null(strstr(r, "HTTP/1.1 503 "));
    assert_non_null(strstr(r, "{\"status\":\"unavailable\",\"reason\":\"router session down\"}"));
    free(r);
    f->unhealthy = false;
    /* /ready: its own callback (readiness probes); /health unaffected */
    r = ask(f, "GET /ready HTTP/1.1\r\n\r\n");
    assert_non_null(strstr(r, "200 OK"));
    free(r);
    f->unready = true;
    r = ask(f, "GET /ready HTTP/1.1\r\n\r\n");
    assert_non_null(strstr(r, "HTTP/1.1 503 "));
    assert_non_null(strstr(r, "{\"status\":\"not_ready\",\"reason\":\"no router session up\"}"));
    free(r);
    r = ask(f, "GET /health HTTP/1.1\r\n\r\n");
    assert_non_null(strstr(r, "200 OK"));
    free(r);
    f->unready = false;
    r = ask(f, "GET /metricsx HTTP/1.1\r\n\r\n");
    assert_non_null(strstr(r, "HTTP/1.1 404 "));
    free(r);
    r = ask(f, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert_non_null(strstr(r, "HTTP/1.1 405 "));
    free(r);
    r = ask(f, "GARBAGE\r\n\r\n");
    assert_non_null(strstr(r, "HTTP/1.1 400 "));
    free(r);
    r = ask(f, "GET /metrics SPDY/9\r\n\r\n");
    assert_non_null(strstr(r, "HTTP/1.1 400 "));
    free(r);
    f->fail_render = true;
    r = ask(f, "GET /metrics HTTP/1.1\r\n\r\n");
    assert_non_null(strstr(r, "HTTP/1.1 500 "));
    free(r);
    f->fail_render = false;
}

static void test_header_cap(void **st)
{
    fx_t *f = *st;
    int fd = conn(f);
    char big[4096];
    memset(big, 'a', sizeof(big));
    memcpy(big, "GET /metrics HTTP/1.1\r\nX-Big: ", 30);
    assert_int_equal(write(fd, big, sizeof(big)), (ssize_t)sizeof(big));
    char *r = read_all(fd, NULL);
    assert_non_null(strstr(r, "HTTP/1.1 431 "));
    free(r);
    close(fd);
}

static void test_max_clients_and_idle(void **st)
{
    fx_t *f = *st;
    int fds[4];
    for (int i = 0; i < 4; i++)
        fds[i] = conn(f);
    /* wait until the server counted them (accepts run on the loop thread) */
    for (int i = 0; i < 500 && pd_metrics_http_client_count(f->m) < 4; i++)
        usleep(2000);
    assert_int_equal(pd_metrics_http_client_count(f->m), 4);
    char *r = ask(f, "GET /metrics HTTP/1.1\r\n\r\n");
    assert_non_null(strstr(r, "HTTP/1.1 503 "));
    free(r);
    /* idle clients (no request) are closed by the 300 ms timeout */
    for (int i = 0; i < 4; i++) {
        size_t len;
        char *b = read_all(fds[i], &len);
        assert_int_equal(len, 0);   /* EOF without a reply */
        free(b);
        close(fds[i]);
    }
    for (int i = 0; i < 500 && pd_metrics_http_client_count(f->m) > 0; i++)
        usleep(2000);
    assert_int_equal(pd_metrics_http_client_count(f->m), 0);
    /* a slow but complete request still works */
    int fd = conn(f);
    assert_int_equal(write(fd, "GET /metr", 9), 9);
    usleep(50000);
    assert_int_equal(write(fd, "ics HTTP/1.1\r\n\r\n", 16), 16);
    r = read_all(fd, NULL);
    assert_non_null(strstr(r, "200 OK"));
    free(r);
    close(fd);
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    if (d != NULL)
        closedir(d);
    return n - 1; /* the DIR's own fd */
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* Out of fds: accept fails with the connection still in the backlog; the
 * listener must pause (not spin the loop) and serve again afterwards. */
static void test_accept_emfile(void **st)
{
    fx_t *f = *st;
    uint16_t port = pd_metrics_http_port(f->m);
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    lim = old;
    lim.rlim_cur = (rlim_t)open_fds();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* other fd table: the kernel completes these */
        for (int i = 0; i < 3; i++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
                _exit(1);
        }
        sleep(3);
        _exit(0);
    }
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &lim), 0);
    struct timespec ts = { 0, 300000000 };
    nanosleep(&ts, NULL);
    double c0 = cpu_s();
    ts.tv_sec = 1;
    ts.tv_nsec = 0;
    nanosleep(&ts, NULL);
    double used = cpu_s() - c0;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    if (used > 0.2)
        fail_msg("at the fd limit the loop burned %.2f s of CPU in 1 s", used);
    char *r = ask(f, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_non_null(strstr(r, "200 OK"));
    free(r);
}

static void test_addresses(void **st)
{
    (void)st;
    assert_true(pd_metrics_http_addr_is_loopback("127.0.0.1:0"));
    assert_true(pd_metrics_http_addr_is_loopback("127.1.2.3:9100"));
    assert_true(pd_metrics_http_addr_is_loopback("[::1]:9100"));
    assert_false(pd_metrics_http_addr_is_loopback("0.0.0.0:9100"));
    assert_false(pd_metrics_http_addr_is_loopback("10.0.0.1:9100"));
    assert_false(pd_metrics_http_addr_is_loopback("127.0.0.1"));
    pd_loop_t *loop;
    pd_metrics_http_t *m = NULL;
    assert_int_equal(pd_loop_create(&loop), PD_OK);
    const char *bad[] = { "", "127.0.0.1", "127.0.0.1:", "127.0.0.1:70000", "127.0.0.1:x",
                          "localhost:9100", "::1:9100", "[::1]", "1.2.3.4.5:1" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        pd_metrics_http_opts_t o = { .listen = bad[i], .render = render };
        assert_int_equal(pd_metrics_http_create(loop, &o, &m), PD_ERR_BAD_INPUT);
    }
    pd_metrics_http_opts_t o = { .listen = "127.0.0.1:0", .render = NULL };
    assert_int_equal(pd_metrics_http_create(loop, &o, &m), PD_ERR_BAD_INPUT);
    o.render = render;
    o.listen = "[::1]:0";
    pd_status_t s = pd_metrics_http_create(loop, &o, &m);
    assert_true(s == PD_OK || s == PD_ERR_IO);   /* no IPv6 in some sandboxes */
    pd_metrics_http_destroy(m);
    /* a port in use -> PD_ERR_IO */
    o.listen = "127.0.0.1:0";
    assert_int_equal(pd_metrics_http_create(loop, &o, &m), PD_OK);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", pd_metrics_http_port(m));
    pd_metrics_http_t *m2 = NULL;
    o.listen = addr;
    assert_int_equal(pd_metrics_http_create(loop, &o, &m2), PD_ERR_IO);
    pd_metrics_http_destroy(m);
    pd_metrics_http_destroy(NULL);
    pd_loop_destroy(loop);
}

int main(void)
{
    const struct CMUnitTest t[] = {
        cmocka_unit_test_setup_teardown(test_metrics_get, setup, teardown),
        cmocka_unit_test_setup_teardown(test_statuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_clients_and_idle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accept_emfile, setup, teardown),
        cmocka_unit_test(test_addresses),
    };
    return cmocka_run_group_tests_name("metrics-http", t, NULL, NULL);
}
