/* fuzz_admin.c - admin-socket abuse: every input is sent, as one client,
 * to a real pd_admin server (in-process, same loop), then the client
 * half-closes and reads until the server closes. Finds crashes, leaks and
 * hangs in line framing, word splitting, command matching and replies.
 * The server is created once; limits are small so overlong-line and
 * output-cap paths are reached by small inputs. */
#include "pd_admin.h"
#include "pd_log.h"
#include "pd_loop.h"

#include <event2/event.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static pd_loop_t *loop;
static pd_admin_t *admin;
static char path[108];

static void cleanup(void)
{
    pd_admin_destroy(admin);
    pd_loop_destroy(loop);
}

static void init_once(void)
{
    snprintf(path, sizeof(path), "/tmp/pd-fuzz-admin-%d.sock", (int)getpid());
    pd_admin_opts_t opts = {
        .path = path, .prog = "fuzz", .max_line = 256, .max_output = 4096,
        .max_clients = 4,
    };
    pd_status_t s = pd_loop_create(&loop);
    if (s == PD_OK)
        s = pd_admin_create(loop, &opts, &admin);
    if (s != PD_OK) {
        fprintf(stderr, "fuzz-admin: server on %s: %s\n", path, pd_status_str(s));
        abort();
    }
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (loop == NULL) {
        pd_log_set_level(PD_LOG_WARN);
        init_once();
    }
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    memcpy(sun.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
        fprintf(stderr, "fuzz-admin: connect %s: %s\n", path, strerror(errno));
        abort();
    }
    size_t off = 0;
    char buf[65536];
    int done = 0, shut = 0;
    for (int spins = 0; !done && spins < 100000; spins++) {
        if (off < size) {
            ssize_t n = send(fd, data + off, size - off, MSG_NOSIGNAL);
            if (n > 0)
                off += (size_t)n;
            else if (n < 0 && errno != EAGAIN)
                off = size; /* server closed on us */
        }
        if (off == size && !shut) {
            shutdown(fd, SHUT_WR);
            shut = 1;
        }
        event_base_loop(pd_loop_base(loop), EVLOOP_NONBLOCK);
        for (;;) {
            ssize_t k = recv(fd, buf, sizeof(buf), 0);
            if (k > 0)
                continue;
            if (k == 0 || errno != EAGAIN)
                done = 1;
            break;
        }
    }
    if (!done)
        abort(); /* the server never closed a half-closed client: a hang */
    close(fd);
    /* let the server notice and reap */
    while (pd_admin_client_count(admin) > 0 || pd_loop_defer_pending(loop) > 0)
        event_base_loop(pd_loop_base(loop), EVLOOP_NONBLOCK);
    pd_log_set_level(PD_LOG_WARN); /* inputs may turn on debug logging */
    return 0;
}
