/* test_quant_blocks.c - the block decoders the CUDA kernels run (kernels/quant_blocks.h), on the host.
 *
 * Every native type: random blocks (random bytes, scales that are finite halves) decoded 32 values at
 * a time must equal common/quant.c's reference dequantizer bit for bit; the decode product's lane
 * loop, run for all 32 lanes over rows cut into the kernel's chunks, must give the double-precision
 * dot products of the dequantized rows; the chunk geometry keeps 16-byte alignment; and the sizes
 * the backend allocates (kernels/gpu_weights.c). QB_SEED replays a run. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/quant.h"
#include "kernels/backend.h"
#include "kernels/decode_dot.h"
#include "kernels/quant_blocks.h"
#include "tests/test_rng.h"

static const uint32_t NATIVE[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K,
                                   GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_F16,  GGML_TYPE_BF16 };
#define N_NATIVE (sizeof NATIVE / sizeof NATIVE[0])

static void seed_rng(const char *what)
{
    test_rng_seed(what, "QB_SEED", (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull + 7);
}

/* A finite half in about [-2^e, 2^e] (random mantissa, sign and a small exponent range). */
static uint16_t rand_half(int e_lo, int e_hi)
{
    int e = e_lo + (int)(rnd() % (uint32_t)(e_hi - e_lo + 1));
    return (uint16_t)((rnd() & 1u) << 15 | (uint32_t)(e + 15) << 10 | (rnd() & 0x3ffu));
}

/* n random blocks of type: random bytes, with every scale field a finite half (F16 values all
 * finite, BF16 values finite too). */
static void random_blocks(uint32_t type, uint8_t *b, int n)
{
    int bb = qb_block_bytes(type);
    for (int i = 0; i < n * bb; i++) b[i] = (uint8_t)rnd();
    for (int k = 0; k < n; k++) {
        uint8_t *p = b + k * bb;
        uint16_t h;
        switch (type) {
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K:
            h = rand_half(-14, -2);
            memcpy(p, &h, 2);       /* d */
            h = rand_half(-14, -4);
            memcpy(p + 2, &h, 2);   /* dmin */
            break;
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q8_0:
            h = rand_half(-14, -2);
            memcpy(p, &h, 2);
            break;
        case GGML_TYPE_Q6_K:
            h = rand_half(-14, -4);
            memcpy(p + 208, &h, 2);
            break;
        case GGML_TYPE_F16:
            for (int j = 0; j < 32; j++) {
                h = rand_half(-14, 15);             /* every normal exponent */
                if (rnd() % 8 == 0) h &= 0x83ffu;   /* or a subnormal, or a signed zero */
                memcpy(p + 2 * j, &h, 2);
            }
            break;
        default:   /* BF16: exponents 2^-30 .. 2^30, random mantissas and signs */
            for (int j = 0; j < 32; j++) {
                uint32_t e = 127 - 30 + rnd() % 61;
                uint16_t v = (uint16_t)((rnd() & 1u) << 15 | e << 7 | (rnd() & 0x7fu));
                memcpy(p + 2 * j, &v, 2);
            }
            break;
        }
    }
}

Test(quant_blocks, every_group_decodes_like_the_reference_bit_for_bit)
{
    seed_rng("decode");
    enum { NB = 64 };
    uint8_t *blocks = malloc(NB * 256);
    float ref[NB * 256], got[256];
    for (size_t ti = 0; ti < N_NATIVE; ti++) {
        uint32_t type = NATIVE[ti];
        int bv = qb_block_values(type), bb = qb_block_bytes(type);
        int64_t blck, tsize;
        cr_assert(quant_block_geometry(type, &blck, &tsize) == 0);
        /* F16/BF16 "blocks" are 32 values */
        cr_assert_eq(bb, bv == (int)blck ? (int)tsize : 32 * (int)tsize, "%s", quant_type_name(type));
        for (int round = 0; round < 20; round++) {
            random_blocks(type, blocks, NB);
            quant_dequant_row(type, blocks, ref, (int64_t)NB * bv);
            for (int k = 0; k < NB; k++) {
                for (int g = 0; g < bv / 32; g++) qb_decode32(type, blocks + k * bb, g, got + 32 * g);
                for (int i = 0; i < bv; i++) {
                    uint32_t a, b;
                    memcpy(&a, &got[i], 4);
                    memcpy(&b, &ref[k * bv + i], 4);
                    cr_assert_eq(a, b, "%s block %d value %d: %.9g, the reference %.9g", quant_type_name(type), k, i,
                                 got[i], ref[k * bv + i]);
                }
            }
        }
    }
    free(blocks);
}

