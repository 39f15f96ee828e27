/* vec_dot_avx512.c - AVX-512 (F/BW/VL/DQ) + AVX512-VNNI kernels: the prefill panel products of 16
 * weight rows (one 32-bit lane per row) times many tokens, for Q4_0/Q5_0/Q8_0 and Q4_K/Q5_K/Q6_K,
 * and the blocked attention's score and value-accumulation kernels.
 *
 * The only file built with the AVX-512 flags; nothing here may run before vec_dot.c has found the
 * CPU and OS support (vd_isa_active() == VD_ISA_AVX512). vpdpbusd multiplies unsigned by signed
 * bytes: the weights go in as unsigned codes (value + offset, vec_dot_impl.h) and each activation
 * block's sum takes the offset back out, so every block's integer sum is exactly the scalar
 * kernels'; only the order of the f32 additions differs. */
#include "kernels/cpu/vec_dot_impl.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)

#include <immintrin.h>

#include "common/quant.h"

#define P 16          /* rows per panel: one per 32-bit lane of a zmm */
#define TMAX 8        /* tokens per tile */
#define VD_PACK_P P
#include "kernels/cpu/vec_pack_impl.h"

static inline int32_t ld32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline __m512i bcast32(const void *p) { return _mm512_set1_epi32(ld32(p)); }

static inline void store_rows(float *y, __m512 v, int nrows)
{
    if (nrows == P)
        _mm512_storeu_ps(y, v);
    else
        _mm512_mask_storeu_ps(y, (__mmask16)((1u << nrows) - 1), v);
}

/* ------------------------------------------------------------------ Q4_0 / Q5_0 / Q8_0 */

/* T tokens (a constant after inlining) against one panel. Per block: 8 vpdpbusd per token give the
 * 16 rows' sums of code * q; s * (-off) takes the offset out exactly (all terms are integers below
 * 2^24), then the block's d_w * d_a scales it into the f32 accumulator. */
static inline __attribute__((always_inline)) void q8f_tile(const int T, int64_t n, const uint8_t *panel, int nrows,
                                                           const uint8_t *act, size_t astride, float off, float *y,
                                                           size_t ldy)
{
    const int64_t nb = n / 32;
    const int8_t *q[TMAX];
    const float *da[TMAX], *sa[TMAX];
    __m512 c[TMAX];
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        const uint8_t *row = act + (size_t)t * astride;
        q[t] = (const int8_t *)row;
        da[t] = (const float *)(row + n);
        sa[t] = da[t] + nb;
        c[t] = _mm512_setzero_ps();
    }
    const __m512 noff = _mm512_set1_ps(-off);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = panel + (size_t)b * VD_PANEL_Q8F_BLOCK(P);
        __m512i acc[TMAX];
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i w = _mm512_loadu_si512(blk + 64 * j);
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++) acc[t] = _mm512_dpbusd_epi32(acc[t], w, bcast32(q[t] + 32 * b + 4 * j));
        }
        __m512 dw = _mm512_loadu_ps(blk + 32 * P);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            __m512 f = _mm512_fmadd_ps(_mm512_set1_ps(sa[t][b]), noff, _mm512_cvtepi32_ps(acc[t]));
            c[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(da[t][b])), f, c[t]);
        }
    }
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) store_rows(y + (size_t)t * ldy, c[t], nrows);
}

static inline __attribute__((always_inline)) void q8f_mul(int64_t n, const void *panel, int nrows, const void *act,
                                                          size_t astride, int64_t ntok, float *y, size_t ldy, float off)
{
    const uint8_t *a = act;
    int64_t t = 0;
    for (; t + TMAX <= ntok; t += TMAX) q8f_tile(TMAX, n, panel, nrows, a + (size_t)t * astride, astride, off, y + (size_t)t * ldy, ldy);
    switch (ntok - t) {
    case 7: q8f_tile(7, n, panel, nrows, a + (size_t)t * astride, astride, off, y + (size_t)t * ldy, ldy); break;
    case 6: q8f_tile(6, n, panel, nrows, a + (size_t)t * astride, astride, off, y + (size_t)t * ldy, ldy); break;
    case 5: q8f_tile(5, n, panel, nrows, a + (size_t)t * astride, astride, off, y + (size_t)t * ldy, ldy); break;
    case 4: q8f_tile(4, n, panel, nrows, a + (size_t)t * astride, astride, off, y + (size_t)t * ldy, ldy); break;
    case 3: q8f_tile(3, n, panel, nrows, a + (size_t)t * astride, astride, off, y + (size_t)t * ldy, ldy); break;
    case 2: q8f_tile(2, n, panel, nrows, a + (size_t)t * astride, astride, off, y + (size_t)t * ldy, ldy); break;
    case 1: q8f_tile(1, n, panel, nrows, a + (size_t)t * astride, astride, off, y + (size_t)t * ldy, ldy); break;
    default: break;
    }
}

