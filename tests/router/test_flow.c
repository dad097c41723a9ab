/* test_flow.c - the router's request life cycle (router/rtr_flow.c) driven
 * without evhttp or sockets: a recorder stands in for the client side and
 * the backend connections (rtr_flow_out_t), two backends sit in the real
 * backend table (rtr_ctl.c's pick / have), and the test feeds the messages
 * the daemons would send. Checks what the client sees, what goes upstream
 * (PREFILL_REQ, DECODE_REQ, CANCEL, RELEASE) and that each request ends
 * exactly once with the right counter. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "eng_chat.h"
#include "pd_blockname.h"
#include "pd_log.h"
#include "pd_time.h"
#include "rtr_flow.h"

/* ---- the recorder -------------------------------------------------------- */

#define MAX_SENT 32

typedef struct {
    uint16_t type;
    const rtr_backend_t *to;
    char id[PROTO_REQID_MAX + 1];
    uint32_t flags;                 /* DECODE_REQ */
    uint32_t n_generated;           /* DECODE_REQ */
    uint64_t lease_id;              /* DECODE_REQ, RELEASE */
    uint32_t kv_tokens;             /* DECODE_REQ */
    uint32_t n_fork;                /* DECODE_REQ */
    char target[PROTO_DAEMON_ID_MAX + 1]; /* MIGRATE: target; DECODE_REQ: KV peer;
                                             PREFILL_REQ: source peer (lease_id,
                                             kv_tokens: the source's);
                                             KV_EXPORT_REQ: the prefill
                                             (kv_tokens: min_tokens) */
} sent_t;

static struct {
    bool attached;
    bool opened, ended_stream, dropped;
    int reply_status;               /* 0: none */
    int n_ended, n_released, n_idle;
    char body[8192];                /* what the client got */
    size_t body_len;
    sent_t sent[MAX_SENT];
    int n_sent;
} rec;

static void body_add(const char *s, size_t n)
{
    if (rec.body_len + n < sizeof(rec.body)) {
        memcpy(rec.body + rec.body_len, s, n);
        rec.body_len += n;
        rec.body[rec.body_len] = '\0';
    }
}

static bool f_attached(const rtr_req_t *q) { (void)q; return rec.attached; }
static void f_open(rtr_req_t *q) { (void)q; rec.opened = true; }
static void f_write(rtr_req_t *q, const char *b, size_t n) { (void)q; body_add(b, n); }
static void f_end(rtr_req_t *q) { (void)q; rec.ended_stream = true; rec.attached = false; }
static bool f_slow(rtr_req_t *q) { (void)q; return false; }
static void f_drop(rtr_req_t *q) { (void)q; rec.dropped = true; rec.attached = false; }
static void f_ended(rtr_req_t *q) { (void)q; rec.n_ended++; }
static void f_release(rtr_req_t *q) { (void)q; rec.n_released++; }
static void f_idle(rtr_t *r) { (void)r; rec.n_idle++; }

static void f_reply(rtr_req_t *q, int status, const char *json, const rtr_oai_error_t *err)
{
    (void)q;
    rec.reply_status = err != NULL ? err->http_status : status;
    if (json != NULL)
        body_add(json, strlen(json));
    if (err != NULL)
        body_add(err->message, strlen(err->message));
    rec.attached = false;
}

static pd_status_t f_send(rtr_backend_t *be, proto_msg_t *m)
{
    if (be == NULL || be->conn == NULL)
        return PD_ERR_PEER_GONE;
    assert_true(rec.n_sent < MAX_SENT);
    sent_t *s = &rec.sent[rec.n_sent++];
    memset(s, 0, sizeof(*s));
    s->type = m->hdr.type;
    s->to = be;
    const char *id = "";
    switch (m->hdr.type) {
    case PROTO_MSG_PREFILL_REQ:
        id = m->u.prefill_req.request_id;
        s->lease_id = m->u.prefill_req.src_lease_id;
        s->kv_tokens = m->u.prefill_req.src_kv_tokens;
        snprintf(s->target, sizeof(s->target), "%s", m->u.prefill_req.src_peer_id);
        break;
    case PROTO_MSG_KV_EXPORT_REQ:
        id = m->u.kv_export_req.request_id;
        s->kv_tokens = m->u.kv_export_req.min_tokens;
        snprintf(s->target, sizeof(s->target), "%s", m->u.kv_export_req.target_prefill_id);
        break;
    case PROTO_MSG_DECODE_REQ:
        id = m->u.decode_req.request_id;
        s->flags = m->u.decode_req.flags;
        s->n_generated = m->u.decode_req.generated.n;
        s->lease_id = m->u.decode_req.lease_id;
        s->kv_tokens = m->u.decode_req.kv_tokens;
        s->n_fork = m->u.decode_req.n_fork;
        snprintf(s->target, sizeof(s->target), "%s", m->u.decode_req.prefill_peer_id);
        break;
    case PROTO_MSG_CANCEL: id = m->u.cancel.request_id; break;
    case PROTO_MSG_FIRST_TOKEN:
        id = m->u.first_token.request_id;
        s->n_generated = (uint32_t)m->u.first_token.first_token; /* the token */
        break;
    case PROTO_MSG_RELEASE:
        id = m->u.release.request_id;
        s->lease_id = m->u.release.lease_id;
        break;
    case PROTO_MSG_MIGRATE:
        id = m->u.migrate.request_id;
        snprintf(s->target, sizeof(s->target), "%s", m->u.migrate.target_decode_id);
        break;
    default: break;
    }
    snprintf(s->id, sizeof(s->id), "%s", id);
    return PD_OK;
}

static const rtr_flow_out_t fake_out = {
    .attached = f_attached, .stream_open = f_open, .write = f_write, .stream_end = f_end,
    .reply = f_reply, .slow = f_slow, .drop = f_drop, .ended = f_ended,
    .release = f_release, .idle = f_idle, .send = f_send,
};

/* ---- a router with one prefill and one decode ------------------------------- */

static const pd_stat_desc_t rtr_descs[] = { RTR_STATS(PD_STAT_DESC) };
static const pd_stats_table_t rtr_table = PD_STATS_TABLE("router", rtr_descs);
static const pd_stat_desc_t be_descs[] = { RTR_BE_STATS(PD_STAT_DESC) };
static const pd_stats_table_t be_table = PD_STATS_TABLE("router_backend", be_descs);

static int fake_conn;               /* stands in for a live connection */

typedef struct {
    rtr_t r;
    rtr_backend_t *pre, *dec;
} fx_t;

static void add_backend(rtr_t *r, rtr_backend_t *be, const char *id, uint16_t role,
                        uint32_t caps)
{
    be->used = true;
    snprintf(be->id, sizeof(be->id), "%s", id);
    be->role = role;
    be->caps = caps;
    be->state = RTR_BE_READY;
    be->admin_state = RTR_BE_READY;
    be->conn = (proto_conn_t *)&fake_conn;
    be->hb.free_blocks = 1000;
    be->hb.total_blocks = 1000;
    assert_int_equal(pd_stats_create(&be_table, (const char *[]){ "backend", id, NULL },
                                     &be->stats), PD_OK);
}

static int fx_setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    rtr_t *r = &f->r;
    memset(&rec, 0, sizeof(rec));
    r->cfg.max_retries = 2;
    r->cfg.request_timeout_ns = 600000000000ull;
    r->cfg.disagg_mode = RTR_DISAGG_ALWAYS;
    r->out = &fake_out;
    snprintf(r->model_name, sizeof(r->model_name), "test-model");
    assert_int_equal(eng_tok_create_byte(260, &r->tok), PD_OK);
    assert_int_equal(pd_stats_create(&rtr_table, NULL, &r->stats), PD_OK);
    assert_int_equal(pd_loop_create(&r->loop), PD_OK);
    r->base = pd_loop_base(r->loop);
    f->pre = &r->be[0];
    f->dec = &r->be[1];
    add_backend(r, f->pre, "p0", PROTO_ROLE_PREFILL, PROTO_CAP_PREFILL | PROTO_CAP_KV_EXPORT);
    add_backend(r, f->dec, "d0", PROTO_ROLE_DECODE,
                PROTO_CAP_DECODE | PROTO_CAP_PREFILL_LOCAL | PROTO_CAP_KV_IMPORT);
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    fx_t *f = *state;
    rtr_t *r = &f->r;
    rtr_flow_fail_all(r, "test over");
    pd_loop_destroy(r->loop);       /* runs the deferred frees */
    for (int i = 0; i < RTR_MAX_BACKENDS; i++)
        pd_stats_destroy(r->be[i].stats);
    pd_stats_destroy(r->stats);
    eng_tok_destroy(r->tok);
    free(f);
    return 0;
}

static uint64_t counter(const fx_t *f, rtr_stat_id_t id)
{
    return pd_stats_counter(f->r.stats, id);
}

/* Daemons see and answer to the router's wire id, never the client's id:
 * the test names requests by client id and maps them here. */
static struct { char cid[16]; char wid[PROTO_REQID_MAX + 1]; } wids[64];

static const char *W(const char *cid)
{
    for (size_t i = 0; i < sizeof(wids) / sizeof(wids[0]); i++)
        if (strcmp(wids[i].cid, cid) == 0)
            return wids[i].wid;
    return cid;
}

/* The API of the next accepted request (then back to completions). */
static rtr_api_t next_api = RTR_API_COMPLETIONS;

/* Accept one request ("Hi" as bytes) the way rtr_http.c does, on the
 * decode the router picks (*dec_p). */
static rtr_req_t *accept_on(fx_t *f, const char *id, bool stream, uint32_t max_tokens,
                            uint32_t n, rtr_backend_t **dec_p)
{
    rtr_oai_req_t o;
    memset(&o, 0, sizeof(o));
    rtr_api_t api = next_api;
    next_api = RTR_API_COMPLETIONS;
    o.api = api;
    o.max_tokens = max_tokens;
    o.top_p = 1.0f;
    o.stream = stream;
    o.n = n;
    int32_t *ids = malloc(2 * sizeof(*ids));
    assert_non_null(ids);
    ids[0] = 'H';
    ids[1] = 'i';
    rtr_backend_t *dec, *pre;
    bool disagg = rtr_flow_route(&f->r, ids, 2, max_tokens, 0, &dec, &pre);
    assert_non_null(dec);
    *dec_p = dec;
    rtr_req_t *q = NULL;
    assert_int_equal(rtr_flow_new(&f->r, id, api, &o, &ids, 2, &q), PD_OK);
    assert_null(ids);
    assert_string_not_equal(q->wire_id, id);  /* daemons never see the client's id */
    for (size_t i = 0; i < sizeof(wids) / sizeof(wids[0]); i++)
        if (wids[i].cid[0] == '\0' || strcmp(wids[i].cid, id) == 0) {
            snprintf(wids[i].cid, sizeof(wids[i].cid), "%s", id);
            snprintf(wids[i].wid, sizeof(wids[i].wid), "%s", q->wire_id);
            break;
        }
    rec.attached = true;
    rtr_flow_start(q, dec, disagg ? pre : NULL);
    return q;
}

/* ... on the decode the test expects, f->dec */
static rtr_req_t *accept_req_n(fx_t *f, const char *id, bool stream, uint32_t max_tokens,
                               uint32_t n)
{
    rtr_backend_t *dec;
    rtr_req_t *q = accept_on(f, id, stream, max_tokens, n, &dec);
    assert_ptr_equal(dec, f->dec);
    return q;
}

static rtr_req_t *accept_req(fx_t *f, const char *id, bool stream, uint32_t max_tokens)
{
    return accept_req_n(f, id, stream, max_tokens, 1);
}

static void deliver(fx_t *f, rtr_backend_t *from, proto_msg_t *m)
{
    rtr_flow_on_msg(&f->r, from, m);
}

