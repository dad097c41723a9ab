/* pd_e2e.c - see pd_e2e.h. */
#include "pd_e2e.h"
#include "pd_httpc.h"
#include "pd_time.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- process registry (atexit cleanup) ------------------------------------ */

#define REG_MAX 128
static pid_t g_reg[REG_MAX];
static bool g_atexit_set;

static void reg_kill_all(void)
{
    for (int i = 0; i < REG_MAX; i++)
        if (g_reg[i] > 0) {
            kill(g_reg[i], SIGKILL);
            waitpid(g_reg[i], NULL, 0);
            g_reg[i] = 0;
        }
}

static void reg_add(pid_t pid)
{
    if (!g_atexit_set) {
        atexit(reg_kill_all);
        g_atexit_set = true;
    }
    for (int i = 0; i < REG_MAX; i++)
        if (g_reg[i] == 0) {
            g_reg[i] = pid;
            return;
        }
}

static void reg_del(pid_t pid)
{
    for (int i = 0; i < REG_MAX; i++)
        if (g_reg[i] == pid)
            g_reg[i] = 0;
}

double e2e_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void e2e_nap_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* ---- processes -------------------------------------------------------------- */

static const char *role_name(e2e_role_t r)
{
    return r == E2E_ROUTER ? "router" : r == E2E_PREFILL ? "prefill" : "decode";
}

static const char *role_bin(const e2e_deploy_t *d, e2e_role_t r)
{
    return r == E2E_ROUTER ? d->o.router_bin : r == E2E_PREFILL ? d->o.prefill_bin
                                                                 : d->o.decode_bin;
}

typedef struct {
    char *v[3 * E2E_MAX_ARGS + 2];
    int n;
} argv_t;

/* Add "--key=value", replacing an earlier value of the same key. */
static void argv_set(argv_t *a, const char *arg)
{
    const char *eq = strchr(arg, '=');
    size_t kl = eq ? (size_t)(eq - arg) : strlen(arg);
    for (int i = 1; i < a->n; i++)
        if (strncmp(a->v[i], arg, kl) == 0 && (a->v[i][kl] == '=' || a->v[i][kl] == '\0')) {
            free(a->v[i]);
            a->v[i] = strdup(arg);
            return;
        }
    if (a->n < (int)(sizeof(a->v) / sizeof(a->v[0])) - 1)
        a->v[a->n++] = strdup(arg);
    a->v[a->n] = NULL;
}

static void argv_setf(argv_t *a, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    argv_set(a, buf);
}

static void argv_free(argv_t *a)
{
    for (int i = 0; i < a->n; i++)
        free(a->v[i]);
    a->n = 0;
}

static int spawn(e2e_deploy_t *d, e2e_proc_t *p)
{
    argv_t a = { .n = 0 };
    a.v[a.n++] = strdup(role_bin(d, p->role));
    argv_setf(&a, "--model=%s", d->o.model);
    argv_setf(&a, "--secret=%s", d->secret_hex);
    argv_setf(&a, "--admin.socket=%s", p->sock);
    argv_setf(&a, "--ready-file=%s", p->ready);
    argv_setf(&a, "--id=%s", p->id);
    if (p->role == E2E_ROUTER) {
        argv_set(&a, "--http=127.0.0.1:0");
        argv_set(&a, "--control=127.0.0.1:0");
        for (int i = 0; d->o.router_args && d->o.router_args[i]; i++)
            argv_set(&a, d->o.router_args[i]);
    } else {
        if (d->o.no_router_arg)
            ; /* etcd tells them */
        else if (d->n_routers > 1)
            argv_set(&a, d->routers_arg);
        else
            argv_setf(&a, "--router=127.0.0.1:%u", d->control_port);
        argv_set(&a, "--threads=1");
        argv_set(&a, "--reconnect-min=100ms");
        const char *const *ex = p->role == E2E_PREFILL ? d->o.prefill_args : d->o.decode_args;
        for (int i = 0; ex && ex[i]; i++)
            argv_set(&a, ex[i]);
    }
    for (int i = 0; p->extra[i]; i++)
        argv_set(&a, p->extra[i]);
    unlink(p->ready);
    FILE *lf = fopen(p->log, "a");
    if (lf) {
        fprintf(lf, "### e2e:");
        for (int i = 0; i < a.n; i++)
            fprintf(lf, " %s", strncmp(a.v[i], "--secret=", 9) == 0 ? "--secret=<hidden>" : a.v[i]);
        fprintf(lf, "\n");
        fclose(lf);
    }
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        argv_free(&a);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(126);
        int fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        for (int i = 0; d->o.env && d->o.env[i]; i++)
            putenv((char *)d->o.env[i]);
        for (int i = 0; p->env[i]; i++)
            putenv((char *)p->env[i]);
        signal(SIGPIPE, SIG_DFL);
        execv(a.v[0], a.v);
        _exit(127);
    }
    argv_free(&a);
    p->pid = pid;
    p->status = -1;
    p->stopped = false;
    reg_add(pid);
    return 0;
}

