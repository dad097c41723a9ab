/* kvx-peer - one kvxfer node in its own process, driven line by line on
 * stdin by a test (tests/kvxfer/test_kvx_procs.c). Replies one line per
 * command on stdout; asynchronous results are lines starting with "event ".
 * Every node has one region (id 1) and can export and import.
 *
 *   kvx-peer --node=N [--blocks=N] [--block-bytes=B] [--alloc=ucx|own]
 *            [--err-mode=auto|peer|none] [--read-mode=rma|am]
 *            [--max-op-bytes=B] [--max-ops=N]
 *
 * Commands (hex = lowercase hex bytes, lists = comma separated):
 *   meta                         -> meta <hex>
 *   fill <seed>                  -> ok
 *   export <importer> <ttl_ms> <blocks>  -> handle <hex> <slot> <gen> | err <S>
 *   exportpart <importer> <ttl_ms> <blocks> -> handles <n> <hex>,<hex>...
 *   revoke <slot> <gen> | free <blocks>  -> ok | err <S>
 *   peer <hex>                   -> ok | err <S>
 *   watch <node> <pid>           -> ok   (pidfd: exit -> kvx_peer_fail)
 *   fail <node>                  -> ok | err <S>
 *   import <hex>                 -> ok | reject <REASON> <S>
 *   pull <hex> <deadline_ms> <local blocks> <seed> <release 0|1>
 *        -> started <id> | reject <REASON> <S> | err <S>
 *        later: event pulled <S> <verify ok|bad|skip> <bytes> <latency_us>
 *               polls=.. partial=.. ready_us=.. posted_us=..
 *   cancel                       -> ok | err <S>   (the last pull)
 *   release <hex> | renew <hex> <ttl_ms> -> ok | err <S>
 *   gauges -> gauges leases=.. pinned=.. pulls=.. ops=.. peers=.. rkeys=.. eps=..
 *   counter <name> | rejects <REASON> -> value <n>
 *   stats                        -> stats <json>
 *   prom                         -> prom <Prometheus text, '|' for newlines>
 *   rawread <meta> <handle> <block> <layer> <len> <mut>
 *        -> rawread <status> | rawread none
 *        a kvx AM read request built by hand on a separate UCX worker (not
 *        through kvx): block/layer of the exporter's region named by the
 *        handle, or with mut=genword the lease's generation word; mut
 *        none|tag|importer|gen corrupts nothing or that field. status is
 *        the exporter's answer (0 data, 1 refused, 2 stale), none: no reply
 *        within 2 s
 *   quit                         -> bye (after kvx_ctx_destroy)
 */
#include "kvx.h"
#include "kvx_handle.h"
#include "pd_stats.h"
#include "pd_time.h"

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <ucp/api/ucp.h>

#include <errno.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define LINE_MAX_BYTES 32768

static struct {
    struct event_base *base;
    kvx_ctx_h *ctx;
    kvx_region_h *region;
    uint64_t node;
    char line[LINE_MAX_BYTES];
    size_t line_len;
    struct event *ev_stdin;
    struct event *ev_watch;
    struct event *ev_wire;      /* "peer": waiting for the endpoint's wireup */
    uint64_t wire_node;
    uint64_t wire_deadline_ns;
    uint64_t warmed_at_add;     /* peer_bytes_warmed as kvx_peer_add returned */
    uint64_t watch_node;
    uint64_t last_pull;
    kvx_ready_t ready;          /* the last streamed export's readiness words */
    bool quit;
} g;

/* Pull in flight: what to verify and release when it completes. */
typedef struct {
    kvx_import_t imp;
    uint32_t *local;
    uint64_t seed;
    bool release;
} pull_ctx_t;

static const uint8_t test_secret[KVX_KEY_BYTES] = "kvxfer-test-secret-0123456789ab";

