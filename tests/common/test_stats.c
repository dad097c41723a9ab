/* test_stats.c - stats sets: updates from threads, histogram buckets and
 * quantiles, JSON parsed back, Prometheus text checked by promtool. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "pd_build_config.h"
#include "pd_stats.h"
#include "pd_time.h"

#include <cjson/cJSON.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_STATS(X)                                                            \
    X(pulls_started, COUNTER, "Pulls started")                                \
    X(bytes_pulled, COUNTER, "Bytes pulled")                                  \
    X(pulls_inflight, GAUGE, "Pulls in flight")                               \
    X(pull_latency, HISTOGRAM, "Pull latency, \\ start to end\nsecond line")

#define T_STAT_ID(name, kind, help) T_ST_##name,
typedef enum { T_STATS(T_STAT_ID) T_ST__COUNT } t_stat_id_t;
static const pd_stat_desc_t t_descs[] = { T_STATS(PD_STAT_DESC) };
static const pd_stats_table_t t_table = PD_STATS_TABLE("kvx", t_descs);

#define U_STATS(X) X(requests, COUNTER, "Requests")
#define U_STAT_ID(name, kind, help) U_ST_##name,
typedef enum { U_STATS(U_STAT_ID) U_ST__COUNT } u_stat_id_t;
static const pd_stat_desc_t u_descs[] = { U_STATS(PD_STAT_DESC) };
static const pd_stats_table_t u_table = PD_STATS_TABLE("pf", u_descs);

static void test_table_macros(void **state)
{
    assert_int_equal(t_table.n, T_ST__COUNT);
    assert_string_equal(t_descs[T_ST_pull_latency].name, "pull_latency");
    assert_int_equal(t_descs[T_ST_pull_latency].kind, PD_STAT_HISTOGRAM);
    assert_int_equal(t_descs[T_ST_pulls_inflight].kind, PD_STAT_GAUGE);
}

static void test_labels_validation(void **state)
{
    pd_stats_t *s;
    assert_int_equal(pd_stats_create(&t_table, (const char *[]){ "peer", NULL }, &s),
                     PD_ERR_BAD_INPUT);
    assert_int_equal(pd_stats_create(&t_table, (const char *[]){ "9x", "v", NULL }, &s),
                     PD_ERR_BAD_INPUT);
    assert_int_equal(pd_stats_create(&t_table, (const char *[]){ "peer", "d\"1", NULL }, &s),
                     PD_OK);
    assert_string_equal(pd_stats_labels(s)[1], "d\"1");
    pd_stats_destroy(s);
    pd_stats_destroy(NULL);
    /* NULL set: updates are no-ops */
    pd_stats_inc(NULL, T_ST_pulls_started);
    assert_int_equal(pd_stats_counter(NULL, T_ST_pulls_started), 0);
}

typedef struct {
    pd_stats_t *s;
    int n;
} worker_arg_t;

static void *worker(void *arg)
{
    worker_arg_t *w = arg;
    for (int i = 0; i < w->n; i++) {
        pd_stats_inc(w->s, T_ST_pulls_started);
        pd_stats_add(w->s, T_ST_bytes_pulled, 10);
        pd_stats_gauge_add(w->s, T_ST_pulls_inflight, 1);
        pd_stats_observe_ns(w->s, T_ST_pull_latency, 1500);
        pd_stats_gauge_add(w->s, T_ST_pulls_inflight, -1);
    }
    return NULL;
}

static void test_threads(void **state)
{
    pd_stats_t *s;
    assert_int_equal(pd_stats_create(&t_table, NULL, &s), PD_OK);
    pthread_t th[4];
    worker_arg_t w = { s, 50000 };
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, worker, &w), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(pd_stats_counter(s, T_ST_pulls_started), 200000);
    assert_int_equal(pd_stats_counter(s, T_ST_bytes_pulled), 2000000);
    assert_int_equal(pd_stats_gauge(s, T_ST_pulls_inflight), 0);
    pd_hist_snapshot_t h;
    pd_stats_hist_read(s, T_ST_pull_latency, &h);
    assert_int_equal(h.count, 200000);
    assert_int_equal(h.sum_ns, 200000ULL * 1500);
    assert_int_equal(h.buckets[1], 200000); /* 1us < 1.5us <= 2us */
    pd_stats_gauge_set(s, T_ST_pulls_inflight, -3);
    assert_int_equal(pd_stats_gauge(s, T_ST_pulls_inflight), -3);
    pd_stats_reset(s);
    assert_int_equal(pd_stats_counter(s, T_ST_pulls_started), 0);
    assert_int_equal(pd_stats_gauge(s, T_ST_pulls_inflight), -3); /* levels kept */
    pd_stats_hist_read(s, T_ST_pull_latency, &h);
    assert_int_equal(h.count, 0);
    pd_stats_destroy(s);
}

