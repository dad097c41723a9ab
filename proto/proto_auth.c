/* proto_auth.c - deployment secret parsing and HELLO / ACK MACs (libsodium). */
#include "proto_auth.h"

#include "pd_boot.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sodium.h>

static int hexval(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int is_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

pd_status_t proto_auth_secret_parse(const uint8_t *p, size_t len,
                                    proto_auth_secret_t *s_p)
{
    if (p == NULL && len > 0)
        return PD_ERR_BAD_INPUT;
    while (len > 0 && is_space(p[0])) {
        p++;
        len--;
    }
    while (len > 0 && is_space(p[len - 1]))
        len--;
    bool hex = len > 0 && len % 2 == 0;
    for (size_t i = 0; hex && i < len; i++)
        hex = hexval(p[i]) >= 0;
    size_t n = hex ? len / 2 : len;
    if (n < PROTO_AUTH_SECRET_MIN)
        return PD_ERR_BAD_INPUT;
    if (n > PROTO_AUTH_SECRET_MAX)
        return PD_ERR_TOO_BIG;
    proto_auth_secret_t s;
    memset(&s, 0, sizeof(s));
    if (hex) {
        for (size_t i = 0; i < n; i++)
            s.key[i] = (uint8_t)(hexval(p[2 * i]) << 4 | hexval(p[2 * i + 1]));
    } else {
        memcpy(s.key, p, n);
    }
    s.len = n;
    *s_p = s;
    sodium_memzero(&s, sizeof(s));
    return PD_OK;
}

pd_status_t proto_auth_secret_load(const char *path, proto_auth_secret_t *s_p)
{
    /* hex of the max secret plus whitespace fits; more is TOO_BIG */
    uint8_t buf[2 * PROTO_AUTH_SECRET_MAX + 64];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return PD_ERR_IO;
    size_t len = 0;
    for (;;) {
        if (len == sizeof(buf)) {
            close(fd);
            sodium_memzero(buf, sizeof(buf));
            return PD_ERR_TOO_BIG;
        }
        ssize_t r = read(fd, buf + len, sizeof(buf) - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            errno = e;
            return PD_ERR_IO;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    pd_status_t st = proto_auth_secret_parse(buf, len, s_p);
    sodium_memzero(buf, sizeof(buf));
    return st;
}

pd_status_t proto_auth_secret_resolve(const char *secret_file, const char *secret_text,
                                      bool insecure, const char *const *addrs, size_t n_addrs,
                                      const char *addrs_what, proto_auth_secret_t *s_p,
                                      bool *have_p, bool *warn_text_p, char *err, size_t err_len)
{
    const char *env = getenv("PD_SECRET");
    *have_p = false;
    *warn_text_p = false;
    if (secret_file != NULL && secret_file[0] != '\0') {
        pd_status_t st = proto_auth_secret_load(secret_file, s_p);
        if (st != PD_OK) {
            snprintf(err, err_len, "--secret-file %s: %s", secret_file,
                     st == PD_ERR_IO       ? strerror(errno)
                     : st == PD_ERR_TOO_BIG ? "too long (at most 256 bytes after hex decoding)"
                                            : "need at least 32 bytes (64 hex digits, or raw)");
            return PD_ERR_BAD_INPUT;
        }
    } else if ((secret_text != NULL && secret_text[0] != '\0') || (env != NULL && env[0] != '\0')) {
        bool arg = secret_text != NULL && secret_text[0] != '\0';
        const char *t = arg ? secret_text : env;
        if (proto_auth_secret_parse((const uint8_t *)t, strlen(t), s_p) != PD_OK) {
            snprintf(err, err_len, "%s: need at least 32 bytes (64 hex digits, or raw)",
                     arg ? "--secret" : "PD_SECRET");
            return PD_ERR_BAD_INPUT;
        }
        *warn_text_p = arg;
    } else if (!insecure) {
        snprintf(err, err_len, "no deployment secret: give --secret-file (or --secret, "
                 "PD_SECRET), or --insecure-no-auth on loopback");
        return PD_ERR_BAD_INPUT;
    } else {
        for (size_t i = 0; i < n_addrs; i++) {
            if (addrs[i] != NULL && !pd_addr_is_loopback(addrs[i])) {
                snprintf(err, err_len, "--insecure-no-auth needs loopback %s (%s is not)",
                         addrs_what, addrs[i]);
                return PD_ERR_BAD_INPUT;
            }
        }
        return PD_OK;
    }
    *have_p = true;
    return PD_OK;
}

pd_status_t proto_auth_boot_secret(const char *prog, const char *secret_file,
                                   const char *secret_text, bool insecure,
                                   const char *const *addrs, size_t n_addrs,
                                   const char *addrs_what, proto_auth_secret_t *s_p,
                                   bool *have_p)
{
    char err[512];
    bool warn = false;
    pd_status_t st = proto_auth_secret_resolve(secret_file, secret_text, insecure, addrs,
                                               n_addrs, addrs_what, s_p, have_p, &warn, err,
                                               sizeof(err));
    if (st != PD_OK) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return st;
    }
    if (warn)
        fprintf(stderr, "%s: warning: --secret given as text: on a command line it is "
                "visible to every local user (ps, /proc); prefer --secret-file\n", prog);
    return PD_OK;
}

void proto_auth_derive(const proto_auth_secret_t *s, const char *label,
                       uint8_t out[32])
{
    /* BLAKE2b keys are at most 64 bytes: hash longer secrets first */
    uint8_t key[crypto_generichash_KEYBYTES_MAX];
    size_t klen = s->len;
    if (klen > sizeof(key)) {
        crypto_generichash(key, sizeof(key), s->key, s->len, NULL, 0);
        klen = sizeof(key);
    } else {
        memcpy(key, s->key, klen);
    }
    crypto_generichash(out, 32, (const uint8_t *)label, strlen(label), key, klen);
    sodium_memzero(key, sizeof(key));
}

void proto_auth_secret_wipe(proto_auth_secret_t *s)
{
    if (s != NULL)
        sodium_memzero(s, sizeof(*s));
}

void proto_auth_nonce(uint8_t nonce[PROTO_AUTH_NONCE_LEN])
{
    /* idempotent, thread-safe; < 0 only if the RNG cannot start, and then
     * randombytes_buf aborts rather than return predictable bytes */
    if (sodium_init() < 0)
        abort();
    randombytes_buf(nonce, PROTO_AUTH_NONCE_LEN);
}

/* HMAC(secret, a || b || c) */
static void mac3(const proto_auth_secret_t *s, const uint8_t *a, size_t alen,
                 const uint8_t *b, size_t blen, const uint8_t *c, size_t clen,
                 uint8_t out[PROTO_AUTH_MAC_LEN])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, s->key, s->len);
    crypto_auth_hmacsha256_update(&st, a, alen);
    if (blen > 0)
        crypto_auth_hmacsha256_update(&st, b, blen);
    if (clen > 0)
        crypto_auth_hmacsha256_update(&st, c, clen);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof(st));
}

