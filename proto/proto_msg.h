/* proto_msg.h - pdserve control-plane messages: structs <-> bytes.
 *
 * Pure code: no I/O, no allocation, no logging. Wire layout is documented
 * byte by byte in proto/PROTOCOL.md; this header is the C view of it.
 *
 * Frame = 32-byte header + body (body_len bytes). All integers little-endian.
 *   off size field
 *     0    4 magic      "PDSV" (0x50 0x44 0x53 0x56)
 *     4    2 version    PROTO_VERSION (4)
 *     6    2 type       proto_msg_type_t
 *     8    2 flags      PROTO_FLAG_* only; other bits -> PD_ERR_RESERVED
 *                       (AUTH: a 32-byte tag follows the body)
 *    10    2 reserved0  must be 0
 *    12    4 body_len   <= per-type cap <= PROTO_BODY_MAX
 *    16    8 tag        opaque correlation value chosen by the sender;
 *                       replies (PROTO_FLAG_REPLY) echo the request's tag
 *    24    8 reserved1  must be 0
 *
 * Request ids (HTTP X-Request-Id) travel as length-prefixed strings of at
 * most PROTO_REQID_MAX bytes in the bodies that need them.
 *
 * Ownership of decoded messages (choice made once, for every message):
 *   - strings are COPIED into bounded NUL-terminated char arrays inside the
 *     struct (ids, reasons: small);
 *   - token arrays (proto_tokens_t) and opaque blobs (proto_blob_t) are VIEWS
 *     into the input buffer: valid only while that buffer is. Copy out with
 *     proto_tokens_copy()/memcpy if you keep them. */
#ifndef PROTO_MSG_H
#define PROTO_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "pd_status.h"

#define PROTO_MAGIC          0x56534450u /* "PDSV" read as LE u32 */
#define PROTO_VERSION        4u /* 2: challenge handshake, AUTH frames; 3: live
                                     migration (DECODE_REQ kv_tokens, MIGRATE*);
                                     4: DECODE_REQ n_fork (n > 1), prefix caching
                                     (KV_EVENTS, cached_tokens in PREFILL_DONE and
                                     FINISH, FINISH kv_bytes), the prefill pulls
                                     a decode's cached prefix (KV_EXPORT_REQ /
                                     KV_EXPORT_DONE, PREFILL_REQ src_*) */
#define PROTO_HDR_LEN        32u
#define PROTO_BODY_MAX       (16u << 20) /* absolute cap on any body */

/* Header flags. */
#define PROTO_FLAG_REPLY     0x0001u /* tag echoes the tag of a request */
#define PROTO_FLAG_AUTH      0x0002u /* a PROTO_AUTH_TAG_LEN tag follows the
                                        body (session frames, proto_conn) */
#define PROTO_FLAGS_DEFINED  (PROTO_FLAG_REPLY | PROTO_FLAG_AUTH)

/* Hard caps (bytes unless noted). */
#define PROTO_REQID_MAX        64u   /* X-Request-Id */
#define PROTO_DAEMON_ID_MAX    64u
#define PROTO_REASON_MAX       256u  /* reject / cancel reasons */
#define PROTO_ERRMSG_MAX       512u
#define PROTO_MAX_PROMPT_TOKENS (1u << 20) /* tokens */
#define PROTO_MAX_GEN_TOKENS    (1u << 20) /* tokens */
#define PROTO_MAX_STOP_TOKENS   64u        /* tokens */
#define PROTO_MAX_LOGIT_BIAS    300u       /* (token id, bias) pairs */
#define PROTO_MAX_TOP_LOGPROBS  20u        /* alternatives per token */
#define PROTO_MAX_GRAMMAR       16384u     /* response_format schema bytes */
#define PROTO_MAX_FORK          15u        /* DECODE_REQ n_fork: n - 1 of a request's n choices */
#define PROTO_MAX_TOKENS_MSG    4096u      /* tokens per TOKENS message */
#define PROTO_MAX_TEXT          65536u     /* text bytes per TOKENS message */
#define PROTO_KV_HANDLE_MAX     4096u      /* opaque versioned KV handle */
#define PROTO_KV_ADDR_MAX       8192u      /* opaque transfer address info */
#define PROTO_AUTH_NONCE_LEN    32u
#define PROTO_AUTH_MAC_LEN      32u
#define PROTO_AUTH_TAG_LEN      32u        /* per-frame tag after the body */
#define PROTO_MAX_KV_EVENTS     4096u      /* block names per KV_EVENTS (stored + removed) */
#define PROTO_MAX_EMBD          16384u     /* floats per embedding (EMBED_DONE) */

/* Per-type worst-case body sizes, derived from the caps above. */
#define PROTO__STR(max)     (2u + (max))
#define PROTO__TOK(max)     (4u + 4u * (max))
#define PROTO__BLOB(max)    (4u + (max))
#define PROTO__SAMPLING     (32u + PROTO__TOK(PROTO_MAX_STOP_TOKENS))
/* The sampling tail: at the END of PREFILL_REQ and DECODE_REQ. */
#define PROTO__SAMPLING2    (16u + 4u + 8u * PROTO_MAX_LOGIT_BIAS + 8u + 4u \
        + PROTO__BLOB(PROTO_MAX_GRAMMAR))
