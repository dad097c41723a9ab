/* pd_mkmodel.c - pd-mkmodel: generate a Llama-family GGUF v3 model from a
 * seed, bitwise reproducibly (same flags + seed = same bytes).
 *
 * Weights come from splitmix64 streams seeded per tensor (seed ^ hash of
 * the tensor name), so changing one tensor's type never changes another's
 * values. Values are an Irwin-Hall sum of 4 uniforms (approximately normal)
 * computed with exact or correctly rounded float operations only (no
 * transcendental libm calls), so the bytes are the same on every IEEE-754
 * host.
 *
 * Scaling (keeps activations sane through many layers):
 *   token_embd        std 1.0, tied: 0.5/sqrt(dim) (byte vocab: non-printable
 *                     rows x0.25)
 *   attn_q/k          std 2.5/sqrt(dim): attention scores of std ~6, so
 *                     attention is position-dependent, not a bag of tokens
 *   attn_v, ffn_gate/up, attn_output       std 1/sqrt(dim)
 *   ffn_down          std 1/sqrt(ffn)
 *   output            std 2/sqrt(dim) (byte vocab: non-printable rows x0.25)
 *   *_norm            1.0 + 0.1 * noise      (always f32)
 *   qwen2 q/k/v bias  0.2 * noise            (always f32)
 *
 * Usage: pd-mkmodel [--preset NAME] [options] -o FILE   (--help for all)
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gguf.h"
#include "mk_mix.h"
#include "mk_ngram.h"

#define MK_BYTE_TOKENS 256u
#define MK_TOK_BOS     256u  /* "<s>" */
#define MK_TOK_IM_START 257u /* "<|im_start|>" */
#define MK_TOK_IM_END  258u  /* "<|im_end|>" = EOS */
#define MK_TOK_PAD     259u  /* "<pad>" */
#define MK_BYTE_VOCAB_MIN 260u

/* ChatML, as Qwen2-Instruct without the default system prompt. */
#define MK_CHAT_TEMPLATE                                                          \
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + " \
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"                    \
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

typedef struct {
    const char *arch;          /* "llama" | "qwen2" */
    const char *name;          /* general.name */
    uint32_t dim, layers, heads, kv_heads, ffn, vocab, ctx;
    float rope_base, rms_eps;
    bool tied;
    uint32_t type;             /* ggml type of 2-D weights */
    uint64_t seed;
    const char *vocab_type;    /* "byte" | "none" */
    const char *vocab_from;    /* GGUF to copy tokenizer.* from, or NULL */
    bool vocab_set;            /* --vocab given explicitly */
    uint32_t alignment;
    const char *out;
    const char *type_name;     /* --type (a ggml type or a preset mix name) */
    mk_mix_t mix;              /* resolved from type / type_name by validate() */
    uint32_t head_dim;         /* 0 = dim / heads */
    uint32_t experts, experts_used, expert_ffn; /* qwen3moe */
    uint32_t swa;              /* gemma3 sliding window (0 = none) */
    uint32_t pooling;          /* <arch>.pooling_type: 0 = not written, 1 mean, 2 cls, 3 last */
    bool add_eos;              /* tokenizer.ggml.add_eos_token (--add-eos) */
} mk_cfg_t;

typedef struct {
    const char *name;
    const char *help;
    mk_cfg_t cfg;
} mk_preset_t;

static const mk_preset_t mk_presets[] = {
    {"builtin", "default model of `make run`: n-gram model of --corpus compiled into a "
     "1-layer llama (mk_ngram.h); only --seed, --corpus, --name, -o apply",
     {"llama", "pdserve-builtin", 256, 6, 8, 4, 768, 260, 4096, 10000.0f, 1e-5f, false,
      GGML_TYPE_F32, 1, "byte", NULL, false, 32, NULL}},
    {"byte", "random weights: ~4.9M params, byte vocab, ctx 4096, f32 (builtin until issue 19)",
     {"llama", "pdserve-byte", 256, 6, 8, 4, 768, 260, 4096, 10000.0f, 1e-5f, false,
      GGML_TYPE_F32, 1, "byte", NULL, false, 32, NULL}},
    {"tiny", "unit-test model: ~0.1M params, byte vocab, ctx 512, f32",
     {"llama", "pdserve-tiny", 64, 2, 4, 2, 128, 260, 512, 10000.0f, 1e-5f, true,
      GGML_TYPE_F32, 1, "byte", NULL, false, 32, NULL}},
    {"bench-0.5b", "benchmark model: ~0.5B params (dim 1280, 24 layers, GQA 20/4), f16",
     {"llama", "pdserve-bench-0.5b", 1280, 24, 20, 4, 3456, 32000, 4096, 500000.0f, 1e-5f,
      false, GGML_TYPE_F16, 1, "byte", NULL, false, 32, NULL}},
};

