/* backend_cuda.cu - the CUDA implementation of the backend op table (kernels/backend.h), stage 1.
 *
 * What runs on the device: the matrix products (cuBLAS GEMM on f16 copies of the weights, f32
 * accumulation) and attention over the KV pages (a paged online-softmax kernel with the per-token
 * bias, the token masks, the per-KV-head page lists and the sliding window of the CPU kernel). The
 * element-wise ops (RMSNorm, RoPE, the gated activation, embedding rows) and the selection scores
 * run on a CPU backend: their inputs are host arrays, and moving them would cost more than the work.
 *
 * Weights are dequantized on the host with the reference dequantizers of engine/quant.c (the same
 * code the CPU oracle tests use), rounded to f16 and uploaded once, by `prepare` at load time or on
 * first use. The KV cache stays in host memory, where the policies read and rewrite it; each page has
 * a device copy that is brought up to date before attention reads it: only the rows appended since
 * the last upload move, unless the page's content generation changed (a reused or truncated page),
 * which uploads it whole; kernels/page_copies.c keeps that table (host-tested), this file gives it
 * the device.
 *
 * Every op synchronizes its stream before returning, since its outputs are host arrays. Stage 2
 * (docs/gpu.md) keeps activations on the device and captures the decode step in a CUDA graph. */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend.h"
#include "page_copies.h"
#include "quant.h"
}

#include "split_merge.cuh"

#define ATT_THREADS 128     /* keys scored at once by one attention block; its threads */
#define MAX_D_PER_THREAD 4  /* head_dim up to 512 */
#define COPY_IDLE 4096      /* attention calls a page copy may go unused before it is freed */

/* A device copy of one weight matrix, f16 [n_out][n_in]. */
typedef struct dev_weight {
    const void *host;   /* the be_weight's data: the key */
    __half *d;
    int64_t n_in, n_out;
} dev_weight;

/* What the attention kernel reads of a page. */
typedef struct dev_page {
    const __half *k, *v;
    const int32_t *pos;
    const float *bias;        /* NULL: none */
    int64_t mask_off;         /* first word in the mask array, -1: every token */
    int32_t n, stride, head_step;
} dev_page;

typedef struct cuda_impl {
    be_backend *cpu;
    cublasHandle_t blas;
    cudaStream_t stream;
    dev_weight *w;
    int n_w, cap_w;
    uint64_t weight_bytes;
    pc_table copies;          /* device copies of the KV pages */
    /* scratch, grown on demand */
    float *x32, *y32, *q, *out;
    __half *x16;
    int32_t *qpos;
    dev_page *pages;
    uint64_t *masks;
    int64_t *head_pages;
    float *part_o, *part_ml;   /* attention's per-split partial results */
    size_t cap_x32, cap_y32, cap_q, cap_out, cap_x16, cap_qpos, cap_pages, cap_masks, cap_hp, cap_po, cap_pml;
    int n_sm;                  /* multiprocessors: how finely decode attention splits its pages */
    uint64_t scratch_bytes;
    /* host staging */
    dev_page *h_pages;
    uint64_t *h_masks;
    float *h_x, *h_y, *h_q, *h_out;   /* staging of products' and attention's inputs and outputs */
    int32_t *h_qpos;
    int64_t *h_hp;
    size_t cap_h_pages, cap_h_masks, cap_h_x, cap_h_y, cap_h_q, cap_h_out, cap_h_qpos, cap_h_hp;
} cuda_impl;

static cuda_impl *impl_of(be_backend *b) { return (cuda_impl *)b->impl; }

/* The op table has no error path: a failure inside an op is fatal, with the reason. */
static void die(const char *what, cudaError_t e)
{
    fprintf(stderr, "kvchat: CUDA %s failed: %s\n", what, cudaGetErrorString(e));
    abort();
}

static void ck(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) die(what, e);
}

static void ckb(cublasStatus_t s, const char *what)
{
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "kvchat: cuBLAS %s failed (status %d)\n", what, (int)s);
        abort();
    }
}

