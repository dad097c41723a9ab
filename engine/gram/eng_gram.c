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
} gnode_t;

typedef struct {
    uint32_t key;     /* N_LIT node: "name": */
    uint32_t val;     /* value node */
    uint32_t tail;    /* shortest bytes for this and the later properties:
                         keys, values and the commas between them */
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
    g->nodes[g->n_nodes] = (gnode_t){ kind, n, a, 0 };
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

/* integer: minimum / maximum / exclusiveMinimum / exclusiveMaximum (numbers,
 * or draft-4 booleans qualifying minimum / maximum), exact within int64. */
static uint32_t int_node(comp_t *c, const cJSON *s)
{
    const cJSON *mn, *mx, *xmn, *xmx;
    if (!num_kw(c, s, "minimum", &mn) || !num_kw(c, s, "maximum", &mx) ||
        !num_kw(c, s, "exclusiveMinimum", &xmn) || !num_kw(c, s, "exclusiveMaximum", &xmx))
        return 0;
    if ((mn && !cJSON_IsNumber(mn)) || (mx && !cJSON_IsNumber(mx))) {
        cfail_kw(c, PD_ERR_BAD_INPUT, mn && !cJSON_IsNumber(mn) ? "minimum" : "maximum",
                 "must be a number");
        return 0;
    }
    if (!mn && !mx && !cJSON_IsNumber(xmn) && !cJSON_IsNumber(xmx))
        return new_node(c, N_INT, 0, 0);
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
        cfail(c, PD_ERR_BAD_INPUT, "no integer satisfies its minimum/maximum");
        return 0;
    }
    return range_node(c, N_INT, lo, hi, 0);
}

