/* test_sim.c - the "sim" engine: geometries, spec parsing, determinism, KV
 * checksum sensitivity, chunked = one-shot, batch invariance, prefix reuse,
 * timing-model accounting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "eng.h"
#include "eng_sim.h"
#include "eng_tok.h"

/* small geometry, every call fast */
#define SMALL "sim:layers=2,kv_heads=2,head_dim=8,vocab=300,ctx=512,no_sleep=1"
#define NB 8   /* blocks per sequence */

static eng_model_t *load(const char *spec, eng_kv_dtype_t dt, uint32_t block_tokens)
{
    const eng_ops_t *ops = eng_find("sim");
    eng_load_opts_t o = { .engine = "sim", .model_path = spec, .block_tokens = block_tokens,
                          .kv_dtype = dt };
    eng_model_t *m = NULL;
    char err[200] = "";

    assert_non_null(ops);
    assert_int_equal(ops->load(&o, &m, err, sizeof(err)), PD_OK);
    return m;
}

static int32_t argmax(const float *l, uint32_t n)
{
    uint32_t i, b = 0;

    for (i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return (int32_t)b;
}

static void make_tokens(int32_t *t, uint32_t n, uint32_t seed)
{
    uint32_t i;

    for (i = 0; i < n; i++)
        t[i] = (int32_t)((i * 2654435761u + seed * 40503u) % 256u);
}

/* ---- geometry ---- */

static void test_geometry(void **state)
{
    static const struct { const char *spec; uint64_t bpt_f16; uint32_t vocab; } cases[] = {
        { "llama3-8b", 128 * 1024, 128256 },
        { "llama3-70b", 320 * 1024, 128256 },
        { "qwen3-8b", 144 * 1024, 151936 },
        { "deepseek-v3", 70272, 129280 },   /* 61 x 576 x 2 B = 68.6 KiB */
        { "sim:layers=32,kv_heads=8,head_dim=128,vocab=32000,prefill_tps=8000,decode_ms=20+0.5*b",
          128 * 1024, 32000 },
    };
    const eng_ops_t *ops = eng_find("sim");
    uint64_t hashes[5];
    size_t i;

    (void)state;
    assert_non_null(ops);
    assert_string_equal(ops->name, "sim");
    for (i = 0; i < 5; i++) {
        eng_model_t *m16 = load(cases[i].spec, ENG_KV_F16, 0);
        eng_model_t *m32 = load(cases[i].spec, ENG_KV_F32, 32);
        const eng_kv_geom_t *g16 = ops->geometry(m16), *g32 = ops->geometry(m32);
        assert_int_equal(g16->bytes_per_token, cases[i].bpt_f16);
        assert_int_equal(g16->bytes_per_token, (uint64_t)g16->n_layers * 2 * g16->n_kv_heads *
                                                   g16->head_dim * 2);
        assert_int_equal(g16->block_tokens, 16);
        assert_int_equal(g16->block_bytes, 16 * cases[i].bpt_f16);
        assert_int_equal(g32->bytes_per_token, 2 * cases[i].bpt_f16);
        assert_int_equal(g32->block_bytes, 32 * 2 * cases[i].bpt_f16);
        assert_int_equal(g16->vocab_size, cases[i].vocab);
        assert_true(g16->compat_hash != g32->compat_hash);
        /* q8_0 (issue 32): 34 bytes per 32 values, its own compat hash */
        eng_model_t *m8 = load(cases[i].spec, ENG_KV_Q8_0, 0);
        const eng_kv_geom_t *g8 = ops->geometry(m8);
        assert_int_equal(g8->bytes_per_token, cases[i].bpt_f16 / 64 * 34);
        assert_int_equal(g8->block_bytes, 16 * g8->bytes_per_token);
        assert_int_equal(g8->kv_dtype, ENG_KV_Q8_0);
        assert_true(g8->compat_hash != g16->compat_hash);
        const uint64_t h8 = g8->compat_hash;
        ops->destroy(m8);
        /* q4_0 18, fp8_e4m3 33, bf16 64 bytes per 32 values; K and V apart
         * (k=q8_0, v=q4_0): 34 + 18 per 64 values; each its own hash */
        static const struct { eng_kv_dtype_t k, v; uint32_t per64; } dts[] = {
            { ENG_KV_Q4_0, ENG_KV_Q4_0, 36 }, { ENG_KV_FP8_E4M3, ENG_KV_FP8_E4M3, 66 },
            { ENG_KV_BF16, ENG_KV_BF16, 128 }, { ENG_KV_Q8_0, ENG_KV_Q4_0, 52 },
        };
        uint64_t dh[4];
        for (size_t d = 0; d < 4; d++) {
            eng_load_opts_t o = { .engine = "sim", .model_path = cases[i].spec,
                                  .kv_dtype = dts[d].k, .kv_split = true, .kv_dtype_v = dts[d].v };
            eng_model_t *md = NULL;
            char err[200] = "";
            assert_int_equal(ops->load(&o, &md, err, sizeof(err)), PD_OK);
            const eng_kv_geom_t *gd = ops->geometry(md);
            assert_int_equal(gd->bytes_per_token, cases[i].bpt_f16 / 128 * dts[d].per64);
            assert_int_equal(gd->kv_dtype_v, dts[d].v);
            dh[d] = gd->compat_hash;
            assert_true(dh[d] != g16->compat_hash && dh[d] != h8);
            for (size_t e = 0; e < d; e++)
                assert_true(dh[e] != dh[d]);
            ops->destroy(md);
        }
        hashes[i] = g16->compat_hash;
        ops->destroy(m16);
        ops->destroy(m32);
    }
    assert_true(hashes[0] != hashes[1] && hashes[0] != hashes[2] && hashes[0] != hashes[3]);
    /* llama3-8b geometry spelled out = same KV compatibility except vocab */
    assert_true(hashes[0] != hashes[4]);
    {
        eng_model_t *a = load("llama3-8b", ENG_KV_F16, 0);
        eng_model_t *b = load("sim:llama3-8b,speedup=50,decode_ms=1", ENG_KV_F16, 0);
        assert_int_equal(ops->geometry(a)->compat_hash, ops->geometry(b)->compat_hash);
        ops->destroy(a);
        ops->destroy(b);
    }
    {   /* q8_0 needs head_dim a multiple of 32 */
        eng_load_opts_t o = { .engine = "sim", .kv_dtype = ENG_KV_Q8_0,
                              .model_path = "sim:layers=32,kv_heads=8,head_dim=48,vocab=32000,"
                                            "prefill_tps=8000,decode_ms=20+0.5*b" };
        eng_model_t *m = NULL;
        char err[200] = "";
        assert_int_equal(ops->load(&o, &m, err, sizeof(err)), PD_ERR_BAD_INPUT);
        assert_null(m);
        assert_non_null(strstr(err, "head_dim"));
    }
    ops->destroy(NULL);
}

static void test_parse(void **state)
{
    eng_sim_params_t p;
    char err[200];
    static const char *const bad[] = {
        "nope", "layers=0", "layers=x", "kv_heads=999", "vocab=100", "decode_ms=5+", "decode_ms=5+2*q",
        "speedup=0", "no_sleep=2", "colour=red", "layers=2,llama3-8b", "prefill_tps=-1", "",
    };
    size_t i;

    (void)state;
    assert_int_equal(eng_sim_parse("sim:layers=32,kv_heads=8,head_dim=128,vocab=32000,"
                                   "prefill_tps=8000,decode_ms=20+0.5*b", &p, err, sizeof(err)), PD_OK);
    assert_string_equal(p.preset, "custom");
    assert_int_equal(p.n_layers, 32);
    assert_int_equal(p.vocab, 32000);
    assert_true(p.prefill_tps == 8000.0);
    assert_true(p.decode_a_ms == 20.0 && p.decode_b_ms == 0.5);
    assert_true(p.speedup == 1.0 && !p.no_sleep);
    assert_int_equal(eng_sim_parse("qwen3-8b,decode_ms=7,speedup=10,no_sleep=1", &p, err, sizeof(err)),
                     PD_OK);
    assert_string_equal(p.preset, "qwen3-8b");
    assert_int_equal(p.n_layers, 36);
    assert_true(p.decode_a_ms == 7.0 && p.decode_b_ms == 0.0 && p.speedup == 10.0 && p.no_sleep);
    assert_false(p.kv_sample);
    assert_int_equal(eng_sim_parse("kv_check=sample", &p, err, sizeof(err)), PD_OK);
    assert_true(p.kv_sample);
    assert_int_equal(eng_sim_parse("kv_check=full", &p, err, sizeof(err)), PD_OK);
    assert_false(p.kv_sample);
    assert_int_equal(eng_sim_parse("kv_check=some", &p, err, sizeof(err)), PD_ERR_BAD_INPUT);
    assert_int_equal(eng_sim_parse("decode_ms=3+1.5*batch", &p, err, sizeof(err)), PD_OK);
    assert_true(p.decode_b_ms == 1.5);
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]) - 1; i++) {
        err[0] = '\0';
        assert_int_equal(eng_sim_parse(bad[i], &p, err, sizeof(err)), PD_ERR_BAD_INPUT);
        assert_true(err[0] != '\0');
    }
    {
        char longspec[700];
        memset(longspec, 'a', sizeof(longspec) - 1);
        longspec[sizeof(longspec) - 1] = '\0';
        assert_int_equal(eng_sim_parse(longspec, &p, err, sizeof(err)), PD_ERR_TOO_BIG);
    }
}

