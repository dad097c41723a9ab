/* test_tok_unit.c - tokenizer core, detokenizer, stop strings, GGUF loading. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "eng_tok.h"
#include "eng_tok_int.h"
#include "gguf.h"

#define SP "\xe2\x96\x81"

/* ---- vocab builders ----------------------------------------------------- */

typedef struct {
    eng_tok_str_t toks[600];
    float scores[600];
    int32_t types[600];
    char names[600][32];
    eng_tok_str_t merges[64];
    uint32_t n, n_merges;
} vb_t;

static int32_t vb_add(vb_t *b, const char *s, float score, int type)
{
    uint32_t i = b->n++;

    snprintf(b->names[i], sizeof(b->names[i]), "%s", s);
    b->toks[i].s = b->names[i];
    b->toks[i].len = (uint32_t)strlen(s);
    b->scores[i] = score;
    b->types[i] = type;
    return (int32_t)i;
}

/* SPM: <unk> <s> </s> <0x00>..<0xFF> then normal pieces. */
static const char *const spm_pieces[] = {
    SP, "h", "e", "l", "o", "w", "r", "d",
    SP "h", "ll", "el", "ell", SP "hell", SP "hello", SP "w", "or", SP "wor", "ld", SP "world",
};
static const float spm_scores[] = {
    -100, -101, -102, -103, -104, -105, -106, -107,
    -1, -2, -3, -5, -6, -7, -8, -9, -10, -11, -12,
};

static eng_tok_t *make_spm(void)
{
    static vb_t b;
    eng_tok_vocab_t v = { 0 };
    eng_tok_t *tok = NULL;
    char err[128];
    unsigned i;

    memset(&b, 0, sizeof(b));
    vb_add(&b, "<unk>", 0, ENG_TOKT_UNKNOWN);
    vb_add(&b, "<s>", 0, ENG_TOKT_CONTROL);
    vb_add(&b, "</s>", 0, ENG_TOKT_CONTROL);
    for (i = 0; i < 256; i++) {
        char n[8];
        snprintf(n, sizeof(n), "<0x%02X>", i);
        vb_add(&b, n, 0, ENG_TOKT_BYTE);
    }
    for (i = 0; i < sizeof(spm_pieces) / sizeof(spm_pieces[0]); i++)
        vb_add(&b, spm_pieces[i], spm_scores[i], ENG_TOKT_NORMAL);
    v.model = "llama";
    v.tokens = b.toks;
    v.n_tokens = b.n;
    v.scores = b.scores;
    v.token_types = b.types;
    v.bos_id = 1;
    v.eos_id = 2;
    v.unk_id = 0;
    v.pad_id = -1;
    v.eot_id = -1;
    v.add_bos = -1;
    v.add_space_prefix = -1;
    assert_int_equal(eng_tok_create(&v, &tok, err, sizeof(err)), PD_OK);
    return tok;
}

static int32_t spm_id(const char *piece)
{
    unsigned i;

    for (i = 0; i < sizeof(spm_pieces) / sizeof(spm_pieces[0]); i++)
        if (strcmp(spm_pieces[i], piece) == 0)
            return (int32_t)(259 + i);
    return -1;
}

/* BPE: 256 byte-mapped chars (id = byte), merges, control "<|end|>". */
static const char *const bpe_merges[] = {
    "h e", "l l", "\xc4\xa0 w", "o r", "he ll", "hell o", "\xc4\xa0w or", "l d",
    "\xc4\xa0wor ld", "1 2", "12 3",
};

static eng_tok_t *make_bpe(const char *pre)
{
    static vb_t b;
    eng_tok_vocab_t v = { 0 };
    eng_tok_t *tok = NULL;
    char err[128];
    unsigned i;

    memset(&b, 0, sizeof(b));
    for (i = 0; i < 256; i++) {
        char n[8];
        n[eng_utf8_put(eng_bpe_byte_to_cp((uint8_t)i), n)] = '\0';
        vb_add(&b, n, 0, ENG_TOKT_NORMAL);
    }
    for (i = 0; i < sizeof(bpe_merges) / sizeof(bpe_merges[0]); i++) {
        char n[32];
        const char *sp = strchr(bpe_merges[i], ' ');
        snprintf(n, sizeof(n), "%.*s%s", (int)(sp - bpe_merges[i]), bpe_merges[i], sp + 1);
        vb_add(&b, n, 0, ENG_TOKT_NORMAL);
        b.merges[i].s = bpe_merges[i];
        b.merges[i].len = (uint32_t)strlen(bpe_merges[i]);
    }
    vb_add(&b, "<|end|>", 0, ENG_TOKT_CONTROL);
    v.model = "gpt2";
    v.pre = pre;
    v.tokens = b.toks;
    v.n_tokens = b.n;
    v.token_types = b.types;
    v.merges = b.merges;
    v.n_merges = (uint32_t)(sizeof(bpe_merges) / sizeof(bpe_merges[0]));
    v.bos_id = -1;
    v.eos_id = (int32_t)b.n - 1;
    v.unk_id = -1;
    v.pad_id = -1;
    v.eot_id = -1;
    v.add_bos = -1;
    v.add_space_prefix = -1;
    assert_int_equal(eng_tok_create(&v, &tok, err, sizeof(err)), PD_OK);
    return tok;
}

