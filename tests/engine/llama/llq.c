/* llq.c - llama.cpp's own quantizer (llama_model_quantize from the
 * prebuilt libllama that node-llama-cpp ships) as a tool for tests:
 *   llq LIBLLAMA.so IN.gguf OUT.gguf FTYPE
 * FTYPE is a llama_ftype number (15 = Q4_K_M, ...). This is the function
 * the llama-quantize tool calls (the npm package ships no llama-quantize
 * binary), so OUT is a file as llama.cpp's tools write it. The params
 * struct is llama.h's llama_model_quantize_params; only its first two
 * fields (nthread, ftype) are set, the rest come from
 * llama_model_quantize_default_params().
 *
 *   llq dequant LIBGGML_BASE.so FILE.gguf
 * decodes every tensor of FILE with ggml's own to_float (ggml_get_type_traits)
 * and with pdserve's ggml_dequantize_row, and requires the floats to be
 * bitwise equal: pdserve reads every block exactly as ggml does.
 * Exit 0 ok, 1 failure, 2 usage. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

typedef struct {
    int32_t nthread;
    int32_t ftype;
    unsigned char rest[248]; /* the remaining fields; larger than llama.h's */
} llq_params_t;

typedef llq_params_t (*defaults_fn)(void);
typedef uint32_t (*quantize_fn)(const char *, const char *, const llq_params_t *);
typedef void (*void_fn)(void);

typedef struct {
    const char *type_name;
    int64_t blck_size, blck_size_interleave;
    size_t type_size;
    bool is_quantized;
    void (*to_float)(const void *x, float *y, int64_t k);
    void *from_float_ref;
} llq_traits_t;

static int dequant_check(const char *lib, const char *path)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "llq: dlopen %s: %s\n", lib, dlerror());
        return 1;
    }
    const llq_traits_t *(*traits)(int) =
        (const llq_traits_t *(*)(int))dlsym(h, "ggml_get_type_traits");
    if (!traits) {
        fprintf(stderr, "llq: no ggml_get_type_traits in %s\n", lib);
        return 1;
    }
    gguf_t *g;
    char err[256];
    if (gguf_open(path, &g, err, sizeof(err)) != PD_OK) {
        fprintf(stderr, "llq: %s: %s\n", path, err);
        return 1;
    }
    int bad = 0;
    uint64_t checked = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(g, i);
        const llq_traits_t *tr = traits((int)t->type);
        float *a = malloc(t->n_elements * sizeof(float));
        float *b = malloc(t->n_elements * sizeof(float));
        if (!a || !b || !tr || !tr->to_float) {
            free(a);
            free(b);
            if (t->type == 0)
                continue; /* f32 has no to_float */
            fprintf(stderr, "llq: %s: no ggml decoder for type %u\n", t->name, t->type);
            bad++;
            continue;
        }
        tr->to_float(t->data, a, (int64_t)t->n_elements);
        pd_status_t st = ggml_dequantize_row(t->type, t->data, b, t->n_elements);
        if (st != PD_OK || memcmp(a, b, t->n_elements * sizeof(float)) != 0) {
            uint64_t j = 0;
            while (st == PD_OK && j < t->n_elements && memcmp(&a[j], &b[j], 4) == 0)
                j++;
            fprintf(stderr, "llq: %s (%s): pdserve differs from ggml (%s) at %llu: %g vs %g\n",
                    t->name, ggml_type_name(t->type), pd_status_str(st),
                    (unsigned long long)j, j < t->n_elements ? b[j] : 0.0,
                    j < t->n_elements ? a[j] : 0.0);
            bad++;
        }
        checked += t->n_elements;
        free(a);
        free(b);
    }
    gguf_close(g);
    printf("llq: %s: %llu elements decoded, %d tensor(s) differ\n", path,
           (unsigned long long)checked, bad);
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "dequant") == 0)
        return dequant_check(argv[2], argv[3]);
    if (argc != 5) {
        fprintf(stderr, "usage: llq LIBLLAMA.so IN.gguf OUT.gguf FTYPE\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "llq: dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    defaults_fn defaults = (defaults_fn)dlsym(h, "llama_model_quantize_default_params");
    quantize_fn quantize = (quantize_fn)dlsym(h, "llama_model_quantize");
    void_fn init = (void_fn)dlsym(h, "llama_backend_init");
    if (!defaults || !quantize) {
        fprintf(stderr, "llq: llama_model_quantize not exported by %s\n", argv[1]);
        return 1;
    }
    if (init)
        init();
    llq_params_t p = defaults();
    p.nthread = 2;
    p.ftype = atoi(argv[4]);
    uint32_t rc = quantize(argv[2], argv[3], &p);
    if (rc != 0) {
        fprintf(stderr, "llq: llama_model_quantize failed (%u)\n", rc);
        return 1;
    }
    return 0;
}
