/* fuzz_tok.c - fuzz target for the text path the router exposes to clients:
 * encode (byte, SPM and BPE tokenizers, both pre-tokenizers, with and
 * without special-token parsing), streaming detokenize in arbitrary feeds,
 * stop strings and chat rendering. Also tokenizer loading from a GGUF when
 * the input starts with "GGUF" (model files are an attack surface too).
 * Invariant checked: byte-level tokenizers round-trip the (sanitized) text. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng_chat.h"
#include "eng_tok.h"
#include "eng_tok_int.h"
#include "gguf.h"

#define MAX_IDS 8192

static eng_tok_t *toks[4]; /* byte, spm, bpe llama3, bpe qwen2 */

static eng_tok_t *build(const char *model, const char *pre)
{
    static eng_tok_str_t t[400];
    static int32_t ty[400];
    static char names[400][16];
    static const char *const pieces[] = { "\xe2\x96\x81", "\xe2\x96\x81t", "he", "\xe2\x96\x81the",
                                          "in", "er", "\xc4\xa0", "\xc4\xa0t", "\xc4\xa0the" };
    static const eng_tok_str_t merges[] = { { "\xc4\xa0 t", 4 }, { "h e", 3 }, { "\xc4\xa0t he", 6 },
                                            { "i n", 3 }, { "e r", 3 } };
    eng_tok_vocab_t v = { 0 };
    eng_tok_t *tok = NULL;
    uint32_t n = 0, i;
    bool bpe = strcmp(model, "gpt2") == 0;

    for (i = 0; i < 256; i++, n++) {
        if (bpe)
            names[n][eng_utf8_put(eng_bpe_byte_to_cp((uint8_t)i), names[n])] = '\0';
        else
            snprintf(names[n], sizeof(names[n]), "<0x%02X>", i);
        ty[n] = bpe ? ENG_TOKT_NORMAL : ENG_TOKT_BYTE;
    }
    for (i = 0; i < 128 && !bpe; i++, n++) { /* ASCII pieces for SPM */
        names[n][0] = (char)(i < 32 ? 'A' + i : i);
        names[n][1] = '\0';
        ty[n] = ENG_TOKT_NORMAL;
    }
    for (i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++, n++) {
        snprintf(names[n], sizeof(names[n]), "%s", pieces[i]);
        ty[n] = ENG_TOKT_NORMAL;
    }
    snprintf(names[n], sizeof(names[n]), "<|end|>");
    ty[n++] = ENG_TOKT_CONTROL;
    snprintf(names[n], sizeof(names[n]), "<u>");
    ty[n++] = ENG_TOKT_USER_DEFINED;
    snprintf(names[n], sizeof(names[n]), "<s>");
    ty[n++] = ENG_TOKT_CONTROL;
    for (i = 0; i < n; i++) {
        t[i].s = names[i];
        t[i].len = (uint32_t)strlen(names[i]);
    }
    v.model = model;
    v.pre = pre;
    v.tokens = t;
    v.n_tokens = n;
    v.token_types = ty;
    v.merges = bpe ? merges : NULL;
    v.n_merges = bpe ? 5 : 0;
    v.bos_id = bpe ? -1 : (int32_t)n - 1;
    v.eos_id = (int32_t)n - 3;
    v.unk_id = v.pad_id = v.eot_id = -1;
    v.add_bos = v.add_space_prefix = -1;
    char err[160] = "";
    if (eng_tok_create(&v, &tok, err, sizeof(err)) != PD_OK) {
        fprintf(stderr, "fuzz-tok: %s\n", err);
        abort();
    }
    return tok;
}

static void setup(void)
{
    if (toks[0] != NULL)
        return;
    if (eng_tok_create_byte(300, &toks[0]) != PD_OK)
        abort();
    toks[1] = build("llama", NULL);
    toks[2] = build("gpt2", "llama-bpe");
    toks[3] = build("gpt2", "qwen2");
}

/* What the tokenizers see: invalid UTF-8 replaced by U+FFFD. */
static size_t sanitize(const uint8_t *s, size_t n, char *out)
{
    size_t i = 0, o = 0;

    while (i < n) {
        bool complete;
        size_t k = eng_utf8_prefix(s + i, n - i, &complete);
        if (complete) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += k ? k : 1;
        }
    }
    return o;
}

