/* mean_kernels.h - CHESS's summary rows and anchor (kernels/backend.h, be_ops.key_means), one
 * element's work, in one header for C and CUDA (issue 25, stage 5).
 *
 * The CPU backend computes every element with these functions; the CUDA backend's kernels run
 * the same ones, a block a (row, unit) and a thread an element, over the device's copies of the
 * pages; tests/test_key_means.c runs every (block, thread) of such a launch on the host and
 * compares with the CPU backend. Every float operation is written out (QB_ADD, QB_MUL, KM_DADD,
 * KM_DMUL), so the device gives the host's bits:
 * - a page's part of a unit: its keys' f16 values summed in row order from 0.0f (the cache's
 *   ksum is that sum, kept as rows come: the CPU reads it instead of the rows), times km_inv(n);
 * - a chunk's: its pages' parts added in order from 0.0f, times km_inv(pages); a grid's likewise
 *   over its chunks (each computed again from its pages, so nothing but the rows is kept);
 * - a row scaled to unit length: each unit's squares summed in double in order (km_unit_sq),
 *   the units' sums added in order (km_row_inv), the row times (float)(1 / sqrt(sum));
 * - the anchor: a unit's last n_last keys from the oldest on, times km_inv(count).
 * A launch's rows are numbered by slot: pages [0, np), chunks [np, np + nc), grids after them,
 * then the anchor where n_last > 0 (km_req). */
#ifndef KVCHAT_MEAN_KERNELS_H
#define KVCHAT_MEAN_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/attn_group.h"
#include "kernels/backend.h"
#include "kernels/quant_blocks.h"

#define KM_THREADS 128         /* threads of a (row, unit) block: element d goes to thread d % KM_THREADS */
#define KM_MAX_D 1024          /* head dimensions the kernels take (the model loader allows no more) */
#define KM_SCALE_THREADS 256   /* threads of a row's scaling block */

#ifdef __CUDA_ARCH__
#define KM_DMUL(a, b) __dmul_rn((a), (b))
#define KM_DADD(a, b) __dadd_rn((a), (b))
#define KM_RSQRT(s) __ddiv_rn(1.0, __dsqrt_rn(s))
#else
#define KM_DMUL(a, b) ((a) * (b))
#define KM_DADD(a, b) ((a) + (b))
#define KM_RSQRT(s) (1.0 / sqrt(s))
#endif

/* A layer's list on the device, as pt_build leaves it: KV head h's pages at pages[hp[h] ..]. */
typedef struct km_dlist {
    const ag_page *pages;
    const int64_t *hp;
} km_dlist;

/* Where the pages are: the caller's lists on the host (their ksum read where given), or the
 * device's (host memory standing in for it in the tests). */
typedef struct km_src {
    const be_page_list *host;
    const km_dlist *dev;
    int n_head_kv, head_dim;
} km_src;

/* One launch: the candidates and their grouping, and the rows by slot. */
typedef struct km_req {
    int64_t first, n_cand;
    int chunk, grid;
    int64_t p0, np, c0, nc, g0, ng;   /* the first page, chunk and grid computed, and how many */
    int32_t n_last;                   /* > 0: the anchor is the last slot */
    int units, unit;                  /* units a row; rows scaled to unit length */
} km_req;

/* One page of one KV head as the sums read it. */
typedef struct km_ref {
    const uint16_t *k;      /* row 0 of this head */
    const float *ksum;      /* NULL: sum the rows */
    int32_t n, stride;
} km_ref;

QB_HD km_ref km_get(const km_src *s, int u, int64_t i)
{
    int l = u / s->n_head_kv, h = u % s->n_head_kv;
    km_ref r;
#ifndef __CUDA_ARCH__   /* the device has only its own lists */
    if (s->host) {
        const be_kv_page *p = &s->host[l].pages[s->host[l].head_pages[h] + i];
        r.k = p->k + (int64_t)h * p->head_step;
        r.ksum = p->head_step == 0 ? p->ksum : NULL;
        r.n = p->n;
        r.stride = p->stride;
        return r;
    }
#endif
    {
        const ag_page *p = &s->dev[l].pages[s->dev[l].hp[h] + i];
        r.k = p->k + (int64_t)h * p->head_step;
        r.ksum = NULL;
        r.n = p->n;
        r.stride = p->stride;
    }
    return r;
}

/* Pages unit u's head holds. */
QB_HD int64_t km_count(const km_src *s, int u)
{
    int l = u / s->n_head_kv, h = u % s->n_head_kv;
#ifndef __CUDA_ARCH__
    if (s->host) return s->host[l].head_pages[h + 1] - s->host[l].head_pages[h];
#endif
    return s->dev[l].hp[h + 1] - s->dev[l].hp[h];
}

