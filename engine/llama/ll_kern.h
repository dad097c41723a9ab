/* ll_kern.h - weight-type-aware matmul kernels and the thread pool of the
 * llama engine (internal to engine/llama).
 *
 * Determinism contract. Every dot product of length K computed here has ONE
 * canonical definition, whatever the ISA path (AVX-512, AVX2, scalar), the
 * batch size or the thread count:
 *   lane l (0..15) accumulates w[k]*x[k] for k = l, l+16, l+32, ... in
 *   increasing k with a fused multiply-add starting from +0.0f; then the 16
 *   lanes are reduced by the fixed tree  s8[l] = a[l]+a[l+8],
 *   s4[l] = s8[l]+s8[l+4], s2[l] = s4[l]+s4[l+2], r = s2[0]+s2[1].
 * Weight rows are first dequantized to f32 EXACTLY (f16/bf16 widen exactly;
 * a Q8_0/Q4_0 element q*d fits in a float mantissa) or, for the other
 * quantized types (K-quants, Q4_1, Q5_0/1, IQ4_NL), by engine/gguf's single
 * scalar decoder on every path, so the result does not depend on how
 * weights were tiled either.
 * Integer-dot types (issue 11): Q8_0, Q4_0, Q4_K and Q6_K rows whose length
 * is whole blocks are instead dotted with the activation row quantized once
 * per matmul (engine/llama/ggml_qdot.h: Q8 blocks of 32 or Q8_K blocks of
 * 256); that dot has its own canonical definition (ggml_qdot.h), equal on
 * the scalar / AVX2 / VNNI / AMX paths and independent of the batch. Whether a
 * matrix uses it depends only on its type and shape (and eng_ll_qdot_g,
 * PD_QDOT=off), never on the batch size or thread count.
 * Work is split across threads by
 * output rows only; a (row, item) pair is always computed by the same code.
 */
#ifndef LL_KERN_H
#define LL_KERN_H

#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include "pd_status.h"
#include "eng.h"

/* ggml tensor type ids (GGUF). */
enum {
    ENG_LL_T_F32 = 0,
    ENG_LL_T_F16 = 1,
    ENG_LL_T_Q4_0 = 2,
    ENG_LL_T_Q8_0 = 8,
    ENG_LL_T_BF16 = 30,
};

/* A 2-D weight used in place (from the mmap). */
typedef struct {
    const uint8_t *data;   /* (rows, row_bytes) */
    uint32_t type;         /* ENG_LL_T_* */
    uint32_t rows;         /* output features */
    uint32_t cols;         /* input features (reduction dim) */
    size_t row_bytes;
    /* the integer-dot kernel's packed copy (ggml_qdot_pack: the integer-dot
     * types but Q6_K, on a VNNI CPU), owned by the model; NULL = none */
    const uint8_t *pk;
} eng_ll_tensor_t;

/* The packed copy of t for the integer-dot kernel on this CPU: *buf_p is
 * a new 64-byte-aligned buffer the caller owns (t->pk points into it), or
 * NULL when this type / CPU / PD_QDOT setting has no packed kernel. */
pd_status_t eng_ll_pack(eng_ll_tensor_t *t, void **buf_p);

/* Rows [r0, r0 + rows) of t as a tensor of their own (with its packed
 * groups when r0 starts one, else none: same bits, row kernels). */
eng_ll_tensor_t eng_ll_rows_view(const eng_ll_tensor_t *t, uint32_t r0, uint32_t rows);

/* Bytes of one row of `cols` elements of `type`; 0 if the type is unknown or
 * cols is not a multiple of the type's block size. */
size_t eng_ll_row_bytes(uint32_t type, uint64_t cols);
const char *eng_ll_type_name(uint32_t type);

/* Dequantize row `row` of t into out (t->cols floats), exactly. */
void eng_ll_dequant_row(const eng_ll_tensor_t *t, uint32_t row,
                        float *out /* (cols) */);

