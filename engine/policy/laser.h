/* laser.h - LASER-KV's budget formula and hyperplanes, exposed for tests (the policy is registered
 * as "laser"). */
#ifndef KVCHAT_LASER_H
#define KVCHAT_LASER_H

#include <stdint.h>

/* The global budget of a prompt of T tokens: floor(2 r S_block T / (S_block + T)), with r the budget
 * as a fraction of T (a budget >= 1 is a token count: r = budget / T). */
int64_t laser_global_budget(double budget, int64_t block, int64_t T);
/* Tokens one block keeps: the largest B for which the ceil(T / S_block) blocks together hold at most
 * the global budget at the end of the prompt (each block hands its B / protect recent tokens on to the
 * next, and a short last block keeps only what it has). */
int64_t laser_block_budget(double budget, int64_t block, int64_t T, int protect);
/* The rounds * bits Gaussian hyperplanes of dimension D a seed gives (Box-Muller over splitmix64;
 * plane p's element i the (p * D + i)-th drawn), transposed: planes_t[i * rounds * bits + p]. */
void laser_planes(uint64_t seed, int rounds, int bits, int D, float *planes_t);

#endif
