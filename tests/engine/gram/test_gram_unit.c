/* test_gram.c - engine/gram: schema compiler refusals and caps, and random
 * constrained sampling whose every output must parse (cJSON) and validate
 * against the schema (an independent validator below, written against the
 * JSON Schema keywords, not against the grammar). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <regex.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng_gram.h"
#include "eng_sample.h"

/* ---- a synthetic vocabulary: 256 bytes + random pieces + one EOS -------- */

#define VOCAB 6000
#define EOS_ID (VOCAB - 1)
static char pieces[VOCAB][12];
static uint8_t plen[VOCAB];

static uint64_t rs = 88172645463325252ULL;
static uint32_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 16);
}

static size_t piece_fn(void *ctx, int32_t id, char *buf, size_t cap)
{
    (void)ctx;
    if (id < 0 || id >= VOCAB || plen[id] > cap)
        return 0;
    memcpy(buf, pieces[id], plen[id]);
    return plen[id];
}

static eng_gram_vocab_t *voc;

static int setup(void **state)
{
    static const char alpha[] = "abcxyz019-.eE+\"{}[],:\\ntrufalsn /u";
    for (int i = 0; i < VOCAB; i++) {
        if (i < 256) {
            pieces[i][0] = (char)i;
            plen[i] = 1;
        } else if (i == EOS_ID) {
            plen[i] = 0; /* control token */
        } else {
            int L = 1 + (int)(rnd() % 8), k = 0;
            while (k < L) {
                if (rnd() % 20 == 0 && k + 2 <= L) {
                    pieces[i][k++] = (char)0xc3;
                    pieces[i][k++] = (char)(0xa0 + rnd() % 16);
                } else {
                    pieces[i][k++] = alpha[rnd() % (sizeof(alpha) - 1)];
                }
            }
            plen[i] = (uint8_t)k;
        }
    }
    /* a few whole JSON words, as real vocabularies have */
    static const char *words[] = { "true", "false", "null", "\":\"", "\",\"", "{\"",
                                   "\"}", "\\u00e9", "[]", "12", "\"a\"" };
    for (size_t w = 0; w < sizeof(words) / sizeof(words[0]); w++) {
        strcpy(pieces[300 + w], words[w]);
        plen[300 + w] = (uint8_t)strlen(words[w]);
    }
    (void)state;
    return eng_gram_vocab_create(VOCAB, piece_fn, NULL, &voc) == PD_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    eng_gram_vocab_free(voc);
    return 0;
}

/* ---- independent validator ------------------------------------------------ */

static const cJSON *resolve(const cJSON *root, const char *ref)
{
    if (strcmp(ref, "#") == 0)
        return root;
    if (strncmp(ref, "#/$defs/", 8) == 0)
        return cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(root, "$defs"), ref + 8);
    if (strncmp(ref, "#/definitions/", 14) == 0)
        return cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(root, "definitions"), ref + 14);
    return NULL;
}

static bool type_ok(const cJSON *v, const char *t)
{
    if (!strcmp(t, "object"))
        return cJSON_IsObject(v);
    if (!strcmp(t, "array"))
        return cJSON_IsArray(v);
    if (!strcmp(t, "string"))
        return cJSON_IsString(v);
    if (!strcmp(t, "boolean"))
        return cJSON_IsBool(v);
    if (!strcmp(t, "null"))
        return cJSON_IsNull(v);
    if (!strcmp(t, "number"))
        return cJSON_IsNumber(v) && isfinite(v->valuedouble);
    if (!strcmp(t, "integer"))
        return cJSON_IsNumber(v) && isfinite(v->valuedouble) &&
               floor(v->valuedouble) == v->valuedouble;
    return false;
}

/* Code points of a valid UTF-8 string. */
static long u8len(const char *p)
{
    long n = 0;
    for (; *p; p++)
        n += ((unsigned char)*p & 0xc0) != 0x80;
    return n;
}

static bool digits(const char *p, int n)
{
    for (int i = 0; i < n; i++)
        if (p[i] < '0' || p[i] > '9')
            return false;
    return true;
}

/* The formats as RFC 3339 / RFC 4122 / RFC 5322 (dot-atom) define them. */
static bool date_ok(const char *p)
{
    static const int mdays[] = { 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    if (!digits(p, 4) || p[4] != '-' || !digits(p + 5, 2) || p[7] != '-' || !digits(p + 8, 2))
        return false;
    int y = atoi(p), m = atoi(p + 5), d = atoi(p + 8);
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m >= 1 && m <= 12 && d >= 1 && d <= (m == 2 && !leap ? 28 : mdays[m - 1]);
}

static bool time_ok(const char *p)
{
    if (!digits(p, 2) || p[2] != ':' || !digits(p + 3, 2) || p[5] != ':' || !digits(p + 6, 2))
        return false;
    if (atoi(p) > 23 || atoi(p + 3) > 59 || atoi(p + 6) > 60)
        return false;
    p += 8;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9')
            return false;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    return strcmp(p, "Z") == 0 || strcmp(p, "z") == 0 ||
           ((p[0] == '+' || p[0] == '-') && digits(p + 1, 2) && p[3] == ':' &&
            digits(p + 4, 2) && p[6] == '\0');
}

/* POSIX ERE full match (the test's patterns are written in the common
 * subset of ERE and ECMA-262, \\d spelled [0-9]). */
static bool ere_match(const char *re, const char *v, bool whole)
{
    char buf[1024];
    snprintf(buf, sizeof(buf), whole ? "^(%s)$" : "%s", re);
    regex_t rx;
    if (regcomp(&rx, buf, REG_EXTENDED | REG_NOSUB) != 0)
        fail_msg("test pattern does not compile: %s", buf);
    bool ok = regexec(&rx, v, 0, NULL, 0) == 0;
    regfree(&rx);
    return ok;
}

static bool label_ok(const char *p, size_t n)
{
    if (n == 0 || n > 63 || p[0] == '-' || p[n - 1] == '-')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)p[i]) && p[i] != '-')
            return false;
    return true;
}

static bool hostname_ok(const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n > 253)
        return false;
    for (const char *p = v;;) {
        const char *d = strchr(p, '.');
        size_t l = d ? (size_t)(d - p) : strlen(p);
        if (!label_ok(p, l))
            return false;
        if (!d)
            return true;
        p = d + 1;
    }
}

