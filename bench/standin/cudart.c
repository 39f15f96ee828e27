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
 *   count KIND COUNT      the calls of each kind below that a failure can be put in
 *   failed KIND N         the failure KVCHAT_STANDIN_FAIL asked for, where it was answered
 * (bench/host_cost.sh takes two runs' difference to get a decode step's share.)
 *
 * Failures on demand, for the backend's error paths (scripts/standin_faults.sh): with
 * KVCHAT_STANDIN_FAIL=KIND:N the Nth call of one kind fails as a real runtime's would:
 *   malloc         cudaMalloc answers cudaErrorMemoryAllocation (the device full at that moment)
 *   host-alloc     cudaHostAlloc answers cudaErrorMemoryAllocation
 *   host-register  cudaHostRegister answers cudaErrorMemoryAllocation (the locked-memory limit)
 *   launch         a kernel launch answers cudaErrorLaunchOutOfResources (recorded into a graph: its
 *                  capture ends invalidated)
 *   fault          a stream or event synchronization answers cudaErrorIllegalAddress, and so does
 *                  every call after it but the device queries, which need no context (a kernel's
 *                  bad access ends a real context for good)
 * KIND:N+ fails the Nth call and every later one of the kind (a device that stays full: the backend's
 * fallbacks, which allocate again, fail too). Each failure is also the runtime's last error
 * (cudaGetLastError answers it once; a fault's, for good). With KVCHAT_STANDIN_ARM=FILE too, N counts only the calls made while FILE exists (a test
 * of the interface fails a chosen question's). KVCHAT_STANDIN_MEMORY=MIB makes the device that size
 * (80 GiB otherwise); KVCHAT_STANDIN_TRACE=1 writes the failed call's backtrace to stderr. With
 * KVCHAT_STANDIN_SITES=FILE it also writes, at exit, where in the program the calls of each kind
 * came from (its callers' four return addresses, hashed), a line a place:
 *   site KIND HASH FIRST LAST COUNT   the kind's call numbers of its first and last call there
 * so a sweep can fail each place's first and last call rather than every call. A malformed setting
 * stops the program at load with a line saying so. */
#include <cuda_runtime_api.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The H100 80GB's figures, where the backend sizes its work by them (the memory unless
 * KVCHAT_STANDIN_MEMORY says otherwise). */
#define SI_SMS 132
#define SI_SMEM_OPTIN (227 * 1024)

static size_t si_total = (size_t)80 << 30;
static atomic_size_t si_used;

/* The failure asked for (KVCHAT_STANDIN_FAIL), the calls of each kind so far, and the errors a
 * real runtime would keep: the last one (answered once by cudaGetLastError) and a fault's. */
enum { SF_MALLOC, SF_HOST_ALLOC, SF_HOST_REGISTER, SF_LAUNCH, SF_FAULT, SF_KINDS };
static const char *const sf_names[SF_KINDS] = {"malloc", "host-alloc", "host-register", "launch", "fault"};
static int sf_kind = -1;
static long long sf_at;
static int sf_on;              /* KIND:N+: every call from the Nth on fails */
static atomic_llong sf_seen[SF_KINDS];
static atomic_int sf_failed;   /* the failure was answered */
static const char *sf_arm;     /* KVCHAT_STANDIN_ARM: N counts the kind's calls made while this file exists */
static atomic_llong sf_armed;
static atomic_int si_last, si_sticky, si_capture_broken;

static void si_settings_refused(const char *name, const char *value, const char *want)
{
    fprintf(stderr, "stand-in CUDA runtime: %s=%s is not %s\n", name, value, want);
    exit(2);
}

__attribute__((constructor)) static void read_settings(void)
{
    const char *mem = getenv("KVCHAT_STANDIN_MEMORY");
    if (mem && *mem) {
        char *end;
        errno = 0;
        unsigned long long mib = strtoull(mem, &end, 10);
        if (errno || *end || mib == 0 || mib > ((unsigned long long)1 << 30) || *mem == '-')
            si_settings_refused("KVCHAT_STANDIN_MEMORY", mem, "a size in MiB (1 or more)");
        si_total = (size_t)mib << 20;
    }
    sf_arm = getenv("KVCHAT_STANDIN_ARM");
    if (sf_arm && !*sf_arm) sf_arm = NULL;
    const char *f = getenv("KVCHAT_STANDIN_FAIL");
    if (!f || !*f) return;
    const char *colon = strchr(f, ':');
    for (int k = 0; colon && k < SF_KINDS; k++)
        if (strlen(sf_names[k]) == (size_t)(colon - f) && !strncmp(f, sf_names[k], (size_t)(colon - f))) sf_kind = k;
    char *end = NULL;
    errno = 0;
    if (sf_kind >= 0) sf_at = strtoll(colon + 1, &end, 10);
    if (end && *end == '+' && !end[1]) sf_on = 1, end++;
    if (sf_kind < 0 || errno || !end || *end || sf_at < 1 || colon[1] == '-' || colon[1] == '+')
        si_settings_refused("KVCHAT_STANDIN_FAIL", f,
                            "KIND:N or KIND:N+ (KIND malloc, host-alloc, host-register, launch or fault; N from 1)");
}

/* The places calls come from (KVCHAT_STANDIN_SITES): open addressing on the callers' hash. */
enum { SF_SITES = 8192 };
static struct {
    uint64_t hash;
    int kind;
    long long first, last, n;
} sf_sites[SF_SITES];
static int sf_sites_on = -1;
static pthread_mutex_t sf_sites_lock = PTHREAD_MUTEX_INITIALIZER;

/* Call n of a kind, placed by the four return addresses above frames 0 to 2 (this function,
 * fails_now, the API function; a launch's: launch(), so its four are the entry point, the host
 * function nvcc wrote for the kernel and two of the program's). Addresses differ from run to run; a sweep takes the call
 * numbers, which do not. */
__attribute__((noinline)) static void note_site(int kind, long long n)
{
    if (sf_sites_on < 0) sf_sites_on = getenv("KVCHAT_STANDIN_SITES") && *getenv("KVCHAT_STANDIN_SITES");
    if (!sf_sites_on) return;
    void *fr[7];
    int depth = backtrace(fr, 7);
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)kind;
    for (int i = 3; i < depth; i++) h = (h ^ (uint64_t)(uintptr_t)fr[i]) * 0x100000001b3ull;
    pthread_mutex_lock(&sf_sites_lock);
    for (size_t i = 0; i < SF_SITES; i++) {
        size_t at = (h + i) % SF_SITES;
        if (sf_sites[at].n && (sf_sites[at].hash != h || sf_sites[at].kind != kind)) continue;
        if (!sf_sites[at].n) {
            sf_sites[at].hash = h;
            sf_sites[at].kind = kind;
            sf_sites[at].first = n;
        }
        sf_sites[at].last = n;
        sf_sites[at].n++;
        break;
    }
    pthread_mutex_unlock(&sf_sites_lock);
}

