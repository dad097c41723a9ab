/* kvx_prefix.h - prefix cache over the block allocator: full KV blocks
 * named by a chained hash, shared by reference, evicted LRU when unused.
 *
 * Block identity: block i of a token sequence (tokens [i*bt, (i+1)*bt), bt =
 * block_tokens) is named
 *   h(i) = XXH3-64(seed = compat, LE64(h(i-1)) || LE32(tokens of block i))
 * with h(-1) = pd_block_root(compat, partition): compat itself (the
 * deployment's compat hash: model + KV geometry, the one
 * kvx_region_register takes) in partition 0, else a hash of compat and the
 * request's cache partition (pd_blockname.h), so requests of two
 * partitions never match each other's blocks: the parent check of a lookup
 * holds at block 0 already. Equal names mean equal prefixes in one
 * partition, so a router can index names without tokens. Only full blocks are named; a
 * partial block is never shared.
 *
 * The cache holds one reference (kvx_blocks_ref) on every cached block and
 * keeps the block's parent name and tokens: a lookup checks both, so a hash
 * collision can never hand out another prefix's KV. A cached block whose only
 * reference is the cache's and which no lease pins is evictable; eviction
 * takes the least recently used first (a prefix's root is touched last, so
 * leaves go before their parents). A pinned or referenced block is never
 * evicted, and a cached block is never written: sequences only write blocks
 * they allocated themselves (the partial tail and the new blocks).
 * Loop thread only. */
#ifndef KVX_PREFIX_H
#define KVX_PREFIX_H

#include <stdint.h>
#include "kvx_blocks.h"
#include "pd_status.h"

typedef struct kvx_prefix kvx_prefix_t;

typedef enum {
    KVX_PREFIX_STORED = 1,  /* a block with this name entered the cache */
    KVX_PREFIX_REMOVED = 2, /* it left the cache (evicted or cleared) */
} kvx_prefix_event_t;

typedef struct {
    uint32_t block_tokens;  /* tokens per block, 1..4096 */
    uint64_t compat_hash;   /* model + KV geometry */
    uint32_t max_entries;   /* cap on cached blocks; 0 = all blocks */
    /* optional: every store/removal, for the router's index */
    void (*on_event)(void *arg, kvx_prefix_event_t ev, uint64_t name);
    void *arg;
} kvx_prefix_config_t;

typedef struct {
    uint64_t lookups;       /* kvx_prefix_match calls */
    uint64_t query_tokens;  /* tokens offered to match */
    uint64_t hit_tokens;    /* tokens matched (full blocks) */
    uint64_t stored;        /* blocks that entered the cache */
    uint64_t evicted;       /* blocks evicted to make room */
    uint64_t collisions;    /* name present with other content: not cached */
    uint32_t entries;       /* blocks cached now */
    uint32_t evictable;     /* of which only the cache holds (and no lease) */
} kvx_prefix_stats_t;

/* Expected: PD_ERR_BAD_INPUT (block_tokens out of range), PD_ERR_NO_MEMORY. */
pd_status_t kvx_prefix_create(kvx_blocks_t *blocks, const kvx_prefix_config_t *cfg,
                              kvx_prefix_t **p_p);
/* Drops the cache's references (blocks still used elsewhere stay). */
void kvx_prefix_destroy(kvx_prefix_t *p); /* NULL-safe */

/* Name of one block from its parent's name (the partition's root,
 * pd_block_root, for block 0). */
uint64_t kvx_prefix_name(uint64_t parent, uint64_t compat, const int32_t *tokens,
                         uint32_t n_tokens);
/* Names of the full blocks of tokens[0..n_tokens) in that partition into
 * out[0..cap); returns how many were written (min(n_tokens / block_tokens,
 * cap)). */
uint32_t kvx_prefix_names(uint32_t block_tokens, uint64_t compat, uint64_t partition,
                          const int32_t *tokens, uint32_t n_tokens, uint64_t *out, uint32_t cap);

/* partition: the request's cache partition (0 = the shared one); match and
 * insert see only the blocks of that partition. */

/* Longest cached prefix of tokens[0..n_tokens) in full blocks (callers that
 * must compute at least one token pass n_tokens - 1). Takes one reference on
 * every matched block for the caller (drop with kvx_blocks_unref) and writes
 * their ids to blocks_out[0..cap). Returns the number of blocks matched. */
uint32_t kvx_prefix_match(kvx_prefix_t *p, uint64_t partition, const int32_t *tokens,
                          uint32_t n_tokens, uint32_t *blocks_out, uint32_t cap);

/* Offers a sequence's blocks (blocks[i] holds tokens [i*bt, (i+1)*bt)) to the
 * cache: each full block not cached yet takes a cache reference. A name
 * already cached in another block keeps the cached one. Stops at a collision
 * or when the cache is full of unevictable blocks. The caller keeps its own
 * references. Returns PD_OK (*n_new_p = blocks newly cached, may be NULL) or
 * PD_ERR_BAD_INPUT (a block not allocated, or already cached under another
 * name: the caller wrote into a shared block; nothing more inserted). */
pd_status_t kvx_prefix_insert(kvx_prefix_t *p, uint64_t partition, const int32_t *tokens,
                              uint32_t n_tokens, const uint32_t *blocks, uint32_t n_blocks,
                              uint32_t *n_new_p);

/* kvx_blocks_alloc that first evicts LRU evictable blocks when fewer than n
 * are free. Expected: PD_ERR_NO_KV_SPACE (not enough even after evicting;
 * nothing taken, but what was evicted stays evicted). */
pd_status_t kvx_prefix_alloc(kvx_prefix_t *p, uint32_t n, uint32_t *out);
/* Evict up to n evictable blocks, oldest first; returns how many. */
uint32_t kvx_prefix_evict(kvx_prefix_t *p, uint32_t n);
/* Free blocks + evictable cached blocks (what an admission check may count). */
uint32_t kvx_prefix_available(const kvx_prefix_t *p);

/* The names of the cached blocks, in block-id order, from *cursor (start
 * at 0) into out[0..cap); advances *cursor. Returns how many were written;
 * 0 once the end is reached. For a snapshot of the cache (the router's
 * index after a reconnect): no cache change may happen between calls. */
uint32_t kvx_prefix_list(const kvx_prefix_t *p, uint32_t *cursor, uint64_t *out, uint32_t cap);

void kvx_prefix_stats(const kvx_prefix_t *p, kvx_prefix_stats_t *out);

#endif