static bool format_ok(const char *f, const char *v)
{
    unsigned char a6[16];
    if (!strcmp(f, "ipv4"))
        return inet_pton(AF_INET, v, a6) == 1;
    if (!strcmp(f, "ipv6"))
        return inet_pton(AF_INET6, v, a6) == 1;
    if (!strcmp(f, "hostname"))
        return hostname_ok(v);
    if (!strcmp(f, "uri")) {
        const char *h = strncmp(v, "https://", 8) == 0 ? v + 8
                      : strncmp(v, "http://", 7) == 0 ? v + 7 : NULL;
        if (!h)
            return false;
        char host[300];
        size_t hl = strcspn(h, "/");
        if (hl >= sizeof(host))
            return false;
        memcpy(host, h, hl);
        host[hl] = '\0';
        return hostname_ok(host) && strspn(h + hl, "/abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ"
                                                   "RSTUVWXYZ0123456789._~-") == strlen(h + hl);
    }
    if (!strcmp(f, "duration")) /* ISO 8601 as ajv-formats checks it */
        return ere_match("P(([0-9]+Y)?([0-9]+M)?([0-9]+D)?(T([0-9]+H)?([0-9]+M)?([0-9]+S)?)?|"
                         "[0-9]+W)", v, true) && strcmp(v, "P") && v[strlen(v) - 1] != 'T';
    if (!strcmp(f, "date"))
        return strlen(v) == 10 && date_ok(v);
    if (!strcmp(f, "time"))
        return time_ok(v);
    if (!strcmp(f, "date-time"))
        return strlen(v) > 11 && date_ok(v) && (v[10] == 'T' || v[10] == 't') && time_ok(v + 11);
    if (!strcmp(f, "uuid")) {
        if (strlen(v) != 36)
            return false;
        for (int i = 0; i < 36; i++) {
            bool dash = i == 8 || i == 13 || i == 18 || i == 23;
            if (dash ? v[i] != '-' : !strchr("0123456789abcdefABCDEF", v[i]) || !v[i])
                return false;
        }
        return true;
    }
    if (!strcmp(f, "email")) {
        const char *at = strchr(v, '@');
        if (!at || at == v || strchr(at + 1, '@') || v[0] == '.' || at[-1] == '.' ||
            strstr(v, "..") || !strchr(at + 1, '.'))
            return false;
        for (const char *p = v; p < at; p++)
            if (!isalnum((unsigned char)*p) && !strchr("!#$%&'*+/=?^_`{|}~-.", *p))
                return false;
        const char *lab = at + 1;
        for (const char *p = at + 1;; p++) {
            if (*p == '.' || *p == '\0') {
                if (p == lab || lab[0] == '-' || p[-1] == '-')
                    return false;
                if (*p == '\0') { /* a tld of 2+ letters (zod's .email()) */
                    for (const char *q = lab; q < p; q++)
                        if (!isalpha((unsigned char)*q))
                            return false;
                    return p - lab >= 2;
                }
                lab = p + 1;
            } else if (!isalnum((unsigned char)*p) && *p != '-') {
                return false;
            }
        }
    }
    return false;
}

static double numkw(const cJSON *s, const char *k, double def)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, k);
    return cJSON_IsNumber(x) ? x->valuedouble : def;
}

static bool valid(const cJSON *v, const cJSON *s, const cJSON *root)
{
    const cJSON *x;
    if (cJSON_IsNumber(v) && numkw(s, "multipleOf", 1) > 1 &&
        fmod(v->valuedouble, numkw(s, "multipleOf", 1)) != 0)
        return false;
    if (cJSON_IsString(v) && (x = cJSON_GetObjectItemCaseSensitive(s, "pattern")) &&
        !ere_match(x->valuestring, v->valuestring, false))
        return false;
    if (cJSON_IsObject(v) && (cJSON_GetArraySize(v) < numkw(s, "minProperties", 0) ||
                              cJSON_GetArraySize(v) > numkw(s, "maxProperties", INFINITY)))
        return false;
    if (cJSON_IsNumber(v) && (v->valuedouble < numkw(s, "minimum", -INFINITY) ||
                              v->valuedouble > numkw(s, "maximum", INFINITY) ||
                              v->valuedouble <= numkw(s, "exclusiveMinimum", -INFINITY) ||
                              v->valuedouble >= numkw(s, "exclusiveMaximum", INFINITY)))
        return false;
    if (cJSON_IsString(v)) {
        long n = u8len(v->valuestring);
        if (n < numkw(s, "minLength", 0) || n > numkw(s, "maxLength", INFINITY))
            return false;
        if ((x = cJSON_GetObjectItemCaseSensitive(s, "format")) &&
            !format_ok(x->valuestring, v->valuestring))
            return false;
    }
    if (cJSON_IsArray(v) && (cJSON_GetArraySize(v) < numkw(s, "minItems", 0) ||
                             cJSON_GetArraySize(v) > numkw(s, "maxItems", INFINITY)))
        return false;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable")) && cJSON_IsNull(v))
        return true;
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "$ref")))
        return valid(v, resolve(root, x->valuestring), root);
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "const")) && !cJSON_Compare(v, x, true))
        return false;
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        bool any = false;
        const cJSON *e;
        cJSON_ArrayForEach(e, x) any |= cJSON_Compare(v, e, true);
        if (!any)
            return false;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "anyOf"))) {
        bool any = false;
        const cJSON *e;
        cJSON_ArrayForEach(e, x) any |= valid(v, e, root);
        if (!any)
            return false;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "oneOf"))) {
        int n = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, x) n += valid(v, e, root);
        if (n != 1)
            return false;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
        const cJSON *e;
        cJSON_ArrayForEach(e, x) if (!valid(v, e, root))
            return false;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "type"))) {
        bool any = false;
        if (cJSON_IsString(x))
            any = type_ok(v, x->valuestring);
        const cJSON *e;
        if (cJSON_IsArray(x))
            cJSON_ArrayForEach(e, x) any |= type_ok(v, e->valuestring);
        if (!any)
            return false;
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *e;
        if ((x = cJSON_GetObjectItemCaseSensitive(s, "required")))
            cJSON_ArrayForEach(e, x) if (!cJSON_GetObjectItemCaseSensitive(v, e->valuestring))
                return false;
        cJSON_ArrayForEach(e, v) {
            const cJSON *ps = cJSON_GetObjectItemCaseSensitive(props, e->string);
            if (!ps) {
                const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
                if (cJSON_IsFalse(ap) || (cJSON_IsObject(ap) && !valid(e, ap, root)))
                    return false;
                continue;
            }
            if (!valid(e, ps, root))
                return false;
        }
    }
    const cJSON *pi = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    int npi = pi ? cJSON_GetArraySize(pi) : 0;
    if (cJSON_IsArray(v) && pi) {
        for (int i = 0; i < npi && i < cJSON_GetArraySize(v); i++)
            if (!valid(cJSON_GetArrayItem(v, i), cJSON_GetArrayItem(pi, i), root))
                return false;
    }
    if (cJSON_IsArray(v) && (x = cJSON_GetObjectItemCaseSensitive(s, "items"))) {
        for (int i = npi; i < cJSON_GetArraySize(v); i++)
            if (cJSON_IsFalse(x) || (cJSON_IsObject(x) && !valid(cJSON_GetArrayItem(v, i), x, root)))
                return false;
    }
    return true;
}

