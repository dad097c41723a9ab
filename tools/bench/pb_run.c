/* pb_run.c - pd-bench's run loop: one pass of the workload against one
 * server (request slots on a libevent loop, the SSE measurements, arrivals,
 * timeouts, the pump that reaps and issues), and the target's URL. */
/* One event loop, one process. A fixed pool of request slots (the
 * concurrency cap) is allocated at boot; each slot owns at most one TCP
 * connection (kept alive between its requests, as aiohttp's pooled
 * session in `vllm bench serve`; --no-keep-alive opens one per request),
 * an HTTP/1.1 response parser and an SSE parser (common/pd_httpc.h). Finished slots are reaped from a deferred "pump"
 * event, never inside their own callbacks; the pump also issues new work:
 *   concurrency mode: keep N requests in flight;
 *   rate mode: Poisson arrivals (seeded), queued while all slots are busy.
 * Bounded by construction: caps on concurrency, requests, duration, request
 * timeout, and a hard run deadline after which in-flight requests count as
 * timeouts. Connects only to the --url given. */
#include "pb_int.h"
#include "pd_time.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static void slot_finish(pb_slot_t *s, pb_err_kind_t err, const char *msg);
static void slot_connect(pb_slot_t *s);
static void slot_reconnect(pb_slot_t *s);

static void ready_push(pb_run_t *run, uint32_t c)
{
    run->ready[(run->ready_head + run->ready_n) % run->n_convs] = c;
    run->ready_n++;
}

static uint32_t ready_pop(pb_run_t *run)
{
    uint32_t c = run->ready[run->ready_head];

    run->ready_head = (run->ready_head + 1) % run->n_convs;
    run->ready_n--;
    return c;
}

static void pump_kick(pb_run_t *run)
{
    event_active(run->pump_ev, EV_TIMEOUT, 0);
}

/* ---- one request ------------------------------------------------------- */

static void itl_push(pb_slot_t *s, uint64_t gap)
{
    uint64_t *n;

    if (s->rec.n_itl >= PB_MAX_ITL)
        return;
    if (s->rec.n_itl == s->itl_cap) {
        uint32_t cap = s->itl_cap ? s->itl_cap * 2 : 64;
        n = realloc(s->rec.itl_ns, cap * sizeof(*n));
        if (n == NULL)
            return;
        s->rec.itl_ns = n;
        s->itl_cap = cap;
    }
    s->rec.itl_ns[s->rec.n_itl++] = gap;
}

static void copy_msg(char *dst, size_t cap, const char *src)
{
    size_t i, j = 0;

    for (i = 0; src[i] != '\0' && j + 1 < cap; i++)
        dst[j++] = (src[i] >= 0x20 && src[i] < 0x7f) ? src[i] : ' ';
    dst[j] = '\0';
}

/* Multi-turn: keep the answer for the next turn's history (capped; the
 * rest of a longer answer is dropped). */
static void answer_append(pb_slot_t *s, const char *text)
{
    size_t tl = strlen(text);

    if (tl > PB_MAX_ANSWER - s->ans_len)
        tl = PB_MAX_ANSWER - s->ans_len;
    if (tl == 0)
        return;
    if (s->ans_len + tl + 1 > s->ans_cap) {
        size_t cap = s->ans_cap ? s->ans_cap : 1024;
        char *n;

        while (cap < s->ans_len + tl + 1)
            cap *= 2;
        n = realloc(s->answer, cap);
        if (n == NULL)
            return;
        s->answer = n;
        s->ans_cap = cap;
    }
    memcpy(s->answer + s->ans_len, text, tl);
    s->ans_len += tl;
    s->answer[s->ans_len] = '\0';
}

