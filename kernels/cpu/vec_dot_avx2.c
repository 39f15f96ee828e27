/* vec_dot_avx2.c - AVX2/FMA/F16C kernels: fused weight x activation dot products for the weight
 * types without panel kernels (F32, F16, BF16, Q4_1, Q5_1), the activation quantizers, the f32
 * dot/axpy helpers, the prefill panel products (8 rows a panel), the decode rows kernels with the
 * panel kernels' bits, the blocked attention's score and accumulation kernels, exp, GELU/SiLU and
 * the RMS norm's sums.
 *
 * The only file built with -mavx2 -mfma -mf16c. Nothing here may run before vec_dot.c has checked
 * the CPU. Every kernel here gives the bits of its portable twin in vec_dot.c: the same integer
 * block sums, and the same f32 operations in the same order (the twins keep these lanes and fused
 * multiply-adds), so a result never depends on the instruction set. A change to the order of
 * operations here is a change to the twin too (tests: kernels/every_isa_gives_the_portable_bits,
 * forward/every_isa_gives_the_portable_logits). */
#include "kernels/cpu/vec_dot_impl.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <math.h>

#include "kernels/cpu/vec_bits_avx2.h"

/* ------------------------------------------------------------------ helpers */

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline float hsum_ps(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static inline float hsum_ps128(__m128 x)
{
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static inline int hsum_epi32(__m256i v)
{
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1));
    return _mm_cvtsi128_si32(x);
}

static inline __m256i ones16(void) { return _mm256_set1_epi16(1); }

/* Software prefetch distance, in bytes ahead of the weight block being read. Weight rows are read
 * once, front to back, and consecutive rows are contiguous, so this streams the matrix; measured
 * on the target (Zen 3, 2 cores) it adds 5-25% on matrices larger than the L3 cache and costs
 * nothing on cached ones. Prefetches never fault, so running past the end is harmless. */
#define VD_PREFETCH_BYTES 2048

/* __builtin_prefetch, not _mm_prefetch: gcc 12 silently drops _mm_prefetch once its caller is
 * inlined into an always_inline function (block_loop below). */
static inline void prefetch_line(const void *p, int line)
{
    __builtin_prefetch((const char *)p + VD_PREFETCH_BYTES + 64 * line);
}

/* ------------------------------------------------------------------ f32 / f16 / bf16 */

float vd_dot_f32_avx2(int64_t n, const float *a, const float *b)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    if (i < n) {
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s1);
    }
    return hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

float vd_dot_f32_f16_avx2(int64_t n, const float *a, const uint16_t *b)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i))), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8),
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i + 8))), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i))), s0);
    float s = hsum_ps(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s = fmaf(a[i], h2f(b[i]), s);   /* fused like the vector part (and the portable loop) */
    return s;
}

void vd_axpy_f16_avx2(int64_t n, float a, const uint16_t *x, float *y)
{
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++) y[i] = fmaf(a, h2f(x[i]), y[i]);
}

void vd_f32_to_f16_avx2(int64_t n, const float *x, uint16_t *y)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

void vd_bits_overlap_avx2(int64_t words, const uint64_t *now, uint64_t *last, int64_t *set, int64_t *shared)
{
    vd_bits_overlap_loop(words, now, last, set, shared);
}

/* _mm256_min_ps(a, b) is a < b ? a : b lane by lane and max a > b ? a : b: the portable fold's
 * comparisons, NaN and signed zeros included. */
void vd_key_summary_avx2(int64_t n, int64_t rows, const uint16_t *k, int64_t stride, float *sum, float *mn, float *mx)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {   /* 8 elements' summary in registers through every row */
        __m256 s = _mm256_loadu_ps(sum + i), lo = _mm256_loadu_ps(mn + i), hi = _mm256_loadu_ps(mx + i);
        for (int64_t r = 0; r < rows; r++) {
            __m256 t = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + r * stride + i)));
            s = _mm256_add_ps(s, t);
            lo = _mm256_min_ps(t, lo);
            hi = _mm256_max_ps(t, hi);
        }
        _mm256_storeu_ps(sum + i, s);
        _mm256_storeu_ps(mn + i, lo);
        _mm256_storeu_ps(mx + i, hi);
    }
    for (; i < n; i++)
        for (int64_t r = 0; r < rows; r++) {
            float t = _cvtsh_ss(k[r * stride + i]);
            sum[i] += t;
            mn[i] = t < mn[i] ? t : mn[i];
            mx[i] = t > mx[i] ? t : mx[i];
        }
}

float vd_bound_f32_avx2(int64_t n, const float *q, const float *lo, const float *hi)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 q0 = _mm256_loadu_ps(q + i), q1 = _mm256_loadu_ps(q + i + 8);
        s0 = _mm256_add_ps(s0, _mm256_max_ps(_mm256_mul_ps(q0, _mm256_loadu_ps(lo + i)),
                                             _mm256_mul_ps(q0, _mm256_loadu_ps(hi + i))));
        s1 = _mm256_add_ps(s1, _mm256_max_ps(_mm256_mul_ps(q1, _mm256_loadu_ps(lo + i + 8)),
                                             _mm256_mul_ps(q1, _mm256_loadu_ps(hi + i + 8))));
    }
    float s = hsum_ps(_mm256_add_ps(s0, s1));
    for (; i < n; i++) {
        float a = q[i] * lo[i], b = q[i] * hi[i];
        s += a > b ? a : b;
    }
    return s;
}

/* Four vectors of planes a pass (32 lanes), x[i] broadcast: a product, then an add (never fused:
 * the portable twin's floats). Bound by the adders' and multipliers' throughput at the 7B shape
 * (eight vectors a pass measured the same). */
void vd_plane_dots_avx2(int64_t n, int64_t P, const float *pt, const float *x, float *out)
{
    int64_t p = 0;
    for (; p + 32 <= P; p += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < n; i++) {
            const __m256 xi = _mm256_set1_ps(x[i]);
            const float *row = pt + i * P + p;
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(row), xi));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_loadu_ps(row + 8), xi));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(_mm256_loadu_ps(row + 16), xi));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(_mm256_loadu_ps(row + 24), xi));
        }
        _mm256_storeu_ps(out + p, a0);
        _mm256_storeu_ps(out + p + 8, a1);
        _mm256_storeu_ps(out + p + 16, a2);
        _mm256_storeu_ps(out + p + 24, a3);
    }
    for (; p + 8 <= P; p += 8) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t i = 0; i < n; i++) a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(pt + i * P + p), _mm256_set1_ps(x[i])));
        _mm256_storeu_ps(out + p, a);
    }
    for (; p < P; p++) {
        float a = 0.0f;
        for (int64_t i = 0; i < n; i++) a += pt[i * P + p] * x[i];
        out[p] = a;
    }
}

/* vd_cosines_f64 four at a time: the square root and the division are correctly rounded in the
 * lanes as in scalar code, and the conversion to float rounds to nearest as a cast does. */
void vd_cosines_f64_avx2(int64_t n, const double *d, double na, const double *nb, float *out)
{
    const __m256d a = _mm256_set1_pd(na), zero = _mm256_setzero_pd();
    const int a_pos = na > 0;
    int64_t p = 0;
    for (; p + 4 <= n; p += 4) {
        const __m256d b = _mm256_loadu_pd(nb + p);
        const __m256d q = _mm256_div_pd(_mm256_loadu_pd(d + p), _mm256_sqrt_pd(_mm256_mul_pd(a, b)));
        const __m256d ok = _mm256_cmp_pd(b, zero, _CMP_GT_OQ);
        const __m128 f = _mm256_cvtpd_ps(_mm256_and_pd(q, ok));
        _mm_storeu_ps(out + p, a_pos ? f : _mm_setzero_ps());
    }
    for (; p < n; p++) out[p] = a_pos && nb[p] > 0 ? (float)(d[p] / sqrt(na * nb[p])) : 0.0f;
}

