/* quant.c - ggml weight formats: type table, half/bfloat conversion and the scalar reference
 * dequantizers (the oracle for every SIMD kernel and the path used by embedding lookups).
 *
 * Block layouts follow ../shared/docs/model-facts.md section 3. Everything here reads bytes through
 * memcpy-style helpers, so rows need no particular alignment. The fused dot products are not here:
 * see kernels/cpu/vec_dot.c. */
#include "common/quant.h"

#include <string.h>

/* ------------------------------------------------------------------ type table */

typedef struct type_info {
    const char *name;
    int64_t blck;
    int64_t size;    /* bytes per block; 0 = id is retired/unknown */
    int supported;
} type_info;

/* Sizes from model-facts.md 1.3 and gguf-py's GGML_QUANT_SIZES, except Q8_1, which is 36 bytes
 * in ggml's C code ({fp16 d, fp16 s, int8 qs[32]}; the Python table's 40 is an older layout). */
static const type_info TYPES[] = {
    [GGML_TYPE_F32]  = { "F32", 1, 4, 1 },
    [GGML_TYPE_F16]  = { "F16", 1, 2, 1 },
    [GGML_TYPE_Q4_0] = { "Q4_0", 32, 18, 1 },
    [GGML_TYPE_Q4_1] = { "Q4_1", 32, 20, 1 },
    [GGML_TYPE_Q5_0] = { "Q5_0", 32, 22, 1 },
    [GGML_TYPE_Q5_1] = { "Q5_1", 32, 24, 1 },
    [GGML_TYPE_Q8_0] = { "Q8_0", 32, 34, 1 },
    [GGML_TYPE_Q8_1] = { "Q8_1", 32, 36, 0 },
    [GGML_TYPE_Q2_K] = { "Q2_K", 256, 84, 0 },
    [GGML_TYPE_Q3_K] = { "Q3_K", 256, 110, 0 },
    [GGML_TYPE_Q4_K] = { "Q4_K", 256, 144, 1 },
    [GGML_TYPE_Q5_K] = { "Q5_K", 256, 176, 1 },
    [GGML_TYPE_Q6_K] = { "Q6_K", 256, 210, 1 },
    [GGML_TYPE_Q8_K] = { "Q8_K", 256, 292, 0 },
    [16] = { "IQ2_XXS", 256, 66, 0 },
    [17] = { "IQ2_XS", 256, 74, 0 },
    [18] = { "IQ3_XXS", 256, 98, 0 },
    [19] = { "IQ1_S", 256, 50, 0 },
    [20] = { "IQ4_NL", 32, 18, 0 },
    [21] = { "IQ3_S", 256, 110, 0 },
    [22] = { "IQ2_S", 256, 82, 0 },
    [23] = { "IQ4_XS", 256, 136, 0 },
    [24] = { "I8", 1, 1, 0 },
    [25] = { "I16", 1, 2, 0 },
    [26] = { "I32", 1, 4, 0 },
    [27] = { "I64", 1, 8, 0 },
    [28] = { "F64", 1, 8, 0 },
    [29] = { "IQ1_M", 256, 56, 0 },
    [GGML_TYPE_BF16] = { "BF16", 1, 2, 1 },
    [34] = { "TQ1_0", 256, 54, 0 },
    [35] = { "TQ2_0", 256, 66, 0 },
    [39] = { "MXFP4", 32, 17, 0 },
    [40] = { "NVFP4", 64, 36, 0 },
    [41] = { "Q1_0", 128, 18, 0 },
};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

static const type_info *info_of(uint32_t type)
{
    if (type >= N_TYPES || TYPES[type].size == 0) return NULL;
    return &TYPES[type];
}

int quant_block_geometry(uint32_t type, int64_t *blck, int64_t *type_size)
{
    const type_info *t = info_of(type);
    if (!t) return -1;
    if (blck) *blck = t->blck;
    if (type_size) *type_size = t->size;
    return 0;
}

