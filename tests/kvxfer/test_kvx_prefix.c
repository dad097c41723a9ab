/* test_kvx_prefix.c - block references (kvx_blocks_ref/unref) and the prefix
 * cache (kvx_prefix_*): names, longest-prefix match, partial blocks, LRU
 * eviction order, the cache never evicting a referenced block or one pinned
 * by a live lease (real UCX context, region and kvx_export), collisions;
 * a registered arena is resident and zero before the first request. */
#include "kvx.h"
#include "kvx_blocks.h"
#include "kvx_prefix.h"
#include "pd_blockname.h"

#include <event2/event.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BT 4
#define COMPAT 0xC0FFEEull

static void fill(int32_t *t, uint32_t n, int32_t base)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = base + (int32_t)i;
}

static void test_refs(void **state)
{
    (void)state;
    kvx_blocks_t *b;
    uint32_t a[3], freed = 99;
    assert_int_equal(kvx_blocks_create(NULL, 8, &b), PD_OK);
    assert_int_equal(kvx_blocks_alloc(b, 3, a), PD_OK);
    assert_int_equal(kvx_blocks_refs(b, a[0]), 1);
    assert_int_equal(kvx_blocks_ref(b, a, 2), PD_OK);
    assert_int_equal(kvx_blocks_refs(b, a[1]), 2);
    /* shared blocks cannot be freed by one owner */
    assert_int_equal(kvx_blocks_free(b, a, 1), PD_ERR_BUSY);
    /* all-or-nothing: a free block in the list changes nothing */
    uint32_t bad[2] = {a[0], 7};
    assert_int_equal(kvx_blocks_ref(b, bad, 2), PD_ERR_BAD_INPUT);
    assert_int_equal(kvx_blocks_refs(b, a[0]), 2);
    assert_int_equal(kvx_blocks_unref(b, bad, 2, &freed), PD_ERR_BAD_INPUT);
    assert_int_equal(kvx_blocks_refs(b, a[0]), 2);
    assert_int_equal(freed, 99);
    /* more drops than references in one call: refused, nothing changed */
    uint32_t thrice[3] = {a[2], a[2], a[2]};
    assert_int_equal(kvx_blocks_unref(b, thrice, 3, NULL), PD_ERR_BAD_INPUT);
    assert_int_equal(kvx_blocks_refs(b, a[2]), 1);
    /* duplicates count once each */
    uint32_t twice[2] = {a[0], a[0]};
    assert_int_equal(kvx_blocks_unref(b, twice, 2, &freed), PD_OK);
    assert_int_equal(freed, 1);
    assert_int_equal(kvx_blocks_refs(b, a[0]), 0);
    assert_int_equal(kvx_blocks_free_count(b), 6);
    assert_int_equal(kvx_blocks_unref(b, &a[1], 1, &freed), PD_OK);
    assert_int_equal(freed, 0);
    assert_int_equal(kvx_blocks_free(b, &a[1], 1), PD_OK); /* last owner */
    assert_int_equal(kvx_blocks_unref(b, &a[2], 1, &freed), PD_OK);
    assert_int_equal(freed, 1);
    assert_int_equal(kvx_blocks_free_count(b), 8);
    assert_int_equal(kvx_blocks_refs(b, 1000), 0);
    kvx_blocks_destroy(b);
}

static void test_names(void **state)
{
    (void)state;
    int32_t t[3 * BT], u[3 * BT];
    uint64_t n1[3], n2[3];
    fill(t, 3 * BT, 100);
    memcpy(u, t, sizeof(t));
    u[2 * BT] = 7; /* third block differs */
    assert_int_equal(kvx_prefix_names(BT, COMPAT, 0, t, 3 * BT, n1, 3), 3);
    assert_int_equal(kvx_prefix_names(BT, COMPAT, 0, u, 3 * BT, n2, 3), 3);
    assert_true(n1[0] == n2[0] && n1[1] == n2[1] && n1[2] != n2[2]);
    /* chained: block 1 depends on block 0 */
    u[0] = 5;
    assert_int_equal(kvx_prefix_names(BT, COMPAT, 0, u, 3 * BT, n2, 3), 3);
    assert_true(n1[1] != n2[1] && n1[2] != n2[2]);
    /* the compat hash is in every name */
    assert_int_equal(kvx_prefix_names(BT, COMPAT + 1, 0, t, 3 * BT, n2, 3), 3);
    assert_true(n1[0] != n2[0] && n1[2] != n2[2]);
    /* partial blocks have no name; cap respected */
    assert_int_equal(kvx_prefix_names(BT, COMPAT, 0, t, 3 * BT - 1, n2, 3), 2);
    assert_int_equal(kvx_prefix_names(BT, COMPAT, 0, t, 3 * BT, n2, 1), 1);
    assert_true(n2[0] == n1[0]);
    assert_true(n1[0] == kvx_prefix_name(COMPAT, COMPAT, t, BT));
}

