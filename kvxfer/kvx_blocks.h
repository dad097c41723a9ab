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
 * or not allocated, nothing freed) and the region's pins (PD_ERR_BUSY:
 * still leased, nothing freed). */
pd_status_t kvx_blocks_free(kvx_blocks_t *b, const uint32_t *blocks, uint32_t n);

uint32_t kvx_blocks_total(const kvx_blocks_t *b);
uint32_t kvx_blocks_free_count(const kvx_blocks_t *b);
uint32_t kvx_blocks_used(const kvx_blocks_t *b);

#endif
