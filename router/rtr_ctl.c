/* rtr_ctl.c - pd-router's control plane: the listener daemons connect to,
 * registration (HMAC both ways, compat/geometry/vocab checks, duplicate id
 * rejection), heartbeats both ways, backend states, and PEER_INFO/PEER_DOWN
 * distribution to decode daemons. Request messages and backend loss are
 * handed on through r->on_backend_msg / r->on_backend_down (the request
 * flow, rtr_flow.c). */
#include "rtr_int.h"

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "pd_log.h"
#include "pd_time.h"

static const pd_stat_desc_t be_stat_descs[] = { RTR_BE_STATS(PD_STAT_DESC) };
static const pd_stats_table_t be_stats_table = PD_STATS_TABLE("router_backend", be_stat_descs);

static const char *const be_state_names[] = { "down", "ready", "drain", "maint" };

const char *rtr_be_state_name(rtr_be_state_t s)
{
    return (unsigned)s < 4 ? be_state_names[s] : "invalid";
}

static const char *role_name(uint16_t role)
{
    switch (role) {
    case PROTO_ROLE_PREFILL: return "prefill";
    case PROTO_ROLE_DECODE:  return "decode";
    case PROTO_ROLE_ROUTER:  return "router";
    default:                 return "unknown";
    }
}

static void be_set_state(rtr_backend_t *be, rtr_be_state_t s)
{
    be->state = s;
    pd_stats_gauge_set(be->stats, RTR_BE_STAT_state, (int64_t)s);
}

pd_status_t rtr_backend_send(rtr_backend_t *be, proto_msg_t *msg)
{
    if (be == NULL || be->conn == NULL)
        return PD_ERR_PEER_GONE;
    return proto_conn_send(be->conn, msg);
}

/* ---- backend choice: r->be as the policy sees it (rules: rtr_policy.c) ---- */

_Static_assert(RTR_MAX_BACKENDS <= RTR_POLICY_MAX_BACKENDS, "the policy sees every slot");

rtr_backend_t *rtr_choose_backend(rtr_t *r, const rtr_choice_t *c)
{
    rtr_backend_view_t v[RTR_MAX_BACKENDS];
    for (size_t i = 0; i < RTR_MAX_BACKENDS; i++) {
        const rtr_backend_t *be = &r->be[i];
        v[i] = (rtr_backend_view_t){
            .up = be->used && be->conn != NULL,
            .ready = be->state == RTR_BE_READY,
            .draining = (be->hb.flags & PROTO_HB_DRAINING) != 0,
            .caps = be->caps,
            .outstanding_prefill_tokens = be->hb.outstanding_prefill_tokens,
            .free_blocks = be->hb.free_blocks,
            .running_seqs = be->hb.running_seqs,
            .assigned = be->assigned,
        };
    }
    int k = rtr_policy_choose(v, RTR_MAX_BACKENDS, c, &r->rr);
    return k < 0 ? NULL : &r->be[k];
}

rtr_backend_t *rtr_pick_backend(rtr_t *r, uint32_t cap, uint32_t needed_blocks,
                                const rtr_backend_t *exclude)
{
    rtr_choice_t c = { .what = cap == PROTO_CAP_PREFILL ? RTR_CHOOSE_PREFILL : RTR_CHOOSE_DECODE,
                       .caps = cap, .exclude = exclude != NULL ? (int)(exclude - r->be) : -1,
                       .needed_blocks = needed_blocks };
    return rtr_choose_backend(r, &c);
}

bool rtr_have_backend(rtr_t *r, uint32_t cap)
{
    rtr_choice_t c = { .what = RTR_CHOOSE_ANY, .caps = cap, .exclude = -1 };
    return rtr_choose_backend(r, &c) != NULL;
}

/* ---- registration -------------------------------------------------------- */

static void rtr_kv_gauge(rtr_t *r)
{
    if (r->kvidx == NULL)
        return;
    rtr_kvindex_stats_t st;
    rtr_kvindex_stats(r->kvidx, &st);
    pd_stats_gauge_set(r->stats, RTR_STAT_kv_index_names, st.names);
}

static void send_reject(rtr_ctlconn_t *cc, proto_conn_t *conn, pd_status_t status,
                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void send_reject(rtr_ctlconn_t *cc, proto_conn_t *conn, pd_status_t status,
                        const char *fmt, ...)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_REGISTER_REJECT;
    m.u.register_reject.status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.u.register_reject.reason, sizeof(m.u.register_reject.reason), fmt, ap);
    va_end(ap);
    pd_log(PD_LOG_WARN, RTR_COMP, NULL, "registration from %s rejected (%s): %s",
           proto_conn_peer(conn), pd_status_name(status), m.u.register_reject.reason);
    pd_stats_inc(cc->r->stats, RTR_STAT_backends_rejected);
    (void)proto_conn_send(conn, &m);
    proto_conn_close_after_flush(conn, status);
}