static void reply(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void reply(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static void on_wire(evutil_socket_t fd, short what, void *arg)
{
    if (kvx_peer_wired(g.ctx, g.wire_node)) {
        reply("ok");
    } else if (pd_now_ns() >= g.wire_deadline_ns) {
        reply("ok unwired");
    } else {
        struct timeval tv = { 0, 1000 };
        evtimer_add(g.ev_wire, &tv);
    }
}

static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The 8-byte word w of exporter block b for seed: what every test checks. */
static inline uint64_t pattern(uint64_t seed, uint64_t b, uint64_t w)
{
    return splitmix(seed * 0x100000001b3ull ^ (b << 40) ^ w);
}

/* Word w of block b in the region's layout (layer-major with --layers). */
static uint64_t *word_at(uint64_t b, uint64_t w)
{
    uint64_t lw = kvx_region_block_bytes(g.region) / 8 / kvx_region_n_layers(g.region);
    uint64_t *base = kvx_region_base(g.region);
    return base + ((w / lw) * kvx_region_n_blocks(g.region) + b) * lw + w % lw;
}

static void fill(uint64_t seed)
{
    uint64_t bb = kvx_region_block_bytes(g.region);
    for (uint64_t b = 0; b < kvx_region_n_blocks(g.region); b++)
        for (uint64_t w = 0; w < bb / 8; w++)
            *word_at(b, w) = pattern(seed, b, w);
}

/* Does layer l of local block lb hold layer l of exporter block eb? */
static bool layer_matches(uint32_t l, uint64_t lb, uint64_t eb, uint64_t seed)
{
    uint64_t lw = kvx_region_block_bytes(g.region) / 8 / kvx_region_n_layers(g.region);
    for (uint64_t w = l * lw; w < (l + 1) * lw; w++)
        if (*word_at(lb, w) != pattern(seed, eb, w))
            return false;
    return true;
}

static char *hex_of(const uint8_t *b, size_t n)
{
    char *s = malloc(n * 2 + 1);
    for (size_t i = 0; i < n; i++)
        sprintf(s + 2 * i, "%02x", b[i]);
    s[n * 2] = 0;
    return s;
}

static size_t unhex(const char *s, uint8_t *out, size_t cap)
{
    size_t n = strlen(s) / 2;
    if (n > cap)
        n = cap;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return i;
        out[i] = (uint8_t)v;
    }
    return n;
}

static uint32_t parse_list(const char *s, uint32_t **out_p)
{
    uint32_t n = 1, k = 0;
    for (const char *p = s; *p; p++)
        n += *p == ',';
    uint32_t *v = calloc(n, sizeof(*v));
    char *dup = strdup(s), *save = NULL;
    for (char *t = strtok_r(dup, ",", &save); t && k < n; t = strtok_r(NULL, ",", &save))
        v[k++] = (uint32_t)strtoul(t, NULL, 0);
    free(dup);
    *out_p = v;
    return k;
}

static void on_pulled(void *arg, pd_status_t status, const kvx_pull_result_t *res)
{
    pull_ctx_t *pc = arg;
    const char *verify = "skip";
    if (status == PD_OK) {
        /* every byte must equal the exporter's pattern for its block */
        uint64_t bb = kvx_region_block_bytes(g.region);
        uint32_t i = 0;
        verify = "ok";
        for (unsigned r = 0; r < pc->imp.h.n_runs; r++) {
            for (uint32_t k = 0; k < pc->imp.h.runs[r].count; k++, i++) {
                uint64_t eb = pc->imp.h.runs[r].start + k;
                if (pc->local[i] == KVX_PULL_SKIP)
                    continue;
                for (uint64_t w = 0; w < bb / 8; w++) {
                    if (*word_at(pc->local[i], w) != pattern(pc->seed, eb, w)) {
                        verify = "bad";
                        goto done;
                    }
                }
            }
        }
    }
done:
    if (pc->release && status == PD_OK)
        kvx_lease_release(g.ctx, &pc->imp);
    reply("event pulled %s %s %llu %llu polls=%u partial=%u ready_us=%llu posted_us=%llu",
          pd_status_name(status), verify, (unsigned long long)res->bytes,
          (unsigned long long)(res->latency_ns / 1000), res->polls, res->polls_partial,
          (unsigned long long)(res->ready_ns / 1000), (unsigned long long)(res->posted_ns / 1000));
    free(pc->local);
    free(pc);
}

static void on_watch(evutil_socket_t fd, short what, void *arg)
{
    /* the watched process exited: what a daemon's control plane reports */
    kvx_peer_fail(g.ctx, g.watch_node, PD_ERR_PEER_GONE);
    event_del(g.ev_watch);
    reply("event peer_dead %llu", (unsigned long long)g.watch_node);
}

static void do_import_reply(pd_status_t st, kvx_reject_t reason)
{
    if (st == PD_OK)
        reply("ok");
    else
        reply("reject %s %s", kvx_reject_name(reason), pd_status_name(st));
}

/* ---- rawread: kvx's AM read protocol spoken by hand (kvxfer/DESIGN.md
 * "Reads without an RMA lane"), to show what an exporter refuses ---- */

static struct {
    ucp_context_h ucp;
    ucp_worker_h worker;
    bool got;
    uint32_t status;
} raw;

static ucs_status_t raw_rep_cb(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param)
{
    const uint8_t *m = header;
    if (header_length == 16 && kvx_get_u32(m) == 0x4158564bu /* "KVXA" */) {
        raw.got = true;
        raw.status = kvx_get_u32(m + 4);
    }
    return UCS_OK; /* a rendezvous payload is dropped */
}

static int raw_init(void)
{
    if (raw.worker)
        return 0;
    ucp_params_t up = { .field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM };
    ucp_config_t *cfg;
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK)
        return -1;
    ucs_status_t us = ucp_init(&up, cfg, &raw.ucp);
    ucp_config_release(cfg);
    ucp_worker_params_t wp = { .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                               .thread_mode = UCS_THREAD_MODE_SINGLE };
    if (us != UCS_OK || ucp_worker_create(raw.ucp, &wp, &raw.worker) != UCS_OK)
        return -1;
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB,
        .id = 19, /* KVX_AM_READ_REP */
        .cb = raw_rep_cb,
    };
    return ucp_worker_set_am_recv_handler(raw.worker, &ap) == UCS_OK ? 0 : -1;
}

