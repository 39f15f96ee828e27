/* logit_pick.h - the arithmetic of choosing a token, in one header for the sampler, the CPU
 * backend and the CUDA kernels.
 *
 * A token's value is its logit after the final soft cap, NaN read as -inf, and then, for the
 * tokens of the repetition window, the penalty. Candidates are ordered by value, larger first, and
 * among equal values by id, lower first; lp_key packs that order into one 64-bit integer, larger
 * first, so "the k best" is the same set whoever computes it (a quickselect on the host, a sort of
 * keys on the device). The entropy terms are the sampler's, so a backend that sums them in the
 * sampler's order gets its figures bit for bit. LP_HD makes every function __host__ __device__
 * under nvcc and static inline in C. */
#ifndef KVCHAT_LOGIT_PICK_H
#define KVCHAT_LOGIT_PICK_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define LP_HD static __host__ __device__ inline
#else
#define LP_HD static inline
#endif

/* The model's final soft cap of one logit (cap > 0). */
LP_HD float lp_cap(float logit, float cap) { return cap * tanhf(logit / cap); }

/* A logit as the sampler reads it: NaN as -inf. */
LP_HD float lp_value(float logit) { return logit != logit ? -INFINITY : logit; }

/* The repetition penalty: a positive value divided by it, any other multiplied. */
LP_HD float lp_penalize(float v, float penalty) { return v > 0.0f ? v / penalty : v * penalty; }

/* The order of candidates as one integer, larger first: the value's bits made monotonic (-0 read as
 * +0, so that equal values tie) above the id inverted (lower ids first among equal values). Never 0
 * for a value that is not NaN, so 0 can mark "no candidate". */
LP_HD uint64_t lp_key(float v, int32_t id)
{
    if (v == 0.0f) v = 0.0f;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << 32) | (uint32_t)(0xFFFFFFFFu - (uint32_t)id);
}

LP_HD float lp_key_value(uint64_t key)
{
    uint32_t u = (uint32_t)(key >> 32);
    u = (u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

LP_HD int32_t lp_key_id(uint64_t key) { return (int32_t)(0xFFFFFFFFu - (uint32_t)key); }

/* The entropy sums of softmax(value / temp) relative to the largest value mx (finite), one term at a
 * time: with a = (v - mx) / temp and w = e^a, acc[0] += w, acc[1] += w a, acc[2] += w a^2. Terms below
 * float's range (a <= -88), -inf and NaN add nothing. inv is 1 / temp. */
LP_HD void lp_entropy_term(double acc[3], float v, float mx, float inv)
{
    float a = (v - mx) * inv;
    if (!(a > -88.0f)) return;
    double w = expf(a);
    acc[0] += w;
    acc[1] += w * a;
    acc[2] += w * (double)a * a;
}

/* Entropy H = ln Z - S1/Z and varentropy S2/Z - (S1/Z)^2 from the sums (each at least 0). */
LP_HD void lp_entropy_finish(const double acc[3], double *entropy, double *varentropy)
{
    double m1 = acc[1] / acc[0], h = log(acc[0]) - m1, v = acc[2] / acc[0] - m1 * m1;
    *entropy = h > 0 ? h : 0;
    *varentropy = v > 0 ? v : 0;
}

/* The entropy and varentropy of softmax(l / temp) over a row whose largest value is mx (temp <= 0:
 * 1), its terms summed one after another: 0 when mx is not finite (nothing, or +inf: all the mass
 * on the top). */
static inline void lp_row_entropy(const float *l, int64_t n, float mx, float temp, double *entropy, double *varentropy)
{
    *entropy = *varentropy = 0;
    if (!(mx > -INFINITY) || !isfinite(mx)) return;
    const float inv = 1.0f / (temp > 0 ? temp : 1.0f);
    double acc[3] = { 0, 0, 0 };
    for (int64_t i = 0; i < n; i++) lp_entropy_term(acc, l[i], mx, inv);
    lp_entropy_finish(acc, entropy, varentropy);
}

#endif
