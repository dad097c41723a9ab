/* pdctl_conf.c - the deployment file: a small INI (inih) that says which
 * model, how many prefill and decode daemons (the P:D ratio), their settings
 * and where they listen. Every key is checked: pdctl's own keys against the
 * table below, daemon keys against the daemon's --help (generated from its
 * pd_config table), so a typo is an error with its line number, not a
 * silently ignored setting. See deploy/example.ini for every key. */
#include "pdctl.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pd_config.h"
#include "pd_sbuf.h"
#include "pdctl_plan.h"

#define R (1u << PDCTL_ROUTER)
#define P (1u << PDCTL_PREFILL)
#define D (1u << PDCTL_DECODE)

/* [deployment] keys. X(key, daemon key it becomes or NULL, roles, help).
 * Keys with a daemon key are copied into those roles' configs (a role
 * section may still override them); NULL ones are pdctl's own. */
#define PDCTL_DEP_KEYS(X)                                                        \
    X("name", NULL, 0, "deployment name (status, top)")                          \
    X("model", "model", R | P | D, "GGUF path, sim:<preset,...>, or builtin")   \
    X("engine", "engine", R | P | D, "llama|sim (default from the model)")       \
    X("routers", NULL, 0, "number of routers (1..8); router-i: http and control ports + i") \
    X("prefill", NULL, 0, "number of prefill daemons (0..32)")                   \
    X("decode", NULL, 0, "number of decode daemons (1..32)")                     \
    X("run-dir", NULL, 0, "state dir: configs, logs, pid files, sockets")        \
    X("secret-file", NULL, 0, "deployment secret (generated 0600 if absent)")    \
    X("bin-dir", NULL, 0, "directory with pd-router, pd-prefill, pd-decode")     \
    X("ready-timeout", NULL, 0, "bound on start-up waits (default 30s)")         \
    X("stop-timeout", NULL, 0, "bound on drain/stop waits (default 30s)")        \
    X("log-level", "log.level", R | P | D, "error|warn|info|debug|trace")        \
    X("disagg-mode", "disagg-mode", R, "threshold|always|never|cost")            \
    X("disagg-threshold", "disagg-threshold", R, "uncached tokens to disaggregate") \
    X("lease-ttl", "lease-ttl", R | P, "KV lease length (prefill side)")         \
    X("transfer-timeout", "transfer-timeout", D, "deadline of one KV pull")      \
    X("heartbeat-interval", "heartbeat-interval", R | P | D, "heartbeat period") \
    X("drain-timeout", "drain-timeout", R | P | D, "SIGTERM drain bound")        \
    X("block-tokens", "block-tokens", P | D, "tokens per KV block")              \
    X("kv-dtype", "kv-dtype", P | D, "f16|f32|bf16|q8_0|fp8_e4m3|q4_0")        \
    X("kv-dtype-k", "kv-dtype-k", P | D, "K's dtype apart from V's (same: kv-dtype)") \
    X("kv-dtype-v", "kv-dtype-v", P | D, "V's dtype apart from K's (same: kv-dtype)") \
    X("mem-budget", "mem.budget", P | D, "host-wide cap on the daemons' KV arenas (0: from MemAvailable / cgroup)") \
    X("mem-ledger", "mem.ledger", P | D, "file where one host's daemons reserve their arenas") \
    X("etcd", "etcd", R | P | D, "etcd client address, or local[:PORT] (pdctl runs one on loopback): membership (off by default)") \
    X("etcd-prefix", "etcd.prefix", R | P | D, "deployment prefix in etcd (/pdserve/<name>/)")

typedef struct {
    const char *key, *daemon_key;
    unsigned roles;
    const char *help;
} pdctl_dep_key_t;

static const pdctl_dep_key_t pdctl_dep_keys[] = {
#define PDCTL_X_KEY(k, dk, r, h) { k, dk, r, h },
    PDCTL_DEP_KEYS(PDCTL_X_KEY)
#undef PDCTL_X_KEY
    { NULL, NULL, 0, NULL },
};

/* Daemon keys pdctl sets itself; a role section may not. */
static const char *const pdctl_managed[] = {
    "id", "router", "secret-file", "secret", "insecure-no-auth", "admin.socket",
    "ready-file", "log.file", "config", "model", "ep-size", "ep-rank", "ep-dir", NULL,
};

static const char *const pdctl_role_names[] = {
#define PDCTL_X_ROLE(id, name, bin) name,
    PDCTL_ROLES(PDCTL_X_ROLE)
#undef PDCTL_X_ROLE
};
static const char *const pdctl_role_bins[] = {
#define PDCTL_X_ROLE(id, name, bin) bin,
    PDCTL_ROLES(PDCTL_X_ROLE)
#undef PDCTL_X_ROLE
};

const char *pdctl_role_name(pdctl_role_t role)
{
    return role < PDCTL_ROLE_N ? pdctl_role_names[role] : "?";
}