static void rawread(const char *meta_hex, const char *handle_hex, uint32_t block, uint32_t layer,
                    uint64_t len, const char *mut)
{
    static uint8_t meta[KVX_META_MAX_BYTES], hb[KVX_HANDLE_MAX_BYTES];
    size_t ml = unhex(meta_hex, meta, sizeof(meta)), hl = unhex(handle_hex, hb, sizeof(hb));
    kvx_handle_t h;
    if (kvx_handle_decode(hb, hl, test_secret, &h, NULL) != PD_OK || ml < 56 || raw_init() != 0) {
        reply("err ERR_BAD_INPUT");
        return;
    }
    size_t addr_len = kvx_get_u16(meta + 46), grk = kvx_get_u16(meta + 44);
    const uint8_t *reg = meta + 56 + addr_len + grk; /* the first region */
    uint64_t gen_base = kvx_get_u64(meta + 32);
    uint32_t n_blocks = kvx_get_u32(reg + 4);
    uint64_t lb = kvx_get_u32(reg + 8) / kvx_get_u16(reg + 30);
    uint64_t raddr = kvx_get_u64(reg + 12) + ((uint64_t)layer * n_blocks + block) * lb;
    if (!strcmp(mut, "genword")) {
        raddr = gen_base + (uint64_t)h.lease_slot * 8;
        len = 8;
    }
    uint8_t m[80] = { 0 };
    kvx_put_u32(m, 0x5258564bu); /* "KVXR" */
    m[4] = 1;
    kvx_put_u64(m + 8, 0x10001);
    uint64_t self = kvx_ctx_node_id(g.ctx);
    kvx_put_u64(m + 16, !strcmp(mut, "importer") ? self + 1 : self);
    kvx_put_u64(m + 24, h.incarnation);
    kvx_put_u32(m + 32, h.lease_slot);
    kvx_put_u64(m + 40, !strcmp(mut, "gen") ? h.lease_gen + 1 : h.lease_gen);
    kvx_put_u64(m + 48, raddr);
    kvx_put_u64(m + 56, len);
    memcpy(m + 64, h.tag, KVX_TAG_BYTES);
    if (!strcmp(mut, "tag"))
        m[64] ^= 1;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = (const ucp_address_t *)(meta + 56),
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
    };
    ucp_ep_h e;
    if (ucp_ep_create(raw.worker, &ep, &e) != UCS_OK) {
        reply("err ERR_TRANSPORT");
        return;
    }
    ucp_request_param_t rp = { .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY };
    void *req = ucp_am_send_nbx(e, 18 /* KVX_AM_READ_REQ */, m, sizeof(m), NULL, 0, &rp);
    raw.got = false;
    uint64_t until = pd_now_ns() + 2 * PD_NS_PER_S;
    while (!raw.got && pd_now_ns() < until) {
        ucp_worker_progress(raw.worker);
        /* the exporter may be this very process: its worker needs turns too */
        event_base_loop(g.base, EVLOOP_NONBLOCK);
    }
    if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS && pd_now_ns() < until)
            ucp_worker_progress(raw.worker);
        ucp_request_free(req);
    }
    ucp_request_param_t cp = { .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_EP_CLOSE_FLAG_FORCE };
    void *creq = ucp_ep_close_nbx(e, &cp);
    if (UCS_PTR_IS_PTR(creq)) {
        while (ucp_request_check_status(creq) == UCS_INPROGRESS)
            ucp_worker_progress(raw.worker);
        ucp_request_free(creq);
    }
    if (raw.got)
        reply("rawread %u", raw.status);
    else
        reply("rawread none");
}

