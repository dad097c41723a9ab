/* kvx_export.c - the exporter side of kvxfer: registered regions, leases
 * with generation and readiness words, the peer metadata it publishes, and
 * the notifies (release, renew) importers send it. */
#include "kvx_int.h"

#include "pd_build_config.h"
#include "pd_log.h"
#include "pd_memledger.h"
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
#include <sys/mman.h>
#include <sys/statvfs.h>

/* ---- leases (exporter) --------------------------------------------------- */

static void kvx_region_pin(kvx_region_h *r, const kvx_lease_t *l, int delta)
{
    kvx_ctx_h *ctx = r->ctx;
    for (unsigned i = 0; i < l->n_runs; i++) {
        for (uint32_t b = l->runs[i].start;
             b < l->runs[i].start + l->runs[i].count; b++) {
            if (delta > 0) {
                if (r->pins[b]++ == 0)
                    ctx->blocks_pinned++;
            } else {
                assert(r->pins[b] > 0);
                if (--r->pins[b] == 0)
                    ctx->blocks_pinned--;
            }
        }
    }
}

/* Bump the generation first, then unpin: from here a pull that reads the
 * generation word sees the lease is gone before any block can be reused. */
void kvx_lease_end(kvx_lease_t *l, kvx_lease_end_t why)
{
    kvx_ctx_h *ctx = l->region->ctx;
    if (l->state != KVX_LEASE_ACTIVE)
        return;
    __atomic_store_n(&ctx->gen_words[l->slot], l->gen + 1, __ATOMIC_RELEASE);
    kvx_region_pin(l->region, l, -1);
    evtimer_del(l->timer);
    l->state = KVX_LEASE_ENDING;
    l->why = why;
    ctx->leases_active--;
    ctx->cs[why == KVX_LEASE_RELEASED ? KVX_CS_leases_released :
            why == KVX_LEASE_EXPIRED ? KVX_CS_leases_expired :
                                       KVX_CS_leases_revoked]++;
    l->next = ctx->lease_ending;
    ctx->lease_ending = l;
    kvx_kick(ctx);
}

void kvx_lease_deliver(kvx_ctx_h *ctx)
{
    while (ctx->lease_ending) {
        kvx_lease_t *l = ctx->lease_ending;
        ctx->lease_ending = l->next;
        kvx_lease_info_t info = {
            .slot = l->slot, .gen = l->gen, .importer_id = l->importer_id,
            .region_id = l->region->id, .n_blocks = l->n_blocks,
            .user_tag = l->user_tag,
        };
        kvx_lease_end_t why = l->why;
        l->state = KVX_LEASE_FREE;
        l->region = NULL;
        l->next = ctx->lease_free;
        ctx->lease_free = l;
        if (ctx->cfg.on_lease_end)
            ctx->cfg.on_lease_end(ctx->cfg.cb_arg, &info, why);
    }
}

void kvx_lease_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_lease_t *l = arg;
    if (l->state != KVX_LEASE_ACTIVE)
        return;
    uint64_t now = pd_now_ns();
    if (now < l->expiry_ns) { /* renewed meanwhile */
        struct timeval tv = pd_ns_to_timeval(l->expiry_ns - now);
        evtimer_add(l->timer, &tv);
        return;
    }
    kvx_lease_end(l, KVX_LEASE_EXPIRED);
}

