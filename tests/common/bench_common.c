/* bench_common.c - figures for the hot parts of common/:
 *   stats_inc      pd_stats_inc, 1 thread and 2 threads (same set)
 *   hist_observe   pd_stats_observe_ns
 *   queue_to_loop  items/s from a worker thread through pd_queue + eventfd
 *                  into the loop
 *   admin_rtt      `version` round trips over the admin socket (in-process
 *                  server thread), p50/p99
 * Each figure is printed next to an in-run baseline (a plain increment, a
 * mutex-only queue with no loop, ...) and, with --baseline FILE, next to a
 * previous run's figures with the ratio. --save FILE writes this run.
 * --quick shortens every loop (the bench-smoke suite uses it). */
#include "pd_admin.h"
#include "pd_loop.h"
#include "pd_stats.h"
#include "pd_time.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define B_STATS(X)                                                            \
    X(ops, COUNTER, "ops")                                                    \
    X(lat, HISTOGRAM, "latency")
#define B_STAT_ID(name, kind, help) B_ST_##name,
typedef enum { B_STATS(B_STAT_ID) B_ST__COUNT } b_stat_id_t;
static const pd_stat_desc_t b_descs[] = { B_STATS(PD_STAT_DESC) };
static const pd_stats_table_t b_table = PD_STATS_TABLE("bench", b_descs);

typedef struct {
    char name[48];
    double value;
    const char *unit;
    double baseline;            /* in-run baseline, 0 = none */
    const char *baseline_what;
} result_t;

static result_t results[32];
static int n_results;
static long iters = 20 * 1000 * 1000;

static void record(const char *name, double value, const char *unit,
                   double baseline, const char *baseline_what)
{
    result_t *r = &results[n_results++];
    snprintf(r->name, sizeof(r->name), "%s", name);
    r->value = value;
    r->unit = unit;
    r->baseline = baseline;
    r->baseline_what = baseline_what;
}

/* ---- stats ------------------------------------------------------------- */

static volatile uint64_t plain_counter;

typedef struct {
    pd_stats_t *s;
    long n;
} inc_arg_t;

static void *inc_thread(void *arg)
{
    inc_arg_t *a = arg;
    for (long i = 0; i < a->n; i++)
        pd_stats_inc(a->s, B_ST_ops);
    return NULL;
}

static void bench_stats(void)
{
    pd_stats_t *s;
    if (pd_stats_create(&b_table, NULL, &s) != PD_OK)
        exit(1);
    uint64_t t0 = pd_now_ns();
    for (long i = 0; i < iters; i++)
        plain_counter++;
    double base = (double)(pd_now_ns() - t0) / (double)iters;

    t0 = pd_now_ns();
    for (long i = 0; i < iters; i++)
        pd_stats_inc(s, B_ST_ops);
    double one = (double)(pd_now_ns() - t0) / (double)iters;
    record("stats_inc_1thread", one, "ns/op", base, "volatile ++");

    pthread_t th[2];
    inc_arg_t a = { s, iters / 2 };
    t0 = pd_now_ns();
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, inc_thread, &a);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    double two = (double)(pd_now_ns() - t0) / (double)iters;
    record("stats_inc_2threads", two, "ns/op", one, "1 thread");

    t0 = pd_now_ns();
    for (long i = 0; i < iters / 4; i++)
        pd_stats_observe_ns(s, B_ST_lat, (uint64_t)i * 37);
    double obs = (double)(pd_now_ns() - t0) / (double)(iters / 4);
    record("hist_observe", obs, "ns/op", one, "counter inc");
    pd_stats_destroy(s);
}

/* ---- queue ------------------------------------------------------------- */

typedef struct {
    pd_loop_t *loop;
    pd_queue_t *q;
    pd_queue_node_t *nodes;     /* (n) */
    long n, got;
} qb_t;

static void *q_producer(void *arg)
{
    qb_t *b = arg;
    for (long i = 0; i < b->n; i++)
        while (pd_queue_push(b->q, &b->nodes[i]) == PD_ERR_BUSY)
            sched_yield();
    return NULL;
}

static void q_cb(pd_queue_t *q, pd_queue_node_t *node, void *arg)
{
    qb_t *b = arg;
    if (++b->got == b->n)
        pd_loop_stop(b->loop);
}

static void bench_queue(void)
{
    qb_t b = { 0 };
    b.n = iters / 20;
    b.nodes = calloc((size_t)b.n, sizeof(*b.nodes));
    /* baseline: same push/pop, one thread, no loop, no eventfd wakeups */
    pd_queue_t *q;
    pd_queue_create(0, &q);
    uint64_t t0 = pd_now_ns();
    for (long i = 0; i < b.n; i++) {
        pd_queue_push(q, &b.nodes[i]);
        pd_queue_pop(q);
    }
    double base = (double)b.n / ((double)(pd_now_ns() - t0) / 1e9);
    pd_queue_destroy(q);

    pd_loop_create(&b.loop);
    pd_queue_create(4096, &b.q);
    pd_queue_attach(b.q, b.loop, q_cb, &b, 0);
    pthread_t th;
    t0 = pd_now_ns();
    pthread_create(&th, NULL, q_producer, &b);
    pd_loop_run(b.loop);
    double rate = (double)b.n / ((double)(pd_now_ns() - t0) / 1e9);
    pthread_join(th, NULL);
    record("queue_thread_to_loop", rate, "items/s", base, "same-thread push+pop");
    pd_queue_destroy(b.q);
    pd_loop_destroy(b.loop);
    free(b.nodes);
}

