/* kvx.c - kvxfer's core: the UCX context and worker on the daemon's
 * libevent loop (progress, arm, watchdog), the kick that runs everything
 * deferred out of UCX callbacks, create and destroy. Exporter side in
 * kvx_export.c, importer side in kvx_import.c, counters in kvx_stats.c;
 * kvx.h holds the contracts, DESIGN.md the protocol. */
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

/* Kicks chained by callbacks (a pull completing starts the next one) run in
 * one libevent pass that never looks at timers or fds. After
 * KVX_KICK_CHAIN_MAX such kicks the next goes through a zero timer, so
 * deadlines, the watchdog and the worker fd are served at least that often
 * (before: a stuck chain starved a pull deadline for ~10 minutes). */
#define KVX_KICK_CHAIN_MAX 64

void kvx_kick(kvx_ctx_h *ctx)
{
    if (ctx->kick_pending)
        return;
    ctx->kick_pending = true;
    if (ctx->kick_chain < KVX_KICK_CHAIN_MAX) {
        event_active(ctx->ev_kick, 0, 0);
    } else {
        static const struct timeval zero = { 0, 0 };
        evtimer_add(ctx->ev_kick_later, &zero);
    }
}

pd_status_t kvx_ucs_status(ucs_status_t s)
{
    switch (s) {
    case UCS_OK:                return PD_OK;
    case UCS_ERR_NO_MEMORY:     return PD_ERR_NO_MEMORY;
    case UCS_ERR_CANCELED:      return PD_ERR_CANCELED;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:      return PD_ERR_PEER_GONE;
    default:                    return PD_ERR_TRANSPORT;
    }
}

/* ---- progress: worker event fd on the loop -------------------------------- */

/* Drain progress, then arm; BUSY means events arrived meanwhile. Returns
 * how many progress calls did work. The arm (an eventfd read plus one
 * recvfrom per shared-memory interface; its cost: docs/BENCHMARKS.md
 * "Figures behind kvx.c's choices") is skipped when the worker is still armed: no
 * progress call consumed an event since the last successful arm, the event
 * fd did not fire, and none of our gets is outstanding (a get that returned
 * a request is always followed by a fresh arm). */
#define KVX_ARM_SPIN_NS (50 * PD_NS_PER_US)
#define KVX_WD_MIN_US 1000
#define KVX_WD_MAX_US 100000

/* One drain of ucp_worker_progress runs for at most this long (checked
 * every 8 calls): with UCX tcp an importer receiving a large pull finds
 * work on every call for as long as the data keeps coming (measured with
 * kv-stream = layer: 831 drains over 5 streamed 3000-token pulls went past
 * the slice), and the old unbounded drain held the loop - steps, messages,
 * timers - meanwhile. Past the slice the drain stops, unarmed, and a zero
 * timer continues it after libevent served the other fds and timers
 * (progress_yields). A single call is not cut (an exporter sends a whole
 * get's software-RMA reply in one). */
#define KVX_PROGRESS_SLICE_NS (500 * PD_NS_PER_US)

unsigned kvx_progress(kvx_ctx_h *ctx)
{
    ucs_status_t s;
    unsigned worked = 0;
    uint64_t t0 = 0;
    while (ucp_worker_progress(ctx->worker) != 0) {
        worked++;
        if ((worked & 7) != 0)
            continue;
        uint64_t now = pd_now_ns();
        if (t0 == 0) {
            t0 = now;
        } else if (now - t0 > KVX_PROGRESS_SLICE_NS) {
            ctx->armed = false;
            ctx->cs[KVX_CS_progress_yields]++;
            if (!evtimer_pending(ctx->ev_kick_later, NULL)) {
                static const struct timeval zero = { 0, 0 };
                ctx->kick_pending = true;
                evtimer_add(ctx->ev_kick_later, &zero);
            }
            return worked;
        }
    }
    if (worked == 0 && ctx->armed && ctx->ops_in_flight == 0 &&
        ctx->notifies_in_flight == 0 && ctx->amreplies_live == 0)
        return 0;
    /* Bounded: measured (UCX 1.13.1, posix), arm kept returning BUSY for
     * ever while a release notify sat in an endpoint's pending queue behind
     * the asleep exporter's full FIFO, and progress had nothing to do. The
     * old unbounded loop spun here at 100 % CPU and starved every libevent
     * timer (pull deadlines included): the ~10 minute kvxfer-bench stall.
     * Usually the peer drains within microseconds (the retry loop is the
     * backpressure on notifies), so retry for at most KVX_ARM_SPIN_NS; then
     * return unarmed and let the watchdog retry. */
    uint64_t spin_until = 0;
    for (;;) {
        s = ucp_worker_arm(ctx->worker);
        if (s != UCS_ERR_BUSY)
            break;
        uint64_t now = pd_now_ns();
        if (spin_until == 0)
            spin_until = now + KVX_ARM_SPIN_NS;
        else if (now > spin_until)
            break;
        while (ucp_worker_progress(ctx->worker) != 0)
            worked++;
    }
    ctx->armed = s == UCS_OK;
    if (s == UCS_ERR_BUSY)
        ctx->cs[KVX_CS_arm_busy]++;
    return worked;
}