/* ---- semantics ---- */

typedef struct {
    eng_model_t *m;
    const eng_ops_t *ops;
    const eng_kv_geom_t *g;
    uint8_t *arena;
    size_t arena_bytes;
} fx_t;

static void fx_init(fx_t *f, const char *spec, uint32_t n_blocks)
{
    f->ops = eng_find("sim");
    f->m = load(spec, ENG_KV_F16, 0);
    f->g = f->ops->geometry(f->m);
    f->arena_bytes = (size_t)n_blocks * f->g->block_bytes;
    f->arena = calloc(1, f->arena_bytes);
    assert_non_null(f->arena);
}

static void fx_fini(fx_t *f)
{
    f->ops->destroy(f->m);
    free(f->arena);
}

static void test_determinism_and_chunking(void **state)
{
    fx_t a, b;
    uint32_t bt_a[NB] = { 0, 1, 2, 3, 4, 5, 6, 7 }, bt_b[NB] = { 7, 3, 5, 0, 1, 2, 4, 6 };
    int32_t tok[60];
    float la[300], lb[300], lc[300];
    eng_decode_item_t it;
    uint32_t i;

    (void)state;
    fx_init(&a, SMALL, NB);
    fx_init(&b, SMALL, NB);
    make_tokens(tok, 60, 1);
    /* one shot vs chunks 10 + 20 + 7 into a permuted block table */
    assert_int_equal(a.ops->prefill(a.m, a.arena, bt_a, NB, tok, 37, 0, la), PD_OK);
    assert_int_equal(b.ops->prefill(b.m, b.arena, bt_b, NB, tok, 10, 0, NULL), PD_OK);
    assert_int_equal(b.ops->prefill(b.m, b.arena, bt_b, NB, tok + 10, 20, 10, lb), PD_OK);
    assert_int_equal(b.ops->prefill(b.m, b.arena, bt_b, NB, tok + 30, 7, 30, lb), PD_OK);
    assert_memory_equal(la, lb, sizeof(la));
    /* the first two blocks (full) hold the same bytes */
    for (i = 0; i < 2; i++)
        assert_memory_equal(a.arena + (size_t)bt_a[i] * a.g->block_bytes,
                            b.arena + (size_t)bt_b[i] * b.g->block_bytes, a.g->block_bytes);
    /* prefill(n) == prefill(n-1) + decode(last) */
    it.block_table = bt_b;
    it.n_blocks = NB;
    it.pos = 37;
    it.token = tok[37];
    assert_int_equal(a.ops->prefill(a.m, a.arena, bt_a, NB, tok + 37, 1, 37, la), PD_OK);
    assert_int_equal(b.ops->decode(b.m, b.arena, &it, 1, lb), PD_OK);
    assert_memory_equal(la, lb, sizeof(la));
    /* different history -> different logits; the greedy pick is printable */
    tok[5] ^= 1;
    assert_int_equal(a.ops->prefill(a.m, a.arena, bt_a, NB, tok, 38, 0, lc), PD_OK);
    assert_memory_not_equal(la, lc, sizeof(la));
    assert_true(argmax(la, 300) >= 32 && argmax(la, 300) < 127);
    /* only printable bytes and EOS can ever be sampled */
    for (i = 0; i < 300; i++) {
        if ((i >= 32 && i < 127) || i == 258)
            assert_true(la[i] > -100.0f);
        else
            assert_true(la[i] <= -1e8f);
    }
    fx_fini(&a);
    fx_fini(&b);
}

