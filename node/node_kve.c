/* node_kve.c - the prefix cache's store / remove events, batched for the
 * router's block index (KV_EVENTS, proto/PROTOCOL.md).
 *
 * Events are coalesced by name (a name's last change wins) into one
 * frame's worth, PROTO_MAX_KV_EVENTS names, and sent kv-events-interval
 * after the first one, or at once when the batch is full. Memory is fixed
 * at boot. Whenever the router's view may be wrong — a new session (it
 * knows nothing of us), or a batch that could not be kept (session down)
 * — the next flush is a snapshot instead: RESET, then every cached name,
 * in as many frames as it takes. So the index is never stale for longer
 * than one interval, and never grows past what the cache holds. */
#include "node.h"

#include <stdlib.h>
#include <string.h>

#include "pd_log.h"
#include "pd_time.h"

#define KVE_SLOTS (2u * PROTO_MAX_KV_EVENTS) /* power of two: open addressing */
/* A snapshot lists at most this many names (64 frames, ~2 MiB: well under
 * the session's 4 MiB output cap, so it can never close the session it is
 * meant for; 4x the router's default per-backend cap). A larger
 * cache is indexed in part (the first names in block order) until its
 * blocks change; counted as snapshots_truncated. */
#define KVE_SNAPSHOT_MAX (64u * PROTO_MAX_KV_EVENTS)

struct node_kve {
    node_t *n;
    struct event *timer;
    bool armed;
    bool need_reset;                 /* next flush: RESET + snapshot */
    uint32_t n_pending;
    uint64_t names[PROTO_MAX_KV_EVENTS];   /* (n_pending) */
    uint8_t ops[PROTO_MAX_KV_EVENTS];      /* (n_pending) kvx_prefix_event_t */
    uint32_t slot[KVE_SLOTS];              /* index + 1 into names, 0 = empty */
    uint64_t stored[PROTO_MAX_KV_EVENTS];  /* flush scratch */
    uint64_t removed[PROTO_MAX_KV_EVENTS]; /* flush scratch */
    node_kve_stats_t st;
};

static void kve_clear(node_kve_t *k)
{
    k->n_pending = 0;
    memset(k->slot, 0, sizeof(k->slot));
}

/* One frame to every router that is up (each keeps its own index); false
 * if a session refused it (that session is closed then; the next frame to
 * every router is a snapshot). */
static bool kve_send(node_kve_t *k, uint32_t flags, const uint64_t *st, uint32_t ns,
                     const uint64_t *rm, uint32_t nr)
{
    node_t *n = k->n;
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.hdr.type = PROTO_MSG_KV_EVENTS;
    m.u.kv_events.flags = flags;
    kvx_prefix_stats_t ps;
    kvx_prefix_stats(n->prefix, &ps);
    m.u.kv_events.cached_blocks = ps.entries;
    m.u.kv_events.stored = (proto_names_t){ ns, ns ? st : NULL, NULL };
    m.u.kv_events.removed = (proto_names_t){ nr, nr ? rm : NULL, NULL };
    bool ok = true;
    for (uint32_t i = 0; i < NODE_ROUTERS_MAX; i++) {
        node_link_t *l = &n->links[i];
        if (!l->in_use || !proto_session_up(l->sess))
            continue;
        pd_status_t s = proto_session_send(l->sess, &m);
        if (s != PD_OK) {
            pd_log(PD_LOG_DEBUG, n->role->name, NULL, "KV_EVENTS to %s not sent: %s", l->addr,
                   pd_status_str(s));
            ok = false;
        }
    }
    if (!ok) {
        k->need_reset = true;
        return false;
    }
    k->st.frames++;
    k->st.names += ns + nr;
    return true;
}

void node_kve_flush(node_kve_t *k)
{
    if (k == NULL)
        return;
    node_t *n = k->n;
    if (node_links_up(n) == 0) {
        kve_clear(k);
        k->need_reset = true; /* the next session starts from a snapshot */
        return;
    }
    if (k->need_reset) {
        kve_clear(k);
        k->need_reset = false;
        k->st.snapshots++;
        uint32_t cur = 0, got, sent = 0;
        bool first = true;
        while ((got = kvx_prefix_list(n->prefix, &cur, k->stored, PROTO_MAX_KV_EVENTS)) > 0 ||
               first) {
            if (sent >= KVE_SNAPSHOT_MAX) {
                k->st.snapshots_truncated++;
                break;
            }
            if (!kve_send(k, first ? PROTO_KVE_RESET : 0, k->stored, got, NULL, 0))
                return;
            first = false;
            sent += got;
        }
        return;
    }
    if (k->n_pending == 0)
        return;
    uint32_t ns = 0, nr = 0;
    for (uint32_t i = 0; i < k->n_pending; i++) {
        if (k->ops[i] == KVX_PREFIX_STORED)
            k->stored[ns++] = k->names[i];
        else
            k->removed[nr++] = k->names[i];
    }
    kve_clear(k);
    (void)kve_send(k, 0, k->stored, ns, k->removed, nr);
}

static void kve_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    node_kve_t *k = arg;
    k->armed = false;
    node_kve_flush(k);
}

static void kve_arm(node_kve_t *k)
{
    if (k->armed)
        return;
    struct timeval tv = pd_ns_to_timeval(k->n->cfg->kv_events_ns);
    if (evtimer_add(k->timer, &tv) == 0)
        k->armed = true;
}

void node_kve_on_event(void *arg, kvx_prefix_event_t ev, uint64_t name)
{
    node_kve_t *k = arg;
    k->st.events++;
    bool up = node_links_up(k->n) > 0;
    if (!up || k->need_reset) {
        /* a snapshot will be sent anyway */
        if (up)
            kve_arm(k);
        return;
    }
    uint32_t h = (uint32_t)(name ^ (name >> 29) ^ (name >> 47)) & (KVE_SLOTS - 1);
    while (k->slot[h] != 0) {
        uint32_t i = k->slot[h] - 1;
        if (k->names[i] == name) {
            k->ops[i] = (uint8_t)ev; /* the last change wins */
            return;
        }
        h = (h + 1) & (KVE_SLOTS - 1);
    }
    uint32_t i = k->n_pending++;
    k->names[i] = name;
    k->ops[i] = (uint8_t)ev;
    k->slot[h] = i + 1;
    if (k->n_pending == PROTO_MAX_KV_EVENTS)
        node_kve_flush(k); /* a full frame: now */
    else
        kve_arm(k);
}

void node_kve_session_up(node_kve_t *k)
{
    if (k == NULL)
        return;
    kve_clear(k);
    k->need_reset = true;
    node_kve_flush(k); /* the snapshot goes right after the ACK */
}

void node_kve_stats(const node_kve_t *k, node_kve_stats_t *out)
{
    if (k == NULL) {
        memset(out, 0, sizeof(*out));
        return;
    }
    *out = k->st;
    out->pending = k->n_pending;
}

pd_status_t node_kve_create(node_t *n, node_kve_t **k_p)
{
    node_kve_t *k = calloc(1, sizeof(*k));
    if (k == NULL)
        return PD_ERR_NO_MEMORY;
    k->n = n;
    k->need_reset = true;
    k->timer = evtimer_new(pd_loop_base(n->loop), kve_timer_cb, k);
    if (k->timer == NULL) {
        free(k);
        return PD_ERR_NO_MEMORY;
    }
    *k_p = k;
    return PD_OK;
}

void node_kve_destroy(node_kve_t *k)
{
    if (k == NULL)
        return;
    if (k->timer != NULL)
        event_free(k->timer);
    free(k);
}
