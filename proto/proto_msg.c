/* proto_msg.c - encode/decode of control-plane messages. Pure: no I/O, no
 * allocation, no logging. Every field is read through a bounds-checked
 * reader with a sticky status, so a short or hostile buffer can never be
 * over-read: the first failure wins and later reads return zeros.
 *
 * Validation rules live in one check_<name>() per message, used by BOTH the
 * encoder (refuse to emit a bad message) and the decoder (refuse to accept
 * one), so anything that decodes OK re-encodes to identical bytes. The
 * wire layout lives in one io_<name>() per message, walked both ways (see
 * io_t), so the encoder and the decoder cannot disagree on a field. */
#include "proto_msg.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- little-endian primitives ----------------------------------------- */

static inline void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline void put_u64(uint8_t *p, uint64_t v)
{
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

static inline uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static inline uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | ((uint64_t)get_u32(p + 4) << 32);
}

/* ---- writer: counts the size even past cap (size query) --------------- */

typedef struct {
    uint8_t *p;
    size_t cap;
    size_t len;
} wr_t;

static void w_bytes(wr_t *w, const void *src, size_t n)
{
    if (n && w->len + n <= w->cap)
        memcpy(w->p + w->len, src, n);
    w->len += n;
}

static void w_u16(wr_t *w, uint16_t v)
{
    uint8_t b[2];
    put_u16(b, v);
    w_bytes(w, b, 2);
}

static void w_u32(wr_t *w, uint32_t v)
{
    uint8_t b[4];
    put_u32(b, v);
    w_bytes(w, b, 4);
}

static void w_u64(wr_t *w, uint64_t v)
{
    uint8_t b[8];
    put_u64(b, v);
    w_bytes(w, b, 8);
}

static void w_f32(wr_t *w, float f)
{
    uint32_t v;
    memcpy(&v, &f, 4);
    w_u32(w, v);
}

/* Strings are validated (length, no NUL) by check_*() before writing. */
static void w_str(wr_t *w, const char *s)
{
    size_t n = strlen(s);
    w_u16(w, (uint16_t)n);
    w_bytes(w, s, n);
}

static void w_tok_array(wr_t *w, const proto_tokens_t *t)
{
    size_t n = (size_t)t->n * 4;

    w_u32(w, t->n);
    if (t->v == NULL) {
        w_bytes(w, t->wire, n);
        return;
    }
    if (w->len + n <= w->cap) {
        uint8_t *p = w->p + w->len;
        for (uint32_t i = 0; i < t->n; i++)
            put_u32(p + (size_t)i * 4, (uint32_t)t->v[i]);
    }
    w->len += n;
}

static void w_blob(wr_t *w, const proto_blob_t *b)
{
    w_u32(w, b->len);
    w_bytes(w, b->p, b->len);
}

/* ---- reader: sticky status, zeros after the first failure ------------- */

typedef struct {
    const uint8_t *p;
    size_t len;
    size_t off;
    pd_status_t st;
} rd_t;

static void r_fail(rd_t *r, pd_status_t st)
{
    if (r->st == PD_OK)
        r->st = st;
}

/* Returns a pointer to n bytes or NULL (and fails TRUNCATED). */
static const uint8_t *r_take(rd_t *r, size_t n)
{
    if (r->st != PD_OK)
        return NULL;
    if (n > r->len - r->off) {
        r_fail(r, PD_ERR_TRUNCATED);
        return NULL;
    }
    const uint8_t *p = r->p + r->off;
    r->off += n;
    return p;
}

static uint16_t r_u16(rd_t *r)
{
    const uint8_t *p = r_take(r, 2);
    return p ? get_u16(p) : 0;
}

static uint32_t r_u32(rd_t *r)
{
    const uint8_t *p = r_take(r, 4);
    return p ? get_u32(p) : 0;
}

static uint64_t r_u64(rd_t *r)
{
    const uint8_t *p = r_take(r, 8);
    return p ? get_u64(p) : 0;
}

static float r_f32(rd_t *r)
{
    uint32_t v = r_u32(r);
    float f;
    memcpy(&f, &v, 4);
    return f;
}

static void r_fixed(rd_t *r, uint8_t *dst, size_t n)
{
    const uint8_t *p = r_take(r, n);
    if (p)
        memcpy(dst, p, n);
    else
        memset(dst, 0, n);
}

/* Length-prefixed string copied into dst[max + 1], NUL-terminated. */
static void r_str(rd_t *r, char *dst, size_t max)
{
    dst[0] = '\0';
    uint16_t n = r_u16(r);
    if (r->st != PD_OK)
        return;
    if (n > max) {
        r_fail(r, PD_ERR_TOO_BIG);
        return;
    }
    const uint8_t *p = r_take(r, n);
    if (p == NULL)
        return;
    if (memchr(p, 0, n) != NULL) {
        r_fail(r, PD_ERR_BAD_INPUT);
        return;
    }
    memcpy(dst, p, n);
    dst[n] = '\0';
}

static void r_tok_array(rd_t *r, proto_tokens_t *t, uint32_t max)
{
    memset(t, 0, sizeof(*t));
    uint32_t n = r_u32(r);
    if (r->st != PD_OK)
        return;
    if (n > max) {
        r_fail(r, PD_ERR_TOO_BIG);
        return;
    }
    const uint8_t *p = r_take(r, (size_t)n * 4);
    if (p == NULL)
        return;
    t->n = n;
    t->wire = p;
}

static void r_blob(rd_t *r, proto_blob_t *b, uint32_t max)
{
    memset(b, 0, sizeof(*b));
    uint32_t n = r_u32(r);
    if (r->st != PD_OK)
        return;
    if (n > max) {
        r_fail(r, PD_ERR_TOO_BIG);
        return;
    }
    const uint8_t *p = r_take(r, n);
    if (p == NULL)
        return;
    b->p = n ? p : NULL;
    b->len = n;
}

/* A reserved body field: read, must be zero. */
static void r_reserved16(rd_t *r)
{
    if (r_u16(r) != 0)
        r_fail(r, PD_ERR_RESERVED);
}

/* ---- one walk per message, both ways ---------------------------------- */

