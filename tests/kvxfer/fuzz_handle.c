/* fuzz_handle - libFuzzer target for handle decoding + validation.
 *
 * Input byte 0 selects the mode:
 *   even: the rest is a handle as received (almost always fails the MAC:
 *         exercises the pre-MAC structure checks)
 *   odd:  the rest is a handle body; the harness signs it with the key
 *         first, so the fuzzer reaches run decoding and semantic checks.
 * Invariants checked: decode never reads past len; an accepted handle
 * re-encodes to a valid handle that decodes to the same fields; every run
 * of an accepted+checked handle lies inside the region.
 *
 * Built with -fsanitize=fuzzer when -Dfuzz=true; otherwise fuzz_corpus.c
 * replays the committed corpus (suite 'fuzz'). */
#include "kvx_handle.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t fuzz_key[KVX_KEY_BYTES] = "kvxfer-fuzz-key-0123456789abcdef";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t buf[KVX_HANDLE_MAX_BYTES + 64];
    kvx_handle_t h, h2;
    kvx_reject_t reason;

    if (size < 1 || size - 1 > KVX_HANDLE_MAX_BYTES + 32)
        return 0;
    size_t len = size - 1;
    /* exact-size heap copy so ASan catches any read past len */
    uint8_t *in = malloc(len + KVX_TAG_BYTES + 1);
    memcpy(in, data + 1, len);
    if (data[0] & 1) {
        if (len >= KVX_TAG_BYTES)
            crypto_generichash(in + len - KVX_TAG_BYTES, KVX_TAG_BYTES, in,
                               len - KVX_TAG_BYTES, fuzz_key, KVX_KEY_BYTES);
        uint8_t *tight = malloc(len ? len : 1);
        memcpy(tight, in, len);
        free(in);
        in = tight;
    }
    pd_status_t st = kvx_handle_decode(in, len, fuzz_key, &h, &reason);
    if (st == PD_OK) {
        if (reason != KVX_REJECT_NONE || h.n_runs == 0 ||
            h.n_runs > KVX_HANDLE_MAX_RUNS || h.n_blocks > KVX_HANDLE_MAX_BLOCKS)
            abort();
        size_t len2;
        if (kvx_handle_encode(&h, fuzz_key, buf, sizeof(buf), &len2) != PD_OK)
            abort();
        if (kvx_handle_decode(buf, len2, fuzz_key, &h2, NULL) != PD_OK ||
            h2.n_runs != h.n_runs || h2.n_blocks != h.n_blocks ||
            h2.lease_gen != h.lease_gen ||
            memcmp(h2.runs, h.runs, sizeof(h.runs[0]) * h.n_runs) != 0)
            abort();
        uint64_t released[8] = { 0, 5, 0, 0, 0, 0, 0, 0 };
        kvx_handle_expect_t e = {
            .exporter_id = h.exporter_id,
            .incarnation = h.incarnation,
            .importer_id = h.importer_id,
            .region_id = h.region_id,
            .region_blocks = 1024,
            .block_bytes = h.block_bytes,
            .compat_hash = h.compat_hash,
            .n_lease_slots = 8,
            .released_gen = released,
            .now_wall_ns = 1000,
        };
        if (kvx_handle_check(&h, &e, &reason) == PD_OK) {
            for (unsigned i = 0; i < h.n_runs; i++)
                if ((uint64_t)h.runs[i].start + h.runs[i].count > 1024)
                    abort();
            if (h.lease_slot >= 8 || h.expiry_wall_ns <= 1000)
                abort();
        } else if (reason == KVX_REJECT_NONE) {
            abort();
        }
    } else if (reason == KVX_REJECT_NONE) {
        abort();
    }
    free(in);
    return 0;
}
