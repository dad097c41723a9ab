/* gram_bench.c - pd-gram-bench: cost of a grammar-masked sampling step
 * against an unmasked one at a given vocabulary size (default 131072, a
 * Llama-3-sized vocabulary), for several grammar states.
 *
 *   pd-gram-bench [vocab] [iterations] [rows]
 *
 * The vocabulary is synthetic and deterministic: ids 0..255 are the single
 * bytes, the rest random pieces of 1-10 bytes (letters, spaces, digits,
 * JSON punctuation, 2-byte UTF-8), with a leading space half of the time.
 * A step = copy the logits, (mask,) eng_sample_next at temperature 1.
 * "mask us" is the mask alone as a step in the middle of a sequence sees it
 * (the same state again: inside a string the per-state cache answers);
 * "cold us" is the mask of a fresh state (no cache: the first token of
 * every string pays it once). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eng_gram.h"
#include "eng_sample.h"

typedef struct {
    uint32_t n;
    char (*p)[12];
    uint8_t *len;
} synth_t;

static uint64_t rs = 0x9e3779b97f4a7c15ULL;
static uint32_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 16);
}

static size_t piece(void *ctx, int32_t id, char *buf, size_t cap)
{
    synth_t *s = ctx;
    size_t n = s->len[id];
    if (n > cap)
        return 0;
    memcpy(buf, s->p[id], n);
    return n;
}

static void synth(synth_t *s, uint32_t n)
{
    static const char punct[] = "\"{}[],:.-_\\/";
    s->n = n;
    s->p = calloc(n, sizeof(*s->p));
    s->len = calloc(n, 1);
    for (uint32_t i = 0; i < n; i++) {
        if (i < 256) {
            s->p[i][0] = (char)i;
            s->len[i] = 1;
            continue;
        }
        uint32_t L = 1 + rnd() % 10, k = 0;
        if (rnd() % 2)
            s->p[i][k++] = ' ';
        while (k < L) {
            uint32_t r = rnd() % 100;
            if (r < 75)
                s->p[i][k++] = (char)('a' + rnd() % 26);
            else if (r < 85)
                s->p[i][k++] = (char)('0' + rnd() % 10);
            else if (r < 93)
                s->p[i][k++] = punct[rnd() % (sizeof(punct) - 1)];
            else if (k + 2 <= L) {
                s->p[i][k++] = (char)(0xc3);
                s->p[i][k++] = (char)(0xa0 + rnd() % 16);
            }
        }
        s->len[i] = (uint8_t)k;
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts); /* CPU time: the box is shared */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define GRAM_BENCH_USAGE                                                            \
    "usage: pd-gram-bench [VOCAB [ITERATIONS [ROWS]]]\n\n"                             \
    "The structured-output engine's cost per token: compile time, and the time\n"     \
    "of one logit mask over a synthetic vocabulary in each grammar state (JSON\n"    \
    "object/schema, recursive $ref, integer ranges, multipleOf, a regex, GBNF),\n"   \
    "in CPU time (the box may be shared).\n"                                        \
    "  VOCAB       vocabulary size, >= 256 (default 131072)\n"                      \
    "  ITERATIONS  masks per state (default 200)\n"                                \
    "  ROWS        only the rows whose label contains this text\n"                 \
    "  --help      this text\n"

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--help") == 0) {
        fputs(GRAM_BENCH_USAGE, stdout);
        return 0;
    }
    uint32_t vocab = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 131072;
    uint32_t iters = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 200;
    if (vocab < 256 || iters == 0) {
        fputs(GRAM_BENCH_USAGE, stderr);
        return 2;
    }
    synth_t sv;
    synth(&sv, vocab);
    eng_gram_vocab_t *voc;
    if (eng_gram_vocab_create(vocab, piece, &sv, &voc) != PD_OK)
        return 1;
    static const char schema[] =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
        "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
        "{\"type\":\"string\"}},\"kind\":{\"enum\":[\"a\",\"b\"]}},"
        "\"required\":[\"name\",\"age\",\"tags\",\"kind\"],\"additionalProperties\":false}";
    static const char tree[] =
        "{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\"},"
        "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}},"
        "\"required\":[\"value\",\"children\"],\"additionalProperties\":false}";
    static const char i64[] =
        "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\","
        "\"minimum\":-9223372036854775808,\"maximum\":9223372036854775807},"
        "\"m\":{\"type\":\"integer\",\"multipleOf\":1000000007}},\"required\":[\"n\",\"m\"]}";
    static const char gbnf[] =
        "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\n"
        "term ::= factor ((\"*\" | \"/\") factor)*\nfactor ::= [0-9]+ | \"(\" expr \")\"\n";
    /* a regex of about 1000 states: 100 words of 10 letters, alternated */
    static char rx1k[1200];
    size_t rl = 0;
    for (int w = 0; w < 100; w++) {
        if (w)
            rx1k[rl++] = '|';
        for (int k = 0; k < 10; k++)
            rx1k[rl++] = (char)('a' + (w * 7 + k * 3 + w / 26) % 26);
    }
    rx1k[rl] = '\0';
    struct {
        const char *label;
        eng_gram_kind_t kind;
        const char *prefix;
        const char *text; /* NULL: schema */
    } cases[] = {
        { "json_object, start", ENG_GRAM_JSON_OBJECT, "", NULL },
        { "json_object, key start", ENG_GRAM_JSON_OBJECT, "{", NULL },
        { "json_object, in string", ENG_GRAM_JSON_OBJECT, "{\"k\":\"ab", NULL },
        { "json_object, value", ENG_GRAM_JSON_OBJECT, "{\"k\":", NULL },
        { "schema, in string", ENG_GRAM_JSON_SCHEMA, "{\"name\":\"x", NULL },
        { "schema, integer", ENG_GRAM_JSON_SCHEMA, "{\"name\":\"x\",\"age\":1", NULL },
        { "schema, array item", ENG_GRAM_JSON_SCHEMA, "{\"name\":\"x\",\"age\":1,\"tags\":[", NULL },
        { "tree $ref, depth 3 item", ENG_GRAM_JSON_SCHEMA,
          "{\"value\":1,\"children\":[{\"value\":2,\"children\":[{\"value\":3,\"children\":[",
          tree },
        { "tree $ref, depth 3 int", ENG_GRAM_JSON_SCHEMA,
          "{\"value\":1,\"children\":[{\"value\":2,\"children\":[{\"value\":3", tree },
        { "int64 range, mid", ENG_GRAM_JSON_SCHEMA, "{\"n\":-92233720", i64 },
        { "int multipleOf, mid", ENG_GRAM_JSON_SCHEMA, "{\"n\":1,\"m\":99", i64 },
        { "regex 1k states, start", ENG_GRAM_REGEX, "", rx1k },
        { "regex 1k states, 2 bytes", ENG_GRAM_REGEX, "ad", rx1k },
        { "gbnf arith, depth 3", ENG_GRAM_GBNF, "1+((2*(3", gbnf },
    };
    float *base = malloc(vocab * sizeof(float)), *lg = malloc(vocab * sizeof(float));
    uint8_t *scratch = malloc(vocab);
    eng_sample_scratch_t scr;
    if (!base || !lg || !scratch || eng_sample_scratch_create(&scr, vocab) != PD_OK)
        return 1;
    for (uint32_t i = 0; i < vocab; i++)
        base[i] = (float)(rnd() % 20000) / 1000.0f - 10.0f;
    eng_sample_params_t p;
    eng_sample_params_default(&p);
    p.temperature = 1.0f;
    p.seed = 7;
    int32_t eos = 1;
    printf("vocab %u, %u iterations per row (step = logits copy + eng_sample_next, T=1)\n",
           vocab, iters);
    printf("%-28s %14s %14s %8s %10s %10s\n", "state", "unmasked us", "masked us", "ratio",
           "mask us", "cold us");
    double worst = 0.0, worst_compile = 0.0;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        if (argc > 3 && strstr(cases[c].label, argv[3]) == NULL)
            continue; /* [rows]: only the rows whose label has this text */
        eng_gram_t *g;
        char err[200];
        const char *text = cases[c].text ? cases[c].text : schema;
        double tc = now();
        if (eng_gram_compile(cases[c].kind, text, strlen(text), &g, err, sizeof(err)) != PD_OK) {
            fprintf(stderr, "compile: %s\n", err);
            return 1;
        }
        tc = now() - tc;
        if (tc > worst_compile)
            worst_compile = tc;
        eng_gram_state_t *st;
        if (eng_gram_state_create(g, &st) != PD_OK)
            return 1;
        size_t pl = strlen(cases[c].prefix);
        if (pl && !eng_gram_feed(st, (const uint8_t *)cases[c].prefix, pl)) {
            fprintf(stderr, "prefix rejected: %s\n", cases[c].prefix);
            return 1;
        }
        eng_sampler_t smp;
        eng_sampler_init(&smp, &p);
        double t0 = now();
        for (uint32_t i = 0; i < iters; i++) {
            memcpy(lg, base, vocab * sizeof(float));
            (void)eng_sample_next(&smp, lg, vocab, &scr, NULL);
        }
        double un = (now() - t0) / iters;
        t0 = now();
        for (uint32_t i = 0; i < iters; i++) {
            memcpy(lg, base, vocab * sizeof(float));
            (void)eng_gram_mask(st, voc, &eos, 1, lg, vocab, scratch,
                                 UINT32_MAX);
            (void)eng_sample_next(&smp, lg, vocab, &scr, NULL);
        }
        double ms = (now() - t0) / iters;
        t0 = now();
        for (uint32_t i = 0; i < iters; i++)
            (void)eng_gram_mask(st, voc, &eos, 1, lg, vocab, scratch,
                                 UINT32_MAX);
        double mo = (now() - t0) / iters;
        /* cold: a fresh state each time (no cache), prefix fed again */
        uint32_t cold_it = iters < 50 ? iters : 50;
        t0 = now();
        for (uint32_t i = 0; i < cold_it; i++) {
            eng_gram_state_t *cs;
            if (eng_gram_state_create(g, &cs) != PD_OK)
                return 1;
            if (pl)
                (void)eng_gram_feed(cs, (const uint8_t *)cases[c].prefix, pl);
            (void)eng_gram_mask(cs, voc, &eos, 1, lg, vocab, scratch, UINT32_MAX);
            eng_gram_state_free(cs);
        }
        double mc = (now() - t0) / cold_it;
        double ratio = ms / un;
        if (ratio > worst)
            worst = ratio;
        printf("%-28s %14.1f %14.1f %8.3f %10.1f %10.1f\n", cases[c].label, un * 1e6, ms * 1e6,
               ratio, mo * 1e6, mc * 1e6);
        eng_gram_state_free(st);
        eng_gram_free(g);
    }
    printf("worst ratio %.3f, slowest compile %.1f us\n", worst, worst_compile * 1e6);
    eng_sample_scratch_destroy(&scr);
    eng_gram_vocab_free(voc);
    free(base);
    free(lg);
    free(scratch);
    free(sv.p);
    free(sv.len);
    return 0;
}
