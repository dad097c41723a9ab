/* kvxfer-bench - pull KV shaped like a real model between two processes
 * (exporter child, importer parent, or two netns with --role) and print
 * GB/s, pulls/s, latency p50/p99 and the pure handle export/import costs.
 *
 *   kvxfer-bench [--preset=llama3-8b|llama3-70b|qwen3-8b|tiny]
 *                [--block-bytes=B] [--blocks-per-pull=N] [--arena-blocks=N]
 *                [--iters=N] [--warmup=N] [--alloc=ucx|own] [--contiguous]
 *                [--err-mode=auto|peer|none] [--read-mode=auto|rma|am]
 *                [--max-op-bytes=B] [--deadline-ms=MS]
 *                [--stall-s=S]
 *
 * Blocks of each pull are a random subset of the exporter arena in random
 * order (scattered; --contiguous: one run), landing in random local blocks.
 * Each pull is one handle (exported ahead, so the control plane is not
 * measured); latency = kvx_pull_start -> completion callback on the loop.
 * The last line is machine readable (tests/kvxfer/perftest-compare.sh). */
#include "kvx.h"
#include "pd_time.h"

#include <event2/event.h>
#include <sodium.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    uint64_t block_bytes;
    uint32_t blocks_per_pull;
    uint32_t arena_blocks;
    uint32_t iters, warmup;
    kvx_alloc_t alloc;
    kvx_errmode_t err_mode;
    kvx_readmode_t read_mode;
    uint64_t max_op_bytes;
    bool contiguous;
    const char *preset;
    uint64_t deadline_ns;
} bench_opts_t;

#define MAX_HANDLES_PER_PULL 1024

/* Stall guard: the loop can be starved (it was, by an unbounded arm loop in
 * kvx.c, for ~10 minutes), so a libevent timer cannot be the last line.
 * SIGALRM every second; when no pull completed for stall_s seconds, report,
 * kill the exporter and exit 1. */
static volatile sig_atomic_t g_done_pulls;
static sig_atomic_t g_seen_pulls, g_quiet_s;
static unsigned g_stall_s = 60;
static pid_t g_child;

static void stall_alarm(int sig)
{
    (void)sig;
    if (g_done_pulls != g_seen_pulls) {
        g_seen_pulls = g_done_pulls;
        g_quiet_s = 0;
        return;
    }
    if ((unsigned)++g_quiet_s < g_stall_s)
        return;
    static const char msg[] = "kvxfer-bench: STALLED: no pull completed within the stall limit, giving up\n";
    if (write(2, msg, sizeof(msg) - 1) < 0)
        (void)0;
    if (g_child > 0)
        kill(g_child, SIGKILL);
    _exit(1);
}

static const uint8_t bench_secret[KVX_KEY_BYTES] = "kvxfer-bench-secret-0123456789a";

/* ---- socket framing: u32 length + bytes ----------------------------------- */

static int send_msg(int fd, const void *b, uint32_t len)
{
    if (write(fd, &len, 4) != 4)
        return -1;
    for (uint32_t off = 0; off < len;) {
        ssize_t k = write(fd, (const uint8_t *)b + off, len - off);
        if (k <= 0)
            return -1;
        off += (uint32_t)k;
    }
    return 0;
}

static int recv_all(int fd, void *b, size_t len)
{
    for (size_t off = 0; off < len;) {
        ssize_t k = read(fd, (uint8_t *)b + off, len - off);
        if (k <= 0)
            return -1;
        off += (size_t)k;
    }
    return 0;
}

static int recv_msg(int fd, void *b, uint32_t cap, uint32_t *len_p)
{
    uint32_t len;
    if (recv_all(fd, &len, 4) || len > cap || recv_all(fd, b, len))
        return -1;
    *len_p = len;
    return 0;
}

/* Cheap PRNG for block picking (getrandom per pick would be measured). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng_below(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static void shuffle(uint32_t *v, uint32_t n)
{
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = rng_below(i);
        uint32_t t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}

/* Random subset of n out of arena in random order (or a contiguous run). */
static void pick_blocks(const bench_opts_t *o, uint32_t *out)
{
    if (o->contiguous) {
        uint32_t start = rng_below(o->arena_blocks - o->blocks_per_pull + 1);
        for (uint32_t i = 0; i < o->blocks_per_pull; i++)
            out[i] = start + i;
        return;
    }
    uint32_t *all = malloc(sizeof(uint32_t) * o->arena_blocks);
    for (uint32_t i = 0; i < o->arena_blocks; i++)
        all[i] = i;
    shuffle(all, o->arena_blocks);
    memcpy(out, all, sizeof(uint32_t) * o->blocks_per_pull);
    free(all);
}

