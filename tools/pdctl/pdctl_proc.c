/* pdctl_proc.c - daemon processes: `up` (in named steps), `down`, `scale`;
 * starting a daemon (config, log, exec, ready file, registration), stopping
 * many, and the deployment's own etcd.
 *
 * Daemons run in their own session (setsid) and outlive pdctl; they get the
 * environment of pdctl minus PD_* (the config file is authoritative) plus
 * the [env] section. The run dir's files: pdctl_state.c. */
#include "pdctl.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pd_config.h"
#include "pd_memledger.h"
#include "pd_sbuf.h"
#include "pdctl_plan.h"

extern char **environ;

static void pdctl_tail_log(const char *path, int lines)
{
    size_t len = 0;
    char *s = pdctl_read_file(path, &len);
    if (s == NULL) {
        fprintf(stderr, "  (no log %s)\n", path);
        return;
    }
    const char *p = s + len;
    int n = 0;
    while (p > s) {
        p--;
        if (*p == '\n' && p != s + len - 1 && ++n >= lines) {
            p++;
            break;
        }
    }
    fprintf(stderr, "--- last lines of %s:\n%s%s", path, p, len && s[len - 1] != '\n' ? "\n" : "");
    free(s);
}

/* ---- the deployment's own etcd (etcd = local) ------------------------------ */

/* Start etcd on 127.0.0.1:port (peer port + 1), data in <run>/etcd.data,
 * log <run>/etcd.log; wait for its /health. 0 or PDCTL_EXIT_FAIL. */