/* What the decode product computes for rows of n_in values and n_tok tokens: per chunk of QB_CHUNK
 * values, the activations laid out as in shared memory, all 32 lanes' qb_lane_dot summed. */
static void simulated_product(uint32_t type, const uint8_t *row, int64_t n_in, const float *x, int n_tok, float *y)
{
    float acc_total[QB_MAX_TOK] = { 0 };
    const int ldx = QB_CHUNK / 32 * QB_XSTRIDE;
    float *xs = malloc(sizeof(float) * (size_t)(ldx * n_tok));
    float acc[32][QB_MAX_TOK];
    memset(acc, 0, sizeof acc);
    const int bv = qb_block_values(type), bb = qb_block_bytes(type);
    for (int64_t k0 = 0; k0 < n_in; k0 += QB_CHUNK) {
        int kc = (int)(n_in - k0 < QB_CHUNK ? n_in - k0 : QB_CHUNK);
        for (int i = 0; i < ldx * n_tok; i++) xs[i] = NAN;   /* the padding is never read */
        for (int t = 0; t < n_tok; t++)
            for (int e = 0; e < kc; e++) xs[t * ldx + (e / 32) * QB_XSTRIDE + e % 32] = x[t * n_in + k0 + e];
        const uint8_t *chunk = row + k0 / bv * bb;
        for (int lane = 0; lane < 32; lane++) qb_lane_dot(type, chunk, kc / 32, xs, ldx, n_tok, lane, acc[lane]);
    }
    for (int lane = 0; lane < 32; lane++)
        for (int t = 0; t < n_tok; t++) acc_total[t] += acc[lane][t];
    for (int t = 0; t < n_tok; t++) y[t] = acc_total[t];
    free(xs);
}

/* For every native type and each row length its blocks divide: a random row, its reference values
 * w and 1 to QB_MAX_TOK random tokens x (values in [-1, 1] scaled by 2^-4 .. 2^4 a block of 32, as
 * a residual stream varies), handed to check. */
typedef void (*row_check)(uint32_t type, const uint8_t *row, const float *w, const float *x, int64_t n, int n_tok);
static void for_random_rows(row_check check)
{
    const int64_t lens[] = { 256, 640, 2048, 2304, 4096 + 768, 14336 };
    for (size_t ti = 0; ti < N_NATIVE; ti++) {
        uint32_t type = NATIVE[ti];
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            int64_t n = lens[li];
            int bv = qb_block_values(type);
            if (n % bv) continue;
            int nb = (int)(n / bv), n_tok = 1 + (int)(rnd() % QB_MAX_TOK);
            uint8_t *row = malloc((size_t)nb * (size_t)qb_block_bytes(type));
            float *w = malloc(sizeof(float) * (size_t)n), *x = malloc(sizeof(float) * (size_t)(n * n_tok));
            random_blocks(type, row, nb);
            quant_dequant_row(type, row, w, n);
            for (int64_t i = 0; i < n * n_tok; i++)
                x[i] = ldexpf((float)((int)(rnd() % 2001) - 1000) / 1000.0f, (int)((i / 32) % 9) - 4);
            check(type, row, w, x, n, n_tok);
            free(row);
            free(w);
            free(x);
        }
    }
}

/* stage 0's lanes (f32 activations): within f32 rounding of the double-precision product */
static void check_f32_lanes(uint32_t type, const uint8_t *row, const float *w, const float *x, int64_t n, int n_tok)
{
    float y[QB_MAX_TOK];
    simulated_product(type, row, n, x, n_tok, y);
    for (int t = 0; t < n_tok; t++) {
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) {
            ref += (double)w[i] * x[t * n + i];
            mag += fabs((double)w[i] * x[t * n + i]);
        }
        /* f32 sums of n terms: a few units of 2^-24 of the sum of magnitudes */
        cr_assert(fabs(y[t] - ref) <= 1e-5 * mag + 1e-30, "%s n_in %lld token %d of %d: %.9g, double %.9g",
                  quant_type_name(type), (long long)n, t, n_tok, y[t], ref);
    }
}

Test(quant_blocks, the_lanes_of_the_decode_product_give_the_rows_dot_products)
{
    seed_rng("lane dot");
    for_random_rows(check_f32_lanes);
}

