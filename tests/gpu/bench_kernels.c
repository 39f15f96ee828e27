/* bench_kernels.c - `gpu_bench`: the CUDA backend's kernels timed through the op table, on the
 * shapes of a 7B model, against the device's own copy bandwidth (scripts/gpu-check.sh runs it on a
 * lent GPU; docs/gpu.md has the results).
 *
 *   gpu_bench [--csv FILE] [--quick] [--profile]
 *
 * - copy: a device-to-device copy of 1 GiB (bytes read plus written): the ceiling for what follows;
 * - products of every weight type the device reads as stored, at the 7B shapes (4096 x 4096,
 *   14336 x 4096, 4096 x 14336), for 1, 2, 4, 8 tokens (the decode kernels, beside stage 0's f32
 *   kernel, KVCHAT_CUDA_MMV=f32; on one row a warp with 1 read of its row in flight a lane,
 *   KVCHAT_CUDA_MMV_INFLIGHT=1 KVCHAT_CUDA_MMV_ROWS=1, and with 2 (1 on F16/BF16 for more
 *   tokens) and for a token 4 (the default: for a token 4, 2 on Q4_K's wide path; for more,
 *   dd_many_shape's since 2026-11-30, two rows a warp for 2-8 tokens since 2f66bdf); on two rows a
 *   warp, KVCHAT_CUDA_MMV_ROWS=2; for Q4_K and Q5_K the narrow items the wide path replaced,
 *   KVCHAT_CUDA_MMV=narrow), 9, 16, 32, 64 tokens
 *   (the decode kernel in passes of 8, KVCHAT_CUDA_MMV_MAX=64, beside the tile + cuBLAS path,
 *   KVCHAT_CUDA_MMV_MAX=8, the default) and 512 tokens (prefill); bytes = the weight's device bytes
 *   plus the activations in and out;
 * - a layer's q, k and v (one input, three weights) at the 7B's shape (Q4_K) and the default
 *   model's (Q8_0), for 1 and 8 tokens: in one decode launch reading the input's codes (the
 *   default; as in a decode step, where the op before wrote them) and a launch each quantizing
 *   the input (KVCHAT_CUDA_LAUNCHES=apart); a call's time is the host's issuing or the device's
 *   work, whichever is longer. The products' rows above repeat a call on an unchanged input, so
 *   since this change (stage 4's third part) they read the codes the first call made, as a
 *   decode step's products do, where they used to quantize the input each call;
 * - decode attention (one query) at Mistral 7B's shape (32 query heads, 8 KV heads of 128) over
 *   512, 8192 and 32768 tokens in pages of 32 per KV head, and the default model's (4 query heads,
 *   1 KV head of 256) at 8192; a prefill chunk's (512 queries at the end of 8192 tokens, 7B shape);
 *   and the default model's (512 queries at 8192); each with the grouped kernel (decode's default;
 *   KVCHAT_CUDA_ATTN=grouped for the chunks), the scalar one (KVCHAT_CUDA_ATTN=scalar) and for the
 *   chunks the tensor-core flash kernel (their default); for one query also the grouped kernel
 *   fetching 2 and 8 rows a round a slot (KVCHAT_CUDA_ATTN_ROWS; 4 the default);
 *   bytes = the keys and values read once (a decode step's least traffic); and a batch's decode
 *   attention, 8 sequences each over 4096 tokens of its own at both shapes, joined in one launch
 *   (attention_seqs) and a call each (bytes: every sequence's keys and values);
 * - the sampler's candidates over a row of 262144 logits (the default model's vocabulary): the
 *   device's pick for greedy (k 1) and for top-k 40 and 256 with the entropy and 64 penalized ids,
 *   beside what a step paid before it (the row downloaded after a kernel wrote it) and the CPU's
 *   pick of the same row (the host's share of that old path); bytes = the row;
 * - Quest's bounds and top 32 pages a layer at the 7B shape over 8K and 32K tokens (a decode step's
 *   steady state: the summaries on the device), beside the CPU backend on one thread and on every
 *   core; bytes = the summaries read;
 * - the eviction policies' attention mass at the 7B shape (8 KV heads of 4 query heads of 128):
 *   a layer's 8 KV heads a call: TAKE's after a chunk (32 probe rows over 1,536 and 3,072 cached
 *   tokens a KV head), SnapKV's at the end of a 32K prompt (32 rows over 32,768) and H2O's after a
 *   chunk (512 rows over 2,048), each a call with its wait and the sums brought back, beside the CPU
 *   backend on one thread and on every core; bytes = the keys read once.
 * Each case: warm-up calls (the first uploads the weight or the pages), then as many calls as take
 * at least 30 ms, timed on the host around the calls and the final wait (launch costs included, as
 * the engine pays them). The weights are a few distinct quantized rows repeated: the speed of a
 * product does not depend on the values, and quantizing 60M values per matrix on the host would
 * take longer than the benchmark. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/quant.h"
#include "kernels/backend.h"
#include "kernels/attn_flash.h"
#include "kernels/decode_dot.h"

static FILE *csv;
static double copy_gbps;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void row(const char *what, const char *type, int64_t n_out, int64_t n_in, int64_t tok, const char *config,
                double ms, double bytes)
{
    if (strchr(what, ',') || strchr(config, ',')) {   /* it would split the CSV's field */
        fprintf(stderr, "gpu_bench: internal error: a comma in \"%s\" / \"%s\"\n", what, config);
        exit(1);
    }
    double gbps = bytes / (ms * 1e-3) / 1e9;
    printf("| %s | %s | %lld x %lld | %lld | %s | %.4f | %.0f | %.2f |\n", what, type, (long long)n_out, (long long)n_in,
           (long long)tok, config, ms, gbps, copy_gbps > 0 ? gbps / copy_gbps : 0.0);
    fflush(stdout);
    if (csv) {
        fprintf(csv, "%s,%s,%lld,%lld,%lld,%s,%.5f,%.1f,%.3f\n", what, type, (long long)n_out, (long long)n_in,
                (long long)tok, config, ms, gbps, copy_gbps > 0 ? gbps / copy_gbps : 0.0);
        fflush(csv);
    }
}

