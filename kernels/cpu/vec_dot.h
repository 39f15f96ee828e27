/* vec_dot.h - fused dot products of quantized weight rows with activation rows, and the run-time
 * choice of instruction set behind them.
 *
 * As in ggml, the f32 activation row is first converted once into the weight type's "activation
 * format" (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants, F16 for F16, BF16 for
 * BF16, F32 for F32), so the inner loop is integer multiply-adds on quantized blocks and weights are
 * never expanded to f32. Every kernel has a portable version that gives its bits (docs/numerics.md);
 * AVX2, AVX-VNNI and AVX-512 versions are picked at run time from what the CPU and the OS support
 * (vd_isa_*). */
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
/* The fastest one-row kernel this CPU supports for wtype (NULL if the type is unsupported); for the
 * types with panel kernels that is the portable one (the backend multiplies those by panels and
 * rows kernels, which give its bits). */
vd_dot_fn vd_get_dot(uint32_t wtype);
/* The portable kernel: every SIMD kernel's bits, on any CPU. */
vd_dot_fn vd_get_dot_scalar(uint32_t wtype);

/* Instruction sets the kernels come in, in order of preference. A level without its own version of
 * a kernel runs the AVX2 one (every level above scalar includes AVX2, FMA and F16C). */
typedef enum vd_isa {
    VD_ISA_SCALAR = 0,   /* portable C */
    VD_ISA_AVX2,         /* AVX2 + FMA + F16C */
    VD_ISA_AVXVNNI,      /* AVX2 + AVX-VNNI (the VEX-encoded vpdpbusd/vpdpwssd on 256-bit vectors) */
    VD_ISA_AVX512,       /* AVX-512 F/BW/VL/DQ + AVX512-VNNI, with the ZMM and mask state enabled */
    VD_ISA_COUNT
} vd_isa;
/* 1 when this CPU has isa and the OS saves its registers (cpuid and xgetbv; never the build flags). */
int vd_isa_supported(vd_isa isa);
/* The best supported level, and the one the kernels use now: the best, or $KVCHAT_ISA when it names
 * a supported level, or what vd_set_isa chose; scalar while vd_force_scalar(1) is in effect. */
vd_isa vd_isa_best(void);
vd_isa vd_isa_active(void);
/* "scalar", "avx2", "avxvnni", "avx512"; and a description ("AVX-512 F/BW/VL/DQ + VNNI"). */
const char *vd_isa_name(vd_isa isa);
const char *vd_isa_describe(vd_isa isa);
/* Use isa's kernels from now on (by name: one of vd_isa_name's). 0, or -1 with a message when the
 * name is unknown or the CPU lacks it; the choice is then unchanged. */
int vd_set_isa(vd_isa isa, char *err, size_t errlen);
int vd_set_isa_name(const char *name, char *err, size_t errlen);
/* One line for `kvchat info`: the active level, its description and the levels this CPU supports,
 * e.g. "avx512 (AVX-512 F/BW/VL/DQ + VNNI); this CPU: scalar avx2 avx512". */
void vd_isa_summary(char *buf, size_t cap);
/* When $KVCHAT_ISA is set but unknown or unsupported (the best level is used instead): the message
 * saying so; else NULL. */
const char *vd_isa_env_error(void);

/* 1 when a SIMD level is in use; vd_force_scalar(1) turns SIMD off until vd_force_scalar(0) (tests,
 * --no-simd), which returns to the chosen level. */
int vd_simd_active(void);
void vd_force_scalar(int on);

/* Prefill products: a panel of weight rows times many tokens. A panel is vd_gemm.rows consecutive
 * weight rows rearranged so that one vector holds 4 consecutive elements of every row (lanes =
 * rows), the layout integer dot-product instructions with a broadcast activation operand want. The
 * caller packs a panel into scratch once and multiplies it by every token of the batch, whose
 * activations are quantized once with vd_gemm_quantize_act. Results equal vd_get_dot's up to the
 * order of the f32 additions: the integer block sums are the same. */
typedef struct vd_gemm {
    int rows;                                   /* weight rows per panel */
    size_t (*panel_bytes)(int64_t n);           /* scratch for one panel of n-element rows */
    /* Pack rows [0, nrows) of w (rows w_stride bytes apart; nrows <= rows, the rest are zero). */
    void (*pack)(int64_t n, const void *w, size_t w_stride, int nrows, void *panel);
    /* y[t * ldy + r] = dot(row r, activation row t) for r < nrows, t < ntok. */
    void (*mul)(int64_t n, const void *panel, int nrows, const void *act, size_t act_stride, int64_t ntok,
                float *y, size_t ldy);
} vd_gemm;
/* The panel kernels of the active level for wtype, or NULL (no SIMD, or no panel kernel for it). */
const vd_gemm *vd_get_gemm(uint32_t wtype);
/* One activation row (vd_quantize_act's format) against nrows <= 8 weight rows w_stride bytes
 * apart: y[r] = dot(row r, act), bit for bit what the panel kernels give that row and token (decode
 * then equals prefill). NULL where vd_get_gemm is NULL. */
typedef void (*vd_dot_rows_fn)(int64_t n, float *y, const void *w, size_t w_stride, int nrows, const void *act);
vd_dot_rows_fn vd_get_dot_rows(uint32_t wtype);
/* The activation rows the panel kernels read: bytes per row (a multiple of 64), quantization of
 * an f32 row, and the same built from a row already in vd_quantize_act's format (tests). */