static void on_sse_event(void *arg, const char *data, size_t len)
{
    pb_slot_t *s = arg;
    cJSON *j, *e, *u, *ch, *c0, *t;

    if (s->state != SLOT_ACTIVE)
        return;
    if (strcmp(data, "[DONE]") == 0) {
        s->got_done = true;
        s->t_done = s->t_now;
        return;
    }
    j = cJSON_ParseWithLength(data, len);
    if (j == NULL) {
        slot_finish(s, PB_ERR_PROTOCOL, "SSE data is not JSON");
        return;
    }
    e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (e != NULL && !cJSON_IsNull(e)) {
        cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
        s->got_error_frame = true;
        slot_finish(s, PB_ERR_STREAM_ERROR,
                    cJSON_IsString(m) ? m->valuestring : "error frame");
        cJSON_Delete(j);
        return;
    }
    u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    if (cJSON_IsObject(u)) {
        cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
        cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
        if (cJSON_IsNumber(ct) && ct->valuedouble >= 0 && ct->valuedouble <= UINT32_MAX) {
            s->rec.output_tokens = (uint32_t)ct->valuedouble;
            s->rec.usage_seen = true;
        }
        cJSON *ptd = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details");
        cJSON *cached = cJSON_GetObjectItemCaseSensitive(ptd, "cached_tokens");
        if (cJSON_IsNumber(pt) && pt->valuedouble >= 0 && pt->valuedouble <= UINT32_MAX)
            s->rec.input_tokens = (uint32_t)pt->valuedouble;
        /* Shown when the server reports it (vLLM, SGLang, llama-server). */
        if (cJSON_IsNumber(cached) && cached->valuedouble >= 0 &&
            cached->valuedouble <= UINT32_MAX) {
            s->rec.cached_tokens = (uint32_t)cached->valuedouble;
            s->rec.cached_seen = true;
        }
    }
    ch = cJSON_GetObjectItemCaseSensitive(j, "choices");
    c0 = cJSON_IsArray(ch) ? cJSON_GetArrayItem(ch, 0) : NULL;
    if (c0 != NULL) {
        if (s->run->endpoint == PB_EP_CHAT) {
            cJSON *d = cJSON_GetObjectItemCaseSensitive(c0, "delta");
            t = cJSON_GetObjectItemCaseSensitive(d, "content");
        } else {
            t = cJSON_GetObjectItemCaseSensitive(c0, "text");
        }
        if (cJSON_IsString(t) && t->valuestring[0] != '\0') {
            if (s->rec.content_chunks == 0)
                s->rec.ttft_ns = s->t_now - s->t_send;
            else
                itl_push(s, s->t_now - s->t_last);
            s->t_last = s->t_now;
            s->rec.content_chunks++;
            if (s->run->workload == PB_WL_MULTI_TURN && !s->warmup)
                answer_append(s, t->valuestring);
        }
    }
    cJSON_Delete(j);
}

static void on_body(void *arg, const char *data, size_t len)
{
    pb_slot_t *s = arg;
    pd_status_t status;

    if (s->state != SLOT_ACTIVE)
        return;
    if (s->http.status != 200) {
        size_t room = sizeof(s->errbody) - 1 - s->errbody_len;
        if (len > room)
            len = room;
        memcpy(s->errbody + s->errbody_len, data, len);
        s->errbody_len += len;
        s->errbody[s->errbody_len] = '\0';
        return;
    }
    status = pd_sse_feed(&s->sse, data, len, on_sse_event, s);
    if (status != PD_OK)
        slot_finish(s, PB_ERR_PROTOCOL, pd_status_str(status));
}

static pb_err_kind_t http_kind(int status)
{
    if (status >= 400 && status < 500)
        return PB_ERR_HTTP_4XX;
    if (status >= 500)
        return PB_ERR_HTTP_5XX;
    return PB_ERR_HTTP_OTHER;
}

/* The response ended (complete body or EOF after headers). */
static void slot_end_of_response(pb_slot_t *s)
{
    if (s->http.status != 200) {
        char msg[160];
        cJSON *j = cJSON_Parse(s->errbody);
        cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
        snprintf(msg, sizeof(msg), "HTTP %d%s%s", s->http.status,
                 cJSON_IsString(m) ? ": " : "",
                 cJSON_IsString(m) ? m->valuestring : "");
        cJSON_Delete(j);
        slot_finish(s, http_kind(s->http.status), msg);
    } else if (s->got_done) {
        slot_finish(s, PB_ERR_NONE, NULL);
    } else {
        slot_finish(s, PB_ERR_NO_DONE, "stream ended without [DONE]");
    }
}