static void send_peer_info(rtr_backend_t *to, const rtr_backend_t *peer)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_PEER_INFO;
    snprintf(m.u.peer_info.daemon_id, sizeof(m.u.peer_info.daemon_id), "%s", peer->id);
    m.u.peer_info.role = peer->role;
    m.u.peer_info.incarnation = peer->incarnation;
    m.u.peer_info.kv_addr.p = peer->kv_addr;
    m.u.peer_info.kv_addr.len = peer->kv_addr_len;
    pd_status_t s = rtr_backend_send(to, &m);
    if (s != PD_OK)
        pd_log(PD_LOG_WARN, RTR_COMP, NULL, "PEER_INFO %s -> %s not sent: %s",
               peer->id, to->id, pd_status_name(s));
}

static void send_peer_down(rtr_t *r, const rtr_backend_t *peer, pd_status_t why)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_PEER_DOWN;
    snprintf(m.u.peer_down.daemon_id, sizeof(m.u.peer_down.daemon_id), "%s", peer->id);
    m.u.peer_down.incarnation = peer->incarnation;
    m.u.peer_down.status = why < 0 ? why : PD_ERR_PEER_GONE;
    /* to every decode; a decode's loss to the prefills too (they pull
     * decodes' cached prefixes) */
    uint32_t to = PROTO_CAP_DECODE | ((peer->caps & PROTO_CAP_DECODE) ? PROTO_CAP_PREFILL : 0);
    for (size_t i = 0; i < RTR_MAX_BACKENDS; i++) {
        rtr_backend_t *be = &r->be[i];
        if (be->conn != NULL && be != peer && (be->caps & to))
            (void)rtr_backend_send(be, &m);
    }
}

static bool geom_equal(const proto_kv_geom_t *a, const proto_kv_geom_t *b)
{
    return a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->block_tokens == b->block_tokens &&
           a->kv_dtype == b->kv_dtype && a->block_bytes == b->block_bytes &&
           a->vocab_size == b->vocab_size;
}

/* A daemon id as it may appear in a log line or a reject reason: printable
 * ASCII other than space and backslash as is, every other byte as \xHH.
 * True if nothing had to be escaped. */
static bool id_safe(const char *in, char *out, size_t cap)
{
    bool clean = true;
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && o + 5 < cap; p++) {
        if (*p > 0x20 && *p < 0x7f && *p != '\\') {
            out[o++] = (char)*p;
        } else {
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", *p);
            clean = false;
        }
    }
    out[o] = '\0';
    return clean;
}

/* The connection registered or is gone: no longer pending. */
static void cc_unpend(rtr_ctlconn_t *cc)
{
    if (cc->pending) {
        cc->pending = false;
        cc->r->n_ctl_pending--;
    }
    if (cc->hs_timer != NULL) {
        event_free(cc->hs_timer);
        cc->hs_timer = NULL;
    }
}

