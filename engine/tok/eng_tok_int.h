/* eng_tok_int.h - tokenizer internals shared by eng_tok*.c (not installed). */
#ifndef ENG_TOK_INT_H
#define ENG_TOK_INT_H

#include "eng_tok.h"

typedef enum {
    ENG_PRE_GPT2 = 0,
    ENG_PRE_LLAMA3 = 1,
    ENG_PRE_QWEN2 = 2,
} eng_tok_pre_t;

typedef struct {
    uint32_t l, r;     /* token ids of the pair */
    uint32_t rank;     /* merge rank, lower merges first; UINT32_MAX = empty */
} eng_merge_slot_t;

struct eng_tok {
    eng_tok_kind_t kind;
    eng_tok_pre_t pre;
    uint32_t n_vocab;
    char *text;            /* all raw token texts, each NUL-terminated */
    uint32_t *text_off;    /* (n_vocab + 1) offsets into text */
    char *piece;           /* decoded bytes of every token (see token_piece) */
    uint32_t *piece_off;   /* (n_vocab + 1) offsets into piece */
    float *scores;         /* (n_vocab) */
    uint8_t *types;        /* (n_vocab) eng_tok_type_t */
    uint32_t *map;         /* (map_mask + 1) text -> id + 1, 0 = empty */
    uint32_t map_mask;
    eng_merge_slot_t *merges; /* (merge_mask + 1) open addressing */
    uint32_t merge_mask;
    uint32_t max_tok_len;  /* longest normal/user-defined token text (SPM pruning) */
    int32_t byte_tok[256]; /* SPM: <0xNN>; BPE: mapped single char; BYTE: byte */
    int32_t bos, eos, eot, unk, pad;
    int32_t *eog;          /* (n_eog) end-of-generation ids */
    uint32_t n_eog;
    bool add_bos, add_space_prefix, ignore_merges, add_eos;
    int32_t *special;      /* (n_special) control + user-defined, longest first */
    uint32_t n_special;
    bool special_first[256]; /* first bytes of special texts */
    char *chat_template;
    char model_name[32];
    char pre_name[32];
};

static inline const char *eng_tok_text_at(const eng_tok_t *t, uint32_t id,
                                          uint32_t *len_p)
{
    *len_p = t->text_off[id + 1] - t->text_off[id] - 1;
    return t->text + t->text_off[id];
}

int32_t eng_tok_lookup(const eng_tok_t *tok, const char *s, size_t len);

/* Growable id output shared by the encoders. */
typedef struct {
    int32_t *ids;
    size_t cap, n;
    bool overflow;
} eng_tok_out_t;

static inline void eng_tok_out_push(eng_tok_out_t *o, int32_t id)
{
    if (o->n < o->cap)
        o->ids[o->n] = id;
    else
        o->overflow = true;
    o->n++;
}

/* Encoders of one raw-text fragment (valid UTF-8, no special tokens). */
pd_status_t eng_tok_spm_encode(const eng_tok_t *tok, const char *text,
                               size_t len, eng_tok_out_t *out);
pd_status_t eng_tok_bpe_encode(const eng_tok_t *tok, const char *text,
                               size_t len, eng_tok_out_t *out);
/* Test hook: end offsets of the pre-tokenizer pieces of text (BPE only);
 * returns the number of pieces (entries beyond cap are not written). */
size_t eng_tok_bpe_split(const eng_tok_t *tok, const char *text, size_t len,
                         size_t *ends, size_t cap);
pd_status_t eng_tok_bpe_setup(eng_tok_t *tok, char *err, size_t err_len);
/* The pre-tokenizer regex (PCRE2 syntax, compile with UTF + UCP +
 * MATCH_INVALID_UTF) that the BPE scanner implements: for tests, which
 * check the scanner against PCRE2. */
const char *eng_tok_bpe_pattern(const eng_tok_t *tok);

/* Unicode classes of the pre-tokenizers (eng_tok_ucd.c, generated from
 * PCRE2's tables): bits of \p{L}, \p{N}, \s (UCP: \p{Z}, \h, \v). */
#define ENG_UC_L 0x1u
#define ENG_UC_N 0x2u
#define ENG_UC_S 0x4u
uint8_t eng_uc_class(uint32_t cp);

/* Byte-level BPE byte <-> code point tables (GPT-2 bytes_to_unicode). */
uint32_t eng_bpe_byte_to_cp(uint8_t b);
int eng_bpe_cp_to_byte(uint32_t cp); /* -1 if not a mapped code point */

/* UTF-8 helpers. */
size_t eng_utf8_len(uint8_t first);  /* expected length, 0 if invalid lead */
/* Length of the valid UTF-8 character at s (max n bytes), 0 if invalid. */
size_t eng_utf8_valid(const uint8_t *s, size_t n);
size_t eng_utf8_put(uint32_t cp, char *out);
/* Leading bytes of s[0..n) forming a valid prefix of one character (WHATWG
 * maximal subpart); *complete tells whether the character is whole. */
size_t eng_utf8_prefix(const uint8_t *s, size_t n, bool *complete);

#endif