static void slot_read_cb(struct bufferevent *bev, void *arg)
{
    pb_slot_t *s = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    char buf[16384];
    int n;

    if (s->state == SLOT_FREE) {
        /* Bytes on an idle kept-alive connection: not reusable. */
        s->bev_dead = true;
        bufferevent_disable(bev, EV_READ | EV_WRITE);
        return;
    }
    s->t_now = pd_now_ns();
    while (s->state == SLOT_ACTIVE &&
           (n = evbuffer_remove(in, buf, sizeof(buf))) > 0) {
        s->got_bytes = true;
        pd_status_t status = pd_httpc_resp_feed(&s->http, buf, (size_t)n,
                                               on_body, s, NULL);
        if (s->state != SLOT_ACTIVE)
            return;
        if (status != PD_OK) {
            slot_finish(s, PB_ERR_PROTOCOL, "malformed HTTP response");
            return;
        }
        /* [DONE] ends the measurement (t_done). Without keep-alive the rest
         * of the body is not needed; with it, the connection is reusable
         * only once the body has ended. */
        if (s->http.complete || (s->got_done && !s->run->cfg.keep_alive)) {
            slot_end_of_response(s);
            return;
        }
    }
}

static void slot_event_cb(struct bufferevent *bev, short what, void *arg)
{
    pb_slot_t *s = arg;

    if (s->state == SLOT_FREE) {
        /* The server closed an idle kept-alive connection. */
        s->bev_dead = true;
        bufferevent_disable(bev, EV_READ | EV_WRITE);
        return;
    }
    if (s->state != SLOT_ACTIVE)
        return;
    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        s->connected = true;
        setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one,
                   sizeof(one));
        return;
    }
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        char msg[160];
        int err = EVUTIL_SOCKET_ERROR();

        s->t_now = pd_now_ns();
        /* Drain anything still buffered before judging the end. */
        slot_read_cb(bev, s);
        if (s->state != SLOT_ACTIVE)
            return;
        if (s->reused && !s->got_bytes && !s->retried && s->req != NULL) {
            /* The server had closed the kept-alive connection (idle
             * timeout, keep-alive budget) before answering: nothing of
             * this request was processed. Send it once more on a fresh
             * connection, as wrk and aiohttp do; counted as a reconnect,
             * not an error. The request keeps its original send time. */
            slot_reconnect(s);
            return;
        }
        if (!s->connected) {
            snprintf(msg, sizeof(msg), "connect: %s", strerror(err));
            slot_finish(s, PB_ERR_CONNECT, msg);
        } else if (!s->http.headers_done) {
            slot_finish(s, PB_ERR_DISCONNECT, s->reused
                        ? "kept-alive connection closed before response headers"
                        : "connection closed before response headers");
        } else if (pd_httpc_resp_eof(&s->http) || s->http.status != 200 ||
                   s->got_done) {
            slot_end_of_response(s);
        } else {
            slot_finish(s, PB_ERR_NO_DONE, "connection closed mid-stream");
        }
    }
}

static void slot_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    pb_slot_t *s = arg;

    if (s->state != SLOT_ACTIVE)
        return;
    if (s->got_done && s->http.status == 200)
        slot_finish(s, PB_ERR_NONE, NULL);   /* only the body end was late */
    else
        slot_finish(s, PB_ERR_TIMEOUT, "request timeout");
}

/* Record the outcome once; the pump reaps the slot later. */
static void slot_finish(pb_slot_t *s, pb_err_kind_t err, const char *msg)
{
    uint64_t now = pd_now_ns();

    if (s->state != SLOT_ACTIVE)
        return;
    s->state = SLOT_FINISHED;
    s->rec.err = err;
    s->rec.success = err == PB_ERR_NONE;
    s->rec.http_status = s->http.headers_done ? s->http.status : 0;
    s->rec.e2el_ns = (s->t_done ? s->t_done : now) - s->t_send;
    if (!s->rec.usage_seen)
        s->rec.output_tokens = s->rec.content_chunks;
    if (msg != NULL)
        copy_msg(s->rec.err_msg, sizeof(s->rec.err_msg), msg);
    if (s->bev != NULL)
        bufferevent_disable(s->bev, EV_READ | EV_WRITE);
    evtimer_del(s->timer);
    if (!s->warmup && now > s->run->t_last_done)
        s->run->t_last_done = now;
    pump_kick(s->run);
}

