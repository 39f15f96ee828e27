/* quant_blocks.h - weight blocks decoded 32 values at a time, in one header for C and CUDA.
 *
 * The CUDA backend multiplies Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, F16 and BF16 weights as the file
 * stores them: its kernels decode each group of 32 values with these functions (QB_HD makes them
 * __host__ __device__ under nvcc and static inline in C), so the exact code the GPU runs is tested
 * on the host against common/quant.c's reference dequantizer (tests/test_quant_blocks.c). The
 * products round each value exactly as the reference does (on the device through __fmul_rn and
 * __fsub_rn, which nvcc never fuses), so a decoded value is the reference's bit for bit.
 *
 * Also here: the geometry the decode-product kernel and its host simulation share (a row is read
 * in chunks of QB_CHUNK values; the activations of a chunk sit in shared memory with 4 floats of
 * padding after every 32, so the lanes' 16-byte reads fall in different banks), and qb_lane_dot,
 * one lane's share of a chunk. */
#ifndef KVCHAT_QUANT_BLOCKS_H
#define KVCHAT_QUANT_BLOCKS_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "common/quant.h"
#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

#ifdef __CUDACC__
#define QB_HD static __host__ __device__ inline
#else
#define QB_HD static inline
#endif
#ifdef __CUDA_ARCH__   /* the device pass only: the host compiler does not know the pragma */
#define QB_UNROLL _Pragma("unroll")
#else
#define QB_UNROLL
#endif

/* Float operations the device rounds one at a time, never fused (the host build does not fuse:
 * -ffp-contract=off), so device and host give the same bits. */
#ifdef __CUDA_ARCH__
#define QB_MUL(a, b) __fmul_rn((a), (b))
#define QB_SUB(a, b) __fsub_rn((a), (b))
#define QB_ADD(a, b) __fadd_rn((a), (b))
#define QB_DIV(a, b) __fdiv_rn((a), (b))
#else
#define QB_MUL(a, b) ((a) * (b))
#define QB_SUB(a, b) ((a) - (b))
#define QB_ADD(a, b) ((a) + (b))
#define QB_DIV(a, b) ((a) / (b))
#endif

#define QB_CHUNK 2048      /* values of a row one pass of the decode product reads */
#define QB_XSTRIDE 36      /* floats a group of 32 activations takes in shared memory */
#define QB_MAX_TOK 8       /* tokens the decode product multiplies at once */

/* 16 bytes (16-byte aligned) as four words: one vector load on the device. */
QB_HD void qb_load16(const void *p, uint32_t *u)
{
#ifdef __CUDA_ARCH__
    const uint4 v = *(const uint4 *)p;
    u[0] = v.x;
    u[1] = v.y;
    u[2] = v.z;
    u[3] = v.w;
#else
    memcpy(u, p, 16);
#endif
}

/* 1 for the types the device multiplies as stored. */
QB_HD int qb_native(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K: case GGML_TYPE_F16: case GGML_TYPE_BF16:
        return 1;
    default:
        return 0;
    }
}

/* Values and bytes of one block of a native type (F16/BF16: a "block" of 32 values); 0 otherwise. */
QB_HD int qb_block_values(uint32_t type)
{
    return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K ? 256 : qb_native(type) ? 32 : 0;
}

QB_HD int qb_block_bytes(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_Q4_0: return 18;
    case GGML_TYPE_Q5_0: return 22;
    case GGML_TYPE_Q8_0: return 34;
    case GGML_TYPE_Q4_K: return 144;
    case GGML_TYPE_Q5_K: return 176;
    case GGML_TYPE_Q6_K: return 210;
    case GGML_TYPE_F16: case GGML_TYPE_BF16: return 64;
    default: return 0;
    }
}

/* Bytes of a full chunk of QB_CHUNK values: a multiple of 16 for every native type, so every
 * chunk of a row whose start is 16-byte aligned starts 16-byte aligned too. */
QB_HD int qb_chunk_bytes(uint32_t type) { return QB_CHUNK / qb_block_values(type) * qb_block_bytes(type); }

QB_HD uint32_t qb_u16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }

/* IEEE half to float, exact (subnormals included): one conversion instruction on the device, the
 * same values by bit arithmetic on the host (tests/test_quant_blocks.c checks the host side against
 * the reference conversion; tests/gpu/test_cuda.c has the device read every finite half). */
