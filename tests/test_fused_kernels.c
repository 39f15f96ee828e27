/* test_fused_kernels.c - the CUDA backend's qk_rope and add_norm kernels (kernels/fused_kernels.h),
 * every thread of small launches run on the host as the device runs them, against the CPU
 * backend's ops: the launches' loops and each thread's work are the kernels' own functions, each
 * element is changed by one thread, and the values are those of the CPU up to the order of the
 * sums of squares (both in double). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "kernels/fused_kernels.h"
#include "tests/test_rng.h"

static uint64_t seed_rng(const char *what)
{
    return test_rng_seed(what, "FUSED_SEED", (uint64_t)time(NULL) * 2654435761u);
}

static int near(const float *a, const float *b, int64_t n, float tol, int64_t *at)
{
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(a[i] - b[i]) <= tol * (1 + fabsf(b[i])))) {
            *at = i;
            return 0;
        }
    return 1;
}

/* qk_rope_kernel's launch on the host, thread by thread through the kernel's own functions: a block
 * a token, each warp's rows (every lane's sum before any lane writes: the shuffles wait for all);
 * writes[] counts the writes of each element of q then k. */
static void host_qk_rope(const be_qk *r, int *writes)
{
    int D = r->head_dim, half = D / 2, rows = r->n_head + r->n_head_kv;
    float theta_scale = powf(r->freq_base, -2.0f / (float)D);
    float cs[512], sn[512];
    int64_t nq = r->n_tok * r->n_head * D;
    float *before = malloc(sizeof(float) * (size_t)D), *canary = malloc(sizeof(float) * (size_t)D);
    float zero[512], one[512];
    cr_assert(before && canary);
    for (int i = 0; i < half; i++) zero[i] = 0.0f, one[i] = 1.0f;
    for (int64_t t = 0; t < r->n_tok; t++) {
        fk_angles((float)r->pos[t] * r->freq_scale, theta_scale, half, cs);
        for (int i = 0; i < half; i++) {
            sn[i] = sinf(cs[i]);
            cs[i] = cosf(cs[i]);
        }
        for (unsigned warp0 = 0; warp0 < FK_QK_THREADS; warp0 += 32)
            for (int j = fk_qk_first_row(warp0); j < rows; j += FK_QK_WARPS) {
                const float *w;
                float s;
                float *v = fk_qk_row(r->q, r->k, t, j, r->n_head, r->n_head_kv, D, r->q_norm, r->k_norm, r->q_scale, &w,
                                     &s);
                for (unsigned th = warp0; th < warp0 + 32; th++) cr_assert_eq(fk_qk_first_row(th), fk_qk_first_row(warp0));
                float f = 1.0f;
                if (w) {
                    double lane_ss[32];
                    for (unsigned th = warp0; th < warp0 + 32; th++) lane_ss[th - warp0] = fk_qk_lane_sumsq(v, D, th);
                    f = fk_norm_factor(fk_warp_sum_host(lane_ss), D, r->eps);
                }
                /* what each thread writes, seen by what it changes in a canary row of distinct
                 * values turned a quarter (cosine 0, sine 1: each pair's values change places and
                 * one its sign, so every write shows) */
                int64_t base = v >= r->q && v < r->q + nq ? v - r->q : nq + (v - r->k);
                for (int i = 0; i < D; i++) canary[i] = (float)(i + 1);
                for (unsigned th = warp0; th < warp0 + 32; th++) {
                    fk_qk_lane_pairs(v, D, th, r->neox, w, f, cs, sn, s);
                    memcpy(before, canary, sizeof(float) * (size_t)D);
                    fk_qk_lane_pairs(canary, D, th, r->neox, NULL, 1.0f, zero, one, 1.0f);
                    for (int i = 0; i < D; i++)
                        if (memcmp(&before[i], &canary[i], sizeof(float)) != 0) writes[base + i]++;
                }
            }
    }
    free(before);
    free(canary);
}

Test(fused_kernels, qk_rope_threads_equal_the_cpu)
{
    seed_rng("fused qk_rope");
    char err[256];
    be_backend *cpu = be_cpu_create(1, err, sizeof err);
    cr_assert(cpu, "%s", err);
    /* the default model's heads (4 of 256, one KV head), the 7B's (32 and 8 of 128), more rows than
     * a block has warps, a head of 6 (pairs past no lane's first 32), pairs past 32 a lane */
    const int shapes[][3] = { { 4, 1, 256 }, { 32, 8, 128 }, { 3, 3, 6 }, { 1, 1, 64 }, { 2, 1, 160 } };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int v = 0; v < 4; v++) {
            int H = shapes[si][0], HKV = shapes[si][1], D = shapes[si][2], norm = v & 1, neox = v >> 1;
            int64_t T = 3, nq = T * H * D, nk = T * HKV * D;
            float *a = malloc(sizeof(float) * (size_t)(nq + nk)), *c = malloc(sizeof(float) * (size_t)(nq + nk));
            float *wn = malloc(sizeof(float) * 2 * (size_t)D);
            int *writes = calloc((size_t)(nq + nk), sizeof(int));
            cr_assert(a && c && wn && writes);
            for (int64_t i = 0; i < nq + nk; i++) a[i] = c[i] = frand(-2, 2);
            for (int i = 0; i < 2 * D; i++) wn[i] = frand(0.5f, 1.5f);
            int32_t pos[3] = { 0, (int32_t)(rnd() % 4096), (int32_t)(rnd() % 100000) };
            be_qk r = { .q = a, .k = a + nq, .n_tok = T, .n_head = H, .n_head_kv = HKV, .head_dim = D,
                        .q_norm = norm ? wn : NULL, .k_norm = norm ? wn + D : NULL, .eps = 1e-6f, .pos = pos,
                        .freq_base = 1e6f, .freq_scale = 0.5f, .neox = neox, .q_scale = 0.0625f };
            host_qk_rope(&r, writes);
            be_qk rc = r;
            rc.q = c;
            rc.k = c + nq;
            cpu->ops->qk_rope(cpu, &rc);
            for (int64_t i = 0; i < nq + nk; i++)
                cr_assert_eq(writes[i], 1, "element %lld written by %d threads", (long long)i, writes[i]);
            int64_t at = -1;
            cr_expect(near(a, c, nq + nk, 1e-6f, &at), "%d+%d heads of %d, norm %d neox %d: element %lld %g, cpu %g", H, HKV,
                      D, norm, neox, (long long)at, at >= 0 ? a[at] : 0, at >= 0 ? c[at] : 0);
            free(a);
            free(c);
            free(wn);
            free(writes);
        }
    be_free(cpu);
}