/* A logprobs tail carrying n entries (at the END of PREFILL_DONE, TOKENS). */
#define PROTO__LOGPROBS(n)  (8u + (n) * (4u + 8u * PROTO_MAX_TOP_LOGPROBS))
#define PROTO_HELLO_BODY_MAX (8u + PROTO__STR(PROTO_DAEMON_ID_MAX) + 16u + 40u \
        + PROTO__BLOB(PROTO_KV_ADDR_MAX) + PROTO_AUTH_NONCE_LEN + PROTO_AUTH_MAC_LEN)
#define PROTO_REGISTER_ACK_BODY_MAX (PROTO__STR(PROTO_DAEMON_ID_MAX) + 24u \
        + PROTO_AUTH_NONCE_LEN + PROTO_AUTH_MAC_LEN)
#define PROTO_CHALLENGE_BODY_MAX PROTO_AUTH_NONCE_LEN
#define PROTO_REGISTER_REJECT_BODY_MAX (4u + PROTO__STR(PROTO_REASON_MAX))
#define PROTO_HEARTBEAT_BODY_MAX 48u
#define PROTO_PREFILL_REQ_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) \
        + PROTO__TOK(PROTO_MAX_PROMPT_TOKENS) + PROTO__SAMPLING \
        + PROTO__STR(PROTO_DAEMON_ID_MAX) + 8u + PROTO__SAMPLING2 \
        + PROTO__STR(PROTO_DAEMON_ID_MAX) + 8u + PROTO__BLOB(PROTO_KV_HANDLE_MAX) + 4u + 8u)
#define PROTO_PREFILL_DONE_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + 24u \
        + PROTO__BLOB(PROTO_KV_HANDLE_MAX) + 20u + PROTO__LOGPROBS(1u))
#define PROTO_DECODE_REQ_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + 4u \
        + PROTO__TOK(PROTO_MAX_PROMPT_TOKENS) + PROTO__TOK(PROTO_MAX_GEN_TOKENS) \
        + PROTO__SAMPLING + 8u + PROTO__STR(PROTO_DAEMON_ID_MAX) + 8u \
        + PROTO__BLOB(PROTO_KV_HANDLE_MAX) + 4u + 8u + PROTO__SAMPLING2 + 4u + 8u)
#define PROTO_TOKENS_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + 4u \
        + PROTO__TOK(PROTO_MAX_TOKENS_MSG) + PROTO__BLOB(PROTO_MAX_TEXT) \
        + PROTO__LOGPROBS(PROTO_MAX_TOKENS_MSG))
#define PROTO_FINISH_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + 16u + 48u + 12u)
#define PROTO_CANCEL_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + 4u \
        + PROTO__STR(PROTO_REASON_MAX))
#define PROTO_RELEASE_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + 8u)
#define PROTO_ERROR_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + 4u \
        + PROTO__STR(PROTO_ERRMSG_MAX))
#define PROTO_PEER_INFO_BODY_MAX (PROTO__STR(PROTO_DAEMON_ID_MAX) + 4u + 8u \
        + PROTO__BLOB(PROTO_KV_ADDR_MAX))
#define PROTO_PEER_DOWN_BODY_MAX (PROTO__STR(PROTO_DAEMON_ID_MAX) + 8u + 4u)
#define PROTO_MIGRATE_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + PROTO__STR(PROTO_DAEMON_ID_MAX))
#define PROTO_MIGRATE_DONE_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + 8u + 16u \
        + PROTO__BLOB(PROTO_KV_HANDLE_MAX))
#define PROTO_KV_EVENTS_BODY_MAX (8u + 8u + 8u * PROTO_MAX_KV_EVENTS)
#define PROTO_KV_EXPORT_REQ_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) \
        + PROTO__STR(PROTO_DAEMON_ID_MAX) + PROTO__TOK(PROTO_MAX_PROMPT_TOKENS) + 4u + 8u)
#define PROTO_KV_EXPORT_DONE_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + 4u + 8u + 8u \
        + PROTO__BLOB(PROTO_KV_HANDLE_MAX))
#define PROTO_PREFILL_HANDLE_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + 4u + 8u + 8u \
        + PROTO__BLOB(PROTO_KV_HANDLE_MAX))
#define PROTO_FIRST_TOKEN_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + 4u + 8u)
#define PROTO_EMBED_REQ_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + 4u \
        + PROTO__TOK(PROTO_MAX_PROMPT_TOKENS))
#define PROTO_EMBED_DONE_BODY_MAX (PROTO__STR(PROTO_REQID_MAX) + 4u + 16u \
        + PROTO__BLOB(4u * PROTO_MAX_EMBD))

/* THE message list. X(NAME, name, code, max_body)
 * Codes are wire values: never renumber, only append. */
