/* proto_auth.h - deployment secret, the challenge-response handshake MACs
 * and the per-frame session tags of the control plane (proto/PROTOCOL.md
 * "Registration and session authentication").
 * The HMAC key is the whole secret (libsodium crypto_auth_hmacsha256_init takes
 * any key length). Comparisons are constant time (crypto_verify_32).
 *
 * Pure except proto_auth_secret_load (reads one file at boot) and
 * proto_auth_nonce (libsodium's CSPRNG). Never logs the secret. */
#ifndef PROTO_AUTH_H
#define PROTO_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "pd_status.h"
#include "proto_msg.h"

#define PROTO_AUTH_SECRET_MIN 32u   /* bytes after hex decoding */
#define PROTO_AUTH_SECRET_MAX 256u

typedef struct {
    uint8_t key[PROTO_AUTH_SECRET_MAX]; /* (len) secret bytes */
    size_t len;                         /* PROTO_AUTH_SECRET_MIN..MAX */
} proto_auth_secret_t;

/* Secret from bytes: surrounding whitespace is trimmed; if what remains is
 * all hex digits of even length it is hex-decoded, else used raw.
 * PD_ERR_BAD_INPUT if fewer than PROTO_AUTH_SECRET_MIN bytes result,
 * PD_ERR_TOO_BIG if more than PROTO_AUTH_SECRET_MAX. *s_p set only on PD_OK. */
pd_status_t proto_auth_secret_parse(const uint8_t *p, size_t len,
                                    proto_auth_secret_t *s_p);

/* Secret from a file (same rules as proto_auth_secret_parse). Expected:
 * PD_ERR_IO (cannot open/read; errno kept), PD_ERR_BAD_INPUT, PD_ERR_TOO_BIG. */
pd_status_t proto_auth_secret_load(const char *path, proto_auth_secret_t *s_p);

/* The deployment secret a daemon boots with, the one rule for the router
 * and the daemons: secret_file, else secret_text or $PD_SECRET (a warning:
 * text on a command line is visible in ps), else none, which only
 * insecure (--insecure-no-auth) allows, and only when every address of
 * addrs[0..n_addrs) is loopback (pd_addr_is_loopback). Errors go to stderr
 * as one line "prog: ..." naming the option and the cause (for a file:
 * strerror); the status is PD_ERR_BAD_INPUT. *have_p: a secret was
 * loaded into *s_p. Boot only (reads a file and the environment). */
pd_status_t proto_auth_boot_secret(const char *prog, const char *secret_file,
                                   const char *secret_text, bool insecure,
                                   const char *const *addrs, size_t n_addrs,
                                   const char *addrs_what, proto_auth_secret_t *s_p,
                                   bool *have_p);
/* The same rule without printing: on failure err holds the line (no prog
 * prefix); *warn_text_p: the secret came as command-line text. What
 * --check-config runs, so it refuses what the daemon would refuse. */
pd_status_t proto_auth_secret_resolve(const char *secret_file, const char *secret_text,
                                      bool insecure, const char *const *addrs, size_t n_addrs,
                                      const char *addrs_what, proto_auth_secret_t *s_p,
                                      bool *have_p, bool *warn_text_p, char *err, size_t err_len);

/* Derive a 32-byte sub-key for another use of the same deployment secret
 * (e.g. label "kvx" -> kvx_config_t.secret): keyed BLAKE2b(secret, label). */
void proto_auth_derive(const proto_auth_secret_t *s, const char *label,
                       uint8_t out[32]);

/* Wipe a secret (sodium_memzero). Accepts NULL. */
void proto_auth_secret_wipe(proto_auth_secret_t *s);

/* Fill a fresh random nonce (randombytes_buf). */
void proto_auth_nonce(uint8_t nonce[PROTO_AUTH_NONCE_LEN]);

/* The handshake (PROTOCOL.md "Registration and session authentication"):
 *   acceptor  -> CHALLENGE{nonce_r}          fresh per connection
 *   connector -> HELLO{..., nonce_d, mac}    mac = HMAC-SHA256(secret,
 *                    HELLO header || body without mac || nonce_r)
 *   acceptor  -> REGISTER_ACK{..., nonce = nonce_r, mac}
 *                    mac = HMAC-SHA256(secret, ACK header || body without
 *                    mac || nonce_d || nonce_r)
 * then both sides derive the session keys (proto_auth_session_keys) and
 * every later frame carries a tag (proto_auth_frame_tag) over its header
 * and body and an implicit per-direction sequence number. */

/* Compute msg->u.hello.mac in place (msg->hdr.type must be HELLO), bound to
 * the acceptor's CHALLENGE nonce. The mac field's old content is
 * irrelevant. Errors: the encode statuses of proto_msg_encode for an
 * invalid struct (bugs), PD_ERR_NO_MEMORY. */
