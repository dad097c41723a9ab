/* ggml_qdot_amx.c - the AMX int8 tile kernels (issue 37) on the packed
 * layout, and the probe that says whether AMX is usable (ggml_qdot.h:
 * layouts and canonical results; moved out of ggml_qdot.c, issue 33's
 * file-size rule). */
#include <cpuid.h>
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "ggml_qdot_int.h"

/* AMX usable: CPUID AMX-TILE + AMX-INT8, XCR0 bits 17 (XTILECFG) and 18
 * (XTILEDATA), and the kernel's permission for XTILEDATA (Linux: asked
 * once, for the whole process: threads created before or after the request
 * have it). NULL if so, else why not. */
#define QDOT_ARCH_GET_XCOMP_PERM 0x1022
#define QDOT_ARCH_REQ_XCOMP_PERM 0x1023
#define QDOT_XFEATURE_XTILEDATA 18

const char *ggml_qdot_amx_probe(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25)))
        return "the CPU has no AMX-TILE / AMX-INT8 (CPUID 7.0:EDX bits 24, 25)";
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE))
        return "the OS has not enabled XSAVE (CPUID 1:ECX OSXSAVE)";
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17))
        return "the OS does not save tile state (XCR0 bits 17, 18 clear)";
    if (syscall(SYS_arch_prctl, QDOT_ARCH_REQ_XCOMP_PERM, QDOT_XFEATURE_XTILEDATA) != 0)
        return "the kernel refused XTILEDATA (arch_prctl ARCH_REQ_XCOMP_PERM)";
    unsigned long perm = 0;
    if (syscall(SYS_arch_prctl, QDOT_ARCH_GET_XCOMP_PERM, &perm) != 0 ||
        !(perm & (1ul << QDOT_XFEATURE_XTILEDATA)))
        return "XTILEDATA not in the process's permitted features (ARCH_GET_XCOMP_PERM)";
    return NULL;
}

/* ---- AMX on the packed layout (issue 37; see the header). Per group of
 * 16 rows: a segment of up to AMX_SEG blocks becomes signed int8 B tiles
 * on the stack (8 rows x 64 bytes per block: row t = the 16 rows' weights
 * 4t..4t + 3), then per 16 items and block one tdpbssd (K = 32) gives the
 * exact P_b of 16 items x 16 rows; the C tile is stored and each item's
 * row of it (16 rows in the lanes, as on VNNI) takes the same
 * convert / scale / fma as the VNNI kernel. Two tile sets alternate so the
 * next block's tdpbssd runs while this block's row is folded. ---- */
#define AMX_TARGET VNNI_TARGET ",amx-tile,amx-int8"
#define AMX_SEG 64 /* blocks per converted segment: 32 KB on the stack */
#define AMX_ITEMS GGML_QDOT_AMX_ITEMS

/* palette 1: tmm0/1 B (8 x 64 bytes), tmm2/3 A (16 items x 32 bytes),
 * tmm4..7 C (16 x 16 int32; q32_amx_t uses tmm4/5) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg_t;
_Static_assert(sizeof(amx_tilecfg_t) == 64, "ldtilecfg reads 64 bytes");
static const amx_tilecfg_t amx_cfg __attribute__((aligned(64))) = {
    1, 0, { 0 }, { 64, 64, 32, 32, 64, 64, 64, 64 }, { 8, 8, 16, 16, 16, 16, 16, 16 }
};
static __thread int amx_cfg_loaded; /* this thread ran ldtilecfg */

__attribute__((target(AMX_TARGET))) void ggml_qdot_amx_thread_init(void)
{
    if (!amx_cfg_loaded) {
        _tile_loadconfig(&amx_cfg);
        amx_cfg_loaded = 1;
    }
}

