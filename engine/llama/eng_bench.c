/* eng_bench.c - engine throughput vs. a memory-bandwidth baseline measured
 * in the same run.
 *
 *   pd-eng-bench --model A.gguf [--model B.gguf ...] [--threads N]
 *             [--batches 1,8,32] [--prefill 128] [--steps 8] [--ctx 64]
 *             [--amx-min 16] [--kv f16,q8_0,q4_0]
 *
 * For each model: prefill tokens/s (one sequence of --prefill tokens),
 * decode tokens/s at each batch size (every sequence at position --ctx;
 * the fastest of --steps steps, since the machine is shared and a slow step
 * measures the neighbours, not the engine),
 * batch-B / batch-1 speedup, and the memory roofline fraction at batch 1:
 *   weight bytes per token * tokens/s / memcpy bandwidth
 * where memcpy bandwidth = bytes copied per second by --threads threads
 * (256 MiB, best of 5). A read-only bandwidth (sum over 256 MiB) is printed
 * as a second reference. */
#include <getopt.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pd_memledger.h"
#include "eng.h"
#include "eng_llama.h"
#include "ggml_qdot.h"
#include "ll_kern.h"
#include "pd_time.h"

#define BENCH_BUF (256u << 20)
#define BENCH_MAX_MODELS 8
#define BENCH_MAX_BATCHES 8

typedef struct {
    uint8_t *src, *dst;
    size_t n;
    int read_only;
    double sink[64];             /* (BW_CHUNKS) keeps the loads alive */
} bw_ctx_t;

static __attribute__((target("avx2"))) double bw_sum(const uint8_t *p, size_t n)
{
    __m256i acc = _mm256_setzero_si256();
    for (size_t i = 0; i + 128 <= n; i += 128) {
        __m256i a = _mm256_load_si256((const __m256i *)(const void *)(p + i));
        __m256i b = _mm256_load_si256((const __m256i *)(const void *)(p + i + 32));
        __m256i c = _mm256_load_si256((const __m256i *)(const void *)(p + i + 64));
        __m256i d = _mm256_load_si256((const __m256i *)(const void *)(p + i + 96));
        acc = _mm256_add_epi64(acc, _mm256_xor_si256(_mm256_xor_si256(a, b),
                                                     _mm256_xor_si256(c, d)));
    }
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)(void *)v, acc);
    return (double)(v[0] ^ v[1] ^ v[2] ^ v[3]);
}

#define BW_CHUNKS 64

static void bw_task(void *arg, uint32_t chunk, uint32_t tid)
{
    bw_ctx_t *c = arg;
    size_t per = c->n / BW_CHUNKS;
    size_t off = per * chunk;
    if (c->read_only)
        c->sink[chunk] = bw_sum(c->src + off, per);
    else
        memcpy(c->dst + off, c->src + off, per);
}

/* Best-of-3 bandwidth in bytes/s with the pool's threads. */
static double measure_bw(eng_ll_pool_t *pool, uint8_t *src, uint8_t *dst, int read_only)
{
    bw_ctx_t c = { src, dst, BENCH_BUF, read_only, { 0 } };
    double best = 0;
    eng_ll_pool_run(pool, bw_task, &c, BW_CHUNKS); /* warm */
    for (int r = 0; r < 5; r++) {
        uint64_t t0 = pd_now_ns();
        eng_ll_pool_run(pool, bw_task, &c, BW_CHUNKS);
        double s = (pd_now_ns() - t0) / 1e9;
        double bw = BENCH_BUF / s;
        if (bw > best)
            best = bw;
    }
    return best;
}

static int parse_list(const char *s, uint32_t *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || v == 0 || v > 1024)
            return -1;
        out[n++] = (uint32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return n;
}

#define BENCH_USAGE                                                                \
    "usage: pd-eng-bench --model M.gguf [--model ...] [options]\n\n"                \
    "Prefill and decode tokens/s of the llama engine on GGUF models, with the\n"     \
    "machine's memory bandwidth (copy, read) and each step's share of the\n"        \
    "read-only roofline. PD_QDOT=scalar|avx2|vnni|amx|off caps the integer dot.\n\n"\
    "  --model M.gguf     a model (repeatable, up to 8)\n"                          \
    "  --threads N        engine threads (default: the CPUs it may use)\n"          \
    "  --batches 1,8,32   decode batch sizes\n"                                     \
    "  --prefill N        prompt tokens of the prefill run (default 128)\n"         \
    "  --steps N          decode steps per batch size (default 8)\n"               \
    "  --ctx N            context each decode sequence starts from (default 64)\n"  \
    "  --amx-min N        smallest batch on AMX tiles (default 16)\n"              \
    "  --kv DT,DT         KV cache dtypes, each model once per dtype (default f16)\n" \
    "  --help             this text\n"