/* Every message body is described once, by an io_<name>() that walks its
 * fields in wire order. The same walk encodes (io->rd false: values are read
 * from the struct and written to the buffer) and decodes (io->rd true: values
 * are read from the buffer and stored into the struct), so the two directions
 * cannot drift apart. In write mode the io_* helpers never store through the
 * struct pointer: encoding a const message is safe. */
typedef struct {
    bool rd;
    wr_t w;
    rd_t r;
} io_t;

static void io_u16(io_t *io, uint16_t *v)
{
    if (io->rd)
        *v = r_u16(&io->r);
    else
        w_u16(&io->w, *v);
}

static void io_u32(io_t *io, uint32_t *v)
{
    if (io->rd)
        *v = r_u32(&io->r);
    else
        w_u32(&io->w, *v);
}

static void io_i32(io_t *io, int32_t *v)
{
    if (io->rd)
        *v = (int32_t)r_u32(&io->r);
    else
        w_u32(&io->w, (uint32_t)*v);
}

static void io_u64(io_t *io, uint64_t *v)
{
    if (io->rd)
        *v = r_u64(&io->r);
    else
        w_u64(&io->w, *v);
}

static void io_f32(io_t *io, float *v)
{
    if (io->rd)
        *v = r_f32(&io->r);
    else
        w_f32(&io->w, *v);
}

/* A reserved 16-bit field: written as zero, must read as zero. */
static void io_reserved16(io_t *io)
{
    if (io->rd)
        r_reserved16(&io->r);
    else
        w_u16(&io->w, 0);
}

static void io_str(io_t *io, char *s, size_t max)
{
    if (io->rd)
        r_str(&io->r, s, max);
    else
        w_str(&io->w, s);
}

static void io_fixed(io_t *io, uint8_t *p, size_t n)
{
    if (io->rd)
        r_fixed(&io->r, p, n);
    else
        w_bytes(&io->w, p, n);
}

static void io_toks(io_t *io, proto_tokens_t *t, uint32_t max)
{
    if (io->rd)
        r_tok_array(&io->r, t, max);
    else
        w_tok_array(&io->w, t);
}

static void io_names(io_t *io, proto_names_t *t)
{
    if (!io->rd) {
        w_u32(&io->w, t->n);
        for (uint32_t i = 0; i < t->n; i++)
            w_u64(&io->w, proto_names_get(t, i));
        return;
    }
    rd_t *r = &io->r;
    memset(t, 0, sizeof(*t));
    uint32_t n = r_u32(r);
    if (r->st != PD_OK)
        return;
    if (n > PROTO_MAX_KV_EVENTS) {
        r_fail(r, PD_ERR_TOO_BIG);
        return;
    }
    const uint8_t *p = r_take(r, (size_t)n * 8);
    if (p == NULL)
        return;
    t->n = n;
    t->wire = n ? p : NULL;
}

static void io_blob(io_t *io, proto_blob_t *b, uint32_t max)
{
    if (io->rd)
        r_blob(&io->r, b, max);
    else
        w_blob(&io->w, b);
}

/* Decode only: refuse a count over its cap before it sizes a loop. */
static bool io_capped(io_t *io, uint32_t *n, uint32_t max)
{
    if (!io->rd || *n <= max)
        return true;
    *n = 0;
    r_fail(&io->r, PD_ERR_TOO_BIG);
    return false;
}

/* ---- shared validation ------------------------------------------------ */

int32_t proto_tokens_get(const proto_tokens_t *t, uint32_t i)
{
    if (i >= t->n)
        return -1;
    if (t->v != NULL)
        return t->v[i];
    return (int32_t)get_u32(t->wire + (size_t)i * 4);
}

uint32_t proto_tokens_copy(const proto_tokens_t *t, int32_t *dst, uint32_t cap)
{
    uint32_t n = t->n < cap ? t->n : cap;
    if (t->v != NULL) {
        memcpy(dst, t->v, (size_t)n * 4);
        return n;
    }
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(dst, t->wire, (size_t)n * 4); /* wire order is host order */
#else
    for (uint32_t i = 0; i < n; i++)
        dst[i] = (int32_t)get_u32(t->wire + (size_t)i * 4);
#endif
    return n;
}

uint64_t proto_names_get(const proto_names_t *t, uint32_t i)
{
    if (i >= t->n)
        return 0;
    if (t->v != NULL)
        return t->v[i];
    return get_u64(t->wire + (size_t)i * 8);
}

/* A string field: length <= max, no NUL inside (strnlen finds the end). */
static pd_status_t check_str(const char *s, size_t max, bool required)
{
    size_t n = strnlen(s, max + 1);
    if (n > max)
        return PD_ERR_TOO_BIG;
    if (required && n == 0)
        return PD_ERR_BAD_INPUT;
    return PD_OK;
}

static pd_status_t check_tok_array(const proto_tokens_t *t, uint32_t max)
{
    if (t->n > max)
        return PD_ERR_TOO_BIG;
    if (t->n != 0 && t->v == NULL && t->wire == NULL)
        return PD_ERR_BAD_INPUT;
    /* ids are u32 on the wire but must fit int32_t (engine token type):
     * the top bit of every id (byte 3 on the wire) must be clear */
    uint32_t bad = 0;
    if (t->v != NULL) {
        for (uint32_t i = 0; i < t->n; i++)
            bad |= (uint32_t)t->v[i];
    } else {
        for (uint32_t i = 0; i < t->n; i++)
            bad |= t->wire[(size_t)i * 4 + 3];
        bad <<= 24;
    }
    return (bad & 0x80000000u) ? PD_ERR_BAD_INPUT : PD_OK;
}

static pd_status_t check_blob(const proto_blob_t *b, uint32_t max)
{
    if (b->len > max)
        return PD_ERR_TOO_BIG;
    if (b->len != 0 && b->p == NULL)
        return PD_ERR_BAD_INPUT;
    return PD_OK;
}

static bool status_valid(int32_t s)
{
    return s >= PD_STATUS_MIN && s <= PD_INPROGRESS;
}

static bool status_error(int32_t s)
{
    return s >= PD_STATUS_MIN && s < 0;
}

