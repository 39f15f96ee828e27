/* bench_time.h - the clock, the median and the random numbers that the host benchmarks in bench/
 * share. */
#ifndef KVCHAT_BENCH_TIME_H
#define KVCHAT_BENCH_TIME_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static inline double bench_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of t[0 .. n) (n > 0), sorting t. */
static inline double bench_median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    return t[n / 2];
}

/* Uniform in [-0.5, 0.5), the same sequence in every run (xorshift64 from a fixed seed). */
static uint64_t bench_rng = 0x9E3779B97F4A7C15ull;
static inline float bench_frand(void)
{
    bench_rng ^= bench_rng << 13;
    bench_rng ^= bench_rng >> 7;
    bench_rng ^= bench_rng << 17;
    return (float)((bench_rng >> 11) * (1.0 / 9007199254740992.0)) - 0.5f;
}

#endif
