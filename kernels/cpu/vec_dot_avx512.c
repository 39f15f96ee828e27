/* vec_dot_avx512.c - AVX-512 (F/BW/VL/DQ) + AVX512-VNNI kernels: the prefill panel products of 16
 * weight rows (one 32-bit lane per row) times many tokens, for Q4_0/Q5_0/Q8_0 and Q4_K/Q5_K/Q6_K,
 * the blocked attention's score and value-accumulation kernels, and LASER-KV's planes' dots.
 *
 * The only file built with the AVX-512 flags; nothing here may run before vec_dot.c has found the
 * CPU and OS support (vd_isa_active() == VD_ISA_AVX512). The panel products are the template of
 * vec_vnni_impl.h on zmm vectors. */
#include "kernels/cpu/vec_dot_impl.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)

#include <immintrin.h>

#define VN_P 16        /* rows per panel: one per 32-bit lane of a zmm */
#define VN_T 8         /* tokens per tile */
#define VN_SUFFIX avx512
#define VD_PACK_P VN_P
#include "kernels/cpu/vec_pack_impl.h"

typedef __m512i vn_i;
typedef __m512 vn_f;

static inline vn_i vn_zero_i(void) { return _mm512_setzero_si512(); }
static inline vn_f vn_zero_f(void) { return _mm512_setzero_ps(); }
static inline vn_i vn_load_i(const void *p) { return _mm512_loadu_si512(p); }
static inline vn_f vn_load_f(const void *p) { return _mm512_loadu_ps(p); }
static inline vn_f vn_set1_f(float x) { return _mm512_set1_ps(x); }
static inline vn_i vn_bcast32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}
static inline vn_i vn_dpbusd(vn_i acc, vn_i u, vn_i s) { return _mm512_dpbusd_epi32(acc, u, s); }
static inline vn_i vn_dpwssd(vn_i acc, vn_i a, vn_i b) { return _mm512_dpwssd_epi32(acc, a, b); }
static inline vn_i vn_add_i(vn_i a, vn_i b) { return _mm512_add_epi32(a, b); }
static inline vn_i vn_mullo(vn_i a, vn_i b) { return _mm512_mullo_epi32(a, b); }
static inline vn_f vn_cvt(vn_i a) { return _mm512_cvtepi32_ps(a); }
static inline vn_f vn_mul(vn_f a, vn_f b) { return _mm512_mul_ps(a, b); }
static inline vn_f vn_fmadd(vn_f a, vn_f b, vn_f c) { return _mm512_fmadd_ps(a, b, c); }
static inline vn_f vn_fnmadd(vn_f a, vn_f b, vn_f c) { return _mm512_fnmadd_ps(a, b, c); }
static inline void vn_store_rows(float *y, vn_f v, int nrows)
{
    if (nrows == VN_P)
        _mm512_storeu_ps(y, v);
    else
        _mm512_mask_storeu_ps(y, (__mmask16)((1u << nrows) - 1), v);
}

#include "kernels/cpu/vec_vnni_impl.h"

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

/* vd_plane_dots with 16 planes a vector: four vectors a pass (64 planes), then one at a time, the
 * last masked; a product, then an add (never fused: the portable twin's floats). Half the AVX2
 * version's operations a plane. */
void vd_plane_dots_avx512(int64_t n, int64_t P, const float *pt, const float *x, float *out)
{
    int64_t p = 0;
    for (; p + 64 <= P; p += 64) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < n; i++) {
            const __m512 xi = _mm512_set1_ps(x[i]);
            const float *row = pt + i * P + p;
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_loadu_ps(row), xi));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_loadu_ps(row + 16), xi));
            a2 = _mm512_add_ps(a2, _mm512_mul_ps(_mm512_loadu_ps(row + 32), xi));
            a3 = _mm512_add_ps(a3, _mm512_mul_ps(_mm512_loadu_ps(row + 48), xi));
        }
        _mm512_storeu_ps(out + p, a0);
        _mm512_storeu_ps(out + p + 16, a1);
        _mm512_storeu_ps(out + p + 32, a2);
        _mm512_storeu_ps(out + p + 48, a3);
    }
    for (; p < P; p += 16) {
        const __mmask16 m = P - p >= 16 ? 0xffff : (__mmask16)((1u << (P - p)) - 1);
        __m512 a = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i++)
            a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, pt + i * P + p), _mm512_set1_ps(x[i])));
        _mm512_mask_storeu_ps(out + p, m, a);
    }
}

