/* bound_kernels.h - the CUDA backend's bounds (kernels/backend.h, be_bounds), one thread's share,
 * in one header for C and CUDA so that tests/test_bounds.c runs every (block, thread) of a launch
 * on the host and compares the bounds bit for bit with the CPU backend's.
 *
 * Sixteen threads bound one summary: thread `lane` adds, for one query, the terms of dimensions
 * lane, lane + 16, ... below the last whole 16 (bd_lane_sum), as the CPU's vd_bound_f32 adds one
 * lane; the sixteen sums are then added pairwise at strides 8, 4, 2 and 1 (the CPU's two halves,
 * then hsum8's order: on the device by shuffles within the sixteen, on the host by bd_tree_step),
 * the first thread adds the dimensions past the last whole 16 in order (bd_tail), and the group's
 * queries are added in order from 0. A block holds BD_THREADS / 16 summaries of one KV head
 * (blockIdx.y). Where each summary, query and bound lives is said once, here (bd_*_at), for the
 * kernel, the device's lists (kernels/summary_lists.c) and the tests. */
#ifndef KVCHAT_BOUND_KERNELS_H
#define KVCHAT_BOUND_KERNELS_H

#include <float.h>
#include <stdint.h>

#include "common/logit_pick.h"
#include "kernels/quant_blocks.h"

#define BD_LANES 16
#define BD_THREADS 256
#define BD_PER_BLOCK (BD_THREADS / BD_LANES)

/* max(q * lo, q * hi), as the CPU writes it (no fused multiply-add: the max sits between). */
QB_HD float bd_term(float q, float lo, float hi)
{
    float a = q * lo, b = q * hi;
    return a > b ? a : b;
}

/* Lane `lane`'s sum over the whole 16-wide blocks of dimensions, one query. */
QB_HD float bd_lane_sum(const float *q, const float *mn, const float *mx, int64_t dim, int lane)
{
    float s = 0.0f;
    for (int64_t i = lane; i + (BD_LANES - lane) <= dim; i += BD_LANES) s += bd_term(q[i], mn[i], mx[i]);
    return s;
}

/* One step of the lanes' pairwise sum: lane l < stride adds lane l + stride (strides 8, 4, 2, 1). */
QB_HD void bd_tree_step(float *v, int stride, int lane)
{
    if (lane < stride) v[lane] += v[lane + stride];
}

/* The dimensions past the last whole 16, added in order to the lanes' sum r. */
QB_HD float bd_tail(const float *q, const float *mn, const float *mx, int64_t dim, float r)
{
    for (int64_t i = dim & ~(int64_t)(BD_LANES - 1); i < dim; i++) r += bd_term(q[i], mn[i], mx[i]);
    return r;
}

/* Summary i of a block (blockIdx.x) and its lane, for thread tid. */
QB_HD int64_t bd_entry(int64_t block, int tid) { return block * BD_PER_BLOCK + tid / BD_LANES; }

/* Floats from a list's start to head h's summary i (its minimum; the maximum dim floats on): each
 * head a region of cap summaries. */
QB_HD int64_t bd_summary_at(int h, int64_t cap, int64_t i, int64_t dim) { return ((int64_t)h * cap + i) * 2 * dim; }

/* Floats from the queries' start to query j of head h's group ([n_head_kv][group][dim]). */
QB_HD int64_t bd_query_at(int h, int group, int j, int64_t dim) { return ((int64_t)h * group + j) * dim; }

/* Where head h's bound i goes: a row of stride bounds a head. */
QB_HD int64_t bd_out_at(int h, int64_t stride, int64_t i) { return (int64_t)h * stride + i; }

/* A summary computed where its rows are (be_summary.k or .runs): entry `at` of a list (its minimum
 * at bd_summary_at's floats, at * 2 * dim from the list's start, its count at len[at]) from rows of
 * the device's copies of pages (dim halves a row, one after another), one record a run of rows: a
 * fold's first record has runs (>= 1: its records, itself and those right after it) and len (the
 * entry's count); the others 0 in both. */
typedef struct bd_fold {
    const uint16_t *k;   /* the run's first row */
    int32_t at, n;       /* the entry; the run's rows */
    int32_t runs, len;
} bd_fold;

#define BD_FOLD_THREADS 128   /* a block a record, the fold's first: element i to thread i % BD_FOLD_THREADS */

/* Element i of the fold whose first record is f (nothing for a record after a fold's first): its
 * runs' values in order, each kept where it is below the minimum (above the maximum) so far, from
 * FLT_MAX (-FLT_MAX): the cache's fold (vd_key_summary), so NaN is never kept and of equal values
 * (zeros of either sign) the first stays, the host's bits. */
QB_HD void bd_fold_elem(const bd_fold *f, int64_t dim, int64_t i, float *sums, int64_t *len)
{
    if (f->runs < 1) return;
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int32_t j = 0; j < f->runs; j++)
        for (int32_t r = 0; r < f[j].n; r++) {
            float t = qb_half(f[j].k[(int64_t)r * dim + i]);
            lo = t < lo ? t : lo;
            hi = t > hi ? t : hi;
        }
    float *mn = sums + (int64_t)f->at * 2 * dim;
    mn[i] = lo;
    mn[dim + i] = hi;
    if (i == 0) len[f->at] = f->len;
}

/* Summary i's place among a head's for the k best, bound u: the pick's key (lp_key's order of the
 * value, NaN as -inf), 0 (never chosen) for -inf. */
QB_HD uint64_t bd_best_key(float u, int64_t i)
{
    const float v = lp_value(u);
    return v > -INFINITY ? lp_key(v, (int32_t)i) : 0;
}

/* Where a head's k best keys (the pick's order: larger first; 0 past the last chosen) go as
 * ascending page indices, for the one thread a key of the kernel that leaves them on the device
 * (be_bounds.best bound): key i's rank among the chosen by index, -1 for an empty slot. */
QB_HD int32_t bd_rank(const uint64_t *keys, int32_t k, int32_t i)
{
    if (keys[i] == 0) return -1;
    int32_t id = lp_key_id(keys[i]), r = 0;
    for (int32_t j = 0; j < k; j++) r += keys[j] != 0 && lp_key_id(keys[j]) < id;
    return r;
}

#endif