static size_t enc(const eng_tok_t *tok, const char *s, bool bos, bool special,
                  int32_t *ids, size_t cap)
{
    size_t n = 0;

    assert_int_equal(eng_tok_encode(tok, s, strlen(s), bos, special, ids, cap, &n), PD_OK);
    return n;
}

static void dec_check(const eng_tok_t *tok, const int32_t *ids, size_t n, bool strip,
                      const char *want)
{
    char buf[512];
    size_t len = eng_tok_decode(tok, ids, n, false, strip, buf, sizeof(buf));

    assert_int_equal(len, strlen(want));
    assert_memory_equal(buf, want, len);
}

/* ---- byte tokenizer --------------------------------------------------------- */

static void test_byte_roundtrip(void **state)
{
    static const char *const texts[] = {
        "hello", " leading and trailing ", "tab\there\nnewline\r\n", "caf\xc3\xa9",
        "\xe4\xbd\xa0\xe5\xa5\xbd", "\xf0\x9f\x98\x80 emoji", "", "12345",
    };
    eng_tok_t *tok;
    int32_t ids[256];
    size_t i, j, n;

    (void)state;
    assert_int_equal(eng_tok_create_byte(300, &tok), PD_OK);
    assert_int_equal(eng_tok_kind(tok), ENG_TOK_BYTE);
    assert_int_equal(eng_tok_vocab_size(tok), 300);
    assert_int_equal(eng_tok_bos(tok), 256);
    assert_int_equal(eng_tok_eos(tok), 258);
    assert_true(eng_tok_is_eog(tok, 258));
    assert_false(eng_tok_is_eog(tok, 257));
    assert_false(eng_tok_is_eog(tok, 10));
    for (i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        n = enc(tok, texts[i], true, false, ids, 256);
        assert_int_equal(n, strlen(texts[i]) + 1);
        assert_int_equal(ids[0], 256);
        for (j = 0; j < strlen(texts[i]); j++)
            assert_int_equal(ids[j + 1], (uint8_t)texts[i][j]);
        dec_check(tok, ids, n, false, texts[i]);
    }
    /* control text only with parse_special */
    n = enc(tok, "a<|im_end|>", false, false, ids, 256);
    assert_int_equal(n, 11);
    n = enc(tok, "a<|im_end|>", false, true, ids, 256);
    assert_int_equal(n, 2);
    assert_int_equal(ids[1], 258);
    eng_tok_destroy(tok);
}

static void test_invalid_utf8_input(void **state)
{
    eng_tok_t *tok;
    int32_t ids[64];
    size_t n;
    /* lone continuation, truncated 3-byte seq before ASCII, overlong, 0xFF */
    static const char in[] = "a\x80" "b\xe2\x82" "c\xc0\xaf" "\xff";
    static const char want[] = "a\xef\xbf\xbd" "b\xef\xbf\xbd" "c\xef\xbf\xbd\xef\xbf\xbd"
                               "\xef\xbf\xbd";
    size_t i;

    (void)state;
    assert_int_equal(eng_tok_create_byte(260, &tok), PD_OK);
    assert_int_equal(eng_tok_encode(tok, in, sizeof(in) - 1, false, false, ids, 64, &n), PD_OK);
    assert_int_equal(n, sizeof(want) - 1);
    for (i = 0; i < n; i++)
        assert_int_equal(ids[i], (uint8_t)want[i]);
    /* NUL and control characters are just bytes */
    assert_int_equal(eng_tok_encode(tok, "\0\x01\x1b", 3, false, false, ids, 64, &n), PD_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[2], 0x1b);
    eng_tok_destroy(tok);
}