static kvx_ctx_h *make_ctx(const bench_opts_t *o, uint64_t node,
                           struct event_base *base, kvx_region_h **region_p)
{
    kvx_config_t cfg;
    kvx_ctx_h *ctx;
    kvx_config_default(&cfg);
    cfg.node_id = node;
    memcpy(cfg.secret, bench_secret, KVX_KEY_BYTES);
    cfg.err_mode = o->err_mode;
    cfg.read_mode = o->read_mode;
    /* one live lease per prepared handle */
    /* one live lease per prepared handle (a pull may need several) */
    uint64_t want = (uint64_t)(o->iters + o->warmup) *
                    ((o->blocks_per_pull + 31) / 32) + 64;
    if (want > cfg.max_leases)
        cfg.max_leases = want > 65536 ? 65536 : (uint32_t)want;
    if (o->max_op_bytes)
        cfg.max_op_bytes = o->max_op_bytes;
    pd_status_t st = kvx_ctx_create(&cfg, base, &ctx);
    if (st != PD_OK) {
        fprintf(stderr, "kvxfer-bench: kvx_ctx_create: %s\n", pd_status_str(st));
        exit(1);
    }
    st = kvx_region_register(ctx, 1, o->block_bytes, o->arena_blocks, 0x5eed,
                             o->alloc, region_p);
    if (st != PD_OK) {
        fprintf(stderr, "kvxfer-bench: kvx_region_register: %s\n", pd_status_str(st));
        exit(1);
    }
    return ctx;
}

/* ---- exporter (child) ----------------------------------------------------- */

typedef struct {
    struct event_base *base;
    kvx_ctx_h *ctx;
    struct event *drain;
    uint64_t drain_until_ns;
} exporter_t;

/* After 'q': keep serving until the importer's release notifies arrived
 * (checked every 5 ms, at most 2 s), then stop. */
static void exporter_drain_cb(evutil_socket_t fd, short what, void *arg)
{
    exporter_t *ex = arg;
    kvx_gauges_t g;
    kvx_gauges(ex->ctx, &g);
    if (g.leases_active == 0 || pd_now_ns() > ex->drain_until_ns) {
        event_base_loopbreak(ex->base);
        return;
    }
    struct timeval tv = { 0, 5000 };
    evtimer_add(ex->drain, &tv);
}

static void exporter_sock_cb(evutil_socket_t fd, short what, void *arg)
{
    exporter_t *ex = arg;
    char c;
    if (read(fd, &c, 1) <= 0 || c == 'q') {
        ex->drain_until_ns = pd_now_ns() + 2 * PD_NS_PER_S;
        exporter_drain_cb(-1, 0, ex);
    }
}

