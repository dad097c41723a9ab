/* pdctl.h - pdctl internals: the deployment file (pdctl_conf.c), the run-dir
 * state (pdctl_state.c), daemon processes (pdctl_proc.c), check and render
 * (pdctl_render.c), admin-socket / HTTP queries and their rendering
 * (pdctl_query.c), one-daemon commands (pdctl_ops.c). pdctl.c is the command
 * table and the option parsing the commands share.
 *
 * Exit codes of every command: 0 ok, 1 runtime failure (a daemon did not
 * start, a socket did not answer...), 2 usage or a bad deployment file. */
#ifndef PDCTL_H
#define PDCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#define PDCTL_EXIT_FAIL  1
#define PDCTL_EXIT_USAGE 2

#define PDCTL_MAX_PER_ROLE 32
#define PDCTL_MAX_ROUTERS 8
#define PDCTL_MAX_EP 8     /* ranks of one EP decode group */
/* the router's max-retries pdctl sets for a deployment with EP groups when
 * the file does not: the router's default (2) + ep - 1 (pdctl_dep_load) */
#define PDCTL_EP_MAX_RETRIES(ep) ((ep) + 1u)
#define PDCTL_MAX_DAEMONS (PDCTL_MAX_ROUTERS + 2 * PDCTL_MAX_PER_ROLE)

/* X(id, section / role name, binary name) */
#define PDCTL_ROLES(X)                          \
    X(ROUTER,  "router",  "pd-router")          \
    X(PREFILL, "prefill", "pd-prefill")         \
    X(DECODE,  "decode",  "pd-decode")

typedef enum {
#define PDCTL_X_ROLE(id, name, bin) PDCTL_##id,
    PDCTL_ROLES(PDCTL_X_ROLE)
#undef PDCTL_X_ROLE
    PDCTL_ROLE_N
} pdctl_role_t;

const char *pdctl_role_name(pdctl_role_t role);
/* PDCTL_ROLE_N if unknown. */
pdctl_role_t pdctl_role_parse(const char *name);

/* One `key = value` from the file (or --set), with where it came from. */
typedef struct {
    char *key;
    char *val;
    int line;                  /* 0: from --set or derived */
} pdctl_kv_t;

typedef struct {
    pdctl_kv_t *v;
    size_t n, cap;
} pdctl_kvs_t;

/* A parsed deployment file. Paths are absolute once pdctl_dep_load returns. */
typedef struct {
    char *path;                /* the deployment file */
    char *name;                /* [deployment] name */
    char *model;
    char *run_dir;
    char *secret_file;
    bool secret_given;         /* secret-file was an absolute path in the file */
    char *bins[PDCTL_ROLE_N];  /* daemon binaries */
    unsigned count[PDCTL_ROLE_N];        /* router: [deployment] routers (1..8);
                                            decode: instances (each ep ranks) */
    unsigned ep;               /* [decode] ep: ranks per decode instance
                                  (an EP group, issue 36); 1: whole daemons */
    unsigned whole;            /* [decode] whole: of the `decode` instances,
                                  the last `whole` hold the whole model (one
                                  process each) beside the groups; 0 with ep 1 */
    uint64_t ready_timeout_ns, stop_timeout_ns;
    unsigned etcd_port;        /* etcd = local[:PORT]: pdctl runs etcd on 127.0.0.1:PORT (0: no) */
    pdctl_kvs_t role_kv[PDCTL_ROLE_N];   /* daemon config keys per role */
    pdctl_kvs_t env;           /* [env] NAME = value for every daemon */
    pdctl_kvs_t netns;         /* [netns] daemon-name = namespace */
    pdctl_kvs_t planner;       /* [planner] rows (pdctl_plan_schema), checked */
} pdctl_dep_t;

/* Parse `path`, apply `sets` ("section.key=value", n_sets of them) on top,
 * resolve binaries and the model, validate every daemon key against the
 * daemon's own --help table. On failure prints ONE clear line
 * ("pdctl: FILE:LINE: ...") to stderr and returns PDCTL_EXIT_USAGE (bad
 * file) or PDCTL_EXIT_FAIL (binary missing); 0 on success. */
int pdctl_dep_load(const char *path, char *const *sets, int n_sets,
                   const char *run_dir_override, pdctl_dep_t *dep);
void pdctl_dep_free(pdctl_dep_t *dep);
/* The config file text of one daemon (caller frees): role keys plus the
 * keys pdctl manages (id, router, secret-file, admin.socket, ready-file).
 * secret_file: NULL for dep->secret_file. metrics_listen: the prefill's or
 * decode's metrics.listen unless the file sets one (NULL: none). */
