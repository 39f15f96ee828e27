/* merge_kernels.h - Chelsea's merge (kernels/backend.h be_merge) one step at a time, in one header for
 * C and CUDA: the CPU backend merges with these functions (kernels/cpu/merge_heads.c), the CUDA
 * backend's kernels run them a thread each (kernels/cuda/merge_heads.cu), and tests/test_chelsea.c
 * runs every thread of those launches on the host against the CPU backend, bit for bit.
 *
 * A merge of a head's T rows to `target` repeats passes while T > target and the middle
 * [sinks, T - recent) holds at least 2 rows: every A row of the middle (even offsets of each chunk
 * of `chunk` rows) is linked to its most cosine-similar B row of the chunk (be_links: the dot and the
 * squared norms summed in double in element order); the links are ordered by mg_before (larger
 * cosine first, the earlier A row first among equal ones); the first r = min(T - target, links)
 * merge their A row into their B row in that order (mg_centroid: the degree-weighted mean, each
 * float operation rounded alone; the degrees add); the merged A rows go and the rest close up in
 * order. A replay takes the rows in arrival order and merges back to target each time more than
 * target + gap have arrived, then to target at the end.
 *
 * Every A row of a chunk with a B row gets a link unless all its cosines are NaN (keys with
 * infinities): the count of links, and so each pass's r, follows from the shape alone otherwise
 * (mg_links_expected), which lets a device plan every pass ahead and check the count after. */
#ifndef KVCHAT_MERGE_KERNELS_H
#define KVCHAT_MERGE_KERNELS_H

#include <math.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/quant_blocks.h"

/* Link x goes before link y: the larger cosine, or the earlier A row among equal cosines (a
 * link's cosine is never NaN: a NaN never wins the scan that makes it). */
QB_HD int mg_before(float xs, int64_t xa, float ys, int64_t ya) { return xs > ys || (xs == ys && xa < ya); }

/* Element d of B's row after A's is merged into it: (nb * kb + na * ka) / (na + nb), each
 * operation rounded alone (n = na + nb, the merged degree). */
QB_HD float mg_centroid(float kb, float ka, float nb, float na, float n)
{
    return QB_DIV(QB_ADD(QB_MUL(nb, kb), QB_MUL(na, ka)), n);
}

/* A row's squared norm in double, in element order (a float times a float is exact in double). */
QB_HD double mg_norm(const float *x, int64_t D)
{
    double n = 0;
    for (int64_t i = 0; i < D; i++) n += (double)x[i] * (double)x[i];
    return n;
}

/* The cosine of rows x and y given their squared norms: the dot in double in element order. */
QB_HD float mg_cosine(const float *x, const float *y, int64_t D, double nx, double ny)
{
    double d = 0;
    for (int64_t i = 0; i < D; i++) d += (double)x[i] * (double)y[i];
    return nx > 0 && ny > 0 ? (float)(d / sqrt(nx * ny)) : 0.0f;
}

/* The links a pass over the middle [m0, m1) makes when every A row with a B row gets one: each
 * chunk's A rows, less one for a chunk of a single row. */
QB_HD int64_t mg_links_expected(int64_t m0, int64_t m1, int64_t chunk)
{
    int64_t n = 0;
    for (int64_t c0 = m0; c0 < m1; c0 += chunk) {
        const int64_t len = c0 + chunk < m1 ? chunk : m1 - c0;
        if (len >= 2) n += (len + 1) / 2;
    }
    return n;
}

/* A rows a chunk holds at most within [m0, m1) (a chunk longer than the middle holds the middle's). */
QB_HD int64_t mg_a_per_chunk(int64_t m0, int64_t m1, int64_t chunk)
{
    const int64_t span = chunk < m1 - m0 ? chunk : m1 - m0;
    return (span + 1) / 2;
}

/* Slot j of a pass's A rows (slots: chunks x mg_a_per_chunk): its row, or -1 past its chunk's end. */
QB_HD int64_t mg_a_row(int64_t m0, int64_t m1, int64_t chunk, int64_t per, int64_t j)
{
    const int64_t c0 = m0 + j / per * chunk, c1 = c0 + chunk < m1 ? c0 + chunk : m1, a = c0 + 2 * (j % per);
    return a < c1 ? a : -1;
}