static pd_status_t kvx_export_impl(kvx_region_h *r, uint64_t importer_id,
                                   const uint32_t *blocks, uint32_t n,
                                   uint64_t ttl_ns, uint64_t user_tag,
                                   void *buf, size_t cap, size_t *len_p,
                                   kvx_lease_id_t *lease_p, uint32_t *taken_p,
                                   uint32_t stream_ready, kvx_ready_t *ready_p)
{
    kvx_ctx_h *ctx = r->ctx;
    kvx_handle_t h;
    pd_status_t status;
    /* one run more than a handle holds, to know when to stop */
    kvx_run_t runs[KVX_HANDLE_MAX_RUNS + 1];
    unsigned n_runs = 0;

    if (n == 0 || ttl_ns == 0 || importer_id == 0)
        return PD_ERR_BAD_INPUT;
    if (ready_p != NULL && ctx->cfg.ready_layers < r->n_layers)
        return PD_ERR_BAD_INPUT; /* no readiness words for this region */
    if (n > KVX_HANDLE_MAX_BLOCKS) {
        if (taken_p == NULL)
            return PD_ERR_TOO_BIG;
        n = KVX_HANDLE_MAX_BLOCKS;
    }
    if (ttl_ns > ctx->cfg.max_lease_ttl_ns)
        ttl_ns = ctx->cfg.max_lease_ttl_ns;
    for (uint32_t i = 0; i < n; i++) {
        if (blocks[i] >= r->n_blocks)
            return PD_ERR_BAD_INPUT;
        if (n_runs > 0 &&
            blocks[i] == runs[n_runs - 1].start + runs[n_runs - 1].count) {
            runs[n_runs - 1].count++;
            continue;
        }
        if (n_runs == KVX_HANDLE_MAX_RUNS + 1)
            break;
        runs[n_runs].start = blocks[i];
        runs[n_runs].count = 1;
        n_runs++;
    }
    unsigned fit = kvx_handle_runs_fitting(runs, n_runs);
    if (fit < n_runs && (taken_p == NULL || fit == 0))
        return PD_ERR_TOO_BIG;
    h.n_runs = (uint16_t)fit;
    uint32_t taken = 0;
    for (unsigned i = 0; i < fit; i++) {
        h.runs[i] = runs[i];
        taken += runs[i].count;
    }
    n = taken;
    kvx_lease_t *l = ctx->lease_free;
    if (l == NULL)
        return PD_ERR_NO_SPACE;

    uint64_t now = pd_now_ns();
    h.version = KVX_HANDLE_VERSION;
    h.flags = ready_p != NULL ? KVX_HANDLE_F_STREAM : 0;
    h.exporter_id = ctx->cfg.node_id;
    h.incarnation = ctx->incarnation;
    h.importer_id = importer_id;
    h.lease_gen = ctx->gen_words[l->slot] + 1;
    h.expiry_wall_ns = pd_wall_ns() + ttl_ns;
    h.compat_hash = r->compat_hash;
    h.region_id = r->id;
    h.lease_slot = l->slot;
    h.block_bytes = (uint32_t)r->block_bytes;
    h.n_blocks = n;
    status = kvx_handle_encode(&h, ctx->cfg.secret, buf, cap, len_p);
    if (status != PD_OK)
        return status;

    ctx->lease_free = l->next;
    l->next = NULL;
    l->state = KVX_LEASE_ACTIVE;
    l->gen = h.lease_gen;
    l->importer_id = importer_id;
    l->expiry_ns = now + ttl_ns;
    l->user_tag = user_tag;
    l->region = r;
    l->n_runs = h.n_runs;
    l->n_blocks = n;
    memcpy(l->runs, h.runs, sizeof(h.runs[0]) * h.n_runs);
    memcpy(l->tag, (uint8_t *)buf + *len_p - KVX_TAG_BYTES, KVX_TAG_BYTES);
    __atomic_store_n(&ctx->gen_words[l->slot], l->gen, __ATOMIC_RELEASE);
    if (ctx->cfg.ready_layers > 0) {
        /* a plain export is complete; a streamed one starts at stream_ready
         * blocks per layer (e.g. a cached prefix) */
        kvx_ready_t rd = { ctx->gen_words + ctx->cfg.max_leases +
                               (size_t)l->slot * ctx->cfg.ready_layers,
                           ctx->cfg.ready_layers, (uint32_t)l->gen };
        uint32_t init = ready_p != NULL ? (stream_ready < n ? stream_ready : n) : n;
        for (uint32_t i = 0; i < rd.n_layers; i++)
            kvx_ready_publish(&rd, i, init);
        if (ready_p != NULL) {
            rd.n_layers = r->n_layers;
            *ready_p = rd;
        }
    }
    kvx_region_pin(r, l, +1);
    struct timeval tv = pd_ns_to_timeval(ttl_ns);
    evtimer_add(l->timer, &tv);
    ctx->leases_active++;
    ctx->cs[KVX_CS_leases_exported]++;
    if (lease_p) {
        lease_p->slot = l->slot;
        lease_p->gen = l->gen;
    }
    if (taken_p)
        *taken_p = taken;
    return PD_OK;
}

pd_status_t kvx_export(kvx_region_h *r, uint64_t importer_id,
                       const uint32_t *blocks, uint32_t n, uint64_t ttl_ns,
                       uint64_t user_tag, void *buf, size_t cap,
                       size_t *len_p, kvx_lease_id_t *lease_p)
{
    return kvx_export_impl(r, importer_id, blocks, n, ttl_ns, user_tag, buf,
                           cap, len_p, lease_p, NULL, 0, NULL);
}

