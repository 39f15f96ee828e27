/* fused_kernels.h - the CUDA backend's fused element-wise ops (kernels/backend.h: qk_rope, add_norm),
 * one thread's share, in one header for C and CUDA so that tests/test_fused_kernels.c runs every
 * thread of small launches on the host and compares them with the CPU backend.
 *
 * qk_rope: a block a token (FK_QK_THREADS threads). Thread 0 builds the angles as the CPU does (a
 * running product, so the same floats), every thread then takes sines and cosines of its share;
 * warp w takes the token's head rows w, w + FK_QK_WARPS, ... (q's heads, then k's): with a norm,
 * lane l sums the squares of elements l, l + 32, ... in double and the warp adds the 32 sums by
 * xor shuffles; lane l then rotates the pairs l, l + 32, ..., each pair normalized first and
 * scaled after. head_dim is even (be_qk).
 *
 * add_norm: a block a row (FK_AN_THREADS threads); thread t owns elements t, t + FK_AN_THREADS, ...
 * and sums their squares in double; a block's sum is each warp's by xor shuffles, then the warps'
 * in order (as rmsnorm_kernel). With post, o's row is normalized first (its sum), then each thread
 * adds its elements into x and sums their squares for the norm into h. */
#ifndef KVCHAT_FUSED_KERNELS_H
#define KVCHAT_FUSED_KERNELS_H

#include <math.h>
#include <stdint.h>

#include "kernels/quant_blocks.h"

#define FK_QK_THREADS 128
#define FK_QK_WARPS (FK_QK_THREADS / 32)
#define FK_AN_THREADS 256

/* The sum of squares of x[first], x[first + step], ... below n, in double. */
QB_HD double fk_sumsq(const float *x, int64_t n, int64_t first, int64_t step)
{
    double s = 0;
    for (int64_t i = first; i < n; i += step) s += (double)x[i] * x[i];
    return s;
}

/* RMSNorm's factor from the sum of squares of n values, as the CPU backend computes it. */
QB_HD float fk_norm_factor(double ss, int64_t n, float eps)
{
    return 1.0f / sqrtf((float)(ss / (double)n) + eps);
}

/* The angles of a token at pos_scaled = pos * freq_scale: theta_i = pos_scaled * theta_scale^i, by
 * the running product the CPU backend uses. */
QB_HD void fk_angles(float pos_scaled, float theta_scale, int half, float *th)
{
    float theta = pos_scaled;
    for (int i = 0; i < half; i++) {
        th[i] = theta;
        theta *= theta_scale;
    }
}

/* The xor-shuffle rounds of a warp's sum: in round r each lane adds the value of the lane whose
 * index differs in bit 4 - r (offsets 16, 8, 4, 2, 1), the device by shuffles, the host by
 * fk_warp_sum_host. */
#define FK_XOR_ROUNDS 5
QB_HD int fk_xor_offset(int r) { return 16 >> r; }

/* Head row j of token t (q's n_head heads, then k's n_head_kv), its norm weight and its scale. */
QB_HD float *fk_qk_row(float *q, float *k, int64_t t, int j, int n_head, int n_head_kv, int head_dim,
                       const float *q_norm, const float *k_norm, float q_scale, const float **w, float *s)
{
    if (j < n_head) {
        *w = q_norm;
        *s = q_scale;
        return q + (t * n_head + j) * (int64_t)head_dim;
    }
    *w = k_norm;
    *s = 1.0f;
    return k + (t * n_head_kv + (j - n_head)) * (int64_t)head_dim;
}

/* Pair i of row v: normalized by factor f with weights w (w given), rotated by the angle whose
 * cosine and sine are c and sn, scaled by s (1: not at all), as rmsnorm, rope and scale would. */
QB_HD void fk_rope_pair(float *v, int i, int half, int neox, const float *w, float f, float c, float sn, float s)
{
    int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    float x0 = v[i0], x1 = v[i1];
    if (w) {
        x0 = x0 * f * w[i0];
        x1 = x1 * f * w[i1];
    }
    float y0 = x0 * c - x1 * sn, y1 = x0 * sn + x1 * c;
    if (s != 1.0f) {
        y0 *= s;
        y1 *= s;
    }
    v[i0] = y0;
    v[i1] = y1;
}

/* qk_rope's thread `thread` of a block: its warp takes head rows fk_qk_first_row(thread),
 * + FK_QK_WARPS, ... below the token's rows; its lane sums the squares of its elements of a row
 * (fk_qk_lane_sumsq), and once the warp's factor is known rotates its pairs (fk_qk_lane_pairs). */
QB_HD int fk_qk_first_row(unsigned thread) { return (int)(thread >> 5); }
QB_HD double fk_qk_lane_sumsq(const float *v, int head_dim, unsigned thread)
{
    return fk_sumsq(v, head_dim, thread & 31, 32);
}
QB_HD void fk_qk_lane_pairs(float *v, int head_dim, unsigned thread, int neox, const float *w, float f, const float *cs,
                            const float *sn, float s)
{
    int half = head_dim / 2;
    for (int i = (int)(thread & 31); i < half; i += 32) fk_rope_pair(v, i, half, neox, w, f, cs[i], sn[i], s);
}

/* add_norm's thread `thread` of a row's block: the squares of its elements of o (for post's norm),
 * its elements of o normalized (post given, factor f; written back) and added into x, returning
 * the squares of its new x values (0 without w: nothing needs them), then its elements of h. */
QB_HD double fk_an_thread_sumsq(const float *o, int64_t dim, unsigned thread)
{
    return fk_sumsq(o, dim, thread, FK_AN_THREADS);
}
QB_HD double fk_an_thread_add(float *x, float *o, const float *post, float f, int with_w, int64_t dim, unsigned thread)
{
    double ss = 0;
    for (int64_t i = thread; i < dim; i += FK_AN_THREADS) {
        float ov = o[i];
        if (post) {
            ov = ov * f * post[i];
            o[i] = ov;
        }
        float xv = x[i] + ov;
        x[i] = xv;
        if (with_w) ss += (double)xv * xv;
    }
    return ss;
}
QB_HD void fk_an_thread_norm(const float *x, const float *w, float g, float *h, int64_t dim, unsigned thread)
{
    for (int64_t i = thread; i < dim; i += FK_AN_THREADS) h[i] = x[i] * g * w[i];
}

/* On the host: a warp's xor-shuffle sum of its 32 lanes' values (the rounds of fk_xor_offset);
 * every lane ends with the same sum. */
static inline double fk_warp_sum_host(const double *lane)
{
    double v[32], n[32];
    for (int l = 0; l < 32; l++) v[l] = lane[l];
    for (int r = 0; r < FK_XOR_ROUNDS; r++) {
        for (int l = 0; l < 32; l++) n[l] = v[l] + v[l ^ fk_xor_offset(r)];
        for (int l = 0; l < 32; l++) v[l] = n[l];
    }
    return v[0];
}

/* On the host: a block's sum of its threads' values, each warp's by fk_warp_sum_host, then the
 * warps' in order from 0. */
static inline double fk_block_sum_host(const double *thread, int n_threads)
{
    double tot = 0;
    for (int w = 0; w < n_threads / 32; w++) tot += fk_warp_sum_host(thread + 32 * w);
    return tot;
}

#endif
