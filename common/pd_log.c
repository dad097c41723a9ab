#include "pd_log.h"
#include "pd_time.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

_Atomic int pd_log_level_g = PD_LOG_INFO;
static _Atomic int log_fd = STDERR_FILENO;
static char log_path[4096]; /* the file pd_log_open opened ("" = stderr); loop thread */

static const char *const level_names[] = { "error", "warn", "info", "debug", "trace" };
static _Atomic int log_format = PD_LOG_FORMAT_TEXT;

const char *const pd_log_format_names[] = { "text", "json", NULL };

void pd_log_set_format(pd_log_format_t f)
{
    atomic_store(&log_format, f == PD_LOG_FORMAT_JSON ? PD_LOG_FORMAT_JSON : PD_LOG_FORMAT_TEXT);
}

pd_status_t pd_log_open(const char *path)
{
    int fd = STDERR_FILENO;
    if (path != NULL && strcmp(path, "-") != 0 && path[0] != '\0') {
        fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
        if (fd < 0)
            return PD_ERR_IO;
    }
    int old = atomic_exchange(&log_fd, fd);
    if (old != STDERR_FILENO)
        close(old);
    snprintf(log_path, sizeof(log_path), "%s", fd == STDERR_FILENO ? "" : path);
    return PD_OK;
}

pd_status_t pd_log_reopen(void)
{
    if (log_path[0] == '\0')
        return PD_OK;
    int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0)
        return PD_ERR_IO;
    int old = atomic_exchange(&log_fd, fd);
    if (old != STDERR_FILENO)
        close(old);
    return PD_OK;
}

void pd_log_close(void)
{
    log_path[0] = '\0';
    int old = atomic_exchange(&log_fd, STDERR_FILENO);
    if (old != STDERR_FILENO)
        close(old);
}

void pd_log_set_level(pd_log_level_t level)
{
    if ((int)level < PD_LOG_ERROR)
        level = PD_LOG_ERROR;
    if (level > PD_LOG_TRACE)
        level = PD_LOG_TRACE;
    atomic_store(&pd_log_level_g, (int)level);
}

pd_log_level_t pd_log_get_level(void)
{
    return (pd_log_level_t)atomic_load(&pd_log_level_g);
}

pd_status_t pd_log_level_parse(const char *text, pd_log_level_t *level_p)
{
    if (text == NULL)
        return PD_ERR_BAD_INPUT;
    for (int i = 0; i <= PD_LOG_TRACE; i++) {
        if (strcasecmp(text, level_names[i]) == 0) {
            *level_p = (pd_log_level_t)i;
            return PD_OK;
        }
    }
    if (strcasecmp(text, "warning") == 0) {
        *level_p = PD_LOG_WARN;
        return PD_OK;
    }
    return PD_ERR_BAD_INPUT;
}

const char *pd_log_level_name(pd_log_level_t level)
{
    if ((int)level < 0 || level > PD_LOG_TRACE)
        return "unknown";
    return level_names[level];
}

