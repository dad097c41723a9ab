/* test_mkmodel.c - pd-mkmodel as a process: reproducible bytes (golden
 * xxh64 of the tiny preset), every weight type and both archs read back
 * through the reader with the expected keys/shapes, quantized weights equal
 * the f32 ones within the type's error, bad flags exit 2 with one line.
 *   usage: test-mkmodel PATH/TO/pd-mkmodel   (or env PD_MKMODEL) */
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include <xxhash.h>
#include "gguf.h"

/* xxh64 (seed 0) of `pd-mkmodel --preset tiny` output. Changing the
 * generator changes every golden output downstream: update deliberately. */
#define TINY_GOLDEN_XXH64 0x6fa48cf4319ecd58ull

static const char *mkmodel;
static char tmpdir[] = "/tmp/pd-mkmodel-test-XXXXXX";

/* Run pd-mkmodel with args (NULL-terminated); capture stderr into errbuf.
 * Returns the exit status (or 128+signal). */
static int run(char *errbuf, size_t errlen, const char *first, ...)
{
    const char *argv[64];
    int n = 0, pipefd[2];
    va_list ap;

    argv[n++] = mkmodel;
    va_start(ap, first);
    for (const char *a = first; a != NULL && n < 63; a = va_arg(ap, const char *))
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        execv(mkmodel, (char *const *)argv);
        _exit(127);
    }
    close(pipefd[1]);
    size_t got = 0;
    ssize_t r;
    while ((r = read(pipefd[0], errbuf + got, errlen - 1 - got)) > 0)
        got += (size_t)r;
    errbuf[got] = '\0';
    close(pipefd[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *path_in_tmp(const char *name)
{
    static char buf[8][512];
    static int slot;
    char *p = buf[slot++ % 8];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static uint8_t *slurp(const char *path, size_t *size_p)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size_p = (size_t)n;
    return b;
}

static void test_reproducible(void **state)
{
    char err[1024];
    size_t n1, n2, n3;
    (void)state;
    char *a = path_in_tmp("a.gguf"), *b = path_in_tmp("b.gguf"), *c = path_in_tmp("c.gguf");
    assert_int_equal(run(err, sizeof(err), "--preset", "tiny", "-o", a, NULL), 0);
    assert_int_equal(run(err, sizeof(err), "-o", b, "--preset", "tiny", NULL), 0);
    assert_int_equal(run(err, sizeof(err), "--preset", "tiny", "--seed", "2", "-o", c, NULL), 0);
    uint8_t *x = slurp(a, &n1), *y = slurp(b, &n2), *z = slurp(c, &n3);
    assert_int_equal(n1, n2);
    assert_memory_equal(x, y, n1);
    assert_int_equal(n1, n3);
    assert_memory_not_equal(x, z, n1);
    unsigned long long h = XXH64(x, n1, 0);
    if (TINY_GOLDEN_XXH64 != 0 && h != TINY_GOLDEN_XXH64)
        fail_msg("tiny preset changed: xxh64 %016llx, golden %016llx", h,
                 (unsigned long long)TINY_GOLDEN_XXH64);
    printf("tiny preset xxh64 %016llx (%zu bytes)\n", h, n1);
    free(x);
    free(y);
    free(z);
}

static uint32_t get_u32(const gguf_t *g, const char *key)
{
    uint32_t v = 0;
    if (gguf_get_u32(g, key, &v) != PD_OK)
        fail_msg("missing u32 %s", key);
    return v;
}

/* --preset builtin (the n-gram model of /usr/share/common-licenses, which
 * Debian's Essential base-files always ships): same seed + corpus = same
 * bytes; another seed holds out other paragraphs; a gpt2 BPE vocab with
 * merges, ChatML, one layer. */
static void test_builtin_reproducible(void **state)
{
    char err[1024];
    size_t n1, n2, n3;
    (void)state;
    char *a = path_in_tmp("ba.gguf"), *b = path_in_tmp("bb.gguf"), *c = path_in_tmp("bc.gguf");
    assert_int_equal(run(err, sizeof(err), "--preset", "builtin", "-o", a, NULL), 0);
    assert_int_equal(run(err, sizeof(err), "-o", b, "--preset", "builtin", NULL), 0);
    assert_int_equal(run(err, sizeof(err), "--preset", "builtin", "--seed", "2", "-o", c, NULL), 0);
    uint8_t *x = slurp(a, &n1), *y = slurp(b, &n2), *z = slurp(c, &n3);
    assert_int_equal(n1, n2);
    assert_memory_equal(x, y, n1);
    assert_true(n1 != n3 || memcmp(x, z, n1) != 0);
    assert_true(n1 < (32u << 20)); /* tens of MB at most */
    free(x);
    free(y);
    free(z);

    gguf_t *g;
    const char *s;
    uint64_t len;
    const gguf_arr_t *toks, *merges;
    assert_int_equal(gguf_open(a, &g, err, sizeof(err)), PD_OK);
    assert_int_equal(gguf_get_string(g, "general.architecture", &s, &len), PD_OK);
    assert_true(len == 5 && memcmp(s, "llama", 5) == 0);
    assert_int_equal(gguf_get_string(g, "tokenizer.ggml.model", &s, &len), PD_OK);
    assert_true(len == 4 && memcmp(s, "gpt2", 4) == 0);
    assert_int_equal(gguf_get_string(g, "tokenizer.chat_template", &s, &len), PD_OK);
    assert_non_null(memmem(s, len, "<|im_start|>", 12));
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks), PD_OK);
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges), PD_OK);
    assert_true(merges->count >= 200);
    assert_int_equal(toks->count, get_u32(g, "llama.vocab_size"));
    assert_int_equal(get_u32(g, "llama.block_count"), 1);
    const gguf_tensor_t *out = gguf_tensor_find(g, "output.weight");
    assert_non_null(out);
    assert_int_equal(out->ne[1], toks->count);
    gguf_close(g);

    /* a corpus with too little text is refused with exit 1 */
    char *dir = path_in_tmp("tiny-corpus");
    assert_int_equal(mkdir(dir, 0700), 0);
    char *f = path_in_tmp("tiny-corpus/one");
    FILE *fp = fopen(f, "w");
    assert_non_null(fp);
    fputs("Just one paragraph.\n\nAnd a second one.\n", fp);
    fclose(fp);
    int rc = run(err, sizeof(err), "--preset", "builtin", "--corpus", dir, "-o", c, NULL);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "too little text"));
    unlink(f);
    rmdir(dir);
}