static void mul_q8_0(int64_t n, const void *panel, int nrows, const void *act, size_t astride, int64_t ntok, float *y,
                     size_t ldy)
{
    q8f_mul(n, panel, nrows, act, astride, ntok, y, ldy, 128.0f);
}

static void mul_q5_0(int64_t n, const void *panel, int nrows, const void *act, size_t astride, int64_t ntok, float *y,
                     size_t ldy)
{
    q8f_mul(n, panel, nrows, act, astride, ntok, y, ldy, 16.0f);
}

static void mul_q4_0(int64_t n, const void *panel, int nrows, const void *act, size_t astride, int64_t ntok, float *y,
                     size_t ldy)
{
    q8f_mul(n, panel, nrows, act, astride, ntok, y, ldy, 8.0f);
}

/* ------------------------------------------------------------------ Q4_K / Q5_K */

/* Per super-block and token: each 32-element sub-block's 16 row sums (8 vpdpbusd) times the rows'
 * 6-bit scales, summed in int32 (|sum| < 2^31), like the scalar sumi; the mins against the
 * activation's 32-element sums with vpdpwssd (the scalar summ); then d * sumi - dmin * summ. */
static inline __attribute__((always_inline)) void q4k_tile(const int T, int64_t n, const uint8_t *panel, int nrows,
                                                           const uint8_t *act, size_t astride, float *y, size_t ldy)
{
    const int64_t nsb = n / 256;
    const vd_blk_q8_kx *a[TMAX];
    __m512 c[TMAX];
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        a[t] = (const vd_blk_q8_kx *)(act + (size_t)t * astride);
        c[t] = _mm512_setzero_ps();
    }
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = panel + (size_t)sb * VD_PANEL_Q4K_BLOCK(P);
        const int32_t *sc = (const int32_t *)(blk + 256 * P);
        const int32_t *mn = sc + 8 * P;
        const float *dv = (const float *)(mn + 4 * P);
        __m512i acc[TMAX];
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_si512();
        for (int s = 0; s < 8; s++) {
            __m512i is[TMAX];
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++) is[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                __m512i w = _mm512_loadu_si512(blk + 64 * (8 * s + j));
                #pragma GCC unroll 16
                for (int t = 0; t < T; t++)
                    is[t] = _mm512_dpbusd_epi32(is[t], w, bcast32(a[t][sb].qs + 32 * s + 4 * j));
            }
            __m512i scv = _mm512_loadu_si512(sc + P * s);
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++) acc[t] = _mm512_add_epi32(acc[t], _mm512_mullo_epi32(is[t], scv));
        }
        __m512i m[TMAX];
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) m[t] = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {
            __m512i mv = _mm512_loadu_si512(mn + P * p);
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++) m[t] = _mm512_dpwssd_epi32(m[t], mv, bcast32(&a[t][sb].bs32[2 * p]));
        }
        __m512 d = _mm512_loadu_ps(dv), dmin = _mm512_loadu_ps(dv + P);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            __m512 ad = _mm512_set1_ps(a[t][sb].d);
            c[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, ad), _mm512_cvtepi32_ps(acc[t]), c[t]);
            c[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, ad), _mm512_cvtepi32_ps(m[t]), c[t]);
        }
    }
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) store_rows(y + (size_t)t * ldy, c[t], nrows);
}

/* Q6_K: sub-blocks of 16 (4 vpdpbusd) times the signed scales, and the codes' offset of 32 taken out
 * with vpdpwssd of -32 * scale against the activation's 16-element sums: the scalar sumi exactly. */
