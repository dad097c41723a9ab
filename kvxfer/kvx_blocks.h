/* kvx_blocks.h - fixed-size KV block allocator over a registered region
 * (HAProxy pools: carved once at boot, recycled at run time).
 *
 * A free bitmap (allocation prefers the lowest run of n contiguous blocks,
 * else the n lowest free ones: few runs per lease, few gets per pull) plus
 * a per-block "allocated" byte so a double free or a foreign index is
 * refused instead of corrupting the pool.
 * Freeing goes through kvx_region_blocks_free first (refuses blocks still
 * pinned by a lease; poisons them in debug builds), so a block can never
 * be handed out again while an importer may still read it.
 * Loop thread only (like every kvx_* call). */
#ifndef KVX_BLOCKS_H
#define KVX_BLOCKS_H

#include <stdint.h>
#include "kvx.h"
#include "pd_status.h"

typedef struct kvx_blocks kvx_blocks_t;

/* Allocator for blocks [0, n_blocks) of region (region may be NULL for a
 * plain allocator, e.g. in tests). All free at start.
 * Expected: PD_ERR_NO_MEMORY, PD_ERR_BAD_INPUT (n_blocks 0). */
pd_status_t kvx_blocks_create(kvx_region_h *region, uint32_t n_blocks,
                              kvx_blocks_t **b_p);
void kvx_blocks_destroy(kvx_blocks_t *b); /* NULL-safe */

/* All-or-nothing: n blocks into out[0..n), ascending. Expected:
 * PD_ERR_NO_KV_SPACE (fewer than n free; nothing taken). n == 0 is PD_OK.
 * O(n_blocks / 64) for a contiguous run, O(n_blocks) when fragmented. */
pd_status_t kvx_blocks_alloc(kvx_blocks_t *b, uint32_t n, uint32_t *out);
/* Return blocks. Checks every index first (PD_ERR_BAD_INPUT: out of range
 * or not allocated, nothing freed), the region's pins (PD_ERR_BUSY: still
 * leased, nothing freed) and that nobody else holds a reference
 * (PD_ERR_BUSY: reference count above 1, nothing freed). */
pd_status_t kvx_blocks_free(kvx_blocks_t *b, const uint32_t *blocks, uint32_t n);

/* ---- references (shared blocks) ----------------------------------------
 * An allocated block has a reference count, 1 after kvx_blocks_alloc. Owners
 * that share a block (n > 1 sequences over one prompt, the prefix cache and
 * the sequences reading a cached block) each hold one reference; the block
 * goes back to the free set when the last one is dropped. A lease's pin
 * (kvx_region_block_pins) is separate: a pinned block is never freed, so an
 * importer can never read a reused block (the generation check covers it). */

/* +1 on each block. All-or-nothing: PD_ERR_BAD_INPUT (out of range or not
 * allocated), PD_ERR_TOO_BIG (count would overflow); nothing changed. A
 * block may appear several times (one reference each). */
pd_status_t kvx_blocks_ref(kvx_blocks_t *b, const uint32_t *blocks, uint32_t n);
/* -1 on each block; blocks that reach 0 are freed (as kvx_blocks_free).
 * All-or-nothing: PD_ERR_BAD_INPUT (out of range, not allocated, or more
 * drops than references), PD_ERR_BUSY (a block reaching 0 is still pinned by
 * a lease); nothing changed. *freed_p (may be NULL) = blocks freed. */
pd_status_t kvx_blocks_unref(kvx_blocks_t *b, const uint32_t *blocks, uint32_t n,
                             uint32_t *freed_p);
/* References on a block (0 = free; out of range = 0). */
uint32_t kvx_blocks_refs(const kvx_blocks_t *b, uint32_t block);
/* Leases pinning a block (0 without a region or out of range). */
unsigned kvx_blocks_pins(const kvx_blocks_t *b, uint32_t block);

uint32_t kvx_blocks_total(const kvx_blocks_t *b);
uint32_t kvx_blocks_free_count(const kvx_blocks_t *b);
uint32_t kvx_blocks_used(const kvx_blocks_t *b);

#endif