bool e2e_proc_alive(e2e_proc_t *p)
{
    if (p->pid <= 0)
        return false;
    int st;
    pid_t w = waitpid(p->pid, &st, WNOHANG);
    if (w == p->pid) {
        reg_del(p->pid);
        p->pid = 0;
        p->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return false;
    }
    return true;
}

int e2e_proc_wait(e2e_proc_t *p, double timeout_s)
{
    double end = e2e_now() + timeout_s;
    while (e2e_proc_alive(p)) {
        if (e2e_now() > end)
            return -1;
        e2e_nap_ms(5);
    }
    return p->status;
}

int e2e_proc_signal(e2e_proc_t *p, int sig)
{
    if (p->pid <= 0)
        return -1;
    if (sig == SIGTERM || sig == SIGINT || sig == SIGKILL)
        p->stopped = true;
    return kill(p->pid, sig);
}

void e2e_proc_dump_log(const e2e_proc_t *p, int tail_lines)
{
    FILE *f = fopen(p->log, "r");
    if (f == NULL)
        return;
    char *lines[256] = { 0 };
    int n = 0;
    char buf[2048];
    if (tail_lines > 256)
        tail_lines = 256;
    while (fgets(buf, sizeof(buf), f)) {
        free(lines[n % tail_lines]);
        lines[n % tail_lines] = strdup(buf);
        n++;
    }
    fclose(f);
    fprintf(stderr, "---- %s (%s) log tail ----\n", p->id, p->log);
    int start = n > tail_lines ? n - tail_lines : 0;
    for (int i = start; i < n; i++)
        fputs(lines[i % tail_lines], stderr);
    for (int i = 0; i < tail_lines; i++)
        free(lines[i]);
}

static cJSON *read_json_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return cJSON_Parse(buf);
}

static void proc_init(e2e_deploy_t *d, e2e_proc_t *p, e2e_role_t role, const char *id)
{
    memset(p, 0, sizeof(*p));
    p->role = role;
    p->status = -1;
    snprintf(p->id, sizeof(p->id), "%s", id);
    snprintf(p->sock, sizeof(p->sock), "%.60s/%.40s.sock", d->dir, id);
    snprintf(p->log, sizeof(p->log), "%s/%s.log", d->dir, id);
    snprintf(p->ready, sizeof(p->ready), "%s/%s.ready", d->dir, id);
}

static int wait_ready_file(e2e_proc_t *p, double timeout_s)
{
    double end = e2e_now() + timeout_s;
    for (;;) {
        cJSON *j = read_json_file(p->ready);
        if (j != NULL) {
            cJSON_Delete(j);
            return 0;
        }
        if (!e2e_proc_alive(p)) {
            fprintf(stderr, "e2e: %s exited (status %d) before ready\n", p->id, p->status);
            e2e_proc_dump_log(p, 30);
            return -1;
        }
        if (e2e_now() > end) {
            fprintf(stderr, "e2e: %s not ready after %.0f s\n", p->id, timeout_s);
            e2e_proc_dump_log(p, 30);
            return -1;
        }
        e2e_nap_ms(10);
    }
}

