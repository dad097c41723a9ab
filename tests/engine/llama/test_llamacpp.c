/* test_llamacpp.c - pdserve's llama engine against llama.cpp itself (the
 * prebuilt CPU build in the npm package node-llama-cpp, run by
 * node/llref.mjs in its own process) on the same GGUF files:
 *
 *  A. f32 / f16 models of every architecture (pd-mkmodel): logits within a
 *     tolerance at every one of NGEN steps on several prompts, llama.cpp
 *     teacher-forced on pdserve's greedy tokens (the same history at every
 *     step); free-running greedy tokens equal up to the first near-tie - a
 *     step whose top-2 margin in pdserve's logits is below twice the two
 *     engines' measured logit disagreement, which each engine may break
 *     its own way (llama.cpp's f16 and GELU paths differ per CPU variant);
 *  B. quantized models of every type and preset mix written by pd-mkmodel,
 *  C. the same f32 models quantized by llama.cpp's own quantizer (llq: the
 *     llama_model_quantize function llama-quantize calls) to every preset:
 *     both engines against the f64 reference forward pass of the
 *     dequantized weights (ll_testmodel.c) - pdserve must be at least as
 *     close as llama.cpp (per file when pdserve is exact; per dense file
 *     within QDOT_CASE on the mean over the logit rows, and summed over all
 *     files, when it rounds activations
 *     for its integer dot as llama.cpp does), and llama.cpp must be close
 *     too (so pdserve decodes the blocks as ggml does). C also checks the
 *     files load.
 *
 * usage: test-llamacpp PD_MKMODEL LLQ LIBLLAMA NODE_DIR [filter]
 * Run through run_llamacpp.sh, which installs the npm package first. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eng.h"
#include "ggml_qdot.h"
#include "gguf.h"
#include "ll_testmodel.h"

#define NGEN 32
#define NPROMPT 3
#define MAXV 512

static const char *mkmodel, *llq, *libllama, *nodedir, *filter;
/* LLREF_SEED=N: every model from weight seed N: other draws of the B / C
 * statistics (case A's tolerances and token equality hold for the default
 * weights; other seeds can flip a near-tie) */
static char seed_arg[48];
static char libggml_base[1024];
static char tmpdir[256];
static int failures;

static const int32_t prompts[NPROMPT][8] = {
    { 256, 'H', 'e', 'l', 'l', 'o', ',', ' ' },
    { 256, 'T', 'h', 'e', ' ', 'c', 'a', 't' },
    { 256, '1', '+', '1', '=' },
};
static const uint32_t prompt_len[NPROMPT] = { 8, 8, 5 };

typedef struct {
    int32_t tok[NPROMPT][NGEN];
    float lg[NPROMPT][NGEN][MAXV];
    float tf[NPROMPT][NGEN][MAXV]; /* llama.cpp teacher-forced (run_llamacpp's forced) */
    uint32_t vocab;
} run_t;

static int sh(const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "FAILED (%d): %s\n", rc, cmd);
    return rc;
}

/* llama.cpp via node: tokens and logits of NGEN greedy steps per prompt;
 * with `forced`, also r->tf: the logits on forced's tokens as history. */
static int ngen = NGEN; /* steps of the current case */

static void json_row(cJSON *row, float *out, run_t *r)
{
    int n = cJSON_GetArraySize(row);
    r->vocab = (uint32_t)n;
    for (int v = 0; v < n && v < MAXV; v++) {
        cJSON *x = cJSON_GetArrayItem(row, v);
        out[v] = cJSON_IsNumber(x) ? (float)x->valuedouble : NAN;
    }
}

static void json_tokens(char *arr, size_t cap, const int32_t *const *rows, const uint32_t *lens)
{
    size_t off = (size_t)snprintf(arr, cap, "[");
    for (int p = 0; p < NPROMPT; p++) {
        off += (size_t)snprintf(arr + off, cap - off, "%s[", p ? "," : "");
        for (uint32_t i = 0; i < lens[p]; i++)
            off += (size_t)snprintf(arr + off, cap - off, "%s%d", i ? "," : "", rows[p][i]);
        off += (size_t)snprintf(arr + off, cap - off, "]");
    }
    snprintf(arr + off, cap - off, "]");
}