static int run_exporter(const bench_opts_t *o, int sock)
{
    struct event_base *base = event_base_new();
    kvx_region_h *region;
    kvx_ctx_h *ctx = make_ctx(o, 1, base, &region);
    static uint8_t buf[KVX_META_MAX_BYTES + 1];
    size_t len;
    uint32_t total = o->iters + o->warmup;
    uint32_t *blocks = malloc(sizeof(uint32_t) * o->blocks_per_pull);

    memset(kvx_region_base(region), 0x5a, o->block_bytes * o->arena_blocks);
    /* pure export cost: export + revoke, same block set shape */
    pick_blocks(o, blocks);
    const uint32_t n_cost = 20000;
    uint64_t export_ns = 0, max_len = 0;
    for (uint32_t i = 0; i < n_cost; i++) {
        kvx_lease_id_t lid;
        uint64_t t0 = pd_now_ns();
        uint32_t taken;
        pd_status_t st = kvx_export_part(region, 2, blocks, o->blocks_per_pull,
                                         60 * PD_NS_PER_S, 0, buf,
                                         KVX_HANDLE_MAX_BYTES, &len, &lid, &taken);
        export_ns += pd_now_ns() - t0;
        if (st != PD_OK) {
            fprintf(stderr, "kvxfer-bench: kvx_export: %s\n", pd_status_str(st));
            return 1;
        }
        max_len = len > max_len ? len : max_len;
        kvx_lease_revoke(ctx, lid);
        event_base_loop(base, EVLOOP_NONBLOCK); /* lease slot back to the pool */
    }
    /* metadata only now: nobody connects while the costs are measured */
    if (kvx_meta_pack(ctx, buf, sizeof(buf), &len) != PD_OK || send_msg(sock, buf, (uint32_t)len))
        return 1;
    char line[128];
    snprintf(line, sizeof(line), "%.3f %llu", (double)export_ns / n_cost / 1000.0,
             (unsigned long long)max_len);
    send_msg(sock, line, (uint32_t)strlen(line) + 1);
    /* the handles the importer pulls */
    for (uint32_t i = 0; i < total; i++) {
        pick_blocks(o, blocks);
        /* a set that does not fit one handle (> 64 runs or > 256 bytes)
         * becomes several: what a daemon does with kvx_export_part */
        for (uint32_t first = 0; first < o->blocks_per_pull;) {
            kvx_lease_id_t lid;
            uint32_t taken;
            pd_status_t st = kvx_export_part(region, 2, blocks + first,
                                             o->blocks_per_pull - first,
                                             600 * PD_NS_PER_S, 0, buf,
                                             KVX_HANDLE_MAX_BYTES, &len, &lid,
                                             &taken);
            if (st != PD_OK) {
                fprintf(stderr, "kvxfer-bench: kvx_export: %s\n", pd_status_str(st));
                return 1;
            }
            first += taken;
            buf[len] = first == o->blocks_per_pull; /* last handle of the pull */
            if (send_msg(sock, buf, (uint32_t)len + 1))
                return 1;
        }
    }
    exporter_t ex = { .base = base, .ctx = ctx };
    ex.drain = evtimer_new(base, exporter_drain_cb, &ex);
    struct event *ev = event_new(base, sock, EV_READ, exporter_sock_cb, &ex);
    event_add(ev, NULL);
    event_base_dispatch(base);
    event_free(ex.drain);
    kvx_gauges_t g;
    kvx_gauges(ctx, &g);
    int rc = g.leases_active == 0 ? 0 : 3; /* every lease released */
    if (rc)
        fprintf(stderr, "kvxfer-bench: exporter still holds %u leases\n", g.leases_active);
    event_free(ev);
    kvx_ctx_destroy(ctx);
    event_base_free(base);
    free(blocks);
    return rc;
}

/* ---- importer (parent) ---------------------------------------------------- */

typedef struct {
    struct event_base *base;
    kvx_ctx_h *ctx;
    kvx_region_h *region;
    const bench_opts_t *o;
    uint8_t (*handles)[KVX_HANDLE_MAX_BYTES + 1];
    uint32_t *handle_len;
    uint32_t *pull_first;      /* (total + 1) first handle of each pull */
    uint32_t n_handles;
    uint32_t next, done, total;
    uint64_t *lat_ns;
    uint64_t t_start_ns, t_end_ns;
    uint64_t bytes;
    uint32_t *local;
    kvx_import_t *imp;         /* (handles) of the current pull */
    uint32_t parts_left;
    uint64_t pull_t0;
    pd_status_t failed;
} importer_t;

static void start_next(importer_t *im);

static void on_pull(void *arg, pd_status_t status, const kvx_pull_result_t *res)
{
    importer_t *im = arg;
    if (status != PD_OK) {
        im->failed = status;
        event_base_loopbreak(im->base);
        return;
    }
    if (im->done >= im->o->warmup)
        im->bytes += res->bytes;
    if (--im->parts_left > 0)
        return;
    uint32_t i = im->next - 1;
    uint32_t k_n = im->pull_first[i + 1] - im->pull_first[i];
    uint64_t lat = k_n == 1 ? res->latency_ns : pd_now_ns() - im->pull_t0;
    for (uint32_t k = 0; k < k_n; k++)
        kvx_lease_release(im->ctx, &im->imp[k]);
    if (im->done >= im->o->warmup)
        im->lat_ns[im->done - im->o->warmup] = lat;
    im->done++;
    g_done_pulls = (sig_atomic_t)im->done;
    if (im->done == im->o->warmup)
        im->t_start_ns = pd_now_ns();
    if (im->done == im->total) {
        im->t_end_ns = pd_now_ns();
        event_base_loopbreak(im->base);
        return;
    }
    start_next(im);
}

