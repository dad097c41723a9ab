/* Integration test: pd-bench's workloads, keep-alive handling and
 * --compare, as a real process against a small HTTP/1.1 keep-alive server
 * written here (raw sockets, poll, one thread, 127.0.0.1, OS-chosen port).
 * The server behaves like llama-server (cpp-httplib) with kept-alive
 * connections: it keeps them open without saying "Connection: close" and
 *   max_per_conn = N  answers N requests on a connection, then closes it
 *                     when the next request arrives, without answering
 *                     (what a keep-alive budget or an idle timeout firing
 *                     as the request arrives look like to the client);
 *   idle_ms = T       closes connections idle for T ms;
 *   drop_all          closes every connection on its first request.
 * It streams n = min(max_tokens, 16) content chunks " r<req>w<i>", a usage
 * chunk (with prompt_tokens_details.cached_tokens when asked) and [DONE],
 * chunked, and logs every request body with the answer it gave, so the
 * tests check what pd-bench sent: multi-turn histories holding the
 * server's actual answers, shared prefixes, trace prefixes by hash id,
 * identical workloads for both servers of --compare. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "pb_test_json.h"

extern char **environ;

static const char *pd_bench_path;
static char tmpdir[256];

/* ---- the keep-alive server -------------------------------------------- */

#define KA_CONNS    64
#define KA_LOG      512
#define KA_REQ_MAX  (4u << 20)

typedef struct {
    int fd;                     /* -1: unused */
    char *buf;
    size_t len;
    int served;
    double last;                /* last activity, monotonic s */
} ka_conn_t;

typedef struct {
    char *body;                 /* request JSON */
    char *answer;               /* content streamed back */
    bool chat;
} ka_entry_t;

