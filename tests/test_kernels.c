/* test_kernels.c - the CPU kernels added for speed against their plain references: multi-token dot
 * products vs the one-token kernel, vectorized exp and GLU activations vs libm, and the backend's
 * threaded ops vs single-threaded results. Random inputs, printed seed, NaN-filled outputs. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "common/quant.h"
#include "kernels/cpu/vec_dot.h"
#include "tests/test_rng.h"

static uint64_t seed_rng(const char *what)
{
    return test_rng_seed(what, "KERNELS_SEED", (uint64_t)time(NULL) * 2654435761u);
}

/* Random valid blocks: random bytes with the leading fp16 scale set to a sane value. */
static void random_row(uint32_t type, int64_t n, uint8_t *dst)
{
    int64_t blck, bs;
    cr_assert(quant_block_geometry(type, &blck, &bs) == 0);
    for (int64_t b = 0; b < n / blck; b++) {
        uint8_t *p = dst + b * bs;
        for (int64_t i = 0; i < bs; i++) p[i] = (uint8_t)rnd();
        uint16_t d = quant_f32_to_fp16(frand(1e-3f, 2e-2f));
        memcpy(p, &d, 2);
    }
}

Test(kernels, vector_exp_matches_libm)
{
    seed_rng("vector_exp_matches_libm");
    enum { N = 10007 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = frand(-100, 100);
    x[0] = -INFINITY;
    x[1] = 0;
    x[2] = 88.7f;
    x[3] = -87.0f;
    x[4] = 89.0f;
    x[5] = 88.7228317f;   /* the largest float whose e^x is finite: a random draw found the kernel */
    x[6] = 88.7228088f;   /* overflowing just below it, when its cut-off was 88.7228f */
    x[7] = 88.7228394f;   /* the next float up: +inf */
    for (int i = 0; i < N; i++) y[i] = NAN;
    vd_exp_f32(N, x, y);
    for (int i = 0; i < N; i++) {
        float r = expf(x[i]);
        if (isinf(r) || r == 0) {
            cr_expect(y[i] == r || (r == 0 && y[i] < 1e-37f), "exp(%g) = %g, want %g", x[i], y[i], r);
            continue;
        }
        cr_expect(fabsf(y[i] - r) <= 4e-7f * r + 1e-38f, "exp(%g) = %.9g, want %.9g", x[i], y[i], r);
    }
    float nanin = NAN, nanout = 0;
    vd_exp_f32(1, &nanin, &nanout);
    cr_expect(isnan(nanout));
}

Test(kernels, vector_glu_matches_formula)
{
    seed_rng("vector_glu_matches_formula");
    enum { N = 4099 };
    static float g[N], u[N], g2[N];
    for (int gelu = 0; gelu <= 1; gelu++) {
        for (int i = 0; i < N; i++) {
            g[i] = frand(-12, 12);
            u[i] = frand(-2, 2);
            g2[i] = g[i];
        }
        vd_glu_f32(N, g2, u, gelu);
        for (int i = 0; i < N; i++) {
            double x = g[i];
            double a = gelu ? 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) : x / (1 + exp(-x));
            double r = a * u[i];
            cr_expect(fabs(g2[i] - r) <= 2e-6 * (fabs(r) + fabs(u[i]) * 1e-3) + 1e-30, "%s(%g)*%g = %.9g, want %.9g",
                      gelu ? "gelu" : "silu", g[i], u[i], g2[i], r);
        }
    }
}

/* One head's row as the fused op's parts define it, in double: normalized (w given), rotated at
 * pos, scaled. The angles are the rotation's own, built in float as a running product (pos, pos *
 * base^(-2/D), ...) as the reference implementation and every backend build them: at positions in
 * the thousands the same angles in double differ by some 1e-4 radians, more than the float
 * arithmetic the comparison allows for. */
static void ref_qk_row(float *v, int D, const float *w, double pos, double base, int neox, double s)
{
    float th_f = (float)pos;
    const float th_scale = powf((float)base, -2.0f / (float)D);
    double x[256];
    double ss = 0;
    for (int i = 0; i < D; i++) ss += (double)v[i] * v[i];
    double inv = w ? 1.0 / sqrt(ss / D + 1e-6) : 1.0;
    for (int i = 0; i < D; i++) x[i] = w ? v[i] * inv * w[i] : v[i];
    for (int i = 0; i < D / 2; i++) {
        int i0 = neox ? i : 2 * i, i1 = neox ? i + D / 2 : 2 * i + 1;
        double th = th_f, x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * cos(th) - x1 * sin(th);
        x[i1] = x0 * sin(th) + x1 * cos(th);
        th_f *= th_scale;
    }
    for (int i = 0; i < D; i++) v[i] = (float)(x[i] * s);
}