/* blocks [b0, b1) of packed group pg as signed B tiles at seg */
__attribute__((target(AMX_TARGET))) static void q32_amx_unpack(uint32_t type, const uint8_t *pg,
                                                               uint64_t b0, uint64_t b1,
                                                               uint8_t *seg)
{
    const q32_fmt_t fm = q32_fmt(type);
    const size_t qb = q32_pk_qbytes(type);
    const __m512i m = _mm512_set1_epi8(0x0F), x80 = _mm512_set1_epi8((char)0x80);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i_u *)ggml_iq4nl_values));
    for (uint64_t b = b0; b < b1; b++) {
        const uint8_t *q = pg + b * qb;
        uint8_t *o = seg + (b - b0) * 512;
        if (fm.form == Q32_BYTE) { /* w + 128 -> w */
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++)
                _mm512_store_si512(o + 64 * t, _mm512_xor_si512(_mm512_loadu_si512(q + 64 * t), x80));
            continue;
        }
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
            const __m512i x = _mm512_loadu_si512(q + 64 * t);
            __m512i lo = _mm512_and_si512(x, m), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m);
            if (fm.form == Q32_LUT) {
                lo = _mm512_shuffle_epi8(lut, lo);
                hi = _mm512_shuffle_epi8(lut, hi);
            } else if (type == GGML_TYPE_Q4_0) {
                lo = _mm512_sub_epi8(lo, _mm512_set1_epi8(8));
                hi = _mm512_sub_epi8(hi, _mm512_set1_epi8(8));
            }
            _mm512_store_si512(o + 64 * t, lo);
            _mm512_store_si512(o + 64 * (t + 4), hi);
        }
    }
}

/* B tile tb from the segment, A tile ta = the 16 items' block b, C tile tc
 * = their exact P_b */
#define AMX_ISSUE(tb, ta, tc, b)                                                                 \
    do {                                                                                         \
        _tile_loadd(tb, seg + ((b) - s0) * 512, 64);                                             \
        _tile_loadd(ta, ai + 32 * (b), as);                                                      \
        _tile_zero(tc);                                                                          \
        _tile_dpbssd(tc, ta, tb);                                                                \
    } while (0)

/* the 16 items' rows of C (cbk: 16 x 16 P_b) into their chains */
#define AMX_FOLD(cbk, b)                                                                         \
    do {                                                                                         \
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i_u *)(sp + 16 * (b)))); \
        const __m512 mw = fm.has_min                                                             \
                              ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i_u *)(mp + 16 * (b)))) \
                              : _mm512_setzero_ps();                                             \
        _Pragma("GCC unroll 16") for (int i = 0; i < AMX_ITEMS; i++)                             \
        {                                                                                        \
            const uint8_t *aii = ai + (size_t)i * as;                                            \
            const __m512 da = _mm512_set1_ps(Q8A_D(aii, nb)[b]);                                 \
            const __m512 f = _mm512_cvtepi32_ps(_mm512_load_si512((cbk) + 16 * i));              \
            r[i] = _mm512_fmadd_ps(f, _mm512_mul_ps(dw, da), r[i]);                              \
            if (fm.has_min)                                                                      \
                r[i] = _mm512_fmadd_ps(_mm512_set1_ps(q8a_sum(aii, nb, b)), _mm512_mul_ps(mw, da), \
                                       r[i]);                                                    \
        }                                                                                        \
    } while (0)

