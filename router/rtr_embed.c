/* rtr_embed.c - POST /v1/embeddings: the body and the answer (rtr_embed.h). */
#include "rtr_embed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "pd_etcd.h" /* pd_b64_encode */
#include "rtr_fd.h"

void rtr_emb_req_free(rtr_emb_req_t *req)
{
    for (uint32_t i = 0; req->inputs != NULL && i < req->n_inputs; i++) {
        free(req->inputs[i].text);
        free(req->inputs[i].ids);
    }
    free(req->inputs);
    memset(req, 0, sizeof(*req));
}

/* A token array (input or input[i]) -> in->ids. */
static bool take_ids(rtr_oai_error_t *err, const cJSON *arr, const rtr_emb_limits_t *lim,
                     const char *param, rtr_emb_input_t *in, bool *oom)
{
    int n = cJSON_GetArraySize(arr);
    if (n == 0)
        return rtr_fd_bad(err, NULL, param, "'%s' must not be empty", param);
    if ((uint32_t)n > lim->max_input_tokens) {
        rtr_fd_bad(err, "context_length_exceeded", param,
                   "'%s' has %d tokens; this model's maximum context length is %u tokens",
                   param, n, lim->max_input_tokens);
        return false;
    }
    in->ids = malloc((size_t)n * sizeof(int32_t));
    if (in->ids == NULL) {
        *oom = true;
        return false;
    }
    const cJSON *t;
    uint32_t k = 0;
    cJSON_ArrayForEach(t, arr) {
        double v = cJSON_IsNumber(t) ? t->valuedouble : -1.0;
        if (!cJSON_IsNumber(t) || v < 0 || v != floor(v) || v > 2147483647.0 ||
            (lim->vocab_size && v >= lim->vocab_size))
            return rtr_fd_bad(err, "invalid_token", param,
                              "'%s' holds %s: token ids are integers in [0, %u)", param,
                              cJSON_IsNumber(t) ? "an id out of range" : "a non-number",
                              lim->vocab_size ? lim->vocab_size : 2147483647u);
        in->ids[k++] = (int32_t)v;
    }
    in->n_ids = k;
    return true;
}

static bool take_text(rtr_oai_error_t *err, const cJSON *s, const rtr_emb_limits_t *lim,
                      const char *param, rtr_emb_input_t *in, bool *oom)
{
    size_t n = strlen(s->valuestring);
    if (n == 0) /* OpenAI refuses it too: an empty string has no embedding */
        return rtr_fd_bad(err, NULL, param, "'%s' must not be an empty string", param);
    if (n > lim->max_input_bytes)
        return rtr_fd_bad(err, "input_too_large", param, "'%s' is %zu bytes; the limit is %zu",
                          param, n, lim->max_input_bytes);
    in->text = malloc(n + 1);
    if (in->text == NULL) {
        *oom = true;
        return false;
    }
    memcpy(in->text, s->valuestring, n + 1);
    in->text_len = n;
    return true;
}

