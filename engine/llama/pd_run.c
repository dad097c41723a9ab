/* pd_run.c - single-process prefill + decode: the reference path serving
 * tests compare against.
 *
 *   pd-run --model M.gguf --prompt "text" [--max-tokens N] [--temperature T]
 *          [--top-p P] [--top-k K] [--seed S] [--threads N] [--min-tokens N]
 *          [--ignore-eos] [--stop STR]... [--tokens 1,2,3] [--tokens-out]
 *          [--kv DT] [--kv-k DT] [--kv-v DT] [--block-tokens N] [--no-bos] [--engine llama]
 *          [--presence-penalty X] [--frequency-penalty X] [--repetition-penalty X]
 *          [--min-p X] [--logit-bias ID:BIAS,...] [--stop-token-ids 1,2]
 *          [--logprobs-out N] [--score N [--logits-out FILE]]
 *
 * Text streams to stdout as it is generated; --tokens-out prints the
 * generated token ids (space separated, one line) instead; --logprobs-out N
 * then adds one line per token: "#lp ID LOGPROB TOP1:LP1 ..." (the model's
 * log-softmax, N alternatives; see eng_sample_logprobs). Timings go to
 * stderr. --score N scores the prompt instead (teacher forcing: the last N
 * prompt tokens, each predicted from the ones before it) and prints one JSON
 * line {"tokens": L, "scored": N, "vocab": V, "nll": sum of -ln p, "bytes":
 * the prompt's bytes (text prompts)} ("ids": [...] too with --tokens-out);
 * --logits-out FILE writes those N positions' raw logits (N x V f32, host
 * order): how KV dtypes are compared with each other and with llama.cpp
 * (tests/bench/kv-acc.sh). Exit 0 on success, 2 on bad usage, 1 on other
 * errors. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng.h"
#include "eng_sample.h"
#include "eng_tok.h"
#include "pd_time.h"

#define PD_RUN_MAX_PROMPT (1u << 20)

static void usage(FILE *f)
{
    fprintf(f,
        "usage: pd-run --model M.gguf (--prompt TEXT | --tokens 1,2,3) [options]\n"
        "  --max-tokens N     tokens to generate (default 32)\n"
        "  --temperature T    0 = greedy (default 0)\n"
        "  --top-p P  --top-k K  --seed S  --min-tokens N  --ignore-eos\n"
        "  --stop STR         stop string (repeatable, up to %d)\n"
        "  --presence-penalty X  --frequency-penalty X  --repetition-penalty X  --min-p X\n"
        "  --logit-bias ID:BIAS,...   --stop-token-ids ID,...\n"
        "  --embed POOL       print the prompt's embedding (mean|cls|last pooling,\n"
        "                     L2-normalised; one line of floats) instead of generating\n"
        "  --logprobs-out N   with --tokens-out: per-token logprobs, N alternatives\n"
        "  --score N          score the prompt's last N tokens (teacher forcing) and\n"
        "                     print {tokens, scored, vocab, nll} as JSON instead\n"
        "  --logits-out FILE  with --score: those positions' logits (N x vocab f32)\n"
        "  --threads N        compute threads (default: online cores)\n"
        "  --tokens-out       print generated token ids instead of text\n"
        "  --kv DT            KV cache dtype of K and V: f16 (default), f32, bf16,\n"
        "                     q8_0, fp8_e4m3, q4_0\n"
        "  --kv-k DT, --kv-v DT  K's or V's dtype apart\n"
        "  --block-tokens N   tokens per KV block (default 16)\n"
        "  --no-bos           do not prepend BOS to the prompt\n"
        "  --engine NAME      engine (default llama)\n", ENG_STOP_MAX);
}

static int parse_tokens(const char *s, int32_t **ids_p, size_t *n_p)
{
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof(*ids));
    if (!ids)
        return -1;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX) {
            free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *nid = realloc(ids, 2 * cap * sizeof(*ids));
            if (!nid) {
                free(ids);
                return -1;
            }
            ids = nid;
            cap *= 2;
        }
        ids[n++] = (int32_t)v;
        s = end;
        if (*s == ',' || *s == ' ')
            s++;
        else if (*s)
            break;
    }
    *ids_p = ids;
    *n_p = n;
    return n > 0 ? 0 : -1;
}

/* --embed: the prompt's embedding on one line (scratch KV, no sampling). */
static int run_embed(const eng_ops_t *ops, eng_model_t *m, const eng_kv_geom_t *g,
                     const int32_t *ids, size_t n_ids, eng_pooling_t pool)
{
    if (!ops->embed || n_ids == 0 || n_ids > g->context_length) {
        fprintf(stderr, "pd-run: --embed: %s\n",
                ops->embed ? "prompt empty or longer than the context" : "engine has no embeddings");
        return 1;
    }
    uint32_t nb = (uint32_t)((n_ids + g->block_tokens - 1) / g->block_tokens);
    void *arena = calloc(nb, g->block_bytes);
    uint32_t *bt = malloc(nb * sizeof(*bt));
    float *v = malloc((size_t)g->n_embd * sizeof(float));
    int rc = 1;
    if (arena && bt && v) {
        for (uint32_t i = 0; i < nb; i++)
            bt[i] = i;
        eng_embed_item_t it = { bt, nb, ids, (uint32_t)n_ids, pool, v };
        pd_status_t st = ops->embed(m, arena, &it, 1);
        if (st == PD_OK) {
            for (uint32_t i = 0; i < g->n_embd; i++)
                printf(i ? " %.9g" : "%.9g", (double)v[i]);
            printf("\n");
            rc = 0;
        } else {
            fprintf(stderr, "pd-run: embed: %s\n", pd_status_str(st));
        }
    }
    free(arena);
    free(bt);
    free(v);
    return rc;
}

