/* gram_pda.c - the runtime: a set of pushdown configurations walked one byte
 * at a time over the rule graph (eng_gram_state_t), and the shortest
 * completion of a configuration (the token budget). */
#include "gram_int.h"

#include <stdlib.h>
#include <string.h>

/* ---- runtime: configurations of a pushdown automaton over bytes ----------- */


#define PH_FRESH 0x80u  /* N_REP: its body was begun for the byte being fed */

static void set_add(set_t *out, cfg_t *c)
{
    for (uint32_t i = 0; i < c->n; i++)
        c->f[i].phase &= (uint8_t)~PH_FRESH;
    for (uint32_t i = 0; i < out->n; i++) {
        const cfg_t *o = &out->c[i];
        if (o->n == c->n && o->num == c->num && memcmp(o->f, c->f, c->n * sizeof(frame_t)) == 0)
            return;
    }
    if (out->n >= ENG_GRAM_MAX_CONFIGS)
        return; /* fewer choices, each still a valid prefix */
    cfg_t *d = &out->c[out->n++];
    d->n = c->n;
    d->num = c->num;
    memcpy(d->f, c->f, c->n * sizeof(frame_t));
}

/* Push a frame for node, admitted only if node's shallowest completion
 * fits under the cap (so every live configuration can still complete). */
static bool push(const eng_gram_t *g, cfg_t *c, uint32_t node, uint8_t depth)
{
    if (c->n + g->nodes[node].sdep > ENG_GRAM_MAX_STACK)
        return false;
    c->f[c->n++] = (frame_t){ node, P_START, depth, 0 };
    c->num = 0;
    return true;
}

static bool is_digit(uint8_t b)
{
    return b >= '0' && b <= '9';
}

static bool is_hex(uint8_t b)
{
    return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}

/* What one frame did with the byte: FEED_DONE (the configuration went to
 * out, or died), FEED_NEXT (a frame was pushed or popped: the byte goes
 * to the new top frame). */
typedef enum { FEED_DONE, FEED_NEXT } feed_t;

static void feed_cfg(const eng_gram_t *g, cfg_t *c, uint8_t b, set_t *out);

/* The configurations a fork (an alternative, a repetition's exit, an
 * optional property left out) already fed the byte being fed: the same
 * configuration and byte give the same results, so each is fed once.
 * Without this, nested repetitions that may match nothing (`((a?b?)*c?)*`,
 * `((a|)*|)*`) reached the same configuration by 2^depth paths at every
 * byte. Fingerprints (64 bits) per thread, cleared per byte by a
 * generation; past half the table a fork is dropped (fewer choices, each
 * still a valid prefix, as set_add past ENG_GRAM_MAX_CONFIGS): a byte's
 * work stays bounded whatever the grammar. */
#define FORK_SLOTS 8192u
static _Thread_local struct {
    uint64_t fp[FORK_SLOTS];
    uint32_t gen[FORK_SLOTS];
    uint32_t cur, used, calls;
} forks;

static void forks_reset(void)
{
    forks.used = forks.calls = 0;
    if (++forks.cur == 0) { /* wrapped: no slot may look current */
        memset(forks.gen, 0, sizeof(forks.gen));
        forks.cur = 1;
    }
}

static bool fork_new(const cfg_t *k)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ k->n ^ (k->num * 0xff51afd7ed558ccdull);
    for (uint32_t i = 0; i < k->n; i++) {
        uint64_t w;
        memcpy(&w, &k->f[i], sizeof(w));
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    if (forks.used >= FORK_SLOTS / 2)
        return false;
    uint32_t j = (uint32_t)h & (FORK_SLOTS - 1);
    for (; forks.gen[j] == forks.cur; j = (j + 1) & (FORK_SLOTS - 1))
        if (forks.fp[j] == h)
            return false;
    forks.gen[j] = forks.cur;
    forks.fp[j] = h;
    forks.used++;
    return true;
}

/* The first FORK_FREE forks of a byte go unchecked: a usual grammar
 * takes fewer (fingerprinting every fork made pd-gram-bench's masks up to
 * 2.4x slower; docs/BENCHMARKS.md "engine/gram"), and a repeated
 * configuration is then fed at most twice. */
#define FORK_FREE 256u
static void feed_fork(const eng_gram_t *g, cfg_t *k, uint8_t b, set_t *out)
{
    if (forks.calls++ < FORK_FREE || fork_new(k))
        feed_cfg(g, k, b, out);
}

