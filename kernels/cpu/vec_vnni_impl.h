/* vec_vnni_impl.h - the panel products with VNNI integer dot products (vpdpbusd, vpdpwssd), written
 * once over a vector type and included by vec_dot_avx512.c (16 rows a panel, zmm, EVEX) and
 * vec_dot_avxvnni.c (8 rows, ymm, the VEX forms).
 *
 * The including file defines VN_P (rows per panel = 32-bit lanes), VN_T (tokens per tile), VN_SUFFIX
 * and the vector helpers vn_*; it includes vec_pack_impl.h with VD_PACK_P = VN_P first. vpdpbusd
 * multiplies unsigned by signed bytes: the weights go in as unsigned codes (value + offset,
 * vec_dot_impl.h) and each activation block's sum takes the offset back out, so every block's
 * integer sum is exactly the scalar kernels'; only the order of the f32 additions differs. */
#ifndef KVCHAT_VEC_VNNI_IMPL_H
#define KVCHAT_VEC_VNNI_IMPL_H

#define VN_TMAX 8                   /* array bound for tiles of up to 8 tokens */
#define VN_GROUP (4 * VN_P)          /* bytes of one k-group: 4 codes of each row */
#define VN_CAT2(a, b) a##b
#define VN_CAT(a, b) VN_CAT2(a, b)
#define VN_NAME(x) VN_CAT(x, VN_SUFFIX)

/* ------------------------------------------------------------------ Q4_0 / Q5_0 / Q8_0 */

/* T tokens (a constant after inlining) against one panel. Per block: 8 vpdpbusd per token give the
 * rows' sums of code * q; s * (-off) takes the offset out exactly (all terms are integers below
 * 2^24), then the block's d_w * d_a scales it into the f32 accumulator. */
static inline __attribute__((always_inline)) void vn_q8f_tile(const int T, int64_t n, const uint8_t *panel, int nrows,
                                                              const uint8_t *act, size_t astride, float off, float *y,
                                                              size_t ldy)
{
    const int64_t nb = n / 32;
    const int8_t *q[VN_TMAX];
    const float *da[VN_TMAX], *sa[VN_TMAX];
    vn_f c[VN_TMAX];
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        const uint8_t *row = act + (size_t)t * astride;
        q[t] = (const int8_t *)row;
        da[t] = (const float *)(row + n);
        sa[t] = da[t] + nb;
        c[t] = vn_zero_f();
    }
    const vn_f noff = vn_set1_f(-off);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = panel + (size_t)b * VD_PANEL_Q8F_BLOCK(VN_P);
        vn_i acc[VN_TMAX];
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[t] = vn_zero_i();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            vn_i w = vn_load_i(blk + VN_GROUP * j);
#pragma GCC unroll 16
            for (int t = 0; t < T; t++) acc[t] = vn_dpbusd(acc[t], w, vn_bcast32(q[t] + 32 * b + 4 * j));
        }
        vn_f dw = vn_load_f(blk + 32 * VN_P);
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            vn_f f = vn_fmadd(vn_set1_f(sa[t][b]), noff, vn_cvt(acc[t]));
            c[t] = vn_fmadd(vn_mul(dw, vn_set1_f(da[t][b])), f, c[t]);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) vn_store_rows(y + (size_t)t * ldy, c[t], nrows);
}

/* ------------------------------------------------------------------ Q4_K / Q5_K */

/* Per super-block and token: each 32-element sub-block's row sums (8 vpdpbusd) times the rows'
 * 6-bit scales, summed in int32 (|sum| < 2^31), like the scalar sumi; the mins against the
 * activation's 32-element sums with vpdpwssd (the scalar summ); then d * sumi - dmin * summ. */
static inline __attribute__((always_inline)) void vn_q4k_tile(const int T, int64_t n, const uint8_t *panel, int nrows,
                                                              const uint8_t *act, size_t astride, float off, float *y,
                                                              size_t ldy)
{
    (void)off;
    const int64_t nsb = n / 256;
    const vd_blk_q8_kx *a[VN_TMAX];
    vn_f c[VN_TMAX];
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        a[t] = (const vd_blk_q8_kx *)(act + (size_t)t * astride);
        c[t] = vn_zero_f();
    }
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = panel + (size_t)sb * VD_PANEL_Q4K_BLOCK(VN_P);
        const int32_t *sc = (const int32_t *)(blk + 256 * VN_P);
        const int32_t *mn = sc + 8 * VN_P;
        const float *dv = (const float *)(mn + 4 * VN_P);
        vn_i acc[VN_TMAX];
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[t] = vn_zero_i();
        for (int s = 0; s < 8; s++) {
            vn_i is[VN_TMAX];
#pragma GCC unroll 16
            for (int t = 0; t < T; t++) is[t] = vn_zero_i();
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                vn_i w = vn_load_i(blk + VN_GROUP * (8 * s + j));
#pragma GCC unroll 16
                for (int t = 0; t < T; t++) is[t] = vn_dpbusd(is[t], w, vn_bcast32(a[t][sb].qs + 32 * s + 4 * j));
            }
            vn_i scv = vn_load_i(sc + VN_P * s);
