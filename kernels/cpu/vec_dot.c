/* vec_dot.c - fused dot products of a quantized weight row with a quantized activation row: the
 * portable scalar kernels (the oracle), the activation quantizers, and the run-time choice of
 * instruction set (cpuid and xgetbv) between them and the kernels of vec_dot_avx2.c,
 * vec_dot_avxvnni.c and vec_dot_avx512.c.
 *
 * Every portable kernel gives the bits of its SIMD twins: the same per-block integer sums, and the
 * same f32 operations in the same order (the vector kernels' lanes kept as arrays, their fused
 * multiply-adds as fmaf), so an answer does not depend on the CPU it was computed on. Why: 8-bit
 * activations make the forward pass chaotic at the level of single roundings (docs/numerics.md).
 * Block layouts: vec_dot_impl.h and model-facts.md 3. */
#include "kernels/cpu/vec_dot.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant.h"
#include "kernels/cpu/vec_dot_impl.h"
#include "kernels/exp_poly.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define VD_HAVE_AVX2_BUILD 1
#include <cpuid.h>
#else
#define VD_HAVE_AVX2_BUILD 0
#endif

/* ------------------------------------------------------------------ instruction set */

static atomic_int g_force_scalar;
static atomic_int g_supported = -1;   /* bit mask of supported vd_isa levels; -1 = not probed yet */
static atomic_int g_isa = -1;         /* the chosen level; -1 = not chosen yet */
static char g_env_error[200];         /* written once, before g_isa is published */

static const char *const ISA_NAME[VD_ISA_COUNT] = { "scalar", "avx2", "avxvnni", "avx512" };
static const char *const ISA_DESC[VD_ISA_COUNT] = {
    "portable C", "AVX2 + FMA + F16C", "AVX2 + AVX-VNNI", "AVX-512 F/BW/VL/DQ + VNNI",
};

#if VD_HAVE_AVX2_BUILD
static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* What the CPU reports (cpuid) and the OS saves on a context switch (XCR0): AVX needs the SSE and
 * YMM state (bits 1-2), AVX-512 also the opmask, ZMM_Hi256 and Hi16_ZMM state (bits 5-7). */
static int probe_isas(void)
{
    unsigned a, b, c, d;
    int mask = 1 << VD_ISA_SCALAR;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return mask;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx || !fma || !f16c) return mask;
    uint64_t xcr0 = read_xcr0();
    if ((xcr0 & 0x6) != 0x6) return mask;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7) return mask;
    __cpuid_count(7, 0, a, b, c, d);
    int avx2 = (b >> 5) & 1;
    int avx512 = ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1) &&  /* F DQ BW VL */
                 ((c >> 11) & 1) &&                                                          /* VNNI */
                 (xcr0 & 0xe6) == 0xe6;
    unsigned a1 = 0, b1, c1, d1;
    if (a >= 1) __cpuid_count(7, 1, a1, b1, c1, d1);
    int avxvnni = (a1 >> 4) & 1;
    if (!avx2) return mask;
    mask |= 1 << VD_ISA_AVX2;
    if (avxvnni) mask |= 1 << VD_ISA_AVXVNNI;
    if (avx512) mask |= 1 << VD_ISA_AVX512;
    return mask;
}
#else
static int probe_isas(void) { return 1 << VD_ISA_SCALAR; }
#endif

static int supported_mask(void)
{
    int m = atomic_load_explicit(&g_supported, memory_order_acquire);
    if (m < 0) {
        m = probe_isas();
        atomic_store_explicit(&g_supported, m, memory_order_release);
    }
    return m;
}

int vd_isa_supported(vd_isa isa) { return isa >= 0 && isa < VD_ISA_COUNT && ((supported_mask() >> isa) & 1); }

vd_isa vd_isa_best(void)
{
    int m = supported_mask();
    for (int i = VD_ISA_COUNT - 1; i > 0; i--)
        if ((m >> i) & 1) return (vd_isa)i;
    return VD_ISA_SCALAR;
}

const char *vd_isa_name(vd_isa isa) { return isa >= 0 && isa < VD_ISA_COUNT ? ISA_NAME[isa] : "?"; }
const char *vd_isa_describe(vd_isa isa) { return isa >= 0 && isa < VD_ISA_COUNT ? ISA_DESC[isa] : "?"; }

static int parse_isa(const char *name, vd_isa *out)
{
    for (int i = 0; i < VD_ISA_COUNT; i++)
        if (!strcmp(name, ISA_NAME[i])) {
            *out = (vd_isa)i;
            return 0;
        }
    return -1;
}

