/* eng_detok.c - streaming detokenizer and stop-string matcher. */
#include <assert.h>
#include <string.h>

#include "eng_tok_int.h"

#define REPLACEMENT "\xef\xbf\xbd"

void eng_detok_init(eng_detok_t *d, const eng_tok_t *tok, bool special,
                    bool strip_prefix_space)
{
    memset(d, 0, sizeof(*d));
    d->tok = tok;
    d->special = special;
    d->strip_space = strip_prefix_space && tok->kind == ENG_TOK_SPM &&
                     tok->add_space_prefix;
}

/* Emit the complete characters of buf[0..n) to out, keep a trailing
 * incomplete (but so far valid) sequence in d->pend. */
static size_t drain(eng_detok_t *d, const uint8_t *buf, size_t n, char *out)
{
    size_t i = 0, o = 0;

    d->n_pend = 0;
    while (i < n) {
        bool complete;
        size_t k = eng_utf8_prefix(buf + i, n - i, &complete);
        if (complete) {
            memcpy(out + o, buf + i, k);
            o += k;
            i += k;
        } else if (k > 0 && i + k == n) {
            memcpy(d->pend, buf + i, k); /* may still complete: wait */
            d->n_pend = (uint8_t)k;
            break;
        } else {
            memcpy(out + o, REPLACEMENT, 3);
            o += 3;
            i += k > 0 ? k : 1;
        }
    }
    return o;
}

size_t eng_detok_feed(eng_detok_t *d, int32_t id, char *out, size_t cap)
{
    uint8_t buf[ENG_TOK_PIECE_MAX + 4];
    size_t n, p;
    const uint8_t *pc;

    assert(cap >= ENG_DETOK_OUT_MAX); /* caller bug otherwise */
    if (cap < ENG_DETOK_OUT_MAX)
        return 0;
    memcpy(buf, d->pend, d->n_pend);
    n = d->n_pend;
    p = eng_tok_token_piece(d->tok, id, d->special, (char *)buf + n, ENG_TOK_PIECE_MAX);
    pc = buf + n;
    if (p > 0 && !d->started && eng_tok_token_type(d->tok, id) != ENG_TOKT_CONTROL) {
        d->started = true;
        if (d->strip_space && pc[0] == ' ') {
            memmove(buf + n, buf + n + 1, p - 1);
            p--;
        }
    }
    return drain(d, buf, n + p, out);
}

size_t eng_detok_finish(eng_detok_t *d, char *out, size_t cap)
{
    if (d->n_pend == 0 || cap < 3)
        return 0;
    d->n_pend = 0;
    memcpy(out, REPLACEMENT, 3);
    return 3;
}

size_t eng_tok_decode(const eng_tok_t *tok, const int32_t *ids, size_t n,
                      bool special, bool strip_prefix_space,
                      char *buf, size_t cap)
{
    static __thread char tmp[ENG_DETOK_OUT_MAX];
    eng_detok_t d;
    size_t i, total = 0, k;

    eng_detok_init(&d, tok, special, strip_prefix_space);
    for (i = 0; i <= n; i++) {
        k = i < n ? eng_detok_feed(&d, ids[i], tmp, sizeof(tmp))
                  : eng_detok_finish(&d, tmp, sizeof(tmp));
        if (total < cap)
            memcpy(buf + total, tmp, k < cap - total ? k : cap - total);
        total += k;
    }
    if (cap > 0)
        buf[total < cap ? total : cap - 1] = '\0';
    return total;
}

/* ---- stop strings ----------------------------------------------------------- */

pd_status_t eng_stop_init(eng_stop_t *st, const char *const *stops, size_t n)
{
    size_t i;

    memset(st, 0, sizeof(*st));
    st->matched = -1;
    if (n > ENG_STOP_MAX)
        return PD_ERR_TOO_BIG;
    for (i = 0; i < n; i++) {
        size_t len;
        if (stops[i] == NULL)
            return PD_ERR_BAD_INPUT;
        len = strlen(stops[i]);
        if (len > ENG_STOP_MAX_LEN)
            return PD_ERR_TOO_BIG;
        if (len == 0)
            continue;
        memcpy(st->stop[st->n_stop], stops[i], len);
        st->stop_len[st->n_stop++] = (uint32_t)len;
    }
    return PD_OK;
}

/* Longest suffix of buf[0..n) that is a proper prefix of some stop string. */
static size_t partial_suffix(const eng_stop_t *st, const char *buf, size_t n)
{
    size_t best = 0, j, k;

    for (j = 0; j < st->n_stop; j++) {
        size_t maxk = st->stop_len[j] - 1;
        if (maxk > n)
            maxk = n;
        for (k = maxk; k > best; k--) {
            if (memcmp(buf + n - k, st->stop[j], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

size_t eng_stop_feed(eng_stop_t *st, const char *text, size_t len,
                     char *out, size_t cap)
{
    size_t n, j, first = SIZE_MAX, keep;
    int which = -1;

    assert(cap >= len + ENG_STOP_MAX_LEN); /* caller bug otherwise */
    if (st->matched >= 0 || cap < len + ENG_STOP_MAX_LEN)
        return 0;
    if (st->n_stop == 0) {
        memcpy(out, text, len);
        return len;
    }
    /* out is the workspace: held tail + new text */
    memcpy(out, st->hold, st->n_hold);
    memcpy(out + st->n_hold, text, len);
    n = st->n_hold + len;
    st->n_hold = 0;
    for (j = 0; j < st->n_stop; j++) {
        const char *m = memmem(out, n, st->stop[j], st->stop_len[j]);
        if (m != NULL && (size_t)(m - out) < first) {
            first = (size_t)(m - out);
            which = (int)j;
        }
    }
    if (which >= 0) {
        st->matched = which;
        return first;
    }
    keep = partial_suffix(st, out, n);
    memcpy(st->hold, out + n - keep, keep);
    st->n_hold = (uint32_t)keep;
    return n - keep;
}

size_t eng_stop_flush(eng_stop_t *st, char *out, size_t cap)
{
    size_t n = st->n_hold;

    if (st->matched >= 0 || cap < n)
        return 0;
    memcpy(out, st->hold, n);
    st->n_hold = 0;
    return n;
}