static void test_corruption_changes_token(void **state)
{
    fx_t f;
    uint32_t bt[NB] = { 3, 0, 6, 1, 4, 2, 7, 5 };
    int32_t tok[48];
    float ref[300], got[300];
    eng_decode_item_t it;
    uint32_t blk, probe, n_checked = 0;
    const uint32_t n_prompt = 40; /* 2 full blocks + 8 of the third (+1 decoded) */
    int32_t ref_tok;

    (void)state;
    fx_init(&f, SMALL, NB);
    make_tokens(tok, 48, 2);
    assert_int_equal(f.ops->prefill(f.m, f.arena, bt, NB, tok, n_prompt, 0, NULL), PD_OK);
    it.block_table = bt;
    it.n_blocks = NB;
    it.pos = n_prompt;
    it.token = tok[n_prompt];
    assert_int_equal(f.ops->decode(f.m, f.arena, &it, 1, ref), PD_OK);
    ref_tok = argmax(ref, 300);
    /* flip one byte at several places of every block the step reads */
    for (blk = 0; blk < 3; blk++) {
        /* slots the step reads without rewriting (pos 40 is rewritten by it) */
        uint32_t valid = blk < 2 ? 16 : n_prompt - 32;
        for (probe = 0; probe < 8; probe++) {
            uint32_t layer = probe % f.g->n_layers, kv = (probe / 2) % 2;
            uint32_t slot = (probe * 5) % valid;
            size_t row = (size_t)f.g->n_kv_heads * f.g->head_dim * 2;
            size_t off = (size_t)bt[blk] * f.g->block_bytes +
                         (((size_t)layer * 2 + kv) * f.g->block_tokens + slot) * row +
                         (probe * 7) % row;
            f.arena[off] ^= 0x10;
            assert_int_equal(f.ops->decode(f.m, f.arena, &it, 1, got), PD_OK);
            assert_memory_not_equal(ref, got, sizeof(ref));
            assert_int_not_equal(argmax(got, 300), ref_tok);
            f.arena[off] ^= 0x10;
            n_checked++;
        }
    }
    assert_int_equal(n_checked, 24);
    /* restored -> same answer again */
    assert_int_equal(f.ops->decode(f.m, f.arena, &it, 1, got), PD_OK);
    assert_memory_equal(ref, got, sizeof(ref));
    /* a lost block (zeroed) and a stale block (another sequence's) */
    memset(f.arena + (size_t)bt[1] * f.g->block_bytes, 0, f.g->block_bytes);
    assert_int_equal(f.ops->decode(f.m, f.arena, &it, 1, got), PD_OK);
    assert_int_not_equal(argmax(got, 300), ref_tok);
    fx_fini(&f);
}

