/* pd_etcd.c - see pd_etcd.h. */
#include "pd_etcd.h"
#include "pd_log.h"
#include "pd_httpc.h"
#include "pd_time.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <event2/event.h>

#define ETCD_BODY_MAX (1u << 20)        /* cap on one reply */
#define ETCD_IO_MS 2000                 /* one request, overall */

/* ---- base64 ----------------------------------------------------------------- */

static const char b64_alpha[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t pd_b64_encode(const void *in, size_t n, char *out)
{
    const uint8_t *p = in;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n)
            v |= p[i + 2];
        out[o++] = b64_alpha[v >> 18 & 63];
        out[o++] = b64_alpha[v >> 12 & 63];
        out[o++] = i + 1 < n ? b64_alpha[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? b64_alpha[v & 63] : '=';
    }
    out[o] = '\0';
    return o;
}

static int b64_val(char c)
{
    const char *p = c != '\0' ? strchr(b64_alpha, c) : NULL;
    return p != NULL ? (int)(p - b64_alpha) : -1;
}

long pd_b64_decode(const char *in, size_t n, void *out, size_t cap)
{
    uint8_t *o = out;
    size_t len = 0;
    if (n % 4 != 0)
        return -1;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            if (in[i + k] == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else if (pad > 0 || (v[k] = b64_val(in[i + k])) < 0) {
                return -1;
            }
        }
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        int bytes = 3 - pad;
        if (len + (size_t)bytes > cap)
            return -1;
        for (int k = 0; k < bytes; k++)
            o[len++] = (uint8_t)(x >> (16 - 8 * k));
    }
    return (long)len;
}

/* ---- the HTTP exchange (pd_httpc.h) --------------------------------------- */

static int64_t now_ms(void)
{
    return (int64_t)(pd_now_ns() / PD_NS_PER_MS);
}

/* Connect to endpoint "host:port" with a deadline (ms, now_ms clock); the
 * fd (non-blocking) or a negative status. */
static int etcd_connect(const char *endpoint, int64_t deadline)
{
    char host[128], port[8];
    if (pd_httpc_split_addr(endpoint, host, sizeof(host), port, sizeof(port)) != 0)
        return PD_ERR_BAD_INPUT;
    return pd_httpc_connect(host, port, (uint64_t)deadline * PD_NS_PER_MS);
}

static int send_request(int fd, const char *endpoint, const char *path, const char *json,
                        int64_t deadline)
{
    pd_httpc_req_t req = { .method = "POST", .host = endpoint, .path = path,
                           .body = json, .body_len = strlen(json) };
    return pd_httpc_send(fd, &req, (uint64_t)deadline * PD_NS_PER_MS);
}

int pd_etcd_post(const char *endpoint, const char *path, const char *json, int timeout_ms,
                 char **body_p)
{
    pd_httpc_req_t req = { .method = "POST", .host = endpoint, .path = path,
                           .body = json, .body_len = strlen(json) };
    pd_httpc_reply_t rep;
    pd_status_t st = pd_httpc_fetch(endpoint, &req, (uint64_t)timeout_ms * PD_NS_PER_MS,
                                    ETCD_BODY_MAX, &rep);
    *body_p = NULL;
    if (st != PD_OK) {
        pd_httpc_reply_free(&rep);
        return st;
    }
    *body_p = rep.body;                 /* NUL-terminated, malloc'd */
    rep.body = NULL;
    int code = rep.status;
    pd_httpc_reply_free(&rep);
    return code;
}

/* ---- the member worker ------------------------------------------------------ */

struct pd_member {
    char endpoint[128], prefix[128], key[PD_MEMBER_VAL_MAX], value[PD_MEMBER_VAL_MAX];
    char watch[PD_MEMBER_VAL_MAX];
    bool has_watch;
    uint32_t ttl_s;
    void (*on_change)(void *arg);
    void *arg;
    struct event *ev;                   /* loop side: on_change */
    pthread_t th;
    int stop_pipe[2];
    atomic_bool stop;
    int64_t lease;                      /* worker only */
    pthread_mutex_t mu;                 /* the snapshot + state below */
    pd_member_entry_t ents[PD_MEMBER_MAX];
    uint32_t n;
    bool connected;
    char err[128];
};