pdctl_role_t pdctl_role_parse(const char *name)
{
    for (int r = 0; r < PDCTL_ROLE_N; r++)
        if (strcmp(name, pdctl_role_names[r]) == 0)
            return (pdctl_role_t)r;
    return PDCTL_ROLE_N;
}

/* ---- key/value lists ---------------------------------------------------------- */

const char *pdctl_kvs_get(const pdctl_kvs_t *kvs, const char *key)
{
    for (size_t i = 0; i < kvs->n; i++)
        if (strcmp(kvs->v[i].key, key) == 0)
            return kvs->v[i].val;
    return NULL;
}

void pdctl_kvs_set(pdctl_kvs_t *kvs, const char *key, const char *val, int line)
{
    for (size_t i = 0; i < kvs->n; i++) {
        if (strcmp(kvs->v[i].key, key) == 0) {
            free(kvs->v[i].val);
            kvs->v[i].val = strdup(val);
            kvs->v[i].line = line;
            return;
        }
    }
    if (kvs->n == kvs->cap) {
        size_t cap = kvs->cap ? kvs->cap * 2 : 16;
        pdctl_kv_t *v = realloc(kvs->v, cap * sizeof(*v));
        if (v == NULL)
            abort();
        kvs->v = v;
        kvs->cap = cap;
    }
    kvs->v[kvs->n].key = strdup(key);
    kvs->v[kvs->n].val = strdup(val);
    kvs->v[kvs->n].line = line;
    if (kvs->v[kvs->n].key == NULL || kvs->v[kvs->n].val == NULL)
        abort();
    kvs->n++;
}

void pdctl_kvs_free(pdctl_kvs_t *kvs)
{
    for (size_t i = 0; i < kvs->n; i++) {
        free(kvs->v[i].key);
        free(kvs->v[i].val);
    }
    free(kvs->v);
    memset(kvs, 0, sizeof(*kvs));
}

/* ---- binaries --------------------------------------------------------------- */

static bool pdctl_is_exec(const char *path)
{
    return access(path, X_OK) == 0;
}

const char *pdctl_bin_dir(pdctl_role_t role, char *buf, size_t cap)
{
    const char *bin = pdctl_role_bins[role];
    const char *env = getenv("PD_BIN_DIR");
    char path[PATH_MAX];
    if (env != NULL && env[0] != '\0') {
        snprintf(buf, cap, "%s", env);
        snprintf(path, sizeof(path), "%s/%s", buf, bin);
        return pdctl_is_exec(path) ? buf : NULL;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return NULL;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash == NULL)
        return NULL;
    *slash = '\0';
    /* installed side by side */
    snprintf(buf, cap, "%s", self);
    snprintf(path, sizeof(path), "%s/%s", buf, bin);
    if (pdctl_is_exec(path))
        return buf;
    /* meson build tree: BUILD/tools/pdctl/pdctl, BUILD/<role>/pd-<role> */
    snprintf(buf, cap, "%s/../../%s", self, pdctl_role_names[role]);
    snprintf(path, sizeof(path), "%s/%s", buf, bin);
    if (pdctl_is_exec(path)) {
        char real[PATH_MAX];
        if (realpath(buf, real) != NULL)
            snprintf(buf, cap, "%s", real);
        return buf;
    }
    return NULL;
}

/* The built-in model: the build tree's when pdctl runs from one, else the
 * installed copy (<prefix>/share/pdserve/models, next to <prefix>/bin). */
static bool pdctl_builtin_model(char *buf, size_t cap)
{
    static const char *const rel[] = {
        "../../engine/gguf/builtin.gguf",          /* build/tools/pdctl/pdctl */
        "../share/pdserve/models/builtin.gguf",    /* <prefix>/bin/pdctl */
    };
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return false;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash == NULL)
        return false;
    *slash = '\0';
    if (cap < PATH_MAX)
        return false;
    for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
        char path[PATH_MAX];
        if (pdctl_fmt(path, sizeof(path), "%s/%s", self, rel[i]) &&
            realpath(path, buf) != NULL)
            return true;
    }
    return false;
}

/* ---- daemon key tables from --help ----------------------------------------- */

/* Keys a daemon accepts, parsed from `bin --help` ("  --key=TYPE" and
 * "  --[no-]key" lines). NULL-separated list in one malloc'd buffer. */
