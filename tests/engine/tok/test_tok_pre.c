/* test_tok_pre.c - the BPE pre-tokenizer scanner (engine/tok/eng_tok_bpe.c)
 * against PCRE2 running the patterns it implements (issue 31: the scanner
 * replaced PCRE2, whose interpreter was superlinear without the JIT).
 *
 *   test_tok_pre            check: eng_uc_class vs PCRE2 \p{L} \p{N} \s for
 *                           every code point; scanner pieces vs PCRE2 pieces
 *                           on a fixed corpus and on 3000 random texts per
 *                           pattern (unicode letters, digits, spaces, marks,
 *                           contractions, CR/LF, emoji, invalid bytes);
 *                           a 1 MiB text in linear time.
 *   test_tok_pre --emit     print eng_tok_ucd.c's range table from PCRE2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eng_tok.h"
#include "eng_tok_int.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

static int failures;

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);            \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
            failures++;                                                     \
        }                                                                   \
    } while (0)

/* ---- classes ---------------------------------------------------------------- */

static pcre2_code *compile(const char *pat, uint32_t extra)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | extra, &ec, &eo, NULL);
    if (re == NULL) {
        fprintf(stderr, "pcre2_compile(%s): %d\n", pat, ec);
        exit(1);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* only for speed */
    return re;
}

static unsigned pcre_class(pcre2_code *const re[3], pcre2_match_data *md, uint32_t cp)
{
    char b[4];
    size_t l = eng_utf8_put(cp, b);
    unsigned c = 0;

    for (int k = 0; k < 3; k++)
        if (pcre2_match(re[k], (PCRE2_SPTR)b, l, 0, 0, md, NULL) > 0)
            c |= 1u << k;
    return c;
}

static void check_classes(bool emit)
{
    static const char *const pats[3] = { "\\p{L}", "\\p{N}", "\\s" }; /* ENG_UC_L, N, S */
    pcre2_code *re[3];
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    unsigned prev = 0, bad = 0;
    uint32_t lo = 0, cp;

    for (int k = 0; k < 3; k++)
        re[k] = compile(pats[k], PCRE2_ANCHORED);
    for (cp = 0; cp <= 0x110000; cp++) {
        unsigned c = prev;
        if (cp < 0x110000 && (cp < 0xd800 || cp > 0xdfff)) { /* surrogates: not text */
            c = pcre_class(re, md, cp);
            if (!emit && c != eng_uc_class(cp) && bad++ < 10)
                CHECK(0, "U+%04X: PCRE2 class %u, eng_uc_class %u", cp, c, eng_uc_class(cp));
        }
        if (emit && (c != prev || cp == 0x110000)) {
            if (prev != 0)
                printf("    { 0x%06X, 0x%06X, %u },\n", lo, cp - 1, prev);
            lo = cp;
            prev = c;
        }
    }
    if (!emit)
        printf("classes: %u code points differ from PCRE2's\n", bad);
    for (int k = 0; k < 3; k++)
        pcre2_code_free(re[k]);
    pcre2_match_data_free(md);
}

/* ---- pieces ------------------------------------------------------------------ */

/* The PCRE2 split the tokenizer used before the scanner: matches, and the
 * gaps between them, are pieces. Returns the number of pieces. */
static size_t pcre_split(pcre2_code *re, const char *text, size_t len, size_t *ends, size_t cap)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    PCRE2_SIZE off = 0, prev = 0;
    size_t n = 0;

#define PUSH(e) do { if (n < cap) ends[n] = (e); n++; } while (0)
    while (off < len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)text, len, off, 0, md, NULL);
        PCRE2_SIZE *ov;
        if (rc < 0)
            break;
        ov = pcre2_get_ovector_pointer(md);
        if (ov[0] > prev)
            PUSH(ov[0]);
        if (ov[1] == ov[0]) { /* not produced by these patterns */
            off = ov[0] + 1;
            prev = ov[0];
            continue;
        }
        PUSH(ov[1]);
        off = prev = ov[1];
    }
    if (len > prev)
        PUSH(len);