/* One of alts: each alternative on its own copy of the stack. */
static feed_t feed_anyof(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                         uint8_t b, set_t *out)
{
    uint32_t n0 = c->n - 1;
    uint8_t d = f->depth;
    for (uint32_t i = 0; i < nd->n; i++) {
        cfg_t k;
        k.n = n0;
        k.num = c->num;
        memcpy(k.f, c->f, n0 * sizeof(frame_t));
        uint32_t alt = g->alts[nd->a + i];
        if (!push(g, &k, alt, d))
            continue;
        if (g->nodes[alt].min == 0) /* may match nothing: on to what follows */
            feed_fork(g, &k, b, out);
        else
            feed_cfg(g, &k, b, out);
    }
    return FEED_DONE;
}

/* Exact bytes. */
static feed_t feed_lit(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                       uint8_t b, set_t *out)
{
    if (b != (uint8_t)g->pool[nd->a + f->aux])
        return FEED_DONE;
    if (++f->aux == nd->n)
        c->n--;
    set_add(out, c);
    return FEED_DONE;
}

/* A string of a format (fmt_step). */
static feed_t feed_fmt(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                       uint8_t b, set_t *out)
{
    if (f->phase == S_OPEN) {
        if (b != '"')
            return FEED_DONE;
        f->phase = S_BODY;
        c->num = 0;
    } else if (b == '"') {
        if (gram_fmt_rest(nd->n, f->aux) != 0)
            return FEED_DONE;
        c->n--;
        c->num = 0;
    } else {
        int ns = gram_fmt_step(nd->n, f->aux, (uint8_t)c->num, b);
        if (ns < 0)
            return FEED_DONE;
        f->aux = (uint16_t)ns;
        c->num = b;
    }
    set_add(out, c);
    return FEED_DONE;
}

/* A string; bounded (n > 0): c->num counts characters; no \u escapes, so
 * that a character is one count (a surrogate pair would be two). */
static feed_t feed_str(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                       uint8_t b, set_t *out)
{
    const grange_t *r = nd->n ? &g->ranges[nd->n - 1] : NULL;
    switch (f->phase) {
    case S_OPEN:
        if (b != '"')
            return FEED_DONE;
        f->phase = S_BODY;
        c->num = 0;
        break;
    case S_BODY:
        if (r != NULL && b != '"' && (int64_t)c->num >= r->hi)
            return FEED_DONE;
        if (r != NULL && b == '"' && (int64_t)c->num < r->lo)
            return FEED_DONE;
        if (b == '"') {
            c->n--;
            c->num = 0;
            break;
        }
        if (r != NULL && b >= 0x20 && (b < 0x80 || b >= 0xc2))
            c->num++;
        if (b == '\\')
            f->phase = S_ESC;
        else if (b < 0x20)
            return FEED_DONE;
        else if (b >= 0x80) {
            if (b >= 0xc2 && b <= 0xdf)
                f->aux = 1;
            else if (b >= 0xe0 && b <= 0xef)
                f->aux = 2;
            else if (b >= 0xf0 && b <= 0xf4)
                f->aux = 3;
            else
                return FEED_DONE;
            f->phase = S_UTF;
        }
        break;
    case S_ESC:
        if (b == 'u' && r == NULL) {
            f->phase = S_HEX;
            f->aux = 4;
        } else if (strchr("\"\\/bfnrt", b) && b != 0) {
            f->phase = S_BODY;
        } else {
            return FEED_DONE;
        }
        break;
    case S_HEX:
        if (!is_hex(b))
            return FEED_DONE;
        if (--f->aux == 0)
            f->phase = S_BODY;
        break;
    case S_UTF:
        if (b < 0x80 || b > 0xbf)
            return FEED_DONE;
        if (--f->aux == 0)
            f->phase = S_BODY;
        break;
    }
    set_add(out, c);
    return FEED_DONE;
}

/* A number or an integer; a bounded integer keeps every prefix able to
 * land in its range. */