static int run_llamacpp(const char *model, run_t *r, const run_t *forced)
{
    char cmd[4096], arr[512], farr[1536] = "";
    const int32_t *rows[NPROMPT];
    uint32_t flen[NPROMPT];
    for (int p = 0; p < NPROMPT; p++)
        rows[p] = prompts[p];
    json_tokens(arr, sizeof(arr), rows, prompt_len);
    if (forced) {
        for (int p = 0; p < NPROMPT; p++) {
            rows[p] = forced->tok[p];
            flen[p] = (uint32_t)ngen;
        }
        json_tokens(farr, sizeof(farr), rows, flen);
    }
    snprintf(cmd, sizeof(cmd), "node '%s/llref.mjs' '%s' %d '%s' '%s'", nodedir, model, ngen,
             arr, farr);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    size_t cap = 1 << 24;
    char *line = malloc(cap);
    int got = 0;
    while (line && fgets(line, (int)cap, f)) {
        cJSON *j = cJSON_Parse(line);
        if (!j)
            continue;
        int p = cJSON_GetObjectItem(j, "prompt")->valueint;
        cJSON *toks = cJSON_GetObjectItem(j, "tokens");
        cJSON *lgs = cJSON_GetObjectItem(j, "logits");
        cJSON *tfs = cJSON_GetObjectItem(j, "tf_logits");
        for (int s = 0; s < ngen; s++) {
            r->tok[p][s] = cJSON_GetArrayItem(toks, s)->valueint;
            json_row(cJSON_GetArrayItem(lgs, s), r->lg[p][s], r);
            if (forced)
                json_row(cJSON_GetArrayItem(tfs, s), r->tf[p][s], r);
        }
        cJSON_Delete(j);
        got++;
    }
    free(line);
    int rc = pclose(f);
    if (rc != 0 || got != NPROMPT) {
        fprintf(stderr, "llama.cpp failed on %s (rc %d, %d results)\n", model, rc, got);
        return -1;
    }
    return 0;
}

/* pdserve: the same greedy loop (ties to the lower id), f32 KV as
 * llref.mjs asks of llama.cpp. With `forced`, the next input is forced's
 * token (teacher forcing), r->tok still pdserve's own choice. */
static int run_pdserve(const char *model, run_t *r, const run_t *forced)
{
    const eng_ops_t *ops = eng_find("llama");
    eng_load_opts_t o = { "llama", model, 16, ENG_KV_F32, 2, 4 };
    eng_model_t *m = NULL;
    char err[256] = "";
    if (ops->load(&o, &m, err, sizeof(err)) != PD_OK) {
        fprintf(stderr, "pdserve cannot load %s: %s\n", model, err);
        return -1;
    }
    const eng_kv_geom_t *g = ops->geometry(m);
    r->vocab = g->vocab_size;
    uint32_t nb = 4, bt[4] = { 3, 0, 2, 1 };
    void *arena = calloc(nb, g->block_bytes);
    float *lg = malloc(g->vocab_size * sizeof(float));
    for (int p = 0; p < NPROMPT; p++) {
        int st = ops->prefill(m, arena, bt, nb, prompts[p], prompt_len[p], 0, lg);
        for (int s = 0; s < ngen && st == PD_OK; s++) {
            int32_t best = 0;
            for (uint32_t v = 0; v < g->vocab_size; v++) {
                if (v < MAXV)
                    r->lg[p][s][v] = lg[v];
                if (lg[v] > lg[best])
                    best = (int32_t)v;
            }
            r->tok[p][s] = best;
            eng_decode_item_t it = { bt, nb, prompt_len[p] + (uint32_t)s,
                                     forced ? forced->tok[p][s] : best };
            if (s + 1 < ngen)
                st = ops->decode(m, arena, &it, 1, lg);
        }
        if (st != PD_OK) {
            fprintf(stderr, "pdserve run failed on %s\n", model);
            return -1;
        }
    }
    free(arena);
    free(lg);
    ops->destroy(m);
    return 0;
}

static double rel_err(const float *a, const double *ref, uint32_t n)
{
    double mx = 1e-9, e = 0;
    for (uint32_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(ref[i]));
        e = fmax(e, fabs((double)a[i] - ref[i]));
    }
    return e / mx;
}

static double rel_err_f(const float *a, const float *b, uint32_t n)
{
    double mx = 1e-9, e = 0;
    for (uint32_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs((double)b[i]));
        e = fmax(e, fabs((double)a[i] - b[i]));
    }
    return e / mx;
}