#undef PUSH
    pcre2_match_data_free(md);
    return n;
}

static eng_tok_t *make_bpe(const char *pre)
{
    static eng_tok_str_t toks[257];
    static char names[256][4];
    eng_tok_vocab_t v = { 0 };
    eng_tok_t *tok = NULL;
    char err[128];

    for (unsigned i = 0; i < 256; i++) {
        size_t k = eng_utf8_put(eng_bpe_byte_to_cp((uint8_t)i), names[i]);
        toks[i].s = names[i];
        toks[i].len = (uint32_t)k;
    }
    v.model = "gpt2";
    v.pre = pre;
    v.tokens = toks;
    v.n_tokens = 256;
    v.bos_id = v.eos_id = v.unk_id = v.pad_id = v.eot_id = -1;
    v.add_bos = v.add_space_prefix = -1;
    if (eng_tok_create(&v, &tok, err, sizeof(err)) != PD_OK) {
        fprintf(stderr, "eng_tok_create: %s\n", err);
        exit(1);
    }
    return tok;
}

static size_t ends_a[1 << 16], ends_b[1 << 16];

static bool same_pieces(const char *name, eng_tok_t *tok, pcre2_code *re, const char *text,
                        size_t len)
{
    size_t na = eng_tok_bpe_split(tok, text, len, ends_a, 1 << 16);
    size_t nb = pcre_split(re, text, len, ends_b, 1 << 16);
    size_t i, at = 0;

    for (i = 0; i < na && i < nb && i < (1 << 16); i++)
        if (ends_a[i] != ends_b[i])
            break;
    if (i == na && na == nb)
        return true;
    if (i > 0)
        at = ends_b[i - 1];
    fprintf(stderr, "FAIL %s: piece %zu differs (scanner ends at %zu, PCRE2 at %zu) in \"",
            name, i, i < na ? ends_a[i] : 0, i < nb ? ends_b[i] : 0);
    for (size_t k = at; k < len && k < at + 24; k++)
        fprintf(stderr, (uint8_t)text[k] >= 0x20 && (uint8_t)text[k] < 0x7f ? "%c" : "\\x%02x",
                (uint8_t)text[k]);
    fprintf(stderr, "\"\n");
    failures++;
    return false;
}

/* Atoms the random texts are made of: each class and every boundary the
 * patterns care about. */
static const char *const atoms[] = {
    "a", "Z", "hello", " ", "  ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c",
    "0", "7", "12345", "'", "'s", "'S", "'t", "'re", "'RE", "'Ve", "'m", "'ll", "'LL", "'lL",
    "'d", "'D", "'x", "\xc5\xbf" /* U+017F long s */, "!", "?!", "...", "-", "_", "(", ")",
    "\xc3\xa9" /* é */, "\xc3\x89", "\xe4\xbd\xa0\xe5\xa5\xbd" /* CJK */, "\xd0\x96" /* Ж */,
    "\xd9\xa3" /* Arabic-Indic 3 */, "\xc2\xb2" /* superscript 2 (No) */,
    "\xe2\x85\xab" /* Roman XII (Nl) */, "\xc2\xa0" /* NBSP */, "\xe3\x80\x80" /* ideographic sp */,
    "\xe2\x80\xa8" /* line sep */, "\xc2\x85" /* NEL */, "\xe1\xa0\x8e" /* U+180E (\h) */,
    "\xcc\x81" /* combining acute (Mn) */, "\xf0\x9f\x98\x80" /* emoji */,
    "\xe2\x80\x8b" /* ZWSP (Cf) */, "\xef\xbf\xbd", "\xff", "\xc3", "\xe4\xbd",
};
#define N_ATOMS (sizeof(atoms) / sizeof(atoms[0]))

