/* eng_pool.c - pooling of hidden states into one embedding (engine.h:
 * eng_pool), shared by the engines and tested on its own. Pure. */
#include <math.h>
#include <string.h>

#include "eng.h"

static const char *const eng_pool_names[] = {
    [ENG_POOL_NONE] = "none", [ENG_POOL_MEAN] = "mean", [ENG_POOL_CLS] = "cls",
    [ENG_POOL_LAST] = "last",
};

int eng_pooling_from_name(const char *name)
{
    for (int i = ENG_POOL_MEAN; name && i <= ENG_POOL_LAST; i++)
        if (strcmp(name, eng_pool_names[i]) == 0)
            return i;
    return -1;
}

const char *eng_pooling_name(int pooling)
{
    return pooling >= ENG_POOL_NONE && pooling <= ENG_POOL_LAST ? eng_pool_names[pooling]
                                                                : "unknown";
}

void eng_l2_normalize(float *v, uint32_t n)
{
    double ss = 0.0;
    for (uint32_t i = 0; i < n; i++)
        ss += (double)v[i] * v[i];
    if (ss <= 0.0)
        return;
    double inv = 1.0 / sqrt(ss);
    for (uint32_t i = 0; i < n; i++)
        v[i] = (float)(v[i] * inv);
}

pd_status_t eng_pool(const float *h, uint32_t n_rows, uint32_t n, eng_pooling_t pooling,
                     float *out)
{
    if (!h || !out || n_rows == 0 || n == 0)
        return PD_ERR_BAD_INPUT;
    switch (pooling) {
    case ENG_POOL_CLS:
        memcpy(out, h, (size_t)n * sizeof(float));
        break;
    case ENG_POOL_LAST:
        memcpy(out, h + (size_t)(n_rows - 1) * n, (size_t)n * sizeof(float));
        break;
    case ENG_POOL_MEAN:
        for (uint32_t j = 0; j < n; j++) {
            double s = 0.0;
            for (uint32_t r = 0; r < n_rows; r++)
                s += h[(size_t)r * n + j];
            out[j] = (float)(s / n_rows);
        }
        break;
    default:
        return PD_ERR_BAD_INPUT;
    }
    eng_l2_normalize(out, n);
    return PD_OK;
}
