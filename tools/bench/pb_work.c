/* pb_work.c - see pb_work.h. */
#include "pb_work.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const pb_words[] = {
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "are", "with",
    "as", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word",
    "but", "not", "what", "all", "were", "we", "when", "your", "can", "said",
    "there", "use", "an", "each", "which", "she", "do", "how", "their", "if",
    "will", "up", "other", "about", "out", "many", "then", "them", "these",
    "so", "some", "her", "would", "make", "like", "him", "into", "time", "has",
    "look", "two", "more", "write", "go", "see", "number", "no", "way",
    "could", "people", "my", "than", "first", "water", "been", "call", "who",
    "oil", "its", "now", "find", "long", "down", "day", "did", "get", "come",
    "made", "may", "part",
};
const size_t pb_n_words = sizeof(pb_words) / sizeof(pb_words[0]);

void pb_prompt_buf_init(pb_prompt_buf_t *b, bool ids, uint32_t id_lo, uint32_t id_hi)
{
    memset(b, 0, sizeof(*b));
    b->ids = ids;
    b->id_lo = id_lo;
    b->id_hi = id_hi;
}

void pb_prompt_buf_fini(pb_prompt_buf_t *b)
{
    free(b->text);
    free(b->id);
    memset(b, 0, sizeof(*b));
}

pd_status_t pb_prompt_add(pb_prompt_buf_t *b, pb_rng_t *rng, uint32_t n)
{
    uint32_t i;

    if (n > PB_PROMPT_TOKENS_MAX - b->n_tokens)
        return PD_ERR_TOO_BIG;
    if (b->ids) {
        uint64_t span = (uint64_t)b->id_hi - b->id_lo + 1;

        if (b->n_tokens + n > b->id_cap) {
            uint32_t cap = b->id_cap ? b->id_cap : 256;
            uint32_t *nid;

            while (cap < b->n_tokens + n)
                cap *= 2;
            nid = realloc(b->id, (size_t)cap * sizeof(*nid));
            if (nid == NULL)
                return PD_ERR_NO_MEMORY;
            b->id = nid;
            b->id_cap = cap;
        }
        for (i = 0; i < n; i++)
            b->id[b->n_tokens++] = b->id_lo + (uint32_t)(pb_rng_next(rng) % span);
        return PD_OK;
    }
    /* Longest word is 6 bytes, + 1 separator. */
    if (b->len + (size_t)n * 7 + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        char *nt;

        while (cap < b->len + (size_t)n * 7 + 1)
            cap *= 2;
        nt = realloc(b->text, cap);
        if (nt == NULL)
            return PD_ERR_NO_MEMORY;
        b->text = nt;
        b->cap = cap;
    }
    for (i = 0; i < n; i++) {
        const char *w = pb_words[pb_rng_next(rng) % pb_n_words];
        size_t wl = strlen(w);

        if (b->n_tokens > 0)
            b->text[b->len++] = ' ';
        memcpy(b->text + b->len, w, wl);
        b->len += wl;
        b->n_tokens++;
    }
    b->text[b->len] = '\0';
    return PD_OK;
}

void pb_block_rng(pb_rng_t *rng, uint64_t seed, uint64_t hash)
{
    pb_rng_t mix;

    pb_rng_seed(&mix, seed);
    pb_rng_seed(rng, pb_rng_next(&mix) ^ (hash * 0xd6e8feb86659fd93ULL));
}

static bool json_uint(const cJSON *v, double max, double *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > max ||
        floor(v->valuedouble) != v->valuedouble)
        return false;
    *out = v->valuedouble;
    return true;
}

pd_status_t pb_trace_parse_line(const char *line, size_t len, uint32_t block_size,
                                pb_trace_entry_t *e, char *err, size_t err_len)
{
    cJSON *j = NULL;
    const cJSON *ts, *in, *out, *h, *it;
    double v_ts, v_in, v_out, v;
    uint32_t max_hash, i = 0;
    pd_status_t status = PD_ERR_BAD_INPUT;

    memset(e, 0, sizeof(*e));
    if (len > PB_TRACE_LINE_MAX) {
        snprintf(err, err_len, "line longer than %u bytes", PB_TRACE_LINE_MAX);
        return PD_ERR_TOO_BIG;
    }
    if (block_size == 0 || block_size > PB_BLOCK_SIZE_MAX) {
        snprintf(err, err_len, "block size must be 1..%u", PB_BLOCK_SIZE_MAX);
        return PD_ERR_BAD_INPUT;
    }
    j = cJSON_ParseWithLength(line, len);
    if (!cJSON_IsObject(j)) {
        snprintf(err, err_len, "not a JSON object");
        goto out;
    }
    ts = cJSON_GetObjectItemCaseSensitive(j, "timestamp");
    in = cJSON_GetObjectItemCaseSensitive(j, "input_length");
    out = cJSON_GetObjectItemCaseSensitive(j, "output_length");
    h = cJSON_GetObjectItemCaseSensitive(j, "hash_ids");
    if (!cJSON_IsNumber(ts) || !(ts->valuedouble >= 0) ||
        ts->valuedouble > PB_TRACE_TS_MAX_MS) {
        snprintf(err, err_len, "\"timestamp\" must be a number of ms in [0, %.0f]",
                 PB_TRACE_TS_MAX_MS);
        goto out;
    }
    v_ts = ts->valuedouble;
    if (!json_uint(in, PB_TRACE_IN_MAX, &v_in) || v_in < 1) {
        snprintf(err, err_len, "\"input_length\" must be an integer in [1, %u]",
                 PB_TRACE_IN_MAX);
        goto out;
    }
    if (!json_uint(out, PB_TRACE_OUT_MAX, &v_out) || v_out < 1) {
        snprintf(err, err_len, "\"output_length\" must be an integer in [1, %u]",
                 PB_TRACE_OUT_MAX);
        goto out;
    }
    max_hash = ((uint32_t)v_in + block_size - 1) / block_size;
    if (h != NULL && !cJSON_IsArray(h)) {
        snprintf(err, err_len, "\"hash_ids\" must be an array");
        goto out;
    }
    if (h != NULL && (uint32_t)cJSON_GetArraySize(h) > max_hash) {
        snprintf(err, err_len, "%d hash_ids for %u input tokens exceed "
                 "ceil(input_length / block size %u) = %u (wrong --block-size?)",
                 cJSON_GetArraySize(h), (uint32_t)v_in, block_size, max_hash);
        goto out;
    }
    e->at_ns = (uint64_t)(v_ts * 1e6);
    e->input_len = (uint32_t)v_in;
    e->output_len = (uint32_t)v_out;
    if (h != NULL && cJSON_GetArraySize(h) > 0) {
        e->hash_ids = malloc((size_t)cJSON_GetArraySize(h) * sizeof(*e->hash_ids));
        if (e->hash_ids == NULL) {
            snprintf(err, err_len, "out of memory");
            status = PD_ERR_NO_MEMORY;
            goto out;
        }
        cJSON_ArrayForEach(it, h) {
            if (!json_uint(it, 9007199254740992.0, &v)) {
                snprintf(err, err_len, "hash_ids[%u] must be a non-negative integer", i);
                free(e->hash_ids);
                e->hash_ids = NULL;
                goto out;
            }
            e->hash_ids[i++] = (uint64_t)v;
        }
        e->n_hash = i;
    }
    status = PD_OK;
out:
    cJSON_Delete(j);
    return status;
}

