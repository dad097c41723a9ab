/* kvx_stats.c - kvxfer's counters, latency histograms, JSON stats and
 * Prometheus sets. Reads the objects, makes no UCX call. */
#include "kvx_int.h"

#include "pd_build_config.h"
#include "pd_log.h"
#include "pd_stats.h"
#include "pd_time.h"

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <sodium.h>
#include <ucp/api/ucp.h>

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kvx_ps_names[] = {
#define KVX_PS_NAME(name, help) #name,
    KVX_PULL_STATS(KVX_PS_NAME)
#undef KVX_PS_NAME
};
static const char *const kvx_cs_names[] = {
#define KVX_CS_NAME(name, help) #name,
    KVX_CTX_STATS(KVX_CS_NAME)
#undef KVX_CS_NAME
};

static pd_stat_desc_t kvx_prom_descs[KVX_PROM__COUNT];
static char kvx_prom_names[KVX_REJECT__COUNT][48];
/* Prometheus shape, per stats role (kvx_stats_role_t): reasons are labels
 * of one family (pd_kvx_rejected_total{reason}, pd_kvx_pulls_failed_total
 * {reason}, pd_kvx_leases_ended_total{how}); the other side's figures are
 * hidden. */
static pd_stat_prom_t kvx_prom_meta[3][KVX_PROM__COUNT];
static pd_stats_table_t kvx_prom_table[3] = {
    { "kvx", kvx_prom_descs, KVX_PROM__COUNT, kvx_prom_meta[KVX_STATS_BOTH], KVX_PROM__COUNT },
    { "kvx", kvx_prom_descs, KVX_PROM__COUNT, kvx_prom_meta[KVX_STATS_EXPORTER], KVX_PROM__COUNT },
    { "kvx", kvx_prom_descs, KVX_PROM__COUNT, kvx_prom_meta[KVX_STATS_IMPORTER], KVX_PROM__COUNT },
};

/* Importer-side rows: pulls, their gets, rkeys, handle validation. */
static bool kvx_prom_importer_row(unsigned i)
{
    return i < KVX_PROM_PS0 + KVX_PS__COUNT || /* KVX_PROM_PS0 is 0 */
           (i >= KVX_PROM_REJ0 && i < KVX_PROM_G0) || i == KVX_PROM_LATENCY ||
           i == KVX_PROM_G_pulls_in_flight || i == KVX_PROM_G_ops_in_flight ||
           i == KVX_PROM_G_rkeys_live;
}

/* Exporter-side rows: leases and the notifies that end or renew them. */
static bool kvx_prom_exporter_row(unsigned i)
{
    return i == KVX_PROM_CS0 + KVX_CS_leases_exported ||
           i == KVX_PROM_CS0 + KVX_CS_leases_released ||
           i == KVX_PROM_CS0 + KVX_CS_leases_expired ||
           i == KVX_PROM_CS0 + KVX_CS_leases_renewed ||
           i == KVX_PROM_CS0 + KVX_CS_leases_revoked ||
           i == KVX_PROM_CS0 + KVX_CS_notifies_rejected ||
           i == KVX_PROM_CS0 + KVX_CS_am_reads_served ||
           i == KVX_PROM_CS0 + KVX_CS_am_reads_refused ||
           i == KVX_PROM_CS0 + KVX_CS_am_replies_failed ||
           i == KVX_PROM_G_leases_active || i == KVX_PROM_G_blocks_pinned;
}

/* Per importer peer (Prometheus pd_kvx_peer_*{node, peer}): which prefill
 * the KV came from. A set lives as long as the peer slot. */
#define KVX_PEER_PROM(X)                                                      \
    X(pulls_ok,     COUNTER,   "pulls from this peer completed OK")           \
    X(pulls_failed, COUNTER,   "pulls from this peer that failed")            \
    X(bytes_pulled, COUNTER,   "bytes landed from this peer")                 \
    X(pull_latency, HISTOGRAM, "pull latency from this peer")
