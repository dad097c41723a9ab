/* eng_tok_bpe.c - byte-level BPE (tokenizer.ggml.model "gpt2").
 *
 * Text is split by the pre-tokenizer regex of tokenizer.ggml.pre (PCRE2 with
 * UTF + UCP so \p{L}/\p{N}/\s are Unicode classes, as in HF tokenizers), each
 * piece is mapped byte -> code point (GPT-2 bytes_to_unicode), and the
 * adjacent pair with the lowest merge rank is merged until none applies
 * (leftmost first on equal ranks), exactly HF's BPE model. Llama-3 sets
 * ignore_merges: a piece that is itself a token is emitted directly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "eng_tok_int.h"
#include "eng_tok_heap.h"

/* Pre-tokenizer patterns, as in the HF tokenizer.json files / llama.cpp. */
static const char RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char RE_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ---- GPT-2 bytes_to_unicode ------------------------------------------------ */

static bool byte_printable(unsigned b)
{
    return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

uint32_t eng_bpe_byte_to_cp(uint8_t b)
{
    unsigned i, n = 0;

    if (byte_printable(b))
        return b;
    for (i = 0; i < b; i++)
        if (!byte_printable(i))
            n++;
    return 256 + n;
}

int eng_bpe_cp_to_byte(uint32_t cp)
{
    unsigned i, n = 0;

    if (cp < 256)
        return byte_printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68)
        return -1;
    for (i = 0; i < 256; i++) {
        if (!byte_printable(i)) {
            if (256 + n == cp)
                return (int)i;
            n++;
        }
    }
    return -1;
}

pd_status_t eng_tok_bpe_setup(eng_tok_t *tok, char *err, size_t err_len)
{
    const char *pat = RE_GPT2;
    int errcode;
    PCRE2_SIZE erroff;

    /* llama.cpp's pre-type table, for the families whose pattern we ship */
    if (strcmp(tok->pre_name, "llama-bpe") == 0 || strcmp(tok->pre_name, "llama3") == 0 ||
        strcmp(tok->pre_name, "llama-v3") == 0) {
        tok->pre = ENG_PRE_LLAMA3;
        pat = RE_LLAMA3;
        tok->ignore_merges = true;
    } else if (strcmp(tok->pre_name, "smaug-bpe") == 0 || strcmp(tok->pre_name, "dbrx") == 0) {
        tok->pre = ENG_PRE_LLAMA3;
        pat = RE_LLAMA3;
    } else if (strcmp(tok->pre_name, "qwen2") == 0 ||
               strcmp(tok->pre_name, "deepseek-r1-qwen") == 0) {
        tok->pre = ENG_PRE_QWEN2;
        pat = RE_QWEN2;
    } else {
        tok->pre = ENG_PRE_GPT2; /* "default", "gpt2", and unknown names */
    }
    tok->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                            &errcode, &erroff, NULL);
    if (tok->re == NULL) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "tokenizer: pre-tokenizer regex error %d at %zu",
                     errcode, (size_t)erroff);
        return PD_ERR_INTERNAL;
    }
    (void)pcre2_jit_compile(tok->re, PCRE2_JIT_COMPLETE); /* optional speed-up */
    return PD_OK;
}

/* rank of merging (l, r), UINT32_MAX if no such merge */
static uint32_t merge_rank(const eng_tok_t *tok, int32_t l, int32_t r)
{
    uint32_t h;

    if (tok->merges == NULL)
        return UINT32_MAX;
    h = (uint32_t)XXH3_64bits_withSeed(&l, sizeof(l), (uint64_t)r) & tok->merge_mask;
    while (tok->merges[h].rank != UINT32_MAX) {
        if (tok->merges[h].l == (uint32_t)l && tok->merges[h].r == (uint32_t)r)
            return tok->merges[h].rank;
        h = (h + 1) & tok->merge_mask;
    }
    return UINT32_MAX;
}

typedef struct {
    int32_t id;
    uint32_t start, len; /* byte range in the mapped text; len 0 = merged away */
    int32_t prev, next;
} bpe_sym_t;

typedef struct {
    uint32_t rank;
    int32_t left, right;
    int32_t l_id, r_id;
} bpe_pair_t;

static bool pair_before(const bpe_pair_t *a, const bpe_pair_t *b)
{
    if (a->rank != b->rank)
        return a->rank < b->rank;
    return a->left < b->left;
}


ENG_TOK_HEAP_DEFINE(bpe_heap, bpe_pair_t, pair_before)

static bool try_pair(const eng_tok_t *tok, const bpe_sym_t *sym, int32_t left,
                     int32_t right, bpe_heap_t *h)
{
    bpe_pair_t p;

    if (left < 0 || right < 0 || sym[left].id < 0 || sym[right].id < 0)
        return true;
    p.rank = merge_rank(tok, sym[left].id, sym[right].id);
    if (p.rank == UINT32_MAX)
        return true;
    p.left = left;
    p.right = right;
    p.l_id = sym[left].id;
    p.r_id = sym[right].id;
    return bpe_heap_push(h, p);
}

