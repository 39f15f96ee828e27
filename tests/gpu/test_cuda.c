/* test_cuda.c - the CUDA backend against the CPU backend (`make test-gpu`, on a machine with an
 * NVIDIA GPU; CI only builds it). Per op on random inputs of awkward sizes: matrix products of every
 * weight type the tiny models carry and of every type on random weights (decode products of up to 8
 * tokens read the stored bytes and give the bits of kernels/decode_dot.h's host simulation; every
 * path within 1e-2 of the row's largest magnitude), the device holding quantized weights at
 * their file size, attention over
 * pages of odd lengths with masks, merged-token bias, sliding windows and per-KV-head page lists
 * (f32 math on both: 2e-3), the device copies of pages kept right through appends, truncation and
 * reuse; then whole forward passes: the tiny-model reference gates of the CPU unit tests (ref_gate.c,
 * same tolerances) on the GPU, and both backends under a policy that evicts, with the same top-1 at
 * every step and logits within 1e-2 relative (F16 models) or the top logit within the reference's
 * 3e-2 (quantized models). The seed is printed (GPU_SEED replays it). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/page_list.h"
#include "engine/kvcache.h"
#include "engine/policy/policy.h"
#include "common/quant.h"
#include "kernels/decode_dot.h"
#include "kernels/op_profile.h"
#include "kernels/attn_group.h"
#include "kernels/attn_flash.h"
#include "kernels/lsh_kernels.h"
#include "engine/generate.h"
#include "engine/run.h"
#include "engine/tokenizer.h"

#include "tests/fwd_fixture.h"
#include "tests/ref_gate.h"
#include "tests/test_rng.h"

/* KVCHAT_TESTDATA points elsewhere on a GPU machine that has only part of the test data: a tiny
 * model missing there is then skipped, with a warning, instead of failing */
static const char *testdata(void)
{
    const char *env = getenv("KVCHAT_TESTDATA");
    return env ? env : "../shared/testdata";
}
static int model_present(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f) { fclose(f); return 1; }
    if (!getenv("KVCHAT_TESTDATA")) return 1; /* let model_load report it */
    cr_log_warn("%s: not present, skipped", path);
    return 0;
}

static void seed_rng(const char *what) { test_rng_seed(what, "GPU_SEED", (uint64_t)time(NULL) * 2654435761u); }

static be_backend *cpu, *gpu;
static const char *files[] = { "tiny-gemma3-f16.gguf", "tiny-gemma3-q4_k_m.gguf", "tiny-llama-f16.gguf",
                               "tiny-llama-q4_k_m.gguf" };

static void setup(void)
{
    char err[512];
    cpu = be_cpu_create(2, err, sizeof err);
    cr_assert(cpu, "%s", err);
    gpu = be_cuda_create(2, err, sizeof err);
    cr_assert(gpu, "%s (these tests need an NVIDIA GPU)", err);
}

static void teardown(void)
{
    be_free(gpu);
    be_free(cpu);
}

TestSuite(cuda, .init = setup, .fini = teardown);

/* A CUDA backend created with one environment setting (KVCHAT_CUDA_MMV=0: every product through
 * cuBLAS; KVCHAT_CUDA_MMV_MAX=N: the decode kernel's token limit), which the backend reads once. */
static be_backend *gpu_with(const char *var, const char *value)
{
    char err[512];
    setenv(var, value, 1);
    be_backend *b = be_cuda_create(2, err, sizeof err);
    unsetenv(var);
    cr_assert(b, "%s", err);
    return b;
}

/* The GPU backend refuses var=value in one line whose text holds `says`. */
static void gpu_refuses(const char *var, const char *value, const char *says)
{
    char err[512] = "";
    setenv(var, value, 1);
    be_backend *b = be_cuda_create(2, err, sizeof err);
    unsetenv(var);
    cr_expect_null(b, "%s=%s accepted", var, value);
    cr_expect(strstr(err, says), "%s", err);
    if (b) be_free(b);
}

/* largest |a - b| (infinite when either is NaN) */
static double max_abs_diff(const float *a, const float *b, int64_t n)
{
    double d = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (e > d || isnan(e)) d = isnan(e) ? INFINITY : e;
    }
    return d;
}

static double rel_diff(const float *a, const float *b, int64_t n)
{
    double worst = 0, scale = 1e-6;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > scale) scale = fabs(b[i]);
    }
    return worst / scale;
}

/* tiny model files[fi], loaded; NULL when absent from a partial KVCHAT_TESTDATA (see model_present) */
static model *load_tiny(size_t fi)
{
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/tiny/%s", testdata(), files[fi]);
    if (!model_present(path)) return NULL;
    model *m;
    cr_assert(model_load(&m, path, NULL, err, sizeof err) == 0, "%s", err);
    return m;
}

/* step[i] = the largest |x| of value i's aligned block of blk values, over 127: the 8-bit step. */
static void block_steps(const float *x, int64_t n, int64_t blk, double *step)
{
    for (int64_t b = 0; b < n; b += blk) {
        double a = 0;
        for (int64_t j = b; j < b + blk; j++) a = fmax(a, fabs((double)x[j]));
        for (int64_t j = b; j < b + blk; j++) step[j] = a / 127.0;
    }
}

/* How many outputs of y (nt x n_out) lie further from the exact product than rounding the
 * activations to 8-bit codes allows. worst: the kernels' own codes (scale amax/127 per 32), every
 * activation at most half a step off: |y - exact| <= sum |w_i| d_i / 2 (+ f32 sums, 1e-5 of the sum
 * of magnitudes). Otherwise y is another 8-bit-coded product (the CPU backend's: a scale per 32, or
 * per 256 for the K-quants, the Q8_0 scale rounded to f16) and the difference ydiff - y of the two
 * is held to six standard deviations of the two roundings' noise, each activation's error uniform
 * within its step (variance d^2 / 12; the 256-value step bounds either backend's), plus 2^-10 of the
 * sum of magnitudes for the f16 scale. */
static int64_t coding_misses(const be_weight *w, const float *x, int64_t nt, const float *y, const float *ydiff)
{
    const int64_t n_in = w->n_in, n_out = w->n_out, big = n_in % 256 ? 32 : 256;
    float *row = malloc(sizeof(float) * (size_t)n_in);
    double *d32 = malloc(sizeof(double) * (size_t)(nt * n_in)), *dbig = malloc(sizeof(double) * (size_t)(nt * n_in));
    block_steps(x, nt * n_in, 32, d32);
    block_steps(x, nt * n_in, big, dbig);
    int64_t bad = 0;
    for (int64_t r = 0; r < n_out; r++) {
        quant_dequant_row(w->type, (const uint8_t *)w->data + w->row_bytes * (size_t)r, row, n_in);
        for (int64_t t = 0; t < nt; t++) {
            double exact = 0, mag = 0, worst = 0, v32 = 0, vbig = 0;
            for (int64_t i = 0; i < n_in; i++) {
                const double wi = row[i], xi = x[t * n_in + i], a = d32[t * n_in + i], b = dbig[t * n_in + i];
                exact += wi * xi;
                mag += fabs(wi * xi);
                worst += fabs(wi) * a / 2;
                v32 += wi * wi * a * a / 12;
                vbig += wi * wi * b * b / 12;
            }
            const double got = y[t * n_out + r];
            const double err = ydiff ? fabs(got - ydiff[t * n_out + r]) : fabs(got - exact);
            const double tol = ydiff ? 6 * (sqrt(v32) + sqrt(vbig)) + ldexp(mag, -10) + 1e-5 * mag : worst + 1e-5 * mag;
            if (!(err <= tol)) {
                if (!bad)
                    cr_log_error("%s row %lld token %lld: %.9g, %s %.9g, allowed %.3g", quant_type_name(w->type),
                                 (long long)r, (long long)t, got, ydiff ? "the other" : "exact",
                                 ydiff ? ydiff[t * n_out + r] : exact, tol);
                bad++;
            }
        }
    }
    free(row);
    free(d32);
    free(dbig);
    return bad;
}

static int64_t host_kernel_mismatches(const be_weight *w, const float *x, int64_t nt, const float *y, int wide);

Test(cuda, matmul_of_every_tiny_model_weight_equals_the_cpu)
{
    seed_rng("matmul");
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        model *m = load_tiny(fi);
        if (!m) continue;
        const int64_t toks[] = { 1, 3, 17 };
        for (int il = 0; il < m->hp.n_layer; il++) {
            const model_layer *L = &m->layers[il];
            const be_weight *ws[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
            for (size_t wi = 0; wi < 7; wi++) {
                const be_weight *w = ws[wi];
                for (size_t ti = 0; ti < 3; ti++) {
                    int64_t nt = toks[ti];
                    float *x = malloc(sizeof(float) * (size_t)(nt * w->n_in));
                    float *y0 = malloc(sizeof(float) * (size_t)(nt * w->n_out));
                    float *y1 = malloc(sizeof(float) * (size_t)(nt * w->n_out));
                    for (int64_t i = 0; i < nt * w->n_in; i++) x[i] = frand(-1, 1);
                    for (int64_t i = 0; i < nt * w->n_out; i++) y1[i] = NAN;
                    be_mm a = { w, y0 }, b = { w, y1 };
                    cpu->ops->matmul(cpu, &a, 1, x, nt);
                    gpu->ops->matmul(gpu, &b, 1, x, nt);
                    if (nt <= QB_MAX_TOK && dd_integer_type(w->type) && be_gpu_weight_type(w->type, w->n_in) == w->type) {
                        /* both round the activations to 8-bit codes, each its own way */
                        cr_expect(host_kernel_mismatches(w, x, nt, y1, 1) == 0, "%s layer %d weight %zu (%s) tokens %lld",
                                  files[fi], il, wi, quant_type_name(w->type), (long long)nt);
                        cr_expect(coding_misses(w, x, nt, y1, y0) == 0,
                                  "%s layer %d weight %zu (%s) tokens %lld: GPU and CPU further apart than their rounding",
                                  files[fi], il, wi, quant_type_name(w->type), (long long)nt);
                    } else {
                        double d = rel_diff(y1, y0, nt * w->n_out);
                        cr_expect(d < 1e-2, "%s layer %d weight %zu (%s) tokens %lld: relative difference %g", files[fi],
                                  il, wi, quant_type_name(w->type), (long long)nt, d);
                    }
                    free(x);
                    free(y0);
                    free(y1);
                }
            }
        }
        model_free(m);
    }
}

/* A random weight of type `type`: rows of N(0, 1)-ish values quantized by the reference quantizer. */
static be_weight random_weight(uint32_t type, int64_t n_in, int64_t n_out, void **data)
{
    size_t rb = quant_row_size(type, n_in);
    uint8_t *d = malloc(rb * (size_t)n_out);
    float *row = malloc(sizeof(float) * (size_t)n_in);
    for (int64_t r = 0; r < n_out; r++) {
        float scale = frand(0.01f, 2.0f);
        for (int64_t i = 0; i < n_in; i++) row[i] = scale * (frand(-1, 1) + frand(-1, 1) + frand(-1, 1));
        cr_assert(quant_quantize_row(type, row, d + rb * (size_t)r, n_in) == 0);
    }
    free(row);
    *data = d;
    be_weight w = { d, type, n_in, n_out, rb };
    return w;
}

/* Weights a test made, freed once no backend holds copies of them: a backend keys its copies by
 * the host address, so a new weight at a freed one's address would be multiplied as the old one.
 * free_kept_weights makes the shared GPU backend again first (the test's other backends are freed
 * by then). */
static void *kept_weights[128];
static int n_kept_weights;

static void keep_weight(void *data)
{
    cr_assert_lt(n_kept_weights, 128);
    kept_weights[n_kept_weights++] = data;
}

static void free_kept_weights(void)
{
    char err[512];
    be_free(gpu);
    gpu = be_cuda_create(2, err, sizeof err);
    cr_assert(gpu, "%s", err);
    for (int i = 0; i < n_kept_weights; i++) free(kept_weights[i]);
    n_kept_weights = 0;
}

/* largest |y - exact| relative to the largest |exact|, exact = the dequantized weight times x in double */
static double exact_diff(const be_weight *w, const float *x, int64_t nt, const float *y)
{
    float *row = malloc(sizeof(float) * (size_t)w->n_in);
    double worst = 0, scale = 1e-30;
    for (int64_t r = 0; r < w->n_out; r++) {
        quant_dequant_row(w->type, (const uint8_t *)w->data + w->row_bytes * (size_t)r, row, w->n_in);
        for (int64_t t = 0; t < nt; t++) {
            double e = 0;
            for (int64_t i = 0; i < w->n_in; i++) e += (double)row[i] * x[t * w->n_in + i];
            double d = fabs(y[t * w->n_out + r] - e);
            if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
            if (fabs(e) > scale) scale = fabs(e);
        }
    }
    free(row);
    return worst / scale;
}

/* How many of y's nt x n_out outputs differ, bit for bit, from the decode kernels' result computed on
 * the host (kernels/decode_dot.h: the same 8-bit codes, lanes and order of sums; Q4_K and Q5_K by
 * the wide path when `wide`, the backends' default), in passes of QB_MAX_TOK tokens; the first
 * difference is logged. */
static int64_t host_kernel_mismatches(const be_weight *w, const float *x, int64_t nt, const float *y, int wide)
{
    const int64_t n_in = w->n_in, n_out = w->n_out;
    int8_t *xq = malloc((size_t)(nt * n_in));
    float *xd = malloc(sizeof(float) * (size_t)(nt * n_in / DD_QBLOCK));
    float *xs = malloc(sizeof(float) * (size_t)(nt * n_in / DD_QBLOCK));
    dd_quantize(x, nt * n_in, xq, xd, xs);
    int64_t bad = 0;
    for (int64_t r = 0; r < n_out; r++) {
        const uint8_t *row = (const uint8_t *)w->data + w->row_bytes * (size_t)r;
        for (int64_t t0 = 0; t0 < nt; t0 += QB_MAX_TOK) {
            const int np = (int)(nt - t0 < QB_MAX_TOK ? nt - t0 : QB_MAX_TOK);
            float want[QB_MAX_TOK];
            dd_warp_row(w->type, row, n_in, x + t0 * n_in, xq + t0 * n_in, xd + t0 * n_in / DD_QBLOCK,
                        xs + t0 * n_in / DD_QBLOCK, np, 1, wide, want);
            for (int t = 0; t < np; t++) {
                const float got = y[(t0 + t) * n_out + r];
                if (memcmp(&got, &want[t], sizeof got) && !(isnan(got) && isnan(want[t]))) {   /* NaN bits differ */
                    if (!bad)
                        cr_log_error("%s row %lld token %lld: the device %.9g, the host %.9g", quant_type_name(w->type),
                                     (long long)r, (long long)(t0 + t), got, want[t]);
                    bad++;
                }
            }
        }
    }
    free(xq);
    free(xd);
    free(xs);
    return bad;
}

/* Every weight type, kept as stored (Q4_0 ... Q6_K, F16, BF16) or converted at load (F32, Q4_1, Q5_1),
 * at token counts on both sides of the decode kernels' limit, against a double-precision product of
 * the reference dequantizer's weights: the decode kernels of quantized types (8-bit activation
 * codes) within their coding bound (coding_misses), every other path within 1e-2 of the largest
 * output (the cuBLAS path rounds weights and activations to f16). The decode kernels
 * (kernels/decode_dot.h; also in passes of 8 up to 64 tokens) must give the bits of their host
 * simulation, which the unit tests hold to double-precision products;
 * stage 0's f32 kernel (KVCHAT_CUDA_MMV=f32: exact weights times f32 activations) within 1e-4.
 * (Not against the CPU backend: it rounds the activations to 8-bit blocks with coarser scales, and
 * is itself up to about 1e-2 from the exact product on long rows; measured on an H200 it, not the
 * GPU, made a 14336-long Q5_0 row miss that bound.) Then the same through cuBLAS alone
 * (KVCHAT_CUDA_MMV=0) and with activations 4 bytes off 16-byte alignment. */
Test(cuda, matmul_of_every_weight_type_equals_the_exact_product)
{
    seed_rng("weight types");
    char err[512];
    be_backend *gemm_only = gpu_with("KVCHAT_CUDA_MMV", "0");
    be_backend *grouped = gpu_with("KVCHAT_CUDA_MMV_MAX", "64");   /* up to 64 tokens in passes of 8 */
    be_backend *f32k = gpu_with("KVCHAT_CUDA_MMV", "f32");           /* stage 0's decode kernel */
    const uint32_t types[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                               GGML_TYPE_Q6_K, GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_F32,  GGML_TYPE_Q4_1,
                               GGML_TYPE_Q5_1 };
    const int64_t shapes[][2] = { { 256, 17 }, { 640, 300 }, { 2304, 33 }, { 4096, 64 }, { 14336, 5 } };
    const int64_t toks[] = { 1, 2, 3, 5, 8, 9, 33, 64, 65 };
    /* every weight stays allocated until the backends are gone: they key their copies by address */
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            uint32_t type = types[ti];
            int64_t n_in = shapes[si][0], n_out = shapes[si][1];
            int64_t blck;
            quant_block_geometry(type, &blck, NULL);
            if (n_in % blck) continue;
            void *data;
            be_weight w = random_weight(type, n_in, n_out, &data);
            for (size_t k = 0; k < sizeof toks / sizeof *toks; k++) {
                int64_t nt = toks[k];
                float *x = malloc(sizeof(float) * (size_t)(nt * n_in + 1));
                float *y1 = malloc(sizeof(float) * (size_t)(nt * n_out));
                float *y2 = malloc(sizeof(float) * (size_t)(nt * n_out)), *y3 = malloc(sizeof(float) * (size_t)(nt * n_out));
                for (int64_t i = 0; i < nt * n_in + 1; i++) x[i] = frand(-1, 1);
                for (int64_t i = 0; i < nt * n_out; i++) y1[i] = y2[i] = y3[i] = NAN;
                be_mm b = { &w, y1 }, c = { &w, y2 }, g = { &w, y3 };
                gpu->ops->matmul(gpu, &b, 1, x, nt);
                gemm_only->ops->matmul(gemm_only, &c, 1, x, nt);
                grouped->ops->matmul(grouped, &g, 1, x, nt);
                cr_assert(!be_failed(gpu, err, sizeof err) && !be_failed(gemm_only, err, sizeof err) &&
                              !be_failed(grouped, err, sizeof err),
                          "%s", err);
                const char *tn = quant_type_name(type);
                const int native = be_gpu_weight_type(type, n_in) == type, coded = native && dd_integer_type(type);
                /* the 8-bit paths against their coding bound, the others (f16 through cuBLAS, f32
                 * activations for F16/BF16) within 1e-2 of the largest output */
                if (coded && nt <= QB_MAX_TOK)
                    cr_expect(coding_misses(&w, x, nt, y1, NULL) == 0, "%s %lld x %lld, %lld tokens: GPU", tn,
                              (long long)n_out, (long long)n_in, (long long)nt);
                else
                    cr_expect(exact_diff(&w, x, nt, y1) < 1e-2, "%s %lld x %lld, %lld tokens: GPU %g from exact", tn,
                              (long long)n_out, (long long)n_in, (long long)nt, exact_diff(&w, x, nt, y1));
                double d = exact_diff(&w, x, nt, y2);
                cr_expect(d < 1e-2, "%s %lld x %lld, %lld tokens, cuBLAS only: %g from exact", tn, (long long)n_out,
                          (long long)n_in, (long long)nt, d);
                if (coded && nt <= 64)
                    cr_expect(coding_misses(&w, x, nt, y3, NULL) == 0, "%s %lld x %lld, %lld tokens, passes up to 64",
                              tn, (long long)n_out, (long long)n_in, (long long)nt);
                else
                    cr_expect(exact_diff(&w, x, nt, y3) < 1e-2, "%s %lld x %lld, %lld tokens, passes up to 64: %g",
                              tn, (long long)n_out, (long long)n_in, (long long)nt, exact_diff(&w, x, nt, y3));
                if (native && nt > 8 && nt <= 64)   /* passes of 8 tokens: each as one */
                    cr_expect(host_kernel_mismatches(&w, x, nt, y3, 1) == 0,
                              "%s %lld x %lld, %lld tokens: the decode kernels' passes differ from the host's", tn,
                              (long long)n_out, (long long)n_in, (long long)nt);
                if (native && nt <= 8) {
                    cr_expect(host_kernel_mismatches(&w, x, nt, y1, 1) == 0,
                              "%s %lld x %lld, %lld tokens: the decode kernels differ from the host's", tn,
                              (long long)n_out, (long long)n_in, (long long)nt);
                    for (int64_t i = 0; i < nt * n_out; i++) y3[i] = NAN;
                    be_mm f = { &w, y3 };
                    f32k->ops->matmul(f32k, &f, 1, x, nt);
                    cr_assert(!be_failed(f32k, err, sizeof err), "%s", err);
                    d = exact_diff(&w, x, nt, y3);
                    cr_expect(d < 1e-4, "%s %lld x %lld, %lld tokens: the f32 decode kernel is %g from exact", tn,
                              (long long)n_out, (long long)n_in, (long long)nt, d);
                    /* activations that are not 16-byte aligned on the device (a bound buffer read 4
                     * bytes in) */
                    float *xb = malloc(sizeof(float) * (size_t)(nt * n_in + 1));
                    memcpy(xb, x, sizeof(float) * (size_t)(nt * n_in + 1));
                    cr_assert(be_bind(gpu, xb, sizeof(float) * (size_t)(nt * n_in + 1), err, sizeof err) == 0, "%s", err);
                    be_host_write(gpu, xb, sizeof(float) * (size_t)(nt * n_in + 1));
                    for (int64_t i = 0; i < nt * n_out; i++) y1[i] = NAN;
                    gpu->ops->matmul(gpu, &b, 1, xb + 1, nt);
                    be_unbind(gpu, xb);
                    free(xb);
                    cr_expect(host_kernel_mismatches(&w, x + 1, nt, y1, 1) == 0, "%s: misaligned activations", tn);
                }
                free(x);
                free(y1);
                free(y2);
                free(y3);
            }
            keep_weight(data);
        }
    be_free(gemm_only);
    be_free(grouped);
    be_free(f32k);
    free_kept_weights();   /* the suite's backend made again first */
}

/* The decode kernels on small weights, quick enough for compute-sanitizer (gpu-check.sh runs it
 * under memcheck): every type they read as stored, row counts that leave the last block of 4 warps
 * part empty (1, 3, 6 rows; 1 and 3 also leave a warp of two rows with one), rows of one and of
 * several blocks (2304 values: a second item in flight and a pass a lane leaves part filled on
 * the wide path too), 1 to 8 tokens and 11 in passes, on every variant: the defaults (Q4_K/Q5_K by the
 * wide path, one row a warp for a token and for more dd_many_shape's: on these row counts one row,
 * 1 in flight on Q4_0, the wide path and F16/BF16 and 2 on the others; for a token 4 items in flight,
 * 2 on Q4_K's wide path), 1, 2 and 4 items in flight (4: a token's kernel
 * only), one and two rows a warp whatever the tokens, 1 in flight with one row, and for Q4_K/Q5_K
 * the narrow items (KVCHAT_CUDA_MMV=narrow) by default and with 1, 2 and 4 in flight: the host
 * simulation's bits. */
Test(cuda, the_decode_kernels_give_the_hosts_bits_on_small_weights)
{
    seed_rng("small decode products");
    char err[512];
    setenv("KVCHAT_CUDA_MMV_MAX", "16", 1);   /* 11 tokens in passes on every variant */
    be_backend *dflt = gpu_with("KVCHAT_CUDA_MMV", "");
    be_backend *one = gpu_with("KVCHAT_CUDA_MMV_INFLIGHT", "1");
    be_backend *rows1 = gpu_with("KVCHAT_CUDA_MMV_ROWS", "1");
    be_backend *rows2 = gpu_with("KVCHAT_CUDA_MMV_ROWS", "2");
    setenv("KVCHAT_CUDA_MMV_INFLIGHT", "1", 1);
    be_backend *one_row1 = gpu_with("KVCHAT_CUDA_MMV_ROWS", "1");
    unsetenv("KVCHAT_CUDA_MMV_INFLIGHT");
    be_backend *narrow = gpu_with("KVCHAT_CUDA_MMV", "narrow");
    setenv("KVCHAT_CUDA_MMV", "narrow", 1);
    be_backend *narrow_one = gpu_with("KVCHAT_CUDA_MMV_INFLIGHT", "1");
    be_backend *narrow_two = gpu_with("KVCHAT_CUDA_MMV_INFLIGHT", "2");
    be_backend *narrow_four = gpu_with("KVCHAT_CUDA_MMV_INFLIGHT", "4");
    unsetenv("KVCHAT_CUDA_MMV");
    be_backend *two = gpu_with("KVCHAT_CUDA_MMV_INFLIGHT", "2");
    be_backend *four = gpu_with("KVCHAT_CUDA_MMV_INFLIGHT", "4");
    unsetenv("KVCHAT_CUDA_MMV_MAX");
    be_backend *variants[] = { dflt, one, rows1, rows2, one_row1, narrow, narrow_one, two, four, narrow_two, narrow_four };
    const char *names[] = { "defaults", "1 in flight", "one row a warp", "two rows a warp",
                            "1 in flight, one row a warp", "narrow items", "narrow items, 1 in flight",
                            "2 in flight", "4 in flight (a token's)", "narrow items, 2 in flight",
                            "narrow items, 4 in flight" };
    enum { N_VARIANTS = sizeof variants / sizeof *variants };
    const uint32_t types[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K,
                               GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_F16,  GGML_TYPE_BF16 };
    const int64_t n_ins[] = { 256, 768, 2304 }, n_outs[] = { 1, 3, 6 }, toks[] = { 1, 2, 5, 8, 11 };
    for (size_t ti = 0; ti < 8; ti++)
        for (size_t ii = 0; ii < 3; ii++)
            for (size_t oi = 0; oi < 3; oi++) {
                const int64_t n_in = n_ins[ii], n_out = n_outs[oi];
                void *data;
                be_weight w = random_weight(types[ti], n_in, n_out, &data);
                keep_weight(data);
                for (size_t k = 0; k < 5 * N_VARIANTS; k++) {   /* each token count on each variant */
                    const int64_t nt = toks[k % 5];
                    const size_t v = k / 5;
                    be_backend *be = variants[v];
                    const int narrowed = be == narrow || be == narrow_one || be == narrow_two || be == narrow_four;
                    if (narrowed && !dd_wide_type(types[ti])) continue;   /* the same kernels as the defaults */
                    float *x = malloc(sizeof(float) * (size_t)(nt * n_in));
                    float *y = malloc(sizeof(float) * (size_t)(nt * n_out));
                    for (int64_t i = 0; i < nt * n_in; i++) x[i] = frand(-3, 3);
                    for (int64_t i = 0; i < nt * n_out; i++) y[i] = NAN;
                    be_mm m = { &w, y };
                    be->ops->matmul(be, &m, 1, x, nt);
                    cr_assert(!be_failed(be, err, sizeof err), "%s", err);
                    cr_expect(host_kernel_mismatches(&w, x, nt, y, !narrowed) == 0,
                              "%s %lld x %lld, %lld tokens, %s: the device differs", quant_type_name(types[ti]),
                              (long long)n_out, (long long)n_in, (long long)nt, names[v]);
                    free(x);
                    free(y);
                }
            }
    for (size_t v = 0; v < N_VARIANTS; v++) be_free(variants[v]);
    free_kept_weights();
}

/* Several products of one input in one decode launch (dd_outs: q, k and v; gate and up): each
 * product's rows get the bits of its host simulation, the same as one launch each
 * (KVCHAT_CUDA_LAUNCHES=apart), for groups of one type, of mixed types (one launch a type) and
 * of row counts that do not fill a block, into scratch and into bound outputs. */
