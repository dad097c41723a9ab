/* pd_stats.c - stats sets: relaxed atomics, JSON and Prometheus output. */
#include "pd_stats.h"
#include "pd_build_config.h"
#include "pd_sbuf.h"
#include "pd_time.h"

#include <cjson/cJSON.h>

#include <assert.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

typedef struct {
    _Atomic uint64_t sum_ns;
    _Atomic uint64_t buckets[PD_HIST_BUCKETS];
} pd_hist_t;

struct pd_stats {
    const pd_stats_table_t *table;
    char **labels;              /* key, value, ..., NULL */
    _Atomic uint64_t *values;   /* (table->n) counters; gauges as int64 bits */
    pd_hist_t *hists;           /* (number of histograms) */
    unsigned *hist_slot;        /* (table->n) index into hists */
};

static const char *const no_labels[] = { NULL };

static bool label_key_ok(const char *k)
{
    if (k == NULL || !(isalpha((unsigned char)k[0]) || k[0] == '_'))
        return false;
    for (const char *p = k; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_'))
            return false;
    return true;
}

pd_status_t pd_stats_create(const pd_stats_table_t *table,
                            const char *const *labels, pd_stats_t **stats_p)
{
    size_t n_labels = 0, n_hist = 0;
    if (table == NULL || table->n == 0)
        return PD_ERR_BAD_INPUT;
    if (labels != NULL) {
        while (labels[n_labels] != NULL)
            n_labels++;
        if (n_labels % 2 != 0)
            return PD_ERR_BAD_INPUT;
        for (size_t i = 0; i < n_labels; i += 2)
            if (!label_key_ok(labels[i]))
                return PD_ERR_BAD_INPUT;
    }
    for (size_t i = 0; i < table->n; i++)
        if (table->descs[i].kind == PD_STAT_HISTOGRAM)
            n_hist++;

    pd_stats_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        goto err;
    s->table = table;
    s->labels = calloc(n_labels + 1, sizeof(char *));
    if (s->labels == NULL)
        goto err_free;
    for (size_t i = 0; i < n_labels; i++) {
        s->labels[i] = strdup(labels[i]);
        if (s->labels[i] == NULL)
            goto err_free;
    }
    s->values = calloc(table->n, sizeof(*s->values));
    s->hist_slot = calloc(table->n, sizeof(*s->hist_slot));
    s->hists = calloc(n_hist ? n_hist : 1, sizeof(*s->hists));
    if (s->values == NULL || s->hist_slot == NULL || s->hists == NULL)
        goto err_free;
    for (size_t i = 0, h = 0; i < table->n; i++)
        if (table->descs[i].kind == PD_STAT_HISTOGRAM)
            s->hist_slot[i] = (unsigned)h++;
    *stats_p = s;
    return PD_OK;

err_free:
    pd_stats_destroy(s);
err:
    return PD_ERR_NO_MEMORY;
}

void pd_stats_destroy(pd_stats_t *stats)
{
    if (stats == NULL)
        return;
    if (stats->labels != NULL) {
        for (size_t i = 0; stats->labels[i] != NULL; i++)
            free(stats->labels[i]);
        free(stats->labels);
    }
    free(stats->values);
    free(stats->hists);
    free(stats->hist_slot);
    free(stats);
}

const pd_stats_table_t *pd_stats_table(const pd_stats_t *stats)
{
    return stats->table;
}

const char *const *pd_stats_labels(const pd_stats_t *stats)
{
    return stats->labels ? (const char *const *)stats->labels : no_labels;
}

static bool kind_ok(const pd_stats_t *stats, unsigned id, pd_stat_kind_t kind)
{
    if (stats == NULL || id >= stats->table->n)
        return false;
    assert(stats->table->descs[id].kind == kind);
    return stats->table->descs[id].kind == kind;
}

void pd_stats_add(pd_stats_t *stats, unsigned id, uint64_t n)
{
    if (!kind_ok(stats, id, PD_STAT_COUNTER))
        return;
    atomic_fetch_add_explicit(&stats->values[id], n, memory_order_relaxed);
}

void pd_stats_gauge_set(pd_stats_t *stats, unsigned id, int64_t value)
{
    if (!kind_ok(stats, id, PD_STAT_GAUGE))
        return;
    atomic_store_explicit(&stats->values[id], (uint64_t)value,
                          memory_order_relaxed);
}

void pd_stats_gauge_add(pd_stats_t *stats, unsigned id, int64_t delta)
{
    if (!kind_ok(stats, id, PD_STAT_GAUGE))
        return;
    /* two's complement wrap-around makes unsigned add == signed add */
    atomic_fetch_add_explicit(&stats->values[id], (uint64_t)delta,
                              memory_order_relaxed);
}

static unsigned bucket_of(uint64_t ns)
{
    if (ns <= PD_HIST_FIRST_NS)
        return 0;
    uint64_t us = (ns + PD_HIST_FIRST_NS - 1) / PD_HIST_FIRST_NS; /* >= 2 */
    unsigned i = 64u - (unsigned)__builtin_clzll(us - 1); /* 2^i >= us */
    return i > PD_HIST_BUCKETS - 1 ? PD_HIST_BUCKETS - 1 : i;
}

uint64_t pd_hist_bucket_le_ns(unsigned i)
{
    if (i >= PD_HIST_BUCKETS - 1)
        return UINT64_MAX;
    return PD_HIST_FIRST_NS << i;
}

void pd_stats_observe_ns(pd_stats_t *stats, unsigned id, uint64_t ns)
{
    if (!kind_ok(stats, id, PD_STAT_HISTOGRAM))
        return;
    pd_hist_t *h = &stats->hists[stats->hist_slot[id]];
    atomic_fetch_add_explicit(&h->buckets[bucket_of(ns)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
    /* no count: it is the sum of the buckets (two atomics per observe) */
}

uint64_t pd_stats_counter(const pd_stats_t *stats, unsigned id)
{
    if (stats == NULL || id >= stats->table->n)
        return 0;
    return atomic_load_explicit(&stats->values[id], memory_order_relaxed);
}

int64_t pd_stats_gauge(const pd_stats_t *stats, unsigned id)
{
    return (int64_t)pd_stats_counter(stats, id);
}

void pd_stats_hist_read(const pd_stats_t *stats, unsigned id,
                        pd_hist_snapshot_t *snap)
{
    memset(snap, 0, sizeof(*snap));
    if (stats == NULL || id >= stats->table->n ||
        stats->table->descs[id].kind != PD_STAT_HISTOGRAM)
        return;
    pd_hist_t *h = &stats->hists[stats->hist_slot[id]];
    snap->sum_ns = atomic_load_explicit(&h->sum_ns, memory_order_relaxed);
    /* count is derived from the buckets so the exposition is consistent
     * (a concurrent observe may be half-applied) */
    for (unsigned i = 0; i < PD_HIST_BUCKETS; i++) {
        snap->buckets[i] = atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
        snap->count += snap->buckets[i];
    }
}

uint64_t pd_hist_quantile(const pd_hist_snapshot_t *snap, double q)
{
    if (snap->count == 0)
        return 0;
    if (q <= 0)
        q = 0;
    if (q > 1)
        q = 1;
    double rank = q * (double)snap->count;
    uint64_t cum = 0;
    for (unsigned i = 0; i < PD_HIST_BUCKETS; i++) {
        uint64_t c = snap->buckets[i];
        if (c == 0)
            continue;
        if ((double)(cum + c) >= rank) {
            double lo = i == 0 ? 0 : (double)pd_hist_bucket_le_ns(i - 1);
            double hi = i == PD_HIST_BUCKETS - 1 ? lo * 2
                                                 : (double)pd_hist_bucket_le_ns(i);
            double frac = (rank - (double)cum) / (double)c;
            if (frac < 0)
                frac = 0;
            return (uint64_t)(lo + (hi - lo) * frac);
        }
        cum += c;
    }
    return pd_hist_bucket_le_ns(PD_HIST_BUCKETS - 2);
}

void pd_stats_reset(pd_stats_t *stats)
{
    if (stats == NULL)
        return;
    for (size_t i = 0; i < stats->table->n; i++) {
        switch (stats->table->descs[i].kind) {
        case PD_STAT_COUNTER:
            atomic_store_explicit(&stats->values[i], 0, memory_order_relaxed);
            break;
        case PD_STAT_GAUGE:
            break;
        case PD_STAT_HISTOGRAM: {
            pd_hist_t *h = &stats->hists[stats->hist_slot[i]];
            for (unsigned b = 0; b < PD_HIST_BUCKETS; b++)
                atomic_store_explicit(&h->buckets[b], 0, memory_order_relaxed);
            atomic_store_explicit(&h->sum_ns, 0, memory_order_relaxed);
            break;
        }
        }
    }
}

struct cJSON *pd_stats_to_json(const pd_stats_t *stats)
{
    cJSON *obj = cJSON_CreateObject();
    if (obj == NULL)
        return NULL;
    for (unsigned i = 0; i < stats->table->n; i++) {
        const pd_stat_desc_t *d = &stats->table->descs[i];
        cJSON *v = NULL;
        switch (d->kind) {
        case PD_STAT_COUNTER:
            v = cJSON_CreateNumber((double)pd_stats_counter(stats, i));
            break;
        case PD_STAT_GAUGE:
            v = cJSON_CreateNumber((double)pd_stats_gauge(stats, i));
            break;
        case PD_STAT_HISTOGRAM: {
            pd_hist_snapshot_t snap;
            pd_stats_hist_read(stats, i, &snap);
            v = cJSON_CreateObject();
            if (v == NULL ||
                !cJSON_AddNumberToObject(v, "count", (double)snap.count) ||
                !cJSON_AddNumberToObject(v, "sum_ns", (double)snap.sum_ns) ||
                !cJSON_AddNumberToObject(v, "p50_ns",
                                         (double)pd_hist_quantile(&snap, 0.50)) ||
                !cJSON_AddNumberToObject(v, "p99_ns",
                                         (double)pd_hist_quantile(&snap, 0.99))) {
                cJSON_Delete(v);
                v = NULL;
            }
            break;
        }
        }
        if (v == NULL || !cJSON_AddItemToObject(obj, d->name, v)) {
            cJSON_Delete(v);
            cJSON_Delete(obj);
            return NULL;
        }
    }
    return obj;
}

/* ---- Prometheus text format 0.0.4 ------------------------------------- */

static void prom_escape(pd_sbuf_t *sb, const char *s, bool quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            pd_sbuf_append(sb, "\\\\", 2);
        else if (*s == '\n')
            pd_sbuf_append(sb, "\\n", 2);
        else if (quote && *s == '"')
            pd_sbuf_append(sb, "\\\"", 2);
        else
            pd_sbuf_append(sb, s, 1);
    }
}

/* {k="v",...,extra} or nothing when no labels and no extra. */
static void prom_labels(pd_sbuf_t *sb, const pd_stats_t *s, const char *extra_key,
                        const char *extra_val)
{
    const char *const *l = pd_stats_labels(s);
    if (l[0] == NULL && extra_key == NULL)
        return;
    pd_sbuf_append(sb, "{", 1);
    bool first = true;
    for (size_t i = 0; l[i] != NULL; i += 2) {
        pd_sbuf_printf(sb, "%s%s=\"", first ? "" : ",", l[i]);
        prom_escape(sb, l[i + 1], true);
        pd_sbuf_append(sb, "\"", 1);
        first = false;
    }
    if (extra_key != NULL)
        pd_sbuf_printf(sb, "%s%s=\"%s\"", first ? "" : ",", extra_key, extra_val);
    pd_sbuf_append(sb, "}", 1);
}

static const pd_stat_prom_t *prom_meta(const pd_stats_table_t *table, unsigned id)
{
    for (size_t i = 0; i < table->n_prom; i++)
        if (strcmp(table->prom[i].name, table->descs[id].name) == 0)
            return &table->prom[i];
    return NULL;
}

static bool prom_hidden(const pd_stats_table_t *table, unsigned id)
{
    const pd_stat_prom_t *m = prom_meta(table, id);
    return m != NULL && m->hidden;
}

/* The row's family name ("rejected" for a labeled row, else its name). */
static const char *prom_family_name(const pd_stats_table_t *table, unsigned id)
{
    const pd_stat_prom_t *m = prom_meta(table, id);
    return m != NULL && m->family != NULL ? m->family : table->descs[id].name;
}

/* Does histogram bucket b (internal index) show in bucket set `le`? */
static bool prom_le_shown(pd_hist_le_t le, unsigned b)
{
    /* internal b: le = 1 us * 2^b; b = PD_HIST_BUCKETS - 1 is +Inf */
    if (b == PD_HIST_BUCKETS - 1)
        return true;
    switch (le) {
    case PD_HIST_LE_US:
        return b <= 20 && b % 2 == 0;
    case PD_HIST_LE_MS:
        return b >= 7 && b <= 24;
    case PD_HIST_LE_S:
        return b >= 10;
    case PD_HIST_LE_ALL:
    default:
        return true;
    }
}

/* One sample line of row `id` of set s: name{set labels, row label} value. */
static void prom_sample(pd_sbuf_t *sb, const pd_stats_t *s, unsigned id, const char *name,
                        const pd_stat_prom_t *m)
{
    const pd_stat_desc_t *d = &s->table->descs[id];
    const char *key = m != NULL && m->family != NULL ? m->key : NULL;
    const char *val = key != NULL ? m->value : NULL;
    if (d->kind == PD_STAT_COUNTER) {
        pd_sbuf_printf(sb, "%s", name);
        prom_labels(sb, s, key, val);
        if (m != NULL && m->scale != 0)
            pd_sbuf_printf(sb, " %.9g\n", (double)pd_stats_counter(s, id) * m->scale);
        else
            pd_sbuf_printf(sb, " %llu\n", (unsigned long long)pd_stats_counter(s, id));
    } else if (d->kind == PD_STAT_GAUGE) {
        pd_sbuf_printf(sb, "%s", name);
        prom_labels(sb, s, key, val);
        if (m != NULL && m->scale != 0)
            pd_sbuf_printf(sb, " %.9g\n", (double)pd_stats_gauge(s, id) * m->scale);
        else
            pd_sbuf_printf(sb, " %lld\n", (long long)pd_stats_gauge(s, id));
    } else {
        pd_hist_snapshot_t snap;
        uint64_t cum = 0;
        pd_hist_le_t le = m != NULL ? m->le : PD_HIST_LE_ALL;
        pd_stats_hist_read(s, id, &snap);
        for (unsigned b = 0; b < PD_HIST_BUCKETS; b++) {
            char lev[32];
            cum += snap.buckets[b];
            if (!prom_le_shown(le, b))
                continue;
            if (b == PD_HIST_BUCKETS - 1)
                snprintf(lev, sizeof(lev), "+Inf");
            else
                snprintf(lev, sizeof(lev), "%.9g", (double)pd_hist_bucket_le_ns(b) / 1e9);
            pd_sbuf_printf(sb, "%s_bucket{", name);
            /* set labels, the row label, then le */
            const char *const *l = pd_stats_labels(s);
            for (size_t i = 0; l[i] != NULL; i += 2) {
                pd_sbuf_printf(sb, "%s=\"", l[i]);
                prom_escape(sb, l[i + 1], true);
                pd_sbuf_append(sb, "\",", 2);
            }
            if (key != NULL) {
                pd_sbuf_printf(sb, "%s=\"", key);
                prom_escape(sb, val, true);
                pd_sbuf_append(sb, "\",", 2);
            }
            pd_sbuf_printf(sb, "le=\"%s\"} %llu\n", lev, (unsigned long long)cum);
        }
        pd_sbuf_printf(sb, "%s_sum", name);
        prom_labels(sb, s, key, val);
        pd_sbuf_printf(sb, " %.9f\n", (double)snap.sum_ns / 1e9);
        pd_sbuf_printf(sb, "%s_count", name);
        prom_labels(sb, s, key, val);
        pd_sbuf_printf(sb, " %llu\n", (unsigned long long)snap.count);
    }
}

/* The family of row `id` (every row of the table sharing it, every set of
 * the table), HELP and TYPE once. */
static void prom_family(pd_sbuf_t *sb, pd_stats_t *const *sets, size_t n,
                        const pd_stats_table_t *table, unsigned id)
{
    const pd_stat_desc_t *d = &table->descs[id];
    const pd_stat_prom_t *m = prom_meta(table, id);
    static const char *const suffix[] = { "_total", "", "_seconds" };
    static const char *const type[] = { "counter", "gauge", "histogram" };
    const char *fam = prom_family_name(table, id);
    char name[256];
    snprintf(name, sizeof(name), "pd_%s_%s%s", table->prefix, fam, suffix[d->kind]);
    const char *help = m != NULL && m->family_help != NULL ? m->family_help
                     : d->help ? d->help : d->name;
    pd_sbuf_printf(sb, "# HELP %s ", name);
    prom_escape(sb, help, false);
    pd_sbuf_printf(sb, "\n# TYPE %s %s\n", name, type[d->kind]);
    for (size_t k = 0; k < n; k++) {
        const pd_stats_t *s = sets[k];
        if (s->table != table)
            continue;
        for (unsigned r = id; r < table->n; r++) {
            if (r != id && (prom_hidden(table, r) ||
                            strcmp(prom_family_name(table, r), fam) != 0))
                continue;
            assert(table->descs[r].kind == d->kind);
            if (table->descs[r].kind != d->kind)
                continue;
            prom_sample(sb, s, r, name, prom_meta(table, r));
        }
    }
}

pd_status_t pd_stats_render_prometheus(pd_stats_t *const *sets, size_t n,
                                       char **text_p, size_t *len_p)
{
    pd_sbuf_t sb = PD_SBUF_INIT;
    for (size_t k = 0; k < n; k++) {
        const pd_stats_table_t *table = sets[k]->table;
        bool seen = false;
        for (size_t j = 0; j < k; j++)
            if (sets[j]->table == table)
                seen = true;
        if (seen)
            continue;
        for (unsigned id = 0; id < table->n; id++) {
            if (prom_hidden(table, id))
                continue;
            /* a family is rendered at its first row */
            const char *fam = prom_family_name(table, id);
            bool done = false;
            for (unsigned j = 0; j < id && !done; j++)
                done = !prom_hidden(table, j) && strcmp(prom_family_name(table, j), fam) == 0;
            if (!done)
                prom_family(&sb, sets, n, table, id);
        }
    }
    char *text = pd_sbuf_finish(&sb, len_p);
    if (text == NULL)
        return PD_ERR_NO_MEMORY;
    *text_p = text;
    return PD_OK;
}

/* ---- whole-process scrape: build info and process_* -------------------- */

/* /proc/self/stat fields 14 (utime), 15 (stime), 22 (starttime), 23 (vsize),
 * 24 (rss pages), counted after the ")" that ends the command name. */
static bool proc_self_stat(double *cpu_s, double *start_ticks, double *vsize, double *rss_pages)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (f == NULL)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return false;
    unsigned long long v[32] = { 0 };
    int field = 2; /* p points at the end of field 2 */
    for (char *tok = strtok(p + 1, " "); tok != NULL && field < 26; tok = strtok(NULL, " ")) {
        field++;
        if (field < 32)
            v[field] = strtoull(tok, NULL, 10);
    }
    if (field < 24)
        return false;
    double hz = (double)sysconf(_SC_CLK_TCK);
    *cpu_s = (double)(v[14] + v[15]) / hz;
    *start_ticks = (double)v[22];
    *vsize = (double)v[23];
    *rss_pages = (double)v[24];
    return true;
}

static double boot_time_s(void)
{
    char line[256];
    double bt = 0;
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "btime %lf", &bt) == 1)
            break;
    fclose(f);
    return bt;
}

