/* pdctl_query.c - read-only views of a running deployment: the admin-socket
 * and HTTP clients, `status`, `stats|kv|leases|xfer|requests`, the transfer
 * matrix (`xfer all`) and `top`. Everything is polled with bounded
 * timeouts; a daemon that does not answer is one clear message. */
#include "pdctl.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "pd_httpc.h"
#include "pd_sbuf.h"
#include "pdctl_plan.h"

double pdctl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void pdctl_nap_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

bool pdctl_fmt(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < cap;
}

/* ---- clients ------------------------------------------------------------------ */

static void pdctl_seterr(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

/* Read until '\n' (or EOF) within the deadline. */
static char *pdctl_read_line(int fd, double deadline, bool *timed_out)
{
    pd_sbuf_t sb = PD_SBUF_INIT;
    *timed_out = false;
    for (;;) {
        double left = deadline - pdctl_now();
        if (left <= 0) {
            *timed_out = true;
            break;
        }
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue;
        char buf[65536];
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        pd_sbuf_append(&sb, buf, (size_t)n);
        if (memchr(buf, '\n', (size_t)n) != NULL)
            break;
    }
    return pd_sbuf_finish(&sb, NULL);
}

cJSON *pdctl_admin(const char *sock, const char *cmd, double timeout_s, char *err, size_t err_len)
{
    struct stat sb;
    if (stat(sock, &sb) != 0) {
        pdctl_seterr(err, err_len, "no admin socket %s (daemon not running?)", sock);
        return NULL;
    }
    if (!S_ISSOCK(sb.st_mode)) {
        pdctl_seterr(err, err_len, "%s is not a socket", sock);
        return NULL;
    }
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(sock) >= sizeof(sa.sun_path)) {
        pdctl_seterr(err, err_len, "admin socket path too long: %s", sock);
        return NULL;
    }
    strcpy(sa.sun_path, sock);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        pdctl_seterr(err, err_len, "socket: %s", strerror(errno));
        return NULL;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        int e = errno;
        close(fd);
        if (e == ECONNREFUSED)
            pdctl_seterr(err, err_len, "%s: connection refused (daemon dead? stale socket)", sock);
        else
            pdctl_seterr(err, err_len, "%s: %s", sock, strerror(e));
        return NULL;
    }
    char line[1024];
    int len = snprintf(line, sizeof(line), "%s\n", cmd);
    if (send(fd, line, (size_t)len, MSG_NOSIGNAL) != len) {
        pdctl_seterr(err, err_len, "%s: write: %s", sock, strerror(errno));
        close(fd);
        return NULL;
    }
    bool timed_out;
    char *reply = pdctl_read_line(fd, pdctl_now() + timeout_s, &timed_out);
    close(fd);
    if (reply == NULL || reply[0] == '\0') {
        pdctl_seterr(err, err_len, "%s: %s", sock,
                     timed_out ? "no reply (timed out)" : "closed without a reply (daemon dying?)");
        free(reply);
        return NULL;
    }
    cJSON *j = cJSON_Parse(reply);
    if (j == NULL || !cJSON_IsObject(j)) {
        size_t n = strcspn(reply, "\r\n");
        pdctl_seterr(err, err_len, "%s: garbage reply (not a JSON object): \"%.*s\"", sock,
                     (int)(n > 60 ? 60 : n), reply);
        cJSON_Delete(j);
        j = NULL;
    }
    free(reply);
    return j;
}

int pdctl_http_status(const char *url, const char *path, double timeout_s, char *err, size_t err_len)
{
    char host[128], port[16], addr[160];
    if (sscanf(url, "http://%127[^:]:%15[0-9]", host, port) != 2) {
        pdctl_seterr(err, err_len, "bad url %s", url);
        return -1;
    }
    snprintf(addr, sizeof(addr), "%s:%s", host, port);
    pd_httpc_req_t req = { .method = "GET", .host = host, .path = path };
    pd_httpc_reply_t rep;
    pd_status_t st = pd_httpc_fetch(addr, &req, (uint64_t)(timeout_s * 1e9), 64u << 10, &rep);
    /* A status line is the answer, whatever came after it. */
    int code = rep.status > 0 ? rep.status : -1;
    if (code < 0)
        pdctl_seterr(err, err_len, "%s%s: no HTTP status line (%s)", url, path,
                     pd_status_str(st));
    pd_httpc_reply_free(&rep);
    return code;
}

/* ---- tables -------------------------------------------------------------------- */

#define PDCTL_MAX_COLS 40
#define PDCTL_MAX_ROWS 512

typedef struct {
    int ncols, nrows;
    char *head[PDCTL_MAX_COLS];
    char *cell[PDCTL_MAX_ROWS][PDCTL_MAX_COLS];
} pdctl_table_t;

static int pdctl_col(pdctl_table_t *t, const char *name)
{
    for (int c = 0; c < t->ncols; c++)
        if (strcmp(t->head[c], name) == 0)
            return c;
    if (t->ncols == PDCTL_MAX_COLS)
        return -1;
    t->head[t->ncols] = strdup(name);
    return t->ncols++;
}

static int pdctl_row(pdctl_table_t *t)
{
    return t->nrows < PDCTL_MAX_ROWS ? t->nrows++ : -1;
}

static void pdctl_put(pdctl_table_t *t, int row, const char *col, const char *fmt, ...)
{
    int c = pdctl_col(t, col);
    if (row < 0 || c < 0)
        return;
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    free(t->cell[row][c]);
    t->cell[row][c] = strdup(buf);
}

