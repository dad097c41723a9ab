/* eng_gram.c - JSON schema -> grammar compiler and the per-step token mask.
 * See eng_gram.h. */
#include "eng_gram.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- compiled grammar ---------------------------------------------------- */

enum {
    N_OBJ = 1,    /* schema object: props[a .. a+n) in order */
    N_ARR,        /* array of node a */
    N_STR,        /* any string */
    N_NUM,        /* any number */
    N_INT,        /* integer */
    N_LIT,        /* exact bytes pool[a .. a+n) */
    N_ANYOF,      /* one of alts[a .. a+n) */
    N_ANYVAL,     /* any JSON value */
    N_ANYOBJ,     /* any JSON object */
    N_FMT,        /* a string of format n (FMT_*) */
    N_SEQ,        /* children alts[a .. a+n) one after the other */
    N_REP,        /* node a repeated ranges[n - 1] times (hi INT64_MAX: unbounded) */
    N_CLASS,      /* one UTF-8 character whose code point is in (x == 0) or not in
                     (x == 1) the merged ranges[a .. a+n) */
    N_REF,        /* a call of node a (a $ref, a GBNF rule): the frame becomes a's */
};

/* N_INT, N_STR and N_ARR with n > 0 are bounded by ranges[n - 1]: the
 * integer's value, the string's length in characters, the array's items. */
typedef struct {
    int64_t lo, hi;
} grange_t;

/* String formats, as sub-languages every output of which the format's
 * validators accept (ajv-formats "full" mode): dates with days 01-28,
 * times in UTC ("Z"), lower-case UUIDs, e-mail addresses of plain dotted
 * atoms. Templates: D digit, H hex digit, m/n month, d/e day, h/i hour,
 * M a digit 0-5; anything else is itself. */
enum { FMT_DATE = 1, FMT_TIME, FMT_DATETIME, FMT_UUID, FMT_EMAIL };
static const struct {
    const char *name;
    const char *tpl;    /* NULL: FMT_EMAIL's automaton */
} formats[] = {
    [FMT_DATE] = { "date", "DDDD-mn-de" },
    [FMT_TIME] = { "time", "hi:MD:MDZ" },
    [FMT_DATETIME] = { "date-time", "DDDD-mn-deThi:MD:MDZ" },
    [FMT_UUID] = { "uuid", "HHHHHHHH-HHHH-HHHH-HHHH-HHHHHHHHHHHH" },
    [FMT_EMAIL] = { "email", NULL },
};
#define N_FORMATS (sizeof(formats) / sizeof(formats[0]))

typedef struct {
    uint8_t kind;
    uint32_t n;
    uint32_t a;
    uint32_t min;     /* bytes of the shortest complete value */
    uint32_t x;       /* N_CLASS: negated; N_INT/N_NUM: multipleOf at ranges[x - 1].lo */
    uint32_t sdep;    /* frames the shallowest complete value needs (a push is
                         admitted only if they fit under ENG_GRAM_MAX_STACK) */
} gnode_t;

typedef struct {
    uint32_t key;     /* N_LIT node: "name": */
    uint32_t val;     /* value node */
    uint32_t tail;    /* shortest bytes for this and the later properties:
                         the required ones' keys, values and the commas
                         between them */
    uint32_t cnt;     /* required properties from this one on */
    bool opt;         /* not in 'required': may be left out */
} gprop_t;

struct eng_gram {
    gnode_t *nodes;
    uint32_t n_nodes, cap_nodes;
    gprop_t *props;
    uint32_t n_props, cap_props;
    uint32_t *alts;
    uint32_t n_alts, cap_alts;
    char *pool;
    size_t n_pool, cap_pool;
    grange_t *ranges;
    uint32_t n_ranges, cap_ranges;
    uint32_t root;
    uint32_t max_min;     /* largest gnode_t.min */
};

/* ---- compile --------------------------------------------------------------- */

typedef struct {
    eng_gram_t *g;
    const cJSON *doc;     /* the root schema ($ref targets) */
    char *err;
    size_t err_len;
    pd_status_t st;
    char path[256];       /* JSON pointer of the schema being compiled */
    size_t plen;
    bool path_cut;        /* path too long: shown ending in "..." */
    struct {
        const cJSON *target;
        uint32_t ref;     /* its N_REF node: every $ref to it calls it */
    } refs[256];
    uint32_t n_refs;
} comp_t;

/* Append "/<seg>" (escaped: ~ as ~0, / as ~1) to the pointer; returns the
 * length to restore with path_pop. */
static size_t path_push(comp_t *c, const char *seg)
{
    size_t old = c->plen;
    char buf[sizeof(c->path)];
    size_t k = 0;
    buf[k++] = '/';
    for (const char *p = seg; *p != '\0' && k + 3 < sizeof(buf); p++) {
        if (*p == '~' || *p == '/') {
            buf[k++] = '~';
            buf[k++] = *p == '~' ? '0' : '1';
        } else {
            buf[k++] = *p;
        }
    }
    if (c->plen + k + 1 > sizeof(c->path)) {
        c->path_cut = true;
        return old;
    }
    memcpy(c->path + c->plen, buf, k);
    c->plen += k;
    c->path[c->plen] = '\0';
    return old;
}

static void path_pop(comp_t *c, size_t old)
{
    c->plen = old;
    c->path[old] = '\0';
}

/* Fail with a message; " at <pointer>" is added when inside the schema. */
static void cfail(comp_t *c, pd_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cfail(comp_t *c, pd_status_t st, const char *fmt, ...)
{
    if (c->st != PD_OK)
        return;
    c->st = st;
    if (c->err && c->err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->err_len, fmt, ap);
        va_end(ap);
        size_t n = strlen(c->err);
        if (c->plen > 0 && n < c->err_len)
            snprintf(c->err + n, c->err_len - n, " at %s%s", c->path,
                     c->path_cut ? "..." : "");
    }
}

/* Fail on keyword kw of the schema being compiled (the pointer names it). */
static void cfail_kw(comp_t *c, pd_status_t st, const char *kw, const char *why)
{
    size_t o = path_push(c, kw);
    cfail(c, st, "%s", why);
    path_pop(c, o);
}

static bool grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    uint32_t nc = *cap ? *cap * 2 : 16;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q)
        return false;
    *p = q;
    *cap = nc;
    return true;
}

static uint32_t new_node(comp_t *c, uint8_t kind, uint32_t n, uint32_t a)
{
    eng_gram_t *g = c->g;
    if (c->st != PD_OK)
        return 0;
    if (g->n_nodes >= ENG_GRAM_MAX_NODES) {
        cfail(c, PD_ERR_TOO_BIG, "schema compiles to more than %u grammar nodes",
              ENG_GRAM_MAX_NODES);
        return 0;
    }
    if (!grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(gnode_t))) {
        cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    g->nodes[g->n_nodes] = (gnode_t){ kind, n, a, 0, 0, 0 };
    return g->n_nodes++;
}

static uint32_t lit_node(comp_t *c, const char *s, size_t n)
{
    eng_gram_t *g = c->g;
    if (c->st != PD_OK)
        return 0;
    if (g->n_pool + n > ENG_GRAM_MAX_SCHEMA_BYTES * 2u) {
        cfail(c, PD_ERR_TOO_BIG, "schema literals too large");
        return 0;
    }
    if (g->n_pool + n > g->cap_pool) {
        size_t nc = g->cap_pool ? g->cap_pool * 2 : 256;
        while (nc < g->n_pool + n)
            nc *= 2;
        char *q = realloc(g->pool, nc);
        if (!q) {
            cfail(c, PD_ERR_NO_MEMORY, "out of memory");
            return 0;
        }
        g->pool = q;
        g->cap_pool = nc;
    }
    memcpy(g->pool + g->n_pool, s, n);
    uint32_t id = new_node(c, N_LIT, (uint32_t)n, (uint32_t)g->n_pool);
    g->n_pool += n;
    return id;
}

/* A node of kind with bounds [lo, hi] (ranges table). */
static uint32_t range_node(comp_t *c, uint8_t kind, int64_t lo, int64_t hi, uint32_t a)
{
    eng_gram_t *g = c->g;
    if (c->st != PD_OK)
        return 0;
    if (!grow((void **)&g->ranges, &g->cap_ranges, g->n_ranges + 1, sizeof(grange_t))) {
        cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    g->ranges[g->n_ranges] = (grange_t){ lo, hi };
    uint32_t id = new_node(c, kind, g->n_ranges + 1, a);
    if (c->st == PD_OK)
        g->n_ranges++;
    return id;
}

/* A keyword that must be a number; false (failed) if present and not. */
static bool num_kw(comp_t *c, const cJSON *s, const char *kw, const cJSON **out)
{
    *out = cJSON_GetObjectItemCaseSensitive(s, kw);
    if (*out != NULL && !cJSON_IsNumber(*out) && !cJSON_IsBool(*out)) {
        cfail_kw(c, PD_ERR_BAD_INPUT, kw, "must be a number");
        return false;
    }
    return true;
}

/* A non-negative integer keyword (minLength, maxItems, ...), or def. */
static bool count_kw(comp_t *c, const cJSON *s, const char *kw, int64_t def, int64_t *out)
{
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(s, kw);
    *out = def;
    if (k == NULL)
        return true;
    if (!cJSON_IsNumber(k) || k->valuedouble < 0 || floor(k->valuedouble) != k->valuedouble) {
        cfail_kw(c, PD_ERR_BAD_INPUT, kw, "must be a non-negative integer");
        return false;
    }
    *out = k->valuedouble >= 9.2e18 ? INT64_MAX : (int64_t)k->valuedouble;
    return true;
}

/* A count range: kmin / kmax (count_kw), kmin at most cap. */
static bool count_range(comp_t *c, const cJSON *s, const char *kmin, const char *kmax,
                        int64_t cap, int64_t *lo, int64_t *hi)
{
    if (!count_kw(c, s, kmin, 0, lo) || !count_kw(c, s, kmax, INT64_MAX, hi))
        return false;
    if (*lo > *hi) {
        char why[64];
        snprintf(why, sizeof(why), "%s is above %s", kmin, kmax);
        cfail_kw(c, PD_ERR_BAD_INPUT, kmin, why);
        return false;
    }
    if (*lo > cap) {
        char why[64];
        snprintf(why, sizeof(why), "%s above %lld is not supported", kmin, (long long)cap);
        cfail_kw(c, PD_ERR_TOO_BIG, kmin, why);
        return false;
    }
    return true;
}

/* A double as an int64 bound: ceil (lower) or floor (upper), clamped. */
static int64_t to_i64(double v, bool lower)
{
    double r = lower ? ceil(v) : floor(v);
    if (r <= -9223372036854775808.0)
        return INT64_MIN;
    if (r >= 9223372036854775808.0)
        return INT64_MAX;
    return (int64_t)r;
}

static int64_t floordiv(__int128 a, int64_t m)
{
    __int128 q = a / m;
    if (a % m != 0 && a < 0)
        q--;
    return (int64_t)q;
}

/* Some multiple of m (> 0) lies in [lo, hi]. */
static bool has_mult(__int128 lo, __int128 hi, int64_t m)
{
    if (lo > hi)
        return false;
    if (m <= 1)
        return true;
    __int128 q = -(__int128)floordiv(-lo, m); /* ceil(lo / m) */
    return q * m <= hi;
}

/* integer: minimum / maximum / exclusiveMinimum / exclusiveMaximum (numbers,
 * or draft-4 booleans qualifying minimum / maximum), exact within int64. */
static uint32_t int_node(comp_t *c, const cJSON *s, uint8_t kind)
{
    const cJSON *mn, *mx, *xmn, *xmx, *mo;
    if (!num_kw(c, s, "minimum", &mn) || !num_kw(c, s, "maximum", &mx) ||
        !num_kw(c, s, "exclusiveMinimum", &xmn) || !num_kw(c, s, "exclusiveMaximum", &xmx) ||
        !num_kw(c, s, "multipleOf", &mo))
        return 0;
    int64_t mult = 1;
    if (mo != NULL) {
        double d = cJSON_IsNumber(mo) ? mo->valuedouble : -1;
        if (kind == N_NUM) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "multipleOf",
                     "'multipleOf' is supported on \"type\": \"integer\" only");
            return 0;
        }
        if (!(d > 0)) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "multipleOf", "must be a number above 0");
            return 0;
        }
        if (floor(d) != d || d >= 9.2e18) {
            /* a fractional multipleOf: every integer is a multiple of 1/k */
            if (floor(1.0 / d) != 1.0 / d) {
                cfail_kw(c, PD_ERR_BAD_INPUT, "multipleOf", "an integer 'multipleOf' must be a "
                         "whole number (or 1/k) below 2^63");
                return 0;
            }
        } else {
            mult = (int64_t)d;
        }
    }
    (void)mult;
    if ((mn && !cJSON_IsNumber(mn)) || (mx && !cJSON_IsNumber(mx))) {
        cfail_kw(c, PD_ERR_BAD_INPUT, mn && !cJSON_IsNumber(mn) ? "minimum" : "maximum",
                 "must be a number");
        return 0;
    }
    if (!mn && !mx && !cJSON_IsNumber(xmn) && !cJSON_IsNumber(xmx) && mult == 1)
        return new_node(c, kind, 0, 0);
    int64_t lo = INT64_MIN, hi = INT64_MAX, v;
    if (mn) {
        bool ex = cJSON_IsTrue(xmn); /* draft 4 */
        v = to_i64(mn->valuedouble, true);
        if (ex && floor(mn->valuedouble) == mn->valuedouble)
            v = v == INT64_MAX ? v : v + 1;
        lo = v;
    }
    if (mx) {
        bool ex = cJSON_IsTrue(xmx);
        v = to_i64(mx->valuedouble, false);
        if (ex && floor(mx->valuedouble) == mx->valuedouble)
            v = v == INT64_MIN ? v : v - 1;
        hi = v;
    }
    if (cJSON_IsNumber(xmn)) {
        double d = xmn->valuedouble;
        v = to_i64(d, true);
        if (floor(d) == d)
            v = v == INT64_MAX ? v : v + 1;
        if (v > lo)
            lo = v;
    }
    if (cJSON_IsNumber(xmx)) {
        double d = xmx->valuedouble;
        v = to_i64(d, false);
        if (floor(d) == d)
            v = v == INT64_MIN ? v : v - 1;
        if (v < hi)
            hi = v;
    }
    if (lo > hi) {
        cfail(c, PD_ERR_BAD_INPUT, kind == N_NUM ? "bounds on a 'number' that hold no integer "
              "are not supported (the integer part is bounded)"
                                                 : "no integer satisfies its minimum/maximum");
        return 0;
    }
    if (mult > 1) {
        if (!has_mult(lo, hi, mult)) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "multipleOf", "no multiple lies within the bounds");
            return 0;
        }
        uint32_t id = range_node(c, kind, lo, hi, 0);
        eng_gram_t *g = c->g;
        if (c->st != PD_OK)
            return 0;
        if (!grow((void **)&g->ranges, &g->cap_ranges, g->n_ranges + 1, sizeof(grange_t))) {
            cfail(c, PD_ERR_NO_MEMORY, "out of memory");
            return 0;
        }
        g->ranges[g->n_ranges++] = (grange_t){ mult, 0 };
        g->nodes[id].x = g->n_ranges;
        return id;
    }
    return range_node(c, kind, lo, hi, 0);
}