static feed_t feed_num(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                       uint8_t b, set_t *out)
{
    if (nd->n) { /* bounded: every prefix can still land in r (a multiple of m) */
        const grange_t *r = &g->ranges[nd->n - 1];
        int64_t m = nd->x ? g->ranges[nd->x - 1].lo : 1;
        int64_t v = (int64_t)c->num;
        int64_t dg = b - '0';
        /* a bounded number: the integer part J in r, and a fraction only
         * where all of (J-1, J] / [J, J+1) lies in r */
        bool frac = nd->kind == N_NUM && b == '.' &&
                    (f->phase == M_ZERO || f->phase == M_INT) && v >= r->lo && v <= r->hi &&
                    (v > 0 || (v == 0 && f->phase == M_ZERO) ? v < r->hi : v > r->lo);
        if (frac) {
            f->phase = M_DOT;
            set_add(out, c);
            return FEED_DONE;
        }
        switch (f->phase) {
        case M_DOT:
            if (!is_digit(b))
                return FEED_DONE;
            f->phase = M_FRAC;
            f->aux = 1;
            set_add(out, c);
            return FEED_DONE;
        case M_FRAC:
            if (is_digit(b) && f->aux < MAX_FRAC_DIGITS) {
                f->aux++;
                set_add(out, c);
                return FEED_DONE;
            }
            c->n--;
            c->num = 0;
            return FEED_NEXT;
        case M_START:
            if (b == '-' && r->lo <= -1 &&
                gram_has_mult(r->lo, r->hi < -1 ? r->hi : -1, m)) {
                f->phase = M_MINUS;
            } else if (b == '0' && r->lo <= 0 && r->hi >= 0) {
                f->phase = M_ZERO;
            } else if (b >= '1' && b <= '9' && gram_int_more(r, m, dg, false, 1) != UINT32_MAX) {
                f->phase = M_INT;
                f->aux = 1;
                c->num = (uint64_t)dg;
            } else {
                return FEED_DONE;
            }
            set_add(out, c);
            return FEED_DONE;
        case M_MINUS: /* no "-0" */
            if (b < '1' || b > '9' || gram_int_more(r, m, -dg, true, 1) == UINT32_MAX)
                return FEED_DONE;
            f->phase = M_INT;
            f->aux = 1;
            c->num = (uint64_t)-dg;
            set_add(out, c);
            return FEED_DONE;
        case M_INT:
            if (is_digit(b)) {
                bool neg = v < 0;
                __int128 nv = (__int128)v * 10 + (neg ? -dg : dg);
                if (f->aux >= 19 || nv < INT64_MIN || nv > INT64_MAX ||
                    gram_int_more(r, m, (int64_t)nv, neg, f->aux + 1u) == UINT32_MAX)
                    return FEED_DONE;
                f->aux++;
                c->num = (uint64_t)(int64_t)nv;
                set_add(out, c);
                return FEED_DONE;
            }
            if (v < r->lo || v > r->hi || (m > 1 && v % m != 0))
                return FEED_DONE;
            break;
        case M_ZERO:
            break;
        default:
            return FEED_DONE;
        }
        c->n--; /* the number ended: the byte belongs to the parent */
        c->num = 0;
        return FEED_NEXT;
    }
    bool integer = nd->kind == N_INT;
    bool accepting = f->phase == M_ZERO || f->phase == M_INT ||
                     f->phase == M_FRAC || f->phase == M_EXPDIG;
    bool took = true;
    switch (f->phase) {
    case M_START:
    case M_MINUS:
        if (b == '-' && f->phase == M_START)
            f->phase = M_MINUS;
        else if (b == '0')
            f->phase = M_ZERO;
        else if (b >= '1' && b <= '9') {
            f->phase = M_INT;
            f->aux = 1;
        } else
            return FEED_DONE;
        break;
    case M_ZERO:
    case M_INT:
        if (is_digit(b) && f->phase == M_INT && f->aux < MAX_INT_DIGITS)
            f->aux++;
        else if (b == '.' && !integer) {
            f->phase = M_DOT;
            f->aux = 0;
        } else if ((b == 'e' || b == 'E') && !integer) {
            f->phase = M_EXPCH;
            f->aux = 0;
        } else
            took = false;
        break;
    case M_DOT:
        if (!is_digit(b))
            return FEED_DONE;
        f->phase = M_FRAC;
        f->aux = 1;
        break;
    case M_FRAC:
        if (is_digit(b) && f->aux < MAX_FRAC_DIGITS)
            f->aux++;
        else if (b == 'e' || b == 'E') {
            f->phase = M_EXPCH;
            f->aux = 0;
        } else
            took = false;
        break;
    case M_EXPCH:
        if (b == '+' || b == '-')
            f->phase = M_EXPSIGN;
        else if (is_digit(b)) {
            f->phase = M_EXPDIG;
            f->aux = 1;
        } else
            return FEED_DONE;
        break;
    case M_EXPSIGN:
        if (!is_digit(b))
            return FEED_DONE;
        f->phase = M_EXPDIG;
        f->aux = 1;
        break;
    case M_EXPDIG:
        if (is_digit(b) && f->aux < MAX_EXP_DIGITS)
            f->aux++;
        else
            took = false;
        break;
    }
    if (took) {
        set_add(out, c);
        return FEED_DONE;
    }
    if (!accepting)
        return FEED_DONE;
    c->n--; /* the number ended: the byte belongs to the parent */
    return FEED_NEXT;
}

