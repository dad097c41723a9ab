/* kvx_blocks.c - see kvx_blocks.h. */
#include "kvx_blocks.h"

#include <stdbool.h>
#include <stdlib.h>

/* Free blocks are a bitmap; allocation takes the lowest-addressed run of n
 * contiguous free blocks if there is one, else the n lowest free blocks, so
 * a lease needs few runs (kvx_export allows 64) and pulls merge into few
 * gets. */
struct kvx_blocks {
    kvx_region_h *region;   /* may be NULL */
    uint32_t n_total;
    uint32_t n_free;
    uint64_t *freebits;     /* (ceil(n_total / 64)) bit set = free */
    uint8_t *used;          /* (n_total) 1 = allocated */
    uint32_t *refs;         /* (n_total) references, 0 when free */
};

#define KVX_BLOCK_REFS_MAX 0x7fffffffu

static inline bool bit_free(const kvx_blocks_t *b, uint32_t i)
{
    return (b->freebits[i >> 6] >> (i & 63)) & 1u;
}

pd_status_t kvx_blocks_create(kvx_region_h *region, uint32_t n_blocks,
                              kvx_blocks_t **b_p)
{
    if (n_blocks == 0)
        return PD_ERR_BAD_INPUT;
    kvx_blocks_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        goto err;
    uint32_t words = (n_blocks + 63) / 64;
    b->freebits = calloc(words, sizeof(*b->freebits));
    if (b->freebits == NULL)
        goto err_b;
    b->used = calloc(n_blocks, 1);
    if (b->used == NULL)
        goto err_bits;
    b->refs = calloc(n_blocks, sizeof(*b->refs));
    if (b->refs == NULL)
        goto err_used;
    b->region = region;
    b->n_total = n_blocks;
    b->n_free = n_blocks;
    for (uint32_t i = 0; i < n_blocks; i++)
        b->freebits[i >> 6] |= 1ull << (i & 63);
    *b_p = b;
    return PD_OK;
err_used:
    free(b->used);
err_bits:
    free(b->freebits);
err_b:
    free(b);
err:
    return PD_ERR_NO_MEMORY;
}

void kvx_blocks_destroy(kvx_blocks_t *b)
{
    if (b == NULL)
        return;
    free(b->refs);
    free(b->used);
    free(b->freebits);
    free(b);
}

static void take(kvx_blocks_t *b, uint32_t id)
{
    b->freebits[id >> 6] &= ~(1ull << (id & 63));
    b->used[id] = 1;
    b->refs[id] = 1;
    b->n_free--;
}

pd_status_t kvx_blocks_alloc(kvx_blocks_t *b, uint32_t n, uint32_t *out)
{
    if (n > b->n_free)
        return PD_ERR_NO_KV_SPACE;
    if (n == 0)
        return PD_OK;
    /* 1: lowest run of n contiguous free blocks (whole empty words skipped) */
    uint32_t run_start = 0, run_len = 0;
    for (uint32_t i = 0; i < b->n_total && run_len < n;) {
        uint64_t w = b->freebits[i >> 6];
        if ((i & 63) == 0 && w == 0) {
            run_len = 0;
            i += 64;
            continue;
        }
        if (bit_free(b, i)) {
            if (run_len++ == 0)
                run_start = i;
        } else {
            run_len = 0;
        }
        i++;
    }
    if (run_len == n) {
        for (uint32_t k = 0; k < n; k++) {
            out[k] = run_start + k;
            take(b, run_start + k);
        }
        return PD_OK;
    }
    /* 2: the n lowest free blocks (fewest runs we can do cheaply) */
    uint32_t k = 0;
    for (uint32_t i = 0; i < b->n_total && k < n; i++)
        if (bit_free(b, i))
            out[k++] = i;
    for (uint32_t j = 0; j < k; j++)
        take(b, out[j]);
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
        if (b->refs[blocks[i]] > 1) {
            st = PD_ERR_BUSY;
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
        b->refs[blocks[i]] = 0;
        b->freebits[blocks[i] >> 6] |= 1ull << (blocks[i] & 63);
        b->n_free++;
    }
    return PD_OK;
}

pd_status_t kvx_blocks_ref(kvx_blocks_t *b, const uint32_t *blocks, uint32_t n)
{
    /* count in place, roll back on the first bad one (duplicates count) */
    uint32_t i;
    pd_status_t st = PD_OK;
    for (i = 0; i < n; i++) {
        uint32_t id = blocks[i];
        if (id >= b->n_total || b->used[id] == 0) {
            st = PD_ERR_BAD_INPUT;
            break;
        }
        if (b->refs[id] >= KVX_BLOCK_REFS_MAX) {
            st = PD_ERR_TOO_BIG;
            break;
        }
        b->refs[id]++;
    }
    if (st != PD_OK)
        while (i-- > 0)
            b->refs[blocks[i]]--;
    return st;
}

pd_status_t kvx_blocks_unref(kvx_blocks_t *b, const uint32_t *blocks, uint32_t n,
                             uint32_t *freed_p)
{
    /* 1: drop tentatively; any block reaching 0 must not be leased */
    uint32_t i;
    pd_status_t st = PD_OK;
    for (i = 0; i < n; i++) {
        uint32_t id = blocks[i];
        if (id >= b->n_total || b->used[id] == 0 || b->refs[id] == 0) {
            st = PD_ERR_BAD_INPUT;
            break;
        }
        if (--b->refs[id] == 0 && b->region != NULL &&
            kvx_region_block_pins(b->region, id) > 0) {
            i++;
            st = PD_ERR_BUSY;
            break;
        }
    }
    if (st != PD_OK) {
        while (i-- > 0)
            b->refs[blocks[i]]++;
        return st;
    }
    /* 2: free the ones at 0 (each once: refs is 0 only after its last drop;
     * used goes 1 -> 0 below so a duplicate is skipped) */
    uint32_t freed = 0;
    for (i = 0; i < n; i++) {
        uint32_t id = blocks[i];
        if (b->refs[id] != 0 || b->used[id] == 0)
            continue;
        if (b->region != NULL)
            (void)kvx_region_blocks_free(b->region, &id, 1); /* unpinned: checked */
        b->used[id] = 0;
        b->freebits[id >> 6] |= 1ull << (id & 63);
        b->n_free++;
        freed++;
    }
    if (freed_p != NULL)
        *freed_p = freed;
    return PD_OK;
}

uint32_t kvx_blocks_refs(const kvx_blocks_t *b, uint32_t block)
{
    return block < b->n_total ? b->refs[block] : 0;
}

unsigned kvx_blocks_pins(const kvx_blocks_t *b, uint32_t block)
{
    if (b->region == NULL || block >= b->n_total)
        return 0;
    return kvx_region_block_pins(b->region, block);
}

uint32_t kvx_blocks_total(const kvx_blocks_t *b) { return b->n_total; }
uint32_t kvx_blocks_free_count(const kvx_blocks_t *b) { return b->n_free; }
uint32_t kvx_blocks_used(const kvx_blocks_t *b) { return b->n_total - b->n_free; }
