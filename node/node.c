/* node.c - the node's loop-side parts: live request table, replies the
 * roles share, the router session's callbacks, drain, the common admin
 * commands and the id helpers (see node.h). */
#include "node.h"

#include "pd_boot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "pd_etcd.h"
#include "pd_log.h"
#include "pd_time.h"

const char *const node_kv_dtypes[] = { "f32", "f16", "q8_0", "q4_0", "bf16", "fp8_e4m3", NULL };
const char *const node_kv_dtypes_kv[] = { "f32", "f16", "q8_0", "q4_0", "bf16", "fp8_e4m3",
                                          "same", NULL };
const char *const node_ep_tls[] = { "shm", "tcp", "auto", NULL };
const char *const node_qdot_paths[] = { "auto", "amx", "vnni", "avx2", "scalar", "off", NULL };

/* ---- ids ------------------------------------------------------------------ */

uint64_t node_id_of(const char *daemon_id)
{
    uint64_t id = XXH64(daemon_id, strlen(daemon_id), 0);
    return id != 0 ? id : 1;
}

uint64_t node_lease_wire_id(kvx_lease_id_t l)
{
    return (uint64_t)l.slot << 32 | (l.gen & 0xffffffffu);
}

/* ---- leases ----------------------------------------------------------------- */

pd_status_t node_export(node_t *n, node_req_t *r, const char *importer, const uint32_t *blocks,
                        uint32_t nb, uint64_t ttl_ns, void *buf, size_t cap, size_t *len_p,
                        kvx_lease_id_t *lease_p)
{
    pd_status_t st = kvx_export(n->region, node_id_of(importer), blocks, nb, ttl_ns,
                                (uint64_t)(uintptr_t)r, buf, cap, len_p, lease_p);
    if (st == PD_OK && lease_p->slot < n->max_leases)
        n->lease_reqs[lease_p->slot] = r;
    return st;
}

pd_status_t node_export_part(node_t *n, node_req_t *r, const char *importer,
                             const uint32_t *blocks, uint32_t nb, uint64_t ttl_ns, void *buf,
                             size_t cap, size_t *len_p, kvx_lease_id_t *lease_p,
                             uint32_t *taken_p)
{
    pd_status_t st = kvx_export_part(n->region, node_id_of(importer), blocks, nb, ttl_ns,
                                     (uint64_t)(uintptr_t)r, buf, cap, len_p, lease_p, taken_p);
    if (st == PD_OK && lease_p->slot < n->max_leases)
        n->lease_reqs[lease_p->slot] = r;
    return st;
}

pd_status_t node_export_stream(node_t *n, node_req_t *r, const char *importer,
                               const uint32_t *blocks, uint32_t nb, uint64_t ttl_ns,
                               uint32_t blocks_ready, void *buf, size_t cap, size_t *len_p,
                               kvx_lease_id_t *lease_p, kvx_ready_t *ready_p)
{
    pd_status_t st = kvx_export_stream(n->region, node_id_of(importer), blocks, nb, ttl_ns,
                                       (uint64_t)(uintptr_t)r, blocks_ready, buf, cap, len_p,
                                       lease_p, ready_p);
    if (st == PD_OK && lease_p->slot < n->max_leases)
        n->lease_reqs[lease_p->slot] = r;
    return st;
}

pd_status_t node_import(node_t *n, const void *handle, size_t len, kvx_import_t *imp,
                        kvx_reject_t *why_p)
{
    return kvx_handle_import(n->kvx, handle, len, n->geom->compat_hash, imp, why_p);
}

pd_status_t node_pull_start(node_t *n, const kvx_import_t *imp, const uint32_t *blocks,
                            uint32_t nb, uint32_t n_skip, uint64_t budget_ns, kvx_pull_cb_t cb,
                            void *arg, uint64_t *pull_id_p)
{
    uint32_t skip_inline[64], *local = (uint32_t *)(uintptr_t)blocks;
    if (n_skip > 0) {
        local = nb <= 64 ? skip_inline : malloc((size_t)nb * sizeof(uint32_t));
        if (local == NULL)
            return PD_ERR_NO_MEMORY;
        for (uint32_t i = 0; i < nb; i++)
            local[i] = i < n_skip ? KVX_PULL_SKIP : blocks[i];
    }
    pd_status_t st = kvx_pull_start(n->kvx, imp, n->region, local, nb, pd_now_ns() + budget_ns,
                                    0, cb, arg, pull_id_p);
    if (local != blocks && local != skip_inline)
        free(local);
    return st == PD_OK ? PD_ERR_INTERNAL : st; /* kvx never completes in place */
}

/* ---- KV peers ---------------------------------------------------------------- */

static node_peer_t *node_peer_find(node_t *n, const char *id, bool create)
{
    node_peer_t *free_slot = NULL;
    for (uint32_t i = 0; i < NODE_MAX_PEERS; i++) {
        if (n->peers[i].id[0] != '\0' && strcmp(n->peers[i].id, id) == 0)
            return &n->peers[i];
        if (n->peers[i].id[0] == '\0' && free_slot == NULL)
            free_slot = &n->peers[i];
    }
    if (!create || free_slot == NULL)
        return NULL;
    snprintf(free_slot->id, sizeof(free_slot->id), "%s", id);
    return free_slot;
}