static unsigned open_fds(void)
{
    unsigned n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n > 0 ? n - 1 : 0; /* not the directory stream's own fd */
}

static void prom_gauge1(pd_sbuf_t *sb, const char *name, const char *type, const char *help,
                        double v)
{
    pd_sbuf_printf(sb, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static void render_process(pd_sbuf_t *sb)
{
    pd_sbuf_printf(sb, "# HELP pd_build_info pdserve build: program, version, allocator, sanitizers\n"
                   "# TYPE pd_build_info gauge\n"
                   "pd_build_info{program=\"");
    prom_escape(sb, program_invocation_short_name, true);
    pd_sbuf_printf(sb, "\",version=\"%s\",jemalloc=\"%s\",sanitizers=\"%s\"} 1\n", PD_VERSION,
                   PD_HAVE_JEMALLOC ? "yes" : "no", PD_SANITIZE ? "yes" : "no");
    double cpu, start, vsize, rss;
    if (proc_self_stat(&cpu, &start, &vsize, &rss)) {
        prom_gauge1(sb, "process_cpu_seconds_total", "counter",
                    "Total user and system CPU time spent in seconds.", cpu);
        prom_gauge1(sb, "process_resident_memory_bytes", "gauge",
                    "Resident memory size in bytes.", rss * (double)sysconf(_SC_PAGESIZE));
        prom_gauge1(sb, "process_virtual_memory_bytes", "gauge",
                    "Virtual memory size in bytes.", vsize);
        double bt = boot_time_s();
        if (bt > 0)
            prom_gauge1(sb, "process_start_time_seconds", "gauge",
                        "Start time of the process since unix epoch in seconds.",
                        bt + start / (double)sysconf(_SC_CLK_TCK));
    }
    prom_gauge1(sb, "process_open_fds", "gauge", "Number of open file descriptors.",
                (double)open_fds());
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        prom_gauge1(sb, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
                    (double)rl.rlim_cur);
}

pd_status_t pd_stats_render_scrape(pd_stats_t *const *sets, size_t n,
                                   char **text_p, size_t *len_p)
{
    char *text;
    size_t len;
    pd_status_t st = pd_stats_render_prometheus(sets, n, &text, &len);
    if (st != PD_OK)
        return st;
    pd_sbuf_t sb = PD_SBUF_INIT;
    pd_sbuf_append(&sb, text, len);
    free(text);
    render_process(&sb);
    text = pd_sbuf_finish(&sb, len_p);
    if (text == NULL)
        return PD_ERR_NO_MEMORY;
    *text_p = text;
    return PD_OK;
}