/* Two rows a pass over four vectors of lanes (16 vectors v_p), eight sums in registers, then one
 * vector, then lane by lane; a row left over alone; the elements a tile at a time, as the AVX-512
 * version takes them. Fused multiply-adds: the products are exact (vec_dot.h), so the doubles are
 * the plain loop's. */
void vd_pair_dots_f64_avx2(int64_t n, int64_t P, const double *pt, int64_t rows, const double *x, int64_t ldx,
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
            for (; p + 16 <= P; p += 16) {
                __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
                if (i0 > 0) {
                    a0 = _mm256_loadu_pd(o0 + p), a1 = _mm256_loadu_pd(o0 + p + 4), a2 = _mm256_loadu_pd(o0 + p + 8),
                    a3 = _mm256_loadu_pd(o0 + p + 12);
                    b0 = _mm256_loadu_pd(o1 + p), b1 = _mm256_loadu_pd(o1 + p + 4), b2 = _mm256_loadu_pd(o1 + p + 8),
                    b3 = _mm256_loadu_pd(o1 + p + 12);
                }
                for (int64_t i = i0; i < i1; i++) {
                    const double *v = pt + i * P + p;
                    const __m256d v0 = _mm256_loadu_pd(v), v1 = _mm256_loadu_pd(v + 4), v2 = _mm256_loadu_pd(v + 8),
                                  v3 = _mm256_loadu_pd(v + 12);
                    const __m256d s0 = _mm256_broadcast_sd(x0 + i), s1 = _mm256_broadcast_sd(x1 + i);
                    a0 = _mm256_fmadd_pd(v0, s0, a0);
                    a1 = _mm256_fmadd_pd(v1, s0, a1);
                    a2 = _mm256_fmadd_pd(v2, s0, a2);
                    a3 = _mm256_fmadd_pd(v3, s0, a3);
                    b0 = _mm256_fmadd_pd(v0, s1, b0);
                    b1 = _mm256_fmadd_pd(v1, s1, b1);
                    b2 = _mm256_fmadd_pd(v2, s1, b2);
                    b3 = _mm256_fmadd_pd(v3, s1, b3);
                }
                _mm256_storeu_pd(o0 + p, a0);
                _mm256_storeu_pd(o0 + p + 4, a1);
                _mm256_storeu_pd(o0 + p + 8, a2);
                _mm256_storeu_pd(o0 + p + 12, a3);
                _mm256_storeu_pd(o1 + p, b0);
                _mm256_storeu_pd(o1 + p + 4, b1);
                _mm256_storeu_pd(o1 + p + 8, b2);
                _mm256_storeu_pd(o1 + p + 12, b3);
            }
            for (; p + 4 <= P; p += 4) {
                __m256d a0 = _mm256_setzero_pd(), b0 = a0;
                if (i0 > 0) a0 = _mm256_loadu_pd(o0 + p), b0 = _mm256_loadu_pd(o1 + p);
                for (int64_t i = i0; i < i1; i++) {
                    const __m256d v0 = _mm256_loadu_pd(pt + i * P + p);
                    a0 = _mm256_fmadd_pd(v0, _mm256_broadcast_sd(x0 + i), a0);
                    b0 = _mm256_fmadd_pd(v0, _mm256_broadcast_sd(x1 + i), b0);
                }
                _mm256_storeu_pd(o0 + p, a0);
                _mm256_storeu_pd(o1 + p, b0);
            }
            for (; p < P; p++) {
                double a0 = i0 > 0 ? o0[p] : 0.0, b0 = i0 > 0 ? o1[p] : 0.0;
                for (int64_t i = i0; i < i1; i++) {
                    a0 += x0[i] * pt[i * P + p];
                    b0 += x1[i] * pt[i * P + p];
                }
                o0[p] = a0;
                o1[p] = b0;
            }
        }
        for (; r < rows; r++) {
            const double *x0 = x + r * ldx;
            double *o0 = out + r * P;
            int64_t p = 0;
            for (; p + 4 <= P; p += 4) {
                __m256d a0 = i0 > 0 ? _mm256_loadu_pd(o0 + p) : _mm256_setzero_pd();
                for (int64_t i = i0; i < i1; i++)
                    a0 = _mm256_fmadd_pd(_mm256_loadu_pd(pt + i * P + p), _mm256_broadcast_sd(x0 + i), a0);
                _mm256_storeu_pd(o0 + p, a0);
            }
            for (; p < P; p++) {
                double a0 = i0 > 0 ? o0[p] : 0.0;
                for (int64_t i = i0; i < i1; i++) a0 += x0[i] * pt[i * P + p];
                o0[p] = a0;
            }
        }
    }
}

void vd_axpy_f32_avx2(int64_t n, float a, const float *x, float *y)
{
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 y0 = _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i));
        __m256 y1 = _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8));
        _mm256_storeu_ps(y + i, y0);
        _mm256_storeu_ps(y + i + 8, y1);
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) {
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 r = _mm256_fmadd_ps(va, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m));
        _mm256_maskstore_ps(y + i, m, r);
    }
}

void vd_dot_f32_f32_avx2(int64_t n, float *s, const void *w, const void *a)
{
    *s = vd_dot_f32_avx2(n, w, a);
}

static inline __m256 load_f16x8(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

void vd_dot_f16_f16_avx2(int64_t n, float *s, const void *vw, const void *va)
{
    const uint16_t *w = vw, *a = va;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        prefetch_line(w + i, 0);
        s0 = _mm256_fmadd_ps(load_f16x8(w + i), load_f16x8(a + i), s0);
        s1 = _mm256_fmadd_ps(load_f16x8(w + i + 8), load_f16x8(a + i + 8), s1);
        s2 = _mm256_fmadd_ps(load_f16x8(w + i + 16), load_f16x8(a + i + 16), s2);
        s3 = _mm256_fmadd_ps(load_f16x8(w + i + 24), load_f16x8(a + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load_f16x8(w + i), load_f16x8(a + i), s0);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) sum = fmaf(h2f(w[i]), h2f(a[i]), sum);
    *s = sum;
}

static inline __m256 load_bf16x8(const uint16_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

void vd_dot_bf16_bf16_avx2(int64_t n, float *s, const void *vw, const void *va)
{
    const uint16_t *w = vw, *a = va;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        prefetch_line(w + i, 0);
        s0 = _mm256_fmadd_ps(load_bf16x8(w + i), load_bf16x8(a + i), s0);
        s1 = _mm256_fmadd_ps(load_bf16x8(w + i + 8), load_bf16x8(a + i + 8), s1);
        s2 = _mm256_fmadd_ps(load_bf16x8(w + i + 16), load_bf16x8(a + i + 16), s2);
        s3 = _mm256_fmadd_ps(load_bf16x8(w + i + 24), load_bf16x8(a + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load_bf16x8(w + i), load_bf16x8(a + i), s0);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) {
        uint32_t wb = (uint32_t)w[i] << 16, ab = (uint32_t)a[i] << 16;
        float wf, af;
        memcpy(&wf, &wb, 4);
        memcpy(&af, &ab, 4);
        sum = fmaf(wf, af, sum);
    }
    *s = sum;
}

/* ------------------------------------------------------------------ 32-element block kernels */

static inline uint16_t ld16(const void *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Products of the fp16 fields of 4 consecutive weight and activation blocks (w/a point at the field
 * of the first block; wsize/asize are the block sizes), as 4 floats duplicated into both lanes.
 * The halves are gathered in general-purpose registers (idle in these kernels) and converted with
 * one vcvtph2ps: a fraction of the vector work of converting each scale on its own (+8% on Q5_0). */
static inline __m256 scale_products4(const char *w, size_t wsize, const char *a, size_t asize)
{
    uint64_t hw = (uint64_t)ld16(w) | ((uint64_t)ld16(w + wsize) << 16) |
                  ((uint64_t)ld16(w + 2 * wsize) << 32) | ((uint64_t)ld16(w + 3 * wsize) << 48);
    uint64_t ha = (uint64_t)ld16(a) | ((uint64_t)ld16(a + asize) << 16) |
                  ((uint64_t)ld16(a + 2 * asize) << 32) | ((uint64_t)ld16(a + 3 * asize) << 48);
    __m256 f = _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm_cvtsi64_si128((long long)hw), _mm_cvtsi64_si128((long long)ha)));
    __m128 p = _mm_mul_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(p), p, 1);
}