/* input: "s" | ["s", ...] | [1, 2, ...] | [[1, 2], ...] */
static bool take_input(rtr_oai_error_t *err, const cJSON *v, const rtr_emb_limits_t *lim,
                       rtr_emb_req_t *req, bool *oom)
{
    if (v == NULL || cJSON_IsNull(v))
        return rtr_fd_bad(err, NULL, "input", "'input' is required");
    bool flat_ids = cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0 &&
                    cJSON_IsNumber(cJSON_GetArrayItem(v, 0));
    uint32_t n = cJSON_IsString(v) || flat_ids ? 1u
                 : cJSON_IsArray(v)            ? (uint32_t)cJSON_GetArraySize(v)
                                               : 0u;
    if (!cJSON_IsString(v) && !cJSON_IsArray(v))
        return rtr_fd_bad(err, NULL, "input",
                          "'input' must be a string, an array of strings, an array of token "
                          "ids or an array of token-id arrays");
    if (n == 0)
        return rtr_fd_bad(err, NULL, "input", "'input' must not be an empty array");
    if (n > lim->max_inputs)
        return rtr_fd_bad(err, "too_many_inputs", "input",
                          "'input' has %u items; at most %u per request", n, lim->max_inputs);
    req->inputs = calloc(n, sizeof(*req->inputs));
    if (req->inputs == NULL) {
        *oom = true;
        return false;
    }
    req->n_inputs = n;
    if (cJSON_IsString(v))
        return take_text(err, v, lim, "input", &req->inputs[0], oom);
    if (flat_ids)
        return take_ids(err, v, lim, "input", &req->inputs[0], oom);
    const cJSON *it;
    uint32_t i = 0;
    bool strings = cJSON_IsString(cJSON_GetArrayItem(v, 0));
    cJSON_ArrayForEach(it, v) {
        char p[32];
        snprintf(p, sizeof(p), "input[%u]", i);
        if (strings && cJSON_IsString(it)) {
            if (!take_text(err, it, lim, p, &req->inputs[i], oom))
                return false;
        } else if (!strings && cJSON_IsArray(it)) {
            if (!take_ids(err, it, lim, p, &req->inputs[i], oom))
                return false;
        } else {
            return rtr_fd_bad(err, NULL, p, "'%s' must be %s like input[0]", p,
                              strings ? "a string" : "an array of token ids");
        }
        i++;
    }
    return true;
}

pd_status_t rtr_emb_parse(const char *body, size_t len, const rtr_emb_limits_t *lim,
                          rtr_emb_req_t *req, rtr_oai_error_t *err)
{
    static const char *const keys[] = { "model", "input", "encoding_format", "dimensions",
                                        "user", NULL };
    memset(req, 0, sizeof(*req));
    cJSON *root = NULL;
    pd_status_t s = rtr_oai_json_load(body, len, &root, err);
    if (s != PD_OK)
        return s;
    bool oom = false, ok = rtr_fd_keys(err, root, keys, "");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (ok && m != NULL && !cJSON_IsNull(m)) {
        if (!cJSON_IsString(m) || strlen(m->valuestring) >= sizeof(req->model))
            ok = rtr_fd_bad(err, NULL, "model", "'model' must be a string of at most %zu bytes",
                            sizeof(req->model) - 1);
        else
            snprintf(req->model, sizeof(req->model), "%s", m->valuestring);
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "encoding_format");
    if (ok && f != NULL && !cJSON_IsNull(f)) {
        if (cJSON_IsString(f) && strcmp(f->valuestring, "base64") == 0)
            req->base64 = true;
        else if (!cJSON_IsString(f) || strcmp(f->valuestring, "float") != 0)
            ok = rtr_fd_bad(err, NULL, "encoding_format",
                            "'encoding_format' must be \"float\" or \"base64\"");
    }
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "dimensions");
    if (ok && d != NULL && !cJSON_IsNull(d)) {
        double v = cJSON_IsNumber(d) ? d->valuedouble : 0;
        if (!cJSON_IsNumber(d) || v < 1 || v != floor(v) || v > 65536)
            ok = rtr_fd_bad(err, NULL, "dimensions", "'dimensions' must be an integer >= 1");
        else
            req->dimensions = (uint32_t)v;
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (ok && u != NULL && !cJSON_IsNull(u) && !cJSON_IsString(u))
        ok = rtr_fd_bad(err, NULL, "user", "'user' must be a string");
    ok = ok && take_input(err, cJSON_GetObjectItemCaseSensitive(root, "input"), lim, req, &oom);
    cJSON_Delete(root);
    if (ok)
        return PD_OK;
    rtr_emb_req_free(req);
    if (oom)
        return PD_ERR_NO_MEMORY;
    return err->code != NULL && strcmp(err->code, "input_too_large") == 0
               ? (err->http_status = 413, PD_ERR_TOO_BIG)
               : PD_ERR_BAD_INPUT;
}

