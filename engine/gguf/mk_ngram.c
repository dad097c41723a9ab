/* mk_ngram.c - corpus reader, BPE trainer, n-gram counter and the compiler
 * of the n-gram model into Llama weights (see mk_ngram.h for the model).
 *
 * Weights (one layer, S = slot width, hd = head_dim, K = S/hd, D = 3S):
 *
 *   residual   [ slot 0: class of x[p] one-hot, dim S-1 = constant 1 |
 *                slot 1: class of x[p-1] | slot 2: class of x[p-2] ]
 *   token_embd row t: 1 at class(t), 1 at S-1 (all rows have norm sqrt 2,
 *              so attn_norm = rms makes the normalized input equal h)
 *   attention  K kv heads, 2K query heads (GQA 2): kv head k has
 *              k = Wk * const = (KMAG, 0) in every RoPE pair and
 *              v = chunk k of slot 0 (hd dims); query heads 2k / 2k+1 have
 *              q = QMAG * (cos o*theta_i, -sin o*theta_i) in pair i, o = 1/2.
 *              After RoPE, score(p, j) = SCALE * sum_i cos((p-j-o) theta_i):
 *              maximal at j = p-o and below it by >= SCALE * 1.9 elsewhere
 *              (rope base 100, hd 64, positions < 4096): with SCALE = 20 the
 *              softmax weight off the target is < e^-38. Before position o
 *              the nearest position, 0, wins. attn_output puts head 2k's
 *              chunk into slot 1 and head 2k+1's into slot 2.
 *   ffn        zero (adds nothing).
 *   output     h has norm 2 (4 ones); output_norm = rms cancels the
 *              normalization, output.weight row v = [A[.][v] | B[.][v] | C[.][v]].
 *
 * Only output.weight needs f32; the other matrices hold 0/1 and RoPE
 * phases and are f16. Determinism: integer counting, then double math with
 * libm log/exp/cos/sin/pow in a fixed order (same libm = same bytes).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "ggml_types.h"
#include "gguf.h"
#include "mk_ngram.h"

#define NG_MAX_FILES   1024u
#define NG_MAX_FILE    (8u << 20)   /* bytes per corpus file */
#define NG_MAX_TOTAL   (64u << 20)  /* bytes of corpus */
#define NG_MAX_MERGES  4096u
#define NG_MAX_TOKEN   64u          /* bytes of a merged token */
#define NG_SLOT        640u         /* residual slot: classes + constant */
#define NG_HEAD_DIM    64u
#define NG_FFN         16u
#define NG_CTX         4096u
#define NG_ROPE_BASE   100.0
#define NG_KMAG        8.0
#define NG_SCALE       20.0         /* per RoPE pair score weight */
#define NG_RMS_EPS     1e-5f

/* The GPT-2 pre-tokenizer (same pattern and flags as engine/tok). */
static const char NG_RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ChatML, as Qwen2-Instruct without the default system prompt (the byte
 * presets of pd_mkmodel.c store the same string). */