/* Render role r's config (control address ca) to a temporary file and run
 * `bin FLAG --config=<file>` (flag_first) or `bin --config=<file> FLAG`,
 * capturing its fd out_fd (1 or 2; the other and stdin are /dev/null) into
 * out (cap bytes, NUL-terminated). The file's name goes to tmp_name (it is
 * gone when this returns: for trimming it out of a message). The exit
 * status (1 if it did not exit), or -1 (printed) when the file could not be
 * written. */
#define PDCTL_TMP_NAME 32
int pdctl_run_rendered(const pdctl_dep_t *dep, pdctl_role_t r, const char *ca,
                       const char *flag, bool flag_first, int out_fd, char *out, size_t cap,
                       char tmp_name[PDCTL_TMP_NAME]);

char *pdctl_dep_render(const pdctl_dep_t *dep, pdctl_role_t role, const char *name,
                       const char *control_addr, const char *admin_sock,
                       const char *ready_file, const char *secret_file,
                       const char *metrics_listen);
/* Router i's name: "router" for 0 (one-router deployments keep it), else
 * "router-<i>"; and back (-1: not a router name). */
void pdctl_router_name(unsigned i, char *buf, size_t cap);
int pdctl_router_index(const char *name);
/* Router i's `key` address ("http" or "control"): the [router] value (or
 * the router's default 127.0.0.1:8000 / :7000) with the port + i (port 0
 * stays 0: any). false if it does not fit or has no port. */
bool pdctl_router_addr(const pdctl_dep_t *dep, unsigned i, const char *key, char *buf, size_t cap);
/* The value of a role key, or NULL. */
const char *pdctl_kvs_get(const pdctl_kvs_t *kvs, const char *key);
void pdctl_kvs_set(pdctl_kvs_t *kvs, const char *key, const char *val, int line);
void pdctl_kvs_free(pdctl_kvs_t *kvs);
/* Directory holding the daemon binaries (PD_BIN_DIR, next to pdctl, or the
 * meson build tree pdctl sits in). Static buffer. NULL if not found. */
const char *pdctl_bin_dir(pdctl_role_t role, char *buf, size_t cap);

/* ---- run-dir state (deployment.json) -------------------------------------- */

typedef struct {
    char name[48];             /* router, prefill-0, decode-3 ... */
    pdctl_role_t role;
    pid_t pid;
    int64_t started_unix;      /* wall clock seconds */
    char sock[256], log[256], cfg[256], ready[256];
    char unit[96];             /* installed (pdctl render): its systemd unit, pid 0,
                                  log in the journal; "" when pdctl up runs it */
} pdctl_daemon_t;

typedef struct {
    char run_dir[256];
    char dep_file[256];        /* copy of the deployment file in the run dir */
    char name[64];
    char url[128];             /* http://host:port of the first router */
    char control[1024];        /* host:port[,host:port...]: the routers the daemons connect to */
    int n;
    pdctl_daemon_t d[PDCTL_MAX_DAEMONS];
    pid_t etcd_pid;            /* the etcd pdctl started (etcd = local), 0: none */
    char etcd_url[64];         /* its client URL */
    bool installed;            /* written by `pdctl render`: systemd runs the daemons */
    int lock_fd;
} pdctl_state_t;

/* An installed deployment (pdctl render; systemd runs it): commands that
 * start or stop processes say so and name the systemctl command instead.
 * 0, or PDCTL_EXIT_USAGE with the message printed. */
int pdctl_refuse_installed(const pdctl_state_t *st, const char *cmd);

/* Default run dir: $PD_RUN_DIR, else ./run. */
const char *pdctl_default_run_dir(void);
/* Load <run_dir>/deployment.json. Prints a clear error, returns exit code. */
int pdctl_state_load(const char *run_dir, pdctl_state_t *st);
int pdctl_state_save(const pdctl_state_t *st);
/* flock the run dir (one pdctl changing it at a time). */
int pdctl_state_lock(pdctl_state_t *st);
/* pdctl_state_load() then pdctl_state_lock(). */
int pdctl_state_load_locked(const char *run_dir, pdctl_state_t *st);
void pdctl_state_unlock(pdctl_state_t *st);
pdctl_daemon_t *pdctl_state_find(pdctl_state_t *st, const char *name);
/* An EP group's rank: name decode-<group>.r<rank> (pdctl_proc.c). */
bool pdctl_ep_rank_of(const char *name, unsigned *group_p, unsigned *rank_p);
/* Decode processes of a deployment's `decode` instances: the groups' ranks
 * plus the whole daemons. */