Test(cuda, several_products_a_launch_give_each_its_own_bits)
{
    seed_rng("several products a launch");
    char err[512];
    be_backend *apart = gpu_with("KVCHAT_CUDA_LAUNCHES", "apart");
    enum { MAXG = 4 };
    static const struct {
        uint32_t type[MAXG];
        int64_t n_out[MAXG];
        int n;
    } groups[] = {
        { { GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K }, { 7, 3, 5 }, 3 },
        { { GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0 }, { 9, 1, 4 }, 3 },
        { { GGML_TYPE_F16, GGML_TYPE_F16, GGML_TYPE_BF16 }, { 16, 17, 2 }, 3 },
        { { GGML_TYPE_Q5_0, GGML_TYPE_Q5_0 }, { 33, 32 }, 2 },
        { { GGML_TYPE_Q5_K, GGML_TYPE_Q4_0, GGML_TYPE_Q5_K, GGML_TYPE_Q5_K }, { 8, 8, 1, 40 }, 4 },
    };
    const int64_t n_ins[] = { 256, 768 }, toks[] = { 1, 3, 8 };
    for (size_t g = 0; g < sizeof groups / sizeof *groups; g++)
        for (size_t ii = 0; ii < 2; ii++) {
            const int64_t n_in = n_ins[ii];
            be_weight w[MAXG];
            void *data[MAXG];
            for (int i = 0; i < groups[g].n; i++) w[i] = random_weight(groups[g].type[i], n_in, groups[g].n_out[i], &data[i]);
            for (size_t ti = 0; ti < 3; ti++)
                for (int bind = 0; bind < 2; bind++) {
                    const int64_t nt = toks[ti];
                    float *x = malloc(sizeof(float) * (size_t)(nt * n_in));
                    for (int64_t i = 0; i < nt * n_in; i++) x[i] = frand(-3, 3);
                    float *y[2][MAXG];
                    be_mm mm[2][MAXG];
                    be_backend *bes[2] = { gpu, apart };
                    uint64_t calls[2];
                    for (int k = 0; k < 2; k++) {
                        for (int i = 0; i < groups[g].n; i++) {
                            const size_t ny = sizeof(float) * (size_t)(nt * w[i].n_out);
                            y[k][i] = malloc(ny);
                            for (int64_t j = 0; j < nt * w[i].n_out; j++) y[k][i][j] = NAN;
                            if (bind) cr_assert(be_bind(bes[k], y[k][i], ny, err, sizeof err) == 0, "%s", err);
                            mm[k][i] = (be_mm){ &w[i], y[k][i] };
                        }
                        const uint64_t c0 = be_cuda_runtime_calls(bes[k]);
                        bes[k]->ops->matmul(bes[k], mm[k], groups[g].n, x, nt);
                        calls[k] = be_cuda_runtime_calls(bes[k]) - c0;
                        for (int i = 0; i < groups[g].n && bind; i++) {
                            be_range r = { y[k][i], sizeof(float) * (size_t)(nt * w[i].n_out) };
                            be_host_read(bes[k], &r, 1);
                            be_unbind(bes[k], y[k][i]);
                        }
                        cr_assert(!be_failed(bes[k], err, sizeof err), "%s", err);
                    }
                    /* the launches: one a type (at most DD_MAX_OUTS products each), against one a
                     * product; everything else the same on both (x staged and quantized each call) */
                    int launches = 0;
                    for (int i = 0; i < groups[g].n; i++) {
                        int first = 1;
                        for (int j = 0; j < i; j++) first &= groups[g].type[j] != groups[g].type[i];
                        launches += first;
                    }
                    cr_expect_eq(calls[1] - calls[0], (uint64_t)(groups[g].n - launches),
                                 "group %zu, %lld tokens: %llu runtime calls, %llu with a launch each (%d launches "
                                 "expected, %d products)", g, (long long)nt, (unsigned long long)calls[0],
                                 (unsigned long long)calls[1], launches, groups[g].n);
                    for (int i = 0; i < groups[g].n; i++) {
                        cr_expect(host_kernel_mismatches(&w[i], x, nt, y[0][i], 1) == 0,
                                  "group %zu, product %d (%s), n_in %lld, %lld tokens, %s: not the host's bits", g, i,
                                  quant_type_name(w[i].type), (long long)n_in, (long long)nt,
                                  bind ? "bound" : "scratch");
                        cr_expect(!memcmp(y[0][i], y[1][i], sizeof(float) * (size_t)(nt * w[i].n_out)),
                                  "group %zu, product %d, %lld tokens: one launch and one each differ", g, i,
                                  (long long)nt);
                        free(y[0][i]);
                        free(y[1][i]);
                    }
                    free(x);
                }
            for (int i = 0; i < groups[g].n; i++) keep_weight(data[i]);
        }
    be_free(apart);
    free_kept_weights();
}

/* A decode product reads the 8-bit codes its input's producer wrote with it (add_norm, rmsnorm and
 * glu: no quantize launch of its own, be_cuda_input_quantizations), and gets the bits it gets when
 * it quantizes the input itself (KVCHAT_CUDA_LAUNCHES=apart) and those of the host simulation;
 * once anything else changes the input's twin (the host writes it, another op writes it), the
 * product quantizes again. */
Test(cuda, products_read_the_codes_their_inputs_producer_wrote)
{
    seed_rng("codes from the producer");
    char err[512];
    enum { ROWS = 3, DIM = 256, FF = 512, NQ = 64, ND = 32, HEADS = 4, HD = 64 };
    void *dq, *dd, *dh;
    be_weight wq = random_weight(GGML_TYPE_Q4_K, DIM, NQ, &dq);
    be_weight wd = random_weight(GGML_TYPE_Q8_0, FF, ND, &dd);
    be_weight wh = random_weight(GGML_TYPE_F16, DIM, 16, &dh);   /* read in f32: no codes */
    static float norm_w[DIM], post_w[DIM];
    for (int i = 0; i < DIM; i++) {
        norm_w[i] = frand(0.5f, 1.5f);
        post_w[i] = frand(0.5f, 1.5f);
    }
    int32_t pos[ROWS] = { 5, 6, 7 };
    be_backend *apart = gpu_with("KVCHAT_CUDA_LAUNCHES", "apart");
    be_backend *bes[2] = { gpu, apart };
    float *yq[2], *yd[2], *hk[2];
    const be_weight *both[3] = { &wq, &wd, &wh };
    for (int k = 0; k < 2; k++) {
        be_backend *b = bes[k];
        /* as a model's are: every weight on the device before the first op (glu's choice to write
         * codes looks at the widest weight there) */
        cr_assert(b->ops->prepare(b, both, 3, err, sizeof err) == 0, "%s", err);
        float *x = malloc(sizeof(float) * ROWS * DIM), *o = malloc(sizeof(float) * ROWS * DIM);
        float *h = malloc(sizeof(float) * ROWS * DIM), *kk = malloc(sizeof(float) * ROWS * HD);
        float *gate = malloc(sizeof(float) * ROWS * FF), *up = malloc(sizeof(float) * ROWS * FF);
        yq[k] = malloc(sizeof(float) * ROWS * NQ * 7);
        yd[k] = malloc(sizeof(float) * ROWS * ND * 2);
        hk[k] = malloc(sizeof(float) * ROWS * DIM * 7);
        seed_rng("codes from the producer, inputs");   /* the same inputs on both backends */
        for (int i = 0; i < ROWS * DIM; i++) {
            x[i] = frand(-2, 2);
            o[i] = frand(-2, 2);
        }
        for (int i = 0; i < ROWS * FF; i++) {
            gate[i] = frand(-3, 3);
            up[i] = frand(-3, 3);
        }
        float *bufs[] = { x, o, h, kk, gate, up };
        const size_t sizes[] = { ROWS * DIM, ROWS * DIM, ROWS * DIM, ROWS * HD, ROWS * FF, ROWS * FF };
        for (int i = 0; i < 6; i++) cr_assert(be_bind(b, bufs[i], sizeof(float) * sizes[i], err, sizeof err) == 0, "%s", err);
        const be_range rh = { h, sizeof(float) * ROWS * DIM }, rg = { gate, sizeof(float) * ROWS * FF };
        const int want = k == 0 ? 0 : 1;   /* quantize launches a product makes on each backend */
        int at = 0;
        /* (1) add_norm, then the product of h */
        b->ops->add_norm(b, x, o, post_w, norm_w, h, ROWS, DIM, 1e-6f);
        uint64_t q0 = be_cuda_input_quantizations(b);
        be_mm m = { &wq, yq[k] + at * ROWS * NQ };
        b->ops->matmul(b, &m, 1, h, ROWS);
        cr_expect_eq(be_cuda_input_quantizations(b) - q0, (uint64_t)want, "backend %d: add_norm's codes", k);
        be_host_read(b, &rh, 1);
        memcpy(hk[k] + at++ * ROWS * DIM, h, sizeof(float) * ROWS * DIM);
        /* (2) rmsnorm */
        b->ops->rmsnorm(b, x, norm_w, h, ROWS, DIM, 1e-6f);
        q0 = be_cuda_input_quantizations(b);
        m.y = yq[k] + at * ROWS * NQ;
        b->ops->matmul(b, &m, 1, h, ROWS);
        cr_expect_eq(be_cuda_input_quantizations(b) - q0, (uint64_t)want, "backend %d: rmsnorm's codes", k);
        be_host_read(b, &rh, 1);
        memcpy(hk[k] + at++ * ROWS * DIM, h, sizeof(float) * ROWS * DIM);
        /* (3) a second product of the same input reads the codes the first left */
        q0 = be_cuda_input_quantizations(b);
        m.y = yq[k] + at * ROWS * NQ;
        b->ops->matmul(b, &m, 1, h, ROWS);
        cr_expect_eq(be_cuda_input_quantizations(b) - q0, (uint64_t)want, "backend %d: the first product's codes", k);
        memcpy(hk[k] + at++ * ROWS * DIM, h, sizeof(float) * ROWS * DIM);
        /* (4) add_norm, then the host writes h: quantized again */
        b->ops->add_norm(b, x, o, NULL, norm_w, h, ROWS, DIM, 1e-6f);
        be_host_read(b, &rh, 1);
        be_host_write(b, h, sizeof(float) * ROWS * DIM);
        h[DIM + 5] = 40.0f;
        q0 = be_cuda_input_quantizations(b);
        m.y = yq[k] + at * ROWS * NQ;
        b->ops->matmul(b, &m, 1, h, ROWS);
        cr_expect_eq(be_cuda_input_quantizations(b) - q0, 1, "backend %d: stale codes after a host write", k);
        memcpy(hk[k] + at++ * ROWS * DIM, h, sizeof(float) * ROWS * DIM);
        /* (5) add_norm, then another op writes h (as q of qk_rope): quantized again */
        b->ops->add_norm(b, x, o, NULL, norm_w, h, ROWS, DIM, 1e-6f);
        be_qk r = { .q = h, .k = kk, .n_tok = ROWS, .n_head = HEADS, .n_head_kv = 1, .head_dim = HD, .eps = 1e-6f,
                    .pos = pos, .freq_base = 10000.0f, .freq_scale = 1.0f, .neox = 0, .q_scale = 1.0f };
        b->ops->qk_rope(b, &r);
        q0 = be_cuda_input_quantizations(b);
        m.y = yq[k] + at * ROWS * NQ;
        b->ops->matmul(b, &m, 1, h, ROWS);
        cr_expect_eq(be_cuda_input_quantizations(b) - q0, 1, "backend %d: stale codes after another op's write", k);
        be_host_read(b, &rh, 1);
        memcpy(hk[k] + at++ * ROWS * DIM, h, sizeof(float) * ROWS * DIM);
        /* (6) rmsnorm, the host writes h, an F16 product of h (which reads no codes), then the
         * quantized one: the codes rmsnorm wrote are stale, and the F16 product must not make them
         * current again */
        b->ops->rmsnorm(b, x, norm_w, h, ROWS, DIM, 1e-6f);
        be_host_read(b, &rh, 1);
        be_host_write(b, h, sizeof(float) * ROWS * DIM);
        h[7] = -25.0f;
        float yh[ROWS * 16];
        be_mm mh = { &wh, yh };
        b->ops->matmul(b, &mh, 1, h, ROWS);
        q0 = be_cuda_input_quantizations(b);
        m.y = yq[k] + at * ROWS * NQ;
        b->ops->matmul(b, &m, 1, h, ROWS);
        cr_expect_eq(be_cuda_input_quantizations(b) - q0, 1, "backend %d: stale codes after an F16 product", k);
        memcpy(hk[k] + at++ * ROWS * DIM, h, sizeof(float) * ROWS * DIM);
        /* (7) glu, then the down product */
        b->ops->glu(b, gate, up, ROWS * FF, 0);
        q0 = be_cuda_input_quantizations(b);
        be_mm md = { &wd, yd[k] };
        b->ops->matmul(b, &md, 1, gate, ROWS);
        cr_expect_eq(be_cuda_input_quantizations(b) - q0, (uint64_t)want, "backend %d: glu's codes", k);
        be_host_read(b, &rg, 1);
        cr_assert(!be_failed(b, err, sizeof err), "%s", err);
        cr_expect(host_kernel_mismatches(&wd, gate, ROWS, yd[k], 1) == 0, "backend %d: the down product", k);
        for (int i = 0; i < at; i++)
            cr_expect(host_kernel_mismatches(&wq, hk[k] + i * ROWS * DIM, ROWS, yq[k] + i * ROWS * NQ, 1) == 0,
                      "backend %d: product %d is not the host's", k, i);
        for (int i = 0; i < 6; i++) {
            be_unbind(b, bufs[i]);
            free(bufs[i]);
        }
    }
    for (int i = 0; i < 6 * ROWS * NQ; i++)
        cr_expect(!memcmp(&yq[0][i], &yq[1][i], sizeof(float)), "output %d: reading the codes and quantizing differ", i);
    cr_expect(!memcmp(yd[0], yd[1], sizeof(float) * ROWS * ND), "the down product differs between the backends");
    for (int k = 0; k < 2; k++) {
        free(yq[k]);
        free(yd[k]);
        free(hk[k]);
    }
    be_free(apart);
    keep_weight(dq);
    keep_weight(dd);
    keep_weight(dh);
    free_kept_weights();
}

/* Every finite half, as the value of an F16 weight, read exactly by the decode kernel (the device's
 * conversion instruction against the reference): 2048 rows of 32 halves, each column picked out by a
 * one-hot token, so every product is one weight times 1. */
Test(cuda, the_decode_kernel_reads_every_finite_half_exactly)
{
    enum { N_IN = 32, N_OUT = 2048 };
    uint16_t *wd = malloc(sizeof(uint16_t) * N_IN * N_OUT);
    for (uint32_t i = 0; i < N_IN * N_OUT; i++) wd[i] = (i & 0x7c00u) == 0x7c00u ? 0 : (uint16_t)i;   /* no inf/NaN */
    be_weight w = { wd, GGML_TYPE_F16, N_IN, N_OUT, sizeof(uint16_t) * N_IN };
    float x[8 * N_IN], *y = malloc(sizeof(float) * 8 * N_OUT);
    int bad = 0;
    for (int c0 = 0; c0 < N_IN; c0 += 8) {
        memset(x, 0, sizeof x);
        for (int t = 0; t < 8; t++) x[t * N_IN + c0 + t] = 1.0f;
        be_mm m = { &w, y };
        gpu->ops->matmul(gpu, &m, 1, x, 8);
        char err[256];
        cr_assert(!be_failed(gpu, err, sizeof err), "%s", err);
        for (int t = 0; t < 8; t++)
            for (int r = 0; r < N_OUT; r++) {
                float want = quant_fp16_to_f32(wd[r * N_IN + c0 + t]);
                if (y[t * N_OUT + r] != want && bad++ < 5)
                    cr_log_error("half 0x%04x: %g, the reference %g", wd[r * N_IN + c0 + t], y[t * N_OUT + r], want);
            }
    }
    cr_expect_eq(bad, 0, "%d halves read wrong", bad);
    free(wd);
    free(y);
}

/* Activations past f16's range (a product of more tokens than the decode kernel takes, through
 * cuBLAS on f16 inputs) saturate at 65504 instead of becoming infinities that make the row NaN. */
Test(cuda, activations_past_f16s_range_saturate_in_cublas_products)
{
    seed_rng("f16 range");
    char err[256];
    be_backend *gemm_only = gpu_with("KVCHAT_CUDA_MMV", "0");
    const uint32_t types[] = { GGML_TYPE_F16, GGML_TYPE_Q4_K, GGML_TYPE_Q8_0 };
    enum { N_IN = 256, N_OUT = 64, NT = 33 };
    float *x = malloc(sizeof(float) * NT * N_IN), *y = malloc(sizeof(float) * NT * N_OUT);
    for (int i = 0; i < NT * N_IN; i++) x[i] = i % 7 == 0 ? (i % 2 ? 1e6f : -3e5f) : frand(-1, 1);
    void *kept[3];
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        void *data;
        be_weight w = random_weight(types[ti], N_IN, N_OUT, &data);
        be_mm m = { &w, y };
        gemm_only->ops->matmul(gemm_only, &m, 1, x, NT);
        cr_assert(!be_failed(gemm_only, err, sizeof err), "%s", err);
        int nonfinite = 0;
        for (int i = 0; i < NT * N_OUT; i++) nonfinite += !isfinite(y[i]);
        cr_expect_eq(nonfinite, 0, "%s: %d of %d outputs not finite", quant_type_name(types[ti]), nonfinite, NT * N_OUT);
        kept[ti] = data;   /* until the backend is gone: it keys its copies by address */
    }
    be_free(gemm_only);
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) free(kept[ti]);
    free(x);
    free(y);
}

/* The default model's mix on the tiny models: a fresh backend given every weight holds exactly what
 * kernels/gpu_weights.c says (the file's bytes, rows padded to 16): about the file's size. */
Test(cuda, quantized_weights_stay_quantized_on_the_device)
{
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        model *m = load_tiny(fi);
        if (!m) continue;
        char err[512];
        be_backend *g = be_cuda_create(2, err, sizeof err);
        cr_assert(g, "%s", err);
        const be_weight *w[512];
        int n = model_matmul_weights(m, w, 512);
        cr_assert(n <= 512);
        cr_assert(g->ops->prepare(g, w, n, err, sizeof err) == 0, "%s", err);
        uint64_t want = 0, file = 0, held = 0, total = 0, rows = 0;
        for (int i = 0; i < n; i++) {
            want += be_gpu_weight_bytes(w[i]->type, w[i]->n_in, w[i]->n_out);
            file += w[i]->row_bytes * (uint64_t)w[i]->n_out;
            rows += (uint64_t)w[i]->n_out;
        }
        g->ops->memory(g, &held, &total);
        cr_expect_eq(held, want, "%s: the device holds %llu bytes, expected %llu", files[fi], (unsigned long long)held,
                     (unsigned long long)want);
        /* the file's bytes and each row's padding to 16 bytes (at most 15), nothing else */
        cr_expect(held <= file + 15 * rows, "%s: %llu bytes on the device for %llu in the file and %llu rows", files[fi],
                  (unsigned long long)held, (unsigned long long)file, (unsigned long long)rows);
        cr_log_info("%s: %.2f MiB of weights on the device, %.2f MiB in the file", files[fi], held / 1048576.0,
                    file / 1048576.0);
        be_free(g);
        model_free(m);
    }
}

/* Random pages for n_kv KV heads: page lengths 1..37, positions ascending over each head's pages. */
typedef struct page_set {
    be_kv_page *pages;
    int64_t n_pages, head_pages[9];
    uint16_t **kv;
    int32_t **pos;
    float **bias;
    uint64_t **mask;
    int32_t max_pos;
} page_set;

static uint64_t gen_counter = 1000000;   /* far from the engine's own generations */

static void make_pages(page_set *ps, int n_kv, int pages_per_head, int D, int with_mask, int with_bias)
{
    ps->n_pages = (int64_t)n_kv * pages_per_head;
    ps->pages = calloc((size_t)ps->n_pages, sizeof *ps->pages);
    ps->kv = calloc((size_t)ps->n_pages, sizeof *ps->kv);
    ps->pos = calloc((size_t)ps->n_pages, sizeof *ps->pos);
    ps->bias = calloc((size_t)ps->n_pages, sizeof *ps->bias);
    ps->mask = calloc((size_t)ps->n_pages, sizeof *ps->mask);
    ps->max_pos = 0;
    for (int g = 0; g < n_kv; g++) {
        ps->head_pages[g] = (int64_t)g * pages_per_head;
        int32_t p = 0;
        for (int j = 0; j < pages_per_head; j++) {
            int64_t i = (int64_t)g * pages_per_head + j;
            int32_t n = 1 + (int32_t)(rnd() % 37);
            ps->kv[i] = malloc(sizeof(uint16_t) * 2 * 64 * (size_t)D);   /* room for 64 rows */
            ps->pos[i] = malloc(sizeof(int32_t) * 64);
            for (int64_t e = 0; e < 2 * 64 * (int64_t)D; e++) ps->kv[i][e] = quant_f32_to_fp16(frand(-1, 1));
            for (int32_t t = 0; t < 64; t++) ps->pos[i][t] = (p += 1 + (int32_t)(rnd() % 3));
            p = ps->pos[i][n - 1];
            if (with_bias) {
                ps->bias[i] = malloc(sizeof(float) * 64);
                for (int32_t t = 0; t < 64; t++) ps->bias[i][t] = rnd() % 3 ? 0.0f : logf(2.0f + (float)(rnd() % 4));
            }
            if (with_mask && rnd() % 2) {
                ps->mask[i] = calloc(1, sizeof(uint64_t));
                for (int32_t t = 0; t < n; t++)
                    if (rnd() % 4) ps->mask[i][0] |= 1ull << t;
            }
            be_kv_page *pg = &ps->pages[i];
            pg->k = ps->kv[i];
            pg->v = ps->kv[i] + 64 * (size_t)D;
            pg->pos = ps->pos[i];
            pg->bias = ps->bias[i];
            pg->mask = ps->mask[i];
            pg->n = n;
            pg->stride = D;
            pg->head_step = 0;
            pg->gen = ++gen_counter;
            pg->cap = 64;
        }
        if (p > ps->max_pos) ps->max_pos = p;
    }
    ps->head_pages[n_kv] = ps->n_pages;
}

static void free_pages(page_set *ps)
{
    for (int64_t i = 0; i < ps->n_pages; i++) {
        free(ps->kv[i]);
        free(ps->pos[i]);
        free(ps->bias[i]);
        free(ps->mask[i]);
    }
    free(ps->kv);
    free(ps->pos);
    free(ps->bias);
    free(ps->mask);
    free(ps->pages);
}

/* a on dev, its query q (a->q) and output (a->out) of n floats each bound to device twins or not
 * (then the query is read from and the output left on the twins, and the output read back). */
static void attend_on(be_backend *dev, const be_attn *a, float *q, size_t n, int bind)
{
    char err[256];
    const size_t bytes = sizeof(float) * n;
    if (bind)
        cr_assert(be_bind(dev, q, bytes, err, sizeof err) == 0 && be_bind(dev, a->out, bytes, err, sizeof err) == 0,
                  "%s", err);
    dev->ops->attention(dev, a);
    if (bind) {
        be_range r = { a->out, bytes };
        be_host_read(dev, &r, 1);
        be_unbind(dev, q);
        be_unbind(dev, a->out);
    }
}