static int check_isa(const char *name, vd_isa *out, char *err, size_t errlen)
{
    if (parse_isa(name, out) != 0) {
        snprintf(err, errlen, "unknown instruction set '%s' (scalar, avx2, avxvnni or avx512)", name);
        return -1;
    }
    if (!vd_isa_supported(*out)) {
        snprintf(err, errlen, "this CPU (or OS) does not support %s (%s); the best here is %s", name,
                 ISA_DESC[*out], ISA_NAME[vd_isa_best()]);
        return -1;
    }
    return 0;
}

/* The level in use unless forced scalar: chosen on first use, from $KVCHAT_ISA or the best. */
static vd_isa chosen_isa(void)
{
    int v = atomic_load_explicit(&g_isa, memory_order_acquire);
    if (v >= 0) return (vd_isa)v;
    vd_isa isa = vd_isa_best();
    const char *env = getenv("KVCHAT_ISA");
    if (env && *env) {
        vd_isa want;
        char msg[150];
        if (check_isa(env, &want, msg, sizeof msg) == 0)
            isa = want;
        else
            snprintf(g_env_error, sizeof g_env_error, "KVCHAT_ISA: %s", msg);
    }
    int expect = -1;
    if (!atomic_compare_exchange_strong(&g_isa, &expect, (int)isa)) return (vd_isa)expect;
    return isa;
}

const char *vd_isa_env_error(void)
{
    (void)chosen_isa();
    return g_env_error[0] ? g_env_error : NULL;
}

int vd_set_isa(vd_isa isa, char *err, size_t errlen)
{
    if (isa < 0 || isa >= VD_ISA_COUNT) {
        snprintf(err, errlen, "unknown instruction set %d", (int)isa);
        return -1;
    }
    vd_isa tmp;
    if (check_isa(ISA_NAME[isa], &tmp, err, errlen) != 0) return -1;
    (void)chosen_isa();   /* the environment is read once, before any explicit choice */
    atomic_store_explicit(&g_isa, (int)isa, memory_order_release);
    return 0;
}

int vd_set_isa_name(const char *name, char *err, size_t errlen)
{
    vd_isa isa;
    if (check_isa(name, &isa, err, errlen) != 0) return -1;
    return vd_set_isa(isa, err, errlen);
}

void vd_isa_summary(char *buf, size_t cap)
{
    vd_isa a = vd_isa_active();
    int k = snprintf(buf, cap, "%s (%s); this CPU:", ISA_NAME[a], ISA_DESC[a]);
    for (int i = 0; i < VD_ISA_COUNT && k >= 0 && (size_t)k < cap; i++)
        if (vd_isa_supported((vd_isa)i)) k += snprintf(buf + k, cap - (size_t)k, " %s", ISA_NAME[i]);
}

vd_isa vd_isa_active(void)
{
    if (atomic_load_explicit(&g_force_scalar, memory_order_relaxed)) return VD_ISA_SCALAR;
    return chosen_isa();
}

static inline int use_simd(void) { return vd_isa_active() >= VD_ISA_AVX2; }

int vd_simd_active(void) { return use_simd(); }

void vd_force_scalar(int on) { atomic_store_explicit(&g_force_scalar, on ? 1 : 0, memory_order_relaxed); }

/* ------------------------------------------------------------------ activation formats */

uint32_t vd_act_type(uint32_t wtype)
{
    switch (wtype) {
    case GGML_TYPE_F32: return GGML_TYPE_F32;
    case GGML_TYPE_F16: return GGML_TYPE_F16;
    case GGML_TYPE_BF16: return GGML_TYPE_BF16;
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: return GGML_TYPE_Q8_0;
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: return GGML_TYPE_Q8_1;
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: return GGML_TYPE_Q8_K;
    default: return GGML_TYPE_F32;   /* unsupported weight types have no kernel anyway */
    }
}

size_t vd_act_row_size(uint32_t wtype, int64_t n)
{
    return quant_row_size(vd_act_type(wtype), n);
}

/* The largest |x|, or NaN when the block holds a NaN: then the scale d is NaN too and the products
 * against the block are NaN, as the AVX2 quantizer's are for a NaN row (a bad activation must not
 * turn into plausible numbers). */
static float block_amax(const float *x, int n)
{
    float amax = 0.0f;
    for (int j = 0; j < n; j++) {
        float v = fabsf(x[j]);
        if (v > amax || isnan(v)) amax = isnan(amax) ? amax : v;
    }
    return amax;
}

static int8_t q8_clamp(int32_t v) { return (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v); }

static void quantize_q8_0_scalar(const float *x, void *dst, int64_t n)
{
    vd_blk_q8_0 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float d = block_amax(x, 32) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) y[i].qs[j] = q8_clamp(vd_nearest_int(x[j] * id));
        y[i].d = quant_f32_to_fp16(d);
    }
}

