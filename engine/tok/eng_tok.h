/* eng_tok.h - tokenizers, streaming detokenizer and stop-string matcher.
 *
 * Three tokenizer kinds, chosen by GGUF `tokenizer.ggml.model`:
 *   ENG_TOK_SPM  "llama": SentencePiece-style BPE by token scores, U+2581
 *                for spaces, dummy prefix space, byte fallback <0xNN>.
 *   ENG_TOK_BPE  "gpt2":  byte-level BPE by merge ranks after a PCRE2
 *                pre-tokenizer split chosen by `tokenizer.ggml.pre`
 *                ("llama-bpe"/"llama3", "qwen2", default gpt2).
 *   ENG_TOK_BYTE built-in byte tokenizer: one token per byte + control
 *                tokens (the generated default model, see engine/gguf).
 *
 * Text in is bytes. Invalid UTF-8 in the input is replaced by U+FFFD before
 * tokenizing (what an HTTP/JSON client would have sent anyway), so the
 * tokenizers only ever see valid UTF-8. Control tokens written in the text
 * (e.g. "<|eot_id|>") become their token only when parse_special is set;
 * otherwise they are tokenized as plain text.
 *
 * A loaded eng_tok_t is immutable: every function taking a const eng_tok_t *
 * is safe from any thread. This file holds no model math: pd-router links it.
 */
#ifndef ENG_TOK_H
#define ENG_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "pd_status.h"
#include "gguf.h"

#define ENG_TOK_MAX_INPUT   (8u << 20)  /* bytes of text per encode call */
#define ENG_TOK_MAX_VOCAB   (1u << 20)  /* tokens */
#define ENG_TOK_MAX_TOKLEN  1024u       /* bytes of one token's text */
#define ENG_TOK_MAX_MERGES  (1u << 21)
#define ENG_TOK_PIECE_MAX   ENG_TOK_MAX_TOKLEN /* largest piece output */

typedef enum {
    ENG_TOK_SPM = 0,
    ENG_TOK_BPE = 1,
    ENG_TOK_BYTE = 2,
} eng_tok_kind_t;

/* GGUF tokenizer.ggml.token_type values. */
typedef enum {
    ENG_TOKT_UNDEFINED = 0,
    ENG_TOKT_NORMAL = 1,
    ENG_TOKT_UNKNOWN = 2,
    ENG_TOKT_CONTROL = 3,
    ENG_TOKT_USER_DEFINED = 4,
    ENG_TOKT_UNUSED = 5,
    ENG_TOKT_BYTE = 6,
} eng_tok_type_t;

/* tokenizer.ggml.model value of the built-in byte tokenizer. */
#define ENG_TOK_BYTE_MODEL_NAME "pdbyte"
#define ENG_TOK_BYTE_VOCAB_MIN  260u

/* A byte string that need not be NUL-terminated (GGUF strings are not). */
typedef struct {
    const char *s;
    uint32_t len;
} eng_tok_str_t;

/* In-memory vocabulary description: what the GGUF metadata says. Only
 * model and tokens are required; everything is copied by eng_tok_create. */
typedef struct {
    const char *model;           /* "llama" | "gpt2" | ENG_TOK_BYTE_MODEL_NAME */
    const char *pre;             /* tokenizer.ggml.pre, NULL = default */
    const eng_tok_str_t *tokens; /* (n_tokens) */
    uint32_t n_tokens;
    const float *scores;         /* (n_tokens) or NULL (SPM: score = -id) */
    const int32_t *token_types;  /* (n_tokens) or NULL (all normal) */
    const eng_tok_str_t *merges; /* (n_merges) "left right", BPE only */
    uint32_t n_merges;
    int32_t bos_id, eos_id;      /* -1 = absent / find by text */
    int32_t unk_id, pad_id;      /* -1 = absent */
    int32_t eot_id;              /* -1 = find by text (<|eot_id|>, <|im_end|>) */
    int add_bos;                 /* -1 = default for the kind, 0, 1 */
    int add_space_prefix;        /* -1 = default for the kind, 0, 1 */
    int add_eos;                 /* tokenizer.ggml.add_eos_token: 1, else (0, -1) no */
    const char *chat_template;   /* NULL = none */
    uint32_t chat_template_len;
} eng_tok_vocab_t;

typedef struct eng_tok eng_tok_t;

