/* kvx_import.c - the importer side of kvxfer: peers (endpoints, rkeys,
 * failure and reaping), handle import, batched pulls with deadlines and
 * layer-streaming polls, and the notifies it sends exporters. */
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
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void kvx_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvx_peer_t *p = arg;
    /* inside progress: only mark; the kick closes the endpoint */
    if (p->state == KVX_PEER_ACTIVE && p->pending_fail == PD_OK) {
        p->pending_fail = PD_ERR_PEER_GONE;
        kvx_kick(p->ctx);
    }
}

static void kvx_peer_release_rkeys(kvx_peer_t *p)
{
    kvx_ctx_h *ctx = p->ctx;
    for (unsigned i = 0; i < p->n_regions; i++) {
        if (p->regions[i].rkey) {
            ucp_rkey_destroy(p->regions[i].rkey);
            p->regions[i].rkey = NULL;
            ctx->rkeys_live--;
        }
    }
    if (p->gen_rkey) {
        ucp_rkey_destroy(p->gen_rkey);
        p->gen_rkey = NULL;
        ctx->rkeys_live--;
    }
}

void kvx_peer_clear(kvx_peer_t *p)
{
    kvx_ctx_h *ctx = p->ctx;
    uint32_t idx = p->idx;
    struct event *gt = p->grace_timer, *wt = p->warm_timer;
    evtimer_del(gt);
    evtimer_del(wt);
    kvx_peer_release_rkeys(p);
    free(p->released_gen);
    pd_stats_destroy(p->prom); /* its series end with the peer */
    memset(p, 0, sizeof(*p));
    p->ctx = ctx;
    p->idx = idx;
    p->grace_timer = gt;
    p->warm_timer = wt;
}

static void kvx_amread_fail_peer(kvx_peer_t *p);

/* Force-close the endpoint; pulls end with `why` once their gets return. */
void kvx_peer_fail_now(kvx_peer_t *p, pd_status_t why)
{
    kvx_ctx_h *ctx = p->ctx;
    if (p->state != KVX_PEER_ACTIVE)
        return;
    p->state = KVX_PEER_FAILED;
    p->fail_status = why;
    p->fail_ns = pd_now_ns();
    ctx->cs[KVX_CS_peers_failed]++;
    if (why == PD_ERR_PEER_GONE) {
        ctx->dead[ctx->dead_next].node_id = p->node_id;
        ctx->dead[ctx->dead_next].incarnation = p->incarnation;
        ctx->dead_next = (ctx->dead_next + 1) % KVX_TOMBSTONES;
    }
    for (uint32_t i = 0; i < ctx->cfg.max_pulls; i++) {
        kvx_pull_t *pl = &ctx->pulls[i];
        if (pl->state != KVX_PULL_FREE && pl->state != KVX_PULL_ZOMBIE &&
            pl->peer == p && pl->err == PD_OK)
            pl->err = why;
    }
    kvx_amread_fail_peer(p);
    ucp_request_param_t cp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
    };
    void *req = ucp_ep_close_nbx(p->ep, &cp);
    ctx->cs[KVX_CS_eps_forced_closed]++;
    if (UCS_PTR_IS_PTR(req))
        p->close_req = req;
    else {
        p->ep_open = false;
        ctx->eps_live--;
    }
    p->ep = NULL;
    struct timeval tv = pd_ns_to_timeval(ctx->cfg.close_grace_ns);
    evtimer_add(p->grace_timer, &tv);
    kvx_kick(ctx);
}

void kvx_peer_grace_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_peer_t *p = arg;
    p->grace_expired = true;
    kvx_kick(p->ctx);
}

static kvx_peer_t *kvx_peer_find(kvx_ctx_h *ctx, uint64_t node_id)
{
    for (uint32_t i = 0; i < ctx->cfg.max_peers; i++)
        if (ctx->peers[i].state == KVX_PEER_ACTIVE &&
            ctx->peers[i].node_id == node_id)
            return &ctx->peers[i];
    return NULL;
}

static bool kvx_peer_is_dead(kvx_ctx_h *ctx, uint64_t node_id, uint64_t inc)
{
    for (unsigned i = 0; i < KVX_TOMBSTONES; i++)
        if (ctx->dead[i].node_id == node_id && ctx->dead[i].incarnation == inc)
            return true;
    return false;
}

static pd_status_t kvx_rkey_unpack(kvx_peer_t *p, const uint8_t *buf,
                                   ucp_rkey_h *rkey_p)
{
    if (ucp_ep_rkey_unpack(p->ep, buf, rkey_p) != UCS_OK)
        return PD_ERR_TRANSPORT;
    p->ctx->rkeys_live++;
    return PD_OK;
}

/* Same host, shared-memory lanes: the exporter's segment is attached at
 * rkey unpack, but each page is faulted in on its first get (the cost:
 * docs/BENCHMARKS.md, kvxfer). Fault it in ahead of the first request, but
 * a slice per loop turn: a whole arena at once (256 MiB: 1.4 s on a busy
 * 2-core host) held the loop past three heartbeats, and every router
 * session of the daemon adding the peer was dropped (kvxfer/DESIGN.md
 * "Warming a peer's mapping"). MADV_POPULATE_READ maps a slice in one
 * call; where the kernel lacks it (< 5.14) each page is read.
 * ucp_rkey_ptr only succeeds when the memory is directly mapped here. */
static void kvx_warm_slice(uint8_t *ptr, uint64_t len)
{
#ifdef MADV_POPULATE_READ
    uintptr_t a = (uintptr_t)ptr & ~(uintptr_t)4095;
    if (madvise((void *)a, (size_t)((uintptr_t)ptr + len - a), MADV_POPULATE_READ) == 0)
        return;
#endif
    const volatile uint8_t *b = ptr;
    uint8_t sink = 0;
    for (uint64_t off = 0; off < len; off += 4096)
        sink ^= b[off];
    (void)sink;
}

void kvx_peer_warm_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvx_peer_t *p = arg;
    if (p->state != KVX_PEER_ACTIVE) /* failed: its rkeys go soon */
        return;
    uint64_t budget = KVX_WARM_SLICE;
    while (budget > 0 && p->warm_region < p->n_regions) {
        const kvx_rregion_t *rr = &p->regions[p->warm_region];
        uint64_t len = (uint64_t)rr->n_blocks * rr->block_bytes;
        void *ptr;
        if (p->warm_off >= len || ucp_rkey_ptr(rr->rkey, rr->base, &ptr) != UCS_OK) {
            p->warm_region++;
            p->warm_off = 0;
            continue;
        }
        uint64_t n = len - p->warm_off < budget ? len - p->warm_off : budget;
        kvx_warm_slice((uint8_t *)ptr + p->warm_off, n);
        p->warm_off += n;
        budget -= n;
        p->ctx->cs[KVX_CS_peer_bytes_warmed] += n;
    }
    if (p->warm_region < p->n_regions) { /* next turn, after the loop's I/O */
        struct timeval tv = { 0, 0 };
        evtimer_add(p->warm_timer, &tv);
    }
}