static inline __attribute__((always_inline)) void q6k_tile(const int T, int64_t n, const uint8_t *panel, int nrows,
                                                           const uint8_t *act, size_t astride, float *y, size_t ldy)
{
    const int64_t nsb = n / 256;
    const vd_blk_q8_kx *a[TMAX];
    __m512 c[TMAX];
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        a[t] = (const vd_blk_q8_kx *)(act + (size_t)t * astride);
        c[t] = _mm512_setzero_ps();
    }
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = panel + (size_t)sb * VD_PANEL_Q6K_BLOCK(P);
        const int32_t *sc = (const int32_t *)(blk + 256 * P);
        const int32_t *offp = sc + 16 * P;
        const float *dv = (const float *)(offp + 8 * P);
        __m512i acc[TMAX];
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_si512();
        for (int p = 0; p < 8; p++) {
            __m512i ov = _mm512_loadu_si512(offp + P * p);
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++) acc[t] = _mm512_dpwssd_epi32(acc[t], ov, bcast32(&a[t][sb].bsums[2 * p]));
        }
        for (int s = 0; s < 16; s++) {
            __m512i is[TMAX];
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++) is[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m512i w = _mm512_loadu_si512(blk + 64 * (4 * s + j));
                #pragma GCC unroll 16
                for (int t = 0; t < T; t++)
                    is[t] = _mm512_dpbusd_epi32(is[t], w, bcast32(a[t][sb].qs + 16 * s + 4 * j));
            }
            __m512i scv = _mm512_loadu_si512(sc + P * s);
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++) acc[t] = _mm512_add_epi32(acc[t], _mm512_mullo_epi32(is[t], scv));
        }
        __m512 d = _mm512_loadu_ps(dv);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++)
            c[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(a[t][sb].d)), _mm512_cvtepi32_ps(acc[t]), c[t]);
    }
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) store_rows(y + (size_t)t * ldy, c[t], nrows);
}

#define TOKEN_TILES(tile, ...)                                                                         \
    do {                                                                                               \
        const uint8_t *a_ = act;                                                                       \
        int64_t t_ = 0;                                                                                \
        for (; t_ + TMAX <= ntok; t_ += TMAX)                                                          \
            tile(TMAX, n, panel, nrows, a_ + (size_t)t_ * astride, astride, y + (size_t)t_ * ldy, ldy); \
        switch (ntok - t_) {                                                                           \
        case 7: tile(7, n, panel, nrows, a_ + (size_t)t_ * astride, astride, y + (size_t)t_ * ldy, ldy); break; \
        case 6: tile(6, n, panel, nrows, a_ + (size_t)t_ * astride, astride, y + (size_t)t_ * ldy, ldy); break; \
        case 5: tile(5, n, panel, nrows, a_ + (size_t)t_ * astride, astride, y + (size_t)t_ * ldy, ldy); break; \
        case 4: tile(4, n, panel, nrows, a_ + (size_t)t_ * astride, astride, y + (size_t)t_ * ldy, ldy); break; \
        case 3: tile(3, n, panel, nrows, a_ + (size_t)t_ * astride, astride, y + (size_t)t_ * ldy, ldy); break; \
        case 2: tile(2, n, panel, nrows, a_ + (size_t)t_ * astride, astride, y + (size_t)t_ * ldy, ldy); break; \
        case 1: tile(1, n, panel, nrows, a_ + (size_t)t_ * astride, astride, y + (size_t)t_ * ldy, ldy); break; \
        default: break;                                                                                \
        }                                                                                              \
    } while (0)

static void mul_q4_k(int64_t n, const void *panel, int nrows, const void *act, size_t astride, int64_t ntok, float *y,
                     size_t ldy)
{
    TOKEN_TILES(q4k_tile);
}

static void mul_q6_k(int64_t n, const void *panel, int nrows, const void *act, size_t astride, int64_t ntok, float *y,
                     size_t ldy)
{
    TOKEN_TILES(q6k_tile);
}

/* ------------------------------------------------------------------ packing and the table */

static size_t bytes_q4_0(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q4_0, P, n); }
static size_t bytes_q5_0(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q5_0, P, n); }
static size_t bytes_q8_0(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q8_0, P, n); }
static size_t bytes_q4_k(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q4_K, P, n); }
static size_t bytes_q5_k(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q5_K, P, n); }
static size_t bytes_q6_k(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q6_K, P, n); }

