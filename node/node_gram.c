/* node_gram.c - structured output in a KV-holding daemon: the vocabulary's
 * token pieces (built once at boot) and a sequence's grammar (compiled from
 * the request's sampling block). Prefill masks token 0 with it, decode the
 * rest; both feed the generated tokens, so the states agree (engine/gram). */
#include "node.h"

#include <stdlib.h>
#include <string.h>

#include "eng_tok.h"

static size_t node_piece(void *ctx, int32_t id, char *buf, size_t cap)
{
    const eng_tok_t *tok = ctx;
    if (id < 0 || (uint32_t)id >= eng_tok_vocab_size(tok))
        return 0;
    return eng_tok_token_piece(tok, id, false, buf, cap);
}

pd_status_t node_gram_vocab(node_t *n, const eng_tok_t *tok)
{
    uint32_t vocab = n->geom->vocab_size;
    n->gram_scratch = malloc(vocab ? vocab : 1);
    n->gram_raw = malloc((vocab ? vocab : 1) * sizeof(float));
    if (n->gram_scratch == NULL || n->gram_raw == NULL)
        return PD_ERR_NO_MEMORY;
    return eng_gram_vocab_create(vocab, node_piece, (void *)tok, &n->gram_vocab);
}

pd_status_t node_gram_start(const node_t *n, const proto_sampling_t *ps, node_gram_t *ng)
{
    memset(ng, 0, sizeof(*ng));
    if (ps->gram_kind == PROTO_GRAM_NONE)
        return PD_OK;
    if (n->gram_vocab == NULL)
        return PD_ERR_BAD_INPUT;
    pd_status_t st = eng_gram_compile((eng_gram_kind_t)ps->gram_kind, (const char *)ps->gram.p,
                                      ps->gram.len, &ng->g, NULL, 0);
    if (st == PD_OK)
        st = eng_gram_state_create(ng->g, &ng->st);
    if (st != PD_OK) {
        node_gram_end(ng);
        return st == PD_ERR_NO_MEMORY ? st : PD_ERR_BAD_INPUT;
    }
    return PD_OK;
}

int32_t node_sample(node_t *n, node_gram_t *ng, eng_sampler_t *s, float *logits,
                    const eng_sample_hist_t *h, uint32_t budget, uint32_t n_top,
                    eng_logprobs_t *lp)
{
    uint32_t vocab = n->geom->vocab_size;
    if (ng->st == NULL)
        return eng_sample_next_lp(s, logits, vocab, &n->scratch, h, n_top, lp);
    if (lp)
        memcpy(n->gram_raw, logits, (size_t)vocab * sizeof(float));
    (void)eng_gram_mask(ng->st, n->gram_vocab, n->eos_ids, n->n_eos, logits, vocab,
                        n->gram_scratch, budget);
    int32_t t = eng_sample_next(s, logits, vocab, &n->scratch, h);
    if (t < 0 || !node_gram_take(n, ng, t))
        return -1;
    if (lp)
        eng_sample_logprobs(n->gram_raw, vocab, t, n_top, lp);
    return t;
}

bool node_gram_take(const node_t *n, node_gram_t *ng, int32_t token)
{
    if (ng->st == NULL)
        return true;
    for (uint32_t i = 0; i < n->n_eos; i++)
        if (n->eos_ids[i] == token)
            return eng_gram_complete(ng->st);
    return eng_gram_feed_token(ng->st, n->gram_vocab, token);
}

void node_gram_end(node_gram_t *ng)
{
    eng_gram_state_free(ng->st);
    eng_gram_free(ng->g);
    memset(ng, 0, sizeof(*ng));
}