/* Whether UCX may pick shared-memory lanes (posix/sysv/cma) for a same-host
 * peer. AUTO mode gives up PEER error handling on the same host only to keep
 * those lanes (UCX 1.13 drops them in PEER mode). When UCX_TLS leaves them
 * out (e.g. UCX_TLS=tcp) the lanes are tcp anyway, and an endpoint in mode
 * NONE is worse than useless there: when the connection breaks, UCX 1.13's
 * tcp transport asserts in uct_tcp_ep_pending_purge on the exporter. */
/* Wireup: UCX connects an endpoint in a message exchange (request, reply,
 * ack) that runs on after ucp_ep_create. Over tcp, UCX 1.13 aborts the
 * *exporter* when the importer dies while the exporter's reply is still
 * queued (ucp_request.c:684 "got REP message", from
 * uct_tcp_ep_pending_purge). A flush of the new endpoint completes once the
 * exchange has come back, so kvx_peer_wired() tells a caller when this
 * peer's connection is past that window (DESIGN.md "Reads without an RMA
 * lane": what is left of it). */
static void kvx_peer_wired_cb(void *req, ucs_status_t us, void *user_data)
{
    kvx_peer_t *p = user_data;
    if (p->wire_req == req) {
        p->wire_req = NULL;
        p->wired = us == UCS_OK;
    }
    ucp_request_free(req);
}

static void kvx_peer_wire(kvx_peer_t *p)
{
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = kvx_peer_wired_cb,
        .user_data = p,
    };
    p->wired = false;
    void *req = ucp_ep_flush_nbx(p->ep, &rp);
    if (req == NULL)
        p->wired = true;
    else if (!UCS_PTR_IS_ERR(req))
        p->wire_req = req;
}

bool kvx_peer_wired(kvx_ctx_h *ctx, uint64_t node_id)
{
    kvx_peer_t *p = kvx_peer_find(ctx, node_id);
    return p != NULL && p->state == KVX_PEER_ACTIVE && p->wired;
}

static bool kvx_shm_lanes_enabled(void)
{
    const char *tls = getenv("UCX_TLS");
    if (tls == NULL || *tls == '\0' || *tls == '^')
        return true; /* default or an exclusion list: shm stays possible */
    static const char *const shm[] = { "all", "sm", "shm", "posix", "sysv", "cma",
                                       "knem", "xpmem" };
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", tls);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save))
        for (size_t i = 0; i < sizeof(shm) / sizeof(shm[0]); i++)
            if (strcmp(t, shm[i]) == 0)
                return true;
    return false;
}


pd_status_t kvx_peer_add(kvx_ctx_h *ctx, const void *meta, size_t len)
{
    const uint8_t *b = meta;
    uint8_t tag[KVX_TAG_BYTES];
    pd_status_t status;

    if (len < KVX_META_HDR + KVX_TAG_BYTES)
        return PD_ERR_TRUNCATED;
    if (len > KVX_META_MAX_BYTES)
        return PD_ERR_TOO_BIG;
    if (kvx_get_u32(b) != KVX_META_MAGIC)
        return PD_ERR_BAD_MAGIC;
    if (b[4] != KVX_META_VERSION)
        return PD_ERR_BAD_VERSION;
    if (kvx_get_u32(b + 48) != len)
        return PD_ERR_TRUNCATED;
    crypto_generichash(tag, KVX_TAG_BYTES, b, len - KVX_TAG_BYTES,
                       ctx->cfg.secret, KVX_KEY_BYTES);
    if (crypto_verify_16(tag, b + len - KVX_TAG_BYTES) != 0)
        return PD_ERR_AUTH;
    unsigned n_regions = b[5];
    uint64_t node_id = kvx_get_u64(b + 8);
    uint64_t incarnation = kvx_get_u64(b + 16);
    uint32_t n_slots = kvx_get_u32(b + 40);
    size_t gen_rkey_len = kvx_get_u16(b + 44);
    size_t addr_len = kvx_get_u16(b + 46);
    uint32_t ready_words = kvx_get_u32(b + 52);
    if (kvx_get_u16(b + 6) != 0)
        return PD_ERR_RESERVED;
    if (ready_words > KVX_MAX_LAYERS)
        return PD_ERR_BAD_INPUT;
    if (n_regions > KVX_MAX_REGIONS || n_slots == 0 ||
        n_slots > KVX_META_MAX_SLOTS || addr_len == 0 ||
        addr_len > KVX_META_MAX_ADDR || gen_rkey_len > KVX_META_MAX_RKEY ||
        node_id == 0 || node_id == ctx->cfg.node_id)
        return PD_ERR_BAD_INPUT;
    /* walk the region table once, bounds-checked, before touching UCX */
    size_t end = len - KVX_TAG_BYTES;
    size_t off = KVX_META_HDR + addr_len + gen_rkey_len;
    if (off > end)
        return PD_ERR_TRUNCATED;
    size_t roff = off;
    for (unsigned i = 0; i < n_regions; i++) {
        if (roff + KVX_META_REGION_HDR > end)
            return PD_ERR_TRUNCATED;
        size_t rk = kvx_get_u16(b + roff + 28);
        uint32_t nl = kvx_get_u16(b + roff + 30), bb = kvx_get_u32(b + roff + 8);
        if (rk == 0 || rk > KVX_META_MAX_RKEY || nl == 0 || nl > KVX_MAX_LAYERS ||
            bb % nl != 0)
            return PD_ERR_BAD_INPUT;
        if (kvx_get_u32(b + roff + 32) != 0)
            return PD_ERR_RESERVED;
        roff += KVX_META_REGION_HDR + rk;
        if (roff > end)
            return PD_ERR_TRUNCATED;
    }
    if (roff != end)
        return PD_ERR_BAD_INPUT;

    if (kvx_peer_is_dead(ctx, node_id, incarnation))
        return PD_ERR_STALE;
    kvx_peer_t *old = kvx_peer_find(ctx, node_id);
    if (old && old->incarnation == incarnation)
        return PD_ERR_EXISTS;
    kvx_peer_t *p = NULL;
    for (uint32_t i = 0; i < ctx->cfg.max_peers; i++) {
        if (ctx->peers[i].state == KVX_PEER_FREE) {
            p = &ctx->peers[i];
            if (i + 1 > ctx->peer_hwm)
                ctx->peer_hwm = i + 1;
            break;
        }
    }
    if (p == NULL)
        return PD_ERR_NO_SPACE;
    if (old) /* restarted exporter: the old incarnation is gone */
        kvx_peer_fail_now(old, PD_ERR_PEER_GONE);

    p->released_gen = calloc(n_slots, sizeof(uint64_t));
    if (p->released_gen == NULL)
        return PD_ERR_NO_MEMORY;
    p->node_id = node_id;
    p->incarnation = incarnation;
    p->host_id = kvx_get_u64(b + 24);
    p->gen_base = kvx_get_u64(b + 32);
    p->n_slots = n_slots;
    p->ready_words = ready_words;

    bool want_peer = ctx->cfg.err_mode == KVX_ERRMODE_PEER ||
                     (ctx->cfg.err_mode == KVX_ERRMODE_AUTO &&
                      (p->host_id != ctx->host_id || !kvx_shm_lanes_enabled()));
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = (const ucp_address_t *)(b + KVX_META_HDR),
        .err_mode = UCP_ERR_HANDLING_MODE_NONE,
    };
    ucs_status_t us = UCS_ERR_UNSUPPORTED;
    if (want_peer) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = kvx_ep_err_cb;
        ep.err_handler.arg = p;
        us = ucp_ep_create(ctx->worker, &ep, &p->ep);
        p->err_mode_peer = us == UCS_OK;
    }
    if (us != UCS_OK && ctx->cfg.err_mode != KVX_ERRMODE_PEER) {
        /* shm-only transports refuse PEER mode; deadlines still hold */
        ep.field_mask &= ~(uint64_t)UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        us = ucp_ep_create(ctx->worker, &ep, &p->ep);
    }
    if (us != UCS_OK) {
        status = PD_ERR_TRANSPORT;
        goto err_clear;
    }
    p->ep_open = true;
    ctx->eps_live++;
    p->am_read = ctx->cfg.read_mode == KVX_READ_AM ||
                 (ctx->cfg.read_mode == KVX_READ_AUTO && !kvx_ep_has_rma_lane(p->ep));
    p->state = KVX_PEER_ACTIVE; /* from here fail_now() can undo it */
    if (ctx->prom != NULL && ctx->cfg.stats_role != KVX_STATS_EXPORTER && p->prom == NULL)
        kvx_prom_peer_create(p);
    status = kvx_rkey_unpack(p, b + KVX_META_HDR + addr_len, &p->gen_rkey);
    if (status != PD_OK)
        goto err_close;
    roff = off;
    for (unsigned i = 0; i < n_regions; i++) {
        kvx_rregion_t *rr = &p->regions[i];
        rr->id = kvx_get_u32(b + roff);
        rr->n_blocks = kvx_get_u32(b + roff + 4);
        rr->block_bytes = kvx_get_u32(b + roff + 8);
        rr->n_layers = kvx_get_u16(b + roff + 30);
        rr->base = kvx_get_u64(b + roff + 12);
        rr->compat_hash = kvx_get_u64(b + roff + 20);
        size_t rk = kvx_get_u16(b + roff + 28);
        p->n_regions = i + 1;
        status = kvx_rkey_unpack(p, b + roff + KVX_META_REGION_HDR, &rr->rkey);
        if (status != PD_OK)
            goto err_close;
        roff += KVX_META_REGION_HDR + rk;
    }
    memset(&p->st, 0, sizeof(p->st));
    if (ctx->cfg.warm_peer_mappings) /* a slice now, the rest a slice per turn */
        kvx_peer_warm_cb(-1, 0, p);
    kvx_peer_wire(p);
    ctx->cs[KVX_CS_peers_added]++;
    kvx_progress(ctx);
    return PD_OK;