static int wait_http_ready(e2e_deploy_t *d, uint16_t port, double timeout_s)
{
    (void)d;
    double end = e2e_now() + timeout_s;
    for (;;) {
        e2e_resp_t r;
        e2e_http(port, "GET", "/ready", NULL, NULL, 2.0, &r);
        int st = r.status;
        e2e_resp_free(&r);
        if (st == 200)
            return 0;
        if (e2e_now() > end) {
            fprintf(stderr, "e2e: router /ready still %d after %.0f s\n", st, timeout_s);
            return -1;
        }
        e2e_nap_ms(20);
    }
}

static void make_secret(char hex[65])
{
    unsigned char b[32];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, b, sizeof(b)) != (ssize_t)sizeof(b)) {
        for (int i = 0; i < 32; i++)
            b[i] = (unsigned char)(rand() ^ (i * 37));
    }
    if (fd >= 0)
        close(fd);
    for (int i = 0; i < 32; i++)
        sprintf(hex + 2 * i, "%02x", b[i]);
}

e2e_proc_t *e2e_add_daemon(e2e_deploy_t *d, e2e_role_t role, const char *id,
                           const char *const *extra)
{
    e2e_proc_t *arr = role == E2E_PREFILL ? d->prefill : d->decode;
    int *n = role == E2E_PREFILL ? &d->n_prefill : &d->n_decode;
    if (*n >= E2E_MAX_DAEMONS)
        return NULL;
    char idbuf[48];
    if (id == NULL) {
        snprintf(idbuf, sizeof(idbuf), "%s-%d", role_name(role), *n);
        id = idbuf;
    }
    e2e_proc_t *p = &arr[(*n)++];
    proc_init(d, p, role, id);
    for (int i = 0; extra && extra[i] && i < E2E_MAX_ARGS - 1; i++)
        p->extra[i] = extra[i];
    if (spawn(d, p) != 0 || wait_ready_file(p, d->o.ready_timeout_s) != 0)
        return NULL;
    return p;
}

/* Routers of d (a deployment not made by e2e_deploy_start has one). */
static int n_routers(const e2e_deploy_t *d)
{
    return d->n_routers > 1 ? d->n_routers : 1;
}

e2e_proc_t *e2e_router(e2e_deploy_t *d, int i)
{
    return i == 0 ? &d->router : &d->more_routers[i - 1];
}

/* Spawn router i, wait for its ready file, read its ports. */
static int start_router(e2e_deploy_t *d, int i)
{
    e2e_proc_t *r = e2e_router(d, i);
    if (spawn(d, r) != 0 || wait_ready_file(r, d->o.ready_timeout_s) != 0)
        return -1;
    cJSON *j = read_json_file(r->ready);
    d->router_http[i] = (uint16_t)e2e_jnum(j, "http");
    d->router_control[i] = (uint16_t)e2e_jnum(j, "control");
    cJSON_Delete(j);
    if (d->router_http[i] == 0 || d->router_control[i] == 0) {
        fprintf(stderr, "e2e: %s ready file lacks http/control ports\n", r->id);
        return -1;
    }
    if (i == 0) {
        d->http_port = d->router_http[0];
        d->control_port = d->router_control[0];
    }
    return 0;
}