static const char NG_CHAT_TEMPLATE[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static const char *const ng_special[] = { "<s>", "<|im_start|>", "<|im_end|>", "<pad>" };
enum { SP_BOS, SP_IM_START, SP_EOS, SP_PAD, SP_N };

enum { SPLIT_TRAIN, SPLIT_TUNE, SPLIT_HELD };

typedef struct {
    char *s;
    uint32_t len;
    uint8_t split;
    int32_t *ids;      /* BPE encoding */
    uint32_t n_ids;
} ng_para_t;

/* open addressing u64 -> u32 (pairs), key 0 is never used (l/r < 2^32-1) */
typedef struct {
    uint64_t *key;
    uint32_t *val;
    uint32_t mask, n;
} ng_map_t;

struct mk_ngram {
    char name[128];
    char corpus_dir[512];
    uint64_t seed;
    /* corpus */
    ng_para_t *paras;
    size_t n_paras, n_held, n_tune, n_train;
    char *file_list;           /* "A,B,..." */
    size_t n_files, corpus_bytes;
    uint64_t corpus_hash;      /* fnv1a64 over (name NUL bytes NUL) of every file */
    /* vocab: 256 bytes, merges, specials */
    uint32_t n_vocab, n_merges;
    uint8_t **raw;             /* (n_vocab) bytes of each token */
    uint32_t *raw_len;
    uint32_t *merge_l, *merge_r;
    ng_map_t ranks;            /* (l << 32 | r) + 1 -> rank + 1 */
    int32_t sp[SP_N];
    pcre2_code *re;
    /* model */
    uint32_t n_classes;        /* <= NG_SLOT - 1 */
    uint32_t *cls;             /* (n_vocab) token -> class */
    float *A, *B, *C;          /* (n_classes, n_vocab) */
    double lambda1, lambda2;
    double tune_nll_per_tok;
    size_t n_tokens_fit;
};

static pd_status_t ng_fail(char *err, size_t err_len, pd_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#include <stdarg.h>
static pd_status_t ng_fail(char *err, size_t err_len, pd_status_t st, const char *fmt, ...)
{
    va_list ap;

    if (err != NULL && err_len > 0) {
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

static uint64_t ng_splitmix(uint64_t x)
{
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t ng_fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* ---- pair map ---- */

static pd_status_t map_init(ng_map_t *m, uint32_t cap_pow2)
{
    m->key = calloc(cap_pow2, sizeof(*m->key));
    m->val = calloc(cap_pow2, sizeof(*m->val));
    m->mask = cap_pow2 - 1;
    m->n = 0;
    return m->key && m->val ? PD_OK : PD_ERR_NO_MEMORY;
}

static void map_free(ng_map_t *m)
{
    free(m->key);
    free(m->val);
    m->key = NULL;
    m->val = NULL;
}

static void map_clear(ng_map_t *m)
{
    memset(m->key, 0, ((size_t)m->mask + 1) * sizeof(*m->key));
    m->n = 0;
}

static uint32_t *map_slot(ng_map_t *m, uint64_t key, bool insert)
{
    uint32_t i = (uint32_t)ng_splitmix(key) & m->mask;

    key++;
    for (;;) {
        if (m->key[i] == key)
            return &m->val[i];
        if (m->key[i] == 0) {
            if (!insert || m->n + 1 > (m->mask + 1) / 2)
                return NULL;
            m->key[i] = key;
            m->val[i] = 0;
            m->n++;
            return &m->val[i];
        }
        i = (i + 1) & m->mask;
    }
}

static pd_status_t map_grow(ng_map_t *m)
{
    ng_map_t n;
    pd_status_t st = map_init(&n, (m->mask + 1) * 2);

    if (st != PD_OK) {
        map_free(&n);
        return st;
    }
    for (uint32_t i = 0; i <= m->mask; i++)
        if (m->key[i] != 0)
            *map_slot(&n, m->key[i] - 1, true) = m->val[i];
    map_free(m);
    *m = n;
    return PD_OK;
}

static pd_status_t map_add(ng_map_t *m, uint64_t key, uint32_t add)
{
    uint32_t *v = map_slot(m, key, true);

    if (v == NULL) {
        pd_status_t st = map_grow(m);
        if (st != PD_OK)
            return st;
        v = map_slot(m, key, true);
    }
    *v += add;
    return PD_OK;
}

static uint64_t pair_key(uint32_t l, uint32_t r)
{
    return (uint64_t)l << 32 | r;
}

/* ---- corpus ---- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;

    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            if (c == 0)
                return false;
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            k = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (n - i <= k)
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
        i += k + 1;
    }
    return true;
}

static bool is_ws(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static pd_status_t add_para(mk_ngram_t *ng, const char *s, size_t n, size_t *cap)
{
    /* collapse whitespace runs into one space, trim */
    char *p = malloc(n + 1);
    size_t k = 0;
    bool sp = false;

    if (p == NULL)
        return PD_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if (is_ws(c)) {
            sp = k > 0;
            continue;
        }
        if (sp)
            p[k++] = ' ';
        sp = false;
        p[k++] = (char)c;
    }
    p[k] = '\0';
    if (k == 0) {
        free(p);
        return PD_OK;
    }
    if (ng->n_paras == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        ng_para_t *np = realloc(ng->paras, nc * sizeof(*np));
        if (np == NULL) {
            free(p);
            return PD_ERR_NO_MEMORY;
        }
        ng->paras = np;
        *cap = nc;
    }
    ng_para_t *pa = &ng->paras[ng->n_paras];
    memset(pa, 0, sizeof(*pa));
    pa->s = p;
    pa->len = (uint32_t)k;
    uint64_t h = ng_splitmix(ng->seed ^ ng_splitmix(ng->n_paras)) % 10;
    pa->split = h == 0 ? SPLIT_HELD : h == 1 ? SPLIT_TUNE : SPLIT_TRAIN;
    ng->n_held += pa->split == SPLIT_HELD;
    ng->n_tune += pa->split == SPLIT_TUNE;
    ng->n_train += pa->split == SPLIT_TRAIN;
    ng->n_paras++;
    return PD_OK;
}

/* Paragraphs = runs of lines separated by blank (whitespace-only) lines. */
static pd_status_t split_paras(mk_ngram_t *ng, const char *t, size_t n, size_t *cap)
{
    size_t start = 0, i = 0;
    pd_status_t st;

    while (i < n) {
        size_t e = i;
        bool blank = true;
        while (e < n && t[e] != '\n') {
            if (!is_ws((uint8_t)t[e]))
                blank = false;
            e++;
        }
        if (blank) {
            if ((st = add_para(ng, t + start, i - start, cap)) != PD_OK)
                return st;
            start = e < n ? e + 1 : e;
        }
        i = e < n ? e + 1 : e;
    }
    return add_para(ng, t + start, n - start, cap);
}

static pd_status_t read_corpus(mk_ngram_t *ng, char *err, size_t err_len)
{
    DIR *d = opendir(ng->corpus_dir);
    char **names = NULL, path[1024];
    size_t n = 0, pcap = 0, flen = 0;
    struct dirent *de;
    pd_status_t st = PD_OK;
    char *buf = NULL;

    if (d == NULL)
        return ng_fail(err, err_len, PD_ERR_IO, "corpus %s: %s", ng->corpus_dir, strerror(errno));
    names = calloc(NG_MAX_FILES, sizeof(*names));
    if (names == NULL) {
        closedir(d);
        return PD_ERR_NO_MEMORY;
    }
    while ((de = readdir(d)) != NULL) {
        struct stat sb;
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", ng->corpus_dir, de->d_name);
        /* symlinks (GPL -> GPL-3) would count a text twice */
        if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (n == NG_MAX_FILES) {
            st = ng_fail(err, err_len, PD_ERR_TOO_BIG, "corpus %s: more than %u files",
                         ng->corpus_dir, NG_MAX_FILES);
            break;
        }
        if ((names[n] = strdup(de->d_name)) == NULL) {
            st = PD_ERR_NO_MEMORY;
            break;
        }
        flen += strlen(de->d_name) + 1;
        n++;
    }
    closedir(d);
    if (st != PD_OK)
        goto out;
    qsort(names, n, sizeof(*names), cmp_str);
    ng->file_list = calloc(flen + 1, 1);
    buf = malloc(NG_MAX_FILE);
    if (ng->file_list == NULL || buf == NULL) {
        st = PD_ERR_NO_MEMORY;
        goto out;
    }
    ng->corpus_hash = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) {
        int fd;
        ssize_t r;
        size_t got = 0;
        snprintf(path, sizeof(path), "%s/%s", ng->corpus_dir, names[i]);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
            st = ng_fail(err, err_len, PD_ERR_IO, "corpus %s: %s", path, strerror(errno));
            goto out;
        }
        while (got < NG_MAX_FILE && (r = read(fd, buf + got, NG_MAX_FILE - got)) > 0)
            got += (size_t)r;
        close(fd);
        /* only UTF-8 text files under the size cap take part */
        if (got == NG_MAX_FILE || !utf8_valid((const uint8_t *)buf, got))
            continue;
        if (ng->corpus_bytes + got > NG_MAX_TOTAL) {
            st = ng_fail(err, err_len, PD_ERR_TOO_BIG, "corpus %s: more than %u bytes",
                         ng->corpus_dir, NG_MAX_TOTAL);
            goto out;
        }
        ng->corpus_hash = ng_fnv(ng->corpus_hash, names[i], strlen(names[i]) + 1);
        ng->corpus_hash = ng_fnv(ng->corpus_hash, buf, got);
        ng->corpus_hash = ng_fnv(ng->corpus_hash, "", 1);
        ng->corpus_bytes += got;
        if (ng->n_files > 0)
            strcat(ng->file_list, ",");
        strcat(ng->file_list, names[i]);
        ng->n_files++;
        if ((st = split_paras(ng, buf, got, &pcap)) != PD_OK)
            goto out;
    }
    if (ng->n_train < 16 || ng->n_tune == 0 || ng->n_held == 0)
        st = ng_fail(err, err_len, PD_ERR_BAD_INPUT,
                     "corpus %s: %zu usable files, %zu paragraphs: too little text",
                     ng->corpus_dir, ng->n_files, ng->n_paras);
out:
    free(buf);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return st;
}

/* ---- pre-tokenizer ---- */

typedef pd_status_t (*piece_fn_t)(void *arg, const char *s, size_t len);

/* Same splitting loop as engine/tok's split_pieces. */
static pd_status_t for_pieces(const mk_ngram_t *ng, pcre2_match_data *md, const char *text,
                              size_t len, piece_fn_t fn, void *arg)
{
    PCRE2_SIZE off = 0, prev = 0;
    pd_status_t st;

    while (off < len) {
        int rc = pcre2_match(ng->re, (PCRE2_SPTR)text, len, off, 0, md, NULL);
        PCRE2_SIZE *ov, ms, me;
        if (rc < 0)
            break;
        ov = pcre2_get_ovector_pointer(md);
        ms = ov[0];
        me = ov[1];
        if (ms > prev) {
            if ((st = fn(arg, text + prev, ms - prev)) != PD_OK)
                return st;
            prev = ms;
        }
        if (me == ms) {
            off = ms + 1;
            while (off < len && ((uint8_t)text[off] & 0xC0) == 0x80)
                off++;
            continue;
        }
        if ((st = fn(arg, text + ms, me - ms)) != PD_OK)
            return st;
        off = prev = me;
    }
    return len > prev ? fn(arg, text + prev, len - prev) : PD_OK;
}

/* ---- BPE training ---- */

typedef struct {
    uint32_t *sym;
    uint32_t n;
    uint32_t freq;
} ng_word_t;

typedef struct {
    ng_word_t *w;
    size_t n, cap;
    uint32_t *tab;     /* hash of piece bytes -> word index + 1 */
    uint32_t tab_mask;
    const char **txt;  /* piece text of each word (into the paragraphs) */
    uint32_t *txt_len;
} ng_words_t;

static pd_status_t word_add(void *arg, const char *s, size_t len)
{
    ng_words_t *W = arg;
    uint32_t i;

    if (len > 4096)
        len = 4096; /* a pathological piece is only trained on its head */
    if ((W->n + 1) * 2 > (size_t)W->tab_mask + 1) {
        uint32_t nm = (W->tab_mask + 1) * 2 - 1;
        uint32_t *nt = calloc((size_t)nm + 1, sizeof(*nt));
        if (nt == NULL)
            return PD_ERR_NO_MEMORY;
        for (size_t k = 0; k < W->n; k++) {
            uint32_t j = (uint32_t)ng_fnv(0xCBF29CE484222325ull, W->txt[k], W->txt_len[k]) & nm;
            while (nt[j] != 0)
                j = (j + 1) & nm;
            nt[j] = (uint32_t)k + 1;
        }
        free(W->tab);
        W->tab = nt;
        W->tab_mask = nm;
    }
    i = (uint32_t)ng_fnv(0xCBF29CE484222325ull, s, len) & W->tab_mask;
    while (W->tab[i] != 0) {
        uint32_t k = W->tab[i] - 1;
        if (W->txt_len[k] == len && memcmp(W->txt[k], s, len) == 0) {
            W->w[k].freq++;
            return PD_OK;
        }
        i = (i + 1) & W->tab_mask;
    }
    if (W->n == W->cap) {
        size_t nc = W->cap ? W->cap * 2 : 1024;
        ng_word_t *nw = realloc(W->w, nc * sizeof(*nw));
        const char **nt = realloc(W->txt, nc * sizeof(*nt));
        uint32_t *nl = nt ? realloc(W->txt_len, nc * sizeof(*nl)) : NULL;
        if (nw)
            W->w = nw;
        if (nt)
            W->txt = nt;
        if (nl)
            W->txt_len = nl;
        if (!nw || !nt || !nl)
            return PD_ERR_NO_MEMORY;
        W->cap = nc;
    }
    ng_word_t *w = &W->w[W->n];
    w->sym = malloc(len * sizeof(uint32_t));
    if (w->sym == NULL)
        return PD_ERR_NO_MEMORY;
    for (size_t k = 0; k < len; k++)
        w->sym[k] = (uint8_t)s[k];
    w->n = (uint32_t)len;
    w->freq = 1;
    W->txt[W->n] = s;
    W->txt_len[W->n] = (uint32_t)len;
    W->tab[i] = (uint32_t)W->n + 1;
    W->n++;
    return PD_OK;
}

static pd_status_t add_token(mk_ngram_t *ng, const uint8_t *bytes, uint32_t len)
{
    uint32_t id = ng->n_vocab;

    ng->raw[id] = malloc(len ? len : 1);
    if (ng->raw[id] == NULL)
        return PD_ERR_NO_MEMORY;
    memcpy(ng->raw[id], bytes, len);
    ng->raw_len[id] = len;
    ng->n_vocab++;
    return PD_OK;
}

static pd_status_t train_bpe(mk_ngram_t *ng, pcre2_match_data *md, char *err, size_t err_len)
{
    ng_words_t W = { 0 };
    ng_map_t pairs = { 0 }, banned = { 0 };
    bool seen[256] = { false };
    uint32_t n_bytes = 0, budget;
    pd_status_t st;
    size_t total_alloc = 256 + NG_MAX_MERGES + SP_N;

    ng->raw = calloc(total_alloc, sizeof(*ng->raw));
    ng->raw_len = calloc(total_alloc, sizeof(*ng->raw_len));
    ng->merge_l = calloc(NG_MAX_MERGES, sizeof(uint32_t));
    ng->merge_r = calloc(NG_MAX_MERGES, sizeof(uint32_t));
    W.tab = calloc(1024, sizeof(uint32_t));
    W.tab_mask = 1023;
    if (!ng->raw || !ng->raw_len || !ng->merge_l || !ng->merge_r || !W.tab ||
        map_init(&pairs, 1u << 16) != PD_OK || map_init(&ng->ranks, 1u << 13) != PD_OK ||
        map_init(&banned, 1u << 6) != PD_OK) {
        st = PD_ERR_NO_MEMORY;
        goto out;
    }
    for (uint32_t b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        if ((st = add_token(ng, &c, 1)) != PD_OK)
            goto out;
    }
    for (size_t i = 0; i < ng->n_paras; i++) {
        const ng_para_t *p = &ng->paras[i];
        if (p->split == SPLIT_HELD)
            continue;
        for (uint32_t k = 0; k < p->len; k++)
            seen[(uint8_t)p->s[k]] = true;
        if ((st = for_pieces(ng, md, p->s, p->len, word_add, &W)) != PD_OK)
            goto out;
    }
    for (uint32_t b = 0; b < 256; b++)
        n_bytes += seen[b];
    seen[' '] = true; /* "assistant\n" of the chat prefix */
    seen['\n'] = true;
    /* classes: seen bytes + merges + BOS/im_start/EOS + the shared class of
     * unseen tokens must fit the slot next to the constant */
    budget = NG_SLOT - 1 - 1 - 3 - n_bytes - 2;
    if (budget > NG_MAX_MERGES)
        budget = NG_MAX_MERGES;
    while (ng->n_merges < budget) {
        uint32_t best_l = 0, best_r = 0, best_c = 0;
        map_clear(&pairs);
        for (size_t i = 0; i < W.n; i++) {
            const ng_word_t *w = &W.w[i];
            for (uint32_t k = 0; k + 1 < w->n; k++)
                if ((st = map_add(&pairs, pair_key(w->sym[k], w->sym[k + 1]), w->freq)) != PD_OK)
                    goto out;
        }
        for (uint32_t i = 0; i <= pairs.mask; i++) {
            if (pairs.key[i] == 0)
                continue;
            uint64_t k = pairs.key[i] - 1;
            uint32_t l = (uint32_t)(k >> 32), r = (uint32_t)k, c = pairs.val[i];
            if (ng->raw_len[l] + ng->raw_len[r] > NG_MAX_TOKEN ||
                map_slot(&banned, k, false) != NULL)
                continue;
            if (c > best_c || (c == best_c && (l < best_l || (l == best_l && r < best_r)))) {
                best_c = c;
                best_l = l;
                best_r = r;
            }
        }
        if (best_c < 2)
            break;
        uint32_t id = 256 + ng->n_merges;
        uint32_t ll = ng->raw_len[best_l], rl = ng->raw_len[best_r];
        uint8_t tmp[NG_MAX_TOKEN];
        bool dup = false;
        memcpy(tmp, ng->raw[best_l], ll);
        memcpy(tmp + ll, ng->raw[best_r], rl);
        /* (a, bc) after (ab, c): the same text twice would make two ids the
         * GGUF vocab cannot tell apart; such a pair is never merged */
        for (uint32_t t = 256; t < ng->n_vocab && !dup; t++)
            dup = ng->raw_len[t] == ll + rl && memcmp(ng->raw[t], tmp, ll + rl) == 0;
        if (dup) {
            if ((st = map_add(&banned, pair_key(best_l, best_r), 1)) != PD_OK)
                goto out;
            continue;
        }
        if ((st = add_token(ng, tmp, ll + rl)) != PD_OK)
            goto out;
        ng->merge_l[ng->n_merges] = best_l;
        ng->merge_r[ng->n_merges] = best_r;
        if ((st = map_add(&ng->ranks, pair_key(best_l, best_r), ng->n_merges + 1)) != PD_OK)
            goto out;
        ng->n_merges++;
        for (size_t i = 0; i < W.n; i++) {
            ng_word_t *w = &W.w[i];
            uint32_t o = 0;
            for (uint32_t k = 0; k < w->n; k++) {
                if (k + 1 < w->n && w->sym[k] == best_l && w->sym[k + 1] == best_r) {
                    w->sym[o++] = id;
                    k++;
                } else {
                    w->sym[o++] = w->sym[k];
                }
            }
            w->n = o;
        }
    }
    for (int s = 0; s < SP_N; s++) {
        ng->sp[s] = (int32_t)ng->n_vocab;
        if ((st = add_token(ng, (const uint8_t *)ng_special[s],
                            (uint32_t)strlen(ng_special[s]))) != PD_OK)
            goto out;
    }
    st = PD_OK;
out:
    if (st != PD_OK && st != PD_ERR_NO_MEMORY)
        ng_fail(err, err_len, st, "BPE training failed: %s", pd_status_str(st));
    for (size_t i = 0; i < W.n; i++)
        free(W.w[i].sym);
    free(W.w);
    free(W.txt);
    free(W.txt_len);
    free(W.tab);
    map_free(&pairs);
    map_free(&banned);
    return st;
}

/* ---- encoding (HF BPE: lowest-rank adjacent pair first, leftmost on ties) ---- */

typedef struct {
    const mk_ngram_t *ng;
    int32_t *ids;
    size_t cap, n;
    uint32_t *sym;     /* scratch */
    size_t sym_cap;
} ng_enc_t;

static pd_status_t enc_piece(void *arg, const char *s, size_t len)
{
    ng_enc_t *E = arg;
    const mk_ngram_t *ng = E->ng;
    size_t n = len;

    if (len > E->sym_cap) {
        uint32_t *ns = realloc(E->sym, len * sizeof(*ns));
        if (ns == NULL)
            return PD_ERR_NO_MEMORY;
        E->sym = ns;
        E->sym_cap = len;
    }
    for (size_t i = 0; i < len; i++)
        E->sym[i] = (uint8_t)s[i];
    /* A pair with a merged token in it always ranks after that merge, so
     * applying the merges in rank order, each in one left-to-right pass,
     * gives the same result as lowest-rank-first: O(n * merges) for long
     * pieces instead of O(n^2). */
    for (uint32_t m = 0; len > 64 && m < ng->n_merges; m++) {
        uint32_t o = 0, l = ng->merge_l[m], r = ng->merge_r[m];
        for (size_t i = 0; i < n; i++) {
            if (i + 1 < n && E->sym[i] == l && E->sym[i + 1] == r) {
                E->sym[o++] = 256 + m;
                i++;
            } else {
                E->sym[o++] = E->sym[i];
            }
        }
        n = o;
    }
    for (; len <= 64;) {
        uint32_t best = UINT32_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            uint32_t *r = map_slot((ng_map_t *)&ng->ranks, pair_key(E->sym[i], E->sym[i + 1]),
                                   false);
            if (r != NULL && *r - 1 < best) {
                best = *r - 1;
                at = i;
            }
        }
        if (best == UINT32_MAX)
            break;
        E->sym[at] = 256 + best;
        memmove(E->sym + at + 1, E->sym + at + 2, (n - at - 2) * sizeof(uint32_t));
        n--;
    }
    for (size_t i = 0; i < n; i++) {
        if (E->n < E->cap)
            E->ids[E->n] = (int32_t)E->sym[i];
        E->n++;
    }
    return PD_OK;
}