static void quantize_q8_1_scalar(const float *x, void *dst, int64_t n)
{
    vd_blk_q8_1 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float d = block_amax(x, 32) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            y[i].qs[j] = q8_clamp(vd_nearest_int(x[j] * id));
            sum += y[i].qs[j];
        }
        y[i].d = quant_f32_to_fp16(d);
        y[i].s = quant_f32_to_fp16(d * (float)sum);
    }
}

static void quantize_q8_k_scalar(const float *x, void *dst, int64_t n)
{
    vd_blk_q8_k *y = dst;
    for (int64_t i = 0; i < n / 256; i++, x += 256) {
        float d = block_amax(x, 256) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 256; j++) y[i].qs[j] = q8_clamp(vd_nearest_int(x[j] * id));
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += y[i].qs[16 * g + j];
            y[i].bsums[g] = (int16_t)sum;
        }
        y[i].d = d;
    }
}

static void quantize_f16_scalar(const float *x, void *dst, int64_t n)
{
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = quant_f32_to_fp16(x[i]);
}

static void quantize_bf16_scalar(const float *x, void *dst, int64_t n)
{
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++) y[i] = quant_f32_to_bf16(x[i]);
}

void vd_quantize_act(uint32_t wtype, const float *x, void *dst, int64_t n)
{
    int simd = use_simd();
    (void)simd;   /* unused when the AVX2 kernels are not built */
    switch (vd_act_type(wtype)) {
    case GGML_TYPE_Q8_0:
#if VD_HAVE_AVX2_BUILD
        if (simd) { vd_quantize_q8_0_avx2(x, dst, n); return; }
#endif
        quantize_q8_0_scalar(x, dst, n);
        return;
    case GGML_TYPE_Q8_1:
#if VD_HAVE_AVX2_BUILD
        if (simd) { vd_quantize_q8_1_avx2(x, dst, n); return; }
#endif
        quantize_q8_1_scalar(x, dst, n);
        return;
    case GGML_TYPE_Q8_K:
#if VD_HAVE_AVX2_BUILD
        if (simd) { vd_quantize_q8_k_avx2(x, dst, n); return; }
#endif
        quantize_q8_k_scalar(x, dst, n);
        return;
    case GGML_TYPE_F16:
#if VD_HAVE_AVX2_BUILD
        if (simd) { vd_quantize_f16_avx2(x, dst, n); return; }
#endif
        quantize_f16_scalar(x, dst, n);
        return;
    case GGML_TYPE_BF16:
#if VD_HAVE_AVX2_BUILD
        if (simd) { vd_quantize_bf16_avx2(x, dst, n); return; }
#endif
        quantize_bf16_scalar(x, dst, n);
        return;
    default:
        memcpy(dst, x, sizeof(float) * (size_t)n);
        return;
    }
}

/* ------------------------------------------------------------------ scalar kernels */

static inline float h2f(uint16_t h) { return quant_fp16_to_f32(h); }

/* The horizontal sum of an 8-lane vector in the AVX2 kernels' order (hsum_ps): lanes l and l+4,
 * then the pairs (0,2) and (1,3), then those two. */
static float hsum8(const float v[8])
{
    float x0 = v[0] + v[4], x1 = v[1] + v[5], x2 = v[2] + v[6], x3 = v[3] + v[7];
    return (x0 + x2) + (x1 + x3);
}

/* Element i of an f32 (kind 0), f16 (1) or bf16 (2) row; the conversions are exact. */
static inline float elem(int kind, const void *p, int64_t i)
{
    if (kind == 0) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return kind == 1 ? h2f(h) : quant_bf16_to_f32(h);
}

/* The float dot products of the AVX2 kernels one lane at a time: four 8-lane accumulators over
 * 32 elements a step, then 8 at a time into the first, then (s0 + s1) + (s2 + s3) summed across;
 * the last n % 8 go one by one after the sum (f16, bf16) or as a masked step into s1 (f32). */
static inline float dot_lanes(int kind, int64_t n, const void *w, const void *a)
{
    float s[4][8] = { { 0 } };
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int v = 0; v < 4; v++)
            for (int l = 0; l < 8; l++)
                s[v][l] = fmaf(elem(kind, w, i + 8 * v + l), elem(kind, a, i + 8 * v + l), s[v][l]);
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[0][l] = fmaf(elem(kind, w, i + l), elem(kind, a, i + l), s[0][l]);
    if (kind == 0 && i < n)   /* the kernel's masked load: lanes past the end add 0 * 0 */
        for (int l = 0; l < 8; l++)
            s[1][l] = i + l < n ? fmaf(elem(0, w, i + l), elem(0, a, i + l), s[1][l]) : s[1][l] + 0.0f;
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = (s[0][l] + s[1][l]) + (s[2][l] + s[3][l]);
    float r = hsum8(t);
    if (kind != 0)
        for (; i < n; i++) r = fmaf(elem(kind, w, i), elem(kind, a, i), r);
    return r;
}

