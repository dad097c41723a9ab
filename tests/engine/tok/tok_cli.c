/* tok_cli.c - test helper: encode/decode lines with a GGUF tokenizer.
 *
 * usage: tok_cli MODEL.gguf [--bos] [--special] [--strip]
 * stdin: one text per line, hex-encoded (so any bytes, including invalid
 * UTF-8 and newlines, can be passed). stdout per line:
 *   comma-separated ids TAB hex of the decoded text
 * Used by xcheck.mjs against the npm reference tokenizers.
 * With --bench SECONDS: read all lines, then encode them repeatedly for
 * much CPU time and print "bench bytes=B tokens=T seconds=S" (CPU seconds,
 * load excluded). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eng_tok.h"

static int unhex(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts); /* CPU time: fair on a shared box */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Encode every stdin text repeatedly for `secs` seconds. */
static int run_bench(eng_tok_t *tok, double secs, bool bos, bool special)
{
    char *line = NULL, **texts = NULL;
    size_t cap = 0, n_texts = 0, *lens = NULL, i, n, bytes = 0, tokens = 0;
    ssize_t len;
    int32_t *ids = malloc((1u << 20) * sizeof(int32_t));
    double t0, t;

    while (ids != NULL && (len = getline(&line, &cap, stdin)) >= 0) {
        char *txt = malloc((size_t)len / 2 + 1);
        size_t tl = 0;
        texts = realloc(texts, (n_texts + 1) * sizeof(*texts));
        lens = realloc(lens, (n_texts + 1) * sizeof(*lens));
        if (txt == NULL || texts == NULL || lens == NULL)
            return 1;
        for (i = 0; i + 1 < (size_t)len; i += 2)
            txt[tl++] = (char)(unhex(line[i]) * 16 + unhex(line[i + 1]));
        texts[n_texts] = txt;
        lens[n_texts++] = tl;
    }
    if (n_texts == 0)
        return 1;
    t0 = now_s();
    do {
        for (i = 0; i < n_texts; i++) {
            if (eng_tok_encode(tok, texts[i], lens[i], bos, special, ids, 1u << 20, &n) != PD_OK)
                return 1;
            bytes += lens[i];
            tokens += n;
        }
        t = now_s() - t0;
    } while (t < secs);
    printf("bench bytes=%zu tokens=%zu seconds=%.3f\n", bytes, tokens, t);
    for (i = 0; i < n_texts; i++)
        free(texts[i]);
    free(texts);
    free(lens);
    free(line);
    free(ids);
    return 0;
}

int main(int argc, char **argv)
{
    eng_tok_t *tok;
    char err[256];
    bool bos = false, special = false, strip = false;
    double bench = 0;
    char *line = NULL, *text, *dec;
    size_t cap = 0, i;
    ssize_t len;
    int32_t *ids;
    size_t id_cap = 1u << 20;
    pd_status_t status;

    if (argc < 2) {
        fprintf(stderr, "usage: tok_cli MODEL.gguf [--bos] [--special] [--strip]\n");
        return 2;
    }
    for (i = 2; i < (size_t)argc; i++) {
        if (strcmp(argv[i], "--bos") == 0)
            bos = true;
        else if (strcmp(argv[i], "--special") == 0)
            special = true;
        else if (strcmp(argv[i], "--strip") == 0)
            strip = true;
        else if (strcmp(argv[i], "--bench") == 0 && i + 1 < (size_t)argc)
            bench = atof(argv[++i]);
        else {
            fprintf(stderr, "tok_cli: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    status = eng_tok_load_path(argv[1], &tok, err, sizeof(err));
    if (status != PD_OK) {
        fprintf(stderr, "tok_cli: %s: %s (%s)\n", argv[1], err, pd_status_name(status));
        return 1;
    }
    ids = malloc(id_cap * sizeof(int32_t));
    text = malloc(1u << 20);
    dec = malloc(8u << 20);
    if (ids == NULL || text == NULL || dec == NULL)
        return 1;
    if (bench > 0) {
        int rc = run_bench(tok, bench, bos, special);
        free(ids);
        free(text);
        free(dec);
        eng_tok_destroy(tok);
        return rc;
    }
    while ((len = getline(&line, &cap, stdin)) >= 0) {
        size_t n = 0, tl = 0, dl;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        for (i = 0; i + 1 < (size_t)len && tl < (1u << 20); i += 2)
            text[tl++] = (char)(unhex(line[i]) * 16 + unhex(line[i + 1]));
        status = eng_tok_encode(tok, text, tl, bos, special, ids, id_cap, &n);
        if (status != PD_OK) {
            printf("ERR %s\n", pd_status_name(status));
            continue;
        }
        for (i = 0; i < n; i++)
            printf(i ? ",%d" : "%d", ids[i]);
        dl = eng_tok_decode(tok, ids, n, false, strip, dec, 8u << 20);
        putchar('\t');
        for (i = 0; i < dl && i < (8u << 20); i++)
            printf("%02x", (unsigned char)dec[i]);
        putchar('\n');
    }
    free(line);
    free(ids);
    free(text);
    free(dec);
    eng_tok_destroy(tok);
    return 0;
}
