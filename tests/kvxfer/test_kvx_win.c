/* test_kvx_win.c - kvxfer exchange windows (kvx_win.h) between real
 * processes over real UCX: 2 and 4 forked ranks exchange rounds of
 * messages of varying lengths (0 .. slot_bytes) on two slots, and every
 * fourth pair of rounds split in post and wait on two more slots (both
 * posted, then waited for in reverse order: two-micro-batch overlap); every
 * received byte equals what the in-process generator says the sender put
 * (bitwise). "stall": rank 2 of 3 stops (SIGSTOP) after one round; the
 * others' next exchange returns PD_ERR_TIMED_OUT by the deadline (no hang).
 * Usage: test_kvx_win shm|tcp all|stall */
#include "kvx_win.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 40
static const size_t slot_bytes[4] = { 20000, 70000, 20000, 70000 };
static const char *tls;

static size_t msg_len(uint32_t round, uint32_t src, uint32_t dst)
{
    uint32_t s = round & 1, h = (round * 2654435761u) ^ (src * 40503u) ^ (dst * 97u);
    if (h % 7 == 0)
        return 0;
    return h % 5 == 0 ? slot_bytes[s] : (h >> 3) % slot_bytes[s];
}

static uint8_t msg_byte(uint32_t round, uint32_t src, uint32_t dst, size_t i)
{
    return (uint8_t)((i * 31u + round * 7u + src * 13u + dst * 101u) ^ (i >> 8));
}

static int write_all(int fd, const void *b, size_t n)
{
    const uint8_t *p = b;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k <= 0)
            return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

