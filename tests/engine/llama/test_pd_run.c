/* test_pd_run.c - pd-run (a real child process) is the reference path the
 * serving tests compare against: its --tokens-out ids must equal a greedy
 * loop over the engine in this process, whatever --threads, --block-tokens
 * or --kv (f16 here; f32 only changes numerics, so it is compared with
 * itself), and seeded sampling must repeat. argv: pd-run path, model path. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eng.h"

static const char *pd_run, *model;

/* Run pd-run with extra args; parse the ids line. Returns the count. */
static int run_ids(const char *extra, int32_t *ids, int cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "'%s' --model '%s' --tokens-out %s 2>/dev/null", pd_run, model,
             extra);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char line[8192] = "";
    char *ok = fgets(line, sizeof(line), f);
    int rc = pclose(f);
    assert_non_null(ok);
    assert_int_equal(rc, 0);
    int n = 0;
    char *s = line;
    while (n < cap) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s)
            break;
        ids[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

static void test_matches_engine(void **state)
{
    (void)state;
    enum { N = 12 };
    int32_t a[64], b[64], c[64];
    int na = run_ids("--tokens 1,2,3,4,5 --max-tokens 12 --threads 1 --ignore-eos", a, 64);
    int nb = run_ids("--tokens 1,2,3,4,5 --max-tokens 12 --threads 2 --block-tokens 4 "
                     "--ignore-eos", b, 64);
    assert_int_equal(na, N);
    assert_int_equal(nb, N);
    assert_memory_equal(a, b, N * sizeof(int32_t));

    /* in-process greedy over the same engine */
    const eng_ops_t *ops = eng_find("llama");
    eng_load_opts_t lo = { "llama", model, 16, ENG_KV_F16, 1, 1 };
    eng_model_t *m;
    char err[200];
    assert_int_equal(ops->load(&lo, &m, err, sizeof(err)), PD_OK);
    const eng_kv_geom_t *g = ops->geometry(m);
    uint32_t bt[2] = { 0, 1 };
    void *arena = calloc(2, g->block_bytes);
    float *lg = malloc(g->vocab_size * sizeof(float));
    int32_t prompt[5] = { 1, 2, 3, 4, 5 };
    assert_int_equal(ops->prefill(m, arena, bt, 2, prompt, 5, 0, lg), PD_OK);
    for (uint32_t i = 0; i < N; i++) {
        uint32_t best = 0;
        for (uint32_t v = 1; v < g->vocab_size; v++)
            if (lg[v] > lg[best])
                best = v;
        c[i] = (int32_t)best;
        eng_decode_item_t it = { bt, 2, 5 + i, c[i] };
        assert_int_equal(ops->decode(m, arena, &it, 1, lg), PD_OK);
    }
    assert_memory_equal(a, c, N * sizeof(int32_t));
    free(arena);
    free(lg);
    ops->destroy(m);

    /* seeded sampling repeats; f32 KV runs */
    na = run_ids("--tokens 7,8,9 --max-tokens 10 --temperature 0.9 --top-p 0.9 --seed 42 "
                 "--ignore-eos", a, 64);
    nb = run_ids("--tokens 7,8,9 --max-tokens 10 --temperature 0.9 --top-p 0.9 --seed 42 "
                 "--ignore-eos --threads 2 --kv f32", b, 64);
    int nc = run_ids("--tokens 7,8,9 --max-tokens 10 --temperature 0.9 --top-p 0.9 --seed 42 "
                     "--ignore-eos --threads 1 --kv f32", c, 64);
    assert_int_equal(na, 10);
    assert_int_equal(nb, 10);
    assert_int_equal(nc, 10);
    assert_memory_equal(b, c, 10 * sizeof(int32_t));
}

static void test_text_mode_and_usage(void **state)
{
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "'%s' --model '%s' --prompt 'Hello' --max-tokens 5 "
             ">/dev/null 2>&1", pd_run, model);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof(cmd), "'%s' --model '%s' >/dev/null 2>&1", pd_run, model);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof(cmd), "'%s' --model /nonexistent.gguf --tokens 1 >/dev/null 2>&1",
             pd_run);
    assert_int_equal(WEXITSTATUS(system(cmd)), 1);
}

/* --score N (issue 32's accuracy tool): teacher forcing over greedy output
 * gives back its logprobs and its argmaxes. */
static void test_score(void **state)
{
    (void)state;
    enum { N = 8 };
    char cmd[1024], line[8192];
    snprintf(cmd, sizeof(cmd), "'%s' --model '%s' --tokens 1,2,3,4,5 --max-tokens %d --ignore-eos "
             "--tokens-out --logprobs-out 0 2>/dev/null", pd_run, model, N);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    int32_t g[N];
    double lp_sum = 0;
    int ng = 0, nlp = 0;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "#lp ", 4) == 0) {
            int id;
            double lp;
            assert_int_equal(sscanf(line + 4, "%d %lf", &id, &lp), 2);
            assert_true(nlp < N && id == g[nlp]);
            lp_sum += lp;
            nlp++;
        } else if (ng == 0) {
            char *s = line, *end;
            for (long v; ng < N && (v = strtol(s, &end, 10), end != s); s = end)
                g[ng++] = (int32_t)v;
        }
    }
    assert_int_equal(pclose(f), 0);
    assert_int_equal(ng, N);
    assert_int_equal(nlp, N);
    char toks[256] = "1,2,3,4,5", path[] = "/tmp/pd-run-score-XXXXXX";
    for (int i = 0; i < N; i++)
        snprintf(toks + strlen(toks), sizeof(toks) - strlen(toks), ",%d", g[i]);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof(cmd), "'%s' --model '%s' --tokens %s --score %d --logits-out %s "
             "--threads 2 2>/dev/null", pd_run, model, toks, N, path);
    f = popen(cmd, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof(line), f));
    assert_int_equal(pclose(f), 0);
    unsigned tokens, scored, vocab;
    double nll;
    assert_int_equal(sscanf(line, "{\"tokens\": %u, \"scored\": %u, \"vocab\": %u, \"nll\": %lf",
                            &tokens, &scored, &vocab, &nll), 4);
    assert_int_equal(tokens, 5 + N);
    assert_int_equal(scored, N);
    assert_true(fabs(nll + lp_sum) < 1e-4 * (1 + fabs(nll)));
    /* N rows of raw logits, each one's argmax the greedy token */
    f = fopen(path, "rb");
    assert_non_null(f);
    float *lg = malloc((size_t)vocab * sizeof(float));
    for (int i = 0; i < N; i++) {
        assert_int_equal(fread(lg, sizeof(float), vocab, f), vocab);
        uint32_t best = 0;
        for (uint32_t v = 1; v < vocab; v++)
            if (lg[v] > lg[best])
                best = v;
        assert_int_equal((int32_t)best, g[i]);
    }
    assert_int_equal(fread(lg, 1, 1, f), 0);
    fclose(f);
    free(lg);
    unlink(path);
    /* N must leave a token to predict from */
    snprintf(cmd, sizeof(cmd), "'%s' --model '%s' --tokens 1,2,3 --score 3 >/dev/null 2>&1",
             pd_run, model);
    assert_int_equal(WEXITSTATUS(system(cmd)), 1);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: test-pd-run PD_RUN MODEL\n");
        return 2;
    }
    pd_run = argv[1];
    model = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_engine),
        cmocka_unit_test(test_text_mode_and_usage),
        cmocka_unit_test(test_score),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