static int want(const char *tag)
{
    return !filter || strstr(tag, filter) != NULL;
}

static run_t ra, rb;

/* top-1 minus top-2 of a logit row */
static double top2_margin(const float *lg, uint32_t n)
{
    double t1 = -INFINITY, t2 = -INFINITY;
    for (uint32_t v = 0; v < n; v++) {
        if (lg[v] > t1) {
            t2 = t1;
            t1 = lg[v];
        } else if (lg[v] > t2)
            t2 = lg[v];
    }
    return t1 - t2;
}

static double max_abs_diff(const float *a, const float *b, uint32_t n)
{
    double e = 0;
    for (uint32_t v = 0; v < n; v++)
        e = fmax(e, fabs((double)a[v] - b[v]));
    return e;
}

/* A: pdserve greedy-generates; llama.cpp runs free and teacher-forced on
 * pdserve's tokens. Checked:
 *  - logits: llama.cpp's teacher-forced logits vs pdserve's at every step
 *    (the same history), relative error <= tol;
 *  - tokens: the two free-running greedy sequences are equal up to each
 *    prompt's first near-tie: a step whose top-2 margin in pdserve's
 *    logits is below 2 D, D the measured disagreement (max |logit
 *    difference| over every row both engines computed on the same history).
 *    At a near-tie the engines may pick differently - which one wins
 *    depends on the CPU variant llama.cpp runs (seen: gemma3 f16 on
 *    sapphirerapids, margin 1.3e-4) - so the sequences are compared no
 *    further; the teacher-forced logits cover the rest. A difference
 *    before the first near-tie fails. */
static void case_exact(const char *tag, const char *args, double tol)
{
    if (!want(tag))
        return;
    char path[512], cmd[1536];
    snprintf(path, sizeof(path), "%s/%s.gguf", tmpdir, tag);
    snprintf(cmd, sizeof(cmd), "'%s' %s%s --vocab-type spm -o '%s' >/dev/null", mkmodel, args, seed_arg, path);
    if (sh(cmd) || run_pdserve(path, &rb, NULL) || run_llamacpp(path, &ra, &rb)) {
        failures++;
        return;
    }
    uint32_t nv = ra.vocab < MAXV ? ra.vocab : MAXV;
    double worst = 0, dis = 0;
    int diverge[NPROMPT], tie[NPROMPT];
    for (int p = 0; p < NPROMPT; p++) {
        diverge[p] = tie[p] = NGEN;
        for (int s = 0; s < NGEN; s++) {
            worst = fmax(worst, rel_err_f(rb.lg[p][s], ra.tf[p][s], nv));
            dis = fmax(dis, max_abs_diff(rb.lg[p][s], ra.tf[p][s], nv));
            if (diverge[p] == NGEN) /* free-running rows on the same history too */
                dis = fmax(dis, max_abs_diff(rb.lg[p][s], ra.lg[p][s], nv));
            if (diverge[p] == NGEN && ra.tok[p][s] != rb.tok[p][s])
                diverge[p] = s;
        }
    }
    int compared = 0, ties = 0, early = -1;
    for (int p = 0; p < NPROMPT; p++) {
        for (int s = 0; s < NGEN; s++)
            if (top2_margin(rb.lg[p][s], nv) < 2 * dis) {
                tie[p] = s;
                break;
            }
        ties += tie[p] < NGEN;
        compared += tie[p] < NGEN ? tie[p] + 1 : NGEN;
        if (diverge[p] < tie[p] && early < 0)
            early = p;
    }
    int ok = early < 0 && worst <= tol && ra.vocab == rb.vocab;
    printf("%-5s A %-28s logits rel err %.3g (tol %.3g), teacher-forced %d x %d; free-running "
           "tokens %s over %d steps (%d near-tie stops, D %.3g)\n", ok ? "ok" : "FAIL", tag,
           worst, tol, NPROMPT, NGEN, early < 0 ? "equal" : "DIFFER", compared, ties, dis);
    for (int p = 0; p < NPROMPT; p++) {
        int st = diverge[p];
        if (st == NGEN)
            continue;
        printf("      prompt %d: first difference at step %d%s: llama.cpp %d, pdserve %d; pdserve "
               "logits %.6f vs %.6f (margin %.3g), first near-tie step %d\n", p, st,
               st < tie[p] ? " BEFORE a near-tie" : "", ra.tok[p][st], rb.tok[p][st],
               rb.lg[p][st][rb.tok[p][st]], rb.lg[p][st][ra.tok[p][st]],
               top2_margin(rb.lg[p][st], nv), tie[p]);
    }
    failures += !ok;
}

