#include "rtr_req.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    bool terminal;
} state_info[RTR_REQ__COUNT] = {
#define RTR_REQ_X_INFO(NAME, name, term) [RTR_REQ_##NAME] = { name, term },
    RTR_REQ_STATES(RTR_REQ_X_INFO)
#undef RTR_REQ_X_INFO
};

/* legal[from] is a bit set of the states `from` may go to. */
#define B(s) (1u << RTR_REQ_##s)
#define ENDS (B(FAILED) | B(CANCELED))
static const unsigned legal[RTR_REQ__COUNT] = {
    [RTR_REQ_RECEIVED]   = B(ROUTED) | ENDS,
    [RTR_REQ_ROUTED]     = B(EXPORTING) | B(PREFILLING) | B(DECODING) | B(COMPLETED) | ENDS,
    [RTR_REQ_EXPORTING]  = B(PREFILLING) | B(ROUTED) | ENDS,
    [RTR_REQ_PREFILLING] = B(DECODING) | B(ROUTED) | B(COMPLETED) | ENDS,
    [RTR_REQ_DECODING]   = B(ROUTED) | B(COMPLETED) | ENDS,
    [RTR_REQ_COMPLETED]  = 0,
    [RTR_REQ_FAILED]     = 0,
    [RTR_REQ_CANCELED]   = 0,
};
#undef B
#undef ENDS

const char *rtr_req_state_name(rtr_req_state_t s)
{
    return (unsigned)s < RTR_REQ__COUNT ? state_info[s].name : "invalid";
}

bool rtr_req_state_terminal(rtr_req_state_t s)
{
    return (unsigned)s < RTR_REQ__COUNT && state_info[s].terminal;
}

bool rtr_req_transition_legal(rtr_req_state_t from, rtr_req_state_t to)
{
    if ((unsigned)from >= RTR_REQ__COUNT || (unsigned)to >= RTR_REQ__COUNT)
        return false;
    return (legal[from] & (1u << to)) != 0;
}

void rtr_req_fsm_init(rtr_req_fsm_t *f, uint64_t now_ns)
{
    memset(f, 0, sizeof(*f));
    f->state = RTR_REQ_RECEIVED;
    f->enter_ns[RTR_REQ_RECEIVED] = now_ns;
}

pd_status_t rtr_req_fsm_set(rtr_req_fsm_t *f, rtr_req_state_t to, uint64_t now_ns)
{
    bool ok = rtr_req_transition_legal(f->state, to);
#ifndef RTR_REQ_NO_ASSERT
    assert(ok && "illegal router request transition");
#endif
    if (!ok)
        return PD_ERR_BAD_INPUT;
    f->state = to;
    f->enter_ns[to] = now_ns;
    f->transitions++;
    return PD_OK;
}

bool rtr_reqid_valid(const char *s, size_t len)
{
    if (s == NULL || len == 0 || len > 64)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x21 || c > 0x7e)
            return false;
    }
    return true;
}

size_t rtr_sse_frame(const char *payload, size_t len, char *out, size_t cap)
{
    if (memchr(payload, '\n', len) != NULL || memchr(payload, '\r', len) != NULL)
        return 0;
    size_t need = 6 + len + 2;
    if (cap > need) {
        memcpy(out, "data: ", 6);
        memcpy(out + 6, payload, len);
        memcpy(out + 6 + len, "\n\n", 2);
        out[need] = '\0';
    }
    return need;
}

pd_status_t rtr_textpipe_init(rtr_textpipe_t *p, const eng_tok_t *tok,
                              const char *const *stops, size_t n_stops)
{
    memset(p, 0, sizeof(*p));
    /* Completions continue the prompt: no SPM dummy-space stripping. */
    eng_detok_init(&p->detok, tok, false, false);
    return eng_stop_init(&p->stop, stops, n_stops);
}

size_t rtr_textpipe_feed(rtr_textpipe_t *p, int32_t id, char *out, size_t cap)
{
    char piece[ENG_DETOK_OUT_MAX];
    if (p->stopped)
        return 0;
    size_t n = eng_detok_feed(&p->detok, id, piece, sizeof(piece));
    if (n == 0)
        return 0;
    assert(cap >= n + ENG_STOP_MAX_LEN);
    size_t m = eng_stop_feed(&p->stop, piece, n, out, cap);
    if (p->stop.matched >= 0)
        p->stopped = true;
    return m;
}

size_t rtr_textpipe_finish(rtr_textpipe_t *p, char *out, size_t cap)
{
    char tail[8];
    if (p->stopped)
        return 0;
    size_t n = eng_detok_finish(&p->detok, tail, sizeof(tail));
    size_t m = 0;
    if (n > 0) {
        m = eng_stop_feed(&p->stop, tail, n, out, cap);
        if (p->stop.matched >= 0) {
            p->stopped = true;
            return m;
        }
    }
    m += eng_stop_flush(&p->stop, out + m, cap - m);
    return m;
}

/* ---- NUL in JSON strings ----------------------------------------------------- */

#define NUL_DEPTH_MAX 64
#define NUL_PATH_MAX 512

typedef struct {
    char path[NUL_PATH_MAX];
    size_t pl;                         /* length of the current value's pointer */
    char kind[NUL_DEPTH_MAX];          /* '{' or '[' */
    uint32_t idx[NUL_DEPTH_MAX];       /* array index */
    size_t plen[NUL_DEPTH_MAX];        /* the container's own pointer length */
    uint32_t depth;                    /* frames in use (deeper ones not tracked) */
    uint32_t untracked;                /* nesting past NUL_DEPTH_MAX */
} nul_scan_t;

