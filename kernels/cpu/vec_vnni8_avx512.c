/* vec_vnni8_avx512.c - the AVX-VNNI level's panel products (vec_vnni_impl.h at 8 rows a panel on
 * ymm vectors) built with the EVEX encodings of vpdpbusd/vpdpwssd instead of the VEX ones.
 *
 * Nothing in kvchat dispatches to it: it exists so that a CPU with AVX-512 VNNI but no AVX-VNNI (AMD
 * Zen 4, where kvchat is developed) can run the AVX-VNNI kernels' exact algorithm and layout in the
 * tests; the two builds differ only in how the same instructions are encoded. */
#include "kernels/cpu/vec_dot_impl.h"

#if defined(__x86_64__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)

#define VN_SUFFIX avx512_8
#define VN_DPBUSD _mm256_dpbusd_epi32
#define VN_DPWSSD _mm256_dpwssd_epi32
#include "kernels/cpu/vec_vnni_ymm.h"

#else
const vd_gemm *vd_gemm_avx512_8(uint32_t wtype)
{
    (void)wtype;
    return NULL;
}
#endif
