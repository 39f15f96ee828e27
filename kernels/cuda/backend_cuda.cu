/* backend_cuda.cu - the CUDA implementation of the backend op table (kernels/backend.h): the table
 * itself, the backend's life, and what every op shares. The ops' kernels are in the files named
 * after them (kernels/cuda/backend_cuda.cuh lists them).
 *
 * Activations: the forward pass binds its scratch buffers; each gets a device twin
 * (kernels/act_mirror.c keeps which side holds the newest bytes) and ops leave their outputs there,
 * so a decode step waits for the device once a layer, when the host needs the new K/V rows (and,
 * under a policy, the queries), or, when no policy looks between them, not at all before its
 * pick: attention takes the step's own rows beside the pages, and their download, issued at the
 * end of the layers, comes in with the pick's answer (one wait a step). Bound host buffers are
 * page-locked. Small inputs and new KV rows go through a page-locked staging arena without
 * waiting; norm weights are kept on the device while their host bytes stay the same
 * (const_copies.c). Ops given unbound addresses stage them and wait.
 *
 * Weights go to the device once, by `prepare` at load time or on first use: Q4_0, Q5_0, Q8_0, Q4_K,
 * Q5_K, Q6_K, F16 and BF16 as the file stores them (rows padded to 16 bytes), the other types
 * dequantized by the reference dequantizers on the CPU backend's threads and rounded to f16
 * (kernels/weight_f16.c).
 *
 * The KV cache stays in host memory, where the policies read and rewrite it; each page has a
 * device copy (one block of kernels/block_pool.c) brought up to date before attention reads it:
 * only the rows appended since the last upload move, unless the page's content generation changed
 * (a reused or truncated page), which uploads it whole. kernels/page_copies.c keeps that table and
 * kernels/page_tables.c the attention's page descriptors (both host-tested); the rows and
 * descriptors of a call go up as one batch (kernels/upload_batch.c, send_batch here).
 *
 * A failed op (out of memory, a device error) is recorded, the ops after it do nothing, and the
 * forward pass asks (be_failed) and abandons the chunk.
 *
 * With KVCHAT_CUDA_GRAPH=on a decode step's launches and copies between two waits are recorded
 * (stream capture) and run as graphs, the graph of a step's shape kept and updated in place
 * (kernels/step_graphs.c; seg_op, seg_end below): the same work in the same order, issued in one
 * launch instead of a few hundred. */
#include <stdarg.h>

#include "kernels/addr_hash.h"
#include "kernels/cuda/backend_cuda.cuh"

static int vfail(cuda_impl *ci, const char *fmt, va_list ap)
{
    if (!ci->failed) {
        vsnprintf(ci->fail_msg, sizeof ci->fail_msg, fmt, ap);
        ci->failed = 1;
        ci->fail_short = 0;
    }
    return -1;
}

int fail(cuda_impl *ci, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(ci, fmt, ap);
    va_end(ap);
    return -1;
}

int fail_alloc(cuda_impl *ci, cudaError_t e, const char *what, const char *fmt, ...)
{   /* e may be cudaSuccess where what failed was not a device call (a pool's limit): the shortage */
    ci->alloc_error = e;
    if (e != cudaSuccess) (void)cudaGetLastError();
    if (device_error(e)) return fail(ci, "CUDA %s failed: %s", what, cudaGetErrorString(e));
    const int first = !ci->failed;
    va_list ap;
    va_start(ap, fmt);
    vfail(ci, fmt, ap);
    va_end(ap);
    if (first) ci->fail_short = 1;
    return -1;
}

