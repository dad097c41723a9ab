/* pdctl_ops.c - the operator's daily commands on one daemon of a running
 * deployment: `drain|maint|ready DAEMON` (every router's routing state for
 * a backend), `admin DAEMON CMD...` (any admin command, the JSON reply as is)
 * and `logs DAEMON` (its log file, optionally followed). */
#include "pdctl.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Loads the run dir's state into st and finds the daemon called `name`
 * in it (*d_p), or returns an exit code with the names listed. */
static int pdctl_ops_find(const char *run_dir, const char *name, pdctl_state_t *st,
                          pdctl_daemon_t **d_p)
{
    int rc = pdctl_state_load(run_dir, st);
    if (rc != 0)
        return rc;
    *d_p = pdctl_state_find(st, name);
    if (*d_p == NULL) {
        fprintf(stderr, "pdctl: no daemon \"%s\" in %s (names:", name, st->run_dir);
        for (int i = 0; i < st->n; i++)
            fprintf(stderr, " %s", st->d[i].name);
        fprintf(stderr, ")\n");
        return PDCTL_EXIT_USAGE;
    }
    return 0;
}

/* Print an {"ok":false} reply's message; true if the reply was ok. */
static bool pdctl_ops_reply_ok(const char *who, const char *cmd, const cJSON *r)
{
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "ok")))
        return true;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(r, "error");
    const char *m = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "message"));
    fprintf(stderr, "pdctl: %s: %s: %s\n", who, cmd, m ? m : "failed (no \"ok\":true)");
    return false;
}

/* drain|maint|ready DAEMON: every router stops sending it new requests
 * (drain, maint) or sends them again (ready); drain on a decode also moves its
 * running streams to the other decodes (live migration). The daemon keeps
 * running. */
int pdctl_cmd_route(const char *state, int argc, char **argv)
{
    pdctl_opts_t o = { 0 };
    pdctl_parse_opts(&argc, argv, &o);
    if (argc != 1) {
        fprintf(stderr, "usage: pdctl %s DAEMON [--run-dir D] [--json]\n", state);
        return PDCTL_EXIT_USAGE;
    }
    pdctl_state_t st;
    pdctl_daemon_t *d;
    int rc = pdctl_ops_find(o.run_dir, argv[0], &st, &d);
    if (rc != 0)
        return rc;
    if (d->role == PDCTL_ROUTER) {
        fprintf(stderr, "pdctl: %s: the router routes, it is not routed to "
                "(`pdctl down` drains it)\n", d->name);
        return PDCTL_EXIT_USAGE;
    }
    char cmd[128], err[512];
    if (!pdctl_fmt(cmd, sizeof(cmd), "set-backend %s %s", d->name, state))
        return PDCTL_EXIT_USAGE;
    /* every router routes to it: each must be told (a router that is down
     * is reported and the command fails, the others still change) */
    int routers = 0, changed = 0;
    const char *now = NULL;
    cJSON *all = cJSON_CreateArray();
    rc = 0;
    for (int i = 0; i < st.n; i++) {
        const pdctl_daemon_t *router = &st.d[i];
        if (router->role != PDCTL_ROUTER)
            continue;
        routers++;
        cJSON *r = pdctl_admin(router->sock, cmd, 5.0, err, sizeof(err));
        if (r == NULL) {
            fprintf(stderr, "pdctl: %s: %s\n", router->name, err);
            rc = PDCTL_EXIT_FAIL;
            continue;
        }
        if (!pdctl_ops_reply_ok(router->name, cmd, r)) {
            rc = PDCTL_EXIT_FAIL;
            cJSON_Delete(r);
            continue;
        }
        changed++;
        const char *s_now = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "state"));
        if (s_now == NULL)
            s_now = "?";
        if (now == NULL)
            now = s_now;
        else if (strcmp(now, s_now) != 0)
            now = "mixed"; /* a string literal: outlives the replies */
        cJSON_AddStringToObject(r, "router", router->name);
        cJSON_AddItemToArray(all, r);
    }
    if (routers == 0) {
        fprintf(stderr, "pdctl: no router in %s\n", st.run_dir);
        cJSON_Delete(all);
        return PDCTL_EXIT_FAIL;
    }
    if (o.json) {
        /* one router: its reply as before; several: {"routers": [replies]} */
        cJSON *out = all;
        if (routers == 1 && cJSON_GetArraySize(all) == 1) {
            out = cJSON_GetArrayItem(all, 0);
        } else {
            out = cJSON_CreateObject();
            cJSON_AddItemToObject(out, "routers", all);
            all = out; /* freed below with it */
        }
        char *js = cJSON_PrintUnformatted(out);
        printf("%s\n", js ? js : "{}");
        free(js);
    } else if (changed > 0 && routers == 1) {
        printf("%s: %s (router state now %s)\n", d->name, state, now ? now : "?");
    } else if (changed > 0) {
        printf("%s: %s (state now %s at %d of %d routers)\n", d->name, state, now ? now : "?",
               changed, routers);
    }
    cJSON_Delete(all);
    return rc;
}

