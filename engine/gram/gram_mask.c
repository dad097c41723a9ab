/* gram_mask.c - the vocabulary (pieces bucketed by their first two bytes,
 * "plain" string-body pieces) and the per-step token mask with its
 * string-body cache. */
#include "gram_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- vocabulary ------------------------------------------------------------ */

struct eng_gram_vocab {
    uint32_t n;
    uint32_t *off;          /* (n + 1) into bytes */
    uint8_t *bytes;
    uint8_t *plain;         /* (n) 1: piece is string-body text (no '"', '\\', controls;
                               complete UTF-8 sequences) */
    uint16_t *pre;          /* (n) bytes before the first non-plain one */
    uint32_t *by_first;     /* non-empty ids sorted by (first byte, second byte or
                               256 for one-byte pieces) */
    uint32_t *off2;         /* (256 * 257 + 1) bucket starts in by_first */
    uint32_t *nonplain;     /* non-empty ids that are not plain */
    uint32_t n_nonplain;
    uint32_t max_piece;     /* longest piece, bytes */
    uint32_t *empty;        /* ids with an empty piece (control tokens) */
    uint32_t n_empty;
};

/* Length of the longest prefix of p that is string-body text ending on a
 * character boundary (no '"', '\\', controls; complete UTF-8 sequences). */
static size_t plain_prefix(const uint8_t *p, size_t n)
{
    uint32_t need = 0;
    size_t good = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = p[i];
        if (need) {
            if (b < 0x80 || b > 0xbf)
                return good;
            if (--need == 0)
                good = i + 1;
            continue;
        }
        if (b == '"' || b == '\\' || b < 0x20)
            return good;
        if (b >= 0x80) {
            if (b >= 0xc2 && b <= 0xdf)
                need = 1;
            else if (b >= 0xe0 && b <= 0xef)
                need = 2;
            else if (b >= 0xf0 && b <= 0xf4)
                need = 3;
            else
                return good;
        } else {
            good = i + 1;
        }
    }
    return good;
}

static uint32_t bucket2(const eng_gram_vocab_t *v, uint32_t id)
{
    const uint8_t *p = v->bytes + v->off[id];
    uint32_t len = v->off[id + 1] - v->off[id];
    return (uint32_t)p[0] * 257u + (len > 1 ? p[1] : 256u);
}

pd_status_t eng_gram_vocab_create(uint32_t n, eng_gram_piece_fn piece, void *ctx,
                                  eng_gram_vocab_t **v_p)
{
    *v_p = NULL;
    eng_gram_vocab_t *v = calloc(1, sizeof(*v));
    if (!v)
        return PD_ERR_NO_MEMORY;
    v->n = n;
    v->off = malloc(((size_t)n + 1) * sizeof(uint32_t));
    v->plain = calloc(n ? n : 1, 1);
    v->by_first = malloc((n ? n : 1) * sizeof(uint32_t));
    v->pre = calloc(n ? n : 1, sizeof(uint16_t));
    v->off2 = calloc(256 * 257 + 1, sizeof(uint32_t));
    v->nonplain = malloc((n ? n : 1) * sizeof(uint32_t));
    v->empty = malloc((n ? n : 1) * sizeof(uint32_t));
    size_t cap = (size_t)n * 8 + 64, used = 0;
    v->bytes = malloc(cap);
    if (!v->off || !v->plain || !v->by_first || !v->nonplain || !v->bytes || !v->pre ||
        !v->off2 || !v->empty)
        goto oom;
    char buf[512];
    for (uint32_t i = 0; i < n; i++) {
        size_t k = piece(ctx, (int32_t)i, buf, sizeof(buf));
        if (k > sizeof(buf) || used + k > UINT32_MAX)
            k = 0;
        if (used + k > cap) {
            size_t nc = cap * 2 + k;
            uint8_t *q = realloc(v->bytes, nc);
            if (!q)
                goto oom;
            v->bytes = q;
            cap = nc;
        }
        v->off[i] = (uint32_t)used;
        if (k > v->max_piece)
            v->max_piece = (uint32_t)k;
        memcpy(v->bytes + used, buf, k);
        used += k;
        if (k == 0)
            v->empty[v->n_empty++] = i;
        if (k) {
            size_t pl = plain_prefix((const uint8_t *)buf, k);
            v->pre[i] = (uint16_t)pl;
            v->plain[i] = pl == k;
            if (!v->plain[i])
                v->nonplain[v->n_nonplain++] = i;
        }
    }
    v->off[n] = (uint32_t)used;
    /* counting sort by (first byte, second byte | 256) */
    for (uint32_t i = 0; i < n; i++)
        if (v->off[i + 1] > v->off[i])
            v->off2[bucket2(v, i) + 1]++;
    for (uint32_t b = 0; b < 256 * 257; b++)
        v->off2[b + 1] += v->off2[b];
    uint32_t *pos = malloc(256 * 257 * sizeof(uint32_t));
    if (!pos)
        goto oom;
    memcpy(pos, v->off2, 256 * 257 * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++)
        if (v->off[i + 1] > v->off[i])
            v->by_first[pos[bucket2(v, i)]++] = i;
    free(pos);
    *v_p = v;
    return PD_OK;
oom:
    eng_gram_vocab_free(v);
    return PD_ERR_NO_MEMORY;
}