err_close:
    kvx_peer_fail_now(p, PD_ERR_SHUTDOWN); /* reaped by the kick */
    return status;
err_clear:
    kvx_peer_clear(p);
    return status;
}

pd_status_t kvx_peer_fail(kvx_ctx_h *ctx, uint64_t node_id, pd_status_t why)
{
    kvx_peer_t *p = kvx_peer_find(ctx, node_id);
    if (p == NULL)
        return PD_ERR_NOT_FOUND;
    kvx_peer_fail_now(p, why);
    return PD_OK;
}

pd_status_t kvx_peer_revive(kvx_ctx_h *ctx, uint64_t node_id, uint64_t incarnation)
{
    pd_status_t st = PD_ERR_NOT_FOUND;
    for (unsigned i = 0; i < KVX_TOMBSTONES; i++)
        if (ctx->dead[i].node_id == node_id && ctx->dead[i].incarnation == incarnation) {
            ctx->dead[i].node_id = 0;
            ctx->dead[i].incarnation = 0;
            st = PD_OK;
        }
    return st;
}

pd_status_t kvx_peer_remove(kvx_ctx_h *ctx, uint64_t node_id)
{
    return kvx_peer_fail(ctx, node_id, PD_ERR_SHUTDOWN);
}

/* ---- import ---------------------------------------------------------------- */

#define KVX_IMPORT_REJECT(r, st)                                              \
    do {                                                                      \
        reason = KVX_REJECT_##r;                                              \
        status = (st);                                                        \
        goto rejected;                                                        \
    } while (0)

pd_status_t kvx_handle_import(kvx_ctx_h *ctx, const void *buf, size_t len,
                              uint64_t expect_compat_hash, kvx_import_t *imp,
                              kvx_reject_t *reason_p)
{
    kvx_reject_t reason = KVX_REJECT_NONE;
    pd_status_t status;
    kvx_handle_t *h = &imp->h;

    status = kvx_handle_decode(buf, len, ctx->cfg.secret, h, &reason);
    if (status != PD_OK)
        goto rejected;
    if (h->importer_id != ctx->cfg.node_id)
        KVX_IMPORT_REJECT(WRONG_IMPORTER, PD_ERR_PERMISSION);
    kvx_peer_t *p = kvx_peer_find(ctx, h->exporter_id);
    if (p == NULL) {
        if (kvx_peer_is_dead(ctx, h->exporter_id, h->incarnation))
            KVX_IMPORT_REJECT(PEER_DOWN, PD_ERR_PEER_GONE);
        KVX_IMPORT_REJECT(UNKNOWN_PEER, PD_ERR_NOT_FOUND);
    }
    if (p->pending_fail != PD_OK)
        KVX_IMPORT_REJECT(PEER_DOWN, PD_ERR_PEER_GONE);
    const kvx_rregion_t *rr = NULL;
    for (unsigned i = 0; i < p->n_regions; i++)
        if (p->regions[i].id == h->region_id)
            rr = &p->regions[i];
    if (rr == NULL && h->incarnation == p->incarnation)
        KVX_IMPORT_REJECT(UNKNOWN_REGION, PD_ERR_BAD_HANDLE);
    kvx_handle_expect_t e = {
        .exporter_id = p->node_id,
        .incarnation = p->incarnation,
        .importer_id = ctx->cfg.node_id,
        .region_id = rr ? rr->id : h->region_id,
        .region_blocks = rr ? rr->n_blocks : 0,
        .block_bytes = rr ? rr->block_bytes : 0,
        .compat_hash = rr ? rr->compat_hash : 0,
        .n_lease_slots = p->n_slots,
        .released_gen = p->released_gen,
        .now_wall_ns = pd_wall_ns(),
    };
    status = kvx_handle_check(h, &e, &reason);
    if (status != PD_OK)
        goto rejected;
    if ((h->flags & KVX_HANDLE_F_STREAM) && rr != NULL && p->ready_words < rr->n_layers)
        KVX_IMPORT_REJECT(GEOMETRY, PD_ERR_MISMATCH); /* streamed, but no readiness words */
    if (expect_compat_hash != 0 && h->compat_hash != expect_compat_hash)
        KVX_IMPORT_REJECT(GEOMETRY, PD_ERR_MISMATCH);
    imp->peer_idx = p->idx;
    imp->imported_ns = pd_now_ns();
    return PD_OK;

rejected:
    ctx->rejects[reason]++;
    if (reason_p)
        *reason_p = reason;
    return status;
}