pd_status_t kvx_export_stream(kvx_region_h *r, uint64_t importer_id,
                              const uint32_t *blocks, uint32_t n, uint64_t ttl_ns,
                              uint64_t user_tag, uint32_t blocks_ready, void *buf,
                              size_t cap, size_t *len_p, kvx_lease_id_t *lease_p,
                              kvx_ready_t *ready_p)
{
    if (ready_p == NULL)
        return PD_ERR_BAD_INPUT;
    return kvx_export_impl(r, importer_id, blocks, n, ttl_ns, user_tag, buf,
                           cap, len_p, lease_p, NULL, blocks_ready, ready_p);
}

pd_status_t kvx_export_part(kvx_region_h *r, uint64_t importer_id,
                            const uint32_t *blocks, uint32_t n, uint64_t ttl_ns,
                            uint64_t user_tag, void *buf, size_t cap,
                            size_t *len_p, kvx_lease_id_t *lease_p,
                            uint32_t *taken_p)
{
    return kvx_export_impl(r, importer_id, blocks, n, ttl_ns, user_tag, buf,
                           cap, len_p, lease_p, taken_p, 0, NULL);
}

pd_status_t kvx_lease_revoke(kvx_ctx_h *ctx, kvx_lease_id_t id)
{
    if (id.slot >= ctx->cfg.max_leases)
        return PD_ERR_NOT_FOUND;
    kvx_lease_t *l = &ctx->leases[id.slot];
    if (l->state != KVX_LEASE_ACTIVE || l->gen != id.gen)
        return PD_ERR_NOT_FOUND;
    kvx_lease_end(l, KVX_LEASE_REVOKED);
    return PD_OK;
}

pd_status_t kvx_lease_set_ttl(kvx_ctx_h *ctx, kvx_lease_id_t id, uint64_t ttl_ns)
{
    if (id.slot >= ctx->cfg.max_leases)
        return PD_ERR_NOT_FOUND;
    kvx_lease_t *l = &ctx->leases[id.slot];
    if (l->state != KVX_LEASE_ACTIVE || l->gen != id.gen)
        return PD_ERR_NOT_FOUND;
    if (ttl_ns > ctx->cfg.max_lease_ttl_ns)
        ttl_ns = ctx->cfg.max_lease_ttl_ns;
    l->expiry_ns = pd_now_ns() + ttl_ns;
    struct timeval tv = pd_ns_to_timeval(ttl_ns); /* sooner: re-arm */
    evtimer_add(l->timer, &tv);
    return PD_OK;
}

/* AM handler (inside ucp_worker_progress): validate, then end/renew. No UCX
 * calls and no user callbacks from here (lease_end defers them). */
ucs_status_t kvx_am_notify_cb(void *arg, const void *header,
                                     size_t header_length, void *data,
                                     size_t length,
                                     const ucp_am_recv_param_t *param)
{
    kvx_ctx_h *ctx = arg;
    const uint8_t *m = header;

    if (header_length != KVX_NOTIFY_BYTES || length != 0 ||
        kvx_get_u32(m) != KVX_NOTIFY_MAGIC || m[4] != 1 ||
        kvx_get_u16(m + 6) != 0 || kvx_get_u32(m + 28) != 0)
        goto reject;
    uint8_t type = m[5];
    uint64_t importer = kvx_get_u64(m + 8);
    uint64_t incarnation = kvx_get_u64(m + 16);
    uint32_t slot = kvx_get_u32(m + 24);
    uint64_t gen = kvx_get_u64(m + 32);
    uint64_t ttl = kvx_get_u64(m + 40);
    if (incarnation != ctx->incarnation || slot >= ctx->cfg.max_leases)
        goto reject;
    kvx_lease_t *l = &ctx->leases[slot];
    if (l->state != KVX_LEASE_ACTIVE || l->gen != gen ||
        l->importer_id != importer ||
        crypto_verify_16(l->tag, m + 48) != 0)
        goto reject;
    if (type == KVX_NOTIFY_RELEASE) {
        kvx_lease_end(l, KVX_LEASE_RELEASED);
    } else if (type == KVX_NOTIFY_RENEW) {
        if (ttl == 0)
            goto reject;
        if (ttl > ctx->cfg.max_lease_ttl_ns)
            ttl = ctx->cfg.max_lease_ttl_ns;
        l->expiry_ns = pd_now_ns() + ttl; /* timer re-arms itself */
        ctx->cs[KVX_CS_leases_renewed]++;
    } else {
        goto reject;
    }
    return UCS_OK;
reject:
    ctx->cs[KVX_CS_notifies_rejected]++;
    return UCS_OK;
}

