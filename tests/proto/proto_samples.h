/* proto_samples.h - sample messages of every type for tests, the corpus
 * generator and benchmarks. Variants:
 *   PS_MIN  0 items, empty optional strings, zero numbers
 *   PS_MID  a few items, typical values
 *   PS_MAX  every count/string/blob at its cap, extreme numbers
 * Arrays point into static storage owned by this module (valid forever). */
#ifndef PROTO_SAMPLES_H
#define PROTO_SAMPLES_H

#include "proto_msg.h"

enum { PS_MIN = 0, PS_MID = 1, PS_MAX = 2, PS_VARIANTS = 3 };

/* Wire codes of every type, in list order. */
extern const uint16_t ps_types[PROTO_MSG_COUNT];

/* Fill *m with variant `variant` of `type` (m->hdr.tag/flags set too). */
void ps_make(uint16_t type, int variant, proto_msg_t *m);

/* Field-by-field equality (views compared by content). */
int ps_equal(const proto_msg_t *a, const proto_msg_t *b);

#endif