#define PROTO_MSG_LIST(X)                                                     \
    X(HELLO,           hello,           1,  PROTO_HELLO_BODY_MAX)             \
    X(REGISTER_ACK,    register_ack,    2,  PROTO_REGISTER_ACK_BODY_MAX)      \
    X(REGISTER_REJECT, register_reject, 3,  PROTO_REGISTER_REJECT_BODY_MAX)   \
    X(HEARTBEAT,       heartbeat,       4,  PROTO_HEARTBEAT_BODY_MAX)         \
    X(CHALLENGE,       challenge,       5,  PROTO_CHALLENGE_BODY_MAX)         \
    X(PREFILL_REQ,     prefill_req,     16, PROTO_PREFILL_REQ_BODY_MAX)       \
    X(PREFILL_DONE,    prefill_done,    17, PROTO_PREFILL_DONE_BODY_MAX)      \
    X(DECODE_REQ,      decode_req,      18, PROTO_DECODE_REQ_BODY_MAX)        \
    X(TOKENS,          tokens,          19, PROTO_TOKENS_BODY_MAX)            \
    X(FINISH,          finish,          20, PROTO_FINISH_BODY_MAX)            \
    X(CANCEL,          cancel,          21, PROTO_CANCEL_BODY_MAX)            \
    X(RELEASE,         release,         22, PROTO_RELEASE_BODY_MAX)           \
    X(ERROR,           error,           23, PROTO_ERROR_BODY_MAX)             \
    X(PEER_INFO,       peer_info,       24, PROTO_PEER_INFO_BODY_MAX)         \
    X(PEER_DOWN,       peer_down,       25, PROTO_PEER_DOWN_BODY_MAX)         \
    X(MIGRATE,         migrate,         26, PROTO_MIGRATE_BODY_MAX)           \
    X(MIGRATE_DONE,    migrate_done,    27, PROTO_MIGRATE_DONE_BODY_MAX)      \
    X(KV_EVENTS,       kv_events,       28, PROTO_KV_EVENTS_BODY_MAX)        \
    X(KV_EXPORT_REQ,   kv_export_req,   29, PROTO_KV_EXPORT_REQ_BODY_MAX)    \
    X(KV_EXPORT_DONE,  kv_export_done,  30, PROTO_KV_EXPORT_DONE_BODY_MAX)    \
    X(PREFILL_HANDLE,  prefill_handle,  31, PROTO_PREFILL_HANDLE_BODY_MAX)    \
    X(FIRST_TOKEN,     first_token,     32, PROTO_FIRST_TOKEN_BODY_MAX)      \
    X(EMBED_REQ,       embed_req,       33, PROTO_EMBED_REQ_BODY_MAX)        \
    X(EMBED_DONE,      embed_done,      34, PROTO_EMBED_DONE_BODY_MAX)

typedef enum {
    PROTO_MSG_NONE = 0,
#define PROTO_X_ENUM(NAME, name, code, max) PROTO_MSG_##NAME = (code),
    PROTO_MSG_LIST(PROTO_X_ENUM)
#undef PROTO_X_ENUM
} proto_msg_type_t;

#define PROTO_X_COUNT(NAME, name, code, max) +1
enum { PROTO_MSG_COUNT = 0 PROTO_MSG_LIST(PROTO_X_COUNT) };
#undef PROTO_X_COUNT

/* ---- value types used by several bodies ------------------------------- */

/* Token ids. Wire: u32 count, then count x u32 LE; every id <= INT32_MAX.
 * Encode side: set n and v (host array). Decode side: v == NULL and
 * wire points at n*4 LE bytes inside the input buffer (a view).
 * Read either form with proto_tokens_get()/proto_tokens_copy(). */
typedef struct {
    uint32_t n;
    const int32_t *v;     /* (n) host order, or NULL */
    const uint8_t *wire;  /* (n, 4) LE bytes, or NULL */
} proto_tokens_t;

/* KV block names (pd_blockname.h). Wire: u32 count, then count x u64 LE.
 * Encode side: set n and v; decode side: wire is a view (read with
 * proto_names_get). */
typedef struct {
    uint32_t n;
    const uint64_t *v;    /* (n) host order, or NULL */
    const uint8_t *wire;  /* (n, 8) LE bytes, or NULL */
} proto_names_t;

/* Opaque bytes. Wire: u32 len, then len bytes. A view on decode. */
typedef struct {
    const uint8_t *p;     /* (len) */
    uint32_t len;
} proto_blob_t;

#define PROTO_SAMPLE_IGNORE_EOS 0x1u
#define PROTO_SAMPLE_HAS_SEED   0x2u
#define PROTO_SAMPLE_DEFINED    (PROTO_SAMPLE_IGNORE_EOS | PROTO_SAMPLE_HAS_SEED)