static void prefill_done(fx_t *f, const char *id, int32_t token0, uint64_t lease)
{
    static uint8_t handle[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_PREFILL_DONE;
    snprintf(m.u.prefill_done.request_id, sizeof(m.u.prefill_done.request_id), "%s", W(id));
    m.u.prefill_done.first_token = token0;
    m.u.prefill_done.n_prompt_tokens = 2;
    m.u.prefill_done.lease_id = lease;
    m.u.prefill_done.kv_handle.p = handle;
    m.u.prefill_done.kv_handle.len = sizeof(handle);
    deliver(f, f->pre, &m);
}

static void tokens(fx_t *f, const char *id, uint32_t seq, const int32_t *t, uint32_t n)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_TOKENS;
    snprintf(m.u.tokens.request_id, sizeof(m.u.tokens.request_id), "%s", W(id));
    m.u.tokens.seq = seq;
    m.u.tokens.tokens.n = n;
    m.u.tokens.tokens.v = (int32_t *)t;
    deliver(f, f->dec, &m);
}

static void finish(fx_t *f, const char *id, uint16_t reason)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_FINISH;
    snprintf(m.u.finish.request_id, sizeof(m.u.finish.request_id), "%s", W(id));
    m.u.finish.reason = reason;
    deliver(f, f->dec, &m);
}

static void error_from(fx_t *f, rtr_backend_t *be, const char *id, pd_status_t st)
{
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_ERROR;
    snprintf(m.u.error.request_id, sizeof(m.u.error.request_id), "%s", W(id));
    m.u.error.status = st;
    snprintf(m.u.error.message, sizeof(m.u.error.message), "test");
    deliver(f, be, &m);
}

static const sent_t *last_sent(void)
{
    assert_true(rec.n_sent > 0);
    return &rec.sent[rec.n_sent - 1];
}

/* ---- tests ------------------------------------------------------------------ */

/* KV-aware routing through the flow: the router's index says prefill p1
 * holds the prompt's first block, so both requests go there although p0 is
 * as idle (round robin alone would alternate); the prefill's cached_tokens
 * reach usage.prompt_tokens_details. */
static void test_kv_routing(void **state)
{
    fx_t *f = *state;
    rtr_t *r = &f->r;
    rtr_backend_t *p1 = &r->be[2];
    add_backend(r, p1, "p1", PROTO_ROLE_PREFILL, PROTO_CAP_PREFILL | PROTO_CAP_KV_EXPORT);
    r->geom_fixed = true;
    r->geom.block_tokens = 1;
    r->compat_hash = 77;
    assert_int_equal(rtr_kvindex_create(16, 8, &r->kvidx), PD_OK);
    const int32_t hi[2] = { 'H', 'i' };
    uint64_t names[2];
    assert_int_equal(pd_block_names(1, 77, 0, hi, 2, names, 2), 2);
    assert_true(rtr_kvindex_add(r->kvidx, 2, names[0]));
    for (int i = 0; i < 2; i++) {
        const char *id = i == 0 ? "k1" : "k2";
        rtr_req_t *q = accept_req(f, id, false, 16);
        assert_int_equal(q->fsm.state, RTR_REQ_PREFILLING);
        assert_int_equal(last_sent()->type, PROTO_MSG_PREFILL_REQ);
        assert_ptr_equal(last_sent()->to, p1);
        proto_msg_t m;
        memset(&m, 0, sizeof(m));
        static uint8_t handle[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
        m.hdr.type = PROTO_MSG_PREFILL_DONE;
        snprintf(m.u.prefill_done.request_id, sizeof(m.u.prefill_done.request_id), "%s", W(id));
        m.u.prefill_done.first_token = 'O';
        m.u.prefill_done.n_prompt_tokens = 2;
        m.u.prefill_done.cached_tokens = 1;
        m.u.prefill_done.lease_id = 5;
        m.u.prefill_done.kv_handle = (proto_blob_t){ handle, sizeof(handle) };
        deliver(f, p1, &m);
        assert_int_equal(last_sent()->type, PROTO_MSG_DECODE_REQ);
        finish(f, id, PROTO_FINISH_LENGTH);
        assert_int_equal(rec.reply_status, 200);
        assert_non_null(strstr(rec.body, "\"prompt_tokens_details\":{\"cached_tokens\":1}"));
        rec.body_len = 0;
        rec.body[0] = '\0';
        rec.reply_status = 0;
    }
    assert_int_equal(counter(f, RTR_STAT_kv_route_prefill_hits), 2);
    assert_int_equal(counter(f, RTR_STAT_kv_route_hit_tokens), 2);
    assert_int_equal(counter(f, RTR_STAT_prompt_cached_tokens), 2);
    assert_int_equal(f->pre->assigned + p1->assigned, 0);
    /* p1 leaves: its names go with it, the next request may go to p0 */
    rtr_kvindex_clear_backend(r->kvidx, 2);
    p1->conn = NULL;
    (void)accept_req(f, "k3", false, 16);
    assert_ptr_equal(last_sent()->to, f->pre);
    assert_int_equal(counter(f, RTR_STAT_kv_route_prefill_hits), 2);
    rtr_kvindex_destroy(r->kvidx);
    r->kvidx = NULL;
}

/* ---- the prefill pulls a decode's cached prefix (KV_EXPORT_REQ) ---------- */

/* The index says d0 (exporting) holds the first block of "Hi" (1 token a
 * block), p0 nothing: a gain of 1 block, the threshold. */
static void src_setup(fx_t *f)
{
    rtr_t *r = &f->r;
    f->dec->caps |= PROTO_CAP_KV_EXPORT;
    r->cfg.kv_pull_min_blocks = 1;
    r->cfg.kv_export_timeout_ns = 600000000000ull;
    r->geom_fixed = true;
    r->geom.block_tokens = 1;
    r->compat_hash = 77;
    assert_int_equal(rtr_kvindex_create(16, 8, &r->kvidx), PD_OK);
    const int32_t hi[2] = { 'H', 'i' };
    uint64_t names[2];
    assert_int_equal(pd_block_names(1, 77, 0, hi, 2, names, 2), 2);
    assert_true(rtr_kvindex_add(r->kvidx, 1, names[0]));
}

static void src_teardown(fx_t *f)
{
    rtr_kvindex_destroy(f->r.kvidx);
    f->r.kvidx = NULL;
}

static void export_done(fx_t *f, rtr_backend_t *from, const char *id, uint32_t kv_tokens,
                        uint64_t lease)
{
    static uint8_t handle[8] = { 8, 7, 6, 5, 4, 3, 2, 1 };
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_KV_EXPORT_DONE;
    snprintf(m.u.kv_export_done.request_id, sizeof(m.u.kv_export_done.request_id), "%s", W(id));
    m.u.kv_export_done.kv_tokens = kv_tokens;
    m.u.kv_export_done.lease_id = lease;
    m.u.kv_export_done.lease_ns = 1000000000;
    m.u.kv_export_done.kv_handle = (proto_blob_t){ handle, sizeof(handle) };
    deliver(f, from, &m);
}

/* The decode exports, the PREFILL_REQ carries its handle, the request goes
 * on as usual; a second KV_EXPORT_DONE for it (late, duplicate) gets its
 * lease RELEASEd at once. */
static void test_src_export_ok(void **state)
{
    fx_t *f = *state;
    src_setup(f);
    rtr_req_t *q = accept_req(f, "x1", false, 16);
    assert_int_equal(q->fsm.state, RTR_REQ_EXPORTING);
    assert_int_equal(last_sent()->type, PROTO_MSG_KV_EXPORT_REQ);
    assert_ptr_equal(last_sent()->to, f->dec);
    assert_string_equal(last_sent()->target, "p0");
    assert_int_equal(last_sent()->kv_tokens, 1);            /* min_tokens: the gain */
    assert_int_equal(counter(f, RTR_STAT_kv_src_exports), 1);
    export_done(f, f->dec, "x1", 1, 42);
    assert_int_equal(q->fsm.state, RTR_REQ_PREFILLING);
    const sent_t *p = last_sent();
    assert_int_equal(p->type, PROTO_MSG_PREFILL_REQ);
    assert_ptr_equal(p->to, f->pre);
    assert_string_equal(p->target, "d0");
    assert_int_equal(p->lease_id, 42);
    assert_int_equal(p->kv_tokens, 1);
    assert_int_equal(counter(f, RTR_STAT_kv_src_used), 1);
    assert_int_equal(counter(f, RTR_STAT_kv_src_tokens), 1);
    export_done(f, f->dec, "x1", 1, 43);                     /* stale */
    assert_int_equal(last_sent()->type, PROTO_MSG_RELEASE);
    assert_ptr_equal(last_sent()->to, f->dec);
    assert_int_equal(last_sent()->lease_id, 43);
    prefill_done(f, "x1", 'O', 5);
    assert_int_equal(last_sent()->type, PROTO_MSG_DECODE_REQ);
    finish(f, "x1", PROTO_FINISH_LENGTH);
    assert_int_equal(rec.reply_status, 200);
    assert_int_equal(rec.n_ended, 1);
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 1);
    assert_int_equal(f->pre->assigned + f->dec->assigned, 0);
    /* off: a plain PREFILL_REQ */
    f->r.cfg.kv_pull_min_blocks = 0;
    q = accept_req(f, "x2", false, 16);
    assert_int_equal(q->fsm.state, RTR_REQ_PREFILLING);
    assert_int_equal(last_sent()->type, PROTO_MSG_PREFILL_REQ);
    assert_string_equal(last_sent()->target, "");
    src_teardown(f);
}

/* The decode has too little cached (ERROR): a plain PREFILL_REQ, and the
 * request is served. An export covering the whole prompt is refused too
 * (RELEASEd). */
static void test_src_export_refused(void **state)
{
    fx_t *f = *state;
    src_setup(f);
    rtr_req_t *q = accept_req(f, "x1", false, 16);
    assert_int_equal(q->fsm.state, RTR_REQ_EXPORTING);
    error_from(f, f->dec, "x1", PD_ERR_NOT_FOUND);
    assert_int_equal(q->fsm.state, RTR_REQ_PREFILLING);
    assert_int_equal(last_sent()->type, PROTO_MSG_PREFILL_REQ);
    assert_string_equal(last_sent()->target, "");
    assert_int_equal(counter(f, RTR_STAT_kv_src_refused), 1);
    prefill_done(f, "x1", 'O', 5);
    finish(f, "x1", PROTO_FINISH_LENGTH);
    assert_int_equal(rec.reply_status, 200);
    q = accept_req(f, "x2", false, 16);
    export_done(f, f->dec, "x2", 2, 44);                     /* the whole prompt */
    assert_int_equal(rec.sent[rec.n_sent - 2].type, PROTO_MSG_RELEASE);
    assert_int_equal(rec.sent[rec.n_sent - 2].lease_id, 44);
    assert_int_equal(last_sent()->type, PROTO_MSG_PREFILL_REQ);
    assert_string_equal(last_sent()->target, "");
    assert_int_equal(counter(f, RTR_STAT_kv_src_refused), 2);
    src_teardown(f);
}

/* The exporting decode is lost: the prefill goes ahead without a source;
 * its target decode is the lost one, so after PREFILL_DONE the request
 * goes decode-local on the other decode. Ends once. An unanswered export
 * times out the same way. */