/* First non-OK status of a sequence of checks. */
#define CHECK(expr)                                                           \
    do {                                                                      \
        pd_status_t _st = (expr);                                             \
        if (_st != PD_OK)                                                     \
            return _st;                                                       \
    } while (0)
#define REQUIRE(cond, st)                                                     \
    do {                                                                      \
        if (!(cond))                                                          \
            return (st);                                                      \
    } while (0)

static pd_status_t check_sampling(const proto_sampling_t *s)
{
    REQUIRE((s->flags & ~PROTO_SAMPLE_DEFINED) == 0, PD_ERR_RESERVED);
    REQUIRE(isfinite(s->temperature) && s->temperature >= 0.0f, PD_ERR_BAD_INPUT);
    REQUIRE(isfinite(s->top_p) && s->top_p >= 0.0f && s->top_p <= 1.0f,
            PD_ERR_BAD_INPUT);
    return check_tok_array(&s->stop, PROTO_MAX_STOP_TOKENS);
}

static bool f32_in(float v, float lo, float hi)
{
    return isfinite(v) && v >= lo && v <= hi;
}

static pd_status_t check_sampling2(const proto_sampling_t *s)
{
    REQUIRE(f32_in(s->presence_penalty, -2.0f, 2.0f) &&
            f32_in(s->frequency_penalty, -2.0f, 2.0f) &&
            f32_in(s->repetition_penalty, 0.0f, 2.0f) && f32_in(s->min_p, 0.0f, 1.0f),
            PD_ERR_BAD_INPUT);
    REQUIRE(s->n_bias <= PROTO_MAX_LOGIT_BIAS, PD_ERR_TOO_BIG);
    REQUIRE(s->logprobs <= 1 && s->top_logprobs <= PROTO_MAX_TOP_LOGPROBS &&
            (s->logprobs || s->top_logprobs == 0), PD_ERR_BAD_INPUT);
    for (uint32_t i = 0; i < s->n_bias; i++)
        REQUIRE(s->bias_ids[i] >= 0 && f32_in(s->bias[i], -100.0f, 100.0f), PD_ERR_BAD_INPUT);
    REQUIRE(s->gram_kind <= PROTO_GRAM_GBNF, PD_ERR_BAD_INPUT);
    REQUIRE(s->gram.len <= PROTO_MAX_GRAMMAR, PD_ERR_TOO_BIG);
    REQUIRE((s->gram_kind >= PROTO_GRAM_JSON_SCHEMA) == (s->gram.len > 0), PD_ERR_BAD_INPUT);
    return PD_OK;
}

/* The sampling head, in PREFILL_REQ and DECODE_REQ. */
static void io_sampling(io_t *io, proto_sampling_t *s)
{
    io_f32(io, &s->temperature);
    io_f32(io, &s->top_p);
    io_u32(io, &s->top_k);
    io_u32(io, &s->flags);
    io_u64(io, &s->seed);
    io_u32(io, &s->max_tokens);
    io_u32(io, &s->min_tokens);
    io_toks(io, &s->stop, PROTO_MAX_STOP_TOKENS);
}

/* The sampling tail (penalties, min_p, logit_bias, logprobs, grammar),
 * written last. */
static void io_sampling2(io_t *io, proto_sampling_t *s)
{
    io_f32(io, &s->presence_penalty);
    io_f32(io, &s->frequency_penalty);
    io_f32(io, &s->repetition_penalty);
    io_f32(io, &s->min_p);
    io_u32(io, &s->n_bias);
    if (!io_capped(io, &s->n_bias, PROTO_MAX_LOGIT_BIAS))
        return;
    for (uint32_t i = 0; i < s->n_bias; i++) {
        io_i32(io, &s->bias_ids[i]);
        io_f32(io, &s->bias[i]);
    }
    io_u32(io, &s->logprobs);
    io_u32(io, &s->top_logprobs);
    io_u32(io, &s->gram_kind);
    io_blob(io, &s->gram, PROTO_MAX_GRAMMAR);
}

/* ---- per-token logprobs tail ------------------------------------------ */

static bool lp_ok(float v)
{
    return !isnan(v) && v <= 0.0f;
}

static size_t lp_entry_bytes(uint32_t top_n)
{
    return 4u + 8u * (size_t)top_n;
}

void proto_logprobs_get(const proto_logprobs_t *l, uint32_t i, proto_logprob_t *out)
{
    memset(out, 0, sizeof(*out));
    if (i >= l->n)
        return;
    uint32_t k = l->top_n < PROTO_MAX_TOP_LOGPROBS ? l->top_n : PROTO_MAX_TOP_LOGPROBS;
    if (l->v != NULL) {
        out->logprob = l->v[i].logprob;
        memcpy(out->top_ids, l->v[i].top_ids, k * sizeof(out->top_ids[0]));
        memcpy(out->top_lp, l->v[i].top_lp, k * sizeof(out->top_lp[0]));
        return;
    }
    const uint8_t *p = l->wire + (size_t)i * lp_entry_bytes(l->top_n);
    uint32_t u = get_u32(p);
    memcpy(&out->logprob, &u, 4);
    for (uint32_t j = 0; j < k; j++) {
        out->top_ids[j] = (int32_t)get_u32(p + 4 + 8 * j);
        u = get_u32(p + 8 + 8 * j);
        memcpy(&out->top_lp[j], &u, 4);
    }
}

/* At most n_max entries, top_n within its cap, every value in range. */
static pd_status_t check_logprobs(const proto_logprobs_t *l, uint32_t n_max)
{
    REQUIRE(l->top_n <= PROTO_MAX_TOP_LOGPROBS, PD_ERR_TOO_BIG);
    REQUIRE(l->n <= n_max, PD_ERR_TOO_BIG);
    REQUIRE(l->n == 0 || l->v != NULL || l->wire != NULL, PD_ERR_BAD_INPUT);
    for (uint32_t i = 0; i < l->n; i++) {
        proto_logprob_t e;
        proto_logprobs_get(l, i, &e);
        REQUIRE(lp_ok(e.logprob), PD_ERR_BAD_INPUT);
        for (uint32_t j = 0; j < l->top_n; j++)
            REQUIRE(e.top_ids[j] >= 0 && lp_ok(e.top_lp[j]), PD_ERR_BAD_INPUT);
    }
    return PD_OK;
}