Test(quant_blocks, chunks_stay_16_byte_aligned_and_device_sizes_follow)
{
    for (size_t ti = 0; ti < N_NATIVE; ti++) {
        uint32_t type = NATIVE[ti];
        cr_assert(qb_native(type) && be_gpu_reads_as_stored(type));
        cr_assert_eq(QB_CHUNK % qb_block_values(type), 0);
        cr_assert_eq(qb_chunk_bytes(type) % 16, 0, "%s: a chunk of %d bytes", quant_type_name(type), qb_chunk_bytes(type));
        /* rows padded to 16 bytes */
        for (int64_t n = 256; n <= 4096; n += 256) {
            uint64_t s = be_gpu_weight_stride(type, n);
            cr_assert(s % 16 == 0 && s >= quant_row_size(type, n) && s < quant_row_size(type, n) + 16);
        }
    }
    const uint32_t converted[] = { GGML_TYPE_F32, GGML_TYPE_Q4_1, GGML_TYPE_Q5_1 };
    for (int i = 0; i < 3; i++) {
        cr_assert(!be_gpu_reads_as_stored(converted[i]));
        cr_assert_eq(be_gpu_weight_type(converted[i], 640), GGML_TYPE_F16);
        cr_assert_eq(be_gpu_weight_bytes(converted[i], 640, 3), 3 * 1280);
    }
    /* BF16 rows must be whole groups of 32 for the kernels; F16 rows of any length stay F16 */
    cr_assert_eq(be_gpu_weight_type(GGML_TYPE_BF16, 96), GGML_TYPE_BF16);
    cr_assert_eq(be_gpu_weight_type(GGML_TYPE_BF16, 100), GGML_TYPE_F16);
    cr_assert_eq(be_gpu_weight_stride(GGML_TYPE_F16, 100), 208);
    /* the default model's largest matrix: 262144 rows of 640 Q8_0 values take their file size */
    cr_assert_eq(be_gpu_weight_bytes(GGML_TYPE_Q8_0, 640, 262144), (uint64_t)262144 * 680 + 262144 * 8);
}

/* Inputs rounded to f16 for cuBLAS saturate at f16's largest value instead of becoming infinities
 * (the device rounds qb_f16_range(x) to nearest even, as quant_f32_to_fp16 does here). */
Test(quant_blocks, values_past_f16s_range_saturate)
{
    const float big[] = { 65504.0f, 65519.0f, 65520.0f, 1e5f, 3.4e38f, INFINITY };
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) {
        cr_expect_eq(quant_f32_to_fp16(qb_f16_range(big[i])), 0x7bff, "%g", big[i]);
        cr_expect_eq(quant_f32_to_fp16(qb_f16_range(-big[i])), 0xfbff, "%g", -big[i]);
    }
    const float kept[] = { 0.0f, -0.0f, 1.0f, -2.5f, 65503.0f, 6e-8f, -65472.0f };
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) {
        float v = qb_f16_range(kept[i]);
        cr_expect(!memcmp(&v, &kept[i], sizeof v), "%g changed", kept[i]);
    }
    cr_expect(isnan(qb_f16_range(NAN)), "NaN stays NaN");
}

/* The host side of qb_half equals the reference conversion on every half (the device side is one
 * conversion instruction; tests/gpu/test_cuda.c reads every finite half through the decode kernel). */
Test(quant_blocks, every_half_converts_like_the_reference)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float a = qb_half(h), b = quant_fp16_to_f32((uint16_t)h);
        if (isnan(b)) cr_expect(isnan(a), "half 0x%04x", h);
        else cr_expect(!memcmp(&a, &b, sizeof a), "half 0x%04x: %g, the reference %g", h, a, b);
    }
}

/* ---------------------------------------------------------------- kernels/decode_dot.h */

/* Activations rounded to 8-bit codes: the scale is the block's largest magnitude over 127, every
 * code within half a step of its value (ties to even; also in a block of subnormal scale), codes
 * within +-127; an all-zero block has scale 0 and codes 0; a NaN makes its block's scale NaN. Each
 * block's sum is its scale times the sum of its codes. */