/* Canonical dot product (see the contract above). */
float eng_ll_dot(const float *a, const float *b, size_t n);
/* Canonical dot product of an f16 vector with an f32 vector. */
float eng_ll_dot_f16(const uint16_t *a, const float *b, size_t n);
/* y[i] += a * x[i] (elementwise, single rounding per fma). */
void eng_ll_axpy_f16(float *y, float a, const uint16_t *x, size_t n);
void eng_ll_axpy(float *y, float a, const float *x, size_t n);
/* Row-batched forms for attention over one KV block: out[j] = dot(row j, q)
 * and y += sum_j a[j] * row j (j in order), row j at base + j * stride.
 * Per element exactly the same operations as the single-row calls. */
void eng_ll_dot_rows_f16(const uint16_t *k, size_t stride, uint32_t cnt,
                         const float *q, size_t n, float *out /* (cnt) */);
void eng_ll_dot_rows(const float *k, size_t stride, uint32_t cnt, const float *q,
                     size_t n, float *out /* (cnt) */);
void eng_ll_axpy_rows_f16(float *y, const float *a /* (cnt) */, const uint16_t *v,
                          size_t stride, uint32_t cnt, size_t n);
void eng_ll_axpy_rows(float *y, const float *a /* (cnt) */, const float *v, size_t stride,
                      uint32_t cnt, size_t n);

/* KV cache in q8_0 (eng.h ENG_KV_Q8_0): rows of n values (n % 32 == 0) as
 * n/32 blocks of { f16 d, int8 q[32] } (34 bytes, llama.cpp's block_q8_0).
 * Quantize: llama.cpp's quantize_row_q8_0_ref (d = amax/127 rounded to f16,
 * q = roundf(x / d) with the unrounded d). Element k of a row is
 * q[k] * f16_to_f32(d), exact in f32, so the dot and axpy below are the
 * canonical ones of the f32 path over those values: bit-identical on the
 * scalar / AVX2 / AVX-512 paths. stride is in BYTES here. No dequantized
 * copy of the cache is made. */
void eng_ll_kv_q8_0_quantize(uint8_t *dst, const float *x, size_t n);
void eng_ll_kv_q8_0_dequantize(float *out, const uint8_t *src, size_t n);
float eng_ll_dot_q8_0(const uint8_t *a, const float *b, size_t n);
void eng_ll_axpy_q8_0(float *y, float a, const uint8_t *x, size_t n);
void eng_ll_dot_rows_q8_0(const uint8_t *k, size_t stride, uint32_t cnt,
                          const float *q, size_t n, float *out /* (cnt) */);
void eng_ll_axpy_rows_q8_0(float *y, const float *a /* (cnt) */, const uint8_t *v,
                           size_t stride, uint32_t cnt, size_t n);

/* KV cache in any eng_kv_dtype_t (issue 32): q4_0 (llama.cpp block_q4_0,
 * quantize_row_q4_0_ref), bf16 (round to nearest even), fp8_e4m3 (per 32
 * values an E8M0 scale 2^(s-127), the smallest power of two that keeps the
 * block's max |x| <= 448, then 32 e4m3 rounded to nearest even), and f32 /
 * f16 / q8_0 as above. Rows of n values (whole blocks: eng_kv_row_bytes),
 * stride in BYTES. Element k of a row is one exact-or-IEEE-rounded product
 * u * scale computed alike on every path, then the canonical f32 dot / axpy:
 * bit-identical on the scalar / AVX2 / AVX-512 paths. No dequantized copy
 * of the cache is made. eng_ll_kv_dequantize is for tests. */
void eng_ll_kv_quantize(eng_kv_dtype_t dt, uint8_t *dst, const float *x, size_t n);
void eng_ll_kv_dequantize(eng_kv_dtype_t dt, float *out, const uint8_t *src, size_t n);
float eng_ll_kv_dot(eng_kv_dtype_t dt, const uint8_t *a, const float *b, size_t n);
void eng_ll_kv_dot_rows(eng_kv_dtype_t dt, const uint8_t *k, size_t stride, uint32_t cnt,
                        const float *q, size_t n, float *out /* (cnt) */);