static const char *const fixed[] = {
    "Hello world! It's 2024, we'll see.\n\n  x",
    "I'M fine!!\n\n  x", "  \n  x", "\t\t\nword", "a  b   c    ", "   ", "\n", " \r\n \r\n ",
    "don't STOP'RE'VE 'sam 'Sam \xc5\xbfx'\xc5\xbf", "12345678 1 22 333 4444",
    "caf\xc3\xa9 na\xc3\xafve \xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c 2024",
    "x\xc2\xa0y \xe3\x80\x80z\xe2\x80\xa8w", "((a)) !!b ?c\n\nd", "x\xcc\x81y",
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static void check_pieces(const char *pre, int n_random)
{
    eng_tok_t *tok = make_bpe(pre);
    pcre2_code *re = compile(eng_tok_bpe_pattern(tok), PCRE2_MATCH_INVALID_UTF);
    static char text[4096];
    int ok = 0, i;

    for (i = 0; i < (int)(sizeof(fixed) / sizeof(fixed[0])); i++)
        ok += same_pieces(pre, tok, re, fixed[i], strlen(fixed[i]));
    for (i = 0; i < n_random; i++) {
        size_t len = 0;
        unsigned n = 1 + rnd() % 40;
        for (unsigned k = 0; k < n; k++) {
            const char *a = atoms[rnd() % N_ATOMS];
            size_t al = strlen(a);
            memcpy(text + len, a, al);
            len += al;
        }
        ok += same_pieces(pre, tok, re, text, len);
        if (failures > 20)
            break;
    }
    printf("pieces %-10s: %d texts as PCRE2\n", pre, ok);
    pcre2_code_free(re);
    eng_tok_destroy(tok);
}

/* ---- linear time ------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Splitting 1 MiB takes about 4x 256 KiB (PCRE2's interpreter: ~16x and
 * more). Texts of many small pieces and of long runs. */
static void check_linear(const char *pre)
{
    static const char *const unit[] = { "word 12 !? \n", " ", "x", "\xe4\xbd\xa0" };
    eng_tok_t *tok = make_bpe(pre);
    size_t big = 1u << 20;
    char *text = malloc(big);

    for (size_t u = 0; u < sizeof(unit) / sizeof(unit[0]); u++) {
        size_t ul = strlen(unit[u]), len = 0;
        double t[2];
        while (len + ul <= big) {
            memcpy(text + len, unit[u], ul);
            len += ul;
        }
        /* the fastest of 5 runs of each size: a shared machine only ever
         * adds time, so the minimum is the closest to the work done */
        for (int k = 0; k < 2; k++) {
            size_t l = k == 0 ? len / 4 : len;
            t[k] = 1e9;
            for (int rep = 0; rep < 5; rep++) {
                double t0 = now_s();
                (void)eng_tok_bpe_split(tok, text, l, NULL, 0);
                double dt = now_s() - t0;
                if (dt < t[k])
                    t[k] = dt;
            }
        }
        printf("linear %-10s unit %zu: 256 KiB %.1f ms, 1 MiB %.1f ms\n", pre, u,
               t[0] * 1e3, t[1] * 1e3);
        /* 4x the text: linear is 4x the time, quadratic 16x (PCRE2's
         * interpreter took 3.7 s for 256 KiB); the bound sits between, and
         * anything under 50 ms for 1 MiB is linear enough whatever the ratio
         * of two tiny figures says */
        CHECK(t[1] < 0.050 || t[1] < 10 * t[0], "%s: not linear (%.4f s vs %.4f s)", pre,
              t[1], t[0]);
    }
    free(text);
    eng_tok_destroy(tok);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--emit") == 0) {
        check_classes(true);
        return 0;
    }
    check_classes(false);
    check_pieces("gpt2", 3000);
    check_pieces("llama-bpe", 3000);
    check_pieces("qwen2", 3000);
    check_linear("gpt2");
    check_linear("llama-bpe");
    check_linear("qwen2");
    if (failures > 0) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