int e2e_deploy_start(e2e_deploy_t *d, const e2e_opts_t *o)
{
    memset(d, 0, sizeof(*d));
    signal(SIGPIPE, SIG_IGN);
    d->o = *o;
    if (d->o.ready_timeout_s <= 0)
        d->o.ready_timeout_s = 30;
    d->n_routers = o->n_routers > 1 ? o->n_routers : 1;
    if (d->n_routers > E2E_MAX_ROUTERS)
        return -1;
    snprintf(d->dir, sizeof(d->dir), "/tmp/pd-e2e-XXXXXX");
    if (mkdtemp(d->dir) == NULL)
        return -1;
    make_secret(d->secret_hex);
    for (int i = 0; i < d->n_routers; i++) {
        char id[48];
        if (i == 0)
            snprintf(id, sizeof(id), "router");
        else
            snprintf(id, sizeof(id), "router-%d", i);
        proc_init(d, e2e_router(d, i), E2E_ROUTER, id);
        if (start_router(d, i) != 0)
            return -1;
    }
    size_t off = (size_t)snprintf(d->routers_arg, sizeof(d->routers_arg), "--router=");
    for (int i = 0; i < d->n_routers; i++)
        off += (size_t)snprintf(d->routers_arg + off, sizeof(d->routers_arg) - off,
                                "%s127.0.0.1:%u", i ? "," : "", d->router_control[i]);
    /* Spawn all daemons first, then wait: they load models in parallel. */
    for (int i = 0; i < o->n_prefill; i++) {
        e2e_proc_t *p = &d->prefill[d->n_prefill];
        char id[48];
        snprintf(id, sizeof(id), "prefill-%d", d->n_prefill++);
        proc_init(d, p, E2E_PREFILL, id);
        if (spawn(d, p) != 0)
            return -1;
    }
    for (int i = 0; i < o->n_decode; i++) {
        e2e_proc_t *p = &d->decode[d->n_decode];
        char id[48];
        snprintf(id, sizeof(id), "decode-%d", d->n_decode++);
        proc_init(d, p, E2E_DECODE, id);
        if (spawn(d, p) != 0)
            return -1;
    }
    for (int i = 0; i < d->n_prefill; i++)
        if (wait_ready_file(&d->prefill[i], d->o.ready_timeout_s) != 0)
            return -1;
    for (int i = 0; i < d->n_decode; i++)
        if (wait_ready_file(&d->decode[i], d->o.ready_timeout_s) != 0)
            return -1;
    for (int i = 0; o->n_decode > 0 && i < d->n_routers; i++)
        if (wait_http_ready(d, d->router_http[i], d->o.ready_timeout_s) != 0) {
            e2e_proc_dump_log(e2e_router(d, i), 30);
            return -1;
        }
    return 0;
}

int e2e_restart_router_i(e2e_deploy_t *d, int i)
{
    e2e_proc_t *r = e2e_router(d, i);
    if (i >= d->n_routers || e2e_proc_alive(r))
        return -1;
    snprintf(d->router_ctl_args[i], sizeof(d->router_ctl_args[i]), "--control=127.0.0.1:%u",
             d->router_control[i]);
    r->extra[0] = d->router_ctl_args[i];   /* same control port: daemons reconnect */
    r->extra[1] = NULL;
    unlink(r->sock);
    if (start_router(d, i) != 0)
        return -1;
    return wait_http_ready(d, d->router_http[i], d->o.ready_timeout_s);
}

int e2e_restart_router(e2e_deploy_t *d)
{
    return e2e_restart_router_i(d, 0);
}

static int stop_one(e2e_proc_t *p, bool verbose, bool send_term)
{
    if (p->pid > 0) {
        if (send_term)   /* once: a second SIGTERM means "stop now" */
            e2e_proc_signal(p, SIGTERM);
        if (e2e_proc_wait(p, 10.0) < 0) {
            fprintf(stderr, "e2e: %s ignored SIGTERM for 10 s: SIGKILL\n", p->id);
            kill(p->pid, SIGKILL);
            e2e_proc_wait(p, 5.0);
            e2e_proc_dump_log(p, 30);
            return 1;
        }
        if (p->status != 0) {
            fprintf(stderr, "e2e: %s exited with status %d after SIGTERM\n", p->id, p->status);
            e2e_proc_dump_log(p, 40);
            return 1;
        }
    } else if (p->status > 0 && p->status != 128 + SIGKILL) {
        fprintf(stderr, "e2e: %s had exited with status %d\n", p->id, p->status);
        e2e_proc_dump_log(p, 40);
        return 1;
    }
    if (verbose)
        e2e_proc_dump_log(p, 20);
    return 0;
}