static void on_hello(proto_conn_t *conn, const proto_msg_t *msg, void *arg)
{
    rtr_ctlconn_t *cc = arg;
    if (cc == NULL)
        return;
    rtr_t *r = cc->r;
    const proto_hello_t *h = &msg->u.hello;

    if (cc->be != NULL) {
        proto_conn_close(conn, PD_ERR_BAD_INPUT);
        return;
    }
    char sid[4 * PROTO_DAEMON_ID_MAX + 1];
    bool id_clean = id_safe(h->daemon_id, sid, sizeof(sid));
    if (r->auth) {
        const uint8_t *frame;
        size_t flen;
        if (proto_conn_frame(conn, &frame, &flen) != PD_OK ||
            proto_auth_hello_verify(&r->secret, frame, flen, cc->challenge) != PD_OK) {
            send_reject(cc, conn, PD_ERR_AUTH, "HELLO from '%s': bad MAC (wrong deployment secret?)",
                        sid);
            return;
        }
    }
    if (!id_clean) {
        /* ids go into logs, admin JSON and metrics labels */
        send_reject(cc, conn, PD_ERR_BAD_INPUT,
                    "daemon id '%s' must be printable ASCII without spaces or backslashes", sid);
        return;
    }
    if (h->role != PROTO_ROLE_PREFILL && h->role != PROTO_ROLE_DECODE) {
        send_reject(cc, conn, PD_ERR_BAD_INPUT, "role %u cannot register with a router", h->role);
        return;
    }
    uint32_t need = h->role == PROTO_ROLE_PREFILL ? PROTO_CAP_PREFILL : PROTO_CAP_DECODE;
    if ((h->caps & need) == 0) {
        send_reject(cc, conn, PD_ERR_BAD_INPUT, "role %s without its capability bit",
                    role_name(h->role));
        return;
    }
    if (r->tok_vocab_fixed && h->geom.vocab_size != eng_tok_vocab_size(r->tok)) {
        send_reject(cc, conn, PD_ERR_MISMATCH,
                    "vocab_size %u differs from the router's tokenizer (%u)",
                    h->geom.vocab_size, eng_tok_vocab_size(r->tok));
        return;
    }
    if (r->geom_fixed && h->geom.kv_dtype != r->geom.kv_dtype) {
        /* KV blocks move as stored: both sides must use one dtype (K's and V's) */
        char hd[40], rd[40];
        send_reject(cc, conn, PD_ERR_MISMATCH,
                    "kv-dtype %s (%u) differs from the deployment's kv-dtype %s (%u): "
                    "prefill and decode must store KV in the same dtype",
                    proto_kv_dtypes_str(h->geom.kv_dtype, hd, sizeof hd), h->geom.kv_dtype,
                    proto_kv_dtypes_str(r->geom.kv_dtype, rd, sizeof rd), r->geom.kv_dtype);
        return;
    }
    if (r->geom_fixed && (h->compat_hash != r->compat_hash || !geom_equal(&h->geom, &r->geom))) {
        send_reject(cc, conn, PD_ERR_MISMATCH,
                    "compat_hash %016" PRIx64 "/geometry (layers %u, kv_heads %u, head_dim %u, "
                    "block_tokens %u, dtype %u, vocab %u) differ from the deployment's "
                    "(%016" PRIx64 ": %u, %u, %u, %u, %u, %u)",
                    h->compat_hash, h->geom.n_layers, h->geom.n_kv_heads, h->geom.head_dim,
                    h->geom.block_tokens, h->geom.kv_dtype, h->geom.vocab_size,
                    r->compat_hash, r->geom.n_layers, r->geom.n_kv_heads, r->geom.head_dim,
                    r->geom.block_tokens, r->geom.kv_dtype, r->geom.vocab_size);
        return;
    }
    if (r->context_length != 0 && h->geom.context_length != 0 &&
        h->geom.context_length < r->context_length) {
        send_reject(cc, conn, PD_ERR_MISMATCH,
                    "context_length %u below the router's %u", h->geom.context_length,
                    r->context_length);
        return;
    }
    rtr_backend_t *be = NULL, *free_slot = NULL;
    for (size_t i = 0; i < RTR_MAX_BACKENDS; i++) {
        if (r->be[i].used && strcmp(r->be[i].id, h->daemon_id) == 0) {
            be = &r->be[i];
            break;
        }
        if (!r->be[i].used && free_slot == NULL)
            free_slot = &r->be[i];
    }
    if (be != NULL && be->conn != NULL) {
        send_reject(cc, conn, PD_ERR_EXISTS,
                    "duplicate daemon id '%s': already registered from %s (incarnation %016" PRIx64 ")",
                    h->daemon_id, proto_conn_peer(be->conn), be->incarnation);
        return;
    }
    if (be == NULL) {
        if (free_slot == NULL) {
            /* Reuse the slot of a down backend. */
            for (size_t i = 0; i < RTR_MAX_BACKENDS && free_slot == NULL; i++)
                if (r->be[i].conn == NULL && r->be[i].assigned == 0)
                    free_slot = &r->be[i];
            if (free_slot == NULL) {
                send_reject(cc, conn, PD_ERR_NO_SPACE, "router full (%d backends)", RTR_MAX_BACKENDS);
                return;
            }
            if (r->admin != NULL)
                pd_admin_remove_stats(r->admin, free_slot->stats);
            pd_stats_destroy(free_slot->stats);
            memset(free_slot, 0, sizeof(*free_slot));
        }
        be = free_slot;
        memset(be, 0, sizeof(*be));
        be->used = true;
        snprintf(be->id, sizeof(be->id), "%s", h->daemon_id);
        be->admin_state = RTR_BE_READY;
        const char *labels[] = { "backend", be->id, "role", role_name(h->role), NULL };
        if (pd_stats_create(&be_stats_table, labels, &be->stats) == PD_OK && r->admin != NULL)
            pd_admin_add_stats(r->admin, be->stats);
    }
    if (!r->geom_fixed) {
        r->geom_fixed = true;
        r->compat_hash = h->compat_hash;
        r->geom = h->geom;
        if (r->context_length == 0)
            r->context_length = h->geom.context_length;
        pd_log(PD_LOG_INFO, RTR_COMP, NULL,
               "deployment geometry fixed by '%s': compat %016" PRIx64 " layers %u kv_heads %u "
               "head_dim %u block_tokens %u block_bytes %" PRIu64 " vocab %u ctx %u",
               h->daemon_id, h->compat_hash, h->geom.n_layers, h->geom.n_kv_heads,
               h->geom.head_dim, h->geom.block_tokens, h->geom.block_bytes,
               h->geom.vocab_size, r->context_length);
    }
    if (be->stats == NULL) { /* it left after a drain: its series went */
        const char *labels[] = { "backend", be->id, "role", role_name(h->role), NULL };
        if (pd_stats_create(&be_stats_table, labels, &be->stats) == PD_OK) {
            pd_stats_gauge_set(be->stats, RTR_BE_STAT_assigned, (int64_t)be->assigned);
            if (r->admin != NULL)
                pd_admin_add_stats(r->admin, be->stats);
        }
    }
    /* what an earlier session of this id cached is not known to be there */
    rtr_kvindex_clear_backend(r->kvidx, (uint32_t)(be - r->be));
    if (be->admin_state == RTR_BE_DRAIN && be->incarnation != 0 &&
        be->incarnation != h->incarnation) {
        /* a drain is for the process that was leaving: a new one of that
         * name (scaled up again, restarted) starts ready; maint stays */
        pd_log(PD_LOG_INFO, RTR_COMP, NULL, "backend %s: new incarnation after a drain: ready",
               h->daemon_id);
        be->admin_state = RTR_BE_READY;
    }
    be->role = h->role;
    be->caps = h->caps;
    be->incarnation = h->incarnation;
    be->conn = conn;
    be->registered_ns = pd_now_ns();
    be->last_hb_ns = be->registered_ns;
    memset(&be->hb, 0, sizeof(be->hb));
    be->hb.free_blocks = h->geom.total_blocks;
    be->hb.total_blocks = h->geom.total_blocks;
    be->kv_addr_len = h->kv_addr.len <= sizeof(be->kv_addr) ? h->kv_addr.len : 0;
    if (be->kv_addr_len > 0)
        memcpy(be->kv_addr, h->kv_addr.p, be->kv_addr_len);
    be_set_state(be, be->admin_state);
    pd_stats_gauge_set(be->stats, RTR_BE_STAT_total_blocks, h->geom.total_blocks);
    pd_stats_gauge_set(be->stats, RTR_BE_STAT_free_blocks, h->geom.total_blocks);
    cc->be = be;

    proto_msg_t ack;
    memset(&ack, 0, sizeof(ack));
    ack.hdr.type = PROTO_MSG_REGISTER_ACK;
    snprintf(ack.u.register_ack.daemon_id, sizeof(ack.u.register_ack.daemon_id), "%s", r->cfg.id);
    ack.u.register_ack.incarnation = r->incarnation;
    ack.u.register_ack.heartbeat_interval_ns = r->cfg.heartbeat_interval_ns;
    ack.u.register_ack.lease_ns = r->cfg.lease_ns;
    memcpy(ack.u.register_ack.nonce, cc->challenge, PROTO_AUTH_NONCE_LEN);
    if (r->auth && proto_auth_ack_sign(&r->secret, &ack, h->nonce, cc->challenge) != PD_OK) {
        proto_conn_close(conn, PD_ERR_INTERNAL);
        return;
    }
    (void)proto_conn_send(conn, &ack);
    /* registered: every later frame both ways is tagged with this
     * session's keys (derived from the secret and both nonces) */
    if (r->auth) {
        proto_auth_keys_t k;
        proto_auth_session_keys(&r->secret, cc->challenge, h->nonce, true, &k);
        proto_conn_set_keys(conn, &k);
        sodium_memzero(&k, sizeof(k));
    }
    proto_conn_set_body_max(conn, 0);
    cc_unpend(cc);
    pd_stats_inc(r->stats, RTR_STAT_backends_registered);
    pd_log(PD_LOG_INFO, RTR_COMP, NULL,
           "backend '%s' registered: role %s caps 0x%x from %s incarnation %016" PRIx64
           " blocks %u state %s", be->id, role_name(be->role), be->caps, proto_conn_peer(conn),
           be->incarnation, h->geom.total_blocks, rtr_be_state_name(be->state));

    /* PEER_INFO: a new decode learns every live prefill and every other
     * decode (a live migration pulls from one); a new prefill learns every
     * live decode (it pulls a decode's cached prefix); a new daemon is
     * announced to every live decode, a new decode to every live prefill. */
    for (size_t i = 0; i < RTR_MAX_BACKENDS; i++) {
        rtr_backend_t *o = &r->be[i];
        if (o == be || o->conn == NULL)
            continue;
        bool be_dec = (be->caps & PROTO_CAP_DECODE) != 0, o_dec = (o->caps & PROTO_CAP_DECODE) != 0;
        bool be_pre = (be->caps & PROTO_CAP_PREFILL) != 0, o_pre = (o->caps & PROTO_CAP_PREFILL) != 0;
        if ((be_dec && (o_pre || o_dec)) || (be_pre && o_dec))
            send_peer_info(be, o);
        if ((o_dec && (be_pre || be_dec)) || (o_pre && be_dec))
            send_peer_info(o, be);
    }
}

