/* pd_admin.h - the admin socket every daemon serves (Ceph asok, HAProxy
 * runtime API): a UNIX stream socket, one command per line, one JSON reply
 * line per command.
 *
 *   request:  "perf dump\n"           "log level debug\n"
 *   reply:    {"ok":true,...}\n       {"ok":false,"error":{"code":
 *                                       "ERR_BAD_INPUT","message":"..."}}\n
 *
 * Commands live in tables {name, level, handler, help}; `help` writes itself
 * from them. A name may have several words ("config show"); the longest
 * registered name that prefixes the line wins, the remaining words are the
 * arguments. Built-ins: help, version, stats (alias "perf dump"),
 * perf schema, stats prometheus,
 * stats reset (operator), config show [ini] (operator),
 * log level [<lvl>] (reading: user; setting: admin).
 *
 * Levels come from SO_PEERCRED: uid 0 or the daemon's own uid -> admin;
 * a member (primary or supplementary group) of opts.operator_group ->
 * operator; everybody else -> user.
 *
 * Limits (all enforced on the loop thread, nothing ever blocks):
 *   max_line    overlong line -> error reply, then close
 *   max_clients excess connection -> error reply, then close
 *   idle_timeout no complete command for this long -> close
 *   max_output  a client that does not read its replies is dropped when a
 *               new reply finds more than this unsent (memory per client
 *               stays under max_output + one reply)
 * Handlers run synchronously on the loop thread and must not block. */
#ifndef PD_ADMIN_H
#define PD_ADMIN_H

#include "pd_config.h"
#include "pd_loop.h"
#include "pd_stats.h"
#include "pd_status.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct cJSON;

typedef enum {
    PD_ADMIN_USER     = 0,  /* read stats */
    PD_ADMIN_OPERATOR = 1,  /* also read config, reset counters */
    PD_ADMIN_ADMIN    = 2,  /* drain, evict, log level */
} pd_admin_level_t;

typedef struct pd_admin pd_admin_t;

/* One command invocation, valid only during the handler call. */
typedef struct {
    pd_admin_t *admin;
    pd_admin_level_t level;     /* caller's level (>= the command's) */
    uid_t uid;                  /* peer credentials */
    pid_t pid;
    const char *name;           /* the matched command name */
    int argc;                   /* words after the command name */
    char **argv;
    const char *rest;           /* raw text after the command name */
    void *arg;                  /* the arg given to pd_admin_register */
    char errmsg[256];           /* set via pd_admin_req_error */
} pd_admin_req_t;

/* Fill `reply` (a JSON object, "ok" is added by the server). Return PD_OK
 * for success; an error status makes the reply
 * {"ok":false,"error":{"code":pd_status_name(s),"message":errmsg or
 * pd_status_str(s)}} and whatever the handler put in `reply` is dropped. */
typedef pd_status_t (*pd_admin_handler_t)(pd_admin_req_t *req,
                                          struct cJSON *reply);

typedef struct {
    const char *name;           /* "perf dump"; single spaces between words */
    pd_admin_level_t level;     /* minimum level */
    pd_admin_handler_t handler;
    const char *help;           /* "perf dump - all counters as JSON" */
} pd_admin_cmd_t;

#define PD_ADMIN_CMD_END { NULL, PD_ADMIN_USER, NULL, NULL }

typedef struct {
    const char *path;               /* socket path (required) */
    const char *group;              /* NULL: mode 0600; else chgrp + 0660 */
    const char *operator_group;     /* members get PD_ADMIN_OPERATOR */
    unsigned max_clients;           /* 0 -> 64 */
    size_t max_line;                /* 0 -> 4096 bytes (incl. '\n') */
    size_t max_output;              /* 0 -> 1 MiB unsent per client */
    uint64_t idle_timeout_ns;       /* 0 -> 60 s */
    const char *prog;               /* "pd-prefill" for version/help */
    const char *version;            /* NULL -> PD_VERSION */
    const pd_cfg_schema_t *cfg_schema; /* for `config show` (optional) */
    const void *cfg_target;
} pd_admin_opts_t;

/* Bind and listen on opts->path, add the built-in commands. A stale socket
 * file (connect() refused) is unlinked and replaced. Expected:
 * PD_ERR_EXISTS (a live server answers on path, or path is not a socket),
 * PD_ERR_BAD_INPUT (path too long, unknown group), PD_ERR_IO,
 * PD_ERR_NO_MEMORY. opts is copied (strings too); the schema/target are
 * borrowed. */
pd_status_t pd_admin_create(pd_loop_t *loop, const pd_admin_opts_t *opts,
                            pd_admin_t **admin_p);
/* Close every client, stop listening and unlink the socket file. Call it
 * on the loop thread, outside admin handlers, before pd_loop_destroy (client
 * memory is reaped by the loop). NULL-safe. */
void pd_admin_destroy(pd_admin_t *admin);

/* Add a command table (ends with PD_ADMIN_CMD_END; borrowed, must outlive
 * the server). `arg` is handed to its handlers. PD_ERR_EXISTS if a name is
 * already registered, PD_ERR_NO_SPACE (more than 16 tables). */
pd_status_t pd_admin_register(pd_admin_t *admin, const pd_admin_cmd_t *cmds,
                              void *arg);

/* Stats sets shown by `stats`/`perf dump` (borrowed; remove before
 * destroying the set). PD_ERR_NO_SPACE (256 sets) / PD_ERR_NOT_FOUND. */
pd_status_t pd_admin_add_stats(pd_admin_t *admin, pd_stats_t *stats);
pd_status_t pd_admin_remove_stats(pd_admin_t *admin, pd_stats_t *stats);

/* The JSON object that `stats` replies with (minus "ok"): {"stats":[{
 * "table","labels","values"}...],"process":{"pid","uptime_s"},
 * "jemalloc":{"allocated","active","resident","mapped"} or {"note":...}}.
 * Also for an HTTP /stats endpoint. NULL on ENOMEM. */
struct cJSON *pd_admin_stats_json(pd_admin_t *admin);

/* Prometheus text of every registered set plus the server's own counters,
 * build info and process_* (pd_stats_render_scrape: a whole HTTP /metrics
 * scrape). *text_p malloc'd. PD_ERR_NO_MEMORY. */
pd_status_t pd_admin_stats_prometheus(pd_admin_t *admin, char **text_p,
                                      size_t *len_p);

/* Set an error message for the reply; returns `status` so handlers can
 * `return pd_admin_req_error(req, PD_ERR_BAD_INPUT, "no such peer %s", p);` */
pd_status_t pd_admin_req_error(pd_admin_req_t *req, pd_status_t status,
                               const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

const char *pd_admin_level_name(pd_admin_level_t level);
/* Current number of connected clients (tests, `stats`). */
unsigned pd_admin_client_count(const pd_admin_t *admin);
const char *pd_admin_path(const pd_admin_t *admin);

#endif