Test(quant_blocks, activations_round_to_the_nearest_8_bit_code_in_blocks_of_32)
{
    seed_rng("activation codes");
    enum { N = 32 * 64 };
    float x[N], d[N / 32], sums[N / 32];
    int8_t q[N];
    for (int i = 0; i < N; i++) {
        int b = i / 32;
        /* blocks of every magnitude, some all zero, some with ties (x = (k + 1/2) d) */
        x[i] = b % 7 == 3 ? 0.0f : ldexpf((float)((int)(rnd() % 20001) - 10000) / 10000.0f, (int)(b % 40) - 20);
    }
    /* a block of subnormal scale (all below 3.7e-37): coded like any other */
    for (int j = 0; j < 32; j++) x[9 * 32 + j] = ldexpf((float)((int)(rnd() % 2001) - 1000) / 1000.0f, -130);
    /* ties: scale 1, values k + 1/2 */
    x[5 * 32] = 127.0f;
    for (int j = 1; j < 32; j++) x[5 * 32 + j] = (float)j - 16.5f;
    dd_quantize(x, N, q, d, sums);
    int ties = 0;
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
        cr_assert_eq(d[b], amax / 127.0f, "block %d: scale %.9g for amax %.9g", b, d[b], amax);
        int code_sum = 0;
        for (int j = 0; j < 32; j++) code_sum += q[32 * b + j];
        const float want_sum = d[b] * (float)code_sum;
        cr_assert(!memcmp(&sums[b], &want_sum, 4), "block %d: sum %.9g, want %.9g", b, sums[b], want_sum);
        for (int j = 0; j < 32; j++) {
            float v = x[32 * b + j];
            int c = q[32 * b + j];
            cr_assert(c >= -127 && c <= 127);
            if (d[b] == 0.0f) {
                cr_assert_eq(c, 0);
                continue;
            }
            /* the code is the float quotient's nearest integer (dd_code), so the exact quotient may
             * be off by the division's rounding too: half an ulp of it */
            float rq = v / d[b];
            double r = (double)v / (double)d[b];
            cr_assert(fabsf(rq - (float)c) <= 0.5f, "block %d value %d: %.9g / %.9g = %.9g coded %d", b, j, v, d[b],
                      rq, c);
            cr_assert(fabs(r - c) <= 0.5 + fabs(r) * 0x1p-24, "block %d value %d: %.9g coded %d (step %.9g)", b, j, v,
                      c, d[b]);
            if (fabsf(rq - (float)c) == 0.5f) {
                cr_assert_eq(c % 2, 0, "a tie rounds to even: %.9g coded %d", v, c);
                ties++;
            }
        }
    }
    cr_assert_geq(ties, 31);
    float y[32];
    for (int j = 0; j < 32; j++) y[j] = (float)j;
    y[17] = NAN;
    dd_quantize(y, 32, q, d, sums);
    cr_assert(isnan(d[0]) && isnan(sums[0]), "a NaN activation's block has scale %g, sum %g", d[0], sums[0]);
    y[17] = INFINITY;
    dd_quantize(y, 32, q, d, NULL);
    cr_assert(isinf(d[0]));
}

/* Every item of every quantized type, unpacked: its 16 codes times their scales, less the minimums,
 * are the reference dequantizer's values bit for bit, and the items of a row cover each of its
 * values once. */
Test(quant_blocks, the_integer_items_unpack_to_the_reference_values)
{
    seed_rng("items");
    enum { NB = 16 };
    uint8_t *row = malloc(NB * 256);
    float *ref = malloc(sizeof(float) * NB * 256);
    int seen[NB * 256];
    for (size_t ti = 0; ti < N_NATIVE; ti++) {
        uint32_t type = NATIVE[ti];
        if (!dd_integer_type(type)) continue;
        const int n = NB * qb_block_values(type), kq = type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K;
        for (int round = 0; round < 10; round++) {
            random_blocks(type, row, NB);
            quant_dequant_row(type, row, ref, n);
            memset(seen, 0, sizeof seen);
            for (int i = 0; i < n / DD_ITEM; i++) {
                dd_item it;
                dd_load(type, row, i, &it);
                for (int g = 0; g < 2; g++) {
                    cr_assert(it.pos[g] % 8 == 0 && it.pos[g] / 32 == (it.pos[g] + 7) / 32 && it.pos[g] + 8 <= n,
                              "%s item %d group %d at %d", quant_type_name(type), i, g, it.pos[g]);
                    for (int j = 0; j < 8; j++) {
                        int code = (int)(int8_t)(uint8_t)((uint32_t)it.v[2 * g + j / 4] >> (8 * (j % 4)));
                        float v = kq ? it.s[g] * (float)code - it.m[g] : (float)code * it.s[g];
                        float r = ref[it.pos[g] + j];
                        cr_assert(memcmp(&v, &r, 4) == 0, "%s item %d value %d: %.9g, the reference %.9g",
                                  quant_type_name(type), i, it.pos[g] + j, v, r);
                        seen[it.pos[g] + j]++;
                    }
                }
            }
            for (int i = 0; i < n; i++)
                cr_assert_eq(seen[i], 1, "%s value %d read %d times", quant_type_name(type), i, seen[i]);
        }
    }
    free(row);
    free(ref);
}

