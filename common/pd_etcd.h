/* pd_etcd.h - deployment membership in etcd (v3 API through its JSON
 * gRPC-gateway over plain HTTP/1.1; no home-made consensus).
 *
 * A pd_member_t registers one key under the deployment prefix with a lease
 * (prefix + key = value, lease TTL ttl_s, kept alive every ttl/3) and, if
 * asked, watches a sub-prefix (e.g. "routers/") and publishes the keys under
 * it as a snapshot. All etcd I/O runs on one worker thread with blocking
 * sockets and bounded timeouts; the loop thread only takes snapshots. When
 * the snapshot or the connection state changes the worker wakes the loop
 * (event_active on a loop event; libevent pthreads support is on) and
 * on_change(arg) runs there.
 *
 * etcd unreachable: the worker retries (backoff 200 ms .. 2 s), keeps the
 * last snapshot (`connected` false) and re-registers (new lease, put) once
 * it is back. Hard caps on what etcd sends: a response of at most 1 MiB,
 * at most PD_MEMBER_MAX keys (more are ignored), keys and values of at most
 * PD_MEMBER_VAL_MAX - 1 bytes (longer ones are ignored).
 *
 * Depends on libc, pthreads, libevent core, cJSON. */
#ifndef PD_ETCD_H
#define PD_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pd_status.h"

struct event_base;

#define PD_MEMBER_MAX 32u
#define PD_MEMBER_VAL_MAX 128u

typedef struct {
    char key[PD_MEMBER_VAL_MAX];        /* below the watched prefix, e.g. "router-1" */
    char value[PD_MEMBER_VAL_MAX];
    int64_t mod_revision;               /* changes on every put (a restart re-puts) */
} pd_member_entry_t;

typedef struct {
    const char *endpoint;               /* etcd client address host:port (http; a name is
                                           resolved on the worker, each connect) */
    const char *prefix;                 /* deployment prefix, e.g. "/pdserve/prod/" */
    const char *key;                    /* own key below prefix, e.g. "routers/router-1" */
    const char *value;                  /* its value */
    uint32_t ttl_s;                     /* lease TTL, 1..3600 */
    const char *watch;                  /* sub-prefix to watch ("routers/") or NULL */
    void (*on_change)(void *arg);       /* loop thread: new snapshot / connection state */
    void *arg;
} pd_member_opts_t;

typedef struct pd_member pd_member_t;

/* Copy opts and start the worker. PD_ERR_BAD_INPUT (endpoint, ttl, a
 * string too long), PD_ERR_NO_MEMORY, PD_ERR_INTERNAL (thread). */
pd_status_t pd_member_start(struct event_base *base, const pd_member_opts_t *o,
                            pd_member_t **m_p);
/* Stop the worker (within a bounded time: the I/O timeouts), revoke the
 * lease best effort (the key goes at once), free. NULL-safe. Loop thread. */
void pd_member_stop(pd_member_t *m);

/* The last snapshot of the watched keys: copies at most cap entries,
 * returns how many there are. Any thread. */
uint32_t pd_member_snapshot(pd_member_t *m, pd_member_entry_t *out, uint32_t cap);
/* Connected to etcd with a live lease; the last error ("" if none). */
bool pd_member_connected(pd_member_t *m, char *err, size_t err_cap);

/* ---- the pieces (tests use them directly) ------------------------------ */

/* Base64 (standard alphabet, padded). out needs 4 * ceil(n / 3) + 1 bytes;
 * returns the length. Decode: -1 on a bad input or if it does not fit. */
size_t pd_b64_encode(const void *in, size_t n, char *out);
long pd_b64_decode(const char *in, size_t n, void *out, size_t cap);

/* One POST of a JSON body to http://endpoint/path with Connection: close:
 * the HTTP status (or a negative pd_status_t: PD_ERR_IO / PD_ERR_TIMED_OUT
 * / PD_ERR_TOO_BIG / PD_ERR_BAD_INPUT for a malformed reply) and the body
 * (de-chunked, NUL-terminated, malloc'd) in *body_p. Blocking, bounded by
 * timeout_ms overall. */
int pd_etcd_post(const char *endpoint, const char *path, const char *json, int timeout_ms,
                 char **body_p);

/* ---- signed values (pd_etcd_auth.c) ------------------------------------- */

/* Anyone who can write the etcd prefix could otherwise fill the routers/
 * keys or point daemons at their own address: every value a member puts
 * carries a MAC over its full key and payload with a key derived from the
 * deployment secret, and readers drop what does not verify.
 *
 *   value = payload " s1:" base64(HMAC-SHA256(key, full_key || 0x00 || payload)[0..16])
 *
 * key: 32 bytes, proto_auth_derive(secret, "pdserve etcd v1") in the
 * daemons (common knows no secret format). The MAC binds the key name, so
 * a signed value cannot be copied under another key; it carries no
 * expiry (a lease does): PROTOCOL.md "Threat model" says what that leaves.
 * The MAC is truncated to 128 bits to fit PD_MEMBER_VAL_MAX. */
#define PD_ETCD_SIG_KEY_LEN 32u
#define PD_ETCD_SIG_OVERHEAD 28u            /* " s1:" + 24 base64 characters */

/* The signed value of payload under full_key (prefix + key) into out.
 * PD_OK; PD_ERR_TOO_BIG if it does not fit cap (or PD_MEMBER_VAL_MAX);
 * PD_ERR_BAD_INPUT for a payload with a NUL-free but non-printable byte. */
pd_status_t pd_etcd_value_sign(const uint8_t key[PD_ETCD_SIG_KEY_LEN], const char *full_key,
                               const char *payload, char *out, size_t cap);
/* Check value under full_key; its payload into out on success. PD_OK;
 * PD_ERR_AUTH (no signature, a bad one, or one for another key);
 * PD_ERR_TOO_BIG (payload longer than cap - 1). Constant-time compare. */
pd_status_t pd_etcd_value_verify(const uint8_t key[PD_ETCD_SIG_KEY_LEN], const char *full_key,
                                 const char *value, char *out, size_t cap);
/* Is name a member id etcd keys may carry below their sub-prefix
 * ("router-1"): 1..max_len of [A-Za-z0-9._-], not "." or ".."? */
bool pd_etcd_key_ok(const char *name, size_t max_len);

#endif
