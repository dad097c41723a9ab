/* pd_admin.c - admin socket server on the daemon's libevent loop. */
#include "pd_admin.h"
#include "pd_alloc.h"
#include "pd_log.h"
#include "pd_time.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define ADMIN_MAX_WORDS   32
#define ADMIN_MAX_TABLES  16
#define ADMIN_MAX_STATS   256
#define ADMIN_MAX_GROUPS  256

/* The server's own counters, shown by `stats` like any module's. */
#define PD_ADMIN_STATS(X)                                                     \
    X(connections,      COUNTER, "Admin connections accepted")                \
    X(rejected,         COUNTER, "Admin connections refused (max clients)")   \
    X(commands,         COUNTER, "Admin commands executed")                   \
    X(errors,           COUNTER, "Admin commands answered with an error")     \
    X(overlong,         COUNTER, "Admin clients closed for an overlong line") \
    X(dropped_output,   COUNTER, "Admin clients dropped: unread output cap")  \
    X(timeouts,         COUNTER, "Admin clients closed by the idle timeout")  \
    X(accept_errors,    COUNTER, "Admin accept() failures (e.g. out of fds)") \
    X(clients,          GAUGE,   "Admin clients connected")                   \
    X(command_latency,  HISTOGRAM, "Admin command handling time")

#define ADMIN_STAT_ID(name, kind, help) ADMIN_ST_##name,
typedef enum { PD_ADMIN_STATS(ADMIN_STAT_ID) ADMIN_ST__COUNT } admin_stat_id_t;
static const pd_stat_desc_t admin_stat_descs[] = { PD_ADMIN_STATS(PD_STAT_DESC) };
static const pd_stat_prom_t admin_stat_prom[] = { PD_STAT_PROM_LE("command_latency", US) };
static const pd_stats_table_t admin_stats_table =
    PD_STATS_TABLE_PROM("admin", admin_stat_descs, admin_stat_prom);

typedef struct admin_client {
    pd_admin_t *admin;
    struct bufferevent *bev;
    struct admin_client *prev, *next;
    uid_t uid;
    gid_t gid;
    pid_t pid;
    pd_admin_level_t level;
    bool closing;               /* reply queued, close once flushed */
} admin_client_t;

typedef struct {
    const pd_admin_cmd_t *cmds;
    void *arg;
} admin_table_t;

struct pd_admin {
    pd_loop_t *loop;
    struct evconnlistener *listener;
    char *path;
    char *prog;
    char *version;
    gid_t operator_gid;
    bool have_operator_gid;
    unsigned max_clients;
    size_t max_line;
    size_t max_output;
    uint64_t idle_timeout_ns;
    const pd_cfg_schema_t *cfg_schema;
    const void *cfg_target;
    uint64_t started_ns;
    char *rx;                   /* (max_line + 1) the line as received */
    char *line;                 /* (max_line + 1) its copy split into words */
    admin_client_t *clients;
    unsigned n_clients;
    admin_table_t tables[ADMIN_MAX_TABLES];
    unsigned n_tables;
    pd_stats_t *stats[ADMIN_MAX_STATS];
    unsigned n_stats;
    pd_stats_t *own_stats;
    struct event *ev_resume;    /* re-enables accept after EMFILE & co */
    bool bound;                 /* we created the socket file */
};

static const char *const level_names[] = { "user", "operator", "admin" };

const char *pd_admin_level_name(pd_admin_level_t level)
{
    if ((unsigned)level > PD_ADMIN_ADMIN)
        return "unknown";
    return level_names[level];
}

unsigned pd_admin_client_count(const pd_admin_t *admin)
{
    return admin->n_clients;
}

const char *pd_admin_path(const pd_admin_t *admin)
{
    return admin->path;
}

pd_status_t pd_admin_req_error(pd_admin_req_t *req, pd_status_t status,
                               const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(req->errmsg, sizeof(req->errmsg), fmt, ap);
    va_end(ap);
    return status;
}

/* ---- replies ----------------------------------------------------------- */

static void client_close(admin_client_t *c);

/* Printable ASCII copy of untrusted bytes for error messages. */
static void sanitize(char *dst, size_t dst_len, const char *src, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 4 < dst_len; i++) {
        unsigned char ch = (unsigned char)src[i];
        dst[o++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (n > 0 && o + 4 >= dst_len) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o] = '\0';
}

static cJSON *error_reply(pd_status_t status, const char *message)
{
    cJSON *r = cJSON_CreateObject();
    cJSON *e = cJSON_CreateObject();
    if (r == NULL || e == NULL ||
        !cJSON_AddBoolToObject(r, "ok", 0) ||
        !cJSON_AddStringToObject(e, "code", pd_status_name(status)) ||
        !cJSON_AddStringToObject(e, "message",
                                 message && message[0] ? message : pd_status_str(status)) ||
        !cJSON_AddItemToObject(r, "error", e)) {
        cJSON_Delete(r);
        cJSON_Delete(e);
        return NULL;
    }
    return r;
}