/* ---- AM reads (exporter side): what UCX 1.13 would emulate with its
 * software get on tcp, answered by kvx so that a reader that dies is a
 * failed send (a status in the callback), not an abort in our worker
 * (DESIGN.md "Reads without an RMA lane"). ---- */

/* Does lease l cover blocks [b0, b1] (runs are disjoint)? */
static bool kvx_lease_covers(const kvx_lease_t *l, uint64_t b0, uint64_t b1)
{
    uint64_t covered = 0;
    for (unsigned i = 0; i < l->n_runs; i++) {
        uint64_t s = l->runs[i].start, e = s + l->runs[i].count - 1;
        uint64_t lo = s > b0 ? s : b0, hi = e < b1 ? e : b1;
        if (lo <= hi)
            covered += hi - lo + 1;
    }
    return covered == b1 - b0 + 1;
}

/* What a read may return: the lease slot's generation word or readiness
 * words (no secret in them, and read after the lease ended to learn it
 * did), or KV bytes within one layer of blocks that the live lease named
 * by (slot, gen), held by this importer and proven by the handle's tag,
 * covers. Stricter than an rkey, which over tcp bounds nothing. */
static kvx_read_verdict_t kvx_read_check(kvx_ctx_h *ctx, const uint8_t *m, const uint8_t **src_p)
{
    uint64_t importer = kvx_get_u64(m + 16);
    uint64_t incarnation = kvx_get_u64(m + 24);
    uint32_t slot = kvx_get_u32(m + 32);
    uint64_t gen = kvx_get_u64(m + 40);
    uint64_t raddr = kvx_get_u64(m + 48);
    uint64_t len = kvx_get_u64(m + 56);
    if (incarnation != ctx->incarnation)
        return KVX_READ_STALE; /* a handle of our previous life */
    if (slot >= ctx->cfg.max_leases || len == 0 || /* the lease bounds len */
        raddr + len < raddr)
        return KVX_READ_REFUSED;
    uint64_t gw = (uint64_t)(uintptr_t)ctx->gen_words;
    uint64_t rw = gw + ((uint64_t)ctx->cfg.max_leases +
                        (uint64_t)slot * ctx->cfg.ready_layers) * 8;
    if ((raddr == gw + (uint64_t)slot * 8 && len == 8) ||
        (ctx->cfg.ready_layers > 0 && raddr == rw && len <= (uint64_t)ctx->cfg.ready_layers * 8 &&
         len % 8 == 0)) {
        *src_p = (const uint8_t *)(uintptr_t)raddr;
        return KVX_READ_OK;
    }
    const kvx_lease_t *l = &ctx->leases[slot];
    if (l->state != KVX_LEASE_ACTIVE || l->gen != gen)
        return KVX_READ_STALE;
    if (l->importer_id != importer || crypto_verify_16(l->tag, m + 64) != 0)
        return KVX_READ_REFUSED;
    const kvx_region_h *r = l->region;
    uint64_t base = (uint64_t)(uintptr_t)r->base;
    if (raddr < base || raddr + len > base + r->len)
        return KVX_READ_REFUSED;
    uint64_t span = (uint64_t)r->n_blocks * r->layer_bytes; /* one layer */
    uint64_t off = raddr - base, last = off + len - 1;
    if (off / span != last / span || off / span >= r->n_layers ||
        !kvx_lease_covers(l, (off % span) / r->layer_bytes, (last % span) / r->layer_bytes))
        return KVX_READ_REFUSED;
    *src_p = r->base + off;
    return KVX_READ_OK;
}

/* The reply's payload as a UCX generic datatype: UCX packs it with
 * kvx_reply_pack into its send buffers (one copy, as its software get
 * does), and never sends it zero-copy. Zero-copy sends are what UCX 1.13's
 * tcp transport trips over when the reader dies mid-reply (measured with
 * kvx_importer_death_tcp: uct_iface.h:884 "comp->count > 0" in the
 * exporter, 1 run in 4 with a contiguous payload). */
static void *kvx_reply_start_pack(void *context, const void *buffer, size_t count)
{
    (void)context;
    (void)count;
    return (void *)(uintptr_t)buffer; /* the kvx_amreply_t */
}