static void pdctl_table_print(pdctl_table_t *t, FILE *out, const char *eol)
{
    int w[PDCTL_MAX_COLS];
    for (int c = 0; c < t->ncols; c++) {
        w[c] = (int)strlen(t->head[c]);
        for (int r = 0; r < t->nrows; r++)
            if (t->cell[r][c] != NULL && (int)strlen(t->cell[r][c]) > w[c])
                w[c] = (int)strlen(t->cell[r][c]);
    }
    bool num[PDCTL_MAX_COLS];
    for (int c = 0; c < t->ncols; c++) {
        num[c] = c > 0;
        for (int r = 0; r < t->nrows && num[c]; r++) {
            const char *s = t->cell[r][c];
            char *end;
            if (s != NULL && strcmp(s, "-") != 0 && (strtod(s, &end), *end != '\0' || end == s))
                num[c] = false;
        }
    }
    for (int r = -1; r < t->nrows; r++) {
        for (int c = 0; c < t->ncols; c++) {
            const char *s = r < 0 ? t->head[c] : t->cell[r][c] ? t->cell[r][c] : "-";
            /* numbers right-aligned, text left-aligned; no trailing blanks */
            const char *sep = c == 0 ? "" : "  ";
            if (num[c])
                fprintf(out, "%s%*s", sep, w[c], s);
            else if (c == t->ncols - 1)
                fprintf(out, "%s%s", sep, s);
            else
                fprintf(out, "%s%-*s", sep, w[c], s);
        }
        fputs(eol, out);
    }
}

static void pdctl_table_free(pdctl_table_t *t)
{
    for (int c = 0; c < t->ncols; c++) {
        free(t->head[c]);
        for (int r = 0; r < t->nrows; r++)
            free(t->cell[r][c]);
    }
    memset(t, 0, sizeof(*t));
}

static void pdctl_fmt_ns(char *buf, size_t cap, double ns)
{
    if (ns >= 1e9)
        snprintf(buf, cap, "%.2fs", ns / 1e9);
    else if (ns >= 1e6)
        snprintf(buf, cap, "%.1fms", ns / 1e6);
    else if (ns >= 1e3)
        snprintf(buf, cap, "%.1fus", ns / 1e3);
    else
        snprintf(buf, cap, "%.0fns", ns);
}

static void pdctl_fmt_bytes(char *buf, size_t cap, double b)
{
    const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(buf, cap, i ? "%.1f%s" : "%.0f%s", b, u[i]);
}

/* A JSON value as one cell. Histograms {count,p50_ns,p99_ns} compact. */
static void pdctl_fmt_value(char *buf, size_t cap, const cJSON *v)
{
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d == floor(d) && fabs(d) < 1e15)
            snprintf(buf, cap, "%.0f", d);
        else
            snprintf(buf, cap, "%.3f", d);
    } else if (cJSON_IsString(v)) {
        snprintf(buf, cap, "%s", v->valuestring);
    } else if (cJSON_IsBool(v)) {
        snprintf(buf, cap, "%s", cJSON_IsTrue(v) ? "yes" : "no");
    } else if (cJSON_IsObject(v) && cJSON_GetObjectItemCaseSensitive(v, "p50_ns") != NULL) {
        char a[32], b[32];
        pdctl_fmt_ns(a, sizeof(a), cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(v, "p50_ns")));
        pdctl_fmt_ns(b, sizeof(b), cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(v, "p99_ns")));
        snprintf(buf, cap, "n=%.0f p50=%s p99=%s",
                 cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(v, "count")), a, b);
    } else if (cJSON_IsArray(v)) {
        snprintf(buf, cap, "[%d]", cJSON_GetArraySize(v));
    } else if (cJSON_IsObject(v)) {
        char *s = cJSON_PrintUnformatted(v);
        snprintf(buf, cap, "%s", s ? s : "{}");
        free(s);
    } else {
        snprintf(buf, cap, "null");
    }
}

/* ---- targets ------------------------------------------------------------------ */

typedef struct {
    const char *name;
    const char *sock;
    pdctl_role_t role;
} pdctl_target_t;

/* Resolve DAEMON|all|<socket path> into targets. `roles` limits "all". */
static int pdctl_targets(pdctl_state_t *st, const char *which, unsigned roles,
                         pdctl_target_t *out, int *n)
{
    *n = 0;
    if (which != NULL && strchr(which, '/') != NULL) {
        out[0] = (pdctl_target_t){ which, which, PDCTL_ROLE_N };
        *n = 1;
        return 0;
    }
    if (which == NULL || strcmp(which, "all") == 0) {
        for (int i = 0; i < st->n; i++)
            if (roles & (1u << st->d[i].role))
                out[(*n)++] = (pdctl_target_t){ st->d[i].name, st->d[i].sock, st->d[i].role };
        return 0;
    }
    pdctl_daemon_t *d = pdctl_state_find(st, which);
    if (d == NULL) {
        fprintf(stderr, "pdctl: no daemon \"%s\" in %s (names:", which, st->run_dir);
        for (int i = 0; i < st->n; i++)
            fprintf(stderr, " %s", st->d[i].name);
        fprintf(stderr, ")\n");
        return PDCTL_EXIT_USAGE;
    }
    out[0] = (pdctl_target_t){ d->name, d->sock, d->role };
    *n = 1;
    return 0;
}

/* Query one target; prints the error and returns NULL on failure, also for
 * an {"ok":false} reply. */
static cJSON *pdctl_ask(const pdctl_target_t *t, const char *cmd)
{
    char err[512];
    cJSON *r = pdctl_admin(t->sock, cmd, 5.0, err, sizeof(err));
    if (r == NULL) {
        fprintf(stderr, "pdctl: %s: %s\n", t->name, err);
        return NULL;
    }
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(r, "ok");
    if (!cJSON_IsTrue(ok)) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(r, "error");
        const char *m = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "message"));
        if (!cJSON_IsBool(ok))
            fprintf(stderr, "pdctl: %s: garbage reply (no \"ok\" field) to `%s`\n", t->name, cmd);
        else
            fprintf(stderr, "pdctl: %s: %s: %s\n", t->name, cmd, m ? m : "failed");
        cJSON_Delete(r);
        return NULL;
    }
    return r;
}

/* Load the state unless the target is a socket path. */
static int pdctl_state_for(const pdctl_opts_t *o, const char *which, pdctl_state_t *st)
{
    memset(st, 0, sizeof(*st));
    st->lock_fd = -1;
    if (which != NULL && strchr(which, '/') != NULL)
        return 0;
    return pdctl_state_load(o->run_dir, st);
}

/* ---- status ---------------------------------------------------------------------- */

