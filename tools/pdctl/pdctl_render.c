/* pdctl_render.c - `check` and `render`: a deployment's daemon config files,
 * checked by each daemon's own parser (check) or written with env and secret
 * for the systemd units (render). */
#include "pdctl.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pd_sbuf.h"

int pdctl_run_rendered(const pdctl_dep_t *dep, pdctl_role_t r, const char *ca,
                       const char *flag, bool flag_first, int out_fd, char *out, size_t cap,
                       char tmp_name[PDCTL_TMP_NAME])
{
    char *text = pdctl_dep_render(dep, r, "check", ca, "/nonexistent/pdctl-check.sock", NULL,
                                  NULL, NULL);
    char tmp[PDCTL_TMP_NAME] = "/tmp/pdctl-check-XXXXXX";
    int tfd = text != NULL ? mkstemp(tmp) : -1;
    if (tfd < 0) {
        free(text);
        fprintf(stderr, "pdctl: cannot write a temporary file: %s\n", strerror(errno));
        return -1;
    }
    snprintf(tmp_name, PDCTL_TMP_NAME, "%s", tmp);
    size_t len = strlen(text);
    bool wrote = write(tfd, text, len) == (ssize_t)len;
    close(tfd);
    free(text);
    int fds[2];
    if (!wrote || pipe(fds) != 0) {
        unlink(tmp);
        return -1;
    }
    char cfg[PATH_MAX + 16];
    snprintf(cfg, sizeof(cfg), "--config=%s", tmp);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], out_fd);
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, out_fd == 1 ? 2 : 1);
        }
        close(fds[0]);
        close(fds[1]);
        execl(dep->bins[r], dep->bins[r], flag_first ? flag : cfg, flag_first ? cfg : flag,
              (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t k;
    while (pid > 0 && n < cap - 1 && (k = read(fds[0], out + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    out[n] = '\0';
    close(fds[0]);
    int status = 0;
    while (pid > 0 && waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    unlink(tmp);
    if (pid < 0 || !WIFEXITED(status))
        return 1;
    return WEXITSTATUS(status);
}

/* Run `bin --check-config --config=<the rendered file>`: the daemon's own
 * parser checks every value (type, range, enum). 0, or 1 with its message
 * on stderr. */
static int pdctl_check_values(const pdctl_dep_t *dep, pdctl_role_t r, const char *file,
                              const char *ca)
{
    char msg[1024], tmp[PDCTL_TMP_NAME];
    int rc = pdctl_run_rendered(dep, r, ca, "--check-config", true, 2, msg, sizeof(msg), tmp);
    if (rc < 0)
        return 1;
    if (rc != 0) {
        /* the daemon names the key; say which section it came from */
        char *nl = strchr(msg, '\n');
        if (nl != NULL)
            *nl = '\0';
        const char *m = strstr(msg, ": ");
        if (m != NULL && strncmp(m + 2, tmp, strlen(tmp)) == 0) {
            const char *after = strstr(m + 2 + strlen(tmp), ": "); /* ":LINE: " */
            if (after != NULL)
                m = after;
        }
        fprintf(stderr, "pdctl: %s: [%s] %s\n", file, pdctl_role_name(r),
                m != NULL ? m + 2 : (msg[0] ? msg : "value check failed"));
        return 1;
    }
    return 0;
}

int pdctl_cmd_check(int argc, char **argv)
{
    char *sets[PDCTL_MAX_SETS];
    int n_sets = 0;
    if (pdctl_take_sets(&argc, argv, sets, &n_sets) != 0 || argc != 1) {
        fprintf(stderr, "usage: pdctl check FILE [--set section.key=value ...]\n");
        return PDCTL_EXIT_USAGE;
    }
    pdctl_dep_t dep;
    int rc = pdctl_dep_load(argv[0], sets, n_sets, NULL, &dep);
    if (rc != 0)
        return rc;
    const char *ca = pdctl_kvs_get(&dep.role_kv[PDCTL_ROUTER], "control");
    /* The daemons' --check-config loads the secret as they would at boot.
     * One that `pdctl up` creates does not exist yet: check against a
     * throwaway secret instead (a secret-file the deployment names is
     * checked as it is). */
    char tmpsec[] = "/tmp/pdctl-secret-XXXXXX";
    bool made = false;
    if (!dep.secret_given && access(dep.secret_file, F_OK) != 0) {
        char hex[65];
        int fd = mkstemp(tmpsec);
        char *dup = fd >= 0 ? strdup(tmpsec) : NULL;
        if (dup != NULL && pdctl_secret_hex(hex) == 0 && write(fd, hex, 64) == 64) {
            free(dep.secret_file);
            dep.secret_file = dup;
            made = true;
        } else {
            free(dup);
        }
        if (fd >= 0)
            close(fd);
        if (fd >= 0 && !made)
            unlink(tmpsec);
    }
    for (int r = 0; r < PDCTL_ROLE_N; r++) {
        if (pdctl_check_values(&dep, (pdctl_role_t)r, argv[0],
                               ca ? ca : "127.0.0.1:7000") != 0) {
            if (made)
                unlink(tmpsec);
            pdctl_dep_free(&dep);
            return PDCTL_EXIT_USAGE;
        }
    }
    if (made)
        unlink(tmpsec);
    if (pdctl_mem_plan_check(&dep, dep.count, NULL) != 0) {
        pdctl_dep_free(&dep);
        return PDCTL_EXIT_FAIL;
    }
    printf("%s: ok: deployment \"%s\", model %s, %u router%s, %u prefill, %u decode, run dir %s\n",
           argv[0], dep.name, dep.model, dep.count[PDCTL_ROUTER],
           dep.count[PDCTL_ROUTER] == 1 ? "" : "s", dep.count[PDCTL_PREFILL],
           dep.count[PDCTL_DECODE], dep.run_dir);
    pdctl_dep_free(&dep);
    return 0;
}

/* The group the rendered files belong to: --group NAME|GID, else "pdserve"
 * if it exists (the units run as User=pdserve), else none (-1). */
static int pdctl_render_group(const char *want, gid_t *gid_p)
{
    if (want != NULL) {
        char *end;
        unsigned long g = strtoul(want, &end, 10);
        if (want[0] != '\0' && *end == '\0') {
            *gid_p = (gid_t)g;
            return 0;
        }
        struct group *gr = getgrnam(want);
        if (gr == NULL) {
            fprintf(stderr, "pdctl: render: no group \"%s\"\n", want);
            return PDCTL_EXIT_USAGE;
        }
        *gid_p = gr->gr_gid;
        return 0;
    }
    struct group *gr = getgrnam("pdserve");
    *gid_p = gr != NULL ? gr->gr_gid : (gid_t)-1;
    if (gr == NULL)
        fprintf(stderr, "pdctl: render: no group pdserve on this host (install the package, or "
                "--group G): files stay readable by their owner only\n");
    return 0;
}

/* Write a rendered file 0640 owner:gid (gid -1: 0600, owner only). */
static int pdctl_render_write(const char *path, const char *text, gid_t gid)
{
    if (pdctl_write_file(path, text, gid == (gid_t)-1 ? 0600 : 0640) != 0)
        return -1;
    if (gid != (gid_t)-1 && (chown(path, (uid_t)-1, gid) != 0 || chmod(path, 0640) != 0)) {
        fprintf(stderr, "pdctl: %s: cannot give it to group %u: %s (run as root?)\n", path,
                (unsigned)gid, strerror(errno));
        return -1;
    }
    return 0;
}

/* The deployment secret for rendered configs: kept if present (only its
 * group and mode are fixed), else 32 random bytes in hex, 0640 root:gid. */
static int pdctl_render_secret(const char *path, gid_t gid)
{
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (sb.st_size < 32) {
            fprintf(stderr, "pdctl: secret file %s is shorter than 32 bytes\n", path);
            return PDCTL_EXIT_FAIL;
        }
        if (gid != (gid_t)-1 && sb.st_gid != gid &&
            (chown(path, (uid_t)-1, gid) != 0 || chmod(path, 0640) != 0)) {
            fprintf(stderr, "pdctl: %s: cannot give it to group %u: %s\n", path, (unsigned)gid,
                    strerror(errno));
            return PDCTL_EXIT_FAIL;
        }
        return 0;
    }
    char hex[66];
    if (pdctl_secret_hex(hex) != 0)
        return PDCTL_EXIT_FAIL;
    strcat(hex, "\n");
    if (pdctl_render_write(path, hex, gid) != 0) {
        fprintf(stderr, "pdctl: cannot write secret %s: %s\n", path, strerror(errno));
        return PDCTL_EXIT_FAIL;
    }
    printf("%s (new secret: copy it to every host of the deployment)\n", path);
    return 0;
}

/* [env] as a systemd EnvironmentFile (KEY="value"). */
static char *pdctl_render_env(const pdctl_dep_t *dep)
{
    pd_sbuf_t sb = { 0 };
    pd_sbuf_printf(&sb, "# environment of every pdserve daemon: [env] of %s; "
                   "generated by pdctl render, edits are lost\n", dep->path);
    for (size_t i = 0; i < dep->env.n; i++) {
        pd_sbuf_printf(&sb, "%s=\"", dep->env.v[i].key);
        for (const char *c = dep->env.v[i].val; *c; c++) {
            if (*c == '"' || *c == '\\' || *c == '$' || *c == '`')
                pd_sbuf_append(&sb, "\\", 1);
            pd_sbuf_append(&sb, c, 1);
        }
        pd_sbuf_printf(&sb, "\"\n");
    }
    return pd_sbuf_finish(&sb, NULL);
}

int pdctl_cmd_render(int argc, char **argv)
{
    char *sets[PDCTL_MAX_SETS];
    int n_sets = 0;
    pdctl_opts_t o = { 0 };
    bool have_run = false;
    for (int i = 0; i < argc; i++)
        have_run |= strncmp(argv[i], "--run-dir", 9) == 0;
    if (pdctl_take_sets(&argc, argv, sets, &n_sets) != 0)
        return PDCTL_EXIT_USAGE;
    pdctl_parse_opts(&argc, argv, &o);
    const char *group = NULL;
    int out_n = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--group") == 0 && i + 1 < argc)
            group = argv[++i];
        else if (strncmp(argv[i], "--group=", 8) == 0)
            group = argv[i] + 8;
        else
            argv[out_n++] = argv[i];
    }
    argc = out_n;
    if (argc != 2) {
        fprintf(stderr, "usage: pdctl render FILE OUTDIR [--run-dir /run/pdserve] [--group pdserve] "
                "[--set ...]\n"
                "  writes router.ini, prefill-N.ini, decode-N.ini, env (from [env]) and, if absent,\n"
                "  the secret, 0640 root:pdserve, for the systemd units (OUTDIR: /etc/pdserve)\n");
        return PDCTL_EXIT_USAGE;
    }
    gid_t gid;
    int grc = pdctl_render_group(group, &gid);
    if (grc != 0)
        return grc;
    const char *run = have_run ? o.run_dir : "/run/pdserve";
    pdctl_dep_t dep;
    int rc = pdctl_dep_load(argv[0], sets, n_sets, run, &dep);
    if (rc != 0)
        return rc;
    if (dep.ep > 1) { /* the units are one process per decode */
        fprintf(stderr, "pdctl: render %s: EP decode groups (ep = %u) under systemd are not "
                "built yet; use pdctl up\n", argv[0], dep.ep);
        pdctl_dep_free(&dep);
        return PDCTL_EXIT_USAGE;
    }
    rc = PDCTL_EXIT_FAIL;
    char ca[PDCTL_MAX_ROUTERS * 170] = "";
    for (unsigned i = 0; i < dep.count[PDCTL_ROUTER]; i++) {
        char one[160];
        const char *colon;
        if (!pdctl_router_addr(&dep, i, "control", one, sizeof(one)) ||
            (colon = strrchr(one, ':')) == NULL || atoi(colon + 1) == 0) {
            fprintf(stderr, "pdctl: render needs a fixed [router] control port\n");
            goto out;
        }
        snprintf(ca + strlen(ca), sizeof(ca) - strlen(ca), "%s%s", i ? "," : "", one);
    }
    if (pdctl_mkdir_p(argv[1]) != 0) {
        fprintf(stderr, "pdctl: cannot create %s: %s\n", argv[1], strerror(errno));
        goto out;
    }
    /* the secret is persistent and next to the configs (OUTDIR/secret, not
     * on the run dir's tmpfs) unless the file names an absolute one */
    char outdir[PATH_MAX], secret[PATH_MAX], envf[PATH_MAX];
    if (realpath(argv[1], outdir) == NULL ||
        !pdctl_fmt(secret, sizeof(secret), "%s/secret", outdir) ||
        !pdctl_fmt(envf, sizeof(envf), "%s/env", outdir)) {
        fprintf(stderr, "pdctl: %s: %s\n", argv[1], strerror(errno ? errno : ENAMETOOLONG));
        goto out;
    }
    const char *secret_file = dep.secret_given ? dep.secret_file : secret;
    if (!dep.secret_given && pdctl_render_secret(secret_file, gid) != 0)
        goto out;
    char *env = pdctl_render_env(&dep);
    if (env == NULL || pdctl_render_write(envf, env, gid) != 0) {
        fprintf(stderr, "pdctl: cannot write %s: %s\n", envf, strerror(errno));
        free(env);
        goto out;
    }
    free(env);
    printf("%s\n", envf);
    /* deployment.json beside the configs: `pdctl --run-dir OUTDIR status|top|
     * drain|ready|maint|logs` against the installed daemons (systemd runs
     * them: no pids, logs in the journal, alive = the admin socket answers) */
    pdctl_state_t ist;
    memset(&ist, 0, sizeof(ist));
    ist.lock_fd = -1;
    ist.installed = true;
    if (!pdctl_fmt(ist.run_dir, sizeof(ist.run_dir), "%s", outdir)) {
        fprintf(stderr, "pdctl: %s: path too long\n", outdir);
        goto out;
    }
    snprintf(ist.name, sizeof(ist.name), "%s", dep.name);
    snprintf(ist.control, sizeof(ist.control), "%s", ca);
    {
        char http[160];
        if (pdctl_router_addr(&dep, 0, "http", http, sizeof(http)))
            (void)pdctl_fmt(ist.url, sizeof(ist.url), "http://%s", http);
    }
    for (int r = 0; r < PDCTL_ROLE_N; r++) {
        for (unsigned i = 0; i < dep.count[r]; i++) {
            char name[48], sock[PATH_MAX], out[PATH_MAX];
            if (r == PDCTL_ROUTER)
                pdctl_router_name(i, name, sizeof(name));
            else
                snprintf(name, sizeof(name), "%s-%u", pdctl_role_name((pdctl_role_t)r), i);
            snprintf(sock, sizeof(sock), "%s/%s.sock", run, name);
            snprintf(out, sizeof(out), "%s/%s.ini", argv[1], name);
            /* fixed metrics ports for Prometheus: prefill-N 9200+N, decode-N 9300+N */
            char metrics[64];
            snprintf(metrics, sizeof(metrics), "127.0.0.1:%u",
                     (r == PDCTL_PREFILL ? 9200u : 9300u) + i);
            char *text = pdctl_dep_render(&dep, (pdctl_role_t)r, name, ca, sock, NULL,
                                          secret_file, metrics);
            if (text == NULL || pdctl_render_write(out, text, gid) != 0) {
                fprintf(stderr, "pdctl: cannot write %s: %s\n", out, strerror(errno));
                free(text);
                goto out;
            }
            free(text);
            printf("%s\n", out);
            if (ist.n < PDCTL_MAX_DAEMONS) {
                pdctl_daemon_t *x = &ist.d[ist.n++];
                snprintf(x->name, sizeof(x->name), "%s", name);
                x->role = (pdctl_role_t)r;
                if (!pdctl_fmt(x->sock, sizeof(x->sock), "%s", sock) ||
                    !pdctl_fmt(x->cfg, sizeof(x->cfg), "%s", out)) {
                    fprintf(stderr, "pdctl: %s: path too long\n", out);
                    goto out;
                }
                if (r == PDCTL_ROUTER)
                    snprintf(x->unit, sizeof(x->unit), i == 0 ? "pd-router.service"
                                                              : "pd-router@%s.service", name);
                else
                    snprintf(x->unit, sizeof(x->unit), "pd-%s@%s.service",
                             pdctl_role_name((pdctl_role_t)r), name);
            }
        }
    }
    if (pdctl_state_save(&ist) != 0)
        goto out;
    {
        char sp[PATH_MAX];
        pdctl_state_path(outdir, sp, sizeof(sp));
        if (gid != (gid_t)-1 && (chown(sp, (uid_t)-1, gid) != 0 || chmod(sp, 0640) != 0)) {
            fprintf(stderr, "pdctl: %s: cannot give it to group %u: %s\n", sp, (unsigned)gid,
                    strerror(errno));
            goto out;
        }
        printf("%s\n", sp);
    }
    rc = 0;
out:
    pdctl_dep_free(&dep);
    return rc;
}
