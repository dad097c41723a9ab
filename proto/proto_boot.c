/* proto_boot.c - see proto_boot.h. */
#include "proto_boot.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

#include "pd_log.h"
#include "proto_conn.h"

bool proto_boot_addr_loopback(const char *addr)
{
    return strncmp(addr, "127.", 4) == 0 || strncmp(addr, "localhost:", 10) == 0 ||
           strncmp(addr, "[::1]:", 6) == 0 || addr[0] == ':' || strchr(addr, ':') == NULL;
}

static pd_status_t proto_boot_secret(const proto_boot_cfg_t *c, proto_auth_secret_t *secret,
                                     bool *have_secret)
{
    const char *env_secret = getenv("PD_SECRET");
    *have_secret = false;
    if (c->secret_file) {
        pd_status_t st = proto_auth_secret_load(c->secret_file, secret);
        if (st != PD_OK) {
            fprintf(stderr, "%s: --secret-file: %s: %s\n", c->prog, c->secret_file,
                    st == PD_ERR_IO ? strerror(errno) : "need at least 32 bytes (hex or raw)");
            return PD_ERR_BAD_INPUT;
        }
        *have_secret = true;
    } else if (c->secret_hex || env_secret) {
        const char *h = c->secret_hex ? c->secret_hex : env_secret;
        if (proto_auth_secret_parse((const uint8_t *)h, strlen(h), secret) != PD_OK) {
            fprintf(stderr, "%s: --secret: need at least 32 bytes (64 hex digits)\n", c->prog);
            return PD_ERR_BAD_INPUT;
        }
        *have_secret = true;
        if (c->secret_hex)
            fprintf(stderr, "%s: warning: --secret given as text: on a command line it is "
                    "visible to every local user (ps, /proc); prefer --secret-file\n", c->prog);
    } else if (!c->insecure_no_auth) {
        fprintf(stderr, "%s: no secret: give --secret-file (or --insecure-no-auth on loopback)\n",
                c->prog);
        return PD_ERR_BAD_INPUT;
    } else if (!proto_boot_addr_loopback(c->router)) {
        fprintf(stderr, "%s: --insecure-no-auth needs a loopback --router\n", c->prog);
        return PD_ERR_BAD_INPUT;
    }
    return PD_OK;
}

pd_status_t proto_boot_daemon(const proto_boot_cfg_t *c, proto_auth_secret_t *secret,
                              bool *have_secret, char *id)
{
    pd_log_level_t lvl;
    if (pd_log_level_parse(c->log_level, &lvl) != PD_OK) {
        fprintf(stderr, "%s: --log.level: expected error|warn|info|debug|trace, got \"%s\"\n",
                c->prog, c->log_level);
        return PD_ERR_BAD_INPUT;
    }
    pd_log_set_level(lvl);
    if (c->log_file && pd_log_open(c->log_file) != PD_OK) {
        fprintf(stderr, "%s: --log.file: cannot open %s\n", c->prog, c->log_file);
        return PD_ERR_BAD_INPUT;
    }
    if (c->model == NULL) {
        fprintf(stderr, "%s: --model: required (GGUF path or sim:<preset>)\n", c->prog);
        return PD_ERR_BAD_INPUT;
    }
    struct sockaddr_storage ss;
    int sl;
    if (proto_addr_parse(c->router, &ss, &sl) != PD_OK) {
        fprintf(stderr, "%s: --router: bad address \"%s\" (host:port, numeric host)\n", c->prog,
                c->router);
        return PD_ERR_BAD_INPUT;
    }
    if (proto_boot_secret(c, secret, have_secret) != PD_OK)
        return PD_ERR_BAD_INPUT;
    if (c->id && (c->id[0] == '\0' || strlen(c->id) > PROTO_DAEMON_ID_MAX)) {
        fprintf(stderr, "%s: --id: 1..%u bytes\n", c->prog, PROTO_DAEMON_ID_MAX);
        return PD_ERR_BAD_INPUT;
    }
    if (c->id)
        snprintf(id, PROTO_DAEMON_ID_MAX + 1, "%s", c->id);
    else
        snprintf(id, PROTO_DAEMON_ID_MAX + 1, "%s-%d", c->role, (int)getpid());
    return PD_OK;
}

bool proto_boot_ready_write(const char *path, const char *text, const char *comp)
{
    char tmp[4096];
    bool ok = false;
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f != NULL) {
        fprintf(f, "%s\n", text);
        ok = fclose(f) == 0 && rename(tmp, path) == 0;
    }
    if (!ok)
        pd_log(PD_LOG_ERROR, comp, NULL, "cannot write ready file %s: %s", path, strerror(errno));
    return ok;
}