static void *kvx_reply_start_unpack(void *context, void *buffer, size_t count)
{
    (void)context;
    (void)buffer;
    (void)count;
    return NULL; /* replies are only sent with it */
}

static size_t kvx_reply_packed_size(void *state)
{
    return ((const kvx_amreply_t *)state)->len;
}

static size_t kvx_reply_pack(void *state, size_t offset, void *dest, size_t max_length)
{
    const kvx_amreply_t *rep = state;
    size_t n = offset < rep->len ? rep->len - offset : 0;
    if (n > max_length)
        n = max_length;
    memcpy(dest, rep->src + offset, n);
    return n;
}

static ucs_status_t kvx_reply_unpack(void *state, size_t offset, const void *src, size_t length)
{
    (void)state;
    (void)offset;
    (void)src;
    (void)length;
    return UCS_ERR_UNSUPPORTED;
}

static void kvx_reply_finish(void *state)
{
    (void)state;
}

pd_status_t kvx_reply_dt_create(kvx_ctx_h *ctx)
{
    static const ucp_generic_dt_ops_t ops = {
        .start_pack = kvx_reply_start_pack,
        .start_unpack = kvx_reply_start_unpack,
        .packed_size = kvx_reply_packed_size,
        .pack = kvx_reply_pack,
        .unpack = kvx_reply_unpack,
        .finish = kvx_reply_finish,
    };
    return ucp_dt_create_generic(&ops, ctx, &ctx->reply_dt) == UCS_OK ? PD_OK
                                                                      : PD_ERR_TRANSPORT;
}

static void kvx_amreply_done(void *req, ucs_status_t us, void *user_data)
{
    kvx_amreply_t *rep = user_data;
    kvx_ctx_h *ctx = rep->ctx;
    ucp_request_free(req);
    if (us != UCS_OK)
        ctx->cs[KVX_CS_am_replies_failed]++;
    rep->next_free = ctx->amreply_free;
    ctx->amreply_free = rep;
    ctx->amreplies_live--;
}

/* KVX_AM_READ_REQ (inside progress): check, then answer on the reply
 * endpoint with the bytes (UCX picks eager or rendezvous by size; the
 * source is registered memory) or with a refusal. A request beyond
 * KVX_READ_REP_SLOTS replies in flight is dropped (the reader's deadline
 * ends its pull); so is one without a reply endpoint. */
ucs_status_t kvx_am_read_req_cb(void *arg, const void *header, size_t header_length,
                                void *data, size_t length, const ucp_am_recv_param_t *param)
{
    kvx_ctx_h *ctx = arg;
    const uint8_t *m = header;
    if (header_length != KVX_READ_REQ_BYTES || length != 0 ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == NULL ||
        kvx_get_u32(m) != KVX_READ_REQ_MAGIC || m[4] != 1 || m[5] != 0 ||
        kvx_get_u16(m + 6) != 0 || kvx_get_u32(m + 36) != 0 || ctx->amreply_free == NULL ||
        ctx->destroying) {
        ctx->cs[KVX_CS_am_reads_refused]++;
        return UCS_OK;
    }
    const uint8_t *src = NULL;
    kvx_read_verdict_t v = kvx_read_check(ctx, m, &src);
    uint64_t len = v == KVX_READ_OK ? kvx_get_u64(m + 56) : 0;
    kvx_amreply_t *rep = ctx->amreply_free;
    ctx->amreply_free = rep->next_free;
    ctx->amreplies_live++;
    kvx_put_u32(rep->hdr, KVX_READ_REP_MAGIC);
    kvx_put_u32(rep->hdr + 4, (uint32_t)v);
    memcpy(rep->hdr + 8, m + 8, 8); /* the read's id, echoed */
    ctx->cs[v == KVX_READ_OK ? KVX_CS_am_reads_served : KVX_CS_am_reads_refused]++;
    rep->src = src;
    rep->len = len;
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_DATATYPE,
        .cb.send = kvx_amreply_done,
        .user_data = rep,
        .datatype = ctx->reply_dt,
    };
    /* Eager always: the bytes go as copy-sent fragments right behind the
     * header. A rendezvous reply is a request UCX 1.13 tracks on the
     * (internal) reply endpoint until the reader acknowledges it; with the
     * reader gone, worker destroy then asserted (ucp_ep.c:437 proto_reqs
     * not empty, serving-ucx-tcp's stopped-prefill test at shutdown).
     * Refusals and generation/readiness words land in the reader's
     * callback, never in a receive that could outlive its pull. */
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_AM_SEND_FLAG_EAGER;
    void *req = ucp_am_send_nbx(param->reply_ep, KVX_AM_READ_REP, rep->hdr, KVX_READ_REP_BYTES,
                                rep, 1, &rp);
    if (!UCS_PTR_IS_PTR(req)) {
        if (UCS_PTR_IS_ERR(req))
            ctx->cs[KVX_CS_am_replies_failed]++;
        rep->next_free = ctx->amreply_free;
        ctx->amreply_free = rep;
        ctx->amreplies_live--;
    }
    kvx_kick(ctx); /* progress + watchdog while the reply is out */
    return UCS_OK;
}