/* per-case allowance of pdserve's error over llama.cpp's when both round
 * activations to 8 bits (see compare_ref) */
#define QDOT_CASE 1.5
/* allowance on the sums over all integer-dot files: every quantized type
 * rounds activations in both engines, so the sums are draws of the same
 * size (4 weight seeds: pdserve / llama.cpp 0.935..1.017 on the max,
 * 0.983..1.008 on the mean); a bias of 5 % or more fails */
#define QDOT_SUM 1.05
#define QDOT_SUM_MIN_FILES 10
static double qdot_sum_pd, qdot_sum_ll, qdot_mean_pd, qdot_mean_ll;
static int qdot_cases;

/* Does pdserve dot any weight of this file in integers (a 2-D tensor of an
 * integer-dot type whose rows are whole blocks)? */
static int uses_qdot(const char *path)
{
    gguf_t *g = NULL;
    int any = 0;
    if (gguf_open(path, &g, NULL, 0) != PD_OK)
        return 0;
    for (uint64_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(g, i);
        if (t->n_dims >= 2 && ggml_qdot_act(t->type) != GGML_QACT_NONE &&
            t->ne[0] % ggml_qdot_block(t->type) == 0)
            any = 1;
    }
    gguf_close(g);
    return any;
}

/* B/C: both engines vs the f64 reference at the prompt and 3 more steps,
 * all on llama.cpp's greedy tokens (pdserve teacher-forced). */
static void compare_ref(const char *tag, const char *kind, const char *path)
{
    /* first: every tensor decodes bitwise as ggml's own to_float does */
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "'%s' dequant '%s' '%s' >/dev/null", llq, libggml_base, path);
    if (sh(cmd)) {
        printf("FAIL  %s %-28s decodes differently from ggml\n", kind, tag);
        failures++;
        return;
    }
    ngen = 4; /* pdserve teacher-forced on llama.cpp's tokens: 12 comparable rows */
    int rc = run_llamacpp(path, &ra, NULL) || run_pdserve(path, &rb, &ra);
    ngen = NGEN;
    if (rc) {
        failures++;
        return;
    }
    double e_pd = 0, e_ll = 0, m_pd = 0, m_ll = 0;
    int rows = 0;
    static double ref[MAXV];
    for (int p = 0; p < NPROMPT; p++)
        for (int s = 0; s < 4; s++) {
            int32_t toks[16];
            memcpy(toks, prompts[p], prompt_len[p] * sizeof(int32_t));
            for (int j = 0; j < s; j++)
                toks[prompt_len[p] + (uint32_t)j] = ra.tok[p][j];
            if (ll_ref_logits(path, toks, prompt_len[p] + (uint32_t)s, false, ref) != 0) {
                failures++;
                return;
            }
            double ep = rel_err(rb.lg[p][s], ref, ra.vocab), el = rel_err(ra.lg[p][s], ref, ra.vocab);
            e_pd = fmax(e_pd, ep);
            e_ll = fmax(e_ll, el);
            m_pd += ep;
            m_ll += el;
            rows++;
        }
    /* llama.cpp rounds activations to 8 bits before every quantized dot
     * product (seen: 0.01..0.3 on these random models; MoE routing flips
     * add more). pdserve does the same for every quantized weight type
     * (ggml_qdot.h); f32 / f16 / bf16 weights are dotted exactly.
     *  - no integer-dot tensor in the file: pdserve <= llama.cpp and < 1e-4;
     *  - integer-dot tensors: the same rounding model, so the two errors are
     *    draws of the same size. Per dense file, pdserve's mean over the
     *    logit rows <= QDOT_CASE x llama.cpp's (seen 0.28..1.17; a wrong
     *    kernel is >= 10x off). The mean, not the max: the max over 12 rows
     *    is one draw (IQ4_NL, 8 weight seeds: max ratio 0.57..1.67 both
     *    ways, mean ratio 0.87..1.17, summed max 0.529 vs 0.532). Over all
     *    such files (MoE included) pdserve's summed max and summed mean
     *    <= QDOT_SUM x llama.cpp's (checked in main). MoE files get no per-file ratio:
     *    a routing flip is a discontinuity either engine can hit (seen:
     *    llama.cpp 0.32 where pdserve is exact, pdserve 0.18 vs 0.027). */
    int qd = uses_qdot(path), moe = strstr(tag, "moe") != NULL;
    m_pd /= rows > 0 ? rows : 1;
    m_ll /= rows > 0 ? rows : 1;
    int ok = e_ll < 0.6 && rows > 0 &&
             (qd ? (moe || m_pd <= QDOT_CASE * m_ll) : (e_pd <= e_ll + 1e-6 && e_pd < 1e-4));
    if (qd) {
        qdot_sum_pd += e_pd;
        qdot_sum_ll += e_ll;
        qdot_mean_pd += m_pd;
        qdot_mean_ll += m_ll;
        qdot_cases++;
    }
    printf("%-5s %s %-26s = ggml decode; vs f64 ref, max / mean: pdserve %.3g / %.3g, "
           "llama.cpp %.3g / %.3g%s\n", ok ? "ok" : "FAIL", kind, tag, e_pd, m_pd, e_ll, m_ll,
           qd ? (moe ? " (int-dot, MoE: in the sum only)" : " (int-dot)") : "");
    failures += !ok;
}