/* Encode msg, MAC its header + body-without-mac (+ b + c), write the mac
 * into out. */
static pd_status_t sign(const proto_auth_secret_t *s, const proto_msg_t *msg,
                        const uint8_t *b, size_t blen, const uint8_t *c, size_t clen,
                        uint8_t out[PROTO_AUTH_MAC_LEN])
{
    size_t need = 0;
    pd_status_t st = proto_msg_encode(msg, NULL, 0, &need);
    if (st != PD_ERR_NO_SPACE && st != PD_OK)
        return st;
    uint8_t *buf = malloc(need);   /* (need) one encoded frame */
    if (buf == NULL)
        return PD_ERR_NO_MEMORY;
    size_t len = 0;
    st = proto_msg_encode(msg, buf, need, &len);
    if (st == PD_OK) {
        const uint8_t *in;
        size_t in_len;
        st = proto_mac_input(buf, len, &in, &in_len);
        if (st == PD_OK)
            mac3(s, in, in_len, b, blen, c, clen, out);
    }
    free(buf);
    return st;
}

static pd_status_t verify(const proto_auth_secret_t *s, uint16_t type,
                          const uint8_t *frame, size_t len,
                          const uint8_t *b, size_t blen, const uint8_t *c, size_t clen)
{
    const uint8_t *in;
    size_t in_len;
    pd_status_t st = proto_mac_input(frame, len, &in, &in_len);
    if (st != PD_OK)
        return st;
    proto_hdr_t hdr;
    st = proto_hdr_decode(frame, len, &hdr);
    if (st != PD_OK)
        return st;
    if (hdr.type != type)
        return PD_ERR_BAD_TYPE;
    uint8_t mac[PROTO_AUTH_MAC_LEN];
    mac3(s, in, in_len, b, blen, c, clen, mac);
    /* the received mac is the last field: right after the MAC input */
    int bad = crypto_verify_32(mac, in + in_len);
    sodium_memzero(mac, sizeof(mac));
    return bad ? PD_ERR_AUTH : PD_OK;
}

