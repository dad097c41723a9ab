/* eng_tok.c - vocabulary tables, encode dispatch, pieces and accessors. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "eng_tok_int.h"

#define SPM_SPACE "\xe2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */
#define UNK_PIECE "\xe2\x96\x85" /* what llama.cpp shows for <unk> */

__attribute__((format(printf, 3, 4)))
static void set_err(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || err_len == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* ---- UTF-8 helpers ---------------------------------------------------- */

size_t eng_utf8_len(uint8_t b)
{
    if (b < 0x80)
        return 1;
    if (b >= 0xc2 && b <= 0xdf)
        return 2;
    if (b >= 0xe0 && b <= 0xef)
        return 3;
    if (b >= 0xf0 && b <= 0xf4)
        return 4;
    return 0;
}

/* Number of leading bytes of s[0..n) that form a valid prefix of one UTF-8
 * character (WHATWG "maximal subpart"), and whether it is complete. */
size_t eng_utf8_prefix(const uint8_t *s, size_t n, bool *complete)
{
    size_t need = eng_utf8_len(s[0]);
    size_t i;

    *complete = false;
    if (need == 0)
        return 0;
    if (need == 1) {
        *complete = true;
        return 1;
    }
    for (i = 1; i < need; i++) {
        uint8_t lo = 0x80, hi = 0xbf;
        if (i >= n)
            return i;
        if (i == 1) {
            switch (s[0]) {
            case 0xe0: lo = 0xa0; break;
            case 0xed: hi = 0x9f; break;
            case 0xf0: lo = 0x90; break;
            case 0xf4: hi = 0x8f; break;
            default: break;
            }
        }
        if (s[i] < lo || s[i] > hi)
            return i;
    }
    *complete = true;
    return need;
}

size_t eng_utf8_valid(const uint8_t *s, size_t n)
{
    bool complete;
    size_t k;

    if (n == 0)
        return 0;
    k = eng_utf8_prefix(s, n, &complete);
    return complete ? k : 0;
}

size_t eng_utf8_put(uint32_t cp, char *out)
{
    uint8_t *o = (uint8_t *)out;

    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xc0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xe0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (uint8_t)(0xf0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* Decode one valid UTF-8 character; returns its length. */
static size_t utf8_get(const uint8_t *s, size_t n, uint32_t *cp)
{
    size_t k = eng_utf8_valid(s, n);

    switch (k) {
    case 1: *cp = s[0]; break;
    case 2: *cp = ((uint32_t)(s[0] & 0x1f) << 6) | (s[1] & 0x3f); break;
    case 3: *cp = ((uint32_t)(s[0] & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) |
                  (s[2] & 0x3f); break;
    case 4: *cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3f) << 12) |
                  ((uint32_t)(s[2] & 0x3f) << 6) | (s[3] & 0x3f); break;
    default: *cp = 0xfffd; return 1;
    }
    return k;
}

/* Copy s with each maximal invalid subpart replaced by U+FFFD. Returns NULL
 * when s is valid (no copy needed) or on allocation failure (*oom set). */
static char *utf8_sanitize(const char *s, size_t n, size_t *out_len, bool *oom)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, bad = 0, o = 0;
    char *out;

    *oom = false;
    while (i < n) {
        bool complete;
        size_t k = eng_utf8_prefix(u + i, n - i, &complete);
        if (!complete) {
            bad++;
            i += k > 0 ? k : 1;
        } else {
            i += k;
        }
    }
    if (bad == 0)
        return NULL;
    out = malloc(n + 2 * bad + 1);
    if (out == NULL) {
        *oom = true;
        return NULL;
    }
    for (i = 0; i < n;) {
        bool complete;
        size_t k = eng_utf8_prefix(u + i, n - i, &complete);
        if (!complete) {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += k > 0 ? k : 1;
        } else {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        }
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

/* ---- text -> id map ----------------------------------------------------- */

static uint32_t hash_text(const char *s, size_t len)
{
    return (uint32_t)XXH3_64bits(s, len);
}

int32_t eng_tok_lookup(const eng_tok_t *tok, const char *s, size_t len)
{
    uint32_t h = hash_text(s, len) & tok->map_mask;

    for (;;) {
        uint32_t v = tok->map[h], tl;
        const char *t;
        if (v == 0)
            return -1;
        t = eng_tok_text_at(tok, v - 1, &tl);
        if (tl == len && memcmp(t, s, len) == 0)
            return (int32_t)(v - 1);
        h = (h + 1) & tok->map_mask;
    }
}

static void map_insert(eng_tok_t *tok, uint32_t id)
{
    uint32_t len;
    const char *s = eng_tok_text_at(tok, id, &len);
    uint32_t h = hash_text(s, len) & tok->map_mask;

    for (;;) {
        uint32_t v = tok->map[h], tl;
        const char *t;
        if (v == 0) {
            tok->map[h] = id + 1;
            return;
        }
        t = eng_tok_text_at(tok, v - 1, &tl);
        if (tl == len && memcmp(t, s, len) == 0) {
            tok->map[h] = id + 1; /* duplicate text: the last one wins */
            return;
        }
        h = (h + 1) & tok->map_mask;
    }
}

/* ---- pieces ---------------------------------------------------------------- */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* "<0xNN>" -> NN, else -1. */
static int byte_token_value(const char *s, uint32_t len)
{
    int hi, lo;

    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    hi = hexval(s[3]);
    lo = hexval(s[4]);
    if (hi < 0 || lo < 0)
        return -1;
    return hi * 16 + lo;
}

/* Decoded bytes of token id into out (room for 4 * len + 4); returns length. */
static size_t build_piece(const eng_tok_t *tok, uint32_t id, char *out)
{
    uint32_t len, i;
    const char *s = eng_tok_text_at(tok, id, &len);
    uint8_t type = tok->types[id];
    size_t o = 0;
    int bv;

    if (type == ENG_TOKT_UNKNOWN) {
        memcpy(out, UNK_PIECE, 3);
        return 3;
    }
    if (type == ENG_TOKT_BYTE || tok->kind == ENG_TOK_BYTE) {
        bv = byte_token_value(s, len);
        if (bv >= 0) {
            out[0] = (char)bv;
            return 1;
        }
    }
    if (type == ENG_TOKT_CONTROL || type == ENG_TOKT_UNUSED ||
        type == ENG_TOKT_USER_DEFINED || tok->kind == ENG_TOK_BYTE) {
        memcpy(out, s, len);
        return len;
    }
    if (tok->kind == ENG_TOK_SPM) {
        for (i = 0; i < len;) {
            if (i + 3 <= len && memcmp(s + i, SPM_SPACE, 3) == 0) {
                out[o++] = ' ';
                i += 3;
            } else {
                out[o++] = s[i++];
            }
        }
        return o;
    }
    /* byte-level BPE: every code point stands for one byte */
    for (i = 0; i < len;) {
        uint32_t cp;
        size_t k = utf8_get((const uint8_t *)s + i, len - i, &cp);
        int b = eng_bpe_cp_to_byte(cp);
        if (b >= 0 && k == eng_utf8_valid((const uint8_t *)s + i, len - i)) {
            out[o++] = (char)b;
        } else {
            memcpy(out + o, s + i, k);
            o += k;
        }
        i += (uint32_t)k;
    }
    return o;
}

/* ---- create / destroy ------------------------------------------------------ */

static eng_tok_kind_t parse_kind(const char *model, bool *ok)
{
    *ok = true;
    if (model != NULL && strcmp(model, "llama") == 0)
        return ENG_TOK_SPM;
    if (model != NULL && strcmp(model, "gpt2") == 0)
        return ENG_TOK_BPE;
    if (model != NULL && strcmp(model, ENG_TOK_BYTE_MODEL_NAME) == 0)
        return ENG_TOK_BYTE;
    *ok = false;
    return ENG_TOK_SPM;
}

static int cmp_special_len(const void *a, const void *b, void *arg)
{
    const eng_tok_t *tok = arg;
    uint32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    uint32_t la = tok->text_off[ia + 1] - tok->text_off[ia];
    uint32_t lb = tok->text_off[ib + 1] - tok->text_off[ib];

    if (la != lb)
        return la > lb ? -1 : 1;
    return ia < ib ? -1 : (ia > ib);
}

static int32_t find_text_id(const eng_tok_t *tok, const char *const *names)
{
    for (; *names != NULL; names++) {
        int32_t id = eng_tok_lookup(tok, *names, strlen(*names));
        if (id >= 0)
            return id;
    }
    return -1;
}

static pd_status_t add_eog(eng_tok_t *tok, int32_t id)
{
    uint32_t i;

    if (id < 0 || (uint32_t)id >= tok->n_vocab)
        return PD_OK;
    for (i = 0; i < tok->n_eog; i++)
        if (tok->eog[i] == id)
            return PD_OK;
    tok->eog[tok->n_eog++] = id;
    return PD_OK;
}

pd_status_t eng_tok_create(const eng_tok_vocab_t *v, eng_tok_t **tok_p,
                           char *err, size_t err_len)
{
    static const char *const eot_names[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", NULL,
    };
    static const char *const eom_names[] = { "<|eom_id|>", NULL };
    eng_tok_t *tok;
    size_t text_bytes = 0, piece_cap = 0, o;
    uint32_t i, map_size = 1;
    bool ok;
    pd_status_t status;

    if (v == NULL || v->tokens == NULL || v->n_tokens == 0) {
        set_err(err, err_len, "%s", "tokenizer: empty vocabulary");
        return PD_ERR_BAD_INPUT;
    }
    if (v->n_tokens > ENG_TOK_MAX_VOCAB || v->n_merges > ENG_TOK_MAX_MERGES) {
        set_err(err, err_len, "%s", "tokenizer: vocabulary or merges too large");
        return PD_ERR_TOO_BIG;
    }
    tok = calloc(1, sizeof(*tok));
    if (tok == NULL)
        return PD_ERR_NO_MEMORY;
    tok->kind = parse_kind(v->model, &ok);
    if (!ok) {
        set_err(err, err_len, "tokenizer: unsupported tokenizer.ggml.model '%s'",
                v->model != NULL ? v->model : "(none)");
        status = PD_ERR_UNSUPPORTED;
        goto err_free;
    }
    snprintf(tok->model_name, sizeof(tok->model_name), "%s", v->model);
    snprintf(tok->pre_name, sizeof(tok->pre_name), "%s", v->pre != NULL ? v->pre : "");
    tok->n_vocab = v->n_tokens;

    for (i = 0; i < v->n_tokens; i++) {
        if (v->tokens[i].len > ENG_TOK_MAX_TOKLEN ||
            (v->tokens[i].len > 0 && v->tokens[i].s == NULL)) {
            set_err(err, err_len, "%s", "tokenizer: token text too long");
            status = PD_ERR_TOO_BIG;
            goto err_free;
        }
        text_bytes += v->tokens[i].len + 1;
        piece_cap += 4 * (size_t)v->tokens[i].len + 4;
    }
    if (piece_cap > UINT32_MAX / 2) {
        set_err(err, err_len, "%s", "tokenizer: vocabulary text too large");
        status = PD_ERR_TOO_BIG;
        goto err_free;
    }
    status = PD_ERR_NO_MEMORY;
    tok->text = malloc(text_bytes);
    tok->text_off = malloc(((size_t)v->n_tokens + 1) * sizeof(uint32_t));
    tok->scores = malloc((size_t)v->n_tokens * sizeof(float));
    tok->types = malloc(v->n_tokens);
    tok->eog = malloc(16 * sizeof(int32_t));
    if (tok->text == NULL || tok->text_off == NULL || tok->scores == NULL ||
        tok->types == NULL || tok->eog == NULL)
        goto err_free;
    for (i = 0, o = 0; i < v->n_tokens; i++) {
        tok->text_off[i] = (uint32_t)o;
        if (v->tokens[i].len > 0)
            memcpy(tok->text + o, v->tokens[i].s, v->tokens[i].len);
        o += v->tokens[i].len;
        tok->text[o++] = '\0';
        tok->scores[i] = v->scores != NULL ? v->scores[i] : -(float)i;
        tok->types[i] = ENG_TOKT_NORMAL;
        if (v->token_types != NULL && v->token_types[i] >= 0 && v->token_types[i] <= 6)
            tok->types[i] = (uint8_t)v->token_types[i];
        if (tok->types[i] == ENG_TOKT_UNDEFINED)
            tok->types[i] = ENG_TOKT_NORMAL;
    }
    tok->text_off[v->n_tokens] = (uint32_t)o;

    while (map_size < 2 * v->n_tokens)
        map_size <<= 1;
    tok->map = calloc(map_size, sizeof(uint32_t));
    if (tok->map == NULL)
        goto err_free;
    tok->map_mask = map_size - 1;
    for (i = 0; i < v->n_tokens; i++)
        map_insert(tok, i);

    /* pieces */
    tok->piece = malloc(piece_cap);
    tok->piece_off = malloc(((size_t)v->n_tokens + 1) * sizeof(uint32_t));
    if (tok->piece == NULL || tok->piece_off == NULL)
        goto err_free;
    for (i = 0, o = 0; i < v->n_tokens; i++) {
        tok->piece_off[i] = (uint32_t)o;
        o += build_piece(tok, i, tok->piece + o);
    }
    tok->piece_off[v->n_tokens] = (uint32_t)o;

    for (i = 0; i < v->n_tokens; i++) {
        uint32_t tl = tok->text_off[i + 1] - tok->text_off[i] - 1;
        if ((tok->types[i] == ENG_TOKT_NORMAL || tok->types[i] == ENG_TOKT_USER_DEFINED) &&
            tl > tok->max_tok_len)
            tok->max_tok_len = tl;
    }

    /* byte tokens */
    for (i = 0; i < 256; i++)
        tok->byte_tok[i] = -1;
    for (i = 0; i < v->n_tokens; i++) {
        uint32_t len;
        const char *s = eng_tok_text_at(tok, i, &len);
        int bv = byte_token_value(s, len);
        if (tok->kind == ENG_TOK_BYTE && bv < 0 && len == 1 &&
            tok->types[i] != ENG_TOKT_CONTROL)
            bv = (uint8_t)s[0];
        if (bv >= 0 && tok->kind != ENG_TOK_BPE && tok->byte_tok[bv] < 0 &&
            (tok->types[i] == ENG_TOKT_BYTE || tok->kind == ENG_TOK_BYTE))
            tok->byte_tok[bv] = (int32_t)i;
    }
    if (tok->kind == ENG_TOK_BPE) {
        for (i = 0; i < 256; i++) {
            char buf[4];
            size_t k = eng_utf8_put(eng_bpe_byte_to_cp((uint8_t)i), buf);
            tok->byte_tok[i] = eng_tok_lookup(tok, buf, k);
        }
    }

    /* special ids */
    tok->bos = v->bos_id;
    tok->eos = v->eos_id;
    tok->unk = v->unk_id;
    tok->pad = v->pad_id;
    tok->eot = v->eot_id;
    if (tok->kind == ENG_TOK_BYTE) {
        static const char *const bos_n[] = { "<s>", "<|begin_of_text|>", NULL };
        static const char *const eos_n[] = { "</s>", "<|end_of_text|>", NULL };
        if (tok->bos < 0)
            tok->bos = find_text_id(tok, bos_n);
        if (tok->eos < 0)
            tok->eos = find_text_id(tok, eos_n);
    }
    if (tok->bos >= (int32_t)tok->n_vocab)
        tok->bos = -1;
    if (tok->eos >= (int32_t)tok->n_vocab)
        tok->eos = -1;
    if (tok->unk >= (int32_t)tok->n_vocab)
        tok->unk = -1;
    if (tok->unk < 0 && tok->kind == ENG_TOK_SPM)
        for (i = 0; i < v->n_tokens && tok->unk < 0; i++)
            if (tok->types[i] == ENG_TOKT_UNKNOWN)
                tok->unk = (int32_t)i;
    if (tok->eot < 0 || tok->eot >= (int32_t)tok->n_vocab)
        tok->eot = find_text_id(tok, eot_names);
    add_eog(tok, tok->eos);
    add_eog(tok, tok->eot);
    add_eog(tok, find_text_id(tok, eom_names));

    tok->add_bos = v->add_bos >= 0 ? v->add_bos != 0 : tok->kind != ENG_TOK_BPE;
    if (tok->kind == ENG_TOK_BPE && v->add_bos < 0 && tok->bos >= 0 &&
        strcmp(tok->pre_name, "llama-bpe") == 0)
        tok->add_bos = true;
    tok->add_eos = v->add_eos == 1;
    tok->add_space_prefix = v->add_space_prefix >= 0 ? v->add_space_prefix != 0
                                                     : tok->kind == ENG_TOK_SPM;

    /* special tokens (control, user-defined, unknown as llama.cpp), longest
     * first so "<|a|>x" beats "<|a|>" */
    tok->special = malloc((size_t)v->n_tokens * sizeof(int32_t));
    if (tok->special == NULL)
        goto err_free;
    for (i = 0; i < v->n_tokens; i++) {
        uint8_t t = tok->types[i];
        uint32_t len;
        const char *s = eng_tok_text_at(tok, i, &len);
        if ((t == ENG_TOKT_CONTROL || t == ENG_TOKT_USER_DEFINED || t == ENG_TOKT_UNKNOWN) &&
            len > 0) {
            tok->special[tok->n_special++] = (int32_t)i;
            tok->special_first[(uint8_t)s[0]] = true;
        }
    }
    qsort_r(tok->special, tok->n_special, sizeof(int32_t), cmp_special_len, tok);

    if (v->chat_template != NULL) {
        size_t n = v->chat_template_len > 0 ? v->chat_template_len : strlen(v->chat_template);
        tok->chat_template = strndup(v->chat_template, n);
        if (tok->chat_template == NULL)
            goto err_free;
    }

    if (tok->kind == ENG_TOK_BPE) {
        status = eng_tok_bpe_setup(tok, err, err_len);
        if (status != PD_OK)
            goto err_free;
        /* merges: "left right" -> (l, r) -> rank, result looked up at encode */
        {
            uint32_t msize = 1, n_ok = 0;
            while (msize < 2 * (v->n_merges + 1))
                msize <<= 1;
            tok->merges = malloc((size_t)msize * sizeof(*tok->merges));
            if (tok->merges == NULL) {
                status = PD_ERR_NO_MEMORY;
                goto err_free;
            }
            for (i = 0; i < msize; i++)
                tok->merges[i].rank = UINT32_MAX;
            tok->merge_mask = msize - 1;
            for (i = 0; i < v->n_merges; i++) {
                const char *m = v->merges[i].s, *sp;
                uint32_t mlen = v->merges[i].len, h;
                int32_t l, r;
                if (m == NULL || mlen < 3)
                    continue;
                sp = memchr(m + 1, ' ', mlen - 1);
                if (sp == NULL)
                    continue;
                l = eng_tok_lookup(tok, m, (size_t)(sp - m));
                r = eng_tok_lookup(tok, sp + 1, mlen - (size_t)(sp + 1 - m));
                if (l < 0 || r < 0)
                    continue;
                h = (uint32_t)XXH3_64bits_withSeed(&l, sizeof(l), (uint64_t)r) & tok->merge_mask;
                while (tok->merges[h].rank != UINT32_MAX &&
                       !(tok->merges[h].l == (uint32_t)l && tok->merges[h].r == (uint32_t)r))
                    h = (h + 1) & tok->merge_mask;
                if (tok->merges[h].rank == UINT32_MAX) {
                    tok->merges[h].l = (uint32_t)l;
                    tok->merges[h].r = (uint32_t)r;
                    tok->merges[h].rank = i;
                    n_ok++;
                }
            }
            (void)n_ok;
        }
    }
    *tok_p = tok;
    return PD_OK;

err_free:
    eng_tok_destroy(tok);
    return status;
}

void eng_tok_destroy(eng_tok_t *tok)
{
    if (tok == NULL)
        return;
    free(tok->text);
    free(tok->text_off);
    free(tok->piece);
    free(tok->piece_off);
    free(tok->scores);
    free(tok->types);
    free(tok->map);
    free(tok->merges);
    free(tok->eog);
    free(tok->special);
    free(tok->chat_template);
    free(tok);
}

pd_status_t eng_tok_create_byte(uint32_t vocab_size, eng_tok_t **tok_p)
{
    static const char *const ctl[] = { "<s>", "<|im_start|>", "<|im_end|>", "<pad>" };
    eng_tok_str_t *toks;
    int32_t *types;
    char *names;
    eng_tok_vocab_t v;
    pd_status_t status;
    uint32_t i;

    if (vocab_size < ENG_TOK_BYTE_VOCAB_MIN || vocab_size > ENG_TOK_MAX_VOCAB)
        return PD_ERR_BAD_INPUT;
    toks = calloc(vocab_size, sizeof(*toks));
    types = calloc(vocab_size, sizeof(*types));
    names = malloc((size_t)vocab_size * 24);
    if (toks == NULL || types == NULL || names == NULL) {
        status = PD_ERR_NO_MEMORY;
        goto out;
    }
    for (i = 0; i < vocab_size; i++) {
        char *n = names + (size_t)i * 24;
        if (i < 256) {
            snprintf(n, 24, "<0x%02X>", i);
            types[i] = ENG_TOKT_BYTE;
        } else if (i < ENG_TOK_BYTE_VOCAB_MIN) {
            snprintf(n, 24, "%s", ctl[i - 256]);
            types[i] = ENG_TOKT_CONTROL;
        } else {
            snprintf(n, 24, "<unused_%u>", i - ENG_TOK_BYTE_VOCAB_MIN);
            types[i] = ENG_TOKT_UNUSED;
        }
        toks[i].s = n;
        toks[i].len = (uint32_t)strlen(n);
    }
    memset(&v, 0, sizeof(v));
    v.model = ENG_TOK_BYTE_MODEL_NAME;
    v.tokens = toks;
    v.n_tokens = vocab_size;
    v.token_types = types;
    v.bos_id = 256;
    v.eos_id = 258;
    v.eot_id = 258;
    v.pad_id = 259;
    v.unk_id = -1;
    v.add_bos = 1;
    v.add_space_prefix = 0;
    status = eng_tok_create(&v, tok_p, NULL, 0);
out:
    free(toks);
    free(types);
    free(names);
    return status;
}

/* ---- encode ----------------------------------------------------------------- */

static pd_status_t encode_fragment(const eng_tok_t *tok, const char *s, size_t len,
                                   bool prefix_space, eng_tok_out_t *out)
{
    size_t i;

    switch (tok->kind) {
    case ENG_TOK_BYTE:
        for (i = 0; i < len; i++) {
            int32_t id = tok->byte_tok[(uint8_t)s[i]];
            if (id < 0)
                id = tok->unk;
            if (id >= 0)
                eng_tok_out_push(out, id);
        }
        return PD_OK;
    case ENG_TOK_SPM: {
        /* escape spaces as U+2581, with the dummy prefix when asked */
        size_t n_sp = prefix_space ? 1 : 0, o = 0;
        char *buf;
        pd_status_t status;
        for (i = 0; i < len; i++)
            n_sp += s[i] == ' ';
        buf = malloc(len + 2 * n_sp + 3 + 1);
        if (buf == NULL)
            return PD_ERR_NO_MEMORY;
        if (prefix_space) {
            memcpy(buf, SPM_SPACE, 3);
            o = 3;
        }
        for (i = 0; i < len; i++) {
            if (s[i] == ' ') {
                memcpy(buf + o, SPM_SPACE, 3);
                o += 3;
            } else {
                buf[o++] = s[i];
            }
        }
        status = eng_tok_spm_encode(tok, buf, o, out);
        free(buf);
        return status;
    }
    case ENG_TOK_BPE:
        return eng_tok_bpe_encode(tok, s, len, out);
    }
    return PD_ERR_INTERNAL;
}

pd_status_t eng_tok_encode(const eng_tok_t *tok, const char *text, size_t len,
                           bool add_bos, bool parse_special,
                           int32_t *ids, size_t cap, size_t *n_p)
{
    eng_tok_out_t out = { .ids = ids, .cap = cap, .n = 0, .overflow = false };
    char *clean;
    size_t clean_len = 0, start = 0, p = 0;
    bool oom, prev_special = true;
    pd_status_t status = PD_OK;

    if (len > ENG_TOK_MAX_INPUT)
        return PD_ERR_TOO_BIG;
    if ((text == NULL && len > 0) || (ids == NULL && cap > 0))
        return PD_ERR_BAD_INPUT;
    clean = utf8_sanitize(text, len, &clean_len, &oom);
    if (oom)
        return PD_ERR_NO_MEMORY;
    if (clean != NULL) {
        text = clean;
        len = clean_len;
    }
    if (add_bos && tok->bos >= 0)
        eng_tok_out_push(&out, tok->bos);

    while (p < len) {
        int32_t hit = -1;
        uint32_t hit_len = 0, k;
        if (tok->special_first[(uint8_t)text[p]]) {
            for (k = 0; k < tok->n_special; k++) {
                int32_t id = tok->special[k];
                uint32_t sl;
                const char *st = eng_tok_text_at(tok, (uint32_t)id, &sl);
                if (!parse_special && tok->types[id] != ENG_TOKT_USER_DEFINED)
                    continue;
                if (sl <= len - p && memcmp(text + p, st, sl) == 0) {
                    hit = id;
                    hit_len = sl;
                    break;
                }
            }
        }
        if (hit < 0) {
            p++;
            continue;
        }
        if (p > start) {
            status = encode_fragment(tok, text + start, p - start,
                                     tok->add_space_prefix && prev_special, &out);
            if (status != PD_OK)
                goto out;
        }
        eng_tok_out_push(&out, hit);
        prev_special = true;
        p += hit_len;
        start = p;
    }
    if (len > start)
        status = encode_fragment(tok, text + start, len - start,
                                 tok->add_space_prefix && prev_special, &out);
out:
    free(clean);
    if (status != PD_OK)
        return status;
    *n_p = out.n;
    return out.overflow ? PD_ERR_NO_SPACE : PD_OK;
}

/* ---- pieces and accessors --------------------------------------------------- */

size_t eng_tok_token_piece(const eng_tok_t *tok, int32_t id, bool special,
                           char *buf, size_t cap)
{
    uint32_t n;
    uint8_t t;

    if (id < 0 || (uint32_t)id >= tok->n_vocab)
        return 0;
    t = tok->types[id];
    if (!special && (t == ENG_TOKT_CONTROL || t == ENG_TOKT_UNUSED))
        return 0;
    n = tok->piece_off[id + 1] - tok->piece_off[id];
    if (n > cap)
        return 0;
    memcpy(buf, tok->piece + tok->piece_off[id], n);
    return n;
}

const char *eng_tok_token_text(const eng_tok_t *tok, int32_t id, size_t *len_p)
{
    uint32_t len;
    const char *s;

    if (id < 0 || (uint32_t)id >= tok->n_vocab)
        return NULL;
    s = eng_tok_text_at(tok, (uint32_t)id, &len);
    if (len_p != NULL)
        *len_p = len;
    return s;
}

int32_t eng_tok_find(const eng_tok_t *tok, const char *s, size_t len)
{
    return eng_tok_lookup(tok, s, len);
}

eng_tok_kind_t eng_tok_kind(const eng_tok_t *tok) { return tok->kind; }
uint32_t eng_tok_vocab_size(const eng_tok_t *tok) { return tok->n_vocab; }
int32_t eng_tok_bos(const eng_tok_t *tok) { return tok->bos; }
int32_t eng_tok_eos(const eng_tok_t *tok) { return tok->eos; }
bool eng_tok_add_bos(const eng_tok_t *tok) { return tok->add_bos && tok->bos >= 0; }
bool eng_tok_add_eos(const eng_tok_t *tok) { return tok->add_eos && tok->eos >= 0; }
const char *eng_tok_chat_template(const eng_tok_t *tok) { return tok->chat_template; }
const char *eng_tok_model_name(const eng_tok_t *tok) { return tok->model_name; }
const char *eng_tok_pre_name(const eng_tok_t *tok) { return tok->pre_name; }

bool eng_tok_is_eog(const eng_tok_t *tok, int32_t id)
{
    uint32_t i;

    for (i = 0; i < tok->n_eog; i++)
        if (tok->eog[i] == id)
            return true;
    return false;
}

eng_tok_type_t eng_tok_token_type(const eng_tok_t *tok, int32_t id)
{
    if (id < 0 || (uint32_t)id >= tok->n_vocab)
        return ENG_TOKT_UNDEFINED;
    return (eng_tok_type_t)tok->types[id];
}
