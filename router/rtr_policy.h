/* rtr_policy.h - pure functions that choose daemons for a request: which
 * backends are eligible, what load each carries, and the pickers that score
 * them (rtr_policy_choose is the entry). Inputs are the router's view of each
 * backend (registration, state, heartbeats); no I/O, no globals (round-robin
 * state is passed in), so every choice is unit-tested. */
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
    RTR_DISAGG_THRESHOLD = 0, /* disaggregate when the decode lacks >= threshold tokens */
    RTR_DISAGG_ALWAYS    = 1, /* always prefill on a prefill daemon (if one is up) */
    RTR_DISAGG_NEVER     = 2, /* always prefill on the decode daemon (PD-mixed) */
    RTR_DISAGG_COST      = 3, /* by measured cost, threshold until measured */
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

/* What the disaggregation decision looks at. The *_ns rates are the
 * router's running averages of what daemons report (0 = not measured yet):
 * prefill_ns / computed tokens from PREFILL_DONE, a decode-local request's
 * prefill_ns / computed tokens and a pull's transfer_ns / pulled tokens from
 * FINISH, and the control-plane hop (router-seen prefill time minus the
 * prefill's own queue + compute time). */
typedef struct {
    uint32_t prompt_tokens;
    uint32_t decode_cached;        /* the chosen decode's cached prefix */
    uint32_t prefill_cached;       /* the chosen prefill's (if any) */
    uint32_t decode_running;       /* sequences in the chosen decode's batch */
    uint64_t prefill_outstanding;  /* tokens queued + running on the chosen prefill */
    double pf_tok_ns, dec_tok_ns, pull_tok_ns, hop_ns;
} rtr_disagg_in_t;

typedef struct {
    uint32_t uncached;             /* tokens the decode would have to compute */
    bool measured;                 /* the cost mode had every rate */
    double local_ns, disagg_ns;    /* the estimates (cost mode, measured) */
} rtr_disagg_why_t;

/* Whether a request is prefilled on a prefill daemon (true) or locally on
 * its decode daemon (false); `prefill` says whether a prefill was chosen.
 * Every mode looks at the tokens the chosen decode does not hold
 * (uncached = prompt - min(decode_cached, prompt - 1): turn k+1 of a chat
 * on the decode that ran turn k needs only the new message), like
 * Dynamo's conditional disaggregation.
 *   threshold: uncached >= threshold.
 *   cost: the cheaper of
 *     local  = uncached * dec_tok_ns * (1 + decode_running)
 *              (its own prefill, and the same delay to every stream in
 *              the decode's batch while it runs)
 *     disagg = (prefill_outstanding + prompt - min(prefill_cached, prompt - 1))
 *              * pf_tok_ns + uncached * pull_tok_ns + hop_ns
 *              (the prefill's queue and work, the pull of only the blocks
 *              the decode lacks, the extra control-plane hop);
 *     dec_tok_ns is pf_tok_ns until a decode-local prefill is measured
 *     (the same model: else the decode would never be tried); threshold
 *     until pf_tok_ns and pull_tok_ns are measured.
 * *why (may be NULL) gets the figures for logs and tests. */
bool rtr_should_disaggregate(rtr_disagg_mode_t mode, const rtr_disagg_in_t *in,
                             uint32_t threshold, bool prefill, rtr_disagg_why_t *why);

/* A stream on a draining decode stays there (true) rather than moving live
 * when its tokens left (max_tokens - generated: a bound, a stop may come
 * sooner) at its measured step take no longer than the move would stall
 * it: kv_tokens * move_tok_ns, the router's measure of earlier moves
 * (MIGRATE to the next token, per KV token), or until a move is measured
 * the model kv_tokens * pull_tok_ns + 2 * hop_ns (its KV pulled by the
 * target, and two control-plane round trips: MIGRATE -> MIGRATE_DONE,
 * DECODE_REQ -> the pull). Then the stream ends sooner than moved, the
 * draining decode is empty no later (it holds the exported KV until the
 * target's pull ends), and the target pulls nothing. Nothing measured yet
 * (no step, or neither rate): it moves. */
bool rtr_finish_in_place(uint32_t tokens_left, double step_ns, uint32_t kv_tokens,
                         double move_tok_ns, double pull_tok_ns, double hop_ns);

/* ---- the router's backend choice -------------------------------------- */

#define RTR_POLICY_MAX_BACKENDS 64   /* = RTR_MAX_BACKENDS (rtr_int.h) */

/* One backend slot as the router knows it (rtr_int.h rtr_backend_t: its
 * registration, state and last heartbeat); an unused slot is !up. */
typedef struct {
    bool up;                             /* registered and connected */
    bool ready;                          /* state ready (not down, drain or maint) */
    bool draining;                       /* its heartbeat says it drains */
    uint32_t caps;                       /* PROTO_CAP_* it registered with */
    uint64_t outstanding_prefill_tokens; /* last heartbeat */
    uint32_t free_blocks;                /* last heartbeat */
    uint32_t running_seqs;               /* last heartbeat */
    uint32_t assigned;                   /* router requests using it now */
} rtr_backend_view_t;

typedef enum {
    RTR_CHOOSE_PREFILL = 0,       /* rtr_pick_prefill(_kv), cursor rr->prefill */
    RTR_CHOOSE_DECODE,            /* rtr_pick_decode(_kv), cursor rr->decode */
    RTR_CHOOSE_PREFIX_SOURCE,     /* rtr_pick_prefix_source */
    RTR_CHOOSE_ANY,               /* the first eligible: is there one? */
} rtr_choose_t;

typedef struct {
    uint32_t prefill, decode;     /* round-robin cursors */
} rtr_rr_t;

typedef struct {
    rtr_choose_t what;
    uint32_t caps;                /* the backend must have every one of these */
    int exclude;                  /* a slot never chosen; -1: none */
    uint32_t needed_blocks;       /* DECODE: KV blocks the request needs */
    const uint32_t *cached_tokens; /* (n) what each slot holds of the prompt per
                                     the KV index; NULL: not KV-aware */
    uint32_t prompt_tokens;
    uint32_t prefill_cached;      /* PREFIX_SOURCE: the prefill's share */
    uint32_t min_gain_tokens;     /* PREFIX_SOURCE */
    int prefer;                   /* PREFIX_SOURCE: the chosen decode, or -1 */
    const uint32_t *free_blocks;  /* (n) each slot's free blocks as the caller
                                     knows them; NULL: the heartbeats' */
    const uint64_t *outstanding;  /* (n) each slot's outstanding prefill
                                     tokens as the caller knows them; NULL:
                                     the heartbeats' */
} rtr_choice_t;

/* The router's one backend choice over n (<= RTR_POLICY_MAX_BACKENDS)
 * slots. Eligible: up, ready, not draining, every cap of c->caps, not
 * c->exclude. Load: the heartbeat's, with the router's requests on it
 * counted as running (assigned); free blocks c->free_blocks (the router's
 * decode picks pass the room it knows: the heartbeat's less what it handed
 * out since) and outstanding prefill tokens c->outstanding (its prefill
 * picks: the heartbeat's plus the prompts sent since), or the heartbeat's
 * when NULL. Then c->what's picker
 * (cached_tokens NULL: the non-KV one). Returns a slot or -1 if none is
 * eligible (PREFIX_SOURCE: or none gains enough). rr may be NULL for
 * PREFIX_SOURCE and ANY. */
int rtr_policy_choose(const rtr_backend_view_t *v, size_t n, const rtr_choice_t *c,
                      rtr_rr_t *rr);

#endif