typedef struct {
    float temperature;    /* finite, >= 0 (0 = greedy) */
    float top_p;          /* finite, in [0, 1] */
    uint32_t top_k;       /* 0 = off */
    uint32_t flags;       /* PROTO_SAMPLE_* */
    uint64_t seed;
    uint32_t max_tokens;
    uint32_t min_tokens;
    proto_tokens_t stop;  /* <= PROTO_MAX_STOP_TOKENS stop token ids */
    /* The sampling tail: these travel at the END of the message body (after
     * the message's last older field), see PROTOCOL.md. */
    float presence_penalty;   /* finite, [-2, 2] */
    float frequency_penalty;  /* finite, [-2, 2] */
    float repetition_penalty; /* finite, [0, 2]; 0 and 1 = off */
    float min_p;              /* finite, [0, 1] */
    uint32_t n_bias;          /* <= PROTO_MAX_LOGIT_BIAS */
    int32_t bias_ids[PROTO_MAX_LOGIT_BIAS];   /* >= 0 */
    float bias[PROTO_MAX_LOGIT_BIAS];         /* finite, [-100, 100] */
    uint32_t logprobs;        /* 0 or 1: report each token's logprob */
    uint32_t top_logprobs;    /* <= PROTO_MAX_TOP_LOGPROBS alternatives; 0 if !logprobs */
    /* Structured output (engine/gram): PROTO_GRAM_* and, for JSON_SCHEMA /
     * REGEX / GBNF, the text (1..PROTO_MAX_GRAMMAR bytes; empty otherwise). */
    uint32_t gram_kind;
    proto_blob_t gram;
} proto_sampling_t;

#define PROTO_GRAM_NONE        0u
#define PROTO_GRAM_JSON_OBJECT 1u
#define PROTO_GRAM_JSON_SCHEMA 2u
#define PROTO_GRAM_REGEX       3u  /* the text is a regex (ECMA-262 subset, whole output) */
#define PROTO_GRAM_GBNF        4u  /* the text is a GBNF grammar (rule root) */

/* Per-token log-probabilities (TOKENS, PREFILL_DONE). Wire: u32 top_n,
 * u32 n, then n x (f32 logprob, top_n x (u32 id, f32 logprob)); every
 * logprob is a float <= 0 (or -inf), ids <= INT32_MAX. Encode side: set v;
 * decode side: wire is a view (read entries with proto_logprobs_get). */
typedef struct {
    float logprob;                              /* of the token itself */
    int32_t top_ids[PROTO_MAX_TOP_LOGPROBS];    /* (top_n) */
    float top_lp[PROTO_MAX_TOP_LOGPROBS];       /* (top_n) */
} proto_logprob_t;

typedef struct {
    uint32_t top_n;              /* <= PROTO_MAX_TOP_LOGPROBS */
    uint32_t n;                  /* 0 = none, else one per token of the message */
    const proto_logprob_t *v;    /* (n) encode side, or NULL */
    const uint8_t *wire;         /* decode side view, or NULL */
} proto_logprobs_t;

typedef enum {
    PROTO_ROLE_PREFILL = 1,
    PROTO_ROLE_DECODE  = 2,
    PROTO_ROLE_ROUTER  = 3,
} proto_role_t;

#define PROTO_CAP_PREFILL       0x01u /* runs prefill for others */
#define PROTO_CAP_DECODE        0x02u /* runs decode */
#define PROTO_CAP_PREFILL_LOCAL 0x04u /* decode daemon can prefill itself */
#define PROTO_CAP_KV_EXPORT     0x08u
#define PROTO_CAP_KV_IMPORT     0x10u
#define PROTO_CAPS_DEFINED      0x1fu

/* KV geometry as advertised; mirrors eng_kv_geom_t (proto does not include
 * engine headers). kv_dtype holds K's eng_kv_dtype_t in bits 0-7 and, when
 * V's differs (kv-dtype-v), V's + 1 in bits 8-15 (0: V as K), so a
 * deployment with one dtype sends the plain eng_kv_dtype_t value:
 * PROTO_KV_DTYPE_PACK / _K / _V. */
#define PROTO_KV_DTYPE_PACK(k, v) \
    ((uint32_t)(k) | ((v) != (k) ? ((uint32_t)(v) + 1u) << 8 : 0u))
#define PROTO_KV_DTYPE_K(x) ((uint32_t)(x) & 0xffu)
#define PROTO_KV_DTYPE_V(x) (((uint32_t)(x) >> 8 & 0xffu) ? ((uint32_t)(x) >> 8 & 0xffu) - 1u \
                                                          : PROTO_KV_DTYPE_K(x))
typedef struct {
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t block_tokens;
    uint32_t kv_dtype;
    uint32_t total_blocks;
    uint64_t block_bytes;
    uint32_t context_length;
    uint32_t vocab_size;
} proto_kv_geom_t;

/* ---- bodies ----------------------------------------------------------- */

/* HELLO (a.k.a. REGISTER): first message on every connection, from the
 * connecting side. mac is the LAST field on the wire so the MAC input is
 * body[0 .. body_len - PROTO_AUTH_MAC_LEN) (see proto_auth_hello_sign /
 * proto_auth_hello_verify). */
typedef struct {
    uint16_t role;                          /* proto_role_t */
    uint32_t caps;                          /* PROTO_CAP_* */
    char daemon_id[PROTO_DAEMON_ID_MAX + 1]; /* non-empty */
    uint64_t incarnation;                   /* changes on every restart */
    uint64_t compat_hash;                   /* eng_kv_geom_t.compat_hash */
    proto_kv_geom_t geom;
    proto_blob_t kv_addr;                   /* <= PROTO_KV_ADDR_MAX, opaque */
    uint8_t nonce[PROTO_AUTH_NONCE_LEN];
    uint8_t mac[PROTO_AUTH_MAC_LEN];
} proto_hello_t;