/* Element k (0..3) of a scale_products4 result in all 8 lanes. */
static inline __m256 splat4(__m256 dd, int k)
{
    switch (k) {
    case 0: return _mm256_shuffle_ps(dd, dd, 0x00);
    case 1: return _mm256_shuffle_ps(dd, dd, 0x55);
    case 2: return _mm256_shuffle_ps(dd, dd, 0xaa);
    default: return _mm256_shuffle_ps(dd, dd, 0xff);
    }
}

/* One block's 8 int32 partial sums of q_w * q_a. */
typedef __m256i (*block_fn)(const void *w, const void *a);

/* The loop of the 32-element formats' one-row kernels (Q4_1, Q5_1): sum over blocks of d_w * d_a * block(w_i, a_i),
 * d being the fp16 at offset 0 of both block types, in two f32 accumulators. Four blocks per step
 * share one scale conversion; a tail of 1-3 blocks converts its scales one by one. Always inlined
 * with a constant `block`, so each kernel compiles to straight-line code (no indirect calls). */
static inline __attribute__((always_inline)) __m256 block_loop(int64_t nb, const void *vw, size_t wsize,
                                                               const void *va, size_t asize, block_fn block)
{
    const char *w = vw, *a = va;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4, w += 4 * wsize, a += 4 * asize) {
        prefetch_line(w, 0);   /* 4 blocks are 72-136 bytes */
        prefetch_line(w, 1);
        __m256 dd = scale_products4(w, wsize, a, asize);
        acc0 = _mm256_fmadd_ps(splat4(dd, 0), _mm256_cvtepi32_ps(block(w, a)), acc0);
        acc1 = _mm256_fmadd_ps(splat4(dd, 1), _mm256_cvtepi32_ps(block(w + wsize, a + asize)), acc1);
        acc0 = _mm256_fmadd_ps(splat4(dd, 2), _mm256_cvtepi32_ps(block(w + 2 * wsize, a + 2 * asize)), acc0);
        acc1 = _mm256_fmadd_ps(splat4(dd, 3), _mm256_cvtepi32_ps(block(w + 3 * wsize, a + 3 * asize)), acc1);
    }
    for (; i < nb; i++, w += wsize, a += asize)
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(ld16(w)) * h2f(ld16(a))), _mm256_cvtepi32_ps(block(w, a)), acc0);
    return _mm256_add_ps(acc0, acc1);
}

/* Q8_0: signed x signed. maddubs wants an unsigned first operand, so move the sign of x onto y;
 * needs y != -128, which the quantizer guarantees (q in [-127, 127]). Pair sums are at most
 * 2 * 128 * 127 < 2^15: no int16 saturation. */
static inline __m256i q8_0_block(const void *vw, const void *va)
{
    const vd_blk_q8_0 *w = vw, *a = va;
    __m256i x = _mm256_loadu_si256((const __m256i *)w->qs);
    __m256i y = _mm256_loadu_si256((const __m256i *)a->qs);
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_madd_epi16(p, ones16());
}

/* Q4_0: sum (q - 8) * y = sum q*y - 8 * sum y, both as unsigned-by-signed maddubs (pair sums at
 * most 2*15*128 and 2*8*128). */
static inline __m256i q4_0_block(const void *vw, const void *va)
{
    const vd_blk_q4_0 *w = vw;
    const vd_blk_q8_0 *a = va;
    __m256i q = unpack_nibbles16(w->qs);
    __m256i y = _mm256_loadu_si256((const __m256i *)a->qs);
    __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(_mm256_set1_epi8(8), y));
    return _mm256_madd_epi16(p, ones16());
}

/* Q5_0: q = nibble | (bit << 4), value q - 16; same offset trick with 16 (pairs <= 2*31*128). */
static inline __m256i q5_0_block(const void *vw, const void *va)
{
    const vd_blk_q5_0 *w = vw;
    const vd_blk_q8_0 *a = va;
    __m256i q = _mm256_or_si256(unpack_nibbles16(w->qs),
                                _mm256_and_si256(expand_bits32(w->qh), _mm256_set1_epi8(0x10)));
    __m256i y = _mm256_loadu_si256((const __m256i *)a->qs);
    __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(_mm256_set1_epi8(16), y));
    return _mm256_madd_epi16(p, ones16());
}

/* Q4_1 / Q5_1 against Q8_1: d_w*d_a * sum(q*y) + m_w * s_a with q unsigned (pairs <= 2*31*128);
 * the m*s terms are summed by ms_sum. */
static inline __m256i q4_1_block(const void *vw, const void *va)
{
    const vd_blk_q4_1 *w = vw;
    const vd_blk_q8_1 *a = va;
    __m256i p = _mm256_maddubs_epi16(unpack_nibbles16(w->qs), _mm256_loadu_si256((const __m256i *)a->qs));
    return _mm256_madd_epi16(p, ones16());
}

static inline __m256i q5_1_block(const void *vw, const void *va)
{
    const vd_blk_q5_1 *w = vw;
    const vd_blk_q8_1 *a = va;
    __m256i q = _mm256_or_si256(unpack_nibbles16(w->qs),
                                _mm256_and_si256(expand_bits32(w->qh), _mm256_set1_epi8(0x10)));
    __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)a->qs));
    return _mm256_madd_epi16(p, ones16());
}

/* sum over blocks of m_w * s_a (Q4_1/Q5_1 blocks start {d, m}, Q8_1 blocks {d, s}) */
static inline float ms_sum(int64_t nb, const void *vw, size_t wsize, const void *va)
{
    const char *w = (const char *)vw + 2, *a = (const char *)va + 2;
    const size_t asize = sizeof(vd_blk_q8_1);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4, w += 4 * wsize, a += 4 * asize)
        acc = _mm256_add_ps(acc, scale_products4(w, wsize, a, asize));
    float sum = hsum_ps128(_mm256_castps256_ps128(acc));   /* both lanes hold the same products */
    for (; i < nb; i++, w += wsize, a += asize) {
        float p = h2f(ld16(w)) * h2f(ld16(a));   /* rounded, then added (never fused): the portable twin's order */
        sum += p;
    }
    return sum;
}

void vd_dot_q4_1_q8_1_avx2(int64_t n, float *s, const void *vw, const void *va)
{
    __m256 acc = block_loop(n / 32, vw, sizeof(vd_blk_q4_1), va, sizeof(vd_blk_q8_1), q4_1_block);
    *s = hsum_ps(acc) + ms_sum(n / 32, vw, sizeof(vd_blk_q4_1), va);
}

void vd_dot_q5_1_q8_1_avx2(int64_t n, float *s, const void *vw, const void *va)
{
    __m256 acc = block_loop(n / 32, vw, sizeof(vd_blk_q5_1), va, sizeof(vd_blk_q8_1), q5_1_block);
    *s = hsum_ps(acc) + ms_sum(n / 32, vw, sizeof(vd_blk_q5_1), va);
}

/* ------------------------------------------------------------------ K-quants (256-element blocks) */

/* pshufb masks. BCAST16[j] copies int16 element j of each 128-bit lane to the whole lane;
 * BCAST16_PAIR[p] copies element 2p to the low lane and 2p+1 to the high lane (Q6_K, whose 32-byte
 * groups span two sub-blocks of 16). Tables, so the shuffles take them as memory operands. */