static void ref_norm(const float *x, const float *w, float *y, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; i++) y[i] = (float)(x[i] * inv * w[i]);
}

static int near(const float *a, const float *b, int64_t n, float tol)
{
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(a[i] - b[i]) <= tol * (1 + fabsf(b[i])))) return 0;
    return 1;
}

/* The fused ops do what their parts would: qk_rope's norms, rotation and scale on q's and k's own
 * heads (with and without norms, both pairings), add_norm's post norm, add and norm (each part
 * optional; without w, h is left alone). */
Test(kernels, fused_ops_do_what_their_parts_would)
{
    seed_rng("fused ops");
    char err[256];
    be_backend *b = be_cpu_create(2, err, sizeof err);
    cr_assert(b, "%s", err);
    enum { T = 19, H = 4, HKV = 2, D = 64 };
    static float q[T * H * D], k[T * HKV * D], rq[T * H * D], rk[T * HKV * D], wq[D], wk[D];
    int32_t pos[T];
    for (int t = 0; t < T; t++) pos[t] = t == 0 ? 0 : (int32_t)(rnd() % 2000);
    for (int i = 0; i < D; i++) wq[i] = frand(0.5f, 1.5f), wk[i] = frand(0.5f, 1.5f);
    for (int variant = 0; variant < 4; variant++) {
        int norms = variant & 1, neox = variant >> 1;
        for (int i = 0; i < T * H * D; i++) q[i] = rq[i] = frand(-2, 2);
        for (int i = 0; i < T * HKV * D; i++) k[i] = rk[i] = frand(-2, 2);
        be_qk r = { .q = q, .k = k, .n_tok = T, .n_head = H, .n_head_kv = HKV, .head_dim = D,
                    .q_norm = norms ? wq : NULL, .k_norm = norms ? wk : NULL, .eps = 1e-6f, .pos = pos,
                    .freq_base = 10000.0f, .freq_scale = 1.0f, .neox = neox, .q_scale = 0.125f };
        b->ops->qk_rope(b, &r);
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) ref_qk_row(rq + (t * H + h) * D, D, norms ? wq : NULL, pos[t], 1e4, neox, 0.125);
            for (int h = 0; h < HKV; h++) ref_qk_row(rk + (t * HKV + h) * D, D, norms ? wk : NULL, pos[t], 1e4, neox, 1);
        }
        cr_expect(near(q, rq, T * H * D, 2e-4f) && near(k, rk, T * HKV * D, 2e-4f), "qk_rope, norms %d neox %d", norms,
                  neox);
    }
    enum { R = 5, E = 300 };
    static float x[R * E], o[R * E], h[R * E], rx[R * E], ro[R * E], rh[R * E], post[E], w[E];
    for (int i = 0; i < E; i++) post[i] = frand(0.5f, 1.5f), w[i] = frand(0.5f, 1.5f);
    for (int variant = 0; variant < 4; variant++) {
        int with_post = variant & 1, with_w = variant >> 1;
        for (int i = 0; i < R * E; i++) x[i] = rx[i] = frand(-2, 2), o[i] = ro[i] = frand(-2, 2), h[i] = rh[i] = 7;
        b->ops->add_norm(b, x, o, with_post ? post : NULL, with_w ? w : NULL, h, R, E, 1e-6f);
        for (int row = 0; row < R; row++) {
            if (with_post) ref_norm(ro + row * E, post, ro + row * E, E);
            for (int i = 0; i < E; i++) rx[row * E + i] += ro[row * E + i];
            if (with_w) ref_norm(rx + row * E, w, rh + row * E, E);
        }
        cr_expect(near(o, ro, R * E, 1e-5f) && near(x, rx, R * E, 1e-5f), "add_norm's add, post %d", with_post);
        cr_expect(with_w ? near(h, rh, R * E, 1e-5f) : !memcmp(h, rh, sizeof h), "add_norm's norm, w %d", with_w);
    }
    be_free(b);
}