static int pdctl_etcd_start(pdctl_state_t *st, unsigned port, double deadline)
{
    char data[PATH_MAX], log[PATH_MAX], client[64], peer[64], init[96];
    if (!pdctl_fmt(data, sizeof(data), "%s/etcd.data", st->run_dir) ||
        !pdctl_fmt(log, sizeof(log), "%s/etcd.log", st->run_dir))
        return PDCTL_EXIT_FAIL;
    snprintf(client, sizeof(client), "http://127.0.0.1:%u", port);
    snprintf(peer, sizeof(peer), "http://127.0.0.1:%u", port + 1);
    snprintf(init, sizeof(init), "pdctl=%s", peer);
    int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0) {
        fprintf(stderr, "pdctl: cannot open %s: %s\n", log, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    /* exec barrier: the pipe closes when the child execs (or dies), so the
     * pid runs etcd by the time we look at it */
    int barrier[2];
    if (pipe2(barrier, O_CLOEXEC) != 0) {
        close(logfd);
        return PDCTL_EXIT_FAIL;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(logfd);
        close(barrier[0]);
        close(barrier[1]);
        return PDCTL_EXIT_FAIL;
    }
    if (pid == 0) {
        close(barrier[0]);
        setsid();
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0)
            dup2(null, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        execlp("etcd", "etcd", "--name", "pdctl", "--data-dir", data, "--listen-client-urls",
               client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
               "--initial-advertise-peer-urls", peer, "--initial-cluster", init, (char *)NULL);
        dprintf(2, "pdctl: exec etcd: %s (Debian: apt-get install etcd-server)\n", strerror(errno));
        _exit(127);
    }
    close(logfd);
    close(barrier[1]);
    char c;
    while (read(barrier[0], &c, 1) < 0 && errno == EINTR)
        ;
    close(barrier[0]);
    st->etcd_pid = pid;
    snprintf(st->etcd_url, sizeof(st->etcd_url), "%s", client);
    char err[256] = "";
    while (pdctl_http_status(client, "/health", 1.0, err, sizeof(err)) != 200) {
        if (!pdctl_pid_runs(pid, "etcd")) {
            fprintf(stderr, "pdctl: etcd exited during start-up (log %s)\n", log);
            pdctl_tail_log(log, 12);
            st->etcd_pid = 0;
            return PDCTL_EXIT_FAIL;
        }
        if (pdctl_now() > deadline) {
            fprintf(stderr, "pdctl: etcd on %s not healthy in time%s%s\n", client,
                    err[0] ? ": " : "", err);
            pdctl_tail_log(log, 12);
            return PDCTL_EXIT_FAIL;
        }
        pdctl_nap_ms(50);
    }
    return 0;
}

/* SIGTERM the deployment's etcd, SIGKILL after timeout_s. */
static void pdctl_etcd_stop(pdctl_state_t *st, double timeout_s)
{
    if (st->etcd_pid <= 0)
        return;
    if (pdctl_etcd_alive(st)) {
        kill(st->etcd_pid, SIGTERM);
        double end = pdctl_now() + timeout_s;
        while (pdctl_etcd_alive(st) && pdctl_now() < end)
            pdctl_nap_ms(20);
        if (pdctl_etcd_alive(st)) {
            kill(st->etcd_pid, SIGKILL);
            while (pdctl_etcd_alive(st))
                pdctl_nap_ms(20);
        }
    }
    st->etcd_pid = 0;
}

/* ---- starting daemons --------------------------------------------------------- */

/* A new deployment secret: 32 random bytes as 64 hex digits + NUL. */
int pdctl_secret_hex(char hex[65])
{
    unsigned char raw[32];
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
        fprintf(stderr, "pdctl: getrandom: %s\n", strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    explicit_bzero(raw, sizeof(raw));
    return 0;
}

static int pdctl_secret_ensure(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (sb.st_size < 32) {
            fprintf(stderr, "pdctl: secret file %s is shorter than 32 bytes\n", path);
            return PDCTL_EXIT_FAIL;
        }
        if ((sb.st_mode & 077) != 0 && sb.st_uid == getuid())
            chmod(path, 0600);
        return 0;
    }
    char hex[65];
    if (pdctl_secret_hex(hex) != 0)
        return PDCTL_EXIT_FAIL;
    if (pdctl_write_file(path, hex, 0600) != 0) {
        fprintf(stderr, "pdctl: cannot write secret %s: %s\n", path, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    return 0;
}

/* host:port -> bind test. 0: free (or port 0), else prints and returns 1. */
static int pdctl_port_check(const char *what, const char *addr)
{
    char host[128];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL) {
        fprintf(stderr, "pdctl: [router] %s = %s: expected host:port\n", what, addr);
        return PDCTL_EXIT_USAGE;
    }
    snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
    int port = atoi(colon + 1);
    if (port == 0)
        return 0;
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return 0;  /* names / IPv6: the router reports its own bind errors */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    int e = errno;
    close(fd);
    if (rc != 0 && e == EADDRINUSE) {
        fprintf(stderr, "pdctl: port in use: %s %s (another deployment? use port 0 for any free port)\n",
                what, addr);
        return PDCTL_EXIT_FAIL;
    }
    return 0;
}

static void pdctl_daemon_paths(pdctl_daemon_t *x, const char *run_dir)
{
    pdctl_fmt(x->sock, sizeof(x->sock), "%s/%s.sock", run_dir, x->name);
    pdctl_fmt(x->log, sizeof(x->log), "%s/%s.log", run_dir, x->name);
    pdctl_fmt(x->cfg, sizeof(x->cfg), "%s/%s.ini", run_dir, x->name);
    pdctl_fmt(x->ready, sizeof(x->ready), "%s/%s.ready", run_dir, x->name);
}

/* An EP group's rank name decode-<group>.r<rank> (pdctl_start_role). */
bool pdctl_ep_rank_of(const char *name, unsigned *group_p, unsigned *rank_p)
{
    unsigned g, r;
    int end = 0;
    if (sscanf(name, "decode-%u.r%u%n", &g, &r, &end) != 2 || name[end] != '\0')
        return false;
    *group_p = g;
    *rank_p = r;
    return true;
}

unsigned pdctl_dep_decode_procs(const pdctl_dep_t *dep)
{
    unsigned n = dep->count[PDCTL_DECODE], whole = dep->whole < n ? dep->whole : n;
    return (n - whole) * dep->ep + whole;
}

/* <run_dir>/ep-decode-<group>: the group's rendezvous directory. */
static void pdctl_ep_dir(const pdctl_state_t *st, unsigned group, char *buf, size_t cap)
{
    pdctl_fmt(buf, cap, "%s/ep-decode-%u", st->run_dir, group);
}

/* Create the group's ep-dir, or empty an old one (a rank must not read a
 * metadata file of an earlier incarnation). 0 or PDCTL_EXIT_FAIL. */
static int pdctl_ep_dir_fresh(const pdctl_state_t *st, unsigned group)
{
    char dir[PATH_MAX];
    pdctl_ep_dir(st, group, dir, sizeof(dir));
    if (pdctl_mkdir_p(dir) != 0) {
        fprintf(stderr, "pdctl: cannot create %s: %s\n", dir, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    DIR *dh = opendir(dir);
    if (dh == NULL) {
        fprintf(stderr, "pdctl: %s: %s\n", dir, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    for (struct dirent *e; (e = readdir(dh)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char f[PATH_MAX];
        if (pdctl_fmt(f, sizeof(f), "%s/%s", dir, e->d_name))
            unlink(f);
    }
    closedir(dh);
    return 0;
}

static int pdctl_spawn(const pdctl_dep_t *dep, pdctl_state_t *st, pdctl_daemon_t *x)
{
    pdctl_daemon_paths(x, st->run_dir);
    unlink(x->ready);
    char *cfg = pdctl_dep_render(dep, x->role, x->name,
                                 x->role == PDCTL_ROUTER ? NULL : st->control, x->sock, x->ready,
                                 NULL, "127.0.0.1:0");
    unsigned group, rank;
    if (cfg != NULL && x->role == PDCTL_DECODE && pdctl_ep_rank_of(x->name, &group, &rank)) {
        char dir[PATH_MAX];
        pdctl_ep_dir(st, group, dir, sizeof(dir));
        pd_sbuf_t sb = { 0 };
        pd_sbuf_printf(&sb, "%s# EP group decode-%u (issue 36)\nep-size = %u\nep-rank = %u\n"
                       "ep-dir = %s\n", cfg, group, dep->ep, rank, dir);
        free(cfg);
        cfg = pd_sbuf_finish(&sb, NULL);
    }
    if (cfg == NULL || pdctl_write_file(x->cfg, cfg, 0600) != 0) {
        fprintf(stderr, "pdctl: cannot write %s: %s\n", x->cfg, strerror(errno));
        free(cfg);
        return PDCTL_EXIT_FAIL;
    }
    free(cfg);
    int logfd = open(x->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0) {
        fprintf(stderr, "pdctl: cannot open %s: %s\n", x->log, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    const char *bin = dep->bins[x->role];
    const char *ns = pdctl_kvs_get(&dep->netns, x->name);
    if (ns == NULL && x->role == PDCTL_DECODE && pdctl_ep_rank_of(x->name, &group, &rank)) {
        char gname[32]; /* a rank without its own line: its group's namespace */
        snprintf(gname, sizeof(gname), "decode-%u", group);
        ns = pdctl_kvs_get(&dep->netns, gname);
    }
    char stamp[64];
    time_t now = time(NULL);
    strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    dprintf(logfd, "### %s pdctl: %s%s%s --config %s\n", stamp, ns ? "ip netns exec " : "",
            ns ? ns : "", bin, x->cfg);
    /* exec barrier: the pipe closes when the child execs (or dies), so the
     * pid runs the daemon's binary by the time we return */
    int barrier[2];
    if (pipe2(barrier, O_CLOEXEC) != 0) {
        fprintf(stderr, "pdctl: pipe: %s\n", strerror(errno));
        close(logfd);
        return PDCTL_EXIT_FAIL;
    }
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "pdctl: fork: %s\n", strerror(errno));
        close(logfd);
        close(barrier[0]);
        close(barrier[1]);
        return PDCTL_EXIT_FAIL;
    }
    if (pid == 0) {
        close(barrier[0]);
        setsid();
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0)
            dup2(null, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        /* the config file is authoritative: no PD_* from our environment */
        for (char **e = environ; e != NULL && *e != NULL;) {
            if (strncmp(*e, "PD_", 3) == 0) {
                char name[256];
                snprintf(name, sizeof(name), "%.*s", (int)(strchr(*e, '=') - *e), *e);
                unsetenv(name);
                e = environ;
                continue;
            }
            e++;
        }
        for (size_t i = 0; i < dep->env.n; i++)
            setenv(dep->env.v[i].key, dep->env.v[i].val, 1);
        if (ns != NULL)
            execlp("ip", "ip", "netns", "exec", ns, bin, "--config", x->cfg, (char *)NULL);
        else
            execl(bin, bin, "--config", x->cfg, (char *)NULL);
        dprintf(2, "pdctl: exec %s: %s\n", ns ? "ip" : bin, strerror(errno));
        _exit(127);
    }
    close(logfd);
    close(barrier[1]);
    char c;
    while (read(barrier[0], &c, 1) < 0 && errno == EINTR)
        ;
    close(barrier[0]);
    x->pid = pid;
    x->started_unix = (int64_t)time(NULL);
    char pidf[PATH_MAX], txt[32];
    snprintf(pidf, sizeof(pidf), "%s/%s.pid", st->run_dir, x->name);
    snprintf(txt, sizeof(txt), "%d\n", (int)pid);
    pdctl_write_file(pidf, txt, 0644);
    return 0;
}

/* Poll x's ready file; false (log tail printed) if it exits or the deadline passes. */
static bool pdctl_wait_ready_file(const pdctl_daemon_t *x, double deadline)
{
    struct stat sb;
    while (stat(x->ready, &sb) != 0 || sb.st_size == 0) {
        if (!pdctl_daemon_alive(x)) {
            fprintf(stderr, "pdctl: %s (pid %d) exited during start-up\n", x->name, (int)x->pid);
            pdctl_tail_log(x->log, 12);
            return false;
        }
        if (pdctl_now() > deadline) {
            fprintf(stderr, "pdctl: %s not ready in time (no %s)\n", x->name, x->ready);
            pdctl_tail_log(x->log, 12);
            return false;
        }
        pdctl_nap_ms(20);
    }
    return true;
}

static const pdctl_daemon_t *pdctl_router(const pdctl_state_t *st)
{
    for (int i = 0; i < st->n; i++)
        if (st->d[i].role == PDCTL_ROUTER)
            return &st->d[i];
    return NULL;
}

/* Every daemon named in `names` is in every router's `backends` as ready. */
static bool pdctl_wait_registered(const pdctl_state_t *st, const pdctl_daemon_t *const *xs, int n,
                                  double deadline)
{
    char err[256] = "";
    for (;;) {
        int found = 0, want = 0;
        const pdctl_daemon_t *late = NULL;
        for (int k = 0; k < st->n; k++) {
            const pdctl_daemon_t *r = &st->d[k];
            if (r->role != PDCTL_ROUTER)
                continue;
            want += n;
            cJSON *b = pdctl_admin(r->sock, "backends", 2.0, err, sizeof(err));
            const cJSON *arr = cJSON_GetObjectItemCaseSensitive(b, "backends");
            int here = 0;
            for (int i = 0; i < n; i++) {
                const cJSON *o;
                cJSON_ArrayForEach(o, arr) {
                    const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "id"));
                    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "state"));
                    if (id && s && strcmp(id, xs[i]->name) == 0 && strcmp(s, "ready") == 0) {
                        here++;
                        break;
                    }
                }
            }
            if (here < n && late == NULL)
                late = r;
            found += here;
            cJSON_Delete(b);
        }
        if (want > 0 && found == want)
            return true;
        for (int i = 0; i < n; i++) {
            if (!pdctl_daemon_alive(xs[i])) {
                fprintf(stderr, "pdctl: %s exited before it registered\n", xs[i]->name);
                pdctl_tail_log(xs[i]->log, 12);
                return false;
            }
        }
        if (pdctl_now() > deadline) {
            fprintf(stderr, "pdctl: not every daemon registered with %s in time%s%s\n",
                    late ? late->name : "the router", err[0] ? ": " : "", err);
            if (late != NULL)
                pdctl_tail_log(late->log, 12);
            return false;
        }
        pdctl_nap_ms(50);
    }
}

/* SIGTERM (or the admin `drain` when via_drain) and wait; SIGKILL after timeout. */
static void pdctl_stop_many(pdctl_daemon_t *const *xs, int n, bool via_drain, double timeout_s)
{
    char err[256];
    for (int i = 0; i < n; i++) {
        if (!pdctl_daemon_alive(xs[i]))
            continue;
        bool sent = false;
        if (via_drain) {
            cJSON *r = pdctl_admin(xs[i]->sock, "drain", 2.0, err, sizeof(err));
            sent = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "ok"));
            cJSON_Delete(r);
        }
        if (!sent)
            kill(xs[i]->pid, SIGTERM);
    }
    double deadline = pdctl_now() + timeout_s;
    for (;;) {
        int alive = 0;
        for (int i = 0; i < n; i++)
            alive += pdctl_daemon_alive(xs[i]);
        if (alive == 0)
            break;
        if (pdctl_now() > deadline) {
            for (int i = 0; i < n; i++) {
                if (pdctl_daemon_alive(xs[i])) {
                    fprintf(stderr, "pdctl: %s (pid %d) did not stop in %.0f s: SIGKILL\n",
                            xs[i]->name, (int)xs[i]->pid, timeout_s);
                    kill(xs[i]->pid, SIGKILL);
                }
            }
            deadline = pdctl_now() + 5;
            timeout_s = 5;
            continue;
        }
        pdctl_nap_ms(20);
    }
    for (int i = 0; i < n; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "%s", xs[i]->cfg);   /* <run>/<name>.ini -> .pid */
        char *dot = strrchr(p, '.');
        if (dot != NULL && strcmp(dot, ".ini") == 0) {
            strcpy(dot, ".pid");
            unlink(p);
        }
        unlink(xs[i]->ready);
        xs[i]->pid = 0;
    }
}

