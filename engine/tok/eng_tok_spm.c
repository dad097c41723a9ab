/* eng_tok_spm.c - SentencePiece-style BPE by scores (tokenizer.ggml.model
 * "llama"), the algorithm of llama.cpp's llm_tokenizer_spm: start from UTF-8
 * characters, repeatedly merge the adjacent pair whose concatenation is the
 * vocabulary token with the highest score (leftmost on ties), then map every
 * final symbol to its token or, failing that, to byte tokens <0xNN>. */
#include <stdlib.h>
#include <string.h>

#include "eng_tok_int.h"
#include "eng_tok_heap.h"

typedef struct {
    uint32_t start, len; /* byte range in the text; len 0 = merged away */
    int32_t prev, next;
} spm_sym_t;

typedef struct {
    float score;
    int32_t left, right;
    uint32_t size;       /* combined length when queued: detects stale pairs */
} spm_bigram_t;


/* a before b: higher score first, then leftmost */
static bool bigram_before(const spm_bigram_t *a, const spm_bigram_t *b)
{
    if (a->score != b->score)
        return a->score > b->score;
    return a->left < b->left;
}

ENG_TOK_HEAP_DEFINE(spm_heap, spm_bigram_t, bigram_before)

static bool try_bigram(const eng_tok_t *tok, const char *text, const spm_sym_t *sym,
                       int32_t left, int32_t right, spm_heap_t *h)
{
    int32_t id;
    uint8_t t;
    spm_bigram_t b;

    if (left < 0 || right < 0 || sym[left].len + sym[right].len > tok->max_tok_len)
        return true;
    id = eng_tok_lookup(tok, text + sym[left].start, sym[left].len + sym[right].len);
    if (id < 0)
        return true;
    t = tok->types[id];
    if (t != ENG_TOKT_NORMAL && t != ENG_TOKT_USER_DEFINED)
        return true;
    b.score = tok->scores[id];
    b.left = left;
    b.right = right;
    b.size = sym[left].len + sym[right].len;
    return spm_heap_push(h, b);
}

pd_status_t eng_tok_spm_encode(const eng_tok_t *tok, const char *text,
                               size_t len, eng_tok_out_t *out)
{
    spm_sym_t *sym;
    spm_heap_t heap = { 0 };
    size_t i, n = 0;
    int32_t k;
    pd_status_t status = PD_ERR_NO_MEMORY;

    if (len == 0)
        return PD_OK;
    sym = malloc(len * sizeof(*sym));
    if (sym == NULL)
        return PD_ERR_NO_MEMORY;
    for (i = 0; i < len; n++) {
        size_t cl = eng_utf8_len((uint8_t)text[i]);
        if (cl == 0 || cl > len - i)
            cl = 1; /* cannot happen on sanitized input; stay safe */
        sym[n].start = (uint32_t)i;
        sym[n].len = (uint32_t)cl;
        sym[n].prev = (int32_t)n - 1;
        sym[n].next = (size_t)i + cl < len ? (int32_t)n + 1 : -1;
        i += cl;
    }
    for (i = 1; i < n; i++)
        if (!try_bigram(tok, text, sym, (int32_t)i - 1, (int32_t)i, &heap))
            goto out;

    while (heap.n > 0) {
        spm_bigram_t b = spm_heap_pop(&heap);
        spm_sym_t *l = &sym[b.left], *r = &sym[b.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.size)
            continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = b.left;
        if (!try_bigram(tok, text, sym, l->prev, b.left, &heap) ||
            !try_bigram(tok, text, sym, b.left, l->next, &heap))
            goto out;
    }

    for (k = 0; k >= 0; k = sym[k].next) {
        int32_t id = eng_tok_lookup(tok, text + sym[k].start, sym[k].len);
        if (id >= 0) {
            eng_tok_out_push(out, id);
            continue;
        }
        for (i = 0; i < sym[k].len; i++) {
            id = tok->byte_tok[(uint8_t)text[sym[k].start + i]];
            if (id < 0)
                id = tok->unk;
            if (id >= 0)
                eng_tok_out_push(out, id);
        }
    }
    status = PD_OK;
out:
    free(heap.a);
    free(sym);
    return status;
}