static void slot_issue(pb_run_t *run, bool warmup)
{
    pb_slot_t *s = run->free_slots;
    char *req;
    size_t req_len = 0;
    uint64_t seq = warmup ? run->warm_issued : run->issued;
    struct timeval tv;

    run->free_slots = s->next;
    s->next = NULL;
    run->inflight++;
    if (run->inflight > run->max_inflight && !warmup)
        run->max_inflight = run->inflight;
    if (warmup)
        run->warm_issued++;
    else
        run->issued++;

    memset(&s->rec, 0, sizeof(s->rec));
    s->rec.id = (uint32_t)seq;
    s->state = SLOT_ACTIVE;
    s->warmup = warmup;
    s->connected = s->got_done = s->got_error_frame = s->reused = false;
    s->got_bytes = s->retried = false;
    s->ans_len = 0;
    if (run->workload == PB_WL_MULTI_TURN && !warmup)
        s->conv = ready_pop(run);
    s->t_done = 0;
    s->itl_cap = 0;
    s->errbody_len = 0;
    s->errbody[0] = '\0';
    pd_httpc_resp_init(&s->http, PB_BODY_MAX);
    pd_sse_init(&s->sse);

    req = pb_build_request(run, s, seq, &req_len);
    s->t_send = pd_now_ns();
    s->rec.start_ns = warmup ? 0 : s->t_send - run->t0;
    tv = pd_ns_to_timeval(run->cfg.request_timeout_ns);
    evtimer_add(s->timer, &tv);
    if (req == NULL) {
        slot_finish(s, PB_ERR_PROTOCOL, "out of memory building request");
        return;
    }
    s->req = req;
    s->req_len = req_len;
    if (s->bev != NULL && !s->bev_dead) {
        /* Kept-alive connection of this slot. */
        s->reused = s->connected = s->rec.conn_reused = true;
        bufferevent_enable(s->bev, EV_READ | EV_WRITE);
        bufferevent_write(s->bev, req, req_len);
        return;
    }
    if (s->bev != NULL) {
        if (!warmup)
            run->idle_closed++;
        bufferevent_free(s->bev);
        s->bev = NULL;
    }
    slot_connect(s);
}