/* Safety net against a lost event-fd wakeup: measured with UCX 1.13.1's
 * posix transport (UCX_TLS=posix,self, ~1 in 8 runs of 5000 64 KiB pulls),
 * a get stayed pending with both workers armed and asleep until the pull's
 * deadline. While gets are outstanding a 1 ms one-shot timer progresses the
 * worker once more; it is not armed when nothing is in flight (no polling
 * when idle). Rescues are counted (progress_rescues). */
static void kvx_watchdog_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_ctx_h *ctx = arg;
    ctx->kick_chain = 0;
    ctx->armed = false;
    if (kvx_progress(ctx) > 0) {
        ctx->cs[KVX_CS_progress_rescues]++;
        ctx->wd_us = KVX_WD_MIN_US;
    } else if (ctx->ops_in_flight == 0 && ctx->wd_us < KVX_WD_MAX_US) {
        ctx->wd_us *= 2; /* idle but unarmed or serving leases: back off */
    }
    kvx_kick(ctx);
}

static void kvx_efd_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_ctx_h *ctx = arg;
    ctx->kick_chain = 0;
    ctx->armed = false; /* the fd fired: the arm is used up */
    kvx_progress(ctx);
}

static void kvx_kick_cb(evutil_socket_t fd, short what, void *arg);
static void kvx_kick_later_cb(evutil_socket_t fd, short what, void *arg);

/* ---- context -------------------------------------------------------------- */

void kvx_config_default(kvx_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_leases = 4096;
    cfg->max_pulls = 256;
    cfg->max_ops_in_flight = 64;
    cfg->max_op_bytes = 8ull << 20;
    cfg->max_peers = 64;
    cfg->max_lease_ttl_ns = 600 * PD_NS_PER_S;
    cfg->close_grace_ns = 200 * PD_NS_PER_MS;
    cfg->err_mode = KVX_ERRMODE_AUTO;
    cfg->warm_peer_mappings = true;
    cfg->ready_poll_ns = 100 * PD_NS_PER_US;
}

static uint64_t kvx_read_host_id(void)
{
    char buf[128] = { 0 };
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(buf, sizeof(buf), f) == NULL)
            buf[0] = 0;
        fclose(f);
    }
    uint64_t id = 0;
    crypto_generichash((uint8_t *)&id, sizeof(id), (uint8_t *)buf,
                       strlen(buf), NULL, 0);
    return id | 1;
}


/* UCX settings kvx changes from UCX's defaults, each unless the operator
 * set that variable (or one it must agree with) in the environment. Set in
 * the environment, because UCX 1.13 reads transport settings there (a
 * ucp_config_modify of TCP_TX_SEG_SIZE was accepted and had no effect).
 * UCX_TCP_TX_SEG_SIZE 8K -> 64K (= UCX_TCP_RX_SEG_SIZE's default, which must
 * stay >= it, so an operator's RX_SEG_SIZE leaves both alone): over UCX tcp
 * a get is software RMA and the exporter sends the reply in TX_SEG
 * fragments, a copy and a send() each, on its loop thread.
 * Measured gains: docs/BENCHMARKS.md "Figures behind kvx.c's choices". */
