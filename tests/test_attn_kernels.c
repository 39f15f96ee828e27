/* test_attn_kernels.c - the CUDA attention kernels' per-lane work, on the host: the grouped kernel
 * (kernels/attn_group.h, decode) and the tensor-core flash kernel (kernels/attn_flash.h, prefill
 * chunks).
 *
 * ag_attention_sim and af_attention_sim run every lane of every block as the device does (the GPU
 * tests hold the device to the first's bits and to a tolerance of the second, whose products the
 * device sums in its own order); here both are checked against a double-precision softmax and
 * against the CPU backend's attention on random pages of odd lengths: head dimensions of 16 to 256
 * (rows of 2 to 32 lanes in the grouped kernel, 80 / 96 leaving lanes empty; one or two warps a row
 * tile in the flash kernel), groups of 1 to 12 query heads (more than one block a KV head), token
 * masks, merged-token bias, sliding windows, up to 70 queries (row tiles part empty), per-KV-head
 * page lists and rows of all heads side by side, 1 to more splits than pages. Also: ag_exp against
 * exp, the symmetry of the merge and of the slots' sums that the device's butterflies rely on, and
 * NaN kept. AG_SEED replays a run (the default seed is fixed). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant.h"
#include "kernels/attn_flash.h"
#include "kernels/attn_group.h"
#include "kernels/backend.h"
#include "tests/test_rng.h"

static void seed_rng(const char *what) { test_rng_seed(what, "AG_SEED", 0x5EEDull); }

Test(attn_group, ag_exp_is_within_two_units_in_the_last_place_of_exp)
{
    cr_expect(ag_exp(0.0f) == 1.0f && ag_exp(-0.0f) == 1.0f, "e^0 must be 1 exactly");
    cr_expect(ag_exp(-INFINITY) == 0.0f && ag_exp(-104.5f) == 0.0f && ag_exp(-1e30f) == 0.0f);
    cr_expect(ag_exp(-100.0f) > 0.0f && ag_exp(-100.0f) < 1e-43f, "e^-100 is a subnormal, %g", (double)ag_exp(-100.0f));
    cr_expect(isnan(ag_exp(NAN)));
    double worst = 0;
    float prev = 0.0f;
    int monotone = 1;
    /* every 2^-12 from -86 to 0, then a sweep of small magnitudes and some positive values */
    for (int i = -86 * 4096; i <= 0; i++) {
        const float x = (float)i / 4096.0f, y = ag_exp(x);
        const double r = exp((double)x), ulp = ldexp(1.0, ilogb(r) - 23);
        const double e = fabs((double)y - r) / ulp;
        if (e > worst) worst = e;
        if (y < prev) monotone = 0;
        prev = y;
    }
    for (float x = -1e-3f; x < 88.0f; x = x < 0 ? x * 0.5f + (x > -1e-30f ? 1e-3f : 0) : x + 0.37f) {
        const float y = ag_exp(x);
        const double r = exp((double)x), ulp = ldexp(1.0, ilogb(r) - 23);
        const double e = fabs((double)y - r) / ulp;
        if (e > worst) worst = e;
    }
    cr_log_info("ag_exp: worst %.2f units in the last place", worst);
    cr_expect(worst <= 2.0, "ag_exp is %.2f units in the last place from exp", worst);
    cr_expect(monotone, "ag_exp decreases somewhere as x grows");
}

/* Random states: merging a into b gives b into a's bits (the device's lanes l and l ^ o each merge
 * the other's state into their own); the slots' sums are the same on every lane. */
Test(attn_group, the_merges_and_the_slot_sums_are_symmetric)
{
    seed_rng("symmetry");
    for (int it = 0; it < 20000; it++) {
        float m1 = rnd() % 7 ? frand(-30, 30) : -INFINITY, m2 = rnd() % 7 ? frand(-30, 30) : -INFINITY;
        if (rnd() % 5 == 0) m2 = m1;
        float l1 = m1 == -INFINITY ? 0 : frand(0.5f, 40), l2 = m2 == -INFINITY ? 0 : frand(0.5f, 40);
        float o1[AG_DL], o2[AG_DL];
        for (int j = 0; j < AG_DL; j++) o1[j] = frand(-9, 9), o2[j] = frand(-9, 9);
        float am = m1, al = l1, ao[AG_DL], bm = m2, bl = l2, bo[AG_DL];
        memcpy(ao, o1, sizeof ao);
        memcpy(bo, o2, sizeof bo);
        ag_merge(&am, &al, ao, m2, l2, o2);
        ag_merge(&bm, &bl, bo, m1, l1, o1);
        cr_assert(memcmp(&am, &bm, sizeof am) == 0 && memcmp(&al, &bl, sizeof al) == 0 && memcmp(ao, bo, sizeof ao) == 0,
                  "merge(a, b) and merge(b, a) differ at m %g / %g", (double)m1, (double)m2);
    }
    for (int lk = 1; lk <= 32; lk <<= 1)
        for (int it = 0; it < 200; it++) {
            float part[AG_NL][AG_HEADS];
            for (int l = 0; l < lk; l++)
                for (int h = 0; h < AG_HEADS; h++) part[l][h] = frand(-5, 5) * (rnd() % 3 ? 1.0f : 1e4f);
            ag_slot_sum(part, lk, lk, AG_HEADS);
            for (int l = 1; l < lk; l++)
                cr_assert(memcmp(part[l], part[0], sizeof part[0]) == 0, "lane %d of %d has another sum", l, lk);
        }
}

