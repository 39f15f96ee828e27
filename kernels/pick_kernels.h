/* pick_kernels.h - the CUDA backend's pick (kernels/backend.h, be_pick), one thread's share of each
 * kernel, in one header for C and CUDA so that tests/test_pick_kernels.c runs every (block, thread)
 * of the launches on the host and compares them with the CPU backend's pick.
 *
 * A soft cap, when the model has one, is applied to the row in place first (pick_softcap_kernel). The
 * row is then cut into slices of PK_SLICE tokens, a block each. A block marks its slice's penalized
 * ids in a bitmap in shared memory, turns its tokens into lp_key keys (0 for -inf: no candidate),
 * sorts them with a bitonic network (largest first) and keeps its k best. Merge rounds then take
 * PK_SLICE / k lists a block, sort them the same way and keep k, until one list is left: those are
 * the row's k best, in order. The entropy needs the row's largest value first (the slices' own
 * maxima, written by the first kernel); a second pass sums each slice's terms (lp_entropy_term) in
 * double and one block adds the slices' sums in slice order, so the answer does not depend on
 * timing. */
#ifndef KVCHAT_PICK_KERNELS_H
#define KVCHAT_PICK_KERNELS_H

#include <stdint.h>

#include "common/logit_pick.h"

#define PK_THREADS 256
#define PK_SLICE 2048                            /* keys a block sorts: a slice, or lists to merge */
#define PK_PER_THREAD (PK_SLICE / PK_THREADS)

/* How many blocks each launch has for a row of n tokens and k candidates: the slices, then the
 * merge rounds' (each a block per PK_SLICE / k lists, until one). Returns the number of merge
 * rounds; blocks[0] the slices, blocks[r] round r's (at most 8 rounds for any row of 2^31 tokens). */
static inline int pk_plan(int64_t n, int32_t k, int64_t blocks[9])
{
    int64_t per = PK_SLICE / k, lists = (n + PK_SLICE - 1) / PK_SLICE;
    int rounds = 0;
    blocks[0] = lists;
    while (lists > 1) {
        lists = (lists + per - 1) / per;
        blocks[++rounds] = lists;
    }
    return rounds;
}

/* Token i's key for the slice kernel (0: past the row or -inf), with its value before the penalty
 * in *raw (the slice's maximum for the entropy). pen_bits: the slice's penalized tokens, bit i - base. */
LP_HD uint64_t pk_token_key(const float *logits, int64_t n, const uint32_t *pen_bits, float penalty, int64_t base,
                            int32_t slot, float *raw)
{
    int64_t i = base + slot;
    *raw = -INFINITY;
    if (i >= n) return 0;
    float v = lp_value(logits[i]);
    *raw = v;
    if (pen_bits[slot >> 5] >> (slot & 31) & 1u) v = lp_penalize(v, penalty);
    return v > -INFINITY ? lp_key(v, (int32_t)i) : 0;
}

/* One step of the bitonic sort of keys[0 .. PK_SLICE), largest first: thread tid compares and
 * swaps its pairs of the step (size: the sorted runs being merged, stride: the distance compared).
 * No two threads touch one element within a step. */
LP_HD void pk_sort_step(uint64_t *keys, int size, int stride, int tid)
{
    for (int p = tid; p < PK_SLICE / 2; p += PK_THREADS) {
        int i = 2 * stride * (p / stride) + p % stride, j = i + stride;
        int desc = (i & size) == 0;
        uint64_t a = keys[i], b = keys[j];
        if (desc ? a < b : a > b) {
            keys[i] = b;
            keys[j] = a;
        }
    }
}

/* Key `slot` of a merge block: list (slot / k) of the block's lists, from `first`, padded with 0. */
LP_HD uint64_t pk_merge_key(const uint64_t *lists, int64_t n_lists, int32_t k, int64_t first, int32_t slot)
{
    int64_t l = first + slot / k;
    return slot / k < PK_SLICE / k && l < n_lists ? lists[l * k + slot % k] : 0;
}

/* One level of a block's sum of its threads' entropy sums, a tree: thread tid < s adds tid + s's. */
LP_HD void pk_tree_step(double (*acc)[3], int s, int tid)
{
    if (tid < s)
        for (int j = 0; j < 3; j++) acc[tid][j] += acc[tid + s][j];
}

/* One thread's entropy sums over the tokens of a slice it reads (acc[3], lp_entropy_term's). */
LP_HD void pk_entropy_thread(const float *logits, int64_t n, int64_t base, int tid, float mx, float inv, double acc[3])
{
    for (int r = 0; r < PK_PER_THREAD; r++) {
        int64_t i = base + tid + (int64_t)r * PK_THREADS;
        if (i < n) lp_entropy_term(acc, lp_value(logits[i]), mx, inv);
    }
}

#endif
