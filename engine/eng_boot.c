/* eng_boot.c - see eng_boot.h. */
#include "eng_boot.h"

#include <stdio.h>
#include <string.h>

#include "eng_tok.h"

pd_status_t eng_boot_load(const eng_boot_opts_t *o, eng_boot_t *b, char *err, size_t err_len)
{
    memset(b, 0, sizeof(*b));
    b->engine = o->engine;
    if (b->engine == NULL)
        b->engine = strncmp(o->model, "sim:", 4) == 0 ? "sim" : "llama";
    b->ops = eng_find(b->engine);
    if (b->ops == NULL) {
        snprintf(err, err_len, "unknown engine \"%s\"", b->engine);
        return PD_ERR_NOT_FOUND;
    }
    eng_load_opts_t lo = {
        .engine = b->engine, .model_path = o->model, .block_tokens = o->block_tokens,
        .kv_dtype = o->kv_dtype, .n_threads = o->n_threads, .max_batch = o->max_batch,
    };
    pd_status_t st = b->ops->load(&lo, &b->model, err, err_len);
    if (st != PD_OK)
        return st;
    b->geom = b->ops->geometry(b->model);
    eng_tok_t *tok = NULL;
    if (eng_tok_load_for(b->engine, o->model, &tok, b->tok_err, sizeof(b->tok_err)) != PD_OK) {
        if (b->tok_err[0] == '\0')
            snprintf(b->tok_err, sizeof(b->tok_err), "no tokenizer");
        return PD_OK;
    }
    int32_t eos = eng_tok_eos(tok);
    if (eos >= 0)
        b->eos_ids[b->n_eos++] = eos;
    for (uint32_t id = 0; id < eng_tok_vocab_size(tok) && b->n_eos < ENG_SAMPLE_MAX_EOS; id++)
        if (eng_tok_is_eog(tok, (int32_t)id) && (int32_t)id != eos)
            b->eos_ids[b->n_eos++] = (int32_t)id;
    eng_tok_destroy(tok);
    return PD_OK;
}
