/* pd_e2e.h - end-to-end test harness: real pd-router / pd-prefill /
 * pd-decode processes on loopback ports chosen by the OS, each with its own
 * log file, ready file and admin socket in a private temp dir; readiness by
 * polling (ready files, GET /ready), never fixed sleeps; reliable cleanup
 * (children get PR_SET_PDEATHSIG, and an atexit hook SIGKILLs whatever a
 * failed test left behind). Plus a blocking HTTP/1.1 client with SSE
 * parsing and an admin-socket client. Test code only: asserts nothing,
 * returns statuses so the caller (cmocka) decides. */
#ifndef PD_E2E_H
#define PD_E2E_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#define E2E_MAX_DAEMONS 8
#define E2E_MAX_ROUTERS 4
#define E2E_MAX_ARGS 40

typedef enum { E2E_ROUTER, E2E_PREFILL, E2E_DECODE } e2e_role_t;

typedef struct {
    e2e_role_t role;
    pid_t pid;                 /* 0 once reaped */
    int status;                /* exit code, or 128 + signal, once reaped; -1 before */
    bool stopped;              /* the test sent SIGTERM/SIGINT/SIGKILL: exit expected */
    char id[48];
    char sock[108];            /* admin socket path */
    char log[200];
    char ready[200];
    const char *extra[E2E_MAX_ARGS]; /* borrowed extra --key=value args, NULL-terminated */
    const char *env[8];        /* "K=V" set in the child only, NULL-terminated */
} e2e_proc_t;

typedef struct {
    const char *router_bin, *prefill_bin, *decode_bin;
    const char *model;         /* for all three */
    const char *const *router_args;  /* extra args (NULL-terminated or NULL) */
    const char *const *prefill_args;
    const char *const *decode_args;
    const char *const *env;    /* "K=V" for every daemon (NULL-terminated or NULL) */
    int n_prefill, n_decode;
    int n_routers;             /* 0 or 1: one router; up to E2E_MAX_ROUTERS, every
                                  daemon gets --router=<all control ports> */
    bool no_router_arg;        /* daemons get no --router (they find routers in etcd) */
    double ready_timeout_s;    /* default 30 */
} e2e_opts_t;

typedef struct {
    char dir[128];
    char secret_hex[65];
    e2e_opts_t o;
    e2e_proc_t router;         /* router 0 (e2e_router(d, 0)) */
    e2e_proc_t more_routers[E2E_MAX_ROUTERS - 1]; /* routers 1.. */
    int n_routers;             /* >= 1 */
    uint16_t router_http[E2E_MAX_ROUTERS], router_control[E2E_MAX_ROUTERS];
    char router_ctl_args[E2E_MAX_ROUTERS][64];
    char routers_arg[E2E_MAX_ROUTERS * 24 + 16]; /* --router=a,b,... for daemons */
    e2e_proc_t prefill[E2E_MAX_DAEMONS];
    e2e_proc_t decode[E2E_MAX_DAEMONS];
    int n_prefill, n_decode;
    uint16_t http_port, control_port;
    char router_ctl_arg[64];   /* --control=... of a restarted router */
} e2e_deploy_t;

double e2e_now(void);          /* monotonic seconds */
void e2e_nap_ms(unsigned ms);  /* the poll interval of every wait loop */

/* Start router, then n_prefill + n_decode daemons; wait until every daemon
 * wrote its ready file and the router's /ready answers 200. 0 or -1 (logs
 * printed to stderr on failure). */
int e2e_deploy_start(e2e_deploy_t *d, const e2e_opts_t *o);
/* SIGTERM everything (daemons first), wait up to 10 s, then SIGKILL; tail of
 * each log on stderr when verbose or a daemon exited badly; removes the dir
 * unless E2E_KEEP is set. Returns the number of daemons that exited with a
 * non-zero status or a signal other than our SIGKILL. */
int e2e_deploy_stop(e2e_deploy_t *d, bool verbose);

/* Start one more daemon (role prefill|decode) into the deployment, id given
 * (or NULL = role-N); waits for its ready file. Returns the proc or NULL. */
e2e_proc_t *e2e_add_daemon(e2e_deploy_t *d, e2e_role_t role, const char *id,
                           const char *const *extra);

/* Start the router again (after it died) on the same control port, so the
 * daemons' reconnect loops find it; waits for /ready 200. 0 or -1. */
int e2e_restart_router(e2e_deploy_t *d);
/* Router i (0 = d->router) and the same restart for it (new HTTP port in
 * d->router_http[i]; router 0's also in d->http_port). */
