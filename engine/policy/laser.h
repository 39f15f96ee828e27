/* laser.h - LASER-KV's budget formula, exposed for tests (the policy is registered as "laser"). */
#ifndef KVCHAT_LASER_H
#define KVCHAT_LASER_H

#include <stdint.h>

/* Tokens one block keeps: floor(2 r S_block T / (S_block + T)) over ceil(T / S_block) blocks, with r the
 * budget as a fraction of T (a budget >= 1 is a token count: r = budget / T). */
int64_t laser_block_budget(double budget, int64_t block, int64_t T);

#endif
