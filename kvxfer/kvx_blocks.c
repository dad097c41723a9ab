/* kvx_blocks.c - see kvx_blocks.h. */
#include "kvx_blocks.h"

#include <stdlib.h>

struct kvx_blocks {
    kvx_region_h *region;   /* may be NULL */
    uint32_t n_total;
    uint32_t n_free;
    uint32_t *stack;        /* (n_total) free block ids; [0, n_free) valid */
    uint8_t *used;          /* (n_total) 1 = allocated */
};

pd_status_t kvx_blocks_create(kvx_region_h *region, uint32_t n_blocks,
                              kvx_blocks_t **b_p)
{
    if (n_blocks == 0)
        return PD_ERR_BAD_INPUT;
    kvx_blocks_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        goto err;
    b->stack = malloc((size_t)n_blocks * sizeof(*b->stack));
    if (b->stack == NULL)
        goto err_b;
    b->used = calloc(n_blocks, 1);
    if (b->used == NULL)
        goto err_stack;
    b->region = region;
    b->n_total = n_blocks;
    b->n_free = n_blocks;
    /* lowest ids on top: block 0 is handed out first */
    for (uint32_t i = 0; i < n_blocks; i++)
        b->stack[i] = n_blocks - 1 - i;
    *b_p = b;
    return PD_OK;
err_stack:
    free(b->stack);
err_b:
    free(b);
err:
    return PD_ERR_NO_MEMORY;
}

void kvx_blocks_destroy(kvx_blocks_t *b)
{
    if (b == NULL)
        return;
    free(b->used);
    free(b->stack);
    free(b);
}

pd_status_t kvx_blocks_alloc(kvx_blocks_t *b, uint32_t n, uint32_t *out)
{
    if (n > b->n_free)
        return PD_ERR_NO_KV_SPACE;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = b->stack[--b->n_free];
        b->used[id] = 1;
        out[i] = id;
    }
    return PD_OK;
}

pd_status_t kvx_blocks_free(kvx_blocks_t *b, const uint32_t *blocks, uint32_t n)
{
    /* mark 1 -> 2 while checking: catches foreign ids and duplicates */
    uint32_t i;
    pd_status_t st = PD_OK;
    for (i = 0; i < n; i++) {
        if (blocks[i] >= b->n_total || b->used[blocks[i]] != 1) {
            st = PD_ERR_BAD_INPUT;
            break;
        }
        b->used[blocks[i]] = 2;
    }
    for (uint32_t j = 0; j < i; j++)
        b->used[blocks[j]] = 1;
    if (st != PD_OK)
        return st;
    if (b->region != NULL && n > 0) {
        st = kvx_region_blocks_free(b->region, blocks, n);
        if (st != PD_OK)
            return st;
    }
    for (i = 0; i < n; i++) {
        b->used[blocks[i]] = 0;
        b->stack[b->n_free++] = blocks[i];
    }
    return PD_OK;
}

uint32_t kvx_blocks_total(const kvx_blocks_t *b) { return b->n_total; }
uint32_t kvx_blocks_free_count(const kvx_blocks_t *b) { return b->n_free; }
uint32_t kvx_blocks_used(const kvx_blocks_t *b) { return b->n_total - b->n_free; }
