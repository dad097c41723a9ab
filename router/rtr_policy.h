/* rtr_policy.h - pure functions that choose daemons for a request.
 * Inputs are the load figures daemons report in heartbeats; no I/O, no
 * globals (round-robin state is passed in), so every choice is unit-tested. */
#ifndef RTR_POLICY_H
#define RTR_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    bool eligible;                       /* registered, heartbeating, state ready */
    uint64_t outstanding_prefill_tokens; /* prefill: tokens queued + running */
    uint32_t free_blocks;                /* decode: free KV blocks */
    uint32_t running_seqs;               /* decode: sequences in the batch */
} rtr_backend_load_t;

typedef enum {
    RTR_DISAGG_THRESHOLD = 0, /* disaggregate prompts >= threshold tokens */
    RTR_DISAGG_ALWAYS    = 1, /* always prefill on a prefill daemon (if one is up) */
    RTR_DISAGG_NEVER     = 2, /* always prefill on the decode daemon (PD-mixed) */
} rtr_disagg_mode_t;

/* Prefill choice: least outstanding prefill tokens; ties broken round robin
 * starting after *rr_cursor (updated). Returns an index or -1 if none is
 * eligible. */
int rtr_pick_prefill(const rtr_backend_load_t *backends, size_t n, uint32_t *rr_cursor);

/* KV-aware prefill choice: the daemon that finishes this prompt first,
 * estimated in tokens of work = its outstanding prefill tokens + the part of
 * this prompt it does not hold in its prefix cache:
 *   cost(k) = outstanding_prefill_tokens(k) + prompt_tokens - min(cached_tokens[k], prompt_tokens - 1)
 * (the last prompt token is always computed). With no cache anywhere it is
 * rtr_pick_prefill. Ties: the larger overlap (keeps a prefix on one daemon),
 * then round robin after *rr_cursor (updated). cached_tokens[k] is what the
 * router's index says daemon k holds of this prompt's prefix (full blocks).
 * Returns an index or -1 if none is eligible. */
int rtr_pick_prefill_kv(const rtr_backend_load_t *backends, const uint32_t *cached_tokens,
                        size_t n, uint32_t prompt_tokens, uint32_t *rr_cursor);

/* Decode choice: among eligible daemons with at least `needed_blocks` free,
 * the most free blocks, then the fewest running sequences, then round robin.
 * If none has room, the one with the most free blocks (it queues or pushes
 * back). Returns an index or -1 if none is eligible. */
int rtr_pick_decode(const rtr_backend_load_t *backends, size_t n, uint32_t needed_blocks,
                    uint32_t *rr_cursor);

/* KV-aware decode choice. A decode keeps finished conversations in its
 * prefix cache, so turn k+1 of a chat is cheapest where turn k ran: less
 * to prefill (decode-local) or to pull (only missing blocks). Among the
 * eligible decodes with room for needed_blocks, those holding part of this
 * prompt (cached_tokens[k] > 0) and running at most
 * RTR_DECODE_AFFINITY_SLACK more sequences than the least busy decode with
 * room are preferred: the most cached tokens, then rtr_pick_decode's order.
 * Otherwise (no holder, or every holder busier / full) rtr_pick_decode. The
 * slack is small on purpose: the saving is one prompt's KV, the cost of a
 * busier batch is paid by every token of every sequence in it, and under
 * repeated prompts a holder must not starve a new, idle decode (the other
 * one becomes a holder too after its first request).
 * Returns an index or -1 if none is eligible. */
#define RTR_DECODE_AFFINITY_SLACK 1u
int rtr_pick_decode_kv(const rtr_backend_load_t *backends, const uint32_t *cached_tokens,
                       size_t n, uint32_t needed_blocks, uint32_t *rr_cursor);

/* The prefill pulls a decode's cached prefix ("the KV pool is one
 * cache"): turn k+1 of a conversation was routed to a prefill (a long new
 * message) but turn k's prompt + answer is cached only on the decode that
 * generated it. Returns the decode that should export its cached prefix to
 * the prefill first, or -1 (plain PREFILL_REQ). Candidates: eligible
 * entries of decodes[] (the caller marks the decodes that may export);
 * held(k) = min(cached_tokens[k], prompt_tokens - 1) (the last token is
 * always computed); a candidate qualifies when held(k) >= prefill_cached +
 * min_gain_tokens (min_gain_tokens 0 = off: -1). The longest hold wins;
 * ties go to `prefer` (the chosen decode: it then pulls back only the new
 * blocks), then the fewest running sequences, then the lowest index. */
int rtr_pick_prefix_source(const rtr_backend_load_t *decodes, const uint32_t *cached_tokens,
                           size_t n, uint32_t prompt_tokens, uint32_t prefill_cached,
                           uint32_t min_gain_tokens, int prefer);

/* Whether a request is prefilled on a prefill daemon (true) or locally on
 * its decode daemon (false). */
bool rtr_should_disaggregate(rtr_disagg_mode_t mode, uint32_t prompt_tokens,
                             uint32_t threshold, bool prefill_available);

#endif