/* vd_widen_transpose eight rows by eight elements at a time: the rows' floats widened, the 8 x 8
 * block transposed in registers (unpacks, then two rounds of two-source permutes), each column
 * stored whole and squared into the rows' norms in element order; the rows and elements past the
 * last whole block one by one. */
void vd_widen_transpose_avx512(int64_t rows, int64_t n, const float *x, int64_t ldx, double *out, double *norms)
{
    const __m512i lo4 = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi4 = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    const __m512i lo8 = _mm512_setr_epi64(0, 1, 2, 3, 8, 9, 10, 11), hi8 = _mm512_setr_epi64(4, 5, 6, 7, 12, 13, 14, 15);
    const int64_t r8 = rows / 8 * 8, n8 = n / 8 * 8;
    for (int64_t p = 0; p < r8; p += 8) {
        __m512d acc = _mm512_setzero_pd();
        for (int64_t i = 0; i < n8; i += 8) {
            __m512d r[8];
            for (int q = 0; q < 8; q++) r[q] = _mm512_cvtps_pd(_mm256_loadu_ps(x + (p + q) * ldx + i));
            /* pairs: elements 0 2 4 6 and 1 3 5 7 of rows (0, 1), (2, 3), ... interleaved */
            const __m512d a = _mm512_unpacklo_pd(r[0], r[1]), b = _mm512_unpackhi_pd(r[0], r[1]);
            const __m512d c = _mm512_unpacklo_pd(r[2], r[3]), d = _mm512_unpackhi_pd(r[2], r[3]);
            const __m512d e = _mm512_unpacklo_pd(r[4], r[5]), f = _mm512_unpackhi_pd(r[4], r[5]);
            const __m512d g = _mm512_unpacklo_pd(r[6], r[7]), h = _mm512_unpackhi_pd(r[6], r[7]);
            /* fours: rows 0-3 (and 4-7) of elements (0, 4), (2, 6), (1, 5), (3, 7) */
            const __m512d ac04 = _mm512_permutex2var_pd(a, lo4, c), ac26 = _mm512_permutex2var_pd(a, hi4, c);
            const __m512d bd15 = _mm512_permutex2var_pd(b, lo4, d), bd37 = _mm512_permutex2var_pd(b, hi4, d);
            const __m512d eg04 = _mm512_permutex2var_pd(e, lo4, g), eg26 = _mm512_permutex2var_pd(e, hi4, g);
            const __m512d fh15 = _mm512_permutex2var_pd(f, lo4, h), fh37 = _mm512_permutex2var_pd(f, hi4, h);
            __m512d col[8];
            col[0] = _mm512_permutex2var_pd(ac04, lo8, eg04);
            col[4] = _mm512_permutex2var_pd(ac04, hi8, eg04);
            col[2] = _mm512_permutex2var_pd(ac26, lo8, eg26);
            col[6] = _mm512_permutex2var_pd(ac26, hi8, eg26);
            col[1] = _mm512_permutex2var_pd(bd15, lo8, fh15);
            col[5] = _mm512_permutex2var_pd(bd15, hi8, fh15);
            col[3] = _mm512_permutex2var_pd(bd37, lo8, fh37);
            col[7] = _mm512_permutex2var_pd(bd37, hi8, fh37);
            for (int q = 0; q < 8; q++) {
                _mm512_storeu_pd(out + (i + q) * rows + p, col[q]);
                acc = _mm512_fmadd_pd(col[q], col[q], acc);   /* exact squares: as a product then an add */
            }
        }
        double nn[8];
        _mm512_storeu_pd(nn, acc);
        for (int q = 0; q < 8; q++) {
            const float *y = x + (p + q) * ldx;
            for (int64_t i = n8; i < n; i++) {
                const double v = (double)y[i];
                out[i * rows + p + q] = v;
                nn[q] += v * v;
            }
            norms[p + q] = nn[q];
        }
    }
    for (int64_t p = r8; p < rows; p++) {
        const float *y = x + p * ldx;
        double n2 = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const double v = (double)y[i];
            out[i * rows + p] = v;
            n2 += v * v;
        }
        norms[p] = n2;
    }
}

