/* chelsea.h - Chelsea's merge step, exposed for tests (the policy is registered as "chelsea"). */
#ifndef KVCHAT_CHELSEA_H
#define KVCHAT_CHELSEA_H

#include <stdint.h>

#include "engine/kvcache.h"
#include "kernels/backend.h"

/* The soft matching's links are found by be's soft_links (be NULL: on the calling thread).
 *
 * Merge T tokens (keys and values [T][D], positions, degrees) down to target by chunked soft
 * matching, keeping the first `sinks` and last `recent` aside; rows are compacted in place and the
 * new count is returned (-1: out of memory). Merged rows are degree-weighted centroids and their
 * degrees add; each kept row keeps its B token's position. */
int64_t chelsea_merge(be_backend *be, float *k, float *v, int32_t *pos, float *deg, int64_t T, int64_t D, int64_t target,
                      int sinks, int recent, int chunk);

/* The T rows in arrival order, merged back to target each time more than target + gap have arrived,
 * and at the end to target (the trigger replayed on a prompt encoded whole); compacted in place, the
 * new count returned (-1: out of memory). */
int64_t chelsea_replay(be_backend *be, float *k, float *v, int32_t *pos, float *deg, int64_t T, int64_t D,
                       int64_t target, int64_t gap, int sinks, int recent, int chunk);

/* How well head g of layer il suits merging: the mean, over its tokens in set A, of the cosine
 * similarity to the most similar key in set B of the same chunk (the quantity soft matching
 * ranks links by). kvchat calibrate records it per head; the least similar heads are Chelsea's
 * outlier heads. 0, or -1 when out of memory or the head holds fewer than 2 tokens. */
int chelsea_head_similarity(be_backend *be, const kv_cache *kv, int il, int g, int chunk, double *out);

#endif
