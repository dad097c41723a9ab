/* admin-test-server.c - a minimal daemon for the admin socket end-to-end
 * test: pd_config table + pd_loop + pd_admin + two stats sets fed by a
 * worker thread through a pd_queue. Prints its socket path on stdout once it
 * listens, serves until SIGTERM (drain: stop) or SIGINT, removes the socket
 * and exits 0. Exit 3 if a live server already owns the path, 1 otherwise on
 * errors, 2 on usage errors. */
#include "pd_admin.h"
#include "pd_config.h"
#include "pd_log.h"
#include "pd_loop.h"
#include "pd_stats.h"
#include "pd_time.h"

#include <cjson/cJSON.h>
#include <event2/event.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *socket;
    char *group;
    char *operator_group;
    uint64_t max_clients;
    uint64_t max_line;
    uint64_t max_output;
    uint64_t idle_timeout_ns;
    char *name;
} srv_config_t;

static const pd_cfg_field_t srv_fields[] = {
    PD_CFG_ROW(srv_config_t, socket, "admin.socket", STRING, NULL,
               "admin socket path (required)", 0, 0, NULL),
    PD_CFG_ROW(srv_config_t, group, "admin.group", STRING, NULL,
               "group owning the socket (mode 0660)", 0, 0, NULL),
    PD_CFG_ROW(srv_config_t, operator_group, "admin.operator-group", STRING, NULL,
               "members get the operator level", 0, 0, NULL),
    PD_CFG_ROW(srv_config_t, max_clients, "admin.max-clients", UINT, "64",
               "max concurrent admin clients", 1, 4096, NULL),
    PD_CFG_ROW(srv_config_t, max_line, "admin.max-line", SIZE, "4KiB",
               "max command line length", 16, 1 << 20, NULL),
    PD_CFG_ROW(srv_config_t, max_output, "admin.max-output", SIZE, "1MiB",
               "unsent output per client before it is dropped", 1024, 1 << 30, NULL),
    PD_CFG_ROW(srv_config_t, idle_timeout_ns, "admin.idle-timeout", DURATION, "60s",
               "close clients idle this long", 1e6, 3600e9, NULL),
    PD_CFG_ROW(srv_config_t, name, "name", STRING, "test-server",
               "instance name", 0, 0, NULL),
    PD_CFG_END
};

static const pd_cfg_schema_t srv_schema = {
    .prog = "admin-test-server",
    .summary = "admin socket test daemon",
    .fields = srv_fields,
};

#define SRV_STATS(X)                                                          \
    X(ticks, COUNTER, "Work items done by the worker")                        \
    X(bumps, COUNTER, "bump commands")                                        \
    X(queue_depth, GAUGE, "Items in flight")                                  \
    X(work_latency, HISTOGRAM, "Worker round trip")

#define SRV_STAT_ID(name, kind, help) SRV_ST_##name,
typedef enum { SRV_STATS(SRV_STAT_ID) SRV_ST__COUNT } srv_stat_id_t;
static const pd_stat_desc_t srv_descs[] = { SRV_STATS(PD_STAT_DESC) };
static const pd_stats_table_t srv_table = PD_STATS_TABLE("test", srv_descs);

typedef struct {
    pd_queue_node_t node;
    uint64_t t0_ns;
    int inflight;
} work_t;

typedef struct {
    pd_loop_t *loop;
    pd_stats_t *total, *peer;
    pd_queue_t *to_worker, *to_loop;
    work_t work[4];
    struct event *tick;
} srv_t;

static void *worker_main(void *arg)
{
    srv_t *srv = arg;
    pd_queue_node_t *n;
    while ((n = pd_queue_pop_wait(srv->to_worker, UINT64_MAX)) != NULL)
        pd_queue_push(srv->to_loop, n);
    return NULL;
}

static void work_done_cb(pd_queue_t *q, pd_queue_node_t *node, void *arg)
{
    srv_t *srv = arg;
    work_t *w = PD_CONTAINER_OF(node, work_t, node);
    pd_stats_inc(srv->total, SRV_ST_ticks);
    pd_stats_inc(srv->peer, SRV_ST_ticks);
    pd_stats_observe_ns(srv->total, SRV_ST_work_latency, pd_now_ns() - w->t0_ns);
    pd_stats_gauge_add(srv->total, SRV_ST_queue_depth, -1);
    w->inflight = 0;
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    srv_t *srv = arg;
    for (int i = 0; i < 4; i++) {
        work_t *w = &srv->work[i];
        if (w->inflight)
            continue;
        w->inflight = 1;
        w->t0_ns = pd_now_ns();
        pd_stats_gauge_add(srv->total, SRV_ST_queue_depth, 1);
        if (pd_queue_push(srv->to_worker, &w->node) != PD_OK) {
            w->inflight = 0;
            pd_stats_gauge_add(srv->total, SRV_ST_queue_depth, -1);
        }
        return;
    }
}

static pd_status_t cmd_echo(pd_admin_req_t *req, cJSON *reply)
{
    cJSON *arr = cJSON_AddArrayToObject(reply, "args");
    if (arr == NULL || !cJSON_AddStringToObject(reply, "rest", req->rest))
        return PD_ERR_NO_MEMORY;
    for (int i = 0; i < req->argc; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateString(req->argv[i]));
    return PD_OK;
}