static void case_quant(const char *tag, const char *args)
{
    if (!want(tag))
        return;
    char path[512], cmd[1536];
    snprintf(path, sizeof(path), "%s/%s.gguf", tmpdir, tag);
    snprintf(cmd, sizeof(cmd), "'%s' %s%s --vocab-type spm -o '%s' >/dev/null", mkmodel, args, seed_arg, path);
    if (sh(cmd)) {
        failures++;
        return;
    }
    compare_ref(tag, "B", path);
}

/* C: llama.cpp quantizes an f32 pd-mkmodel file to ftype. */
static void case_llq(const char *tag, const char *args, int ftype)
{
    if (!want(tag))
        return;
    char src[512], path[512], cmd[2048];
    snprintf(src, sizeof(src), "%s/%s.src.gguf", tmpdir, tag);
    snprintf(path, sizeof(path), "%s/%s.gguf", tmpdir, tag);
    snprintf(cmd, sizeof(cmd), "'%s' %s%s --vocab-type spm -o '%s' >/dev/null", mkmodel, args, seed_arg, src);
    if (sh(cmd)) {
        failures++;
        return;
    }
    snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' '%s' %d >/dev/null 2>&1", llq, libllama, src,
             path, ftype);
    if (sh(cmd)) {
        failures++;
        return;
    }
    compare_ref(tag, "C", path);
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: test-llamacpp PD_MKMODEL LLQ LIBLLAMA NODE_DIR [filter]\n");
        return 2;
    }
    mkmodel = argv[1];
    llq = argv[2];
    libllama = argv[3];
    nodedir = argv[4];
    filter = argc > 5 ? argv[5] : NULL;
    const char *seed = getenv("LLREF_SEED");
    if (seed && *seed)
        snprintf(seed_arg, sizeof(seed_arg), " --seed %llu", strtoull(seed, NULL, 10));
    snprintf(libggml_base, sizeof(libggml_base), "%s", libllama);
    char *slash = strrchr(libggml_base, '/');
    snprintf(slash ? slash + 1 : libggml_base,
             sizeof(libggml_base) - (size_t)(slash ? slash + 1 - libggml_base : 0),
             "libggml-base.so");
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/pd-test-llamacpp-XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;

    /* small but real shapes: rows of 256 for the K-quants, GQA, 4 layers */