typedef struct {
    int stored, removed;
    uint64_t last;
} events_t;

static void on_event(void *arg, kvx_prefix_event_t ev, uint64_t name)
{
    events_t *e = arg;
    if (ev == KVX_PREFIX_STORED)
        e->stored++;
    else
        e->removed++;
    e->last = name;
}

/* Cache partitions (issue 28 finding 4): the same tokens stored in one
 * partition are not found from another (nor from the shared partition 0),
 * and the names differ from the first block on, so the router's index
 * tells them apart too; the same partition still shares. */
static void test_partitions(void **state)
{
    (void)state;
    kvx_blocks_t *b;
    kvx_prefix_t *p;
    kvx_prefix_config_t cfg = {.block_tokens = BT, .compat_hash = COMPAT};
    assert_int_equal(kvx_blocks_create(NULL, 8, &b), PD_OK);
    assert_int_equal(kvx_prefix_create(b, &cfg, &p), PD_OK);
    const uint64_t pa = 0x1111, pb = 0x2222;
    int32_t t[3 * BT];
    uint32_t s[3], m[3];
    fill(t, 3 * BT, 500);
    assert_int_equal(kvx_prefix_alloc(p, 3, s), PD_OK);
    assert_int_equal(kvx_prefix_insert(p, pa, t, 3 * BT, s, 3, NULL), PD_OK);
    assert_int_equal(kvx_prefix_match(p, pb, t, 3 * BT, m, 3), 0);
    assert_int_equal(kvx_prefix_match(p, 0, t, 3 * BT, m, 3), 0);
    assert_int_equal(kvx_prefix_match(p, pa, t, 3 * BT, m, 3), 3);
    assert_memory_equal(m, s, sizeof(s));
    assert_int_equal(kvx_blocks_unref(b, m, 3, NULL), PD_OK);
    uint64_t na[3], nb[3], n0[3];
    assert_int_equal(kvx_prefix_names(BT, COMPAT, pa, t, 3 * BT, na, 3), 3);
    assert_int_equal(kvx_prefix_names(BT, COMPAT, pb, t, 3 * BT, nb, 3), 3);
    assert_int_equal(kvx_prefix_names(BT, COMPAT, 0, t, 3 * BT, n0, 3), 3);
    for (int i = 0; i < 3; i++)
        assert_true(na[i] != nb[i] && na[i] != n0[i] && nb[i] != n0[i]);
    /* partition 0 is the old chain: h(-1) = compat */
    assert_true(pd_block_root(COMPAT, 0) == COMPAT);
    assert_true(pd_block_root(COMPAT, pa) != COMPAT);
    assert_true(n0[0] == kvx_prefix_name(COMPAT, COMPAT, t, BT));
    assert_true(na[0] == kvx_prefix_name(pd_block_root(COMPAT, pa), COMPAT, t, BT));
    assert_int_equal(kvx_blocks_unref(b, s, 3, NULL), PD_OK);
    kvx_prefix_destroy(p);
    kvx_blocks_destroy(b);
}

