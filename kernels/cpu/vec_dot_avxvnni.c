/* vec_dot_avxvnni.c - AVX2 + AVX-VNNI kernels: the prefill panel products of 8 weight rows (one
 * 32-bit lane of a ymm per row) with the VEX-encoded vpdpbusd/vpdpwssd, for CPUs that have AVX-VNNI
 * but no AVX-512 (the AVX-512 level is preferred where both exist).
 *
 * The only file built with -mavxvnni; nothing here may run before vec_dot.c has found the CPU
 * support (vd_isa_active() == VD_ISA_AVXVNNI). The kernels are the template of vec_vnni_impl.h,
 * the one the AVX-512 file instantiates on zmm; the other kernels of this level are the AVX2 ones. */
#include "kernels/cpu/vec_dot_impl.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__AVXVNNI__)

#include <immintrin.h>

#define VN_P 8         /* rows per panel: one per 32-bit lane of a ymm */
#define VN_T 4         /* tokens per tile (16 vector registers) */
#define VN_SUFFIX avxvnni
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
static inline vn_i vn_dpbusd(vn_i acc, vn_i u, vn_i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
static inline vn_i vn_dpwssd(vn_i acc, vn_i a, vn_i b) { return _mm256_dpwssd_avx_epi32(acc, a, b); }
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

#else
/* Not x86-64 (the Makefile builds this file with -mavxvnni there): nothing to offer. */
const vd_gemm *vd_gemm_avxvnni(uint32_t wtype)
{
    (void)wtype;
    return NULL;
}
#endif