QB_HD float qb_half(uint32_t h)
{
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half((unsigned short)h));
#else
    uint32_t sign = (h & 0x8000u) << 16, em = h & 0x7fffu, bits;
    if (em >= 0x7c00u)
        bits = sign | 0x7f800000u | ((em & 0x3ffu) << 13) | (em > 0x7c00u ? 0x400000u : 0u);
    else if (em >= 0x0400u)
        bits = sign | ((em << 13) + ((127u - 15u) << 23));
    else {
        float f = (float)em * 5.9604644775390625e-8f;   /* em * 2^-24, exact */
        return sign ? -f : f;
    }
    union {
        uint32_t u;
        float f;
    } c;
    c.u = bits;
    return c.f;
#endif
}

/* x brought into f16's range before rounding to f16 (+-65504; NaN stays NaN): a product's inputs
 * and weights rounded to f16 for cuBLAS saturate as kernels/weight_f16.c converts, instead of
 * becoming infinities that turn a whole output row into NaN. */
QB_HD float qb_f16_range(float x)
{
    return x > 65504.0f ? 65504.0f : x < -65504.0f ? -65504.0f : x;
}

QB_HD float qb_bf16(uint32_t b)
{
    union {
        uint32_t u;
        float f;
    } c;
    c.u = b << 16;
    return c.f;
}

/* 6-bit scale and minimum of sub-block s of a Q4_K/Q5_K super-block (model-facts 3.7), from its 12
 * scale bytes held in three words (byte k is bits 8 (k % 4).. of word k / 4): the decode kernels
 * load the words and unpack them in registers (a byte array indexed by s would sit in local memory
 * on the device). */
QB_HD void qb_scale_min_w(uint32_t w0, uint32_t w1, uint32_t w2, int s, int *sc, int *mn)
{
    const int sh = 8 * (s & 3);
    if (s < 4) {
        *sc = (int)((w0 >> sh) & 63u);
        *mn = (int)((w1 >> sh) & 63u);
    } else {
        *sc = (int)(((w2 >> sh) & 0x0Fu) | (((w0 >> sh) >> 6 & 3u) << 4));
        *mn = (int)(((w2 >> sh) >> 4 & 0x0Fu) | (((w1 >> sh) >> 6 & 3u) << 4));
    }
}

QB_HD uint32_t qb_u32(const uint8_t *p) { return qb_u16(p) | (qb_u16(p + 2) << 16); }

/* The same from the 12 scale bytes at q. */
QB_HD void qb_scale_min(const uint8_t *q, int s, int *sc, int *mn)
{
    qb_scale_min_w(qb_u32(q), qb_u32(q + 4), qb_u32(q + 8), s, sc, mn);
}

QB_HD void qb_dec_q4_0(const uint8_t *b, float *y)
{
    float d = qb_half(qb_u16(b));
    QB_UNROLL
    for (int j = 0; j < 16; j++) {
        y[j] = QB_MUL((float)((b[2 + j] & 0xF) - 8), d);
        y[j + 16] = QB_MUL((float)((b[2 + j] >> 4) - 8), d);
    }
}

QB_HD void qb_dec_q5_0(const uint8_t *b, float *y)
{
    float d = qb_half(qb_u16(b));
    uint32_t h = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 24);
    QB_UNROLL
    for (int j = 0; j < 16; j++) {
        int q0 = (b[6 + j] & 0xF) | (int)(((h >> j) & 1u) << 4);
        int q1 = (b[6 + j] >> 4) | (int)(((h >> (j + 16)) & 1u) << 4);
        y[j] = QB_MUL((float)(q0 - 16), d);
        y[j + 16] = QB_MUL((float)(q1 - 16), d);
    }
}

QB_HD void qb_dec_q8_0(const uint8_t *b, float *y)
{
    float d = qb_half(qb_u16(b));
    QB_UNROLL
    for (int j = 0; j < 32; j++) y[j] = QB_MUL((float)(int8_t)b[2 + j], d);
}

/* Sub-block g (0..7) of a Q4_K (bits 4) or Q5_K (bits 5) super-block: 32 values. */
QB_HD void qb_dec_k45(const uint8_t *b, int g, float *y, int five)
{
    float d = qb_half(qb_u16(b)), dmin = qb_half(qb_u16(b + 2));
    int sc, mn;
    qb_scale_min(b + 4, g, &sc, &mn);
    const float dg = QB_MUL(d, (float)sc), og = QB_MUL(dmin, (float)mn);
    const uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16) + 32 * (g >> 1);
    const int shift = 4 * (g & 1);
    QB_UNROLL
    for (int l = 0; l < 32; l++) {
        int q = (qs[l] >> shift) & 0xF;
        if (five) q |= ((qh[l] >> g) & 1) << 4;
        y[l] = QB_SUB(QB_MUL(dg, (float)q), og);
    }
}

