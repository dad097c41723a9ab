/* kvx_proc.h - drive kvx-peer processes from a test: spawn with pipes,
 * send a command line, read the reply line (asynchronous "event ..." lines
 * are queued), wait for events, all with timeouts (poll, never sleep). */
#ifndef KVX_PROC_H
#define KVX_PROC_H

#include "pd_time.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define KP_LINE 65536
#define KP_EVENTS 16

typedef struct {
    pid_t pid;
    int to_fd, from_fd;
    char rbuf[KP_LINE * 2];
    size_t rlen;
    char line[KP_LINE];
    char *events[KP_EVENTS];
    int n_events;
    bool exited;
    int status;
} kp_t;

/* Spawn `prefix... peer_path args...` (prefix e.g. ip netns exec ns). */
static inline int kp_spawn(kp_t *p, char *const prefix[], const char *peer_path,
                           char *const args[])
{
    int in[2], out[2];
    char *argv[32];
    int n = 0;
    memset(p, 0, sizeof(*p));
    for (int i = 0; prefix && prefix[i]; i++)
        argv[n++] = prefix[i];
    argv[n++] = (char *)peer_path;
    for (int i = 0; args && args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC))
        return -1;
    p->pid = fork();
    if (p->pid < 0)
        return -1;
    if (p->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    p->to_fd = in[1];
    p->from_fd = out[0];
    return 0;
}

/* Next line from the process (event or not) within timeout; NULL on
 * timeout/EOF. */
static inline const char *kp_read_line(kp_t *p, int timeout_ms)
{
    uint64_t until = pd_now_ns() + (uint64_t)timeout_ms * PD_NS_PER_MS;
    for (;;) {
        char *nl = memchr(p->rbuf, '\n', p->rlen);
        if (nl) {
            size_t l = (size_t)(nl - p->rbuf);
            if (l >= KP_LINE)
                l = KP_LINE - 1;
            memcpy(p->line, p->rbuf, l);
            p->line[l] = 0;
            p->rlen -= (size_t)(nl + 1 - p->rbuf);
            memmove(p->rbuf, nl + 1, p->rlen);
            return p->line;
        }
        uint64_t now = pd_now_ns();
        if (now >= until)
            return NULL;
        struct pollfd pfd = { p->from_fd, POLLIN, 0 };
        int r = poll(&pfd, 1, (int)((until - now) / PD_NS_PER_MS) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return NULL;
        if (p->rlen >= sizeof(p->rbuf) - 1)
            return NULL;
        ssize_t k = read(p->from_fd, p->rbuf + p->rlen, sizeof(p->rbuf) - 1 - p->rlen);
        if (k <= 0)
            return NULL;
        p->rlen += (size_t)k;
    }
}

static inline void kp_send(kp_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void kp_send(kp_t *p, const char *fmt, ...)
{
    static char buf[KP_LINE];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
    va_end(ap);
    buf[n++] = '\n';
    for (int off = 0; off < n;) {
        ssize_t k = write(p->to_fd, buf + off, (size_t)(n - off));
        if (k <= 0)
            return;
        off += (int)k;
    }
}

/* Send a command, return its reply (events on the way are queued). */
static inline const char *kp_cmd(kp_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline const char *kp_cmd(kp_t *p, const char *fmt, ...)
{
    static char buf[KP_LINE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    kp_send(p, "%s", buf);
    for (;;) {
        const char *l = kp_read_line(p, 20000);
        if (l == NULL)
            return "timeout";
        if (strncmp(l, "event ", 6) != 0)
            return l;
        if (p->n_events < KP_EVENTS)
            p->events[p->n_events++] = strdup(l);
    }
}

/* Wait for an event line starting with "event <prefix>"; caller frees. */
static inline char *kp_wait_event(kp_t *p, const char *prefix, int timeout_ms)
{
    char want[128];
    snprintf(want, sizeof(want), "event %s", prefix);
    for (int i = 0; i < p->n_events; i++) {
        if (strncmp(p->events[i], want, strlen(want)) == 0) {
            char *e = p->events[i];
            memmove(&p->events[i], &p->events[i + 1],
                    sizeof(char *) * (size_t)(p->n_events - i - 1));
            p->n_events--;
            return e;
        }
    }
    uint64_t until = pd_now_ns() + (uint64_t)timeout_ms * PD_NS_PER_MS;
    for (;;) {
        uint64_t now = pd_now_ns();
        if (now >= until)
            return NULL;
        const char *l = kp_read_line(p, (int)((until - now) / PD_NS_PER_MS) + 1);
        if (l == NULL)
            return NULL;
        if (strncmp(l, want, strlen(want)) == 0)
            return strdup(l);
        if (strncmp(l, "event ", 6) == 0 && p->n_events < KP_EVENTS)
            p->events[p->n_events++] = strdup(l);
    }
}

/* Wait for exit up to timeout_ms; SIGKILL after that. Returns exit code,
 * 128+sig when signaled, -1 if it had to be killed. */
static inline int kp_wait_exit(kp_t *p, int timeout_ms)
{
    uint64_t until = pd_now_ns() + (uint64_t)timeout_ms * PD_NS_PER_MS;
    int st;
    for (;;) {
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid)
            break;
        if (pd_now_ns() >= until) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &st, 0);
            p->exited = true;
            return -1;
        }
        /* a child's exit closes its stdout: wait on that, not on a timer */
        struct pollfd pfd = { p->from_fd, POLLIN, 0 };
        if (poll(&pfd, 1, 10) > 0) {
            char tmp[4096];
            if (read(p->from_fd, tmp, sizeof(tmp)) <= 0)
                (void)0;
        }
    }
    p->exited = true;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static inline void kp_close(kp_t *p)
{
    if (p->pid > 0 && !p->exited) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
    }
    close(p->to_fd);
    close(p->from_fd);
    for (int i = 0; i < p->n_events; i++)
        free(p->events[i]);
    p->pid = 0;
}

#endif