/* A set of pages for n_kv KV heads: per-head lists (stride D) or, with side_by_side, one list whose
 * rows hold every head (stride n_kv * D, head_step D); pages of 0 to max_rows rows (masks of as
 * many words as that takes), each allocated for exactly its rows (one for none), so that under
 * ASan a read past a page's last row fails. */
typedef struct pageset {
    be_kv_page *pages;
    int64_t n_pages, head_pages[17];
    void **mem;
    int n_mem;
    int32_t max_pos, min_pos;
} pageset;

static void *keep(pageset *ps, size_t bytes)
{
    void *p = aligned_alloc(16, (bytes + 15) / 16 * 16);
    cr_assert(p);
    ps->mem[ps->n_mem++] = p;
    return p;
}

static void make_pageset(pageset *ps, int n_kv, int per_list, int D, int side_by_side, int with_mask, int with_bias,
                         int max_rows)
{
    const int lists = side_by_side ? 1 : n_kv, heads_in_row = side_by_side ? n_kv : 1;
    ps->n_pages = (int64_t)lists * per_list;
    ps->pages = calloc((size_t)ps->n_pages, sizeof *ps->pages);
    ps->mem = calloc((size_t)ps->n_pages * 5 + 1, sizeof(void *));
    ps->n_mem = 0;
    ps->max_pos = 0;
    ps->min_pos = INT32_MAX;
    for (int g = 0; g < lists; g++) {
        ps->head_pages[g] = (int64_t)g * per_list;
        int32_t p = (int32_t)(rnd() % 5);
        for (int j = 0; j < per_list; j++) {
            be_kv_page *pg = &ps->pages[(int64_t)g * per_list + j];
            const int32_t n = rnd() % 9 == 0 ? 0 : 1 + (int32_t)(rnd() % (uint32_t)max_rows), cap = n > 0 ? n : 1;
            const int32_t stride = heads_in_row * D;
            uint16_t *k = keep(ps, sizeof(uint16_t) * (size_t)cap * (size_t)stride);
            uint16_t *v = keep(ps, sizeof(uint16_t) * (size_t)cap * (size_t)stride);
            int32_t *pos = keep(ps, sizeof(int32_t) * (size_t)cap);
            for (int64_t e = 0; e < (int64_t)cap * stride; e++) {
                k[e] = quant_f32_to_fp16(frand(-1, 1));
                v[e] = quant_f32_to_fp16(frand(-1, 1));
            }
            for (int32_t t = 0; t < cap; t++) pos[t] = (p += 1 + (int32_t)(rnd() % 3));
            p = n > 0 ? pos[n - 1] : p;
            if (n > 0 && pos[0] < ps->min_pos) ps->min_pos = pos[0];
            float *bias = NULL;
            if (with_bias) {
                bias = keep(ps, sizeof(float) * (size_t)cap);
                for (int32_t t = 0; t < cap; t++) bias[t] = rnd() % 3 ? 0.0f : logf(2.0f + (float)(rnd() % 4));
            }
            uint64_t *mask = NULL;
            if (with_mask && rnd() % 2) {
                const int32_t words = (cap + 63) / 64;
                mask = keep(ps, sizeof(uint64_t) * (size_t)words);
                memset(mask, 0, sizeof(uint64_t) * (size_t)words);
                for (int32_t t = 0; t < n; t++)
                    if (rnd() % 4) mask[t >> 6] |= 1ull << (t & 63);
            }
            *pg = (be_kv_page){ .k = k, .v = v, .pos = pos, .bias = bias, .mask = mask, .n = n, .stride = stride,
                                .head_step = side_by_side ? D : 0, .gen = 0, .cap = n };
        }
        if (p > ps->max_pos) ps->max_pos = p;
    }
    ps->head_pages[lists] = ps->n_pages;
}

static void free_pageset(pageset *ps)
{
    for (int i = 0; i < ps->n_mem; i++) free(ps->mem[i]);
    free(ps->mem);
    free(ps->pages);
}

/* The exact attention of a's queries in double: the visible rows' softmax-weighted values. The
 * bound on an f32 result, in units of eps = 2^-23 times the weighted magnitude sum |w_i v_i| / sum w_i:
 * each weight is off by the score's error (a lane's 8 fused products and 5 sums: 14 S, S the largest
 * sum of |q_d k_d| + |bias| of a row) plus its exponential's (a few), counted twice (the output and
 * its normaliser), plus the depth of the sums (8 + 4 log2 n), plus w_units for weights rounded
 * further (the flash kernel's f16 weights: 2^-11 of each, on |v - o| <= 2 max |v|: 8192). Weights
 * rounded to f16 also lose their relative precision below f16's least normal (2^-14): with
 * w_units, each is off by up to half the least subnormal (2^-25, a weight being at most 1 before
 * its tile's rescaling), which adds 2^-25 sum |v_i - exact| / L, bounded by 2^-25 (sum |v_i| +
 * n |exact|) / L, to the bound (what a row of tiny weights against one large one, a peaked softmax
 * over near-zero values, exceeded: 4.23 of the relative bound alone). Returns the largest
 * |got - exact| over that bound (1: at the bound). */