/* The float nearest 1 / x for an integer x in [1, 2^24], from an approximation within 2 units in
 * the last place of 1 / x (below a power of two, where floats are twice as dense, that is up to
 * 4 floats away): of the nine floats around it, the one whose product with x lies nearest 1 (in
 * double, where x times a float and 1 minus that are exact). That is IEEE division's 1.0f / x: no
 * two floats are equally near (1 / x is halfway between two only where x is a power of two, and
 * then it is a float itself). The device's own correctly rounded division calls a slow path
 * that spills registers; this one is a few instructions. */
QB_HD float km_recip_from(float x, float approx)
{
#ifdef __CUDA_ARCH__
    const int32_t a = __float_as_int(approx);
#else
    int32_t a;
    memcpy(&a, &approx, sizeof a);
#endif
    float best = approx;
    double err = 2.0;
    for (int k = -4; k <= 4; k++) {
#ifdef __CUDA_ARCH__
        const float c = __int_as_float(a + k);
#else
        const int32_t bits = a + k;
        float c;
        memcpy(&c, &bits, sizeof c);
#endif
        double e = fabs(1.0 - (double)x * (double)c);
        if (e < err) {
            err = e;
            best = c;
        }
    }
    return best;
}

/* 1.0f / n (0 for n = 0), the same bits on the host and the device. */
QB_HD float km_inv(int64_t n)
{
    if (n <= 0) return 0.0f;
#ifdef __CUDA_ARCH__
    return km_recip_from((float)n, __fdividef(1.0f, (float)n));   /* within 2 ulp (CUDA's guide; rcp.approx: 1) */
#else
    return 1.0f / (float)n;
#endif
}

QB_HD float km_page_part(km_ref r, int d)
{
    float s = 0.0f;
#ifndef __CUDA_ARCH__
    if (r.ksum) return QB_MUL(r.ksum[d], km_inv(r.n));
#endif
    {
        for (int32_t t = 0; t < r.n; t++) s = QB_ADD(s, qb_half(r.k[(int64_t)t * r.stride + d]));
    }
    return QB_MUL(s, km_inv(r.n));
}

/* Candidate pages [*a, *e) of chunk c. */
QB_HD void km_chunk_pages(const km_req *q, int64_t c, int64_t *a, int64_t *e)
{
    *a = q->first + c * q->chunk;
    *e = *a + q->chunk < q->first + q->n_cand ? *a + q->chunk : q->first + q->n_cand;
}

/* Chunks [*a, *e) of grid g. */
QB_HD void km_grid_chunks(const km_req *q, int64_t g, int64_t *a, int64_t *e)
{
    int64_t n_chunks = (q->n_cand + q->chunk - 1) / q->chunk;
    *a = g * q->grid;
    *e = *a + q->grid < n_chunks ? *a + q->grid : n_chunks;
}

QB_HD float km_chunk_part(const km_src *s, const km_req *q, int u, int64_t c, int d)
{
    int64_t a, e;
    km_chunk_pages(q, c, &a, &e);
    float acc = 0.0f;
    for (int64_t i = a; i < e; i++) acc = QB_ADD(acc, km_page_part(km_get(s, u, i), d));
    return QB_MUL(acc, km_inv(e - a));
}

QB_HD float km_grid_part(const km_src *s, const km_req *q, int u, int64_t g, int d)
{
    int64_t a, e;
    km_grid_chunks(q, g, &a, &e);
    float acc = 0.0f;
    for (int64_t c = a; c < e; c++) acc = QB_ADD(acc, km_chunk_part(s, q, u, c, d));
    return QB_MUL(acc, km_inv(e - a));
}

/* Unit u's page and row where its last n tokens start (*row 0 of *page past the end: none held). */
QB_HD int64_t km_last_start(const km_src *s, int u, int32_t n, int32_t *row, int64_t *got)
{
    int64_t i = km_count(s, u), have = 0;
    *row = 0;
    while (i > 0 && have < n) {
        km_ref r = km_get(s, u, --i);
        int64_t take = r.n < n - have ? r.n : n - have;
        have += take;
        *row = (int32_t)(r.n - take);
    }
    *got = have;
    return i;
}

