/* node_boot.c - a node's boot and teardown (see node.h): the checks before
 * anything starts (log, model, router address, secret, id; errors on
 * stderr as "<prog>: --<key>: <why>"), the engine (choice, model load, EOS
 * ids from its tokenizer), then loop, kvx, region + block pool, stats,
 * runner, admin socket and /metrics; and the ready file. */
#include "node.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "eng_tok.h"
#include "pd_boot.h"
#include "pd_log.h"
#include "proto_conn.h"

/* ---- the checks before anything starts ------------------------------------ */

/* kv-listen -> the interface UCX may use (n->kv_dev, its NET_DEVICES) and
 * the address its tcp listener will be on (n->kv_addr). UCX 1.13's tcp
 * transport binds one listener per interface it uses, to that interface's
 * address (the first IPv4 one; UCX_TCP_AF_PRIO's default "inet,inet6"),
 * so pinning the interface pins the address. An address is looked up
 * among this host's interfaces (getifaddrs); a name must be one of them.
 * Unset: loopback when every router of the static list is on loopback and
 * etcd is off (a local deployment), else every interface. */
/* The IP address of an interface address of family af into out (4 or 16
 * bytes); false for another family. (memcpy: a sockaddr is not aligned
 * for sockaddr_in6 as far as the compiler knows.) */
static bool node_ifa_ip(const struct sockaddr *sa, int af, unsigned char out[16])
{
    if (sa == NULL || sa->sa_family != af)
        return false;
    if (af == AF_INET) {
        struct sockaddr_in in;
        memcpy(&in, sa, sizeof(in));
        memcpy(out, &in.sin_addr, 4);
    } else {
        struct sockaddr_in6 in6;
        memcpy(&in6, sa, sizeof(in6));
        memcpy(out, &in6.sin6_addr, 16);
    }
    return true;
}

static pd_status_t node_boot_kv_listen(node_t *n, const char *prog, bool routers_loopback)
{
    const char *spec = n->cfg->kv_listen;
    snprintf(n->kv_dev, sizeof(n->kv_dev), "*");
    snprintf(n->kv_addr, sizeof(n->kv_addr), "*");
    if (spec == NULL || spec[0] == '\0')
        spec = routers_loopback && n->cfg->etcd == NULL ? "127.0.0.1" : "*";
    if (strcmp(spec, "*") == 0 || strcmp(spec, "0.0.0.0") == 0 || strcmp(spec, "::") == 0)
        return PD_OK;
    unsigned char want[sizeof(struct in6_addr)];
    int want_af = inet_pton(AF_INET, spec, want) == 1    ? AF_INET
                  : inet_pton(AF_INET6, spec, want) == 1 ? AF_INET6 : 0;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) {
        fprintf(stderr, "%s: --kv-listen: cannot list interfaces: %s\n", prog, strerror(errno));
        return PD_ERR_BAD_INPUT;
    }
    const char *dev = NULL;
    unsigned char ip[16];
    for (struct ifaddrs *i = ifs; i != NULL && dev == NULL && want_af != 0; i = i->ifa_next)
        if (node_ifa_ip(i->ifa_addr, want_af, ip) &&
            memcmp(ip, want, want_af == AF_INET ? 4 : 16) == 0)
            dev = i->ifa_name;
    if (want_af == 0 && if_nametoindex(spec) != 0)
        dev = spec;
    if (dev == NULL || strlen(dev) >= sizeof(n->kv_dev)) {
        fprintf(stderr, "%s: --kv-listen: \"%s\" is %s\n", prog, spec,
                want_af != 0 ? "not an address of any interface of this host"
                             : "neither an address nor an interface of this host (or *)");
        freeifaddrs(ifs);
        return PD_ERR_BAD_INPUT;
    }
    snprintf(n->kv_dev, sizeof(n->kv_dev), "%s", dev);
    /* the address UCX binds on that interface: its first IPv4, else IPv6 */
    for (int af = AF_INET; n->kv_addr[0] == '*' && af != 0; af = af == AF_INET ? AF_INET6 : 0)
        for (struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
            if (strcmp(i->ifa_name, n->kv_dev) != 0 || !node_ifa_ip(i->ifa_addr, af, ip))
                continue;
            if (inet_ntop(af, ip, n->kv_addr, sizeof(n->kv_addr)) != NULL)
                break;
            snprintf(n->kv_addr, sizeof(n->kv_addr), "*");
        }
    freeifaddrs(ifs);
    if (n->kv_addr[0] == '*')
        snprintf(n->kv_addr, sizeof(n->kv_addr), "-"); /* an interface without an address */
    return PD_OK;
}

