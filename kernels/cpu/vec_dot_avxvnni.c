/* vec_dot_avxvnni.c - AVX2 + AVX-VNNI kernels: the prefill panel products of 8 weight rows (one
 * 32-bit lane of a ymm per row) with the VEX-encoded vpdpbusd/vpdpwssd, for CPUs that have AVX-VNNI
 * but no AVX-512 (the AVX-512 level is preferred where both exist).
 *
 * The only file built with -mavxvnni; nothing here may run before vec_dot.c has found the CPU
 * support (vd_isa_active() == VD_ISA_AVXVNNI). The kernels are the template of vec_vnni_impl.h,
 * the one the AVX-512 file instantiates on zmm; the other kernels of this level are the AVX2 ones. */
#include "kernels/cpu/vec_dot_impl.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__AVXVNNI__)

#define VN_SUFFIX avxvnni
#define VN_DPBUSD _mm256_dpbusd_avx_epi32
#define VN_DPWSSD _mm256_dpwssd_avx_epi32
#include "kernels/cpu/vec_vnni_ymm.h"

#else
/* Not x86-64 (the Makefile builds this file with -mavxvnni there): nothing to offer. */
const vd_gemm *vd_gemm_avxvnni(uint32_t wtype)
{
    (void)wtype;
    return NULL;
}
#endif