static pd_status_t encode_md(const mk_ngram_t *ng, pcre2_match_data *md, const char *text,
                             size_t len, int32_t *ids, size_t cap, size_t *n_p)
{
    ng_enc_t E = { ng, ids, ids ? cap : 0, 0, NULL, 0 };
    pd_status_t st;

    if (!utf8_valid((const uint8_t *)text, len))
        return PD_ERR_BAD_INPUT;
    st = for_pieces(ng, md, text, len, enc_piece, &E);
    free(E.sym);
    *n_p = E.n;
    return st;
}

pd_status_t mk_ngram_encode(const mk_ngram_t *ng, const char *text, size_t len,
                            int32_t *ids, size_t cap, size_t *n_p)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(ng->re, NULL);
    pd_status_t st;

    if (md == NULL)
        return PD_ERR_NO_MEMORY;
    st = encode_md(ng, md, text, len, ids, cap, n_p);
    pcre2_match_data_free(md);
    return st;
}

/* ---- n-gram counts and the log-linear model ---- */

typedef struct {
    uint32_t *uni;               /* (V) targets */
    uint32_t *tab[3];            /* (n_classes, V): x[p], x[p-1], x[p-2] -> x[p+1] */
} ng_counts_t;

/* The training sequences of one paragraph: <s> text <|im_end|> and
 * <|im_start|> "assistant\n" text <|im_end|> (what a ChatML prompt ends with;
 * its prefix is only counted as context). */