pd_status_t proto_auth_hello_sign(const proto_auth_secret_t *s, proto_msg_t *msg,
                                  const uint8_t challenge[PROTO_AUTH_NONCE_LEN]);

/* Verify the mac of a received HELLO frame (header + body, as given by
 * proto_conn_frame) against the CHALLENGE we sent on this connection.
 * PD_OK or PD_ERR_AUTH; PD_ERR_BAD_TYPE / PD_ERR_TRUNCATED for frames that
 * are not a whole HELLO. */
pd_status_t proto_auth_hello_verify(const proto_auth_secret_t *s,
                                    const uint8_t *frame, size_t len,
                                    const uint8_t challenge[PROTO_AUTH_NONCE_LEN]);

/* Compute msg->u.register_ack.mac in place, bound to the HELLO nonce the
 * ACK answers and to our challenge. Errors as proto_auth_hello_sign. */
pd_status_t proto_auth_ack_sign(const proto_auth_secret_t *s, proto_msg_t *msg,
                                const uint8_t hello_nonce[PROTO_AUTH_NONCE_LEN],
                                const uint8_t challenge[PROTO_AUTH_NONCE_LEN]);

/* Verify a received REGISTER_ACK frame against the nonce of the HELLO we
 * sent and the challenge we answered. PD_OK or PD_ERR_AUTH;
 * PD_ERR_BAD_TYPE / PD_ERR_TRUNCATED. */
pd_status_t proto_auth_ack_verify(const proto_auth_secret_t *s,
                                  const uint8_t *frame, size_t len,
                                  const uint8_t hello_nonce[PROTO_AUTH_NONCE_LEN],
                                  const uint8_t challenge[PROTO_AUTH_NONCE_LEN]);

/* Per-session, per-direction frame keys. */
typedef struct {
    uint8_t send[PROTO_AUTH_TAG_LEN];
    uint8_t recv[PROTO_AUTH_TAG_LEN];
} proto_auth_keys_t;

/* Session keys after a verified handshake:
 *   master = BLAKE2b-256(key = proto_auth_derive(secret, "pdserve ctl v2"),
 *                        nonce_r || nonce_d)
 *   connector->acceptor key = crypto_kdf_derive_from_key(id 1, "pdsvctl2", master)
 *   acceptor->connector key = crypto_kdf_derive_from_key(id 2, "pdsvctl2", master)
 * acceptor picks which one is k->send. */
void proto_auth_session_keys(const proto_auth_secret_t *s,
                             const uint8_t challenge[PROTO_AUTH_NONCE_LEN],
                             const uint8_t hello_nonce[PROTO_AUTH_NONCE_LEN],
                             bool acceptor, proto_auth_keys_t *k);

/* Tag of one session frame: keyed BLAKE2b-256(key, seq as u64 LE ||
 * header || body). frame/len = header + body (no tag). */
void proto_auth_frame_tag(const uint8_t key[PROTO_AUTH_TAG_LEN], uint64_t seq,
                          const uint8_t *frame, size_t len,
                          uint8_t tag[PROTO_AUTH_TAG_LEN]);
/* Constant-time check of a received tag. PD_OK or PD_ERR_AUTH. */
pd_status_t proto_auth_frame_check(const uint8_t key[PROTO_AUTH_TAG_LEN], uint64_t seq,
                                   const uint8_t *frame, size_t len,
                                   const uint8_t tag[PROTO_AUTH_TAG_LEN]);
/* The receive step of a control connection (proto_conn runs it on its
 * input buffer; pure, so the fuzz target runs exactly the same code):
 * proto_frame_next plus the session rules, checked in this order once the
 * header is in: body_len <= body_max (0 = the type caps only) else
 * PD_ERR_TOO_BIG; PROTO_FLAG_AUTH set iff key != NULL else PD_ERR_AUTH;
 * with a key, the tag over header + body with *seq is checked (PD_ERR_AUTH)
 * BEFORE the body is decoded, and *seq is incremented.
 *   PD_OK          *msg decoded; consume *frame_len_p bytes (tag included);
 *                  *mac_len_p = header + body bytes (what the tag covers)
 *   PD_INPROGRESS  wait until *frame_len_p bytes are available
 *   PD_ERR_*       drop the stream. */
pd_status_t proto_auth_frame_next(const uint8_t *key, uint64_t *seq, uint32_t body_max,
                                  const uint8_t *buf, size_t len, proto_msg_t *msg,
                                  size_t *frame_len_p, size_t *mac_len_p);

#endif