static const cJSON *pdctl_backend(const cJSON *backends, const char *id)
{
    const cJSON *o;
    cJSON_ArrayForEach(o, cJSON_GetObjectItemCaseSensitive(backends, "backends")) {
        const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "id"));
        if (s != NULL && strcmp(s, id) == 0)
            return o;
    }
    return NULL;
}

static double pdctl_num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

const cJSON *pdctl_stats_values(const cJSON *stats, const char *table)
{
    const cJSON *s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(stats, "stats")) {
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "table"));
        if (t != NULL && strcmp(t, table) == 0)
            return cJSON_GetObjectItemCaseSensitive(s, "values");
    }
    return NULL;
}

static void pdctl_fmt_uptime(char *buf, size_t cap, double s)
{
    if (s >= 86400)
        snprintf(buf, cap, "%.0fd%02.0fh", floor(s / 86400), floor(fmod(s, 86400) / 3600));
    else if (s >= 3600)
        snprintf(buf, cap, "%.0fh%02.0fm", floor(s / 3600), floor(fmod(s, 3600) / 60));
    else if (s >= 60)
        snprintf(buf, cap, "%.0fm%02.0fs", floor(s / 60), floor(fmod(s, 60)));
    else
        snprintf(buf, cap, "%.0fs", s);
}

/* What the routers' `backends` replies say of a daemon: how many hold it
 * ready, and (in *b_p) the first router's entry for it, NULL if none. */
static int pdctl_backend_seen(cJSON *const *backends, int n_rt, const char *name,
                              const cJSON **b_p)
{
    int ready_at = 0;
    *b_p = NULL;
    for (int k = 0; k < n_rt; k++) {
        const cJSON *bk = pdctl_backend(backends[k], name);
        const char *ks = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(bk, "state"));
        ready_at += ks != NULL && strcmp(ks, "ready") == 0;
        if (*b_p == NULL)
            *b_p = bk;
    }
    return ready_at;
}

int pdctl_cmd_status(int argc, char **argv)
{
    pdctl_opts_t o = { 0 };
    pdctl_parse_opts(&argc, argv, &o);
    if (argc != 0) {
        fprintf(stderr, "usage: pdctl status [--run-dir D] [--json]\n");
        return PDCTL_EXIT_USAGE;
    }
    pdctl_state_t st;
    int rc = pdctl_state_load(o.run_dir, &st);
    if (rc != 0)
        return rc;
    char err[512] = "";
    /* every live router's view of the daemons; the first one's is shown,
     * ROUTERS counts the routers that have the daemon ready */
    cJSON *backends[PDCTL_MAX_ROUTERS] = { 0 };
    int n_rt = 0, n_rt_all = 0;
    for (int i = 0; i < st.n; i++) {
        if (st.d[i].role != PDCTL_ROUTER)
            continue;
        n_rt_all++;
        if (n_rt < PDCTL_MAX_ROUTERS && pdctl_daemon_alive(&st.d[i]))
            backends[n_rt++] = pdctl_admin(st.d[i].sock, "backends", 5.0, err, sizeof(err));
    }
    pdctl_table_t t = { 0 };
    cJSON *js = cJSON_CreateArray();
    int bad = 0;
    for (int i = 0; i < st.n; i++) {
        const pdctl_daemon_t *d = &st.d[i];
        int row = pdctl_row(&t);
        bool alive = pdctl_daemon_alive(d);
        char state[32] = "dead", load[96] = "-", up[32] = "-", routers[32] = "-", kvl[80] = "-";
        if (alive) {
            cJSON *s = pdctl_admin(d->sock, "stats", 5.0, err, sizeof(err));
            const cJSON *proc = cJSON_GetObjectItemCaseSensitive(s, "process");
            if (proc != NULL)
                pdctl_fmt_uptime(up, sizeof(up), pdctl_num(proc, "uptime_s"));
            if (d->role == PDCTL_ROUTER) {
                snprintf(state, sizeof(state), "%s", s ? "up" : "no-admin");
                const cJSON *v = pdctl_stats_values(s, "router");
                if (v != NULL)
                    snprintf(load, sizeof(load), "inflight=%.0f done=%.0f", pdctl_num(v, "requests_inflight"),
                             pdctl_num(v, "requests_completed"));
            } else {
                const cJSON *b = NULL;
                int ready_at = pdctl_backend_seen(backends, n_rt, d->name, &b);
                snprintf(routers, sizeof(routers), "%d/%d", ready_at, n_rt_all);
                /* where its KV plane (UCX tcp) listens: kv-listen */
                cJSON *kv = pdctl_admin(d->sock, "kv", 5.0, err, sizeof(err));
                const char *ka = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(kv, "kv_listen"));
                const char *kd = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(kv, "kv_device"));
                if (ka != NULL && kd != NULL && strcmp(kd, "*") == 0)
                    snprintf(kvl, sizeof(kvl), "*");
                else if (ka != NULL && kd != NULL)
                    snprintf(kvl, sizeof(kvl), "%s(%s)", ka, kd);
                cJSON_Delete(kv);
                const char *bs = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(b, "state"));
                snprintf(state, sizeof(state), "%s", bs ? bs : "unregistered");
                if (b != NULL) {
                    double tot = pdctl_num(b, "total_blocks"), fr = pdctl_num(b, "free_blocks");
                    snprintf(load, sizeof(load), "queue=%.0f run=%.0f kv=%.0f%%",
                             pdctl_num(b, "queue_depth"), pdctl_num(b, "running_seqs"),
                             tot > 0 ? 100.0 * (tot - fr) / tot : 0.0);
                }
            }
            cJSON_Delete(s);
        } else if (d->unit[0] != '\0') {
            /* installed, no admin socket here: on another host. What the
             * routers reachable from here say of it (a router elsewhere:
             * "elsewhere") */
            const cJSON *b = NULL;
            int ready_at = pdctl_backend_seen(backends, n_rt, d->name, &b);
            const char *bs = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(b, "state"));
            if (bs != NULL) {
                snprintf(state, sizeof(state), "%s", bs);
                snprintf(routers, sizeof(routers), "%d/%d", ready_at, n_rt_all);
                alive = true; /* the routers have it: not ours to call dead */
            } else {
                snprintf(state, sizeof(state), "%s",
                         d->role == PDCTL_ROUTER || n_rt > 0 ? "elsewhere?" : "elsewhere");
                alive = d->role == PDCTL_ROUTER || n_rt == 0; /* unknown, not dead */
            }
        }
        if (!alive || strcmp(state, "ready") != 0)
            bad += d->role != PDCTL_ROUTER || !alive;
        pdctl_put(&t, row, "DAEMON", "%s", d->name);
        unsigned epg, epr;
        bool ep = d->role == PDCTL_DECODE && pdctl_ep_rank_of(d->name, &epg, &epr);
        if (ep) /* a rank of an EP group (issue 36) */
            pdctl_put(&t, row, "ROLE", "decode ep decode-%u rank %u", epg, epr);
        else
            pdctl_put(&t, row, "ROLE", "%s", pdctl_role_name(d->role));
        pdctl_put(&t, row, "STATE", "%s", state);
        pdctl_put(&t, row, "LOAD", "%s", load);
        pdctl_put(&t, row, "PID", "%d", (int)d->pid);
        pdctl_put(&t, row, "UPTIME", "%s", up);
        pdctl_put(&t, row, "KV-LISTEN", "%s", kvl);
        if (n_rt_all > 1)
            pdctl_put(&t, row, "ROUTERS", "%s", routers);
        cJSON *jo = cJSON_CreateObject();
        cJSON_AddStringToObject(jo, "name", d->name);
        cJSON_AddStringToObject(jo, "role", pdctl_role_name(d->role));
        if (ep) {
            char g[32];
            snprintf(g, sizeof(g), "decode-%u", epg);
            cJSON_AddStringToObject(jo, "ep_group", g);
            cJSON_AddNumberToObject(jo, "ep_rank", epr);
        }
        cJSON_AddStringToObject(jo, "state", state);
        cJSON_AddStringToObject(jo, "load", load);
        cJSON_AddNumberToObject(jo, "pid", d->pid);
        cJSON_AddStringToObject(jo, "uptime", up);
        cJSON_AddStringToObject(jo, "kv_listen", kvl);
        if (d->role != PDCTL_ROUTER)
            cJSON_AddStringToObject(jo, "routers", routers);
        cJSON_AddItemToArray(js, jo);
    }
    if (o.json) {
        cJSON *top = cJSON_CreateObject();
        cJSON_AddStringToObject(top, "name", st.name);
        cJSON_AddStringToObject(top, "url", st.url);
        if (st.etcd_pid > 0) {
            cJSON *et = cJSON_AddObjectToObject(top, "etcd");
            cJSON_AddStringToObject(et, "url", st.etcd_url);
            cJSON_AddNumberToObject(et, "pid", st.etcd_pid);
            cJSON_AddBoolToObject(et, "up", pdctl_etcd_alive(&st));
        }
        cJSON_AddItemToObject(top, "daemons", js);
        cJSON_AddItemToObject(top, "planners", pdctl_planners_json(st.run_dir));
        char *s = cJSON_PrintUnformatted(top);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(top);
    } else {
        printf("deployment \"%s\"  %s  (run dir %s)\n", st.name, st.url, st.run_dir);
        if (st.etcd_pid > 0)
            printf("etcd %s  pid %d  %s\n", st.etcd_url, (int)st.etcd_pid,
                   pdctl_etcd_alive(&st) ? "up" : "dead");
        pdctl_table_print(&t, stdout, "\n");
        pdctl_planners_status(st.run_dir);
        cJSON_Delete(js);
    }
    pdctl_table_free(&t);
    for (int k = 0; k < n_rt; k++)
        cJSON_Delete(backends[k]);
    if (st.etcd_pid > 0 && !pdctl_etcd_alive(&st))
        bad++;
    return bad ? PDCTL_EXIT_FAIL : 0;
}