/* add_norm_kernel's launch on the host, thread by thread through the kernel's own functions: a
 * block a row, each phase's block sum from every thread's part; writes[] counts, per element, the
 * threads that changed x, o (with post) or h (with w) there. */
static void host_add_norm(float *x, float *o, const float *post, const float *w, float *h, int64_t rows, int64_t dim,
                          float eps, int *writes)
{
    double part[FK_AN_THREADS];
    float *bx = malloc(sizeof(float) * 3 * (size_t)dim), *bo = bx + dim, *bh = bo + dim;
    cr_assert(bx);
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * dim, *orow = o + r * dim, *hr = h + r * dim;
        int *wr = writes + r * 3 * dim;
        float f = 1.0f;
        if (post) {
            for (unsigned t = 0; t < FK_AN_THREADS; t++) part[t] = fk_an_thread_sumsq(orow, dim, t);
            f = fk_norm_factor(fk_block_sum_host(part, FK_AN_THREADS), dim, eps);
        }
        for (unsigned t = 0; t < FK_AN_THREADS; t++) {
            memcpy(bx, xr, sizeof(float) * (size_t)dim);
            memcpy(bo, orow, sizeof(float) * (size_t)dim);
            part[t] = fk_an_thread_add(xr, orow, post, f, w != NULL, dim, t);
            for (int64_t i = 0; i < dim; i++) {
                wr[i] += memcmp(&bx[i], &xr[i], sizeof(float)) != 0;
                wr[dim + i] += memcmp(&bo[i], &orow[i], sizeof(float)) != 0;
            }
        }
        if (!w) continue;
        float g = fk_norm_factor(fk_block_sum_host(part, FK_AN_THREADS), dim, eps);
        for (unsigned t = 0; t < FK_AN_THREADS; t++) {
            memcpy(bh, hr, sizeof(float) * (size_t)dim);
            fk_an_thread_norm(xr, w, g, hr, dim, t);
            for (int64_t i = 0; i < dim; i++) wr[2 * dim + i] += memcmp(&bh[i], &hr[i], sizeof(float)) != 0;
        }
    }
    free(bx);
}

Test(fused_kernels, add_norm_threads_equal_the_cpu)
{
    seed_rng("fused add_norm");
    char err[256];
    be_backend *cpu = be_cpu_create(1, err, sizeof err);
    cr_assert(cpu, "%s", err);
    const int64_t shapes[][2] = { { 1, 1152 }, { 3, 4096 }, { 2, 37 }, { 5, 257 } };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int v = 0; v < 4; v++) {
            int64_t R = shapes[si][0], E = shapes[si][1], n = R * E;
            int with_post = v & 1, with_w = v >> 1;
            float *b = malloc(sizeof(float) * 6 * (size_t)n), *wt = malloc(sizeof(float) * 2 * (size_t)E);
            int *writes = calloc(3 * (size_t)n, sizeof(int));
            cr_assert(b && wt && writes);
            float *x = b, *o = b + n, *h = b + 2 * n, *cx = b + 3 * n, *co = b + 4 * n, *chh = b + 5 * n;
            for (int64_t i = 0; i < n; i++) x[i] = cx[i] = frand(-4, 4), o[i] = co[i] = frand(-4, 4), h[i] = chh[i] = 9;
            for (int64_t i = 0; i < 2 * E; i++) wt[i] = frand(0.5f, 2);
            const float *post = with_post ? wt : NULL, *w = with_w ? wt + E : NULL;
            host_add_norm(x, o, post, w, h, R, E, 1e-6f, writes);
            cpu->ops->add_norm(cpu, cx, co, post, w, chh, R, E, 1e-6f);
            for (int64_t r = 0; r < R; r++)
                for (int64_t i = 0; i < E; i++) {
                    const int *wr = writes + r * 3 * E;
                    cr_assert(wr[i] == 1 && wr[E + i] == with_post && wr[2 * E + i] == with_w,
                              "row %lld element %lld: x, o, h changed by %d, %d, %d threads", (long long)r, (long long)i,
                              wr[i], wr[E + i], wr[2 * E + i]);
                }
            int64_t at = -1;
            cr_expect(near(o, co, n, 1e-6f, &at) && near(x, cx, n, 1e-6f, &at) && near(h, chh, n, 1e-6f, &at),
                      "%lld x %lld, post %d w %d: element %lld", (long long)R, (long long)E, with_post, with_w, (long long)at);
            free(b);
            free(wt);
            free(writes);
        }
    be_free(cpu);
}
