/* eng_gram.c - the grammar compiler's core: eng_gram_compile / eng_gram_free,
 * the node builders every front end uses (literals, sequences, alternatives,
 * repetitions, UTF-8 character classes), refusals with the schema pointer,
 * and the analysis after parsing (shortest completion, stack depth, left
 * recursion). The front ends are gram_schema.c, gram_regex.c, gram_gbnf.c;
 * the runtime gram_pda.c and gram_mask.c. See eng_gram.h. */
#include "gram_int.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Append "/<seg>" (escaped: ~ as ~0, / as ~1) to the pointer; returns the
 * length to restore with path_pop. */
size_t gram_path_push(comp_t *c, const char *seg)
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

void gram_path_pop(comp_t *c, size_t old)
{
    c->plen = old;
    c->path[old] = '\0';
}

/* Fail with a message; " at <pointer>" is added when inside the schema. */
void gram_cfail(comp_t *c, pd_status_t st, const char *fmt, ...)
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
void gram_cfail_kw(comp_t *c, pd_status_t st, const char *kw, const char *why)
{
    size_t o = gram_path_push(c, kw);
    gram_cfail(c, st, "%s", why);
    gram_path_pop(c, o);
}

bool gram_grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
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

uint32_t gram_new_node(comp_t *c, uint8_t kind, uint32_t n, uint32_t a)
{
    eng_gram_t *g = c->g;
    if (c->st != PD_OK)
        return 0;
    if (g->n_nodes >= ENG_GRAM_MAX_NODES) {
        gram_cfail(c, PD_ERR_TOO_BIG, "schema compiles to more than %u grammar nodes",
                   ENG_GRAM_MAX_NODES);
        return 0;
    }
    if (!gram_grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(gnode_t))) {
        gram_cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    g->nodes[g->n_nodes] = (gnode_t){ kind, n, a, 0, 0, 0 };
    return g->n_nodes++;
}

uint32_t gram_lit_node(comp_t *c, const char *s, size_t n)
{
    eng_gram_t *g = c->g;
    if (c->st != PD_OK)
        return 0;
    if (g->n_pool + n > ENG_GRAM_MAX_SCHEMA_BYTES * 2u) {
        gram_cfail(c, PD_ERR_TOO_BIG, "schema literals too large");
        return 0;
    }
    if (g->n_pool + n > g->cap_pool) {
        size_t nc = g->cap_pool ? g->cap_pool * 2 : 256;
        while (nc < g->n_pool + n)
            nc *= 2;
        char *q = realloc(g->pool, nc);
        if (!q) {
            gram_cfail(c, PD_ERR_NO_MEMORY, "out of memory");
            return 0;
        }
        g->pool = q;
        g->cap_pool = nc;
    }
    memcpy(g->pool + g->n_pool, s, n);
    uint32_t id = gram_new_node(c, N_LIT, (uint32_t)n, (uint32_t)g->n_pool);
    g->n_pool += n;
    return id;
}

/* Appends [lo, hi] to the ranges table: its index + 1 (what a node's n or
 * x holds), or 0 (failed). */