const char *quant_type_name(uint32_t type)
{
    const type_info *t = info_of(type);
    return t ? t->name : "unknown";
}

int quant_supported(uint32_t type)
{
    const type_info *t = info_of(type);
    return t ? t->supported : 0;
}

/* 0 for unknown types, negative n, or n not a multiple of the block size. */
size_t quant_row_size(uint32_t type, int64_t n)
{
    const type_info *t = info_of(type);
    if (!t || n < 0 || n % t->blck != 0) return 0;
    return (size_t)(n / t->blck) * (size_t)t->size;
}

/* ------------------------------------------------------------------ half / bfloat */

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

float quant_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    if (em == 0x7c00u) return f32_from_bits(sign | 0x7f800000u);
    if (em > 0x7c00u)                        /* NaN: keep the payload, quiet it (as F16C does) */
        return f32_from_bits(sign | 0x7fc00000u | ((uint32_t)(em & 0x3ffu) << 13));
    if (em >= 0x0400u)                       /* normal: rebias the exponent 15 -> 127 */
        return f32_from_bits(sign | ((em << 13) + ((127u - 15u) << 23)));
    /* zero or subnormal: em * 2^-24, exact in f32 */
    return f32_from_bits(sign | bits_from_f32((float)em * 0x1p-24f));
}

uint16_t quant_f32_to_fp16(float f)
{
    uint32_t u = bits_from_f32(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)                     /* NaN: quiet it, keep the top payload bits (as F16C) */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u)                    /* >= 65520 rounds to inf (ties to even from 65504) */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {                  /* result is a normal half (>= 2^-14) */
        uint32_t r = a + 0xfffu + ((a >> 13) & 1u);     /* round to nearest even at bit 13 */
        return (uint16_t)(sign | ((r - (112u << 23)) >> 13));
    }
    /* Subnormal half or zero: value / 2^-24 = m * 2^(e - 126), rounded to nearest even. */
    uint32_t e = a >> 23;
    if (e < 102) return sign;                /* < 2^-25: rounds to zero (2^-25 itself ties to 0) */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;               /* 14..24 */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);             /* q may be 0x400: the smallest normal, correctly */
}

float quant_bf16_to_f32(uint16_t b)
{
    return f32_from_bits((uint32_t)b << 16);
}

uint16_t quant_f32_to_bf16(float f)
{
    uint32_t u = bits_from_f32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)     /* NaN: keep sign and top payload, force quiet */
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ------------------------------------------------------------------ dequantizers */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static float rdh(const uint8_t *p) { return quant_fp16_to_f32(rd16(p)); }
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Each formula is written as ggml's reference (and gguf-py) evaluates it, operation by operation in
 * f32, so the results are bit-identical to theirs: e.g. (d * sc) * q - (dmin * m). */

static void dq_q4_0(const uint8_t *b, float *y)
{
    float d = rdh(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0xF) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

static void dq_q4_1(const uint8_t *b, float *y)
{
    float d = rdh(b), m = rdh(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0xF) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

static void dq_q5_0(const uint8_t *b, float *y)
{
    float d = rdh(b);
    uint32_t h = rd32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int q0 = (qs[j] & 0xF) | (int)(((h >> j) & 1u) << 4);
        int q1 = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1u) << 4);
        y[j] = (float)(q0 - 16) * d;
        y[j + 16] = (float)(q1 - 16) * d;
    }
}

static void dq_q5_1(const uint8_t *b, float *y)
{
    float d = rdh(b), m = rdh(b + 2);
    uint32_t h = rd32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int q0 = (qs[j] & 0xF) | (int)(((h >> j) & 1u) << 4);
        int q1 = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1u) << 4);
        y[j] = (float)q0 * d + m;
        y[j + 16] = (float)q1 * d + m;
    }
}

