/* ep_workload.h - the workload the expert-parallel tests run on every rank
 * and on the whole model (tests/engine/llama/test_ep.c over threads,
 * tests/kvxfer/test_ep_ucx.c over processes): per sequence g a prompt of
 * ep_wl_prompt_len(g) tokens, then EP_WL_D batched greedy decode steps;
 * sequences >= idle_g0 sit out step EP_WL_IDLE_STEP (ep_idle when a rank
 * has none left). Logits go to out[(g * (1 + EP_WL_D) + step) * vocab]. */
#ifndef PD_TEST_EP_WORKLOAD_H
#define PD_TEST_EP_WORKLOAD_H
#include <stdint.h>

#include "eng.h"

#define EP_WL_D 4          /* decode steps */
#define EP_WL_NB 8         /* blocks per sequence (16 tokens each) */
#define EP_WL_IDLE_STEP 2  /* the last rank idles this step */

uint32_t ep_wl_prompt_len(uint32_t g);
void ep_wl_prompt(uint32_t g, int32_t *t, uint32_t vocab);
int32_t ep_wl_argmax(const float *l, uint32_t n);
pd_status_t ep_wl_run(const eng_ops_t *ops, eng_model_t *m, uint32_t g0, uint32_t ng,
                      uint32_t vocab, float *out, uint32_t idle_g0);
#endif
