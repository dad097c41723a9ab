/* proto_samples.c - see proto_samples.h. */
#include "proto_samples.h"

#include <stdint.h>
#include <string.h>

const uint16_t ps_types[PROTO_MSG_COUNT] = {
#define PS_X(NAME, name, code, max) code,
    PROTO_MSG_LIST(PS_X)
#undef PS_X
};

#define PS_TOKENS_CAP (1u << 20)
static int32_t ps_tok[PS_TOKENS_CAP];        /* (PS_TOKENS_CAP) */
static int32_t ps_tok2[PS_TOKENS_CAP];       /* (PS_TOKENS_CAP) */
static uint8_t ps_bytes[PROTO_MAX_TEXT];     /* (PROTO_MAX_TEXT) */
static int ps_ready;
static proto_logprob_t ps_lp[PROTO_MAX_TOKENS_MSG];   /* (PROTO_MAX_TOKENS_MSG) */
static uint64_t ps_names[PROTO_MAX_KV_EVENTS];        /* (PROTO_MAX_KV_EVENTS) */

static void ps_init(void)
{
    if (ps_ready)
        return;
    for (uint32_t i = 0; i < PS_TOKENS_CAP; i++) {
        ps_tok[i] = (int32_t)((i * 2654435761u) & 0x7fffffffu);
        ps_tok2[i] = (int32_t)(i % 32000);
    }
    ps_tok[0] = INT32_MAX;
    ps_tok[1] = 0;
    for (uint32_t i = 0; i < PROTO_MAX_TOKENS_MSG; i++) {
        ps_lp[i].logprob = i == 0 ? 0.0f : -(float)i / 7.0f;
        for (uint32_t j = 0; j < PROTO_MAX_TOP_LOGPROBS; j++) {
            ps_lp[i].top_ids[j] = j == 0 && i == 0 ? INT32_MAX : (int32_t)(i * 31 + j);
            ps_lp[i].top_lp[j] = -(float)(j + i) / 3.0f;
        }
    }
    for (uint32_t i = 0; i < PROTO_MAX_KV_EVENTS; i++)
        ps_names[i] = i == 0 ? UINT64_MAX : (uint64_t)i * 0x9e3779b97f4a7c15ull;
    for (uint32_t i = 0; i < sizeof(ps_bytes); i++)
        ps_bytes[i] = (uint8_t)(i * 131 + 7); /* includes 0x00 bytes */
    ps_ready = 1;
}

/* A string of exactly n printable bytes. */
static void ps_str(char *dst, size_t n, char base)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = (char)(base + (char)(i % 26));
    dst[n] = '\0';
}

static proto_tokens_t ps_tokens(const int32_t *src, uint32_t n)
{
    proto_tokens_t t = { n, n ? src : NULL, NULL };
    return t;
}

static proto_blob_t ps_blob(uint32_t n)
{
    proto_blob_t b = { n ? ps_bytes : NULL, n };
    return b;
}

static void ps_sampling(proto_sampling_t *s, int v)
{
    memset(s, 0, sizeof(*s));
    if (v == PS_MIN)
        return;
    s->temperature = v == PS_MAX ? 3.4e38f : 0.7f;
    s->top_p = v == PS_MAX ? 1.0f : 0.95f;
    s->top_k = v == PS_MAX ? UINT32_MAX : 40;
    s->flags = v == PS_MAX ? PROTO_SAMPLE_DEFINED : PROTO_SAMPLE_HAS_SEED;
    s->seed = v == PS_MAX ? UINT64_MAX : 1234;
    s->max_tokens = v == PS_MAX ? UINT32_MAX : 128;
    s->min_tokens = v == PS_MAX ? UINT32_MAX : 1;
    s->stop = ps_tokens(ps_tok2, v == PS_MAX ? PROTO_MAX_STOP_TOKENS : 2);
    s->presence_penalty = v == PS_MAX ? 2.0f : 0.5f;
    s->frequency_penalty = v == PS_MAX ? -2.0f : 0.25f;
    s->repetition_penalty = v == PS_MAX ? 2.0f : 1.1f;
    s->min_p = v == PS_MAX ? 1.0f : 0.05f;
    s->logprobs = 1;
    s->top_logprobs = v == PS_MAX ? PROTO_MAX_TOP_LOGPROBS : 3;
    s->n_bias = v == PS_MAX ? PROTO_MAX_LOGIT_BIAS : 2;
    for (uint32_t i = 0; i < s->n_bias; i++) {
        s->bias_ids[i] = v == PS_MAX ? INT32_MAX - (int32_t)i : (int32_t)(7 * i + 3);
        s->bias[i] = v == PS_MAX ? (i % 2 ? -100.0f : 100.0f) : 1.5f - (float)i;
    }
    s->gram_kind = v == PS_MAX ? PROTO_GRAM_JSON_SCHEMA : PROTO_GRAM_JSON_OBJECT;
    s->gram = ps_blob(v == PS_MAX ? PROTO_MAX_GRAMMAR : 0);
}