/* Grow a device buffer to hold need bytes (contents are not kept). */
static void grow_dev(cuda_impl *ci, void **p, size_t *cap, size_t need)
{
    if (need <= *cap) return;
    size_t sz = need + need / 4 + 4096;
    if (*p) {
        ck(cudaFree(*p), "free");
        ci->scratch_bytes -= *cap;
    }
    cudaError_t e = cudaMalloc(p, sz);
    if (e != cudaSuccess) {
        fprintf(stderr, "kvchat: out of GPU memory: %zu bytes of scratch needed\n", sz);
        abort();
    }
    *cap = sz;
    ci->scratch_bytes += sz;
}

/* Grow a page-locked host staging buffer (contents are not kept): copies from pageable memory go
 * through a driver bounce buffer and cost tens of microseconds each, which a decode step pays about
 * ten times a layer. */
static void grow_host(void **p, size_t *cap, size_t need)
{
    if (need <= *cap) return;
    size_t sz = need + need / 4 + 4096;
    if (*p) cudaFreeHost(*p);
    *p = NULL;
    if (cudaHostAlloc(p, sz, cudaHostAllocDefault) != cudaSuccess) {
        fprintf(stderr, "kvchat: out of page-locked host memory (%zu bytes)\n", sz);
        abort();
    }
    *cap = sz;
}

/* ---------------------------------------------------------------- weights */

static dev_weight *find_weight(cuda_impl *ci, const void *host)
{
    for (int i = 0; i < ci->n_w; i++)
        if (ci->w[i].host == host) return &ci->w[i];
    return NULL;
}

/* Dequantize w on the host in blocks of rows, round to f16 and upload. 0, or -1 with a message. */
static int upload_weight(cuda_impl *ci, const be_weight *w, dev_weight **out, char *err, size_t errlen)
{
    dev_weight *have = find_weight(ci, w->data);
    if (have) {
        *out = have;
        return 0;
    }
    if (!quant_supported(w->type)) {
        snprintf(err, errlen, "weights of type %s cannot go to the GPU", quant_type_name(w->type));
        return -1;
    }
    size_t bytes = (size_t)w->n_in * (size_t)w->n_out * sizeof(__half);
    __half *d = NULL;
    cudaError_t e = cudaMalloc((void **)&d, bytes);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        snprintf(err, errlen,
                 "out of GPU memory: a %lld x %lld weight needs %.1f MiB, %.1f MiB of %.1f MiB are free "
                 "(%.1f MiB of weights already there)",
                 (long long)w->n_out, (long long)w->n_in, (double)bytes / (1 << 20), (double)fr / (1 << 20),
                 (double)tot / (1 << 20), (double)ci->weight_bytes / (1 << 20));
        return -1;
    }
    const int64_t rows = 256;
    float *row = (float *)malloc(sizeof(float) * (size_t)w->n_in);
    uint16_t *blk = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)w->n_in * rows);
    if (!row || !blk) {
        free(row);
        free(blk);
        cudaFree(d);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int64_t r0 = 0; r0 < w->n_out; r0 += rows) {
        int64_t nr = w->n_out - r0 < rows ? w->n_out - r0 : rows;
        for (int64_t r = 0; r < nr; r++) {
            quant_dequant_row(w->type, (const char *)w->data + (size_t)(r0 + r) * w->row_bytes, row, w->n_in);
            for (int64_t i = 0; i < w->n_in; i++) {
                float f = row[i];
                /* f16 saturates where bf16 weights would overflow it */
                if (f > 65504.0f) f = 65504.0f;
                if (f < -65504.0f) f = -65504.0f;
                blk[r * w->n_in + i] = quant_f32_to_fp16(f);
            }
        }
        e = cudaMemcpy(d + r0 * w->n_in, blk, sizeof(uint16_t) * (size_t)(nr * w->n_in), cudaMemcpyHostToDevice);
        if (e != cudaSuccess) break;
    }
    free(row);
    free(blk);
    if (e != cudaSuccess) {
        cudaFree(d);
        snprintf(err, errlen, "copying weights to the GPU failed: %s", cudaGetErrorString(e));
        return -1;
    }
    if (ci->n_w == ci->cap_w) {
        int nc = ci->cap_w ? ci->cap_w * 2 : 64;
        dev_weight *nw = (dev_weight *)realloc(ci->w, sizeof *nw * (size_t)nc);
        if (!nw) {
            cudaFree(d);
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        ci->w = nw;
        ci->cap_w = nc;
    }
    dev_weight *dw = &ci->w[ci->n_w++];
    dw->host = w->data;
    dw->d = d;
    dw->n_in = w->n_in;
    dw->n_out = w->n_out;
    ci->weight_bytes += bytes;
    *out = dw;
    return 0;
}

