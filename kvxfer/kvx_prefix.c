/* kvx_prefix.c - see kvx_prefix.h. */
#include "kvx_prefix.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "pd_blockname.h"

#define NIL UINT32_MAX
#define KVX_PREFIX_MAX_BLOCK_TOKENS 4096u

/* One entry per block id (a block is cached under at most one name).
 * Buckets chain entries by name; a doubly linked list orders them by use
 * (head = least recently used). */
typedef struct {
    uint64_t name;
    uint64_t parent;
    uint32_t bucket_next;
    uint32_t lru_prev, lru_next;
    bool cached;
} pfx_entry_t;

struct kvx_prefix {
    kvx_blocks_t *blocks;
    kvx_prefix_config_t cfg;
    uint32_t n_blocks;
    uint32_t max_entries;
    pfx_entry_t *ent;       /* (n_blocks) */
    int32_t *tokens;        /* (n_blocks, block_tokens) tokens of cached blocks */
    uint32_t *buckets;      /* (n_buckets) first entry or NIL */
    uint32_t n_buckets;     /* power of two >= 2 * n_blocks */
    uint32_t lru_head, lru_tail;
    kvx_prefix_stats_t st;
};

uint64_t kvx_prefix_name(uint64_t parent, uint64_t compat, const int32_t *tokens,
                         uint32_t n_tokens)
{
    return pd_block_name(parent, compat, tokens, n_tokens);
}

uint32_t kvx_prefix_names(uint32_t block_tokens, uint64_t compat, uint64_t partition,
                          const int32_t *tokens, uint32_t n_tokens, uint64_t *out, uint32_t cap)
{
    return pd_block_names(block_tokens, compat, partition, tokens, n_tokens, out, cap);
}

pd_status_t kvx_prefix_create(kvx_blocks_t *blocks, const kvx_prefix_config_t *cfg,
                              kvx_prefix_t **p_p)
{
    if (blocks == NULL || cfg == NULL || cfg->block_tokens == 0 ||
        cfg->block_tokens > KVX_PREFIX_MAX_BLOCK_TOKENS)
        return PD_ERR_BAD_INPUT;
    kvx_prefix_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        goto err;
    p->blocks = blocks;
    p->cfg = *cfg;
    p->n_blocks = kvx_blocks_total(blocks);
    p->max_entries = cfg->max_entries == 0 || cfg->max_entries > p->n_blocks
                         ? p->n_blocks : cfg->max_entries;
    p->n_buckets = 16;
    while (p->n_buckets < 2 * (uint64_t)p->n_blocks)
        p->n_buckets *= 2;
    p->ent = calloc(p->n_blocks, sizeof(*p->ent));
    if (p->ent == NULL)
        goto err_p;
    p->tokens = calloc((size_t)p->n_blocks * cfg->block_tokens, sizeof(*p->tokens));
    if (p->tokens == NULL)
        goto err_ent;
    p->buckets = malloc(p->n_buckets * sizeof(*p->buckets));
    if (p->buckets == NULL)
        goto err_tokens;
    memset(p->buckets, 0xff, p->n_buckets * sizeof(*p->buckets));
    p->lru_head = p->lru_tail = NIL;
    *p_p = p;
    return PD_OK;
err_tokens:
    free(p->tokens);
err_ent:
    free(p->ent);
err_p:
    free(p);
err:
    return PD_ERR_NO_MEMORY;
}

static uint32_t bucket_of(const kvx_prefix_t *p, uint64_t name)
{
    return (uint32_t)(name ^ (name >> 32)) & (p->n_buckets - 1);
}

static void lru_unlink(kvx_prefix_t *p, uint32_t id)
{
    pfx_entry_t *e = &p->ent[id];
    if (e->lru_prev != NIL)
        p->ent[e->lru_prev].lru_next = e->lru_next;
    else
        p->lru_head = e->lru_next;
    if (e->lru_next != NIL)
        p->ent[e->lru_next].lru_prev = e->lru_prev;
    else
        p->lru_tail = e->lru_prev;
    e->lru_prev = e->lru_next = NIL;
}