const char *bytes_text(char *buf, double bytes)
{
    /* each unit up to where its figure would round to 1024.0 */
    if (bytes < 1024) snprintf(buf, 32, "%.0f bytes", bytes);
    else if (bytes < 1023.95 * 1024) snprintf(buf, 32, "%.1f KiB", bytes / 1024);
    else if (bytes < 1023.95 * 1024 * 1024) snprintf(buf, 32, "%.1f MiB", bytes / (1024.0 * 1024));
    else snprintf(buf, 32, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    return buf;
}

int ck(cuda_impl *ci, cudaError_t e, const char *what)
{
    ci->runtime_calls++;
    sg_note(&ci->graphs, what);
    return e == cudaSuccess ? 0 : fail(ci, "CUDA %s failed: %s", what, cudaGetErrorString(e));
}

int ckb(cuda_impl *ci, cublasStatus_t s, const char *what)
{
    ci->runtime_calls++;
    sg_note(&ci->graphs, what);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : fail(ci, "cuBLAS %s failed (status %d)", what, (int)s);
}

static double free_mib(void)
{
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    return (double)fr / (1 << 20);
}

/* Grow a device buffer to hold need bytes (contents are not kept). 0, or -1 (recorded). */
int grow_dev(cuda_impl *ci, void **p, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t sz = need + need / 4 + 4096;
    if (seg_end(ci)) return -1;   /* recorded work may read the old buffer, and nothing allocates while recording */
    if (*p) {
        cudaFree(*p);
        ci->scratch_bytes -= *cap;
    }
    *p = NULL;
    *cap = 0;
    cudaError_t e = cudaMalloc(p, sz);
    if (e != cudaSuccess) {
        *p = NULL;
        char need[32];
        return fail_alloc(ci, e, "scratch allocation", "out of GPU memory: %s of scratch needed, %.1f MiB free",
                          bytes_text(need, (double)sz), free_mib());
    }
    *cap = sz;
    ci->scratch_bytes += sz;
    return 0;
}

/* Grow a page-locked host staging buffer (contents are not kept): copies from pageable memory go
 * through a driver bounce buffer and cost tens of microseconds each. 0, or -1 (recorded). */
int grow_host(cuda_impl *ci, void **p, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t sz = need + need / 4 + 4096;
    if (seg_end(ci)) return -1;   /* recorded copies may land in the old buffer, and nothing allocates while recording */
    if (*p) cudaFreeHost(*p);
    *p = NULL;
    *cap = 0;
    cudaError_t e = cudaHostAlloc(p, sz, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        *p = NULL;
        char need[32];
        return fail_alloc(ci, e, "page-locked allocation", "out of page-locked host memory: %s needed",
                          bytes_text(need, (double)sz));
    }
    *cap = sz;
    return 0;
}

/* Wait for everything issued on the stream; the staging arena is free again after. */
int sync_stream(cuda_impl *ci, const char *what)
{
    if (seg_end(ci)) return -1;   /* what is recorded runs before the wait */
    ci->arena_off = 0;
    ci->waits++;
    if (ck(ci, cudaStreamSynchronize(ci->stream), what)) return -1;
    am_waited(&ci->act);   /* what the host prefetched is in */
    return 0;
}

size_t stage_size(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

/* Room for `total` bytes of staging (the sum of stage_size of each piece) in the arena, so that the
 * pieces one op stages all stay valid until its kernels run: when the arena is short, wait for the
 * stream (freeing it) and grow it if needed. */
int stage_reserve(cuda_impl *ci, size_t total)
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
    char need[32];
    cudaError_t e = cudaHostAlloc((void **)&ci->h_arena, cap, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        ci->h_arena = NULL;
        return fail_alloc(ci, e, "page-locked allocation", "out of page-locked host memory: %s of staging needed",
                          bytes_text(need, (double)cap));
    }
    if ((e = cudaMalloc((void **)&ci->d_arena, cap)) != cudaSuccess) {
        cudaFreeHost(ci->h_arena);
        ci->h_arena = NULL;
        ci->d_arena = NULL;
        return fail_alloc(ci, e, "staging allocation", "out of GPU memory: %s of staging needed, %.1f MiB free",
                          bytes_text(need, (double)cap), free_mib());
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
void *stage(cuda_impl *ci, const void *src, size_t bytes)
{
    void *d = NULL;
    return arena_send(ci, NULL, src, bytes, &d) ? NULL : d;
}

/* Copy host bytes to a device address without waiting, through the arena (the host bytes may
 * change as soon as this returns). 0, or -1 (recorded). */
int send_to(cuda_impl *ci, void *dst, const void *src, size_t bytes)
{
    void *d = NULL;
    return ci->failed ? -1 : arena_send(ci, dst, src, bytes, &d);
}

/* ---------------------------------------------------------------- recorded segments (KVCHAT_CUDA_GRAPH=on) */

static int g_begin(void *ud)
{
    cuda_impl *ci = (cuda_impl *)ud;
    ci->runtime_calls++;
    /* relaxed: the calls an op makes beside its stream work while recording stay allowed (raising a
     * kernel's shared memory limit at its first launch, the free memory a message names, a
     * pointer's attributes); nothing frees or allocates while recording (seg_end first) */
    if (cudaStreamBeginCapture(ci->stream, cudaStreamCaptureModeRelaxed) == cudaSuccess) return 0;
    ci->graph_error = cudaGetLastError();
    return -1;
}

static int g_end(void *ud, void **graph)
{
    cuda_impl *ci = (cuda_impl *)ud;
    cudaGraph_t g = NULL;
    ci->runtime_calls++;
    cudaError_t e = cudaStreamEndCapture(ci->stream, &g);
    if (e != cudaSuccess || !g) {
        ci->graph_error = e != cudaSuccess ? e : cudaErrorUnknown;
        (void)cudaGetLastError();
        return -1;
    }
    *graph = g;
    return 0;
}

static int g_update(void *ud, void *exec, void *graph)
{
    cuda_impl *ci = (cuda_impl *)ud;
    cudaGraphExecUpdateResultInfo info;
    ci->runtime_calls++;
    if (cudaGraphExecUpdate((cudaGraphExec_t)exec, (cudaGraph_t)graph, &info) == cudaSuccess) return 0;
    (void)cudaGetLastError();   /* a refused update is no error: the graph is built instead */
    return -1;
}

static void *g_instantiate(void *ud, void *graph)
{
    cuda_impl *ci = (cuda_impl *)ud;
    cudaGraphExec_t x = NULL;
    ci->runtime_calls++;
    cudaError_t e = cudaGraphInstantiate(&x, (cudaGraph_t)graph, 0);
    if (e == cudaSuccess) return x;
    ci->graph_error = e;
    (void)cudaGetLastError();
    return NULL;
}

static int g_launch(void *ud, void *exec)
{
    cuda_impl *ci = (cuda_impl *)ud;
    ci->runtime_calls++;
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)exec, ci->stream);
    if (e == cudaSuccess) return 0;
    ci->graph_error = e;
    return -1;
}

static void g_destroy_graph(void *ud, void *graph)
{
    (void)ud;
    cudaGraphDestroy((cudaGraph_t)graph);
}

static void g_destroy_exec(void *ud, void *exec)
{
    (void)ud;
    cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

int seg_end(cuda_impl *ci)
{
    if (!ci->graphs.recording) return 0;
    if (sg_flush(&ci->graphs) == 0) return 0;
    /* the recorded work did not run and never will: what the page copies, lists and twins count as
     * sent is not on the device, so nothing the device holds can be trusted any more (the message
     * says so even where an earlier failure was recorded, which it names) */
    char first[sizeof ci->fail_msg];
    snprintf(first, sizeof first, "%s", ci->failed ? ci->fail_msg : "");
    snprintf(ci->fail_msg, sizeof ci->fail_msg,
             "the GPU cannot go on: a recorded CUDA graph could not run (%s%s%.120s); restart kvchat without "
             "KVCHAT_CUDA_GRAPH=on",
             cudaGetErrorString(ci->graph_error), first[0] ? "; first noticed as: " : "", first);
    ci->failed = 1;
    ci->dead = 1;
    return -1;
}

void seg_op(cuda_impl *ci, int how)
{
    sg_table *t = &ci->graphs;
    if (!t->on) return;
    if (how == SEG_EAGER || ci->failed) {
        seg_end(ci);
        return;
    }
    if (t->recording && sg_split(t)) {   /* the device starts on this part while the host records on */
        if (seg_end(ci) == 0) sg_begin(t);
        return;
    }
    if (!t->recording && how == SEG_START) sg_begin(t);   /* refused: graphs off, issued as before */
}

/* A copy between the device and a bound buffer this backend did not page-lock cannot be recorded
 * (it would read or write the host bytes when the graph runs, not now; a buffer locked by another
 * backend, or only in its first page, counts as not locked): what is recorded runs first. */
static void unrecordable_host(cuda_impl *ci, const void *host, size_t bytes)
{
    if (ci->graphs.recording && !am_pinned(&ci->act, host, bytes)) seg_end(ci);
}

/* ---------------------------------------------------------------- constant inputs */

static void *dev_malloc(void *ud, size_t bytes);
static void dev_free(void *ud, void *p);

static int const_upload(void *ud, void *dst, const void *src, size_t bytes)
{
    return send_to((cuda_impl *)ud, dst, src, bytes);
}

/* The constant table's answer for `bytes`, recorded when it is a shortage of memory (a copy not
 * sent is recorded by the upload). */
static void const_said(cuda_impl *ci, enum cc_status st, size_t bytes)
{
    if (st == CC_NO_HOST_MEMORY) fail(ci, "out of memory");
    if (st == CC_NO_DEVICE_MEMORY) {
        char need[32];
        fail_alloc(ci, ci->alloc_error, "allocation for constants", "out of GPU memory: %s of constants needed, %.1f MiB free",
                   bytes_text(need, (double)bytes), free_mib());
    }
}

/* The device copy of host[0, bytes) (kernels/const_copies.c), brought up to date; NULL
 * (recorded) when out of memory or not sent. */
const void *const_get(cuda_impl *ci, const void *host, size_t bytes)
{
    enum cc_status st;
    const void *d = cc_get(&ci->consts, host, bytes, &st);
    const_said(ci, st, bytes);
    return d;
}

/* As const_get, but changed bytes are the caller's to write on the device (*write 1; cc_claim). */
const void *const_claim(cuda_impl *ci, const void *host, size_t bytes, int *write)
{
    enum cc_status st;
    const void *d = cc_claim(&ci->consts, host, bytes, write, &st);
    const_said(ci, st, bytes);
    return d;
}

/* ---------------------------------------------------------------- activation twins */

/* Device memory for the twins and the page copies' chunks: NULL when out of memory (the failure is
 * reported by the caller, not by the next launch). */
static void *dev_malloc(void *ud, size_t bytes)
{
    if (seg_end((cuda_impl *)ud)) return NULL;   /* nothing allocates while recording (rare: a table or pool grows) */
    void *p = NULL;
    cuda_impl *ci = (cuda_impl *)ud;
    if ((ci->alloc_error = cudaMalloc(&p, bytes)) == cudaSuccess) return p;
    (void)cudaGetLastError();
    return NULL;
}

static void dev_free(void *ud, void *p)
{
    seg_end((cuda_impl *)ud);   /* recorded work may read it: it runs first */
    cudaFree(p);
}

static void act_upload(void *ud, void *dst, const void *src, size_t bytes)
{
    cuda_impl *ci = (cuda_impl *)ud;
    unrecordable_host(ci, src, bytes);
    ci->bytes_up += bytes;
    ck(ci, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ci->stream), "activation upload");
}

static void act_download(void *ud, void *dst, const void *src, size_t bytes)
{
    cuda_impl *ci = (cuda_impl *)ud;
    unrecordable_host(ci, dst, bytes);
    ci->bytes_down += bytes;
    ck(ci, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ci->stream), "activation download");
}