/* The threaded element-wise ops and matmul give the same bits as one thread (rows never split). */
Test(kernels, threaded_ops_equal_single_thread)
{
    seed_rng("threaded_ops_equal_single_thread");
    char err[256];
    be_backend *b1 = be_cpu_create(1, err, sizeof err), *b2 = be_cpu_create(2, err, sizeof err);
    cr_assert(b1 && b2, "%s", err);
    enum { ROWS = 37, DIM = 256 };
    static float x[ROWS * DIM], w[DIM], y1[ROWS * DIM], y2[ROWS * DIM];
    for (int i = 0; i < ROWS * DIM; i++) x[i] = frand(-2, 2);
    for (int i = 0; i < DIM; i++) w[i] = frand(0.5f, 1.5f);
    b1->ops->rmsnorm(b1, x, w, y1, ROWS, DIM, 1e-6f);
    b2->ops->rmsnorm(b2, x, w, y2, ROWS, DIM, 1e-6f);
    cr_expect(!memcmp(y1, y2, sizeof y1));
    int32_t pos[ROWS];
    for (int i = 0; i < ROWS; i++) pos[i] = (int32_t)(rnd() % 5000);
    /* q: 2 heads of 64 a token, k: 2 more (the rows of x side by side), normalized and rotated */
    memcpy(y1, x, sizeof x);
    memcpy(y2, x, sizeof x);
    be_qk r1 = { .q = y1, .k = y1 + ROWS * 128, .n_tok = ROWS, .n_head = 2, .n_head_kv = 2, .head_dim = 64,
                 .q_norm = w, .k_norm = w + 64, .eps = 1e-6f, .pos = pos, .freq_base = 10000.0f, .freq_scale = 1.0f,
                 .neox = 1, .q_scale = 0.125f };
    be_qk r2 = r1;
    r2.q = y2;
    r2.k = y2 + ROWS * 128;
    b1->ops->qk_rope(b1, &r1);
    b2->ops->qk_rope(b2, &r2);
    cr_expect(!memcmp(y1, y2, sizeof y1));
    /* the residual add between two norms */
    static float o1[ROWS * DIM], o2[ROWS * DIM], h1[ROWS * DIM], h2[ROWS * DIM];
    memcpy(y1, x, sizeof x);
    memcpy(y2, x, sizeof x);
    for (int i = 0; i < ROWS * DIM; i++) o1[i] = o2[i] = frand(-2, 2);
    b1->ops->add_norm(b1, y1, o1, w, w, h1, ROWS, DIM, 1e-6f);
    b2->ops->add_norm(b2, y2, o2, w, w, h2, ROWS, DIM, 1e-6f);
    cr_expect(!memcmp(y1, y2, sizeof y1) && !memcmp(o1, o2, sizeof o1) && !memcmp(h1, h2, sizeof h1));
    /* matmul of a Q5_0 weight by a batch: 2 threads, multi-token kernel vs 1 thread */
    enum { NOUT = 96 };
    uint8_t *wq = malloc(quant_row_size(GGML_TYPE_Q5_0, DIM) * NOUT);
    for (int r = 0; r < NOUT; r++) random_row(GGML_TYPE_Q5_0, DIM, wq + r * quant_row_size(GGML_TYPE_Q5_0, DIM));
    be_weight bw = { wq, GGML_TYPE_Q5_0, DIM, NOUT, quant_row_size(GGML_TYPE_Q5_0, DIM) };
    static float p1[ROWS * NOUT], p2[ROWS * NOUT];
    be_mm m1 = { &bw, p1 }, m2 = { &bw, p2 };
    b1->ops->matmul(b1, &m1, 1, x, ROWS);
    b2->ops->matmul(b2, &m2, 1, x, ROWS);
    cr_expect(!memcmp(p1, p2, sizeof p1));
    /* and each row equals the one-token product */
    for (int t = 0; t < ROWS; t += 9) {
        float o[NOUT];
        be_mm m = { &bw, o };
        b1->ops->matmul(b1, &m, 1, x + t * DIM, 1);
        for (int r = 0; r < NOUT; r++)
            cr_expect(fabsf(o[r] - p1[t * NOUT + r]) <= 1e-5f * (1 + fabsf(o[r])), "row %d out %d", t, r);
    }
    free(wq);
    be_free(b1);
    be_free(b2);
}

/* The blocked attention's kernels on every instruction set this CPU has, against double loops:
 * scores with the rows in the lanes (padded rows included) and the rescaled value accumulation, on
 * head sizes and key counts that leave tails, NaN sentinels past the outputs. */
