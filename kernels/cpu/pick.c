/* pick.c - the best candidates of a row of logits (see pick.h).
 *
 * The soft cap goes first, in place. One pass then keeps the k best keys seen so far in a min-heap.
 * It goes a block of PICK_BLOCK tokens at a time: a block with no penalized id whose largest logit is below the heap's
 * smallest value holds no candidate, and one max over it (eight running maxima, which the compiler
 * vectorizes) settles it; other blocks go token by token, the penalized ids (sorted) met in step.
 * The entropy is summed in the sampler's order, one term after another, so it is samp_entropy's to
 * the bit. */
#include "kernels/cpu/pick.h"

#include <math.h>
#include <stdlib.h>

#include "common/logit_pick.h"

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The min-heap h[0 .. n): key replaces the root, which sinks to its place. */
static void heap_replace_top(uint64_t *h, int32_t n, uint64_t key)
{
    int32_t i = 0;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (h[c] >= key) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = key;
}

static void heap_push(uint64_t *h, int32_t n, uint64_t key)
{
    int32_t i = n;
    while (i > 0 && h[(i - 1) / 2] > key) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = key;
}

enum { PICK_BLOCK = 64 };

/* The largest of l[0 .. n), NaN passed over (-inf when there is none). */
static float block_max(const float *l, int64_t n)
{
    float m[8] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m[j] = l[i + j] > m[j] ? l[i + j] : m[j];
    for (; i < n; i++) m[0] = l[i] > m[0] ? l[i] : m[0];
    for (int j = 1; j < 8; j++) m[0] = m[j] > m[0] ? m[j] : m[0];
    return m[0];
}

static int cmp_key_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

void cpu_pick_row(be_pick *p)
{
    if (p->softcap > 0)   /* in place, as the forward pass capped a row it read (engine/forward.c) */
        for (int32_t i = 0; i < p->n; i++) p->logits[i] = lp_cap(p->logits[i], p->softcap);
    int32_t pen[4096], n_pen = p->n_pen < 0 ? 0 : p->n_pen < 4096 ? p->n_pen : 4096;
    for (int32_t i = 0; i < n_pen; i++) pen[i] = p->pen_ids[i];
    qsort(pen, (size_t)n_pen, sizeof pen[0], cmp_i32);
    int32_t k = p->k < 1 ? 1 : p->k > BE_PICK_MAX ? BE_PICK_MAX : p->k;
    p->k = k;
    uint64_t heap[BE_PICK_MAX];
    int32_t n_heap = 0, next_pen = 0;
    float floor_v = -INFINITY;   /* the heap's smallest value once it is full */
    float mx = -INFINITY;        /* before the penalty, for the entropy */
    for (int64_t b0 = 0; b0 < p->n; b0 += PICK_BLOCK) {
        int32_t b1 = p->n - b0 < PICK_BLOCK ? p->n : (int32_t)b0 + PICK_BLOCK;
        while (next_pen < n_pen && pen[next_pen] < b0) next_pen++;
        if (!(next_pen < n_pen && pen[next_pen] < b1)) {
            float bm = block_max(p->logits + b0, b1 - b0);
            if (bm > mx) mx = bm;
            if (!(bm > -INFINITY) || bm < floor_v) continue;   /* nothing here can enter the heap */
        }
        for (int32_t i = (int32_t)b0; i < b1; i++) {
            float v = lp_value(p->logits[i]);
            if (v > mx) mx = v;
            while (next_pen < n_pen && pen[next_pen] < i) next_pen++;
            if (next_pen < n_pen && pen[next_pen] == i) v = lp_penalize(v, p->penalty);
            if (!(v > -INFINITY) || v < floor_v) continue;
            uint64_t key = lp_key(v, i);
            if (n_heap < k) {
                heap_push(heap, n_heap++, key);
                if (n_heap == k) floor_v = lp_key_value(heap[0]);
            } else if (key > heap[0]) {
                heap_replace_top(heap, n_heap, key);
                floor_v = lp_key_value(heap[0]);
            }
        }
    }
    qsort(heap, (size_t)n_heap, sizeof heap[0], cmp_key_desc);
    for (int32_t i = 0; i < n_heap; i++) {
        p->val[i] = lp_key_value(heap[i]);
        p->id[i] = lp_key_id(heap[i]);
    }
    p->n_out = n_heap;
    p->h = p->vh = 0;
    if (p->entropy) lp_row_entropy(p->logits, p->n, mx, p->temp, &p->h, &p->vh);
}