static void test_src_decode_lost(void **state)
{
    fx_t *f = *state;
    rtr_t *r = &f->r;
    src_setup(f);
    rtr_backend_t *d1 = &r->be[2];
    add_backend(r, d1, "d1", PROTO_ROLE_DECODE,
                PROTO_CAP_DECODE | PROTO_CAP_PREFILL_LOCAL | PROTO_CAP_KV_IMPORT);
    rtr_req_t *q = accept_req(f, "x1", false, 16);
    assert_int_equal(q->fsm.state, RTR_REQ_EXPORTING);
    f->dec->conn = NULL;
    rtr_flow_backend_down(r, f->dec);
    assert_int_equal(q->fsm.state, RTR_REQ_PREFILLING);
    assert_int_equal(last_sent()->type, PROTO_MSG_PREFILL_REQ);
    assert_int_equal(counter(f, RTR_STAT_kv_src_timeouts), 1);
    prefill_done(f, "x1", 'O', 5);
    assert_int_equal(last_sent()->type, PROTO_MSG_DECODE_REQ);
    assert_ptr_equal(last_sent()->to, d1);
    assert_true(last_sent()->flags & PROTO_DEC_PREFILL_LOCALLY);
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_FINISH;
    snprintf(m.u.finish.request_id, sizeof(m.u.finish.request_id), "%s", W("x1"));
    m.u.finish.reason = PROTO_FINISH_LENGTH;
    deliver(f, d1, &m);
    assert_int_equal(rec.reply_status, 200);
    assert_int_equal(rec.n_ended, 1);
    assert_int_equal(f->pre->assigned + f->dec->assigned + d1->assigned, 0);
    /* timeout: d0 back, no answer within kv-export-timeout */
    f->dec->conn = (proto_conn_t *)&fake_conn;
    r->cfg.kv_export_timeout_ns = 1000000; /* 1 ms */
    rec.reply_status = 0;
    q = accept_req(f, "x2", false, 16);
    assert_int_equal(q->fsm.state, RTR_REQ_EXPORTING);
    for (int i = 0; i < 100 && q->fsm.state == RTR_REQ_EXPORTING; i++)
        assert_int_equal(event_base_loop(r->base, EVLOOP_ONCE), 0); /* deferred frees, then the timer */
    assert_int_equal(q->fsm.state, RTR_REQ_PREFILLING);
    assert_int_equal(last_sent()->type, PROTO_MSG_PREFILL_REQ);
    assert_string_equal(last_sent()->target, "");
    assert_int_equal(counter(f, RTR_STAT_kv_src_timeouts), 2);
    export_done(f, f->dec, "x2", 1, 45);                     /* late: released */
    assert_int_equal(last_sent()->type, PROTO_MSG_RELEASE);
    assert_int_equal(last_sent()->lease_id, 45);
    /* the prefill is lost while exporting: decode-local, the late export
     * released */
    r->cfg.kv_export_timeout_ns = 600000000000ull;
    q = accept_req(f, "x3", false, 16);
    assert_int_equal(q->fsm.state, RTR_REQ_EXPORTING);
    f->pre->conn = NULL;
    rtr_flow_backend_down(r, f->pre);
    assert_int_equal(q->fsm.state, RTR_REQ_DECODING);
    assert_true(last_sent()->flags & PROTO_DEC_PREFILL_LOCALLY);
    export_done(f, f->dec, "x3", 1, 46);
    assert_int_equal(last_sent()->type, PROTO_MSG_RELEASE);
    assert_int_equal(last_sent()->lease_id, 46);
    src_teardown(f);
}

/* The client leaves while the decode exports: the request ends once; the
 * export that comes after is RELEASEd to the decode. */
static void test_src_client_gone(void **state)
{
    fx_t *f = *state;
    src_setup(f);
    rtr_req_t *q = accept_req(f, "x1", true, 16);
    assert_int_equal(q->fsm.state, RTR_REQ_EXPORTING);
    int sent = rec.n_sent;
    rtr_flow_client_gone(q, "test");
    assert_int_equal(rec.n_ended, 1);
    assert_int_equal(rec.n_sent, sent); /* nothing to cancel upstream yet */
    assert_int_equal(counter(f, RTR_STAT_requests_canceled), 1);
    assert_int_equal(f->pre->assigned + f->dec->assigned, 0);
    export_done(f, f->dec, "x1", 1, 47);
    assert_int_equal(last_sent()->type, PROTO_MSG_RELEASE);
    assert_ptr_equal(last_sent()->to, f->dec);
    assert_int_equal(last_sent()->lease_id, 47);
    assert_int_equal(rec.n_ended, 1);
    src_teardown(f);
}

/* PREFILL_REQ -> PREFILL_DONE (token 0 streamed, DECODE_REQ with the lease)
 * -> TOKENS -> FINISH: one stream, [DONE], COMPLETED. */
static void test_disaggregated_stream(void **state)
{
    fx_t *f = *state;
    rtr_req_t *q = accept_req(f, "r1", true, 16);
    assert_int_equal(q->fsm.state, RTR_REQ_PREFILLING);
    assert_int_equal(last_sent()->type, PROTO_MSG_PREFILL_REQ);
    assert_ptr_equal(last_sent()->to, f->pre);
    assert_int_equal(f->pre->assigned, 1);

    prefill_done(f, "r1", 'O', 77);
    assert_true(rec.opened);
    assert_non_null(strstr(rec.body, "\"O\""));
    const sent_t *s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_DECODE_REQ);
    assert_ptr_equal(s->to, f->dec);
    assert_int_equal(s->flags & PROTO_DEC_PREFILL_LOCALLY, 0);
    assert_int_equal(s->n_generated, 1);
    assert_int_equal(s->lease_id, 77);
    assert_false(q->lease_held);
    assert_int_equal(q->fsm.state, RTR_REQ_DECODING);

    int32_t t[2] = { 'k', '!' };
    tokens(f, "r1", 0, t, 2);
    assert_non_null(strstr(rec.body, "\"k!\""));
    finish(f, "r1", PROTO_FINISH_LENGTH);
    assert_null(rtr_flow_find(&f->r, W("r1")));
    assert_true(rec.ended_stream);
    assert_non_null(strstr(rec.body, "\"finish_reason\":\"length\""));
    assert_non_null(strstr(rec.body, "data: [DONE]\n\n"));
    assert_int_equal(rec.n_ended, 1);
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 1);
    assert_int_equal(counter(f, RTR_STAT_requests_failed), 0);
    assert_int_equal(f->pre->assigned + f->dec->assigned, 0);
    assert_int_equal(f->r.n_reqs, 0);
}

/* disagg-mode=cost learns its rates from what daemons report: prefill
 * time per computed token (PREFILL_DONE), pull time per pulled token and a
 * decode-local prefill's time per computed token (FINISH); then routes by
 * them (here a 2-token prompt, under any threshold, is disaggregated
 * because the decode measured 1 ms/token against the prefill's 10 us). */
static void test_cost_mode_measures(void **state)
{
    fx_t *f = *state;
    f->r.cfg.disagg_mode = RTR_DISAGG_COST;
    f->r.cfg.disagg_threshold = 32;
    rtr_backend_t *dec, *pre;
    int32_t ids[2] = { 'H', 'i' };
    assert_false(rtr_flow_route(&f->r, ids, 2, 16, 0, &dec, &pre)); /* unmeasured: threshold */
    assert_null(pre);
    /* a disaggregated request: 400 tokens, 64 cached, 3.36 ms of prefill */
    f->r.cfg.disagg_mode = RTR_DISAGG_ALWAYS;
    rtr_req_t *q = accept_req(f, "c1", false, 16);
    assert_int_equal(q->fsm.state, RTR_REQ_PREFILLING);
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    static uint8_t handle[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    m.hdr.type = PROTO_MSG_PREFILL_DONE;
    snprintf(m.u.prefill_done.request_id, sizeof(m.u.prefill_done.request_id), "%s", W("c1"));
    m.u.prefill_done.first_token = 'O';
    m.u.prefill_done.n_prompt_tokens = 400;
    m.u.prefill_done.cached_tokens = 64;
    m.u.prefill_done.prefill_ns = 3360000;
    m.u.prefill_done.lease_id = 5;
    m.u.prefill_done.kv_handle.p = handle;
    m.u.prefill_done.kv_handle.len = sizeof(handle);
    deliver(f, f->pre, &m);
    assert_true(f->r.cost.pf_tok_ns == 10000.0);
    assert_true(f->r.cost.hop_ns >= 0);
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_FINISH;
    snprintf(m.u.finish.request_id, sizeof(m.u.finish.request_id), "%s", W("c1"));
    m.u.finish.reason = PROTO_FINISH_LENGTH;
    m.u.finish.prompt_tokens = 400;
    m.u.finish.cached_tokens = 80;      /* the decode pulled 320 */
    m.u.finish.transfer_ns = 640000;
    deliver(f, f->dec, &m);
    assert_true(f->r.cost.pull_tok_ns == 2000.0);
    assert_true(f->r.cost.dec_tok_ns == 0);
    /* a decode-local one (disagg-mode never for it): 100 computed, 100 ms */
    f->r.cfg.disagg_mode = RTR_DISAGG_NEVER;
    accept_req(f, "c2", false, 16);
    assert_int_equal(last_sent()->type, PROTO_MSG_DECODE_REQ);
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_FINISH;
    snprintf(m.u.finish.request_id, sizeof(m.u.finish.request_id), "%s", W("c2"));
    m.u.finish.reason = PROTO_FINISH_LENGTH;
    m.u.finish.prompt_tokens = 100;
    m.u.finish.prefill_ns = 100000000;
    deliver(f, f->dec, &m);
    assert_true(f->r.cost.dec_tok_ns == 1000000.0);
    f->r.cfg.disagg_mode = RTR_DISAGG_COST;
    f->r.cost.hop_ns = 100000; /* 0.1 ms: the loop above is instant */
    /* now: local 2 x 1 ms = 2 ms > (2 x 10 us + 2 x 2 us + 0.1 ms) */
    assert_true(rtr_flow_route(&f->r, ids, 2, 16, 0, &dec, &pre));
    assert_ptr_equal(pre, f->pre);
    /* a slow hop (5 ms) makes the decode the cheaper place */
    f->r.cost.hop_ns = 5e6;
    assert_false(rtr_flow_route(&f->r, ids, 2, 16, 0, &dec, &pre));
    assert_null(pre);
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 2);
}

/* A prefill ERROR: retried decode-local on the decode (generated empty),
 * then a non-streamed reply with the whole text. */
static void test_prefill_error_retries_local(void **state)
{
    fx_t *f = *state;
    rtr_req_t *q = accept_req(f, "r2", false, 16);
    error_from(f, f->pre, "r2", PD_ERR_OVERLOADED);
    const sent_t *s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_DECODE_REQ);
    assert_ptr_equal(s->to, f->dec);
    assert_int_equal(s->flags & PROTO_DEC_PREFILL_LOCALLY, PROTO_DEC_PREFILL_LOCALLY);
    assert_int_equal(s->n_generated, 0);
    assert_int_equal(q->fsm.state, RTR_REQ_DECODING);
    assert_int_equal(counter(f, RTR_STAT_requests_retried), 1);

    int32_t t[3] = { 'o', 'k', '.' };
    tokens(f, "r2", 0, t, 3);
    assert_false(rec.opened);           /* not streamed */
    finish(f, "r2", PROTO_FINISH_STOP);
    assert_int_equal(rec.reply_status, 200);
    assert_non_null(strstr(rec.body, "\"text\":\"ok.\""));
    assert_non_null(strstr(rec.body, "\"finish_reason\":\"stop\""));
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 1);
}

/* The only decode dies after streaming: no decode is left to fail over to,
 * so an error frame mid-stream that says so, FAILED. */
