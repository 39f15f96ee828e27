/* vec_vnni_ymm.h - the 8-row (ymm) instantiation of the VNNI panel products, shared by the AVX-VNNI
 * file and its EVEX twin for testing: the includer defines VN_SUFFIX and VN_DPBUSD / VN_DPWSSD (the
 * VEX or the EVEX intrinsics of the same instructions), then includes this once. */
#include <immintrin.h>

#define VN_P 8         /* rows per panel: one per 32-bit lane of a ymm */
#define VN_T 4         /* tokens per tile (16 vector registers) */
#define VD_PACK_P VN_P
#include "kernels/cpu/vec_pack_impl.h"

typedef __m256i vn_i;
typedef __m256 vn_f;

static inline vn_i vn_zero_i(void) { return _mm256_setzero_si256(); }
static inline vn_f vn_zero_f(void) { return _mm256_setzero_ps(); }
static inline vn_i vn_load_i(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline vn_f vn_load_f(const void *p) { return _mm256_loadu_ps((const float *)p); }
static inline vn_f vn_set1_f(float x) { return _mm256_set1_ps(x); }
static inline vn_i vn_bcast32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
static inline vn_i vn_dpbusd(vn_i acc, vn_i u, vn_i s) { return VN_DPBUSD(acc, u, s); }
static inline vn_i vn_dpwssd(vn_i acc, vn_i a, vn_i b) { return VN_DPWSSD(acc, a, b); }
static inline vn_i vn_add_i(vn_i a, vn_i b) { return _mm256_add_epi32(a, b); }
static inline vn_i vn_mullo(vn_i a, vn_i b) { return _mm256_mullo_epi32(a, b); }
static inline vn_f vn_cvt(vn_i a) { return _mm256_cvtepi32_ps(a); }
static inline vn_f vn_mul(vn_f a, vn_f b) { return _mm256_mul_ps(a, b); }
static inline vn_f vn_fmadd(vn_f a, vn_f b, vn_f c) { return _mm256_fmadd_ps(a, b, c); }
static inline vn_f vn_fnmadd(vn_f a, vn_f b, vn_f c) { return _mm256_fnmadd_ps(a, b, c); }
static inline void vn_store_rows(float *y, vn_f v, int nrows)
{
    if (nrows == VN_P) {
        _mm256_storeu_ps(y, v);
    } else {
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(nrows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(y, m, v);
    }
}

#include "kernels/cpu/vec_vnni_impl.h"