static void nul_append(nul_scan_t *z, size_t base, const char *seg, size_t n)
{
    size_t pl = base;
    if (pl + 1 < NUL_PATH_MAX)
        z->path[pl++] = '/';
    for (size_t i = 0; i < n && pl + 2 < NUL_PATH_MAX; i++) {
        if (seg[i] == '~' || seg[i] == '/') {
            z->path[pl++] = '~';
            z->path[pl++] = seg[i] == '~' ? '0' : '1';
        } else {
            z->path[pl++] = seg[i];
        }
    }
    z->path[pl] = '\0';
    z->pl = pl;
}

/* The string starting after the quote at *i: true if it holds a NUL; *i is
 * left on the closing quote (or at len). */
static bool nul_string(const char *s, size_t len, size_t *i)
{
    bool nul = false;
    size_t k = *i;
    while (k < len && s[k] != '"') {
        if (s[k] == '\0') {
            nul = true;
        } else if (s[k] == '\\' && k + 1 < len) {
            k++;
            if (s[k] == 'u' && k + 4 < len && s[k + 1] == '0' && s[k + 2] == '0' &&
                s[k + 3] == '0' && s[k + 4] == '0')
                nul = true;
        }
        k++;
    }
    *i = k;
    return nul;
}

/* The text of the JSON string s[0..n) (no quotes) with its escapes undone,
 * enough to scan it as JSON again: malloc'd, length in *out_n, or NULL. */
static char *nul_unescape(const char *s, size_t n, size_t *out_n)
{
    char *o = malloc(n + 1);
    size_t k = 0;
    if (o == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            o[k++] = s[i];
            continue;
        }
        char e = s[++i];
        if (e == 'u' && i + 4 < n) {
            unsigned v = 0;
            for (int d = 1; d <= 4; d++) {
                char h = s[i + d];
                v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0'
                                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 0);
            }
            i += 4;
            o[k++] = v == 0 ? '\0' : v < 0x80 ? (char)v : 'x';
        } else {
            o[k++] = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'b' ? '\b'
                   : e == 'f' ? '\f' : e;
        }
    }
    o[k] = '\0';
    *out_n = k;
    return o;
}

static bool nul_find(const char *s, size_t len, char *ptr, size_t cap, int nest);

/* A tool call's "arguments" is JSON inside a JSON string, parsed again by
 * the request parser: a NUL in one of its strings is "\\u0000" here. */
static bool nul_in_arguments(nul_scan_t *z, const char *str, size_t n, int nest)
{
    static const char suffix[] = "/function/arguments";
    size_t sl = sizeof(suffix) - 1;
    if (nest > 0 || z->pl < sl || strcmp(z->path + z->pl - sl, suffix) != 0)
        return false;
    size_t in_n = 0;
    char *in = nul_unescape(str, n, &in_n);
    char sub[NUL_PATH_MAX];
    bool found = in != NULL && nul_find(in, in_n, sub, sizeof(sub), nest + 1);
    free(in);
    if (found)
        nul_append(z, z->pl, sub + (sub[0] == '/'), strlen(sub + (sub[0] == '/')));
    return found;
}

bool rtr_json_nul_find(const char *s, size_t len, char *ptr, size_t cap)
{
    return nul_find(s, len, ptr, cap, 0);
}

static bool nul_find(const char *s, size_t len, char *ptr, size_t cap, int nest)
{
    nul_scan_t *z = calloc(1, sizeof(*z));
    bool found = false, want_key = false, want_elem = false;
    if (z == NULL) {
        /* no room to name it: look for one anyway */
        for (size_t i = 0; i < len && !found; i++)
            if (s[i] == '"') {
                i++;
                found = nul_string(s, len, &i);
            }
        if (found && cap > 0)
            ptr[0] = '\0';
        return found;
    }
    for (size_t i = 0; i < len && !found; i++) {
        char c = s[i];
        bool tracked = z->untracked == 0 && z->depth > 0;
        char kind = tracked ? z->kind[z->depth - 1] : 0;
        if (want_elem && kind == '[' && c != ']' && c != ',' && c != ' ' && c != '\t' &&
            c != '\n' && c != '\r') {
            char num[16];
            int n = snprintf(num, sizeof(num), "%u", z->idx[z->depth - 1]);
            nul_append(z, z->plen[z->depth - 1], num, (size_t)n);
            want_elem = false;
        }
        switch (c) {
        case '"': {
            size_t start = ++i;
            bool nul = nul_string(s, len, &i);
            if (want_key && kind == '{') {
                nul_append(z, z->plen[z->depth - 1], s + start,
                           (i < len ? i : len) - start);
                want_key = false;
            } else if (!nul) {
                nul = nul_in_arguments(z, s + start, (i < len ? i : len) - start, nest);
            }
            found = nul;
            break;
        }
        case '{':
        case '[':
            if (z->untracked == 0 && z->depth < NUL_DEPTH_MAX) {
                z->kind[z->depth] = c;
                z->idx[z->depth] = 0;
                z->plen[z->depth] = z->pl;
                z->depth++;
            } else {
                z->untracked++;
            }
            want_key = c == '{';
            want_elem = c == '[';
            break;
        case '}':
        case ']':
            if (z->untracked > 0)
                z->untracked--;
            else if (z->depth > 0)
                z->depth--;
            want_key = want_elem = false;
            break;
        case ',':
            if (kind == '[') {
                z->idx[z->depth - 1]++;
                want_elem = true;
            } else if (kind == '{') {
                want_key = true;
            }
            break;
        default:
            break;
        }
    }
    if (found && cap > 0)
        snprintf(ptr, cap, "%s", z->path);
    free(z);
    return found;
}