size_t pd_log_escape(const char *in, size_t n, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t k = 0;
    if (cap == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        char e[8];
        size_t el = 0;
        if (c == '\n' || c == '\r' || c == '\t') {
            e[0] = '\\';
            e[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
            el = 2;
        } else if (c < 0x20 || c == 0x7f) {
            e[0] = '\\';
            e[1] = 'x';
            e[2] = hex[c >> 4];
            e[3] = hex[c & 15];
            el = 4;
        } else if (c == 0xc2 && i + 1 < n && (unsigned char)in[i + 1] >= 0x80 &&
                   (unsigned char)in[i + 1] <= 0x9f) {
            unsigned char d = (unsigned char)in[++i];
            memcpy(e, "\\u00", 4);
            e[4] = hex[d >> 4];
            e[5] = hex[d & 15];
            el = 6;
        } else {
            e[0] = (char)c;
            el = 1;
        }
        if (k + el >= cap)
            break;
        memcpy(out + k, e, el);
        k += el;
    }
    out[k] = '\0';
    return k;
}

/* One JSON string's contents: ", \\ and controls escaped, valid UTF-8
 * kept, any other byte as U+FFFD; cut short at cap (never inside an escape
 * or a character). Returns the length written (out NUL-terminated). */
static size_t json_escape(const char *in, size_t n, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char *u = (const unsigned char *)in + i;
        char e[8];
        size_t el = 0, used = 1;
        if (u[0] == '"' || u[0] == '\\') {
            e[0] = '\\';
            e[1] = (char)u[0];
            el = 2;
        } else if (u[0] < 0x20 || u[0] == 0x7f) {
            memcpy(e, "\\u00", 4);
            e[4] = hex[u[0] >> 4];
            e[5] = hex[u[0] & 15];
            el = 6;
        } else if (u[0] < 0x80) {
            e[0] = (char)u[0];
            el = 1;
        } else {
            size_t len = u[0] >= 0xc2 && u[0] <= 0xdf ? 2 : u[0] >= 0xe0 && u[0] <= 0xef ? 3
                       : u[0] >= 0xf0 && u[0] <= 0xf4 ? 4 : 0;
            bool ok = len > 0 && i + len <= n;
            for (size_t j = 1; ok && j < len; j++)
                ok = (u[j] & 0xc0) == 0x80;
            /* overlong 3/4-byte forms, surrogates, > U+10FFFF */
            if (ok && len == 3 && ((u[0] == 0xe0 && u[1] < 0xa0) || (u[0] == 0xed && u[1] >= 0xa0)))
                ok = false;
            if (ok && len == 4 && ((u[0] == 0xf0 && u[1] < 0x90) || (u[0] == 0xf4 && u[1] >= 0x90)))
                ok = false;
            if (ok) {
                memcpy(e, u, len);
                el = used = len;
            } else {
                memcpy(e, "\xef\xbf\xbd", 3);
                el = 3;
            }
        }
        if (k + el >= cap)
            break;
        memcpy(out + k, e, el);
        k += el;
        i += used;
    }
    out[k] = '\0';
    return k;
}

static bool is_key_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == '-';
}

/* A JSON number as a log field: what strtod reads whole, finite, no
 * leading '+', hex or "inf"/"nan" words (those stay strings). */
static bool is_json_number(const char *v, size_t n)
{
    size_t i = 0;
    if (i < n && v[i] == '-')
        i++;
    if (i >= n || v[i] < '0' || v[i] > '9' || (v[i] == '0' && i + 1 < n && v[i + 1] >= '0' && v[i + 1] <= '9'))
        return false;
    while (i < n && v[i] >= '0' && v[i] <= '9')
        i++;
    if (i < n && v[i] == '.') {
        i++;
        if (i >= n || v[i] < '0' || v[i] > '9')
            return false;
        while (i < n && v[i] >= '0' && v[i] <= '9')
            i++;
    }
    return i == n;
}

/* log.format = json: one object per line, {"ts","mono","level","comp",
 * "req"?,"msg"} and then every "key=value" word of the message as a field
 * of its own (a number when it is one), so logfmt-style lines such as the
 * router's access line are structured without a second API. Keys that
 * would shadow the fixed ones are left in msg only. */