static void lru_push_tail(kvx_prefix_t *p, uint32_t id)
{
    pfx_entry_t *e = &p->ent[id];
    e->lru_prev = p->lru_tail;
    e->lru_next = NIL;
    if (p->lru_tail != NIL)
        p->ent[p->lru_tail].lru_next = id;
    else
        p->lru_head = id;
    p->lru_tail = id;
}

static void touch(kvx_prefix_t *p, uint32_t id)
{
    lru_unlink(p, id);
    lru_push_tail(p, id);
}

/* Cached block with this name, parent and tokens, NIL if none; *clash_p
 * (may be NULL) set when the name is cached with other content. */
static uint32_t find(const kvx_prefix_t *p, uint64_t name, uint64_t parent,
                     const int32_t *tokens, bool *clash_p)
{
    size_t bt = p->cfg.block_tokens;
    for (uint32_t id = p->buckets[bucket_of(p, name)]; id != NIL;
         id = p->ent[id].bucket_next) {
        const pfx_entry_t *e = &p->ent[id];
        if (e->name != name)
            continue;
        if (e->parent == parent &&
            memcmp(p->tokens + id * bt, tokens, bt * sizeof(*tokens)) == 0)
            return id;
        if (clash_p != NULL)
            *clash_p = true;
    }
    return NIL;
}

static void entry_remove(kvx_prefix_t *p, uint32_t id)
{
    pfx_entry_t *e = &p->ent[id];
    uint32_t *link = &p->buckets[bucket_of(p, e->name)];
    while (*link != id)
        link = &p->ent[*link].bucket_next;
    *link = e->bucket_next;
    lru_unlink(p, id);
    e->cached = false;
    p->st.entries--;
    if (p->cfg.on_event != NULL)
        p->cfg.on_event(p->cfg.arg, KVX_PREFIX_REMOVED, e->name);
}

static bool evictable(const kvx_prefix_t *p, uint32_t id)
{
    return kvx_blocks_refs(p->blocks, id) == 1 && kvx_blocks_pins(p->blocks, id) == 0;
}

uint32_t kvx_prefix_evict(kvx_prefix_t *p, uint32_t n)
{
    uint32_t done = 0;
    for (uint32_t id = p->lru_head; id != NIL && done < n;) {
        uint32_t next = p->ent[id].lru_next;
        if (evictable(p, id)) {
            entry_remove(p, id);
            (void)kvx_blocks_unref(p->blocks, &id, 1, NULL); /* last ref, unpinned */
            p->st.evicted++;
            done++;
        }
        id = next;
    }
    return done;
}

void kvx_prefix_destroy(kvx_prefix_t *p)
{
    if (p == NULL)
        return;
    for (uint32_t id = p->lru_head; id != NIL;) {
        uint32_t next = p->ent[id].lru_next;
        /* a leased block cannot be freed here; the daemon tears the
         * region down after its leases anyway */
        (void)kvx_blocks_unref(p->blocks, &id, 1, NULL);
        id = next;
    }
    free(p->buckets);
    free(p->tokens);
    free(p->ent);
    free(p);
}

uint32_t kvx_prefix_match(kvx_prefix_t *p, uint64_t partition, const int32_t *tokens,
                          uint32_t n_tokens, uint32_t *blocks_out, uint32_t cap)
{
    uint32_t bt = p->cfg.block_tokens;
    uint32_t n_full = n_tokens / bt, k = 0;
    uint64_t parent = pd_block_root(p->cfg.compat_hash, partition);
    p->st.lookups++;
    p->st.query_tokens += n_tokens;
    for (; k < n_full && k < cap; k++) {
        const int32_t *t = tokens + (size_t)k * bt;
        uint64_t name = kvx_prefix_name(parent, p->cfg.compat_hash, t, bt);
        uint32_t id = find(p, name, parent, t, NULL);
        if (id == NIL || kvx_blocks_ref(p->blocks, &id, 1) != PD_OK)
            break;
        blocks_out[k] = id;
        parent = name;
    }
    /* most recent last: the root ends up newest, leaves are evicted first */
    for (uint32_t i = k; i-- > 0;)
        touch(p, blocks_out[i]);
    p->st.hit_tokens += (uint64_t)k * bt;
    return k;
}