static void member_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    pd_member_t *m = arg;
    if (m->on_change)
        m->on_change(m->arg);
}

static void member_set_state(pd_member_t *m, bool connected, const char *err)
{
    pthread_mutex_lock(&m->mu);
    bool changed = m->connected != connected;
    m->connected = connected;
    snprintf(m->err, sizeof(m->err), "%s", err ? err : "");
    pthread_mutex_unlock(&m->mu);
    if (changed)
        event_active(m->ev, EV_READ, 0);
}

/* Sleep ms unless stopped; true when stopped. */
static bool member_nap(pd_member_t *m, int ms)
{
    struct pollfd p = { m->stop_pipe[0], POLLIN, 0 };
    poll(&p, 1, ms);
    return atomic_load(&m->stop);
}

/* POST and parse: the JSON reply (caller deletes) or NULL with err set. */
static cJSON *member_call(pd_member_t *m, const char *path, cJSON *req, char *err, size_t cap)
{
    char *txt = cJSON_PrintUnformatted(req);
    if (txt == NULL) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    char *body = NULL;
    int code = pd_etcd_post(m->endpoint, path, txt, ETCD_IO_MS, &body);
    free(txt);
    if (code < 0) {
        snprintf(err, cap, "etcd %s %s: %s", m->endpoint, path, pd_status_str((pd_status_t)code));
        return NULL;
    }
    cJSON *j = cJSON_Parse(body);
    if (code != 200 || j == NULL) {
        snprintf(err, cap, "etcd %s %s: HTTP %d %.60s", m->endpoint, path, code, body ? body : "");
        cJSON_Delete(j);
        free(body);
        return NULL;
    }
    free(body);
    return j;
}

static int64_t json_i64(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsString(v))
        return strtoll(v->valuestring, NULL, 10);
    if (cJSON_IsNumber(v))
        return (int64_t)v->valuedouble;
    return 0;
}

static void add_b64(cJSON *o, const char *k, const char *s)
{
    char b[4 * (2 * PD_MEMBER_VAL_MAX / 3 + 2) + 8];
    pd_b64_encode(s, strlen(s), b);
    cJSON_AddStringToObject(o, k, b);
}

/* range_end for a prefix: the prefix with its last byte + 1. */
static void prefix_end(const char *p, char *out, size_t cap)
{
    snprintf(out, cap, "%s", p);
    size_t n = strlen(out);
    if (n > 0)
        out[n - 1]++;
}

/* Put our key under the lease we hold. */
static bool member_put(pd_member_t *m, char *err, size_t cap)
{
    char full[2 * PD_MEMBER_VAL_MAX + 8];
    snprintf(full, sizeof(full), "%s%s", m->prefix, m->key);
    cJSON *req = cJSON_CreateObject();
    add_b64(req, "key", full);
    add_b64(req, "value", m->value);
    char id[32];
    snprintf(id, sizeof(id), "%lld", (long long)m->lease);
    cJSON_AddStringToObject(req, "lease", id);
    cJSON *r = member_call(m, "/v3/kv/put", req, err, cap);
    cJSON_Delete(req);
    cJSON_Delete(r);
    return r != NULL;
}

/* New lease + put of our key. */
static bool member_register(pd_member_t *m, char *err, size_t cap)
{
    cJSON *req = cJSON_CreateObject();
    cJSON_AddNumberToObject(req, "TTL", m->ttl_s);
    cJSON *r = member_call(m, "/v3/lease/grant", req, err, cap);
    cJSON_Delete(req);
    if (r == NULL)
        return false;
    m->lease = json_i64(r, "ID");
    cJSON_Delete(r);
    if (m->lease == 0) {
        snprintf(err, cap, "etcd: lease grant without an ID");
        return false;
    }
    if (!member_put(m, err, cap)) {
        m->lease = 0;
        return false;
    }
    return true;
}

/* Our key is still there (an operator's `etcdctl del`, a compaction tool
 * or a forged delete removes it while the lease lives on): put it back.
 * false only on an etcd error. */