/* Any object (also N_ANYVAL once it chose an object). */
static feed_t feed_anyobj(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                          uint8_t b, set_t *out)
{
    switch (f->phase) {
    case O_OPEN:
        if (b != '{')
            return FEED_DONE;
        f->phase = O_NEXT;
        set_add(out, c);
        return FEED_DONE;
    case O_NEXT: /* after '{' */
        if (b == '}') {
            c->n--;
            set_add(out, c);
            return FEED_DONE;
        }
        /* fall through */
    case O_FCOMMA: {
        if (b != '"')
            return FEED_DONE;
        f->phase = O_FCOLON;
        if (!push(g, c, nd->a, f->depth)) /* key: gram_any_block()'s N_STR */
            return FEED_DONE;
        return FEED_NEXT;
    }
    case O_FCOLON:
        if (b != ':')
            return FEED_DONE;
        f->phase = O_VAL;
        set_add(out, c);
        return FEED_DONE;
    case O_VAL: {
        f->phase = O_FAFTER;
        uint32_t val = nd->kind == N_ANYVAL ? f->node : nd->a + 5;
        if (!push(g, c, val, f->depth + 1))
            return FEED_DONE;
        return FEED_NEXT;
    }
    case O_FAFTER:
        if (b == ',') {
            f->phase = O_FCOMMA;
            set_add(out, c);
        } else if (b == '}') {
            c->n--;
            set_add(out, c);
        }
        return FEED_DONE;
    }
    return FEED_DONE;
}

/* An array, or any value (its kind chosen by its first byte). */
static feed_t feed_arr(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                       uint8_t b, set_t *out)
{
    if (nd->kind == N_ANYVAL && f->phase == P_START && f->aux == 0) {
        /* choose the value's kind by its first byte */
        if (b == '{') {
            if (f->depth >= ENG_GRAM_ANY_DEPTH)
                return FEED_DONE;
            f->aux = 2; /* object */
        } else if (b == '[') {
            if (f->depth >= ENG_GRAM_ANY_DEPTH)
                return FEED_DONE;
            f->aux = 1; /* array */
        } else {
            /* scalars: replace the frame by a literal/string/number */
            uint32_t node;
            if (b == '"')
                node = 2;
            else if (b == '-' || is_digit(b))
                node = 3;
            else if (b == 't')
                node = 4;
            else if (b == 'f')
                node = 5;
            else if (b == 'n')
                node = 6;
            else
                return FEED_DONE;
            /* base + 0..4: see gram_any_block() */
            uint32_t base = g->nodes[f->node].a;
            *f = (frame_t){ base + node - 2, P_START, f->depth, 0 };
            return FEED_NEXT;
        }
    }
    if (nd->kind == N_ANYVAL && f->aux == 2) {
        /* a free object: behave as N_ANYOBJ */
        return feed_anyobj(g, c, f, nd, b, out);
    }
    switch (f->phase) {
    case A_OPEN:
        if (b != '[')
            return FEED_DONE;
        f->phase = A_FIRST;
        set_add(out, c);
        return FEED_DONE;
    case A_FIRST:
        if (b == ']') {
            if (nd->kind == N_ARR && nd->n && g->ranges[nd->n - 1].lo > 0)
                return FEED_DONE;
            c->n--;
            set_add(out, c);
            return FEED_DONE;
        }
        if (nd->kind == N_ARR && nd->n && g->ranges[nd->n - 1].hi < 1)
            return FEED_DONE;
        /* fall through */
    case A_ITEM: {
        if (nd->kind == N_ARR && nd->n) /* bounded: items begun */
            f->aux = f->phase == A_FIRST ? 1 : (uint16_t)(f->aux + (f->aux < 65535));
        f->phase = A_AFTER;
        uint32_t item = nd->kind == N_ARR ? nd->a : f->node;
        uint8_t d = f->depth + (nd->kind == N_ANYVAL ? 1 : 0);
        if (!push(g, c, item, d))
            return FEED_DONE;
        return FEED_NEXT;
    }
    case A_AFTER: {
        const grange_t *r = nd->kind == N_ARR && nd->n ? &g->ranges[nd->n - 1] : NULL;
        if (b == ',' && (r == NULL || f->aux < r->hi)) {
            f->phase = A_ITEM;
            set_add(out, c);
        } else if (b == ']' && (r == NULL || f->aux >= r->lo)) {
            c->n--;
            set_add(out, c);
        }
        return FEED_DONE;
    }
    }
    return FEED_DONE;
}