static void test_caps(void **state)
{
    eng_tok_t *tok;
    int32_t ids[4];
    size_t n = 99;
    char *big;

    (void)state;
    assert_int_equal(eng_tok_create_byte(260, &tok), PD_OK);
    assert_int_equal(eng_tok_encode(tok, "abcdef", 6, false, false, ids, 4, &n), PD_ERR_NO_SPACE);
    assert_int_equal(n, 6);
    assert_int_equal(ids[3], 'd');
    assert_int_equal(eng_tok_encode(tok, "abcdef", 6, true, false, NULL, 0, &n), PD_ERR_NO_SPACE);
    assert_int_equal(n, 7); /* counting only */
    big = malloc(ENG_TOK_MAX_INPUT + 1);
    assert_non_null(big);
    memset(big, 'a', ENG_TOK_MAX_INPUT + 1);
    assert_int_equal(eng_tok_encode(tok, big, ENG_TOK_MAX_INPUT + 1, false, false, ids, 4, &n),
                     PD_ERR_TOO_BIG);
    free(big);
    assert_int_equal(eng_tok_create_byte(259, &tok) == PD_OK, false);
    eng_tok_destroy(tok);
}

/* ---- SPM ---------------------------------------------------------------------- */

static void test_spm_merges(void **state)
{
    eng_tok_t *tok = make_spm();
    int32_t ids[64];
    size_t n;

    (void)state;
    n = enc(tok, "hello", true, false, ids, 64);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], spm_id(SP "hello"));
    dec_check(tok, ids, n, true, "hello");

    n = enc(tok, "hello world", false, false, ids, 64);
    assert_int_equal(n, 2);
    assert_int_equal(ids[1], spm_id(SP "world"));
    dec_check(tok, ids, n, true, "hello world");
    dec_check(tok, ids, n, false, " hello world");

    /* byte fallback: 'i' and U+00E9 are not pieces */
    n = enc(tok, "hi\xc3\xa9", false, false, ids, 64);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], spm_id(SP "h"));
    assert_int_equal(ids[1], 3 + 'i');
    assert_int_equal(ids[2], 3 + 0xc3);
    assert_int_equal(ids[3], 3 + 0xa9);
    dec_check(tok, ids, n, true, "hi\xc3\xa9");

    /* double space: two separate U+2581 */
    n = enc(tok, " hello", false, false, ids, 64);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], spm_id(SP));
    assert_int_equal(ids[1], spm_id(SP "hello"));

    /* control text: literal unless parse_special, and prefix space after it */
    n = enc(tok, "</s>hello", false, true, ids, 64);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], spm_id(SP "hello"));
    n = enc(tok, "</s>", false, false, ids, 64);
    assert_true(n > 1);
    assert_int_equal(enc(tok, "", true, false, ids, 64), 1);
    assert_int_equal(enc(tok, "", false, false, ids, 64), 0);
    eng_tok_destroy(tok);
}

/* ---- BPE ---------------------------------------------------------------------- */

static void test_bpe_merges(void **state)
{
    eng_tok_t *tok = make_bpe(NULL);
    int32_t ids[64];
    size_t n;
    char buf[64];

    (void)state;
    assert_false(eng_tok_add_bos(tok));
    n = enc(tok, "hello world", true, false, ids, 64);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], eng_tok_find(tok, "hello", 5));
    assert_int_equal(ids[1], eng_tok_find(tok, "\xc4\xa0world", 7));
    dec_check(tok, ids, n, false, "hello world");
    /* pieces unmap bytes */
    assert_int_equal(eng_tok_token_piece(tok, ids[1], false, buf, sizeof(buf)), 6);
    assert_memory_equal(buf, " world", 6);
    /* special tokens */
    n = enc(tok, "hi<|end|>", false, true, ids, 64);
    assert_int_equal(n, 3);
    assert_int_equal(ids[2], eng_tok_eos(tok));
    n = enc(tok, "hi<|end|>", false, false, ids, 64);
    assert_int_equal(n, 9);
    assert_int_equal(eng_tok_token_piece(tok, eng_tok_eos(tok), false, buf, sizeof(buf)), 0);
    assert_int_equal(eng_tok_token_piece(tok, eng_tok_eos(tok), true, buf, sizeof(buf)), 7);
    /* multi-byte characters survive byte-level round trip */
    n = enc(tok, "caf\xc3\xa9 \xf0\x9f\x98\x80\n\xe4\xbd\xa0", false, false, ids, 64);
    dec_check(tok, ids, n, false, "caf\xc3\xa9 \xf0\x9f\x98\x80\n\xe4\xbd\xa0");
    eng_tok_destroy(tok);
}