/* Written entry by entry from either form; read as a view into the frame
 * (the values are range-checked by check_logprobs() with the message). */
static void io_logprobs(io_t *io, proto_logprobs_t *l, uint32_t n_max)
{
    if (!io->rd) {
        w_u32(&io->w, l->top_n);
        w_u32(&io->w, l->n);
        for (uint32_t i = 0; i < l->n; i++) {
            proto_logprob_t e;
            proto_logprobs_get(l, i, &e);
            w_f32(&io->w, e.logprob);
            for (uint32_t j = 0; j < l->top_n; j++) {
                w_u32(&io->w, (uint32_t)e.top_ids[j]);
                w_f32(&io->w, e.top_lp[j]);
            }
        }
        return;
    }
    rd_t *r = &io->r;
    memset(l, 0, sizeof(*l));
    l->top_n = r_u32(r);
    uint32_t n = r_u32(r);
    if (r->st != PD_OK)
        return;
    if (l->top_n > PROTO_MAX_TOP_LOGPROBS || n > n_max) {
        l->top_n = 0;
        r_fail(r, PD_ERR_TOO_BIG);
        return;
    }
    const uint8_t *p = r_take(r, (size_t)n * lp_entry_bytes(l->top_n));
    if (p == NULL)
        return;
    l->n = n;
    l->wire = n ? p : NULL;
}

/* ---- per-message codecs ----------------------------------------------- */

/* HELLO */
static pd_status_t check_hello(const proto_hello_t *m)
{
    REQUIRE(m->role >= PROTO_ROLE_PREFILL && m->role <= PROTO_ROLE_ROUTER,
            PD_ERR_BAD_INPUT);
    REQUIRE((m->caps & ~PROTO_CAPS_DEFINED) == 0, PD_ERR_RESERVED);
    CHECK(check_str(m->daemon_id, PROTO_DAEMON_ID_MAX, true));
    return check_blob(&m->kv_addr, PROTO_KV_ADDR_MAX);
}

static void io_hello(io_t *io, proto_hello_t *m)
{
    io_u16(io, &m->role);
    io_reserved16(io);
    io_u32(io, &m->caps);
    io_str(io, m->daemon_id, PROTO_DAEMON_ID_MAX);
    io_u64(io, &m->incarnation);
    io_u64(io, &m->compat_hash);
    io_u32(io, &m->geom.n_layers);
    io_u32(io, &m->geom.n_kv_heads);
    io_u32(io, &m->geom.head_dim);
    io_u32(io, &m->geom.block_tokens);
    io_u32(io, &m->geom.kv_dtype);
    io_u32(io, &m->geom.total_blocks);
    io_u64(io, &m->geom.block_bytes);
    io_u32(io, &m->geom.context_length);
    io_u32(io, &m->geom.vocab_size);
    io_blob(io, &m->kv_addr, PROTO_KV_ADDR_MAX);
    io_fixed(io, m->nonce, PROTO_AUTH_NONCE_LEN);
    io_fixed(io, m->mac, PROTO_AUTH_MAC_LEN);
}

/* REGISTER_ACK */
static pd_status_t check_register_ack(const proto_register_ack_t *m)
{
    return check_str(m->daemon_id, PROTO_DAEMON_ID_MAX, true);
}

static void io_register_ack(io_t *io, proto_register_ack_t *m)
{
    io_str(io, m->daemon_id, PROTO_DAEMON_ID_MAX);
    io_u64(io, &m->incarnation);
    io_u64(io, &m->heartbeat_interval_ns);
    io_u64(io, &m->lease_ns);
    io_fixed(io, m->nonce, PROTO_AUTH_NONCE_LEN);
    io_fixed(io, m->mac, PROTO_AUTH_MAC_LEN);
}

/* CHALLENGE */
static pd_status_t check_challenge(const proto_challenge_t *m)
{
    (void)m;
    return PD_OK;
}

static void io_challenge(io_t *io, proto_challenge_t *m)
{
    io_fixed(io, m->nonce, PROTO_AUTH_NONCE_LEN);
}

/* REGISTER_REJECT */
static pd_status_t check_register_reject(const proto_register_reject_t *m)
{
    REQUIRE(status_error(m->status), PD_ERR_BAD_INPUT);
    return check_str(m->reason, PROTO_REASON_MAX, false);
}

static void io_register_reject(io_t *io, proto_register_reject_t *m)
{
    io_i32(io, &m->status);
    io_str(io, m->reason, PROTO_REASON_MAX);
}

/* HEARTBEAT */
static pd_status_t check_heartbeat(const proto_heartbeat_t *m)
{
    REQUIRE((m->flags & ~PROTO_HB_DEFINED) == 0, PD_ERR_RESERVED);
    return PD_OK;
}

static void io_heartbeat(io_t *io, proto_heartbeat_t *m)
{
    io_u64(io, &m->incarnation);
    io_u64(io, &m->sent_ns);
    io_u32(io, &m->flags);
    io_u32(io, &m->queue_depth);
    io_u32(io, &m->running_seqs);
    io_u32(io, &m->free_blocks);
    io_u32(io, &m->total_blocks);
    io_u32(io, &m->leases);
    io_u64(io, &m->outstanding_prefill_tokens);
}

/* PREFILL_REQ */
static pd_status_t check_prefill_req(const proto_prefill_req_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    CHECK(check_tok_array(&m->prompt, PROTO_MAX_PROMPT_TOKENS));
    CHECK(check_sampling(&m->sampling));
    CHECK(check_sampling2(&m->sampling));
    CHECK(check_str(m->target_decode_id, PROTO_DAEMON_ID_MAX, false));
    CHECK(check_str(m->src_peer_id, PROTO_DAEMON_ID_MAX, false));
    CHECK(check_blob(&m->src_handle, PROTO_KV_HANDLE_MAX));
    bool src = m->src_handle.len > 0;
    /* a source is all there or not at all; never the last prompt token */
    REQUIRE(src == (m->src_peer_id[0] != '\0') && src == (m->src_kv_tokens > 0) &&
            (src || m->src_lease_id == 0) && m->src_kv_tokens < (src ? m->prompt.n : 1u),
            PD_ERR_BAD_INPUT);
    return PD_OK;
}