/* Open a fresh connection for the slot and queue its request bytes. */
static void slot_connect(pb_slot_t *s)
{
    pb_run_t *run = s->run;

    s->bev_dead = false;
    s->bev = bufferevent_socket_new(run->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (s->bev == NULL) {
        slot_finish(s, PB_ERR_CONNECT, "cannot create socket");
        return;
    }
    bufferevent_setcb(s->bev, slot_read_cb, NULL, slot_event_cb, s);
    bufferevent_enable(s->bev, EV_READ | EV_WRITE);
    bufferevent_write(s->bev, s->req, s->req_len);
    if (bufferevent_socket_connect(s->bev, (struct sockaddr *)&run->addr,
                                   (int)run->addrlen) < 0) {
        char msg[160];
        snprintf(msg, sizeof(msg), "connect: %s", strerror(errno));
        slot_finish(s, PB_ERR_CONNECT, msg);
    }
}

static void slot_reconnect(pb_slot_t *s)
{
    s->retried = true;
    s->rec.reconnected = true;
    s->reused = s->connected = false;
    bufferevent_free(s->bev);
    s->bev = NULL;
    pd_httpc_resp_init(&s->http, PB_BODY_MAX);
    slot_connect(s);
}

/* Multi-turn: a turn ended. On success the user message and the answer
 * join the history and the conversation is ready for its next turn; a
 * failed turn ends its conversation (its later turns are skipped). */
static void conv_turn_done(pb_run_t *run, pb_slot_t *s)
{
    pb_conv_t *c = &run->convs[s->conv];
    size_t add = (s->user_msg ? strlen(s->user_msg) : 0) + s->ans_len + 64;
    bool ok = s->rec.success && s->user_msg != NULL &&
              pb_add_message(c->msgs, "user", s->user_msg) &&
              pb_add_message(c->msgs, "assistant", s->ans_len > 0 ? s->answer : "");

    free(s->user_msg);
    s->user_msg = NULL;
    s->ans_len = 0;
    c->turn++;
    c->bytes += add;
    if (c->turn >= run->cfg.turns)
        return;
    if (ok && c->bytes <= PB_MAX_CONV_BYTES) {
        ready_push(run, s->conv);
        return;
    }
    run->skipped_turns += run->cfg.turns - c->turn;
    c->turn = (uint32_t)run->cfg.turns;
}

static void slot_reap(pb_run_t *run, pb_slot_t *s)
{
    /* Keep the connection only after a whole response with nothing left
     * over and no "Connection: close" (an error frame closes the stream). */
    bool reuse = run->cfg.keep_alive && s->bev != NULL && s->http.complete &&
                 !s->http.conn_close && !s->bev_dead &&
                 (s->rec.err == PB_ERR_NONE || s->rec.err == PB_ERR_HTTP_4XX ||
                  s->rec.err == PB_ERR_HTTP_5XX || s->rec.err == PB_ERR_NO_DONE) &&
                 evbuffer_get_length(bufferevent_get_input(s->bev)) == 0;

    if (reuse) {
        /* Idle: watch for the server closing it (slot callbacks see
         * SLOT_FREE and mark it dead). */
        bufferevent_enable(s->bev, EV_READ);
    } else if (s->bev != NULL) {
        bufferevent_free(s->bev);
        s->bev = NULL;
    }
    pd_sse_fini(&s->sse);
    free(s->req);
    s->req = NULL;
    if (!s->warmup && run->workload == PB_WL_MULTI_TURN)
        conv_turn_done(run, s);
    if (s->warmup) {
        free(s->rec.itl_ns);
    } else {
        /* n_recs was reserved at issue time; records are indexed by seq. */
        run->recs[s->rec.id] = s->rec;
    }
    s->rec.itl_ns = NULL;
    s->state = SLOT_FREE;
    s->next = run->free_slots;
    run->free_slots = s;
    run->inflight--;
}

/* ---- scheduling -------------------------------------------------------- */

static bool reserve_record(pb_run_t *run)
{
    pb_record_t *n;
    size_t cap;

    if (run->issued >= PB_MAX_REQUESTS)
        return false;
    if (run->issued < run->cap_recs)
        return true;
    cap = run->cap_recs ? run->cap_recs * 2 : 1024;
    if (cap > PB_MAX_REQUESTS)
        cap = PB_MAX_REQUESTS;
    n = realloc(run->recs, cap * sizeof(*n));
    if (n == NULL)
        return false;
    memset(n + run->cap_recs, 0, (cap - run->cap_recs) * sizeof(*n));
    run->recs = n;
    run->cap_recs = cap;
    return true;
}

static bool main_may_issue_more(pb_run_t *run, uint64_t now)
{
    if (run->stopping)
        return false;
    if (run->num_requests && run->issued >= run->num_requests)
        return false;
    if (run->cfg.duration_ns && now >= run->t0 + run->cfg.duration_ns)
        return false;
    if (run->workload == PB_WL_MULTI_TURN && run->ready_n == 0)
        return false;
    return run->issued < PB_MAX_REQUESTS;
}

static void schedule_arrival(pb_run_t *run, uint64_t now)
{
    struct timeval tv;
    uint64_t at;

    if (run->workload == PB_WL_TRACE)
        run->next_arrival_ns = run->t0 +
            run->trace.e[run->arrivals < run->trace.n ? run->arrivals : 0].at_ns;
    else
        run->next_arrival_ns += (uint64_t)(pb_rng_exp(&run->rng_arrival,
                                                      run->cfg.rate) * 1e9);
    at = run->next_arrival_ns;
    if (run->stopping ||
        (run->num_requests && run->arrivals >= run->num_requests) ||
        (run->workload == PB_WL_TRACE && run->arrivals >= run->trace.n) ||
        (run->cfg.duration_ns && at >= run->t0 + run->cfg.duration_ns) ||
        run->arrivals >= PB_MAX_REQUESTS) {
        run->arrivals_over = true;
        pump_kick(run);
        return;
    }
    tv = pd_ns_to_timeval(at > now ? at - now : 0);
    evtimer_add(run->arrival_ev, &tv);
}

static void arrival_cb(evutil_socket_t fd, short what, void *arg)
{
    pb_run_t *run = arg;

    run->arrivals++;
    run->pending++;
    schedule_arrival(run, pd_now_ns());
    pump_kick(run);
}

static void start_main_phase(pb_run_t *run)
{
    struct timeval tv;
    uint64_t deadline_ns;

    run->phase = PHASE_MAIN;
    run->t0 = pd_now_ns();
    run->t_last_done = run->t0;
    /* Hard stop: duration (or a generous bound for count-only runs) plus
     * one request timeout for the tail. */
    deadline_ns = run->cfg.request_timeout_ns + PD_NS_PER_S;
    if (run->cfg.duration_ns)
        deadline_ns += run->cfg.duration_ns;
    else
        deadline_ns += 86400ULL * PD_NS_PER_S;
    tv = pd_ns_to_timeval(deadline_ns);
    evtimer_add(run->deadline_ev, &tv);
    if (run->rate_mode) {
        run->next_arrival_ns = run->t0;
        /* The first request arrives at t0, the rest after exp() gaps. */
        run->arrivals = 1;
        run->pending = 1;
        if ((run->num_requests && run->num_requests <= 1) || run->stopping)
            run->arrivals_over = true;
        else
            schedule_arrival(run, run->t0);
    }
}

static void pump_cb(evutil_socket_t fd, short what, void *arg)
{
    pb_run_t *run = arg;
    uint32_t i;
    uint64_t now = pd_now_ns();

    for (i = 0; i < run->n_slots; i++)
        if (run->slots[i].state == SLOT_FINISHED)
            slot_reap(run, &run->slots[i]);

    if (run->phase == PHASE_WARMUP) {
        uint32_t cap = run->n_slots;
        while (run->free_slots != NULL && run->warm_issued < run->cfg.warmup &&
               run->inflight < cap && !run->stopping)
            slot_issue(run, true);
        if ((run->warm_issued >= run->cfg.warmup || run->stopping) &&
            run->inflight == 0)
            start_main_phase(run);
        else
            return;
    }
    if (run->phase != PHASE_MAIN)
        return;
    if (run->rate_mode) {
        while (run->pending > 0 && run->free_slots != NULL && !run->stopping &&
               reserve_record(run)) {
            run->pending--;
            slot_issue(run, false);
        }
        if (run->stopping)
            run->pending = 0;
        if ((run->arrivals_over || run->stopping) && run->pending == 0 &&
            run->inflight == 0)
            goto done;
    } else {
        while (run->free_slots != NULL && main_may_issue_more(run, now) &&
               reserve_record(run))
            slot_issue(run, false);
        if (!main_may_issue_more(run, now) && run->inflight == 0)
            goto done;
    }
    return;
done:
    run->phase = PHASE_DONE;
    run->n_recs = run->issued;
    event_base_loopbreak(run->base);
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    pb_run_t *run = arg;
    uint32_t i;

    run->stopping = true;
    run->arrivals_over = true;
    evtimer_del(run->arrival_ev);
    for (i = 0; i < run->n_slots; i++)
        slot_finish(&run->slots[i], PB_ERR_TIMEOUT, "run deadline");
    pump_kick(run);
}

static void sigint_cb(evutil_socket_t fd, short what, void *arg)
{
    pb_run_t *run = arg;

    if (run->stopping) {
        deadline_cb(-1, 0, run);
        return;
    }
    fprintf(stderr, "%s: interrupted: finishing requests in flight "
            "(again to abort them)\n", PB_PROG);
    run->stopping = true;
    run->arrivals_over = true;
    evtimer_del(run->arrival_ev);
    pump_kick(run);
}

/* ---- loop -------------------------------------------------------------- */

int pb_loop_setup(pb_run_t *run)
{
    uint32_t i;

    {
        /* Precise timers: arrivals and timeouts would otherwise follow the
         * coarse monotonic clock (its step: docs/BENCHMARKS.md, tools/bench). */
        struct event_config *ec = event_config_new();
        if (ec == NULL)
            return 1;
        event_config_set_flag(ec, EVENT_BASE_FLAG_PRECISE_TIMER);
        run->base = event_base_new_with_config(ec);
        event_config_free(ec);
    }
    if (run->base == NULL)
        return 1;
    run->pump_ev = event_new(run->base, -1, 0, pump_cb, run);
    run->arrival_ev = evtimer_new(run->base, arrival_cb, run);
    run->deadline_ev = evtimer_new(run->base, deadline_cb, run);
    run->sigint_ev = evsignal_new(run->base, SIGINT, sigint_cb, run);
    run->slots = calloc(run->n_slots, sizeof(*run->slots));
    if (run->pump_ev == NULL || run->arrival_ev == NULL ||
        run->deadline_ev == NULL || run->sigint_ev == NULL || run->slots == NULL)
        return 1;
    evsignal_add(run->sigint_ev, NULL);
    for (i = run->n_slots; i-- > 0;) {
        pb_slot_t *s = &run->slots[i];
        s->run = run;
        s->timer = evtimer_new(run->base, slot_timeout_cb, s);
        if (s->timer == NULL)
            return 1;
        s->next = run->free_slots;
        run->free_slots = s;
    }
    return 0;
}

/* ---- target ------------------------------------------------------------ */

pd_status_t pb_parse_url(pb_run_t *run, const char *url)
{
    const char *p, *host_end, *path;
    char host[256], port[16] = "80";
    struct addrinfo hints, *res = NULL;
    size_t hl, bl;
    int rc;

    if (strncmp(url, "http://", 7) != 0) {
        fprintf(stderr, "%s: --url: only http:// URLs are supported, got \"%s\"\n",
                PB_PROG, url);
        return PD_ERR_BAD_INPUT;
    }
    p = url + 7;
    path = strchr(p, '/');
    if (path == NULL)
        path = p + strlen(p);
    if (*p == '[') {
        host_end = memchr(p, ']', (size_t)(path - p));
        if (host_end == NULL)
            goto bad;
        hl = (size_t)(host_end - p - 1);
        if (hl >= sizeof(host))
            goto bad;
        memcpy(host, p + 1, hl);
        host[hl] = '\0';
        host_end++;
    } else {
        host_end = memchr(p, ':', (size_t)(path - p));
        if (host_end == NULL)
            host_end = path;
        hl = (size_t)(host_end - p);
        if (hl == 0 || hl >= sizeof(host))
            goto bad;
        memcpy(host, p, hl);
        host[hl] = '\0';
    }
    if (*host_end == ':') {
        size_t pl = (size_t)(path - host_end - 1);
        if (pl == 0 || pl >= sizeof(port) || strspn(host_end + 1, "0123456789") < pl)
            goto bad;
        memcpy(port, host_end + 1, pl);
        port[pl] = '\0';
    } else if (host_end != path) {
        goto bad;
    }
    snprintf(run->host_hdr, sizeof(run->host_hdr), "%.*s", (int)(path - p), p);
    /* Base path without a trailing '/'; "/v1" is added unless present. */
    bl = strlen(path);
    while (bl > 0 && path[bl - 1] == '/')
        bl--;
    if (bl >= 256)
        goto bad;
    snprintf(run->path, sizeof(run->path), "%.*s%s%s", (int)bl, path,
             (bl >= 3 && strncmp(path + bl - 3, "/v1", 3) == 0) ? "" : "/v1",
             run->endpoint == PB_EP_CHAT ? "/chat/completions" : "/completions");

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0 || res == NULL) {
        fprintf(stderr, "%s: --url: cannot resolve %s: %s\n", PB_PROG, host,
                gai_strerror(rc));
        return PD_ERR_BAD_INPUT;
    }
    memcpy(&run->addr, res->ai_addr, res->ai_addrlen);
    run->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    return PD_OK;
bad:
    fprintf(stderr, "%s: --url: cannot parse \"%s\" (want http://HOST[:PORT][/PATH])\n",
            PB_PROG, url);
    return PD_ERR_BAD_INPUT;
}