static const char *prog = "pd-mkmodel";

static void __attribute__((format(printf, 1, 2), noreturn)) die_usage(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see --help)\n");
    exit(2);
}

static void __attribute__((format(printf, 1, 2), noreturn)) die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

/* ---- deterministic numbers ---- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001B3ull;
    return h;
}

/* Approximately N(0,1): sum of 4 U(-0.5,0.5) has variance 1/3. Each
 * uniform has 24 bits, exactly representable; the sum is exact. */
static float noise(uint64_t *s)
{
    uint64_t r = splitmix64(s);
    float acc = 0.0f;
    for (int i = 0; i < 4; i++) {
        uint32_t u = (uint32_t)(r >> (16 * i)) & 0xFFFFu;
        acc += (float)u * (1.0f / 65536.0f) - 0.5f;
    }
    return acc * 1.7320508f; /* sqrt(3) */
}

/* sqrtf is correctly rounded (IEEE-754), so this is deterministic too. */
static float inv_sqrt(float x)
{
    return 1.0f / sqrtf(x);
}

static bool byte_printable(uint32_t id)
{
    return (id >= 0x20 && id <= 0x7E) || id == '\n';
}

/* ---- tensors ---- */

typedef enum { MK_INIT_WEIGHT, MK_INIT_NORM, MK_INIT_BIAS } mk_init_t;

typedef struct {
    const mk_cfg_t *cfg;
    gguf_writer_t *w;
    float *buf;                /* scratch, largest tensor */
    uint64_t n_params;
} mk_ctx_t;

/* A (ne2, ne1, ne0) tensor: ne2 > 1 stacks matrices (MoE experts). */
static void add_tensor3(mk_ctx_t *mk, const char *name, mk_init_t init, uint64_t ne0,
                        uint64_t ne1, uint64_t ne2, float std, bool row_bias)
{
    const mk_cfg_t *cfg = mk->cfg;
    uint64_t s = cfg->seed ^ fnv1a64(name);
    uint64_t ne[3] = {ne0, ne1 / ne2, ne2};
    uint64_t n = ne0 * ne1;
    uint32_t type = init == MK_INIT_WEIGHT
                        ? mk_mix_type(&cfg->mix, name, ne0, cfg->layers, cfg->tied)
                        : GGML_TYPE_F32;
    pd_status_t status;

    for (uint64_t r = 0; r < ne1; r++) {
        float scale = std;
        /* byte vocab rows: printable bytes (and EOS, half) dominate the
         * logits so greedy text from a random model still looks like text */
        if (row_bias)
            scale *= byte_printable((uint32_t)r) ? 1.0f : r == MK_TOK_IM_END ? 0.5f : 0.25f;
        for (uint64_t c = 0; c < ne0; c++) {
            float v = noise(&s);
            switch (init) {
            case MK_INIT_WEIGHT: v *= scale; break;
            case MK_INIT_NORM:   v = 1.0f + 0.1f * v; break;
            case MK_INIT_BIAS:   v *= 0.2f; break;
            }
            mk->buf[r * ne0 + c] = v;
        }
    }
    status = gguf_writer_add_tensor_f32(mk->w, name, type, ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1, ne,
                                        mk->buf);
    if (status != PD_OK)
        die("tensor %s (%" PRIu64 " x %" PRIu64 ", %s): %s", name, ne0, ne1,
            ggml_type_name(type), pd_status_str(status));
    mk->n_params += n;
}

static void add_tensor(mk_ctx_t *mk, const char *name, mk_init_t init, uint64_t ne0,
                       uint64_t ne1, float std, bool row_bias)
{
    add_tensor3(mk, name, init, ne0, ne1, 1, std, row_bias);
}