/* Queue one reply line. A client whose earlier replies still sit unsent
 * beyond max_output is not reading: it is dropped without this reply, so
 * memory per client stays under max_output + one reply. Returns false when
 * the client was closed. */
static bool client_send(admin_client_t *c, cJSON *reply)
{
    pd_admin_t *admin = c->admin;
    static const char oom[] =
        "{\"ok\":false,\"error\":{\"code\":\"ERR_NO_MEMORY\",\"message\":"
        "\"out of memory\"}}\n";
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (evbuffer_get_length(out) > admin->max_output) {
        PD_LOG_DEBUG("admin", "dropping client pid %d: %zu bytes unread",
                     (int)c->pid, evbuffer_get_length(out));
        pd_stats_inc(admin->own_stats, ADMIN_ST_dropped_output);
        client_close(c);
        return false;
    }
    char *text = reply ? cJSON_PrintUnformatted(reply) : NULL;
    if (text == NULL) {
        evbuffer_add(out, oom, sizeof(oom) - 1);
    } else {
        evbuffer_add(out, text, strlen(text));
        evbuffer_add(out, "\n", 1);
        cJSON_free(text);
    }
    return true;
}

static bool client_send_error(admin_client_t *c, pd_status_t status,
                              const char *message)
{
    cJSON *r = error_reply(status, message);
    pd_stats_inc(c->admin->own_stats, ADMIN_ST_errors);
    bool alive = client_send(c, r);
    cJSON_Delete(r);
    return alive;
}

/* ---- command dispatch -------------------------------------------------- */

static int split_words(char *s, char **words, int max)
{
    int n = 0;
    char *save = NULL;
    for (char *w = strtok_r(s, " \t", &save); w != NULL && n < max;
         w = strtok_r(NULL, " \t", &save))
        words[n++] = w;
    return n;
}

/* How many words of `name` match the start of words[]; 0 if it does not. */
static int name_match(const char *name, char **words, int n_words)
{
    int matched = 0;
    const char *p = name;
    while (*p) {
        const char *sp = strchr(p, ' ');
        size_t len = sp ? (size_t)(sp - p) : strlen(p);
        if (matched >= n_words || strlen(words[matched]) != len ||
            strncmp(words[matched], p, len) != 0)
            return 0;
        matched++;
        p += len;
        while (*p == ' ')
            p++;
    }
    return matched;
}

/* Length of the usage part of a help text ("name <a> [b]" before " - "). */
static size_t admin_usage_len(const pd_admin_cmd_t *cmd)
{
    const char *h = cmd->help ? cmd->help : cmd->name;
    const char *dash = strstr(h, " - ");
    return dash ? (size_t)(dash - h) : strlen(h);
}

/* Most arguments the usage names (each word after the command name, an
 * optional one in [] too); -1 = unlimited ("..."). */
static int admin_max_args(const pd_admin_cmd_t *cmd)
{
    const char *h = cmd->help ? cmd->help : cmd->name;
    size_t len = admin_usage_len(cmd);
    int words = 0, name_words = 1;
    for (const char *p = cmd->name; *p; p++)
        name_words += *p == ' ';
    bool in_word = false;
    for (size_t i = 0; i < len; i++) {
        if (h[i] == ' ') {
            in_word = false;
        } else if (!in_word) {
            in_word = true;
            words++;
        }
    }
    if (memmem(h, len, "...", 3) != NULL)
        return -1;
    return words > name_words ? words - name_words : 0;
}

