/* eng_tok_heap.h - the one binary heap both BPE merge loops use (SentencePiece
 * bigrams by score, byte-level BPE pairs by merge rank), instantiated per
 * element type: ENG_TOK_HEAP_DEFINE(name, T, before) defines name_t and
 * name_push / name_pop, where before(a, b) says a pops before b. Private to
 * engine/tok. */
#ifndef ENG_TOK_HEAP_H
#define ENG_TOK_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#define ENG_TOK_HEAP_DEFINE(name, T, before)                                  \
    typedef struct {                                                          \
        T *a;                                                                 \
        size_t n, cap;                                                        \
    } name##_t;                                                               \
                                                                              \
    /* false on ENOMEM (the heap is unchanged) */                             \
    static bool name##_push(name##_t *h, T v)                                 \
    {                                                                         \
        if (h->n == h->cap) {                                                 \
            size_t nc = h->cap ? h->cap * 2 : 64;                             \
            T *na = realloc(h->a, nc * sizeof(*na));                          \
            if (na == NULL)                                                   \
                return false;                                                 \
            h->a = na;                                                        \
            h->cap = nc;                                                      \
        }                                                                     \
        size_t i = h->n++;                                                    \
        while (i > 0) {                                                       \
            size_t p = (i - 1) / 2;                                           \
            if (!before(&v, &h->a[p]))                                        \
                break;                                                        \
            h->a[i] = h->a[p];                                                \
            i = p;                                                            \
        }                                                                     \
        h->a[i] = v;                                                          \
        return true;                                                          \
    }                                                                         \
                                                                              \
    /* the first element; the heap must not be empty */                       \
    static T name##_pop(name##_t *h)                                          \
    {                                                                         \
        T top = h->a[0], last = h->a[--h->n];                                 \
        size_t i = 0;                                                         \
        for (;;) {                                                            \
            size_t c = 2 * i + 1;                                             \
            if (c >= h->n)                                                    \
                break;                                                        \
            if (c + 1 < h->n && before(&h->a[c + 1], &h->a[c]))               \
                c++;                                                          \
            if (!before(&h->a[c], &last))                                     \
                break;                                                        \
            h->a[i] = h->a[c];                                                \
            i = c;                                                            \
        }                                                                     \
        if (h->n > 0)                                                         \
            h->a[i] = last;                                                   \
        return top;                                                           \
    }

#endif
