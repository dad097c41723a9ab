/* rtr_main.c - pd-router: configuration, boot, admin commands, ready file,
 * SIGTERM drain. The control plane lives in rtr_ctl.c, the HTTP front end
 * and the request flow in rtr_http.c. */
#include "rtr_flow.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gguf.h"
#include "pd_etcd.h"
#include "pd_boot.h"
#include "pd_log.h"
#include "pd_time.h"

static const pd_stat_desc_t rtr_stat_descs[] = { RTR_STATS(PD_STAT_DESC) };
/* Prometheus: outcomes, refusals, finish reasons and where the prompt was
 * prefilled as labeled families; buckets fit for each figure */
static const pd_stat_prom_t rtr_stat_prom[] = {
    PD_STAT_PROM_LABEL("requests_completed", "requests", "outcome", "completed",
                       "accepted requests ended, by outcome"),
    PD_STAT_PROM_LABEL("requests_failed", "requests", "outcome", "failed", NULL),
    PD_STAT_PROM_LABEL("requests_canceled", "requests", "outcome", "canceled", NULL),
    PD_STAT_PROM_LABEL("requests_rejected", "requests_refused", "reason", "invalid",
                       "requests refused before acceptance: invalid (4xx) or overloaded (429/503)"),
    PD_STAT_PROM_LABEL("requests_overloaded", "requests_refused", "reason", "overloaded", NULL),
    PD_STAT_PROM_LABEL("finish_stop", "requests_finished", "finish_reason", "stop",
                       "completed requests, by OpenAI finish_reason"),
    PD_STAT_PROM_LABEL("finish_length", "requests_finished", "finish_reason", "length", NULL),
    PD_STAT_PROM_LABEL("requests_disaggregated", "requests_prefilled", "where", "prefill_daemon",
                       "accepted requests by where the prompt was prefilled"),
    PD_STAT_PROM_LABEL("requests_local", "requests_prefilled", "where", "decode_local", NULL),
    PD_STAT_PROM_LABEL("kv_route_prefill_hits", "kv_routed_by_cache", "role", "prefill",
                       "daemon choices where the chosen daemon held part of the prompt (KV index)"),
    PD_STAT_PROM_LABEL("kv_route_decode_hits", "kv_routed_by_cache", "role", "decode", NULL),
    PD_STAT_PROM_LE("request_ttft", S), PD_STAT_PROM_LE("request_inter_token", MS),
    PD_STAT_PROM_LE("request_e2e", S), PD_STAT_PROM_LE("request_queue_time", S),
    PD_STAT_PROM_LE("kv_transfer", MS), PD_STAT_PROM_LE("failover_resume", MS),
    PD_STAT_PROM_LE("migration_resume", MS), PD_STAT_PROM_LE("kv_src_export_time", MS),
    PD_STAT_PROM_LE("tokenize_time", MS), PD_STAT_PROM_LE("kv_pull_tail", MS),
};
static const pd_stats_table_t rtr_stats_table =
    PD_STATS_TABLE_PROM("router", rtr_stat_descs, rtr_stat_prom);

static const char *const disagg_modes[] = { "threshold", "always", "never", "cost", NULL };

#define ROW(field, key, type, def, help, min, max) \
    PD_CFG_ROW(rtr_cfg_t, field, key, type, def, help, min, max, NULL)