Test(kernels, attention_block_kernels_match_double_loops)
{
    seed_rng("attention_block_kernels_match_double_loops");
    char err[256];
    vd_isa was = vd_isa_active();
    static const int dims[] = { 8, 40, 72, 256 }, nks[] = { 1, 7, 64 }, rps[] = { 16, 32, 48 };
    for (int isa = 0; isa < VD_ISA_COUNT; isa++) {
        if (!vd_isa_supported((vd_isa)isa)) {
            cr_log_info("SKIP attention kernels on %s: this CPU lacks %s", vd_isa_name((vd_isa)isa), vd_isa_describe((vd_isa)isa));
            continue;
        }
        cr_assert_eq(vd_set_isa((vd_isa)isa, err, sizeof err), 0, "%s", err);
        for (int di = 0; di < 4; di++)
            for (int ki = 0; ki < 3; ki++) {
                int D = dims[di], nk = nks[ki], rp = rps[(di + ki) % 3], nr = rp - (int)(rnd() % 16);
                float *qt = malloc(sizeof(float) * (size_t)D * rp), *kb = malloc(sizeof(float) * (size_t)nk * D);
                float *vb = malloc(sizeof(float) * (size_t)nk * D), *s = malloc(sizeof(float) * ((size_t)nk * rp + 8));
                float *o = malloc(sizeof(float) * ((size_t)rp * D + 8)), *o0 = malloc(sizeof(float) * (size_t)rp * D);
                float corr[48];
                for (int i = 0; i < D * rp; i++) qt[i] = frand(-1, 1);
                for (int i = 0; i < nk * D; i++) kb[i] = frand(-1, 1), vb[i] = frand(-1, 1);
                for (int r = 0; r < rp; r++) corr[r] = frand(0, 1);
                for (int i = 0; i < nk * rp + 8; i++) s[i] = NAN;
                vd_attn_scores(D, nk, rp, qt, kb, s);
                for (int k = 0; k < nk; k++)
                    for (int r = 0; r < rp; r++) {
                        double ref = 0, mag = 0;
                        for (int d = 0; d < D; d++) {
                            ref += (double)qt[d * rp + r] * kb[k * D + d];
                            mag += fabs((double)qt[d * rp + r] * kb[k * D + d]);
                        }
                        cr_assert(fabs(s[k * rp + r] - ref) <= 1.01 * (D + 2) * 0x1p-24 * mag + 1e-30,
                                  "%s scores D=%d nk=%d key %d row %d: %.9g vs %.9g", vd_isa_name((vd_isa)isa), D, nk, k,
                                  r, s[k * rp + r], ref);
                    }
                for (int i = nk * rp; i < nk * rp + 8; i++) cr_assert(isnan(s[i]), "scores wrote past nk x rp");
                for (int i = 0; i < nk * rp; i++) s[i] = frand(0, 1);
                for (int i = 0; i < rp * D; i++) o[i] = o0[i] = frand(-1, 1);
                for (int i = rp * D; i < rp * D + 8; i++) o[i] = NAN;
                vd_attn_accum(D, nk, nr, rp, s, vb, corr, o);
                for (int r = 0; r < rp; r++)
                    for (int d = 0; d < D; d++) {
                        float got = o[r * D + d];
                        if (r >= nr) {
                            cr_assert_eq(got, o0[r * D + d], "accum touched row %d >= nr %d", r, nr);
                            continue;
                        }
                        double ref = (double)o0[r * D + d] * corr[r], mag = fabs(ref);
                        for (int k = 0; k < nk; k++) {
                            ref += (double)s[k * rp + r] * vb[k * D + d];
                            mag += fabs((double)s[k * rp + r] * vb[k * D + d]);
                        }
                        cr_assert(fabs(got - ref) <= 1.01 * (nk + 3) * 0x1p-24 * mag + 1e-30,
                                  "%s accum D=%d nk=%d row %d dim %d: %.9g vs %.9g", vd_isa_name((vd_isa)isa), D, nk, r, d,
                                  got, ref);
                    }
                for (int i = rp * D; i < rp * D + 8; i++) cr_assert(isnan(o[i]), "accum wrote past the rows");
                free(qt); free(kb); free(vb); free(s); free(o); free(o0);
            }
    }
    cr_assert_eq(vd_set_isa(was, err, sizeof err), 0, "%s", err);
}