/* ---- pulls ------------------------------------------------------------------ */

/* A read ended: count it off the pull, note the first error (`why`, if
 * set, says more than the UCX status), kick. Inside progress or the loop. */
static void kvx_read_end(kvx_pull_t *pl, kvx_read_kind_t kind, ucs_status_t us,
                         pd_status_t why)
{
    kvx_ctx_h *ctx = pl->ctx;
    if (kind == KVX_READ_POLL) {
        assert(pl->poll_inflight > 0);
        pl->poll_inflight--;
    }
    assert(pl->inflight > 0);
    pl->inflight--;
    if (pl->state == KVX_PULL_ZOMBIE) {
        /* a get given up for lost came back after all: the slot can go */
        kvx_kick(ctx);
        return;
    }
    ctx->ops_in_flight--;
    if (us != UCS_OK && pl->err == PD_OK) {
        pd_status_t st = why != PD_OK ? why : kvx_ucs_status(us);
        if (why == PD_OK && pl->peer->state == KVX_PEER_FAILED)
            st = pl->peer->fail_status;
        pl->err = st == PD_ERR_CANCELED ? PD_ERR_TRANSPORT : st;
    }
    if (pl->gen_posted && pl->inflight == 0)
        pl->gen_done = true;
    kvx_kick(ctx);
}

static void kvx_get_done(void *req, ucs_status_t us, void *user_data)
{
    ucp_request_free(req);
    kvx_read_end(user_data, KVX_READ_DATA, us, PD_OK);
}

static void kvx_get_poll_done(void *req, ucs_status_t us, void *user_data)
{
    ucp_request_free(req);
    kvx_read_end(user_data, KVX_READ_POLL, us, PD_OK);
}

/* ---- AM reads: for peers without an RMA lane (DESIGN.md "Reads without an
 * RMA lane"). The exporter answers a KVX_AM_READ_REQ with a KVX_AM_READ_REP
 * carrying the bytes (always eager: DESIGN.md says why); a reply whose
 * send fails is a status in UCX's callback there, where UCX 1.13's
 * software get aborts the exporter. ---- */

/* Back to the free list once nothing refers to it any more. */
static void kvx_amread_release(kvx_amread_t *op)
{
    kvx_ctx_h *ctx = op->ctx;
    if (op->id == 0 || op->waiting || op->send_busy)
        return;
    op->id = 0;
    op->pl = NULL;
    op->peer = NULL;
    op->next_free = ctx->amread_free;
    ctx->amread_free = op;
}

/* The read is over for the pull (reply handled, or given up). */
static void kvx_amread_end(kvx_amread_t *op, ucs_status_t us, pd_status_t why)
{
    kvx_pull_t *pl = op->pl;
    op->pl = NULL;
    kvx_read_end(pl, op->kind, us, why);
    kvx_amread_release(op);
}

static void kvx_amread_sent(void *req, ucs_status_t us, void *user_data)
{
    kvx_amread_t *op = user_data;
    ucp_request_free(req);
    op->send_busy = false;
    if (us != UCS_OK && op->waiting) {
        op->waiting = false;
        kvx_amread_end(op, us, PD_OK);
        return;
    }
    kvx_amread_release(op);
}

static ucs_status_t kvx_amread_post(kvx_pull_t *pl, kvx_read_kind_t kind, void *dst,
                                    size_t len, uint64_t raddr)
{
    kvx_ctx_h *ctx = pl->ctx;
    kvx_amread_t *op = ctx->amread_free;
    if (op == NULL)
        return UCS_ERR_NO_RESOURCE; /* sized never to run out: see ctx_create */
    ctx->amread_free = op->next_free;
    op->next_free = NULL;
    op->id = (++ctx->amread_seq << 16) | op->idx;
    op->kind = kind;
    op->pl = pl;
    op->peer = pl->peer;
    op->dst = dst;
    op->len = len;
    uint8_t *m = op->req;
    memset(m, 0, KVX_READ_REQ_BYTES);
    kvx_put_u32(m, KVX_READ_REQ_MAGIC);
    m[4] = 1; /* version */
    kvx_put_u64(m + 8, op->id);
    kvx_put_u64(m + 16, ctx->cfg.node_id);
    kvx_put_u64(m + 24, pl->h.incarnation);
    kvx_put_u32(m + 32, pl->h.lease_slot);
    kvx_put_u64(m + 40, pl->h.lease_gen);
    kvx_put_u64(m + 48, raddr);
    kvx_put_u64(m + 56, len);
    memcpy(m + 64, pl->h.tag, KVX_TAG_BYTES);
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = kvx_amread_sent,
        .user_data = op,
        .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY,
    };
    op->waiting = true;
    void *req = ucp_am_send_nbx(pl->peer->ep, KVX_AM_READ_REQ, m, KVX_READ_REQ_BYTES,
                                NULL, 0, &rp);
    if (UCS_PTR_IS_ERR(req)) {
        op->waiting = false;
        kvx_amread_release(op);
        return UCS_PTR_STATUS(req);
    }
    op->send_busy = req != NULL;
    pl->peer->st.c[KVX_PS_am_reads]++;
    ctx->total.c[KVX_PS_am_reads]++;
    return UCS_INPROGRESS; /* the reply is still to come */
}

/* KVX_AM_READ_REP (inside progress): match the reply to its read, land the
 * bytes (rendezvous: received straight into dst) and end the read. A reply
 * nobody waits for any more is dropped. */