/* The router addresses --insecure-no-auth must find on loopback. */
static uint32_t node_secret_addrs(const node_config_t *c, char addrs[][128],
                                  const char **ap)
{
    uint32_t na = 0;
    const char *list = node_router_list(c);
    if (c->boot.insecure_no_auth && list[0] != '\0' &&
        node_routers_parse(list, addrs, NODE_ROUTERS_MAX, &na) != PD_OK)
        na = 0; /* the router list's own check reports it */
    for (uint32_t i = 0; i < na; i++)
        ap[i] = addrs[i];
    return na;
}

static pd_status_t node_boot_secret(node_t *n, const char *prog)
{
    const node_config_t *c = n->cfg;
    char addrs[NODE_ROUTERS_MAX][128];
    const char *ap[NODE_ROUTERS_MAX];
    uint32_t na = node_secret_addrs(c, addrs, ap);
    return proto_auth_boot_secret(prog, c->boot.secret_file, c->boot.secret,
                                  c->boot.insecure_no_auth, ap, na,
                                  "routers", &n->secret, &n->have_secret);
}

pd_status_t node_check_config(const void *target, char *err, size_t err_len)
{
    const node_config_t *c = target;
    char addrs[NODE_ROUTERS_MAX][128];
    const char *ap[NODE_ROUTERS_MAX];
    uint32_t na = node_secret_addrs(c, addrs, ap);
    proto_auth_secret_t s;
    bool have = false, warn = false;
    pd_status_t st = proto_auth_secret_resolve(c->boot.secret_file, c->boot.secret,
                                               c->boot.insecure_no_auth, ap, na, "routers", &s,
                                               &have, &warn, err, err_len);
    if (have)
        proto_auth_secret_wipe(&s);
    return st;
}

