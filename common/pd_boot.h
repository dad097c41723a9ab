/* pd_boot.h - what every daemon (router, prefill, decode) checks or writes
 * at boot, written once: is an address loopback, the ready file. */
#ifndef PD_BOOT_H
#define PD_BOOT_H

#include "pd_status.h"

#include <stdbool.h>

/* Is addr on loopback, read as proto_addr_parse reads it: "host:port"
 * with host 127.x.y.z, localhost or empty, "[::1]:port", or a bare port
 * (both mean 127.0.0.1). "localhostile:80" is not. */
bool pd_addr_is_loopback(const char *addr);

/* Write text and a newline to path atomically (a temporary file renamed
 * over it). PD_ERR_IO with errno kept. */
pd_status_t pd_ready_file_write(const char *path, const char *text);

#endif
