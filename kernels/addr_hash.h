/* addr_hash.h - a hash of a host address or a 64-bit name, for the open-addressing tables that key
 * device copies by the host bytes they copy (kernels/page_copies.c, kernels/const_copies.c)
 * and page lists by their names (kernels/page_tables.c). */
#ifndef KVCHAT_ADDR_HASH_H
#define KVCHAT_ADDR_HASH_H

#include <stdint.h>

/* The bits mixed (a murmur3 finaliser step), so that aligned addresses and names that differ in
 * their low or high bits spread over a power-of-two table. */
static inline uint64_t bits_hash(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    return x ^ (x >> 33);
}

static inline uint64_t addr_hash(const void *p) { return bits_hash((uint64_t)(uintptr_t)p); }

#endif
