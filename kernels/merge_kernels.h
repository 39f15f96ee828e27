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

/* The link of A row a (rows k, norms nrm over the pass's rows; the chunk [c0, c1) holding a): its B
 * row (-1: none) and cosine, the first B row of the largest cosine. */
QB_HD int64_t mg_best(const float *k, const double *nrm, int64_t D, int64_t a, int64_t c0, int64_t c1, float *sim)
{
    float bs = -2.0f;
    int64_t best = -1;
    for (int64_t b = c0 + 1; b < c1; b += 2) {
        const float s = mg_cosine(k + a * D, k + b * D, D, nrm[a], nrm[b]);
        if (s > bs) {
            bs = s;
            best = b;
        }
    }
    *sim = bs;
    return best;
}

#endif