static void pdctl_stop_all(pdctl_state_t *st, double timeout_s)
{
    pdctl_daemon_t *xs[PDCTL_MAX_DAEMONS];
    int n = 0;
    /* router first: it stops taking HTTP and finishes its streams while the
     * daemons still serve them; then the (idle) daemons */
    for (int i = 0; i < st->n; i++)
        if (st->d[i].role == PDCTL_ROUTER)
            xs[n++] = &st->d[i];
    pdctl_stop_many(xs, n, false, timeout_s);
    n = 0;
    for (int i = 0; i < st->n; i++)
        if (st->d[i].role != PDCTL_ROUTER)
            xs[n++] = &st->d[i];
    pdctl_stop_many(xs, n, false, timeout_s);
    pdctl_etcd_stop(st, 10);   /* last: the daemons revoke their keys on the way out */
}

/* ---- up ------------------------------------------------------------------------- */

static int pdctl_copy_file(const char *from, const char *to)
{
    char *text = pdctl_read_file(from, NULL);
    if (text == NULL)
        return -1;
    int rc = pdctl_write_file(to, text, 0600);
    free(text);
    return rc;
}

static int pdctl_ready_port(const char *ready, const char *key)
{
    char *t = pdctl_read_file(ready, NULL);
    cJSON *j = t ? cJSON_Parse(t) : NULL;
    free(t);
    double v = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, key));
    cJSON_Delete(j);
    return v == v && v > 0 && v < 65536 ? (int)v : -1;
}