/* RMS norm of a row on every instruction set: against double arithmetic (the mean of squares is
 * summed in double, so only the f32 scale and the two products round), in place and not. */
Test(kernels, rmsnorm_row_matches_double_on_every_isa)
{
    seed_rng("rmsnorm_row_matches_double_on_every_isa");
    char err[256];
    vd_isa was = vd_isa_active();
    static const int64_t lens[] = { 1, 7, 15, 16, 17, 256, 640, 1001 };
    for (int isa = 0; isa < VD_ISA_COUNT; isa++) {
        if (!vd_isa_supported((vd_isa)isa)) continue;
        cr_assert_eq(vd_set_isa((vd_isa)isa, err, sizeof err), 0, "%s", err);
        for (int li = 0; li < 8; li++) {
            int64_t n = lens[li];
            float *x = malloc(sizeof(float) * (size_t)n), *w = malloc(sizeof(float) * (size_t)n);
            float *y = malloc(sizeof(float) * (size_t)(n + 4)), *z = malloc(sizeof(float) * (size_t)n);
            float scale = ldexpf(1.0f, (int)(rnd() % 20) - 10);
            for (int64_t i = 0; i < n; i++) x[i] = frand(-1, 1) * scale, w[i] = frand(0.5f, 1.5f), z[i] = x[i];
            for (int64_t i = 0; i < n + 4; i++) y[i] = NAN;
            vd_rmsnorm_f32(n, x, w, y, 1e-6f);
            vd_rmsnorm_f32(n, z, w, z, 1e-6f);
            double ss = 0;
            for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
            double inv = 1.0 / sqrt(ss / (double)n + 1e-6);
            for (int64_t i = 0; i < n; i++) {
                double ref = (double)x[i] * inv * w[i];
                cr_assert(fabs(y[i] - ref) <= 4 * 0x1p-24 * fabs(ref) + 1e-37, "%s n=%lld i=%lld: %.9g vs %.9g",
                          vd_isa_name((vd_isa)isa), (long long)n, (long long)i, y[i], ref);
                cr_assert_eq(y[i], z[i], "in place differs at %lld", (long long)i);
            }
            for (int64_t i = n; i < n + 4; i++) cr_assert(isnan(y[i]), "wrote past n");
            free(x); free(w); free(y); free(z);
        }
    }
    cr_assert_eq(vd_set_isa(was, err, sizeof err), 0, "%s", err);
}

/* Every SIMD level against the portable loops, bit for bit: exp (specials included), GELU and SiLU
 * gates, the f32 and f16 dot products and axpys, Quest's bound, RMS norm and the blocked
 * attention's scores and accumulation, on lengths that leave every tail. The portable loops keep the
 * vector kernels' lanes and fused multiply-adds, so nothing computed depends on the CPU. */
static int same_bits(const float *a, const float *b, int64_t n) { return !memcmp(a, b, sizeof(float) * (size_t)n); }

