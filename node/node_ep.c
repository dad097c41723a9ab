/* node_ep.c - an expert-parallel rank's group at boot (issue 36): the
 * exchange window (kvxfer/kvx_win.h, slot sizes from the engine's ep_cap),
 * the metadata rendezvous through a directory (`ep-dir`: each rank writes
 * rank-<r>.meta atomically and reads the others', every byte capped and
 * validated by kvx_win_peer_add), the engine's transport (set_ep), the
 * group's compat hash from the ranks' expert digests; at the end of boot
 * a barrier (rank-<r>.up) and one idle pass of the whole group as its
 * self-check; and the step barrier's vote (node_ep_vote; the decode's step
 * runs it, decode/README.md). */
#include "node.h"

#include "eng.h"
#include "eng_llama.h"
#include "kvx_win.h"
#include "pd_log.h"
#include "pd_time.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NODE_EP_META_MAX (KVX_WIN_MAX_ADDR + KVX_WIN_MAX_RKEY + 1024)
#define NODE_EP_JOIN_NS 60000000000ull /* wait this long for the other ranks' files */

/* The window's slot of an engine phase: 0, 1 the phases of micro-batch
 * 0, 2 and 3 node_ep's own (the join's votes), 4 and 5 micro-batch 1's
 * (a model with two micro-batches per pass: ep_cap states phases 2, 3). */
static uint32_t node_ep_slot(eng_ep_phase_t ph)
{
    return ph < ENG_EP_DISPATCH_1 ? (uint32_t)ph : (uint32_t)ph + 2;
}

static void *node_ep_send_buf(void *ctx, eng_ep_phase_t ph, uint32_t peer)
{
    return kvx_win_send_buf(ctx, node_ep_slot(ph), peer);
}

static pd_status_t node_ep_exchange(void *ctx, eng_ep_phase_t ph, uint32_t layer,
                                    const size_t *len, const void **recv, size_t *recv_len)
{
    (void)layer;
    return kvx_win_exchange(ctx, node_ep_slot(ph), len, recv, recv_len);
}

static pd_status_t node_ep_post(void *ctx, eng_ep_phase_t ph, uint32_t layer, const size_t *len)
{
    (void)layer;
    return kvx_win_post(ctx, node_ep_slot(ph), len);
}

static pd_status_t node_ep_wait(void *ctx, eng_ep_phase_t ph, uint32_t layer,
                                const void **recv, size_t *recv_len)
{
    (void)layer;
    return kvx_win_wait(ctx, node_ep_slot(ph), recv, recv_len);
}

/* Write dir/rank-<r>.<what> (tmp file + rename). */
static pd_status_t node_ep_publish(const char *dir, uint32_t rank, const char *what,
                                   const void *meta, size_t len, char *err, size_t err_len)
{
    char tmp[4200], path[4200];
    snprintf(tmp, sizeof tmp, "%s/.rank-%u.%s.%d", dir, rank, what, (int)getpid());
    snprintf(path, sizeof path, "%s/rank-%u.%s", dir, rank, what);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, err_len, "ep-dir %s: %s", tmp, strerror(errno));
        return PD_ERR_IO;
    }
    bool ok = write(fd, meta, len) == (ssize_t)len;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, err_len, "ep-dir %s: %s", path, strerror(errno));
        unlink(tmp);
        return PD_ERR_IO;
    }
    return PD_OK;
}

/* Read dir/rank-<r>.meta into buf (at most cap bytes): PD_ERR_NOT_FOUND
 * while it is not there yet. */
static pd_status_t node_ep_read(const char *dir, uint32_t rank, uint8_t *buf, size_t cap,
                                size_t *len_p)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/rank-%u.meta", dir, rank);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return errno == ENOENT ? PD_ERR_NOT_FOUND : PD_ERR_IO;
    struct stat sb;
    pd_status_t st = PD_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        st = PD_ERR_IO;
    else if (sb.st_size <= 0 || (uint64_t)sb.st_size > cap)
        st = PD_ERR_TOO_BIG;
    else if (read(fd, buf, (size_t)sb.st_size) != (ssize_t)sb.st_size)
        st = PD_ERR_IO;
    else
        *len_p = (size_t)sb.st_size;
    close(fd);
    return st;
}

/* The ranks pool their expert digests (one exchange on slot 0, then an
 * empty one on slot 1 so no rank's next put into slot 0 lands before its
 * owner read this one: the engine's dispatch/combine alternation from
 * there) and each sets the whole model's compat hash
 * (eng_llama_ep_group_hash): a whole-model prefill's KV handle imports. */