/* the P/D path: KV prefilled in one arena, blocks copied ("transferred") to
 * other block ids of another arena, decode continues there = same tokens as
 * continuing in place; a prefix reused from a cache block gives the same too */
static void test_transfer_and_prefix_reuse(void **state)
{
    fx_t p, d;
    uint32_t bt_p[4] = { 5, 2, 7, 0 }, bt_d[4] = { 1, 3, 0, 6 }, i;
    int32_t tok[64];
    float lp[300], ld[300];
    eng_decode_item_t ip = { .block_table = bt_p, .n_blocks = 4 };
    eng_decode_item_t id = { .block_table = bt_d, .n_blocks = 4 };
    int32_t next;

    (void)state;
    fx_init(&p, SMALL, 8);
    fx_init(&d, SMALL, 8);
    make_tokens(tok, 64, 9);
    assert_int_equal(p.ops->prefill(p.m, p.arena, bt_p, 4, tok, 37, 0, lp), PD_OK);
    for (i = 0; i < 3; i++) /* 37 tokens live in 3 blocks */
        memcpy(d.arena + (size_t)bt_d[i] * d.g->block_bytes,
               p.arena + (size_t)bt_p[i] * p.g->block_bytes, p.g->block_bytes);
    next = argmax(lp, 300);
    for (i = 0; i < 8; i++) { /* 8 greedy steps on both sides */
        ip.pos = id.pos = 37 + i;
        ip.token = id.token = next;
        assert_int_equal(p.ops->decode(p.m, p.arena, &ip, 1, lp), PD_OK);
        assert_int_equal(d.ops->decode(d.m, d.arena, &id, 1, ld), PD_OK);
        assert_memory_equal(lp, ld, sizeof(lp));
        next = argmax(lp, 300);
    }
    /* prefix reuse: the first 32 tokens' blocks shared, the rest prefilled */
    memset(d.arena, 0, d.arena_bytes);
    for (i = 0; i < 2; i++)
        memcpy(d.arena + (size_t)bt_d[i] * d.g->block_bytes,
               p.arena + (size_t)bt_p[i] * p.g->block_bytes, p.g->block_bytes);
    assert_int_equal(p.ops->prefill(p.m, p.arena, bt_p, 4, tok, 40, 0, lp), PD_OK);
    assert_int_equal(d.ops->prefill(d.m, d.arena, bt_d, 4, tok + 32, 8, 32, ld), PD_OK);
    assert_memory_equal(lp, ld, sizeof(lp));
    fx_fini(&p);
    fx_fini(&d);
}