/* Blocking GET /v1/models before the loop starts (boot code; 5 s cap).
 * Returns the first model id (malloc'd) or NULL. */
static char *fetch_model(pb_run_t *run)
{
    char base[512], auth[600] = "", *id = NULL, *v1;
    pd_httpc_req_t req = { .method = "GET", .host = run->host_hdr, .path = base };
    pd_httpc_resp_t *http = malloc(sizeof(*http));
    pd_httpc_reply_t rep = { 0 };
    uint64_t deadline_ns = pd_now_ns() + 5 * PD_NS_PER_S;
    struct timeval tv = { 5, 0 };
    cJSON *j, *data, *m0, *mid;
    int fd;

    if (http == NULL)
        goto out_free;
    snprintf(base, sizeof(base), "%s", run->path);
    v1 = strstr(base, "/v1/");
    if (v1 == NULL)
        goto out_free;
    strcpy(v1, "/v1/models");
    if (run->cfg.api_key != NULL)
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", run->cfg.api_key);
    req.headers = auth;
    fd = socket(run->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        goto out_free;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&run->addr, run->addrlen) < 0)
        goto out_close;
    pd_httpc_resp_init(http, 1u << 20);
    if (pd_httpc_send(fd, &req, deadline_ns) != PD_OK ||
        pd_httpc_recv(fd, http, deadline_ns, &rep) != PD_OK || rep.status != 200)
        goto out_close;
    j = cJSON_Parse(rep.body);
    data = cJSON_GetObjectItemCaseSensitive(j, "data");
    m0 = cJSON_IsArray(data) ? cJSON_GetArrayItem(data, 0) : NULL;
    mid = cJSON_GetObjectItemCaseSensitive(m0, "id");
    if (cJSON_IsString(mid))
        id = strdup(mid->valuestring);
    cJSON_Delete(j);