size_t vd_gemm_act_row_size(uint32_t wtype, int64_t n);
void vd_gemm_quantize_act(uint32_t wtype, const float *x, void *dst, int64_t n);
void vd_gemm_act_from_dot_act(uint32_t wtype, const void *act, void *dst, int64_t n);

/* Plain f32 helpers used by attention and norms (SIMD where available). */
float vd_dot_f32(int64_t n, const float *a, const float *b);
/* y += a * x */
void vd_axpy_f32(int64_t n, float a, const float *x, float *y);

/* The same against f16 rows (the KV cache's storage), and f32 -> f16 conversion (nearest even). */
float vd_dot_f32_f16(int64_t n, const float *a, const uint16_t *b);
void vd_axpy_f16(int64_t n, float a, const uint16_t *x, float *y);
void vd_f32_to_f16(int64_t n, const float *x, uint16_t *y);

/* A page's key summary folded with f16 key rows k, k + stride, ... (rows of them), one after the
 * other: sum[i] += k[i], mn[i] = k[i] < mn[i] ? k[i] : mn[i], mx[i] = k[i] > mx[i] ? k[i] : mx[i] (so a
 * NaN key changes neither bound). Several rows at once keep the summary in registers between them;
 * the floats are those of one row at a time. */
void vd_key_summary(int64_t n, int64_t rows, const uint16_t *k, int64_t stride, float *sum, float *mn, float *mx);

/* The bits set in now[0 .. words) (*set) and of them those set in last too (*shared), now then
 * copied into last: one pass, the CPU's popcount where it has one. */
void vd_bits_overlap(int64_t words, const uint64_t *now, uint64_t *last, int64_t *set, int64_t *shared);

/* P dot products of one vector x[0 .. n) side by side: out[p] = x[0] * pt[p] + x[1] * pt[P + p] + ...
 * added in element order, each product rounded before it is added (no fused multiply-add): the
 * floats of a plain loop over one plane at a time. pt holds the planes transposed ([n][P]: plane
 * p's element i at pt[i * P + p]), so the lanes run over planes (LASER-KV's SimHash codes,
 * kernels/lsh_kernels.h). */
void vd_plane_dots(int64_t n, int64_t P, const float *pt, const float *x, float *out);

/* The dots in double of `rows` vectors x, x + ldx, .. ([n] doubles each, every value a float
 * widened) with P vectors held transposed in double, every value a float widened too (vector p's
 * element i at pt[i * P + p]): out[r * P + p] = x_r[0] * v_p[0] + x_r[1] * v_p[1] + ..., added in
 * element order. A float times a float is exact in double (48 significant bits), so a fused
 * multiply-add rounds once as the product's add does: the doubles of a plain loop, whatever the
 * lanes. Chelsea's cosines (kernels/cpu/soft_links.c). */
void vd_pair_dots_f64(int64_t n, int64_t P, const double *pt, int64_t rows, const double *x, int64_t ldx, double *out);
/* `rows` float rows x, x + ldx, .. of n elements widened to double and transposed, out[i * rows + p]
 * = row p's element i, and each row's squared norm in element order, norms[p] = x_p[0]^2 + x_p[1]^2
 * + ... (exact products: the plain loop's doubles). The B rows vd_pair_dots_f64 runs against. */
void vd_widen_transpose(int64_t rows, int64_t n, const float *x, int64_t ldx, double *out, double *norms);
/* Cosines from dots and squared norms: out[p] = (float)(d[p] / sqrt(na * nb[p])) where na > 0 and
 * nb[p] > 0, else 0 (a NaN norm gives 0). Every operation correctly rounded, in the lanes as alone. */
void vd_cosines_f64(int64_t n, const double *d, double na, const double *nb, float *out);

/* sum_i max(q[i] * lo[i], q[i] * hi[i]): the largest q.k over keys k with lo <= k <= hi (Quest's bound). */
float vd_bound_f32(int64_t n, const float *q, const float *lo, const float *hi);

/* Blocked (flash-style) attention over a block of nk keys for a tile of query rows, rows in the
 * vector lanes. rp is the row count padded to a multiple of 16 (padding rows are zero in qt).
 * Scores: s[k * rp + r] = sum_d qt[d * rp + r] * kb[k * d_head + d]  (qt: the queries transposed,
 * kb: the keys as f32 rows), for r < rp, k < nk.
 * Accumulation: o[r * d_head + d] = o[r * d_head + d] * corr[r] + sum_k p[k * rp + r] * vb[k * d_head + d]
 * for r < nr (vb: the values as f32 rows; p laid out like s). */
void vd_attn_scores(int d_head, int nk, int rp, const float *qt, const float *kb, float *s);
void vd_attn_accum(int d_head, int nk, int nr, int rp, const float *p, const float *vb, const float *corr, float *o);
/* f16 -> f32 (exact). */
void vd_f16_to_f32(int64_t n, const uint16_t *x, float *y);

/* RMS norm of one row: y[i] = x[i] * (1 / sqrt(mean(x^2) + eps)) * w[i], the mean of squares
 * accumulated in double (as the reference implementation does). y may equal x. */
void vd_rmsnorm_f32(int64_t n, const float *x, const float *w, float *y, float eps);

/* y[i] = e^x[i] (AVX2 polynomial, ~1e-7 relative; libm in the portable build). x == y allowed. */
void vd_exp_f32(int64_t n, const float *x, float *y);
/* gate[i] = act(gate[i]) * up[i], act = GELU (tanh form) when gelu, else SiLU. */
void vd_glu_f32(int64_t n, float *gate, const float *up, int gelu);

#endif
