/* pb_stats.c - see pb_stats.h. */
#include "pb_stats.h"
#include "pd_config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void pb_rng_seed(pb_rng_t *rng, uint64_t seed)
{
    rng->s = seed ^ 0x9e3779b97f4a7c15ULL;
}

uint64_t pb_rng_next(pb_rng_t *rng)
{
    uint64_t z = (rng->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double pb_rng_uniform(pb_rng_t *rng)
{
    return (double)(pb_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

double pb_rng_exp(pb_rng_t *rng, double rate)
{
    /* 1 - u is in (0, 1], so the log is finite. */
    return -log(1.0 - pb_rng_uniform(rng)) / rate;
}

static pd_status_t parse_u32(const char *s, const char **end_p, uint32_t *v_p)
{
    char *end;
    unsigned long long v;

    if (*s < '0' || *s > '9')
        return PD_ERR_BAD_INPUT;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || v == 0 || v > PB_LEN_MAX)
        return PD_ERR_BAD_INPUT;
    *v_p = (uint32_t)v;
    *end_p = end;
    return PD_OK;
}

pd_status_t pb_dist_parse(const char *text, pb_dist_t *dist_p)
{
    pb_dist_t d = { PB_DIST_FIXED, 0, 0 };
    const char *p;

    if (text == NULL)
        return PD_ERR_BAD_INPUT;
    if (strncmp(text, "fixed:", 6) == 0) {
        p = text + 6;
    } else if (strncmp(text, "uniform:", 8) == 0) {
        d.kind = PB_DIST_UNIFORM;
        p = text + 8;
    } else {
        p = text;
    }
    if (parse_u32(p, &p, &d.a) != PD_OK)
        return PD_ERR_BAD_INPUT;
    if (d.kind == PB_DIST_UNIFORM) {
        if (*p != ':' || parse_u32(p + 1, &p, &d.b) != PD_OK || d.a > d.b)
            return PD_ERR_BAD_INPUT;
    } else {
        d.b = d.a;
    }
    if (*p != '\0')
        return PD_ERR_BAD_INPUT;
    *dist_p = d;
    return PD_OK;
}

uint32_t pb_dist_sample(const pb_dist_t *dist, pb_rng_t *rng)
{
    uint64_t span;

    if (dist->kind == PB_DIST_FIXED)
        return dist->a;
    span = (uint64_t)dist->b - dist->a + 1;
    return dist->a + (uint32_t)(pb_rng_next(rng) % span);
}

static pd_status_t parse_slo_value(const char *v, uint64_t *ns_p)
{
    char *end;
    double ms;

    /* Bare number: milliseconds (vllm's --goodput convention). */
    errno = 0;
    ms = strtod(v, &end);
    if (end != v && *end == '\0') {
        if (errno != 0 || !(ms >= 0) || ms > 1e9)
            return PD_ERR_BAD_INPUT;
        *ns_p = (uint64_t)(ms * 1e6 + 0.5);
        return PD_OK;
    }
    return pd_parse_duration(v, ns_p);
}

pd_status_t pb_slo_parse(const char *text, pb_slo_t *slo_p)
{
    pb_slo_t slo;
    char buf[256];
    char *save = NULL, *tok;

    memset(&slo, 0, sizeof(slo));
    if (text == NULL || *text == '\0') {
        *slo_p = slo;
        return PD_OK;
    }
    if (strlen(text) >= sizeof(buf))
        return PD_ERR_BAD_INPUT;
    strcpy(buf, text);
    for (tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        bool *has;
        uint64_t *ns;

        if (eq == NULL)
            return PD_ERR_BAD_INPUT;
        *eq = '\0';
        if (strcmp(tok, "ttft") == 0) {
            has = &slo.has_ttft; ns = &slo.ttft_ns;
        } else if (strcmp(tok, "tpot") == 0) {
            has = &slo.has_tpot; ns = &slo.tpot_ns;
        } else if (strcmp(tok, "e2el") == 0 || strcmp(tok, "e2e") == 0) {
            has = &slo.has_e2el; ns = &slo.e2el_ns;
        } else {
            return PD_ERR_BAD_INPUT;
        }
        if (*has || parse_slo_value(eq + 1, ns) != PD_OK)
            return PD_ERR_BAD_INPUT;
        *has = true;
    }
    *slo_p = slo;
    return PD_OK;
}

bool pb_slo_any(const pb_slo_t *slo)
{
    return slo->has_ttft || slo->has_tpot || slo->has_e2el;
}

const char *pb_err_kind_name(pb_err_kind_t kind)
{
    static const char *const names[] = {
#define PB_ERR_NAME(name, str) str,
        PB_ERR_KINDS(PB_ERR_NAME)
#undef PB_ERR_NAME
    };
    if ((unsigned)kind >= PB_ERR_COUNT)
        return "unknown";
    return names[kind];
}

double pb_record_tpot_ns(const pb_record_t *rec)
{
    if (rec->output_tokens <= 1 || rec->content_chunks == 0 ||
        rec->e2el_ns < rec->ttft_ns)
        return 0.0;
    return (double)(rec->e2el_ns - rec->ttft_ns) /
           (double)(rec->output_tokens - 1);
}

bool pb_slo_met(const pb_slo_t *slo, const pb_record_t *rec)
{
    if (!rec->success)
        return false;
    if (slo->has_ttft && rec->ttft_ns > slo->ttft_ns)
        return false;
    if (slo->has_tpot && pb_record_tpot_ns(rec) > (double)slo->tpot_ns)
        return false;
    if (slo->has_e2el && rec->e2el_ns > slo->e2el_ns)
        return false;
    return true;
}

double pb_percentile(const double *sorted, size_t n, double q)
{
    double pos, frac;
    size_t lo;

    if (n == 0)
        return 0.0;
    if (q <= 0)
        return sorted[0];
    if (q >= 100)
        return sorted[n - 1];
    pos = q / 100.0 * (double)(n - 1);
    lo = (size_t)pos;
    frac = pos - (double)lo;
    if (lo + 1 >= n)
        return sorted[n - 1];
    return sorted[lo] + (sorted[lo + 1] - sorted[lo]) * frac;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void pb_summary(double *values, size_t n, pb_summary_t *sum)
{
    double total = 0, var = 0;
    size_t i;

    memset(sum, 0, sizeof(*sum));
    if (n == 0)
        return;
    qsort(values, n, sizeof(*values), cmp_double);
    for (i = 0; i < n; i++)
        total += values[i];
    sum->n = n;
    sum->mean = total / (double)n;
    for (i = 0; i < n; i++)
        var += (values[i] - sum->mean) * (values[i] - sum->mean);
    /* Population std, as numpy's np.std (vllm reports that). */
    sum->std = sqrt(var / (double)n);
    sum->min = values[0];
    sum->max = values[n - 1];
    sum->p50 = sum->median = pb_percentile(values, n, 50);
    sum->p90 = pb_percentile(values, n, 90);
    sum->p99 = pb_percentile(values, n, 99);
}

pd_status_t pb_aggregate(const pb_record_t *recs, size_t n,
                         const pb_slo_t *slo, uint64_t duration_ns,
                         pb_aggregate_t *agg)
{
    double *ttft = NULL, *tpot = NULL, *e2el = NULL, *itl = NULL;
    size_t n_ok = 0, n_ttft = 0, n_tpot = 0, n_itl = 0, total_itl = 0, i, j;
    pd_status_t status = PD_ERR_NO_MEMORY;

    memset(agg, 0, sizeof(*agg));
    agg->num_requests = (uint32_t)n;
    agg->duration_s = (double)duration_ns / 1e9;
    for (i = 0; i < n; i++)
        if (recs[i].success)
            total_itl += recs[i].n_itl;
    /* +1: malloc(0) may return NULL. */
    ttft = malloc((n + 1) * sizeof(*ttft));
    tpot = malloc((n + 1) * sizeof(*tpot));
    e2el = malloc((n + 1) * sizeof(*e2el));
    itl = malloc((total_itl + 1) * sizeof(*itl));
    if (ttft == NULL || tpot == NULL || e2el == NULL || itl == NULL)
        goto out;

    for (i = 0; i < n; i++) {
        const pb_record_t *r = &recs[i];

        agg->errors[r->err < PB_ERR_COUNT ? r->err : PB_ERR_PROTOCOL]++;
        if (r->reconnected)
            agg->reconnects++;
        if (!r->success) {
            agg->failed++;
            continue;
        }
        agg->completed++;
        if (pb_slo_met(slo, r))
            agg->good++;
        agg->total_input_tokens += r->input_tokens;
        agg->total_output_tokens += r->output_tokens;
        if (r->cached_seen) {
            agg->cached_reported++;
            agg->total_cached_tokens += r->cached_tokens;
        }
        /* A stream with no content chunk has no TTFT (not a zero one). */
        if (r->content_chunks > 0)
            ttft[n_ttft++] = (double)r->ttft_ns / 1e6;
        e2el[n_ok] = (double)r->e2el_ns / 1e6;
        n_ok++;
        if (r->output_tokens > 1 && r->content_chunks > 0)
            tpot[n_tpot++] = pb_record_tpot_ns(r) / 1e6;
        for (j = 0; j < r->n_itl && r->itl_ns != NULL; j++)
            itl[n_itl++] = (double)r->itl_ns[j] / 1e6;
    }
    if (agg->duration_s > 0) {
        agg->request_throughput = agg->completed / agg->duration_s;
        agg->request_goodput = agg->good / agg->duration_s;
        agg->output_throughput = (double)agg->total_output_tokens / agg->duration_s;
        agg->total_token_throughput =
            (double)(agg->total_input_tokens + agg->total_output_tokens) /
            agg->duration_s;
    }
    pb_summary(ttft, n_ttft, &agg->ttft_ms);
    pb_summary(tpot, n_tpot, &agg->tpot_ms);
    pb_summary(e2el, n_ok, &agg->e2el_ms);
    pb_summary(itl, n_itl, &agg->itl_ms);
    status = PD_OK;
out:
    free(ttft);
    free(tpot);
    free(e2el);
    free(itl);
    return status;
}