static void io_prefill_req(io_t *io, proto_prefill_req_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_toks(io, &m->prompt, PROTO_MAX_PROMPT_TOKENS);
    io_sampling(io, &m->sampling);
    io_str(io, m->target_decode_id, PROTO_DAEMON_ID_MAX);
    io_u64(io, &m->deadline_ns);
    io_sampling2(io, &m->sampling);
    io_str(io, m->src_peer_id, PROTO_DAEMON_ID_MAX);
    io_u64(io, &m->src_lease_id);
    io_blob(io, &m->src_handle, PROTO_KV_HANDLE_MAX);
    io_u32(io, &m->src_kv_tokens);
    io_u64(io, &m->cache_partition);
}

/* PREFILL_DONE */
static pd_status_t check_prefill_done(const proto_prefill_done_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    REQUIRE(m->first_token >= 0, PD_ERR_BAD_INPUT);
    REQUIRE(m->cached_tokens <= m->n_prompt_tokens, PD_ERR_BAD_INPUT);
    CHECK(check_logprobs(&m->logprobs, 1));
    return check_blob(&m->kv_handle, PROTO_KV_HANDLE_MAX);
}

static void io_prefill_done(io_t *io, proto_prefill_done_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_i32(io, &m->first_token);
    io_u32(io, &m->n_prompt_tokens);
    io_u64(io, &m->lease_id);
    io_u64(io, &m->lease_ns);
    io_blob(io, &m->kv_handle, PROTO_KV_HANDLE_MAX);
    io_u64(io, &m->queue_ns);
    io_u64(io, &m->prefill_ns);
    io_u32(io, &m->cached_tokens);
    io_logprobs(io, &m->logprobs, 1);
}

/* DECODE_REQ */
static pd_status_t check_decode_req(const proto_decode_req_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    REQUIRE((m->flags & ~PROTO_DEC_DEFINED) == 0, PD_ERR_RESERVED);
    CHECK(check_tok_array(&m->prompt, PROTO_MAX_PROMPT_TOKENS));
    CHECK(check_tok_array(&m->generated, PROTO_MAX_GEN_TOKENS));
    CHECK(check_sampling(&m->sampling));
    CHECK(check_sampling2(&m->sampling));
    CHECK(check_str(m->prefill_peer_id, PROTO_DAEMON_ID_MAX, false));
    CHECK(check_blob(&m->kv_handle, PROTO_KV_HANDLE_MAX));
    bool local = (m->flags & PROTO_DEC_PREFILL_LOCALLY) != 0;
    REQUIRE(local == (m->kv_handle.len == 0), PD_ERR_BAD_INPUT);
    /* token 0 later: a prefill's handle, nothing generated yet, no forks */
    REQUIRE(!(m->flags & PROTO_DEC_TOKEN0_LATER) ||
            (!local && m->generated.n == 0 && m->kv_tokens == 0 && m->n_fork == 0),
            PD_ERR_BAD_INPUT);
    /* a handle's KV covers the prompt (0) or prompt + generated - 1 at most */
    REQUIRE(m->kv_tokens == 0 ||
            (!local && m->kv_tokens >= m->prompt.n && m->generated.n > 0 &&
             (uint64_t)m->kv_tokens <= (uint64_t)m->prompt.n + m->generated.n - 1),
            PD_ERR_BAD_INPUT);
    /* forks: of a prompt only, and "<id>/<i>" must fit an id */
    REQUIRE(m->n_fork <= PROTO_MAX_FORK, PD_ERR_TOO_BIG);
    REQUIRE(m->n_fork == 0 || (m->generated.n <= 1 && m->kv_tokens == 0 &&
                               strlen(m->request_id) + 3 <= PROTO_REQID_MAX),
            PD_ERR_BAD_INPUT);
    return PD_OK;
}

static void io_decode_req(io_t *io, proto_decode_req_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_u32(io, &m->flags);
    io_toks(io, &m->prompt, PROTO_MAX_PROMPT_TOKENS);
    io_toks(io, &m->generated, PROTO_MAX_GEN_TOKENS);
    io_sampling(io, &m->sampling);
    io_u64(io, &m->rng_state);
    io_str(io, m->prefill_peer_id, PROTO_DAEMON_ID_MAX);
    io_u64(io, &m->lease_id);
    io_blob(io, &m->kv_handle, PROTO_KV_HANDLE_MAX);
    io_u32(io, &m->kv_tokens);
    io_u64(io, &m->deadline_ns);
    io_sampling2(io, &m->sampling);
    io_u32(io, &m->n_fork);
    io_u64(io, &m->cache_partition);
}

/* TOKENS */
static pd_status_t check_tokens(const proto_tokens_msg_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    CHECK(check_tok_array(&m->tokens, PROTO_MAX_TOKENS_MSG));
    CHECK(check_logprobs(&m->logprobs, m->tokens.n));
    REQUIRE(m->logprobs.n == 0 || m->logprobs.n == m->tokens.n, PD_ERR_BAD_INPUT);
    return check_blob(&m->text, PROTO_MAX_TEXT);
}

static void io_tokens(io_t *io, proto_tokens_msg_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_u32(io, &m->seq);
    io_toks(io, &m->tokens, PROTO_MAX_TOKENS_MSG);
    io_blob(io, &m->text, PROTO_MAX_TEXT);
    io_logprobs(io, &m->logprobs, m->tokens.n);
}

/* FINISH */
static pd_status_t check_finish(const proto_finish_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    REQUIRE(m->reason <= PROTO_FINISH_REASON_MAX, PD_ERR_BAD_INPUT);
    REQUIRE(status_valid(m->status), PD_ERR_BAD_INPUT);
    REQUIRE(m->cached_tokens <= m->prompt_tokens, PD_ERR_BAD_INPUT);
    return PD_OK;
}

static void io_finish(io_t *io, proto_finish_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_u16(io, &m->reason);
    io_reserved16(io);
    io_i32(io, &m->status);
    io_u32(io, &m->prompt_tokens);
    io_u32(io, &m->completion_tokens);
    io_u64(io, &m->queue_ns);
    io_u64(io, &m->prefill_ns);
    io_u64(io, &m->transfer_ns);
    io_u64(io, &m->decode_ns);
    io_u64(io, &m->ttft_ns);
    io_u64(io, &m->total_ns);
    io_u32(io, &m->cached_tokens);
    io_u64(io, &m->kv_bytes);
}

