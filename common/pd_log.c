#include "pd_log.h"
#include "pd_time.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

_Atomic int pd_log_level_g = PD_LOG_INFO;
static _Atomic int log_fd = STDERR_FILENO;
static char log_path[4096]; /* the file pd_log_open opened ("" = stderr); loop thread */

static const char *const level_names[] = { "error", "warn", "info", "debug", "trace" };

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

void pd_log_write(pd_log_level_t level, const char *component,
                  const char *request_id, const char *fmt, ...)
{
    char line[2048], msg[2048], rid[160];
    uint64_t wall = pd_wall_ns(), mono = pd_now_ns();
    time_t secs = (time_t)(wall / PD_NS_PER_S);
    struct tm tm;
    gmtime_r(&secs, &tm);
    if (request_id != NULL)
        pd_log_escape(request_id, strlen(request_id), rid, sizeof(rid));
    int n = snprintf(line, sizeof(line),
                     "%04d-%02d-%02dT%02d:%02d:%02d.%06uZ mono=%llu.%06u %-5s %s%s%s%s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec,
                     (unsigned)((wall % PD_NS_PER_S) / PD_NS_PER_US),
                     (unsigned long long)(mono / PD_NS_PER_S),
                     (unsigned)((mono % PD_NS_PER_S) / PD_NS_PER_US),
                     pd_log_level_name(level), component ? component : "-",
                     request_id ? " [req=" : "", request_id ? rid : "",
                     request_id ? "]" : "");
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(line))
        n = sizeof(line) - 1;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    if ((size_t)m >= sizeof(msg))
        m = sizeof(msg) - 1;
    size_t len = (size_t)n + pd_log_escape(msg, (size_t)m, line + n, sizeof(line) - 1 - (size_t)n);
    line[len++] = '\n';
    int fd = atomic_load(&log_fd);
    ssize_t w = write(fd, line, len);
    (void)w;
}

pd_status_t pd_log_boot(const char *prog, const char *level, const char *file)
{
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
