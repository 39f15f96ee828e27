/* vec_bits_avx2.h - the two bit-unpacking steps that the AVX2 dot kernels and the panel packers of
 * every SIMD level share (AVX2 intrinsics only): nibbles to bytes, and a 32-bit mask to bytes. */
#ifndef KVCHAT_VEC_BITS_AVX2_H
#define KVCHAT_VEC_BITS_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* 16 bytes of packed nibbles -> 32 bytes: lane 0 the low nibbles (elements 0-15), lane 1 the high
 * nibbles (elements 16-31), i.e. element order of Q4_0/Q4_1/Q5_0/Q5_1. */
static inline __m256i unpack_nibbles16(const uint8_t *qs)
{
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* The 32 bits of qh -> 32 bytes, byte j = 0xFF if bit j is set, else 0. */
static inline __m256i expand_bits32(const uint8_t *qh)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    /* byte j of the result takes byte j/8 of h (both lanes hold h, the shuffle is in-lane) */
    const __m256i pick = _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL,
                                            0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), pick);
    return _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
}

#endif
