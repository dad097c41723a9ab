/* pd_blockname.h - the name of a full KV block, the same on every process
 * of a deployment: the daemons' prefix caches (kvxfer/kvx_prefix) store
 * blocks under it, the router indexes what each daemon holds by it and
 * names a new prompt's blocks with it. Pure: no state, no allocation.
 *
 * Block i of a token sequence (tokens [i*bt, (i+1)*bt), bt = block_tokens)
 * is named
 *   h(i) = XXH3-64(seed = compat, LE64(h(i-1)) || LE32(tokens of block i))
 * with h(-1) = the partition's root, pd_block_root(compat, partition):
 * compat itself (the deployment's compat hash: model + KV geometry) for
 * partition 0, the shared one. A cache partition (the router's hash of a
 * client's API key and cache_salt, docs/API.md) changes the root and so
 * every name after it: requests of two partitions never name a block
 * alike, so they never share one in any daemon's cache nor in the
 * router's index. Only full blocks are named; a partial block is never
 * shared. */
#ifndef PD_BLOCKNAME_H
#define PD_BLOCKNAME_H

#include <stdint.h>

/* The parent of block 0 in a partition: compat for partition 0, else
 * XXH3-64(seed = compat, "pdserve cache partition\0" || LE64(partition)),
 * never equal to compat. */
uint64_t pd_block_root(uint64_t compat, uint64_t partition);
/* Name of one block from its parent's name (the root for block 0). */
uint64_t pd_block_name(uint64_t parent, uint64_t compat, const int32_t *tokens,
                       uint32_t n_tokens);
/* Names of the full blocks of tokens[0..n_tokens) in that partition into
 * out[0..cap); returns how many were written (min(n_tokens / block_tokens,
 * cap); 0 when block_tokens is 0). */
uint32_t pd_block_names(uint32_t block_tokens, uint64_t compat, uint64_t partition,
                        const int32_t *tokens, uint32_t n_tokens, uint64_t *out, uint32_t cap);

#endif