static size_t para_seq(const mk_ngram_t *ng, const ng_para_t *p, int kind,
                       const int32_t *asst, size_t n_asst, int32_t *seq)
{
    size_t n = 0;

    if (kind == 0) {
        seq[n++] = ng->sp[SP_BOS];
    } else {
        seq[n++] = ng->sp[SP_IM_START];
        memcpy(seq + n, asst, n_asst * sizeof(*seq));
        n += n_asst;
    }
    memcpy(seq + n, p->ids, p->n_ids * sizeof(*seq));
    n += p->n_ids;
    seq[n++] = ng->sp[SP_EOS];
    return n;
}

/* Count the events predicting seq[from+1..n). */
static void count_seq(const mk_ngram_t *ng, ng_counts_t *c, const int32_t *seq, size_t n,
                      size_t from)
{
    const size_t V = ng->n_vocab;

    for (size_t p = from; p + 1 < n; p++) {
        uint32_t next = (uint32_t)seq[p + 1];
        c->uni[next]++;
        for (int o = 0; o < 3; o++)
            c->tab[o][(size_t)ng->cls[seq[p >= (size_t)o ? p - o : 0]] * V + next]++;
    }
}

static pd_status_t build_tables(const mk_ngram_t *ng, const ng_counts_t *c, float *out[3])
{
    const size_t V = ng->n_vocab;
    double total = 0;
    double *pu = calloc(V, sizeof(double)), *lpu = calloc(V, sizeof(double));

    if (pu == NULL || lpu == NULL) {
        free(pu);
        free(lpu);
        return PD_ERR_NO_MEMORY;
    }
    for (size_t v = 0; v < V; v++)
        total += c->uni[v];
    for (size_t v = 0; v < V; v++) {
        pu[v] = c->uni[v] / total;
        lpu[v] = c->uni[v] ? log(pu[v]) : 0;
    }
    for (int o = 0; o < 3; o++) {
        for (uint32_t k = 0; k < ng->n_classes; k++) {
            const uint32_t *row = c->tab[o] + (size_t)k * V;
            float *dst = out[o] + (size_t)k * V;
            double n = 0, T = 0;
            for (size_t v = 0; v < V; v++) {
                n += row[v];
                T += row[v] != 0;
            }
            for (size_t v = 0; v < V; v++) {
                double lp;
                if (c->uni[v] == 0) {
                    dst[v] = o == 0 ? MK_NGRAM_FLOOR : 0.0f;
                    continue;
                }
                lp = n > 0 ? log((row[v] + T * pu[v]) / (n + T)) : lpu[v];
                dst[v] = (float)(o == 0 ? lp : lp - lpu[v]);
            }
        }
    }
    free(pu);
    free(lpu);
    return PD_OK;
}