static void dot_f32_scalar(int64_t n, float *s, const void *vw, const void *va) { *s = dot_lanes(0, n, vw, va); }
static void dot_f16_scalar(int64_t n, float *s, const void *vw, const void *va) { *s = dot_lanes(1, n, vw, va); }
static void dot_bf16_scalar(int64_t n, float *s, const void *vw, const void *va) { *s = dot_lanes(2, n, vw, va); }

/* Lane l of a Q4_1 / Q5_1 block against its Q8_1 block: elements 4l..4l+3. */
static int32_t q1_lane(const uint8_t *qs, uint32_t qh, int five, const int8_t *y, int l)
{
    int v = 0;
    for (int e = 4 * l; e < 4 * l + 4; e++) {
        int q = e < 16 ? qs[e] & 0xF : qs[e - 16] >> 4;
        if (five) q |= (int)(((qh >> e) & 1u) << 4);
        v += q * y[e];
    }
    return v;
}

/* Block i's fields: codes, high bits (Q5_1), d_w * d_a and m_w * s_a. */
static const uint8_t *q1_block(int five, const void *vw, const vd_blk_q8_1 *a, int64_t i, uint32_t *qh, float *dd,
                               float *ms)
{
    const uint8_t *qs;
    uint16_t d, m;
    *qh = 0;
    if (five) {
        const vd_blk_q5_1 *x = (const vd_blk_q5_1 *)vw + i;
        qs = x->qs;
        memcpy(qh, x->qh, 4);
        d = x->d;
        m = x->m;
    } else {
        const vd_blk_q4_1 *x = (const vd_blk_q4_1 *)vw + i;
        qs = x->qs;
        d = x->d;
        m = x->m;
    }
    *dd = h2f(d) * h2f(a[i].d);
    *ms = h2f(m) * h2f(a[i].s);
    return qs;
}

/* Q4_1 / Q5_1 as the AVX2 kernel adds them (block_loop, ms_sum): each block's integer sums in 8
 * lanes of 4 elements, times d_w * d_a into one of two accumulators (blocks alternate within
 * groups of 4; the last 1-3 blocks go to the first), and the m_w * s_a terms in 4 lanes over the
 * groups of 4, summed across, then the last blocks' one by one; the result is the lanes summed
 * across plus that sum. */
static void dot_q1_scalar(int five, int64_t n, float *s, const void *vw, const void *va)
{
    const vd_blk_q8_1 *a = va;
    const int64_t nb = n / 32, grouped = nb / 4 * 4;
    float acc[2][8] = { { 0 } }, m4[4] = { 0 }, dd, ms;
    uint32_t qh;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *qs = q1_block(five, vw, a, i, &qh, &dd, &ms);
        int slot = i < grouped ? (int)(i & 1) : 0;
        for (int l = 0; l < 8; l++) acc[slot][l] = fmaf(dd, (float)q1_lane(qs, qh, five, a[i].qs, l), acc[slot][l]);
        if (i < grouped) m4[i & 3] += ms;
    }
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = acc[0][l] + acc[1][l];
    float msum = (m4[0] + m4[2]) + (m4[1] + m4[3]);
    for (int64_t i = grouped; i < nb; i++) {
        (void)q1_block(five, vw, a, i, &qh, &dd, &ms);
        msum += ms;
    }
    *s = hsum8(t) + msum;
}

static void dot_q4_1_scalar(int64_t n, float *s, const void *vw, const void *va) { dot_q1_scalar(0, n, s, vw, va); }
static void dot_q5_1_scalar(int64_t n, float *s, const void *vw, const void *va) { dot_q1_scalar(1, n, s, vw, va); }

static void dot_q4_0_scalar(int64_t n, float *s, const void *vw, const void *va)
{
    const vd_blk_q4_0 *w = vw;
    const vd_blk_q8_0 *a = va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            sumi += ((w[i].qs[j] & 0xF) - 8) * a[i].qs[j];
            sumi += ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + 16];
        }
        sum = fmaf(h2f(w[i].d) * h2f(a[i].d), (float)sumi, sum);   /* the panel kernels' one fma */
    }
    *s = sum;
}

static void dot_q5_0_scalar(int64_t n, float *s, const void *vw, const void *va)
{
    const vd_blk_q5_0 *w = vw;
    const vd_blk_q8_0 *a = va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        uint32_t h;
        memcpy(&h, w[i].qh, 4);
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = ((w[i].qs[j] & 0xF) | (int)(((h >> j) & 1u) << 4)) - 16;
            int q1 = ((w[i].qs[j] >> 4) | (int)(((h >> (j + 16)) & 1u) << 4)) - 16;
            sumi += q0 * a[i].qs[j] + q1 * a[i].qs[j + 16];
        }
        sum = fmaf(h2f(w[i].d) * h2f(a[i].d), (float)sumi, sum);   /* the panel kernels' one fma */
    }
    *s = sum;
}