/* ---- regions -------------------------------------------------------------- */

pd_status_t kvx_mem_map(kvx_ctx_h *ctx, void *addr, size_t len,
                               bool allocate, ucp_mem_h *memh_p,
                               void **addr_p)
{
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_PROT |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .length = len,
        /* never REMOTE_WRITE: importers only read */
        .prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
                UCP_MEM_MAP_PROT_REMOTE_READ,
        .flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0,
    };
    if (!allocate) {
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_ADDRESS;
        mp.address = addr;
    }
    ucp_mem_h memh;
    if (ucp_mem_map(ctx->ucp, &mp, &memh) != UCS_OK)
        return PD_ERR_TRANSPORT;
    ucp_mem_attr_t attr = { .field_mask = UCP_MEM_ATTR_FIELD_ADDRESS };
    if (ucp_mem_query(memh, &attr) != UCS_OK) {
        ucp_mem_unmap(ctx->ucp, memh);
        return PD_ERR_TRANSPORT;
    }
    *memh_p = memh;
    *addr_p = attr.address;
    return PD_OK;
}

uint64_t kvx_mem_available(void)
{
    return pd_mem_available(NULL, NULL); /* MemAvailable, cgroup v1 / v2 room */
}

pd_status_t kvx_arena_check(uint64_t len, char *why, size_t why_len)
{
    uint64_t avail = kvx_mem_available();
    if (avail == UINT64_MAX)
        return PD_OK; /* nothing to check against */
    /* leave a tenth for the model, the engine and the rest of the machine */
    if (len > avail - avail / 10) {
        snprintf(why, why_len,
                 "KV arena of %.1f MiB does not fit: %.1f MiB of memory available "
                 "(MemAvailable / cgroup v1 or v2 room, 90%% usable); lower --kv-blocks",
                 (double)len / 1048576.0, (double)avail / 1048576.0);
        return PD_ERR_NO_MEMORY;
    }
    return PD_OK;
}

pd_status_t kvx_region_register(kvx_ctx_h *ctx, uint32_t region_id,
                                uint64_t block_bytes, uint32_t n_blocks,
                                uint64_t compat_hash, kvx_alloc_t alloc,
                                kvx_region_h **region_p)
{
    return kvx_region_register_layers(ctx, region_id, block_bytes, n_blocks, 1, compat_hash,
                                      alloc, region_p);
}

/* Fault every page of a fresh arena in now, not on a request. The kernel's
 * MADV_POPULATE_WRITE (Linux 5.14) maps the pages in one call: 0.2-1 s for
 * 1 GiB of SysV shm on this project's VMs (2.4 s where the host itself
 * touches the memory first), where a memset, one trap a page, takes
 * 3.5-3.9 s, and a daemon is not ready until it is done (a planner's
 * re-split waits for it; docs/BENCHMARKS.md, the planner's ninth slice).
 * Under a hypervisor that shadows page tables per mode (these VMs) a
 * populated page still traps once on its first user access, ~1.7 ms a MiB:
 * that part moves to a block's first use (BENCHMARKS.md "Drains"). A fresh
 * mapping already reads zero, so the memset fallback (older kernels, or a
 * refusal) only faults the pages in. */
static void kvx_prefault(void *base, size_t len)
{
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
    if (madvise(base, len, MADV_POPULATE_WRITE) == 0)
        return;
    memset(base, 0, len);
}