static pd_status_t node_boot_checks(node_t *n, const char *prog)
{
    const node_config_t *c = n->cfg;
    if (pd_log_boot(prog, c->boot.log_level, c->boot.log_format, c->boot.log_file) != PD_OK)
        return PD_ERR_BAD_INPUT;
    if (c->model == NULL) {
        fprintf(stderr, "%s: --model: required (GGUF path or sim:<preset>)\n", prog);
        return PD_ERR_BAD_INPUT;
    }
    char addrs[NODE_ROUTERS_MAX][128];
    uint32_t na = 0;
    const char *list = node_router_list(c);
    if ((list[0] != '\0' || c->router != NULL) &&
        node_routers_parse(list, addrs, NODE_ROUTERS_MAX, &na) != PD_OK) {
        fprintf(stderr,
                "%s: --router: bad address list \"%s\" (host:port[,host:port...], numeric "
                "hosts, at most %u, no duplicates)\n", prog, list, NODE_ROUTERS_MAX);
        return PD_ERR_BAD_INPUT;
    }
    if (c->etcd != NULL) {
        size_t pl = strlen(c->etcd_prefix);
        if (pl == 0 || pl >= 100 || c->etcd_prefix[pl - 1] != '/') {
            fprintf(stderr, "%s: --etcd.prefix: 1..99 bytes ending with /\n", prog);
            return PD_ERR_BAD_INPUT;
        }
        const char *colon = strrchr(c->etcd, ':');
        long port = colon != NULL ? strtol(colon + 1, NULL, 10) : 0;
        if (colon == NULL || colon == c->etcd || port < 1 || port > 65535 ||
            strlen(c->etcd) >= 128) {
            fprintf(stderr, "%s: --etcd: bad address \"%s\" (host:port; a name is resolved "
                    "off the loop)\n", prog, c->etcd);
            return PD_ERR_BAD_INPUT;
        }
    }
    /* --print-arena-bytes (pdctl's plan check) runs before `up` writes the secret */
    if (!c->print_arena_bytes && node_boot_secret(n, prog) != PD_OK)
        return PD_ERR_BAD_INPUT;
    bool routers_loopback = true; /* the default router, 127.0.0.1:7000, too */
    for (uint32_t i = 0; i < na; i++)
        routers_loopback &= pd_addr_is_loopback(addrs[i]);
    if (node_boot_kv_listen(n, prog, routers_loopback) != PD_OK)
        return PD_ERR_BAD_INPUT;
    if (c->ep_rank >= c->ep_size) {
        fprintf(stderr, "%s: --ep-rank %llu: 0..ep-size-1 (ep-size %llu)\n", prog,
                (unsigned long long)c->ep_rank, (unsigned long long)c->ep_size);
        return PD_ERR_BAD_INPUT;
    }
    if (c->ep_size > 1 && n->role->proto_role != PROTO_ROLE_DECODE) {
        fprintf(stderr, "%s: --ep-size %llu: only a decode serves as an EP group's rank\n", prog,
                (unsigned long long)c->ep_size);
        return PD_ERR_BAD_INPUT;
    }
    if (c->id && (c->id[0] == '\0' || strlen(c->id) > PROTO_DAEMON_ID_MAX)) {
        fprintf(stderr, "%s: --id: 1..%u bytes\n", prog, PROTO_DAEMON_ID_MAX);
        return PD_ERR_BAD_INPUT;
    }
    if (c->id)
        snprintf(n->daemon_id, sizeof(n->daemon_id), "%s", c->id);
    else
        snprintf(n->daemon_id, sizeof(n->daemon_id), "%s-%d", n->role->name, (int)getpid());
    return PD_OK;
}

bool node_ready_write(const char *path, const char *text, const char *comp)
{
    if (pd_ready_file_write(path, text) == PD_OK)
        return true;
    pd_log(PD_LOG_ERROR, comp, NULL, "cannot write ready file %s: %s", path, strerror(errno));
    return false;
}

/* ---- engine ----------------------------------------------------------------- */

/* Pick the engine (--engine, else "sim" for a "sim:" model, else "llama"),
 * load the model, read its geometry and the EOS / end of generation ids
 * from its tokenizer (none without one: tok_err says why). */
_Static_assert(NODE_KV_SAME == ENG_KV_DTYPES, "node_kv_dtypes_kv: the dtypes then \"same\"");