#define KVX_PEER_PROM_ID(name, kind, help) KVX_PP_##name,
enum { KVX_PEER_PROM(KVX_PEER_PROM_ID) KVX_PP__COUNT };
#undef KVX_PEER_PROM_ID
static const pd_stat_desc_t kvx_peer_prom_descs[] = { KVX_PEER_PROM(PD_STAT_DESC) };
static const pd_stat_prom_t kvx_peer_prom_meta[] = {
    PD_STAT_PROM_LABEL("pulls_ok", "pulls", "result", "ok", "pulls from one peer, by result"),
    PD_STAT_PROM_LABEL("pulls_failed", "pulls", "result", "failed", NULL),
    PD_STAT_PROM_LE("pull_latency", MS),
};
static const pd_stats_table_t kvx_peer_prom_table =
    PD_STATS_TABLE_PROM("kvx_peer", kvx_peer_prom_descs, kvx_peer_prom_meta);

static void kvx_prom_meta_init(void)
{
    static const char *const pull_fail[] = { "pulls_timed_out", "pulls_canceled",
        "pulls_peer_gone", "pulls_stale", "pulls_transport", "pulls_shutdown" };
    static const char *const lease_end[] = { "leases_released", "leases_expired",
                                             "leases_revoked" };
    for (unsigned role = 0; role < 3; role++) {
        for (unsigned i = 0; i < KVX_PROM__COUNT; i++) {
            pd_stat_prom_t *m = &kvx_prom_meta[role][i];
            const char *n = kvx_prom_descs[i].name;
            m->name = n;
            if (i >= KVX_PROM_REJ0 && i < KVX_PROM_G0) {
                m->family = "rejected";
                m->key = "reason";
                m->value = n + strlen("rejected_");
                m->family_help = "KV handles refused by the importer before any UCX "
                                 "operation, by reason";
            }
            for (size_t k = 0; k < sizeof(pull_fail) / sizeof(pull_fail[0]); k++) {
                if (strcmp(n, pull_fail[k]) == 0) {
                    m->family = "pulls_failed";
                    m->key = "reason";
                    m->value = n + strlen("pulls_");
                    m->family_help = "pulls that failed, by reason";
                }
            }
            for (size_t k = 0; k < sizeof(lease_end) / sizeof(lease_end[0]); k++) {
                if (strcmp(n, lease_end[k]) == 0) {
                    m->family = "leases_ended";
                    m->key = "how";
                    m->value = n + strlen("leases_");
                    m->family_help = "leases ended: released by the importer, expired "
                                     "(TTL) or revoked by the exporter";
                }
            }
            if (i == KVX_PROM_LATENCY)
                m->le = PD_HIST_LE_MS;
            m->hidden = (role == KVX_STATS_EXPORTER && kvx_prom_importer_row(i)) ||
                        (role == KVX_STATS_IMPORTER && kvx_prom_exporter_row(i));
        }
    }
}

static void kvx_prom_table_init(void)
{
    static const char *const ps_help[] = {
#define KVX_HELP(name, help) help,
        KVX_PULL_STATS(KVX_HELP)
    };
    static const char *const cs_help[] = { KVX_CTX_STATS(KVX_HELP) };
    static const char *const g_names[] = {
#define KVX_GN(name, help) #name,
        KVX_GAUGE_LIST(KVX_GN)
#undef KVX_GN
    };
    static const char *const g_help[] = { KVX_GAUGE_LIST(KVX_HELP) };
#undef KVX_HELP
    if (kvx_prom_descs[0].name)
        return;
    for (unsigned i = 0; i < KVX_PS__COUNT; i++)
        kvx_prom_descs[KVX_PROM_PS0 + i] =
            (pd_stat_desc_t){ kvx_ps_names[i], PD_STAT_COUNTER, ps_help[i] };
    for (unsigned i = 0; i < KVX_CS__COUNT; i++)
        kvx_prom_descs[KVX_PROM_CS0 + i] =
            (pd_stat_desc_t){ kvx_cs_names[i], PD_STAT_COUNTER, cs_help[i] };
    for (unsigned r = 1; r < KVX_REJECT__COUNT; r++) {
        char *n = kvx_prom_names[r];
        snprintf(n, sizeof(kvx_prom_names[r]), "rejected_%s", kvx_reject_name(r));
        for (char *c = n; *c; c++)
            if (*c >= 'A' && *c <= 'Z')
                *c = (char)(*c - 'A' + 'a');
        kvx_prom_descs[KVX_PROM_REJ0 + r - 1] =
            (pd_stat_desc_t){ n, PD_STAT_COUNTER, "handles rejected for this reason" };
    }
    for (unsigned i = 0; i < sizeof(g_names) / sizeof(g_names[0]); i++)
        kvx_prom_descs[KVX_PROM_G0 + i] =
            (pd_stat_desc_t){ g_names[i], PD_STAT_GAUGE, g_help[i] };
    kvx_prom_descs[KVX_PROM_LATENCY] = (pd_stat_desc_t){
        "pull_latency", PD_STAT_HISTOGRAM, "pull latency, start to completion callback" };
    kvx_prom_meta_init();
}