static void test_hist_buckets_quantiles(void **state)
{
    assert_int_equal(pd_hist_bucket_le_ns(0), 1000);
    assert_int_equal(pd_hist_bucket_le_ns(10), 1024000);
    assert_true(pd_hist_bucket_le_ns(PD_HIST_BUCKETS - 2) > 100 * PD_NS_PER_S);
    assert_int_equal(pd_hist_bucket_le_ns(PD_HIST_BUCKETS - 1), UINT64_MAX);

    pd_stats_t *s;
    assert_int_equal(pd_stats_create(&t_table, NULL, &s), PD_OK);
    pd_stats_observe_ns(s, T_ST_pull_latency, 0);
    pd_stats_observe_ns(s, T_ST_pull_latency, 1000);       /* le 1us */
    pd_stats_observe_ns(s, T_ST_pull_latency, 1001);       /* le 2us */
    pd_stats_observe_ns(s, T_ST_pull_latency, 1024000);    /* le 1.024ms, bucket 10 */
    pd_stats_observe_ns(s, T_ST_pull_latency, 1024001);    /* bucket 11 */
    pd_stats_observe_ns(s, T_ST_pull_latency, 1000 * PD_NS_PER_S); /* +Inf */
    pd_hist_snapshot_t h;
    pd_stats_hist_read(s, T_ST_pull_latency, &h);
    assert_int_equal(h.buckets[0], 2);
    assert_int_equal(h.buckets[1], 1);
    assert_int_equal(h.buckets[10], 1);
    assert_int_equal(h.buckets[11], 1);
    assert_int_equal(h.buckets[PD_HIST_BUCKETS - 1], 1);
    pd_stats_reset(s);

    /* 90 fast (~10us), 10 slow (~10ms): p50 near 10us, p99 near 10ms */
    for (int i = 0; i < 90; i++)
        pd_stats_observe_ns(s, T_ST_pull_latency, 10 * PD_NS_PER_US);
    for (int i = 0; i < 10; i++)
        pd_stats_observe_ns(s, T_ST_pull_latency, 10 * PD_NS_PER_MS);
    pd_stats_hist_read(s, T_ST_pull_latency, &h);
    uint64_t p50 = pd_hist_quantile(&h, 0.5), p99 = pd_hist_quantile(&h, 0.99);
    assert_true(p50 >= 8 * PD_NS_PER_US && p50 <= 16 * PD_NS_PER_US);
    assert_true(p99 >= 8 * PD_NS_PER_MS && p99 <= 16384 * PD_NS_PER_US);
    pd_hist_snapshot_t empty = { 0 };
    assert_int_equal(pd_hist_quantile(&empty, 0.99), 0);
    pd_stats_destroy(s);
}

static void test_json(void **state)
{
    pd_stats_t *s;
    assert_int_equal(pd_stats_create(&t_table, NULL, &s), PD_OK);
    pd_stats_add(s, T_ST_pulls_started, 7);
    pd_stats_gauge_set(s, T_ST_pulls_inflight, -2);
    for (int i = 0; i < 100; i++)
        pd_stats_observe_ns(s, T_ST_pull_latency, 3 * PD_NS_PER_MS);
    cJSON *j = pd_stats_to_json(s);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    cJSON *p = cJSON_Parse(text);
    cJSON_free(text);
    assert_non_null(p);
    assert_int_equal(cJSON_GetObjectItem(p, "pulls_started")->valuedouble, 7);
    assert_int_equal(cJSON_GetObjectItem(p, "bytes_pulled")->valuedouble, 0);
    assert_int_equal(cJSON_GetObjectItem(p, "pulls_inflight")->valuedouble, -2);
    cJSON *h = cJSON_GetObjectItem(p, "pull_latency");
    assert_true(cJSON_IsObject(h));
    assert_int_equal(cJSON_GetObjectItem(h, "count")->valuedouble, 100);
    assert_int_equal(cJSON_GetObjectItem(h, "sum_ns")->valuedouble, 300 * PD_NS_PER_MS);
    double p50 = cJSON_GetObjectItem(h, "p50_ns")->valuedouble;
    double p99 = cJSON_GetObjectItem(h, "p99_ns")->valuedouble;
    assert_true(p50 >= 2048000 && p50 <= 4096000);   /* inside the 2..4ms bucket */
    assert_true(p99 >= p50 && p99 <= 4096000);
    cJSON_Delete(p);
    pd_stats_destroy(s);
}

