/* kvx_win.c - exchange windows (kvx_win.h): one UCP context + worker per
 * window, a registered receive window of (slot, source) cells, puts of the
 * payload then a flag word per cell, flag polling with a deadline. */
#include "kvx_win.h"

#include <stdbool.h>
#include <stdio.h>

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucp/api/ucp.h>

#define KVX_WIN_MAGIC 0x5758564bu /* "KVXW" */
#define KVX_WIN_VERSION 2u        /* 2: 8 slots */
#define KVX_WIN_FLAG_BYTES 64u    /* the flag word's own cache line */

/* metadata: header, then addr_len bytes of worker address, rkey_len of rkey */
typedef struct {
    uint32_t magic;
    uint16_t version, reserved;
    uint32_t rank, size, n_slots, addr_len, rkey_len, reserved2;
    uint64_t slot_bytes[KVX_WIN_MAX_SLOTS];
    uint64_t base;
} kvx_win_meta_t;

typedef struct {
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    uint64_t base;
    bool am;                     /* no RMA lane (tcp): AM puts */
} kvx_win_peer_t;

/* An AM put's header: the flag word's content and where it lands. */
typedef struct {
    uint32_t slot, src, seq, len;
} kvx_win_am_hdr_t;
#define KVX_WIN_AM_PUT 1

struct kvx_win {
    kvx_win_config_t cfg;
    ucp_context_h ucp;
    ucp_worker_h worker;
    ucp_mem_h memh;
    uint8_t *win;                /* (slots: (size sources: cell)) */
    size_t win_len;
    size_t cell[KVX_WIN_MAX_SLOTS];     /* cell bytes: payload + flag line */
    size_t slot_off[KVX_WIN_MAX_SLOTS];
    uint8_t *send;               /* (slots: (size peers: slot_bytes)) */
    size_t send_off[KVX_WIN_MAX_SLOTS];
    /* per slot: what its posted exchange has in flight (kvx_win_post until
     * kvx_win_wait), so the slots' exchanges may overlap */
    uint64_t *flag_src;          /* (slots, size) the flag words being put */
    kvx_win_am_hdr_t *am_hdr;    /* (slots, size) the AM puts' headers */
    void **reqs;                 /* (slots, 2 * size) puts in flight */
    uint32_t nreq[KVX_WIN_MAX_SLOTS];
    uint64_t deadline[KVX_WIN_MAX_SLOTS];
    bool posted[KVX_WIN_MAX_SLOTS];
    uint32_t seq[KVX_WIN_MAX_SLOTS];
    kvx_win_peer_t *peers;       /* (size) */
    uint8_t *meta;
    size_t meta_len;
    pd_status_t failed;
};

static size_t kvx_win_round(size_t n) { return (n + 63) / 64 * 64; }

static uint8_t *kvx_win_cell(kvx_win_h *w, uint32_t slot, uint32_t src)
{
    return w->win + w->slot_off[slot] + (size_t)src * w->cell[slot];
}

static size_t kvx_win_cell_off(const kvx_win_h *w, uint32_t slot, uint32_t src)
{
    return w->slot_off[slot] + (size_t)src * w->cell[slot];
}

static _Atomic uint64_t *kvx_win_flag(kvx_win_h *w, uint32_t slot, uint32_t src)
{
    return (void *)(kvx_win_cell(w, slot, src) +
                                kvx_win_round(w->cfg.slot_bytes[slot]));
}

/* An AM put (a peer without an RMA lane): checked against this window's
 * layout before a byte lands, then the payload, then the flag word. A
 * message that does not fit is dropped (the exchange then times out). */