static void command(char *line)
{
    char *argv[8] = { 0 };
    int argc = 0;
    char *save = NULL;
    for (char *t = strtok_r(line, " ", &save); t && argc < 8; t = strtok_r(NULL, " ", &save))
        argv[argc++] = t;
    if (argc == 0)
        return;
    const char *c = argv[0];
    static uint8_t buf[KVX_META_MAX_BYTES];
    pd_status_t st;
    kvx_reject_t reason = KVX_REJECT_NONE;

    if (!strcmp(c, "meta")) {
        size_t len;
        st = kvx_meta_pack(g.ctx, buf, sizeof(buf), &len);
        if (st != PD_OK) {
            reply("err %s", pd_status_name(st));
            return;
        }
        char *h = hex_of(buf, len);
        reply("meta %s", h);
        free(h);
    } else if (!strcmp(c, "fill") && argc == 2) {
        fill(strtoull(argv[1], NULL, 0));
        reply("ok");
    } else if (!strcmp(c, "export") && argc == 4) {
        uint32_t *blocks;
        uint32_t n = parse_list(argv[3], &blocks);
        size_t len;
        kvx_lease_id_t lid;
        st = kvx_export(g.region, strtoull(argv[1], NULL, 0), blocks, n,
                        strtoull(argv[2], NULL, 0) * PD_NS_PER_MS, 0, buf,
                        KVX_HANDLE_MAX_BYTES, &len, &lid);
        free(blocks);
        if (st != PD_OK) {
            reply("err %s", pd_status_name(st));
            return;
        }
        char *h = hex_of(buf, len);
        reply("handle %s %u %llu", h, lid.slot, (unsigned long long)lid.gen);
        free(h);
    } else if (!strcmp(c, "exports") && argc == 5) {
        /* streamed: exports <importer> <ttl_ms> <blocks> <blocks ready> */
        uint32_t *blocks;
        uint32_t n = parse_list(argv[3], &blocks);
        size_t len;
        kvx_lease_id_t lid;
        st = kvx_export_stream(g.region, strtoull(argv[1], NULL, 0), blocks, n,
                               strtoull(argv[2], NULL, 0) * PD_NS_PER_MS, 0,
                               (uint32_t)strtoul(argv[4], NULL, 0), buf, KVX_HANDLE_MAX_BYTES,
                               &len, &lid, &g.ready);
        free(blocks);
        if (st != PD_OK) {
            reply("err %s", pd_status_name(st));
            return;
        }
        char *h = hex_of(buf, len);
        reply("handle %s %u %llu", h, lid.slot, (unsigned long long)lid.gen);
        free(h);
    } else if (!strcmp(c, "ready") && argc == 3) {
        /* ready <layer> <blocks>: publish on the last streamed lease */
        kvx_ready_publish(&g.ready, (uint32_t)strtoul(argv[1], NULL, 0),
                          (uint32_t)strtoul(argv[2], NULL, 0));
        reply("ok");
    } else if (!strcmp(c, "check") && argc == 5) {
        /* check <layer> <local block> <exporter block> <seed> */
        reply(layer_matches((uint32_t)strtoul(argv[1], NULL, 0), strtoull(argv[2], NULL, 0),
                            strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0))
                  ? "match" : "nomatch");
    } else if (!strcmp(c, "exportpart") && argc == 4) {
        /* a set that may need several handles: "handles <n> <hex>,<hex>.." */
        uint32_t *blocks;
        uint32_t n = parse_list(argv[3], &blocks);
        static char out[LINE_MAX_BYTES];
        size_t o = 0;
        unsigned k = 0;
        for (uint32_t first = 0; first < n; k++) {
            size_t len;
            uint32_t taken;
            kvx_lease_id_t lid;
            st = kvx_export_part(g.region, strtoull(argv[1], NULL, 0), blocks + first,
                                 n - first, strtoull(argv[2], NULL, 0) * PD_NS_PER_MS,
                                 0, buf, KVX_HANDLE_MAX_BYTES, &len, &lid, &taken);
            if (st != PD_OK) {
                free(blocks);
                reply("err %s", pd_status_name(st));
                return;
            }
            char *h = hex_of(buf, len);
            o += (size_t)snprintf(out + o, sizeof(out) - o, "%s%s", k ? "," : "", h);
            free(h);
            first += taken;
        }
        free(blocks);
        reply("handles %u %s", k, out);
    } else if (!strcmp(c, "revoke") && argc == 3) {
        kvx_lease_id_t lid = { (uint32_t)strtoul(argv[1], NULL, 0),
                               strtoull(argv[2], NULL, 0) };
        st = kvx_lease_revoke(g.ctx, lid);
        st == PD_OK ? reply("ok") : reply("err %s", pd_status_name(st));
    } else if (!strcmp(c, "free") && argc == 2) {
        uint32_t *blocks;
        uint32_t n = parse_list(argv[1], &blocks);
        st = kvx_region_blocks_free(g.region, blocks, n);
        free(blocks);
        st == PD_OK ? reply("ok") : reply("err %s", pd_status_name(st));
    } else if (!strcmp(c, "peer") && argc == 2) {
        size_t len = unhex(argv[1], buf, sizeof(buf));
        st = kvx_peer_add(g.ctx, buf, len);
        g.warmed_at_add = kvx_counter(g.ctx, "peer_bytes_warmed");
        if (st != PD_OK) {
            reply("err %s", pd_status_name(st));
        } else {
            /* answer once the connection is up (as a node's first pull
             * comes after its peer registered): "ok", or "ok unwired" */
            g.wire_node = len >= 16 ? kvx_get_u64(buf + 8) : 0;
            g.wire_deadline_ns = pd_now_ns() + 5000000000ull;
            on_wire(-1, 0, NULL);
        }
    } else if (!strcmp(c, "watch") && argc == 3) {
        int pfd = (int)syscall(SYS_pidfd_open, (pid_t)atoi(argv[2]), 0);
        if (pfd < 0) {
            reply("err ERR_IO");
            return;
        }
        g.watch_node = strtoull(argv[1], NULL, 0);
        g.ev_watch = event_new(g.base, pfd, EV_READ, on_watch, NULL);
        event_add(g.ev_watch, NULL);
        reply("ok");
    } else if (!strcmp(c, "fail") && argc == 2) {
        st = kvx_peer_fail(g.ctx, strtoull(argv[1], NULL, 0), PD_ERR_PEER_GONE);
        st == PD_OK ? reply("ok") : reply("err %s", pd_status_name(st));
    } else if (!strcmp(c, "import") && argc == 2) {
        kvx_import_t imp;
        size_t len = unhex(argv[1], buf, sizeof(buf));
        if (strlen(argv[1]) % 2)
            len = unhex(argv[1], buf, sizeof(buf)); /* odd: truncated by one nibble */
        st = kvx_handle_import(g.ctx, buf, len, 0, &imp, &reason);
        do_import_reply(st, reason);
    } else if (!strcmp(c, "pull") && argc == 6) {
        pull_ctx_t *pc = calloc(1, sizeof(*pc));
        size_t len = unhex(argv[1], buf, sizeof(buf));
        st = kvx_handle_import(g.ctx, buf, len, 0, &pc->imp, &reason);
        if (st != PD_OK) {
            free(pc);
            do_import_reply(st, reason);
            return;
        }
        uint32_t n = parse_list(argv[3], &pc->local);
        pc->seed = strtoull(argv[4], NULL, 0);
        pc->release = atoi(argv[5]) != 0;
        uint64_t deadline = pd_now_ns() + strtoull(argv[2], NULL, 0) * PD_NS_PER_MS;
        st = kvx_pull_start(g.ctx, &pc->imp, g.region, pc->local, n, deadline,
                            0, on_pulled, pc, &g.last_pull);
        if (st != PD_INPROGRESS) {
            free(pc->local);
            free(pc);
            reply("err %s", pd_status_name(st));
            return;
        }
        reply("started %llu", (unsigned long long)g.last_pull);
    } else if (!strcmp(c, "cancel")) {
        st = kvx_pull_cancel(g.ctx, g.last_pull);
        st == PD_OK ? reply("ok") : reply("err %s", pd_status_name(st));
    } else if ((!strcmp(c, "release") && argc == 2) ||
               (!strcmp(c, "renew") && argc == 3)) {
        kvx_import_t imp;
        size_t len = unhex(argv[1], buf, sizeof(buf));
        st = kvx_handle_import(g.ctx, buf, len, 0, &imp, &reason);
        if (st == PD_OK)
            st = argc == 2 ? kvx_lease_release(g.ctx, &imp)
                           : kvx_lease_renew(g.ctx, &imp,
                                             strtoull(argv[2], NULL, 0) * PD_NS_PER_MS);
        st == PD_OK ? reply("ok") : reply("err %s", pd_status_name(st));
    } else if (!strcmp(c, "gauges")) {
        kvx_gauges_t gg;
        kvx_gauges(g.ctx, &gg);
        reply("gauges leases=%u pinned=%llu pulls=%u ops=%u peers=%u rkeys=%u eps=%u",
              gg.leases_active, (unsigned long long)gg.blocks_pinned,
              gg.pulls_in_flight, gg.ops_in_flight, gg.peers_live,
              gg.rkeys_live, gg.eps_live);
    } else if (!strcmp(c, "warmed_at_add") && argc == 1) {
        reply("value %llu", (unsigned long long)g.warmed_at_add);
    } else if (!strcmp(c, "counter") && argc == 2) {
        reply("value %llu", (unsigned long long)kvx_counter(g.ctx, argv[1]));
    } else if (!strcmp(c, "rejects") && argc == 2) {
        for (unsigned r = 0; r < KVX_REJECT__COUNT; r++) {
            if (!strcmp(kvx_reject_name(r), argv[1])) {
                reply("value %llu", (unsigned long long)kvx_rejects(g.ctx, r));
                return;
            }
        }
        reply("err ERR_NOT_FOUND");
    } else if (!strcmp(c, "rawread") && argc == 7) {
        rawread(argv[1], argv[2], (uint32_t)strtoul(argv[3], NULL, 0),
                (uint32_t)strtoul(argv[4], NULL, 0), strtoull(argv[5], NULL, 0), argv[6]);
    } else if (!strcmp(c, "stats")) {
        cJSON *j = kvx_stats_json(g.ctx);
        char *s = cJSON_PrintUnformatted(j);
        reply("stats %s", s);
        free(s);
        cJSON_Delete(j);
    } else if (!strcmp(c, "prom")) {
        /* Prometheus text of the kvx pd_stats set, newlines as '|' */
        pd_stats_t *set = kvx_stats_set(g.ctx);
        char *text = NULL;
        if (set == NULL || pd_stats_render_prometheus(&set, 1, &text, NULL) != PD_OK) {
            reply("err ERR_NO_MEMORY");
            return;
        }
        for (char *t = text; *t; t++)
            if (*t == '\n')
                *t = '|';
        reply("prom %s", text);
        free(text);
    } else if (!strcmp(c, "quit")) {
        g.quit = true;
        event_base_loopbreak(g.base);
    } else {
        reply("err ERR_BAD_INPUT");
    }
}

