/* cudart.c - a CUDA runtime that runs nothing, for timing the CUDA backend's host work on a machine
 * without a GPU (make bench-host-cost).
 *
 * Built as libcudart.so.13 with the real one's symbol version and put first on LD_LIBRARY_PATH, it
 * answers build-cuda/kvchat's calls into the runtime at once: a device of the H100's shape with
 * "stand-in" in its name, device memory that is host memory never touched (mapped on demand),
 * kernel launches, copies and memsets that do nothing, streams, events and graphs that are tokens.
 * What the backend computes is therefore meaningless (the pick reads zeros: token 0 every step),
 * but every line of the backend's own host code runs as it would before a GPU: its bookkeeping,
 * page tables, upload batches and the engine around it, which is what a decode step of a small
 * model spends its time on (docs/gpu.md). The real runtime's own cost per call (a few
 * microseconds a launch) is not in the figures. Never linked into kvchat: only the bench loads it.
 *
 * With KVCHAT_STANDIN_REPORT=FILE it counts the calls it answered and, at exit, writes them to FILE
 * (created, never through a link or over a file that is not regular), a line each:
 *   call NAME COUNT       every runtime call by name
 *   launch KERNEL COUNT   kernels launched one at a time, by the kernel's mangled name (c++filt)
 *   recorded KERNEL COUNT kernels launched while a stream was being captured into a graph
 * (bench/host_cost.sh takes two runs' difference to get a decode step's share.) */
#include <cuda_runtime_api.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The H100 80GB's figures, where the backend sizes its work by them. */
#define SI_TOTAL ((size_t)80 << 30)
#define SI_SMS 132
#define SI_SMEM_OPTIN (227 * 1024)

static atomic_size_t si_used;

/* The census: calls by name, and launches by kernel (registered once at load, looked up by the
 * launching function's address in an open-addressed table). Counted only when a report is asked for. */
enum { SI_CALLS = 64, SI_KERNELS = 1024 };
static int si_census = -1;   /* -1: not yet looked up */
static struct {
    _Atomic(const char *) name;
    atomic_llong n;
} si_calls[SI_CALLS];
static struct {
    const void *fun;
    char name[256];
    atomic_llong direct, recorded;
} si_kernels[SI_KERNELS];
static atomic_int si_capturing;

static int census_on(void)
{
    if (si_census < 0) si_census = getenv("KVCHAT_STANDIN_REPORT") != NULL;
    return si_census;
}

static void count_call(const char *name)
{
    if (!census_on()) return;
    for (int i = 0; i < SI_CALLS; i++) {
        const char *at = atomic_load(&si_calls[i].name);
        if (!at) {   /* a name is its function's __func__: the first caller takes a free slot */
            atomic_compare_exchange_strong(&si_calls[i].name, &at, name);
            at = atomic_load(&si_calls[i].name);
        }
        if (at == name) {
            atomic_fetch_add(&si_calls[i].n, 1);
            return;
        }
    }
}
#define COUNT() count_call(__func__)

static size_t kernel_slot(const void *fun)
{
    size_t h = ((uintptr_t)fun >> 4) * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < SI_KERNELS; i++) {
        size_t at = (h + i) % SI_KERNELS;
        if (si_kernels[at].fun == fun || !si_kernels[at].fun) return at;
    }
    return SIZE_MAX;
}

/* Written where the report was asked for: created, or a regular file replaced; never a link. */
__attribute__((destructor)) static void write_report(void)
{
    const char *path = getenv("KVCHAT_STANDIN_REPORT");
    if (!path || !*path) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "stand-in CUDA runtime: cannot write its report to %s: %s\n", path,
                fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0) close(fd);
        return;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        return;
    }
    for (int i = 0; i < SI_CALLS && atomic_load(&si_calls[i].name); i++)
        fprintf(f, "call %s %lld\n", atomic_load(&si_calls[i].name), (long long)atomic_load(&si_calls[i].n));
    for (size_t i = 0; i < SI_KERNELS; i++) {
        if (!si_kernels[i].fun) continue;
        long long d = atomic_load(&si_kernels[i].direct), r = atomic_load(&si_kernels[i].recorded);
        if (d) fprintf(f, "launch %s %lld\n", si_kernels[i].name, d);
        if (r) fprintf(f, "recorded %s %lld\n", si_kernels[i].name, r);
    }
    fclose(f);
}

