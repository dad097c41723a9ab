/* dec_metrics.c - pd-decode's HTTP /metrics + /health (metrics.listen):
 * the daemon's counters (pd_decode_*), kvxfer's set (pd_kvx_*: bytes pulled,
 * pulls ok / failed by reason, pull latency, ...) and the KV pool gauges
 * (pd_kv_pool_*), rendered on the loop thread per scrape. One daemon per
 * process: the server and the pool set are file statics. */
#include "dec.h"

#include "pd_log.h"
#include "pd_metrics_http.h"

#include <string.h>

static pd_metrics_http_t *dec_mh;
static pd_stats_t *dec_pool;

static pd_status_t dec_metrics_render(void *arg, char **text_p, size_t *len_p)
{
    dec_t *d = arg;
    uint32_t total = (uint32_t)d->cfg.kv_blocks;
    uint32_t free_n = kvx_blocks_free_count(d->blocks);
    pd_kv_pool_set(dec_pool, total, free_n, d->geom->block_bytes);
    pd_stats_t *sets[2 + 1 + DEC_MAX_PEERS];
    size_t n = 0;
    sets[n++] = d->stats;
    sets[n++] = dec_pool;
    /* kvx totals + one set per prefill peer (publishes the latest values) */
    n += kvx_stats_sets(d->kvx, sets + n, sizeof(sets) / sizeof(sets[0]) - n);
    return pd_stats_render_scrape(sets, n, text_p, len_p); /* + build info, process_* */
}

pd_status_t dec_metrics_start(dec_t *d)
{
    if (d->cfg.metrics_listen == NULL || d->cfg.metrics_listen[0] == '\0')
        return PD_OK;
    pd_status_t st = pd_stats_create(&pd_kv_pool_stats_table,
                                     (const char *[]){ "daemon", d->daemon_id, NULL }, &dec_pool);
    if (st != PD_OK)
        return st;
    pd_metrics_http_opts_t o = { .listen = d->cfg.metrics_listen,
                                 .render = dec_metrics_render, .arg = d };
    st = pd_metrics_http_create(d->loop, &o, &dec_mh);
    if (st != PD_OK) {
        pd_stats_destroy(dec_pool);
        dec_pool = NULL;
        return st;
    }
    if (!pd_metrics_http_addr_is_loopback(d->cfg.metrics_listen))
        pd_log(PD_LOG_WARN, "decode", NULL,
               "metrics.listen %s is not loopback: /metrics is unauthenticated, firewall it",
               d->cfg.metrics_listen);
    pd_log(PD_LOG_INFO, "decode", NULL, "listening metrics=%s (port %u)",
           d->cfg.metrics_listen, (unsigned)pd_metrics_http_port(dec_mh));
    return PD_OK;
}

uint16_t dec_metrics_port(void)
{
    return dec_mh ? pd_metrics_http_port(dec_mh) : 0;
}

void dec_metrics_stop(void)
{
    pd_metrics_http_destroy(dec_mh);
    dec_mh = NULL;
    pd_stats_destroy(dec_pool);
    dec_pool = NULL;
}