/* string: minLength / maxLength (characters), format. */
static uint32_t comp_regex(comp_t *c, const char *text, size_t len, bool search, bool json,
                           const char *what);
static uint32_t seq_node(comp_t *c, const uint32_t *ids, uint32_t n);

/* Formats as regexes over the string's body: sub-languages the format's
 * validators (ajv-formats "full") accept. */
static const struct {
    const char *name;
    const char *re;
} re_formats[] = {
    { "hostname",
      "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?){0,3}" },
    { "ipv4",
      "(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}" },
    { "ipv6", "([0-9a-f]{1,4}:){7}[0-9a-f]{1,4}|::([0-9a-f]{1,4})?" },
    { "uri",
      "https?://[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?){0,3}"
      "(/[A-Za-z0-9._~-]{0,32}){0,8}" },
    { "duration", "P\\d{1,4}D|P\\d{1,4}W|P(\\d{1,4}Y)?(\\d{1,2}M)?\\d{1,2}DT\\d{1,2}H|"
                  "PT\\d{1,4}H(\\d{1,2}M)?(\\d{1,2}S)?|PT\\d{1,4}[MS]" },
};

/* '"' body '"' */
static uint32_t quoted(comp_t *c, uint32_t body)
{
    uint32_t ids[3] = { lit_node(c, "\"", 1), body, 0 };
    ids[2] = lit_node(c, "\"", 1);
    return seq_node(c, ids, 3);
}

static uint32_t str_node(comp_t *c, const cJSON *s)
{
    int64_t lo, hi;
    if (!count_range(c, s, "minLength", "maxLength", 4096, &lo, &hi))
        return 0;
    const cJSON *fm = cJSON_GetObjectItemCaseSensitive(s, "format");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    if (pat != NULL) {
        if (!cJSON_IsString(pat)) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "pattern", "'pattern' must be a string");
            return 0;
        }
        const char *other = fm ? "format" : lo > 0 ? "minLength" : hi < INT64_MAX ? "maxLength"
                                                                                  : NULL;
        if (other) {
            cfail_kw(c, PD_ERR_BAD_INPUT, other, "'pattern' together with 'format', "
                     "'minLength' or 'maxLength' is not supported (put the lengths in the "
                     "pattern)");
            return 0;
        }
        size_t o = path_push(c, "pattern");
        uint32_t body = comp_regex(c, pat->valuestring, strlen(pat->valuestring), true, true,
                                   "pattern");
        path_pop(c, o);
        return quoted(c, body);
    }
    for (size_t i = 0; cJSON_IsString(fm) && i < sizeof(re_formats) / sizeof(re_formats[0]); i++)
        if (strcmp(fm->valuestring, re_formats[i].name) == 0) {
            if (lo > 0 || hi < INT64_MAX) {
                cfail_kw(c, PD_ERR_BAD_INPUT, lo > 0 ? "minLength" : "maxLength",
                         "minLength/maxLength with this 'format' are not supported");
                return 0;
            }
            return quoted(c, comp_regex(c, re_formats[i].re, strlen(re_formats[i].re), false,
                                        true, "format"));
        }
    if (fm != NULL) {
        uint32_t f = 0;
        for (uint32_t i = 1; cJSON_IsString(fm) && i < N_FORMATS && f == 0; i++)
            if (strcmp(fm->valuestring, formats[i].name) == 0)
                f = i;
        if (f == 0) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "format",
                     "unsupported 'format' (supported: date, time, date-time, uuid, email, "
                     "hostname, ipv4, ipv6, uri, duration)");
            return 0;
        }
        if (lo > 0 || hi < INT64_MAX) {
            int64_t len = formats[f].tpl ? (int64_t)strlen(formats[f].tpl) : -1;
            if (len < 0 || len < lo || len > hi) {
                cfail_kw(c, PD_ERR_BAD_INPUT, lo > 0 ? "minLength" : "maxLength",
                         len < 0 ? "minLength/maxLength with format 'email' are not supported"
                                 : "no string of this format has a length in "
                                   "[minLength, maxLength]");
                return 0;
            }
        }
        return new_node(c, N_FMT, f, 0);
    }
    if (lo == 0 && hi == INT64_MAX)
        return new_node(c, N_STR, 0, 0);
    return range_node(c, N_STR, lo, hi, 0);
}