/* Attention of n_q queries at the last positions (and some in the middle) on the CPU and on dev. */
static double compare_attention_on(be_backend *dev, page_set *ps, int n_head, int n_kv, int D, int64_t n_q,
                                   int32_t window, int bind)
{
    float *q = malloc(sizeof(float) * (size_t)(n_q * n_head * D));
    float *o0 = malloc(sizeof(float) * (size_t)(n_q * n_head * D)), *o1 = malloc(sizeof(float) * (size_t)(n_q * n_head * D));
    int32_t *qp = malloc(sizeof(int32_t) * (size_t)n_q);
    for (int64_t i = 0; i < n_q * n_head * D; i++) {
        q[i] = frand(-0.5f, 0.5f);
        o1[i] = NAN;
    }
    for (int64_t t = 0; t < n_q; t++) qp[t] = t == n_q - 1 ? ps->max_pos : (int32_t)(rnd() % (uint32_t)(ps->max_pos + 1));
    be_attn a = { q, n_q, qp, n_head, n_kv, D, ps->pages, ps->n_pages, ps->head_pages, window, o0, NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
    cpu->ops->attention(cpu, &a);
    a.out = o1;
    attend_on(dev, &a, q, (size_t)(n_q * n_head * D), bind);
    double d = max_abs_diff(o0, o1, n_q * n_head * D);
    free(q);
    free(o0);
    free(o1);
    free(qp);
    return d;
}

static double compare_attention(page_set *ps, int n_head, int n_kv, int D, int64_t n_q, int32_t window, int bind)
{
    return compare_attention_on(gpu, ps, n_head, n_kv, D, n_q, window, bind);
}

/* A kernel choice it does not know is refused in one line, not read as the default. */
Test(cuda, an_unknown_attention_kernel_is_refused)
{
    gpu_refuses("KVCHAT_CUDA_ATTN", "fast", "KVCHAT_CUDA_ATTN must be flash");
}

/* Both attention kernels: the grouped one (the default, head dimensions that are multiples of 8 up
 * to 256) and the one with a block per query head (KVCHAT_CUDA_ATTN=scalar; also every head
 * dimension the grouped one does not take: 36, 512). */
Test(cuda, paged_attention_equals_the_cpu)
{
    seed_rng("attention");
    be_backend *scalar = gpu_with("KVCHAT_CUDA_ATTN", "scalar");
    const int dims[] = { 36, 64, 80, 128, 256, 512 };
    const int heads[][2] = { { 4, 1 }, { 8, 2 }, { 6, 3 }, { 12, 1 } };
    for (size_t di = 0; di < 6; di++)
        for (size_t hi = 0; hi < 4; hi++)
            for (int variant = 0; variant < 4; variant++)
                for (int k = 0; k < 2; k++) {
                    int D = dims[di], nh = heads[hi][0], nkv = heads[hi][1];
                    page_set ps;
                    make_pages(&ps, nkv, 1 + (int)(rnd() % 9), D, variant & 1, variant & 2);
                    int64_t nq = variant == 3 ? 7 : 1;
                    int32_t window = variant == 2 ? 40 : 0;
                    double d = compare_attention_on(k ? scalar : gpu, &ps, nh, nkv, D, nq, window, (int)(rnd() & 1));
                    cr_expect(d < 2e-3, "%s kernel, D %d, %d heads / %d KV, variant %d: max |diff| %g",
                              k ? "scalar" : "default", D, nh, nkv, variant, d);
                    free_pages(&ps);
                }
    be_free(scalar);
}

/* The grouped attention kernel (kernels/attn_group.h) gives the bits of its host simulation
 * (ag_attention_sim, the same lanes, butterflies and merges): pages of odd lengths with masks,
 * bias, windows, several queries, groups of 1 to 12 heads, head dimensions of 1 to 32 lanes, and a
 * forced number of splits (1, 3, and more splits than pages: empty splits), query and output bound
 * or not. Finite data: the device's NaN is the canonical one, the host's keeps its payload. */
/* One step's list of a page set: every head's pages but the dropped ones, under name `name`. */
static void attend_list(const page_set *ps, const uint8_t *dropped, int nh, int nkv, int D, float *q, int32_t *qp,
                        uint64_t name, uint64_t shape, int with_cur, double *worst)
{
    be_kv_page *list = malloc(sizeof *list * (size_t)ps->n_pages);
    int64_t hp[65], e = 0;
    for (int g = 0; g < nkv; g++) {
        hp[g] = e;
        for (int64_t i = ps->head_pages[g]; i < ps->head_pages[g + 1]; i++)
            if (!dropped[i]) list[e++] = ps->pages[i];
    }
    hp[nkv] = e;
    float *o0 = malloc(sizeof(float) * (size_t)(nh * D)), *o1 = malloc(sizeof(float) * (size_t)(nh * D));
    for (int i = 0; i < nh * D; i++) o1[i] = NAN;
    /* a deferred step's own row, attended after each head's pages */
    float *ck = malloc(sizeof(float) * (size_t)(nkv * D)), *cv = malloc(sizeof(float) * (size_t)(nkv * D));
    for (int i = 0; i < nkv * D; i++) {
        ck[i] = frand(-1, 1);
        cv[i] = frand(-1, 1);
    }
    be_attn a = { q, 1, qp, nh, nkv, D, list, e, hp, 0, o0, with_cur ? ck : NULL, with_cur ? cv : NULL,
                  with_cur ? qp : NULL, with_cur ? 1 : 0, name, shape, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
    cpu->ops->attention(cpu, &a);
    a.out = o1;
    gpu->ops->attention(gpu, &a);
    double d = max_abs_diff(o0, o1, nh * D);
    if (d > *worst) *worst = d;
    free(ck);
    free(cv);
    free(list);
    free(o0);
    free(o1);
}

/* The CPU's attention of an explicit list (list[0 .. e), offsets hp) against the GPU's of the same
 * call over ps's every page with the selection sel names (its sel_* fields, under the list name
 * table), the largest difference into *worst; and the CPU's own selection path, bit for bit its
 * list's. With with_cur, a row not in the cache at qp. */
static void selection_against_list(const page_set *ps, int nh, int nkv, int D, const be_kv_page *list, int64_t e,
                                   const int64_t *hp, int32_t qp, int with_cur, const be_attn *sel, uint64_t table,
                                   int round, double *worst)
{
    float *q = malloc(sizeof(float) * (size_t)(nh * D)), *o0 = malloc(sizeof(float) * (size_t)(nh * D));
    float *o1 = malloc(sizeof(float) * (size_t)(nh * D)), *ck = malloc(sizeof(float) * (size_t)(nkv * D));
    float *cv = malloc(sizeof(float) * (size_t)(nkv * D));
    for (int i = 0; i < nh * D; i++) q[i] = frand(-0.5f, 0.5f);
    for (int i = 0; i < nkv * D; i++) {
        ck[i] = frand(-1, 1);
        cv[i] = frand(-1, 1);
    }
    be_attn a = { q, 1, &qp, nh, nkv, D, list, e, hp, 0, o0, with_cur ? ck : NULL, with_cur ? cv : NULL,
                  with_cur ? &qp : NULL, with_cur ? 1 : 0, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
    cpu->ops->attention(cpu, &a);
    be_attn s = a;
    s.pages = ps->pages;
    s.n_pages = ps->n_pages;
    s.head_pages = ps->head_pages;
    s.sel_best = sel->sel_best;
    s.sel_n_best = sel->sel_n_best;
    s.sel_from = sel->sel_from;
    s.sel_k = sel->sel_k;
    s.sel_bits = sel->sel_bits;
    s.sel_words = sel->sel_words;
    s.sel_page_tokens = sel->sel_page_tokens;
    s.table = table;
    s.out = o1;
    for (int i = 0; i < nh * D; i++) o1[i] = NAN;
    gpu->ops->attention(gpu, &s);
    char err[256];
    cr_assert(!be_failed(gpu, err, sizeof err), "%s", err);
    double d = max_abs_diff(o0, o1, nh * D);
    if (d > *worst || isnan(d)) *worst = isnan(d) ? INFINITY : d;
    s.out = o1;
    cpu->ops->attention(cpu, &s);
    cr_expect(!memcmp(o0, o1, sizeof(float) * (size_t)(nh * D)), "round %d: the CPU's selection differs", round);
    free(q);
    free(o0);
    free(o1);
    free(ck);
    free(cv);
}

/* A selection by bounds (be_attn.sel_best) attended on the device, its list built there, equals the
 * CPU's attention over the list it stands for: 1 to 8 KV heads of up to 12 pages, 0 to k of each
 * head's first `from` pages chosen and the rest of the head after them, with and without a
 * deferred step's row, the best given from the host and bound (then written on the host and
 * announced, as the bounds on the CPU leave them). */
Test(cuda, a_selection_by_bounds_equals_the_list_it_stands_for)
{
    seed_rng("selection by bounds");
    const int D = 128, heads[][2] = { { 4, 1 }, { 8, 2 }, { 32, 8 } };
    double worst = 0;
    int32_t *kept = NULL;
    for (int round = 0; round < 60; round++) {
        const int nh = heads[round % 3][0], nkv = heads[round % 3][1], with_cur = round & 1, bind = (round >> 1) & 1;
        page_set ps;
        make_pages(&ps, nkv, 1 + (int)(rnd() % 12), D, 0, round % 5 == 0);
        int32_t k = 1 + (int32_t)(rnd() % 6), *best = NULL, n_best[8];
        size_t bytes = sizeof(int32_t) * (size_t)(nkv * k + nkv);
        if (bind) {
            cr_assert(posix_memalign((void **)&kept, 4096, 4096) == 0 && bytes <= 4096);
            char err[256];
            cr_assert(be_bind(gpu, kept, 4096, err, sizeof err) == 0, "%s", err);
            be_host_write(gpu, kept, bytes);
            best = kept;
        } else {
            best = malloc(bytes);
        }
        int32_t *cnt = bind ? kept + nkv * k : n_best;
        int64_t from[8];
        be_kv_page *list = malloc(sizeof *list * (size_t)ps.n_pages);
        int64_t hp[9], e = 0;
        for (int g = 0; g < nkv; g++) {
            const int64_t h0 = ps.head_pages[g], len = ps.head_pages[g + 1] - h0;
            from[g] = len - (int64_t)(rnd() % 2);   /* the head's last page past the candidates, or not */
            int32_t c = 0;
            for (int64_t i = 0; i < from[g] && c < k; i++)   /* ascending, some left out */
                if (rnd() % 3) best[g * k + c++] = (int32_t)i;
            cnt[g] = c;
            hp[g] = e;
            for (int32_t j = 0; j < c; j++) list[e++] = ps.pages[h0 + best[g * k + j]];
            for (int64_t i = from[g]; i < len; i++) list[e++] = ps.pages[h0 + i];
        }
        hp[nkv] = e;
        be_attn sel = { .sel_best = best, .sel_n_best = cnt, .sel_from = from, .sel_k = k };
        selection_against_list(&ps, nh, nkv, D, list, e, hp, INT32_MAX / 2, with_cur, &sel, 900 + (uint64_t)round,
                               round, &worst);
        if (bind) {
            be_unbind(gpu, kept);
            free(kept);
        } else {
            free(best);
        }
        free(list);
        free_pages(&ps);
    }
    cr_expect(worst < 2e-3, "max |diff| %g", worst);
}

/* A choice of tokens by bitmaps of positions (be_attn.sel_bits, where SentKV's choice on the device
 * leaves them) attends as the explicit list it stands for: each head's pages with a chosen token,
 * masked where not all are, then the rows not in the cache. Pages of consecutive positions and of
 * scattered ones, bitmaps dense and sparse, bound and from the host. */
Test(cuda, a_choice_of_tokens_equals_the_list_it_stands_for)
{
    seed_rng("choice of tokens");
    const int D = 128, heads[][2] = { { 4, 1 }, { 8, 2 }, { 32, 8 } };
    double worst = 0;
    for (int round = 0; round < 60; round++) {
        const int nh = heads[round % 3][0], nkv = heads[round % 3][1], with_cur = round & 1, bind = (round >> 1) & 1;
        page_set ps;
        make_pages(&ps, nkv, 1 + (int)(rnd() % 12), D, 0, round % 5 == 0);
        int32_t top = 0;
        for (int g = 0; g < nkv; g++) {   /* positions again: some pages consecutive */
            int32_t p = 0;
            for (int64_t i = ps.head_pages[g]; i < (g + 1 < nkv ? ps.head_pages[g + 1] : ps.n_pages); i++) {
                int consecutive = rnd() % 2;
                for (int32_t t = 0; t < 64; t++) ps.pos[i][t] = p + (consecutive ? t : 2 * t + (int32_t)(rnd() % 2));
                p = ps.pos[i][ps.pages[i].n - 1] + 1;
                ps.pages[i].gen = ++gen_counter;
            }
            if (p > top) top = p;
        }
        ps.head_pages[nkv] = ps.n_pages;
        const int64_t words = (top + 64) / 64 + 1;
        size_t bytes = sizeof(uint64_t) * (size_t)(nkv * words);
        uint64_t *bits = NULL;
        cr_assert(posix_memalign((void **)&bits, 4096, (bytes + 4095) / 4096 * 4096) == 0);
        float density = round % 4 == 0 ? 0.03f : round % 4 == 1 ? 0.97f : frand(0, 1);
        for (int64_t w = 0; w < nkv * words; w++) {
            bits[w] = 0;
            for (int t = 0; t < 64; t++)
                if (frand(0, 1) < density) bits[w] |= 1ull << t;
        }
        char err[256];
        if (bind) {
            cr_assert(be_bind(gpu, bits, (bytes + 4095) / 4096 * 4096, err, sizeof err) == 0, "%s", err);
            be_host_write(gpu, bits, bytes);
        }
        be_kv_page *list = malloc(sizeof *list * (size_t)ps.n_pages);
        uint64_t *masks = malloc(sizeof(uint64_t) * (size_t)ps.n_pages);
        int64_t hp[9], e = 0;
        for (int g = 0; g < nkv; g++) {
            hp[g] = e;
            for (int64_t i = ps.head_pages[g]; i < ps.head_pages[g + 1]; i++) {
                const be_kv_page *pg = &ps.pages[i];
                int on = 0;
                masks[i] = 0;
                for (int32_t t = 0; t < pg->n; t++)
                    if ((bits[g * words + pg->pos[t] / 64] >> (pg->pos[t] % 64)) & 1) {
                        masks[i] |= 1ull << t;
                        on++;
                    }
                if (!on) continue;
                list[e] = *pg;
                list[e].mask = on == pg->n ? NULL : &masks[i];
                e++;
            }
        }
        hp[nkv] = e;
        /* masks sized by the pages' room (64 tokens) or by the cache's limit */
        be_attn sel = { .sel_bits = bits, .sel_words = words, .sel_page_tokens = round % 3 ? 64 : 0 };
        selection_against_list(&ps, nh, nkv, D, list, e, hp, top + 1, with_cur, &sel, 1900 + (uint64_t)round, round,
                               &worst);
        if (bind) be_unbind(gpu, bits);
        free(bits);
        free(masks);
        free(list);
        free_pages(&ps);
    }
    cr_expect(worst < 2e-3, "max |diff| %g", worst);
}

/* SentKV's choice on the device (seg_choose_kernel) is the CPU's, bit for bit: summaries whose bounds
 * are given values (ties, NaN, infinities), segments of 1 to 40 tokens, up to 9,000 of them a head
 * (past SG_SORT_MAX: the host's), budgets from none to all; the bitmaps bound (left on the device,
 * read back) or not (brought back by the call). */
Test(cuda, sentkv_s_choice_on_the_device_is_the_cpus)
{
    seed_rng("segment choice");
    enum { D = 8 };
    for (int round = 0; round < 40; round++) {
        const int H = 1 + (int)(rnd() % 8), bind = round & 1;
        int64_t off[9] = { 0 }, most = round % 10 == 9 ? 9000 : round % 3 == 0 ? 20 : 3000, len = 0;
        for (int h = 0; h < H; h++) off[h + 1] = off[h] + (int64_t)(rnd() % (uint32_t)(most + 1));
        float *mm = malloc(sizeof(float) * 2 * D * (size_t)(off[H] + 1));
        be_summary *sum = malloc(sizeof *sum * (size_t)(off[H] + 1));
        float q[8 * D] = { 0 };
        int kind = (int)(rnd() % 3);
        for (int h = 0; h < H; h++) {
            q[h * D] = 1.0f;
            int64_t covered = 0;
            for (int64_t i = off[h]; i < off[h + 1]; i++) {
                float *x = mm + 2 * D * i, u = frand(-50, 50);
                if (kind == 1) u = (float)(int)(u / 20);
                int r = (int)(rnd() % 64);
                u = r == 0 ? NAN : r == 1 ? -INFINITY : r == 2 ? INFINITY : u;
                memset(x, 0, sizeof(float) * 2 * D);
                x[0] = x[D] = u;
                int64_t n = kind == 2 ? 14 : 1 + (int64_t)(rnd() % 40);
                sum[i] = (be_summary){ .mn = x, .mx = x + D, .gen = ++gen_counter, .n = n };
                covered += n;
            }
            if (covered > len) len = covered;
        }
        len += (int64_t)(rnd() % 40);
        const int64_t words = (len + 63) / 64 + (int64_t)(rnd() % 2);
        const size_t bytes = sizeof(uint64_t) * (size_t)(H * words), room = (bytes + 4095) / 4096 * 4096;
        uint64_t *want = malloc(bytes), *got = NULL;
        cr_assert(posix_memalign((void **)&got, 4096, room) == 0);
        char err[256];
        if (bind) cr_assert(be_bind(gpu, got, room, err, sizeof err) == 0, "%s", err);
        int64_t budget = (int64_t)(rnd() % (uint32_t)(len + 2)), sinks = (int64_t)(rnd() % 50);
        /* every third round asks for the bounds too (they come back beside the bitmaps) */
        float *u_cpu = malloc(sizeof(float) * (size_t)(off[H] + 1)), *u_gpu = malloc(sizeof(float) * (size_t)(off[H] + 1));
        const int with_u = round % 3 == 2;
        be_bounds r = { .q = q, .n_head_kv = H, .group = 1, .dim = D, .sum = sum, .off = off, .table = 7700 + (uint64_t)round,
                        .u = with_u ? u_cpu : NULL, .bits = want, .words = words, .budget = budget, .sinks = sinks,
                        .len = len };
        cpu->ops->bound_pages(cpu, &r);
        r.bits = got;
        r.u = with_u ? u_gpu : NULL;
        memset(got, 0xA5, bytes);
        gpu->ops->bound_pages(gpu, &r);
        if (bind) {
            be_range rd = { got, bytes };
            be_host_read(gpu, &rd, 1);
        }
        cr_assert(!be_failed(gpu, err, sizeof err), "%s", err);
        cr_expect(!memcmp(want, got, bytes), "round %d: %d heads, up to %lld segments, budget %lld, sinks %lld, len %lld: "
                  "the device's choice is not the CPU's", round, H, (long long)most, (long long)budget,
                  (long long)sinks, (long long)len);
        for (int64_t i = 0; with_u && i < off[H]; i++)
            cr_expect(isnan(u_cpu[i]) ? isnan(u_gpu[i]) : u_cpu[i] == u_gpu[i], "round %d: bound %lld", round, (long long)i);
        free(u_cpu);
        free(u_gpu);
        if (bind) be_unbind(gpu, got);
        free(got);
        free(want);
        free(mm);
        free(sum);
    }
}

/* A named list through a decode, on the descriptors the device keeps between calls
 * (kernels/page_tables.c) and with the shape the forward pass would give (appends keep it, other
 * changes make a new one): each head's last page grows a row a step, two steps in three bring a
 * deferred step's own row (one more entry a head, on the device), a page is rewritten under a new
 * generation, pages are dropped (the later heads' entries move), and another page set is attended
 * under the same name now and then. Every step equals the CPU. */
Test(cuda, a_named_page_list_kept_on_the_device_stays_right_through_a_decode)
{
    seed_rng("tables");
    const int D = 64, nh = 8, nkv = 2;
    page_set ps, other;
    make_pages(&ps, nkv, 7, D, 0, 0);
    uint64_t shape = ++gen_counter;
    make_pages(&other, nkv, 3, D, 0, 0);
    uint8_t *dropped = calloc((size_t)ps.n_pages, 1), *none = calloc((size_t)other.n_pages, 1);
    float *q = malloc(sizeof(float) * (size_t)(nh * D));
    int32_t qp = INT32_MAX / 2;   /* sees every row */
    double worst = 0, worst_other = 0;
    for (int step = 0; step < 120; step++) {
        for (int i = 0; i < nh * D; i++) q[i] = frand(-0.5f, 0.5f);
        for (int g = 0; g < nkv; g++) {   /* a row appended to the head's last page */
            be_kv_page *pg = &ps.pages[ps.head_pages[g + 1] - 1];
            if (pg->n < 64) pg->n++;
        }
        if (step % 9 == 4) {   /* a page rewritten: a new generation */
            int64_t i = (int64_t)(rnd() % (uint32_t)ps.n_pages);
            for (int d = 0; d < D; d++) ps.kv[i][d] = quant_f32_to_fp16(frand(-1, 1));
            ps.pages[i].gen = ++gen_counter;
            shape = ++gen_counter;
        }
        if (step % 17 == 8) {   /* head 0 never loses its last page */
            dropped[ps.head_pages[0] + (int64_t)(rnd() % 6)] = 1;
            shape = ++gen_counter;
        }
        attend_list(&ps, dropped, nh, nkv, D, q, &qp, 7, shape, step % 3 != 0, &worst);
        if (step % 10 == 5) attend_list(&other, none, nh, nkv, D, q, &qp, 7, 0, 0, &worst_other);
    }
    cr_expect(worst < 2e-3, "max |diff| %g through the decode", worst);
    cr_expect(worst_other < 2e-3, "max |diff| %g for the other list under the same name", worst_other);
    free(q);
    free(dropped);
    free(none);
    free_pages(&ps);
    free_pages(&other);
}

Test(cuda, grouped_attention_gives_the_hosts_bits)
{
    seed_rng("grouped attention bits");
    const char *splits[] = { "1", "3", "40" };
    be_backend *bes[3];
    for (int k = 0; k < 3; k++) bes[k] = gpu_with("KVCHAT_CUDA_ATTN_SPLITS", splits[k]);
    const int dims[] = { 8, 16, 32, 64, 96, 128, 192, 256 };
    const int heads[][2] = { { 4, 1 }, { 8, 2 }, { 6, 3 }, { 12, 1 }, { 10, 2 }, { 3, 3 } };
    char err[256];
    for (size_t di = 0; di < 8; di++)
        for (size_t hi = 0; hi < 6; hi++)
            for (int variant = 0; variant < 4; variant++) {
                const int D = dims[di], nh = heads[hi][0], nkv = heads[hi][1], k = (int)(rnd() % 3);
                page_set ps;
                make_pages(&ps, nkv, 1 + (int)(rnd() % 9), D, variant & 1, variant & 2);
                const int64_t nq = variant == 3 ? 5 : 1;
                const size_t n = (size_t)(nq * nh * D);
                float *q = malloc(sizeof(float) * n), *o = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
                int32_t *qp = malloc(sizeof(int32_t) * (size_t)nq);
                for (size_t i = 0; i < n; i++) q[i] = frand(-0.5f, 0.5f), o[i] = NAN;
                for (int64_t t = 0; t < nq; t++) qp[t] = t == 0 ? ps.max_pos : (int32_t)(rnd() % (uint32_t)(ps.max_pos + 1));
                be_attn a = { q, nq, qp, nh, nkv, D, ps.pages, ps.n_pages, ps.head_pages, variant == 2 ? 40 : 0, o,
                              NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
                ag_attention_sim(&a, atoi(splits[k]), want);
                attend_on(bes[k], &a, q, n, (int)(rnd() & 1));
                cr_assert(!be_failed(bes[k], err, sizeof err), "%s", err);
                size_t bad = 0;
                for (size_t i = 0; i < n; i++) bad += memcmp(&o[i], &want[i], sizeof(float)) != 0;
                cr_expect(bad == 0, "D %d, %d heads / %d KV, variant %d, %s splits: %zu of %zu outputs differ from the host",
                          D, nh, nkv, variant, splits[k], bad, n);
                free(q);
                free(o);
                free(want);
                free(qp);
                free_pages(&ps);
            }
    for (int k = 0; k < 3; k++) be_free(bes[k]);
}

/* A slot's rows fetched 2, 4 (the default) or 8 a round (KVCHAT_CUDA_ATTN_ROWS) by both grouped
 * kernels (one list, joined calls') and a block's pages staged AG_PCHUNK at a time: 3 calls of
 * 33 to 80 pages a head (one split crosses two chunks) or of 1 to 9, at the 7B's shape, the default
 * model's and two more, masks, bias, a window, queries at the last position or before some pages
 * (staged away), each alone and all joined: every output the host simulation's bits. */
Test(cuda, the_rows_a_round_and_the_staged_chunks_give_the_hosts_bits)
{
    seed_rng("rows a round");
    const char *rows[] = { "2", "4", "8" }, *splits[] = { "1", "5" };
    be_backend *bes[3][2];
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < 2; k++) {
            setenv("KVCHAT_CUDA_ATTN_SPLITS", splits[k], 1);
            bes[r][k] = gpu_with("KVCHAT_CUDA_ATTN_ROWS", rows[r]);
            unsetenv("KVCHAT_CUDA_ATTN_SPLITS");
        }
    /* the 7B's, the default model's, and groups of 4 and 3 (a block of 3 heads: lanes of the slot
     * that compute no head's weight) on lanes past the head's 80 dimensions */
    const int shapes[][3] = { { 32, 8, 128 }, { 4, 1, 256 }, { 8, 2, 64 }, { 6, 2, 80 } };
    char err[256];
    enum { N = 3 };
    for (int si = 0; si < 4; si++)
        for (int variant = 0; variant < 4; variant++) {
            /* variants: 0 plain, 1 masks (both over 1 split: a split crossing chunks), 2 bias, 3 masks,
             * bias and a window (over 5 splits; 3 of 1 to 9 pages a head) */
            const int nh = shapes[si][0], nkv = shapes[si][1], D = shapes[si][2], k = variant >> 1;
            const int64_t HD = (int64_t)nh * D;
            const size_t nq = (size_t)(N * HD);
            page_set ps[N];
            be_attn a[N];
            int32_t qp[N];
            float *q = malloc(sizeof(float) * nq), *want = malloc(sizeof(float) * nq), *got = malloc(sizeof(float) * nq);
            cr_assert(q && want && got);
            for (size_t i = 0; i < nq; i++) q[i] = frand(-0.5f, 0.5f);
            for (int i = 0; i < N; i++) {
                const int per = variant < 3 ? 33 + (int)(rnd() % 48) : 1 + (int)(rnd() % 9);
                make_pages(&ps[i], nkv, per, D, variant & 1, variant >= 2);
                qp[i] = i == 1 ? ps[i].max_pos / 2 : ps[i].max_pos;
                a[i] = (be_attn){ .q = q + i * HD, .n_q = 1, .q_pos = &qp[i], .n_head = nh, .n_head_kv = nkv,
                                  .head_dim = D, .pages = ps[i].pages, .n_pages = ps[i].n_pages,
                                  .head_pages = ps[i].head_pages, .window = variant == 3 ? 40 : 0,
                                  .out = want + i * HD, .table = ++gen_counter };
                ag_attention_sim(&a[i], atoi(splits[k]), want + i * HD);
            }
            cr_assert(be_attn_seqs_joined(a, N));
            for (int r = 0; r < 3; r++)
                for (int joined = 0; joined < 2; joined++) {
                    for (size_t i = 0; i < nq; i++) got[i] = NAN;
                    for (int i = 0; i < N; i++) a[i].out = got + i * HD;
                    if (joined) bes[r][k]->ops->attention_seqs(bes[r][k], a, N);
                    else
                        for (int i = 0; i < N; i++) bes[r][k]->ops->attention(bes[r][k], &a[i]);
                    cr_assert(!be_failed(bes[r][k], err, sizeof err), "%s", err);
                    size_t bad = 0;
                    for (size_t i = 0; i < nq; i++) bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
                    cr_expect(bad == 0, "%d heads / %d KV of %d, variant %d, %s rows a round, %s splits, %s: %zu of %zu "
                              "outputs differ from the host", nh, nkv, D, variant, rows[r], splits[k],
                              joined ? "joined" : "alone", bad, nq);
                }
            for (int i = 0; i < N; i++) free_pages(&ps[i]);
            free(q);
            free(want);
            free(got);
        }
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < 2; k++) be_free(bes[r][k]);
}

/* A bad rows-a-round setting is refused in one line, naming the values it takes. */
Test(cuda, a_bad_rows_a_round_setting_is_refused)
{
    gpu_refuses("KVCHAT_CUDA_ATTN_ROWS", "3", "KVCHAT_CUDA_ATTN_ROWS must be 2, 4 (the default) or 8");
}

/* The split merge takes its splits' weights a tile of AG_CTILE at a time and their partials
 * AG_CLOADS at a time (attn_combine): more splits than a tile (257 and 300 forced, over as many
 * pages a head: a split a page), at the default model's shape (4 query heads on a KV head of 256)
 * and the 7B's (32 on 8 of 128), still give the host's serial merge's bits. The bound runs also
 * mask tokens (some pages then see nothing: splits of -inf). */
Test(cuda, a_merge_of_more_splits_than_a_tile_gives_the_hosts_bits)
{
    seed_rng("many splits");
    const char *splits[] = { "257", "300" };
    const int shapes[][3] = { { 256, 4, 1 }, { 128, 32, 8 } };
    char err[256];
    for (int k = 0; k < 2; k++) {
        be_backend *b = gpu_with("KVCHAT_CUDA_ATTN_SPLITS", splits[k]);
        for (int si = 0; si < 2; si++)
            for (int bind = 0; bind < 2; bind++) {
                const int D = shapes[si][0], nh = shapes[si][1], nkv = shapes[si][2];
                page_set ps;
                make_pages(&ps, nkv, atoi(splits[k]), D, bind, 0);
                const size_t n = (size_t)nh * (size_t)D;
                float *q = malloc(sizeof(float) * n), *o = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
                for (size_t i = 0; i < n; i++) q[i] = frand(-0.5f, 0.5f), o[i] = NAN;
                int32_t qp = ps.max_pos;
                be_attn a = { q, 1, &qp, nh, nkv, D, ps.pages, ps.n_pages, ps.head_pages, 0, o,
                              NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
                ag_attention_sim(&a, atoi(splits[k]), want);
                attend_on(b, &a, q, n, bind);
                cr_assert(!be_failed(b, err, sizeof err), "%s", err);
                size_t bad = 0;
                for (size_t i = 0; i < n; i++) bad += memcmp(&o[i], &want[i], sizeof(float)) != 0;
                cr_expect(bad == 0, "D %d, %d heads / %d KV, %s splits (bound %d): %zu of %zu outputs differ from the host",
                          D, nh, nkv, splits[k], bind, bad, n);
                free(q);
                free(o);
                free(want);
                free_pages(&ps);
            }
        be_free(b);
    }
}

/* The tensor-core flash kernel (KVCHAT_CUDA_ATTN=flash, calls of AF_MIN_Q queries or more) against its
 * host simulation (af_attention_sim: the same tiles, lanes, fragment layouts and splits; the device
 * sums its products in its own order and uses its fast exponential, and a weight near an f16
 * rounding boundary may round the other way: 2e-3) and against the CPU (2e-3, as every attention
 * path): head dimensions 16 to 256 (one and two warps a row tile, 192 with a part-filled second
 * warp), groups of 1 to 12, masks, bias, windows, 16 to 70 queries (row tiles part empty), the
 * device's own splits and forced ones (1, 3: the partials and their merge), query and output bound
 * or not; every call must have run the flash kernel (be_cuda_flash_calls), not a fallback. */
Test(cuda, flash_attention_equals_its_host_simulation_and_the_cpu)
{
    seed_rng("flash attention");
    setenv("KVCHAT_CUDA_ATTN", "flash", 1);
    be_backend *fl[3];
    fl[0] = gpu_with("KVCHAT_CUDA_ATTN_SPLITS", "1");
    fl[1] = gpu_with("KVCHAT_CUDA_ATTN_SPLITS", "3");
    fl[2] = gpu_with("KVCHAT_CUDA_ATTN", "flash");   /* splits by the device */
    unsetenv("KVCHAT_CUDA_ATTN");
    const int dims[] = { 16, 64, 80, 128, 192, 256 };
    const int heads[][2] = { { 4, 1 }, { 8, 2 }, { 6, 3 }, { 12, 1 }, { 10, 2 }, { 3, 3 } };
    char err[256];
    double worst_sim = 0, worst_cpu = 0;
    for (size_t di = 0; di < 6; di++)
        for (size_t hi = 0; hi < 6; hi++)
            for (int variant = 0; variant < 4; variant++) {
                const int D = dims[di], nh = heads[hi][0], nkv = heads[hi][1], k = (int)(rnd() % 3);
                page_set ps;
                make_pages(&ps, nkv, 1 + (int)(rnd() % 9), D, variant & 1, variant & 2);
                const int64_t nq = AF_MIN_Q + (int64_t)(rnd() % 55);
                const size_t n = (size_t)(nq * nh * D);
                float *q = malloc(sizeof(float) * n), *o = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n),
                      *o_cpu = malloc(sizeof(float) * n);
                int32_t *qp = malloc(sizeof(int32_t) * (size_t)nq);
                for (size_t i = 0; i < n; i++) q[i] = frand(-0.5f, 0.5f), o[i] = NAN;
                /* a chunk ending at the last key (its first rows see little), or rows anywhere */
                for (int64_t t = 0; t < nq; t++) {
                    const int32_t back = ps.max_pos - (int32_t)(nq - 1 - t);
                    qp[t] = variant == 3 || back < 0 ? (int32_t)(rnd() % (uint32_t)(ps.max_pos + 1)) : back;
                }
                be_attn a = { q, nq, qp, nh, nkv, D, ps.pages, ps.n_pages, ps.head_pages, variant == 2 ? 40 : 0, o_cpu,
                              NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
                cpu->ops->attention(cpu, &a);
                af_attention_sim(&a, k == 1 ? 3 : 1, want);
                a.out = o;
                const uint64_t calls = be_cuda_flash_calls(fl[k]);
                attend_on(fl[k], &a, q, n, (int)(rnd() & 1));
                cr_expect(be_cuda_flash_calls(fl[k]) == calls + 1, "D %d, %lld queries: the flash kernel did not run",
                          D, (long long)nq);
                cr_assert(!be_failed(fl[k], err, sizeof err), "%s", err);
                const double ds = max_abs_diff(o, want, (int64_t)n), dc = max_abs_diff(o, o_cpu, (int64_t)n);
                cr_expect(ds < 2e-3 && dc < 2e-3, "D %d, %d heads / %d KV, variant %d, %lld queries, backend %d: %g from "
                          "the host simulation, %g from the CPU", D, nh, nkv, variant, (long long)nq, k, ds, dc);
                if (ds > worst_sim) worst_sim = ds;
                if (dc > worst_cpu) worst_cpu = dc;
                free(q);
                free(o);
                free(want);
                free(o_cpu);
                free(qp);
                free_pages(&ps);
            }
    cr_log_info("flash attention: worst %.2e from the host simulation, %.2e from the CPU", worst_sim, worst_cpu);
    for (int k = 0; k < 3; k++) be_free(fl[k]);
}

/* One element-wise op on both backends: buffers a (in/out) and b (in) of n floats; the GPU's bound to
 * device twins or not. Returns the relative difference of a. */
typedef void (*ew_fn)(be_backend *be, float *a, const float *b, void *arg);
static double compare_elementwise(ew_fn fn, void *arg, const float *a0, const float *b0, int64_t na, int64_t nb,
                                  int bind)
{
    float *ac = malloc(sizeof(float) * (size_t)na), *ag = malloc(sizeof(float) * (size_t)na);
    float *bc = malloc(sizeof(float) * (size_t)nb), *bg = malloc(sizeof(float) * (size_t)nb);
    memcpy(ac, a0, sizeof(float) * (size_t)na);
    memcpy(ag, a0, sizeof(float) * (size_t)na);
    memcpy(bc, b0, sizeof(float) * (size_t)nb);
    memcpy(bg, b0, sizeof(float) * (size_t)nb);
    char err[256];
    if (bind)
        cr_assert(be_bind(gpu, ag, sizeof(float) * (size_t)na, err, sizeof err) == 0 &&
                      be_bind(gpu, bg, sizeof(float) * (size_t)nb, err, sizeof err) == 0,
                  "%s", err);
    fn(cpu, ac, bc, arg);
    fn(gpu, ag, bg, arg);
    if (bind) {
        be_range r = { ag, sizeof(float) * (size_t)na };
        be_host_read(gpu, &r, 1);
        be_unbind(gpu, ag);
        be_unbind(gpu, bg);
    }
    double d = rel_diff(ag, ac, na);
    free(ac);
    free(ag);
    free(bc);
    free(bg);
    return d;
}

typedef struct ew_arg {
    int64_t rows, dim;
    int heads, kv_heads, head_dim, neox, gelu, norm;
    const int32_t *pos;
    const float *w;
    float base;
} ew_arg;

/* a = rmsnorm(b) with weights w */
static void ew_rmsnorm(be_backend *be, float *a, const float *b, void *arg)
{
    ew_arg *e = arg;
    be->ops->rmsnorm(be, b, e->w, a, e->rows, e->dim, 1e-6f);
}
static void ew_rmsnorm_inplace(be_backend *be, float *a, const float *b, void *arg)
{
    ew_arg *e = arg;
    be->ops->rmsnorm(be, a, e->w, a, e->rows, e->dim, 1e-6f);
}
/* a = q (rows tokens of heads heads) then k (kv_heads heads), normalized (norm), rotated, q scaled */
static void ew_qk_rope(be_backend *be, float *a, const float *b, void *arg)
{
    ew_arg *e = arg;
    be_qk r = { .q = a, .k = a + e->rows * e->heads * e->head_dim, .n_tok = e->rows, .n_head = e->heads,
                .n_head_kv = e->kv_heads, .head_dim = e->head_dim, .q_norm = e->norm ? e->w : NULL,
                .k_norm = e->norm ? e->w + e->head_dim : NULL, .eps = 1e-6f, .pos = e->pos, .freq_base = e->base,
                .freq_scale = 1.0f, .neox = e->neox, .q_scale = 0.0883883f };
    be->ops->qk_rope(be, &r);
}
static void ew_glu(be_backend *be, float *a, const float *b, void *arg)
{
    ew_arg *e = arg;
    be->ops->glu(be, a, b, e->rows * e->dim, e->gelu);
}
/* a = x, o, h side by side: x += o (o normalized first with norm), h = rmsnorm(x) (with w) */
static void ew_add_norm(be_backend *be, float *a, const float *b, void *arg)
{
    ew_arg *e = arg;
    int64_t n = e->rows * e->dim;
    be->ops->add_norm(be, a, a + n, e->norm ? e->w : NULL, e->gelu ? e->w + e->dim : NULL, a + 2 * n, e->rows, e->dim,
                      1e-6f);
}

Test(cuda, element_wise_ops_equal_the_cpu_on_bound_and_unbound_buffers)
{
    seed_rng("element-wise");
    const int64_t shapes[][2] = { { 1, 640 }, { 7, 37 }, { 3, 2049 }, { 130, 256 } };
    for (size_t si = 0; si < 4; si++)
        for (int bind = 0; bind < 2; bind++) {
            int64_t rows = shapes[si][0], dim = shapes[si][1], n = rows * dim;
            float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
            float *w = malloc(sizeof(float) * (size_t)dim);
            for (int64_t i = 0; i < n; i++) a[i] = frand(-4, 4), b[i] = frand(-4, 4);
            for (int64_t i = 0; i < dim; i++) w[i] = frand(0.5f, 2);
            ew_arg e = { .rows = rows, .dim = dim, .w = w };
            double d = compare_elementwise(ew_rmsnorm, &e, a, b, n, n, bind);
            cr_expect(d < 1e-6, "rmsnorm %lld x %lld (bound %d): %g", (long long)rows, (long long)dim, bind, d);
            d = compare_elementwise(ew_rmsnorm_inplace, &e, a, b, n, n, bind);
            cr_expect(d < 1e-6, "rmsnorm in place %lld x %lld (bound %d): %g", (long long)rows, (long long)dim, bind, d);
            for (e.gelu = 0; e.gelu < 2; e.gelu++) {
                d = compare_elementwise(ew_glu, &e, a, b, n, n, bind);
                cr_expect(d < 1e-5, "glu (gelu %d) %lld floats (bound %d): %g", e.gelu, (long long)n, bind, d);
            }
            free(a);
            free(b);
            free(w);
        }
}

/* A model's norm weights declared to a backend (be_ops.constants, as engine/run.c does at load)
 * are copied then and used from that copy: add_norm, rmsnorm and qk_rope give the bits of a backend
 * that compares them at every call, and never look at the host's bytes again (a weight changed
 * behind the backend's back, which a model's never are, is not seen; the comparing backend sees
 * it). */
Test(cuda, declared_constants_give_the_compared_copies_bits_and_are_not_looked_at_again)
{
    seed_rng("declared constants");
    enum { ROWS = 2, DIM = 4096, HEADS = 4, HD = 128 };
    char err[256];
    static float w[DIM], post[DIM], qn[HD], kn[HD];
    for (int i = 0; i < DIM; i++) w[i] = frand(0.5f, 1.5f), post[i] = frand(0.5f, 1.5f);
    for (int i = 0; i < HD; i++) qn[i] = frand(0.5f, 1.5f), kn[i] = frand(0.5f, 1.5f);
    be_backend *bes[2] = { be_cuda_create(2, err, sizeof err), NULL };
    cr_assert(bes[0], "%s", err);
    bes[1] = be_cuda_create(2, err, sizeof err);
    cr_assert(bes[1], "%s", err);
    const be_range cs[4] = { { w, sizeof w }, { post, sizeof post }, { qn, sizeof qn }, { kn, sizeof kn } };
    be_constants(bes[0], cs, 4);
    float *x0 = malloc(sizeof(float) * ROWS * DIM), *o0 = malloc(sizeof(float) * ROWS * DIM);
    for (int i = 0; i < ROWS * DIM; i++) x0[i] = frand(-2, 2), o0[i] = frand(-2, 2);
    int32_t pos[ROWS] = { 17, 4000 };
    float *out[2][2];   /* [backend][before, after the weights change] : h, rmsnorm's y, q and k side by side */
    const size_t nh = ROWS * DIM, nq = ROWS * HEADS * HD, nk = ROWS * HD, nout = 2 * nh + nq + nk;
    for (int round = 0; round < 2; round++) {
        if (round) w[5] += 1.0f, post[7] += 1.0f, qn[3] += 1.0f, kn[9] += 1.0f;   /* behind the backends' backs */
        for (int k = 0; k < 2; k++) {
            be_backend *b = bes[k];
            float *x = malloc(sizeof(float) * nh), *o = malloc(sizeof(float) * nh), *h = malloc(sizeof(float) * nh);
            float *y = malloc(sizeof(float) * nh), *qk = malloc(sizeof(float) * (nq + nk));
            memcpy(x, x0, sizeof(float) * nh);
            memcpy(o, o0, sizeof(float) * nh);
            for (size_t i = 0; i < nq + nk; i++) qk[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
            float *bufs[5] = { x, o, h, y, qk };
            const size_t sizes[5] = { nh, nh, nh, nh, nq + nk };
            for (int i = 0; i < 5; i++)
                cr_assert(be_bind(b, bufs[i], sizeof(float) * sizes[i], err, sizeof err) == 0, "%s", err);
            b->ops->add_norm(b, x, o, post, w, h, ROWS, DIM, 1e-6f);
            b->ops->rmsnorm(b, x, w, y, ROWS, DIM, 1e-6f);
            be_qk r = { .q = qk, .k = qk + nq, .n_tok = ROWS, .n_head = HEADS, .n_head_kv = 1, .head_dim = HD,
                        .q_norm = qn, .k_norm = kn, .eps = 1e-6f, .pos = pos, .freq_base = 10000.0f,
                        .freq_scale = 1.0f, .neox = 1, .q_scale = 1.0f };
            b->ops->qk_rope(b, &r);
            be_range rd[3] = { { h, sizeof(float) * nh }, { y, sizeof(float) * nh }, { qk, sizeof(float) * (nq + nk) } };
            be_host_read(b, rd, 3);
            cr_assert(!be_failed(b, err, sizeof err), "%s", err);
            out[k][round] = malloc(sizeof(float) * nout);
            memcpy(out[k][round], h, sizeof(float) * nh);
            memcpy(out[k][round] + nh, y, sizeof(float) * nh);
            memcpy(out[k][round] + 2 * nh, qk, sizeof(float) * (nq + nk));
            for (int i = 0; i < 5; i++) {
                be_unbind(b, bufs[i]);
                free(bufs[i]);
            }
        }
    }
    cr_expect(!memcmp(out[0][0], out[1][0], sizeof(float) * nout), "declared constants: not the compared copies' bits");
    cr_expect(!memcmp(out[0][1], out[0][0], sizeof(float) * nout), "a declared constant was looked at again");
    cr_expect(memcmp(out[1][1], out[1][0], sizeof(float) * nh) && memcmp(out[1][1] + nh, out[1][0] + nh, sizeof(float) * nh) &&
                  memcmp(out[1][1] + 2 * nh, out[1][0] + 2 * nh, sizeof(float) * (nq + nk)),
              "the comparing backend missed a changed weight");
    for (int k = 0; k < 2; k++) {
        free(out[k][0]);
        free(out[k][1]);
        be_free(bes[k]);
    }
    free(x0);
    free(o0);
}

/* The fused ops (kernels/fused_kernels.h) against the CPU, bound and unbound: add_norm with and
 * without each norm (a plain add to the bit), q and k made ready for head sizes of the models and
 * odd ones, GQA groups, both pairings, with and without the norms, positions up to 100000. */
Test(cuda, fused_ops_equal_the_cpu_on_bound_and_unbound_buffers)
{
    seed_rng("fused ops");
    const int64_t shapes[][2] = { { 1, 640 }, { 7, 37 }, { 3, 2049 }, { 130, 256 } };
    for (size_t si = 0; si < 4; si++)
        for (int bind = 0; bind < 2; bind++) {
            int64_t rows = shapes[si][0], dim = shapes[si][1], n = rows * dim;
            float *x3 = malloc(sizeof(float) * 3 * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
            float *w2 = malloc(sizeof(float) * 2 * (size_t)dim);
            for (int64_t i = 0; i < 3 * n; i++) x3[i] = frand(-4, 4);
            for (int64_t i = 0; i < n; i++) b[i] = 0;
            for (int64_t i = 0; i < 2 * dim; i++) w2[i] = frand(0.5f, 2);
            ew_arg e = { .rows = rows, .dim = dim, .w = w2 };
            for (int v = 0; v < 4; v++) {
                e.norm = v & 1;
                e.gelu = v >> 1;   /* here: with w */
                double d = compare_elementwise(ew_add_norm, &e, x3, b, 3 * n, n, bind);
                if (v == 0)
                    cr_expect(d == 0, "add_norm without norms %lld x %lld (bound %d): %g", (long long)rows,
                              (long long)dim, bind, d);
                else
                    cr_expect(d < 1e-6, "add_norm %lld x %lld post %d norm %d (bound %d): %g", (long long)rows,
                              (long long)dim, e.norm, e.gelu, bind, d);
            }
            free(x3);
            free(b);
            free(w2);
        }
    const int hd[][3] = { { 4, 1, 256 }, { 1, 1, 64 }, { 3, 3, 6 }, { 8, 2, 128 }, { 32, 8, 128 } };
    for (size_t hi = 0; hi < 5; hi++)
        for (int v = 0; v < 8; v++) {
            int neox = v & 1, norm = (v >> 1) & 1, bind = v >> 2, heads = hd[hi][0], kvh = hd[hi][1], D = hd[hi][2];
            int64_t rows = 5, n = rows * (heads + kvh) * D;
            float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float)), *w = malloc(sizeof(float) * 2 * D);
            int32_t pos[5];
            for (int64_t i = 0; i < n; i++) a[i] = frand(-2, 2);
            for (int i = 0; i < 2 * D; i++) w[i] = frand(0.5f, 2);
            for (int t = 0; t < 5; t++) pos[t] = t == 0 ? 0 : (int32_t)(rnd() % 100000);
            ew_arg e = { .rows = rows, .heads = heads, .kv_heads = kvh, .head_dim = D, .neox = neox, .norm = norm,
                         .pos = pos, .w = w, .base = hi & 1 ? 10000.0f : 1000000.0f };
            double d = compare_elementwise(ew_qk_rope, &e, a, b, n, 1, bind);
            /* cosf/sinf of angles near 1e5 differ by an ulp or two between libm and the device */
            cr_expect(d < 1e-5, "qk_rope %d+%d heads x %d neox %d norm %d (bound %d): %g", heads, kvh, D, neox, norm,
                      bind, d);
            free(a);
            free(b);
            free(w);
        }
}




Test(cuda, attention_with_the_steps_own_rows_equals_the_cpu)
{
    /* a deferred decode step: its K/V rows (f32, maybe on the device) attend after each head's pages */
    seed_rng("step rows");
    const int heads[][2] = { { 4, 1 }, { 8, 2 }, { 6, 3 } };
    for (size_t hi = 0; hi < 3; hi++)
        for (int variant = 0; variant < 4; variant++) {
            int D = variant & 1 ? 128 : 64, nh = heads[hi][0], nkv = heads[hi][1];
            page_set ps;
            make_pages(&ps, nkv, 1 + (int)(rnd() % 9), D, variant & 2, 0);
            int64_t kvd = (int64_t)nkv * D, nq = (int64_t)nh * D;
            float *q = malloc(sizeof(float) * (size_t)nq), *o0 = malloc(sizeof(float) * (size_t)nq),
                  *o1 = malloc(sizeof(float) * (size_t)nq), *ck = malloc(sizeof(float) * (size_t)kvd),
                  *cv = malloc(sizeof(float) * (size_t)kvd);
            for (int64_t i = 0; i < nq; i++) q[i] = frand(-0.5f, 0.5f), o1[i] = NAN;
            for (int64_t i = 0; i < kvd; i++) ck[i] = frand(-1, 1), cv[i] = frand(-1, 1);
            int32_t qp = ps.max_pos + 1;
            /* variant 3: one shared list for every head */
            be_attn a = { q, 1, &qp, nh, nkv, D, ps.pages, variant == 3 ? ps.head_pages[1] : ps.n_pages,
                          variant == 3 ? NULL : ps.head_pages, variant == 2 ? 40 : 0, o0, ck, cv, &qp, 1, 0, 0, 0,
                          NULL, NULL, NULL, 0, NULL, 0, 0 };
            cpu->ops->attention(cpu, &a);
            a.out = o1;
            int bind = (int)(rnd() & 1);
            char err[256];
            if (bind)
                cr_assert(be_bind(gpu, ck, sizeof(float) * (size_t)kvd, err, sizeof err) == 0 &&
                              be_bind(gpu, cv, sizeof(float) * (size_t)kvd, err, sizeof err) == 0,
                          "%s", err);
            gpu->ops->attention(gpu, &a);
            if (bind) {
                be_unbind(gpu, ck);
                be_unbind(gpu, cv);
            }
            double d = max_abs_diff(o0, o1, nq);
            cr_expect(d < 2e-3, "%d heads / %d KV, D %d, variant %d (bound %d): max |diff| %g", nh, nkv, D, variant,
                      bind, d);
            free(q);
            free(o0);
            free(o1);
            free(ck);
            free(cv);
            free_pages(&ps);
        }
}

/* A batch's calls joined (attention_seqs: one launch for all of them): 2 to 8 calls, each with its
 * own pages (masks and bias in some), list lengths and position, under a name of its own, with a
 * row of its own or none, query, output and rows bound to twins or not, and a selection by bounds
 * (its best and counts from the host, some calls without one): every output is the bits its call
 * gives alone (each call keeps its own split count), within 2e-3 of the CPU, and the joined calls
 * make fewer runtime calls than the calls one by one. */
Test(cuda, joined_attention_calls_give_each_call_its_bits_alone)
{
    seed_rng("joined attention");
    cr_assert(gpu->ops->attention_seqs);
    const int shapes[][3] = { { 4, 1, 256 }, { 8, 2, 64 }, { 32, 8, 128 }, { 6, 3, 80 } };
    char err[256];
    enum { SEL_K = 3 };
    for (size_t si = 0; si < 4; si++)
        for (int variant = 0; variant < 8; variant++) {
            const int nh = shapes[si][0], nkv = shapes[si][1], D = shapes[si][2], n = 2 + (int)(rnd() % 7);
            const int rows = variant & 1, bind = variant >> 1 & 1, sel = variant >> 2;
            int32_t best[BE_ATTN_SEQS_MAX][8 * SEL_K], n_best[BE_ATTN_SEQS_MAX][8];
            int64_t from[BE_ATTN_SEQS_MAX][8];
            const int64_t HD = (int64_t)nh * D, kvd = (int64_t)nkv * D;
            const size_t nq = (size_t)(n * HD), nc = (size_t)(n * kvd);
            page_set ps[BE_ATTN_SEQS_MAX];
            be_attn a[BE_ATTN_SEQS_MAX];
            int32_t qp[BE_ATTN_SEQS_MAX];
            float *q = malloc(sizeof(float) * nq), *joined = malloc(sizeof(float) * nq);
            float *alone = malloc(sizeof(float) * nq), *want = malloc(sizeof(float) * nq);
            float *ck = malloc(sizeof(float) * nc), *cv = malloc(sizeof(float) * nc);
            cr_assert(q && joined && alone && want && ck && cv);
            for (size_t i = 0; i < nq; i++) q[i] = frand(-0.5f, 0.5f), joined[i] = alone[i] = NAN;
            for (size_t i = 0; i < nc; i++) ck[i] = frand(-1, 1), cv[i] = frand(-1, 1);
            for (int i = 0; i < n; i++) {
                make_pages(&ps[i], nkv, 1 + (int)(rnd() % 9), D, (int)(rnd() % 2), (int)(rnd() % 2));
                /* a row of its own comes after every page's; without, anywhere up to the last */
                qp[i] = rows ? ps[i].max_pos + 1 : ps[i].max_pos - (int32_t)(rnd() % 3) * ps[i].max_pos / 4;
                a[i] = (be_attn){ .q = q + i * HD, .n_q = 1, .q_pos = &qp[i], .n_head = nh, .n_head_kv = nkv,
                                  .head_dim = D, .pages = ps[i].pages, .n_pages = ps[i].n_pages,
                                  .head_pages = ps[i].head_pages, .window = si == 3 ? 40 : 0, .out = want + i * HD,
                                  .cur_k = rows ? ck + i * kvd : NULL, .cur_v = rows ? cv + i * kvd : NULL,
                                  .cur_pos = rows ? &qp[i] : NULL, .n_cur = rows, .table = ++gen_counter };
                if (sel && i % 3 != 1) {   /* each head's candidates its pages but the last few, some chosen */
                    for (int g = 0; g < nkv; g++) {
                        const int64_t len = ps[i].head_pages[g + 1] - ps[i].head_pages[g];
                        from[i][g] = len - (int64_t)(rnd() % (uint64_t)len);
                        int32_t c = 0;
                        for (int32_t j = 0; j < from[i][g] && c < SEL_K; j++)
                            if (rnd() % 2) best[i][g * SEL_K + c++] = j;
                        n_best[i][g] = c;
                    }
                    a[i].sel_best = best[i];
                    a[i].sel_n_best = n_best[i];
                    a[i].sel_from = from[i];
                    a[i].sel_k = SEL_K;
                }
                cpu->ops->attention(cpu, &a[i]);
            }
            cr_assert(be_attn_seqs_joined(a, n));
            if (bind) {
                cr_assert(be_bind(gpu, q, sizeof(float) * nq, err, sizeof err) == 0 &&
                              be_bind(gpu, joined, sizeof(float) * nq, err, sizeof err) == 0 &&
                              be_bind(gpu, alone, sizeof(float) * nq, err, sizeof err) == 0, "%s", err);
                if (rows)
                    cr_assert(be_bind(gpu, ck, sizeof(float) * nc, err, sizeof err) == 0 &&
                                  be_bind(gpu, cv, sizeof(float) * nc, err, sizeof err) == 0, "%s", err);
            }
            /* joined, then each alone, the lists on the device before either is counted (the first
             * call sends them): the same work but the launch */
            for (int i = 0; i < n; i++) a[i].out = joined + i * HD;
            gpu->ops->attention_seqs(gpu, a, n);
            const uint64_t c0 = be_cuda_runtime_calls(gpu);
            gpu->ops->attention_seqs(gpu, a, n);
            const uint64_t c1 = be_cuda_runtime_calls(gpu);
            for (int i = 0; i < n; i++) {
                a[i].out = alone + i * HD;
                gpu->ops->attention(gpu, &a[i]);
            }
            const uint64_t c2 = be_cuda_runtime_calls(gpu);
            if (bind) {
                be_range r[2] = { { joined, sizeof(float) * nq }, { alone, sizeof(float) * nq } };
                be_host_read(gpu, r, 2);
                void *bound_bufs[] = { q, joined, alone, ck, cv };
                for (int i = 0; i < (rows ? 5 : 3); i++) be_unbind(gpu, bound_bufs[i]);
            }
            cr_assert(!be_failed(gpu, err, sizeof err), "%s", err);
            size_t bad = 0;
            for (size_t i = 0; i < nq; i++) bad += memcmp(&joined[i], &alone[i], sizeof(float)) != 0;
            cr_expect(bad == 0, "%d heads / %d KV of %d, %d calls, variant %d: %zu of %zu outputs joined differ from alone",
                      nh, nkv, D, n, variant, bad, nq);
            double d = max_abs_diff(want, joined, (int64_t)nq);
            cr_expect(d < 2e-3, "%d heads / %d KV of %d, %d calls, variant %d: max |diff| %g from the CPU", nh, nkv, D, n,
                      variant, d);
            cr_expect(c1 - c0 < c2 - c1, "%d calls, variant %d: %llu runtime calls joined, %llu one by one", n, variant,
                      (unsigned long long)(c1 - c0), (unsigned long long)(c2 - c1));
            cr_log_info("%d heads / %d KV of %d, %d calls, variant %d: %llu runtime calls joined, %llu one by one", nh,
                        nkv, D, n, variant, (unsigned long long)(c1 - c0), (unsigned long long)(c2 - c1));
            for (int i = 0; i < n; i++) free_pages(&ps[i]);
            free(q);
            free(joined);
            free(alone);
            free(want);
            free(ck);
            free(cv);
        }
    /* a list the grouped kernel cannot read (rows not whole 16-byte loads: never the cache's): the
     * joined calls go back to a launch each, the same bits */
    enum { NU = 3, UH = 8, UKV = 2, UD = 64, UHD = UH * UD };
    page_set ups[NU];
    be_attn ua[NU];
    int32_t uqp[NU];
    float *uq = malloc(sizeof(float) * NU * UHD), *uj = malloc(sizeof(float) * NU * UHD);
    float *ul = malloc(sizeof(float) * NU * UHD), *uw = malloc(sizeof(float) * NU * UHD);
    cr_assert(uq && uj && ul && uw);
    for (int i = 0; i < NU * UHD; i++) uq[i] = frand(-0.5f, 0.5f), uj[i] = ul[i] = NAN;
    for (int i = 0; i < NU; i++) {
        make_pages(&ups[i], UKV, 4, UD, 0, 0);
        if (i == 1)   /* every row one half off its 16 bytes (the pages have room for 64 rows) */
            for (int64_t p = 0; p < ups[i].n_pages; p++) ups[i].pages[p].k++, ups[i].pages[p].v++;
        uqp[i] = ups[i].max_pos;
        ua[i] = (be_attn){ .q = uq + i * UHD, .n_q = 1, .q_pos = &uqp[i], .n_head = UH, .n_head_kv = UKV,
                           .head_dim = UD, .pages = ups[i].pages, .n_pages = ups[i].n_pages,
                           .head_pages = ups[i].head_pages, .out = uw + i * UHD, .table = ++gen_counter };
        cpu->ops->attention(cpu, &ua[i]);
        ua[i].out = uj + i * UHD;
    }
    gpu->ops->attention_seqs(gpu, ua, NU);
    for (int i = 0; i < NU; i++) {
        ua[i].out = ul + i * UHD;
        gpu->ops->attention(gpu, &ua[i]);
    }
    cr_assert(!be_failed(gpu, err, sizeof err), "%s", err);
    cr_expect(!memcmp(uj, ul, sizeof(float) * NU * UHD), "a list not in 16-byte rows: joined, other bits than alone");
    cr_expect(max_abs_diff(uw, uj, NU * UHD) < 2e-3, "a list not in 16-byte rows: max |diff| %g from the CPU",
              max_abs_diff(uw, uj, NU * UHD));
    for (int i = 0; i < NU; i++) free_pages(&ups[i]);
    free(uq);
    free(uj);
    free(ul);
    free(uw);
}

/* A prefill chunk whose rows the cache takes after its last layer: n_cur queries at the positions
 * of their own rows (f32, maybe on the device), which every KV head attends after its pages (none,
 * for a prompt's first chunk), in pieces of BE_CUR_ROWS; on the flash kernel (the default from
 * AF_MIN_Q queries) and the grouped one. */
Test(cuda, attention_with_a_chunks_own_rows_equals_the_cpu)
{
    seed_rng("chunk rows");
    be_backend *grouped = gpu_with("KVCHAT_CUDA_ATTN", "grouped");
    const int heads[][2] = { { 4, 1 }, { 8, 2 } }, dims[] = { 64, 128, 256 }, rows[] = { 9, 70, 200 };
    const uint64_t flash0 = be_cuda_flash_calls(gpu);
    for (size_t hi = 0; hi < 2; hi++)
        for (size_t di = 0; di < 3; di++)
            for (size_t ri = 0; ri < 3; ri++)
                for (int variant = 0; variant < 4; variant++) {
                    int D = dims[di], nh = heads[hi][0], nkv = heads[hi][1], n = rows[ri];
                    page_set ps;
                    make_pages(&ps, nkv, variant & 1 ? 0 : 1 + (int)(rnd() % 9), D, 0, 0);
                    int64_t kvd = (int64_t)nkv * D, nq = (int64_t)n * nh * D;
                    float *q = malloc(sizeof(float) * (size_t)nq), *o0 = malloc(sizeof(float) * (size_t)nq),
                          *o1 = malloc(sizeof(float) * (size_t)nq), *ck = malloc(sizeof(float) * (size_t)(n * kvd)),
                          *cv = malloc(sizeof(float) * (size_t)(n * kvd));
                    int32_t *qp = malloc(sizeof(int32_t) * (size_t)n);
                    cr_assert(q && o0 && o1 && ck && cv && qp);
                    for (int64_t i = 0; i < nq; i++) q[i] = frand(-0.5f, 0.5f), o1[i] = NAN;
                    for (int64_t i = 0; i < n * kvd; i++) ck[i] = frand(-1, 1), cv[i] = frand(-1, 1);
                    for (int t = 0; t < n; t++) qp[t] = ps.max_pos + 1 + t;
                    be_attn a = { q, n, qp, nh, nkv, D, ps.pages, ps.n_pages, ps.head_pages, variant & 2 ? 40 : 0,
                                  o0, ck, cv, qp, n, 0, 0, 0, NULL, NULL, NULL, 0, NULL, 0, 0 };
                    cpu->ops->attention(cpu, &a);
                    be_backend *dev = rnd() % 2 ? gpu : grouped;
                    int bind = (int)(rnd() & 1);
                    char err[256];
                    if (bind)
                        cr_assert(be_bind(dev, ck, sizeof(float) * (size_t)(n * kvd), err, sizeof err) == 0 &&
                                      be_bind(dev, cv, sizeof(float) * (size_t)(n * kvd), err, sizeof err) == 0,
                                  "%s", err);
                    a.out = o1;
                    attend_on(dev, &a, q, (size_t)nq, (int)(rnd() & 1));
                    if (bind) {
                        be_unbind(dev, ck);
                        be_unbind(dev, cv);
                    }
                    double d = max_abs_diff(o0, o1, nq);
                    cr_expect(d < 2e-3, "%s kernels, %d rows, D %d, %d heads / %d KV, variant %d (bound %d): max |diff| %g",
                              dev == gpu ? "default" : "grouped", n, D, nh, nkv, variant, bind, d);
                    free(q);
                    free(o0);
                    free(o1);
                    free(ck);
                    free(cv);
                    free(qp);
                    free_pages(&ps);
                }
    cr_expect_gt(be_cuda_flash_calls(gpu), flash0, "no chunk ran the flash kernel");
    cr_expect_eq(be_cuda_flash_calls(grouped), 0);
    be_free(grouped);
}

/* More distinct norm weights than the backend's table of constant copies first holds (it grows at
 * 128 and 256), with deferred decode steps (the step's own K/V rows, whose page list the backend
 * keeps in a buffer) before, between and after: the table's growth used to free that buffer, so the
 * next step wrote freed memory and destroying the backend freed it twice. A backend of its own, freed
 * here, so that a failure lands in this test. */
Test(cuda, norm_weights_past_the_constant_tables_growth_leave_the_steps_page_list_alone)
{
    seed_rng("constant table");
    char err[256];
    be_backend *g = be_cuda_create(2, err, sizeof err);
    cr_assert(g, "%s", err);
    enum { ROWS = 2, DIM = 96, N_W = 300 };
    static float w[N_W][DIM];
    float *x = malloc(sizeof(float) * ROWS * DIM), *y = malloc(sizeof(float) * ROWS * DIM);
    float y0[ROWS * DIM];
    for (int i = 0; i < ROWS * DIM; i++) x[i] = frand(-3, 3);
    cr_assert(be_bind(g, x, sizeof(float) * ROWS * DIM, err, sizeof err) == 0 &&
                  be_bind(g, y, sizeof(float) * ROWS * DIM, err, sizeof err) == 0,
              "%s", err);
    be_host_write(g, x, sizeof(float) * ROWS * DIM);
    int D = 64, nh = 4, nkv = 2;
    page_set ps;
    make_pages(&ps, nkv, 3, D, 0, 0);
    int64_t kvd = (int64_t)nkv * D, nq = (int64_t)nh * D;
    float *q = malloc(sizeof(float) * (size_t)nq), *o0 = malloc(sizeof(float) * (size_t)nq),
          *o1 = malloc(sizeof(float) * (size_t)nq), *ck = malloc(sizeof(float) * (size_t)kvd),
          *cv = malloc(sizeof(float) * (size_t)kvd);
    for (int64_t i = 0; i < nq; i++) q[i] = frand(-0.5f, 0.5f);
    for (int64_t i = 0; i < kvd; i++) ck[i] = frand(-1, 1), cv[i] = frand(-1, 1);
    int32_t qp = ps.max_pos + 1;
    be_attn a = { q, 1, &qp, nh, nkv, D, ps.pages, ps.n_pages, ps.head_pages, 0, o0, ck, cv, &qp, 1, 0, 0, 0,
                  NULL, NULL, NULL, 0, NULL, 0, 0 };
    cpu->ops->attention(cpu, &a);
    a.out = o1;
    for (int i = 0; i <= N_W; i++) {
        if (i % 50 == 0) {   /* a deferred step */
            for (int64_t j = 0; j < nq; j++) o1[j] = NAN;
            g->ops->attention(g, &a);
            cr_assert(!be_failed(g, err, sizeof err), "%s", err);
            double d = max_abs_diff(o0, o1, nq);
            cr_expect(d < 2e-3, "step after %d norm weights: max |diff| %g", i, d);
        }
        if (i == N_W) break;
        for (int j = 0; j < DIM; j++) w[i][j] = frand(0.5f, 2);
        g->ops->rmsnorm(g, x, w[i], y, ROWS, DIM, 1e-6f);
        be_range r = { y, sizeof(float) * ROWS * DIM };
        be_host_read(g, &r, 1);
        cpu->ops->rmsnorm(cpu, x, w[i], y0, ROWS, DIM, 1e-6f);
        cr_expect(rel_diff(y, y0, ROWS * DIM) < 1e-6, "norm weight %d", i);
    }
    be_unbind(g, x);
    be_unbind(g, y);
    be_free(g);
    free(x);
    free(y);
    free(q);
    free(o0);
    free(o1);
    free(ck);
    free(cv);
    free_pages(&ps);
}

Test(cuda, device_page_copies_follow_appends_truncation_and_reuse)
{
    seed_rng("page copies");
    int D = 64, nh = 4, nkv = 2;
    page_set ps;
    make_pages(&ps, nkv, 5, D, 0, 0);
    cr_expect(compare_attention(&ps, nh, nkv, D, 1, 0, 0) < 2e-3);
    /* appends: the same generation, more rows */
    for (int64_t i = 0; i < ps.n_pages; i++)
        if (ps.pages[i].n < 64 && i % ps.head_pages[1] == ps.head_pages[1] - 1) ps.pages[i].n++;
    ps.max_pos = 0;
    for (int64_t i = 0; i < ps.n_pages; i++)
        if (ps.pages[i].pos[ps.pages[i].n - 1] > ps.max_pos) ps.max_pos = ps.pages[i].pos[ps.pages[i].n - 1];
    cr_expect(compare_attention(&ps, nh, nkv, D, 1, 0, 0) < 2e-3, "after appends");
    /* truncation and new rows written over old ones: a new generation */
    for (int64_t i = 0; i < ps.n_pages; i++) {
        be_kv_page *pg = &ps.pages[i];
        for (int64_t e = 0; e < (int64_t)pg->n * D; e++) ps.kv[i][e] = quant_f32_to_fp16(frand(-1, 1));
        pg->gen = ++gen_counter;
    }
    cr_expect(compare_attention(&ps, nh, nkv, D, 1, 0, 0) < 2e-3, "after rewriting rows under new generations");
    free_pages(&ps);
}

/* Logits of prompt p2 and 8 greedy steps on one backend, with a policy that evicts (SnapKV at 50%).
 * feed: the tokens to continue with (the other backend's choices, so a near-tie cannot fork the two
 * sequences); NULL: its own greedy choices. */
static float *steps_under(model *m, be_backend *b, int32_t *top, int steps, const int32_t *feed, const char *policy);

static float *steps_of(model *m, be_backend *b, int32_t *top, int steps, const int32_t *feed)
{
    return steps_under(m, b, top, steps, feed, "snapkv:budget=0.5");
}

/* Every step's logits from two runs of steps_under (steps + 1 rows of nv) the same bits; `what`
 * names the case and `than` the second run. */
static void expect_same_steps(const float *a, const float *b, int64_t nv, int steps, const char *what, const char *than)
{
    for (int st = 0; st <= steps; st++)
        cr_expect(!memcmp(a + st * nv, b + st * nv, sizeof(float) * (size_t)nv), "%s, step %d: the logits differ from %s",
                  what, st, than);
}

/* As steps_of, under the policy `policy` (NULL: none, every page attended). */
static float *steps_under(model *m, be_backend *b, int32_t *top, int steps, const int32_t *feed, const char *policy)
{
    char err[512];
    char ppath[256];
    snprintf(ppath, sizeof ppath, "%s/prompts/p2.txt", testdata());
    FILE *f = fopen(ppath, "rb");
    cr_assert(f);
    static char text[8192];
    size_t tl = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    int32_t *ids;
    size_t n;
    cr_assert(tok_encode(m->vocab, text, tl, 1, 0, &ids, &n, err, sizeof err) == 0, "%s", err);
    fwd_opts fo = { 4096, 128, 16 };
    fwd_ctx *fw = fwd_create(m, b, &fo, err, sizeof err);
    cr_assert(fw, "%s", err);
    pol_set *ps = NULL;
    if (policy) {
        pol_spec spec;
        cr_assert(pol_parse(&spec, policy, NULL, err, sizeof err) == 0, "%s", err);
        pol_env env;
        fwd_policy_env(fw, &env);
        ps = pol_set_create(&spec, &env, err, sizeof err);
        cr_assert(ps, "%s", err);
        fwd_set_policy(fw, ps);
    }
    int64_t nv = m->hp.n_vocab;
    float *all = malloc(sizeof(float) * (size_t)(nv * (steps + 1)));
    cr_assert(fwd_eval(fw, ids, (int64_t)n, all, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    for (int s = 0; s <= steps; s++) {
        const float *l = all + s * nv;
        int32_t best = 0;
        for (int64_t i = 1; i < nv; i++)
            if (l[i] > l[best]) best = (int32_t)i;
        top[s] = best;
        int32_t next = feed ? feed[s] : best;
        if (s < steps)
            cr_assert(fwd_eval(fw, &next, 1, all + (s + 1) * nv, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s",
                      err);
    }
    if (ps) {
        fwd_set_policy(fw, NULL);
        pol_set_free(ps);
    }
    fwd_free(fw);
    free(ids);
    return all;
}

static int model_quantized(const model *m);

/* Fewer launches a step (stage 4's third part: the products' input codes from the ops that wrote
 * them, attention's included; a launch for the products of one input and type; a step's K and V
 * converted in the upload batch's launch; the positions kept on the device) change no bit: every
 * tiny model's prompt and eight greedy steps give the logits of KVCHAT_CUDA_LAUNCHES=apart, with
 * every page attended (the step's rows deferred) and under an evicting policy; and on a quantized
 * model no product quantizes its input itself (every one reads its producer's codes). */
Test(cuda, fewer_launches_leave_the_tiny_models_logits_bit_for_bit)
{
    be_backend *apart = gpu_with("KVCHAT_CUDA_LAUNCHES", "apart");
    const char *policies[] = { NULL, "snapkv:budget=0.5" };
    int ran = 0;
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        model *m = load_tiny(fi);
        if (!m) continue;
        const int64_t nv = m->hp.n_vocab;
        for (int pi = 0; pi < 2; pi++) {
            int32_t t0[9], t1[9];
            const uint64_t q0 = be_cuda_input_quantizations(gpu), qa = be_cuda_input_quantizations(apart);
            float *a = steps_under(m, gpu, t0, 8, NULL, policies[pi]);
            float *b = steps_under(m, apart, t1, 8, t0, policies[pi]);
            for (int st = 0; st <= 8; st++)
                cr_expect(!memcmp(a + st * nv, b + st * nv, sizeof(float) * (size_t)nv),
                          "%s, %s, step %d: the logits differ from a launch each", files[fi],
                          policies[pi] ? policies[pi] : "no policy", st);
            /* every decode product's input comes from an op that writes its codes (rmsnorm,
             * add_norm, attention, GLU; the prompt's chunks go to cuBLAS): no quantize launch */
            if (model_quantized(m)) {
                cr_expect_eq(be_cuda_input_quantizations(gpu) - q0, 0,
                             "%s, %s: %llu products quantized their input (%llu with a launch each)", files[fi],
                             policies[pi] ? policies[pi] : "no policy",
                             (unsigned long long)(be_cuda_input_quantizations(gpu) - q0),
                             (unsigned long long)(be_cuda_input_quantizations(apart) - qa));
                cr_expect_gt(be_cuda_input_quantizations(apart) - qa, 0);
            }
            free(a);
            free(b);
            ran++;
        }
        model_free(m);
    }
    cr_expect_gt(ran, 0, "no tiny model here");
    be_free(apart);
}

/* A prompt's K/V rows written into the device's page copies on the device (be_ops.page_rows), and
 * an eviction's fresh pages built there from the copies of the pages they were packed from
 * (be_ops.page_moves), give the logits the rows sent up from the host give
 * (KVCHAT_CUDA_PAGE_ROWS=0), prompt and decode: with no policy (the rows taken a chunk at a time),
 * under CHESS, under TAKE (a layer at a time, then evicted) and under H2O (evicting at every decode
 * step too); and fewer rows are sent. A bad setting is refused. */
Test(cuda, a_prompts_rows_written_into_the_page_copies_on_the_device_give_the_sent_rows_bits)
{
    be_backend *sent = gpu_with("KVCHAT_CUDA_PAGE_ROWS", "0");
    const char *policies[] = { NULL, "chess:preset=aggressive,window=1", "take:budget=0.5", "h2o:budget=0.3" };
    int ran = 0;
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        model *m = load_tiny(fi);
        if (!m) continue;
        const int64_t nv = m->hp.n_vocab;
        for (int pi = 0; pi < 4; pi++) {
            const char *what = policies[pi] ? policies[pi] : "no policy";
            int32_t t0[9], t1[9];
            uint64_t f0, m0, u0, f1, m1, u1, sf0, sm0, su0, sf1, sm1, su1;
            be_cuda_page_rows(gpu, &f0, &m0, &u0);
            be_cuda_page_rows(sent, &sf0, &sm0, &su0);
            float *a = steps_under(m, gpu, t0, 8, NULL, policies[pi]);
            float *b = steps_under(m, sent, t1, 8, t0, policies[pi]);
            be_cuda_page_rows(gpu, &f1, &m1, &u1);
            be_cuda_page_rows(sent, &sf1, &sm1, &su1);
            char named[200];
            snprintf(named, sizeof named, "%s, %s", files[fi], what);
            expect_same_steps(a, b, nv, 8, named, "the rows sent up");
            cr_expect_gt(f1 - f0, 0, "%s, %s: no row written on the device", files[fi], what);
            cr_expect(sf1 - sf0 == 0 && sm1 - sm0 == 0, "%s, %s: rows written or moved on the device with "
                      "KVCHAT_CUDA_PAGE_ROWS=0", files[fi], what);
            /* TAKE and H2O evict: their fresh pages built from the copies (moved), the others' never */
            if (pi >= 2)
                cr_expect_gt(m1 - m0, 0, "%s, %s: no evicted page built on the device", files[fi], what);
            else
                cr_expect_eq(m1 - m0, 0, "%s, %s: rows moved without an eviction", files[fi], what);
            cr_expect_lt(u1 - u0, su1 - su0, "%s, %s: %llu rows sent up, %llu without writing them on the device",
                         files[fi], what, (unsigned long long)(u1 - u0), (unsigned long long)(su1 - su0));
            free(a);
            free(b);
            ran++;
        }
        model_free(m);
    }
    cr_expect_gt(ran, 0, "no tiny model here");
    be_free(sent);
    gpu_refuses("KVCHAT_CUDA_PAGE_ROWS", "yes", "KVCHAT_CUDA_PAGE_ROWS");
}

/* The average calls into the runtime of row `row` in profiled backend p's report (its last
 * column); -1 when the row or the column is missing. */
static double rt_calls_of(be_backend *p, const char *row)
{
    char *text = op_profile_text(p);
    cr_assert(text);
    double v = -1;
    char key[64];
    snprintf(key, sizeof key, "\n%s ", row);
    char *line = strstr(text, key);
    if (line && strstr(text, "rt calls")) {
        line += strlen(key);
        char *eol = strchr(line, '\n');
        if (eol) *eol = 0;
        char *last = strrchr(line, ' ');
        if (last) v = atof(last + 1);
    }
    free(text);
    return v;
}

/* The profile's runtime calls an op (KVCHAT_PROFILE's last column behind a CUDA backend) count
 * what stage 4's third part removed: a decode step's products, one launch a call and no quantize
 * launch, against about two with KVCHAT_CUDA_LAUNCHES=apart (fewer where a weight is F16 on the
 * device); add_norm one launch either way. */
Test(cuda, the_profile_counts_the_runtime_calls_of_an_op)
{
    model *m = NULL;
    for (size_t fi = 0; fi < sizeof files / sizeof *files && !m; fi++) {
        m = load_tiny(fi);
        if (m && !model_quantized(m)) {
            model_free(m);
            m = NULL;
        }
    }
    if (!m) cr_skip("no quantized tiny model here");
    char err[512];
    double mm[2], an[2];
    for (int k = 0; k < 2; k++) {
        if (k) setenv("KVCHAT_CUDA_LAUNCHES", "apart", 1);
        be_backend *in = be_cuda_create(2, err, sizeof err);
        unsetenv("KVCHAT_CUDA_LAUNCHES");
        cr_assert(in, "%s", err);
        be_backend *p = op_profile_wrap(in, OP_PROFILE_HOST, NULL);
        cr_assert(p);
        int32_t top[5];
        free(steps_under(m, p, top, 4, NULL, NULL));
        mm[k] = rt_calls_of(p, "matmul 1 token");
        an[k] = rt_calls_of(p, "add_norm");
        p->ops->destroy(p);
    }
    cr_expect(mm[0] > 0 && an[0] > 0, "no runtime calls column: %g %g", mm[0], an[0]);
    cr_expect_leq(mm[0], 1.5, "a decode product made %.2f runtime calls on average", mm[0]);
    cr_expect_gt(mm[1], mm[0] + 0.5, "a decode product made %.2f runtime calls on average with a launch each, %.2f "
                 "without", mm[1], mm[0]);
    cr_expect(an[0] >= 1.0 && an[0] <= 1.5 && an[1] >= 1.0 && an[1] <= 1.5, "add_norm: %.2f and %.2f calls", an[0],
              an[1]);
    model_free(m);
}

/* 1 when a transformer weight is stored quantized (not F32/F16/BF16) */
static int model_quantized(const model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++) {
        const model_layer *L = &m->layers[il];
        const be_weight *ws[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
        for (size_t wi = 0; wi < 7; wi++)
            if (ws[wi]->type != GGML_TYPE_F32 && ws[wi]->type != GGML_TYPE_F16 && ws[wi]->type != GGML_TYPE_BF16)
                return 1;
    }
    return 0;
}

Test(cuda, tiny_model_logits_equal_the_cpu_under_an_evicting_policy)
{
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        model *m = load_tiny(fi);
        if (!m) continue;
        int quantized = model_quantized(m);
        int64_t nv = m->hp.n_vocab;
        int32_t t0[9], t1[9];
        float *a = steps_of(m, cpu, t0, 8, NULL), *b = steps_of(m, gpu, t1, 8, t0);
        double worst = 0, worst_top = 0;
        for (int s = 0; s <= 8; s++) {
            const float *la = a + s * nv, *lb = b + s * nv;
            double d = rel_diff(lb, la, nv);
            if (d > worst) worst = d;
            cr_expect_eq(t0[s], t1[s], "%s step %d: top-1 %d on the CPU, %d on the GPU", files[fi], s, t0[s], t1[s]);
            if (!quantized) {
                cr_expect(d < 1e-2, "%s step %d: logits differ by %g of the largest", files[fi], s, d);
                continue;
            }
            /* Quantized weights: the CPU rounds activations to 8-bit blocks inside quantized dot
             * products (as llama.cpp, which made the references, does) while the GPU multiplies f16
             * weights by f16 activations in prefill and rounds activations to 8-bit codes with
             * finer scales in decode steps, so the whole vocabulary differs by ~3e-2 of the largest.
             * Both meet the reference's 3e-2 against llama.cpp; hold them to that rule between each
             * other: the top logit within 3e-2 relative to max(1, |top logit|). */
            double scale = fmax(1.0, fabs((double)la[t0[s]]));
            double rel = fabs((double)lb[t1[s]] - la[t0[s]]) / scale;
            if (rel > worst_top) worst_top = rel;
            cr_expect(rel <= REF_GATE_Q_TOL, "%s step %d: top logit %f on the GPU, %f on the CPU (relative %.2e > %.0e)",
                      files[fi], s, lb[t1[s]], la[t0[s]], rel, REF_GATE_Q_TOL);
        }
        if (quantized)
            cr_log_info("%s: top logit differs by up to %.2e relative (held to 3e-2), full vocabulary by %.2e of "
                        "the largest", files[fi], worst_top, worst);
        else
            cr_log_info("%s: logits differ by up to %.2e of the largest (held to 1e-2)", files[fi], worst);
        free(a);
        free(b);
        model_free(m);
    }
}

/* The reference gates of tests/test_ref_tiny.c on backend b: every tiny model present x p1, p2, p3,
 * the CPU's tolerances; each run logs its worst top-logit difference (cr_log_info in ref_gate.c).
 * Returns the models run. */
static int gates_on(be_backend *b)
{
    static const char *const prompts[] = { "p1", "p2", "p3" };
    int n_run = 0;
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        char path[256], name[64];
        snprintf(path, sizeof path, "%s/tiny/%s", testdata(), files[fi]);
        if (!model_present(path)) continue;
        size_t len = strlen(files[fi]) - strlen(".gguf");
        cr_assert(len < sizeof name);
        memcpy(name, files[fi], len);
        name[len] = 0;
        float tol = strstr(name, "-f16") ? REF_GATE_F16_TOL : REF_GATE_Q_TOL;
        for (size_t pi = 0; pi < sizeof prompts / sizeof *prompts; pi++)
            ref_gate_run(b, testdata(), name, prompts[pi], tol, "", NULL);
        n_run++;
    }
    return n_run;
}

/* The default: the prompts' prefill chunks through the tensor-core flash kernel. */
Test(cuda, tiny_model_reference_gates_hold_on_the_gpu)
{
    const uint64_t calls = be_cuda_flash_calls(gpu);
    if (gates_on(gpu) > 0) cr_expect(be_cuda_flash_calls(gpu) > calls, "no prefill chunk ran the flash kernel");
    cr_log_info("flash attention calls: %llu", (unsigned long long)(be_cuda_flash_calls(gpu) - calls));
}

/* The same gates with the prefill chunks on the grouped kernel (KVCHAT_CUDA_ATTN=grouped). */
Test(cuda, tiny_model_reference_gates_hold_with_grouped_prefill)
{
    be_backend *gr = gpu_with("KVCHAT_CUDA_ATTN", "grouped");
    gates_on(gr);
    cr_expect(be_cuda_flash_calls(gr) == 0, "KVCHAT_CUDA_ATTN=grouped ran the flash kernel");
    be_free(gr);
}

/* ---------------------------------------------------------------- the sampler's candidates */

/* The device's pick over a bound row against the CPU backend's: without a soft cap the same
 * candidates bit for bit (ties, NaN, infinities, penalized ids); with one, rows of distinct values
 * give the same ids (the device's tanhf may differ by an ulp); the entropy within 1e-5. */
Test(cuda, the_pick_on_the_device_is_the_cpu_backends)
{
    seed_rng("pick");
    char err[512];
    const int64_t sizes[] = { 1, 37, 2049, 32000, 262144 };
    const int32_t ks[] = { 1, 40, 256 };
    float *row = malloc(sizeof(float) * 262144), *host = malloc(sizeof(float) * 262144);
    cr_assert(be_bind(gpu, row, sizeof(float) * 262144, err, sizeof err) == 0, "%s", err);
    int32_t pen[600];
    for (int round = 0; round < 30; round++) {
        int64_t n = sizes[round % 5];
        int32_t k = ks[(round / 5) % 3];
        int capped = round >= 15;
        be_host_write(gpu, row, sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            if (capped) {   /* distinct values, far enough apart that an ulp cannot reorder them */
                row[i] = ((float)(i * 7919 % n) - (float)n / 2) * (40.0f / (float)n);
                continue;
            }
            uint32_t r = rnd() % 400;
            row[i] = r == 0 ? NAN : r == 1 ? -INFINITY : r == 2 ? -0.0f : (float)((int)(rnd() % 64) - 32) * 0.25f;
        }
        int32_t n_pen = 0;
        for (int64_t i = (int64_t)(rnd() % 40); i < n && n_pen < 600; i += 1 + (int64_t)(rnd() % 300))
            pen[n_pen++] = (int32_t)i;
        float cap = capped ? 30.0f : 0.0f, penalty = round & 1 ? 1.3f : 0.8f;
        float v1[BE_PICK_MAX], v2[BE_PICK_MAX];
        int32_t i1[BE_PICK_MAX], i2[BE_PICK_MAX];
        memcpy(host, row, sizeof(float) * (size_t)n);   /* each pick caps its row in place */
        be_pick a = { host, (int32_t)n, cap, pen, n_pen, penalty, k, 1, 0.7f, v1, i1, 0, 0, 0 };
        be_pick b = a;
        b.logits = row;
        b.val = v2;
        b.id = i2;
        cpu->ops->pick(cpu, &a, 1);
        gpu->ops->pick(gpu, &b, 1);
        cr_assert(!be_failed(gpu, err, sizeof err), "%s", err);
        cr_assert_eq(a.n_out, b.n_out, "round %d: %d candidates on the CPU, %d on the GPU", round, a.n_out, b.n_out);
        for (int32_t i = 0; i < a.n_out; i++) {
            cr_assert_eq(i1[i], i2[i], "round %d: candidate %d is %d on the CPU, %d on the GPU", round, i, i1[i], i2[i]);
            if (capped) cr_assert(fabsf(v1[i] - v2[i]) <= 1e-5f * fmaxf(1, fabsf(v1[i])), "round %d: value", round);
            else cr_assert(v1[i] == v2[i], "round %d: candidate %d's value %g, %g", round, i, v1[i], v2[i]);
        }
        cr_assert(fabs(a.h - b.h) <= 1e-5 * fmax(1, a.h) && fabs(a.vh - b.vh) <= 1e-5 * fmax(1, a.vh),
                  "round %d: entropy %g / %g on the CPU, %g / %g on the GPU", round, a.h, a.vh, b.h, b.vh);
    }
    be_unbind(gpu, row);
    free(row);
    free(host);
}

/* A sampled, penalized answer that backtracks (thresholds of 0) on the GPU, through the device's
 * pick or, with pick NULL, from the row downloaded: the logits are the same device bits, so the
 * tokens must be too. */
Test(cuda, answers_through_the_devices_pick_equal_those_from_the_row)
{
    char err[512];
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        model *m = load_tiny(fi);
        if (!m) continue;
        fx_answer out[2];
        for (int with = 0; with < 2; with++) {
            be_ops no_pick = *gpu->ops;
            no_pick.pick = NULL;
            const be_ops *orig = gpu->ops;
            if (!with) gpu->ops = &no_pick;
            fwd_opts fo = { 2048, 64, 8 };
            fwd_ctx *f = fwd_create(m, gpu, &fo, err, sizeof err);
            cr_assert(f, "%s", err);
            int32_t ids[24];
            for (int i = 0; i < 24; i++) ids[i] = 3 + (int32_t)((i * 37) % (m->hp.n_vocab - 3));
            float *logits = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
            samp_params sp = samp_params_default();
            sp.repeat_penalty = 1.2f;
            sp.seed = 9;
            samp *s = samp_create(&sp, m->hp.n_vocab);
            cr_assert(fwd_eval(f, ids, 24, logits, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
            fwd_set_floor(f, 23);
            unc_monitor *mon = unc_create(8, 0);
            unc_thresholds thr = { .valid = 1, .h_mean = 0, .h_var = 0 };
            gen_opts go = { 40, ids[23], &thr, 2, sp.temperature, 1, NULL, 0 };
            memset(&out[with], 0, sizeof out[with]);
            gen_callbacks cb = fwd_fixture_recorder(&out[with]);
            gen_ctx gc = { f, s, m->vocab, mon, logits, m->hp.n_vocab, NULL };
            cr_assert(gen_answer(&gc, &go, &cb, &out[with].res, err, sizeof err) == 0, "%s", err);
            unc_free(mon);
            samp_free(s);
            free(logits);
            fwd_free(f);
            gpu->ops = orig;
        }
        cr_expect(out[0].n == out[1].n && !memcmp(out[0].tok, out[1].tok, sizeof(int32_t) * (size_t)out[0].n),
                  "%s: the answers differ", files[fi]);
        cr_expect(out[1].res.regenerated > 0 && out[0].res.regenerated == out[1].res.regenerated, "%s: backtracking",
                  files[fi]);
        for (int i = 0; i < out[0].n_page && i < out[1].n_page; i++)
            cr_expect(fabs(out[0].page[i].mean_h - out[1].page[i].mean_h) <= 1e-5 * fmax(1, out[0].page[i].mean_h),
                      "%s page %d: entropy %g, %g", files[fi], i, out[0].page[i].mean_h, out[1].page[i].mean_h);
        model_free(m);
    }
}

/* A run of a tiny model on device (BE_DEVICE_*) with 2 threads, greedy defaults and n_ctx tokens. */
static run_config tiny_run_config(const char *path, int device, int64_t n_ctx)
{
    run_config c;
    memset(&c, 0, sizeof c);
    c.model_path = path;
    c.device = device;
    c.n_threads = 2;
    c.n_ctx = n_ctx;
    c.sp = samp_params_default();
    return c;
}

/* The warm-up at load (engine/run.c: on a device by default) pays the one-off costs (kernels loaded
 * on first use) in a throwaway cache: a run loaded with it gives the bits of one loaded without it,
 * through a prompt of two chunks and decode steps, then the same tokens through the device's pick. */
Test(cuda, a_warm_up_at_load_leaves_the_runs_bits_alone)
{
    char err[600], path[256];
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        snprintf(path, sizeof path, "%s/tiny/%s", testdata(), files[fi]);
        if (!model_present(path)) continue;
        run *r[2];
        for (int warm = 0; warm < 2; warm++) {
            run_config c = tiny_run_config(path, BE_DEVICE_CUDA, 1024);
            c.n_batch = 64;
            c.page_size = 8;
            c.warm_up = warm ? 0 : -1;   /* 0: the default, which warms a device up */
            r[warm] = run_create(&c, err, sizeof err);
            cr_assert(r[warm], "%s", err);
            run_figures fg;
            run_get_figures(r[warm], &fg);
            cr_expect(warm ? fg.warm_up_s > 0 : fg.warm_up_s == 0, "%s: warm-up %g s", files[fi], fg.warm_up_s);
        }
        int32_t nv = run_model(r[0])->hp.n_vocab;
        int32_t ids[100];
        for (int i = 0; i < 100; i++) ids[i] = 3 + (int32_t)((i * 41) % (nv - 3));
        for (int k = 0; k < 2; k++)
            cr_assert(run_feed(r[k], ids, 100, NULL, NULL, err, sizeof err) == RUN_OK, "%s", err);
        cr_expect(!memcmp(run_logits(r[0]), run_logits(r[1]), sizeof(float) * (size_t)nv),
                  "%s: the prompt's logits differ after a warm-up", files[fi]);
        for (int t = 0; t < 4; t++) {
            int32_t next = samp_argmax(run_logits(r[0]), nv);
            for (int k = 0; k < 2; k++) cr_assert(run_decode(r[k], next, err, sizeof err) == RUN_OK, "%s", err);
            cr_expect(!memcmp(run_logits(r[0]), run_logits(r[1]), sizeof(float) * (size_t)nv),
                      "%s: decode step %d differs after a warm-up", files[fi], t);
        }
        int32_t next[2] = { samp_argmax(run_logits(r[0]), nv), 0 };
        next[1] = next[0];
        for (int t = 0; t < 4; t++) {   /* and through the device's pick */
            for (int k = 0; k < 2; k++)
                cr_assert(run_decode_greedy(r[k], next[k], &next[k], err, sizeof err) == RUN_OK, "%s", err);
            cr_expect_eq(next[0], next[1], "%s: picked step %d differs after a warm-up", files[fi], t);
        }
        run_free(r[1]);
        run_free(r[0]);
    }
}

/* --device auto (what every command asks by default) runs on the GPU and names it; a GPU that
 * cannot start leaves an auto run on the CPU with the reason in the load note, and fails a run that
 * asked for CUDA. (An unknown KVCHAT_CUDA_ATTN is the failure that can be made here: the other
 * path, weights larger than the device's memory, goes through the same code in engine/run.c.) */
Test(cuda, auto_runs_on_the_gpu_and_falls_back_to_the_cpu_saying_why)
{
    char err[600], path[256], name[128];
    be_gpu g;
    cr_assert_eq(be_cuda_gpu(&g, err, sizeof err), 0, "%s", err);
    cr_expect(g.name[0] && g.count >= 1 && g.cc_major >= 8 && g.total > 0 && g.free <= g.total,
              "%s: %d devices, compute %d.%d, %llu of %llu bytes free", g.name, g.count, g.cc_major, g.cc_minor,
              (unsigned long long)g.free, (unsigned long long)g.total);
    snprintf(path, sizeof path, "%s/tiny/%s", testdata(), files[0]);
    if (!model_present(path)) cr_skip("%s is missing", path);
    run_config c = tiny_run_config(path, BE_DEVICE_AUTO, 256);
    c.warm_up = -1;
    run *r = run_create(&c, err, sizeof err);
    cr_assert(r, "%s", err);
    run_device(r, name, sizeof name);
    cr_expect(run_on_device(r) && !strcmp(name, g.name), "auto ran on %s", name);
    cr_expect(!strstr(run_load_note(r), "not used"), "%s", run_load_note(r));
    run_free(r);
    setenv("KVCHAT_CUDA_ATTN", "fast", 1);
    r = run_create(&c, err, sizeof err);
    c.device = BE_DEVICE_CUDA;
    run *rc = run_create(&c, err, sizeof err);
    unsetenv("KVCHAT_CUDA_ATTN");
    cr_assert(r, "auto did not fall back: %s", err);
    run_device(r, name, sizeof name);
    cr_expect(!run_on_device(r) && !strcmp(name, "CPU (2 threads)"), "auto fell back to %s", name);
    cr_expect(strstr(run_load_note(r), "the GPU was not used (KVCHAT_CUDA_ATTN must be flash") &&
                  strstr(run_load_note(r), "): running on the CPU"), "%s", run_load_note(r));
    run_free(r);
    cr_expect_null(rc, "--device cuda ran with a GPU that cannot start");
    cr_expect(strstr(err, "KVCHAT_CUDA_ATTN must be flash"), "%s", err);
    if (rc) run_free(rc);
}

/* Greedy decode steps through the device's pick on backend b after a 40-token prompt (defined
 * below). */
static void picked_steps(model *m, be_backend *b, int steps, int32_t *tok, float *val, uint64_t *waits);

/* A greedy decode step through the device's pick, its K/V rows deferred, waits for the device
 * once: the rows come back with the pick's answer (the first steps may wait more: the prefill's
 * hidden rows come back before the embedding's write, the staging arena grows). */
Test(cuda, a_picked_decode_step_waits_for_the_device_once)
{
    cr_assert(gpu->ops->counters);
    enum { STEPS = 12 };
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        model *m = load_tiny(fi);
        if (!m) continue;
        int32_t tok[STEPS];
        float val[STEPS];
        uint64_t waits[STEPS];
        picked_steps(m, gpu, STEPS, tok, val, waits);
        for (int s = 1; s <= STEPS; s++)
            if (s > 6)   /* the first steps may also wait while the staging arena grows */
                cr_expect_eq(waits[s - 1], 1, "%s step %d: %llu waits", files[fi], s, (unsigned long long)waits[s - 1]);
        model_free(m);
    }
}

/* Embedding rows gathered on the device (a weight the GPU holds as stored, rows bound) equal the
 * CPU backend's bit for bit, for every type; types the GPU converts (Q4_1, F32) and unbound rows
 * take the host path, the same bits too. */
Test(cuda, the_embedding_gather_on_the_device_is_the_cpus)
{
    seed_rng("gather");
    char err[512];
    const uint32_t types[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                               GGML_TYPE_Q6_K, GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_1, GGML_TYPE_F32 };
    /* the weights stay allocated until the end: the backend keys its copies by address */
    static void *kept[10];
    const int32_t ids[6] = { 130, 0, 7, 7, 129, 64 };
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        be_weight w = random_weight(types[ti], 2304, 131, &kept[ti]);
        const be_weight *wl = &w;
        cr_assert(gpu->ops->prepare(gpu, &wl, 1, err, sizeof err) == 0, "%s", err);
        for (int pass = 0; pass < 4; pass++) {
            int bind = pass >= 2;
            size_t bytes = sizeof(float) * 6 * 2304;
            float *want = malloc(bytes), *got = malloc(bytes);
            if (bind) cr_assert(be_bind(gpu, got, bytes, err, sizeof err) == 0, "%s", err);
            float scale = pass & 1 ? 48.0f : 1.0f;
            cpu->ops->get_rows(cpu, &w, ids, 6, scale, want);
            uint64_t w0, up, down0, down1;
            gpu->ops->counters(gpu, &w0, &up, &down0);
            gpu->ops->get_rows(gpu, &w, ids, 6, scale, got);
            be_range r = { got, bytes };
            be_host_read(gpu, &r, 1);
            gpu->ops->counters(gpu, &w0, &up, &down1);
            cr_assert(!be_failed(gpu, err, sizeof err), "%s", err);
            cr_expect(!memcmp(got, want, bytes), "%s (bound %d, scale %g): the rows differ", quant_type_name(types[ti]),
                      bind, scale);
            /* the rows came from the device exactly when the gather ran there */
            int on_device = bind && be_gpu_reads_as_stored(types[ti]);
            cr_expect_eq(down1 - down0, on_device ? bytes : 0, "%s (bound %d): %llu bytes came back",
                         quant_type_name(types[ti]), bind, (unsigned long long)(down1 - down0));
            if (bind) be_unbind(gpu, got);
            free(want);
            free(got);
        }
    }
}

