/* test_rng.h - the seeded generator of the randomized tests: the seed is the named environment
 * variable's (to replay a failure) or the test file's own default, and is logged; rnd() is a 64-bit
 * LCG's top 32 bits, frand() uniform in [lo, hi). Each test file includes it once and wraps
 * test_rng_seed in its own seed_rng(what). */
#ifndef KVCHAT_TEST_RNG_H
#define KVCHAT_TEST_RNG_H

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t test_rng_state;

static inline uint64_t test_rng_seed(const char *what, const char *env_name, uint64_t fallback)
{
    const char *env = getenv(env_name);
    test_rng_state = env ? strtoull(env, NULL, 10) : fallback;
    cr_log_info("%s: seed %llu (%s to replay)", what, (unsigned long long)test_rng_state, env_name);
    return test_rng_state;
}

static inline uint32_t rnd(void)
{
    test_rng_state = test_rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(test_rng_state >> 33);
}

static inline float frand(float lo, float hi) { return lo + (hi - lo) * (float)rnd() / 2147483648.0f; }

#endif