static void start_next(importer_t *im)
{
    const bench_opts_t *o = im->o;
    uint32_t i = im->next++;
    kvx_reject_t reason;
    pd_status_t st = PD_OK;
    pick_blocks(o, im->local);
    uint32_t k_n = im->pull_first[i + 1] - im->pull_first[i];
    im->parts_left = k_n;
    im->pull_t0 = pd_now_ns();
    uint32_t off = 0;
    for (uint32_t k = 0; k < k_n && (st == PD_OK || st == PD_INPROGRESS); k++) {
        uint32_t h = im->pull_first[i] + k;
        st = kvx_handle_import(im->ctx, im->handles[h], im->handle_len[h], 0,
                               &im->imp[k], &reason);
        if (st != PD_OK) {
            fprintf(stderr, "kvxfer-bench: import rejected: %s\n", kvx_reject_name(reason));
            break;
        }
        st = kvx_pull_start(im->ctx, &im->imp[k], im->region, im->local + off,
                            im->imp[k].h.n_blocks, pd_now_ns() + o->deadline_ns,
                            h, on_pull, im, NULL);
        off += im->imp[k].h.n_blocks;
    }
    if (st != PD_INPROGRESS) {
        im->failed = st;
        event_base_loopbreak(im->base);
    }
}

static void bench_eof_cb(evutil_socket_t fd, short what, void *arg)
{
    event_base_loopbreak(arg);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int run_importer(const bench_opts_t *o, int sock, pid_t child)
{
    importer_t im = { .o = o };
    static uint8_t buf[KVX_META_MAX_BYTES];
    uint32_t len;
    char cost_line[128] = "0 0";

    im.base = event_base_new();
    im.ctx = make_ctx(o, 2, im.base, &im.region);
    memset(kvx_region_base(im.region), 0, o->block_bytes * o->arena_blocks);
    if (recv_msg(sock, buf, sizeof(buf), &len))
        return 1;
    pd_status_t st = kvx_peer_add(im.ctx, buf, len);
    if (st != PD_OK) {
        fprintf(stderr, "kvxfer-bench: kvx_peer_add: %s\n", pd_status_str(st));
        return 1;
    }
    if (recv_msg(sock, cost_line, sizeof(cost_line) - 1, &len))
        return 1;
    im.total = o->iters + o->warmup;
    uint32_t cap_handles = im.total * 4 + 16;
    im.handles = malloc((size_t)cap_handles * sizeof(im.handles[0]));
    im.handle_len = calloc(cap_handles, sizeof(uint32_t));
    im.pull_first = calloc(im.total + 1, sizeof(uint32_t));
    im.imp = calloc(MAX_HANDLES_PER_PULL, sizeof(kvx_import_t));
    im.lat_ns = calloc(o->iters, sizeof(uint64_t));
    im.local = malloc(sizeof(uint32_t) * o->blocks_per_pull);
    for (uint32_t i = 0; i < im.total; i++) {
        im.pull_first[i] = im.n_handles;
        for (;;) {
            if (im.n_handles == cap_handles) {
                cap_handles *= 2;
                im.handles = realloc(im.handles, (size_t)cap_handles * sizeof(im.handles[0]));
                im.handle_len = realloc(im.handle_len, cap_handles * sizeof(uint32_t));
            }
            uint32_t h = im.n_handles++;
            if (recv_msg(sock, im.handles[h], KVX_HANDLE_MAX_BYTES + 1, &im.handle_len[h]) ||
                im.handle_len[h] < 2 || h - im.pull_first[i] >= MAX_HANDLES_PER_PULL)
                return 1;
            im.handle_len[h]--;
            if (im.handles[h][im.handle_len[h]])
                break;
        }
    }
    im.pull_first[im.total] = im.n_handles;
    /* pure import cost of a cached peer's handle (decode + MAC + checks) */
    const uint32_t n_cost = 20000;
    uint64_t t0 = pd_now_ns();
    for (uint32_t i = 0; i < n_cost; i++) {
        if (kvx_handle_import(im.ctx, im.handles[0], im.handle_len[0], 0, &im.imp[0], NULL) != PD_OK)
            return 1;
    }
    double import_us = (double)(pd_now_ns() - t0) / n_cost / 1000.0;

    struct sigaction sa = { .sa_handler = stall_alarm };
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = { { 1, 0 }, { 1, 0 } };
    setitimer(ITIMER_REAL, &it, NULL);
    if (o->warmup == 0)
        im.t_start_ns = pd_now_ns();
    start_next(&im);
    event_base_dispatch(im.base);
    struct itimerval off = { { 0, 0 }, { 0, 0 } };
    setitimer(ITIMER_REAL, &off, NULL);
    /* Release notifies are fire-and-forget, but some may still sit in
     * UCX's pending queue behind the exporter's full shared-memory FIFO:
     * keep this loop (and kvx's watchdog) running until the exporter has
     * drained and exits (EOF on the socket), at most 3 s. */
    char q = 'q';
    if (write(sock, &q, 1) != 1)
        (void)0;
    struct event *eof = event_new(im.base, sock, EV_READ, bench_eof_cb, im.base);
    struct timeval eof_tv = { 3, 0 };
    event_add(eof, &eof_tv);
    event_base_dispatch(im.base);
    event_free(eof);
    int wst = 0;
    waitpid(child, &wst, 0);
    if (im.failed != PD_OK) {
        fprintf(stderr, "kvxfer-bench: pull failed: %s\n", pd_status_str(im.failed));
        return 1;
    }
    qsort(im.lat_ns, o->iters, sizeof(uint64_t), cmp_u64);
    double secs = (double)(im.t_end_ns - im.t_start_ns) / 1e9;
    double gbps = (double)im.bytes / secs / 1e9;
    double p50 = (double)im.lat_ns[o->iters / 2] / 1000.0;
    double p99 = (double)im.lat_ns[(o->iters * 99) / 100 < o->iters ? (o->iters * 99) / 100 : o->iters - 1] / 1000.0;
    double export_us = atof(cost_line);
    const char *sp = strchr(cost_line, ' ');
    unsigned handle_bytes = sp ? (unsigned)atoi(sp + 1) : 0;
    const char *tls = getenv("UCX_TLS");
    printf("kvxfer-bench: preset=%s block=%llu blocks/pull=%u (%.1f handles) pull=%.2f MiB arena=%u "
           "alloc=%s layout=%s UCX_TLS=%s\n",
           o->preset, (unsigned long long)o->block_bytes, o->blocks_per_pull,
           (double)im.n_handles / im.total,
           (double)o->block_bytes * o->blocks_per_pull / 1048576.0, o->arena_blocks,
           o->alloc == KVX_ALLOC_UCX ? "ucx" : "own",
           o->contiguous ? "contiguous" : "scattered", tls ? tls : "(default)");
    printf("  pulls=%u  %.3f GB/s  %.1f pulls/s  latency p50=%.1f us p99=%.1f us\n",
           o->iters, gbps, o->iters / secs, p50, p99);
    printf("  handle: %u bytes, export %.3f us, validate+import %.3f us\n",
           handle_bytes, export_us, import_us);
    kvx_gauges_t g;
    kvx_gauges(im.ctx, &g);
    printf("RESULT gbps=%.4f mibps=%.1f p50_us=%.2f p99_us=%.2f pulls_per_s=%.1f "
           "export_us=%.3f import_us=%.3f handle_bytes=%u exporter_rc=%d rescues=%llu "
           "am_reads=%llu\n",
           gbps, (double)im.bytes / secs / 1048576.0, p50, p99, o->iters / secs,
           export_us, import_us, handle_bytes,
           WIFEXITED(wst) ? WEXITSTATUS(wst) : 128,
           (unsigned long long)kvx_counter(im.ctx, "progress_rescues"),
           (unsigned long long)kvx_counter(im.ctx, "am_reads"));
    kvx_ctx_destroy(im.ctx);
    event_base_free(im.base);
    free(im.handles);
    free(im.handle_len);
    free(im.lat_ns);
    free(im.local);
    free(im.imp);
    free(im.pull_first);
    return WIFEXITED(wst) && WEXITSTATUS(wst) == 0 ? 0 : 1;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: kvxfer-bench [--preset=llama3-8b|llama3-70b|qwen3-8b|tiny]\n"
            "  [--block-bytes=B] [--blocks-per-pull=N] [--arena-blocks=N] [--iters=N]\n"
            "  [--warmup=N] [--alloc=ucx|own] [--contiguous] [--err-mode=auto|peer|none]\n"
            "  [--read-mode=auto|rma|am] [--max-op-bytes=B] [--deadline-ms=MS] [--stall-s=S (60)]\n");
}