static void test_decode_down_mid_stream(void **state)
{
    fx_t *f = *state;
    accept_req(f, "r3", true, 16);
    prefill_done(f, "r3", 'a', 1);
    int32_t t[1] = { 'b' };
    tokens(f, "r3", 0, t, 1);
    f->dec->conn = NULL;
    f->dec->state = RTR_BE_DOWN;
    rtr_flow_backend_down(&f->r, f->dec);
    assert_null(rtr_flow_find(&f->r, W("r3")));
    assert_true(rec.ended_stream);
    assert_non_null(strstr(rec.body, "no decode daemon available"));
    assert_non_null(strstr(rec.body, "'d0' lost"));
    assert_null(strstr(rec.body, "[DONE]"));
    assert_int_equal(counter(f, RTR_STAT_requests_failed), 1);
    assert_int_equal(counter(f, RTR_STAT_requests_failed_over), 0);
    assert_int_equal(rec.n_ended, 1);
}

/* Failover: the decode dies after streaming "ab"; the stream moves to the
 * other decode (decode-local, generated = the 2 tokens streamed), the lease
 * is released on the prefill, the new decode's tokens continue the stream
 * (seq from 0 again), one [DONE], COMPLETED, nothing repeated. */
static void test_decode_failover_mid_stream(void **state)
{
    fx_t *f = *state;
    rtr_backend_t *d1 = &f->r.be[2];
    add_backend(&f->r, d1, "d1", PROTO_ROLE_DECODE,
                PROTO_CAP_DECODE | PROTO_CAP_PREFILL_LOCAL | PROTO_CAP_KV_IMPORT);
    d1->hb.free_blocks = 10; /* d0 is the policy's pick at acceptance */
    rtr_req_t *q = accept_req(f, "r3f", true, 16);
    prefill_done(f, "r3f", 'a', 5);
    int32_t t[1] = { 'b' };
    tokens(f, "r3f", 0, t, 1);
    f->dec->conn = NULL;
    f->dec->state = RTR_BE_DOWN;
    int sent0 = rec.n_sent;
    rtr_flow_backend_down(&f->r, f->dec);
    assert_non_null(rtr_flow_find(&f->r, W("r3f")));
    assert_false(rec.ended_stream);
    assert_int_equal(rec.n_sent, sent0 + 2);
    assert_int_equal(rec.sent[sent0].type, PROTO_MSG_RELEASE); /* the unpulled lease */
    assert_ptr_equal(rec.sent[sent0].to, f->pre);
    assert_int_equal(rec.sent[sent0].lease_id, 5);
    const sent_t *s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_DECODE_REQ);
    assert_ptr_equal(s->to, d1);
    assert_true(s->flags & PROTO_DEC_PREFILL_LOCALLY);
    assert_int_equal(s->n_generated, 2);
    assert_ptr_equal(q->decode, d1);
    assert_int_equal(counter(f, RTR_STAT_requests_failed_over), 1);
    assert_null(strstr(rec.body, "error"));
    /* late tokens from the dead decode are stale */
    rtr_backend_t *d0 = f->dec;
    int32_t late[1] = { 'X' };
    tokens(f, "r3f", 1, late, 1);
    f->dec = d1;
    int32_t more[2] = { 'c', 'd' };
    tokens(f, "r3f", 0, more, 2);
    finish(f, "r3f", PROTO_FINISH_LENGTH);
    f->dec = d0;
    assert_null(rtr_flow_find(&f->r, W("r3f")));
    assert_true(rec.ended_stream);
    assert_null(strstr(rec.body, "\"X\""));
    const char *pa = strstr(rec.body, "\"a\""), *pb = strstr(rec.body, "\"b\""),
               *pc = strstr(rec.body, "\"cd\"");
    if (!(pa && pb && pc && pa < pb && pb < pc))
        fail_msg("stream out of order: %s", rec.body);
    assert_non_null(strstr(rec.body, "[DONE]"));
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 1);
    assert_int_equal(counter(f, RTR_STAT_requests_failed), 0);
    assert_int_equal(rec.n_ended, 1);
}

/* Failover is bounded: with max-retries 0 a lost decode ends the stream
 * with an error frame even when another decode is up. */
static void test_decode_failover_bounded(void **state)
{
    fx_t *f = *state;
    add_backend(&f->r, &f->r.be[2], "d1", PROTO_ROLE_DECODE,
                PROTO_CAP_DECODE | PROTO_CAP_PREFILL_LOCAL | PROTO_CAP_KV_IMPORT);
    f->r.be[2].hb.free_blocks = 10;
    f->r.cfg.max_retries = 0;
    accept_req(f, "r3b", true, 16);
    prefill_done(f, "r3b", 'a', 6);
    f->dec->conn = NULL;
    f->dec->state = RTR_BE_DOWN;
    rtr_flow_backend_down(&f->r, f->dec);
    assert_null(rtr_flow_find(&f->r, W("r3b")));
    assert_non_null(strstr(rec.body, "after 0 retries"));
    assert_int_equal(counter(f, RTR_STAT_requests_failed), 1);
    assert_int_equal(counter(f, RTR_STAT_requests_failed_over), 0);
}

static void migrate_done(fx_t *f, rtr_backend_t *from, const char *id, uint32_t n_gen,
                         uint32_t kv_tokens, uint64_t lease)
{
    static uint8_t handle[8] = { 8, 7, 6, 5, 4, 3, 2, 1 };
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_MIGRATE_DONE;
    snprintf(m.u.migrate_done.request_id, sizeof(m.u.migrate_done.request_id), "%s", W(id));
    m.u.migrate_done.n_gen = n_gen;
    m.u.migrate_done.kv_tokens = kv_tokens;
    m.u.migrate_done.lease_id = lease;
    m.u.migrate_done.kv_handle.p = handle;
    m.u.migrate_done.kv_handle.len = sizeof(handle);
    deliver(f, from, &m);
}

/* Live migration: draining d0 sends it MIGRATE (target d1); its
 * MIGRATE_DONE (after "ab") becomes a DECODE_REQ to d1 with d0's handle,
 * kv_tokens and the 2 streamed tokens; late TOKENS from d0 are stale, d1's
 * continue the stream; one [DONE], COMPLETED, counted as migrated, not
 * failed over. */
static void test_live_migration(void **state)
{
    fx_t *f = *state;
    rtr_backend_t *d0 = f->dec, *d1 = &f->r.be[2];
    add_backend(&f->r, d1, "d1", PROTO_ROLE_DECODE,
                PROTO_CAP_DECODE | PROTO_CAP_PREFILL_LOCAL | PROTO_CAP_KV_IMPORT);
    d1->hb.free_blocks = 10; /* d0 is the policy's pick at acceptance */
    rtr_req_t *q = accept_req(f, "m1", true, 16);
    prefill_done(f, "m1", 'a', 5);
    int32_t t[1] = { 'b' };
    tokens(f, "m1", 0, t, 1);
    assert_int_equal(rtr_flow_migrate_from(&f->r, d0), 1);
    const sent_t *s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_MIGRATE);
    assert_ptr_equal(s->to, d0);
    assert_string_equal(s->target, "d1");
    assert_int_equal(rtr_flow_migrate_from(&f->r, d0), 0); /* asked once */
    assert_int_equal(q->migrate_kv, 3);     /* prompt 2 + generated 2 - 1 */
    assert_true(f->r.cost.move_tok_ns == 0);
    migrate_done(f, d0, "m1", 2, 3, 77);
    s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_DECODE_REQ);
    assert_ptr_equal(s->to, d1);
    assert_int_equal(s->flags, 0);
    assert_int_equal(s->n_generated, 2);
    assert_int_equal(s->lease_id, 77);
    assert_int_equal(s->kv_tokens, 3);
    assert_string_equal(s->target, "d0");
    assert_ptr_equal(q->decode, d1);
    int32_t late[1] = { 'X' };
    tokens(f, "m1", 1, late, 1);            /* from d0: stale */
    f->dec = d1;
    int32_t more[2] = { 'c', 'd' };
    tokens(f, "m1", 0, more, 2);
    finish(f, "m1", PROTO_FINISH_LENGTH);
    f->dec = d0;
    assert_null(rtr_flow_find(&f->r, W("m1")));
    assert_null(strstr(rec.body, "\"X\""));
    assert_non_null(strstr(rec.body, "\"cd\""));
    assert_non_null(strstr(rec.body, "[DONE]"));
    assert_int_equal(counter(f, RTR_STAT_requests_migrated), 1);
    assert_int_equal(counter(f, RTR_STAT_requests_failed_over), 0);
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 1);
    assert_int_equal(d1->assigned, 0);
    assert_int_equal(d0->assigned, 0);
    /* the move's stall, per KV token it pulled, is measured */
    assert_true(f->r.cost.move_tok_ns > 0);
}

/* The drain tests' second decode d1 (r.be[2]) with free_blocks free; KV
 * geometry fixed at one token a block, so a request of n tokens needs n. */
static rtr_backend_t *drain_target(fx_t *f, uint32_t free_blocks)
{
    rtr_backend_t *d1 = &f->r.be[2];
    f->r.geom_fixed = true;
    f->r.geom.block_tokens = 1;
    add_backend(&f->r, d1, "d1", PROTO_ROLE_DECODE,
                PROTO_CAP_DECODE | PROTO_CAP_PREFILL_LOCAL | PROTO_CAP_KV_IMPORT);
    d1->hb.free_blocks = free_blocks;
    return d1;
}

/* A draining decode keeps a nearly done stream: 2 tokens left at a 10 ms
 * step (20 ms) stay while a move (its KV pulled) would take as long; the
 * same stream moves when no pull rate is measured yet or the pull is
 * cheaper. Counted as kept; kept or asked, it can end where it is. */
static void test_drain_keeps_nearly_done(void **state)
{
    fx_t *f = *state;
    rtr_backend_t *d0 = f->dec, *d1 = drain_target(f, 100);
    rtr_req_t *q = accept_req(f, "k1", true, 16);
    prefill_done(f, "k1", 'a', 5);
    int32_t t[13];
    for (int i = 0; i < 13; i++)
        t[i] = 'b' + i;
    tokens(f, "k1", 0, t, 13);
    assert_int_equal(q->n_gen, 14);
    q->t_last_tok_ns = q->t_tok1_ns + 12 * 10000000ull; /* a 10 ms step */
    double kv = q->n_prompt + q->n_gen - 1;             /* what a move pulls */
    f->r.cost.hop_ns = 0;
    f->r.cost.move_tok_ns = 0;                          /* no move measured */
    f->r.cost.pull_tok_ns = 20e6 / kv;                  /* the move: 20 ms */
    int sent0 = rec.n_sent;
    assert_int_equal(rtr_flow_migrate_from(&f->r, d0), 0);
    assert_int_equal(rec.n_sent, sent0);                /* no MIGRATE */
    assert_null(q->migrate_to);
    assert_int_equal(counter(f, RTR_STAT_requests_kept_on_drain), 1);
    f->r.cost.pull_tok_ns = 0;                          /* unmeasured: it moves */
    assert_int_equal(rtr_flow_migrate_from(&f->r, d0), 1);
    assert_int_equal(last_sent()->type, PROTO_MSG_MIGRATE);
    assert_ptr_equal(q->migrate_to, d1);
    assert_int_equal(counter(f, RTR_STAT_requests_kept_on_drain), 1);
    /* the old decode ends it before it acts on MIGRATE: done, d1 let go */
    int32_t last[2] = { 'x', 'y' };
    tokens(f, "k1", 1, last, 2);
    finish(f, "k1", PROTO_FINISH_LENGTH);
    assert_null(rtr_flow_find(&f->r, W("k1")));
    assert_non_null(strstr(rec.body, "[DONE]"));
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 1);
    assert_int_equal(counter(f, RTR_STAT_requests_migrated), 0);
    assert_int_equal(d0->assigned, 0);
    assert_int_equal(d1->assigned, 0);
    /* a cheaper pull (19 ms) moves a second such stream */
    q = accept_req(f, "k2", true, 16);
    prefill_done(f, "k2", 'a', 6);
    tokens(f, "k2", 0, t, 13);
    q->t_last_tok_ns = q->t_tok1_ns + 12 * 10000000ull;
    f->r.cost.pull_tok_ns = 19e6 / kv;
    assert_int_equal(rtr_flow_migrate_from(&f->r, d0), 1);
    assert_ptr_equal(q->migrate_to, d1);
}

