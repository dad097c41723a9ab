/* proto_boot.h - the boot steps pd-prefill and pd-decode share before
 * their engine and kvxfer come up: log level / file, the required model,
 * the router address, the deployment secret (--secret-file, --secret hex,
 * env PD_SECRET, or --insecure-no-auth with a loopback router only), the
 * daemon id (default <role>-<pid>); and, once registered, the ready file
 * (written atomically: tmp + rename). Errors go to stderr as
 * "<prog>: --<key>: <why>", the caller then exits with its usage status.
 * Depends on common + proto_auth / proto_conn; no engine, no kvxfer. */
#ifndef PROTO_BOOT_H
#define PROTO_BOOT_H

#include <stdbool.h>
#include <stddef.h>

#include "proto_auth.h"
#include "proto_msg.h"

/* Config rows every daemon has, X(field, key, type, default, help, min,
 * max, enum_names) over its own config struct (same field names), in
 * --help order: PROTO_BOOT_HEAD_ROWS first, the engine's (ENG_BOOT_ROWS),
 * the daemon's own, then PROTO_BOOT_TAIL_ROWS. */
#define PROTO_BOOT_HEAD_ROWS(X, id_help)                                      \
    X(id, "id", STRING, NULL, id_help, 0, 0, NULL)                            \
    X(router, "router", STRING, "127.0.0.1:7000", "router control address host:port", 0, 0, NULL) \
    X(secret_file, "secret-file", STRING, NULL, "file with the deployment secret (>= 32 bytes, hex or raw)", 0, 0, NULL) \
    X(secret, "secret", STRING, NULL, "deployment secret as hex (tests; prefer secret-file / PD_SECRET)", 0, 0, NULL) \
    X(insecure_no_auth, "insecure-no-auth", BOOL, "false", "run without a secret (loopback router only)", 0, 0, NULL) \
    X(admin_socket, "admin.socket", STRING, NULL, "admin UNIX socket path", 0, 0, NULL) \
    X(log_level, "log.level", STRING, "info", "error|warn|info|debug|trace", 0, 0, NULL) \
    X(log_file, "log.file", STRING, NULL, "log file (default stderr)", 0, 0, NULL)
#define PROTO_BOOT_TAIL_ROWS(X)                                               \
    X(heartbeat_ns, "heartbeat-interval", DURATION, "500ms", "heartbeat interval before the router's ACK", 1e6, 60e9, NULL) \
    X(reconnect_min_ns, "reconnect-min", DURATION, "1s", "first reconnect backoff (doubles to 30 s)", 1e6, 60e9, NULL) \
    X(drain_timeout_ns, "drain-timeout", DURATION, "30s", "SIGTERM: max wait for in-flight work", 0, 3600e9, NULL) \
    X(ready_file, "ready-file", STRING, NULL, "write JSON here once registered with the router", 0, 0, NULL)

typedef struct {
    const char *prog;           /* "pd-prefill" */
    const char *role;           /* "prefill": default id <role>-<pid> */
    const char *log_level, *log_file;
    const char *model, *router;
    const char *secret_file, *secret_hex;
    bool insecure_no_auth;
    const char *id;             /* NULL: default */
} proto_boot_cfg_t;

/* Run the shared boot checks of c. On success fills *secret / *have_secret
 * and id (PROTO_DAEMON_ID_MAX + 1 bytes) and returns PD_OK; else
 * PD_ERR_BAD_INPUT after one line on stderr (logging may not be set up). */
pd_status_t proto_boot_daemon(const proto_boot_cfg_t *c, proto_auth_secret_t *secret,
                              bool *have_secret, char *id);

/* A router address the insecure mode accepts (loopback, or no host). */
bool proto_boot_addr_loopback(const char *addr);

/* Write text + "\n" to path atomically. true when the file is in place;
 * false after an error log line (component comp). */
bool proto_boot_ready_write(const char *path, const char *text, const char *comp);

#endif