static const pd_cfg_field_t rtr_cfg_fields[] = {
    ROW(id, "id", STRING, "router", "router id (sent in REGISTER_ACK)", 0, 0),
    ROW(http, "http", STRING, "127.0.0.1:8000", "HTTP listen address host:port (port 0: any)", 0, 0),
    ROW(control, "control", STRING, "127.0.0.1:7000",
        "control-plane listen address host:port (port 0: any)", 0, 0),
    PD_BOOT_ROWS(rtr_cfg_t, boot),
    ROW(model, "model", STRING, NULL, "GGUF path (tokenizer, chat template) or sim:<preset or spec>", 0, 0),
    ROW(engine, "engine", STRING, NULL, "llama|sim (default: sim for sim: models, else llama)", 0, 0),
    ROW(served_model_name, "served-model-name", STRING, NULL,
        "model id in the API (default: the model's file name or spec)", 0, 0),
    ROW(chat_template, "chat-template", STRING, NULL,
        "chat template override by name (eng_chat names: chatml, llama3, ...)", 0, 0),
    ROW(api_key, "api-key", STRING, NULL,
        "require Authorization: Bearer <key> on /v1/*; several keys comma-separated, each "
        "its own prefix-cache partition", 0, 0),
    PD_CFG_ROW(rtr_cfg_t, disagg_mode, "disagg-mode", ENUM, "threshold",
               "threshold|always|never|cost: when to prefill on a prefill daemon", 0, 0,
               disagg_modes),
    ROW(disagg_threshold, "disagg-threshold", UINT, "32",
        "prompts the chosen decode lacks at least this many tokens of are disaggregated", 0, 1e9),
    ROW(max_body, "max-body", SIZE, "1MiB", "largest request body (413 above)", 1024, 1e9),
    ROW(max_body_hard, "max-body-hard", SIZE, "16MiB",
        "bodies above this are cut by libevent (plain 413)", 1024, 4e9),
    ROW(max_tokens_cap, "max-tokens-cap", UINT, "32768", "largest max_tokens accepted", 1, 1e7),
    ROW(default_max_tokens, "default-max-tokens", UINT, "256", "max_tokens when the client sends none", 1, 1e7),
    ROW(n_cap, "n-cap", UINT, "8", "largest n (choices per request) accepted", 1, RTR_OAI_MAX_N),
    ROW(max_concurrent, "max-concurrent", UINT, "1024", "requests in flight before 429", 1, 1e7),
    ROW(max_retries, "max-retries", UINT, "2", "decode-local retries per request (also failovers)", 0, 16),
    ROW(context_length, "context-length", UINT, "0",
        "context length (0: from the model, else from the first daemon)", 0, 1e9),
    ROW(heartbeat_interval_ns, "heartbeat-interval", DURATION, "500ms",
        "heartbeat period (idle for 3 periods = down)", 1e6, 6e10),
    ROW(request_timeout_ns, "request-timeout", DURATION, "600s", "end-to-end request budget", 1e6, 864e11),
    ROW(drain_timeout_ns, "drain-timeout", DURATION, "30s", "SIGTERM: wait this long for streams", 0, 36e11),
    ROW(lease_ns, "lease-ttl", DURATION, "30s",
        "KV lease length announced to daemons (the prefill's own range: 1ms..600s)", 1e6, 600e9),
    ROW(retry_after, "retry-after", UINT, "1", "Retry-After seconds on 429/503", 1, 3600),
    ROW(client_max_unsent, "client-max-unsent", SIZE, "8MiB",
        "response bytes queued to a client that does not read before it is dropped", 4096, 1e10),
    ROW(http_max_conns, "http-max-conns", UINT, "1024",
        "open HTTP connections at most (accepting pauses at the cap)", 1, 1e6),
    ROW(http_max_conns_per_client, "http-max-conns-per-client", UINT, "256",
        "open HTTP connections per client address (more get 503)", 1, 1e6),
    ROW(http_read_timeout_ns, "http-read-timeout", DURATION, "30s",
        "a request's headers and body must arrive within this (slow clients are closed)",
        1e8, 36e11),
    ROW(tok_threads, "tokenize-threads", UINT, "2",
        "threads that tokenize large prompts off the event loop (0: on the loop)", 0, 64),
    ROW(tok_queue, "tokenize-queue", UINT, "64",
        "large prompts waiting for a tokenize thread at most (503 above)", 1, 1e6),
    ROW(tok_inline_bytes, "tokenize-inline-bytes", SIZE, "16KiB",
        "prompts up to this size are tokenized on the event loop", 0, 1e9),
    ROW(kv_routing, "kv-routing", BOOL, "true",
        "route by the daemons' cached prompt prefixes (their KV_EVENTS)", 0, 0),
    ROW(kv_index_names, "kv-index-names", UINT, "262144",
        "KV index: block names held at most (32 bytes each, allocated at boot)", 1, 1 << 26),
    ROW(kv_index_per_backend, "kv-index-per-backend", UINT, "65536",
        "KV index: block names of one backend at most (a daemon's kv-blocks is plenty)",
        1, 1 << 26),
    ROW(kv_pull_min_blocks, "kv-pull-min-blocks", UINT, "1",
        "a prefill pulls a decode's cached prefix of the prompt when that decode holds at least "
        "this many more blocks of it than the prefill (0 = never)", 0, 1 << 20),
    ROW(kv_export_timeout_ns, "kv-export-timeout", DURATION, "250ms",
        "wait this long for a decode's prefix export, then prefill without it", 1e6, 60e9),
    ROW(etcd, "etcd", STRING, NULL,
        "etcd client address host:port: register routers/<id> under etcd.prefix (off by default)", 0, 0),
    ROW(etcd_prefix, "etcd.prefix", STRING, "/pdserve/default/",
        "deployment prefix in etcd (ends with /)", 0, 0),
    ROW(etcd_ttl_ns, "etcd.ttl", DURATION, "5s", "lease TTL of the router's etcd key", 1e9, 3600e9),
    ROW(etcd_advertise, "etcd.advertise", STRING, NULL,
        "control address published in etcd (default: the bound control address)", 0, 0),
    ROW(ready_file, "ready-file", STRING, NULL,
        "write {\"http\":port,\"control\":port} here once listening", 0, 0),
    PD_CFG_END,
};

