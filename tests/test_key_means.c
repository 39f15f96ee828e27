/* CHESS's summary rows and anchor (be_ops.key_means, kernels/mean_kernels.h): the CPU backend's
 * against a reference written from backend.h's definition, from the key sums and from the keys,
 * and every (block, thread) of the CUDA kernels' launch run on the host against the CPU's. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant.h"
#include "engine/kvcache.h"
#include "engine/page_list.h"
#include "kernels/backend.h"
#include "kernels/mean_kernels.h"
#include "tests/fwd_fixture.h"

/* A cache of n_layer layers, lists of every page of layers `layers` (n_lists of them). */
typedef struct fixture {
    kv_cache *kv;
    page_list pl[4];
    be_page_list lists[4];
    int n_lists, H, D, P;
    int64_t dim;
} fixture;

static void build(fixture *fx, int n_layer, const int *layers, int n_lists, int H, int D, int P, int64_t tokens,
                  uint64_t *r)
{
    char err[256];
    memset(fx, 0, sizeof *fx);
    fx->kv = kv_create(n_layer, 4096, H, D, P, NULL, err, sizeof err);
    cr_assert(fx->kv, "%s", err);
    fwd_fixture_wide_keys(fx->kv, n_layer, tokens, r);   /* sums that round: the order shows */
    fx->n_lists = n_lists;
    fx->H = H;
    fx->D = D;
    fx->P = P;
    fx->dim = (int64_t)n_lists * H * D;
    for (int l = 0; l < n_lists; l++) {
        cr_assert(page_list_update(&fx->pl[l], fx->kv, layers[l]) == 0);
        fx->lists[l] = (be_page_list){ fx->pl[l].refs, fx->pl[l].at.off, (uint64_t)l + 1, fx->pl[l].at.shape, 0 };
    }
}

static void unbuild(fixture *fx)
{
    for (int l = 0; l < fx->n_lists; l++) page_list_free(&fx->pl[l]);
    kv_free(fx->kv);
}

/* ---- the reference: backend.h's definition, written out plainly */

static const be_kv_page *ref_page(const fixture *fx, int u, int64_t i)
{
    const be_page_list *L = &fx->lists[u / fx->H];
    return &L->pages[L->head_pages[u % fx->H] + i];
}

static float ref_page_part(const fixture *fx, int u, int64_t i, int d)
{
    const be_kv_page *p = ref_page(fx, u, i);
    float s = 0.0f;
    for (int t = 0; t < p->n; t++) s += quant_fp16_to_f32(p->k[(size_t)t * (size_t)p->stride + (size_t)d]);
    return p->n > 0 ? s * (1.0f / (float)p->n) : 0.0f;
}

static float ref_chunk_part(const fixture *fx, const be_key_means *m, int u, int64_t c, int d)
{
    int64_t a = m->first + c * m->chunk, e = a + m->chunk, end = m->first + m->n_cand;
    if (e > end) e = end;
    float s = 0.0f;
    for (int64_t i = a; i < e; i++) s += ref_page_part(fx, u, i, d);
    return s * (1.0f / (float)(e - a));
}

static float ref_grid_part(const fixture *fx, const be_key_means *m, int u, int64_t g, int d)
{
    int64_t nc = (m->n_cand + m->chunk - 1) / m->chunk, a = g * m->grid, e = a + m->grid;
    if (e > nc) e = nc;
    float s = 0.0f;
    for (int64_t c = a; c < e; c++) s += ref_chunk_part(fx, m, u, c, d);
    return s * (1.0f / (float)(e - a));
}

static void ref_unit(const fixture *fx, float *row)
{
    double s = 0;
    for (int u = 0; u < fx->n_lists * fx->H; u++) {
        double su = 0;
        for (int d = 0; d < fx->D; d++) su += (double)row[u * fx->D + d] * (double)row[u * fx->D + d];
        s += su;
    }
    float inv = s > 0 ? (float)(1.0 / sqrt(s)) : 0.0f;
    for (int64_t e = 0; e < fx->dim; e++) row[e] *= inv;
}

/* The mean of unit u's last n keys, oldest first. */
static float ref_anchor_part(const fixture *fx, int u, int n, int d)
{
    const be_page_list *L = &fx->lists[u / fx->H];
    int h = u % fx->H;
    int64_t np = L->head_pages[h + 1] - L->head_pages[h], held = 0;
    for (int64_t i = 0; i < np; i++) held += ref_page(fx, u, i)->n;
    int64_t skip = held > n ? held - n : 0, seen = 0, got = 0;
    float s = 0.0f;
    for (int64_t i = 0; i < np; i++) {
        const be_kv_page *p = ref_page(fx, u, i);
        for (int t = 0; t < p->n; t++, seen++) {
            if (seen < skip) continue;
            s += quant_fp16_to_f32(p->k[(size_t)t * (size_t)p->stride + (size_t)d]);
            got++;
        }
    }
    return got > 0 ? s * (1.0f / (float)got) : 0.0f;
}