static int cuda_prepare(be_backend *b, const be_weight *const *w, int n, char *err, size_t errlen)
{
    cuda_impl *ci = impl_of(b);
    for (int i = 0; i < n; i++) {
        dev_weight *dw;
        if (upload_weight(ci, w[i], &dw, err, errlen)) return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- matmul */

__global__ void f32_to_f16(const float *x, __half *y, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half(x[i]);
}

static void cuda_matmul(be_backend *b, const be_mm *mms, int n_mm, const float *x, int64_t n_tok)
{
    cuda_impl *ci = impl_of(b);
    int64_t n_in = mms[0].w->n_in, n_x = n_tok * n_in, n_y = 0;
    dev_weight *dw[8];
    char err[600];
    for (int m = 0; m < n_mm; m++) {
        if (upload_weight(ci, mms[m].w, &dw[m], err, sizeof err)) {
            fprintf(stderr, "kvchat: %s\n", err);
            abort();
        }
        n_y += n_tok * mms[m].w->n_out;
    }
    grow_dev(ci, (void **)&ci->x32, &ci->cap_x32, sizeof(float) * (size_t)n_x);
    grow_dev(ci, (void **)&ci->x16, &ci->cap_x16, sizeof(__half) * (size_t)n_x);
    grow_dev(ci, (void **)&ci->y32, &ci->cap_y32, sizeof(float) * (size_t)n_y);
    grow_host((void **)&ci->h_x, &ci->cap_h_x, sizeof(float) * (size_t)n_x);
    grow_host((void **)&ci->h_y, &ci->cap_h_y, sizeof(float) * (size_t)n_y);
    memcpy(ci->h_x, x, sizeof(float) * (size_t)n_x);
    ck(cudaMemcpyAsync(ci->x32, ci->h_x, sizeof(float) * (size_t)n_x, cudaMemcpyHostToDevice, ci->stream), "upload");
    f32_to_f16<<<(unsigned)((n_x + 255) / 256), 256, 0, ci->stream>>>(ci->x32, ci->x16, n_x);
    ck(cudaGetLastError(), "f32_to_f16");
    const float one = 1.0f, zero = 0.0f;
    int64_t off = 0;
    for (int m = 0; m < n_mm; m++) {
        int64_t n_out = mms[m].w->n_out;
        /* column-major view: Y^T (n_out x n_tok) = W^T (stored as n_in x n_out) ^T * X^T (n_in x n_tok) */
        ckb(cublasGemmEx(ci->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)n_tok, (int)n_in, &one, dw[m]->d,
                         CUDA_R_16F, (int)n_in, ci->x16, CUDA_R_16F, (int)n_in, &zero, ci->y32 + off, CUDA_R_32F,
                         (int)n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "GEMM");
        off += n_tok * n_out;
    }
    ck(cudaMemcpyAsync(ci->h_y, ci->y32, sizeof(float) * (size_t)n_y, cudaMemcpyDeviceToHost, ci->stream), "download");
    ck(cudaStreamSynchronize(ci->stream), "matmul");
    off = 0;
    for (int m = 0; m < n_mm; m++) {
        size_t ny = (size_t)(n_tok * mms[m].w->n_out);
        memcpy(mms[m].y, ci->h_y + off, sizeof(float) * ny);
        off += (int64_t)ny;
    }
}

/* ---------------------------------------------------------------- KV page copies */

/* The device behind page_copies.c: allocations and copies on this backend's stream. */
static void *dev_alloc(void *ud, size_t bytes)
{
    (void)ud;
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

static void dev_release(void *ud, void *p)
{
    (void)ud;
    cudaFree(p);
}

static void dev_upload(void *ud, void *dst, const void *src, size_t bytes)
{
    ck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ((cuda_impl *)ud)->stream), "KV upload");
}

/* ---------------------------------------------------------------- attention */

__device__ float block_max(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < ATT_THREADS / 32; i++) r = fmaxf(r, red[i]);
    return r;
}

