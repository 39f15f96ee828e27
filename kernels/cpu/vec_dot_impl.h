/* vec_dot_impl.h - private to kernels/cpu/vec_dot*.c and vec_gemm.c: block structs of the weight and
 * activation formats, the layouts of the panel kernels, small helpers, and the ISA entry points.
 *
 * The SIMD functions live in vec_dot_avx2.c, vec_dot_avxvnni.c and vec_dot_avx512.c, each the only
 * file compiled with its instruction set's flags; call them only after vec_dot.c's run-time CPU
 * check (vd_isa_active). Nothing here is part of the public API. */
#ifndef KVCHAT_VEC_DOT_IMPL_H
#define KVCHAT_VEC_DOT_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/vec_dot.h"

/* Weight blocks (model-facts.md section 3). fp16 fields are raw IEEE half bits. */
typedef struct { uint16_t d; uint8_t qs[16]; } vd_blk_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[16]; } vd_blk_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } vd_blk_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } vd_blk_q5_1;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } vd_blk_q4_k;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } vd_blk_q5_k;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } vd_blk_q6_k;

/* Activation blocks. Q8_0 is also a weight format.
 * Q8_0: d = amax/127 (stored fp16), q = nearest(x * (1/d)), q in [-127, 127].
 * Q8_1: as Q8_0 plus s = fp16(d * sum(q)) (d unrounded, as ggml), for the "+ m" of Q4_1/Q5_1.
 * Q8_K: d = amax/127 kept in f32, q as above, bsums[j] = sum of q[16j .. 16j+15]. */
typedef struct { uint16_t d; int8_t qs[32]; } vd_blk_q8_0;
typedef struct { uint16_t d, s; int8_t qs[32]; } vd_blk_q8_1;
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } vd_blk_q8_k;

_Static_assert(sizeof(vd_blk_q4_0) == 18, "q4_0 size");
_Static_assert(sizeof(vd_blk_q4_1) == 20, "q4_1 size");
_Static_assert(sizeof(vd_blk_q5_0) == 22, "q5_0 size");
_Static_assert(sizeof(vd_blk_q5_1) == 24, "q5_1 size");
_Static_assert(sizeof(vd_blk_q8_0) == 34, "q8_0 size");
_Static_assert(sizeof(vd_blk_q8_1) == 36, "q8_1 size");
_Static_assert(sizeof(vd_blk_q4_k) == 144, "q4_k size");
_Static_assert(sizeof(vd_blk_q5_k) == 176, "q5_k size");
_Static_assert(sizeof(vd_blk_q6_k) == 210, "q6_k size");
_Static_assert(sizeof(vd_blk_q8_k) == 292, "q8_k size");

/* Round to nearest, ties to even (the default FP rounding mode, which is also what the AVX2
 * _mm256_cvtps_epi32 uses), valid for |f| < 2^22: adding 1.5 * 2^23 leaves the rounded integer in
 * the low mantissa bits. Both quantizer paths use this rule, so scalar and AVX2 blocks are
 * bit-identical. (ggml's scalar Q8_0 uses roundf, i.e. ties away from zero; only exact .5 ties
 * differ, a negligible change.) Out-of-range input gives garbage but no undefined behaviour. */
