/* bits.h - bitmaps of positions, a bit a position in 64-bit words: SentKV's choice of tokens
 * (kernels/segment_kernels.h), the token masks attention reads, and the statistics and reuse counts
 * the engine takes from them. BM_HD makes a function __host__ __device__ under nvcc and static
 * inline in C; the two without it use host builtins. */
#ifndef KVCHAT_BITS_H
#define KVCHAT_BITS_H

#include <stdint.h>

#ifdef __CUDACC__
#define BM_HD static __host__ __device__ inline
#else
#define BM_HD static inline
#endif

/* Set bits of a word. On the host in registers (the build targets every x86-64, so the builtin
 * would be a call into libgcc for each word: a third of SentKV's count of its choice a step). */
BM_HD int bm_popcount(uint64_t x)
{
#ifdef __CUDA_ARCH__
    return __popcll(x);
#else
    x -= (x >> 1) & 0x5555555555555555ull;
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (int)((x * 0x0101010101010101ull) >> 56);
#endif
}

/* Bits [a, b) of bm set (the host's: plain stores). */
static inline void bm_set_range(uint64_t *bm, int64_t a, int64_t b)
{
    while (a < b && (a & 63)) {
        bm[a >> 6] |= 1ull << (a & 63);
        a++;
    }
    for (; a + 64 <= b; a += 64) bm[a >> 6] = ~0ull;
    for (; a < b; a++) bm[a >> 6] |= 1ull << (a & 63);
}

/* Word w's bits of the range [a, b) of positions (a < b, a >> 6 <= w <= (b - 1) >> 6). */
BM_HD uint64_t bm_word_mask(int64_t a, int64_t b, int64_t w)
{
    const int64_t lo = a > 64 * w ? a - 64 * w : 0, hi = b < 64 * (w + 1) ? b - 64 * w : 64;
    const uint64_t top = hi == 64 ? ~0ull : (1ull << hi) - 1;
    return top & (~0ull << lo);
}

/* Bit p of bm (words long): 0 past its end and for negative p. */
BM_HD int bm_bit(const uint64_t *bm, int64_t words, int64_t p)
{
    return p >= 0 && (p >> 6) < words && ((bm[p >> 6] >> (p & 63)) & 1u);
}

/* The set bits of bm (words long) among positions [a, b). */
BM_HD int64_t bm_count(const uint64_t *bm, int64_t words, int64_t a, int64_t b)
{
    int64_t n = 0;
    if (a < 0) a = 0;
    if (b > 64 * words) b = 64 * words;
    for (int64_t w = a >> 6; a < b && w <= (b - 1) >> 6; w++) n += bm_popcount(bm[w] & bm_word_mask(a, b, w));
    return n;
}

/* Bits [a, a + n) of bm (words long) into out's pw words, bit t of out being bit a + t of bm; bits
 * past n, or past bm's end, are 0. */
BM_HD void bm_bits_at(const uint64_t *bm, int64_t words, int64_t a, int32_t n, uint64_t *out, int64_t pw)
{
    for (int64_t w = 0; w < pw; w++) {
        const int64_t rem = (int64_t)n - 64 * w, b = a + 64 * w, wi = b >> 6;
        const int sh = (int)(b & 63);
        uint64_t x = 0;
        if (rem > 0 && wi < words) {
            x = bm[wi] >> sh;
            if (sh && wi + 1 < words) x |= bm[wi + 1] << (64 - sh);
            if (rem < 64) x &= (1ull << rem) - 1;
        }
        out[w] = x;
    }
}

/* The first set bit of bm (words long) at or after a, or -1. */
static inline int64_t bm_next_bit(const uint64_t *bm, int64_t words, int64_t a)
{
    int64_t w = a >> 6;
    if (a < 0 || w >= words) return -1;
    uint64_t x = bm[w] & (~0ull << (a & 63));
    while (!x) {
        if (++w >= words) return -1;
        x = bm[w];
    }
    return (w << 6) + __builtin_ctzll(x);
}

#endif
