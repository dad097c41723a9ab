/* test_tokstall.c - a huge prompt never stalls the router's other streams
 * (issue 31 item 1), real processes (tests/harness/pd_e2e.h).
 *
 * usage: test-tokstall normal|mdwe ROUTER PREFILL DECODE MODEL MDWE_EXEC
 *
 * 8 streams run on the built-in model (byte-level BPE tokenizer); a client
 * posts a 1 MiB prompt; every stream's chunk arrival times are recorded on
 * the client side. Pass: no stream's largest gap while the big prompt is in
 * the router exceeds its median gap by more than 150 ms (ASan: 500 ms). The
 * figures are printed. `mdwe`: the router runs under
 * prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN) (what systemd's
 * MemoryDenyWriteExecute=yes does; PCRE2's JIT fails there), via MDWE_EXEC,
 * a wrapper that sets it and execs the router. Exit 77 when the kernel has
 * no PR_SET_MDWE. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pd_e2e.h"

#define N_STREAMS 8
#define MAX_CHUNKS 4096
#define BIG_BYTES (1u << 20)
#define STREAM_TOKENS "300" /* long enough to span the big prompt */

/* The target is 50 ms beyond the ITL (issue 31; measured 13-23 ms, the
 * 1 MiB body's JSON parse on the loop). The bound here is 150 ms: meson runs
 * this beside another test and `make test` beside the ASan build on 2 cores,
 * and a bound at the target would fail on the machine, not the router. The
 * router before tokenizing off its loop stalled its streams 233 ms, and over
 * 30 s under MDWE. */
#if defined(__SANITIZE_ADDRESS__)
#define GAP_BOUND_S 0.500
#else
#define GAP_BOUND_S 0.150
#endif

typedef struct {
    uint16_t port;
    int idx;
    double t[MAX_CHUNKS];   /* arrival of each data: chunk */
    int n;
    bool done, failed;
} stream_t;

static stream_t g_st[N_STREAMS];
static volatile int g_started;