static bool member_key_check(pd_member_t *m, char *err, size_t cap)
{
    char full[2 * PD_MEMBER_VAL_MAX + 8];
    snprintf(full, sizeof(full), "%s%s", m->prefix, m->key);
    cJSON *req = cJSON_CreateObject();
    add_b64(req, "key", full);
    cJSON_AddBoolToObject(req, "count_only", 1);
    cJSON *r = member_call(m, "/v3/kv/range", req, err, cap);
    cJSON_Delete(req);
    if (r == NULL)
        return false;
    int64_t count = json_i64(r, "count");
    cJSON_Delete(r);
    if (count > 0)
        return true;
    PD_LOG_DEBUG("etcd", "our key %s was deleted while its lease lives: put it back", full);
    return member_put(m, err, cap);
}

/* Keepalive; false (lease 0) if etcd says the lease is gone. */
static bool member_keepalive(pd_member_t *m, char *err, size_t cap)
{
    cJSON *req = cJSON_CreateObject();
    char id[32];
    snprintf(id, sizeof(id), "%lld", (long long)m->lease);
    cJSON_AddStringToObject(req, "ID", id);
    cJSON *r = member_call(m, "/v3/lease/keepalive", req, err, cap);
    cJSON_Delete(req);
    if (r == NULL)
        return false;
    int64_t ttl = json_i64(cJSON_GetObjectItemCaseSensitive(r, "result"), "TTL");
    cJSON_Delete(r);
    if (ttl <= 0) {
        snprintf(err, cap, "etcd: lease expired");
        m->lease = 0;
        return false;
    }
    return true;
}

/* Range over prefix + watch into the snapshot; the header revision or -1. */
static int64_t member_range(pd_member_t *m, char *err, size_t cap)
{
    char full[2 * PD_MEMBER_VAL_MAX + 8], end[sizeof(full)];
    snprintf(full, sizeof(full), "%s%s", m->prefix, m->watch);
    prefix_end(full, end, sizeof(end));
    cJSON *req = cJSON_CreateObject();
    add_b64(req, "key", full);
    add_b64(req, "range_end", end);
    cJSON_AddNumberToObject(req, "limit", PD_MEMBER_MAX);
    cJSON *r = member_call(m, "/v3/kv/range", req, err, cap);
    cJSON_Delete(req);
    if (r == NULL)
        return -1;
    pd_member_entry_t ents[PD_MEMBER_MAX];
    uint32_t n = 0;
    const cJSON *kv;
    size_t plen = strlen(full);
    cJSON_ArrayForEach(kv, cJSON_GetObjectItemCaseSensitive(r, "kvs")) {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(kv, "key");
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(kv, "value");
        char kb[2 * PD_MEMBER_VAL_MAX + 8];
        long kl, vl;
        if (n == PD_MEMBER_MAX || !cJSON_IsString(k) || !cJSON_IsString(v) ||
            (kl = pd_b64_decode(k->valuestring, strlen(k->valuestring), kb, sizeof(kb) - 1)) < 0)
            continue;
        kb[kl] = '\0';
        if ((size_t)kl <= plen || (size_t)kl - plen >= PD_MEMBER_VAL_MAX ||
            memchr(kb, '\0', (size_t)kl) != NULL) /* a NUL would cut the key short */
            continue;
        pd_member_entry_t *e = &ents[n];
        vl = pd_b64_decode(v->valuestring, strlen(v->valuestring), e->value, PD_MEMBER_VAL_MAX - 1);
        if (vl < 0 || memchr(e->value, '\0', (size_t)vl) != NULL)
            continue;
        e->value[vl] = '\0';
        snprintf(e->key, sizeof(e->key), "%s", kb + plen);
        e->mod_revision = json_i64(kv, "mod_revision");
        n++;
    }
    int64_t rev = json_i64(cJSON_GetObjectItemCaseSensitive(r, "header"), "revision");
    cJSON_Delete(r);
    pthread_mutex_lock(&m->mu);
    bool changed = n != m->n || memcmp(ents, m->ents, n * sizeof(ents[0])) != 0;
    memcpy(m->ents, ents, n * sizeof(ents[0]));
    m->n = n;
    pthread_mutex_unlock(&m->mu);
    if (changed)
        event_active(m->ev, EV_READ, 0);
    return rev;
}