/* n16 (a multiple of 16) items against one packed group: out[i * os + r] */
__attribute__((target(AMX_TARGET))) static inline __attribute__((always_inline)) void
q32_amx_t(const uint32_t type, const uint8_t *pg, uint64_t nb, const uint8_t *a, size_t as,
          uint32_t n16, float *out, size_t os)
{
    const q32_fmt_t fm = q32_fmt(type);
    const size_t qb = q32_pk_qbytes(type);
    const uint16_t *sp = (const uint16_t *)(const void *)(pg + nb * qb), *mp = sp + 16 * nb;
    uint8_t seg[AMX_SEG * 512] __attribute__((aligned(64)));
    int32_t cb[2][AMX_ITEMS * 16] __attribute__((aligned(64)));
    for (uint64_t s0 = 0; s0 < nb; s0 += AMX_SEG) {
        const uint64_t s1 = nb - s0 < AMX_SEG ? nb : s0 + AMX_SEG;
        __asm__ volatile("" ::: "memory"); /* the tile loads above read seg */
        q32_amx_unpack(type, pg, s0, s1, seg);
        __asm__ volatile("" ::: "memory"); /* the tile loads below read seg */
        for (uint32_t i0 = 0; i0 < n16; i0 += AMX_ITEMS) {
            const uint8_t *ai = a + (size_t)i0 * as;
            float *oi = out + (size_t)i0 * os;
            __m512 r[AMX_ITEMS];
#pragma GCC unroll 16
            for (int i = 0; i < AMX_ITEMS; i++) /* a later segment continues the chains */
                r[i] = s0 ? _mm512_loadu_ps(oi + (size_t)i * os) : _mm512_setzero_ps();
            /* a C tile is stored one fold after its tdpbssd was issued and
             * folded one fold after it was stored: the tile unit and the
             * store's way to L1 both work while a fold runs */
            AMX_ISSUE(0, 2, 4, s0);
            if (s0 + 1 < s1)
                AMX_ISSUE(1, 3, 5, s0 + 1);
            _tile_stored(4, cb[0], 64);
            for (uint64_t b = s0;; b += 2) {
                if (b + 2 < s1)
                    AMX_ISSUE(0, 2, 4, b + 2);
                if (b + 1 < s1)
                    _tile_stored(5, cb[1], 64);
                AMX_FOLD(cb[0], b);
                if (b + 1 >= s1)
                    break;
                if (b + 3 < s1)
                    AMX_ISSUE(1, 3, 5, b + 3);
                if (b + 2 < s1)
                    _tile_stored(4, cb[0], 64);
                AMX_FOLD(cb[1], b + 1);
                if (b + 2 >= s1)
                    break;
            }
#pragma GCC unroll 16
            for (int i = 0; i < AMX_ITEMS; i++)
                _mm512_storeu_ps(oi + (size_t)i * os, r[i]);
        }
    }
}

/* 2 x 2 (the main schedule): two groups of 16 rows (pg, pg + gs) x 32
 * items. Per block the two B tiles and the two A tiles are loaded once and
 * give four C tiles (one tile load per tdpbssd instead of two: the tile
 * loads and stores, not tdpbssd, bound the tile side at K = 32); the 4 x 16
 * chains of a block live in acc (L1) rather than registers. Same per-output
 * operations in the same order as q32_amx_t: the same bits. */
#define AMX_SEG2 32 /* blocks per segment of each of the two groups: 2 x 16 KB */
#define AMX22_ISSUE(b)                                                                           \
    do {                                                                                         \
        _tile_loadd(0, seg[0] + ((b) - s0) * 512, 64);                                           \
        _tile_loadd(1, seg[1] + ((b) - s0) * 512, 64);                                           \
        _tile_loadd(2, ai + 32 * (b), as);                                                       \
        _tile_loadd(3, ai + (size_t)AMX_ITEMS * as + 32 * (b), as);                              \
        _tile_zero(4);                                                                           \
        _tile_zero(5);                                                                           \
        _tile_zero(6);                                                                           \
        _tile_zero(7);                                                                           \
        _tile_dpbssd(4, 2, 0);                                                                   \
        _tile_dpbssd(5, 2, 1);                                                                   \
        _tile_dpbssd(6, 3, 0);                                                                   \
        _tile_dpbssd(7, 3, 1);                                                                   \
    } while (0)
#define AMX22_STORE(c)                                                                           \
    do {                                                                                         \
        _tile_stored(4, (c)[0], 64);                                                             \
        _tile_stored(5, (c)[1], 64);                                                             \
        _tile_stored(6, (c)[2], 64);                                                             \
        _tile_stored(7, (c)[3], 64);                                                             \
    } while (0)