pd_status_t kvx_prefix_insert(kvx_prefix_t *p, uint64_t partition, const int32_t *tokens,
                              uint32_t n_tokens, const uint32_t *blocks, uint32_t n_blocks,
                              uint32_t *n_new_p)
{
    uint32_t bt = p->cfg.block_tokens;
    uint32_t n_full = n_tokens / bt, added = 0, k = 0;
    if (n_full > n_blocks)
        n_full = n_blocks;
    uint64_t parent = pd_block_root(p->cfg.compat_hash, partition);
    pd_status_t st = PD_OK;
    for (; k < n_full; k++) {
        const int32_t *t = tokens + (size_t)k * bt;
        uint32_t id = blocks[k];
        if (id >= p->n_blocks || kvx_blocks_refs(p->blocks, id) == 0) {
            st = PD_ERR_BAD_INPUT;
            break;
        }
        uint64_t name = kvx_prefix_name(parent, p->cfg.compat_hash, t, bt);
        bool clash = false;
        uint32_t have = find(p, name, parent, t, &clash);
        if (have == NIL && clash) {
            p->st.collisions++;
            break;
        }
        if (have != NIL) {
            /* cached already (this block or an equal copy) */
            touch(p, have);
            parent = name;
            continue;
        }
        if (p->ent[id].cached) {
            st = PD_ERR_BAD_INPUT; /* a cached block with other content */
            break;
        }
        if (p->st.entries >= p->max_entries && kvx_prefix_evict(p, 1) == 0)
            break;
        if (kvx_blocks_ref(p->blocks, &id, 1) != PD_OK)
            break;
        pfx_entry_t *e = &p->ent[id];
        e->name = name;
        e->parent = parent;
        e->cached = true;
        memcpy(p->tokens + (size_t)id * bt, t, (size_t)bt * sizeof(*t));
        uint32_t b = bucket_of(p, name);
        e->bucket_next = p->buckets[b];
        p->buckets[b] = id;
        e->lru_prev = e->lru_next = NIL;
        lru_push_tail(p, id);
        p->st.entries++;
        p->st.stored++;
        added++;
        if (p->cfg.on_event != NULL)
            p->cfg.on_event(p->cfg.arg, KVX_PREFIX_STORED, name);
        parent = name;
    }
    /* root newest (see kvx_prefix_match) */
    for (uint32_t i = k; i-- > 0;)
        if (blocks[i] < p->n_blocks && p->ent[blocks[i]].cached)
            touch(p, blocks[i]);
    if (n_new_p != NULL)
        *n_new_p = added;
    return st;
}

pd_status_t kvx_prefix_alloc(kvx_prefix_t *p, uint32_t n, uint32_t *out)
{
    uint32_t free_n = kvx_blocks_free_count(p->blocks);
    if (free_n < n)
        (void)kvx_prefix_evict(p, n - free_n);
    return kvx_blocks_alloc(p->blocks, n, out);
}

uint32_t kvx_prefix_available(const kvx_prefix_t *p)
{
    uint32_t n = kvx_blocks_free_count(p->blocks);
    for (uint32_t id = p->lru_head; id != NIL; id = p->ent[id].lru_next)
        n += evictable(p, id);
    return n;
}

uint32_t kvx_prefix_list(const kvx_prefix_t *p, uint32_t *cursor, uint64_t *out, uint32_t cap)
{
    uint32_t k = 0, id = *cursor;
    for (; id < p->n_blocks && k < cap; id++)
        if (p->ent[id].cached)
            out[k++] = p->ent[id].name;
    *cursor = id;
    return k;
}

void kvx_prefix_stats(const kvx_prefix_t *p, kvx_prefix_stats_t *out)
{
    *out = p->st;
    out->evictable = 0;
    for (uint32_t id = p->lru_head; id != NIL; id = p->ent[id].lru_next)
        out->evictable += evictable(p, id);
}