/* ---- admin round trips ------------------------------------------------- */

static void *loop_thread(void *arg)
{
    pd_loop_run(arg);
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void bench_admin(void)
{
    char path[108];
    snprintf(path, sizeof(path), "/tmp/pd-bench-admin-%d.sock", (int)getpid());
    pd_loop_t *loop;
    pd_admin_t *admin;
    pd_loop_create(&loop);
    pd_admin_opts_t opts = { .path = path, .prog = "bench" };
    if (pd_admin_create(loop, &opts, &admin) != PD_OK) {
        fprintf(stderr, "bench: cannot create admin socket %s\n", path);
        exit(1);
    }
    pthread_t th;
    pthread_create(&th, NULL, loop_thread, loop);

    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0)
        exit(1);
    long n = iters / 1000;
    uint64_t *lat = calloc((size_t)n, sizeof(*lat));
    char buf[4096];
    for (long i = 0; i < n; i++) {
        uint64_t t0 = pd_now_ns();
        if (write(fd, "version\n", 8) != 8)
            exit(1);
        size_t got = 0;
        for (;;) {
            ssize_t k = read(fd, buf + got, sizeof(buf) - got);
            if (k <= 0)
                exit(1);
            got += (size_t)k;
            if (buf[got - 1] == '\n')
                break;
        }
        lat[i] = pd_now_ns() - t0;
    }
    close(fd);
    qsort(lat, (size_t)n, sizeof(*lat), cmp_u64);
    record("admin_version_rtt_p50", (double)lat[n / 2] / 1e3, "us", 0, NULL);
    record("admin_version_rtt_p99", (double)lat[n * 99 / 100] / 1e3, "us",
           (double)lat[n / 2] / 1e3, "p50");
    free(lat);
    pd_loop_stop(loop);
    pthread_join(th, NULL);
    pd_admin_destroy(admin);
    pd_loop_destroy(loop);
}

/* ---- output ------------------------------------------------------------ */

static double baseline_value(cJSON *base, const char *name)
{
    cJSON *v = base ? cJSON_GetObjectItem(base, name) : NULL;
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

int main(int argc, char **argv)
{
    const char *save = NULL, *baseline = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            iters = 200 * 1000;
        else if (!strncmp(argv[i], "--save=", 7))
            save = argv[i] + 7;
        else if (!strncmp(argv[i], "--baseline=", 11))
            baseline = argv[i] + 11;
        else {
            fprintf(stderr, "usage: %s [--quick] [--save=FILE] [--baseline=FILE]\n", argv[0]);
            return 2;
        }
    }
    cJSON *base = NULL;
    if (baseline) {
        FILE *f = fopen(baseline, "r");
        char text[8192] = "";
        if (f == NULL) {
            fprintf(stderr, "bench: cannot open %s\n", baseline);
            return 2;
        }
        size_t n = fread(text, 1, sizeof(text) - 1, f);
        text[n] = '\0';
        fclose(f);
        base = cJSON_Parse(text);
    }

    bench_stats();
    bench_queue();
    bench_admin();

    printf("%-24s %14s %-8s | %-34s %7s | %12s %7s\n", "figure", "value", "unit",
           "in-run baseline", "ratio", "prev run", "ratio");
    cJSON *out = cJSON_CreateObject();
    for (int i = 0; i < n_results; i++) {
        result_t *r = &results[i];
        char inrun[64] = "-", inratio[16] = "-", prev[32] = "-", pratio[16] = "-";
        if (r->baseline > 0) {
            snprintf(inrun, sizeof(inrun), "%.2f (%s)", r->baseline, r->baseline_what);
            snprintf(inratio, sizeof(inratio), "%.2fx", r->value / r->baseline);
        }
        double pv = baseline_value(base, r->name);
        if (pv > 0) {
            snprintf(prev, sizeof(prev), "%.2f", pv);
            snprintf(pratio, sizeof(pratio), "%.2fx", r->value / pv);
        }
        printf("%-24s %14.2f %-8s | %-34s %7s | %12s %7s\n", r->name, r->value,
               r->unit, inrun, inratio, prev, pratio);
        cJSON_AddNumberToObject(out, r->name, r->value);
    }
    if (save) {
        char *text = cJSON_Print(out);
        FILE *f = fopen(save, "w");
        if (f == NULL || text == NULL)
            return 1;
        fprintf(f, "%s\n", text);
        fclose(f);
        cJSON_free(text);
    }
    cJSON_Delete(out);
    cJSON_Delete(base);
    return 0;
}