static void add_all_tensors(mk_ctx_t *mk)
{
    const mk_cfg_t *c = mk->cfg;
    uint32_t head_dim = c->head_dim ? c->head_dim : c->dim / c->heads;
    uint32_t kv_dim = head_dim * c->kv_heads, q_dim = head_dim * c->heads;
    bool qk_norm = strcmp(c->arch, "qwen3") == 0 || strcmp(c->arch, "qwen3moe") == 0 ||
                   strcmp(c->arch, "gemma3") == 0;
    bool gemma3 = strcmp(c->arch, "gemma3") == 0;
    float s_dim = inv_sqrt((float)c->dim);
    float s_ffn = inv_sqrt((float)c->ffn);
    bool byte_rows = strcmp(c->vocab_type, "none") != 0 && c->vocab_from == NULL;
    char name[96];

    /* tied: the embedding is also the output matrix; a small scale keeps the
     * residual dominated by the layers (else greedy just echoes the input) */
    add_tensor(mk, "token_embd.weight", MK_INIT_WEIGHT, c->dim, c->vocab,
               c->tied ? 0.5f * s_dim : 1.0f, byte_rows);
    for (uint32_t l = 0; l < c->layers; l++) {
#define T(suffix, init, ne0, ne1, std)                                  \
        do {                                                           \
            snprintf(name, sizeof(name), "blk.%u." suffix, l);         \
            add_tensor(mk, name, init, ne0, ne1, std, false);          \
        } while (0)
        T("attn_norm.weight", MK_INIT_NORM, c->dim, 1, 0);
        T("attn_q.weight", MK_INIT_WEIGHT, c->dim, q_dim, 2.5f * s_dim);
        T("attn_k.weight", MK_INIT_WEIGHT, c->dim, kv_dim, 2.5f * s_dim);
        T("attn_v.weight", MK_INIT_WEIGHT, c->dim, kv_dim, s_dim);
        if (strcmp(c->arch, "qwen2") == 0) {
            T("attn_q.bias", MK_INIT_BIAS, c->dim, 1, 0);
            T("attn_k.bias", MK_INIT_BIAS, kv_dim, 1, 0);
            T("attn_v.bias", MK_INIT_BIAS, kv_dim, 1, 0);
        }
        if (qk_norm) {
            T("attn_q_norm.weight", MK_INIT_NORM, head_dim, 1, 0);
            T("attn_k_norm.weight", MK_INIT_NORM, head_dim, 1, 0);
        }
        T("attn_output.weight", MK_INIT_WEIGHT, q_dim, c->dim, inv_sqrt((float)q_dim));
        if (gemma3)
            T("post_attention_norm.weight", MK_INIT_NORM, c->dim, 1, 0);
        T("ffn_norm.weight", MK_INIT_NORM, c->dim, 1, 0);
        if (c->experts) {
            /* router logits of std ~2: routing varies with the token */
            T("ffn_gate_inp.weight", MK_INIT_WEIGHT, c->dim, c->experts, 2.0f * s_dim);
            uint32_t fe = c->expert_ffn, ne = c->experts;
#define T3(suffix, ne0, ne1, std)                                       \
            do {                                                       \
                snprintf(name, sizeof(name), "blk.%u." suffix, l);     \
                add_tensor3(mk, name, MK_INIT_WEIGHT, ne0, (uint64_t)(ne1) * ne, ne, std, \
                            false);                                    \
            } while (0)
            T3("ffn_gate_exps.weight", c->dim, fe, s_dim);
            T3("ffn_up_exps.weight", c->dim, fe, s_dim);
            T3("ffn_down_exps.weight", fe, c->dim, inv_sqrt((float)fe));
#undef T3
        } else {
            T("ffn_gate.weight", MK_INIT_WEIGHT, c->dim, c->ffn, s_dim);
            T("ffn_up.weight", MK_INIT_WEIGHT, c->dim, c->ffn, s_dim);
            T("ffn_down.weight", MK_INIT_WEIGHT, c->ffn, c->dim, s_ffn);
        }
        if (gemma3)
            T("post_ffw_norm.weight", MK_INIT_NORM, c->dim, 1, 0);
#undef T
    }
    add_tensor(mk, "output_norm.weight", MK_INIT_NORM, c->dim, 1, 0, false);
    if (!c->tied)
        add_tensor(mk, "output.weight", MK_INIT_WEIGHT, c->dim, c->vocab, 2.0f * s_dim,
                   byte_rows);
}

/* ---- metadata ---- */

