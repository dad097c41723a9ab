/* proto_conn.h - control-plane connections: framing of proto messages over
 * a libevent bufferevent, per-type dispatch, bounded output, counters, and
 * TCP connect/listen helpers.
 *
 * Life of a connection (all on one event loop, no threads):
 *   create (accept / connect / wrap fd) -> callbacks per received frame ->
 *   proto_conn_close() or a peer/protocol failure -> on_close() is called
 *   EXACTLY ONCE from a reap event (never from inside another callback of the
 *   same connection) -> the connection is freed right after on_close returns.
 *
 * Receiving: header is read and validated first (proto_frame_check), then
 * the connection waits (read low-watermark) for the whole body, decodes it
 * into a per-connection proto_msg_t and calls the type's callback. The msg
 * and every view in it are valid only during that callback. A peer that
 * sends an invalid header, an over-cap body or an undecodable body is
 * disconnected: on_close(why = the decode status) and stats.proto_errors.
 *
 * Authenticated connections (proto_conn_set_keys): each frame is followed
 * by a 32-byte tag over its header and body and a per-direction sequence
 * number; the tag is checked before the body is decoded.
 *
 * Sending: proto_conn_send() encodes straight into the output evbuffer.
 * If more than opts.out_cap bytes are already queued the send is refused
 * with PD_ERR_BUSY (expected back-pressure: the connection is "slow";
 * on_drained fires once the queue empties). */
#ifndef PROTO_CONN_H
#define PROTO_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <event2/event.h>
#include "pd_status.h"
#include "proto_auth.h"
#include "proto_msg.h"

typedef struct proto_conn proto_conn_t;
typedef struct proto_listener proto_listener_t;

/* Counters, declared once: X(name, description). */
#define PROTO_STATS_FIELDS(X)                                                 \
    X(frames_in,        "frames received, decoded and dispatched")            \
    X(frames_out,       "frames queued for sending")                          \
    X(bytes_in,         "bytes of valid frames received")                     \
    X(bytes_out,        "bytes of frames queued for sending")                 \
    X(send_busy,        "sends refused: output queue over its cap")           \
    X(unhandled,        "frames dropped: no callback for their type")         \
    X(proto_disconnects, "connections dropped for a protocol error")          \
    X(conns_opened,     "connections created")                                \
    X(conns_closed,     "connections closed (on_close delivered)")            \
    X(accept_errors,    "accept() failures (out of fds: accepting pauses 100 ms)")

typedef struct {
#define PROTO_X_STAT(name, desc) uint64_t name;
    PROTO_STATS_FIELDS(PROTO_X_STAT)
#undef PROTO_X_STAT
    uint64_t proto_errors[PD_STATUS_COUNT]; /* by pd_status_index(status) */
} proto_stats_t;

typedef struct {
    const char *name;
    const char *desc;
    size_t offset;          /* of the uint64_t in proto_stats_t */
} proto_stat_desc_t;

/* Descriptions of the PROTO_STATS_FIELDS counters, terminated by a NULL name. */
extern const proto_stat_desc_t proto_stat_descs[];

typedef void (*proto_msg_cb_t)(proto_conn_t *conn, const proto_msg_t *msg,
                               void *arg);

/* Per-type callbacks (on_hello, on_register_ack, ..., on_error) generated
 * from PROTO_MSG_LIST. A NULL per-type callback falls back to on_other; if
 * that is NULL too, the frame is dropped and counted in stats.unhandled.
 * Inside any callback you may send on and close any connection, including
 * this one; you must not free anything of the connection. */
typedef struct {
#define PROTO_X_CB(NAME, name, code, max) proto_msg_cb_t on_##name;
    PROTO_MSG_LIST(PROTO_X_CB)
#undef PROTO_X_CB
    proto_msg_cb_t on_other;
    /* Outgoing connection established (proto_conn_connect only). */
    void (*on_connected)(proto_conn_t *conn, void *arg);
    /* Output queue emptied after a send returned PD_ERR_BUSY. */
    void (*on_drained)(proto_conn_t *conn, void *arg);
    /* Exactly once per connection. why: PD_OK (local close without a
     * reason), PD_ERR_PEER_GONE (EOF), PD_ERR_IO (socket error, refused
     * connect), PD_ERR_TIMED_OUT (idle / connect timeout), a decode status
     * (PD_ERR_BAD_MAGIC...) for protocol errors, or what proto_conn_close
     * was given. The connection is freed when this returns. */
    void (*on_close)(proto_conn_t *conn, pd_status_t why, void *arg);
} proto_conn_cbs_t;

#define PROTO_OUT_CAP_DEFAULT (4u << 20)

typedef struct {
    size_t out_cap;              /* 0 = PROTO_OUT_CAP_DEFAULT */
    uint64_t idle_timeout_ns;    /* no bytes received for this long -> close; 0 = off */
    uint64_t connect_timeout_ns; /* 0 = off */
    uint64_t flush_timeout_ns;   /* close_after_flush deadline; 0 = 5 s */
    uint32_t body_max;           /* received bodies above this -> close with
                                    PD_ERR_TOO_BIG; 0 = the type caps only.
                                    Keep it small until the peer is
                                    authenticated (proto_conn_set_body_max). */
    proto_stats_t *stats;        /* optional shared sink (e.g. per daemon) */
} proto_conn_opts_t;