/* ---- constrained random sampling ------------------------------------------ */

/* Sample until EOS with random logits (random weights); returns the text. */
/* max_tokens: 0 = unlimited, else EOS must come within that many tokens
 * (the mask's budget closes the JSON in time). */
static char *sample_one(eng_gram_kind_t kind, const char *schema, uint64_t seed,
                        uint32_t max_tokens, uint32_t *n_tok)
{
    eng_gram_t *g;
    char err[256];
    assert_int_equal(eng_gram_compile(kind, schema, schema ? strlen(schema) : 0, &g, err,
                                      sizeof(err)), PD_OK);
    eng_gram_state_t *st;
    assert_int_equal(eng_gram_state_create(g, &st), PD_OK);
    eng_sample_params_t p;
    eng_sample_params_default(&p);
    p.temperature = 1.0f;
    p.seed = seed;
    eng_sampler_t smp;
    eng_sampler_init(&smp, &p);
    eng_sample_scratch_t scr;
    assert_int_equal(eng_sample_scratch_create(&scr, VOCAB), PD_OK);
    static float lg[VOCAB];
    static uint8_t scratch[VOCAB];
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    int32_t eos = EOS_ID;
    uint32_t steps = 0;
    static int32_t ids[20000];
    static float lg2[VOCAB];
    for (;; steps++) {
        assert_true(steps < 20000);
        if (max_tokens && steps >= max_tokens)
            fail_msg("no EOS within max_tokens %u: %.*s", max_tokens, (int)n, out);
        uint32_t budget = max_tokens ? max_tokens - steps : UINT32_MAX;
        for (int i = 0; i < VOCAB; i++)
            lg[i] = (float)(eng_rng_next(&smp.rng) % 4000) / 1000.0f;
        if (steps == 1 || steps % 23 == 0) {
            /* a decode daemon's view: a fresh state fed the tokens so far
             * (prefill's token 0, or everything streamed before a retry)
             * masks exactly as the state that generated them */
            eng_gram_state_t *rs2;
            assert_int_equal(eng_gram_state_create(g, &rs2), PD_OK);
            for (uint32_t k = 0; k < steps; k++)
                assert_true(eng_gram_feed_token(rs2, voc, ids[k]));
            memcpy(lg2, lg, sizeof(lg2));
            assert_true(eng_gram_mask(rs2, voc, &eos, 1, lg2, VOCAB, scratch, budget));
            assert_true(eng_gram_mask(st, voc, &eos, 1, lg, VOCAB, scratch, budget));
            assert_memory_equal(lg, lg2, sizeof(lg2));
            eng_gram_state_free(rs2);
        } else {
            assert_true(eng_gram_mask(st, voc, &eos, 1, lg, VOCAB, scratch, budget));
        }
        int32_t t = eng_sample_next(&smp, lg, VOCAB, &scr, NULL);
        if (t == EOS_ID) {
            assert_true(eng_gram_complete(st));
            break;
        }
        assert_true(eng_gram_feed_token(st, voc, t));
        ids[steps] = t;
        assert_true(n + plen[t] < cap);
        memcpy(out + n, pieces[t], plen[t]);
        n += plen[t];
    }
    out[n] = '\0';
    *n_tok = steps;
    eng_sample_scratch_destroy(&scr);
    eng_gram_state_free(st);
    eng_gram_free(g);
    return out;
}

static void check_schema_budget(const char *schema, int runs, uint32_t max_tokens)
{
    cJSON *sch = cJSON_Parse(schema);
    assert_non_null(sch);
    for (int r = 0; r < runs; r++) {
        uint32_t nt;
        char *txt = sample_one(ENG_GRAM_JSON_SCHEMA, schema, (uint64_t)r * 7919 + 1,
                               max_tokens, &nt);
        cJSON *v = cJSON_Parse(txt);
        if (!v || !valid(v, sch, sch))
            fail_msg("run %d: output does not %s: %s", r, v ? "validate" : "parse", txt);
        cJSON_Delete(v);
        free(txt);
    }
    cJSON_Delete(sch);
}

static void check_schema(const char *schema, int runs)
{
    check_schema_budget(schema, runs, 0);
    check_schema_budget(schema, runs, 400); /* the budget closes it in time */
}

static void test_schema_simple(void **state)
{
    (void)state;
    check_schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                 "\"age\":{\"type\":\"integer\"},\"score\":{\"type\":\"number\"},"
                 "\"ok\":{\"type\":\"boolean\"},\"nothing\":{\"type\":\"null\"}},"
                 "\"required\":[\"name\",\"age\",\"score\",\"ok\",\"nothing\"],"
                 "\"additionalProperties\":false}", 60);
}

static void test_schema_nested(void **state)
{
    (void)state;
    check_schema("{\"type\":\"object\",\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":"
                 "{\"x\":{\"type\":\"number\"},\"y\":{\"type\":\"number\"}},\"required\":[\"x\",\"y\"],"
                 "\"additionalProperties\":false}},\"properties\":{"
                 "\"kind\":{\"enum\":[\"circle\",\"line\",\"q\\\"uote\",3,null]},"
                 "\"pts\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/pt\"}},"
                 "\"label\":{\"type\":[\"string\",\"null\"]},"
                 "\"c\":{\"const\":\"fixed\"},"
                 "\"u\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                 "\"required\":[\"a\"],\"additionalProperties\":false},"
                 "{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"boolean\"}},"
                 "\"required\":[\"b\"],\"additionalProperties\":false},"
                 "{\"type\":\"array\",\"items\":{\"type\":\"string\"}}]},"
                 "\"free\":{\"type\":\"array\"},\"nn\":{\"type\":\"integer\",\"nullable\":true},\"e\":{\"type\":\"object\",\"properties\":{},"
                 "\"additionalProperties\":false}},"
                 "\"required\":[\"kind\",\"pts\",\"label\",\"c\",\"u\",\"free\",\"nn\",\"e\"],"
                 "\"additionalProperties\":false}", 60);
}

static void test_json_object(void **state)
{
    (void)state;
    for (int r = 0; r < 60; r++) {
        uint32_t nt;
        uint32_t mt = r % 2 ? 0 : 40 + (uint32_t)r * 3;
        char *txt = sample_one(ENG_GRAM_JSON_OBJECT, NULL, (uint64_t)r + 100, mt, &nt);
        cJSON *v = cJSON_Parse(txt);
        if (!v || !cJSON_IsObject(v))
            fail_msg("run %d: not a JSON object: %s", r, txt);
        cJSON_Delete(v);
        free(txt);
    }
}