static void backend_down(rtr_t *r, rtr_backend_t *be, pd_status_t why)
{
    /* drained (pdctl scale/drain, SIGTERM) before it went: it left, it was
     * not lost */
    bool left = (be->hb.flags & PROTO_HB_DRAINING) != 0 || be->admin_state == RTR_BE_DRAIN;
    pd_log(left ? PD_LOG_INFO : PD_LOG_WARN, RTR_COMP, NULL, "backend '%s' (%s) %s: %s", be->id,
           role_name(be->role), left ? "left after a drain" : "down", pd_status_name(why));
    pd_stats_inc(r->stats, left ? RTR_STAT_backends_left : RTR_STAT_backends_lost);
    be->conn = NULL;
    be_set_state(be, RTR_BE_DOWN);
    rtr_kvindex_clear_backend(r->kvidx, (uint32_t)(be - r->be));
    rtr_kv_gauge(r);
    if (be->caps & (PROTO_CAP_PREFILL | PROTO_CAP_DECODE))
        send_peer_down(r, be, why);
    r->on_backend_down(r, be);
    if (left) {
        /* its series go with it (pd_router_backend_state{backend} would
         * read 0 = down for ever and fire PdserveBackendNotReady); a new
         * daemon of that name gets new ones at registration */
        if (r->admin != NULL)
            (void)pd_admin_remove_stats(r->admin, be->stats);
        pd_stats_destroy(be->stats);
        be->stats = NULL;
    }
}