static const gguf_tensor_t *tensor(const gguf_t *g, const char *name, uint32_t type,
                                   uint64_t ne0, uint64_t ne1)
{
    const gguf_tensor_t *t = gguf_tensor_find(g, name);
    if (t == NULL)
        fail_msg("missing tensor %s", name);
    if (t->type != type || t->ne[0] != ne0 || t->ne[1] != ne1)
        fail_msg("tensor %s: type %s ne %llu x %llu, want %s %llu x %llu", name,
                 ggml_type_name(t->type), (unsigned long long)t->ne[0],
                 (unsigned long long)t->ne[1], ggml_type_name(type),
                 (unsigned long long)ne0, (unsigned long long)ne1);
    return t;
}

/* Mean |a-b| / mean |a| over a tensor pair. */
static double rel_err(const gguf_tensor_t *ref, const gguf_tensor_t *q)
{
    float *a = malloc(ref->n_elements * sizeof(float));
    float *b = malloc(q->n_elements * sizeof(float));
    double num = 0, den = 0;
    assert_int_equal(ggml_dequantize_row(ref->type, ref->data, a, ref->n_elements), PD_OK);
    assert_int_equal(ggml_dequantize_row(q->type, q->data, b, q->n_elements), PD_OK);
    for (uint64_t i = 0; i < ref->n_elements; i++) {
        num += fabs((double)a[i] - b[i]);
        den += fabs((double)a[i]);
    }
    free(a);
    free(b);
    return num / den;
}