/* --check-config: the secret as load_secret would load it */
static pd_status_t rtr_check_config(const void *target, char *err, size_t err_len)
{
    const rtr_cfg_t *c = target;
    const char *addrs[] = { c->control, c->http };
    proto_auth_secret_t s;
    bool have = false, warn = false;
    pd_status_t st = proto_auth_secret_resolve(c->boot.secret_file, c->boot.secret,
                                               c->boot.insecure_no_auth, addrs, 2,
                                               "--http and --control", &s, &have, &warn, err,
                                               err_len);
    if (have)
        proto_auth_secret_wipe(&s);
    return st;
}

static const pd_cfg_schema_t rtr_cfg_schema = {
    .prog = "pd-router",
    .summary = "pd-router [--config FILE] [--key=value ...]  OpenAI-compatible PD router",
    .fields = rtr_cfg_fields,
    .check = rtr_check_config,
};

/* admin `membership`: the etcd registration (off: etcd null). */
static pd_status_t rtr_admin_membership(pd_admin_req_t *req, cJSON *reply)
{
    rtr_t *r = req->arg;
    if (r->member == NULL) {
        cJSON_AddNullToObject(reply, "etcd");
        return PD_OK;
    }
    char err[160], key[200];
    cJSON *e = cJSON_AddObjectToObject(reply, "etcd");
    cJSON_AddStringToObject(e, "endpoint", r->cfg.etcd);
    snprintf(key, sizeof(key), "%srouters/%s", r->cfg.etcd_prefix, r->cfg.id);
    cJSON_AddStringToObject(e, "key", key);
    cJSON_AddBoolToObject(e, "connected", pd_member_connected(r->member, err, sizeof(err)));
    cJSON_AddStringToObject(e, "last_error", err);
    return PD_OK;
}

/* admin `set-disagg-mode <mode>`: disagg-mode at run time (pdctl autoscale
 * switches PD-mixed = never and back); the next request decides with it. */
static pd_status_t rtr_admin_set_disagg_mode(pd_admin_req_t *req, cJSON *reply)
{
    rtr_t *r = req->arg;
    for (int m = 0; req->argc == 1 && disagg_modes[m] != NULL; m++) {
        if (strcmp(req->argv[0], disagg_modes[m]) == 0) {
            r->cfg.disagg_mode = m;
            cJSON_AddStringToObject(reply, "disagg_mode", disagg_modes[m]);
            return PD_OK;
        }
    }
    return pd_admin_req_error(req, PD_ERR_BAD_INPUT,
                              "usage: set-disagg-mode threshold|always|never|cost");
}

