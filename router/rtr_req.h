/* rtr_req.h - the pure parts of one router request: its state machine
 * (one enum, one transition table, one setter that stamps times), SSE
 * framing, request-id validation and the token -> text pipeline
 * (streaming detokenizer + stop strings). No I/O, no logging, no libevent:
 * unit tests drive these directly; rtr_http.c owns the rest of the request.
 *
 * States (spec "One request, disaggregated"):
 *   RECEIVED -> ROUTED -> PREFILLING -> DECODING -> COMPLETED
 *                   \______________/ \   ^    \-> FAILED | CANCELED
 *   ROUTED -> EXPORTING -> PREFILLING  (a decode exports its cached prefix
 *                        of the prompt to the prefill first; refused,
 *                        timed out or lost: plain PREFILL_REQ)
 *   EXPORTING -> ROUTED   (the prefill went away meanwhile: decode-local)
 *   PREFILLING -> ROUTED  (retry: prefill failed, go decode-local)
 *   DECODING   -> ROUTED  (retry: KV pull failed / decode refused)
 * Every non-terminal state may go to FAILED or CANCELED. Terminal states
 * have no way out: each accepted request ends exactly once. */
#ifndef RTR_REQ_H
#define RTR_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "pd_status.h"
#include "eng_tok.h"

/* X(NAME, name, terminal) */
#define RTR_REQ_STATES(X)                 \
    X(RECEIVED,   "received",   false)    \
    X(ROUTED,     "routed",     false)    \
    X(EXPORTING,  "exporting",  false)    \
    X(PREFILLING, "prefilling", false)    \
    X(DECODING,   "decoding",   false)    \
    X(COMPLETED,  "completed",  true)     \
    X(FAILED,     "failed",     true)     \
    X(CANCELED,   "canceled",   true)

typedef enum {
#define RTR_REQ_X_ENUM(NAME, name, term) RTR_REQ_##NAME,
    RTR_REQ_STATES(RTR_REQ_X_ENUM)
#undef RTR_REQ_X_ENUM
    RTR_REQ__COUNT
} rtr_req_state_t;

/* Per-request state record: the state plus the time each state was entered
 * (0 = never). Embedded in the daemon's request struct. */
typedef struct {
    rtr_req_state_t state;
    uint64_t enter_ns[RTR_REQ__COUNT];   /* last entry time per state */
    uint32_t transitions;
} rtr_req_fsm_t;

const char *rtr_req_state_name(rtr_req_state_t s);
bool rtr_req_state_terminal(rtr_req_state_t s);
/* Whether from -> to is a legal transition (see the header comment). */
bool rtr_req_transition_legal(rtr_req_state_t from, rtr_req_state_t to);
/* Start in RECEIVED at now_ns. */
void rtr_req_fsm_init(rtr_req_fsm_t *f, uint64_t now_ns);
/* The ONE setter: asserts legality (debug builds), returns PD_ERR_BAD_INPUT
 * without changing anything for an illegal transition (release builds),
 * else stamps now_ns and returns PD_OK. */
pd_status_t rtr_req_fsm_set(rtr_req_fsm_t *f, rtr_req_state_t to, uint64_t now_ns);

/* X-Request-Id: 1..64 bytes of printable ASCII without spaces (0x21-0x7e). */
bool rtr_reqid_valid(const char *s, size_t len);

/* A NUL inside a JSON string (a \u0000 escape or a raw 0 byte) would cut
 * the string short once parsed (cJSON strings are C strings): true if the
 * text has one, with the JSON pointer (RFC 6901) of the value, or of the
 * member whose key it is, in ptr ("" = the whole body; key bytes as
 * written, long ones cut short). Works on any text, valid JSON or not
 * (the parser judges the rest). */
bool rtr_json_nul_find(const char *json, size_t len, char *ptr, size_t cap);

/* SSE framing: "data: " + payload + "\n\n" into out (cap); returns bytes
 * needed (like snprintf); out is NUL-terminated when room. A payload with a
 * newline is a caller bug (JSON from cJSON_PrintUnformatted has none); such
 * payloads are refused with 0. */
size_t rtr_sse_frame(const char *payload, size_t len, char *out, size_t cap);
#define RTR_SSE_DONE "data: [DONE]\n\n"

/* Token ids -> releasable text: eng_detok (UTF-8 safe) then eng_stop (stop
 * strings held back until they cannot match). */
typedef struct {
    eng_detok_t detok;
    eng_stop_t stop;
    bool stopped;                   /* a stop string matched */
} rtr_textpipe_t;

#define RTR_TEXTPIPE_OUT_MAX (ENG_DETOK_OUT_MAX + 2 * ENG_STOP_MAX_LEN + 8)

/* PD_ERR_TOO_BIG / PD_ERR_BAD_INPUT from eng_stop_init. */
pd_status_t rtr_textpipe_init(rtr_textpipe_t *p, const eng_tok_t *tok,
                              const char *const *stops, size_t n_stops);
/* Feed one token; writes releasable text to out (cap >= RTR_TEXTPIPE_OUT_MAX)
 * and returns its length. After a stop match p->stopped is set and further
 * feeds return 0. */
size_t rtr_textpipe_feed(rtr_textpipe_t *p, int32_t id, char *out, size_t cap);
/* End of stream without a stop match: the detokenizer's tail and the held
 * back text. Same cap rule. */
size_t rtr_textpipe_finish(rtr_textpipe_t *p, char *out, size_t cap);

#endif