static void on_heartbeat(proto_conn_t *conn, const proto_msg_t *msg, void *arg)
{
    rtr_ctlconn_t *cc = arg;
    if (cc->be == NULL) {
        proto_conn_close(conn, PD_ERR_AUTH);
        return;
    }
    rtr_backend_t *be = cc->be;
    be->hb = msg->u.heartbeat;
    be->last_hb_ns = pd_now_ns();
    /* SIGTERM / daemon drain / admin drain: move its streams; again at each
     * of its heartbeats for those left (no room then, or nearly done) */
    if (((be->hb.flags & PROTO_HB_DRAINING) || be->state == RTR_BE_DRAIN) &&
        (be->caps & PROTO_CAP_DECODE) && cc->r->on_backend_drain != NULL)
        (void)cc->r->on_backend_drain(cc->r, be);
    pd_stats_gauge_set(be->stats, RTR_BE_STAT_queue_depth, be->hb.queue_depth);
    pd_stats_gauge_set(be->stats, RTR_BE_STAT_running_seqs, be->hb.running_seqs);
    pd_stats_gauge_set(be->stats, RTR_BE_STAT_free_blocks, be->hb.free_blocks);
    pd_stats_gauge_set(be->stats, RTR_BE_STAT_total_blocks, be->hb.total_blocks);
}

/* KV_EVENTS: the backend's prefix cache changed. Bounded by the frame cap
 * (PROTO_MAX_KV_EVENTS names) and the index's caps. */
static void on_kv_events(proto_conn_t *conn, const proto_msg_t *msg, void *arg)
{
    rtr_ctlconn_t *cc = arg;
    if (cc->be == NULL) {
        proto_conn_close(conn, PD_ERR_AUTH);
        return;
    }
    rtr_t *r = cc->r;
    const proto_kv_events_t *e = &msg->u.kv_events;
    uint32_t b = (uint32_t)(cc->be - r->be);
    pd_stats_inc(r->stats, RTR_STAT_kv_events);
    if (r->kvidx == NULL)
        return;
    if (e->flags & PROTO_KVE_RESET)
        rtr_kvindex_clear_backend(r->kvidx, b);
    for (uint32_t i = 0; i < e->removed.n; i++)
        rtr_kvindex_remove(r->kvidx, b, proto_names_get(&e->removed, i));
    for (uint32_t i = 0; i < e->stored.n; i++)
        if (!rtr_kvindex_add(r->kvidx, b, proto_names_get(&e->stored, i)))
            pd_stats_inc(r->stats, RTR_STAT_kv_index_dropped);
    rtr_kv_gauge(r);
}