static void test_match_insert_evict(void **state)
{
    (void)state;
    kvx_blocks_t *b;
    kvx_prefix_t *p;
    events_t ev = {0};
    kvx_prefix_config_t cfg = {.block_tokens = BT, .compat_hash = COMPAT,
                               .on_event = on_event, .arg = &ev};
    assert_int_equal(kvx_blocks_create(NULL, 8, &b), PD_OK);
    assert_int_equal(kvx_prefix_create(b, &(kvx_prefix_config_t){.block_tokens = 0}, &p),
                     PD_ERR_BAD_INPUT);
    assert_int_equal(kvx_prefix_create(b, &cfg, &p), PD_OK);

    /* sequence A: 3 full blocks + a partial one (14 tokens, 4 blocks) */
    int32_t ta[14], got[8];
    uint32_t sa[4], m[8], n_new = 0;
    fill(ta, 14, 1000);
    assert_int_equal(kvx_prefix_match(p, 0, ta, 13, m, 8), 0);
    assert_int_equal(kvx_prefix_alloc(p, 4, sa), PD_OK);
    assert_int_equal(kvx_prefix_insert(p, 0, ta, 14, sa, 4, &n_new), PD_OK);
    assert_int_equal(n_new, 3); /* the partial block is never cached */
    assert_int_equal(ev.stored, 3);
    assert_int_equal(kvx_blocks_refs(b, sa[0]), 2);
    assert_int_equal(kvx_blocks_refs(b, sa[3]), 1);
    /* inserting again adds nothing */
    assert_int_equal(kvx_prefix_insert(p, 0, ta, 14, sa, 4, &n_new), PD_OK);
    assert_int_equal(n_new, 0);
    /* sequence A finishes: its own references go, the cache keeps 3 */
    assert_int_equal(kvx_blocks_unref(b, sa, 4, NULL), PD_OK);
    assert_int_equal(kvx_blocks_free_count(b), 5);
    assert_int_equal(kvx_prefix_available(p), 8);
    /* the snapshot lists exactly the cached names, in pages */
    {
        uint64_t want[3], lst[4];
        uint32_t cur = 0, k = 0, got_n;
        assert_int_equal(kvx_prefix_names(BT, COMPAT, 0, ta, 14, want, 3), 3);
        while ((got_n = kvx_prefix_list(p, &cur, lst + k, 2)) > 0)
            k += got_n;
        assert_int_equal(k, 3);
        for (int i = 0; i < 3; i++)
            assert_true(lst[0] == want[i] || lst[1] == want[i] || lst[2] == want[i]);
        assert_int_equal(ev.last, want[2]);
    }

    /* sequence B shares the first 2 blocks and diverges in the third */
    int32_t tb[12];
    memcpy(tb, ta, sizeof(tb));
    tb[9] = -1;
    assert_int_equal(kvx_prefix_match(p, 0, tb, 11, m, 8), 2);
    assert_true(m[0] == sa[0] && m[1] == sa[1]);
    assert_int_equal(kvx_blocks_refs(b, sa[0]), 2);
    /* cap on the output */
    uint32_t one;
    assert_int_equal(kvx_prefix_match(p, 0, ta, 13, &one, 1), 1);
    assert_int_equal(kvx_blocks_unref(b, &one, 1, NULL), PD_OK);
    kvx_prefix_stats_t st;
    kvx_prefix_stats(p, &st);
    assert_int_equal(st.entries, 3);
    assert_int_equal(st.evictable, 1); /* sa[2]: B holds sa[0], sa[1] */
    assert_int_equal(st.hit_tokens, 3 * BT);

    /* pressure: 8 blocks wanted, 5 free + 1 evictable: refused, B's stay */
    uint32_t big[8];
    assert_int_equal(kvx_prefix_alloc(p, 8, big), PD_ERR_NO_KV_SPACE);
    assert_int_equal(ev.removed, 1); /* sa[2] was evicted trying */
    assert_int_equal(kvx_blocks_refs(b, sa[0]), 2);
    assert_int_equal(kvx_prefix_match(p, 0, ta, 13, m, 8), 2);
    assert_int_equal(kvx_blocks_unref(b, m, 2, NULL), PD_OK);
    /* B done: now everything can be evicted */
    uint32_t bm[2] = {sa[0], sa[1]};
    assert_int_equal(kvx_blocks_unref(b, bm, 2, NULL), PD_OK);
    assert_int_equal(kvx_prefix_alloc(p, 8, big), PD_OK);
    kvx_prefix_stats(p, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(ev.removed, 3);
    assert_int_equal(kvx_blocks_unref(b, big, 8, NULL), PD_OK);

    /* LRU: leaves go before their root; the least recently used chain first */
    int32_t tc[2 * BT], td[2 * BT];
    uint32_t sc[2], sd[2];
    fill(tc, 2 * BT, 1);
    fill(td, 2 * BT, 500);
    assert_int_equal(kvx_prefix_alloc(p, 2, sc), PD_OK);
    assert_int_equal(kvx_prefix_insert(p, 0, tc, 2 * BT, sc, 2, NULL), PD_OK);
    assert_int_equal(kvx_prefix_alloc(p, 2, sd), PD_OK);
    assert_int_equal(kvx_prefix_insert(p, 0, td, 2 * BT, sd, 2, NULL), PD_OK);
    assert_int_equal(kvx_blocks_unref(b, sc, 2, NULL), PD_OK);
    assert_int_equal(kvx_blocks_unref(b, sd, 2, NULL), PD_OK);
    assert_int_equal(kvx_prefix_match(p, 0, tc, 2 * BT, m, 8), 2); /* C now newest */
    assert_int_equal(kvx_blocks_unref(b, m, 2, NULL), PD_OK);
    assert_int_equal(kvx_prefix_evict(p, 1), 1);
    assert_int_equal(kvx_blocks_refs(b, sd[1]), 0); /* D's leaf first */
    assert_int_equal(kvx_blocks_refs(b, sd[0]), 1);
    assert_int_equal(kvx_prefix_evict(p, 1), 1);
    assert_int_equal(kvx_blocks_refs(b, sd[0]), 0);
    assert_int_equal(kvx_prefix_match(p, 0, tc, 2 * BT, m, 8), 2);
    assert_int_equal(kvx_blocks_unref(b, m, 2, NULL), PD_OK);

    /* the output of a match is the KV of the same tokens: a block cached
     * under one name is refused under another (the caller wrote into it) */
    fill(got, 8, 77);
    assert_int_equal(kvx_prefix_insert(p, 0, got, 8, sc, 2, &n_new), PD_ERR_BAD_INPUT);
    assert_int_equal(n_new, 0);
    kvx_prefix_destroy(p);
    assert_int_equal(kvx_blocks_free_count(b), 8); /* no leak */
    kvx_blocks_destroy(b);
}

/* max_entries bounds the cache; a full cache of referenced blocks stores
 * nothing more instead of evicting what is in use. */
static void test_cap(void **state)
{
    (void)state;
    kvx_blocks_t *b;
    kvx_prefix_t *p;
    kvx_prefix_config_t cfg = {.block_tokens = BT, .compat_hash = COMPAT,
                               .max_entries = 2};
    assert_int_equal(kvx_blocks_create(NULL, 8, &b), PD_OK);
    assert_int_equal(kvx_prefix_create(b, &cfg, &p), PD_OK);
    int32_t t[4 * BT];
    uint32_t s[4], n_new;
    fill(t, 4 * BT, 3);
    assert_int_equal(kvx_prefix_alloc(p, 4, s), PD_OK);
    assert_int_equal(kvx_prefix_insert(p, 0, t, 4 * BT, s, 4, &n_new), PD_OK);
    assert_int_equal(n_new, 2);
    kvx_prefix_stats_t st;
    kvx_prefix_stats(p, &st);
    assert_int_equal(st.entries, 2);
    assert_int_equal(kvx_blocks_unref(b, s, 4, NULL), PD_OK);
    assert_int_equal(kvx_blocks_free_count(b), 6);
    kvx_prefix_destroy(p);
    assert_int_equal(kvx_blocks_free_count(b), 8);
    kvx_blocks_destroy(b);
}

/* A real UCX context on a fresh event base. */
static kvx_ctx_h *ctx_open(uint64_t node_id, struct event_base **base)
{
    *base = event_base_new();
    assert_non_null(*base);
    kvx_config_t kc;
    kvx_config_default(&kc);
    kc.node_id = node_id;
    memset(kc.secret, 0x5a, sizeof(kc.secret));
    kvx_ctx_h *ctx;
    assert_int_equal(kvx_ctx_create(&kc, *base, &ctx), PD_OK);
    return ctx;
}

/* A cached block pinned by a live lease (real region, real kvx_export) is
 * neither evicted nor freed; once the lease ends it is. */
static void test_lease_pin(void **state)
{
    (void)state;
    struct event_base *base;
    kvx_ctx_h *ctx = ctx_open(11, &base);
    kvx_region_h *r;
    assert_int_equal(kvx_region_register(ctx, 1, 4096, 4, COMPAT, KVX_ALLOC_UCX, &r), PD_OK);
    kvx_blocks_t *b;
    kvx_prefix_t *p;
    assert_int_equal(kvx_blocks_create(r, 4, &b), PD_OK);
    kvx_prefix_config_t cfg = {.block_tokens = BT, .compat_hash = COMPAT};
    assert_int_equal(kvx_prefix_create(b, &cfg, &p), PD_OK);
    int32_t t[2 * BT];
    uint32_t s[2], m[2];
    fill(t, 2 * BT, 40);
    assert_int_equal(kvx_prefix_alloc(p, 2, s), PD_OK);
    assert_int_equal(kvx_prefix_insert(p, 0, t, 2 * BT, s, 2, NULL), PD_OK);
    uint8_t h[KVX_HANDLE_MAX_BYTES];
    size_t hl;
    kvx_lease_id_t lease;
    assert_int_equal(kvx_export(r, 22, s, 2, 10000000000ull, 1, h, sizeof(h), &hl, &lease),
                     PD_OK);
    /* the sequence ends while the importer may still read: its drop of the
     * references cannot free them (the cache holds one, the lease pins) */
    assert_int_equal(kvx_blocks_unref(b, s, 2, NULL), PD_OK);
    assert_int_equal(kvx_blocks_pins(b, s[0]), 1);
    assert_int_equal(kvx_prefix_evict(p, 2), 0);
    uint32_t all[4];
    assert_int_equal(kvx_prefix_alloc(p, 4, all), PD_ERR_NO_KV_SPACE);
    assert_int_equal(kvx_prefix_available(p), 2);
    /* a reuse during the lease shares the same blocks (read only) */
    assert_int_equal(kvx_prefix_match(p, 0, t, 2 * BT, m, 2), 2);
    assert_true(m[0] == s[0] && m[1] == s[1]);
    /* dropping the cache's last reference of a pinned block is refused */
    assert_int_equal(kvx_blocks_unref(b, m, 2, NULL), PD_OK);
    uint32_t twice[2] = {s[1], s[0]};
    assert_int_equal(kvx_blocks_unref(b, twice, 2, NULL), PD_ERR_BUSY);
    assert_int_equal(kvx_blocks_refs(b, s[1]), 1); /* rolled back */
    assert_int_equal(kvx_blocks_unref(b, s, 1, NULL), PD_ERR_BUSY);
    assert_int_equal(kvx_blocks_refs(b, s[0]), 1);
    /* lease over: evictable */
    assert_int_equal(kvx_lease_revoke(ctx, lease), PD_OK);
    assert_int_equal(kvx_blocks_pins(b, s[0]), 0);
    assert_int_equal(kvx_prefix_alloc(p, 4, all), PD_OK);
    assert_int_equal(kvx_blocks_unref(b, all, 4, NULL), PD_OK);
    kvx_prefix_destroy(p);
    kvx_blocks_destroy(b);
    kvx_region_deregister(r);
    kvx_ctx_destroy(ctx);
    event_base_free(base);
}

/* kvx's UCX tuning lands in the environment unless the operator set it
 * (or the variable it must agree with): the tcp pull speed of issue 15's
 * figures depends on it. */
static void test_ucx_env_defaults(void **state)
{
    (void)state;
    unsetenv("UCX_TCP_TX_SEG_SIZE");
    unsetenv("UCX_TCP_RX_SEG_SIZE");
    kvx_ucx_env_defaults();
    assert_non_null(getenv("UCX_TCP_TX_SEG_SIZE"));
    assert_string_equal(getenv("UCX_TCP_TX_SEG_SIZE"), "64K");
    setenv("UCX_TCP_TX_SEG_SIZE", "16K", 1); /* the operator's value wins */
    kvx_ucx_env_defaults();
    assert_string_equal(getenv("UCX_TCP_TX_SEG_SIZE"), "16K");
    unsetenv("UCX_TCP_TX_SEG_SIZE");
    setenv("UCX_TCP_RX_SEG_SIZE", "8K", 1); /* TX must stay <= RX: left alone */
    kvx_ucx_env_defaults();
    assert_null(getenv("UCX_TCP_TX_SEG_SIZE"));
    unsetenv("UCX_TCP_RX_SEG_SIZE");
}

/* kvx_region_register faults the whole arena in (no page fault on a
 * request's path), by either allocator, and the arena reads zero. */
static void test_region_resident(void **state)
{
    (void)state;
    struct event_base *base;
    kvx_ctx_h *ctx = ctx_open(12, &base);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), bb = 64 * 1024, nb = 64;
    const kvx_alloc_t allocs[2] = {KVX_ALLOC_UCX, KVX_ALLOC_OWN};
    for (unsigned a = 0; a < 2; a++) {
        kvx_region_h *r;
        assert_int_equal(kvx_region_register(ctx, 1 + a, bb, nb, COMPAT, allocs[a], &r), PD_OK);
        const uint8_t *p = kvx_region_base(r);
        size_t pages = bb * nb / page, resident = 0;
        unsigned char *vec = malloc(pages);
        assert_non_null(vec);
        assert_int_equal(mincore((void *)p, bb * nb, vec), 0);
        for (size_t i = 0; i < pages; i++)
            resident += vec[i] & 1;
        assert_int_equal(resident, pages);
        for (size_t i = 0; i < bb * nb; i += 4093)
            assert_int_equal(p[i], 0);
        free(vec);
        kvx_region_deregister(r);
    }
    kvx_ctx_destroy(ctx);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ucx_env_defaults),
        cmocka_unit_test(test_refs),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_match_insert_evict),
        cmocka_unit_test(test_partitions),
        cmocka_unit_test(test_cap),
        cmocka_unit_test(test_lease_pin),
        cmocka_unit_test(test_region_resident),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
