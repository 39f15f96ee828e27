/* vec_pack_impl.h - packing weight rows into panels of VD_PACK_P rows (layouts: vec_dot_impl.h),
 * included by each ISA file after defining VD_PACK_P; AVX2 intrinsics only, so every SIMD level can
 * use it.
 *
 * Each row's block is decoded into its codes with vector ops and its 32-bit groups (4 consecutive
 * elements) are spread over the panel's lanes. Packing runs once per panel per batch. */
#ifndef KVCHAT_VEC_PACK_IMPL_H
#define KVCHAT_VEC_PACK_IMPL_H

#include <immintrin.h>
#include <string.h>

#include "common/quant.h"
#include "kernels/cpu/vec_dot_impl.h"
#include "kernels/cpu/vec_bits_avx2.h"

/* Groups j0 .. j0+7 of row r from the 8 dwords of v. */
static inline void vd_pk_put(uint8_t *codes, int r, __m256i v, int j0)
{
    uint32_t g[8];
    _mm256_storeu_si256((__m256i *)g, v);
    uint32_t *dst = (uint32_t *)codes + (size_t)j0 * VD_PACK_P + r;
    for (int j = 0; j < 8; j++) dst[(size_t)j * VD_PACK_P] = g[j];
}

/* The 32 bits at qh -> 32 bytes, byte j = 0x10 if bit j is set, else 0. */
static inline __m256i vd_pk_bit4(const uint8_t *qh)
{
    return _mm256_and_si256(expand_bits32(qh), _mm256_set1_epi8(0x10));
}

static inline int32_t vd_pk_scale(int sc, int enc)
{
    if (enc == VD_SC_I32) return sc;
    uint32_t h = (uint16_t)(int16_t)sc;
    return (int32_t)(h | (h << 16));
}

static inline int32_t vd_pk_pair(int lo, int hi)
{
    return (int32_t)((uint32_t)(uint16_t)(int16_t)lo | ((uint32_t)(uint16_t)(int16_t)hi << 16));
}

/* Q4_0 / Q5_0 / Q8_0: codes q + 8, q + 16, q + 128 (or the raw int8 for Q8_0 when signed_q8). */
static inline __attribute__((always_inline)) void vd_pack_q8f(uint32_t wtype, int signed_q8, int64_t n, const void *w,
                                                              size_t ws, int nr, void *panel)
{
    const size_t bsz = wtype == GGML_TYPE_Q8_0 ? sizeof(vd_blk_q8_0)
                     : wtype == GGML_TYPE_Q4_0 ? sizeof(vd_blk_q4_0) : sizeof(vd_blk_q5_0);
    const int64_t nb = n / 32;
    if (nr < VD_PACK_P) memset(panel, 0, (size_t)nb * VD_PANEL_Q8F_BLOCK(VD_PACK_P));
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)r * ws;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = row + (size_t)b * bsz;
            uint8_t *ob = (uint8_t *)panel + (size_t)b * VD_PANEL_Q8F_BLOCK(VD_PACK_P);
            __m256i c;
            if (wtype == GGML_TYPE_Q8_0) {
                c = _mm256_loadu_si256((const __m256i *)((const vd_blk_q8_0 *)blk)->qs);
                if (!signed_q8) c = _mm256_xor_si256(c, _mm256_set1_epi8((char)0x80));
            } else if (wtype == GGML_TYPE_Q4_0) {
                c = unpack_nibbles16(((const vd_blk_q4_0 *)blk)->qs);
            } else {
                const vd_blk_q5_0 *b5 = (const vd_blk_q5_0 *)blk;
                c = _mm256_or_si256(unpack_nibbles16(b5->qs), vd_pk_bit4(b5->qh));
            }
            vd_pk_put(ob, r, c, 0);
            uint16_t d;
            memcpy(&d, blk, 2);
            ((float *)(ob + 32 * VD_PACK_P))[r] = _cvtsh_ss(d);
        }
    }
}

/* Q4_K/Q5_K: chunk c of 32 bytes holds sub-blocks 2c (low nibbles) and 2c+1 (high nibbles); Q5_K's
 * bit 2c (2c+1) of qh[l] is bit 4 of element l of sub-block 2c (2c+1). 32-bit shifts move bit 2c of
 * each byte to bit 0 and then to bit 4 (the bits they pull across bytes are masked off). */
