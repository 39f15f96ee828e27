/* test_quantize.c - the quantizers of common/quant.c (quant_quantize_row).
 *
 * Two oracles. Random rows: what each format promises (the 32-element formats: every element within
 * one code step, derived from the block's largest magnitude or range; the K-quants: no worse than a
 * plain min/max grid of the same codes). The reference tool's files: the tiny Q4_K_M models were
 * made by the reference quantizer from the same random weights as the F16 ones, but from their f32
 * originals, which the F16 files hold rounded. So a block is either byte-identical when quantized
 * from the F16 values, or (when the rounding moved a decision) reproduced exactly by some input
 * inside the F16 values' rounding intervals, found by a seeded random search. QUANT_SEED replays. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/quant.h"
#include "engine/gguf.h"

static uint64_t g_rng;
static void seed_rng(const char *what)
{
    const char *env = getenv("QUANT_SEED");
    g_rng = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) * 2654435761u + 1;
    if (!g_rng) g_rng = 1;
    cr_log_info("%s: seed %llu (QUANT_SEED to replay)", what, (unsigned long long)g_rng);
}
static uint64_t rnd(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1DULL;
}
static double unit(void) { return ((double)(rnd() >> 11) + 0.5) * 0x1p-53; }
static double normal(void) { return sqrt(-2.0 * log(unit())) * cos(6.283185307179586 * unit()); }

/* ------------------------------------------------------------------ random rows */

/* Half the f16 spacing at v: an f32 original within this of v rounds to v. */
static float half_ulp_f16(float v)
{
    float a = fabsf(v);
    if (a < 0x1p-14f) return 0x1p-25f;
    int e;
    frexpf(a, &e);
    return ldexpf(1.0f, e - 12);
}


static const uint32_t QTYPES[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                                   GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K };

/* One row of n values: Gaussian at scale sc, sometimes shifted, sometimes with a spike, sometimes all
 * of one sign: the shapes weights and their fallbacks meet. */
static void random_row(float *x, int n, int kind)
{
    double sc = kind % 3 == 0 ? 0.02 : kind % 3 == 1 ? 3.0 : 1e-3;
    for (int i = 0; i < n; i++) x[i] = (float)(normal() * sc);
    if (kind % 4 == 1)
        for (int i = 0; i < n; i++) x[i] += (float)(0.7 * sc);
    if (kind % 5 == 2) x[rnd() % (uint64_t)n] = (float)(12.0 * sc);
    if (kind % 7 == 3)
        for (int i = 0; i < n; i++) x[i] = fabsf(x[i]);
}

/* The error of a min/max grid with codes 0..nmax over each sub-block of 32 (f32 scale, no search):
 * the K-quants' fitted scales and minimums must do at least as well. Returns the squared error. */
static double plain_grid_err2(const float *x, int n, int nmax, int sub)
{
    double e2 = 0;
    for (int s = 0; s < n; s += sub) {
        float mn = 0, mx = x[s];
        for (int i = s; i < s + sub; i++) {
            if (x[i] < mn) mn = x[i];
            if (x[i] > mx) mx = x[i];
        }
        double step = (mx - mn) / nmax;
        for (int i = s; i < s + sub; i++) {
            double q = step > 0 ? floor((x[i] - mn) / step + 0.5) : 0;
            double d = mn + q * step - x[i];
            e2 += d * d;
        }
    }
    return e2;
}