__attribute__((target(AMX_TARGET))) static inline __attribute__((always_inline)) void
q32_amx22_t(const uint32_t type, const uint8_t *pg, size_t gs, uint64_t nb, const uint8_t *a,
            size_t as, uint32_t n32, float *out, size_t os)
{
    const q32_fmt_t fm = q32_fmt(type);
    const size_t qb = q32_pk_qbytes(type);
    const uint16_t *sp[2], *mp[2];
    for (int g = 0; g < 2; g++) {
        sp[g] = (const uint16_t *)(const void *)(pg + g * gs + nb * qb);
        mp[g] = sp[g] + 16 * nb;
    }
    uint8_t seg[2][AMX_SEG2 * 512] __attribute__((aligned(64)));
    int32_t cb[2][4][AMX_ITEMS * 16] __attribute__((aligned(64))); /* [b & 1][item half][group] */
    float acc[2 * AMX_ITEMS][2][16] __attribute__((aligned(64))); /* [item][group] */
    for (uint64_t s0 = 0; s0 < nb; s0 += AMX_SEG2) {
        const uint64_t s1 = nb - s0 < AMX_SEG2 ? nb : s0 + AMX_SEG2;
        __asm__ volatile("" ::: "memory"); /* the tile loads above read seg */
        q32_amx_unpack(type, pg, s0, s1, seg[0]);
        q32_amx_unpack(type, pg + gs, s0, s1, seg[1]);
        __asm__ volatile("" ::: "memory"); /* the tile loads below read seg */
        for (uint32_t i0 = 0; i0 < n32; i0 += 2 * AMX_ITEMS) {
            const uint8_t *ai = a + (size_t)i0 * as;
            float *oi = out + (size_t)i0 * os;
            for (int i = 0; i < 2 * AMX_ITEMS; i++) /* a later segment continues the chains */
                for (int g = 0; g < 2; g++)
                    _mm512_store_ps(acc[i][g], s0 ? _mm512_loadu_ps(oi + (size_t)i * os + 16 * g)
                                                  : _mm512_setzero_ps());
            /* block b + 1's tile loads, tdpbssd and C stores are spread
             * over block b's fold (into the other C buffer): measured, the
             * tile side (426 GMAC/s alone) and the fold (520 alone) still
             * barely overlap; the spreading gains ~5 % over issuing them
             * as one run before the fold */
            AMX22_ISSUE(s0);
            AMX22_STORE(cb[0]);
            for (uint64_t b = s0; b < s1; b++) {
                const int nx = b + 1 < s1;
                int32_t(*cn)[AMX_ITEMS * 16] = cb[(b + 1 - s0) & 1];
                int32_t(*c)[AMX_ITEMS * 16] = cb[(b - s0) & 1];
                __m512 dw[2], mw[2];
                for (int g = 0; g < 2; g++) {
                    dw[g] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i_u *)(sp[g] + 16 * b)));
                    mw[g] = fm.has_min
                                ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i_u *)(mp[g] + 16 * b)))
                                : _mm512_setzero_ps();
                }
#pragma GCC unroll 32
                for (int i = 0; i < 2 * AMX_ITEMS; i++) {
                    if (nx) { /* block b + 1's tile work, spread over b's fold */
                        if (i == 0) {
                            _tile_loadd(0, seg[0] + (b + 1 - s0) * 512, 64);
                            _tile_loadd(1, seg[1] + (b + 1 - s0) * 512, 64);
                        } else if (i == 3) {
                            _tile_loadd(2, ai + 32 * (b + 1), as);
                            _tile_loadd(3, ai + (size_t)AMX_ITEMS * as + 32 * (b + 1), as);
                        } else if (i == 6) {
                            _tile_zero(4);
                            _tile_zero(5);
                            _tile_dpbssd(4, 2, 0);
                            _tile_dpbssd(5, 2, 1);
                        } else if (i == 8) {
                            _tile_zero(6);
                            _tile_zero(7);
                            _tile_dpbssd(6, 3, 0);
                            _tile_dpbssd(7, 3, 1);
                        } else if (i == 16) {
                            _tile_stored(4, cn[0], 64);
                        } else if (i == 20) {
                            _tile_stored(5, cn[1], 64);
                        } else if (i == 24) {
                            _tile_stored(6, cn[2], 64);
                        } else if (i == 28) {
                            _tile_stored(7, cn[3], 64);
                        }
                    }
                    const uint8_t *aii = ai + (size_t)i * as;
                    const __m512 da = _mm512_set1_ps(Q8A_D(aii, nb)[b]);
                    const int h = i / AMX_ITEMS, ih = i % AMX_ITEMS;
#pragma GCC unroll 2
                    for (int g = 0; g < 2; g++) {
                        const __m512 f = _mm512_cvtepi32_ps(_mm512_load_si512(c[2 * h + g] + 16 * ih));
                        __m512 r = _mm512_fmadd_ps(f, _mm512_mul_ps(dw[g], da), _mm512_load_ps(acc[i][g]));
                        if (fm.has_min)
                            r = _mm512_fmadd_ps(_mm512_set1_ps(q8a_sum(aii, nb, b)),
                                                _mm512_mul_ps(mw[g], da), r);
                        _mm512_store_ps(acc[i][g], r);
                    }
                }
            }
            for (int i = 0; i < 2 * AMX_ITEMS; i++)
                for (int g = 0; g < 2; g++)
                    _mm512_storeu_ps(oi + (size_t)i * os + 16 * g, _mm512_load_ps(acc[i][g]));
        }
    }
}