static pd_status_t node_boot_engine(node_t *n, uint32_t max_batch, char *err, size_t err_len,
                                    char *tok_err, size_t tok_err_len)
{
    const node_config_t *c = n->cfg;
    n->engine = c->engine;
    if (n->engine == NULL)
        n->engine = strncmp(c->model, "sim:", 4) == 0 ? "sim" : "llama";
    n->ops = eng_find(n->engine);
    if (n->ops == NULL) {
        snprintf(err, err_len, "unknown engine \"%s\"", n->engine);
        return PD_ERR_NOT_FOUND;
    }
    eng_load_opts_t lo = {
        .engine = n->engine, .model_path = c->model, .block_tokens = (uint32_t)c->block_tokens,
        .kv_dtype = (eng_kv_dtype_t)(c->kv_dtype_k == NODE_KV_SAME ? c->kv_dtype : c->kv_dtype_k),
        .kv_split = true,
        .kv_dtype_v = (eng_kv_dtype_t)(c->kv_dtype_v == NODE_KV_SAME ? c->kv_dtype : c->kv_dtype_v),
        .n_threads = (uint32_t)c->threads,
        .max_batch = max_batch,
        .ep_rank = (uint32_t)c->ep_rank, .ep_size = (uint32_t)c->ep_size,
        .ep_overlap = c->ep_overlap,
    };
    pd_status_t st = n->ops->load(&lo, &n->model, err, err_len);
    if (st != PD_OK)
        return st;
    n->geom = n->ops->geometry(n->model);
    if (n->ops->describe) { /* the kernel path, once: "qdot path: vnni (amx: ...)" */
        char d[256];
        n->ops->describe(n->model, d, sizeof d);
        pd_log(PD_LOG_INFO, n->role->name, NULL, "engine %s: %s", n->engine, d);
    }
    eng_tok_t *tok = NULL;
    if (eng_tok_load_for(n->engine, c->model, &tok, tok_err, tok_err_len) != PD_OK) {
        if (tok_err[0] == '\0')
            snprintf(tok_err, tok_err_len, "no tokenizer");
        return PD_OK;
    }
    int32_t eos = eng_tok_eos(tok);
    if (eos >= 0)
        n->eos_ids[n->n_eos++] = eos;
    for (uint32_t id = 0; id < eng_tok_vocab_size(tok) && n->n_eos < ENG_SAMPLE_MAX_EOS; id++)
        if (eng_tok_is_eog(tok, (int32_t)id) && (int32_t)id != eos)
            n->eos_ids[n->n_eos++] = (int32_t)id;
    pd_status_t gst = node_gram_vocab(n, tok);
    eng_tok_destroy(tok);
    if (gst != PD_OK) {
        snprintf(err, err_len, "structured-output vocabulary: %s", pd_status_str(gst));
        return gst;
    }
    return PD_OK;
}

/* ---- boot ------------------------------------------------------------------- */

/* ---- the host's memory budget --------------------------------------------- */

/* Reserve the arena in the host's ledger before anything commits it: a
 * refusal names every daemon's share (logged, exit 1). A ledger that cannot
 * be opened (another user's file, no /dev/shm) leaves the process's own
 * check (kvx_arena_check) and a warning. */
static pd_status_t node_boot_mem_reserve(node_t *n, const char *prog, uint64_t arena)
{
    pd_memledger_opts_t mo = { .path = n->cfg->mem_ledger, .budget = n->cfg->mem_budget };
    snprintf(n->mem_name, sizeof(n->mem_name), "%.20s %.40s", prog, n->daemon_id);
    char why[1024];
    pd_status_t st = pd_memledger_reserve(&mo, n->mem_name, arena, why, sizeof(why));
    if (st == PD_OK) {
        n->mem_reserved = true;
        return PD_OK;
    }
    if (st == PD_ERR_IO) {
        pd_log(PD_LOG_WARN, n->role->name, NULL,
               "%s: the arena is checked against this process's memory only", why);
        return PD_OK;
    }
    pd_log(PD_LOG_ERROR, n->role->name, NULL, "KV arena does not fit the host's memory budget: "
           "%s; lower --kv-blocks (or mem.budget / the other daemons')", why);
    return st;
}

static void node_boot_mem_release(node_t *n)
{
    if (!n->mem_reserved)
        return;
    pd_memledger_opts_t mo = { .path = n->cfg->mem_ledger };
    pd_memledger_release(&mo, n->mem_name);
    n->mem_reserved = false;
}

int node_fail(const node_t *n, const char *what, pd_status_t st, const char *detail)
{
    pd_log(PD_LOG_ERROR, n->role->name, NULL, "%s: %s%s%s", what, pd_status_str(st),
           detail && detail[0] ? ": " : "", detail ? detail : "");
    return 1;
}

/* `nice`: every thread of the process so far (the log's, libraries'),
 * and the engine's and the runner's after it inherit it. */