static double check_exact(const be_attn *a, const float *got, double w_units, int64_t *n_nan)
{
    const int D = a->head_dim, group = a->n_head / a->n_head_kv;
    double worst = 0;
    *n_nan = 0;
    double *acc = malloc(sizeof(double) * (size_t)D), *mag = malloc(sizeof(double) * (size_t)D);
    double *absv = malloc(sizeof(double) * (size_t)D);   /* sum |v_i| of the visible rows */
    for (int64_t t = 0; t < a->n_q; t++)
        for (int h = 0; h < a->n_head; h++) {
            const int g = h / group;
            const float *q = a->q + (t * a->n_head + h) * D;
            const int64_t p0 = a->head_pages ? a->head_pages[g] : 0, p1 = a->head_pages ? a->head_pages[g + 1] : a->n_pages;
            double M = -INFINITY, S = 0;
            int64_t n_vis = 0;
            for (int pass = 0; pass < 2; pass++) {
                double L = 0;
                for (int d = 0; d < D; d++) acc[d] = mag[d] = absv[d] = 0;
                for (int64_t ip = p0; ip < p1; ip++) {
                    const be_kv_page *pg = &a->pages[ip];
                    for (int32_t i = 0; i < pg->n; i++) {
                        const int32_t kp = pg->pos[i], qp = a->q_pos[t];
                        if (kp > qp || (a->window > 0 && qp - kp >= a->window)) continue;
                        if (pg->mask && !((pg->mask[i >> 6] >> (i & 63)) & 1u)) continue;
                        const uint16_t *kr = pg->k + (int64_t)i * pg->stride + (int64_t)g * pg->head_step;
                        const uint16_t *vr = pg->v + (int64_t)i * pg->stride + (int64_t)g * pg->head_step;
                        double s = 0, sa = 0;
                        for (int d = 0; d < D; d++) {
                            s += (double)q[d] * quant_fp16_to_f32(kr[d]);
                            sa += fabs((double)q[d] * quant_fp16_to_f32(kr[d]));
                        }
                        if (pg->bias) s += pg->bias[i], sa += fabs(pg->bias[i]);
                        if (pass == 0) {
                            if (s > M) M = s;
                            if (sa > S) S = sa;
                            n_vis++;
                            continue;
                        }
                        const double w = exp(s - M);
                        L += w;
                        for (int d = 0; d < D; d++) {
                            acc[d] += w * quant_fp16_to_f32(vr[d]);
                            mag[d] += w * fabs(quant_fp16_to_f32(vr[d]));
                            absv[d] += fabs(quant_fp16_to_f32(vr[d]));
                        }
                    }
                }
                if (pass == 0) continue;
                const float *o = got + (t * a->n_head + h) * D;
                for (int d = 0; d < D; d++) {
                    if (isnan(o[d])) {
                        (*n_nan)++;
                        continue;
                    }
                    const double exact = n_vis ? acc[d] / L : 0.0;
                    const double units = w_units + 2.0 * (14.0 * S + 4.0) + 8.0 + 4.0 * log2((double)n_vis + 1);
                    const double f16_floor =
                        w_units > 0 && n_vis ? ldexp(1.0, -25) * (absv[d] + (double)n_vis * fabs(exact)) / L : 0.0;
                    const double scale = n_vis ? ldexp(1.0, -23) * units * (mag[d] / L + 1e-30) + f16_floor : 1e-30;
                    const double e = fabs((double)o[d] - exact) / scale;
                    if (e > worst) worst = e;
                }
            }
        }
    free(acc);
    free(mag);
    free(absv);
    return worst;
}

static double max_rel(const float *a, const float *b, int64_t n)
{
    double worst = 0, scale = 1e-6;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > scale) scale = fabs(b[i]);
    }
    return worst / scale;
}

/* One kernel's simulation over a matrix of cases: head dimensions dims[], groups of 1 to 12 heads,
 * six variants (0 plain, 1 token masks, 2 bias and a window, 3 masks and bias, 4 rows of all heads
 * side by side, 5 a window and queries 8 times larger: peaked softmaxes), splits from splits[],
 * against exact attention (bound with w_units for rounded weights) and the CPU (within cpu_tol of
 * the largest output); the CPU itself within the f32 bound. Queries: 1..max_q; with chunk set, a
 * prefill chunk ending at the last key when the variant is even, else anywhere; else query 0 at
 * the last key, query 1 before every key (it must give 0), the rest anywhere. */
typedef void (*sim_fn)(const be_attn *a, int n_split, float *out);
typedef struct case_set {
    const char *what;
    sim_fn sim;
    const int *dims;
    int n_dims;
    const int *splits;   /* 5 */
    int max_q, chunk;
    double w_units, cpu_tol;
} case_set;

