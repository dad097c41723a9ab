/* mk_ngram.h - the built-in model: an n-gram language model of a text
 * corpus, compiled exactly into a one-layer Llama GGUF (pd-mkmodel --preset
 * builtin).
 *
 * Pipeline (all deterministic from the corpus bytes and the seed):
 *   corpus   every regular file of a directory (default
 *            /usr/share/common-licenses, from Debian's Essential base-files),
 *            split into paragraphs at blank lines, whitespace collapsed;
 *            each paragraph goes to train / tune / held-out by
 *            splitmix64(seed ^ index) % 10 (8 / 1 / 1).
 *   tokenizer byte-level BPE ("gpt2", GPT-2 pre-tokenizer regex, the same
 *            PCRE2 pattern engine/tok uses) learned on train+tune, as many
 *            merges as the model has token classes for.
 *   n-gram   a log-linear model of the next token x[p+1] given x[p],
 *            x[p-1], x[p-2] (positions before 0 read x[0]):
 *                logit(v) = A[x[p]][v] + B[x[p-1]][v] + C[x[p-2]][v]
 *            A = log of the Witten-Bell bigram P(v | x[p]) (backed off to
 *            the unigram), B/C = lambda1/lambda2 times the log ratio of the
 *            smoothed skip-bigram P(v | token 2 resp. 3 back) to the
 *            unigram; lambdas picked on the tune split. Tokens never seen
 *            as a target get logit MK_NGRAM_FLOOR.
 *   weights  see mk_ngram.c: one-hot classes in three residual slots,
 *            one attention layer whose heads attend exactly to p-1 / p-2
 *            (RoPE relative position on a constant component), output
 *            matrix = [A | B | C]. The llama engine reproduces the logits
 *            above to float rounding.
 */
#ifndef MK_NGRAM_H
#define MK_NGRAM_H

#include <stddef.h>
#include <stdint.h>
#include "pd_status.h"

#define MK_NGRAM_DEFAULT_CORPUS "/usr/share/common-licenses"
#define MK_NGRAM_FLOOR (-30.0f)

typedef struct {
    const char *corpus_dir;    /* NULL = MK_NGRAM_DEFAULT_CORPUS */
    uint64_t seed;             /* held-out split */
    const char *name;          /* general.name, NULL = "pdserve-builtin" */
} mk_ngram_opts_t;

typedef struct mk_ngram mk_ngram_t;

/* Read the corpus, learn the tokenizer, count and build the model.
 * PD_ERR_IO / PD_ERR_BAD_INPUT (message in err), PD_ERR_NO_MEMORY. */
pd_status_t mk_ngram_build(const mk_ngram_opts_t *opts, mk_ngram_t **ng_p,
                           char *err, size_t err_len);
void mk_ngram_destroy(mk_ngram_t *ng); /* accepts NULL */

/* Write the GGUF (atomically). PD_ERR_IO (message in err), PD_ERR_NO_MEMORY. */
pd_status_t mk_ngram_write(const mk_ngram_t *ng, const char *path, char *err,
                           size_t err_len);

uint32_t mk_ngram_vocab(const mk_ngram_t *ng);
int32_t mk_ngram_bos(const mk_ngram_t *ng);
int32_t mk_ngram_eos(const mk_ngram_t *ng);

/* The reference model: logits (vocab) of the token after toks[0..n), n >= 1.
 * Ids out of range count as unseen tokens. */
void mk_ngram_logits(const mk_ngram_t *ng, const int32_t *toks, size_t n, float *logits);

/* Encode plain text (valid UTF-8, no special tokens, no BOS) with the
 * learned BPE: *n_p ids, the first cap of them in ids. PD_ERR_BAD_INPUT
 * (invalid UTF-8), PD_ERR_NO_MEMORY. */
pd_status_t mk_ngram_encode(const mk_ngram_t *ng, const char *text, size_t len,
                            int32_t *ids, size_t cap, size_t *n_p);

/* Paragraphs never used for training or tuning. */
size_t mk_ngram_n_heldout(const mk_ngram_t *ng);
const char *mk_ngram_heldout(const mk_ngram_t *ng, size_t i, size_t *len_p);

/* One line describing corpus, vocab and fit (for the tool's output). */
void mk_ngram_describe(const mk_ngram_t *ng, char *buf, size_t cap);

#endif