static unsigned kvx_hist_index(uint64_t ns)
{
    if (ns < 4)
        return (unsigned)ns;
    unsigned oct = 63u - (unsigned)__builtin_clzll(ns);
    unsigned sub = (unsigned)(ns >> (oct - 2)) & 3u;
    return oct * 4 + sub;
}

static uint64_t kvx_hist_upper(unsigned idx)
{
    if (idx < 4)
        return idx;
    unsigned oct = idx / 4, sub = idx % 4;
    return ((uint64_t)(4 + sub + 1) << (oct - 2)) - 1;
}

static uint64_t kvx_hist_quantile(const kvx_pstats_t *s, double q)
{
    if (s->hist_n == 0)
        return 0;
    uint64_t want = (uint64_t)(q * (double)s->hist_n + 0.999999);
    uint64_t seen = 0;
    for (unsigned i = 0; i < KVX_HIST_BUCKETS; i++) {
        seen += s->hist[i];
        if (seen >= want && s->hist[i])
            return kvx_hist_upper(i);
    }
    return kvx_hist_upper(KVX_HIST_BUCKETS - 1);
}

void kvx_pstats_pull_done(kvx_pstats_t *s, uint64_t lat_ns,
                                 uint64_t bytes, uint64_t now)
{
    unsigned i = kvx_hist_index(lat_ns);
    s->hist[i < KVX_HIST_BUCKETS ? i : KVX_HIST_BUCKETS - 1]++;
    s->hist_n++;
    if (s->bw_win_start_ns == 0)
        s->bw_win_start_ns = now;
    if (now - s->bw_win_start_ns >= PD_NS_PER_S) {
        s->bw_last = (uint64_t)((double)s->bw_win_bytes * 1e9 /
                                (double)(now - s->bw_win_start_ns));
        s->bw_win_start_ns = now;
        s->bw_win_bytes = 0;
    }
    s->bw_win_bytes += bytes;
}

/* Bring the pd_stats set up to date: counter deltas and gauge levels.
 * Called at the end of every kick and public entry point that counts. */
void kvx_prom_publish(kvx_ctx_h *ctx)
{
    if (ctx->prom == NULL)
        return;
    uint64_t v[KVX_PROM__COUNT];
    for (unsigned i = 0; i < KVX_PS__COUNT; i++)
        v[KVX_PROM_PS0 + i] = ctx->total.c[i];
    for (unsigned i = 0; i < KVX_CS__COUNT; i++)
        v[KVX_PROM_CS0 + i] = ctx->cs[i];
    for (unsigned r = 1; r < KVX_REJECT__COUNT; r++)
        v[KVX_PROM_REJ0 + r - 1] = ctx->rejects[r];
    for (unsigned i = 0; i < KVX_PROM_G0; i++) {
        if (v[i] != ctx->prom_sent[i]) {
            pd_stats_add(ctx->prom, i, v[i] - ctx->prom_sent[i]);
            ctx->prom_sent[i] = v[i];
        }
    }
    kvx_gauges_t g;
    kvx_gauges(ctx, &g);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_leases_active, g.leases_active);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_blocks_pinned, (int64_t)g.blocks_pinned);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_pulls_in_flight, g.pulls_in_flight);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_ops_in_flight, g.ops_in_flight);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_peers_live, g.peers_live);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_rkeys_live, g.rkeys_live);
    pd_stats_gauge_set(ctx->prom, KVX_PROM_G_eps_live, g.eps_live);
    for (uint32_t i = 0; i < ctx->peer_hwm; i++) {
        kvx_peer_t *p = &ctx->peers[i];
        if (p->prom == NULL)
            continue;
        uint64_t failed = 0;
        for (unsigned c = KVX_PS_pulls_timed_out; c <= KVX_PS_pulls_shutdown; c++)
            failed += p->st.c[c];
        uint64_t now[3] = { p->st.c[KVX_PS_pulls_ok], failed, p->st.c[KVX_PS_bytes_pulled] };
        static const unsigned id[3] = { KVX_PP_pulls_ok, KVX_PP_pulls_failed, KVX_PP_bytes_pulled };
        for (int k = 0; k < 3; k++) {
            if (now[k] > p->prom_sent[k])
                pd_stats_add(p->prom, id[k], now[k] - p->prom_sent[k]);
            p->prom_sent[k] = now[k];
        }
    }
}

