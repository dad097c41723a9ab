/* pb_work.h - pure parts of pd-bench's workloads: the synthetic token
 * stream (common words, about one BPE token each, or token ids from a
 * range), prompts built from it with a hard length cap, deterministic
 * blocks per hash id (so prompts share prefixes exactly where a trace's
 * hash ids do), and the JSONL trace loader (Mooncake's published format:
 * {"timestamp": ms, "input_length": N, "output_length": M,
 *  "hash_ids": [..]}). No sockets; the trace loader reads one file.
 * Every length read from a file is capped. */
#ifndef PB_WORK_H
#define PB_WORK_H

#include "pb_stats.h"
#include "pd_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PB_PROMPT_TOKENS_MAX  262144u    /* any one prompt, in tokens */
#define PB_TRACE_LINE_MAX     (1u << 20) /* bytes of one trace line */
#define PB_TRACE_MAX_LINES    100000u
#define PB_TRACE_FILE_MAX     (256u << 20)
#define PB_TRACE_IN_MAX       131072u    /* input_length */
#define PB_TRACE_OUT_MAX      65536u     /* output_length */
#define PB_TRACE_TS_MAX_MS    (86400.0 * 1000.0 * 7)
#define PB_BLOCK_SIZE_MAX     65536u

extern const char *const pb_words[];
extern const size_t pb_n_words;

/* A prompt under construction: words joined by spaces, or token ids. */
typedef struct {
    bool ids;                   /* token ids in [id_lo, id_hi] */
    uint32_t id_lo, id_hi;
    uint32_t n_tokens;
    char *text;                 /* words mode; NUL-terminated, owned */
    size_t len, cap;
    uint32_t *id;               /* ids mode; owned */
    uint32_t id_cap;
} pb_prompt_buf_t;

void pb_prompt_buf_init(pb_prompt_buf_t *b, bool ids, uint32_t id_lo, uint32_t id_hi);
void pb_prompt_buf_fini(pb_prompt_buf_t *b);
/* Append n tokens drawn from rng. PD_ERR_TOO_BIG past PB_PROMPT_TOKENS_MAX,
 * PD_ERR_NO_MEMORY. */
pd_status_t pb_prompt_add(pb_prompt_buf_t *b, pb_rng_t *rng, uint32_t n);
/* The generator of hash block `hash` (same seed + hash -> same tokens). */
void pb_block_rng(pb_rng_t *rng, uint64_t seed, uint64_t hash);

typedef struct {
    uint64_t at_ns;             /* arrival, relative to the first entry */
    uint32_t input_len, output_len;
    uint32_t n_hash;
    uint64_t *hash_ids;         /* owned */
} pb_trace_entry_t;

typedef struct {
    pb_trace_entry_t *e;
    size_t n;
} pb_trace_t;

/* One trace line (JSON object, len bytes, need not be NUL-terminated).
 * Checks types and caps; len(hash_ids) <= ceil(input_length / block).
 * On error writes a reason into err. */
pd_status_t pb_trace_parse_line(const char *line, size_t len, uint32_t block_size,
                                pb_trace_entry_t *e, char *err, size_t err_len);
/* Load a whole trace (blank lines skipped; timestamps non-decreasing,
 * made relative to the first; divided by speed). On error writes
 * "FILE:LINE: reason" into err. */
pd_status_t pb_trace_load(const char *path, uint32_t block_size, double speed,
                          pb_trace_t *t, char *err, size_t err_len);
void pb_trace_free(pb_trace_t *t);

/* The prompt of a trace entry: block i (< n_hash) is hash block
 * hash_ids[i] of block_size tokens, the rest (beyond the hash ids) tokens
 * unique to `uniq`; exactly input_len tokens. */
pd_status_t pb_prompt_from_trace(pb_prompt_buf_t *b, const pb_trace_entry_t *e,
                                 uint32_t block_size, uint64_t seed, uint64_t uniq);

#endif