/* The literal JSON text of a value (enum / const entries). */
static uint32_t value_lit(comp_t *c, const cJSON *v)
{
    char *t = cJSON_PrintUnformatted(v);
    if (!t) {
        cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    uint32_t id = lit_node(c, t, strlen(t));
    cJSON_free(t);
    return id;
}

static uint32_t alts_node(comp_t *c, const uint32_t *ids, uint32_t n)
{
    eng_gram_t *g = c->g;
    if (c->st != PD_OK)
        return 0;
    if (n == 1)
        return ids[0];
    if (!grow((void **)&g->alts, &g->cap_alts, g->n_alts + n, sizeof(uint32_t))) {
        cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    memcpy(g->alts + g->n_alts, ids, n * sizeof(uint32_t));
    uint32_t id = new_node(c, N_ANYOF, n, g->n_alts);
    g->n_alts += n;
    return id;
}

/* A node over a list of children (N_SEQ; N_ANYOF via alts_node). */
static uint32_t list_node(comp_t *c, uint8_t kind, const uint32_t *ids, uint32_t n)
{
    eng_gram_t *g = c->g;
    if (c->st != PD_OK)
        return 0;
    if (!grow((void **)&g->alts, &g->cap_alts, g->n_alts + n + 1, sizeof(uint32_t))) {
        cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    if (n)
        memcpy(g->alts + g->n_alts, ids, n * sizeof(uint32_t));
    uint32_t id = new_node(c, kind, n, g->n_alts);
    if (c->st == PD_OK)
        g->n_alts += n;
    return id;
}

static uint32_t seq_node(comp_t *c, const uint32_t *ids, uint32_t n)
{
    if (n == 1)
        return ids[0];
    return list_node(c, N_SEQ, ids, n);
}

/* Appends id to a sequence (alt false) or alternation being built in
 * ids[cap]; a full array folds into one node that stays first, so long
 * literal runs and long alternations stay compilable. */
static void list_push(comp_t *c, uint32_t *ids, uint32_t *n, uint32_t cap, bool alt, uint32_t id)
{
    if (*n >= cap) {
        ids[0] = alt ? alts_node(c, ids, *n) : seq_node(c, ids, *n);
        *n = 1;
    }
    ids[(*n)++] = id;
}

/* child repeated lo..hi times (hi INT64_MAX: unbounded). */
static uint32_t rep_node(comp_t *c, uint32_t child, int64_t lo, int64_t hi)
{
    if (c->st != PD_OK)
        return 0;
    const int64_t cap = ENG_GRAM_MAX_REPEAT;
    if (lo > cap || (hi != INT64_MAX && hi > cap)) {
        cfail(c, PD_ERR_TOO_BIG, "a repetition count above %u (ENG_GRAM_MAX_REPEAT)",
              ENG_GRAM_MAX_REPEAT);
        return 0;
    }
    if (lo == 1 && hi == 1)
        return child;
    return range_node(c, N_REP, lo, hi, child);
}

/* ---- character classes ----------------------------------------------------- */

typedef struct {
    grange_t r[256];
    uint32_t n;
    bool neg;
    bool over;        /* more than 256 ranges */
} cls_t;

static void cls_add(cls_t *k, int64_t lo, int64_t hi)
{
    if (k->n >= 256) {
        k->over = true;
        return;
    }
    k->r[k->n++] = (grange_t){ lo, hi };
}

static int cmp_range(const void *a, const void *b)
{
    const grange_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void cls_merge(cls_t *k)
{
    qsort(k->r, k->n, sizeof(grange_t), cmp_range);
    uint32_t o = 0;
    for (uint32_t i = 0; i < k->n; i++) {
        if (o > 0 && k->r[i].lo <= k->r[o - 1].hi + 1) {
            if (k->r[i].hi > k->r[o - 1].hi)
                k->r[o - 1].hi = k->r[i].hi;
        } else {
            k->r[o++] = k->r[i];
        }
    }
    k->n = o;
}

static bool cls_has(const cls_t *k, int64_t cp)
{
    bool in = false;
    for (uint32_t i = 0; i < k->n && !in; i++)
        in = cp >= k->r[i].lo && cp <= k->r[i].hi;
    return in != k->neg;
}

static uint32_t cls_raw(comp_t *c, cls_t *k)
{
    eng_gram_t *g = c->g;
    if (c->st != PD_OK)
        return 0;
    if (k->over) {
        cfail(c, PD_ERR_TOO_BIG, "a character class with more than 256 ranges");
        return 0;
    }
    if (!k->neg && k->n == 0) {
        cfail(c, PD_ERR_BAD_INPUT, "a character class that matches nothing");
        return 0;
    }
    cls_merge(k);
    if (g->n_ranges + k->n > ENG_GRAM_MAX_RANGES) {
        cfail(c, PD_ERR_TOO_BIG, "more than %u character-class ranges (ENG_GRAM_MAX_RANGES)",
              ENG_GRAM_MAX_RANGES);
        return 0;
    }
    if (!grow((void **)&g->ranges, &g->cap_ranges, g->n_ranges + k->n + 1, sizeof(grange_t))) {
        cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    memcpy(g->ranges + g->n_ranges, k->r, k->n * sizeof(grange_t));
    uint32_t id = new_node(c, N_CLASS, k->n, g->n_ranges);
    if (c->st != PD_OK)
        return 0;
    g->n_ranges += k->n;
    g->nodes[id].x = k->neg;
    return id;
}

/* A class as generated text; json: inside a JSON string, where '"', '\\'
 * and controls are written escaped ("\\\"", "\\\\", "\\n", "\\t", "\\r";
 * other controls are never written). */
static uint32_t cls_node(comp_t *c, cls_t *k, bool json)
{
    if (!json)
        return cls_raw(c, k);
    static const struct { uint8_t ch; const char *esc; } esc[] = {
        { '"', "\\\"" }, { '\\', "\\\\" }, { '\n', "\\n" }, { '\t', "\\t" }, { '\r', "\\r" },
    };
    uint32_t ids[6], n = 0;
    bool has[5];
    for (int i = 0; i < 5; i++)
        has[i] = cls_has(k, esc[i].ch);
    /* the set minus '"', '\\', controls */
    cls_t m = { .n = 0, .neg = k->neg };
    if (k->neg) {
        m = *k;
        cls_add(&m, 0, 0x1f);
        cls_add(&m, '"', '"');
        cls_add(&m, '\\', '\\');
    } else {
        for (uint32_t i = 0; i < k->n; i++) {
            int64_t lo = k->r[i].lo < 0x20 ? 0x20 : k->r[i].lo, hi = k->r[i].hi;
            const int64_t cut[2] = { '"', '\\' };
            for (int j = 0; j < 2 && lo <= hi; j++)
                if (cut[j] >= lo && cut[j] <= hi) {
                    if (cut[j] > lo)
                        cls_add(&m, lo, cut[j] - 1);
                    lo = cut[j] + 1;
                }
            if (lo <= hi)
                cls_add(&m, lo, hi);
        }
    }
    if (m.neg || m.n > 0)
        ids[n++] = cls_raw(c, &m);
    for (int i = 0; i < 5; i++)
        if (has[i])
            ids[n++] = lit_node(c, esc[i].esc, 2);
    if (n == 0) {
        cfail(c, PD_ERR_BAD_INPUT, "a character class that matches nothing");
        return 0;
    }
    return alts_node(c, ids, n);
}

/* UTF-8 of code point cp into o (4 bytes); the count. */
static size_t utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Decode one UTF-8 character at *p (< e); -1 if invalid. */
static int64_t utf8_get(const char **p, const char *e)
{
    const uint8_t *s = (const uint8_t *)*p;
    uint32_t b = s[0], need, cp;
    if (b < 0x80) {
        *p += 1;
        return b;
    }
    if (b >= 0xc2 && b <= 0xdf)
        need = 1, cp = b & 0x1f;
    else if (b >= 0xe0 && b <= 0xef)
        need = 2, cp = b & 0x0f;
    else if (b >= 0xf0 && b <= 0xf4)
        need = 3, cp = b & 0x07;
    else
        return -1;
    if ((const char *)s + need >= e)
        return -1;
    for (uint32_t i = 1; i <= need; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return -1;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    *p += need + 1;
    return cp;
}

/* One character as generated text (json: escaped as in cls_node). */
static uint32_t char_node(comp_t *c, uint32_t cp, bool json)
{
    if (json && (cp < 0x20 || cp == '"' || cp == '\\')) {
        cls_t k = { .n = 0 };
        cls_add(&k, cp, cp);
        return cls_node(c, &k, true);
    }
    char b[4];
    return lit_node(c, b, utf8_put(cp, b));
}

/* ---- regular expressions (ECMA-262 subset) ------------------------------------ */

typedef struct {
    comp_t *c;
    const char *p, *e;
    bool json;        /* inside a JSON string value */
    const char *what; /* "pattern" / "regex" for messages */
    const char *base; /* the text's start (offsets in messages) */
} rx_t;

static uint32_t rx_alt(rx_t *r, uint32_t nest);

static void rx_fail(rx_t *r, pd_status_t st, const char *why)
{
    cfail(r->c, st, "%s: %s (at offset %zu)", r->what, why, (size_t)(r->p - r->base));
}

/* \d \w \s and their negations into k; false if esc is not one. */
static bool rx_class_esc(char esc, cls_t *k)
{
    switch (esc) {
    case 'd': case 'D': cls_add(k, '0', '9'); break;
    case 'w': case 'W':
        cls_add(k, '0', '9'); cls_add(k, 'A', 'Z'); cls_add(k, 'a', 'z'); cls_add(k, '_', '_');
        break;
    case 's': case 'S':
        cls_add(k, '\t', '\r'); cls_add(k, ' ', ' '); cls_add(k, 0xa0, 0xa0);
        cls_add(k, 0x2028, 0x2029); cls_add(k, 0xfeff, 0xfeff);
        break;
    default: return false;
    }
    return true;
}

static int hexv(char ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
         : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* A character escape after '\\' (r->p at the letter): its code point, or
 * -1 (failed). */
static int64_t rx_char_esc(rx_t *r)
{
    char ch = *r->p++;
    switch (ch) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x': case 'u': {
        int nd = ch == 'x' ? 2 : 4;
        int64_t v = 0;
        for (int i = 0; i < nd; i++) {
            int h = r->p < r->e ? hexv(*r->p) : -1;
            if (h < 0) {
                rx_fail(r, PD_ERR_BAD_INPUT, "bad \\x / \\u escape");
                return -1;
            }
            v = v * 16 + h;
            r->p++;
        }
        return v;
    }
    default:
        if (ch >= '1' && ch <= '9') {
            rx_fail(r, PD_ERR_BAD_INPUT, "backreferences are not supported");
            return -1;
        }
        if (ch == 'b' || ch == 'B') {
            rx_fail(r, PD_ERR_BAD_INPUT, "word boundaries (\\b, \\B) are not supported");
            return -1;
        }
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) {
            rx_fail(r, PD_ERR_BAD_INPUT, "unsupported escape");
            return -1;
        }
        r->p--;
        return utf8_get(&r->p, r->e);
    }
}

/* A bracket class; r->p after '['. */
static uint32_t rx_bracket(rx_t *r)
{
    cls_t k = { .n = 0 };
    if (r->p < r->e && *r->p == '^') {
        k.neg = true;
        r->p++;
    }
    while (r->p < r->e && *r->p != ']') {
        int64_t lo;
        if (*r->p == '\\') {
            r->p++;
            if (r->p >= r->e)
                break;
            if (strchr("dws", *r->p) && *r->p) {
                rx_class_esc(*r->p++, &k);
                continue;
            }
            if (strchr("DWS", *r->p) && *r->p) {
                rx_fail(r, PD_ERR_BAD_INPUT, "\\D, \\W, \\S inside [...] are not supported");
                return 0;
            }
            lo = *r->p == 'b' ? (r->p++, 8) : rx_char_esc(r);
        } else {
            lo = utf8_get(&r->p, r->e);
        }
        if (lo < 0) {
            if (r->c->st == PD_OK)
                rx_fail(r, PD_ERR_BAD_INPUT, "invalid UTF-8");
            return 0;
        }
        int64_t hi = lo;
        if (r->p + 1 < r->e && r->p[0] == '-' && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                hi = rx_char_esc(r);
            } else {
                hi = utf8_get(&r->p, r->e);
            }
            if (hi < 0) {
                if (r->c->st == PD_OK)
                    rx_fail(r, PD_ERR_BAD_INPUT, "invalid UTF-8");
                return 0;
            }
            if (hi < lo) {
                rx_fail(r, PD_ERR_BAD_INPUT, "range out of order in character class");
                return 0;
            }
        }
        cls_add(&k, lo, hi);
    }
    if (r->p >= r->e) {
        rx_fail(r, PD_ERR_BAD_INPUT, "unterminated character class");
        return 0;
    }
    r->p++; /* ']' */
    return cls_node(r->c, &k, r->json);
}

static bool rx_int(rx_t *r, int64_t *v)
{
    if (r->p >= r->e || *r->p < '0' || *r->p > '9')
        return false;
    *v = 0;
    while (r->p < r->e && *r->p >= '0' && *r->p <= '9') {
        if (*v < 1000000)
            *v = *v * 10 + (*r->p - '0');
        r->p++;
    }
    return true;
}

/* Postfix ? * + {m} {m,} {m,n} (a lazy '?' after them is ignored). */
static uint32_t rx_quant(rx_t *r, uint32_t atom)
{
    while (r->p < r->e && r->c->st == PD_OK) {
        int64_t lo, hi;
        char ch = *r->p;
        if (ch == '?') {
            lo = 0, hi = 1;
        } else if (ch == '*') {
            lo = 0, hi = INT64_MAX;
        } else if (ch == '+') {
            lo = 1, hi = INT64_MAX;
        } else if (ch == '{') {
            const char *save = r->p;
            r->p++;
            if (!rx_int(r, &lo)) {
                r->p = save;
                return atom; /* a literal '{' follows (as ECMA-262 Annex B) */
            }
            hi = lo;
            if (r->p < r->e && *r->p == ',') {
                r->p++;
                if (!rx_int(r, &hi))
                    hi = INT64_MAX;
            }
            if (r->p >= r->e || *r->p != '}') {
                r->p = save;
                return atom;
            }
            if (hi < lo) {
                rx_fail(r, PD_ERR_BAD_INPUT, "{m,n} with n < m");
                return 0;
            }
        } else {
            return atom;
        }
        r->p++;
        if (r->p < r->e && *r->p == '?')
            r->p++;
        atom = rep_node(r->c, atom, lo, hi);
    }
    return atom;
}

static uint32_t rx_any_char(rx_t *r)
{
    cls_t k = { .n = 0, .neg = true };
    cls_add(&k, '\n', '\n');
    cls_add(&k, '\r', '\r');
    cls_add(&k, 0x2028, 0x2029);
    return cls_node(r->c, &k, r->json);
}

static uint32_t rx_seq(rx_t *r, uint32_t nest)
{
    uint32_t ids[256], n = 0;
    while (r->p < r->e && *r->p != '|' && *r->p != ')' && r->c->st == PD_OK) {
        uint32_t atom = 0;
        char ch = *r->p;
        if (ch == '(') {
            r->p++;
            if (r->p < r->e && *r->p == '?') {
                if (r->p + 1 < r->e && r->p[1] == ':') {
                    r->p += 2;
                } else {
                    rx_fail(r, PD_ERR_BAD_INPUT, "lookaround and named groups ((?=, (?!, "
                                                 "(?<=, (?<!, (?<name>) are not supported");
                    return 0;
                }
            }
            if (nest + 1 > ENG_GRAM_MAX_NEST) {
                rx_fail(r, PD_ERR_TOO_BIG, "groups nested deeper than ENG_GRAM_MAX_NEST");
                return 0;
            }
            atom = rx_alt(r, nest + 1);
            if (r->c->st != PD_OK)
                return 0;
            if (r->p >= r->e || *r->p != ')') {
                rx_fail(r, PD_ERR_BAD_INPUT, "missing ')'");
                return 0;
            }
            r->p++;
        } else if (ch == '[') {
            r->p++;
            atom = rx_bracket(r);
        } else if (ch == '.') {
            r->p++;
            atom = rx_any_char(r);
        } else if (ch == '^' || ch == '$') {
            rx_fail(r, PD_ERR_BAD_INPUT, "anchors (^, $) are supported only at the ends of "
                                         "the whole expression");
            return 0;
        } else if (ch == '*' || ch == '+' || ch == '?' ) {
            rx_fail(r, PD_ERR_BAD_INPUT, "nothing to repeat");
            return 0;
        } else if (ch == '\\') {
            r->p++;
            if (r->p >= r->e) {
                rx_fail(r, PD_ERR_BAD_INPUT, "trailing '\\'");
                return 0;
            }
            cls_t k = { .n = 0 };
            char e = *r->p;
            if (rx_class_esc(e, &k)) {
                r->p++;
                k.neg = e == 'D' || e == 'W' || e == 'S';
                atom = cls_node(r->c, &k, r->json);
            } else {
                int64_t cp = rx_char_esc(r);
                if (cp < 0)
                    return 0;
                atom = char_node(r->c, (uint32_t)cp, r->json);
            }
        } else {
            int64_t cp = utf8_get(&r->p, r->e);
            if (cp < 0) {
                rx_fail(r, PD_ERR_BAD_INPUT, "invalid UTF-8");
                return 0;
            }
            atom = char_node(r->c, (uint32_t)cp, r->json);
        }
        atom = rx_quant(r, atom);
        list_push(r->c, ids, &n, 256, false, atom);
    }
    return r->c->st == PD_OK ? seq_node(r->c, ids, n) : 0;
}

static uint32_t rx_alt(rx_t *r, uint32_t nest)
{
    uint32_t ids[ENG_GRAM_MAX_ANYOF], n = 0;
    for (;;) {
        uint32_t s = rx_seq(r, nest);
        if (r->c->st != PD_OK)
            return 0;
        list_push(r->c, ids, &n, ENG_GRAM_MAX_ANYOF, true, s);
        if (r->p < r->e && *r->p == '|') {
            r->p++;
            continue;
        }
        break;
    }
    return alts_node(r->c, ids, n);
}

/* Compile regex text[0..len) into the graph. search: JSON Schema 'pattern'
 * (unanchored ends match anywhere: any text may come before / after);
 * otherwise the whole text must match (vLLM guided_regex), ^ and $ at the
 * ends are accepted. json: the text is a JSON string's body. */
static uint32_t comp_regex(comp_t *c, const char *text, size_t len, bool search, bool json,
                           const char *what)
{
    rx_t r = { c, text, text + len, json, what, text };
    bool a0 = len > 0 && text[0] == '^';
    size_t bs = 0; /* backslashes before a final '$': odd = an escaped '$' */
    while (len > 0 && bs + 1 < len && text[len - 2 - bs] == '\\')
        bs++;
    bool a1 = len > (a0 ? 1u : 0u) && text[len - 1] == '$' && bs % 2 == 0;
    if (a0)
        r.p++;
    if (a1)
        r.e--;
    if (memchr(text, '\0', len)) {
        cfail(c, PD_ERR_BAD_INPUT, "%s: contains a NUL byte", what);
        return 0;
    }
    const char *start = r.p;
    uint32_t body = rx_alt(&r, 0);
    if (c->st != PD_OK)
        return 0;
    if (r.p != r.e) {
        rx_fail(&r, PD_ERR_BAD_INPUT, "unbalanced ')'");
        return 0;
    }
    if (search && (a0 || a1)) {
        /* ^a|b$ would anchor only one branch */
        int depth = 0;
        bool in_cls = false;
        for (const char *q = start; q < r.e; q++) {
            if (*q == '\\') { q++; continue; }
            if (in_cls) { in_cls = *q != ']'; continue; }
            if (*q == '[') in_cls = true;
            else if (*q == '(') depth++;
            else if (*q == ')') depth--;
            else if (*q == '|' && depth == 0 && !(a0 && a1)) {
                cfail(c, PD_ERR_BAD_INPUT, "%s: a top-level '|' next to only one anchor "
                      "(wrap the alternatives in a group)", what);
                return 0;
            }
        }
    }
    if (!search)
        return body;
    uint32_t ids[3], n = 0;
    if (!a0)
        ids[n++] = rep_node(c, rx_any_char(&r), 0, INT64_MAX);
    ids[n++] = body;
    if (!a1)
        ids[n++] = rep_node(c, rx_any_char(&r), 0, INT64_MAX);
    return seq_node(c, ids, n);
}

/* ---- GBNF (llama.cpp's grammar format) --------------------------------------- */

typedef struct {
    char name[64];
    uint32_t ref;      /* its N_REF node; a = the body once defined */
    bool defined;
} grule_t;

typedef struct {
    comp_t *c;
    const char *s, *p, *e;
    grule_t *rules;
    uint32_t n_rules;
} gb_t;

static void gb_fail(gb_t *b, pd_status_t st, const char *why)
{
    uint32_t line = 1;
    for (const char *q = b->s; q < b->p && q < b->e; q++)
        line += *q == '\n';
    cfail(b->c, st, "grammar: %s (line %u)", why, line);
}

static bool gb_word(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '_';
}

/* Spaces, tabs, comments; newlines too when nl. */
static void gb_space(gb_t *b, bool nl)
{
    while (b->p < b->e) {
        char ch = *b->p;
        if (ch == ' ' || ch == '\t' || (nl && (ch == '\n' || ch == '\r'))) {
            b->p++;
        } else if (ch == '#') {
            while (b->p < b->e && *b->p != '\n')
                b->p++;
        } else {
            break;
        }
    }
}

static uint32_t gb_rule(gb_t *b, const char *name, size_t n)
{
    for (uint32_t i = 0; i < b->n_rules; i++)
        if (strlen(b->rules[i].name) == n && memcmp(b->rules[i].name, name, n) == 0)
            return i;
    if (n >= sizeof(b->rules[0].name)) {
        gb_fail(b, PD_ERR_TOO_BIG, "rule names are limited to 63 bytes");
        return UINT32_MAX;
    }
    if (b->n_rules >= ENG_GRAM_MAX_RULES) {
        gb_fail(b, PD_ERR_TOO_BIG, "more rules than ENG_GRAM_MAX_RULES");
        return UINT32_MAX;
    }
    grule_t *r = &b->rules[b->n_rules];
    memcpy(r->name, name, n);
    r->name[n] = '\0';
    r->defined = false;
    r->ref = new_node(b->c, N_REF, 0, 0);
    if (b->c->st != PD_OK)
        return UINT32_MAX;
    return b->n_rules++;
}

/* One character of a literal or class (escapes: \n \r \t \\ \" \[ \] \-
 * \xHH \uHHHH \UHHHHHHHH); -1 on error. */
static int64_t gb_char(gb_t *b)
{
    if (*b->p != '\\')
        return utf8_get(&b->p, b->e);
    b->p++;
    if (b->p >= b->e)
        return -1;
    char ch = *b->p++;
    int nd = 0;
    switch (ch) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'x': nd = 2; break;
    case 'u': nd = 4; break;
    case 'U': nd = 8; break;
    default:
        if (strchr("\\\"[]-/'", ch) && ch)
            return (uint8_t)ch;
        return -1;
    }
    int64_t v = 0;
    for (int i = 0; i < nd; i++) {
        int h = b->p < b->e ? hexv(*b->p) : -1;
        if (h < 0)
            return -1;
        v = v * 16 + h;
        b->p++;
    }
    return v <= 0x10ffff ? v : -1;
}

static uint32_t gb_alts(gb_t *b, uint32_t nest);

static uint32_t gb_seq(gb_t *b, uint32_t nest)
{
    comp_t *c = b->c;
    uint32_t ids[256], n = 0;
    while (b->p < b->e && c->st == PD_OK) {
        char ch = *b->p;
        uint32_t atom;
        if (ch == '"') {
            b->p++;
            char buf[1024];
            size_t k = 0;
            while (b->p < b->e && *b->p != '"') {
                int64_t cp = gb_char(b);
                if (cp < 0) {
                    gb_fail(b, PD_ERR_BAD_INPUT, "bad escape or UTF-8 in a literal");
                    return 0;
                }
                if (k + 4 > sizeof(buf)) {
                    gb_fail(b, PD_ERR_TOO_BIG, "literals are limited to 1 KiB");
                    return 0;
                }
                k += utf8_put((uint32_t)cp, buf + k);
            }
            if (b->p >= b->e) {
                gb_fail(b, PD_ERR_BAD_INPUT, "unterminated literal");
                return 0;
            }
            b->p++;
            atom = k ? lit_node(c, buf, k) : list_node(c, N_SEQ, NULL, 0);
        } else if (ch == '[') {
            b->p++;
            cls_t k = { .n = 0 };
            if (b->p < b->e && *b->p == '^') {
                k.neg = true;
                b->p++;
            }
            while (b->p < b->e && *b->p != ']') {
                int64_t lo = gb_char(b), hi;
                if (lo < 0) {
                    gb_fail(b, PD_ERR_BAD_INPUT, "bad escape or UTF-8 in a character class");
                    return 0;
                }
                hi = lo;
                if (b->p + 1 < b->e && *b->p == '-' && b->p[1] != ']') {
                    b->p++;
                    hi = gb_char(b);
                    if (hi < lo) {
                        gb_fail(b, PD_ERR_BAD_INPUT, "bad range in a character class");
                        return 0;
                    }
                }
                cls_add(&k, lo, hi);
            }
            if (b->p >= b->e) {
                gb_fail(b, PD_ERR_BAD_INPUT, "unterminated character class");
                return 0;
            }
            b->p++;
            atom = cls_node(c, &k, false);
        } else if (ch == '.') {
            b->p++;
            cls_t k = { .n = 0, .neg = true };
            atom = cls_raw(c, &k);
        } else if (ch == '(') {
            if (nest + 1 > ENG_GRAM_MAX_NEST) {
                gb_fail(b, PD_ERR_TOO_BIG, "groups nested deeper than ENG_GRAM_MAX_NEST");
                return 0;
            }
            b->p++;
            gb_space(b, true);
            atom = gb_alts(b, nest + 1);
            if (c->st != PD_OK)
                return 0;
            if (b->p >= b->e || *b->p != ')') {
                gb_fail(b, PD_ERR_BAD_INPUT, "missing ')'");
                return 0;
            }
            b->p++;
        } else if (gb_word(ch)) {
            const char *w = b->p;
            while (b->p < b->e && gb_word(*b->p))
                b->p++;
            uint32_t ri = gb_rule(b, w, (size_t)(b->p - w));
            if (ri == UINT32_MAX)
                return 0;
            atom = b->rules[ri].ref;
        } else {
            break;
        }
        gb_space(b, nest > 0);
        /* postfix operators */
        while (b->p < b->e && c->st == PD_OK) {
            int64_t lo, hi;
            if (*b->p == '*') {
                lo = 0, hi = INT64_MAX;
            } else if (*b->p == '+') {
                lo = 1, hi = INT64_MAX;
            } else if (*b->p == '?') {
                lo = 0, hi = 1;
            } else if (*b->p == '{') {
                b->p++;
                gb_space(b, nest > 0);
                rx_t r = { c, b->p, b->e, false, "grammar", b->s };
                if (!rx_int(&r, &lo)) {
                    gb_fail(b, PD_ERR_BAD_INPUT, "expected a number after '{'");
                    return 0;
                }
                b->p = r.p;
                hi = lo;
                gb_space(b, nest > 0);
                if (b->p < b->e && *b->p == ',') {
                    b->p++;
                    gb_space(b, nest > 0);
                    r.p = b->p;
                    hi = rx_int(&r, &hi) ? hi : INT64_MAX;
                    b->p = r.p;
                    gb_space(b, nest > 0);
                }
                if (b->p >= b->e || *b->p != '}' || hi < lo) {
                    gb_fail(b, PD_ERR_BAD_INPUT, "expected {m}, {m,} or {m,n} with m <= n");
                    return 0;
                }
            } else {
                break;
            }
            b->p++;
            atom = rep_node(c, atom, lo, hi);
            gb_space(b, nest > 0);
        }
        list_push(c, ids, &n, 256, false, atom);
    }
    return c->st == PD_OK ? seq_node(c, ids, n) : 0;
}

static uint32_t gb_alts(gb_t *b, uint32_t nest)
{
    uint32_t ids[ENG_GRAM_MAX_ANYOF], n = 0;
    for (;;) {
        uint32_t s = gb_seq(b, nest);
        if (b->c->st != PD_OK)
            return 0;
        list_push(b->c, ids, &n, ENG_GRAM_MAX_ANYOF, true, s);
        if (b->p < b->e && *b->p == '|') {
            b->p++;
            gb_space(b, true);
            continue;
        }
        break;
    }
    return alts_node(b->c, ids, n);
}

static uint32_t comp_gbnf(comp_t *c, const char *text, size_t len, grule_t *rules,
                          uint32_t *n_rules)
{
    gb_t b = { c, text, text, text + len, rules, 0 };
    if (memchr(text, '\0', len)) {
        cfail(c, PD_ERR_BAD_INPUT, "grammar: contains a NUL byte");
        return 0;
    }
    gb_space(&b, true);
    while (b.p < b.e && c->st == PD_OK) {
        const char *w = b.p;
        while (b.p < b.e && gb_word(*b.p))
            b.p++;
        if (b.p == w) {
            gb_fail(&b, PD_ERR_BAD_INPUT, "expected a rule name");
            break;
        }
        uint32_t ri = gb_rule(&b, w, (size_t)(b.p - w));
        if (ri == UINT32_MAX)
            break;
        gb_space(&b, false);
        if (b.e - b.p < 3 || memcmp(b.p, "::=", 3) != 0) {
            gb_fail(&b, PD_ERR_BAD_INPUT, "expected '::='");
            break;
        }
        b.p += 3;
        gb_space(&b, true);
        uint32_t body = gb_alts(&b, 0);
        if (c->st != PD_OK)
            break;
        if (b.p < b.e && *b.p == '\r')
            b.p++;
        if (b.p < b.e && *b.p != '\n') {
            gb_fail(&b, PD_ERR_BAD_INPUT, "unexpected character (expected the end of the rule)");
            break;
        }
        if (b.rules[ri].defined) {
            char why[128];
            snprintf(why, sizeof(why), "rule '%s' is defined twice", b.rules[ri].name);
            gb_fail(&b, PD_ERR_BAD_INPUT, why);
            break;
        }
        b.rules[ri].defined = true;
        c->g->nodes[b.rules[ri].ref].a = body;
        gb_space(&b, true);
    }
    *n_rules = b.n_rules;
    if (c->st != PD_OK)
        return 0;
    uint32_t root = UINT32_MAX;
    for (uint32_t i = 0; i < b.n_rules; i++) {
        if (!b.rules[i].defined) {
            cfail(c, PD_ERR_BAD_INPUT, "grammar: rule '%s' is used but not defined",
                  b.rules[i].name);
            return 0;
        }
        if (strcmp(b.rules[i].name, "root") == 0)
            root = b.rules[i].ref;
    }
    if (root == UINT32_MAX) {
        cfail(c, PD_ERR_BAD_INPUT, "grammar: no rule 'root'");
        return 0;
    }
    return root;
}

/* Free JSON: STR, NUM, true, false, null, then the N_ANYVAL whose `a` is
 * the block's base (N_ANYOBJ nodes point at the same block; their values
 * are base + 5). Returns base. */
static uint32_t any_block(comp_t *c)
{
    uint32_t base = new_node(c, N_STR, 0, 0);
    new_node(c, N_NUM, 0, 0);
    lit_node(c, "true", 4);
    lit_node(c, "false", 5);
    lit_node(c, "null", 4);
    new_node(c, N_ANYVAL, 0, base);
    return base;
}

/* Keywords that do not constrain a value (JSON Schema 2020-12 "meta-data"
 * and core identifiers, and vendor extensions): accepted and ignored. */
static const char *const annotations[] = {
    "description", "title", "$schema", "$comment", "examples", "$id", "default",
    "deprecated", "readOnly", "writeOnly", "$anchor", "$dynamicAnchor", "$vocabulary",
    "contentEncoding", "contentMediaType", NULL,
};

static bool is_annotation(const char *k)
{
    if (strncmp(k, "x-", 2) == 0)
        return true;
    for (int i = 0; annotations[i]; i++)
        if (strcmp(k, annotations[i]) == 0)
            return true;
    return false;
}

static uint32_t comp_schema(comp_t *c, const cJSON *s, uint32_t depth, bool root);

static const cJSON *resolve_ref(comp_t *c, const char *ref)
{
    const char *pfx[] = { "#/$defs/", "#/definitions/" };
    for (int i = 0; i < 2; i++) {
        size_t pl = strlen(pfx[i]);
        if (strncmp(ref, pfx[i], pl) == 0) {
            const cJSON *defs = cJSON_GetObjectItemCaseSensitive(c->doc, i ? "definitions"
                                                                           : "$defs");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(defs, ref + pl);
            if (t)
                return t;
        }
    }
    if (strcmp(ref, "#") == 0)
        return c->doc;
    cfail(c, PD_ERR_BAD_INPUT, "'$ref' \"%.64s\" does not name an entry of $defs", ref);
    return NULL;
}

/* ---- oneOf: are two branches disjoint? ----------------------------------- */

/* The schema a $ref (chain) names, or s itself; NULL on a bad ref. */
static const cJSON *deref(comp_t *c, const cJSON *s)
{
    for (int hop = 0; hop < 8 && s != NULL; hop++) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(s, "$ref");
        if (!cJSON_IsString(r))
            return s;
        s = resolve_ref(c, r->valuestring);
    }
    return s;
}

/* Bit set of the JSON types a schema's values can have (1 null, 2 boolean,
 * 4 number/integer, 8 string, 16 array, 32 object); 63 when unknown. */
static unsigned json_types(comp_t *c, const cJSON *s)
{
    s = deref(c, s);
    if (s == NULL)
        return 63;
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (cn != NULL || en != NULL) {
        unsigned m = 0;
        const cJSON *v;
        if (cn != NULL)
            m = cJSON_IsNull(cn) ? 1 : cJSON_IsBool(cn) ? 2 : cJSON_IsNumber(cn) ? 4
              : cJSON_IsString(cn) ? 8 : cJSON_IsArray(cn) ? 16 : 32;
        else
            cJSON_ArrayForEach(v, en)
                m |= cJSON_IsNull(v) ? 1 : cJSON_IsBool(v) ? 2 : cJSON_IsNumber(v) ? 4
                   : cJSON_IsString(v) ? 8 : cJSON_IsArray(v) ? 16 : 32;
        return m;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    static const char *const names[] = { "null", "boolean", "number", "string", "array",
                                         "object", "integer" };
    unsigned m = 0;
    const cJSON *t = cJSON_IsArray(ty) ? ty->child : ty;
    for (; t != NULL; t = cJSON_IsArray(ty) ? t->next : NULL) {
        if (!cJSON_IsString(t))
            return 63;
        for (int k = 0; k < 7; k++)
            if (strcmp(t->valuestring, names[k]) == 0)
                m |= k == 6 ? 4u : 1u << k;
    }
    if (m != 0 && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable")))
        m |= 1;
    return m != 0 ? m : 63;
}

/* The values a property can take when its schema is a const or an enum of
 * scalars (NULL otherwise). */
static const cJSON *tag_values(comp_t *c, const cJSON *ps, bool *one_p)
{
    ps = deref(c, ps);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(ps, "const");
    if (v != NULL) {
        *one_p = true;
        return v;
    }
    v = cJSON_GetObjectItemCaseSensitive(ps, "enum");
    *one_p = false;
    return cJSON_IsArray(v) ? v : NULL;
}

static bool tag_shared(const cJSON *a, bool a1, const cJSON *b, bool b1)
{
    const cJSON *x = a1 ? a : a->child;
    for (; x != NULL; x = a1 ? NULL : x->next) {
        const cJSON *y = b1 ? b : b->child;
        for (; y != NULL; y = b1 ? NULL : y->next)
            if (cJSON_Compare(x, y, true))
                return true;
    }
    return false;
}

static bool is_required(const cJSON *s, const char *name)
{
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(s, "required"))
        if (cJSON_IsString(r) && strcmp(r->valuestring, name) == 0)
            return true;
    return false;
}

/* No value matches both: other JSON types, or two objects with a property
 * both require whose constants differ. */
static bool schemas_disjoint(comp_t *c, const cJSON *a, const cJSON *b)
{
    unsigned ta = json_types(c, a), tb = json_types(c, b);
    if ((ta & tb) == 0)
        return true;
    a = deref(c, a);
    b = deref(c, b);
    if (a == NULL || b == NULL)
        return false;
    const cJSON *ca = cJSON_GetObjectItemCaseSensitive(a, "const");
    const cJSON *ea = cJSON_GetObjectItemCaseSensitive(a, "enum");
    const cJSON *cb = cJSON_GetObjectItemCaseSensitive(b, "const");
    const cJSON *eb = cJSON_GetObjectItemCaseSensitive(b, "enum");
    if ((ca != NULL || cJSON_IsArray(ea)) && (cb != NULL || cJSON_IsArray(eb)))
        return !tag_shared(ca != NULL ? ca : ea, ca != NULL, cb != NULL ? cb : eb, cb != NULL);
    if (ta != 32 || tb != 32)
        return false;
    const cJSON *pa = cJSON_GetObjectItemCaseSensitive(a, "properties");
    const cJSON *pb = cJSON_GetObjectItemCaseSensitive(b, "properties");
    const cJSON *p;
    cJSON_ArrayForEach(p, pa) {
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(pb, p->string);
        if (q == NULL || !is_required(a, p->string) || !is_required(b, p->string))
            continue;
        bool a1, b1;
        const cJSON *va = tag_values(c, p, &a1), *vb = tag_values(c, q, &b1);
        if (va != NULL && vb != NULL && !tag_shared(va, a1, vb, b1))
            return true;
    }
    return false;
}

static uint32_t comp_type(comp_t *c, const cJSON *s, const char *type, uint32_t depth,
                          bool root)
{
    if (strcmp(type, "string") == 0)
        return str_node(c, s);
    if (strcmp(type, "number") == 0)
        return int_node(c, s, N_NUM); /* bounded: see feed_num */
    if (strcmp(type, "integer") == 0)
        return int_node(c, s, N_INT);
    if (strcmp(type, "boolean") == 0) {
        uint32_t ids[2] = { lit_node(c, "true", 4), lit_node(c, "false", 5) };
        return alts_node(c, ids, 2);
    }
    if (strcmp(type, "null") == 0)
        return lit_node(c, "null", 4);
    if (strcmp(type, "array") == 0) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, "items");
        const cJSON *pi = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
        if (pi != NULL) {
            /* a tuple: every prefix item, in order, and nothing after (valid
             * whatever 'items' says) */
            int n = cJSON_GetArraySize(pi);
            int64_t lo, hi;
            if (!cJSON_IsArray(pi) || n > 64) {
                cfail_kw(c, PD_ERR_BAD_INPUT, "prefixItems", "'prefixItems' must be an array "
                         "of at most 64 schemas");
                return 0;
            }
            if (!count_range(c, s, "minItems", "maxItems", 1024, &lo, &hi))
                return 0;
            if (lo > n || hi < n) {
                cfail_kw(c, PD_ERR_BAD_INPUT, lo > n ? "minItems" : "maxItems",
                         "'prefixItems' is emitted whole: minItems/maxItems must allow "
                         "exactly its length");
                return 0;
            }
            if (it != NULL && !cJSON_IsBool(it)) {
                size_t o = path_push(c, "items");
                comp_schema(c, it, depth + 1, false); /* checked, never used */
                path_pop(c, o);
            }
            uint32_t ids[2 * 64 + 1], k = 0, i = 0;
            ids[k++] = lit_node(c, "[", 1);
            const cJSON *e;
            cJSON_ArrayForEach(e, pi) {
                char ix[16];
                snprintf(ix, sizeof(ix), "%u", i);
                if (i++ > 0)
                    ids[k++] = lit_node(c, ",", 1);
                size_t o1 = path_push(c, "prefixItems"), o2 = path_push(c, ix);
                ids[k++] = comp_schema(c, e, depth + 1, false);
                path_pop(c, o2);
                path_pop(c, o1);
            }
            ids[k++] = lit_node(c, "]", 1);
            return seq_node(c, ids, k);
        }
        if (cJSON_IsBool(it)) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "items", "a boolean 'items' needs 'prefixItems'");
            return 0;
        }
        size_t o = path_push(c, "items");
        uint32_t item = it ? comp_schema(c, it, depth + 1, false) : any_block(c) + 5;
        path_pop(c, o);
        int64_t lo, hi;
        if (!count_range(c, s, "minItems", "maxItems", 1024, &lo, &hi))
            return 0;
        if (hi >= 65535)
            hi = INT64_MAX; /* the item count is kept in 16 bits */
        if (lo == 0 && hi == INT64_MAX)
            return new_node(c, N_ARR, 0, item);
        return range_node(c, N_ARR, lo, hi, item);
    }
    if (strcmp(type, "object") == 0) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        if (props && !cJSON_IsObject(props)) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "properties", "'properties' must be an object");
            return 0;
        }
        int64_t plo, phi;
        if (!count_range(c, s, "minProperties", "maxProperties", 256, &plo, &phi))
            return 0;
        if (ap && !cJSON_IsBool(ap) && !cJSON_IsObject(ap)) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "additionalProperties",
                     "'additionalProperties' must be a boolean or a schema");
            return 0;
        }
        uint32_t apv = 0; /* the schema of additional properties */
        if (ap && cJSON_IsObject(ap)) {
            size_t o = path_push(c, "additionalProperties");
            apv = comp_schema(c, ap, depth + 1, false);
            path_pop(c, o);
            if (c->st != PD_OK)
                return 0;
        }
        if (apv && cJSON_GetArraySize(props) == 0) {
            /* a map: {"k":v,...} with any string keys (as z.record) */
            if (plo > 1 || phi < INT64_MAX) {
                cfail_kw(c, PD_ERR_BAD_INPUT, plo > 1 ? "minProperties" : "maxProperties",
                         "minProperties above 1 / maxProperties on a map are not supported "
                         "(keys could repeat)");
                return 0;
            }
            uint32_t key = new_node(c, N_STR, 0, 0);
            uint32_t e1[3] = { key, lit_node(c, ":", 1), apv };
            uint32_t kv = seq_node(c, e1, 3);
            uint32_t e2[2] = { lit_node(c, ",", 1), kv };
            uint32_t more = rep_node(c, seq_node(c, e2, 2), 0, INT64_MAX);
            uint32_t e3[2] = { kv, more };
            uint32_t body = rep_node(c, seq_node(c, e3, 2), plo, 1);
            uint32_t e4[3] = { lit_node(c, "{", 1), body, lit_node(c, "}", 1) };
            return seq_node(c, e4, 3);
        }
        if ((int64_t)cJSON_GetArraySize(props) < plo || (int64_t)cJSON_GetArraySize(props) > phi) {
            cfail_kw(c, PD_ERR_BAD_INPUT,
                     (int64_t)cJSON_GetArraySize(props) < plo ? "minProperties" : "maxProperties",
                     "every declared property is emitted: minProperties/maxProperties must "
                     "allow their count");
            return 0;
        }
        if (req) {
            if (!cJSON_IsArray(req)) {
                cfail_kw(c, PD_ERR_BAD_INPUT, "required", "'required' must be an array of property names");
                return 0;
            }
            const cJSON *r;
            cJSON_ArrayForEach(r, req) {
                if (!cJSON_IsString(r) ||
                    !cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) {
                    cfail_kw(c, PD_ERR_BAD_INPUT, "required",
                             "'required' names a property that 'properties' does not declare");
                    return 0;
                }
            }
        }
        (void)root;
        uint32_t np = (uint32_t)cJSON_GetArraySize(props);
        if (np > 256) {
            cfail(c, PD_ERR_TOO_BIG, "an object may declare at most 256 properties");
            return 0;
        }
        uint32_t keys[256], vals[256], i = 0;
        bool opt[256];
        /* with minProperties/maxProperties every declared property is emitted */
        bool counted = cJSON_GetObjectItemCaseSensitive(s, "minProperties") != NULL ||
                       cJSON_GetObjectItemCaseSensitive(s, "maxProperties") != NULL;
        const cJSON *p;
        cJSON_ArrayForEach(p, props) {
            opt[i] = false;
            if (!counted) {
                bool in = false;
                const cJSON *r;
                cJSON_ArrayForEach(r, req)
                    in |= cJSON_IsString(r) && strcmp(r->valuestring, p->string) == 0;
                opt[i] = !in;
            }
            cJSON *ks = cJSON_CreateString(p->string);
            if (!ks) {
                cfail(c, PD_ERR_NO_MEMORY, "out of memory");
                return 0;
            }
            char *kt = cJSON_PrintUnformatted(ks);
            cJSON_Delete(ks);
            if (!kt) {
                cfail(c, PD_ERR_NO_MEMORY, "out of memory");
                return 0;
            }
            size_t kl = strlen(kt);
            char buf[600];
            if (kl + 1 >= sizeof(buf)) {
                cJSON_free(kt);
                cfail(c, PD_ERR_TOO_BIG, "property names are limited to 512 bytes");
                return 0;
            }
            memcpy(buf, kt, kl);
            buf[kl] = ':';
            cJSON_free(kt);
            keys[i] = lit_node(c, buf, kl + 1);
            size_t o1 = path_push(c, "properties"), o2 = path_push(c, p->string);
            vals[i] = comp_schema(c, p, depth + 1, false);
            path_pop(c, o2);
            path_pop(c, o1);
            i++;
            if (c->st != PD_OK)
                return 0;
        }
        eng_gram_t *g = c->g;
        if (!grow((void **)&g->props, &g->cap_props, g->n_props + np, sizeof(gprop_t))) {
            cfail(c, PD_ERR_NO_MEMORY, "out of memory");
            return 0;
        }
        for (uint32_t j = 0; j < np; j++)
            g->props[g->n_props + j] = (gprop_t){ keys[j], vals[j], 0, 0, opt[j] };
        uint32_t id = new_node(c, N_OBJ, np, g->n_props);
        g->n_props += np;
        return id;
    }
    cfail(c, PD_ERR_BAD_INPUT, "unsupported 'type' \"%.32s\"", type);
    return 0;
}