void kvx_ucx_env_defaults(void)
{
    static const struct {
        const char *name, *value, *unless;
    } tune[] = {
        { "UCX_TCP_TX_SEG_SIZE", "64K", "UCX_TCP_RX_SEG_SIZE" },
    };
    for (size_t i = 0; i < sizeof(tune) / sizeof(tune[0]); i++)
        if (getenv(tune[i].unless) == NULL)
            (void)setenv(tune[i].name, tune[i].value, 0 /* the operator's wins */);
}

pd_status_t kvx_ctx_create(const kvx_config_t *cfg, struct event_base *base,
                           kvx_ctx_h **ctx_p)
{
    pd_status_t status = PD_ERR_NO_MEMORY;
    ucp_config_t *ucfg;
    kvx_ctx_h *ctx;

    if (cfg->node_id == 0 || cfg->max_leases == 0 || cfg->ready_layers > KVX_MAX_LAYERS ||
        cfg->max_leases > KVX_META_MAX_SLOTS || cfg->max_pulls == 0 ||
        cfg->max_pulls > 65535 || cfg->max_ops_in_flight == 0 ||
        cfg->max_peers == 0 || cfg->max_op_bytes < 4096)
        return PD_ERR_BAD_INPUT;
    if (sodium_init() < 0)
        return PD_ERR_INTERNAL;
    ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        goto err;
    ctx->cfg = *cfg;
    ctx->wd_us = KVX_WD_MIN_US;
    ctx->base = base;
    randombytes_buf(&ctx->incarnation, sizeof(ctx->incarnation));
    ctx->incarnation |= 1;
    ctx->host_id = kvx_read_host_id();
    ctx->leases = calloc(cfg->max_leases, sizeof(*ctx->leases));
    ctx->peers = calloc(cfg->max_peers, sizeof(*ctx->peers));
    ctx->pulls = calloc(cfg->max_pulls, sizeof(*ctx->pulls));
    /* AM reads: every get a pull can have out (data within the in-flight
     * budget, two poll reads and the generation read beyond it), twice over
     * for requests whose send completes after their reply */
    uint64_t n_amreads = 2 * ((uint64_t)cfg->max_ops_in_flight + 3ull * cfg->max_pulls) + 16;
    ctx->n_amreads = n_amreads > 65535 ? 65535 : (uint32_t)n_amreads;
    ctx->amreads = calloc(ctx->n_amreads, sizeof(*ctx->amreads));
    ctx->amreplies = calloc(KVX_READ_REP_SLOTS, sizeof(*ctx->amreplies));
    if (!ctx->leases || !ctx->peers || !ctx->pulls || !ctx->amreads || !ctx->amreplies)
        goto err_free;
    for (uint32_t i = ctx->n_amreads; i-- > 0;) {
        ctx->amreads[i].idx = i;
        ctx->amreads[i].ctx = ctx;
        ctx->amreads[i].next_free = ctx->amread_free;
        ctx->amread_free = &ctx->amreads[i];
    }
    for (uint32_t i = KVX_READ_REP_SLOTS; i-- > 0;) {
        ctx->amreplies[i].ctx = ctx;
        ctx->amreplies[i].next_free = ctx->amreply_free;
        ctx->amreply_free = &ctx->amreplies[i];
    }
    for (uint32_t i = cfg->max_leases; i-- > 0;) {
        kvx_lease_t *l = &ctx->leases[i];
        l->slot = i;
        l->timer = evtimer_new(base, kvx_lease_timer_cb, l);
        if (l->timer == NULL)
            goto err_free;
        l->next = ctx->lease_free;
        ctx->lease_free = l;
    }
    for (uint32_t i = 0; i < cfg->max_peers; i++) {
        ctx->peers[i].ctx = ctx;
        ctx->peers[i].idx = i;
        ctx->peers[i].grace_timer = evtimer_new(base, kvx_peer_grace_cb,
                                                &ctx->peers[i]);
        ctx->peers[i].warm_timer = evtimer_new(base, kvx_peer_warm_cb, &ctx->peers[i]);
        if (ctx->peers[i].grace_timer == NULL || ctx->peers[i].warm_timer == NULL)
            goto err_free;
    }
    for (uint32_t i = 0; i < cfg->max_pulls; i++) {
        ctx->pulls[i].ctx = ctx;
        ctx->pulls[i].idx = i;
        ctx->pulls[i].timer = evtimer_new(base, kvx_pull_timer_cb,
                                          &ctx->pulls[i]);
        ctx->pulls[i].poll_timer = evtimer_new(base, kvx_pull_poll_cb, &ctx->pulls[i]);
        if (ctx->pulls[i].timer == NULL || ctx->pulls[i].poll_timer == NULL)
            goto err_free;
    }

    ucp_params_t up = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
    };
    status = PD_ERR_TRANSPORT;
    kvx_ucx_env_defaults(); /* no-op when the daemon did it before its threads */
    if (ucp_config_read(NULL, NULL, &ucfg) != UCS_OK)
        goto err_free;
    /* a context setting (unlike the tcp transport's, see
     * kvx_ucx_env_defaults): ucp_config_modify takes effect; checked with
     * /proc/<pid>/net/tcp (tests/serving/test_listen.sh) */
    if (cfg->net_devices != NULL &&
        ucp_config_modify(ucfg, "NET_DEVICES", cfg->net_devices) != UCS_OK) {
        ucp_config_release(ucfg);
        status = PD_ERR_BAD_INPUT;
        goto err_free;
    }
    ucs_status_t us = ucp_init(&up, ucfg, &ctx->ucp);
    ucp_config_release(ucfg);
    if (us != UCS_OK)
        goto err_free;
    ctx->cfg.net_devices = NULL; /* the caller's string is not kept */
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    if (ucp_worker_create(ctx->ucp, &wp, &ctx->worker) != UCS_OK)
        goto err_cleanup;
    if (ucp_worker_get_address(ctx->worker, &ctx->addr, &ctx->addr_len) != UCS_OK)
        goto err_worker;
    if (ctx->addr_len > KVX_META_MAX_ADDR)
        goto err_addr;
    void *gen_addr;
    size_t gen_len = (size_t)cfg->max_leases * (1 + cfg->ready_layers) * sizeof(uint64_t);
    status = kvx_mem_map(ctx, NULL, gen_len, true, &ctx->gen_memh, &gen_addr);
    if (status != PD_OK)
        goto err_addr;
    ctx->gen_words = gen_addr;
    memset(ctx->gen_words, 0, gen_len);
    status = PD_ERR_TRANSPORT;
    if (ucp_rkey_pack(ctx->ucp, ctx->gen_memh, &ctx->gen_rkey_buf,
                      &ctx->gen_rkey_len) != UCS_OK)
        goto err_gen;
    static const struct {
        unsigned id;
        ucp_am_recv_callback_t cb;
    } am[] = {
        { KVX_AM_NOTIFY, kvx_am_notify_cb },
        { KVX_AM_READ_REQ, kvx_am_read_req_cb },
        { KVX_AM_READ_REP, kvx_am_read_rep_cb },
    };
    for (size_t i = 0; i < sizeof(am) / sizeof(am[0]); i++) {
        ucp_am_handler_param_t ap = {
            .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                          UCP_AM_HANDLER_PARAM_FIELD_CB |
                          UCP_AM_HANDLER_PARAM_FIELD_ARG,
            .id = am[i].id,
            .cb = am[i].cb,
            .arg = ctx,
        };
        if (ucp_worker_set_am_recv_handler(ctx->worker, &ap) != UCS_OK)
            goto err_gen_rkey;
    }
    if (kvx_reply_dt_create(ctx) != PD_OK)
        goto err_gen_rkey;
    int efd;
    if (ucp_worker_get_efd(ctx->worker, &efd) != UCS_OK)
        goto err_dt;
    status = PD_ERR_INTERNAL;
    ctx->ev_efd = event_new(base, efd, EV_READ | EV_PERSIST, kvx_efd_cb, ctx);
    ctx->ev_kick = event_new(base, -1, 0, kvx_kick_cb, ctx);
    ctx->ev_watchdog = evtimer_new(base, kvx_watchdog_cb, ctx);
    ctx->ev_kick_later = evtimer_new(base, kvx_kick_later_cb, ctx);
    if (!ctx->ev_efd || !ctx->ev_kick || !ctx->ev_watchdog || !ctx->ev_kick_later ||
        event_add(ctx->ev_efd, NULL) != 0)
        goto err_events;
    kvx_prom_ctx_create(ctx);
    kvx_progress(ctx);
    *ctx_p = ctx;
    return PD_OK;