static void test_feed_rejects(void **state)
{
    (void)state;
    const char *sch = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                      "\"required\":[\"a\"],\"additionalProperties\":false}";
    eng_gram_t *g;
    assert_int_equal(eng_gram_compile(ENG_GRAM_JSON_SCHEMA, sch, strlen(sch), &g, NULL, 0), PD_OK);
    eng_gram_state_t *st;
    assert_int_equal(eng_gram_state_create(g, &st), PD_OK);
    assert_false(eng_gram_feed(st, (const uint8_t *)"{\"b\"", 4));
    assert_false(eng_gram_feed(st, (const uint8_t *)" {", 2));
    assert_true(eng_gram_feed(st, (const uint8_t *)"{\"a\":-0", 7));
    assert_false(eng_gram_feed(st, (const uint8_t *)"1", 1));   /* no leading zeros */
    assert_false(eng_gram_feed(st, (const uint8_t *)".5", 2));  /* integer */
    assert_false(eng_gram_complete(st));
    assert_true(eng_gram_feed(st, (const uint8_t *)"}", 1));
    assert_true(eng_gram_complete(st));
    assert_false(eng_gram_feed(st, (const uint8_t *)" ", 1));
    eng_gram_state_free(st);
    eng_gram_free(g);
}

static void expect_refused(const char *schema, pd_status_t want, const char *needle)
{
    eng_gram_t *g = NULL;
    char err[256];
    pd_status_t s = eng_gram_compile(ENG_GRAM_JSON_SCHEMA, schema, strlen(schema), &g, err,
                                     sizeof(err));
    if (s != want || strstr(err, needle) == NULL)
        fail_msg("%s: status %d, err '%s' (want '%s')", schema, (int)s, err, needle);
    assert_null(g);
}

static void test_refusals(void **state)
{
    (void)state;
    static const char *const kws[] = { "pattern", "oneOf",
                                       "allOf", "not", "patternProperties", "uniqueItems",
                                       "if", NULL };
    for (int i = 0; kws[i]; i++) {
        char s[256];
        snprintf(s, sizeof(s), "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                 "\"string\",\"%s\":1}},\"additionalProperties\":false}", kws[i]);
        expect_refused(s, PD_ERR_BAD_INPUT, kws[i]);
    }
    expect_refused("{\"type\":\"array\"}", PD_ERR_BAD_INPUT, "root");
    expect_refused("[1]", PD_ERR_BAD_INPUT, "root");
    expect_refused("{\"type\":", PD_ERR_BAD_INPUT, "not valid JSON");
    expect_refused("{\"type\":\"object\",\"additionalProperties\":3}", PD_ERR_BAD_INPUT,
                   "additionalProperties");
    expect_refused("{\"type\":\"object\",\"properties\":{},\"required\":[\"x\"]}",
                   PD_ERR_BAD_INPUT, "required");
    expect_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/n\"}},"
                   "\"required\":[\"a\"],\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":"
                   "{\"k\":{\"$ref\":\"#/$defs/n\"}},\"required\":[\"k\"]}}}", PD_ERR_BAD_INPUT,
                   "never ends");
    expect_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/zz\"}}}",
                   PD_ERR_BAD_INPUT, "$ref");
    expect_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"date\"}}}",
                   PD_ERR_BAD_INPUT, "date");
    /* size cap */
    size_t big = ENG_GRAM_MAX_SCHEMA_BYTES + 10;
    char *s = malloc(big + 1);
    memset(s, ' ', big);
    memcpy(s, "{\"type\":\"object\"}", 17);
    s[big] = '\0';
    expect_refused(s, PD_ERR_TOO_BIG, "larger");
    free(s);
    /* node cap: a long pattern (one node per character) */
    char *w = malloc(16000);
    size_t n = (size_t)sprintf(w, "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":"
                               "\"string\",\"pattern\":\"");
    for (int i = 0; i < 15000; i++)
        w[n++] = 'a' + i % 26;
    sprintf(w + n, "\"}}}");
    expect_refused(w, PD_ERR_TOO_BIG, "grammar nodes");
    free(w);
}

/* Annotations are accepted and ignored (JSON Schema: they do not
 * constrain); a refused keyword names its JSON pointer, through
 * properties, items, anyOf and $ref. */
static void test_annotations_and_pointers(void **state)
{
    (void)state;
    check_schema("{\"type\":\"object\",\"$schema\":\"http://json-schema.org/draft-07/schema#\","
                 "\"$id\":\"urn:x\",\"title\":\"T\",\"x-vendor\":{\"any\":[1]},\"properties\":{"
                 "\"a\":{\"type\":\"string\",\"default\":\"hi\",\"description\":\"d\",\"examples\":[\"e\"],"
                 "\"$comment\":\"c\",\"deprecated\":true,\"readOnly\":false,\"writeOnly\":false,"
                 "\"$anchor\":\"A\",\"x-order\":1},\"b\":{\"type\":\"boolean\",\"default\":{\"k\":[]}}},"
                 "\"required\":[\"a\",\"b\"],\"additionalProperties\":false}", 10);
    expect_refused("{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"number\","
                   "\"multipleOf\":2}}}", PD_ERR_BAD_INPUT,
                   "integer\" only at /properties/age/multipleOf");
    expect_refused("{\"type\":\"object\",\"properties\":{\"l\":{\"type\":\"array\",\"items\":"
                   "{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#/$defs/p\"}]}}},\"$defs\":{\"p\":"
                   "{\"type\":\"object\",\"properties\":{\"a/b~\":{\"not\":{}}}}}}",
                   PD_ERR_BAD_INPUT, "'not' at /$defs/p/properties/a~1b~0/not");
    expect_refused("{\"type\":\"object\",\"properties\":{\"u\":{\"anyOf\":[{\"type\":\"null\"},"
                   "{\"type\":\"string\",\"pattern\":\"(?=x)\"}]}}}", PD_ERR_BAD_INPUT,
                   "at /properties/u/anyOf/1/pattern");
    expect_refused("{\"type\":\"object\",\"additionalProperties\":{\"oneOf\":[]}}",
                   PD_ERR_BAD_INPUT, "at /additionalProperties/oneOf");
}

/* Integer bounds (exact, as zod's .int() emits them: +-(2^53 - 1)),
 * string lengths, array sizes and formats: random sampling validates. */