/* Build a tokenizer from an in-memory vocabulary (copied). Statuses:
 * PD_ERR_BAD_INPUT (inconsistent vocab, message in err), PD_ERR_TOO_BIG
 * (a cap exceeded), PD_ERR_UNSUPPORTED (unknown model kind), PD_ERR_NO_MEMORY. */
pd_status_t eng_tok_create(const eng_tok_vocab_t *vocab, eng_tok_t **tok_p,
                           char *err, size_t err_len);

/* The built-in byte tokenizer, the same vocabulary pd-mkmodel writes
 * (engine/gguf): ids 0..255 are the bytes <0xNN>, then the control tokens
 * <s> (256, BOS), <|im_start|> (257), <|im_end|> (258, EOS/EOT), <pad> (259),
 * then vocab_size-260 unused <unused_K> tokens so the tokenizer covers a
 * model's whole vocabulary. vocab_size >= 260. PD_ERR_BAD_INPUT,
 * PD_ERR_NO_MEMORY. */
pd_status_t eng_tok_create_byte(uint32_t vocab_size, eng_tok_t **tok_p);

/* Load from a GGUF file's tokenizer.* metadata (engine/gguf reader); the
 * tokenizer copies what it needs, the file may be closed afterwards.
 * Statuses: as eng_tok_create, plus PD_ERR_NOT_FOUND (no tokenizer keys)
 * and PD_ERR_IO (path variant). */
pd_status_t eng_tok_load(const gguf_t *file, eng_tok_t **tok_p,
                         char *err, size_t err_len);
pd_status_t eng_tok_load_path(const char *path, eng_tok_t **tok_p,
                              char *err, size_t err_len);

/* The tokenizer of a model as the daemons configure it: engine "sim" uses
 * the built-in byte tokenizer (the sim engine only emits byte tokens and
 * EOS, see engine/sim/eng_sim.h), any other engine loads model_path's GGUF.
 * Lets pd-router pick a tokenizer without linking the engines. Statuses: as
 * eng_tok_load_path. */
pd_status_t eng_tok_load_for(const char *engine, const char *model_path,
                             eng_tok_t **tok_p, char *err, size_t err_len);

void eng_tok_destroy(eng_tok_t *tok); /* accepts NULL */

/* Encode text[0..len) into ids (capacity cap). add_bos prepends BOS when the
 * vocabulary has one (callers usually pass eng_tok_add_bos(tok));
 * parse_special turns control-token texts into their ids. *n_p is the number
 * of ids. Statuses: PD_ERR_TOO_BIG (len > ENG_TOK_MAX_INPUT), PD_ERR_NO_SPACE
 * (more than cap ids: ids holds the first cap, *n_p the number needed, so
 * ids = NULL, cap = 0 counts tokens), PD_ERR_NO_MEMORY. Never fails on any
 * byte content. */
pd_status_t eng_tok_encode(const eng_tok_t *tok, const char *text, size_t len,
                           bool add_bos, bool parse_special,
                           int32_t *ids /* (cap) */, size_t cap, size_t *n_p);

/* Bytes the token contributes to the output text (spaces restored, byte
 * tokens as their byte, byte-level BPE unmapped). Control tokens give their
 * text only when special is set, else nothing. Returns the number of bytes
 * (<= ENG_TOK_PIECE_MAX) written to buf (not NUL-terminated), or 0 for an
 * id out of range or a piece that does not fit in cap. */
size_t eng_tok_token_piece(const eng_tok_t *tok, int32_t id, bool special,
                           char *buf, size_t cap);

/* Raw vocabulary text of a token (as stored in GGUF), NULL if out of range. */
const char *eng_tok_token_text(const eng_tok_t *tok, int32_t id, size_t *len_p);
/* Token id whose raw text is exactly s[0..len), or -1. */
int32_t eng_tok_find(const eng_tok_t *tok, const char *s, size_t len);

eng_tok_kind_t eng_tok_kind(const eng_tok_t *tok);
uint32_t eng_tok_vocab_size(const eng_tok_t *tok);
int32_t eng_tok_bos(const eng_tok_t *tok);          /* -1 if none */
int32_t eng_tok_eos(const eng_tok_t *tok);          /* -1 if none */
bool eng_tok_add_bos(const eng_tok_t *tok);         /* metadata default */
/* tokenizer.ggml.add_eos_token and an EOS: llama.cpp appends EOS to a text
 * tokenized with special tokens (embeddings: the router does too). */