err_events:
    if (ctx->ev_efd)
        event_free(ctx->ev_efd);
    if (ctx->ev_kick)
        event_free(ctx->ev_kick);
    if (ctx->ev_watchdog)
        event_free(ctx->ev_watchdog);
    if (ctx->ev_kick_later)
        event_free(ctx->ev_kick_later);
err_dt:
    ucp_dt_destroy(ctx->reply_dt);
err_gen_rkey:
    ucp_rkey_buffer_release(ctx->gen_rkey_buf);
err_gen:
    ucp_mem_unmap(ctx->ucp, ctx->gen_memh);
err_addr:
    ucp_worker_release_address(ctx->worker, ctx->addr);
err_worker:
    ucp_worker_destroy(ctx->worker);
err_cleanup:
    ucp_cleanup(ctx->ucp);
err_free:
    for (uint32_t i = 0; ctx->leases && i < cfg->max_leases; i++)
        if (ctx->leases[i].timer)
            event_free(ctx->leases[i].timer);
    for (uint32_t i = 0; ctx->peers && i < cfg->max_peers; i++) {
        if (ctx->peers[i].grace_timer)
            event_free(ctx->peers[i].grace_timer);
        if (ctx->peers[i].warm_timer)
            event_free(ctx->peers[i].warm_timer);
    }
    for (uint32_t i = 0; ctx->pulls && i < cfg->max_pulls; i++) {
        if (ctx->pulls[i].timer)
            event_free(ctx->pulls[i].timer);
        if (ctx->pulls[i].poll_timer)
            event_free(ctx->pulls[i].poll_timer);
    }
    free(ctx->leases);
    free(ctx->peers);
    free(ctx->pulls);
    free(ctx->amreads);
    free(ctx->amreplies);
    free(ctx);
