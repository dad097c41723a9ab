/* eng_tok_gguf.c - build a tokenizer from GGUF tokenizer.* metadata. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng_tok_int.h"
#include "gguf.h"

/* Optional string key copied into buf (NUL-terminated); "" if absent. */
static void get_str(const gguf_t *g, const char *key, char *buf, size_t cap)
{
    const char *s;
    uint64_t len;

    buf[0] = '\0';
    if (gguf_get_string(g, key, &s, &len) == PD_OK)
        snprintf(buf, cap, "%.*s", (int)(len < cap ? len : cap - 1), s);
}

static int32_t get_id(const gguf_t *g, const char *key)
{
    uint32_t v;

    return gguf_get_u32(g, key, &v) == PD_OK && v < ENG_TOK_MAX_VOCAB ? (int32_t)v : -1;
}

static int get_flag(const gguf_t *g, const char *key)
{
    bool b;

    return gguf_get_bool(g, key, &b) == PD_OK ? (int)b : -1;
}

static pd_status_t str_array(const gguf_arr_t *arr, eng_tok_str_t **out_p)
{
    eng_tok_str_t *out = calloc(arr->count ? arr->count : 1, sizeof(*out));
    uint64_t i, len;

    if (out == NULL)
        return PD_ERR_NO_MEMORY;
    for (i = 0; i < arr->count; i++) {
        out[i].s = gguf_arr_str(arr, i, &len);
        if (len > UINT32_MAX) {
            free(out);
            return PD_ERR_TOO_BIG;
        }
        out[i].len = (uint32_t)len;
    }
    *out_p = out;
    return PD_OK;
}

pd_status_t eng_tok_load(const gguf_t *g, eng_tok_t **tok_p, char *err, size_t err_len)
{
    char model[64], pre[64];
    const gguf_arr_t *toks = NULL, *scores = NULL, *types = NULL, *merges = NULL;
    eng_tok_vocab_t v;
    eng_tok_str_t *tok_strs = NULL, *merge_strs = NULL;
    float *sc = NULL;
    int32_t *ty = NULL;
    const char *tmpl = NULL;
    uint64_t tmpl_len = 0, i;
    pd_status_t status;

    memset(&v, 0, sizeof(v));
    get_str(g, "tokenizer.ggml.model", model, sizeof(model));
    get_str(g, "tokenizer.ggml.pre", pre, sizeof(pre));
    if (model[0] == '\0' ||
        gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks) != PD_OK) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "tokenizer: no tokenizer.ggml.model/tokens in file");
        return PD_ERR_NOT_FOUND;
    }
    if (toks->count == 0 || toks->count > ENG_TOK_MAX_VOCAB) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "tokenizer: %llu tokens (1..%u allowed)",
                     (unsigned long long)toks->count, ENG_TOK_MAX_VOCAB);
        return PD_ERR_TOO_BIG;
    }
    status = str_array(toks, &tok_strs);
    if (status != PD_OK)
        goto out;
    v.model = model;
    v.pre = pre[0] != '\0' ? pre : NULL;
    v.tokens = tok_strs;
    v.n_tokens = (uint32_t)toks->count;

    if (gguf_get_arr(g, "tokenizer.ggml.scores", GGUF_TYPE_COUNT, &scores) == PD_OK) {
        if (scores->count != toks->count ||
            (scores->type != GGUF_TYPE_FLOAT32 && scores->type != GGUF_TYPE_FLOAT64)) {
            status = PD_ERR_BAD_INPUT;
            if (err != NULL && err_len > 0)
                snprintf(err, err_len, "tokenizer: tokenizer.ggml.scores does not match tokens");
            goto out;
        }
        sc = malloc(toks->count * sizeof(float));
        if (sc == NULL) {
            status = PD_ERR_NO_MEMORY;
            goto out;
        }
        for (i = 0; i < toks->count; i++)
            sc[i] = (float)gguf_arr_float(scores, i);
        v.scores = sc;
    }
    if (gguf_get_arr(g, "tokenizer.ggml.token_type", GGUF_TYPE_COUNT, &types) == PD_OK) {
        if (types->count != toks->count || types->type == GGUF_TYPE_STRING ||
            types->type == GGUF_TYPE_FLOAT32 || types->type == GGUF_TYPE_FLOAT64) {
            status = PD_ERR_BAD_INPUT;
            if (err != NULL && err_len > 0)
                snprintf(err, err_len, "tokenizer: tokenizer.ggml.token_type does not match tokens");
            goto out;
        }
        ty = malloc(toks->count * sizeof(int32_t));
        if (ty == NULL) {
            status = PD_ERR_NO_MEMORY;
            goto out;
        }
        for (i = 0; i < toks->count; i++) {
            int64_t t = gguf_arr_int(types, i);
            ty[i] = t >= 0 && t <= 6 ? (int32_t)t : ENG_TOKT_NORMAL;
        }
        v.token_types = ty;
    }
    if (gguf_get_arr(g, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges) == PD_OK) {
        if (merges->count > ENG_TOK_MAX_MERGES) {
            status = PD_ERR_TOO_BIG;
            goto out;
        }
        status = str_array(merges, &merge_strs);
        if (status != PD_OK)
            goto out;
        v.merges = merge_strs;
        v.n_merges = (uint32_t)merges->count;
    }
    v.bos_id = get_id(g, "tokenizer.ggml.bos_token_id");
    v.eos_id = get_id(g, "tokenizer.ggml.eos_token_id");
    v.unk_id = get_id(g, "tokenizer.ggml.unknown_token_id");
    v.pad_id = get_id(g, "tokenizer.ggml.padding_token_id");
    v.eot_id = get_id(g, "tokenizer.ggml.eot_token_id");
    v.add_bos = get_flag(g, "tokenizer.ggml.add_bos_token");
    v.add_eos = get_flag(g, "tokenizer.ggml.add_eos_token");
    v.add_space_prefix = get_flag(g, "tokenizer.ggml.add_space_prefix");
    if (gguf_get_string(g, "tokenizer.chat_template", &tmpl, &tmpl_len) == PD_OK &&
        tmpl_len > 0 && tmpl_len < (1u << 20)) {
        v.chat_template = tmpl;
        v.chat_template_len = (uint32_t)tmpl_len;
    }
    status = eng_tok_create(&v, tok_p, err, err_len);
out:
    free(tok_strs);
    free(merge_strs);
    free(sc);
    free(ty);
    return status;
}

pd_status_t eng_tok_load_path(const char *path, eng_tok_t **tok_p, char *err, size_t err_len)
{
    gguf_t *g;
    pd_status_t status;

    status = gguf_open(path, &g, err, err_len);
    if (status != PD_OK)
        return status;
    status = eng_tok_load(g, tok_p, err, err_len);
    gguf_close(g);
    return status;
}

pd_status_t eng_tok_load_for(const char *engine, const char *model_path,
                             eng_tok_t **tok_p, char *err, size_t err_len)
{
    if (engine != NULL && strcmp(engine, "sim") == 0)
        return eng_tok_create_byte(ENG_TOK_BYTE_VOCAB_MIN, tok_p);
    if (model_path == NULL) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "tokenizer: no model path");
        return PD_ERR_BAD_INPUT;
    }
    return eng_tok_load_path(model_path, tok_p, err, err_len);
}