e2e_proc_t *e2e_router(e2e_deploy_t *d, int i);
int e2e_restart_router_i(e2e_deploy_t *d, int i);

int e2e_proc_signal(e2e_proc_t *p, int sig);
/* Reap if exited (non-blocking); true while running. */
bool e2e_proc_alive(e2e_proc_t *p);
/* Wait up to timeout for exit; returns status or -1. */
int e2e_proc_wait(e2e_proc_t *p, double timeout_s);
void e2e_proc_dump_log(const e2e_proc_t *p, int tail_lines);

/* Admin socket: one command -> parsed reply (caller deletes) or NULL. */
cJSON *e2e_admin(const char *sock, const char *cmd);
/* Dotted path lookup ("counters.accepted"), -1 if absent / not a number. */
double e2e_jnum(const cJSON *o, const char *path);
/* A value of a router's `router` stats table (admin `stats`), by dotted
 * path ("requests_ok", "ttft.count"); -1 if absent. */
double e2e_router_stat(const e2e_proc_t *router, const char *path);
/* Poll `kv` until free == blocks_total (bounded). */
bool e2e_wait_kv_free(const e2e_proc_t *p, double timeout_s);
/* The ledger: `requests` has no live request and accepted = completed +
 * failed + canceled (daemons), or the router's stats requests_* agree and
 * requests_inflight = 0. Polls up to timeout_s; on failure writes why. */
bool e2e_ledger_ok(const e2e_proc_t *p, double timeout_s, char *why, size_t why_len);
/* All pools free, all ledgers balanced, every process alive. */
bool e2e_quiescent(e2e_deploy_t *d, double timeout_s, char *why, size_t why_len);

/* ---- HTTP -------------------------------------------------------------- */

typedef struct {
    int status;                /* 0: no response */
    char *head;                /* status line + headers */
    char *body;                /* de-chunked */
    size_t body_len;
    bool timed_out;
} e2e_resp_t;

int e2e_http_connect(uint16_t port);
/* Send a request (Connection: close); extra_headers "K: V\r\n..." or NULL. */
int e2e_http_send(int fd, const char *method, const char *path, const char *extra_headers,
                  const char *body, size_t body_len);
/* Read until `needle` appears in the raw bytes (NULL: until EOF) or timeout.
 * Raw bytes accumulate in *buf (malloc'd, NUL-terminated). 1 found / EOF,
 * 0 timeout, -1 error. */
int e2e_http_read(int fd, char **buf, size_t *len, const char *needle, double timeout_s);
/* `data: ` lines in raw bytes so far (NULL: 0). */
int e2e_count_data(const char *buf);
/* Keep reading fd into *buf / *len until it holds at least n `data: `
 * chunks, EOF or timeout_s. Returns the chunks counted. */
int e2e_wait_chunks(int fd, char **buf, size_t *len, int n, double timeout_s);
/* Open a stream: connect, send POST path (extra_headers, body), wait for n
 * chunks (e2e_wait_chunks). Returns the fd (the caller closes it; -1 when
 * the connection or the send failed) with what was read in *buf / *len
 * (the caller frees) and the chunk count in *got. */
int e2e_stream_open(uint16_t port, const char *path, const char *extra_headers,
                    const char *body, int n, double timeout_s, char **buf, size_t *len,
                    int *got);
/* Parse raw bytes into resp (de-chunking). */
void e2e_http_parse(const char *raw, size_t len, e2e_resp_t *r);
/* One whole request. */
int e2e_http(uint16_t port, const char *method, const char *path, const char *extra_headers,
             const char *body, double timeout_s, e2e_resp_t *r);
void e2e_resp_free(e2e_resp_t *r);
const char *e2e_header(const e2e_resp_t *r, const char *name, char *out, size_t cap);

/* SSE: data payloads of a body. */
typedef struct {
    cJSON *chunks[4096];
    int n;
    bool done;                 /* `data: [DONE]` seen, last */
    bool error_frame;          /* a data: {"error":...} seen */
    bool bad;                  /* unparseable payload or data after [DONE] */
    char *text;                /* concatenated choices[0].text / delta.content, up to
                                * the first byte 0 (cJSON strings are C strings: a
                                * non-streamed text and a detokenized reference end
                                * there too) */
    const char *finish;        /* finish_reason of the last content chunk, or NULL */
    int usage_completion;      /* usage.completion_tokens of the usage chunk, -1 */
    int usage_prompt;
} e2e_sse_t;

void e2e_sse_parse(const char *body, e2e_sse_t *s);
void e2e_sse_free(e2e_sse_t *s);

#endif