void node_peer_info(node_t *n, const node_link_t *from, const proto_peer_info_t *pi,
                    unsigned role_mask)
{
    if (pi->role >= 16 || !(role_mask & (1u << pi->role)) ||
        strcmp(pi->daemon_id, n->daemon_id) == 0)
        return;
    node_peer_t *p = node_peer_find(n, pi->daemon_id, true);
    if (p == NULL) {
        pd_log(PD_LOG_WARN, n->role->name, NULL, "peer table full: %s ignored", pi->daemon_id);
        return;
    }
    pd_status_t st = kvx_peer_add(n->kvx, pi->kv_addr.p, pi->kv_addr.len);
    if (st == PD_ERR_STALE) {
        /* PEER_DOWN tombstoned this incarnation, and now the router (over
         * our authenticated session) says it registered again: it was
         * unreachable for a while, not dead. Use it again. */
        if (kvx_peer_revive(n->kvx, node_id_of(pi->daemon_id), pi->incarnation) == PD_OK)
            st = kvx_peer_add(n->kvx, pi->kv_addr.p, pi->kv_addr.len);
    }
    if (st == PD_OK || st == PD_ERR_EXISTS) {
        if (!p->live || p->incarnation != pi->incarnation)
            p->links = 0; /* a new incarnation: only the routers that saw it */
        if (from != NULL)
            p->links |= 1u << from->idx;
        p->incarnation = pi->incarnation;
        p->node_id = node_id_of(pi->daemon_id);
        p->live = true;
        pd_log(st == PD_OK ? PD_LOG_INFO : PD_LOG_DEBUG, n->role->name, NULL,
               "%s peer %s (incarnation %llx) %s",
               pi->role == PROTO_ROLE_PREFILL ? "prefill" : "decode", pi->daemon_id,
               (unsigned long long)pi->incarnation, st == PD_OK ? "added" : "known");
    } else {
        pd_log(PD_LOG_WARN, n->role->name, NULL, "peer %s refused: %s", pi->daemon_id,
               pd_status_str(st));
    }
}

void node_peer_down(node_t *n, const node_link_t *from, const proto_peer_down_t *pd)
{
    node_peer_t *p = node_peer_find(n, pd->daemon_id, false);
    if (p == NULL || !p->live || (pd->incarnation != 0 && pd->incarnation != p->incarnation))
        return; /* unknown, or an older incarnation than the one we use */
    if (from != NULL)
        p->links &= ~(1u << from->idx);
    if (p->links != 0) {
        /* another router still has a live session with it: the peer lost
         * one router, it is not gone (its pulls go on) */
        pd_log(PD_LOG_INFO, n->role->name, NULL, "peer %s lost router %s (%s); still up at others",
               pd->daemon_id, from != NULL ? from->addr : "?", pd_status_name(pd->status));
        return;
    }
    p->live = false;
    pd_status_t st = kvx_peer_fail(n->kvx, p->node_id, PD_ERR_PEER_GONE);
    pd_log(PD_LOG_INFO, n->role->name, NULL, "peer %s down (%s): %s", pd->daemon_id,
           pd_status_name(pd->status), pd_status_str(st));
}

void node_peers_forget_link(node_t *n, const node_link_t *from)
{
    if (from != NULL)
        for (uint32_t i = 0; i < NODE_MAX_PEERS; i++)
            n->peers[i].links &= ~(1u << from->idx);
}

void node_adm_peers(node_t *n, cJSON *reply)
{
    cJSON *p = cJSON_AddArrayToObject(reply, "peers");
    for (uint32_t i = 0; i < NODE_MAX_PEERS; i++) {
        if (n->peers[i].id[0] == '\0')
            continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", n->peers[i].id);
        cJSON_AddBoolToObject(o, "live", n->peers[i].live);
        cJSON_AddItemToArray(p, o);
    }
}

/* kvx's lease-end callback (on the loop): the request it was granted for,
 * checked against the tag given at export, to the role. */
void node_on_lease_end(void *arg, const kvx_lease_info_t *info, kvx_lease_end_t why)
{
    node_t *n = arg;
    node_req_t *r = info->slot < n->max_leases ? n->lease_reqs[info->slot] : NULL;
    if (r == NULL || (uint64_t)(uintptr_t)r != info->user_tag) {
        pd_log(PD_LOG_ERROR, n->role->name, NULL, "lease end for unknown slot %u", info->slot);
        return;
    }
    n->lease_reqs[info->slot] = NULL;
    pd_log(PD_LOG_DEBUG, n->role->name, r->id, "lease ended: %s",
           why == KVX_LEASE_RELEASED ? "released" : why == KVX_LEASE_EXPIRED ? "expired"
                                                                              : "revoked");
    n->role->on_lease_end(n, r, why);
}

/* ---- requests ------------------------------------------------------------- */

/* The table key of wire id `id` on the router session `epoch`. */
static void node_req_key(char *key, size_t cap, uint64_t epoch, const char *id)
{
    snprintf(key, cap, "%llx/%s", (unsigned long long)epoch, id);
}

node_req_t *node_req_find(node_t *n, const node_link_t *from, const char *id)
{
    if (from == NULL)
        return NULL;
    char key[sizeof(((node_req_t *)0)->key)];
    node_req_key(key, sizeof(key), from->epoch, id);
    pd_idhash_node_t *h = pd_idhash_find(&n->by_id, key);
    return h != NULL ? PD_CONTAINER_OF(h, node_req_t, hnode) : NULL;
}

void node_req_link(node_t *n, node_link_t *from, node_req_t *r)
{
    r->link = from;
    r->epoch = from != NULL ? from->epoch : 0;
    node_req_key(r->key, sizeof(r->key), r->epoch, r->id);
    pd_idhash_add(&n->by_id, &r->hnode, r->key);
    r->next = n->live;
    r->prev = NULL;
    if (n->live)
        n->live->prev = r;
    n->live = r;
    n->n_live++;
    pd_stats_gauge_set(n->stats, NODE_STAT_live, n->n_live);
}

bool node_req_can_reply(const node_t *n, const node_req_t *r)
{
    return !n->stopping && r->link != NULL && r->link->in_use &&
           r->epoch == r->link->epoch && proto_session_up(r->link->sess);
}

pd_status_t node_req_send(node_t *n, const node_req_t *r, const proto_msg_t *msg)
{
    (void)n;
    if (r->link == NULL || !r->link->in_use || r->epoch != r->link->epoch)
        return PD_ERR_SHUTDOWN;
    return proto_session_send(r->link->sess, msg);
}