/* The classes of x_p, x_p-1, x_p-2 for the last position p = n - 1 (the
 * first token stands in before the start; out-of-vocab ids: the last class). */
static void ng_context_classes(const mk_ngram_t *ng, const int32_t *toks, size_t n, uint32_t c[3])
{
    size_t p = n - 1;
    for (int o = 0; o < 3; o++) {
        int32_t t = toks[p >= (size_t)o ? p - o : 0];
        c[o] = t >= 0 && (uint32_t)t < ng->n_vocab ? ng->cls[t] : ng->n_classes - 1;
    }
}

static void ng_logits_tab(const mk_ngram_t *ng, float *const tab[3], double l1, double l2,
                          const int32_t *toks, size_t n, double *out)
{
    const size_t V = ng->n_vocab;
    uint32_t c[3];
    ng_context_classes(ng, toks, n, c);
    const float *a = tab[0] + c[0] * V, *b = tab[1] + c[1] * V, *d = tab[2] + c[2] * V;
    for (size_t v = 0; v < V; v++)
        out[v] = (double)a[v] + l1 * b[v] + l2 * d[v];
}

void mk_ngram_logits(const mk_ngram_t *ng, const int32_t *toks, size_t n, float *logits)
{
    const size_t V = ng->n_vocab;
    uint32_t c[3];
    ng_context_classes(ng, toks, n, c);
    for (size_t v = 0; v < V; v++)
        logits[v] = ng->A[c[0] * V + v] + ng->B[c[1] * V + v] + ng->C[c[2] * V + v];
}