static pd_status_t cmd_bump(pd_admin_req_t *req, cJSON *reply)
{
    srv_t *srv = req->arg;
    pd_stats_inc(srv->total, SRV_ST_bumps);
    return PD_OK;
}

static pd_status_t cmd_secret(pd_admin_req_t *req, cJSON *reply)
{
    return cJSON_AddStringToObject(reply, "secret", "42") ? PD_OK : PD_ERR_NO_MEMORY;
}

static pd_status_t cmd_fail(pd_admin_req_t *req, cJSON *reply)
{
    return pd_admin_req_error(req, PD_ERR_NOT_FOUND, "no such thing: %s",
                              req->argc ? req->argv[0] : "-");
}

/* A reply far larger than a socket buffer (256 KiB of 'x'). */
static pd_status_t cmd_big(pd_admin_req_t *req, cJSON *reply)
{
    size_t n = 256 * 1024;
    char *s = malloc(n + 1);
    if (s == NULL)
        return PD_ERR_NO_MEMORY;
    memset(s, 'x', n);
    s[n] = '\0';
    cJSON *item = cJSON_AddStringToObject(reply, "big", s);
    free(s);
    return item ? PD_OK : PD_ERR_NO_MEMORY;
}

static const pd_admin_cmd_t srv_cmds[] = {
    { "test big", PD_ADMIN_USER, cmd_big, "test big - a 256 KiB reply" },
    { "echo", PD_ADMIN_USER, cmd_echo, "echo <words>... - returns its arguments" },
    { "test bump", PD_ADMIN_USER, cmd_bump, "test bump - count a bump" },
    { "test secret", PD_ADMIN_ADMIN, cmd_secret, "test secret - admin only" },
    { "test fail", PD_ADMIN_USER, cmd_fail, "test fail <x> - always an error" },
    PD_ADMIN_CMD_END
};

static void drain_cb(pd_loop_t *loop, void *arg)
{
    PD_LOG_INFO("test-server", "SIGTERM: draining (nothing in flight), stopping");
    pd_loop_stop(loop);
}

int main(int argc, char **argv)
{
    srv_config_t cfg = { 0 };
    pd_cfg_result_t res;
    srv_t srv = { 0 };
    pd_admin_t *admin = NULL;
    pthread_t worker;
    int rc = 1;

    pd_config_load_or_exit(&srv_schema, &cfg, argc, argv, &res);
    if (cfg.socket == NULL) {
        fprintf(stderr, "admin-test-server: --admin.socket is required\n");
        return 2;
    }
    if (pd_loop_create(&srv.loop) != PD_OK)
        goto out_cfg;
    pd_loop_on_drain(srv.loop, drain_cb, &srv);
    if (pd_stats_create(&srv_table, NULL, &srv.total) != PD_OK ||
        pd_stats_create(&srv_table, (const char *[]){ "peer", "decode-1", NULL },
                        &srv.peer) != PD_OK ||
        pd_queue_create(0, &srv.to_worker) != PD_OK ||
        pd_queue_create(0, &srv.to_loop) != PD_OK)
        goto out_loop;
    if (pd_queue_attach(srv.to_loop, srv.loop, work_done_cb, &srv, 0) != PD_OK)
        goto out_loop;

    pd_admin_opts_t opts = {
        .path = cfg.socket,
        .group = cfg.group,
        .operator_group = cfg.operator_group,
        .max_clients = (unsigned)cfg.max_clients,
        .max_line = cfg.max_line,
        .max_output = cfg.max_output,
        .idle_timeout_ns = cfg.idle_timeout_ns,
        .prog = "admin-test-server",
        .cfg_schema = &srv_schema,
        .cfg_target = &cfg,
    };
    pd_status_t status = pd_admin_create(srv.loop, &opts, &admin);
    if (status != PD_OK) {
        fprintf(stderr, "admin-test-server: admin socket %s: %s\n", cfg.socket,
                pd_status_str(status));
        rc = status == PD_ERR_EXISTS ? 3 : 1;
        goto out_loop;
    }
    if (pd_admin_register(admin, srv_cmds, &srv) != PD_OK ||
        pd_admin_register(admin, srv_cmds, &srv) != PD_ERR_EXISTS ||
        pd_admin_add_stats(admin, srv.total) != PD_OK ||
        pd_admin_add_stats(admin, srv.peer) != PD_OK)
        goto out_admin;

    if (pthread_create(&worker, NULL, worker_main, &srv) != 0)
        goto out_admin;
    srv.tick = event_new(pd_loop_base(srv.loop), -1, EV_PERSIST, tick_cb, &srv);
    struct timeval tv = { 0, 10000 };
    event_add(srv.tick, &tv);

    printf("%s\n", cfg.socket);
    fflush(stdout);
    if (pd_loop_run(srv.loop) == PD_OK)
        rc = 0;

    event_free(srv.tick);
    pd_queue_close(srv.to_worker);
    pthread_join(worker, NULL);
out_admin:
    pd_admin_destroy(admin);
out_loop:
    pd_queue_destroy(srv.to_worker);
    pd_queue_destroy(srv.to_loop);
    pd_stats_destroy(srv.total);
    pd_stats_destroy(srv.peer);
    pd_loop_destroy(srv.loop);
out_cfg:
    pd_config_result_free(&res);
    pd_config_free(&srv_schema, &cfg);
    return rc;
}