err:
    return status;
}

uint64_t kvx_ctx_node_id(const kvx_ctx_h *ctx) { return ctx->cfg.node_id; }
uint64_t kvx_ctx_incarnation(const kvx_ctx_h *ctx) { return ctx->incarnation; }

/* ---- the kick: everything deferred out of UCX callbacks ----------------------- */

static void kvx_kick_run(kvx_ctx_h *ctx)
{
    ctx->kick_pending = false;
    for (uint32_t i = 0; i < ctx->peer_hwm; i++)
        if (ctx->peers[i].state != KVX_PEER_FREE &&
            ctx->peers[i].pending_fail != PD_OK &&
            ctx->peers[i].state == KVX_PEER_ACTIVE)
            kvx_peer_fail_now(&ctx->peers[i], ctx->peers[i].pending_fail);
    for (uint32_t i = 0; i < ctx->pull_hwm; i++)
        kvx_pull_step(&ctx->pulls[i]);
    for (uint32_t i = 0; i < ctx->peer_hwm; i++)
        if (ctx->peers[i].state == KVX_PEER_FAILED)
            kvx_peer_reap(&ctx->peers[i]);
    kvx_lease_deliver(ctx);
    kvx_progress(ctx);
    /* watchdog: 1 ms while our gets are outstanding; backing off to 100 ms
     * while the worker could not be armed (pending sends) or an exporter
     * holds leases; 1 ms again while a notify send is pending in UCX: a
     * send queued behind a full shared-memory FIFO is only retried by our
     * own progress (nobody signals the sender when space frees), yet
     * ucp_worker_arm returns OK for it - measured: release notifies stuck
     * until the lease TTL, exporter_rc=3 in kvxfer_bench_smoke) */
    if (ctx->ops_in_flight > 0 || ctx->notifies_in_flight > 0 || ctx->amreplies_live > 0)
        ctx->wd_us = KVX_WD_MIN_US;
    if ((ctx->ops_in_flight > 0 || ctx->notifies_in_flight > 0 || ctx->amreplies_live > 0 || !ctx->armed ||
         ctx->leases_active > 0) &&
        !evtimer_pending(ctx->ev_watchdog, NULL)) {
        struct timeval tv = { 0, (suseconds_t)ctx->wd_us };
        evtimer_add(ctx->ev_watchdog, &tv);
    }
    kvx_prom_publish(ctx);
}

static void kvx_kick_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_ctx_h *ctx = arg;
    ctx->kick_chain++;
    kvx_kick_run(ctx);
}