static void pack_q4_0(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q8f(GGML_TYPE_Q4_0, 0, n, w, ws, nr, p); }
static void pack_q5_0(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q8f(GGML_TYPE_Q5_0, 0, n, w, ws, nr, p); }
static void pack_q8_0(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q8f(GGML_TYPE_Q8_0, 0, n, w, ws, nr, p); }
static void pack_q4_k(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q45k(0, VD_SC_I32, n, w, ws, nr, p); }
static void pack_q5_k(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q45k(1, VD_SC_I32, n, w, ws, nr, p); }
static void pack_q6_k(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q6k(VD_SC_I32, n, w, ws, nr, p); }

static const vd_gemm G_Q4_0 = { P, bytes_q4_0, pack_q4_0, mul_q4_0 };
static const vd_gemm G_Q5_0 = { P, bytes_q5_0, pack_q5_0, mul_q5_0 };
static const vd_gemm G_Q8_0 = { P, bytes_q8_0, pack_q8_0, mul_q8_0 };
static const vd_gemm G_Q4_K = { P, bytes_q4_k, pack_q4_k, mul_q4_k };
static const vd_gemm G_Q5_K = { P, bytes_q5_k, pack_q5_k, mul_q4_k };   /* codes up to 31, same kernel */
static const vd_gemm G_Q6_K = { P, bytes_q6_k, pack_q6_k, mul_q6_k };

const vd_gemm *vd_gemm_avx512(uint32_t wtype)
{
    switch (wtype) {
    case GGML_TYPE_Q4_0: return &G_Q4_0;
    case GGML_TYPE_Q5_0: return &G_Q5_0;
    case GGML_TYPE_Q8_0: return &G_Q8_0;
    case GGML_TYPE_Q4_K: return &G_Q4_K;
    case GGML_TYPE_Q5_K: return &G_Q5_K;
    case GGML_TYPE_Q6_K: return &G_Q6_K;
    default: return NULL;
    }
}

/* ------------------------------------------------------------------ attention blocks */

/* Scores of KK keys for RV vectors of 16 rows: each key element broadcast against the queries'
 * column d (rows in lanes), so nothing is summed across lanes. */
static inline __attribute__((always_inline)) void scores_tile16(const int KK, const int RV, int D, int rp,
                                                                const float *qt, const float *kb, float *s)
{
    __m512 acc[8][2];
#pragma GCC unroll 8
    for (int k = 0; k < KK; k++) acc[k][0] = acc[k][1] = _mm512_setzero_ps();
    for (int d = 0; d < D; d++) {
        __m512 q0 = _mm512_loadu_ps(qt + (size_t)d * rp);
        __m512 q1 = RV > 1 ? _mm512_loadu_ps(qt + (size_t)d * rp + 16) : q0;
#pragma GCC unroll 8
        for (int k = 0; k < KK; k++) {
            __m512 kv = _mm512_set1_ps(kb[(size_t)k * D + d]);
            acc[k][0] = _mm512_fmadd_ps(kv, q0, acc[k][0]);
            if (RV > 1) acc[k][1] = _mm512_fmadd_ps(kv, q1, acc[k][1]);
        }
    }
#pragma GCC unroll 8
    for (int k = 0; k < KK; k++) {
        _mm512_storeu_ps(s + (size_t)k * rp, acc[k][0]);
        if (RV > 1) _mm512_storeu_ps(s + (size_t)k * rp + 16, acc[k][1]);
    }
}

#define SCORE_KEYS(RV)                                                                                    \
    do {                                                                                                  \
        int k = 0;                                                                                        \
        for (; k + 8 <= nk; k += 8) scores_tile16(8, RV, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0); \
        switch (nk - k) {                                                                                 \
        case 7: scores_tile16(7, RV, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0); break; \
        case 6: scores_tile16(6, RV, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0); break; \
        case 5: scores_tile16(5, RV, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0); break; \
        case 4: scores_tile16(4, RV, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0); break; \
        case 3: scores_tile16(3, RV, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0); break; \
        case 2: scores_tile16(2, RV, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0); break; \
        case 1: scores_tile16(1, RV, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0); break; \
        default: break;                                                                                   \
        }                                                                                                 \
    } while (0)

