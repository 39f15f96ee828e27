/* vec_dot.h - fused dot products of one quantized weight row with one activation row.
 *
 * As in ggml, the f32 activation row is first converted once into the weight type's "activation
 * format" (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants, F16 for F16, BF16 for
 * BF16, F32 for F32), so the inner loop is integer multiply-adds on quantized blocks and weights are
 * never expanded to f32. Every kernel has a scalar version (the oracle) and, where the CPU has them,
 * AVX2/FMA versions picked at run time. */
#ifndef KVCHAT_VEC_DOT_H
#define KVCHAT_VEC_DOT_H

#include <stddef.h>
#include <stdint.h>

/* Activation format used for weights of type wtype, and its row size in bytes for n elements. */
uint32_t vd_act_type(uint32_t wtype);
size_t vd_act_row_size(uint32_t wtype, int64_t n);
/* Convert n f32 activations (n a multiple of the weight block size) into the activation format. */
void vd_quantize_act(uint32_t wtype, const float *x, void *dst, int64_t n);

/* *s = dot(weight row, activation row) over n elements. */
typedef void (*vd_dot_fn)(int64_t n, float *s, const void *w_row, const void *act_row);
/* The fastest kernel this CPU supports for wtype (NULL if the type is unsupported). */
vd_dot_fn vd_get_dot(uint32_t wtype);
/* The portable scalar kernel (test oracle). */
vd_dot_fn vd_get_dot_scalar(uint32_t wtype);
/* Several activation rows against one weight row: s[t * s_stride] = dot(w_row, act + t * act_stride)
 * for t < ntok (ntok <= vd_multi_max()). Decodes each weight block once for all tokens: prefill's
 * kernel. NULL when the weight type has no such kernel on this CPU (then use vd_get_dot per token). */
typedef void (*vd_dot_multi_fn)(int64_t n, float *s, size_t s_stride, const void *w_row, const void *act,
                                size_t act_stride, int ntok);
vd_dot_multi_fn vd_get_dot_multi(uint32_t wtype);
/* Two consecutive weight rows (the second w_stride bytes after the first) against up to
 * vd_multi_max() activation rows: s[t * s_stride + r] for row r = 0, 1. NULL when unavailable. */
typedef void (*vd_dot_multi2_fn)(int64_t n, float *s, size_t s_stride, const void *w_row, size_t w_stride,
                                 const void *act, size_t act_stride, int ntok);
vd_dot_multi2_fn vd_get_dot_multi2(uint32_t wtype);
int vd_multi_max(void);

/* 1 when the AVX2+FMA+F16C kernels are in use; vd_force_scalar(1) turns them off (tests, --no-simd). */
int vd_simd_active(void);
void vd_force_scalar(int on);

/* Plain f32 helpers used by attention and norms (SIMD where available). */
float vd_dot_f32(int64_t n, const float *a, const float *b);
/* y += a * x */
void vd_axpy_f32(int64_t n, float a, const float *x, float *y);

/* The same against f16 rows (the KV cache's storage), and f32 -> f16 conversion (nearest even). */
float vd_dot_f32_f16(int64_t n, const float *a, const uint16_t *b);
void vd_axpy_f16(int64_t n, float a, const uint16_t *x, float *y);
void vd_f32_to_f16(int64_t n, const float *x, uint16_t *y);

/* sum_i max(q[i] * lo[i], q[i] * hi[i]): the largest q.k over keys k with lo <= k <= hi (Quest's bound). */
float vd_bound_f32(int64_t n, const float *q, const float *lo, const float *hi);

/* y[i] = e^x[i] (AVX2 polynomial, ~1e-7 relative; libm in the portable build). x == y allowed. */
void vd_exp_f32(int64_t n, const float *x, float *y);
/* gate[i] = act(gate[i]) * up[i], act = GELU (tanh form) when gelu, else SiLU. */
void vd_glu_f32(int64_t n, float *gate, const float *up, int gelu);

#endif