int main(int argc, char **argv)
{
    const char *models[BENCH_MAX_MODELS];
    int n_models = 0;
    uint32_t threads = 0, prefill_n = 128, steps = 8, ctx = 64;
    uint32_t batches[BENCH_MAX_BATCHES] = { 1, 8, 32 };
    int n_batches = 3;
    eng_kv_dtype_t kvs[ENG_KV_DTYPES] = { ENG_KV_F16 };
    int n_kvs = 1;
    static const struct option opts[] = {
        { "model", required_argument, NULL, 'm' },
        { "threads", required_argument, NULL, 't' },
        { "batches", required_argument, NULL, 'b' },
        { "prefill", required_argument, NULL, 'p' },
        { "steps", required_argument, NULL, 's' },
        { "ctx", required_argument, NULL, 'c' },
        { "amx-min", required_argument, NULL, 'a' },
        { "kv", required_argument, NULL, 'k' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            if (n_models < BENCH_MAX_MODELS)
                models[n_models++] = optarg;
            break;
        case 't': threads = (uint32_t)atoi(optarg); break;
        case 'b':
            n_batches = parse_list(optarg, batches, BENCH_MAX_BATCHES);
            if (n_batches <= 0) {
                fprintf(stderr, "pd-eng-bench: bad --batches\n");
                return 2;
            }
            break;
        case 'p': prefill_n = (uint32_t)atoi(optarg); break;
        case 's': steps = (uint32_t)atoi(optarg); break;
        case 'c': ctx = (uint32_t)atoi(optarg); break;
        case 'a': eng_ll_amx_min_g = (uint32_t)atoi(optarg); break;
        case 'k': {
            n_kvs = 0;
            for (char *save = NULL, *t = strtok_r(optarg, ",", &save); t;
                 t = strtok_r(NULL, ",", &save)) {
                if (n_kvs == (int)ENG_KV_DTYPES || eng_kv_dtype_parse(t, &kvs[n_kvs]) != 0) {
                    fprintf(stderr, "pd-eng-bench: bad --kv '%s'\n", t);
                    return 2;
                }
                n_kvs++;
            }
            if (n_kvs == 0)
                return 2;
            break;
        }
        case 'h':
            fputs(BENCH_USAGE, stdout);
            return 0;
        default:
            fputs(BENCH_USAGE, stderr);
            return 2;
        }
    }
    if (n_models == 0 || prefill_n == 0 || steps == 0) {
        fprintf(stderr, "pd-eng-bench: need --model\n");
        return 2;
    }
    if (threads == 0)
        threads = pd_cpu_budget(NULL, NULL);

    eng_ll_pool_t *pool;
    if (eng_ll_pool_create(threads, &pool) != PD_OK)
        return 1;
    uint8_t *src = aligned_alloc(4096, BENCH_BUF), *dst = aligned_alloc(4096, BENCH_BUF);
    if (!src || !dst)
        return 1;
    memset(src, 1, BENCH_BUF);
    memset(dst, 2, BENCH_BUF);
    double bw_copy = measure_bw(pool, src, dst, 0);
    double bw_read = measure_bw(pool, src, dst, 1);
    free(src);
    free(dst);
    eng_ll_pool_destroy(pool);
    printf("baseline: memcpy %.2f GB/s, read-only %.2f GB/s (%u threads, 256 MiB, best of 5)\n",
           bw_copy / 1e9, bw_read / 1e9, threads);
    const char *amx_why = ggml_qdot_amx_why();
    const int qpath = ggml_qdot_path();
    printf("integer dot: %s (AMX from %u items)%s%s\n", ggml_qdot_path_name(qpath),
           eng_ll_amx_min_g, amx_why ? "; no AMX: " : qpath < GGML_QDOT_AMX ? "; PD_QDOT caps it" : "",
           amx_why ? amx_why : "");

    const eng_ops_t *ops = eng_find("llama");
    uint32_t maxb = 1;
    for (int i = 0; i < n_batches; i++)
        if (batches[i] > maxb)
            maxb = batches[i];
    printf("%-28s %-5s %-6s %8s %9s %10s", "model", "type", "isa", "params", "MB/token",
           "prefill/s");
    for (int i = 0; i < n_batches; i++)
        printf("   dec@b%-3u", batches[i]);
    printf(" %9s %9s %9s\n", "bmax/b1", "roof(cp)", "roof(rd)");

    for (int mk = 0; mk < n_models * n_kvs; mk++) { /* each model once per KV dtype */
        const int mi = mk / n_kvs;
        eng_load_opts_t lo = { .engine = "llama", .model_path = models[mi],
                               .kv_dtype = kvs[mk % n_kvs], .n_threads = threads,
                               .max_batch = maxb };
        eng_model_t *m;
        char err[256] = "";
        pd_status_t st = ops->load(&lo, &m, err, sizeof(err));
        if (st != PD_OK) {
            fprintf(stderr, "pd-eng-bench: %s: %s (%s)\n", models[mi], pd_status_str(st), err);
            return 1;
        }
        eng_llama_info_t info;
        eng_llama_info(m, &info);
        const eng_kv_geom_t *g = ops->geometry(m);
        uint32_t need = (prefill_n > ctx + steps + 1 ? prefill_n : ctx + steps + 1);
        if (need > g->context_length) {
            fprintf(stderr, "pd-eng-bench: context too short\n");
            return 1;
        }
        uint32_t nb_seq = (need + g->block_tokens - 1) / g->block_tokens;
        uint32_t n_blocks = nb_seq * maxb;
        uint8_t *arena = calloc(n_blocks, g->block_bytes);
        uint32_t *bt = malloc((size_t)n_blocks * sizeof(*bt));
        float *logits = malloc((size_t)maxb * g->vocab_size * sizeof(float));
        int32_t *toks = malloc(prefill_n * sizeof(*toks));
        eng_decode_item_t *items = malloc(maxb * sizeof(*items));
        if (!arena || !bt || !logits || !toks || !items) {
            fprintf(stderr, "pd-eng-bench: out of memory\n");
            return 1;
        }
        for (uint32_t i = 0; i < n_blocks; i++)
            bt[i] = i;
        for (uint32_t i = 0; i < prefill_n; i++)
            toks[i] = (int32_t)((i * 7919u + 13) % g->vocab_size);

        /* prefill: warm once (page in weights), then best of 3 */
        ops->prefill(m, arena, bt, nb_seq, toks, prefill_n < 16 ? prefill_n : 16, 0, logits);
        double pf_best = 0;
        for (int r = 0; r < 3; r++) {
            uint64_t t0 = pd_now_ns();
            ops->prefill(m, arena, bt, nb_seq, toks, prefill_n, 0, logits);
            double tps = prefill_n / ((pd_now_ns() - t0) / 1e9);
            if (tps > pf_best)
                pf_best = tps;
        }
        double dec[BENCH_MAX_BATCHES], b1 = 0, bmax = 0;
        for (int bi = 0; bi < n_batches; bi++) {
            uint32_t B = batches[bi];
            for (uint32_t j = 0; j < B; j++) {
                items[j].block_table = bt + (size_t)j * nb_seq;
                items[j].n_blocks = nb_seq;
                items[j].pos = ctx;
                items[j].token = toks[j % prefill_n];
            }
            ops->decode(m, arena, items, B, logits); /* warm */
            uint64_t best = UINT64_MAX;
            for (uint32_t s = 0; s < steps; s++) {
                for (uint32_t j = 0; j < B; j++)
                    items[j].pos = ctx + 1 + s;
                uint64_t t0 = pd_now_ns();
                ops->decode(m, arena, items, B, logits);
                uint64_t dt = pd_now_ns() - t0;
                if (dt < best)
                    best = dt;
            }
            dec[bi] = (double)B / (best / 1e9);
            if (B == 1)
                b1 = dec[bi];
            bmax = dec[bi];
        }
        const char *base = strrchr(models[mi], '/');
        char name[64];
        base = base ? base + 1 : models[mi];
        if (n_kvs > 1) /* "model kv=q8_0" */
            snprintf(name, sizeof name, "%.16s kv=%s", base, eng_kv_dtype_name(lo.kv_dtype));
        else
            snprintf(name, sizeof name, "%s", base);
        printf("%-28.28s %-5s %-6s %7.1fM %9.1f %10.1f", name,
               eng_ll_type_name(info.weight_type), info.isa, info.n_params / 1e6,
               info.weight_bytes_per_token / 1e6, pf_best);
        for (int bi = 0; bi < n_batches; bi++)
            printf(" %10.1f", dec[bi]);
        if (b1 > 0)
            printf(" %8.2fx %8.0f%% %8.0f%%\n", bmax / b1,
                   100.0 * info.weight_bytes_per_token * b1 / bw_copy,
                   100.0 * info.weight_bytes_per_token * b1 / bw_read);
        else
            printf("\n");
        fflush(stdout);
        free(arena);
        free(bt);
        free(logits);
        free(toks);
        free(items);
        ops->destroy(m);
    }
    return 0;
}