/* Moves go only where there is room: d1 has room for one of d0's two
 * streams (18 blocks each); the other stays and is counted once, however
 * often the drain is looked at again (each heartbeat of d0), while the
 * first move is still promised d1's blocks; once d1 has room it moves.
 * The router's view of d1's free blocks is left as its heartbeat said. */
static void test_drain_moves_only_with_room(void **state)
{
    fx_t *f = *state;
    rtr_backend_t *d0 = f->dec, *d1 = drain_target(f, 20);
    rtr_req_t *a = accept_req(f, "w1", true, 16), *b = accept_req(f, "w2", true, 16);
    prefill_done(f, "w1", 'a', 5);
    prefill_done(f, "w2", 'a', 6);
    assert_int_equal(rtr_flow_migrate_from(&f->r, d0), 1);
    rtr_req_t *moved = a->migrate_to != NULL ? a : b, *stays = moved == a ? b : a;
    assert_ptr_equal(moved->migrate_to, d1);
    assert_null(stays->migrate_to);
    assert_int_equal(counter(f, RTR_STAT_requests_kept_on_drain), 1);
    assert_int_equal(d1->hb.free_blocks, 20);
    assert_int_equal(rtr_flow_migrate_from(&f->r, d0), 0); /* w1's 18 still promised */
    assert_int_equal(counter(f, RTR_STAT_requests_kept_on_drain), 1);
    d1->hb.free_blocks = 40;
    assert_int_equal(rtr_flow_migrate_from(&f->r, d0), 1);
    assert_ptr_equal(stays->migrate_to, d1);
    assert_int_equal(counter(f, RTR_STAT_requests_kept_on_drain), 1);
}

/* A target's room is what the router can know: its heartbeat's free
 * blocks less a DECODE_REQ sent after that heartbeat, and none while it
 * queues requests. x1 (18 blocks) went to d1 after d1's last heartbeat,
 * which says 30 free: 12 left, d0's w1 (18) stays; the same while d1
 * queues; a heartbeat after x1 (it shows x1's blocks): w1 moves. */
static void test_drain_room_as_known(void **state)
{
    fx_t *f = *state;
    rtr_backend_t *d0 = f->dec, *d1 = drain_target(f, 2000); /* the pick for x1 */
    f->dec = d1;
    rtr_req_t *x = accept_req(f, "x1", true, 16);
    prefill_done(f, "x1", 'a', 5);
    assert_int_equal(last_sent()->type, PROTO_MSG_DECODE_REQ);
    assert_ptr_equal(x->decode, d1);
    f->dec = d0;
    d1->hb.free_blocks = 10; /* d0 the pick for w1 */
    rtr_req_t *w = accept_req(f, "w1", true, 16);
    prefill_done(f, "w1", 'a', 6);
    d1->last_hb_ns = 1;      /* before x1's DECODE_REQ */
    d1->hb.free_blocks = 30;
    assert_int_equal(rtr_flow_migrate_from(&f->r, d0), 0);
    assert_null(w->migrate_to);
    d1->last_hb_ns = pd_now_ns() + 1; /* x1 in it now (+1: after it on a coarse clock) */
    d1->hb.queue_depth = 1;
    assert_int_equal(rtr_flow_migrate_from(&f->r, d0), 0);
    assert_int_equal(d1->hb.free_blocks, 30);
    d1->hb.queue_depth = 0;
    assert_int_equal(rtr_flow_migrate_from(&f->r, d0), 1);
    assert_ptr_equal(w->migrate_to, d1);
    assert_int_equal(counter(f, RTR_STAT_requests_kept_on_drain), 1);
}

/* A burst between two heartbeats spreads by the room the router knows
 * (the heartbeat's free blocks less the streams handed since): d0 said 100
 * free, d1 90, and four 40-block streams go d0, d1, d0, d1 (by the
 * heartbeats alone all four went to d0). A decode that queues has no room:
 * the next goes to the other. A heartbeat after the DECODE_REQs holds
 * their blocks: only streams not yet sent count then. */
static void test_burst_spreads(void **state)
{
    fx_t *f = *state;
    rtr_backend_t *d0 = f->dec, *d1 = drain_target(f, 90), *got;
    d0->hb.free_blocks = 100;
    const rtr_backend_t *want[4] = { d0, d1, d0, d1 };
    const char *ids[4] = { "b1", "b2", "b3", "b4" };
    for (int i = 0; i < 4; i++) {
        accept_on(f, ids[i], true, 38, 1, &got); /* 2 + 38 tokens: 40 blocks */
        assert_ptr_equal(got, want[i]);
    }
    /* both full now (d0 20, d1 10 left): the most room */
    accept_on(f, "b5", true, 38, 1, &got);
    assert_ptr_equal(got, d0);
    d0->hb.queue_depth = 1;
    accept_on(f, "b6", true, 8, 1, &got);
    assert_ptr_equal(got, d1);
    d0->hb.queue_depth = 0;
    /* b1's DECODE_REQ is sent, then d0 heartbeats 100 free and one
     * running (b1, whose blocks that figure holds) and d1 60: d0 has
     * 100 - b3 - b5 = 20 left for b7's 10, d1 60 - b2 - b4 - b6 = none
     * (b1 counted twice, neither had room and d0 runs more: d1) */
    prefill_done(f, "b1", 'a', 1);
    assert_int_equal(last_sent()->type, PROTO_MSG_DECODE_REQ);
    assert_ptr_equal(last_sent()->to, d0);
    d0->last_hb_ns = pd_now_ns() + 1; /* after b1 even on a coarse clock */
    d0->hb.running_seqs = 1;
    d1->hb.free_blocks = 60;
    accept_on(f, "b7", true, 8, 1, &got);
    assert_ptr_equal(got, d0);
}

/* The same for prefills: p0 said 100 outstanding prompt tokens, p1 101,
 * and three 2-token prompts go p0, p1, p0 (by the heartbeats alone all to
 * p0): the prompts sent since count. A heartbeat after them holds them. */
static void test_burst_spreads_prefills(void **state)
{
    fx_t *f = *state;
    rtr_backend_t *p0 = f->pre, *p1 = &f->r.be[3], *got;
    add_backend(&f->r, p1, "p1", PROTO_ROLE_PREFILL, PROTO_CAP_PREFILL | PROTO_CAP_KV_EXPORT);
    p0->hb.outstanding_prefill_tokens = 100;
    p1->hb.outstanding_prefill_tokens = 101;
    rtr_req_t *a = accept_on(f, "c1", true, 8, 1, &got);
    rtr_req_t *b = accept_on(f, "c2", true, 8, 1, &got);
    rtr_req_t *c = accept_on(f, "c3", true, 8, 1, &got);
    assert_ptr_equal(a->prefill, p0);
    assert_ptr_equal(b->prefill, p1);
    assert_ptr_equal(c->prefill, p0);
    /* p0 heartbeats 104 (c1, c3 in it): p1's 101 + c2 = 103 is less */
    p0->last_hb_ns = pd_now_ns() + 1; /* after c1, c3 even on a coarse clock */
    p0->hb.outstanding_prefill_tokens = 104;
    rtr_req_t *d = accept_on(f, "c4", true, 8, 1, &got);
    assert_ptr_equal(d->prefill, p1);
    /* ... and 102 once they are done: p0 (102 < 103 + c4 = 105) */
    p0->hb.outstanding_prefill_tokens = 102;
    rtr_req_t *e = accept_on(f, "c5", true, 8, 1, &got);
    assert_ptr_equal(e->prefill, p0);
}

/* Migration edge cases: no other decode -> nothing asked; a MIGRATE_DONE
 * whose token count disagrees -> RELEASE to the old decode and failover;
 * a MIGRATE_DONE for a gone request -> RELEASE. */
static void test_migration_edges(void **state)
{
    fx_t *f = *state;
    rtr_backend_t *d0 = f->dec, *d1 = &f->r.be[2];
    accept_req(f, "m2", true, 16);
    prefill_done(f, "m2", 'a', 5);
    assert_int_equal(rtr_flow_migrate_from(&f->r, d0), 0); /* nowhere to go */
    add_backend(&f->r, d1, "d1", PROTO_ROLE_DECODE,
                PROTO_CAP_DECODE | PROTO_CAP_PREFILL_LOCAL | PROTO_CAP_KV_IMPORT);
    assert_int_equal(rtr_flow_migrate_from(&f->r, d0), 1);
    int sent0 = rec.n_sent;
    migrate_done(f, d0, "m2", 3, 2, 9);     /* the router has 1 token */
    assert_true(rec.n_sent >= sent0 + 2);
    assert_int_equal(rec.sent[sent0].type, PROTO_MSG_RELEASE);
    assert_ptr_equal(rec.sent[sent0].to, d0);
    assert_int_equal(rec.sent[sent0].lease_id, 9);
    const sent_t *s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_DECODE_REQ); /* failover: decode-local */
    assert_true(s->flags & PROTO_DEC_PREFILL_LOCALLY);
    assert_int_equal(counter(f, RTR_STAT_requests_failed_over), 1);
    /* a MIGRATE_DONE for nothing live: its lease is released */
    sent0 = rec.n_sent;
    migrate_done(f, d0, "nobody", 1, 1, 11);
    assert_int_equal(rec.n_sent, sent0 + 1);
    assert_int_equal(last_sent()->type, PROTO_MSG_RELEASE);
    assert_int_equal(last_sent()->lease_id, 11);
}

/* The client leaves while its prompt is on the prefill: CANCEL to the
 * prefill, CANCELED; the PREFILL_DONE that still comes for the gone request
 * is RELEASEd at once (the blocks come back before the lease TTL). */
static void test_client_gone_and_late_prefill_done(void **state)
{
    fx_t *f = *state;
    rtr_req_t *q = accept_req(f, "r4", true, 16);
    rtr_flow_client_gone(q, "test");
    const sent_t *s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_CANCEL);
    assert_ptr_equal(s->to, f->pre);
    assert_string_equal(s->id, W("r4"));
    assert_true(rec.dropped);
    assert_null(rtr_flow_find(&f->r, W("r4")));
    assert_int_equal(counter(f, RTR_STAT_requests_canceled), 1);
    assert_int_equal(counter(f, RTR_STAT_client_disconnects), 1);

    prefill_done(f, "r4", 'x', 42);
    s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_RELEASE);
    assert_ptr_equal(s->to, f->pre);
    assert_int_equal(s->lease_id, 42);
}

/* max_tokens 1: token 0 from the prefill ends the request; the lease the
 * router holds goes back with RELEASE, no DECODE_REQ is sent. */
static void test_token0_is_the_last(void **state)
{
    fx_t *f = *state;
    accept_req(f, "r5", true, 1);
    prefill_done(f, "r5", 'z', 9);
    const sent_t *s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_RELEASE);
    assert_int_equal(s->lease_id, 9);
    for (int i = 0; i < rec.n_sent; i++)
        assert_int_not_equal(rec.sent[i].type, PROTO_MSG_DECODE_REQ);
    assert_non_null(strstr(rec.body, "\"finish_reason\":\"length\""));
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 1);
}

/* ---- early hand-off (kv-stream=layer: PREFILL_HANDLE) ---------------------- */

static int count_sent(uint16_t type, const char *id);