int e2e_deploy_stop(e2e_deploy_t *d, bool verbose)
{
    int bad = 0;
    for (int i = 0; i < d->n_decode; i++)
        if (d->decode[i].pid > 0)
            e2e_proc_signal(&d->decode[i], SIGTERM);
    for (int i = 0; i < d->n_prefill; i++)
        if (d->prefill[i].pid > 0)
            e2e_proc_signal(&d->prefill[i], SIGTERM);
    for (int i = 0; i < d->n_decode; i++)
        bad += stop_one(&d->decode[i], verbose, false);
    for (int i = 0; i < d->n_prefill; i++)
        bad += stop_one(&d->prefill[i], verbose, false);
    for (int i = 0; i < n_routers(d); i++)
        bad += stop_one(e2e_router(d, i), verbose, true);
    /* Sockets and ready files must be gone after a clean exit. */
    const e2e_proc_t *all[E2E_MAX_ROUTERS + 2 * E2E_MAX_DAEMONS];
    int n = 0;
    for (int i = 0; i < n_routers(d); i++)
        all[n++] = e2e_router(d, i);
    for (int i = 0; i < d->n_prefill; i++)
        all[n++] = &d->prefill[i];
    for (int i = 0; i < d->n_decode; i++)
        all[n++] = &d->decode[i];
    for (int i = 0; i < n; i++) {
        struct stat sb;
        if (all[i]->status == 0 && stat(all[i]->sock, &sb) == 0) {
            fprintf(stderr, "e2e: %s left its admin socket %s behind\n", all[i]->id, all[i]->sock);
            bad++;
        }
    }
    /* Sanitizer reports in any log fail the deployment (UBSan does not abort). */
    for (int i = 0; i < n; i++) {
        FILE *f = fopen(all[i]->log, "r");
        char line[1024];
        while (f && fgets(line, sizeof(line), f))
            if (strstr(line, "runtime error:") || strstr(line, "AddressSanitizer") ||
                strstr(line, "LeakSanitizer") || strstr(line, "ThreadSanitizer")) {
                fprintf(stderr, "e2e: sanitizer report in %s: %s", all[i]->log, line);
                bad++;
                break;
            }
        if (f)
            fclose(f);
    }
    if (getenv("E2E_KEEP") == NULL && bad == 0) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "e2e: could not remove %s\n", d->dir);
    } else {
        fprintf(stderr, "e2e: logs kept in %s\n", d->dir);
    }
    return bad;
}

/* ---- admin ------------------------------------------------------------------ */

cJSON *e2e_admin(const char *sock, const char *cmd)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return NULL;
    struct sockaddr_un a;
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return NULL;
    }
    char line[512];
    int n = snprintf(line, sizeof(line), "%s\n", cmd);
    if (write(fd, line, (size_t)n) != n) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    double end = e2e_now() + 5.0;
    while (buf) {
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                break;
            buf = nb;
            cap *= 2;
        }
        struct pollfd pfd = { fd, POLLIN, 0 };
        int pr = poll(&pfd, 1, 200);
        if (pr == 0) {
            if (e2e_now() > end)
                break;
            continue;
        }
        ssize_t r = read(fd, buf + len, cap - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        if (buf[len - 1] == '\n')
            break;
    }
    close(fd);
    if (!buf)
        return NULL;
    buf[len] = '\0';
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    return j;
}

double e2e_router_stat(const e2e_proc_t *router, const char *path)
{
    cJSON *j = e2e_admin(router->sock, "stats");
    double v = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "stats")) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "table");
        if (cJSON_IsString(t) && strcmp(t->valuestring, "router") == 0)
            v = e2e_jnum(cJSON_GetObjectItemCaseSensitive(e, "values"), path);
    }
    cJSON_Delete(j);
    return v;
}