pd_status_t kvx_region_register_layers(kvx_ctx_h *ctx, uint32_t region_id,
                                       uint64_t block_bytes, uint32_t n_blocks,
                                       uint32_t n_layers, uint64_t compat_hash,
                                       kvx_alloc_t alloc, kvx_region_h **region_p)
{
    kvx_region_h *r = NULL;
    pd_status_t status;

    if (block_bytes == 0 || n_blocks == 0 || n_layers == 0 || n_layers > KVX_MAX_LAYERS ||
        block_bytes % n_layers != 0)
        return PD_ERR_BAD_INPUT;
    if (block_bytes > UINT32_MAX || n_blocks > (1u << 31))
        return PD_ERR_TOO_BIG;
    for (unsigned i = 0; i < KVX_MAX_REGIONS; i++) {
        if (ctx->regions[i].in_use && ctx->regions[i].id == region_id)
            return PD_ERR_EXISTS;
        if (!ctx->regions[i].in_use && r == NULL)
            r = &ctx->regions[i];
    }
    if (r == NULL)
        return PD_ERR_NO_SPACE;
    char why[256];
    if (kvx_arena_check((uint64_t)block_bytes * n_blocks, why, sizeof(why)) != PD_OK) {
        pd_log(PD_LOG_ERROR, "kvx", NULL, "%s", why);
        return PD_ERR_NO_MEMORY;
    }
    if (alloc == KVX_ALLOC_UCX) {
        /* UCX may back the arena with a POSIX segment in /dev/shm; one
         * larger than the tmpfs has room for would SIGBUS on first touch
         * (and a killed process leaves the file behind): map our own. */
        struct statvfs sv;
        if (statvfs("/dev/shm", &sv) == 0 &&
            (uint64_t)sv.f_bavail * sv.f_frsize < (uint64_t)block_bytes * n_blocks) {
            pd_log(PD_LOG_WARN, "kvx", NULL,
                   "KV arena (%.1f MiB) larger than the free space of /dev/shm (%.1f MiB): "
                   "allocating it with mmap instead of UCX (same-host pulls go slower)",
                   (double)block_bytes * n_blocks / 1048576.0,
                   (double)sv.f_bavail * sv.f_frsize / 1048576.0);
            alloc = KVX_ALLOC_OWN;
        }
    }
    memset(r, 0, sizeof(*r));
    r->ctx = ctx;
    r->id = region_id;
    r->block_bytes = block_bytes;
    r->n_blocks = n_blocks;
    r->n_layers = n_layers;
    r->layer_bytes = block_bytes / n_layers;
    r->compat_hash = compat_hash;
    r->alloc = alloc;
    r->len = (size_t)block_bytes * n_blocks;
    r->pins = calloc(n_blocks, sizeof(*r->pins));
    if (r->pins == NULL) {
        status = PD_ERR_NO_MEMORY;
        goto err;
    }
    void *own = NULL;
    if (alloc == KVX_ALLOC_OWN) {
        own = mmap(NULL, r->len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (own == MAP_FAILED) {
            status = PD_ERR_NO_MEMORY;
            goto err_free_pins;
        }
    }
    void *addr;
    status = kvx_mem_map(ctx, own, r->len, alloc == KVX_ALLOC_UCX, &r->memh,
                         &addr);
    if (status != PD_OK)
        goto err_munmap;
    r->base = addr;
    kvx_prefault(r->base, r->len);
    if (ucp_rkey_pack(ctx->ucp, r->memh, &r->rkey_buf, &r->rkey_len) != UCS_OK) {
        status = PD_ERR_TRANSPORT;
        goto err_unmap;
    }
    if (r->rkey_len > KVX_META_MAX_RKEY) {
        status = PD_ERR_TOO_BIG;
        goto err_release_rkey;
    }
    r->in_use = true;
    *region_p = r;
    return PD_OK;

err_release_rkey:
    ucp_rkey_buffer_release(r->rkey_buf);
err_unmap:
    ucp_mem_unmap(ctx->ucp, r->memh);
err_munmap:
    if (own)
        munmap(own, r->len);
err_free_pins:
    free(r->pins);
err:
    memset(r, 0, sizeof(*r));
    return status;
}

void kvx_region_deregister(kvx_region_h *r)
{
    if (r == NULL || !r->in_use)
        return;
    kvx_ctx_h *ctx = r->ctx;
    for (uint32_t i = 0; i < ctx->cfg.max_leases; i++)
        if (ctx->leases[i].state == KVX_LEASE_ACTIVE && ctx->leases[i].region == r)
            kvx_lease_end(&ctx->leases[i], KVX_LEASE_REVOKED);
    kvx_lease_deliver(ctx);
    ucp_rkey_buffer_release(r->rkey_buf);
    ucp_mem_unmap(ctx->ucp, r->memh);
    if (r->alloc == KVX_ALLOC_OWN)
        munmap(r->base, r->len);
    free(r->pins);
    memset(r, 0, sizeof(*r));
}

void *kvx_region_base(const kvx_region_h *r) { return r->base; }
uint64_t kvx_region_block_bytes(const kvx_region_h *r) { return r->block_bytes; }
uint32_t kvx_region_n_blocks(const kvx_region_h *r) { return r->n_blocks; }
uint32_t kvx_region_n_layers(const kvx_region_h *r) { return r->n_layers; }

unsigned kvx_region_block_pins(const kvx_region_h *r, uint32_t block)
{
    return block < r->n_blocks ? r->pins[block] : 0;
}

pd_status_t kvx_region_blocks_free(kvx_region_h *r, const uint32_t *blocks,
                                   uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (blocks[i] >= r->n_blocks || r->pins[blocks[i]] != 0)
            return blocks[i] >= r->n_blocks ? PD_ERR_BAD_INPUT : PD_ERR_BUSY;
#if PD_DEBUG_POISON
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < r->n_layers; l++)
            memset(r->base + kvx_layer_off(r->n_blocks, r->layer_bytes, l, blocks[i]),
                   KVX_POISON_BYTE, r->layer_bytes);
#endif
    return PD_OK;
}