/* The wide path's items of Q4_K and Q5_K, unpacked: their 32 codes times their scales, less the
 * minimums, are the reference dequantizer's values bit for bit; the items of a row cover each value
 * once; exactly one item of each pair of sub-blocks is the first (it adds their minimum terms),
 * and its codes lie at 16-byte aligned offsets (the device's vector loads). */
Test(quant_blocks, the_wide_items_unpack_to_the_reference_values)
{
    seed_rng("wide items");
    enum { NB = 16 };
    uint8_t *row = malloc(NB * 256);
    float *ref = malloc(sizeof(float) * NB * 256);
    int seen[NB * 256], firsts[NB * 8];
    const uint32_t types[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q5_K };
    for (size_t ti = 0; ti < 2; ti++) {
        const uint32_t type = types[ti];
        cr_assert(dd_wide_type(type) && dd_integer_type(type));
        const int n = NB * 256;
        for (int round = 0; round < 10; round++) {
            random_blocks(type, row, NB);
            quant_dequant_row(type, row, ref, n);
            memset(seen, 0, sizeof seen);
            memset(firsts, 0, sizeof firsts);
            for (int i = 0; i < n / DD_WITEM; i++) {
                dd_witem it;
                dd_wload(type, row, i, &it);
                cr_assert(it.pos % 16 == 0 && it.pos % 64 < 32 && it.pos + 48 <= n, "%s item %d at %d",
                          quant_type_name(type), i, it.pos);
                if (it.first) firsts[it.pos / 64]++;
                for (int g = 0; g < 2; g++)
                    for (int j = 0; j < 16; j++) {
                        const int at = it.pos + 32 * g + j;
                        int code = (int)(int8_t)(uint8_t)((uint32_t)it.v[4 * g + j / 4] >> (8 * (j % 4)));
                        float v = it.s[g] * (float)code - it.m[g];
                        cr_assert(memcmp(&v, &ref[at], 4) == 0, "%s item %d value %d: %.9g, the reference %.9g",
                                  quant_type_name(type), i, at, v, ref[at]);
                        seen[at]++;
                    }
            }
            for (int i = 0; i < n; i++)
                cr_assert_eq(seen[i], 1, "%s value %d read %d times", quant_type_name(type), i, seen[i]);
            for (int p = 0; p < n / 64; p++)
                cr_assert_eq(firsts[p], 1, "%s sub-blocks %d and %d: %d first items", quant_type_name(type), 2 * p,
                             2 * p + 1, firsts[p]);
        }
    }
    free(row);
    free(ref);
}

/* The decode kernels' warp against double precision. Quantized types: within f32 rounding (1e-5 of
 * the sum of magnitudes) of the product of the dequantized weights and the coded activations (codes
 * times scales), and within the coding bound (each activation at most half its block's step away:
 * sum |w_i| d_b / 2) of the product with the f32 activations themselves. F16/BF16: within f32
 * rounding of the f32 product. Each token's result also equals, bit for bit, that token multiplied
 * alone, 2 and 4 reads in flight give the bits of 1 (every type, F16/BF16 too), and a warp over two rows (the row and its blocks
 * reversed) gives each row's bits of one row alone. Q4_K and Q5_K: both paths (narrow items and
 * the wide path) are held to all of this. */
