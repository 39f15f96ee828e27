/* lsh_kernels.h - LASER-KV's SimHash recall (kernels/backend.h be_lsh) one thread's share at a time,
 * in one header for C and CUDA: the CPU backend codes and counts with these functions (its dots by
 * kernels/cpu/vec_dot.c vd_plane_dots, the same floats as lsh_dot), and tests/test_lsh.c runs every
 * thread of the CUDA kernel's small launches on the host against the CPU backend.
 *
 * A vector's code for round r: bit b set when its dot with plane r * bits + b is >= 0, the dot a
 * plain loop in element order, each product rounded before it is added (QB_MUL, QB_ADD: never
 * fused). A key's hits: over the rounds, how many of its KV head's query codes of that round equal
 * its own, the query codes sorted so that two binary searches count them. Integers from there on, so
 * every backend that gets the dots' floats gets the hits.
 *
 * The CUDA kernel (kernels/cuda/lsh_hits.cu) takes a page a block and its tokens LSH_TILE at a time:
 * the keys widened into shared memory, item i of a tile (token i / P, plane i % P, P = rounds * bits)
 * a thread's dot, its bit or'ed into the token's code of its round, then item i of (token i / rounds,
 * round i % rounds) a thread's count added into the token's hits. */
#ifndef KVCHAT_LSH_KERNELS_H
#define KVCHAT_LSH_KERNELS_H

#include <stdint.h>

#include "kernels/quant_blocks.h"

#define LSH_MAX_ROUNDS 64     /* rounds a call may have (LASER-KV's parameter's bound) */
#define LSH_MAX_BITS 30       /* bits a round's code may have */
#define LSH_MAX_PLANES (LSH_MAX_ROUNDS * LSH_MAX_BITS)
#define LSH_MAX_D 1024        /* head dimensions the CPU backend's op takes (the loader's bound) */
#define LSH_TILE 16           /* tokens a block of the CUDA kernel codes at once */
#define LSH_THREADS 256
#define LSH_DEV_MAX_D 256     /* head dimensions the CUDA kernel holds a tile of in shared memory */
#define LSH_TABLE_BITS 10     /* codes of at most this many bits the host counts by a table a round */

/* The dot of plane p with x[0 .. D), the planes transposed ([D][P]). */
QB_HD float lsh_dot(const float *pt, int P, int p, const float *x, int D)
{
    float a = 0.0f;
    for (int i = 0; i < D; i++) a = QB_ADD(a, QB_MUL(pt[(int64_t)i * P + p], x[i]));
    return a;
}

/* The bit a dot gives (a NaN gives 0, -0 gives 1: the comparison's). */
QB_HD uint32_t lsh_bit(float dot, int b) { return (uint32_t)(dot >= 0.0f) << b; }

/* How many of sorted[0 .. n) (ascending) equal code. */
QB_HD int32_t lsh_count(const uint32_t *sorted, int64_t n, uint32_t code)
{
    int64_t lo = 0, hi = n;   /* the first not below code */
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] < code) lo = mid + 1;
        else hi = mid;
    }
    int64_t a = lo;
    hi = n;                   /* the first above it */
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] <= code) lo = mid + 1;
        else hi = mid;
    }
    return (int32_t)(lo - a);
}

#endif