unsigned pdctl_dep_decode_procs(const pdctl_dep_t *dep);
/* Is the pid alive and still running the daemon's binary? */
bool pdctl_daemon_alive(const pdctl_daemon_t *d);
/* The etcd pdctl started for the deployment (etcd = local) still runs. */
bool pdctl_etcd_alive(const pdctl_state_t *st);
/* pid is alive (not a zombie) and runs the binary named want. */
bool pdctl_pid_runs(pid_t pid, const char *want);
/* <run_dir>/deployment.json */
void pdctl_state_path(const char *run_dir, char *buf, size_t cap);
/* The --set list `up` was given; pdctl_state_save() stores it when set,
 * else keeps the one already in the state. */
extern cJSON *pdctl_sets_json;

/* Small file helpers (pdctl_state.c). The whole file, NUL-terminated
 * (caller frees; length in *len_p if not NULL), or NULL. */
char *pdctl_read_file(const char *path, size_t *len_p);
/* Replace path atomically (path.tmp, then rename) with text; 0 or -1 (errno). */
int pdctl_write_file(const char *path, const char *text, mode_t mode);
/* mkdir -p: parents 0755, dir itself 0700; 0 or -1 (errno). */
int pdctl_mkdir_p(const char *dir);
/* A new deployment secret (pdctl_proc.c): 32 random bytes as 64 hex
 * digits + NUL. 0 or PDCTL_EXIT_FAIL (printed). */
int pdctl_secret_hex(char hex[65]);

/* The host's memory budget (common/pd_memledger.h) before anything starts:
 * add[role] more prefill / decode daemons (named <role>-<first[role] + i>;
 * first NULL: from 0), each with the arena its binary reports for the
 * deployment's config (--print-arena-bytes), beside the live entries of
 * the ledger (mem.ledger), under mem.budget if set. 0, or PDCTL_EXIT_FAIL
 * with the sentence naming every share (printed). */
int pdctl_mem_plan_check(const pdctl_dep_t *dep, const unsigned add[PDCTL_ROLE_N],
                         unsigned first[PDCTL_ROLE_N]);

/* The deployment of a run dir, re-parsed from its snapshot with the --set
 * list `up` was given (scale, autoscale). 0 or an exit code (printed). */
int pdctl_dep_of_state(const pdctl_state_t *st, pdctl_dep_t *dep);

int pdctl_cmd_up(int argc, char **argv);
int pdctl_cmd_down(int argc, char **argv);
int pdctl_cmd_scale(int argc, char **argv);
int pdctl_cmd_check(int argc, char **argv);
int pdctl_cmd_render(int argc, char **argv);

/* ---- queries ----------------------------------------------------------------- */

/* One admin command on a UNIX socket; the parsed reply or NULL with a clear
 * message in err ("no admin socket ...", "connection refused (daemon not
 * running?)", "garbage reply ...", "timed out"). Replies with "ok":false
 * are returned as-is. */
cJSON *pdctl_admin(const char *sock, const char *cmd, double timeout_s,
                   char *err, size_t err_len);
/* GET path on http://host:port; the status code, or -1 (err set). */
int pdctl_http_status(const char *url, const char *path, double timeout_s,
                      char *err, size_t err_len);
void pdctl_nap_ms(unsigned ms);
/* snprintf that reports truncation: false if `buf` was too small. */
bool pdctl_fmt(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
double pdctl_now(void);

int pdctl_cmd_status(int argc, char **argv);
int pdctl_cmd_query(const char *what, int argc, char **argv);
int pdctl_cmd_top(int argc, char **argv);
/* pdctl_ops.c: drain|maint|ready DAEMON (state is the word), admin, logs */
int pdctl_cmd_route(const char *state, int argc, char **argv);
int pdctl_cmd_admin(int argc, char **argv);
int pdctl_cmd_logs(int argc, char **argv);

/* Shared option parsing: strips --run-dir D / --json from argv. */
typedef struct {
    const char *run_dir;
    bool json;
    bool once;
} pdctl_opts_t;
int pdctl_parse_opts(int *argc, char **argv, pdctl_opts_t *o);
/* Split --set k=v (at most PDCTL_MAX_SETS) out of argv (up, check, render).
 * 0, or -1 when there are too many. */
#define PDCTL_MAX_SETS 64
int pdctl_take_sets(int *argc, char **argv, char **sets, int *n_sets);

/* The values object of the first set named `table` in an admin `stats`
 * reply (NULL: none). pdctl_query.c. */
const cJSON *pdctl_stats_values(const cJSON *stats, const char *table);

#endif
