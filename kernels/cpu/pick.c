/* pick.c - the best candidates of a row of logits (see pick.h).
 *
 * One pass keeps the k best keys seen so far in a min-heap (a value below the heap's smallest is
 * passed over with one comparison, which is almost every token once the heap is full); the
 * penalized ids, sorted, are met in step with the pass. The entropy is summed in the sampler's
 * order, one term after another, so it is samp_entropy's to the bit. */
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

static int cmp_key_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

void cpu_pick_row(be_pick *p)
{
    int32_t pen[4096], n_pen = p->n_pen < 4096 ? p->n_pen : 4096;
    for (int32_t i = 0; i < n_pen; i++) pen[i] = p->pen_ids[i];
    qsort(pen, (size_t)n_pen, sizeof pen[0], cmp_i32);
    int32_t k = p->k < 1 ? 1 : p->k > BE_PICK_MAX ? BE_PICK_MAX : p->k;
    uint64_t heap[BE_PICK_MAX];
    int32_t n_heap = 0, next_pen = 0;
    float floor_v = -INFINITY;   /* the heap's smallest value once it is full */
    float mx = -INFINITY;        /* before the penalty, for the entropy */
    for (int32_t i = 0; i < p->n; i++) {
        float v = lp_value(p->logits[i], p->softcap);
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
    qsort(heap, (size_t)n_heap, sizeof heap[0], cmp_key_desc);
    for (int32_t i = 0; i < n_heap; i++) {
        p->val[i] = lp_key_value(heap[i]);
        p->id[i] = lp_key_id(heap[i]);
    }
    p->n_out = n_heap;
    p->h = p->vh = 0;
    if (!p->entropy || !(mx > -INFINITY) || !isfinite(mx)) return;   /* nothing, or +inf: all mass on the top */
    float temp = p->temp > 0 ? p->temp : 1.0f, inv = 1.0f / temp;
    double acc[3] = { 0, 0, 0 };
    for (int32_t i = 0; i < p->n; i++) lp_entropy_term(acc, lp_value(p->logits[i], p->softcap), mx, inv);
    lp_entropy_finish(acc, &p->h, &p->vh);
}