ucs_status_t kvx_am_read_rep_cb(void *arg, const void *header, size_t header_length,
                                void *data, size_t length, const ucp_am_recv_param_t *param)
{
    kvx_ctx_h *ctx = arg;
    const uint8_t *m = header;
    if (header_length != KVX_READ_REP_BYTES || kvx_get_u32(m) != KVX_READ_REP_MAGIC)
        return UCS_OK;
    uint32_t status = kvx_get_u32(m + 4);
    uint64_t id = kvx_get_u64(m + 8);
    uint32_t idx = (uint32_t)(id & 0xffff);
    if (idx >= ctx->n_amreads)
        return UCS_OK;
    kvx_amread_t *op = &ctx->amreads[idx];
    if (op->id != id || !op->waiting)
        return UCS_OK; /* late: the read was given up */
    op->waiting = false;
    if (status != KVX_READ_OK) {
        /* the exporter refused: no live lease covers it (any more) */
        kvx_amread_end(op, UCS_ERR_REJECTED,
                       status == KVX_READ_STALE ? PD_ERR_STALE : PD_ERR_PERMISSION);
        return UCS_OK;
    }
    if (length != op->len) {
        kvx_amread_end(op, UCS_ERR_MESSAGE_TRUNCATED, PD_ERR_TRANSPORT);
        return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        /* kvx exporters reply eager (kvx_am_read_req_cb); returning OK
         * drops the descriptor */
        kvx_amread_end(op, UCS_ERR_UNSUPPORTED, PD_ERR_TRANSPORT);
        return UCS_OK;
    }
    memcpy(op->dst, data, length); /* eager, reassembled by UCX */
    kvx_amread_end(op, UCS_OK, PD_OK);
    return UCS_OK;
}

/* A peer failed: its reads still waiting for a reply will not get one. */
static void kvx_amread_fail_peer(kvx_peer_t *p)
{
    kvx_ctx_h *ctx = p->ctx;
    for (uint32_t i = 0; i < ctx->n_amreads; i++) {
        kvx_amread_t *op = &ctx->amreads[i];
        if (op->id != 0 && op->waiting && op->peer == p) {
            op->waiting = false;
            kvx_amread_end(op, UCS_ERR_CANCELED, PD_OK);
        }
    }
}

/* Whether UCX reads this endpoint's peer one-sidedly: an rma_bw or rma
 * lane (shm, cma, RDMA). Without one (tcp) ucp_get_nbx is emulated in
 * software by the exporter's worker. UCX 1.13 has no query for an
 * endpoint's lanes, so this reads ucp_ep_print_info's lane table
 * ("lane[0]: 2:cma/memory.0 ... rma_bw#0"). */
bool kvx_ep_has_rma_lane(ucp_ep_h ep)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (f == NULL)
        return true; /* unknown: keep UCX's get */
    ucp_ep_print_info(ep, f);
    fclose(f);
    bool rma = false;
    for (char *line = buf; line != NULL && *line; ) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (strstr(line, "lane[") != NULL &&
            (strstr(line, " rma_bw#") != NULL || strstr(line, " rma#") != NULL))
            rma = true;
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    return rma;
}

/* One read of len bytes at the exporter's raddr into dst (memh: dst's
 * registration, or NULL): a UCX get, or a kvx AM read for a peer without
 * an RMA lane. UCS_OK: landed already; UCS_INPROGRESS: kvx_read_end
 * follows; else the error. */
static ucs_status_t kvx_read_post(kvx_pull_t *pl, kvx_read_kind_t kind, void *dst,
                                  size_t len, uint64_t raddr, ucp_rkey_h rkey,
                                  ucp_mem_h memh)
{
    if (pl->peer->am_read)
        return kvx_amread_post(pl, kind, dst, len, raddr);
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = kind == KVX_READ_POLL ? kvx_get_poll_done : kvx_get_done,
        .user_data = pl,
    };
    if (memh != NULL) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        rp.memh = memh;
    }
    void *req = ucp_get_nbx(pl->peer->ep, dst, len, raddr, rkey, &rp);
    if (UCS_PTR_IS_ERR(req))
        return UCS_PTR_STATUS(req);
    return req == NULL ? UCS_OK : UCS_INPROGRESS;
}

/* Every block of every layer posted? */
static bool kvx_pull_all_posted(const kvx_pull_t *pl)
{
    for (uint32_t l = 0; l < pl->n_layers; l++)
        if (pl->posted[l] < pl->n)
            return false;
    return true;
}

/* Post gets until every ready block of every layer is posted or the
 * in-flight budget is used. Layer by layer, in layer order; within a layer
 * blocks adjacent on both sides merge into one get, runs above max_op_bytes
 * are split (a split block is finished before anything else is posted). */
static void kvx_pull_post(kvx_pull_t *pl)
{
    kvx_ctx_h *ctx = pl->ctx;
    const uint64_t lb = pl->h.block_bytes / pl->n_layers;
    const uint64_t max_op = ctx->cfg.max_op_bytes;
    uint32_t l = pl->cur_byte_off > 0 ? pl->split_layer : 0;

    while (pl->err == PD_OK && l < pl->n_layers &&
           ctx->ops_in_flight < ctx->cfg.max_ops_in_flight) {
        uint32_t i = pl->posted[l];
        if (i >= pl->ready[l]) {
            l++;
            continue;
        }
        uint64_t rblk = pl->remote_blocks[i];
        uint64_t lblk = pl->local_blocks[i];
        uint64_t off = pl->cur_byte_off;
        if (lblk == KVX_PULL_SKIP) { /* the importer has it (off is 0 here) */
            pl->posted[l]++;
            continue;
        }
        uint64_t len;
        if (off > 0 || lb >= max_op) {
            len = lb - off < max_op ? lb - off : max_op;
            pl->cur_byte_off += len;
            pl->split_layer = l;
            if (pl->cur_byte_off == lb) {
                pl->cur_byte_off = 0;
                pl->posted[l]++;
            }
        } else {
            uint32_t k = 1;
            while (i + k < pl->ready[l] && pl->remote_blocks[i + k] == rblk + k &&
                   pl->local_blocks[i + k] == lblk + k && (uint64_t)(k + 1) * lb <= max_op)
                k++;
            len = (uint64_t)k * lb;
            pl->posted[l] += k;
        }
        uint64_t raddr = pl->rr->base + kvx_layer_off(pl->rr->n_blocks, lb, l, rblk) + off;
        uint8_t *laddr = pl->local->base +
                         kvx_layer_off(pl->local->n_blocks, lb, l, lblk) + off;
        if (raddr != pl->prev_raddr_end || (uintptr_t)laddr != pl->prev_laddr_end)
            pl->runs++;
        pl->prev_raddr_end = raddr + len;
        pl->prev_laddr_end = (uintptr_t)laddr + len;

        ucs_status_t us = kvx_read_post(pl, KVX_READ_DATA, laddr, len, raddr,
                                        pl->rr->rkey, pl->local->memh);
        pl->ops++;
        pl->bytes += len;
        if (us == UCS_INPROGRESS) {
            pl->inflight++;
            ctx->ops_in_flight++;
        } else if (us != UCS_OK) {
            pl->err = kvx_ucs_status(us);
        }
    }
    if (pl->state == KVX_PULL_POSTING && kvx_pull_all_posted(pl)) {
        pl->state = KVX_PULL_DATA_WAIT;
        pl->t_posted_ns = pd_now_ns();
    }
}