bool eng_tok_add_eos(const eng_tok_t *tok);
/* End of generation: EOS, EOT (<|eot_id|>, <|im_end|>, <|eom_id|>, ...). */
bool eng_tok_is_eog(const eng_tok_t *tok, int32_t id);
eng_tok_type_t eng_tok_token_type(const eng_tok_t *tok, int32_t id);
/* tokenizer.chat_template (NUL-terminated) or NULL. */
const char *eng_tok_chat_template(const eng_tok_t *tok);
/* tokenizer.ggml.model / tokenizer.ggml.pre as loaded ("" if absent). */
const char *eng_tok_model_name(const eng_tok_t *tok);
const char *eng_tok_pre_name(const eng_tok_t *tok);

/* ---- streaming detokenizer ----------------------------------------------
 * Feed token ids one by one, get UTF-8 text out. A character split across
 * tokens (byte tokens, byte-level BPE) is emitted only when complete; bytes
 * that can never complete a character are emitted as U+FFFD. */
#define ENG_DETOK_OUT_MAX (3 * (ENG_TOK_PIECE_MAX + 4)) /* out capacity per feed */

typedef struct {
    const eng_tok_t *tok;
    uint8_t pend[4];   /* incomplete UTF-8 sequence carried between tokens */
    uint8_t n_pend;
    bool special;      /* render control tokens as text */
    bool strip_space;  /* SPM: drop the dummy-prefix space of the first piece */
    bool started;
} eng_detok_t;

/* Start a stream. special: render control tokens; strip_prefix_space: the
 * stream starts at the beginning of a text encoded with the SPM dummy
 * prefix (decode of a whole prompt); a continuation passes false. */
void eng_detok_init(eng_detok_t *d, const eng_tok_t *tok, bool special,
                    bool strip_prefix_space);
/* Feed one token; writes 0..ENG_DETOK_OUT_MAX bytes of complete UTF-8 to out
 * and returns the count. cap < ENG_DETOK_OUT_MAX is a caller bug (asserted;
 * 0 bytes in NDEBUG builds). */
size_t eng_detok_feed(eng_detok_t *d, int32_t id, char *out, size_t cap);
/* End of stream: an incomplete trailing sequence becomes U+FFFD. Returns bytes
 * written (<= 3; cap >= 4). */
size_t eng_detok_finish(eng_detok_t *d, char *out, size_t cap);

/* Convenience: decode a whole id list into buf (NUL-terminated if room).
 * Returns the number of bytes the full text needs (like snprintf). */
size_t eng_tok_decode(const eng_tok_t *tok, const int32_t *ids, size_t n,
                      bool special, bool strip_prefix_space,
                      char *buf, size_t cap);

/* ---- stop strings ---------------------------------------------------------
 * Runs on the streamed text. Text that could be the start of a stop string is
 * held back; when a stop string appears, the text before it is released, the
 * stop string and everything after are dropped, and `matched` reports which
 * stop. Holds at most ENG_STOP_MAX_LEN-1 bytes. */
#define ENG_STOP_MAX      16
#define ENG_STOP_MAX_LEN  256

typedef struct {
    char stop[ENG_STOP_MAX][ENG_STOP_MAX_LEN];
    uint32_t stop_len[ENG_STOP_MAX];
    uint32_t n_stop;
    char hold[2 * ENG_STOP_MAX_LEN]; /* held-back tail of the stream */
    uint32_t n_hold;
    int matched;                     /* index of the matched stop, or -1 */
} eng_stop_t;

/* Set up with n stop strings (empty strings are ignored). PD_ERR_TOO_BIG
 * (n > ENG_STOP_MAX or a string longer than ENG_STOP_MAX_LEN),
 * PD_ERR_BAD_INPUT (NULL string). */
pd_status_t eng_stop_init(eng_stop_t *st, const char *const *stops, size_t n);
/* Feed streamed text; writes releasable text to out and returns its length.
 * out is also the workspace: cap < len + ENG_STOP_MAX_LEN is a caller bug
 * (asserted). After a match (st->matched >= 0) further feeds output nothing:
 * end the sequence with finish_reason "stop". */
size_t eng_stop_feed(eng_stop_t *st, const char *text, size_t len,
                     char *out, size_t cap);
/* Stream ended without a match: release what was held (cap >= ENG_STOP_MAX_LEN). */
size_t eng_stop_flush(eng_stop_t *st, char *out, size_t cap);

#endif