pd_status_t pb_trace_load(const char *path, uint32_t block_size, double speed,
                          pb_trace_t *t, char *err, size_t err_len)
{
    FILE *f = fopen(path, "r");
    char *line = NULL, why[256];
    size_t lcap = 0, total = 0;
    ssize_t n;
    unsigned lineno = 0;
    uint64_t first = 0, prev = 0;
    pd_status_t status = PD_ERR_BAD_INPUT;

    memset(t, 0, sizeof(*t));
    if (f == NULL) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return PD_ERR_IO;
    }
    if (!(speed > 0)) {
        snprintf(err, err_len, "speed must be > 0");
        goto out;
    }
    while ((n = getline(&line, &lcap, f)) >= 0) {
        pb_trace_entry_t e, *ne;

        lineno++;
        total += (size_t)n;
        if (total > PB_TRACE_FILE_MAX || t->n >= PB_TRACE_MAX_LINES) {
            snprintf(err, err_len, "%s: more than %u lines or %u bytes", path,
                     PB_TRACE_MAX_LINES, PB_TRACE_FILE_MAX);
            status = PD_ERR_TOO_BIG;
            goto out;
        }
        if (strspn(line, " \t\r\n") == (size_t)n)
            continue;
        status = pb_trace_parse_line(line, (size_t)n, block_size, &e, why, sizeof(why));
        if (status != PD_OK) {
            snprintf(err, err_len, "%s:%u: %s", path, lineno, why);
            goto out;
        }
        if (t->n == 0)
            first = prev = e.at_ns;
        if (e.at_ns < prev) {
            snprintf(err, err_len, "%s:%u: timestamps must not decrease", path, lineno);
            free(e.hash_ids);
            status = PD_ERR_BAD_INPUT;
            goto out;
        }
        prev = e.at_ns;
        e.at_ns = (uint64_t)((double)(e.at_ns - first) / speed);
        ne = realloc(t->e, (t->n + 1) * sizeof(*ne));
        if (ne == NULL) {
            free(e.hash_ids);
            snprintf(err, err_len, "out of memory");
            status = PD_ERR_NO_MEMORY;
            goto out;
        }
        t->e = ne;
        t->e[t->n++] = e;
    }
    if (ferror(f)) {
        snprintf(err, err_len, "%s: read error", path);
        status = PD_ERR_IO;
        goto out;
    }
    if (t->n == 0) {
        snprintf(err, err_len, "%s: no entries", path);
        status = PD_ERR_BAD_INPUT;
        goto out;
    }
    status = PD_OK;
out:
    free(line);
    fclose(f);
    if (status != PD_OK)
        pb_trace_free(t);
    return status;
}

void pb_trace_free(pb_trace_t *t)
{
    size_t i;

    for (i = 0; i < t->n; i++)
        free(t->e[i].hash_ids);
    free(t->e);
    memset(t, 0, sizeof(*t));
}

pd_status_t pb_prompt_from_trace(pb_prompt_buf_t *b, const pb_trace_entry_t *e,
                                 uint32_t block_size, uint64_t seed, uint64_t uniq)
{
    uint32_t done = 0, blk = 0;
    pb_rng_t rng;
    pd_status_t status;

    while (done < e->input_len) {
        uint32_t n = e->input_len - done;

        if (n > block_size)
            n = block_size;
        if (blk < e->n_hash)
            pb_block_rng(&rng, seed, e->hash_ids[blk]);
        else
            pb_block_rng(&rng, seed ^ 0x5bd1e9955bd1e995ULL,
                         uniq * 0x100000001b3ULL + blk);
        status = pb_prompt_add(b, &rng, n);
        if (status != PD_OK)
            return status;
        done += n;
        blk++;
    }
    return PD_OK;
}