static ucs_status_t kvx_win_am_put_cb(void *arg, const void *header, size_t header_length,
                                      void *data, size_t length,
                                      const ucp_am_recv_param_t *param)
{
    kvx_win_h *w = arg;
    kvx_win_am_hdr_t h;
    if (header_length != sizeof(h) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
        return UCS_OK;
    memcpy(&h, header, sizeof(h));
    if (h.slot >= w->cfg.n_slots || h.src >= w->cfg.size || h.src == w->cfg.rank ||
        h.len != length || h.len > w->cfg.slot_bytes[h.slot])
        return UCS_OK;
    memcpy(kvx_win_cell(w, h.slot, h.src), data, length);
    atomic_store_explicit(kvx_win_flag(w, h.slot, h.src), (uint64_t)h.seq << 32 | h.len,
                          memory_order_release);
    return UCS_OK;
}

pd_status_t kvx_win_create(const kvx_win_config_t *cfg, kvx_win_h **win_p)
{
    pd_status_t st = PD_ERR_BAD_INPUT;
    if (!cfg || !win_p || cfg->size == 0 || cfg->size > KVX_WIN_MAX_RANKS ||
        cfg->rank >= cfg->size || cfg->n_slots == 0 || cfg->n_slots > KVX_WIN_MAX_SLOTS ||
        cfg->timeout_ns == 0)
        return st;
    for (uint32_t s = 0; s < cfg->n_slots; s++)
        if (cfg->slot_bytes[s] == 0 || cfg->slot_bytes[s] > KVX_WIN_MAX_SLOT_BYTES)
            return st;
    kvx_win_h *w = calloc(1, sizeof(*w));
    if (!w)
        return PD_ERR_NO_MEMORY;
    w->cfg = *cfg;
    w->cfg.tls = w->cfg.net_devices = NULL; /* the caller's strings are not kept */
    size_t off = 0, soff = 0;
    for (uint32_t s = 0; s < cfg->n_slots; s++) {
        w->cell[s] = kvx_win_round(cfg->slot_bytes[s]) + KVX_WIN_FLAG_BYTES;
        w->slot_off[s] = off;
        off += w->cell[s] * cfg->size;
        w->send_off[s] = soff;
        soff += kvx_win_round(cfg->slot_bytes[s]) * cfg->size;
    }
    w->win_len = off;
    st = PD_ERR_NO_MEMORY;
    w->send = aligned_alloc(64, soff);
    w->flag_src = calloc((size_t)cfg->n_slots * cfg->size, sizeof(uint64_t));
    w->am_hdr = calloc((size_t)cfg->n_slots * cfg->size, sizeof(*w->am_hdr));
    w->reqs = calloc((size_t)cfg->n_slots * 2 * cfg->size, sizeof(void *));
    w->peers = calloc(cfg->size, sizeof(*w->peers));
    if (!w->send || !w->flag_src || !w->am_hdr || !w->reqs || !w->peers)
        goto err_free;

    st = PD_ERR_TRANSPORT;
    ucp_config_t *ucfg;
    if (ucp_config_read(NULL, NULL, &ucfg) != UCS_OK)
        goto err_free;
    if ((cfg->tls && ucp_config_modify(ucfg, "TLS", cfg->tls) != UCS_OK) ||
        (cfg->net_devices && ucp_config_modify(ucfg, "NET_DEVICES", cfg->net_devices) != UCS_OK)) {
        ucp_config_release(ucfg);
        st = PD_ERR_BAD_INPUT;
        goto err_free;
    }
    ucp_params_t up = { .field_mask = UCP_PARAM_FIELD_FEATURES,
                        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM };
    ucs_status_t us = ucp_init(&up, ucfg, &w->ucp);
    ucp_config_release(ucfg);
    if (us != UCS_OK)
        goto err_free;
    ucp_worker_params_t wp = { .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                               .thread_mode = UCS_THREAD_MODE_SINGLE };
    if (ucp_worker_create(w->ucp, &wp, &w->worker) != UCS_OK)
        goto err_cleanup;
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = KVX_WIN_AM_PUT, .cb = kvx_win_am_put_cb, .arg = w,
    };
    if (ucp_worker_set_am_recv_handler(w->worker, &ap) != UCS_OK)
        goto err_worker;
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_PROT |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .length = w->win_len,
        .prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
                UCP_MEM_MAP_PROT_REMOTE_WRITE,
        .flags = UCP_MEM_MAP_ALLOCATE,
    };
    if (ucp_mem_map(w->ucp, &mp, &w->memh) != UCS_OK)
        goto err_worker;
    ucp_mem_attr_t attr = { .field_mask = UCP_MEM_ATTR_FIELD_ADDRESS };
    if (ucp_mem_query(w->memh, &attr) != UCS_OK)
        goto err_unmap;
    w->win = attr.address;
    memset(w->win, 0, w->win_len);
    ucp_address_t *addr;
    size_t addr_len;
    void *rkey;
    size_t rkey_len;
    if (ucp_worker_get_address(w->worker, &addr, &addr_len) != UCS_OK)
        goto err_unmap;
    if (ucp_rkey_pack(w->ucp, w->memh, &rkey, &rkey_len) != UCS_OK) {
        ucp_worker_release_address(w->worker, addr);
        goto err_unmap;
    }
    w->meta_len = sizeof(kvx_win_meta_t) + addr_len + rkey_len;
    w->meta = calloc(1, w->meta_len);
    if (w->meta && addr_len <= KVX_WIN_MAX_ADDR && rkey_len <= KVX_WIN_MAX_RKEY) {
        kvx_win_meta_t h = { .magic = KVX_WIN_MAGIC, .version = KVX_WIN_VERSION,
                             .rank = cfg->rank, .size = cfg->size, .n_slots = cfg->n_slots,
                             .addr_len = (uint32_t)addr_len, .rkey_len = (uint32_t)rkey_len,
                             .base = (uint64_t)(uintptr_t)w->win };
        for (uint32_t s = 0; s < cfg->n_slots; s++)
            h.slot_bytes[s] = cfg->slot_bytes[s];
        memcpy(w->meta, &h, sizeof(h));
        memcpy(w->meta + sizeof(h), addr, addr_len);
        memcpy(w->meta + sizeof(h) + addr_len, rkey, rkey_len);
    }
    ucp_rkey_buffer_release(rkey);
    ucp_worker_release_address(w->worker, addr);
    if (!w->meta || addr_len > KVX_WIN_MAX_ADDR || rkey_len > KVX_WIN_MAX_RKEY)
        goto err_meta;
    *win_p = w;
    return PD_OK;