/* Open a watch stream on prefix + watch from revision rev: the fd or -1. */
static int member_watch_open(pd_member_t *m, int64_t rev)
{
    char full[2 * PD_MEMBER_VAL_MAX + 8], end[sizeof(full)];
    snprintf(full, sizeof(full), "%s%s", m->prefix, m->watch);
    prefix_end(full, end, sizeof(end));
    cJSON *req = cJSON_CreateObject();
    cJSON *cr = cJSON_AddObjectToObject(req, "create_request");
    add_b64(cr, "key", full);
    add_b64(cr, "range_end", end);
    char rs[32];
    snprintf(rs, sizeof(rs), "%lld", (long long)rev);
    cJSON_AddStringToObject(cr, "start_revision", rs);
    char *txt = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    if (txt == NULL)
        return -1;
    int64_t deadline = now_ms() + ETCD_IO_MS;
    int fd = etcd_connect(m->endpoint, deadline);
    if (fd >= 0 && send_request(fd, m->endpoint, "/v3/watch", txt, deadline) != 0) {
        close(fd);
        fd = -1;
    }
    free(txt);
    return fd < 0 ? -1 : fd;
}

static void *member_main(void *arg)
{
    pd_member_t *m = arg;
    char err[160] = "";
    int backoff = 200;
    int wfd = -1;
    size_t wseen = 0;                   /* watch bytes since the last range */
    int64_t next_ka = 0;
    while (!atomic_load(&m->stop)) {
        if (m->lease == 0) {
            if (!member_register(m, err, sizeof(err))) {
                member_set_state(m, false, err);
                if (member_nap(m, backoff))
                    break;
                backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
                continue;
            }
            next_ka = now_ms() + (int64_t)m->ttl_s * 1000 / 3;
            if (wfd >= 0) {
                close(wfd);
                wfd = -1;
            }
            member_set_state(m, true, NULL);
            backoff = 200;
        }
        if (m->has_watch && wfd < 0) {
            int64_t rev = member_range(m, err, sizeof(err));
            if (rev < 0) {
                member_set_state(m, false, err);
                if (member_nap(m, backoff))
                    break;
                backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
                continue;
            }
            wfd = member_watch_open(m, rev + 1);
            wseen = 0;
            member_set_state(m, true, NULL);
            backoff = 200;
        }
        /* wait: watch data (a change: range again), keepalive time, stop */
        int64_t left = next_ka - now_ms();
        if (m->has_watch && wfd < 0 && left > 1000)
            left = 1000; /* no watch stream: poll the range every second */
        struct pollfd p[2] = { { m->stop_pipe[0], POLLIN, 0 }, { wfd, POLLIN, 0 } };
        int np = wfd >= 0 ? 2 : 1;
        int pr = left > 0 ? poll(p, (nfds_t)np, (int)left) : 0;
        if (atomic_load(&m->stop))
            break;
        if (pr > 0 && np == 2 && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
            char buf[4096];
            ssize_t r = recv(wfd, buf, sizeof(buf), 0);
            if (r <= 0) {                 /* stream ended: range + watch again */
                close(wfd);
                wfd = -1;
                continue;
            }
            /* the first message only says "created"; later ones carry
             * events: take the whole state again (simple, and bounded) */
            wseen += (size_t)r;
            if (memmem(buf, (size_t)r, "\"events\"", 8) != NULL || wseen > ETCD_BODY_MAX) {
                close(wfd);
                wfd = -1;
            }
            continue;
        }
        if (now_ms() >= next_ka) {
            if (!member_keepalive(m, err, sizeof(err)) ||
                (m->lease != 0 && !member_key_check(m, err, sizeof(err)))) {
                member_set_state(m, false, err);
                if (m->lease == 0) {      /* expired: register again at once */
                    if (wfd >= 0) {
                        close(wfd);
                        wfd = -1;
                    }
                    continue;
                }
                if (member_nap(m, backoff))  /* etcd away: keep the sessions, retry */
                    break;
                backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
                next_ka = now_ms();
                continue;
            }
            next_ka = now_ms() + (int64_t)m->ttl_s * 1000 / 3;
            member_set_state(m, true, NULL);
            backoff = 200;
        }
    }
    if (wfd >= 0)
        close(wfd);
    return NULL;
}