static uint32_t comp_schema1(comp_t *c, const cJSON *s, uint32_t depth, bool root);

/* "nullable": true (OpenAPI style, as the openai client's zod helper emits
 * it) = anyOf [the schema, null]. */
static uint32_t comp_schema(comp_t *c, const cJSON *s, uint32_t depth, bool root)
{
    uint32_t id = comp_schema1(c, s, depth, root);
    const cJSON *nl = cJSON_GetObjectItemCaseSensitive(s, "nullable");
    if (c->st != PD_OK || nl == NULL || cJSON_IsFalse(nl))
        return id;
    if (!cJSON_IsTrue(nl)) {
        cfail_kw(c, PD_ERR_BAD_INPUT, "nullable", "'nullable' must be a boolean");
        return 0;
    }
    uint32_t ids[2] = { id, lit_node(c, "null", 4) };
    return alts_node(c, ids, 2);
}

static uint32_t comp_schema1(comp_t *c, const cJSON *s, uint32_t depth, bool root)
{
    if (c->st != PD_OK)
        return 0;
    if (depth > ENG_GRAM_MAX_DEPTH) {
        cfail(c, PD_ERR_TOO_BIG,
              "schema nesting (including $ref expansion) deeper than %u (recursive $ref?)",
              ENG_GRAM_MAX_DEPTH);
        return 0;
    }
    if (!cJSON_IsObject(s)) {
        cfail(c, PD_ERR_BAD_INPUT, "every schema must be a JSON object");
        return 0;
    }
    static const char *const known[] = {
        "type", "properties", "required", "additionalProperties", "items", "enum",
        "const", "anyOf", "$ref", "$defs", "definitions", "strict", "nullable", "minimum",
        "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
        "minItems", "maxItems", "format", "pattern", "multipleOf", "prefixItems",
        "minProperties", "maxProperties", "oneOf", "allOf", NULL,
    };
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        bool ok = is_annotation(k->string);
        for (int i = 0; !ok && known[i]; i++)
            ok = strcmp(k->string, known[i]) == 0;
        if (!ok) {
            char why[128];
            snprintf(why, sizeof(why), "unsupported JSON schema keyword '%.64s'", k->string);
            cfail_kw(c, PD_ERR_BAD_INPUT, k->string, why);
            return 0;
        }
    }
    /* value bounds apply where the schema is compiled by its type: next to
     * $ref / const / enum / anyOf (compiled without it) they would be lost */
    static const char *const bounds[] = { "minimum", "maximum", "exclusiveMinimum",
                                          "exclusiveMaximum", "minLength", "maxLength",
                                          "minItems", "maxItems", "format", "pattern",
                                          "multipleOf", "prefixItems", "minProperties",
                                          "maxProperties", NULL };
    static const char *const alone[] = { "$ref", "const", "enum", "anyOf", "oneOf", "allOf",
                                         NULL };
    for (int i = 0; alone[i]; i++) {
        if (!cJSON_GetObjectItemCaseSensitive(s, alone[i]))
            continue;
        for (int j = 0; bounds[j]; j++)
            if (cJSON_GetObjectItemCaseSensitive(s, bounds[j])) {
                char why[96];
                snprintf(why, sizeof(why), "'%s' next to '%s' is not supported (put it in "
                         "the branches)", bounds[j], alone[i]);
                cfail_kw(c, PD_ERR_BAD_INPUT, bounds[j], why);
                return 0;
            }
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "$ref", "'$ref' must be a string");
            return 0;
        }
        const cJSON *t = resolve_ref(c, ref->valuestring);
        if (t == NULL)
            return 0;
        /* errors inside name the target's place: "/$defs/Name/..." */
        char saved[sizeof(c->path)];
        size_t sl = c->plen;
        bool scut = c->path_cut;
        memcpy(saved, c->path, sl + 1);
        const char *frag = ref->valuestring + 1; /* after '#' */
        size_t fl = strlen(frag);
        if (fl < sizeof(c->path)) {
            memcpy(c->path, frag, fl + 1);
            c->plen = fl;
        }
        /* a call: compiled once, every $ref to it (recursive ones too) is
         * the same N_REF node */
        uint32_t id = 0;
        for (uint32_t i = 0; i < c->n_refs && id == 0; i++)
            if (c->refs[i].target == t)
                id = c->refs[i].ref;
        if (id == 0 && c->n_refs >= sizeof(c->refs) / sizeof(c->refs[0])) {
            cfail(c, PD_ERR_TOO_BIG, "more than 256 distinct '$ref' targets");
        } else if (id == 0) {
            id = new_node(c, N_REF, 0, 0);
            if (c->st == PD_OK) {
                c->refs[c->n_refs].target = t;
                c->refs[c->n_refs++].ref = id;
                uint32_t body = comp_schema(c, t, depth + 1, root);
                c->g->nodes[id].a = body;
            }
        }
        memcpy(c->path, saved, sl + 1);
        c->plen = sl;
        c->path_cut = scut;
        return id;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (cn)
        return value_lit(c, cn);
    if (en) {
        int n = cJSON_GetArraySize(en);
        if (!cJSON_IsArray(en) || n < 1 || n > 256) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "enum", "'enum' must be an array of 1 to 256 values");
            return 0;
        }
        uint32_t ids[256], i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, en)
            ids[i++] = value_lit(c, e);
        return alts_node(c, ids, i);
    }
    /* allOf of one schema (zod and pydantic wrap a $ref that way to add a
     * description) is that schema; an intersection of several is not built */
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (all) {
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "allOf",
                     "'allOf' with more than one schema (an intersection) is not supported");
            return 0;
        }
        size_t o1 = path_push(c, "allOf"), o2 = path_push(c, "0");
        uint32_t id = comp_schema(c, all->child, depth + 1, root);
        path_pop(c, o2);
        path_pop(c, o1);
        return id;
    }
    /* oneOf: exactly one branch may match. Where the branches provably
     * exclude each other (other JSON types, or objects told apart by a
     * required property with different constants: a discriminated union)
     * it is anyOf; otherwise "exactly one" is not decidable here: refused */
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (one) {
        int n = cJSON_GetArraySize(one);
        if (!cJSON_IsArray(one) || n < 1 || n > (int)ENG_GRAM_MAX_ANYOF) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "oneOf", "'oneOf' must be an array of 1 to 64 schemas");
            return 0;
        }
        const cJSON *bi, *bj;
        int i = 0;
        cJSON_ArrayForEach(bi, one) {
            int j = 0;
            cJSON_ArrayForEach(bj, one) {
                if (j > i && !schemas_disjoint(c, bi, bj)) {
                    if (c->st != PD_OK)
                        return 0;
                    char why[160];
                    snprintf(why, sizeof(why), "'oneOf' branches %d and %d may both match: use "
                             "anyOf, or tell objects apart by a required 'const' property", i, j);
                    cfail_kw(c, PD_ERR_BAD_INPUT, "oneOf", why);
                    return 0;
                }
                j++;
            }
            i++;
        }
        any = one;
    }
    if (any) {
        int n = cJSON_GetArraySize(any);
        if (!cJSON_IsArray(any) || n < 1 || n > (int)ENG_GRAM_MAX_ANYOF) {
            cfail(c, PD_ERR_BAD_INPUT, "'anyOf' must be an array of 1 to %u schemas",
                  ENG_GRAM_MAX_ANYOF);
            return 0;
        }
        uint32_t ids[ENG_GRAM_MAX_ANYOF], i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, any) {
            char ix[16];
            snprintf(ix, sizeof(ix), "%u", i);
            size_t o1 = path_push(c, any == one ? "oneOf" : "anyOf"), o2 = path_push(c, ix);
            ids[i++] = comp_schema(c, e, depth + 1, false);
            path_pop(c, o2);
            path_pop(c, o1);
        }
        return alts_node(c, ids, i);
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(ty))
        return comp_type(c, s, ty->valuestring, depth, root);
    if (cJSON_IsArray(ty)) {
        int n = cJSON_GetArraySize(ty);
        if (n < 1 || n > 7) {
            cfail(c, PD_ERR_BAD_INPUT, "'type' lists 1 to 7 type names");
            return 0;
        }
        uint32_t ids[7], i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, ty) {
            if (!cJSON_IsString(e)) {
                cfail(c, PD_ERR_BAD_INPUT, "'type' entries must be strings");
                return 0;
            }
            ids[i++] = comp_type(c, s, e->valuestring, depth, false);
        }
        return alts_node(c, ids, i);
    }
    cfail(c, PD_ERR_BAD_INPUT, "a schema needs 'type', 'enum', 'const', 'anyOf' or '$ref'");
    return 0;
}