__device__ float block_sum(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    float r = 0;
    for (int i = 0; i < ATT_THREADS / 32; i++) r += red[i];
    return r;
}

/* One block per (query head, query, split of its KV head's pages): online softmax over that slice of
 * the pages, ATT_THREADS keys at a time (one key per thread for the scores, then each thread
 * accumulates its share of the head's dimensions over those keys); the unnormalised output, maximum
 * and sum of each split go to part_*, merged by attn_combine. Splits give a decode step (one query,
 * a few heads) enough blocks to fill the device. */
__global__ void attn_kernel(const float *q, const int32_t *q_pos, const dev_page *pages, int64_t n_pages,
                            const int64_t *head_pages, const uint64_t *masks, int n_head, int group, int D,
                            int32_t window, int n_split, float *part_o, float *part_ml)
{
    extern __shared__ float sh[];
    float *sq = sh;                 /* [D] the query */
    float *sp = sq + D;             /* [ATT_THREADS] scores, then weights */
    float *red = sp + ATT_THREADS;  /* [ATT_THREADS / 32] */
    int h = blockIdx.x, g = h / group, tid = threadIdx.x;
    int64_t t = blockIdx.y;
    int32_t qp = q_pos[t];
    const float *qt = q + (t * n_head + h) * (int64_t)D;
    for (int d = tid; d < D; d += ATT_THREADS) sq[d] = qt[d];
    float acc[MAX_D_PER_THREAD];
    for (int j = 0; j < MAX_D_PER_THREAD; j++) acc[j] = 0;
    float m = -INFINITY, l = 0;
    int64_t h0 = head_pages ? head_pages[g] : 0, h1 = head_pages ? head_pages[g + 1] : n_pages;
    int64_t per = (h1 - h0 + n_split - 1) / n_split, p0 = h0 + blockIdx.z * per;
    int64_t p1 = p0 + per < h1 ? p0 + per : h1;
    __syncthreads();
    for (int64_t ip = p0; ip < p1; ip++) {
        const dev_page pg = pages[ip];
        if (pg.n <= 0) continue;
        const __half *kb = pg.k + (int64_t)g * pg.head_step, *vb = pg.v + (int64_t)g * pg.head_step;
        for (int32_t k0 = 0; k0 < pg.n; k0 += ATT_THREADS) {
            int32_t i = k0 + tid;
            float s = -INFINITY;
            if (i < pg.n) {
                int32_t kp = pg.pos[i];
                int vis = kp <= qp && !(window > 0 && qp - kp >= window);
                if (vis && pg.mask_off >= 0) vis = (int)((masks[pg.mask_off + (i >> 6)] >> (i & 63)) & 1u);
                if (vis) {
                    const __half *kr = kb + (int64_t)i * pg.stride;
                    float dot = 0;
                    for (int d = 0; d < D; d++) dot += sq[d] * __half2float(kr[d]);
                    s = dot + (pg.bias ? pg.bias[i] : 0.0f);
                }
            }
            float mx = block_max(s, red);
            if (mx == -INFINITY) continue;   /* nothing visible in this block: every thread agrees */
            float nm = fmaxf(m, mx);
            float p = s == -INFINITY ? 0.0f : __expf(s - nm);
            float psum = block_sum(p, red);
            float corr = m == -INFINITY ? 0.0f : __expf(m - nm);
            l = l * corr + psum;
            m = nm;
            sp[tid] = p;
            __syncthreads();
            int32_t nk = pg.n - k0 < ATT_THREADS ? pg.n - k0 : ATT_THREADS;
            for (int j = 0; j < MAX_D_PER_THREAD; j++) {
                int d = tid + j * ATT_THREADS;
                if (d >= D) break;
                float a = acc[j] * corr;
                for (int32_t kk = 0; kk < nk; kk++) {
                    float w = sp[kk];
                    if (w != 0.0f) a += w * __half2float(vb[(int64_t)(k0 + kk) * pg.stride + d]);
                }
                acc[j] = a;
            }
            __syncthreads();   /* sp is rewritten by the next block of keys */
        }
    }
    int64_t row = (t * n_head + h) * n_split + blockIdx.z;
    for (int j = 0; j < MAX_D_PER_THREAD; j++) {
        int d = tid + j * ATT_THREADS;
        if (d < D) part_o[row * D + d] = acc[j];
    }
    if (tid == 0) part_ml[row * 2] = m, part_ml[row * 2 + 1] = l;
}