/* ---- stats | kv | leases | xfer | requests ------------------------------------ */

/* One row per object of `arr` (keys as columns), prefixed with DAEMON. */
static void pdctl_rows_of(pdctl_table_t *t, const char *daemon, const cJSON *arr)
{
    const cJSON *o;
    cJSON_ArrayForEach(o, arr) {
        int row = pdctl_row(t);
        pdctl_put(t, row, "DAEMON", "%s", daemon);
        const cJSON *f;
        cJSON_ArrayForEach(f, o) {
            char buf[256];
            pdctl_fmt_value(buf, sizeof(buf), f);
            pdctl_put(t, row, f->string, "%s", buf);
        }
    }
}

/* Scalars of an object as one row (skips "ok" and arrays). */
static void pdctl_row_of(pdctl_table_t *t, const char *daemon, const cJSON *obj)
{
    int row = pdctl_row(t);
    pdctl_put(t, row, "DAEMON", "%s", daemon);
    const cJSON *f;
    cJSON_ArrayForEach(f, obj) {
        if (strcmp(f->string, "ok") == 0 || cJSON_IsArray(f) || cJSON_IsObject(f))
            continue;
        char buf[256];
        pdctl_fmt_value(buf, sizeof(buf), f);
        pdctl_put(t, row, f->string, "%s", buf);
    }
}

/* Failed pulls of a kvx per-peer / total object. */
static double pdctl_pull_failures(const cJSON *p)
{
    static const char *const k[] = { "pulls_timed_out", "pulls_canceled", "pulls_peer_gone",
                                     "pulls_stale", "pulls_transport", "pulls_shutdown" };
    double f = 0;
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++)
        f += pdctl_num(p, k[i]);
    return f;
}

/* node_id (hex) -> prefill daemon name, from each prefill's `xfer`. */
typedef struct {
    char node[32];
    char name[48];
} pdctl_node_t;

