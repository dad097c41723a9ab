/* pd_stats.h - counters, gauges and latency histograms declared once
 * (memcached THREAD_STATS_FIELDS, HAProxy stat_cols_info[]) and rendered as
 * JSON (admin socket) and Prometheus text (/metrics).
 *
 * Declare a list once, in the module's header:
 *
 *   #define KVX_STATS(X)                                                  \
 *       X(pulls_started, COUNTER,   "Pulls started")                      \
 *       X(pulls_inflight, GAUGE,    "Pulls in flight")                    \
 *       X(pull_latency,  HISTOGRAM, "Pull latency, start to completion")
 *
 *   #define KVX_STAT_ID(name, kind, help) KVX_ST_##name,
 *   typedef enum { KVX_STATS(KVX_STAT_ID) KVX_ST__COUNT } kvx_stat_id_t;
 *   extern const pd_stats_table_t kvx_stats_table;
 *
 * and in one .c file:
 *
 *   static const pd_stat_desc_t kvx_stat_descs[] = { KVX_STATS(PD_STAT_DESC) };
 *   const pd_stats_table_t kvx_stats_table =
 *       PD_STATS_TABLE("kvx", kvx_stat_descs);
 *
 * Then one pd_stats_t per label set (e.g. per peer, plus a total):
 *   pd_stats_create(&kvx_stats_table, (const char *[]){"peer","decode-1",NULL}, &s);
 *   pd_stats_inc(s, KVX_ST_pulls_started);
 *   pd_stats_observe_ns(s, KVX_ST_pull_latency, pd_now_ns() - t0);
 *
 * Updates are relaxed atomics: any thread may update any set; readers see
 * each value atomically but a snapshot is not a consistent cut.
 * Prometheus names are pd_<prefix>_<name>, counters get "_total",
 * histograms are in seconds (_bucket{le=...}, _sum, _count). */
#ifndef PD_STATS_H
#define PD_STATS_H

#include "pd_status.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct cJSON;

typedef enum {
    PD_STAT_COUNTER,    /* monotonically increasing uint64 */
    PD_STAT_GAUGE,      /* int64 that goes up and down */
    PD_STAT_HISTOGRAM,  /* latency in ns, exponential buckets */
} pd_stat_kind_t;

typedef struct {
    const char *name;   /* snake_case, [a-z0-9_] */
    pd_stat_kind_t kind;
    const char *help;
} pd_stat_desc_t;

/* Which buckets a histogram shows in Prometheus: a slice of the internal
 * ladder (1 us x 2^i, see below) that fits the figure, so a second-scale
 * latency does not start at 1 us and a microsecond one does not end at
 * minutes. Every boundary shown is an internal one: counts stay exact. */
typedef enum {
    PD_HIST_LE_ALL = 0, /* 1 us .. 134 s, x2: every internal bucket (28) */
    PD_HIST_LE_US,      /* 1 us .. 1.05 s, x4: sub-millisecond work (11) */
    PD_HIST_LE_MS,      /* 128 us .. 16.8 s, x2: a step, a prefill, a KV
                           transfer, inter-token time (18) */
    PD_HIST_LE_S,       /* 1.02 ms .. 134 s, x2: request-scale latencies:
                           TTFT, end to end, queue, lease life (18) */
} pd_hist_le_t;

/* How one row looks in Prometheus (optional; rows without one are their
 * own family pd_<prefix>_<name>). Rows naming the same `family` become ONE
 * family pd_<prefix>_<family> told apart by the label key="value" (e.g.
 * rejected_bad_mac, rejected_expired... -> pd_kvx_rejected_total{reason=
 * "bad_mac"}); they must be of one kind. JSON (admin socket) keeps the rows'
 * own names. */
typedef struct {
    const char *name;          /* the row, as in pd_stat_desc_t */
    const char *family;        /* NULL: the row's name */
    const char *key, *value;   /* with family: this row's label */
    const char *family_help;   /* HELP of the family (else the row's help) */
    pd_hist_le_t le;           /* histograms: the bucket set */
    double scale;              /* counters, gauges: value x scale (0: 1), e.g. ppm -> ratio, ms -> s */
    int hidden;                /* not exported (always zero in this process) */
} pd_stat_prom_t;

typedef struct {
    const char *prefix;             /* "kvx" -> pd_kvx_<name> */
    const pd_stat_desc_t *descs;
    size_t n;
    const pd_stat_prom_t *prom;     /* NULL, or n_prom rows (any order) */
    size_t n_prom;
} pd_stats_table_t;

#define PD_STAT_DESC(name, kind, help) { #name, PD_STAT_##kind, (help) },
#define PD_STATS_TABLE(prefix, descs)                                         \
    { (prefix), (descs), sizeof(descs) / sizeof((descs)[0]), NULL, 0 }