typedef struct {
    char daemon_id[PROTO_DAEMON_ID_MAX + 1]; /* the accepting side; non-empty */
    uint64_t incarnation;
    uint64_t heartbeat_interval_ns;
    uint64_t lease_ns;                      /* default KV lease length */
    uint8_t nonce[PROTO_AUTH_NONCE_LEN];
    uint8_t mac[PROTO_AUTH_MAC_LEN];        /* last field on the wire */
} proto_register_ack_t;

/* CHALLENGE: the accepting side's first frame on every connection. The
 * connecting side's HELLO mac covers this nonce, so a recorded HELLO is
 * worthless on any other connection. Fixed 32 bytes. */
typedef struct {
    uint8_t nonce[PROTO_AUTH_NONCE_LEN];
} proto_challenge_t;

typedef struct {
    int32_t status;                         /* a negative pd_status_t */
    char reason[PROTO_REASON_MAX + 1];
} proto_register_reject_t;

#define PROTO_HB_DRAINING   0x1u
#define PROTO_HB_DEFINED    (PROTO_HB_DRAINING)

typedef struct {
    uint64_t incarnation;
    uint64_t sent_ns;                       /* sender's CLOCK_MONOTONIC */
    uint32_t flags;                         /* PROTO_HB_* */
    uint32_t queue_depth;
    uint32_t running_seqs;
    uint32_t free_blocks;
    uint32_t total_blocks;
    uint32_t leases;                        /* KV handles pinned for peers */
    uint64_t outstanding_prefill_tokens;
} proto_heartbeat_t;

typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    proto_tokens_t prompt;                  /* <= PROTO_MAX_PROMPT_TOKENS */
    proto_sampling_t sampling;
    char target_decode_id[PROTO_DAEMON_ID_MAX + 1]; /* may be empty */
    uint64_t deadline_ns;                   /* relative budget, 0 = none */
    /* The source tail (after the sampling tail): a decode's cached KV of
     * the prompt's first src_kv_tokens positions, exported to this prefill
     * under a lease (KV_EXPORT_DONE). All empty / 0, or all set with
     * 1 <= src_kv_tokens < prompt.n. The prefill pulls what it lacks of it,
     * releases the lease, and computes the rest; on any failure it computes
     * everything itself. */
    char src_peer_id[PROTO_DAEMON_ID_MAX + 1];
    uint64_t src_lease_id;
    proto_blob_t src_handle;                /* <= PROTO_KV_HANDLE_MAX */
    uint32_t src_kv_tokens;
    /* The prefix-cache partition the request's blocks are named in
     * (pd_blockname.h: the root of the chain; 0 = the shared one): the
     * router's hash of the client's API key and cache_salt. The LAST
     * field, here, in DECODE_REQ and in KV_EXPORT_REQ. */
    uint64_t cache_partition;
} proto_prefill_req_t;

typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    int32_t first_token;                    /* >= 0 */
    uint32_t n_prompt_tokens;
    uint64_t lease_id;
    uint64_t lease_ns;                      /* handle valid this long */
    proto_blob_t kv_handle;                 /* <= PROTO_KV_HANDLE_MAX, opaque */
    uint64_t queue_ns;
    uint64_t prefill_ns;
    uint32_t cached_tokens;                 /* prompt tokens whose KV came from
                                               the prefix cache (<= n_prompt_tokens) */
    proto_logprobs_t logprobs;              /* n 0 or 1 (first_token's); LAST */
} proto_prefill_done_t;

#define PROTO_DEC_PREFILL_LOCALLY 0x1u
/* Early hand-off (kv-stream = layer): the handle comes before the prompt
 * pass ends; token 0 follows in a FIRST_TOKEN. Requires a handle,
 * generated empty, kv_tokens 0, n_fork 0. */
#define PROTO_DEC_TOKEN0_LATER    0x2u
#define PROTO_DEC_DEFINED         (PROTO_DEC_PREFILL_LOCALLY | PROTO_DEC_TOKEN0_LATER)

/* Exactly one of: PROTO_DEC_PREFILL_LOCALLY set with an empty kv_handle, or
 * the flag clear with a non-empty kv_handle. */
typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    uint32_t flags;                         /* PROTO_DEC_* */
    proto_tokens_t prompt;                  /* <= PROTO_MAX_PROMPT_TOKENS */
    proto_tokens_t generated;               /* <= PROTO_MAX_GEN_TOKENS */
    proto_sampling_t sampling;
    uint64_t rng_state;                     /* sampler state after `generated` */
    char prefill_peer_id[PROTO_DAEMON_ID_MAX + 1];
    uint64_t lease_id;
    proto_blob_t kv_handle;                 /* <= PROTO_KV_HANDLE_MAX */
    uint32_t kv_tokens;                     /* positions the handle's KV covers:
                                               0 = the prompt (a prefill's
                                               handle); a migration's covers
                                               prompt + generated - 1 */
    uint64_t deadline_ns;
    /* n > 1: the decode forks n_fork more sequences off this one once its
     * prompt's KV is complete ("<request_id>/<i>", i = 1..n_fork, seed +
     * i, decode-local, sharing the prompt's full blocks). 0 unless
     * generated.n <= 1 and kv_tokens == 0. */
    uint32_t n_fork;
    uint64_t cache_partition;               /* as PREFILL_REQ's; LAST */
} proto_decode_req_t;

typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    uint32_t seq;                           /* per request, from 0 */
    proto_tokens_t tokens;                  /* <= PROTO_MAX_TOKENS_MSG */
    proto_blob_t text;                      /* <= PROTO_MAX_TEXT, any bytes */
    proto_logprobs_t logprobs;              /* n 0 or tokens.n; LAST */
} proto_tokens_msg_t;

typedef enum {
    PROTO_FINISH_STOP     = 0,
    PROTO_FINISH_LENGTH   = 1,
    PROTO_FINISH_ERROR    = 2,
    PROTO_FINISH_CANCELED = 3,
} proto_finish_reason_t;
#define PROTO_FINISH_REASON_MAX 3u

typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    uint16_t reason;                        /* proto_finish_reason_t */
    int32_t status;                         /* pd_status_t; PD_OK unless error */
    uint32_t prompt_tokens;
    uint32_t completion_tokens;
    uint64_t queue_ns;
    uint64_t prefill_ns;
    uint64_t transfer_ns;
    uint64_t decode_ns;
    uint64_t ttft_ns;
    uint64_t total_ns;
    uint32_t cached_tokens;                 /* prompt tokens whose KV the decode
                                               had in its prefix cache
                                               (<= prompt_tokens) */
    uint64_t kv_bytes;                      /* KV bytes it pulled from a peer */
} proto_finish_t;

typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    int32_t status;                         /* pd_status_t, e.g. PD_ERR_CANCELED */
    char reason[PROTO_REASON_MAX + 1];
} proto_cancel_t;

typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    uint64_t lease_id;
} proto_release_t;

typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* may be empty: connection-level */
    int32_t status;                         /* a negative pd_status_t */
    char message[PROTO_ERRMSG_MAX + 1];
} proto_error_t;

/* PEER_INFO (router -> decode): a prefill daemon the decode may pull from.
 * kv_addr is that prefill's kvx_meta_pack() blob from its HELLO. */
typedef struct {
    char daemon_id[PROTO_DAEMON_ID_MAX + 1]; /* non-empty */
    uint16_t role;                          /* proto_role_t */
    uint64_t incarnation;
    proto_blob_t kv_addr;                   /* <= PROTO_KV_ADDR_MAX, opaque */
} proto_peer_info_t;

/* PEER_DOWN (router -> decode): that incarnation of the daemon is gone. */
typedef struct {
    char daemon_id[PROTO_DAEMON_ID_MAX + 1]; /* non-empty */
    uint64_t incarnation;
    int32_t status;                         /* a negative pd_status_t */
} proto_peer_down_t;

/* MIGRATE (router -> decode): move this running request to that decode:
 * export its KV under a lease and answer MIGRATE_DONE (or ignore it if the
 * request is not running there any more). */
typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    char target_decode_id[PROTO_DAEMON_ID_MAX + 1]; /* non-empty */
} proto_migrate_t;

/* MIGRATE_DONE (decode -> router): the request stopped after n_gen tokens
 * (all of them sent in TOKENS before this); its KV for kv_tokens positions
 * (prompt + n_gen - 1) is exported to the target under the lease. */
typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    uint32_t n_gen;                         /* >= 1 */
    uint32_t kv_tokens;                     /* >= 1 */
    uint64_t lease_id;
    uint64_t lease_ns;
    proto_blob_t kv_handle;                 /* non-empty, <= PROTO_KV_HANDLE_MAX */
} proto_migrate_done_t;

/* KV_EVENTS (daemon -> router): blocks that entered (stored) or left
 * (removed) the sender's prefix cache since its last KV_EVENTS, coalesced
 * (a name is in at most one of the two lists: its last change). RESET:
 * forget everything indexed for the sender before applying this one (the
 * first KV_EVENTS of every session, and after the sender dropped events:
 * a snapshot of its whole cache follows, in as many frames as it needs).
 * stored.n + removed.n <= PROTO_MAX_KV_EVENTS. */
#define PROTO_KVE_RESET   0x1u
#define PROTO_KVE_DEFINED (PROTO_KVE_RESET)

typedef struct {
    uint32_t flags;                         /* PROTO_KVE_* */
    uint32_t cached_blocks;                 /* blocks in the sender's cache after
                                               this batch (informational) */
    proto_names_t stored;
    proto_names_t removed;
} proto_kv_events_t;

/* KV_EXPORT_REQ (router -> decode): export your cached KV of the longest
 * prefix of prompt you hold (full blocks, never the last prompt token;
 * at least min_tokens of it, else refuse) to the prefill
 * target_prefill_id under a lease. Answer KV_EXPORT_DONE, or ERROR with
 * the request id (PD_ERR_NOT_FOUND: not enough cached). The request id is
 * the router's wire id of the request the prefill will serve. */
typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    char target_prefill_id[PROTO_DAEMON_ID_MAX + 1]; /* non-empty */
    proto_tokens_t prompt;                  /* 2..PROTO_MAX_PROMPT_TOKENS */
    uint32_t min_tokens;                    /* < prompt.n */
    uint64_t cache_partition;               /* match in this partition only
                                               (PREFILL_REQ's); LAST */
} proto_kv_export_req_t;

/* KV_EXPORT_DONE (decode -> router): positions [0, kv_tokens) of the
 * prompt (whole blocks) exported to the target under the lease; the
 * router hands the handle on in PREFILL_REQ's source tail (or RELEASEs
 * it to the decode when it will not). */
typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    uint32_t kv_tokens;                     /* >= 1 */
    uint64_t lease_id;
    uint64_t lease_ns;
    proto_blob_t kv_handle;                 /* non-empty, <= PROTO_KV_HANDLE_MAX */
} proto_kv_export_done_t;

/* PREFILL_HANDLE (prefill -> router, kv-stream = layer): the streamed
 * lease of a request, exported before its prompt pass; the router may hand
 * it to the decode at once (DECODE_REQ with PROTO_DEC_TOKEN0_LATER). The
 * PREFILL_DONE that follows carries the same lease. */
typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    uint32_t n_prompt_tokens;               /* >= 1 */
    uint64_t lease_id;
    uint64_t lease_ns;                      /* handle valid this long */
    proto_blob_t kv_handle;                 /* non-empty, <= PROTO_KV_HANDLE_MAX */
} proto_prefill_handle_t;

/* FIRST_TOKEN (router -> decode): token 0 of a DECODE_REQ sent with
 * PROTO_DEC_TOKEN0_LATER. rng_state as DECODE_REQ's (after token 0; 0 =
 * not checked). */
typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    int32_t first_token;                    /* >= 0 */
    uint64_t rng_state;
} proto_first_token_t;

/* EMBED_REQ (router -> prefill): the embedding of `prompt` (a prompt pass
 * into scratch KV: no lease, no handle, no decode). pooling: 0 the
 * daemon's (the GGUF's pooling_type, else its embeddings.pooling), 1 mean,
 * 2 cls, 3 last (engine eng_pooling_t). Answered by EMBED_DONE or ERROR. */
#define PROTO_POOL_DEFAULT 0u
#define PROTO_POOL_LAST 3u
typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    uint32_t pooling;                       /* PROTO_POOL_DEFAULT..PROTO_POOL_LAST */
    proto_tokens_t prompt;                  /* 1..PROTO_MAX_PROMPT_TOKENS ids */
} proto_embed_req_t;

/* EMBED_DONE (prefill -> router): the L2-normalised embedding, f32 LE,
 * n_embd = vec.len / 4 (1..PROTO_MAX_EMBD). */
typedef struct {
    char request_id[PROTO_REQID_MAX + 1];   /* non-empty */
    uint32_t n_prompt_tokens;               /* >= 1 */
    uint64_t queue_ns;
    uint64_t compute_ns;
    proto_blob_t vec;                       /* (n_embd, 4) f32 LE */
} proto_embed_done_t;

/* Read element i of an EMBED_DONE vector. */
float proto_embed_get(const proto_embed_done_t *d, uint32_t i);

typedef struct {
    uint16_t type;        /* proto_msg_type_t */
    uint16_t flags;       /* PROTO_FLAG_* */
    uint32_t body_len;    /* filled by decode; ignored by encode */
    uint64_t tag;
} proto_hdr_t;

/* A whole message. After decode, views inside point into the input. */
typedef struct {
    proto_hdr_t hdr;
    union {
        proto_hello_t hello;
        proto_register_ack_t register_ack;
        proto_register_reject_t register_reject;
        proto_heartbeat_t heartbeat;
        proto_challenge_t challenge;
        proto_prefill_req_t prefill_req;
        proto_prefill_done_t prefill_done;
        proto_decode_req_t decode_req;
        proto_tokens_msg_t tokens;
        proto_finish_t finish;
        proto_cancel_t cancel;
        proto_release_t release;
        proto_error_t error;
        proto_peer_info_t peer_info;
        proto_peer_down_t peer_down;
        proto_migrate_t migrate;
        proto_migrate_done_t migrate_done;
        proto_kv_events_t kv_events;
        proto_kv_export_req_t kv_export_req;
        proto_kv_export_done_t kv_export_done;
        proto_prefill_handle_t prefill_handle;
        proto_first_token_t first_token;
        proto_embed_req_t embed_req;
        proto_embed_done_t embed_done;
    } u;
} proto_msg_t;

/* ---- functions -------------------------------------------------------- */

/* "HELLO", ... for a known type; "UNKNOWN" otherwise. Never NULL. */
const char *proto_msg_name(uint16_t type);
/* A proto_kv_geom_t kv_dtype's name as the kv-dtype config spells it
 * ("f32", "f16", "q8_0", "q4_0", "bf16", "fp8_e4m3"; "unknown" otherwise). */