static void run_cases(const case_set *cs)
{
    seed_rng(cs->what);
    char err[256];
    be_backend *cpu = be_cpu_create(2, err, sizeof err);
    cr_assert(cpu, "%s", err);
    const int heads[][2] = { { 4, 1 }, { 8, 2 }, { 6, 3 }, { 12, 1 }, { 10, 2 }, { 3, 3 } };
    double worst_exact = 0, worst_cpu = 0, worst_cpu_exact = 0;
    int cases = 0;
    for (int di = 0; di < cs->n_dims; di++)
        for (size_t hi = 0; hi < sizeof heads / sizeof *heads; hi++)
            for (int variant = 0; variant < 6; variant++) {
                const int D = cs->dims[di], nh = heads[hi][0], nkv = heads[hi][1];
                const int side = variant == 4, with_mask = variant & 1, with_bias = (variant & 2) != 0;
                pageset ps;
                make_pageset(&ps, nkv, 1 + (int)(rnd() % 9), D, side, with_mask, with_bias, 64);
                const int64_t nq = cs->chunk || variant >= 3 ? 1 + (int64_t)(rnd() % (uint32_t)cs->max_q) : 1;
                const int32_t window = variant == 2 || variant == 5 ? 20 + (int32_t)(rnd() % 60) : 0;
                const size_t n_out = (size_t)(nq * nh * D);
                float *q = malloc(sizeof(float) * n_out), *o_sim = malloc(sizeof(float) * n_out);
                float *o_cpu = malloc(sizeof(float) * n_out);
                int32_t *qp = malloc(sizeof(int32_t) * (size_t)nq);
                for (size_t i = 0; i < n_out; i++) {
                    q[i] = frand(-0.5f, 0.5f) * (variant == 5 ? 8.0f : 1.0f);
                    o_sim[i] = NAN;
                }
                for (int64_t t = 0; t < nq; t++) {
                    const int32_t anywhere = (int32_t)(rnd() % (uint32_t)(ps.max_pos + 2));
                    if (cs->chunk) qp[t] = variant % 2 == 0 ? ps.max_pos - (int32_t)(nq - 1 - t) : anywhere;
                    else qp[t] = t == 0 ? ps.max_pos : t == 1 ? ps.min_pos - 1 : anywhere;
                }
                be_attn a = { .q = q, .n_q = nq, .q_pos = qp, .n_head = nh, .n_head_kv = nkv, .head_dim = D,
                              .pages = ps.pages, .n_pages = ps.n_pages, .head_pages = side ? NULL : ps.head_pages,
                              .window = window, .out = o_cpu };
                cpu->ops->attention(cpu, &a);
                const int ns = cs->splits[rnd() % 5];
                cs->sim(&a, ns, o_sim);
                int64_t n_nan = 0, n_nan_cpu = 0;
                const double ex = check_exact(&a, o_sim, cs->w_units, &n_nan);
                const double ex_cpu = check_exact(&a, o_cpu, 0.0, &n_nan_cpu);
                const double dc = max_rel(o_sim, o_cpu, (int64_t)n_out);
                cr_expect(n_nan == 0, "D %d, %d/%d heads, variant %d: %lld outputs NaN or not written", D, nh, nkv,
                          variant, (long long)n_nan);
                cr_expect(ex <= 1.0, "D %d, %d/%d heads, variant %d, %lld queries, %d splits: %.2f of the bound from "
                          "exact", D, nh, nkv, variant, (long long)nq, ns, ex);
                /* the CPU meets the f32 bound; a different reading of the pages (which rows a query
                 * sees, the bias, the heads' rows) would differ from it by far more than cpu_tol */
                cr_expect(ex_cpu <= 1.0, "the CPU backend is %.2f of the f32 bound from exact", ex_cpu);
                cr_expect(dc < cs->cpu_tol, "D %d, %d/%d heads, variant %d, %d splits: %.2e from the CPU", D, nh, nkv,
                          variant, ns, dc);
                if (!cs->chunk && nq > 1)
                    for (int h = 0; h < nh * D; h++)
                        cr_expect(o_sim[(size_t)nh * D + (size_t)h] == 0.0f, "a query that sees nothing gives 0");
                if (ex > worst_exact) worst_exact = ex;
                if (ex_cpu > worst_cpu_exact) worst_cpu_exact = ex_cpu;
                if (dc > worst_cpu) worst_cpu = dc;
                cases++;
                free(q);
                free(o_sim);
                free(o_cpu);
                free(qp);
                free_pageset(&ps);
            }
    cr_log_info("%s, %d cases: worst %.3f of the bound from exact (the CPU %.3f of f32's), %.2e from the CPU",
                cs->what, cases, worst_exact, worst_cpu_exact, worst_cpu);
    be_free(cpu);
}

Test(attn_group, the_simulated_kernel_equals_exact_attention_and_the_cpu, .timeout = 300)
{
    static const int dims[] = { 32, 64, 80, 96, 128, 256 }, splits[] = { 1, 2, 3, 7, 40 };
    const case_set cs = { "grouped attention", ag_attention_sim, dims, 6, splits, 7, 0, 0.0, 1e-4 };
    run_cases(&cs);
}

/* per full pages of 32 rows for each of n_kv heads, positions 0 .. 32 per - 1, random keys and
 * values in *kv (free it, *pos and the result); hp gets the per-head lists' offsets. */
static be_kv_page *full_pages(int n_kv, int64_t per, int D, uint16_t **kv, int32_t **pos, int64_t *hp)
{
    const int64_t n_pages = per * n_kv;
    be_kv_page *pages = calloc((size_t)n_pages, sizeof *pages);
    *kv = aligned_alloc(16, sizeof(uint16_t) * 2 * (size_t)(n_pages * 32 * D));
    *pos = malloc(sizeof(int32_t) * (size_t)(per * 32));
    cr_assert(pages && *kv && *pos);
    for (int64_t i = 0; i < 2 * n_pages * 32 * D; i++) (*kv)[i] = quant_f32_to_fp16(frand(-1, 1));
    for (int64_t i = 0; i < per * 32; i++) (*pos)[i] = (int32_t)i;
    for (int g = 0; g < n_kv; g++) {
        hp[g] = g * per;
        for (int64_t p = 0; p < per; p++) {
            uint16_t *k = *kv + (size_t)((g * per + p) * 32 * D);
            pages[g * per + p] = (be_kv_page){ .k = k, .v = k + (size_t)(n_pages * 32 * D), .pos = *pos + p * 32,
                                               .n = 32, .stride = D, .cap = 32 };
        }
    }
    hp[n_kv] = n_pages;
    return pages;
}

/* Long lists: 4096 rows a head in pages of 32 at the 7B and the default model's shapes, split as a
 * decode step on a large device splits them, against double precision. */