/* Device memory: an anonymous mapping, zero and never touched by the backend (it cannot touch
 * device memory), so a 4 GiB model costs address space, not RAM. Its first 4 KiB hold its size. */
enum { SI_HEAD = 4096 };

cudaError_t cudaMalloc(void **p, size_t size)
{
    COUNT();
    if (!p) return cudaErrorInvalidValue;
    size_t used = atomic_load(&si_used);
    if (size > SI_TOTAL - used) return cudaErrorMemoryAllocation;
    void *m = mmap(NULL, size + SI_HEAD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
    memcpy(m, &size, sizeof size);
    atomic_fetch_add(&si_used, size);
    *p = (char *)m + SI_HEAD;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    COUNT();
    if (!p) return cudaSuccess;
    char *m = (char *)p - SI_HEAD;
    size_t size;
    memcpy(&size, m, sizeof size);
    atomic_fetch_sub(&si_used, size);
    munmap(m, size + SI_HEAD);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot)
{
    COUNT();
    if (fr) *fr = SI_TOTAL - atomic_load(&si_used);
    if (tot) *tot = SI_TOTAL;
    return cudaSuccess;
}

/* Page-locked host memory: host memory the backend writes and reads, every page touched now, as
 * locking it does (left to the first write, the faults would land in the steps that first use a
 * staging arena's pages, which a real runtime never shows). */
cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
    COUNT();
    (void)flags;
    if (!p) return cudaErrorInvalidValue;
    *p = calloc(1, size ? size : 1);
    if (!*p) return cudaErrorMemoryAllocation;
    for (size_t i = 0; i < size; i += 4096) ((volatile char *)*p)[i] = 0;   /* a store a page: faulted in now */
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    COUNT();
    free(p);
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags)
{
    COUNT();
    (void)p, (void)size, (void)flags;
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *p)
{
    COUNT();
    (void)p;
    return cudaSuccess;
}

/* A copy's call returns before the copy on a real device too; here there is none. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t s)
{
    COUNT();
    (void)dst, (void)src, (void)count, (void)kind, (void)s;
    return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t s)
{
    COUNT();
    (void)dst, (void)dpitch, (void)src, (void)spitch, (void)width, (void)height, (void)kind, (void)s;
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t count, cudaStream_t s)
{
    COUNT();
    (void)p, (void)value, (void)count, (void)s;
    return cudaSuccess;
}

/* The device. */
cudaError_t cudaDriverGetVersion(int *v)
{
    COUNT();
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    COUNT();
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    COUNT();
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    COUNT();
    return d == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int d)
{
    COUNT();
    if (d != 0) return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "stand-in (no GPU: kernels not run)");
    prop->totalGlobalMem = SI_TOTAL;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = SI_SMS;
    prop->sharedMemPerBlockOptin = SI_SMEM_OPTIN;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int d)
{
    COUNT();
    if (d != 0) return cudaErrorInvalidDevice;
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *v = SI_SMS; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = SI_SMEM_OPTIN; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    default: *v = 0; break;
    }
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *f, enum cudaFuncAttribute attr, int value)
{
    COUNT();
    (void)f, (void)attr, (void)value;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    COUNT();
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "stand-in runtime error"; }

