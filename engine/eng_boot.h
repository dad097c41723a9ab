/* eng_boot.h - the engine part of a daemon's boot, shared by pd-prefill and
 * pd-decode: pick the engine (from --engine, else "sim" for a "sim:" model,
 * else "llama"), load the model, read its KV geometry and the EOS / end of
 * generation ids from its tokenizer. Depends on engine + common only. */
#ifndef ENG_BOOT_H
#define ENG_BOOT_H

#include <stddef.h>
#include <stdint.h>

#include "eng.h"
#include "eng_sample.h"
#include "pd_status.h"

/* The engine's config rows, X(field, key, type, default, help, min, max,
 * enum_names) over the daemon's config struct; kv_dtypes: its
 * { "f32", "f16", NULL } names (eng_kv_dtype_t order). */
#define ENG_BOOT_ROWS(X, kv_dtypes)                                           \
    X(model, "model", STRING, NULL, "GGUF path or sim:<preset or spec>", 0, 0, NULL) \
    X(engine, "engine", STRING, NULL, "llama|sim (default: from model)", 0, 0, NULL) \
    X(threads, "threads", UINT, "0", "engine threads (0 = online cores)", 0, 1024, NULL) \
    X(block_tokens, "block-tokens", UINT, "16", "tokens per KV block", 1, 4096, NULL) \
    X(kv_dtype, "kv-dtype", ENUM, "f16", "KV dtype: f32|f16", 0, 0, kv_dtypes)

typedef struct {
    const char *model;          /* GGUF path or "sim:<preset or spec>" */
    const char *engine;         /* NULL: from the model */
    uint32_t block_tokens;
    eng_kv_dtype_t kv_dtype;
    uint32_t n_threads;
    uint32_t max_batch;
} eng_boot_opts_t;

typedef struct {
    const char *engine;         /* the engine chosen (static string or o->engine) */
    const eng_ops_t *ops;
    eng_model_t *model;
    const eng_kv_geom_t *geom;
    int32_t eos_ids[ENG_SAMPLE_MAX_EOS];
    uint32_t n_eos;             /* 0 when the model has no tokenizer */
    char tok_err[256];          /* why there is no tokenizer, "" if there is */
} eng_boot_t;

/* Load o's model into *b. PD_ERR_NOT_FOUND: no engine of that name
 * (b->engine names it, err says so); other statuses come from the engine's
 * load with its message in err. A missing tokenizer is not an error: no
 * EOS ids, b->tok_err says why (the caller warns). The caller owns b->model (ops->destroy). */
pd_status_t eng_boot_load(const eng_boot_opts_t *o, eng_boot_t *b, char *err, size_t err_len);

#endif
