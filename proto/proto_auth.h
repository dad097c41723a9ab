/* proto_auth.h - deployment secret and the HELLO / REGISTER_ACK MACs.
 *
 * Mutual authentication of the control plane (see proto/PROTOCOL.md "Flows"):
 *   HELLO.mac        = HMAC-SHA256(secret, HELLO body without its mac)
 *   REGISTER_ACK.mac = HMAC-SHA256(secret, ACK body without its mac
 *                                          || the HELLO's nonce)
 * The key is the whole secret (libsodium crypto_auth_hmacsha256_init takes
 * any key length). Comparisons are constant time (crypto_verify_32).
 *
 * Pure except proto_auth_secret_load (reads one file at boot) and
 * proto_auth_nonce (libsodium's CSPRNG). Never logs the secret. */
#ifndef PROTO_AUTH_H
#define PROTO_AUTH_H

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

/* Derive a 32-byte sub-key for another use of the same deployment secret
 * (e.g. label "kvx" -> kvx_config_t.secret): keyed BLAKE2b(secret, label). */
void proto_auth_derive(const proto_auth_secret_t *s, const char *label,
                       uint8_t out[32]);

/* Wipe a secret (sodium_memzero). Accepts NULL. */
void proto_auth_secret_wipe(proto_auth_secret_t *s);

/* Fill a fresh random nonce (randombytes_buf). */
void proto_auth_nonce(uint8_t nonce[PROTO_AUTH_NONCE_LEN]);

/* Compute msg->u.hello.mac in place (msg->hdr.type must be HELLO). The mac
 * field's old content is irrelevant. Errors: the encode statuses of
 * proto_msg_encode for an invalid struct (bugs), PD_ERR_NO_MEMORY. */
pd_status_t proto_auth_hello_sign(const proto_auth_secret_t *s, proto_msg_t *msg);

/* Verify the mac of a received HELLO frame (header + body, as given by
 * proto_conn_frame). PD_OK or PD_ERR_AUTH; PD_ERR_BAD_TYPE /
 * PD_ERR_TRUNCATED for frames that are not a whole HELLO. */
pd_status_t proto_auth_hello_verify(const proto_auth_secret_t *s,
                                    const uint8_t *frame, size_t len);

/* Compute msg->u.register_ack.mac in place, bound to the HELLO nonce the
 * ACK answers. Errors as proto_auth_hello_sign. */
pd_status_t proto_auth_ack_sign(const proto_auth_secret_t *s, proto_msg_t *msg,
                                const uint8_t hello_nonce[PROTO_AUTH_NONCE_LEN]);

/* Verify a received REGISTER_ACK frame against the nonce of the HELLO we
 * sent. PD_OK or PD_ERR_AUTH; PD_ERR_BAD_TYPE / PD_ERR_TRUNCATED. */
pd_status_t proto_auth_ack_verify(const proto_auth_secret_t *s,
                                  const uint8_t *frame, size_t len,
                                  const uint8_t hello_nonce[PROTO_AUTH_NONCE_LEN]);

#endif