/* A schema object: its properties in order. */
#define PH_EMIT 0x40u  /* N_OBJ: a property was written (the next needs a ',') */

static feed_t feed_obj(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                       uint8_t b, set_t *out)
{
    uint8_t em = f->phase & PH_EMIT;
    switch (f->phase & ~PH_EMIT) {
    case O_OPEN:
        if (b != '{')
            return FEED_DONE;
        f->phase = O_NEXT;
        set_add(out, c);
        return FEED_DONE;
    case O_NEXT: {
        if (f->aux == nd->n) {
            if (b != '}')
                return FEED_DONE;
            c->n--;
            set_add(out, c);
            return FEED_DONE;
        }
        const gprop_t *p = &g->props[nd->a + f->aux];
        if (p->opt) { /* left out: the same byte goes to the next property */
            cfg_t k;
            k.n = c->n;
            k.num = c->num;
            memcpy(k.f, c->f, c->n * sizeof(frame_t));
            k.f[k.n - 1].aux++;
            feed_fork(g, &k, b, out);
            /* taken only if its value's shallowest completion fits */
            if (c->n + g->nodes[p->val].sdep > ENG_GRAM_MAX_STACK)
                return FEED_DONE;
        }
        if (em) {
            if (b != ',')
                return FEED_DONE;
            f->phase = O_KEY | PH_EMIT;
            set_add(out, c);
            return FEED_DONE;
        }
    }
        /* fall through */
    case O_KEY:
        f->phase = O_VAL | PH_EMIT;
        if (!push(g, c, g->props[nd->a + f->aux].key, f->depth))
            return FEED_DONE;
        return FEED_NEXT;
    case O_VAL: {
        uint32_t v = g->props[nd->a + f->aux].val;
        f->phase = O_NEXT | PH_EMIT;
        f->aux++;
        if (!push(g, c, v, f->depth))
            return FEED_DONE;
        return FEED_NEXT;
    }
    }
    return FEED_DONE;
}

/* A sequence: its children one after another (aux: the next one). */
static feed_t feed_seq(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                       uint8_t b, set_t *out)
{
    (void)b;
    (void)out;
    if (f->aux < nd->n) {
        uint32_t ch = g->alts[nd->a + f->aux];
        f->aux++;
        return push(g, c, ch, f->depth) ? FEED_NEXT : FEED_DONE;
    }
    c->n--;
    c->num = 0;
    return FEED_NEXT;
}

/* A repetition (aux: bodies begun, kept at lo once above it when
 * unbounded, so that x* is one configuration however long). A body that
 * ends without a byte (PH_FRESH still set) is not begun again for this
 * byte: empty bodies could fill any count, so leaving is allowed. */
static feed_t feed_rep(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                       uint8_t b, set_t *out)
{
    const grange_t *r = &g->ranges[nd->n - 1];
    bool fresh = (f->phase & PH_FRESH) != 0;
    bool unb = r->hi == INT64_MAX;
    bool more = !fresh && (unb || f->aux < r->hi);
    bool stop = fresh || f->aux >= r->lo;
    if (more) {
        if (stop) {
            cfg_t k;
            k.n = c->n - 1;
            k.num = 0;
            memcpy(k.f, c->f, k.n * sizeof(frame_t));
            feed_fork(g, &k, b, out);
        }
        f->phase |= PH_FRESH;
        if (!unb || f->aux < r->lo)
            f->aux++;
        return push(g, c, nd->a, f->depth) ? FEED_NEXT : FEED_DONE;
    }
    if (!stop)
        return FEED_DONE;
    c->n--;
    c->num = 0;
    return FEED_NEXT;
}