static void kvx_kick_later_cb(evutil_socket_t fd, short what, void *arg)
{
    kvx_ctx_h *ctx = arg;
    ctx->kick_chain = 0;
    kvx_kick_run(ctx);
}

/* ---- destroy -------------------------------------------------------------------- */

void kvx_ctx_destroy(kvx_ctx_h *ctx)
{
    if (ctx == NULL)
        return;
    ctx->destroying = true;
    for (uint32_t i = 0; i < ctx->cfg.max_pulls; i++) {
        kvx_pull_t *pl = &ctx->pulls[i];
        if (pl->state != KVX_PULL_FREE && pl->state != KVX_PULL_ZOMBIE &&
            pl->err == PD_OK)
            pl->err = PD_ERR_SHUTDOWN;
    }
    for (uint32_t i = 0; i < ctx->cfg.max_peers; i++)
        if (ctx->peers[i].state == KVX_PEER_ACTIVE)
            kvx_peer_fail_now(&ctx->peers[i], PD_ERR_SHUTDOWN);
    /* bounded drain: canceled gets and close requests return in progress */
    uint64_t until = pd_now_ns() + ctx->cfg.close_grace_ns;
    for (;;) {
        kvx_kick_run(ctx);
        bool busy = false;
        for (uint32_t i = 0; i < ctx->cfg.max_peers; i++)
            busy |= ctx->peers[i].state != KVX_PEER_FREE;
        if (!busy || pd_now_ns() > until)
            break;
    }
    for (uint32_t i = 0; i < ctx->cfg.max_peers; i++)
        ctx->peers[i].grace_expired = true;
    kvx_kick_run(ctx);
    for (uint32_t i = 0; i < ctx->cfg.max_peers; i++) {
        kvx_peer_t *p = &ctx->peers[i];
        if (p->close_req) {
            ucp_request_free(p->close_req);
            p->close_req = NULL;
        }
        if (p->state != KVX_PEER_FREE)
            kvx_peer_clear(p); /* gets that never came back: rkeys go too */
        event_free(p->grace_timer);
        event_free(p->warm_timer);
    }
    for (uint32_t i = 0; i < ctx->cfg.max_leases; i++)
        if (ctx->leases[i].state == KVX_LEASE_ACTIVE)
            kvx_lease_end(&ctx->leases[i], KVX_LEASE_REVOKED);
    kvx_lease_deliver(ctx);
    for (uint32_t i = 0; i < ctx->cfg.max_leases; i++)
        event_free(ctx->leases[i].timer);
    for (uint32_t i = 0; i < ctx->cfg.max_pulls; i++) {
        kvx_pull_t *pl = &ctx->pulls[i];
        if (pl->local_blocks && pl->local_blocks != pl->local_inline)
            free(pl->local_blocks);
        free(pl->rd_words);
        event_free(pl->timer);
        event_free(pl->poll_timer);
    }
    event_free(ctx->ev_efd);
    event_free(ctx->ev_kick);
    event_free(ctx->ev_watchdog);
    event_free(ctx->ev_kick_later);
    /* The worker goes BEFORE any memory is unmapped: over tcp an exporter
     * serves gets with active-message replies that its worker copies out of
     * the arena (uct_tcp_ep_am_bcopy), and endpoints other nodes created to
     * us can still hold such replies. Unmapping first made the worker read
     * freed memory at destroy (seen as a SEGV after a pull interrupted by
     * SIGSTOP). */
    ucp_worker_release_address(ctx->worker, ctx->addr);
    ucp_worker_destroy(ctx->worker);
    ctx->worker = NULL;
    for (unsigned i = 0; i < KVX_MAX_REGIONS; i++)
        kvx_region_deregister(&ctx->regions[i]);
    ucp_dt_destroy(ctx->reply_dt);
    ucp_rkey_buffer_release(ctx->gen_rkey_buf);
    ucp_mem_unmap(ctx->ucp, ctx->gen_memh);
    ucp_cleanup(ctx->ucp);
    pd_stats_destroy(ctx->prom);
    free(ctx->leases);
    free(ctx->peers);
    free(ctx->pulls);
    free(ctx->amreads);
    free(ctx->amreplies);
    free(ctx);
}