Test(attn_group, long_contexts_stay_within_the_f32_bound, .timeout = 300)
{
    seed_rng("long contexts");
    const int shapes[][3] = { { 32, 8, 128 }, { 4, 1, 256 } };
    for (int si = 0; si < 2; si++) {
        const int nh = shapes[si][0], nkv = shapes[si][1], D = shapes[si][2];
        const int64_t per = 128, n_pages = per * nkv;
        uint16_t *kv;
        int32_t *pos;
        int64_t hp[9];
        be_kv_page *pages = full_pages(nkv, per, D, &kv, &pos, hp);
        float *q = malloc(sizeof(float) * (size_t)(nh * D)), *o = malloc(sizeof(float) * (size_t)(nh * D));
        for (int i = 0; i < nh * D; i++) q[i] = frand(-0.6f, 0.6f);
        int32_t qp = (int32_t)(per * 32);
        be_attn a = { .q = q, .n_q = 1, .q_pos = &qp, .n_head = nh, .n_head_kv = nkv, .head_dim = D, .pages = pages,
                      .n_pages = n_pages, .head_pages = hp, .out = o };
        for (int ns = 1; ns <= 64; ns *= 8) {
            ag_attention_sim(&a, ns, o);
            int64_t n_nan = 0;
            const double ex = check_exact(&a, o, 0.0, &n_nan);
            cr_log_info("%d heads / %d KV of %d, 4096 rows, %d splits: %.3f of the f32 bound", nh, nkv, D, ns, ex);
            cr_expect(n_nan == 0 && ex <= 1.0, "%d splits: %.2f of the f32 bound from exact", ns, ex);
        }
        free(q);
        free(o);
        free(pages);
        free(kv);
        free(pos);
    }
}

/* A batch's calls joined into one launch (ag_lists: a list a query, each with its own split count,
 * the partials a common stride apart, blocks past a list's splits idle) give each call the bits it
 * gets alone: 2 to 8 calls with lists of their own lengths, masks and bias, at positions of their
 * own, split 1 to more times than they have pages. */
Test(attn_group, joined_calls_give_each_call_its_own_bits, .timeout = 120)
{
    seed_rng("joined");
    const int shapes[][3] = { { 4, 1, 64 }, { 8, 2, 32 }, { 6, 2, 80 }, { 12, 1, 16 } };
    for (int si = 0; si < 4; si++)
        for (int n = 2; n <= AG_MAX_LISTS; n += si % 2 ? 3 : 2) {
            const int nh = shapes[si][0], nkv = shapes[si][1], D = shapes[si][2], HD = nh * D;
            pageset ps[AG_MAX_LISTS];
            be_attn a[AG_MAX_LISTS];
            int splits[AG_MAX_LISTS];
            float *q = malloc(sizeof(float) * (size_t)(n * HD)), *joined = malloc(sizeof(float) * (size_t)(n * HD));
            float *alone = malloc(sizeof(float) * (size_t)HD);
            int32_t qp[AG_MAX_LISTS];
            cr_assert(q && joined && alone);
            for (int i = 0; i < n * HD; i++) q[i] = frand(-0.6f, 0.6f);
            for (int i = 0; i < n; i++) {
                make_pageset(&ps[i], nkv, 1 + (int)(rnd() % 6), D, 0, (int)(rnd() % 2), (int)(rnd() % 2), 64);
                const int32_t lo = ps[i].min_pos < ps[i].max_pos ? ps[i].min_pos : ps[i].max_pos;   /* no rows: none */
                qp[i] = ps[i].max_pos - (int32_t)(rnd() % 3) * (ps[i].max_pos - lo) / 3;
                splits[i] = 1 + (int)(rnd() % (uint64_t)(ps[i].n_pages / nkv + 2));
                a[i] = (be_attn){ .q = q + i * HD, .n_q = 1, .q_pos = &qp[i], .n_head = nh, .n_head_kv = nkv,
                                  .head_dim = D, .pages = ps[i].pages, .n_pages = ps[i].n_pages,
                                  .head_pages = ps[i].head_pages, .window = si == 2 ? 40 : 0, .out = joined + i * HD,
                                  .table = 100 + (uint64_t)i };
            }
            cr_assert(be_attn_seqs_joined(a, n), "%d calls laid out as one launch's are refused", n);
            ag_lists_sim(a, n, splits, AG_ROWS, joined);
            for (int i = 0; i < n; i++) {
                be_attn one = a[i];
                one.out = alone;
                ag_attention_sim(&one, splits[i], alone);
                cr_expect(!memcmp(alone, joined + i * HD, sizeof(float) * (size_t)HD),
                          "%d heads / %d KV of %d, call %d of %d (%d splits): joined, other bits than alone", nh, nkv,
                          D, i, n, splits[i]);
            }
            for (int i = 0; i < n; i++) free_pageset(&ps[i]);
            free(q);
            free(joined);
            free(alone);
        }
}

/* A slot's rows are fetched `rows` at a time (1 to AG_MAX_ROWS), and a block stages its pages
 * AG_PCHUNK at a time: neither may change a bit. Lists of up to 80 pages (a split of 1 crosses two
 * chunk boundaries) of 0 to 64 or 150 rows (rounds that end past a page's end, on some slots or
 * all; masks of up to 3 words),
 * masks, bias, windows, rows of all heads side by side, queries before a page (staged away) and
 * before every key; each result also within the f32 bound of exact attention. */
