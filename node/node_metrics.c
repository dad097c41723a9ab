/* node_metrics.c - a node's HTTP /metrics + /health (metrics.listen): the
 * role's counters (pd_prefill_* / pd_decode_*), kvxfer's set (pd_kvx_*:
 * leases exported / released / expired, bytes pulled, pulls by reason,
 * ...) and the KV pool gauges (pd_kv_pool_*), rendered on the loop thread
 * per scrape. */
#include "node.h"

#include <stdio.h>

#include "pd_log.h"
#include "pd_metrics_http.h"

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
    pd_stats_t *sets[2 + NODE_METRICS_MAX_KVX_SETS];
    size_t k = 0;
    sets[k++] = n->stats;
    sets[k++] = n->pool;
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