static uint32_t sat_add(uint32_t a, uint32_t b)
{
    return a > UINT32_MAX - b ? UINT32_MAX : a + b;
}

static uint32_t ndig(uint64_t m)
{
    uint32_t d = 1;
    while (m >= 10) {
        m /= 10;
        d++;
    }
    return d;
}

static uint64_t uabs64(int64_t v)
{
    return v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
}

/* The fewest digits to append to an integer prefix of value v (d digits,
 * neg: it began with '-') so that it lies in r; UINT32_MAX if none can. */
static uint32_t int_more(const grange_t *r, int64_t m, int64_t v, bool neg, uint32_t d)
{
    __int128 base = v, span = 1;
    for (uint32_t k = 0; d + k <= 19; k++) {
        __int128 a = neg ? base - (span - 1) : base, b = neg ? base : base + span - 1;
        if (a <= r->hi && b >= r->lo &&
            has_mult(a > r->lo ? a : r->lo, b < r->hi ? b : r->hi, m))
            return k;
        if (v == 0)
            return UINT32_MAX; /* nothing follows a leading 0 */
        base *= 10;
        span *= 10;
    }
    return UINT32_MAX;
}

/* Bytes a format's body still needs from state st (before the quote). */
static uint32_t fmt_rest(uint32_t f, uint32_t st)
{
    static const uint8_t email_rest[8] = { 6, 5, 6, 4, 3, 2, 1, 0 };
    if (formats[f].tpl == NULL)
        return st < 8 ? email_rest[st] : 0;
    uint32_t len = (uint32_t)strlen(formats[f].tpl);
    return st < len ? len - st : 0;
}