static void dispatch(admin_client_t *c, const char *line, size_t len)
{
    pd_admin_t *admin = c->admin;
    char shown[80];

    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)line[i];
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f) {
            client_send_error(c, PD_ERR_BAD_INPUT,
                              "command contains binary data");
            return;
        }
    }
    char *buf = admin->line;
    memcpy(buf, line, len);
    buf[len] = '\0';
    char *words[ADMIN_MAX_WORDS];
    int n_words = split_words(buf, words, ADMIN_MAX_WORDS);
    if (n_words == 0) {
        client_send_error(c, PD_ERR_BAD_INPUT, "empty command (try \"help\")");
        return;
    }

    const pd_admin_cmd_t *best = NULL;
    void *best_arg = NULL;
    int best_words = 0;
    for (unsigned t = 0; t < admin->n_tables; t++) {
        for (const pd_admin_cmd_t *cmd = admin->tables[t].cmds; cmd->name; cmd++) {
            int m = name_match(cmd->name, words, n_words);
            if (m > best_words) {
                best = cmd;
                best_arg = admin->tables[t].arg;
                best_words = m;
            }
        }
    }
    if (best == NULL) {
        char msg[160];
        sanitize(shown, sizeof(shown), words[0], strlen(words[0]));
        snprintf(msg, sizeof(msg), "unknown command \"%s\" (try \"help\")", shown);
        client_send_error(c, PD_ERR_BAD_INPUT, msg);
        return;
    }
    if (c->level < best->level) {
        char msg[200];
        snprintf(msg, sizeof(msg), "\"%s\" needs level %s, you are %s",
                 best->name, pd_admin_level_name(best->level),
                 pd_admin_level_name(c->level));
        client_send_error(c, PD_ERR_PERMISSION, msg);
        return;
    }

    /* the help text is the usage: "name <a> [b] - ...": more words than it
     * names are refused ("drain now please" must not drain) */
    int max_args = admin_max_args(best);
    if (max_args >= 0 && n_words - best_words > max_args) {
        char msg[256];
        snprintf(msg, sizeof(msg), "too many arguments for \"%s\" (usage: %.*s)", best->name,
                 (int)admin_usage_len(best), best->help);
        client_send_error(c, PD_ERR_BAD_INPUT, msg);
        return;
    }

    /* raw remainder: skip the matched words in the original line */
    const char *rest = line;
    for (int w = 0; w < best_words; w++) {
        rest += strspn(rest, " \t");
        rest += strcspn(rest, " \t");
    }
    rest += strspn(rest, " \t");
    size_t rest_off = (size_t)(rest - line);

    pd_admin_req_t req = {
        .admin = admin, .level = c->level, .uid = c->uid, .pid = c->pid,
        .name = best->name, .argc = n_words - best_words,
        .argv = words + best_words, .arg = best_arg,
    };
    req.rest = line + rest_off;  /* line is NUL-terminated by the reader */

    cJSON *reply = cJSON_CreateObject();
    if (reply == NULL || !cJSON_AddBoolToObject(reply, "ok", 1)) {
        cJSON_Delete(reply);
        client_send_error(c, PD_ERR_NO_MEMORY, NULL);
        return;
    }
    uint64_t t0 = pd_now_ns();
    pd_status_t status = best->handler(&req, reply);
    pd_stats_observe_ns(admin->own_stats, ADMIN_ST_command_latency,
                        pd_now_ns() - t0);
    pd_stats_inc(admin->own_stats, ADMIN_ST_commands);
    if (status != PD_OK) {
        cJSON_Delete(reply);
        client_send_error(c, status, req.errmsg);
        return;
    }
    client_send(c, reply);
    cJSON_Delete(reply);
}

/* ---- client lifetime --------------------------------------------------- */

static void client_free(void *obj)
{
    admin_client_t *c = obj;
    if (c->bev != NULL)
        bufferevent_free(c->bev);   /* closes the fd */
    free(c);
}

/* Unlink now, free after the current callbacks (never inside one). */
static void client_close(admin_client_t *c)
{
    pd_admin_t *admin = c->admin;
    if (c->admin == NULL)
        return; /* already closing */
    if (c->prev)
        c->prev->next = c->next;
    else
        admin->clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    admin->n_clients--;
    pd_stats_gauge_set(admin->own_stats, ADMIN_ST_clients, admin->n_clients);
    c->admin = NULL;
    bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    bufferevent_setcb(c->bev, NULL, NULL, NULL, NULL);
    if (pd_loop_defer_free(admin->loop, client_free, c) != PD_OK)
        client_free(c); /* libevent tolerates freeing a bev in its callback */
}

/* Reply queued; close as soon as it is flushed. */
static void client_close_after_flush(admin_client_t *c)
{
    c->closing = true;
    bufferevent_disable(c->bev, EV_READ);
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        client_close(c);
}

/* A line over max-line: drop what is buffered, answer an error, close. */
static void client_overlong(admin_client_t *c, struct evbuffer *in, size_t avail)
{
    pd_admin_t *admin = c->admin;
    char msg[96];
    snprintf(msg, sizeof(msg), "line longer than %zu bytes", admin->max_line - 1);
    pd_stats_inc(admin->own_stats, ADMIN_ST_overlong);
    evbuffer_drain(in, avail);
    if (client_send_error(c, PD_ERR_TOO_BIG, msg))
        client_close_after_flush(c);
}