#define VD_B2(j) 2 * (j), 2 * (j) + 1
#define VD_B16(j) VD_B2(j), VD_B2(j), VD_B2(j), VD_B2(j), VD_B2(j), VD_B2(j), VD_B2(j), VD_B2(j)
#define VD_B8(j) VD_B2(j), VD_B2(j), VD_B2(j), VD_B2(j)
static const int8_t BCAST16[8][32] __attribute__((aligned(32))) = {
    { VD_B16(0), VD_B16(0) }, { VD_B16(1), VD_B16(1) }, { VD_B16(2), VD_B16(2) }, { VD_B16(3), VD_B16(3) },
    { VD_B16(4), VD_B16(4) }, { VD_B16(5), VD_B16(5) }, { VD_B16(6), VD_B16(6) }, { VD_B16(7), VD_B16(7) },
};
static const int8_t BCAST16_PAIR[4][32] __attribute__((aligned(32))) = {
    { VD_B8(0), VD_B8(0), VD_B8(1), VD_B8(1) }, { VD_B8(2), VD_B8(2), VD_B8(3), VD_B8(3) },
    { VD_B8(4), VD_B8(4), VD_B8(5), VD_B8(5) }, { VD_B8(6), VD_B8(6), VD_B8(7), VD_B8(7) },
};

static inline __m256i bcast_scale(__m256i sc, const int8_t *mask)
{
    return _mm256_shuffle_epi8(sc, _mm256_load_si256((const __m256i *)mask));
}

/* The per-super-block parts shared by Q4_K and Q5_K: scales as 8 int16 in both lanes, and the
 * min correction sum_j mn[j] * (bsums[2j] + bsums[2j+1]) as 4 int32 (<= 8*63*4064: no overflow). */
static inline __m128i k_mins_dot(const uint8_t *scales, const int16_t *bsums, __m256i *sc_out)
{
    uint32_t u[4];
    vd_k_scales(scales, u);
    __m128i b8 = _mm_unpacklo_epi64(_mm_cvtsi64_si128((long long)(u[0] | ((uint64_t)u[1] << 32))),
                                    _mm_cvtsi64_si128((long long)(u[2] | ((uint64_t)u[3] << 32))));
    __m256i sm = _mm256_cvtepu8_epi16(b8);
    __m128i mins = _mm256_extracti128_si256(sm, 1);
    *sc_out = _mm256_permute2x128_si256(sm, sm, 0x00);
    __m128i b0 = _mm_loadu_si128((const __m128i *)bsums);
    __m128i b1 = _mm_loadu_si128((const __m128i *)(bsums + 8));
    return _mm_madd_epi16(mins, _mm_hadd_epi16(b0, b1));
}

/* One 32-byte chunk c of a Q4_K/Q5_K super-block: lo/hi are the 32 quants of sub-blocks 2c and
 * 2c+1 (unsigned, <= 31), y the 64 matching activations. Pairs <= 2*31*128 < 2^15, then scaled by
 * the 6-bit scales in madd. */
static inline __m256i k_chunk(__m256i lo, __m256i hi, const int8_t *y, __m256i sc, int c)
{
    __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)y));
    __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y + 32)));
    return _mm256_add_epi32(_mm256_madd_epi16(p0, bcast_scale(sc, BCAST16[2 * c])),
                            _mm256_madd_epi16(p1, bcast_scale(sc, BCAST16[2 * c + 1])));
}

static inline __m256i q4k_chunk(const vd_blk_q4_k *w, const vd_blk_q8_k *a, __m256i sc, int c)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i qb = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * c));
    return k_chunk(_mm256_and_si256(qb, m4), _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4), a->qs + 64 * c, sc, c);
}

/* Q5_K chunk c: bit 2c of qh[l] is the fifth bit of the low-nibble element, bit 2c+1 of the
 * high-nibble one. 16-bit shifts move them to bit 4 of the same byte (no bit crosses a byte). */
static inline __m256i q5k_chunk(const vd_blk_q5_k *w, const vd_blk_q8_k *a, __m256i sc, __m256i qh, int c)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    __m256i qb = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * c));
    __m256i h0, h1;
    switch (c) {   /* constant after inlining: shift bit 2c (and 2c+1) to bit 4 */
    case 0: h0 = _mm256_slli_epi16(qh, 4); h1 = _mm256_slli_epi16(qh, 3); break;
    case 1: h0 = _mm256_slli_epi16(qh, 2); h1 = _mm256_slli_epi16(qh, 1); break;
    case 2: h0 = qh; h1 = _mm256_srli_epi16(qh, 1); break;
    default: h0 = _mm256_srli_epi16(qh, 2); h1 = _mm256_srli_epi16(qh, 3); break;
    }
    __m256i lo = _mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_and_si256(h0, b4));
    __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4), _mm256_and_si256(h1, b4));
    return k_chunk(lo, hi, a->qs + 64 * c, sc, c);
}

/* Q6_K: sum_k S[k] * sum(q*y) over sub-blocks of 16 with q unsigned (0..63), minus the offset
 * 32 * sum_k S[k] * bsums[k] taken from the activation's block sums; all exact in int32
 * (|total| <= 256*63*128*128 + 32*16*128*2048 < 2^31). One half h = 128 elements. */
static inline __m256i q6k_half(const vd_blk_q6_k *w, const vd_blk_q8_k *a, __m128i sc8, int h)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_srli_si128(sc8, 8) : sc8));
    __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * h));
    __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * h + 32));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(w->qh + 32 * h));
    __m256i q0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
    __m256i q1 = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
    __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
    __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                 _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
    const int8_t *y = a->qs + 128 * h;
    /* pairs <= 2*63*128 < 2^15 */
    __m256i p0 = _mm256_maddubs_epi16(q0, _mm256_loadu_si256((const __m256i *)y));
    __m256i p1 = _mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)(y + 32)));
    __m256i p2 = _mm256_maddubs_epi16(q2, _mm256_loadu_si256((const __m256i *)(y + 64)));
    __m256i p3 = _mm256_maddubs_epi16(q3, _mm256_loadu_si256((const __m256i *)(y + 96)));
    __m256i s01 = _mm256_add_epi32(_mm256_madd_epi16(p0, bcast_scale(sc, BCAST16_PAIR[0])),
                                   _mm256_madd_epi16(p1, bcast_scale(sc, BCAST16_PAIR[1])));
    __m256i s23 = _mm256_add_epi32(_mm256_madd_epi16(p2, bcast_scale(sc, BCAST16_PAIR[2])),
                                   _mm256_madd_epi16(p3, bcast_scale(sc, BCAST16_PAIR[3])));
    return _mm256_add_epi32(s01, s23);
}

/* ------------------------------------------------------------------ activation quantizers */

static inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

static inline float hmax_ps(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* 32 floats times id -> 32 int8 in element order, rounded to nearest even, clamped to [-127, 127]
 * (the same rule as vd_nearest_int + clamp in the scalar path). */
static inline __m256i quant32(const float *x, __m256 id)
{
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
    /* packs work per 128-bit lane: dword k of the result holds 4 values from i(k%4), lane k/4 */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    return _mm256_max_epi8(p, _mm256_set1_epi8(-127));
}

static inline float amax32(const float *x)
{
    __m256 m = _mm256_max_ps(_mm256_max_ps(abs_ps(_mm256_loadu_ps(x)), abs_ps(_mm256_loadu_ps(x + 8))),
                             _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + 16)), abs_ps(_mm256_loadu_ps(x + 24))));
    return hmax_ps(m);
}

void vd_quantize_q8_0_avx2(const float *x, void *dst, int64_t n)
{
    vd_blk_q8_0 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float d = amax32(x) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        _mm256_storeu_si256((__m256i *)y[i].qs, quant32(x, _mm256_set1_ps(id)));
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    }
}

void vd_quantize_q8_1_avx2(const float *x, void *dst, int64_t n)
{
    vd_blk_q8_1 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float d = amax32(x) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256i q = quant32(x, _mm256_set1_ps(id));
        _mm256_storeu_si256((__m256i *)y[i].qs, q);
        int sum = hsum_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), ones16()));
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        y[i].s = _cvtss_sh(d * (float)sum, _MM_FROUND_TO_NEAREST_INT);
    }
}