static void check_one_path(uint32_t type, const uint8_t *row, const float *w, const float *x, int64_t n, int n_tok,
                           int wide)
{
    int8_t *xq = malloc((size_t)(n * n_tok));
    float *xd = malloc(sizeof(float) * (size_t)(n * n_tok / 32)), *xs = malloc(sizeof(float) * (size_t)(n * n_tok / 32));
    dd_quantize(x, n * n_tok, xq, xd, xs);
    float y[QB_MAX_TOK], y1, yi[QB_MAX_TOK];
    dd_warp_row(type, row, n, x, xq, xd, xs, n_tok, 1, wide, y);
    char tn[64];
    snprintf(tn, sizeof tn, "%s%s", quant_type_name(type), wide && dd_wide_type(type) ? " (wide)" : "");
    for (int inflight = 2; inflight <= DD_MAX_INFLIGHT; inflight *= 2) {   /* the kernels' other variants */
        dd_warp_row(type, row, n, x, xq, xd, xs, n_tok, inflight, wide, yi);
        cr_assert(memcmp(yi, y, sizeof(float) * (size_t)n_tok) == 0, "%s n_in %lld: %d reads in flight", tn,
                  (long long)n, inflight);
    }
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + t * n, *dt = xd + t * n / 32, *st = xs + t * n / 32;
        const int8_t *qt = xq + t * n;
        double exact = 0, coded = 0, mag = 0, bound = 0;
        for (int64_t i = 0; i < n; i++) {
            double xc = (double)qt[i] * dt[i / 32];
            exact += (double)w[i] * xt[i];
            coded += (double)w[i] * xc;
            mag += fabs((double)w[i] * xt[i]) + fabs((double)w[i] * xc);
            bound += fabs((double)w[i]) * dt[i / 32] / 2;
        }
        if (dd_integer_type(type)) {
            cr_assert(fabs(y[t] - coded) <= 1e-5 * mag + 1e-30, "%s n_in %lld token %d of %d: %.9g, coded in double %.9g",
                      tn, (long long)n, t, n_tok, y[t], coded);
            cr_assert(fabs(y[t] - exact) <= bound + 1e-5 * mag, "%s n_in %lld token %d: %.9g, exact %.9g, coding bound %.3g",
                      tn, (long long)n, t, y[t], exact, bound);
        } else {
            cr_assert(fabs(y[t] - exact) <= 1e-5 * mag + 1e-30, "%s n_in %lld token %d of %d: %.9g, double %.9g", tn,
                      (long long)n, t, n_tok, y[t], exact);
        }
        dd_warp_row(type, row, n, xt, qt, dt, st, 1, 1, wide, &y1);
        cr_assert(memcmp(&y1, &y[t], 4) == 0, "%s token %d alone: %.9g, among %d: %.9g", tn, t, y1, n_tok, y[t]);
    }
    {   /* two rows a warp: the row and its blocks in reverse order, one stride apart */
        const size_t bb = (size_t)qb_block_bytes(type), nb = (size_t)(n / qb_block_values(type)), stride = nb * bb;
        uint8_t *two = malloc(2 * stride);
        memcpy(two, row, stride);
        for (size_t k = 0; k < nb; k++) memcpy(two + stride + k * bb, row + (nb - 1 - k) * bb, bb);
        float acc[32][DD_MAX_ROWS][QB_MAX_TOK], want[QB_MAX_TOK];
        for (int inflight = 1; inflight <= DD_MAX_INFLIGHT; inflight *= 2) {
            memset(acc, 0, sizeof acc);
            for (int lane = 0; lane < 32; lane++)
                dd_lane_dot(type, wide, two, stride, 2, n, x, xq, xd, xs, n_tok, lane, 32, inflight, acc[lane]);
            for (int r = 0; r < 2; r++) {
                dd_warp_row(type, two + r * stride, n, x, xq, xd, xs, n_tok, 1, wide, want);
                for (int t = 0; t < n_tok; t++) {
                    float v[32], u[32];
                    for (int l = 0; l < 32; l++) v[l] = acc[l][r][t];
                    for (int o = 16; o > 0; o >>= 1) {
                        for (int l = 0; l < 32; l++) u[l] = v[l] + v[l ^ o];
                        memcpy(v, u, sizeof u);
                    }
                    cr_assert(!memcmp(&v[0], &want[t], 4), "%s n_in %lld row %d of 2, token %d, %d in flight: %.9g, "
                              "alone %.9g", tn, (long long)n, r, t, inflight, v[0], want[t]);
                }
            }
        }
        free(two);
    }
    free(xq);
    free(xd);
    free(xs);
}

static void check_decode_dot(uint32_t type, const uint8_t *row, const float *w, const float *x, int64_t n, int n_tok)
{
    check_one_path(type, row, w, x, n, n_tok, 0);
    if (dd_wide_type(type)) check_one_path(type, row, w, x, n, n_tok, 1);
}

Test(quant_blocks, the_decode_kernels_lanes_give_the_rows_dot_products)
{
    seed_rng("decode dot");
    for_random_rows(check_decode_dot);
}

/* The embedding gather of the CUDA backend (get_rows_kernel) run on the host: every thread's group
 * of every token's row, scaled as the kernel does, gives the CPU backend's get_rows bit for bit, for
 * every native type, rows of several lengths and a scale of 1 or Gemma's sqrt(n_embd). */