static void test_bpe_pretokenizers(void **state)
{
    eng_tok_t *l3 = make_bpe("llama-bpe"), *q2 = make_bpe("qwen2"), *g2 = make_bpe(NULL);
    int32_t ids[64];
    size_t ends[32], n;
    /* "wörld": \p{L} must be Unicode-aware (UCP) to keep ö inside the word */
    static const char uni[] = "h\xc3\xa9llo w\xc3\xb6rld";

    (void)state;
    assert_true(l3->add_bos == false || l3->bos < 0);
    n = enc(l3, "12345", false, false, ids, 64);
    assert_int_equal(n, 3); /* "123" "45" */
    assert_int_equal(ids[0], eng_tok_find(l3, "123", 3));
    n = enc(q2, "12345", false, false, ids, 64);
    assert_int_equal(n, 5); /* digits one by one */
    n = enc(g2, "12345", false, false, ids, 64);
    assert_int_equal(n, 3); /* " ?\p{N}+" then BPE: "123" "4" "5" */

    n = eng_tok_bpe_split(l3, uni, strlen(uni), ends, 32);
    assert_int_equal(n, 2);
    assert_int_equal(ends[0], 6);
    n = eng_tok_bpe_split(l3, "I'M fine!!\n\n  x", 15, ends, 32);
    /* "I" "'M" " fine" "!!\n\n" " " " x" */
    assert_int_equal(n, 6);
    assert_int_equal(ends[1], 3);
    assert_int_equal(ends[3], 12);
    n = eng_tok_bpe_split(g2, "I'M", 3, ends, 32); /* gpt2: case-sensitive 'm */
    assert_int_equal(n, 3);
    n = eng_tok_bpe_split(q2, "\xe4\xbd\xa0\xe5\xa5\xbd 2024", 11, ends, 32);
    assert_int_equal(n, 6); /* CJK word, " ", digits one by one */
    eng_tok_destroy(l3);
    eng_tok_destroy(q2);
    eng_tok_destroy(g2);
}

/* ---- streaming detokenizer ------------------------------------------------- */

static size_t feed_all(eng_detok_t *d, const int32_t *ids, size_t n, char *out, size_t *lens)
{
    static char tmp[ENG_DETOK_OUT_MAX];
    size_t i, total = 0, k;

    for (i = 0; i < n; i++) {
        k = eng_detok_feed(d, ids[i], tmp, sizeof(tmp));
        memcpy(out + total, tmp, k);
        total += k;
        if (lens != NULL)
            lens[i] = k;
    }
    return total;
}

static void test_detok_utf8_split(void **state)
{
    eng_tok_t *tok;
    eng_detok_t d;
    char out[ENG_DETOK_OUT_MAX], tmp[8];
    size_t lens[8], n;
    /* U+1F600 in four byte tokens, then 'a' */
    const int32_t emoji[] = { 0xf0, 0x9f, 0x98, 0x80, 'a' };
    const int32_t broken[] = { 0xe4, 0xbd, 'x', 0xc3 };

    (void)state;
    assert_int_equal(eng_tok_create_byte(260, &tok), PD_OK);
    eng_detok_init(&d, tok, false, false);
    n = feed_all(&d, emoji, 5, out, lens);
    assert_int_equal(lens[0], 0);
    assert_int_equal(lens[1], 0);
    assert_int_equal(lens[2], 0);
    assert_int_equal(lens[3], 4);
    assert_int_equal(lens[4], 1);
    assert_int_equal(n, 5);
    assert_memory_equal(out, "\xf0\x9f\x98\x80" "a", 5);
    assert_int_equal(eng_detok_finish(&d, tmp, sizeof(tmp)), 0);

    /* an interrupted sequence becomes U+FFFD, a dangling lead is flushed at finish */
    eng_detok_init(&d, tok, false, false);
    n = feed_all(&d, broken, 4, out, lens);
    assert_int_equal(lens[2], 4);
    assert_int_equal(n, 4);
    assert_memory_equal(out, "\xef\xbf\xbdx", 4);
    assert_int_equal(eng_detok_finish(&d, tmp, sizeof(tmp)), 3);
    assert_memory_equal(tmp, "\xef\xbf\xbd", 3);
    /* control tokens silent unless special */
    eng_detok_init(&d, tok, false, false);
    assert_int_equal(eng_detok_feed(&d, 257, out, sizeof(out)), 0);
    eng_tok_destroy(tok);
}