static void client_read_cb(struct bufferevent *bev, void *arg)
{
    admin_client_t *c = arg;
    pd_admin_t *admin = c->admin;
    struct evbuffer *in = bufferevent_get_input(bev);

    while (c->admin != NULL && !c->closing) {
        size_t eol_len = 0;
        struct evbuffer_ptr eol = evbuffer_search_eol(in, NULL, &eol_len,
                                                      EVBUFFER_EOL_LF);
        size_t avail = evbuffer_get_length(in);
        if (eol.pos < 0) {
            if (avail >= admin->max_line)
                client_overlong(c, in, avail);
            return;
        }
        size_t line_len = (size_t)eol.pos;
        if (line_len + 1 > admin->max_line) {
            client_overlong(c, in, avail);
            return;
        }
        char *line = admin->rx;
        evbuffer_remove(in, line, line_len);
        evbuffer_drain(in, eol_len);
        if (line_len > 0 && line[line_len - 1] == '\r')
            line_len--;
        line[line_len] = '\0';
        dispatch(c, line, line_len);
    }
}

static void client_write_cb(struct bufferevent *bev, void *arg)
{
    admin_client_t *c = arg;
    if (c->admin != NULL && c->closing &&
        evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        client_close(c);
}

static void client_event_cb(struct bufferevent *bev, short what, void *arg)
{
    admin_client_t *c = arg;
    if (c->admin == NULL)
        return;
    if (what & BEV_EVENT_TIMEOUT) {
        PD_LOG_DEBUG("admin", "client pid %d idle, closing", (int)c->pid);
        pd_stats_inc(c->admin->own_stats, ADMIN_ST_timeouts);
    }
    /* A half-close (`echo stats | socat - UNIX:...`) only ends the client's
     * side: finish writing the replies already queued, then close. The idle
     * timeout still bounds a client that stops reading. */
    if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR) &&
        evbuffer_get_length(bufferevent_get_output(bev)) > 0) {
        client_close_after_flush(c);
        return;
    }
    client_close(c);
}

static pd_admin_level_t peer_level(pd_admin_t *admin, int fd, uid_t uid, gid_t gid)
{
    if (uid == 0 || uid == geteuid())
        return PD_ADMIN_ADMIN;
    if (!admin->have_operator_gid)
        return PD_ADMIN_USER;
    if (gid == admin->operator_gid)
        return PD_ADMIN_OPERATOR;
#ifdef SO_PEERGROUPS
    /* supplementary groups as of connect(); no NSS lookup on the loop */
    gid_t groups[ADMIN_MAX_GROUPS];
    socklen_t len = sizeof(groups);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0) {
        for (size_t i = 0; i < len / sizeof(gid_t); i++)
            if (groups[i] == admin->operator_gid)
                return PD_ADMIN_OPERATOR;
    }
#endif
    return PD_ADMIN_USER;
}

static void reject_client(pd_admin_t *admin, int fd)
{
    static const char msg[] =
        "{\"ok\":false,\"error\":{\"code\":\"ERR_OVERLOADED\",\"message\":"
        "\"too many admin clients\"}}\n";
    ssize_t w = send(fd, msg, sizeof(msg) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)w;
    pd_stats_inc(admin->own_stats, ADMIN_ST_rejected);
    close(fd);
}

static void accept_cb(struct evconnlistener *lst, evutil_socket_t fd,
                      struct sockaddr *sa, int socklen, void *arg)
{
    pd_admin_t *admin = arg;
    struct ucred cred = { .pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1 };
    socklen_t clen = sizeof(cred);

    if (admin->n_clients >= admin->max_clients) {
        reject_client(admin, fd);
        return;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
        close(fd);
        return;
    }
    admin_client_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        close(fd);
        return;
    }
    c->bev = bufferevent_socket_new(pd_loop_base(admin->loop), fd,
                                    BEV_OPT_CLOSE_ON_FREE);
    if (c->bev == NULL) {
        close(fd);
        free(c);
        return;
    }
    c->admin = admin;
    c->uid = cred.uid;
    c->gid = cred.gid;
    c->pid = cred.pid;
    c->level = peer_level(admin, fd, cred.uid, cred.gid);
    struct timeval idle = pd_ns_to_timeval(admin->idle_timeout_ns);
    bufferevent_set_timeouts(c->bev, &idle, &idle);
    /* bound the input held per client: a line cannot exceed max_line */
    bufferevent_setwatermark(c->bev, EV_READ, 0, admin->max_line * 4);
    bufferevent_setcb(c->bev, client_read_cb, client_write_cb, client_event_cb, c);
    if (bufferevent_enable(c->bev, EV_READ | EV_WRITE) != 0) {
        bufferevent_free(c->bev);
        free(c);
        return;
    }
    c->next = admin->clients;
    if (admin->clients)
        admin->clients->prev = c;
    admin->clients = c;
    admin->n_clients++;
    pd_stats_inc(admin->own_stats, ADMIN_ST_connections);
    pd_stats_gauge_set(admin->own_stats, ADMIN_ST_clients, admin->n_clients);
    PD_LOG_DEBUG("admin", "client pid %d uid %d level %s", (int)cred.pid,
                 (int)cred.uid, pd_admin_level_name(c->level));
}

