/* gram_schema.c - the JSON-Schema front end: a schema (cJSON) into rule-graph
 * nodes; keyword bounds, formats, $ref, oneOf disjointness. See gram_int.h. */
#include "gram_int.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A keyword that must be a number; false (failed) if present and not. */
static bool num_kw(comp_t *c, const cJSON *s, const char *kw, const cJSON **out)
{
    *out = cJSON_GetObjectItemCaseSensitive(s, kw);
    if (*out != NULL && !cJSON_IsNumber(*out) && !cJSON_IsBool(*out)) {
        gram_cfail_kw(c, PD_ERR_BAD_INPUT, kw, "must be a number");
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
        gram_cfail_kw(c, PD_ERR_BAD_INPUT, kw, "must be a non-negative integer");
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
        gram_cfail_kw(c, PD_ERR_BAD_INPUT, kmin, why);
        return false;
    }
    if (*lo > cap) {
        char why[64];
        snprintf(why, sizeof(why), "%s above %lld is not supported", kmin, (long long)cap);
        gram_cfail_kw(c, PD_ERR_TOO_BIG, kmin, why);
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
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, "multipleOf",
                          "'multipleOf' is supported on \"type\": \"integer\" only");
            return 0;
        }
        if (!(d > 0)) {
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, "multipleOf", "must be a number above 0");
            return 0;
        }
        if (floor(d) != d || d >= 9.2e18) {
            /* a fractional multipleOf: every integer is a multiple of 1/k */
            if (floor(1.0 / d) != 1.0 / d) {
                gram_cfail_kw(c, PD_ERR_BAD_INPUT, "multipleOf", "an integer 'multipleOf' must be a "
                              "whole number (or 1/k) below 2^63");
                return 0;
            }
        } else {
            mult = (int64_t)d;
        }
    }
    (void)mult;
    if ((mn && !cJSON_IsNumber(mn)) || (mx && !cJSON_IsNumber(mx))) {
        gram_cfail_kw(c, PD_ERR_BAD_INPUT, mn && !cJSON_IsNumber(mn) ? "minimum" : "maximum",
                      "must be a number");
        return 0;
    }
    if (!mn && !mx && !cJSON_IsNumber(xmn) && !cJSON_IsNumber(xmx) && mult == 1)
        return gram_new_node(c, kind, 0, 0);
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
        gram_cfail(c, PD_ERR_BAD_INPUT, kind == N_NUM ? "bounds on a 'number' that hold no integer "
                   "are not supported (the integer part is bounded)"
                                                      : "no integer satisfies its minimum/maximum");
        return 0;
    }
    if (mult > 1) {
        if (!gram_has_mult(lo, hi, mult)) {
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, "multipleOf", "no multiple lies within the bounds");
            return 0;
        }
        uint32_t id = gram_range_node(c, kind, lo, hi, 0);
        uint32_t x = gram_range_add(c, mult, 0);
        if (x == 0)
            return 0;
        c->g->nodes[id].x = x;
        return id;
    }
    return gram_range_node(c, kind, lo, hi, 0);
}

