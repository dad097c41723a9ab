/* pd_ep_sim_bench.c - pd-ep-sim-bench: decode steps of an expert-parallel
 * group of N real processes (fork), each rank a model loaded with
 * ep_rank/ep_size (default: the sim engine at DeepSeek-R1 geometry) whose
 * transport is kvxfer's exchange window (kvx_win.h, slot sizes from
 * eng_ops_t.ep_cap), as node/node_ep.c sets it up: every MoE layer of every
 * step runs a dispatch and a combine exchange with the real byte volumes of
 * its tokens' routing, the compute is the engine's (the sim: modeled
 * sleeps). For each batch per rank (one process group per batch, so the
 * windows are sized for it) it prints, at rank 0, the bytes per token of
 * dispatch and combine, the per-layer exchange time, the step time and its
 * split (exchange vs the rest), p50 over the steps. The exchanges are timed
 * in this tool's wrapper of the window, so it only needs eng.h: any engine
 * with EP runs here (issue 36, docs/BENCHMARKS.md).
 *
 * --overlap both runs each batch twice, one process group after the other:
 * one micro-batch, then two (eng_load_opts_t.ep_overlap: the sim splits
 * each pass, llama each MoE layer's tokens; each micro-batch's exchanges
 * in flight while the other computes); the exchange time is then what the
 * ranks spent blocked in post and wait.
 *
 *   pd-ep-sim-bench [--ranks 16] [--spec deepseek-r1,kv_check=sample]
 *                   [--batches 1,8,32] [--steps 20] [--warmup 3]
 *                   [--tls shm|tcp] [--timeout-s 60] [--overlap 0|1|both]
 *                   [--engine sim|llama] (llama: --spec a MoE GGUF file; one
 *                   thread per rank) */
#include "eng.h"
#include "kvx_win.h"
#include "pd_status.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 64
#define MAX_BATCHES 8
#define MAX_STEPS 10000
#define KV_SEQS 4       /* the items of a step share these sequences' blocks */

static uint32_t n_ranks = 16, steps = 20, warmup = 3, timeout_s = 60;
static uint32_t batches[MAX_BATCHES] = { 1, 8, 32 }, n_batches = 3;
static const char *spec = "deepseek-r1,kv_check=sample";
static const char *tls = "shm";
static const char *engine = "sim";
static int overlap_runs[2] = { 1, 0 }; /* run without, with overlap */
static bool overlap_run;               /* this group's eng_load_opts_t.ep_overlap */

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
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

/* The window as an eng_ep_xport_t, timed: exchange calls, ns, bytes to
 * the other ranks per phase (counted by the caller's stated lengths). */
typedef struct {
    kvx_win_h *w;
    uint32_t rank, size;
    uint64_t calls, ns, post_ns, bytes[2], layers;
} xp_t;

static void *xp_send_buf(void *ctx, eng_ep_phase_t ph, uint32_t peer)
{
    xp_t *x = ctx;
    return kvx_win_send_buf(x->w, ph, peer);
}

static pd_status_t xp_post(void *ctx, eng_ep_phase_t ph, uint32_t layer, const size_t *len)
{
    xp_t *x = ctx;
    uint64_t t0 = now_ns();
    pd_status_t st;

    (void)layer;
    st = kvx_win_post(x->w, ph, len);
    x->ns += now_ns() - t0;
    x->post_ns += now_ns() - t0;
    for (uint32_t p = 0; p < x->size; p++)
        if (p != x->rank)
            x->bytes[ph & 1] += len[p];
    return st;
}

static pd_status_t xp_wait(void *ctx, eng_ep_phase_t ph, uint32_t layer, const void **recv,
                           size_t *recv_len)
{
    xp_t *x = ctx;
    uint64_t t0 = now_ns();
    pd_status_t st;

    (void)layer;
    st = kvx_win_wait(x->w, ph, recv, recv_len);
    x->ns += now_ns() - t0;
    x->calls++;
    x->layers += ph == ENG_EP_COMBINE;
    return st;
}