static void test_bounds_and_formats(void **state)
{
    (void)state;
    check_schema("{\"type\":\"object\",\"properties\":{"
                 "\"i\":{\"type\":\"integer\",\"minimum\":-9007199254740991,"
                 "\"maximum\":9007199254740991},"
                 "\"small\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":5},"
                 "\"pos\":{\"type\":\"integer\",\"exclusiveMinimum\":0,\"maximum\":1000},"
                 "\"mid\":{\"type\":\"integer\",\"minimum\":100,\"exclusiveMaximum\":201},"
                 "\"neg\":{\"type\":[\"integer\",\"null\"],\"minimum\":-300,\"maximum\":-250},"
                 "\"s\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":5},"
                 "\"ne\":{\"type\":\"string\",\"minLength\":1},"
                 "\"arr\":{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":0,"
                 "\"maximum\":9},\"minItems\":2,\"maxItems\":3},"
                 "\"d\":{\"type\":\"string\",\"format\":\"date\"},"
                 "\"t\":{\"type\":\"string\",\"format\":\"time\"},"
                 "\"dt\":{\"type\":\"string\",\"format\":\"date-time\"},"
                 "\"u\":{\"type\":\"string\",\"format\":\"uuid\"},"
                 "\"e\":{\"type\":\"string\",\"format\":\"email\"}},"
                 "\"required\":[\"i\",\"small\",\"pos\",\"mid\",\"neg\",\"s\",\"ne\",\"arr\","
                 "\"d\",\"t\",\"dt\",\"u\",\"e\"],\"additionalProperties\":false}", 6);
    /* exactly at the edges of +-(2^53 - 1), and 64-bit ones */
    static const struct { const char *sch, *in; bool ok; } ex[] = {
        { "\"minimum\":-9007199254740991,\"maximum\":9007199254740991", "9007199254740991", true },
        { "\"minimum\":-9007199254740991,\"maximum\":9007199254740991", "9007199254740992", false },
        { "\"minimum\":-9007199254740991,\"maximum\":9007199254740991", "-9007199254740991", true },
        { "\"minimum\":-9007199254740991,\"maximum\":9007199254740991", "-9007199254740992", false },
        { "\"minimum\":-9007199254740991,\"maximum\":9007199254740991", "90071992547409910", false },
        { "\"minimum\":0", "9223372036854775807", true },
        { "\"minimum\":0", "9223372036854775808", false },
        { "\"maximum\":0", "-9223372036854775808", true },
        { "\"minimum\":10,\"maximum\":20", "9", false },
        { "\"minimum\":10,\"maximum\":20", "21", false },
        { "\"minimum\":-1,\"maximum\":1", "-0", false },
        { "\"exclusiveMinimum\":1.5,\"maximum\":3", "2", true },
        { "\"minimum\":2,\"exclusiveMinimum\":true", "2", false },
    };
    for (size_t i = 0; i < sizeof(ex) / sizeof(ex[0]); i++) {
        char sch[256], in[64];
        snprintf(sch, sizeof(sch), "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                 "\"integer\",%s}},\"required\":[\"a\"]}", ex[i].sch);
        snprintf(in, sizeof(in), "{\"a\":%s}", ex[i].in);
        eng_gram_t *g;
        char err[256];
        if (eng_gram_compile(ENG_GRAM_JSON_SCHEMA, sch, strlen(sch), &g, err, sizeof(err)) != PD_OK)
            fail_msg("%s: %s", sch, err);
        eng_gram_state_t *st;
        assert_int_equal(eng_gram_state_create(g, &st), PD_OK);
        bool ok = eng_gram_feed(st, (const uint8_t *)in, strlen(in)) && eng_gram_complete(st);
        if (ok != ex[i].ok)
            fail_msg("%s with %s: %s", in, sch, ok ? "accepted" : "refused");
        eng_gram_state_free(st);
        eng_gram_free(g);
    }
    expect_refused("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\","
                   "\"minimum\":0.2,\"maximum\":0.8}}}", PD_ERR_BAD_INPUT, "at /properties/x");
    expect_refused("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\","
                   "\"format\":\"iri\"}}}", PD_ERR_BAD_INPUT, "at /properties/x/format");
    expect_refused("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\","
                   "\"format\":\"email\",\"maxLength\":9}}}", PD_ERR_BAD_INPUT, "maxLength");
    expect_refused("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\","
                   "\"minimum\":3,\"maximum\":2}}}", PD_ERR_BAD_INPUT, "at /properties/x");
    expect_refused("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"array\","
                   "\"minItems\":-1}}}", PD_ERR_BAD_INPUT, "at /properties/x/minItems");
    /* a bound next to enum / anyOf would not constrain: refused */
    expect_refused("{\"type\":\"object\",\"properties\":{\"x\":{\"enum\":[\"a\",\"abc\"],"
                   "\"minLength\":2}}}", PD_ERR_BAD_INPUT, "at /properties/x/minLength");
    expect_refused("{\"type\":\"object\",\"properties\":{\"x\":{\"anyOf\":[{\"type\":"
                   "\"integer\"}],\"maximum\":2}}}", PD_ERR_BAD_INPUT, "'maximum' next to 'anyOf'");
}

/* ---- rules: recursion, regexes, GBNF ------------------------------------- */

#define TREE "{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\"}," \
             "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}}," \
             "\"required\":[\"value\",\"children\"],\"additionalProperties\":false}"
#define LIST "{\"type\":\"object\",\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":" \
             "{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"type\":\"null\"}," \
             "{\"$ref\":\"#/$defs/node\"}]}},\"required\":[\"v\",\"next\"]}}," \
             "\"properties\":{\"head\":{\"$ref\":\"#/$defs/node\"}},\"required\":[\"head\"]}"

/* Recursive $ref (a tree, a linked list): fails on main ("recursive $ref"
 * refused); random sampling validates, with and without a budget. */
static void test_recursive_ref(void **state)
{
    (void)state;
    /* a random tree is a critical branching process: unbounded, a few runs;
     * with a budget (the mask closes it in time), more */
    check_schema_budget(TREE, 5, 0);
    check_schema_budget(TREE, 20, 400);
    check_schema(LIST, 15);
    /* a recursion through a property not in 'required' (zod's .optional()):
     * the property may be left out, so it ends */
    check_schema("{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                 "\"next\":{\"$ref\":\"#\"},\"tag\":{\"type\":\"string\",\"maxLength\":3}},"
                 "\"required\":[\"v\"],\"additionalProperties\":false}", 15);
}

/* At the stack cap the grammar refuses to nest deeper but can still close:
 * the output stays valid. */