/* string: minLength / maxLength (characters), format. */
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
    uint32_t ids[3] = { gram_lit_node(c, "\"", 1), body, 0 };
    ids[2] = gram_lit_node(c, "\"", 1);
    return gram_seq_node(c, ids, 3);
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
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, "pattern", "'pattern' must be a string");
            return 0;
        }
        const char *other = fm ? "format" : lo > 0 ? "minLength" : hi < INT64_MAX ? "maxLength"
                                                                                  : NULL;
        if (other) {
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, other, "'pattern' together with 'format', "
                          "'minLength' or 'maxLength' is not supported (put the lengths in the "
                          "pattern)");
            return 0;
        }
        size_t o = gram_path_push(c, "pattern");
        uint32_t body = gram_comp_regex(c, pat->valuestring, strlen(pat->valuestring), true, true,
                                        "pattern");
        gram_path_pop(c, o);
        return quoted(c, body);
    }
    for (size_t i = 0; cJSON_IsString(fm) && i < sizeof(re_formats) / sizeof(re_formats[0]); i++)
        if (strcmp(fm->valuestring, re_formats[i].name) == 0) {
            if (lo > 0 || hi < INT64_MAX) {
                gram_cfail_kw(c, PD_ERR_BAD_INPUT, lo > 0 ? "minLength" : "maxLength",
                              "minLength/maxLength with this 'format' are not supported");
                return 0;
            }
            return quoted(c, gram_comp_regex(c, re_formats[i].re, strlen(re_formats[i].re), false,
                                             true, "format"));
        }
    if (fm != NULL) {
        uint32_t f = 0;
        for (uint32_t i = 1; cJSON_IsString(fm) && i < N_FORMATS && f == 0; i++)
            if (strcmp(fm->valuestring, gram_formats[i].name) == 0)
                f = i;
        if (f == 0) {
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, "format",
                          "unsupported 'format' (supported: date, time, date-time, uuid, email, "
                          "hostname, ipv4, ipv6, uri, duration)");
            return 0;
        }
        if (lo > 0 || hi < INT64_MAX) {
            int64_t len = gram_formats[f].tpl ? (int64_t)strlen(gram_formats[f].tpl) : -1;
            if (len < 0 || len < lo || len > hi) {
                gram_cfail_kw(c, PD_ERR_BAD_INPUT, lo > 0 ? "minLength" : "maxLength",
                              len < 0 ? "minLength/maxLength with format 'email' are not supported"
                                      : "no string of this format has a length in "
                                        "[minLength, maxLength]");
                return 0;
            }
        }
        return gram_new_node(c, N_FMT, f, 0);
    }
    if (lo == 0 && hi == INT64_MAX)
        return gram_new_node(c, N_STR, 0, 0);
    return gram_range_node(c, N_STR, lo, hi, 0);
}