static const pd_admin_cmd_t rtr_admin_cmds[] = {
    { "membership", PD_ADMIN_USER, rtr_admin_membership,
      "membership - etcd registration (routers/<id>): connected, last error" },
    { "backends", PD_ADMIN_USER, rtr_admin_backends,
      "backends - registered daemons: role, state, load, last heartbeat" },
    { "set-backend", PD_ADMIN_ADMIN, rtr_admin_set_backend,
      "set-backend <id> ready|drain|maint - change a backend's routing state" },
    { "set-disagg-mode", PD_ADMIN_ADMIN, rtr_admin_set_disagg_mode,
      "set-disagg-mode threshold|always|never|cost - when to prefill on a prefill daemon, now" },
    { "planner", PD_ADMIN_USER, rtr_admin_planner,
      "planner - counters, TTFT / inter-token histogram buckets and cost rates for pdctl autoscale" },
    { "requests", PD_ADMIN_USER, rtr_admin_requests,
      "requests - requests in flight with state and per-state times" },
    PD_ADMIN_CMD_END,
};

static bool is_sim(const rtr_cfg_t *c)
{
    if (c->engine != NULL && c->engine[0] != '\0')
        return strcmp(c->engine, "sim") == 0;
    return c->model != NULL && strncmp(c->model, "sim:", 4) == 0;
}

static pd_status_t load_model(rtr_t *r)
{
    rtr_cfg_t *c = &r->cfg;
    char err[256] = "";
    bool sim = is_sim(c);
    pd_status_t s;
    if (c->model == NULL || c->model[0] == '\0') {
        fprintf(stderr, "pd-router: --model is required (GGUF path or sim:<preset>)\n");
        return PD_ERR_BAD_INPUT;
    }
    s = eng_tok_load_for(sim ? "sim" : "llama", c->model, &r->tok, err, sizeof(err));
    if (s != PD_OK) {
        fprintf(stderr, "pd-router: --model %s: tokenizer: %s%s%s\n", c->model,
                pd_status_str(s), err[0] ? ": " : "", err);
        return s;
    }
    /* The sim engine's vocabulary is the preset's (e.g. 128256) while its
     * text is the byte tokenizer's: the daemons' vocab is taken as is. */
    r->tok_vocab_fixed = !sim;
    r->context_length = (uint32_t)c->context_length;
    if (!sim && r->context_length == 0) {
        gguf_t *g = NULL;
        if (gguf_open(c->model, &g, err, sizeof(err)) == PD_OK) {
            char key[96];
            const char *arch = NULL;
            uint64_t alen = 0;
            if (gguf_get_string(g, "general.architecture", &arch, &alen) == PD_OK &&
                alen < 64) {
                uint32_t v;
                snprintf(key, sizeof(key), "%.*s.context_length", (int)alen, arch);
                if (gguf_get_u32(g, key, &v) == PD_OK)
                    r->context_length = v;
            }
            gguf_close(g);
        }
    }
    s = eng_chat_for_tok(r->tok, c->chat_template, &r->chat_kind);
    r->chat_ok = s == PD_OK;
    if (!r->chat_ok && c->chat_template != NULL && c->chat_template[0] != '\0') {
        fprintf(stderr, "pd-router: --chat-template: unknown template '%s'\n", c->chat_template);
        return PD_ERR_BAD_INPUT;
    }
    const char *name = c->served_model_name;
    if (name == NULL || name[0] == '\0') {
        name = c->model;
        if (!sim) {
            const char *slash = strrchr(name, '/');
            if (slash != NULL)
                name = slash + 1;
        }
    }
    snprintf(r->model_name, sizeof(r->model_name), "%s", name);
    pd_log(PD_LOG_INFO, RTR_COMP, NULL,
           "model '%s': tokenizer %s vocab %u, chat template %s, context length %u%s",
           r->model_name, eng_tok_model_name(r->tok), eng_tok_vocab_size(r->tok),
           r->chat_ok ? eng_chat_name(r->chat_kind) : "none", r->context_length,
           r->context_length ? "" : " (from the first daemon)");
    return PD_OK;
}