static void node_req_unlink(node_t *n, node_req_t *r)
{
    pd_idhash_del(&n->by_id, &r->hnode);
    if (r->prev)
        r->prev->next = r->next;
    else
        n->live = r->next;
    if (r->next)
        r->next->prev = r->prev;
    n->n_live--;
    pd_stats_gauge_set(n->stats, NODE_STAT_live, n->n_live);
}

uint32_t node_kv_available(const node_t *n)
{
    return n->prefix != NULL ? kvx_prefix_available(n->prefix)
                             : kvx_blocks_free_count(n->blocks);
}

void node_req_retire(node_t *n, node_req_t *r, void (*free_fn)(void *), void *obj)
{
    if (r->blocks_held) {
        /* drop this request's references: blocks shared with the prefix
         * cache (or other sequences) stay, the rest are freed */
        pd_status_t st = kvx_blocks_unref(n->blocks, r->blocks, r->n_blocks, NULL);
        if (st != PD_OK)
            pd_log(PD_LOG_ERROR, n->role->name, r->id, "freeing %u blocks: %s (leaked)",
                   r->n_blocks, pd_status_str(st));
        r->blocks_held = false;
    }
    node_req_unlink(n, r);
    if (pd_loop_defer_free(n->loop, free_fn, obj) != PD_OK)
        free_fn(obj); /* nothing references it any more */
}

pd_status_t node_sampling(const node_t *n, const proto_sampling_t *ps, eng_sample_params_t *sp)
{
    eng_sample_params_default(sp);
    sp->temperature = ps->temperature;
    sp->top_p = ps->top_p;
    sp->top_k = ps->top_k;
    sp->seed = ps->seed;
    sp->max_tokens = ps->max_tokens;
    sp->min_tokens = ps->min_tokens;
    sp->ignore_eos = (ps->flags & PROTO_SAMPLE_IGNORE_EOS) != 0;
    sp->n_eos = n->n_eos;
    memcpy(sp->eos_ids, n->eos_ids, sizeof(sp->eos_ids));
    if (ps->stop.n > ENG_SAMPLE_MAX_STOP_IDS)
        return PD_ERR_TOO_BIG;
    sp->n_stop_ids = proto_tokens_copy(&ps->stop, sp->stop_ids, ENG_SAMPLE_MAX_STOP_IDS);
    sp->presence_penalty = ps->presence_penalty;
    sp->frequency_penalty = ps->frequency_penalty;
    sp->repetition_penalty = ps->repetition_penalty;
    sp->min_p = ps->min_p;
    if (ps->n_bias > ENG_SAMPLE_MAX_BIAS)
        return PD_ERR_TOO_BIG;
    sp->n_bias = ps->n_bias;
    for (uint32_t i = 0; i < ps->n_bias; i++)
        sp->bias[i] = (eng_logit_bias_t){ ps->bias_ids[i], ps->bias[i] };
    return eng_sample_params_check(sp);
}

void node_send_error(node_t *n, node_link_t *l, const char *id, pd_status_t status,
                     const char *fmt, ...)
{
    (void)n;
    if (l == NULL || !l->in_use)
        return;
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_ERROR;
    snprintf(m.u.error.request_id, sizeof(m.u.error.request_id), "%s", id);
    m.u.error.status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.u.error.message, sizeof(m.u.error.message), fmt, ap);
    va_end(ap);
    (void)proto_session_send(l->sess, &m);
}

/* ---- drain ---------------------------------------------------------------- */

static void node_stop_loop(void *arg)
{
    node_t *n = arg;
    pd_loop_stop(n->loop);
}

/* One router session flushed and closed; the last one stops the loop. */
static void node_link_shut(void *arg)
{
    node_link_t *l = arg;
    node_t *n = l->n;
    if (l->shut)
        return;
    l->shut = true;
    if (n->n_shut > 0 && --n->n_shut == 0)
        node_stop_loop(n);
}

void node_maybe_drained(node_t *n)
{
    if (n->ep_win != NULL && !n->ep_group_drained)
        return; /* an EP rank leaves with its whole group (node_ep_vote) */
    if (n->draining && !n->stopping && n->n_live == 0) {
        pd_log(PD_LOG_INFO, n->role->name, NULL, "drained: flushing and exiting");
        n->stopping = true;
        /* the last replies must reach every router before we exit */
        n->n_shut = 1; /* held until every shutdown is started */
        for (uint32_t i = 0; i < NODE_ROUTERS_MAX; i++) {
            node_link_t *l = &n->links[i];
            if (!l->in_use || l->shut)
                continue;
            n->n_shut++;
            proto_session_shutdown(l->sess, node_link_shut, l);
        }
        if (--n->n_shut == 0)
            node_stop_loop(n);
    }
}

static void node_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    node_t *n = arg;
    pd_log(PD_LOG_WARN, n->role->name, NULL, "drain timeout: %u requests still live; exiting",
           n->n_live);
    n->stopping = true;
    pd_loop_stop(n->loop);
}

void node_drain_init(node_t *n)
{
    n->drain_ev = evtimer_new(pd_loop_base(n->loop), node_drain_timeout, n);
}

void node_heartbeat_now(node_t *n)
{
    for (uint32_t i = 0; i < NODE_ROUTERS_MAX; i++)
        if (n->links[i].in_use)
            proto_session_heartbeat_now(n->links[i].sess);
}

void node_start_drain(node_t *n)
{
    if (n->draining)
        return;
    n->draining = true;
    pd_log(PD_LOG_INFO, n->role->name, NULL, "draining: %u requests live", n->n_live);
    node_heartbeat_now(n);
    struct timeval tv = pd_ns_to_timeval(n->cfg->drain_timeout_ns);
    if (n->drain_ev != NULL)
        evtimer_add(n->drain_ev, &tv);
    node_maybe_drained(n);
}