/* ---- peer metadata -------------------------------------------------------- */

pd_status_t kvx_meta_pack(kvx_ctx_h *ctx, void *out, size_t cap, size_t *len_p)
{
    uint8_t *b = out;
    size_t need = KVX_META_HDR + ctx->addr_len + ctx->gen_rkey_len + KVX_TAG_BYTES;
    unsigned n_regions = 0;
    for (unsigned i = 0; i < KVX_MAX_REGIONS; i++) {
        if (ctx->regions[i].in_use) {
            need += KVX_META_REGION_HDR + ctx->regions[i].rkey_len;
            n_regions++;
        }
    }
    if (need > cap || need > KVX_META_MAX_BYTES)
        return PD_ERR_NO_SPACE;
    kvx_put_u32(b, KVX_META_MAGIC);
    b[4] = KVX_META_VERSION;
    b[5] = (uint8_t)n_regions;
    kvx_put_u16(b + 6, 0);
    kvx_put_u64(b + 8, ctx->cfg.node_id);
    kvx_put_u64(b + 16, ctx->incarnation);
    kvx_put_u64(b + 24, ctx->host_id);
    kvx_put_u64(b + 32, (uint64_t)(uintptr_t)ctx->gen_words);
    kvx_put_u32(b + 40, ctx->cfg.max_leases);
    kvx_put_u16(b + 44, (uint16_t)ctx->gen_rkey_len);
    kvx_put_u16(b + 46, (uint16_t)ctx->addr_len);
    kvx_put_u32(b + 48, (uint32_t)need);
    kvx_put_u32(b + 52, ctx->cfg.ready_layers);
    size_t off = KVX_META_HDR;
    memcpy(b + off, ctx->addr, ctx->addr_len);
    off += ctx->addr_len;
    memcpy(b + off, ctx->gen_rkey_buf, ctx->gen_rkey_len);
    off += ctx->gen_rkey_len;
    for (unsigned i = 0; i < KVX_MAX_REGIONS; i++) {
        const kvx_region_h *r = &ctx->regions[i];
        if (!r->in_use)
            continue;
        kvx_put_u32(b + off, r->id);
        kvx_put_u32(b + off + 4, r->n_blocks);
        kvx_put_u32(b + off + 8, (uint32_t)r->block_bytes);
        kvx_put_u64(b + off + 12, (uint64_t)(uintptr_t)r->base);
        kvx_put_u64(b + off + 20, r->compat_hash);
        kvx_put_u16(b + off + 28, (uint16_t)r->rkey_len);
        kvx_put_u16(b + off + 30, (uint16_t)r->n_layers);
        kvx_put_u32(b + off + 32, 0);
        off += KVX_META_REGION_HDR;
        memcpy(b + off, r->rkey_buf, r->rkey_len);
        off += r->rkey_len;
    }
    crypto_generichash(b + off, KVX_TAG_BYTES, b, off, ctx->cfg.secret,
                       KVX_KEY_BYTES);
    *len_p = off + KVX_TAG_BYTES;
    return PD_OK;
}