typedef struct {
    int lfd, port, stop_pipe[2];
    pthread_t thread;
    int max_per_conn, idle_ms;
    bool drop_all, cached;
    ka_conn_t c[KA_CONNS];
    pthread_mutex_t mu;
    ka_entry_t log[KA_LOG];
    int n_log;
    int answered, dropped, idle_closed, accepted;
} ka_t;

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void ka_close(ka_conn_t *c)
{
    close(c->fd);
    c->fd = -1;
    free(c->buf);
    c->buf = NULL;
    c->len = 0;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

static void send_chunk(int fd, const char *data)
{
    char head[32];
    snprintf(head, sizeof(head), "%zx\r\n", strlen(data));
    send_all(fd, head, strlen(head));
    send_all(fd, data, strlen(data));
    send_all(fd, "\r\n", 2);
}

/* Answer one complete request (head + body). */
static void ka_answer(ka_t *k, ka_conn_t *c, const char *head, const char *body,
                      size_t body_len)
{
    cJSON *j = cJSON_ParseWithLength(body, body_len), *mt, *p;
    bool chat = strstr(head, "/chat/completions") != NULL;
    char ev[512], answer[512] = "";
    int n = 4, i, prompt_tokens = 0, req_no;

    if (strncmp(head, "GET /v1/models", 14) == 0) {
        const char *m = "{\"object\":\"list\",\"data\":[{\"id\":\"ka-model\"}]}";
        snprintf(ev, sizeof(ev), "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\nKeep-Alive: timeout=5, max=5\r\n\r\n%s",
                 strlen(m), m);
        send_all(c->fd, ev, strlen(ev));
        cJSON_Delete(j);
        return;
    }
    mt = cJSON_GetObjectItem(j, chat ? "max_completion_tokens" : "max_tokens");
    if (cJSON_IsNumber(mt))
        n = mt->valueint < 16 ? mt->valueint : 16;
    p = cJSON_GetObjectItem(j, chat ? "messages" : "prompt");
    if (cJSON_IsArray(p))
        prompt_tokens = cJSON_GetArraySize(p);
    else if (cJSON_IsString(p))
        prompt_tokens = (int)strlen(p->valuestring) / 4 + 1;
    pthread_mutex_lock(&k->mu);
    req_no = k->answered++;
    pthread_mutex_unlock(&k->mu);
    {
        static const char hdr[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                  "Transfer-Encoding: chunked\r\n"
                                  "Keep-Alive: timeout=5, max=5\r\n\r\n";
        send_all(c->fd, hdr, sizeof(hdr) - 1);
    }
    for (i = 0; i < n; i++) {
        char piece[32];
        snprintf(piece, sizeof(piece), " r%dw%d", req_no, i);
        strncat(answer, piece, sizeof(answer) - strlen(answer) - 1);
        if (chat)
            snprintf(ev, sizeof(ev), "data: {\"choices\":[{\"index\":0,\"delta\":"
                     "{\"content\":\"%s\"},\"finish_reason\":null}]}\n\n", piece);
        else
            snprintf(ev, sizeof(ev), "data: {\"choices\":[{\"index\":0,\"text\":\"%s\","
                     "\"finish_reason\":null}]}\n\n", piece);
        send_chunk(c->fd, ev);
    }
    if (k->cached)
        snprintf(ev, sizeof(ev), "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,"
                 "\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}"
                 "\n\n", prompt_tokens, n, prompt_tokens / 2);
    else
        snprintf(ev, sizeof(ev), "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,"
                 "\"completion_tokens\":%d}}\n\n", prompt_tokens, n);
    send_chunk(c->fd, ev);
    send_chunk(c->fd, "data: [DONE]\n\n");
    send_all(c->fd, "0\r\n\r\n", 5);
    pthread_mutex_lock(&k->mu);
    if (k->n_log < KA_LOG) {
        k->log[k->n_log].body = strndup(body, body_len);
        k->log[k->n_log].answer = strdup(answer);
        k->log[k->n_log].chat = chat;
        k->n_log++;
    }
    pthread_mutex_unlock(&k->mu);
    cJSON_Delete(j);
}

/* Handle whatever complete requests the connection's buffer holds. */
static void ka_input(ka_t *k, ka_conn_t *c)
{
    for (;;) {
        char *end = memmem(c->buf, c->len, "\r\n\r\n", 4), *cl;
        size_t head_len, body_len = 0, total;
        char head[8192];

        if (end == NULL)
            return;
        head_len = (size_t)(end - c->buf) + 4;
        if (head_len >= sizeof(head)) {
            ka_close(c);
            return;
        }
        memcpy(head, c->buf, head_len);
        head[head_len] = '\0';
        for (cl = head; *cl; cl++)
            if (strncasecmp(cl, "\ncontent-length:", 16) == 0) {
                body_len = strtoul(cl + 16, NULL, 10);
                break;
            }
        total = head_len + body_len;
        if (total > KA_REQ_MAX) {
            ka_close(c);
            return;
        }
        if (c->len < total)
            return;
        if (k->drop_all || (k->max_per_conn > 0 && c->served >= k->max_per_conn)) {
            /* Closed with the request unread: the client sees EOF or RST
             * before any response byte. */
            pthread_mutex_lock(&k->mu);
            k->dropped++;
            pthread_mutex_unlock(&k->mu);
            ka_close(c);
            return;
        }
        ka_answer(k, c, head, c->buf + head_len, body_len);
        c->served++;
        memmove(c->buf, c->buf + total, c->len - total);
        c->len -= total;
    }
}

static void *ka_thread(void *arg)
{
    ka_t *k = arg;
    struct pollfd pf[KA_CONNS + 2];
    int map[KA_CONNS + 2];

    for (;;) {
        int n = 0, i, r;
        double now = mono();

        pf[n].fd = k->stop_pipe[0]; pf[n].events = POLLIN; map[n++] = -1;
        pf[n].fd = k->lfd; pf[n].events = POLLIN; map[n++] = -1;
        for (i = 0; i < KA_CONNS; i++) {
            if (k->c[i].fd < 0)
                continue;
            if (k->idle_ms > 0 && k->c[i].len == 0 &&
                (now - k->c[i].last) * 1000 > k->idle_ms) {
                pthread_mutex_lock(&k->mu);
                k->idle_closed++;
                pthread_mutex_unlock(&k->mu);
                ka_close(&k->c[i]);
                continue;
            }
            pf[n].fd = k->c[i].fd; pf[n].events = POLLIN; map[n++] = i;
        }
        r = poll(pf, (nfds_t)n, 2);
        if (r < 0 && errno != EINTR)
            break;
        if (pf[0].revents)
            break;
        if (pf[1].revents & POLLIN) {
            int fd = accept(k->lfd, NULL, NULL), one = 1;

            for (i = 0; fd >= 0 && i < KA_CONNS; i++)
                if (k->c[i].fd < 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                    k->c[i].fd = fd;
                    k->c[i].served = 0;
                    k->c[i].last = mono();
                    k->c[i].buf = malloc(KA_REQ_MAX);
                    k->c[i].len = 0;
                    k->accepted++;
                    fd = -1;
                }
            if (fd >= 0)
                close(fd);
        }
        for (i = 2; i < n; i++) {
            ka_conn_t *c = &k->c[map[i]];
            ssize_t got;

            if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)) || c->fd < 0)
                continue;
            got = recv(c->fd, c->buf + c->len, KA_REQ_MAX - c->len, 0);
            if (got <= 0) {
                ka_close(c);
                continue;
            }
            c->len += (size_t)got;
            ka_input(k, c);
            if (c->fd >= 0)
                c->last = mono();
        }
    }
    return NULL;
}

