/* addr_hash.h - a hash of a host address, for the open-addressing tables that key device copies by
 * the host bytes they copy (kernels/page_copies.c, kernels/cuda/const_copies.c). */
#ifndef KVCHAT_ADDR_HASH_H
#define KVCHAT_ADDR_HASH_H

#include <stdint.h>

/* The pointer's bits mixed (a murmur3 finaliser step), so that aligned addresses spread over a
 * power-of-two table. */
static inline uint64_t addr_hash(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    return x ^ (x >> 33);
}

#endif
