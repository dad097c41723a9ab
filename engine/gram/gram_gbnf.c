/* gram_gbnf.c - the GBNF front end (llama.cpp's grammar format: llama-server
 * "grammar", vLLM guided_grammar / guided_choice) into rule-graph nodes, one
 * N_REF call per rule. */
#include "gram_int.h"

#include <stdio.h>
#include <string.h>

/* ---- GBNF (llama.cpp's grammar format) --------------------------------------- */

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
    gram_cfail(b->c, st, "grammar: %s (line %u)", why, line);
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
    r->ref = gram_new_node(b->c, N_REF, 0, 0);
    if (b->c->st != PD_OK)
        return UINT32_MAX;
    return b->n_rules++;
}

/* One character of a literal or class (escapes: \n \r \t \\ \" \[ \] \-
 * \xHH \uHHHH \UHHHHHHHH); -1 on error. */
static int64_t gb_char(gb_t *b)
{
    if (*b->p != '\\')
        return gram_utf8_get(&b->p, b->e);
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
        int h = b->p < b->e ? gram_hexv(*b->p) : -1;
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
                k += gram_utf8_put((uint32_t)cp, buf + k);
            }
            if (b->p >= b->e) {
                gb_fail(b, PD_ERR_BAD_INPUT, "unterminated literal");
                return 0;
            }
            b->p++;
            atom = k ? gram_lit_node(c, buf, k) : gram_list_node(c, N_SEQ, NULL, 0);
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
                gram_cls_add(&k, lo, hi);
            }
            if (b->p >= b->e) {
                gb_fail(b, PD_ERR_BAD_INPUT, "unterminated character class");
                return 0;
            }
            b->p++;
            atom = gram_cls_node(c, &k, false);
        } else if (ch == '.') {
            b->p++;
            cls_t k = { .n = 0, .neg = true };
            atom = gram_cls_raw(c, &k);
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
                if (!gram_read_int(&b->p, b->e, &lo)) {
                    gb_fail(b, PD_ERR_BAD_INPUT, "expected a number after '{'");
                    return 0;
                }
                hi = lo;
                gb_space(b, nest > 0);
                if (b->p < b->e && *b->p == ',') {
                    b->p++;
                    gb_space(b, nest > 0);
                    hi = gram_read_int(&b->p, b->e, &hi) ? hi : INT64_MAX;
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
            atom = gram_rep_node(c, atom, lo, hi);
            gb_space(b, nest > 0);
        }
        gram_list_push(c, ids, &n, 256, false, atom);
    }
    return c->st == PD_OK ? gram_seq_node(c, ids, n) : 0;
}

static uint32_t gb_alts(gb_t *b, uint32_t nest)
{
    uint32_t ids[ENG_GRAM_MAX_ANYOF], n = 0;
    for (;;) {
        uint32_t s = gb_seq(b, nest);
        if (b->c->st != PD_OK)
            return 0;
        gram_list_push(b->c, ids, &n, ENG_GRAM_MAX_ANYOF, true, s);
        if (b->p < b->e && *b->p == '|') {
            b->p++;
            gb_space(b, true);
            continue;
        }
        break;
    }
    return gram_alts_node(b->c, ids, n);
}

uint32_t gram_comp_gbnf(comp_t *c, const char *text, size_t len, grule_t *rules,
                        uint32_t *n_rules)
{
    gb_t b = { c, text, text, text + len, rules, 0 };
    if (memchr(text, '\0', len)) {
        gram_cfail(c, PD_ERR_BAD_INPUT, "grammar: contains a NUL byte");
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
            gram_cfail(c, PD_ERR_BAD_INPUT, "grammar: rule '%s' is used but not defined",
                       b.rules[i].name);
            return 0;
        }
        if (strcmp(b.rules[i].name, "root") == 0)
            root = b.rules[i].ref;
    }
    if (root == UINT32_MAX) {
        gram_cfail(c, PD_ERR_BAD_INPUT, "grammar: no rule 'root'");
        return 0;
    }
    return root;
}