static void test_stack_cap(void **state)
{
    (void)state;
    eng_gram_t *g;
    char err[256];
    assert_int_equal(eng_gram_compile(ENG_GRAM_JSON_SCHEMA, LIST, strlen(LIST), &g, err,
                                      sizeof(err)), PD_OK);
    eng_gram_state_t *st;
    assert_int_equal(eng_gram_state_create(g, &st), PD_OK);
    assert_true(eng_gram_feed(st, (const uint8_t *)"{\"head\":", 8));
    const char *lvl = "{\"v\":1,\"next\":";
    int k = 0;
    while (k < 1000 && eng_gram_feed(st, (const uint8_t *)lvl, strlen(lvl)))
        k++;
    assert_true(k >= 20 && k < (int)ENG_GRAM_MAX_STACK);
    /* a level opens only if it can close: its "{" is refused too */
    assert_false(eng_gram_feed(st, (const uint8_t *)"{", 1));
    assert_true(eng_gram_feed(st, (const uint8_t *)"null", 4));
    for (int i = 0; i < k; i++)
        assert_true(eng_gram_feed(st, (const uint8_t *)"}", 1));
    assert_true(eng_gram_feed(st, (const uint8_t *)"}", 1));
    assert_true(eng_gram_complete(st));
    eng_gram_state_free(st);
    eng_gram_free(g);
}

/* multipleOf on integers (exact, with bounds, up to 64-bit), bounded
 * numbers, prefixItems, min/maxProperties, additionalProperties as a
 * schema, pattern, the regex formats. */
static void test_more_keywords(void **state)
{
    (void)state;
    /* with a budget: an unanchored pattern's string ends only after a match */
    check_schema_budget("{\"type\":\"object\",\"properties\":{"
                 "\"m7\":{\"type\":\"integer\",\"multipleOf\":7,\"minimum\":-100,\"maximum\":100},"
                 "\"m5\":{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":-9007199254740991,"
                 "\"maximum\":9007199254740991},"
                 "\"big\":{\"type\":\"integer\",\"multipleOf\":1000000007,\"minimum\":0,"
                 "\"maximum\":9007199254740991},"
                 "\"x\":{\"type\":\"number\",\"minimum\":-2.5,\"exclusiveMaximum\":10},"
                 "\"p\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1},"
                 "\"tup\":{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},"
                 "{\"type\":\"integer\"}],\"items\":false},"
                 "\"map\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}},"
                 "\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]{3}(x|yz)?$\"},"
                 "\"q\":{\"type\":\"string\",\"pattern\":\"^q\\\"[a-c]+\\\\\\\\$\"},"
                 "\"has\":{\"type\":\"string\",\"pattern\":\"ab+c\"},"
                 "\"h\":{\"type\":\"string\",\"format\":\"hostname\"},"
                 "\"v4\":{\"type\":\"string\",\"format\":\"ipv4\"},"
                 "\"v6\":{\"type\":\"string\",\"format\":\"ipv6\"},"
                 "\"uri\":{\"type\":\"string\",\"format\":\"uri\"},"
                 "\"dur\":{\"type\":\"string\",\"format\":\"duration\"}},"
                 "\"minProperties\":2,\"maxProperties\":20,"
                 "\"required\":[\"m7\",\"m5\",\"big\",\"x\",\"p\",\"tup\",\"map\",\"code\",\"q\","
                 "\"has\",\"h\",\"v4\",\"v6\",\"uri\",\"dur\"]}", 3, 700);
    static const struct { const char *sch, *in; bool ok; } ex[] = {
        { "\"type\":\"integer\",\"multipleOf\":7", "14", true },
        { "\"type\":\"integer\",\"multipleOf\":7", "15", false },
        { "\"type\":\"integer\",\"multipleOf\":7", "-7", true },
        { "\"type\":\"integer\",\"multipleOf\":7", "0", true },
        { "\"type\":\"integer\",\"multipleOf\":7,\"minimum\":1,\"maximum\":13", "7", true },
        { "\"type\":\"integer\",\"multipleOf\":1000000007", "9000000063", true },
        { "\"type\":\"integer\",\"multipleOf\":1000000007", "9000000064", false },
        { "\"type\":\"integer\",\"multipleOf\":4611686018427387904", "-9223372036854775808", true },
        { "\"type\":\"number\",\"minimum\":0,\"maximum\":1", "0.75", true },
        { "\"type\":\"number\",\"minimum\":0,\"maximum\":1", "1", true },
        { "\"type\":\"number\",\"minimum\":0,\"maximum\":1", "1.5", false },
        { "\"type\":\"number\",\"minimum\":-3,\"maximum\":1", "-2.5", true },
        { "\"type\":\"number\",\"minimum\":-3,\"maximum\":1", "-3.5", false },
        { "\"type\":\"string\",\"pattern\":\"^a.c$\"", "\"a\\\"c\"", true },
        { "\"type\":\"string\",\"pattern\":\"^a.c$\"", "\"a\\nc\"", false },
        { "\"type\":\"string\",\"pattern\":\"^[^x]$\"", "\"\\u00e9\"", false }, /* no \\u */
        { "\"type\":\"string\",\"pattern\":\"^[^x]$\"", "\"\xc3\xa9\"", true },
        { "\"type\":\"string\",\"pattern\":\"^[^x]$\"", "\"x\"", false },
        { "\"type\":\"string\",\"format\":\"ipv4\"", "\"255.0.10.1\"", true },
        { "\"type\":\"string\",\"format\":\"ipv4\"", "\"256.0.10.1\"", false },
    };
    for (size_t i = 0; i < sizeof(ex) / sizeof(ex[0]); i++) {
        char sch[256], in[64];
        snprintf(sch, sizeof(sch), "{\"type\":\"object\",\"properties\":{\"a\":{%s}},"
                 "\"required\":[\"a\"]}", ex[i].sch);
        snprintf(in, sizeof(in), "{\"a\":%s}", ex[i].in);
        eng_gram_t *g;
        char err[256];
        if (eng_gram_compile(ENG_GRAM_JSON_SCHEMA, sch, strlen(sch), &g, err, sizeof(err)) != PD_OK)
            fail_msg("%s: %s", sch, err);
        eng_gram_state_t *st;
        assert_int_equal(eng_gram_state_create(g, &st), PD_OK);
        bool ok = eng_gram_feed(st, (const uint8_t *)in, strlen(in)) && eng_gram_complete(st);
        if (ok != ex[i].ok)
            fail_msg("%s with %s: %s", in, sch, ok ? "accepted" : "refused");
        eng_gram_state_free(st);
        eng_gram_free(g);
    }
    expect_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\","
                   "\"multipleOf\":10,\"minimum\":1,\"maximum\":9}}}", PD_ERR_BAD_INPUT,
                   "at /properties/a/multipleOf");
    expect_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},"
                   "\"minProperties\":2}", PD_ERR_BAD_INPUT, "at /minProperties");
    expect_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
                   "\"pattern\":\"(a)\\\\1\"}}}", PD_ERR_BAD_INPUT, "backreferences");
    expect_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\","
                   "\"prefixItems\":[{\"type\":\"string\"}],\"minItems\":2}}}", PD_ERR_BAD_INPUT,
                   "at /properties/a/minItems");
}

