/* fuzz_corpus - replay a fuzz target's committed corpus without libFuzzer
 * (suite 'fuzz' when -Dfuzz=false): every file as is, then every file with
 * each single bit flipped and each length truncation. Exit 0 = no crash. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t run_file(const char *path)
{
    uint8_t buf[4096];
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    size_t runs = 0;
    LLVMFuzzerTestOneInput(buf, n), runs++;
    for (size_t i = 0; i < n * 8; i++) {
        buf[i / 8] ^= (uint8_t)(1u << (i % 8));
        LLVMFuzzerTestOneInput(buf, n), runs++;
        buf[i / 8] ^= (uint8_t)(1u << (i % 8));
    }
    for (size_t l = 0; l < n; l++)
        LLVMFuzzerTestOneInput(buf, l), runs++;
    return runs;
}

int main(int argc, char **argv)
{
    size_t files = 0, runs = 0;
    for (int a = 1; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        if (d == NULL) {
            fprintf(stderr, "fuzz_corpus: cannot open %s\n", argv[a]);
            return 1;
        }
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof(path), "%s/%s", argv[a], de->d_name);
            runs += run_file(path);
            files++;
        }
        closedir(d);
    }
    printf("fuzz_corpus: %zu files, %zu inputs\n", files, runs);
    return files == 0; /* an empty corpus is a broken test, not a pass */
}
