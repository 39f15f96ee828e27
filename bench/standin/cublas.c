/* cublas.c - a cuBLAS that runs nothing, beside the stand-in CUDA runtime (cudart.c): built as
 * libcublas.so.13, it answers the backend's handle, stream and GemmEx calls at once, for timing
 * the CUDA backend's host work without a GPU (make bench-host-cost). A product launches one kernel
 * through the stand-in runtime, as the real library's launch through the real one: a launch failure
 * or fault the runtime is asked for (KVCHAT_STANDIN_FAIL, cudart.c) fails the product too. */
#include <cublas_v2.h>
#include <stdlib.h>

cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    *h = calloc(1, 16);
    return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    (void)h, (void)s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t ctype, cublasGemmAlgo_t algo)
{
    (void)h, (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)A, (void)Atype, (void)lda;
    (void)B, (void)Btype, (void)ldb, (void)beta, (void)C, (void)Ctype, (void)ldc, (void)ctype, (void)algo;
    const dim3 one = {1, 1, 1};
    if (cudaLaunchKernel((const void *)cublasGemmEx, one, one, NULL, 0, NULL) != cudaSuccess) {
        (void)cudaGetLastError();   /* the library reports its own status */
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}