static void on_request_msg(proto_conn_t *conn, const proto_msg_t *msg, void *arg)
{
    rtr_ctlconn_t *cc = arg;
    if (cc->be == NULL) {
        pd_log(PD_LOG_WARN, RTR_COMP, NULL, "%s from unregistered %s: closing",
               proto_msg_name(msg->hdr.type), proto_conn_peer(conn));
        proto_conn_close(conn, PD_ERR_AUTH);
        return;
    }
    if (msg->hdr.type == PROTO_MSG_PREFILL_DONE) {
        /* that prompt is no longer outstanding there: do not wait for the
         * next heartbeat to say so (the KV-aware pick weighs it against
         * the cached prefix; a stale figure sends a request that shares the
         * prefix to another prefill) */
        uint64_t *o = &cc->be->hb.outstanding_prefill_tokens;
        uint32_t n = msg->u.prefill_done.n_prompt_tokens;
        *o = *o > n ? *o - n : 0;
    }
    cc->r->on_backend_msg(cc->r, cc->be, msg);
}

static void on_other(proto_conn_t *conn, const proto_msg_t *msg, void *arg)
{
    rtr_ctlconn_t *cc = arg;
    pd_log(PD_LOG_WARN, RTR_COMP, NULL, "unexpected %s from %s ('%s'): closing",
           proto_msg_name(msg->hdr.type), proto_conn_peer(conn),
           cc->be != NULL ? cc->be->id : "unregistered");
    proto_conn_close(conn, PD_ERR_BAD_TYPE);
}

static void on_close(proto_conn_t *conn, pd_status_t why, void *arg)
{
    rtr_ctlconn_t *cc = arg;
    if (cc == NULL)
        return;
    if (cc->be != NULL && cc->be->conn == conn)
        backend_down(cc->r, cc->be, why);
    cc_unpend(cc);
    if (pd_loop_defer_free(cc->r->loop, free, cc) != PD_OK)
        free(cc);
}

static void hs_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    rtr_ctlconn_t *cc = arg;
    if (cc->be == NULL && cc->conn != NULL) {
        pd_stats_inc(cc->r->stats, RTR_STAT_ctl_unauth_dropped);
        pd_log(PD_LOG_WARN, RTR_COMP, NULL, "control connection from %s: no valid HELLO "
               "within %llu s, closing", proto_conn_peer(cc->conn),
               (unsigned long long)(RTR_CTL_HANDSHAKE_NS / 1000000000ull));
        proto_conn_close(cc->conn, PD_ERR_TIMED_OUT);
    }
}

/* A new control connection: bounded in number and time until it registers;
 * it gets a fresh CHALLENGE its HELLO's mac must cover. */
static void on_accept(proto_listener_t *l, proto_conn_t *conn, void *arg)
{
    (void)l;
    rtr_t *r = arg;
    if (r->n_ctl_pending >= RTR_CTL_PENDING_MAX) {
        /* counted, not logged per connection: a flood must not fill the log */
        pd_stats_inc(r->stats, RTR_STAT_ctl_unauth_dropped);
        proto_conn_set_arg(conn, NULL);
        proto_conn_close(conn, PD_ERR_OVERLOADED);
        return;
    }
    rtr_ctlconn_t *cc = calloc(1, sizeof(*cc));
    if (cc == NULL) {
        proto_conn_set_arg(conn, NULL);
        proto_conn_close(conn, PD_ERR_NO_MEMORY);
        return;
    }
    cc->r = r;
    cc->conn = conn;
    cc->hs_timer = evtimer_new(r->base, hs_timeout, cc);
    if (cc->hs_timer == NULL) {
        free(cc);
        proto_conn_set_arg(conn, NULL);
        proto_conn_close(conn, PD_ERR_NO_MEMORY);
        return;
    }
    struct timeval tv = pd_ns_to_timeval(RTR_CTL_HANDSHAKE_NS);
    event_add(cc->hs_timer, &tv);
    cc->pending = true;
    r->n_ctl_pending++;
    proto_conn_set_arg(conn, cc);

    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_CHALLENGE;
    proto_auth_nonce(m.u.challenge.nonce);
    memcpy(cc->challenge, m.u.challenge.nonce, PROTO_AUTH_NONCE_LEN);
    if (proto_conn_send(conn, &m) != PD_OK)
        proto_conn_close(conn, PD_ERR_IO);
}

static void hb_tick(evutil_socket_t fd, short what, void *arg)
{
    rtr_t *r = arg;
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_HEARTBEAT;
    m.u.heartbeat.incarnation = r->incarnation;
    m.u.heartbeat.sent_ns = pd_now_ns();
    m.u.heartbeat.flags = r->draining ? PROTO_HB_DRAINING : 0;
    m.u.heartbeat.queue_depth = r->n_reqs;
    for (size_t i = 0; i < RTR_MAX_BACKENDS; i++)
        if (r->be[i].conn != NULL)
            (void)proto_conn_send(r->be[i].conn, &m);
}

