/* Chelsea's soft matching (engine/policy/chelsea.c): the similarity search, the backend op
 * soft_links (kernels/cpu/soft_links.c: norms once, pairs in the vector lanes, blocks on the
 * threads), gives the floats of the plain formula, one pair at a time with its norms: through
 * chelsea_head_similarity, which ranks heads by the very links the merge keeps, and directly, on
 * every instruction set, with and without threads. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant.h"
#include "engine/kvcache.h"
#include "engine/policy/chelsea.h"
#include "kernels/backend.h"
#include "kernels/cpu/vec_dot.h"
#include "tests/fwd_fixture.h"

static float plain_cosine(const float *x, const float *y, int64_t D)
{
    double d = 0, nx = 0, ny = 0;
    for (int64_t i = 0; i < D; i++) {
        d += (double)x[i] * y[i];
        nx += (double)x[i] * x[i];
        ny += (double)y[i] * y[i];
    }
    return nx > 0 && ny > 0 ? (float)(d / sqrt(nx * ny)) : 0.0f;
}

/* The mean over A tokens of the best B similarity in each chunk, as chelsea.h defines it. */
static double plain_similarity(const kv_cache *kv, int il, int g, int chunk)
{
    int64_t D = kv_head_dim(kv), T = kv_head_tokens(kv, il, g), j = 0;
    float *k = malloc(sizeof(float) * (size_t)(T * D));
    cr_assert(k);
    for (int i = 0; i < kv_n_pages(kv, il, g); i++) {
        const kv_page *p = kv_layer_page(kv, il, g, i);
        for (int32_t t = 0; t < p->n; t++, j++)
            for (int64_t d = 0; d < D; d++) k[j * D + d] = quant_fp16_to_f32(p->k[(size_t)t * (size_t)D + (size_t)d]);
    }
    double sum = 0;
    int64_t n = 0;
    for (int64_t c0 = 0; c0 < T; c0 += chunk) {
        int64_t c1 = c0 + chunk < T ? c0 + chunk : T;
        for (int64_t a = c0; a < c1; a += 2) {
            float bs = -2;
            for (int64_t b = c0 + 1; b < c1; b += 2) {
                float sim = plain_cosine(k + a * D, k + b * D, D);
                if (sim > bs) bs = sim;
            }
            if (bs > -2) {
                sum += bs;
                n++;
            }
        }
    }
    free(k);
    return n ? sum / (double)n : -1;
}

Test(chelsea, the_similarity_search_gives_the_plain_formulas_floats)
{
    char err[256];
    static const int dims[] = { 1, 3, 64, 129 };
    static const int chunks[] = { 2, 3, 7, 8, 9, 16, 17, 256 };
    uint64_t r = 4242;
    int compared = 0;
    for (int di = 0; di < 4; di++) {
        kv_cache *kv = kv_create(1, 2048, 2, dims[di], 16, NULL, err, sizeof err);
        cr_assert(kv, "%s", err);
        fwd_fixture_wide_keys(kv, 1, 300 + di * 7, &r);   /* sums that round: the order shows */
        for (int ci = 0; ci < 8; ci++)
            for (int g = 0; g < 2; g++) {
                double got = 0, want = plain_similarity(kv, 0, g, chunks[ci]);
                cr_assert(chelsea_head_similarity(NULL, kv, 0, g, chunks[ci], &got) == 0);
                cr_assert(got == want, "head dimension %d, chunks of %d, head %d: %.17g, the plain formula %.17g",
                          dims[di], chunks[ci], g, got, want);
                compared++;
            }
        kv_free(kv);
    }
    cr_assert_eq(compared, 64);
}

/* ------------------------------------------------------------------ the op (be_links) */

