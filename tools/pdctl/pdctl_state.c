/* pdctl_state.c - the run dir's state: deployment.json (load, save),
 * pdctl.lock, whether a recorded pid still runs its daemon, and the small
 * file helpers pdctl's commands share.
 *
 * Run dir layout (mode 0700):
 *   deployment.json   state: url, control address, daemons {name, role, pid,
 *                     started, paths}; rewritten atomically on every change
 *   deployment.ini    snapshot of the deployment file `up` used (+ sets in
 *                     deployment.json), so `scale` starts identical daemons
 *   secret            deployment secret (64 hex chars, 0600), made if absent
 *   <name>.ini .log .pid .sock .ready   per daemon
 *   pdctl.lock        flock: one pdctl changes the deployment at a time
 */
#include "pdctl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pd_sbuf.h"

static const char *const pdctl_bin_names[] = {
#define PDCTL_X_ROLE(id, name, bin) bin,
    PDCTL_ROLES(PDCTL_X_ROLE)
#undef PDCTL_X_ROLE
};

const char *pdctl_default_run_dir(void)
{
    const char *e = getenv("PD_RUN_DIR");
    return e != NULL && e[0] != '\0' ? e : "run";
}

/* ---- small file helpers ---------------------------------------------------- */

char *pdctl_read_file(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    pd_sbuf_t sb = PD_SBUF_INIT;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        pd_sbuf_append(&sb, buf, n);
    fclose(f);
    return pd_sbuf_finish(&sb, len_p);
}

int pdctl_write_file(const char *path, const char *text, mode_t mode)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0)
        return -1;
    size_t len = strlen(text), off = 0;
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            close(fd);
            unlink(tmp);
            return -1;
        }
        off += (size_t)w;
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