QB_HD float km_anchor_part(const km_src *s, const km_req *q, int u, int d)
{
    int32_t t0;
    int64_t got, np = km_count(s, u);
    float acc = 0.0f;
    for (int64_t i = km_last_start(s, u, q->n_last, &t0, &got); i < np; i++, t0 = 0) {
        km_ref r = km_get(s, u, i);
        for (int32_t t = t0; t < r.n; t++) acc = QB_ADD(acc, qb_half(r.k[(int64_t)t * r.stride + d]));
    }
    return QB_MUL(acc, km_inv(got));
}

/* Slots of a launch: every row it computes, the anchor last. */
QB_HD int64_t km_slots(const km_req *q) { return q->np + q->nc + q->ng + (q->n_last > 0); }

/* 1 when slot is the anchor (never scaled). */
QB_HD int km_is_anchor(const km_req *q, int64_t slot) { return slot >= q->np + q->nc + q->ng; }

/* Element d of unit u of the row at slot, unscaled. */
QB_HD float km_elem(const km_src *s, const km_req *q, int64_t slot, int u, int d)
{
    if (slot < q->np) return km_page_part(km_get(s, u, q->p0 + slot), d);
    slot -= q->np;
    if (slot < q->nc) return km_chunk_part(s, q, u, q->c0 + slot, d);
    slot -= q->nc;
    if (slot < q->ng) return km_grid_part(s, q, u, q->g0 + slot, d);
    return km_anchor_part(s, q, u, d);
}

/* Where the row at slot goes (rows of dim floats): at page p0's row o[0], chunk c0's o[1], grid
 * g0's o[2], or the anchor o[3] (a struct, so that a kernel keeps it in registers). */
typedef struct km_outs {
    float *o[4];
} km_outs;

QB_HD float *km_row(const km_req *q, km_outs out, int64_t dim, int64_t slot)
{
    if (slot < q->np) return out.o[0] + slot * dim;
    slot -= q->np;
    if (slot < q->nc) return out.o[1] + slot * dim;
    slot -= q->nc;
    if (slot < q->ng) return out.o[2] + slot * dim;
    return out.o[3];
}

/* Thread t's share of block (slot, u) of the elements' kernel: elements t, t + KM_THREADS, ... of
 * unit u of the row, unscaled, into the row and into vals (the block's copy of the unit). */
QB_HD void km_thread_elems(const km_src *s, const km_req *q, km_outs out, int64_t slot, int u, int t, float *vals)
{
    const int D = s->head_dim;
    float *row = km_row(q, out, (int64_t)q->units * D, slot) + (int64_t)u * D;
    for (int d = t; d < D; d += KM_THREADS) {
        const float x = km_elem(s, q, slot, u, d);
        vals[d] = x;
        row[d] = x;
    }
}

/* Thread t's share of a row's scaling: elements t, t + KM_SCALE_THREADS, ... times inv. */
QB_HD void km_thread_scale(const km_req *q, int D, km_outs out, int64_t slot, int t, float inv)
{
    const int64_t dim = (int64_t)q->units * D;
    float *row = km_row(q, out, dim, slot);
    for (int64_t e = t; e < dim; e += KM_SCALE_THREADS) row[e] = QB_MUL(row[e], inv);
}

/* A unit's sum of squares in double, in order. */
QB_HD double km_unit_sq(const float *x, int n)
{
    double acc = 0.0;
    for (int d = 0; d < n; d++) acc = KM_DADD(acc, KM_DMUL((double)x[d], (double)x[d]));
    return acc;
}

/* The scale to unit length of a row whose squares add up to s. */
QB_HD float km_scale_of(double s) { return s > 0 ? (float)KM_RSQRT(s) : 0.0f; }

/* A row's scale to unit length from its units' sums of squares, added in order. */
QB_HD float km_row_inv(const double *sq, int units)
{
    double s = 0.0;
    for (int u = 0; u < units; u++) s = KM_DADD(s, sq[u]);
    return km_scale_of(s);
}

/* The launch a request makes (empty ranges: no rows). */
QB_HD km_req km_req_of(const be_key_means *m)
{
    km_req q;
    q.first = m->first;
    q.n_cand = m->n_cand;
    q.chunk = m->chunk;
    q.grid = m->grid;
    q.p0 = m->p0;
    q.np = m->p1 > m->p0 ? m->p1 - m->p0 : 0;
    q.c0 = m->c0;
    q.nc = m->c1 > m->c0 ? m->c1 - m->c0 : 0;
    q.g0 = m->g0;
    q.ng = m->g1 > m->g0 ? m->g1 - m->g0 : 0;
    q.n_last = m->n_last > 0 && m->anchor ? m->n_last : 0;
    q.units = m->n_lists * m->n_head_kv;
    q.unit = m->unit;
    return q;
}

#endif