static int read_all(int fd, void *b, size_t n)
{
    uint8_t *p = b;
    while (n) {
        ssize_t k = read(fd, p, n);
        if (k <= 0)
            return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* One rank: window, metadata through the parent, rounds. Exit code 0 = ok. */
/* Fill slot s's messages of round r. */
static void fill(kvx_win_h *w, uint32_t s, uint32_t r, uint32_t rank, uint32_t N, size_t *len)
{
    for (uint32_t p = 0; p < N; p++) {
        uint8_t *b = kvx_win_send_buf(w, s, p);
        len[p] = msg_len(r, rank, p);
        for (size_t i = 0; i < len[p]; i++)
            b[i] = msg_byte(r, rank, p, i);
    }
}

/* Every byte received in round r as the generator says; 0 or an exit code. */
static int check(uint32_t r, uint32_t rank, uint32_t N, const void **rv, const size_t *rl)
{
    for (uint32_t p = 0; p < N; p++) {
        if (rl[p] != msg_len(r, p, rank)) {
            fprintf(stderr, "rank %u round %u from %u: len %zu\n", rank, r, p, rl[p]);
            return 9;
        }
        const uint8_t *b = rv[p];
        for (size_t i = 0; i < rl[p]; i++)
            if (b[i] != msg_byte(r, p, rank, i)) {
                fprintf(stderr, "rank %u round %u from %u: byte %zu\n", rank, r, p, i);
                return 10;
            }
    }
    return 0;
}

static int rank_main(uint32_t rank, uint32_t N, int to_parent, int from_parent, int stall)
{
    kvx_win_config_t c = { .rank = rank, .size = N, .n_slots = 4,
                           .slot_bytes = { slot_bytes[0], slot_bytes[1], slot_bytes[2],
                                           slot_bytes[3] },
                           .timeout_ns = stall ? 500000000ull : 10000000000ull, .tls = tls,
                           .net_devices = strcmp(tls, "tcp") == 0 ? "lo" : NULL };
    const char *pm = getenv("KVX_WIN_PUT"); /* rma | am: force one (default auto) */
    c.put_mode = !pm ? KVX_WIN_PUT_AUTO : strcmp(pm, "am") == 0 ? KVX_WIN_PUT_AM : KVX_WIN_PUT_RMA;
    kvx_win_h *w;
    pd_status_t st = kvx_win_create(&c, &w);
    if (st != PD_OK) {
        fprintf(stderr, "rank %u: create: %s\n", rank, pd_status_str(st));
        return 2;
    }
    const void *meta;
    size_t ml;
    kvx_win_meta(w, &meta, &ml);
    uint32_t l32 = (uint32_t)ml;
    if (write_all(to_parent, &l32, 4) || write_all(to_parent, meta, ml))
        return 3;
    for (uint32_t p = 0; p < N; p++) {
        uint8_t buf[8192];
        if (read_all(from_parent, &l32, 4) || l32 > sizeof(buf) || read_all(from_parent, buf, l32))
            return 4;
        if (p == rank)
            continue;
        /* a corrupted copy is refused before any UCX call */
        buf[0] ^= 1;
        if (kvx_win_peer_add(w, p, buf, l32) != PD_ERR_BAD_MAGIC)
            return 5;
        buf[0] ^= 1;
        if (kvx_win_peer_add(w, p, buf, l32 - 1) != PD_ERR_BAD_INPUT)
            return 5;
        if ((st = kvx_win_peer_add(w, p, buf, l32)) != PD_OK) {
            fprintf(stderr, "rank %u: peer %u: %s\n", rank, p, pd_status_str(st));
            return 6;
        }
    }
    size_t len[8], len1[8], rl[8];
    const void *rv[8];
    if (kvx_win_wait(w, 2, rv, rl) != PD_ERR_BAD_INPUT) /* not posted */
        return 11;
    for (uint32_t r = 0; r < ROUNDS; r++) {
        uint32_t s = r & 1;
        int bad;
        if (stall && r == 1 && rank == N - 1)
            raise(SIGSTOP); /* stops responding (the parent kills it) */
        if (!stall && r % 4 == 2 && r + 1 < ROUNDS) {
            /* rounds r and r+1 in flight together on slots 2 and 3 */
            fill(w, 2, r, rank, N, len);
            fill(w, 3, r + 1, rank, N, len1);
            if ((st = kvx_win_post(w, 2, len)) != PD_OK ||
                kvx_win_post(w, 2, len) != PD_ERR_BAD_INPUT || /* posted, not waited */
                (st = kvx_win_post(w, 3, len1)) != PD_OK ||
                (st = kvx_win_wait(w, 3, rv, rl)) != PD_OK || (bad = check(r + 1, rank, N, rv, rl)) ||
                (st = kvx_win_wait(w, 2, rv, rl)) != PD_OK || (bad = check(r, rank, N, rv, rl))) {
                fprintf(stderr, "rank %u rounds %u-%u (post/wait): %s\n", rank, r, r + 1,
                        pd_status_str(st));
                return 12;
            }
            r++;
            continue;
        }
        fill(w, s, r, rank, N, len);
        double t0 = now_s();
        st = kvx_win_exchange(w, s, len, rv, rl);
        if (stall && r == 1) {
            double dt = now_s() - t0;
            int ok = st == PD_ERR_TIMED_OUT && dt >= 0.45 && dt < 5.0 &&
                     kvx_win_exchange(w, s, len, rv, rl) == PD_ERR_TIMED_OUT;
            fprintf(stderr, "rank %u: stalled peer: %s after %.3f s\n", rank,
                    pd_status_str(st), dt);
            kvx_win_destroy(w);
            return ok ? 0 : 7;
        }
        if (st != PD_OK) {
            fprintf(stderr, "rank %u round %u: %s\n", rank, r, pd_status_str(st));
            return 8;
        }
        if ((bad = check(r, rank, N, rv, rl)) != 0)
            return bad;
    }
    kvx_win_destroy(w);
    return 0;
}

static int run_group(uint32_t N, int stall)
{
    int up[8][2], down[8][2];
    pid_t pid[8];
    for (uint32_t r = 0; r < N; r++) {
        if (pipe(up[r]) || pipe(down[r]))
            return 1;
        pid[r] = fork();
        if (pid[r] == 0) {
            alarm(30);
            _exit(rank_main(r, N, up[r][1], down[r][0], stall));
        }
        close(up[r][1]);
        close(down[r][0]);
    }
    uint8_t *meta[8];
    uint32_t ml[8];
    for (uint32_t r = 0; r < N; r++) {
        if (read_all(up[r][0], &ml[r], 4) || ml[r] > 8192 || !(meta[r] = malloc(ml[r])) ||
            read_all(up[r][0], meta[r], ml[r]))
            return 1;
    }
    for (uint32_t r = 0; r < N; r++)
        for (uint32_t p = 0; p < N; p++)
            if (write_all(down[r][1], &ml[p], 4) || write_all(down[r][1], meta[p], ml[p]))
                return 1;
    int bad = 0;
    for (uint32_t r = 0; r < N; r++) {
        int ws;
        if (stall && r == N - 1) {
            if (waitpid(pid[r], &ws, WUNTRACED) != pid[r] || !WIFSTOPPED(ws))
                bad++;
            continue; /* killed after the others are done */
        }
    }
    for (uint32_t r = 0; r < N; r++) {
        if (stall && r == N - 1)
            continue;
        int ws;
        if (waitpid(pid[r], &ws, 0) != pid[r] || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            fprintf(stderr, "%s N=%u rank %u: status %#x\n", tls, N, r, ws);
            bad++;
        }
    }
    if (stall) {
        kill(pid[N - 1], SIGKILL);
        waitpid(pid[N - 1], NULL, 0);
    }
    for (uint32_t r = 0; r < N; r++) {
        free(meta[r]);
        close(up[r][0]);
        close(down[r][1]);
    }
    printf("%s %u ranks%s: %s\n", tls, N, stall ? " (one stalls)" : "", bad ? "FAIL" : "ok");
    return bad;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    tls = argv[1];
    int bad = 0;
    if (strcmp(argv[2], "stall") == 0)
        bad += run_group(3, 1);
    else
        bad += run_group(2, 0) + run_group(4, 0);
    return bad ? 1 : 0;
}