/* 1 when this call of a kind is the one asked to fail (every call is counted). */
__attribute__((noinline)) static int fails_now(int kind)
{
    long long n = atomic_fetch_add(&sf_seen[kind], 1) + 1;
    note_site(kind, n);
    if (kind != sf_kind) return 0;
    if (sf_arm) {   /* counted from when the file is there */
        if (access(sf_arm, F_OK) != 0) return 0;
        n = atomic_fetch_add(&sf_armed, 1) + 1;
    }
    if (sf_on ? n < sf_at : n != sf_at) return 0;
    atomic_store(&sf_failed, 1);
    if (getenv("KVCHAT_STANDIN_TRACE")) {   /* where the failure was put, for whoever reads a failed sweep's run */
        void *fr[32];
        fprintf(stderr, "stand-in CUDA runtime: failing %s call %lld here:\n", sf_names[kind], n);
        backtrace_symbols_fd(fr, backtrace(fr, 32), 2);
    }
    return 1;
}

/* A call's error, kept as the last one as the runtime keeps it. */
static cudaError_t si_error(cudaError_t e)
{
    atomic_store(&si_last, (int)e);
    return e;
}

/* A fault answers every call after it (the calls that free still free: a real context's memory
 * goes with it). */
#define STICKY()                                                   \
    do {                                                           \
        int e_ = atomic_load(&si_sticky);                          \
        if (e_) return (cudaError_t)e_;                            \
    } while (0)

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

/* A report's file (the setting names it): created, or a regular file replaced; never a link. NULL
 * when not asked for or not writable (said). */