static pd_status_t load_secret(rtr_t *r)
{
    const rtr_cfg_t *c = &r->cfg;
    const char *addrs[] = { c->control, c->http };
    pd_status_t s = proto_auth_boot_secret("pd-router", c->boot.secret_file, c->boot.secret,
                                           c->boot.insecure_no_auth, addrs, 2, "--http and --control",
                                           &r->secret, &r->auth);
    if (s == PD_OK && !r->auth)
        pd_log(PD_LOG_WARN, RTR_COMP, NULL,
               "*** RUNNING WITHOUT CONTROL-PLANE AUTHENTICATION (--insecure-no-auth) ***");
    return s;
}

static pd_status_t write_ready_file(rtr_t *r)
{
    if (r->cfg.ready_file == NULL || r->cfg.ready_file[0] == '\0')
        return PD_OK;
    char text[128];
    snprintf(text, sizeof(text), "{\"http\":%u,\"control\":%u,\"pid\":%d}", r->http_port,
             r->ctl_port, (int)getpid());
    return pd_ready_file_write(r->cfg.ready_file, text);
}

/* etcd: log when the registration comes and goes (the key itself is the
 * worker's business). */
static void on_member_change(void *arg)
{
    rtr_t *r = arg;
    char err[160];
    bool up = pd_member_connected(r->member, err, sizeof(err));
    if (up != r->member_up)
        pd_log(up ? PD_LOG_INFO : PD_LOG_WARN, RTR_COMP, NULL, "etcd %s: %s%s", r->cfg.etcd,
               up ? "registered as routers/" : "unreachable: ", up ? r->cfg.id : err);
    r->member_up = up;
}

/* Register routers/<id> = the control address daemons should dial, signed
 * (pd_etcd_value_sign) when there is a secret. */
static pd_status_t member_start(rtr_t *r)
{
    if (r->cfg.etcd == NULL)
        return PD_OK;
    char adv[160], key[160];
    if (r->cfg.etcd_advertise != NULL) {
        snprintf(adv, sizeof(adv), "%s", r->cfg.etcd_advertise);
    } else {
        const char *c = r->cfg.control, *colon = strrchr(c, ':');
        int hl = colon != NULL ? (int)(colon - c) : 0;
        if (hl == 0 || strncmp(c, "0.0.0.0", 7) == 0 || c[0] == '[') {
            fprintf(stderr, "pd-router: --etcd: give --etcd.advertise (control %s has no "
                    "dialable host)\n", c);
            return PD_ERR_BAD_INPUT;
        }
        snprintf(adv, sizeof(adv), "%.*s:%u", hl, c, r->ctl_port);
    }
    size_t pl = strlen(r->cfg.etcd_prefix);
    if (pl == 0 || r->cfg.etcd_prefix[pl - 1] != '/') {
        fprintf(stderr, "pd-router: --etcd.prefix must end with /\n");
        return PD_ERR_BAD_INPUT;
    }
    snprintf(key, sizeof(key), "routers/%s", r->cfg.id);
    /* signed with the deployment secret: daemons drop what does not verify
     * (without a secret, daemons take loopback addresses only) */
    char val[PD_MEMBER_VAL_MAX];
    if (!pd_etcd_key_ok(r->cfg.id, PROTO_DAEMON_ID_MAX)) {
        fprintf(stderr, "pd-router: --etcd: --id \"%s\" is not a key daemons take (1..%u of "
                "A-Z a-z 0-9 . _ -)\n", r->cfg.id, PROTO_DAEMON_ID_MAX);
        return PD_ERR_BAD_INPUT;
    }
    size_t al = strlen(adv);
    if (al >= sizeof(val)) {
        fprintf(stderr, "pd-router: --etcd.advertise: \"%s\" too long\n", adv);
        return PD_ERR_BAD_INPUT;
    }
    memcpy(val, adv, al + 1);
    if (r->auth) {
        uint8_t sk[PD_ETCD_SIG_KEY_LEN];
        char full[320];
        proto_auth_derive(&r->secret, "pdserve etcd v1", sk);
        snprintf(full, sizeof(full), "%s%s", r->cfg.etcd_prefix, key);
        pd_status_t sst = pd_etcd_value_sign(sk, full, adv, val, sizeof(val));
        sodium_memzero(sk, sizeof(sk));
        if (sst != PD_OK) {
            fprintf(stderr, "pd-router: --etcd.advertise: \"%s\" too long to sign (at most %u "
                    "bytes)\n", adv, PD_MEMBER_VAL_MAX - PD_ETCD_SIG_OVERHEAD - 1);
            return PD_ERR_BAD_INPUT;
        }
    }
    pd_member_opts_t mo = {
        .endpoint = r->cfg.etcd, .prefix = r->cfg.etcd_prefix, .key = key, .value = val,
        .ttl_s = (uint32_t)(r->cfg.etcd_ttl_ns / 1000000000ull), .watch = NULL,
        .on_change = on_member_change, .arg = r,
    };
    pd_status_t st = pd_member_start(r->base, &mo, &r->member);
    if (st != PD_OK)
        fprintf(stderr, "pd-router: --etcd %s: %s\n", r->cfg.etcd, pd_status_str(st));
    return st;
}