static pd_status_t node_ep_group_hash(node_t *n, kvx_win_h *w, uint32_t N)
{
    const uint64_t *mine;
    size_t nd = eng_llama_ep_digests(n->model, &mine), bytes = nd * sizeof(uint64_t);
    eng_llama_info_t in;
    eng_llama_info(n->model, &in);
    if (nd == 0 || bytes > in.ep_cap[0])
        return PD_ERR_TOO_BIG;
    size_t len[KVX_WIN_MAX_RANKS] = { 0 }, recv_len[KVX_WIN_MAX_RANKS];
    const void *recv[KVX_WIN_MAX_RANKS];
    for (uint32_t p = 0; p < N; p++) {
        memcpy(kvx_win_send_buf(w, 0, p), mine, bytes);
        len[p] = bytes;
    }
    pd_status_t st = kvx_win_exchange(w, 0, len, recv, recv_len);
    if (st != PD_OK)
        return st;
    uint64_t *all = malloc(bytes * N);
    if (all == NULL)
        return PD_ERR_NO_MEMORY;
    for (uint32_t p = 0; p < N && st == PD_OK; p++) {
        if (recv_len[p] != bytes)
            st = PD_ERR_MISMATCH; /* a rank of another model or slicing */
        else
            memcpy(all + (size_t)p * nd, recv[p], bytes);
    }
    memset(len, 0, sizeof(len));
    pd_status_t st2 = kvx_win_exchange(w, 1, len, recv, recv_len);
    if (st == PD_OK)
        st = st2 != PD_OK ? st2 : eng_llama_ep_group_hash(n->model, all, nd * N);
    free(all);
    return st;
}

pd_status_t node_ep_join(node_t *n, char *err, size_t err_len)
{
    const node_config_t *c = n->cfg;
    uint32_t me = (uint32_t)c->ep_rank, N = (uint32_t)c->ep_size;
    if (N <= 1)
        return PD_OK;
    if (c->ep_dir == NULL || c->ep_dir[0] == '\0' || strlen(c->ep_dir) > 4000) {
        snprintf(err, err_len, "ep-size %u: ep-dir (the group's rendezvous directory) is needed", N);
        return PD_ERR_BAD_INPUT;
    }
    size_t cap[ENG_EP_SLOTS] = { 0 };
    if (n->ops->set_ep == NULL || n->ops->ep_idle == NULL || n->ops->ep_cap == NULL ||
        n->ops->ep_pass_rows == NULL) {
        snprintf(err, err_len, "engine %s: no expert parallelism", n->engine);
        return PD_ERR_BAD_INPUT;
    }
    pd_status_t st = n->ops->ep_cap(n->model, cap);
    if (st != PD_OK || cap[0] == 0 || cap[1] == 0) {
        snprintf(err, err_len, "ep-size %u: the model has no experts to split", N);
        return st != PD_OK ? st : PD_ERR_BAD_INPUT;
    }
    bool two = cap[ENG_EP_DISPATCH_1] > 0 && cap[ENG_EP_COMBINE_1] > 0;
    kvx_win_config_t wc = { .rank = me, .size = N, .n_slots = two ? 6 : 4,
                            .slot_bytes = { cap[0], cap[1],
                                            sizeof(node_ep_vote_t), sizeof(node_ep_vote_t),
                                            cap[2], cap[3] },
                            .timeout_ns = c->ep_timeout_ns,
                            .tls = c->ep_tls == 0 ? "shm" : c->ep_tls == 1 ? "tcp" : NULL };
    /* across hosts: the interface kv-listen names (its NET_DEVICES) */
    if (c->ep_tls != 0 && strcmp(n->kv_dev, "*") != 0)
        wc.net_devices = n->kv_dev;
    kvx_win_h *w = NULL;
    st = kvx_win_create(&wc, &w);
    if (st != PD_OK) {
        snprintf(err, err_len, "exchange window: %s", pd_status_str(st));
        return st;
    }
    const void *meta;
    size_t ml;
    kvx_win_meta(w, &meta, &ml);
    st = node_ep_publish(c->ep_dir, me, "meta", meta, ml, err, err_len);
    static uint8_t buf[NODE_EP_META_MAX];
    uint64_t t0 = pd_now_ns();
    for (uint32_t p = 0; st == PD_OK && p < N; p++) {
        if (p == me)
            continue;
        size_t len = 0;
        while ((st = node_ep_read(c->ep_dir, p, buf, sizeof buf, &len)) == PD_ERR_NOT_FOUND &&
               pd_now_ns() - t0 < NODE_EP_JOIN_NS)
            usleep(20000);
        if (st == PD_OK)
            st = kvx_win_peer_add(w, p, buf, len);
        if (st != PD_OK)
            snprintf(err, err_len, "ep-dir %s: rank %u's metadata: %s", c->ep_dir, p,
                     pd_status_str(st));
    }
    eng_ep_xport_t x = { .ctx = w, .rank = me, .size = N,
                         .cap = { cap[0], cap[1], cap[2], cap[3] },
                         .send_buf = node_ep_send_buf, .exchange = node_ep_exchange,
                         .post = node_ep_post, .wait = node_ep_wait };
    if (st == PD_OK && (st = n->ops->set_ep(n->model, &x)) != PD_OK)
        snprintf(err, err_len, "set_ep: %s", pd_status_str(st));
    /* llama: each rank hashed its own experts; the sim's hash is the whole
     * model's already (its experts are a layout, not weights) */
    if (st == PD_OK && strcmp(n->engine, "llama") == 0 &&
        (st = node_ep_group_hash(n, w, N)) != PD_OK)
        snprintf(err, err_len, "the group's compat hash (expert digests): %s",
                 pd_status_str(st));
    if (st != PD_OK) {
        kvx_win_destroy(w);
        return st;
    }
    n->ep_win = w;
    n->ep_pass_rows = n->ops->ep_pass_rows(n->model);
    return PD_OK;
}