static ka_t *ka_start(int max_per_conn, int idle_ms, bool drop_all, bool cached)
{
    ka_t *k = calloc(1, sizeof(*k));
    struct sockaddr_in sin = { .sin_family = AF_INET };
    socklen_t sl = sizeof(sin);
    int i;

    k->max_per_conn = max_per_conn;
    k->idle_ms = idle_ms;
    k->drop_all = drop_all;
    k->cached = cached;
    for (i = 0; i < KA_CONNS; i++)
        k->c[i].fd = -1;
    pthread_mutex_init(&k->mu, NULL);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    k->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(k->lfd >= 0);
    assert_int_equal(bind(k->lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(listen(k->lfd, 64), 0);
    assert_int_equal(getsockname(k->lfd, (struct sockaddr *)&sin, &sl), 0);
    k->port = ntohs(sin.sin_port);
    assert_int_equal(pipe(k->stop_pipe), 0);
    assert_int_equal(pthread_create(&k->thread, NULL, ka_thread, k), 0);
    return k;
}

static void ka_stop(ka_t *k)
{
    int i;

    assert_int_equal(write(k->stop_pipe[1], "x", 1), 1);
    pthread_join(k->thread, NULL);
    for (i = 0; i < KA_CONNS; i++)
        if (k->c[i].fd >= 0)
            ka_close(&k->c[i]);
    for (i = 0; i < k->n_log; i++) {
        free(k->log[i].body);
        free(k->log[i].answer);
    }
    close(k->lfd);
    close(k->stop_pipe[0]);
    close(k->stop_pipe[1]);
    pthread_mutex_destroy(&k->mu);
    free(k);
}

static void ka_url(const ka_t *k, char *buf, size_t len)
{
    snprintf(buf, len, "http://127.0.0.1:%d", k->port);
}

/* ---- running pd-bench ------------------------------------------------- */

static int run_bench(const char *const *args, double timeout_s)
{
    char *argv[64];
    int n = 0, status = 0;
    pid_t pid;
    double t0 = mono();
    struct timespec nap = { 0, 5 * 1000 * 1000 };

    argv[n++] = (char *)pd_bench_path;
    while (*args != NULL && n < 63)
        argv[n++] = (char *)*args++;
    argv[n] = NULL;
    assert_int_equal(posix_spawn(&pid, pd_bench_path, NULL, NULL, argv, environ), 0);
    while (waitpid(pid, &status, WNOHANG) != pid) {
        if (mono() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fail_msg("pd-bench did not stop within %.0f s", timeout_s);
        }
        nanosleep(&nap, NULL);
    }
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}


static void tmp_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", tmpdir, name);
}

/* ---- keep-alive -------------------------------------------------------- */

/* Every request after a connection's first arrives on a kept-alive
 * connection the server then closes unanswered: each is resent once on a
 * fresh connection and succeeds; reconnects are counted, not errors. */
static void test_keepalive_resend(void **state)
{
    ka_t *k = ka_start(1, 0, false, false);
    char url[64], out[300];
    cJSON *j, *res, *r;
    int reconnected = 0;

    ka_url(k, url, sizeof(url));
    tmp_path(out, sizeof(out), "ka.json");
    const char *args[] = { "--url", url, "--concurrency", "2", "--num-requests", "10",
                           "--input-len", "8", "--output-len", "4", "--quiet",
                           "--out", out, NULL };
    assert_int_equal(run_bench(args, 30), 0);
    j = load_json(out);
    res = cJSON_GetObjectItem(j, "results");
    assert_int_equal(num(res, "completed"), 10);
    assert_int_equal(num(res, "failed"), 0);
    assert_int_equal(num(cJSON_GetObjectItem(res, "errors"), "disconnect"), 0);
    /* Two slots: the first request of each on a new connection, the other
     * 8 on kept-alive ones the server closed. */
    assert_int_equal(num(res, "reconnects"), 8);
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(j, "requests")) {
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "success")));
        assert_int_equal(num(r, "output_tokens"), 4);
        if (cJSON_IsTrue(cJSON_GetObjectItem(r, "reconnected"))) {
            assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "conn_reused")));
            reconnected++;
        }
    }
    assert_int_equal(reconnected, 8);
    assert_int_equal(k->answered, 10);
    assert_int_equal(k->dropped, 8);
    cJSON_Delete(j);
    ka_stop(k);
}

