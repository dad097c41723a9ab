/* node_metrics.c - a node's HTTP /metrics + /health (metrics.listen): the
 * role's counters (pd_prefill_* / pd_decode_*), kvxfer's set (pd_kvx_*:
 * leases exported / released / expired, bytes pulled, pulls by reason,
 * ...) and the KV pool gauges (pd_kv_pool_*), rendered on the loop thread
 * per scrape. */
#include "node.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "pd_log.h"
#include "pd_metrics_http.h"
#include "pd_time.h"

/* KV block pool gauges of a node's arena (pd_kv_pool_<name>), set just
 * before rendering. */
#define NODE_POOL_STATS(X)                                                    \
    X(blocks,       GAUGE, "KV blocks in the arena")                          \
    X(blocks_free,  GAUGE, "KV blocks free (unallocated, or cached and unused)") \
    X(blocks_used,  GAUGE, "KV blocks allocated (computing, leased or decoding)") \
    X(block_bytes,  GAUGE, "bytes per KV block")                              \
    X(usage_ppm,    GAUGE, "KV blocks used per million (Prometheus: pd_kv_pool_usage_ratio, 0..1)")

#define NODE_POOL_STAT_ID(name, kind, help) NODE_POOL_##name,
typedef enum { NODE_POOL_STATS(NODE_POOL_STAT_ID) NODE_POOL__COUNT } node_pool_stat_id_t;
#undef NODE_POOL_STAT_ID

static const pd_stat_desc_t node_pool_descs[] = { NODE_POOL_STATS(PD_STAT_DESC) };
static const pd_stat_prom_t node_pool_prom[] = {
    { .name = "usage_ppm", .family = "usage_ratio", .scale = 1e-6,
      .family_help = "KV blocks used / blocks in the arena (0..1)" },
};
static const pd_stats_table_t node_pool_table =
    PD_STATS_TABLE_PROM("kv_pool", node_pool_descs, node_pool_prom);

/* CPU use against the daemon's share (cpu-share; pd_cpuacct.h says how
 * borrowed and lent are counted), ms of one core; pd_cpu_<name>. */
#define NODE_CPU_STATS(X)                                                     \
    X(used_ms,      COUNTER, "CPU time this daemon used, ms of one core")    \
    X(borrowed_ms,  COUNTER, "CPU time used above its share (cores other processes left idle), ms") \
    X(lent_ms,      COUNTER, "of its share, CPU time it left idle while other processes ran above theirs, ms") \
    X(idle_ms,      COUNTER, "of its share, CPU time it left idle, ms")      \
    X(share_mcores, GAUGE,   "its share of the host's cores, milli-cores (cpu-share)") \
    X(threads,      GAUGE,   "engine threads it has")                        \
    X(threads_want_after, GAUGE, "engine threads the daemons after it on the host want now (core arbiter; decode: read at its last step)") \
    X(host_mcores,  GAUGE,   "the host's cores, milli-cores")

#define NODE_CPU_STAT_ID(name, kind, help) NODE_CPU_##name,
typedef enum { NODE_CPU_STATS(NODE_CPU_STAT_ID) NODE_CPU__COUNT } node_cpu_stat_id_t;
#undef NODE_CPU_STAT_ID

static const pd_stat_desc_t node_cpu_descs[] = { NODE_CPU_STATS(PD_STAT_DESC) };
static const pd_stat_prom_t node_cpu_prom[] = {
    { .name = "used_ms", .family = "used_seconds", .scale = 1e-3,
      .family_help = "CPU time this daemon used, seconds of one core" },
    { .name = "borrowed_ms", .family = "borrowed_seconds", .scale = 1e-3,
      .family_help = "CPU time used above its share (cpu-share), seconds of one core" },
    { .name = "lent_ms", .family = "lent_seconds", .scale = 1e-3,
      .family_help = "of its share, CPU time left idle while other processes on the host "
                     "ran above theirs, seconds of one core" },
    { .name = "idle_ms", .family = "idle_share_seconds", .scale = 1e-3,
      .family_help = "of its share, CPU time left idle, seconds of one core" },
    { .name = "share_mcores", .family = "share_cores", .scale = 1e-3,
      .family_help = "its share of the host's cores (cpu-share)" },
    { .name = "host_mcores", .family = "host_cores", .scale = 1e-3,
      .family_help = "the host's online cores" },
    { .name = "threads", .family = "engine_threads" },
};
static const pd_stats_table_t node_cpu_table =
    PD_STATS_TABLE_PROM("cpu", node_cpu_descs, node_cpu_prom);