static void on_stdin(evutil_socket_t fd, short what, void *arg)
{
    char tmp[8192];
    ssize_t n = read(fd, tmp, sizeof(tmp));
    if (n <= 0) { /* driver gone: stop */
        g.quit = true;
        event_base_loopbreak(g.base);
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (tmp[i] == '\n') {
            g.line[g.line_len] = 0;
            g.line_len = 0;
            command(g.line);
            if (g.quit)
                return;
        } else if (g.line_len + 1 < sizeof(g.line)) {
            g.line[g.line_len++] = tmp[i];
        }
    }
}

int main(int argc, char **argv)
{
    kvx_config_t cfg;
    uint64_t blocks = 64, block_bytes = 64 << 10, layers = 1;
    kvx_alloc_t alloc = KVX_ALLOC_UCX;

    kvx_config_default(&cfg);
    memcpy(cfg.secret, test_secret, KVX_KEY_BYTES);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "--node=", 7))
            cfg.node_id = strtoull(a + 7, NULL, 0);
        else if (!strncmp(a, "--blocks=", 9))
            blocks = strtoull(a + 9, NULL, 0);
        else if (!strncmp(a, "--block-bytes=", 14))
            block_bytes = strtoull(a + 14, NULL, 0);
        else if (!strcmp(a, "--alloc=own"))
            alloc = KVX_ALLOC_OWN;
        else if (!strcmp(a, "--alloc=ucx"))
            alloc = KVX_ALLOC_UCX;
        else if (!strcmp(a, "--err-mode=peer"))
            cfg.err_mode = KVX_ERRMODE_PEER;
        else if (!strcmp(a, "--err-mode=none"))
            cfg.err_mode = KVX_ERRMODE_NONE;
        else if (!strcmp(a, "--err-mode=auto"))
            cfg.err_mode = KVX_ERRMODE_AUTO;
        else if (!strcmp(a, "--read-mode=rma"))
            cfg.read_mode = KVX_READ_RMA;
        else if (!strcmp(a, "--read-mode=am"))
            cfg.read_mode = KVX_READ_AM;
        else if (!strncmp(a, "--max-op-bytes=", 15))
            cfg.max_op_bytes = strtoull(a + 15, NULL, 0);
        else if (!strncmp(a, "--layers=", 9))
            layers = strtoull(a + 9, NULL, 0);
        else if (!strncmp(a, "--poll-us=", 10))
            cfg.ready_poll_ns = strtoull(a + 10, NULL, 0) * 1000;
        else if (!strncmp(a, "--max-ops=", 10))
            cfg.max_ops_in_flight = (uint32_t)strtoul(a + 10, NULL, 0);
        else {
            fprintf(stderr, "kvx-peer: unknown option %s\n", a);
            return 2;
        }
    }
    cfg.ready_layers = (uint32_t)layers;
    signal(SIGPIPE, SIG_IGN);
    g.base = event_base_new();
    pd_status_t st = kvx_ctx_create(&cfg, g.base, &g.ctx);
    if (st != PD_OK) {
        fprintf(stderr, "kvx-peer: kvx_ctx_create: %s\n", pd_status_str(st));
        return 1;
    }
    st = kvx_region_register_layers(g.ctx, 1, block_bytes, (uint32_t)blocks, (uint32_t)layers,
                                    0xC0FFEE, alloc, &g.region);
    if (st != PD_OK) {
        fprintf(stderr, "kvx-peer: kvx_region_register: %s\n", pd_status_str(st));
        return 1;
    }
    g.ev_stdin = event_new(g.base, 0, EV_READ | EV_PERSIST, on_stdin, NULL);
    g.ev_wire = evtimer_new(g.base, on_wire, NULL);
    event_add(g.ev_stdin, NULL);
    reply("ready %llu", (unsigned long long)cfg.node_id);
    event_base_dispatch(g.base);
    kvx_ctx_destroy(g.ctx);
    if (g.ev_watch) {
        close(event_get_fd(g.ev_watch));
        event_free(g.ev_watch);
    }
    event_free(g.ev_stdin);
    event_free(g.ev_wire);
    event_base_free(g.base);
    reply("bye");
    return 0;
}