static FILE *open_report(const char *setting)
{
    const char *path = getenv(setting);
    if (!path || !*path) return NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "stand-in CUDA runtime: cannot write its report to %s: %s\n", path,
                fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0) close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) close(fd);
    return f;
}

__attribute__((destructor)) static void write_sites(void)
{
    FILE *f = open_report("KVCHAT_STANDIN_SITES");
    if (!f) return;
    for (size_t i = 0; i < SF_SITES; i++)
        if (sf_sites[i].n)
            fprintf(f, "site %s %016llx %lld %lld %lld\n", sf_names[sf_sites[i].kind],
                    (unsigned long long)sf_sites[i].hash, sf_sites[i].first, sf_sites[i].last, sf_sites[i].n);
    fclose(f);
}

__attribute__((destructor)) static void write_report(void)
{
    FILE *f = open_report("KVCHAT_STANDIN_REPORT");
    if (!f) return;
    for (int i = 0; i < SI_CALLS && atomic_load(&si_calls[i].name); i++)
        fprintf(f, "call %s %lld\n", atomic_load(&si_calls[i].name), (long long)atomic_load(&si_calls[i].n));
    for (size_t i = 0; i < SI_KERNELS; i++) {
        if (!si_kernels[i].fun) continue;
        long long d = atomic_load(&si_kernels[i].direct), r = atomic_load(&si_kernels[i].recorded);
        if (d) fprintf(f, "launch %s %lld\n", si_kernels[i].name, d);
        if (r) fprintf(f, "recorded %s %lld\n", si_kernels[i].name, r);
    }
    for (int k = 0; k < SF_KINDS; k++) fprintf(f, "count %s %lld\n", sf_names[k], (long long)atomic_load(&sf_seen[k]));
    if (atomic_load(&sf_failed)) fprintf(f, "failed %s %lld\n", sf_names[sf_kind], sf_at);
    fclose(f);
}

/* Device memory: an anonymous mapping, zero and never touched by the backend (it cannot touch
 * device memory), so a 4 GiB model costs address space, not RAM. Its first 4 KiB hold its size. */
enum { SI_HEAD = 4096 };

cudaError_t cudaMalloc(void **p, size_t size)
{
    COUNT();
    STICKY();
    if (!p) return cudaErrorInvalidValue;
    if (fails_now(SF_MALLOC)) return si_error(cudaErrorMemoryAllocation);
    size_t used = atomic_load(&si_used);
    if (size > si_total - used) return si_error(cudaErrorMemoryAllocation);
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
    STICKY();
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot)
{
    COUNT();
    STICKY();
    if (fr) *fr = si_total - atomic_load(&si_used);
    if (tot) *tot = si_total;
    return cudaSuccess;
}

/* Page-locked host memory: host memory the backend writes and reads, every page touched now, as
 * locking it does (left to the first write, the faults would land in the steps that first use a
 * staging arena's pages, which a real runtime never shows). */
cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
    COUNT();
    (void)flags;
    STICKY();
    if (!p) return cudaErrorInvalidValue;
    if (fails_now(SF_HOST_ALLOC)) return si_error(cudaErrorMemoryAllocation);
    *p = calloc(1, size ? size : 1);
    if (!*p) return cudaErrorMemoryAllocation;
    for (size_t i = 0; i < size; i += 4096) ((volatile char *)*p)[i] = 0;   /* a store a page: faulted in now */
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    COUNT();
    free(p);
    STICKY();
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags)
{
    COUNT();
    (void)p, (void)size, (void)flags;
    STICKY();
    if (fails_now(SF_HOST_REGISTER)) return si_error(cudaErrorMemoryAllocation);
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *p)
{
    COUNT();
    (void)p;
    STICKY();
    return cudaSuccess;
}

/* A copy counted by its direction too (census lines "call copy_up", "copy_down", "copy_on_device";
 * host_cost.sh and standin_check.sh read the first). */
static void count_copy(enum cudaMemcpyKind kind)
{
    static const char up[] = "copy_up", down[] = "copy_down", dev[] = "copy_on_device", other[] = "copy_other";
    count_call(kind == cudaMemcpyHostToDevice   ? up
               : kind == cudaMemcpyDeviceToHost ? down
               : kind == cudaMemcpyDeviceToDevice ? dev
                                                  : other);
}