pd_status_t rtr_ctl_start(rtr_t *r)
{
    proto_conn_cbs_t cbs;
    memset(&cbs, 0, sizeof(cbs));
    cbs.on_hello = on_hello;
    cbs.on_heartbeat = on_heartbeat;
    cbs.on_prefill_done = on_request_msg;
    cbs.on_prefill_handle = on_request_msg;
    cbs.on_tokens = on_request_msg;
    cbs.on_finish = on_request_msg;
    cbs.on_error = on_request_msg;
    cbs.on_migrate_done = on_request_msg;
    cbs.on_kv_export_done = on_request_msg;
    cbs.on_embed_done = on_request_msg;
    cbs.on_kv_events = on_kv_events;
    cbs.on_other = on_other;
    cbs.on_close = on_close;
    proto_conn_opts_t opts;
    memset(&opts, 0, sizeof(opts));
    opts.idle_timeout_ns = 3 * r->cfg.heartbeat_interval_ns;
    opts.stats = &r->ctl_stats;
    opts.body_max = PROTO_HELLO_BODY_MAX; /* until registered (on_hello) */
    pd_status_t s = proto_listener_create(r->base, r->cfg.control, on_accept, &cbs, r, &opts,
                                          &r->ctl);
    if (s != PD_OK)
        return s;
    r->ctl_port = proto_listener_port(r->ctl);
    r->hb_timer = event_new(r->base, -1, EV_PERSIST, hb_tick, r);
    if (r->hb_timer == NULL)
        return PD_ERR_NO_MEMORY;
    struct timeval tv = pd_ns_to_timeval(r->cfg.heartbeat_interval_ns);
    event_add(r->hb_timer, &tv);
    return PD_OK;
}

void rtr_ctl_stop(rtr_t *r)
{
    if (r->hb_timer != NULL) {
        event_free(r->hb_timer);
        r->hb_timer = NULL;
    }
    proto_listener_destroy(r->ctl);
    r->ctl = NULL;
    for (size_t i = 0; i < RTR_MAX_BACKENDS; i++)
        if (r->be[i].conn != NULL)
            proto_conn_close(r->be[i].conn, PD_ERR_SHUTDOWN);
}

/* ---- admin ---------------------------------------------------------------- */

pd_status_t rtr_admin_backends(pd_admin_req_t *req, cJSON *reply)
{
    rtr_t *r = req->arg;
    cJSON *arr = cJSON_AddArrayToObject(reply, "backends");
    if (arr == NULL)
        return PD_ERR_NO_MEMORY;
    uint64_t now = pd_now_ns();
    for (size_t i = 0; i < RTR_MAX_BACKENDS; i++) {
        rtr_backend_t *be = &r->be[i];
        if (!be->used)
            continue;
        cJSON *o = cJSON_CreateObject();
        if (o == NULL)
            return PD_ERR_NO_MEMORY;
        cJSON_AddItemToArray(arr, o);
        char inc[24];
        snprintf(inc, sizeof(inc), "%016" PRIx64, be->incarnation);
        cJSON_AddStringToObject(o, "id", be->id);
        cJSON_AddStringToObject(o, "role", role_name(be->role));
        cJSON_AddStringToObject(o, "state", rtr_be_state_name(be->state));
        cJSON_AddStringToObject(o, "admin_state", rtr_be_state_name(be->admin_state));
        cJSON_AddStringToObject(o, "incarnation", inc);
        cJSON_AddStringToObject(o, "addr", be->conn != NULL ? proto_conn_peer(be->conn) : "");
        cJSON_AddNumberToObject(o, "caps", be->caps);
        cJSON_AddBoolToObject(o, "draining", (be->hb.flags & PROTO_HB_DRAINING) != 0);
        cJSON_AddNumberToObject(o, "queue_depth", be->hb.queue_depth);
        cJSON_AddNumberToObject(o, "running_seqs", be->hb.running_seqs);
        cJSON_AddNumberToObject(o, "free_blocks", be->hb.free_blocks);
        cJSON_AddNumberToObject(o, "total_blocks", be->hb.total_blocks);
        cJSON_AddNumberToObject(o, "leases", be->hb.leases);
        cJSON_AddNumberToObject(o, "outstanding_prefill_tokens",
                                (double)be->hb.outstanding_prefill_tokens);
        cJSON_AddNumberToObject(o, "assigned", be->assigned);
        cJSON_AddNumberToObject(o, "kv_blocks_indexed",
                                rtr_kvindex_count(r->kvidx, (uint32_t)i));
        cJSON_AddNumberToObject(o, "last_heartbeat_ms", (double)(now - be->last_hb_ns) / 1e6);
    }
    return PD_OK;
}