/* ---------------------------------------------------------------- the selection policies' bounds */

/* Summaries of random keys for the bound tests: [n][2][dim], mn <= mx, a quarter coarse (ties). */
static void random_summaries(float *mm, int64_t n, int64_t dim)
{
    for (int64_t i = 0; i < n; i++) {
        int coarse = rnd() % 4 == 0;
        for (int64_t d = 0; d < dim; d++) {
            float a = frand(-2, 2), c = frand(-2, 2);
            if (coarse) a = (float)(int)(a * 2) / 2, c = (float)(int)(c * 2) / 2;
            mm[(i * 2) * dim + d] = a < c ? a : c;
            mm[(i * 2 + 1) * dim + d] = a < c ? c : a;
        }
    }
}

/* The device's bounds are the CPU's bit for bit and its best the same, with the queries bound or
 * not, for a fresh list and then through a decode under one name and shape: summaries appended,
 * the last one's contents changing; a step under the kept shape sends only what changed. */
Test(cuda, the_bounds_on_the_device_are_the_cpus_bit_for_bit)
{
    seed_rng("bounds");
    char err[512];
    enum { MAXN = 5000 };
    static const int64_t dims[] = { 64, 128, 256, 80 };
    static const int32_t ks[] = { 1, 31, 256 };
    for (int round = 0; round < 12; round++) {
        int H = 1 + (int)(rnd() % 8), G = 1 + (int)(rnd() % 4);
        int64_t dim = dims[round % 4], cnt[8];
        int32_t k = ks[round % 3];
        for (int h = 0; h < H; h++) cnt[h] = 1 + (int64_t)(rnd() % (round < 6 ? 300 : MAXN));
        float *mm = malloc(sizeof(float) * (size_t)(H * (MAXN + 40) * 2 * dim));
        be_summary *sum = malloc(sizeof *sum * (size_t)(H * (MAXN + 40)));
        size_t qbytes = sizeof(float) * (size_t)(H * G * dim);
        float *q = malloc(qbytes);
        random_summaries(mm, H * (MAXN + 40), dim);
        int bind = round & 1;
        if (bind) cr_assert(be_bind(gpu, q, qbytes, err, sizeof err) == 0, "%s", err);
        uint64_t shape = 77 + (uint64_t)round;
        for (int step = 0; step < 40; step++) {
            be_host_write(gpu, q, qbytes);
            for (int64_t i = 0; i < H * G * dim; i++) q[i] = frand(-1, 1);
            int64_t off[9] = { 0 };
            for (int h = 0; h < H; h++) {
                if (step > 0 && rnd() % 3 == 0) cnt[h]++;   /* a page opened */
                off[h + 1] = off[h] + cnt[h];
            }
            for (int h = 0; h < H; h++)
                for (int64_t i = 0; i < cnt[h]; i++) {
                    float *mn = mm + ((int64_t)h * (MAXN + 40) + i) * 2 * dim;
                    sum[off[h] + i] = (be_summary){ .mn = mn, .mx = mn + dim, .gen = (uint64_t)(h * 100000 + i + 1), .n = 1 };
                }
            if (step > 0) {   /* the last summary of each head took a row */
                for (int h = 0; h < H; h++) {
                    be_summary *s = &sum[off[h + 1] - 1];
                    ((float *)s->mx)[rnd() % dim] += 0.5f;
                    s->n = 1 + step;
                }
            }
            float *u1 = malloc(sizeof(float) * (size_t)off[H]), *u2 = malloc(sizeof(float) * (size_t)off[H]);
            int32_t b1[8 * BE_PICK_MAX], b2[8 * BE_PICK_MAX], n1[8], n2[8];
            be_bounds a = { q, H, G, dim, sum, off, 5, shape, k, b1, n1, u1, NULL, 0, 0, 0, 0, NULL };
            be_bounds b = a;
            b.best = b2, b.n_best = n2, b.u = step % 4 == 3 ? NULL : u2;
            uint64_t w0, up0, down0, w1, up1, down1;
            gpu->ops->counters(gpu, &w0, &up0, &down0);
            gpu->ops->bound_pages(gpu, &b);
            gpu->ops->counters(gpu, &w1, &up1, &down1);
            cr_assert(!be_failed(gpu, err, sizeof err), "%s", err);
            be_range rq = { q, qbytes };
            be_host_read(gpu, &rq, 1);
            cpu->ops->bound_pages(cpu, &a);
            if (b.u) {
                int bad = 0;
                for (int64_t i = 0; i < off[H]; i++) bad += memcmp(&u1[i], &u2[i], sizeof(float)) != 0;
                cr_assert_eq(bad, 0, "round %d step %d: %d of %lld bounds differ (dim %lld, group %d)", round, step, bad,
                             (long long)off[H], (long long)dim, G);
            }
            for (int h = 0; h < H; h++) {
                cr_assert_eq(n1[h], n2[h], "round %d step %d head %d: %d best on the CPU, %d on the GPU", round, step, h,
                             n1[h], n2[h]);
                cr_assert(!memcmp(b1 + h * a.k, b2 + h * a.k, sizeof(int32_t) * (size_t)n1[h]),
                          "round %d step %d head %d: the best differ", round, step, h);
            }
            /* after a round's first call (a new list, the staging arena grown): one wait, and what
             * changed sent: a head's last summary and the new one (2 x 2 x dim floats), the queries */
            if (step > 0) {
                cr_assert_eq(w1 - w0, 1, "round %d step %d: %llu waits", round, step, (unsigned long long)(w1 - w0));
                uint64_t most = (uint64_t)H * 2 * 2 * (uint64_t)dim * 4 + 4096 + qbytes;
                cr_expect_leq(up1 - up0, most, "round %d step %d: %llu bytes sent under a kept shape", round, step,
                              (unsigned long long)(up1 - up0));
            }
            free(u1);
            free(u2);
        }
        if (bind) be_unbind(gpu, q);
        free(q);
        free(sum);
        free(mm);
    }
}