const char *proto_kv_dtype_name(uint32_t kv_dtype);
/* A packed proto_kv_geom_t kv_dtype as the config spells it: "q8_0" (K and
 * V alike) or "k=q8_0,v=q4_0"; writes buf, returns it. */
const char *proto_kv_dtypes_str(uint32_t kv_dtype, char *buf, size_t len);
/* True for a type in PROTO_MSG_LIST. */
bool proto_msg_type_known(uint16_t type);
/* Hard cap on the body of `type` (0 for unknown types). */
uint32_t proto_msg_body_max(uint16_t type);

/* Write a header (no validation; body_len from hdr). */
void proto_hdr_encode(const proto_hdr_t *hdr, uint8_t out[PROTO_HDR_LEN]);
/* Parse and validate a header from buf (len >= PROTO_HDR_LEN else
 * PD_ERR_TRUNCATED). Checks in this order: PD_ERR_BAD_MAGIC,
 * PD_ERR_BAD_VERSION, PD_ERR_BAD_TYPE, PD_ERR_RESERVED (reserved fields or
 * undefined flag bits), PD_ERR_TOO_BIG (body_len over the type's cap).
 * *hdr_p is set only on PD_OK. */
pd_status_t proto_hdr_decode(const uint8_t *buf, size_t len, proto_hdr_t *hdr_p);

/* Framing core, pure: look at the bytes available at the front of a stream.
 *   PD_OK          a whole frame is there; *hdr_p and *frame_len_p set
 *   PD_INPROGRESS  need more bytes; *frame_len_p = total bytes needed so far
 *                  (PROTO_HDR_LEN until the header is in, then the whole
 *                  frame, and then *hdr_p is set as well)
 *   PD_ERR_*       the header is invalid (see proto_hdr_decode): the stream
 *                  is garbage and must be dropped. */
pd_status_t proto_frame_check(const uint8_t *buf, size_t len,
                              proto_hdr_t *hdr_p, size_t *frame_len_p);

/* The framing step used by proto_conn (and by the frame fuzzer): look at
 * the front of a stream and, if a whole frame is there, decode it.
 *   PD_OK          *msg decoded (hdr + body, views into buf); consume
 *                  *frame_len_p bytes
 *   PD_INPROGRESS  wait until *frame_len_p bytes are available
 *   PD_ERR_*       header or body invalid: drop the stream. */
pd_status_t proto_frame_next(const uint8_t *buf, size_t len, proto_msg_t *msg,
                             size_t *frame_len_p);

/* Decode a body of `type` into msg->u (msg->hdr untouched). Statuses:
 * PD_ERR_BAD_TYPE, PD_ERR_TOO_BIG (a count/length over its cap),
 * PD_ERR_TRUNCATED (body ends early), PD_ERR_RESERVED (reserved body field
 * or undefined flag bit), PD_ERR_BAD_INPUT (trailing bytes, NUL inside a
 * string, empty required id, value out of range). Views point into body. */
pd_status_t proto_body_decode(uint16_t type, const uint8_t *body, size_t len,
                              proto_msg_t *msg);

/* Decode exactly one frame: buf must hold the header and the body and
 * nothing more (extra bytes -> PD_ERR_BAD_INPUT, missing -> PD_ERR_TRUNCATED). */
pd_status_t proto_msg_decode(const uint8_t *buf, size_t len, proto_msg_t *msg);

/* Encode msg->u for msg->hdr.type into buf[0..cap). On PD_OK *len_p is the
 * body length. If cap is too small: PD_ERR_NO_SPACE and *len_p is the size
 * needed (buf may be NULL with cap 0 to ask for the size). Invalid structs
 * are refused with the statuses the decoder would give. */
pd_status_t proto_body_encode(const proto_msg_t *msg, uint8_t *buf, size_t cap,
                              size_t *len_p);

/* Encode a whole frame (header + body). Same conventions as above;
 * *len_p = PROTO_HDR_LEN + body length. hdr.body_len is ignored. */
pd_status_t proto_msg_encode(const proto_msg_t *msg, uint8_t *buf, size_t cap,
                             size_t *len_p);

/* Token accessors that work on both encode-side and decode-side arrays.
 * proto_tokens_copy copies min(n, cap) ids and returns how many it copied. */
int32_t proto_tokens_get(const proto_tokens_t *t, uint32_t i);
/* Entry i (< l->n) of a logprobs array of either form; entries past top_n
 * are zeroed. */
void proto_logprobs_get(const proto_logprobs_t *l, uint32_t i, proto_logprob_t *out);
uint32_t proto_tokens_copy(const proto_tokens_t *t, int32_t *dst, uint32_t cap);
/* Name i (< n) of either form; 0 past the end. */
uint64_t proto_names_get(const proto_names_t *t, uint32_t i);

/* MAC input of an encoded HELLO or REGISTER_ACK frame: the header and the
 * body without its trailing mac field (the mac is right after it). PD_ERR_BAD_TYPE for other types, PD_ERR_TRUNCATED if
 * the frame is shorter than the header says. */
pd_status_t proto_mac_input(const uint8_t *frame, size_t len,
                            const uint8_t **p_p, size_t *len_p);

#endif