/* vd_cosines_f64 eight at a time, the last masked (correctly rounded in the lanes as alone). */
void vd_cosines_f64_avx512(int64_t n, const double *d, double na, const double *nb, float *out)
{
    const __m512d a = _mm512_set1_pd(na), zero = _mm512_setzero_pd();
    const int a_pos = na > 0;
    for (int64_t p = 0; p < n; p += 8) {
        const __mmask8 m = n - p >= 8 ? 0xff : (__mmask8)((1u << (n - p)) - 1);
        const __m512d b = _mm512_maskz_loadu_pd(m, nb + p);
        const __mmask8 ok = a_pos ? _mm512_mask_cmp_pd_mask(m, b, zero, _CMP_GT_OQ) : 0;
        const __m512d q = _mm512_maskz_div_pd(ok, _mm512_maskz_loadu_pd(m, d + p), _mm512_maskz_sqrt_pd(ok, _mm512_mul_pd(a, b)));
        _mm256_mask_storeu_ps(out + p, m, _mm512_cvtpd_ps(q));
    }
}

/* vd_pair_dots_f64 with 8 lanes a vector: two rows a pass over four vectors (32 vectors v_p), eight
 * sums in registers, then a vector at a time, the last masked; a row left over alone. The elements
 * are taken PD_TILE at a time for every row (the sums stored and taken up again between tiles, in
 * element order still), so that the tile of pt the rows run over stays in L1. Fused
 * multiply-adds: the products are exact (vec_dot.h), so the doubles are the plain loop's. */