double e2e_jnum(const cJSON *o, const char *path)
{
    char key[128];
    const char *p = path;
    const cJSON *x = o;
    while (x != NULL && *p) {
        const char *dot = strchr(p, '.');
        size_t l = dot ? (size_t)(dot - p) : strlen(p);
        if (l >= sizeof(key))
            return -1;
        memcpy(key, p, l);
        key[l] = '\0';
        x = cJSON_GetObjectItemCaseSensitive(x, key);
        p += l + (dot ? 1 : 0);
    }
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

bool e2e_wait_kv_free(const e2e_proc_t *p, double timeout_s)
{
    double end = e2e_now() + timeout_s;
    for (;;) {
        cJSON *j = e2e_admin(p->sock, "kv");
        double fr = e2e_jnum(j, "free"), tot = e2e_jnum(j, "blocks_total");
        cJSON_Delete(j);
        if (tot > 0 && fr == tot)
            return true;
        if (e2e_now() > end) {
            fprintf(stderr, "e2e: %s kv free %.0f of %.0f after %.1f s\n", p->id, fr, tot,
                    timeout_s);
            return false;
        }
        e2e_nap_ms(20);
    }
}

static const cJSON *router_values(const cJSON *stats)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(stats, "stats");
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "table");
        if (cJSON_IsString(t) && strcmp(t->valuestring, "router") == 0)
            return cJSON_GetObjectItemCaseSensitive(e, "values");
    }
    return NULL;
}

bool e2e_ledger_ok(const e2e_proc_t *p, double timeout_s, char *why, size_t why_len)
{
    double end = e2e_now() + timeout_s;
    for (;;) {
        double acc, com, fail, can, live;
        if (p->role == E2E_ROUTER) {
            cJSON *j = e2e_admin(p->sock, "stats");
            const cJSON *v = router_values(j);
            acc = e2e_jnum(v, "requests_accepted");
            com = e2e_jnum(v, "requests_completed");
            fail = e2e_jnum(v, "requests_failed");
            can = e2e_jnum(v, "requests_canceled");
            live = e2e_jnum(v, "requests_inflight");
            cJSON_Delete(j);
        } else {
            cJSON *j = e2e_admin(p->sock, "requests");
            acc = e2e_jnum(j, "counters.accepted");
            com = e2e_jnum(j, "counters.completed");
            fail = e2e_jnum(j, "counters.failed");
            can = e2e_jnum(j, "counters.canceled");
            live = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "requests"));
            if (j == NULL)
                live = -1;
            cJSON_Delete(j);
        }
        if (acc >= 0 && live == 0 && acc == com + fail + can)
            return true;
        if (e2e_now() > end) {
            snprintf(why, why_len, "%s ledger: accepted %.0f completed %.0f failed %.0f "
                     "canceled %.0f live %.0f", p->id, acc, com, fail, can, live);
            return false;
        }
        e2e_nap_ms(20);
    }
}

bool e2e_quiescent(e2e_deploy_t *d, double timeout_s, char *why, size_t why_len)
{
    e2e_proc_t *all[E2E_MAX_ROUTERS + 2 * E2E_MAX_DAEMONS];
    int n = 0;
    for (int i = 0; i < d->n_prefill; i++)
        all[n++] = &d->prefill[i];
    for (int i = 0; i < d->n_decode; i++)
        all[n++] = &d->decode[i];
    for (int i = 0; i < n_routers(d); i++)
        all[n++] = e2e_router(d, i);
    for (int i = 0; i < n; i++) {
        e2e_proc_t *p = all[i];
        if (p->pid == 0 && p->stopped && (p->status == 0 || p->status == 128 + SIGKILL))
            continue;   /* stopped or killed on purpose by the test */
        if (!e2e_proc_alive(p)) {
            snprintf(why, why_len, "%s died (status %d)", p->id, p->status);
            e2e_proc_dump_log(p, 40);
            return false;
        }
        if (p->role != E2E_ROUTER && !e2e_wait_kv_free(p, timeout_s)) {
            snprintf(why, why_len, "%s: KV pool not fully free", p->id);
            return false;
        }
        if (!e2e_ledger_ok(p, timeout_s, why, why_len))
            return false;
    }
    return true;
}

/* ---- HTTP ------------------------------------------------------------------- */