/* A rank's boot is done: wait (up to NODE_EP_JOIN_NS) for every rank's
 * dir/rank-<r>.up, so the group's first exchanges meet within ep-timeout
 * however long the rest of each rank's boot took, then one idle pass of
 * the whole group as its self-check. */
pd_status_t node_ep_ready(node_t *n, char *err, size_t err_len)
{
    const node_config_t *c = n->cfg;
    uint32_t me = (uint32_t)c->ep_rank, N = (uint32_t)c->ep_size;
    pd_status_t st = node_ep_publish(c->ep_dir, me, "up", "up\n", 3, err, err_len);
    uint64_t t0 = pd_now_ns();
    for (uint32_t p = 0; st == PD_OK && p < N; p++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/rank-%u.up", c->ep_dir, p);
        while (access(path, F_OK) != 0 && pd_now_ns() - t0 < NODE_EP_JOIN_NS)
            usleep(20000);
        if (access(path, F_OK) != 0) {
            snprintf(err, err_len, "ep-dir %s: rank %u did not finish its boot", c->ep_dir, p);
            st = PD_ERR_TIMED_OUT;
        }
    }
    uint64_t t1 = pd_now_ns();
    if (st == PD_OK && (st = n->ops->ep_idle(n->model)) != PD_OK)
        snprintf(err, err_len, "the group's first idle pass: %s", pd_status_str(st));
    if (st != PD_OK)
        return st;
    eng_llama_info_t in = { 0 };
    if (strcmp(n->engine, "llama") == 0)
        eng_llama_info(n->model, &in);
    pd_log(PD_LOG_INFO, n->role->name, NULL,
           "EP group: rank %u of %u joined through %s (window over %s%s%s, %s micro-batch%s "
           "per pass, engine %s, expert bytes %llu of %llu, compat hash %016llx), an "
           "idle pass of the group in %.3f ms", me, N, c->ep_dir, node_ep_tls[c->ep_tls],
           c->ep_tls != 0 && strcmp(n->kv_dev, "*") != 0 ? " on " : "",
           c->ep_tls != 0 && strcmp(n->kv_dev, "*") != 0 ? n->kv_dev : "",
           kvx_win_slots(n->ep_win) > 4 ? "two" : "one", kvx_win_slots(n->ep_win) > 4 ? "es" : "",
           n->engine, (unsigned long long)in.expert_bytes_owned,
           (unsigned long long)in.expert_bytes_total, (unsigned long long)n->geom->compat_hash,
           (double)(pd_now_ns() - t1) / 1e6);
    return PD_OK;
}

pd_status_t node_ep_vote(node_t *n, const node_ep_vote_t *mine, node_ep_vote_t *group)
{
    uint32_t N = (uint32_t)n->cfg->ep_size, slot = 2 + (uint32_t)(n->ep_votes++ & 1);
    size_t len[KVX_WIN_MAX_RANKS] = { 0 };
    const void *recv[KVX_WIN_MAX_RANKS];
    size_t recv_len[KVX_WIN_MAX_RANKS];
    for (uint32_t p = 0; p < N; p++) {
        memcpy(kvx_win_send_buf(n->ep_win, slot, p), mine, sizeof(*mine));
        len[p] = sizeof(*mine);
    }
    pd_status_t st = kvx_win_exchange(n->ep_win, slot, len, recv, recv_len);
    if (st != PD_OK)
        return st;
    *group = (node_ep_vote_t){ .passes = 0, .flags = NODE_EP_DRAINED };
    for (uint32_t p = 0; p < N; p++) {
        node_ep_vote_t v;
        if (recv_len[p] != sizeof(v))
            return PD_ERR_BAD_INPUT;
        memcpy(&v, recv[p], sizeof(v));
        if (v.passes > 1u << 20 || (v.flags & ~NODE_EP_DRAINED) != 0)
            return PD_ERR_BAD_INPUT;
        group->passes = v.passes > group->passes ? v.passes : group->passes;
        group->flags &= v.flags;
    }
    return PD_OK;
}

void node_ep_leave(node_t *n)
{
    kvx_win_destroy(n->ep_win);
    n->ep_win = NULL;
}