static void test_batch_invariance(void **state)
{
    fx_t f;
    uint32_t bts[3][4] = { { 0, 1, 2, 3 }, { 4, 5, 6, 7 }, { 8, 9, 10, 11 } };
    uint32_t lens[3] = { 5, 33, 17 };
    int32_t tok[3][64];
    float solo[3][300], batch[3 * 300];
    eng_decode_item_t items[3];
    uint32_t s;

    (void)state;
    fx_init(&f, SMALL, 12);
    for (s = 0; s < 3; s++) {
        make_tokens(tok[s], 64, 10 + s);
        assert_int_equal(f.ops->prefill(f.m, f.arena, bts[s], 4, tok[s], lens[s], 0, NULL), PD_OK);
        items[s].block_table = bts[s];
        items[s].n_blocks = 4;
        items[s].pos = lens[s];
        items[s].token = tok[s][lens[s]];
    }
    for (s = 0; s < 3; s++)
        assert_int_equal(f.ops->decode(f.m, f.arena, &items[s], 1, solo[s]), PD_OK);
    assert_int_equal(f.ops->decode(f.m, f.arena, items, 3, batch), PD_OK);
    for (s = 0; s < 3; s++)
        assert_memory_equal(solo[s], batch + (size_t)s * 300, sizeof(solo[s]));
    fx_fini(&f);
}