int pdctl_mkdir_p(const char *dir)
{
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s", dir);
    for (char *s = p + 1; *s; s++) {
        if (*s == '/') {
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return -1;
            *s = '/';
        }
    }
    if (mkdir(p, 0700) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* ---- state -------------------------------------------------------------------- */

void pdctl_state_path(const char *run_dir, char *buf, size_t cap)
{
    pdctl_fmt(buf, cap, "%s/deployment.json", run_dir);
}

static void pdctl_cpy(char *dst, size_t cap, const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    snprintf(dst, cap, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

int pdctl_state_load(const char *run_dir, pdctl_state_t *st)
{
    memset(st, 0, sizeof(*st));
    st->lock_fd = -1;
    char path[PATH_MAX];
    char abs[PATH_MAX];
    if (realpath(run_dir, abs) == NULL) {
        fprintf(stderr, "pdctl: run dir %s: %s (no deployment started there; "
                "`pdctl up FILE` or --run-dir D)\n", run_dir, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    pdctl_state_path(abs, path, sizeof(path));
    char *text = pdctl_read_file(path, NULL);
    if (text == NULL) {
        fprintf(stderr, "pdctl: no deployment in %s (%s: %s)\n", abs, path, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(j, "daemons");
    if (j == NULL || !cJSON_IsArray(ds)) {
        fprintf(stderr, "pdctl: %s is corrupt (not the JSON pdctl writes)\n", path);
        cJSON_Delete(j);
        return PDCTL_EXIT_FAIL;
    }
    if (!pdctl_fmt(st->run_dir, sizeof(st->run_dir), "%s", abs)) {
        fprintf(stderr, "pdctl: run dir path too long: %s\n", abs);
        return PDCTL_EXIT_FAIL;
    }
    pdctl_cpy(st->dep_file, sizeof(st->dep_file), j, "deployment_file");
    pdctl_cpy(st->name, sizeof(st->name), j, "name");
    pdctl_cpy(st->url, sizeof(st->url), j, "url");
    pdctl_cpy(st->control, sizeof(st->control), j, "control");
    st->installed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "installed"));
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(j, "etcd");
    if (et != NULL) {
        st->etcd_pid = (pid_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(et, "pid"));
        pdctl_cpy(st->etcd_url, sizeof(st->etcd_url), et, "url");
    }
    const cJSON *d;
    cJSON_ArrayForEach(d, ds) {
        if (st->n == PDCTL_MAX_DAEMONS)
            break;
        pdctl_daemon_t *x = &st->d[st->n];
        pdctl_cpy(x->name, sizeof(x->name), d, "name");
        char role[16];
        pdctl_cpy(role, sizeof(role), d, "role");
        x->role = pdctl_role_parse(role);
        x->pid = (pid_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(d, "pid"));
        x->started_unix = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(d, "started"));
        pdctl_cpy(x->sock, sizeof(x->sock), d, "admin_socket");
        pdctl_cpy(x->log, sizeof(x->log), d, "log");
        pdctl_cpy(x->cfg, sizeof(x->cfg), d, "config");
        pdctl_cpy(x->ready, sizeof(x->ready), d, "ready_file");
        pdctl_cpy(x->unit, sizeof(x->unit), d, "unit");
        if (x->role == PDCTL_ROLE_N || x->name[0] == '\0')
            continue;
        st->n++;
    }
    cJSON_Delete(j);
    return 0;
}

cJSON *pdctl_sets_json;  /* the --set list `up` was given (saved in the state) */

int pdctl_state_save(const pdctl_state_t *st)
{
    char path[PATH_MAX];
    pdctl_state_path(st->run_dir, path, sizeof(path));
    /* keep the saved sets of an existing state */
    cJSON *sets = NULL;
    char *old = pdctl_read_file(path, NULL);
    if (old != NULL) {
        cJSON *o = cJSON_Parse(old);
        sets = cJSON_DetachItemFromObjectCaseSensitive(o, "sets");
        cJSON_Delete(o);
        free(old);
    }
    if (pdctl_sets_json != NULL) {
        cJSON_Delete(sets);
        sets = cJSON_Duplicate(pdctl_sets_json, true);
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", st->name);
    cJSON_AddStringToObject(j, "deployment_file", st->dep_file);
    cJSON_AddItemToObject(j, "sets", sets != NULL ? sets : cJSON_CreateArray());
    cJSON_AddStringToObject(j, "url", st->url);
    cJSON_AddStringToObject(j, "control", st->control);
    if (st->installed)
        cJSON_AddBoolToObject(j, "installed", 1);
    if (st->etcd_pid > 0) {
        cJSON *et = cJSON_AddObjectToObject(j, "etcd");
        cJSON_AddNumberToObject(et, "pid", st->etcd_pid);
        cJSON_AddStringToObject(et, "url", st->etcd_url);
    }
    cJSON *arr = cJSON_AddArrayToObject(j, "daemons");
    for (int i = 0; i < st->n; i++) {
        const pdctl_daemon_t *x = &st->d[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", x->name);
        cJSON_AddStringToObject(o, "role", pdctl_role_name(x->role));
        cJSON_AddNumberToObject(o, "pid", x->pid);
        cJSON_AddNumberToObject(o, "started", (double)x->started_unix);
        cJSON_AddStringToObject(o, "admin_socket", x->sock);
        cJSON_AddStringToObject(o, "log", x->log);
        cJSON_AddStringToObject(o, "config", x->cfg);
        cJSON_AddStringToObject(o, "ready_file", x->ready);
        if (x->unit[0] != '\0')
            cJSON_AddStringToObject(o, "unit", x->unit);
        cJSON_AddItemToArray(arr, o);
    }
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (text == NULL)
        return PDCTL_EXIT_FAIL;
    int rc = pdctl_write_file(path, text, 0600);
    free(text);
    if (rc != 0) {
        fprintf(stderr, "pdctl: cannot write %s: %s\n", path, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    return 0;
}

int pdctl_state_lock(pdctl_state_t *st)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/pdctl.lock", st->run_dir);
    st->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (st->lock_fd < 0) {
        fprintf(stderr, "pdctl: cannot open %s: %s\n", path, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    if (flock(st->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr, "pdctl: another pdctl is changing the deployment in %s (waiting)\n",
                st->run_dir);
        if (flock(st->lock_fd, LOCK_EX) != 0) {
            close(st->lock_fd);
            st->lock_fd = -1;
            return PDCTL_EXIT_FAIL;
        }
    }
    return 0;
}

int pdctl_state_load_locked(const char *run_dir, pdctl_state_t *st)
{
    int rc = pdctl_state_load(run_dir, st);
    return rc != 0 ? rc : pdctl_state_lock(st);
}

void pdctl_state_unlock(pdctl_state_t *st)
{
    if (st->lock_fd >= 0)
        close(st->lock_fd);
    st->lock_fd = -1;
}

pdctl_daemon_t *pdctl_state_find(pdctl_state_t *st, const char *name)
{
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->d[i].name, name) == 0)
            return &st->d[i];
    return NULL;
}

/* pid is alive and runs the binary named want (pids get reused). */
bool pdctl_pid_runs(pid_t pid, const char *want)
{
    if (pid <= 0)
        return false;
    /* our own child that exited: reap it (a zombie still answers kill 0) */
    int status;
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid)
        return false;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    char *stat = pdctl_read_file(path, NULL);
    if (stat == NULL)
        return false;
    const char *rp = strrchr(stat, ')');
    bool zombie = rp != NULL && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
    free(stat);
    if (zombie)
        return false;
    /* the pid must still run the daemon's binary (pids get reused) */
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    size_t len = 0;
    char *cmd = pdctl_read_file(path, &len);
    if (cmd == NULL)
        return false;
    if (len == 0) {
        /* a process in the middle of exiting (its memory is gone, it is not
         * a zombie yet) has an empty cmdline: still alive, wait for it */
        free(cmd);
        return true;
    }
    bool match = false;
    for (size_t off = 0; off < len; off += strlen(cmd + off) + 1) {
        const char *b = strrchr(cmd + off, '/');
        if (strcmp(b ? b + 1 : cmd + off, want) == 0) {
            match = true;
            break;
        }
    }
    free(cmd);
    return match;
}

bool pdctl_daemon_alive(const pdctl_daemon_t *d)
{
    if (d->pid == 0 && d->unit[0] != '\0') {
        /* systemd runs it: alive when its admin socket accepts */
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        if (strlen(d->sock) >= sizeof(a.sun_path))
            return false;
        memcpy(a.sun_path, d->sock, strlen(d->sock) + 1);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool up = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        if (fd >= 0)
            close(fd);
        return up;
    }
    return pdctl_pid_runs(d->pid, d->role < PDCTL_ROLE_N ? pdctl_bin_names[d->role] : "");
}

int pdctl_refuse_installed(const pdctl_state_t *st, const char *cmd)
{
    if (!st->installed)
        return 0;
    fprintf(stderr, "pdctl: %s: the deployment in %s is installed (pdctl render) and run by "
            "systemd: use systemctl (start|stop pdserve.target, enable --now "
            "pd-decode@decode-N, ...)\n", cmd, st->run_dir);
    return PDCTL_EXIT_USAGE;
}

bool pdctl_etcd_alive(const pdctl_state_t *st)
{
    return pdctl_pid_runs(st->etcd_pid, "etcd");
}