static int pdctl_prefill_nodes(pdctl_state_t *st, pdctl_node_t *nodes, int cap)
{
    int n = 0;
    char err[256];
    for (int i = 0; i < st->n && n < cap; i++) {
        if (st->d[i].role != PDCTL_PREFILL)
            continue;
        cJSON *r = pdctl_admin(st->d[i].sock, "xfer", 5.0, err, sizeof(err));
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(r, "xfer"), "node_id"));
        if (id != NULL) {
            snprintf(nodes[n].node, sizeof(nodes[n].node), "%s", id);
            snprintf(nodes[n].name, sizeof(nodes[n].name), "%s", st->d[i].name);
            n++;
        }
        cJSON_Delete(r);
    }
    return n;
}

static const char *pdctl_node_name(const pdctl_node_t *nodes, int n, const char *node)
{
    for (int i = 0; i < n; i++)
        if (strcmp(nodes[i].node, node) == 0)
            return nodes[i].name;
    return node;
}

/* Per-peer rows from decode `xfer` replies: DECODE, PREFILL, pulls, bytes... */
static void pdctl_xfer_rows(pdctl_table_t *t, const char *daemon, const cJSON *reply,
                            const pdctl_node_t *nodes, int n_nodes)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(reply, "xfer");
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(x, "peers")) {
        const char *node = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "node_id"));
        const cJSON *lat = cJSON_GetObjectItemCaseSensitive(p, "latency");
        char bytes[32], p50[32], p99[32];
        pdctl_fmt_bytes(bytes, sizeof(bytes), pdctl_num(p, "bytes_pulled"));
        pdctl_fmt_ns(p50, sizeof(p50), pdctl_num(lat, "p50_ns"));
        pdctl_fmt_ns(p99, sizeof(p99), pdctl_num(lat, "p99_ns"));
        int row = pdctl_row(t);
        pdctl_put(t, row, "DECODE", "%s", daemon);
        pdctl_put(t, row, "PREFILL", "%s", node ? pdctl_node_name(nodes, n_nodes, node) : "?");
        pdctl_put(t, row, "STATE", "%s",
                  cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "state")) ?: "?");
        pdctl_put(t, row, "PULLS", "%.0f", pdctl_num(p, "pulls_ok"));
        pdctl_put(t, row, "FAILED", "%.0f", pdctl_pull_failures(p));
        pdctl_put(t, row, "BYTES", "%s", bytes);
        pdctl_put(t, row, "RECENT_GB/s", "%.3f", pdctl_num(p, "recent_bw_bytes_per_s") / 1e9);
        pdctl_put(t, row, "P50", "%s", p50);
        pdctl_put(t, row, "P99", "%s", p99);
        pdctl_put(t, row, "IN_FLIGHT", "%.0f",
                  pdctl_num(p, "pulls_started") - pdctl_num(p, "pulls_ok") - pdctl_pull_failures(p));
    }
}

static void pdctl_stats_rows(pdctl_table_t *t, const char *daemon, const cJSON *reply)
{
    const cJSON *s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(reply, "stats")) {
        const char *table = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "table"));
        char set[128];
        snprintf(set, sizeof(set), "%s", table ? table : "?");
        const cJSON *labels = cJSON_GetObjectItemCaseSensitive(s, "labels");
        const cJSON *l;
        cJSON_ArrayForEach(l, labels) {
            if (cJSON_IsString(l) && strcmp(l->string, "daemon") != 0) {
                size_t n = strlen(set);
                snprintf(set + n, sizeof(set) - n, "%s%s=%s", n ? " " : "", l->string, l->valuestring);
            }
        }
        const cJSON *v;
        cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(s, "values")) {
            char buf[256];
            pdctl_fmt_value(buf, sizeof(buf), v);
            int row = pdctl_row(t);
            pdctl_put(t, row, "DAEMON", "%s", daemon);
            pdctl_put(t, row, "SET", "%s", set);
            pdctl_put(t, row, "COUNTER", "%s", v->string);
            pdctl_put(t, row, "VALUE", "%s", buf);
        }
    }
}

int pdctl_cmd_query(const char *what, int argc, char **argv)
{
    pdctl_opts_t o = { 0 };
    pdctl_parse_opts(&argc, argv, &o);
    if (argc > 1) {
        fprintf(stderr, "usage: pdctl %s [DAEMON|all|SOCKET_PATH] [--run-dir D] [--json]\n", what);
        return PDCTL_EXIT_USAGE;
    }
    const char *which = argc == 1 ? argv[0] : NULL;
    unsigned all = (1u << PDCTL_ROUTER) | (1u << PDCTL_PREFILL) | (1u << PDCTL_DECODE);
    unsigned roles = all;
    if (strcmp(what, "kv") == 0)
        roles = (1u << PDCTL_PREFILL) | (1u << PDCTL_DECODE);
    else if (strcmp(what, "leases") == 0)
        roles = 1u << PDCTL_PREFILL;
    else if (strcmp(what, "xfer") == 0)
        roles = 1u << PDCTL_DECODE;
    bool matrix = strcmp(what, "xfer") == 0 && (which == NULL || strcmp(which, "all") == 0);

    pdctl_state_t st;
    int rc = pdctl_state_for(&o, which, &st);
    if (rc != 0)
        return rc;
    pdctl_target_t tg[PDCTL_MAX_DAEMONS];
    int n;
    if ((rc = pdctl_targets(&st, which, roles, tg, &n)) != 0)
        return rc;
    if (n == 0) {
        fprintf(stderr, "pdctl: no daemon in %s answers `%s`\n", st.run_dir, what);
        return PDCTL_EXIT_FAIL;
    }
    pdctl_node_t nodes[PDCTL_MAX_PER_ROLE];
    int n_nodes = strcmp(what, "xfer") == 0 && st.n > 0 ?
                  pdctl_prefill_nodes(&st, nodes, PDCTL_MAX_PER_ROLE) : 0;
    pdctl_table_t t = { 0 };
    cJSON *all_json = cJSON_CreateObject();
    int failed = 0;
    for (int i = 0; i < n; i++) {
        cJSON *r = pdctl_ask(&tg[i], what);
        if (r == NULL) {
            failed++;
            continue;
        }
        if (strcmp(what, "stats") == 0) {
            pdctl_stats_rows(&t, tg[i].name, r);
        } else if (strcmp(what, "xfer") == 0) {
            pdctl_xfer_rows(&t, tg[i].name, r, nodes, n_nodes);
        } else if (strcmp(what, "kv") == 0) {
            pdctl_row_of(&t, tg[i].name, r);
        } else {
            const cJSON *arr = cJSON_GetObjectItemCaseSensitive(r, what);
            pdctl_rows_of(&t, tg[i].name, arr);
        }
        cJSON_AddItemToObject(all_json, tg[i].name, r);
    }
    if (o.json) {
        /* one daemon named: its reply; `all` (or none named): always an
         * object keyed by daemon name, however many there are */
        bool one = which != NULL && strcmp(which, "all") != 0;
        cJSON *out = one ? cJSON_GetObjectItemCaseSensitive(all_json, tg[0].name) : all_json;
        if (out != NULL) {
            char *s = cJSON_PrintUnformatted(out);
            printf("%s\n", s);
            free(s);
        }
    } else if (failed < n) {
        if (matrix)
            printf("KV transfers (decode pulls from prefill), totals since start:\n");
        if (t.nrows == 0)
            printf("(no %s)\n", strcmp(what, "xfer") == 0 ? "transfers yet" : what);
        else
            pdctl_table_print(&t, stdout, "\n");
        if (strcmp(what, "requests") == 0) {
            /* outcome counters below the table */
            const cJSON *d;
            cJSON_ArrayForEach(d, all_json) {
                const cJSON *c = cJSON_GetObjectItemCaseSensitive(d, "counters");
                if (c == NULL)
                    continue;
                printf("%s:", d->string);
                const cJSON *f;
                cJSON_ArrayForEach(f, c)
                    printf(" %s=%.0f", f->string, cJSON_GetNumberValue(f));
                printf("\n");
            }
        }
    }
    pdctl_table_free(&t);
    cJSON_Delete(all_json);
    return failed ? PDCTL_EXIT_FAIL : 0;
}