static pd_status_t fit(mk_ngram_t *ng, pcre2_match_data *md, char *err, size_t err_len)
{
    const size_t V = ng->n_vocab;
    int32_t asst[64], *seq = NULL;
    size_t n_asst, max_len = 0;
    ng_counts_t cnt = { 0 };
    float *tab[3] = { NULL, NULL, NULL };
    double *lg = NULL;
    pd_status_t st;

    st = encode_md(ng, md, "assistant\n", 10, asst, 64, &n_asst);
    if (st != PD_OK || n_asst > 64)
        return ng_fail(err, err_len, PD_ERR_BAD_INPUT, "cannot encode the chat prefix");
    /* encode every paragraph; classes = tokens of the train+tune sequences */
    for (size_t i = 0; i < ng->n_paras; i++) {
        ng_para_t *p = &ng->paras[i];
        size_t n;
        if ((st = encode_md(ng, md, p->s, p->len, NULL, 0, &n)) != PD_OK)
            return st;
        p->ids = malloc((n ? n : 1) * sizeof(int32_t));
        if (p->ids == NULL)
            return PD_ERR_NO_MEMORY;
        if ((st = encode_md(ng, md, p->s, p->len, p->ids, n, &n)) != PD_OK)
            return st;
        p->n_ids = (uint32_t)n;
        if (n > max_len)
            max_len = n;
    }
    ng->cls = calloc(V, sizeof(uint32_t));
    seq = malloc((max_len + n_asst + 3) * sizeof(int32_t));
    bool *used = calloc(V, sizeof(bool));
    if (ng->cls == NULL || seq == NULL || used == NULL) {
        free(used);
        st = PD_ERR_NO_MEMORY;
        goto out;
    }
    used[ng->sp[SP_BOS]] = used[ng->sp[SP_IM_START]] = used[ng->sp[SP_EOS]] = true;
    for (size_t k = 0; k < n_asst; k++)
        used[asst[k]] = true;
    for (size_t i = 0; i < ng->n_paras; i++)
        if (ng->paras[i].split != SPLIT_HELD)
            for (uint32_t k = 0; k < ng->paras[i].n_ids; k++)
                used[ng->paras[i].ids[k]] = true;
    ng->n_classes = 0;
    for (size_t v = 0; v < V; v++)
        if (used[v])
            ng->cls[v] = ng->n_classes++;
    for (size_t v = 0; v < V; v++)
        if (!used[v])
            ng->cls[v] = ng->n_classes;
    ng->n_classes++; /* the shared class of unseen tokens */
    free(used);
    if (ng->n_classes > NG_SLOT - 1) {
        st = ng_fail(err, err_len, PD_ERR_BAD_INPUT, "%u token classes exceed the slot (%u)",
                     ng->n_classes, NG_SLOT - 1);
        goto out;
    }

    size_t csz = (size_t)ng->n_classes * V;
    cnt.uni = calloc(V, sizeof(uint32_t));
    lg = malloc(V * sizeof(double));
    bool oom = cnt.uni == NULL || lg == NULL;
    for (int o = 0; o < 3; o++) {
        cnt.tab[o] = calloc(csz, sizeof(uint32_t));
        tab[o] = malloc(csz * sizeof(float));
        oom = oom || cnt.tab[o] == NULL || tab[o] == NULL;
    }
    if (oom) {
        st = PD_ERR_NO_MEMORY;
        goto out;
    }
    /* 1. counts of train only; lambdas by tune log-likelihood */
    for (size_t i = 0; i < ng->n_paras; i++)
        if (ng->paras[i].split == SPLIT_TRAIN)
            for (int kind = 0; kind < 2; kind++) {
                size_t n = para_seq(ng, &ng->paras[i], kind, asst, n_asst, seq);
                /* the chat prefix is context only, never predicted */
                count_seq(ng, &cnt, seq, n, kind == 0 ? 0 : n_asst);
            }
    if ((st = build_tables(ng, &cnt, tab)) != PD_OK)
        goto out;
    double best = INFINITY;
    size_t n_tune_tok = 0;
    for (int i1 = 0; i1 <= 4; i1++) {
        for (int i2 = 0; i2 <= 4; i2++) {
            double l1 = i1 * 0.25, l2 = i2 * 0.25, nll = 0;
            size_t nt = 0;
            for (size_t i = 0; i < ng->n_paras; i++) {
                if (ng->paras[i].split != SPLIT_TUNE)
                    continue;
                size_t n = para_seq(ng, &ng->paras[i], 0, asst, n_asst, seq);
                for (size_t p = 1; p < n; p++) {
                    double mx = -INFINITY, sum = 0;
                    ng_logits_tab(ng, tab, l1, l2, seq, p, lg);
                    for (size_t v = 0; v < V; v++)
                        mx = lg[v] > mx ? lg[v] : mx;
                    for (size_t v = 0; v < V; v++)
                        sum += exp(lg[v] - mx);
                    nll += mx + log(sum) - lg[seq[p]];
                    nt++;
                }
            }
            if (nll / nt < best) {
                best = nll / nt;
                ng->lambda1 = l1;
                ng->lambda2 = l2;
            }
            n_tune_tok = nt;
        }
    }
    ng->tune_nll_per_tok = best;
    (void)n_tune_tok;
    /* 2. final counts over train + tune */
    memset(cnt.uni, 0, V * sizeof(uint32_t));
    for (int o = 0; o < 3; o++)
        memset(cnt.tab[o], 0, csz * sizeof(uint32_t));
    ng->n_tokens_fit = 0;
    for (size_t i = 0; i < ng->n_paras; i++)
        if (ng->paras[i].split != SPLIT_HELD)
            for (int kind = 0; kind < 2; kind++) {
                size_t n = para_seq(ng, &ng->paras[i], kind, asst, n_asst, seq);
                /* the chat prefix is context only, never predicted */
                count_seq(ng, &cnt, seq, n, kind == 0 ? 0 : n_asst);
                if (kind == 0)
                    ng->n_tokens_fit += n;
            }
    if ((st = build_tables(ng, &cnt, tab)) != PD_OK)
        goto out;
    for (size_t i = 0; i < csz; i++) {
        tab[1][i] = (float)(ng->lambda1 * tab[1][i]);
        tab[2][i] = (float)(ng->lambda2 * tab[2][i]);
    }
    ng->A = tab[0];
    ng->B = tab[1];
    ng->C = tab[2];
    tab[0] = tab[1] = tab[2] = NULL;
    st = PD_OK;
out:
    for (int o = 0; o < 3; o++) {
        free(cnt.tab[o]);
        free(tab[o]);
    }
    free(cnt.uni);
    free(lg);
    free(seq);
    return st;
}

/* ---- build / accessors ---- */

pd_status_t mk_ngram_build(const mk_ngram_opts_t *opts, mk_ngram_t **ng_p, char *err,
                           size_t err_len)
{
    mk_ngram_t *ng = calloc(1, sizeof(*ng));
    pcre2_match_data *md = NULL;
    int errcode;
    PCRE2_SIZE erroff;
    pd_status_t st;

    *ng_p = NULL;
    if (ng == NULL)
        return PD_ERR_NO_MEMORY;
    snprintf(ng->corpus_dir, sizeof(ng->corpus_dir), "%s",
             opts->corpus_dir ? opts->corpus_dir : MK_NGRAM_DEFAULT_CORPUS);
    snprintf(ng->name, sizeof(ng->name), "%s", opts->name ? opts->name : "pdserve-builtin");
    ng->seed = opts->seed;
    ng->re = pcre2_compile((PCRE2_SPTR)NG_RE_GPT2, PCRE2_ZERO_TERMINATED,
                           PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &errcode, &erroff,
                           NULL);
    if (ng->re == NULL) {
        st = ng_fail(err, err_len, PD_ERR_NO_MEMORY, "pre-tokenizer regex: pcre2 error %d",
                     errcode);
        goto fail;
    }
    md = pcre2_match_data_create_from_pattern(ng->re, NULL);
    if (md == NULL) {
        st = PD_ERR_NO_MEMORY;
        goto fail;
    }
    if ((st = read_corpus(ng, err, err_len)) != PD_OK ||
        (st = train_bpe(ng, md, err, err_len)) != PD_OK ||
        (st = fit(ng, md, err, err_len)) != PD_OK)
        goto fail;
    pcre2_match_data_free(md);
    *ng_p = ng;
    return PD_OK;
fail:
    if (st == PD_ERR_NO_MEMORY && err != NULL && err_len > 0 && err[0] == '\0')
        snprintf(err, err_len, "out of memory");
    pcre2_match_data_free(md);
    mk_ngram_destroy(ng);
    return st;
}

void mk_ngram_destroy(mk_ngram_t *ng)
{
    if (ng == NULL)
        return;
    for (size_t i = 0; i < ng->n_paras; i++) {
        free(ng->paras[i].s);
        free(ng->paras[i].ids);
    }
    free(ng->paras);
    free(ng->file_list);
    if (ng->raw != NULL)
        for (uint32_t i = 0; i < ng->n_vocab; i++)
            free(ng->raw[i]);
    free(ng->raw);
    free(ng->raw_len);
    free(ng->merge_l);
    free(ng->merge_r);
    map_free(&ng->ranks);
    pcre2_code_free(ng->re);
    free(ng->cls);
    free(ng->A);
    free(ng->B);
    free(ng->C);
    free(ng);
}