#define CHECK(expr)                                                           \
    do {                                                                      \
        pd_status_t st_ = (expr);                                             \
        if (st_ != PD_OK)                                                     \
            die("metadata %s: %s", #expr, pd_status_str(st_));               \
    } while (0)

/* model: "pdbyte", or "llama" (--vocab-type spm: the same tokens as a
 * SentencePiece vocabulary with byte fallback, which llama.cpp can load) */
static void add_byte_vocab(gguf_writer_t *w, uint32_t vocab, const char *model, bool add_eos)
{
    char **toks = calloc(vocab, sizeof(*toks));
    float *scores = calloc(vocab, sizeof(*scores));
    int32_t *types = calloc(vocab, sizeof(*types));

    if (toks == NULL || scores == NULL || types == NULL)
        die("out of memory");
    for (uint32_t i = 0; i < vocab; i++) {
        char buf[32];
        int32_t type = 3; /* control */
        if (i < MK_BYTE_TOKENS) {
            snprintf(buf, sizeof(buf), "<0x%02X>", i);
            type = 6;
        } else if (i == MK_TOK_BOS) {
            snprintf(buf, sizeof(buf), "<s>");
        } else if (i == MK_TOK_IM_START) {
            snprintf(buf, sizeof(buf), "<|im_start|>");
        } else if (i == MK_TOK_IM_END) {
            snprintf(buf, sizeof(buf), "<|im_end|>");
        } else if (i == MK_TOK_PAD) {
            snprintf(buf, sizeof(buf), "<pad>");
        } else {
            snprintf(buf, sizeof(buf), "<unused_%u>", i - MK_BYTE_VOCAB_MIN);
            type = 5;
        }
        toks[i] = strdup(buf);
        if (toks[i] == NULL)
            die("out of memory");
        types[i] = type;
    }
    CHECK(gguf_writer_add_string(w, "tokenizer.ggml.model", model));
    CHECK(gguf_writer_add_string(w, "tokenizer.ggml.pre", "default"));
    CHECK(gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, NULL,
                                  vocab));
    CHECK(gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, vocab));
    CHECK(gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, vocab));
    CHECK(gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", MK_TOK_BOS));
    CHECK(gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", MK_TOK_IM_END));
    CHECK(gguf_writer_add_u32(w, "tokenizer.ggml.eot_token_id", MK_TOK_IM_END));
    CHECK(gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", MK_TOK_PAD));
    CHECK(gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true));
    CHECK(gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", add_eos));
    CHECK(gguf_writer_add_string(w, "tokenizer.chat_template", MK_CHAT_TEMPLATE));
    for (uint32_t i = 0; i < vocab; i++)
        free(toks[i]);
    free(toks);
    free(scores);
    free(types);
}

/* Copy every tokenizer.* key from another GGUF; returns its vocab size. */
static uint32_t add_vocab_from(gguf_writer_t *w, const char *path)
{
    gguf_t *g;
    char err[256];
    const gguf_arr_t *toks;
    uint32_t n = 0;
    pd_status_t status = gguf_open(path, &g, err, sizeof(err));

    if (status != PD_OK)
        die("--vocab-from %s: %s", path, err);
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks) != PD_OK)
        die("--vocab-from %s: no tokenizer.ggml.tokens string array", path);
    if (toks->count == 0 || toks->count > (1u << 22))
        die("--vocab-from %s: %" PRIu64 " tokens (want 1..4194304)", path, toks->count);
    for (uint64_t i = 0; i < gguf_kv_count(g); i++) {
        const gguf_kv_t *kv = gguf_kv_at(g, i);
        if (strncmp(kv->key, "tokenizer.", 10) == 0) {
            CHECK(gguf_writer_add_kv_from(w, kv));
            n++;
        }
    }
    uint32_t vocab = (uint32_t)toks->count;
    gguf_close(g);
    (void)n;
    return vocab;
}

static void add_metadata(gguf_writer_t *w, mk_cfg_t *c)
{
    char key[128];
    const char *a = c->arch;

    CHECK(gguf_writer_add_string(w, "general.architecture", a));
    CHECK(gguf_writer_add_string(w, "general.name", c->name));
    CHECK(gguf_writer_add_u32(w, "general.file_type", c->mix.file_type));
    CHECK(gguf_writer_add_u32(w, "general.quantization_version", 2));
    CHECK(gguf_writer_add_string(w, "pdserve.generator", "pd-mkmodel 1"));
    CHECK(gguf_writer_add_u64(w, "pdserve.seed", c->seed));
#define KEY(suffix) (snprintf(key, sizeof(key), "%s." suffix, a), key)
    CHECK(gguf_writer_add_u32(w, KEY("context_length"), c->ctx));
    CHECK(gguf_writer_add_u32(w, KEY("embedding_length"), c->dim));
    CHECK(gguf_writer_add_u32(w, KEY("block_count"), c->layers));
    CHECK(gguf_writer_add_u32(w, KEY("feed_forward_length"), c->ffn));
    uint32_t head_dim = c->head_dim ? c->head_dim : c->dim / c->heads;
    CHECK(gguf_writer_add_u32(w, KEY("rope.dimension_count"), head_dim));
    if (c->head_dim) {
        CHECK(gguf_writer_add_u32(w, KEY("attention.key_length"), head_dim));
        CHECK(gguf_writer_add_u32(w, KEY("attention.value_length"), head_dim));
    }
    if (c->experts) {
        CHECK(gguf_writer_add_u32(w, KEY("expert_count"), c->experts));
        CHECK(gguf_writer_add_u32(w, KEY("expert_used_count"), c->experts_used));
        CHECK(gguf_writer_add_u32(w, KEY("expert_feed_forward_length"), c->expert_ffn));
    }
    if (c->swa) {
        CHECK(gguf_writer_add_u32(w, KEY("attention.sliding_window"), c->swa));
        CHECK(gguf_writer_add_f32(w, KEY("rope.freq_base_swa"), 10000.0f));
    }
    if (c->pooling)
        CHECK(gguf_writer_add_u32(w, KEY("pooling_type"), c->pooling));
    CHECK(gguf_writer_add_f32(w, KEY("rope.freq_base"), c->rope_base));
    CHECK(gguf_writer_add_u32(w, KEY("attention.head_count"), c->heads));
    CHECK(gguf_writer_add_u32(w, KEY("attention.head_count_kv"), c->kv_heads));
    CHECK(gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->rms_eps));