err_meta:
    free(w->meta);
err_unmap:
    ucp_mem_unmap(w->ucp, w->memh);
err_worker:
    ucp_worker_destroy(w->worker);
err_cleanup:
    ucp_cleanup(w->ucp);
err_free:
    free(w->send);
    free(w->flag_src);
    free(w->am_hdr);
    free(w->reqs);
    free(w->peers);
    free(w);
    return st;
}

/* Wait (progressing) for a request; give up at deadline_ns. */
static ucs_status_t kvx_win_req_wait(kvx_win_h *w, void *req, uint64_t deadline_ns);

static uint64_t kvx_win_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static ucs_status_t kvx_win_req_wait(kvx_win_h *w, void *req, uint64_t deadline_ns)
{
    if (req == NULL)
        return UCS_OK;
    if (UCS_PTR_IS_ERR(req))
        return UCS_PTR_STATUS(req);
    ucs_status_t us;
    while ((us = ucp_request_check_status(req)) == UCS_INPROGRESS &&
           kvx_win_now() < deadline_ns)
        if (ucp_worker_progress(w->worker) == 0)
            sched_yield();
    ucp_request_free(req); /* released when done, if it is not yet */
    return us;
}

void kvx_win_destroy(kvx_win_h *w)
{
    if (!w)
        return;
    uint64_t dl = kvx_win_now() + 1000000000u;
    for (uint32_t s = 0; s < w->cfg.n_slots; s++) /* posted, never waited */
        for (uint32_t i = 0; i < w->nreq[s]; i++) {
            void *r = w->reqs[(size_t)s * 2 * w->cfg.size + i];
            if (r && !UCS_PTR_IS_ERR(r))
                ucp_request_free(r);
        }
    for (uint32_t p = 0; p < w->cfg.size; p++) {
        if (w->peers[p].rkey)
            ucp_rkey_destroy(w->peers[p].rkey);
        if (w->peers[p].ep) {
            ucp_request_param_t rp = { .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                       .flags = UCP_EP_CLOSE_FLAG_FORCE };
            (void)kvx_win_req_wait(w, ucp_ep_close_nbx(w->peers[p].ep, &rp), dl);
        }
    }
    free(w->meta);
    ucp_mem_unmap(w->ucp, w->memh);
    ucp_worker_destroy(w->worker);
    ucp_cleanup(w->ucp);
    free(w->send);
    free(w->flag_src);
    free(w->am_hdr);
    free(w->reqs);
    free(w->peers);
    free(w);
}