static void check_model(const char *path, const char *arch, uint32_t type, bool tied,
                        const gguf_t *ref)
{
    gguf_t *g;
    char err[256], key[128];
    const char *s;
    uint64_t len;

    assert_int_equal(gguf_open(path, &g, err, sizeof(err)), PD_OK);
    assert_int_equal(gguf_get_string(g, "general.architecture", &s, &len), PD_OK);
    assert_int_equal(len, strlen(arch));
    assert_memory_equal(s, arch, len);
#define K(suffix) (snprintf(key, sizeof(key), "%s." suffix, arch), key)
    uint32_t dim = get_u32(g, K("embedding_length"));
    uint32_t layers = get_u32(g, K("block_count"));
    uint32_t heads = get_u32(g, K("attention.head_count"));
    uint32_t kv = get_u32(g, K("attention.head_count_kv"));
    uint32_t ffn = get_u32(g, K("feed_forward_length"));
    uint32_t vocab = get_u32(g, K("vocab_size"));
    assert_int_equal(get_u32(g, K("rope.dimension_count")), dim / heads);
    float eps;
    assert_int_equal(gguf_get_f32(g, K("attention.layer_norm_rms_epsilon"), &eps), PD_OK);
#undef K
    assert_int_equal(dim, 64);
    assert_int_equal(layers, 2);
    uint32_t kv_dim = dim / heads * kv;
    const gguf_arr_t *toks;
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks), PD_OK);
    assert_int_equal(toks->count, vocab);
    s = gguf_arr_str(toks, 258, &len);
    assert_int_equal(len, strlen("<|im_end|>"));
    assert_memory_equal(s, "<|im_end|>", len);
    assert_int_equal(get_u32(g, "tokenizer.ggml.eos_token_id"), 258);

    tensor(g, "token_embd.weight", type, dim, vocab);
    tensor(g, "output_norm.weight", GGML_TYPE_F32, dim, 1);
    if (tied)
        assert_null(gguf_tensor_find(g, "output.weight"));
    else
        tensor(g, "output.weight", type, dim, vocab);
    uint64_t expect = 2 + !tied;
    for (uint32_t l = 0; l < layers; l++) {
        char n[64];
#define T(sfx, ty, a, b) (snprintf(n, sizeof(n), "blk.%u." sfx, l), tensor(g, n, ty, a, b))
        T("attn_norm.weight", GGML_TYPE_F32, dim, 1);
        T("attn_q.weight", type, dim, dim);
        T("attn_k.weight", type, dim, kv_dim);
        T("attn_v.weight", type, dim, kv_dim);
        T("attn_output.weight", type, dim, dim);
        T("ffn_norm.weight", GGML_TYPE_F32, dim, 1);
        T("ffn_gate.weight", type, dim, ffn);
        T("ffn_up.weight", type, dim, ffn);
        T("ffn_down.weight", type, ffn, dim);
        expect += 9;
        if (strcmp(arch, "qwen2") == 0) {
            T("attn_q.bias", GGML_TYPE_F32, dim, 1);
            T("attn_k.bias", GGML_TYPE_F32, kv_dim, 1);
            T("attn_v.bias", GGML_TYPE_F32, kv_dim, 1);
            expect += 3;
        } else {
            snprintf(n, sizeof(n), "blk.%u.attn_q.bias", l);
            assert_null(gguf_tensor_find(g, n));
        }
#undef T
    }
    assert_int_equal(gguf_tensor_count(g), expect);
    if (ref != NULL) {
        /* same seed: the quantized weights approximate the f32 ones */
        static const double tol[GGML_TYPE_COUNT] = {
            [GGML_TYPE_F32] = 0, [GGML_TYPE_F16] = 0.001, [GGML_TYPE_BF16] = 0.005,
            [GGML_TYPE_Q8_0] = 0.01, [GGML_TYPE_Q4_0] = 0.15};
        for (uint64_t i = 0; i < gguf_tensor_count(g); i++) {
            const gguf_tensor_t *t = gguf_tensor_at(g, i);
            const gguf_tensor_t *r = gguf_tensor_find(ref, t->name);
            assert_non_null(r);
            double e = rel_err(r, t);
            if (e > tol[type])
                fail_msg("%s: %s rel err %g > %g", t->name, ggml_type_name(type), e, tol[type]);
            if (t->type == GGML_TYPE_F32)
                assert_memory_equal(t->data, r->data, t->n_bytes);
        }
    }
    gguf_close(g);
}