void ps_make(uint16_t type, int v, proto_msg_t *m)
{
    ps_init();
    memset(m, 0, sizeof(*m));
    m->hdr.type = type;
    m->hdr.flags = v == PS_MAX ? PROTO_FLAGS_DEFINED : 0;
    m->hdr.tag = v == PS_MAX ? UINT64_MAX : v == PS_MID ? 0x0102030405060708ull : 0;

    size_t rid = v == PS_MAX ? PROTO_REQID_MAX : v == PS_MID ? 16 : 1;
    size_t did = v == PS_MAX ? PROTO_DAEMON_ID_MAX : v == PS_MID ? 9 : 1;
    size_t why = v == PS_MAX ? PROTO_REASON_MAX : v == PS_MID ? 12 : 0;
    uint64_t big = v == PS_MAX ? UINT64_MAX : v == PS_MID ? 1000000007ull : 0;
    uint32_t big32 = v == PS_MAX ? UINT32_MAX : v == PS_MID ? 77 : 0;

    switch (type) {
    case PROTO_MSG_HELLO: {
        proto_hello_t *h = &m->u.hello;
        h->role = v == PS_MAX ? PROTO_ROLE_ROUTER : PROTO_ROLE_PREFILL;
        h->caps = v == PS_MAX ? PROTO_CAPS_DEFINED : v == PS_MID ? PROTO_CAP_PREFILL : 0;
        ps_str(h->daemon_id, did, 'a');
        h->incarnation = big;
        h->compat_hash = big ^ 0x5555;
        h->geom.n_layers = big32;
        h->geom.n_kv_heads = big32 / 2;
        h->geom.head_dim = big32 / 3;
        h->geom.block_tokens = v == PS_MIN ? 0 : 16;
        h->geom.kv_dtype = v == PS_MIN ? 0 : 1;
        h->geom.total_blocks = big32;
        h->geom.block_bytes = big;
        h->geom.context_length = big32;
        h->geom.vocab_size = big32;
        h->kv_addr = ps_blob(v == PS_MAX ? PROTO_KV_ADDR_MAX : v == PS_MID ? 100 : 0);
        for (uint32_t i = 0; i < PROTO_AUTH_NONCE_LEN; i++)
            h->nonce[i] = v == PS_MIN ? 0 : (uint8_t)(i + 1);
        for (uint32_t i = 0; i < PROTO_AUTH_MAC_LEN; i++)
            h->mac[i] = v == PS_MIN ? 0 : (uint8_t)(0xff - i);
        break;
    }
    case PROTO_MSG_REGISTER_ACK: {
        proto_register_ack_t *a = &m->u.register_ack;
        ps_str(a->daemon_id, did, 'A');
        a->incarnation = big;
        a->heartbeat_interval_ns = big / 3;
        a->lease_ns = big / 5;
        for (uint32_t i = 0; i < PROTO_AUTH_NONCE_LEN; i++)
            a->nonce[i] = v == PS_MIN ? 0 : (uint8_t)(i * 3);
        for (uint32_t i = 0; i < PROTO_AUTH_MAC_LEN; i++)
            a->mac[i] = v == PS_MIN ? 0 : (uint8_t)(i * 5);
        break;
    }
    case PROTO_MSG_REGISTER_REJECT:
        m->u.register_reject.status = v == PS_MAX ? PD_STATUS_MIN : PD_ERR_MISMATCH;
        ps_str(m->u.register_reject.reason, why, 'r');
        break;
    case PROTO_MSG_CHALLENGE:
        memset(m->u.challenge.nonce, v == PS_MAX ? 0xff : 0x5a + v, PROTO_AUTH_NONCE_LEN);
        break;
    case PROTO_MSG_HEARTBEAT: {
        proto_heartbeat_t *h = &m->u.heartbeat;
        h->incarnation = big;
        h->sent_ns = big / 7;
        h->flags = v == PS_MAX ? PROTO_HB_DEFINED : 0;
        h->queue_depth = big32;
        h->running_seqs = big32 / 2;
        h->free_blocks = big32 / 3;
        h->total_blocks = big32;
        h->leases = big32 / 4;
        h->outstanding_prefill_tokens = big;
        break;
    }
    case PROTO_MSG_PREFILL_REQ: {
        proto_prefill_req_t *p = &m->u.prefill_req;
        ps_str(p->request_id, rid, '0');
        p->prompt = ps_tokens(ps_tok, v == PS_MAX ? PROTO_MAX_PROMPT_TOKENS
                                      : v == PS_MID ? 37 : 0);
        ps_sampling(&p->sampling, v);
        ps_str(p->target_decode_id, v == PS_MIN ? 0 : did, 'd');
        p->deadline_ns = big;
        if (v != PS_MIN) { /* a decode's cached prefix to pull */
            ps_str(p->src_peer_id, did, 'e');
            p->src_lease_id = big / 5;
            p->src_handle = ps_blob(v == PS_MAX ? PROTO_KV_HANDLE_MAX : 96);
            p->src_kv_tokens = v == PS_MAX ? PROTO_MAX_PROMPT_TOKENS - 1 : 32;
        }
        p->cache_partition = v == PS_MIN ? 0 : big ^ 0x5a17;
        break;
    }
    case PROTO_MSG_PREFILL_DONE: {
        proto_prefill_done_t *p = &m->u.prefill_done;
        ps_str(p->request_id, rid, '0');
        p->first_token = v == PS_MAX ? INT32_MAX : v == PS_MID ? 42 : 0;
        p->n_prompt_tokens = big32;
        p->lease_id = big;
        p->lease_ns = big / 2;
        p->kv_handle = ps_blob(v == PS_MAX ? PROTO_KV_HANDLE_MAX : v == PS_MID ? 96 : 0);
        p->queue_ns = big / 9;
        p->prefill_ns = big / 11;
        p->cached_tokens = v == PS_MIN ? 0 : big32 / 3;
        p->logprobs = (proto_logprobs_t){ v == PS_MAX ? PROTO_MAX_TOP_LOGPROBS : v == PS_MID ? 2 : 0,
                                          v == PS_MIN ? 0 : 1, ps_lp, NULL };
        break;
    }
    case PROTO_MSG_DECODE_REQ: {
        proto_decode_req_t *d = &m->u.decode_req;
        ps_str(d->request_id, rid, '0');
        d->flags = v == PS_MIN ? PROTO_DEC_PREFILL_LOCALLY : 0;
        d->prompt = ps_tokens(ps_tok, v == PS_MAX ? PROTO_MAX_PROMPT_TOKENS
                                      : v == PS_MID ? 37 : 0);
        d->generated = ps_tokens(ps_tok2, v == PS_MAX ? PROTO_MAX_GEN_TOKENS
                                          : v == PS_MID ? 1 : 0);
        ps_sampling(&d->sampling, v);
        d->rng_state = big ^ 0xabcdef;
        ps_str(d->prefill_peer_id, v == PS_MIN ? 0 : did, 'p');
        d->lease_id = big;
        d->kv_handle = ps_blob(v == PS_MAX ? PROTO_KV_HANDLE_MAX : v == PS_MID ? 96 : 0);
        d->kv_tokens = v == PS_MAX ? PROTO_MAX_PROMPT_TOKENS + PROTO_MAX_GEN_TOKENS - 1
                     : v == PS_MID ? 37 : 0;
        d->deadline_ns = big;
        d->n_fork = v == PS_MIN ? PROTO_MAX_FORK : 0; /* forks need kv_tokens 0 */
        d->cache_partition = v == PS_MIN ? 0 : big ^ 0x5a17;
        break;
    }
    case PROTO_MSG_TOKENS: {
        proto_tokens_msg_t *t = &m->u.tokens;
        ps_str(t->request_id, rid, '0');
        t->seq = big32;
        t->tokens = ps_tokens(ps_tok, v == PS_MAX ? PROTO_MAX_TOKENS_MSG
                                      : v == PS_MID ? 1 : 0);
        t->text = ps_blob(v == PS_MAX ? PROTO_MAX_TEXT : v == PS_MID ? 5 : 0);
        t->logprobs = (proto_logprobs_t){ v == PS_MAX ? PROTO_MAX_TOP_LOGPROBS : v == PS_MID ? 4 : 0,
                                          t->tokens.n, ps_lp, NULL };
        break;
    }
    case PROTO_MSG_FINISH: {
        proto_finish_t *f = &m->u.finish;
        ps_str(f->request_id, rid, '0');
        f->reason = v == PS_MAX ? PROTO_FINISH_CANCELED : v == PS_MID ? PROTO_FINISH_LENGTH
                                                                      : PROTO_FINISH_STOP;
        f->status = v == PS_MAX ? PD_ERR_CANCELED : PD_OK;
        f->prompt_tokens = big32;
        f->completion_tokens = big32 / 2;
        f->queue_ns = big;
        f->prefill_ns = big / 2;
        f->transfer_ns = big / 3;
        f->decode_ns = big / 4;
        f->ttft_ns = big / 5;
        f->total_ns = big / 6;
        f->cached_tokens = v == PS_MIN ? 0 : big32 / 4;
        f->kv_bytes = big / 7;
        break;
    }
    case PROTO_MSG_CANCEL:
        ps_str(m->u.cancel.request_id, rid, '0');
        m->u.cancel.status = v == PS_MIN ? PD_OK : PD_ERR_CANCELED;
        ps_str(m->u.cancel.reason, why, 'c');
        break;
    case PROTO_MSG_RELEASE:
        ps_str(m->u.release.request_id, rid, '0');
        m->u.release.lease_id = big;
        break;
    case PROTO_MSG_ERROR:
        ps_str(m->u.error.request_id, v == PS_MIN ? 0 : rid, '0');
        m->u.error.status = v == PS_MAX ? PD_STATUS_MIN : PD_ERR_INTERNAL;
        ps_str(m->u.error.message, v == PS_MAX ? PROTO_ERRMSG_MAX : v == PS_MID ? 20 : 0, 'e');
        break;
    case PROTO_MSG_PEER_INFO:
        ps_str(m->u.peer_info.daemon_id, did, 'p');
        m->u.peer_info.role = v == PS_MAX ? PROTO_ROLE_ROUTER : PROTO_ROLE_PREFILL;
        m->u.peer_info.incarnation = big;
        m->u.peer_info.kv_addr =
            ps_blob(v == PS_MAX ? PROTO_KV_ADDR_MAX : v == PS_MID ? 300 : 0);
        break;
    case PROTO_MSG_PEER_DOWN:
        ps_str(m->u.peer_down.daemon_id, did, 'p');
        m->u.peer_down.incarnation = big;
        m->u.peer_down.status = v == PS_MAX ? PD_STATUS_MIN : PD_ERR_PEER_GONE;
        break;
    case PROTO_MSG_MIGRATE:
        ps_str(m->u.migrate.request_id, rid, '0');
        ps_str(m->u.migrate.target_decode_id, did, 'd');
        break;
    case PROTO_MSG_MIGRATE_DONE: {
        proto_migrate_done_t *d = &m->u.migrate_done;
        ps_str(d->request_id, rid, '0');
        d->n_gen = v == PS_MIN ? 1 : big32;
        d->kv_tokens = v == PS_MIN ? 1 : big32 / 2;
        d->lease_id = big;
        d->lease_ns = big / 3;
        d->kv_handle = ps_blob(v == PS_MAX ? PROTO_KV_HANDLE_MAX : v == PS_MID ? 96 : 1);
        break;
    }
    case PROTO_MSG_KV_EVENTS: {
        proto_kv_events_t *k = &m->u.kv_events;
        k->flags = v == PS_MID ? PROTO_KVE_RESET : 0;
        k->cached_blocks = big32;
        uint32_t ns = v == PS_MAX ? PROTO_MAX_KV_EVENTS / 2 : v == PS_MID ? 3 : 0;
        k->stored = (proto_names_t){ ns, ns ? ps_names : NULL, NULL };
        k->removed = (proto_names_t){ ns, ns ? ps_names + ns : NULL, NULL };
        break;
    }
    case PROTO_MSG_KV_EXPORT_REQ: {
        proto_kv_export_req_t *x = &m->u.kv_export_req;
        ps_str(x->request_id, rid, '0');
        ps_str(x->target_prefill_id, v == PS_MIN ? 1 : did, 'p');
        x->prompt = ps_tokens(ps_tok, v == PS_MAX ? PROTO_MAX_PROMPT_TOKENS
                                      : v == PS_MID ? 37 : 2);
        x->min_tokens = v == PS_MAX ? PROTO_MAX_PROMPT_TOKENS - 1 : v == PS_MID ? 32 : 0;
        x->cache_partition = v == PS_MIN ? 0 : big ^ 0x5a17;
        break;
    }
    case PROTO_MSG_KV_EXPORT_DONE: {
        proto_kv_export_done_t *x = &m->u.kv_export_done;
        ps_str(x->request_id, rid, '0');
        x->kv_tokens = v == PS_MIN ? 1 : big32;
        x->lease_id = big;
        x->lease_ns = big / 3;
        x->kv_handle = ps_blob(v == PS_MAX ? PROTO_KV_HANDLE_MAX : v == PS_MID ? 96 : 1);
        break;
    }
    case PROTO_MSG_PREFILL_HANDLE: {
        proto_prefill_handle_t *x = &m->u.prefill_handle;
        ps_str(x->request_id, rid, '0');
        x->n_prompt_tokens = v == PS_MIN ? 1 : big32;
        x->lease_id = big;
        x->lease_ns = big / 3;
        x->kv_handle = ps_blob(v == PS_MAX ? PROTO_KV_HANDLE_MAX : v == PS_MID ? 96 : 1);
        break;
    }
    case PROTO_MSG_FIRST_TOKEN: {
        proto_first_token_t *x = &m->u.first_token;
        ps_str(x->request_id, rid, '0');
        x->first_token = v == PS_MAX ? INT32_MAX : v == PS_MID ? 42 : 0;
        x->rng_state = big;
        break;
    }
    case PROTO_MSG_EMBED_REQ: {
        proto_embed_req_t *x = &m->u.embed_req;
        ps_str(x->request_id, rid, '0');
        x->pooling = v == PS_MAX ? PROTO_POOL_LAST : v == PS_MID ? 1 : PROTO_POOL_DEFAULT;
        x->prompt = ps_tokens(ps_tok, v == PS_MAX ? PROTO_MAX_PROMPT_TOKENS : v == PS_MID ? 17 : 1);
        break;
    }
    case PROTO_MSG_EMBED_DONE: {
        proto_embed_done_t *x = &m->u.embed_done;
        ps_str(x->request_id, rid, '0');
        x->n_prompt_tokens = v == PS_MIN ? 1 : big32;
        x->queue_ns = big;
        x->compute_ns = big / 5;
        x->vec = ps_blob(v == PS_MAX ? PROTO_MAX_TEXT : v == PS_MID ? 4 * 128 : 4);
        break;
    }
    }
}