static void on_drain(pd_loop_t *loop, void *arg)
{
    rtr_http_drain(arg);
}

/* Embedding inputs (rtr_embed_job.c) first, then the request flow. */
static void on_backend_msg(rtr_t *r, rtr_backend_t *be, const proto_msg_t *msg)
{
    if (!rtr_emb_job_msg(r, be, msg))
        rtr_flow_on_msg(r, be, msg);
}

static void on_backend_down(rtr_t *r, rtr_backend_t *be)
{
    rtr_emb_job_down(r, be);
    rtr_flow_backend_down(r, be);
}

int main(int argc, char **argv)
{
    static rtr_t router;
    rtr_t *r = &router;
    pd_cfg_result_t res;
    int rc = 1;
    pd_status_t s;

    pd_config_load_or_exit(&rtr_cfg_schema, &r->cfg, argc, argv, &res);
    if (pd_log_boot("pd-router", r->cfg.boot.log_level, r->cfg.boot.log_format,
                    r->cfg.boot.log_file) != PD_OK) {
        pd_config_result_free(&res);
        return 2;
    }
    if (sodium_init() < 0) {
        fprintf(stderr, "pd-router: libsodium init failed\n");
        goto err_cfg;
    }
    randombytes_buf(&r->incarnation, sizeof(r->incarnation));
    r->created = (int64_t)(pd_wall_ns() / PD_NS_PER_S);
    if (load_secret(r) != PD_OK) {
        rc = 2;
        goto err_cfg;
    }
    if (load_model(r) != PD_OK) {
        rc = 2;
        goto err_secret;
    }
    if (pd_stats_create(&rtr_stats_table, (const char *[]){ "model", r->model_name, NULL },
                        &r->stats) != PD_OK)
        goto err_tok;
    if (pd_loop_create(&r->loop) != PD_OK)
        goto err_stats;
    r->base = pd_loop_base(r->loop);
    pd_loop_on_drain(r->loop, on_drain, r);

    if (r->cfg.boot.admin_socket != NULL && r->cfg.boot.admin_socket[0] != '\0') {
        pd_admin_opts_t ao = {
            .path = r->cfg.boot.admin_socket,
            .prog = "pd-router",
            .cfg_schema = &rtr_cfg_schema,
            .cfg_target = &r->cfg,
        };
        s = pd_admin_create(r->loop, &ao, &r->admin);
        if (s != PD_OK) {
            pd_log(PD_LOG_ERROR, RTR_COMP, NULL, "admin socket %s: %s", r->cfg.boot.admin_socket,
                   pd_status_str(s));
            goto err_loop;
        }
        pd_admin_register(r->admin, rtr_admin_cmds, r);
        pd_admin_add_stats(r->admin, r->stats);
    }
    if (r->cfg.kv_routing) {
        uint64_t per = r->cfg.kv_index_per_backend < r->cfg.kv_index_names
                           ? r->cfg.kv_index_per_backend : r->cfg.kv_index_names;
        s = rtr_kvindex_create((uint32_t)r->cfg.kv_index_names, (uint32_t)per, &r->kvidx);
        if (s != PD_OK) {
            pd_log(PD_LOG_ERROR, RTR_COMP, NULL, "KV index: %s", pd_status_str(s));
            goto err_admin;
        }
    }
    r->out = &rtr_http_out;
    r->on_backend_msg = on_backend_msg;
    r->on_backend_down = on_backend_down;
    r->on_backend_drain = rtr_flow_migrate_from;
    s = rtr_ctl_start(r);
    if (s != PD_OK) {
        pd_log(PD_LOG_ERROR, RTR_COMP, NULL, "control listener %s: %s", r->cfg.control,
               pd_status_str(s));
        goto err_admin;
    }
    s = rtr_http_start(r);
    if (s != PD_OK) {
        pd_log(PD_LOG_ERROR, RTR_COMP, NULL, "HTTP listener %s: %s", r->cfg.http,
               pd_status_str(s));
        goto err_ctl;
    }
    pd_log(PD_LOG_INFO, RTR_COMP, NULL, "listening http=%s (port %u) control=%s (port %u)%s",
           r->cfg.http, r->http_port, r->cfg.control, r->ctl_port,
           r->auth ? "" : " (no auth)");
    if (member_start(r) != PD_OK) {
        rc = 2;
        goto err_http;
    }
    if (write_ready_file(r) != PD_OK) {
        pd_log(PD_LOG_ERROR, RTR_COMP, NULL, "ready file %s: cannot write: %s", r->cfg.ready_file,
               strerror(errno));
        goto err_http;
    }
    {
        char status[256];
        snprintf(status, sizeof(status), "serving: http %s (port %u), control %s (port %u)",
                 r->cfg.http, r->http_port, r->cfg.control, r->ctl_port);
        pd_loop_notify_ready(status);
    }
    s = pd_loop_run(r->loop);
    rc = s == PD_OK ? 0 : 1;
    pd_log(PD_LOG_INFO, RTR_COMP, NULL, "exiting: accepted %" PRIu64 " = completed %" PRIu64
           " + failed %" PRIu64 " + canceled %" PRIu64 " (+%u in flight)",
           pd_stats_counter(r->stats, RTR_STAT_requests_accepted),
           pd_stats_counter(r->stats, RTR_STAT_requests_completed),
           pd_stats_counter(r->stats, RTR_STAT_requests_failed),
           pd_stats_counter(r->stats, RTR_STAT_requests_canceled), r->n_reqs);
err_http:
    pd_member_stop(r->member);   /* our key goes at once (lease revoked) */
    r->member = NULL;
    rtr_http_stop(r);
err_ctl:
    rtr_ctl_stop(r);
err_admin:
    rtr_kvindex_destroy(r->kvidx);
    r->kvidx = NULL;
    if (r->admin != NULL) {
        for (size_t i = 0; i < RTR_MAX_BACKENDS; i++)
            if (r->be[i].stats != NULL)
                pd_admin_remove_stats(r->admin, r->be[i].stats);
        pd_admin_remove_stats(r->admin, r->stats);
    }
    pd_admin_destroy(r->admin);
err_loop:
    pd_loop_destroy(r->loop);
    for (size_t i = 0; i < RTR_MAX_BACKENDS; i++)
        pd_stats_destroy(r->be[i].stats);
    if (r->cfg.ready_file != NULL && rc == 0)
        unlink(r->cfg.ready_file);
err_stats:
    pd_stats_destroy(r->stats);
err_tok:
    eng_tok_destroy(r->tok);
err_secret:
    proto_auth_secret_wipe(&r->secret);
err_cfg:
    pd_config_free(&rtr_cfg_schema, &r->cfg);
    pd_config_result_free(&res);
    pd_log_close();
    return rc;
}