int e2e_http_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
                              .sin_addr.s_addr = htonl(0x7f000001) };
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int e2e_http_send(int fd, const char *method, const char *path, const char *extra_headers,
                  const char *body, size_t body_len)
{
    pd_httpc_req_t req = { .method = method, .host = "127.0.0.1", .path = path,
                           .headers = extra_headers, .body = body, .body_len = body_len };
    return pd_httpc_send(fd, &req, pd_now_ns() + 30 * PD_NS_PER_S) == PD_OK ? 0 : -1;
}

int e2e_http_read(int fd, char **buf, size_t *len, const char *needle, double timeout_s)
{
    double end = e2e_now() + timeout_s;
    size_t cap = *buf ? *len + 1 : 0;
    for (;;) {
        if (needle && *buf && memmem(*buf, *len, needle, strlen(needle)) != NULL)
            return 1;
        double left = end - e2e_now();
        if (left <= 0)
            return 0;
        struct pollfd pfd = { fd, POLLIN, 0 };
        int pr = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue;
        if (cap < *len + 65537) {
            size_t nc = (*len + 65537) * 2;
            char *nb = realloc(*buf, nc);
            if (!nb)
                return -1;
            *buf = nb;
            cap = nc;
        }
        ssize_t r = read(fd, *buf + *len, 65536);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (*buf == NULL) {
                *buf = strdup("");
                *len = 0;
            }
            return r == 0 ? 1 : -1;
        }
        *len += (size_t)r;
        (*buf)[*len] = '\0';
    }
}

int e2e_count_data(const char *buf)
{
    int n = 0;
    for (const char *p = buf; p && (p = strstr(p, "data: ")) != NULL; p += 6)
        n++;
    return n;
}

int e2e_wait_chunks(int fd, char **buf, size_t *len, int n, double timeout_s)
{
    double end = e2e_now() + timeout_s;
    while (e2e_count_data(*buf) < n && e2e_now() < end)
        if (e2e_http_read(fd, buf, len, NULL, 0.05) != 0)
            break;   /* EOF or error */
    return e2e_count_data(*buf);
}

int e2e_stream_open(uint16_t port, const char *path, const char *extra_headers,
                    const char *body, int n, double timeout_s, char **buf, size_t *len,
                    int *got)
{
    *buf = NULL;
    *len = 0;
    *got = 0;
    int fd = e2e_http_connect(port);
    if (fd < 0)
        return -1;
    if (e2e_http_send(fd, "POST", path, extra_headers, body, strlen(body)) != 0) {
        close(fd);
        return -1;
    }
    *got = e2e_wait_chunks(fd, buf, len, n, timeout_s);
    return fd;
}

/* Responses the tests read may be long streams. */
#define E2E_BODY_MAX (256ULL << 20)

static void resp_from_reply(e2e_resp_t *r, pd_httpc_reply_t *rep)
{
    r->status = rep->status;
    r->head = rep->head;
    r->body = rep->body;
    r->body_len = rep->body_len;
    rep->head = rep->body = NULL;
}

void e2e_http_parse(const char *raw, size_t len, e2e_resp_t *r)
{
    pd_httpc_reply_t rep;
    int timed_out = r->timed_out;
    memset(r, 0, sizeof(*r));
    r->timed_out = timed_out;
    (void)pd_httpc_parse(raw, len, E2E_BODY_MAX, &rep);   /* as far as it goes */
    resp_from_reply(r, &rep);
    pd_httpc_reply_free(&rep);
}

int e2e_http(uint16_t port, const char *method, const char *path, const char *extra_headers,
             const char *body, double timeout_s, e2e_resp_t *r)
{
    char addr[32];
    pd_httpc_req_t req = { .method = method, .host = "127.0.0.1", .path = path,
                           .headers = extra_headers, .body = body,
                           .body_len = body ? strlen(body) : 0 };
    pd_httpc_reply_t rep;
    memset(r, 0, sizeof(*r));
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
    pd_status_t st = pd_httpc_fetch(addr, &req, (uint64_t)(timeout_s * 1e9), E2E_BODY_MAX, &rep);
    r->timed_out = st == PD_ERR_TIMED_OUT;
    if (rep.head == NULL)               /* no connection */
        e2e_http_parse(NULL, 0, r);
    else
        resp_from_reply(r, &rep);
    pd_httpc_reply_free(&rep);
    /* a response the server ended by closing counts as an answer */
    return st == PD_OK || (st == PD_ERR_IO && r->status > 0) ? 0 : -1;
}

