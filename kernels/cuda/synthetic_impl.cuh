/* synthetic_impl.cuh - what the two halves of the synthetic benchmark share (kernels/cuda/synthetic.cu:
 * the model, the decode step and its policies; kernels/cuda/synthetic_prefill.cu: chunked prefill and
 * time to first token): sizes, error handling, the model's buffers, launch helpers and the tensor-core
 * primitives. Internal to kernels/cuda/. */
#ifndef KVCHAT_SYNTHETIC_IMPL_CUH
#define KVCHAT_SYNTHETIC_IMPL_CUH

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "kernels/synthetic.h"
}

#define SY_P 32          /* tokens per page (the engine's) */
#define SY_HD 128        /* head size of the shapes here */
#define SY_G 4           /* query heads per KV head (32/8) */
#define SY_MAX_PAGES 4096 /* per sequence in one selection block: 128K tokens */

/* ---------------------------------------------------------------- errors */

typedef struct sy_err {
    char *buf;
    size_t len;
    int failed;
} sy_err;

#define CK(e, what)                                                                                     \
    do {                                                                                                \
        cudaError_t e_ = (e);                                                                           \
        if (e_ != cudaSuccess) {                                                                        \
            if (!E->failed) snprintf(E->buf, E->len, "%s: %s", what, cudaGetErrorString(e_));           \
            E->failed = 1;                                                                              \
            goto fail;                                                                                  \
        }                                                                                               \
    } while (0)
#define CKB(s, what)                                                                                    \
    do {                                                                                                \
        cublasStatus_t s_ = (s);                                                                        \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                              \
            if (!E->failed) snprintf(E->buf, E->len, "%s: cuBLAS status %d", what, (int)s_);            \
            E->failed = 1;                                                                              \
            goto fail;                                                                                  \
        }                                                                                               \
    } while (0)

/* Programmatic dependent launch (sm_90): a decode kernel's blocks may be placed while the previous
 * kernel finishes; each waits here until that kernel's writes are visible, then lets the next one be
 * placed in turn. Launch gaps between the ~320 kernels of a step are what it saves. */
static __device__ __forceinline__ void pdl_enter()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* the index of the largest of l[0..n) (ties: the lowest), in every thread of the block */
static __device__ __forceinline__ int block_argmax(const float *l, int n)
{
    __shared__ float bv[32];
    __shared__ int bi[32];
    float best = -INFINITY;
    int arg = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (l[i] > best) best = l[i], arg = i;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, arg, o);
        if (ov > best || (ov == best && oi < arg)) best = ov, arg = oi;
    }
    if ((threadIdx.x & 31) == 0) bv[threadIdx.x >> 5] = best, bi[threadIdx.x >> 5] = arg;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (bv[w] > bv[0] || (bv[w] == bv[0] && bi[w] < bi[0])) bv[0] = bv[w], bi[0] = bi[w];
    __syncthreads();
    return bi[0];
}

/* uniform in [-1, 1): the self-checks' random inputs (an LCG, seeded by the caller) */
static inline double sy_rand(uint64_t *st)
{
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*st >> 11) / 9007199254740992.0 * 2 - 1;
}

static __device__ __forceinline__ float block_sum(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[w] = v;
    __syncthreads();
    float t = 0;
    for (int i = 0; i < nw; i++) t += red[i];
    return t;
}


#define TC_STAGES 3
#define TC_PAGE_HALVES (SY_P * SY_HD)
#define TC_SMEM (TC_STAGES * 2 * TC_PAGE_HALVES * 2)

static __device__ __forceinline__ unsigned smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

/* offset (in halves) of the 16-byte chunk `chunk` of row `row` in a swizzled page */
static __device__ __forceinline__ int swz(int row, int chunk) { return row * SY_HD + ((chunk ^ (row & 7)) << 3); }

static __device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
static __device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

static __device__ __forceinline__ void ldsm_x4(unsigned r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
static __device__ __forceinline__ void ldsm_x4_t(unsigned r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
static __device__ __forceinline__ void mma16816(float c[4], const unsigned a[4], unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ unsigned pack_half2(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *(unsigned *)&h;
}

typedef struct sy_layer {
    __half *wqkv, *wo, *wgu, *wdown;   /* [out][in] f16 */
    float *attn_norm, *ffn_norm;
    __half *K, *V;                     /* this case's pages: [phys][kv][P][HD] */
} sy_layer;

typedef struct sy_model {
    const synth_shape *s;
    sy_layer *L;
    __half *emb, *out;                 /* [vocab][d] */
    float *out_norm;
    double weight_bytes;               /* read by every step: every product's matrix and the norms */
    int gemm;                          /* SYNTH_GEMM_*: which kernels multiply (sy_gemm) */
    int pdl;                           /* programmatic dependent launch between decode kernels */
    /* a profiled step (KVCHAT_SYNTH_PROFILE): an event after every launch, and its category */
    int profiling, prof_n;
    cudaEvent_t prof_ev[1024];
    int prof_cat[1024];
    cublasHandle_t blas;
    cudaStream_t st;
    void *blas_ws;
} sy_model;

void *sy_dalloc(size_t bytes, sy_err *E, const char *what);
static inline unsigned grid_for(size_t n) { return (unsigned)(n / 256 + 1 < 65536 ? n / 256 + 1 : 65536); }

/* a decode kernel, launched with programmatic stream serialization where the device has it */
template <typename... P, typename... A>
static cudaError_t launch(sy_model *m, dim3 grid, dim3 block, size_t smem, void (*kern)(P...), A... args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1] = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = m->st;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = m->pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kern, args...);
}

/* y[B][n_out] (f32) = x[B][n_in] (f16) W^T (+ y when acc): the decode product up to batch 4, cuBLAS above */
cublasStatus_t sy_gemm(sy_model *m, const __half *W, int n_out, int n_in, const __half *x, int B, float *y, int acc);
double sy_used_gib(void);

/* kernels of synthetic.cu the prefill uses too */
__global__ void k_rmsnorm(const float *x, const float *w, __half *y, int d, float eps);
__global__ void k_swiglu(const float *gu, __half *h, int n_ff, int rows);
__global__ void k_fill_half(__half *p, size_t n, uint64_t seed, float scale);

/* chunked prefill of one sequence of ctx tokens in chunks of `chunk` under full attention or TAKE
 * (synthetic_prefill.cu): the time to the first token and what it kept */
typedef struct sy_ttft {
    double ms, kv_kept_gib, peak_gib;
} sy_ttft;
int sy_prefill(sy_model *m, int take, int ctx, int chunk, sy_ttft *out, sy_err *E);
/* the prefill attention kernel against a double-precision host reference */
int sy_prefill_selfcheck(double *err_out, sy_err *E);

#endif