static void test_types_and_archs(void **state)
{
    static const char *const types[] = {"f32", "f16", "bf16", "q8_0", "q4_0"};
    static const uint32_t ids[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16,
                                   GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    char err[1024];
    gguf_t *ref = NULL;
    (void)state;

    for (int arch = 0; arch < 2; arch++) {
        const char *a = arch ? "qwen2" : "llama";
        for (size_t t = 0; t < 5; t++) {
            char *p = path_in_tmp("m.gguf");
            const char *tied = t % 2 ? "--tied" : "--untied";
            int rc = run(err, sizeof(err), "--preset", "tiny", "--arch", a, "--type", types[t],
                         "--untied", "-o", p, NULL);
            if (rc != 0)
                fail_msg("pd-mkmodel %s %s: exit %d: %s", a, types[t], rc, err);
            if (t == 0) {
                char *rp = path_in_tmp(arch ? "ref-qwen2.gguf" : "ref-llama.gguf");
                assert_int_equal(rename(p, rp), 0);
                gguf_close(ref);
                char e2[256];
                assert_int_equal(gguf_open(rp, &ref, e2, sizeof(e2)), PD_OK);
                check_model(rp, a, ids[t], false, NULL);
            } else {
                check_model(p, a, ids[t], false, ref);
            }
            /* tied variant just has no output.weight */
            rc = run(err, sizeof(err), "--preset", "tiny", "--arch", a, "--type", types[t],
                     tied, "-o", p, NULL);
            assert_int_equal(rc, 0);
            check_model(p, a, ids[t], t % 2, NULL);
        }
    }
    gguf_close(ref);
}

static void test_vocab_from(void **state)
{
    char err[1024];
    char *src = path_in_tmp("src.gguf"), *dst = path_in_tmp("dst.gguf");
    gguf_t *a, *b;
    (void)state;
    assert_int_equal(run(err, sizeof(err), "--preset", "tiny", "--vocab", "300", "-o", src, NULL), 0);
    assert_int_equal(run(err, sizeof(err), "--preset", "tiny", "--arch", "qwen2", "--vocab-from",
                         src, "-o", dst, NULL), 0);
    assert_int_equal(gguf_open(src, &a, err, sizeof(err)), PD_OK);
    assert_int_equal(gguf_open(dst, &b, err, sizeof(err)), PD_OK);
    assert_int_equal(get_u32(b, "qwen2.vocab_size"), 300);
    int n = 0;
    for (uint64_t i = 0; i < gguf_kv_count(a); i++) {
        const gguf_kv_t *kv = gguf_kv_at(a, i);
        if (strncmp(kv->key, "tokenizer.", 10) != 0)
            continue;
        const gguf_kv_t *kb = gguf_kv_find(b, kv->key);
        assert_non_null(kb);
        assert_int_equal(kv->type, kb->type);
        n++;
    }
    assert_true(n >= 10);
    const gguf_arr_t *t;
    uint64_t len;
    assert_int_equal(gguf_get_arr(b, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &t), PD_OK);
    assert_int_equal(t->count, 300);
    assert_memory_equal(gguf_arr_str(t, 299, &len), "<unused_39>", 11);
    assert_non_null(gguf_tensor_find(b, "blk.0.attn_q.bias"));
    gguf_close(a);
    gguf_close(b);
}

static void expect_usage_error(const char *msg, const char *a1, const char *a2, const char *a3,
                               const char *a4)
{
    char err[1024];
    int rc = run(err, sizeof(err), a1, a2, a3, a4, NULL);
    if (rc != 2 || strstr(err, msg) == NULL)
        fail_msg("args %s %s %s %s: exit %d stderr '%s', want 2 '%s'", a1, a2 ? a2 : "",
                 a3 ? a3 : "", a4 ? a4 : "", rc, err, msg);
    /* exactly one line */
    char *nl = strchr(err, '\n');
    assert_non_null(nl);
    assert_int_equal(nl[1], '\0');
}

static void test_bad_flags(void **state)
{
    char *o = path_in_tmp("bad.gguf");
    (void)state;
    expect_usage_error("missing -o", "--preset", "tiny", NULL, NULL);
    expect_usage_error("unknown --preset 'huge'", "--preset", "huge", "-o", o);
    expect_usage_error("--type 'iq2_xs'", "--type", "iq2_xs", "-o", o);
    expect_usage_error("--kv-heads 3 must divide --heads 8", "--kv-heads", "3", "-o", o);
    expect_usage_error("--dim 250 is not a multiple", "--dim", "250", "-o", o);
    expect_usage_error("--dim: '12x'", "--dim", "12x", "-o", o);
    expect_usage_error("--layers: 0 outside", "--layers", "0", "-o", o);
    expect_usage_error("--layers: '-1'", "--layers", "-1", "-o", o);
    expect_usage_error("--vocab 100: byte vocab needs >= 260", "--vocab", "100", "-o", o);
    expect_usage_error("--arch 'gpt2'", "--arch", "gpt2", "-o", o);
    expect_usage_error("--rope-base: 'nan'", "--rope-base", "nan", "-o", o);
    expect_usage_error("--alignment 48 is not a power of two", "--alignment", "48", "-o", o);
    expect_usage_error("needs --dim, --ffn, --expert-ffn and heads*head_dim multiples of 32", "--type", "q8_0", "--ffn", "100");
    expect_usage_error("bad option", "--bogus", "-o", o, NULL);
    expect_usage_error("unexpected argument 'extra'", "-o", o, "extra", NULL);
    expect_usage_error("only --seed, --corpus, --name and -o apply", "--preset", "builtin",
                       "--layers", "2");
    expect_usage_error("--corpus only applies to --preset builtin", "--corpus", "/tmp", "-o", o);
    assert_int_equal(access(o, F_OK), -1);

    /* runtime failure: exit 1, one line, no partial output file left */
    char err[1024];
    int rc = run(err, sizeof(err), "--preset", "builtin", "--corpus", "/nonexistent-dir", "-o", o,
                 NULL);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "corpus /nonexistent-dir"));
    assert_int_equal(access(o, F_OK), -1);
    rc = run(err, sizeof(err), "--preset", "tiny", "-o", "/nonexistent-dir/x.gguf", NULL);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "/nonexistent-dir/x.gguf"));
    rc = run(err, sizeof(err), "--preset", "tiny", "--vocab-from", "/nonexistent.gguf", "-o", o,
             NULL);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "--vocab-from /nonexistent.gguf"));
    assert_int_equal(access(o, F_OK), -1);
}

static int teardown(void **state)
{
    char cmd[600];
    (void)state;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    mkmodel = argc > 1 ? argv[1] : getenv("PD_MKMODEL");
    if (mkmodel == NULL) {
        fprintf(stderr, "usage: test-mkmodel PATH/TO/pd-mkmodel\n");
        return 2;
    }
    if (mkdtemp(tmpdir) == NULL)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reproducible),
        cmocka_unit_test(test_builtin_reproducible),
        cmocka_unit_test(test_types_and_archs),
        cmocka_unit_test(test_vocab_from),
        cmocka_unit_test(test_bad_flags),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