/* A call: the frame becomes the callee's. */
static feed_t feed_ref(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                       uint8_t b, set_t *out)
{
    (void)g;
    (void)c;
    (void)b;
    (void)out;
    *f = (frame_t){ nd->a, P_START, f->depth, 0 };
    return FEED_NEXT;
}

/* One UTF-8 character in a class. phase: the character's length once its
 * first byte is in, aux: bytes still to come, c->num: its bits so far.
 * Each byte keeps only prefixes that some member of the class completes
 * (ranges are merged, so a negated class is "not all inside one range"). */
static feed_t feed_class(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                         uint8_t b, set_t *out)
{
    uint64_t acc;
    uint32_t len, rem;
    if (f->phase == 0) {
        if (b < 0x80)
            len = 1, acc = b;
        else if (b >= 0xc2 && b <= 0xdf)
            len = 2, acc = b & 0x1f;
        else if (b >= 0xe0 && b <= 0xef)
            len = 3, acc = b & 0x0f;
        else if (b >= 0xf0 && b <= 0xf4)
            len = 4, acc = b & 0x07;
        else
            return FEED_DONE;
        rem = len - 1;
    } else {
        if ((b & 0xc0) != 0x80)
            return FEED_DONE;
        len = f->phase;
        rem = f->aux - 1u;
        if (len == 3 && rem == 1 && c->num == 0xd && (b & 0x3f) >= 0x20)
            return FEED_DONE; /* a surrogate */
        acc = c->num << 6 | (b & 0x3f);
    }
    static const int64_t lmin[5] = { 0, 0, 0x80, 0x800, 0x10000 };
    static const int64_t lmax[5] = { 0, 0x7f, 0x7ff, 0xffff, 0x10ffff };
    int64_t lo = (int64_t)(acc << (6 * rem)), hi = lo | (((int64_t)1 << (6 * rem)) - 1);
    if (lo < lmin[len])
        lo = lmin[len];
    if (hi > lmax[len])
        hi = lmax[len];
    if (lo > hi)
        return FEED_DONE;
    const grange_t *rg = &g->ranges[nd->a];
    bool ok = false;
    if (nd->x) { /* negated: some code point in [lo, hi] outside every range */
        ok = true;
        for (uint32_t i = 0; i < nd->n && ok; i++)
            ok = !(rg[i].lo <= lo && rg[i].hi >= hi);
    } else {
        for (uint32_t i = 0; i < nd->n && !ok; i++)
            ok = rg[i].lo <= hi && rg[i].hi >= lo;
    }
    if (!ok)
        return FEED_DONE;
    if (rem == 0) {
        c->n--;
        c->num = 0;
    } else {
        f->phase = (uint8_t)len;
        f->aux = (uint16_t)rem;
        c->num = acc;
    }
    set_add(out, c);
    return FEED_DONE;
}

typedef feed_t (*feed_fn_t)(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                            uint8_t b, set_t *out);

static const feed_fn_t feed_by_kind[] = {
    [N_OBJ] = feed_obj, [N_ARR] = feed_arr, [N_STR] = feed_str, [N_NUM] = feed_num,
    [N_INT] = feed_num, [N_LIT] = feed_lit, [N_ANYOF] = feed_anyof, [N_ANYVAL] = feed_arr,
    [N_ANYOBJ] = feed_anyobj, [N_FMT] = feed_fmt, [N_SEQ] = feed_seq, [N_REP] = feed_rep,
    [N_CLASS] = feed_class, [N_REF] = feed_ref,
};

/* Feed byte b to configuration c (a private copy); every resulting
 * configuration goes to out. */
static void feed_cfg(const eng_gram_t *g, cfg_t *c, uint8_t b, set_t *out)
{
    while (c->n > 0) { /* empty: complete, nothing may follow */
        frame_t *f = &c->f[c->n - 1];
        const gnode_t *nd = &g->nodes[f->node];
        feed_fn_t fn = nd->kind < sizeof(feed_by_kind) / sizeof(feed_by_kind[0])
                           ? feed_by_kind[nd->kind] : NULL;
        if (fn == NULL || fn(g, c, f, nd, b, out) == FEED_DONE)
            return;
    }
}

