/* mass_kernels.h - the eviction policies' attention mass (kernels/backend.h be_mass) as the CUDA
 * backend computes it, one thread's share at a time, in one header for C and CUDA: the CPU backend
 * adds a row's weights by ms_row_sum, and tests/test_attn_mass.c runs every thread of small
 * launches on the host against the CPU backend, bit for bit.
 *
 * Three passes over a block of query rows (row r: query row r / group, head r % group), every KV head
 * of the call in each (a pass's scores and weights: each head's rows of its tokens, the heads one
 * after another):
 * - Scores. A half-warp (MS_LANES lanes) scores one key for MS_ROWS rows at once, so a key is read
 *   once for them: lane l adds, by fused multiply-adds, elements l, l + 16, ... of the key's whole
 *   16-element blocks and then, lanes 0-7, the 8-element block after them; the 16 sums are added
 *   at strides 8, 4, 2 and 1 and lane 0 adds the last D % 8 elements one by one. That is the CPU's
 *   dot (kernels/cpu/vec_dot.c vd_dot_f32_f16: two accumulators of eight lanes, their sum, hsum8,
 *   then the tail), so a score is the CPU's float. Then the page's bias; a key after the query's
 *   position scores -inf.
 * - Weights. A block a row: the largest score (any order gives the same value), each score's
 *   weight e = exp(s - largest) (kernels/exp_poly.h, the CPU backend's vd_exp_f32), and their sum in double as
 *   MS_PARTS partial sums (part u takes weights u, u + MS_PARTS, ... in order), added pairwise at
 *   strides MS_PARTS / 2, ..., 1. The row's factor is (float)(1 / sum), or MS_EMPTY when the row
 *   sees no key.
 * - The sum. A thread a key: acc += e * factor, row after row in order. */
#ifndef KVCHAT_MASS_KERNELS_H
#define KVCHAT_MASS_KERNELS_H

#include <math.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/exp_poly.h"
#include "kernels/quant_blocks.h"

#define MS_LANES 16          /* lanes a key's score takes: the CPU dot's 16 partial sums */
#define MS_ROWS 8            /* query rows a half-warp scores a key for */
#define MS_THREADS 128       /* threads a block of the score pass: 8 half-warps */
#define MS_MAX_D 512         /* head dimensions the score pass holds in shared memory */
#define MS_PARTS 256         /* partial sums of a row's weights: the weight pass's threads */
#define MS_EMPTY (-1.0f)     /* a row's factor when it sees no key (a factor is otherwise >= 0 or NaN) */
#define MS_ADD_THREADS 256

/* The query rows of one pass: rows r0 .. r0 + n of each KV head's (KV head h's row c: query row
 * c / group, query head first_head + h * group + c % group, at q + (c / group) * q_stride + head * D,
 * position q_pos0 + c / group). */
typedef struct ms_rows {
    const float *q;
    int64_t q_stride, q_pos0, r0, n;
    int first_head, group, D;
} ms_rows;

/* KV head h's row r of the pass: its query, and (the same for every head) its position. */
QB_HD const float *ms_query(const ms_rows *q, int h, int64_t r)
{
    const int64_t c = q->r0 + r;
    return q->q + (c / q->group) * q->q_stride + (int64_t)(q->first_head + h * q->group + (int)(c % q->group)) * q->D;
}

QB_HD int64_t ms_q_pos(const ms_rows *q, int64_t r) { return q->q_pos0 + (q->r0 + r) / q->group; }

/* Lane `lane`'s shares of the dots of the MS_ROWS query rows qs + r * D (rows past the pass's
 * end are zeros) with the f16 key row k over D elements, into v: each key element read once for
 * every row. */