/* A server that drops every request: a fresh connection closed before
 * the response is an error (disconnect), never resent, so nothing loops. */
static void test_disconnect_not_retried(void **state)
{
    ka_t *k = ka_start(0, 0, true, false);
    char url[64], out[300];
    cJSON *j, *res;

    ka_url(k, url, sizeof(url));
    tmp_path(out, sizeof(out), "drop.json");
    const char *args[] = { "--url", url, "--model", "m", "--concurrency", "2",
                           "--num-requests", "6", "--quiet", "--out", out, NULL };
    assert_int_equal(run_bench(args, 30), 0);
    j = load_json(out);
    res = cJSON_GetObjectItem(j, "results");
    assert_int_equal(num(res, "completed"), 0);
    assert_int_equal(num(cJSON_GetObjectItem(res, "errors"), "disconnect"), 6);
    assert_int_equal(num(res, "reconnects"), 0);
    assert_int_equal(k->dropped, 6);
    cJSON_Delete(j);
    ka_stop(k);
}

/* llama-server's idle timeout: connections idle for 15 ms are closed;
 * Poisson gaps of ~40 ms meet closed connections; nothing fails. */
static void test_idle_close(void **state)
{
    ka_t *k = ka_start(0, 15, false, false);
    char url[64], out[300];
    cJSON *j, *res;

    ka_url(k, url, sizeof(url));
    tmp_path(out, sizeof(out), "idle.json");
    const char *args[] = { "--url", url, "--rate", "25", "--concurrency", "1",
                           "--num-requests", "15", "--output-len", "2", "--seed", "3",
                           "--quiet", "--out", out, NULL };
    assert_int_equal(run_bench(args, 30), 0);
    j = load_json(out);
    res = cJSON_GetObjectItem(j, "results");
    assert_int_equal(num(res, "completed"), 15);
    assert_int_equal(num(res, "failed"), 0);
    assert_true(k->idle_closed > 0);
    assert_true(num(res, "connections_closed_idle") + num(res, "reconnects") > 0);
    cJSON_Delete(j);
    ka_stop(k);
}

/* ---- workloads ---------------------------------------------------------- */

/* Multi-turn with --system-len: every conversation starts with the same
 * system prompt (a shared prefix for the server's prefix cache). */
static void test_multi_turn_system(void **state)
{
    ka_t *k = ka_start(0, 0, false, true);
    char url[64];
    const char *sys0 = NULL;
    int i;

    (void)state;
    ka_url(k, url, sizeof(url));
    const char *args[] = { "--url", url, "--workload", "multi-turn",
                           "--conversations", "2", "--turns", "2", "--concurrency", "1",
                           "--input-len", "5", "--output-len", "3", "--system-len", "40",
                           "--seed", "3", NULL };
    assert_int_equal(run_bench(args, 30), 0);
    assert_int_equal(k->n_log, 4);
    cJSON *first = NULL;
    for (i = 0; i < k->n_log; i++) {
        cJSON *body = cJSON_Parse(k->log[i].body);
        cJSON *m0 = cJSON_GetArrayItem(cJSON_GetObjectItem(body, "messages"), 0);
        int n = cJSON_GetArraySize(cJSON_GetObjectItem(body, "messages"));

        assert_true(n == 2 || n == 4); /* system + the turns */
        assert_string_equal(cJSON_GetObjectItem(m0, "role")->valuestring, "system");
        assert_true(strlen(cJSON_GetObjectItem(m0, "content")->valuestring) > 40);
        if (first == NULL) {
            first = body;
            sys0 = cJSON_GetObjectItem(m0, "content")->valuestring;
            continue;
        }
        assert_string_equal(cJSON_GetObjectItem(m0, "content")->valuestring, sys0);
        cJSON_Delete(body);
    }
    cJSON_Delete(first);
    ka_stop(k);
}

/* Multi-turn: every turn's messages are the previous turn's messages, its
 * answer as the server streamed it, and a new user message. */