static void node_on_sigterm(pd_loop_t *loop, void *arg)
{
    node_t *n = arg;
    if (pd_loop_drain_count(loop) > 1) {
        n->stopping = true;
        pd_loop_stop(loop);
        return;
    }
    node_start_drain(n);
}

/* ---- router links ------------------------------------------------------- */

static void node_write_ready(node_t *n, const node_link_t *l)
{
    if (n->cfg->ready_file == NULL || n->registered_once)
        return;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", n->daemon_id);
    cJSON_AddStringToObject(j, "role", n->role->name);
    cJSON_AddNumberToObject(j, "pid", (double)getpid());
    cJSON_AddStringToObject(j, "router", proto_session_router_id(l->sess));
    if (n->cfg->boot.admin_socket)
        cJSON_AddStringToObject(j, "admin", n->cfg->boot.admin_socket);
    if (node_metrics_port(n) != 0)
        cJSON_AddNumberToObject(j, "metrics", node_metrics_port(n));
    char nid[32];
    snprintf(nid, sizeof(nid), "%016llx", (unsigned long long)kvx_ctx_node_id(n->kvx));
    cJSON_AddStringToObject(j, "kv_node", nid);
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (txt == NULL)
        return;
    n->registered_once = node_ready_write(n->cfg->ready_file, txt, n->role->name);
    free(txt);
}

static void node_on_up(proto_session_t *s, const proto_register_ack_t *ack, void *arg)
{
    (void)s;
    node_link_t *l = arg;
    node_t *n = l->n;
    l->epoch = ++n->serial;
    pd_log(PD_LOG_INFO, n->role->name, NULL,
           "registered with router %s (%s) as %s (heartbeat %llu ms; %u of %u routers up)",
           ack->daemon_id, l->addr, n->daemon_id,
           (unsigned long long)(ack->heartbeat_interval_ns / 1000000), node_links_up(n),
           n->n_links);
    node_kve_session_up(n->kve); /* every router's index of our cache starts over */
    node_write_ready(n, l);
    char status[96];
    snprintf(status, sizeof(status), "serving: registered with %u of %u routers",
             node_links_up(n), n->n_links);
    pd_loop_notify_status(status);
}

static void node_on_down(proto_session_t *s, pd_status_t why, void *arg)
{
    (void)s;
    node_link_t *l = arg;
    node_t *n = l->n;
    l->epoch = ++n->serial;
    uint32_t lost = 0;
    for (const node_req_t *r = n->live; r != NULL; r = r->next)
        lost += r->link == l;
    pd_log(PD_LOG_WARN, n->role->name, NULL,
           "router %s lost (%s): canceling its %u requests, reconnecting", l->addr,
           pd_status_str(why), lost);
    n->role->cancel_all(n, l);
}

static void node_on_reject(proto_session_t *s, pd_status_t status, const char *reason, void *arg)
{
    (void)s;
    node_link_t *l = arg;
    pd_log(PD_LOG_ERROR, l->n->role->name, NULL,
           "registration with %s refused (%s): %s; retrying with backoff", l->addr,
           pd_status_name(status), reason);
}

static void node_on_error(node_t *n, node_link_t *from, const proto_msg_t *msg)
{
    pd_log(PD_LOG_WARN, n->role->name, msg->u.error.request_id[0] ? msg->u.error.request_id : NULL,
           "router %s error: %s: %s", from->addr,
           pd_status_name(msg->u.error.status), msg->u.error.message);
}

/* Every message of an up session: the role's callback for its type, told
 * the link it came on. */
static void node_dispatch(proto_conn_t *c, const proto_msg_t *msg, void *arg)
{
    (void)c; /* the link is what the roles need */
    node_link_t *l = arg;
    node_t *n = l->n;
    const node_msgs_t *cbs = &n->role->msgs;
    node_msg_cb_t cb = NULL;
    switch (msg->hdr.type) {
#define NODE_X_CB(NAME, name, code, max) case code: cb = cbs->on_##name; break;
    PROTO_MSG_LIST(NODE_X_CB)
#undef NODE_X_CB
    }
    if (cb == NULL && msg->hdr.type == PROTO_MSG_ERROR)
        cb = node_on_error;
    if (cb != NULL)
        cb(n, l, msg);
}

static void node_fill_hb(proto_session_t *s, proto_heartbeat_t *hb, void *arg)
{
    (void)s;
    node_link_t *l = arg;
    node_t *n = l->n;
    /* the same figures to every router: the daemon's whole load */
    hb->flags = n->draining ? PROTO_HB_DRAINING : 0;
    hb->free_blocks = node_kv_available(n);
    hb->total_blocks = kvx_blocks_total(n->blocks);
    n->role->fill_hb(n, hb);
}

void node_session_opts(node_t *n, proto_session_opts_t *so)
{
    memset(so, 0, sizeof(*so));
    so->router_addr = NULL;             /* per link (node_link_add) */
    so->secret = n->have_secret ? &n->secret : NULL;
    so->hello.role = n->role->proto_role;
    so->hello.caps = n->role->caps;
    snprintf(so->hello.daemon_id, sizeof(so->hello.daemon_id), "%s", n->daemon_id);
    so->hello.incarnation = n->incarnation;
    so->hello.compat_hash = n->geom->compat_hash;
    so->hello.geom = (proto_kv_geom_t){
        .n_layers = n->geom->n_layers, .n_kv_heads = n->geom->n_kv_heads,
        .head_dim = n->geom->head_dim, .block_tokens = n->geom->block_tokens,
        .kv_dtype = PROTO_KV_DTYPE_PACK(n->geom->kv_dtype, n->geom->kv_dtype_v),
        .total_blocks = (uint32_t)n->cfg->kv_blocks,
        .block_bytes = n->geom->block_bytes, .context_length = n->geom->context_length,
        .vocab_size = n->geom->vocab_size,
    };
    so->hello.kv_addr.p = n->meta;
    so->hello.kv_addr.len = (uint32_t)n->meta_len;
    so->heartbeat_interval_ns = n->cfg->heartbeat_ns;
    so->backoff_min_ns = n->cfg->reconnect_min_ns;
    memset(&so->cbs, 0, sizeof(so->cbs));
    so->cbs.on_other = node_dispatch; /* -> the role's per-type callbacks */
    so->on_up = node_on_up;
    so->on_down = node_on_down;
    so->on_reject = node_on_reject;
    so->fill_heartbeat = node_fill_hb;
    so->arg = n;
    so->stats = &n->pstats;
}

