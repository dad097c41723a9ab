/* test_ep_ucx.c - the llama engine's expert parallelism across real
 * processes (issue 36): N forked ranks (2 and 4), each loading only its
 * experts of a generated qwen3moe (64 experts, top-8), exchange their MoE
 * dispatch and combine over kvxfer exchange windows (kvx_win.h, shm or
 * tcp); every prompt's and decode step's logits are bitwise those of one
 * model holding every expert (computed by the parent). Each rank prints
 * its expert bytes and VmRSS.
 *   test_ep_ucx shm|tcp [MODEL.gguf]   (no model: a small one is generated) */
#include "eng.h"
#include "ep_workload.h"
#include "eng_llama.h"
#include "ggml_types.h"
#include "kvx_win.h"
#include "ll_testmodel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define S 2
#define D EP_WL_D
#define NB EP_WL_NB

static const eng_ops_t *ops;
static const char *tls;




static eng_model_t *load(const char *path, uint32_t rank, uint32_t size)
{
    eng_load_opts_t o = { .engine = "llama", .model_path = path, .block_tokens = 16,
                          .kv_dtype = ENG_KV_F32, .n_threads = 1, .max_batch = 8,
                          .ep_rank = rank, .ep_size = size };
    eng_model_t *m = NULL;
    char err[256] = "";
    pd_status_t st = ops->load(&o, &m, err, sizeof(err));
    if (st != PD_OK)
        fprintf(stderr, "load %u/%u: %s (%s)\n", rank, size, pd_status_str(st), err);
    return m;
}


/* the engine's transport over a window: slot = phase */
static void *win_send_buf(void *ctx, eng_ep_phase_t ph, uint32_t peer)
{
    return kvx_win_send_buf(ctx, ph, peer);
}