Test(attn_group, the_rows_a_round_and_the_staged_chunks_change_no_bit, .timeout = 120)
{
    seed_rng("rows a round");
    const int dims[] = { 16, 64, 80, 128, 256 }, rows[] = { 1, 2, 3, 8 };
    double worst = 0;
    for (int di = 0; di < 5; di++)
        for (int variant = 0; variant < 6; variant++) {
            const int D = dims[di], nkv = 1 + variant % 3, nh = nkv * (1 + (int)(rnd() % 5));
            const int side = variant == 4, per = variant < 2 ? 33 + (int)(rnd() % 48) : 1 + (int)(rnd() % 12);
            pageset ps;
            make_pageset(&ps, nkv, per, D, side, variant & 1, variant >= 2, variant % 2 ? 150 : 64);
            const int64_t nq = 3;
            const size_t n_out = (size_t)(nq * nh * D);
            float *q = malloc(sizeof(float) * n_out), *want = malloc(sizeof(float) * n_out);
            float *got = malloc(sizeof(float) * n_out);
            cr_assert(q && want && got);
            for (size_t i = 0; i < n_out; i++) q[i] = frand(-0.5f, 0.5f);
            int32_t qp[3] = { ps.max_pos, ps.min_pos + (ps.max_pos - ps.min_pos) / 3, ps.min_pos - 1 };
            be_attn a = { .q = q, .n_q = nq, .q_pos = qp, .n_head = nh, .n_head_kv = nkv, .head_dim = D,
                          .pages = ps.pages, .n_pages = ps.n_pages, .head_pages = side ? NULL : ps.head_pages,
                          .window = variant == 3 ? 50 : 0, .out = want };
            const int ns = variant == 0 ? 1 : 1 + (int)(rnd() % 4);
            ag_lists_sim(&a, 1, &ns, AG_ROWS, want);
            int64_t n_nan = 0;
            const double ex = check_exact(&a, want, 0.0, &n_nan);
            cr_expect(n_nan == 0 && ex <= 1.0, "D %d, variant %d, %d pages a list: %.2f of the bound from exact, %lld NaN",
                      D, variant, per, ex, (long long)n_nan);
            if (ex > worst) worst = ex;
            for (int r = 0; r < 4; r++) {
                for (size_t i = 0; i < n_out; i++) got[i] = NAN;
                ag_lists_sim(&a, 1, &ns, rows[r], got);
                size_t bad = 0;
                for (size_t i = 0; i < n_out; i++) bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
                cr_expect(bad == 0, "D %d, variant %d, %d pages a list, %d splits: %d rows a round, %zu of %zu outputs "
                          "differ from %d rows'", D, variant, per, ns, rows[r], bad, n_out, AG_ROWS);
            }
            for (int h = 0; h < nh * D; h++)
                cr_expect(want[(size_t)(2 * nh * D + h)] == 0.0f, "a query before every key gives 0");
            free(q);
            free(want);
            free(got);
            free_pageset(&ps);
        }
    cr_log_info("rows a round: worst %.3f of the bound from exact", worst);
}

/* Calls not laid out as one launch's are refused (each then launches alone). */
Test(attn_group, calls_not_laid_out_as_one_launch_are_not_joined)
{
    enum { N = 3, H = 4, KV = 2, D = 8, HD = H * D, KVD = KV * D };
    float q[N * HD], out[N * HD], k[N * KVD], v[N * KVD];
    int32_t pos[N] = { 5, 9, 7 };
    int64_t hp[KV + 1] = { 0, 0, 0 };
    be_attn a[N], b[N];
    for (int i = 0; i < N; i++)
        a[i] = (be_attn){ .q = q + i * HD, .n_q = 1, .q_pos = pos + i, .n_head = H, .n_head_kv = KV, .head_dim = D,
                          .head_pages = hp, .out = out + i * HD, .cur_k = k + i * KVD, .cur_v = v + i * KVD,
                          .cur_pos = pos + i, .n_cur = 1, .table = 7 + (uint64_t)i };
    cr_assert(be_attn_seqs_joined(a, N));
    cr_expect(!be_attn_seqs_joined(a, 1), "one call is no join");
    be_attn many[BE_ATTN_SEQS_MAX + 1];
    for (int i = 0; i <= BE_ATTN_SEQS_MAX; i++) many[i] = a[0], many[i].table = (uint64_t)i;
    cr_expect(!be_attn_seqs_joined(many, BE_ATTN_SEQS_MAX + 1), "more calls than a launch takes");
    static const char *const bad[] = {
        "two queries",        "another window",    "its query elsewhere", "its output elsewhere",
        "its position elsewhere", "no rows of its own", "two rows of its own", "its keys elsewhere",
        "no per-head lists",  "other heads",       "another call's list name", "its values elsewhere",
        "its rows' position elsewhere", "another head dimension", "other KV heads",
    };
    for (size_t e = 0; e < sizeof bad / sizeof *bad; e++) {
        memcpy(b, a, sizeof b);
        be_attn *c = &b[1];
        switch (e) {
        case 0: c->n_q = 2; break;
        case 1: c->window = 16; break;
        case 2: c->q = q; break;
        case 3: c->out = out + 2 * HD; break;
        case 4: c->q_pos = pos; break;
        case 5: c->n_cur = 0; break;
        case 6: c->n_cur = 2; break;
        case 7: c->cur_k = k; break;
        case 8: c->head_pages = NULL; break;
        case 9: c->n_head = 8; break;
        case 10: c->table = b[0].table; break;
        case 11: c->cur_v = v; break;
        case 12: c->cur_pos = pos; break;
        case 13: c->head_dim = 16; break;
        case 14: c->n_head_kv = 1; break;
        }
        cr_expect(!be_attn_seqs_joined(b, N), "a call with %s was joined", bad[e]);
    }
    for (int i = 0; i < N; i++) b[i] = a[i], b[i].n_cur = 0;   /* none with rows: joined */
    cr_expect(be_attn_seqs_joined(b, N), "calls without rows of their own are refused");
}

/* A call's splits fill the device in one wave: never more blocks than it holds at once (a few
 * blocks past a wave cost a whole wave's time), and no room left for another split; at least one
 * split, at most one a page. The 7B shape on an H200 (8 KV heads, 3 blocks on each of 132
 * multiprocessors) gets 49 splits, 392 blocks; rounded up it got 50, 400 (at 64K and more, 4 of
 * them with pages after the 396 the device holds). */