static void test_errors(void **state)
{
    fx_t f;
    uint32_t bt[2] = { 0, 1 };
    int32_t tok[40] = { 0 };
    float l[300];
    eng_decode_item_t it = { .block_table = bt, .n_blocks = 2, .pos = 0, .token = 300 };
    eng_load_opts_t o = { .engine = "sim", .model_path = "gpt-5", .kv_dtype = ENG_KV_F16 };
    eng_model_t *m = NULL;
    char err[200] = "";

    (void)state;
    fx_init(&f, SMALL, 2);
    assert_int_equal(f.ops->prefill(f.m, f.arena, bt, 2, tok, 33, 0, l), PD_ERR_NO_KV_SPACE);
    assert_int_equal(f.ops->prefill(f.m, f.arena, bt, 2, tok, 0, 0, l), PD_ERR_BAD_INPUT);
    assert_int_equal(f.ops->decode(f.m, f.arena, &it, 1, l), PD_ERR_BAD_INPUT);
    it.token = 1;
    it.pos = 600;
    assert_int_equal(f.ops->decode(f.m, f.arena, &it, 1, l), PD_ERR_TOO_BIG);
    fx_fini(&f);
    assert_int_equal(eng_find("sim")->load(&o, &m, err, sizeof(err)), PD_ERR_BAD_INPUT);
    assert_null(m);
    assert_non_null(strstr(err, "gpt-5"));
}

/* kv_check=sample: much less read, lost and stale blocks still detected */
static void test_kv_check_sample(void **state)
{
    fx_t f;
    uint32_t bt[NB] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    int32_t tok[64], other[64];
    float ref[300], got[300];
    eng_decode_item_t it = { .block_table = bt, .n_blocks = NB, .pos = 40 };
    eng_sim_stats_t st;
    uint8_t *saved;

    (void)state;
    fx_init(&f, "sim:layers=2,kv_heads=2,head_dim=64,vocab=300,no_sleep=1,kv_check=sample", NB);
    saved = malloc(f.g->block_bytes);
    assert_non_null(saved);
    make_tokens(tok, 64, 5);
    make_tokens(other, 64, 6);
    it.token = tok[40];
    assert_int_equal(f.ops->prefill(f.m, f.arena, bt, NB, tok, 40, 0, NULL), PD_OK);
    assert_int_equal(f.ops->decode(f.m, f.arena, &it, 1, ref), PD_OK);
    assert_true(eng_sim_stats(f.m, &st));
    assert_true(st.kv_bytes_hashed < 2 * 41 * f.g->bytes_per_token / 4);
    /* lost block */
    memcpy(saved, f.arena + f.g->block_bytes, f.g->block_bytes);
    memset(f.arena + f.g->block_bytes, 0, f.g->block_bytes);
    assert_int_equal(f.ops->decode(f.m, f.arena, &it, 1, got), PD_OK);
    assert_int_not_equal(argmax(got, 300), argmax(ref, 300));
    /* stale block: the same positions of another sequence */
    assert_int_equal(f.ops->prefill(f.m, f.arena, bt + 4, 4, other, 32, 0, NULL), PD_OK);
    memcpy(f.arena + f.g->block_bytes, f.arena + (size_t)bt[5] * f.g->block_bytes,
           f.g->block_bytes);
    assert_int_equal(f.ops->decode(f.m, f.arena, &it, 1, got), PD_OK);
    assert_int_not_equal(argmax(got, 300), argmax(ref, 300));
    /* restored */
    memcpy(f.arena + f.g->block_bytes, saved, f.g->block_bytes);
    assert_int_equal(f.ops->decode(f.m, f.arena, &it, 1, got), PD_OK);
    assert_memory_equal(ref, got, sizeof(ref));
    free(saved);
    fx_fini(&f);
}

/* ---- timing model ---- */