/* A copy's call returns before the copy on a real device too; here there is none. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t s)
{
    COUNT();
    count_copy(kind);
    STICKY();
    (void)dst, (void)src, (void)count, (void)kind, (void)s;
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)   /* gpu_bench's */
{
    return cudaMemcpyAsync(dst, src, count, kind, NULL);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t s)
{
    COUNT();
    count_copy(kind);
    STICKY();
    (void)dst, (void)dpitch, (void)src, (void)spitch, (void)width, (void)height, (void)kind, (void)s;
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t count, cudaStream_t s)
{
    COUNT();
    STICKY();
    (void)p, (void)value, (void)count, (void)s;
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t count)   /* gpu_bench's */
{
    COUNT();
    STICKY();
    (void)p, (void)value, (void)count;
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
    prop->totalGlobalMem = si_total;
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
    STICKY();
    (void)f, (void)attr, (void)value;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    COUNT();
    STICKY();
    return (cudaError_t)atomic_exchange(&si_last, 0);
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory (stand-in)";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch (stand-in)";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (stand-in)";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture (stand-in)";
    default: return "stand-in runtime error";
    }
}

/* Streams, events and graphs: tokens (distinct non-null pointers). */
static void *si_token(void) { return calloc(1, 16); }

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    COUNT();
    STICKY();
    *s = si_token();
    return *s ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    COUNT();
    free(s);
    STICKY();
    return cudaSuccess;
}

/* A wait's answer: the fault asked for starts here (inlined, so the places a sweep sees are the
 * callers' of the API function, as for every other kind). */
__attribute__((always_inline)) static inline cudaError_t wait_answer(void)
{
    if (!fails_now(SF_FAULT)) return cudaSuccess;
    atomic_store(&si_sticky, (int)cudaErrorIllegalAddress);
    return si_error(cudaErrorIllegalAddress);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    COUNT();
    STICKY();
    (void)s;
    return wait_answer();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    COUNT();
    STICKY();
    (void)flags;
    *e = si_token();
    return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventCreate(cudaEvent_t *e)   /* gpu_bench's timing events */
{
    return cudaEventCreateWithFlags(e, 0);
}

/* Nothing ran between two events: no time passed. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    COUNT();
    STICKY();
    (void)start, (void)end;
    *ms = 0;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    COUNT();
    free(e);
    STICKY();
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    COUNT();
    STICKY();
    (void)e, (void)s;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    COUNT();
    STICKY();
    (void)e;
    return wait_answer();
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    COUNT();
    STICKY();
    (void)s, (void)mode;
    atomic_store(&si_capturing, 1);
    atomic_store(&si_capture_broken, 0);
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    COUNT();
    (void)s;
    atomic_store(&si_capturing, 0);
    STICKY();
    if (atomic_exchange(&si_capture_broken, 0)) {
        *g = NULL;
        return si_error(cudaErrorStreamCaptureInvalidated);
    }
    *g = si_token();
    return *g ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags)
{
    COUNT();
    STICKY();
    (void)g, (void)flags;
    *x = si_token();
    return *x ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaGraphExecUpdate(cudaGraphExec_t x, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info)
{
    COUNT();
    STICKY();
    (void)x, (void)g;
    if (info) memset(info, 0, sizeof *info);
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s)
{
    COUNT();
    STICKY();
    (void)x, (void)s;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    COUNT();
    free(g);
    STICKY();
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x)
{
    COUNT();
    free(x);
    STICKY();
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

/* A launch's answer: the failure asked for (into a graph, the capture is then invalidated), or
 * a fault's. */
__attribute__((noinline)) static cudaError_t launch(const void *fun)
{
    count_launch(fun);
    STICKY();
    if (!fails_now(SF_LAUNCH)) return cudaSuccess;
    if (atomic_load(&si_capturing)) atomic_store(&si_capture_broken, 1);
    return si_error(cudaErrorLaunchOutOfResources);
}

/* Where an older toolkit's kernel calls (or CUDA 13's legacy path) launch: by the host function's address. */
cudaError_t cudaLaunchKernel(const void *fun, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s)
{
    (void)grid, (void)block, (void)args, (void)shmem, (void)s;
    return launch(fun);
}

cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s)
{
    (void)grid, (void)block, (void)args, (void)shmem, (void)s;
    return launch((const void *)k);
}