/* ---- a device's merge, planned ahead (kernels/cuda/merge_heads.cu): a pass is seven steps over the
 * working rows W (the held rows, in order), each a launch of a thread per item:
 *   norms   a row of [m0, m1): nrm[t] = mg_norm(W row t)
 *   pairs   an (A slot j, B index u) of mg_pass.slots x per: mg_pair_sim, its cosine into sims
 *   links   an A slot j (mg_a_row): mg_slot_pick into la, lb, ls (its first B row of the largest
 *           cosine, as be_links scans them); order[j] = -1
 *   rank    a slot with a link: mg_slot_rank, its rank among the links; the first r go to order
 *           (order[rank] = slot) and mark their A row gone; and (the head's first thread) the
 *           links counted against mg_pass.links, a mismatch flagged (a NaN cosine: the host merges)
 *   merge   a B slot: mg_slot_merge, the links of order[0 .. r) into its B row, in order
 *   compact a block a head, its threads each a run of rows: mg_compact counts them, a scan of the
 *           counts, mg_compact again with each run's first index (-1: gone)
 *   scatter a (row, element): the kept rows into W' in order, gone cleared; then W and W' swap
 * and arrivals (a replay) copy source rows after the held ones. */

typedef struct mg_pass {
    int64_t T, m0, m1, chunk;   /* the rows held, the middle, the chunk size */
    int64_t per, slots;         /* A slots a chunk, and in all */
    int64_t links, r;           /* the links the shape gives, the links merged */
} mg_pass;

/* The chunk [*c0, *c1) holding A slot j (its chunk's first row and the end, cut at the middle's). */
QB_HD void mg_chunk_of(const mg_pass *p, int64_t j, int64_t *c0, int64_t *c1)
{
    *c0 = p->m0 + j / p->per * p->chunk;
    *c1 = *c0 + p->chunk < p->m1 ? *c0 + p->chunk : p->m1;
}

/* The cosine of A slot j's row with its chunk's B row u (c0 + 1 + 2u), into sims[j * per + u]; nothing
 * where either row is past the chunk. */
QB_HD void mg_pair_sim(const mg_pass *p, const float *W, const double *nrm, int64_t D, int64_t j, int64_t u, float *sims)
{
    const int64_t a = mg_a_row(p->m0, p->m1, p->chunk, p->per, j);
    if (a < 0) return;
    int64_t c0, c1;
    mg_chunk_of(p, j, &c0, &c1);
    const int64_t b = c0 + 1 + 2 * u;
    if (b < c1) sims[j * p->per + u] = mg_cosine(W + a * D, W + b * D, D, nrm[a], nrm[b]);
}

/* A slot's link from its pairs' cosines, scanned as be_links defines it (the first B row of the
 * largest cosine, -2 to start, a NaN never winning): its A row (-1: no such row) and B row (-1:
 * none), and their cosine. */
QB_HD void mg_slot_pick(const mg_pass *p, const float *sims, int64_t j, int64_t *la, int64_t *lb, float *ls)
{
    const int64_t a = mg_a_row(p->m0, p->m1, p->chunk, p->per, j);
    la[j] = a;
    lb[j] = -1;
    ls[j] = -2.0f;
    if (a < 0) return;
    int64_t c0, c1;
    mg_chunk_of(p, j, &c0, &c1);
    for (int64_t u = 0; c0 + 1 + 2 * u < c1; u++) {
        const float s = sims[j * p->per + u];
        if (s > ls[j]) {
            ls[j] = s;
            lb[j] = c0 + 1 + 2 * u;
        }
    }
}

/* Slot i's rank among the pass's links (the links before it by mg_before) when below p->r, else
 * p->r (the count stops there: a link ranked r or later is not merged, and most are, so a pass
 * costs about slots x r x log(slots) comparisons, not slots^2); -1 without a link. */
QB_HD int64_t mg_slot_rank(const mg_pass *p, const int64_t *la, const int64_t *lb, const float *ls, int64_t i)
{
    if (lb[i] < 0) return -1;
    int64_t rank = 0;
    for (int64_t j = 0; j < p->slots && rank < p->r; j++) rank += lb[j] >= 0 && mg_before(ls[j], la[j], ls[i], la[i]);
    return rank;
}

/* The links among the slots. */
QB_HD int64_t mg_count_links(const mg_pass *p, const int64_t *lb)
{
    int64_t n = 0;
    for (int64_t j = 0; j < p->slots; j++) n += lb[j] >= 0;
    return n;
}

/* B slot j (the B row after A slot j's row, if its chunk has it): the merged links order[0 .. r)
 * whose B row it is, merged into it in that order (keys and values of D elements, its degree). */