/* The literal JSON text of a value (enum / const entries). */
static uint32_t value_lit(comp_t *c, const cJSON *v)
{
    char *t = cJSON_PrintUnformatted(v);
    if (!t) {
        gram_cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    uint32_t id = gram_lit_node(c, t, strlen(t));
    cJSON_free(t);
    return id;
}

/* Free JSON: STR, NUM, true, false, null, then the N_ANYVAL whose `a` is
 * the block's base (N_ANYOBJ nodes point at the same block; their values
 * are base + 5). Returns base. */
uint32_t gram_any_block(comp_t *c)
{
    uint32_t base = gram_new_node(c, N_STR, 0, 0);
    gram_new_node(c, N_NUM, 0, 0);
    gram_lit_node(c, "true", 4);
    gram_lit_node(c, "false", 5);
    gram_lit_node(c, "null", 4);
    gram_new_node(c, N_ANYVAL, 0, base);
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
    gram_cfail(c, PD_ERR_BAD_INPUT, "'$ref' \"%.64s\" does not name an entry of $defs", ref);
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
        uint32_t ids[2] = { gram_lit_node(c, "true", 4), gram_lit_node(c, "false", 5) };
        return gram_alts_node(c, ids, 2);
    }
    if (strcmp(type, "null") == 0)
        return gram_lit_node(c, "null", 4);
    if (strcmp(type, "array") == 0) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, "items");
        const cJSON *pi = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
        if (pi != NULL) {
            /* a tuple: every prefix item, in order, and nothing after (valid
             * whatever 'items' says) */
            int n = cJSON_GetArraySize(pi);
            int64_t lo, hi;
            if (!cJSON_IsArray(pi) || n > 64) {
                gram_cfail_kw(c, PD_ERR_BAD_INPUT, "prefixItems", "'prefixItems' must be an array "
                              "of at most 64 schemas");
                return 0;
            }
            if (!count_range(c, s, "minItems", "maxItems", 1024, &lo, &hi))
                return 0;
            if (lo > n || hi < n) {
                gram_cfail_kw(c, PD_ERR_BAD_INPUT, lo > n ? "minItems" : "maxItems",
                              "'prefixItems' is emitted whole: minItems/maxItems must allow "
                              "exactly its length");
                return 0;
            }
            if (it != NULL && !cJSON_IsBool(it)) {
                size_t o = gram_path_push(c, "items");
                gram_comp_schema(c, it, depth + 1, false); /* checked, never used */
                gram_path_pop(c, o);
            }
            uint32_t ids[2 * 64 + 1], k = 0, i = 0;
            ids[k++] = gram_lit_node(c, "[", 1);
            const cJSON *e;
            cJSON_ArrayForEach(e, pi) {
                char ix[16];
                snprintf(ix, sizeof(ix), "%u", i);
                if (i++ > 0)
                    ids[k++] = gram_lit_node(c, ",", 1);
                size_t o1 = gram_path_push(c, "prefixItems"), o2 = gram_path_push(c, ix);
                ids[k++] = gram_comp_schema(c, e, depth + 1, false);
                gram_path_pop(c, o2);
                gram_path_pop(c, o1);
            }
            ids[k++] = gram_lit_node(c, "]", 1);
            return gram_seq_node(c, ids, k);
        }
        if (cJSON_IsBool(it)) {
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, "items", "a boolean 'items' needs 'prefixItems'");
            return 0;
        }
        size_t o = gram_path_push(c, "items");
        uint32_t item = it ? gram_comp_schema(c, it, depth + 1, false) : gram_any_block(c) + 5;
        gram_path_pop(c, o);
        int64_t lo, hi;
        if (!count_range(c, s, "minItems", "maxItems", 1024, &lo, &hi))
            return 0;
        if (hi >= 65535)
            hi = INT64_MAX; /* the item count is kept in 16 bits */
        if (lo == 0 && hi == INT64_MAX)
            return gram_new_node(c, N_ARR, 0, item);
        return gram_range_node(c, N_ARR, lo, hi, item);
    }
    if (strcmp(type, "object") == 0) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        if (props && !cJSON_IsObject(props)) {
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, "properties", "'properties' must be an object");
            return 0;
        }
        int64_t plo, phi;
        if (!count_range(c, s, "minProperties", "maxProperties", 256, &plo, &phi))
            return 0;
        if (ap && !cJSON_IsBool(ap) && !cJSON_IsObject(ap)) {
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, "additionalProperties",
                          "'additionalProperties' must be a boolean or a schema");
            return 0;
        }
        uint32_t apv = 0; /* the schema of additional properties */
        if (ap && cJSON_IsObject(ap)) {
            size_t o = gram_path_push(c, "additionalProperties");
            apv = gram_comp_schema(c, ap, depth + 1, false);
            gram_path_pop(c, o);
            if (c->st != PD_OK)
                return 0;
        }
        if (apv && cJSON_GetArraySize(props) == 0) {
            /* a map: {"k":v,...} with any string keys (as z.record) */
            if (plo > 1 || phi < INT64_MAX) {
                gram_cfail_kw(c, PD_ERR_BAD_INPUT, plo > 1 ? "minProperties" : "maxProperties",
                              "minProperties above 1 / maxProperties on a map are not supported "
                              "(keys could repeat)");
                return 0;
            }
            uint32_t key = gram_new_node(c, N_STR, 0, 0);
            uint32_t e1[3] = { key, gram_lit_node(c, ":", 1), apv };
            uint32_t kv = gram_seq_node(c, e1, 3);
            uint32_t e2[2] = { gram_lit_node(c, ",", 1), kv };
            uint32_t more = gram_rep_node(c, gram_seq_node(c, e2, 2), 0, INT64_MAX);
            uint32_t e3[2] = { kv, more };
            uint32_t body = gram_rep_node(c, gram_seq_node(c, e3, 2), plo, 1);
            uint32_t e4[3] = { gram_lit_node(c, "{", 1), body, gram_lit_node(c, "}", 1) };
            return gram_seq_node(c, e4, 3);
        }
        if ((int64_t)cJSON_GetArraySize(props) < plo || (int64_t)cJSON_GetArraySize(props) > phi) {
            gram_cfail_kw(c, PD_ERR_BAD_INPUT,
                          (int64_t)cJSON_GetArraySize(props) < plo ? "minProperties" : "maxProperties",
                          "every declared property is emitted: minProperties/maxProperties must "
                          "allow their count");
            return 0;
        }
        if (req) {
            if (!cJSON_IsArray(req)) {
                gram_cfail_kw(c, PD_ERR_BAD_INPUT, "required", "'required' must be an array of property names");
                return 0;
            }
            const cJSON *r;
            cJSON_ArrayForEach(r, req) {
                if (!cJSON_IsString(r) ||
                    !cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) {
                    gram_cfail_kw(c, PD_ERR_BAD_INPUT, "required",
                                  "'required' names a property that 'properties' does not declare");
                    return 0;
                }
            }
        }
        (void)root;
        uint32_t np = (uint32_t)cJSON_GetArraySize(props);
        if (np > 256) {
            gram_cfail(c, PD_ERR_TOO_BIG, "an object may declare at most 256 properties");
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
                gram_cfail(c, PD_ERR_NO_MEMORY, "out of memory");
                return 0;
            }
            char *kt = cJSON_PrintUnformatted(ks);
            cJSON_Delete(ks);
            if (!kt) {
                gram_cfail(c, PD_ERR_NO_MEMORY, "out of memory");
                return 0;
            }
            size_t kl = strlen(kt);
            char buf[600];
            if (kl + 1 >= sizeof(buf)) {
                cJSON_free(kt);
                gram_cfail(c, PD_ERR_TOO_BIG, "property names are limited to 512 bytes");
                return 0;
            }
            memcpy(buf, kt, kl);
            buf[kl] = ':';
            cJSON_free(kt);
            keys[i] = gram_lit_node(c, buf, kl + 1);
            size_t o1 = gram_path_push(c, "properties"), o2 = gram_path_push(c, p->string);
            vals[i] = gram_comp_schema(c, p, depth + 1, false);
            gram_path_pop(c, o2);
            gram_path_pop(c, o1);
            i++;
            if (c->st != PD_OK)
                return 0;
        }
        eng_gram_t *g = c->g;
        if (!gram_grow((void **)&g->props, &g->cap_props, g->n_props + np, sizeof(gprop_t))) {
            gram_cfail(c, PD_ERR_NO_MEMORY, "out of memory");
            return 0;
        }
        for (uint32_t j = 0; j < np; j++)
            g->props[g->n_props + j] = (gprop_t){ keys[j], vals[j], 0, 0, opt[j] };
        uint32_t id = gram_new_node(c, N_OBJ, np, g->n_props);
        g->n_props += np;
        return id;
    }
    gram_cfail(c, PD_ERR_BAD_INPUT, "unsupported 'type' \"%.32s\"", type);
    return 0;
}