void vd_quantize_q8_k_avx2(const float *x, void *dst, int64_t n)
{
    vd_blk_q8_k *y = dst;
    const __m256i one8 = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < n / 256; i++, x += 256) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 256; j += 8) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + j)));
        float d = hmax_ps(m) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        /* g[k]: lane 0 holds 4 partial sums of q[32k .. 32k+15], lane 1 of q[32k+16 .. 32k+31] */
        __m256i g[8];
        for (int k = 0; k < 8; k++) {
            __m256i q = quant32(x + 32 * k, vid);
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * k), q);
            g[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(one8, q), ones16());
        }
        /* Reduce each lane of each g[k] to one sum: lane 0 of h0 = [g0a g1a g2a g3a], lane 1 =
         * [g0b g1b g2b g3b]; then pack, and interleave the lanes back to bsums order. */
        __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(g[0], g[1]), _mm256_hadd_epi32(g[2], g[3]));
        __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(g[4], g[5]), _mm256_hadd_epi32(g[6], g[7]));
        __m256i p = _mm256_packs_epi32(h0, h1);
        __m128i plo = _mm256_castsi256_si128(p), phi = _mm256_extracti128_si256(p, 1);
        _mm_storeu_si128((__m128i *)y[i].bsums, _mm_unpacklo_epi16(plo, phi));
        _mm_storeu_si128((__m128i *)(y[i].bsums + 8), _mm_unpackhi_epi16(plo, phi));
        y[i].d = d;
    }
}

void vd_quantize_f16_avx2(const float *x, void *dst, int64_t n)
{
    uint16_t *y = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

void vd_quantize_bf16_avx2(const float *x, void *dst, int64_t n)
{
    uint16_t *y = dst;
    const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i quiet = _mm256_set1_epi32(0x40);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int k = 0; k < 2; k++) {
            __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i + 8 * k));
            __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
            __m256i hi = _mm256_srli_epi32(u, 16);
            __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
            r[k] = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), isnan);
        }
        /* values are <= 0xffff, so the unsigned-saturating pack is exact; fix the lane order */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
        _mm256_storeu_si256((__m256i *)(y + i), p);
    }
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        y[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u
                                                          : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

#else
/* Not x86-64: vec_dot.c references none of these there. (On x86-64 the Makefile always builds this
 * file with -mavx2 -mfma -mf16c; without them the link fails loudly, which is intended.) */
typedef int vd_avx2_unavailable;
#endif

/* ------------------------------------------------------------------ element-wise math */

/* e^x for 8 floats: range reduction x = k ln2 + r (|r| <= ln2/2, ln2 split in two parts for exactness),
 * degree-6 polynomial for e^r (relative error ~1e-7), scaling by 2^k through the exponent bits.
 * Results down through the subnormal range (2^k applied in two halves); inputs below -104 give 0,
 * above 88.7228317 +inf; NaN stays NaN. */
static inline __m256 exp256(__m256 x)
{
    /* hi: the largest float whose e^x is finite (88.7228317f); above it +inf */
    const __m256 hi = _mm256_set1_ps(88.7228317f), lo = _mm256_set1_ps(-104.0f);
    __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 k = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^k in two steps so k = 128 (x near 88.7) does not overflow the exponent field */
    __m256i ki = _mm256_cvtps_epi32(k);
    __m256i k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, _mm256_set1_epi32(127)), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), over);
    y = _mm256_andnot_ps(under, y);
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  /* NaN in, NaN out */
}

void vd_exp_avx2(int64_t n, const float *x, float *y)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp256(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float tx[8] = { 0 }, ty[8];
        memcpy(tx, x + i, sizeof(float) * (size_t)(n - i));
        _mm256_storeu_ps(ty, exp256(_mm256_loadu_ps(tx)));
        memcpy(y + i, ty, sizeof(float) * (size_t)(n - i));
    }
}

/* gate = gelu_tanh(gate) * up. 0.5 g (1 + tanh(u)) is rewritten as g / (1 + e^(-2u)): the same value
 * without the cancellation of 1 + tanh(u) for negative u, and exact at both tails. */
static inline __m256 gelu256(__m256 g)
{
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                             _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), g), _mm256_mul_ps(g, g), g));
    __m256 e = exp256(_mm256_mul_ps(u, _mm256_set1_ps(-2.0f)));
    return _mm256_div_ps(g, _mm256_add_ps(e, _mm256_set1_ps(1.0f)));
}

static inline __m256 silu256(__m256 g)
{
    __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_div_ps(g, _mm256_add_ps(e, _mm256_set1_ps(1.0f)));
}

void vd_glu_avx2(int64_t n, float *gate, const float *up, int gelu)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 a = gelu ? gelu256(g) : silu256(g);
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(a, _mm256_loadu_ps(up + i)));
    }
    if (i < n) {
        float tg[8] = { 0 }, tu[8] = { 0 };
        memcpy(tg, gate + i, sizeof(float) * (size_t)(n - i));
        memcpy(tu, up + i, sizeof(float) * (size_t)(n - i));
        __m256 g = _mm256_loadu_ps(tg);
        __m256 a = gelu ? gelu256(g) : silu256(g);
        _mm256_storeu_ps(tg, _mm256_mul_ps(a, _mm256_loadu_ps(tu)));
        memcpy(gate + i, tg, sizeof(float) * (size_t)(n - i));
    }
}

/* ------------------------------------------------------------------ panel products (prefill) */

/* Panels of 8 weight rows (one 32-bit lane per row, vec_dot_impl.h) times T tokens at a time.
 * vpmaddubsw multiplies the unsigned codes by a broadcast group of 4 activations into int16 pair
 * sums; those are added in int16 for as many groups as cannot overflow (G16: a pair is at most
 * 2 * max_code * 127, so 8 groups for codes <= 15, 4 for <= 31, 2 for <= 63), then widened by
 * vpmaddwd (by 1, or by the K-quants' sub-block scales). Every sum is exact, as in the scalar kernels. */
#define GP 8
#define GT 4
#define VD_PACK_P GP
#include "kernels/cpu/vec_pack_impl.h"

static inline __m256i bcast4(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline void store_rows8(float *y, __m256 v, int nrows)
{
    if (nrows == GP) {
        _mm256_storeu_ps(y, v);
    } else {
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(nrows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(y, m, v);
    }
}

/* Q4_0 / Q5_0 (codes q + 8 <= 15, q + 16 <= 31): G16 groups in int16, the block's offset taken out
 * with its activation sum s (exact: integers below 2^24), then d_w * d_a into the accumulator. */
static inline __attribute__((always_inline)) void q8f_tile8(const int T, const int G16, int64_t n, const uint8_t *panel,
                                                            int nrows, const uint8_t *act, size_t astride, float off,
                                                            float *y, size_t ldy)
{
    const int64_t nb = n / 32;
    const int8_t *q[GT];
    const float *da[GT], *sa[GT];
    __m256 c[GT];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const uint8_t *row = act + (size_t)t * astride;
        q[t] = (const int8_t *)row;
        da[t] = (const float *)(row + n);
        sa[t] = da[t] + nb;
        c[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = panel + (size_t)b * VD_PANEL_Q8F_BLOCK(GP);
        __m256i acc[GT];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_si256();
        for (int j0 = 0; j0 < 8; j0 += G16) {
            __m256i a16[GT];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) a16[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int j = j0; j < j0 + G16; j++) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 32 * j));
#pragma GCC unroll 8
                for (int t = 0; t < T; t++)
                    a16[t] = _mm256_add_epi16(a16[t], _mm256_maddubs_epi16(w, bcast4(q[t] + 32 * b + 4 * j)));
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(a16[t], ones16()));
        }
        __m256 dw = _mm256_loadu_ps((const float *)(blk + 32 * GP));
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m256 f = _mm256_fmadd_ps(_mm256_set1_ps(sa[t][b]), _mm256_set1_ps(-off), _mm256_cvtepi32_ps(acc[t]));
            c[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(da[t][b])), f, c[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) store_rows8(y + (size_t)t * ldy, c[t], nrows);
}

/* Q8_0 with signed codes: |w| times the activation with w's sign (the activation is never -128), one
 * group per vpmaddubsw (pairs up to 2 * 128 * 127 < 2^15). */