pd_status_t node_routers_parse(const char *list, char (*addrs)[128], uint32_t max,
                               uint32_t *n_p)
{
    uint32_t cnt = 0;
    const char *p = list;
    if (p == NULL)
        return PD_ERR_BAD_INPUT;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        while (len > 0 && (*p == ' ' || *p == '\t')) {
            p++;
            len--;
        }
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        if (len == 0 || len >= 128 || cnt >= max)
            return PD_ERR_BAD_INPUT;
        char a[128];
        memcpy(a, p, len);
        a[len] = '\0';
        struct sockaddr_storage ss;
        int sl;
        if (proto_addr_parse(a, &ss, &sl) != PD_OK)
            return PD_ERR_BAD_INPUT;
        for (uint32_t i = 0; i < cnt; i++)
            if (strcmp(addrs[i], a) == 0)
                return PD_ERR_BAD_INPUT;
        memcpy(addrs[cnt++], a, len + 1);
        if (end == NULL)
            break;
        p = end + 1;
    }
    *n_p = cnt;
    return PD_OK;
}

uint32_t node_links_up(const node_t *n)
{
    uint32_t up = 0;
    for (uint32_t i = 0; i < NODE_ROUTERS_MAX; i++)
        up += n->links[i].in_use && proto_session_up(n->links[i].sess);
    return up;
}

pd_status_t node_link_add(node_t *n, const char *addr, node_link_t **l_p)
{
    node_link_t *slot = NULL;
    for (uint32_t i = 0; i < NODE_ROUTERS_MAX; i++) {
        node_link_t *l = &n->links[i];
        if (l->in_use && strcmp(l->addr, addr) == 0)
            return PD_ERR_EXISTS;
        if (!l->in_use && slot == NULL)
            slot = l;
    }
    if (slot == NULL)
        return PD_ERR_NO_SPACE;
    if (strlen(addr) >= sizeof(slot->addr))
        return PD_ERR_BAD_INPUT;
    proto_session_opts_t so;
    node_session_opts(n, &so);
    so.router_addr = addr;
    so.arg = slot;
    memset(slot, 0, sizeof(*slot));
    slot->n = n;
    slot->idx = (uint32_t)(slot - n->links);
    snprintf(slot->addr, sizeof(slot->addr), "%s", addr);
    slot->epoch = ++n->serial;
    pd_status_t st = proto_session_create(pd_loop_base(n->loop), &so, &slot->sess);
    if (st != PD_OK)
        return st;
    slot->in_use = true;
    n->n_links++;
    if (l_p)
        *l_p = slot;
    return PD_OK;
}

void node_link_remove(node_t *n, node_link_t *l)
{
    if (l == NULL || !l->in_use)
        return;
    proto_session_destroy(l->sess); /* on_down is not called for this close */
    l->sess = NULL;
    l->in_use = false;
    l->epoch = ++n->serial;
    n->n_links--;
    n->role->cancel_all(n, l);
}

const char *node_router_list(const node_config_t *c)
{
    if (c->router != NULL)
        return c->router;
    return c->etcd != NULL ? "" : "127.0.0.1:7000";
}

/* ---- etcd membership ------------------------------------------------------ */

/* Count a rejected etcd entry once per put (its mod revision); log it
 * then. */
static void node_member_reject(node_t *n, const pd_member_entry_t *e, uint64_t *counter,
                               const char *why)
{
    for (uint32_t i = 0; i < 32; i++)
        if (n->etcd_counted[i] == e->mod_revision && e->mod_revision != 0)
            return;
    n->etcd_counted[n->etcd_counted_next++ % 32] = e->mod_revision;
    (*counter)++;
    pd_log(PD_LOG_WARN, n->role->name, NULL, "etcd: routers/%.64s ignored: %s", e->key, why);
}

/* The address an etcd entry routers/<key> gives, or false (counted): the
 * key's shape, the signature (with a secret: pd_etcd_value_verify over the
 * full key), the address (numeric host:port; loopback only without a
 * secret). */
static bool node_member_addr(node_t *n, const pd_member_entry_t *e, char *addr, size_t cap)
{
    if (!pd_etcd_key_ok(e->key, PROTO_DAEMON_ID_MAX)) {
        node_member_reject(n, e, &n->etcd_bad_key, "not a router id");
        return false;
    }
    if (n->have_secret) {
        char full[PD_MEMBER_VAL_MAX * 2 + 16];
        snprintf(full, sizeof(full), "%.100srouters/%.127s", n->cfg->etcd_prefix, e->key);
        if (pd_etcd_value_verify(n->etcd_key, full, e->value, addr, cap) != PD_OK) {
            node_member_reject(n, e, &n->etcd_forged, "not signed with the deployment secret");
            return false;
        }
    } else {
        snprintf(addr, cap, "%s", e->value);
    }
    struct sockaddr_storage ss;
    int sl;
    if (proto_addr_parse(addr, &ss, &sl) != PD_OK ||
        (!n->have_secret && !pd_addr_is_loopback(addr))) {
        node_member_reject(n, e, &n->etcd_bad_value,
                           n->have_secret ? "not a numeric host:port"
                                          : "not a loopback host:port (no secret)");
        return false;
    }
    return true;
}

/* Bring the links in line with etcd's routers/: connect to new ones, kick
 * the reconnect of one whose key was put again (a restart), drop one that
 * left etcd once its session is down (an up session keeps serving: etcd
 * may be catching up). Only entries that pass node_member_addr take a
 * link, at most etcd.routers-max of them, in key order (etcd's), so
 * nobody without the secret takes a slot; static links are never dropped.
 * Loop thread, never inside a session callback. */
