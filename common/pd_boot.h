/* pd_boot.h - what every daemon (router, prefill, decode) checks or writes
 * at boot, written once: is an address loopback, the ready file. */
#ifndef PD_BOOT_H
#define PD_BOOT_H

#include "pd_config.h"
#include "pd_log.h"
#include "pd_status.h"

#include <stdbool.h>

/* The rows every daemon (router, prefill, decode) has for its secret, admin
 * socket and log: a member of its config struct, its rows in its table
 * through PD_BOOT_ROWS(struct type, member name). */
typedef struct {
    char *secret_file;
    char *secret;
    bool insecure_no_auth;
    char *admin_socket;
    char *log_level;
    int log_format;             /* pd_log_format_t */
    char *log_file;
} pd_boot_cfg_t;

#define PD_BOOT_ROWS(stype, m)                                                \
    PD_CFG_ROW(stype, m.secret_file, "secret-file", STRING, NULL,             \
               "file with the deployment secret (>= 32 bytes, hex or raw)", 0, 0, NULL), \
    PD_CFG_ROW(stype, m.secret, "secret", STRING, NULL,                       \
               "deployment secret, hex or raw (tests; prefer secret-file)", 0, 0, NULL), \
    PD_CFG_ROW(stype, m.insecure_no_auth, "insecure-no-auth", BOOL, "false",  \
               "run without a secret (loopback addresses only)", 0, 0, NULL), \
    PD_CFG_ROW(stype, m.admin_socket, "admin.socket", STRING, NULL,           \
               "admin UNIX socket path", 0, 0, NULL),                         \
    PD_CFG_ROW(stype, m.log_level, "log.level", STRING, "info",               \
               "error|warn|info|debug|trace", 0, 0, NULL),                    \
    PD_CFG_ROW(stype, m.log_format, "log.format", ENUM, "text",               \
               "text|json (json: one object per line)", 0, 0, pd_log_format_names), \
    PD_CFG_ROW(stype, m.log_file, "log.file", STRING, NULL,                   \
               "log file (default stderr)", 0, 0, NULL)

/* Is addr on loopback, read as proto_addr_parse reads it: "host:port"
 * with host 127.x.y.z, localhost or empty, "[::1]:port", or a bare port
 * (both mean 127.0.0.1). "localhostile:80" is not. */
bool pd_addr_is_loopback(const char *addr);

/* Write text and a newline to path atomically (a temporary file renamed
 * over it). PD_ERR_IO with errno kept. */
pd_status_t pd_ready_file_write(const char *path, const char *text);

#endif