static int measure_copy(void)
{
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        fprintf(stderr, "gpu_bench: cannot allocate 2 GiB for the copy\n");
        return -1;
    }
    cudaMemset(a, 1, bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e0, 0);
    const int reps = 10;
    for (int i = 0; i < reps; i++) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    ms /= reps;
    copy_gbps = 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
    row("copy", "-", 0, 0, 0, "device-to-device", ms, 2.0 * (double)bytes);
    cudaFree(a);
    cudaFree(b);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 0;
}

/* Wait for everything the backend queued (a host read of one bound float). */
static void wait_for(be_backend *b, float *y)
{
    be_range r = { y, sizeof(float) };
    be_host_read(b, &r, 1);
}

typedef void (*call_fn)(be_backend *b, void *arg);

/* ms per call: 2 warm-up calls, then doublings until at least 30 ms */
static double time_calls(be_backend *b, call_fn fn, void *arg, float *y)
{
    fn(b, arg);
    fn(b, arg);
    wait_for(b, y);
    for (int n = 4;; n *= 2) {
        double t0 = now();
        for (int i = 0; i < n; i++) fn(b, arg);
        wait_for(b, y);
        double t = now() - t0;
        if (t >= 0.03 || n >= 1 << 16) return t * 1e3 / n;
    }
}

typedef struct mm_arg {
    be_mm mm;
    const float *x;
    int64_t n_tok;
} mm_arg;

static void call_mm(be_backend *b, void *arg)
{
    mm_arg *a = arg;
    b->ops->matmul(b, &a->mm, 1, a->x, a->n_tok);
}

typedef struct be_mm3_arg {
    be_mm mm[3];
    const float *x;
    int64_t n_tok;
} be_mm3_arg;

static void call_mm3(be_backend *b, void *arg)
{
    be_mm3_arg *a = arg;
    b->ops->matmul(b, a->mm, 3, a->x, a->n_tok);
}

static void call_attn(be_backend *b, void *arg) { b->ops->attention(b, (const be_attn *)arg); }

typedef struct seqs_arg {
    be_attn a[BE_ATTN_SEQS_MAX];
    int n;
} seqs_arg;

static void call_seqs(be_backend *b, void *arg)
{
    seqs_arg *x = arg;
    b->ops->attention_seqs(b, x->a, x->n);
}

static void call_each(be_backend *b, void *arg)
{
    seqs_arg *x = arg;
    for (int i = 0; i < x->n; i++) b->ops->attention(b, &x->a[i]);
}

/* A context of ctx tokens for n_kv KV heads of D in pages of 32, a list per KV head: *pages
 * (*n_pages), the rows (*kv: keys, then values), positions 0 .. ctx - 1 (*pos) and the heads'
 * offsets (*hp); the caller frees all four. 0, or 1 when out of memory. */
static int context_pages(int nkv, int D, int64_t ctx, be_kv_page **pages, int64_t *n_pages, uint16_t **kv,
                         int32_t **pos, int64_t **hp)
{
    const int64_t per_head = ctx / 32;
    *n_pages = per_head * nkv;
    *pages = calloc((size_t)*n_pages, sizeof **pages);
    *kv = malloc(sizeof(uint16_t) * 2 * (size_t)(ctx * nkv * D));
    *pos = malloc(sizeof(int32_t) * (size_t)ctx);
    *hp = malloc(sizeof(int64_t) * (size_t)(nkv + 1));
    if (!*pages || !*kv || !*pos || !*hp) return 1;
    for (int64_t i = 0; i < 2 * ctx * nkv * D; i++) (*kv)[i] = quant_f32_to_fp16(frand());
    for (int64_t i = 0; i < ctx; i++) (*pos)[i] = (int32_t)i;
    static uint64_t gen = 1u << 30;
    for (int g = 0; g < nkv; g++) {
        (*hp)[g] = (int64_t)g * per_head;
        for (int64_t p = 0; p < per_head; p++) {
            uint16_t *k = *kv + ((size_t)g * (size_t)ctx + (size_t)p * 32) * (size_t)D;
            (*pages)[g * per_head + p] =
                (be_kv_page){ k, k + (size_t)(ctx * nkv * D), *pos + p * 32, NULL, NULL, 32, D, 0, ++gen, 32, NULL };
        }
    }
    (*hp)[nkv] = *n_pages;
    return 0;
}
static void call_pick(be_backend *b, void *arg) { b->ops->pick(b, (be_pick *)arg, 1); }
static void call_bounds(be_backend *b, void *arg) { b->ops->bound_pages(b, (be_bounds *)arg); }
static void call_mass(be_backend *b, void *arg) { b->ops->attn_mass(b, (const be_mass *)arg); }

/* The old path's device share: a kernel writes the row (an add of the zeros after it, as 256 rows
 * so that it spreads over the device as the scale it replaces did), the host reads it back. */
static void call_row_back(be_backend *b, void *arg)
{
    be_pick *p = arg;
    b->ops->add_norm(b, p->logits, p->logits + p->n, NULL, NULL, NULL, 256, p->n / 256, 0.0f);
    be_range r = { p->logits, sizeof(float) * (size_t)p->n };
    be_host_read(b, &r, 1);
}

static int failed(be_backend *b, const char *what)
{
    char err[512];
    if (!be_failed(b, err, sizeof err)) return 0;
    fprintf(stderr, "gpu_bench: %s: %s\n", what, err);
    return 1;
}

/* A weight of n_out rows: 64 distinct quantized rows repeated. */
static void *make_weight(uint32_t type, int64_t n_in, int64_t n_out, be_weight *w)
{
    size_t rb = quant_row_size(type, n_in);
    uint8_t *d = malloc(rb * (size_t)n_out);
    float *r = malloc(sizeof(float) * (size_t)n_in);
    if (!d || !r) {
        free(d);
        free(r);
        return NULL;
    }
    const int distinct = 64;
    for (int i = 0; i < distinct && i < n_out; i++) {
        for (int64_t k = 0; k < n_in; k++) r[k] = 0.02f * frand();
        if (quant_quantize_row(type, r, d + rb * (size_t)i, n_in)) {
            free(d);
            free(r);
            return NULL;
        }
    }
    for (int64_t i = distinct; i < n_out; i++) memcpy(d + rb * (size_t)i, d + rb * (size_t)(i % distinct), rb);
    free(r);
    *w = (be_weight){ d, type, n_in, n_out, rb };
    return d;
}