pd_status_t pd_member_start(struct event_base *base, const pd_member_opts_t *o,
                            pd_member_t **m_p)
{
    char host[128], port[8];
    if (o->endpoint == NULL ||
        pd_httpc_split_addr(o->endpoint, host, sizeof(host), port, sizeof(port)) != 0 ||
        o->prefix == NULL ||
        o->key == NULL || o->value == NULL || o->ttl_s < 1 || o->ttl_s > 3600 ||
        strlen(o->endpoint) >= 128 || strlen(o->prefix) >= 128 || o->prefix[0] == '\0' ||
        strlen(o->key) >= PD_MEMBER_VAL_MAX || strlen(o->value) >= PD_MEMBER_VAL_MAX ||
        (o->watch != NULL && (o->watch[0] == '\0' || strlen(o->watch) >= PD_MEMBER_VAL_MAX)))
        return PD_ERR_BAD_INPUT;
    pd_member_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return PD_ERR_NO_MEMORY;
    snprintf(m->endpoint, sizeof(m->endpoint), "%s", o->endpoint);
    snprintf(m->prefix, sizeof(m->prefix), "%s", o->prefix);
    snprintf(m->key, sizeof(m->key), "%s", o->key);
    snprintf(m->value, sizeof(m->value), "%s", o->value);
    if (o->watch) {
        snprintf(m->watch, sizeof(m->watch), "%s", o->watch);
        m->has_watch = true;
    }
    m->ttl_s = o->ttl_s;
    m->on_change = o->on_change;
    m->arg = o->arg;
    pthread_mutex_init(&m->mu, NULL);
    snprintf(m->err, sizeof(m->err), "not connected yet");
    m->ev = event_new(base, -1, 0, member_wake, m);
    if (m->ev == NULL)
        goto err_free;
    if (pipe2(m->stop_pipe, O_CLOEXEC) != 0)
        goto err_ev;
    if (pthread_create(&m->th, NULL, member_main, m) != 0)
        goto err_pipe;
    *m_p = m;
    return PD_OK;
err_pipe:
    close(m->stop_pipe[0]);
    close(m->stop_pipe[1]);
err_ev:
    event_free(m->ev);
err_free:
    pthread_mutex_destroy(&m->mu);
    free(m);
    return PD_ERR_INTERNAL;
}

void pd_member_stop(pd_member_t *m)
{
    if (m == NULL)
        return;
    atomic_store(&m->stop, true);
    ssize_t w = write(m->stop_pipe[1], "x", 1);
    (void)w;
    pthread_join(m->th, NULL);
    if (m->lease != 0) { /* our key goes now, not at the TTL */
        char err[160];
        cJSON *req = cJSON_CreateObject();
        char id[32];
        snprintf(id, sizeof(id), "%lld", (long long)m->lease);
        cJSON_AddStringToObject(req, "ID", id);
        char *txt = cJSON_PrintUnformatted(req);
        cJSON_Delete(req);
        char *body = NULL;
        if (txt != NULL)
            (void)pd_etcd_post(m->endpoint, "/v3/lease/revoke", txt, 500, &body);
        free(txt);
        free(body);
        (void)err;
    }
    close(m->stop_pipe[0]);
    close(m->stop_pipe[1]);
    event_free(m->ev);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

uint32_t pd_member_snapshot(pd_member_t *m, pd_member_entry_t *out, uint32_t cap)
{
    pthread_mutex_lock(&m->mu);
    uint32_t n = m->n;
    memcpy(out, m->ents, (n < cap ? n : cap) * sizeof(*out));
    pthread_mutex_unlock(&m->mu);
    return n;
}

bool pd_member_connected(pd_member_t *m, char *err, size_t err_cap)
{
    pthread_mutex_lock(&m->mu);
    bool c = m->connected;
    if (err != NULL && err_cap > 0)
        snprintf(err, err_cap, "%s", m->err);
    pthread_mutex_unlock(&m->mu);
    return c;
}