/* the splits of each (query, head) merged (split_merge.cuh). grid (n_head, n_q). */
__global__ void attn_combine(const float *part_o, const float *part_ml, int n_split, int n_head, int D, float *out)
{
    int h = blockIdx.x;
    int64_t t = blockIdx.y, row0 = (t * n_head + h) * n_split;
    float M = split_max(part_ml, row0, n_split);
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        out[(t * n_head + h) * (int64_t)D + d] = split_merge(part_o, part_ml, row0, n_split, D, d, M);
}

static void cuda_attention(be_backend *b, const be_attn *a)
{
    cuda_impl *ci = impl_of(b);
    int D = a->head_dim;
    if (D > ATT_THREADS * MAX_D_PER_THREAD) {
        fprintf(stderr, "kvchat: head_dim %d is more than the CUDA attention kernel's %d\n", D,
                ATT_THREADS * MAX_D_PER_THREAD);
        abort();
    }
    pc_begin_call(&ci->copies);
    /* page descriptors and masks, staged on the host and sent in one copy each */
    grow_host((void **)&ci->h_pages, &ci->cap_h_pages, sizeof(dev_page) * (size_t)(a->n_pages > 0 ? a->n_pages : 1));
    size_t n_words = 0;
    for (int64_t i = 0; i < a->n_pages; i++)
        if (a->pages[i].mask) n_words += (size_t)(a->pages[i].n + 63) / 64;
    grow_host((void **)&ci->h_masks, &ci->cap_h_masks, sizeof(uint64_t) * (n_words > 0 ? n_words : 1));
    size_t w = 0;
    for (int64_t i = 0; i < a->n_pages; i++) {
        const be_kv_page *pg = &a->pages[i];
        dev_page *dp = &ci->h_pages[i];
        memset(dp, 0, sizeof *dp);
        dp->n = pg->n;
        dp->stride = pg->stride;
        dp->head_step = pg->head_step;
        dp->mask_off = -1;
        if (pg->n <= 0) continue;
        const pc_copy *m = pc_get(&ci->copies, pg);
        if (!m) {
            fprintf(stderr, "kvchat: out of GPU memory for the KV cache (%.1f MiB of page copies held)\n",
                    (double)ci->copies.bytes / (1 << 20));
            abort();
        }
        dp->k = (const __half *)m->k;
        dp->v = (const __half *)m->v;
        dp->pos = m->pos;
        dp->bias = pg->bias ? m->bias : NULL;
        if (pg->mask) {
            size_t nw = (size_t)(pg->n + 63) / 64;
            memcpy(ci->h_masks + w, pg->mask, sizeof(uint64_t) * nw);
            dp->mask_off = (int64_t)w;
            w += nw;
        }
    }
    size_t nq = (size_t)a->n_q * (size_t)a->n_head * (size_t)D;
    grow_dev(ci, (void **)&ci->pages, &ci->cap_pages, sizeof(dev_page) * (size_t)(a->n_pages > 0 ? a->n_pages : 1));
    grow_dev(ci, (void **)&ci->masks, &ci->cap_masks, sizeof(uint64_t) * (n_words > 0 ? n_words : 1));
    grow_dev(ci, (void **)&ci->q, &ci->cap_q, sizeof(float) * nq);
    grow_dev(ci, (void **)&ci->out, &ci->cap_out, sizeof(float) * nq);
    grow_dev(ci, (void **)&ci->qpos, &ci->cap_qpos, sizeof(int32_t) * (size_t)a->n_q);
    grow_dev(ci, (void **)&ci->head_pages, &ci->cap_hp, sizeof(int64_t) * (size_t)(a->n_head_kv + 1));
    cudaStream_t s = ci->stream;
    if (a->n_pages > 0)
        ck(cudaMemcpyAsync(ci->pages, ci->h_pages, sizeof(dev_page) * (size_t)a->n_pages, cudaMemcpyHostToDevice, s),
           "upload");
    if (w) ck(cudaMemcpyAsync(ci->masks, ci->h_masks, sizeof(uint64_t) * w, cudaMemcpyHostToDevice, s), "upload");
    grow_host((void **)&ci->h_q, &ci->cap_h_q, sizeof(float) * nq);
    grow_host((void **)&ci->h_out, &ci->cap_h_out, sizeof(float) * nq);
    grow_host((void **)&ci->h_qpos, &ci->cap_h_qpos, sizeof(int32_t) * (size_t)a->n_q);
    grow_host((void **)&ci->h_hp, &ci->cap_h_hp, sizeof(int64_t) * (size_t)(a->n_head_kv + 1));
    memcpy(ci->h_q, a->q, sizeof(float) * nq);
    memcpy(ci->h_qpos, a->q_pos, sizeof(int32_t) * (size_t)a->n_q);
    ck(cudaMemcpyAsync(ci->q, ci->h_q, sizeof(float) * nq, cudaMemcpyHostToDevice, s), "upload");
    ck(cudaMemcpyAsync(ci->qpos, ci->h_qpos, sizeof(int32_t) * (size_t)a->n_q, cudaMemcpyHostToDevice, s), "upload");
    if (a->head_pages) {
        memcpy(ci->h_hp, a->head_pages, sizeof(int64_t) * (size_t)(a->n_head_kv + 1));
        ck(cudaMemcpyAsync(ci->head_pages, ci->h_hp, sizeof(int64_t) * (size_t)(a->n_head_kv + 1), cudaMemcpyHostToDevice,
                           s),
           "upload");
    }
    /* splits: about four blocks a multiprocessor in all, at least one page each */
    int64_t most = a->n_pages;
    if (a->head_pages) {
        most = 0;
        for (int g = 0; g < a->n_head_kv; g++)
            if (a->head_pages[g + 1] - a->head_pages[g] > most) most = a->head_pages[g + 1] - a->head_pages[g];
    }
    int64_t blocks = (int64_t)a->n_head * a->n_q, want = (4 * (int64_t)ci->n_sm + blocks - 1) / blocks;
    int n_split = (int)(want < 1 ? 1 : want > most ? (most > 0 ? most : 1) : want);
    size_t n_part = (size_t)a->n_q * (size_t)a->n_head * (size_t)n_split;
    grow_dev(ci, (void **)&ci->part_o, &ci->cap_po, sizeof(float) * n_part * (size_t)D);
    grow_dev(ci, (void **)&ci->part_ml, &ci->cap_pml, sizeof(float) * n_part * 2);
    dim3 grid((unsigned)a->n_head, (unsigned)a->n_q, (unsigned)n_split);
    size_t shmem = sizeof(float) * ((size_t)D + ATT_THREADS + ATT_THREADS / 32);
    attn_kernel<<<grid, ATT_THREADS, shmem, s>>>(ci->q, ci->qpos, ci->pages, a->n_pages,
                                                 a->head_pages ? ci->head_pages : NULL, ci->masks, a->n_head,
                                                 a->n_head / a->n_head_kv, D, a->window, n_split, ci->part_o,
                                                 ci->part_ml);
    ck(cudaGetLastError(), "attention kernel");
    attn_combine<<<dim3((unsigned)a->n_head, (unsigned)a->n_q), ATT_THREADS, 0, s>>>(ci->part_o, ci->part_ml, n_split,
                                                                                    a->n_head, D, ci->out);
    ck(cudaGetLastError(), "attention combine");
    ck(cudaMemcpyAsync(ci->h_out, ci->out, sizeof(float) * nq, cudaMemcpyDeviceToHost, s), "download");
    ck(cudaStreamSynchronize(s), "attention");
    memcpy(a->out, ci->h_out, sizeof(float) * nq);
}