void kvx_win_meta(const kvx_win_h *w, const void **meta_p, size_t *len_p)
{
    *meta_p = w->meta;
    *len_p = w->meta_len;
}

/* Whether this endpoint puts one-sidedly in hardware or shared memory: an
 * rma_bw / rma lane on a transport other than tcp (ucp_ep_print_info's lane
 * table, as kvx_ep_has_rma_lane; UCX 1.13 has no query). Over tcp the
 * lane exists but a put is a request the target's worker answers (UCX
 * 1.13's ucp_put_handler), and that answer aborts the target with
 * "Endpoint timeout" when the putting rank has left: measured with
 * KVX_WIN_PUT=rma in tests/kvxfer/test_kvx_win. */
static bool kvx_win_ep_native_rma(ucp_ep_h ep)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (f == NULL)
        return false; /* unknown: AM puts work everywhere */
    ucp_ep_print_info(ep, f);
    fclose(f);
    bool rma = false;
    for (char *line = buf; line != NULL && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (strstr(line, "lane[") != NULL && strstr(line, "tcp/") == NULL &&
            (strstr(line, " rma_bw#") != NULL || strstr(line, " rma#") != NULL))
            rma = true;
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    return rma;
}

pd_status_t kvx_win_peer_add(kvx_win_h *w, uint32_t peer, const void *meta, size_t len)
{
    kvx_win_meta_t h;
    if (!w || !meta || peer >= w->cfg.size || peer == w->cfg.rank || w->peers[peer].ep ||
        len < sizeof(h))
        return PD_ERR_BAD_INPUT;
    memcpy(&h, meta, sizeof(h));
    if (h.magic != KVX_WIN_MAGIC)
        return PD_ERR_BAD_MAGIC;
    if (h.version != KVX_WIN_VERSION)
        return PD_ERR_BAD_VERSION;
    if (h.reserved || h.reserved2)
        return PD_ERR_RESERVED;
    if (h.addr_len == 0 || h.addr_len > KVX_WIN_MAX_ADDR || h.rkey_len == 0 ||
        h.rkey_len > KVX_WIN_MAX_RKEY || len != sizeof(h) + h.addr_len + h.rkey_len)
        return PD_ERR_BAD_INPUT;
    if (h.rank != peer || h.size != w->cfg.size || h.n_slots != w->cfg.n_slots)
        return PD_ERR_MISMATCH;
    for (uint32_t s = 0; s < KVX_WIN_MAX_SLOTS; s++)
        if (h.slot_bytes[s] != (s < w->cfg.n_slots ? w->cfg.slot_bytes[s] : 0))
            return PD_ERR_MISMATCH;
    const uint8_t *b = meta;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = (const ucp_address_t *)(b + sizeof(h)),
        .err_mode = UCP_ERR_HANDLING_MODE_NONE, /* liveness: the deadlines */
    };
    kvx_win_peer_t *p = &w->peers[peer];
    if (ucp_ep_create(w->worker, &ep, &p->ep) != UCS_OK) {
        p->ep = NULL;
        return PD_ERR_TRANSPORT;
    }
    if (ucp_ep_rkey_unpack(p->ep, b + sizeof(h) + h.addr_len, &p->rkey) != UCS_OK) {
        p->rkey = NULL;
        return PD_ERR_TRANSPORT; /* the endpoint is closed by destroy */
    }
    p->base = h.base;
    p->am = w->cfg.put_mode == KVX_WIN_PUT_AM ||
            (w->cfg.put_mode == KVX_WIN_PUT_AUTO && !kvx_win_ep_native_rma(p->ep));
    return PD_OK;
}