static void test_detok_spm_prefix(void **state)
{
    eng_tok_t *tok = make_spm();
    eng_detok_t d;
    char out[ENG_DETOK_OUT_MAX];
    int32_t ids[2] = { spm_id(SP "hello"), spm_id(SP "world") };
    size_t n;

    (void)state;
    eng_detok_init(&d, tok, false, true);
    n = eng_detok_feed(&d, 1, out, sizeof(out)); /* BOS: nothing, strip not consumed */
    assert_int_equal(n, 0);
    n = eng_detok_feed(&d, ids[0], out, sizeof(out));
    assert_int_equal(n, 5);
    n = eng_detok_feed(&d, ids[1], out, sizeof(out));
    assert_int_equal(n, 6);
    assert_memory_equal(out, " world", 6);
    /* continuation streams keep the space */
    eng_detok_init(&d, tok, false, false);
    assert_int_equal(eng_detok_feed(&d, ids[0], out, sizeof(out)), 6);
    eng_tok_destroy(tok);
}

/* ---- stop strings --------------------------------------------------------------- */

static void stop_run(const char *const *stops, size_t n_stops, const char *const *chunks,
                     size_t n_chunks, const char *want, int want_match)
{
    eng_stop_t st;
    char out[1024], tmp[1024];
    size_t i, total = 0, k;

    assert_int_equal(eng_stop_init(&st, stops, n_stops), PD_OK);
    for (i = 0; i < n_chunks; i++) {
        k = eng_stop_feed(&st, chunks[i], strlen(chunks[i]), tmp, sizeof(tmp));
        memcpy(out + total, tmp, k);
        total += k;
    }
    if (st.matched < 0) {
        k = eng_stop_flush(&st, tmp, sizeof(tmp));
        memcpy(out + total, tmp, k);
        total += k;
    }
    out[total] = '\0';
    assert_string_equal(out, want);
    assert_int_equal(st.matched, want_match);
}

static void test_stop_strings(void **state)
{
    const char *s1[] = { "STOP" };
    const char *s2[] = { "\n\n", "END", "" };
    const char *c1[] = { "hello S", "TO", "P world" };
    const char *c2[] = { "a S", "T", "x STO", "Q" };
    const char *c3[] = { "line\n", "\nmore" };
    const char *c4[] = { "xEN", "D\n", "\n" };
    const char *c5[] = { "STOPSTOP" };
    const char *c6[] = { "ab", "c" };
    eng_stop_t st;
    char tmp[600];
    const char *big[ENG_STOP_MAX + 1];
    char longs[ENG_STOP_MAX_LEN + 2];
    size_t i;

    (void)state;
    stop_run(s1, 1, c1, 3, "hello ", 0);          /* across three chunks */
    stop_run(s1, 1, c2, 4, "a STx STOQ", -1);     /* partial matches released */
    stop_run(s2, 3, c3, 2, "line", 0);            /* newline pair split */
    stop_run(s2, 3, c4, 3, "x", 1);               /* earliest match wins */
    stop_run(s1, 1, c5, 1, "", 0);
    stop_run(NULL, 0, c6, 2, "abc", -1);

    /* held bytes never exceed the longest stop - 1 */
    assert_int_equal(eng_stop_init(&st, s1, 1), PD_OK);
    assert_int_equal(eng_stop_feed(&st, "xxSTO", 5, tmp, sizeof(tmp)), 2);
    assert_int_equal(st.n_hold, 3);
    for (i = 0; i <= ENG_STOP_MAX; i++)
        big[i] = "x";
    assert_int_equal(eng_stop_init(&st, big, ENG_STOP_MAX + 1), PD_ERR_TOO_BIG);
    memset(longs, 'a', sizeof(longs) - 1);
    longs[sizeof(longs) - 1] = '\0';
    big[0] = longs;
    assert_int_equal(eng_stop_init(&st, big, 1), PD_ERR_TOO_BIG);
}