/* Bytes this frame still needs once the frames above it are done. */
/* num: the configuration's leaf value (meaningful for the top frame). */
static uint32_t frame_rest(const eng_gram_t *g, const frame_t *f, uint64_t num)
{
    const gnode_t *nd = &g->nodes[f->node];
    switch (nd->kind) {
    case N_LIT:
        return nd->n - f->aux;
    case N_FMT:
        return f->phase == S_OPEN ? nd->min : gram_fmt_rest(nd->n, f->aux) + 1;
    case N_STR: {
        uint32_t more = 0; /* characters still needed for minLength */
        if (nd->n && f->phase != S_OPEN && (int64_t)num < g->ranges[nd->n - 1].lo)
            more = (uint32_t)(g->ranges[nd->n - 1].lo - (int64_t)num);
        switch (f->phase) {
        case S_OPEN: return nd->min;
        case S_BODY: return 1 + more;
        case S_ESC: return 2 + more;
        default: return (uint32_t)f->aux + 1 + more; /* S_HEX, S_UTF */
        }
    }
    case N_NUM:
    case N_INT:
        if (nd->n) {
            const grange_t *r = &g->ranges[nd->n - 1];
            switch (f->phase) {
            case M_START: return nd->min;
            case M_MINUS: return gram_ndig(gram_uabs64(r->hi < -1 ? r->hi : -1));
            case M_INT: return gram_int_more(r, nd->x ? g->ranges[nd->x - 1].lo : 1, (int64_t)num,
                                             (int64_t)num < 0, f->aux);
            case M_DOT: return 1;
            default: return 0;
            }
        }
        return f->phase == M_ZERO || f->phase == M_INT || f->phase == M_FRAC ||
               f->phase == M_EXPDIG ? 0 : 1;
    case N_ANYOF:
    case N_REF:
        return nd->min;
    case N_SEQ: {
        uint32_t t = 0;
        for (uint32_t k = f->aux; k < nd->n; k++)
            t = gram_sat_add(t, g->nodes[g->alts[nd->a + k]].min);
        return t;
    }
    case N_REP: {
        int64_t lo = g->ranges[nd->n - 1].lo;
        if ((f->phase & PH_FRESH) || f->aux >= lo)
            return 0;
        uint64_t t = (uint64_t)(lo - f->aux) * g->nodes[nd->a].min;
        return t >= UINT32_MAX ? UINT32_MAX : (uint32_t)t;
    }
    case N_CLASS:
        return f->phase == 0 ? nd->min : f->aux;
    case N_ARR:
    case N_ANYVAL:
        if (nd->kind == N_ANYVAL && f->aux == 0)
            return 1;
        if (nd->kind == N_ANYVAL && f->aux == 2)
            goto anyobj;
        if (nd->kind == N_ARR && nd->n) {
            int64_t lo = g->ranges[nd->n - 1].lo;
            uint32_t im = g->nodes[nd->a].min;
            uint32_t r = 0; /* items still needed */
            switch (f->phase) {
            case A_OPEN: return nd->min;
            case A_FIRST: r = (uint32_t)lo; break;
            case A_ITEM: r = lo > f->aux + 1 ? (uint32_t)(lo - f->aux) : 1; break;
            default: r = lo > f->aux ? (uint32_t)(lo - f->aux) : 0; break; /* A_AFTER */
            }
            uint32_t t = 1; /* ']' */
            for (uint32_t k = 0; k < r; k++)
                t = gram_sat_add(t, gram_sat_add(im, f->phase == A_AFTER || k > 0 ? 1 : 0));
            return t;
        }
        switch (f->phase) {
        case A_OPEN: return 2;
        case A_ITEM: return gram_sat_add(nd->kind == N_ARR ? g->nodes[nd->a].min : 1, 1);
        default: return 1;
        }
    case N_ANYOBJ:
    anyobj:
        switch (f->phase) {
        case O_OPEN: return 2;
        case O_FCOMMA: return 5;
        case O_FCOLON: return 3;
        case O_VAL: return 2;
        default: return 1; /* O_NEXT, O_FAFTER */
        }
    case N_OBJ: {
        uint32_t i = f->aux;
        bool em = (f->phase & PH_EMIT) != 0;
        /* after property i was written: the later required ones, '}' */
        const gprop_t *nx = i + 1 < nd->n ? &g->props[nd->a + i + 1] : NULL;
        uint32_t after = nx && nx->cnt ? gram_sat_add(nx->tail, 2) : 1;
        switch (f->phase & ~PH_EMIT) {
        case O_OPEN: return nd->min;
        case O_NEXT:
            if (i >= nd->n || g->props[nd->a + i].cnt == 0)
                return 1;
            return gram_sat_add(g->props[nd->a + i].tail, em ? 2 : 1);
        case O_KEY: {
            const gprop_t *p = &g->props[nd->a + i];
            return gram_sat_add(gram_sat_add(g->nodes[p->key].min, g->nodes[p->val].min), after);
        }
        case O_VAL: /* the key is done: this value, then the rest */
            return gram_sat_add(g->nodes[g->props[nd->a + i].val].min, after);
        }
        return 1;
    }
    }
    return 0;
}