static char *pdctl_daemon_keys(const char *bin)
{
    int fds[2];
    if (pipe(fds) != 0)
        return NULL;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return NULL;
    }
    if (pid == 0) {
        dup2(fds[1], 1);
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 2);
        }
        close(fds[0]);
        close(fds[1]);
        execl(bin, bin, "--help", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    pd_sbuf_t out = { 0 };
    FILE *f = fdopen(fds[0], "r");
    char line[1024];
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        const char *p = line;
        if (strncmp(p, "  --", 4) != 0)
            continue;
        p += 4;
        if (strncmp(p, "[no-]", 5) == 0)
            p += 5;
        size_t k = 0;
        while (p[k] != '\0' && (isalnum((unsigned char)p[k]) || p[k] == '-' || p[k] == '.'))
            k++;
        if (k == 0)
            continue;
        pd_sbuf_append(&out, p, k);
        pd_sbuf_append(&out, "\n", 1);
    }
    if (f != NULL)
        fclose(f);
    else
        close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    char *s = pd_sbuf_finish(&out, NULL);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

static bool pdctl_key_in(const char *list, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = list; p != NULL && *p != '\0';) {
        const char *nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) : strlen(p);
        if (l == kl && memcmp(p, key, kl) == 0)
            return true;
        p = nl ? nl + 1 : NULL;
    }
    return false;
}

/* ---- parsing ------------------------------------------------------------------ */

typedef struct {
    FILE *f;
    int line;                  /* line the reader returned last */
} pdctl_reader_t;

static char *pdctl_reader(char *str, int num, void *stream)
{
    pdctl_reader_t *r = stream;
    char *s = fgets(str, num, r->f);
    if (s != NULL)
        r->line++;
    return s;
}

typedef struct {
    pdctl_kvs_t sections[4 + PDCTL_ROLE_N];  /* raw keys per section */
    char err[512];
    const char *path;
    pdctl_reader_t rd;
} pdctl_parse_t;

enum { SEC_DEPLOYMENT = PDCTL_ROLE_N, SEC_ENV, SEC_NETNS, SEC_PLANNER, SEC_N };
static const char *const pdctl_sec_extra[] = { "deployment", "env", "netns", "planner" };

static int pdctl_section(const char *name)
{
    pdctl_role_t r = pdctl_role_parse(name);
    if (r != PDCTL_ROLE_N)
        return (int)r;
    for (int i = 0; i < SEC_N - PDCTL_ROLE_N; i++)
        if (strcmp(name, pdctl_sec_extra[i]) == 0)
            return PDCTL_ROLE_N + i;
    return -1;
}

static int pdctl_ini_cb(void *user, const char *section, const char *name, const char *value)
{
    pdctl_parse_t *ps = user;
    if (ps->err[0] != '\0')
        return 1;
    int sec = pdctl_section(section != NULL && section[0] != '\0' ? section : "deployment");
    if (sec < 0) {
        snprintf(ps->err, sizeof(ps->err),
                 "%s:%d: unknown section [%s] (expected deployment, router, prefill, "
                 "decode, env, netns or planner)", ps->path, ps->rd.line, section);
        return 1;
    }
    if (pdctl_kvs_get(&ps->sections[sec], name) != NULL) {
        snprintf(ps->err, sizeof(ps->err), "%s:%d: key \"%s\" set twice in [%s]",
                 ps->path, ps->rd.line, name, section[0] ? section : "deployment");
        return 1;
    }
    pdctl_kvs_set(&ps->sections[sec], name, value, ps->rd.line);
    return 1;
}

static int pdctl_fail(const char *fmt, ...)
{
    va_list ap;
    fputs("pdctl: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return PDCTL_EXIT_USAGE;
}

static char *pdctl_abspath(const char *p)
{
    if (p[0] == '/')
        return strdup(p);
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == NULL)
        return strdup(p);
    size_t n = strlen(cwd) + strlen(p) + 2;
    char *s = malloc(n);
    if (s != NULL)
        snprintf(s, n, "%s/%s", cwd, p);
    return s;
}

static bool pdctl_parse_count(const char *v, unsigned min, unsigned max, unsigned *out)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || n < (long)min || n > (long)max)
        return false;
    *out = (unsigned)n;
    return true;
}

static bool pdctl_env_name_ok(const char *s)
{
    if (!(isupper((unsigned char)s[0]) || s[0] == '_'))
        return false;
    for (; *s; s++)
        if (!(isupper((unsigned char)*s) || isdigit((unsigned char)*s) || *s == '_'))
            return false;
    return true;
}

/* --set section.key=value (section optional: deployment). */
static int pdctl_apply_set(pdctl_parse_t *ps, const char *set)
{
    const char *eq = strchr(set, '=');
    if (eq == NULL)
        return pdctl_fail("--set %s: expected section.key=value", set);
    char key[256];
    snprintf(key, sizeof(key), "%.*s", (int)(eq - set), set);
    int sec = SEC_DEPLOYMENT;
    char *name = key;
    char *dot = strchr(key, '.');
    if (dot != NULL) {
        *dot = '\0';
        int s = pdctl_section(key);
        if (s >= 0) {
            sec = s;
            name = dot + 1;
        } else {
            *dot = '.';     /* a dotted daemon key like admin.x: not a section */
            return pdctl_fail("--set %s: unknown section \"%.*s\"", set, (int)(dot - key), key);
        }
    }
    pdctl_kvs_set(&ps->sections[sec], name, eq + 1, 0);
    return 0;
}

