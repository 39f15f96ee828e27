/* vec_gemm.cu - the CUDA backend's products of many tokens (prefill): cuBLAS GemmEx with f16
 * operands and f32 accumulation, on an F16 weight itself or on tiles of rows dequantized into f16
 * scratch (dequant_tile); the inputs rounded to f16 (to_half), which attention's rows also use. */
#include "kernels/cuda/backend_cuda.cuh"

#define WTILE_BYTES ((size_t)32 << 20)   /* the f16 scratch a prefill product's weight tiles use */

/* A product's input rounded to f16 for cuBLAS, saturating at +-65504 (qb_f16_range). */
static __global__ void f32_to_f16(const float *x, __half *y, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half_rn(qb_f16_range(x[i]));
}

/* x rounded to f16 into y (n values) on the stream. 0, or -1 (recorded). */
int to_half(cuda_impl *ci, const float *x, __half *y, int64_t n)
{
    f32_to_f16<<<(unsigned)((n + 255) / 256), 256, 0, ci->stream>>>(x, y, n);
    return ck(ci, cudaGetLastError(), "f32_to_f16");
}


/* Rows [r0, r0 + n_rows) of W dequantized to f16 into out[n_rows][n_in]: a thread a group of 32,
 * values beyond f16's range saturating at +-65504 (as kernels/weight_f16.c converts). */
template <uint32_t TYPE>
__global__ void dequant_tile(const uint8_t *__restrict__ W, size_t stride, int64_t n_in, int64_t r0, int64_t n_rows,
                             __half *__restrict__ out)
{
    const int64_t gpr = n_in / 32, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows * gpr) return;
    const int64_t r = i / gpr, g = i - r * gpr;
    const int gpb = qb_block_values(TYPE) / 32;
    float v[32];
    qb_decode32(TYPE, W + (size_t)(r0 + r) * stride + (size_t)(g / gpb) * qb_block_bytes(TYPE), (int)(g % gpb), v);
    __align__(16) __half h[32];
#pragma unroll
    for (int j = 0; j < 32; j++) h[j] = __float2half_rn(qb_f16_range(v[j]));
    uint4 *o = (uint4 *)(out + r * n_in + g * 32);
#pragma unroll
    for (int k = 0; k < 4; k++) o[k] = ((const uint4 *)h)[k];
}
/* y = W x for any number of tokens through cuBLAS: x16 is the input in f16 [n_tok][n_in]. F16
 * weights are multiplied as they are; the others a tile of rows at a time, dequantized into f16
 * scratch. 0, or -1 (recorded). */
int gemm(cuda_impl *ci, const dev_weight *dw, const __half *x16, int64_t n_tok, float *dy)
{
    if (seg_end(ci)) return -1;   /* cuBLAS is not recorded (it may allocate its workspace) */
    const float one = 1.0f, zero = 0.0f;
    const int64_t n_in = dw->n_in, n_out = dw->n_out;
    /* column-major view: Y^T (n_out x n_tok) = W^T (stored as n_in x n_out) ^T * X^T (n_in x n_tok) */
    if (dw->type == GGML_TYPE_F16)
        return ckb(ci, cublasGemmEx(ci->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)n_tok, (int)n_in, &one, dw->d,
                                    CUDA_R_16F, (int)(dw->stride / 2), x16, CUDA_R_16F, (int)n_in, &zero, dy, CUDA_R_32F,
                                    (int)n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "GEMM");
    int64_t tile = (int64_t)(WTILE_BYTES / (sizeof(__half) * (size_t)n_in));
    if (tile < 1) tile = 1;
    if (tile > n_out) tile = n_out;
    if (grow_dev(ci, (void **)&ci->wtile, &ci->cap_wtile, sizeof(__half) * (size_t)(tile * n_in))) return -1;
    for (int64_t r0 = 0; r0 < n_out; r0 += tile) {
        const int64_t nr = n_out - r0 < tile ? n_out - r0 : tile, n_groups = nr * (n_in / 32);
        const unsigned blocks = (unsigned)((n_groups + 255) / 256);
#define LAUNCH_DQ(T) dequant_tile<T><<<blocks, 256, 0, ci->stream>>>(dw->d, dw->stride, n_in, r0, nr, ci->wtile)
        FOR_DEVICE_TYPE(dw->type, LAUNCH_DQ)
#undef LAUNCH_DQ
        if (ck(ci, cudaGetLastError(), "weight tile") ||
            ckb(ci, cublasGemmEx(ci->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)n_tok, (int)n_in, &one, ci->wtile,
                                 CUDA_R_16F, (int)n_in, x16, CUDA_R_16F, (int)n_in, &zero, dy + r0, CUDA_R_32F,
                                 (int)n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "GEMM"))
            return -1;
    }
    return 0;
}