/* ---------------------------------------------------------------- host-side ops */

static void cuda_rmsnorm(be_backend *b, const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps)
{
    be_backend *c = impl_of(b)->cpu;
    c->ops->rmsnorm(c, x, w, y, rows, dim, eps);
}

static void cuda_rope(be_backend *b, float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos,
                      float freq_base, float freq_scale, int neox)
{
    be_backend *c = impl_of(b)->cpu;
    c->ops->rope(c, x, n_tok, n_heads, head_dim, pos, freq_base, freq_scale, neox);
}

static void cuda_glu(be_backend *b, float *gate, const float *up, int64_t n, int gelu)
{
    be_backend *c = impl_of(b)->cpu;
    c->ops->glu(c, gate, up, n, gelu);
}

static void cuda_get_rows(be_backend *b, const be_weight *w, const int32_t *ids, int64_t n, float scale, float *out)
{
    be_backend *c = impl_of(b)->cpu;
    c->ops->get_rows(c, w, ids, n, scale, out);
}

static void cuda_scores(be_backend *b, const float *m, int64_t n_rows, int64_t dim, const float *x, float *y)
{
    be_backend *c = impl_of(b)->cpu;
    c->ops->scores(c, m, n_rows, dim, x, y);
}

static void cuda_memory(be_backend *b, uint64_t *held, uint64_t *total)
{
    cuda_impl *ci = impl_of(b);
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    *held = ci->weight_bytes + ci->copies.bytes + ci->scratch_bytes;
    *total = (uint64_t)tot;
}