static void test_multi_turn(void **state)
{
    ka_t *k = ka_start(0, 0, false, true);
    char url[64], out[300];
    cJSON *j, *res, *pt, *t, *r;
    int i, turn_seen[4] = { 0 };

    ka_url(k, url, sizeof(url));
    tmp_path(out, sizeof(out), "mt.json");
    const char *args[] = { "--url", url, "--workload", "multi-turn",
                           "--conversations", "3", "--turns", "3", "--concurrency", "2",
                           "--input-len", "uniform:4:9", "--output-len", "3",
                           "--seed", "11", "--out", out, NULL };
    assert_int_equal(run_bench(args, 30), 0);
    assert_int_equal(k->n_log, 9);
    for (i = 0; i < k->n_log; i++) {
        cJSON *body = cJSON_Parse(k->log[i].body);
        cJSON *msgs = cJSON_GetObjectItem(body, "messages");
        int n = cJSON_GetArraySize(msgs), m, found = 0, pi;

        assert_true(k->log[i].chat);
        assert_true(n == 1 || n == 3 || n == 5);
        turn_seen[n / 2]++;
        for (m = 0; m < n; m++)
            assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(body, "messages"),
                                                   m)->child->valuestring,
                                m % 2 ? "assistant" : "user");
        if (n == 1) {
            cJSON_Delete(body);
            continue;
        }
        /* Its history = an earlier request's messages + that answer. */
        for (pi = 0; pi < i; pi++) {
            cJSON *pb = cJSON_Parse(k->log[pi].body);
            cJSON *pm = cJSON_GetObjectItem(pb, "messages");
            int pn = cJSON_GetArraySize(pm), q;
            bool same = pn == n - 2;

            for (q = 0; same && q < pn; q++)
                same = cJSON_Compare(cJSON_GetArrayItem(pm, q),
                                     cJSON_GetArrayItem(msgs, q), true);
            if (same && strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, n - 2),
                                                   "content")->valuestring,
                               k->log[pi].answer) == 0)
                found++;
            cJSON_Delete(pb);
        }
        assert_int_equal(found, 1);
        cJSON_Delete(body);
    }
    assert_int_equal(turn_seen[0], 3);
    assert_int_equal(turn_seen[1], 3);
    assert_int_equal(turn_seen[2], 3);

    j = load_json(out);
    res = cJSON_GetObjectItem(j, "results");
    assert_int_equal(num(res, "completed"), 9);
    assert_int_equal(num(res, "skipped_turns"), 0);
    assert_true(num(res, "total_cached_tokens") > 0);
    pt = cJSON_GetObjectItem(res, "per_turn");
    assert_int_equal(cJSON_GetArraySize(pt), 3);
    i = 0;
    cJSON_ArrayForEach(t, pt) {
        assert_int_equal(num(t, "turn"), ++i);
        assert_int_equal(num(t, "completed"), 3);
        assert_true(num(t, "mean_ttft_ms") > 0);
        /* The server reports half the prompt (messages) as cached. */
        assert_true(num(t, "mean_cached_tokens") == (double)((2 * i - 1) / 2));
    }
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(j, "requests")) {
        assert_true(num(r, "turn") >= 1 && num(r, "turn") <= 3);
        assert_true(num(r, "conversation") < 3);
        assert_true(cJSON_IsNumber(cJSON_GetObjectItem(r, "cached_tokens")));
    }
    cJSON_Delete(j);
    ka_stop(k);
}

static cJSON *log_prompt(ka_t *k, int i, cJSON **body)
{
    *body = cJSON_Parse(k->log[i].body);
    return cJSON_GetObjectItem(*body, "prompt");
}

static bool ids_equal(const cJSON *a, const cJSON *b, int from, int to)
{
    int i;

    for (i = from; i < to; i++)
        if (cJSON_GetArrayItem(a, i)->valuedouble != cJSON_GetArrayItem(b, i)->valuedouble)
            return false;
    return true;
}