Test(quant_blocks, the_embedding_gather_gives_the_cpu_backends_rows_bit_for_bit)
{
    seed_rng("gather");
    char err[256];
    be_backend *cpu = be_cpu_create(1, err, sizeof err);
    cr_assert(cpu, "%s", err);
    const int64_t lens[] = { 256, 640, 2304 };
    for (size_t ti = 0; ti < N_NATIVE; ti++) {
        uint32_t type = NATIVE[ti];
        int bv = qb_block_values(type), bb = qb_block_bytes(type);
        for (size_t li = 0; li < 3; li++) {
            int64_t n_in = lens[li], n_out = 7;
            if (n_in % bv) continue;
            size_t row_bytes = (size_t)(n_in / bv * bb), stride = (row_bytes + 15) / 16 * 16;
            uint8_t *file = malloc(row_bytes * (size_t)n_out), *dev = calloc((size_t)n_out, stride);
            random_blocks(type, file, (int)(n_in / bv * n_out));
            for (int64_t r = 0; r < n_out; r++) memcpy(dev + r * stride, file + r * row_bytes, row_bytes);
            be_weight w = { file, type, n_in, n_out, row_bytes };
            const int32_t ids[5] = { 6, 0, 3, 3, 5 };
            for (int sc = 0; sc < 2; sc++) {
                float scale = sc ? sqrtf((float)n_in) : 1.0f;
                float *want = malloc(sizeof(float) * (size_t)(5 * n_in)), *got = malloc(sizeof(float) * (size_t)(5 * n_in));
                cpu->ops->get_rows(cpu, &w, ids, 5, scale, want);
                int64_t groups = n_in / 32;
                for (int64_t i = 0; i < 5 * groups; i++) {   /* one thread each */
                    int64_t t = i / groups, g = i % groups;
                    float y[32];
                    qb_row_group(type, dev + (size_t)ids[t] * stride, g, y);
                    for (int j = 0; j < 32; j++) got[t * n_in + g * 32 + j] = scale != 1.0f ? y[j] * scale : y[j];
                }
                cr_assert(!memcmp(got, want, sizeof(float) * (size_t)(5 * n_in)), "%s, rows of %lld, scale %g",
                          quant_type_name(type), (long long)n_in, scale);
                free(want);
                free(got);
            }
            free(file);
            free(dev);
        }
    }
    be_free(cpu);
}

/* Several products a decode launch (dd_outs): the grid's blocks, split among the products by
 * dd_outs_layout and found again by dd_outs_block / dd_outs_y as the kernel finds them (warps of
 * DD_WARPS_HERE, rows a warp), cover every row of every product exactly once and write it into
 * that product's output, for one to DD_MAX_OUTS products of any row counts. */
Test(quant_blocks, several_products_a_launch_cover_each_row_once)
{
    enum { DD_WARPS_HERE = 4 };   /* vec_dot.cu's DD_WARPS */
    static const int32_t counts[][DD_MAX_OUTS] = {
        { 1 }, { 7 }, { 8 }, { 4096, 1024, 1024 }, { 640, 256, 256 }, { 5, 3, 17, 1 }, { 9, 8 }, { 2048, 2048 },
    };
    static const int n_of[] = { 1, 1, 1, 3, 3, 4, 2, 2 };
    float outs[DD_MAX_OUTS][1];
    const uint8_t *weights = (const uint8_t *)"w";
    for (size_t c = 0; c < sizeof n_of / sizeof *n_of; c++)
        for (int rows = 1; rows <= DD_MAX_ROWS; rows++) {
            dd_outs o;
            memset(&o, 0, sizeof o);
            o.n = n_of[c];
            int32_t total = 0;
            for (int i = 0; i < o.n; i++) {
                o.w[i] = weights + i;   /* told apart by address */
                o.y[i] = outs[i];
                o.n_out[i] = counts[c][i];
                total += counts[c][i];
            }
            const int64_t grid = dd_outs_layout(&o, DD_WARPS_HERE * rows);
            int *seen = calloc((size_t)total, sizeof *seen);
            int64_t want_grid = 0;
            for (int i = 0; i < o.n; i++) want_grid += (counts[c][i] + DD_WARPS_HERE * rows - 1) / (DD_WARPS_HERE * rows);
            cr_expect_eq(grid, want_grid, "case %zu: %lld blocks, not %lld", c, (long long)grid, (long long)want_grid);
            for (int32_t blk = 0; blk < grid; blk++) {
                const uint8_t *w;
                int32_t n_out, local;
                dd_outs_block(&o, blk, &w, &n_out, &local);
                const int j = (int)(w - weights);
                cr_assert(j >= 0 && j < o.n, "case %zu block %d: a weight not in the launch", c, blk);
                cr_expect_eq(n_out, counts[c][j]);
                cr_expect_eq(dd_outs_y(&o, blk), outs[j], "case %zu block %d: another product's output", c, blk);
                int32_t base = 0;
                for (int i = 0; i < j; i++) base += counts[c][i];
                for (int wp = 0; wp < DD_WARPS_HERE; wp++) {
                    const int32_t row0 = (local * DD_WARPS_HERE + wp) * rows;
                    for (int r = 0; r < rows && row0 + r < n_out; r++) seen[base + row0 + r]++;
                }
            }
            for (int32_t i = 0; i < total; i++)
                cr_expect_eq(seen[i], 1, "case %zu, %d rows a warp: row %d computed %d times", c, rows, i, seen[i]);
            free(seen);
        }
}

