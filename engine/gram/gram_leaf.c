/* gram_leaf.c - JSON leaf arithmetic shared by the analysis and the runtime:
 * the string formats' table and automata, bounded-integer digit counts. */
#include "gram_int.h"

#include <string.h>

/* See gram_int.h (FMT_*). */
const gram_format_t gram_formats[N_FORMATS] = {
    [FMT_DATE] = { "date", "DDDD-mn-de" },
    [FMT_TIME] = { "time", "hi:MD:MDZ" },
    [FMT_DATETIME] = { "date-time", "DDDD-mn-deThi:MD:MDZ" },
    [FMT_UUID] = { "uuid", "HHHHHHHH-HHHH-HHHH-HHHH-HHHHHHHHHHHH" },
    [FMT_EMAIL] = { "email", NULL },
};

static int64_t floordiv(__int128 a, int64_t m)
{
    __int128 q = a / m;
    if (a % m != 0 && a < 0)
        q--;
    return (int64_t)q;
}

/* Some multiple of m (> 0) lies in [lo, hi]. */
bool gram_has_mult(__int128 lo, __int128 hi, int64_t m)
{
    if (lo > hi)
        return false;
    if (m <= 1)
        return true;
    __int128 q = -(__int128)floordiv(-lo, m); /* ceil(lo / m) */
    return q * m <= hi;
}

uint32_t gram_sat_add(uint32_t a, uint32_t b)
{
    return a > UINT32_MAX - b ? UINT32_MAX : a + b;
}

uint32_t gram_ndig(uint64_t m)
{
    uint32_t d = 1;
    while (m >= 10) {
        m /= 10;
        d++;
    }
    return d;
}

uint64_t gram_uabs64(int64_t v)
{
    return v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
}

/* The fewest digits to append to an integer prefix of value v (d digits,
 * neg: it began with '-') so that it lies in r; UINT32_MAX if none can. */
uint32_t gram_int_more(const grange_t *r, int64_t m, int64_t v, bool neg, uint32_t d)
{
    __int128 base = v, span = 1;
    for (uint32_t k = 0; d + k <= 19; k++) {
        __int128 a = neg ? base - (span - 1) : base, b = neg ? base : base + span - 1;
        if (a <= r->hi && b >= r->lo &&
            gram_has_mult(a > r->lo ? a : r->lo, b < r->hi ? b : r->hi, m))
            return k;
        if (v == 0)
            return UINT32_MAX; /* nothing follows a leading 0 */
        base *= 10;
        span *= 10;
    }
    return UINT32_MAX;
}

/* Bytes a format's body still needs from state st (before the quote). */
uint32_t gram_fmt_rest(uint32_t f, uint32_t st)
{
    static const uint8_t email_rest[8] = { 6, 5, 6, 4, 3, 2, 1, 0 };
    if (gram_formats[f].tpl == NULL)
        return st < 8 ? email_rest[st] : 0;
    uint32_t len = (uint32_t)strlen(gram_formats[f].tpl);
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
int gram_fmt_step(uint32_t f, uint32_t st, uint8_t prev, uint8_t b)
{
    const char *t = gram_formats[f].tpl;
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