/* The context's set (pd_kvx_*{node}); without one the JSON stats still work. */
void kvx_prom_ctx_create(kvx_ctx_h *ctx)
{
    const kvx_config_t *cfg = &ctx->cfg;
    kvx_prom_table_init();
    char node[24];
    snprintf(node, sizeof(node), "%016llx", (unsigned long long)cfg->node_id);
    unsigned role = (unsigned)cfg->stats_role <= KVX_STATS_IMPORTER ? (unsigned)cfg->stats_role
                                                                    : KVX_STATS_BOTH;
    if (pd_stats_create(&kvx_prom_table[role], (const char *[]){ "node", node, NULL },
                        &ctx->prom) != PD_OK)
        ctx->prom = NULL; /* JSON stats still work */
}

/* One importer peer's set (pd_kvx_peer_*{node, peer}); lives with the slot. */
void kvx_prom_peer_create(kvx_peer_t *p)
{
    kvx_ctx_h *ctx = p->ctx;
    uint64_t node_id = p->node_id;
    if (ctx->prom != NULL && ctx->cfg.stats_role != KVX_STATS_EXPORTER && p->prom == NULL) {
        char self[24], peer[24];
        snprintf(self, sizeof(self), "%016llx", (unsigned long long)ctx->cfg.node_id);
        snprintf(peer, sizeof(peer), "%016llx", (unsigned long long)node_id);
        if (pd_stats_create(&kvx_peer_prom_table,
                            (const char *[]){ "node", self, "peer", peer, NULL }, &p->prom) != PD_OK)
            p->prom = NULL; /* the totals still count it */
    }
}

void kvx_prom_pull_latency(kvx_ctx_h *ctx, kvx_peer_t *p, uint64_t ns)
{
    pd_stats_observe_ns(ctx->prom, KVX_PROM_LATENCY, ns);
    pd_stats_observe_ns(p->prom, KVX_PP_pull_latency, ns);
}

pd_stats_t *kvx_stats_set(kvx_ctx_h *ctx)
{
    kvx_prom_publish(ctx);
    return ctx->prom;
}

size_t kvx_stats_sets(kvx_ctx_h *ctx, pd_stats_t **sets, size_t cap)
{
    size_t n = 0;
    kvx_prom_publish(ctx);
    if (ctx->prom != NULL && n < cap)
        sets[n++] = ctx->prom;
    for (uint32_t i = 0; i < ctx->peer_hwm && n < cap; i++)
        if (ctx->peers[i].prom != NULL)
            sets[n++] = ctx->peers[i].prom;
    return n;
}

/* ---- statistics ------------------------------------------------------------------ */

void kvx_gauges(const kvx_ctx_h *ctx, kvx_gauges_t *g)
{
    memset(g, 0, sizeof(*g));
    g->leases_active = ctx->leases_active;
    g->blocks_pinned = ctx->blocks_pinned;
    g->pulls_in_flight = ctx->pulls_in_flight;
    g->ops_in_flight = ctx->ops_in_flight;
    for (uint32_t i = 0; i < ctx->peer_hwm; i++)
        g->peers_live += ctx->peers[i].state != KVX_PEER_FREE;
    g->rkeys_live = ctx->rkeys_live;
    g->eps_live = ctx->eps_live;
}

uint64_t kvx_rejects(const kvx_ctx_h *ctx, kvx_reject_t reason)
{
    return (unsigned)reason < KVX_REJECT__COUNT ? ctx->rejects[reason] : 0;
}

uint64_t kvx_counter(const kvx_ctx_h *ctx, const char *name)
{
    for (unsigned i = 0; i < KVX_PS__COUNT; i++)
        if (strcmp(name, kvx_ps_names[i]) == 0)
            return ctx->total.c[i];
    for (unsigned i = 0; i < KVX_CS__COUNT; i++)
        if (strcmp(name, kvx_cs_names[i]) == 0)
            return ctx->cs[i];
    return UINT64_MAX;
}