static void *stream_main(void *arg)
{
    stream_t *s = arg;
    char body[512];
    snprintf(body, sizeof(body),
             "{\"prompt\":\"Once upon a time %d\",\"max_tokens\":" STREAM_TOKENS ",\"stream\":true,"
             "\"ignore_eos\":true,\"temperature\":0}", s->idx);
    int fd = e2e_http_connect(s->port);
    if (fd < 0 || e2e_http_send(fd, "POST", "/v1/completions", NULL, body, strlen(body)) != 0) {
        s->failed = true;
        return NULL;
    }
    char buf[65536];
    size_t carry = 0;
    bool counted = false;
    for (;;) {
        ssize_t k = recv(fd, buf + carry, sizeof(buf) - carry - 1, 0);
        if (k <= 0)
            break;
        double now = e2e_now();
        size_t len = carry + (size_t)k;
        buf[len] = '\0';
        /* count "data: " occurrences, keep a short tail for split markers */
        for (char *p = buf; (p = strstr(p, "data: ")) != NULL; p += 6) {
            if (strncmp(p, "data: [DONE]", 12) == 0) {
                s->done = true;
                continue;
            }
            if (s->n < MAX_CHUNKS)
                s->t[s->n++] = now;
        }
        if (s->n >= 3 && !counted) {
            counted = true;
            __sync_fetch_and_add(&g_started, 1);
        }
        if (s->done)
            break;
        carry = len < 5 ? len : 5;
        memmove(buf, buf + len - carry, carry);
        /* a "data: " split at the end is at most 5 bytes: drop a whole one */
        if (strstr(buf, "data: ") != NULL)
            carry = 0;
    }
    close(fd);
    if (!counted)
        __sync_fetch_and_add(&g_started, 1);
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static bool mdwe_supported(void)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(prctl(65 /* PR_SET_MDWE */, 1 /* REFUSE_EXEC_GAIN */, 0L, 0L, 0L) == 0 ? 0 : 1);
    int st = 1;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr, "usage: %s normal|mdwe ROUTER PREFILL DECODE MODEL MDWE_EXEC\n", argv[0]);
        return 2;
    }
    bool mdwe = strcmp(argv[1], "mdwe") == 0;
    if (mdwe && !mdwe_supported()) {
        printf("SKIP: kernel without PR_SET_MDWE\n");
        return 77;
    }
    static char env_real[600];
    snprintf(env_real, sizeof(env_real), "PD_MDWE_EXEC=%s", argv[2]);
    const char *env[] = { env_real, NULL };
    const char *rargs[] = { "--max-body=4MiB", NULL };
    const char *dargs[] = { "--kv-blocks=2048", NULL };
    e2e_opts_t o = {
        .router_bin = mdwe ? argv[6] : argv[2], .prefill_bin = argv[3], .decode_bin = argv[4],
        .model = argv[5], .router_args = rargs, .decode_args = dargs, .env = env,
        .n_prefill = 1, .n_decode = 1, .ready_timeout_s = 60,
    };
    e2e_deploy_t d;
    if (e2e_deploy_start(&d, &o) != 0) {
        fprintf(stderr, "FAIL: deployment did not start\n");
        e2e_deploy_stop(&d, true);
        return 1;
    }
    int rc = 0;
    pthread_t th[N_STREAMS];
    for (int i = 0; i < N_STREAMS; i++) {
        g_st[i].port = d.http_port;
        g_st[i].idx = i;
        pthread_create(&th[i], NULL, stream_main, &g_st[i]);
    }
    double t_wait = e2e_now();
    while (g_started < N_STREAMS && e2e_now() - t_wait < 60)
        e2e_nap_ms(5);

    /* the big prompt: words, numbers, punctuation, unicode, newlines */
    static const char unit[] = "The quick brown fox's 1234 jumps; caf\\u00e9 \\u4f60\\u597d!\\n";
    char *body = malloc(BIG_BYTES + 256);
    size_t bl = (size_t)snprintf(body, 64, "{\"max_tokens\":1,\"prompt\":\"");
    while (bl + sizeof(unit) < BIG_BYTES)
        bl += (size_t)snprintf(body + bl, sizeof(unit), "%s", unit);
    bl += (size_t)snprintf(body + bl, 8, "\"}");
    e2e_resp_t resp;
    double t0 = e2e_now();
    e2e_http(d.http_port, "POST", "/v1/completions", NULL, body, 30.0, &resp);
    double t1 = e2e_now();
    free(body);
    printf("big prompt: %zu bytes of JSON, HTTP %d in %.3f s%s\n", bl, resp.status, t1 - t0,
           resp.timed_out ? " (timed out)" : "");
    e2e_resp_free(&resp);

    for (int i = 0; i < N_STREAMS; i++)
        pthread_join(th[i], NULL);

    double worst_excess = 0;
    for (int i = 0; i < N_STREAMS; i++) {
        stream_t *s = &g_st[i];
        if (s->failed || s->n < 10) {
            printf("stream %d: failed (%d chunks)\n", i, s->n);
            rc = 1;
            continue;
        }
        double *gaps = malloc(sizeof(double) * (size_t)s->n);
        int ng = 0;
        double max_in = 0;
        for (int k = 1; k < s->n; k++) {
            double g = s->t[k] - s->t[k - 1];
            gaps[ng++] = g;
            /* a gap that overlaps the big request's time in the router */
            if (s->t[k] >= t0 && s->t[k - 1] <= t1 + 0.05 && g > max_in)
                max_in = g;
        }
        qsort(gaps, (size_t)ng, sizeof(double), cmp_d);
        double med = gaps[ng / 2], p99 = gaps[(ng * 99) / 100];
        bool covered = s->t[0] < t0 && s->t[s->n - 1] > t1;
        double excess = max_in - med;
        if (excess > worst_excess)
            worst_excess = excess;
        printf("stream %d: %d chunks%s, ITL median %.2f ms p99 %.2f ms, largest gap during "
               "the big prompt %.2f ms (+%.2f ms)%s\n", i, s->n, s->done ? "" : " (no [DONE])",
               med * 1e3, p99 * 1e3, max_in * 1e3, excess * 1e3,
               covered ? "" : " [stream did not span the big prompt]");
        /* a stream that did not span the big prompt measured nothing */
        if (!s->done || !covered || excess > GAP_BOUND_S)
            rc = 1;
        free(gaps);
    }
    printf("worst gap beyond the median ITL: %.2f ms (bound %.0f ms)\n", worst_excess * 1e3,
           GAP_BOUND_S * 1e3);
    double offl = e2e_router_stat(&d.router, "tokenize_offloaded");
    printf("router tokenize_offloaded = %.0f\n", offl);
    /* the access log (issue 31 item 8): one line per stream where it ended,
     * and the refused big prompt (400, too long for the context) */
    FILE *lf = fopen(d.router.log, "r");
    int n_ok = 0, n_refused = 0;
    char line[2048];
    while (lf != NULL && fgets(line, sizeof(line), lf) != NULL) {
        if (strstr(line, "access client=127.0.0.1:") == NULL)
            continue;
        if (strstr(line, "endpoint=/v1/completions status=200 outcome=completed prompt_tokens=") &&
            strstr(line, "completion_tokens=" STREAM_TOKENS " ") && strstr(line, "decode=decode-0"))
            n_ok++;
        if (strstr(line, "endpoint=/v1/completions status=400 outcome=refused") &&
            strstr(line, "code=context_length_exceeded"))
            n_refused++;
    }
    if (lf != NULL)
        fclose(lf);
    printf("access log: %d completed lines, %d refused lines\n", n_ok, n_refused);
    if (n_ok != N_STREAMS || n_refused != 1)
        rc = 1;
    char why[512] = "";
    if (!e2e_quiescent(&d, 10.0, why, sizeof(why))) {
        printf("FAIL: not quiescent: %s\n", why);
        rc = 1;
    }
    if (e2e_deploy_stop(&d, rc != 0) != 0)
        rc = 1;
    printf("%s\n", rc == 0 ? "ok" : "FAIL");
    return rc;
}