#undef KEY
    if (c->vocab_from != NULL)
        c->vocab = add_vocab_from(w, c->vocab_from);
    else if (strcmp(c->vocab_type, "byte") == 0)
        add_byte_vocab(w, c->vocab, "pdbyte", c->add_eos);
    else if (strcmp(c->vocab_type, "spm") == 0)
        add_byte_vocab(w, c->vocab, "llama", c->add_eos);
    snprintf(key, sizeof(key), "%s.vocab_size", a);
    CHECK(gguf_writer_add_u32(w, key, c->vocab));
}

/* ---- flags ---- */

static uint64_t parse_u64(const char *flag, const char *s, uint64_t lo, uint64_t hi)
{
    char *end;
    unsigned long long v;

    errno = 0;
    if (s[0] == '-' || s[0] == '\0')
        die_usage("%s: '%s' is not a non-negative integer", flag, s);
    v = strtoull(s, &end, 0);
    if (errno != 0 || *end != '\0')
        die_usage("%s: '%s' is not a non-negative integer", flag, s);
    if (v < lo || v > hi)
        die_usage("%s: %llu outside [%" PRIu64 ", %" PRIu64 "]", flag, v, lo, hi);
    return v;
}

static float parse_pos_f32(const char *flag, const char *s)
{
    char *end;
    float v;

    errno = 0;
    v = strtof(s, &end);
    if (errno != 0 || *end != '\0' || end == s || !(v > 0.0f) || v > 1e30f)
        die_usage("%s: '%s' is not a positive number", flag, s);
    return v;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: pd-mkmodel [--preset NAME] [options] -o FILE.gguf\n"
        "Generate a deterministic Llama-family model as GGUF v3: random weights, or\n"
        "(--preset builtin) an n-gram language model of a text corpus.\n\n"
        "  --preset NAME     start from a preset (default byte):\n");
    for (size_t i = 0; i < sizeof(mk_presets) / sizeof(mk_presets[0]); i++)
        fprintf(f, "                      %-11s %s\n", mk_presets[i].name, mk_presets[i].help);
    fprintf(f,
        "  --arch A          llama | qwen2 (adds attn_q/k/v.bias) | qwen3 (per-head\n"
        "                    Q/K norms) | qwen3moe (+ routed experts) | gemma3 (post\n"
        "                    norms, GELU, sliding-window layers)\n"
        "  --head-dim N      attention head size (default dim / heads)\n"
        "  --experts N       qwen3moe: experts (default 8)\n"
        "  --experts-used N  qwen3moe: experts per token (default 2)\n"
        "  --expert-ffn N    qwen3moe: expert feed-forward length (default ffn / 2)\n"
        "  --sliding-window N gemma3: window of the local layers (default 32; 0 = off)\n"
        "  --pooling P       write <arch>.pooling_type: mean | cls | last (embeddings)\n"
        "  --add-eos         tokenizer.ggml.add_eos_token = true (byte / spm vocab)\n"
        "  --dim N           embedding length\n"
        "  --layers N        block count\n"
        "  --heads N         attention heads (head_dim = dim / heads, even)\n"
        "  --kv-heads N      KV heads (GQA), divides heads\n"
        "  --ffn N           feed-forward length\n"
        "  --vocab N         vocab size (byte vocab: >= 260; extra ids are <unused_K>)\n"
        "  --ctx N           context length\n"
        "  --rope-base F     RoPE frequency base\n"
        "  --rms-eps F       RMSNorm epsilon\n"
        "  --tied | --untied output.weight absent (tied to token_embd) or present\n"
        "  --type T          2-D weight type (norms/biases f32): f32 f16 bf16 q8_0 q4_0\n"
        "                    q4_1 q5_0 q5_1 iq4_nl q2_K q3_K q4_K q5_K q6_K, or a\n"
        "                    llama-quantize style mix: q2_K q3_K_S q3_K_M q3_K_L\n"
        "                    q4_K_S q4_K_M q5_K_S q5_K_M q6_K (see engine/gguf/mk_mix.c)\n"
        "  --seed N          weight seed (u64)\n"
        "  --vocab-type V    byte (tokenizer.ggml.model \"pdbyte\") | spm (the same\n"
        "                    tokens as model \"llama\", loadable by llama.cpp) | none\n"
        "  --vocab-from F    copy all tokenizer.* keys from GGUF F (sets vocab size)\n"
        "  --name S          general.name\n"
        "  --alignment N     data alignment (power of two, 8..65536)\n"
        "  --corpus DIR      builtin: text corpus (default " MK_NGRAM_DEFAULT_CORPUS ")\n"
        "  -o, --output F    output file (written atomically)\n"
        "  -h, --help\n");
}