static void act_wait(void *ud) { sync_stream((cuda_impl *)ud, "activation copy"); }

/* Page-lock a bound buffer so its copies are direct; a buffer that cannot be (it shares a page with
 * one already locked, or another backend locked it) still works, through the driver's bounce
 * buffer. 0, or -1 when not done. */
static int act_pin(void *ud, void *host, size_t bytes, int pin)
{
    (void)ud;
    if ((pin ? cudaHostRegister(host, bytes, cudaHostRegisterDefault) : cudaHostUnregister(host)) == cudaSuccess)
        return 0;
    (void)cudaGetLastError();
    return -1;
}

static int bind_as(be_backend *b, void *host, size_t bytes, char *err, size_t errlen, int blank, int pin)
{
    cuda_impl *ci = impl_of(b);
    seg_op(ci, SEG_EAGER);   /* page-locking is not recorded */
    if (bytes == 0 || am_bound(&ci->act, host, bytes)) {
        snprintf(err, errlen, "internal error: an activation buffer bound twice or empty");
        return -1;
    }
    ci->alloc_error = cudaSuccess;
    if ((blank ? am_bind_blank(&ci->act, host, bytes, pin) : am_bind(&ci->act, host, bytes)) == 0) return 0;
    if (device_error(ci->alloc_error)) {   /* the device's own error, not a shortage */
        snprintf(err, errlen, "an activation buffer could not be placed on the GPU: %s",
                 cudaGetErrorString(ci->alloc_error));
        return -1;
    }
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    char need[32];
    snprintf(err, errlen, "out of GPU memory: an activation buffer needs %s, %.1f MiB of %.1f MiB are free",
             bytes_text(need, (double)bytes), (double)fr / (1 << 20), (double)tot / (1 << 20));
    return -1;
}

static int cuda_bind(be_backend *b, void *host, size_t bytes, char *err, size_t errlen)
{
    return bind_as(b, host, bytes, err, errlen, 0, 1);
}

/* Rows only ops write (the forward pass's activations, CHESS's): no upload at first use; the host
 * copy page-locked with pin. */