/* CANCEL */
static pd_status_t check_cancel(const proto_cancel_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    REQUIRE(status_valid(m->status), PD_ERR_BAD_INPUT);
    return check_str(m->reason, PROTO_REASON_MAX, false);
}

static void io_cancel(io_t *io, proto_cancel_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_i32(io, &m->status);
    io_str(io, m->reason, PROTO_REASON_MAX);
}

/* RELEASE */
static pd_status_t check_release(const proto_release_t *m)
{
    return check_str(m->request_id, PROTO_REQID_MAX, true);
}

static void io_release(io_t *io, proto_release_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_u64(io, &m->lease_id);
}

/* ERROR */
static pd_status_t check_error(const proto_error_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, false));
    REQUIRE(status_error(m->status), PD_ERR_BAD_INPUT);
    return check_str(m->message, PROTO_ERRMSG_MAX, false);
}

static void io_error(io_t *io, proto_error_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_i32(io, &m->status);
    io_str(io, m->message, PROTO_ERRMSG_MAX);
}

/* PEER_INFO */
static pd_status_t check_peer_info(const proto_peer_info_t *m)
{
    CHECK(check_str(m->daemon_id, PROTO_DAEMON_ID_MAX, true));
    REQUIRE(m->role >= PROTO_ROLE_PREFILL && m->role <= PROTO_ROLE_ROUTER,
            PD_ERR_BAD_INPUT);
    return check_blob(&m->kv_addr, PROTO_KV_ADDR_MAX);
}

static void io_peer_info(io_t *io, proto_peer_info_t *m)
{
    io_str(io, m->daemon_id, PROTO_DAEMON_ID_MAX);
    io_u16(io, &m->role);
    io_reserved16(io);
    io_u64(io, &m->incarnation);
    io_blob(io, &m->kv_addr, PROTO_KV_ADDR_MAX);
}

/* PEER_DOWN */
static pd_status_t check_peer_down(const proto_peer_down_t *m)
{
    CHECK(check_str(m->daemon_id, PROTO_DAEMON_ID_MAX, true));
    REQUIRE(status_error(m->status), PD_ERR_BAD_INPUT);
    return PD_OK;
}

static void io_peer_down(io_t *io, proto_peer_down_t *m)
{
    io_str(io, m->daemon_id, PROTO_DAEMON_ID_MAX);
    io_u64(io, &m->incarnation);
    io_i32(io, &m->status);
}

/* MIGRATE */
static pd_status_t check_migrate(const proto_migrate_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    return check_str(m->target_decode_id, PROTO_DAEMON_ID_MAX, true);
}

static void io_migrate(io_t *io, proto_migrate_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_str(io, m->target_decode_id, PROTO_DAEMON_ID_MAX);
}

/* MIGRATE_DONE */
static pd_status_t check_migrate_done(const proto_migrate_done_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    REQUIRE(m->n_gen > 0 && m->kv_tokens > 0 && m->kv_handle.len > 0, PD_ERR_BAD_INPUT);
    return check_blob(&m->kv_handle, PROTO_KV_HANDLE_MAX);
}

static void io_migrate_done(io_t *io, proto_migrate_done_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_u32(io, &m->n_gen);
    io_u32(io, &m->kv_tokens);
    io_u64(io, &m->lease_id);
    io_u64(io, &m->lease_ns);
    io_blob(io, &m->kv_handle, PROTO_KV_HANDLE_MAX);
}

/* KV_EVENTS */
static pd_status_t check_kv_events(const proto_kv_events_t *m)
{
    REQUIRE((m->flags & ~PROTO_KVE_DEFINED) == 0, PD_ERR_RESERVED);
    REQUIRE((uint64_t)m->stored.n + m->removed.n <= PROTO_MAX_KV_EVENTS, PD_ERR_TOO_BIG);
    REQUIRE((m->stored.n == 0 || m->stored.v != NULL || m->stored.wire != NULL) &&
            (m->removed.n == 0 || m->removed.v != NULL || m->removed.wire != NULL),
            PD_ERR_BAD_INPUT);
    return PD_OK;
}

static void io_kv_events(io_t *io, proto_kv_events_t *m)
{
    io_u32(io, &m->flags);
    io_u32(io, &m->cached_blocks);
    io_names(io, &m->stored);
    io_names(io, &m->removed);
}

/* KV_EXPORT_REQ */
static pd_status_t check_kv_export_req(const proto_kv_export_req_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    CHECK(check_str(m->target_prefill_id, PROTO_DAEMON_ID_MAX, true));
    CHECK(check_tok_array(&m->prompt, PROTO_MAX_PROMPT_TOKENS));
    REQUIRE(m->prompt.n >= 2 && m->min_tokens < m->prompt.n, PD_ERR_BAD_INPUT);
    return PD_OK;
}

static void io_kv_export_req(io_t *io, proto_kv_export_req_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_str(io, m->target_prefill_id, PROTO_DAEMON_ID_MAX);
    io_toks(io, &m->prompt, PROTO_MAX_PROMPT_TOKENS);
    io_u32(io, &m->min_tokens);
    io_u64(io, &m->cache_partition);
}

/* KV_EXPORT_DONE */
static pd_status_t check_kv_export_done(const proto_kv_export_done_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    REQUIRE(m->kv_tokens > 0 && m->kv_handle.len > 0, PD_ERR_BAD_INPUT);
    return check_blob(&m->kv_handle, PROTO_KV_HANDLE_MAX);
}

static void io_kv_export_done(io_t *io, proto_kv_export_done_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_u32(io, &m->kv_tokens);
    io_u64(io, &m->lease_id);
    io_u64(io, &m->lease_ns);
    io_blob(io, &m->kv_handle, PROTO_KV_HANDLE_MAX);
}

/* PREFILL_HANDLE */
static pd_status_t check_prefill_handle(const proto_prefill_handle_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    REQUIRE(m->n_prompt_tokens > 0 && m->kv_handle.len > 0, PD_ERR_BAD_INPUT);
    return check_blob(&m->kv_handle, PROTO_KV_HANDLE_MAX);
}

