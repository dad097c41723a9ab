/* eng_gram.h - grammar-constrained decoding for structured output.
 *
 * A JSON schema (docs/API.md's keyword table), "any JSON object", a regular
 * expression (an ECMA-262 subset, whole output) or a GBNF grammar
 * (llama.cpp's) compiles to an immutable rule graph (eng_gram_t): a $ref or
 * a GBNF nonterminal is a call, so recursion works. A per-sequence
 * state (eng_gram_state_t) is a small set of pushdown configurations
 * walked one BYTE at a time; a token is allowed when every byte of its
 * piece walks. eng_gram_mask sets the logit of every token that cannot
 * continue the JSON to -inf (EOS only once the JSON is complete).
 *
 * Reproducibility: the state is a pure function of (kind, schema text,
 * the pieces of the tokens generated so far), so a prefill daemon and a
 * decode daemon that compile the same schema and feed the same tokens hold
 * identical states (that is how the constraint crosses the P->D hand-off).
 *
 * Output shape: no whitespace between tokens; a schema object emits its required
 * properties and any of the others, in declaration order; integers have at most 15
 * digits (19 with bounds), numbers at most 15 integer/fraction digits and 2 exponent digits,
 * so every value parses to a finite IEEE double.
 *
 * Caps (a client controls the schema): ENG_GRAM_MAX_SCHEMA_BYTES of text,
 * ENG_GRAM_MAX_DEPTH schema nesting, ENG_GRAM_MAX_NODES compiled nodes,
 * ENG_GRAM_MAX_RULES, ENG_GRAM_MAX_RANGES, ENG_GRAM_MAX_NEST, ENG_GRAM_MAX_REPEAT;
 * recursion (a $ref cycle, a GBNF rule) is bounded by ENG_GRAM_MAX_STACK
 * frames: a call is taken only when the shallowest completion of what it
 * opens still fits, so at the cap the grammar closes instead of nesting
 * deeper and the output stays valid,
 * ENG_GRAM_MAX_CONFIGS live configurations (anyOf branches), nesting of
 * free JSON (json_object) ENG_GRAM_ANY_DEPTH. */
#ifndef ENG_GRAM_H
#define ENG_GRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "pd_status.h"

#define ENG_GRAM_MAX_SCHEMA_BYTES 16384u
#define ENG_GRAM_MAX_DEPTH 16u
#define ENG_GRAM_MAX_NODES 8192u
#define ENG_GRAM_MAX_RULES 1024u   /* GBNF rules */
#define ENG_GRAM_MAX_RANGES 8192u  /* character-class ranges, bounds */
#define ENG_GRAM_MAX_NEST 32u      /* regex / GBNF group nesting */
#define ENG_GRAM_MAX_REPEAT 4096u  /* {m,n}: m and a bounded n */
#define ENG_GRAM_MAX_CONFIGS 64u   /* = the router's tools per request: a forced call
                                       keeps every tool's branch alive */
#define ENG_GRAM_MAX_ANYOF 64u
#define ENG_GRAM_ANY_DEPTH 8u
#define ENG_GRAM_MAX_STACK 48u

typedef enum {
    ENG_GRAM_NONE = 0,         /* unconstrained */
    ENG_GRAM_JSON_OBJECT = 1,  /* any JSON object (response_format json_object) */
    ENG_GRAM_JSON_SCHEMA = 2,  /* an object matching a JSON schema */
    ENG_GRAM_REGEX = 3,        /* text matching a regex (whole output; vLLM guided_regex) */
    ENG_GRAM_GBNF = 4,         /* text of a GBNF grammar's rule "root" (llama-server) */
} eng_gram_kind_t;

typedef struct eng_gram eng_gram_t;
typedef struct eng_gram_state eng_gram_state_t;
typedef struct eng_gram_vocab eng_gram_vocab_t;

/* Compile. kind JSON_OBJECT ignores schema; JSON_SCHEMA parses schema[0..len)
 * (root must be an object schema); REGEX / GBNF parse the text (at most
 * ENG_GRAM_MAX_SCHEMA_BYTES; GBNF left recursion is refused). On PD_ERR_BAD_INPUT / PD_ERR_TOO_BIG
 * err (when not NULL) holds a message naming the offending keyword or cap.
 * PD_ERR_NO_MEMORY is the only other failure. */
pd_status_t eng_gram_compile(eng_gram_kind_t kind, const char *schema, size_t len,
                             eng_gram_t **g_p, char *err, size_t err_len);
void eng_gram_free(eng_gram_t *g); /* accepts NULL */

/* The token pieces of a vocabulary (bytes each id stands for; 0 bytes for
 * control tokens, which the grammar never allows). Immutable once built,
 * shareable between threads. piece(ctx, id, buf, cap) returns the count. */
typedef size_t (*eng_gram_piece_fn)(void *ctx, int32_t id, char *buf, size_t cap);
pd_status_t eng_gram_vocab_create(uint32_t n, eng_gram_piece_fn piece, void *ctx,
                                  eng_gram_vocab_t **v_p);
void eng_gram_vocab_free(eng_gram_vocab_t *v); /* accepts NULL */
uint32_t eng_gram_vocab_size(const eng_gram_vocab_t *v);

/* A fresh state at the start of the output. */
pd_status_t eng_gram_state_create(const eng_gram_t *g, eng_gram_state_t **s_p);
void eng_gram_state_free(eng_gram_state_t *s); /* accepts NULL */

/* Feed bytes; false (state unchanged) if they cannot continue the JSON. */
bool eng_gram_feed(eng_gram_state_t *s, const uint8_t *b, size_t n);
/* Feed token id's piece (ids >= vocab or empty pieces: false). */
bool eng_gram_feed_token(eng_gram_state_t *s, const eng_gram_vocab_t *v, int32_t id);
/* The JSON so far is a complete value (EOS is allowed). */
bool eng_gram_complete(const eng_gram_state_t *s);

/* Set logits[id] = -inf for every id that cannot come next: ids whose piece
 * does not walk, and eos ids until the JSON is complete (then every other
 * id). ids >= vocab size are masked. scratch: (n_logits) bytes.
 * budget: tokens that may still be generated, this one and EOS included
 * (UINT32_MAX: unlimited). Near the end of the budget only tokens after
 * which the JSON can still be closed in time pass (assuming the vocabulary
 * has one-byte tokens for the closing bytes), so a max_tokens that leaves
 * room for the shortest completion always ends in complete JSON; when the
 * budget is already too small, the mask falls back to plain validity.
 * If nothing would be left (e.g. complete and no EOS id) the logits are not
 * touched and false is returned. */
bool eng_gram_mask(const eng_gram_state_t *s, const eng_gram_vocab_t *v,
                   const int32_t *eos, uint32_t n_eos, float *logits, uint32_t n_logits,
                   uint8_t *scratch, uint32_t budget);

#endif