/* accept() failed (EMFILE, ENFILE, ENOBUFS...): the listening fd stays
 * readable, so pause accepting for a moment instead of spinning. */
static void accept_error_cb(struct evconnlistener *lst, void *arg)
{
    pd_admin_t *admin = arg;
    struct timeval tv = { 0, 100 * 1000 };
    PD_LOG_DEBUG("admin", "accept: %s; pausing 100ms", strerror(errno));
    pd_stats_inc(admin->own_stats, ADMIN_ST_accept_errors);
    evconnlistener_disable(lst);
    event_add(admin->ev_resume, &tv);
}

static void accept_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    pd_admin_t *admin = arg;
    evconnlistener_enable(admin->listener);
}

/* ---- built-in commands ------------------------------------------------- */

static pd_status_t cmd_help(pd_admin_req_t *req, cJSON *reply)
{
    pd_admin_t *admin = req->admin;
    cJSON *arr = cJSON_AddArrayToObject(reply, "commands");
    if (arr == NULL)
        return PD_ERR_NO_MEMORY;
    for (unsigned t = 0; t < admin->n_tables; t++) {
        for (const pd_admin_cmd_t *cmd = admin->tables[t].cmds; cmd->name; cmd++) {
            cJSON *o = cJSON_CreateObject();
            if (o == NULL || !cJSON_AddItemToArray(arr, o)) {
                cJSON_Delete(o);
                return PD_ERR_NO_MEMORY;
            }
            if (!cJSON_AddStringToObject(o, "name", cmd->name) ||
                !cJSON_AddStringToObject(o, "level", pd_admin_level_name(cmd->level)) ||
                !cJSON_AddStringToObject(o, "help", cmd->help ? cmd->help : ""))
                return PD_ERR_NO_MEMORY;
        }
    }
    if (!cJSON_AddStringToObject(reply, "your_level", pd_admin_level_name(req->level)))
        return PD_ERR_NO_MEMORY;
    return PD_OK;
}

static pd_status_t cmd_version(pd_admin_req_t *req, cJSON *reply)
{
    pd_admin_t *admin = req->admin;
    if (!cJSON_AddStringToObject(reply, "prog", admin->prog) ||
        !cJSON_AddStringToObject(reply, "version", admin->version) ||
        !cJSON_AddNumberToObject(reply, "pid", (double)getpid()))
        return PD_ERR_NO_MEMORY;
    return PD_OK;
}

cJSON *pd_admin_stats_json(pd_admin_t *admin)
{
    cJSON *obj = cJSON_CreateObject();
    cJSON *arr = obj ? cJSON_AddArrayToObject(obj, "stats") : NULL;
    if (arr == NULL)
        goto err;
    for (unsigned i = 0; i <= admin->n_stats; i++) {
        pd_stats_t *s = i < admin->n_stats ? admin->stats[i] : admin->own_stats;
        cJSON *o = cJSON_CreateObject();
        if (o == NULL || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            goto err;
        }
        cJSON *labels = cJSON_AddObjectToObject(o, "labels");
        if (!cJSON_AddStringToObject(o, "table", pd_stats_table(s)->prefix) ||
            labels == NULL)
            goto err;
        const char *const *l = pd_stats_labels(s);
        for (size_t k = 0; l[k] != NULL; k += 2)
            if (!cJSON_AddStringToObject(labels, l[k], l[k + 1]))
                goto err;
        cJSON *values = pd_stats_to_json(s);
        if (values == NULL || !cJSON_AddItemToObject(o, "values", values)) {
            cJSON_Delete(values);
            goto err;
        }
    }
    cJSON *proc = cJSON_AddObjectToObject(obj, "process");
    if (proc == NULL ||
        !cJSON_AddNumberToObject(proc, "pid", (double)getpid()) ||
        !cJSON_AddNumberToObject(proc, "uptime_s",
                                 (double)(pd_now_ns() - admin->started_ns) / 1e9))
        goto err;
    cJSON *je = cJSON_AddObjectToObject(obj, "jemalloc");
    pd_alloc_stats_t as;
    if (je == NULL)
        goto err;
    if (pd_alloc_stats(&as) == PD_OK) {
        if (!cJSON_AddNumberToObject(je, "allocated", (double)as.allocated) ||
            !cJSON_AddNumberToObject(je, "active", (double)as.active) ||
            !cJSON_AddNumberToObject(je, "resident", (double)as.resident) ||
            !cJSON_AddNumberToObject(je, "mapped", (double)as.mapped))
            goto err;
    } else if (!cJSON_AddStringToObject(je, "note", pd_alloc_have_jemalloc()
                                            ? "jemalloc stats unavailable"
                                            : "not built with jemalloc")) {
        goto err;
    }
    return obj;
err:
    cJSON_Delete(obj);
    return NULL;
}