static pd_status_t xp_exchange(void *ctx, eng_ep_phase_t ph, uint32_t layer, const size_t *len,
                               const void **recv, size_t *recv_len)
{
    xp_t *x = ctx;
    uint64_t t0 = now_ns();
    pd_status_t st;

    (void)layer;
    st = kvx_win_exchange(x->w, ph, len, recv, recv_len);
    x->ns += now_ns() - t0;
    x->calls++;
    x->layers += ph == ENG_EP_COMBINE;
    for (uint32_t p = 0; p < x->size; p++)
        if (p != x->rank)
            x->bytes[ph] += len[p];
    return st;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t p50(uint64_t *v, uint32_t n)
{
    qsort(v, n, sizeof(*v), cmp_u64);
    return v[n / 2];
}

static int rank_main(uint32_t me, uint32_t b, int to_parent, int from_parent)
{
    const eng_ops_t *ops = eng_find(engine);
    eng_load_opts_t o = { .engine = engine, .model_path = spec, .kv_dtype = ENG_KV_F16,
                          .block_tokens = strcmp(engine, "sim") ? 16 : 0, .n_threads = 1,
                          .max_batch = b,
                          .ep_rank = me, .ep_size = n_ranks, .ep_overlap = overlap_run };
    eng_model_t *m = NULL;
    char err[256] = "";
    size_t cap[ENG_EP_SLOTS];
    pd_status_t st;

    if (ops == NULL || ops->load(&o, &m, err, sizeof(err)) != PD_OK) {
        fprintf(stderr, "rank %u: load: %s\n", me, err);
        return 2;
    }
    if (ops->ep_cap == NULL || ops->ep_cap(m, cap) != PD_OK || cap[0] == 0) {
        fprintf(stderr, "rank %u: the model has no EP caps\n", me);
        return 2;
    }
    kvx_win_config_t c = { .rank = me, .size = n_ranks, .n_slots = cap[2] ? 4 : 2,
                           .slot_bytes = { cap[0], cap[1], cap[2], cap[3] },
                           .timeout_ns = (uint64_t)timeout_s * 1000000000u, .tls = tls,
                           .net_devices = strcmp(tls, "tcp") == 0 ? "lo" : NULL };
    kvx_win_h *w;
    st = kvx_win_create(&c, &w);
    if (st != PD_OK) {
        fprintf(stderr, "rank %u: window: %s\n", me, pd_status_str(st));
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
    xp_t xp = { .w = w, .rank = me, .size = n_ranks };
    eng_ep_xport_t x = { .ctx = &xp, .rank = me, .size = n_ranks,
                         .cap = { cap[0], cap[1], cap[2], cap[3] },
                         .send_buf = xp_send_buf, .exchange = xp_exchange,
                         .post = xp_post, .wait = xp_wait };
    if ((st = ops->set_ep(m, &x)) != PD_OK) {
        fprintf(stderr, "rank %u: set_ep: %s\n", me, pd_status_str(st));
        return 2;
    }
    /* KV: KV_SEQS sequences of the positions the run reaches; item i
     * writes sequence i % KV_SEQS (the KV is not what this measures) */
    const eng_kv_geom_t *g = ops->geometry(m);
    uint32_t n_pos = warmup + steps, nb = (n_pos + g->block_tokens - 1) / g->block_tokens;
    uint32_t seqs = b < KV_SEQS ? b : KV_SEQS;
    void *arena = calloc((size_t)seqs * nb, g->block_bytes);
    uint32_t *bt = malloc((size_t)seqs * nb * sizeof(uint32_t));
    eng_decode_item_t *it = calloc(b, sizeof(*it));
    float *logits = malloc((size_t)b * g->vocab_size * sizeof(float));
    uint64_t *step_ns = malloc(steps * sizeof(uint64_t)), *ex_ns = malloc(steps * sizeof(uint64_t));
    if (!arena || !bt || !it || !logits || !step_ns || !ex_ns)
        return 2;
    for (uint32_t i = 0; i < seqs * nb; i++)
        bt[i] = i;
    uint64_t b0[2] = { 0, 0 }, tot_step = 0, tot_ex = 0, tot_post = 0;
    for (uint32_t s = 0; s < warmup + steps; s++) {
        for (uint32_t i = 0; i < b; i++)
            it[i] = (eng_decode_item_t){ bt + (i % seqs) * nb, nb, s,
                                         (int32_t)(32 + (i * 31u + me * 7u + s) % 90u) };
        if (s == warmup) {
            b0[0] = xp.bytes[0];
            b0[1] = xp.bytes[1];
        }
        uint64_t e0 = xp.ns, q0 = xp.post_ns, t0 = now_ns();
        st = ops->decode(m, arena, it, b, logits);
        uint64_t t1 = now_ns();
        if (st != PD_OK) {
            fprintf(stderr, "rank %u batch %u step %u: %s\n", me, b, s, pd_status_str(st));
            return 6;
        }
        if (s >= warmup) {
            step_ns[s - warmup] = t1 - t0;
            ex_ns[s - warmup] = xp.ns - e0;
            tot_step += t1 - t0;
            tot_ex += xp.ns - e0;
            tot_post += xp.post_ns - q0;
        }
    }
    if (me == 0) {
        uint32_t moe = (uint32_t)(xp.layers / (warmup + steps));
        double tok = (double)steps * b * (moe ? moe : 1); /* token-layers */
        uint64_t ps = p50(step_ns, steps), pe = p50(ex_ns, steps);
        printf("overlap=%u ranks=%u batch=%u moe_layers=%u dispatch_B_per_token_layer=%.0f "
               "combine_B_per_token_layer=%.0f layer_exchange_us_p50=%.1f step_ms_p50=%.2f "
               "exchange_ms_p50=%.2f compute_ms_p50=%.2f exchange_share=%.2f "
               "posting_share=%.2f\n",
               cap[2] != 0, n_ranks, b, moe, (double)(xp.bytes[0] - b0[0]) / tok,
               (double)(xp.bytes[1] - b0[1]) / tok, moe ? (double)pe / moe / 1e3 : 0.0,
               (double)ps / 1e6, (double)pe / 1e6, (double)(ps > pe ? ps - pe : 0) / 1e6,
               tot_step ? (double)tot_ex / (double)tot_step : 0.0,
               tot_ex ? (double)tot_post / (double)tot_ex : 0.0);
        fflush(stdout);
    }
    free(step_ns);
    free(ex_ns);
    free(logits);
    free(it);
    free(bt);
    free(arena);
    ops->destroy(m);
    kvx_win_destroy(w);
    return 0;
}

/* One process group at batch b: fork, pool the windows' metadata, wait. */
static int run_batch(uint32_t b)
{
    int up[MAX_RANKS][2], down[MAX_RANKS][2];
    pid_t pid[MAX_RANKS];
    uint8_t *meta[MAX_RANKS] = { 0 };
    uint32_t ml[MAX_RANKS];
    int bad = 0;

    for (uint32_t r = 0; r < n_ranks; r++) {
        if (pipe(up[r]) || pipe(down[r]))
            return 1;
        fflush(stdout);
        pid[r] = fork();
        if (pid[r] < 0)
            return 1;
        if (pid[r] == 0)
            _exit(rank_main(r, b, up[r][1], down[r][0]));
        close(up[r][1]);
        close(down[r][0]);
    }
    for (uint32_t r = 0; r < n_ranks && !bad; r++)
        if (io_all(up[r][0], &ml[r], 4, 0) || ml[r] > 8192 || !(meta[r] = malloc(ml[r])) ||
            io_all(up[r][0], meta[r], ml[r], 0))
            bad = 1;
    for (uint32_t r = 0; r < n_ranks && !bad; r++)
        for (uint32_t p = 0; p < n_ranks; p++)
            if (io_all(down[r][1], &ml[p], 4, 1) || io_all(down[r][1], meta[p], ml[p], 1))
                bad = 1;
    for (uint32_t r = 0; r < n_ranks; r++) {
        int ws;
        close(up[r][0]);
        close(down[r][1]); /* a rank still waiting for metadata reads EOF */
        if (waitpid(pid[r], &ws, 0) != pid[r] || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
            bad++;
        free(meta[r]);
    }
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--ranks"))
            n_ranks = (uint32_t)atoi(v);
        else if (!strcmp(k, "--spec"))
            spec = v;
        else if (!strcmp(k, "--engine"))
            engine = v;
        else if (!strcmp(k, "--steps"))
            steps = (uint32_t)atoi(v);
        else if (!strcmp(k, "--warmup"))
            warmup = (uint32_t)atoi(v);
        else if (!strcmp(k, "--tls"))
            tls = v;
        else if (!strcmp(k, "--timeout-s"))
            timeout_s = (uint32_t)atoi(v);
        else if (!strcmp(k, "--overlap")) {
            overlap_runs[0] = strcmp(v, "1") != 0;
            overlap_runs[1] = strcmp(v, "0") != 0;
            if (strcmp(v, "0") && strcmp(v, "1") && strcmp(v, "both")) {
                fprintf(stderr, "--overlap: 0, 1 or both\n");
                return 2;
            }
        }
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
    if (n_ranks < 2 || n_ranks > MAX_RANKS || steps == 0 || steps > MAX_STEPS ||
        warmup > MAX_STEPS || n_batches == 0 || timeout_s == 0 || timeout_s > 3600) {
        fprintf(stderr, "bad options (ranks 2..%d, steps 1..%d)\n", MAX_RANKS, MAX_STEPS);
        return 2;
    }
    printf("engine=%s spec=%s tls=%s ranks=%u steps=%u warmup=%u\n", engine, spec, tls, n_ranks, steps, warmup);
    for (uint32_t i = 0; i < n_batches; i++) {
        if (batches[i] == 0 || batches[i] > 1024)
            return 2;
        for (int ov = 0; ov < 2; ov++) {
            if (!overlap_runs[ov])
                continue;
            overlap_run = ov != 0;
            if (run_batch(batches[i]) != 0) {
                fprintf(stderr, "batch %u (overlap %d) failed\n", batches[i], ov);
                return 1;
            }
        }
    }
    return 0;
}