static inline int32_t vd_nearest_int(float f)
{
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* The 8 six-bit scales and 8 mins of a Q4_K/Q5_K super-block as four little-endian words:
 * out[0] = scales 0-3, out[1] = scales 4-7, out[2] = mins 0-3, out[3] = mins 4-7 (one per byte).
 * Byte k of (w0 >> 2) & 0x30 holds bits 6-7 of scales[k] moved to bits 4-5, and so on (3.7). */
static inline void vd_k_scales(const uint8_t *scales, uint32_t out[4])
{
    uint32_t w0, w1, w2;
    memcpy(&w0, scales, 4);
    memcpy(&w1, scales + 4, 4);
    memcpy(&w2, scales + 8, 4);
    out[0] = w0 & 0x3f3f3f3fu;
    out[1] = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
    out[2] = w1 & 0x3f3f3f3fu;
    out[3] = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
}

/* ------------------------------------------------------------------ panel kernels (vd_gemm)
 *
 * Activation rows of the panel kernels (vd_gemm_quantize_act), padded to 64 bytes:
 *   Q8_0 family (Q4_0, Q5_0, Q8_0 weights): the Q8_0 quantization of the row as int8 q[n], then
 *     float d[n/32] (each block's fp16 scale, as f32), then float s[n/32] (each block's sum of q).
 *   K-quants: one vd_blk_q8_kx per 256 elements: the Q8_K block plus its 32-element sums.
 * A panel holds P rows (16 for AVX-512, 8 for AVX2 and AVX-VNNI) block by block, each block as its
 * codes q[k-groups][P][4] (k-group j = elements 4j..4j+3 of a block, one 32-bit lane per row) and
 * then its scales, P of each (the layouts below). Codes are unsigned: the value plus an offset
 * (Q4_0 8, Q5_0 16, Q8_0 128, Q6_K 32; Q4_K/Q5_K have none: their mins are separate) that the
 * kernels take back out exactly with the activation block sums. Rows past nrows are zero. */
typedef struct { int8_t qs[256]; int16_t bsums[16]; int16_t bs32[8]; float d; } vd_blk_q8_kx;
_Static_assert(sizeof(vd_blk_q8_kx) == 308, "q8_kx size");

static inline size_t vd_gact_q8_bytes(int64_t n) { return ((size_t)n + 8 * (size_t)(n / 32) + 63) & ~(size_t)63; }
static inline size_t vd_gact_k_bytes(int64_t n) { return ((size_t)(n / 256) * sizeof(vd_blk_q8_kx) + 63) & ~(size_t)63; }

/* Panel block sizes for P rows: 32-element formats: codes 32P, then float d[P].
 * Q4_K/Q5_K: codes 256P, int32 sc[8][P] (sub-block scales), int32 mn[4][P] (the mins of sub-blocks
 * 2p and 2p+1 as two int16), float d[P], float dmin[P].
 * Q6_K: codes 256P, int32 sc[16][P], int32 off[8][P] (-32 * the scales of sub-blocks 2p and 2p+1 as
 * two int16, taking the offset out against the activation's 16-element sums), float d[P].
 * sc is encoded per ISA: VD_SC_I32 the scale as an int32 (for vpmulld), VD_SC_PAIR16 the scale in
 * both int16 halves (for vpmaddwd over int16 pair sums). */
#define VD_PANEL_Q8F_BLOCK(P) (36 * (size_t)(P))
#define VD_PANEL_Q4K_BLOCK(P) (312 * (size_t)(P))
#define VD_PANEL_Q6K_BLOCK(P) (356 * (size_t)(P))
enum { VD_SC_I32 = 0, VD_SC_PAIR16 = 1 };

/* Bytes of a panel of P rows of n elements (vec_gemm.c); the packers are in vec_pack_impl.h. Q8_0
 * codes may also be the raw int8 (for kernels that take the sign trick instead of the offset). */
size_t vd_panel_bytes(uint32_t wtype, int P, int64_t n);

/* The panel kernels of each ISA file (NULL entries: none for that type). */
const vd_gemm *vd_gemm_avx2(uint32_t wtype);
const vd_gemm *vd_gemm_avxvnni(uint32_t wtype);
const vd_gemm *vd_gemm_avx512(uint32_t wtype);
/* The AVX-VNNI kernels' algorithm built with the EVEX encodings (vec_vnni8_avx512.c): for the tests,
 * on CPUs with AVX-512 VNNI but no AVX-VNNI. Call only when the AVX-512 level is supported. */
const vd_gemm *vd_gemm_avx512_8(uint32_t wtype);

/* The decode rows kernels (vec_dot_avx2.c), used by every SIMD level: per row the same arithmetic
 * as any level's panel kernels. */
vd_dot_rows_fn vd_dot_rows_avx2(uint32_t wtype);

/* AVX2 kernels (vec_dot_avx2.c). Same contracts as the vd_dot_fn / public helpers. */
void vd_dot_f32_f32_avx2(int64_t n, float *s, const void *w, const void *a);
void vd_dot_f16_f16_avx2(int64_t n, float *s, const void *w, const void *a);
void vd_dot_bf16_bf16_avx2(int64_t n, float *s, const void *w, const void *a);
void vd_dot_q4_1_q8_1_avx2(int64_t n, float *s, const void *w, const void *a);
void vd_dot_q5_1_q8_1_avx2(int64_t n, float *s, const void *w, const void *a);

void vd_attn_scores_avx2(int d_head, int nk, int rp, const float *qt, const float *kb, float *s);
void vd_attn_accum_avx2(int d_head, int nk, int nr, int rp, const float *p, const float *vb, const float *corr, float *o);
void vd_attn_scores_avx512(int d_head, int nk, int rp, const float *qt, const float *kb, float *s);
void vd_attn_accum_avx512(int d_head, int nk, int nr, int rp, const float *p, const float *vb, const float *corr,
                          float *o);
void vd_f16_to_f32_avx2(int64_t n, const uint16_t *x, float *y);

void vd_exp_avx2(int64_t n, const float *x, float *y);
double vd_sumsq_f64_avx2(int64_t n, const float *x);
void vd_scale_mul_avx2(int64_t n, const float *x, float s, const float *w, float *y);
void vd_glu_avx2(int64_t n, float *gate, const float *up, int gelu);

float vd_dot_f32_avx2(int64_t n, const float *a, const float *b);
void vd_axpy_f32_avx2(int64_t n, float a, const float *x, float *y);
float vd_bound_f32_avx2(int64_t n, const float *q, const float *lo, const float *hi);
float vd_dot_f32_f16_avx2(int64_t n, const float *a, const uint16_t *b);
void vd_axpy_f16_avx2(int64_t n, float a, const uint16_t *x, float *y);
void vd_f32_to_f16_avx2(int64_t n, const float *x, uint16_t *y);
void vd_plane_dots_avx2(int64_t n, int64_t P, const float *pt, const float *x, float *out);
void vd_plane_dots_avx512(int64_t n, int64_t P, const float *pt, const float *x, float *out);
void vd_widen_transpose_avx512(int64_t rows, int64_t n, const float *x, int64_t ldx, double *out, double *norms);
void vd_cosines_f64_avx2(int64_t n, const double *d, double na, const double *nb, float *out);
void vd_cosines_f64_avx512(int64_t n, const double *d, double na, const double *nb, float *out);
/* vd_pair_dots_f64's tile: the doubles of pt the rows run over before the next elements (32 KiB, in L1). */
#define VD_PAIR_TILE_DOUBLES 4096
void vd_pair_dots_f64_avx2(int64_t n, int64_t P, const double *pt, int64_t rows, const double *x, int64_t ldx,
                           double *out);
void vd_pair_dots_f64_avx512(int64_t n, int64_t P, const double *pt, int64_t rows, const double *x, int64_t ldx,
                             double *out);
void vd_key_summary_avx2(int64_t n, int64_t rows, const uint16_t *k, int64_t stride, float *sum, float *mn, float *mx);
void vd_bits_overlap_avx2(int64_t words, const uint64_t *now, uint64_t *last, int64_t *set, int64_t *shared);

/* vd_bits_overlap's loop: the popcount is the instruction where the file is built for AVX2 (every
 * AVX2 CPU has popcnt), the compiler's portable one elsewhere. */
static inline void vd_bits_overlap_loop(int64_t words, const uint64_t *now, uint64_t *last, int64_t *set,
                                        int64_t *shared)
{
    int64_t s = 0, b = 0;
    for (int64_t w = 0; w < words; w++) {
        uint64_t x = now[w];
        s += __builtin_popcountll(x);
        b += __builtin_popcountll(x & last[w]);
        last[w] = x;
    }
    *set = s;
    *shared = b;
}

void vd_quantize_q8_0_avx2(const float *x, void *dst, int64_t n);
void vd_quantize_q8_1_avx2(const float *x, void *dst, int64_t n);
void vd_quantize_q8_k_avx2(const float *x, void *dst, int64_t n);
void vd_quantize_f16_avx2(const float *x, void *dst, int64_t n);
void vd_quantize_bf16_avx2(const float *x, void *dst, int64_t n);

#endif