static pd_status_t node_set_nice(int nice, char *err, size_t err_len)
{
    DIR *dir = opendir("/proc/self/task");
    if (dir == NULL) {
        snprintf(err, err_len, "/proc/self/task: %s", strerror(errno));
        return PD_ERR_IO;
    }
    pd_status_t st = PD_OK;
    struct dirent *e;
    while (st == PD_OK && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        if (setpriority(PRIO_PROCESS, (id_t)atoi(e->d_name), nice) != 0) {
            snprintf(err, err_len, "nice %d: %s%s", nice, strerror(errno),
                     errno == EACCES || errno == EPERM ? " (below 0 needs CAP_SYS_NICE)" : "");
            st = PD_ERR_PERMISSION;
        }
    }
    closedir(dir);
    if (st != PD_OK)
        return st;
    /* With the kernel's autogroups on (sched_autogroup_enabled), CPU is
     * shared between sessions first and a thread's nice only counts inside
     * its session: a daemon started in its own session (pdctl, systemd)
     * would lend nothing. Its autogroup gets the same nice; only when the
     * session is ours alone (leader), never a shell's shared one. */
    FILE *ag = fopen("/proc/sys/kernel/sched_autogroup_enabled", "re");
    int on = 0;
    if (ag != NULL) {
        if (fscanf(ag, "%d", &on) != 1)
            on = 0;
        fclose(ag);
    }
    if (on == 1 && getsid(0) == getpid()) {
        FILE *f = fopen("/proc/self/autogroup", "we");
        bool ok = f != NULL;
        if (f != NULL) {
            ok = fprintf(f, "%d", nice) > 0;
            ok = fclose(f) == 0 && ok;
        }
        if (!ok) {
            snprintf(err, err_len, "nice %d of the session's autogroup: %s", nice,
                     strerror(errno));
            return PD_ERR_PERMISSION;
        }
    }
    return st;
}

