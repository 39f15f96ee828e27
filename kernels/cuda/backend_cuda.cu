/* backend_cuda.cu - the CUDA implementation of the backend op table (kernels/backend.h).
 *
 * What runs on the device: the matrix products (decode: a kernel reading the weights as the file
 * stores them; prefill: cuBLAS GEMM on f16 tiles; f32 accumulation), attention over the KV pages (a paged online-softmax kernel with the per-token
 * bias, the token masks, the per-KV-head page lists and the sliding window of the CPU kernel), and
 * the element-wise ops (RMSNorm, RoPE, the gated activation, residual adds, scaling) when their
 * buffers are bound. Embedding rows are gathered on the device when it holds the weight as stored
 * (a tied output weight; decoded exactly, get_rows_kernel), else dequantized on the host; the
 * selection scores run on a CPU backend. The sampler's candidates (be_pick) are sorted out of the logits where the
 * output product left them (kernels/pick_kernels.h), and only the k best and the entropy come back.
 *
 * Activations: the forward pass binds its scratch buffers; each gets a device twin
 * (kernels/act_mirror.c keeps which side holds the newest bytes) and ops leave their outputs there,
 * so a decode step waits for the device once a layer, when the host needs the new K/V rows (and,
 * under a policy, the queries), or, when no policy looks between them, not at all before its
 * pick: attention takes the step's own rows beside the pages, and their download, issued at the
 * end of the layers, comes in with the pick's answer (one wait a step). Bound host buffers are
 * page-locked. Small inputs and
 * new KV rows go through a page-locked staging arena without waiting; norm weights are kept on the
 * device while their host bytes stay the same. Ops given unbound addresses stage them and wait.
 *
 * Weights go to the device once, by `prepare` at load time or on first use: Q4_0, Q5_0, Q8_0, Q4_K,
 * Q5_K, Q6_K, F16 and BF16 as the file stores them (rows padded to 16 bytes), the other types
 * dequantized by the reference dequantizers on the CPU backend's threads and rounded to f16
 * (kernels/weight_f16.c). Products of at most QB_MAX_TOK tokens (decode) read the stored bytes
 * directly (mmv_kernel, decoding with kernels/quant_blocks.h); larger ones (prefill) run on cuBLAS:
 * F16 weights as they are, the others dequantized a tile of rows at a time into f16 scratch.
 *
 * The KV cache stays in host memory, where the policies read and rewrite it; each page has a device copy (one block of
 * kernels/block_pool.c) that is brought up to date before attention reads it: only the rows
 * appended since the last upload move, unless the page's content generation changed (a reused or
 * truncated page), which uploads it whole; kernels/page_copies.c keeps that table (host-tested),
 * this file gives it the device.
 *
 * A failed op (out of memory, a device error) is recorded, the ops after it do nothing, and the
 * forward pass asks (be_failed) and abandons the chunk.
 *
 * What is left for a CUDA-graph decode step (docs/gpu.md): page lists built without the host (the
 * cache's structure on the device), so that a step's launches can be recorded once and replayed. */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels/act_mirror.h"
#include "kernels/backend.h"
#include "kernels/block_pool.h"
#include "kernels/cuda/const_copies.h"
#include "kernels/page_copies.h"
#include "kernels/page_tables.h"
#include "kernels/summary_lists.h"
#include "kernels/upload_batch.h"
#include "common/quant.h"
#include "kernels/weight_f16.h"
}
#include "kernels/quant_blocks.h"
#include "kernels/decode_dot.h"
#include "kernels/attn_group.h"
#include "kernels/attn_flash.h"
#include "kernels/pick_kernels.h"
#include "kernels/bound_kernels.h"
#include "kernels/score_kernels.h"
#include "kernels/fused_kernels.h"
#include "kernels/mean_kernels.h"
#include "kernels/mass_kernels.h"

#define ATT_THREADS 128     /* keys scored at once by one attention block; its threads */
#define MAX_D_PER_THREAD 4  /* head_dim up to 512 */
#define COPY_IDLE 4096      /* attention calls a page copy may go unused before it is freed */
#define EW_THREADS 256      /* threads of the element-wise kernels' blocks */

/* A device copy of one weight matrix: n_out rows `stride` bytes apart (padded to 16), holding the
 * file's bytes for the types the kernels decode and f16 values for the others. */
typedef struct dev_weight {
    const void *host;   /* the be_weight's data: the key */
    uint8_t *d;
    uint32_t type;      /* of the device bytes: the file's type, or F16 when converted */
    size_t stride;
    int64_t n_in, n_out;
} dev_weight;

/* What the attention kernels read of a page (kernels/attn_group.h). */
typedef ag_page dev_page;

typedef struct cuda_impl {
    be_backend *cpu;
    cublasHandle_t blas;
    cudaStream_t stream;
    dev_weight *w;
    int n_w, cap_w;
    uint64_t weight_bytes;
    pc_table copies;          /* device copies of the KV pages */
    pt_set tables;            /* attention's page descriptors on the device, per named list */
    ub_batch batch;           /* an attention call's rows and descriptors, sent as one (send_batch) */
    int32_t *cur_pos;         /* a deferred decode step's positions on the device */
    size_t cap_cur_pos;
    bp_pool blocks;           /* where the copies live: blocks carved from 64 MiB device chunks */
    /* scratch, grown on demand */
    float *y32, *out;          /* outputs of products and attention bound for unbound host arrays */
    __half *cur16;             /* a deferred decode step's own K/V rows in f16, keys then values */
    size_t cap_cur16;
    be_kv_page *rows_list;     /* the page lists with those rows added (be_attn_rows_list) */
    size_t cap_rows_list;
    __half *x16;               /* the products' input in f16 */
    __half *wtile;             /* a tile of a weight's rows dequantized to f16 for cuBLAS */
    size_t cap_wtile;
    float *xal;                /* a decode product's input copied to 16-byte alignment when it is not */
    size_t cap_xal;
    int8_t *xq;                /* a decode product's input in 8-bit codes (kernels/decode_dot.h) */
    float *xd;                 /* and their scales, one per 32 */
    size_t cap_xq, cap_xd;
    int no_mmv;                /* KVCHAT_CUDA_MMV=0: every product through cuBLAS, to compare */
    int mmv_f32;               /* KVCHAT_CUDA_MMV=f32: decode products by the f32 kernel (stage 0's) */
    int mmv_inflight;          /* KVCHAT_CUDA_MMV_INFLIGHT: reads of a row each lane has in flight */
    int64_t mmv_max;           /* KVCHAT_CUDA_MMV_MAX: most tokens through the decode kernel (-1: by type) */
    unsigned mmv_smem_set;     /* bit per type slot: the decode kernel's shared memory limit raised */
    float *part_o, *part_ml;   /* attention's per-split partial results */
    uint64_t *pick_keys;       /* the pick's lists of candidates, two rounds' worth */
    float *pick_max;           /* each slice's largest value (the entropy's reference) */
    double *pick_sums;         /* each slice's entropy sums */
    uint8_t *pick_res, *h_pick;   /* the answer: entropy, varentropy, then the k best keys */
    size_t cap_pick_keys, cap_pick_max, cap_pick_sums, cap_pick_res, cap_h_pick;
    sl_table sums;             /* the selection policies' summaries on the device, per named list */
    float *bd_u;               /* the bounds, a row of `stride` a KV head (-inf past a head's count) */
    uint64_t *bd_keys;         /* each head's k best keys (the last merge round's) */
    uint8_t *h_bd;             /* page-locked: the keys, then the bounds, on their way back */
    size_t cap_bd_u, cap_bd_keys, cap_h_bd;
    ag_page *sel_pages;        /* a selection by bounds as its list, built on the device (sel_gather_kernel) */
    int64_t *sel_hp;           /* and its per-head offsets */
    size_t cap_sel_pages, cap_sel_hp;
    double *km_sq;             /* CHESS's rows: each (row, unit)'s sum of squares (key_means_kernel) */
    size_t cap_km_sq;
    float *ms_e, *ms_factor, *ms_acc;   /* the attention mass: a pass's scores then weights, factors, sums */
    float *h_ms;               /* page-locked: the sums on their way back */
    size_t cap_ms_e, cap_ms_factor, cap_ms_acc, cap_h_ms;
    void *ms_host;             /* the queries packed and the pages' first tokens, before staging */
    size_t cap_ms_host;
    size_t cap_y32, cap_out, cap_x16, cap_po, cap_pml;
    int n_sm;                  /* multiprocessors: how finely decode attention splits its pages */
    int attn_scalar;           /* KVCHAT_CUDA_ATTN=scalar: a block per query head (attn_kernel), to compare */
    int attn_splits;           /* KVCHAT_CUDA_ATTN_SPLITS: the grouped and flash kernels' splits (0: by the device) */
    int attn_flash;            /* prefill chunks on the tensor cores (attn_flash_kernel); KVCHAT_CUDA_ATTN=grouped:
                                * on the grouped kernel, to compare */
    size_t flash_smem_set;     /* the flash kernel's shared memory limit as raised so far */
    int flash_refused;         /* the device's shared memory is too small for it: said once */
    uint64_t flash_calls;      /* attention calls the flash kernel ran (be_cuda_flash_calls) */
    uint64_t scratch_bytes;
    /* page-locked host buffers: outputs on their way back */
    float *h_y, *h_out;
    size_t cap_h_y, cap_h_out;
    am_table act;              /* device twins of the bound activation buffers */
    /* staging arena for small inputs sent without a wait (positions, page lists, norm weights):
     * page-locked host bytes and their device twin, reused after each wait for the stream */
    char *h_arena, *d_arena;
    size_t arena_cap, arena_off;
    cc_table consts;           /* device copies of small constant inputs (norm weights) */
    uint8_t *h_wstage;         /* page-locked: weight rows on their way to the device */
    size_t cap_wstage;
    uint64_t waits, bytes_up, bytes_down;   /* traffic (be_ops.counters) */
    int failed;                /* an op failed: ops do nothing until cuda_failed reports it */
    int dead;                  /* the failure was a device error that no wait clears */
    char fail_msg[320];
} cuda_impl;

static cuda_impl *impl_of(be_backend *b) { return (cuda_impl *)b->impl; }

/* The op table has no error return: the first failure is recorded with its reason, every op after
 * it does nothing, and the forward pass asks (cuda_failed), abandons the chunk and reports it. */
static int fail(cuda_impl *ci, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(cuda_impl *ci, const char *fmt, ...)
{
    if (!ci->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ci->fail_msg, sizeof ci->fail_msg, fmt, ap);
        va_end(ap);
        ci->failed = 1;
    }
    return -1;
}

static int ck(cuda_impl *ci, cudaError_t e, const char *what)
{
    return e == cudaSuccess ? 0 : fail(ci, "CUDA %s failed: %s", what, cudaGetErrorString(e));
}

static int ckb(cuda_impl *ci, cublasStatus_t s, const char *what)
{
    return s == CUBLAS_STATUS_SUCCESS ? 0 : fail(ci, "cuBLAS %s failed (status %d)", what, (int)s);
}

static double free_mib(void)
{
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    return (double)fr / (1 << 20);
}

/* Grow a device buffer to hold need bytes (contents are not kept). 0, or -1 (recorded). */
static int grow_dev(cuda_impl *ci, void **p, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t sz = need + need / 4 + 4096;
    if (*p) {
        cudaFree(*p);
        ci->scratch_bytes -= *cap;
    }
    *p = NULL;
    *cap = 0;
    if (cudaMalloc(p, sz) != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        return fail(ci, "out of GPU memory: %.1f MiB of scratch needed, %.1f MiB free", (double)sz / (1 << 20),
                    free_mib());
    }
    *cap = sz;
    ci->scratch_bytes += sz;
    return 0;
}

/* Grow a page-locked host staging buffer (contents are not kept): copies from pageable memory go
 * through a driver bounce buffer and cost tens of microseconds each. 0, or -1 (recorded). */