static void test_timing_accounting(void **state)
{
    fx_t f;
    uint32_t bt[4] = { 0, 1, 2, 3 };
    int32_t tok[64];
    float l[3 * 300];
    eng_decode_item_t items[3];
    eng_sim_stats_t st;
    const eng_sim_params_t *p;
    uint32_t i;

    (void)state;
    /* modeled: prefill 1000 tok/s, decode 10 + 2 * b ms; slept 100x faster */
    fx_init(&f, "sim:layers=2,kv_heads=2,head_dim=8,vocab=300,prefill_tps=1000,"
                "decode_ms=10+2*b,speedup=100", 4);
    p = eng_sim_params(f.m);
    assert_non_null(p);
    assert_int_equal(eng_sim_prefill_ns(p, 50), 50000000ull);
    assert_int_equal(eng_sim_decode_ns(p, 3), 16000000ull);
    make_tokens(tok, 64, 3);
    assert_int_equal(f.ops->prefill(f.m, f.arena, bt, 4, tok, 50, 0, l), PD_OK);
    for (i = 0; i < 3; i++) {
        items[i].block_table = bt;
        items[i].n_blocks = 4;
        items[i].pos = 50;
        items[i].token = tok[50];
    }
    assert_int_equal(f.ops->decode(f.m, f.arena, items, 3, l), PD_OK);
    assert_true(eng_sim_stats(f.m, &st));
    assert_int_equal(st.prefill_calls, 1);
    assert_int_equal(st.prefill_tokens, 50);
    assert_int_equal(st.decode_steps, 1);
    assert_int_equal(st.decode_items, 3);
    assert_int_equal(st.modeled_ns, 50000000ull + 16000000ull);
    assert_int_equal(st.target_ns, 500000ull + 160000ull);
    /* every call lasted at least its target: compute + sleep >= target, or late */
    assert_true(st.real_ns + st.slept_ns + 1000 >= st.target_ns);
    assert_true(st.slept_ns > 0 || st.late_ns > 0);
    assert_int_equal(st.kv_bytes_written, 53ull * f.g->bytes_per_token);
    assert_int_equal(st.kv_bytes_hashed, (50ull + 3 * 51) * f.g->bytes_per_token);
    fx_fini(&f);

    /* no_sleep: same accounting, never sleeps */
    fx_init(&f, "sim:layers=2,kv_heads=2,head_dim=8,vocab=300,prefill_tps=10,no_sleep=1", 4);
    assert_int_equal(f.ops->prefill(f.m, f.arena, bt, 4, tok, 20, 0, l), PD_OK);
    assert_true(eng_sim_stats(f.m, &st));
    assert_int_equal(st.modeled_ns, 2000000000ull);
    assert_int_equal(st.slept_ns, 0);
    assert_true(st.real_ns < 1000000000ull); /* 2 s modeled, nowhere near spent */
    fx_fini(&f);
}

/* a real-size preset moves real bytes: one block of llama3-8b = 2 MiB */
/* ---- layer-major layout and the layer hook ---- */

typedef struct {
    uint32_t calls, last_layer, pos_end[16];
} hook_rec_t;

static void rec_hook(void *arg, uint32_t layer, uint32_t pos_end)
{
    hook_rec_t *h = arg;
    /* layers come in order within one prefill call */
    assert_true(h->calls == 0 || layer == h->last_layer + 1 || layer == 0);
    h->last_layer = layer;
    if (h->calls < 16)
        h->pos_end[h->calls] = pos_end;
    h->calls++;
}

/* The same model on a layer-major arena (the daemons' layout) gives
 * bitwise the same logits and the same bytes per layer block, chunked and
 * with decode steps; the hook reports each layer of each chunk. Both the
 * full and the sampled KV check. */