/* Streams, events and graphs: tokens (distinct non-null pointers). */
static void *si_token(void) { return calloc(1, 16); }

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    COUNT();
    *s = si_token();
    return *s ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    COUNT();
    free(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    COUNT();
    (void)s;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    COUNT();
    (void)flags;
    *e = si_token();
    return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    COUNT();
    free(e);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    COUNT();
    (void)e, (void)s;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    COUNT();
    (void)e;
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    COUNT();
    (void)s, (void)mode;
    atomic_store(&si_capturing, 1);
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    COUNT();
    (void)s;
    atomic_store(&si_capturing, 0);
    *g = si_token();
    return *g ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags)
{
    COUNT();
    (void)g, (void)flags;
    *x = si_token();
    return *x ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaGraphExecUpdate(cudaGraphExec_t x, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info)
{
    COUNT();
    (void)x, (void)g;
    if (info) memset(info, 0, sizeof *info);
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s)
{
    COUNT();
    (void)x, (void)s;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    COUNT();
    free(g);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x)
{
    COUNT();
    free(x);
    return cudaSuccess;
}

/* What the host functions nvcc writes for each kernel call (crt/host_runtime.h,
 * crt/device_functions.h): the fat binary and its kernels registered, and a launch's configuration
 * pushed by <<<...>>> and popped by the kernel's host function. */
void **__cudaRegisterFatBinary(void *fat);
void __cudaRegisterFatBinaryEnd(void **handle);
void __cudaUnregisterFatBinary(void **handle);
void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun, const char *name, int limit,
                            uint3 *tid, uint3 *bid, dim3 *bdim, dim3 *gdim, int *wsize);
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shmem, void *stream);
cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shmem, void *stream);
cudaError_t __cudaGetKernel(cudaKernel_t *k, const void *fun);
cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s);

static void *si_fat_handle;

void **__cudaRegisterFatBinary(void *fat)
{
    (void)fat;
    return &si_fat_handle;
}

void __cudaRegisterFatBinaryEnd(void **handle) { (void)handle; }

void __cudaUnregisterFatBinary(void **handle) { (void)handle; }

void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun, const char *name, int limit,
                            uint3 *tid, uint3 *bid, dim3 *bdim, dim3 *gdim, int *wsize)
{
    (void)handle, (void)device_fun, (void)limit, (void)tid, (void)bid, (void)bdim, (void)gdim, (void)wsize;
    size_t at = kernel_slot(host_fun);
    if (at == SIZE_MAX || si_kernels[at].fun) return;
    si_kernels[at].fun = host_fun;
    snprintf(si_kernels[at].name, sizeof si_kernels[at].name, "%s", name);
}

static _Thread_local struct {
    dim3 grid, block;
    size_t shmem;
    void *stream;
} si_config;

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shmem, void *stream)
{
    si_config.grid = grid;
    si_config.block = block;
    si_config.shmem = shmem;
    si_config.stream = stream;
    return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shmem, void *stream)
{
    *grid = si_config.grid;
    *block = si_config.block;
    *shmem = si_config.shmem;
    *(void **)stream = si_config.stream;
    return cudaSuccess;
}

cudaError_t __cudaGetKernel(cudaKernel_t *k, const void *fun)
{
    *k = (cudaKernel_t)(uintptr_t)fun;
    return cudaSuccess;
}

/* A launch counted under its kernel: its host function's address (what __cudaRegisterFunction keyed). */
static void count_launch(const void *fun)
{
    if (!census_on()) return;
    size_t at = kernel_slot(fun);
    if (at != SIZE_MAX && si_kernels[at].fun)
        atomic_fetch_add(atomic_load(&si_capturing) ? &si_kernels[at].recorded : &si_kernels[at].direct, 1);
}

/* Where an older toolkit's kernel calls (or CUDA 13's legacy path) launch: by the host function's address. */
cudaError_t cudaLaunchKernel(const void *fun, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s)
{
    (void)grid, (void)block, (void)args, (void)shmem, (void)s;
    count_launch(fun);
    return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s)
{
    (void)grid, (void)block, (void)args, (void)shmem, (void)s;
    count_launch((const void *)k);
    return cudaSuccess;
}