/* ---- top ------------------------------------------------------------------------ */

#define PDCTL_MAX_PAIRS (PDCTL_MAX_PER_ROLE * PDCTL_MAX_PER_ROLE)

typedef struct {
    double t;                  /* monotonic s */
    double done;               /* router requests completed + failed, all routers */
    double rdone[PDCTL_MAX_ROUTERS]; /* the same per router (state order) */
    int n_pairs;
    struct {
        char dec[48], node[32];
        double bytes;
    } pairs[PDCTL_MAX_PAIRS];
} pdctl_sample_t;

static double pdctl_pair_bytes(const pdctl_sample_t *s, const char *dec, const char *node)
{
    for (int i = 0; i < s->n_pairs; i++)
        if (strcmp(s->pairs[i].dec, dec) == 0 && strcmp(s->pairs[i].node, node) == 0)
            return s->pairs[i].bytes;
    return -1;
}

/* One frame into `out`; `prev` (may have t == 0) for rates. */
static int pdctl_top_frame(pdctl_state_t *st, const pdctl_sample_t *prev, pdctl_sample_t *cur,
                           FILE *out, const char *eol)
{
    char err[512] = "";
    /* every router: totals over all of them, one row each; the first live
     * one's view of the daemons */
    memset(cur, 0, sizeof(*cur));
    cur->t = pdctl_now();
    cJSON *be = NULL;
    pdctl_table_t rt = { 0 };
    double sum[6] = { 0 };
    static const char *const sum_keys[6] = { "requests_inflight", "requests_completed",
                                             "requests_failed", "requests_retried",
                                             "requests_disaggregated", "requests_local" };
    double up_max = 0;
    int n_rt = 0, n_live = 0;
    const cJSON *v0 = NULL;
    cJSON *rs_keep[PDCTL_MAX_ROUTERS] = { 0 };
    for (int i = 0; i < st->n && n_rt < PDCTL_MAX_ROUTERS; i++) {
        const pdctl_daemon_t *router = &st->d[i];
        if (router->role != PDCTL_ROUTER)
            continue;
        int k = n_rt++;
        int row = pdctl_row(&rt);
        pdctl_put(&rt, row, "ROUTER", "%s", router->name);
        cJSON *rs = pdctl_admin(router->sock, "stats", 2.0, err, sizeof(err));
        rs_keep[k] = rs;
        if (rs == NULL) {
            pdctl_put(&rt, row, "STATE", "%s", pdctl_daemon_alive(router) ? "no-admin" : "dead");
            continue;
        }
        n_live++;
        if (be == NULL)
            be = pdctl_admin(router->sock, "backends", 2.0, err, sizeof(err));
        const cJSON *v = pdctl_stats_values(rs, "router");
        if (v0 == NULL)
            v0 = v;
        for (int j = 0; j < 6; j++)
            sum[j] += pdctl_num(v, sum_keys[j]);
        cur->rdone[k] = pdctl_num(v, "requests_completed") + pdctl_num(v, "requests_failed");
        double uptime = pdctl_num(cJSON_GetObjectItemCaseSensitive(rs, "process"), "uptime_s");
        up_max = uptime > up_max ? uptime : up_max;
        double rps = prev->t > 0 && cur->t > prev->t && prev->rdone[k] <= cur->rdone[k]
                     ? (cur->rdone[k] - prev->rdone[k]) / (cur->t - prev->t)
                     : uptime > 0 ? cur->rdone[k] / uptime : 0;
        char p50[32], p99[32];
        const cJSON *ttft = cJSON_GetObjectItemCaseSensitive(v, "request_ttft");
        pdctl_fmt_ns(p50, sizeof(p50), pdctl_num(ttft, "p50_ns"));
        pdctl_fmt_ns(p99, sizeof(p99), pdctl_num(ttft, "p99_ns"));
        pdctl_put(&rt, row, "STATE", "up");
        pdctl_put(&rt, row, "REQ/S", "%.1f", rps);
        pdctl_put(&rt, row, "INFLIGHT", "%.0f", pdctl_num(v, "requests_inflight"));
        pdctl_put(&rt, row, "DONE", "%.0f", pdctl_num(v, "requests_completed"));
        pdctl_put(&rt, row, "FAILED", "%.0f", pdctl_num(v, "requests_failed"));
        pdctl_put(&rt, row, "TTFT_P50", "%s", p50);
        pdctl_put(&rt, row, "TTFT_P99", "%s", p99);
    }
    if (n_live == 0) {
        fprintf(out, "router: %s%s", err[0] ? err : "not in the deployment", eol);
        pdctl_table_free(&rt);
        cJSON_Delete(be);
        for (int k = 0; k < n_rt; k++)
            cJSON_Delete(rs_keep[k]);
        return PDCTL_EXIT_FAIL;
    }
    cur->done = sum[1] + sum[2];
    double rps = prev->t > 0 && cur->t > prev->t && prev->done <= cur->done
                 ? (cur->done - prev->done) / (cur->t - prev->t)
                 : up_max > 0 ? cur->done / up_max : 0;
    /* latency percentiles cannot be merged: the first router's, and each
     * router's TTFT in its row */
    const cJSON *v = v0;
    char tt50[32], tt99[32], it50[32], it99[32];
    const cJSON *ttft = cJSON_GetObjectItemCaseSensitive(v, "request_ttft");
    const cJSON *itl = cJSON_GetObjectItemCaseSensitive(v, "request_inter_token");
    pdctl_fmt_ns(tt50, sizeof(tt50), pdctl_num(ttft, "p50_ns"));
    pdctl_fmt_ns(tt99, sizeof(tt99), pdctl_num(ttft, "p99_ns"));
    pdctl_fmt_ns(it50, sizeof(it50), pdctl_num(itl, "p50_ns"));
    pdctl_fmt_ns(it99, sizeof(it99), pdctl_num(itl, "p99_ns"));
    time_t now = time(NULL);
    char clock[32];
    strftime(clock, sizeof(clock), "%H:%M:%S", localtime(&now));
    fprintf(out, "pdctl top - %s  deployment \"%s\"  %s%s", clock, st->name, st->url, eol);
    fprintf(out, "requests/s %.1f%s  in flight %.0f  done %.0f  failed %.0f  retried %.0f  "
            "disagg %.0f  local %.0f%s%s", rps, prev->t > 0 ? "" : " (avg)",
            sum[0], sum[1], sum[2], sum[3], sum[4], sum[5],
            n_rt > 1 ? "  (all routers)" : "", eol);
    fprintf(out, "TTFT p50 %s p99 %s   inter-token p50 %s p99 %s%s%s", tt50, tt99, it50, it99,
            n_rt > 1 ? "  (first router)" : "", eol);
    /* prefix caching across the deployment: the usage figure (prompt tokens
     * the computing daemon reused) and the router's KV-aware choices (each
     * router keeps its own index: the first router's) */
    double pt = pdctl_num(v, "prompt_tokens"), ct = pdctl_num(v, "prompt_cached_tokens");
    fprintf(out, "prefix cache hit %.1f%% of prompt tokens (%.0f)  routed by cache: prefill %.0f "
            "decode %.0f  index %.0f blocks  prefills pulled from decodes %.0f tokens "
            "(%.0f of %.0f exports)%s%s%s", pt > 0 ? 100 * ct / pt : 0.0, ct,
            pdctl_num(v, "kv_route_prefill_hits"), pdctl_num(v, "kv_route_decode_hits"),
            pdctl_num(v, "kv_index_names"), pdctl_num(v, "kv_src_tokens"),
            pdctl_num(v, "kv_src_used"), pdctl_num(v, "kv_src_exports"),
            n_rt > 1 ? "  (first router)" : "", eol, eol);
    if (n_rt > 1) {
        pdctl_table_print(&rt, out, eol);
        fputs(eol, out);
    }
    pdctl_table_free(&rt);

    pdctl_table_t t = { 0 };
    for (int i = 0; i < st->n; i++) {
        const pdctl_daemon_t *d = &st->d[i];
        if (d->role == PDCTL_ROUTER)
            continue;
        int row = pdctl_row(&t);
        const cJSON *b = pdctl_backend(be, d->name);
        pdctl_put(&t, row, "DAEMON", "%s", d->name);
        pdctl_put(&t, row, "STATE", "%s",
                  b ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(b, "state")) ?: "?"
                    : pdctl_daemon_alive(d) ? "unregistered" : "dead");
        if (b != NULL) {
            double tot = pdctl_num(b, "total_blocks"), fr = pdctl_num(b, "free_blocks");
            pdctl_put(&t, row, "QUEUE", "%.0f", pdctl_num(b, "queue_depth"));
            pdctl_put(&t, row, "RUNNING", "%.0f", pdctl_num(b, "running_seqs"));
            pdctl_put(&t, row, "KV_USED", "%.0f/%.0f", tot - fr, tot);
            pdctl_put(&t, row, "KV%", "%.0f", tot > 0 ? 100 * (tot - fr) / tot : 0.0);
            pdctl_put(&t, row, "LEASES", "%.0f", pdctl_num(b, "leases"));
            pdctl_put(&t, row, "INDEXED", "%.0f", pdctl_num(b, "kv_blocks_indexed"));
        }
        /* prefix cache (daemon's `kv`): token hit rate and blocks cached */
        cJSON *kv = pdctl_admin(d->sock, "kv", 2.0, err, sizeof(err));
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(kv, "cache");
        if (c != NULL) {
            pdctl_put(&t, row, "PREFIX_HIT%", "%.0f", 100 * pdctl_num(c, "hit_rate"));
            pdctl_put(&t, row, "CACHED", "%.0f", pdctl_num(c, "blocks"));
        } else if (kv != NULL) {
            pdctl_put(&t, row, "PREFIX_HIT%", "off");
        }
        cJSON_Delete(kv);
        /* cores lent through the kernel (issue 34): thread-seconds used
         * above the daemon's cpu-share, and of its share left to others */
        cJSON *sr = pdctl_admin(d->sock, "stats", 2.0, err, sizeof(err));
        const cJSON *cv = pdctl_stats_values(sr, "cpu");
        if (cv != NULL) {
            pdctl_put(&t, row, "CPU_S", "%.1f", pdctl_num(cv, "used_ms") / 1e3);
            pdctl_put(&t, row, "BORROWED_S", "%.1f", pdctl_num(cv, "borrowed_ms") / 1e3);
            pdctl_put(&t, row, "LENT_S", "%.1f", pdctl_num(cv, "lent_ms") / 1e3);
        }
        cJSON_Delete(sr);
        /* decode-local prompt chunks (issue 34): mean size so far / the
         * next one's budget (tpot-target sizes it; else prefill-chunk) */
        if (d->role == PDCTL_DECODE) {
            cJSON *rq = pdctl_admin(d->sock, "requests", 2.0, err, sizeof(err));
            const cJSON *cn = cJSON_GetObjectItemCaseSensitive(rq, "counters");
            const cJSON *ck = cJSON_GetObjectItemCaseSensitive(rq, "chunking");
            if (cn != NULL && ck != NULL) {
                double nch = pdctl_num(cn, "chunks");
                pdctl_put(&t, row, "CHUNK", "%.0f/%.0f",
                          nch > 0 ? pdctl_num(cn, "chunk_tokens") / nch : 0.0,
                          pdctl_num(ck, "budget_tokens"));
            }
            cJSON_Delete(rq);
        }
    }
    pdctl_table_print(&t, out, eol);
    pdctl_table_free(&t);

    /* transfer matrix: rows decode, columns prefill, current GB/s */
    pdctl_node_t nodes[PDCTL_MAX_PER_ROLE];
    int n_nodes = pdctl_prefill_nodes(st, nodes, PDCTL_MAX_PER_ROLE);
    pdctl_table_t m = { 0 };
    pdctl_col(&m, "GB/s (decode<-prefill)");
    for (int k = 0; k < n_nodes; k++)
        pdctl_col(&m, nodes[k].name);
    for (int i = 0; i < st->n; i++) {
        const pdctl_daemon_t *d = &st->d[i];
        if (d->role != PDCTL_DECODE)
            continue;
        int row = pdctl_row(&m);
        pdctl_put(&m, row, "GB/s (decode<-prefill)", "%s", d->name);
        cJSON *x = pdctl_admin(d->sock, "xfer", 2.0, err, sizeof(err));
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(
                                  cJSON_GetObjectItemCaseSensitive(x, "xfer"), "peers")) {
            const char *node = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "node_id"));
            if (node == NULL || cur->n_pairs == PDCTL_MAX_PAIRS)
                continue;
            double bytes = pdctl_num(p, "bytes_pulled");
            snprintf(cur->pairs[cur->n_pairs].dec, sizeof(cur->pairs[0].dec), "%s", d->name);
            snprintf(cur->pairs[cur->n_pairs].node, sizeof(cur->pairs[0].node), "%s", node);
            cur->pairs[cur->n_pairs++].bytes = bytes;
            double pb = pdctl_pair_bytes(prev, d->name, node);
            double gbps = prev->t > 0 && pb >= 0 ? (bytes - pb) / (cur->t - prev->t) / 1e9
                                                 : pdctl_num(p, "recent_bw_bytes_per_s") / 1e9;
            char tot[32];
            pdctl_fmt_bytes(tot, sizeof(tot), bytes);
            pdctl_put(&m, row, pdctl_node_name(nodes, n_nodes, node), "%.3f (%s, %.0f fail)", gbps,
                      tot, pdctl_pull_failures(p));
        }
        cJSON_Delete(x);
    }
    fputs(eol, out);
    if (m.nrows > 0)
        pdctl_table_print(&m, out, eol);
    pdctl_table_free(&m);
    for (int k = 0; k < n_rt; k++)
        cJSON_Delete(rs_keep[k]);
    cJSON_Delete(be);
    return 0;
}