static int cuda_bind_blank(be_backend *b, void *host, size_t bytes, int pin, char *err, size_t errlen)
{
    return bind_as(b, host, bytes, err, errlen, 1, pin);
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

/* A host read's or prefetch's copies join a recording under way (a wait then runs it). */
static void cuda_host_read(be_backend *b, const be_range *r, int n)
{
    seg_op(impl_of(b), SEG_JOIN);
    act_ranges(b, r, n, am_host_read);
}

static void cuda_host_prefetch(be_backend *b, const be_range *r, int n)
{
    seg_op(impl_of(b), SEG_JOIN);
    act_ranges(b, r, n, am_host_prefetch);
}

static void cuda_host_write(be_backend *b, void *p, size_t bytes)
{
    seg_op(impl_of(b), SEG_JOIN);
    am_host_write(&impl_of(b)->act, p, bytes);
}

/* Before a CPU op reads or writes an activation: bring the host copy up to date. */
void host_in(cuda_impl *ci, const void *p, size_t bytes)
{
    am_range r = { p, bytes };
    am_host_read(&ci->act, &r, 1);
}

int bound(cuda_impl *ci, const void *p, size_t bytes) { return am_bound(&ci->act, p, bytes); }

/* ---------------------------------------------------------------- weights */

/* A product looks its weight up at every call: a hash of the address, not a walk over every weight
 * (a third of a default-model decode step's host work, measured over the stand-in runtime). */
dev_weight *find_weight(cuda_impl *ci, const void *host)
{
    if (!ci->cap_w_slots) return NULL;
    uint64_t m = (uint64_t)ci->cap_w_slots - 1;
    for (uint64_t h = addr_hash(host) & m; ci->w_slots[h]; h = (h + 1) & m)
        if (ci->w[ci->w_slots[h] - 1]->host == host) return ci->w[ci->w_slots[h] - 1];
    return NULL;
}

/* Room for one more weight: its pointer and its slot. 0, or -1 out of memory. */
static int weight_room(cuda_impl *ci)
{
    if (ci->n_w == ci->cap_w) {
        int nc = ci->cap_w ? ci->cap_w * 2 : 64;
        dev_weight **nw = (dev_weight **)realloc(ci->w, sizeof *nw * (size_t)nc);
        if (!nw) return -1;
        ci->w = nw;
        ci->cap_w = nc;
    }
    if (2 * (ci->n_w + 1) > ci->cap_w_slots) {
        int nc = ci->cap_w_slots ? ci->cap_w_slots * 2 : 128;
        int *ns = (int *)calloc((size_t)nc, sizeof *ns);
        if (!ns) return -1;
        for (int i = 0; i < ci->n_w; i++) {
            uint64_t h = addr_hash(ci->w[i]->host) & (uint64_t)(nc - 1);
            while (ns[h]) h = (h + 1) & (uint64_t)(nc - 1);
            ns[h] = i + 1;
        }
        free(ci->w_slots);
        ci->w_slots = ns;
        ci->cap_w_slots = nc;
    }
    return 0;
}

/* Copy w to the device a block of rows at a time through one half of a page-locked buffer while
 * the other half is on its way: the file's bytes for the types the kernels decode, else rows
 * dequantized and rounded to f16 on the CPU backend's threads. Each row lands `stride` bytes after
 * the previous one (padded to 16, for the kernels' aligned loads). 0, or -1 with a message. */
int upload_weight(cuda_impl *ci, const be_weight *w, dev_weight **out, char *err, size_t errlen)
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
    if (seg_end(ci)) {   /* the upload waits on events and the stream: nothing may be recording */
        snprintf(err, errlen, "%s", ci->fail_msg);
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
        if (device_error(e)) {   /* the device's own error, not a shortage */
            snprintf(err, errlen, "a %lld x %lld %s weight could not be placed on the GPU: %s", (long long)w->n_out,
                     (long long)w->n_in, quant_type_name(w->type), cudaGetErrorString(e));
            return -1;
        }
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        char need[32], held[32];
        snprintf(err, errlen,
                 "out of GPU memory: a %lld x %lld %s weight needs %s, %.1f MiB of %.1f MiB are free "
                 "(%s of weights already there)",
                 (long long)w->n_out, (long long)w->n_in, quant_type_name(w->type), bytes_text(need, (double)bytes),
                 (double)fr / (1 << 20), (double)tot / (1 << 20), bytes_text(held, (double)ci->weight_bytes));
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
        if ((e = cudaHostAlloc((void **)&ci->h_wstage, 2 * blk_bytes, cudaHostAllocDefault)) != cudaSuccess) {
            (void)cudaGetLastError();
            ci->h_wstage = NULL;
            cudaFree(d);
            char need[32];
            if (device_error(e))
                snprintf(err, errlen, "page-locked memory for copying weights could not be had: %s",
                         cudaGetErrorString(e));
            else
                snprintf(err, errlen, "out of page-locked host memory copying weights (%s)",
                         bytes_text(need, 2.0 * (double)blk_bytes));
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
    dev_weight *dw = weight_room(ci) ? NULL : (dev_weight *)calloc(1, sizeof *dw);
    if (!dw) {
        cudaFree(d);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    uint64_t h = addr_hash(w->data) & (uint64_t)(ci->cap_w_slots - 1);
    while (ci->w_slots[h]) h = (h + 1) & (uint64_t)(ci->cap_w_slots - 1);
    ci->w[ci->n_w++] = dw;
    ci->w_slots[h] = ci->n_w;
    dw->host = w->data;
    dw->d = d;
    dw->type = dtype;
    dw->stride = stride;
    dw->n_in = w->n_in;
    dw->n_out = w->n_out;
    if (w->n_in > ci->widest_in) ci->widest_in = w->n_in;
    ci->any_integer |= dd_integer_type(dtype);
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

/* A model's norm weights (be_ops.constants): copied now and, being the model's, never compared
 * with their host bytes again (16 KiB a norm, twice a layer, at the 7B shape). */
static void cuda_constants(be_backend *b, const be_range *r, int n)
{
    cuda_impl *ci = impl_of(b);
    for (int i = 0; i < n && !ci->failed; i++) {
        if (!r[i].p || !r[i].bytes) continue;
        enum cc_status st;
        cc_fix(&ci->consts, r[i].p, r[i].bytes, &st);
        const_said(ci, st, r[i].bytes);
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
 * the driver's time apiece, about a thousand a decode step of a 7B-shaped model. The rows are read
 * from the host's pages when the batch is packed (ub_add_ref): every op that brings copies up to
 * date sends or drops the batch before it returns, while the engine leaves the pages alone, so a
 * restored layer's rows cross the host's memory once. */
static int dev_upload(void *ud, void *dst, const void *src, size_t bytes)
{
    cuda_impl *ci = (cuda_impl *)ud;
    return ub_add_ref(&ci->batch, dst, src, bytes) ? fail(ci, "out of memory") : 0;
}

/* Block i < n_pieces puts piece i of a batch in place (kernels/upload_batch.h); the blocks after
 * them round a and b (n values each) to f16 into y[0, n) and y[n, 2n) (a deferred decode step's
 * keys and values for attention, in the same launch). */
static __device__ __forceinline__ void scatter_block(const unsigned char *base, const ub_piece *pieces, int64_t n_pieces,
                                                     const float *a, const float *b, __half *y, int64_t n)
{
    if ((int64_t)blockIdx.x < n_pieces) {
        ub_scatter_piece(base, &pieces[blockIdx.x], (int)threadIdx.x, (int)blockDim.x);
        return;
    }
    const int64_t i = ((int64_t)blockIdx.x - n_pieces) * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half_rn(qb_f16_range(a[i]));
    else if (i < 2 * n) y[i] = __float2half_rn(qb_f16_range(b[i - n]));
}

/* A batch copied to the device: its packed form at base, the table at pieces. */
__global__ void scatter_kernel(const unsigned char *base, const ub_piece *pieces, int64_t n_pieces, const float *a,
                               const float *b, __half *y, int64_t n)
{
    scatter_block(base, pieces, n_pieces, a, b, y, n);
}

/* A batch in the launch's parameters (ub_inline_size): its packed form is the parameter p, read
 * where the launch left it (__grid_constant__: by address, no copy of it a thread). */
template <int CAP> struct __align__(16) ub_inline {
    unsigned char b[CAP];
};

/* CUDA's limit on a kernel's parameters (since 12.1), the block's and the kernel's others together */
static_assert(sizeof(ub_inline<UB_INLINE_LARGE>) + 64 <= 32764, "the largest batch block fits a launch's parameters");

template <int CAP>
__global__ void scatter_inline_kernel(const __grid_constant__ ub_inline<CAP> p, uint32_t table_off, int64_t n_pieces,
                                      const float *a, const float *b, __half *y, int64_t n)
{
    scatter_block(p.b, (const ub_piece *)(p.b + table_off), n_pieces, a, b, y, n);
}

/* The batch packed into a launch's parameters of CAP bytes (the host's stack holds them until the
 * launch has taken them) and scattered by `blocks` blocks. */
template <int CAP>
static void launch_inline(cuda_impl *ci, const ub_batch *ub, unsigned blocks, const float *a, const float *b, __half *y,
                          int64_t n)
{
    ub_inline<CAP> p;
    memset(&p, 0, sizeof p);   /* the gaps between pieces and past them: no stale host bytes go with it */
    ub_pack(ub, p.b);
    scatter_inline_kernel<CAP><<<blocks, 128, 0, ci->stream>>>(p, (uint32_t)ub_table_offset(ub), ub->n, a, b, y, n);
}

/* The parameter size send_batch_halves sends a batch of `packed` bytes in (ub_inline_size), 0: it is
 * copied (KVCHAT_CUDA_INLINE=off). */
static size_t inline_size_of(const cuda_impl *ci, size_t packed)
{
    return ci->inline_off ? 0 : ub_inline_size(packed);
}

/* A lost batch: what the page copies and descriptor lists count as sent never arrived, so both
 * forget it and send everything again at their next use. */
void lose_batch(cuda_impl *ci)
{
    ub_clear(&ci->batch, 0);
    pc_forget_rows(&ci->copies);
    pt_forget(&ci->tables);
    sl_forget(&ci->sums);
}

int send_batch(cuda_impl *ci) { return send_batch_halves(ci, NULL, NULL, NULL, 0); }

/* Send the queued pieces: packed into the launch's parameters where they fit (ub_inline_size), else
 * into the staging arena and one copy; one scatter kernel, which also rounds a and b to f16 into y
 * when n > 0 (the kernel runs for that alone when nothing is queued).
 * 0, or -1 (recorded, and the batch lost). */
int send_batch_halves(cuda_impl *ci, const float *a, const float *b, __half *y, int64_t n)
{
    ub_batch *ub = &ci->batch;
    if (ci->failed) {
        lose_batch(ci);
        return -1;
    }
    const unsigned halves = (unsigned)((2 * n + 127) / 128);
    if (ub->n == 0) {
        if (n <= 0) return 0;
        scatter_kernel<<<halves, 128, 0, ci->stream>>>(NULL, NULL, 0, a, b, y, n);
        return ck(ci, cudaGetLastError(), "f16 rows kernel");
    }
    size_t bytes = ub_packed_bytes(ub);
    const unsigned blocks = (unsigned)ub->n + (n > 0 ? halves : 0u);
    const int64_t nh = n > 0 ? n : 0;
    const size_t in_params = inline_size_of(ci, bytes);
    if (in_params) {   /* no copy: the launch carries it */
        if (in_params == UB_INLINE_SMALL) launch_inline<UB_INLINE_SMALL>(ci, ub, blocks, a, b, y, nh);
        else if (in_params == UB_INLINE_MEDIUM) launch_inline<UB_INLINE_MEDIUM>(ci, ub, blocks, a, b, y, nh);
        else launch_inline<UB_INLINE_LARGE>(ci, ub, blocks, a, b, y, nh);
        if (ck(ci, cudaGetLastError(), "scatter kernel")) {
            lose_batch(ci);
            return -1;
        }
        ci->bytes_up += bytes;
        ci->inline_sends++;
        ub_clear(ub, 1);
        return 0;
    }
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
    scatter_kernel<<<blocks, 128, 0, ci->stream>>>(d, (const ub_piece *)(d + ub_table_offset(ub)), ub->n, a, b, y, nh);
    if (ck(ci, cudaGetLastError(), "scatter kernel")) {
        lose_batch(ci);
        return -1;
    }
    ub_clear(ub, 1);
    return 0;
}

/* The batch's flush (upload_batch.h): a call that moves a whole layer sends it in rounds. */
static int flush_batch(void *ud) { return send_batch((cuda_impl *)ud); }

/* A page list pt_build could not build (rc): the failure recorded with what was short, and the
 * batch (which may hold part of it) dropped. */
void tables_failed(cuda_impl *ci, int rc)
{
    if (ci->failed) {   /* a page copy's rows could not be queued: said already */
    } else if (rc == PT_NO_HOST_MEMORY || (rc == PT_NO_COPY && !ci->blocks.failed_bytes)) {
        fail(ci, "out of memory for the KV page tables");
    } else if (rc == PT_BAD_LIST) {
        fail(ci, "internal error: a page list whose head offsets do not span it");
    } else if (rc == PT_NO_DEVICE_MEMORY) {
        fail_alloc(ci, ci->alloc_error, "allocation for the KV page tables",
                   "out of GPU memory for the KV page tables (%.1f MiB free)", free_mib());
    } else {
        char need[32];
        fail_alloc(ci, ci->alloc_error, "allocation for the KV cache",
                   "out of GPU memory for the KV cache: %s more needed, %.1f MiB free, %.1f MiB of page "
                   "copies held (a shorter --ctx or a policy that evicts holds less)",
                   bytes_text(need, (double)ci->blocks.failed_bytes), free_mib(), (double)ci->blocks.bytes / (1 << 20));
    }
    lose_batch(ci);
}

/* A layer's page list read whole, under its name: a policy op's (the attention mass, the SimHash
 * recall; no shape), or one placed ahead of attention (be_ops.place_pages, with the layer's shape).
 * The upload batch before it sent, the list's descriptors built (its pages' copies brought up to
 * date) and sent. 0; 1 when memory for it was short (nothing recorded, the batch dropped: the
 * pages go up whole at their next use); -1 with the failure recorded. */
int policy_list(cuda_impl *ci, uint64_t table, uint64_t shape, const be_kv_page *pages, int64_t np,
                const int64_t *hp, int H, pt_call *pl)
{
    if (ci->batch.n && send_batch(ci)) return -1;
    int rc = pt_build(&ci->tables, table, shape, pages, np, hp, H, NULL, pl);
    if (rc != PT_OK) {
        /* an upload that could not be queued, a bad list, or the device's error met allocating */
        const int lost = (rc == PT_NO_DEVICE_MEMORY || rc == PT_NO_COPY) && device_error(ci->alloc_error);
        if (ci->failed || rc == PT_BAD_LIST || lost) {
            tables_failed(ci, rc);
            return -1;
        }
        lose_batch(ci);
        return 1;
    }
    return send_batch(ci) ? -1 : 0;
}

/* A policy's op found device or page-locked memory short for its scratch (not a device error): what
 * fail() recorded for it is taken back, since the CPU computes the answer instead and the run goes
 * on. Only for a call that began with no failure recorded. Returns 1. */
int scratch_short(cuda_impl *ci)
{
    if (!ci->fail_short) return -1;   /* the device's error (or a recording's): kept, and reported */
    ci->failed = 0;
    ci->fail_short = 0;
    ci->fail_msg[0] = 0;
    return 1;
}

static int cuda_failed(be_backend *b, char *err, size_t errlen)
{
    cuda_impl *ci = impl_of(b);
    if (!ci->failed) return 0;
    seg_end(ci);   /* what was recorded before the failure runs, as it would have without recording */
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
    /* what a failed op left queued never goes: its page rows are read from the host's pages when a
     * batch is packed (ub_add_ref), and the engine may change those pages before the next op */
    if (ci->batch.n) lose_batch(ci);
    ci->bd_done_zeroed = 0;   /* a fused bounds launch cut short may have left tickets taken */
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
    const uint64_t waits = ci->waits;
    sync_stream(ci, "finish");   /* a failure is recorded for the caller's next be_ops.failed */
    ci->waits = waits;
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
        sg_free(&ci->graphs);   /* a recording still open is dropped: nothing will read its results */
        for (int i = 0; i < ci->n_w; i++) {
            cudaFree(ci->w[i]->d);
            free(ci->w[i]);
        }
        free(ci->w);
        free(ci->w_slots);
        pt_free(&ci->tables);
        sl_free(&ci->sums);
        pc_free(&ci->copies);
        bp_free(&ci->blocks);
        ub_free(&ci->batch);
        cc_free(&ci->consts);
        free(ci->rows_list);
        free(ci->masks_all);
        am_free(&ci->act);
        void *dev[] = { ci->y32,   ci->out,   ci->x16, ci->part_o, ci->part_ml, ci->d_arena,
                        ci->cur16, ci->wtile, ci->xal, ci->xq,     ci->xd,      ci->xs,  ci->cur_pos,
                        ci->pick_keys, ci->pick_max, ci->pick_sums, ci->pick_res, ci->bd_u, ci->bd_keys,
                        ci->sel_pages, ci->sel_hp, ci->km_sq, ci->ms_e, ci->ms_factor, ci->ms_acc, ci->lsh_hits,
                        ci->mg_buf, ci->seg_at, ci->seg_bits, ci->sel_masks, ci->bd_done };
        for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
        free(ci->ms_host);
        void *host[] = { ci->h_y, ci->h_out, ci->h_arena, ci->h_wstage, ci->h_pick, ci->h_bd, ci->h_ms, ci->h_lsh, ci->h_mg };
        for (size_t i = 0; i < sizeof host / sizeof *host; i++)
            if (host[i]) cudaFreeHost(host[i]);
        if (ci->blas) cublasDestroy(ci->blas);
        if (ci->stream) cudaStreamDestroy(ci->stream);
        be_free(ci->cpu);
        free(ci);
    }
    free(b);
}

/* The CPU backend's threads, idle while the engine works between ops. */
static struct tp_pool *cuda_host_pool(be_backend *b) { return be_cpu_pool(impl_of(b)->cpu); }

static const be_ops cuda_ops = {
    "cuda", cuda_matmul, cuda_rmsnorm, cuda_qk_rope, cuda_glu, cuda_get_rows, cuda_attention, cuda_scores,
    cuda_bound_pages, cuda_prepare, cuda_memory, cuda_destroy, cuda_add_norm, cuda_bind, cuda_unbind,
    cuda_host_read, cuda_host_write, cuda_failed, cuda_counters, cuda_pick, cuda_host_prefetch, cuda_finish,
    cuda_key_means, cuda_bind_blank, cuda_attn_mass, cuda_attention_seqs, cuda_host_pool, cuda_page_rows,
    cuda_page_moves, cuda_lsh_hits, NULL, cuda_merge_heads, cuda_place_pages,
    cuda_place_bounds, cuda_constants,
};

/* KVCHAT_CUDA_RESIDENT=0: no residency at all (every op stages its host arrays and waits, and the
 * forward pass waits once a layer), to compare with. */
static const be_ops cuda_ops_staged = {
    "cuda", cuda_matmul, cuda_rmsnorm, cuda_qk_rope, cuda_glu, cuda_get_rows, cuda_attention, cuda_scores,
    cuda_bound_pages, cuda_prepare, cuda_memory, cuda_destroy, cuda_add_norm, NULL, NULL, NULL, NULL,
    cuda_failed, cuda_counters, cuda_pick, NULL, cuda_finish, cuda_key_means, NULL, cuda_attn_mass,
    cuda_attention_seqs, cuda_host_pool, NULL, NULL, cuda_lsh_hits, NULL, cuda_merge_heads, NULL, NULL,
    cuda_constants,
};

extern "C" uint64_t be_cuda_flash_calls(be_backend *b)
{
    return b && b->ops && b->ops->attention == cuda_attention ? impl_of(b)->flash_calls : 0;
}

extern "C" uint64_t be_cuda_runtime_calls(be_backend *b)
{
    return b && b->ops && b->ops->attention == cuda_attention ? impl_of(b)->runtime_calls : 0;
}

extern "C" uint64_t be_cuda_inline_sends(be_backend *b)
{
    return b && b->ops && b->ops->attention == cuda_attention ? impl_of(b)->inline_sends : 0;
}

extern "C" int64_t be_cuda_test_batch(be_backend *b, void *dst, size_t bytes, const void *src, const be_test_piece *p,
                                      int n)
{
    if (!b || !b->ops || b->ops->attention != cuda_attention) return -1;
    cuda_impl *ci = impl_of(b);
    if (ci->failed || !bound(ci, dst, bytes)) return -1;
    unsigned char *d = (unsigned char *)am_dev_out(&ci->act, dst, bytes);
    if (ci->batch.n && send_batch(ci)) return -1;
    for (int i = 0; i < n; i++) {
        const int rc = p[i].dev ? ub_add_dev(&ci->batch, d + p[i].at, d + p[i].from, p[i].len)
                                : ub_add(&ci->batch, d + p[i].at, (const unsigned char *)src + p[i].from, p[i].len);
        if (rc) {
            lose_batch(ci);
            return -1;
        }
    }
    const int64_t size = (int64_t)inline_size_of(ci, ub_packed_bytes(&ci->batch));
    return send_batch(ci) ? -1 : size;
}

/* The KVCHAT_CUDA_* variables set when the backend was made that change what runs, as
 * "NAME=value, ..." (be_cuda_settings): the user's bytes, shown on terminals and written into CSV,
 * keep letters, digits, '.', '-' and '_' (anything else becomes '?'). */
static void note_settings(cuda_impl *ci)
{
    const char *names[] = { "KVCHAT_CUDA_GRAPH",   "KVCHAT_CUDA_GRAPH_SPLIT", "KVCHAT_CUDA_LAUNCHES",
                            "KVCHAT_CUDA_ATTN",    "KVCHAT_CUDA_ATTN_SPLITS", "KVCHAT_CUDA_MMV",
                            "KVCHAT_CUDA_MMV_MAX", "KVCHAT_CUDA_MMV_ROWS",    "KVCHAT_CUDA_MMV_INFLIGHT",
                            "KVCHAT_CUDA_RESIDENT", "KVCHAT_CUDA_PAGE_ROWS",   "KVCHAT_CUDA_BOUNDS",
                            "KVCHAT_CUDA_INLINE", "KVCHAT_CUDA_ATTN_ROWS" };
    char *buf = ci->settings;
    const size_t cap = sizeof ci->settings;
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v) continue;
        if (i == 0 && strcmp(v, "on")) continue;   /* off: the default */
        if (i == 1 && !ci->graphs.on) continue;    /* a split with recording off changes nothing */
        if (i == 10 && !ci->page_rows_off) continue;   /* 1: the default */
        if (i == 11 && !ci->bounds_split) continue;    /* fused: the default */
        if (i == 12 && !ci->inline_off) continue;      /* on: the default */
        char val[25];
        size_t k = 0;
        for (; k + 1 < sizeof val && v[k]; k++) {
            const char c = v[k];
            val[k] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
                             c == '_'
                         ? c
                         : '?';
        }
        val[k] = 0;
        int w = snprintf(buf + n, cap - n, "%s%s=%s", n ? ", " : "", names[i], val);
        if (w < 0 || (size_t)w >= cap - n) {
            buf[n] = 0;
            return;
        }
        n += (size_t)w;
    }
}

extern "C" void be_cuda_settings(be_backend *b, char *buf, size_t cap)
{
    if (!cap) return;
    buf[0] = 0;
    if (b && b->ops && b->ops->attention == cuda_attention) snprintf(buf, cap, "%s", impl_of(b)->settings);
}

extern "C" void be_cuda_graphs(be_backend *b, be_graph_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!b || !b->ops || b->ops->attention != cuda_attention) return;
    const sg_table *t = &impl_of(b)->graphs;
    st->on = t->on;
    st->gave_up = t->gave_up;
    st->segments = t->segments;
    st->calls = t->calls;
    st->updates = t->updates;
    st->builds = t->builds;
    st->refused = t->refused;
    st->failures = t->failures;
}

extern "C" uint64_t be_cuda_input_quantizations(be_backend *b)
{
    return b && b->ops && b->ops->attention == cuda_attention ? impl_of(b)->quantizations : 0;
}

extern "C" void be_cuda_page_rows(be_backend *b, uint64_t *written, uint64_t *moved, uint64_t *uploaded)
{
    const int ours = b && b->ops && b->ops->attention == cuda_attention;
    *written = ours ? impl_of(b)->rows_written : 0;
    *moved = ours ? impl_of(b)->rows_moved : 0;
    *uploaded = ours ? impl_of(b)->copies.rows_uploaded : 0;
}

extern "C" uint64_t be_cuda_cloned_entries(be_backend *b)
{
    return b && b->ops && b->ops->attention == cuda_attention ? impl_of(b)->tables.cloned : 0;
}

extern "C" void be_cuda_summaries(be_backend *b, uint64_t *folded, uint64_t *sent)
{
    const int ours = b && b->ops && b->ops->attention == cuda_attention;
    *folded = ours ? impl_of(b)->sums.folded : 0;
    *sent = ours ? impl_of(b)->sums.sent - impl_of(b)->sums.folded : 0;
}

extern "C" void be_cuda_warmed_up(be_backend *b)
{
    if (!b || !b->ops || b->ops->attention != cuda_attention) return;
    cuda_impl *ci = impl_of(b);
    if (ci->batch.n > 0) return;   /* a failed op's queue not asked about yet: the idle sweep frees them later */
    pt_release_all(&ci->tables);
}

/* The oldest GPUs the build has code for: the Makefile's lowest -gencode, sm_80 (its sm_80 code runs
 * on every 8.x device; the compute_90 PTX only on 9.0 and newer). An older GPU would fail at its
 * first kernel launch, so it is refused up front and --device auto runs on the CPU. */
enum { CUDA_MIN_MAJOR = 8 };

extern "C" int be_cuda_gpu(be_gpu *g, char *why, size_t whylen)
{
    memset(g, 0, sizeof *g);
    int drv = 0, rt = 0, n = 0;
    cudaDriverGetVersion(&drv);
    if (drv == 0) {   /* no driver installed: no GPU here, not a broken one */
        snprintf(why, whylen, "no NVIDIA driver");
        return -1;
    }
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) {
        snprintf(why, whylen, "no CUDA device found");
        return -1;
    }
    if (e != cudaSuccess) {
        cudaRuntimeGetVersion(&rt);
        snprintf(why, whylen, "CUDA cannot start: %s (the driver supports CUDA %d.%d, this kvchat's runtime is %d.%d)",
                 cudaGetErrorString(e), drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
        return -2;
    }
    cudaDeviceProp prop;
    size_t fr = 0, tot = 0;
    if ((e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
        snprintf(why, whylen, "CUDA device 0: %s", cudaGetErrorString(e));
        return -2;
    }
    /* the driver's text, shown on terminals: anything but printable ASCII becomes '?' */
    size_t k = 0;
    for (; k + 1 < sizeof g->name && k < sizeof prop.name && prop.name[k]; k++) {
        unsigned char c = (unsigned char)prop.name[k];
        g->name[k] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    g->name[k] = 0;
    g->count = n;
    g->cc_major = prop.major;
    g->cc_minor = prop.minor;
    if (prop.major < CUDA_MIN_MAJOR) {
        snprintf(why, whylen, "%s has compute capability %d.%d: this kvchat's kernels need %d.0 or newer", g->name,
                 prop.major, prop.minor, (int)CUDA_MIN_MAJOR);
        return -2;
    }
    if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaMemGetInfo(&fr, &tot)) != cudaSuccess) {
        snprintf(why, whylen, "CUDA device 0 (%s): %s", g->name, cudaGetErrorString(e));
        return -2;
    }
    g->total = tot;
    g->free = fr;
    return 0;
}

/* The environment setting `name` in *value (NULL when unset or empty: its default), or -1 with
 * "NAME must be USAGE" in err when it is none of `allowed` (NULL-terminated). */
static int env_choice(const char *name, const char *const *allowed, const char *usage, const char **value, char *err,
                      size_t errlen)
{
    const char *v = getenv(name);
    *value = v && *v ? v : NULL;
    if (!*value) return 0;
    for (const char *const *a = allowed; *a; a++)
        if (!strcmp(v, *a)) return 0;
    snprintf(err, errlen, "%s must be %s", name, usage);
    return -1;
}

extern "C" be_backend *be_cuda_create(int n_threads, char *err, size_t errlen)
{
    be_gpu gpu;
    char why[300];
    if (be_cuda_gpu(&gpu, why, sizeof why)) {
        snprintf(err, errlen, "%s; use --device cpu", why);
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
    ci->mmv_wide = !(mmv_env && !strcmp(mmv_env, "narrow"));
    const char *rows_env = getenv("KVCHAT_CUDA_MMV_ROWS");
    ci->mmv_rows = rows_env && !strcmp(rows_env, "1") ? 1 : rows_env && !strcmp(rows_env, "2") ? 2 : 0;
    /* the settings kept to compare: one of the values named, or refused */
    static const char *const attn_vals[] = { "flash", "grouped", "scalar", NULL };
    static const char *const rows_vals[] = { "1", "0", NULL };
    static const char *const bounds_vals[] = { "fused", "split", NULL };
    static const char *const inline_vals[] = { "on", "off", NULL };
    static const char *const inflight_vals[] = { "1", "2", "4", NULL };
    static const char *const attn_rows_vals[] = { "2", "4", "8", NULL };
    const char *attn_env, *rows_fill_env, *bounds_env, *inline_env, *inflight_env, *attn_rows_env;
    if (env_choice("KVCHAT_CUDA_ATTN", attn_vals, "flash (the default), grouped or scalar", &attn_env, err, errlen) ||
        env_choice("KVCHAT_CUDA_PAGE_ROWS", rows_vals, "1 (the default) or 0", &rows_fill_env, err, errlen) ||
        env_choice("KVCHAT_CUDA_BOUNDS", bounds_vals, "fused (the default) or split", &bounds_env, err, errlen) ||
        env_choice("KVCHAT_CUDA_INLINE", inline_vals, "on (the default) or off", &inline_env, err, errlen) ||
        env_choice("KVCHAT_CUDA_MMV_INFLIGHT", inflight_vals, "1, 2 or 4 (unset: by the weight's type)", &inflight_env,
                   err, errlen) ||
        env_choice("KVCHAT_CUDA_ATTN_ROWS", attn_rows_vals, "2, 4 (the default) or 8", &attn_rows_env, err,
                   errlen)) {
        free(b);
        free(ci);
        return NULL;
    }
    ci->attn_scalar = attn_env && !strcmp(attn_env, "scalar");
    ci->page_rows_off = rows_fill_env && !strcmp(rows_fill_env, "0");
    ci->bounds_split = bounds_env && !strcmp(bounds_env, "split");
    ci->inline_off = inline_env && !strcmp(inline_env, "off");
    ci->mmv_inflight = inflight_env ? atoi(inflight_env) : 0;
    ci->attn_rows = attn_rows_env ? atoi(attn_rows_env) : 0;
    /* prefill chunks on the tensor cores unless asked otherwise (measured on an H200: docs/gpu.md) */
    ci->attn_flash = !ci->attn_scalar && !(attn_env && !strcmp(attn_env, "grouped"));
    const char *splits_env = getenv("KVCHAT_CUDA_ATTN_SPLITS");
    ci->attn_splits = splits_env ? atoi(splits_env) : 0;
    if (ci->attn_splits < 0 || ci->attn_splits > 4096) ci->attn_splits = 0;
    const char *max_env = getenv("KVCHAT_CUDA_MMV_MAX");
    char *end = NULL;
    long long mx = max_env ? strtoll(max_env, &end, 10) : -1;
    ci->mmv_max = max_env && end != max_env && !*end && mx >= 0 ? (int64_t)mx : -1;
    const char *launch_env = getenv("KVCHAT_CUDA_LAUNCHES");
    if (launch_env && *launch_env && strcmp(launch_env, "fewer") && strcmp(launch_env, "apart")) {
        snprintf(err, errlen, "KVCHAT_CUDA_LAUNCHES must be fewer (the default) or apart");
        free(b);
        free(ci);
        return NULL;
    }
    ci->launch_apart = launch_env && !strcmp(launch_env, "apart");
    ci->inline_off |= ci->launch_apart;   /* stage 4's third part's paths copied their uploads too */
    const char *graph_env = getenv("KVCHAT_CUDA_GRAPH");
    const char *split_env = getenv("KVCHAT_CUDA_GRAPH_SPLIT");
    long split = SEG_SPLIT;
    if (split_env && *split_env) {
        char *se = NULL;
        split = strtol(split_env, &se, 10);
        if (*se || split < 0 || split > 1000000) split = -1;
    }
    if ((graph_env && *graph_env && strcmp(graph_env, "on") && strcmp(graph_env, "off")) || split < 0) {
        snprintf(err, errlen, "KVCHAT_CUDA_GRAPH must be on or off (the default), KVCHAT_CUDA_GRAPH_SPLIT a count of calls");
        free(b);
        free(ci);
        return NULL;
    }
    sg_device gdev = { ci, g_begin, g_end, g_update, g_instantiate, g_launch, g_destroy_graph, g_destroy_exec };
    sg_init(&ci->graphs, &gdev, graph_env && !strcmp(graph_env, "on"), (int)split);
    note_settings(ci);
    pc_device dev = { ci, dev_alloc, dev_release, dev_upload };
    pc_init(&ci->copies, &dev, COPY_IDLE);
    pt_device tdev = { ci, dev_malloc, dev_free };
    pt_init(&ci->tables, &tdev, &ci->copies, &ci->batch);
    sl_device sdev = { ci, dev_malloc, dev_free, summary_copy_rows };
    sl_init(&ci->sums, &sdev, &ci->batch);
    ci->batch.limit = (size_t)32 << 20;   /* well within the staging arena's 256 MiB */
    ci->batch.flush = flush_batch;
    ci->batch.flush_ud = ci;
    bp_init(&ci->blocks, ci, dev_malloc, dev_free, (size_t)64 << 20);
    cc_device cdev = { ci, dev_malloc, dev_free, const_upload };
    cc_init(&ci->consts, &cdev);
    am_device adev = { ci, dev_malloc, dev_free, act_upload, act_download, act_wait, act_pin };
    am_init(&ci->act, &adev);
    cudaError_t e;
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