static void dot_q8_0_scalar(int64_t n, float *s, const void *vw, const void *va)
{
    const vd_blk_q8_0 *w = vw, *a = va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += w[i].qs[j] * a[i].qs[j];
        sum = fmaf(h2f(w[i].d) * h2f(a[i].d), (float)sumi, sum);   /* the panel kernels' one fma */
    }
    *s = sum;
}

/* Q4_K/Q5_K: sum_s d*sc[s] * sum(q*y) - dmin*mn[s] * sum(y), with sum(y) from the bsums. */
static void dot_q4_k_scalar(int64_t n, float *s, const void *vw, const void *va)
{
    const vd_blk_q4_k *w = vw;
    const vd_blk_q8_k *a = va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 256; i++) {
        uint32_t u[4];
        vd_k_scales(w[i].scales, u);
        uint8_t sc[8], mn[8];
        memcpy(sc, u, 8);
        memcpy(mn, u + 2, 8);
        int sumi = 0, summ = 0;
        for (int c = 0; c < 4; c++) {
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (w[i].qs[32 * c + l] & 0xF) * a[i].qs[64 * c + l];
                s1 += (w[i].qs[32 * c + l] >> 4) * a[i].qs[64 * c + 32 + l];
            }
            sumi += sc[2 * c] * s0 + sc[2 * c + 1] * s1;
        }
        for (int j = 0; j < 8; j++) summ += mn[j] * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
        float d = h2f(w[i].d) * a[i].d, dmin = h2f(w[i].dmin) * a[i].d;
        sum = fmaf(d, (float)sumi, sum);   /* the panel kernels' fma, then fnmadd */
        sum = fmaf(-dmin, (float)summ, sum);
    }
    *s = sum;
}

static void dot_q5_k_scalar(int64_t n, float *s, const void *vw, const void *va)
{
    const vd_blk_q5_k *w = vw;
    const vd_blk_q8_k *a = va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 256; i++) {
        uint32_t u[4];
        vd_k_scales(w[i].scales, u);
        uint8_t sc[8], mn[8];
        memcpy(sc, u, 8);
        memcpy(mn, u + 2, 8);
        int sumi = 0, summ = 0;
        for (int c = 0; c < 4; c++) {
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                int q0 = (w[i].qs[32 * c + l] & 0xF) | (((w[i].qh[l] >> (2 * c)) & 1) << 4);
                int q1 = (w[i].qs[32 * c + l] >> 4) | (((w[i].qh[l] >> (2 * c + 1)) & 1) << 4);
                s0 += q0 * a[i].qs[64 * c + l];
                s1 += q1 * a[i].qs[64 * c + 32 + l];
            }
            sumi += sc[2 * c] * s0 + sc[2 * c + 1] * s1;
        }
        for (int j = 0; j < 8; j++) summ += mn[j] * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
        float d = h2f(w[i].d) * a[i].d, dmin = h2f(w[i].dmin) * a[i].d;
        sum = fmaf(d, (float)sumi, sum);   /* the panel kernels' fma, then fnmadd */
        sum = fmaf(-dmin, (float)summ, sum);
    }
    *s = sum;
}

/* Q6_K: sum_k S[k] * sum((q - 32) * y) over the 16 sub-blocks of 16, all in integers. */
static void dot_q6_k_scalar(int64_t n, float *s, const void *vw, const void *va)
{
    const vd_blk_q6_k *w = vw;
    const vd_blk_q8_k *a = va;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 256; i++) {
        int sumi = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[i].ql + 64 * h, *qh = w[i].qh + 32 * h;
            const int8_t *S = w[i].scales + 8 * h;
            const int8_t *y = a[i].qs + 128 * h;
            int part[8] = { 0 };   /* per sub-block of 16: index 2*p + (l >= 16) for group p */
            for (int l = 0; l < 32; l++) {
                int k = l / 16;
                int q0 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q1 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                part[k + 0] += q0 * y[l];
                part[k + 2] += q1 * y[l + 32];
                part[k + 4] += q2 * y[l + 64];
                part[k + 6] += q3 * y[l + 96];
            }
            for (int k = 0; k < 8; k++) sumi += S[k] * part[k];
        }
        sum = fmaf(h2f(w[i].d) * a[i].d, (float)sumi, sum);
    }
    *s = sum;
}