/* Shared prefix: 2 groups x 3 prompts, 10-token prefix + 5 own tokens. */
static void test_shared_prefix(void **state)
{
    ka_t *k = ka_start(0, 0, false, false);
    char url[64], out[300];
    cJSON *bodies[6], *p[6], *j, *msgs;
    int i, g;

    ka_url(k, url, sizeof(url));
    tmp_path(out, sizeof(out), "sp.json");
    const char *args[] = { "--url", url, "--workload", "shared-prefix",
                           "--prefix-groups", "2", "--prefix-prompts", "3",
                           "--prefix-len", "10", "--input-len", "5", "--prompt-ids",
                           "100:100000", "--output-len", "2", "--quiet", "--out", out,
                           NULL };
    assert_int_equal(run_bench(args, 30), 0);
    assert_int_equal(k->n_log, 6);
    /* Concurrency 1: the server's log is in request order. */
    for (i = 0; i < 6; i++) {
        p[i] = log_prompt(k, i, &bodies[i]);
        assert_int_equal(cJSON_GetArraySize(p[i]), 15);
    }
    for (g = 0; g < 2; g++)
        for (i = g + 2; i < 6; i += 2) {
            assert_true(ids_equal(p[g], p[i], 0, 10));
            assert_false(ids_equal(p[g], p[i], 10, 15));
        }
    assert_false(ids_equal(p[0], p[1], 0, 10));
    for (i = 0; i < 6; i++)
        cJSON_Delete(bodies[i]);
    j = load_json(out);
    assert_int_equal(num(cJSON_GetObjectItem(j, "results"), "completed"), 6);
    cJSON_Delete(j);

    /* Chat: the prefix is the system message. */
    const char *chat[] = { "--url", url, "--workload", "shared-prefix", "--endpoint",
                           "chat", "--prefix-prompts", "2", "--prefix-len", "12",
                           "--input-len", "4", "--output-len", "2", "--quiet", NULL };
    assert_int_equal(run_bench(chat, 30), 0);
    assert_int_equal(k->n_log, 8);
    for (i = 6; i < 8; i++) {
        bodies[i - 6] = cJSON_Parse(k->log[i].body);
        msgs = cJSON_GetObjectItem(bodies[i - 6], "messages");
        assert_int_equal(cJSON_GetArraySize(msgs), 2);
        assert_string_equal(cJSON_GetArrayItem(msgs, 0)->child->valuestring, "system");
    }
    assert_true(cJSON_Compare(cJSON_GetArrayItem(cJSON_GetObjectItem(bodies[0], "messages"), 0),
                              cJSON_GetArrayItem(cJSON_GetObjectItem(bodies[1], "messages"), 0),
                              true));
    cJSON_Delete(bodies[0]);
    cJSON_Delete(bodies[1]);
    ka_stop(k);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    fclose(f);
}

/* Trace replay (Mooncake format, block size 8): prompts share blocks
 * exactly where hash ids match; arrivals follow the timestamps. */
static void test_trace_replay(void **state)
{
    ka_t *k = ka_start(0, 0, false, false);
    char url[64], out[300], trace[300];
    cJSON *bodies[4], *p[4], *j, *r;
    int i;
    static const int in_len[4] = { 20, 24, 12, 3 };
    static const double at_ms[4] = { 0, 200, 400, 600 };

    ka_url(k, url, sizeof(url));
    tmp_path(out, sizeof(out), "tr.json");
    tmp_path(trace, sizeof(trace), "trace.jsonl");
    write_file(trace,
               "{\"timestamp\": 1000, \"input_length\": 20, \"output_length\": 3, \"hash_ids\": [1, 2, 7]}\n"
               "\n"
               "{\"timestamp\": 1200, \"input_length\": 24, \"output_length\": 2, \"hash_ids\": [1, 2, 3]}\n"
               "{\"timestamp\": 1400, \"input_length\": 12, \"output_length\": 1, \"hash_ids\": [1, 4]}\n"
               "{\"timestamp\": 1600, \"input_length\": 3, \"output_length\": 4, \"hash_ids\": []}\n");
    const char *args[] = { "--url", url, "--trace", trace, "--block-size", "8",
                           "--prompt-ids", "0:1000000", "--quiet", "--out", out, NULL };
    assert_int_equal(run_bench(args, 30), 0);
    assert_int_equal(k->n_log, 4);
    for (i = 0; i < 4; i++) {
        p[i] = log_prompt(k, i, &bodies[i]);
        assert_int_equal(cJSON_GetArraySize(p[i]), in_len[i]);
    }
    assert_true(ids_equal(p[0], p[1], 0, 16));      /* hash 1, 2 */
    assert_false(ids_equal(p[0], p[1], 16, 20));    /* 7 vs 3 */
    assert_true(ids_equal(p[0], p[2], 0, 8));       /* hash 1 */
    assert_false(ids_equal(p[0], p[2], 8, 12));     /* 2 vs 4 */
    assert_false(ids_equal(p[0], p[3], 0, 3));      /* no hash: its own */
    assert_int_equal(num(bodies[0], "max_tokens"), 3);
    assert_int_equal(num(bodies[3], "max_tokens"), 4);
    for (i = 0; i < 4; i++)
        cJSON_Delete(bodies[i]);
    j = load_json(out);
    assert_string_equal(cJSON_GetObjectItem(j, "mode")->valuestring, "trace");
    assert_int_equal(num(cJSON_GetObjectItem(j, "results"), "completed"), 4);
    i = 0;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(j, "requests")) {
        /* Sent at the trace's (relative) times, within a loose bound for a
         * shared machine (timers only run late). */
        assert_true(num(r, "start_ms") >= at_ms[i] - 1);
        assert_true(num(r, "start_ms") < at_ms[i] + 100);
        i++;
    }
    cJSON_Delete(j);

    /* --trace-speed 2 halves the gaps: the last at 300 ms, not 600. */
    const char *fast[] = { "--url", url, "--trace", trace, "--block-size", "8",
                           "--trace-speed", "2", "--quiet", "--out", out, NULL };
    assert_int_equal(run_bench(fast, 30), 0);
    j = load_json(out);
    r = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "requests"), 3);
    assert_true(num(r, "start_ms") >= 299 && num(r, "start_ms") < 450);
    cJSON_Delete(j);
    ka_stop(k);
}