/* Quest's bounds and each head's best in one launch (bound_best_kernel: the call's best bound, no
 * bounds asked back): the best and their counts are the CPU backend's, for 1 to 8 heads of 0 to
 * 8,192 summaries (a sort past the default shared memory), k 1 to BE_PICK_MAX, the same list called
 * three times (each launch leaves the heads' tickets at 0 for the next), and nothing waited for
 * until they are read. */
Test(cuda, quest_s_bounds_and_best_in_one_launch_are_the_cpus)
{
    seed_rng("bounds and best in one launch");
    char err[512];
    static const int64_t ns[] = { 1, 300, 2048, 5000, 8192 };
    static const int32_t ks[] = { 1, 63, BE_PICK_MAX };
    for (int round = 0; round < 10; round++) {
        const int H = 1 + (int)(rnd() % 8), G = 1 + (int)(rnd() % 4);
        const int64_t dim = round % 2 ? 128 : 64;
        const int32_t k = ks[round % 3];
        int64_t off[9] = { 0 };
        for (int h = 0; h < H; h++)   /* now and then a last head with none */
            off[h + 1] = off[h] + (h == 0 ? ns[round % 5] : h == H - 1 && round % 4 == 3 ? 0 : 1 + (int64_t)(rnd() % ns[round % 5]));
        float *mm = malloc(sizeof(float) * (size_t)(off[H] * 2 * dim));
        be_summary *sum = malloc(sizeof *sum * (size_t)off[H]);
        const size_t qbytes = sizeof(float) * (size_t)(H * G * dim), bbytes = sizeof(int32_t) * (size_t)(H * k + H);
        float *q = malloc(qbytes);
        int32_t *dbest = malloc(bbytes), b1[8 * BE_PICK_MAX], n1[8];
        cr_assert(mm && sum && q && dbest);
        random_summaries(mm, off[H], dim);
        for (int64_t i = 0; i < off[H]; i++)
            sum[i] = (be_summary){ .mn = mm + i * 2 * dim, .mx = mm + i * 2 * dim + dim, .gen = (uint64_t)i + 1, .n = 1 };
        cr_assert(be_bind(gpu, dbest, bbytes, err, sizeof err) == 0, "%s", err);
        for (int call = 0; call < 3; call++) {
            be_host_write(gpu, q, qbytes);
            for (int64_t i = 0; i < H * G * dim; i++) q[i] = frand(-1, 1);
            be_bounds a = { .q = q, .n_head_kv = H, .group = G, .dim = dim, .sum = sum, .off = off, .table = 0xB0B0,
                            .shape = 9 + (uint64_t)round, .k = k, .best = b1, .n_best = n1 };
            be_bounds b = a;
            b.best = dbest, b.n_best = dbest + H * k;
            uint64_t w0, w1, up, down;
            gpu->ops->counters(gpu, &w0, &up, &down);
            gpu->ops->bound_pages(gpu, &b);
            gpu->ops->counters(gpu, &w1, &up, &down);
            cr_assert(!be_failed(gpu, err, sizeof err), "%s", err);
            if (call > 0) cr_expect_eq(w1, w0, "round %d call %d: the bounds waited", round, call);
            be_range rb = { dbest, bbytes };
            be_host_read(gpu, &rb, 1);
            cpu->ops->bound_pages(cpu, &a);
            for (int h = 0; h < H; h++) {
                cr_assert_eq(n1[h], b.n_best[h], "round %d call %d head %d (%lld summaries, k %d): %d best on the CPU, %d",
                             round, call, h, (long long)(off[h + 1] - off[h]), k, n1[h], b.n_best[h]);
                cr_assert(!memcmp(b1 + h * k, dbest + h * k, sizeof(int32_t) * (size_t)n1[h]),
                          "round %d call %d head %d: the best differ", round, call, h);
            }
        }
        be_unbind(gpu, dbest);
        free(dbest);
        free(q);
        free(sum);
        free(mm);
    }
}