static inline __attribute__((always_inline)) void q80_tile8(const int T, int64_t n, const uint8_t *panel, int nrows,
                                                            const uint8_t *act, size_t astride, float *y, size_t ldy)
{
    const int64_t nb = n / 32;
    const int8_t *q[GT];
    const float *da[GT];
    __m256 c[GT];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const uint8_t *row = act + (size_t)t * astride;
        q[t] = (const int8_t *)row;
        da[t] = (const float *)(row + n);
        c[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = panel + (size_t)b * VD_PANEL_Q8F_BLOCK(GP);
        __m256i acc[GT];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 32 * j));
            __m256i aw = _mm256_sign_epi8(w, w);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast4(q[t] + 32 * b + 4 * j), w));
                acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p, ones16()));
            }
        }
        __m256 dw = _mm256_loadu_ps((const float *)(blk + 32 * GP));
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            c[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(da[t][b])), _mm256_cvtepi32_ps(acc[t]), c[t]);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) store_rows8(y + (size_t)t * ldy, c[t], nrows);
}

/* Q4_K / Q5_K: each sub-block of 32 (8 groups) in int16 (G16 groups at a time), widened with its
 * scale by vpmaddwd into the super-block's int32 sum; the mins against the 32-element activation
 * sums likewise. Q6_K: sub-blocks of 16 (4 groups, 2 at a time: codes up to 63), the offset of 32
 * taken out with -32 * scale against the 16-element sums. */
static inline __attribute__((always_inline)) void k_tile8(const int T, const int q6, const int G16, int64_t n,
                                                          const uint8_t *panel, int nrows, const uint8_t *act,
                                                          size_t astride, float *y, size_t ldy)
{
    const int64_t nsb = n / 256;
    const size_t pb = q6 ? VD_PANEL_Q6K_BLOCK(GP) : VD_PANEL_Q4K_BLOCK(GP);
    const int n_sub = q6 ? 16 : 8, gps = q6 ? 4 : 8, n_pair = q6 ? 8 : 4;
    const vd_blk_q8_kx *a[GT];
    __m256 c[GT];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        a[t] = (const vd_blk_q8_kx *)(act + (size_t)t * astride);
        c[t] = _mm256_setzero_ps();
    }
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = panel + (size_t)sb * pb;
        const __m256i *sc = (const __m256i *)(blk + 256 * GP);
        const __m256i *pr = sc + n_sub;
        const float *dv = (const float *)(pr + n_pair);
        __m256i acc[GT];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_si256();
        for (int s = 0; s < n_sub; s++) {
            __m256i scv = _mm256_loadu_si256(sc + s);
#pragma GCC unroll 8
            for (int j0 = 0; j0 < gps; j0 += G16) {
                __m256i a16[GT];
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) a16[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int j = j0; j < j0 + G16; j++) {
                    __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 32 * (gps * s + j)));
#pragma GCC unroll 8
                    for (int t = 0; t < T; t++)
                        a16[t] = _mm256_add_epi16(a16[t],
                                                  _mm256_maddubs_epi16(w, bcast4(a[t][sb].qs + 4 * (gps * s + j))));
                }
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(a16[t], scv));
            }
        }
        __m256i m[GT];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) m[t] = _mm256_setzero_si256();
        for (int p = 0; p < n_pair; p++) {
            __m256i pv = _mm256_loadu_si256(pr + p);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                m[t] = _mm256_add_epi32(m[t], _mm256_madd_epi16(pv, bcast4(q6 ? &a[t][sb].bsums[2 * p] : &a[t][sb].bs32[2 * p])));
        }
        __m256 d = _mm256_loadu_ps(dv);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m256 ad = _mm256_set1_ps(a[t][sb].d);
            if (q6) {
                c[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, ad), _mm256_cvtepi32_ps(_mm256_add_epi32(acc[t], m[t])), c[t]);
            } else {
                c[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, ad), _mm256_cvtepi32_ps(acc[t]), c[t]);
                c[t] = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dv + GP), ad), _mm256_cvtepi32_ps(m[t]), c[t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) store_rows8(y + (size_t)t * ldy, c[t], nrows);
}

#define TILES8(call)                                                                                   \
    do {                                                                                               \
        const uint8_t *a_ = act;                                                                       \
        int64_t t_ = 0;                                                                                \
        for (; t_ + GT <= ntok; t_ += GT) call(GT, a_ + (size_t)t_ * astride, y + (size_t)t_ * ldy);   \
        switch (ntok - t_) {                                                                           \
        case 3: call(3, a_ + (size_t)t_ * astride, y + (size_t)t_ * ldy); break;                       \
        case 2: call(2, a_ + (size_t)t_ * astride, y + (size_t)t_ * ldy); break;                       \
        case 1: call(1, a_ + (size_t)t_ * astride, y + (size_t)t_ * ldy); break;                       \
        default: break;                                                                                \
        }                                                                                              \
    } while (0)

static void mul8_q4_0(int64_t n, const void *panel, int nrows, const void *act, size_t astride, int64_t ntok, float *y,
                      size_t ldy)
{
#define CALL(T, A, Y) q8f_tile8(T, 8, n, panel, nrows, A, astride, 8.0f, Y, ldy)
    TILES8(CALL);
#undef CALL
}

static void mul8_q5_0(int64_t n, const void *panel, int nrows, const void *act, size_t astride, int64_t ntok, float *y,
                      size_t ldy)
{
#define CALL(T, A, Y) q8f_tile8(T, 4, n, panel, nrows, A, astride, 16.0f, Y, ldy)
    TILES8(CALL);
#undef CALL
}

static void mul8_q8_0(int64_t n, const void *panel, int nrows, const void *act, size_t astride, int64_t ntok, float *y,
                      size_t ldy)
{
#define CALL(T, A, Y) q80_tile8(T, n, panel, nrows, A, astride, Y, ldy)
    TILES8(CALL);
#undef CALL
}

static void mul8_q4_k(int64_t n, const void *panel, int nrows, const void *act, size_t astride, int64_t ntok, float *y,
                      size_t ldy)
{
#define CALL(T, A, Y) k_tile8(T, 0, 8, n, panel, nrows, A, astride, Y, ldy)
    TILES8(CALL);
#undef CALL
}

static void mul8_q5_k(int64_t n, const void *panel, int nrows, const void *act, size_t astride, int64_t ntok, float *y,
                      size_t ldy)
{
#define CALL(T, A, Y) k_tile8(T, 0, 4, n, panel, nrows, A, astride, Y, ldy)
    TILES8(CALL);
#undef CALL
}

static void mul8_q6_k(int64_t n, const void *panel, int nrows, const void *act, size_t astride, int64_t ntok, float *y,
                      size_t ldy)
{
#define CALL(T, A, Y) k_tile8(T, 1, 2, n, panel, nrows, A, astride, Y, ldy)
    TILES8(CALL);
#undef CALL
}

static size_t bytes8_q4_0(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q4_0, GP, n); }
static size_t bytes8_q5_0(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q5_0, GP, n); }
static size_t bytes8_q8_0(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q8_0, GP, n); }
static size_t bytes8_q4_k(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q4_K, GP, n); }
static size_t bytes8_q5_k(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q5_K, GP, n); }
static size_t bytes8_q6_k(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q6_K, GP, n); }

static void pack8_q4_0(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q8f(GGML_TYPE_Q4_0, 0, n, w, ws, nr, p); }
static void pack8_q5_0(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q8f(GGML_TYPE_Q5_0, 0, n, w, ws, nr, p); }
static void pack8_q8_0(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q8f(GGML_TYPE_Q8_0, 1, n, w, ws, nr, p); }
static void pack8_q4_k(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q45k(0, VD_SC_PAIR16, n, w, ws, nr, p); }
static void pack8_q5_k(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q45k(1, VD_SC_PAIR16, n, w, ws, nr, p); }
static void pack8_q6_k(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q6k(VD_SC_PAIR16, n, w, ws, nr, p); }