static void prefill_handle(fx_t *f, const char *id, uint64_t lease)
{
    static uint8_t handle[8] = { 8, 7, 6, 5, 4, 3, 2, 1 };
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_PREFILL_HANDLE;
    snprintf(m.u.prefill_handle.request_id, sizeof(m.u.prefill_handle.request_id), "%s", W(id));
    m.u.prefill_handle.n_prompt_tokens = 2;
    m.u.prefill_handle.lease_id = lease;
    m.u.prefill_handle.lease_ns = 1000000000;
    m.u.prefill_handle.kv_handle = (proto_blob_t){ handle, sizeof(handle) };
    deliver(f, f->pre, &m);
}

/* The handle before the prompt pass: DECODE_REQ TOKEN0_LATER at once (no
 * generated tokens, the prefill's lease), the request stays PREFILLING;
 * PREFILL_DONE streams token 0 and sends it to the decode (FIRST_TOKEN), no
 * second DECODE_REQ; the decode's tokens follow from seq 0. */
static void test_early_handoff_stream(void **state)
{
    fx_t *f = *state;
    rtr_req_t *q = accept_req(f, "e1", true, 16);
    prefill_handle(f, "e1", 55);
    const sent_t *s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_DECODE_REQ);
    assert_ptr_equal(s->to, f->dec);
    assert_int_equal(s->flags, PROTO_DEC_TOKEN0_LATER);
    assert_int_equal(s->n_generated, 0);
    assert_int_equal(s->lease_id, 55);
    assert_string_equal(s->target, "p0");
    assert_int_equal(q->fsm.state, RTR_REQ_PREFILLING);
    assert_true(q->early_dec);
    assert_int_equal(counter(f, RTR_STAT_kv_early_handoffs), 1);
    int n_before = rec.n_sent;
    prefill_handle(f, "e1", 55); /* a second one: ignored */
    assert_int_equal(rec.n_sent, n_before);

    prefill_done(f, "e1", 'O', 55);
    assert_non_null(strstr(rec.body, "\"O\""));
    s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_FIRST_TOKEN);
    assert_ptr_equal(s->to, f->dec);
    assert_string_equal(s->id, W("e1"));
    assert_int_equal(s->n_generated, 'O');
    assert_int_equal(count_sent(PROTO_MSG_DECODE_REQ, W("e1")), 1);
    assert_int_equal(count_sent(PROTO_MSG_RELEASE, W("e1")), 0);
    assert_false(q->lease_held);
    assert_false(q->early_dec);
    assert_int_equal(q->fsm.state, RTR_REQ_DECODING);

    int32_t t[2] = { 'k', '!' };
    tokens(f, "e1", 0, t, 2);
    assert_non_null(strstr(rec.body, "\"k!\""));
    finish(f, "e1", PROTO_FINISH_LENGTH);
    assert_null(rtr_flow_find(&f->r, W("e1")));
    assert_non_null(strstr(rec.body, "data: [DONE]\n\n"));
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 1);
    assert_int_equal(counter(f, RTR_STAT_kv_early_canceled), 0);
    assert_int_equal(count_sent(PROTO_MSG_CANCEL, W("e1")), 0);
    assert_int_equal(f->pre->assigned + f->dec->assigned, 0);
}

/* Token 0 ends the request (EOS; max_tokens 1): the decode's early copy is
 * CANCELed, the prefill's lease RELEASEd, no FIRST_TOKEN, ended once. */
static void test_early_handoff_token0_ends(void **state)
{
    fx_t *f = *state;
    accept_req(f, "e2", true, 16);
    prefill_handle(f, "e2", 56);
    prefill_done(f, "e2", 258 /* <|im_end|>: EOS */, 56);
    assert_int_equal(count_sent(PROTO_MSG_CANCEL, W("e2")), 1);
    assert_int_equal(count_sent(PROTO_MSG_FIRST_TOKEN, W("e2")), 0);
    assert_int_equal(count_sent(PROTO_MSG_RELEASE, W("e2")), 1);
    for (int i = 0; i < rec.n_sent; i++)
        if (rec.sent[i].type == PROTO_MSG_CANCEL)
            assert_ptr_equal(rec.sent[i].to, f->dec);
    assert_non_null(strstr(rec.body, "\"finish_reason\":\"stop\""));
    assert_null(rtr_flow_find(&f->r, W("e2")));
    assert_int_equal(rec.n_ended, 1);

    accept_req(f, "e3", true, 1);
    prefill_handle(f, "e3", 57);
    prefill_done(f, "e3", 'z', 57);
    assert_int_equal(count_sent(PROTO_MSG_CANCEL, W("e3")), 1);
    assert_int_equal(count_sent(PROTO_MSG_FIRST_TOKEN, W("e3")), 0);
    assert_non_null(strstr(rec.body, "\"finish_reason\":\"length\""));
    assert_int_equal(rec.n_ended, 2);
    assert_int_equal(counter(f, RTR_STAT_kv_early_canceled), 2);
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 2);
    /* the canceled copy's late answer is stale */
    finish(f, "e3", PROTO_FINISH_CANCELED);
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 2);
}

/* The prefill fails after the early DECODE_REQ: the decode's copy is
 * CANCELed first, then the usual retry (decode-local, the same decode);
 * the request ends once. Also with the prefill daemon lost. */
static void test_early_handoff_prefill_fails(void **state)
{
    fx_t *f = *state;
    rtr_req_t *q = accept_req(f, "e4", false, 16);
    prefill_handle(f, "e4", 58);
    error_from(f, f->pre, "e4", PD_ERR_INTERNAL);
    /* the only decode holds the canceled copy under the same id: the retry
     * waits for the copy's one answer */
    assert_int_equal(last_sent()->type, PROTO_MSG_CANCEL);
    assert_ptr_equal(last_sent()->to, f->dec);
    assert_int_equal(count_sent(PROTO_MSG_DECODE_REQ, W("e4")), 1);
    assert_true(q->retry_deferred);
    assert_int_equal(q->fsm.state, RTR_REQ_ROUTED);
    finish(f, "e4", PROTO_FINISH_CANCELED); /* the copy's answer */
    assert_false(q->retry_deferred);
    assert_null(q->early_end_be);
    int cancel_at = -1, retry_at = -1;
    for (int i = 0; i < rec.n_sent; i++) {
        if (rec.sent[i].type == PROTO_MSG_CANCEL && rec.sent[i].to == f->dec)
            cancel_at = i;
        if (rec.sent[i].type == PROTO_MSG_DECODE_REQ &&
            (rec.sent[i].flags & PROTO_DEC_PREFILL_LOCALLY))
            retry_at = i;
    }
    assert_true(cancel_at >= 0 && retry_at > cancel_at);
    assert_int_equal(last_sent()->n_generated, 0);
    assert_false(q->early_dec);
    assert_int_equal(q->fsm.state, RTR_REQ_DECODING);
    assert_int_equal(counter(f, RTR_STAT_requests_retried), 1);
    assert_int_equal(counter(f, RTR_STAT_kv_early_canceled), 1);
    int32_t t[2] = { 'o', 'k' };
    tokens(f, "e4", 0, t, 2);
    finish(f, "e4", PROTO_FINISH_STOP);
    assert_int_equal(rec.reply_status, 200);
    assert_non_null(strstr(rec.body, "\"text\":\"ok\""));
    assert_int_equal(rec.n_ended, 1);

    /* the prefill daemon is lost mid-pass */
    rec.attached = true;
    accept_req(f, "e5", true, 16);
    prefill_handle(f, "e5", 59);
    rtr_flow_backend_down(&f->r, f->pre);
    assert_int_equal(count_sent(PROTO_MSG_CANCEL, W("e5")), 1);
    assert_int_equal(last_sent()->type, PROTO_MSG_CANCEL);
    error_from(f, f->dec, "e5", PD_ERR_PEER_GONE); /* the copy's pull failed first */
    assert_int_equal(last_sent()->type, PROTO_MSG_DECODE_REQ);
    assert_int_equal(last_sent()->flags & PROTO_DEC_PREFILL_LOCALLY, PROTO_DEC_PREFILL_LOCALLY);
    assert_int_equal(counter(f, RTR_STAT_kv_early_canceled), 2);
}

/* With a second decode the retry goes there at once; the first decode's
 * late answer for its copy is taken as that (not as the retry's). */
static void test_early_handoff_retry_elsewhere(void **state)
{
    fx_t *f = *state;
    rtr_backend_t *d1 = &f->r.be[2];
    add_backend(&f->r, d1, "d1", PROTO_ROLE_DECODE,
                PROTO_CAP_DECODE | PROTO_CAP_PREFILL_LOCAL | PROTO_CAP_KV_IMPORT);
    rtr_req_t *q = accept_req(f, "e10", true, 16);
    prefill_handle(f, "e10", 64);
    error_from(f, f->pre, "e10", PD_ERR_INTERNAL);
    assert_int_equal(last_sent()->type, PROTO_MSG_DECODE_REQ);
    assert_ptr_equal(last_sent()->to, d1);
    assert_false(q->retry_deferred);
    assert_ptr_equal(q->early_end_be, f->dec);
    assert_int_equal(q->fsm.state, RTR_REQ_DECODING);
    finish(f, "e10", PROTO_FINISH_CANCELED); /* from d0: the copy */
    assert_null(q->early_end_be);
    assert_int_equal(q->fsm.state, RTR_REQ_DECODING);
    assert_non_null(rtr_flow_find(&f->r, W("e10")));
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 0);
}

/* The decode drops its early copy (pull failed): back to the plain path,
 * PREFILL_DONE hands the lease on in a full DECODE_REQ. Client gone while
 * early: both the prefill and the decode's copy are CANCELed. n > 1 and a
 * request whose prefill pulls a decode's prefix never go early. */
static void test_early_handoff_edges(void **state)
{
    fx_t *f = *state;
    rtr_req_t *q = accept_req(f, "e6", true, 16);
    prefill_handle(f, "e6", 60);
    error_from(f, f->dec, "e6", PD_ERR_STALE);
    assert_false(q->early_dec);
    assert_int_equal(q->fsm.state, RTR_REQ_PREFILLING);
    prefill_done(f, "e6", 'O', 60);
    const sent_t *s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_DECODE_REQ);
    assert_int_equal(s->flags, 0);
    assert_int_equal(s->n_generated, 1);
    assert_int_equal(count_sent(PROTO_MSG_FIRST_TOKEN, W("e6")), 0);
    finish(f, "e6", PROTO_FINISH_LENGTH);

    rec.attached = true;
    q = accept_req(f, "e7", true, 16);
    prefill_handle(f, "e7", 61);
    rtr_flow_client_gone(q, "test");
    assert_int_equal(count_sent(PROTO_MSG_CANCEL, W("e7")), 2);
    assert_null(rtr_flow_find(&f->r, W("e7")));

    rec.attached = true;
    q = accept_req_n(f, "e8", true, 16, 2);
    char w0[PROTO_REQID_MAX + 1];
    snprintf(w0, sizeof(w0), "%s", q->ch->c[0]->wire_id);
    int n_before = rec.n_sent;
    prefill_handle(f, w0, 62);
    assert_int_equal(rec.n_sent, n_before); /* n > 1: not early */
    assert_false(q->ch->c[0]->early_dec);
    prefill_done(f, w0, 'A', 62);
    assert_int_equal(last_sent()->type, PROTO_MSG_DECODE_REQ);
    assert_int_equal(last_sent()->n_fork, 1);
    assert_int_equal(last_sent()->n_generated, 1);
    rtr_flow_client_gone(q, "test");

    rec.attached = true;
    q = accept_req(f, "e9", true, 16);
    q->src_used = true; /* as after a PREFILL_REQ with a decode's prefix */
    n_before = rec.n_sent;
    prefill_handle(f, "e9", 63);
    assert_int_equal(rec.n_sent, n_before);
    assert_false(q->early_dec);
    assert_int_equal(counter(f, RTR_STAT_kv_early_handoffs), 2); /* e6, e7 */
}