/* CHESS's scores (be_ops.scores) on the device, matrix and scores bound (as CHESS binds them), the
 * anchor bound or not: every row's score is the CPU backend's bit for bit (kernels/score_kernels.h
 * adds in vd_dot_f32's order); rows the host rewrites and announces are scored anew; with all
 * three bound a call and its read back wait once; with the scores unbound the host computes them,
 * the same. */
Test(cuda, the_scores_on_the_device_are_the_cpus_bit_for_bit)
{
    seed_rng("scores");
    char err[512];
    static const int64_t dims[] = { 1, 37, 768, 32768, 4104 };
    static const int64_t rows_of[] = { 5, 300, 1100, 70, 3 };
    for (int si = 0; si < 5; si++) {
        int64_t dim = dims[si], n = rows_of[si];
        float *m = malloc(sizeof(float) * (size_t)(n * dim)), *x = malloc(sizeof(float) * (size_t)dim);
        float *y = malloc(sizeof(float) * (size_t)n), *want = malloc(sizeof(float) * (size_t)n);
        cr_assert(m && x && y && want);
        for (int64_t i = 0; i < n * dim; i++) m[i] = ldexpf(frand(-1, 1), (int)(rnd() % 16) - 8);
        for (int64_t i = 0; i < dim; i++) x[i] = ldexpf(frand(-1, 1), (int)(rnd() % 16) - 8);
        int bind_x = si & 1;
        cr_assert(be_bind(gpu, m, sizeof(float) * (size_t)(n * dim), err, sizeof err) == 0, "%s", err);
        cr_assert(be_bind(gpu, y, sizeof(float) * (size_t)n, err, sizeof err) == 0, "%s", err);
        if (bind_x) cr_assert(be_bind(gpu, x, sizeof(float) * (size_t)dim, err, sizeof err) == 0, "%s", err);
        for (int round = 0; round < 3; round++) {
            if (round > 0) {   /* a few rows and the anchor rewritten, announced first */
                int64_t r0 = (int64_t)(rnd() % (uint32_t)n), r1 = r0 + 1 + (int64_t)(rnd() % 3);
                if (r1 > n) r1 = n;
                be_host_write(gpu, m + r0 * dim, sizeof(float) * (size_t)((r1 - r0) * dim));
                for (int64_t i = r0 * dim; i < r1 * dim; i++) m[i] = frand(-3, 3);
                if (bind_x) be_host_write(gpu, x, sizeof(float) * (size_t)dim);
                for (int64_t i = 0; i < dim; i++) x[i] = frand(-1, 1);
            }
            cpu->ops->scores(cpu, m, n, dim, x, want);
            uint64_t w0, w1, up, down;
            gpu->ops->counters(gpu, &w0, &up, &down);
            gpu->ops->scores(gpu, m, n, dim, x, y);
            be_range ry = { y, sizeof(float) * (size_t)n };
            be_host_read(gpu, &ry, 1);
            gpu->ops->counters(gpu, &w1, &up, &down);
            cr_expect_eq(be_failed(gpu, err, sizeof err), 0, "%s", err);
            int bad = 0;
            for (int64_t r = 0; r < n; r++) bad += memcmp(&y[r], &want[r], sizeof(float)) != 0;
            cr_expect_eq(bad, 0, "%lld x %lld (anchor bound %d), round %d: %d of %lld scores differ", (long long)n,
                         (long long)dim, bind_x, round, bad, (long long)n);
            if (bind_x)   /* as CHESS scores: the op waits for nothing, the read once (an anchor staged
                             through the backend's upload area may wait for that area's reuse) */
                cr_expect_eq(w1 - w0, 1, "%lld x %lld: %llu waits to score and read back", (long long)n,
                             (long long)dim, (unsigned long long)(w1 - w0));
        }
        be_unbind(gpu, y);   /* unbound scores: the host's */
        for (int64_t r = 0; r < n; r++) y[r] = NAN;
        gpu->ops->scores(gpu, m, n, dim, x, y);
        cr_expect(!memcmp(y, want, sizeof(float) * (size_t)n), "%lld x %lld: the host's scores differ", (long long)n,
                  (long long)dim);
        be_unbind(gpu, m);
        if (bind_x) be_unbind(gpu, x);
        free(m);
        free(x);
        free(y);
        free(want);
    }
}

/* A cache of 3 listed layers of 8 KV heads (head_dim 128, pages of 32) with random keys, and each
 * listed layer's list of every page under its own name. */
typedef struct km_fixture {
    kv_cache *kv;
    page_list pl[3];
    be_page_list lists[3];
} km_fixture;

static void km_lists(km_fixture *fx)
{
    for (int l = 0; l < 3; l++) {
        cr_assert(page_list_update(&fx->pl[l], fx->kv, l) == 0);
        fx->lists[l] = (be_page_list){ fx->pl[l].refs, fx->pl[l].at.off, 0x7E570000u + (uint64_t)l, fx->pl[l].at.shape, 0 };
    }
}

Test(cuda, the_key_means_on_the_device_are_the_cpus_bit_for_bit)
{
    /* CHESS's rows and anchor from the device's copies of the pages, into rows bound blank (as
     * CHESS binds them) and an anchor bound as any buffer, against the CPU backend's from the
     * cache's key sums: the same bits, with the op waiting for nothing;
     * again after tokens were appended (the last page grew, pages came after it: the lists
     * updated at their ends), for the rows that changed; and unbound (the host's). */
    enum { L = 3, H = 8, D = 128, P = 32, DIM = L * H * D };
    seed_rng("key_means");
    char err[512];
    km_fixture fx = { 0 };   /* the page lists start empty */
    fx.kv = kv_create(L, 8192, H, D, P, NULL, err, sizeof err);
    cr_assert(fx.kv, "%s", err);
    uint64_t r = rnd();
    fwd_fixture_wide_keys(fx.kv, L, 1000 + (int64_t)(rnd() % 31), &r);   /* sums that round */
    const int most = 8192 / P + 2;
    float *dev[4], *want[4];
    const size_t bytes = sizeof(float) * (size_t)most * DIM;
    for (int i = 0; i < 4; i++) {
        dev[i] = malloc(bytes);
        want[i] = malloc(bytes);
        cr_assert(dev[i] && want[i]);
        if (i < 3) cr_assert(be_bind_blank(gpu, dev[i], bytes, 0, err, sizeof err) == 0, "%s", err);   /* as CHESS */
    }
    cr_assert(be_bind(gpu, dev[3], sizeof(float) * DIM, err, sizeof err) == 0, "%s", err);
    for (int round = 0; round < 3; round++) {
        if (round > 0) fwd_fixture_wide_keys(fx.kv, L, round == 1 ? 5 : 70, &r);
        km_lists(&fx);
        int np = kv_n_pages(fx.kv, 0, 0);
        int64_t first = 1, n_cand = np - 3, nc = (n_cand + 3) / 4, ng = (nc + 3) / 4;
        be_key_means m = { fx.lists, L, H, D, first, n_cand, 4, 4, first, first + n_cand, 0, nc, 0, ng,
                           dev[0], dev[1], dev[2], 1, 16, dev[3] };
        if (round > 0) {   /* the rows the new pages changed: the last page's, chunk's and grid's */
            m.p0 = m.p1 - 1;
            m.c0 = m.c1 - 1;
            m.g0 = m.g1 - 1;
        }
        be_key_means c = m;
        c.page_rows = want[0];
        c.chunk_rows = want[1];
        c.grid_rows = want[2];
        c.anchor = want[3];
        cpu->ops->key_means(cpu, &c);
        if (round == 0)   /* the first call grows the staging area for the pages (a wait, once) */
            gpu->ops->key_means(gpu, &m);
        uint64_t w0, w1, up, down;
        gpu->ops->counters(gpu, &w0, &up, &down);
        gpu->ops->key_means(gpu, &m);
        gpu->ops->counters(gpu, &w1, &up, &down);
        cr_expect_eq(w1 - w0, 0, "round %d: the op waited %llu times", round, (unsigned long long)(w1 - w0));
        const size_t row = sizeof(float) * DIM;
        be_range rr[4] = { { dev[0] + m.p0 * DIM, (size_t)(m.p1 - m.p0) * row },
                           { dev[1] + m.c0 * DIM, (size_t)(m.c1 - m.c0) * row },
                           { dev[2] + m.g0 * DIM, (size_t)(m.g1 - m.g0) * row }, { dev[3], row } };
        be_host_read(gpu, rr, 4);
        cr_assert_eq(be_failed(gpu, err, sizeof err), 0, "%s", err);
        cr_expect(!memcmp(rr[0].p, want[0] + m.p0 * DIM, rr[0].bytes), "round %d: page rows differ", round);
        cr_expect(!memcmp(rr[1].p, want[1] + m.c0 * DIM, rr[1].bytes), "round %d: chunk rows differ", round);
        cr_expect(!memcmp(rr[2].p, want[2] + m.g0 * DIM, rr[2].bytes), "round %d: grid rows differ", round);
        cr_expect(!memcmp(dev[3], want[3], row), "round %d: the anchors differ", round);
    }
    for (int i = 0; i < 4; i++) be_unbind(gpu, dev[i]);
    /* unbound: computed on the host */
    km_lists(&fx);
    int np = kv_n_pages(fx.kv, 0, 0);
    be_key_means m = { fx.lists, L, H, D, 0, np, 2, 3, 0, np, 0, (np + 1) / 2, 0, ((np + 1) / 2 + 2) / 3,
                       dev[0], dev[1], dev[2], 0, 5, dev[3] }, c = m;
    c.page_rows = want[0];
    c.chunk_rows = want[1];
    c.grid_rows = want[2];
    c.anchor = want[3];
    cpu->ops->key_means(cpu, &c);
    gpu->ops->key_means(gpu, &m);
    cr_expect(!memcmp(dev[0], want[0], sizeof(float) * (size_t)np * DIM), "unbound: page rows differ");
    cr_expect(!memcmp(dev[3], want[3], sizeof(float) * DIM), "unbound: the anchors differ");
    for (int l = 0; l < 3; l++) page_list_free(&fx.pl[l]);
    for (int i = 0; i < 4; i++) {
        free(dev[i]);
        free(want[i]);
    }
    kv_free(fx.kv);
}

static be_backend *bounds_cpu_of;

/* The bounds on the CPU backend, the queries brought back first: to compare with the device's. Best
 * pages kept for attention (bound) are written on the host, announced, and go up when read. */