uint32_t mk_ngram_vocab(const mk_ngram_t *ng)
{
    return ng->n_vocab;
}

int32_t mk_ngram_bos(const mk_ngram_t *ng)
{
    return ng->sp[SP_BOS];
}

int32_t mk_ngram_eos(const mk_ngram_t *ng)
{
    return ng->sp[SP_EOS];
}

size_t mk_ngram_n_heldout(const mk_ngram_t *ng)
{
    return ng->n_held;
}

const char *mk_ngram_heldout(const mk_ngram_t *ng, size_t i, size_t *len_p)
{
    for (size_t k = 0; k < ng->n_paras; k++) {
        if (ng->paras[k].split != SPLIT_HELD)
            continue;
        if (i-- == 0) {
            *len_p = ng->paras[k].len;
            return ng->paras[k].s;
        }
    }
    *len_p = 0;
    return NULL;
}

void mk_ngram_describe(const mk_ngram_t *ng, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "corpus %s: %zu files, %zu bytes, %zu paragraphs (%zu train, %zu tune, %zu "
             "held out); BPE %u merges, vocab %u, %u classes; %zu training tokens; "
             "lambda %.3f/%.3f, tune cross-entropy %.3f nats/token",
             ng->corpus_dir, ng->n_files, ng->corpus_bytes, ng->n_paras, ng->n_train,
             ng->n_tune, ng->n_held, ng->n_merges, ng->n_vocab, ng->n_classes,
             ng->n_tokens_fit, ng->lambda1, ng->lambda2, ng->tune_nll_per_tok);
}

/* ---- GGUF ---- */

/* GPT-2 bytes_to_unicode: the vocabulary text of a raw byte. */
static size_t byte_text(uint8_t b, char *out)
{
    unsigned cp, n = 0;

    if ((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae))
        cp = b;
    else {
        for (unsigned i = 0; i < b; i++)
            if (!((i >= '!' && i <= '~') || (i >= 0xa1 && i <= 0xac) || (i >= 0xae)))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static char *tok_text(const mk_ngram_t *ng, uint32_t id)
{
    char *s;
    size_t k = 0;

    if (id >= (uint32_t)ng->sp[0])
        return strdup(ng_special[id - (uint32_t)ng->sp[0]]);
    s = malloc((size_t)ng->raw_len[id] * 2 + 1);
    if (s == NULL)
        return NULL;
    for (uint32_t i = 0; i < ng->raw_len[id]; i++)
        k += byte_text(ng->raw[id][i], s + k);
    s[k] = '\0';
    return s;
}

#define W_CHECK(expr)                                                         \
    do {                                                                      \
        if ((st = (expr)) != PD_OK)                                           \
            goto out;                                                         \
    } while (0)

static pd_status_t add_vocab(const mk_ngram_t *ng, gguf_writer_t *w)
{
    const uint32_t V = ng->n_vocab;
    char **toks = calloc(V, sizeof(*toks)), **merges = calloc(ng->n_merges + 1, sizeof(*merges));
    int32_t *types = calloc(V, sizeof(*types));
    pd_status_t st = PD_ERR_NO_MEMORY;

    if (toks == NULL || merges == NULL || types == NULL)
        goto out;
    for (uint32_t i = 0; i < V; i++) {
        if ((toks[i] = tok_text(ng, i)) == NULL)
            goto out;
        types[i] = i >= (uint32_t)ng->sp[0] ? 3 : 1;
    }
    for (uint32_t m = 0; m < ng->n_merges; m++) {
        const char *l = toks[ng->merge_l[m]], *r = toks[ng->merge_r[m]];
        size_t n = strlen(l) + strlen(r) + 2;
        if ((merges[m] = malloc(n)) == NULL)
            goto out;
        snprintf(merges[m], n, "%s %s", l, r);
    }
    W_CHECK(gguf_writer_add_string(w, "tokenizer.ggml.model", "gpt2"));
    W_CHECK(gguf_writer_add_string(w, "tokenizer.ggml.pre", "gpt-2"));
    W_CHECK(gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks,
                                    NULL, V));
    W_CHECK(gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, V));
    W_CHECK(gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges,
                                    NULL, ng->n_merges));
    W_CHECK(gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)ng->sp[SP_BOS]));
    W_CHECK(gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)ng->sp[SP_EOS]));
    W_CHECK(gguf_writer_add_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)ng->sp[SP_EOS]));
    W_CHECK(gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)ng->sp[SP_PAD]));
    W_CHECK(gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true));
    W_CHECK(gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", false));
    W_CHECK(gguf_writer_add_string(w, "tokenizer.chat_template", NG_CHAT_TEMPLATE));
out:
    if (toks != NULL)
        for (uint32_t i = 0; i < V; i++)
            free(toks[i]);
    if (merges != NULL)
        for (uint32_t m = 0; m < ng->n_merges; m++)
            free(merges[m]);
    free(toks);
    free(merges);
    free(types);
    return st;
}

static pd_status_t add_mat(gguf_writer_t *w, const char *name, uint32_t type, uint64_t ne0,
                           uint64_t ne1, const float *data)
{
    uint64_t ne[2] = { ne0, ne1 };
    return gguf_writer_add_tensor_f32(w, name, type, ne1 > 1 ? 2 : 1, ne, data);
}

