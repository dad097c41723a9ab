/* pd_idhash.h - an intrusive hash index of objects by their string id (the
 * request id every daemon looks messages up by). The object embeds a
 * pd_idhash_node_t and keeps its id alive while linked; lookups return the
 * node, and PD_CONTAINER_OF (pd_loop.h) gives the object back.
 * Loop thread only; no allocation. Ids come from clients (X-Request-Id):
 * chains are bounded by the daemon's cap on requests in flight. */
#ifndef PD_IDHASH_H
#define PD_IDHASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PD_IDHASH_BUCKETS 1024u

typedef struct pd_idhash_node {
    struct pd_idhash_node *next;  /* bucket chain */
    const char *id;               /* the object's id (NUL-terminated) */
} pd_idhash_node_t;

typedef struct {
    pd_idhash_node_t *b[PD_IDHASH_BUCKETS];
} pd_idhash_t;

static inline uint32_t pd_idhash_bucket(const char *id)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *id; id++)
        h = (h ^ (uint8_t)*id) * 16777619u;
    return h % PD_IDHASH_BUCKETS;
}

static inline pd_idhash_node_t *pd_idhash_find(const pd_idhash_t *t, const char *id)
{
    for (pd_idhash_node_t *n = t->b[pd_idhash_bucket(id)]; n != NULL; n = n->next)
        if (strcmp(n->id, id) == 0)
            return n;
    return NULL;
}

/* Link n under id (id must outlive the link; duplicates are the caller's
 * business: find first). */
static inline void pd_idhash_add(pd_idhash_t *t, pd_idhash_node_t *n, const char *id)
{
    uint32_t b = pd_idhash_bucket(id);
    n->id = id;
    n->next = t->b[b];
    t->b[b] = n;
}

/* Unlink n; a node that is not linked is left alone. */
static inline void pd_idhash_del(pd_idhash_t *t, pd_idhash_node_t *n)
{
    if (n->id == NULL)
        return;
    pd_idhash_node_t **pp = &t->b[pd_idhash_bucket(n->id)];
    while (*pp != NULL && *pp != n)
        pp = &(*pp)->next;
    if (*pp == n)
        *pp = n->next;
    n->next = NULL;
    n->id = NULL;
}

#endif