/* Every row m asks for, by the reference, into rows laid out as m's. */
static void reference(const fixture *fx, const be_key_means *m, float *pages, float *chunks, float *grids, float *anchor)
{
    int units = fx->n_lists * fx->H;
    for (int64_t i = m->p0; i < m->p1; i++) {
        for (int u = 0; u < units; u++)
            for (int d = 0; d < fx->D; d++) pages[i * fx->dim + u * fx->D + d] = ref_page_part(fx, u, i, d);
        if (m->unit) ref_unit(fx, pages + i * fx->dim);
    }
    for (int64_t c = m->c0; c < m->c1; c++) {
        for (int u = 0; u < units; u++)
            for (int d = 0; d < fx->D; d++) chunks[c * fx->dim + u * fx->D + d] = ref_chunk_part(fx, m, u, c, d);
        if (m->unit) ref_unit(fx, chunks + c * fx->dim);
    }
    for (int64_t g = m->g0; g < m->g1; g++) {
        for (int u = 0; u < units; u++)
            for (int d = 0; d < fx->D; d++) grids[g * fx->dim + u * fx->D + d] = ref_grid_part(fx, m, u, g, d);
        if (m->unit) ref_unit(fx, grids + g * fx->dim);
    }
    if (m->n_last > 0)
        for (int u = 0; u < units; u++)
            for (int d = 0; d < fx->D; d++) anchor[u * fx->D + d] = ref_anchor_part(fx, u, m->n_last, d);
}

/* Rows for n pages, chunks and grids of fx's width, and an anchor, filled with a canary. */
typedef struct outs {
    float *pages, *chunks, *grids, *anchor;
    size_t n;
} outs;

static void outs_make(outs *o, const fixture *fx, int64_t rows)
{
    o->n = (size_t)(rows * fx->dim);
    o->pages = malloc(sizeof(float) * o->n);
    o->chunks = malloc(sizeof(float) * o->n);
    o->grids = malloc(sizeof(float) * o->n);
    o->anchor = malloc(sizeof(float) * (size_t)fx->dim);
    cr_assert(o->pages && o->chunks && o->grids && o->anchor);
    for (size_t i = 0; i < o->n; i++) o->pages[i] = o->chunks[i] = o->grids[i] = -777.0f;
    for (int64_t i = 0; i < fx->dim; i++) o->anchor[i] = -777.0f;
}

static void outs_free(outs *o)
{
    free(o->pages);
    free(o->chunks);
    free(o->grids);
    free(o->anchor);
}

static void expect_same(const outs *a, const outs *b, int64_t dim, const char *what)
{
    cr_expect(!memcmp(a->pages, b->pages, sizeof(float) * a->n), "%s: page rows differ", what);
    cr_expect(!memcmp(a->chunks, b->chunks, sizeof(float) * a->n), "%s: chunk rows differ", what);
    cr_expect(!memcmp(a->grids, b->grids, sizeof(float) * a->n), "%s: grid rows differ", what);
    cr_expect(!memcmp(a->anchor, b->anchor, sizeof(float) * (size_t)dim), "%s: anchors differ", what);
}

static be_key_means request(const fixture *fx, const outs *o, int64_t first, int64_t n_cand, int chunk, int grid, int unit,
                            int n_last)
{
    int64_t nc = (n_cand + chunk - 1) / chunk, ng = (nc + grid - 1) / grid;
    return (be_key_means){ fx->lists, fx->n_lists, fx->H, fx->D, first, n_cand, chunk, grid,
                           first, first + n_cand, 0, nc, 0, ng, o->pages, o->chunks, o->grids, unit, n_last, o->anchor };
}

/* The shapes the tests run: layers listed, heads, head_dim, page size, tokens (a partial last page). */
typedef struct shape {
    int n_layer, layers[3], n_lists, H, D, P;
    int64_t tokens;
} shape;

static const shape shapes[] = {
    { 3, { 0, 2 }, 2, 2, 8, 4, 61 },
    { 1, { 0 }, 1, 1, 200, 8, 77 },      /* head_dim above the kernel's threads, not a multiple */
    { 4, { 1, 2, 3 }, 3, 3, 64, 16, 290 },
};

/* fn over a fresh cache of each shape (random keys from seed) and a CPU backend of 2 threads. */
static void each_shape(void (*fn)(be_backend *cpu, fixture *fx, const shape *sh, size_t si), uint64_t seed)
{
    char err[256];
    be_backend *cpu = be_cpu_create(2, err, sizeof err);
    cr_assert(cpu, "%s", err);
    uint64_t r = seed;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const shape *sh = &shapes[si];
        fixture fx;
        build(&fx, sh->n_layer, sh->layers, sh->n_lists, sh->H, sh->D, sh->P, sh->tokens, &r);
        fn(cpu, &fx, sh, si);
        unbuild(&fx);
    }
    be_free(cpu);
}