void eng_gram_vocab_free(eng_gram_vocab_t *v)
{
    if (!v)
        return;
    free(v->off);
    free(v->bytes);
    free(v->plain);
    free(v->by_first);
    free(v->pre);
    free(v->off2);
    free(v->nonplain);
    free(v->empty);
    free(v);
}

uint32_t eng_gram_vocab_size(const eng_gram_vocab_t *v)
{
    return v ? v->n : 0;
}

bool eng_gram_feed_token(eng_gram_state_t *s, const eng_gram_vocab_t *v, int32_t id)
{
    if (id < 0 || (uint32_t)id >= v->n)
        return false;
    return eng_gram_feed(s, v->bytes + v->off[id], v->off[id + 1] - v->off[id]);
}

/* Every configuration sits in a string body with no pending UTF-8 byte:
 * then a plain piece always walks (and leaves the state as it was). */
static bool in_string_body(const eng_gram_t *g, const set_t *st)
{
    if (st->n == 0)
        return false;
    for (uint32_t i = 0; i < st->n; i++) {
        const cfg_t *c = &st->c[i];
        if (c->n == 0)
            return false;
        const frame_t *f = &c->f[c->n - 1];
        /* a bounded string counts its characters: pieces change the state */
        if (g->nodes[f->node].kind != N_STR || g->nodes[f->node].n != 0 || f->phase != S_BODY)
            return false;
    }
    return true;
}

/* The ok flags of one step; budget as in eng_gram_mask (UINT32_MAX: no
 * budget check). A token passes the budget check when, after it, the JSON
 * can still be closed with one-byte tokens and EOS in the tokens left. */
static void mask_ok(const eng_gram_state_t *s, const eng_gram_vocab_t *v, uint32_t nv,
                    uint32_t budget, uint8_t *ok)
{
    const eng_gram_t *g = s->g;
    set_t *ta = (set_t *)&s->tmp[0], *tb = (set_t *)&s->tmp[1];
    const bool tight = budget != UINT32_MAX;
    /* after a token, tokens left = budget - 1, one of them for EOS */
    const uint32_t room = budget >= 2 ? budget - 2 : 0;
#define FITS(set) (!tight || gram_set_close(g, (set)) <= room)
    if (in_string_body(g, &s->cur)) {
        if (FITS(&s->cur))
            memcpy(ok, v->plain, nv);
        else
            memset(ok, 0, nv);
        eng_gram_state_t *ms = (eng_gram_state_t *)s;
        if (!tight && ms->sc_ok && ms->sc_vocab == v && gram_sets_equal(&ms->sc_set, &s->cur)) {
            for (uint32_t k = 0; k < ms->sc_n; k++)
                if (ms->sc_ok[k] < nv)
                    ok[ms->sc_ok[k]] = 1;
            return;
        }
        /* the plain prefix leaves the state as it is: walk from there */
        uint32_t n_ok_np = 0;
        for (uint32_t k = 0; k < v->n_nonplain; k++) {
            uint32_t id = v->nonplain[k];
            if (id >= nv)
                continue;
            uint32_t o = v->off[id] + v->pre[id], e = v->off[id + 1];
            const set_t *r = gram_walk(g, &s->cur, v->bytes + o, e - o, ta, tb);
            bool y = r != NULL && FITS(r);
            ok[id] = y;
            n_ok_np += y;
        }
        if (tight)
            return;
        /* remember the walked ids for the next step in the same string */
        free(ms->sc_ok);
        ms->sc_ok = malloc((n_ok_np ? n_ok_np : 1) * sizeof(uint32_t));
        ms->sc_n = 0;
        if (ms->sc_ok) {
            for (uint32_t k = 0; k < v->n_nonplain; k++)
                if (v->nonplain[k] < nv && ok[v->nonplain[k]])
                    ms->sc_ok[ms->sc_n++] = v->nonplain[k];
            ms->sc_vocab = v;
            gram_set_copy(&ms->sc_set, &s->cur);
        }
        return;
    }
    memset(ok, 0, nv);
    set_t first, second;
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t lo = v->off2[b * 257], hi = v->off2[b * 257 + 257];
        if (lo == hi)
            continue;
        gram_set_feed(g, &s->cur, (uint8_t)b, &first);
        if (first.n == 0)
            continue;
        for (uint32_t b2 = 0; b2 < 257; b2++) {
            uint32_t lo2 = v->off2[b * 257 + b2], hi2 = v->off2[b * 257 + b2 + 1];
            if (lo2 == hi2)
                continue;
            if (b2 == 256) { /* one-byte pieces */
                if (FITS(&first))
                    for (uint32_t k = lo2; k < hi2; k++)
                        if (v->by_first[k] < nv)
                            ok[v->by_first[k]] = 1;
                continue;
            }
            gram_set_feed(g, &first, (uint8_t)b2, &second);
            if (second.n == 0)
                continue;
            for (uint32_t k = lo2; k < hi2; k++) {
                uint32_t id = v->by_first[k];
                if (id >= nv)
                    continue;
                uint32_t o = v->off[id] + 2, e = v->off[id + 1];
                const set_t *r = gram_walk(g, &second, v->bytes + o, e - o, ta, tb);
                ok[id] = r != NULL && FITS(r);
            }
        }
    }