void vd_pair_dots_f64_avx512(int64_t n, int64_t P, const double *pt, int64_t rows, const double *x, int64_t ldx,
                             double *out)
{
    const int64_t tile = P > 0 && VD_PAIR_TILE_DOUBLES / P > 0 ? VD_PAIR_TILE_DOUBLES / P : 1;
    if (n <= 0)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t p = 0; p < P; p++) out[r * P + p] = 0.0;
    for (int64_t i0 = 0; i0 < n; i0 += tile) {
        const int64_t i1 = i0 + tile < n ? i0 + tile : n;
        int64_t r = 0;
        for (; r + 2 <= rows; r += 2) {
            const double *x0 = x + r * ldx, *x1 = x0 + ldx;
            double *o0 = out + r * P, *o1 = o0 + P;
            int64_t p = 0;
            for (; p + 32 <= P; p += 32) {
                __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
                if (i0 > 0) {
                    a0 = _mm512_loadu_pd(o0 + p), a1 = _mm512_loadu_pd(o0 + p + 8), a2 = _mm512_loadu_pd(o0 + p + 16),
                    a3 = _mm512_loadu_pd(o0 + p + 24);
                    b0 = _mm512_loadu_pd(o1 + p), b1 = _mm512_loadu_pd(o1 + p + 8), b2 = _mm512_loadu_pd(o1 + p + 16),
                    b3 = _mm512_loadu_pd(o1 + p + 24);
                }
                for (int64_t i = i0; i < i1; i++) {
                    const double *v = pt + i * P + p;
                    const __m512d v0 = _mm512_loadu_pd(v), v1 = _mm512_loadu_pd(v + 8), v2 = _mm512_loadu_pd(v + 16),
                                  v3 = _mm512_loadu_pd(v + 24);
                    const __m512d s0 = _mm512_set1_pd(x0[i]), s1 = _mm512_set1_pd(x1[i]);
                    a0 = _mm512_fmadd_pd(v0, s0, a0);
                    a1 = _mm512_fmadd_pd(v1, s0, a1);
                    a2 = _mm512_fmadd_pd(v2, s0, a2);
                    a3 = _mm512_fmadd_pd(v3, s0, a3);
                    b0 = _mm512_fmadd_pd(v0, s1, b0);
                    b1 = _mm512_fmadd_pd(v1, s1, b1);
                    b2 = _mm512_fmadd_pd(v2, s1, b2);
                    b3 = _mm512_fmadd_pd(v3, s1, b3);
                }
                _mm512_storeu_pd(o0 + p, a0);
                _mm512_storeu_pd(o0 + p + 8, a1);
                _mm512_storeu_pd(o0 + p + 16, a2);
                _mm512_storeu_pd(o0 + p + 24, a3);
                _mm512_storeu_pd(o1 + p, b0);
                _mm512_storeu_pd(o1 + p + 8, b1);
                _mm512_storeu_pd(o1 + p + 16, b2);
                _mm512_storeu_pd(o1 + p + 24, b3);
            }
            for (; p < P; p += 8) {
                const __mmask8 m = P - p >= 8 ? 0xff : (__mmask8)((1u << (P - p)) - 1);
                __m512d a0 = _mm512_setzero_pd(), b0 = a0;
                if (i0 > 0) a0 = _mm512_maskz_loadu_pd(m, o0 + p), b0 = _mm512_maskz_loadu_pd(m, o1 + p);
                for (int64_t i = i0; i < i1; i++) {
                    const __m512d v0 = _mm512_maskz_loadu_pd(m, pt + i * P + p);
                    a0 = _mm512_fmadd_pd(v0, _mm512_set1_pd(x0[i]), a0);
                    b0 = _mm512_fmadd_pd(v0, _mm512_set1_pd(x1[i]), b0);
                }
                _mm512_mask_storeu_pd(o0 + p, m, a0);
                _mm512_mask_storeu_pd(o1 + p, m, b0);
            }
        }
        for (; r < rows; r++) {
            const double *x0 = x + r * ldx;
            double *o0 = out + r * P;
            for (int64_t p = 0; p < P; p += 8) {
                const __mmask8 m = P - p >= 8 ? 0xff : (__mmask8)((1u << (P - p)) - 1);
                __m512d a0 = i0 > 0 ? _mm512_maskz_loadu_pd(m, o0 + p) : _mm512_setzero_pd();
                for (int64_t i = i0; i < i1; i++)
                    a0 = _mm512_fmadd_pd(_mm512_maskz_loadu_pd(m, pt + i * P + p), _mm512_set1_pd(x0[i]), a0);
                _mm512_mask_storeu_pd(o0 + p, m, a0);
            }
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
void vd_plane_dots_avx512(int64_t n, int64_t P, const float *pt, const float *x, float *out)
{
    (void)n, (void)P, (void)pt, (void)x, (void)out;
}
void vd_cosines_f64_avx512(int64_t n, const double *d, double na, const double *nb, float *out)
{
    (void)n, (void)d, (void)na, (void)nb, (void)out;
}
void vd_widen_transpose_avx512(int64_t rows, int64_t n, const float *x, int64_t ldx, double *out, double *norms)
{
    (void)rows, (void)n, (void)x, (void)ldx, (void)out, (void)norms;
}
void vd_pair_dots_f64_avx512(int64_t n, int64_t P, const double *pt, int64_t rows, const double *x, int64_t ldx,
                             double *out)
{
    (void)n, (void)P, (void)pt, (void)rows, (void)x, (void)ldx, (void)out;
}
#endif
