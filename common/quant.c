/* quant.c - ggml weight formats: type table, half/bfloat conversion and the scalar reference
 * dequantizers (the oracle for every SIMD kernel and the path used by embedding lookups).
 *
 * Block layouts follow ../shared/docs/model-facts.md section 3. Everything here reads bytes through
 * memcpy-style helpers, so rows need no particular alignment. The fused dot products are not here:
 * see kernels/cpu/vec_dot.c. */
#include "common/quant.h"

#include <math.h>
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

/* ------------------------------------------------------------------ quantizers
 *
 * The reference implementation's scalar quantizers (what it uses to write model files when no
 * importance matrix is given), rewritten from the published algorithm. Reproducing its files byte
 * for byte needs its float operations in its order, so every expression below keeps that order,
 * e.g. the weighted sums accumulate w*l*x as ((w*l)*x); tests/test_quant.c checks the result
 * against the tiny reference models' quantized tensors. Integer rounding goes through round_near:
 * adding 1.5 * 2^23 makes the float unit round to nearest even at the integer position. */

static void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

static int round_near(float f)
{
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

/* Q4_0 / Q5_0: one scale d = (value of largest magnitude) / -(2^(bits-1)), codes truncated from
 * x/d + 2^(bits-1) + 0.5 (the reference's rounding), the top code clamped. */
static void qz_q4_0(const float *x, uint8_t *b)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    wr16(b, quant_f32_to_fp16(d));
    for (int j = 0; j < 16; j++) {
        int lo = imin(15, (int8_t)(x[j] * id + 8.5f));
        int hi = imin(15, (int8_t)(x[j + 16] * id + 8.5f));
        b[2 + j] = (uint8_t)(lo | (hi << 4));
    }
}

static void qz_q5_0(const float *x, uint8_t *b)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    float d = max / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    wr16(b, quant_f32_to_fp16(d));
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int lo = imin(31, (int8_t)(x[j] * id + 16.5f));
        int hi = imin(31, (int8_t)(x[j + 16] * id + 16.5f));
        b[6 + j] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
        qh |= (uint32_t)((lo >> 4) & 1) << j;
        qh |= (uint32_t)((hi >> 4) & 1) << (j + 16);
    }
    for (int k = 0; k < 4; k++) b[2 + k] = (uint8_t)(qh >> (8 * k));
}

/* Q4_1 / Q5_1: the block's minimum and range, codes (x - min)/d + 0.5 truncated. */
static void qz_q4_1(const float *x, uint8_t *b)
{
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; j++) {
        if (x[j] < mn) mn = x[j];
        if (x[j] > mx) mx = x[j];
    }
    float d = (mx - mn) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    wr16(b, quant_f32_to_fp16(d));
    wr16(b + 2, quant_f32_to_fp16(mn));
    for (int j = 0; j < 16; j++) {
        int lo = imin(15, (int8_t)((x[j] - mn) * id + 0.5f));
        int hi = imin(15, (int8_t)((x[j + 16] - mn) * id + 0.5f));
        b[4 + j] = (uint8_t)(lo | (hi << 4));
    }
}

static void qz_q5_1(const float *x, uint8_t *b)
{
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; j++) {
        if (x[j] < mn) mn = x[j];
        if (x[j] > mx) mx = x[j];
    }
    float d = (mx - mn) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    wr16(b, quant_f32_to_fp16(d));
    wr16(b + 2, quant_f32_to_fp16(mn));
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int lo = (uint8_t)((x[j] - mn) * id + 0.5f);
        int hi = (uint8_t)((x[j + 16] - mn) * id + 0.5f);
        b[8 + j] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
        qh |= (uint32_t)((lo >> 4) & 1) << j;
        qh |= (uint32_t)((hi >> 4) & 1) << (j + 16);
    }
    for (int k = 0; k < 4; k++) b[4 + k] = (uint8_t)(qh >> (8 * k));
}

/* Q8_0: d = max |x| / 127, codes rounded half away from zero. */
static void qz_q8_0(const float *x, uint8_t *b)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    wr16(b, quant_f32_to_fp16(d));
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