/* ng groups (gs bytes apart) x n16 items: the pairs of groups x the full
 * 32s of items on the 2 x 2 schedule, the rest one group x 16 items */
#define Q32_AMX(T, TN)                                                                         \
    __attribute__((target(AMX_TARGET))) static void q32_amx_##TN(                             \
        const uint8_t *pg, size_t gs, uint32_t ng, uint64_t nb, const uint8_t *a, size_t as,    \
        uint32_t n16, float *out, size_t os)                                                   \
    {                                                                                          \
        const uint32_t n32 = n16 / (2 * AMX_ITEMS) * (2 * AMX_ITEMS);                          \
        uint32_t g2 = 0;                                                                       \
        if (n32)                                                                               \
            for (; g2 + 2 <= ng; g2 += 2)                                                      \
                q32_amx22_t(T, pg + g2 * gs, gs, nb, a, as, n32, out + 16 * g2, os);           \
        for (uint32_t g = 0; g < ng; g++) {                                                    \
            const uint32_t i0 = g < g2 ? n32 : 0;                                              \
            if (i0 < n16)                                                                      \
                q32_amx_t(T, pg + g * gs, nb, a + (size_t)i0 * as, as, n16 - i0,               \
                          out + 16 * g + (size_t)i0 * os, os);                                 \
        }                                                                                      \
    }
Q32_AMX(GGML_TYPE_Q8_0, q8)
Q32_AMX(GGML_TYPE_Q4_0, q4)
Q32_AMX(GGML_TYPE_Q4_1, q41)
Q32_AMX(GGML_TYPE_Q5_0, q50)
Q32_AMX(GGML_TYPE_Q5_1, q51)
Q32_AMX(GGML_TYPE_IQ4_NL, iq4)

/* ---- Q4_K on tiles, on ggml_qdot.c's packed layout (per block of a group:
 * 4 chunks j x 512 bytes of nibble quads [t][row][4 bytes], the low
 * nibbles = sub-block 2j's elements 4t..4t + 3, the high = sub-block
 * 2j + 1's; then sc [k][row] and m [k][row] bytes, f16 d and dmin per
 * row). Each sub-block's nibbles, masked, are a B tile as they stand; per
 * block and sub-block k one tdpbssd (K = 32) gives the exact P_k of 16
 * items x 16 rows. V = sum_k sc_k P_k is summed in f32 from exact parts:
 * |sc_k P_k| <= 63 x (32 x 15 x 127) < 2^22 and a sum of four of them
 * < 2^24 are exact, so (k 0..3) + (k 4..7) is one rounding of the exact
 * V = (float)V. M (vpdpwssd of the mins and the bsums pairs) and the fold
 * are the VNNI kernel's: the same bits. ---- */
#define K4_PKB 2368 /* Q4K_PK_BYTES of ggml_qdot.c */
#define K5_PKB (K4_PKB + 512) /* Q5K_PK_BYTES: + the qh plane */
#define K4_SEG 4    /* blocks per converted segment: 4 x 4 KB */
#define Q8K_QS_OFF 4 /* offsetof(ggml_q8k_block, qs) */
_Static_assert(sizeof(ggml_q8k_block) == 292, "Q8K block layout");

/* blocks [b0, b1) of the Q4_K / Q5_K packed group pg as B tiles: sub-block
 * k of block b at seg + 4096 (b - b0) + 512 k (Q5_K: bit k of the qh plane
 * [t][row][4 bytes] is bit 4 of sub-block k's value) */