static void bounds_on_the_cpu(be_backend *b, be_bounds *r)
{
    be_range rq = { r->q, sizeof(float) * (size_t)(r->n_head_kv * r->group * r->dim) };
    be_host_read(b, &rq, 1);
    if (r->bits) {
        be_host_write(b, r->bits, sizeof(uint64_t) * (size_t)(r->n_head_kv * r->words));
    } else if (r->k > 0) {
        int32_t k = r->k < BE_PICK_MAX ? r->k : BE_PICK_MAX;
        be_host_write(b, r->best, sizeof(int32_t) * (size_t)(r->n_head_kv * k));
        be_host_write(b, r->n_best, sizeof(int32_t) * (size_t)r->n_head_kv);
    }
    bounds_cpu_of->ops->bound_pages(bounds_cpu_of, r);
}

/* The scores on the CPU backend, the bound inputs brought back first and the output announced. */
static void scores_on_the_cpu(be_backend *b, const float *m, int64_t n_rows, int64_t dim, const float *x, float *y)
{
    be_range r[2] = { { m, sizeof(float) * (size_t)(n_rows * dim) }, { x, sizeof(float) * (size_t)dim } };
    be_host_read(b, r, 2);
    be_host_write(b, y, sizeof(float) * (size_t)n_rows);
    bounds_cpu_of->ops->scores(bounds_cpu_of, m, n_rows, dim, x, y);
}

/* CHESS's rows and anchor on the CPU backend, written on the host (each output range announced). */
static void key_means_on_the_cpu(be_backend *b, const be_key_means *m)
{
    size_t row = sizeof(float) * (size_t)m->n_lists * (size_t)m->n_head_kv * (size_t)m->head_dim;
    if (m->p1 > m->p0) be_host_write(b, (char *)m->page_rows + (size_t)m->p0 * row, (size_t)(m->p1 - m->p0) * row);
    if (m->c1 > m->c0) be_host_write(b, (char *)m->chunk_rows + (size_t)m->c0 * row, (size_t)(m->c1 - m->c0) * row);
    if (m->g1 > m->g0) be_host_write(b, (char *)m->grid_rows + (size_t)m->g0 * row, (size_t)(m->g1 - m->g0) * row);
    if (m->n_last > 0 && m->anchor) be_host_write(b, m->anchor, row);
    bounds_cpu_of->ops->key_means(bounds_cpu_of, m);
}

/* Quest, SentKV and CHESS decoding a tiny model on the GPU: with the bounds (CHESS: its rows,
 * anchor and scores) on the device or on the CPU, the selections are the same, so the logits are
 * the same bits. Quest's
 * best pages stay on the device for attention: a decode step waits for them never, so at most
 * twice in all (the logits, the step's rows), where it waited once a global layer before; CHESS
 * waits once more, for its scores. */
Test(cuda, selection_policies_decode_the_same_with_the_bounds_on_the_device)
{
    char err[512];
    static const char *const specs[] = { "quest:budget=48", "sentkv:budget=0.3", "chess:preset=aggressive,window=1" };
    bounds_cpu_of = cpu;
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        model *m = load_tiny(fi);
        if (!m) continue;
        int64_t nv = m->hp.n_vocab;
        for (size_t si = 0; si < 3; si++) {
            float *out[2];
            for (int on_device = 0; on_device < 2; on_device++) {
                be_ops host_bounds = *gpu->ops;
                host_bounds.bound_pages = bounds_on_the_cpu;
                host_bounds.scores = scores_on_the_cpu;
                host_bounds.key_means = key_means_on_the_cpu;
                const be_ops *orig = gpu->ops;
                if (!on_device) gpu->ops = &host_bounds;
                fwd_opts fo = { 4096, 128, 16 };
                fwd_ctx *fw = fwd_create(m, gpu, &fo, err, sizeof err);
                cr_assert(fw, "%s", err);
                uint64_t folded0, sent0, folded1, sent1;
                be_cuda_summaries(gpu, &folded0, &sent0);
                pol_spec spec;
                cr_assert(pol_parse(&spec, specs[si], NULL, err, sizeof err) == 0, "%s", err);
                pol_env env;
                fwd_policy_env(fw, &env);
                pol_set *ps = pol_set_create(&spec, &env, err, sizeof err);
                cr_assert(ps, "%s", err);
                fwd_set_policy(fw, ps);
                int32_t ids[300];
                for (int i = 0; i < 300; i++) ids[i] = 3 + (int32_t)((i * 37 + i / 7) % (nv - 3));
                out[on_device] = malloc(sizeof(float) * (size_t)(nv * 41));
                cr_assert(fwd_eval(fw, ids, 300, out[on_device], NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0,
                          "%s", err);
                for (int s = 0; s < 40; s++) {
                    const float *l = out[on_device] + (int64_t)s * nv;
                    int32_t best = 0;
                    for (int64_t i = 1; i < nv; i++)
                        if (l[i] > l[best]) best = (int32_t)i;
                    uint64_t w0, w1, up, down;
                    gpu->ops->counters(gpu, &w0, &up, &down);
                    cr_assert(fwd_decode(fw, best, out[on_device] + (int64_t)(s + 1) * nv, NULL, err, sizeof err) == 0,
                              "%s", err);
                    gpu->ops->counters(gpu, &w1, &up, &down);
                    if (on_device && s > 0)   /* Quest and SentKV: the pick's and one more at most */
                        cr_expect_leq(w1 - w0, si < 2 ? 2 : 3, "%s under %s, step %d: %llu waits", files[fi], specs[si], s,
                                      (unsigned long long)(w1 - w0));
                }
                be_cuda_summaries(gpu, &folded1, &sent1);
                /* Quest's summaries of pages and SentKV's of segments folded from the device's copies,
                 * but those whose rows a decode step deferred to the next attention call: sent */
                if (on_device && si < 2)
                    cr_expect(folded1 - folded0 > sent1 - sent0, "%s under %s: %llu summaries folded, %llu sent",
                              files[fi], specs[si], (unsigned long long)(folded1 - folded0),
                              (unsigned long long)(sent1 - sent0));
                fwd_set_policy(fw, NULL);
                pol_set_free(ps);
                fwd_free(fw);
                gpu->ops = orig;
            }
            cr_expect(!memcmp(out[0], out[1], sizeof(float) * (size_t)(nv * 41)), "%s under %s: the logits differ",
                      files[fi], specs[si]);
            free(out[0]);
            free(out[1]);
        }
        model_free(m);
    }
}

/* One layer of H KV heads in pages of P, 1,500-1,700 tokens of keys of many magnitudes; *r the
 * generator the test goes on with. */
static kv_cache *wide_cache(int H, int D, int P, uint64_t *r)
{
    char err[512];
    kv_cache *kv = kv_create(1, 8192, H, D, P, NULL, err, sizeof err);
    cr_assert(kv, "%s", err);
    *r = rnd();
    fwd_fixture_wide_keys(kv, 1, 1500 + (int64_t)(rnd() % 200), r);
    return kv;
}

/* Every third token of layer 0's KV heads kept: each head's pages rewritten (new generations). */
static void keep_every_third(kv_cache *kv, int H)
{
    for (int g = 0; g < H; g++) {
        int64_t n = kv_head_tokens(kv, 0, g), nk = 0;
        int64_t *keep = malloc(sizeof(int64_t) * (size_t)n);
        cr_assert(keep);
        for (int64_t j = 0; j < n; j += 3) keep[nk++] = j;
        cr_assert(kv_keep_tokens(kv, 0, g, keep, nk) == 0);
        free(keep);
    }
}

/* Quest's summaries of pages (be_summary.k) folded on the device from its copies of the pages
 * where they hold the pages' rows (placed, be_ops.place_pages, as attention or a restore leaves
 * them), sent where they do not: the bounds over them are the CPU's over the cache's summaries bit
 * for bit, through a cache whose pages are then rewritten (new generations) and grown (the last
 * pages refolded, or sent when their new rows are not on the device yet). */
Test(cuda, page_summaries_folded_on_the_device_give_the_cpus_bounds_bit_for_bit)
{
    enum { H = 4, D = 128, P = 16, G = 2, K = 9 };
    seed_rng("page_summaries_folded");
    char err[512];
    uint64_t r;
    kv_cache *kv = wide_cache(H, D, P, &r);
    page_sums S = { 0 };
    page_list PL = { 0 };
    float q[H * G * D];
    for (int i = 0; i < H * G * D; i++) q[i] = frand(-1, 1);
    for (int round = 0; round < 5; round++) {
        if (round == 1) keep_every_third(kv, H);
        if (round >= 2) fwd_fixture_wide_keys(kv, 1, round == 2 ? 300 : 5, &r);
        const int placed = round != 4;   /* the last round's new rows not on the device */
        if (placed) {
            cr_assert(page_list_update(&PL, kv, 0) == 0);
            be_attn a = { 0 };
            a.n_head_kv = H;
            a.head_dim = D;
            a.pages = PL.refs;
            a.n_pages = PL.at.off[H];
            a.head_pages = PL.at.off;
            a.table = 0xF01E;
            a.shape = kv_layer_shape(kv, 0);
            gpu->ops->place_pages(gpu, &a, 1);
        }
        cr_assert(page_sums_update(&S, kv, 0, NULL) == 0);
        const int64_t n = S.at.off[H];
        float *u1 = malloc(sizeof(float) * (size_t)n), *u2 = malloc(sizeof(float) * (size_t)n);
        int32_t b1[H * K], b2[H * K], n1[H], n2[H];
        cr_assert(u1 && u2);
        be_bounds a = { .q = q, .n_head_kv = H, .group = G, .dim = D, .sum = S.sums, .off = S.at.off, .table = 0xF01D,
                        .shape = kv_layer_shape(kv, 0), .k = K, .best = b1, .n_best = n1, .u = u1, .end = S.at.end };
        be_bounds b = a;
        b.best = b2, b.n_best = n2, b.u = u2;
        uint64_t f0, s0, f1, s1;
        be_cuda_summaries(gpu, &f0, &s0);
        gpu->ops->bound_pages(gpu, &b);
        cr_assert(!be_failed(gpu, err, sizeof err), "%s", err);
        be_cuda_summaries(gpu, &f1, &s1);
        cpu->ops->bound_pages(cpu, &a);
        int bad = 0;   /* head by head: the room between the heads' summaries holds no bound */
        for (int h = 0; h < H; h++)
            for (int64_t i = S.at.off[h]; i < S.at.end[h]; i++) bad += memcmp(&u1[i], &u2[i], sizeof(float)) != 0;
        cr_assert_eq(bad, 0, "round %d: %d of %lld bounds differ", round, bad, (long long)n);
        for (int h = 0; h < H; h++) {
            cr_assert_eq(n1[h], n2[h], "round %d head %d", round, h);
            cr_assert(!memcmp(b1 + h * K, b2 + h * K, sizeof(int32_t) * (size_t)n1[h]), "round %d head %d: best", round, h);
        }
        cr_log_info("round %d: %llu summaries folded, %llu sent", round, (unsigned long long)(f1 - f0),
                    (unsigned long long)(s1 - s0));
        if (placed)
            cr_assert(f1 > f0 && s1 == s0, "round %d: %llu summaries folded, %llu sent", round,
                      (unsigned long long)(f1 - f0), (unsigned long long)(s1 - s0));
        else   /* five rows: the heads' last pages, or the pages they opened, sent */
            cr_assert(f1 == f0 && s1 > s0 && s1 - s0 <= 2 * H, "round %d: %llu summaries folded, %llu sent", round,
                      (unsigned long long)(f1 - f0), (unsigned long long)(s1 - s0));
        free(u1);
        free(u2);
    }
    page_sums_free(&S);
    page_list_free(&PL);
    kv_free(kv);
}

/* Layer 0's pages of KV heads g .. g + nk - 1 as one list, head h's from hp[h] (hp: nk + 1
 * offsets), malloc'd; *T their tokens, *last the latest position, *biased the pages with a bias. */
static be_kv_page *heads_list(kv_cache *kv, int g, int nk, int D, int P, int64_t *hp, int64_t *T, int32_t *last,
                              int *biased)
{
    hp[0] = 0;
    for (int h = 0; h < nk; h++) hp[h + 1] = hp[h] + kv_n_pages(kv, 0, g + h);
    be_kv_page *pages = malloc(sizeof *pages * (size_t)(hp[nk] > 0 ? hp[nk] : 1));
    cr_assert(pages);
    *T = 0;
    *last = 0;
    for (int h = 0; h < nk; h++)
        for (int i = 0; i < hp[h + 1] - hp[h]; i++) {
            be_kv_page *e = &pages[hp[h] + i];
            page_list_ref(e, kv_layer_page(kv, 0, g + h, i), NULL, D, P);
            *T += e->n;
            *biased += e->bias != NULL;
            if (e->n && e->pos[e->n - 1] > *last) *last = e->pos[e->n - 1];
        }
    return pages;
}

/* The attention mass of head dimension D and NQ query rows a position (4 query heads a KV head, 2
 * KV heads, pages of 32) through `rounds` rounds of cache changes, on the device and on the CPU. */
static void mass_rounds(int D, int NQ, int rounds)
{
    enum { H = 2, P = 32, G = 4 };
    char err[512];
    uint64_t r;
    kv_cache *kv = wide_cache(H, D, P, &r);
    const int64_t stride = (int64_t)H * G * D;
    float *q = malloc(sizeof(float) * (size_t)(NQ * stride));
    cr_assert(q);
    for (int64_t i = 0; i < NQ * stride; i++) q[i] = (float)((int64_t)(rnd() % 2001) - 1000) / 4000.0f;
    int biased = 0;
    for (int round = 0; round < rounds; round++) {
        if (round == 1) keep_every_third(kv, H);   /* each head's pages rewritten */
        if (round == 2) fwd_fixture_wide_keys(kv, 1, 300, &r);
        if (round == 3)
            cr_assert(be_bind(gpu, q, sizeof(float) * (size_t)(NQ * stride), err, sizeof err) == 0, "%s", err);
        if (round == 4)   /* merged tokens: pages with a bias (each token's log-degree) */
            for (int g = 0; g < H; g++) {
                enum { N = 700 };
                float *k = malloc(sizeof(float) * N * D), *v = malloc(sizeof(float) * N * D);
                float *ld = malloc(sizeof(float) * N);
                int32_t *pos = malloc(sizeof(int32_t) * N);
                cr_assert(k && v && ld && pos);
                for (int i = 0; i < N * D; i++) {
                    k[i] = (float)((int64_t)(rnd() % 2001) - 1000) / 100.0f;
                    v[i] = k[i] / 2;
                }
                for (int i = 0; i < N; i++) {
                    pos[i] = 3 * i;
                    ld[i] = logf(1.0f + (float)(rnd() % 3));
                }
                cr_assert(kv_rebuild_head(kv, 0, g, k, v, pos, ld, N) == 0);
                free(k);
                free(v);
                free(ld);
                free(pos);
            }
        for (int call = 0; call <= H; call++) {   /* each KV head alone, then both in one call */
            const int g = call < H ? call : 0, nk = call < H ? 1 : H;
            int64_t hp[H + 1], T;
            int32_t last;
            be_kv_page *pages = heads_list(kv, g, nk, D, P, hp, &T, &last, &biased);
            const int np = (int)hp[nk];
            float *want = malloc(sizeof(float) * (size_t)T), *got = malloc(sizeof(float) * (size_t)T);
            float *work = malloc(sizeof(float) * (size_t)(T * 16));
            cr_assert(want && got && work);
            for (int64_t j = 0; j < T; j++) want[j] = got[j] = (float)(rnd() % 3);
            /* the first rows do not see the last tokens */
            be_mass m = { q, NQ, stride, last - NQ / 2, g * G, G, D, pages, np, want,
                          work, T * 16, 0xA55u + (uint64_t)call, nk > 1 ? nk : 0, nk > 1 ? hp : NULL };
            cpu->ops->attn_mass(cpu, &m);
            if (round == 0) {   /* the first call grows the staging area for the pages (a wait, once) */
                float *warm = malloc(sizeof(float) * (size_t)T);
                cr_assert(warm);
                memcpy(warm, got, sizeof(float) * (size_t)T);
                m.acc = warm;
                gpu->ops->attn_mass(gpu, &m);
                free(warm);
            }
            m.acc = got;
            uint64_t w0, w1, up, down;
            gpu->ops->counters(gpu, &w0, &up, &down);
            gpu->ops->attn_mass(gpu, &m);
            gpu->ops->counters(gpu, &w1, &up, &down);
            cr_assert_eq(be_failed(gpu, err, sizeof err), 0, "%s", err);
            cr_expect_eq(w1 - w0, 1, "round %d, call %d: %llu waits", round, call, (unsigned long long)(w1 - w0));
            int bad = 0;
            for (int64_t j = 0; j < T; j++) bad += memcmp(&got[j], &want[j], sizeof(float)) != 0;
            cr_expect_eq(bad, 0, "round %d, call %d (%d KV heads): %d of %lld sums differ from the CPU's", round, call,
                         nk, bad, (long long)T);
            free(pages);
            free(want);
            free(got);
            free(work);
        }
    }
    cr_expect(rounds < 5 || biased > 0, "no page with a bias");
    if (rounds > 3) be_unbind(gpu, q);
    free(q);
    kv_free(kv);
}

/* The eviction policies' attention mass on the device (from its copies of the pages, each call's
 * list kept under its name) against the CPU backend's: the same bits, with one wait a call, for
 * each KV head alone and both in one call; for queries on the host and bound to the device; again
 * after tokens were evicted (pages rewritten, new generations), after more were appended and after
 * merged tokens (with biases) replaced a head, under the same names; at a head dimension with every
 * part of the CPU's dot (100: 16-element blocks, an 8-element block, a tail of 4); and with rows
 * enough that a call runs in passes. */
Test(cuda, the_attention_mass_on_the_device_is_the_cpus_bit_for_bit)
{
    seed_rng("attn_mass");
    mass_rounds(128, 32, 5);
    mass_rounds(100, 32, 2);
    mass_rounds(128, 1100, 1);   /* 4,400 rows x about 3,200 tokens: past a pass's 8M scores */
}

/* LASER-KV's SimHash recall at head dimension D, `rounds` rounds of `bits` bits and NQ probe rows (4
 * query heads a KV head, 2 KV heads, pages of 32) on the device and on the CPU, through rounds of
 * cache changes (tokens evicted: pages rewritten; more appended; the first head emptied). */
static void lsh_rounds(int D, int rounds, int bits, int NQ)
{
    enum { H = 2, P = 32, G = 4 };
    char err[512];
    uint64_t r;
    kv_cache *kv = wide_cache(H, D, P, &r);
    const int64_t stride = (int64_t)H * G * D, np_planes = (int64_t)rounds * bits;
    float *q = malloc(sizeof(float) * (size_t)(NQ * stride)), *pt = malloc(sizeof(float) * (size_t)(np_planes * D));
    uint32_t *codes = malloc(sizeof(uint32_t) * (size_t)(H * rounds * NQ * G));
    cr_assert(q && pt && codes);
    for (int64_t i = 0; i < NQ * stride; i++) q[i] = (float)((int64_t)(rnd() % 2001) - 1000) / 4000.0f;
    for (int64_t i = 0; i < np_planes * D; i++) pt[i] = (float)((int64_t)(rnd() % 2001) - 1000) / 1000.0f;
    for (int round = 0; round < 4; round++) {
        if (round == 1) keep_every_third(kv, H);   /* each head's pages rewritten */
        if (round == 2) fwd_fixture_wide_keys(kv, 1, 300, &r);
        if (round == 3) {   /* head 0 emptied: a call of both heads whose first has no page */
            int64_t none = 0;
            cr_assert(kv_keep_tokens(kv, 0, 0, &none, 0) == 0);
        }
        for (int call = 0; call <= H; call++) {   /* each KV head alone, then both in one call */
            const int g = call < H ? call : 0, nk = call < H ? 1 : H;
            int64_t hp[H + 1], T;
            int32_t last;
            int biased = 0;
            be_kv_page *pages = heads_list(kv, g, nk, D, P, hp, &T, &last, &biased);
            const int np = (int)hp[nk];
            if (T == 0) {   /* the emptied head alone */
                free(pages);
                continue;
            }
            int32_t *want = malloc(sizeof(int32_t) * (size_t)T), *got = malloc(sizeof(int32_t) * (size_t)T);
            cr_assert(want && got);
            be_lsh l = { q, NQ, stride, g * G, G, D, pt, rounds, bits, pages, np, nk > 1 ? nk : 0, nk > 1 ? hp : NULL,
                         pages[0].pos[pages[0].n - 1], codes, want, 0x15Bu + (uint64_t)call };
            cpu->ops->lsh_hits(cpu, &l);
            int64_t any = 0;
            for (int64_t j = 0; j < T; j++) any += want[j];
            cr_expect(any > 0, "D %d, round %d, call %d: no hit at all", D, round, call);
            l.hits = got;
            if (round == 0) gpu->ops->lsh_hits(gpu, &l);   /* the first call grows the staging area (a wait, once) */
            for (int64_t j = 0; j < T; j++) got[j] = -7;
            uint64_t w0, w1, up, down;
            gpu->ops->counters(gpu, &w0, &up, &down);
            gpu->ops->lsh_hits(gpu, &l);
            gpu->ops->counters(gpu, &w1, &up, &down);
            cr_assert_eq(be_failed(gpu, err, sizeof err), 0, "%s", err);
            const uint64_t waits = D <= LSH_DEV_MAX_D ? 1 : 0;   /* past the kernel's tile: the CPU's, no wait */
            cr_expect_eq(w1 - w0, waits, "D %d, round %d, call %d: %llu waits", D, round, call,
                         (unsigned long long)(w1 - w0));
            int bad = 0;
            for (int64_t j = 0; j < T; j++) bad += got[j] != want[j];
            cr_expect_eq(bad, 0, "D %d, round %d, call %d (%d KV heads): %d of %lld tokens' hits differ from the CPU's",
                         D, round, call, nk, bad, (long long)T);
            free(pages);
            free(want);
            free(got);
        }
    }
    free(q);
    free(pt);
    free(codes);
    kv_free(kv);
}

/* LASER-KV's SimHash recall on the device (keys coded from its copies of the pages, each call's list
 * under its name) against the CPU backend's: the same hits, with one wait a call, for each KV head
 * alone and both in one call, after evictions and appends and with a head that has no page; at the
 * 7B shape, at Gemma's head
 * dimension with 64 rounds, and past the kernel's shared tile (the CPU's hits, no wait). */
Test(cuda, lsh_hits_on_the_device_are_the_cpus)
{
    seed_rng("lsh_hits");
    lsh_rounds(128, 8, 8, 32);
    lsh_rounds(256, 64, 3, 4);
    lsh_rounds(320, 4, 8, 8);
}

/* A fork's first steps on the GPU start from its source's lists and pages on the device: its lists
 * of every page copied there from the source's (be_attn.from_table) and each head's shared last page
 * copied there from the source's copy of it (page_moves). Over the same tokens every step's logits
 * are the bits of the source's own steps afterwards, whose lists and pages went the usual way; three
 * forks decoded as one batch (fwd_decode_batch) end within 1e-5 of the largest logit of the same
 * (the products of several rows may sum in another order). The prompt's last pages have room (90
 * tokens, pages of 16), and the 20 steps open a page in every head (the lists' heads move). */