#define PD_STATS_TABLE_PROM(prefix, descs, prom)                              \
    { (prefix), (descs), sizeof(descs) / sizeof((descs)[0]),                  \
      (prom), sizeof(prom) / sizeof((prom)[0]) }
/* Prometheus rows: one labeled member of a family; a histogram's buckets. */
#define PD_STAT_PROM_LABEL(row, fam, k, v, help)                              \
    { .name = (row), .family = (fam), .key = (k), .value = (v), .family_help = (help) }
#define PD_STAT_PROM_LE(row, set) { .name = (row), .le = PD_HIST_LE_##set }

/* Histogram buckets: upper bounds 1us * 2^i, i = 0..PD_HIST_BUCKETS-2
 * (1us .. ~134s), last bucket is +Inf. */
#define PD_HIST_BUCKETS 29
#define PD_HIST_FIRST_NS 1000ULL

typedef struct {
    uint64_t count;
    uint64_t sum_ns;
    uint64_t buckets[PD_HIST_BUCKETS];   /* NOT cumulative */
} pd_hist_snapshot_t;

typedef struct pd_stats pd_stats_t;

/* Create a zeroed set for `table` (borrowed; must outlive the set).
 * labels: NULL or a NULL-terminated array of key, value, key, value...;
 * copied. Keys must match [a-zA-Z_][a-zA-Z0-9_]*.
 * PD_ERR_BAD_INPUT (bad label key or odd count), PD_ERR_NO_MEMORY. */
pd_status_t pd_stats_create(const pd_stats_table_t *table,
                            const char *const *labels, pd_stats_t **stats_p);
/* NULL-safe. */
void pd_stats_destroy(pd_stats_t *stats);

const pd_stats_table_t *pd_stats_table(const pd_stats_t *stats);
/* Label pairs as given (NULL-terminated), never NULL. */
const char *const *pd_stats_labels(const pd_stats_t *stats);

/* Updates (relaxed atomics, any thread). An id of the wrong kind is a bug
 * (asserted in debug builds, ignored otherwise). NULL stats is a no-op, so
 * optional per-peer sets need no checks at call sites. */
void pd_stats_add(pd_stats_t *stats, unsigned id, uint64_t n);
static inline void pd_stats_inc(pd_stats_t *stats, unsigned id)
{
    pd_stats_add(stats, id, 1);
}
void pd_stats_gauge_set(pd_stats_t *stats, unsigned id, int64_t value);
void pd_stats_gauge_add(pd_stats_t *stats, unsigned id, int64_t delta);
void pd_stats_observe_ns(pd_stats_t *stats, unsigned id, uint64_t ns);

/* Reads. Counter value / gauge value (0 for NULL stats). */
uint64_t pd_stats_counter(const pd_stats_t *stats, unsigned id);
int64_t pd_stats_gauge(const pd_stats_t *stats, unsigned id);
void pd_stats_hist_read(const pd_stats_t *stats, unsigned id,
                        pd_hist_snapshot_t *snap);
/* Estimated q-quantile (0 < q <= 1) in ns by linear interpolation inside
 * the bucket; 0 when empty. */
uint64_t pd_hist_quantile(const pd_hist_snapshot_t *snap, double q);
/* Upper bound of bucket i in ns (UINT64_MAX for the +Inf bucket). */
uint64_t pd_hist_bucket_le_ns(unsigned i);

/* Zero counters and histograms (gauges are levels, kept). */
void pd_stats_reset(pd_stats_t *stats);

/* JSON object {name: value}: counters/gauges as numbers; histograms as
 * {"count","sum_ns","p50_ns","p99_ns"}. NULL on ENOMEM. */
struct cJSON *pd_stats_to_json(const pd_stats_t *stats);

/* Prometheus text exposition (0.0.4) of n sets; sets sharing a table form
 * one family per stat with HELP/TYPE once. Sets of different tables are
 * allowed (grouped by table, in order of first appearance). Two sets of the
 * same table with identical labels are a caller bug (duplicate series).
 * *text_p is malloc'd, NUL-terminated; *len_p (may be NULL) its length.
 * PD_ERR_NO_MEMORY. */
pd_status_t pd_stats_render_prometheus(pd_stats_t *const *sets, size_t n,
                                       char **text_p, size_t *len_p);

/* What a whole-process scrape returns: the sets as above, then
 *   pd_build_info{program,version,jemalloc,sanitizers} 1
 *   process_cpu_seconds_total, process_resident_memory_bytes,
 *   process_virtual_memory_bytes, process_open_fds, process_max_fds,
 *   process_start_time_seconds (the standard names, from /proc/self).
 * Call it once per scrape (a family must not repeat). PD_ERR_NO_MEMORY. */
pd_status_t pd_stats_render_scrape(pd_stats_t *const *sets, size_t n,
                                   char **text_p, size_t *len_p);

#endif