static const pdctl_dep_key_t *pdctl_dep_key(const char *k)
{
    for (const pdctl_dep_key_t *d = pdctl_dep_keys; d->key != NULL; d++)
        if (strcmp(d->key, k) == 0)
            return d;
    return NULL;
}

static void pdctl_where(char *buf, size_t cap, const char *path, int line)
{
    if (line > 0)
        snprintf(buf, cap, "%s:%d", path, line);
    else
        snprintf(buf, cap, "--set");
}

int pdctl_dep_load(const char *path, char *const *sets, int n_sets,
                   const char *run_dir_override, pdctl_dep_t *dep)
{
    memset(dep, 0, sizeof(*dep));
    pdctl_parse_t ps = { .path = path };
    int rc = PDCTL_EXIT_USAGE;
    char where[300];
    char *keys[PDCTL_ROLE_N] = { 0 };

    ps.rd.f = fopen(path, "r");
    if (ps.rd.f == NULL) {
        rc = pdctl_fail("cannot read deployment file %s: %s", path, strerror(errno));
        goto out;
    }
    int line = ini_parse_stream(pdctl_reader, &ps.rd, pdctl_ini_cb, &ps);
    fclose(ps.rd.f);
    if (ps.err[0] != '\0') {
        rc = pdctl_fail("%s", ps.err);
        goto out;
    }
    if (line != 0) {
        rc = pdctl_fail("%s:%d: syntax error (expected `key = value` or `[section]`)", path, line);
        goto out;
    }
    for (int i = 0; i < n_sets; i++)
        if ((rc = pdctl_apply_set(&ps, sets[i])) != 0)
            goto out;
    rc = PDCTL_EXIT_USAGE;

    dep->path = pdctl_abspath(path);
    dep->count[PDCTL_ROUTER] = 1;
    dep->count[PDCTL_PREFILL] = 1;
    dep->count[PDCTL_DECODE] = 1;
    dep->ep = 1;
    dep->ready_timeout_ns = 30000000000ull;
    dep->stop_timeout_ns = 30000000000ull;
    const char *run_dir = "run", *secret = NULL, *bin_dir = NULL;

    /* [deployment] */
    pdctl_kvs_t *dk = &ps.sections[SEC_DEPLOYMENT];
    for (size_t i = 0; i < dk->n; i++) {
        const pdctl_kv_t *kv = &dk->v[i];
        pdctl_where(where, sizeof(where), path, kv->line);
        const pdctl_dep_key_t *k = pdctl_dep_key(kv->key);
        if (k == NULL) {
            pdctl_fail("%s: unknown key \"%s\" in [deployment] (see deploy/example.ini)",
                       where, kv->key);
            goto out;
        }
        if (strcmp(kv->key, "routers") == 0) {
            if (!pdctl_parse_count(kv->val, 1, PDCTL_MAX_ROUTERS, &dep->count[PDCTL_ROUTER])) {
                pdctl_fail("%s: bad count routers = \"%s\" (expected an integer 1..%u)", where,
                           kv->val, PDCTL_MAX_ROUTERS);
                goto out;
            }
        } else if (strcmp(kv->key, "prefill") == 0 || strcmp(kv->key, "decode") == 0) {
            pdctl_role_t r = pdctl_role_parse(kv->key);
            unsigned min = r == PDCTL_DECODE ? 1 : 0;
            if (!pdctl_parse_count(kv->val, min, PDCTL_MAX_PER_ROLE, &dep->count[r])) {
                pdctl_fail("%s: bad count %s = \"%s\" (expected an integer %u..%u)",
                           where, kv->key, kv->val, min, PDCTL_MAX_PER_ROLE);
                goto out;
            }
        } else if (strcmp(kv->key, "ready-timeout") == 0 || strcmp(kv->key, "stop-timeout") == 0) {
            uint64_t ns;
            if (pd_parse_duration(kv->val, &ns) != PD_OK || ns == 0) {
                pdctl_fail("%s: %s: expected a duration like 30s or 500ms, got \"%s\"",
                           where, kv->key, kv->val);
                goto out;
            }
            *(kv->key[0] == 'r' ? &dep->ready_timeout_ns : &dep->stop_timeout_ns) = ns;
        } else if (strcmp(kv->key, "name") == 0) {
            dep->name = strdup(kv->val);
        } else if (strcmp(kv->key, "run-dir") == 0) {
            run_dir = kv->val;
        } else if (strcmp(kv->key, "secret-file") == 0) {
            secret = kv->val;
        } else if (strcmp(kv->key, "bin-dir") == 0) {
            bin_dir = kv->val;
        } else if (strcmp(kv->key, "model") == 0) {
            dep->model = strdup(kv->val);
        }
        if (k->daemon_key != NULL && strcmp(kv->key, "model") != 0)
            for (int r = 0; r < PDCTL_ROLE_N; r++)
                if (k->roles & (1u << r))
                    pdctl_kvs_set(&dep->role_kv[r], k->daemon_key, kv->val, kv->line);
    }
    if (dep->name == NULL) {
        const char *b = strrchr(path, '/');
        dep->name = strdup(b ? b + 1 : path);
        char *dot = strrchr(dep->name, '.');
        if (dot != NULL)
            *dot = '\0';
    }
    /* etcd = local[:PORT]: pdctl runs one on loopback; every daemon gets its
     * address. With etcd, the prefix defaults to /pdserve/<name>/. */
    const char *ev = pdctl_kvs_get(&dep->role_kv[PDCTL_ROUTER], "etcd");
    if (ev != NULL && strncmp(ev, "local", 5) == 0) {
        unsigned long port = 2379;
        char *end = NULL;
        if (ev[5] == ':')
            port = strtoul(ev + 6, &end, 10);
        if ((ev[5] != '\0' && ev[5] != ':') || (end != NULL && (*end != '\0' || end == ev + 6)) ||
            port < 1 || port > 65534) {
            pdctl_fail("%s: etcd = \"%s\": expected host:port, local or local:PORT", path, ev);
            goto out;
        }
        dep->etcd_port = (unsigned)port;
        char addr[32];
        snprintf(addr, sizeof(addr), "127.0.0.1:%lu", port);
        for (int r = 0; r < PDCTL_ROLE_N; r++)
            pdctl_kvs_set(&dep->role_kv[r], "etcd", addr, 0);
    }
    if (ev != NULL && pdctl_kvs_get(&dep->role_kv[PDCTL_ROUTER], "etcd.prefix") == NULL) {
        char pfx[160];
        snprintf(pfx, sizeof(pfx), "/pdserve/%s/", dep->name);
        for (int r = 0; r < PDCTL_ROLE_N; r++)
            pdctl_kvs_set(&dep->role_kv[r], "etcd.prefix", pfx, 0);
    }
    if (dep->model == NULL) {
        pdctl_fail("%s: no model (set `model = ...` in [deployment])", path);
        goto out;
    }
    if (strcmp(dep->model, "builtin") == 0) {
        char m[PATH_MAX];
        if (!pdctl_builtin_model(m, sizeof(m))) {
            pdctl_fail("%s: model = builtin, but no engine/gguf/builtin.gguf in the build tree "
                       "(build it: ninja engine/gguf/builtin.gguf) and none installed in "
                       "../share/pdserve/models next to pdctl", path);
            rc = PDCTL_EXIT_FAIL;
            goto out;
        }
        free(dep->model);
        dep->model = strdup(m);
    } else if (strncmp(dep->model, "sim:", 4) != 0) {
        char *abs = pdctl_abspath(dep->model);
        free(dep->model);
        dep->model = abs;
        if (access(dep->model, R_OK) != 0) {
            pdctl_fail("%s: model %s: %s", path, dep->model, strerror(errno));
            rc = PDCTL_EXIT_FAIL;
            goto out;
        }
    }
    dep->run_dir = pdctl_abspath(run_dir_override ? run_dir_override : run_dir);
    if (secret == NULL || secret[0] != '/') {
        const char *s = secret ? secret : "secret";
        size_t n = strlen(dep->run_dir) + strlen(s) + 2;
        dep->secret_file = malloc(n);
        snprintf(dep->secret_file, n, "%s/%s", dep->run_dir, s);
    } else {
        dep->secret_file = strdup(secret);
        dep->secret_given = true;
    }

    /* binaries and their key tables */
    for (int r = 0; r < PDCTL_ROLE_N; r++) {
        char dir[PATH_MAX];
        const char *d = bin_dir;
        if (d == NULL && (d = pdctl_bin_dir((pdctl_role_t)r, dir, sizeof(dir))) == NULL) {
            pdctl_fail("cannot find %s (set PD_BIN_DIR or bin-dir, or run the pdctl of a build tree)",
                       pdctl_role_bins[r]);
            rc = PDCTL_EXIT_FAIL;
            goto out;
        }
        size_t n = strlen(d) + strlen(pdctl_role_bins[r]) + 2;
        dep->bins[r] = malloc(n);
        snprintf(dep->bins[r], n, "%s/%s", d, pdctl_role_bins[r]);
        if (!pdctl_is_exec(dep->bins[r])) {
            pdctl_fail("%s is not an executable", dep->bins[r]);
            rc = PDCTL_EXIT_FAIL;
            goto out;
        }
        keys[r] = pdctl_daemon_keys(dep->bins[r]);
        if (keys[r] == NULL) {
            pdctl_fail("%s --help failed: cannot check the [%s] keys", dep->bins[r],
                       pdctl_role_name((pdctl_role_t)r));
            rc = PDCTL_EXIT_FAIL;
            goto out;
        }
    }

    /* role sections: daemon keys, checked against the daemon's table */
    for (int r = 0; r < PDCTL_ROLE_N; r++) {
        pdctl_kvs_t *rk = &ps.sections[r];
        for (size_t i = 0; i < rk->n; i++) {
            const pdctl_kv_t *kv = &rk->v[i];
            pdctl_where(where, sizeof(where), path, kv->line);
            if (r == PDCTL_DECODE && strcmp(kv->key, "ep") == 0) { /* pdctl's own */
                if (!pdctl_parse_count(kv->val, 1, PDCTL_MAX_EP, &dep->ep)) {
                    pdctl_fail("%s: bad ep = \"%s\" in [decode] (ranks per decode instance, "
                               "an integer 1..%u)", where, kv->val, PDCTL_MAX_EP);
                    goto out;
                }
                continue;
            }
            if (r == PDCTL_DECODE && strcmp(kv->key, "whole") == 0) { /* pdctl's own */
                if (!pdctl_parse_count(kv->val, 0, PDCTL_MAX_PER_ROLE, &dep->whole)) {
                    pdctl_fail("%s: bad whole = \"%s\" in [decode] (decode instances that "
                               "hold the whole model beside the EP groups, an integer 0..%u)",
                               where, kv->val, PDCTL_MAX_PER_ROLE);
                    goto out;
                }
                continue;
            }
            for (const char *const *m = pdctl_managed; *m != NULL; m++) {
                if (strcmp(*m, kv->key) == 0) {
                    pdctl_fail("%s: key \"%s\" in [%s] is set by pdctl%s", where, kv->key,
                               pdctl_role_name((pdctl_role_t)r),
                               strcmp(*m, "model") == 0 ? " (use [deployment] model)" : "");
                    goto out;
                }
            }
            if (!pdctl_key_in(keys[r], kv->key) || strcmp(kv->key, "help") == 0 ||
                strcmp(kv->key, "version") == 0 || strcmp(kv->key, "check-config") == 0 ||
                strcmp(kv->key, "print-arena-bytes") == 0) {
                pdctl_fail("%s: unknown key \"%s\" in [%s] (not an option of %s; see %s --help)",
                           where, kv->key, pdctl_role_name((pdctl_role_t)r),
                           pdctl_role_bins[r], pdctl_role_bins[r]);
                goto out;
            }
            pdctl_kvs_set(&dep->role_kv[r], kv->key, kv->val, kv->line);
        }
    }
    if (dep->whole > 0 && dep->ep == 1) {
        pdctl_fail("%s: [decode] whole = %u needs ep > 1 (with ep = 1 every decode holds the "
                   "whole model)", path, dep->whole);
        goto out;
    }
    if (dep->whole > 0 && dep->whole >= dep->count[PDCTL_DECODE]) {
        pdctl_fail("%s: [decode] whole = %u with decode = %u: no EP group is left (whole "
                   "counts among the decode instances and must be less; for no group use "
                   "ep = 1)", path, dep->whole, dep->count[PDCTL_DECODE]);
        goto out;
    }
    if (pdctl_dep_decode_procs(dep) > PDCTL_MAX_PER_ROLE) {
        pdctl_fail("%s: decode = %u with ep = %u (whole = %u): %u decode processes, at most %u",
                   path, dep->count[PDCTL_DECODE], dep->ep, dep->whole,
                   pdctl_dep_decode_procs(dep), PDCTL_MAX_PER_ROLE);
        goto out;
    }
    /* a group lost fails the streams of all its ranks, and a failover may
     * land on another rank of the dying group before it is gone (the router
     * does not know the groups): one loss can cost up to ep retries. Unless
     * the file sets max-retries, the router gets its default (2) + ep - 1. */
    if (dep->ep > 1 && pdctl_kvs_get(&dep->role_kv[PDCTL_ROUTER], "max-retries") == NULL) {
        char mr[16];
        snprintf(mr, sizeof(mr), "%u", PDCTL_EP_MAX_RETRIES(dep->ep));
        pdctl_kvs_set(&dep->role_kv[PDCTL_ROUTER], "max-retries", mr, 0);
    }
    /* keys copied from [deployment] must exist in the daemons too (they do
     * today; this catches a daemon that renamed one) */
    for (int r = 0; r < PDCTL_ROLE_N; r++) {
        for (size_t i = 0; i < dep->role_kv[r].n; i++) {
            if (!pdctl_key_in(keys[r], dep->role_kv[r].v[i].key)) {
                pdctl_fail("%s does not accept %s any more (pdctl and the daemons disagree)",
                           pdctl_role_bins[r], dep->role_kv[r].v[i].key);
                rc = PDCTL_EXIT_FAIL;
                goto out;
            }
        }
    }
    /* [env] */
    pdctl_kvs_t *ek = &ps.sections[SEC_ENV];
    for (size_t i = 0; i < ek->n; i++) {
        pdctl_where(where, sizeof(where), path, ek->v[i].line);
        if (!pdctl_env_name_ok(ek->v[i].key)) {
            /* inih lower-cases nothing, but users write lower case by mistake */
            pdctl_fail("%s: [env] %s: variable names are upper case (e.g. UCX_TLS)",
                       where, ek->v[i].key);
            goto out;
        }
        if (strncmp(ek->v[i].key, "PD_", 3) == 0) {
            pdctl_fail("%s: [env] %s: PD_* variables would override the daemon configs; "
                       "set the key in its section instead", where, ek->v[i].key);
            goto out;
        }
        pdctl_kvs_set(&dep->env, ek->v[i].key, ek->v[i].val, ek->v[i].line);
    }
    /* [netns] daemon = namespace */
    pdctl_kvs_t *nk = &ps.sections[SEC_NETNS];
    for (size_t i = 0; i < nk->n; i++) {
        pdctl_where(where, sizeof(where), path, nk->v[i].line);
        const char *k = nk->v[i].key;
        const char *dash = strrchr(k, '-');
        pdctl_role_t r = PDCTL_ROLE_N;
        if (strcmp(k, "router") == 0) {
            r = PDCTL_ROUTER;
        } else if (dash != NULL && isdigit((unsigned char)dash[1])) {
            char role[16];
            snprintf(role, sizeof(role), "%.*s", (int)(dash - k), k);
            r = pdctl_role_parse(role);
            /* N, or (an EP group's rank) N.rK */
            const char *t = dash + 1 + strspn(dash + 1, "0123456789");
            if (*t != '\0' && !(r == PDCTL_DECODE && t[0] == '.' && t[1] == 'r' &&
                                isdigit((unsigned char)t[2]) && t[2 + strspn(t + 2, "0123456789")] == '\0'))
                r = PDCTL_ROLE_N;
        }
        if (r == PDCTL_ROLE_N || nk->v[i].val[0] == '\0') {
            pdctl_fail("%s: [netns] %s: expected router|prefill-N|decode-N|decode-N.rK = <namespace>", where, k);
            goto out;
        }
        pdctl_kvs_set(&dep->netns, k, nk->v[i].val, nk->v[i].line);
    }
    /* [planner]: the SLO planner's rows (pdctl_plan_core.c), each checked */
    pdctl_kvs_t *pk = &ps.sections[SEC_PLANNER];
    for (size_t i = 0; i < pk->n; i++) {
        pdctl_where(where, sizeof(where), path, pk->v[i].line);
        pdctl_plan_cfg_t pc;
        memset(&pc, 0, sizeof(pc));
        char perr[256];
        pd_status_t s = pd_config_set(&pdctl_plan_schema, &pc, pk->v[i].key, pk->v[i].val,
                                      pk->v[i].key, perr, sizeof(perr));
        pd_config_free(&pdctl_plan_schema, &pc);
        if (s != PD_OK) {
            if (s == PD_ERR_NOT_FOUND)
                pdctl_fail("%s: unknown key \"%s\" in [planner] (see deploy/example.ini)", where,
                           pk->v[i].key);
            else
                pdctl_fail("%s: [planner] %s", where,
                           strncmp(perr, "pdctl: ", 7) == 0 ? perr + 7 : perr);
            goto out;
        }
        pdctl_kvs_set(&dep->planner, pk->v[i].key, pk->v[i].val, pk->v[i].line);
    }
    if (dep->count[PDCTL_PREFILL] == 0) {
        const char *m = pdctl_kvs_get(&dep->role_kv[PDCTL_ROUTER], "disagg-mode");
        if (m != NULL && strcmp(m, "always") == 0) {
            pdctl_fail("%s: prefill = 0 with disagg-mode = always: nothing could serve a request",
                       path);
            goto out;
        }
    }
    rc = 0;
out:
    for (int r = 0; r < PDCTL_ROLE_N; r++)
        free(keys[r]);
    for (int s = 0; s < SEC_N; s++)
        pdctl_kvs_free(&ps.sections[s]);
    if (rc != 0)
        pdctl_dep_free(dep);
    return rc;
}