/* --profile: each launch a profiler is to read the counters of, once (scripts/gpu-check.sh runs it
 * under ncu): a token's product at 14336 x 4096 of Q4_K (the wide path), Q6_K, Q8_0 and F16 with
 * the defaults' reads in flight, Q6_K and Q8_0 with 2 and Q4_K with 1 besides, and each with 8
 * tokens (a batch's step; the defaults and one row a warp); and decode attention
 * at the 7B shape over 32768 tokens (the grouped kernel with 4 rows a round and with 2, and its split
 * merge). 0, or 1 on a failure. */
static int profile_launches(be_backend *dflt, be_backend *in1, be_backend *in2, be_backend *grp, be_backend *grp2)
{
    static const uint32_t types[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0, GGML_TYPE_F16 };
    const int64_t n_out = 14336, n_in = 4096, many = 8;   /* many: the tokens of a batch's step */
    char err[512];
    float *x = malloc(sizeof(float) * (size_t)(many * n_in)), *y = malloc(sizeof(float) * (size_t)(many * n_out));
    if (!x || !y) return 1;
    for (int64_t i = 0; i < many * n_in; i++) x[i] = frand();
    be_backend *bes[3] = { dflt, in1, in2 };
    for (int k = 0; k < 3; k++)
        if (be_bind(bes[k], x, sizeof(float) * (size_t)(many * n_in), err, sizeof err) ||
            be_bind(bes[k], y, sizeof(float) * (size_t)(many * n_out), err, sizeof err)) {
            fprintf(stderr, "gpu_bench: %s\n", err);
            return 1;
        }
    void *keep[sizeof types / sizeof *types] = { NULL };
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        be_weight w;
        if (!(keep[ti] = make_weight(types[ti], n_in, n_out, &w))) return 1;
        const be_weight *wp = &w;
        for (int k = 0; k < 3; k++) {
            if (k == 1 && types[ti] != GGML_TYPE_Q4_K) continue;
            if (k == 2 && types[ti] != GGML_TYPE_Q6_K && types[ti] != GGML_TYPE_Q8_0) continue;
            if (bes[k]->ops->prepare && bes[k]->ops->prepare(bes[k], &wp, 1, err, sizeof err)) {
                fprintf(stderr, "gpu_bench: %s\n", err);
                return 1;
            }
            be_host_write(bes[k], x, sizeof(float) * (size_t)(many * n_in));
            mm_arg a = { { &w, y }, x, 1 };
            call_mm(bes[k], &a);
            wait_for(bes[k], y);
            if (failed(bes[k], "product")) return 1;
            printf("profiled: %s %lld x %lld, a token, %s\n", quant_type_name(types[ti]), (long long)n_out,
                   (long long)n_in, k == 0 ? "the defaults" : k == 1 ? "1 in flight" : "2 in flight");
        }
        /* a batch's 8 tokens: where their time goes (every row re-reads each token's codes: from
         * L1 or from L2, which the memory sections say), with the defaults (two rows a warp at this
         * shape but on Q8_0) and on one row a warp (KVCHAT_CUDA_MMV_ROWS=1, 2 in flight) */
        if (!(types[ti] == GGML_TYPE_Q6_K || types[ti] == GGML_TYPE_Q8_0) && in2->ops->prepare &&
            in2->ops->prepare(in2, &wp, 1, err, sizeof err)) {
            fprintf(stderr, "gpu_bench: %s\n", err);
            return 1;
        }
        for (int k = 0; k < 2; k++) {
            be_backend *b = k ? in2 : dflt;
            mm_arg a8 = { { &w, y }, x, many };
            call_mm(b, &a8);
            wait_for(b, y);
            if (failed(b, "product")) return 1;
            printf("profiled: %s %lld x %lld, %lld tokens, %s\n", quant_type_name(types[ti]), (long long)n_out,
                   (long long)n_in, (long long)many, k ? "one row a warp" : "the defaults");
        }
        /* the backends keep the weight by its address: kept until the end, as main's are */
    }
    for (int k = 0; k < 3; k++) {
        be_unbind(bes[k], x);
        be_unbind(bes[k], y);
    }
    int64_t n_pages;
    be_kv_page *pages;
    uint16_t *kv;
    int32_t *pos;
    int64_t *hp;
    const int nh = 32, nkv = 8, D = 128;
    const int64_t ctx = 32768;
    if (context_pages(nkv, D, ctx, &pages, &n_pages, &kv, &pos, &hp)) return 1;
    const size_t qbytes = sizeof(float) * (size_t)(nh * D);
    float *q = malloc(qbytes), *o = malloc(qbytes);
    if (!q || !o) return 1;
    for (int64_t i = 0; i < nh * D; i++) q[i] = 0.1f * frand(), o[i] = 0;
    int32_t qp = (int32_t)(ctx - 1);
    be_backend *att[2] = { grp, grp2 };
    for (int k = 0; k < 2; k++) {
        if (be_bind(att[k], q, qbytes, err, sizeof err) || be_bind(att[k], o, qbytes, err, sizeof err)) {
            fprintf(stderr, "gpu_bench: %s\n", err);
            return 1;
        }
        be_host_write(att[k], q, qbytes);
        be_attn a = { q, 1, &qp, nh, nkv, D, pages, n_pages, hp, 0, o, NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
        call_attn(att[k], &a);
        wait_for(att[k], o);
        if (failed(att[k], "attention")) return 1;
        be_unbind(att[k], q);
        be_unbind(att[k], o);
        printf("profiled: decode attention, 32 query heads, 8 KV heads of 128, 32768 tokens, %s rows a round\n",
               k ? "2" : "4 (the default)");
    }
    free(q);
    free(o);
    free(pages);
    free(kv);
    free(pos);
    free(hp);
    free(x);
    free(y);
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) free(keep[ti]);
    return 0;
}