/* Start the daemons of `role` until it has `want`; appends to st. */
static int pdctl_start_role(const pdctl_dep_t *dep, pdctl_state_t *st, pdctl_role_t role,
                            unsigned want, pdctl_daemon_t **started, int *n_started)
{
    unsigned have = 0, g, rk;
    for (int i = 0; i < st->n; i++) /* instances: an EP group counts once (rank 0) */
        have += st->d[i].role == role &&
                (role != PDCTL_DECODE || !pdctl_ep_rank_of(st->d[i].name, &g, &rk) || rk == 0);
    /* decode: instances 0..count-whole-1 are EP groups of ep ranks, the
     * last `whole` hold the whole model (one process each) */
    unsigned groups = role == PDCTL_DECODE && dep->ep > 1
                          ? dep->count[PDCTL_DECODE] - (dep->whole < dep->count[PDCTL_DECODE]
                                                            ? dep->whole : dep->count[PDCTL_DECODE])
                          : 0;
    for (unsigned idx = 0; have < want && idx < 1000; idx++) {
        unsigned ranks = idx < groups ? dep->ep : 1;
        char name[48];
        if (role == PDCTL_ROUTER)
            pdctl_router_name(idx, name, sizeof(name));
        else if (ranks > 1) /* EP group decode-<idx>: ranks decode-<idx>.r<k> */
            snprintf(name, sizeof(name), "%s-%u.r0", pdctl_role_name(role), idx);
        else
            snprintf(name, sizeof(name), "%s-%u", pdctl_role_name(role), idx);
        if (pdctl_state_find(st, name) != NULL)
            continue;
        if (ranks > 1 && pdctl_ep_dir_fresh(st, idx) != 0)
            return PDCTL_EXIT_FAIL;
        for (unsigned k = 0; k < ranks; k++) {
            if (st->n == PDCTL_MAX_DAEMONS)
                return PDCTL_EXIT_FAIL;
            pdctl_daemon_t *x = &st->d[st->n];
            memset(x, 0, sizeof(*x));
            if (ranks > 1)
                snprintf(x->name, sizeof(x->name), "%s-%u.r%u", pdctl_role_name(role), idx, k);
            else
                snprintf(x->name, sizeof(x->name), "%s", name);
            x->role = role;
            int rc = pdctl_spawn(dep, st, x);
            if (rc != 0)
                return rc;
            st->n++;
            started[(*n_started)++] = x;
        }
        have++;
    }
    return 0;
}

static bool pdctl_wait_started(const pdctl_dep_t *dep, pdctl_state_t *st,
                               pdctl_daemon_t *const *xs, int n)
{
    double deadline = pdctl_now() + (double)dep->ready_timeout_ns / 1e9;
    for (int i = 0; i < n; i++)
        if (!pdctl_wait_ready_file(xs[i], deadline))
            return false;
    return pdctl_wait_registered(st, (const pdctl_daemon_t *const *)xs, n, deadline);
}

static volatile sig_atomic_t pdctl_fg_signal;

static void pdctl_fg_handler(int sig)
{
    pdctl_fg_signal = sig;
}

/* --foreground: stay until SIGINT/SIGTERM (then stop everything, exit 0) or
 * until a daemon exits (then stop the rest, exit 1) - what `make run` does. */
static int pdctl_foreground(pdctl_state_t *st, double stop_timeout_s)
{
    struct sigaction sa = { .sa_handler = pdctl_fg_handler };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    printf("  foreground: Ctrl-C stops the deployment\n");
    fflush(stdout);
    int rc = 0;
    char lock_path[PATH_MAX];
    pdctl_fmt(lock_path, sizeof(lock_path), "%s/pdctl.lock", st->run_dir);
    while (pdctl_fg_signal == 0) {
        /* `pdctl scale` may add and remove daemons meanwhile: judge deaths
         * only against the saved state, read while nobody changes it */
        const pdctl_daemon_t *gone = NULL;
        for (int i = 0; i < st->n && gone == NULL; i++)
            if (!pdctl_daemon_alive(&st->d[i]))
                gone = &st->d[i];
        if (gone != NULL) {
            int fd = open(lock_path, O_RDWR | O_CLOEXEC);
            if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
                if (fd >= 0)
                    close(fd);
                pdctl_nap_ms(200);
                continue;
            }
            /* `pdctl down` from another terminal removed the state after
             * stopping everything: the deployment ended as asked */
            char sp[PATH_MAX];
            pdctl_state_path(st->run_dir, sp, sizeof(sp));
            if (access(sp, F_OK) != 0 && errno == ENOENT) {
                close(fd);
                printf("\npdctl: the deployment was stopped (pdctl down)\n");
                return 0;
            }
            pdctl_state_t now;
            if (pdctl_state_load(st->run_dir, &now) == 0) {
                now.lock_fd = -1;
                *st = now;
            }
            close(fd);
            gone = NULL;
            for (int i = 0; i < st->n && gone == NULL; i++)
                if (!pdctl_daemon_alive(&st->d[i]))
                    gone = &st->d[i];
        }
        if (gone != NULL) {
            fprintf(stderr, "pdctl: %s (pid %d) exited; stopping the deployment\n", gone->name,
                    (int)gone->pid);
            pdctl_tail_log(gone->log, 12);
            rc = PDCTL_EXIT_FAIL;
            break;
        }
        pdctl_nap_ms(200);
    }
    printf("\npdctl: stopping...\n");
    pdctl_planners_stop(st->run_dir, stop_timeout_s + 10);
    {   /* daemons a `pdctl scale` added meanwhile are only in the saved
         * state: reload it (after any scale in progress) and stop them all */
        int fd = open(lock_path, O_RDWR | O_CLOEXEC);
        if (fd >= 0)
            (void)flock(fd, LOCK_EX);
        pdctl_state_t now;
        if (pdctl_state_load(st->run_dir, &now) == 0) {
            now.lock_fd = -1;
            *st = now;
        }
        if (fd >= 0)
            close(fd);
    }
    pdctl_stop_all(st, stop_timeout_s);
    char p[PATH_MAX];
    pdctl_state_path(st->run_dir, p, sizeof(p));
    unlink(p);
    pdctl_fmt(p, sizeof(p), "%s/url", st->run_dir);
    unlink(p);
    printf("pdctl: stopped (logs in %s)\n", st->run_dir);
    return rc;
}

/* What `up` knows of the routers: the addresses the file gives them, then
 * the URLs they answer on. */
typedef struct {
    unsigned n;
    char addr[PDCTL_MAX_ROUTERS][2][160];   /* [i][0]: http, [i][1]: control (host:port) */
    char url[PDCTL_MAX_ROUTERS][128];       /* http://host:port, once ready */
} pdctl_up_routers_t;

/* up's command line: FILE, --set, --foreground, --run-dir (it, else
 * PD_RUN_DIR, overrides the file's run-dir). 0 or PDCTL_EXIT_USAGE. */
static int pdctl_up_args(int *argc, char **argv, char **sets, int *n_sets,
                         bool *foreground_p, const char **run_override_p)
{
    pdctl_opts_t o = { 0 };
    const char *run_override = NULL;
    for (int i = 0; i < *argc; i++)
        if (strcmp(argv[i], "--run-dir") == 0 || strncmp(argv[i], "--run-dir=", 10) == 0)
            run_override = "";  /* given explicitly */
    if (pdctl_take_sets(argc, argv, sets, n_sets) != 0)
        return PDCTL_EXIT_USAGE;
    bool foreground = false;
    int k = 0;
    for (int i = 0; i < *argc; i++) {
        if (strcmp(argv[i], "--foreground") == 0)
            foreground = true;
        else
            argv[k++] = argv[i];
    }
    *argc = k;
    pdctl_parse_opts(argc, argv, &o);
    if (run_override != NULL)
        run_override = o.run_dir;
    else if (getenv("PD_RUN_DIR") != NULL && getenv("PD_RUN_DIR")[0] != '\0')
        run_override = getenv("PD_RUN_DIR");
    if (*argc != 1) {
        fprintf(stderr, "usage: pdctl up FILE [--run-dir D] [--set section.key=value ...] [--foreground]\n");
        return PDCTL_EXIT_USAGE;
    }
    *foreground_p = foreground;
    *run_override_p = run_override;
    return 0;
}