static int tok_eq(const proto_tokens_t *a, const proto_tokens_t *b)
{
    if (a->n != b->n)
        return 0;
    for (uint32_t i = 0; i < a->n; i++)
        if (proto_tokens_get(a, i) != proto_tokens_get(b, i))
            return 0;
    return 1;
}

static int names_eq(const proto_names_t *a, const proto_names_t *b)
{
    if (a->n != b->n)
        return 0;
    for (uint32_t i = 0; i < a->n; i++)
        if (proto_names_get(a, i) != proto_names_get(b, i))
            return 0;
    return 1;
}

static int blob_eq(const proto_blob_t *a, const proto_blob_t *b)
{
    return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

static int lp_eq(const proto_logprobs_t *a, const proto_logprobs_t *b)
{
    if (a->top_n != b->top_n || a->n != b->n)
        return 0;
    for (uint32_t i = 0; i < a->n; i++) {
        proto_logprob_t x, y;
        proto_logprobs_get(a, i, &x);
        proto_logprobs_get(b, i, &y);
        if (memcmp(&x, &y, sizeof(x)) != 0)
            return 0;
    }
    return 1;
}

static int samp_eq(const proto_sampling_t *a, const proto_sampling_t *b)
{
    return memcmp(&a->temperature, &b->temperature, 4) == 0 &&
           memcmp(&a->top_p, &b->top_p, 4) == 0 && a->top_k == b->top_k &&
           a->flags == b->flags && a->seed == b->seed &&
           a->max_tokens == b->max_tokens && a->min_tokens == b->min_tokens &&
           tok_eq(&a->stop, &b->stop) &&
           memcmp(&a->presence_penalty, &b->presence_penalty, 4) == 0 &&
           memcmp(&a->frequency_penalty, &b->frequency_penalty, 4) == 0 &&
           memcmp(&a->repetition_penalty, &b->repetition_penalty, 4) == 0 &&
           memcmp(&a->min_p, &b->min_p, 4) == 0 && a->n_bias == b->n_bias &&
           memcmp(a->bias_ids, b->bias_ids, a->n_bias * sizeof(a->bias_ids[0])) == 0 &&
           memcmp(a->bias, b->bias, a->n_bias * sizeof(a->bias[0])) == 0 &&
           a->logprobs == b->logprobs && a->top_logprobs == b->top_logprobs &&
           a->gram_kind == b->gram_kind && blob_eq(&a->gram, &b->gram);
}

#define EQ(f) (a->f == b->f)
#define SEQ(f) (strcmp(a->f, b->f) == 0)
#define MEQ(f) (memcmp(a->f, b->f, sizeof(a->f)) == 0)

int ps_equal(const proto_msg_t *ma, const proto_msg_t *mb)
{
    if (ma->hdr.type != mb->hdr.type || ma->hdr.flags != mb->hdr.flags ||
        ma->hdr.tag != mb->hdr.tag)
        return 0;
    switch (ma->hdr.type) {
    case PROTO_MSG_HELLO: {
        const proto_hello_t *a = &ma->u.hello, *b = &mb->u.hello;
        return EQ(role) && EQ(caps) && SEQ(daemon_id) && EQ(incarnation) &&
               EQ(compat_hash) && EQ(geom.n_layers) && EQ(geom.n_kv_heads) &&
               EQ(geom.head_dim) && EQ(geom.block_tokens) && EQ(geom.kv_dtype) &&
               EQ(geom.total_blocks) && EQ(geom.block_bytes) &&
               EQ(geom.context_length) && EQ(geom.vocab_size) &&
               blob_eq(&a->kv_addr, &b->kv_addr) && MEQ(nonce) && MEQ(mac);
    }
    case PROTO_MSG_REGISTER_ACK: {
        const proto_register_ack_t *a = &ma->u.register_ack, *b = &mb->u.register_ack;
        return SEQ(daemon_id) && EQ(incarnation) && EQ(heartbeat_interval_ns) &&
               EQ(lease_ns) && MEQ(nonce) && MEQ(mac);
    }
    case PROTO_MSG_REGISTER_REJECT: {
        const proto_register_reject_t *a = &ma->u.register_reject,
                                      *b = &mb->u.register_reject;
        return EQ(status) && SEQ(reason);
    }
    case PROTO_MSG_CHALLENGE:
        return memcmp(ma->u.challenge.nonce, mb->u.challenge.nonce, PROTO_AUTH_NONCE_LEN) == 0;
    case PROTO_MSG_HEARTBEAT: {
        const proto_heartbeat_t *a = &ma->u.heartbeat, *b = &mb->u.heartbeat;
        return EQ(incarnation) && EQ(sent_ns) && EQ(flags) && EQ(queue_depth) &&
               EQ(running_seqs) && EQ(free_blocks) && EQ(total_blocks) &&
               EQ(leases) && EQ(outstanding_prefill_tokens);
    }
    case PROTO_MSG_PREFILL_REQ: {
        const proto_prefill_req_t *a = &ma->u.prefill_req, *b = &mb->u.prefill_req;
        return SEQ(request_id) && tok_eq(&a->prompt, &b->prompt) &&
               samp_eq(&a->sampling, &b->sampling) && SEQ(target_decode_id) &&
               EQ(deadline_ns) && SEQ(src_peer_id) && EQ(src_lease_id) &&
               blob_eq(&a->src_handle, &b->src_handle) && EQ(src_kv_tokens) &&
               EQ(cache_partition);
    }
    case PROTO_MSG_PREFILL_DONE: {
        const proto_prefill_done_t *a = &ma->u.prefill_done, *b = &mb->u.prefill_done;
        return SEQ(request_id) && EQ(first_token) && EQ(n_prompt_tokens) &&
               EQ(lease_id) && EQ(lease_ns) && blob_eq(&a->kv_handle, &b->kv_handle) &&
               EQ(queue_ns) && EQ(prefill_ns) && EQ(cached_tokens) &&
               lp_eq(&a->logprobs, &b->logprobs);
    }
    case PROTO_MSG_DECODE_REQ: {
        const proto_decode_req_t *a = &ma->u.decode_req, *b = &mb->u.decode_req;
        return SEQ(request_id) && EQ(flags) && tok_eq(&a->prompt, &b->prompt) &&
               tok_eq(&a->generated, &b->generated) &&
               samp_eq(&a->sampling, &b->sampling) && EQ(rng_state) &&
               SEQ(prefill_peer_id) && EQ(lease_id) &&
               blob_eq(&a->kv_handle, &b->kv_handle) && EQ(kv_tokens) && EQ(deadline_ns) &&
               EQ(n_fork) && EQ(cache_partition);
    }
    case PROTO_MSG_TOKENS: {
        const proto_tokens_msg_t *a = &ma->u.tokens, *b = &mb->u.tokens;
        return SEQ(request_id) && EQ(seq) && tok_eq(&a->tokens, &b->tokens) &&
               blob_eq(&a->text, &b->text) && lp_eq(&a->logprobs, &b->logprobs);
    }
    case PROTO_MSG_FINISH: {
        const proto_finish_t *a = &ma->u.finish, *b = &mb->u.finish;
        return SEQ(request_id) && EQ(reason) && EQ(status) && EQ(prompt_tokens) &&
               EQ(completion_tokens) && EQ(queue_ns) && EQ(prefill_ns) &&
               EQ(transfer_ns) && EQ(decode_ns) && EQ(ttft_ns) && EQ(total_ns) &&
               EQ(cached_tokens) && EQ(kv_bytes);
    }
    case PROTO_MSG_CANCEL: {
        const proto_cancel_t *a = &ma->u.cancel, *b = &mb->u.cancel;
        return SEQ(request_id) && EQ(status) && SEQ(reason);
    }
    case PROTO_MSG_RELEASE: {
        const proto_release_t *a = &ma->u.release, *b = &mb->u.release;
        return SEQ(request_id) && EQ(lease_id);
    }
    case PROTO_MSG_ERROR: {
        const proto_error_t *a = &ma->u.error, *b = &mb->u.error;
        return SEQ(request_id) && EQ(status) && SEQ(message);
    }
    case PROTO_MSG_PEER_INFO: {
        const proto_peer_info_t *a = &ma->u.peer_info, *b = &mb->u.peer_info;
        return SEQ(daemon_id) && EQ(role) && EQ(incarnation) &&
               blob_eq(&a->kv_addr, &b->kv_addr);
    }
    case PROTO_MSG_PEER_DOWN: {
        const proto_peer_down_t *a = &ma->u.peer_down, *b = &mb->u.peer_down;
        return SEQ(daemon_id) && EQ(incarnation) && EQ(status);
    }
    case PROTO_MSG_MIGRATE: {
        const proto_migrate_t *a = &ma->u.migrate, *b = &mb->u.migrate;
        return SEQ(request_id) && SEQ(target_decode_id);
    }
    case PROTO_MSG_MIGRATE_DONE: {
        const proto_migrate_done_t *a = &ma->u.migrate_done, *b = &mb->u.migrate_done;
        return SEQ(request_id) && EQ(n_gen) && EQ(kv_tokens) && EQ(lease_id) &&
               EQ(lease_ns) && blob_eq(&a->kv_handle, &b->kv_handle);
    }
    case PROTO_MSG_KV_EVENTS: {
        const proto_kv_events_t *a = &ma->u.kv_events, *b = &mb->u.kv_events;
        return EQ(flags) && EQ(cached_blocks) && names_eq(&a->stored, &b->stored) &&
               names_eq(&a->removed, &b->removed);
    }
    case PROTO_MSG_KV_EXPORT_REQ: {
        const proto_kv_export_req_t *a = &ma->u.kv_export_req, *b = &mb->u.kv_export_req;
        return SEQ(request_id) && SEQ(target_prefill_id) && tok_eq(&a->prompt, &b->prompt) &&
               EQ(min_tokens) && EQ(cache_partition);
    }
    case PROTO_MSG_KV_EXPORT_DONE: {
        const proto_kv_export_done_t *a = &ma->u.kv_export_done, *b = &mb->u.kv_export_done;
        return SEQ(request_id) && EQ(kv_tokens) && EQ(lease_id) && EQ(lease_ns) &&
               blob_eq(&a->kv_handle, &b->kv_handle);
    }
    case PROTO_MSG_PREFILL_HANDLE: {
        const proto_prefill_handle_t *a = &ma->u.prefill_handle, *b = &mb->u.prefill_handle;
        return SEQ(request_id) && EQ(n_prompt_tokens) && EQ(lease_id) && EQ(lease_ns) &&
               blob_eq(&a->kv_handle, &b->kv_handle);
    }
    case PROTO_MSG_FIRST_TOKEN: {
        const proto_first_token_t *a = &ma->u.first_token, *b = &mb->u.first_token;
        return SEQ(request_id) && EQ(first_token) && EQ(rng_state);
    }
    case PROTO_MSG_EMBED_REQ: {
        const proto_embed_req_t *a = &ma->u.embed_req, *b = &mb->u.embed_req;
        return SEQ(request_id) && EQ(pooling) && tok_eq(&a->prompt, &b->prompt);
    }
    case PROTO_MSG_EMBED_DONE: {
        const proto_embed_done_t *a = &ma->u.embed_done, *b = &mb->u.embed_done;
        return SEQ(request_id) && EQ(n_prompt_tokens) && EQ(queue_ns) && EQ(compute_ns) &&
               blob_eq(&a->vec, &b->vec);
    }
    }
    return 0;
}
