/* pol_util.h - small helpers shared by the policy implementations (not part of the policy API). */
#ifndef KVCHAT_POL_UTIL_H
#define KVCHAT_POL_UTIL_H

#include <stdint.h>

/* Reorder idx[0..n) so its first k entries are those with the highest score[idx[i]] (ties: lower
 * index first), and sort those k ascending by index. Returns min(k, n). */
int pol_top_k(int *idx, int n, const float *score, int k);

#endif