/* Bad traces: a clear error (exit 2), nothing sent. */
static void test_trace_errors(void **state)
{
    static const char *const bad[] = {
        "{\"timestamp\": 0, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [1, 2, 3]}\n",
        "{\"timestamp\": 0, \"input_length\": -3, \"output_length\": 1}\n",
        "{\"timestamp\": 0, \"input_length\": 99999999, \"output_length\": 1}\n",
        "{\"timestamp\": 0, \"input_length\": 8, \"output_length\": 1.5}\n",
        /* timestamps going back */
        ("{\"timestamp\": 5, \"input_length\": 8, \"output_length\": 1}\n"
         "{\"timestamp\": 4, \"input_length\": 8, \"output_length\": 1}\n"),
        "{\"timestamp\": 0, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [-1]}\n",
        "not json\n",
        "\n\n",
    };
    char trace[300], *big;
    size_t i;

    tmp_path(trace, sizeof(trace), "bad.jsonl");
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *args[] = { "--url", "http://127.0.0.1:9", "--model", "m",
                               "--trace", trace, "--block-size", "4", "--quiet", NULL };
        write_file(trace, bad[i]);
        assert_int_equal(run_bench(args, 10), 2);
    }
    /* A line over the 1 MiB cap. */
    big = malloc(2u << 20);
    memset(big, ' ', (2u << 20) - 2);
    big[(2u << 20) - 2] = '\n';
    big[(2u << 20) - 1] = '\0';
    memcpy(big, "{\"timestamp\": 0,", 16);
    write_file(trace, big);
    free(big);
    {
        const char *args[] = { "--url", "http://127.0.0.1:9", "--model", "m",
                               "--trace", trace, "--quiet", NULL };
        assert_int_equal(run_bench(args, 10), 2);
    }
    {
        const char *no_trace[] = { "--workload", "trace", "--model", "m", NULL };
        const char *mt_rate[] = { "--workload", "multi-turn", "--rate", "3",
                                  "--model", "m", NULL };
        const char *too_many[] = { "--workload", "multi-turn", "--conversations",
                                   "100000", "--turns", "1000", "--model", "m", NULL };
        assert_int_equal(run_bench(no_trace, 10), 2);
        assert_int_equal(run_bench(mt_rate, 10), 2);
        assert_int_equal(run_bench(too_many, 10), 2);
    }
}

/* ---- --compare ---------------------------------------------------------- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The same workload against two servers (one closing every kept-alive
 * connection): the same request bodies, and every figure side by side. */