static inline __attribute__((always_inline)) void vd_pack_q45k(int q5, int sc_enc, int64_t n, const void *w, size_t ws,
                                                               int nr, void *panel)
{
    const size_t bsz = q5 ? sizeof(vd_blk_q5_k) : sizeof(vd_blk_q4_k);
    const int64_t nb = n / 256;
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    if (nr < VD_PACK_P) memset(panel, 0, (size_t)nb * VD_PANEL_Q4K_BLOCK(VD_PACK_P));
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)r * ws;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = row + (size_t)b * bsz;
            const uint8_t *qs = q5 ? ((const vd_blk_q5_k *)blk)->qs : ((const vd_blk_q4_k *)blk)->qs;
            uint8_t *ob = (uint8_t *)panel + (size_t)b * VD_PANEL_Q4K_BLOCK(VD_PACK_P);
            __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)((const vd_blk_q5_k *)blk)->qh) : _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
                __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                if (q5) {
                    __m128i sl = _mm_cvtsi32_si128(2 * c), sh = _mm_cvtsi32_si128(2 * c + 1);
                    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi32(_mm256_srl_epi32(qh, sl), 4), b4));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi32(_mm256_srl_epi32(qh, sh), 4), b4));
                }
                vd_pk_put(ob, r, lo, 16 * c);
                vd_pk_put(ob, r, hi, 16 * c + 8);
            }
            uint32_t u[4];
            vd_k_scales(blk + 4, u);
            uint8_t s8[8], m8[8];
            memcpy(s8, u, 8);
            memcpy(m8, u + 2, 8);
            int32_t *scv = (int32_t *)(ob + 256 * VD_PACK_P);
            int32_t *mnv = scv + 8 * VD_PACK_P;
            float *dv = (float *)(mnv + 4 * VD_PACK_P);
            for (int k = 0; k < 8; k++) scv[k * VD_PACK_P + r] = vd_pk_scale(s8[k], sc_enc);
            for (int p = 0; p < 4; p++) mnv[p * VD_PACK_P + r] = vd_pk_pair(m8[2 * p], m8[2 * p + 1]);
            uint16_t d, dmin;
            memcpy(&d, blk, 2);
            memcpy(&dmin, blk + 2, 2);
            dv[r] = _cvtsh_ss(d);
            dv[VD_PACK_P + r] = _cvtsh_ss(dmin);
        }
    }
}

/* Q6_K: half h of 128 elements from ql[64h..64h+63] and qh[32h..32h+31], in groups of 32: the low
 * nibbles of ql[0..31], of ql[32..63], the high nibbles of ql[0..31], of ql[32..63], each with its
 * 2-bit field of qh (bits 0, 2, 4, 6) as bits 4-5. */
static inline __attribute__((always_inline)) void vd_pack_q6k(int sc_enc, int64_t n, const void *w, size_t ws, int nr,
                                                              void *panel)
{
    const int64_t nb = n / 256;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    if (nr < VD_PACK_P) memset(panel, 0, (size_t)nb * VD_PANEL_Q6K_BLOCK(VD_PACK_P));
    for (int r = 0; r < nr; r++) {
        const vd_blk_q6_k *row = (const vd_blk_q6_k *)((const uint8_t *)w + (size_t)r * ws);
        for (int64_t b = 0; b < nb; b++) {
            const vd_blk_q6_k *blk = &row[b];
            uint8_t *ob = (uint8_t *)panel + (size_t)b * VD_PANEL_Q6K_BLOCK(VD_PACK_P);
            for (int h = 0; h < 2; h++) {
                __m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h));
                __m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h + 32));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h));
                __m256i q0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
                __m256i q1 = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
                __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
                __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                             _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
                vd_pk_put(ob, r, q0, 32 * h);
                vd_pk_put(ob, r, q1, 32 * h + 8);
                vd_pk_put(ob, r, q2, 32 * h + 16);
                vd_pk_put(ob, r, q3, 32 * h + 24);
            }
            int32_t *scv = (int32_t *)(ob + 256 * VD_PACK_P);
            int32_t *offv = scv + 16 * VD_PACK_P;
            float *dv = (float *)(offv + 8 * VD_PACK_P);
            for (int k = 0; k < 16; k++) scv[k * VD_PACK_P + r] = vd_pk_scale(blk->scales[k], sc_enc);
            for (int p = 0; p < 8; p++)
                offv[p * VD_PACK_P + r] = vd_pk_pair(-32 * blk->scales[2 * p], -32 * blk->scales[2 * p + 1]);
            dv[r] = _cvtsh_ss(blk->d);
        }
    }
}

#endif