static void cuda_destroy(be_backend *b)
{
    cuda_impl *ci = impl_of(b);
    if (ci) {
        for (int i = 0; i < ci->n_w; i++) cudaFree(ci->w[i].d);
        free(ci->w);
        pc_free(&ci->copies);
        void *dev[] = { ci->x32, ci->y32, ci->q, ci->out, ci->x16, ci->qpos, ci->pages, ci->masks, ci->head_pages,
                        ci->part_o, ci->part_ml };
        for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
        void *host[] = { ci->h_pages, ci->h_masks, ci->h_x, ci->h_y, ci->h_q, ci->h_out, ci->h_qpos, ci->h_hp };
        for (size_t i = 0; i < sizeof host / sizeof *host; i++)
            if (host[i]) cudaFreeHost(host[i]);
        if (ci->blas) cublasDestroy(ci->blas);
        if (ci->stream) cudaStreamDestroy(ci->stream);
        be_free(ci->cpu);
        free(ci);
    }
    free(b);
}

static const be_ops cuda_ops = {
    "cuda", cuda_matmul, cuda_rmsnorm, cuda_rope, cuda_glu, cuda_get_rows, cuda_attention, cuda_scores,
    cuda_prepare, cuda_memory, cuda_destroy,
};

extern "C" int be_cuda_devices(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

extern "C" be_backend *be_cuda_create(int n_threads, char *err, size_t errlen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(err, errlen, "no CUDA device (%s); use --device cpu",
                 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return NULL;
    }
    be_backend *b = (be_backend *)calloc(1, sizeof *b);
    cuda_impl *ci = (cuda_impl *)calloc(1, sizeof *ci);
    if (!b || !ci) {
        free(b);
        free(ci);
        snprintf(err, errlen, "out of memory creating the CUDA backend");
        return NULL;
    }
    b->ops = &cuda_ops;
    b->impl = ci;
    pc_device dev = { ci, dev_alloc, dev_release, dev_upload };
    pc_init(&ci->copies, &dev, COPY_IDLE);
    if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaStreamCreate(&ci->stream)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&ci->n_sm, cudaDevAttrMultiProcessorCount, 0)) != cudaSuccess) {
        snprintf(err, errlen, "CUDA device 0: %s", cudaGetErrorString(e));
        cuda_destroy(b);
        return NULL;
    }
    if (cublasCreate(&ci->blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(ci->blas, ci->stream) != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cuBLAS could not start");
        ci->blas = NULL;
        cuda_destroy(b);
        return NULL;
    }
    ci->cpu = be_cpu_create(n_threads, err, errlen);
    if (!ci->cpu) {
        cuda_destroy(b);
        return NULL;
    }
    b->n_threads = ci->cpu->n_threads;
    return b;
}