static uint32_t comp_schema1(comp_t *c, const cJSON *s, uint32_t depth, bool root);

/* "nullable": true (OpenAPI style, as the openai client's zod helper emits
 * it) = anyOf [the schema, null]. */
uint32_t gram_comp_schema(comp_t *c, const cJSON *s, uint32_t depth, bool root)
{
    uint32_t id = comp_schema1(c, s, depth, root);
    const cJSON *nl = cJSON_GetObjectItemCaseSensitive(s, "nullable");
    if (c->st != PD_OK || nl == NULL || cJSON_IsFalse(nl))
        return id;
    if (!cJSON_IsTrue(nl)) {
        gram_cfail_kw(c, PD_ERR_BAD_INPUT, "nullable", "'nullable' must be a boolean");
        return 0;
    }
    uint32_t ids[2] = { id, gram_lit_node(c, "null", 4) };
    return gram_alts_node(c, ids, 2);
}

static uint32_t comp_schema1(comp_t *c, const cJSON *s, uint32_t depth, bool root)
{
    if (c->st != PD_OK)
        return 0;
    if (depth > ENG_GRAM_MAX_DEPTH) {
        gram_cfail(c, PD_ERR_TOO_BIG,
                   "schema nesting (including $ref expansion) deeper than %u (recursive $ref?)",
                   ENG_GRAM_MAX_DEPTH);
        return 0;
    }
    if (!cJSON_IsObject(s)) {
        gram_cfail(c, PD_ERR_BAD_INPUT, "every schema must be a JSON object");
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
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, k->string, why);
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
                gram_cfail_kw(c, PD_ERR_BAD_INPUT, bounds[j], why);
                return 0;
            }
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) {
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, "$ref", "'$ref' must be a string");
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
            gram_cfail(c, PD_ERR_TOO_BIG, "more than 256 distinct '$ref' targets");
        } else if (id == 0) {
            id = gram_new_node(c, N_REF, 0, 0);
            if (c->st == PD_OK) {
                c->refs[c->n_refs].target = t;
                c->refs[c->n_refs++].ref = id;
                uint32_t body = gram_comp_schema(c, t, depth + 1, root);
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
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, "enum", "'enum' must be an array of 1 to 256 values");
            return 0;
        }
        uint32_t ids[256], i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, en)
            ids[i++] = value_lit(c, e);
        return gram_alts_node(c, ids, i);
    }
    /* allOf of one schema (zod and pydantic wrap a $ref that way to add a
     * description) is that schema; an intersection of several is not built */
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (all) {
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1) {
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, "allOf",
                          "'allOf' with more than one schema (an intersection) is not supported");
            return 0;
        }
        size_t o1 = gram_path_push(c, "allOf"), o2 = gram_path_push(c, "0");
        uint32_t id = gram_comp_schema(c, all->child, depth + 1, root);
        gram_path_pop(c, o2);
        gram_path_pop(c, o1);
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
            gram_cfail_kw(c, PD_ERR_BAD_INPUT, "oneOf", "'oneOf' must be an array of 1 to 64 schemas");
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
                    gram_cfail_kw(c, PD_ERR_BAD_INPUT, "oneOf", why);
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
            gram_cfail(c, PD_ERR_BAD_INPUT, "'anyOf' must be an array of 1 to %u schemas",
                       ENG_GRAM_MAX_ANYOF);
            return 0;
        }
        uint32_t ids[ENG_GRAM_MAX_ANYOF], i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, any) {
            char ix[16];
            snprintf(ix, sizeof(ix), "%u", i);
            size_t o1 = gram_path_push(c, any == one ? "oneOf" : "anyOf"), o2 = gram_path_push(c, ix);
            ids[i++] = gram_comp_schema(c, e, depth + 1, false);
            gram_path_pop(c, o2);
            gram_path_pop(c, o1);
        }
        return gram_alts_node(c, ids, i);
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(ty))
        return comp_type(c, s, ty->valuestring, depth, root);
    if (cJSON_IsArray(ty)) {
        int n = cJSON_GetArraySize(ty);
        if (n < 1 || n > 7) {
            gram_cfail(c, PD_ERR_BAD_INPUT, "'type' lists 1 to 7 type names");
            return 0;
        }
        uint32_t ids[7], i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, ty) {
            if (!cJSON_IsString(e)) {
                gram_cfail(c, PD_ERR_BAD_INPUT, "'type' entries must be strings");
                return 0;
            }
            ids[i++] = comp_type(c, s, e->valuestring, depth, false);
        }
        return gram_alts_node(c, ids, i);
    }
    gram_cfail(c, PD_ERR_BAD_INPUT, "a schema needs 'type', 'enum', 'const', 'anyOf' or '$ref'");
    return 0;
}