/* ---- the host's memory budget (before anything starts) ------------------- */

/* One role's KV arena in bytes: `bin --config=<rendered> --print-arena-bytes`
 * loads the model and prints it (the geometry is the engine's to know).
 * 0 and *bytes_p; PDCTL_EXIT_FAIL (printed: no temporary file);
 * PDCTL_EXIT_USAGE, silent, when the daemon does not get that far (a bad
 * value, a missing model): `check` and the start-up show its own message. */
static int pdctl_arena_bytes(const pdctl_dep_t *dep, pdctl_role_t r, uint64_t *bytes_p)
{
    char out[64], tmp[PDCTL_TMP_NAME];
    int rc = pdctl_run_rendered(dep, r, "127.0.0.1:7000", "--print-arena-bytes", false, 1,
                                out, sizeof(out), tmp);
    if (rc < 0)
        return PDCTL_EXIT_FAIL;
    char *end;
    unsigned long long v = strtoull(out, &end, 10);
    if (rc != 0 || end == out || *end != '\n')
        return PDCTL_EXIT_USAGE; /* its config does not boot: it says why when started */
    *bytes_p = v;
    return 0;
}

int pdctl_mem_plan_check(const pdctl_dep_t *dep, const unsigned add[PDCTL_ROLE_N],
                         unsigned first[PDCTL_ROLE_N])
{
    static pd_memledger_entry_t plan[2 * PDCTL_MAX_PER_ROLE];
    unsigned np = 0;
    pd_memledger_opts_t mo = { 0 };
    for (int r = PDCTL_PREFILL; r <= PDCTL_DECODE; r++) {
        if (add[r] == 0)
            continue;
        const char *b = pdctl_kvs_get(&dep->role_kv[r], "mem.budget");
        uint64_t budget = 0;
        if (b != NULL && pd_parse_size(b, &budget) == PD_OK && budget != 0 &&
            (mo.budget == 0 || budget < mo.budget))
            mo.budget = budget;
        if (mo.path == NULL)
            mo.path = pdctl_kvs_get(&dep->role_kv[r], "mem.ledger");
        uint64_t bytes;
        int rc = pdctl_arena_bytes(dep, (pdctl_role_t)r, &bytes);
        if (rc == PDCTL_EXIT_USAGE)
            continue;   /* not this check's to report */
        if (rc != 0)
            return rc;
        unsigned procs = add[r]; /* an EP rank: its arena (scale refuses groups) */
        if (r == PDCTL_DECODE && dep->ep > 1 && add[r] == dep->count[r])
            procs = pdctl_dep_decode_procs(dep);
        for (unsigned i = 0; i < procs && np < 2 * PDCTL_MAX_PER_ROLE; i++, np++) {
            memset(&plan[np], 0, sizeof(plan[np]));
            plan[np].bytes = bytes;
            snprintf(plan[np].name, sizeof(plan[np].name), "pd-%s %s-%u",
                     pdctl_role_name((pdctl_role_t)r), pdctl_role_name((pdctl_role_t)r),
                     (first ? first[r] : 0) + i);
        }
    }
    if (np == 0)
        return 0;
    char why[2048];
    if (pd_memledger_check_plan(&mo, plan, np, why, sizeof(why)) != PD_OK) {
        fprintf(stderr, "pdctl: %s: the KV arenas do not fit this host's memory: %s; lower "
                "kv-blocks or the number of daemons (nothing was started)\n", dep->path, why);
        return PDCTL_EXIT_FAIL;
    }
    return 0;
}

/* The run dir of the new deployment: short enough for the admin sockets,
 * created, locked (st->lock_fd), no deployment still running in it, no
 * stale url file. 0 or PDCTL_EXIT_FAIL. */
