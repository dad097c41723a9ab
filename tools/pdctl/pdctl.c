/* pdctl.c - the operator's tool for a pdserve deployment: start one from a
 * deployment file (router + N prefill + M decode as separate processes),
 * look at it through the daemons' admin sockets, change its P:D ratio at
 * run time, stop it. Commands are one table (see `pdctl help`); the option
 * parsing they share is here too. */
#include "pdctl.h"

#include <stdio.h>
#include <string.h>

#include "pd_config.h"
#include "pdctl_plan.h"

static int cmd_stats(int argc, char **argv) { return pdctl_cmd_query("stats", argc, argv); }
static int cmd_kv(int argc, char **argv) { return pdctl_cmd_query("kv", argc, argv); }
static int cmd_leases(int argc, char **argv) { return pdctl_cmd_query("leases", argc, argv); }
static int cmd_xfer(int argc, char **argv) { return pdctl_cmd_query("xfer", argc, argv); }
static int cmd_requests(int argc, char **argv) { return pdctl_cmd_query("requests", argc, argv); }
static int cmd_drain(int argc, char **argv) { return pdctl_cmd_route("drain", argc, argv); }
static int cmd_maint(int argc, char **argv) { return pdctl_cmd_route("maint", argc, argv); }
static int cmd_ready(int argc, char **argv) { return pdctl_cmd_route("ready", argc, argv); }
static int cmd_help(int argc, char **argv);

/* X(name, handler, synopsis) */
#define PDCTL_COMMANDS(X)                                                                     \
    X("up", pdctl_cmd_up, "up FILE [--run-dir D] [--set sec.key=v] [--foreground]\n" \
                          "                          start a deployment, wait until ready (--foreground: Ctrl-C stops)") \
    X("down", pdctl_cmd_down, "down                    stop it (router drains first, then the daemons)") \
    X("status", pdctl_cmd_status, "status                  one line per daemon: role, state, load, pid, uptime") \
    X("scale", pdctl_cmd_scale, "scale prefill|decode N   start daemons or drain+stop them to reach N") \
    X("plan", pdctl_cmd_plan, "plan [--seconds S]       dry run of the SLO planner: figures, capacities, the split it would run and why") \
    X("autoscale", pdctl_cmd_autoscale, "autoscale on|off|status  the SLO planner re-splits prefill:decode ([planner] rows; one leader)") \
    X("disagg-mode", pdctl_cmd_disagg_mode, "disagg-mode MODE        every router's disagg-mode now: threshold|always|never (PD-mixed)|cost") \
    X("stats", cmd_stats, "stats [DAEMON|all]      counters and histograms") \
    X("kv", cmd_kv, "kv [DAEMON|all]         KV block pools") \
    X("leases", cmd_leases, "leases [DAEMON|all]     KV leases held by prefill daemons") \
    X("xfer", cmd_xfer, "xfer [DAEMON|all]       KV transfers; `all`: prefill x decode matrix") \
    X("requests", cmd_requests, "requests [DAEMON|all]   requests in flight + outcome counters") \
    X("drain", cmd_drain, "drain DAEMON            the router sends it no new requests (it keeps running)") \
    X("maint", cmd_maint, "maint DAEMON            same, shown as maintenance") \
    X("ready", cmd_ready, "ready DAEMON            the router routes to it again") \
    X("admin", pdctl_cmd_admin, "admin DAEMON CMD...     one admin command, the JSON reply (try: admin router help)") \
    X("logs", pdctl_cmd_logs, "logs DAEMON [-n N] [-f] the daemon's log: last N lines (50; 0 all), -f follows") \
    X("top", pdctl_cmd_top, "top [--once]            live view, refreshed each second (q quits)") \
    X("check", pdctl_cmd_check, "check FILE              validate a deployment file") \
    X("render", pdctl_cmd_render, "render FILE OUTDIR [--group G]  configs, env, secret for the systemd units (/etc/pdserve)") \
    X("help", cmd_help, "help                    this text")

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *synopsis;
} pdctl_cmd_t;

static const pdctl_cmd_t pdctl_cmds[] = {
#define PDCTL_X_CMD(n, f, s) { n, f, s },
    PDCTL_COMMANDS(PDCTL_X_CMD)
#undef PDCTL_X_CMD
};

static int cmd_help(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("usage: pdctl COMMAND [ARGS] [--run-dir D] [--json]\n\n");
    for (size_t i = 0; i < sizeof(pdctl_cmds) / sizeof(pdctl_cmds[0]); i++)
        printf("  pdctl %s\n", pdctl_cmds[i].synopsis);
    printf("\nRun dir: --run-dir D, else $PD_RUN_DIR, else ./run (`up` uses the file's run-dir).\n"
           "DAEMON: router, prefill-N, decode-N, all, or an admin socket path.\n"
           "Binaries: $PD_BIN_DIR, next to pdctl, or the build tree pdctl is in.\n"
           "Exit: 0 ok, 1 failure, 2 usage or bad deployment file.\n");
    return 0;
}

/* ---- option parsing ---------------------------------------------------------- */

int pdctl_parse_opts(int *argc, char **argv, pdctl_opts_t *o)
{
    int out = 0;
    for (int i = 0; i < *argc; i++) {
        if (strcmp(argv[i], "--run-dir") == 0 && i + 1 < *argc) {
            o->run_dir = argv[++i];
        } else if (strncmp(argv[i], "--run-dir=", 10) == 0) {
            o->run_dir = argv[i] + 10;
        } else if (strcmp(argv[i], "--json") == 0) {
            o->json = true;
        } else if (strcmp(argv[i], "--once") == 0) {
            o->once = true;
        } else {
            argv[out++] = argv[i];
        }
    }
    *argc = out;
    argv[out] = NULL;
    if (o->run_dir == NULL)
        o->run_dir = pdctl_default_run_dir();
    return 0;
}

/* Split --set k=v out of argv (up, check, render). */
int pdctl_take_sets(int *argc, char **argv, char **sets, int *n_sets)
{
    int out = 0;
    for (int i = 0; i < *argc; i++) {
        if (strcmp(argv[i], "--set") == 0 && i + 1 < *argc) {
            if (*n_sets == PDCTL_MAX_SETS)
                return -1;
            sets[(*n_sets)++] = argv[++i];
        } else if (strncmp(argv[i], "--set=", 6) == 0) {
            if (*n_sets == PDCTL_MAX_SETS)
                return -1;
            sets[(*n_sets)++] = argv[i] + 6;
        } else {
            argv[out++] = argv[i];
        }
    }
    *argc = out;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        cmd_help(0, NULL);
        return PDCTL_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
        return cmd_help(0, NULL);
    if (strcmp(argv[1], "--version") == 0) {
        printf("pdctl %s\n", PD_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof(pdctl_cmds) / sizeof(pdctl_cmds[0]); i++)
        if (strcmp(argv[1], pdctl_cmds[i].name) == 0)
            return pdctl_cmds[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "pdctl: unknown command \"%s\" (try pdctl help)\n", argv[1]);
    return PDCTL_EXIT_USAGE;
}