static char *render(pd_stats_t **sets, size_t n)
{
    char *text;
    size_t len;
    assert_int_equal(pd_stats_render_prometheus(sets, n, &text, &len), PD_OK);
    assert_int_equal(strlen(text), len);
    return text;
}

static int count_substr(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* Pipe text into `promtool check metrics`; returns its exit status, or -1
 * when promtool is not installed. */
static int promtool_check(const char *text, char *out, size_t out_len)
{
    const char *promtool = getenv("PROMTOOL");
    if (promtool == NULL)
        promtool = "/usr/bin/promtool";
    if (access(promtool, X_OK) != 0)
        return -1;
    char path[] = "/tmp/pd-test-prom-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s check metrics < %s 2>&1", promtool, path);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, out_len - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    unlink(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void test_prometheus(void **state)
{
    pd_stats_t *total, *peer1, *peer2, *other;
    assert_int_equal(pd_stats_create(&t_table, NULL, &total), PD_OK);
    assert_int_equal(pd_stats_create(&t_table, (const char *[]){ "peer", "decode-1", NULL },
                                     &peer1), PD_OK);
    assert_int_equal(pd_stats_create(&t_table, (const char *[]){ "peer", "de\"c\\o\nde-2",
                                     "zone", "a", NULL }, &peer2), PD_OK);
    assert_int_equal(pd_stats_create(&u_table, NULL, &other), PD_OK);
    pd_stats_add(total, T_ST_pulls_started, 3);
    pd_stats_add(peer1, T_ST_pulls_started, 2);
    pd_stats_add(peer2, T_ST_pulls_started, 1);
    pd_stats_gauge_set(peer1, T_ST_pulls_inflight, 5);
    pd_stats_observe_ns(peer1, T_ST_pull_latency, 1500 * PD_NS_PER_US);
    pd_stats_observe_ns(peer1, T_ST_pull_latency, 3 * PD_NS_PER_S);
    pd_stats_add(other, U_ST_requests, 9);

    pd_stats_t *sets[] = { total, peer1, other, peer2 };
    char *text = render(sets, 4);

    /* HELP/TYPE once per family, samples per set */
    assert_int_equal(count_substr(text, "# TYPE pd_kvx_pulls_started_total counter\n"), 1);
    assert_int_equal(count_substr(text, "# HELP pd_kvx_pulls_started_total Pulls started\n"), 1);
    assert_int_equal(count_substr(text, "# TYPE pd_kvx_pull_latency_seconds histogram\n"), 1);
    assert_int_equal(count_substr(text, "# TYPE pd_kvx_pulls_inflight gauge\n"), 1);
    assert_int_equal(count_substr(text, "# TYPE pd_pf_requests_total counter\n"), 1);
    assert_non_null(strstr(text, "\npd_kvx_pulls_started_total 3\n"));
    assert_non_null(strstr(text, "\npd_kvx_pulls_started_total{peer=\"decode-1\"} 2\n"));
    assert_non_null(strstr(text, "\npd_kvx_pulls_started_total{peer=\"de\\\"c\\\\o\\nde-2\",zone=\"a\"} 1\n"));
    assert_non_null(strstr(text, "\npd_kvx_pulls_inflight{peer=\"decode-1\"} 5\n"));
    assert_non_null(strstr(text, "# HELP pd_kvx_pull_latency_seconds Pull latency, \\\\ start to end\\nsecond line\n"));
    /* 1.5ms falls in le=0.002048; cumulative; 3s in le=4.194304 */
    assert_non_null(strstr(text, "pd_kvx_pull_latency_seconds_bucket{peer=\"decode-1\",le=\"0.001024\"} 0\n"));
    assert_non_null(strstr(text, "pd_kvx_pull_latency_seconds_bucket{peer=\"decode-1\",le=\"0.002048\"} 1\n"));
    assert_non_null(strstr(text, "pd_kvx_pull_latency_seconds_bucket{peer=\"decode-1\",le=\"4.194304\"} 2\n"));
    assert_non_null(strstr(text, "pd_kvx_pull_latency_seconds_bucket{peer=\"decode-1\",le=\"+Inf\"} 2\n"));
    assert_non_null(strstr(text, "pd_kvx_pull_latency_seconds_sum{peer=\"decode-1\"} 3.001500000\n"));
    assert_non_null(strstr(text, "pd_kvx_pull_latency_seconds_count{peer=\"decode-1\"} 2\n"));
    assert_non_null(strstr(text, "\npd_pf_requests_total 9\n"));
    /* families are not interleaved: the pf family comes after all kvx ones */
    assert_true(strstr(text, "pd_pf_requests_total") > strstr(text, "pd_kvx_pull_latency_seconds_count{peer=\"de"));

    char out[8192];
    int rc = promtool_check(text, out, sizeof(out));
    if (rc < 0) {
        print_message("SKIP promtool check: /usr/bin/promtool not installed\n");
    } else {
        if (rc != 0)
            fail_msg("promtool check metrics failed (%d):\n%s\n--- input ---\n%s", rc, out, text);
        /* and promtool must catch a broken exposition (the check is real) */
        char *broken;
        assert_true(asprintf(&broken, "%s%s", text,
                             "# TYPE pd_kvx_pulls_started_total counter\n") > 0);
        assert_int_not_equal(promtool_check(broken, out, sizeof(out)), 0);
        free(broken);
    }
    free(text);

    /* empty input renders to "" */
    text = render(NULL, 0);
    assert_string_equal(text, "");
    free(text);

    pd_stats_destroy(total);
    pd_stats_destroy(peer1);
    pd_stats_destroy(peer2);
    pd_stats_destroy(other);
}

/* Families with labels, bucket sets, scaled and hidden rows, and the
 * whole-process scrape; promtool must accept all of it. */
#define V_STATS(X)                                                            \
    X(rej_a, COUNTER, "a")                                                    \
    X(fast, HISTOGRAM, "fast thing")                                          \
    X(rej_b, COUNTER, "b")                                                    \
    X(slow, HISTOGRAM, "slow thing")                                          \
    X(use_ppm, GAUGE, "use")                                                  \
    X(secret, COUNTER, "never shown")                                         \
    X(lat_a, HISTOGRAM, "lat a")                                              \
    X(lat_b, HISTOGRAM, "lat b")
#define V_STAT_ID(name, kind, help) V_ST_##name,
enum { V_STATS(V_STAT_ID) V_ST__COUNT };
static const pd_stat_desc_t v_descs[] = { V_STATS(PD_STAT_DESC) };
static const pd_stat_prom_t v_prom[] = {
    PD_STAT_PROM_LABEL("rej_a", "rejected", "reason", "a", "refused, by reason"),
    PD_STAT_PROM_LABEL("rej_b", "rejected", "reason", "b", NULL),
    PD_STAT_PROM_LE("fast", US), PD_STAT_PROM_LE("slow", S),
    { .name = "use_ppm", .family = "use_ratio", .scale = 1e-6 },
    { .name = "secret", .hidden = 1 },
    { .name = "lat_a", .family = "lat", .key = "phase", .value = "a", .le = PD_HIST_LE_MS },
    { .name = "lat_b", .family = "lat", .key = "phase", .value = "b", .le = PD_HIST_LE_MS },
};
static const pd_stats_table_t v_table = PD_STATS_TABLE_PROM("v", v_descs, v_prom);

static void test_prometheus_shape(void **state)
{
    pd_stats_t *s, *t;
    assert_int_equal(pd_stats_create(&v_table, (const char *[]){ "daemon", "d0", NULL }, &s), PD_OK);
    assert_int_equal(pd_stats_create(&v_table, (const char *[]){ "daemon", "d1", NULL }, &t), PD_OK);
    pd_stats_add(s, V_ST_rej_a, 2);
    pd_stats_add(s, V_ST_rej_b, 3);
    pd_stats_add(s, V_ST_secret, 7);
    pd_stats_gauge_set(s, V_ST_use_ppm, 250000);
    pd_stats_observe_ns(s, V_ST_fast, 3 * PD_NS_PER_US);
    pd_stats_observe_ns(s, V_ST_slow, 2 * PD_NS_PER_S);
    pd_stats_observe_ns(s, V_ST_lat_b, 5 * PD_NS_PER_MS);
    pd_stats_t *sets[] = { s, t };
    char *text;
    size_t len;
    assert_int_equal(pd_stats_render_scrape(sets, 2, &text, &len), PD_OK);
    assert_int_equal(strlen(text), len);
    /* one family, HELP/TYPE once, the reason as a label */
    assert_int_equal(count_substr(text, "# TYPE pd_v_rejected_total counter\n"), 1);
    assert_int_equal(count_substr(text, "# HELP pd_v_rejected_total refused, by reason\n"), 1);
    assert_non_null(strstr(text, "\npd_v_rejected_total{daemon=\"d0\",reason=\"a\"} 2\n"));
    assert_non_null(strstr(text, "\npd_v_rejected_total{daemon=\"d0\",reason=\"b\"} 3\n"));
    assert_non_null(strstr(text, "\npd_v_rejected_total{daemon=\"d1\",reason=\"b\"} 0\n"));
    assert_null(strstr(text, "pd_v_rej_a"));
    assert_null(strstr(text, "secret"));
    /* bucket sets: us from 1 us x4 to 1.05 s; s from 1.024 ms to 134 s */
    assert_non_null(strstr(text, "pd_v_fast_seconds_bucket{daemon=\"d0\",le=\"1e-06\"} 0\n"
                                 "pd_v_fast_seconds_bucket{daemon=\"d0\",le=\"4e-06\"} 1\n"));
    assert_non_null(strstr(text, "pd_v_fast_seconds_bucket{daemon=\"d0\",le=\"1.048576\"} 1\n"
                                 "pd_v_fast_seconds_bucket{daemon=\"d0\",le=\"+Inf\"} 1\n"));
    assert_non_null(strstr(text, "# TYPE pd_v_slow_seconds histogram\n"
                                 "pd_v_slow_seconds_bucket{daemon=\"d0\",le=\"0.001024\"} 0\n"));
    assert_non_null(strstr(text, "pd_v_slow_seconds_bucket{daemon=\"d0\",le=\"2.097152\"} 1\n"));
    assert_int_equal(count_substr(text, "pd_v_slow_seconds_bucket{daemon=\"d0\""), 18 + 1);
    assert_int_equal(count_substr(text, "pd_v_fast_seconds_bucket{daemon=\"d0\""), 11 + 1);
    /* a labeled histogram family */
    assert_int_equal(count_substr(text, "# TYPE pd_v_lat_seconds histogram\n"), 1);
    assert_non_null(strstr(text, "pd_v_lat_seconds_bucket{daemon=\"d0\",phase=\"b\",le=\"0.008192\"} 1\n"));
    assert_non_null(strstr(text, "pd_v_lat_seconds_count{daemon=\"d0\",phase=\"b\"} 1\n"));
    /* scaled gauge */
    assert_non_null(strstr(text, "\npd_v_use_ratio{daemon=\"d0\"} 0.25\n"));
    /* build info and process metrics, once */
    assert_int_equal(count_substr(text, "# TYPE pd_build_info gauge\n"), 1);
    assert_non_null(strstr(text, "version=\"" PD_VERSION "\""));
    assert_int_equal(count_substr(text, "# TYPE process_cpu_seconds_total counter\n"), 1);
    assert_non_null(strstr(text, "\nprocess_resident_memory_bytes "));
    assert_non_null(strstr(text, "\nprocess_open_fds "));
    assert_non_null(strstr(text, "\nprocess_start_time_seconds "));
    char out[512];
    int rc = promtool_check(text, out, sizeof(out));
    if (rc != -1 && rc != 0)
        fail_msg("promtool check metrics: %s", out);
    /* JSON keeps the rows' own names */
    cJSON *j = pd_stats_to_json(s);
    assert_non_null(cJSON_GetObjectItem(j, "rej_a"));
    assert_non_null(cJSON_GetObjectItem(j, "secret"));
    cJSON_Delete(j);
    free(text);
    pd_stats_destroy(s);
    pd_stats_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_macros),
        cmocka_unit_test(test_labels_validation),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_hist_buckets_quantiles),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_prometheus),
        cmocka_unit_test(test_prometheus_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