static bool is_atext(uint8_t b)
{
    return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') ||
           b == '_' || b == '+' || b == '-';
}

static bool is_lnum(uint8_t b)
{
    return (b >= 'a' && b <= 'z') || (b >= '0' && b <= '9');
}

/* The next state of format f's body after byte b (prev: the byte before
 * it), or -1. */
static int fmt_step(uint32_t f, uint32_t st, uint8_t prev, uint8_t b)
{
    const char *t = formats[f].tpl;
    if (t == NULL) {
        /* atom(.atom)*@label(.label)*.tld, tld 2+ letters (as zod's check
         * wants): states 0-7, 7 accepting; 4 = in a label that cannot end
         * the address, 6/7 = one / two+ letters of a possible tld */
        bool letter = b >= 'a' && b <= 'z', digit = b >= '0' && b <= '9';
        switch (st) {
        case 0: case 2: return is_atext(b) ? 1 : -1;
        case 1: return is_atext(b) ? 1 : b == '.' ? 2 : b == '@' ? 3 : -1;
        case 3: return is_lnum(b) ? 4 : -1;
        case 4: return is_lnum(b) ? 4 : b == '.' ? 5 : -1;
        case 5: return letter ? 6 : digit ? 4 : -1;
        case 6: case 7: return letter ? 7 : digit ? 4 : b == '.' ? 5 : -1;
        default: return -1;
        }
    }
    if (st >= strlen(t))
        return -1;
    bool ok;
    switch (t[st]) {
    case 'D': ok = b >= '0' && b <= '9'; break;
    case 'H': ok = (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f'); break;
    case 'm': ok = b == '0' || b == '1'; break;
    case 'n': ok = prev == '0' ? b >= '1' && b <= '9' : b >= '0' && b <= '2'; break;
    case 'd': ok = b >= '0' && b <= '2'; break;
    case 'e': ok = prev == '0' ? b >= '1' && b <= '9' : prev == '1' ? b >= '0' && b <= '9'
                                                                    : b >= '0' && b <= '8'; break;
    case 'h': ok = b >= '0' && b <= '2'; break;
    case 'i': ok = prev == '2' ? b >= '0' && b <= '3' : b >= '0' && b <= '9'; break;
    case 'M': ok = b >= '0' && b <= '5'; break;
    default: ok = b == (uint8_t)t[st]; break;
    }
    return ok ? (int)st + 1 : -1;
}

/* Shortest completions (min) and shallowest stacks (sdep): a fixed point
 * from "unreachable" down, since calls (N_REF) may point forward or form
 * cycles. Then every node must have a finite value that fits the stack,
 * and no call may reach itself without consuming a byte (left recursion:
 * the walk would not terminate). */
static uint32_t node_min(eng_gram_t *g, gnode_t *nd)
{
    uint32_t m = 0;
    switch (nd->kind) {
    case N_STR:
        m = nd->n ? (uint32_t)sat_add(2, (uint32_t)g->ranges[nd->n - 1].lo) : 2;
        break;
    case N_INT:
    case N_NUM:
        if (nd->n) {
            const grange_t *r = &g->ranges[nd->n - 1];
            m = r->lo <= 0 && r->hi >= 0 ? 1 : r->lo > 0 ? ndig((uint64_t)r->lo)
                                                         : 1 + ndig(uabs64(r->hi));
        } else {
            m = 1;
        }
        break;
    case N_ANYVAL: m = 1; break;
    case N_CLASS: { /* the UTF-8 length of the class's first member */
        const grange_t *r = &g->ranges[nd->a];
        int64_t cp = !nd->x ? (nd->n ? r[0].lo : 0) : nd->n && r[0].lo == 0 ? r[0].hi + 1 : 0;
        m = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        break;
    }
    case N_ANYOBJ: m = 2; break;
    case N_ARR: {
        uint32_t lo = nd->n ? (uint32_t)g->ranges[nd->n - 1].lo : 0;
        uint32_t im = g->nodes[nd->a].min;
        m = 2;
        for (uint32_t k = 0; k < lo; k++)
            m = sat_add(m, sat_add(im, k ? 1 : 0));
        break;
    }
    case N_FMT: m = 2 + fmt_rest(nd->n, 0); break;
    case N_LIT: m = nd->n; break;
    case N_ANYOF:
        m = UINT32_MAX;
        for (uint32_t k = 0; k < nd->n; k++)
            if (g->nodes[g->alts[nd->a + k]].min < m)
                m = g->nodes[g->alts[nd->a + k]].min;
        break;
    case N_SEQ:
        for (uint32_t k = 0; k < nd->n; k++)
            m = sat_add(m, g->nodes[g->alts[nd->a + k]].min);
        break;
    case N_REP: {
        uint64_t t = (uint64_t)g->ranges[nd->n - 1].lo * g->nodes[nd->a].min;
        m = t >= UINT32_MAX ? UINT32_MAX : (uint32_t)t;
        break;
    }
    case N_REF: m = nd->a ? g->nodes[nd->a].min : UINT32_MAX; break;
    case N_OBJ: {
        uint32_t t = 0, cnt = 0;
        for (uint32_t k = nd->n; k-- > 0;) {
            gprop_t *p = &g->props[nd->a + k];
            if (!p->opt) {
                t = sat_add(sat_add(t, cnt ? 1 : 0),
                            sat_add(g->nodes[p->key].min, g->nodes[p->val].min));
                cnt++;
            }
            p->tail = t;
            p->cnt = cnt;
        }
        m = sat_add(t, 2);
        break;
    }
    default: break;
    }
    return m;
}

static uint32_t node_sdep(eng_gram_t *g, const gnode_t *nd)
{
    uint32_t d = 1;
    switch (nd->kind) {
    case N_ARR:
        if (nd->n && g->ranges[nd->n - 1].lo > 0)
            d = sat_add(1, g->nodes[nd->a].sdep);
        break;
    case N_REP:
        if (g->ranges[nd->n - 1].lo > 0)
            d = sat_add(1, g->nodes[nd->a].sdep);
        break;
    case N_SEQ:
        for (uint32_t k = 0; k < nd->n; k++) {
            uint32_t t = sat_add(1, g->nodes[g->alts[nd->a + k]].sdep);
            if (t > d)
                d = t;
        }
        break;
    case N_OBJ:
        for (uint32_t k = 0; k < nd->n; k++) {
            const gprop_t *p = &g->props[nd->a + k];
            if (p->opt)
                continue; /* taken only when it fits (feed_obj) */
            uint32_t t = sat_add(1, g->nodes[p->val].sdep);
            if (t > d)
                d = t;
        }
        if (nd->n && d < 2)
            d = 2;
        break;
    case N_ANYOF:
        d = UINT32_MAX;
        for (uint32_t k = 0; k < nd->n; k++)
            if (g->nodes[g->alts[nd->a + k]].sdep < d)
                d = g->nodes[g->alts[nd->a + k]].sdep;
        break;
    case N_REF: d = nd->a ? g->nodes[nd->a].sdep : UINT32_MAX; break;
    default: break;
    }
    return d;
}

/* Left-recursion check: DFS over the edges a walk follows without a byte
 * (a call, an alternative, a repetition's body, a sequence's children up
 * to its first non-empty one). color: 0 new, 1 on the path, 2 done. */
static bool left_cycle(const eng_gram_t *g, uint32_t id, uint8_t *color, uint32_t *hit,
                       uint32_t depth)
{
    if (color[id] == 2)
        return false;
    if (color[id] == 1 || depth > ENG_GRAM_MAX_NODES) {
        *hit = id;
        return true;
    }
    color[id] = 1;
    const gnode_t *nd = &g->nodes[id];
    bool cyc = false;
    switch (nd->kind) {
    case N_REF:
        cyc = left_cycle(g, nd->a, color, hit, depth + 1);
        break;
    case N_REP:
        cyc = left_cycle(g, nd->a, color, hit, depth + 1);
        break;
    case N_ANYOF:
        for (uint32_t k = 0; k < nd->n && !cyc; k++)
            cyc = left_cycle(g, g->alts[nd->a + k], color, hit, depth + 1);
        break;
    case N_SEQ:
        for (uint32_t k = 0; k < nd->n && !cyc; k++) {
            uint32_t ch = g->alts[nd->a + k];
            cyc = left_cycle(g, ch, color, hit, depth + 1);
            if (g->nodes[ch].min > 0)
                break;
        }
        break;
    default:
        break; /* the others consume a byte before any child */
    }
    color[id] = 2;
    return cyc;
}

static void analyze(comp_t *c, const grule_t *rules, uint32_t n_rules)
{
    eng_gram_t *g = c->g;
    if (c->st != PD_OK)
        return;
    for (uint32_t i = 1; i < g->n_nodes; i++) {
        g->nodes[i].min = UINT32_MAX;
        g->nodes[i].sdep = UINT32_MAX;
    }
    /* passes alternate direction: calls point both ways */
    for (uint32_t pass = 0, chg = 1; chg; pass++) {
        chg = 0;
        for (uint32_t k = 1; k < g->n_nodes; k++) {
            gnode_t *nd = &g->nodes[pass % 2 ? g->n_nodes - k : k];
            uint32_t m = node_min(g, nd), d = node_sdep(g, nd);
            if (m < nd->min) {
                nd->min = m;
                chg = 1;
            }
            if (d < nd->sdep) {
                nd->sdep = d;
                chg = 1;
            }
        }
    }
    g->max_min = 0;
    for (uint32_t i = 1; i < g->n_nodes; i++)
        if (g->nodes[i].min != UINT32_MAX && g->nodes[i].min > g->max_min)
            g->max_min = g->nodes[i].min;
    const gnode_t *rt = &g->nodes[g->root];
    if (rt->min == UINT32_MAX) {
        if (n_rules)
            cfail(c, PD_ERR_BAD_INPUT, "grammar: the recursion never ends: 'root' has no "
                  "finite sentence");
        else
            cfail(c, PD_ERR_BAD_INPUT, "the recursion never ends: no finite output matches (a "
                  "recursion through required properties only: end it with an optional "
                  "property, null or an array)");
        return;
    }
    if (rt->sdep > ENG_GRAM_MAX_STACK) {
        cfail(c, PD_ERR_TOO_BIG, "the shortest output nests deeper than %u frames "
              "(ENG_GRAM_MAX_STACK)", ENG_GRAM_MAX_STACK);
        return;
    }
    uint8_t *color = calloc(g->n_nodes, 1);
    if (!color) {
        cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        return;
    }
    uint32_t hit = 0;
    bool cyc = false;
    for (uint32_t i = 1; i < g->n_nodes && !cyc; i++)
        cyc = left_cycle(g, i, color, &hit, 0);
    free(color);
    if (cyc) {
        const char *name = NULL;
        for (uint32_t i = 0; i < n_rules && !name; i++)
            if (rules[i].ref == hit || rules[i].ref == g->nodes[hit].a)
                name = rules[i].name;
        if (name)
            cfail(c, PD_ERR_BAD_INPUT, "grammar: left recursion (rule '%s' can reach itself "
                  "before any character); rewrite it with repetition", name);
        else if (n_rules)
            cfail(c, PD_ERR_BAD_INPUT, "grammar: left recursion (a rule can reach itself "
                  "before any character); rewrite it with repetition");
        else
            cfail(c, PD_ERR_BAD_INPUT, "a '$ref' cycle that consumes nothing (left recursion)");
    }
}

pd_status_t eng_gram_compile(eng_gram_kind_t kind, const char *schema, size_t len,
                             eng_gram_t **g_p, char *err, size_t err_len)
{
    *g_p = NULL;
    if (err && err_len)
        err[0] = '\0';
    eng_gram_t *g = calloc(1, sizeof(*g));
    if (!g)
        return PD_ERR_NO_MEMORY;
    comp_t *c = calloc(1, sizeof(*c));
    grule_t *rules = NULL;
    uint32_t n_rules = 0;
    if (!c) {
        free(g);
        return PD_ERR_NO_MEMORY;
    }
    *c = (comp_t){ .g = g, .err = err, .err_len = err_len, .st = PD_OK };
    new_node(c, 0, 0, 0); /* node 0 is never used: 0 means "none" */
    if (kind != ENG_GRAM_JSON_OBJECT && len > ENG_GRAM_MAX_SCHEMA_BYTES) {
        cfail(c, PD_ERR_TOO_BIG, "%s larger than %u bytes",
              kind == ENG_GRAM_JSON_SCHEMA ? "schema" : kind == ENG_GRAM_REGEX ? "regex"
                                                                               : "grammar",
              ENG_GRAM_MAX_SCHEMA_BYTES);
    } else if (kind == ENG_GRAM_JSON_OBJECT) {
        uint32_t base = any_block(c);
        g->root = new_node(c, N_ANYOBJ, 0, base);
    } else if (kind == ENG_GRAM_JSON_SCHEMA) {
        cJSON *doc = cJSON_ParseWithLength(schema, len);
        if (!doc) {
            cfail(c, PD_ERR_BAD_INPUT, "schema is not valid JSON");
        } else {
            c->doc = doc;
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(doc, "type");
            if ((!cJSON_IsString(ty) || strcmp(ty->valuestring, "object") != 0) &&
                !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(doc, "$ref")))
                cfail(c, PD_ERR_BAD_INPUT, "the root schema must have \"type\": \"object\"");
            g->root = comp_schema(c, doc, 0, true);
            cJSON_Delete(doc);
        }
    } else if (kind == ENG_GRAM_REGEX) {
        g->root = comp_regex(c, schema, len, false, false, "regex");
    } else if (kind == ENG_GRAM_GBNF) {
        rules = calloc(ENG_GRAM_MAX_RULES, sizeof(*rules));
        if (!rules)
            cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        else
            g->root = comp_gbnf(c, schema, len, rules, &n_rules);
    } else {
        cfail(c, PD_ERR_BAD_INPUT, "unknown grammar kind");
    }
    analyze(c, rules, n_rules);
    free(rules);
    pd_status_t st = c->st;
    free(c);
    if (st != PD_OK) {
        eng_gram_free(g);
        return st;
    }
    *g_p = g;
    return PD_OK;
}