#pragma GCC unroll 16
            for (int t = 0; t < T; t++) acc[t] = vn_add_i(acc[t], vn_mullo(is[t], scv));
        }
        vn_i m[VN_TMAX];
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) m[t] = vn_zero_i();
        for (int p = 0; p < 4; p++) {
            vn_i mv = vn_load_i(mn + VN_P * p);
#pragma GCC unroll 16
            for (int t = 0; t < T; t++) m[t] = vn_dpwssd(m[t], mv, vn_bcast32(&a[t][sb].bs32[2 * p]));
        }
        vn_f d = vn_load_f(dv), dmin = vn_load_f(dv + VN_P);
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            vn_f ad = vn_set1_f(a[t][sb].d);
            c[t] = vn_fmadd(vn_mul(d, ad), vn_cvt(acc[t]), c[t]);
            c[t] = vn_fnmadd(vn_mul(dmin, ad), vn_cvt(m[t]), c[t]);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) vn_store_rows(y + (size_t)t * ldy, c[t], nrows);
}

/* Q6_K: sub-blocks of 16 (4 vpdpbusd) times the signed scales, and the codes' offset of 32 taken out
 * with vpdpwssd of -32 * scale against the activation's 16-element sums: the scalar sumi exactly. */
static inline __attribute__((always_inline)) void vn_q6k_tile(const int T, int64_t n, const uint8_t *panel, int nrows,
                                                              const uint8_t *act, size_t astride, float off, float *y,
                                                              size_t ldy)
{
    (void)off;
    const int64_t nsb = n / 256;
    const vd_blk_q8_kx *a[VN_TMAX];
    vn_f c[VN_TMAX];
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        a[t] = (const vd_blk_q8_kx *)(act + (size_t)t * astride);
        c[t] = vn_zero_f();
    }
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = panel + (size_t)sb * VD_PANEL_Q6K_BLOCK(VN_P);
        const int32_t *sc = (const int32_t *)(blk + 256 * VN_P);
        const int32_t *offp = sc + 16 * VN_P;
        const float *dv = (const float *)(offp + 8 * VN_P);
        vn_i acc[VN_TMAX];
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[t] = vn_zero_i();
        for (int p = 0; p < 8; p++) {
            vn_i ov = vn_load_i(offp + VN_P * p);
#pragma GCC unroll 16
            for (int t = 0; t < T; t++) acc[t] = vn_dpwssd(acc[t], ov, vn_bcast32(&a[t][sb].bsums[2 * p]));
        }
        for (int s = 0; s < 16; s++) {
            vn_i is[VN_TMAX];
#pragma GCC unroll 16
            for (int t = 0; t < T; t++) is[t] = vn_zero_i();
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                vn_i w = vn_load_i(blk + VN_GROUP * (4 * s + j));
#pragma GCC unroll 16
                for (int t = 0; t < T; t++) is[t] = vn_dpbusd(is[t], w, vn_bcast32(a[t][sb].qs + 16 * s + 4 * j));
            }
            vn_i scv = vn_load_i(sc + VN_P * s);
#pragma GCC unroll 16
            for (int t = 0; t < T; t++) acc[t] = vn_add_i(acc[t], vn_mullo(is[t], scv));
        }
        vn_f d = vn_load_f(dv);
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) c[t] = vn_fmadd(vn_mul(d, vn_set1_f(a[t][sb].d)), vn_cvt(acc[t]), c[t]);
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) vn_store_rows(y + (size_t)t * ldy, c[t], nrows);
}