int main(int argc, char **argv)
{
    /* default: Llama-3-8B bf16, 16-token blocks = 16 * 128 KiB = 2 MiB,
     * 32 blocks (512 tokens) = 64 MiB per pull */
    bench_opts_t o = {
        .block_bytes = 2u << 20, .blocks_per_pull = 32, .arena_blocks = 128,
        .iters = 30, .warmup = 3, .alloc = KVX_ALLOC_UCX,
        .err_mode = KVX_ERRMODE_AUTO, .preset = "llama3-8b",
        .deadline_ns = 30 * PD_NS_PER_S,
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--preset=llama3-8b")) {
            o.block_bytes = 2u << 20;
        } else if (!strcmp(a, "--preset=llama3-70b")) {
            o.preset = "llama3-70b";
            o.block_bytes = 16 * 320 * 1024;
        } else if (!strcmp(a, "--preset=qwen3-8b")) {
            o.preset = "qwen3-8b";
            o.block_bytes = 16 * 144 * 1024;
        } else if (!strcmp(a, "--preset=tiny")) {
            o.preset = "tiny";
            o.block_bytes = 64 << 10;
            o.blocks_per_pull = 1;
            o.arena_blocks = 64;
            o.iters = 2000;
            o.warmup = 100;
        } else if (!strncmp(a, "--block-bytes=", 14)) {
            o.block_bytes = strtoull(a + 14, NULL, 0);
            o.preset = "custom";
        } else if (!strncmp(a, "--blocks-per-pull=", 18)) {
            o.blocks_per_pull = (uint32_t)strtoul(a + 18, NULL, 0);
        } else if (!strncmp(a, "--arena-blocks=", 15)) {
            o.arena_blocks = (uint32_t)strtoul(a + 15, NULL, 0);
        } else if (!strncmp(a, "--iters=", 8)) {
            o.iters = (uint32_t)strtoul(a + 8, NULL, 0);
        } else if (!strncmp(a, "--warmup=", 9)) {
            o.warmup = (uint32_t)strtoul(a + 9, NULL, 0);
        } else if (!strcmp(a, "--alloc=own")) {
            o.alloc = KVX_ALLOC_OWN;
        } else if (!strcmp(a, "--alloc=ucx")) {
            o.alloc = KVX_ALLOC_UCX;
        } else if (!strcmp(a, "--contiguous")) {
            o.contiguous = true;
        } else if (!strcmp(a, "--err-mode=peer")) {
            o.err_mode = KVX_ERRMODE_PEER;
        } else if (!strcmp(a, "--err-mode=none")) {
            o.err_mode = KVX_ERRMODE_NONE;
        } else if (!strcmp(a, "--read-mode=auto")) {
            o.read_mode = KVX_READ_AUTO;
        } else if (!strcmp(a, "--read-mode=rma")) {
            o.read_mode = KVX_READ_RMA;
        } else if (!strcmp(a, "--read-mode=am")) {
            o.read_mode = KVX_READ_AM;
        } else if (!strncmp(a, "--deadline-ms=", 14)) {
            o.deadline_ns = strtoull(a + 14, NULL, 0) * PD_NS_PER_MS;
        } else if (!strncmp(a, "--stall-s=", 10)) {
            g_stall_s = (unsigned)strtoul(a + 10, NULL, 0);
        } else if (!strncmp(a, "--max-op-bytes=", 15)) {
            o.max_op_bytes = strtoull(a + 15, NULL, 0);
        } else if (!strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            fprintf(stderr, "kvxfer-bench: unknown option '%s'\n", a);
            usage();
            return 2;
        }
    }
    if (o.blocks_per_pull == 0 || o.blocks_per_pull > o.arena_blocks ||
        o.iters == 0 || o.iters + o.warmup > 60000 || o.block_bytes < 64) {
        fprintf(stderr, "kvxfer-bench: need 0 < blocks-per-pull <= arena-blocks, "
                "0 < iters + warmup <= 60000\n");
        return 2;
    }
    if ((uint64_t)(o.iters + o.warmup) * ((o.blocks_per_pull + 31) / 32) > 60000) {
        fprintf(stderr, "kvxfer-bench: too many handles (iters * blocks-per-pull / 32 > 60000)\n");
        return 2;
    }
    if (sodium_init() < 0)
        return 1;
    rng_state ^= (uint64_t)getpid() << 32 | (uint64_t)pd_now_ns();
    signal(SIGPIPE, SIG_IGN);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
        return 1;
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        close(sv[0]);
        _exit(run_exporter(&o, sv[1]));
    }
    close(sv[1]);
    g_child = pid;
    return run_importer(&o, sv[0], pid);
}