void pdctl_dep_free(pdctl_dep_t *dep)
{
    free(dep->path);
    free(dep->name);
    free(dep->model);
    free(dep->run_dir);
    free(dep->secret_file);
    for (int r = 0; r < PDCTL_ROLE_N; r++) {
        free(dep->bins[r]);
        pdctl_kvs_free(&dep->role_kv[r]);
    }
    pdctl_kvs_free(&dep->env);
    pdctl_kvs_free(&dep->netns);
    pdctl_kvs_free(&dep->planner);
    memset(dep, 0, sizeof(*dep));
}

void pdctl_router_name(unsigned i, char *buf, size_t cap)
{
    if (i == 0)
        snprintf(buf, cap, "router");
    else
        snprintf(buf, cap, "router-%u", i);
}

int pdctl_router_index(const char *name)
{
    if (strcmp(name, "router") == 0)
        return 0;
    if (strncmp(name, "router-", 7) != 0 || name[7] < '1' || name[7] > '9' || name[8] != '\0')
        return -1;
    return name[7] - '0';
}

bool pdctl_router_addr(const pdctl_dep_t *dep, unsigned i, const char *key, char *buf, size_t cap)
{
    const char *a = pdctl_kvs_get(&dep->role_kv[PDCTL_ROUTER], key);
    if (a == NULL)
        a = strcmp(key, "http") == 0 ? "127.0.0.1:8000" : "127.0.0.1:7000";
    const char *colon = strrchr(a, ':');
    if (colon == NULL)
        return false;
    char *end = NULL;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (end == colon + 1 || *end != '\0' || port > 65535 || (port != 0 && port + i > 65535))
        return false;
    int n = snprintf(buf, cap, "%.*s:%lu", (int)(colon - a), a, port == 0 ? 0 : port + i);
    return n > 0 && (size_t)n < cap;
}