void vd_attn_scores_avx512(int D, int nk, int rp, const float *qt, const float *kb, float *s)
{
    int r0 = 0;
    for (; r0 + 32 <= rp; r0 += 32) SCORE_KEYS(2);
    if (r0 < rp) SCORE_KEYS(1);
}

/* RR rows x DV vectors of 16 output dimensions (the last one masked to m): rescaled by corr, then
 * each value row's vectors times the RR broadcast weights. */
static inline __attribute__((always_inline)) void accum_tile16(const int RR, const int DV, __mmask16 m, int D, int nk,
                                                               int rp, const float *p, const float *vb,
                                                               const float *corr, float *o)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < RR; r++) {
        __m512 c = _mm512_set1_ps(corr[r]);
#pragma GCC unroll 4
        for (int i = 0; i < DV; i++)
            acc[r][i] = _mm512_mul_ps(_mm512_maskz_loadu_ps(i == DV - 1 ? m : 0xffff, o + (size_t)r * D + 16 * i), c);
    }
    for (int k = 0; k < nk; k++) {
        __m512 v[4];
#pragma GCC unroll 4
        for (int i = 0; i < DV; i++) v[i] = _mm512_maskz_loadu_ps(i == DV - 1 ? m : 0xffff, vb + (size_t)k * D + 16 * i);
#pragma GCC unroll 4
        for (int r = 0; r < RR; r++) {
            __m512 w = _mm512_set1_ps(p[(size_t)k * rp + r]);
#pragma GCC unroll 4
            for (int i = 0; i < DV; i++) acc[r][i] = _mm512_fmadd_ps(w, v[i], acc[r][i]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RR; r++)
#pragma GCC unroll 4
        for (int i = 0; i < DV; i++)
            _mm512_mask_storeu_ps(o + (size_t)r * D + 16 * i, i == DV - 1 ? m : 0xffff, acc[r][i]);
}

#define ACCUM_ROWS(DV, M)                                                                                 \
    do {                                                                                                  \
        switch (rr) {                                                                                     \
        case 4: accum_tile16(4, DV, M, D, nk, rp, pr, v, c, or_); break;                                   \
        case 3: accum_tile16(3, DV, M, D, nk, rp, pr, v, c, or_); break;                                   \
        case 2: accum_tile16(2, DV, M, D, nk, rp, pr, v, c, or_); break;                                   \
        default: accum_tile16(1, DV, M, D, nk, rp, pr, v, c, or_); break;                                  \
        }                                                                                                 \
    } while (0)

void vd_attn_accum_avx512(int D, int nk, int nr, int rp, const float *p, const float *vb, const float *corr, float *o)
{
    for (int r0 = 0; r0 < nr; r0 += 4) {
        int rr = nr - r0 < 4 ? nr - r0 : 4;
        const float *pr = p + r0, *c = corr + r0;
        int d0 = 0;
        for (; d0 + 64 <= D; d0 += 64) {
            const float *v = vb + d0;
            float *or_ = o + (size_t)r0 * D + d0;
            ACCUM_ROWS(4, 0xffff);
        }
        for (; d0 < D; d0 += 16) {   /* 16 at a time, the last masked */
            const float *v = vb + d0;
            float *or_ = o + (size_t)r0 * D + d0;
            __mmask16 m = D - d0 >= 16 ? 0xffff : (__mmask16)((1u << (D - d0)) - 1);
            ACCUM_ROWS(1, m);
        }
    }
}

#else
/* Not x86-64 (the Makefile builds this file with the AVX-512 flags there): nothing to offer. */
const vd_gemm *vd_gemm_avx512(uint32_t wtype)
{
    (void)wtype;
    return NULL;
}
void vd_attn_scores_avx512(int d_head, int nk, int rp, const float *qt, const float *kb, float *s)
{
    (void)d_head, (void)nk, (void)rp, (void)qt, (void)kb, (void)s;
}
void vd_attn_accum_avx512(int d_head, int nk, int nr, int rp, const float *p, const float *vb, const float *corr,
                          float *o)
{
    (void)d_head, (void)nk, (void)nr, (void)rp, (void)p, (void)vb, (void)corr, (void)o;
}
#endif