static pd_status_t cmd_stats(pd_admin_req_t *req, cJSON *reply)
{
    cJSON *s = pd_admin_stats_json(req->admin);
    if (s == NULL)
        return PD_ERR_NO_MEMORY;
    /* move the members into the reply after "ok" */
    cJSON *item;
    while ((item = s->child) != NULL) {
        cJSON_DetachItemViaPointer(s, item);
        cJSON_AddItemToObject(reply, item->string, item);
    }
    cJSON_Delete(s);
    return PD_OK;
}

static pd_status_t cmd_perf_schema(pd_admin_req_t *req, cJSON *reply)
{
    static const char *const kinds[] = { "counter", "gauge", "histogram" };
    pd_admin_t *admin = req->admin;
    cJSON *arr = cJSON_AddArrayToObject(reply, "schema");
    if (arr == NULL)
        return PD_ERR_NO_MEMORY;
    for (unsigned i = 0; i <= admin->n_stats; i++) {
        const pd_stats_table_t *t =
            pd_stats_table(i < admin->n_stats ? admin->stats[i] : admin->own_stats);
        bool seen = false;
        for (unsigned k = 0; k < i && k < admin->n_stats; k++)
            if (pd_stats_table(admin->stats[k]) == t)
                seen = true;
        if (seen)
            continue;
        for (size_t d = 0; d < t->n; d++) {
            cJSON *o = cJSON_CreateObject();
            if (o == NULL || !cJSON_AddItemToArray(arr, o)) {
                cJSON_Delete(o);
                return PD_ERR_NO_MEMORY;
            }
            if (!cJSON_AddStringToObject(o, "table", t->prefix) ||
                !cJSON_AddStringToObject(o, "name", t->descs[d].name) ||
                !cJSON_AddStringToObject(o, "kind", kinds[t->descs[d].kind]) ||
                !cJSON_AddStringToObject(o, "help", t->descs[d].help))
                return PD_ERR_NO_MEMORY;
        }
    }
    return PD_OK;
}

pd_status_t pd_admin_stats_prometheus(pd_admin_t *admin, char **text_p,
                                      size_t *len_p)
{
    pd_stats_t *sets[ADMIN_MAX_STATS + 1];
    memcpy(sets, admin->stats, admin->n_stats * sizeof(sets[0]));
    sets[admin->n_stats] = admin->own_stats;
    return pd_stats_render_scrape(sets, admin->n_stats + 1, text_p, len_p);
}

static pd_status_t cmd_stats_prometheus(pd_admin_req_t *req, cJSON *reply)
{
    char *text;
    pd_status_t status = pd_admin_stats_prometheus(req->admin, &text, NULL);
    if (status != PD_OK)
        return status;
    if (!cJSON_AddStringToObject(reply, "text", text)) {
        free(text);
        return PD_ERR_NO_MEMORY;
    }
    free(text);
    return PD_OK;
}

static pd_status_t cmd_config_show(pd_admin_req_t *req, cJSON *reply)
{
    pd_admin_t *admin = req->admin;
    bool ini = req->argc > 0 && strcmp(req->argv[0], "ini") == 0;
    if (req->argc > 0 && !ini)
        return pd_admin_req_error(req, PD_ERR_BAD_INPUT,
                                  "usage: config show [ini]");
    if (admin->cfg_schema == NULL) {
        if (cJSON_AddObjectToObject(reply, "config") == NULL)
            return PD_ERR_NO_MEMORY;
        return PD_OK;
    }
    if (ini) {
        char *text = pd_config_to_ini(admin->cfg_schema, admin->cfg_target);
        if (text == NULL || !cJSON_AddStringToObject(reply, "ini", text)) {
            free(text);
            return PD_ERR_NO_MEMORY;
        }
        free(text);
        return PD_OK;
    }
    cJSON *cfg = pd_config_to_json(admin->cfg_schema, admin->cfg_target);
    if (cfg == NULL || !cJSON_AddItemToObject(reply, "config", cfg)) {
        cJSON_Delete(cfg);
        return PD_ERR_NO_MEMORY;
    }
    return PD_OK;
}