uint32_t kvx_win_slots(const kvx_win_h *w)
{
    return w->cfg.n_slots;
}

void *kvx_win_send_buf(kvx_win_h *w, uint32_t slot, uint32_t peer)
{
    return w->send + w->send_off[slot] + (size_t)peer * kvx_win_round(w->cfg.slot_bytes[slot]);
}

/* Free the requests of slot's post (after a failure). */
static void kvx_win_drop_reqs(kvx_win_h *w, uint32_t slot, uint32_t from)
{
    void **reqs = w->reqs + (size_t)slot * 2 * w->cfg.size;
    for (uint32_t j = from; j < w->nreq[slot]; j++)
        if (reqs[j] && !UCS_PTR_IS_ERR(reqs[j]))
            ucp_request_free(reqs[j]);
    w->nreq[slot] = 0;
}

pd_status_t kvx_win_post(kvx_win_h *w, uint32_t slot, const size_t *len)
{
    const uint32_t N = w->cfg.size, me = w->cfg.rank;
    if (slot >= w->cfg.n_slots || w->posted[slot])
        return PD_ERR_BAD_INPUT;
    if (w->failed != PD_OK)
        return w->failed;
    for (uint32_t p = 0; p < N; p++) {
        if (len[p] > w->cfg.slot_bytes[slot])
            return PD_ERR_TOO_BIG;
        if (p != me && (!w->peers[p].ep || !w->peers[p].rkey))
            return PD_ERR_BAD_INPUT;
    }
    w->deadline[slot] = kvx_win_now() + w->cfg.timeout_ns;
    const uint32_t seq = ++w->seq[slot];
    ucp_request_param_t rp = { .op_attr_mask = 0 };
    void **reqs = w->reqs + (size_t)slot * 2 * N;
    uint64_t *flag_src = w->flag_src + (size_t)slot * N;
    kvx_win_am_hdr_t *am_hdr = w->am_hdr + (size_t)slot * N;
    uint32_t nr = 0;
    /* payloads, then (after the fence) the flag words: a peer that sees
     * the flag sees the payload */
    ucp_request_param_t ap = { .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_EAGER };
    for (uint32_t p = 0; p < N; p++) {
        if (p == me)
            continue;
        if (w->peers[p].am) { /* payload and flag in one message */
            am_hdr[p] = (kvx_win_am_hdr_t){ slot, me, seq, (uint32_t)len[p] };
            reqs[nr++] = ucp_am_send_nbx(w->peers[p].ep, KVX_WIN_AM_PUT, &am_hdr[p],
                                         sizeof(am_hdr[p]), kvx_win_send_buf(w, slot, p),
                                         len[p], &ap);
            continue;
        }
        if (len[p] == 0)
            continue;
        reqs[nr++] = ucp_put_nbx(w->peers[p].ep, kvx_win_send_buf(w, slot, p), len[p],
                                 w->peers[p].base + kvx_win_cell_off(w, slot, me),
                                 w->peers[p].rkey, &rp);
    }
    w->nreq[slot] = nr;
    w->posted[slot] = true;
    /* this rank's own message stays in its send buffer (wait points
     * recv[me] there: no copy); its flag says it is posted */
    atomic_store_explicit(kvx_win_flag(w, slot, me), (uint64_t)seq << 32 | len[me],
                          memory_order_release);
    if (ucp_worker_fence(w->worker) != UCS_OK) {
        kvx_win_drop_reqs(w, slot, 0);
        w->failed = PD_ERR_TRANSPORT;
        return w->failed;
    }
    for (uint32_t p = 0; p < N; p++) {
        if (p == me || w->peers[p].am)
            continue;
        flag_src[p] = (uint64_t)seq << 32 | len[p];
        reqs[nr++] = ucp_put_nbx(w->peers[p].ep, &flag_src[p], sizeof(uint64_t),
                                 w->peers[p].base + kvx_win_cell_off(w, slot, me) +
                                     kvx_win_round(w->cfg.slot_bytes[slot]),
                                 w->peers[p].rkey, &rp);
    }
    w->nreq[slot] = nr;
    return PD_OK;
}