static void stream(const eng_tok_t *tok, const int32_t *ids, size_t n, const uint8_t *data,
                   size_t size)
{
    static char piece[ENG_DETOK_OUT_MAX], out[ENG_DETOK_OUT_MAX + ENG_STOP_MAX_LEN];
    char stop0[17];
    const char *stops[2] = { stop0, "\n\n" };
    size_t i, sl = size < 16 ? size : 16, k;
    eng_detok_t d;
    eng_stop_t st;

    memcpy(stop0, data, sl); /* a stop taken from the input itself */
    stop0[sl] = '\0';
    eng_detok_init(&d, tok, size & 1, (size & 2) != 0);
    if (eng_stop_init(&st, stops, 2) != PD_OK)
        abort();
    for (i = 0; i < n; i++) {
        k = eng_detok_feed(&d, ids[i], piece, sizeof(piece));
        if (k > ENG_DETOK_OUT_MAX)
            abort();
        k = eng_stop_feed(&st, piece, k, out, sizeof(out));
        if (k > sizeof(out) || st.n_hold >= ENG_STOP_MAX_LEN)
            abort();
    }
    k = eng_detok_finish(&d, piece, sizeof(piece));
    (void)eng_stop_feed(&st, piece, k, out, sizeof(out));
    (void)eng_stop_flush(&st, out, sizeof(out));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int32_t ids[MAX_IDS];
    static char clean[3 * 65536], dec[4 * 65536];
    size_t n, t, cl, dl;
    bool special;

    setup();
    if (size >= 4 && memcmp(data, "GGUF", 4) == 0) {
        gguf_t *g;
        eng_tok_t *tok;
        if (gguf_open_memory(data, size, &g, NULL, 0) == PD_OK) {
            if (eng_tok_load(g, &tok, NULL, 0) == PD_OK) {
                static const char probe[] = "Hello wörld <|end|> 12345 \xf0\x9f\x98\x80";
                if (eng_tok_encode(tok, probe, sizeof(probe) - 1, true, true, ids, MAX_IDS, &n) ==
                    PD_OK)
                    stream(tok, ids, n, data, size);
                eng_tok_destroy(tok);
            }
            gguf_close(g);
        }
        return 0;
    }
    if (size == 0 || size > 65536)
        return 0;
    special = data[0] & 1;
    cl = sanitize(data + 1, size - 1, clean);
    for (t = 0; t < 4; t++) {
        pd_status_t st = eng_tok_encode(toks[t], (const char *)data + 1, size - 1,
                                        (data[0] & 2) != 0, special, ids, MAX_IDS, &n);
        if (st == PD_ERR_NO_SPACE)
            continue;
        if (st != PD_OK)
            abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (uint32_t)ids[i] >= eng_tok_vocab_size(toks[t]))
                abort();
        stream(toks[t], ids, n, data + 1, size - 1);
        /* lossless tokenizers give the text back (specials off, SPM without U+2581) */
        if (!special && (t != 1 || memmem(clean, cl, "\xe2\x96\x81", 3) == NULL)) {
            dl = eng_tok_decode(toks[t], ids, n, false, true, dec, sizeof(dec));
            bool lossless = t != 1 || memmem(clean, cl, "<u>", 3) == NULL;
            if (lossless && (dl != cl || memcmp(dec, clean, cl) != 0))
                abort();
        }
    }
    {
        eng_chat_msg_t m[2] = { { "system", (const char *)data, size / 2 },
                                { "user", (const char *)data + size / 2, size - size / 2 } };
        char *out;
        size_t len;
        if (eng_chat_render((eng_chat_kind_t)(data[0] % ENG_CHAT_COUNT), m, 2, true, NULL, NULL,
                            &out, &len) == PD_OK)
            free(out);
        (void)eng_chat_encode(toks[data[0] % 4], (eng_chat_kind_t)((data[0] >> 2) % ENG_CHAT_COUNT),
                              m, 2, true, ids, MAX_IDS, &n);
    }
    return 0;
}