/* Wrap an already connected stream socket. Takes ownership of fd (closed
 * when the connection is freed, also on failure). cbs is copied; opts may
 * be NULL. Expected errors: PD_ERR_NO_MEMORY, PD_ERR_IO. */
pd_status_t proto_conn_create(struct event_base *base, int fd,
                              const proto_conn_cbs_t *cbs, void *arg,
                              const proto_conn_opts_t *opts,
                              proto_conn_t **conn_p);

/* Start a non-blocking TCP connect to addr (see proto_addr_parse). On
 * success *conn_p is valid at once (sends are queued until connected);
 * then on_connected, or on_close(PD_ERR_IO / PD_ERR_TIMED_OUT).
 * Expected errors: PD_ERR_BAD_INPUT (address), PD_ERR_NO_MEMORY, PD_ERR_IO. */
pd_status_t proto_conn_connect(struct event_base *base, const char *addr,
                               const proto_conn_cbs_t *cbs, void *arg,
                               const proto_conn_opts_t *opts,
                               proto_conn_t **conn_p);

/* Encode and queue one message. msg->hdr.body_len is ignored.
 * Expected: PD_OK, PD_ERR_BUSY (output over cap; nothing queued),
 * PD_ERR_SHUTDOWN (connection closing). Bugs: encode statuses
 * (PD_ERR_BAD_INPUT, PD_ERR_TOO_BIG, PD_ERR_BAD_TYPE, PD_ERR_RESERVED). */
pd_status_t proto_conn_send(proto_conn_t *conn, const proto_msg_t *msg);

/* Close now: stop reading and writing (queued output is dropped) and
 * schedule on_close(why). Idempotent; the first why wins. */
void proto_conn_close(proto_conn_t *conn, pd_status_t why);

/* Stop reading, flush queued output, then close with `why` (e.g. after a
 * REGISTER_REJECT). If the output does not drain within
 * opts.flush_timeout_ns the close happens anyway with PD_ERR_TIMED_OUT. Idempotent. */
void proto_conn_close_after_flush(proto_conn_t *conn, pd_status_t why);

/* From now on every frame sent carries PROTO_FLAG_AUTH and a tag
 * (proto_auth_frame_tag with keys->send and an implicit counter from 0),
 * and every frame received must too (keys->recv, its own counter): an
 * untagged, mis-tagged, replayed, reordered or dropped frame closes the
 * connection with PD_ERR_AUTH. Call it right after the handshake, inside the
 * callback of its last frame (frames after it in the buffer are checked). */
void proto_conn_set_keys(proto_conn_t *conn, const proto_auth_keys_t *keys);
bool proto_conn_is_authenticated(const proto_conn_t *conn);
/* Change opts.body_max (0 = the type caps only). */
void proto_conn_set_body_max(proto_conn_t *conn, uint32_t body_max);

void proto_conn_set_arg(proto_conn_t *conn, void *arg);
void *proto_conn_get_arg(const proto_conn_t *conn);
/* Peer address "ip:port" (or "local" for non-IP sockets). Never NULL. */
const char *proto_conn_peer(const proto_conn_t *conn);
/* Per-connection counters (valid until on_close returns). */
const proto_stats_t *proto_conn_stats(const proto_conn_t *conn);
/* Bytes queued for sending; true while over cap since the last BUSY. */
size_t proto_conn_out_len(const proto_conn_t *conn);
bool proto_conn_is_slow(const proto_conn_t *conn);
bool proto_conn_is_closing(const proto_conn_t *conn);
/* Raw bytes of the frame being dispatched (header + body), valid only inside
 * a message callback; PD_ERR_BAD_INPUT outside one. Lets a receiver verify
 * a MAC over exactly what was sent (see proto_mac_input). */
pd_status_t proto_conn_frame(const proto_conn_t *conn, const uint8_t **p_p,
                             size_t *len_p);

/* Called for every accepted connection before any of its callbacks; may
 * set a per-connection arg or close it. */
typedef void (*proto_accept_cb_t)(proto_listener_t *l, proto_conn_t *conn,
                                  void *arg);

/* Listen on addr (see proto_addr_parse; port 0 = pick one). Accepted
 * connections use cbs/opts and start with arg as their arg.
 * Expected errors: PD_ERR_BAD_INPUT (address), PD_ERR_IO (bind/listen,
 * errno kept), PD_ERR_NO_MEMORY. */
pd_status_t proto_listener_create(struct event_base *base, const char *addr,
                                  proto_accept_cb_t on_accept,
                                  const proto_conn_cbs_t *cbs, void *arg,
                                  const proto_conn_opts_t *opts,
                                  proto_listener_t **l_p);
/* Stop accepting and free. Accepted connections live on. Accepts NULL. */
void proto_listener_destroy(proto_listener_t *l);
/* Bound port (useful with port 0). */
uint16_t proto_listener_port(const proto_listener_t *l);

/* "host:port", "[v6]:port", ":port" or "port" -> sockaddr. Numeric hosts
 * only (no DNS on the loop) plus "localhost"; no host = 127.0.0.1.
 * PD_ERR_BAD_INPUT otherwise. */
pd_status_t proto_addr_parse(const char *addr, struct sockaddr_storage *ss,
                             int *ss_len_p);

#endif