/* stop strings on top of the detokenizer: a stop that ends inside a token */
static void test_stop_over_tokens(void **state)
{
    eng_tok_t *tok = make_spm();
    eng_detok_t d;
    eng_stop_t st;
    const char *stops[] = { "lo wo" };
    int32_t ids[64];
    char piece[ENG_DETOK_OUT_MAX], out[ENG_DETOK_OUT_MAX + ENG_STOP_MAX_LEN], all[256];
    size_t n, i, total = 0, k;

    (void)state;
    n = enc(tok, "hello world", false, false, ids, 64);
    assert_int_equal(n, 2);
    eng_detok_init(&d, tok, false, true);
    assert_int_equal(eng_stop_init(&st, stops, 1), PD_OK);
    for (i = 0; i < n && st.matched < 0; i++) {
        k = eng_detok_feed(&d, ids[i], piece, sizeof(piece));
        k = eng_stop_feed(&st, piece, k, out, sizeof(out));
        memcpy(all + total, out, k);
        total += k;
    }
    assert_int_equal(st.matched, 0);
    assert_int_equal(total, 3);
    assert_memory_equal(all, "hel", 3);
    eng_tok_destroy(tok);
}

/* ---- GGUF loading ------------------------------------------------------------------ */

static void test_gguf_load(void **state)
{
    gguf_writer_t *w;
    gguf_t *g;
    eng_tok_t *tok, *ref = make_bpe("qwen2");
    const char *strs[300];
    int32_t types[300];
    uint8_t *buf;
    size_t size, n1, n2, i;
    int32_t a[64], b[64];
    char err[160];
    static const char tmpl[] = "{% for m in messages %}<|im_start|>{{ m.role }}...";
    const char *txt = "hello world 12345 <|end|>";

    (void)state;
    for (i = 0; i < eng_tok_vocab_size(ref); i++) {
        strs[i] = eng_tok_token_text(ref, (int32_t)i, NULL);
        types[i] = eng_tok_token_type(ref, (int32_t)i);
    }
    assert_int_equal(gguf_writer_create(&w), PD_OK);
    assert_int_equal(gguf_writer_add_string(w, "tokenizer.ggml.model", "gpt2"), PD_OK);
    assert_int_equal(gguf_writer_add_string(w, "tokenizer.ggml.pre", "qwen2"), PD_OK);
    assert_int_equal(gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", strs, NULL,
                                             eng_tok_vocab_size(ref)), PD_OK);
    assert_int_equal(gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types,
                                             eng_tok_vocab_size(ref)), PD_OK);
    assert_int_equal(gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", bpe_merges, NULL,
                                             sizeof(bpe_merges) / sizeof(bpe_merges[0])), PD_OK);
    assert_int_equal(gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id",
                                         (uint32_t)eng_tok_eos(ref)), PD_OK);
    assert_int_equal(gguf_writer_add_string(w, "tokenizer.chat_template", tmpl), PD_OK);
    assert_int_equal(gguf_writer_write_memory(w, &buf, &size), PD_OK);
    gguf_writer_destroy(w);
    assert_int_equal(gguf_open_memory(buf, size, &g, err, sizeof(err)), PD_OK);
    assert_int_equal(eng_tok_load(g, &tok, err, sizeof(err)), PD_OK);
    gguf_close(g);
    free(buf);

    assert_string_equal(eng_tok_model_name(tok), "gpt2");
    assert_string_equal(eng_tok_pre_name(tok), "qwen2");
    assert_string_equal(eng_tok_chat_template(tok), tmpl);
    assert_true(eng_tok_is_eog(tok, eng_tok_eos(ref)));
    assert_int_equal(eng_tok_encode(ref, txt, strlen(txt), false, true, a, 64, &n1), PD_OK);
    assert_int_equal(eng_tok_encode(tok, txt, strlen(txt), false, true, b, 64, &n2), PD_OK);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1 * sizeof(int32_t));
    eng_tok_destroy(tok);
    eng_tok_destroy(ref);

    /* a file without tokenizer keys */
    assert_int_equal(gguf_writer_create(&w), PD_OK);
    assert_int_equal(gguf_writer_add_u32(w, "general.x", 1), PD_OK);
    assert_int_equal(gguf_writer_write_memory(w, &buf, &size), PD_OK);
    gguf_writer_destroy(w);
    assert_int_equal(gguf_open_memory(buf, size, &g, err, sizeof(err)), PD_OK);
    assert_int_equal(eng_tok_load(g, &tok, err, sizeof(err)), PD_ERR_NOT_FOUND);
    gguf_close(g);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_roundtrip),
        cmocka_unit_test(test_invalid_utf8_input),
        cmocka_unit_test(test_caps),
        cmocka_unit_test(test_spm_merges),
        cmocka_unit_test(test_bpe_merges),
        cmocka_unit_test(test_bpe_pretokenizers),
        cmocka_unit_test(test_detok_utf8_split),
        cmocka_unit_test(test_detok_spm_prefix),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_stop_over_tokens),
        cmocka_unit_test(test_gguf_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