static void dq_q8_0(const uint8_t *b, float *y)
{
    float d = rdh(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

/* 6-bit scale and min of sub-block s (0..7) of a Q4_K/Q5_K super-block (model-facts 3.7). */
static void k_scale_min(const uint8_t *q, int s, int *sc, int *mn)
{
    if (s < 4) {
        *sc = q[s] & 63;
        *mn = q[s + 4] & 63;
    } else {
        *sc = (q[s + 4] & 0x0F) | ((q[s - 4] >> 6) << 4);
        *mn = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
}

static void dq_q4_k(const uint8_t *b, float *y)
{
    float d = rdh(b), dmin = rdh(b + 2);
    const uint8_t *scales = b + 4, *qs = b + 16;
    for (int c = 0; c < 4; c++) {
        int sc0, m0, sc1, m1;
        k_scale_min(scales, 2 * c, &sc0, &m0);
        k_scale_min(scales, 2 * c + 1, &sc1, &m1);
        float d0 = d * (float)sc0, o0 = dmin * (float)m0;
        float d1 = d * (float)sc1, o1 = dmin * (float)m1;
        for (int l = 0; l < 32; l++) {
            y[64 * c + l] = d0 * (float)(qs[32 * c + l] & 0xF) - o0;
            y[64 * c + 32 + l] = d1 * (float)(qs[32 * c + l] >> 4) - o1;
        }
    }
}

static void dq_q5_k(const uint8_t *b, float *y)
{
    float d = rdh(b), dmin = rdh(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
    for (int c = 0; c < 4; c++) {
        int sc0, m0, sc1, m1;
        k_scale_min(scales, 2 * c, &sc0, &m0);
        k_scale_min(scales, 2 * c + 1, &sc1, &m1);
        float d0 = d * (float)sc0, o0 = dmin * (float)m0;
        float d1 = d * (float)sc1, o1 = dmin * (float)m1;
        for (int l = 0; l < 32; l++) {
            int q0 = (qs[32 * c + l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4);
            int q1 = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
            y[64 * c + l] = d0 * (float)q0 - o0;
            y[64 * c + 32 + l] = d1 * (float)q1 - o1;
        }
    }
}

static void dq_q6_k(const uint8_t *b, float *y)
{
    float d = rdh(b + 208);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        const int8_t *S = (const int8_t *)(b + 192 + 8 * h);
        float *o = y + 128 * h;
        for (int l = 0; l < 32; l++) {
            int k = l / 16;
            int q0 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q1 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            o[l] = d * (float)S[k + 0] * (float)q0;
            o[l + 32] = d * (float)S[k + 2] * (float)q1;
            o[l + 64] = d * (float)S[k + 4] * (float)q2;
            o[l + 96] = d * (float)S[k + 6] * (float)q3;
        }
    }
}

void quant_dequant_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    void (*blk)(const uint8_t *, float *) = NULL;
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(dst, src, sizeof(float) * (size_t)n);
        return;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = rdh(p + 2 * i);
        return;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = quant_bf16_to_f32(rd16(p + 2 * i));
        return;
    case GGML_TYPE_Q4_0: blk = dq_q4_0; break;
    case GGML_TYPE_Q4_1: blk = dq_q4_1; break;
    case GGML_TYPE_Q5_0: blk = dq_q5_0; break;
    case GGML_TYPE_Q5_1: blk = dq_q5_1; break;
    case GGML_TYPE_Q8_0: blk = dq_q8_0; break;
    case GGML_TYPE_Q4_K: blk = dq_q4_k; break;
    case GGML_TYPE_Q5_K: blk = dq_q5_k; break;
    case GGML_TYPE_Q6_K: blk = dq_q6_k; break;
    default: {
        /* Unsupported type: callers check quant_supported() first; never leave garbage behind. */
        float nan = f32_from_bits(0x7fc00000u);
        for (int64_t i = 0; i < n; i++) dst[i] = nan;
        return;
    }
    }
    const type_info *t = info_of(type);
    for (int64_t i = 0; i < n / t->blck; i++) blk(p + i * t->size, dst + i * t->blck);
}
