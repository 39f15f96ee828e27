/* quant.h - ggml weight formats: type ids, block geometry, half/bfloat conversion and the scalar
 * reference dequantizers that are the oracle for every SIMD kernel.
 *
 * Layouts follow docs/ARCHITECTURE.md and ../shared/docs/model-facts.md section 3. The fast fused dot
 * products live in kernels/cpu/vec_dot.*; this file is deliberately plain C. */
#ifndef KVCHAT_QUANT_H
#define KVCHAT_QUANT_H

#include <stddef.h>
#include <stdint.h>

enum ggml_type {
    GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6, GGML_TYPE_Q5_1 = 7, GGML_TYPE_Q8_0 = 8, GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10, GGML_TYPE_Q3_K = 11, GGML_TYPE_Q4_K = 12, GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14, GGML_TYPE_Q8_K = 15, GGML_TYPE_BF16 = 30,
    GGML_TYPE_MAX_ID = 64   /* ids >= this are rejected outright by the GGUF reader */
};

#define QK_K 256
#define QK32 32

/* Block geometry of a type id. Returns 0 and fills blck/type_size for every type whose size is
 * known (including types kvchat cannot compute with, so the GGUF reader can bound-check them);
 * -1 for ids that are retired or unknown. */
int quant_block_geometry(uint32_t type, int64_t *blck, int64_t *type_size);
/* Name as ggml spells it ("Q4_K", "F16"), or "type#N" for unknown ids (static buffer per call site
 * is not used: unknown ids return the constant "unknown"). */
const char *quant_type_name(uint32_t type);
/* 1 if kvchat can dequantize and multiply this weight type. */
int quant_supported(uint32_t type);
/* Bytes of a row of n elements (n must be a multiple of the block size). */
size_t quant_row_size(uint32_t type, int64_t n);

float quant_fp16_to_f32(uint16_t h);
uint16_t quant_f32_to_fp16(float f);     /* round to nearest even, like the hardware conversion */
float quant_bf16_to_f32(uint16_t b);
uint16_t quant_f32_to_bf16(float f);     /* round to nearest even; NaN stays NaN */

/* Scalar reference dequantization of n elements (a multiple of the block size) starting at src. */
void quant_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);

/* 1 if quant_quantize_row can write this type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
 * Q5_K, Q6_K). */
int quant_can_quantize(uint32_t type);
/* Scalar reference quantization of n f32 elements (a multiple of the block size) into dst
 * (quant_row_size(type, n) bytes), as the reference implementation makes model files without an
 * importance matrix: nearest rounding for the 32-element formats, the weighted scale-and-minimum
 * search for Q4_K/Q5_K and the signed scale search for Q6_K. Deterministic: the same floats give
 * the same bytes. 0, or -1 for a type it cannot write or n not a multiple of the block size. */
int quant_quantize_row(uint32_t type, const float *src, void *dst, int64_t n);

#endif