/* Sample a text grammar (regex / GBNF) as sample_one does; check(out). */
static void check_text(eng_gram_kind_t kind, const char *text, int runs, uint32_t max_tokens,
                       bool (*check)(const char *ctx, const char *out), const char *ctx)
{
    for (int r = 0; r < runs; r++) {
        uint32_t nt;
        char *out = sample_one(kind, text, (uint64_t)r * 31 + 7, max_tokens, &nt);
        if (!check(ctx, out))
            fail_msg("run %d of %s: output does not match: '%s'", r, text, out);
        free(out);
    }
}

static bool ere_check(const char *ere, const char *out)
{
    return ere_match(ere, out, true);
}

/* guided_regex: the whole output matches (checked by POSIX regexec). */
/* oneOf where "exactly one" is decidable (a discriminated union as zod 4
 * emits it; branches of other JSON types) compiles as anyOf; overlapping
 * branches and intersections are refused naming the keyword; allOf of one
 * schema is that schema */
static void test_oneof_allof(void **state)
{
    (void)state;
    check_schema("{\"type\":\"object\",\"properties\":{\"shape\":{\"oneOf\":["
                 "{\"type\":\"object\",\"properties\":{\"kind\":{\"type\":\"string\","
                 "\"const\":\"circle\"},\"r\":{\"type\":\"integer\"}},"
                 "\"required\":[\"kind\",\"r\"],\"additionalProperties\":false},"
                 "{\"$ref\":\"#/$defs/sq\"}]},"
                 "\"id\":{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"},"
                 "{\"type\":\"null\"}]},"
                 "\"note\":{\"allOf\":[{\"$ref\":\"#/$defs/n\"}],\"description\":\"d\"}},"
                 "\"required\":[\"shape\",\"id\",\"note\"],\"additionalProperties\":false,"
                 "\"$defs\":{\"sq\":{\"type\":\"object\",\"properties\":{\"kind\":{"
                 "\"enum\":[\"square\",\"box\"]},\"side\":{\"type\":\"integer\"}},"
                 "\"required\":[\"kind\",\"side\"],\"additionalProperties\":false},"
                 "\"n\":{\"type\":\"string\",\"maxLength\":5}}}", 4);
    expect_refused("{\"type\":\"object\",\"properties\":{\"u\":{\"oneOf\":["
                   "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}},"
                   "{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"integer\"}}}]}},"
                   "\"required\":[\"u\"]}", PD_ERR_BAD_INPUT, "may both match");
    expect_refused("{\"type\":\"object\",\"properties\":{\"u\":{\"oneOf\":["
                   "{\"type\":\"integer\"},{\"type\":\"number\"}]}},\"required\":[\"u\"]}",
                   PD_ERR_BAD_INPUT, "/properties/u/oneOf");
    expect_refused("{\"type\":\"object\",\"properties\":{\"u\":{\"allOf\":["
                   "{\"type\":\"integer\"},{\"minimum\":3}]}},\"required\":[\"u\"]}",
                   PD_ERR_BAD_INPUT, "intersection");
}

static void test_regex(void **state)
{
    (void)state;
    static const struct { const char *ecma, *ere; } rx[] = {
        { "[a-z]+@[a-z]+\\.(com|org)", "[a-z]+@[a-z]+\\.(com|org)" },
        { "(ab|cd){2,4}x?", "(ab|cd){2,4}x?" },
        { "^\\d{3}-\\d{4}$", "[0-9]{3}-[0-9]{4}" },
        { "[0-9A-F\"]{1,5}\xc3\xa9z*", "[0-9A-F\"]{1,5}\xc3\xa9z*" },
        { "\\w+( \\w+)*[.!?]", "[A-Za-z0-9_]+( [A-Za-z0-9_]+)*[.!?]" },
        { "(yes|no|maybe)", "(yes|no|maybe)" },
        /* repetitions of repetitions (one folded repetition each) */
        { "(a{1,3}){2,}b", "(a{1,3}){2,}b" },
        { "(a+){2,3}b|((c*)*)*d", "(a+){2,3}b|((c*)*)*d" },
        /* nested repetitions of bodies that may match nothing */
        { "((a?b?)*c?)*d", "((a?b?)*c?)*d" },
        { "((a|b*)*c?)*d", "((a|b*)*c?)*d" },
    };
    for (size_t i = 0; i < sizeof(rx) / sizeof(rx[0]); i++) {
        check_text(ENG_GRAM_REGEX, rx[i].ecma, 4, 0, ere_check, rx[i].ere);
        check_text(ENG_GRAM_REGEX, rx[i].ecma, 2, 200, ere_check, rx[i].ere);
    }
    /* EOS once complete, and more may follow */
    eng_gram_t *g;
    assert_int_equal(eng_gram_compile(ENG_GRAM_REGEX, "a+b?", 4, &g, NULL, 0), PD_OK);
    eng_gram_state_t *st;
    assert_int_equal(eng_gram_state_create(g, &st), PD_OK);
    assert_false(eng_gram_complete(st));
    assert_true(eng_gram_feed(st, (const uint8_t *)"a", 1));
    assert_true(eng_gram_complete(st));
    assert_true(eng_gram_feed(st, (const uint8_t *)"aab", 3));
    assert_true(eng_gram_complete(st));
    assert_false(eng_gram_feed(st, (const uint8_t *)"a", 1));
    eng_gram_state_free(st);
    eng_gram_free(g);
    /* Nested repetitions fed byte by byte: each byte was 2^depth paths to
     * the same configurations (the fuzzer's `]*******...` ran for minutes;
     * these never end without the folding and the forks' dedup). */
    static const char *const deep[] = {
        "x********************************************************y*",
        "((((((((((((.?.?)*.?)*.?)*.?)*.?)*.?)*.?)*.?)*.?)*.?)*.?)*.?)*",
        "((((((((((((.|)*|)*|)*|)*|)*|)*|)*|)*|)*|)*|)*|)*",
        "((((((((((((.*.*)*.*)*.*)*.*)*.*)*.*)*.*)*.*)*.*)*.*)*.*)*.*)*",
    };
    uint8_t xs[300];
    memset(xs, 'x', sizeof(xs));
    for (size_t i = 0; i < sizeof(deep) / sizeof(deep[0]); i++) {
        char why[200];
        if (eng_gram_compile(ENG_GRAM_REGEX, deep[i], strlen(deep[i]), &g, why, sizeof(why)) !=
            PD_OK)
            fail_msg("%s: %s", deep[i], why);
        assert_int_equal(eng_gram_state_create(g, &st), PD_OK);
        for (size_t k = 0; k < sizeof(xs); k++)
            assert_true(eng_gram_feed(st, xs + k, 1));
        assert_true(eng_gram_complete(st));
        assert_false(eng_gram_feed(st, (const uint8_t *)"\n", 1));
        eng_gram_state_free(st);
        eng_gram_free(g);
    }
}

