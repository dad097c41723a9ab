/* sim_bench.c - pd-sim-bench: can the sim engine keep up with its own timing
 * model? For each preset (or --model SPEC) it prefills CTX tokens and runs
 * decode steps of batch B at that context with no_sleep=1, and prints the
 * real compute time (KV generation + checksum of every KV byte read) side by
 * side with the modeled time. real/modeled < 1 means the engine can honour
 * the model at speedup=1 (the rest is slept); > 1 means it runs late.
 *   usage: pd-sim-bench [--model SPEC] [--ctx N] [--batch B] [--steps S] [--f32|--q8_0|--kv DT] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng.h"
#include "eng_sim.h"
#include <time.h>

#include "pd_time.h"

static uint64_t cpu_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * PD_NS_PER_S + (uint64_t)ts.tv_nsec;
}

static const char *const presets[] = { "llama3-8b", "llama3-70b", "qwen3-8b", "deepseek-v3" };

static int bench_one(const char *name, uint32_t ctx, uint32_t batch, uint32_t steps,
                     eng_kv_dtype_t dt)
{
    const eng_ops_t *ops = eng_find("sim");
    char spec[600], err[256] = "";
    eng_load_opts_t o = { .engine = "sim", .model_path = spec, .kv_dtype = dt };
    eng_model_t *m = NULL;
    const eng_kv_geom_t *g;
    uint32_t n_blocks, *bt, i;
    int32_t *tok;
    float *logits;
    uint8_t *arena;
    eng_decode_item_t *items;
    eng_sim_stats_t s0, s1, s2;
    uint64_t t0, t1, t2, w0, w1, w2;
    pd_status_t st;

    snprintf(spec, sizeof(spec), "%s,no_sleep=1", name);
    st = ops->load(&o, &m, err, sizeof(err));
    if (st != PD_OK) {
        fprintf(stderr, "pd-sim-bench: %s\n", err);
        return 2;
    }
    g = ops->geometry(m);
    if (ctx + 1 > g->context_length)
        ctx = g->context_length - 1;
    n_blocks = (ctx + 1 + g->block_tokens - 1) / g->block_tokens;
    arena = malloc((size_t)n_blocks * g->block_bytes);
    bt = malloc(n_blocks * sizeof(*bt));
    tok = malloc((ctx + 1) * sizeof(*tok));
    logits = malloc((size_t)batch * g->vocab_size * sizeof(float));
    items = malloc(batch * sizeof(*items));
    if (arena == NULL || bt == NULL || tok == NULL || logits == NULL || items == NULL) {
        fprintf(stderr, "pd-sim-bench: out of memory\n");
        return 1;
    }
    memset(arena, 0, (size_t)n_blocks * g->block_bytes); /* pre-fault, as a registered arena is */
    for (i = 0; i < n_blocks; i++)
        bt[i] = i;
    for (i = 0; i <= ctx; i++)
        tok[i] = (int32_t)(32 + i % 95);
    eng_sim_stats(m, &s0);
    w0 = pd_now_ns();
    t0 = cpu_ns();
    if (ops->prefill(m, arena, bt, n_blocks, tok, ctx, 0, logits) != PD_OK)
        return 1;
    t1 = cpu_ns();
    w1 = pd_now_ns();
    eng_sim_stats(m, &s1);
    /* B sequences sharing one context (each hashes all of it, as attention reads it) */
    for (i = 0; i < batch; i++) {
        items[i].block_table = bt;
        items[i].n_blocks = n_blocks;
        items[i].pos = ctx;
        items[i].token = tok[ctx];
    }
    for (i = 0; i < steps; i++)
        if (ops->decode(m, arena, items, batch, logits) != PD_OK)
            return 1;
    t2 = cpu_ns();
    w2 = pd_now_ns();
    eng_sim_stats(m, &s2);
    printf("%-12s %8.1f %6u %10.1f %10.1f %6.2fx %5u %10.2f %10.2f %6.2fx %8.2f %9.1f %9.2f\n", name,
           (double)g->bytes_per_token / 1024.0, ctx,
           (double)(s1.modeled_ns - s0.modeled_ns) / 1e6, (double)(t1 - t0) / 1e6,
           (double)(t1 - t0) / (double)(s1.modeled_ns - s0.modeled_ns), batch,
           (double)(s2.modeled_ns - s1.modeled_ns) / 1e6 / steps, (double)(t2 - t1) / 1e6 / steps,
           (double)(t2 - t1) / (double)(s2.modeled_ns - s1.modeled_ns),
           (double)(s2.kv_bytes_hashed - s1.kv_bytes_hashed) / ((double)(t2 - t1) / 1e9) / 1e9,
           (double)(w1 - w0) / 1e6, (double)(w2 - w1) / 1e6 / steps);
    ops->destroy(m);
    free(arena);
    free(bt);
    free(tok);
    free(logits);
    free(items);
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL;
    uint32_t ctx = 1024, batch = 4, steps = 5;
    eng_kv_dtype_t dt = ENG_KV_F16;
    int i, rc = 0;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            model = argv[++i];
        else if (strcmp(argv[i], "--ctx") == 0 && i + 1 < argc)
            ctx = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
            batch = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--f32") == 0)
            dt = ENG_KV_F32;
        else if (strcmp(argv[i], "--q8_0") == 0)
            dt = ENG_KV_Q8_0;
        else if (strcmp(argv[i], "--kv") == 0 && i + 1 < argc) {
            if (eng_kv_dtype_parse(argv[++i], &dt) != 0) {
                fprintf(stderr, "pd-sim-bench: unknown kv dtype '%s'\n", argv[i]);
                return 2;
            }
        }
        else if (strcmp(argv[i], "--help") == 0) {
            printf("usage: pd-sim-bench [--model SPEC] [--ctx N] [--batch B] [--steps S] [--f32|--q8_0|--kv DT]\n");
            return 0;
        } else {
            fprintf(stderr, "pd-sim-bench: unknown flag '%s'\n", argv[i]);
            return 2;
        }
    }
    if (ctx < 1 || batch < 1 || batch > 1024 || steps < 1) {
        fprintf(stderr, "pd-sim-bench: need ctx >= 1, 1 <= batch <= 1024, steps >= 1\n");
        return 2;
    }
    printf("%-12s %8s %6s %10s %10s %7s %5s %10s %10s %7s %8s %9s %9s\n", "model", "KiB/tok",
           "ctx", "pf model", "pf real", "ratio", "batch", "dec model", "dec real", "ratio",
           "hash GB/s", "pf wall", "dec wall");
    printf("%-12s %8s %6s %10s %10s %7s %5s %10s %10s %7s %8s %9s %9s\n", "", "", "", "ms",
           "cpu ms", "", "", "ms/step", "cpu ms", "", "", "ms", "ms/step");
    if (model != NULL)
        return bench_one(model, ctx, batch, steps, dt);
    for (i = 0; i < (int)(sizeof(presets) / sizeof(presets[0])) && rc == 0; i++)
        rc = bench_one(presets[i], ctx, batch, steps, dt);
    return rc;
}
