/* gram_int.h - engine/gram's private header: the rule graph (nodes, ranges,
 * properties), the compiler's state, the runtime's configurations, and the
 * functions the gram_*.c files call across each other. Not installed; only
 * engine/gram/ includes it. */
#ifndef PD_GRAM_INT_H
#define PD_GRAM_INT_H

#include "eng_gram.h"

#include <cjson/cJSON.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
#define N_FORMATS (FMT_EMAIL + 1)
typedef struct {
    const char *name;
    const char *tpl;    /* NULL: FMT_EMAIL's automaton */
} gram_format_t;
extern const gram_format_t gram_formats[N_FORMATS]; /* gram_leaf.c */

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

/* A character class being built: ranges of code points. */
typedef struct {
    grange_t r[256];
    uint32_t n;
    bool neg;
    bool over;        /* more than 256 ranges */
} cls_t;

/* A GBNF rule. */
typedef struct {
    char name[64];
    uint32_t ref;      /* its N_REF node; a = the body once defined */
    bool defined;
} grule_t;

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

/* eng_gram.c */
size_t gram_path_push(comp_t *c, const char *seg);
void gram_path_pop(comp_t *c, size_t old);
/* Fail with a message; " at <pointer>" is added when inside the schema. */
void gram_cfail(comp_t *c, pd_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void gram_cfail_kw(comp_t *c, pd_status_t st, const char *kw, const char *why);
bool gram_grow(void **p, uint32_t *cap, uint32_t need, size_t elem);
uint32_t gram_new_node(comp_t *c, uint8_t kind, uint32_t n, uint32_t a);
uint32_t gram_lit_node(comp_t *c, const char *s, size_t n);
uint32_t gram_range_add(comp_t *c, int64_t lo, int64_t hi);
uint32_t gram_range_node(comp_t *c, uint8_t kind, int64_t lo, int64_t hi, uint32_t a);
uint32_t gram_alts_node(comp_t *c, const uint32_t *ids, uint32_t n);
uint32_t gram_list_node(comp_t *c, uint8_t kind, const uint32_t *ids, uint32_t n);
uint32_t gram_seq_node(comp_t *c, const uint32_t *ids, uint32_t n);
void gram_list_push(comp_t *c, uint32_t *ids, uint32_t *n, uint32_t cap, bool alt, uint32_t id);
uint32_t gram_rep_node(comp_t *c, uint32_t child, int64_t lo, int64_t hi);
void gram_cls_add(cls_t *k, int64_t lo, int64_t hi);
uint32_t gram_cls_raw(comp_t *c, cls_t *k);
uint32_t gram_cls_node(comp_t *c, cls_t *k, bool json);
size_t gram_utf8_put(uint32_t cp, char *o);
int64_t gram_utf8_get(const char **p, const char *e);
int gram_hexv(char ch);
bool gram_read_int(const char **p, const char *e, int64_t *v);
uint32_t gram_char_node(comp_t *c, uint32_t cp, bool json);

/* gram_schema.c */
uint32_t gram_any_block(comp_t *c);
uint32_t gram_comp_schema(comp_t *c, const cJSON *s, uint32_t depth, bool root);

/* gram_regex.c */
uint32_t gram_comp_regex(comp_t *c, const char *text, size_t len, bool search, bool json,
                         const char *what);

/* gram_gbnf.c */
uint32_t gram_comp_gbnf(comp_t *c, const char *text, size_t len, grule_t *rules,
                        uint32_t *n_rules);

/* gram_leaf.c */
bool gram_has_mult(__int128 lo, __int128 hi, int64_t m);
uint32_t gram_sat_add(uint32_t a, uint32_t b);
uint32_t gram_ndig(uint64_t m);
uint64_t gram_uabs64(int64_t v);
uint32_t gram_int_more(const grange_t *r, int64_t m, int64_t v, bool neg, uint32_t d);
uint32_t gram_fmt_rest(uint32_t f, uint32_t st);
int gram_fmt_step(uint32_t f, uint32_t st, uint8_t prev, uint8_t b);

/* gram_pda.c */
uint32_t gram_set_close(const eng_gram_t *g, const set_t *st);
void gram_set_feed(const eng_gram_t *g, const set_t *in, uint8_t b, set_t *out);
void gram_set_copy(set_t *d, const set_t *s);
bool gram_sets_equal(const set_t *a, const set_t *b);
const set_t *gram_walk(const eng_gram_t *g, const set_t *in, const uint8_t *p, size_t n,
                       set_t *a, set_t *b);

#endif