/* Values [32g, 32g + 32) of a Q6_K super-block (model-facts 3.9): half h = g / 4, part p = g % 4. */
QB_HD void qb_dec_q6_k(const uint8_t *b, int g, float *y)
{
    const float d = qb_half(qb_u16(b + 208));
    const int h = g >> 2, p = g & 3;
    const uint8_t *ql = b + 64 * h + 32 * (p & 1), *qh = b + 128 + 32 * h;
    const int8_t *S = (const int8_t *)(b + 192 + 8 * h + 2 * p);
    const int lshift = 4 * (p >> 1), hshift = 2 * p;
    const float d0 = QB_MUL(d, (float)S[0]), d1 = QB_MUL(d, (float)S[1]);
    QB_UNROLL
    for (int l = 0; l < 32; l++) {
        int q = (((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32;
        y[l] = QB_MUL(l < 16 ? d0 : d1, (float)q);
    }
}

QB_HD void qb_dec_f16(const uint8_t *b, float *y)
{
    QB_UNROLL
    for (int j = 0; j < 32; j++) y[j] = qb_half(qb_u16(b + 2 * j));
}

QB_HD void qb_dec_bf16(const uint8_t *b, float *y)
{
    QB_UNROLL
    for (int j = 0; j < 32; j++) y[j] = qb_bf16(qb_u16(b + 2 * j));
}

/* Values [32g, 32g + 32) of the block at b of a native type into y[32]. */
QB_HD void qb_decode32(uint32_t type, const uint8_t *b, int g, float *y)
{
    switch (type) {
    case GGML_TYPE_Q4_0: qb_dec_q4_0(b, y); break;
    case GGML_TYPE_Q5_0: qb_dec_q5_0(b, y); break;
    case GGML_TYPE_Q8_0: qb_dec_q8_0(b, y); break;
    case GGML_TYPE_Q4_K: qb_dec_k45(b, g, y, 0); break;
    case GGML_TYPE_Q5_K: qb_dec_k45(b, g, y, 1); break;
    case GGML_TYPE_Q6_K: qb_dec_q6_k(b, g, y); break;
    case GGML_TYPE_F16: qb_dec_f16(b, y); break;
    default: qb_dec_bf16(b, y); break;
    }
}

/* Values [32g, 32g + 32) of a row of a native type (its blocks from `row` on) into y[32]: what an
 * embedding row's gather decodes, a group a thread. */
QB_HD void qb_row_group(uint32_t type, const uint8_t *row, int64_t g, float *y)
{
    const int bv = qb_block_values(type);
    const int64_t v0 = g * 32;
    qb_decode32(type, row + (v0 / bv) * qb_block_bytes(type), (int)(v0 % bv / 32), y);
}

/* The dot product of 32 decoded values with 32 activations, summed in order. On the device the
 * activations (16-byte aligned in shared memory) are read 4 at a time: with QB_XSTRIDE 36, the 8
 * lanes of a quarter warp then touch 8 different groups of banks. */
QB_HD float qb_dot32(const float *v, const float *xg)
{
    float a = 0;
#ifdef __CUDA_ARCH__
    const float4 *x4 = (const float4 *)xg;
    QB_UNROLL
    for (int i = 0; i < 8; i++) {
        const float4 q = x4[i];
        a += v[4 * i] * q.x;
        a += v[4 * i + 1] * q.y;
        a += v[4 * i + 2] * q.z;
        a += v[4 * i + 3] * q.w;
    }
#else
    for (int i = 0; i < 32; i++) a += v[i] * xg[i];
#endif
    return a;
}

/* One lane's share of a chunk of a row: groups lane, lane + 32, ... of the n_groups in the chunk's
 * bytes w, each dotted with the n_tok (<= QB_MAX_TOK) activation rows xs (t's group j at
 * xs[t * ldx + j * QB_XSTRIDE]) and added to acc[t]. The decode product runs this on every lane of a
 * warp and sums the lanes. The token loop runs to the constant QB_MAX_TOK so that acc stays in
 * registers on the device. */
QB_HD void qb_lane_dot(uint32_t type, const uint8_t *w, int n_groups, const float *xs, int ldx, int n_tok, int lane,
                       float *acc)
{
    const int gpb = qb_block_values(type) / 32, bb = qb_block_bytes(type);
    for (int g = lane; g < n_groups; g += 32) {
        float v[32];
        qb_decode32(type, w + (g / gpb) * bb, g % gpb, v);
        QB_UNROLL
        for (int t = 0; t < QB_MAX_TOK; t++) {
            if (t < n_tok) {
                acc[t] += qb_dot32(v, xs + t * ldx + g * QB_XSTRIDE);
            }
        }
    }
}

#endif