#define BASE "--dim 256 --layers 4 --heads 8 --kv-heads 2 --ffn 512 --vocab 300 --ctx 512 "
    /* A: every architecture, f32 and f16. Seen: f32 <= 8e-6 (gemma3 5e-4);
     * f16 <= 1.1e-2 (llama.cpp rounds activations to f16 for F16 weights) */
    case_exact("llama_f32", BASE "--arch llama --untied", 2e-4);
    case_exact("llama_f16", BASE "--arch llama --type f16 --tied", 2e-2);
    case_exact("qwen2_f32", BASE "--arch qwen2 --tied", 2e-4);
    case_exact("qwen2_f16", BASE "--arch qwen2 --type f16 --untied", 2e-2);
    case_exact("qwen3_f32", BASE "--arch qwen3 --head-dim 64 --tied", 2e-4);
    case_exact("qwen3_f16", BASE "--arch qwen3 --type f16 --untied", 2e-2);
    case_exact("qwen3moe_f32", BASE "--arch qwen3moe --experts 8 --experts-used 2 --untied",
               2e-4);
    case_exact("qwen3moe_f16", BASE "--arch qwen3moe --type f16 --experts 6 --experts-used 3 "
               "--expert-ffn 128 --tied", 2e-2);
    /* ggml's GELU reads a table at f16 inputs: 5e-4 seen */
    case_exact("gemma3_f32", BASE "--arch gemma3 --layers 7 --sliding-window 16 --tied", 2e-3);
    case_exact("gemma3_f16", BASE "--arch gemma3 --layers 7 --type f16 --sliding-window 12 "
               "--untied", 2e-2);

    /* B: pd-mkmodel's quantizer, every type and preset mix; archs rotate */
    static const char *const qtypes[] = {
        "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q2_K", "q3_K", "q4_K", "q5_K",
        "q6_K", "q2_K", "q3_K_S", "q3_K_M", "q3_K_L", "q4_K_S", "q4_K_M", "q5_K_S", "q5_K_M",
    };
    static const char *const archs[] = {
        "--arch llama --untied", "--arch qwen2 --tied", "--arch qwen3 --untied",
        "--arch qwen3moe --experts 8 --experts-used 2 --untied",
        "--arch gemma3 --layers 7 --sliding-window 8 --tied",
    };
    static const char *const arch_tag[] = { "llama", "qwen2", "qwen3", "qwen3moe", "gemma3" };
    for (size_t i = 0; i < sizeof(qtypes) / sizeof(qtypes[0]); i++) {
        char tag[64], args[512];
        size_t a = i % 5;
        snprintf(tag, sizeof(tag), "mk_%s_%s", arch_tag[a], qtypes[i]);
        /* --ffn 352: ffn_down rows are not whole super-blocks -> fallbacks */
        snprintf(args, sizeof(args), BASE "%s --type %s%s", archs[a], qtypes[i],
                 i % 2 ? " --ffn 352 --expert-ffn 160" : "");
        if (a != 3 && (i % 2))
            snprintf(args, sizeof(args), BASE "%s --type %s --ffn 352", archs[a], qtypes[i]);
        case_quant(tag, args);
    }

    /* C: llama.cpp's quantizer on f32 files, every preset it writes */
    static const struct { const char *name; int ftype; } ft[] = {
        { "Q8_0", 7 }, { "Q4_0", 2 }, { "Q4_1", 3 }, { "Q5_0", 8 }, { "Q5_1", 9 },
        { "IQ4_NL", 25 }, { "Q2_K", 10 }, { "Q3_K_S", 11 }, { "Q3_K_M", 12 }, { "Q3_K_L", 13 },
        { "Q4_K_S", 14 }, { "Q4_K_M", 15 }, { "Q5_K_S", 16 }, { "Q5_K_M", 17 }, { "Q6_K", 18 },
    };
    for (size_t i = 0; i < sizeof(ft) / sizeof(ft[0]); i++) {
        char tag[64], args[512];
        size_t a = (i + 2) % 5;
        snprintf(tag, sizeof(tag), "llq_%s_%s", arch_tag[a], ft[i].name);
        snprintf(args, sizeof(args), BASE "%s%s", archs[a], i % 2 ? " --ffn 352" : "");
        case_llq(tag, args, ft[i].ftype);
    }

    /* the sums only mean something over many files (a filtered run's few
     * are single draws: reported, not judged) */
    if (qdot_cases) {
        int judged = qdot_cases >= QDOT_SUM_MIN_FILES;
        int ok = !judged ||
                 (qdot_sum_pd <= QDOT_SUM * qdot_sum_ll && qdot_mean_pd <= QDOT_SUM * qdot_mean_ll);
        printf("%-5s integer-dot cases: summed error vs f64 ref over %d files, max / mean: "
               "pdserve %.4g / %.4g, llama.cpp %.4g / %.4g\n", ok ? "ok" : "FAIL", qdot_cases,
               qdot_sum_pd, qdot_mean_pd, qdot_sum_ll, qdot_mean_ll);
        if (!judged)
            printf("      (fewer than %d files: the sums are not judged)\n", QDOT_SUM_MIN_FILES);
        failures += !ok;
    }
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
