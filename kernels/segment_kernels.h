/* segment_kernels.h - SentKV's choice of whole segments by their bounds (be_bounds.bits), the
 * position bitmaps it leaves, and the token masks attention reads from them (be_attn.sel_bits): one
 * header for C and CUDA, so that the CPU backend, the CUDA kernels and the tests use the same steps
 * (tests/test_segments.c runs every thread of the device's launch on the host).
 *
 * The choice (one KV head): the segments in the rank order of their bounds (lp_key of lp_value:
 * larger first, lower index first among equal ones, NaN as -inf; every segment is ranked, -inf too)
 * are taken whole, one after another, where each fits in the room left, until the room left is below
 * the shortest segment. The CPU walks the ranking lazily through a heap (sg_heap_*); the device sorts
 * the keys in a block and finds the same set in two steps: the longest run of the ranking from its
 * start whose lengths fit (a prefix sum: every segment of it is taken, sg_first_out), then, where the
 * run ended on a segment too long for the room left, the rest of the ranking by one warp, 32 segments
 * a step (sg_fits, sg_first_fit). */
#ifndef KVCHAT_SEGMENT_KERNELS_H
#define KVCHAT_SEGMENT_KERNELS_H

#include <stdint.h>

#include "common/bits.h"
#include "common/logit_pick.h"
#include "kernels/quant_blocks.h"

#define SG_THREADS 1024    /* threads of the device's block a head */
#define SG_SORT_MAX 8192   /* segments a head the device sorts in shared memory (more: the host chooses) */
#define SG_PAGE_WORDS 64   /* a page's token mask at most: the cache's pages hold up to 4,096 tokens */

/* Segment i's place in the ranking as one integer, larger first (never 0). */
QB_HD uint64_t sg_key(float u, int32_t i) { return lp_key(lp_value(u), i); }

/* The room the segments of one head may take: the budget less the tokens always attended (the
 * first `sinks` of those the segments cover, and the `len - covered` past them). */
QB_HD int64_t sg_room(int64_t budget, int64_t sinks, int64_t covered, int64_t len)
{
    return budget - (len - covered) - (sinks < covered ? sinks : covered);
}

/* Whether the ranking's walk stops before its j-th segment (0-based) when the first j took `used`
 * tokens of `room` (the shortest segment no longer fits), or takes nothing more from the run
 * (the j-th does not fit): the run of the ranking taken whole is [0, first j where this holds). */
QB_HD int sg_first_out(int64_t used_before, int64_t used_with, int64_t room, int64_t shortest)
{
    return room - used_before < shortest || used_with > room;
}

/* A page's token mask from bitmap bm: bit t set where the page's token t (at position pos[t]) has
 * its position's bit set; the mask's pw words, the count of set bits returned. A page of
 * consecutive positions takes its bits a word at a time. */
QB_HD int32_t sg_page_mask(const uint64_t *bm, int64_t words, const int32_t *pos, int32_t n, uint64_t *out, int64_t pw)
{
    int32_t on = 0;
    if (n > 0 && (int64_t)pos[n - 1] - pos[0] == n - 1) {
        bm_bits_at(bm, words, pos[0], n, out, pw);
        for (int64_t w = 0; w < pw; w++) on += bm_popcount(out[w]);
        return on;
    }
    for (int64_t w = 0; w < pw; w++) out[w] = 0;
    for (int32_t t = 0; t < n; t++)
        if (bm_bit(bm, words, pos[t])) {
            out[t >> 6] |= 1ull << (t & 63);
            on++;
        }
    return on;
}

/* ---------------------------------------------------------------- the device's sort and scans */

/* Keys a head's sort holds: n rounded up to a power of two (at least 1). */
QB_HD int32_t sg_sort_size(int64_t n)
{
    int32_t s = 1;
    while (s < n) s <<= 1;
    return s;
}

/* One compare-exchange of the bitonic sort's stage (k, j) for element i of keys[0 .. size): larger
 * keys first. Every i of a stage may run at once (each pair is touched by its lower index only). */
QB_HD void sg_sort_step(uint64_t *keys, int32_t k, int32_t j, int32_t i)
{
    const int32_t l = i ^ j;
    if (l <= i) return;
    const uint64_t a = keys[i], b = keys[l];
    const int desc = (i & k) == 0;   /* this run ends larger first */
    if (desc ? a < b : a > b) {
        keys[i] = b;
        keys[l] = a;
    }
}

/* The items [*a, *b) of `size` that thread tid of nt scans in a block's prefix sum: consecutive
 * runs, so that a thread's sum, the threads' sums scanned, and a second pass over its own items give
 * every inclusive prefix. */
QB_HD void sg_chunk(int64_t size, int tid, int nt, int64_t *a, int64_t *b)
{
    const int64_t per = (size + nt - 1) / nt;
    *a = (int64_t)tid * per < size ? (int64_t)tid * per : size;
    *b = *a + per < size ? *a + per : size;
}

/* Whether a segment of length n (negative: none, past the ranking's end) fits in room - used: a
 * lane's vote in the warp's walk past the run. */
QB_HD int sg_fits(int64_t n, int64_t room, int64_t used) { return n >= 0 && n <= room - used; }

/* One step of the warp's walk past the run: of the ranking's segments j0 + lane (lane < 32; the
 * lane's segment's length, or a negative value past the end), the first lane whose segment fits,
 * or -1 (the ballot of sg_fits and its lowest bit, on the host). */
QB_HD int sg_first_fit(const int64_t *len_of_lane, int64_t room, int64_t used)
{
    for (int l = 0; l < 32; l++)
        if (sg_fits(len_of_lane[l], room, used)) return l;
    return -1;
}

/* ---------------------------------------------------------------- the CPU's lazy ranking */

QB_HD void sg_heap_down(uint64_t *h, int64_t n, int64_t i)
{
    for (;;) {
        int64_t l = 2 * i + 1, m = i;
        if (l < n && h[l] > h[m]) m = l;
        if (l + 1 < n && h[l + 1] > h[m]) m = l + 1;
        if (m == i) return;
        const uint64_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* One head's choice into bm (words long, cleared and set here): the segments' bounds u[0 .. n) and
 * lengths n_of[0 .. n) (each >= 1, covering positions [0, sum) in order, at[i] the start of segment
 * i), the tokens always attended set first. heap: n keys of scratch. Returns the tokens the
 * segments took. */
static inline int64_t sg_choose(const float *u, const int64_t *n_of, const int64_t *at, int64_t n, int64_t budget,
                                int64_t sinks, int64_t len, uint64_t *heap, uint64_t *bm, int64_t words)
{
    int64_t covered = n > 0 ? at[n - 1] + n_of[n - 1] : 0, shortest = INT64_MAX;
    for (int64_t w = 0; w < words; w++) bm[w] = 0;
    bm_set_range(bm, 0, sinks < len ? sinks : len);
    bm_set_range(bm, covered, len);
    const int64_t room = sg_room(budget, sinks, covered, len);
    for (int64_t i = 0; i < n; i++) {
        heap[i] = sg_key(u[i], (int32_t)i);
        if (n_of[i] < shortest) shortest = n_of[i];
    }
    for (int64_t i = n / 2 - 1; i >= 0; i--) sg_heap_down(heap, n, i);
    int64_t used = 0, left = n;
    while (left > 0 && room - used >= shortest) {
        const int32_t i = lp_key_id(heap[0]);
        heap[0] = heap[--left];
        sg_heap_down(heap, left, 0);
        if (used + n_of[i] > room) continue;
        bm_set_range(bm, at[i], at[i] + n_of[i]);
        used += n_of[i];
    }
    return used;
}

#endif
