/* gram_regex.c - the regex front end (ECMA-262 subset: vLLM guided_regex,
 * JSON-Schema "pattern", the regex formats) into rule-graph nodes. */
#include "gram_int.h"

#include <stdio.h>
#include <string.h>

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
    gram_cfail(r->c, st, "%s: %s (at offset %zu)", r->what, why, (size_t)(r->p - r->base));
}

/* \d \w \s and their negations into k; false if esc is not one. */
static bool rx_class_esc(char esc, cls_t *k)
{
    switch (esc) {
    case 'd': case 'D': gram_cls_add(k, '0', '9'); break;
    case 'w': case 'W':
        gram_cls_add(k, '0', '9'); gram_cls_add(k, 'A', 'Z'); gram_cls_add(k, 'a', 'z'); gram_cls_add(k, '_', '_');
        break;
    case 's': case 'S':
        gram_cls_add(k, '\t', '\r'); gram_cls_add(k, ' ', ' '); gram_cls_add(k, 0xa0, 0xa0);
        gram_cls_add(k, 0x2028, 0x2029); gram_cls_add(k, 0xfeff, 0xfeff);
        break;
    default: return false;
    }
    return true;
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
            int h = r->p < r->e ? gram_hexv(*r->p) : -1;
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
        return gram_utf8_get(&r->p, r->e);
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
            lo = gram_utf8_get(&r->p, r->e);
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
                hi = gram_utf8_get(&r->p, r->e);
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
        gram_cls_add(&k, lo, hi);
    }
    if (r->p >= r->e) {
        rx_fail(r, PD_ERR_BAD_INPUT, "unterminated character class");
        return 0;
    }
    r->p++; /* ']' */
    return gram_cls_node(r->c, &k, r->json);
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
            if (!gram_read_int(&r->p, r->e, &lo)) {
                r->p = save;
                return atom; /* a literal '{' follows (as ECMA-262 Annex B) */
            }
            hi = lo;
            if (r->p < r->e && *r->p == ',') {
                r->p++;
                if (!gram_read_int(&r->p, r->e, &hi))
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
        atom = gram_rep_node(r->c, atom, lo, hi);
    }
    return atom;
}

static uint32_t rx_any_char(rx_t *r)
{
    cls_t k = { .n = 0, .neg = true };
    gram_cls_add(&k, '\n', '\n');
    gram_cls_add(&k, '\r', '\r');
    gram_cls_add(&k, 0x2028, 0x2029);
    return gram_cls_node(r->c, &k, r->json);
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
                atom = gram_cls_node(r->c, &k, r->json);
            } else {
                int64_t cp = rx_char_esc(r);
                if (cp < 0)
                    return 0;
                atom = gram_char_node(r->c, (uint32_t)cp, r->json);
            }
        } else {
            int64_t cp = gram_utf8_get(&r->p, r->e);
            if (cp < 0) {
                rx_fail(r, PD_ERR_BAD_INPUT, "invalid UTF-8");
                return 0;
            }
            atom = gram_char_node(r->c, (uint32_t)cp, r->json);
        }
        atom = rx_quant(r, atom);
        gram_list_push(r->c, ids, &n, 256, false, atom);
    }
    return r->c->st == PD_OK ? gram_seq_node(r->c, ids, n) : 0;
}

static uint32_t rx_alt(rx_t *r, uint32_t nest)
{
    uint32_t ids[ENG_GRAM_MAX_ANYOF], n = 0;
    for (;;) {
        uint32_t s = rx_seq(r, nest);
        if (r->c->st != PD_OK)
            return 0;
        gram_list_push(r->c, ids, &n, ENG_GRAM_MAX_ANYOF, true, s);
        if (r->p < r->e && *r->p == '|') {
            r->p++;
            continue;
        }
        break;
    }
    return gram_alts_node(r->c, ids, n);
}

/* Compile regex text[0..len) into the graph. search: JSON Schema 'pattern'
 * (unanchored ends match anywhere: any text may come before / after);
 * otherwise the whole text must match (vLLM guided_regex), ^ and $ at the
 * ends are accepted. json: the text is a JSON string's body. */
uint32_t gram_comp_regex(comp_t *c, const char *text, size_t len, bool search, bool json,
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
        gram_cfail(c, PD_ERR_BAD_INPUT, "%s: contains a NUL byte", what);
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
                gram_cfail(c, PD_ERR_BAD_INPUT, "%s: a top-level '|' next to only one anchor "
                           "(wrap the alternatives in a group)", what);
                return 0;
            }
        }
    }
    if (!search)
        return body;
    uint32_t ids[3], n = 0;
    if (!a0)
        ids[n++] = gram_rep_node(c, rx_any_char(&r), 0, INT64_MAX);
    ids[n++] = body;
    if (!a1)
        ids[n++] = gram_rep_node(c, rx_any_char(&r), 0, INT64_MAX);
    return gram_seq_node(c, ids, n);
}