static void documented(be_backend *cpu, fixture *fx, const shape *sh, size_t si)
{
    int np = kv_n_pages(fx->kv, sh->layers[0], 0);
    static const int chunks[] = { 1, 2, 3 }, grids[] = { 1, 2, 4 }, lasts[] = { 1, 5, 1000 };
    for (int k = 0; k < 3; k++)
        for (int unit = 0; unit <= 1; unit++) {
            int64_t first = k, n_cand = np - 1 - k;   /* the last (partial) page a candidate where k = 0 */
            if (k == 0) n_cand = np;
            outs got, want;
            outs_make(&got, fx, np);
            outs_make(&want, fx, np);
            be_key_means m = request(fx, &got, first, n_cand, chunks[k], grids[k], unit, lasts[k]);
            cpu->ops->key_means(cpu, &m);
            reference(fx, &m, want.pages, want.chunks, want.grids, want.anchor);
            char what[96];
            snprintf(what, sizeof what, "shape %zu, chunk %d, grid %d, unit %d, anchor of %d", si, chunks[k],
                     grids[k], unit, lasts[k]);
            expect_same(&got, &want, fx->dim, what);
            /* a part of the rows: only those are written */
            outs part;
            outs_make(&part, fx, np);
            m = request(fx, &part, first, n_cand, chunks[k], grids[k], unit, 0);
            m.p0 = first + 1;
            m.p1 = first + 2;
            m.c0 = m.c1 - 1;
            m.g0 = m.g1;
            cpu->ops->key_means(cpu, &m);
            for (int64_t e = 0; e < (int64_t)part.n; e++) {
                int64_t row = e / fx->dim;
                float wp = row == first + 1 ? want.pages[e] : -777.0f, wc = row == m.c0 ? want.chunks[e] : -777.0f;
                if (memcmp(&part.pages[e], &wp, sizeof wp) || memcmp(&part.chunks[e], &wc, sizeof wc) ||
                    part.grids[e] != -777.0f) {
                    cr_expect(0, "%s: element %lld of row %lld written wrong or outside the range", what, (long long)e,
                              (long long)row);
                    break;
                }
            }
            cr_expect_eq(part.anchor[0], -777.0f, "%s: the anchor written with n_last 0", what);
            outs_free(&part);
            outs_free(&got);
            outs_free(&want);
        }
}

Test(key_means, the_cpu_computes_the_documented_means) { each_shape(documented, 0x4B3A); }

/* The CPU reads the cache's ksum (kept as rows come, and again after tokens are dropped); a GPU
 * sums its copies of the keys: the same floats. */
static void sums_and_keys(be_backend *cpu, fixture *fx, const shape *sh, size_t si)
{
    /* head 0 of the first listed layer drops every third token (its pages summed again) */
    int64_t keep[1024], nk = 0;
    for (int64_t t = 0; t < sh->tokens; t++)
        if (t % 3) keep[nk++] = t;
    cr_assert(kv_keep_tokens(fx->kv, sh->layers[0], 0, keep, nk) == 0);
    for (int l = 0; l < fx->n_lists; l++) {
        cr_assert(page_list_update(&fx->pl[l], fx->kv, sh->layers[l]) == 0);
        fx->lists[l] = (be_page_list){ fx->pl[l].refs, fx->pl[l].at.off, (uint64_t)l + 1, fx->pl[l].at.shape, 0 };
    }
    int np = kv_n_pages(fx->kv, sh->layers[0], 0);
    for (int l = 1; l < fx->n_lists; l++)
        for (int h = 0; h < fx->H; h++)
            if (kv_n_pages(fx->kv, sh->layers[l], h) < np) np = kv_n_pages(fx->kv, sh->layers[l], h);
    for (int h = 1; h < fx->H; h++)
        if (kv_n_pages(fx->kv, sh->layers[0], h) < np) np = kv_n_pages(fx->kv, sh->layers[0], h);
    outs a, b;
    outs_make(&a, fx, np);
    outs_make(&b, fx, np);
    be_key_means m = request(fx, &a, 0, np, 2, 2, 1, 7);
    cpu->ops->key_means(cpu, &m);
    /* the same lists without their sums */
    for (int l = 0; l < fx->n_lists; l++)
        for (int64_t i = 0; i < fx->pl[l].at.off[fx->H]; i++) fx->pl[l].refs[i].ksum = NULL;
    m = request(fx, &b, 0, np, 2, 2, 1, 7);
    cpu->ops->key_means(cpu, &m);
    expect_same(&a, &b, fx->dim, "from ksum and from the keys");
    outs_free(&a);
    outs_free(&b);
}