Test(kernels, every_isa_gives_the_portable_bits)
{
    seed_rng("every_isa_gives_the_portable_bits");
    char err[256];
    vd_isa was = vd_isa_active();
    enum { N = 1037 };
    static float x[N], w[N], lo[N], hi[N], g[N], u[N], y0[N], y1[N];
    static uint16_t h[N];
    static const int64_t lens[] = { 1, 7, 8, 15, 16, 17, 31, 32, 33, 100, 256, 640, 1001, N };
    for (int isa = VD_ISA_AVX2; isa < VD_ISA_COUNT; isa++) {
        if (!vd_isa_supported((vd_isa)isa)) {
            cr_log_info("SKIP %s: this CPU lacks %s", vd_isa_name((vd_isa)isa), vd_isa_describe((vd_isa)isa));
            continue;
        }
        cr_assert_eq(vd_set_isa((vd_isa)isa, err, sizeof err), 0, "%s", err);
        const char *name = vd_isa_name((vd_isa)isa);
        for (int i = 0; i < N; i++) {
            x[i] = frand(-110, 95);
            w[i] = frand(-2, 2);
            lo[i] = frand(-1, 0);
            hi[i] = lo[i] + frand(0, 2);
            g[i] = frand(-12, 12);
            u[i] = frand(-2, 2);
            h[i] = quant_f32_to_fp16(frand(-3, 3));
        }
        x[0] = -INFINITY, x[1] = INFINITY, x[2] = NAN, x[3] = 88.7228317f, x[4] = 88.7228394f, x[5] = -104.0f;
        x[6] = -103.99f, x[7] = 0.0f, x[8] = -0.0f, x[9] = -87.3f;
        vd_force_scalar(1);
        vd_exp_f32(N, x, y0);
        vd_force_scalar(0);
        vd_exp_f32(N, x, y1);
        for (int i = 0; i < N; i++)
            cr_assert(!memcmp(&y0[i], &y1[i], 4), "%s exp(%.9g) = %.9g, portable %.9g", name, x[i], y1[i], y0[i]);
        for (int gelu = 0; gelu <= 1; gelu++) {
            memcpy(y0, g, sizeof g);
            memcpy(y1, g, sizeof g);
            vd_force_scalar(1);
            vd_glu_f32(N, y0, u, gelu);
            vd_force_scalar(0);
            vd_glu_f32(N, y1, u, gelu);
            cr_assert(same_bits(y0, y1, N), "%s %s differs from the portable loop", name, gelu ? "GELU" : "SiLU");
        }
        for (int li = 0; li < (int)(sizeof lens / sizeof lens[0]); li++) {
            int64_t n = lens[li];
            float a = frand(-1, 1), s0, s1;
            vd_force_scalar(1);
            s0 = vd_dot_f32(n, w, g);
            vd_force_scalar(0);
            s1 = vd_dot_f32(n, w, g);
            cr_assert(!memcmp(&s0, &s1, 4), "%s dot_f32 n=%lld: %.9g vs %.9g", name, (long long)n, s1, s0);
            vd_force_scalar(1);
            s0 = vd_dot_f32_f16(n, w, h);
            vd_force_scalar(0);
            s1 = vd_dot_f32_f16(n, w, h);
            cr_assert(!memcmp(&s0, &s1, 4), "%s dot_f32_f16 n=%lld: %.9g vs %.9g", name, (long long)n, s1, s0);
            vd_force_scalar(1);
            s0 = vd_bound_f32(n, w, lo, hi);
            vd_force_scalar(0);
            s1 = vd_bound_f32(n, w, lo, hi);
            cr_assert(!memcmp(&s0, &s1, 4), "%s bound n=%lld: %.9g vs %.9g", name, (long long)n, s1, s0);
            for (int half = 0; half <= 1; half++) {
                memcpy(y0, u, sizeof u);
                memcpy(y1, u, sizeof u);
                vd_force_scalar(1);
                if (half) vd_axpy_f16(n, a, h, y0); else vd_axpy_f32(n, a, g, y0);
                vd_force_scalar(0);
                if (half) vd_axpy_f16(n, a, h, y1); else vd_axpy_f32(n, a, g, y1);
                cr_assert(same_bits(y0, y1, N), "%s axpy_%s n=%lld differs", name, half ? "f16" : "f32", (long long)n);
            }
            vd_force_scalar(1);
            vd_rmsnorm_f32(n, g, w, y0, 1e-6f);
            vd_force_scalar(0);
            vd_rmsnorm_f32(n, g, w, y1, 1e-6f);
            cr_assert(same_bits(y0, y1, n), "%s rmsnorm n=%lld differs", name, (long long)n);
        }
        static const int dims[] = { 8, 40, 72, 256 }, nks[] = { 1, 7, 64 }, rps[] = { 16, 32, 48 };
        for (int di = 0; di < 4; di++)
            for (int ki = 0; ki < 3; ki++) {
                int D = dims[di], nk = nks[ki], rp = rps[(di + ki) % 3], nr = rp - (int)(rnd() % 16);
                size_t ns = (size_t)nk * rp, no = (size_t)rp * D;
                float *qt = malloc(sizeof(float) * (size_t)D * rp), *kb = malloc(sizeof(float) * (size_t)nk * D);
                float *vb = malloc(sizeof(float) * (size_t)nk * D), *sa = malloc(sizeof(float) * ns);
                float *sb = malloc(sizeof(float) * ns), *oa = malloc(sizeof(float) * no), *ob = malloc(sizeof(float) * no);
                float corr[48];
                for (int i = 0; i < D * rp; i++) qt[i] = frand(-1, 1);
                for (int i = 0; i < nk * D; i++) kb[i] = frand(-1, 1), vb[i] = frand(-1, 1);
                for (int r = 0; r < rp; r++) corr[r] = frand(0, 1);
                vd_force_scalar(1);
                vd_attn_scores(D, nk, rp, qt, kb, sa);
                vd_force_scalar(0);
                vd_attn_scores(D, nk, rp, qt, kb, sb);
                cr_assert(same_bits(sa, sb, (int64_t)ns), "%s attention scores D=%d nk=%d rp=%d differ", name, D, nk, rp);
                for (size_t i = 0; i < ns; i++) sa[i] = frand(0, 1);
                for (size_t i = 0; i < no; i++) oa[i] = ob[i] = frand(-1, 1);
                vd_force_scalar(1);
                vd_attn_accum(D, nk, nr, rp, sa, vb, corr, oa);
                vd_force_scalar(0);
                vd_attn_accum(D, nk, nr, rp, sa, vb, corr, ob);
                cr_assert(same_bits(oa, ob, (int64_t)no), "%s attention accumulation D=%d nk=%d nr=%d differs", name, D, nk, nr);
                free(qt); free(kb); free(vb); free(sa); free(sb); free(oa); free(ob);
            }
    }
    cr_assert_eq(vd_set_isa(was, err, sizeof err), 0, "%s", err);
}