/* BPE of one pre-tokenized piece. map is scratch of >= 2 * len bytes. */
static pd_status_t bpe_piece(const eng_tok_t *tok, const char *s, size_t len,
                             char *map, bpe_sym_t *sym, bpe_heap_t *heap,
                             eng_tok_out_t *out)
{
    size_t i, o = 0, n = 0;
    int32_t k, id;

    for (i = 0; i < len; i++) {
        size_t cl = eng_utf8_put(eng_bpe_byte_to_cp((uint8_t)s[i]), map + o);
        sym[n].id = tok->byte_tok[(uint8_t)s[i]];
        sym[n].start = (uint32_t)o;
        sym[n].len = (uint32_t)cl;
        sym[n].prev = (int32_t)n - 1;
        sym[n].next = i + 1 < len ? (int32_t)n + 1 : -1;
        o += cl;
        n++;
    }
    if (tok->ignore_merges) {
        id = eng_tok_lookup(tok, map, o);
        if (id >= 0) {
            eng_tok_out_push(out, id);
            return PD_OK;
        }
    }
    heap->n = 0;
    for (i = 1; i < n; i++)
        if (!try_pair(tok, sym, (int32_t)i - 1, (int32_t)i, heap))
            return PD_ERR_NO_MEMORY;
    while (heap->n > 0) {
        bpe_pair_t p = bpe_heap_pop(heap);
        bpe_sym_t *l = &sym[p.left], *r = &sym[p.right];
        if (l->len == 0 || r->len == 0 || l->next != p.right ||
            l->id != p.l_id || r->id != p.r_id)
            continue;
        id = eng_tok_lookup(tok, map + l->start, l->len + r->len);
        if (id < 0)
            continue; /* merge whose result is not a token: ignore */
        l->id = id;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = p.left;
        if (!try_pair(tok, sym, l->prev, p.left, heap) ||
            !try_pair(tok, sym, p.left, l->next, heap))
            return PD_ERR_NO_MEMORY;
    }
    for (k = 0; k >= 0; k = sym[k].next) {
        if (sym[k].id >= 0) {
            eng_tok_out_push(out, sym[k].id);
        } else if (tok->unk >= 0) {
            eng_tok_out_push(out, tok->unk);
        }
    }
    return PD_OK;
}

/* Walk the pre-tokenizer pieces of text, calling fn on each (gaps between
 * regex matches are pieces too, as in HF's split with "isolated" behavior). */
typedef pd_status_t (*piece_fn_t)(void *arg, const char *s, size_t len);

static pd_status_t split_pieces(const eng_tok_t *tok, const char *text, size_t len,
                                piece_fn_t fn, void *arg)
{
    pcre2_match_data *md;
    PCRE2_SIZE off = 0, prev = 0;
    pd_status_t status = PD_OK;

    md = pcre2_match_data_create_from_pattern(tok->re, NULL);
    if (md == NULL)
        return PD_ERR_NO_MEMORY;
    while (off < len) {
        int rc = pcre2_match(tok->re, (PCRE2_SPTR)text, len, off, 0, md, NULL);
        PCRE2_SIZE *ov, ms, me;
        if (rc < 0)
            break; /* no match or a limit: the rest is one piece */
        ov = pcre2_get_ovector_pointer(md);
        ms = ov[0];
        me = ov[1];
        if (ms > prev) {
            status = fn(arg, text + prev, ms - prev);
            if (status != PD_OK)
                goto out;
            prev = ms;
        }
        if (me == ms) {
            /* empty match (not produced by our patterns): step one character */
            size_t cl = eng_utf8_len((uint8_t)text[ms]);
            off = ms + (cl == 0 || cl > len - ms ? 1 : cl);
            continue;
        }
        status = fn(arg, text + ms, me - ms);
        if (status != PD_OK)
            goto out;
        off = prev = me;
    }
    if (len > prev)
        status = fn(arg, text + prev, len - prev);
out:
    pcre2_match_data_free(md);
    return status;
}

typedef struct {
    const eng_tok_t *tok;
    char *map;
    bpe_sym_t *sym;
    bpe_heap_t heap;
    eng_tok_out_t *out;
} bpe_ctx_t;

static pd_status_t bpe_piece_cb(void *arg, const char *s, size_t len)
{
    bpe_ctx_t *c = arg;

    return bpe_piece(c->tok, s, len, c->map, c->sym, &c->heap, c->out);
}

pd_status_t eng_tok_bpe_encode(const eng_tok_t *tok, const char *text,
                               size_t len, eng_tok_out_t *out)
{
    bpe_ctx_t c = { .tok = tok, .out = out };
    pd_status_t status = PD_ERR_NO_MEMORY;

    if (len == 0)
        return PD_OK;
    c.map = malloc(2 * len + 1);
    c.sym = malloc(len * sizeof(*c.sym));
    if (c.map != NULL && c.sym != NULL)
        status = split_pieces(tok, text, len, bpe_piece_cb, &c);
    free(c.heap.a);
    free(c.sym);
    free(c.map);
    return status;
}

typedef struct {
    size_t *ends;
    size_t cap, n;
    const char *base;
} split_ctx_t;

static pd_status_t split_cb(void *arg, const char *s, size_t len)
{
    split_ctx_t *c = arg;

    if (c->n < c->cap)
        c->ends[c->n] = (size_t)(s - c->base) + len;
    c->n++;
    return PD_OK;
}

size_t eng_tok_bpe_split(const eng_tok_t *tok, const char *text, size_t len,
                         size_t *ends, size_t cap)
{
    split_ctx_t c = { .ends = ends, .cap = cap, .n = 0, .base = text };

    if (tok->re == NULL)
        return 0;
    (void)split_pieces(tok, text, len, split_cb, &c);
    return c.n;
}