static void node_member_reconcile(node_t *n)
{
    if (n->member == NULL || n->stopping)
        return;
    char err[160];
    bool up = pd_member_connected(n->member, err, sizeof(err));
    if (up != n->member_up)
        pd_log(up ? PD_LOG_INFO : PD_LOG_WARN, n->role->name, NULL, "etcd %s: %s%s",
               n->cfg->etcd, up ? "registered" : "unreachable (sessions go on): ", up ? "" : err);
    n->member_up = up;
    pd_member_entry_t e[PD_MEMBER_MAX];
    uint32_t ne = pd_member_snapshot(n->member, e, PD_MEMBER_MAX);
    if (ne > PD_MEMBER_MAX)
        ne = PD_MEMBER_MAX;
    bool seen[NODE_ROUTERS_MAX] = { false };
    /* what cannot be used is logged once per change of the set, not on
     * every reconcile (a set over NODE_ROUTERS_MAX stays so) */
    uint64_t sig = ne;
    for (uint32_t i = 0; i < ne; i++)
        sig = sig * 1000003u ^ (uint64_t)e[i].mod_revision;
    bool changed = sig != n->member_sig;
    n->member_sig = sig;
    uint32_t taken = 0;
    for (uint32_t i = 0; i < ne; i++) {
        char addr[PD_MEMBER_VAL_MAX];
        if (!node_member_addr(n, &e[i], addr, sizeof(addr)))
            continue;
        if (taken == n->cfg->etcd_routers_max) {
            node_member_reject(n, &e[i], &n->etcd_over_max, "etcd.routers-max reached");
            continue;
        }
        taken++;
        node_link_t *l = NULL;
        for (uint32_t k = 0; k < NODE_ROUTERS_MAX && l == NULL; k++)
            if (n->links[k].in_use && strcmp(n->links[k].addr, addr) == 0)
                l = &n->links[k];
        if (l == NULL) {
            pd_status_t st = node_link_add(n, addr, &l);
            if (st != PD_OK) {
                if (changed)
                    pd_log(PD_LOG_WARN, n->role->name, NULL, "etcd: router %s at %s not used: %s",
                           e[i].key, addr, pd_status_str(st));
                continue;
            }
            l->from_etcd = true;
            pd_log(PD_LOG_INFO, n->role->name, NULL, "etcd: router %s at %s: connecting",
                   e[i].key, addr);
        } else if (l->etcd_rev != 0 && l->etcd_rev != e[i].mod_revision) {
            /* registered again: it is back, do not wait out the backoff */
            proto_session_retry_now(l->sess);
        }
        l->etcd_rev = e[i].mod_revision;
        seen[l->idx] = true;
    }
    for (uint32_t k = 0; k < NODE_ROUTERS_MAX; k++) {
        node_link_t *l = &n->links[k];
        if (!l->in_use || !l->from_etcd || seen[k] || proto_session_up(l->sess))
            continue;
        pd_log(PD_LOG_INFO, n->role->name, NULL, "etcd: router at %s left: dropping its session",
               l->addr);
        node_link_remove(n, l);
    }
}

static void node_member_changed(void *arg)
{
    node_member_reconcile(arg);
}

static void node_member_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    node_member_reconcile(arg);
}

pd_status_t node_member_start(node_t *n)
{
    const node_config_t *c = n->cfg;
    if (c->etcd == NULL)
        return PD_OK;
    size_t pl = strlen(c->etcd_prefix);
    if (pl == 0 || c->etcd_prefix[pl - 1] != '/')
        return PD_ERR_BAD_INPUT;
    char key[PD_MEMBER_VAL_MAX], val[PD_MEMBER_VAL_MAX], full[PD_MEMBER_VAL_MAX * 2 + 16];
    snprintf(key, sizeof(key), "daemons/%s", n->daemon_id);
    snprintf(val, sizeof(val), "%s", n->role->name);
    if (n->have_secret) { /* values signed like the routers' (pd_etcd.h) */
        proto_auth_derive(&n->secret, "pdserve etcd v1", n->etcd_key);
        snprintf(full, sizeof(full), "%.100s%.127s", c->etcd_prefix, key);
        if (pd_etcd_value_sign(n->etcd_key, full, n->role->name, val, sizeof(val)) != PD_OK)
            return PD_ERR_BAD_INPUT;
    }
    pd_member_opts_t mo = {
        .endpoint = c->etcd, .prefix = c->etcd_prefix, .key = key, .value = val,
        .ttl_s = (uint32_t)(c->etcd_ttl_ns / 1000000000ull), .watch = "routers/",
        .on_change = node_member_changed, .arg = n,
    };
    n->member_ev = event_new(pd_loop_base(n->loop), -1, EV_PERSIST, node_member_tick, n);
    if (n->member_ev == NULL)
        return PD_ERR_NO_MEMORY;
    pd_status_t st = pd_member_start(pd_loop_base(n->loop), &mo, &n->member);
    if (st != PD_OK) {
        event_free(n->member_ev);
        n->member_ev = NULL;
        return st;
    }
    struct timeval tv = { 1, 0 };
    event_add(n->member_ev, &tv);
    return PD_OK;
}

void node_member_stop(node_t *n)
{
    pd_member_stop(n->member);          /* daemons/<id> goes at once */
    n->member = NULL;
    if (n->member_ev != NULL)
        event_free(n->member_ev);
    n->member_ev = NULL;
}