/* dd_many_shape against the H200 table it was drawn from (bench/gpu_kernels.csv, commit 8261283, 132
 * multiprocessors): on every product of 2, 4 and 8 tokens at the 7B's shapes, its choice among one
 * row a warp with 1 or 2 reads in flight and two rows is within 1.12x of the fastest of the three,
 * and over all of them within 1.03x of the fastest each time (two rows everywhere, the rule before,
 * was 1.21x). */
Test(quant_blocks, the_decode_kernels_shape_for_several_tokens_follows_the_h200_table)
{
    FILE *f = fopen("bench/gpu_kernels.csv", "r");
    cr_assert(f, "bench/gpu_kernels.csv: cannot open");
    static const uint32_t types[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K,
                                      GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_F16,  GGML_TYPE_BF16 };
    enum { NT = 8, NS = 3, NK = 3 };
    static const int64_t outs[NS] = { 4096, 14336, 4096 }, ins[NS] = { 4096, 4096, 14336 };
    static const int toks[NK] = { 2, 4, 8 };
    /* ms[type][shape][tokens][config]: two rows (the default then), one row 1 in flight, one row
     * the kernels' own (2; 1 on F16/BF16) */
    double ms[NT][NS][NK][3];
    for (int i = 0; i < NT * NS * NK * 3; i++) (&ms[0][0][0][0])[i] = -1;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char date[32], commit[64], gpu[64], what[32], type[16], config[64];
        long long n_out, n_in;
        int n_tok;
        double t;
        if (sscanf(line, "%31[^,],%63[^,],%63[^,],%31[^,],%15[^,],%lld,%lld,%d,%63[^,],%lf", date, commit, gpu, what,
                   type, &n_out, &n_in, &n_tok, config, &t) != 10 ||
            strcmp(commit, "8261283") || strcmp(what, "product"))
            continue;
        int c = !strcmp(config, "decode kernel") ? 0 : !strcmp(config, "decode kernel 1 in flight") ? 1
                : !strcmp(config, "decode kernel 1 row a warp") ? 2 : -1;
        int ti = -1, si = -1, ki = -1;
        for (int i = 0; i < NT; i++)
            if (!strcmp(type, quant_type_name(types[i]))) ti = i;
        for (int i = 0; i < NS; i++)
            if (n_out == outs[i] && n_in == ins[i]) si = i;
        for (int i = 0; i < NK; i++)
            if (n_tok == toks[i]) ki = i;
        if (c >= 0 && ti >= 0 && si >= 0 && ki >= 0) ms[ti][si][ki][c] = t;
    }
    fclose(f);
    double sum_rule = 0, sum_best = 0, sum_two = 0;
    for (int ti = 0; ti < NT; ti++)
        for (int si = 0; si < NS; si++)
            for (int ki = 0; ki < NK; ki++) {
                const double *m = ms[ti][si][ki];
                cr_assert(m[0] > 0 && m[1] > 0 && m[2] > 0, "%s %lld x %lld at %d tokens: not in the table",
                          quant_type_name(types[ti]), (long long)outs[si], (long long)ins[si], toks[ki]);
                dd_many s = dd_many_shape(types[ti], 1, outs[si], toks[ki], 132);
                cr_assert((s.rows == 1 || s.rows == 2) && (s.inflight == 1 || s.inflight == 2));
                double pick = s.rows == 2 ? m[0] : s.inflight == 1 ? m[1] : m[2];
                double best = fmin(m[0], fmin(m[1], m[2]));
                cr_expect_leq(pick, 1.12 * best, "%s %lld x %lld at %d tokens: %d rows, %d in flight, %.4f ms against %.4f",
                              quant_type_name(types[ti]), (long long)outs[si], (long long)ins[si], toks[ki], s.rows,
                              s.inflight, pick, best);
                sum_rule += pick;
                sum_best += best;
                sum_two += m[0];
            }
    cr_expect_leq(sum_rule, 1.03 * sum_best, "the rule's products take %.4f ms, the fastest %.4f", sum_rule, sum_best);
    cr_expect_gt(sum_two, 1.15 * sum_best, "two rows everywhere took %.4f ms against %.4f: the table changed", sum_two,
                 sum_best);
}