/* admin DAEMON|SOCKET CMD...: one admin command, the reply printed as JSON
 * (indented unless --json). Exit 1 if the daemon answered an error. */
int pdctl_cmd_admin(int argc, char **argv)
{
    pdctl_opts_t o = { 0 };
    pdctl_parse_opts(&argc, argv, &o);
    if (argc < 2) {
        fprintf(stderr, "usage: pdctl admin DAEMON|SOCKET_PATH COMMAND [ARGS...] "
                "[--run-dir D] [--json]   (try: pdctl admin router help)\n");
        return PDCTL_EXIT_USAGE;
    }
    char cmd[1000];
    size_t len = 0;
    for (int i = 1; i < argc; i++) {
        size_t n = strlen(argv[i]);
        if (len + n + 2 > sizeof(cmd) || strpbrk(argv[i], "\r\n") != NULL) {
            fprintf(stderr, "pdctl: admin: command too long or has a line break\n");
            return PDCTL_EXIT_USAGE;
        }
        if (len > 0)
            cmd[len++] = ' ';
        memcpy(cmd + len, argv[i], n);
        len += n;
    }
    cmd[len] = '\0';
    const char *name = argv[0], *sock = argv[0];
    pdctl_state_t st;
    if (strchr(argv[0], '/') == NULL) {
        pdctl_daemon_t *d;
        int rc = pdctl_ops_find(o.run_dir, argv[0], &st, &d);
        if (rc != 0)
            return rc;
        sock = d->sock;
    }
    char err[512];
    cJSON *r = pdctl_admin(sock, cmd, 10.0, err, sizeof(err));
    if (r == NULL) {
        fprintf(stderr, "pdctl: %s: %s\n", name, err);
        return PDCTL_EXIT_FAIL;
    }
    char *s = o.json ? cJSON_PrintUnformatted(r) : cJSON_Print(r);
    printf("%s\n", s ? s : "{}");
    free(s);
    int rc = pdctl_ops_reply_ok(name, cmd, r) ? 0 : PDCTL_EXIT_FAIL;
    cJSON_Delete(r);
    return rc;
}

static volatile sig_atomic_t pdctl_logs_stop;

static void pdctl_logs_signal(int sig)
{
    (void)sig;
    pdctl_logs_stop = 1;
}

/* Copy f from its current offset to stdout. */
static void pdctl_logs_copy(FILE *f)
{
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        fwrite(buf, 1, n, stdout);
    fflush(stdout);
    clearerr(f);
}