pd_status_t kvx_win_wait(kvx_win_h *w, uint32_t slot, const void **recv, size_t *recv_len)
{
    const uint32_t N = w->cfg.size;
    if (slot >= w->cfg.n_slots || !w->posted[slot])
        return PD_ERR_BAD_INPUT;
    w->posted[slot] = false;
    if (w->failed != PD_OK) {
        kvx_win_drop_reqs(w, slot, 0);
        return w->failed;
    }
    const uint64_t deadline = w->deadline[slot];
    const uint32_t seq = w->seq[slot];
    void **reqs = w->reqs + (size_t)slot * 2 * N;
    /* every peer's flag at this sequence */
    uint32_t have = 0, spins = 0;
    pd_status_t st = PD_ERR_TIMED_OUT;
    while (have != N) {
        have = 0;
        for (uint32_t p = 0; p < N; p++) {
            uint64_t f = atomic_load_explicit(kvx_win_flag(w, slot, p), memory_order_acquire);
            have += (uint32_t)(f >> 32) == seq;
        }
        if (have == N)
            break;
        if (ucp_worker_progress(w->worker) == 0 && ++spins > 64)
            sched_yield(); /* a shared host: let the peer run */
        if ((spins & 15) == 0 && kvx_win_now() >= deadline)
            goto err;
    }
    for (uint32_t i = 0; i < w->nreq[slot]; i++) {
        ucs_status_t us = kvx_win_req_wait(w, reqs[i], deadline);
        reqs[i] = NULL;
        if (us != UCS_OK) {
            kvx_win_drop_reqs(w, slot, i + 1);
            st = us == UCS_INPROGRESS ? PD_ERR_TIMED_OUT : PD_ERR_TRANSPORT;
            w->failed = st;
            return st;
        }
    }
    w->nreq[slot] = 0;
    for (uint32_t p = 0; p < N; p++) {
        uint64_t f = atomic_load_explicit(kvx_win_flag(w, slot, p), memory_order_acquire);
        recv_len[p] = (size_t)(f & 0xffffffffu);
        if (recv_len[p] > w->cfg.slot_bytes[slot]) {
            w->failed = PD_ERR_TOO_BIG;
            return PD_ERR_TOO_BIG;
        }
        recv[p] = p == w->cfg.rank ? kvx_win_send_buf(w, slot, p) : kvx_win_cell(w, slot, p);
    }
    return PD_OK;
err:
    kvx_win_drop_reqs(w, slot, 0);
    w->failed = st;
    return st;
}

pd_status_t kvx_win_exchange(kvx_win_h *w, uint32_t slot, const size_t *len,
                             const void **recv, size_t *recv_len)
{
    pd_status_t st = kvx_win_post(w, slot, len);
    return st != PD_OK ? st : kvx_win_wait(w, slot, recv, recv_len);
}