/* Every token of the batch: tiles of VN_T, then one tile of the rest. */
#define VN_TOKEN_TILES(tile, off)                                                                          \
    do {                                                                                                   \
        const uint8_t *a_ = act;                                                                           \
        int64_t t_ = 0;                                                                                    \
        for (; t_ + VN_T <= ntok; t_ += VN_T)                                                              \
            tile(VN_T, n, panel, nrows, a_ + (size_t)t_ * astride, astride, off, y + (size_t)t_ * ldy, ldy); \
        const uint8_t *ar_ = a_ + (size_t)t_ * astride;                                                    \
        float *yr_ = y + (size_t)t_ * ldy;                                                                 \
        switch (ntok - t_) {                                                                               \
        case 7: tile(7, n, panel, nrows, ar_, astride, off, yr_, ldy); break;                               \
        case 6: tile(6, n, panel, nrows, ar_, astride, off, yr_, ldy); break;                               \
        case 5: tile(5, n, panel, nrows, ar_, astride, off, yr_, ldy); break;                               \
        case 4: tile(4, n, panel, nrows, ar_, astride, off, yr_, ldy); break;                               \
        case 3: tile(3, n, panel, nrows, ar_, astride, off, yr_, ldy); break;                               \
        case 2: tile(2, n, panel, nrows, ar_, astride, off, yr_, ldy); break;                               \
        case 1: tile(1, n, panel, nrows, ar_, astride, off, yr_, ldy); break;                               \
        default: break;                                                                                    \
        }                                                                                                  \
    } while (0)

#define VN_MUL(name, tile, off)                                                                            \
    static void name(int64_t n, const void *panel, int nrows, const void *act, size_t astride, int64_t ntok, \
                     float *y, size_t ldy)                                                                 \
    {                                                                                                      \
        VN_TOKEN_TILES(tile, off);                                                                         \
    }

VN_MUL(vn_mul_q4_0, vn_q8f_tile, 8.0f)
VN_MUL(vn_mul_q5_0, vn_q8f_tile, 16.0f)
VN_MUL(vn_mul_q8_0, vn_q8f_tile, 128.0f)
VN_MUL(vn_mul_q4_k, vn_q4k_tile, 0.0f)   /* Q5_K too: codes up to 31, same sums */
VN_MUL(vn_mul_q6_k, vn_q6k_tile, 0.0f)

/* ------------------------------------------------------------------ packing and the table */

static size_t vn_bytes_q4_0(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q4_0, VN_P, n); }
static size_t vn_bytes_q5_0(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q5_0, VN_P, n); }
static size_t vn_bytes_q8_0(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q8_0, VN_P, n); }
static size_t vn_bytes_q4_k(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q4_K, VN_P, n); }
static size_t vn_bytes_q5_k(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q5_K, VN_P, n); }
static size_t vn_bytes_q6_k(int64_t n) { return vd_panel_bytes(GGML_TYPE_Q6_K, VN_P, n); }

static void vn_pack_q4_0(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q8f(GGML_TYPE_Q4_0, 0, n, w, ws, nr, p); }
static void vn_pack_q5_0(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q8f(GGML_TYPE_Q5_0, 0, n, w, ws, nr, p); }
static void vn_pack_q8_0(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q8f(GGML_TYPE_Q8_0, 0, n, w, ws, nr, p); }
static void vn_pack_q4_k(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q45k(0, VD_SC_I32, n, w, ws, nr, p); }
static void vn_pack_q5_k(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q45k(1, VD_SC_I32, n, w, ws, nr, p); }
static void vn_pack_q6_k(int64_t n, const void *w, size_t ws, int nr, void *p) { vd_pack_q6k(VD_SC_I32, n, w, ws, nr, p); }

static const vd_gemm VN_G_Q4_0 = { VN_P, vn_bytes_q4_0, vn_pack_q4_0, vn_mul_q4_0 };
static const vd_gemm VN_G_Q5_0 = { VN_P, vn_bytes_q5_0, vn_pack_q5_0, vn_mul_q5_0 };
static const vd_gemm VN_G_Q8_0 = { VN_P, vn_bytes_q8_0, vn_pack_q8_0, vn_mul_q8_0 };
static const vd_gemm VN_G_Q4_K = { VN_P, vn_bytes_q4_k, vn_pack_q4_k, vn_mul_q4_k };
static const vd_gemm VN_G_Q5_K = { VN_P, vn_bytes_q5_k, vn_pack_q5_k, vn_mul_q4_k };
static const vd_gemm VN_G_Q6_K = { VN_P, vn_bytes_q6_k, vn_pack_q6_k, vn_mul_q6_k };

const vd_gemm *VN_NAME(vd_gemm_)(uint32_t wtype)
{
    switch (wtype) {
    case GGML_TYPE_Q4_0: return &VN_G_Q4_0;
    case GGML_TYPE_Q5_0: return &VN_G_Q5_0;
    case GGML_TYPE_Q8_0: return &VN_G_Q8_0;
    case GGML_TYPE_Q4_K: return &VN_G_Q4_K;
    case GGML_TYPE_Q5_K: return &VN_G_Q5_K;
    case GGML_TYPE_Q6_K: return &VN_G_Q6_K;
    default: return NULL;
    }
}

#endif
