/* vec_gemm.c - the portable half of the panel kernels (vd_gemm, vec_dot.h): the activation rows they
 * read, the panel sizes, and the choice of the active instruction set's kernels.
 *
 * The packing and multiplications live in the ISA files (vec_dot_avx2.c, vec_dot_avxvnni.c,
 * vec_dot_avx512.c, with vec_pack_impl.h); layouts are described in vec_dot_impl.h. */
#include <string.h>

#include "common/quant.h"
#include "kernels/cpu/vec_dot.h"
#include "kernels/cpu/vec_dot_impl.h"

/* ------------------------------------------------------------------ activation rows */

static int is_q8f(uint32_t wtype)
{
    return wtype == GGML_TYPE_Q4_0 || wtype == GGML_TYPE_Q5_0 || wtype == GGML_TYPE_Q8_0;
}

static int is_k(uint32_t wtype)
{
    return wtype == GGML_TYPE_Q4_K || wtype == GGML_TYPE_Q5_K || wtype == GGML_TYPE_Q6_K;
}

size_t vd_gemm_act_row_size(uint32_t wtype, int64_t n)
{
    if (is_q8f(wtype)) return vd_gact_q8_bytes(n);
    if (is_k(wtype)) return vd_gact_k_bytes(n);
    return 0;
}

static void put_q8f_block(const vd_blk_q8_0 *b, int64_t i, int64_t n, uint8_t *row)
{
    int8_t *q = (int8_t *)row;
    float *d = (float *)(row + n), *s = d + n / 32;
    memcpy(q + 32 * i, b->qs, 32);
    int sum = 0;
    for (int j = 0; j < 32; j++) sum += b->qs[j];
    d[i] = quant_fp16_to_f32(b->d);
    s[i] = (float)sum;
}

static void put_k_block(const vd_blk_q8_k *b, vd_blk_q8_kx *o)
{
    memcpy(o->qs, b->qs, 256);
    memcpy(o->bsums, b->bsums, sizeof o->bsums);
    for (int s = 0; s < 8; s++) o->bs32[s] = (int16_t)(b->bsums[2 * s] + b->bsums[2 * s + 1]);
    o->d = b->d;
}

void vd_gemm_act_from_dot_act(uint32_t wtype, const void *act, void *dst, int64_t n)
{
    uint8_t *row = dst;
    size_t bytes = vd_gemm_act_row_size(wtype, n);
    if (is_q8f(wtype)) {
        const vd_blk_q8_0 *b = act;
        for (int64_t i = 0; i < n / 32; i++) put_q8f_block(&b[i], i, n, row);
        size_t used = (size_t)n + 8 * (size_t)(n / 32);
        memset(row + used, 0, bytes - used);
    } else if (is_k(wtype)) {
        const vd_blk_q8_k *b = act;
        vd_blk_q8_kx *o = dst;
        for (int64_t i = 0; i < n / 256; i++) put_k_block(&b[i], &o[i]);
        size_t used = (size_t)(n / 256) * sizeof(vd_blk_q8_kx);
        memset(row + used, 0, bytes - used);
    }
}

/* One block at a time through vd_quantize_act (the tested quantizers), then into place. */
void vd_gemm_quantize_act(uint32_t wtype, const float *x, void *dst, int64_t n)
{
    uint8_t *row = dst;
    size_t bytes = vd_gemm_act_row_size(wtype, n);
    if (is_q8f(wtype)) {
        vd_blk_q8_0 b;
        for (int64_t i = 0; i < n / 32; i++) {
            vd_quantize_act(wtype, x + 32 * i, &b, 32);
            put_q8f_block(&b, i, n, row);
        }
        size_t used = (size_t)n + 8 * (size_t)(n / 32);
        memset(row + used, 0, bytes - used);
    } else if (is_k(wtype)) {
        vd_blk_q8_k b;
        vd_blk_q8_kx *o = dst;
        for (int64_t i = 0; i < n / 256; i++) {
            vd_quantize_act(wtype, x + 256 * i, &b, 256);
            put_k_block(&b, &o[i]);
        }
        size_t used = (size_t)(n / 256) * sizeof(vd_blk_q8_kx);
        memset(row + used, 0, bytes - used);
    }
}

/* ------------------------------------------------------------------ panels */

size_t vd_panel_bytes(uint32_t wtype, int P, int64_t n)
{
    if (is_q8f(wtype)) return (size_t)(n / 32) * VD_PANEL_Q8F_BLOCK(P);
    if (wtype == GGML_TYPE_Q4_K || wtype == GGML_TYPE_Q5_K) return (size_t)(n / 256) * VD_PANEL_Q4K_BLOCK(P);
    if (wtype == GGML_TYPE_Q6_K) return (size_t)(n / 256) * VD_PANEL_Q6K_BLOCK(P);
    return 0;
}

/* ------------------------------------------------------------------ choice */

const vd_gemm *vd_get_gemm(uint32_t wtype)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    switch (vd_isa_active()) {
    case VD_ISA_AVX512: return vd_gemm_avx512(wtype);
    case VD_ISA_AVXVNNI: return vd_gemm_avxvnni(wtype);
    case VD_ISA_AVX2: return vd_gemm_avx2(wtype);
    default: return NULL;
    }
#else
    (void)wtype;
    return NULL;
#endif
}

vd_dot_rows_fn vd_get_dot_rows(uint32_t wtype)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return vd_get_gemm(wtype) ? vd_dot_rows_avx2(wtype) : NULL;
#else
    (void)wtype;
    return NULL;
#endif
}