void e2e_resp_free(e2e_resp_t *r)
{
    free(r->head);
    free(r->body);
    r->head = r->body = NULL;
}

const char *e2e_header(const e2e_resp_t *r, const char *name, char *out, size_t cap)
{
    char pat[128];
    snprintf(pat, sizeof(pat), "\r\n%s:", name);
    const char *h = r->head ? strcasestr(r->head, pat) : NULL;
    if (h == NULL)
        return NULL;
    h += strlen(pat);
    while (*h == ' ')
        h++;
    size_t l = strcspn(h, "\r\n");
    if (l >= cap)
        l = cap - 1;
    memcpy(out, h, l);
    out[l] = '\0';
    return out;
}

/* ---- SSE -------------------------------------------------------------------- */

typedef struct {
    e2e_sse_t *s;
    size_t tlen, tcap;
    bool cut;                           /* a byte 0 was streamed: the text ends there */
} sse_acc_t;

static void sse_event(void *arg, const char *data, size_t len)
{
    sse_acc_t *a = arg;
    e2e_sse_t *s = a->s;
    (void)len;
    if (s->bad)
        return;
    if (s->done) {
        s->bad = true;                  /* anything after [DONE] */
        return;
    }
    if (strcmp(data, "[DONE]") == 0) {
        s->done = true;
        return;
    }
    cJSON *j = cJSON_Parse(data);
    const bool has_nul = strstr(data, "\\u0000") != NULL;
    if (j == NULL) {
        s->bad = true;
        return;
    }
    if (cJSON_HasObjectItem(j, "error"))
        s->error_frame = true;
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    if (c0 != NULL) {
        cJSON *t = cJSON_GetObjectItem(c0, "text");
        cJSON *dl = cJSON_GetObjectItem(c0, "delta");
        if (dl != NULL)
            t = cJSON_GetObjectItem(dl, "content");
        if (cJSON_IsString(t) && !a->cut) {
            a->cut = has_nul;
            size_t l = strlen(t->valuestring);
            if (a->tlen + l + 1 > a->tcap) {
                a->tcap = (a->tlen + l + 1) * 2;
                s->text = realloc(s->text, a->tcap);
            }
            memcpy(s->text + a->tlen, t->valuestring, l + 1);
            a->tlen += l;
        }
        cJSON *f = cJSON_GetObjectItem(c0, "finish_reason");
        if (cJSON_IsString(f))
            s->finish = f->valuestring;
    }
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    if (cJSON_IsObject(u)) {
        s->usage_completion = (int)e2e_jnum(u, "completion_tokens");
        s->usage_prompt = (int)e2e_jnum(u, "prompt_tokens");
    }
    if (s->n < (int)(sizeof(s->chunks) / sizeof(s->chunks[0])))
        s->chunks[s->n++] = j;
    else
        cJSON_Delete(j);   /* finish points into chunks: keep the last ones? rare */
}

void e2e_sse_parse(const char *body, e2e_sse_t *s)
{
    memset(s, 0, sizeof(*s));
    s->usage_completion = s->usage_prompt = -1;
    sse_acc_t a = { .s = s, .tcap = 256 };
    s->text = calloc(1, a.tcap);
    pd_sse_t sse;
    pd_sse_init(&sse);
    if (body != NULL && pd_sse_feed(&sse, body, strlen(body), sse_event, &a) != PD_OK)
        s->bad = true;
    if (pd_sse_pending(&sse))
        s->bad = true;                  /* truncated frame */
    pd_sse_fini(&sse);
}

void e2e_sse_free(e2e_sse_t *s)
{
    for (int i = 0; i < s->n; i++)
        cJSON_Delete(s->chunks[i]);
    free(s->text);
    s->n = 0;
    s->text = NULL;
}