/* The scale and minimum of one K-quant sub-block of n values with codes 0..nmax: start from the
 * range [min(x, 0), max(x)], then try nstep + 1 other code spacings around it, each followed by the
 * weighted least-squares scale and minimum for the codes it gives, and keep the one with the
 * smallest weighted squared error. Returns the scale; *neg_min gets -minimum (>= 0). */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min,
                           uint8_t *Ltry, float rmin, float rdelta, int nstep)
{
    float mn = x[0], mx = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (mn > 0) mn = 0;
    if (mx == mn) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *neg_min = -mn;
        return 0.0f;
    }
    float iscale = (float)nmax / (mx - mn), scale = 1.0f / iscale, best = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = imax(0, imin(nmax, round_near(iscale * (x[i] - mn))));
        L[i] = (uint8_t)l;
        float diff = scale * (float)l + mn - x[i];
        best += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (mx - mn);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = imax(0, imin(nmax, round_near(iscale * (x[i] - mn))));
            Ltry[i] = (uint8_t)l;
            float fl = (float)l;
            sum_l += w[i] * fl;
            sum_l2 += w[i] * fl * fl;
            sum_xl += w[i] * fl * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D <= 0) continue;
        float s = (sum_w * sum_xl - sum_x * sum_l) / D;
        float m = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (m > 0) {
            m = 0;
            s = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float diff = s * (float)Ltry[i] + m - x[i];
            err += w[i] * (diff * diff);
        }
        if (err < best) {
            memcpy(L, Ltry, (size_t)n);
            best = err;
            scale = s;
            mn = m;
        }
    }
    *neg_min = -mn;
    return scale;
}

/* Pack the 6-bit scale and minimum of sub-block j of a Q4_K/Q5_K super-block (model-facts 3.7);
 * the 12 bytes must start zeroed. */
static void put_scale_min(uint8_t *q, int j, int sc, int mn)
{
    if (j < 4) {
        q[j] = (uint8_t)sc;
        q[j + 4] = (uint8_t)mn;
    } else {
        q[j + 4] = (uint8_t)((sc & 0xF) | ((mn & 0xF) << 4));
        q[j - 4] |= (uint8_t)((sc >> 4) << 6);
        q[j] |= (uint8_t)((mn >> 4) << 6);
    }
}

/* Q4_K (bits 4) and Q5_K (bits 5): each sub-block of 32 fitted with weights sqrt(mean x^2) + |x|,
 * the 8 scales and minimums quantized to 6 bits against the largest of each, then every value
 * coded again against the quantized scale and minimum. Writes codes into L[256]. */
static void qz_k_scales(const float *x, uint8_t *b, int bits, uint8_t *L)
{
    const int nmax = (1 << bits) - 1;
    float scales[8], mins[8], w[32];
    uint8_t Ltry[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        float av_x = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
        scales[j] = bits == 4 ? fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j], Ltry, -1.0f, 0.1f, 20)
                              : fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j], Ltry, -0.5f, 0.1f, 15);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t *q = b + 4;
    memset(q, 0, 12);
    for (int j = 0; j < 8; j++) {
        int ls = imin(63, (uint8_t)round_near(inv_scale * scales[j]));
        int lm = imin(63, (uint8_t)round_near(inv_min * mins[j]));
        put_scale_min(q, j, ls, lm);
    }
    wr16(b, quant_f32_to_fp16(max_scale / 63.0f));
    wr16(b + 2, quant_f32_to_fp16(max_min / 63.0f));
    float d_all = rdh(b), dmin_all = rdh(b + 2);
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        k_scale_min(q, j, &sc, &mn);
        float d = d_all * (float)sc;
        if (d == 0.0f) continue;   /* the codes of the first fit stay */
        float dm = dmin_all * (float)mn;
        for (int i = 0; i < 32; i++) L[32 * j + i] = (uint8_t)imax(0, imin(nmax, round_near((x[32 * j + i] + dm) / d)));
    }
}

static void qz_q4_k(const float *x, uint8_t *b)
{
    uint8_t L[256];
    qz_k_scales(x, b, 4, L);
    uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
}