/* ---- layer streaming: readiness polls ---- */

/* Read the lease's generation and readiness words (two gets, one round
 * trip); kvx_pull_poll_read applies them when both landed. */
static void kvx_pull_poll_post(kvx_pull_t *pl)
{
    kvx_peer_t *p = pl->peer;
    struct { void *dst; size_t len; uint64_t raddr; } g[2] = {
        { &pl->poll_gen, sizeof(pl->poll_gen), p->gen_base + (uint64_t)pl->h.lease_slot * 8 },
        { pl->rd_words, (size_t)pl->n_layers * 8,
          p->gen_base + ((uint64_t)p->n_slots + (uint64_t)pl->h.lease_slot * p->ready_words) * 8 },
    };
    pl->poll_posted = true;
    pl->polls++;
    for (int i = 0; i < 2 && pl->err == PD_OK; i++) {
        ucs_status_t us = kvx_read_post(pl, KVX_READ_POLL, g[i].dst, g[i].len, g[i].raddr,
                                        p->gen_rkey, NULL);
        if (us == UCS_INPROGRESS) {
            pl->inflight++;
            pl->poll_inflight++;
            pl->ctx->ops_in_flight++;
        } else if (us != UCS_OK) {
            pl->err = kvx_ucs_status(us);
        }
    }
}

/* A poll landed: a changed generation ends the pull (STALE: the lease is
 * over, the slot may be someone else's); readiness words of another
 * generation count as nothing ready. Then poll again: at once if something
 * new became ready, else after ready_poll_ns. */
static void kvx_pull_poll_read(kvx_pull_t *pl)
{
    bool more = false, partial = false;
    pl->poll_posted = false;
    if (pl->poll_gen != pl->h.lease_gen) {
        pl->err = PD_ERR_STALE;
        return;
    }
    for (uint32_t l = 0; l < pl->n_layers; l++) {
        uint64_t w = pl->rd_words[l];
        uint32_t got = (uint32_t)(w >> 32) == (uint32_t)pl->h.lease_gen ? (uint32_t)w : 0;
        if (got > pl->n)
            got = pl->n;
        if (got > pl->ready[l]) {
            pl->ready[l] = got;
            more = true;
        }
        if (pl->ready[l] < pl->n)
            partial = true;
    }
    if (!partial) {
        pl->stream = false; /* everything is ready: no more polls */
        pl->t_ready_ns = pd_now_ns();
        return;
    }
    pl->polls_partial++;
    if (more || pl->ctx->cfg.ready_poll_ns == 0) {
        kvx_pull_poll_post(pl);
        kvx_kick(pl->ctx); /* the gets may have completed in place */
    } else {
        struct timeval tv = pd_ns_to_timeval(pl->ctx->cfg.ready_poll_ns);
        evtimer_add(pl->poll_timer, &tv);
    }
}

void kvx_pull_poll_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvx_pull_t *pl = arg;
    if (pl->state != KVX_PULL_POSTING || pl->err != PD_OK || !pl->stream || pl->poll_posted)
        return;
    kvx_pull_poll_post(pl);
    kvx_kick(pl->ctx);
}

static void kvx_pull_free(kvx_pull_t *pl)
{
    if (pl->local_blocks != pl->local_inline)
        free(pl->local_blocks);
    pl->local_blocks = NULL;
    free(pl->rd_words); /* posted, ready, remote_blocks live in it too */
    pl->remote_blocks = NULL;
    pl->posted = pl->ready = NULL;
    pl->rd_words = NULL;
    if (pl->peer)
        pl->peer->pulls_ref--;
    pl->peer = NULL;
    pl->state = KVX_PULL_FREE;
    pl->id = 0;
}

static void kvx_pull_deliver(kvx_pull_t *pl, pd_status_t status)
{
    kvx_ctx_h *ctx = pl->ctx;
    kvx_peer_t *p = pl->peer;
    uint64_t now = pd_now_ns();
    kvx_pull_result_t res = {
        .pull_id = pl->id,
        .bytes = status == PD_OK ? pl->bytes : 0,
        .runs = pl->runs,
        .ops = pl->ops,
        .latency_ns = now - pl->t_start_ns,
        .user_tag = pl->user_tag,
        .polls = pl->polls,
        .polls_partial = pl->polls_partial,
        .ready_ns = pl->t_ready_ns ? pl->t_ready_ns - pl->t_start_ns : 0,
        .posted_ns = pl->t_posted_ns ? pl->t_posted_ns - pl->t_start_ns : 0,
    };
    unsigned c;
    switch (status) {
    case PD_OK:            c = KVX_PS_pulls_ok; break;
    case PD_ERR_TIMED_OUT: c = KVX_PS_pulls_timed_out; break;
    case PD_ERR_CANCELED:  c = KVX_PS_pulls_canceled; break;
    case PD_ERR_PEER_GONE: c = KVX_PS_pulls_peer_gone; break;
    case PD_ERR_STALE:     c = KVX_PS_pulls_stale; break;
    case PD_ERR_SHUTDOWN:  c = KVX_PS_pulls_shutdown; break;
    default:               c = KVX_PS_pulls_transport; break;
    }
    kvx_pstats_t *sets[2] = { &ctx->total, &p->st };
    for (int i = 0; i < 2; i++) {
        sets[i]->c[c]++;
        sets[i]->c[KVX_PS_runs_posted] += pl->runs;
        sets[i]->c[KVX_PS_ops_posted] += pl->ops;
        sets[i]->c[KVX_PS_pulls_streamed] += pl->polls > 0;
        sets[i]->c[KVX_PS_ready_polls] += pl->polls;
        sets[i]->c[KVX_PS_ready_polls_partial] += pl->polls_partial;
        if (status == PD_OK) {
            sets[i]->c[KVX_PS_bytes_pulled] += pl->bytes;
            kvx_pstats_pull_done(sets[i], res.latency_ns, pl->bytes, now);
        }
        if (pl->inflight)
            sets[i]->c[KVX_PS_ops_abandoned] += pl->inflight;
    }
    if (status == PD_ERR_STALE)
        ctx->rejects[KVX_REJECT_STALE]++;
    if (status == PD_OK) {
        kvx_prom_pull_latency(ctx, p, res.latency_ns);
    }
    evtimer_del(pl->timer);
    evtimer_del(pl->poll_timer);
    ctx->pulls_in_flight--;
    kvx_pull_cb_t cb = pl->cb;
    void *arg = pl->cb_arg;
    pl->cb = NULL;
    if (pl->inflight) {
        /* UCX never returned these gets after the forced close (seen on
         * tcp and cma with a dead peer). Their endpoint is gone, so they
         * cannot write any more: stop counting them against the in-flight
         * budget and let the peer (rkeys) go; only this slot waits. */
        pl->state = KVX_PULL_ZOMBIE;
        ctx->ops_in_flight -= pl->inflight;
        pl->peer->pulls_ref--;
        pl->peer = NULL;
    } else {
        kvx_pull_free(pl);
    }
    cb(arg, status, &res);
}