/* Pull failures count as KV transfer failures, release the handle and
 * retry decode-local with the streamed token; retries run out -> 502. */
static void test_pull_failure_retries_then_fails(void **state)
{
    fx_t *f = *state;
    f->r.cfg.max_retries = 1;
    accept_req(f, "r6", true, 16);
    prefill_done(f, "r6", 'p', 5);
    error_from(f, f->dec, "r6", PD_ERR_STALE);
    assert_int_equal(counter(f, RTR_STAT_kv_transfer_failures), 1);
    const sent_t *rel = &rec.sent[rec.n_sent - 2];
    assert_int_equal(rel->type, PROTO_MSG_RELEASE);
    assert_int_equal(rel->lease_id, 5);
    const sent_t *s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_DECODE_REQ);
    assert_int_equal(s->flags & PROTO_DEC_PREFILL_LOCALLY, PROTO_DEC_PREFILL_LOCALLY);
    assert_int_equal(s->n_generated, 1);          /* the client already has 'p' */
    error_from(f, f->dec, "r6", PD_ERR_INTERNAL);
    assert_null(rtr_flow_find(&f->r, W("r6")));
    assert_int_equal(counter(f, RTR_STAT_requests_failed), 1);
    assert_non_null(strstr(rec.body, "after 1 retries"));
}

/* Stale messages (wrong backend, wrong state) change nothing. */
static void test_stale_messages_ignored(void **state)
{
    fx_t *f = *state;
    rtr_req_t *q = accept_req(f, "r7", true, 16);
    int32_t t[1] = { 'q' };
    tokens(f, "r7", 0, t, 1);                      /* TOKENS while PREFILLING */
    finish(f, "r7", PROTO_FINISH_STOP);            /* FINISH from the decode, too early */
    assert_int_equal(q->fsm.state, RTR_REQ_PREFILLING);
    assert_int_equal(q->n_gen, 0);
    assert_false(rec.opened);
    rtr_flow_fail_all(&f->r, "stopping");
    assert_null(rtr_flow_find(&f->r, W("r7")));
    assert_int_equal(last_sent()->type, PROTO_MSG_CANCEL);
    assert_int_equal(rec.reply_status, 503);
}

/* ---- n > 1 -------------------------------------------------------------------- */

static int count_sent(uint16_t type, const char *id)
{
    int k = 0;
    for (int i = 0; i < rec.n_sent; i++)
        k += rec.sent[i].type == type && strcmp(rec.sent[i].id, id) == 0;
    return k;
}

/* n = 3, streamed: choice 0 is prefilled and its DECODE_REQ carries the two
 * other choices (n_fork 2, ids "<choice 0>/1", "/2"); each choice streams
 * with its index and ends with its own finish_reason; one [DONE] after the
 * last; one request completed; nothing left assigned. */
static void test_n_choices_stream(void **state)
{
    fx_t *f = *state;
    rtr_req_t *q = accept_req_n(f, "n1", true, 16, 3);
    assert_non_null(q->ch);
    char w[3][PROTO_REQID_MAX + 1];
    for (int i = 0; i < 3; i++)
        snprintf(w[i], sizeof(w[i]), "%s", q->ch->c[i]->wire_id);
    char want[PROTO_REQID_MAX + 8];
    snprintf(want, sizeof(want), "%s/2", w[0]);
    assert_string_equal(w[2], want);
    assert_int_equal(last_sent()->type, PROTO_MSG_PREFILL_REQ);
    assert_string_equal(last_sent()->id, w[0]);
    assert_int_equal(q->ch->c[1]->fsm.state, RTR_REQ_ROUTED);

    prefill_done(f, w[0], 'A', 7);
    const sent_t *s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_DECODE_REQ);
    assert_string_equal(s->id, w[0]);
    assert_int_equal(s->n_fork, 2);
    assert_int_equal(q->ch->c[1]->fsm.state, RTR_REQ_DECODING);
    assert_int_equal(q->ch->c[2]->fsm.state, RTR_REQ_DECODING);
    assert_int_equal(f->dec->assigned, 3);

    int32_t a = 'b', b = 'c', c = 'd';
    tokens(f, w[1], 0, &a, 1);
    tokens(f, w[0], 0, &b, 1);
    tokens(f, w[2], 0, &c, 1);
    assert_non_null(strstr(rec.body, "\"index\":1"));
    assert_non_null(strstr(rec.body, "\"index\":2"));
    finish(f, w[1], PROTO_FINISH_STOP);
    assert_null(strstr(rec.body, "[DONE]"));
    finish(f, w[0], PROTO_FINISH_LENGTH);
    assert_false(rec.ended_stream);
    finish(f, w[2], PROTO_FINISH_LENGTH);
    assert_true(rec.ended_stream);
    assert_non_null(strstr(rec.body, "data: [DONE]\n\n"));
    assert_non_null(strstr(rec.body, "\"finish_reason\":\"stop\""));
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 1);
    assert_int_equal(f->pre->assigned + f->dec->assigned, 0);
    assert_int_equal(f->r.n_reqs, 0);
}

/* Choice 0 ends at token 0 (max_tokens 1): it never sends a DECODE_REQ, so
 * the other choice starts decode-local on its own; the non-streamed body
 * has both choices. */
static void test_n_choice0_ends_at_token0(void **state)
{
    fx_t *f = *state;
    rtr_req_t *q = accept_req_n(f, "n2", false, 1, 2);
    char w1[PROTO_REQID_MAX + 1], w0[PROTO_REQID_MAX + 1];
    snprintf(w0, sizeof(w0), "%s", q->ch->c[0]->wire_id);
    snprintf(w1, sizeof(w1), "%s", q->ch->c[1]->wire_id);
    prefill_done(f, w0, 'x', 3);
    assert_int_equal(count_sent(PROTO_MSG_RELEASE, w0), 1);
    assert_int_equal(count_sent(PROTO_MSG_DECODE_REQ, w0), 0);
    const sent_t *s = last_sent();
    assert_int_equal(s->type, PROTO_MSG_DECODE_REQ);
    assert_string_equal(s->id, w1);
    assert_int_equal(s->flags & PROTO_DEC_PREFILL_LOCALLY, PROTO_DEC_PREFILL_LOCALLY);
    assert_int_equal(s->n_fork, 0);
    assert_int_equal(rec.reply_status, 0);
    int32_t t = 'y';
    tokens(f, w1, 0, &t, 1);
    finish(f, w1, PROTO_FINISH_LENGTH);
    assert_int_equal(rec.reply_status, 200);
    assert_non_null(strstr(rec.body, "\"index\":1"));
    assert_non_null(strstr(rec.body, "\"completion_tokens\":2"));
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 1);
    assert_int_equal(f->r.n_reqs, 0);
}

/* One choice fails for good: the others are canceled upstream and the
 * client gets one error; one request failed, nothing live. */
static void test_n_choice_fails_all(void **state)
{
    fx_t *f = *state;
    f->r.cfg.max_retries = 0;
    rtr_req_t *q = accept_req_n(f, "n3", false, 16, 3);
    char w[3][PROTO_REQID_MAX + 1];
    for (int i = 0; i < 3; i++)
        snprintf(w[i], sizeof(w[i]), "%s", q->ch->c[i]->wire_id);
    prefill_done(f, w[0], 'A', 7);
    error_from(f, f->dec, w[1], PD_ERR_INTERNAL);
    assert_int_equal(rec.reply_status, 502);
    assert_int_equal(count_sent(PROTO_MSG_CANCEL, w[0]), 1);
    assert_int_equal(count_sent(PROTO_MSG_CANCEL, w[2]), 1);
    assert_int_equal(counter(f, RTR_STAT_requests_failed), 1);
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 0);
    assert_int_equal(f->r.n_reqs, 0);
    assert_int_equal(f->pre->assigned + f->dec->assigned, 0);
    int32_t t = 'z'; /* late tokens of an ended choice: stale */
    tokens(f, w[2], 0, &t, 1);
    assert_int_equal(f->r.n_reqs, 0);
}

/* The client leaves: every live choice is canceled upstream (choice 0 at the
 * prefill; the riders were never sent), one cancel counted. */
static void test_n_client_gone(void **state)
{
    fx_t *f = *state;
    rtr_req_t *q = accept_req_n(f, "n4", true, 16, 2);
    char w0[PROTO_REQID_MAX + 1];
    snprintf(w0, sizeof(w0), "%s", q->ch->c[0]->wire_id);
    rtr_flow_client_gone(q, "test");
    assert_int_equal(count_sent(PROTO_MSG_CANCEL, w0), 1);
    assert_ptr_equal(last_sent()->to, f->pre);
    assert_int_equal(counter(f, RTR_STAT_requests_canceled), 1);
    assert_int_equal(f->r.n_reqs, 0);
    assert_int_equal(f->pre->assigned + f->dec->assigned, 0);
}

/* ---- tools -------------------------------------------------------------------- */

static bool tools_logprobs; /* the next accept_tools asks for logprobs */

/* A chat request with one tool "f" in the Hermes format. */
static rtr_req_t *accept_tools(fx_t *f, const char *id, bool stream, uint32_t choice)
{
    rtr_oai_req_t o;
    memset(&o, 0, sizeof(o));
    rtr_api_t api = next_api == RTR_API_COMPLETIONS ? RTR_API_CHAT : next_api;
    next_api = RTR_API_COMPLETIONS;
    o.api = api;
    o.max_tokens = 256;
    o.top_p = 1.0f;
    o.stream = stream;
    o.n = 1;
    o.tools = calloc(1, sizeof(*o.tools));
    assert_non_null(o.tools);
    snprintf(o.tools[0].name, sizeof(o.tools[0].name), "f");
    o.tools[0].def = strdup("{\"type\":\"function\",\"function\":{\"name\":\"f\"}}");
    o.tools[0].def_len = strlen(o.tools[0].def);
    o.tools[0].params = strdup("{\"type\":\"object\",\"properties\":{}}");
    o.n_tools = 1;
    o.tool_choice = choice;
    o.tool_fmt = ENG_CHAT_TOOLS_HERMES;
    o.logprobs = tools_logprobs;
    tools_logprobs = false;
    int32_t *ids = malloc(2 * sizeof(*ids));
    assert_non_null(ids);
    ids[0] = 'H';
    ids[1] = 'i';
    rtr_backend_t *dec, *pre;
    bool disagg = rtr_flow_route(&f->r, ids, 2, 64, 0, &dec, &pre);
    rtr_req_t *q = NULL;
    assert_int_equal(rtr_flow_new(&f->r, id, api, &o, &ids, 2, &q), PD_OK);
    for (size_t i = 0; i < sizeof(wids) / sizeof(wids[0]); i++)
        if (wids[i].cid[0] == '\0' || strcmp(wids[i].cid, id) == 0) {
            snprintf(wids[i].cid, sizeof(wids[i].cid), "%s", id);
            snprintf(wids[i].wid, sizeof(wids[i].wid), "%s", q->wire_id);
            break;
        }
    rec.attached = true;
    rtr_flow_start(q, dec, disagg ? pre : NULL);
    return q;
}

static void text_tokens(fx_t *f, const char *id, uint32_t seq, const char *text)
{
    int32_t t[128];
    uint32_t n = (uint32_t)strlen(text);
    assert_true(n <= 128);
    for (uint32_t i = 0; i < n; i++)
        t[i] = (unsigned char)text[i];
    tokens(f, id, seq, t, n);
}

/* auto, streamed: an answer that opens with <tool_call> is held back (no
 * content chunk), parsed at the end into delta.tool_calls with an id, and
 * finishes with "tool_calls". */