pd_status_t node_run(node_t *n, const char *extra)
{
    char addrs[NODE_ROUTERS_MAX][128];
    uint32_t na = 0;
    const char *list = node_router_list(n->cfg);
    if (list[0] != '\0' && node_routers_parse(list, addrs, NODE_ROUTERS_MAX, &na) != PD_OK) {
        fprintf(stderr,
                "pd-%s: --router: bad list \"%s\" (host:port[,host:port...], at most %u, no "
                "duplicates)\n", n->role->name, list, NODE_ROUTERS_MAX);
        return PD_ERR_BAD_INPUT;
    }
    for (uint32_t i = 0; i < na; i++) { /* node_boot checked the list and insecure mode */
        pd_status_t st = node_link_add(n, addrs[i], NULL);
        if (st != PD_OK) {
            fprintf(stderr, "pd-%s: --router: cannot use \"%s\": %s\n", n->role->name, addrs[i],
                    pd_status_str(st));
            return PD_ERR_BAD_INPUT;
        }
    }
    pd_status_t mst = node_member_start(n);
    if (mst != PD_OK) {
        fprintf(stderr, "pd-%s: --etcd %s (prefix %s): %s\n", n->role->name, n->cfg->etcd,
                n->cfg->etcd_prefix, pd_status_str(mst));
        return PD_ERR_BAD_INPUT;
    }
    if (!n->have_secret)
        pd_log(PD_LOG_WARN, n->role->name, NULL,
               "RUNNING WITHOUT AUTHENTICATION (--insecure-no-auth): loopback only");
    pd_loop_on_drain(n->loop, node_on_sigterm, n);
    pd_log(PD_LOG_INFO, n->role->name, NULL,
           "%s up: model %s (%s), %llu blocks x %llu bytes (%u tokens)%s, router%s %s%s%s, "
           "KV plane on %s%s%s%s",
           n->daemon_id, n->cfg->model, n->engine, (unsigned long long)n->cfg->kv_blocks,
           (unsigned long long)n->geom->block_bytes, n->geom->block_tokens, extra ? extra : "",
           na > 1 ? "s" : "", na > 0 ? list : "(none static)", n->cfg->etcd ? ", etcd " : "",
           n->cfg->etcd ? n->cfg->etcd : "",
           strcmp(n->kv_dev, "*") == 0 ? "every interface (kv-listen *)" : n->kv_addr,
           strcmp(n->kv_dev, "*") == 0 ? "" : " (", strcmp(n->kv_dev, "*") == 0 ? "" : n->kv_dev,
           strcmp(n->kv_dev, "*") == 0 ? "" : ")");
    /* booted (model loaded, arena registered): systemd's READY; whether a
     * router has us is the STATUS line and the router's business */
    pd_loop_notify_ready(na > 0 || n->cfg->etcd ? "up: connecting to routers" : "up: no router");
    return pd_loop_run(n->loop);
}

/* ---- admin ---------------------------------------------------------------- */

static pd_status_t node_adm_kv(pd_admin_req_t *req, cJSON *reply)
{
    node_t *n = req->arg;
    cJSON_AddNumberToObject(reply, "arena_bytes",
                            (double)kvx_region_block_bytes(n->region) * kvx_region_n_blocks(n->region));
    cJSON_AddNumberToObject(reply, "block_bytes", (double)kvx_region_block_bytes(n->region));
    cJSON_AddNumberToObject(reply, "block_tokens", n->geom->block_tokens);
    cJSON_AddStringToObject(reply, "kv_dtype", node_kv_dtypes[n->geom->kv_dtype]); /* K's */
    cJSON_AddStringToObject(reply, "kv_dtype_k", node_kv_dtypes[n->geom->kv_dtype]);
    cJSON_AddStringToObject(reply, "kv_dtype_v", node_kv_dtypes[n->geom->kv_dtype_v]);
    cJSON_AddNumberToObject(reply, "blocks_total", kvx_blocks_total(n->blocks));
    /* kv-listen: where this daemon's UCX tcp listener is ("*": every interface) */
    cJSON_AddStringToObject(reply, "kv_listen", n->kv_addr);
    cJSON_AddStringToObject(reply, "kv_device", n->kv_dev);
    /* free = allocatable (free + cached blocks nobody holds); used = the rest */
    uint32_t avail = node_kv_available(n);
    cJSON_AddNumberToObject(reply, "free", avail);
    cJSON_AddNumberToObject(reply, "used", kvx_blocks_total(n->blocks) - avail);
    cJSON_AddBoolToObject(reply, "prefix_cache", n->prefix != NULL);
    if (n->prefix != NULL) {
        kvx_prefix_stats_t ps;
        kvx_prefix_stats(n->prefix, &ps);
        cJSON *c = cJSON_AddObjectToObject(reply, "cache");
        cJSON_AddNumberToObject(c, "blocks", ps.entries);
        cJSON_AddNumberToObject(c, "evictable", ps.evictable);
        cJSON_AddNumberToObject(c, "unallocated", kvx_blocks_free_count(n->blocks));
        cJSON_AddNumberToObject(c, "lookups", (double)ps.lookups);
        cJSON_AddNumberToObject(c, "query_tokens", (double)ps.query_tokens);
        cJSON_AddNumberToObject(c, "hit_tokens", (double)ps.hit_tokens);
        cJSON_AddNumberToObject(c, "hit_rate", ps.query_tokens
                                    ? (double)ps.hit_tokens / (double)ps.query_tokens : 0.0);
        cJSON_AddNumberToObject(c, "stored", (double)ps.stored);
        cJSON_AddNumberToObject(c, "evicted", (double)ps.evicted);
        cJSON_AddNumberToObject(c, "collisions", (double)ps.collisions);
        node_kve_stats_t ks;
        node_kve_stats(n->kve, &ks);
        cJSON *e = cJSON_AddObjectToObject(c, "events");
        cJSON_AddNumberToObject(e, "seen", (double)ks.events);
        cJSON_AddNumberToObject(e, "frames", (double)ks.frames);
        cJSON_AddNumberToObject(e, "names", (double)ks.names);
        cJSON_AddNumberToObject(e, "snapshots", (double)ks.snapshots);
        cJSON_AddNumberToObject(e, "snapshots_truncated", (double)ks.snapshots_truncated);
        cJSON_AddNumberToObject(e, "pending", ks.pending);
    }
    if (n->role->adm_kv)
        n->role->adm_kv(n, reply);
    return PD_OK;
}