/* A page's key summary folded one f16 row at a time (the KV cache's Quest bounds), and several
 * rows in one call (a page filled at once): every ISA's kernel gives the bits of a plain loop
 * written here (a sum that is NaN: NaN), over rows with NaN, infinities, signed zeros and
 * subnormals, at lengths that leave every tail; a NaN key moves neither bound, and between +0 and
 * -0 the one seen first stays. */
Test(kernels, key_summaries_fold_like_a_plain_loop_on_every_isa)
{
    seed_rng("key_summaries");
    char err[256];
    vd_isa was = vd_isa_active();
    enum { ROWS = 40, N = 301 };
    static uint16_t k[ROWS][N];
    static float s0[N], n0[N], x0[N], s1[N], n1[N], x1[N], s2[N], n2[N], x2[N];
    static const uint16_t odd[] = { 0x7e00 /* NaN */, 0x7c00 /* +inf */, 0xfc00 /* -inf */, 0x8000 /* -0 */,
                                    0x0000 /* +0 */, 0x0001 /* smallest subnormal */, 0x83ff, 0x7bff /* 65504 */ };
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < N; i++)
            k[r][i] = rnd() % 7 == 0 ? odd[rnd() % 8] : quant_f32_to_fp16(frand(-4, 4));
    static const int64_t lens[] = { 1, 7, 8, 9, 16, 33, 128, 256, N };
    for (int li = 0; li < (int)(sizeof lens / sizeof lens[0]); li++) {
        int64_t n = lens[li];
        for (int i = 0; i < n; i++) s0[i] = 0, n0[i] = FLT_MAX, x0[i] = -FLT_MAX;
        for (int r = 0; r < ROWS; r++)
            for (int i = 0; i < n; i++) {
                float t = quant_fp16_to_f32(k[r][i]);
                s0[i] += t;
                if (t < n0[i]) n0[i] = t;
                if (t > x0[i]) x0[i] = t;
            }
        for (int isa = VD_ISA_SCALAR; isa < VD_ISA_COUNT; isa++) {
            if (!vd_isa_supported((vd_isa)isa)) continue;
            cr_assert_eq(vd_set_isa((vd_isa)isa, err, sizeof err), 0, "%s", err);
            for (int i = 0; i < n; i++) s1[i] = 0, n1[i] = FLT_MAX, x1[i] = -FLT_MAX;
            for (int r = 0; r < ROWS; r++) vd_key_summary(n, 1, k[r], n, s1, n1, x1);
            /* every row in one call, and in calls of a few rows (a page filled in runs) */
            for (int i = 0; i < n; i++) s2[i] = 0, n2[i] = FLT_MAX, x2[i] = -FLT_MAX;
            vd_key_summary(n, ROWS, k[0], N, s2, n2, x2);
            const char *name = vd_isa_name((vd_isa)isa);
            for (int64_t i = 0; i < n; i++)
                cr_assert(isnan(s0[i]) ? isnan(s2[i]) : !memcmp(&s0[i], &s2[i], 4),
                          "%s n=%lld, rows at once: sum %lld is %.9g, not %.9g", name, (long long)n, (long long)i,
                          s2[i], s0[i]);
            cr_assert(same_bits(n0, n2, n), "%s n=%lld, rows at once: the minima differ", name, (long long)n);
            cr_assert(same_bits(x0, x2, n), "%s n=%lld, rows at once: the maxima differ", name, (long long)n);
            for (int i = 0; i < n; i++) s2[i] = 0, n2[i] = FLT_MAX, x2[i] = -FLT_MAX;
            for (int r = 0; r < ROWS; r += 7) vd_key_summary(n, ROWS - r < 7 ? ROWS - r : 7, k[r], N, s2, n2, x2);
            cr_assert(same_bits(n0, n2, n) && same_bits(x0, x2, n), "%s n=%lld, rows in runs: the bounds differ", name,
                      (long long)n);
            /* a sum that met NaN (or +inf and -inf) is NaN with either sign: the compiler may put
             * an addition's operands either way round, and x86 keeps the first one's NaN */
            for (int64_t i = 0; i < n; i++)
                cr_assert(isnan(s0[i]) ? isnan(s1[i]) : !memcmp(&s0[i], &s1[i], 4), "%s n=%lld: sum %lld is %.9g, not %.9g",
                          name, (long long)n, (long long)i, s1[i], s0[i]);
            cr_assert(same_bits(n0, n1, n), "%s n=%lld: the minima differ", name, (long long)n);
            cr_assert(same_bits(x0, x1, n), "%s n=%lld: the maxima differ", name, (long long)n);
        }
    }
    /* the fold's rules, by hand: NaN moves nothing, the first zero seen stays */
    for (int isa = VD_ISA_SCALAR; isa < VD_ISA_COUNT; isa++) {
        if (!vd_isa_supported((vd_isa)isa)) continue;
        cr_assert_eq(vd_set_isa((vd_isa)isa, err, sizeof err), 0, "%s", err);
        uint16_t row[9];
        float sum[9], mn[9], mx[9];
        for (int i = 0; i < 9; i++) row[i] = 0x7e00, sum[i] = 0, mn[i] = 1, mx[i] = 2;
        vd_key_summary(9, 1, row, 9, sum, mn, mx);
        for (int i = 0; i < 9; i++) cr_assert(mn[i] == 1 && mx[i] == 2 && isnan(sum[i]), "%s lane %d", vd_isa_name((vd_isa)isa), i);
        for (int i = 0; i < 9; i++) row[i] = 0x8000, mn[i] = 0.0f, mx[i] = 0.0f;
        vd_key_summary(9, 1, row, 9, sum, mn, mx);
        for (int i = 0; i < 9; i++) cr_assert(!signbit(mn[i]) && !signbit(mx[i]), "%s lane %d: -0 replaced +0", vd_isa_name((vd_isa)isa), i);
    }
    cr_assert_eq(vd_set_isa(was, err, sizeof err), 0, "%s", err);
}