QB_HD void mg_slot_merge(const mg_pass *p, float *Wk, float *Wv, float *deg, int64_t D, const int64_t *la,
                         const int64_t *lb, const int64_t *order, int64_t j)
{
    const int64_t a0 = mg_a_row(p->m0, p->m1, p->chunk, p->per, j);
    if (a0 < 0) return;
    int64_t c0, c1;
    mg_chunk_of(p, j, &c0, &c1);
    const int64_t b = a0 + 1;
    if (b >= c1) return;
    for (int64_t s = 0; s < p->r; s++) {
        const int64_t i = order[s];
        if (i < 0 || i >= p->slots || lb[i] != b) continue;
        const int64_t a = la[i];
        const float na = deg[a], nb = deg[b], n = QB_ADD(na, nb);
        for (int64_t d = 0; d < D; d++) {
            Wk[b * D + d] = mg_centroid(Wk[b * D + d], Wk[a * D + d], nb, na, n);
            Wv[b * D + d] = mg_centroid(Wv[b * D + d], Wv[a * D + d], nb, na, n);
        }
        deg[b] = n;
    }
}

/* Each of rows [t0, t1)'s index after the pass (-1: merged away), the first kept one's being o; the
 * rows kept. mg_compact(gone, 0, T, 0, idx) over all T rows; a device splits the rows among a
 * block's threads, each counting its own (mg_compact with idx NULL) before the counts' scan. */
QB_HD int64_t mg_compact(const unsigned char *gone, int64_t t0, int64_t t1, int64_t o, int32_t *idx)
{
    int64_t kept = 0;
    for (int64_t t = t0; t < t1; t++) {
        if (idx) idx[t] = gone[t] ? -1 : (int32_t)(o + kept);
        kept += !gone[t];
    }
    return kept;
}

/* A device's steps for mg_plan: rows [next, next + add) of the source after the `held` working rows,
 * and a pass (W to W' as above). 0, or -1 to stop. */
typedef struct mg_steps {
    void *ctx;
    int (*append)(void *ctx, int64_t held, int64_t next, int64_t add);
    int (*pass)(void *ctx, const mg_pass *p);
} mg_steps;

/* The plan's largest pass, walked on the host without running it (mg_need_steps): the slots and
 * pairs' cosines a device's arrays must hold. */
typedef struct mg_need {
    int64_t slots, pairs;
} mg_need;
static inline int mg_need_append(void *ctx, int64_t held, int64_t next, int64_t n)
{
    (void)ctx, (void)held, (void)next, (void)n;
    return 0;
}
static inline int mg_need_pass(void *ctx, const mg_pass *p)
{
    mg_need *nd = (mg_need *)ctx;
    if (p->slots > nd->slots) nd->slots = p->slots;
    if (p->slots * p->per > nd->pairs) nd->pairs = p->slots * p->per;
    return 0;
}

/* A merge of T rows to target: its passes, planned from the shape (each pass's links as
 * mg_links_expected gives them); the rows held after, or -1 when a step stopped. */
static inline int64_t mg_merge_plan(int64_t T, int64_t target, int sinks, int recent, int64_t chunk,
                                    const mg_steps *st)
{
    while (T > target) {
        mg_pass p = { T, sinks, T - recent, chunk, 0, 0, 0, 0 };
        if (p.m1 - p.m0 < 2) break;
        p.links = mg_links_expected(p.m0, p.m1, chunk);
        if (p.links == 0) break;
        p.per = mg_a_per_chunk(p.m0, p.m1, chunk);
        p.slots = (p.m1 - p.m0 + chunk - 1) / chunk * p.per;
        p.r = T - target < p.links ? T - target : p.links;
        if (st->pass(st->ctx, &p)) return -1;
        T -= p.r;
    }
    return T;
}

/* The whole merge of a head's T0 source rows (be_merge: replayed in arrival order, or at once) as a
 * device runs it: the rows held after, or -1 when a step stopped. */
static inline int64_t mg_plan(int64_t T0, int64_t target, int64_t gap, int sinks, int recent, int64_t chunk, int replay,
                              const mg_steps *st)
{
    if (!replay) return st->append(st->ctx, 0, 0, T0) ? -1 : mg_merge_plan(T0, target, sinks, recent, chunk, st);
    int64_t held = 0, next = 0;
    while (next < T0) {
        /* rows arrive one by one and the trigger looks after each: until it fires, they come together */
        int64_t add = target + gap + 1 - held;
        if (add < 1) add = 1;
        if (add > T0 - next) add = T0 - next;
        if (st->append(st->ctx, held, next, add)) return -1;
        held += add;
        next += add;
        if (held > target + gap || (next == T0 && held > target))
            if ((held = mg_merge_plan(held, target, sinks, recent, chunk, st)) < 0) return -1;
    }
    return held;
}

#endif
