/* pd_status.h - the one status enum of pdserve.
 *
 * Every public function in every layer returns pd_status_t (or a value plus a
 * status out-param). PD_OK is 0, PD_INPROGRESS is positive (an operation was
 * started and will complete through a callback), errors are negative.
 * The list is declared once; enum and string table come from it. */
#ifndef PD_STATUS_H
#define PD_STATUS_H

/* X(name, value, text) */
#define PD_STATUS_LIST(X)                                                     \
    X(OK,               0,  "ok")                                             \
    X(INPROGRESS,       1,  "in progress")                                    \
    X(ERR_NO_MEMORY,   -1,  "out of memory")                                  \
    X(ERR_BAD_INPUT,   -2,  "bad input")                                      \
    X(ERR_TRUNCATED,   -3,  "truncated input")                                \
    X(ERR_TOO_BIG,     -4,  "exceeds a hard limit")                           \
    X(ERR_BAD_MAGIC,   -5,  "bad magic")                                      \
    X(ERR_BAD_VERSION, -6,  "unsupported version")                            \
    X(ERR_BAD_TYPE,    -7,  "unknown message type")                           \
    X(ERR_RESERVED,    -8,  "reserved bits or fields set")                    \
    X(ERR_TIMED_OUT,   -9,  "timed out")                                      \
    X(ERR_CANCELED,    -10, "canceled")                                       \
    X(ERR_PEER_GONE,   -11, "peer gone")                                      \
    X(ERR_NO_SPACE,    -12, "no space")                                       \
    X(ERR_NO_KV_SPACE, -13, "no free KV blocks")                              \
    X(ERR_BAD_HANDLE,  -14, "bad KV handle")                                  \
    X(ERR_AUTH,        -15, "authentication failed")                          \
    X(ERR_EXPIRED,     -16, "expired")                                        \
    X(ERR_STALE,       -17, "stale generation")                               \
    X(ERR_NOT_FOUND,   -18, "not found")                                      \
    X(ERR_EXISTS,      -19, "already exists")                                 \
    X(ERR_BUSY,        -20, "busy, try again")                                \
    X(ERR_OVERLOADED,  -21, "overloaded")                                     \
    X(ERR_IO,          -22, "I/O error")                                      \
    X(ERR_UNSUPPORTED, -23, "unsupported")                                    \
    X(ERR_PERMISSION,  -24, "permission denied")                              \
    X(ERR_MISMATCH,    -25, "model or geometry mismatch")                     \
    X(ERR_TRANSPORT,   -26, "transport error")                                \
    X(ERR_SHUTDOWN,    -27, "shutting down")                                  \
    X(ERR_INTERNAL,    -28, "internal error")

typedef enum {
#define PD_STATUS_ENUM(name, val, text) PD_##name = (val),
    PD_STATUS_LIST(PD_STATUS_ENUM)
#undef PD_STATUS_ENUM
} pd_status_t;

#define PD_STATUS_MIN (-28)

/* Human-readable text ("timed out"). Never NULL. */
const char *pd_status_str(pd_status_t status);
/* Stable identifier ("ERR_TIMED_OUT"), used in JSON replies and metrics labels. */
const char *pd_status_name(pd_status_t status);
/* Index 0..PD_STATUS_COUNT-1 for per-status counter arrays. */
int pd_status_index(pd_status_t status);
#define PD_STATUS_COUNT (2 - PD_STATUS_MIN)

#define PD_IS_ERR(s) ((s) < 0)

#endif