vd_dot_fn vd_get_dot_scalar(uint32_t wtype)
{
    switch (wtype) {
    case GGML_TYPE_F32: return dot_f32_scalar;
    case GGML_TYPE_F16: return dot_f16_scalar;
    case GGML_TYPE_BF16: return dot_bf16_scalar;
    case GGML_TYPE_Q4_0: return dot_q4_0_scalar;
    case GGML_TYPE_Q4_1: return dot_q4_1_scalar;
    case GGML_TYPE_Q5_0: return dot_q5_0_scalar;
    case GGML_TYPE_Q5_1: return dot_q5_1_scalar;
    case GGML_TYPE_Q8_0: return dot_q8_0_scalar;
    case GGML_TYPE_Q4_K: return dot_q4_k_scalar;
    case GGML_TYPE_Q5_K: return dot_q5_k_scalar;
    case GGML_TYPE_Q6_K: return dot_q6_k_scalar;
    default: return NULL;
    }
}

#if VD_HAVE_AVX2_BUILD
static vd_dot_fn get_dot_avx2(uint32_t wtype)
{
    switch (wtype) {
    case GGML_TYPE_F32: return vd_dot_f32_f32_avx2;
    case GGML_TYPE_F16: return vd_dot_f16_f16_avx2;
    case GGML_TYPE_BF16: return vd_dot_bf16_bf16_avx2;
    case GGML_TYPE_Q4_1: return vd_dot_q4_1_q8_1_avx2;
    case GGML_TYPE_Q5_1: return vd_dot_q5_1_q8_1_avx2;
    default: return NULL;
    }
}
#endif

/* The types with panel kernels (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K) have no one-row SIMD kernel:
 * the backend multiplies them with the panel and rows kernels (vd_get_gemm, vd_get_dot_rows),
 * whose bits the portable kernel gives. */
vd_dot_fn vd_get_dot(uint32_t wtype)
{
#if VD_HAVE_AVX2_BUILD
    vd_dot_fn f = use_simd() ? get_dot_avx2(wtype) : NULL;
    if (f) return f;
#endif
    return vd_get_dot_scalar(wtype);
}

/* e^x with the AVX2 kernel's operations one lane at a time (kernels/exp_poly.h, also the CUDA
 * grouped attention kernel's). */
static float exp_lane(float x) { return xp_exp(x); }

void vd_exp_f32(int64_t n, const float *x, float *y)
{
#if VD_HAVE_AVX2_BUILD
    if (use_simd()) { vd_exp_avx2(n, x, y); return; }
#endif
    for (int64_t i = 0; i < n; i++) y[i] = exp_lane(x[i]);
}

void vd_glu_f32(int64_t n, float *gate, const float *up, int gelu)
{
#if VD_HAVE_AVX2_BUILD
    if (use_simd()) { vd_glu_avx2(n, gate, up, gelu); return; }
#endif
    /* the AVX2 kernel's operations (vd_glu_avx2), so both give the same bits; GELU's
     * 0.5 g (1 + tanh(u)) as g / (1 + e^(-2u)): the same value without the cancellation of
     * 1 + tanh(u) for negative u */
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], e;
        if (gelu) {
            float u = c * fmaf(0.044715f * g, g * g, g);
            e = exp_lane(u * -2.0f);
        } else {
            e = exp_lane(0.0f - g);
        }
        gate[i] = g / (e + 1.0f) * up[i];
    }
}

/* ------------------------------------------------------------------ f32 helpers */

/* The f32 helpers below keep the AVX2 kernels' lanes and order (an 8-lane accumulator is 8
 * floats), so SIMD and portable builds give the same bits. */
float vd_dot_f32(int64_t n, const float *a, const float *b)
{
#if VD_HAVE_AVX2_BUILD
    if (use_simd()) return vd_dot_f32_avx2(n, a, b);
#endif
    return dot_lanes(0, n, a, b);   /* the AVX2 kernel is the f32 weights' one (vd_dot_f32_f32_avx2) */
}

