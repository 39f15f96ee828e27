/* weight_f16.h - a weight's rows as f16, converted on the host's threads: what a device backend
 * uploads for its f16 products.
 *
 * The rows are dequantized by the reference dequantizers of engine/quant.c (the oracle the CPU
 * kernels are tested against) and rounded to f16 to nearest even; values beyond f16's range (BF16 or
 * F32 weights) saturate at +-65504 rather than becoming infinite. Loading an 8B-parameter model this
 * way takes about 40 s on one core, hence the pool. */
#ifndef KVCHAT_WEIGHT_F16_H
#define KVCHAT_WEIGHT_F16_H

#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cpu/threadpool.h"

/* Rows [r0, r1) of w into out[(r1 - r0) * w->n_in], split over pool (NULL: on this thread).
 * 0, or -1 when out of memory. */
int wf16_rows(tp_pool *pool, const be_weight *w, int64_t r0, int64_t r1, uint16_t *out);

#endif