void eng_gram_free(eng_gram_t *g)
{
    if (!g)
        return;
    free(g->nodes);
    free(g->props);
    free(g->alts);
    free(g->pool);
    free(g->ranges);
    free(g);
}

/* ---- runtime: configurations of a pushdown automaton over bytes ----------- */

typedef struct {
    uint32_t node;
    uint8_t phase;
    uint8_t depth;    /* free-JSON nesting (N_ANYVAL / N_ANYOBJ) */
    uint16_t aux;     /* property index, digit count, UTF-8 bytes left, ... */
} frame_t;

typedef struct {
    uint32_t n;                          /* frames */
    uint64_t num;                        /* the top leaf's value so far: a bounded
                                            integer's (int64), a bounded string's
                                            characters, a format's last byte */
    frame_t f[ENG_GRAM_MAX_STACK];
} cfg_t;

typedef struct {
    uint32_t n;
    cfg_t c[ENG_GRAM_MAX_CONFIGS];
} set_t;

struct eng_gram_state {
    const eng_gram_t *g;
    set_t cur;
    set_t tmp[2];
    /* string-body cache: for state sc_set, the non-plain ids that walk */
    const eng_gram_vocab_t *sc_vocab;
    set_t sc_set;
    uint32_t *sc_ok;
    uint32_t sc_n;
};

/* phases */
enum { P_START = 0 };
/* objects (schema N_OBJ and free N_ANYOBJ) */
enum { O_OPEN = 0, O_NEXT, O_KEY, O_VAL, O_FKEYDONE, O_FCOLON, O_FAFTER, O_FCOMMA };
/* arrays */
enum { A_OPEN = 0, A_FIRST, A_AFTER, A_ITEM };
/* strings */
enum { S_OPEN = 0, S_BODY, S_ESC, S_HEX, S_UTF };
/* numbers */
enum { M_START = 0, M_MINUS, M_ZERO, M_INT, M_DOT, M_FRAC, M_EXPCH, M_EXPSIGN, M_EXPDIG };

#define MAX_INT_DIGITS 15
#define MAX_FRAC_DIGITS 15
#define MAX_EXP_DIGITS 2

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
        if (push(g, &k, g->alts[nd->a + i], d))
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
        if (fmt_rest(nd->n, f->aux) != 0)
            return FEED_DONE;
        c->n--;
        c->num = 0;
    } else {
        int ns = fmt_step(nd->n, f->aux, (uint8_t)c->num, b);
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
                has_mult(r->lo, r->hi < -1 ? r->hi : -1, m)) {
                f->phase = M_MINUS;
            } else if (b == '0' && r->lo <= 0 && r->hi >= 0) {
                f->phase = M_ZERO;
            } else if (b >= '1' && b <= '9' && int_more(r, m, dg, false, 1) != UINT32_MAX) {
                f->phase = M_INT;
                f->aux = 1;
                c->num = (uint64_t)dg;
            } else {
                return FEED_DONE;
            }
            set_add(out, c);
            return FEED_DONE;
        case M_MINUS: /* no "-0" */
            if (b < '1' || b > '9' || int_more(r, m, -dg, true, 1) == UINT32_MAX)
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
                    int_more(r, m, (int64_t)nv, neg, f->aux + 1u) == UINT32_MAX)
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
        if (!push(g, c, nd->a, f->depth)) /* key: any_block()'s N_STR */
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
            /* base + 0..4: see any_block() */
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
            feed_cfg(g, &k, b, out);
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
            feed_cfg(g, &k, b, out);
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
        return f->phase == S_OPEN ? nd->min : fmt_rest(nd->n, f->aux) + 1;
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
            case M_MINUS: return ndig(uabs64(r->hi < -1 ? r->hi : -1));
            case M_INT: return int_more(r, nd->x ? g->ranges[nd->x - 1].lo : 1, (int64_t)num,
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
            t = sat_add(t, g->nodes[g->alts[nd->a + k]].min);
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
                t = sat_add(t, sat_add(im, f->phase == A_AFTER || k > 0 ? 1 : 0));
            return t;
        }
        switch (f->phase) {
        case A_OPEN: return 2;
        case A_ITEM: return sat_add(nd->kind == N_ARR ? g->nodes[nd->a].min : 1, 1);
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
        uint32_t after = nx && nx->cnt ? sat_add(nx->tail, 2) : 1;
        switch (f->phase & ~PH_EMIT) {
        case O_OPEN: return nd->min;
        case O_NEXT:
            if (i >= nd->n || g->props[nd->a + i].cnt == 0)
                return 1;
            return sat_add(g->props[nd->a + i].tail, em ? 2 : 1);
        case O_KEY: {
            const gprop_t *p = &g->props[nd->a + i];
            return sat_add(sat_add(g->nodes[p->key].min, g->nodes[p->val].min), after);
        }
        case O_VAL: /* the key is done: this value, then the rest */
            return sat_add(g->nodes[g->props[nd->a + i].val].min, after);
        }
        return 1;
    }
    }
    return 0;
}

/* Shortest bytes that complete the JSON from any configuration of st. */
static uint32_t set_close(const eng_gram_t *g, const set_t *st)
{
    uint32_t best = UINT32_MAX;
    for (uint32_t i = 0; i < st->n; i++) {
        uint32_t t = 0;
        for (uint32_t k = 0; k < st->c[i].n; k++)
            t = sat_add(t, frame_rest(g, &st->c[i].f[k],
                                      k + 1 == st->c[i].n ? st->c[i].num : 0));
        if (t < best)
            best = t;
    }
    return best;
}