static size_t json_line(char *line, size_t cap, const char *ts, uint64_t mono,
                        pd_log_level_t level, const char *component, const char *request_id,
                        const char *msg, size_t mlen)
{
    size_t k = 0;
    int n = snprintf(line, cap, "{\"ts\":\"%s\",\"mono\":%llu.%06u,\"level\":\"%s\",\"comp\":\"",
                     ts, (unsigned long long)(mono / PD_NS_PER_S),
                     (unsigned)((mono % PD_NS_PER_S) / PD_NS_PER_US), pd_log_level_name(level));
    if (n < 0 || (size_t)n >= cap)
        return 0;
    k = (size_t)n;
    const char *comp = component ? component : "-";
    k += json_escape(comp, strlen(comp), line + k, cap - k);
    /* every escape leaves room for the closing "} */
    if (request_id != NULL && k + 9 + 16 < cap) {
        memcpy(line + k, "\",\"req\":\"", 9);
        k += 9;
        k += json_escape(request_id, strlen(request_id), line + k, cap - k - 16);
    }
    if (k + 9 + 4 < cap) {
        memcpy(line + k, "\",\"msg\":\"", 9);
        k += 9;
        k += json_escape(msg, mlen, line + k, cap - k - 4);
    }
    line[k++] = '"';
    /* the message's key=value words, one field each */
    static const char *const fixed[] = { "ts", "mono", "level", "comp", "req", "msg", NULL };
    for (size_t i = 0; i < mlen;) {
        while (i < mlen && msg[i] == ' ')
            i++;
        size_t w0 = i;
        while (i < mlen && msg[i] != ' ')
            i++;
        size_t ks = w0, ke = w0;
        while (ke < i && is_key_char(msg[ke]))
            ke++;
        if (ke == ks || ke >= i || msg[ke] != '=')
            continue;
        bool shadow = false;
        for (int f = 0; fixed[f] != NULL; f++)
            shadow |= strlen(fixed[f]) == ke - ks && memcmp(fixed[f], msg + ks, ke - ks) == 0;
        if (shadow)
            continue;
        const char *v = msg + ke + 1;
        size_t vl = i - ke - 1;
        bool num = is_json_number(v, vl);
        /* ,"key": + value + closing: leave room for "}\n" */
        if (k + (ke - ks) + 6 + (num ? vl : 2 + 6 * vl) + 3 >= cap)
            break;
        line[k++] = ',';
        line[k++] = '"';
        memcpy(line + k, msg + ks, ke - ks);
        k += ke - ks;
        line[k++] = '"';
        line[k++] = ':';
        if (num) {
            memcpy(line + k, v, vl);
            k += vl;
        } else {
            line[k++] = '"';
            k += json_escape(v, vl, line + k, cap - k);
            line[k++] = '"';
        }
    }
    line[k++] = '}';
    return k;
}

void pd_log_write(pd_log_level_t level, const char *component,
                  const char *request_id, const char *fmt, ...)
{
    char line[2048], msg[2048], rid[160], ts[64];
    uint64_t wall = pd_wall_ns(), mono = pd_now_ns();
    time_t secs = (time_t)(wall / PD_NS_PER_S);
    struct tm tm;
    gmtime_r(&secs, &tm);
    snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%06uZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (unsigned)((wall % PD_NS_PER_S) / PD_NS_PER_US));
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    if ((size_t)m >= sizeof(msg))
        m = sizeof(msg) - 1;
    if (atomic_load(&log_format) == PD_LOG_FORMAT_JSON) {
        char jl[8192];
        size_t len = json_line(jl, sizeof(jl) - 1, ts, mono, level, component, request_id,
                               msg, (size_t)m);
        if (len == 0)
            return;
        jl[len++] = '\n';
        ssize_t w = write(atomic_load(&log_fd), jl, len);
        (void)w;
        return;
    }
    if (request_id != NULL)
        pd_log_escape(request_id, strlen(request_id), rid, sizeof(rid));
    int n = snprintf(line, sizeof(line), "%s mono=%llu.%06u %-5s %s%s%s%s ", ts,
                     (unsigned long long)(mono / PD_NS_PER_S),
                     (unsigned)((mono % PD_NS_PER_S) / PD_NS_PER_US),
                     pd_log_level_name(level), component ? component : "-",
                     request_id ? " [req=" : "", request_id ? rid : "",
                     request_id ? "]" : "");
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(line))
        n = sizeof(line) - 1;
    size_t len = (size_t)n + pd_log_escape(msg, (size_t)m, line + n, sizeof(line) - 1 - (size_t)n);
    line[len++] = '\n';
    ssize_t w = write(atomic_load(&log_fd), line, len);
    (void)w;
}

pd_status_t pd_log_boot(const char *prog, const char *level, int format, const char *file)
{
    pd_log_set_format((pd_log_format_t)format);
    pd_log_level_t lvl;
    if (pd_log_level_parse(level, &lvl) != PD_OK) {
        fprintf(stderr, "%s: --log.level: expected error|warn|info|debug|trace, got \"%s\"\n",
                prog, level != NULL ? level : "");
        return PD_ERR_BAD_INPUT;
    }
    pd_log_set_level(lvl);
    if (pd_log_open(file) != PD_OK) {
        fprintf(stderr, "%s: --log.file: cannot open %s\n", prog, file);
        return PD_ERR_BAD_INPUT;
    }
    return PD_OK;
}