int node_boot(node_t *n, const node_boot_opts_t *o)
{
    char prog[32];
    snprintf(prog, sizeof(prog), "pd-%s", n->role->name);
    kvx_ucx_env_defaults(); /* setenv, before the engine's threads */
    if (n->cfg->qdot > 0) /* read by the engine at its first matmul (model load) */
        setenv("PD_QDOT", node_qdot_paths[n->cfg->qdot], 1);
    if (node_boot_checks(n, prog) != PD_OK)
        return 2;
    if (n->cfg->nice != 0) {
        char nerr[160];
        if (node_set_nice((int)n->cfg->nice, nerr, sizeof(nerr)) != PD_OK) {
            fprintf(stderr, "%s: %s\n", prog, nerr);
            return 2;
        }
    }

    char err[256] = "", tok_err[256] = "";
    pd_status_t st = node_boot_engine(n, o->max_batch, err, sizeof(err), tok_err, sizeof(tok_err));
    if (st == PD_ERR_NOT_FOUND) {
        fprintf(stderr, "%s: --engine: %s\n", prog, err);
        return 2;
    }
    if (st != PD_OK)
        return node_fail(n, "model load", st, err);
    if (tok_err[0] != '\0')
        pd_log(PD_LOG_WARN, n->role->name, NULL, "no tokenizer (%s): no EOS ids", tok_err);
    if (eng_sample_scratch_create(&n->scratch, n->geom->vocab_size) != PD_OK)
        return node_fail(n, "boot", PD_ERR_NO_MEMORY, NULL);

    uint64_t arena = (uint64_t)n->geom->block_bytes * n->cfg->kv_blocks;
    if (n->cfg->print_arena_bytes) { /* pdctl's plan check: nothing else starts */
        printf("%llu\n", (unsigned long long)arena);
        return fflush(stdout) == 0 ? 0 : 1;
    }
    if (n->cfg->ep_size > 1) { /* the group meets: its compat hash before the arena's */
        st = node_ep_join(n, err, sizeof(err));
        if (st != PD_OK)
            return node_fail(n, "EP group", st, err);
    }
    st = node_boot_mem_reserve(n, prog, arena);
    if (st != PD_OK)
        return 1;

    st = pd_loop_create(&n->loop);
    if (st != PD_OK)
        return node_fail(n, "event loop", st, NULL);
    struct event_base *base = pd_loop_base(n->loop);

    /* kvxfer: node id = xxh64(daemon id), one region = the arena */
    kvx_config_t kc;
    kvx_config_default(&kc);
    kc.node_id = node_id_of(n->daemon_id);
    if (n->have_secret)
        proto_auth_derive(&n->secret, "pdserve kvx v1", kc.secret);
    kc.ready_layers = n->geom->n_layers; /* layer streaming: readiness words */
    kc.net_devices = strcmp(n->kv_dev, "*") == 0 ? NULL : n->kv_dev; /* kv-listen */
    if (o->kvx_config)
        o->kvx_config(n, &kc);
    if (n->role->on_lease_end != NULL) { /* leases end through the node's table */
        kc.on_lease_end = node_on_lease_end;
        kc.cb_arg = n;
        n->max_leases = kc.max_leases;
        n->lease_reqs = calloc(kc.max_leases ? kc.max_leases : 1, sizeof(*n->lease_reqs));
        if (n->lease_reqs == NULL)
            return node_fail(n, "lease table", PD_ERR_NO_MEMORY, NULL);
    }
    st = kvx_ctx_create(&kc, base, &n->kvx);
    if (st != PD_OK)
        return node_fail(n, "kvxfer init", st, NULL);
    uint32_t nblocks = (uint32_t)n->cfg->kv_blocks;
    /* layer-major (engine/eng.h): one layer of a request's blocks is a few
     * contiguous runs, so it can be pulled while later layers compute */
    st = kvx_region_register_layers(n->kvx, 1, n->geom->block_bytes, nblocks, n->geom->n_layers,
                                    n->geom->compat_hash, KVX_ALLOC_UCX, &n->region);
    if (st != PD_OK) {
        node_boot_mem_release(n);
        return node_fail(n, "KV arena registration", st, NULL);
    }
    if (n->mem_reserved) { /* touched: MemAvailable counts it from now on */
        pd_memledger_opts_t mo = { .path = n->cfg->mem_ledger, .budget = n->cfg->mem_budget };
        pd_memledger_commit(&mo, n->mem_name);
    }
    eng_kv_layout_t lay = eng_kv_layout_layer_major(n->geom, nblocks);
    st = n->ops->set_kv_layout != NULL ? n->ops->set_kv_layout(n->model, &lay)
                                       : PD_ERR_UNSUPPORTED;
    if (st != PD_OK)
        return node_fail(n, "KV layout", st, NULL);
    st = kvx_blocks_create(n->region, nblocks, &n->blocks);
    if (st != PD_OK)
        return node_fail(n, "block allocator", st, NULL);
    if (n->cfg->prefix_cache) {
        st = node_kve_create(n, &n->kve);
        if (st != PD_OK)
            return node_fail(n, "prefix cache events", st, NULL);
        kvx_prefix_config_t pc = { .block_tokens = n->geom->block_tokens,
                                   .compat_hash = n->geom->compat_hash,
                                   .on_event = node_kve_on_event, .arg = n->kve };
        st = kvx_prefix_create(n->blocks, &pc, &n->prefix);
        if (st != PD_OK)
            return node_fail(n, "prefix cache", st, NULL);
    }
    st = kvx_meta_pack(n->kvx, n->meta, sizeof(n->meta), &n->meta_len);
    if (st != PD_OK || n->meta_len > PROTO_KV_ADDR_MAX)
        return node_fail(n, "kvx metadata", st != PD_OK ? st : PD_ERR_TOO_BIG, NULL);
    n->incarnation = kvx_ctx_incarnation(n->kvx);

    st = pd_stats_create(n->role->stats, (const char *[]){ "daemon", n->daemon_id, NULL },
                         &n->stats);
    if (st != PD_OK)
        return node_fail(n, "stats", st, NULL);
    st = eng_runner_create(n->loop, 0, &n->runner);
    if (st != PD_OK)
        return node_fail(n, "compute thread", st, NULL);
    st = node_cpu_start(n);
    if (st != PD_OK)
        return node_fail(n, "cpu accounting", st, NULL);
    node_drain_init(n);

    if (n->cfg->boot.admin_socket) {
        pd_admin_opts_t ao = { .path = n->cfg->boot.admin_socket, .prog = prog,
                               .cfg_schema = n->role->schema, .cfg_target = n->cfg };
        st = pd_admin_create(n->loop, &ao, &n->admin);
        if (st != PD_OK)
            return node_fail(n, "admin socket", st, n->cfg->boot.admin_socket);
        node_admin_register(n);
        pd_admin_add_stats(n->admin, n->stats);
        pd_admin_add_stats(n->admin, n->cpu_stats);
    }
    st = node_metrics_start(n);
    if (st != PD_OK)
        return node_fail(n, "metrics.listen", st, n->cfg->metrics_listen);
    /* last, so the ranks' first votes come soon after the group met */
    if (n->cfg->ep_size > 1 && (st = node_ep_ready(n, err, sizeof(err))) != PD_OK)
        return node_fail(n, "EP group", st, err);
    return PD_CONFIG_RUN;
}