void eng_ll_kv_axpy_rows(eng_kv_dtype_t dt, float *y, const float *a /* (cnt) */,
                         const uint8_t *v, size_t stride, uint32_t cnt, size_t n);
/* Query-blocked forms (prefill attention, issue 34/37): nq queries that
 * share the rows (a KV head's GQA group, a run of tokens) walk them once;
 * each row is loaded and widened to f32 once for all of them.
 *   dot:  out[i * os + j] = dot(row j, q + i * qs)
 *   axpy: for each query i, y + i * ys += sum_j a[i * as + j] * row j, j in order
 * Per query exactly the bits of eng_ll_kv_dot_rows / eng_ll_kv_axpy_rows
 * (the same element products, the canonical dot, one fma chain per element
 * in row order), on every ISA path. */
void eng_ll_kv_dot_rows_multi(eng_kv_dtype_t dt, const uint8_t *k, size_t stride, uint32_t cnt,
                              const float *q, size_t qs, uint32_t nq, size_t n,
                              float *out, size_t os);
void eng_ll_kv_axpy_rows_multi(eng_kv_dtype_t dt, float *y, size_t ys, const float *a,
                               size_t as, uint32_t nq, const uint8_t *v, size_t stride,
                               uint32_t cnt, size_t n);
/* Softmax pieces, elementwise or order-free so any lane split gives the
 * bits of the plain loops: x[i] *= scale for i < n, returning the max as
 * `if (x[i] > mx) mx = x[i]` from -inf finds it (NaNs skipped; the sign
 * of a zero max may differ, which x - max cannot see); x[i] *= s. */
float eng_ll_scale_max(float *x, size_t n, float scale);
void eng_ll_scale(float *x, size_t n, float s);
/* The engine's exp (ll_kern.c: ~1 ulp, argument clamped to [-87, 88]),
 * the same bits on every ISA path. eng_ll_exp_sum: x[i] = exp(x[i] - mx)
 * for i < n, returning their sum in the canonical 16-lane order (element
 * i into lane i % 16, then the ll_tree16 tree). eng_ll_silu_mul: g[i] =
 * g[i] / (1 + exp(-g[i])) * u[i]. */
float eng_ll_exp(float x);
float eng_ll_exp_sum(float *x, size_t n, float mx);
void eng_ll_silu_mul(float *g, const float *u, size_t n);
/* Attention path of the llama engine: 1 query-blocked tiles (default), 0
 * one (token, head) pair per chunk (PD_ATT=rows; tests and benchmarks
 * compare the two). -1 at start = read PD_ATT. Same bits either way. Set
 * only while no engine call runs. */
extern int eng_ll_att_tiled_g;

/* Which ISA path the kernels use: "avx512", "avx2", "scalar". Set once at
 * first use from __builtin_cpu_supports; ENG_LL_ISA=scalar|avx2 in the
 * environment forces a lower one (tests use it to show paths agree). */
const char *eng_ll_isa(void);
/* Tests only: switch the path ("avx512" | "avx2" | "scalar") for the whole
 * process while no engine call is running. -1 if the CPU lacks it. */
int eng_ll_isa_force(const char *name);

/* ---- thread pool ---- */
typedef struct eng_ll_pool eng_ll_pool_t;
/* Run chunk `chunk` of a job on thread `tid` (0 = the caller), e.g. to
 * pick per-thread scratch. */
typedef void (*eng_ll_pool_fn)(void *ctx, uint32_t chunk, uint32_t tid);

/* Create a pool of n_threads (>= 1) compute threads; the caller's thread is
 * thread 0, so n_threads-1 workers are started. Expected errors:
 * PD_ERR_NO_MEMORY, PD_ERR_INTERNAL (pthread_create failed). */