pd_status_t rtr_admin_planner(pd_admin_req_t *req, cJSON *reply)
{
    rtr_t *r = req->arg;
    static const struct {
        const char *name;
        unsigned id;
    } counters[] = {
        { "requests_accepted", RTR_STAT_requests_accepted },
        { "requests_completed", RTR_STAT_requests_completed },
        { "requests_failed", RTR_STAT_requests_failed },
        { "prompt_tokens", RTR_STAT_prompt_tokens },
        { "prompt_cached_tokens", RTR_STAT_prompt_cached_tokens },
        { "generation_tokens", RTR_STAT_generation_tokens },
        { "kv_pull_tail_tokens", RTR_STAT_kv_pull_tail_tokens },
    };
    static const struct {
        const char *name;
        unsigned id;
    } hists[] = {
        { "request_ttft", RTR_STAT_request_ttft },
        { "request_inter_token", RTR_STAT_request_inter_token },
        { "kv_pull_tail", RTR_STAT_kv_pull_tail },
    };
    cJSON *c = cJSON_AddObjectToObject(reply, "counters");
    cJSON *h = cJSON_AddObjectToObject(reply, "histograms");
    cJSON *cost = cJSON_AddObjectToObject(reply, "cost");
    if (c == NULL || h == NULL || cost == NULL)
        return PD_ERR_NO_MEMORY;
    for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++)
        cJSON_AddNumberToObject(c, counters[i].name,
                                (double)pd_stats_counter(r->stats, counters[i].id));
    for (size_t i = 0; i < sizeof(hists) / sizeof(hists[0]); i++) {
        pd_hist_snapshot_t snap;
        pd_stats_hist_read(r->stats, hists[i].id, &snap);
        cJSON *o = cJSON_AddObjectToObject(h, hists[i].name);
        cJSON *b = o ? cJSON_AddArrayToObject(o, "buckets") : NULL;
        if (b == NULL)
            return PD_ERR_NO_MEMORY;
        cJSON_AddNumberToObject(o, "sum_ns", (double)snap.sum_ns);
        for (unsigned k = 0; k < PD_HIST_BUCKETS; k++)
            cJSON_AddItemToArray(b, cJSON_CreateNumber((double)snap.buckets[k]));
    }
    cJSON_AddNumberToObject(c, "requests_inflight",
                            (double)pd_stats_gauge(r->stats, RTR_STAT_requests_inflight));
    cJSON_AddNumberToObject(cost, "pf_tok_ns", r->cost.pf_tok_ns);
    cJSON_AddNumberToObject(cost, "dec_tok_ns", r->cost.dec_tok_ns);
    cJSON_AddNumberToObject(cost, "pull_tok_ns", r->cost.pull_tok_ns);
    cJSON_AddNumberToObject(cost, "hop_ns", r->cost.hop_ns);
    cJSON_AddNumberToObject(cost, "move_tok_ns", r->cost.move_tok_ns);
    cJSON_AddBoolToObject(reply, "mixed", r->cfg.disagg_mode == RTR_DISAGG_NEVER);
    return PD_OK;
}

pd_status_t rtr_admin_set_backend(pd_admin_req_t *req, cJSON *reply)
{
    rtr_t *r = req->arg;
    if (req->argc != 2)
        return pd_admin_req_error(req, PD_ERR_BAD_INPUT,
                                  "usage: set-backend <id> ready|drain|maint");
    rtr_be_state_t s;
    if (strcmp(req->argv[1], "ready") == 0)
        s = RTR_BE_READY;
    else if (strcmp(req->argv[1], "drain") == 0)
        s = RTR_BE_DRAIN;
    else if (strcmp(req->argv[1], "maint") == 0)
        s = RTR_BE_MAINT;
    else
        return pd_admin_req_error(req, PD_ERR_BAD_INPUT, "state must be ready|drain|maint, got '%s'",
                                  req->argv[1]);
    for (size_t i = 0; i < RTR_MAX_BACKENDS; i++) {
        rtr_backend_t *be = &r->be[i];
        if (be->used && strcmp(be->id, req->argv[0]) == 0) {
            be->admin_state = s;
            if (be->conn != NULL)
                be_set_state(be, s);
            uint32_t moving = 0;
            if (s == RTR_BE_DRAIN && be->conn != NULL && (be->caps & PROTO_CAP_DECODE) &&
                r->on_backend_drain != NULL)
                moving = r->on_backend_drain(r, be);
            cJSON_AddNumberToObject(reply, "migrating", moving);
            pd_log(PD_LOG_INFO, RTR_COMP, NULL, "admin: backend '%s' set to %s (uid %u)", be->id,
                   rtr_be_state_name(s), (unsigned)req->uid);
            cJSON_AddStringToObject(reply, "id", be->id);
            cJSON_AddStringToObject(reply, "state", rtr_be_state_name(be->state));
            return PD_OK;
        }
    }
    return pd_admin_req_error(req, PD_ERR_NOT_FOUND, "no backend '%s'", req->argv[0]);
}
