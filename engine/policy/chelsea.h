/* chelsea.h - Chelsea's merge step, exposed for tests (the policy is registered as "chelsea"). */
#ifndef KVCHAT_CHELSEA_H
#define KVCHAT_CHELSEA_H

#include <stdint.h>

/* Merge T tokens (keys and values [T][D], positions, degrees) down to target by chunked soft
 * matching, keeping the first `sinks` and last `recent` aside; rows are compacted in place and the
 * new count is returned (-1: out of memory). Merged rows are degree-weighted centroids and their
 * degrees add; each kept row keeps its B token's position. */
int64_t chelsea_merge(float *k, float *v, int32_t *pos, float *deg, int64_t T, int64_t D, int64_t target, int sinks,
                      int recent, int chunk);

#endif