/* Shortest bytes that complete the JSON from any configuration of st. */
uint32_t gram_set_close(const eng_gram_t *g, const set_t *st)
{
    uint32_t best = UINT32_MAX;
    for (uint32_t i = 0; i < st->n; i++) {
        uint32_t t = 0;
        for (uint32_t k = 0; k < st->c[i].n; k++)
            t = gram_sat_add(t, frame_rest(g, &st->c[i].f[k],
                                           k + 1 == st->c[i].n ? st->c[i].num : 0));
        if (t < best)
            best = t;
    }
    return best;
}

void gram_set_feed(const eng_gram_t *g, const set_t *in, uint8_t b, set_t *out)
{
    out->n = 0;
    forks_reset();
    for (uint32_t i = 0; i < in->n; i++) {
        cfg_t c;
        c.n = in->c[i].n;
        c.num = in->c[i].num;
        memcpy(c.f, in->c[i].f, c.n * sizeof(frame_t));
        feed_cfg(g, &c, b, out);
    }
}

pd_status_t eng_gram_state_create(const eng_gram_t *g, eng_gram_state_t **s_p)
{
    *s_p = NULL;
    eng_gram_state_t *s = malloc(sizeof(*s));
    if (!s)
        return PD_ERR_NO_MEMORY;
    s->g = g;
    s->sc_vocab = NULL;
    s->sc_ok = NULL;
    s->sc_n = 0;
    s->cur.n = 1;
    s->cur.c[0].n = 1;
    s->cur.c[0].num = 0;
    s->cur.c[0].f[0] = (frame_t){ g->root, P_START, 0, 0 };
    *s_p = s;
    return PD_OK;
}

void eng_gram_state_free(eng_gram_state_t *s)
{
    if (s)
        free(s->sc_ok);
    free(s);
}

void gram_set_copy(set_t *d, const set_t *s)
{
    d->n = s->n;
    for (uint32_t i = 0; i < s->n; i++) {
        d->c[i].n = s->c[i].n;
        d->c[i].num = s->c[i].num;
        memcpy(d->c[i].f, s->c[i].f, s->c[i].n * sizeof(frame_t));
    }
}

bool gram_sets_equal(const set_t *a, const set_t *b)
{
    if (a->n != b->n)
        return false;
    for (uint32_t i = 0; i < a->n; i++)
        if (a->c[i].n != b->c[i].n || a->c[i].num != b->c[i].num ||
            memcmp(a->c[i].f, b->c[i].f, a->c[i].n * sizeof(frame_t)) != 0)
            return false;
    return true;
}

/* Walk bytes from *in; the result ends in one of a/b (returned), or NULL. */
const set_t *gram_walk(const eng_gram_t *g, const set_t *in, const uint8_t *p, size_t n,
                       set_t *a, set_t *b)
{
    const set_t *cur = in;
    for (size_t i = 0; i < n; i++) {
        set_t *nx = cur == a ? b : a;
        gram_set_feed(g, cur, p[i], nx);
        if (nx->n == 0)
            return NULL;
        cur = nx;
    }
    return cur;
}

bool eng_gram_feed(eng_gram_state_t *s, const uint8_t *b, size_t n)
{
    if (n == 0)
        return false;
    const set_t *r = gram_walk(s->g, &s->cur, b, n, &s->tmp[0], &s->tmp[1]);
    if (!r)
        return false;
    gram_set_copy(&s->cur, r);
    return true;
}

/* Complete: some configuration can end here (every frame left needs no
 * more bytes: an empty stack, or x* / a? / a bounded number still open). */
bool eng_gram_complete(const eng_gram_state_t *s)
{
    for (uint32_t i = 0; i < s->cur.n; i++) {
        const cfg_t *c = &s->cur.c[i];
        uint32_t t = 0;
        for (uint32_t k = 0; k < c->n && t == 0; k++)
            t = frame_rest(s->g, &c->f[k], k + 1 == c->n ? c->num : 0);
        if (t == 0)
            return true;
    }
    return false;
}