Test(key_means, the_rows_from_the_key_sums_equal_the_rows_from_the_keys) { each_shape(sums_and_keys, 0x5EED); }

/* The CUDA launch on the host: key_means_kernel's blocks (slot, unit) and threads, then
 * key_scale_kernel's, each thread's share as the kernels run it; the device's lists as pt_build
 * leaves them (descriptors of the pages' keys, per-head offsets), with host memory standing in. */
static void simulate(const fixture *fx, const be_key_means *m)
{
    km_dlist dl[4];
    ag_page *desc[4];
    for (int l = 0; l < fx->n_lists; l++) {
        int64_t n = fx->lists[l].head_pages[fx->H];
        desc[l] = calloc((size_t)(n > 0 ? n : 1), sizeof(ag_page));
        cr_assert(desc[l]);
        for (int64_t i = 0; i < n; i++) {
            const be_kv_page *p = &fx->lists[l].pages[i];
            desc[l][i] = (ag_page){ p->k, p->v, p->pos, NULL, -1, p->n, p->stride, p->head_step };
        }
        dl[l] = (km_dlist){ desc[l], fx->lists[l].head_pages };
    }
    const km_src src = { NULL, dl, fx->H, fx->D };
    const km_req q = km_req_of(m);
    const km_outs out = { { q.np ? m->page_rows + q.p0 * fx->dim : NULL, q.nc ? m->chunk_rows + q.c0 * fx->dim : NULL,
                            q.ng ? m->grid_rows + q.g0 * fx->dim : NULL, m->anchor } };
    const int64_t slots = km_slots(&q);
    double *sq = calloc((size_t)(slots * q.units), sizeof(double));
    float vals[KM_MAX_D];
    cr_assert(sq);
    for (int64_t slot = 0; slot < slots; slot++)
        for (int u = 0; u < q.units; u++) {
            for (int t = 0; t < KM_THREADS; t++) km_thread_elems(&src, &q, out, slot, u, t, vals);
            if (q.unit && !km_is_anchor(&q, slot)) sq[slot * q.units + u] = km_unit_sq(vals, fx->D);
        }
    const int64_t scaled = q.unit ? q.np + q.nc + q.ng : 0;
    for (int64_t slot = 0; slot < scaled; slot++) {
        const float inv = km_row_inv(sq + slot * q.units, q.units);
        for (int t = 0; t < KM_SCALE_THREADS; t++) km_thread_scale(&q, fx->D, out, slot, t, inv);
    }
    free(sq);
    for (int l = 0; l < fx->n_lists; l++) free(desc[l]);
}

static void kernels(be_backend *cpu, fixture *fx, const shape *sh, size_t si)
{
    int np = kv_n_pages(fx->kv, sh->layers[0], 0);
    for (int unit = 0; unit <= 1; unit++) {
        outs dev, want;
        outs_make(&dev, fx, np);
        outs_make(&want, fx, np);
        be_key_means m = request(fx, &want, 1, np - 2, 3, 2, unit, 9);
        cpu->ops->key_means(cpu, &m);
        m = request(fx, &dev, 1, np - 2, 3, 2, unit, 9);
        simulate(fx, &m);   /* an element no thread wrote keeps the canary, and differs */
        char what[64];
        snprintf(what, sizeof what, "shape %zu, unit %d: the kernels against the CPU", si, unit);
        expect_same(&dev, &want, fx->dim, what);
        outs_free(&dev);
        outs_free(&want);
    }
}

Test(key_means, every_thread_of_the_kernels_launch_gives_the_cpus_floats) { each_shape(kernels, 0xC0DE); }

Test(key_means, the_devices_reciprocal_is_the_hosts_division)
{
    /* The device takes 1 / n from an approximation within 2 units in the last place of the
     * quotient (its fast reciprocal is within 1): below a power of two that is up to 4 floats
     * away. From every float that near, the choice is 1.0f / n. */
    long wrong = 0;
    for (int64_t n = 1; n <= (1 << 24); n += n < (1 << 20) ? 1 : 997) {
        const float want = 1.0f / (float)n;
        const double ulp = ldexp(1.0, ilogb(1.0 / (double)n) - 23);
        int32_t b;
        memcpy(&b, &want, sizeof b);
        for (int k = -5; k <= 5; k++) {
            int32_t ab = b + k;
            float approx;
            memcpy(&approx, &ab, sizeof approx);
            if (fabs((double)approx - 1.0 / (double)n) > 2 * ulp) continue;
            float got = km_recip_from((float)n, approx);
            if (memcmp(&got, &want, sizeof got)) wrong++;
        }
    }
    cr_expect_eq(wrong, 0, "%ld reciprocals differ from the division", wrong);
    cr_expect_eq(km_inv(0), 0.0f);
}