/* Seek f to the start of its last `lines` lines. */
static void pdctl_logs_seek_tail(FILE *f, long lines)
{
    if (fseek(f, 0, SEEK_END) != 0)
        return;
    long end = ftell(f), pos = end;
    long seen = 0;
    char buf[4096];
    while (pos > 0) {
        long chunk = pos >= (long)sizeof(buf) ? (long)sizeof(buf) : pos;
        pos -= chunk;
        if (fseek(f, pos, SEEK_SET) != 0 || fread(buf, 1, (size_t)chunk, f) != (size_t)chunk)
            break;
        for (long i = chunk - 1; i >= 0; i--) {
            /* the newline ending the last line does not start a line */
            if (buf[i] == '\n' && pos + i != end - 1 && ++seen == lines) {
                fseek(f, pos + i + 1, SEEK_SET);
                return;
            }
        }
    }
    fseek(f, 0, SEEK_SET);
}

/* logs DAEMON [-n N] [-f]: the last N lines (default 50, 0 = all) of the
 * daemon's log in the run dir; -f follows it (also across a restart that
 * recreates the file) until Ctrl-C. */
int pdctl_cmd_logs(int argc, char **argv)
{
    pdctl_opts_t o = { 0 };
    pdctl_parse_opts(&argc, argv, &o);
    long lines = 50;
    bool follow = false;
    const char *name = NULL;
    for (int i = 0; i < argc; i++) {
        char *end;
        if (strcmp(argv[i], "-f") == 0 || strcmp(argv[i], "--follow") == 0) {
            follow = true;
        } else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            lines = strtol(argv[++i], &end, 10);
            if (*end != '\0' || lines < 0) {
                fprintf(stderr, "pdctl: logs: -n wants a line count, got \"%s\"\n", argv[i]);
                return PDCTL_EXIT_USAGE;
            }
        } else if (name == NULL && argv[i][0] != '-') {
            name = argv[i];
        } else {
            name = NULL;
            break;
        }
    }
    if (name == NULL) {
        fprintf(stderr, "usage: pdctl logs DAEMON [-n LINES] [-f] [--run-dir D]\n");
        return PDCTL_EXIT_USAGE;
    }
    pdctl_state_t st;
    pdctl_daemon_t *d;
    int rc = pdctl_ops_find(o.run_dir, name, &st, &d);
    if (rc != 0)
        return rc;
    if (d->log[0] == '\0' && d->unit[0] != '\0') {
        /* systemd runs it: its log is the unit's journal */
        char n[32];
        snprintf(n, sizeof(n), "%ld", lines > 0 ? lines : 1000000000L);
        fflush(stdout);
        if (follow)
            execlp("journalctl", "journalctl", "--no-pager", "-u", d->unit, "-n", n, "-f",
                   (char *)NULL);
        else
            execlp("journalctl", "journalctl", "--no-pager", "-u", d->unit, "-n", n,
                   (char *)NULL);
        fprintf(stderr, "pdctl: %s: its log is the journal of %s, but journalctl cannot run: %s\n",
                d->name, d->unit, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    FILE *f = fopen(d->log, "r");
    if (f == NULL) {
        fprintf(stderr, "pdctl: %s: no log %s: %s\n", d->name, d->log, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    if (lines > 0)
        pdctl_logs_seek_tail(f, lines);
    pdctl_logs_copy(f);
    if (follow) {
        struct sigaction sa = { .sa_handler = pdctl_logs_signal };
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGPIPE, &sa, NULL);
        while (!pdctl_logs_stop && !ferror(stdout)) {
            pdctl_nap_ms(200);
            pdctl_logs_copy(f);
            struct stat now, open_st;
            if (stat(d->log, &now) == 0 && fstat(fileno(f), &open_st) == 0 &&
                (now.st_ino != open_st.st_ino || now.st_size < ftell(f))) {
                FILE *g = fopen(d->log, "r"); /* recreated or truncated */
                if (g != NULL) {
                    fclose(f);
                    f = g;
                }
            }
        }
    }
    fclose(f);
    return 0;
}