static int pdctl_up_run_dir(const pdctl_dep_t *dep, pdctl_state_t *st)
{
    /* sun_path holds 107 bytes: <run>/prefill-31.sock must fit */
    if (strlen(dep->run_dir) + sizeof("/prefill-31.sock") > 108) {
        fprintf(stderr, "pdctl: run dir %s is too long for UNIX admin sockets "
                "(at most %zu characters)\n", dep->run_dir, 108 - sizeof("/prefill-31.sock"));
        return PDCTL_EXIT_FAIL;
    }
    if (pdctl_mkdir_p(dep->run_dir) != 0) {
        fprintf(stderr, "pdctl: cannot create run dir %s: %s\n", dep->run_dir, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    snprintf(st->run_dir, sizeof(st->run_dir), "%s", dep->run_dir);
    if (pdctl_state_lock(st) != 0)
        return PDCTL_EXIT_FAIL;
    pdctl_state_t old;
    char sp[PATH_MAX];
    pdctl_state_path(dep->run_dir, sp, sizeof(sp));
    if (access(sp, F_OK) == 0 && pdctl_state_load(dep->run_dir, &old) == 0) {
        if (pdctl_refuse_installed(&old, "up") != 0)
            return PDCTL_EXIT_FAIL;
        for (int i = 0; i < old.n; i++) {
            if (pdctl_daemon_alive(&old.d[i])) {
                fprintf(stderr, "pdctl: a deployment is already running in %s (%s, pid %d); "
                        "`pdctl down --run-dir %s` first\n", dep->run_dir, old.d[i].name,
                        (int)old.d[i].pid, dep->run_dir);
                return PDCTL_EXIT_FAIL;
            }
        }
    }
    char urlf[PATH_MAX];
    pdctl_fmt(urlf, sizeof(urlf), "%s/url", dep->run_dir);
    unlink(urlf);   /* written again once ready: pollers wait for it */
    return 0;
}

/* Router i's http and control addresses (the file's, ports + i), each
 * checked free. 0, PDCTL_EXIT_USAGE (no room for the ports) or
 * pdctl_port_check's code. */
static int pdctl_up_router_addrs(const pdctl_dep_t *dep, pdctl_up_routers_t *rt)
{
    int rc;
    for (unsigned i = 0; i < rt->n; i++) {
        if (!pdctl_router_addr(dep, i, "http", rt->addr[i][0], sizeof(rt->addr[i][0])) ||
            !pdctl_router_addr(dep, i, "control", rt->addr[i][1], sizeof(rt->addr[i][1]))) {
            fprintf(stderr, "pdctl: [router] http / control: expected host:port with room for "
                    "%u routers (ports + 0..%u)\n", rt->n, rt->n - 1);
            return PDCTL_EXIT_USAGE;
        }
        if ((rc = pdctl_port_check("http", rt->addr[i][0])) != 0 ||
            (rc = pdctl_port_check("control", rt->addr[i][1])) != 0)
            return rc;
    }
    return 0;
}

/* A router on every interface without an api-key: say so (not an error). */
static void pdctl_up_warn_open(const pdctl_dep_t *dep)
{
    const char *http = pdctl_kvs_get(&dep->role_kv[PDCTL_ROUTER], "http");
    if (http != NULL && (strncmp(http, "0.0.0.0:", 8) == 0 || strncmp(http, "[::]:", 5) == 0) &&
        pdctl_kvs_get(&dep->role_kv[PDCTL_ROUTER], "api-key") == NULL)
        fprintf(stderr, "pdctl: WARNING: [router] http = %s listens on every interface "
                "without an api-key: anyone who can reach it can use the model\n", http);
}

/* What `scale` re-reads later: the deployment file copied to
 * <run>/deployment.ini, and the --set list (pdctl_sets_json, saved with the
 * state). 0 or PDCTL_EXIT_FAIL. */
static int pdctl_up_snapshot(const pdctl_dep_t *dep, pdctl_state_t *st, char *const *sets,
                             int n_sets)
{
    snprintf(st->dep_file, sizeof(st->dep_file), "%s/deployment.ini", dep->run_dir);
    if (pdctl_copy_file(dep->path, st->dep_file) != 0) {
        fprintf(stderr, "pdctl: cannot copy %s to %s\n", dep->path, st->dep_file);
        return PDCTL_EXIT_FAIL;
    }
    snprintf(st->name, sizeof(st->name), "%s", dep->name);
    pdctl_sets_json = cJSON_CreateArray();
    for (int i = 0; i < n_sets; i++)
        cJSON_AddItemToArray(pdctl_sets_json, cJSON_CreateString(sets[i]));
    return 0;
}

/* The host to reach a listen address at (numeric, fits url/control): its
 * own, or 127.0.0.1 for 0.0.0.0 or no host. */
static void pdctl_reach_host(const char *addr, char *host, size_t cap)
{
    const char *colon = strrchr(addr, ':');
    if (colon != NULL && colon != addr && strncmp(addr, "0.0.0.0", 7) != 0)
        snprintf(host, cap, "%.*s", (int)(colon - addr), addr);
    else
        snprintf(host, cap, "127.0.0.1");
}

/* Start the routers, all at once, then wait for each one's ready file: the
 * ports it bound give rt->url[i] and its part of st->control; st->url is the
 * first router's. Saves the state. 0 or PDCTL_EXIT_FAIL. */
static int pdctl_up_routers(const pdctl_dep_t *dep, pdctl_state_t *st, pdctl_up_routers_t *rt,
                            double deadline)
{
    pdctl_daemon_t *started[PDCTL_MAX_DAEMONS];
    int n_started = 0;
    if (pdctl_start_role(dep, st, PDCTL_ROUTER, rt->n, started, &n_started) != 0)
        return PDCTL_EXIT_FAIL;
    size_t coff = 0;
    for (unsigned i = 0; i < rt->n; i++) {
        const pdctl_daemon_t *x = &st->d[i];
        if (!pdctl_wait_ready_file(x, deadline))
            return PDCTL_EXIT_FAIL;
        int http_port = pdctl_ready_port(x->ready, "http");
        int control_port = pdctl_ready_port(x->ready, "control");
        if (http_port < 0 || control_port < 0) {
            fprintf(stderr, "pdctl: cannot read the ports from %s\n", x->ready);
            return PDCTL_EXIT_FAIL;
        }
        char host[96];
        pdctl_reach_host(rt->addr[i][0], host, sizeof(host));
        snprintf(rt->url[i], sizeof(rt->url[i]), "http://%s:%d", host, http_port);
        pdctl_reach_host(rt->addr[i][1], host, sizeof(host));
        int w = snprintf(st->control + coff, sizeof(st->control) - coff, "%s%s:%d", i ? "," : "",
                         host, control_port);
        if (w < 0 || (size_t)w >= sizeof(st->control) - coff)
            return PDCTL_EXIT_FAIL;
        coff += (size_t)w;
    }
    snprintf(st->url, sizeof(st->url), "%s", rt->url[0]);
    return pdctl_state_save(st);
}

/* Start the prefill and decode daemons, all at once, and wait until each is
 * ready and registered with every router. 0 or PDCTL_EXIT_FAIL. */
static int pdctl_up_daemons(const pdctl_dep_t *dep, pdctl_state_t *st)
{
    pdctl_daemon_t *started[PDCTL_MAX_DAEMONS];
    int n_started = 0;
    if (pdctl_start_role(dep, st, PDCTL_PREFILL, dep->count[PDCTL_PREFILL], started, &n_started) != 0 ||
        pdctl_start_role(dep, st, PDCTL_DECODE, dep->count[PDCTL_DECODE], started, &n_started) != 0)
        return PDCTL_EXIT_FAIL;
    pdctl_state_save(st);
    if (!pdctl_wait_started(dep, st, started, n_started))
        return PDCTL_EXIT_FAIL;
    return 0;
}

/* /ready of every router: each has a decode (and a prefill when there are
 * some). 0, or PDCTL_EXIT_FAIL (printed) if one is not by the deadline. */
static int pdctl_up_wait_ready(const pdctl_dep_t *dep, const pdctl_up_routers_t *rt,
                               double deadline)
{
    char err[256] = "";
    for (unsigned i = 0; i < rt->n; i++) {
        int code;
        while ((code = pdctl_http_status(rt->url[i], "/ready", 2.0, err, sizeof(err))) != 200) {
            if (pdctl_now() > deadline) {
                fprintf(stderr, "pdctl: %s/ready still %d after %.0f s%s%s\n", rt->url[i], code,
                        (double)dep->ready_timeout_ns / 1e9, err[0] ? ": " : "", err);
                return PDCTL_EXIT_FAIL;
            }
            pdctl_nap_ms(50);
        }
    }
    return 0;
}

/* Tell the operator where the deployment answers and what to try; then
 * <run>/url, which pollers wait for. */
static void pdctl_up_announce(const pdctl_dep_t *dep, const pdctl_state_t *st,
                              const pdctl_up_routers_t *rt)
{
    printf("pdserve deployment \"%s\" is ready: %s  (%u prefill : %u decode; run dir %s)\n",
           st->name, st->url, dep->count[PDCTL_PREFILL], dep->count[PDCTL_DECODE], st->run_dir);
    for (unsigned i = 1; i < rt->n; i++)
        printf("  router-%u: %s\n", i, rt->url[i]);
    printf("  status: pdctl status --run-dir %s    stop: pdctl down --run-dir %s\n",
           st->run_dir, st->run_dir);
    /* a prompt long enough (40+ tokens of the built-in model) to be over the
     * local deployments' disagg-threshold, so `pdctl xfer all` shows a pull */
    printf("  try:    curl -sN %s/v1/chat/completions -H 'Content-Type: application/json' \\\n"
           "            -d '{\"stream\": true, \"max_tokens\": 64, \"temperature\": 0.5, "
           "\"messages\": [{\"role\": \"user\", \"content\": \"I want to share a modified "
           "version of a program that is licensed under the GNU General Public License. What "
           "must I do?\"}]}'\n",
           st->url);
    printf("  watch:  pdctl top --run-dir %s      transfers: pdctl xfer all --run-dir %s\n",
           st->run_dir, st->run_dir);
    char urlf[PATH_MAX];
    snprintf(urlf, sizeof(urlf), "%s/url", st->run_dir);
    char line[160];
    snprintf(line, sizeof(line), "%s\n", st->url);
    pdctl_write_file(urlf, line, 0644);
    fflush(stdout);
}

/* ep > 1: a rank's config must load before anything starts (the engine
 * refuses a dense model, an expert count ep does not divide): the decode's
 * --print-arena-bytes with ep-size = ep. 0, or PDCTL_EXIT_USAGE with the
 * daemon's reason (printed). */
static int pdctl_up_ep_check(pdctl_dep_t *dep)
{
    if (dep->ep <= 1)
        return 0;
    char flag[32], out[2048], tmp[PDCTL_TMP_NAME];
    snprintf(flag, sizeof(flag), "--ep-size=%u", dep->ep);
    pdctl_kvs_t *kv = &dep->role_kv[PDCTL_DECODE];
    size_t n0 = kv->n;
    pdctl_kvs_set(kv, "print-arena-bytes", "true", 0);
    int rc = pdctl_run_rendered(dep, PDCTL_DECODE, "127.0.0.1:7000", flag, false, 2, out,
                                sizeof(out), tmp);
    while (kv->n > n0) { /* the check's row goes again */
        kv->n--;
        free(kv->v[kv->n].key);
        free(kv->v[kv->n].val);
    }
    if (rc == 0)
        return 0;
    if (rc < 0)
        return PDCTL_EXIT_FAIL;
    const char *why = strstr(out, "model load: ");
    size_t wl = why != NULL ? strcspn(why, "\n") : 0;
    fprintf(stderr, "pdctl: %s: [decode] ep = %u: a rank does not load: %.*s (nothing was "
            "started)\n", dep->path, dep->ep, (int)wl, why != NULL ? why : "see pd-decode");
    return PDCTL_EXIT_USAGE;
}

int pdctl_cmd_up(int argc, char **argv)
{
    char *sets[PDCTL_MAX_SETS];
    int n_sets = 0;
    bool foreground;
    const char *run_override;
    int rc = pdctl_up_args(&argc, argv, sets, &n_sets, &foreground, &run_override);
    if (rc != 0)
        return rc;
    pdctl_dep_t dep;
    rc = pdctl_dep_load(argv[0], sets, n_sets, run_override, &dep);
    if (rc != 0)
        return rc;
    if ((rc = pdctl_up_ep_check(&dep)) != 0) {
        pdctl_dep_free(&dep);
        return rc;
    }
    pdctl_state_t st;
    memset(&st, 0, sizeof(st));
    st.lock_fd = -1;
    pdctl_up_routers_t rt = { .n = dep.count[PDCTL_ROUTER] };
    rc = PDCTL_EXIT_FAIL;
    if (pdctl_up_run_dir(&dep, &st) != 0 || pdctl_secret_ensure(dep.secret_file) != 0 ||
        pdctl_mem_plan_check(&dep, dep.count, NULL) != 0)
        goto out;
    if ((rc = pdctl_up_router_addrs(&dep, &rt)) != 0)
        goto out;
    rc = PDCTL_EXIT_FAIL;
    pdctl_up_warn_open(&dep);
    if (pdctl_up_snapshot(&dep, &st, sets, n_sets) != 0)
        goto out;

    /* the deployment's own etcd first (etcd = local), then the routers,
     * then prefill + decode; every router's /ready ends the start-up */
    double deadline = pdctl_now() + (double)dep.ready_timeout_ns / 1e9;
    if (dep.etcd_port != 0 &&
        (pdctl_etcd_start(&st, dep.etcd_port, deadline) != 0 || pdctl_state_save(&st) != 0))
        goto err_stop;
    if (pdctl_up_routers(&dep, &st, &rt, deadline) != 0 || pdctl_up_daemons(&dep, &st) != 0 ||
        pdctl_up_wait_ready(&dep, &rt, deadline) != 0 || pdctl_state_save(&st) != 0)
        goto err_stop;
    pdctl_up_announce(&dep, &st, &rt);
    rc = 0;
    if (foreground) {
        pdctl_state_unlock(&st);   /* `pdctl status/scale` work meanwhile */
        rc = pdctl_foreground(&st, (double)dep.stop_timeout_ns / 1e9);
    }
    goto out;

err_stop:
    fprintf(stderr, "pdctl: start-up failed; stopping what was started\n");
    pdctl_stop_all(&st, 10);
    {
        char p[PATH_MAX];
        pdctl_state_path(st.run_dir, p, sizeof(p));
        unlink(p);
    }
    rc = PDCTL_EXIT_FAIL;
out:
    cJSON_Delete(pdctl_sets_json);
    pdctl_sets_json = NULL;
    pdctl_state_unlock(&st);
    pdctl_dep_free(&dep);
    return rc;
}

/* The deployment of a run dir, re-parsed from its snapshot (for scale). */
int pdctl_dep_of_state(const pdctl_state_t *st, pdctl_dep_t *dep)
{
    char path[PATH_MAX];
    pdctl_state_path(st->run_dir, path, sizeof(path));
    char *text = pdctl_read_file(path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    char *sets[PDCTL_MAX_SETS];
    int n = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(j, "sets")) {
        if (cJSON_IsString(s) && n < PDCTL_MAX_SETS)
            sets[n++] = s->valuestring;
    }
    int rc = pdctl_dep_load(st->dep_file, sets, n, st->run_dir, dep);
    cJSON_Delete(j);
    return rc;
}

/* ---- down ------------------------------------------------------------------------ */

int pdctl_cmd_down(int argc, char **argv)
{
    pdctl_opts_t o = { 0 };
    pdctl_parse_opts(&argc, argv, &o);
    if (argc != 0) {
        fprintf(stderr, "usage: pdctl down [--run-dir D]\n");
        return PDCTL_EXIT_USAGE;
    }
    /* the planners first: none may re-split what is being stopped (one in
     * the middle of a re-split finishes its `pdctl scale`, bounded by the
     * stop-timeout, then exits) */
    pdctl_planners_stop(o.run_dir, 60);
    pdctl_state_t st;
    int rc = pdctl_state_load_locked(o.run_dir, &st);
    if (rc != 0)
        return rc;
    if ((rc = pdctl_refuse_installed(&st, "down")) != 0) {
        pdctl_state_unlock(&st);
        return rc;
    }
    double timeout = 30;
    pdctl_dep_t dep;
    if (pdctl_dep_of_state(&st, &dep) == 0) {
        timeout = (double)dep.stop_timeout_ns / 1e9;
        pdctl_dep_free(&dep);
    }
    int alive = 0;
    for (int i = 0; i < st.n; i++)
        alive += pdctl_daemon_alive(&st.d[i]);
    pdctl_stop_all(&st, timeout);
    char p[PATH_MAX];
    pdctl_state_path(st.run_dir, p, sizeof(p));
    unlink(p);
    snprintf(p, sizeof(p), "%s/url", st.run_dir);
    unlink(p);
    printf("pdserve deployment \"%s\" stopped (%d daemon%s; logs in %s)\n", st.name, alive,
           alive == 1 ? "" : "s", st.run_dir);
    pdctl_state_unlock(&st);
    return 0;
}

/* ---- scale ------------------------------------------------------------------------ */

static int pdctl_daemon_index(const pdctl_daemon_t *x)
{
    const char *dash = strrchr(x->name, '-');
    return dash ? atoi(dash + 1) : 0;
}

int pdctl_cmd_scale(int argc, char **argv)
{
    pdctl_opts_t o = { 0 };
    pdctl_parse_opts(&argc, argv, &o);
    pdctl_role_t role = argc == 2 ? pdctl_role_parse(argv[0]) : PDCTL_ROLE_N;
    char *end = NULL;
    long want = argc == 2 ? strtol(argv[1], &end, 10) : -1;
    if (role == PDCTL_ROLE_N || role == PDCTL_ROUTER || end == NULL || *end != '\0' ||
        want < (role == PDCTL_DECODE ? 1 : 0) || want > PDCTL_MAX_PER_ROLE) {
        fprintf(stderr, "usage: pdctl scale prefill|decode N [--run-dir D]  "
                "(prefill 0..%d, decode 1..%d)\n", PDCTL_MAX_PER_ROLE, PDCTL_MAX_PER_ROLE);
        return PDCTL_EXIT_USAGE;
    }
    pdctl_state_t st;
    int rc = pdctl_state_load_locked(o.run_dir, &st);
    if (rc != 0)
        return rc;
    if ((rc = pdctl_refuse_installed(&st, "scale")) != 0) {
        pdctl_state_unlock(&st);
        return rc;
    }
    pdctl_dep_t dep;
    if ((rc = pdctl_dep_of_state(&st, &dep)) != 0) {
        pdctl_state_unlock(&st);
        return rc;
    }
    rc = PDCTL_EXIT_FAIL;
    if (role == PDCTL_DECODE && dep.ep > 1) {
        fprintf(stderr, "pdctl: scale decode: the decodes of %s are EP groups (ep = %u); "
                "scaling them is not built yet\n", st.run_dir, dep.ep);
        goto out;
    }
    const pdctl_daemon_t *router = pdctl_router(&st);
    if (router == NULL || !pdctl_daemon_alive(router)) {
        fprintf(stderr, "pdctl: the router of %s is not running\n", st.run_dir);
        goto out;
    }
    /* forget daemons that died (their names get reused) */
    int w = 0;
    for (int i = 0; i < st.n; i++) {
        if (st.d[i].role != PDCTL_ROUTER && !pdctl_daemon_alive(&st.d[i])) {
            fprintf(stderr, "pdctl: %s (pid %d) is dead; replacing it\n", st.d[i].name,
                    (int)st.d[i].pid);
            continue;
        }
        st.d[w++] = st.d[i];
    }
    st.n = w;
    int have = 0;
    for (int i = 0; i < st.n; i++)
        have += st.d[i].role == role;
    if (want > have) {
        pdctl_daemon_t *started[PDCTL_MAX_DAEMONS];
        int n_started = 0;
        unsigned add[PDCTL_ROLE_N] = { 0 }, first[PDCTL_ROLE_N] = { 0 };
        add[role] = (unsigned)(want - have);
        first[role] = (unsigned)have;   /* the running ones are in the ledger already */
        if ((rc = pdctl_mem_plan_check(&dep, add, first)) != 0)
            goto out;
        rc = pdctl_start_role(&dep, &st, role, (unsigned)want, started, &n_started);
        pdctl_state_save(&st);
        if (rc != 0 || !pdctl_wait_started(&dep, &st, started, n_started)) {
            fprintf(stderr, "pdctl: scale-up failed; stopping the new daemons\n");
            pdctl_stop_many(started, n_started, false, 10);
            int k = 0;
            for (int i = 0; i < st.n; i++)
                if (st.d[i].pid != 0)
                    st.d[k++] = st.d[i];
            st.n = k;
            pdctl_state_save(&st);
            rc = PDCTL_EXIT_FAIL;
            goto out;
        }
    } else if (want < have) {
        /* drain the highest-numbered ones: the router stops routing to them
         * and moves a decode's running streams to the others (live
         * migration); they finish what is left and exit */
        pdctl_daemon_t *victims[PDCTL_MAX_DAEMONS];
        int nv = 0;
        while (have - nv > want) {
            pdctl_daemon_t *best = NULL;
            for (int i = 0; i < st.n; i++) {
                if (st.d[i].role != role)
                    continue;
                bool taken = false;
                for (int v = 0; v < nv; v++)
                    taken |= victims[v] == &st.d[i];
                if (!taken && (best == NULL || pdctl_daemon_index(&st.d[i]) > pdctl_daemon_index(best)))
                    best = &st.d[i];
            }
            victims[nv++] = best;
        }
        char err[256], cmd[128];
        for (int v = 0; v < nv; v++) {
            snprintf(cmd, sizeof(cmd), "set-backend %s drain", victims[v]->name);
            for (int k = 0; k < st.n; k++) { /* every router stops routing to it */
                const pdctl_daemon_t *rt = &st.d[k];
                if (rt->role != PDCTL_ROUTER || !pdctl_daemon_alive(rt))
                    continue;
                cJSON *r = pdctl_admin(rt->sock, cmd, 5.0, err, sizeof(err));
                if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "ok")))
                    fprintf(stderr, "pdctl: %s: %s: %s\n", rt->name, cmd,
                            r ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
                                    cJSON_GetObjectItemCaseSensitive(r, "error"), "message"))
                              : err);
                cJSON_Delete(r);
            }
        }
        pdctl_stop_many(victims, nv, true, (double)dep.stop_timeout_ns / 1e9);
        int k = 0;
        for (int i = 0; i < st.n; i++)
            if (st.d[i].pid != 0)
                st.d[k++] = st.d[i];
        st.n = k;
    }
    if (pdctl_state_save(&st) != 0)
        goto out;
    printf("%s: %ld daemon%s (was %d)\n", pdctl_role_name(role), want, want == 1 ? "" : "s", have);
    rc = 0;
out:
    pdctl_dep_free(&dep);
    pdctl_state_unlock(&st);
    return rc;
}