#undef FITS
}

bool eng_gram_mask(const eng_gram_state_t *s, const eng_gram_vocab_t *v,
                   const int32_t *eos, uint32_t n_eos, float *logits, uint32_t n_logits,
                   uint8_t *ok, uint32_t budget)
{
    uint32_t nv = v->n < n_logits ? v->n : n_logits;
    /* the budget matters only once one token could make the JSON too long
     * to close: a byte opens at most one value of max_min bytes */
    uint32_t close = gram_set_close(s->g, &s->cur);
    uint64_t reach = (uint64_t)close + (uint64_t)s->g->max_min * v->max_piece + 2;
    if (budget != UINT32_MAX && (uint64_t)budget > reach)
        budget = UINT32_MAX;
    if (budget == UINT32_MAX && nv == n_logits && in_string_body(s->g, &s->cur)) {
        /* fast path inside a string: every plain piece passes and the state
         * stays, so only the non-plain ids that do not walk (and EOS: a
         * string is never complete) are masked; their walk is cached */
        const eng_gram_state_t *ms = s;
        if (ms->sc_ok && ms->sc_vocab == v && gram_sets_equal(&ms->sc_set, &s->cur)) {
            uint32_t j = 0;
            for (uint32_t k = 0; k < v->n_nonplain; k++) {
                uint32_t id = v->nonplain[k];
                while (j < ms->sc_n && ms->sc_ok[j] < id)
                    j++;
                if (!(j < ms->sc_n && ms->sc_ok[j] == id))
                    logits[id] = -INFINITY;
            }
            for (uint32_t k = 0; k < v->n_empty; k++)
                logits[v->empty[k]] = -INFINITY; /* control tokens, EOS included */
            for (uint32_t k = 0; k < n_eos; k++)
                if (eos[k] >= 0 && (uint32_t)eos[k] < n_logits)
                    logits[eos[k]] = -INFINITY;
            return true;
        }
    }
    mask_ok(s, v, nv, budget, ok);
    bool done = eng_gram_complete(s);
    bool any = nv > 0 && memchr(ok, 1, nv) != NULL;
    if (!any && !done && budget != UINT32_MAX) {
        /* too late to close in budget: at least keep the output a prefix */
        mask_ok(s, v, nv, UINT32_MAX, ok);
        any = nv > 0 && memchr(ok, 1, nv) != NULL;
    }
    if (done && budget != UINT32_MAX && budget <= 1)
        memset(ok, 0, nv); /* the last token: EOS (a text grammar could go on) */
    uint32_t n_eos_ok = 0;
    for (uint32_t i = 0; i < n_eos; i++)
        if (eos[i] >= 0 && (uint32_t)eos[i] < n_logits) {
            if ((uint32_t)eos[i] < nv)
                ok[eos[i]] = done;
            n_eos_ok += done;
        }
    if (n_eos_ok == 0 && (nv == 0 || memchr(ok, 1, nv) == NULL))
        return false;
    for (uint32_t i = 0; i < nv; i++)
        if (!ok[i])
            logits[i] = -INFINITY;
    for (uint32_t i = nv; i < n_logits; i++) {
        bool e = false;
        for (uint32_t k = 0; k < n_eos; k++)
            e |= eos[k] == (int32_t)i;
        if (!(e && done))
            logits[i] = -INFINITY;
    }
    return true;
}