static void layer_major_case(const char *spec)
{
    fx_t a, b;
    uint32_t bt[NB] = { 7, 3, 5, 0, 1, 2, 4, 6 };
    int32_t tok[60];
    float la[300], lb[300];
    hook_rec_t hr = { 0 };
    uint32_t i, l;

    fx_init(&a, spec, NB);
    fx_init(&b, spec, NB);
    eng_kv_layout_t lay = eng_kv_layout_layer_major(b.g, NB), bad = { 1, 1 };
    assert_int_equal(b.ops->set_kv_layout(b.m, &bad), PD_ERR_BAD_INPUT);
    assert_int_equal(b.ops->set_kv_layout(b.m, &lay), PD_OK);
    b.ops->set_layer_hook(b.m, rec_hook, &hr);
    make_tokens(tok, 60, 3);
    assert_int_equal(a.ops->prefill(a.m, a.arena, bt, NB, tok, 37, 0, la), PD_OK);
    assert_int_equal(b.ops->prefill(b.m, b.arena, bt, NB, tok, 20, 0, NULL), PD_OK);
    assert_int_equal(b.ops->prefill(b.m, b.arena, bt, NB, tok + 20, 17, 20, lb), PD_OK);
    assert_memory_equal(la, lb, sizeof(la));
    assert_int_equal(hr.calls, 2 * b.g->n_layers);
    assert_int_equal(hr.pos_end[0], 20);
    assert_int_equal(hr.pos_end[b.g->n_layers - 1], 20);
    assert_int_equal(hr.pos_end[b.g->n_layers], 37);
    b.ops->set_layer_hook(b.m, NULL, NULL);
    eng_decode_item_t it = { bt, NB, 37, tok[37] };
    assert_int_equal(a.ops->decode(a.m, a.arena, &it, 1, la), PD_OK);
    assert_int_equal(b.ops->decode(b.m, b.arena, &it, 1, lb), PD_OK);
    assert_memory_equal(la, lb, sizeof(la));
    assert_int_equal(hr.calls, 2 * b.g->n_layers); /* decode: no hook */
    /* every layer block of the 3 used blocks: same bytes, moved */
    const uint64_t lbb = b.g->layer_block_bytes;
    for (i = 0; i < 3; i++)
        for (l = 0; l < b.g->n_layers; l++)
            assert_memory_equal(a.arena + (size_t)bt[i] * a.g->block_bytes + l * lbb,
                                b.arena + ((size_t)l * NB + bt[i]) * lbb, lbb);
    fx_fini(&a);
    fx_fini(&b);
}

static void test_layer_major(void **state)
{
    (void)state;
    layer_major_case(SMALL);
    layer_major_case(SMALL ",kv_check=sample");
}

static void test_real_size_block(void **state)
{
    fx_t f;
    uint32_t bt[1] = { 0 };
    int32_t tok[16];
    float *l;
    eng_tok_t *bytetok;
    size_t i, nz = 0;

    (void)state;
    fx_init(&f, "llama3-8b,no_sleep=1", 1);
    assert_int_equal(f.g->block_bytes, 2u << 20);
    l = malloc((size_t)f.g->vocab_size * sizeof(float));
    assert_non_null(l);
    make_tokens(tok, 16, 4);
    assert_int_equal(f.ops->prefill(f.m, f.arena, bt, 1, tok, 16, 0, l), PD_OK);
    for (i = 0; i < f.arena_bytes; i += 4096)
        nz += f.arena[i] != 0 || f.arena[i + 1] != 0;
    assert_int_equal(nz, f.arena_bytes / 4096);
    /* the byte tokenizer covers the whole vocabulary and renders the pick */
    assert_int_equal(eng_tok_create_byte(f.g->vocab_size, &bytetok), PD_OK);
    {
        char buf[8];
        size_t n = eng_tok_token_piece(bytetok, argmax(l, f.g->vocab_size), false, buf, 8);
        assert_int_equal(n, 1);
        assert_true(buf[0] >= 32 && buf[0] < 127);
    }
    eng_tok_destroy(bytetok);
    free(l);
    fx_fini(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_determinism_and_chunking),
        cmocka_unit_test(test_corruption_changes_token),
        cmocka_unit_test(test_transfer_and_prefix_reuse),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_kv_check_sample),
        cmocka_unit_test(test_timing_accounting),
        cmocka_unit_test(test_real_size_block),
        cmocka_unit_test(test_layer_major),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
