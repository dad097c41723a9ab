#include "rtr_req.h"

#include <assert.h>
#include <stdio.h>
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
