/* eng_tok_bpe.c - byte-level BPE (tokenizer.ggml.model "gpt2").
 *
 * Text is split by the pre-tokenizer of tokenizer.ggml.pre: one of the three
 * regexes below (HF tokenizers' patterns, \p{L}/\p{N}/\s as Unicode classes,
 * PCRE2 UTF + UCP semantics), run by a hand-written scanner that is linear in
 * the text and needs no regex engine (a PCRE2 interpreter without its JIT,
 * e.g. under MemoryDenyWriteExecute, was superlinear: issue 31). Each
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

/* Pre-tokenizer patterns, as in the HF tokenizer.json files / llama.cpp.
 * The scanner (pre_match) implements them; tests/engine/tok compiles them
 * with PCRE2 and checks the scanner piece for piece (eng_tok_bpe_pattern). */
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

const char *eng_tok_bpe_pattern(const eng_tok_t *tok)
{
    switch (tok->pre) {
    case ENG_PRE_LLAMA3: return RE_LLAMA3;
    case ENG_PRE_QWEN2: return RE_QWEN2;
    case ENG_PRE_GPT2: break;
    }
    return RE_GPT2;
}

pd_status_t eng_tok_bpe_setup(eng_tok_t *tok, char *err, size_t err_len)
{
    (void)err;
    (void)err_len;
    /* llama.cpp's pre-type table, for the families whose pattern we ship */
    if (strcmp(tok->pre_name, "llama-bpe") == 0 || strcmp(tok->pre_name, "llama3") == 0 ||
        strcmp(tok->pre_name, "llama-v3") == 0) {
        tok->pre = ENG_PRE_LLAMA3;
        tok->ignore_merges = true;
    } else if (strcmp(tok->pre_name, "smaug-bpe") == 0 || strcmp(tok->pre_name, "dbrx") == 0) {
        tok->pre = ENG_PRE_LLAMA3;
    } else if (strcmp(tok->pre_name, "qwen2") == 0 ||
               strcmp(tok->pre_name, "deepseek-r1-qwen") == 0) {
        tok->pre = ENG_PRE_QWEN2;
    } else {
        tok->pre = ENG_PRE_GPT2; /* "default", "gpt2", and unknown names */
    }
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

/* ---- pre-tokenizer scanner ---------------------------------------------------
 *
 * pre_match(i) returns the end of the regex match that starts at i, taking
 * the alternatives in order with PCRE2's backtracking outcome worked out by
 * hand (comments name each alternative). With these patterns every valid
 * character starts a match (any character is \p{L}, \p{N}, \s or the rest),
 * so the pieces are the matches back to back; bytes that are not valid UTF-8
 * never match in PCRE2 (MATCH_INVALID_UTF) and form the pieces between
 * matches. Every character is decoded a bounded number of times: linear. */

typedef struct {
    uint32_t cp;
    uint32_t len; /* bytes */
    uint8_t cls;  /* ENG_UC_* */
} uc_char_t;

#define UC_BAD 0x80u /* not valid UTF-8: a one-byte "character" in no class */

static void char_at(const char *text, size_t len, size_t i, uc_char_t *c)
{
    const uint8_t *s = (const uint8_t *)text + i;
    uint8_t b = s[0];

    if (b < 0x80) {
        c->cp = b;
        c->len = 1;
        c->cls = (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') ? ENG_UC_L
                 : b >= '0' && b <= '9'                          ? ENG_UC_N
                 : b == ' ' || (b >= 0x09 && b <= 0x0d)          ? ENG_UC_S
                                                                  : 0;
        return;
    }
    c->len = (uint32_t)eng_utf8_valid(s, len - i);
    switch (c->len) {
    case 2: c->cp = ((uint32_t)(b & 0x1f) << 6) | (s[1] & 0x3f); break;
    case 3: c->cp = ((uint32_t)(b & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) |
                    (s[2] & 0x3f); break;
    case 4: c->cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3f) << 12) |
                    ((uint32_t)(s[2] & 0x3f) << 6) | (s[3] & 0x3f); break;
    default:
        c->cp = 0xfffd;
        c->len = 1;
        c->cls = UC_BAD;
        return;
    }
    c->cls = eng_uc_class(c->cp);
}

static bool is_other(uint8_t cls) /* [^\s\p{L}\p{N}], valid */
{
    return (cls & (ENG_UC_L | ENG_UC_N | ENG_UC_S | UC_BAD)) == 0;
}

/* End of the run of characters from i on whose class has one of bits. */
static size_t run_of(const char *s, size_t len, size_t i, uint8_t bits)
{
    uc_char_t c;

    while (i < len) {
        char_at(s, len, i, &c);
        if ((c.cls & bits) == 0)
            break;
        i += c.len;
    }
    return i;
}

/* End of the run of "other" characters ([^\s\p{L}\p{N}]) from i on. */
static size_t run_other(const char *s, size_t len, size_t i)
{
    uc_char_t c;

    while (i < len) {
        char_at(s, len, i, &c);
        if (!is_other(c.cls))
            break;
        i += c.len;
    }
    return i;
}

/* One letter of a contraction at p: its ASCII lower case (caseless: A-Z
 * fold, and U+017F LONG S is 's' as PCRE2's caseless matching has it),
 * and its length; 0 if none. */
static char contraction_letter(const char *s, size_t len, size_t p, bool caseless,
                               size_t *n_p)
{
    char ch;

    if (p >= len)
        return 0;
    *n_p = 1;
    ch = s[p];
    if (caseless && ch >= 'A' && ch <= 'Z')
        return (char)(ch - 'A' + 'a');
    if (caseless && p + 1 < len && (uint8_t)ch == 0xc5 && (uint8_t)s[p + 1] == 0xbf) {
        *n_p = 2;
        return 's';
    }
    return ch;
}

/* '(s|t|re|ve|m|ll|d) after the apostrophe at p - 1: bytes matched after it, 0 if none. */
static size_t contraction(const char *s, size_t len, size_t p, bool caseless)
{
    size_t n1 = 0, n2 = 0;
    char a = contraction_letter(s, len, p, caseless, &n1), b;

    switch (a) {
    case 's': case 't': case 'm': case 'd':
        return n1;
    case 'r': case 'v': case 'l':
        b = contraction_letter(s, len, p + n1, caseless, &n2);
        if ((a != 'l' && b == 'e') || (a == 'l' && b == 'l'))
            return n1 + n2;
        return 0;
    default:
        return 0;
    }
}

/* \s+(?!\S) | \s+ from i (a whitespace character): the whole run at the end
 * of the text, before an invalid byte (which \S does not match either) or
 * when it is one character, else the run less its last character (that one
 * goes with the word after it). */
static size_t match_space(const char *s, size_t len, size_t i)
{
    size_t j = i, last = i;
    uc_char_t c = { 0, 0, 0 };

    while (j < len) {
        char_at(s, len, j, &c);
        if ((c.cls & ENG_UC_S) == 0)
            break;
        last = j;
        j += c.len;
    }
    if (j == len || last == i || (c.cls & UC_BAD))
        return j;
    return last;
}

static size_t match_gpt2(const char *s, size_t len, size_t i, const uc_char_t *c0)
{
    uc_char_t c1;

    /* 's|'t|'re|'ve|'m|'ll|'d */
    if (c0->cp == '\'') {
        size_t k = contraction(s, len, i + 1, false);
        if (k > 0)
            return i + 1 + k;
    }
    /*  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ with the space */
    if (c0->cp == ' ' && i + 1 < len) {
        char_at(s, len, i + 1, &c1);
        if (c1.cls & (ENG_UC_L | ENG_UC_N))
            return run_of(s, len, i + 1 + c1.len, c1.cls & (ENG_UC_L | ENG_UC_N));
        if (is_other(c1.cls))
            return run_other(s, len, i + 1 + c1.len);
    }
    /* the same without it */
    if (c0->cls & ENG_UC_L)
        return run_of(s, len, i + c0->len, ENG_UC_L);
    if (c0->cls & ENG_UC_N)
        return run_of(s, len, i + c0->len, ENG_UC_N);
    if (is_other(c0->cls))
        return run_other(s, len, i + c0->len);
    /* \s+(?!\S) | \s+ */
    return match_space(s, len, i);
}

/* llama3: max_digits 3; qwen2: 1 */
static size_t match_llama3(const char *s, size_t len, size_t i, const uc_char_t *c0,
                           unsigned max_digits)
{
    uc_char_t c1;
    size_t j, crlf_end;
    unsigned k;

    /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (c0->cp == '\'') {
        size_t n = contraction(s, len, i + 1, true);
        if (n > 0)
            return i + 1 + n;
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if ((c0->cls & (ENG_UC_L | ENG_UC_N | UC_BAD)) == 0 && c0->cp != '\r' && c0->cp != '\n' &&
        i + c0->len < len) {
        char_at(s, len, i + c0->len, &c1);
        if (c1.cls & ENG_UC_L)
            return run_of(s, len, i + c0->len + c1.len, ENG_UC_L);
    }
    if (c0->cls & ENG_UC_L)
        return run_of(s, len, i + c0->len, ENG_UC_L);
    /* \p{N}{1,3} (qwen2: \p{N}) */
    if (c0->cls & ENG_UC_N) {
        j = i + c0->len;
        for (k = 1; k < max_digits && j < len; k++) {
            char_at(s, len, j, &c1);
            if ((c1.cls & ENG_UC_N) == 0)
                break;
            j += c1.len;
        }
        return j;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    j = i;
    if (c0->cp == ' ' && i + 1 < len) {
        char_at(s, len, i + 1, &c1);
        if (is_other(c1.cls))
            j = i + 1;
    }
    if (j > i || is_other(c0->cls)) {
        j = run_other(s, len, j);
        while (j < len && (s[j] == '\r' || s[j] == '\n'))
            j++;
        return j;
    }
    /* \s*[\r\n]+ : the whitespace run up to its last CR or LF */
    crlf_end = 0;
    for (j = i; j < len;) {
        char_at(s, len, j, &c1);
        if ((c1.cls & ENG_UC_S) == 0)
            break;
        if (c1.cp == '\r' || c1.cp == '\n')
            crlf_end = j + 1;
        j += c1.len;
    }
    if (crlf_end > 0)
        return crlf_end;
    /* \s+(?!\S) | \s+ */
    return match_space(s, len, i);
}

/* End of the piece that starts at i (> i). */
static size_t pre_match(const eng_tok_t *tok, const char *s, size_t len, size_t i)
{
    uc_char_t c0;

    char_at(s, len, i, &c0);
    if (c0.cls & UC_BAD) {
        do {
            i++;
            if (i < len)
                char_at(s, len, i, &c0);
        } while (i < len && (c0.cls & UC_BAD));
        return i;
    }
    switch (tok->pre) {
    case ENG_PRE_LLAMA3: return match_llama3(s, len, i, &c0, 3);
    case ENG_PRE_QWEN2: return match_llama3(s, len, i, &c0, 1);
    case ENG_PRE_GPT2: break;
    }
    return match_gpt2(s, len, i, &c0);
}

/* Walk the pre-tokenizer pieces of text, calling fn on each. */
typedef pd_status_t (*piece_fn_t)(void *arg, const char *s, size_t len);

static pd_status_t split_pieces(const eng_tok_t *tok, const char *text, size_t len,
                                piece_fn_t fn, void *arg)
{
    size_t i = 0;

    while (i < len) {
        size_t e = pre_match(tok, text, len, i);
        pd_status_t status = fn(arg, text + i, e - i);
        if (status != PD_OK)
            return status;
        i = e;
    }
    return PD_OK;
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

    if (tok->kind != ENG_TOK_BPE)
        return 0;
    (void)split_pieces(tok, text, len, split_cb, &c);
    return c.n;
}