pd_status_t eng_ll_pool_create(uint32_t n_threads, eng_ll_pool_t **pool_p);
void eng_ll_pool_destroy(eng_ll_pool_t *pool); /* accepts NULL */
uint32_t eng_ll_pool_size(const eng_ll_pool_t *pool);
/* Run the following jobs on threads 0..n-1 only (n clamped to 1..size;
 * 0: all); the others park on a condvar without spinning until n covers
 * them again. Call between jobs, from the caller's thread. Which threads
 * run a job never changes its result. */
void eng_ll_pool_set_active(eng_ll_pool_t *pool, uint32_t n);
/* Threads the next job runs on (eng_ll_pool_set_active). */
uint32_t eng_ll_pool_active(const eng_ll_pool_t *pool);
/* Run fn(ctx, c, tid) for every chunk c in [0, n_chunks), each exactly
 * once, on whichever threads claim it first; return when all are done.
 * n_chunks == 1 runs inline on the caller without waking anyone. */
void eng_ll_pool_run(eng_ll_pool_t *pool, eng_ll_pool_fn fn, void *ctx, uint32_t n_chunks);

/* ---- matmul ----
 * out_m[b*out_stride + r] = dot(W_m row r, x[b*x_stride ...]) for up to 3
 * matrices sharing the input x (fused Q/K/V or gate/up), b < n_items.
 * Rows of all matrices are split across the pool's threads. */
typedef struct {
    uint32_t n_mats;
    const eng_ll_tensor_t *w[3];
    float *out[3];            /* (n_items, out_stride[m]) */
    uint32_t out_stride[3];
    const float *x;           /* (n_items, x_stride), x_stride >= cols */
    uint32_t x_stride;
    uint32_t n_items;
    /* >= eng_ll_qx_bytes(n_items, cols) bytes for the quantized activations
     * of the integer-dot types; NULL = every type on the f32 path */
    void *qx;
} eng_ll_matmul_t;

/* Bytes of the quantized-activation buffer for n_items rows of cols. */
size_t eng_ll_qx_bytes(uint32_t n_items, uint32_t cols);
/* Integer-dot switch: 1 on (default), 0 off (every type on the exact f32
 * path; tests of exact decoding). -1 at start = read PD_QDOT ("off" = 0).
 * Set only while no engine call runs. */
extern int eng_ll_qdot_g;
/* Smallest batch (items of one matmul) that runs the AMX path where the
 * CPU has it (below: VNNI, the same bits); the full 16s of items go to the
 * tiles, the rest to VNNI (docs/BENCHMARKS.md "AMX int8 tiles"). */
extern uint32_t eng_ll_amx_min_g;
/* One line naming the integer-dot path the matmuls run and, below AMX,
 * why not AMX ("qdot path: amx (...)", "qdot path: vnni (amx: the kernel
 * refused XTILEDATA ...)", "qdot path: off (...)"): logged at boot. */
void eng_ll_qdot_describe(char *buf, size_t len);
/* Tests only: != 0 checks every integer-dot output against the f64 dot of
 * the dequantized weights with the dequantized activations it was given
 * (tolerance 1e-5 of the sum of |terms|) and counts the misses. */
extern int eng_ll_qdot_check_g;
extern _Atomic uint64_t eng_ll_qdot_check_bad;

/* Small batches (<= eng_ll_fuse_max_g items, default 8) on AVX-512 widen
 * weights in registers ("fused", once per 4-item tile); larger ones
 * dequantize 4 rows to scratch and reuse them across item tiles. Both give
 * the same bits. The knobs exist for micro-benchmarks only. */
extern int eng_ll_nofuse_g;
extern uint32_t eng_ll_fuse_max_g;
extern int eng_ll_r8_g;
/* Software prefetch distance in bytes on the fused path (0 = off); 512
 * measured best for DRAM-resident weights (docs/BENCHMARKS.md "Figures
 * behind the engine's build and kernel choices"). */
extern int eng_ll_pf_g;

/* scratch: per-thread f32 buffers, each >= 4 * max cols floats. */
void eng_ll_matmul(eng_ll_pool_t *pool, const eng_ll_matmul_t *mm,
                   float *const *scratch);

#endif