#define NODE_CPU_PERIOD_MS 500

static void node_cpu_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    node_t *n = arg;
    if (pd_cpuacct_sample(&n->cpu, pd_now_ns()) != PD_OK)
        return;
    const uint64_t tot[4] = { n->cpu.used_ns, n->cpu.borrowed_ns, n->cpu.lent_ns, n->cpu.idle_ns };
    static const unsigned ids[4] = { NODE_CPU_used_ms, NODE_CPU_borrowed_ms, NODE_CPU_lent_ms,
                                     NODE_CPU_idle_ms };
    for (int i = 0; i < 4; i++) {
        uint64_t ms = tot[i] / PD_NS_PER_MS;
        if (ms > n->cpu_pub_ms[i])
            pd_stats_add(n->cpu_stats, ids[i], ms - n->cpu_pub_ms[i]);
        n->cpu_pub_ms[i] = ms;
    }
}

/* The runner went busy / idle: tell the host's arbiter how many threads
 * this daemon wants now. */
static void node_cpu_busy(void *arg, bool busy)
{
    node_t *n = arg;
    pd_cpuarb_set_want(n->arb, busy ? n->threads : 0);
    pd_cpuarb_set_used(n->arb, busy ? n->threads : 0); /* a decode sets it per step */
}

pd_status_t node_cpu_start(node_t *n)
{
    n->threads = n->cfg->threads ? (uint32_t)n->cfg->threads : pd_cpu_budget(NULL, NULL);
    uint32_t share = (uint32_t)n->cfg->cpu_share;
    if (share == 0)
        share = 1000u * n->threads;
    long host = sysconf(_SC_NPROCESSORS_ONLN);
    pd_cpuacct_init(&n->cpu, share, 1000u * (uint32_t)(host > 0 ? host : 1));
    pd_status_t st = pd_stats_create(&node_cpu_table,
                                     (const char *[]){ "daemon", n->daemon_id, NULL },
                                     &n->cpu_stats);
    if (st != PD_OK)
        return st;
    pd_stats_gauge_set(n->cpu_stats, NODE_CPU_share_mcores, share);
    pd_stats_gauge_set(n->cpu_stats, NODE_CPU_host_mcores, n->cpu.host_milli);
    pd_stats_gauge_set(n->cpu_stats, NODE_CPU_threads, n->threads);
    const char *ap = n->cfg->cpu_arbiter;
    if (ap != NULL && ap[0] != '\0' && strcmp(ap, "off") != 0) {
        char name[PD_CPUARB_NAME_MAX], why[256] = "";
        snprintf(name, sizeof(name), "pd-%s %.*s", n->role->name, 32, n->daemon_id);
        if (pd_cpuarb_join(ap, name, n->role->cpu_prio, &n->arb, why, sizeof(why)) != PD_OK) {
            /* not fatal: the daemon runs without yielding or being yielded to */
            pd_log(PD_LOG_WARN, n->role->name, NULL, "cpu-arbiter off: %s", why);
            n->arb = NULL;
        } else {
            eng_runner_on_busy(n->runner, node_cpu_busy, n);
        }
    }
    n->cpu_ev = event_new(pd_loop_base(n->loop), -1, EV_PERSIST, node_cpu_tick, n);
    if (n->cpu_ev == NULL) {
        pd_stats_destroy(n->cpu_stats);
        n->cpu_stats = NULL;
        return PD_ERR_NO_MEMORY;
    }
    (void)pd_cpuacct_sample(&n->cpu, pd_now_ns());
    struct timeval tv = { 0, NODE_CPU_PERIOD_MS * 1000 };
    event_add(n->cpu_ev, &tv);
    return PD_OK;
}