pd_status_t proto_auth_hello_sign(const proto_auth_secret_t *s, proto_msg_t *msg,
                                  const uint8_t challenge[PROTO_AUTH_NONCE_LEN])
{
    if (msg->hdr.type != PROTO_MSG_HELLO)
        return PD_ERR_BAD_TYPE;
    return sign(s, msg, challenge, PROTO_AUTH_NONCE_LEN, NULL, 0, msg->u.hello.mac);
}

pd_status_t proto_auth_hello_verify(const proto_auth_secret_t *s,
                                    const uint8_t *frame, size_t len,
                                    const uint8_t challenge[PROTO_AUTH_NONCE_LEN])
{
    return verify(s, PROTO_MSG_HELLO, frame, len, challenge, PROTO_AUTH_NONCE_LEN,
                  NULL, 0);
}

pd_status_t proto_auth_ack_sign(const proto_auth_secret_t *s, proto_msg_t *msg,
                                const uint8_t hello_nonce[PROTO_AUTH_NONCE_LEN],
                                const uint8_t challenge[PROTO_AUTH_NONCE_LEN])
{
    if (msg->hdr.type != PROTO_MSG_REGISTER_ACK)
        return PD_ERR_BAD_TYPE;
    return sign(s, msg, hello_nonce, PROTO_AUTH_NONCE_LEN, challenge,
                PROTO_AUTH_NONCE_LEN, msg->u.register_ack.mac);
}

pd_status_t proto_auth_ack_verify(const proto_auth_secret_t *s,
                                  const uint8_t *frame, size_t len,
                                  const uint8_t hello_nonce[PROTO_AUTH_NONCE_LEN],
                                  const uint8_t challenge[PROTO_AUTH_NONCE_LEN])
{
    return verify(s, PROTO_MSG_REGISTER_ACK, frame, len, hello_nonce,
                  PROTO_AUTH_NONCE_LEN, challenge, PROTO_AUTH_NONCE_LEN);
}