static void io_prefill_handle(io_t *io, proto_prefill_handle_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_u32(io, &m->n_prompt_tokens);
    io_u64(io, &m->lease_id);
    io_u64(io, &m->lease_ns);
    io_blob(io, &m->kv_handle, PROTO_KV_HANDLE_MAX);
}

/* FIRST_TOKEN */
static pd_status_t check_first_token(const proto_first_token_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    REQUIRE(m->first_token >= 0, PD_ERR_BAD_INPUT);
    return PD_OK;
}

static void io_first_token(io_t *io, proto_first_token_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_i32(io, &m->first_token);
    io_u64(io, &m->rng_state);
}

/* EMBED_REQ */
static pd_status_t check_embed_req(const proto_embed_req_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    REQUIRE(m->pooling <= PROTO_POOL_LAST, PD_ERR_BAD_INPUT);
    REQUIRE(m->prompt.n > 0 && m->prompt.n <= PROTO_MAX_PROMPT_TOKENS, PD_ERR_BAD_INPUT);
    return PD_OK;
}

static void io_embed_req(io_t *io, proto_embed_req_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_u32(io, &m->pooling);
    io_toks(io, &m->prompt, PROTO_MAX_PROMPT_TOKENS);
}

/* EMBED_DONE */
static pd_status_t check_embed_done(const proto_embed_done_t *m)
{
    CHECK(check_str(m->request_id, PROTO_REQID_MAX, true));
    REQUIRE(m->n_prompt_tokens > 0, PD_ERR_BAD_INPUT);
    REQUIRE(m->vec.len > 0 && m->vec.len % 4 == 0, PD_ERR_BAD_INPUT);
    return check_blob(&m->vec, 4u * PROTO_MAX_EMBD);
}

static void io_embed_done(io_t *io, proto_embed_done_t *m)
{
    io_str(io, m->request_id, PROTO_REQID_MAX);
    io_u32(io, &m->n_prompt_tokens);
    io_u64(io, &m->queue_ns);
    io_u64(io, &m->compute_ns);
    io_blob(io, &m->vec, 4u * PROTO_MAX_EMBD);
}