uint32_t node_cpu_want_after(node_t *n)
{
    uint32_t w = n->arb != NULL ? pd_cpuarb_want_after(n->arb) : 0;
    if (n->cpu_stats != NULL)
        pd_stats_gauge_set(n->cpu_stats, NODE_CPU_threads_want_after, w);
    return w;
}

void node_cpu_stop(node_t *n)
{
    pd_cpuarb_leave(n->arb);
    n->arb = NULL;
    if (n->cpu_ev != NULL)
        event_free(n->cpu_ev);
    n->cpu_ev = NULL;
    pd_stats_destroy(n->cpu_stats);
    n->cpu_stats = NULL;
}

/* kvx's sets: its totals plus one per importer peer (kvx's max_peers). */
#define NODE_METRICS_MAX_KVX_SETS (1u + 64u)

static pd_status_t node_metrics_render(void *arg, char **text_p, size_t *len_p)
{
    node_t *n = arg;
    uint64_t total = (uint64_t)n->cfg->kv_blocks;
    uint64_t free_n = node_kv_available(n); /* free + unused cached */
    uint64_t used = free_n <= total ? total - free_n : 0;
    pd_stats_gauge_set(n->pool, NODE_POOL_blocks, (int64_t)total);
    pd_stats_gauge_set(n->pool, NODE_POOL_blocks_free, (int64_t)free_n);
    pd_stats_gauge_set(n->pool, NODE_POOL_blocks_used, (int64_t)used);
    pd_stats_gauge_set(n->pool, NODE_POOL_block_bytes, (int64_t)n->geom->block_bytes);
    pd_stats_gauge_set(n->pool, NODE_POOL_usage_ppm,
                       total ? (int64_t)(used * 1000000 / total) : 0);
    pd_stats_t *sets[3 + NODE_METRICS_MAX_KVX_SETS];
    size_t k = 0;
    sets[k++] = n->stats;
    sets[k++] = n->pool;
    if (n->cpu_stats != NULL)
        sets[k++] = n->cpu_stats;
    /* kvx totals + one set per prefill peer (publishes the latest values) */
    k += kvx_stats_sets(n->kvx, sets + k, sizeof(sets) / sizeof(sets[0]) - k);
    return pd_stats_render_scrape(sets, k, text_p, len_p); /* + build info, process_* */
}

/* GET /ready: registered with at least one router and not draining (a
 * Kubernetes readiness probe; /health stays "the process serves"). */
static bool node_metrics_ready(void *arg, char *why, size_t cap)
{
    node_t *n = arg;
    if (n->draining) {
        snprintf(why, cap, "draining");
        return false;
    }
    uint32_t up = node_links_up(n);
    if (up == 0) {
        snprintf(why, cap, "no router session up (%u known)", n->n_links);
        return false;
    }
    return true;
}

pd_status_t node_metrics_start(node_t *n)
{
    const char *listen = n->cfg->metrics_listen;
    if (listen == NULL || listen[0] == '\0')
        return PD_OK;
    pd_status_t st = pd_stats_create(&node_pool_table,
                                     (const char *[]){ "daemon", n->daemon_id, NULL }, &n->pool);
    if (st != PD_OK)
        return st;
    pd_metrics_http_opts_t o = { .listen = listen, .render = node_metrics_render,
                                 .ready = node_metrics_ready, .arg = n };
    st = pd_metrics_http_create(n->loop, &o, &n->mh);
    if (st != PD_OK) {
        pd_stats_destroy(n->pool);
        n->pool = NULL;
        return st;
    }
    if (!pd_metrics_http_addr_is_loopback(listen))
        pd_log(PD_LOG_WARN, n->role->name, NULL,
               "metrics.listen %s is not loopback: /metrics is unauthenticated, firewall it",
               listen);
    pd_log(PD_LOG_INFO, n->role->name, NULL, "listening metrics=%s (port %u)", listen,
           (unsigned)pd_metrics_http_port(n->mh));
    return PD_OK;
}

uint16_t node_metrics_port(const node_t *n)
{
    return n->mh ? pd_metrics_http_port(n->mh) : 0;
}

void node_metrics_stop(node_t *n)
{
    pd_metrics_http_destroy(n->mh);
    n->mh = NULL;
    pd_stats_destroy(n->pool);
    n->pool = NULL;
}