void vd_axpy_f32(int64_t n, float a, const float *x, float *y)
{
#if VD_HAVE_AVX2_BUILD
    if (use_simd()) { vd_axpy_f32_avx2(n, a, x, y); return; }
#endif
    for (int64_t i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

float vd_dot_f32_f16(int64_t n, const float *a, const uint16_t *b)
{
#if VD_HAVE_AVX2_BUILD
    if (use_simd()) return vd_dot_f32_f16_avx2(n, a, b);
#endif
    float s[2][8] = { { 0 } };
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int v = 0; v < 2; v++)
            for (int l = 0; l < 8; l++) s[v][l] = fmaf(a[i + 8 * v + l], h2f(b[i + 8 * v + l]), s[v][l]);
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[0][l] = fmaf(a[i + l], h2f(b[i + l]), s[0][l]);
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = s[0][l] + s[1][l];
    float r = hsum8(t);
    for (; i < n; i++) r = fmaf(a[i], h2f(b[i]), r);
    return r;
}

void vd_axpy_f16(int64_t n, float a, const uint16_t *x, float *y)
{
#if VD_HAVE_AVX2_BUILD
    if (use_simd()) { vd_axpy_f16_avx2(n, a, x, y); return; }
#endif
    for (int64_t i = 0; i < n; i++) y[i] = fmaf(a, h2f(x[i]), y[i]);
}

void vd_f32_to_f16(int64_t n, const float *x, uint16_t *y)
{
#if VD_HAVE_AVX2_BUILD
    if (use_simd()) { vd_f32_to_f16_avx2(n, x, y); return; }
#endif
    for (int64_t i = 0; i < n; i++) y[i] = quant_f32_to_fp16(x[i]);
}

void vd_plane_dots(int64_t n, int64_t P, const float *pt, const float *x, float *out)
{
#if VD_HAVE_AVX2_BUILD
    vd_isa isa = vd_isa_active();
    if (isa == VD_ISA_AVX512) { vd_plane_dots_avx512(n, P, pt, x, out); return; }
    if (isa >= VD_ISA_AVX2) { vd_plane_dots_avx2(n, P, pt, x, out); return; }
#endif
    for (int64_t p = 0; p < P; p++) out[p] = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float xi = x[i], *row = pt + i * P;
        for (int64_t p = 0; p < P; p++) out[p] += row[p] * xi;
    }
}

void vd_widen_transpose(int64_t rows, int64_t n, const float *x, int64_t ldx, double *out, double *norms)
{
#if VD_HAVE_AVX2_BUILD
    if (vd_isa_active() == VD_ISA_AVX512) { vd_widen_transpose_avx512(rows, n, x, ldx, out, norms); return; }
#endif
    /* 8 elements at a time: the block's lines for them stay in L1 across the rows */
    for (int64_t p = 0; p < rows; p++) norms[p] = 0.0;
    for (int64_t i0 = 0; i0 < n; i0 += 8) {
        const int64_t i1 = i0 + 8 < n ? i0 + 8 : n;
        for (int64_t p = 0; p < rows; p++) {
            const float *y = x + p * ldx;
            double n2 = norms[p];
            for (int64_t i = i0; i < i1; i++) {
                const double v = (double)y[i];
                out[i * rows + p] = v;
                n2 += v * v;
            }
            norms[p] = n2;
        }
    }
}

void vd_cosines_f64(int64_t n, const double *d, double na, const double *nb, float *out)
{
#if VD_HAVE_AVX2_BUILD
    vd_isa isa = vd_isa_active();
    if (isa == VD_ISA_AVX512) { vd_cosines_f64_avx512(n, d, na, nb, out); return; }
    if (isa >= VD_ISA_AVX2) { vd_cosines_f64_avx2(n, d, na, nb, out); return; }
#endif
    for (int64_t p = 0; p < n; p++) out[p] = na > 0 && nb[p] > 0 ? (float)(d[p] / sqrt(na * nb[p])) : 0.0f;
}

void vd_pair_dots_f64(int64_t n, int64_t P, const double *pt, int64_t rows, const double *x, int64_t ldx, double *out)
{
#if VD_HAVE_AVX2_BUILD
    vd_isa isa = vd_isa_active();
    if (isa == VD_ISA_AVX512) { vd_pair_dots_f64_avx512(n, P, pt, rows, x, ldx, out); return; }
    if (isa >= VD_ISA_AVX2) { vd_pair_dots_f64_avx2(n, P, pt, rows, x, ldx, out); return; }
#endif
    for (int64_t r = 0; r < rows; r++) {
        double *o = out + r * P;
        for (int64_t p = 0; p < P; p++) o[p] = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const double xi = x[r * ldx + i], *row = pt + i * P;
            for (int64_t p = 0; p < P; p++) o[p] += xi * row[p];
        }
    }
}

void vd_bits_overlap(int64_t words, const uint64_t *now, uint64_t *last, int64_t *set, int64_t *shared)
{
#if VD_HAVE_AVX2_BUILD
    if (use_simd()) {
        vd_bits_overlap_avx2(words, now, last, set, shared);
        return;
    }
#endif
    vd_bits_overlap_loop(words, now, last, set, shared);
}

void vd_key_summary(int64_t n, int64_t rows, const uint16_t *k, int64_t stride, float *sum, float *mn, float *mx)
{
#if VD_HAVE_AVX2_BUILD
    if (use_simd()) { vd_key_summary_avx2(n, rows, k, stride, sum, mn, mx); return; }
#endif
    for (int64_t r = 0; r < rows; r++, k += stride)
        for (int64_t i = 0; i < n; i++) {
            float t = h2f(k[i]);
            sum[i] += t;
            mn[i] = t < mn[i] ? t : mn[i];
            mx[i] = t > mx[i] ? t : mx[i];
        }
}