static void kvx_pstats_json(cJSON *o, const kvx_pstats_t *s)
{
    for (unsigned i = 0; i < KVX_PS__COUNT; i++)
        cJSON_AddNumberToObject(o, kvx_ps_names[i], (double)s->c[i]);
    cJSON *lat = cJSON_AddObjectToObject(o, "latency");
    if (lat) {
        cJSON_AddNumberToObject(lat, "count", (double)s->hist_n);
        cJSON_AddNumberToObject(lat, "p50_ns", (double)kvx_hist_quantile(s, 0.50));
        cJSON_AddNumberToObject(lat, "p99_ns", (double)kvx_hist_quantile(s, 0.99));
    }
    uint64_t now = pd_now_ns(), bw = s->bw_last;
    if (bw == 0 && s->bw_win_start_ns && now > s->bw_win_start_ns)
        bw = (uint64_t)((double)s->bw_win_bytes * 1e9 /
                        (double)(now - s->bw_win_start_ns));
    cJSON_AddNumberToObject(o, "recent_bw_bytes_per_s", (double)bw);
}

static const char *kvx_peer_state_name(kvx_peer_state_t s)
{
    return s == KVX_PEER_ACTIVE ? "active" : s == KVX_PEER_FAILED ? "failed" : "free";
}

cJSON *kvx_stats_json(const kvx_ctx_h *ctx)
{
    char id[32];
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return NULL;
    snprintf(id, sizeof(id), "%016llx", (unsigned long long)ctx->cfg.node_id);
    cJSON_AddStringToObject(o, "node_id", id);
    snprintf(id, sizeof(id), "%016llx", (unsigned long long)ctx->incarnation);
    cJSON_AddStringToObject(o, "incarnation", id);
    kvx_gauges_t g;
    kvx_gauges(ctx, &g);
    cJSON *gj = cJSON_AddObjectToObject(o, "gauges");
    if (gj) {
        cJSON_AddNumberToObject(gj, "leases_active", g.leases_active);
        cJSON_AddNumberToObject(gj, "blocks_pinned", (double)g.blocks_pinned);
        cJSON_AddNumberToObject(gj, "pulls_in_flight", g.pulls_in_flight);
        cJSON_AddNumberToObject(gj, "ops_in_flight", g.ops_in_flight);
        cJSON_AddNumberToObject(gj, "peers_live", g.peers_live);
        cJSON_AddNumberToObject(gj, "rkeys_live", g.rkeys_live);
        cJSON_AddNumberToObject(gj, "eps_live", g.eps_live);
    }
    cJSON *t = cJSON_AddObjectToObject(o, "total");
    if (t) {
        kvx_pstats_json(t, &ctx->total);
        for (unsigned i = 0; i < KVX_CS__COUNT; i++)
            cJSON_AddNumberToObject(t, kvx_cs_names[i], (double)ctx->cs[i]);
    }
    cJSON *rj = cJSON_AddObjectToObject(o, "rejected");
    for (unsigned i = 1; rj && i < KVX_REJECT__COUNT; i++)
        cJSON_AddNumberToObject(rj, kvx_reject_name(i), (double)ctx->rejects[i]);
    cJSON *pa = cJSON_AddArrayToObject(o, "peers");
    for (uint32_t i = 0; pa && i < ctx->cfg.max_peers; i++) {
        const kvx_peer_t *p = &ctx->peers[i];
        if (p->state == KVX_PEER_FREE)
            continue;
        cJSON *pj = cJSON_CreateObject();
        if (pj == NULL)
            break;
        snprintf(id, sizeof(id), "%016llx", (unsigned long long)p->node_id);
        cJSON_AddStringToObject(pj, "node_id", id);
        snprintf(id, sizeof(id), "%016llx", (unsigned long long)p->incarnation);
        cJSON_AddStringToObject(pj, "incarnation", id);
        cJSON_AddStringToObject(pj, "state", kvx_peer_state_name(p->state));
        cJSON_AddBoolToObject(pj, "err_mode_peer", p->err_mode_peer);
        cJSON_AddBoolToObject(pj, "am_read", p->am_read);
        kvx_pstats_json(pj, &p->st);
        cJSON_AddItemToArray(pa, pj);
    }
    return o;
}