static void validate(mk_cfg_t *c)
{
    if (c->type_name != NULL) {
        if (mk_mix_parse(c->type_name, &c->mix) != PD_OK)
            die_usage("--type '%s': want one of %s, or a mix: %s", c->type_name,
                      ggml_supported_types(), mk_mix_names());
    } else if (mk_mix_parse(ggml_type_name(c->type), &c->mix) != PD_OK) {
        die_usage("preset type %s is not supported", ggml_type_name(c->type));
    } else {
        c->mix.variant = 0; /* a preset's type is plain */
        c->mix.file_type = c->type == GGML_TYPE_Q2_K || c->type == GGML_TYPE_Q6_K
                               ? 1024 : c->mix.file_type;
    }
    c->type = c->mix.base;
    const ggml_type_info_t *info = ggml_type_info(c->type);
    /* K-quant rows that are not whole super-blocks fall back to 32-blocks */
    if (info->block_size == 256)
        info = ggml_type_info(GGML_TYPE_Q8_0);

    static const char *const archs[] = {"llama", "qwen2", "qwen3", "qwen3moe", "gemma3"};
    size_t ai = 0;
    while (ai < 5 && strcmp(c->arch, archs[ai]) != 0)
        ai++;
    if (ai == 5)
        die_usage("--arch '%s': want llama, qwen2, qwen3, qwen3moe or gemma3", c->arch);
    if (strcmp(c->arch, "qwen3moe") == 0) {
        if (c->experts == 0)
            c->experts = 8;
        if (c->experts_used == 0)
            c->experts_used = 2;
        if (c->expert_ffn == 0)
            c->expert_ffn = c->ffn / 2;
        if (c->experts_used > c->experts)
            die_usage("--experts-used %u > --experts %u", c->experts_used, c->experts);
    } else if (c->experts || c->experts_used || c->expert_ffn) {
        die_usage("--experts/--experts-used/--expert-ffn need --arch qwen3moe");
    }
    if (strcmp(c->arch, "gemma3") == 0) {
        if (c->swa == UINT32_MAX)
            c->swa = 32;
    } else if (c->swa != UINT32_MAX && c->swa != 0) {
        die_usage("--sliding-window needs --arch gemma3");
    } else {
        c->swa = 0;
    }
    uint32_t hd = c->head_dim ? c->head_dim : c->dim / c->heads;
    if (strcmp(c->vocab_type, "byte") != 0 && strcmp(c->vocab_type, "spm") != 0 &&
        strcmp(c->vocab_type, "none") != 0)
        die_usage("--vocab-type '%s': want byte, spm or none", c->vocab_type);
    if (c->head_dim == 0 && c->dim % c->heads != 0)
        die_usage("--dim %u is not a multiple of --heads %u", c->dim, c->heads);
    if (hd % 2 != 0)
        die_usage("head_dim %u must be even for RoPE", hd);
    if (c->kv_heads > c->heads || c->heads % c->kv_heads != 0)
        die_usage("--kv-heads %u must divide --heads %u", c->kv_heads, c->heads);
    if (c->dim % info->block_size != 0 || c->ffn % info->block_size != 0 ||
        (c->experts && c->expert_ffn % info->block_size != 0) ||
        (uint64_t)hd * c->heads % info->block_size != 0)
        die_usage("--type %s needs --dim, --ffn, --expert-ffn and heads*head_dim multiples "
                  "of %u", info->name, info->block_size);
    if (c->vocab_from == NULL && strcmp(c->vocab_type, "none") != 0 && c->vocab < MK_BYTE_VOCAB_MIN)
        die_usage("--vocab %u: byte vocab needs >= %u", c->vocab, MK_BYTE_VOCAB_MIN);
    if (c->vocab_from != NULL && c->vocab_set)
        die_usage("--vocab and --vocab-from are exclusive (vocab size comes from the file)");
    if (c->out == NULL)
        die_usage("missing -o FILE");
}