static void test_tools_auto_call(void **state)
{
    fx_t *f = *state;
    accept_tools(f, "t1", true, RTR_OAI_TOOLS_AUTO);
    prefill_done(f, "t1", '<', 3);
    text_tokens(f, "t1", 0, "tool_call>\n{\"name\": \"f\", \"arguments\": {\"k\": [1, 2]}}\n");
    text_tokens(f, "t1", 1, "</tool_call>");
    assert_null(strstr(rec.body, "tool_call>"));  /* nothing of it went out as content */
    finish(f, "t1", PROTO_FINISH_STOP);
    assert_non_null(strstr(rec.body, "\"tool_calls\":[{\"index\":0,\"id\":\"call_"));
    assert_non_null(strstr(rec.body, "\"name\":\"f\",\"arguments\":\"{\\\"k\\\":[1,2]}\""));
    assert_non_null(strstr(rec.body, "\"finish_reason\":\"tool_calls\""));
    assert_null(strstr(rec.body, "<tool_call"));
    assert_int_equal(counter(f, RTR_STAT_tool_calls), 1);
    assert_int_equal(counter(f, RTR_STAT_requests_completed), 1);
}

/* auto: an answer that only looks like a call at first is text after all:
 * what was held goes out as content, in order, and the rest streams. */
static void test_tools_auto_text(void **state)
{
    fx_t *f = *state;
    accept_tools(f, "t2", true, RTR_OAI_TOOLS_AUTO);
    prefill_done(f, "t2", '<', 3);
    assert_null(strstr(rec.body, "\"content\":\"<\""));
    text_tokens(f, "t2", 0, "tool");
    assert_null(strstr(rec.body, "<tool"));
    text_tokens(f, "t2", 1, "s> are fun");
    assert_non_null(strstr(rec.body, "\"content\":\"<tools> are fun\""));
    text_tokens(f, "t2", 2, "!");
    assert_non_null(strstr(rec.body, "\"content\":\"!\""));
    finish(f, "t2", PROTO_FINISH_STOP);
    assert_non_null(strstr(rec.body, "\"finish_reason\":\"stop\""));
    assert_null(strstr(rec.body, "tool_calls"));
}

/* A forced call, not streamed: the answer is the call's JSON (the opener
 * was in the prompt); the body has message.tool_calls and content null. A
 * forced call cut off by max_tokens is still a call (truncated arguments,
 * as OpenAI), with finish_reason "length", never content. */
static void test_tools_forced(void **state)
{
    fx_t *f = *state;
    accept_tools(f, "t3", false, RTR_OAI_TOOLS_REQUIRED);
    prefill_done(f, "t3", '{', 3);
    text_tokens(f, "t3", 0, "\"name\":\"f\",\"arguments\":{}}");
    finish(f, "t3", PROTO_FINISH_STOP);
    assert_int_equal(rec.reply_status, 200);
    assert_non_null(strstr(rec.body, "\"content\":null,\"tool_calls\":[{\"id\":\"call_"));
    assert_non_null(strstr(rec.body, "\"arguments\":\"{}\""));
    assert_non_null(strstr(rec.body, "\"finish_reason\":\"tool_calls\""));

    memset(&rec, 0, sizeof(rec));
    accept_tools(f, "t4", false, RTR_OAI_TOOLS_NAMED);
    prefill_done(f, "t4", '{', 4);
    text_tokens(f, "t4", 0, "\"name\":\"f\",\"argu");
    finish(f, "t4", PROTO_FINISH_LENGTH);
    assert_int_equal(rec.reply_status, 200);
    assert_non_null(strstr(rec.body, "\"content\":null,\"tool_calls\":[{\"id\":\"call_"));
    assert_non_null(strstr(rec.body, "\"name\":\"f\",\"arguments\":\"\""));
    assert_non_null(strstr(rec.body, "\"finish_reason\":\"length\""));

    /* streamed, cut inside the arguments */
    memset(&rec, 0, sizeof(rec));
    accept_tools(f, "t5", true, RTR_OAI_TOOLS_REQUIRED);
    prefill_done(f, "t5", '{', 5);
    text_tokens(f, "t5", 0, "\"name\":\"f\",\"arguments\":{\"city\":\" is");
    finish(f, "t5", PROTO_FINISH_LENGTH);
    assert_null(strstr(rec.body, "\"content\":\"{"));
    assert_non_null(strstr(rec.body, "\"tool_calls\":[{\"index\":0,\"id\":\"call_"));
    assert_non_null(strstr(rec.body, "\"arguments\":\"{\\\"city\\\":\\\" is\""));
    assert_non_null(strstr(rec.body, "\"finish_reason\":\"length\""));
    assert_null(strstr(rec.body, "\"finish_reason\":\"tool_calls\""));
}

/* logprobs with tools, streamed: each chunk carries its tokens' logprobs
 * while the text that may be a call is held; the call still comes back as
 * tool_calls, never as content. */
static void test_tools_logprobs(void **state)
{
    fx_t *f = *state;
    tools_logprobs = true;
    accept_tools(f, "t6", true, RTR_OAI_TOOLS_AUTO);
    prefill_done(f, "t6", '<', 6);
    text_tokens(f, "t6", 0, "tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
    assert_non_null(strstr(rec.body, "\"logprobs\":{\"content\":[{\"token\":\"<\""));
    assert_null(strstr(rec.body, "\"content\":\"<"));
    finish(f, "t6", PROTO_FINISH_STOP);
    assert_non_null(strstr(rec.body, "\"tool_calls\":[{\"index\":0,\"id\":\"call_"));
    assert_non_null(strstr(rec.body, "\"finish_reason\":\"tool_calls\""));
    assert_null(strstr(rec.body, "\"content\":\"<tool_call"));
}

/* ---- the event front doors (rtr_fd.h) ------------------------------------- */

/* Messages, streamed, through a decode failover: Anthropic's events from
 * message_start to message_stop around the same tokens, nothing repeated,
 * no [DONE]; a lost stream of the Responses API ends with response.failed. */
static void test_frontdoor_streams(void **state)
{
    fx_t *f = *state;
    rtr_backend_t *d0 = f->dec, *d1 = &f->r.be[2];
    add_backend(&f->r, d1, "d1", PROTO_ROLE_DECODE,
                PROTO_CAP_DECODE | PROTO_CAP_PREFILL_LOCAL | PROTO_CAP_KV_IMPORT);
    d1->hb.free_blocks = 10;
    next_api = RTR_API_MESSAGES;
    rtr_req_t *q = accept_req(f, "m1", true, 4);
    assert_memory_equal(q->resp_id, "msg_", 4);
    prefill_done(f, "m1", 'a', 5);
    assert_true(strncmp(rec.body, "event: message_start\ndata: {\"type\":\"message_start\"", 50) == 0);
    int32_t t[1] = { 'b' };
    tokens(f, "m1", 0, t, 1);
    f->dec->conn = NULL;
    f->dec->state = RTR_BE_DOWN;
    rtr_flow_backend_down(&f->r, f->dec);
    f->dec = d1;
    int32_t more[2] = { 'c', 'd' };
    tokens(f, "m1", 0, more, 2);
    finish(f, "m1", PROTO_FINISH_LENGTH);
    f->dec = d0;
    assert_true(rec.ended_stream);
    const char *pa = strstr(rec.body, "\"text_delta\",\"text\":\"a\""),
               *pb = strstr(rec.body, "\"text_delta\",\"text\":\"b\""),
               *pc = strstr(rec.body, "\"text_delta\",\"text\":\"cd\"");
    if (!(pa && pb && pc && pa < pb && pb < pc))
        fail_msg("stream out of order: %s", rec.body);
    assert_non_null(strstr(rec.body, "\"stop_reason\":\"max_tokens\""));
    assert_non_null(strstr(rec.body, "\"output_tokens\":4"));
    static const char stop[] = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    size_t bl = strlen(rec.body);
    assert_true(bl > sizeof(stop) && strcmp(rec.body + bl - (sizeof(stop) - 1), stop) == 0);
    assert_null(strstr(rec.body, "[DONE]"));
    assert_null(strstr(rec.body, "event: error"));
    assert_int_equal(counter(f, RTR_STAT_requests_failed_over), 1);

    /* the only decode left dies: response.failed, no response.completed */
    memset(&rec, 0, sizeof(rec));
    f->dec = d1;
    next_api = RTR_API_RESPONSES;
    accept_req(f, "m2", true, 8);
    prefill_done(f, "m2", 'a', 6);
    d1->conn = NULL;
    d1->state = RTR_BE_DOWN;
    rtr_flow_backend_down(&f->r, d1);
    f->dec = d0;
    assert_true(rec.ended_stream);
    assert_non_null(strstr(rec.body, "event: response.created\n"));
    assert_non_null(strstr(rec.body, "event: response.output_text.delta\n"));
    assert_non_null(strstr(rec.body, "event: response.failed\n"));
    assert_non_null(strstr(rec.body, "\"status\":\"failed\""));
    assert_null(strstr(rec.body, "response.completed"));
}

/* A forced call on /v1/messages: a tool_use block whose input comes as one
 * input_json_delta, stop_reason tool_use; not streamed, the message body. */
static void test_frontdoor_tool_use(void **state)
{
    fx_t *f = *state;
    next_api = RTR_API_MESSAGES;
    accept_tools(f, "mt1", true, RTR_OAI_TOOLS_REQUIRED);
    prefill_done(f, "mt1", '{', 3);
    text_tokens(f, "mt1", 0, "\"name\":\"f\",\"arguments\":{\"k\":1}}");
    finish(f, "mt1", PROTO_FINISH_STOP);
    assert_null(strstr(rec.body, "text_delta"));
    assert_non_null(strstr(rec.body, "\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_"));
    assert_non_null(strstr(rec.body, "\"type\":\"input_json_delta\",\"partial_json\":"
                                     "\"{\\\"k\\\":1}\""));
    assert_non_null(strstr(rec.body, "\"stop_reason\":\"tool_use\""));

    memset(&rec, 0, sizeof(rec));
    next_api = RTR_API_RESPONSES;
    accept_tools(f, "mt2", false, RTR_OAI_TOOLS_NAMED);
    prefill_done(f, "mt2", '{', 4);
    text_tokens(f, "mt2", 0, "\"name\":\"f\",\"arguments\":{}}");
    finish(f, "mt2", PROTO_FINISH_STOP);
    assert_int_equal(rec.reply_status, 200);
    assert_non_null(strstr(rec.body, "\"object\":\"response\""));
    assert_non_null(strstr(rec.body, "\"type\":\"function_call\",\"status\":\"completed\","
                                     "\"call_id\":\"call_"));
    assert_null(strstr(rec.body, "\"type\":\"message\""));
}

int main(void)
{
    pd_log_set_level(PD_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_disaggregated_stream, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cost_mode_measures, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_kv_routing, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_src_export_ok, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_src_export_refused, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_src_decode_lost, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_src_client_gone, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_prefill_error_retries_local, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_decode_down_mid_stream, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_decode_failover_mid_stream, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_decode_failover_bounded, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_live_migration, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_migration_edges, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_drain_keeps_nearly_done, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_drain_moves_only_with_room, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_drain_room_as_known, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_burst_spreads, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_burst_spreads_prefills, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_client_gone_and_late_prefill_done, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(test_token0_is_the_last, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_early_handoff_stream, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_early_handoff_token0_ends, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_early_handoff_prefill_fails, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_early_handoff_edges, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_early_handoff_retry_elsewhere, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_pull_failure_retries_then_fails, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(test_stale_messages_ignored, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_n_choices_stream, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_n_choice0_ends_at_token0, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_n_choice_fails_all, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_n_client_gone, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_tools_auto_call, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_tools_logprobs, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_tools_auto_text, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_tools_forced, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_frontdoor_streams, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_frontdoor_tool_use, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