static volatile sig_atomic_t pdctl_top_stop;

static void pdctl_top_signal(int sig)
{
    (void)sig;
    pdctl_top_stop = 1;
}

int pdctl_cmd_top(int argc, char **argv)
{
    pdctl_opts_t o = { 0 };
    pdctl_parse_opts(&argc, argv, &o);
    if (argc != 0) {
        fprintf(stderr, "usage: pdctl top [--once] [--run-dir D]\n");
        return PDCTL_EXIT_USAGE;
    }
    pdctl_state_t st;
    int rc = pdctl_state_load(o.run_dir, &st);
    if (rc != 0)
        return rc;
    static pdctl_sample_t a, b;
    memset(&a, 0, sizeof(a));
    if (o.once)
        return pdctl_top_frame(&st, &a, &b, stdout, "\n");
    bool tty = isatty(0);
    struct termios saved, raw;
    if (tty && tcgetattr(0, &saved) == 0) {
        raw = saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        tcsetattr(0, TCSANOW, &raw);
    } else {
        tty = false;
    }
    struct sigaction sa = { .sa_handler = pdctl_top_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    printf("\033[?25l");  /* hide the cursor */
    pdctl_sample_t *prev = &a, *cur = &b;
    for (;;) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (f == NULL)
            break;
        /* re-read the run dir each frame: `pdctl scale` adds and removes
         * daemons while top runs (keep the last good state if it fails) */
        pdctl_state_t fresh;
        if (pdctl_state_load(o.run_dir, &fresh) == 0)
            st = fresh;
        rc = pdctl_top_frame(&st, prev, cur, f, "\033[K\n");
        fclose(f);
        printf("\033[H%s\033[J(q to quit)", buf);
        fflush(stdout);
        free(buf);
        pdctl_sample_t *tmp = prev;
        prev = cur;
        cur = tmp;
        double until = pdctl_now() + 1.0;
        bool quit = false;
        while (!quit && !pdctl_top_stop && pdctl_now() < until) {
            struct pollfd p = { .fd = 0, .events = POLLIN };
            int r = poll(&p, 1, (int)((until - pdctl_now()) * 1000) + 1);
            if (r > 0) {
                char c;
                if (read(0, &c, 1) != 1 || c == 'q' || c == 'Q')
                    quit = true;
            } else if (r < 0 && errno != EINTR) {
                break;
            }
        }
        if (quit || pdctl_top_stop)
            break;
    }
    printf("\033[?25h\n");
    if (tty)
        tcsetattr(0, TCSANOW, &saved);
    return 0;
}