static void test_compare(void **state)
{
    ka_t *a = ka_start(0, 0, false, false), *b = ka_start(1, 0, false, true);
    char url_a[64], url_b[64], out[300];
    char *ba[8], *bb[8];
    cJSON *j, *sbs, *row, *cmp;
    int i;

    ka_url(a, url_a, sizeof(url_a));
    ka_url(b, url_b, sizeof(url_b));
    tmp_path(out, sizeof(out), "cmp.json");
    const char *args[] = { "--url", url_a, "--compare", url_b, "--rate", "100",
                           "--num-requests", "8", "--input-len", "uniform:5:30",
                           "--output-len", "uniform:1:6", "--seed", "21", "--out", out,
                           NULL };
    assert_int_equal(run_bench(args, 30), 0);
    assert_int_equal(a->n_log, 8);
    assert_int_equal(b->n_log, 8);
    for (i = 0; i < 8; i++) {
        ba[i] = a->log[i].body;
        bb[i] = b->log[i].body;
    }
    qsort(ba, 8, sizeof(ba[0]), cmp_str);
    qsort(bb, 8, sizeof(bb[0]), cmp_str);
    for (i = 0; i < 8; i++)
        assert_string_equal(ba[i], bb[i]);

    j = load_json(out);
    assert_string_equal(cJSON_GetObjectItem(j, "url")->valuestring, url_a);
    cmp = cJSON_GetObjectItem(j, "compare");
    assert_string_equal(cJSON_GetObjectItem(cmp, "url")->valuestring, url_b);
    assert_int_equal(num(cJSON_GetObjectItem(cmp, "results"), "completed"), 8);
    assert_int_equal(num(cJSON_GetObjectItem(cmp, "results"), "failed"), 0);
    /* Same arrivals: the seeded schedule is the same for both. */
    assert_int_equal(num(cJSON_GetObjectItem(j, "results"), "arrivals"),
                     num(cJSON_GetObjectItem(cmp, "results"), "arrivals"));
    sbs = cJSON_GetObjectItem(j, "side_by_side");
    row = cJSON_GetObjectItem(sbs, "completed");
    assert_int_equal(num(row, "url"), 8);
    assert_int_equal(num(row, "compare"), 8);
    assert_float_equal(num(row, "ratio"), 1.0, 1e-12);
    row = cJSON_GetObjectItem(sbs, "total_output_tokens");
    assert_float_equal(num(row, "ratio"), 1.0, 1e-12);
    row = cJSON_GetObjectItem(sbs, "mean_ttft_ms");
    assert_float_equal(num(row, "ratio"), num(row, "compare") / num(row, "url"), 1e-9);
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(row, "higher_is_better")));
    assert_non_null(cJSON_GetObjectItem(sbs, "p99_itl_ms"));
    assert_non_null(cJSON_GetObjectItem(sbs, "errors.timeout"));
    /* cached tokens: only the second server reports them. */
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "results"),
                                                 "total_cached_tokens")));
    assert_true(num(cJSON_GetObjectItem(cmp, "results"), "total_cached_tokens") > 0);
    cJSON_Delete(j);
    ka_stop(a);
    ka_stop(b);
}

/* --compare with multi-turn: per-turn figures side by side. */
static void test_compare_multi_turn(void **state)
{
    ka_t *a = ka_start(0, 0, false, true), *b = ka_start(2, 0, false, true);
    char url_a[64], url_b[64], out[300];
    cJSON *j, *sbs;

    ka_url(a, url_a, sizeof(url_a));
    ka_url(b, url_b, sizeof(url_b));
    tmp_path(out, sizeof(out), "cmpmt.json");
    const char *args[] = { "--url", url_a, "--compare", url_b, "--workload", "multi-turn",
                           "--conversations", "2", "--turns", "2", "--output-len", "2",
                           "--input-len", "5", "--out", out, NULL };
    assert_int_equal(run_bench(args, 30), 0);
    j = load_json(out);
    sbs = cJSON_GetObjectItem(j, "side_by_side");
    assert_non_null(cJSON_GetObjectItem(sbs, "turn2.mean_ttft_ms"));
    assert_float_equal(num(cJSON_GetObjectItem(sbs, "turn1.completed"), "ratio"), 1.0, 1e-12);
    assert_int_equal(num(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "compare"),
                                             "results"), "completed"), 4);
    cJSON_Delete(j);
    ka_stop(a);
    ka_stop(b);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keepalive_resend),
        cmocka_unit_test(test_disconnect_not_retried),
        cmocka_unit_test(test_idle_close),
        cmocka_unit_test(test_multi_turn),
        cmocka_unit_test(test_multi_turn_system),
        cmocka_unit_test(test_shared_prefix),
        cmocka_unit_test(test_trace_replay),
        cmocka_unit_test(test_trace_errors),
        cmocka_unit_test(test_compare),
        cmocka_unit_test(test_compare_multi_turn),
    };
    int rc;

    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH-TO-pd-bench\n", argv[0]);
        return 2;
    }
    pd_bench_path = argv[1];
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/pb-work-XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        return 1;
    signal(SIGPIPE, SIG_IGN);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0)
            rc = 1;
    }
    return rc;
}