/* The signed grid of Q6_K's sub-blocks of 16 (codes -32..31, spacing max|x| / 32). */
static double plain_signed_err2(const float *x, int n)
{
    double e2 = 0;
    for (int s = 0; s < n; s += 16) {
        float amax = 0;
        for (int i = s; i < s + 16; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        double step = amax / 32.0;
        for (int i = s; i < s + 16; i++) {
            double q = step > 0 ? floor(x[i] / step + 0.5) : 0;
            if (q > 31) q = 31;
            if (q < -32) q = -32;
            double d = q * step - x[i];
            e2 += d * d;
        }
    }
    return e2;
}

Test(quantize, every_format_round_trips_random_rows_within_its_bounds)
{
    seed_rng("round trips");
    const int n = 1024;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    uint8_t *q = malloc(2 * (size_t)n);
    for (size_t ti = 0; ti < sizeof QTYPES / sizeof *QTYPES; ti++) {
        uint32_t ty = QTYPES[ti];
        double worst_ratio = 0;
        for (int r = 0; r < 60; r++) {
            random_row(x, n, r);
            cr_assert_eq(quant_quantize_row(ty, x, q, n), 0);
            for (int i = 0; i < n; i++) y[i] = NAN;
            quant_dequant_row(ty, q, y, n);
            if (ty == GGML_TYPE_Q4_K || ty == GGML_TYPE_Q5_K || ty == GGML_TYPE_Q6_K) {
                /* rows at 1e-3 put the super-block scale (a sub-block scale / 63) among f16's
                 * subnormals, where its rounding alone exceeds what the plain f32 grid is allowed */
                if (r % 3 == 2) continue;
                double e2 = 0;
                for (int i = 0; i < n; i++) e2 += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
                int nmax = ty == GGML_TYPE_Q4_K ? 15 : 31;
                double base = ty == GGML_TYPE_Q6_K ? plain_signed_err2(x, n) : plain_grid_err2(x, n, nmax, 32);
                /* Q4_K/Q5_K store each sub-block's minimum in 6 bits of the largest one, so it can be
                 * off by dmin/2 = max_min/126, about range/252 on centred data: an offset worth up to
                 * 12 * (nmax/252)^2 of a plain grid's squared error (4% for Q4_K, 18% for Q5_K;
                 * measured worst over 300 seeds: 4% for Q5_K; Q4_K and Q6_K always below the plain grid) */
                double allow = ty == GGML_TYPE_Q6_K ? 1.0 : 1.0 + 12.0 * (nmax / 252.0) * (nmax / 252.0);
                cr_assert(isfinite(e2) && e2 <= base * allow, "%s row %d: squared error %g, a plain grid gives %g",
                          quant_type_name(ty), r, e2, base);
                if (sqrt(e2 / base) > worst_ratio) worst_ratio = sqrt(e2 / base);
                continue;
            }
            for (int b = 0; b < n; b += 32) {
                float amax = 0, mn = x[b], mx = x[b];
                for (int i = b; i < b + 32; i++) {
                    amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
                    mn = x[i] < mn ? x[i] : mn;
                    mx = x[i] > mx ? x[i] : mx;
                }
                /* half a step (one in the symmetric formats, whose top code is clamped), plus what the
                 * f16 rounding of the stored scale (times the largest code) and minimum can add */
                double d = ty == GGML_TYPE_Q8_0 ? amax / 127.0 : ty == GGML_TYPE_Q4_0 ? amax / 8.0
                         : ty == GGML_TYPE_Q5_0 ? amax / 16.0 : ty == GGML_TYPE_Q4_1 ? (mx - mn) / 15.0 : (mx - mn) / 31.0;
                double hd = half_ulp_f16((float)d), hm = half_ulp_f16(mn);
                double bound = ty == GGML_TYPE_Q8_0   ? 0.5 * d + 127 * hd
                               : ty == GGML_TYPE_Q4_0 ? d + 8 * hd
                               : ty == GGML_TYPE_Q5_0 ? d + 16 * hd
                               : ty == GGML_TYPE_Q4_1 ? 0.5 * d + 15 * hd + hm
                                                      : 0.5 * d + 31 * hd + hm;
                bound *= 1.0 + 1e-5;   /* the f32 arithmetic of the round trip */
                for (int i = b; i < b + 32; i++)
                    cr_assert(fabs((double)y[i] - x[i]) <= bound + 1e-30, "%s row %d element %d: %g -> %g, bound %g",
                              quant_type_name(ty), r, i, x[i], y[i], bound);
            }
        }
        if (worst_ratio > 0)
            cr_log_info("%s: error at most %.3f of a plain min/max grid's", quant_type_name(ty), worst_ratio);
    }
    free(x);
    free(y);
    free(q);
}

Test(quantize, zero_rows_stay_zero_and_constant_rows_keep_their_value)
{
    float x[256], y[256];
    uint8_t q[512];
    for (size_t ti = 0; ti < sizeof QTYPES / sizeof *QTYPES; ti++) {
        uint32_t ty = QTYPES[ti];
        for (int i = 0; i < 256; i++) x[i] = 0;
        cr_assert_eq(quant_quantize_row(ty, x, q, 256), 0);
        quant_dequant_row(ty, q, y, 256);
        for (int i = 0; i < 256; i++) cr_assert(y[i] == 0.0f, "%s: zero row gives %g", quant_type_name(ty), y[i]);
        for (int i = 0; i < 256; i++) x[i] = -0.25f;
        cr_assert_eq(quant_quantize_row(ty, x, q, 256), 0);
        quant_dequant_row(ty, q, y, 256);
        /* exact but for the f16 rounding of the stored scale or minimum */
        for (int i = 0; i < 256; i++)
            cr_assert(fabsf(y[i] + 0.25f) <= 0.25f * 0x1p-10f, "%s: a constant -0.25 row gives %.9g at %d",
                      quant_type_name(ty), y[i], i);
    }
}

Test(quantize, float_formats_round_and_bad_requests_are_refused)
{
    float x[4] = { 1.0f, -2.5f, 65504.0f, 1e-8f }, y[4];
    uint16_t h[4];
    cr_assert_eq(quant_quantize_row(GGML_TYPE_F16, x, h, 4), 0);
    for (int i = 0; i < 4; i++) cr_assert_eq(h[i], quant_f32_to_fp16(x[i]));
    cr_assert_eq(quant_quantize_row(GGML_TYPE_BF16, x, h, 4), 0);
    for (int i = 0; i < 4; i++) cr_assert_eq(h[i], quant_f32_to_bf16(x[i]));
    cr_assert_eq(quant_quantize_row(GGML_TYPE_F32, x, y, 4), 0);
    cr_assert_eq(memcmp(x, y, sizeof x), 0);
    uint8_t q[64];
    cr_assert_eq(quant_quantize_row(GGML_TYPE_Q8_0, x, q, 4), -1, "4 is not a multiple of 32");
    cr_assert_eq(quant_quantize_row(GGML_TYPE_Q2_K, x, q, 256), -1, "Q2_K is not written");
    cr_assert_eq(quant_quantize_row(GGML_TYPE_Q8_K, x, q, 256), -1);
    cr_assert_eq(quant_quantize_row(99, x, q, 32), -1);
    cr_assert(!quant_can_quantize(GGML_TYPE_Q2_K) && quant_can_quantize(GGML_TYPE_Q6_K));
}

/* ------------------------------------------------------------------ the reference tool's files */

typedef struct ref_stats {
    long blocks, identical, differing, sampled, reproduced;
    double max_dq;     /* largest difference of dequantized values where the bytes differ */
} ref_stats;

/* Every quantized tensor of the Q4_K_M file against the same tensor of the F16 file. */
static void check_reference_file(const char *f16_path, const char *q_path, ref_stats st[GGML_TYPE_MAX_ID])
{
    char err[512];
    gguf_file *fa, *fb;
    cr_assert(gguf_open(&fa, f16_path, err, sizeof err) == 0, "%s", err);
    cr_assert(gguf_open(&fb, q_path, err, sizeof err) == 0, "%s", err);
    const int sample_per_tensor = 24, max_trials = 200000;
    FILE *dbg = getenv("QUANT_DEBUG") ? stderr : NULL;
    for (int64_t ti = 0; ti < gguf_n_tensors(fb); ti++) {
        const gguf_tensor *t = gguf_tensor_at(fb, ti);
        if (t->type == GGML_TYPE_F32) continue;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        const gguf_tensor *s = gguf_find_tensor(fa, name);
        cr_assert(s && s->type == GGML_TYPE_F16 && s->ne[0] == t->ne[0] && s->ne[1] == t->ne[1], "%s: %s", q_path, name);
        int64_t blck, tsz, n0 = t->ne[0];
        quant_block_geometry(t->type, &blck, &tsz);
        size_t rs = quant_row_size(t->type, n0), rs16 = quant_row_size(GGML_TYPE_F16, n0);
        int64_t rows = (int64_t)(t->nbytes / rs);
        float *x = malloc(sizeof(float) * (size_t)n0), *xp = malloc(sizeof(float) * (size_t)blck);
        float *d1 = malloc(sizeof(float) * (size_t)blck), *d2 = malloc(sizeof(float) * (size_t)blck);
        uint8_t *q = malloc(rs);
        ref_stats *sp = &st[t->type];
        int sampled_here = 0;
        for (int64_t r = 0; r < rows; r++) {
            quant_dequant_row(GGML_TYPE_F16, (const uint8_t *)s->data + (size_t)r * rs16, x, n0);
            cr_assert_eq(quant_quantize_row(t->type, x, q, n0), 0);
            const uint8_t *ref = (const uint8_t *)t->data + (size_t)r * rs;
            for (int64_t k = 0; k < n0 / blck; k++) {
                const uint8_t *mine = q + k * tsz, *theirs = ref + k * tsz;
                sp->blocks++;
                if (!memcmp(mine, theirs, (size_t)tsz)) {
                    sp->identical++;
                    continue;
                }
                sp->differing++;
                quant_dequant_row(t->type, mine, d1, blck);
                quant_dequant_row(t->type, theirs, d2, blck);
                for (int64_t i = 0; i < blck; i++)
                    if (fabs((double)d1[i] - d2[i]) > sp->max_dq) sp->max_dq = fabs((double)d1[i] - d2[i]);
                /* a seeded sample of the differing blocks: search the rounding intervals */
                if (sampled_here >= sample_per_tensor || rnd() % 8 != 0) continue;
                sampled_here++;
                sp->sampled++;
                const float *xb = x + k * blck;
                uint8_t qb[256];
                for (int trial = 0; trial < max_trials; trial++) {
                    for (int64_t i = 0; i < blck; i++) xp[i] = xb[i] + (float)((unit() * 2 - 1) * half_ulp_f16(xb[i]));
                    quant_quantize_row(t->type, xp, qb, blck);
                    if (!memcmp(qb, theirs, (size_t)tsz)) {
                        sp->reproduced++;
                        break;
                    }
                    if (trial == max_trials - 1 && dbg) fprintf(dbg, "%s row %lld block %lld not reproduced\n", name, (long long)r, (long long)k);
                }
            }
        }
        free(x);
        free(xp);
        free(d1);
        free(d2);
        free(q);
    }
    gguf_free(fa);
    gguf_free(fb);
}

Test(quantize, reproduces_the_reference_tools_q4_k_m_blocks, .timeout = 240)
{
    seed_rng("reference blocks");
    const char *models[] = { "tiny-llama", "tiny-gemma3" };
    for (size_t mi = 0; mi < 2; mi++) {
        char a[256], b[256];
        snprintf(a, sizeof a, "../shared/testdata/tiny/%s-f16.gguf", models[mi]);
        snprintf(b, sizeof b, "../shared/testdata/tiny/%s-q4_k_m.gguf", models[mi]);
        ref_stats st[GGML_TYPE_MAX_ID];
        memset(st, 0, sizeof st);
        check_reference_file(a, b, st);
        int types_seen = 0;
        for (int ty = 0; ty < GGML_TYPE_MAX_ID; ty++) {
            const ref_stats *sp = &st[ty];
            if (!sp->blocks) continue;
            types_seen++;
            cr_log_info("%s %s: %ld blocks, %.1f%% byte-identical from the F16 values; of %ld differing blocks "
                        "sampled, %ld reproduced exactly inside the F16 rounding; largest dequantized difference %.3g",
                        models[mi], quant_type_name((uint32_t)ty), sp->blocks, 100.0 * sp->identical / sp->blocks,
                        sp->sampled, sp->reproduced, sp->max_dq);
            /* A different algorithm (another weighting, rounding or search) leaves almost no K-quant
             * block identical; the rounding of the F16 file alone moves at most about half of them
             * (measured: 43-96% identical by type). */
            cr_expect(sp->identical * 10 >= sp->blocks * 4, "%s %s: only %ld of %ld blocks identical", models[mi],
                      quant_type_name((uint32_t)ty), sp->identical, sp->blocks);
            /* Measured over every block of both files: of 212758 blocks that differ, all but two
             * (Q6_K blocks of tiny-llama whose scales differ by one in two sub-blocks) are found
             * within 200000 trials, most within a few dozen. A sample may hold both of those two (a
             * clean-clone run's did, 2026-11-28: 79 of 81), so it may miss both there, and one block
             * elsewhere (a search that runs out of trials). */
            int may_miss = !strcmp(models[mi], "tiny-llama") && ty == GGML_TYPE_Q6_K ? 2 : 1;
            cr_expect(sp->reproduced + may_miss >= sp->sampled, "%s %s: %ld of %ld sampled blocks reproduced",
                      models[mi], quant_type_name((uint32_t)ty), sp->reproduced, sp->sampled);
        }
        cr_expect(types_seen >= 2);
    }
}