static pd_status_t node_adm_drain(pd_admin_req_t *req, cJSON *reply)
{
    node_t *n = req->arg;
    node_start_drain(n);
    cJSON_AddBoolToObject(reply, "draining", 1);
    cJSON_AddNumberToObject(reply, "live", n->n_live);
    return PD_OK;
}

static pd_status_t node_adm_xfer(pd_admin_req_t *req, cJSON *reply)
{
    node_t *n = req->arg;
    cJSON *x = kvx_stats_json(n->kvx);
    if (x == NULL)
        return PD_ERR_NO_MEMORY;
    cJSON_AddItemToObject(reply, "xfer", x);
    return PD_OK;
}

static const char *const node_sess_names[] = { "down", "connecting", "hello_sent", "up" };

static pd_status_t node_adm_session(pd_admin_req_t *req, cJSON *reply)
{
    node_t *n = req->arg;
    /* the top-level fields: the first router (one-router deployments);
     * "routers": every link */
    const node_link_t *first = NULL;
    cJSON *arr = cJSON_AddArrayToObject(reply, "routers");
    for (uint32_t i = 0; i < NODE_ROUTERS_MAX; i++) {
        const node_link_t *l = &n->links[i];
        if (!l->in_use)
            continue;
        if (first == NULL)
            first = l;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "addr", l->addr);
        cJSON_AddStringToObject(o, "source", l->from_etcd ? "etcd" : "static");
        cJSON_AddStringToObject(o, "state", node_sess_names[proto_session_state(l->sess)]);
        cJSON_AddStringToObject(o, "router_id", proto_session_router_id(l->sess));
        cJSON_AddNumberToObject(o, "registrations", (double)proto_session_registrations(l->sess));
        cJSON_AddNumberToObject(o, "rejects", (double)proto_session_rejects(l->sess));
        cJSON_AddStringToObject(o, "last_error", proto_session_last_error(l->sess));
        uint32_t live = 0;
        for (const node_req_t *r = n->live; r != NULL; r = r->next)
            live += r->link == l;
        cJSON_AddNumberToObject(o, "live", live);
        cJSON_AddItemToArray(arr, o);
    }
    cJSON_AddNumberToObject(reply, "routers_up", node_links_up(n));
    if (n->member != NULL) {
        char err[160];
        cJSON *e = cJSON_AddObjectToObject(reply, "etcd");
        cJSON_AddStringToObject(e, "endpoint", n->cfg->etcd);
        cJSON_AddStringToObject(e, "prefix", n->cfg->etcd_prefix);
        cJSON_AddBoolToObject(e, "connected", pd_member_connected(n->member, err, sizeof(err)));
        cJSON_AddStringToObject(e, "last_error", err);
        /* entries under routers/ not used, each put counted once */
        cJSON *ig = cJSON_AddObjectToObject(e, "ignored");
        cJSON_AddNumberToObject(ig, "bad_key", (double)n->etcd_bad_key);
        cJSON_AddNumberToObject(ig, "bad_value", (double)n->etcd_bad_value);
        cJSON_AddNumberToObject(ig, "forged", (double)n->etcd_forged);
        cJSON_AddNumberToObject(ig, "over_max", (double)n->etcd_over_max);
        cJSON_AddNumberToObject(e, "routers_max", (double)n->cfg->etcd_routers_max);
    }
    if (first != NULL) {
        cJSON_AddStringToObject(reply, "state", node_sess_names[proto_session_state(first->sess)]);
        cJSON_AddStringToObject(reply, "router_id", proto_session_router_id(first->sess));
        cJSON_AddNumberToObject(reply, "registrations",
                                (double)proto_session_registrations(first->sess));
        cJSON_AddNumberToObject(reply, "rejects", (double)proto_session_rejects(first->sess));
        cJSON_AddStringToObject(reply, "last_error", proto_session_last_error(first->sess));
    } else {
        cJSON_AddStringToObject(reply, "state", "down");
    }
    cJSON_AddBoolToObject(reply, "draining", n->draining);
    if (n->role->adm_session)
        n->role->adm_session(n, reply);
    return PD_OK;
}

void node_adm_counters(const node_t *n, cJSON *reply)
{
    cJSON *c = cJSON_AddObjectToObject(reply, "counters");
    const pd_stats_table_t *t = n->role->stats;
    for (size_t i = 0; i < t->n; i++)
        if (t->descs[i].kind == PD_STAT_COUNTER)
            cJSON_AddNumberToObject(c, t->descs[i].name,
                                    (double)pd_stats_counter(n->stats, (unsigned)i));
}

void node_admin_register(node_t *n)
{
    /* the role's commands first: `help` lists them in registration order */
    pd_admin_cmd_t *h = n->cmds_head, *t = n->cmds_tail;
    h[0] = (pd_admin_cmd_t){ "kv", PD_ADMIN_USER, node_adm_kv, "kv - arena and block counts" };
    h[1] = (pd_admin_cmd_t)PD_ADMIN_CMD_END;
    t[0] = (pd_admin_cmd_t){ "xfer", PD_ADMIN_USER, node_adm_xfer, n->role->xfer_help };
    t[1] = (pd_admin_cmd_t){ "session", PD_ADMIN_USER, node_adm_session, n->role->session_help };
    t[2] = (pd_admin_cmd_t){ "drain", PD_ADMIN_ADMIN, node_adm_drain,
                             "drain - stop admitting, exit when idle" };
    t[3] = (pd_admin_cmd_t)PD_ADMIN_CMD_END;
    pd_admin_register(n->admin, h, n);
    if (n->role->cmds)
        pd_admin_register(n->admin, n->role->cmds, n);
    pd_admin_register(n->admin, t, n);
}