out_close:
    close(fd);
out_free:
    pd_httpc_reply_free(&rep);
    free(http);
    return id;
}

/* ---- one pass ---------------------------------------------------------- */

/* Prepare a pass against `url` (--url, then --compare): fresh slots,
 * records, conversations and generators, so both passes send the same
 * workload with the same arrivals. */
int pb_pass_begin(pb_run_t *run, const char *url, const char *model)
{
    uint32_t i;

    run->target_url = url;
    if (pb_parse_url(run, url) != PD_OK)
        return PD_CONFIG_EXIT_USAGE;
    evtimer_del(run->arrival_ev);
    evtimer_del(run->deadline_ev);
    run->free_slots = NULL;
    for (i = run->n_slots; i-- > 0;) {
        pb_slot_t *s = &run->slots[i];

        if (s->bev != NULL)
            bufferevent_free(s->bev);
        s->bev = NULL;
        s->bev_dead = false;
        s->state = SLOT_FREE;
        s->next = run->free_slots;
        run->free_slots = s;
    }
    for (i = 0; i < run->n_recs; i++)
        free(run->recs[i].itl_ns);
    free(run->recs);
    run->recs = NULL;
    run->n_recs = run->cap_recs = 0;
    run->inflight = run->max_inflight = 0;
    run->warm_issued = run->issued = run->arrivals = run->pending = 0;
    run->arrivals_over = false;
    run->skipped_turns = run->idle_closed = 0;
    run->t0 = run->t_end_issue = run->t_last_done = run->next_arrival_ns = 0;
    pb_rng_seed(&run->rng_prompt, run->cfg.seed);
    pb_rng_seed(&run->rng_arrival, run->cfg.seed ^ 0xa5a5a5a5a5a5a5a5ULL);
    run->ready_head = run->ready_n = 0;
    for (i = 0; i < run->n_convs; i++) {
        cJSON_Delete(run->convs[i].msgs);
        run->convs[i].msgs = cJSON_CreateArray();
        run->convs[i].turn = 0;
        run->convs[i].bytes = 0;
        if (run->convs[i].msgs == NULL)
            return 1;
        if (run->workload == PB_WL_MULTI_TURN && run->cfg.system_len > 0) {
            /* one system prompt for every conversation (seeded once) */
            pb_prompt_buf_t sys;
            pb_rng_t srng;
            bool ok;
            pb_prompt_buf_init(&sys, false, 0, 0);
            pb_block_rng(&srng, run->cfg.seed ^ 0x73797374ULL, 0);
            ok = pb_prompt_add(&sys, &srng, (uint32_t)run->cfg.system_len) == PD_OK &&
                 pb_add_message(run->convs[i].msgs, "system", sys.text);
            pb_prompt_buf_fini(&sys);
            if (!ok)
                return 1;
        }
        ready_push(run, i);
    }
    if (run->num_requests) {
        run->cap_recs = run->num_requests;
        run->recs = calloc(run->cap_recs, sizeof(*run->recs));
        if (run->recs == NULL)
            return 1;
    }
    run->model = model;
    if (run->model == NULL) {
        free(run->model_fetched);
        run->model_fetched = fetch_model(run);
        run->model = run->model_fetched;
        if (run->model == NULL) {
            fprintf(stderr, "%s: no model given and GET /v1/models at %s "
                    "gave no model id\n", PB_PROG, url);
            return 1;
        }
    }
    run->phase = run->cfg.warmup > 0 ? PHASE_WARMUP : PHASE_MAIN;
    if (run->phase == PHASE_MAIN)
        start_main_phase(run);
    pump_kick(run);
    return 0;
}