static pd_status_t add_tensors(const mk_ngram_t *ng, gguf_writer_t *w)
{
    const uint64_t S = NG_SLOT, hd = NG_HEAD_DIM, K = S / hd, D = 3 * S, Q = 2 * S;
    const uint64_t V = ng->n_vocab, F = NG_FFN;
    const uint64_t big = (V > Q ? V : Q) * D;
    float *buf = calloc(big, sizeof(float));
    pd_status_t st = PD_ERR_NO_MEMORY;

    if (buf == NULL)
        return st;
    /* token_embd (V rows of D): class one-hot + constant */
    for (uint64_t t = 0; t < V; t++) {
        buf[t * D + ng->cls[t]] = 1.0f;
        buf[t * D + S - 1] = 1.0f;
    }
    W_CHECK(add_mat(w, "token_embd.weight", GGML_TYPE_F16, D, V, buf));
    /* attn_norm: the embedding rows have sum of squares 2: g = rms */
    for (uint64_t i = 0; i < D; i++)
        buf[i] = sqrtf(2.0f / (float)D + NG_RMS_EPS);
    W_CHECK(add_mat(w, "blk.0.attn_norm.weight", GGML_TYPE_F32, D, 1, buf));
    /* attn_q (Q rows of D): from the constant, phase -o*theta_i per pair */
    memset(buf, 0, Q * D * sizeof(float));
    double qmag = NG_SCALE * sqrt((double)hd) / NG_KMAG;
    for (uint64_t h = 0; h < 2 * K; h++) {
        double o = (double)(h % 2 + 1);
        for (uint64_t i = 0; i < hd / 2; i++) {
            double th = pow(NG_ROPE_BASE, -(double)(2 * i) / (double)hd);
            buf[(h * hd + 2 * i) * D + S - 1] = (float)(qmag * cos(o * th));
            buf[(h * hd + 2 * i + 1) * D + S - 1] = (float)(-qmag * sin(o * th));
        }
    }
    W_CHECK(add_mat(w, "blk.0.attn_q.weight", GGML_TYPE_F16, D, Q, buf));
    /* attn_k (S rows): (KMAG, 0) in every pair */
    memset(buf, 0, S * D * sizeof(float));
    for (uint64_t r = 0; r < S; r += 2)
        buf[r * D + S - 1] = (float)NG_KMAG;
    W_CHECK(add_mat(w, "blk.0.attn_k.weight", GGML_TYPE_F16, D, S, buf));
    /* attn_v (S rows): slot 0 classes, not the constant */
    memset(buf, 0, S * D * sizeof(float));
    for (uint64_t r = 0; r < S - 1; r++)
        buf[r * D + r] = 1.0f;
    W_CHECK(add_mat(w, "blk.0.attn_v.weight", GGML_TYPE_F16, D, S, buf));
    /* attn_output (D rows of Q): head 2k -> slot 1 chunk k, 2k+1 -> slot 2 */
    memset(buf, 0, D * Q * sizeof(float));
    for (uint64_t k = 0; k < K; k++)
        for (uint64_t d = 0; d < hd; d++) {
            buf[(S + k * hd + d) * Q + (2 * k) * hd + d] = 1.0f;
            buf[(2 * S + k * hd + d) * Q + (2 * k + 1) * hd + d] = 1.0f;
        }
    W_CHECK(add_mat(w, "blk.0.attn_output.weight", GGML_TYPE_F16, Q, D, buf));
    for (uint64_t i = 0; i < D; i++)
        buf[i] = 1.0f;
    W_CHECK(add_mat(w, "blk.0.ffn_norm.weight", GGML_TYPE_F32, D, 1, buf));
    memset(buf, 0, D * F * sizeof(float));
    W_CHECK(add_mat(w, "blk.0.ffn_gate.weight", GGML_TYPE_F16, D, F, buf));
    W_CHECK(add_mat(w, "blk.0.ffn_up.weight", GGML_TYPE_F16, D, F, buf));
    W_CHECK(add_mat(w, "blk.0.ffn_down.weight", GGML_TYPE_F16, F, D, buf));
    /* output_norm: h = const + three one-hots, sum of squares 4 */
    for (uint64_t i = 0; i < D; i++)
        buf[i] = sqrtf(4.0f / (float)D + NG_RMS_EPS);
    W_CHECK(add_mat(w, "output_norm.weight", GGML_TYPE_F32, D, 1, buf));
    /* output (V rows of D): [A | B | C] by class */
    memset(buf, 0, V * D * sizeof(float));
    for (uint64_t v = 0; v < V; v++)
        for (uint64_t c = 0; c < ng->n_classes; c++) {
            buf[v * D + c] = ng->A[c * V + v];
            buf[v * D + S + c] = ng->B[c * V + v];
            buf[v * D + 2 * S + c] = ng->C[c * V + v];
        }
    W_CHECK(add_mat(w, "output.weight", GGML_TYPE_F32, D, V, buf));
out:
    free(buf);
    return st;
}

pd_status_t mk_ngram_write(const mk_ngram_t *ng, const char *path, char *err, size_t err_len)
{
    gguf_writer_t *w;
    pd_status_t st;
    char desc[2048];

    if (gguf_writer_create(&w) != PD_OK)
        return ng_fail(err, err_len, PD_ERR_NO_MEMORY, "out of memory");
    mk_ngram_describe(ng, desc, sizeof(desc));
    W_CHECK(gguf_writer_set_alignment(w, 32));
    W_CHECK(gguf_writer_add_string(w, "general.architecture", "llama"));
    W_CHECK(gguf_writer_add_string(w, "general.name", ng->name));
    W_CHECK(gguf_writer_add_u32(w, "general.file_type", 1)); /* mostly f16 */
    W_CHECK(gguf_writer_add_u32(w, "general.quantization_version", 2));
    W_CHECK(gguf_writer_add_string(w, "general.description", desc));
    W_CHECK(gguf_writer_add_string(w, "pdserve.generator", "pd-mkmodel 1 ngram"));
    W_CHECK(gguf_writer_add_u64(w, "pdserve.seed", ng->seed));
    W_CHECK(gguf_writer_add_string(w, "pdserve.corpus.dir", ng->corpus_dir));
    W_CHECK(gguf_writer_add_string(w, "pdserve.corpus.files", ng->file_list));
    W_CHECK(gguf_writer_add_u64(w, "pdserve.corpus.fnv1a64", ng->corpus_hash));
    W_CHECK(gguf_writer_add_f32(w, "pdserve.ngram.lambda1", (float)ng->lambda1));
    W_CHECK(gguf_writer_add_f32(w, "pdserve.ngram.lambda2", (float)ng->lambda2));
    W_CHECK(gguf_writer_add_u32(w, "llama.context_length", NG_CTX));
    W_CHECK(gguf_writer_add_u32(w, "llama.embedding_length", 3 * NG_SLOT));
    W_CHECK(gguf_writer_add_u32(w, "llama.block_count", 1));
    W_CHECK(gguf_writer_add_u32(w, "llama.feed_forward_length", NG_FFN));
    W_CHECK(gguf_writer_add_u32(w, "llama.rope.dimension_count", NG_HEAD_DIM));
    W_CHECK(gguf_writer_add_f32(w, "llama.rope.freq_base", (float)NG_ROPE_BASE));
    W_CHECK(gguf_writer_add_u32(w, "llama.attention.head_count", 2 * NG_SLOT / NG_HEAD_DIM));
    W_CHECK(gguf_writer_add_u32(w, "llama.attention.head_count_kv", NG_SLOT / NG_HEAD_DIM));
    W_CHECK(gguf_writer_add_u32(w, "llama.attention.key_length", NG_HEAD_DIM));
    W_CHECK(gguf_writer_add_u32(w, "llama.attention.value_length", NG_HEAD_DIM));
    W_CHECK(gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", NG_RMS_EPS));
    W_CHECK(add_vocab(ng, w));
    W_CHECK(gguf_writer_add_u32(w, "llama.vocab_size", ng->n_vocab));
    W_CHECK(add_tensors(ng, w));
    st = gguf_writer_write(w, path, err, err_len);
    gguf_writer_destroy(w);
    return st;
out:
    gguf_writer_destroy(w);
    return ng_fail(err, err_len, st, "building %s: %s", path, pd_status_str(st));
}
