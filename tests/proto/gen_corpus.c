/* gen_corpus.c - writes the seed corpora for the proto fuzz targets from the
 * sample messages (proto_samples.c), or checks that the committed corpora
 * are what this generator makes (so a layout change forces a refresh).
 *   gen-proto-corpus write DIR    -> DIR/decode/ and DIR/frame/ (one .bin per seed)
 *   gen-proto-corpus check DIR    -> exit 1 if any file is missing/different
 * decode seeds: whole frames, and "type index byte + body" inputs.
 * frame seeds: a chunking seed byte + a stream of several frames. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "proto_msg.h"
#include "proto_samples.h"

#define SEED_MAX 8192 /* keep seeds small: libFuzzer's default max_len is 4096 */

static int check_mode;
static int failures;
static int files;

static void emit(const char *dir, const char *sub, const char *name,
                 const uint8_t *p, size_t n)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s/%s.bin", dir, sub, name);
    files++;
    if (check_mode) {
        FILE *f = fopen(path, "rb");
        uint8_t *have = malloc(n + 1);
        size_t got = f ? fread(have, 1, n + 1, f) : 0;
        if (f == NULL || got != n || memcmp(have, p, n) != 0) {
            fprintf(stderr, "corpus file %s is missing or stale\n", path);
            failures++;
        }
        if (f)
            fclose(f);
        free(have);
        return;
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(p, 1, n, f) != n) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fclose(f);
}

static uint8_t *encode(const proto_msg_t *m, size_t *len_p)
{
    size_t need = 0;
    if (proto_msg_encode(m, NULL, 0, &need) != PD_ERR_NO_SPACE)
        abort();
    uint8_t *buf = malloc(need);
    if (proto_msg_encode(m, buf, need, len_p) != PD_OK)
        abort();
    return buf;
}

int main(int argc, char **argv)
{
    static const char *vname[] = { "min", "mid", "max" };
    uint8_t *stream = malloc(1 << 20);
    size_t slen = 1;
    char name[128], path[1024];

    if (argc != 3 || (strcmp(argv[1], "write") && strcmp(argv[1], "check"))) {
        fprintf(stderr, "usage: %s write|check DIR\n", argv[0]);
        return 2;
    }
    check_mode = strcmp(argv[1], "check") == 0;
    const char *dir = argv[2];
    if (!check_mode) {
        mkdir(dir, 0755);
        snprintf(path, sizeof(path), "%s/decode", dir);
        mkdir(path, 0755);
        snprintf(path, sizeof(path), "%s/frame", dir);
        mkdir(path, 0755);
    }
    stream[0] = 0x5a; /* chunking seed */
    for (int i = 0; i < PROTO_MSG_COUNT; i++) {
        for (int v = 0; v < PS_VARIANTS; v++) {
            proto_msg_t m;
            size_t len;
            ps_make(ps_types[i], v, &m);
            uint8_t *buf = encode(&m, &len);
            if (len <= SEED_MAX) {
                const char *tn = proto_msg_name(ps_types[i]);
                snprintf(name, sizeof(name), "%s-%s", tn, vname[v]);
                emit(dir, "decode", name, buf, len);
                /* body form: index byte (matches the target's types[]) + body */
                uint8_t *body = malloc(len - PROTO_HDR_LEN + 1);
                body[0] = (uint8_t)i;
                memcpy(body + 1, buf + PROTO_HDR_LEN, len - PROTO_HDR_LEN);
                snprintf(name, sizeof(name), "body-%s-%s", tn, vname[v]);
                emit(dir, "decode", name, body, len - PROTO_HDR_LEN + 1);
                free(body);
                if (v == PS_MID) {
                    uint8_t one[1 + SEED_MAX];
                    one[0] = (uint8_t)(i * 37);
                    memcpy(one + 1, buf, len);
                    snprintf(name, sizeof(name), "%s", tn);
                    emit(dir, "frame", name, one, len + 1);
                    memcpy(stream + slen, buf, len);
                    slen += len;
                }
            }
            free(buf);
        }
    }
    emit(dir, "frame", "stream-all", stream, slen);
    /* same stream with a garbage tail and with a truncated tail */
    memcpy(stream + slen, "GARBAGE-GARBAGE-GARBAGE-GARBAGE-", 32);
    emit(dir, "frame", "stream-garbage-tail", stream, slen + 32);
    emit(dir, "frame", "stream-cut-tail", stream, slen - 5);
    free(stream);
    if (check_mode) {
        if (failures) {
            fprintf(stderr, "%d of %d corpus files stale: run "
                    "gen-proto-corpus write tests/proto/corpus\n", failures, files);
            return 1;
        }
        printf("corpus ok: %d files\n", files);
    }
    return 0;
}