static pd_status_t win_exchange(void *ctx, eng_ep_phase_t ph, uint32_t layer, const size_t *len,
                                const void **recv, size_t *recv_len)
{
    (void)layer;
    return kvx_win_exchange(ctx, ph, len, recv, recv_len);
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
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

static int rank_main(const char *path, uint32_t me, uint32_t N, int up, int down, float *out)
{
    eng_model_t *m = load(path, me, N);
    if (!m)
        return 2;
    eng_llama_info_t in;
    eng_llama_info(m, &in);
    long rss_load = rss_kib();
    kvx_win_config_t c = { .rank = me, .size = N, .n_slots = 2,
                           .slot_bytes = { in.ep_cap[0], in.ep_cap[1] },
                           .timeout_ns = 20000000000ull, .tls = tls,
                           .net_devices = strcmp(tls, "tcp") == 0 ? "lo" : NULL };
    kvx_win_h *w;
    if (kvx_win_create(&c, &w) != PD_OK)
        return 3;
    const void *meta;
    size_t ml;
    kvx_win_meta(w, &meta, &ml);
    uint32_t l32 = (uint32_t)ml;
    if (io_all(up, &l32, 4, 1) || io_all(up, (void *)meta, ml, 1))
        return 4;
    for (uint32_t p = 0; p < N; p++) {
        uint8_t buf[8192];
        if (io_all(down, &l32, 4, 0) || l32 > sizeof(buf) || io_all(down, buf, l32, 0))
            return 4;
        if (p != me && kvx_win_peer_add(w, p, buf, l32) != PD_OK)
            return 5;
    }
    eng_ep_xport_t x = { .ctx = w, .rank = me, .size = N,
                         .cap = { in.ep_cap[0], in.ep_cap[1] },
                         .send_buf = win_send_buf, .exchange = win_exchange };
    if (ops->set_ep(m, &x) != PD_OK)
        return 6;
    pd_status_t st = ep_wl_run(ops, m, me * S, S, ops->geometry(m)->vocab_size, out, (N - 1) * S);
    printf("%s ep %u rank %u: expert bytes %llu of %llu, VmRSS after load %ld KiB, after "
           "the run %ld KiB: %s\n", tls, N, me, (unsigned long long)in.expert_bytes_owned,
           (unsigned long long)in.expert_bytes_total, rss_load, rss_kib(), pd_status_str(st));
    fflush(stdout);
    kvx_win_destroy(w);
    ops->destroy(m);
    return st == PD_OK ? 0 : 7;
}

static int run_group(const char *path, uint32_t N)
{
    eng_model_t *whole = load(path, 0, 1);
    if (!whole)
        return 1;
    uint32_t vocab = ops->geometry(whole)->vocab_size;
    size_t rows = (size_t)N * S * (1 + D) * vocab;
    float *ref = calloc(rows, sizeof(float));
    float *got = mmap(NULL, rows * sizeof(float), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (!ref || got == MAP_FAILED || ep_wl_run(ops, whole, 0, N * S, vocab, ref, (N - 1) * S) != PD_OK)
        return 1;
    eng_llama_info_t wi;
    eng_llama_info(whole, &wi);
    printf("whole model: expert bytes %llu, VmRSS %ld KiB (parent, after its run)\n",
           (unsigned long long)wi.expert_bytes_total, rss_kib());
    ops->destroy(whole);
    int up[4][2], down[4][2];
    pid_t pid[4];
    fflush(stdout);
    for (uint32_t r = 0; r < N; r++) {
        if (pipe(up[r]) || pipe(down[r]))
            return 1;
        pid[r] = fork();
        if (pid[r] == 0) {
            alarm(60);
            _exit(rank_main(path, r, N, up[r][1], down[r][0], got));
        }
        close(up[r][1]);
        close(down[r][0]);
    }
    uint8_t *meta[4];
    uint32_t ml[4];
    for (uint32_t r = 0; r < N; r++)
        if (io_all(up[r][0], &ml[r], 4, 0) || ml[r] > 8192 || !(meta[r] = malloc(ml[r])) ||
            io_all(up[r][0], meta[r], ml[r], 0))
            return 1;
    for (uint32_t r = 0; r < N; r++)
        for (uint32_t p = 0; p < N; p++)
            if (io_all(down[r][1], &ml[p], 4, 1) || io_all(down[r][1], meta[p], ml[p], 1))
                return 1;
    int bad = 0;
    for (uint32_t r = 0; r < N; r++) {
        int ws;
        if (waitpid(pid[r], &ws, 0) != pid[r] || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            fprintf(stderr, "rank %u: status %#x\n", r, ws);
            bad++;
        }
        free(meta[r]);
        close(up[r][0]);
        close(down[r][1]);
    }
    size_t diff = 0;
    for (size_t i = 0; i < rows; i++)
        diff += memcmp(&ref[i], &got[i], sizeof(float)) != 0;
    printf("%s ep %u across processes: %zu logits, %zu differ\n", tls, N, rows, diff);
    free(ref);
    munmap(got, rows * sizeof(float));
    return bad || diff ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    tls = argv[1];
    ops = eng_find("llama");
    char dir[] = "/tmp/pd-test-ep-ucx-XXXXXX", path[300];
    const char *model = argc > 2 ? argv[2] : NULL;
    if (!model) {
        static const ll_tm_spec_t spec = {
            "qwen3moe", 64, 2, 4, 2, 96, 300, 256, 0, GGML_TYPE_Q8_0, false, false, 361,
            NULL, false, 0, 0, 0, 64, 8, 32 };
        if (!mkdtemp(dir))
            return 1;
        snprintf(path, sizeof(path), "%s/moe.gguf", dir);
        if (ll_tm_write(&spec, path) != 0)
            return 1;
        model = path;
    }
    int bad = run_group(model, 2) + run_group(model, 4);
    if (argc <= 2) {
        unlink(path);
        rmdir(dir);
    }
    return bad ? 1 : 0;
}
