/* pf_metrics.c - pd-prefill's HTTP /metrics + /health (metrics.listen):
 * the daemon's counters (pd_prefill_*), kvxfer's set (pd_kvx_*: leases
 * exported / released / expired, ...) and the KV pool gauges
 * (pd_kv_pool_*), rendered on the loop thread per scrape. One daemon per
 * process: the server and the pool set are file statics. */
#include "pf.h"

#include "pd_log.h"
#include "pd_metrics_http.h"

#include <string.h>

static pd_metrics_http_t *pf_mh;
static pd_stats_t *pf_pool;

static pd_status_t pf_metrics_render(void *arg, char **text_p, size_t *len_p)
{
    pf_t *pf = arg;
    uint32_t total = (uint32_t)pf->cfg.kv_blocks;
    uint32_t free_n = kvx_blocks_free_count(pf->blocks);
    pd_kv_pool_set(pf_pool, total, free_n, pf->geom->block_bytes);
    pd_stats_t *sets[3];
    size_t n = 0;
    sets[n++] = pf->stats;
    sets[n++] = pf_pool;
    pd_stats_t *kx = kvx_stats_set(pf->kvx);   /* publishes the latest values */
    if (kx != NULL)
        sets[n++] = kx;
    return pd_stats_render_scrape(sets, n, text_p, len_p); /* + build info, process_* */
}

pd_status_t pf_metrics_start(pf_t *pf)
{
    if (pf->cfg.metrics_listen == NULL || pf->cfg.metrics_listen[0] == '\0')
        return PD_OK;
    pd_status_t st = pd_stats_create(&pd_kv_pool_stats_table,
                                     (const char *[]){ "daemon", pf->daemon_id, NULL }, &pf_pool);
    if (st != PD_OK)
        return st;
    pd_metrics_http_opts_t o = { .listen = pf->cfg.metrics_listen,
                                 .render = pf_metrics_render, .arg = pf };
    st = pd_metrics_http_create(pf->loop, &o, &pf_mh);
    if (st != PD_OK) {
        pd_stats_destroy(pf_pool);
        pf_pool = NULL;
        return st;
    }
    if (!pd_metrics_http_addr_is_loopback(pf->cfg.metrics_listen))
        pd_log(PD_LOG_WARN, "prefill", NULL,
               "metrics.listen %s is not loopback: /metrics is unauthenticated, firewall it",
               pf->cfg.metrics_listen);
    pd_log(PD_LOG_INFO, "prefill", NULL, "listening metrics=%s (port %u)",
           pf->cfg.metrics_listen, (unsigned)pd_metrics_http_port(pf_mh));
    return PD_OK;
}

uint16_t pf_metrics_port(void)
{
    return pf_mh ? pd_metrics_http_port(pf_mh) : 0;
}

void pf_metrics_stop(void)
{
    pd_metrics_http_destroy(pf_mh);
    pf_mh = NULL;
    pd_stats_destroy(pf_pool);
    pf_pool = NULL;
}