float proto_embed_get(const proto_embed_done_t *d, uint32_t i)
{
    const uint8_t *p = d->vec.p + (size_t)i * 4;
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* ---- dispatch generated from PROTO_MSG_LIST --------------------------- */

const char *proto_kv_dtype_name(uint32_t kv_dtype)
{
    static const char *const names[] = { "f32", "f16", "q8_0", "q4_0", "bf16",
                                         "fp8_e4m3" }; /* eng_kv_dtype_t order */
    return kv_dtype < sizeof(names) / sizeof(names[0]) ? names[kv_dtype] : "unknown";
}

const char *proto_kv_dtypes_str(uint32_t kv_dtype, char *buf, size_t len)
{
    uint32_t k = PROTO_KV_DTYPE_K(kv_dtype), v = PROTO_KV_DTYPE_V(kv_dtype);
    if (k == v)
        snprintf(buf, len, "%s", proto_kv_dtype_name(k));
    else
        snprintf(buf, len, "k=%s,v=%s", proto_kv_dtype_name(k), proto_kv_dtype_name(v));
    return buf;
}

const char *proto_msg_name(uint16_t type)
{
    switch (type) {
#define PROTO_X_NAME(NAME, name, code, max) case code: return #NAME;
    PROTO_MSG_LIST(PROTO_X_NAME)
#undef PROTO_X_NAME
    }
    return "UNKNOWN";
}

bool proto_msg_type_known(uint16_t type)
{
    return proto_msg_body_max(type) != 0;
}

uint32_t proto_msg_body_max(uint16_t type)
{
    switch (type) {
#define PROTO_X_MAX(NAME, name, code, max) case code: return (max);
    PROTO_MSG_LIST(PROTO_X_MAX)
#undef PROTO_X_MAX
    }
    return 0;
}

#define PROTO_X_ASSERT(NAME, name, code, max)                                  \
    _Static_assert((max) <= PROTO_BODY_MAX, #NAME " body cap over PROTO_BODY_MAX"); \
    _Static_assert((code) > 0 && (code) <= 0xffff, #NAME " code out of range");
PROTO_MSG_LIST(PROTO_X_ASSERT)
#undef PROTO_X_ASSERT

static pd_status_t check_body(uint16_t type, const proto_msg_t *msg)
{
    switch (type) {
#define PROTO_X_CHECK(NAME, name, code, max)                                  \
    case code: return check_##name(&msg->u.name);
    PROTO_MSG_LIST(PROTO_X_CHECK)
#undef PROTO_X_CHECK
    }
    return PD_ERR_BAD_TYPE;
}

/* Walks the body one way or the other. Encoding reads the message only
 * (see io_t), so the const is cast away for the walk, never for a store. */
static void io_body(io_t *io, uint16_t type, proto_msg_t *msg)
{
    switch (type) {
#define PROTO_X_IO(NAME, name, code, max)                                     \
    case code: io_##name(io, &msg->u.name); break;
    PROTO_MSG_LIST(PROTO_X_IO)
#undef PROTO_X_IO
    }
}

pd_status_t proto_body_decode(uint16_t type, const uint8_t *body, size_t len,
                              proto_msg_t *msg)
{
    io_t io = { .rd = true, .r = { body, len, 0, PD_OK } };
    uint32_t max = proto_msg_body_max(type);

    if (max == 0)
        return PD_ERR_BAD_TYPE;
    if (len > max)
        return PD_ERR_TOO_BIG;
    if (len != 0 && body == NULL)
        return PD_ERR_BAD_INPUT;
    memset(&msg->u, 0, sizeof(msg->u));
    io_body(&io, type, msg);
    if (io.r.st != PD_OK)
        return io.r.st;
    if (io.r.off != len)
        return PD_ERR_BAD_INPUT; /* trailing bytes */
    return check_body(type, msg);
}

pd_status_t proto_body_encode(const proto_msg_t *msg, uint8_t *buf, size_t cap,
                              size_t *len_p)
{
    io_t io = { .rd = false, .w = { buf, buf ? cap : 0, 0 } };
    pd_status_t st = check_body(msg->hdr.type, msg);
    if (st != PD_OK)
        return st;
    io_body(&io, msg->hdr.type, (proto_msg_t *)msg);
    if (io.w.len > proto_msg_body_max(msg->hdr.type))
        return PD_ERR_TOO_BIG; /* cannot happen when the caps add up */
    *len_p = io.w.len;
    return io.w.len <= io.w.cap ? PD_OK : PD_ERR_NO_SPACE;
}

/* ---- header and frames ------------------------------------------------ */

void proto_hdr_encode(const proto_hdr_t *hdr, uint8_t out[PROTO_HDR_LEN])
{
    put_u32(out, PROTO_MAGIC);
    put_u16(out + 4, PROTO_VERSION);
    put_u16(out + 6, hdr->type);
    put_u16(out + 8, hdr->flags);
    put_u16(out + 10, 0);
    put_u32(out + 12, hdr->body_len);
    put_u64(out + 16, hdr->tag);
    put_u64(out + 24, 0);
}

pd_status_t proto_hdr_decode(const uint8_t *buf, size_t len, proto_hdr_t *hdr_p)
{
    if (len < PROTO_HDR_LEN)
        return PD_ERR_TRUNCATED;
    if (get_u32(buf) != PROTO_MAGIC)
        return PD_ERR_BAD_MAGIC;
    if (get_u16(buf + 4) != PROTO_VERSION)
        return PD_ERR_BAD_VERSION;
    uint16_t type = get_u16(buf + 6);
    uint32_t max = proto_msg_body_max(type);
    if (max == 0)
        return PD_ERR_BAD_TYPE;
    uint16_t flags = get_u16(buf + 8);
    if ((flags & ~PROTO_FLAGS_DEFINED) != 0 || get_u16(buf + 10) != 0 ||
        get_u64(buf + 24) != 0)
        return PD_ERR_RESERVED;
    uint32_t body_len = get_u32(buf + 12);
    if (body_len > max)
        return PD_ERR_TOO_BIG;
    hdr_p->type = type;
    hdr_p->flags = flags;
    hdr_p->body_len = body_len;
    hdr_p->tag = get_u64(buf + 16);
    return PD_OK;
}

pd_status_t proto_frame_check(const uint8_t *buf, size_t len,
                              proto_hdr_t *hdr_p, size_t *frame_len_p)
{
    proto_hdr_t hdr;

    if (len < PROTO_HDR_LEN) {
        *frame_len_p = PROTO_HDR_LEN;
        return PD_INPROGRESS;
    }
    pd_status_t st = proto_hdr_decode(buf, len, &hdr);
    if (st != PD_OK)
        return st;
    *frame_len_p = PROTO_HDR_LEN + (size_t)hdr.body_len;
    *hdr_p = hdr;
    return len >= *frame_len_p ? PD_OK : PD_INPROGRESS;
}

pd_status_t proto_frame_next(const uint8_t *buf, size_t len, proto_msg_t *msg,
                             size_t *frame_len_p)
{
    proto_hdr_t hdr;
    pd_status_t st = proto_frame_check(buf, len, &hdr, frame_len_p);
    if (st != PD_OK)
        return st;
    st = proto_body_decode(hdr.type, buf + PROTO_HDR_LEN, hdr.body_len, msg);
    if (st != PD_OK)
        return st;
    msg->hdr = hdr;
    return PD_OK;
}

pd_status_t proto_msg_decode(const uint8_t *buf, size_t len, proto_msg_t *msg)
{
    proto_hdr_t hdr;
    pd_status_t st = proto_hdr_decode(buf, len, &hdr);
    if (st != PD_OK)
        return st;
    if (len - PROTO_HDR_LEN < hdr.body_len)
        return PD_ERR_TRUNCATED;
    if (len - PROTO_HDR_LEN > hdr.body_len)
        return PD_ERR_BAD_INPUT;
    st = proto_body_decode(hdr.type, buf + PROTO_HDR_LEN, hdr.body_len, msg);
    if (st != PD_OK)
        return st;
    msg->hdr = hdr;
    return PD_OK;
}

pd_status_t proto_msg_encode(const proto_msg_t *msg, uint8_t *buf, size_t cap,
                             size_t *len_p)
{
    size_t body_len = 0;
    pd_status_t st;

    if (!proto_msg_type_known(msg->hdr.type))
        return PD_ERR_BAD_TYPE;
    if ((msg->hdr.flags & ~PROTO_FLAGS_DEFINED) != 0)
        return PD_ERR_RESERVED;
    if (buf == NULL || cap < PROTO_HDR_LEN) {
        st = proto_body_encode(msg, NULL, 0, &body_len);
        if (st != PD_OK && st != PD_ERR_NO_SPACE)
            return st;
        *len_p = PROTO_HDR_LEN + body_len;
        return PD_ERR_NO_SPACE;
    }
    st = proto_body_encode(msg, buf + PROTO_HDR_LEN, cap - PROTO_HDR_LEN,
                           &body_len);
    if (st != PD_OK && st != PD_ERR_NO_SPACE)
        return st;
    *len_p = PROTO_HDR_LEN + body_len;
    if (st != PD_OK)
        return st;
    proto_hdr_t hdr = msg->hdr;
    hdr.body_len = (uint32_t)body_len;
    proto_hdr_encode(&hdr, buf);
    return PD_OK;
}

pd_status_t proto_mac_input(const uint8_t *frame, size_t len,
                            const uint8_t **p_p, size_t *len_p)
{
    proto_hdr_t hdr;
    pd_status_t st = proto_hdr_decode(frame, len, &hdr);
    if (st != PD_OK)
        return st;
    if (hdr.type != PROTO_MSG_HELLO && hdr.type != PROTO_MSG_REGISTER_ACK)
        return PD_ERR_BAD_TYPE;
    if (len - PROTO_HDR_LEN < hdr.body_len || hdr.body_len < PROTO_AUTH_MAC_LEN)
        return PD_ERR_TRUNCATED;
    *p_p = frame;
    *len_p = PROTO_HDR_LEN + hdr.body_len - PROTO_AUTH_MAC_LEN;
    return PD_OK;
}