static const vd_gemm G8_Q4_0 = { GP, bytes8_q4_0, pack8_q4_0, mul8_q4_0 };
static const vd_gemm G8_Q5_0 = { GP, bytes8_q5_0, pack8_q5_0, mul8_q5_0 };
static const vd_gemm G8_Q8_0 = { GP, bytes8_q8_0, pack8_q8_0, mul8_q8_0 };
static const vd_gemm G8_Q4_K = { GP, bytes8_q4_k, pack8_q4_k, mul8_q4_k };
static const vd_gemm G8_Q5_K = { GP, bytes8_q5_k, pack8_q5_k, mul8_q5_k };
static const vd_gemm G8_Q6_K = { GP, bytes8_q6_k, pack8_q6_k, mul8_q6_k };

const vd_gemm *vd_gemm_avx2(uint32_t wtype)
{
    switch (wtype) {
    case GGML_TYPE_Q4_0: return &G8_Q4_0;
    case GGML_TYPE_Q5_0: return &G8_Q5_0;
    case GGML_TYPE_Q8_0: return &G8_Q8_0;
    case GGML_TYPE_Q4_K: return &G8_Q4_K;
    case GGML_TYPE_Q5_K: return &G8_Q5_K;
    case GGML_TYPE_Q6_K: return &G8_Q6_K;
    default: return NULL;
    }
}

/* ------------------------------------------------------------------ attention blocks */

void vd_f16_to_f32_avx2(int64_t n, const uint16_t *x, float *y)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = _cvtsh_ss(x[i]);
}

/* Scores of KK keys for 16 rows (two vectors of 8): each key element broadcast against the queries'
 * column d, so every product lands in its row's lane and nothing is summed across lanes. */
static inline __attribute__((always_inline)) void scores_tile8(const int KK, int D, int rp, const float *qt,
                                                               const float *kb, float *s)
{
    __m256 acc[6][2];
#pragma GCC unroll 8
    for (int k = 0; k < KK; k++) acc[k][0] = acc[k][1] = _mm256_setzero_ps();
    for (int d = 0; d < D; d++) {
        __m256 q0 = _mm256_loadu_ps(qt + (size_t)d * rp), q1 = _mm256_loadu_ps(qt + (size_t)d * rp + 8);
#pragma GCC unroll 8
        for (int k = 0; k < KK; k++) {
            __m256 kv = _mm256_broadcast_ss(kb + (size_t)k * D + d);
            acc[k][0] = _mm256_fmadd_ps(kv, q0, acc[k][0]);
            acc[k][1] = _mm256_fmadd_ps(kv, q1, acc[k][1]);
        }
    }
#pragma GCC unroll 8
    for (int k = 0; k < KK; k++) {
        _mm256_storeu_ps(s + (size_t)k * rp, acc[k][0]);
        _mm256_storeu_ps(s + (size_t)k * rp + 8, acc[k][1]);
    }
}

void vd_attn_scores_avx2(int D, int nk, int rp, const float *qt, const float *kb, float *s)
{
    for (int r0 = 0; r0 < rp; r0 += 16) {
        int k = 0;
        for (; k + 6 <= nk; k += 6) scores_tile8(6, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0);
        switch (nk - k) {
        case 5: scores_tile8(5, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0); break;
        case 4: scores_tile8(4, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0); break;
        case 3: scores_tile8(3, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0); break;
        case 2: scores_tile8(2, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0); break;
        case 1: scores_tile8(1, D, rp, qt + r0, kb + (size_t)k * D, s + (size_t)k * rp + r0); break;
        default: break;
        }
    }
}

/* RR rows x 16 dimensions of the output: rescaled by corr, then each value row's two vectors
 * times the RR broadcast weights. */
static inline __attribute__((always_inline)) void accum_tile8(const int RR, int D, int nk, int rp, const float *p,
                                                              const float *vb, const float *corr, float *o)
{
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < RR; r++) {
        __m256 c = _mm256_broadcast_ss(corr + r);
        acc[r][0] = _mm256_mul_ps(_mm256_loadu_ps(o + (size_t)r * D), c);
        acc[r][1] = _mm256_mul_ps(_mm256_loadu_ps(o + (size_t)r * D + 8), c);
    }
    for (int k = 0; k < nk; k++) {
        __m256 v0 = _mm256_loadu_ps(vb + (size_t)k * D), v1 = _mm256_loadu_ps(vb + (size_t)k * D + 8);
#pragma GCC unroll 4
        for (int r = 0; r < RR; r++) {
            __m256 w = _mm256_broadcast_ss(p + (size_t)k * rp + r);
            acc[r][0] = _mm256_fmadd_ps(w, v0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(w, v1, acc[r][1]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RR; r++) {
        _mm256_storeu_ps(o + (size_t)r * D, acc[r][0]);
        _mm256_storeu_ps(o + (size_t)r * D + 8, acc[r][1]);
    }
}

void vd_attn_accum_avx2(int D, int nk, int nr, int rp, const float *p, const float *vb, const float *corr, float *o)
{
    int d16 = D / 16 * 16;
    for (int r0 = 0; r0 < nr; r0 += 4) {
        int rr = nr - r0 < 4 ? nr - r0 : 4;
        for (int d0 = 0; d0 < d16; d0 += 16) {
            const float *pr = p + r0, *v = vb + d0, *c = corr + r0;
            float *or_ = o + (size_t)r0 * D + d0;
            switch (rr) {
            case 4: accum_tile8(4, D, nk, rp, pr, v, c, or_); break;
            case 3: accum_tile8(3, D, nk, rp, pr, v, c, or_); break;
            case 2: accum_tile8(2, D, nk, rp, pr, v, c, or_); break;
            default: accum_tile8(1, D, nk, rp, pr, v, c, or_); break;
            }
        }
        for (int r = r0; r < r0 + rr; r++) {   /* the last D % 16 dimensions */
            float *or_ = o + (size_t)r * D;
            for (int d = d16; d < D; d++) or_[d] *= corr[r];
            for (int k = 0; k < nk; k++) {
                float w = p[(size_t)k * rp + r];
                for (int d = d16; d < D; d++) or_[d] = fmaf(w, vb[(size_t)k * D + d], or_[d]);   /* fused, as the vectors */
            }
        }
    }
}

/* ------------------------------------------------------------------ RMS norm */

/* sum x^2 in double, four lanes x four accumulators (the products are exact in double). */
double vd_sumsq_f64_avx2(int64_t n, const float *x)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd(), a2 = _mm256_setzero_pd(), a3 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), x1 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        __m256d x2 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8)), x3 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12));
        a0 = _mm256_fmadd_pd(x0, x0, a0);
        a1 = _mm256_fmadd_pd(x1, x1, a1);
        a2 = _mm256_fmadd_pd(x2, x2, a2);
        a3 = _mm256_fmadd_pd(x3, x3, a3);
    }
    __m256d a = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    double s = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

/* y[i] = x[i] * s * w[i], in that order (as the portable loop rounds it). */
void vd_scale_mul_avx2(int64_t n, const float *x, float s, const float *w, float *y)
{
    const __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(w + i)));
    for (; i < n; i++) y[i] = x[i] * s * w[i];
}

/* ------------------------------------------------------------------ decode: 8 rows, one token */

/* One token against up to 8 weight rows with exactly the panel kernels' arithmetic per row, so a
 * token gives the same bits alone (decode) as in a batch (prefill): each block's (or super-block's)
 * integer sums are reduced exactly across the lanes of its vector into one lane per row, and the
 * scales are applied in the panel kernels' order, d_w * d_a then one fma per block. Rows past nr
 * repeat row 0 and are not stored. */

/* Each row is read front to back (the matrix streams, prefetched ahead),
 * its blocks' exact integer sums and fp16 scales set down lane-wise for 8 rows, RB blocks at a time;
 * then the blocks are applied in order over the 8 lanes at once. */
#define RB 64

static inline int hsum4(__m128i x)
{
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1));
    return _mm_cvtsi128_si32(x);
}

