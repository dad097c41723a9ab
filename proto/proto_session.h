/* proto_session.h - a daemon's control-plane session to the router:
 * connect, the router's CHALLENGE, HELLO (HMAC over it), REGISTER_ACK
 * verification (mutual auth, bound to both nonces), session keys, heartbeats both ways, and reconnect with
 * exponential backoff after any loss or REGISTER_REJECT.
 *
 * Pure control plane: no kvxfer, no engine. One event loop, no threads.
 *
 *   DOWN --connect--> CONNECTING --CHALLENGE/HELLO--> HELLO_SENT
 *   HELLO_SENT --valid ACK--> UP (on_up)        --reject/bad ACK--> DOWN
 * With a secret, every frame after the ACK is tagged with per-session keys
 * (proto_conn_set_keys), see PROTOCOL.md.
 *   UP --close / nothing received for 3 intervals--> DOWN (on_down)
 *      --backoff--> CONNECTING
 * The interval is the ACK's heartbeat_interval_ns once registered (before
 * that, opts.heartbeat_interval_ns); liveness is checked on the heartbeat
 * timer, so a dead router is noticed within 3-4 intervals.
 *
 * Messages other than ACK/REJECT/HEARTBEAT are delivered to the caller's
 * per-type callbacks only while UP (dropped otherwise). */
#ifndef PROTO_SESSION_H
#define PROTO_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <event2/event.h>
#include "pd_status.h"
#include "proto_auth.h"
#include "proto_conn.h"

typedef struct proto_session proto_session_t;

typedef enum {
    PROTO_SESS_DOWN = 0,
    PROTO_SESS_CONNECTING,
    PROTO_SESS_HELLO_SENT,
    PROTO_SESS_UP,
} proto_sess_state_t;

typedef struct {
    const char *router_addr;            /* "host:port" (copied) */
    const proto_auth_secret_t *secret;  /* NULL: insecure (MACs zero, ACK
                                           not verified); borrowed */
    /* HELLO template: role, caps, daemon_id, incarnation, compat_hash, geom,
     * kv_addr (a view into caller memory that must outlive the session).
     * nonce and mac are filled per connection. */
    proto_hello_t hello;
    uint64_t heartbeat_interval_ns;     /* until the ACK says otherwise (500 ms) */
    uint64_t connect_timeout_ns;        /* 0 -> 2 s */
    uint64_t backoff_min_ns;            /* 0 -> 1 s */
    uint64_t backoff_max_ns;            /* 0 -> 30 s */
    /* Per-type callbacks for the daemon's messages (PREFILL_REQ, DECODE_REQ,
     * CANCEL, RELEASE, PEER_INFO, PEER_DOWN, ERROR...); on_hello,
     * on_register_*, on_heartbeat, on_connected, on_drained, on_close are
     * ignored (the session owns them). `arg` below is passed to them. */
    proto_conn_cbs_t cbs;
    /* Registered (ACK verified). */
    void (*on_up)(proto_session_t *s, const proto_register_ack_t *ack, void *arg);
    /* Lost an UP session (why: the close status). Called once per UP. */
    void (*on_down)(proto_session_t *s, pd_status_t why, void *arg);
    /* A REGISTER_REJECT arrived or the ACK failed verification (status
     * PD_ERR_AUTH); the session retries after backoff. May be NULL. */
    void (*on_reject)(proto_session_t *s, pd_status_t status, const char *reason,
                      void *arg);
    /* Fill the load fields of an outgoing heartbeat (incarnation/sent_ns
     * are set by the session). May be NULL. */
    void (*fill_heartbeat)(proto_session_t *s, proto_heartbeat_t *hb, void *arg);
    void *arg;
    proto_stats_t *stats;               /* optional shared sink */
} proto_session_opts_t;

/* Copy opts and start connecting at once. Expected: PD_ERR_BAD_INPUT
 * (address), PD_ERR_NO_MEMORY. */
pd_status_t proto_session_create(struct event_base *base,
                                 const proto_session_opts_t *opts,
                                 proto_session_t **s_p);
/* Close the connection (on_down is NOT called) and free. NULL-safe.
 * Not from inside one of the session's callbacks. */
void proto_session_destroy(proto_session_t *s);

/* Graceful end (drain): stop reconnecting, flush queued output, close;
 * then done(arg) once, on the loop (at once if there is no connection).
 * on_down is not called for this close. */
void proto_session_shutdown(proto_session_t *s, void (*done)(void *arg), void *arg);

/* Send while UP. Expected: PD_ERR_SHUTDOWN (not UP), PD_ERR_BUSY (the
 * router stopped reading: the session is closed, as if the router were lost,
 * so no message is ever silently dropped from a live session). */
pd_status_t proto_session_send(proto_session_t *s, const proto_msg_t *msg);
/* Waiting out a reconnect backoff: connect now and reset the backoff (the
 * router is known to be back, e.g. it registered in etcd again). No-op in
 * any other state. */
void proto_session_retry_now(proto_session_t *s);
/* Send a heartbeat now (e.g. when draining starts). */
void proto_session_heartbeat_now(proto_session_t *s);

proto_sess_state_t proto_session_state(const proto_session_t *s);
bool proto_session_up(const proto_session_t *s);
/* Router id from the last ACK ("" before). */
const char *proto_session_router_id(const proto_session_t *s);
/* Times registered (ACKs accepted) and REGISTER_REJECTs received. */
uint64_t proto_session_registrations(const proto_session_t *s);
uint64_t proto_session_rejects(const proto_session_t *s);
/* Reason of the last REGISTER_REJECT or failed ACK check ("" if none). */
const char *proto_session_last_error(const proto_session_t *s);

#endif
