/* pd_etcd_auth.c - signed etcd values (see pd_etcd.h "signed values"): a
 * truncated HMAC-SHA256 (libsodium, as proto_auth.c) over the full key and
 * the payload, so only holders of the deployment secret can add members. */
#include "pd_etcd.h"

#include <string.h>

#include <sodium.h>

#define SIG_TAG " s1:"
#define SIG_MAC_LEN 16u
#define SIG_B64_LEN 24u

static void sig_mac(const uint8_t key[PD_ETCD_SIG_KEY_LEN], const char *full_key,
                    const char *payload, size_t plen, uint8_t mac[SIG_MAC_LEN])
{
    uint8_t full[crypto_auth_hmacsha256_BYTES];
    crypto_auth_hmacsha256_state st;
    static const uint8_t zero = 0;
    crypto_auth_hmacsha256_init(&st, key, PD_ETCD_SIG_KEY_LEN);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)full_key, strlen(full_key));
    crypto_auth_hmacsha256_update(&st, &zero, 1);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)payload, plen);
    crypto_auth_hmacsha256_final(&st, full);
    memcpy(mac, full, SIG_MAC_LEN);
    sodium_memzero(full, sizeof(full));
    sodium_memzero(&st, sizeof(st));
}

pd_status_t pd_etcd_value_sign(const uint8_t key[PD_ETCD_SIG_KEY_LEN], const char *full_key,
                               const char *payload, char *out, size_t cap)
{
    size_t plen = strlen(payload);
    for (size_t i = 0; i < plen; i++)
        if ((unsigned char)payload[i] < 0x20 || payload[i] == 0x7f)
            return PD_ERR_BAD_INPUT;
    size_t need = plen + PD_ETCD_SIG_OVERHEAD + 1;
    if (need > cap || need > PD_MEMBER_VAL_MAX)
        return PD_ERR_TOO_BIG;
    uint8_t mac[SIG_MAC_LEN];
    sig_mac(key, full_key, payload, plen, mac);
    memcpy(out, payload, plen);
    memcpy(out + plen, SIG_TAG, sizeof(SIG_TAG) - 1);
    pd_b64_encode(mac, sizeof(mac), out + plen + sizeof(SIG_TAG) - 1);
    return PD_OK;
}

pd_status_t pd_etcd_value_verify(const uint8_t key[PD_ETCD_SIG_KEY_LEN], const char *full_key,
                                 const char *value, char *out, size_t cap)
{
    size_t vlen = strlen(value);
    size_t tail = sizeof(SIG_TAG) - 1 + SIG_B64_LEN;
    if (vlen < tail || memcmp(value + vlen - tail, SIG_TAG, sizeof(SIG_TAG) - 1) != 0)
        return PD_ERR_AUTH;
    size_t plen = vlen - tail;
    uint8_t got[SIG_MAC_LEN + 2], want[SIG_MAC_LEN];
    if (pd_b64_decode(value + plen + sizeof(SIG_TAG) - 1, SIG_B64_LEN, got, sizeof(got)) !=
        (long)SIG_MAC_LEN)
        return PD_ERR_AUTH;
    sig_mac(key, full_key, value, plen, want);
    if (sodium_memcmp(got, want, SIG_MAC_LEN) != 0)
        return PD_ERR_AUTH;
    if (plen + 1 > cap)
        return PD_ERR_TOO_BIG;
    memcpy(out, value, plen);
    out[plen] = '\0';
    return PD_OK;
}

bool pd_etcd_key_ok(const char *name, size_t max_len)
{
    size_t n = strlen(name);
    if (n == 0 || n > max_len || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}