pd_status_t rtr_emb_check_len(const rtr_emb_req_t *req, uint32_t i, uint32_t n,
                              uint32_t max_tokens, rtr_oai_error_t *err)
{
    char p[32];
    snprintf(p, sizeof(p), req->n_inputs == 1 ? "input" : "input[%u]", i);
    if (n == 0)
        return rtr_fd_bad(err, NULL, p, "'%s' has no tokens", p), PD_ERR_BAD_INPUT;
    if (n > max_tokens) {
        rtr_fd_bad(err, "context_length_exceeded", p,
                   "'%s' has %u tokens; this model's maximum context length is %u tokens", p,
                   n, max_tokens);
        return PD_ERR_BAD_INPUT;
    }
    return PD_OK;
}

char *rtr_emb_render(const rtr_emb_req_t *req, const float *vecs, uint32_t n_embd,
                     const char *model, uint64_t prompt_tokens, rtr_oai_error_t *err)
{
    uint32_t dim = req->dimensions ? req->dimensions : n_embd;
    if (dim > n_embd) {
        rtr_fd_bad(err, NULL, "dimensions",
                   "'dimensions' is %u; this model's embeddings have %u (a smaller value "
                   "truncates and renormalises)", dim, n_embd);
        return NULL;
    }
    float *v = malloc((size_t)dim * sizeof(float));
    char *b64 = req->base64 ? malloc(((size_t)dim * 4 + 2) / 3 * 4 + 1) : NULL;
    cJSON *root = cJSON_CreateObject();
    cJSON *data = root != NULL ? cJSON_AddArrayToObject(root, "data") : NULL;
    bool ok = v != NULL && data != NULL && (!req->base64 || b64 != NULL) &&
              cJSON_AddStringToObject(root, "object", "list") != NULL;
    for (uint32_t i = 0; ok && i < req->n_inputs; i++) {
        memcpy(v, vecs + (size_t)i * n_embd, (size_t)dim * sizeof(float));
        if (dim < n_embd) { /* truncated: unit length again */
            double ss = 0;
            for (uint32_t j = 0; j < dim; j++)
                ss += (double)v[j] * v[j];
            if (ss > 0)
                for (uint32_t j = 0; j < dim; j++)
                    v[j] = (float)(v[j] / sqrt(ss));
        }
        cJSON *o = cJSON_CreateObject();
        ok = o != NULL && cJSON_AddItemToArray(data, o) &&
             cJSON_AddStringToObject(o, "object", "embedding") != NULL &&
             cJSON_AddNumberToObject(o, "index", i) != NULL;
        if (ok && req->base64) { /* little-endian f32 bytes, as OpenAI's */
            uint8_t *le = (uint8_t *)v;
            for (uint32_t j = 0; j < dim; j++) {
                uint32_t w;
                memcpy(&w, &v[j], 4);
                le[4 * j] = (uint8_t)w;
                le[4 * j + 1] = (uint8_t)(w >> 8);
                le[4 * j + 2] = (uint8_t)(w >> 16);
                le[4 * j + 3] = (uint8_t)(w >> 24);
            }
            size_t bn = pd_b64_encode(le, (size_t)dim * 4, b64);
            b64[bn] = '\0';
            ok = cJSON_AddStringToObject(o, "embedding", b64) != NULL;
        } else if (ok) {
            cJSON *a = cJSON_AddArrayToObject(o, "embedding");
            for (uint32_t j = 0; ok && j < dim; j++) {
                char num[32]; /* shortest text that reads back as the same float */
                snprintf(num, sizeof(num), "%.9g", (double)v[j]);
                cJSON *x = cJSON_CreateRaw(num);
                ok = a != NULL && x != NULL && cJSON_AddItemToArray(a, x);
            }
            ok = ok && a != NULL;
        }
    }
    cJSON *usage = ok ? cJSON_AddObjectToObject(root, "usage") : NULL;
    ok = ok && cJSON_AddStringToObject(root, "model", model) != NULL && usage != NULL &&
         cJSON_AddNumberToObject(usage, "prompt_tokens", (double)prompt_tokens) != NULL &&
         cJSON_AddNumberToObject(usage, "total_tokens", (double)prompt_tokens) != NULL;
    char *out = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    free(v);
    free(b64);
    if (out == NULL)
        rtr_oai_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    return out;
}