static void set_feed(const eng_gram_t *g, const set_t *in, uint8_t b, set_t *out)
{
    out->n = 0;
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

static void set_copy(set_t *d, const set_t *s)
{
    d->n = s->n;
    for (uint32_t i = 0; i < s->n; i++) {
        d->c[i].n = s->c[i].n;
        d->c[i].num = s->c[i].num;
        memcpy(d->c[i].f, s->c[i].f, s->c[i].n * sizeof(frame_t));
    }
}

static bool sets_equal(const set_t *a, const set_t *b)
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
static const set_t *walk(const eng_gram_t *g, const set_t *in, const uint8_t *p, size_t n,
                         set_t *a, set_t *b)
{
    const set_t *cur = in;
    for (size_t i = 0; i < n; i++) {
        set_t *nx = cur == a ? b : a;
        set_feed(g, cur, p[i], nx);
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
    const set_t *r = walk(s->g, &s->cur, b, n, &s->tmp[0], &s->tmp[1]);
    if (!r)
        return false;
    set_copy(&s->cur, r);
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

/* ---- vocabulary ------------------------------------------------------------ */

struct eng_gram_vocab {
    uint32_t n;
    uint32_t *off;          /* (n + 1) into bytes */
    uint8_t *bytes;
    uint8_t *plain;         /* (n) 1: piece is string-body text (no '"', '\\', controls;
                               complete UTF-8 sequences) */
    uint16_t *pre;          /* (n) bytes before the first non-plain one */
    uint32_t *by_first;     /* non-empty ids sorted by (first byte, second byte or
                               256 for one-byte pieces) */
    uint32_t *off2;         /* (256 * 257 + 1) bucket starts in by_first */
    uint32_t *nonplain;     /* non-empty ids that are not plain */
    uint32_t n_nonplain;
    uint32_t max_piece;     /* longest piece, bytes */
    uint32_t *empty;        /* ids with an empty piece (control tokens) */
    uint32_t n_empty;
};

/* Length of the longest prefix of p that is string-body text ending on a
 * character boundary (no '"', '\\', controls; complete UTF-8 sequences). */
static size_t plain_prefix(const uint8_t *p, size_t n)
{
    uint32_t need = 0;
    size_t good = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = p[i];
        if (need) {
            if (b < 0x80 || b > 0xbf)
                return good;
            if (--need == 0)
                good = i + 1;
            continue;
        }
        if (b == '"' || b == '\\' || b < 0x20)
            return good;
        if (b >= 0x80) {
            if (b >= 0xc2 && b <= 0xdf)
                need = 1;
            else if (b >= 0xe0 && b <= 0xef)
                need = 2;
            else if (b >= 0xf0 && b <= 0xf4)
                need = 3;
            else
                return good;
        } else {
            good = i + 1;
        }
    }
    return good;
}

static uint32_t bucket2(const eng_gram_vocab_t *v, uint32_t id)
{
    const uint8_t *p = v->bytes + v->off[id];
    uint32_t len = v->off[id + 1] - v->off[id];
    return (uint32_t)p[0] * 257u + (len > 1 ? p[1] : 256u);
}

pd_status_t eng_gram_vocab_create(uint32_t n, eng_gram_piece_fn piece, void *ctx,
                                  eng_gram_vocab_t **v_p)
{
    *v_p = NULL;
    eng_gram_vocab_t *v = calloc(1, sizeof(*v));
    if (!v)
        return PD_ERR_NO_MEMORY;
    v->n = n;
    v->off = malloc(((size_t)n + 1) * sizeof(uint32_t));
    v->plain = calloc(n ? n : 1, 1);
    v->by_first = malloc((n ? n : 1) * sizeof(uint32_t));
    v->pre = calloc(n ? n : 1, sizeof(uint16_t));
    v->off2 = calloc(256 * 257 + 1, sizeof(uint32_t));
    v->nonplain = malloc((n ? n : 1) * sizeof(uint32_t));
    v->empty = malloc((n ? n : 1) * sizeof(uint32_t));
    size_t cap = (size_t)n * 8 + 64, used = 0;
    v->bytes = malloc(cap);
    if (!v->off || !v->plain || !v->by_first || !v->nonplain || !v->bytes || !v->pre ||
        !v->off2 || !v->empty)
        goto oom;
    char buf[512];
    for (uint32_t i = 0; i < n; i++) {
        size_t k = piece(ctx, (int32_t)i, buf, sizeof(buf));
        if (k > sizeof(buf) || used + k > UINT32_MAX)
            k = 0;
        if (used + k > cap) {
            size_t nc = cap * 2 + k;
            uint8_t *q = realloc(v->bytes, nc);
            if (!q)
                goto oom;
            v->bytes = q;
            cap = nc;
        }
        v->off[i] = (uint32_t)used;
        if (k > v->max_piece)
            v->max_piece = (uint32_t)k;
        memcpy(v->bytes + used, buf, k);
        used += k;
        if (k == 0)
            v->empty[v->n_empty++] = i;
        if (k) {
            size_t pl = plain_prefix((const uint8_t *)buf, k);
            v->pre[i] = (uint16_t)pl;
            v->plain[i] = pl == k;
            if (!v->plain[i])
                v->nonplain[v->n_nonplain++] = i;
        }
    }
    v->off[n] = (uint32_t)used;
    /* counting sort by (first byte, second byte | 256) */
    for (uint32_t i = 0; i < n; i++)
        if (v->off[i + 1] > v->off[i])
            v->off2[bucket2(v, i) + 1]++;
    for (uint32_t b = 0; b < 256 * 257; b++)
        v->off2[b + 1] += v->off2[b];
    uint32_t *pos = malloc(256 * 257 * sizeof(uint32_t));
    if (!pos)
        goto oom;
    memcpy(pos, v->off2, 256 * 257 * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++)
        if (v->off[i + 1] > v->off[i])
            v->by_first[pos[bucket2(v, i)]++] = i;
    free(pos);
    *v_p = v;
    return PD_OK;
oom:
    eng_gram_vocab_free(v);
    return PD_ERR_NO_MEMORY;
}

void eng_gram_vocab_free(eng_gram_vocab_t *v)
{
    if (!v)
        return;
    free(v->off);
    free(v->bytes);
    free(v->plain);
    free(v->by_first);
    free(v->pre);
    free(v->off2);
    free(v->nonplain);
    free(v->empty);
    free(v);
}

uint32_t eng_gram_vocab_size(const eng_gram_vocab_t *v)
{
    return v ? v->n : 0;
}

bool eng_gram_feed_token(eng_gram_state_t *s, const eng_gram_vocab_t *v, int32_t id)
{
    if (id < 0 || (uint32_t)id >= v->n)
        return false;
    return eng_gram_feed(s, v->bytes + v->off[id], v->off[id + 1] - v->off[id]);
}

/* Every configuration sits in a string body with no pending UTF-8 byte:
 * then a plain piece always walks (and leaves the state as it was). */
static bool in_string_body(const eng_gram_t *g, const set_t *st)
{
    if (st->n == 0)
        return false;
    for (uint32_t i = 0; i < st->n; i++) {
        const cfg_t *c = &st->c[i];
        if (c->n == 0)
            return false;
        const frame_t *f = &c->f[c->n - 1];
        /* a bounded string counts its characters: pieces change the state */
        if (g->nodes[f->node].kind != N_STR || g->nodes[f->node].n != 0 || f->phase != S_BODY)
            return false;
    }
    return true;
}

/* The ok flags of one step; budget as in eng_gram_mask (UINT32_MAX: no
 * budget check). A token passes the budget check when, after it, the JSON
 * can still be closed with one-byte tokens and EOS in the tokens left. */
static void mask_ok(const eng_gram_state_t *s, const eng_gram_vocab_t *v, uint32_t nv,
                    uint32_t budget, uint8_t *ok)
{
    const eng_gram_t *g = s->g;
    set_t *ta = (set_t *)&s->tmp[0], *tb = (set_t *)&s->tmp[1];
    const bool tight = budget != UINT32_MAX;
    /* after a token, tokens left = budget - 1, one of them for EOS */
    const uint32_t room = budget >= 2 ? budget - 2 : 0;
#define FITS(set) (!tight || set_close(g, (set)) <= room)
    if (in_string_body(g, &s->cur)) {
        if (FITS(&s->cur))
            memcpy(ok, v->plain, nv);
        else
            memset(ok, 0, nv);
        eng_gram_state_t *ms = (eng_gram_state_t *)s;
        if (!tight && ms->sc_ok && ms->sc_vocab == v && sets_equal(&ms->sc_set, &s->cur)) {
            for (uint32_t k = 0; k < ms->sc_n; k++)
                if (ms->sc_ok[k] < nv)
                    ok[ms->sc_ok[k]] = 1;
            return;
        }
        /* the plain prefix leaves the state as it is: walk from there */
        uint32_t n_ok_np = 0;
        for (uint32_t k = 0; k < v->n_nonplain; k++) {
            uint32_t id = v->nonplain[k];
            if (id >= nv)
                continue;
            uint32_t o = v->off[id] + v->pre[id], e = v->off[id + 1];
            const set_t *r = walk(g, &s->cur, v->bytes + o, e - o, ta, tb);
            bool y = r != NULL && FITS(r);
            ok[id] = y;
            n_ok_np += y;
        }
        if (tight)
            return;
        /* remember the walked ids for the next step in the same string */
        free(ms->sc_ok);
        ms->sc_ok = malloc((n_ok_np ? n_ok_np : 1) * sizeof(uint32_t));
        ms->sc_n = 0;
        if (ms->sc_ok) {
            for (uint32_t k = 0; k < v->n_nonplain; k++)
                if (v->nonplain[k] < nv && ok[v->nonplain[k]])
                    ms->sc_ok[ms->sc_n++] = v->nonplain[k];
            ms->sc_vocab = v;
            set_copy(&ms->sc_set, &s->cur);
        }
        return;
    }
    memset(ok, 0, nv);
    set_t first, second;
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t lo = v->off2[b * 257], hi = v->off2[b * 257 + 257];
        if (lo == hi)
            continue;
        set_feed(g, &s->cur, (uint8_t)b, &first);
        if (first.n == 0)
            continue;
        for (uint32_t b2 = 0; b2 < 257; b2++) {
            uint32_t lo2 = v->off2[b * 257 + b2], hi2 = v->off2[b * 257 + b2 + 1];
            if (lo2 == hi2)
                continue;
            if (b2 == 256) { /* one-byte pieces */
                if (FITS(&first))
                    for (uint32_t k = lo2; k < hi2; k++)
                        if (v->by_first[k] < nv)
                            ok[v->by_first[k]] = 1;
                continue;
            }
            set_feed(g, &first, (uint8_t)b2, &second);
            if (second.n == 0)
                continue;
            for (uint32_t k = lo2; k < hi2; k++) {
                uint32_t id = v->by_first[k];
                if (id >= nv)
                    continue;
                uint32_t o = v->off[id] + 2, e = v->off[id + 1];
                const set_t *r = walk(g, &second, v->bytes + o, e - o, ta, tb);
                ok[id] = r != NULL && FITS(r);
            }
        }
    }
#undef FITS
}

bool eng_gram_mask(const eng_gram_state_t *s, const eng_gram_vocab_t *v,
                   const int32_t *eos, uint32_t n_eos, float *logits, uint32_t n_logits,
                   uint8_t *ok, uint32_t budget)
{
    uint32_t nv = v->n < n_logits ? v->n : n_logits;
    /* the budget matters only once one token could make the JSON too long
     * to close: a byte opens at most one value of max_min bytes */
    uint32_t close = set_close(s->g, &s->cur);
    uint64_t reach = (uint64_t)close + (uint64_t)s->g->max_min * v->max_piece + 2;
    if (budget != UINT32_MAX && (uint64_t)budget > reach)
        budget = UINT32_MAX;
    if (budget == UINT32_MAX && nv == n_logits && in_string_body(s->g, &s->cur)) {
        /* fast path inside a string: every plain piece passes and the state
         * stays, so only the non-plain ids that do not walk (and EOS: a
         * string is never complete) are masked; their walk is cached */
        const eng_gram_state_t *ms = s;
        if (ms->sc_ok && ms->sc_vocab == v && sets_equal(&ms->sc_set, &s->cur)) {
            uint32_t j = 0;
            for (uint32_t k = 0; k < v->n_nonplain; k++) {
                uint32_t id = v->nonplain[k];
                while (j < ms->sc_n && ms->sc_ok[j] < id)
                    j++;
                if (!(j < ms->sc_n && ms->sc_ok[j] == id))
                    logits[id] = -INFINITY;
            }
            for (uint32_t k = 0; k < v->n_empty; k++)
                logits[v->empty[k]] = -INFINITY; /* control tokens, EOS included */
            for (uint32_t k = 0; k < n_eos; k++)
                if (eos[k] >= 0 && (uint32_t)eos[k] < n_logits)
                    logits[eos[k]] = -INFINITY;
            return true;
        }
    }
    mask_ok(s, v, nv, budget, ok);
    bool done = eng_gram_complete(s);
    bool any = nv > 0 && memchr(ok, 1, nv) != NULL;
    if (!any && !done && budget != UINT32_MAX) {
        /* too late to close in budget: at least keep the output a prefix */
        mask_ok(s, v, nv, UINT32_MAX, ok);
        any = nv > 0 && memchr(ok, 1, nv) != NULL;
    }
    if (done && budget != UINT32_MAX && budget <= 1)
        memset(ok, 0, nv); /* the last token: EOS (a text grammar could go on) */
    uint32_t n_eos_ok = 0;
    for (uint32_t i = 0; i < n_eos; i++)
        if (eos[i] >= 0 && (uint32_t)eos[i] < n_logits) {
            if ((uint32_t)eos[i] < nv)
                ok[eos[i]] = done;
            n_eos_ok += done;
        }
    if (n_eos_ok == 0 && (nv == 0 || memchr(ok, 1, nv) == NULL))
        return false;
    for (uint32_t i = 0; i < nv; i++)
        if (!ok[i])
            logits[i] = -INFINITY;
    for (uint32_t i = nv; i < n_logits; i++) {
        bool e = false;
        for (uint32_t k = 0; k < n_eos; k++)
            e |= eos[k] == (int32_t)i;
        if (!(e && done))
            logits[i] = -INFINITY;
    }
    return true;
}