static pd_status_t cmd_log_level(pd_admin_req_t *req, cJSON *reply)
{
    if (req->argc > 1)
        return pd_admin_req_error(req, PD_ERR_BAD_INPUT,
                                  "usage: log level [error|warn|info|debug|trace]");
    if (req->argc == 1) {
        pd_log_level_t lvl;
        if (req->level < PD_ADMIN_ADMIN)
            return pd_admin_req_error(req, PD_ERR_PERMISSION,
                                      "setting the log level needs level admin");
        if (pd_log_level_parse(req->argv[0], &lvl) != PD_OK)
            return pd_admin_req_error(req, PD_ERR_BAD_INPUT,
                                      "unknown log level (error|warn|info|debug|trace)");
        pd_log_set_level(lvl);
    }
    if (!cJSON_AddStringToObject(reply, "level", pd_log_level_name(pd_log_get_level())))
        return PD_ERR_NO_MEMORY;
    return PD_OK;
}

static pd_status_t cmd_stats_reset(pd_admin_req_t *req, cJSON *reply)
{
    pd_admin_t *admin = req->admin;
    for (unsigned i = 0; i < admin->n_stats; i++)
        pd_stats_reset(admin->stats[i]);
    return PD_OK;
}

static const pd_admin_cmd_t builtin_cmds[] = {
    { "help", PD_ADMIN_USER, cmd_help, "help - list commands" },
    { "version", PD_ADMIN_USER, cmd_version, "version - program and version" },
    { "stats", PD_ADMIN_USER, cmd_stats,
      "stats - counters, latency histograms, allocator and process info" },
    { "perf dump", PD_ADMIN_USER, cmd_stats, "perf dump - same as stats" },
    { "perf schema", PD_ADMIN_USER, cmd_perf_schema,
      "perf schema - every stat: table, name, kind, help" },
    { "stats prometheus", PD_ADMIN_USER, cmd_stats_prometheus,
      "stats prometheus - the stats as Prometheus text in \"text\"" },
    { "stats reset", PD_ADMIN_OPERATOR, cmd_stats_reset,
      "stats reset - zero counters and histograms" },
    { "config show", PD_ADMIN_OPERATOR, cmd_config_show,
      "config show [ini] - effective configuration" },
    { "log level", PD_ADMIN_USER, cmd_log_level,
      "log level [<level>] - show, or (admin) set the log level" },
    PD_ADMIN_CMD_END
};

/* ---- create / destroy -------------------------------------------------- */

/* Is something answering on `path`? Removes a stale socket file. */
static pd_status_t check_existing(const char *path, const struct sockaddr_un *sun)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? PD_OK : PD_ERR_IO;
    if (!S_ISSOCK(st.st_mode))
        return PD_ERR_EXISTS;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return PD_ERR_IO;
    int rc = connect(fd, (const struct sockaddr *)sun, sizeof(*sun));
    int err = errno;
    close(fd);
    if (rc == 0)
        return PD_ERR_EXISTS;  /* a live server owns it */
    if (err != ECONNREFUSED && err != ENOENT)
        return PD_ERR_IO;
    if (unlink(path) != 0 && errno != ENOENT)
        return PD_ERR_IO;
    PD_LOG_DEBUG("admin", "removed stale socket %s", path);
    return PD_OK;
}

static pd_status_t bind_socket(pd_admin_t *admin, const char *group, int *fd_p)
{
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    gid_t gid = (gid_t)-1;
    pd_status_t status;

    if (strlen(admin->path) >= sizeof(sun.sun_path))
        return PD_ERR_BAD_INPUT;
    memcpy(sun.sun_path, admin->path, strlen(admin->path) + 1);
    if (group != NULL) {
        struct group *gr = getgrnam(group); /* boot time: NSS is fine here */
        if (gr == NULL)
            return PD_ERR_BAD_INPUT;
        gid = gr->gr_gid;
    }
    status = check_existing(admin->path, &sun);
    if (status != PD_OK)
        return status;

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return PD_ERR_IO;
    /* create the file with no group/other bits from the start */
    mode_t old = umask(0177);
    int rc = bind(fd, (struct sockaddr *)&sun, sizeof(sun));
    int err = errno;
    umask(old);
    if (rc != 0) {
        close(fd);
        return err == EADDRINUSE ? PD_ERR_EXISTS : PD_ERR_IO;
    }
    admin->bound = true;
    if (group != NULL) {
        if (chown(admin->path, (uid_t)-1, gid) != 0 ||
            chmod(admin->path, 0660) != 0) {
            close(fd);
            return PD_ERR_PERMISSION;
        }
    }
    if (listen(fd, 64) != 0) {
        close(fd);
        return PD_ERR_IO;
    }
    *fd_p = fd;
    return PD_OK;
}