static void qz_q5_k(const float *x, uint8_t *b)
{
    uint8_t L[256];
    qz_k_scales(x, b, 5, L);
    uint8_t *qh = b + 16, *qs = b + 48;
    memset(qh, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
            if (lo > 15) qh[l] |= (uint8_t)(1u << (2 * c));
            if (hi > 15) qh[l] |= (uint8_t)(1u << (2 * c + 1));
            qs[32 * c + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
        }
}

/* The signed scale of one Q6_K sub-block of 16 with codes -32..31: the spacing of the largest
 * magnitude, then 18 spacings around it, keeping the one whose x^2-weighted least-squares fit
 * explains the most; L gets the codes + 32. */
static float fit_signed_scale(const float *x, int8_t *L)
{
    const int n = 16, nmax = 32;
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    if (amax < 1e-15f) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.0f;
    }
    float iscale = (float)-nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = imax(-nmax, imin(nmax - 1, round_near(iscale * x[i])));
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i], fl = (float)l;
        sumlx += w * x[i] * fl;
        suml2 += w * fl * fl;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = imax(-nmax, imin(nmax - 1, round_near(iscale * x[i])));
            float w = x[i] * x[i], fl = (float)l;
            sumlx += w * x[i] * fl;
            suml2 += w * fl * fl;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, round_near(iscale * x[i]))));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q6_K: 16 sub-blocks of 16 with signed 8-bit scales against the one of largest magnitude
 * (mapped to -128), every value coded again against its quantized scale. */
static void qz_q6_k(const float *x, uint8_t *b)
{
    int8_t L[256];
    float scales[16], max_scale = 0, max_abs = 0;
    for (int ib = 0; ib < 16; ib++) {
        scales[ib] = fit_signed_scale(x + 16 * ib, L + 16 * ib);
        if (fabsf(scales[ib]) > max_abs) {
            max_abs = fabsf(scales[ib]);
            max_scale = scales[ib];
        }
    }
    memset(b, 0, 210);
    if (max_abs < 1e-15f) return;   /* all zero: d = 0 */
    float iscale = -128.0f / max_scale;
    wr16(b + 208, quant_f32_to_fp16(1.0f / iscale));
    int8_t *S = (int8_t *)(b + 192);
    for (int ib = 0; ib < 16; ib++) S[ib] = (int8_t)imin(127, round_near(iscale * scales[ib]));
    float d_all = rdh(b + 208);
    for (int j = 0; j < 16; j++) {
        float d = d_all * (float)S[j];
        if (d == 0.0f) continue;
        for (int i = 0; i < 16; i++) L[16 * j + i] = (int8_t)(imax(-32, imin(31, round_near(x[16 * j + i] / d))) + 32);
    }
    for (int h = 0; h < 2; h++) {
        uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        const int8_t *Lh = L + 128 * h;
        for (int l = 0; l < 32; l++) {
            int q0 = Lh[l], q1 = Lh[l + 32], q2 = Lh[l + 64], q3 = Lh[l + 96];
            ql[l] = (uint8_t)((q0 & 0xF) | ((q2 & 0xF) << 4));
            ql[l + 32] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
            qh[l] = (uint8_t)((q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6));
        }
    }
}

int quant_can_quantize(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K:
        return 1;
    default:
        return 0;
    }
}

int quant_quantize_row(uint32_t type, const float *src, void *dst, int64_t n)
{
    const type_info *t = info_of(type);
    if (!t || !quant_can_quantize(type) || n < 0 || n % t->blck != 0) return -1;
    uint8_t *p = dst;
    void (*blk)(const float *, uint8_t *) = NULL;
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(dst, src, sizeof(float) * (size_t)n);
        return 0;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) wr16(p + 2 * i, quant_f32_to_fp16(src[i]));
        return 0;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) wr16(p + 2 * i, quant_f32_to_bf16(src[i]));
        return 0;
    case GGML_TYPE_Q4_0: blk = qz_q4_0; break;
    case GGML_TYPE_Q4_1: blk = qz_q4_1; break;
    case GGML_TYPE_Q5_0: blk = qz_q5_0; break;
    case GGML_TYPE_Q5_1: blk = qz_q5_1; break;
    case GGML_TYPE_Q8_0: blk = qz_q8_0; break;
    case GGML_TYPE_Q4_K: blk = qz_q4_k; break;
    case GGML_TYPE_Q5_K: blk = qz_q5_k; break;
    default: blk = qz_q6_k; break;
    }
    for (int64_t i = 0; i < n / t->blck; i++) blk(src + i * t->blck, p + i * t->size);
    return 0;
}