/* string: minLength / maxLength (characters), format. */
static uint32_t str_node(comp_t *c, const cJSON *s)
{
    int64_t lo, hi;
    if (!count_range(c, s, "minLength", "maxLength", 4096, &lo, &hi))
        return 0;
    const cJSON *fm = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (fm != NULL) {
        uint32_t f = 0;
        for (uint32_t i = 1; cJSON_IsString(fm) && i < N_FORMATS && f == 0; i++)
            if (strcmp(fm->valuestring, formats[i].name) == 0)
                f = i;
        if (f == 0) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "format",
                     "unsupported 'format' (supported: date, time, date-time, uuid, email)");
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

static uint32_t comp_type(comp_t *c, const cJSON *s, const char *type, uint32_t depth,
                          bool root)
{
    if (strcmp(type, "string") == 0)
        return str_node(c, s);
    if (strcmp(type, "number") == 0) {
        static const char *const nb[] = { "minimum", "maximum", "exclusiveMinimum",
                                          "exclusiveMaximum" };
        for (int i = 0; i < 4; i++)
            if (cJSON_GetObjectItemCaseSensitive(s, nb[i]) != NULL) {
                cfail_kw(c, PD_ERR_BAD_INPUT, nb[i],
                         "bounds on a non-integer 'number' are not supported (only on "
                         "\"type\": \"integer\")");
                return 0;
            }
        return new_node(c, N_NUM, 0, 0);
    }
    if (strcmp(type, "integer") == 0)
        return int_node(c, s);
    if (strcmp(type, "boolean") == 0) {
        uint32_t ids[2] = { lit_node(c, "true", 4), lit_node(c, "false", 5) };
        return alts_node(c, ids, 2);
    }
    if (strcmp(type, "null") == 0)
        return lit_node(c, "null", 4);
    if (strcmp(type, "array") == 0) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, "items");
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
        if (ap && !cJSON_IsFalse(ap)) {
            cfail_kw(c, PD_ERR_BAD_INPUT, "additionalProperties",
                     "'additionalProperties' must be false (other values are not supported)");
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
        const cJSON *p;
        cJSON_ArrayForEach(p, props) {
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
            g->props[g->n_props + j] = (gprop_t){ keys[j], vals[j] };
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
        "minItems", "maxItems", "format", NULL,
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
                                          "minItems", "maxItems", "format", NULL };
    static const char *const alone[] = { "$ref", "const", "enum", "anyOf", NULL };
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
        uint32_t id = comp_schema(c, t, depth + 1, root);
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
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
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
            size_t o1 = path_push(c, "anyOf"), o2 = path_push(c, ix);
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
static uint32_t int_more(const grange_t *r, int64_t v, bool neg, uint32_t d)
{
    __int128 base = v, span = 1;
    for (uint32_t k = 0; d + k <= 19; k++) {
        __int128 a = neg ? base - (span - 1) : base, b = neg ? base : base + span - 1;
        if (a <= r->hi && b >= r->lo)
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

/* Shortest completions. Children are compiled before their parents, so one
 * pass in id order sees every child's value first. */
static void compute_min(eng_gram_t *g)
{
    g->max_min = 0;
    for (uint32_t i = 1; i < g->n_nodes; i++) {
        gnode_t *nd = &g->nodes[i];
        uint32_t m = 0;
        switch (nd->kind) {
        case N_STR:
            m = nd->n ? (uint32_t)sat_add(2, (uint32_t)g->ranges[nd->n - 1].lo) : 2;
            break;
        case N_INT:
            if (nd->n) {
                const grange_t *r = &g->ranges[nd->n - 1];
                m = r->lo <= 0 && r->hi >= 0 ? 1 : r->lo > 0 ? ndig((uint64_t)r->lo)
                                                             : 1 + ndig(uabs64(r->hi));
            } else {
                m = 1;
            }
            break;
        case N_NUM: case N_ANYVAL: m = 1; break;
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
        case N_OBJ: {
            uint32_t t = 0;
            for (uint32_t k = nd->n; k-- > 0;) {
                gprop_t *p = &g->props[nd->a + k];
                t = sat_add(sat_add(t, k + 1 < nd->n ? 1 : 0),
                            sat_add(g->nodes[p->key].min, g->nodes[p->val].min));
                p->tail = t;
            }
            m = sat_add(t, 2);
            break;
        }
        default: break;
        }
        nd->min = m;
        if (m > g->max_min)
            g->max_min = m;
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
    comp_t c = { g, NULL, err, err_len, PD_OK };
    new_node(&c, 0, 0, 0); /* node 0 is never used: 0 means "none" */
    if (kind == ENG_GRAM_JSON_OBJECT) {
        uint32_t base = any_block(&c);
        g->root = new_node(&c, N_ANYOBJ, 0, base);
    } else if (kind == ENG_GRAM_JSON_SCHEMA) {
        if (len > ENG_GRAM_MAX_SCHEMA_BYTES) {
            cfail(&c, PD_ERR_TOO_BIG, "schema larger than %u bytes", ENG_GRAM_MAX_SCHEMA_BYTES);
        } else {
            cJSON *doc = cJSON_ParseWithLength(schema, len);
            if (!doc) {
                cfail(&c, PD_ERR_BAD_INPUT, "schema is not valid JSON");
            } else {
                c.doc = doc;
                const cJSON *ty = cJSON_GetObjectItemCaseSensitive(doc, "type");
                if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "object") != 0)
                    cfail(&c, PD_ERR_BAD_INPUT, "the root schema must have \"type\": \"object\"");
                g->root = comp_schema(&c, doc, 0, true);
                cJSON_Delete(doc);
            }
        }
    } else {
        cfail(&c, PD_ERR_BAD_INPUT, "unknown grammar kind");
    }
    if (c.st != PD_OK) {
        eng_gram_free(g);
        return c.st;
    }
    compute_min(g);
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

static void set_add(set_t *out, const cfg_t *c)
{
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

static bool push(cfg_t *c, uint32_t node, uint8_t depth)
{
    if (c->n >= ENG_GRAM_MAX_STACK)
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
        push(&k, g->alts[nd->a + i], d);
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
    if (nd->kind == N_INT && nd->n) { /* bounded: every prefix can still land in r */
        const grange_t *r = &g->ranges[nd->n - 1];
        int64_t v = (int64_t)c->num;
        int64_t dg = b - '0';
        switch (f->phase) {
        case M_START:
            if (b == '-' && r->lo <= -1) {
                f->phase = M_MINUS;
            } else if (b == '0' && r->lo <= 0 && r->hi >= 0) {
                f->phase = M_ZERO;
            } else if (b >= '1' && b <= '9' && int_more(r, dg, false, 1) != UINT32_MAX) {
                f->phase = M_INT;
                f->aux = 1;
                c->num = (uint64_t)dg;
            } else {
                return FEED_DONE;
            }
            set_add(out, c);
            return FEED_DONE;
        case M_MINUS: /* no "-0" */
            if (b < '1' || b > '9' || int_more(r, -dg, true, 1) == UINT32_MAX)
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
                    int_more(r, (int64_t)nv, neg, f->aux + 1u) == UINT32_MAX)
                    return FEED_DONE;
                f->aux++;
                c->num = (uint64_t)(int64_t)nv;
                set_add(out, c);
                return FEED_DONE;
            }
            if (v < r->lo || v > r->hi)
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
        if (!push(c, nd->a, f->depth)) /* key: any_block()'s N_STR */
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
        if (!push(c, val, f->depth + 1))
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
        if (!push(c, item, d))
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
static feed_t feed_obj(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                       uint8_t b, set_t *out)
{
    switch (f->phase) {
    case O_OPEN:
        if (b != '{')
            return FEED_DONE;
        f->phase = O_NEXT;
        set_add(out, c);
        return FEED_DONE;
    case O_NEXT:
        if (f->aux == nd->n) {
            if (b != '}')
                return FEED_DONE;
            c->n--;
            set_add(out, c);
            return FEED_DONE;
        }
        if (f->aux > 0) {
            if (b != ',')
                return FEED_DONE;
            f->phase = O_KEY;
            set_add(out, c);
            return FEED_DONE;
        }
        /* fall through */
    case O_KEY:
        f->phase = O_VAL;
        if (!push(c, g->props[nd->a + f->aux].key, f->depth))
            return FEED_DONE;
        return FEED_NEXT;
    case O_VAL: {
        uint32_t v = g->props[nd->a + f->aux].val;
        f->phase = O_NEXT;
        f->aux++;
        if (!push(c, v, f->depth))
            return FEED_DONE;
        return FEED_NEXT;
    }
    }
    return FEED_DONE;
}

typedef feed_t (*feed_fn_t)(const eng_gram_t *g, cfg_t *c, frame_t *f, const gnode_t *nd,
                            uint8_t b, set_t *out);

static const feed_fn_t feed_by_kind[] = {
    [N_OBJ] = feed_obj, [N_ARR] = feed_arr, [N_STR] = feed_str, [N_NUM] = feed_num,
    [N_INT] = feed_num, [N_LIT] = feed_lit, [N_ANYOF] = feed_anyof, [N_ANYVAL] = feed_arr,
    [N_ANYOBJ] = feed_anyobj, [N_FMT] = feed_fmt,
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
        if (nd->kind == N_INT && nd->n) {
            const grange_t *r = &g->ranges[nd->n - 1];
            switch (f->phase) {
            case M_START: return nd->min;
            case M_MINUS: return ndig(uabs64(r->hi < -1 ? r->hi : -1));
            case M_INT: return int_more(r, (int64_t)num, (int64_t)num < 0, f->aux);
            default: return 0;
            }
        }
        return f->phase == M_ZERO || f->phase == M_INT || f->phase == M_FRAC ||
               f->phase == M_EXPDIG ? 0 : 1;
    case N_ANYOF:
        return nd->min;
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
        switch (f->phase) {
        case O_OPEN: return nd->min;
        case O_NEXT:
            if (i >= nd->n)
                return 1;
            return sat_add(g->props[nd->a + i].tail, i > 0 ? 2 : 1);
        case O_KEY:
            return sat_add(g->props[nd->a + i].tail, 1);
        case O_VAL: {
            /* the key is done: this value, the later properties, '}' */
            const gprop_t *p = &g->props[nd->a + i];
            return sat_add(p->tail - g->nodes[p->key].min, 1);
        }
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

bool eng_gram_complete(const eng_gram_state_t *s)
{
    for (uint32_t i = 0; i < s->cur.n; i++)
        if (s->cur.c[i].n == 0)
            return true;
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