__attribute__((target(AMX_TARGET))) static inline __attribute__((always_inline)) void
k45_amx_unpack(const uint8_t *pg, uint64_t b0, uint64_t b1, uint8_t *seg, const int q5)
{
    const __m512i m = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
    for (uint64_t b = b0; b < b1; b++) {
        const uint8_t *p = pg + b * (q5 ? K5_PKB : K4_PKB);
        uint8_t *o = seg + (b - b0) * 4096;
        for (int j = 0; j < 4; j++)
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                const __m512i x = _mm512_loadu_si512(p + 512 * j + 64 * t);
                __m512i lo = _mm512_and_si512(x, m), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m);
                if (q5) {
                    const __m512i qh = _mm512_loadu_si512(p + K4_PKB + 64 * t);
                    lo = _mm512_or_si512(lo, _mm512_slli_epi16(
                                                 _mm512_and_si512(_mm512_srli_epi16(qh, 2 * j), one), 4));
                    hi = _mm512_or_si512(hi, _mm512_slli_epi16(
                                                 _mm512_and_si512(_mm512_srli_epi16(qh, 2 * j + 1), one),
                                                 4));
                }
                _mm512_store_si512(o + 512 * (2 * j) + 64 * t, lo);
                _mm512_store_si512(o + 512 * (2 * j + 1) + 64 * t, hi);
            }
    }
}

#define K4_DP(k, tb, ta, tc, cbk)                                                                \
    do {                                                                                         \
        _tile_loadd(tb, seg + (b - s0) * 4096 + 512 * (k), 64);                                  \
        _tile_loadd(ta, qa + 32 * (k), as);                                                      \
        _tile_zero(tc);                                                                          \
        _tile_dpbssd(tc, ta, tb);                                                                \
        _tile_stored(tc, (cbk)[k], 64);                                                          \
    } while (0)

/* n16 items x one Q4_K / Q5_K packed group: out[i * os + r]. Q5_K's
 * sc_k P_k (< 63 x 32 x 31 x 127 < 2^23) do not sum exactly in f32 past
 * two, so its V is summed in int32 (vpmulld): the exact V, as on VNNI. */
__attribute__((target(AMX_TARGET))) static inline __attribute__((always_inline)) void
k45_amx_group_t(const uint8_t *pg, uint64_t nb, const uint8_t *a, size_t as, uint32_t n16,
                float *out, size_t os, const int q5)
{
    const size_t pkb = q5 ? K5_PKB : K4_PKB;
    uint8_t seg[K4_SEG * 4096] __attribute__((aligned(64)));
    int32_t cb[8][AMX_ITEMS * 16] __attribute__((aligned(64)));
    float sf[8][16] __attribute__((aligned(64)));
    __m512i mk[8], sk[8];
    for (uint64_t s0 = 0; s0 < nb; s0 += K4_SEG) {
        const uint64_t s1 = nb - s0 < K4_SEG ? nb : s0 + K4_SEG;
        __asm__ volatile("" ::: "memory"); /* the tile loads above read seg */
        k45_amx_unpack(pg, s0, s1, seg, q5);
        __asm__ volatile("" ::: "memory"); /* the tile loads below read seg */
        for (uint32_t i0 = 0; i0 < n16; i0 += AMX_ITEMS) {
            const uint8_t *ai = a + (size_t)i0 * as;
            float *oi = out + (size_t)i0 * os;
            __m512 r[AMX_ITEMS];
#pragma GCC unroll 16
            for (int i = 0; i < AMX_ITEMS; i++) /* a later segment continues the chains */
                r[i] = s0 ? _mm512_loadu_ps(oi + (size_t)i * os) : _mm512_setzero_ps();
            for (uint64_t b = s0; b < s1; b++) {
                const uint8_t *qa = ai + b * sizeof(ggml_q8k_block) + Q8K_QS_OFF;
                K4_DP(0, 0, 2, 4, cb);
                K4_DP(1, 1, 3, 5, cb);
                K4_DP(2, 0, 2, 6, cb);
                K4_DP(3, 1, 3, 7, cb);
                K4_DP(4, 0, 2, 4, cb);
                K4_DP(5, 1, 3, 5, cb);
                K4_DP(6, 0, 2, 6, cb);
                K4_DP(7, 1, 3, 7, cb);
                const uint8_t *p = pg + b * pkb;
#pragma GCC unroll 8
                for (int k = 0; k < 8; k++) {
                    const __m512i sc = _mm512_cvtepu8_epi32(
                        _mm_loadu_si128((const __m128i_u *)(p + 2048 + 16 * k)));
                    if (q5)
                        sk[k] = sc;
                    else
                        _mm512_store_ps(sf[k], _mm512_cvtepi32_ps(sc));
                    const __m512i m = _mm512_cvtepu8_epi32(
                        _mm_loadu_si128((const __m128i_u *)(p + 2176 + 16 * k)));
                    mk[k] = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
                }
                const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i_u *)(p + 2304)));
                const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i_u *)(p + 2336)));