/* A tiny recursive-descent checker for the arithmetic grammar below. */
static const char *ar_expr(const char *p);
static const char *ar_factor(const char *p)
{
    if (!p)
        return NULL;
    if (*p == '(') {
        p = ar_expr(p + 1);
        return p && *p == ')' ? p + 1 : NULL;
    }
    if (!isdigit((unsigned char)*p))
        return NULL;
    while (isdigit((unsigned char)*p))
        p++;
    return p;
}
static const char *ar_term(const char *p)
{
    p = ar_factor(p);
    while (p && (*p == '*' || *p == '/'))
        p = ar_factor(p + 1);
    return p;
}
static const char *ar_expr(const char *p)
{
    p = ar_term(p);
    while (p && (*p == '+' || *p == '-'))
        p = ar_term(p + 1);
    return p;
}
static bool arith_check(const char *ctx, const char *out)
{
    (void)ctx;
    const char *e = ar_expr(out);
    return e && *e == '\0';
}

static bool json_check(const char *ctx, const char *out)
{
    (void)ctx;
    cJSON *v = cJSON_Parse(out);
    bool ok = v != NULL;
    cJSON_Delete(v);
    return ok;
}

static bool choice_check(const char *ctx, const char *out)
{
    (void)ctx;
    return !strcmp(out, "red") || !strcmp(out, "green") || !strcmp(out, "a \"b\"");
}

static const char *const arith_gbnf =
    "# arithmetic, recursive through parentheses\n"
    "root   ::= expr\n"
    "expr   ::= term ((\"+\" | \"-\") term)*\n"
    "term   ::= factor ((\"*\" | \"/\") factor)*\n"
    "factor ::= [0-9]{1,3} | \"(\" expr \")\"\n";

static const char *const json_gbnf = /* llama.cpp's grammars/json.gbnf */
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "  )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

/* GBNF (llama-server's grammar): recursion through rules; the outputs
 * check with independent parsers (a recursive-descent one, cJSON). */
static void test_gbnf(void **state)
{
    (void)state;
    check_text(ENG_GRAM_GBNF, arith_gbnf, 6, 0, arith_check, NULL);
    check_text(ENG_GRAM_GBNF, arith_gbnf, 6, 150, arith_check, NULL);
    check_text(ENG_GRAM_GBNF, json_gbnf, 2, 0, json_check, NULL);
    check_text(ENG_GRAM_GBNF, json_gbnf, 4, 300, json_check, NULL);
    check_text(ENG_GRAM_GBNF, "root ::= \"red\" | \"green\" | \"a \\\"b\\\"\"", 10, 0,
               choice_check, NULL);
    static const struct { const char *g, *needle; pd_status_t st; } bad[] = {
        { "root ::= root \"a\" | \"b\"\n", "left recursion (rule 'root'", PD_ERR_BAD_INPUT },
        { "root ::= x | \"b\"\nx ::= y? root\ny ::= \"a\"\n", "left recursion",
          PD_ERR_BAD_INPUT },
        { "root ::= undefined-rule\n", "'undefined-rule' is used but not defined",
          PD_ERR_BAD_INPUT },
        { "main ::= \"a\"\n", "no rule 'root'", PD_ERR_BAD_INPUT },
        { "root ::= \"a\"\nroot ::= \"b\"\n", "defined twice", PD_ERR_BAD_INPUT },
        { "root ::= \"a\" ]\n", "line 1", PD_ERR_BAD_INPUT },
        { "root ::= \"a\"{5000}\n", "ENG_GRAM_MAX_REPEAT", PD_ERR_TOO_BIG },
        { "root ::= \"(\" root \")\"\n", "never ends", PD_ERR_BAD_INPUT },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        eng_gram_t *g = NULL;
        char err[256] = "";
        pd_status_t s = eng_gram_compile(ENG_GRAM_GBNF, bad[i].g, strlen(bad[i].g), &g, err,
                                         sizeof(err));
        if (s != bad[i].st || !strstr(err, bad[i].needle))
            fail_msg("%s: status %d, err '%s' (want '%s')", bad[i].g, (int)s, err,
                     bad[i].needle);
        assert_null(g);
    }
    static const struct { const char *re, *needle; pd_status_t st; } rbad[] = {
        { "a(?=b)", "lookaround", PD_ERR_BAD_INPUT },
        { "(a)\\1", "backreferences", PD_ERR_BAD_INPUT },
        { "a\\bc", "word boundaries", PD_ERR_BAD_INPUT },
        { "a^b", "anchors", PD_ERR_BAD_INPUT },
        { "a{3000,9000}", "ENG_GRAM_MAX_REPEAT", PD_ERR_TOO_BIG },
        { "((((((((((((((((((((((((((((((((((a))))))))))))))))))))))))))))))))))",
          "ENG_GRAM_MAX_NEST", PD_ERR_TOO_BIG },
        { "[b-a]", "out of order", PD_ERR_BAD_INPUT },
        { "(ab", "missing ')'", PD_ERR_BAD_INPUT },
    };
    for (size_t i = 0; i < sizeof(rbad) / sizeof(rbad[0]); i++) {
        eng_gram_t *g = NULL;
        char err[256] = "";
        pd_status_t s = eng_gram_compile(ENG_GRAM_REGEX, rbad[i].re, strlen(rbad[i].re), &g,
                                         err, sizeof(err));
        if (s != rbad[i].st || !strstr(err, rbad[i].needle))
            fail_msg("%s: status %d, err '%s' (want '%s')", rbad[i].re, (int)s, err,
                     rbad[i].needle);
        assert_null(g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_feed_rejects),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_annotations_and_pointers),
        cmocka_unit_test(test_bounds_and_formats),
        cmocka_unit_test(test_schema_simple),
        cmocka_unit_test(test_schema_nested),
        cmocka_unit_test(test_json_object),
        cmocka_unit_test(test_recursive_ref),
        cmocka_unit_test(test_stack_cap),
        cmocka_unit_test(test_more_keywords),
        cmocka_unit_test(test_oneof_allof),
        cmocka_unit_test(test_regex),
        cmocka_unit_test(test_gbnf),
    };
    const char *only = getenv("GRAM_TEST"); /* run one test by name (debugging) */
    if (only != NULL)
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, setup, teardown);
}