pd_status_t pd_admin_create(pd_loop_t *loop, const pd_admin_opts_t *opts,
                            pd_admin_t **admin_p)
{
    pd_status_t status = PD_ERR_NO_MEMORY;
    int fd = -1;

    if (opts == NULL || opts->path == NULL || opts->path[0] == '\0')
        return PD_ERR_BAD_INPUT;
    pd_admin_t *admin = calloc(1, sizeof(*admin));
    if (admin == NULL)
        goto err;
    admin->loop = loop;
    admin->max_clients = opts->max_clients ? opts->max_clients : 64;
    admin->max_line = opts->max_line ? opts->max_line : 4096;
    admin->max_output = opts->max_output ? opts->max_output : 1024 * 1024;
    admin->idle_timeout_ns = opts->idle_timeout_ns ? opts->idle_timeout_ns
                                                   : 60 * PD_NS_PER_S;
    admin->cfg_schema = opts->cfg_schema;
    admin->cfg_target = opts->cfg_target;
    admin->started_ns = pd_now_ns();
    admin->path = strdup(opts->path);
    admin->prog = strdup(opts->prog ? opts->prog : "pdserve");
    admin->version = strdup(opts->version ? opts->version : PD_VERSION);
    admin->line = malloc(admin->max_line + 1);
    admin->rx = malloc(admin->max_line + 1);
    if (admin->path == NULL || admin->prog == NULL || admin->version == NULL ||
        admin->line == NULL || admin->rx == NULL)
        goto err_free;
    if (opts->operator_group != NULL) {
        struct group *gr = getgrnam(opts->operator_group);
        if (gr == NULL) {
            status = PD_ERR_BAD_INPUT;
            goto err_free;
        }
        admin->operator_gid = gr->gr_gid;
        admin->have_operator_gid = true;
    }
    status = pd_stats_create(&admin_stats_table, NULL, &admin->own_stats);
    if (status != PD_OK)
        goto err_free;
    status = pd_admin_register(admin, builtin_cmds, NULL);
    if (status != PD_OK)
        goto err_free;

    status = bind_socket(admin, opts->group, &fd);
    if (status != PD_OK)
        goto err_free;
    admin->listener = evconnlistener_new(pd_loop_base(loop), accept_cb, admin,
                                         LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
                                         -1, fd);
    if (admin->listener == NULL) {
        close(fd);
        status = PD_ERR_INTERNAL;
        goto err_free;
    }
    admin->ev_resume = evtimer_new(pd_loop_base(loop), accept_resume_cb, admin);
    if (admin->ev_resume == NULL) {
        status = PD_ERR_NO_MEMORY;
        goto err_free;
    }
    evconnlistener_set_error_cb(admin->listener, accept_error_cb);
    *admin_p = admin;
    return PD_OK;

err_free:
    pd_admin_destroy(admin);
err:
    return status;
}

void pd_admin_destroy(pd_admin_t *admin)
{
    if (admin == NULL)
        return;
    while (admin->clients != NULL) {
        admin_client_t *c = admin->clients;
        client_close(c);
    }
    if (admin->listener != NULL)
        evconnlistener_free(admin->listener);
    if (admin->ev_resume != NULL)
        event_free(admin->ev_resume);
    if (admin->bound)
        unlink(admin->path);
    pd_stats_destroy(admin->own_stats);
    free(admin->line);
    free(admin->rx);
    free(admin->path);
    free(admin->prog);
    free(admin->version);
    free(admin);
}

pd_status_t pd_admin_register(pd_admin_t *admin, const pd_admin_cmd_t *cmds,
                              void *arg)
{
    if (admin->n_tables == ADMIN_MAX_TABLES)
        return PD_ERR_NO_SPACE;
    for (const pd_admin_cmd_t *cmd = cmds; cmd->name; cmd++) {
        for (unsigned t = 0; t < admin->n_tables; t++)
            for (const pd_admin_cmd_t *o = admin->tables[t].cmds; o->name; o++)
                if (strcmp(o->name, cmd->name) == 0)
                    return PD_ERR_EXISTS;
    }
    admin->tables[admin->n_tables++] = (admin_table_t){ cmds, arg };
    return PD_OK;
}

pd_status_t pd_admin_add_stats(pd_admin_t *admin, pd_stats_t *stats)
{
    if (admin->n_stats == ADMIN_MAX_STATS)
        return PD_ERR_NO_SPACE;
    admin->stats[admin->n_stats++] = stats;
    return PD_OK;
}

pd_status_t pd_admin_remove_stats(pd_admin_t *admin, pd_stats_t *stats)
{
    for (unsigned i = 0; i < admin->n_stats; i++) {
        if (admin->stats[i] == stats) {
            memmove(&admin->stats[i], &admin->stats[i + 1],
                    (admin->n_stats - i - 1) * sizeof(admin->stats[0]));
            admin->n_stats--;
            return PD_OK;
        }
    }
    return PD_ERR_NOT_FOUND;
}