/* Q4_0/Q5_0/Q8_0: each block's exact sum (the lanes added) and scale set down in the row's lane. */
static inline __attribute__((always_inline)) void rows_q8f(int64_t n, float *y, const void *w, size_t ws, int nr,
                                                           const void *act, size_t wsize, block_fn block)
{
    const vd_blk_q8_0 *a = act;
    const int64_t nb = n / 32;
    int32_t is[RB * 8] __attribute__((aligned(32)));   /* [block of the chunk][row] */
    float dw[RB * 8] __attribute__((aligned(32)));
    __m256 c = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += RB) {
        int64_t b1 = b0 + RB < nb ? b0 + RB : nb;
        for (int r = 0; r < 8; r++) {
            const char *row = (const char *)w + (size_t)(r < nr ? r : 0) * ws;
            for (int64_t b = b0; b < b1; b++) {
                const char *blk = row + (size_t)b * wsize;
                prefetch_line(blk, 0);
                is[(b - b0) * 8 + r] = hsum_epi32(block(blk, &a[b]));
                dw[(b - b0) * 8 + r] = h2f(ld16(blk));
            }
        }
        for (int64_t b = b0; b < b1; b++) {
            __m256 dd = _mm256_mul_ps(_mm256_load_ps(dw + (b - b0) * 8), _mm256_set1_ps(h2f(a[b].d)));
            c = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(is + (b - b0) * 8))), c);
        }
    }
    store_rows8(y, c, nr);
}

static void rows_q4_0(int64_t n, float *y, const void *w, size_t ws, int nr, const void *act)
{
    rows_q8f(n, y, w, ws, nr, act, sizeof(vd_blk_q4_0), q4_0_block);
}

static void rows_q5_0(int64_t n, float *y, const void *w, size_t ws, int nr, const void *act)
{
    rows_q8f(n, y, w, ws, nr, act, sizeof(vd_blk_q5_0), q5_0_block);
}

static void rows_q8_0(int64_t n, float *y, const void *w, size_t ws, int nr, const void *act)
{
    rows_q8f(n, y, w, ws, nr, act, sizeof(vd_blk_q8_0), q8_0_block);
}

/* Q4_K / Q5_K: per super-block the exact sumi (scales applied in int32) and summ of each row, then
 * d * sumi and dmin * summ as the panel kernels apply them. */
static inline __attribute__((always_inline)) void rows_q45k(int q5, int64_t n, float *y, const void *w, size_t ws,
                                                            int nr, const void *act)
{
    const vd_blk_q8_k *a = act;
    const size_t bsz = q5 ? sizeof(vd_blk_q5_k) : sizeof(vd_blk_q4_k);
    const int64_t nb = n / 256;
    int32_t si[RB * 8] __attribute__((aligned(32))), sm[RB * 8] __attribute__((aligned(32)));
    float dv[RB * 8] __attribute__((aligned(32))), mv[RB * 8] __attribute__((aligned(32)));
    __m256 c = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += RB) {
        int64_t b1 = b0 + RB < nb ? b0 + RB : nb;
        for (int r = 0; r < 8; r++) {
            const char *row = (const char *)w + (size_t)(r < nr ? r : 0) * ws;
            for (int64_t b = b0; b < b1; b++) {
                const char *blk = row + (size_t)b * bsz;
                prefetch_line(blk, 0);
                prefetch_line(blk, 1);
                prefetch_line(blk, 2);
                __m256i sc;
                __m128i mins = k_mins_dot((const uint8_t *)blk + 4, a[b].bsums, &sc);
                __m256i v;
                if (q5) {
                    const vd_blk_q5_k *wb = (const vd_blk_q5_k *)blk;
                    __m256i qh = _mm256_loadu_si256((const __m256i *)wb->qh);
                    v = _mm256_add_epi32(_mm256_add_epi32(q5k_chunk(wb, &a[b], sc, qh, 0), q5k_chunk(wb, &a[b], sc, qh, 1)),
                                         _mm256_add_epi32(q5k_chunk(wb, &a[b], sc, qh, 2), q5k_chunk(wb, &a[b], sc, qh, 3)));
                } else {
                    const vd_blk_q4_k *wb = (const vd_blk_q4_k *)blk;
                    v = _mm256_add_epi32(_mm256_add_epi32(q4k_chunk(wb, &a[b], sc, 0), q4k_chunk(wb, &a[b], sc, 1)),
                                         _mm256_add_epi32(q4k_chunk(wb, &a[b], sc, 2), q4k_chunk(wb, &a[b], sc, 3)));
                }
                si[(b - b0) * 8 + r] = hsum_epi32(v);
                sm[(b - b0) * 8 + r] = hsum4(mins);
                dv[(b - b0) * 8 + r] = h2f(ld16(blk));
                mv[(b - b0) * 8 + r] = h2f(ld16(blk + 2));
            }
        }
        for (int64_t b = b0; b < b1; b++) {
            __m256 ad = _mm256_set1_ps(a[b].d);
            __m256i vi = _mm256_load_si256((const __m256i *)(si + (b - b0) * 8));
            __m256i vm = _mm256_load_si256((const __m256i *)(sm + (b - b0) * 8));
            c = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_load_ps(dv + (b - b0) * 8), ad), _mm256_cvtepi32_ps(vi), c);
            c = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_load_ps(mv + (b - b0) * 8), ad), _mm256_cvtepi32_ps(vm), c);
        }
    }
    store_rows8(y, c, nr);
}

static void rows_q4_k(int64_t n, float *y, const void *w, size_t ws, int nr, const void *act)
{
    rows_q45k(0, n, y, w, ws, nr, act);
}

static void rows_q5_k(int64_t n, float *y, const void *w, size_t ws, int nr, const void *act)
{
    rows_q45k(1, n, y, w, ws, nr, act);
}

/* Q6_K: the exact sumi with the codes' offset of 32 taken out, then d * sumi. */
static void rows_q6_k(int64_t n, float *y, const void *w, size_t ws, int nr, const void *act)
{
    const vd_blk_q8_k *a = act;
    const int64_t nb = n / 256;
    int32_t si[RB * 8] __attribute__((aligned(32)));
    float dv[RB * 8] __attribute__((aligned(32)));
    __m256 c = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += RB) {
        int64_t b1 = b0 + RB < nb ? b0 + RB : nb;
        for (int r = 0; r < 8; r++) {
            const vd_blk_q6_k *row = (const vd_blk_q6_k *)((const char *)w + (size_t)(r < nr ? r : 0) * ws);
            for (int64_t b = b0; b < b1; b++) {
                const vd_blk_q6_k *wb = &row[b];
                for (int l = 0; l < 4; l++) prefetch_line(wb, l);
                __m128i sc8 = _mm_loadu_si128((const __m128i *)wb->scales);
                __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), _mm256_loadu_si256((const __m256i *)a[b].bsums));
                __m256i sumi = _mm256_add_epi32(q6k_half(wb, &a[b], sc8, 0), q6k_half(wb, &a[b], sc8, 1));
                si[(b - b0) * 8 + r] = hsum_epi32(_mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5)));
                dv[(b - b0) * 8 + r] = h2f(wb->d);
            }
        }
        for (int64_t b = b0; b < b1; b++) {
            __m256 dd = _mm256_mul_ps(_mm256_load_ps(dv + (b - b0) * 8), _mm256_set1_ps(a[b].d));
            c = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(si + (b - b0) * 8))), c);
        }
    }
    store_rows8(y, c, nr);
}

vd_dot_rows_fn vd_dot_rows_avx2(uint32_t wtype)
{
    switch (wtype) {
    case GGML_TYPE_Q4_0: return rows_q4_0;
    case GGML_TYPE_Q5_0: return rows_q5_0;
    case GGML_TYPE_Q8_0: return rows_q8_0;
    case GGML_TYPE_Q4_K: return rows_q4_k;
    case GGML_TYPE_Q5_K: return rows_q5_k;
    case GGML_TYPE_Q6_K: return rows_q6_k;
    default: return NULL;
    }
}