/* sum x^2 in double over the AVX2 kernel's 16 lanes (vd_sumsq_f64_avx2; the products are exact). */
static double sumsq_f64(int64_t n, const float *x)
{
    double a[16] = { 0 };
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) a[l] += (double)x[i + l] * x[i + l];
    double v[4];
    for (int l = 0; l < 4; l++) v[l] = (a[l] + a[4 + l]) + (a[8 + l] + a[12 + l]);
    double s = (v[0] + v[2]) + (v[1] + v[3]);
    for (; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

void vd_rmsnorm_f32(int64_t n, const float *x, const float *w, float *y, float eps)
{
    double ss = 0;
#if VD_HAVE_AVX2_BUILD
    int simd = use_simd();
    if (simd) ss = vd_sumsq_f64_avx2(n, x);
    else
#endif
        ss = sumsq_f64(n, x);
    float scale = 1.0f / sqrtf((float)(ss / (double)n) + eps);
#if VD_HAVE_AVX2_BUILD
    if (simd) {
        vd_scale_mul_avx2(n, x, scale, w, y);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
}

/* ------------------------------------------------------------------ attention blocks */

static void attn_scores_scalar(int D, int nk, int rp, const float *qt, const float *kb, float *s)
{
    for (int k = 0; k < nk; k++) {
        float *sk = s + (size_t)k * rp;
        for (int r = 0; r < rp; r++) sk[r] = 0;
        for (int d = 0; d < D; d++) {
            float kv = kb[(size_t)k * D + d];
            const float *q = qt + (size_t)d * rp;
            for (int r = 0; r < rp; r++) sk[r] = fmaf(kv, q[r], sk[r]);
        }
    }
}

static void attn_accum_scalar(int D, int nk, int nr, int rp, const float *p, const float *vb, const float *corr,
                              float *o)
{
    for (int r = 0; r < nr; r++) {
        float *or_ = o + (size_t)r * D;
        for (int d = 0; d < D; d++) or_[d] *= corr[r];
        for (int k = 0; k < nk; k++) {
            float w = p[(size_t)k * rp + r];
            const float *v = vb + (size_t)k * D;
            for (int d = 0; d < D; d++) or_[d] = fmaf(w, v[d], or_[d]);
        }
    }
}

void vd_attn_scores(int d_head, int nk, int rp, const float *qt, const float *kb, float *s)
{
#if VD_HAVE_AVX2_BUILD
    vd_isa isa = vd_isa_active();
    if (isa == VD_ISA_AVX512) { vd_attn_scores_avx512(d_head, nk, rp, qt, kb, s); return; }
    if (isa >= VD_ISA_AVX2) { vd_attn_scores_avx2(d_head, nk, rp, qt, kb, s); return; }
#endif
    attn_scores_scalar(d_head, nk, rp, qt, kb, s);
}

void vd_attn_accum(int d_head, int nk, int nr, int rp, const float *p, const float *vb, const float *corr, float *o)
{
#if VD_HAVE_AVX2_BUILD
    vd_isa isa = vd_isa_active();
    if (isa == VD_ISA_AVX512) { vd_attn_accum_avx512(d_head, nk, nr, rp, p, vb, corr, o); return; }
    if (isa >= VD_ISA_AVX2) { vd_attn_accum_avx2(d_head, nk, nr, rp, p, vb, corr, o); return; }
#endif
    attn_accum_scalar(d_head, nk, nr, rp, p, vb, corr, o);
}

void vd_f16_to_f32(int64_t n, const uint16_t *x, float *y)
{
#if VD_HAVE_AVX2_BUILD
    if (use_simd()) { vd_f16_to_f32_avx2(n, x, y); return; }
#endif
    for (int64_t i = 0; i < n; i++) y[i] = quant_fp16_to_f32(x[i]);
}

float vd_bound_f32(int64_t n, const float *q, const float *lo, const float *hi)
{
#if VD_HAVE_AVX2_BUILD
    if (use_simd()) return vd_bound_f32_avx2(n, q, lo, hi);
#endif
    float s[2][8] = { { 0 } };
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) {
            float a = q[i + l] * lo[i + l], b = q[i + l] * hi[i + l];
            s[l / 8][l % 8] += a > b ? a : b;
        }
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = s[0][l] + s[1][l];
    float r = hsum8(t);
    for (; i < n; i++) {
        float a = q[i] * lo[i], b = q[i] * hi[i];
        r += a > b ? a : b;
    }
    return r;
}