Test(cuda, a_forks_lists_and_last_pages_start_as_its_sources_on_the_device)
{
    char err[512];
    enum { STEPS = 20, NB = 3 };
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        model *m = load_tiny(fi);
        if (!m) continue;
        const int nv = m->hp.n_vocab;
        fwd_opts fo = { 2048, 64, 16 };
        fwd_ctx *base = fwd_create(m, gpu, &fo, err, sizeof err);
        cr_assert(base, "%s", err);
        int32_t ids[90], tok[STEPS];
        for (int i = 0; i < 90; i++) ids[i] = 3 + (int32_t)((i * 53) % (nv - 3));
        for (int t = 0; t < STEPS; t++) tok[t] = 3 + (int32_t)((t * 71 + 5) % (nv - 3));
        float *l = malloc(sizeof(float) * (size_t)nv * (STEPS + 1));
        float *row = malloc(sizeof(float) * (size_t)nv);
        cr_assert(l && row);
        cr_assert(fwd_eval(base, ids, 90, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        /* one fork alone */
        uint64_t cloned = be_cuda_cloned_entries(gpu), written, moved, up, moved2;
        be_cuda_page_rows(gpu, &written, &moved, &up);
        fwd_ctx *f = fwd_fork(base, 1, err, sizeof err);
        cr_assert(f, "%s", err);
        for (int t = 0; t < STEPS; t++)
            cr_assert(fwd_decode(f, tok[t], l + (size_t)t * nv, NULL, err, sizeof err) == 0, "%s", err);
        cr_expect_gt(be_cuda_cloned_entries(gpu), cloned, "%s: no list started as its source's", files[fi]);
        be_cuda_page_rows(gpu, &written, &moved2, &up);
        cr_expect_gt(moved2, moved, "%s: no shared page was copied on the device", files[fi]);
        fwd_free(f);
        /* three forks together, the same tokens */
        fwd_ctx *fs[NB];
        for (int s = 0; s < NB; s++) cr_assert(fs[s] = fwd_fork(base, 1, err, sizeof err), "%s", err);
        for (int t = 0; t < STEPS; t++) {
            int32_t cur[NB], top[NB];
            float val[NB];
            be_pick p[NB];
            for (int s = 0; s < NB; s++) {
                cur[s] = tok[t];
                p[s] = (be_pick){ .penalty = 1.0f, .k = 1, .val = &val[s], .id = &top[s] };
            }
            cr_assert(fwd_decode_batch(base, fs, NB, cur, NULL, p, NULL, err, sizeof err) == 0, "%s", err);
        }
        float *last = malloc(sizeof(float) * (size_t)nv * NB);
        cr_assert(last);
        for (int s = 0; s < NB; s++) {
            cr_assert(fwd_picked_logits(fs[s], last + (size_t)s * nv, err, sizeof err) == 0, "%s", err);
            fwd_free(fs[s]);
        }
        /* the source over the same tokens, its own lists and pages */
        for (int t = 0; t < STEPS; t++) {
            cr_assert(fwd_decode(base, tok[t], row, NULL, err, sizeof err) == 0, "%s", err);
            cr_expect(!memcmp(row, l + (size_t)t * nv, sizeof(float) * (size_t)nv),
                      "%s step %d: the fork's logits are not the source's", files[fi], t);
        }
        for (int s = 0; s < NB; s++) {
            const double rd = rel_diff(last + (size_t)s * nv, row, nv);
            cr_expect(rd <= 1e-5, "%s batched fork %d: its last row differs by %g of the largest", files[fi], s, rd);
        }
        free(last);
        free(l);
        free(row);
        fwd_free(base);
        model_free(m);
    }
}

/* Forks of one prefilled context on the GPU decoded alone and as one batch (fwd_decode_batch): each
 * fork's top token at every step is the one it has alone, its last row within 1e-5 of the largest
 * logit (the products of several rows may sum in another order than one row's), and a batched step
 * waits for the device twice, whatever the batch holds: once for the CHESS forks' scores (CHESS
 * chooses its pages on the host; every fork's scores are issued before any is read), once for the
 * picks (the rows deferred, the other forks' selections kept on the device). */
Test(cuda, a_batch_of_forks_decodes_each_as_alone_and_waits_for_the_batch)
{
    char err[512];
    cr_assert(gpu->ops->counters);
    const char *specs[] = { NULL, "quest:budget=24", "chess:preset=aggressive,window=1", "streaming:budget=40",
                            "chess:window=1" };
    enum { NF = 5, STEPS = 10 };
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        model *m = load_tiny(fi);
        if (!m) continue;
        int nv = m->hp.n_vocab;
        fwd_opts fo = { 2048, 64, 16 };
        fwd_ctx *base = fwd_create(m, gpu, &fo, err, sizeof err);
        cr_assert(base, "%s", err);
        int32_t ids[90];
        for (int i = 0; i < 90; i++) ids[i] = 3 + (int32_t)((i * 53) % (nv - 3));
        float *l = malloc(sizeof(float) * (size_t)nv), *row = malloc(sizeof(float) * (size_t)nv);
        float *alone_row = malloc(sizeof(float) * (size_t)nv * NF);
        cr_assert(fwd_eval(base, ids, 90, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        int32_t first = samp_argmax(l, nv), alone[NF][STEPS];
        for (int pass = 0; pass < 2; pass++) {
            fwd_ctx *fs[NF];
            pol_set *ps[NF];
            int32_t cur[NF];
            for (int s = 0; s < NF; s++) {
                cr_assert(fs[s] = fwd_fork(base, 1, err, sizeof err), "%s", err);
                ps[s] = specs[s] ? fwd_fixture_policy_make(fs[s], specs[s]) : NULL;
                cr_assert(fwd_adopt_policy(fs[s], ps[s], ids, 90, err, sizeof err) == 0, "%s", err);
                cur[s] = first;
            }
            for (int t = 0; t < STEPS; t++) {
                float val[NF];
                int32_t top[NF];
                be_pick p[NF];
                for (int s = 0; s < NF; s++) p[s] = (be_pick){ .penalty = 1.0f, .k = 1, .val = &val[s], .id = &top[s] };
                if (pass == 0) {   /* alone, one fork after another */
                    for (int s = 0; s < NF; s++)
                        cr_assert(fwd_decode_pick(fs[s], cur[s], &p[s], NULL, err, sizeof err) == 0, "%s", err);
                } else {
                    uint64_t w0, w1, up, down;
                    gpu->ops->counters(gpu, &w0, &up, &down);
                    cr_assert(fwd_decode_batch(base, fs, NF, cur, NULL, p, NULL, err, sizeof err) == 0, "%s", err);
                    gpu->ops->counters(gpu, &w1, &up, &down);
                    if (t > 2) cr_expect_eq(w1 - w0, 2, "%s batched step %d: %llu waits", files[fi], t, (unsigned long long)(w1 - w0));
                }
                for (int s = 0; s < NF; s++) {
                    if (pass == 0) alone[s][t] = top[s];
                    else cr_expect_eq(top[s], alone[s][t], "%s fork %d (%s) step %d: %d batched, %d alone", files[fi], s,
                                      specs[s] ? specs[s] : "none", t, top[s], alone[s][t]);
                    cur[s] = top[s];
                }
            }
            for (int s = 0; s < NF; s++) {
                cr_assert(fwd_picked_logits(fs[s], pass ? row : alone_row + (size_t)s * nv, err, sizeof err) == 0, "%s", err);
                if (pass) {
                    const double rd = rel_diff(alone_row + (size_t)s * nv, row, nv);
                    cr_expect(rd <= 1e-5, "%s fork %d: the last row differs by %g of the largest", files[fi], s, rd);
                    cr_log_info("%s fork %d: the last row %s", files[fi], s,
                                memcmp(row, alone_row + (size_t)s * nv, sizeof(float) * (size_t)nv) ? "within 1e-5" : "bit for bit");
                }
                fwd_free(fs[s]);
                pol_set_free(ps[s]);
            }
        }
        cr_expect_eq(fwd_pos(base), 90, "the forked context moved");
        free(l);
        free(row);
        free(alone_row);
        fwd_free(base);
        model_free(m);
    }
}

/* Greedy decode steps through the device's pick on backend b after a 40-token prompt: the tokens
 * and their values, and the waits of each step. */
static void picked_steps(model *m, be_backend *b, int steps, int32_t *tok, float *val, uint64_t *waits)
{
    char err[512];
    fwd_opts fo = { 2048, 64, 16 };
    fwd_ctx *f = fwd_create(m, b, &fo, err, sizeof err);
    cr_assert(f, "%s", err);
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = 3 + (int32_t)((i * 53) % (m->hp.n_vocab - 3));
    float *l = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    cr_assert(fwd_eval(f, ids, 40, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    int32_t next = samp_argmax(l, m->hp.n_vocab);
    for (int s = 0; s < steps; s++) {
        uint64_t w0, w1, up, down;
        b->ops->counters(b, &w0, &up, &down);
        be_pick p = { .penalty = 1.0f, .k = 1, .val = &val[s], .id = &tok[s] };
        cr_assert(fwd_decode_pick(f, next, &p, NULL, err, sizeof err) == 0, "%s", err);
        b->ops->counters(b, &w1, &up, &down);
        waits[s] = w1 - w0;
        next = tok[s];
    }
    cr_expect_eq(fwd_pos(f), 40 + steps);
    free(l);
    fwd_free(f);
}

/* KVCHAT_CUDA_GRAPH=on (kernels/step_graphs.h): a decode step's launches recorded and run as
 * graphs, the graph of a step's shape kept and updated in place, change no bit. Every tiny model's
 * prompt and eight greedy steps give the logits of the backend that issues its calls one by one,
 * with every page attended and under an evicting, a bounding and a scoring policy, with whole
 * segments and with segments split every 5 calls; the picked decode loop gives the same tokens and
 * values and still waits once a step; the recordings ran (segments, most of them by an update)
 * and nothing failed. */
Test(cuda, recorded_decode_steps_give_the_bits_of_issued_ones)
{
    be_backend *rec = gpu_with("KVCHAT_CUDA_GRAPH", "on");
    setenv("KVCHAT_CUDA_GRAPH_SPLIT", "5", 1);
    be_backend *split = gpu_with("KVCHAT_CUDA_GRAPH", "on");
    unsetenv("KVCHAT_CUDA_GRAPH_SPLIT");
    be_backend *both[2] = { rec, split };
    const char *policies[] = { NULL, "snapkv:budget=0.5", "quest:budget=24", "chess:preset=aggressive,window=1" };
    int ran = 0;
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        model *m = load_tiny(fi);
        if (!m) continue;
        const int64_t nv = m->hp.n_vocab;
        for (int pi = 0; pi < 4; pi++) {
            int32_t t0[9], t1[9];
            float *a = steps_under(m, gpu, t0, 8, NULL, policies[pi]);
            for (int k = 0; k < 2; k++) {
                be_graph_stats g0, g1;
                be_cuda_graphs(both[k], &g0);
                float *b = steps_under(m, both[k], t1, 8, t0, policies[pi]);
                be_cuda_graphs(both[k], &g1);
                char named[200];
                snprintf(named, sizeof named, "%s, %s, %s", files[fi], policies[pi] ? policies[pi] : "no policy",
                         k ? "split every 5 calls" : "whole segments");
                expect_same_steps(a, b, nv, 8, named, "the calls issued one by one");
                if (k == 0)   /* whole segments; split ones may give up (many shapes), which is logged */
                    cr_expect_gt(g1.segments - g0.segments, 0, "%s, %s: nothing recorded", files[fi],
                                 policies[pi] ? policies[pi] : "no policy");
                cr_log_info("%s, %s, %s: %llu segments of %llu calls, %llu updated, %llu built (%llu refused)", files[fi],
                            policies[pi] ? policies[pi] : "no policy", k ? "split 5" : "whole",
                            (unsigned long long)(g1.segments - g0.segments), (unsigned long long)(g1.calls - g0.calls),
                            (unsigned long long)(g1.updates - g0.updates), (unsigned long long)(g1.builds - g0.builds),
                            (unsigned long long)(g1.refused - g0.refused));
                free(b);
            }
            free(a);
            ran++;
        }
        /* the picked loop: same tokens and values, one wait a step, the steps' graphs updated */
        enum { STEPS = 16 };
        int32_t ta[STEPS], tb[STEPS];
        float va[STEPS], vb[STEPS];
        uint64_t wa[STEPS], wb[STEPS];
        be_graph_stats g0, g1;
        picked_steps(m, gpu, STEPS, ta, va, wa);
        be_cuda_graphs(rec, &g0);
        picked_steps(m, rec, STEPS, tb, vb, wb);
        be_cuda_graphs(rec, &g1);
        for (int s = 0; s < STEPS; s++) {
            cr_expect(ta[s] == tb[s] && !memcmp(&va[s], &vb[s], sizeof(float)), "%s step %d: %d (%g) recorded, %d (%g) issued",
                      files[fi], s, tb[s], vb[s], ta[s], va[s]);
            if (s > 6) cr_expect_eq(wb[s], 1, "%s recorded step %d: %llu waits", files[fi], s, (unsigned long long)wb[s]);
        }
        cr_expect_geq(g1.segments - g0.segments, STEPS, "%s: %llu segments for %d steps", files[fi],
                      (unsigned long long)(g1.segments - g0.segments), STEPS);
        cr_expect_gt(g1.updates - g0.updates, g1.builds - g0.builds, "%s: %llu updates, %llu builds", files[fi],
                     (unsigned long long)(g1.updates - g0.updates), (unsigned long long)(g1.builds - g0.builds));
        model_free(m);
    }
    cr_expect_gt(ran, 0, "no tiny model here");
    for (int k = 0; k < 2; k++) {
        be_graph_stats g;
        be_cuda_graphs(both[k], &g);
        cr_log_info("%s: %llu segments, %llu updated, %llu built, gave up %d", k ? "split every 5 calls" : "whole",
                    (unsigned long long)g.segments, (unsigned long long)g.updates, (unsigned long long)g.builds, g.gave_up);
        cr_expect_eq(g.failures, 0, "backend %d: %llu failures", k, (unsigned long long)g.failures);
        if (k == 0) cr_expect(g.on && !g.gave_up, "whole segments: on %d, gave up %d", g.on, g.gave_up);
        be_free(both[k]);
    }
    be_graph_stats off;
    be_cuda_graphs(gpu, &off);
    cr_expect_eq(off.segments + off.builds, 0, "recorded with KVCHAT_CUDA_GRAPH unset");
    /* the settings a backend was made with are named where its device is (benchmarks' rows) */
    char d0[300], d1[300];
    be_backend *named = gpu_with("KVCHAT_CUDA_GRAPH", "on");
    be_describe(named, d1, sizeof d1);
    be_describe(gpu, d0, sizeof d0);
    cr_expect(strstr(d1, " (KVCHAT_CUDA_GRAPH=on)"), "%s", d1);
    cr_expect(!strchr(d0, '('), "%s", d0);
    be_free(named);
}

/* A bad KVCHAT_CUDA_GRAPH or KVCHAT_CUDA_GRAPH_SPLIT is refused with a message naming it. */
Test(cuda, a_bad_graph_setting_is_refused)
{
    const char *bad[][2] = { { "KVCHAT_CUDA_GRAPH", "yes" }, { "KVCHAT_CUDA_GRAPH_SPLIT", "-1" },
                             { "KVCHAT_CUDA_GRAPH_SPLIT", "12x" } };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[512] = "";
        setenv(bad[i][0], bad[i][1], 1);
        be_backend *b = be_cuda_create(2, err, sizeof err);
        unsetenv(bad[i][0]);
        cr_expect_null(b, "%s=%s accepted", bad[i][0], bad[i][1]);
        if (b) be_free(b);
        cr_expect(strstr(err, "KVCHAT_CUDA_GRAPH"), "%s=%s: %s", bad[i][0], bad[i][1], err);
    }
}

/* An upload batch sent in each of the three parameter sizes and copied (be_cuda_test_batch): pieces
 * of 16-byte rows, of odd lengths at odd offsets, 4-byte ones and copies on the device, about 1.5,
 * 6 and 20 KiB and 40 KiB packed, land in a bound buffer as the host applies them, on a backend that
 * carries them and on one that copies them (KVCHAT_CUDA_INLINE=off), each sent in the size
 * expected. */
Test(cuda, an_upload_batch_lands_the_same_in_every_parameter_size_and_copied)
{
    be_backend *copied = gpu_with("KVCHAT_CUDA_INLINE", "off");
    be_backend *both[2] = { gpu, copied };
    enum { BYTES = 96 * 1024, MAXP = 200 };
    unsigned char *buf = malloc(BYTES), *src = malloc(BYTES), *want = malloc(BYTES);
    cr_assert(buf && src && want);
    seed_rng("upload_batch");
    const int units[] = { 1, 9, 30, 60 };   /* a unit: a 512-byte row, an odd piece, a 4-byte one */
    const int64_t sizes[] = { 2048, 8192, 24576, 0 };
    char err[512];
    for (int k = 0; k < 2; k++) {
        be_backend *b = both[k];
        for (int c = 0; c < 4; c++) {
            for (int i = 0; i < BYTES; i++) buf[i] = (unsigned char)rnd(), src[i] = (unsigned char)rnd();
            memcpy(want, buf, BYTES);
            cr_assert(be_bind(b, buf, BYTES, err, sizeof err) == 0, "%s", err);
            be_test_piece p[MAXP];
            int n = 0;
            for (int u = 0; u < units[c] && n + 3 < MAXP; u++) {
                const size_t at = (size_t)u * 1024;
                p[n++] = (be_test_piece){ .at = at, .from = at + 7 * 16, .len = 512 };
                p[n++] = (be_test_piece){ .at = at + 515, .from = at + 1, .len = 33 };
                p[n++] = (be_test_piece){ .at = at + 600, .from = at + 40, .len = 4 };
            }
            /* copies on the device from a region nothing in the batch writes */
            p[n++] = (be_test_piece){ .at = 80 * 1024, .from = 90 * 1024, .len = 96, .dev = 1 };
            p[n++] = (be_test_piece){ .at = 80 * 1024 + 203, .from = 90 * 1024 + 5, .len = 21, .dev = 1 };
            for (int i = 0; i < n; i++)
                memcpy(want + p[i].at, (p[i].dev ? buf : src) + p[i].from, p[i].len);
            const int64_t got = be_cuda_test_batch(b, buf, BYTES, src, p, n);
            const int64_t expect = k == 0 ? sizes[c] : 0;
            cr_expect_eq(got, expect, "%s, %d units: sent in %lld, expected %lld", k ? "copied" : "carried", units[c],
                         (long long)got, (long long)expect);
            const be_range r = { buf, BYTES };
            be_host_read(b, &r, 1);
            cr_expect_eq(be_failed(b, err, sizeof err), 0, "%s", err);
            size_t first = BYTES;
            for (size_t i = 0; i < BYTES && first == BYTES; i++)
                if (buf[i] != want[i]) first = i;
            cr_expect_eq(first, (size_t)BYTES, "%s, %d units: byte %zu differs from the pieces applied on the host",
                         k ? "copied" : "carried", units[c], first);
            b->ops->unbind(b, buf);
        }
    }
    free(buf);
    free(src);
    free(want);
    be_free(copied);
}

/* Upload batches in their scatter launch's parameters (kernels/upload_batch.h, ub_inline_size), and a
 * decode step's token and positions in their kernels' (the positions written on the device by the
 * first qk_rope for attention), change no bit: every tiny model's prompt and 20 greedy steps (pages
 * of 16, so page boundaries are crossed) with every page attended and under Quest, SentKV and TAKE
 * give the logits of a backend that copies every batch and value (KVCHAT_CUDA_INLINE=off); batches
 * rode in launches (none on the copying backend), and the runtime calls were fewer by at least one a
 * layer and one more (the positions) a step; and eight forks decoded together (their batches and
 * values larger, across a page boundary) pick the same tokens and values both ways, with at least
 * one call fewer a layer a step. A bad setting is refused with a message naming it. */
/* Eight forks of a 90-token prompt on b (pages of 16) decoded greedily together for `steps` steps
 * (fwd_decode_batch: one batch a layer for all of them, the ids and positions of eight tokens):
 * each step's picked tokens and values, fork by fork. */
enum { BATCH_FORKS = 8 };
static void batch_steps(model *m, be_backend *b, int steps, int32_t (*tok)[BATCH_FORKS], float (*val)[BATCH_FORKS])
{
    char err[512];
    const int nv = m->hp.n_vocab;
    fwd_opts fo = { 2048, 64, 16 };
    fwd_ctx *base = fwd_create(m, b, &fo, err, sizeof err);
    cr_assert(base, "%s", err);
    int32_t ids[90], cur[BATCH_FORKS];
    for (int i = 0; i < 90; i++) ids[i] = 3 + (int32_t)((i * 53) % (nv - 3));
    float *l = malloc(sizeof(float) * (size_t)nv);
    cr_assert(l && fwd_eval(base, ids, 90, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    fwd_ctx *fs[BATCH_FORKS];
    for (int s = 0; s < BATCH_FORKS; s++) {
        cr_assert(fs[s] = fwd_fork(base, 1, err, sizeof err), "%s", err);
        cur[s] = 3 + (int32_t)((s * 977) % (nv - 3));   /* each fork its own first token */
    }
    for (int t = 0; t < steps; t++) {
        be_pick p[BATCH_FORKS];
        for (int s = 0; s < BATCH_FORKS; s++) p[s] = (be_pick){ .penalty = 1.0f, .k = 1, .val = &val[t][s], .id = &tok[t][s] };
        cr_assert(fwd_decode_batch(base, fs, BATCH_FORKS, cur, NULL, p, NULL, err, sizeof err) == 0, "%s", err);
        for (int s = 0; s < BATCH_FORKS; s++) cur[s] = tok[t][s];
    }
    for (int s = 0; s < BATCH_FORKS; s++) fwd_free(fs[s]);
    free(l);
    fwd_free(base);
}

Test(cuda, batches_in_launch_parameters_give_the_bits_of_copied_ones)
{
    be_backend *copied = gpu_with("KVCHAT_CUDA_INLINE", "off");
    const char *policies[] = { NULL, "quest:budget=24", "sentkv:budget=0.3", "take:budget=0.5" };
    enum { STEPS = 20 };
    int ran = 0;
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        model *m = load_tiny(fi);
        if (!m) continue;
        const int64_t nv = m->hp.n_vocab;
        for (int pi = 0; pi < 4; pi++) {
            const char *pol = policies[pi] ? policies[pi] : "no policy";
            int32_t t0[STEPS + 1], t1[STEPS + 1];
            const uint64_t s0 = be_cuda_inline_sends(gpu), r0 = be_cuda_runtime_calls(gpu);
            float *a = steps_under(m, gpu, t0, STEPS, NULL, policies[pi]);
            const uint64_t s1 = be_cuda_inline_sends(gpu), r1 = be_cuda_runtime_calls(gpu);
            const uint64_t c0 = be_cuda_runtime_calls(copied);
            float *b = steps_under(m, copied, t1, STEPS, t0, policies[pi]);
            const uint64_t c1 = be_cuda_runtime_calls(copied);
            char named[200];
            snprintf(named, sizeof named, "%s, %s", files[fi], pol);
            expect_same_steps(a, b, nv, STEPS, named, "the copied batches'");
            cr_expect_gt(s1 - s0, 0, "%s, %s: no batch rode in a launch", files[fi], pol);
            cr_expect_geq(c1 - c0, r1 - r0 + (uint64_t)STEPS * (uint64_t)(m->hp.n_layer + 1),
                          "%s, %s: %llu runtime calls with the batches in launches, %llu copied", files[fi], pol,
                          (unsigned long long)(r1 - r0), (unsigned long long)(c1 - c0));
            cr_log_info("%s, %s: %llu batches in launches; runtime calls %llu, copied %llu", files[fi], pol,
                        (unsigned long long)(s1 - s0), (unsigned long long)(r1 - r0), (unsigned long long)(c1 - c0));
            free(a);
            free(b);
            ran++;
        }
        /* a batch of eight forks: larger batches, eight tokens' ids and positions in their launches */
        enum { BSTEPS = 12 };
        int32_t ta[BSTEPS][BATCH_FORKS], tb[BSTEPS][BATCH_FORKS];
        float va[BSTEPS][BATCH_FORKS], vb[BSTEPS][BATCH_FORKS];
        const uint64_t s0 = be_cuda_inline_sends(gpu), r0 = be_cuda_runtime_calls(gpu);
        batch_steps(m, gpu, BSTEPS, ta, va);
        const uint64_t s1 = be_cuda_inline_sends(gpu), r1 = be_cuda_runtime_calls(gpu);
        const uint64_t c0 = be_cuda_runtime_calls(copied);
        batch_steps(m, copied, BSTEPS, tb, vb);
        const uint64_t c1 = be_cuda_runtime_calls(copied);
        for (int t = 0; t < BSTEPS; t++)
            for (int f = 0; f < BATCH_FORKS; f++)
                cr_expect(ta[t][f] == tb[t][f] && !memcmp(&va[t][f], &vb[t][f], sizeof(float)),
                          "%s, a batch of forks, step %d, fork %d: %d (%g) carried, %d (%g) copied", files[fi], t, f,
                          ta[t][f], va[t][f], tb[t][f], vb[t][f]);
        cr_expect_gt(s1 - s0, 0, "%s, a batch of forks: no batch rode in a launch", files[fi]);
        cr_expect_geq(c1 - c0, r1 - r0 + (uint64_t)BSTEPS * (uint64_t)m->hp.n_layer,
                      "%s, a batch of forks: %llu runtime calls carried, %llu copied", files[fi],
                      (unsigned long long)(r1 - r0), (unsigned long long)(c1 - c0));
        model_free(m);
    }
    cr_expect_gt(ran, 0, "no tiny model here");
    cr_expect_eq(be_cuda_inline_sends(copied), 0, "KVCHAT_CUDA_INLINE=off sent a batch in a launch");
    be_free(copied);
    gpu_refuses("KVCHAT_CUDA_INLINE", "maybe", "KVCHAT_CUDA_INLINE must be");
}

/* Chelsea's merge of a layer's heads (be_ops.merge_heads) on the device: two heads of one count
 * side by side and a third of another, at once and replayed, at the 7B shape's head dimension
 * and the default model's; every row, position and degree the CPU backend's, bit for bit. A head
 * with an infinite key (a NaN cosine: fewer links than the shape gives) comes back the CPU's too. */
static void merge_round(int64_t D, int64_t T, int64_t T2, int64_t target, int64_t gap, int sinks, int recent, int chunk,
                        int replay, int inf)
{
    enum { H = 3 };
    const int64_t n[H] = { T, T, T2 };
    float *k[2][H], *v[2][H], *deg[2][H];
    int32_t *pos[2][H];
    for (int h = 0; h < H; h++) {
        for (int c = 0; c < 2; c++) {
            k[c][h] = malloc(sizeof(float) * (size_t)(n[h] * D));
            v[c][h] = malloc(sizeof(float) * (size_t)(n[h] * D));
            deg[c][h] = malloc(sizeof(float) * (size_t)n[h]);
            pos[c][h] = malloc(sizeof(int32_t) * (size_t)n[h]);
            cr_assert(k[c][h] && v[c][h] && deg[c][h] && pos[c][h]);
        }
        for (int64_t i = 0; i < n[h] * D; i++) {
            k[0][h][i] = ldexpf(frand(-1, 1), (int)(i % 9) - 4);
            v[0][h][i] = frand(-2, 2);
        }
        for (int64_t t = 0; t < n[h]; t++) {
            deg[0][h][t] = 1.0f + (float)(t % 3);
            pos[0][h][t] = (int32_t)(2 * t);
        }
        if (inf && h == 1)
            for (int64_t i = 0; i < D; i++) k[0][h][(40 + (n[h] > 80 ? 0 : -40)) * D + i] = INFINITY;
        memcpy(k[1][h], k[0][h], sizeof(float) * (size_t)(n[h] * D));
        memcpy(v[1][h], v[0][h], sizeof(float) * (size_t)(n[h] * D));
        memcpy(deg[1][h], deg[0][h], sizeof(float) * (size_t)n[h]);
        memcpy(pos[1][h], pos[0][h], sizeof(int32_t) * (size_t)n[h]);
    }
    be_merge_head mh[2][H];
    for (int c = 0; c < 2; c++)
        for (int h = 0; h < H; h++) mh[c][h] = (be_merge_head){ k[c][h], v[c][h], pos[c][h], deg[c][h], n[h] };
    be_merge m = { .heads = mh[0], .n_heads = H, .dim = D, .target = target, .gap = gap, .sinks = sinks,
                   .recent = recent, .chunk = chunk, .replay = replay };
    cr_assert(be_merge_heads(cpu, &m) == 0);
    m.heads = mh[1];
    cr_assert(be_merge_heads(gpu, &m) == 0);
    char err[256];
    cr_assert(!gpu->ops->failed(gpu, err, sizeof err), "%s", err);
    for (int h = 0; h < H; h++) {
        const int64_t kept = mh[0][h].n;
        cr_assert_eq(mh[1][h].n, kept, "D %lld, head %d of %lld rows: %lld rows kept, the CPU's %lld", (long long)D, h,
                     (long long)n[h], (long long)mh[1][h].n, (long long)kept);
        cr_assert(!memcmp(k[0][h], k[1][h], sizeof(float) * (size_t)(kept * D)) &&
                      !memcmp(v[0][h], v[1][h], sizeof(float) * (size_t)(kept * D)) &&
                      !memcmp(deg[0][h], deg[1][h], sizeof(float) * (size_t)kept) &&
                      !memcmp(pos[0][h], pos[1][h], sizeof(int32_t) * (size_t)kept),
                  "D %lld, head %d, replay %d, chunk %d: the rows differ from the CPU's", (long long)D, h, replay, chunk);
        for (int c = 0; c < 2; c++) {
            free(k[c][h]);
            free(v[c][h]);
            free(deg[c][h]);
            free(pos[c][h]);
        }
    }
}

Test(cuda, chelsea_s_merge_on_the_device_is_the_cpus)
{
    seed_rng("merge_heads");
    merge_round(128, 2000, 1500, 400, 64, 16, 64, 256, 1, 0);
    merge_round(128, 2000, 1500, 400, 64, 16, 64, 256, 0, 0);
    merge_round(256, 900, 700, 200, 32, 16, 64, 100, 1, 0);
    merge_round(32, 3000, 5, 20, 0, 0, 0, 3, 1, 0);   /* gap 0, nothing aside, a head too short to merge */
    merge_round(64, 600, 601, 150, 8, 16, 64, 17, 1, 1);
}

/* Bytes sent to the device so far. */
static uint64_t bytes_up_of(be_backend *b)
{
    uint64_t w, up, down;
    b->ops->counters(b, &w, &up, &down);
    return up;
}

/* A snapshot restored into a second sequence and placed on the device (fwd_place_pages, as
 * run_restore does): placing sends the cache (at least its keys and values), the next step then
 * sends at least that much less than the same step without placing, and it gives the logits of
 * the sequence the snapshot was taken from, bit for bit, placed or not; with no policy and under
 * Quest (whose summaries are placed too). */
Test(cuda, a_restored_cache_placed_on_the_device_is_not_sent_again_at_the_next_step)
{
    cr_assert(gpu->ops->counters && gpu->ops->place_pages);
    char err[512], ppath[300];
    snprintf(ppath, sizeof ppath, "%s/prompts/p3.txt", testdata());
    for (size_t ri = 0; ri < 2 * sizeof files / sizeof *files; ri++) {
        const size_t fi = ri / 2;
        const char *spec = ri % 2 ? "quest:budget=48" : NULL, *pol = spec ? spec : "no policy";
        model *m = load_tiny(fi);
        if (!m) continue;
        uint64_t step_up[2] = { 0, 0 };
        size_t n;
        int32_t *ids = fwd_fixture_prompt(m, ppath, &n);
        const int nv = m->hp.n_vocab;
        float *l2 = (float *)malloc(sizeof(float) * (size_t)nv);
        cr_assert(l2);
        for (int place = 0; place < 2; place++) {
            fwd_pair pr;
            fwd_fixture_pair_open(&pr, m, gpu, spec);
            fwd_fixture_pair_restore(&pr, ids, n, 5);
            const kv_cache *kv = fwd_kv(pr.f2);
            uint64_t rows = 0;
            for (int il = 0; il < kv_n_layer(kv); il++)
                for (int h = 0; h < kv_n_head_kv(kv); h++)
                    for (int j = 0; j < kv_n_pages(kv, il, h); j++) rows += (uint64_t)kv_layer_page(kv, il, h, j)->n;
            const uint64_t kv_bytes = rows * 2 * sizeof(uint16_t) * (uint64_t)m->hp.head_dim;
            const uint64_t u0 = bytes_up_of(gpu);
            if (place) fwd_place_pages(pr.f2);
            const uint64_t u1 = bytes_up_of(gpu);
            cr_assert_eq(be_failed(gpu, err, sizeof err), 0, "%s", err);
            if (place)
                cr_expect_geq(u1 - u0, kv_bytes, "%s under %s: placing sent %llu bytes for a cache of %llu", files[fi],
                              pol, (unsigned long long)(u1 - u0), (unsigned long long)kv_bytes);
            int32_t next = samp_argmax(pr.l1, nv);
            cr_assert(fwd_decode(pr.f2, next, l2, NULL, err, sizeof err) == 0, "%s", err);
            step_up[place] = bytes_up_of(gpu) - u1;
            cr_assert(fwd_decode(pr.f1, next, pr.l1, NULL, err, sizeof err) == 0, "%s", err);
            cr_expect(!memcmp(pr.l1, l2, sizeof(float) * (size_t)nv),
                      "%s under %s (%s): the restored sequence's step differs", files[fi], pol,
                      place ? "placed" : "not placed");
            cr_log_info("%s under %s: cache %llu bytes; placing sent %llu; the next step %llu", files[fi], pol,
                        (unsigned long long)kv_bytes, (unsigned long long)(u1 - u0), (unsigned long long)step_up[place]);
            if (place)
                cr_expect_geq(step_up[0], step_up[1] + kv_bytes, "%s under %s: the step sent %llu bytes placed, %llu not",
                              files[fi], pol, (unsigned long long)step_up[1], (unsigned long long)step_up[0]);
            fwd_fixture_pair_free(&pr);
        }
        free(l2);
        free(ids);
        model_free(m);
    }
}