/* Values whose sums round (a spread of exponents), as f16 keys widened would be and merged ones are not. */
static float wide_value(uint64_t *r)
{
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    float m = (float)((*r >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
    return ldexpf(m * 1.37f, (int)((*r >> 20) % 13) - 6);
}

/* be_links as backend.h defines it, a pair at a time. */
static void plain_links(const be_links *l, int64_t *best, float *sim)
{
    for (int64_t c0 = l->m0; c0 < l->m1; c0 += l->chunk) {
        int64_t c1 = c0 + l->chunk < l->m1 ? c0 + l->chunk : l->m1;
        for (int64_t a = c0; a < c1; a += 2) {
            float bs = -2;
            int64_t bb = -1;
            for (int64_t b = c0 + 1; b < c1; b += 2) {
                float s = plain_cosine(l->k + a * l->dim, l->k + b * l->dim, l->dim);
                if (s > bs) {
                    bs = s;
                    bb = b;
                }
            }
            best[a - l->m0] = bb;
            sim[a - l->m0] = bs;
        }
    }
}

/* The op's links against the plain ones, entry by entry (the cosines bit for bit), and the B rows'
 * entries left as they were. Returns the A rows compared. */
static int64_t check_links(be_backend *b, const be_links *shape, const char *what)
{
    const int64_t n = shape->m1 - shape->m0;
    int64_t *best = malloc(sizeof(int64_t) * (size_t)(n + 1)), *want = malloc(sizeof(int64_t) * (size_t)(n + 1));
    float *sim = malloc(sizeof(float) * (size_t)(n + 1)), *want_sim = malloc(sizeof(float) * (size_t)(n + 1));
    cr_assert(best && want && sim && want_sim);
    for (int64_t i = 0; i < n; i++) {
        best[i] = want[i] = -77;
        sim[i] = want_sim[i] = 77.0f;
    }
    be_links l = *shape;
    l.best = best;
    l.sim = sim;
    be_soft_links(b, &l);
    plain_links(shape, want, want_sim);
    int64_t a_rows = 0;
    for (int64_t i = 0; i < n; i++) {
        cr_assert(best[i] == want[i] && memcmp(&sim[i], &want_sim[i], sizeof(float)) == 0,
                  "%s, dimension %lld, rows [%lld, %lld), chunks of %lld: row %lld linked to %lld (%.9g), the plain "
                  "formula's %lld (%.9g)", what, (long long)shape->dim, (long long)shape->m0, (long long)shape->m1,
                  (long long)shape->chunk, (long long)(i + shape->m0), (long long)best[i], (double)sim[i],
                  (long long)want[i], (double)want_sim[i]);
        a_rows += want[i] != -77;
    }
    free(best);
    free(want);
    free(sim);
    free(want_sim);
    return a_rows;
}

Test(soft_links, the_op_gives_the_plain_formulas_links_on_every_instruction_set_and_thread_count)
{
    static const int64_t dims[] = { 1, 3, 8, 17, 64, 129, 256, 1024 };
    static const int64_t chunks[] = { 1, 2, 3, 7, 64, 129, 256, 1000 };
    char err[256];
    be_backend *two = be_cpu_create(2, err, sizeof err), *three = be_cpu_create(3, err, sizeof err);
    cr_assert(two && three, "%s", err);
    be_backend *backends[] = { NULL, two, three };
    const vd_isa was = vd_isa_active();
    uint64_t r = 99;
    int64_t compared = 0;
    for (int di = 0; di < 8; di++) {
        const int64_t D = dims[di], T = D >= 256 ? 420 : 700;
        float *k = malloc(sizeof(float) * (size_t)(T * D));
        cr_assert(k);
        for (int64_t i = 0; i < T * D; i++) k[i] = wide_value(&r);
        for (int64_t i = 0; i < D; i++) {   /* ties (a B row twice), a zero row, a row far from the rest */
            k[41 * D + i] = k[43 * D + i];
            k[50 * D + i] = 0.0f;
            k[61 * D + i] = i % 2 ? 1e30f : -1e-30f;
        }
        /* rows whose norms are NaN or infinite, in A and in B (a NaN norm's cosine is 0, which
         * beats negative ones; an infinite one gives NaN or 0) */
        k[72 * D] = NAN;
        k[73 * D + D - 1] = NAN;
        k[84 * D] = INFINITY;
        k[87 * D + D / 2] = -INFINITY;
        for (int64_t i = 0; i < D; i++) k[95 * D + i] = i % 3 ? INFINITY : -INFINITY;
        for (int ci = 0; ci < 8; ci++)
            for (int isa = VD_ISA_SCALAR; isa < VD_ISA_COUNT; isa++) {
                if (!vd_isa_supported((vd_isa)isa)) continue;
                cr_assert(vd_set_isa((vd_isa)isa, err, sizeof err) == 0, "%s", err);
                for (int bi = 0; bi < 3; bi++) {
                    char what[96];
                    snprintf(what, sizeof what, "%s, %s", vd_isa_name((vd_isa)isa),
                             bi == 0 ? "the calling thread" : bi == 1 ? "2 threads" : "3 threads");
                    be_links whole = { k, D, 0, T, chunks[ci], NULL, NULL };
                    be_links part = { k, D, 5, T - 9, chunks[ci], NULL, NULL };   /* sinks and recent rows aside */
                    compared += check_links(backends[bi], &whole, what) + check_links(backends[bi], &part, what);
                }
            }
        free(k);
    }
    cr_assert(vd_set_isa(was, err, sizeof err) == 0, "%s", err);
    be_free(two);
    be_free(three);
    cr_assert(compared > 100000, "%lld A rows compared", (long long)compared);
}

Test(soft_links, the_cosines_in_the_lanes_are_the_scalar_formulas_for_every_special_value)
{
    static const double vals[] = { 0.0, -0.0, 1.0, 2.5e-310, 1e300, INFINITY, -INFINITY, NAN, 3.0, -7.25, 1e-30 };
    enum { NV = sizeof vals / sizeof vals[0], N = 37 };
    char err[256];
    const vd_isa was = vd_isa_active();
    uint64_t r = 5;
    int compared = 0;
    for (int isa = VD_ISA_SCALAR; isa < VD_ISA_COUNT; isa++) {
        if (!vd_isa_supported((vd_isa)isa)) continue;
        cr_assert(vd_set_isa((vd_isa)isa, err, sizeof err) == 0, "%s", err);
        for (int ia = 0; ia < NV; ia++)
            for (int n = 0; n <= N; n += n < 10 ? 1 : 9) {
                double d[N], nb[N];
                float got[N + 1];
                for (int p = 0; p < n; p++) {
                    r = r * 6364136223846793005ull + 1442695040888963407ull;
                    d[p] = vals[(r >> 33) % NV] * ((r >> 20) & 1 ? -1 : 1);
                    nb[p] = vals[(r >> 40) % NV];
                }
                got[n] = 42.0f;
                vd_cosines_f64(n, d, vals[ia], nb, got);
                cr_assert(got[n] == 42.0f, "%s wrote past %d", vd_isa_name((vd_isa)isa), n);
                for (int p = 0; p < n; p++) {
                    float want = vals[ia] > 0 && nb[p] > 0 ? (float)(d[p] / sqrt(vals[ia] * nb[p])) : 0.0f;
                    cr_assert(memcmp(&got[p], &want, sizeof want) == 0 || (isnan(got[p]) && isnan(want)),
                              "%s: d %g, na %g, nb %g: %.9g, the formula %.9g", vd_isa_name((vd_isa)isa), d[p],
                              vals[ia], nb[p], (double)got[p], (double)want);
                    compared++;
                }
            }
    }
    cr_assert(vd_set_isa(was, err, sizeof err) == 0, "%s", err);
    cr_assert_gt(compared, 1000);
}

Test(soft_links, the_rows_widened_and_transposed_are_the_plain_loops_on_every_instruction_set)
{
    enum { LD = 41 };
    float x[24 * LD];
    double out[24 * LD + 1], norms[25];
    char err[256];
    uint64_t r = 11;
    for (int i = 0; i < 24 * LD; i++) x[i] = wide_value(&r);
    x[3 * LD + 5] = NAN;
    x[9 * LD + 16] = INFINITY;
    const vd_isa was = vd_isa_active();
    int compared = 0;
    for (int isa = VD_ISA_SCALAR; isa < VD_ISA_COUNT; isa++) {
        if (!vd_isa_supported((vd_isa)isa)) continue;
        cr_assert(vd_set_isa((vd_isa)isa, err, sizeof err) == 0, "%s", err);
        for (int rows = 1; rows <= 24; rows++)
            for (int n = 1; n <= LD; n += n < 18 ? 1 : 7) {
                out[rows * n] = 42.0;
                norms[rows] = 42.0;
                vd_widen_transpose(rows, n, x, LD, out, norms);
                cr_assert(out[rows * n] == 42.0 && norms[rows] == 42.0, "%s wrote past the rows", vd_isa_name((vd_isa)isa));
                for (int p = 0; p < rows; p++) {
                    double want = 0;
                    for (int i = 0; i < n; i++) {
                        const double v = (double)x[p * LD + i];
                        cr_assert(memcmp(&out[i * rows + p], &v, sizeof v) == 0 || (isnan(v) && isnan(out[i * rows + p])),
                                  "%s, %d rows of %d: row %d element %d", vd_isa_name((vd_isa)isa), rows, n, p, i);
                        want += v * v;
                    }
                    cr_assert(memcmp(&norms[p], &want, sizeof want) == 0 || (isnan(want) && isnan(norms[p])),
                              "%s, %d rows of %d: row %d's norm %.17g, the plain loop's %.17g", vd_isa_name((vd_isa)isa),
                              rows, n, p, norms[p], want);
                    compared++;
                }
            }
    }
    cr_assert(vd_set_isa(was, err, sizeof err) == 0, "%s", err);
    cr_assert_gt(compared, 1000);
}

Test(soft_links, ties_go_to_the_first_b_row_and_a_zero_or_unmatched_row_gets_what_the_formula_gives)
{
    enum { D = 4, T = 9 };
    /* A rows 0, 2, 4, 6, 8 of one chunk; B rows 1, 3, 5, 7: 3 and 7 the same key, 5 zero */
    float k[T * D] = {
        1, 2, 3, 4,   9, 9, 9, -9,   1, 0, 0, 0,   1, 2, 3, 4.5f,   0, 0, 0, 0,
        0, 0, 0, 0,   -1, -2, -3, -4, 1, 2, 3, 4.5f, 5, 5, 5, 5,
    };
    int64_t best[T];
    float sim[T];
    be_links l = { k, D, 0, T, 16, best, sim };
    be_soft_links(NULL, &l);
    cr_assert_eq(best[0], 3, "row 0 links %lld: 3 and 7 are the same key, the first wins", (long long)best[0]);
    cr_assert_eq(best[4], 1, "the zero row: every cosine 0, the first B row (%lld)", (long long)best[4]);
    cr_assert(sim[4] == 0.0f);
    cr_assert_eq(best[6], 5, "row 6, the negated row 0: the zero row's cosine 0 beats the negative ones (%lld)",
                 (long long)best[6]);
    cr_assert_eq(best[2], 1);
    cr_assert_eq(best[8], 3);
    /* a chunk of one row has no B row */
    be_links one = { k, D, 0, T, 1, best, sim };
    be_soft_links(NULL, &one);
    for (int i = 0; i < T; i++) cr_assert(best[i] == -1 && sim[i] == -2.0f, "row %d: %lld", i, (long long)best[i]);
}

/* ------------------------------------------------------------------ the merge (be_merge) */

#include "kernels/merge_kernels.h"

/* The CUDA backend's merge (kernels/cuda/merge_heads.cu) with each launch's threads run one after
 * another on the host: every step of a pass reads what the step before wrote and no thread of a
 * step reads what another thread of it writes, so the order of its threads does not matter. */
typedef struct emu {
    const float *sk, *sv, *sdeg;
    const int32_t *spos;
    float *wk[2], *wv[2], *wdeg[2];
    int32_t *wpos[2];
    double *nrm;
    int64_t *la, *lb, *order;
    float *ls;
    unsigned char *gone;
    int32_t *idx;
    float *sims;             /* sized by the plan's dry run (mg_need), kept from pass to pass */
    int64_t D;
    int cur, flag, passes;
    int reverse;             /* each launch's threads last to first */
} emu;

/* Thread x of a launch of n, in the emulation's order. */
static int64_t emu_at(const emu *e, int64_t n, int64_t x) { return e->reverse ? n - 1 - x : x; }

static int emu_append(void *ctx, int64_t held, int64_t next, int64_t n)
{
    emu *e = ctx;
    const int c = e->cur;
    for (int64_t y = 0; y < n * e->D; y++) {   /* mg_append_kernel's threads */
        const int64_t x = emu_at(e, n * e->D, y), t = x / e->D, d = x % e->D;
        e->wk[c][(held + t) * e->D + d] = e->sk[(next + t) * e->D + d];
        e->wv[c][(held + t) * e->D + d] = e->sv[(next + t) * e->D + d];
        if (d == 0) {
            e->wdeg[c][held + t] = e->sdeg[next + t];
            e->wpos[c][held + t] = e->spos[next + t];
        }
    }
    return 0;
}

static int emu_pass(void *ctx, const mg_pass *p)
{
    emu *e = ctx;
    const int c = e->cur;
    const int64_t D = e->D;
    for (int64_t y = 0; y < p->m1 - p->m0; y++) {
        const int64_t t = p->m0 + emu_at(e, p->m1 - p->m0, y);
        e->nrm[t] = mg_norm(e->wk[c] + t * D, D);
    }
    for (int64_t y = 0; y < p->slots * p->per; y++) {
        const int64_t x = emu_at(e, p->slots * p->per, y);
        mg_pair_sim(p, e->wk[c], e->nrm, D, x / p->per, x % p->per, e->sims);
    }
    for (int64_t y = 0; y < p->slots; y++) {
        const int64_t j = emu_at(e, p->slots, y);
        mg_slot_pick(p, e->sims, j, e->la, e->lb, e->ls);
        e->order[j] = -1;
    }
    for (int64_t y = 0; y < p->slots; y++) {
        const int64_t i = emu_at(e, p->slots, y), rank = mg_slot_rank(p, e->la, e->lb, e->ls, i);
        if (rank >= 0 && rank < p->r) {
            e->order[rank] = i;
            e->gone[e->la[i]] = 1;
        }
    }
    if (mg_count_links(p, e->lb) != p->links) e->flag = 1;
    for (int64_t y = 0; y < p->slots; y++)
        mg_slot_merge(p, e->wk[c], e->wv[c], e->wdeg[c], D, e->la, e->lb, e->order, emu_at(e, p->slots, y));
    /* mg_compact_kernel's block: each of EMU_SCAN threads counts a run of rows, the counts are
     * scanned, each run indexed from its first */
    enum { EMU_SCAN = 1024 };
    static int32_t cnt[EMU_SCAN];
    const int64_t run = (p->T + EMU_SCAN - 1) / EMU_SCAN;
    int64_t kept = 0;
    for (int y = 0; y < EMU_SCAN; y++) {
        const int tid = (int)emu_at(e, EMU_SCAN, y);
        const int64_t t0 = tid * run < p->T ? tid * run : p->T, t1 = t0 + run < p->T ? t0 + run : p->T;
        cnt[tid] = (int32_t)mg_compact(e->gone, t0, t1, 0, NULL);
    }
    for (int tid = 0; tid < EMU_SCAN; tid++) {
        const int64_t t0 = tid * run < p->T ? tid * run : p->T, t1 = t0 + run < p->T ? t0 + run : p->T;
        mg_compact(e->gone, t0, t1, kept, e->idx);
        kept += cnt[tid];
    }
    if (kept != p->T - p->r)   /* fewer links than planned: flagged */
        cr_assert(e->flag, "a pass kept another count than planned and nothing was flagged");
    for (int64_t y = 0; y < p->T * D; y++) {   /* mg_scatter_kernel's threads */
        const int64_t x = emu_at(e, p->T * D, y), t = x / D, d = x % D, o = e->idx[t];
        if (o >= 0) {
            e->wk[c ^ 1][o * D + d] = e->wk[c][t * D + d];
            e->wv[c ^ 1][o * D + d] = e->wv[c][t * D + d];
            if (d == 0) {
                e->wdeg[c ^ 1][o] = e->wdeg[c][t];
                e->wpos[c ^ 1][o] = e->wpos[c][t];
            }
        }
        if (d == 0) e->gone[t] = 0;
    }
    e->cur = c ^ 1;
    e->passes++;
    return 0;
}

/* One head of T0 rows merged by the emulated device and by the CPU backend: the same rows, bit for
 * bit, unless the device flagged a pass (then the CUDA backend gives the CPU's). Returns the passes. */
static int emu_compare(be_backend *b, const float *k, const float *v, const int32_t *pos, const float *deg, int64_t T0,
                       int64_t D, int64_t target, int64_t gap, int sinks, int recent, int chunk, int replay, int *flagged)
{
    /* the arrays sized as the CUDA backend sizes them: by the plan's dry run */
    mg_need nd = { 1, 1 };
    const mg_steps dry = { &nd, mg_need_append, mg_need_pass };
    mg_plan(T0, target, gap, sinks, recent, chunk, replay, &dry);
    size_t rows = (size_t)(T0 > 0 ? T0 : 1), slots = (size_t)nd.slots;
    static int reverse;
    emu e = { k, v, deg, pos, { 0 }, { 0 }, { 0 }, { 0 }, calloc(rows, sizeof(double)), malloc(slots * 8),
              malloc(slots * 8), malloc(slots * 8), malloc(slots * 4), calloc(rows, 1), malloc(rows * 4),
              malloc(sizeof(float) * (size_t)nd.pairs), D, 0, 0, 0, reverse ^= 1 };
    for (int c = 0; c < 2; c++) {
        e.wk[c] = calloc(rows * (size_t)D, 4);
        e.wv[c] = calloc(rows * (size_t)D, 4);
        e.wdeg[c] = calloc(rows, 4);
        e.wpos[c] = calloc(rows, 4);
        cr_assert(e.wk[c] && e.wv[c] && e.wdeg[c] && e.wpos[c]);
    }
    cr_assert(e.nrm && e.la && e.lb && e.order && e.ls && e.gone && e.idx && e.sims);
    for (int64_t i = 0; i < nd.pairs; i++) e.sims[i] = NAN;   /* what no pass wrote is never read */
    const mg_steps st = { &e, emu_append, emu_pass };
    const int64_t held = mg_plan(T0, target, gap, sinks, recent, chunk, replay, &st);
    cr_assert(held >= 0);
    /* the CPU backend on copies */
    float *hk = malloc(rows * (size_t)D * 4), *hv = malloc(rows * (size_t)D * 4), *hd = malloc(rows * 4);
    int32_t *hp = malloc(rows * 4);
    cr_assert(hk && hv && hd && hp);
    memcpy(hk, k, (size_t)T0 * (size_t)D * 4);
    memcpy(hv, v, (size_t)T0 * (size_t)D * 4);
    memcpy(hd, deg, (size_t)T0 * 4);
    memcpy(hp, pos, (size_t)T0 * 4);
    be_merge_head h = { hk, hv, hp, hd, T0 };
    be_merge m = { .heads = &h, .n_heads = 1, .dim = D, .target = target, .gap = gap, .sinks = sinks,
                   .recent = recent, .chunk = chunk, .replay = replay };
    cr_assert(be_merge_heads(b, &m) == 0);
    *flagged = e.flag;
    if (!e.flag) {
        const int c = e.cur;
        cr_assert_eq(held, h.n, "T0 %lld, target %lld, gap %lld, sinks %d, recent %d, chunk %d, replay %d: %lld rows, "
                     "the CPU's %lld", (long long)T0, (long long)target, (long long)gap, sinks, recent, chunk, replay,
                     (long long)held, (long long)h.n);
        cr_assert(memcmp(e.wk[c], hk, (size_t)held * (size_t)D * 4) == 0 &&
                  memcmp(e.wv[c], hv, (size_t)held * (size_t)D * 4) == 0 && memcmp(e.wdeg[c], hd, (size_t)held * 4) == 0 &&
                  memcmp(e.wpos[c], hp, (size_t)held * 4) == 0,
                  "T0 %lld, target %lld, gap %lld, sinks %d, recent %d, chunk %d, replay %d: the rows differ",
                  (long long)T0, (long long)target, (long long)gap, sinks, recent, chunk, replay);
    }
    for (int c = 0; c < 2; c++) {
        free(e.wk[c]);
        free(e.wv[c]);
        free(e.wdeg[c]);
        free(e.wpos[c]);
    }
    free(e.nrm);
    free(e.la);
    free(e.lb);
    free(e.order);
    free(e.ls);
    free(e.gone);
    free(e.idx);
    free(e.sims);
    free(hk);
    free(hv);
    free(hd);
    free(hp);
    return e.passes;
}

Test(merge, the_cuda_kernels_steps_run_on_the_host_give_the_cpus_rows)
{
    char err[256];
    be_backend *b = be_cpu_create(2, err, sizeof err);
    cr_assert(b, "%s", err);
    static const int64_t dims[] = { 1, 5, 32 };
    static const int chunks[] = { 1, 2, 3, 7, 16, 1000 };
    static const int64_t sizes[] = { 0, 1, 3, 57, 300 };
    uint64_t r = 7;
    int passes = 0, runs = 0, flagged = 0, f;
    for (int di = 0; di < 3; di++)
        for (int si = 0; si < 5; si++) {
            const int64_t D = dims[di], T0 = sizes[si];
            size_t rows = (size_t)(T0 > 0 ? T0 : 1);
            float *k = malloc(rows * (size_t)D * 4), *v = malloc(rows * (size_t)D * 4), *deg = malloc(rows * 4);
            int32_t *pos = malloc(rows * 4);
            cr_assert(k && v && deg && pos);
            for (int64_t i = 0; i < T0 * D; i++) {
                k[i] = wide_value(&r);
                v[i] = wide_value(&r);
            }
            for (int64_t t = 0; t < T0; t++) {
                pos[t] = (int32_t)(t * 3 + 1);
                deg[t] = (float)(1 + (t * 7) % 4);   /* rows that stand for several tokens already */
            }
            if (T0 > 20)
                for (int64_t i = 0; i < D; i++) k[12 * D + i] = k[14 * D + i];   /* ties */
            for (int ci = 0; ci < 6; ci++)
                for (int replay = 0; replay < 2; replay++) {
                    const int64_t target = T0 / 3 + 2, gap = replay ? 5 + ci : 0;
                    passes += emu_compare(b, k, v, pos, deg, T0, D, target, gap, 2, 3, chunks[ci], replay, &f);
                    flagged += f;
                    passes += emu_compare(b, k, v, pos, deg, T0, D, 4, 8, 0, 0, chunks[ci], replay, &f);
                    flagged += f;
                    passes += emu_compare(b, k, v, pos, deg, T0, D, T0 / 2, 0, 1, 1, chunks[ci], replay, &f);
                    flagged += f;
                    runs += 3;
                }
            free(k);
            free(v);
            free(deg);
            free(pos);
        }
    cr_assert_eq(flagged, 0, "finite keys: every pass has the shape's links");
    cr_assert_gt(passes, 500, "%d passes over %d runs", passes, runs);
    be_free(b);
}

Test(merge, a_row_whose_cosines_are_all_nan_is_flagged_for_the_host)
{
    enum { D = 4, T = 40 };
    char err[256];
    be_backend *b = be_cpu_create(2, err, sizeof err);
    cr_assert(b, "%s", err);
    float k[T * D], v[T * D], deg[T];
    int32_t pos[T];
    uint64_t r = 3;
    for (int i = 0; i < T * D; i++) {
        k[i] = 0.5f + fabsf(wide_value(&r));   /* no zero: an infinite key gives NaN with each row */
        v[i] = wide_value(&r);
    }
    for (int t = 0; t < T; t++) {
        pos[t] = t;
        deg[t] = 1;
    }
    k[10 * D] = INFINITY;   /* an A row (even offset of the chunk from row 0): inf / inf with every B row */
    k[10 * D + 1] = INFINITY;
    int f = 0;
    emu_compare(b, k, v, pos, deg, T, D, 12, 0, 0, 0, 8, 0, &f);
    cr_assert_eq(f, 1, "the pass had fewer links than the shape gives, and the device did not see it");
    f = 0;
    emu_compare(b, k, v, pos, deg, T, D, 12, 4, 0, 0, 8, 1, &f);   /* replayed: the row arrives among the first */
    cr_assert_eq(f, 1, "a replayed pass had fewer links than planned, and the device did not see it");
    be_free(b);
}

Test(merge, of_two_links_of_equal_cosine_the_earlier_a_row_merges_first)
{
    /* one chunk of 4 rows: A0 = B1 and A2 = B3, both links of cosine 1; room for one merge */
    float k[4 * 2] = { 1, 0, 1, 0, 0, 1, 0, 1 }, v[4 * 2] = { 1, 2, 3, 4, 5, 6, 7, 8 }, deg[4] = { 1, 1, 1, 1 };
    int32_t pos[4] = { 10, 11, 12, 13 };
    cr_assert_eq(chelsea_merge(NULL, k, v, pos, deg, 4, 2, 3, 0, 0, 4), 3);
    cr_assert(pos[0] == 11 && pos[1] == 12 && pos[2] == 13, "kept %d %d %d: row 0 merges into row 1", pos[0], pos[1],
              pos[2]);
    cr_assert(deg[0] == 2 && v[0] == 2 && v[1] == 3, "the centroid of rows 0 and 1: (%g, %g), degree %g", (double)v[0],
              (double)v[1], (double)deg[0]);
}