/* --score N: prefill all but the last N prompt tokens, then feed those one
 * decode step at a time; each step's logits predict the next prompt token. */
static int run_score(const eng_ops_t *ops, eng_model_t *m, const eng_kv_geom_t *g,
                     const int32_t *ids, size_t n_ids, uint32_t n_score, const char *out_path,
                     int print_ids, size_t n_bytes)
{
    if (n_score == 0 || n_score >= n_ids || n_ids > g->context_length) {
        fprintf(stderr, "pd-run: --score %u: the prompt (%zu tokens) must be longer than N "
                "and fit the context (%u)\n", n_score, n_ids, g->context_length);
        return 1;
    }
    const uint32_t V = g->vocab_size, n_pre = (uint32_t)n_ids - n_score;
    uint32_t nb = (uint32_t)((n_ids + g->block_tokens - 1) / g->block_tokens);
    void *arena = calloc(nb, g->block_bytes);
    uint32_t *bt = malloc(nb * sizeof(*bt));
    float *lg = malloc((size_t)V * sizeof(float));
    FILE *f = NULL;
    int rc = 1;
    if (!arena || !bt || !lg) {
        fprintf(stderr, "pd-run: out of memory\n");
        goto out;
    }
    if (out_path && !(f = fopen(out_path, "wb"))) {
        perror(out_path);
        goto out;
    }
    for (uint32_t i = 0; i < nb; i++)
        bt[i] = i;
    uint64_t t0 = pd_now_ns();
    pd_status_t st = ops->prefill(m, arena, bt, nb, ids, n_pre, 0, lg);
    double nll = 0;
    for (uint32_t i = 0; st == PD_OK && i < n_score; i++) {
        const uint32_t p = n_pre - 1 + i; /* lg predicts ids[p + 1] */
        int32_t next = ids[p + 1];
        if (next < 0 || (uint32_t)next >= V) {
            fprintf(stderr, "pd-run: --score: token %d outside the vocabulary\n", next);
            goto out;
        }
        double mx = -INFINITY, sum = 0;
        for (uint32_t v = 0; v < V; v++)
            mx = fmax(mx, lg[v]);
        for (uint32_t v = 0; v < V; v++)
            sum += exp((double)lg[v] - mx);
        nll -= (double)lg[next] - mx - log(sum);
        if (f && fwrite(lg, sizeof(float), V, f) != V) {
            perror(out_path);
            goto out;
        }
        if (i + 1 < n_score) {
            eng_decode_item_t it = { bt, nb, p + 1, next };
            st = ops->decode(m, arena, &it, 1, lg);
        }
    }
    if (st != PD_OK) {
        fprintf(stderr, "pd-run: --score: %s\n", pd_status_str(st));
        goto out;
    }
    printf("{\"tokens\": %zu, \"scored\": %u, \"vocab\": %u, \"nll\": %.9g, \"bytes\": %zu",
           n_ids, n_score, V, nll, n_bytes);
    if (print_ids) {
        printf(", \"ids\": [");
        for (size_t i = 0; i < n_ids; i++)
            printf(i ? ", %d" : "%d", ids[i]);
        printf("]");
    }
    printf("}\n");
    fprintf(stderr, "pd-run: scored %u of %zu tokens in %.1f s\n", n_score, n_ids,
            (pd_now_ns() - t0) / 1e9);
    rc = 0;
out:
    if (f && fclose(f) != 0 && rc == 0) {
        perror(out_path);
        rc = 1;
    }
    free(arena);
    free(bt);
    free(lg);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *prompt = NULL, *tokens_arg = NULL, *engine = "llama";
    const char *stops[ENG_STOP_MAX];
    size_t n_stops = 0;
    eng_sample_params_t sp;
    eng_sample_params_default(&sp);
    sp.max_tokens = 32;
    int embed = -1;
    eng_load_opts_t lo = { .engine = "llama", .kv_dtype = ENG_KV_F16, .max_batch = 1 };
    eng_kv_dtype_t kv_all = ENG_KV_F16;
    int kv_k = -1, kv_v = -1; /* --kv-k / --kv-v, -1: --kv's */
    int tokens_out = 0, no_bos = 0, lp_top = -1;
    uint32_t n_score = 0;
    const char *logits_out = NULL;

    enum { O_MODEL = 1, O_PROMPT, O_MAXT, O_TEMP, O_TOPP, O_TOPK, O_SEED, O_THREADS,
           O_MINT, O_IGNEOS, O_STOP, O_TOKENS, O_TOKOUT, O_KV, O_KVK, O_KVV, O_BT, O_NOBOS, O_ENGINE,
           O_HELP, O_PRES, O_FREQ, O_REP, O_MINP, O_BIAS, O_STOPIDS, O_LPOUT, O_EMBED,
           O_SCORE, O_LOGOUT };
    static const struct option opts[] = {
        { "model", required_argument, NULL, O_MODEL },
        { "prompt", required_argument, NULL, O_PROMPT },
        { "max-tokens", required_argument, NULL, O_MAXT },
        { "temperature", required_argument, NULL, O_TEMP },
        { "top-p", required_argument, NULL, O_TOPP },
        { "top-k", required_argument, NULL, O_TOPK },
        { "seed", required_argument, NULL, O_SEED },
        { "threads", required_argument, NULL, O_THREADS },
        { "min-tokens", required_argument, NULL, O_MINT },
        { "ignore-eos", no_argument, NULL, O_IGNEOS },
        { "stop", required_argument, NULL, O_STOP },
        { "presence-penalty", required_argument, NULL, O_PRES },
        { "frequency-penalty", required_argument, NULL, O_FREQ },
        { "repetition-penalty", required_argument, NULL, O_REP },
        { "min-p", required_argument, NULL, O_MINP },
        { "logit-bias", required_argument, NULL, O_BIAS },
        { "stop-token-ids", required_argument, NULL, O_STOPIDS },
        { "logprobs-out", required_argument, NULL, O_LPOUT },
        { "embed", required_argument, NULL, O_EMBED },
        { "score", required_argument, NULL, O_SCORE },
        { "logits-out", required_argument, NULL, O_LOGOUT },
        { "tokens", required_argument, NULL, O_TOKENS },
        { "tokens-out", no_argument, NULL, O_TOKOUT },
        { "kv", required_argument, NULL, O_KV },
        { "kv-k", required_argument, NULL, O_KVK },
        { "kv-v", required_argument, NULL, O_KVV },
        { "block-tokens", required_argument, NULL, O_BT },
        { "no-bos", no_argument, NULL, O_NOBOS },
        { "engine", required_argument, NULL, O_ENGINE },
        { "help", no_argument, NULL, O_HELP },
        { NULL, 0, NULL, 0 },
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case O_MODEL: model = optarg; break;
        case O_PROMPT: prompt = optarg; break;
        case O_MAXT: sp.max_tokens = (uint32_t)strtoul(optarg, &end, 10); break;
        case O_TEMP: sp.temperature = strtof(optarg, &end); break;
        case O_TOPP: sp.top_p = strtof(optarg, &end); break;
        case O_TOPK: sp.top_k = (uint32_t)strtoul(optarg, &end, 10); break;
        case O_SEED: sp.seed = strtoull(optarg, &end, 10); break;
        case O_THREADS: lo.n_threads = (uint32_t)strtoul(optarg, &end, 10); break;
        case O_MINT: sp.min_tokens = (uint32_t)strtoul(optarg, &end, 10); break;
        case O_IGNEOS: sp.ignore_eos = true; break;
        case O_STOP:
            if (n_stops == ENG_STOP_MAX) {
                fprintf(stderr, "pd-run: too many --stop\n");
                return 2;
            }
            stops[n_stops++] = optarg;
            break;
        case O_TOKENS: tokens_arg = optarg; break;
        case O_TOKOUT: tokens_out = 1; break;
        case O_KV:
        case O_KVK:
        case O_KVV: {
            eng_kv_dtype_t dt;
            if (eng_kv_dtype_parse(optarg, &dt) != 0) {
                fprintf(stderr, "pd-run: --kv%s must be f16, f32, bf16, q8_0, fp8_e4m3 or q4_0\n",
                        c == O_KV ? "" : c == O_KVK ? "-k" : "-v");
                return 2;
            }
            if (c == O_KV)
                kv_all = dt;
            else if (c == O_KVK)
                kv_k = (int)dt;
            else
                kv_v = (int)dt;
            break;
        }
        case O_BT: lo.block_tokens = (uint32_t)strtoul(optarg, &end, 10); break;
        case O_NOBOS: no_bos = 1; break;
        case O_ENGINE: engine = optarg; break;
        case O_PRES: sp.presence_penalty = strtof(optarg, &end); break;
        case O_FREQ: sp.frequency_penalty = strtof(optarg, &end); break;
        case O_REP: sp.repetition_penalty = strtof(optarg, &end); break;
        case O_MINP: sp.min_p = strtof(optarg, &end); break;
        case O_BIAS:
            for (const char *q = optarg; *q;) {
                char *e1 = NULL, *e2 = NULL;
                long id = strtol(q, &e1, 10);
                if (e1 == q || *e1 != ':' || sp.n_bias == ENG_SAMPLE_MAX_BIAS) {
                    fprintf(stderr, "pd-run: bad --logit-bias (ID:BIAS,...)\n");
                    return 2;
                }
                float b = strtof(e1 + 1, &e2);
                if (e2 == e1 + 1 || id < 0 || id > INT32_MAX || (*e2 && *e2 != ',')) {
                    fprintf(stderr, "pd-run: bad --logit-bias (ID:BIAS,...)\n");
                    return 2;
                }
                sp.bias[sp.n_bias++] = (eng_logit_bias_t){ (int32_t)id, b };
                q = *e2 ? e2 + 1 : e2;
            }
            break;
        case O_STOPIDS: {
            int32_t *sids = NULL;
            size_t n_sids = 0;
            if (parse_tokens(optarg, &sids, &n_sids) != 0 || n_sids > ENG_SAMPLE_MAX_STOP_IDS) {
                free(sids);
                fprintf(stderr, "pd-run: bad --stop-token-ids (at most %d)\n",
                        ENG_SAMPLE_MAX_STOP_IDS);
                return 2;
            }
            memcpy(sp.stop_ids, sids, n_sids * sizeof(*sids));
            sp.n_stop_ids = (uint32_t)n_sids;
            free(sids);
            break;
        }
        case O_LPOUT: lp_top = (int)strtol(optarg, &end, 10); break;
        case O_SCORE: n_score = (uint32_t)strtoul(optarg, &end, 10); break;
        case O_LOGOUT: logits_out = optarg; break;
        case O_EMBED:
            if ((embed = eng_pooling_from_name(optarg)) < 0) {
                fprintf(stderr, "pd-run: --embed: mean, cls or last\n");
                return 2;
            }
            break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (end && *end) {
            fprintf(stderr, "pd-run: bad number '%s'\n", optarg);
            return 2;
        }
    }
    lo.kv_dtype = kv_k >= 0 ? (eng_kv_dtype_t)kv_k : kv_all;
    lo.kv_split = true;
    lo.kv_dtype_v = kv_v >= 0 ? (eng_kv_dtype_t)kv_v : kv_all;
    if (!model || (!prompt && !tokens_arg) || optind != argc) {
        usage(stderr);
        return 2;
    }
    if (eng_sample_params_check(&sp) != PD_OK) {
        fprintf(stderr, "pd-run: bad sampling parameters\n");
        return 2;
    }
    const eng_ops_t *ops = eng_find(engine);
    if (!ops) {
        fprintf(stderr, "pd-run: unknown engine '%s'\n", engine);
        return 2;
    }
    lo.engine = engine;
    lo.model_path = model;

    int rc = 1;
    char err[256] = "";
    eng_tok_t *tok = NULL;
    pd_status_t st = eng_tok_load_path(model, &tok, err, sizeof(err));
    if (st != PD_OK && !tokens_arg) {
        fprintf(stderr, "pd-run: tokenizer: %s (%s)\n", pd_status_str(st), err);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (tokens_arg) {
        if (parse_tokens(tokens_arg, &ids, &n_ids) != 0) {
            fprintf(stderr, "pd-run: bad --tokens list\n");
            goto out_tok;
        }
    } else {
        size_t cap = 3 * strlen(prompt) + 8; /* byte fallback: a space is 3 byte tokens */
        if (cap > PD_RUN_MAX_PROMPT) {
            fprintf(stderr, "pd-run: prompt too long\n");
            goto out_tok;
        }
        ids = malloc(cap * sizeof(*ids));
        if (!ids)
            goto out_tok;
        st = eng_tok_encode(tok, prompt, strlen(prompt), !no_bos && eng_tok_add_bos(tok),
                            false, ids, cap, &n_ids);
        if (st == PD_OK && embed >= 0 && eng_tok_add_eos(tok) && n_ids < cap &&
            (n_ids == 0 || ids[n_ids - 1] != eng_tok_eos(tok)))
            ids[n_ids++] = eng_tok_eos(tok); /* as the router's /v1/embeddings, llama.cpp */
        if (st != PD_OK || n_ids == 0) {
            fprintf(stderr, "pd-run: tokenize: %s\n", pd_status_str(st));
            goto out_ids;
        }
    }
    if (tok) {
        if (eng_tok_eos(tok) >= 0)
            sp.eos_ids[sp.n_eos++] = eng_tok_eos(tok);
        for (uint32_t id = 0; id < eng_tok_vocab_size(tok) && sp.n_eos < ENG_SAMPLE_MAX_EOS;
             id++)
            if (eng_tok_is_eog(tok, (int32_t)id) && (int32_t)id != eng_tok_eos(tok))
                sp.eos_ids[sp.n_eos++] = (int32_t)id;
    }

    eng_model_t *m = NULL;
    st = ops->load(&lo, &m, err, sizeof(err));
    if (st != PD_OK) {
        fprintf(stderr, "pd-run: load %s: %s (%s)\n", model, pd_status_str(st), err);
        goto out_ids;
    }
    const eng_kv_geom_t *g = ops->geometry(m);
    if (embed >= 0) {
        rc = run_embed(ops, m, g, ids, n_ids, (eng_pooling_t)embed);
        goto out_model;
    }
    if (n_score || logits_out) {
        rc = run_score(ops, m, g, ids, n_ids, n_score, logits_out, tokens_out,
                       prompt ? strlen(prompt) : 0);
        goto out_model;
    }
    uint64_t max_pos = n_ids + (sp.max_tokens ? sp.max_tokens : g->context_length);
    if (max_pos > g->context_length)
        max_pos = g->context_length;
    if (n_ids >= max_pos) {
        fprintf(stderr, "pd-run: prompt (%zu tokens) exceeds the context (%u)\n", n_ids,
                g->context_length);
        goto out_model;
    }
    uint32_t n_blocks = (uint32_t)((max_pos + g->block_tokens - 1) / g->block_tokens);
    void *arena = calloc(n_blocks, g->block_bytes);
    uint32_t *bt = malloc(n_blocks * sizeof(*bt));
    float *logits = malloc((size_t)g->vocab_size * sizeof(float));
    int32_t *gen = malloc((size_t)max_pos * sizeof(*gen)); /* generated ids, for penalties */
    eng_logprobs_t *lps = lp_top >= 0 ? calloc(max_pos, sizeof(*lps)) : NULL;
    eng_sample_scratch_t scr;
    if (!arena || !bt || !logits || !gen || (lp_top >= 0 && !lps) ||
        eng_sample_scratch_create(&scr, g->vocab_size) != PD_OK) {
        fprintf(stderr, "pd-run: out of memory\n");
        free(arena);
        free(bt);
        free(logits);
        free(gen);
        free(lps);
        goto out_model;
    }
    for (uint32_t i = 0; i < n_blocks; i++)
        bt[i] = i;

    eng_detok_t dt;
    eng_stop_t stop;
    if (tok)
        eng_detok_init(&dt, tok, false, false);
    if (eng_stop_init(&stop, stops, n_stops) != PD_OK) {
        fprintf(stderr, "pd-run: bad --stop\n");
        goto out_buf;
    }
    eng_sampler_t smp;
    eng_sampler_init(&smp, &sp);

    uint64_t t0 = pd_now_ns();
    st = ops->prefill(m, arena, bt, n_blocks, ids, (uint32_t)n_ids, 0, logits);
    uint64_t t1 = pd_now_ns();
    if (st != PD_OK) {
        fprintf(stderr, "pd-run: prefill: %s\n", pd_status_str(st));
        goto out_buf;
    }
    uint32_t pos = (uint32_t)n_ids, n_gen = 0;
    const char *finish = "length";
    char piece[ENG_DETOK_OUT_MAX], outb[ENG_DETOK_OUT_MAX + ENG_STOP_MAX_LEN];
    for (;;) {
        eng_sample_hist_t hist = { ids, (uint32_t)n_ids, gen, n_gen };
        int32_t t = eng_sample_next_lp(&smp, logits, g->vocab_size, &scr, &hist,
                                       lp_top >= 0 ? (uint32_t)lp_top : 0,
                                       lps ? &lps[n_gen] : NULL);
        eng_finish_t f = eng_sampler_accept(&smp, t);
        gen[n_gen++] = t;
        /* an EOS ends without text; a stop_token_ids token is output (as vLLM) */
        int is_eos_stop = f == ENG_FINISH_STOP && (!tok || eng_tok_is_eog(tok, t));
        if (tokens_out) {
            printf(n_gen > 1 ? " %d" : "%d", t);
        } else if (tok && !is_eos_stop) {
            size_t np = eng_detok_feed(&dt, t, piece, sizeof(piece));
            size_t no = eng_stop_feed(&stop, piece, np, outb, sizeof(outb));
            fwrite(outb, 1, no, stdout);
            fflush(stdout);
            if (stop.matched >= 0) {
                f = ENG_FINISH_STOP;
            }
        }
        if (f != ENG_FINISH_NONE) {
            finish = eng_finish_name(f);
            break;
        }
        if (pos + 1 >= max_pos) {
            finish = "length";
            break;
        }
        eng_decode_item_t it = { bt, n_blocks, pos, t };
        st = ops->decode(m, arena, &it, 1, logits);
        if (st != PD_OK) {
            fprintf(stderr, "pd-run: decode: %s\n", pd_status_str(st));
            goto out_buf;
        }
        pos++;
    }
    if (!tokens_out && tok && stop.matched < 0) {
        size_t np = eng_detok_finish(&dt, piece, sizeof(piece));
        size_t no = eng_stop_feed(&stop, piece, np, outb, sizeof(outb));
        fwrite(outb, 1, no, stdout);
        no = eng_stop_flush(&stop, outb, sizeof(outb));
        fwrite(outb, 1, no, stdout);
    }
    printf("\n");
    for (uint32_t i = 0; lps != NULL && tokens_out && i < n_gen; i++) {
        printf("#lp %d %.9g", gen[i], (double)lps[i].logprob);
        for (uint32_t k = 0; k < lps[i].n_top; k++)
            printf(" %d:%.9g", lps[i].top_ids[k], (double)lps[i].top_lp[k]);
        printf("\n");
    }
    uint64_t t2 = pd_now_ns();
    fprintf(stderr, "pd-run: prompt %zu tokens, prefill %.1f ms (%.1f tok/s); "
            "generated %u tokens, decode %.1f tok/s; finish_reason=%s\n",
            n_ids, (t1 - t0) / 1e6, n_ids / ((t1 - t0) / 1e9), n_gen,
            n_gen > 1 ? (n_gen - 1) / ((t2 - t1) / 1e9) : 0.0, finish);
    rc = 0;
out_buf:
    eng_sample_scratch_destroy(&scr);
    free(gen);
    free(lps);
    free(arena);
    free(bt);
    free(logits);
out_model:
    ops->destroy(m);
out_ids:
    free(ids);
out_tok:
    eng_tok_destroy(tok);
    return rc;
}