/* ---- teardown --------------------------------------------------------------- */

void node_teardown(node_t *n, void (*after_kvx)(node_t *n))
{
    n->stopping = true;
    node_member_stop(n);                    /* daemons/<id> leaves etcd */
    for (uint32_t i = 0; i < NODE_ROUTERS_MAX; i++) {
        node_link_t *l = &n->links[i];
        if (!l->in_use)
            continue;
        proto_session_destroy(l->sess);
        l->sess = NULL;
        l->in_use = false;
    }
    n->n_links = 0;
    eng_runner_destroy(n->runner);          /* the jobs in flight come back aborted */
    n->runner = NULL;
    node_ep_leave(n);                       /* no compute thread uses the window now */
    n->role->cancel_all(n, NULL);
    if (n->admin) {
        pd_admin_remove_stats(n->admin, n->stats);
        pd_admin_remove_stats(n->admin, n->cpu_stats);
        pd_admin_destroy(n->admin);
        n->admin = NULL;
    }
    node_metrics_stop(n);
    kvx_prefix_destroy(n->prefix);          /* reads the region's pins */
    n->prefix = NULL;
    node_kve_destroy(n->kve);               /* after the cache: no more events */
    n->kve = NULL;
    kvx_ctx_destroy(n->kvx);                /* worker first, then the region */
    n->kvx = NULL;
    n->region = NULL;
    node_boot_mem_release(n);               /* the arena is unmapped */
    if (after_kvx)
        after_kvx(n);
    kvx_blocks_destroy(n->blocks);
    n->blocks = NULL;
    free(n->lease_reqs);                    /* the kvx context ended every lease */
    n->lease_reqs = NULL;
    if (n->drain_ev)
        event_free(n->drain_ev);
    node_cpu_stop(n);                       /* its timer, before the loop */
    pd_loop_destroy(n->loop);               /* runs the deferred frees */
    pd_stats_destroy(n->stats);
    n->ops->destroy(n->model);
    eng_sample_scratch_destroy(&n->scratch);
    eng_gram_vocab_free(n->gram_vocab);
    n->gram_vocab = NULL;
    free(n->gram_scratch);
    n->gram_scratch = NULL;
    free(n->gram_raw);
    n->gram_raw = NULL;
    proto_auth_secret_wipe(&n->secret);
    if (n->cfg->ready_file)
        unlink(n->cfg->ready_file);
}
