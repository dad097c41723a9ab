/* pd_blockname.c - see pd_blockname.h. */
#include "pd_blockname.h"

#include <stddef.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

uint64_t pd_block_name(uint64_t parent, uint64_t compat, const int32_t *tokens,
                       uint32_t n_tokens)
{
    /* explicit little-endian bytes: names agree across hosts */
    XXH3_state_t s;
    uint8_t buf[8 + 4 * 64];
    (void)XXH3_64bits_reset_withSeed(&s, compat);
    for (int k = 0; k < 8; k++)
        buf[k] = (uint8_t)(parent >> (8 * k));
    (void)XXH3_64bits_update(&s, buf, 8);
    for (uint32_t i = 0; i < n_tokens;) {
        uint32_t m = 0;
        for (; i < n_tokens && m < 64; i++, m++) {
            uint32_t t = (uint32_t)tokens[i];
            buf[4 * m] = (uint8_t)t;
            buf[4 * m + 1] = (uint8_t)(t >> 8);
            buf[4 * m + 2] = (uint8_t)(t >> 16);
            buf[4 * m + 3] = (uint8_t)(t >> 24);
        }
        (void)XXH3_64bits_update(&s, buf, 4 * (size_t)m);
    }
    return XXH3_64bits_digest(&s);
}

uint64_t pd_block_root(uint64_t compat, uint64_t partition)
{
    if (partition == 0)
        return compat;
    static const char tag[] = "pdserve cache partition";
    uint8_t buf[sizeof(tag) + 8];
    for (size_t k = 0; k < sizeof(tag); k++)
        buf[k] = (uint8_t)tag[k];
    for (int k = 0; k < 8; k++)
        buf[sizeof(tag) + k] = (uint8_t)(partition >> (8 * k));
    uint64_t root = XXH3_64bits_withSeed(buf, sizeof(buf), compat);
    return root != compat ? root : root ^ 1; /* never the shared partition's */
}

uint32_t pd_block_names(uint32_t block_tokens, uint64_t compat, uint64_t partition,
                        const int32_t *tokens, uint32_t n_tokens, uint64_t *out, uint32_t cap)
{
    if (block_tokens == 0)
        return 0;
    uint32_t n = n_tokens / block_tokens;
    if (n > cap)
        n = cap;
    uint64_t parent = pd_block_root(compat, partition);
    for (uint32_t i = 0; i < n; i++) {
        parent = pd_block_name(parent, compat, tokens + (size_t)i * block_tokens, block_tokens);
        out[i] = parent;
    }
    return n;
}
