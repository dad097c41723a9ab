/* pd_ep_bench.c - pd-ep-bench: the MoE dispatch + combine of one
 * qwen3moe layer between N real processes (fork) over kvxfer exchange
 * windows (kvx_win.h), at decode batches (tokens per rank) 1..64: per-layer
 * latency (both exchanges, as the engine's ll_moe_ep runs them), p50 and
 * p99 at rank 0, and the bytes each rank puts. Message sizes follow the
 * engine's format (engine/eng.h "Expert parallelism": dispatch 8 + 8 *
 * pairs + 4 * n_embd * rows, combine 4 * n_embd * pairs); routing is
 * uniform top-k from a seeded generator (each token its own k distinct
 * experts). docs/BENCHMARKS.md runs it next to ucx_perftest
 * (kvxfer/ep-perftest-compare.sh).
 *
 *   pd-ep-bench [--ranks N] [--tls shm|tcp] [--embd 2048] [--experts 128]
 *               [--top 8] [--batches 1,8,64] [--iters 300] [--warmup 30]
 *               [--put auto|rma|am] */
#include "kvx_win.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 16
#define MAX_BATCHES 16

static uint32_t n_ranks = 2, embd = 2048, n_exp = 128, top = 8, iters = 300, warmup = 30;
static uint32_t batches[MAX_BATCHES] = { 1, 8, 64 }, n_batches = 3;
static const char *tls = "shm";
static kvx_win_put_t put_mode = KVX_WIN_PUT_AUTO;

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int io_all(int fd, void *b, size_t n, int wr)
{
    uint8_t *p = b;
    while (n) {
        ssize_t k = wr ? write(fd, p, n) : read(fd, p, n);
        if (k <= 0)
            return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

/* rows[src][dst], pairs[src][dst] of one layer at batch b (seeded). */
static void route(uint32_t b, uint32_t iter, uint32_t rows[MAX_RANKS][MAX_RANKS],
                  uint32_t pairs[MAX_RANKS][MAX_RANKS])
{
    uint32_t per = n_exp / n_ranks;
    memset(rows, 0, sizeof(uint32_t) * MAX_RANKS * MAX_RANKS);
    memset(pairs, 0, sizeof(uint32_t) * MAX_RANKS * MAX_RANKS);
    for (uint32_t s = 0; s < n_ranks; s++)
        for (uint32_t t = 0; t < b; t++) {
            uint64_t st = (uint64_t)iter * 1000003u + s * 7919u + t;
            uint32_t sel[64], n = 0, hit[MAX_RANKS] = { 0 };
            while (n < top) {
                uint32_t e = (uint32_t)(rng(&st) % n_exp), dup = 0;
                for (uint32_t j = 0; j < n; j++)
                    dup |= sel[j] == e;
                if (!dup)
                    sel[n++] = e;
            }
            for (uint32_t j = 0; j < top; j++) {
                uint32_t d = sel[j] / per;
                pairs[s][d]++;
                if (!hit[d]++)
                    rows[s][d]++;
            }
        }
}

static size_t disp_bytes(uint32_t rows, uint32_t pairs)
{
    return 8 + (size_t)pairs * 8 + (size_t)rows * embd * 4;
}

static int rank_main(uint32_t me, int to_parent, int from_parent)
{
    uint32_t bmax = 0;
    for (uint32_t i = 0; i < n_batches; i++)
        bmax = batches[i] > bmax ? batches[i] : bmax;
    kvx_win_config_t c = { .rank = me, .size = n_ranks, .n_slots = 2,
                           .slot_bytes = { disp_bytes(bmax, bmax * top),
                                           (size_t)bmax * top * embd * 4 },
                           .timeout_ns = 10000000000ull, .tls = tls,
                           .net_devices = strcmp(tls, "tcp") == 0 ? "lo" : NULL,
                           .put_mode = put_mode };
    kvx_win_h *w;
    pd_status_t st = kvx_win_create(&c, &w);
    if (st != PD_OK) {
        fprintf(stderr, "rank %u: %s\n", me, pd_status_str(st));
        return 2;
    }
    const void *meta;
    size_t ml;
    kvx_win_meta(w, &meta, &ml);
    uint32_t l32 = (uint32_t)ml;
    if (io_all(to_parent, &l32, 4, 1) || io_all(to_parent, (void *)meta, ml, 1))
        return 3;
    for (uint32_t p = 0; p < n_ranks; p++) {
        uint8_t buf[8192];
        if (io_all(from_parent, &l32, 4, 0) || l32 > sizeof(buf) ||
            io_all(from_parent, buf, l32, 0))
            return 4;
        if (p != me && kvx_win_peer_add(w, p, buf, l32) != PD_OK)
            return 5;
    }
    for (uint32_t p = 0; p < n_ranks; p++) { /* touch the send buffers once */
        memset(kvx_win_send_buf(w, 0, p), 1, c.slot_bytes[0]);
        memset(kvx_win_send_buf(w, 1, p), 2, c.slot_bytes[1]);
    }
    static uint32_t rows[MAX_RANKS][MAX_RANKS], pairs[MAX_RANKS][MAX_RANKS];
    double *lat = malloc(iters * sizeof(double));
    size_t len[MAX_RANKS], rl[MAX_RANKS];
    const void *rv[MAX_RANKS];
    for (uint32_t bi = 0; bi < n_batches; bi++) {
        uint32_t b = batches[bi];
        uint64_t sent_d = 0, sent_c = 0;
        for (uint32_t it = 0; it < warmup + iters; it++) {
            route(b, it, rows, pairs);
            for (uint32_t p = 0; p < n_ranks; p++)
                len[p] = disp_bytes(rows[me][p], pairs[me][p]);
            double t0 = now_us();
            st = kvx_win_exchange(w, 0, len, rv, rl);
            for (uint32_t p = 0; p < n_ranks && st == PD_OK; p++) {
                if (rl[p] != disp_bytes(rows[p][me], pairs[p][me]))
                    st = PD_ERR_MISMATCH;
                len[p] = (size_t)pairs[p][me] * embd * 4; /* combine: back to p */
            }
            if (st == PD_OK)
                st = kvx_win_exchange(w, 1, len, rv, rl);
            double t1 = now_us();
            if (st != PD_OK) {
                fprintf(stderr, "rank %u batch %u: %s\n", me, b, pd_status_str(st));
                return 6;
            }
            if (it >= warmup) {
                lat[it - warmup] = t1 - t0;
                for (uint32_t p = 0; p < n_ranks; p++)
                    if (p != me) {
                        sent_d += disp_bytes(rows[me][p], pairs[me][p]);
                        sent_c += (size_t)pairs[p][me] * embd * 4;
                    }
            }
        }
        if (me == 0) {
            for (uint32_t i = 1; i < iters; i++) /* insertion sort: small */
                for (uint32_t j = i; j > 0 && lat[j] < lat[j - 1]; j--) {
                    double x = lat[j];
                    lat[j] = lat[j - 1];
                    lat[j - 1] = x;
                }
            printf("tls=%s ranks=%u embd=%u experts=%u top=%u batch=%u "
                   "dispatch_bytes_out=%.0f combine_bytes_out=%.0f layer_us_p50=%.1f "
                   "layer_us_p99=%.1f\n",
                   tls, n_ranks, embd, n_exp, top, b, (double)sent_d / iters,
                   (double)sent_c / iters, lat[iters / 2], lat[iters * 99 / 100]);
            fflush(stdout);
        }
    }
    free(lat);
    kvx_win_destroy(w);
    return 0;
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--ranks"))
            n_ranks = (uint32_t)atoi(v);
        else if (!strcmp(k, "--tls"))
            tls = v;
        else if (!strcmp(k, "--embd"))
            embd = (uint32_t)atoi(v);
        else if (!strcmp(k, "--experts"))
            n_exp = (uint32_t)atoi(v);
        else if (!strcmp(k, "--top"))
            top = (uint32_t)atoi(v);
        else if (!strcmp(k, "--iters"))
            iters = (uint32_t)atoi(v);
        else if (!strcmp(k, "--warmup"))
            warmup = (uint32_t)atoi(v);
        else if (!strcmp(k, "--put"))
            put_mode = !strcmp(v, "rma") ? KVX_WIN_PUT_RMA
                       : !strcmp(v, "am") ? KVX_WIN_PUT_AM : KVX_WIN_PUT_AUTO;
        else if (!strcmp(k, "--batches")) {
            n_batches = 0;
            for (char *s = argv[i + 1]; *s && n_batches < MAX_BATCHES;) {
                batches[n_batches++] = (uint32_t)strtoul(s, &s, 10);
                if (*s == ',')
                    s++;
            }
        } else {
            fprintf(stderr, "unknown option %s\n", k);
            return 2;
        }
    }
    if (n_ranks < 2 || n_ranks > MAX_RANKS || n_exp % n_ranks || top == 0 || top > 64 ||
        top > n_exp || embd == 0 || iters == 0 || n_batches == 0) {
        fprintf(stderr, "bad options (ranks 2..%d dividing experts, top 1..64)\n", MAX_RANKS);
        return 2;
    }
    for (uint32_t i = 0; i < n_batches; i++)
        if (batches[i] == 0 || batches[i] > 1024)
            return 2;
    int up[MAX_RANKS][2], down[MAX_RANKS][2];
    pid_t pid[MAX_RANKS];
    for (uint32_t r = 0; r < n_ranks; r++) {
        if (pipe(up[r]) || pipe(down[r]))
            return 1;
        pid[r] = fork();
        if (pid[r] == 0)
            _exit(rank_main(r, up[r][1], down[r][0]));
        close(up[r][1]);
        close(down[r][0]);
    }
    uint8_t *meta[MAX_RANKS];
    uint32_t ml[MAX_RANKS];
    for (uint32_t r = 0; r < n_ranks; r++)
        if (io_all(up[r][0], &ml[r], 4, 0) || ml[r] > 8192 || !(meta[r] = malloc(ml[r])) ||
            io_all(up[r][0], meta[r], ml[r], 0))
            return 1;
    for (uint32_t r = 0; r < n_ranks; r++)
        for (uint32_t p = 0; p < n_ranks; p++)
            if (io_all(down[r][1], &ml[p], 4, 1) || io_all(down[r][1], meta[p], ml[p], 1))
                return 1;
    int bad = 0;
    for (uint32_t r = 0; r < n_ranks; r++) {
        int ws;
        if (waitpid(pid[r], &ws, 0) != pid[r] || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
            bad++;
        free(meta[r]);
    }
    return bad ? 1 : 0;
}