/* "host:port" (or "[v6]:port") with a loopback host: 127/8, ::1, localhost. */
static bool pdctl_addr_loopback(const char *a)
{
    return strncmp(a, "127.", 4) == 0 || strncmp(a, "[::1]:", 6) == 0 ||
           strncmp(a, "localhost:", 10) == 0;
}

char *pdctl_dep_render(const pdctl_dep_t *dep, pdctl_role_t role, const char *name,
                       const char *control_addr, const char *admin_sock,
                       const char *ready_file, const char *secret_file,
                       const char *metrics_listen)
{
    pd_sbuf_t sb = { 0 };
    pd_sbuf_printf(&sb, "# %s: generated by pdctl from %s (deployment %s); edits are lost\n",
                   name, dep->path, dep->name);
    int ri = role == PDCTL_ROUTER ? pdctl_router_index(name) : -1;
    if (role != PDCTL_ROUTER) {
        pd_sbuf_printf(&sb, "id = %s\n", name);
        if (control_addr != NULL)
            pd_sbuf_printf(&sb, "router = %s\n", control_addr);
    } else if (ri > 0) {
        /* router-i of several: its own id and ports (base + i) */
        char http[160], ctl[160];
        if (!pdctl_router_addr(dep, (unsigned)ri, "http", http, sizeof(http)) ||
            !pdctl_router_addr(dep, (unsigned)ri, "control", ctl, sizeof(ctl))) {
            free(pd_sbuf_finish(&sb, NULL));
            return NULL;
        }
        pd_sbuf_printf(&sb, "id = %s\nhttp = %s\ncontrol = %s\n", name, http, ctl);
    }
    pd_sbuf_printf(&sb, "model = %s\n", dep->model);
    pd_sbuf_printf(&sb, "secret-file = %s\n", secret_file ? secret_file : dep->secret_file);
    pd_sbuf_printf(&sb, "admin.socket = %s\n", admin_sock);
    if (ready_file != NULL)
        pd_sbuf_printf(&sb, "ready-file = %s\n", ready_file);
    const pdctl_kvs_t *kv = &dep->role_kv[role];
    /* /metrics on by default: Prometheus scrapes every daemon (the router
     * serves it on its HTTP port) */
    if (metrics_listen != NULL && role != PDCTL_ROUTER &&
        pdctl_kvs_get(kv, "metrics.listen") == NULL)
        pd_sbuf_printf(&sb, "metrics.listen = %s\n", metrics_listen);
    /* the KV plane (UCX) on loopback while the control plane is: the
     * daemons of such a deployment are all on this host. Without it a
     * daemon's UCX tcp listener is on every interface, and whoever
     * reaches it can read the arena (rkeys do not bound tcp gets). */
    char ctl0[160];
    if (role != PDCTL_ROUTER && pdctl_kvs_get(kv, "kv-listen") == NULL &&
        pdctl_router_addr(dep, 0, "control", ctl0, sizeof(ctl0)) && pdctl_addr_loopback(ctl0))
        pd_sbuf_printf(&sb, "kv-listen = 127.0.0.1\n");
    for (size_t i = 0; i < kv->n; i++) {
        if (ri > 0 && (strcmp(kv->v[i].key, "http") == 0 || strcmp(kv->v[i].key, "control") == 0))
            continue;
        pd_sbuf_printf(&sb, "%s = %s\n", kv->v[i].key, kv->v[i].val);
    }
    return pd_sbuf_finish(&sb, NULL);
}
