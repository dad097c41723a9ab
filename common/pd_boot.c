/* pd_boot.c - boot-time helpers shared by the router and the daemons. */
#include "pd_boot.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

bool pd_addr_is_loopback(const char *addr)
{
    if (addr == NULL)
        return false;
    char host[256];
    const char *end;
    if (addr[0] == '[') {
        end = strchr(addr, ']');
        if (end == NULL)
            return false;
        snprintf(host, sizeof(host), "%.*s", (int)(end - addr - 1), addr + 1);
        if (end[1] != '\0' && end[1] != ':')
            return false;
    } else {
        end = strrchr(addr, ':');
        if (end == NULL && addr[0] != '\0' && strspn(addr, "0123456789") == strlen(addr))
            return true; /* a bare port means 127.0.0.1 (proto_addr_parse) */
        size_t n = end ? (size_t)(end - addr) : strlen(addr);
        if (n >= sizeof(host))
            return false;
        memcpy(host, addr, n);
        host[n] = '\0';
    }
    return host[0] == '\0' || strncmp(host, "127.", 4) == 0 || strcmp(host, "localhost") == 0 ||
           strcmp(host, "::1") == 0;
}

pd_status_t pd_ready_file_write(const char *path, const char *text)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= sizeof(tmp)) {
        errno = ENAMETOOLONG;
        return PD_ERR_IO;
    }
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return PD_ERR_IO;
    bool ok = fprintf(f, "%s\n", text) >= 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        errno = e;
        return PD_ERR_IO;
    }
    return PD_OK;
}