void proto_auth_session_keys(const proto_auth_secret_t *s,
                             const uint8_t challenge[PROTO_AUTH_NONCE_LEN],
                             const uint8_t hello_nonce[PROTO_AUTH_NONCE_LEN],
                             bool acceptor, proto_auth_keys_t *k)
{
    uint8_t ctl[32], master[crypto_kdf_KEYBYTES];
    uint8_t c2a[PROTO_AUTH_TAG_LEN], a2c[PROTO_AUTH_TAG_LEN];
    crypto_generichash_state st;

    proto_auth_derive(s, "pdserve ctl v2", ctl);
    crypto_generichash_init(&st, ctl, sizeof(ctl), sizeof(master));
    crypto_generichash_update(&st, challenge, PROTO_AUTH_NONCE_LEN);
    crypto_generichash_update(&st, hello_nonce, PROTO_AUTH_NONCE_LEN);
    crypto_generichash_final(&st, master, sizeof(master));
    crypto_kdf_derive_from_key(c2a, sizeof(c2a), 1, "pdsvctl2", master);
    crypto_kdf_derive_from_key(a2c, sizeof(a2c), 2, "pdsvctl2", master);
    memcpy(k->send, acceptor ? a2c : c2a, PROTO_AUTH_TAG_LEN);
    memcpy(k->recv, acceptor ? c2a : a2c, PROTO_AUTH_TAG_LEN);
    sodium_memzero(ctl, sizeof(ctl));
    sodium_memzero(master, sizeof(master));
    sodium_memzero(c2a, sizeof(c2a));
    sodium_memzero(a2c, sizeof(a2c));
    sodium_memzero(&st, sizeof(st));
}

void proto_auth_frame_tag(const uint8_t key[PROTO_AUTH_TAG_LEN], uint64_t seq,
                          const uint8_t *frame, size_t len,
                          uint8_t tag[PROTO_AUTH_TAG_LEN])
{
    crypto_generichash_state st;
    uint8_t s8[8];
    for (int i = 0; i < 8; i++)
        s8[i] = (uint8_t)(seq >> (8 * i));
    crypto_generichash_init(&st, key, PROTO_AUTH_TAG_LEN, PROTO_AUTH_TAG_LEN);
    crypto_generichash_update(&st, s8, sizeof(s8));
    crypto_generichash_update(&st, frame, len);
    crypto_generichash_final(&st, tag, PROTO_AUTH_TAG_LEN);
}

pd_status_t proto_auth_frame_check(const uint8_t key[PROTO_AUTH_TAG_LEN], uint64_t seq,
                                   const uint8_t *frame, size_t len,
                                   const uint8_t tag[PROTO_AUTH_TAG_LEN])
{
    uint8_t want[PROTO_AUTH_TAG_LEN];
    proto_auth_frame_tag(key, seq, frame, len, want);
    int bad = crypto_verify_32(want, tag);
    sodium_memzero(want, sizeof(want));
    return bad ? PD_ERR_AUTH : PD_OK;
}

pd_status_t proto_auth_frame_next(const uint8_t *key, uint64_t *seq, uint32_t body_max,
                                  const uint8_t *buf, size_t len, proto_msg_t *msg,
                                  size_t *frame_len_p, size_t *mac_len_p)
{
    proto_hdr_t hdr;
    size_t need = PROTO_HDR_LEN;
    pd_status_t st = proto_frame_check(buf, len < PROTO_HDR_LEN ? len : PROTO_HDR_LEN,
                                       &hdr, &need);
    if (PD_IS_ERR(st))
        return st;
    if (len < PROTO_HDR_LEN) {
        *frame_len_p = PROTO_HDR_LEN;
        return PD_INPROGRESS;
    }
    if (body_max != 0 && hdr.body_len > body_max)
        return PD_ERR_TOO_BIG;
    bool tagged = (hdr.flags & PROTO_FLAG_AUTH) != 0;
    if (tagged != (key != NULL))
        return PD_ERR_AUTH;
    size_t total = need + (tagged ? PROTO_AUTH_TAG_LEN : 0);
    *frame_len_p = total;
    if (len < total)
        return PD_INPROGRESS;
    if (tagged) {
        if (proto_auth_frame_check(key, *seq, buf, need, buf + need) != PD_OK)
            return PD_ERR_AUTH;
        (*seq)++;
    }
    size_t flen = 0;
    st = proto_frame_next(buf, need, msg, &flen);
    if (st != PD_OK)
        return st == PD_INPROGRESS ? PD_ERR_INTERNAL : st;
    *mac_len_p = need;
    return PD_OK;
}