/* Advance one pull as far as it goes; deliver when done. Loop context. */
void kvx_pull_step(kvx_pull_t *pl)
{
    switch (pl->state) {
    case KVX_PULL_FREE:
        return;
    case KVX_PULL_ZOMBIE:
        if (pl->inflight == 0)
            kvx_pull_free(pl);
        return;
    default:
        break;
    }
    if (pl->err != PD_OK) {
        if (pl->inflight == 0 || pl->peer->grace_expired)
            kvx_pull_deliver(pl, pl->err);
        return;
    }
    if (pl->stream && pl->poll_posted && pl->poll_inflight == 0)
        kvx_pull_poll_read(pl);
    if (pl->state == KVX_PULL_POSTING && pl->err == PD_OK)
        kvx_pull_post(pl);
    if (pl->err != PD_OK) {
        if (pl->inflight == 0)
            kvx_pull_deliver(pl, pl->err);
        return;
    }
    if (pl->state == KVX_PULL_DATA_WAIT && pl->inflight == 0) {
        /* every get completed = every byte landed; only now read the lease
         * generation: if it still matches, no block was reused before our
         * reads finished (vLLM #52234) */
        pl->state = KVX_PULL_GEN_WAIT;
        pl->gen_posted = true;
        ucs_status_t us = kvx_read_post(pl, KVX_READ_DATA, &pl->gen_word, sizeof(pl->gen_word),
                                        pl->peer->gen_base + (uint64_t)pl->h.lease_slot * 8,
                                        pl->peer->gen_rkey, NULL);
        if (us == UCS_OK) {
            pl->gen_done = true;
        } else if (us == UCS_INPROGRESS) {
            pl->inflight++;
            pl->ctx->ops_in_flight++;
        } else {
            kvx_pull_deliver(pl, kvx_ucs_status(us));
            return;
        }
    }
    if (pl->state == KVX_PULL_GEN_WAIT && pl->gen_done && pl->inflight == 0)
        kvx_pull_deliver(pl, pl->gen_word == pl->h.lease_gen ? PD_OK : PD_ERR_STALE);
}

void kvx_pull_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_pull_t *pl = arg;
    if (pl->state == KVX_PULL_FREE || pl->state == KVX_PULL_ZOMBIE)
        return;
    if (pl->err == PD_OK)
        pl->err = PD_ERR_TIMED_OUT;
    if (pl->inflight > 0) {
        /* a get to a stopped peer never returns on its own: force-close
         * the endpoint, which cancels every get to that peer */
        kvx_peer_fail_now(pl->peer, PD_ERR_TIMED_OUT);
        kvx_progress(pl->ctx);
    }
    kvx_kick(pl->ctx);
}

pd_status_t kvx_pull_start(kvx_ctx_h *ctx, const kvx_import_t *imp,
                           kvx_region_h *local, const uint32_t *local_blocks,
                           uint32_t n, uint64_t deadline_at_ns, uint64_t user_tag,
                           kvx_pull_cb_t cb, void *cb_arg, uint64_t *pull_id_p)
{
    const kvx_handle_t *h = &imp->h;
    if (imp->peer_idx >= ctx->cfg.max_peers || cb == NULL)
        return PD_ERR_BAD_INPUT;
    kvx_peer_t *p = &ctx->peers[imp->peer_idx];
    if (p->node_id != h->exporter_id || p->incarnation != h->incarnation ||
        p->state == KVX_PEER_FREE)
        return PD_ERR_NOT_FOUND;
    if (p->state != KVX_PEER_ACTIVE || p->pending_fail != PD_OK)
        return PD_ERR_PEER_GONE;
    if (n != h->n_blocks || local->block_bytes != h->block_bytes)
        return PD_ERR_BAD_INPUT;
    bool stream = (h->flags & KVX_HANDLE_F_STREAM) != 0;
    for (uint32_t i = 0; i < n; i++)
        if (local_blocks[i] >= local->n_blocks && local_blocks[i] != KVX_PULL_SKIP)
            return PD_ERR_BAD_INPUT;
    kvx_rregion_t *rr = NULL;
    for (unsigned i = 0; i < p->n_regions; i++)
        if (p->regions[i].id == h->region_id)
            rr = &p->regions[i];
    if (rr == NULL)
        return PD_ERR_NOT_FOUND;
    if (rr->n_layers != local->n_layers || (stream && p->ready_words < rr->n_layers))
        return PD_ERR_BAD_INPUT; /* layouts differ / no readiness words */
    uint64_t now = pd_now_ns();
    if (deadline_at_ns <= now)
        return PD_ERR_TIMED_OUT;
    kvx_pull_t *pl = NULL;
    for (uint32_t i = 0; i < ctx->cfg.max_pulls; i++) {
        if (ctx->pulls[i].state == KVX_PULL_FREE) {
            pl = &ctx->pulls[i];
            if (i + 1 > ctx->pull_hwm)
                ctx->pull_hwm = i + 1;
            break;
        }
    }
    if (pl == NULL)
        return PD_ERR_BUSY;
    const uint32_t nl = rr->n_layers;
    /* one allocation: rd_words (nl), posted (nl), ready (nl), remote_blocks (n) */
    uint64_t *mem = malloc((size_t)nl * 16 + (size_t)n * sizeof(uint32_t));
    if (mem == NULL)
        return PD_ERR_NO_MEMORY;
    if (n <= KVX_PULL_INLINE) {
        pl->local_blocks = pl->local_inline;
    } else {
        pl->local_blocks = malloc((size_t)n * sizeof(uint32_t));
        if (pl->local_blocks == NULL) {
            free(mem);
            return PD_ERR_NO_MEMORY;
        }
    }
    memcpy(pl->local_blocks, local_blocks, (size_t)n * sizeof(uint32_t));
    pl->rd_words = mem;
    pl->posted = (uint32_t *)(void *)(mem + nl);
    pl->ready = pl->posted + nl;
    pl->remote_blocks = pl->ready + nl;
    pl->n_layers = nl;
    for (uint32_t i = 0, k = 0; i < h->n_runs; i++)
        for (uint32_t j = 0; j < h->runs[i].count && k < n; j++)
            pl->remote_blocks[k++] = h->runs[i].start + j;
    for (uint32_t l = 0; l < nl; l++) {
        pl->posted[l] = 0;
        pl->ready[l] = stream ? 0 : n;
        pl->rd_words[l] = 0;
    }
    pl->split_layer = 0;
    pl->stream = stream;
    pl->poll_posted = false;
    pl->poll_inflight = 0;
    pl->poll_gen = 0;
    pl->polls = pl->polls_partial = 0;
    pl->id = (++ctx->pull_seq << 16) | pl->idx;
    pl->state = KVX_PULL_POSTING;
    pl->peer = p;
    pl->rr = rr;
    pl->local = local;
    pl->h = *h;
    pl->n = n;
    pl->cur_byte_off = 0;
    pl->prev_raddr_end = 0;
    pl->prev_laddr_end = 0;
    pl->inflight = 0;
    pl->gen_posted = pl->gen_done = false;
    pl->gen_word = 0;
    pl->err = PD_OK;
    pl->t_start_ns = now;
    pl->t_ready_ns = pl->t_posted_ns = 0;
    pl->bytes = 0;
    pl->runs = pl->ops = 0;
    pl->user_tag = user_tag;
    pl->cb = cb;
    pl->cb_arg = cb_arg;
    p->pulls_ref++;
    ctx->pulls_in_flight++;
    ctx->total.c[KVX_PS_pulls_started]++;
    p->st.c[KVX_PS_pulls_started]++;
    struct timeval tv = pd_ns_to_timeval(deadline_at_ns - now);
    evtimer_add(pl->timer, &tv);
    /* post now (fast path); completion is always delivered from the loop */
    if (stream)
        kvx_pull_poll_post(pl);
    else
        kvx_pull_post(pl);
    kvx_kick(ctx);
    if (pull_id_p)
        *pull_id_p = pl->id;
    return PD_INPROGRESS;
}

