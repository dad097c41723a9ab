/* bench_qdot.c - integer-dot kernel micro-benchmark (issue 37): one thread,
 * GMAC/s of ggml_qdot_rows_packed on the VNNI and AMX paths against the
 * measured tdpbssd peak of this core (K = 64 and K = 32 per tile op).
 *
 *   bench-qdot [rows K items reps]   (default 256 896 64 20)
 *
 * Not a test: docs/BENCHMARKS.md "AMX int8 tiles (issue 37)". */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ggml_qdot.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} cfg_t;

/* tmm0-3 C, tmm4/5 A/B for K = 64, tmm6/7 A/B for K = 32 */
static const cfg_t peak_cfg __attribute__((aligned(64))) = {
    1, 0, { 0 }, { 64, 64, 64, 64, 64, 64, 32, 64 }, { 16, 16, 16, 16, 16, 16, 16, 8 }
};

static double peak[2]; /* GMAC/s at K = 64, K = 32 */

__attribute__((target("amx-tile,amx-int8"))) static void *peak_thread(void *arg)
{
    (void)arg;
    static int8_t buf[16 * 64] __attribute__((aligned(64)));
    memset(buf, 1, sizeof buf);
    _tile_loadconfig(&peak_cfg);
    _tile_loadd(4, buf, 64);
    _tile_loadd(5, buf, 64);
    _tile_loadd(6, buf, 64);
    _tile_loadd(7, buf, 64);
    const long n = 2000000;
    for (int k = 0; k < 2; k++) {
        double best = 0;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now_s();
            for (long i = 0; i < n; i++) {
                if (k == 0) {
                    _tile_dpbssd(0, 4, 5);
                    _tile_dpbssd(1, 4, 5);
                    _tile_dpbssd(2, 4, 5);
                    _tile_dpbssd(3, 4, 5);
                } else {
                    _tile_dpbssd(0, 6, 7);
                    _tile_dpbssd(1, 6, 7);
                    _tile_dpbssd(2, 6, 7);
                    _tile_dpbssd(3, 6, 7);
                }
            }
            _tile_stored(0, buf, 64);
            double s = now_s() - t0, g = 4.0 * n * 16 * 16 * (k ? 32 : 64) / s / 1e9;
            if (g > best)
                best = g;
        }
        peak[k] = best;
    }
    _tile_release();
    return NULL;
}

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

int main(int argc, char **argv)
{
    uint32_t rows = argc > 1 ? (uint32_t)atoi(argv[1]) : 256;
    uint64_t K = argc > 2 ? (uint64_t)atoll(argv[2]) : 896;
    uint32_t ni = argc > 3 ? (uint32_t)atoi(argv[3]) : 64;
    int reps = argc > 4 ? atoi(argv[4]) : 20;
    if (rows % 16 || K % 32 || !ni || reps <= 0) {
        fprintf(stderr, "usage: bench-qdot [rows (x16) K (x32) items reps]\n");
        return 2;
    }
    const char *why = ggml_qdot_amx_why();
    if (why) {
        printf("no AMX: %s\n", why);
    } else {
        pthread_t th;
        pthread_create(&th, NULL, peak_thread, NULL);
        pthread_join(th, NULL);
        printf("tdpbssd peak, 1 thread: K=64 %.0f GMAC/s, K=32 %.0f GMAC/s\n", peak[0], peak[1]);
    }
    static const struct { uint32_t type; size_t bytes; const char *name; } types[] = {
        { GGML_TYPE_Q8_0, 34, "Q8_0" }, { GGML_TYPE_Q4_0, 18, "Q4_0" },
        { GGML_TYPE_Q4_1, 20, "Q4_1" }, { GGML_TYPE_IQ4_NL, 18, "IQ4_NL" },
        { GGML_TYPE_Q4_K, 144, "Q4_K" }, { GGML_TYPE_Q5_K, 176, "Q5_K" },
        { GGML_TYPE_Q6_K, 210, "Q6_K" },
    };
    float *x = malloc(K * sizeof *x), *w = malloc(K * sizeof *w);
    float *out = malloc((size_t)ni * rows * sizeof *out);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const int act = ggml_qdot_act(types[t].type);
        if (K % ggml_qdot_block(types[t].type))
            continue; /* K-quants: K a multiple of 256 */
        const uint64_t nb = K / ggml_qdot_block(types[t].type);
        const size_t ab = ggml_qdot_act_bytes(act, K);
        uint8_t *a = malloc(ni * ab);
        for (uint32_t i = 0; i < ni; i++) {
            for (uint64_t e = 0; e < K; e++)
                x[e] = frand();
            ggml_qdot_quantize(act, x, K, a + i * ab);
        }
        uint8_t *wq = malloc(rows * nb * types[t].bytes);
        for (uint32_t r = 0; r < rows; r++) {
            for (uint64_t e = 0; e < K; e++)
                w[e] = frand();
            ggml_quantize_row(types[t].type, w, wq + r * nb * types[t].bytes, K);
        }
        void *pk = NULL; /* Q6_K: none (its row kernels) */
        const size_t pb = ggml_qdot_pack_bytes(types[t].type, rows, K);
        if (pb && posix_memalign(&pk, 64, pb))
            return 1;
        if (pb)
            ggml_qdot_pack(types[t].type, wq, nb * types[t].bytes, rows, K, pk);
        printf("%-6s rows %u K %lu items %u:", types[t].name, rows, (unsigned long)K, ni);
        for (int p = GGML_QDOT_VNNI; p <= GGML_QDOT_AMX; p++) {
            if (ggml_qdot_set_path(p) != p)
                continue;
            double best = 1e30;
            for (int rep = 0; rep < reps; rep++) {
                double t0 = now_s();
                ggml_qdot_rows_packed(p, types[t].type, wq, nb * types[t].bytes, pk, 0, rows, K,
                                      a, ab, ni, out, rows);
                double s = now_s() - t0;
                if (s < best)
                    best = s;
            }
            printf("  %s %.1f GMAC/s", ggml_qdot_path_name(p), (double)rows * K * ni / best / 1e9);
        }
        printf("\n");
        free(pk);
        free(wq);
        free(a);
    }
    free(x);
    free(w);
    free(out);
    return 0;
}