uint32_t gram_range_add(comp_t *c, int64_t lo, int64_t hi)
{
    eng_gram_t *g = c->g;
    if (c->st != PD_OK)
        return 0;
    if (!gram_grow((void **)&g->ranges, &g->cap_ranges, g->n_ranges + 1, sizeof(grange_t))) {
        gram_cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    g->ranges[g->n_ranges++] = (grange_t){ lo, hi };
    return g->n_ranges;
}

/* A node of kind with bounds [lo, hi] (ranges table). */
uint32_t gram_range_node(comp_t *c, uint8_t kind, int64_t lo, int64_t hi, uint32_t a)
{
    uint32_t r = gram_range_add(c, lo, hi);
    return r == 0 ? 0 : gram_new_node(c, kind, r, a);
}


uint32_t gram_alts_node(comp_t *c, const uint32_t *ids, uint32_t n)
{
    eng_gram_t *g = c->g;
    if (c->st != PD_OK)
        return 0;
    if (n == 1)
        return ids[0];
    if (!gram_grow((void **)&g->alts, &g->cap_alts, g->n_alts + n, sizeof(uint32_t))) {
        gram_cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    memcpy(g->alts + g->n_alts, ids, n * sizeof(uint32_t));
    uint32_t id = gram_new_node(c, N_ANYOF, n, g->n_alts);
    g->n_alts += n;
    return id;
}

/* A node over a list of children (N_SEQ; N_ANYOF via alts_node). */
uint32_t gram_list_node(comp_t *c, uint8_t kind, const uint32_t *ids, uint32_t n)
{
    eng_gram_t *g = c->g;
    if (c->st != PD_OK)
        return 0;
    if (!gram_grow((void **)&g->alts, &g->cap_alts, g->n_alts + n + 1, sizeof(uint32_t))) {
        gram_cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    if (n)
        memcpy(g->alts + g->n_alts, ids, n * sizeof(uint32_t));
    uint32_t id = gram_new_node(c, kind, n, g->n_alts);
    if (c->st == PD_OK)
        g->n_alts += n;
    return id;
}

uint32_t gram_seq_node(comp_t *c, const uint32_t *ids, uint32_t n)
{
    if (n == 1)
        return ids[0];
    return gram_list_node(c, N_SEQ, ids, n);
}

/* Appends id to a sequence (alt false) or alternation being built in
 * ids[cap]; a full array folds into one node that stays first, so long
 * literal runs and long alternations stay compilable. */
void gram_list_push(comp_t *c, uint32_t *ids, uint32_t *n, uint32_t cap, bool alt, uint32_t id)
{
    if (*n >= cap) {
        ids[0] = alt ? gram_alts_node(c, ids, *n) : gram_seq_node(c, ids, *n);
        *n = 1;
    }
    ids[(*n)++] = id;
}

/* child repeated lo..hi times (hi INT64_MAX: unbounded). */
uint32_t gram_rep_node(comp_t *c, uint32_t child, int64_t lo, int64_t hi)
{
    if (c->st != PD_OK)
        return 0;
    const int64_t cap = ENG_GRAM_MAX_REPEAT;
    if (lo > cap || (hi != INT64_MAX && hi > cap)) {
        gram_cfail(c, PD_ERR_TOO_BIG, "a repetition count above %u (ENG_GRAM_MAX_REPEAT)",
                   ENG_GRAM_MAX_REPEAT);
        return 0;
    }
    if (lo == 1 && hi == 1)
        return child;
    /* A repetition of a repetition that can take one step at a time and
     * where one of the two is unbounded is one unbounded repetition:
     * (X{a,b}){m,n} with a <= 1 <= b, n >= 1 and b or n unbounded is
     * X{0,} when a or m is 0, else X{m,}. Kept nested, every level could
     * begin another body or end at each byte: `a**********` (or
     * `((a*)*)*...`) fed in time exponential in its depth. */
    const gnode_t *in = &c->g->nodes[child];
    if (in->kind == N_REP && hi >= 1) {
        const grange_t *ir = &c->g->ranges[in->n - 1];
        if (ir->lo <= 1 && ir->hi >= 1 && (ir->hi == INT64_MAX || hi == INT64_MAX))
            return gram_rep_node(c, in->a, ir->lo == 0 || lo == 0 ? 0 : lo, INT64_MAX);
    }
    return gram_range_node(c, N_REP, lo, hi, child);
}

/* ---- character classes ----------------------------------------------------- */

void gram_cls_add(cls_t *k, int64_t lo, int64_t hi)
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

uint32_t gram_cls_raw(comp_t *c, cls_t *k)
{
    eng_gram_t *g = c->g;
    if (c->st != PD_OK)
        return 0;
    if (k->over) {
        gram_cfail(c, PD_ERR_TOO_BIG, "a character class with more than 256 ranges");
        return 0;
    }
    if (!k->neg && k->n == 0) {
        gram_cfail(c, PD_ERR_BAD_INPUT, "a character class that matches nothing");
        return 0;
    }
    cls_merge(k);
    if (g->n_ranges + k->n > ENG_GRAM_MAX_RANGES) {
        gram_cfail(c, PD_ERR_TOO_BIG, "more than %u character-class ranges (ENG_GRAM_MAX_RANGES)",
                   ENG_GRAM_MAX_RANGES);
        return 0;
    }
    if (!gram_grow((void **)&g->ranges, &g->cap_ranges, g->n_ranges + k->n + 1, sizeof(grange_t))) {
        gram_cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    memcpy(g->ranges + g->n_ranges, k->r, k->n * sizeof(grange_t));
    uint32_t id = gram_new_node(c, N_CLASS, k->n, g->n_ranges);
    if (c->st != PD_OK)
        return 0;
    g->n_ranges += k->n;
    g->nodes[id].x = k->neg;
    return id;
}

/* A class as generated text; json: inside a JSON string, where '"', '\\'
 * and controls are written escaped ("\\\"", "\\\\", "\\n", "\\t", "\\r";
 * other controls are never written). */
uint32_t gram_cls_node(comp_t *c, cls_t *k, bool json)
{
    if (!json)
        return gram_cls_raw(c, k);
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
        gram_cls_add(&m, 0, 0x1f);
        gram_cls_add(&m, '"', '"');
        gram_cls_add(&m, '\\', '\\');
    } else {
        for (uint32_t i = 0; i < k->n; i++) {
            int64_t lo = k->r[i].lo < 0x20 ? 0x20 : k->r[i].lo, hi = k->r[i].hi;
            const int64_t cut[2] = { '"', '\\' };
            for (int j = 0; j < 2 && lo <= hi; j++)
                if (cut[j] >= lo && cut[j] <= hi) {
                    if (cut[j] > lo)
                        gram_cls_add(&m, lo, cut[j] - 1);
                    lo = cut[j] + 1;
                }
            if (lo <= hi)
                gram_cls_add(&m, lo, hi);
        }
    }
    if (m.neg || m.n > 0)
        ids[n++] = gram_cls_raw(c, &m);
    for (int i = 0; i < 5; i++)
        if (has[i])
            ids[n++] = gram_lit_node(c, esc[i].esc, 2);
    if (n == 0) {
        gram_cfail(c, PD_ERR_BAD_INPUT, "a character class that matches nothing");
        return 0;
    }
    return gram_alts_node(c, ids, n);
}

/* UTF-8 of code point cp into o (4 bytes); the count. */
size_t gram_utf8_put(uint32_t cp, char *o)
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
int64_t gram_utf8_get(const char **p, const char *e)
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

/* A hex digit's value, or -1. */
int gram_hexv(char ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
         : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* A decimal count at *p (a repetition's {m,n}; above 1000000 it stops
 * growing): advances *p past the digits; false (and *p unmoved) if none. */
bool gram_read_int(const char **p, const char *e, int64_t *v)
{
    const char *q = *p;
    if (q >= e || *q < '0' || *q > '9')
        return false;
    *v = 0;
    while (q < e && *q >= '0' && *q <= '9') {
        if (*v < 1000000)
            *v = *v * 10 + (*q - '0');
        q++;
    }
    *p = q;
    return true;
}

/* One character as generated text (json: escaped as in cls_node). */
uint32_t gram_char_node(comp_t *c, uint32_t cp, bool json)
{
    if (json && (cp < 0x20 || cp == '"' || cp == '\\')) {
        cls_t k = { .n = 0 };
        gram_cls_add(&k, cp, cp);
        return gram_cls_node(c, &k, true);
    }
    char b[4];
    return gram_lit_node(c, b, gram_utf8_put(cp, b));
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
        m = nd->n ? (uint32_t)gram_sat_add(2, (uint32_t)g->ranges[nd->n - 1].lo) : 2;
        break;
    case N_INT:
    case N_NUM:
        if (nd->n) {
            const grange_t *r = &g->ranges[nd->n - 1];
            m = r->lo <= 0 && r->hi >= 0 ? 1 : r->lo > 0 ? gram_ndig((uint64_t)r->lo)
                                                         : 1 + gram_ndig(gram_uabs64(r->hi));
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
            m = gram_sat_add(m, gram_sat_add(im, k ? 1 : 0));
        break;
    }
    case N_FMT: m = 2 + gram_fmt_rest(nd->n, 0); break;
    case N_LIT: m = nd->n; break;
    case N_ANYOF:
        m = UINT32_MAX;
        for (uint32_t k = 0; k < nd->n; k++)
            if (g->nodes[g->alts[nd->a + k]].min < m)
                m = g->nodes[g->alts[nd->a + k]].min;
        break;
    case N_SEQ:
        for (uint32_t k = 0; k < nd->n; k++)
            m = gram_sat_add(m, g->nodes[g->alts[nd->a + k]].min);
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
                t = gram_sat_add(gram_sat_add(t, cnt ? 1 : 0),
                                 gram_sat_add(g->nodes[p->key].min, g->nodes[p->val].min));
                cnt++;
            }
            p->tail = t;
            p->cnt = cnt;
        }
        m = gram_sat_add(t, 2);
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
            d = gram_sat_add(1, g->nodes[nd->a].sdep);
        break;
    case N_REP:
        if (g->ranges[nd->n - 1].lo > 0)
            d = gram_sat_add(1, g->nodes[nd->a].sdep);
        break;
    case N_SEQ:
        for (uint32_t k = 0; k < nd->n; k++) {
            uint32_t t = gram_sat_add(1, g->nodes[g->alts[nd->a + k]].sdep);
            if (t > d)
                d = t;
        }
        break;
    case N_OBJ:
        for (uint32_t k = 0; k < nd->n; k++) {
            const gprop_t *p = &g->props[nd->a + k];
            if (p->opt)
                continue; /* taken only when it fits (feed_obj) */
            uint32_t t = gram_sat_add(1, g->nodes[p->val].sdep);
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
            gram_cfail(c, PD_ERR_BAD_INPUT, "grammar: the recursion never ends: 'root' has no "
                       "finite sentence");
        else
            gram_cfail(c, PD_ERR_BAD_INPUT, "the recursion never ends: no finite output matches (a "
                       "recursion through required properties only: end it with an optional "
                       "property, null or an array)");
        return;
    }
    if (rt->sdep > ENG_GRAM_MAX_STACK) {
        gram_cfail(c, PD_ERR_TOO_BIG, "the shortest output nests deeper than %u frames "
                   "(ENG_GRAM_MAX_STACK)", ENG_GRAM_MAX_STACK);
        return;
    }
    uint8_t *color = calloc(g->n_nodes, 1);
    if (!color) {
        gram_cfail(c, PD_ERR_NO_MEMORY, "out of memory");
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
            gram_cfail(c, PD_ERR_BAD_INPUT, "grammar: left recursion (rule '%s' can reach itself "
                       "before any character); rewrite it with repetition", name);
        else if (n_rules)
            gram_cfail(c, PD_ERR_BAD_INPUT, "grammar: left recursion (a rule can reach itself "
                       "before any character); rewrite it with repetition");
        else
            gram_cfail(c, PD_ERR_BAD_INPUT, "a '$ref' cycle that consumes nothing (left recursion)");
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
    gram_new_node(c, 0, 0, 0); /* node 0 is never used: 0 means "none" */
    if (kind != ENG_GRAM_JSON_OBJECT && len > ENG_GRAM_MAX_SCHEMA_BYTES) {
        gram_cfail(c, PD_ERR_TOO_BIG, "%s larger than %u bytes",
                   kind == ENG_GRAM_JSON_SCHEMA ? "schema" : kind == ENG_GRAM_REGEX ? "regex"
                                                                                    : "grammar",
                   ENG_GRAM_MAX_SCHEMA_BYTES);
    } else if (kind == ENG_GRAM_JSON_OBJECT) {
        uint32_t base = gram_any_block(c);
        g->root = gram_new_node(c, N_ANYOBJ, 0, base);
    } else if (kind == ENG_GRAM_JSON_SCHEMA) {
        cJSON *doc = cJSON_ParseWithLength(schema, len);
        if (!doc) {
            gram_cfail(c, PD_ERR_BAD_INPUT, "schema is not valid JSON");
        } else {
            c->doc = doc;
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(doc, "type");
            if ((!cJSON_IsString(ty) || strcmp(ty->valuestring, "object") != 0) &&
                !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(doc, "$ref")))
                gram_cfail(c, PD_ERR_BAD_INPUT, "the root schema must have \"type\": \"object\"");
            g->root = gram_comp_schema(c, doc, 0, true);
            cJSON_Delete(doc);
        }
    } else if (kind == ENG_GRAM_REGEX) {
        g->root = gram_comp_regex(c, schema, len, false, false, "regex");
    } else if (kind == ENG_GRAM_GBNF) {
        rules = calloc(ENG_GRAM_MAX_RULES, sizeof(*rules));
        if (!rules)
            gram_cfail(c, PD_ERR_NO_MEMORY, "out of memory");
        else
            g->root = gram_comp_gbnf(c, schema, len, rules, &n_rules);
    } else {
        gram_cfail(c, PD_ERR_BAD_INPUT, "unknown grammar kind");
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