#pragma GCC unroll 16
                for (int i = 0; i < AMX_ITEMS; i++) {
                    const ggml_q8k_block *ab =
                        (const ggml_q8k_block *)(const void *)(ai + (size_t)i * as) + b;
                    __m512 v;
                    if (q5) {
                        __m512i lo = _mm512_mullo_epi32(_mm512_load_si512(cb[0] + 16 * i), sk[0]);
                        __m512i hi = _mm512_mullo_epi32(_mm512_load_si512(cb[4] + 16 * i), sk[4]);
#pragma GCC unroll 3
                        for (int k = 1; k < 4; k++) {
                            lo = _mm512_add_epi32(
                                lo, _mm512_mullo_epi32(_mm512_load_si512(cb[k] + 16 * i), sk[k]));
                            hi = _mm512_add_epi32(
                                hi, _mm512_mullo_epi32(_mm512_load_si512(cb[4 + k] + 16 * i), sk[4 + k]));
                        }
                        v = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi));
                    } else {
                        __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb[0] + 16 * i)),
                                                  _mm512_load_ps(sf[0]));
                        __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb[4] + 16 * i)),
                                                  _mm512_load_ps(sf[4]));
#pragma GCC unroll 3
                        for (int k = 1; k < 4; k++) {
                            lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb[k] + 16 * i)),
                                                 _mm512_load_ps(sf[k]), lo);
                            hi = _mm512_fmadd_ps(
                                _mm512_cvtepi32_ps(_mm512_load_si512(cb[4 + k] + 16 * i)),
                                _mm512_load_ps(sf[4 + k]), hi);
                        }
                        v = _mm512_add_ps(lo, hi);
                    }
                    __m512i M = _mm512_setzero_si512();
#pragma GCC unroll 8
                    for (int k = 0; k < 8; k++) {
                        int32_t pair;
                        memcpy(&pair, ab->bsums + 2 * k, 4);
                        M = _mm512_dpwssd_epi32(M, mk[k], _mm512_set1_epi32(pair));
                    }
                    const float d = ab->d;
                    r[i] = _mm512_fmadd_ps(v, _mm512_mul_ps(dw, _mm512_set1_ps(d)), r[i]);
                    r[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(dm, _mm512_set1_ps(-d)),
                                           r[i]);
                }
            }
#pragma GCC unroll 16
            for (int i = 0; i < AMX_ITEMS; i++)
                _mm512_storeu_ps(oi + (size_t)i * os, r[i]);
        }
    }
}

#define K45_AMX(TN, Q5)                                                                         \
    __attribute__((target(AMX_TARGET))) static void TN(const uint8_t *pg, size_t gs, uint32_t ng, \
                                                       uint64_t nb, const uint8_t *a, size_t as,  \
                                                       uint32_t n16, float *out, size_t os)       \
    {                                                                                           \
        for (uint32_t g = 0; g < ng; g++)                                                       \
            k45_amx_group_t(pg + g * gs, nb, a, as, n16, out + 16 * g, os, Q5);                 \
    }
K45_AMX(k4_amx, 0)
K45_AMX(k5_amx, 1)

ggml_qdot_amx_fn ggml_qdot_amx_kernel(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_Q8_0: return q32_amx_q8;
    case GGML_TYPE_Q4_0: return q32_amx_q4;
    case GGML_TYPE_Q4_1: return q32_amx_q41;
    case GGML_TYPE_Q5_0: return q32_amx_q50;
    case GGML_TYPE_Q5_1: return q32_amx_q51;
    case GGML_TYPE_IQ4_NL: return q32_amx_iq4;
    case GGML_TYPE_Q4_K: return k4_amx;
    case GGML_TYPE_Q5_K: return k5_amx;
    default: return NULL;
    }
}
