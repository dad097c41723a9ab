/* rtr_kvindex.c - see rtr_kvindex.h. Chained hash table over a fixed entry
 * array with a free list; a name's entry lives while any backend holds it. */
#include "rtr_kvindex.h"

#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX
#define MAX_NAMES (1u << 26)

typedef struct {
    uint64_t name;
    uint64_t mask;      /* bit b: backend b holds it; 0 = entry free */
    uint32_t next;      /* bucket chain, or free list */
} kvi_entry_t;

struct rtr_kvindex {
    uint32_t max_names, per_backend;
    kvi_entry_t *ent;        /* (max_names) */
    uint32_t *buckets;       /* (n_buckets) first entry or NIL */
    uint32_t n_buckets;      /* power of two >= 2 * max_names */
    uint32_t free_head;
    uint32_t count[RTR_KVINDEX_MAX_BACKENDS];
    rtr_kvindex_stats_t st;
};

pd_status_t rtr_kvindex_create(uint32_t max_names, uint32_t per_backend, rtr_kvindex_t **x_p)
{
    if (max_names == 0 || max_names > MAX_NAMES || per_backend == 0 || per_backend > max_names)
        return PD_ERR_BAD_INPUT;
    rtr_kvindex_t *x = calloc(1, sizeof(*x));
    if (x == NULL)
        goto err;
    x->max_names = max_names;
    x->per_backend = per_backend;
    x->ent = malloc((size_t)max_names * sizeof(*x->ent));
    if (x->ent == NULL)
        goto err_x;
    x->n_buckets = 2;
    while (x->n_buckets < 2 * max_names)
        x->n_buckets *= 2;
    x->buckets = malloc((size_t)x->n_buckets * sizeof(*x->buckets));
    if (x->buckets == NULL)
        goto err_ent;
    memset(x->buckets, 0xff, (size_t)x->n_buckets * sizeof(*x->buckets));
    for (uint32_t i = 0; i < max_names; i++)
        x->ent[i] = (kvi_entry_t){ 0, 0, i + 1 < max_names ? i + 1 : NIL };
    x->free_head = 0;
    *x_p = x;
    return PD_OK;
err_ent:
    free(x->ent);
err_x:
    free(x);
err:
    return PD_ERR_NO_MEMORY;
}

void rtr_kvindex_destroy(rtr_kvindex_t *x)
{
    if (x == NULL)
        return;
    free(x->buckets);
    free(x->ent);
    free(x);
}

static uint32_t bucket_of(const rtr_kvindex_t *x, uint64_t name)
{
    uint64_t h = name * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> 32) & (x->n_buckets - 1);
}

static uint32_t find(const rtr_kvindex_t *x, uint64_t name, uint32_t **link_p)
{
    uint32_t *link = &x->buckets[bucket_of(x, name)];
    while (*link != NIL) {
        if (x->ent[*link].name == name) {
            if (link_p != NULL)
                *link_p = link;
            return *link;
        }
        link = &x->ent[*link].next;
    }
    return NIL;
}

bool rtr_kvindex_add(rtr_kvindex_t *x, uint32_t be, uint64_t name)
{
    if (be >= RTR_KVINDEX_MAX_BACKENDS)
        return false;
    uint64_t bit = 1ull << be;
    uint32_t id = find(x, name, NULL);
    if (id != NIL && (x->ent[id].mask & bit))
        return true;
    if (x->count[be] >= x->per_backend || (id == NIL && x->free_head == NIL)) {
        x->st.dropped++;
        return false;
    }
    if (id == NIL) {
        id = x->free_head;
        x->free_head = x->ent[id].next;
        uint32_t b = bucket_of(x, name);
        x->ent[id] = (kvi_entry_t){ name, 0, x->buckets[b] };
        x->buckets[b] = id;
        x->st.names++;
    }
    x->ent[id].mask |= bit;
    x->count[be]++;
    x->st.held++;
    return true;
}

/* Drop bit from entry id (found through *link); frees the entry when no
 * backend holds it any more. */
static void drop(rtr_kvindex_t *x, uint32_t *link, uint32_t id, uint32_t be)
{
    kvi_entry_t *e = &x->ent[id];
    e->mask &= ~(1ull << be);
    x->count[be]--;
    x->st.held--;
    if (e->mask == 0) {
        *link = e->next;
        e->next = x->free_head;
        x->free_head = id;
        x->st.names--;
    }
}

void rtr_kvindex_remove(rtr_kvindex_t *x, uint32_t be, uint64_t name)
{
    if (be >= RTR_KVINDEX_MAX_BACKENDS)
        return;
    uint32_t *link;
    uint32_t id = find(x, name, &link);
    if (id != NIL && (x->ent[id].mask & (1ull << be)))
        drop(x, link, id, be);
}

void rtr_kvindex_clear_backend(rtr_kvindex_t *x, uint32_t be)
{
    if (x == NULL || be >= RTR_KVINDEX_MAX_BACKENDS || x->count[be] == 0)
        return;
    uint64_t bit = 1ull << be;
    for (uint32_t b = 0; b < x->n_buckets && x->count[be] > 0; b++) {
        uint32_t *link = &x->buckets[b];
        while (*link != NIL) {
            uint32_t id = *link;
            if (x->ent[id].mask & bit) {
                drop(x, link, id, be);
                if (*link != id) /* the entry left the chain */
                    continue;
            }
            link = &x->ent[id].next;
        }
    }
}

uint32_t rtr_kvindex_count(const rtr_kvindex_t *x, uint32_t be)
{
    return x != NULL && be < RTR_KVINDEX_MAX_BACKENDS ? x->count[be] : 0;
}

void rtr_kvindex_match(const rtr_kvindex_t *x, const uint64_t *names, uint32_t n,
                       uint32_t out[RTR_KVINDEX_MAX_BACKENDS])
{
    memset(out, 0, RTR_KVINDEX_MAX_BACKENDS * sizeof(out[0]));
    if (x == NULL)
        return;
    uint64_t alive = 0;
    for (uint32_t b = 0; b < RTR_KVINDEX_MAX_BACKENDS; b++)
        if (x->count[b] > 0)
            alive |= 1ull << b;
    for (uint32_t i = 0; i < n && alive != 0; i++) {
        uint32_t id = find(x, names[i], NULL);
        uint64_t m = id != NIL ? x->ent[id].mask & alive : 0;
        for (uint64_t gone = alive & ~m; gone != 0; gone &= gone - 1)
            out[__builtin_ctzll(gone)] = i;
        alive = m;
        if (i + 1 == n)
            for (; m != 0; m &= m - 1)
                out[__builtin_ctzll(m)] = n;
    }
}

void rtr_kvindex_stats(const rtr_kvindex_t *x, rtr_kvindex_stats_t *out)
{
    *out = x->st;
}
