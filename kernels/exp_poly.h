/* exp_poly.h - e^x in plain float operations, the same bits wherever it runs: the CPU backend's
 * scalar exponential (kernels/cpu/vec_dot.c; its AVX2 kernel, vec_dot_avx2.c exp256, computes the
 * same per lane) and the CUDA grouped attention kernel's (kernels/attn_group.h), whose device pass
 * then gives the host's bits (the device's __expf is approximate). Range reduction by
 * k = round(x log2 e) with ln 2 in two parts, e^r = 1 + r + r^2 P(r) with P of degree 5, and 2^k
 * in two halves so that results down to the subnormals are reached without overflow of either. */
#ifndef KVCHAT_EXP_POLY_H
#define KVCHAT_EXP_POLY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/quant_blocks.h"

QB_HD float xp_bits_float(uint32_t b)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(b);
#else
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
#endif
}

QB_HD float xp_exp(float x)
{
    const float hi = 88.7228317f, lo = -104.0f;
    if (x != x) return x;
    if (x > hi) return INFINITY;
    if (x < lo) return 0.0f;
    const float k = rintf(QB_MUL(x, 1.44269504088896341f));
    float r = fmaf(-k, 0.693359375f, x);
    r = fmaf(-k, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, QB_MUL(r, r), QB_ADD(r, 1.0f));
    const int32_t ki = (int32_t)k, k1 = ki >> 1, k2 = ki - k1;
    return QB_MUL(QB_MUL(p, xp_bits_float((uint32_t)(k1 + 127) << 23)), xp_bits_float((uint32_t)(k2 + 127) << 23));
}

#endif