static int grow_host(cuda_impl *ci, void **p, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t sz = need + need / 4 + 4096;
    if (*p) cudaFreeHost(*p);
    *p = NULL;
    *cap = 0;
    if (cudaHostAlloc(p, sz, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        return fail(ci, "out of page-locked host memory: %.1f MiB needed", (double)sz / (1 << 20));
    }
    *cap = sz;
    return 0;
}

/* Wait for everything issued on the stream; the staging arena is free again after. */
static int sync_stream(cuda_impl *ci, const char *what)
{
    ci->arena_off = 0;
    ci->waits++;
    if (ck(ci, cudaStreamSynchronize(ci->stream), what)) return -1;
    am_waited(&ci->act);   /* what the host prefetched is in */
    return 0;
}

static size_t stage_size(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

/* Room for `total` bytes of staging (the sum of stage_size of each piece) in the arena, so that the
 * pieces one op stages all stay valid until its kernels run: when the arena is short, wait for the
 * stream (freeing it) and grow it if needed. */
static int stage_reserve(cuda_impl *ci, size_t total)
{
    if (ci->arena_off + total <= ci->arena_cap) return 0;
    /* full: wait for the stream (freeing it), and grow it, so that a step's staging fits without
     * a wait next time (up to 256 MiB; one piece larger than that gets an arena of its own size) */
    int was_used = ci->arena_off > 0;
    if (sync_stream(ci, "staging")) return -1;
    size_t limit = (size_t)256 << 20;
    if (total <= ci->arena_cap && (!was_used || ci->arena_cap >= limit)) return 0;
    size_t cap = ci->arena_cap ? ci->arena_cap * 2 : (size_t)1 << 20;
    if (cap > limit) cap = limit;
    if (cap < total) cap = total;
    if (ci->h_arena) cudaFreeHost(ci->h_arena);
    if (ci->d_arena) cudaFree(ci->d_arena);
    ci->scratch_bytes -= ci->arena_cap;
    ci->h_arena = ci->d_arena = NULL;
    ci->arena_cap = 0;
    if (cudaHostAlloc((void **)&ci->h_arena, cap, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        ci->h_arena = NULL;
        return fail(ci, "out of page-locked host memory: %.1f MiB of staging needed", (double)cap / (1 << 20));
    }
    if (cudaMalloc((void **)&ci->d_arena, cap) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFreeHost(ci->h_arena);
        ci->h_arena = NULL;
        ci->d_arena = NULL;
        return fail(ci, "out of GPU memory: %.1f MiB of staging needed, %.1f MiB free", (double)cap / (1 << 20),
                    free_mib());
    }
    ci->arena_cap = cap;
    ci->scratch_bytes += cap;
    return 0;
}

/* Copy bytes of host memory through the arena to dst, or to the arena's own device bytes when dst
 * is NULL (*where: the device address written). 0, or -1 (recorded). */
static int arena_send(cuda_impl *ci, void *dst, const void *src, size_t bytes, void **where)
{
    if (stage_reserve(ci, stage_size(bytes))) return -1;
    size_t off = ci->arena_off;
    memcpy(ci->h_arena + off, src, bytes);
    ci->bytes_up += bytes;
    *where = dst ? dst : ci->d_arena + off;
    if (ck(ci, cudaMemcpyAsync(*where, ci->h_arena + off, bytes, cudaMemcpyHostToDevice, ci->stream), "staging"))
        return -1;
    ci->arena_off = off + stage_size(bytes);
    return 0;
}

/* Send bytes of host memory to the device without waiting; the device address is valid for work
 * issued on the stream before the next wait. An op staging several pieces reserves their room
 * first (stage_reserve), since making room here would free what it staged before. */
static void *stage(cuda_impl *ci, const void *src, size_t bytes)
{
    void *d = NULL;
    return arena_send(ci, NULL, src, bytes, &d) ? NULL : d;
}

/* Copy host bytes to a device address without waiting, through the arena (the host bytes may
 * change as soon as this returns). 0, or -1 (recorded). */
static int send_to(cuda_impl *ci, void *dst, const void *src, size_t bytes)
{
    void *d = NULL;
    return ci->failed ? -1 : arena_send(ci, dst, src, bytes, &d);
}

/* ---------------------------------------------------------------- constant inputs */

static void *dev_malloc(void *ud, size_t bytes);
static void dev_free(void *ud, void *p);

static int const_upload(void *ud, void *dst, const void *src, size_t bytes)
{
    return send_to((cuda_impl *)ud, dst, src, bytes);
}

/* The device copy of host[0, bytes) (kernels/cuda/const_copies.c), brought up to date; NULL
 * (recorded) when out of memory or not sent. */
static const void *const_get(cuda_impl *ci, const void *host, size_t bytes)
{
    enum cc_status st;
    const void *d = cc_get(&ci->consts, host, bytes, &st);
    if (st == CC_NO_HOST_MEMORY) fail(ci, "out of memory");
    if (st == CC_NO_DEVICE_MEMORY)
        fail(ci, "out of GPU memory: %zu bytes of constants needed, %.1f MiB free", bytes, free_mib());
    return d;
}

/* ---------------------------------------------------------------- activation twins */

/* Device memory for the twins and the page copies' chunks: NULL when out of memory (the failure is
 * reported by the caller, not by the next launch). */
static void *dev_malloc(void *ud, size_t bytes)
{
    (void)ud;
    void *p = NULL;
    if (cudaMalloc(&p, bytes) == cudaSuccess) return p;
    (void)cudaGetLastError();
    return NULL;
}

static void dev_free(void *ud, void *p)
{
    (void)ud;
    cudaFree(p);
}

static void act_upload(void *ud, void *dst, const void *src, size_t bytes)
{
    cuda_impl *ci = (cuda_impl *)ud;
    ci->bytes_up += bytes;
    ck(ci, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ci->stream), "activation upload");
}

static void act_download(void *ud, void *dst, const void *src, size_t bytes)
{
    cuda_impl *ci = (cuda_impl *)ud;
    ci->bytes_down += bytes;
    ck(ci, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ci->stream), "activation download");
}

static void act_wait(void *ud) { sync_stream((cuda_impl *)ud, "activation copy"); }

/* Page-lock a bound buffer so its copies are direct; a buffer that cannot be (it shares a page with
 * one already locked) still works, through the driver's bounce buffer. */
static void act_pin(void *ud, void *host, size_t bytes, int pin)
{
    (void)ud;
    if (pin ? cudaHostRegister(host, bytes, cudaHostRegisterDefault) : cudaHostUnregister(host))
        (void)cudaGetLastError();
}

static int bind_as(be_backend *b, void *host, size_t bytes, char *err, size_t errlen,
                   int (*how)(am_table *, void *, size_t))
{
    cuda_impl *ci = impl_of(b);
    if (bytes == 0 || am_bound(&ci->act, host, bytes)) {
        snprintf(err, errlen, "internal error: an activation buffer bound twice or empty");
        return -1;
    }
    if (how(&ci->act, host, bytes) == 0) return 0;
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    snprintf(err, errlen, "out of GPU memory: an activation buffer needs %.1f MiB, %.1f MiB of %.1f MiB are free",
             (double)bytes / (1 << 20), (double)fr / (1 << 20), (double)tot / (1 << 20));
    return -1;
}

static int cuda_bind(be_backend *b, void *host, size_t bytes, char *err, size_t errlen)
{
    return bind_as(b, host, bytes, err, errlen, am_bind);
}

/* Rows only ops write (CHESS's): no upload at first use, no page-locking of the host copy. */
static int cuda_bind_blank(be_backend *b, void *host, size_t bytes, char *err, size_t errlen)
{
    return bind_as(b, host, bytes, err, errlen, am_bind_blank);
}

static void cuda_unbind(be_backend *b, void *host)
{
    sync_stream(impl_of(b), "unbind");
    am_unbind(&impl_of(b)->act, host);
}

/* The op table's ranges to the act mirror's, 16 at a time. */
static void act_ranges(be_backend *b, const be_range *r, int n, void (*fn)(am_table *, const am_range *, int))
{
    am_range ar[16];
    for (int i0 = 0; i0 < n; i0 += 16) {
        int k = n - i0 < 16 ? n - i0 : 16;
        for (int i = 0; i < k; i++) ar[i] = am_range{ r[i0 + i].p, r[i0 + i].bytes };
        fn(&impl_of(b)->act, ar, k);
    }
}

static void cuda_host_read(be_backend *b, const be_range *r, int n) { act_ranges(b, r, n, am_host_read); }
static void cuda_host_prefetch(be_backend *b, const be_range *r, int n) { act_ranges(b, r, n, am_host_prefetch); }

static void cuda_host_write(be_backend *b, void *p, size_t bytes) { am_host_write(&impl_of(b)->act, p, bytes); }

/* Before a CPU op reads or writes an activation: bring the host copy up to date. */
static void host_in(cuda_impl *ci, const void *p, size_t bytes)
{
    am_range r = { p, bytes };
    am_host_read(&ci->act, &r, 1);
}

static int bound(cuda_impl *ci, const void *p, size_t bytes) { return am_bound(&ci->act, p, bytes); }

/* ---------------------------------------------------------------- weights */

static dev_weight *find_weight(cuda_impl *ci, const void *host)
{
    for (int i = 0; i < ci->n_w; i++)
        if (ci->w[i].host == host) return &ci->w[i];
    return NULL;
}

/* Copy w to the device a block of rows at a time through one half of a page-locked buffer while
 * the other half is on its way: the file's bytes for the types the kernels decode, else rows
 * dequantized and rounded to f16 on the CPU backend's threads. Each row lands `stride` bytes after
 * the previous one (padded to 16, for the kernels' aligned loads). 0, or -1 with a message. */
static int upload_weight(cuda_impl *ci, const be_weight *w, dev_weight **out, char *err, size_t errlen)
{
    dev_weight *have = find_weight(ci, w->data);
    if (have) {
        /* copies are keyed by address: a weight must stay where it is for the backend's life (as
         * a model's mapped file does); another weight at a freed one's address would be multiplied
         * as the old one */
        if (have->n_in != w->n_in || have->n_out != w->n_out ||
            have->type != be_gpu_weight_type(w->type, w->n_in)) {
            snprintf(err, errlen, "internal error: a %lld x %lld %s weight at the address of a %lld x %lld one freed "
                     "before the backend", (long long)w->n_out, (long long)w->n_in, quant_type_name(w->type),
                     (long long)have->n_out, (long long)have->n_in);
            return -1;
        }
        *out = have;
        return 0;
    }
    if (!quant_supported(w->type)) {
        snprintf(err, errlen, "weights of type %s cannot go to the GPU", quant_type_name(w->type));
        return -1;
    }
    const uint32_t dtype = be_gpu_weight_type(w->type, w->n_in);
    const int native = dtype == w->type;
    const size_t row_bytes = native ? w->row_bytes : sizeof(uint16_t) * (size_t)w->n_in;
    const size_t stride = (size_t)be_gpu_weight_stride(w->type, w->n_in);
    const size_t bytes = (size_t)be_gpu_weight_bytes(w->type, w->n_in, w->n_out);
    uint8_t *d = NULL;
    cudaError_t e = cudaMalloc((void **)&d, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        snprintf(err, errlen,
                 "out of GPU memory: a %lld x %lld %s weight needs %.1f MiB, %.1f MiB of %.1f MiB are free "
                 "(%.1f MiB of weights already there)",
                 (long long)w->n_out, (long long)w->n_in, quant_type_name(w->type), (double)bytes / (1 << 20),
                 (double)fr / (1 << 20), (double)tot / (1 << 20), (double)ci->weight_bytes / (1 << 20));
        return -1;
    }
    const size_t half_bytes = (size_t)16 << 20;
    int64_t rows = (int64_t)(half_bytes / row_bytes);
    if (rows < 1) rows = 1;
    if (rows > w->n_out) rows = w->n_out;
    size_t blk_bytes = row_bytes * (size_t)rows;
    if (2 * blk_bytes > ci->cap_wstage) {
        if (ci->h_wstage) cudaFreeHost(ci->h_wstage);
        ci->h_wstage = NULL;
        ci->cap_wstage = 0;
        if (cudaHostAlloc((void **)&ci->h_wstage, 2 * blk_bytes, cudaHostAllocDefault) != cudaSuccess) {
            (void)cudaGetLastError();
            ci->h_wstage = NULL;
            cudaFree(d);
            snprintf(err, errlen, "out of page-locked host memory copying weights (%.1f MiB)",
                     2.0 * (double)blk_bytes / (1 << 20));
            return -1;
        }
        ci->cap_wstage = 2 * blk_bytes;
    }
    cudaEvent_t done[2];
    done[0] = done[1] = NULL;
    if (cudaEventCreateWithFlags(&done[0], cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&done[1], cudaEventDisableTiming) != cudaSuccess) {
        if (done[0]) cudaEventDestroy(done[0]);
        cudaFree(d);
        snprintf(err, errlen, "CUDA events could not be made: %s", cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    int half = 0, oom = 0;
    for (int64_t r0 = 0; r0 < w->n_out && e == cudaSuccess; r0 += rows, half ^= 1) {
        int64_t nr = w->n_out - r0 < rows ? w->n_out - r0 : rows;
        uint8_t *h = ci->h_wstage + (size_t)half * blk_bytes;
        if ((e = cudaEventSynchronize(done[half])) != cudaSuccess) break;   /* this half's previous copy is done */
        if (native) {
            memcpy(h, (const uint8_t *)w->data + (size_t)r0 * w->row_bytes, (size_t)nr * w->row_bytes);
        } else if (wf16_rows(be_cpu_pool(ci->cpu), w, r0, r0 + nr, (uint16_t *)h)) {
            oom = 1;
            break;
        }
        e = cudaMemcpy2DAsync(d + (size_t)r0 * stride, stride, h, row_bytes, row_bytes, (size_t)nr,
                              cudaMemcpyHostToDevice, ci->stream);
        if (e == cudaSuccess) e = cudaEventRecord(done[half], ci->stream);
    }
    cudaError_t se = cudaStreamSynchronize(ci->stream);
    if (e == cudaSuccess) e = se;
    cudaEventDestroy(done[0]);
    cudaEventDestroy(done[1]);
    if (oom) {
        cudaFree(d);
        snprintf(err, errlen, "out of memory converting weights");
        return -1;
    }
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
    dw->type = dtype;
    dw->stride = stride;
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

/* ---------------------------------------------------------------- matmul
 *
 * Decode (at most QB_MAX_TOK tokens), kernels/decode_dot.h: decode_dot_kernel, a warp per row,
 * reading it straight from global memory. Quantized types: the input is first rounded to 8-bit
 * codes in blocks of 32 (quantize_act, once for all the products that share it), then each lane
 * multiplies 16 values at a time in integers (dp4a). F16/BF16: 16-byte loads of 8 values times the
 * f32 input. The lanes' sums meet by a butterfly of shuffles. KVCHAT_CUDA_MMV=f32 runs stage 0's
 * kernel instead (mmv_kernel: exact weights times f32 activations through shared memory; a block of
 * MMV_WARPS warps computes MMV_ROWS rows a warp, the row read in chunks of QB_CHUNK values, the
 * lanes decoding groups of 32 with qb_lane_dot), to compare the two on a GPU. Prefill: cuBLAS
 * GemmEx with f16 operands and f32 accumulation, on the F16 weight itself or on tiles of rows
 * dequantized into f16 scratch (dequant_tile). */

#define MMV_WARPS 8
#define MMV_ROWS 2
#define WTILE_BYTES ((size_t)32 << 20)   /* the f16 scratch a prefill product's weight tiles use */

/* A product's input rounded to f16 for cuBLAS, saturating at +-65504 (qb_f16_range). */
__global__ void f32_to_f16(const float *x, __half *y, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half_rn(qb_f16_range(x[i]));
}

/* The lanes' sums of each token added by a butterfly (every lane ends with the same sum; the host
 * tests add in the same order) and written by lane 0 to y[t * n_out]. */
static __device__ void warp_sums_out(float *acc, int n_tok, int lane, float *y, int64_t n_out)
{
#pragma unroll
    for (int t = 0; t < QB_MAX_TOK; t++) {
        if (t >= n_tok) continue;
        float v = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) y[(int64_t)t * n_out] = v;
    }
}

/* y[t][row] = dot(row of W, x[t]) for rows of n_in values (a multiple of 32), t < n_tok <= QB_MAX_TOK.
 * Dynamic shared memory: mmv_smem(TYPE, n_tok) bytes. x must be 16-byte aligned. */
template <uint32_t TYPE>
__global__ void __launch_bounds__(MMV_WARPS * 32)
    mmv_kernel(const uint8_t *__restrict__ W, size_t stride, int64_t n_in, int64_t n_out, const float *__restrict__ x,
               int n_tok, float *__restrict__ y)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const int ldx = QB_CHUNK / 32 * QB_XSTRIDE;
    float *xs = (float *)smem;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint8_t *wb = smem + sizeof(float) * (size_t)(ldx * n_tok) + (size_t)warp * qb_chunk_bytes(TYPE);
    const int64_t row0 = ((int64_t)blockIdx.x * MMV_WARPS + warp) * MMV_ROWS;
    const int bv = qb_block_values(TYPE), bb = qb_block_bytes(TYPE);
    float acc[MMV_ROWS][QB_MAX_TOK];
#pragma unroll
    for (int r = 0; r < MMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < QB_MAX_TOK; t++) acc[r][t] = 0.0f;
    for (int64_t k0 = 0; k0 < n_in; k0 += QB_CHUNK) {
        const int kc = (int)(n_in - k0 < QB_CHUNK ? n_in - k0 : QB_CHUNK);
        const int q4 = kc / 4;
        __syncthreads();   /* every warp is done with the previous chunk's activations */
        for (int i = threadIdx.x; i < n_tok * q4; i += blockDim.x) {
            const int t = i / q4, e = (i - t * q4) * 4;
            const float4 v = *(const float4 *)(x + (int64_t)t * n_in + k0 + e);
            *(float4 *)(xs + t * ldx + (e >> 5) * QB_XSTRIDE + (e & 31)) = v;
        }
        __syncthreads();
        /* the chunk's bytes: a multiple of 16 but for the row's last chunk, whose 16-byte reads run
         * into the row's padding */
        const int n16 = (kc / bv * bb + 15) >> 4;
#pragma unroll
        for (int r = 0; r < MMV_ROWS; r++) {
            const int64_t row = row0 + r;
            if (row < n_out) {   /* the same for the whole warp */
                const uint4 *src = (const uint4 *)(W + (size_t)row * stride + (size_t)(k0 / bv) * bb);
                for (int i = lane; i < n16; i += 32) ((uint4 *)wb)[i] = __ldg(src + i);
                __syncwarp();
                qb_lane_dot(TYPE, wb, kc / 32, xs, ldx, n_tok, lane, acc[r]);
                __syncwarp();   /* the buffer is refilled by the next row */
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MMV_ROWS; r++)
        if (row0 + r < n_out) warp_sums_out(acc[r], n_tok, lane, y + row0 + r, n_out);
}

static size_t mmv_smem(uint32_t type, int n_tok)
{
    return sizeof(float) * (size_t)(QB_CHUNK / 32 * QB_XSTRIDE) * (size_t)n_tok +
           (size_t)MMV_WARPS * (size_t)qb_chunk_bytes(type);
}

#define DD_WARPS 4   /* warps (rows) per block of the decode kernels */

/* n_blocks blocks of 32 activations (over all tokens: rows of n_in % 32 == 0 values are whole
 * blocks) rounded to 8-bit codes q and scales d (decode_dot.h): a warp per block, its largest
 * magnitude met by shuffles. */
__global__ void __launch_bounds__(256)
    quantize_act(const float *__restrict__ x, int64_t n_blocks, int8_t *__restrict__ q, float *__restrict__ d)
{
    const int64_t blk = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (blk >= n_blocks) return;   /* the whole warp */
    const float v = x[blk * DD_QBLOCK + lane];
    float a = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = dd_amax2(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float s = dd_scale(a);
    q[blk * DD_QBLOCK + lane] = dd_code(v, s);
    if (lane == 0) d[blk] = s;
}

/* y[t][row] = dot(row of W, token t), t < n_tok <= QB_MAX_TOK, a warp per row: for a quantized W
 * from the tokens' codes xq [n_tok][n_in] and scales xd [n_tok][n_in / 32] (quantize_act), each lane
 * with INFLIGHT reads of the row in flight (KVCHAT_CUDA_MMV_INFLIGHT); for F16/BF16 from the f32
 * tokens x [n_tok][n_in] (16-byte aligned). */
template <uint32_t TYPE, int INFLIGHT>
__global__ void __launch_bounds__(DD_WARPS * 32)
    decode_dot_kernel(const uint8_t *__restrict__ W, size_t stride, int64_t n_in, int64_t n_out,
                      const float *__restrict__ x, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                      int n_tok, float *__restrict__ y)
{
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * DD_WARPS + (threadIdx.x >> 5);
    if (row >= n_out) return;   /* the whole warp */
    float acc[QB_MAX_TOK];
#pragma unroll
    for (int t = 0; t < QB_MAX_TOK; t++) acc[t] = 0.0f;
    if (dd_integer_type(TYPE))
        dd_lane_dot_q(TYPE, W + (size_t)row * stride, n_in, xq, xd, n_tok, lane, 32, INFLIGHT, acc);
    else
        dd_lane_dot_h(TYPE, W + (size_t)row * stride, n_in, x, n_tok, lane, 32, acc);
    warp_sums_out(acc, n_tok, lane, y + row, n_out);
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

/* The type's slot in ci->mmv_smem_set. */
static int type_slot(uint32_t t)
{
    switch (t) {
    case GGML_TYPE_Q4_0: return 0;
    case GGML_TYPE_Q5_0: return 1;
    case GGML_TYPE_Q8_0: return 2;
    case GGML_TYPE_Q4_K: return 3;
    case GGML_TYPE_Q5_K: return 4;
    case GGML_TYPE_Q6_K: return 5;
    case GGML_TYPE_F16: return 6;
    default: return 7;
    }
}

/* Launch the template instance of a device type: F(TYPE) expands to a launch. */
#define FOR_DEVICE_TYPE(t, F)                      \
    switch (t) {                                   \
    case GGML_TYPE_Q4_0: F(GGML_TYPE_Q4_0); break; \
    case GGML_TYPE_Q5_0: F(GGML_TYPE_Q5_0); break; \
    case GGML_TYPE_Q8_0: F(GGML_TYPE_Q8_0); break; \
    case GGML_TYPE_Q4_K: F(GGML_TYPE_Q4_K); break; \
    case GGML_TYPE_Q5_K: F(GGML_TYPE_Q5_K); break; \
    case GGML_TYPE_Q6_K: F(GGML_TYPE_Q6_K); break; \
    case GGML_TYPE_F16: F(GGML_TYPE_F16); break;   \
    default: F(GGML_TYPE_BF16); break;             \
    }

/* Whether a decode product of dw reads 8-bit codes of its input (decode_dot.h) rather than f32. */
static int mmv_int8(const cuda_impl *ci, const dev_weight *dw) { return !ci->mmv_f32 && dd_integer_type(dw->type); }

/* y = W x for n_tok <= QB_MAX_TOK tokens: dx the 16-byte aligned f32 input (F16/BF16 weights, and
 * every type under KVCHAT_CUDA_MMV=f32), xq/xd its 8-bit codes and scales (quantized weights). 0, or
 * -1 (recorded). */
static int mmv(cuda_impl *ci, const dev_weight *dw, const float *dx, const int8_t *xq, const float *xd, int n_tok,
               float *dy)
{
    if (!ci->mmv_f32) {
        const unsigned grid = (unsigned)((dw->n_out + DD_WARPS - 1) / DD_WARPS);
#define LAUNCH_QI(T, I)                                                                                           \
    decode_dot_kernel<T, I><<<grid, DD_WARPS * 32, 0, ci->stream>>>(dw->d, dw->stride, dw->n_in, dw->n_out, dx, xq, xd, \
                                                                    n_tok, dy)
#define LAUNCH_Q(T)                             \
    do {                                        \
        if (ci->mmv_inflight == 1) LAUNCH_QI(T, 1); \
        else LAUNCH_QI(T, 2);                   \
    } while (0)
        switch (dw->type) {
        case GGML_TYPE_Q4_0: LAUNCH_Q(GGML_TYPE_Q4_0); break;
        case GGML_TYPE_Q5_0: LAUNCH_Q(GGML_TYPE_Q5_0); break;
        case GGML_TYPE_Q8_0: LAUNCH_Q(GGML_TYPE_Q8_0); break;
        case GGML_TYPE_Q4_K: LAUNCH_Q(GGML_TYPE_Q4_K); break;
        case GGML_TYPE_Q5_K: LAUNCH_Q(GGML_TYPE_Q5_K); break;
        case GGML_TYPE_Q6_K: LAUNCH_Q(GGML_TYPE_Q6_K); break;
        case GGML_TYPE_F16: LAUNCH_QI(GGML_TYPE_F16, 1); break;   /* one variant: INFLIGHT is for codes */
        default: LAUNCH_QI(GGML_TYPE_BF16, 1); break;
        }
#undef LAUNCH_QI
#undef LAUNCH_Q
        return ck(ci, cudaGetLastError(), "decode product");
    }
    const size_t smem = mmv_smem(dw->type, n_tok);
    const unsigned bit = 1u << type_slot(dw->type);
    if (!(ci->mmv_smem_set & bit)) {
        /* the most any token count needs, once per type (beyond the default 48 KiB) */
        const int most = (int)mmv_smem(dw->type, QB_MAX_TOK);
        cudaError_t e = cudaSuccess;
#define SET_SMEM(T) e = cudaFuncSetAttribute(mmv_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, most)
        FOR_DEVICE_TYPE(dw->type, SET_SMEM)
#undef SET_SMEM
        if (ck(ci, e, "decode product setup")) return -1;
        ci->mmv_smem_set |= bit;
    }
    const unsigned grid = (unsigned)((dw->n_out + MMV_WARPS * MMV_ROWS - 1) / (MMV_WARPS * MMV_ROWS));
#define LAUNCH_MMV(T) \
    mmv_kernel<T><<<grid, MMV_WARPS * 32, smem, ci->stream>>>(dw->d, dw->stride, dw->n_in, dw->n_out, dx, n_tok, dy)
    FOR_DEVICE_TYPE(dw->type, LAUNCH_MMV)
#undef LAUNCH_MMV
    return ck(ci, cudaGetLastError(), "decode product");
}

/* The most tokens a product runs through the decode kernel, in passes of QB_MAX_TOK that each read
 * the stored weight once, rather than through cuBLAS, which first writes the weight as f16 in tiles
 * and reads it back. By bytes the passes would win up to 32-64 tokens on the quantized types, but
 * measured on an H200 (docs/gpu.md, stage 0) the decode kernel's time grows with its tokens (8
 * tokens cost 3-4x one) and the tile path is 1.3-8x faster from 9 to 64 tokens at 7B shapes (equal
 * only on 4096 x 14336 at 9 tokens): so QB_MAX_TOK, until the decode kernel runs at memory speed
 * for every token count. KVCHAT_CUDA_MMV_MAX=N sets it, to measure either side. */
static int64_t mmv_most_tokens(const cuda_impl *ci) { return ci->mmv_max >= 0 ? ci->mmv_max : QB_MAX_TOK; }

static int mmv_takes(const cuda_impl *ci, const dev_weight *dw, int64_t n_tok)
{
    if (ci->no_mmv || dw->n_in % 32) return 0;
    return n_tok <= QB_MAX_TOK || n_tok <= mmv_most_tokens(ci);
}

/* y = W x for any number of tokens through cuBLAS: x16 is the input in f16 [n_tok][n_in]. F16
 * weights are multiplied as they are; the others a tile of rows at a time, dequantized into f16
 * scratch. 0, or -1 (recorded). */
static int gemm(cuda_impl *ci, const dev_weight *dw, const __half *x16, int64_t n_tok, float *dy)
{
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

static void cuda_matmul(be_backend *b, const be_mm *mms, int n_mm, const float *x, int64_t n_tok)
{
    cuda_impl *ci = impl_of(b);
    if (ci->failed || n_tok <= 0) return;
    int64_t n_in = mms[0].w->n_in, n_x = n_tok * n_in, n_y = 0;
    dev_weight *dw[8];
    char err[600];
    if (n_mm > 8) {
        fail(ci, "internal error: %d products sharing one input (at most 8)", n_mm);
        return;
    }
    for (int m = 0; m < n_mm; m++) {
        if (upload_weight(ci, mms[m].w, &dw[m], err, sizeof err)) {
            fail(ci, "%s", err);
            return;
        }
        if (!bound(ci, mms[m].y, sizeof(float) * (size_t)(n_tok * mms[m].w->n_out))) n_y += n_tok * mms[m].w->n_out;
    }
    /* each product by the decode kernel (in groups of QB_MAX_TOK tokens) or by cuBLAS on f16 */
    int by_mmv[8], any_f32 = 0, any_int8 = 0, any_gemm = 0;
    for (int m = 0; m < n_mm; m++) {
        by_mmv[m] = mmv_takes(ci, dw[m], n_tok);
        any_int8 |= by_mmv[m] && mmv_int8(ci, dw[m]);
        any_f32 |= by_mmv[m] && !mmv_int8(ci, dw[m]);
        any_gemm |= !by_mmv[m];
    }
    if (any_gemm && grow_dev(ci, (void **)&ci->x16, &ci->cap_x16, sizeof(__half) * (size_t)n_x)) return;
    if (n_y && grow_dev(ci, (void **)&ci->y32, &ci->cap_y32, sizeof(float) * (size_t)n_y)) return;
    if (n_y && grow_host(ci, (void **)&ci->h_y, &ci->cap_h_y, sizeof(float) * (size_t)n_y)) return;
    const float *dx = (const float *)am_dev_in(&ci->act, x, sizeof(float) * (size_t)n_x);
    if (!dx && !(dx = (const float *)stage(ci, x, sizeof(float) * (size_t)n_x))) return;
    if (any_f32 && ((uintptr_t)dx & 15)) {
        /* the kernel reads the activations 16 bytes at a time */
        if (grow_dev(ci, (void **)&ci->xal, &ci->cap_xal, sizeof(float) * (size_t)n_x) ||
            ck(ci, cudaMemcpyAsync(ci->xal, dx, sizeof(float) * (size_t)n_x, cudaMemcpyDeviceToDevice, ci->stream),
               "aligning the input"))
            return;
        dx = ci->xal;
    }
    if (any_gemm) {
        f32_to_f16<<<(unsigned)((n_x + 255) / 256), 256, 0, ci->stream>>>(dx, ci->x16, n_x);
        if (ck(ci, cudaGetLastError(), "f32_to_f16")) return;
    }
    if (any_int8) {   /* the input's 8-bit codes, once for every product that reads them */
        const int64_t n_blocks = n_x / DD_QBLOCK;
        if (grow_dev(ci, (void **)&ci->xq, &ci->cap_xq, (size_t)n_x) ||
            grow_dev(ci, (void **)&ci->xd, &ci->cap_xd, sizeof(float) * (size_t)n_blocks))
            return;
        quantize_act<<<(unsigned)((n_blocks + 7) / 8), 256, 0, ci->stream>>>(dx, n_blocks, ci->xq, ci->xd);
        if (ck(ci, cudaGetLastError(), "quantize_act")) return;
    }
    int64_t off = 0;
    for (int m = 0; m < n_mm; m++) {
        int64_t n_out = mms[m].w->n_out;
        /* the output's twin when it is bound, else scratch copied back below */
        float *dy = (float *)am_dev_out(&ci->act, mms[m].y, sizeof(float) * (size_t)(n_tok * n_out));
        if (!dy) {
            dy = ci->y32 + off;
            off += n_tok * n_out;
        }
        if (!by_mmv[m]) {
            if (gemm(ci, dw[m], ci->x16, n_tok, dy)) return;
            continue;
        }
        for (int64_t t0 = 0; t0 < n_tok; t0 += QB_MAX_TOK) {   /* rows of n_in % 32 == 0 floats: aligned */
            const int nt = (int)(n_tok - t0 < QB_MAX_TOK ? n_tok - t0 : QB_MAX_TOK);
            const int8_t *xq = any_int8 ? ci->xq + t0 * n_in : NULL;
            const float *xd = any_int8 ? ci->xd + t0 * (n_in / DD_QBLOCK) : NULL;
            if (mmv(ci, dw[m], dx + t0 * n_in, xq, xd, nt, dy + t0 * n_out)) return;
        }
    }
    if (!n_y) return;
    ci->bytes_down += sizeof(float) * (size_t)n_y;
    if (ck(ci, cudaMemcpyAsync(ci->h_y, ci->y32, sizeof(float) * (size_t)n_y, cudaMemcpyDeviceToHost, ci->stream),
           "download") ||
        sync_stream(ci, "matmul"))
        return;
    off = 0;
    for (int m = 0; m < n_mm; m++) {
        size_t ny = (size_t)(n_tok * mms[m].w->n_out);
        if (bound(ci, mms[m].y, sizeof(float) * ny)) continue;
        memcpy(mms[m].y, ci->h_y + off, sizeof(float) * ny);
        off += (int64_t)ny;
    }
}

/* ---------------------------------------------------------------- KV page copies */

/* The device behind page_copies.c: blocks from the pool (kernels/block_pool.c; a block given back
 * may be reused at once, since every later copy into it is ordered after the kernels that read it
 * on this backend's one stream) and copies on that stream. */
static void *dev_alloc(void *ud, size_t bytes) { return bp_get(&((cuda_impl *)ud)->blocks, bytes); }

static void dev_release(void *ud, void *p) { bp_put(&((cuda_impl *)ud)->blocks, p); }

/* KV rows join the attention call's upload batch (send_batch sends it before the kernels): one
 * copy and one scatter kernel a call, where a copy each (three a page) cost a few microseconds of
 * the driver's time apiece, about a thousand a decode step of a 7B-shaped model. */
static int dev_upload(void *ud, void *dst, const void *src, size_t bytes)
{
    cuda_impl *ci = (cuda_impl *)ud;
    return ub_add(&ci->batch, dst, src, bytes) ? fail(ci, "out of memory") : 0;
}

/* Block i puts piece i of a batch in place (kernels/upload_batch.h). */
__global__ void scatter_kernel(const unsigned char *base, const ub_piece *pieces)
{
    ub_scatter_piece(base, &pieces[blockIdx.x], (int)threadIdx.x, (int)blockDim.x);
}

/* A lost batch: what the page copies and descriptor lists count as sent never arrived, so both
 * forget it and send everything again at their next use. */
static void lose_batch(cuda_impl *ci)
{
    ub_clear(&ci->batch, 0);
    pc_forget_rows(&ci->copies);
    pt_forget(&ci->tables);
    sl_forget(&ci->sums);
}

/* Send the queued pieces: packed into the staging arena, one copy, one scatter kernel. 0, or -1
 * (recorded, and the batch lost). */
static int send_batch(cuda_impl *ci)
{
    ub_batch *ub = &ci->batch;
    if (ub->n == 0 || ci->failed) {
        if (ci->failed) lose_batch(ci);
        return ci->failed ? -1 : 0;
    }
    size_t bytes = ub_packed_bytes(ub);
    if (stage_reserve(ci, stage_size(bytes))) {
        lose_batch(ci);
        return -1;
    }
    size_t off = ci->arena_off;   /* 256-byte aligned, as the pieces' 16-byte copies need */
    ub_pack(ub, ci->h_arena + off);
    ci->bytes_up += bytes;
    unsigned char *d = (unsigned char *)ci->d_arena + off;
    if (ck(ci, cudaMemcpyAsync(d, ci->h_arena + off, bytes, cudaMemcpyHostToDevice, ci->stream), "staging")) {
        lose_batch(ci);
        return -1;
    }
    ci->arena_off = off + stage_size(bytes);
    scatter_kernel<<<(unsigned)ub->n, 128, 0, ci->stream>>>(d, (const ub_piece *)(d + ub_table_offset(ub)));
    if (ck(ci, cudaGetLastError(), "scatter kernel")) {
        lose_batch(ci);
        return -1;
    }
    ub_clear(ub, 1);
    return 0;
}

/* The batch's flush (upload_batch.h): a call that moves a whole layer sends it in rounds. */
static int flush_batch(void *ud) { return send_batch((cuda_impl *)ud); }

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
        const __half *kb = (const __half *)pg.k + (int64_t)g * pg.head_step;
        const __half *vb = (const __half *)pg.v + (int64_t)g * pg.head_step;
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

/* Every attention kernel's splits merged (ag_combine_one; row r = t * n_head + h). grid (n_head, n_q),
 * threads over D. */
__global__ void attn_combine(const float *part_o, const float *part_ml, int n_split, int n_head, int D, float *out)
{
    const int64_t r = (int64_t)blockIdx.y * n_head + blockIdx.x;
    for (int d = threadIdx.x; d < D; d += blockDim.x) out[r * D + d] = ag_combine_one(part_o, part_ml, r, n_split, D, d);
}

/* The grouped kernel (kernels/attn_group.h): one block per (KV head and a batch of up to AG_HEADS
 * of its query heads, query, split of the head's pages). grid (n_head_kv * batches, n_q, n_split),
 * AG_THREADS threads. Each page is read once for the batch's heads. */
__global__ void __launch_bounds__(AG_THREADS) attn_group_kernel(const float *q, const int32_t *q_pos,
                                                                const ag_page *pages, int64_t n_pages,
                                                                const int64_t *head_pages, const uint64_t *masks,
                                                                int n_head, int group, int D, int32_t window,
                                                                int n_split, float *part_o, float *part_ml)
{
    __shared__ ag_state sw[AG_THREADS / 32 - 1][32];   /* warps 1.. : their slot 0's lanes */
    const int nhb = ag_head_batches(group), g = blockIdx.x / nhb, bt = blockIdx.x % nhb;
    const int h0 = g * group + bt * AG_HEADS, hb = ag_batch_heads(group, bt);
    const int64_t t = blockIdx.y;
    const int32_t qp = q_pos[t];
    const int lk = ag_lanes_per_key(D), slots = AG_THREADS / lk;
    const int tid = threadIdx.x, ls = tid % lk, lane = tid & 31, warp = tid >> 5;
    float qv[1][AG_HEADS][AG_DL];
    QB_UNROLL
    for (int h = 0; h < AG_HEADS; h++)
        for (int j = 0; j < AG_DL; j++) {
            const int d = ls * AG_DL + j;
            qv[0][h][j] = h < hb && d < D ? q[(t * n_head + h0 + h) * (int64_t)D + d] : 0.0f;
        }
    ag_state st[1];
    ag_state_init(&st[0]);
    int64_t p0, p1;
    ag_split_range(head_pages, n_pages, g, n_split, (int)blockIdx.z, &p0, &p1);
    ag_slot_run(pages, masks, p0, p1, g, qp, window, tid / lk, slots, lk, ls, 1, D, hb,
                (const float(*)[AG_HEADS][AG_DL])qv, st);
    /* the warp's slots: lane l merges lane l ^ o's state (ag_block_sim's order) */
    for (int o = lk; o < 32; o <<= 1) {
        QB_UNROLL
        for (int h = 0; h < AG_HEADS; h++) {
            if (h >= hb) continue;
            float o2[AG_DL];
            const float m2 = __shfl_xor_sync(0xffffffffu, st[0].m[h], o);
            const float l2 = __shfl_xor_sync(0xffffffffu, st[0].l[h], o);
            for (int j = 0; j < AG_DL; j++) o2[j] = __shfl_xor_sync(0xffffffffu, st[0].o[h][j], o);
            ag_merge(&st[0].m[h], &st[0].l[h], st[0].o[h], m2, l2, o2);
        }
    }
    if (warp > 0 && lane < lk) sw[warp - 1][lane] = st[0];
    __syncthreads();
    if (warp > 0 || lane >= lk) return;
    for (int w = 1; w < AG_THREADS / 32; w++) {
        const ag_state *b = &sw[w - 1][lane];
        QB_UNROLL
        for (int h = 0; h < AG_HEADS; h++)
            if (h < hb) ag_merge(&st[0].m[h], &st[0].l[h], st[0].o[h], b->m[h], b->l[h], b->o[h]);
    }
    QB_UNROLL
    for (int h = 0; h < AG_HEADS; h++) {
        if (h >= hb) continue;
        const int64_t row = (t * n_head + h0 + h) * n_split + blockIdx.z;
        for (int j = 0; j < AG_DL; j++)
            if (lane * AG_DL + j < D) part_o[row * D + lane * AG_DL + j] = st[0].o[h][j];
        if (lane == 0) part_ml[row * 2] = st[0].m[h], part_ml[row * 2 + 1] = st[0].l[h];
    }
}

/* A prefill chunk's attention on the tensor cores (kernels/attn_flash.h): one block per (rt * 16
 * query rows, KV head and batch of its query heads, split of the head's pages); warps per (row tile,
 * head, half of the output dimensions); key tiles of AF_KT rows through two stages of shared memory.
 * grid (ceil(n_q / (rt * 16)), n_head_kv * batches, n_split), af_shape_of(D, group).warps * 32
 * threads, af_smem_bytes of shared memory. One split writes the rows; more write partials for
 * attn_combine. */
__global__ void __launch_bounds__(AF_WARPS * 32) attn_flash_kernel(const float *q, const int32_t *q_pos, int64_t n_q,
                                                                   const ag_page *pages, int64_t n_pages,
                                                                   const int64_t *head_pages, const uint64_t *masks,
                                                                   int n_head, int group, int D, int32_t window,
                                                                   int has_bias, int n_split, float *out,
                                                                   float *part_o, float *part_ml)
{
    extern __shared__ __align__(16) unsigned char af_mem[];
    const af_shape sh = af_shape_of(D, group);
    const int nhb = ag_head_batches(group), g = blockIdx.y / nhb, bt = blockIdx.y % nhb;
    const int h0 = g * group + bt * AG_HEADS, hb_b = ag_batch_heads(group, bt);
    const int tid = threadIdx.x, nt = blockDim.x, wi = tid >> 5, lane = tid & 31;
    const int rt = wi / (sh.hb * sh.ds), hh = (wi / sh.ds) % sh.hb, ds = wi % sh.ds;
    const int64_t row0 = (int64_t)blockIdx.x * sh.rt * 16;
    const af_smem m = af_smem_at(af_mem, D, sh);
    af_fill_q(m, q, n_q, n_head, D, sh, row0, h0, hb_b, tid, nt);
    int32_t minp, maxp, wlo, wmax;
    af_row_span(q_pos, n_q, row0, sh.rt * 16, &minp, &maxp);
    af_row_span(q_pos, n_q, row0 + rt * 16, 16, &wlo, &wmax);
    int32_t qp[1][2];
    for (int h = 0; h < 2; h++) {
        const int64_t r = row0 + rt * 16 + (lane >> 2) + 8 * h;
        qp[0][h] = r < n_q ? q_pos[r] : INT32_MIN;
    }
    af_lane s[1];
    af_lane_init(&s[0]);
    const size_t qoff = (size_t)(rt * sh.hb + hh) * 16 * (size_t)(D + AF_PAD);
    int64_t p0, p1;
    ag_split_range(head_pages, n_pages, g, n_split, (int)blockIdx.z, &p0, &p1);
    af_cursor cc = af_settle(pages, p0, 0, p1, minp, maxp, window), cl = cc;   /* computed, loaded */
    if (cl.ip < p1) {
        af_load_tile(m.s0, &pages[cl.ip], cl.r0, masks, g, D, tid, nt);
        cl = af_settle(pages, cl.ip, cl.r0 + AF_KT, p1, minp, maxp, window);
    }
    af_cp_commit();
    for (int i = 0; cc.ip < p1; i++) {
        if (cl.ip < p1) {   /* the next tile loads while this one is used */
            af_load_tile(af_stage_of(m, (i + 1) & 1), &pages[cl.ip], cl.r0, masks, g, D, tid, nt);
            cl = af_settle(pages, cl.ip, cl.r0 + AF_KT, p1, minp, maxp, window);
        }
        af_cp_commit();
        af_cp_wait1();
        __syncthreads();
        const af_stage st = af_stage_of(m, i & 1);
        if (hh < hb_b && st.pos[0] <= wmax)   /* warp-uniform: a tile past every row of the warp is skipped */
            af_warp_tile(st, m.qh + qoff, m.ql + qoff, D, ds * sh.dw, sh.dw, window, has_bias,
                         (const int32_t(*)[2])qp, lane, 1, s);
        __syncthreads();   /* the stage is refilled by the next iteration's copies */
        cc = af_settle(pages, cc.ip, cc.r0 + AF_KT, p1, minp, maxp, window);
    }
    af_cp_wait0();
    if (hh >= hb_b) return;
    if (n_split == 1) af_write(&s[0], lane, out, n_q, n_head, h0 + hh, D, ds * sh.dw, sh.dw, row0 + rt * 16);
    else
        af_write_part(&s[0], lane, part_o, part_ml, n_q, n_head, h0 + hh, D, ds * sh.dw, sh.dw, row0 + rt * 16, n_split,
                      (int)blockIdx.z);
}

/* Each KV head's number of candidates of a selection by bounds (be_attn.sel_from). */
typedef struct sel_from {
    int64_t v[PT_MAX_HEADS];
} sel_from;

/* A selection by bounds as the list it stands for (ag_sel_at), from the list of every page and the
 * best and counts where the bounds left them: one block, the heads one after another (a few
 * hundred entries in all); the offsets first, by one thread. */
__global__ void __launch_bounds__(256) sel_gather_kernel(const ag_page *all, const int64_t *all_hp, const int32_t *best,
                                                         const int32_t *n_best, int32_t k, sel_from from, int H,
                                                         ag_page *out, int64_t *out_hp)
{
    __shared__ int64_t at[PT_MAX_HEADS + 1];
    __shared__ int32_t nb[PT_MAX_HEADS];
    if (threadIdx.x == 0) {
        int64_t e = 0;
        for (int g = 0; g < H; g++) {
            const int32_t c = n_best[g];
            nb[g] = c < 0 ? 0 : c > k ? k : c;   /* never outside, from the bounds kernels */
            at[g] = e;
            e += nb[g] + (all_hp[g + 1] - all_hp[g]) - from.v[g];
        }
        at[H] = e;
        for (int g = 0; g <= H; g++) out_hp[g] = at[g];
    }
    __syncthreads();
    for (int g = 0; g < H; g++)
        for (int64_t j = threadIdx.x; j < at[g + 1] - at[g]; j += blockDim.x)
            out[at[g] + j] = all[all_hp[g] + ag_sel_at(best + (int64_t)g * k, nb[g], from.v[g], j)];
}

/* A page list pt_build could not build (rc): the failure recorded with what was short, and the
 * batch (which may hold part of it) dropped. */
static void tables_failed(cuda_impl *ci, int rc)
{
    if (ci->failed) {   /* a page copy's rows could not be queued: said already */
    } else if (rc == PT_NO_HOST_MEMORY || (rc == PT_NO_COPY && !ci->blocks.failed_bytes)) {
        fail(ci, "out of memory for the KV page tables");
    } else if (rc == PT_BAD_LIST) {
        fail(ci, "internal error: a page list whose head offsets do not span it");
    } else if (rc == PT_NO_DEVICE_MEMORY) {
        fail(ci, "out of GPU memory for the KV page tables (%.1f MiB free)", free_mib());
    } else {
        fail(ci, "out of GPU memory for the KV cache: %.1f MiB more needed, %.1f MiB free, %.1f MiB of page "
                 "copies held (a shorter --ctx or a policy that evicts holds less)",
             (double)ci->blocks.failed_bytes / (1 << 20), free_mib(), (double)ci->blocks.bytes / (1 << 20));
    }
    lose_batch(ci);
}

static void cuda_attention(be_backend *b, const be_attn *a)
{
    cuda_impl *ci = impl_of(b);
    if (ci->failed || a->n_q <= 0) return;
    int D = a->head_dim;
    if (D > ATT_THREADS * MAX_D_PER_THREAD) {
        fail(ci, "head_dim %d is more than the CUDA attention kernel's %d", D, ATT_THREADS * MAX_D_PER_THREAD);
        return;
    }
    pt_begin_call(&ci->tables, COPY_IDLE);
    sl_tick(&ci->sums);
    if (ci->copies.calls % COPY_IDLE == 0) bp_trim(&ci->blocks);   /* after the idle copies went back */
    /* Rows not in the cache yet (a deferred decode step) become one more page per KV head, after
     * the head's pages (be_attn_rows_list), pointing at their f16 conversion and their positions on
     * the device (both buffers stay put from call to call, so those entries stay as they are). */
    int64_t n_cur = a->n_cur > 0 ? a->n_cur : 0, kvd = (int64_t)a->n_head_kv * D;
    if (a->n_head_kv > PT_MAX_HEADS) {
        fail(ci, "internal error: %d KV heads (at most %d)", a->n_head_kv, PT_MAX_HEADS);
        return;
    }
    const be_kv_page *list = a->pages;
    const int64_t *hp = a->head_pages;
    int64_t e = a->n_pages, hp_rows[PT_MAX_HEADS + 1];
    const uint16_t *cur16 = NULL;
    if (n_cur > 0) {
        size_t len = (size_t)be_attn_rows_len(a);
        if (grow_dev(ci, (void **)&ci->cur16, &ci->cap_cur16, sizeof(__half) * 2 * (size_t)(n_cur * kvd)) ||
            grow_dev(ci, (void **)&ci->cur_pos, &ci->cap_cur_pos, sizeof(int32_t) * (size_t)n_cur))
            return;
        if (len > ci->cap_rows_list) {
            be_kv_page *nl = (be_kv_page *)realloc(ci->rows_list, sizeof *nl * len);
            if (!nl) {
                fail(ci, "out of memory");
                return;
            }
            ci->rows_list = nl;
            ci->cap_rows_list = len;
        }
        cur16 = (const uint16_t *)ci->cur16;
        e = be_attn_rows_list(a, cur16, cur16 + n_cur * kvd, ci->cur_pos, ci->rows_list, hp_rows);
        list = ci->rows_list;
        hp = hp_rows;
        if (ub_add(&ci->batch, ci->cur_pos, a->cur_pos, sizeof(int32_t) * (size_t)n_cur)) {
            fail(ci, "out of memory");
            lose_batch(ci);
            return;
        }
    }
    /* the list's descriptors, kept on the device under the call's name: only what changed is
     * built and queued (kernels/page_tables.c), then sent with the pages' new rows in one batch */
    pt_call pl;
    pt_direct rows = { cur16, sizeof(__half) * 2 * (size_t)(n_cur * kvd) };
    int rc = pt_build(&ci->tables, a->table, a->shape, list, e, hp, a->n_head_kv, cur16 ? &rows : NULL, &pl);
    if (rc != PT_OK) {
        tables_failed(ci, rc);
        return;
    }
    if (send_batch(ci)) return;
    /* the grouped kernels read rows 16 bytes at a time */
    int grouped = !ci->attn_scalar && ag_supported(D) && pl.aligned, has_bias = pl.has_bias;
    size_t w = pl.n_words;
    size_t nq = (size_t)a->n_q * (size_t)a->n_head * (size_t)D, ncur = (size_t)(n_cur * kvd);
    int q_bound = bound(ci, a->q, sizeof(float) * nq);
    int expand = n_cur > 0;
    /* a selection by bounds: its best and counts, where the bounds left them or from the host */
    const size_t sel_ib = a->sel_best ? sizeof(int32_t) * (size_t)(a->n_head_kv * a->sel_k) : 0;
    const size_t sel_cb = a->sel_best ? sizeof(int32_t) * (size_t)a->n_head_kv : 0;
    const int sel_bound = a->sel_best && bound(ci, a->sel_best, sel_ib) && bound(ci, a->sel_n_best, sel_cb);
    if (a->sel_best && !sel_bound && (bound(ci, a->sel_best, sel_ib) || bound(ci, a->sel_n_best, sel_cb))) {
        fail(ci, "internal error: a selection's best and counts bound apart");
        return;
    }
    int ck_bound = expand && bound(ci, a->cur_k, sizeof(float) * ncur);
    int cv_bound = expand && bound(ci, a->cur_v, sizeof(float) * ncur);
    if (stage_reserve(ci, stage_size(sizeof(uint64_t) * w) + stage_size(sizeof(int32_t) * (size_t)a->n_q) +
                              (q_bound ? 0 : stage_size(sizeof(float) * nq)) +
                              (expand && !ck_bound ? stage_size(sizeof(float) * ncur) : 0) +
                              (expand && !cv_bound ? stage_size(sizeof(float) * ncur) : 0) +
                              (a->sel_best && !sel_bound ? stage_size(sel_ib) + stage_size(sel_cb) : 0)))
        return;
    if (expand) {
        const float *dk = ck_bound ? (const float *)am_dev_in(&ci->act, a->cur_k, sizeof(float) * ncur)
                                   : (const float *)stage(ci, a->cur_k, sizeof(float) * ncur);
        const float *dv = cv_bound ? (const float *)am_dev_in(&ci->act, a->cur_v, sizeof(float) * ncur)
                                   : (const float *)stage(ci, a->cur_v, sizeof(float) * ncur);
        if (!dk || !dv) return;
        f32_to_f16<<<(unsigned)((ncur + 255) / 256), 256, 0, ci->stream>>>(dk, ci->cur16, (int64_t)ncur);
        f32_to_f16<<<(unsigned)((ncur + 255) / 256), 256, 0, ci->stream>>>(dv, ci->cur16 + ncur, (int64_t)ncur);
        if (ck(ci, cudaGetLastError(), "f32_to_f16")) return;
    }
    const dev_page *d_pages = pl.pages;
    const uint64_t *d_masks = w ? (const uint64_t *)stage(ci, pl.masks, sizeof(uint64_t) * w) : NULL;
    const int32_t *d_qpos = (const int32_t *)stage(ci, a->q_pos, sizeof(int32_t) * (size_t)a->n_q);
    const int64_t *d_hp = pl.head_pages;
    const float *d_q = q_bound ? (const float *)am_dev_in(&ci->act, a->q, sizeof(float) * nq)
                               : (const float *)stage(ci, a->q, sizeof(float) * nq);
    if ((w && !d_masks) || !d_qpos || !d_q) return;
    /* splits: about four blocks a multiprocessor in all, at least one page each */
    int64_t most = e;
    if (hp) {
        most = 0;
        for (int g = 0; g < a->n_head_kv; g++)
            if (hp[g + 1] - hp[g] > most) most = hp[g + 1] - hp[g];
    }
    /* A selection by bounds: its list built on the device from the list of every page, with no
     * wait for the bounds; the host knows each head's length only as a bound, which sizes the
     * splits (some of a shorter head's may be empty). */
    if (a->sel_best) {
        if (!hp) {
            fail(ci, "internal error: a selection by bounds without per-head lists");
            return;
        }
        sel_from sf;
        int64_t ub = 0;
        most = 0;
        for (int g = 0; g < a->n_head_kv; g++) {
            const int64_t len = hp[g + 1] - hp[g], from = a->sel_from[g];
            const int64_t at_most = (from < a->sel_k ? from : a->sel_k) + len - from;
            sf.v[g] = from;
            ub += at_most;
            if (at_most > most) most = at_most;
        }
        const int32_t *d_best = sel_bound ? (const int32_t *)am_dev_in(&ci->act, a->sel_best, sel_ib)
                                          : (const int32_t *)stage(ci, a->sel_best, sel_ib);
        const int32_t *d_cnt = sel_bound ? (const int32_t *)am_dev_in(&ci->act, a->sel_n_best, sel_cb)
                                         : (const int32_t *)stage(ci, a->sel_n_best, sel_cb);
        if (!d_best || !d_cnt ||
            grow_dev(ci, (void **)&ci->sel_pages, &ci->cap_sel_pages, sizeof(ag_page) * (size_t)(ub > 0 ? ub : 1)) ||
            grow_dev(ci, (void **)&ci->sel_hp, &ci->cap_sel_hp, sizeof(int64_t) * (PT_MAX_HEADS + 1)))
            return;
        sel_gather_kernel<<<1, 256, 0, ci->stream>>>(d_pages, d_hp, d_best, d_cnt, a->sel_k, sf, a->n_head_kv,
                                                     ci->sel_pages, ci->sel_hp);
        if (ck(ci, cudaGetLastError(), "selection gather kernel")) return;
        d_pages = ci->sel_pages;
        d_hp = ci->sel_hp;
        e = ub;
    }
    /* the kernel: tensor-core prefill (the default for chunks; its shared memory allowed once), the
     * grouped kernel, or the scalar one */
    const int group = a->n_head / a->n_head_kv, nhb = ag_head_batches(group);
    const af_shape fsh = af_shape_of(D, group);
    const size_t fsmem = af_smem_bytes(D, fsh);
    int flash = grouped && ci->attn_flash && a->n_q >= AF_MIN_Q && af_supported(D);
    if (flash && fsmem > ci->flash_smem_set) {
        int allowed = 0;
        cudaDeviceGetAttribute(&allowed, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
        if ((size_t)allowed < fsmem ||
            cudaFuncSetAttribute(attn_flash_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fsmem) !=
                cudaSuccess) {
            cudaGetLastError();   /* not sticky: the grouped kernel runs instead, said once */
            if (!ci->flash_refused)
                fprintf(stderr, "kvchat: the flash attention kernel needs %zu KiB of shared memory a block for head "
                                "dimension %d, this device allows %d KiB: prefill attention runs on the grouped "
                                "kernel\n",
                        fsmem >> 10, D, allowed >> 10);
            ci->flash_refused = 1;
            flash = 0;
        } else {
            ci->flash_smem_set = fsmem;
        }
    }
    /* splits: about four blocks a multiprocessor in all (two for the flash kernel's larger blocks),
     * at least one page each; KVCHAT_CUDA_ATTN_SPLITS forces a count (a test knob: empty splits
     * allowed, up to the longest list + 64) */
    const int64_t f_rows = (a->n_q + fsh.rt * 16 - 1) / (fsh.rt * 16);
    int64_t blocks = flash     ? f_rows * a->n_head_kv * nhb
                     : grouped ? (int64_t)a->n_head_kv * nhb * a->n_q
                               : (int64_t)a->n_head * a->n_q;
    int64_t want = ((flash ? 2 : 4) * (int64_t)ci->n_sm + blocks - 1) / blocks;
    int n_split = (int)(want < 1 ? 1 : want > most ? (most > 0 ? most : 1) : want);
    if (grouped && ci->attn_splits > 0)   /* empty splits allowed, within 64 of the longest list */
        n_split = (int)(ci->attn_splits < most + 64 ? ci->attn_splits : most + 64);
    size_t n_part = (size_t)a->n_q * (size_t)a->n_head * (size_t)n_split;
    int out_bound = bound(ci, a->out, sizeof(float) * nq);
    if (!(flash && n_split == 1) &&
        (grow_dev(ci, (void **)&ci->part_o, &ci->cap_po, sizeof(float) * n_part * (size_t)D) ||
         grow_dev(ci, (void **)&ci->part_ml, &ci->cap_pml, sizeof(float) * n_part * 2)))
        return;
    if (!out_bound && (grow_dev(ci, (void **)&ci->out, &ci->cap_out, sizeof(float) * nq) ||
                       grow_host(ci, (void **)&ci->h_out, &ci->cap_h_out, sizeof(float) * nq)))
        return;
    float *d_out = out_bound ? (float *)am_dev_out(&ci->act, a->out, sizeof(float) * nq) : ci->out;
    cudaStream_t s = ci->stream;
    const dim3 per_row((unsigned)a->n_head, (unsigned)a->n_q);
    const unsigned combine_threads = D < 256 ? (unsigned)D : 256u;
    if (flash) {
        dim3 grid((unsigned)f_rows, (unsigned)(a->n_head_kv * nhb), (unsigned)n_split);
        attn_flash_kernel<<<grid, fsh.warps * 32, fsmem, s>>>(d_q, d_qpos, a->n_q, d_pages, e, d_hp, d_masks, a->n_head,
                                                               group, D, a->window, has_bias, n_split, d_out,
                                                               ci->part_o, ci->part_ml);
        if (ck(ci, cudaGetLastError(), "flash attention kernel")) return;
        ci->flash_calls++;
    } else if (grouped) {
        dim3 grid((unsigned)(a->n_head_kv * nhb), (unsigned)a->n_q, (unsigned)n_split);
        attn_group_kernel<<<grid, AG_THREADS, 0, s>>>(d_q, d_qpos, d_pages, e, d_hp, d_masks, a->n_head, group, D,
                                                      a->window, n_split, ci->part_o, ci->part_ml);
        if (ck(ci, cudaGetLastError(), "attention kernel")) return;
    } else {
        dim3 grid((unsigned)a->n_head, (unsigned)a->n_q, (unsigned)n_split);
        size_t shmem = sizeof(float) * ((size_t)D + ATT_THREADS + ATT_THREADS / 32);
        attn_kernel<<<grid, ATT_THREADS, shmem, s>>>(d_q, d_qpos, d_pages, e, d_hp, d_masks, a->n_head, group, D,
                                                     a->window, n_split, ci->part_o, ci->part_ml);
        if (ck(ci, cudaGetLastError(), "attention kernel")) return;
    }
    if (!(flash && n_split == 1))   /* the flash kernel's one split wrote the rows itself */
        attn_combine<<<per_row, combine_threads, 0, s>>>(ci->part_o, ci->part_ml, n_split, a->n_head, D, d_out);
    if (ck(ci, cudaGetLastError(), "attention combine kernel") || out_bound) return;
    ci->bytes_down += sizeof(float) * nq;
    if (ck(ci, cudaMemcpyAsync(ci->h_out, ci->out, sizeof(float) * nq, cudaMemcpyDeviceToHost, s), "download") ||
        sync_stream(ci, "attention"))
        return;
    memcpy(a->out, ci->h_out, sizeof(float) * nq);
}

/* ---------------------------------------------------------------- the sampler's candidates */

/* The block's PK_SLICE keys sorted, largest first (every thread of the block calls it), and the k
 * first written to out. */
static __device__ void sort_and_keep(uint64_t *keys, int32_t k, uint64_t *out)
{
    const int tid = threadIdx.x;
    for (int size = 2; size <= PK_SLICE; size <<= 1)
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            pk_sort_step(keys, size, stride, tid);
            __syncthreads();
        }
    for (int i = tid; i < k; i += PK_THREADS) out[i] = keys[i];
}

/* A slice of the row a block (kernels/pick_kernels.h): its k best keys to out[blockIdx.x * k ..],
 * its largest value before the penalty to slice_max. Rows row_stride apart, one a blockIdx.y (the
 * bounds' KV heads; the sampler's pick has one), each with its own out and slice_max. */
__global__ void __launch_bounds__(PK_THREADS) pick_slice_kernel(const float *logits, int64_t n, int64_t row_stride,
                                                                  const int32_t *pen, int32_t n_pen, float penalty,
                                                                  int32_t k, uint64_t *out, float *slice_max)
{
    __shared__ uint64_t keys[PK_SLICE];
    __shared__ uint32_t pen_bits[PK_SLICE / 32];
    __shared__ float red[PK_THREADS / 32];
    const int tid = threadIdx.x;
    logits += blockIdx.y * row_stride;
    out += (int64_t)blockIdx.y * gridDim.x * k;
    slice_max += (int64_t)blockIdx.y * gridDim.x;
    const int64_t base = (int64_t)blockIdx.x * PK_SLICE;
    if (tid < PK_SLICE / 32) pen_bits[tid] = 0;
    __syncthreads();
    for (int32_t j = tid; j < n_pen; j += PK_THREADS) {
        int64_t o = (int64_t)pen[j] - base;
        if (o >= 0 && o < PK_SLICE) atomicOr(&pen_bits[o >> 5], 1u << (o & 31));
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int r = 0; r < PK_PER_THREAD; r++) {
        float raw;
        int slot = tid + r * PK_THREADS;
        keys[slot] = pk_token_key(logits, n, pen_bits, penalty, base, slot, &raw);
        mx = fmaxf(mx, raw);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((tid & 31) == 0) red[tid >> 5] = mx;
    __syncthreads();
    sort_and_keep(keys, k, out + (int64_t)blockIdx.x * k);
    if (tid == 0) {
        float m = red[0];
        for (int w = 1; w < PK_THREADS / 32; w++) m = fmaxf(m, red[w]);
        slice_max[blockIdx.x] = m;
    }
}

/* A merge round: block b sorts lists [b * (PK_SLICE / k), ...) of in and keeps their k best; a row's
 * n_lists lists a blockIdx.y. */
__global__ void __launch_bounds__(PK_THREADS) pick_merge_kernel(const uint64_t *in, int64_t n_lists, int32_t k,
                                                                  uint64_t *out)
{
    __shared__ uint64_t keys[PK_SLICE];
    const int tid = threadIdx.x;
    in += (int64_t)blockIdx.y * n_lists * k;
    out += (int64_t)blockIdx.y * gridDim.x * k;
    const int64_t first = (int64_t)blockIdx.x * (PK_SLICE / k);
    for (int r = 0; r < PK_PER_THREAD; r++) {
        int slot = tid + r * PK_THREADS;
        keys[slot] = pk_merge_key(in, n_lists, k, first, slot);
    }
    __syncthreads();
    sort_and_keep(keys, k, out + (int64_t)blockIdx.x * k);
}

/* Each slice's entropy sums relative to the row's largest value (from the slices' maxima). */
__global__ void __launch_bounds__(PK_THREADS) pick_entropy_kernel(const float *logits, int64_t n,
                                                                    const float *slice_max, int64_t n_slices,
                                                                    float inv, double *sums)
{
    __shared__ double acc[PK_THREADS][3];
    __shared__ float red[PK_THREADS / 32];
    const int tid = threadIdx.x;
    /* the row's largest value: the slices' maxima shared out among the block's threads */
    float mx = -INFINITY;
    for (int64_t i = tid; i < n_slices; i += PK_THREADS) mx = fmaxf(mx, slice_max[i]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((tid & 31) == 0) red[tid >> 5] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < PK_THREADS / 32; w++) mx = fmaxf(mx, red[w]);
    double a[3] = { 0, 0, 0 };
    if (isfinite(mx)) pk_entropy_thread(logits, n, (int64_t)blockIdx.x * PK_SLICE, tid, mx, inv, a);
    acc[tid][0] = a[0], acc[tid][1] = a[1], acc[tid][2] = a[2];
    __syncthreads();
    for (int s = PK_THREADS / 2; s > 0; s >>= 1) {
        pk_tree_step(acc, s, tid);
        __syncthreads();
    }
    if (tid < 3) sums[blockIdx.x * 3 + tid] = acc[0][tid];
}

/* The final soft cap, in place (the row's readers after the pick see these values). */
__global__ void pick_softcap_kernel(float *l, int64_t n, float cap)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) l[i] = lp_cap(l[i], cap);
}

/* The row's entropy and varentropy from the slices' sums, added in slice order. */
__global__ void pick_entropy_finish(const double *sums, const float *slice_max, int64_t n_slices, double *out)
{
    float mx = -INFINITY;
    for (int64_t i = 0; i < n_slices; i++) mx = fmaxf(mx, slice_max[i]);
    double acc[3] = { 0, 0, 0 };
    for (int64_t i = 0; i < n_slices; i++)
        for (int j = 0; j < 3; j++) acc[j] += sums[i * 3 + j];
    out[0] = out[1] = 0;
    if (isfinite(mx)) lp_entropy_finish(acc, &out[0], &out[1]);
}

static void cuda_pick(be_backend *b, be_pick *p)
{
    cuda_impl *ci = impl_of(b);
    size_t bytes = sizeof(float) * (size_t)p->n;
    p->n_out = 0;
    p->h = p->vh = 0;
    if (ci->failed || p->n <= 0) return;
    if (!bound(ci, p->logits, bytes)) {   /* host logits: the CPU's pick */
        am_range r = { p->logits, bytes };
        am_host_read(&ci->act, &r, 1);
        ci->cpu->ops->pick(ci->cpu, p);
        return;
    }
    int32_t k = p->k < 1 ? 1 : p->k > BE_PICK_MAX ? BE_PICK_MAX : p->k;
    p->k = k;
    int64_t blocks[9];
    int rounds = pk_plan(p->n, k, blocks);
    size_t keys_bytes = sizeof(uint64_t) * (size_t)(blocks[0] * k), res_bytes = 16 + sizeof(uint64_t) * (size_t)k;
    if (grow_dev(ci, (void **)&ci->pick_keys, &ci->cap_pick_keys, 2 * keys_bytes) ||
        grow_dev(ci, (void **)&ci->pick_max, &ci->cap_pick_max, sizeof(float) * (size_t)blocks[0]) ||
        grow_dev(ci, (void **)&ci->pick_sums, &ci->cap_pick_sums, sizeof(double) * 3 * (size_t)blocks[0]) ||
        grow_dev(ci, (void **)&ci->pick_res, &ci->cap_pick_res, res_bytes) ||
        grow_host(ci, (void **)&ci->h_pick, &ci->cap_h_pick, res_bytes))
        return;
    int32_t n_pen = p->n_pen < 0 ? 0 : p->n_pen < 4096 ? p->n_pen : 4096;
    const int32_t *d_pen = NULL;
    if (n_pen > 0 && !(d_pen = (const int32_t *)stage(ci, p->pen_ids, sizeof(int32_t) * (size_t)n_pen))) return;
    float *dl = (float *)am_dev_out(&ci->act, p->logits, bytes);   /* read, and capped in place */
    cudaStream_t s = ci->stream;
    if (p->softcap > 0) {
        pick_softcap_kernel<<<(unsigned)((p->n + EW_THREADS - 1) / EW_THREADS), EW_THREADS, 0, s>>>(dl, p->n, p->softcap);
        if (ck(ci, cudaGetLastError(), "soft cap kernel")) return;
    }
    uint64_t *lists[2] = { ci->pick_keys, ci->pick_keys + blocks[0] * k };
    uint64_t *final_keys = (uint64_t *)(ci->pick_res + 16);
    pick_slice_kernel<<<(unsigned)blocks[0], PK_THREADS, 0, s>>>(dl, p->n, 0, d_pen, n_pen, p->penalty, k,
                                                                 rounds == 0 ? final_keys : lists[0], ci->pick_max);
    if (ck(ci, cudaGetLastError(), "pick kernel")) return;
    for (int r = 1; r <= rounds; r++) {
        uint64_t *dst = r == rounds ? final_keys : lists[r & 1];
        pick_merge_kernel<<<(unsigned)blocks[r], PK_THREADS, 0, s>>>(lists[(r - 1) & 1], blocks[r - 1], k, dst);
        if (ck(ci, cudaGetLastError(), "pick merge kernel")) return;
    }
    if (p->entropy) {
        float temp = p->temp > 0 ? p->temp : 1.0f;
        pick_entropy_kernel<<<(unsigned)blocks[0], PK_THREADS, 0, s>>>(dl, p->n, ci->pick_max, blocks[0], 1.0f / temp,
                                                                       ci->pick_sums);
        pick_entropy_finish<<<1, 1, 0, s>>>(ci->pick_sums, ci->pick_max, blocks[0], (double *)ci->pick_res);
        if (ck(ci, cudaGetLastError(), "pick entropy kernel")) return;
    }
    ci->bytes_down += res_bytes;
    if (ck(ci, cudaMemcpyAsync(ci->h_pick, ci->pick_res, res_bytes, cudaMemcpyDeviceToHost, s), "pick download") ||
        sync_stream(ci, "pick"))
        return;
    if (p->entropy) {
        memcpy(&p->h, ci->h_pick, sizeof p->h);
        memcpy(&p->vh, ci->h_pick + 8, sizeof p->vh);
    }
    for (int32_t i = 0; i < k; i++) {
        uint64_t key;
        memcpy(&key, ci->h_pick + 16 + sizeof key * (size_t)i, sizeof key);
        if (key == 0) break;
        p->val[i] = lp_key_value(key);
        p->id[i] = lp_key_id(key);
        p->n_out = i + 1;
    }
}

/* ---------------------------------------------------------------- element-wise ops */

/* A warp's sum of its lanes' values by xor shuffles (fk_warp_sum_host's order). */
static __device__ double warp_sum(double v)
{
    for (int r = 0; r < FK_XOR_ROUNDS; r++) v += __shfl_xor_sync(0xffffffffu, v, fk_xor_offset(r));
    return v;
}

/* A block's sum: each warp's, then the warps' in order (fk_block_sum_host); red holds a double a
 * warp, free again when this returns. */
static __device__ double block_sum(double v, double *red)
{
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    double tot = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) tot += red[i];
    __syncthreads();
    return tot;
}

/* One block a row; the sum of squares in double, as the CPU backend accumulates it. */
__global__ void rmsnorm_kernel(const float *x, const float *w, float *y, int64_t dim, float eps)
{
    __shared__ double red[EW_THREADS / 32];
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = y + (int64_t)blockIdx.x * dim;
    float scale = fk_norm_factor(block_sum(fk_sumsq(xr, dim, threadIdx.x, EW_THREADS), red), dim, eps);
    for (int64_t i = threadIdx.x; i < dim; i += EW_THREADS) yr[i] = xr[i] * scale * w[i];
}

/* qk_rope (kernels/fused_kernels.h): a block a token, a warp a head row. The angles are built by
 * one thread as the CPU backend builds them, so the floats are the same. */
__global__ void __launch_bounds__(FK_QK_THREADS) qk_rope_kernel(float *q, float *k, const int32_t *pos, int n_head,
                                                                int n_head_kv, int head_dim, const float *q_norm,
                                                                const float *k_norm, float eps, float theta_scale,
                                                                float freq_scale, int neox, float q_scale)
{
    extern __shared__ float cs[];
    int half = head_dim / 2;
    float *sn = cs + half;
    int64_t t = blockIdx.x;
    if (threadIdx.x == 0) fk_angles((float)pos[t] * freq_scale, theta_scale, half, cs);
    __syncthreads();
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float th = cs[i];
        sn[i] = sinf(th);
        cs[i] = cosf(th);
    }
    __syncthreads();
    for (int j = fk_qk_first_row(threadIdx.x); j < n_head + n_head_kv; j += FK_QK_WARPS) {
        const float *w;
        float s;
        float *v = fk_qk_row(q, k, t, j, n_head, n_head_kv, head_dim, q_norm, k_norm, q_scale, &w, &s);
        float f = w ? fk_norm_factor(warp_sum(fk_qk_lane_sumsq(v, head_dim, threadIdx.x)), head_dim, eps) : 1.0f;
        fk_qk_lane_pairs(v, head_dim, threadIdx.x, neox, w, f, cs, sn, s);
    }
}

/* add_norm (kernels/fused_kernels.h): a block a row. */
__global__ void __launch_bounds__(FK_AN_THREADS) add_norm_kernel(float *x, float *o, const float *post, const float *w,
                                                                 float *h, int64_t dim, float eps)
{
    __shared__ double red[FK_AN_THREADS / 32];
    x += (int64_t)blockIdx.x * dim;
    o += (int64_t)blockIdx.x * dim;
    float f = post ? fk_norm_factor(block_sum(fk_an_thread_sumsq(o, dim, threadIdx.x), red), dim, eps) : 1.0f;
    double ss = fk_an_thread_add(x, o, post, f, w != NULL, dim, threadIdx.x);
    if (!w) return;
    float g = fk_norm_factor(block_sum(ss, red), dim, eps);
    fk_an_thread_norm(x, w, g, h + (int64_t)blockIdx.x * dim, dim, threadIdx.x);
}

__global__ void glu_kernel(float *gate, const float *up, int64_t n, int gelu)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    if (gelu) gate[i] = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * up[i];
    else gate[i] = g / (1.0f + expf(-g)) * up[i];
}

static unsigned ew_blocks(int64_t n) { return (unsigned)((n + EW_THREADS - 1) / EW_THREADS); }

/* Each op below runs on the device when every activation it touches is bound, and otherwise on the
 * CPU backend after bringing the bound ones' host copies up to date. */

static void cuda_rmsnorm(be_backend *b, const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps)
{
    cuda_impl *ci = impl_of(b);
    size_t bytes = sizeof(float) * (size_t)(rows * dim);
    if (ci->failed || rows <= 0) return;
    if (bound(ci, x, bytes) && bound(ci, y, bytes)) {
        const float *dw = (const float *)const_get(ci, w, sizeof(float) * (size_t)dim);
        if (!dw) return;
        const float *dx = x == y ? NULL : (const float *)am_dev_in(&ci->act, x, bytes);
        float *dy = (float *)am_dev_out(&ci->act, y, bytes);
        rmsnorm_kernel<<<(unsigned)rows, EW_THREADS, 0, ci->stream>>>(dx ? dx : dy, dw, dy, dim, eps);
        ck(ci, cudaGetLastError(), "rmsnorm");
        return;
    }
    host_in(ci, x, bytes);
    am_host_write(&ci->act, y, bytes);
    ci->cpu->ops->rmsnorm(ci->cpu, x, w, y, rows, dim, eps);
}

static void cuda_qk_rope(be_backend *b, const be_qk *r)
{
    cuda_impl *ci = impl_of(b);
    size_t bq = sizeof(float) * (size_t)(r->n_tok * r->n_head * r->head_dim),
           bk = sizeof(float) * (size_t)(r->n_tok * r->n_head_kv * r->head_dim);
    if (ci->failed || r->n_tok <= 0) return;
    if (bound(ci, r->q, bq) && bound(ci, r->k, bk) && r->head_dim % 2 == 0) {
        size_t wb = sizeof(float) * (size_t)r->head_dim;
        const int32_t *dp = (const int32_t *)stage(ci, r->pos, sizeof(int32_t) * (size_t)r->n_tok);
        const float *dqn = r->q_norm ? (const float *)const_get(ci, r->q_norm, wb) : NULL;
        const float *dkn = r->k_norm ? (const float *)const_get(ci, r->k_norm, wb) : NULL;
        if (!dp || (r->q_norm && !dqn) || (r->k_norm && !dkn)) return;
        float *dq = (float *)am_dev_out(&ci->act, r->q, bq), *dk = (float *)am_dev_out(&ci->act, r->k, bk);
        /* the same powf as the CPU backend, on the host */
        float theta_scale = powf(r->freq_base, -2.0f / (float)r->head_dim);
        qk_rope_kernel<<<(unsigned)r->n_tok, FK_QK_THREADS, sizeof(float) * (size_t)r->head_dim, ci->stream>>>(
            dq, dk, dp, r->n_head, r->n_head_kv, r->head_dim, dqn, dkn, r->eps, theta_scale, r->freq_scale, r->neox,
            r->q_scale);
        ck(ci, cudaGetLastError(), "qk_rope");
        return;
    }
    am_range rd[2] = { { r->q, bq }, { r->k, bk } };
    am_host_read(&ci->act, rd, 2);
    am_host_write(&ci->act, r->q, bq);
    am_host_write(&ci->act, r->k, bk);
    ci->cpu->ops->qk_rope(ci->cpu, r);
}

static void cuda_glu(be_backend *b, float *gate, const float *up, int64_t n, int gelu)
{
    cuda_impl *ci = impl_of(b);
    size_t bytes = sizeof(float) * (size_t)n;
    if (ci->failed || n <= 0) return;
    if (bound(ci, gate, bytes) && bound(ci, up, bytes)) {
        const float *du = (const float *)am_dev_in(&ci->act, up, bytes);
        float *dg = (float *)am_dev_out(&ci->act, gate, bytes);
        glu_kernel<<<ew_blocks(n), EW_THREADS, 0, ci->stream>>>(dg, du, n, gelu);
        ck(ci, cudaGetLastError(), "glu");
        return;
    }
    am_range r[2] = { { gate, bytes }, { up, bytes } };
    am_host_read(&ci->act, r, 2);
    am_host_write(&ci->act, gate, bytes);
    ci->cpu->ops->glu(ci->cpu, gate, up, n, gelu);
}

/* ---------------------------------------------------------------- the eviction policies' attention mass */

/* Block (page blockIdx.x, the pass's rows from MS_ROWS * blockIdx.y): the page's keys scored for the
 * block's rows of the page's KV head (kernels/mass_kernels.h), key i by half-warp i % 8 of the
 * block; KV head h's row r scores key j of the head at e[n * tok0[h] + r * T_h + j] (first: each
 * page's first token in its head). Both half-warps of a warp run every round (one may score a key
 * past the page's rows, a valid row's, and drop it), as their shuffles need. */
__global__ void __launch_bounds__(MS_THREADS) mass_score_kernel(ms_rows rows, const dev_page *pages,
                                                                 const int64_t *hp, const int64_t *tok0, int n_kv,
                                                                 const int64_t *first, float *e)
{
    __shared__ float qs[MS_ROWS * MS_MAX_D];
    const ms_rows q = rows;   /* a copy whose address the helpers take, not the parameter's */
    const dev_page pg = pages[blockIdx.x];
    const int h = ms_head_of(hp, n_kv, blockIdx.x);
    const int64_t rb = (int64_t)blockIdx.y * MS_ROWS, Th = tok0[h + 1] - tok0[h];
    const int nr = q.n - rb < MS_ROWS ? (int)(q.n - rb) : MS_ROWS, D = q.D;
    for (int x = threadIdx.x; x < MS_ROWS * D; x += MS_THREADS)   /* rows past the pass's end: zeros */
        qs[x] = x < nr * D ? ms_query(&q, h, rb + x / D)[x % D] : 0.0f;
    __syncthreads();
    const int lane = threadIdx.x % MS_LANES, half = threadIdx.x / MS_LANES, halves = MS_THREADS / MS_LANES;
    float *head_e = e + q.n * tok0[h] + first[blockIdx.x];
    for (int32_t i0 = half & ~1; i0 < pg.n; i0 += halves) {
        const int32_t i = i0 + (half & 1);
        const uint16_t *k = pg.k + (size_t)(i < pg.n ? i : i0) * (size_t)pg.stride;
        float v[MS_ROWS];
        ms_lane_parts(qs, k, D, lane, v);
        for (int st = 0; st < MS_TREE_STEPS; st++) {
            QB_UNROLL
            for (int r = 0; r < MS_ROWS; r++)
                v[r] = QB_ADD(v[r], __shfl_down_sync(0xffffffffu, v[r], ms_stride(st), MS_LANES));
        }
        if (lane != 0 || i >= pg.n) continue;
        QB_UNROLL
        for (int r = 0; r < MS_ROWS; r++)   /* unrolled, so v stays in registers */
            if (r < nr)
                head_e[(rb + r) * Th + i] =
                    ms_score(ms_tail(qs + r * D, k, D, v[r]), pg.bias, pg.pos, i, ms_q_pos(&q, rb + r));
    }
}

/* A block a (row blockIdx.x, KV head blockIdx.y): the row's largest score, every score made its
 * weight (in place), the weights' sum in MS_PARTS parts added pairwise, and the row's factor
 * (factor[h * n + r]). */
__global__ void __launch_bounds__(MS_PARTS) mass_weight_kernel(float *e, const int64_t *tok0, int64_t n, float *factor)
{
    __shared__ float mxs[MS_PARTS];
    __shared__ double parts[MS_PARTS];
    const int h = (int)blockIdx.y;
    const int64_t T = tok0[h + 1] - tok0[h];
    float *row = e + n * tok0[h] + (int64_t)blockIdx.x * T;
    const int u = threadIdx.x;
    float mx = -INFINITY;
    for (int64_t j = u; j < T; j += MS_PARTS)
        if (row[j] > mx) mx = row[j];
    mxs[u] = mx;
    __syncthreads();
    for (int st = MS_PARTS / 2; st >= 1; st /= 2) {   /* the same value in any order */
        if (u < st && mxs[u + st] > mxs[u]) mxs[u] = mxs[u + st];
        __syncthreads();
    }
    mx = mxs[0];
    float *f = factor + (int64_t)h * n + blockIdx.x;
    if (mx == -INFINITY) {   /* the whole block */
        if (u == 0) *f = MS_EMPTY;
        return;
    }
    for (int64_t j = u; j < T; j += MS_PARTS) row[j] = ms_weight(row[j], mx);
    parts[u] = ms_part(row, T, u);   /* the weights this thread wrote */
    __syncthreads();
    for (int st = MS_PARTS / 2; st >= 1; st /= 2) {
        ms_parts_step(parts, st, u);
        __syncthreads();
    }
    if (u == 0) *f = ms_factor(mx, parts[0]);
}

/* A thread a key (of every head's): its mass plus each of its head's rows' weight times the row's
 * factor, rows in order. */
__global__ void __launch_bounds__(MS_ADD_THREADS) mass_add_kernel(const float *e, const int64_t *tok0, int n_kv,
                                                                   int64_t n, const float *factor, float *acc)
{
    const int64_t j = (int64_t)blockIdx.x * MS_ADD_THREADS + threadIdx.x;
    if (j >= tok0[n_kv]) return;
    const int h = ms_head_of(tok0, n_kv, j);
    const int64_t T = tok0[h + 1] - tok0[h];
    acc[j] = ms_add(acc[j], e + n * tok0[h], T, n, factor + (int64_t)h * n, j - tok0[h]);
}

/* Floats of scores a pass holds on the device (32 MiB): the rows run in passes of at most this many. */
#define MS_WORK_FLOATS ((int64_t)1 << 23)

/* The mass found the device or page-locked memory short (not a device error): what fail() recorded
 * for it is taken back, since the CPU computes the mass instead and the run goes on. Only for a call
 * that began with no failure recorded. Returns 1. */
static int mass_short(cuda_impl *ci)
{
    ci->failed = 0;
    ci->fail_msg[0] = 0;
    return 1;
}

/* On the device from its copies of the pages (the list kept under m->table, as attention's), the
 * queries from where they are (bound: on the device; else only the heads' packed and sent), the
 * sums sent, added to and brought back: one wait. 0; 1 when memory for it was short (nothing
 * recorded, the batch dropped: the pages go up whole at their next use); or -1 with the failure
 * recorded. The caller has checked that no failure was recorded before. */
static int attn_mass_dev(cuda_impl *ci, const be_mass *m, int64_t T)
{
    const int H = m->n_kv > 1 ? m->n_kv : 1;
    const int64_t rows = m->n_q * m->group, D = m->head_dim, np = m->n_pages, hq = (int64_t)H * m->group;
    int64_t hp1[2] = { 0, np };
    const int64_t *hp = m->n_kv > 1 ? m->head_pages : hp1;
    if (ci->batch.n && send_batch(ci)) return -1;
    pt_call pl;
    int rc = pt_build(&ci->tables, m->table, 0, m->pages, np, hp, H, NULL, &pl);
    if (rc != PT_OK) {
        if (ci->failed || rc == PT_BAD_LIST) {   /* an upload that could not be queued, or a bad list */
            tables_failed(ci, rc);
            return -1;
        }
        lose_batch(ci);
        return 1;
    }
    if (send_batch(ci)) return -1;
    const size_t qspan = sizeof(float) * (size_t)((m->n_q - 1) * m->q_stride + (m->first_head + hq) * D);
    const int q_bound = bound(ci, m->q, qspan);
    const size_t fb = sizeof(int64_t) * (size_t)(np + H + 1), ab = sizeof(float) * (size_t)T;
    const size_t qb = q_bound ? 0 : sizeof(float) * (size_t)(m->n_q * hq * D);
    if (fb + qb > ci->cap_ms_host) {
        void *nh = realloc(ci->ms_host, fb + qb);
        if (!nh) return 1;
        ci->ms_host = nh;
        ci->cap_ms_host = fb + qb;
    }
    int64_t *first = (int64_t *)ci->ms_host, *tok0 = first + np;
    ms_offsets(m->pages, hp, H, first, tok0);
    ms_rows r = { NULL, m->q_stride, m->q_pos0, 0, 0, m->first_head, m->group, (int)D };
    if (!q_bound) {   /* the heads' query rows only, side by side */
        float *pack = (float *)(tok0 + H + 1);
        for (int64_t t = 0; t < m->n_q; t++)
            memcpy(pack + t * hq * D, m->q + t * m->q_stride + m->first_head * D, sizeof(float) * (size_t)(hq * D));
        r.q_stride = hq * D;
        r.first_head = 0;
    }
    int64_t per = MS_WORK_FLOATS / T;
    if (per < 1) per = 1;
    if (per > rows) per = rows;
    if (per > (int64_t)MS_ROWS * 65535) per = (int64_t)MS_ROWS * 65535;
    if (grow_dev(ci, (void **)&ci->ms_e, &ci->cap_ms_e, sizeof(float) * (size_t)(per * T)) ||
        grow_dev(ci, (void **)&ci->ms_factor, &ci->cap_ms_factor, sizeof(float) * (size_t)(per * H)) ||
        grow_dev(ci, (void **)&ci->ms_acc, &ci->cap_ms_acc, ab) || grow_host(ci, (void **)&ci->h_ms, &ci->cap_h_ms, ab))
        return mass_short(ci);   /* only allocations failed (each leaves its buffer empty) */
    if (stage_reserve(ci, stage_size(fb) + stage_size(ab) + stage_size(qb))) return -1;
    const int64_t *d_first = (const int64_t *)stage(ci, first, fb), *d_tok0 = d_first ? d_first + np : NULL;
    r.q = q_bound ? (const float *)am_dev_in(&ci->act, m->q, qspan) : (const float *)stage(ci, tok0 + H + 1, qb);
    if (!d_first || !r.q || send_to(ci, ci->ms_acc, m->acc, ab)) return -1;
    cudaStream_t s = ci->stream;
    for (r.r0 = 0; r.r0 < rows; r.r0 += per) {
        r.n = rows - r.r0 < per ? rows - r.r0 : per;
        mass_score_kernel<<<dim3((unsigned)np, (unsigned)((r.n + MS_ROWS - 1) / MS_ROWS)), MS_THREADS, 0, s>>>(
            r, pl.pages, pl.head_pages, d_tok0, H, d_first, ci->ms_e);
        mass_weight_kernel<<<dim3((unsigned)r.n, (unsigned)H), MS_PARTS, 0, s>>>(ci->ms_e, d_tok0, r.n, ci->ms_factor);
        mass_add_kernel<<<(unsigned)((T + MS_ADD_THREADS - 1) / MS_ADD_THREADS), MS_ADD_THREADS, 0, s>>>(
            ci->ms_e, d_tok0, H, r.n, ci->ms_factor, ci->ms_acc);
        if (ck(ci, cudaGetLastError(), "attention mass kernels")) return -1;
    }
    if (ck(ci, cudaMemcpyAsync(ci->h_ms, ci->ms_acc, ab, cudaMemcpyDeviceToHost, s), "attention mass download"))
        return -1;
    ci->bytes_down += ab;
    if (sync_stream(ci, "attention mass")) return -1;
    memcpy(m->acc, ci->h_ms, ab);
    return 0;
}

/* The eviction policies' attention mass: on the device where it can run (head dimensions up to
 * MS_MAX_D, memory for it); else, and once the device has failed, on the CPU backend's threads
 * from the host's pages and the queries the host has (a policy evicts by it, and an eviction by a
 * mass never computed could not be undone). Both give the same floats. */
static void cuda_attn_mass(be_backend *b, const be_mass *m)
{
    cuda_impl *ci = impl_of(b);
    if (m->n_q <= 0) return;
    int64_t T = 0;
    for (int64_t i = 0; i < m->n_pages; i++) T += m->pages[i].n;
    const int was_failed = ci->failed;
    if (!was_failed && T > 0 && m->group > 0 && m->head_dim > 0 && m->head_dim <= MS_MAX_D &&
        m->n_kv <= PT_MAX_HEADS && attn_mass_dev(ci, m, T) == 0)
        return;
    const int64_t hq = (int64_t)(m->n_kv > 1 ? m->n_kv : 1) * m->group;
    am_range r = { m->q,
                   sizeof(float) * (size_t)((m->n_q - 1) * m->q_stride + (m->first_head + hq) * m->head_dim) };
    if (!was_failed) am_host_read(&ci->act, &r, 1);   /* (a device path that failed just now may read) */
    ci->cpu->ops->attn_mass(ci->cpu, m);
}

static void cuda_add_norm(be_backend *b, float *x, float *o, const float *post, const float *w, float *h, int64_t rows,
                          int64_t dim, float eps)
{
    cuda_impl *ci = impl_of(b);
    size_t bytes = sizeof(float) * (size_t)(rows * dim), wb = sizeof(float) * (size_t)dim;
    if (ci->failed || rows <= 0) return;
    if (bound(ci, x, bytes) && bound(ci, o, bytes) && (!w || bound(ci, h, bytes))) {
        const float *dpost = post ? (const float *)const_get(ci, post, wb) : NULL;
        const float *dw = w ? (const float *)const_get(ci, w, wb) : NULL;
        if ((post && !dpost) || (w && !dw)) return;
        float *dx = (float *)am_dev_out(&ci->act, x, bytes);
        float *dox = post ? (float *)am_dev_out(&ci->act, o, bytes) : (float *)am_dev_in(&ci->act, o, bytes);
        float *dh = w ? (float *)am_dev_out(&ci->act, h, bytes) : NULL;
        add_norm_kernel<<<(unsigned)rows, FK_AN_THREADS, 0, ci->stream>>>(dx, dox, dpost, dw, dh, dim, eps);
        ck(ci, cudaGetLastError(), "add_norm");
        return;
    }
    am_range r[2] = { { x, bytes }, { o, bytes } };
    am_host_read(&ci->act, r, 2);
    am_host_write(&ci->act, x, bytes);
    if (post) am_host_write(&ci->act, o, bytes);
    if (w) am_host_write(&ci->act, h, bytes);
    ci->cpu->ops->add_norm(ci->cpu, x, o, post, w, h, rows, dim, eps);
}

/* Embedding rows of a weight the device holds as the file stores it: thread (token, group of 32)
 * decodes its values exactly as the reference dequantizer (kernels/quant_blocks.h), then scales them
 * as the CPU backend does. */
__global__ void get_rows_kernel(const uint8_t *w, uint32_t type, size_t stride, const int32_t *ids, int64_t n,
                                int64_t n_in, float scale, float *out)
{
    const int64_t groups = n_in / 32, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * groups) return;
    const int64_t t = i / groups, g = i % groups;
    float y[32];
    qb_row_group(type, w + (size_t)ids[t] * stride, g, y);
    float *o = out + t * n_in + g * 32;
    for (int j = 0; j < 32; j++) o[j] = scale != 1.0f ? __fmul_rn(y[j], scale) : y[j];
}

/* Embedding rows: gathered on the device when the weight is there as stored (a tied output
 * weight) and the rows are bound, so a decode step's input never goes through the host; else
 * dequantized exactly on the host (a row a token) and uploaded at their first use. */
static void cuda_get_rows(be_backend *b, const be_weight *w, const int32_t *ids, int64_t n, float scale, float *out)
{
    cuda_impl *ci = impl_of(b);
    size_t bytes = sizeof(float) * (size_t)(n * w->n_in);
    dev_weight *dw = ci->failed || n <= 0 ? NULL : find_weight(ci, w->data);
    if (dw && dw->type == w->type && qb_native(w->type) && w->n_in % 32 == 0 && bound(ci, out, bytes)) {
        const int32_t *d_ids = (const int32_t *)stage(ci, ids, sizeof(int32_t) * (size_t)n);
        if (!d_ids) return;
        float *d_out = (float *)am_dev_out(&ci->act, out, bytes);
        int64_t threads = n * (w->n_in / 32);
        get_rows_kernel<<<(unsigned)((threads + EW_THREADS - 1) / EW_THREADS), EW_THREADS, 0, ci->stream>>>(
            dw->d, dw->type, dw->stride, d_ids, n, w->n_in, scale, d_out);
        ck(ci, cudaGetLastError(), "embedding kernel");
        return;
    }
    am_host_write(&ci->act, out, bytes);
    ci->cpu->ops->get_rows(ci->cpu, w, ids, n, scale, out);
}

/* A warp a row, as the CPU's vd_dot_f32 adds (kernels/score_kernels.h): the same floats. */
__global__ void __launch_bounds__(SC_THREADS) scores_kernel(const float *m, int64_t n_rows, int64_t dim, const float *x,
                                                            float *y)
{
    const int64_t r = sc_row(blockIdx.x, threadIdx.x);
    const int lane = threadIdx.x % SC_LANES;
    if (r >= n_rows) return;   /* the whole warp */
    float v = sc_lane_sum(m + r * dim, x, dim, lane);
    for (int k = 0; k < SC_N_STRIDES; k++) v += __shfl_down_sync(0xffffffffu, v, sc_stride(k));
    if (lane == 0) y[r] = v;
}

/* On the device where the matrix and the scores are bound (CHESS's summaries: the span of rows the
 * host rewrote is sent, and the scores stay there until the host reads them); on the host
 * otherwise, and once an op has failed (from the host's copies). */
static void cuda_scores(be_backend *b, const float *m, int64_t n_rows, int64_t dim, const float *x, float *y)
{
    cuda_impl *ci = impl_of(b);
    size_t mb = sizeof(float) * (size_t)(n_rows * dim), yb = sizeof(float) * (size_t)n_rows;
    if (n_rows <= 0) return;
    if (!ci->failed && dim > 0 && am_bound(&ci->act, m, mb) && am_bound(&ci->act, y, yb)) {
        const float *dx = am_bound(&ci->act, x, sizeof(float) * (size_t)dim)
                              ? (const float *)am_dev_in(&ci->act, x, sizeof(float) * (size_t)dim)
                              : (const float *)stage(ci, x, sizeof(float) * (size_t)dim);
        if (!dx) goto host;   /* the staging failed (recorded) */
        const float *dm = (const float *)am_dev_in(&ci->act, m, mb);
        float *dy = (float *)am_dev_out(&ci->act, y, yb);
        unsigned blocks = (unsigned)((n_rows + SC_ROWS_PER_BLOCK - 1) / SC_ROWS_PER_BLOCK);
        scores_kernel<<<blocks, SC_THREADS, 0, ci->stream>>>(dm, n_rows, dim, dx, dy);
        ck(ci, cudaGetLastError(), "scores kernel");
        return;
    }
host:;
    am_range r[2] = { { m, mb }, { x, sizeof(float) * (size_t)dim } };
    am_host_read(&ci->act, r, 2);
    am_host_write(&ci->act, y, yb);
    ci->cpu->ops->scores(ci->cpu, m, n_rows, dim, x, y);
}

/* ---------------------------------------------------------------- CHESS's summary rows */

/* A block a (slot, unit), thread t the elements t, t + KM_THREADS, ... of that unit
 * (kernels/mean_kernels.h: the CPU's floats): the row's unscaled elements and, where rows are
 * scaled, the unit's sum of squares. */
__global__ void __launch_bounds__(KM_THREADS, 1) key_means_kernel(km_src s, km_req q, km_outs out, double *sq)
{
    __shared__ float vals[KM_MAX_D];
    const int64_t slot = blockIdx.x;
    const int u = (int)blockIdx.y;
    km_thread_elems(&s, &q, out, slot, u, (int)threadIdx.x, vals);
    if (!q.unit || km_is_anchor(&q, slot)) return;   /* the whole block */
    __syncthreads();
    if (threadIdx.x == 0) sq[slot * q.units + u] = km_unit_sq(vals, s.head_dim);
}

/* A block a scaled row: its units' sums added in order, then every element scaled. */
__global__ void __launch_bounds__(KM_SCALE_THREADS) key_scale_kernel(km_req q, int D, km_outs out, const double *sq)
{
    __shared__ float inv;
    const int64_t slot = blockIdx.x;
    if (threadIdx.x == 0) inv = km_row_inv(sq + slot * q.units, q.units);
    __syncthreads();
    km_thread_scale(&q, D, out, slot, (int)threadIdx.x, inv);
}

/* On the device, from its copies of the pages (each list kept under its name, as attention's are),
 * into the bound rows: nothing goes up but the pages' new rows and changed descriptors, nothing
 * comes back. 0, or -1 with the failure recorded. */
static int key_means_dev(cuda_impl *ci, const be_key_means *m, const km_req *q, float *const *host_out,
                         const size_t *bytes)
{
    if (ci->batch.n && send_batch(ci)) return -1;
    km_dlist *lists = (km_dlist *)malloc(sizeof(km_dlist) * (size_t)m->n_lists);
    if (!lists) return fail(ci, "out of memory");
    for (int l = 0; l < m->n_lists; l++) {
        const be_page_list *L = &m->lists[l];
        pt_call pl;
        int rc = pt_build(&ci->tables, L->table, L->shape, L->pages, L->head_pages[m->n_head_kv], L->head_pages,
                          m->n_head_kv, NULL, &pl);
        if (rc != PT_OK) {
            tables_failed(ci, rc);
            free(lists);
            return -1;
        }
        lists[l] = (km_dlist){ pl.pages, pl.head_pages };
    }
    const int64_t n_slots = km_slots(q), scaled = q->unit ? q->np + q->nc + q->ng : 0;
    const size_t lb = sizeof(km_dlist) * (size_t)m->n_lists, sqb = sizeof(double) * (size_t)(scaled * q->units);
    const km_dlist *d_lists = NULL;
    if (!send_batch(ci) && !stage_reserve(ci, stage_size(lb))) d_lists = (const km_dlist *)stage(ci, lists, lb);
    free(lists);
    if (!d_lists || (sqb && grow_dev(ci, (void **)&ci->km_sq, &ci->cap_km_sq, sqb))) return -1;
    km_outs d_out;
    for (int i = 0; i < 4; i++) d_out.o[i] = bytes[i] ? (float *)am_dev_out(&ci->act, host_out[i], bytes[i]) : NULL;
    const km_src src = { NULL, d_lists, m->n_head_kv, m->head_dim };
    key_means_kernel<<<dim3((unsigned)n_slots, (unsigned)q->units), KM_THREADS, 0, ci->stream>>>(src, *q, d_out,
                                                                                                 ci->km_sq);
    if (ck(ci, cudaGetLastError(), "key means kernel")) return -1;
    if (scaled > 0) {
        key_scale_kernel<<<(unsigned)scaled, KM_SCALE_THREADS, 0, ci->stream>>>(*q, m->head_dim, d_out, ci->km_sq);
        if (ck(ci, cudaGetLastError(), "key scale kernel")) return -1;
    }
    return 0;
}

/* On the device where every output is bound; on the host otherwise, and when the device fails
 * (from the host's pages: CHESS counts the rows as computed either way). */
static void cuda_key_means(be_backend *b, const be_key_means *m)
{
    cuda_impl *ci = impl_of(b);
    const km_req q = km_req_of(m);
    if (km_slots(&q) <= 0) return;
    const int64_t dim = (int64_t)q.units * m->head_dim;
    float *const host_out[4] = { q.np ? m->page_rows + q.p0 * dim : NULL, q.nc ? m->chunk_rows + q.c0 * dim : NULL,
                                 q.ng ? m->grid_rows + q.g0 * dim : NULL, q.n_last ? m->anchor : NULL };
    const size_t bytes[4] = { sizeof(float) * (size_t)(q.np * dim), sizeof(float) * (size_t)(q.nc * dim),
                              sizeof(float) * (size_t)(q.ng * dim), q.n_last ? sizeof(float) * (size_t)dim : 0 };
    int on_dev = !ci->failed && m->head_dim <= KM_MAX_D && m->n_head_kv <= PT_MAX_HEADS && q.units <= 65535;
    for (int i = 0; i < 4 && on_dev; i++)
        if (bytes[i] && !bound(ci, host_out[i], bytes[i])) on_dev = 0;
    if (on_dev && key_means_dev(ci, m, &q, host_out, bytes) == 0) return;
    for (int i = 0; i < 4; i++)
        if (bytes[i] && bound(ci, host_out[i], bytes[i])) am_host_write(&ci->act, host_out[i], bytes[i]);
    ci->cpu->ops->key_means(ci->cpu, m);
}

/* ---------------------------------------------------------------- the selection policies' bounds */

/* Each KV head's summary count, passed by value. */
typedef struct bd_counts {
    int64_t n[SL_MAX_HEADS];
} bd_counts;

/* Sixteen threads a summary (kernels/bound_kernels.h); KV head blockIdx.y's bounds to its row of u
 * (stride floats; -inf past its count, which the pick's keys leave out). */
__global__ void __launch_bounds__(BD_THREADS) bound_kernel(const float *q, int group, int64_t dim, const float *sum,
                                                           int64_t cap, bd_counts cnt, int64_t stride, float *u)
{
    const int h = blockIdx.y, lane = threadIdx.x % BD_LANES;
    const int64_t i = bd_entry(blockIdx.x, threadIdx.x), n = cnt.n[h];
    const float *mn = sum + bd_summary_at(h, cap, i, dim), *mx = mn + dim;
    float acc = 0.0f;
    for (int j = 0; j < group; j++) {
        const float *qj = q + bd_query_at(h, group, j, dim);
        float v = i < n ? bd_lane_sum(qj, mn, mx, dim, lane) : 0.0f;
        for (int st = BD_LANES / 2; st > 0; st >>= 1) {   /* bd_tree_step, lanes exchanging by shuffles */
            float o = __shfl_down_sync(0xffffffffu, v, st, BD_LANES);
            if (lane < st) v += o;
        }
        if (lane == 0 && i < n) acc += bd_tail(qj, mn, mx, dim, v);
    }
    if (lane == 0 && i < stride) u[bd_out_at(h, stride, i)] = i < n ? acc : -INFINITY;
}

/* Each head's k best keys (bd_keys) as ascending indices and their count, where the call's best and
 * n_best are bound: a block a head, a thread a key (bd_rank). */
__global__ void __launch_bounds__(BE_PICK_MAX) bd_ids_kernel(const uint64_t *keys, int32_t k, int32_t *best,
                                                             int32_t *n_best)
{
    __shared__ uint64_t kh[BE_PICK_MAX];
    const int h = blockIdx.x, i = threadIdx.x;
    kh[i] = i < k ? keys[(int64_t)h * k + i] : 0;
    __syncthreads();
    const int32_t r = i < k ? bd_rank(kh, k, i) : -1;
    const int n = __syncthreads_count(r >= 0);
    if (r >= 0) best[(int64_t)h * k + r] = lp_key_id(kh[i]);
    if (i == 0) n_best[h] = n;
}

/* The summaries stay on the device between calls (kernels/summary_lists.h); the bounds and each
 * head's best are found there, and the best (or every bound, when asked) come back in one copy,
 * or, where the call's best and n_best are bound, stay there for attention without a wait. */
static void cuda_bound_pages(be_backend *b, be_bounds *r)
{
    cuda_impl *ci = impl_of(b);
    const int H = r->n_head_kv;
    if (r->k > BE_PICK_MAX) r->k = BE_PICK_MAX;
    const int32_t k = r->k;
    const size_t ids_bytes = sizeof(int32_t) * (size_t)(H * (k > 0 ? k : 0)), cnt_bytes = sizeof(int32_t) * (size_t)H;
    const int keep = k > 0 && bound(ci, r->best, ids_bytes) && bound(ci, r->n_best, cnt_bytes);
    for (int h = 0; k > 0 && !keep && h < H; h++) r->n_best[h] = 0;
    if (ci->failed) return;
    const int64_t n_all = r->off[H];
    if (keep && n_all <= 0) {   /* nothing to choose: the counts written on the host, sent when read */
        am_host_write(&ci->act, r->n_best, cnt_bytes);
        for (int h = 0; h < H; h++) r->n_best[h] = 0;
        return;
    }
    if (n_all <= 0 || (k <= 0 && !r->u)) return;
    size_t qbytes = sizeof(float) * (size_t)H * (size_t)r->group * (size_t)r->dim;
    if (ci->batch.n && send_batch(ci)) return;   /* the batch holds this call's entries alone */
    char err[160];
    const sl_list *L = sl_update(&ci->sums, r, err, sizeof err);
    if (!L) {
        if (ci->failed) return;   /* a round of the batch failed on its way (recorded) */
        /* no room on the device for the summaries (or too many heads): they are on the host, and
         * so are the CPU backend's threads (whose best, if kept, go up when attention reads them) */
        ub_clear(&ci->batch, 0);
        host_in(ci, r->q, qbytes);
        if (keep) {
            am_host_write(&ci->act, r->best, ids_bytes);
            am_host_write(&ci->act, r->n_best, cnt_bytes);
        }
        ci->cpu->ops->bound_pages(ci->cpu, r);
        return;
    }
    if (send_batch(ci)) return;
    bd_counts cnt;
    int64_t stride = 1;
    for (int h = 0; h < H; h++) {
        cnt.n[h] = r->off[h + 1] - r->off[h];
        if (cnt.n[h] > stride) stride = cnt.n[h];
    }
    const float *dq = bound(ci, r->q, qbytes) ? (const float *)am_dev_in(&ci->act, r->q, qbytes)
                                              : (const float *)stage(ci, r->q, qbytes);
    int64_t blocks[9];
    int rounds = k > 0 ? pk_plan(stride, k, blocks) : 0;
    size_t u_bytes = sizeof(float) * (size_t)(H * stride);
    size_t keys_bytes = k > 0 ? sizeof(uint64_t) * (size_t)(H * blocks[0] * k) : 0;
    size_t best_bytes = k > 0 ? sizeof(uint64_t) * (size_t)(H * k) : 0;
    size_t back = (keep ? 0 : best_bytes) + (r->u ? u_bytes : 0);
    if (!dq || grow_dev(ci, (void **)&ci->bd_u, &ci->cap_bd_u, u_bytes) ||
        (k > 0 && (grow_dev(ci, (void **)&ci->bd_keys, &ci->cap_bd_keys, 2 * keys_bytes + best_bytes) ||
                   grow_dev(ci, (void **)&ci->pick_max, &ci->cap_pick_max, sizeof(float) * (size_t)(H * blocks[0])))) ||
        grow_host(ci, (void **)&ci->h_bd, &ci->cap_h_bd, back))
        return;
    cudaStream_t s = ci->stream;
    dim3 grid((unsigned)((stride + BD_PER_BLOCK - 1) / BD_PER_BLOCK), (unsigned)H);
    bound_kernel<<<grid, BD_THREADS, 0, s>>>(dq, r->group, r->dim, L->dev, L->cap, cnt, stride, ci->bd_u);
    if (ck(ci, cudaGetLastError(), "bound kernel")) return;
    uint64_t *best = ci->bd_keys + 2 * (keys_bytes / sizeof(uint64_t));
    if (k > 0) {
        uint64_t *lists[2] = { ci->bd_keys, ci->bd_keys + H * blocks[0] * k };
        pick_slice_kernel<<<dim3((unsigned)blocks[0], (unsigned)H), PK_THREADS, 0, s>>>(
            ci->bd_u, stride, stride, NULL, 0, 1.0f, k, rounds == 0 ? best : lists[0], ci->pick_max);
        if (ck(ci, cudaGetLastError(), "bound pick kernel")) return;
        for (int rd = 1; rd <= rounds; rd++) {
            uint64_t *dst = rd == rounds ? best : lists[rd & 1];
            pick_merge_kernel<<<dim3((unsigned)blocks[rd], (unsigned)H), PK_THREADS, 0, s>>>(lists[(rd - 1) & 1],
                                                                                       blocks[rd - 1], k, dst);
            if (ck(ci, cudaGetLastError(), "bound pick merge kernel")) return;
        }
        if (keep) {   /* ascending indices where the call's arrays are on the device; nothing comes back */
            int32_t *d_ids = (int32_t *)am_dev_out(&ci->act, r->best, ids_bytes);
            int32_t *d_cnt = (int32_t *)am_dev_out(&ci->act, r->n_best, cnt_bytes);
            bd_ids_kernel<<<(unsigned)H, BE_PICK_MAX, 0, s>>>(best, k, d_ids, d_cnt);
            ck(ci, cudaGetLastError(), "bound ids kernel");
            if (!r->u) return;
        } else if (ck(ci, cudaMemcpyAsync(ci->h_bd, best, best_bytes, cudaMemcpyDeviceToHost, s), "bound download")) {
            return;
        }
    }
    const size_t u_at = keep ? 0 : best_bytes;
    if (r->u && ck(ci, cudaMemcpyAsync(ci->h_bd + u_at, ci->bd_u, u_bytes, cudaMemcpyDeviceToHost, s),
                   "bound download"))
        return;
    ci->bytes_down += back;
    if (sync_stream(ci, "bounds")) return;
    for (int h = 0; h < H; h++) {
        if (r->u)
            memcpy(r->u + r->off[h], ci->h_bd + u_at + sizeof(float) * (size_t)(h * stride),
                   sizeof(float) * (size_t)cnt.n[h]);
        if (k <= 0 || keep) continue;
        int32_t *ids = r->best + (int64_t)h * k, n = 0;
        for (int32_t i = 0; i < k; i++) {
            uint64_t key;
            memcpy(&key, ci->h_bd + sizeof key * (size_t)(h * k + i), sizeof key);
            if (key == 0) break;
            ids[n++] = lp_key_id(key);
        }
        for (int32_t i = 1; i < n; i++)   /* ascending: a few hundred at most */
            for (int32_t j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
                int32_t t = ids[j];
                ids[j] = ids[j - 1];
                ids[j - 1] = t;
            }
        r->n_best[h] = n;
    }
}

static int cuda_failed(be_backend *b, char *err, size_t errlen)
{
    cuda_impl *ci = impl_of(b);
    if (!ci->failed) return 0;
    if (ci->dead) {
        snprintf(err, errlen, "%s", ci->fail_msg);
        return 1;
    }
    /* what the abandoned ops left queued is finished or failed before anything new starts; an error
     * that outlives the wait (an illegal address, a failed launch) leaves the device unusable for
     * this process, and every later question gets the same answer */
    cudaError_t e = cudaStreamSynchronize(ci->stream);
    if (e != cudaSuccess) {
        char first[sizeof ci->fail_msg];
        snprintf(first, sizeof first, "%s", ci->fail_msg);
        snprintf(ci->fail_msg, sizeof ci->fail_msg,
                 "the GPU cannot go on (%s; first noticed as: %.160s): restart kvchat", cudaGetErrorString(e), first);
        ci->dead = 1;
        snprintf(err, errlen, "%s", ci->fail_msg);
        return 1;
    }
    snprintf(err, errlen, "%s", ci->fail_msg);
    ci->failed = 0;
    (void)cudaGetLastError();
    ci->arena_off = 0;
    return 1;
}

/* The profiler's wait after each op (KVCHAT_PROFILE=sync): a wait like any other (the staging
 * arena is free and what was prefetched is in after it), except that it is not counted, so that the
 * waits the profile reports are the program's own. */
static void cuda_finish(be_backend *b)
{
    cuda_impl *ci = impl_of(b);
    if (ci->failed) return;
    sync_stream(ci, "finish");   /* a failure is recorded for the caller's next be_ops.failed */
    ci->waits--;
}

static void cuda_counters(be_backend *b, uint64_t *waits, uint64_t *bytes_up, uint64_t *bytes_down)
{
    cuda_impl *ci = impl_of(b);
    *waits = ci->waits;
    *bytes_up = ci->bytes_up;
    *bytes_down = ci->bytes_down;
}

static void cuda_memory(be_backend *b, uint64_t *held, uint64_t *total)
{
    cuda_impl *ci = impl_of(b);
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    *held = ci->weight_bytes + ci->blocks.bytes + ci->scratch_bytes + ci->act.bytes + ci->consts.bytes +
            ci->tables.bytes + ci->sums.bytes;
    *total = (uint64_t)tot;
}

static void cuda_destroy(be_backend *b)
{
    cuda_impl *ci = impl_of(b);
    if (ci) {
        for (int i = 0; i < ci->n_w; i++) cudaFree(ci->w[i].d);
        free(ci->w);
        pt_free(&ci->tables);
        sl_free(&ci->sums);
        pc_free(&ci->copies);
        bp_free(&ci->blocks);
        ub_free(&ci->batch);
        cc_free(&ci->consts);
        free(ci->rows_list);
        am_free(&ci->act);
        void *dev[] = { ci->y32,   ci->out,   ci->x16, ci->part_o, ci->part_ml, ci->d_arena,
                        ci->cur16, ci->wtile, ci->xal, ci->xq,     ci->xd,      ci->cur_pos,
                        ci->pick_keys, ci->pick_max, ci->pick_sums, ci->pick_res, ci->bd_u, ci->bd_keys,
                        ci->sel_pages, ci->sel_hp, ci->km_sq, ci->ms_e, ci->ms_factor, ci->ms_acc };
        for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
        free(ci->ms_host);
        void *host[] = { ci->h_y, ci->h_out, ci->h_arena, ci->h_wstage, ci->h_pick, ci->h_bd, ci->h_ms };
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
    "cuda", cuda_matmul, cuda_rmsnorm, cuda_qk_rope, cuda_glu, cuda_get_rows, cuda_attention, cuda_scores,
    cuda_bound_pages, cuda_prepare, cuda_memory, cuda_destroy, cuda_add_norm, cuda_bind, cuda_unbind,
    cuda_host_read, cuda_host_write, cuda_failed, cuda_counters, cuda_pick, cuda_host_prefetch, cuda_finish,
    cuda_key_means, cuda_bind_blank, cuda_attn_mass,
};

/* KVCHAT_CUDA_RESIDENT=0: no residency at all (every op stages its host arrays and waits, and the
 * forward pass waits once a layer), to compare with. */
static const be_ops cuda_ops_staged = {
    "cuda", cuda_matmul, cuda_rmsnorm, cuda_qk_rope, cuda_glu, cuda_get_rows, cuda_attention, cuda_scores,
    cuda_bound_pages, cuda_prepare, cuda_memory, cuda_destroy, cuda_add_norm, NULL, NULL, NULL, NULL,
    cuda_failed, cuda_counters, cuda_pick, NULL, cuda_finish, cuda_key_means, NULL, cuda_attn_mass,
};

extern "C" uint64_t be_cuda_flash_calls(be_backend *b)
{
    return b && b->ops && b->ops->attention == cuda_attention ? impl_of(b)->flash_calls : 0;
}

extern "C" void be_cuda_warmed_up(be_backend *b)
{
    if (!b || !b->ops || b->ops->attention != cuda_attention) return;
    cuda_impl *ci = impl_of(b);
    if (ci->batch.n > 0) return;   /* rows still queued for the copies: the idle sweep frees them later */
    pt_release_all(&ci->tables);
}

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
    const char *res = getenv("KVCHAT_CUDA_RESIDENT");
    b->ops = res && !strcmp(res, "0") ? &cuda_ops_staged : &cuda_ops;
    b->impl = ci;
    const char *mmv_env = getenv("KVCHAT_CUDA_MMV");
    ci->no_mmv = mmv_env && !strcmp(mmv_env, "0");
    ci->mmv_f32 = mmv_env && !strcmp(mmv_env, "f32");
    const char *inflight_env = getenv("KVCHAT_CUDA_MMV_INFLIGHT");
    ci->mmv_inflight = inflight_env && !strcmp(inflight_env, "1") ? 1 : 2;
    const char *attn_env = getenv("KVCHAT_CUDA_ATTN");
    if (attn_env && *attn_env && strcmp(attn_env, "flash") && strcmp(attn_env, "grouped") && strcmp(attn_env, "scalar")) {
        snprintf(err, errlen, "KVCHAT_CUDA_ATTN must be flash (the default), grouped or scalar");
        free(b);
        free(ci);
        return NULL;
    }
    ci->attn_scalar = attn_env && !strcmp(attn_env, "scalar");
    /* prefill chunks on the tensor cores unless asked otherwise (measured on an H200: docs/gpu.md) */
    ci->attn_flash = !ci->attn_scalar && !(attn_env && !strcmp(attn_env, "grouped"));
    const char *splits_env = getenv("KVCHAT_CUDA_ATTN_SPLITS");
    ci->attn_splits = splits_env ? atoi(splits_env) : 0;
    if (ci->attn_splits < 0 || ci->attn_splits > 4096) ci->attn_splits = 0;
    const char *max_env = getenv("KVCHAT_CUDA_MMV_MAX");
    char *end = NULL;
    long long mx = max_env ? strtoll(max_env, &end, 10) : -1;
    ci->mmv_max = max_env && end != max_env && !*end && mx >= 0 ? (int64_t)mx : -1;
    pc_device dev = { ci, dev_alloc, dev_release, dev_upload };
    pc_init(&ci->copies, &dev, COPY_IDLE);
    pt_device tdev = { ci, dev_malloc, dev_free };
    pt_init(&ci->tables, &tdev, &ci->copies, &ci->batch);
    sl_device sdev = { ci, dev_malloc, dev_free };
    sl_init(&ci->sums, &sdev, &ci->batch);
    ci->batch.limit = (size_t)32 << 20;   /* well within the staging arena's 256 MiB */
    ci->batch.flush = flush_batch;
    ci->batch.flush_ud = ci;
    bp_init(&ci->blocks, ci, dev_malloc, dev_free, (size_t)64 << 20);
    cc_device cdev = { ci, dev_malloc, dev_free, const_upload };
    cc_init(&ci->consts, &cdev);
    am_device adev = { ci, dev_malloc, dev_free, act_upload, act_download, act_wait, act_pin };
    am_init(&ci->act, &adev);
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
