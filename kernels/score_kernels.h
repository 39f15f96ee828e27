/* score_kernels.h - the CUDA backend's scores (kernels/backend.h, be_ops.scores: CHESS's summaries
 * against its anchor), one thread's share, in one header for C and CUDA so that tests/test_bounds.c
 * runs every thread of a row on the host and compares the scores bit for bit with the CPU's.
 *
 * A warp scores one row as the CPU's vd_dot_f32 does with its 32 lanes (four accumulators of
 * eight): lane l adds, by fused multiply-adds, elements l, l + 32, ... of the whole 32-element
 * blocks; lanes 0-7 then add the whole 8-element blocks after them, lanes 8-15 the last n % 8 (a
 * lane past the end adds 0, as the CPU's masked step does), and the 32 partial sums are added
 * pairwise at strides 8, 16, 4, 2 and 1 (the CPU's (s0 + s1) + (s2 + s3), then hsum8's order: on
 * the device by shuffles, on the host by sc_tree_step). */
#ifndef KVCHAT_SCORE_KERNELS_H
#define KVCHAT_SCORE_KERNELS_H

#include <math.h>
#include <stdint.h>

#include "kernels/quant_blocks.h"

#define SC_LANES 32
#define SC_THREADS 256
#define SC_ROWS_PER_BLOCK (SC_THREADS / SC_LANES)
#define SC_N_STRIDES 5

/* The strides of the partial sums' pairwise additions, in order. */
QB_HD int sc_stride(int k)
{
    return k == 0 ? 8 : k == 1 ? 16 : 4 >> (k - 2);
}

/* Lane `lane`'s partial sum of the dot product of row m and x over n elements. */
QB_HD float sc_lane_sum(const float *m, const float *x, int64_t n, int lane)
{
    float acc = 0.0f;
    int64_t i = 0;
    for (; i + SC_LANES <= n; i += SC_LANES) acc = fmaf(m[i + lane], x[i + lane], acc);
    int64_t i8 = i + (n - i) / 8 * 8;   /* past the whole 8-element blocks */
    if (lane < 8) {
        for (; i < i8; i += 8) acc = fmaf(m[i + lane], x[i + lane], acc);
    } else if (lane < 16 && i8 < n) {
        int64_t e = i8 + (lane - 8);
        acc = e < n ? fmaf(m[e], x[e], acc) : acc + 0.0f;
    }
    return acc;
}

/* One pairwise step on the host: lane l adds lane l + stride (a lane past the last keeps its sum,
 * as a shuffle past the warp returns the caller's own value; only lane 0's result is used). */
static inline void sc_tree_step(float *v, int stride)
{
    for (int l = 0; l + stride < SC_LANES; l++) v[l] = v[l] + v[l + stride];
}

/* Where row r of a launch is scored: block r / SC_ROWS_PER_BLOCK, its warp r % SC_ROWS_PER_BLOCK. */
QB_HD int64_t sc_row(unsigned block, unsigned thread)
{
    return (int64_t)block * SC_ROWS_PER_BLOCK + thread / SC_LANES;
}

#endif