/* A selection's bits against the last step's: the set bits and the shared ones counted bit by bit,
 * and the bits copied, at every instruction set, for lengths around the loops' steps. */
Test(kernels, bits_overlap_counts_and_copies_at_every_isa)
{
    char err[128];
    vd_isa was = vd_isa_active();
    uint64_t rng = 99;
    for (int64_t words = 0; words < 70; words += 1 + words / 8) {
        uint64_t now[70], last[70], orig[70];
        for (int64_t w = 0; w < words; w++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            now[w] = w % 5 == 0 ? ~0ull : rng;
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            orig[w] = w % 7 == 0 ? 0 : rng;
        }
        int64_t set = 0, shared = 0;
        for (int64_t w = 0; w < words; w++)
            for (int b = 0; b < 64; b++) {
                set += (now[w] >> b) & 1;
                shared += (now[w] >> b) & (orig[w] >> b) & 1;
            }
        for (int isa = VD_ISA_SCALAR; isa < VD_ISA_COUNT; isa++) {
            if (!vd_isa_supported((vd_isa)isa)) continue;
            cr_assert_eq(vd_set_isa((vd_isa)isa, err, sizeof err), 0, "%s", err);
            memcpy(last, orig, sizeof last);
            int64_t s = -1, b = -1;
            vd_bits_overlap(words, now, last, &s, &b);
            cr_assert(s == set && b == shared, "%s, %lld words: %lld and %lld, not %lld and %lld", vd_isa_name((vd_isa)isa),
                      (long long)words, (long long)s, (long long)b, (long long)set, (long long)shared);
            cr_assert(!memcmp(last, now, sizeof(uint64_t) * (size_t)words), "the bits were not copied");
        }
    }
    cr_assert_eq(vd_set_isa(was, err, sizeof err), 0, "%s", err);
}
