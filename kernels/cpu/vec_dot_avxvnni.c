/* vec_dot_avxvnni.c - AVX2 + AVX-VNNI (VEX-encoded vpdpbusd/vpdpwssd) kernels: the prefill panel
 * products on CPUs with AVX-VNNI but no AVX-512. */
#include "kernels/cpu/vec_dot_impl.h"

const vd_gemm *vd_gemm_avxvnni(uint32_t wtype)
{
    (void)wtype;
    return NULL;
}
