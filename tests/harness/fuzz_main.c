/* fuzz_main.c - plain driver for libFuzzer targets when libFuzzer is not
 * built (gcc, sanitizer builds): feeds every file of the given corpus
 * directories to LLVMFuzzerTestOneInput, then deterministic mutations of
 * each (bit flips, truncations, byte insertions, splices), so the 'fuzz'
 * suite always exercises the decoders.
 *   usage: fuzz-x [-m MUTATIONS_PER_FILE] DIR|FILE...            */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static unsigned long n_inputs;

static void run_one(const uint8_t *data, size_t size)
{
    /* Copy to an exact-size heap buffer so ASan sees any over-read. */
    uint8_t *copy = malloc(size ? size : 1);
    if (copy == NULL)
        abort();
    if (size)
        memcpy(copy, data, size);
    LLVMFuzzerTestOneInput(copy, size);
    free(copy);
    n_inputs++;
}

static void mutate_and_run(const uint8_t *data, size_t size, unsigned mutations)
{
    size_t cap = size + 64;
    uint8_t *buf = malloc(cap);
    if (buf == NULL)
        abort();
    run_one(data, size);
    for (size_t cut = 0; cut < size; cut += 1 + size / 64)
        run_one(data, cut); /* truncations */
    for (unsigned m = 0; m < mutations; m++) {
        size_t len = size;
        memcpy(buf, data, size);
        unsigned edits = 1 + (unsigned)(next_rand() % 4);
        for (unsigned e = 0; e < edits; e++) {
            uint64_t r = next_rand();
            switch (r % 5) {
            case 0: /* flip a bit */
                if (len)
                    buf[(r >> 8) % len] ^= (uint8_t)(1u << ((r >> 40) % 8));
                break;
            case 1: /* set a byte to an interesting value */
                if (len) {
                    static const uint8_t vals[] = { 0x00, 0xff, 0x7f, 0x80, 0x01, 0x20 };
                    buf[(r >> 8) % len] = vals[(r >> 40) % sizeof(vals)];
                }
                break;
            case 2: /* insert a random byte */
                if (len < cap) {
                    size_t at = len ? (r >> 8) % (len + 1) : 0;
                    memmove(buf + at + 1, buf + at, len - at);
                    buf[at] = (uint8_t)(r >> 32);
                    len++;
                }
                break;
            case 3: /* delete a byte */
                if (len) {
                    size_t at = (r >> 8) % len;
                    memmove(buf + at, buf + at + 1, len - at - 1);
                    len--;
                }
                break;
            default: /* overwrite 4 bytes with a large little-endian value */
                if (len >= 4) {
                    size_t at = (r >> 8) % (len - 3);
                    uint32_t v = (r >> 32) & 1 ? 0xffffffffu : 0x7fffffffu;
                    memcpy(buf + at, &v, 4);
                }
                break;
            }
        }
        run_one(buf, len);
    }
    free(buf);
}

static void run_path(const char *path, unsigned mutations)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "fuzz driver: cannot stat %s\n", path);
        exit(2);
    }
    if (S_ISDIR(st.st_mode)) {
        struct dirent **names;
        int n = scandir(path, &names, NULL, alphasort);
        if (n < 0) {
            fprintf(stderr, "fuzz driver: cannot read %s\n", path);
            exit(2);
        }
        for (int i = 0; i < n; i++) {
            if (names[i]->d_name[0] != '.') {
                char sub[4096];
                snprintf(sub, sizeof(sub), "%s/%s", path, names[i]->d_name);
                run_path(sub, mutations);
            }
            free(names[i]);
        }
        free(names);
        return;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "fuzz driver: cannot open %s\n", path);
        exit(2);
    }
    uint8_t *data = malloc((size_t)st.st_size + 1);
    size_t got = data ? fread(data, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    if (data == NULL)
        abort();
    mutate_and_run(data, got, mutations);
    free(data);
}

int main(int argc, char **argv)
{
    unsigned mutations = 2000;
    int i = 1;
    if (i + 1 < argc && strcmp(argv[i], "-m") == 0) {
        mutations = (unsigned)strtoul(argv[i + 1], NULL, 10);
        i += 2;
    }
    if (i >= argc) {
        fprintf(stderr, "usage: %s [-m N] CORPUS_DIR|FILE...\n", argv[0]);
        return 2;
    }
    for (; i < argc; i++)
        run_path(argv[i], mutations);
    printf("fuzz driver: %lu inputs, no crash\n", n_inputs);
    return 0;
}
