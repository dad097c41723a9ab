/* kvx_win.h - a generic one-sided exchange window between the N ranks of a
 * group (issue 36: the MoE dispatch and combine of an expert-parallel
 * group). Each rank registers once a receive window of n_slots slots, each
 * slot one cell per source rank of at most slot_bytes[s] bytes plus a flag
 * word; a rank exchanges by PUTTING its message for peer p into p's cell
 * (ucp_put_nbx), then, after ucp_worker_fence, the flag word (sequence <<
 * 32 | length), and waits until every peer's flag for the slot shows this
 * exchange's sequence (DESIGN.md "Exchange windows": why put, not get).
 * No copies through the control plane: the metadata (worker address,
 * rkey, window base) is exchanged once, by the caller.
 *
 * Threading: a window has its own UCP context and worker, driven only by
 * the thread that calls kvx_win_exchange (the engine's compute thread),
 * which polls it while it waits (spinning, yielding the CPU between polls)
 * until the deadline: unlike the rest of kvxfer this is not on the
 * daemon's loop. Only kvxfer/ includes UCX; this header does not. */
#ifndef KVX_WIN_H
#define KVX_WIN_H

#include "pd_status.h"

#include <stddef.h>
#include <stdint.h>

#define KVX_WIN_MAX_SLOTS 8
#define KVX_WIN_MAX_RANKS 256
#define KVX_WIN_MAX_SLOT_BYTES (256u << 20)  /* one message */
#define KVX_WIN_MAX_ADDR 4096                 /* a peer's stated worker address */
#define KVX_WIN_MAX_RKEY 4096                 /* a peer's stated packed rkey */

typedef struct kvx_win kvx_win_h;

/* How a rank puts into a peer's window. */
typedef enum {
    KVX_WIN_PUT_AUTO = 0, /* ucp_put_nbx where the endpoint has an RMA lane
                             (shm, cma, RDMA); AM puts where UCX would
                             emulate the put in software (tcp) */
    KVX_WIN_PUT_RMA = 1,  /* always ucp_put_nbx (tcp: UCX 1.13's emulation
                             aborts a rank whose peer left, DESIGN.md) */
    KVX_WIN_PUT_AM = 2,   /* always AM puts: one eager active message per
                             peer, header = the flag word, copied into the
                             cell by the receiver's handler */
} kvx_win_put_t;

typedef struct {
    uint32_t rank, size;                       /* this rank of size (1..256) */
    uint32_t n_slots;                          /* 1..KVX_WIN_MAX_SLOTS */
    size_t slot_bytes[KVX_WIN_MAX_SLOTS];      /* largest message per slot */
    uint64_t timeout_ns;                       /* every exchange's deadline */
    const char *tls;                           /* UCX_TLS for this window
                                                  ("shm", "tcp", NULL: UCX's) */
    const char *net_devices;                   /* UCX NET_DEVICES, NULL: all */
    kvx_win_put_t put_mode;
} kvx_win_config_t;

/* Create the context, worker and window (ucp_mem_map ALLOCATE, zeroed,
 * REMOTE_WRITE) and the send buffers. Expected: PD_ERR_BAD_INPUT,
 * PD_ERR_NO_MEMORY, PD_ERR_TRANSPORT (UCX init). */
pd_status_t kvx_win_create(const kvx_win_config_t *cfg, kvx_win_h **win_p);
/* Close endpoints (forced), release rkeys, window, worker. NULL-safe. */
void kvx_win_destroy(kvx_win_h *win);

/* This rank's metadata for the others' kvx_win_peer_add (valid while the
 * window lives). */
void kvx_win_meta(const kvx_win_h *win, const void **meta_p, size_t *len_p);
/* Connect to rank `peer` from its metadata: every field is validated
 * first (magic, version, the group's size and slot sizes, lengths against
 * caps). Expected: PD_ERR_BAD_INPUT / PD_ERR_BAD_MAGIC / PD_ERR_MISMATCH
 * (a bad or foreign blob), PD_ERR_TRANSPORT (endpoint, rkey). */
pd_status_t kvx_win_peer_add(kvx_win_h *win, uint32_t peer, const void *meta, size_t len);

/* The window's slot count (its config's n_slots). */
uint32_t kvx_win_slots(const kvx_win_h *win);
/* The send buffer of this rank's message to `peer` in slot `slot`
 * (slot_bytes[slot] bytes), to fill before kvx_win_exchange. */
void *kvx_win_send_buf(kvx_win_h *win, uint32_t slot, uint32_t peer);
/* Put len[p] bytes of each send buffer into peer p's window, flag them,
 * and wait for every peer's message of this exchange: recv[p] (recv_len[p]
 * bytes) points into this rank's window (recv[rank]: its own send buffer,
 * not copied, so valid until the caller refills that buffer), valid until
 * the next exchange of the slot (the protocol above the window must make
 * a rank's next put into a cell follow the owner's reading of it, as the
 * MoE dispatch/combine alternation does). Every rank calls exchange on a
 * slot the same number of times. Expected: PD_ERR_TIMED_OUT (a peer did
 * not put by the deadline, or our puts did not complete: the window is
 * then failed and every later call returns it), PD_ERR_TOO_BIG (len or a
 * peer's stated length above slot_bytes), PD_ERR_TRANSPORT. */
pd_status_t kvx_win_exchange(kvx_win_h *win, uint32_t slot, const size_t *len,
                             const void **recv, size_t *recv_len);
/* kvx_win_exchange in two halves, so a rank computes while its puts and
 * its peers' are in flight (two-micro-batch overlap): post puts and flags
 * and returns; wait polls for every peer's flag and our puts' completion,
 * with the deadline counted from post, and returns what exchange returns.
 * A slot alternates post, wait (else PD_ERR_BAD_INPUT); slots interleave
 * freely. A failure fails the window as exchange's does. */
pd_status_t kvx_win_post(kvx_win_h *win, uint32_t slot, const size_t *len);
pd_status_t kvx_win_wait(kvx_win_h *win, uint32_t slot, const void **recv, size_t *recv_len);

#endif