QB_HD void ms_lane_parts(const float *qs, const uint16_t *k, int D, int lane, float *v)
{
    QB_UNROLL
    for (int r = 0; r < MS_ROWS; r++) v[r] = 0.0f;
    int i = 0;
    for (; i + MS_LANES <= D; i += MS_LANES) {
        const float kv = qb_half(k[i + lane]);
        QB_UNROLL
        for (int r = 0; r < MS_ROWS; r++) v[r] = fmaf(qs[r * D + i + lane], kv, v[r]);
    }
    if (i + 8 <= D && lane < 8) {
        const float kv = qb_half(k[i + lane]);
        QB_UNROLL
        for (int r = 0; r < MS_ROWS; r++) v[r] = fmaf(qs[r * D + i + lane], kv, v[r]);
    }
}

/* The pairwise additions' strides, in order. */
QB_HD int ms_stride(int step) { return 8 >> step; }
#define MS_TREE_STEPS 4

/* Lane 0's sum after the pairwise additions, with the last D % 8 elements added one by one. */
QB_HD float ms_tail(const float *q, const uint16_t *k, int D, float v)
{
    for (int e = D - D % 8; e < D; e++) v = fmaf(q[e], qb_half(k[e]), v);
    return v;
}

/* The KV head whose share of a list holds entry x: the h < n with off[h] <= x < off[h + 1] (off
 * ascending from 0, x below off[n]; a head with no entries is skipped). Pages by the heads' page
 * offsets, tokens by their token offsets. */
QB_HD int ms_head_of(const int64_t *off, int n, int64_t x)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (off[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* A score from the dot: the page's bias added, -inf where the key is after the query. */
QB_HD float ms_score(float dot, const float *bias, const int32_t *pos, int32_t i, int64_t q_pos)
{
    if ((int64_t)pos[i] > q_pos) return -INFINITY;
    return bias ? QB_ADD(dot, bias[i]) : dot;
}

/* A score's weight in a row whose largest score is mx (a score of -inf weighs 0: e^-inf). */
QB_HD float ms_weight(float s, float mx) { return xp_exp(QB_SUB(s, mx)); }

/* Part u of a row's sum: its weights u, u + MS_PARTS, ... in order. */
QB_HD double ms_part(const float *e, int64_t T, int u)
{
    double acc = 0.0;
    for (int64_t j = u; j < T; j += MS_PARTS) acc += (double)e[j];
    return acc;
}

/* The parts added pairwise (in place; the sum is p[0]). */
QB_HD void ms_parts_step(double *p, int stride, int u)
{
    if (u < stride) p[u] += p[u + stride];
}

/* The row's factor from its largest score and its sum. */
QB_HD float ms_factor(float mx, double sum) { return mx == -INFINITY ? MS_EMPTY : (float)(1.0 / sum); }

/* Key j's mass: what it had, plus each row's weight times that row's factor, rows in order. */
QB_HD float ms_add(float acc, const float *e, int64_t T, int64_t rows, const float *factor, int64_t j)
{
    for (int64_t r = 0; r < rows; r++)
        if (factor[r] != MS_EMPTY) acc = QB_ADD(acc, QB_MUL(e[r * T + j], factor[r]));
    return acc;
}

/* The host's share of a launch: each page's first token within its KV head (first[0 .. hp[H])) and
 * each head's first token in the call (tok0[0 .. H], tok0[H] all); hp as be_mass.head_pages. */
static inline void ms_offsets(const be_kv_page *pages, const int64_t *hp, int H, int64_t *first, int64_t *tok0)
{
    tok0[0] = 0;
    for (int h = 0; h < H; h++) {
        int64_t at = 0;
        for (int64_t i = hp[h]; i < hp[h + 1]; i++) {
            first[i] = at;
            at += pages[i].n;
        }
        tok0[h + 1] = tok0[h] + at;
    }
}

/* The sum of a row's T weights in the weight pass's order, on one host thread (the CPU
 * backend's). */
static inline double ms_row_sum(const float *e, int64_t T)
{
    double p[MS_PARTS] = { 0 };
    for (int64_t j = 0; j < T; j++) p[j % MS_PARTS] += (double)e[j];
    for (int st = MS_PARTS / 2; st >= 1; st /= 2)
        for (int u = 0; u < st; u++) ms_parts_step(p, st, u);
    return p[0];
}

#endif