Test(attn_group, a_calls_splits_fill_the_device_in_one_wave)
{
    cr_expect_eq(ag_call_splits(3, 132, 8, 1024), 49);
    cr_expect_eq(ag_call_splits(3, 132, 1, 256), 256);   /* the default model's one KV head at 8K */
    cr_expect_eq(ag_call_splits(3, 132, 1, 0), 1);
    cr_expect_eq(ag_call_splits(2, 132, 600, 64), 1);   /* more blocks than a wave: one split */
    const int sms[] = { 1, 8, 84, 108, 114, 132 };
    const int64_t mosts[] = { 0, 1, 5, 64, 1024 };
    int bad = 0;
    for (size_t si = 0; si < sizeof sms / sizeof *sms; si++)
        for (int per_sm = 1; per_sm <= 4; per_sm++)
            for (int64_t blocks = 1; blocks <= 700; blocks++)
                for (size_t mi = 0; mi < sizeof mosts / sizeof *mosts; mi++) {
                    const int64_t most = mosts[mi], held = (int64_t)per_sm * sms[si];
                    const int n = ag_call_splits(per_sm, sms[si], blocks, most);
                    const int64_t top = most > 0 ? most : 1;
                    int ok = n >= 1 && n <= top;
                    if (blocks <= held) ok = ok && n * blocks <= held && (n == top || (n + 1) * blocks > held);
                    else ok = ok && n == 1;
                    if (!ok && bad++ < 5)
                        cr_log_error("%d a multiprocessor, %d of them, %lld blocks a split, at most %lld: %d splits",
                                     per_sm, sms[si], (long long)blocks, (long long)most, n);
                }
    cr_expect_eq(bad, 0, "%d split counts out of one wave", bad);
}

/* A NaN in one head's query gives that head NaN (not a plausible 0 or a finite average) and leaves
 * the other heads alone; as the CPU. */
Test(attn_group, a_nan_query_stays_nan)
{
    seed_rng("nan");
    pageset ps;
    make_pageset(&ps, 1, 4, 64, 0, 0, 0, 64);
    float q[4 * 64], o[4 * 64];
    for (int i = 0; i < 4 * 64; i++) q[i] = frand(-0.5f, 0.5f);
    q[64 + 3] = NAN;
    int32_t qp = ps.max_pos;
    be_attn a = { .q = q, .n_q = 1, .q_pos = &qp, .n_head = 4, .n_head_kv = 1, .head_dim = 64, .pages = ps.pages,
                  .n_pages = ps.n_pages, .head_pages = ps.head_pages, .out = o };
    for (int ns = 1; ns <= 3; ns++) {
        ag_attention_sim(&a, ns, o);
        for (int d = 0; d < 64; d++) {
            cr_expect(isnan(o[64 + d]), "%d splits: head 1's output %d is %g", ns, d, (double)o[64 + d]);
            cr_expect(!isnan(o[d]) && !isnan(o[128 + d]) && !isnan(o[192 + d]), "%d splits: NaN spread", ns);
        }
    }
    free_pageset(&ps);
}

/* The combine kernel's way (ag_combine_tiled: the largest maximum by a tree over the block's
 * threads, each split's weight side by side, the sums in split order with AG_CLOADS loads in flight)
 * gives ag_combine_one's bits: split counts around a tile (1 to 2.3 tiles) and a load batch, blocks
 * of 1 to 256 threads, head sizes of 37 to 256, splits that saw nothing (-inf), NaN in a maximum,
 * a sum or an output, and maxima hundreds apart (weights that underflow). */
Test(attn_group, the_tiled_combine_gives_the_serial_merges_bits)
{
    seed_rng("tiled combine");
    const int splits[] = { 1, 2, 7, 8, 9, 63, 255, 256, 257, 600 }, threads[] = { 1, 37, 64, 256 }, dims[] = { 37, 128, 256 };
    enum { ROWS = 3, STRIDE = 640 };
    float *po = malloc(sizeof(float) * ROWS * STRIDE * 256), *pml = malloc(sizeof(float) * ROWS * STRIDE * 2);
    cr_assert(po && pml);
    long checked = 0, nan_seen = 0, zero_seen = 0;
    for (size_t si = 0; si < sizeof splits / sizeof *splits; si++)
        for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
            for (int kind = 0; kind < 4; kind++) {
                const int ns = splits[si], D = dims[di];
                for (int64_t i = 0; i < (int64_t)ROWS * STRIDE; i++) {
                    const float spread = kind == 2 ? 300.0f : 8.0f;
                    pml[i * 2] = frand(-spread, spread);
                    pml[i * 2 + 1] = frand(0.5f, 40.0f);
                    if (rnd() % 5 == 0) pml[i * 2] = -INFINITY;   /* a split that saw nothing */
                    for (int d = 0; d < D; d++) po[i * D + d] = frand(-20.0f, 20.0f);
                }
                if (kind == 1) {   /* NaN in a maximum, a sum, an output */
                    pml[(0 * STRIDE + (int)(rnd() % (unsigned)ns)) * 2] = NAN;
                    pml[(1 * STRIDE + (int)(rnd() % (unsigned)ns)) * 2 + 1] = NAN;
                    po[(2 * STRIDE + (int)(rnd() % (unsigned)ns)) * D + 5] = NAN;
                }
                if (kind == 3)   /* row 1 saw nothing at all */
                    for (int z = 0; z < ns; z++) pml[(STRIDE + z) * 2] = -INFINITY;
                for (int r = 0; r < ROWS; r++)
                    for (int d = 0; d < D; d++) {
                        const float want = ag_combine_one(po, pml, r, STRIDE, ns, D, d);
                        for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
                            const float got = ag_combine_tiled(po, pml, r, STRIDE, ns, D, d, threads[ti]);
                            cr_assert(!memcmp(&got, &want, sizeof got),
                                      "%d splits, D %d, kind %d, row %d, element %d, %d threads: %a, serially %a", ns,
                                      D, kind, r, d, threads[ti], (double)got, (double)want);
                            checked++;
                        }
                        nan_seen += isnan(want);
                        zero_seen += want == 0.0f;
                    }
            }
    cr_expect(nan_seen > 0 && zero_seen > 0, "NaN %ld and nothing-seen %ld cases", nan_seen, zero_seen);
    cr_log_info("the tiled combine: %ld elements, each the serial merge's bits", checked);
    free(po);
    free(pml);
}

