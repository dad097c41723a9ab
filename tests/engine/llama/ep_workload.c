/* ep_workload.c - see ep_workload.h */
#include <stdlib.h>
#include <string.h>

#include "ep_workload.h"

uint32_t ep_wl_prompt_len(uint32_t g) { return 9 + 7 * g; }

void ep_wl_prompt(uint32_t g, int32_t *t, uint32_t vocab)
{
    for (uint32_t i = 0; i < ep_wl_prompt_len(g); i++)
        t[i] = (int32_t)((i * 2654435761u + g * 40503u + 7) % vocab);
}

int32_t ep_wl_argmax(const float *l, uint32_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return (int32_t)b;
}

pd_status_t ep_wl_run(const eng_ops_t *ops, eng_model_t *m, uint32_t g0, uint32_t ng, uint32_t vocab,
                      float *out, uint32_t idle_g0)
{
    void *arena = calloc((size_t)ng * EP_WL_NB, ops->geometry(m)->block_bytes);
    uint32_t bt[64][EP_WL_NB], pos[64];
    int32_t tok[64];
    eng_decode_item_t it[64];
    float *lg = malloc((size_t)ng * vocab * sizeof(float));
    pd_status_t st = PD_OK;
    for (uint32_t j = 0; j < ng; j++)
        for (uint32_t b = 0; b < EP_WL_NB; b++)
            bt[j][b] = j * EP_WL_NB + b;
    for (uint32_t j = 0; j < ng && st == PD_OK; j++) {
        uint32_t g = g0 + j;
        int32_t p[64];
        ep_wl_prompt(g, p, vocab);
        float *o = out + ((size_t)g * (1 + EP_WL_D)) * vocab;
        st = ops->prefill(m, arena, bt[j], EP_WL_NB, p, ep_wl_prompt_len(g), 0, o);
        pos[j] = ep_wl_prompt_len(g);
        tok[j] = ep_wl_argmax(o, vocab);
    }
    for (uint32_t d = 0; d < EP_WL_D && st == PD_OK; d++) {
        uint32_t n = 0, map[64];
        for (uint32_t j = 0; j < ng; j++) {
            if (d == EP_WL_IDLE_STEP && g0 + j >= idle_g0)
                continue;
            it[n] = (eng_decode_item_t){ bt[j], EP_WL_NB, pos[j], tok[j] };
            map[n++] = j;
        }
        if (n == 0) {
            st = ops->ep_idle(m);
            continue;
        }
        st = ops->decode(m, arena, it, n, lg);
        for (uint32_t i = 0; i < n && st == PD_OK; i++) {
            uint32_t j = map[i];
            float *o = out + ((size_t)(g0 + j) * (1 + EP_WL_D) + 1 + d) * vocab;
            memcpy(o, lg + (size_t)i * vocab, vocab * sizeof(float));
            tok[j] = ep_wl_argmax(o, vocab);
            pos[j]++;
        }
    }
    free(lg);
    free(arena);
    return st;
}