int main(int argc, char **argv)
{
    int quick = 0, profile = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--csv") && i + 1 < argc) {
            csv = fopen(argv[++i], "w");
            if (!csv) {
                fprintf(stderr, "gpu_bench: cannot write %s\n", argv[i]);
                return 1;
            }
        } else if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--profile")) {
            profile = 1;
        } else {
            fprintf(stderr, "usage: gpu_bench [--csv FILE] [--quick] [--profile]\n");
            return 1;
        }
    }
    char err[512];
    be_backend *dflt = be_cuda_create(4, err, sizeof err);
    if (!dflt) {
        fprintf(stderr, "gpu_bench: %s\n", err);
        return 1;
    }
    setenv("KVCHAT_CUDA_MMV_MAX", "8", 1);
    be_backend *tiles = be_cuda_create(4, err, sizeof err);
    setenv("KVCHAT_CUDA_MMV_MAX", "64", 1);
    be_backend *passes = tiles ? be_cuda_create(4, err, sizeof err) : NULL;
    unsetenv("KVCHAT_CUDA_MMV_MAX");
    setenv("KVCHAT_CUDA_MMV", "f32", 1);
    be_backend *f32k = passes ? be_cuda_create(4, err, sizeof err) : NULL;
    unsetenv("KVCHAT_CUDA_MMV");
    setenv("KVCHAT_CUDA_MMV_INFLIGHT", "1", 1);   /* one row a warp: two rows ignore it */
    setenv("KVCHAT_CUDA_MMV_ROWS", "1", 1);
    be_backend *in1 = f32k ? be_cuda_create(4, err, sizeof err) : NULL;
    setenv("KVCHAT_CUDA_MMV_INFLIGHT", "2", 1);   /* a token's: the default by type is 2 or 4 */
    be_backend *in2 = in1 ? be_cuda_create(4, err, sizeof err) : NULL;
    setenv("KVCHAT_CUDA_MMV_INFLIGHT", "4", 1);
    be_backend *in4 = in2 ? be_cuda_create(4, err, sizeof err) : NULL;
    unsetenv("KVCHAT_CUDA_MMV_INFLIGHT");
    unsetenv("KVCHAT_CUDA_MMV_ROWS");
    setenv("KVCHAT_CUDA_MMV", "narrow", 1);
    be_backend *narrow = in4 ? be_cuda_create(4, err, sizeof err) : NULL;
    unsetenv("KVCHAT_CUDA_MMV");
    setenv("KVCHAT_CUDA_MMV_ROWS", "2", 1);
    be_backend *rows2 = narrow ? be_cuda_create(4, err, sizeof err) : NULL;
    unsetenv("KVCHAT_CUDA_MMV_ROWS");
    setenv("KVCHAT_CUDA_ATTN", "scalar", 1);
    be_backend *scal = rows2 ? be_cuda_create(4, err, sizeof err) : NULL;
    setenv("KVCHAT_CUDA_ATTN", "grouped", 1);
    be_backend *grp = scal ? be_cuda_create(4, err, sizeof err) : NULL;
    setenv("KVCHAT_CUDA_ATTN_ROWS", "2", 1);   /* the grouped kernel's rows a slot fetches a round (default 4) */
    be_backend *grp2 = grp ? be_cuda_create(4, err, sizeof err) : NULL;
    setenv("KVCHAT_CUDA_ATTN_ROWS", "8", 1);
    be_backend *grp8 = grp2 ? be_cuda_create(4, err, sizeof err) : NULL;
    unsetenv("KVCHAT_CUDA_ATTN_ROWS");
    setenv("KVCHAT_CUDA_ATTN", "flash", 1);
    be_backend *flsh = grp8 ? be_cuda_create(4, err, sizeof err) : NULL;
    unsetenv("KVCHAT_CUDA_ATTN");
    if (!tiles || !passes || !f32k || !in1 || !in2 || !in4 || !narrow || !rows2 || !scal || !grp || !grp2 ||
        !grp8 || !flsh) {
        fprintf(stderr, "gpu_bench: %s\n", err);
        return 1;
    }
    if (profile) {
        const int rc = profile_launches(dflt, in1, in2, grp, grp2);
        be_backend *all[] = { dflt, tiles, passes, f32k, in1, in2, in4, narrow, rows2, scal, grp, grp2, grp8, flsh };
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) be_free(all[i]);
        return rc;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        printf("device: %s, %d multiprocessors, %.0f MiB, L2 %d MiB\n\n", prop.name, prop.multiProcessorCount,
               (double)prop.totalGlobalMem / 1048576.0, prop.l2CacheSize >> 20);
    if (csv) fprintf(csv, "what,type,n_out,n_in,tokens,config,ms,GBps,of_copy\n");
    printf("| what | type | rows x cols | tokens | config | ms | GB/s | of copy |\n| --- | --- | --- | ---: | --- | ---: | ---: | ---: |\n");
    if (measure_copy()) return 1;

    /* activations: [512][14336] in, [512][14336] out, bound on both backends */
    const int64_t max_tok = 512, max_dim = 14336;
    size_t xbytes = sizeof(float) * (size_t)(max_tok * max_dim);
    float *x = malloc(xbytes), *y = malloc(xbytes), *y2 = malloc(xbytes), *y3 = malloc(xbytes), *y4 = malloc(xbytes);
    if (!x || !y || !y2 || !y3 || !y4) return 1;
    for (int64_t i = 0; i < max_tok * max_dim; i++) x[i] = frand();
    memset(y, 0, xbytes);
    memset(y2, 0, xbytes);
    memset(y3, 0, xbytes);
    memset(y4, 0, xbytes);
    be_backend *bes[9] = { dflt, tiles, passes, f32k, in1, narrow, rows2, in2, in4 };
    float *ys[9] = { y, y2, y3, y4, y4, y4, y4, y4, y4 };
    for (int k = 0; k < 9; k++) {
        if (be_bind(bes[k], x, xbytes, err, sizeof err) || be_bind(bes[k], ys[k], xbytes, err, sizeof err)) {
            fprintf(stderr, "gpu_bench: %s\n", err);
            return 1;
        }
        be_host_write(bes[k], x, xbytes);
    }

    const uint32_t types[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K,
                               GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_F16,  GGML_TYPE_BF16 };
    const int64_t shapes[][2] = { { 4096, 4096 }, { 14336, 4096 }, { 4096, 14336 } };   /* n_out, n_in */
    const int64_t decode_toks[] = { 1, 2, 4, 8 }, mid_toks[] = { 9, 16, 32, 64 };
    size_t n_types = quick ? 2 : sizeof types / sizeof *types, n_shapes = quick ? 1 : 3;
    void **keep = calloc(n_types * n_shapes, sizeof *keep);   /* the backends key weights by address */
    for (size_t ti = 0; ti < n_types; ti++)
        for (size_t si = 0; si < n_shapes; si++) {
            be_weight w;
            int64_t n_out = shapes[si][0], n_in = shapes[si][1];
            if (!(keep[ti * n_shapes + si] = make_weight(types[ti], n_in, n_out, &w))) {
                fprintf(stderr, "gpu_bench: cannot make a %s weight\n", quant_type_name(types[ti]));
                return 1;
            }
            const be_weight *wp = &w;
            for (int k = 0; k < (int)(sizeof bes / sizeof *bes); k++)
                if (bes[k]->ops->prepare && bes[k]->ops->prepare(bes[k], &wp, 1, err, sizeof err)) {
                    fprintf(stderr, "gpu_bench: %s\n", err);
                    return 1;
                }
            const char *tn = quant_type_name(types[ti]);
            double wbytes = (double)be_gpu_weight_bytes(types[ti], n_in, n_out);
            mm_arg a = { { &w, y }, x, 0 };
            for (size_t k = 0; k < 4; k++) {
                a.n_tok = decode_toks[k];
                double ms = time_calls(dflt, call_mm, &a, y);
                if (failed(dflt, "product")) return 1;
                row("product", tn, n_out, n_in, a.n_tok, "decode kernel", ms,
                    wbytes + 4.0 * (double)(a.n_tok * (n_in + n_out)));
                /* stage 0's kernel; stage 1's on one row a warp with 1 read in flight a lane, and
                 * for a token with 2 and 4 (the default: 4, 2 on Q4_K's wide path) and on two rows
                 * a warp; for more tokens (the default: dd_many_shape's) one row with 2 in flight
                 * (1 on F16/BF16) and two rows; for Q4_K/Q5_K the narrow items the wide path
                 * replaced */
                const int many = a.n_tok > 1;
                be_backend *alt[6] = { f32k, in1, many ? in2 : rows2, narrow, many ? rows2 : in2, in4 };
                const char *alt_name[6] = { "f32 decode kernel", "decode kernel 1 in flight",
                                            many ? "decode kernel 1 row a warp" : "decode kernel 2 rows a warp",
                                            "narrow decode kernel",
                                            many ? "decode kernel 2 rows a warp" : "decode kernel 2 in flight",
                                            "decode kernel 4 in flight" };
                for (int v = 0; v < 6; v++) {
                    if (v == 3 && !dd_wide_type(types[ti])) continue;
                    if (v == 5 && many) continue;   /* 4 in flight: a token's kernel */
                    mm_arg e = { { &w, y4 }, x, a.n_tok };
                    ms = time_calls(alt[v], call_mm, &e, y4);
                    if (failed(alt[v], "product")) return 1;
                    row("product", tn, n_out, n_in, e.n_tok, alt_name[v], ms,
                        wbytes + 4.0 * (double)(e.n_tok * (n_in + n_out)));
                }
            }
            for (size_t k = 0; k < (quick ? 1u : 4u); k++) {
                mm_arg p = { { &w, y3 }, x, mid_toks[k] };
                double ms = time_calls(passes, call_mm, &p, y3);
                mm_arg b = { { &w, y2 }, x, mid_toks[k] };
                double ms2 = time_calls(tiles, call_mm, &b, y2);
                if (failed(passes, "product") || failed(tiles, "product")) return 1;
                double bytes = wbytes + 4.0 * (double)(p.n_tok * (n_in + n_out));
                row("product", tn, n_out, n_in, p.n_tok, "decode kernel passes", ms, bytes);
                row("product", tn, n_out, n_in, p.n_tok, "tiles+cuBLAS", ms2, bytes);
            }
            a.n_tok = max_tok;
            a.mm.y = y;
            double ms = time_calls(dflt, call_mm, &a, y);
            if (failed(dflt, "product")) return 1;
            row("product", tn, n_out, n_in, a.n_tok, "prefill", ms, wbytes + 4.0 * (double)(a.n_tok * (n_in + n_out)));
        }

    /* q, k and v of a layer, one input: in one decode launch reading the input's codes (the
     * default, as after the op that wrote the input) and a launch each, each quantizing the input
     * (KVCHAT_CUDA_LAUNCHES=apart), at the 7B's and the default model's shapes; a call's time is
     * the host's issuing or the device's work, whichever is longer. apart's buffers are its own
     * (unbinding memory another backend page-locked would unlock it under that one). */
    setenv("KVCHAT_CUDA_LAUNCHES", "apart", 1);
    be_backend *apart = be_cuda_create(4, err, sizeof err);
    unsetenv("KVCHAT_CUDA_LAUNCHES");
    float *xa = malloc(xbytes), *ya = calloc(1, xbytes);
    if (!xa || !ya) return 1;
    memcpy(xa, x, xbytes);
    if (!apart || be_bind(apart, xa, xbytes, err, sizeof err) || be_bind(apart, ya, xbytes, err, sizeof err)) {
        fprintf(stderr, "gpu_bench: %s\n", err);
        return 1;
    }
    const struct {
        const char *name;
        uint32_t type;
        int64_t n_in, n_out[3];
    } qkv[] = { { "7B q/k/v", GGML_TYPE_Q4_K, 4096, { 4096, 1024, 1024 } },
                { "gemma3-270m q/k/v", GGML_TYPE_Q8_0, 640, { 1024, 256, 256 } } };
    void *qkv_keep[2][3];
    for (size_t qi = 0; qi < (quick ? 1u : 2u); qi++) {
        be_weight w3[3];
        const be_weight *wp3[3];
        double wbytes = 0;
        for (int i = 0; i < 3; i++) {
            if (!(qkv_keep[qi][i] = make_weight(qkv[qi].type, qkv[qi].n_in, qkv[qi].n_out[i], &w3[i]))) return 1;
            wp3[i] = &w3[i];
            wbytes += (double)be_gpu_weight_bytes(qkv[qi].type, qkv[qi].n_in, qkv[qi].n_out[i]);
        }
        if (dflt->ops->prepare(dflt, wp3, 3, err, sizeof err) || apart->ops->prepare(apart, wp3, 3, err, sizeof err)) {
            fprintf(stderr, "gpu_bench: %s\n", err);
            return 1;
        }
        for (int64_t nt = 1; nt <= 8; nt *= 8) {
            be_backend *two[2] = { dflt, apart };
            float *in[2] = { x, xa }, *out[2] = { y, ya };
            const char *cfg[2] = { "one launch reading codes", "a launch each quantizing" };
            for (int k = 0; k < 2; k++) {
                be_mm3_arg a3 = { { { &w3[0], out[k] }, { &w3[1], out[k] + 8 * 4096 }, { &w3[2], out[k] + 16 * 4096 } },
                                  in[k], nt };
                double ms = time_calls(two[k], call_mm3, &a3, out[k]);
                if (failed(two[k], "q, k and v")) return 1;
                double io = 4.0 * (double)(nt * (qkv[qi].n_in + qkv[qi].n_out[0] + qkv[qi].n_out[1] + qkv[qi].n_out[2]));
                row(qkv[qi].name, quant_type_name(qkv[qi].type), qkv[qi].n_out[0] + qkv[qi].n_out[1] + qkv[qi].n_out[2],
                    qkv[qi].n_in, nt, cfg[k], ms, wbytes + io);
            }
        }
    }
    be_unbind(apart, xa);
    be_unbind(apart, ya);
    be_free(apart);
    free(xa);
    free(ya);
    for (size_t qi = 0; qi < (quick ? 1u : 2u); qi++)
        for (int i = 0; i < 3; i++) free(qkv_keep[qi][i]);

    /* decode attention over per-KV-head page lists of 32 tokens */
    const struct {
        const char *name;
        int n_head, n_kv, D;
        int64_t ctx, n_q;
    } att[] = { { "7B", 32, 8, 128, 512, 1 },          { "7B", 32, 8, 128, 8192, 1 }, { "7B", 32, 8, 128, 32768, 1 },
                { "gemma3-270m", 4, 1, 256, 8192, 1 }, { "7B", 32, 8, 128, 8192, 512 },
                { "gemma3-270m", 4, 1, 256, 8192, 512 } };
    for (size_t ai = 0; ai < (quick ? 1u : sizeof att / sizeof *att); ai++) {
        int nh = att[ai].n_head, nkv = att[ai].n_kv, D = att[ai].D;
        int64_t ctx = att[ai].ctx, n_pages;
        be_kv_page *pages;
        uint16_t *kv;
        int32_t *pos;
        int64_t *hp;
        if (context_pages(nkv, D, ctx, &pages, &n_pages, &kv, &pos, &hp)) return 1;
        const int64_t nq = att[ai].n_q;
        const size_t qbytes = sizeof(float) * (size_t)(nq * nh * D);
        float *q = malloc(qbytes), *o = malloc(qbytes);
        int32_t *qp = malloc(sizeof(int32_t) * (size_t)nq);
        if (!q || !o || !qp) return 1;
        for (int64_t i = 0; i < nq * nh * D; i++) q[i] = 0.1f * frand(), o[i] = 0;
        for (int64_t t = 0; t < nq; t++) qp[t] = (int32_t)(ctx - nq + t);
        be_backend *kern[5] = { grp, scal, flsh, grp2, grp8 };
        static const char *const kname[5] = { "grouped", "scalar", "flash", "grouped", "grouped" };
        static const char *const kmore[5] = { "", "", "", " (2 rows a round)", " (8 rows a round)" };
        for (int k = 0; k < 5; k++) {
            if (k == 2 && nq < AF_MIN_Q) continue;   /* the flash kernel takes prefill chunks only */
            if (k >= 3 && nq > 1) continue;          /* rows a round: decode's */
            if (be_bind(kern[k], q, qbytes, err, sizeof err) || be_bind(kern[k], o, qbytes, err, sizeof err)) {
                fprintf(stderr, "gpu_bench: %s\n", err);
                return 1;
            }
            be_host_write(kern[k], q, qbytes);
            be_attn a = { q, nq, qp, nh, nkv, D, pages, n_pages, hp, 0, o, NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
            const uint64_t flash0 = be_cuda_flash_calls(kern[k]);
            double ms = time_calls(kern[k], call_attn, &a, o);
            if (failed(kern[k], "attention")) return 1;
            if (k == 2 && be_cuda_flash_calls(kern[k]) == flash0) {   /* fell back: not the flash kernel's figure */
                fprintf(stderr, "gpu_bench: attention %s, %lld queries: the flash kernel did not run\n", att[ai].name,
                        (long long)nq);
                be_unbind(kern[k], q);
                be_unbind(kern[k], o);
                continue;
            }
            char shape[64], config[64];
            snprintf(shape, sizeof shape, "attention %s", att[ai].name);
            snprintf(config, sizeof config, "%s %lld %s%s", kname[k], (long long)nq,
                     nq > 1 ? "queries" : "query", kmore[k]);
            row(shape, "f16", nh, D, ctx, config, ms, 4.0 * (double)(ctx * nkv * D));
            be_unbind(kern[k], q);
            be_unbind(kern[k], o);
        }
        free(q);
        free(o);
        free(qp);
        free(pages);
        free(kv);
        free(pos);
        free(hp);
    }
    /* a batch's decode attention: 8 sequences, each over a context of its own (pages of its own:
     * at the 7B shape 128 MiB in all, more than the L2 holds), each under a list name of its own,
     * joined in one launch (attention_seqs, a batch's decode step) and a call each (as before) */
    const struct {
        const char *name;
        int n_head, n_kv, D;
    } bat[] = { { "7B", 32, 8, 128 }, { "gemma3-270m", 4, 1, 256 } };
    for (size_t bi = 0; bi < (quick ? 0u : sizeof bat / sizeof *bat); bi++) {
        enum { NS = 8 };
        const int nh = bat[bi].n_head, nkv = bat[bi].n_kv, D = bat[bi].D;
        const int64_t ctx = 4096, HD = (int64_t)nh * D;
        int64_t n_pages[NS];
        be_kv_page *pages[NS];
        uint16_t *kv[NS];
        int32_t *pos[NS];
        int64_t *hp[NS];
        for (int s2 = 0; s2 < NS; s2++)
            if (context_pages(nkv, D, ctx, &pages[s2], &n_pages[s2], &kv[s2], &pos[s2], &hp[s2])) return 1;
        const size_t qbytes = sizeof(float) * (size_t)(NS * HD);
        float *q = malloc(qbytes), *o = malloc(qbytes);
        if (!q || !o) return 1;
        for (int64_t i = 0; i < NS * HD; i++) q[i] = 0.1f * frand(), o[i] = 0;
        int32_t qp[NS];
        seqs_arg sa = { .n = NS };
        for (int s2 = 0; s2 < NS; s2++) {
            qp[s2] = (int32_t)(ctx - 1);
            sa.a[s2] = (be_attn){ .q = q + s2 * HD, .n_q = 1, .q_pos = &qp[s2], .n_head = nh, .n_head_kv = nkv,
                                  .head_dim = D, .pages = pages[s2], .n_pages = n_pages[s2], .head_pages = hp[s2],
                                  .out = o + s2 * HD, .table = (1ull << 40) + bi * NS + (uint64_t)s2 };
        }
        if (be_bind(grp, q, qbytes, err, sizeof err) || be_bind(grp, o, qbytes, err, sizeof err)) {
            fprintf(stderr, "gpu_bench: %s\n", err);
            return 1;
        }
        be_host_write(grp, q, qbytes);
        static const char *const how[2] = { "joined", "a call each" };
        for (int j = 0; j < 2; j++) {
            double ms = time_calls(grp, j ? call_each : call_seqs, &sa, o);
            if (failed(grp, "batch attention")) return 1;
            char shape[64], config[64];
            snprintf(shape, sizeof shape, "attention %s", bat[bi].name);
            snprintf(config, sizeof config, "grouped %d sequences %s", NS, how[j]);
            row(shape, "f16", nh, D, ctx, config, ms, NS * 4.0 * (double)(ctx * nkv * D));
        }
        be_unbind(grp, q);
        be_unbind(grp, o);
        free(q);
        free(o);
        for (int s2 = 0; s2 < NS; s2++) {
            free(pages[s2]);
            free(kv[s2]);
            free(pos[s2]);
            free(hp[s2]);
        }
    }
    /* the sampler's candidates */
    {
        const int32_t nv = 262144;
        float *lrow = calloc(2 * (size_t)nv, sizeof(float)), val[BE_PICK_MAX];   /* the row, then zeros */
        int32_t id[BE_PICK_MAX], pen[64];
        if (!lrow || be_bind(dflt, lrow, sizeof(float) * 2 * (size_t)nv, err, sizeof err)) {
            fprintf(stderr, "gpu_bench: %s\n", lrow ? err : "out of memory");
            return 1;
        }
        be_host_write(dflt, lrow, sizeof(float) * 2 * (size_t)nv);
        for (int32_t i = 0; i < nv; i++) lrow[i] = 8.0f * frand();
        for (int i = 0; i < 64; i++) pen[i] = i * 4093;
        be_backend *host = be_cpu_create(1, err, sizeof err);
        if (!host) {
            fprintf(stderr, "gpu_bench: %s\n", err);
            return 1;
        }
        static const struct { int32_t k; int entropy; const char *name; } pk[] = {
            { 1, 0, "greedy" }, { 40, 1, "top-k 40 + entropy" }, { 256, 1, "top-k 256 + entropy" } };
        for (int c = 0; c < 3; c++) {
            be_pick p = { lrow, nv, 0, pen, c ? 64 : 0, 1.2f, pk[c].k, pk[c].entropy, 0.8f, val, id, 0, 0, 0 };
            double ms = time_calls(dflt, call_pick, &p, lrow);
            if (failed(dflt, "pick")) return 1;
            char config[64];
            snprintf(config, sizeof config, "device pick %s", pk[c].name);
            row("pick", "f32", nv, 1, 1, config, ms, 4.0 * nv);
            ms = time_calls(host, call_pick, &p, lrow);
            snprintf(config, sizeof config, "host pick %s", pk[c].name);
            row("pick", "f32", nv, 1, 1, config, ms, 4.0 * nv);
        }
        be_pick p = { lrow, nv, 0, NULL, 0, 1.0f, 1, 0, 0, val, id, 0, 0, 0 };
        double ms = time_calls(dflt, call_row_back, &p, lrow);
        if (failed(dflt, "row download")) return 1;
        row("pick", "f32", nv, 1, 1, "row written and downloaded", ms, 4.0 * nv);
        be_unbind(dflt, lrow);
        be_free(host);
        free(lrow);
    }
    {
        /* Quest's bounds and top 32 a layer at the 7B shape (8 KV heads, 4 queries each, head
         * dimension 128, pages of 32): the steady state of a decode step, every summary on the
         * device already and the shape kept, beside the CPU backend on one thread and on all */
        enum { H = 8, G = 4, D = 128 };
        static const int64_t ctxs[] = { 8192, 32768 };
        be_backend *host1 = be_cpu_create(1, err, sizeof err), *hostn = be_cpu_create(0, err, sizeof err);
        float *q = malloc(sizeof(float) * H * G * D);
        if (!host1 || !hostn || !q) {
            fprintf(stderr, "gpu_bench: %s\n", q ? err : "out of memory");
            return 1;
        }
        for (int i = 0; i < H * G * D; i++) q[i] = frand() - 0.5f;
        for (size_t ci = 0; ci < (quick ? 1u : 2u); ci++) {
            int64_t per = ctxs[ci] / 32 - 1, n = H * per;   /* every page but the current one */
            float *mm = malloc(sizeof(float) * (size_t)(n * 2 * D));
            be_summary *sum = malloc(sizeof *sum * (size_t)n);
            if (!mm || !sum) {
                fprintf(stderr, "gpu_bench: out of memory\n");
                return 1;
            }
            for (int64_t i = 0; i < n * 2 * D; i++) mm[i] = frand() - 0.5f;
            int64_t off[H + 1];
            for (int h = 0; h <= H; h++) off[h] = h * per;
            for (int64_t i = 0; i < n; i++) sum[i] = (be_summary){ .mn = mm + i * 2 * D, .mx = mm + i * 2 * D + D, .gen = (uint64_t)i + 1, .n = 32 };
            int32_t best[H * 32], nb[H];
            static float unbound;
            be_bounds r = { q, H, G, D, sum, off, 1 + ci, 1, 32, best, nb, NULL, NULL, 0, 0, 0, 0, NULL };   /* a list a context */
            char config[64];
            be_backend *on[3] = { dflt, host1, hostn };
            static const char *const names[3] = { "device", "host 1 thread", "host all threads" };
            for (int k = 0; k < 3; k++) {
                double ms = time_calls(on[k], call_bounds, &r, &unbound);
                if (failed(on[k], "bounds")) return 1;
                snprintf(config, sizeof config, "%s bounds + top 32 at %lld", names[k], (long long)ctxs[ci]);
                row("bounds", "f32", n, D, G, config, ms, 8.0 * D * (double)n);
            }
            free(mm);
            free(sum);
        }
        be_free(host1);
        be_free(hostn);
        free(q);
    }
    {
        /* the attention mass at the 7B shape (8 KV heads of 4 query heads), pages of 32, a layer's
         * KV heads in one call as the policies make it; the pages go up
         * at the first call and are current after it, as a policy's are between chunks */
        enum { G = 4, D = 128, P = 32 };
        static const int64_t calls[][3] = { { 32, 1536, 8 }, { 32, 3072, 8 }, { 32, 32768, 8 }, { 512, 2048, 8 } };
        be_backend *host1 = be_cpu_create(1, err, sizeof err), *hostn = be_cpu_create(0, err, sizeof err);
        if (!host1 || !hostn) {
            fprintf(stderr, "gpu_bench: %s\n", err);
            return 1;
        }
        for (size_t si = 0; si < sizeof calls / sizeof *calls && !(quick && si > 0); si++) {
            const int64_t n_q = calls[si][0], Th = calls[si][1], H = calls[si][2], T = Th * H, np = T / P;
            uint16_t *keys = malloc(sizeof(uint16_t) * (size_t)(T * D));
            int32_t *pos = malloc(sizeof(int32_t) * (size_t)Th);
            be_kv_page *pages = malloc(sizeof *pages * (size_t)np);
            int64_t hp[9];
            float *q = malloc(sizeof(float) * (size_t)(n_q * H * G * D)), *acc = calloc((size_t)T, sizeof(float));
            float *work = malloc(sizeof(float) * (size_t)(64 * Th));
            if (!keys || !pos || !pages || !q || !acc || !work) {
                fprintf(stderr, "gpu_bench: out of memory\n");
                return 1;
            }
            for (int64_t i = 0; i < T * D; i++) keys[i] = quant_f32_to_fp16(frand() * 0.5f);
            for (int64_t i = 0; i < Th; i++) pos[i] = (int32_t)i;
            for (int64_t i = 0; i < n_q * H * G * D; i++) q[i] = frand() * 0.1f;
            for (int64_t i = 0; i < np; i++)   /* head i / (Th / P)'s pages, its positions from 0 */
                pages[i] = (be_kv_page){ .k = keys + i * P * D, .v = keys + i * P * D, .pos = pos + (i % (Th / P)) * P,
                                         .n = P, .stride = D, .gen = ((uint64_t)(si + 1) << 40) + (uint64_t)i,
                                         .cap = P };
            for (int h = 0; h <= H; h++) hp[h] = h * (Th / P);
            be_mass m = { q, n_q, (int64_t)H * G * D, Th - n_q, 0, G, D, pages, np, acc,
                          work, 64 * Th, 0x3A55u + si, (int)H, H > 1 ? hp : NULL };
            be_backend *on[3] = { dflt, host1, hostn };
            static const char *const names[3] = { "device", "host 1 thread", "host all threads" };
            static float unbound;
            char config[160];
            for (int k = 0; k < 3; k++) {
                double ms = time_calls(on[k], call_mass, &m, &unbound);
                if (failed(on[k], "attention mass")) return 1;
                snprintf(config, sizeof config, "%s mass of %lld rows x %d heads over %lld x %lld KV heads", names[k],
                         (long long)n_q, G, (long long)Th, (long long)H);
                row("attn_mass", "f16", T, D, n_q * G, config, ms, 2.0 * D * (double)T);
            }
            free(keys);
            free(pos);
            free(pages);
            free(q);
            free(acc);
            free(work);
        }
        be_free(host1);
        be_free(hostn);
    }
    for (int k = 0; k < (int)(sizeof bes / sizeof *bes); k++) {
        be_unbind(bes[k], x);
        be_unbind(bes[k], ys[k]);
    }
    be_free(dflt);
    be_free(tiles);
    be_free(passes);
    be_free(f32k);
    be_free(in1);
    be_free(in2);
    be_free(in4);
    be_free(narrow);
    be_free(rows2);
    be_free(scal);
    be_free(grp);
    be_free(grp2);
    be_free(grp8);
    be_free(flsh);
    for (size_t i = 0; i < n_types * n_shapes; i++) free(keep[i]);
    free(keep);
    free(x);
    free(y);
    free(y2);
    free(y3);
    free(y4);
    if (csv) fclose(csv);
    return 0;
}