/* --preset builtin: the n-gram model of a corpus (mk_ngram.c). */
static int mk_builtin(const mk_cfg_t *cfg, const char *corpus, int n_shape)
{
    mk_ngram_opts_t o = {.corpus_dir = corpus, .seed = cfg->seed, .name = cfg->name};
    mk_ngram_t *ng;
    char err[512] = "", desc[2048];

    if (n_shape > 0)
        die_usage("--preset builtin is compiled from a corpus: only --seed, --corpus, --name "
                  "and -o apply");
    if (cfg->out == NULL)
        die_usage("missing -o FILE");
    if (mk_ngram_build(&o, &ng, err, sizeof(err)) != PD_OK)
        die("%s", err);
    if (mk_ngram_write(ng, cfg->out, err, sizeof(err)) != PD_OK)
        die("%s", err);
    mk_ngram_describe(ng, desc, sizeof(desc));
    printf("wrote %s: %s, 1-layer llama, vocab %u; %s\n", cfg->out, cfg->name,
           mk_ngram_vocab(ng), desc);
    mk_ngram_destroy(ng);
    return 0;
}

int main(int argc, char **argv)
{
    enum {
        O_PRESET = 256, O_ARCH, O_DIM, O_LAYERS, O_HEADS, O_KV_HEADS, O_FFN, O_VOCAB, O_CTX,
        O_ROPE, O_EPS, O_TIED, O_UNTIED, O_TYPE, O_SEED, O_VOCAB_TYPE, O_VOCAB_FROM, O_NAME,
        O_ALIGN, O_CORPUS, O_HEAD_DIM, O_EXPERTS, O_EXPERTS_USED, O_EXPERT_FFN, O_SWA, O_POOLING, O_ADD_EOS,
    };
    static const struct option opts[] = {
        {"preset", required_argument, NULL, O_PRESET},
        {"arch", required_argument, NULL, O_ARCH},
        {"dim", required_argument, NULL, O_DIM},
        {"layers", required_argument, NULL, O_LAYERS},
        {"heads", required_argument, NULL, O_HEADS},
        {"kv-heads", required_argument, NULL, O_KV_HEADS},
        {"ffn", required_argument, NULL, O_FFN},
        {"vocab", required_argument, NULL, O_VOCAB},
        {"ctx", required_argument, NULL, O_CTX},
        {"rope-base", required_argument, NULL, O_ROPE},
        {"rms-eps", required_argument, NULL, O_EPS},
        {"tied", no_argument, NULL, O_TIED},
        {"untied", no_argument, NULL, O_UNTIED},
        {"type", required_argument, NULL, O_TYPE},
        {"seed", required_argument, NULL, O_SEED},
        {"vocab-type", required_argument, NULL, O_VOCAB_TYPE},
        {"vocab-from", required_argument, NULL, O_VOCAB_FROM},
        {"name", required_argument, NULL, O_NAME},
        {"alignment", required_argument, NULL, O_ALIGN},
        {"corpus", required_argument, NULL, O_CORPUS},
        {"head-dim", required_argument, NULL, O_HEAD_DIM},
        {"experts", required_argument, NULL, O_EXPERTS},
        {"experts-used", required_argument, NULL, O_EXPERTS_USED},
        {"expert-ffn", required_argument, NULL, O_EXPERT_FFN},
        {"sliding-window", required_argument, NULL, O_SWA},
        {"pooling", required_argument, NULL, O_POOLING},
        {"add-eos", no_argument, NULL, O_ADD_EOS},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    /* without --preset: the random byte-vocab model, shaped by the flags */
    mk_cfg_t cfg = mk_presets[1].cfg;
    const char *preset = mk_presets[1].name, *corpus = NULL;
    int opt, n_shape = 0;
    cfg.swa = UINT32_MAX; /* "not given" */

    /* first pass: the preset, so explicit flags override it in any order */
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        if (opt != O_PRESET)
            continue;
        size_t i, n = sizeof(mk_presets) / sizeof(mk_presets[0]);
        for (i = 0; i < n && strcmp(mk_presets[i].name, optarg) != 0; i++)
            ;
        if (i == n)
            die_usage("unknown --preset '%s'", optarg);
        cfg = mk_presets[i].cfg;
        preset = mk_presets[i].name;
        cfg.swa = UINT32_MAX;
    }
    optind = 1;
    while ((opt = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        n_shape += opt != O_PRESET && opt != O_SEED && opt != O_NAME && opt != O_CORPUS &&
                   opt != 'o' && opt != 'h';
        switch (opt) {
        case O_PRESET: break;
        case O_ARCH: cfg.arch = optarg; break;
        case O_DIM: cfg.dim = (uint32_t)parse_u64("--dim", optarg, 2, 65536); break;
        case O_LAYERS: cfg.layers = (uint32_t)parse_u64("--layers", optarg, 1, 1024); break;
        case O_HEADS: cfg.heads = (uint32_t)parse_u64("--heads", optarg, 1, 1024); break;
        case O_KV_HEADS: cfg.kv_heads = (uint32_t)parse_u64("--kv-heads", optarg, 1, 1024); break;
        case O_FFN: cfg.ffn = (uint32_t)parse_u64("--ffn", optarg, 1, 1u << 18); break;
        case O_VOCAB:
            cfg.vocab = (uint32_t)parse_u64("--vocab", optarg, 1, 1u << 22);
            cfg.vocab_set = true;
            break;
        case O_CTX: cfg.ctx = (uint32_t)parse_u64("--ctx", optarg, 1, 1u << 24); break;
        case O_ROPE: cfg.rope_base = parse_pos_f32("--rope-base", optarg); break;
        case O_EPS: cfg.rms_eps = parse_pos_f32("--rms-eps", optarg); break;
        case O_TIED: cfg.tied = true; break;
        case O_UNTIED: cfg.tied = false; break;
        case O_TYPE: cfg.type_name = optarg; break;
        case O_SEED: cfg.seed = parse_u64("--seed", optarg, 0, UINT64_MAX); break;
        case O_VOCAB_TYPE: cfg.vocab_type = optarg; break;
        case O_VOCAB_FROM: cfg.vocab_from = optarg; break;
        case O_NAME: cfg.name = optarg; break;
        case O_ALIGN: {
            uint64_t a = parse_u64("--alignment", optarg, GGUF_MIN_ALIGNMENT, GGUF_MAX_ALIGNMENT);
            if ((a & (a - 1)) != 0)
                die_usage("--alignment %" PRIu64 " is not a power of two", a);
            cfg.alignment = (uint32_t)a;
            break;
        }
        case O_CORPUS: corpus = optarg; break;
        case O_HEAD_DIM: cfg.head_dim = (uint32_t)parse_u64("--head-dim", optarg, 2, 1024); break;
        case O_EXPERTS: cfg.experts = (uint32_t)parse_u64("--experts", optarg, 1, 512); break;
        case O_EXPERTS_USED:
            cfg.experts_used = (uint32_t)parse_u64("--experts-used", optarg, 1, 64);
            break;
        case O_EXPERT_FFN:
            cfg.expert_ffn = (uint32_t)parse_u64("--expert-ffn", optarg, 1, 1u << 18);
            break;
        case O_SWA: cfg.swa = (uint32_t)parse_u64("--sliding-window", optarg, 0, 1u << 20); break;
        case O_ADD_EOS: cfg.add_eos = true; break;
        case O_POOLING:
            cfg.pooling = strcmp(optarg, "mean") == 0 ? 1u : strcmp(optarg, "cls") == 0 ? 2u
                          : strcmp(optarg, "last") == 0 ? 3u : 0u;
            if (cfg.pooling == 0)
                die_usage("--pooling: '%s' is not mean, cls or last", optarg);
            break;
        case 'o': cfg.out = optarg; break;
        case 'h': usage(stdout); return 0;
        default: die_usage("bad option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        die_usage("unexpected argument '%s'", argv[optind]);
    if (strcmp(preset, "builtin") == 0)
        return mk_builtin(&cfg, corpus, n_shape);
    if (corpus != NULL)
        die_usage("--corpus only applies to --preset builtin");
    validate(&cfg);

    gguf_writer_t *w;
    char err[512];
    if (gguf_writer_create(&w) != PD_OK)
        die("out of memory");
    CHECK(gguf_writer_set_alignment(w, cfg.alignment));
    add_metadata(w, &cfg);

    uint64_t big = (uint64_t)cfg.dim * (cfg.vocab > cfg.ffn ? cfg.vocab : cfg.ffn);
    uint64_t hd = cfg.head_dim ? cfg.head_dim : cfg.dim / cfg.heads;
    if ((uint64_t)cfg.dim * hd * cfg.heads > big)
        big = (uint64_t)cfg.dim * hd * cfg.heads;
    if ((uint64_t)cfg.dim * cfg.expert_ffn * cfg.experts > big)
        big = (uint64_t)cfg.dim * cfg.expert_ffn * cfg.experts;
    mk_ctx_t mk = {.cfg = &cfg, .w = w, .buf = malloc(big * sizeof(float))};
    if (mk.buf == NULL)
        die("out of memory (%" PRIu64 " floats)", big);
    add_all_tensors(&mk);
    free(mk.buf);

    if (gguf_writer_write(w, cfg.out, err, sizeof(err)) != PD_OK)
        die("%s", err);
    printf("wrote %s: %s %s, %" PRIu64 " params, %s, dim %u layers %u heads %u/%u ffn %u "
           "vocab %u ctx %u seed %" PRIu64 "\n", cfg.out, cfg.arch, cfg.name, mk.n_params,
           cfg.mix.name, cfg.dim, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn,
           cfg.vocab, cfg.ctx, cfg.seed);
    gguf_writer_destroy(w);
    return 0;
}