pd_status_t kvx_pull_cancel(kvx_ctx_h *ctx, uint64_t pull_id)
{
    uint32_t idx = (uint32_t)(pull_id & 0xffff);
    if (idx >= ctx->cfg.max_pulls)
        return PD_ERR_NOT_FOUND;
    kvx_pull_t *pl = &ctx->pulls[idx];
    if (pl->id != pull_id || pl->state == KVX_PULL_FREE ||
        pl->state == KVX_PULL_ZOMBIE)
        return PD_ERR_NOT_FOUND;
    if (pl->err == PD_OK)
        pl->err = PD_ERR_CANCELED;
    kvx_kick(ctx);
    return PD_OK;
}

/* ---- notify (importer -> exporter) -------------------------------------------- */

static void kvx_notify_done(void *req, ucs_status_t us, void *user_data)
{
    kvx_notify_buf_t *nb = user_data;
    ucp_request_free(req);
    nb->in_use = false;
    nb->ctx->notifies_in_flight--;
}

static pd_status_t kvx_notify_send(kvx_ctx_h *ctx, const kvx_import_t *imp,
                                   uint8_t type, uint64_t ttl_ns)
{
    const kvx_handle_t *h = &imp->h;
    if (imp->peer_idx >= ctx->cfg.max_peers)
        return PD_ERR_BAD_INPUT;
    kvx_peer_t *p = &ctx->peers[imp->peer_idx];
    if (p->state == KVX_PEER_FREE || p->node_id != h->exporter_id ||
        p->incarnation != h->incarnation)
        return PD_ERR_NOT_FOUND;
    if (p->state != KVX_PEER_ACTIVE || p->pending_fail != PD_OK)
        return PD_ERR_PEER_GONE;
    kvx_notify_buf_t *nb = NULL;
    for (unsigned i = 0; i < KVX_NOTIFY_SLOTS; i++) {
        if (!ctx->notify[i].in_use) {
            nb = &ctx->notify[i];
            break;
        }
    }
    if (nb == NULL)
        return PD_ERR_BUSY;
    uint8_t *m = nb->msg;
    memset(m, 0, KVX_NOTIFY_BYTES);
    kvx_put_u32(m, KVX_NOTIFY_MAGIC);
    m[4] = 1;
    m[5] = type;
    kvx_put_u64(m + 8, ctx->cfg.node_id);
    kvx_put_u64(m + 16, h->incarnation);
    kvx_put_u32(m + 24, h->lease_slot);
    kvx_put_u64(m + 32, h->lease_gen);
    kvx_put_u64(m + 40, ttl_ns);
    memcpy(m + 48, h->tag, KVX_TAG_BYTES);
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = kvx_notify_done,
        .user_data = nb,
        .flags = UCP_AM_SEND_FLAG_EAGER,
    };
    void *req = ucp_am_send_nbx(p->ep, KVX_AM_NOTIFY, m, KVX_NOTIFY_BYTES,
                                NULL, 0, &rp);
    if (UCS_PTR_IS_ERR(req))
        return kvx_ucs_status(UCS_PTR_STATUS(req));
    nb->in_use = req != NULL;
    nb->ctx = ctx;
    if (req != NULL)
        ctx->notifies_in_flight++;
    ctx->total.c[KVX_PS_notifies_sent]++;
    p->st.c[KVX_PS_notifies_sent]++;
    kvx_kick(ctx); /* progress + arm after posting */
    return PD_OK;
}

pd_status_t kvx_lease_release(kvx_ctx_h *ctx, const kvx_import_t *imp)
{
    pd_status_t status = kvx_notify_send(ctx, imp, KVX_NOTIFY_RELEASE, 0);
    if (imp->peer_idx < ctx->cfg.max_peers) {
        kvx_peer_t *p = &ctx->peers[imp->peer_idx];
        /* remember even if the message could not be sent: never re-import */
        if (p->state != KVX_PEER_FREE && p->node_id == imp->h.exporter_id &&
            p->incarnation == imp->h.incarnation &&
            imp->h.lease_slot < p->n_slots &&
            p->released_gen[imp->h.lease_slot] < imp->h.lease_gen)
            p->released_gen[imp->h.lease_slot] = imp->h.lease_gen;
    }
    return status;
}

pd_status_t kvx_lease_renew(kvx_ctx_h *ctx, const kvx_import_t *imp,
                            uint64_t ttl_ns)
{
    if (ttl_ns == 0)
        return PD_ERR_BAD_INPUT;
    return kvx_notify_send(ctx, imp, KVX_NOTIFY_RENEW, ttl_ns);
}


/* ---- reaping failed peers (from the kick) ---- */

void kvx_peer_reap(kvx_peer_t *p)
{
    kvx_ctx_h *ctx = p->ctx;
    if (p->pending_fail != PD_OK && p->state == KVX_PEER_ACTIVE) {
        pd_status_t why = p->pending_fail;
        kvx_peer_fail_now(p, why);
    }
    if (p->state != KVX_PEER_FAILED)
        return;
    if (p->close_req) {
        if (ucp_request_check_status(p->close_req) == UCS_INPROGRESS)
            return;
        ucp_request_free(p->close_req);
        p->close_req = NULL;
        p->ep_open = false;
        ctx->eps_live--;
    }
    if (p->pulls_ref == 0)
        kvx_peer_clear(p);
}