/* The flash kernel's simulation (every warp's lanes, the products emulated from the fragment
 * layout; head dimension 192 leaves its second warp's dimensions part-filled) against exact
 * attention (its f16 weights: 8192 units) and the CPU: prefill-like chunks (the chunk's own keys in
 * the pages, queries at their positions) and queries anywhere, up to 70 (row tiles part empty). */
Test(attn_flash, the_simulated_flash_kernel_equals_exact_attention_and_the_cpu, .timeout = 300)
{
    static const int dims[] = { 16, 64, 80, 128, 192, 256 }, splits[] = { 1, 1, 2, 5, 40 };
    const case_set cs = { "flash attention", af_attention_sim, dims, 6, splits, 70, 1, 8192.0, 2e-3 };
    run_cases(&cs);
}

/* A prefill chunk at the 7B and the default model's shapes over a longer context (pages of 32),
 * against exact attention: 48 queries ending at position 1023. */
Test(attn_flash, a_chunk_over_a_longer_context_stays_within_the_bound, .timeout = 300)
{
    seed_rng("flash, longer");
    const int shapes[][3] = { { 8, 2, 128 }, { 4, 1, 256 } };
    for (int si = 0; si < 2; si++) {
        const int nh = shapes[si][0], nkv = shapes[si][1], D = shapes[si][2];
        const int64_t per = 32, n_pages = per * nkv, nq = 48;
        uint16_t *kv;
        int32_t *pos;
        int64_t hp[9];
        be_kv_page *pages = full_pages(nkv, per, D, &kv, &pos, hp);
        float *q = malloc(sizeof(float) * (size_t)(nq * nh * D)), *o = malloc(sizeof(float) * (size_t)(nq * nh * D));
        int32_t qp[48];
        for (int64_t i = 0; i < nq * nh * D; i++) q[i] = frand(-0.6f, 0.6f);
        for (int t = 0; t < 48; t++) qp[t] = (int32_t)(per * 32 - 48 + t);
        be_attn a = { .q = q, .n_q = nq, .q_pos = qp, .n_head = nh, .n_head_kv = nkv, .head_dim = D, .pages = pages,
                      .n_pages = n_pages, .head_pages = hp, .out = o };
        for (int ns = 1; ns <= 9; ns += 8) {
            af_attention_sim(&a, ns, o);
            int64_t n_nan = 0;
            const double ex = check_exact(&a, o, 8192.0, &n_nan);
            cr_log_info("%d heads / %d KV of %d, 48 queries over 1024 rows, %d splits: %.3f of the bound", nh, nkv, D,
                        ns, ex);
            cr_expect(n_nan == 0 && ex <= 1.0, "%d splits: %.2f of the bound from exact", ns, ex);
        }
        free(q);
        free(o);
        free(pages);
        free(kv);
        free(pos);
    }
}

Test(attn_flash, a_nan_query_stays_nan_and_rows_that_see_nothing_give_zero)
{
    seed_rng("flash nan");
    pageset ps;
    make_pageset(&ps, 1, 4, 64, 0, 0, 0, 64);
    enum { NQ = 20 };
    float q[NQ * 4 * 64], o[NQ * 4 * 64];
    int32_t qp[NQ];
    for (int i = 0; i < NQ * 4 * 64; i++) q[i] = frand(-0.5f, 0.5f);
    for (int t = 0; t < NQ; t++) qp[t] = t == 5 ? ps.min_pos - 1 : ps.max_pos;
    q[(3 * 4 + 1) * 64 + 7] = NAN;   /* query 3, head 1 */
    be_attn a = { .q = q, .n_q = NQ, .q_pos = qp, .n_head = 4, .n_head_kv = 1, .head_dim = 64, .pages = ps.pages,
                  .n_pages = ps.n_pages, .head_pages = ps.head_pages, .out = o };
    static const int splits[] = { 1, 2, 3, 40 };   /* the partials must carry the NaN through the merge */
    for (int si = 0; si < 4; si++) {
        af_attention_sim(&a, splits[si], o);
        for (int t = 0; t < NQ; t++)
            for (int h = 0; h < 4; h++)
                for (int d = 0; d < 64; d++) {
                    const float v = o[(t * 4 + h) * 64 + d];
                    if (t == 3 && h == 1)
                        cr_expect(isnan(v), "%d splits: query 3 head 1 output %d is %g", splits[si], d, (double)v);
                    else if (t == 5) cr_expect(v == 0.0f, "%d splits: a row that sees nothing: %g", splits[si], (double)v);
                    else cr_expect(!isnan(v), "%d splits: NaN spread to query %d head %d", splits[si], t, h);
                }
    }
    free_pageset(&ps);
}
